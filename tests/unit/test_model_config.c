/* config.json parsing: the official V4-Flash and V4-Pro configs field by
 * field, the transformers form of the same model, and a table of bad inputs
 * each giving a typed status whose message names the field. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_config.h"

/* The official DeepSeek-V4-Flash config.json (keys and values verbatim). */
static const char k_flash[] =
    "{\n"
    "  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 0,\n"
    "  \"eos_token_id\": 1,\n"
    "  \"expert_dtype\": \"fp4\",\n"
    "  \"hc_eps\": 1e-06,\n"
    "  \"hc_mult\": 4,\n"
    "  \"hc_sinkhorn_iters\": 20,\n"
    "  \"head_dim\": 512,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 4096,\n"
    "  \"index_head_dim\": 128,\n"
    "  \"index_n_heads\": 64,\n"
    "  \"index_topk\": 512,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"max_position_embeddings\": 1048576,\n"
    "  \"model_type\": \"deepseek_v4\",\n"
    "  \"moe_intermediate_size\": 2048,\n"
    "  \"n_routed_experts\": 256,\n"
    "  \"n_shared_experts\": 1,\n"
    "  \"norm_topk_prob\": true,\n"
    "  \"num_attention_heads\": 64,\n"
    "  \"num_experts_per_tok\": 6,\n"
    "  \"num_hidden_layers\": 43,\n"
    "  \"num_hash_layers\": 3,\n"
    "  \"num_key_value_heads\": 1,\n"
    "  \"num_nextn_predict_layers\": 1,\n"
    "  \"o_groups\": 8,\n"
    "  \"o_lora_rank\": 1024,\n"
    "  \"q_lora_rank\": 1024,\n"
    "  \"qk_rope_head_dim\": 64,\n"
    "  \"quantization_config\": {\n"
    "    \"activation_scheme\": \"dynamic\",\n"
    "    \"fmt\": \"e4m3\",\n"
    "    \"quant_method\": \"fp8\",\n"
    "    \"scale_fmt\": \"ue8m0\",\n"
    "    \"weight_block_size\": [128, 128]\n"
    "  },\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_scaling\": {\n"
    "    \"beta_fast\": 32,\n"
    "    \"beta_slow\": 1,\n"
    "    \"factor\": 16,\n"
    "    \"original_max_position_embeddings\": 65536,\n"
    "    \"type\": \"yarn\"\n"
    "  },\n"
    "  \"rope_theta\": 10000,\n"
    "  \"routed_scaling_factor\": 1.5,\n"
    "  \"scoring_func\": \"sqrtsoftplus\",\n"
    "  \"sliding_window\": 128,\n"
    "  \"swiglu_limit\": 10.0,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"topk_method\": \"noaux_tc\",\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.57.1\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 129280,\n"
    "  \"compress_rope_theta\": 160000,\n"
    "  \"compress_ratios\": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,\n"
    "                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0]\n"
    "}\n";

/* ---- helpers ------------------------------------------------------------ */

static json_t *flash_json(void)
{
    json_error_t je;
    json_t *j = json_loads(k_flash, 0, &je);
    assert_non_null(j);
    return j;
}

/* Set key `k` of `obj` to the JSON text `v` (NULL: delete it). */
static void set_json(json_t *obj, const char *k, const char *v)
{
    if (!v) {
        json_object_del(obj, k);
        return;
    }
    json_error_t je;
    json_t *x = json_loads(v, JSON_DECODE_ANY, &je);
    if (!x)
        fail_msg("bad test JSON for %s: %s", k, v);
    assert_int_equal(json_object_set_new(obj, k, x), 0);
}

static duet_status_t parse_json(json_t *j, duet_model_config_t *c, duet_err_t *err)
{
    char *s = json_dumps(j, 0);
    assert_non_null(s);
    duet_status_t st = duet_model_config_parse(s, strlen(s), "cfg.json", c, err);
    free(s);
    return st;
}

static void parse_ok(json_t *j, duet_model_config_t *c)
{
    duet_err_t err = {0};
    memset(c, 0xa5, sizeof *c);
    duet_status_t st = parse_json(j, c, &err);
    if (st != DUET_OK)
        fail_msg("parse failed: %s", duet_err_text(&err));
}

/* The V4-Pro config: Flash with the dims that differ. */
static json_t *pro_json(void)
{
    json_t *j = flash_json();
    set_json(j, "hidden_size", "7168");
    set_json(j, "num_hidden_layers", "61");
    set_json(j, "num_attention_heads", "128");
    set_json(j, "q_lora_rank", "1536");
    set_json(j, "o_groups", "16");
    set_json(j, "n_routed_experts", "384");
    set_json(j, "moe_intermediate_size", "3072");
    set_json(j, "index_topk", "1024");
    set_json(j, "routed_scaling_factor", "2.5");
    json_t *r = json_array();
    json_array_append_new(r, json_integer(128));
    json_array_append_new(r, json_integer(128));
    for (int i = 0; i < 29; i++) {
        json_array_append_new(r, json_integer(4));
        json_array_append_new(r, json_integer(128));
    }
    json_array_append_new(r, json_integer(4));
    json_array_append_new(r, json_integer(0));
    json_object_set_new(j, "compress_ratios", r);
    return j;
}

/* The form transformers' DeepseekV4Config writes: layer_types and mlp_layer_types instead of
 * compress_ratios and num_hash_layers, partial_rotary_factor instead of qk_rope_head_dim, and
 * rope_parameters {main, compress} instead of rope_scaling. */
static json_t *transformers_json(void)
{
    json_t *j = flash_json();
    json_t *lt = json_array(), *mt = json_array();
    json_t *r = json_object_get(j, "compress_ratios");
    for (int i = 0; i < 43; i++) {
        json_int_t x = json_integer_value(json_array_get(r, (size_t)i));
        json_array_append_new(lt, json_string(x == 0 ? "sliding_attention"
                                              : x == 4 ? "compressed_sparse_attention"
                                                       : "heavily_compressed_attention"));
        json_array_append_new(mt, json_string(i < 3 ? "hash_moe" : "moe"));
    }
    json_object_set_new(j, "layer_types", lt);
    json_object_set_new(j, "mlp_layer_types", mt);
    set_json(j, "compress_ratios", NULL);
    set_json(j, "num_hash_layers", NULL);
    set_json(j, "qk_rope_head_dim", NULL);
    set_json(j, "rope_scaling", NULL);
    set_json(j, "rope_theta", NULL);
    set_json(j, "compress_rope_theta", NULL);
    set_json(j, "partial_rotary_factor", "0.125");
    set_json(j, "compress_rates", "{\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 128}");
    set_json(j, "rope_parameters",
             "{\"main\": {\"partial_rotary_factor\": 0.125, \"rope_theta\": 10000, \"rope_type\": \"default\"},"
             " \"compress\": {\"attention_factor\": 1.0, \"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 16,"
             " \"original_max_position_embeddings\": 65536, \"partial_rotary_factor\": 0.125,"
             " \"rope_theta\": 160000, \"rope_type\": \"yarn\", \"type\": \"yarn\"}}");
    set_json(j, "transformers_version", "\"5.17.0\"");
    return j;
}

/* Every field but n_compress_ratios (the official list carries the MTP entry, layer_types does not). */
static void assert_same_config(const duet_model_config_t *a, const duet_model_config_t *b)
{
#define SAME_I(f)                                                                                                 \
    do {                                                                                                          \
        if (a->f != b->f)                                                                                         \
            fail_msg("field %s differs: %.17g vs %.17g", #f, (double)a->f, (double)b->f);                         \
    } while (0)
#define SAME_D(f) SAME_I(f)
    SAME_I(vocab_size); SAME_I(hidden_size); SAME_I(num_hidden_layers); SAME_I(num_attention_heads);
    SAME_I(num_key_value_heads); SAME_I(head_dim); SAME_I(qk_rope_head_dim); SAME_I(q_lora_rank);
    SAME_I(o_lora_rank); SAME_I(o_groups); SAME_I(n_routed_experts); SAME_I(n_shared_experts);
    SAME_I(num_experts_per_tok); SAME_I(moe_intermediate_size); SAME_I(scoring_func); SAME_I(topk_method_noaux_tc);
    SAME_D(routed_scaling_factor); SAME_I(norm_topk_prob); SAME_D(swiglu_limit); SAME_I(num_hash_layers);
    SAME_I(hc_mult); SAME_I(hc_sinkhorn_iters); SAME_D(hc_eps); SAME_I(sliding_window);
    for (int i = 0; i < a->num_hidden_layers; i++)
        SAME_I(compress_ratios[i]);
    SAME_D(rope_theta); SAME_D(compress_rope_theta);
    SAME_I(yarn.enabled); SAME_D(yarn.factor); SAME_D(yarn.beta_fast); SAME_D(yarn.beta_slow);
    SAME_D(yarn.mscale); SAME_D(yarn.mscale_all_dim); SAME_I(yarn.original_max_position_embeddings);
    SAME_I(yarn_on_main); SAME_I(index_n_heads); SAME_I(index_head_dim); SAME_I(index_topk);
    SAME_D(rms_norm_eps); SAME_I(max_position_embeddings); SAME_I(bos_token_id); SAME_I(eos_token_id);
    SAME_I(num_nextn_predict_layers); SAME_I(weights_fp8); SAME_I(weight_block_size[0]);
    SAME_I(weight_block_size[1]); SAME_I(scale_ue8m0); SAME_I(experts_fp4);
#undef SAME_I
#undef SAME_D
}

/* ---- the official configs ---------------------------------------------- */

static void test_flash(void **state)
{
    (void)state;
    json_t *j = flash_json();
    duet_model_config_t c;
    parse_ok(j, &c);
    json_decref(j);
    assert_int_equal(c.vocab_size, 129280);
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.num_hidden_layers, 43);
    assert_int_equal(c.num_attention_heads, 64);
    assert_int_equal(c.num_key_value_heads, 1);
    assert_int_equal(c.head_dim, 512);
    assert_int_equal(c.qk_rope_head_dim, 64);
    assert_int_equal(duet_cfg_nope_dim(&c), 448);
    assert_int_equal(c.q_lora_rank, 1024);
    assert_int_equal(c.o_lora_rank, 1024);
    assert_int_equal(c.o_groups, 8);
    assert_int_equal(c.n_routed_experts, 256);
    assert_int_equal(c.n_shared_experts, 1);
    assert_int_equal(c.num_experts_per_tok, 6);
    assert_int_equal(c.moe_intermediate_size, 2048);
    assert_int_equal(c.scoring_func, DUET_SCORE_SQRTSOFTPLUS);
    assert_int_equal(c.topk_method_noaux_tc, 1);
    assert_true(c.routed_scaling_factor == 1.5);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_true(c.swiglu_limit == 10.0);
    assert_int_equal(c.num_hash_layers, 3);
    assert_int_equal(c.hc_mult, 4);
    assert_int_equal(c.hc_sinkhorn_iters, 20);
    assert_true(c.hc_eps == 1e-6);
    assert_int_equal(c.sliding_window, 128);
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.compress_rope_theta == 160000.0);
    assert_int_equal(c.yarn.enabled, 1);
    assert_true(c.yarn.factor == 16.0);
    assert_true(c.yarn.beta_fast == 32.0);
    assert_true(c.yarn.beta_slow == 1.0);
    assert_true(c.yarn.mscale == 0.0 && c.yarn.mscale_all_dim == 0.0);
    assert_int_equal(c.yarn.original_max_position_embeddings, 65536);
    assert_int_equal(c.yarn_on_main, 0);
    assert_int_equal(c.index_n_heads, 64);
    assert_int_equal(c.index_head_dim, 128);
    assert_int_equal(c.index_topk, 512);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_int_equal(c.max_position_embeddings, 1048576);
    assert_int_equal(c.bos_token_id, 0);
    assert_int_equal(c.eos_token_id, 1);
    assert_int_equal(c.num_nextn_predict_layers, 1);
    assert_int_equal(c.weights_fp8, 1);
    assert_int_equal(c.weight_block_size[0], 128);
    assert_int_equal(c.weight_block_size[1], 128);
    assert_int_equal(c.scale_ue8m0, 1);
    assert_int_equal(c.experts_fp4, 1);
    /* [0, 0] + [4, 128] * 20 + [4] for the 43 layers, then the MTP entry */
    assert_int_equal(c.n_compress_ratios, 44);
    for (int i = 0; i < 44; i++) {
        int want = i < 2 ? 0 : i == 43 ? 0 : i % 2 == 0 ? 4 : 128;
        assert_int_equal(duet_cfg_ratio(&c, i), want);
    }
    assert_int_equal(duet_cfg_count_ratio(&c, 0), 2);
    assert_int_equal(duet_cfg_count_ratio(&c, 4), 21);
    assert_int_equal(duet_cfg_count_ratio(&c, 128), 20);
    assert_int_equal(duet_cfg_count_ratio(&c, 64), 0);
    static const int idx[][2] = {{0, 0}, {1, 1}, {2, 0}, {3, 0}, {4, 1}, {5, 1}, {40, 19}, {41, 19}, {42, 20},
                                 {43, -1}, {-1, -1}, {1000, -1}};
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++)
        assert_int_equal(duet_cfg_ratio_layer_index(&c, idx[i][0]), idx[i][1]);
    /* every ratio's slots are 0..count-1, each once */
    for (int r = 0; r <= 128; r += 4) {
        int seen = 0;
        for (int l = 0; l < 43; l++)
            if (duet_cfg_ratio(&c, l) == r) {
                assert_int_equal(duet_cfg_ratio_layer_index(&c, l), seen);
                seen++;
            }
        assert_int_equal(seen, duet_cfg_count_ratio(&c, r));
    }
}

static void test_pro(void **state)
{
    (void)state;
    json_t *j = pro_json();
    duet_model_config_t c, f;
    parse_ok(j, &c);
    json_decref(j);
    j = flash_json();
    parse_ok(j, &f);
    json_decref(j);
    assert_int_equal(c.hidden_size, 7168);
    assert_int_equal(c.num_hidden_layers, 61);
    assert_int_equal(c.num_attention_heads, 128);
    assert_int_equal(c.q_lora_rank, 1536);
    assert_int_equal(c.o_groups, 16);
    assert_int_equal(c.n_routed_experts, 384);
    assert_int_equal(c.moe_intermediate_size, 3072);
    assert_int_equal(c.index_topk, 1024);
    assert_true(c.routed_scaling_factor == 2.5);
    assert_int_equal(c.n_compress_ratios, 62);
    assert_int_equal(duet_cfg_count_ratio(&c, 0), 0);
    assert_int_equal(duet_cfg_count_ratio(&c, 4), 30);
    assert_int_equal(duet_cfg_count_ratio(&c, 128), 31);
    assert_int_equal(duet_cfg_ratio(&c, 61), 0); /* MTP */
    assert_int_equal(duet_cfg_ratio_layer_index(&c, 1), 1);
    assert_int_equal(duet_cfg_ratio_layer_index(&c, 59), 30);
    assert_int_equal(duet_cfg_ratio_layer_index(&c, 60), 29);
    assert_int_equal(duet_cfg_ratio_layer_index(&c, 61), -1);
    /* the rest is Flash's */
    f.hidden_size = c.hidden_size;
    f.num_hidden_layers = c.num_hidden_layers;
    f.num_attention_heads = c.num_attention_heads;
    f.q_lora_rank = c.q_lora_rank;
    f.o_groups = c.o_groups;
    f.n_routed_experts = c.n_routed_experts;
    f.moe_intermediate_size = c.moe_intermediate_size;
    f.index_topk = c.index_topk;
    f.routed_scaling_factor = c.routed_scaling_factor;
    memcpy(f.compress_ratios, c.compress_ratios, sizeof f.compress_ratios);
    assert_same_config(&c, &f);
}

static void test_transformers_form(void **state)
{
    (void)state;
    json_t *j = transformers_json();
    duet_model_config_t t, f;
    parse_ok(j, &t);
    json_decref(j);
    j = flash_json();
    parse_ok(j, &f);
    json_decref(j);
    assert_same_config(&t, &f);
    assert_int_equal(t.n_compress_ratios, 43);

    /* with the legacy keys present as well (as transformers writes them) */
    j = transformers_json();
    set_json(j, "qk_rope_head_dim", "64");
    set_json(j, "num_hash_layers", "3");
    set_json(j, "rope_theta", "10000");
    set_json(j, "compress_rope_theta", "160000");
    parse_ok(j, &t);
    json_decref(j);
    assert_same_config(&t, &f);

    /* each rope comes from its own entry */
    j = transformers_json();
    set_json(j, "rope_parameters",
             "{\"main\": {\"rope_theta\": 20000, \"rope_type\": \"default\"},"
             " \"compress\": {\"rope_theta\": 170000, \"rope_type\": \"yarn\", \"factor\": 8, \"beta_fast\": 16,"
             " \"beta_slow\": 2, \"original_max_position_embeddings\": 4096}}");
    parse_ok(j, &t);
    json_decref(j);
    assert_true(t.rope_theta == 20000.0 && t.compress_rope_theta == 170000.0);
    assert_true(t.yarn.enabled && t.yarn.factor == 8.0 && t.yarn.beta_fast == 16.0 && t.yarn.beta_slow == 2.0);
    assert_int_equal(t.yarn.original_max_position_embeddings, 4096);
}

/* A file on disk through duet_model_config_load, and its errors. */
static void test_load_file(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/duet_cfg_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    duet_model_config_t c;
    duet_err_t err = {0};
    assert_int_equal(duet_model_config_load(path, &c, &err), DUET_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, path));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(k_flash, 1, sizeof k_flash - 1, f), sizeof k_flash - 1);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(duet_model_config_load(path, &c, &err), DUET_OK);
    assert_int_equal(c.num_hidden_layers, 43);
    /* cut in the middle: malformed, the message names the file */
    assert_int_equal(truncate(path, 700), 0);
    assert_int_equal(duet_model_config_load(path, &c, &err), DUET_ERR_PARSE);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* ---- bad inputs --------------------------------------------------------- */

typedef struct {
    const char *key;  /* top-level key to change; NULL: `value` is the whole document */
    const char *value;/* JSON text; NULL deletes the key */
    duet_status_t want;
    const char *field;/* substring the message must hold (besides the origin) */
    int transformers; /* start from the transformers form */
} bad_cfg_t;

static const bad_cfg_t k_bad[] = {
    {NULL, "{\"vocab_size\": ", DUET_ERR_PARSE, NULL, 0},
    {NULL, "", DUET_ERR_PARSE, NULL, 0},
    {NULL, "[1, 2]", DUET_ERR_PARSE, "object", 0},
    {NULL, "{\"a\": 1, \"a\": 2}", DUET_ERR_PARSE, NULL, 0},
    {"hidden_size", NULL, DUET_ERR_CONFIG, "hidden_size", 0},
    {"vocab_size", NULL, DUET_ERR_CONFIG, "vocab_size", 0},
    {"num_hidden_layers", NULL, DUET_ERR_CONFIG, "num_hidden_layers", 0},
    {"head_dim", NULL, DUET_ERR_CONFIG, "head_dim", 0},
    {"q_lora_rank", NULL, DUET_ERR_CONFIG, "q_lora_rank", 0},
    {"n_routed_experts", NULL, DUET_ERR_CONFIG, "n_routed_experts", 0},
    {"hc_mult", NULL, DUET_ERR_CONFIG, "hc_mult", 0},
    {"sliding_window", NULL, DUET_ERR_CONFIG, "sliding_window", 0},
    {"index_topk", NULL, DUET_ERR_CONFIG, "index_topk", 0},
    {"num_hidden_layers", "\"43\"", DUET_ERR_CONFIG, "num_hidden_layers", 0},
    {"hidden_size", "4096.5", DUET_ERR_CONFIG, "hidden_size", 0},
    {"hidden_size", "true", DUET_ERR_CONFIG, "hidden_size", 0},
    {"hidden_size", "0", DUET_ERR_CONFIG, "hidden_size", 0},
    {"hidden_size", "-4096", DUET_ERR_CONFIG, "hidden_size", 0},
    {"num_hidden_layers", "300", DUET_ERR_CONFIG, "num_hidden_layers", 0},
    {"rms_norm_eps", "\"1e-6\"", DUET_ERR_CONFIG, "rms_norm_eps", 0},
    {"norm_topk_prob", "1", DUET_ERR_CONFIG, "norm_topk_prob", 0},
    {"scoring_func", "\"relu\"", DUET_ERR_CONFIG, "scoring_func", 0},
    {"scoring_func", "5", DUET_ERR_CONFIG, "scoring_func", 0},
    {"topk_method", "\"group_limited\"", DUET_ERR_CONFIG, "topk_method", 0},
    {"num_key_value_heads", "2", DUET_ERR_CONFIG, "num_key_value_heads", 0},
    {"qk_rope_head_dim", "512", DUET_ERR_CONFIG, "qk_rope_head_dim", 0},
    {"qk_rope_head_dim", "63", DUET_ERR_CONFIG, "qk_rope_head_dim", 0},
    {"head_dim", "500", DUET_ERR_CONFIG, "head_dim", 0},
    {"o_groups", "7", DUET_ERR_CONFIG, "o_groups", 0},
    {"num_experts_per_tok", "300", DUET_ERR_CONFIG, "num_experts_per_tok", 0},
    {"num_hash_layers", "44", DUET_ERR_CONFIG, "num_hash_layers", 0},
    {"index_head_dim", "32", DUET_ERR_CONFIG, "index_head_dim", 0},
    {"eos_token_id", "129280", DUET_ERR_CONFIG, "eos", 0},
    {"compress_ratios", "[0, 0, 4, 128, 5, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,"
                        " 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0]",
     DUET_ERR_CONFIG, "compress_ratios[4]", 0},
    {"compress_ratios", "[0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,"
                        " 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, \"128\", 4, 0]",
     DUET_ERR_CONFIG, "compress_ratios", 0},
    {"compress_ratios", "[0, 0, 4, 128]", DUET_ERR_CONFIG, "compress_ratios", 0},
    {"compress_ratios", "\"0,4\"", DUET_ERR_CONFIG, "compress_ratios", 0},
    {"compress_ratios", NULL, DUET_ERR_CONFIG, "compress_ratios", 0},
    {"rope_scaling", "5", DUET_ERR_CONFIG, "rope_scaling", 0},
    {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", DUET_ERR_CONFIG, "rope_scaling", 0},
    {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 16}", DUET_ERR_CONFIG, "original_max_position_embeddings", 0},
    {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 0.5, \"original_max_position_embeddings\": 65536}",
     DUET_ERR_CONFIG, "factor", 0},
    {"quantization_config", "\"fp8\"", DUET_ERR_CONFIG, "quantization_config", 0},
    {"quantization_config", "{\"quant_method\": \"awq\"}", DUET_ERR_UNSUPPORTED, "quant_method", 0},
    {"quantization_config", "{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}", DUET_ERR_UNSUPPORTED,
     "weight_block_size", 0},
    {"expert_dtype", "\"int4\"", DUET_ERR_UNSUPPORTED, "expert_dtype", 0},
    {"expert_dtype", "4", DUET_ERR_CONFIG, "expert_dtype", 0},
    {"layer_types", "[\"sliding_attention\"]", DUET_ERR_CONFIG, "compress_ratios", 1},
    {"layer_types", NULL, DUET_ERR_CONFIG, "compress_ratios", 1},
};

static void test_bad_inputs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_cfg_t *b = &k_bad[i];
        duet_model_config_t c;
        duet_err_t err = {0};
        duet_status_t st;
        if (b->key) {
            json_t *j = b->transformers ? transformers_json() : flash_json();
            set_json(j, b->key, b->value);
            st = parse_json(j, &c, &err);
            json_decref(j);
        } else {
            st = duet_model_config_parse(b->value, strlen(b->value), "cfg.json", &c, &err);
        }
        if (st != b->want || !strstr(err.msg, "cfg.json") || (b->field && !strstr(err.msg, b->field)))
            fail_msg("case %zu (%s = %s): want %s naming \"%s\", got %s", i, b->key ? b->key : "doc",
                     b->value ? b->value : "(deleted)", duet_status_code(b->want), b->field ? b->field : "",
                     duet_err_text(&err));
        assert_int_equal(err.status, st);
        if (getenv("DUET_TEST_VERBOSE"))
            print_message("%s\n", duet_err_text(&err));
    }
    /* the layer_types list with an unknown entry (transformers form) */
    json_t *j = transformers_json();
    json_array_set_new(json_object_get(j, "layer_types"), 5, json_string("full_attention"));
    duet_model_config_t c;
    duet_err_t err = {0};
    assert_int_equal(parse_json(j, &c, &err), DUET_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "layer_types"));
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flash),
        cmocka_unit_test(test_pro),
        cmocka_unit_test(test_transformers_form),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
