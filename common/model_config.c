#include "model_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Small typed getters: each names the file and the key in its error. */

typedef struct {
    json_t *root;
    const char *origin;
    duet_err_t *err;
    duet_status_t st;
} cfg_reader_t;

static int rd_fail(cfg_reader_t *r, const char *key, const char *what)
{
    if (r->st == DUET_OK)
        r->st = duet_err_set(r->err, DUET_ERR_CONFIG, "%s: field \"%s\" %s", r->origin, key, what);
    return 0;
}

static json_t *rd_get(cfg_reader_t *r, const char *key) { return json_object_get(r->root, key); }

static int rd_int(cfg_reader_t *r, const char *key, int required, int def, int min, int max)
{
    json_t *v = rd_get(r, key);
    if (!v || json_is_null(v)) {
        if (required)
            return rd_fail(r, key, "is missing");
        return def;
    }
    double d;
    if (json_is_integer(v))
        d = (double)json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)))
        d = json_real_value(v);
    else
        return rd_fail(r, key, "must be an integer");
    if (d < min || d > max) {
        if (r->st == DUET_OK)
            r->st = duet_err_set(r->err, DUET_ERR_CONFIG, "%s: field \"%s\" = %.0f is outside [%d, %d]",
                                 r->origin, key, d, min, max);
        return 0;
    }
    return (int)d;
}

static double rd_num(cfg_reader_t *r, const char *key, int required, double def)
{
    json_t *v = rd_get(r, key);
    if (!v || json_is_null(v)) {
        if (required)
            return rd_fail(r, key, "is missing");
        return def;
    }
    if (!json_is_number(v))
        return rd_fail(r, key, "must be a number");
    double d = json_number_value(v);
    if (!isfinite(d))
        return rd_fail(r, key, "must be finite");
    return d;
}

static const char *rd_str(cfg_reader_t *r, json_t *obj, const char *key, const char *def)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return def;
    if (!json_is_string(v)) {
        rd_fail(r, key, "must be a string");
        return def;
    }
    return json_string_value(v);
}

static int rd_bool(cfg_reader_t *r, const char *key, int def)
{
    json_t *v = rd_get(r, key);
    if (!v || json_is_null(v))
        return def;
    if (!json_is_boolean(v))
        return rd_fail(r, key, "must be true or false");
    return json_is_true(v);
}

static void parse_ratios(cfg_reader_t *r, duet_model_config_t *c)
{
    json_t *arr = rd_get(r, "compress_ratios");
    if (arr) {
        if (!json_is_array(arr)) {
            rd_fail(r, "compress_ratios", "must be an array");
            return;
        }
        size_t n = json_array_size(arr);
        if (n < (size_t)c->num_hidden_layers) {
            if (r->st == DUET_OK)
                r->st = duet_err_set(r->err, DUET_ERR_CONFIG,
                                     "%s: field \"compress_ratios\" has %zu entries, fewer than num_hidden_layers (%d)",
                                     r->origin, n, c->num_hidden_layers);
            return;
        }
        if (n > DUET_MAX_LAYERS + 1)
            n = DUET_MAX_LAYERS + 1;
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(arr, i);
            if (!json_is_integer(v)) {
                rd_fail(r, "compress_ratios", "must hold integers");
                return;
            }
            long long x = json_integer_value(v);
            if (x != 0 && x != 4 && x != 128) {
                if (r->st == DUET_OK)
                    r->st = duet_err_set(r->err, DUET_ERR_CONFIG,
                                         "%s: compress_ratios[%zu] = %lld; supported ratios are 0, 4 and 128",
                                         r->origin, i, x);
                return;
            }
            c->compress_ratios[i] = (int)x;
        }
        c->n_compress_ratios = (int)n;
        return;
    }
    /* transformers form: layer_types */
    arr = rd_get(r, "layer_types");
    if (!arr || !json_is_array(arr) || json_array_size(arr) < (size_t)c->num_hidden_layers) {
        rd_fail(r, "compress_ratios", "is missing (and no usable layer_types)");
        return;
    }
    for (int i = 0; i < c->num_hidden_layers; i++) {
        const char *s = json_string_value(json_array_get(arr, (size_t)i));
        if (!s) {
            rd_fail(r, "layer_types", "must hold strings");
            return;
        }
        if (strcmp(s, "sliding_attention") == 0)
            c->compress_ratios[i] = 0;
        else if (strcmp(s, "compressed_sparse_attention") == 0)
            c->compress_ratios[i] = 4;
        else if (strcmp(s, "heavily_compressed_attention") == 0)
            c->compress_ratios[i] = 128;
        else {
            rd_fail(r, "layer_types", "holds an unknown layer type");
            return;
        }
    }
    c->n_compress_ratios = c->num_hidden_layers;
}

static void parse_rope(cfg_reader_t *r, duet_model_config_t *c)
{
    c->rope_theta = rd_num(r, "rope_theta", 0, 10000.0);
    c->compress_rope_theta = rd_num(r, "compress_rope_theta", 0, 160000.0);
    json_t *rs = rd_get(r, "rope_scaling");
    json_t *rp = rd_get(r, "rope_parameters");
    if (rp && json_is_object(rp) && json_object_get(rp, "compress")) {
        /* transformers form: {main: {...}, compress: {...}} */
        json_t *main = json_object_get(rp, "main"), *comp = json_object_get(rp, "compress");
        if (main && json_is_number(json_object_get(main, "rope_theta")))
            c->rope_theta = json_number_value(json_object_get(main, "rope_theta"));
        if (json_is_number(json_object_get(comp, "rope_theta")))
            c->compress_rope_theta = json_number_value(json_object_get(comp, "rope_theta"));
        rs = comp;
    }
    if (!rs || json_is_null(rs))
        return;
    if (!json_is_object(rs)) {
        rd_fail(r, "rope_scaling", "must be an object");
        return;
    }
    const char *type = rd_str(r, rs, "type", NULL);
    if (!type)
        type = rd_str(r, rs, "rope_type", "default");
    if (strcmp(type, "default") == 0)
        return;
    if (strcmp(type, "yarn") != 0) {
        if (r->st == DUET_OK)
            r->st = duet_err_set(r->err, DUET_ERR_CONFIG, "%s: rope_scaling type \"%s\" is not supported (yarn only)",
                                 r->origin, type);
        return;
    }
    duet_yarn_t *y = &c->yarn;
    y->enabled = 1;
    json_t *v;
    static const struct {
        const char *key;
        double def;
        size_t off;
    } yk[] = {{"factor", 1.0, offsetof(duet_yarn_t, factor)},
              {"beta_fast", 32.0, offsetof(duet_yarn_t, beta_fast)},
              {"beta_slow", 1.0, offsetof(duet_yarn_t, beta_slow)},
              {"mscale", 0.0, offsetof(duet_yarn_t, mscale)},
              {"mscale_all_dim", 0.0, offsetof(duet_yarn_t, mscale_all_dim)}};
    for (size_t i = 0; i < sizeof yk / sizeof yk[0]; i++) {
        double *dst = (double *)((char *)y + yk[i].off);
        v = json_object_get(rs, yk[i].key);
        if (!v || json_is_null(v)) {
            *dst = yk[i].def;
        } else if (!json_is_number(v) || !isfinite(json_number_value(v))) {
            char key[64];
            snprintf(key, sizeof key, "rope_scaling.%s", yk[i].key);
            rd_fail(r, key, "must be a finite number");
            return;
        } else {
            *dst = json_number_value(v);
        }
    }
    if (!(y->beta_fast > 0) || !(y->beta_slow > 0)) {
        rd_fail(r, "rope_scaling.beta_fast", "and beta_slow must be positive");
        return;
    }
    v = json_object_get(rs, "original_max_position_embeddings");
    if (!v || !json_is_integer(v) || json_integer_value(v) <= 0) {
        rd_fail(r, "rope_scaling.original_max_position_embeddings", "must be a positive integer");
        return;
    }
    y->original_max_position_embeddings = json_integer_value(v);
    if (!(y->factor >= 1.0))
        rd_fail(r, "rope_scaling.factor", "must be >= 1");
}

static void parse_quant(cfg_reader_t *r, duet_model_config_t *c)
{
    c->weight_block_size[0] = c->weight_block_size[1] = 128;
    json_t *q = rd_get(r, "quantization_config");
    if (q && !json_is_null(q)) {
        if (!json_is_object(q)) {
            rd_fail(r, "quantization_config", "must be an object");
            return;
        }
        const char *m = rd_str(r, q, "quant_method", "");
        if (strcmp(m, "fp8") != 0) {
            if (r->st == DUET_OK)
                r->st = duet_err_set(r->err, DUET_ERR_UNSUPPORTED,
                                     "%s: quantization_config.quant_method \"%s\" is not supported (fp8 only)",
                                     r->origin, m);
            return;
        }
        c->weights_fp8 = 1;
        json_t *bs = json_object_get(q, "weight_block_size");
        if (bs) {
            if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
                !json_is_integer(json_array_get(bs, 1)) || json_integer_value(json_array_get(bs, 0)) != 128 ||
                json_integer_value(json_array_get(bs, 1)) != 128) {
                if (r->st == DUET_OK)
                    r->st = duet_err_set(r->err, DUET_ERR_UNSUPPORTED,
                                         "%s: quantization_config.weight_block_size must be [128, 128]", r->origin);
                return;
            }
        }
        const char *sf = rd_str(r, q, "scale_fmt", "");
        c->scale_ue8m0 = strcmp(sf, "ue8m0") == 0;
    }
    json_t *root = r->root;
    const char *ed = rd_str(r, root, "expert_dtype", NULL);
    if (ed) {
        if (strcmp(ed, "fp4") == 0)
            c->experts_fp4 = 1;
        else if (strcmp(ed, "fp8") != 0 && strcmp(ed, "bf16") != 0) {
            if (r->st == DUET_OK)
                r->st = duet_err_set(r->err, DUET_ERR_UNSUPPORTED,
                                     "%s: expert_dtype \"%s\" is not supported (fp4, fp8, bf16)", r->origin, ed);
        }
    }
}

static void check_consistency(cfg_reader_t *r, duet_model_config_t *c)
{
    if (r->st != DUET_OK)
        return;
    const char *o = r->origin;
    duet_err_t *e = r->err;
    if (c->num_key_value_heads != 1)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: num_key_value_heads is %d; DeepSeek-V4 attention is shared-KV MQA (1)",
                             o, c->num_key_value_heads);
    else if (c->qk_rope_head_dim <= 0 || c->qk_rope_head_dim >= c->head_dim || c->qk_rope_head_dim % 2)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: qk_rope_head_dim %d must be even and smaller than head_dim %d", o,
                             c->qk_rope_head_dim, c->head_dim);
    else if ((c->head_dim - c->qk_rope_head_dim) % 64)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: head_dim - qk_rope_head_dim (%d) must be a multiple of 64", o,
                             c->head_dim - c->qk_rope_head_dim);
    else if (c->num_attention_heads % c->o_groups)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: num_attention_heads %d is not divisible by o_groups %d", o,
                             c->num_attention_heads, c->o_groups);
    else if (c->num_experts_per_tok > c->n_routed_experts)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: num_experts_per_tok %d exceeds n_routed_experts %d", o,
                             c->num_experts_per_tok, c->n_routed_experts);
    else if (c->num_hash_layers > c->num_hidden_layers)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: num_hash_layers %d exceeds num_hidden_layers %d", o,
                             c->num_hash_layers, c->num_hidden_layers);
    else if (c->index_head_dim < c->qk_rope_head_dim || c->index_head_dim % 2)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: index_head_dim %d must be even and at least qk_rope_head_dim %d", o,
                             c->index_head_dim, c->qk_rope_head_dim);
    else if (c->bos_token_id >= c->vocab_size)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: field \"bos_token_id\" = %d is outside the vocabulary", o,
                             c->bos_token_id);
    else if (c->eos_token_id >= c->vocab_size)
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: field \"eos_token_id\" = %d is outside the vocabulary", o,
                             c->eos_token_id);
    else if (!(c->rope_theta > 1.0) || !(c->compress_rope_theta > 1.0))
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: field \"rope_theta\" / \"compress_rope_theta\" must be > 1", o);
    else if (!(c->hc_eps >= 0.0) || !(c->rms_norm_eps > 0.0))
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: field \"hc_eps\" must be >= 0 and \"rms_norm_eps\" > 0", o);
    else if (!(c->routed_scaling_factor > 0.0))
        r->st = duet_err_set(e, DUET_ERR_CONFIG, "%s: field \"routed_scaling_factor\" must be > 0", o);
}

duet_status_t duet_model_config_parse(const char *json, size_t len, const char *origin, duet_model_config_t *out,
                                      duet_err_t *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return duet_err_set(err, DUET_ERR_PARSE, "%s: line %d column %d: %s", origin, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return duet_err_set(err, DUET_ERR_PARSE, "%s: top level is not a JSON object", origin);
    }
    duet_model_config_t c;
    memset(&c, 0, sizeof c);
    cfg_reader_t r = {root, origin, err, DUET_OK};
    const int BIG = 1 << 30;

    c.vocab_size = rd_int(&r, "vocab_size", 1, 0, 1, BIG);
    c.hidden_size = rd_int(&r, "hidden_size", 1, 0, 1, 1 << 20);
    c.num_hidden_layers = rd_int(&r, "num_hidden_layers", 1, 0, 1, DUET_MAX_LAYERS);
    c.num_attention_heads = rd_int(&r, "num_attention_heads", 1, 0, 1, 4096);
    c.num_key_value_heads = rd_int(&r, "num_key_value_heads", 0, 1, 1, 4096);
    c.head_dim = rd_int(&r, "head_dim", 1, 0, 2, 8192);
    c.qk_rope_head_dim = rd_int(&r, "qk_rope_head_dim", 0, -1, 0, 8192);
    if (c.qk_rope_head_dim < 0) {
        double prf = rd_num(&r, "partial_rotary_factor", 0, 0.125);
        c.qk_rope_head_dim = (int)lround(prf * c.head_dim);
    }
    c.q_lora_rank = rd_int(&r, "q_lora_rank", 1, 0, 1, 1 << 20);
    c.o_lora_rank = rd_int(&r, "o_lora_rank", 1, 0, 1, 1 << 20);
    c.o_groups = rd_int(&r, "o_groups", 1, 0, 1, 4096);
    c.n_routed_experts = rd_int(&r, "n_routed_experts", 1, 0, 1, 1 << 16);
    c.n_shared_experts = rd_int(&r, "n_shared_experts", 0, 1, 0, 16);
    c.num_experts_per_tok = rd_int(&r, "num_experts_per_tok", 1, 0, 1, 1024);
    c.moe_intermediate_size = rd_int(&r, "moe_intermediate_size", 1, 0, 1, 1 << 20);
    json_t *sf = rd_get(&r, "scoring_func");
    const char *sfs = sf ? json_string_value(sf) : "sqrtsoftplus";
    if (!sfs)
        rd_fail(&r, "scoring_func", "must be a string");
    else if (strcmp(sfs, "sqrtsoftplus") == 0)
        c.scoring_func = DUET_SCORE_SQRTSOFTPLUS;
    else if (strcmp(sfs, "sigmoid") == 0)
        c.scoring_func = DUET_SCORE_SIGMOID;
    else if (strcmp(sfs, "softmax") == 0)
        c.scoring_func = DUET_SCORE_SOFTMAX;
    else
        rd_fail(&r, "scoring_func", "is not one of sqrtsoftplus, sigmoid, softmax");
    json_t *tm = rd_get(&r, "topk_method");
    const char *tms = tm ? json_string_value(tm) : "noaux_tc";
    if (!tms || (strcmp(tms, "noaux_tc") != 0 && strcmp(tms, "greedy") != 0))
        rd_fail(&r, "topk_method", "must be noaux_tc or greedy");
    else
        c.topk_method_noaux_tc = strcmp(tms, "noaux_tc") == 0;
    c.routed_scaling_factor = rd_num(&r, "routed_scaling_factor", 0, 1.0);
    c.norm_topk_prob = rd_bool(&r, "norm_topk_prob", 1);
    c.swiglu_limit = rd_num(&r, "swiglu_limit", 0, 0.0);
    c.num_hash_layers = rd_int(&r, "num_hash_layers", 0, -1, 0, DUET_MAX_LAYERS);
    if (c.num_hash_layers < 0) {
        /* transformers form: mlp_layer_types = ["hash_moe"] * n + ["moe"] * rest */
        json_t *mt = rd_get(&r, "mlp_layer_types");
        c.num_hash_layers = 0;
        if (mt && !json_is_array(mt))
            rd_fail(&r, "mlp_layer_types", "must be an array");
        for (size_t i = 0; mt && i < json_array_size(mt); i++) {
            const char *s = json_string_value(json_array_get(mt, i));
            if (!s || (strcmp(s, "hash_moe") && strcmp(s, "moe")) || (!strcmp(s, "hash_moe") && (int)i != c.num_hash_layers)) {
                rd_fail(&r, "mlp_layer_types", "must be [\"hash_moe\"] * n + [\"moe\"] * rest");
                break;
            }
            c.num_hash_layers += !strcmp(s, "hash_moe");
        }
    }
    c.hc_mult = rd_int(&r, "hc_mult", 1, 0, 1, 64);
    c.hc_sinkhorn_iters = rd_int(&r, "hc_sinkhorn_iters", 0, 20, 1, 1000);
    c.hc_eps = rd_num(&r, "hc_eps", 0, 1e-6);
    c.sliding_window = rd_int(&r, "sliding_window", 1, 0, 1, 1 << 20);
    c.index_n_heads = rd_int(&r, "index_n_heads", 1, 0, 1, 4096);
    c.index_head_dim = rd_int(&r, "index_head_dim", 1, 0, 2, 8192);
    c.index_topk = rd_int(&r, "index_topk", 1, 0, 1, 1 << 20);
    c.rms_norm_eps = rd_num(&r, "rms_norm_eps", 0, 1e-6);
    c.max_position_embeddings = rd_int(&r, "max_position_embeddings", 0, 1 << 20, 1, BIG);
    c.bos_token_id = rd_int(&r, "bos_token_id", 0, 0, 0, BIG);
    c.eos_token_id = rd_int(&r, "eos_token_id", 0, 1, 0, BIG);
    c.num_nextn_predict_layers = rd_int(&r, "num_nextn_predict_layers", 0, 0, 0, 16);
    if (r.st == DUET_OK)
        parse_ratios(&r, &c);
    if (r.st == DUET_OK)
        parse_rope(&r, &c);
    if (r.st == DUET_OK)
        parse_quant(&r, &c);
    check_consistency(&r, &c);
    json_decref(root);
    if (r.st != DUET_OK)
        return r.st;
    *out = c;
    return DUET_OK;
}

duet_status_t duet_model_config_load(const char *path, duet_model_config_t *out, duet_err_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return duet_err_set(err, errno == ENOENT ? DUET_ERR_NOT_FOUND : DUET_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len + 4096 > cap) {
            size_t ncap = cap ? cap * 2 : 16384;
            if (ncap > (64u << 20)) {
                free(buf);
                fclose(f);
                return duet_err_set(err, DUET_ERR_RANGE, "%s: larger than 64 MiB", path);
            }
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                fclose(f);
                return duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    int ioerr = ferror(f);
    fclose(f);
    if (ioerr) {
        free(buf);
        return duet_err_set(err, DUET_ERR_IO, "%s: read error", path);
    }
    duet_status_t st = duet_model_config_parse(buf, len, path, out, err);
    free(buf);
    return st;
}
