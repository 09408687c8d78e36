#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "log.h"

typedef struct {
    duet_model_t *m;
    duet_err_t *err;
    duet_status_t st;
} loader_t;

static const duet_st_tensor_t *find(loader_t *L, const char *name)
{
    if (L->st != DUET_OK)
        return NULL;
    const duet_st_tensor_t *t = duet_st_checkpoint_find(L->m->ck, name);
    if (!t)
        L->st = duet_err_set(L->err, DUET_ERR_NOT_FOUND, "%s: tensor \"%s\" is missing from the checkpoint",
                             L->m->dir, name);
    return t;
}

static int check_shape(loader_t *L, const duet_st_tensor_t *t, int ndim, int64_t d0, int64_t d1)
{
    if (L->st != DUET_OK)
        return 0;
    int ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    if (!ok) {
        char have[96] = "", want[64];
        size_t o = 0;
        for (int i = 0; i < t->ndim && o < sizeof have - 24; i++)
            o += (size_t)snprintf(have + o, sizeof have - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (ndim == 1)
            snprintf(want, sizeof want, "%lld", (long long)d0);
        else
            snprintf(want, sizeof want, "%lld, %lld", (long long)d0, (long long)d1);
        L->st = duet_err_set(L->err, DUET_ERR_SHAPE, "%s: tensor \"%s\" has shape [%s], expected [%s]", t->file,
                             t->name, have, want);
    }
    return ok;
}

static void bad_dtype(loader_t *L, const duet_st_tensor_t *t, const char *allowed)
{
    if (L->st == DUET_OK)
        L->st = duet_err_set(L->err, DUET_ERR_DTYPE, "%s: tensor \"%s\" has dtype %s; supported: %s", t->file, t->name,
                             duet_dtype_st_name(t->dtype), allowed);
}

/* A linear weight "<base>.weight" [rows, cols] as BF16, F32, F8_E4M3 (+ "<base>.scale"), or packed fp4
 * (I8/U8 [rows, cols/2] + "<base>.scale" [rows, cols/32]). */
static void get_weight(loader_t *L, duet_weight_t *w, const char *base, int rows, int cols)
{
    char name[256], sname[256];
    snprintf(name, sizeof name, "%s.weight", base);
    snprintf(sname, sizeof sname, "%s.scale", base);
    const duet_st_tensor_t *t = find(L, name);
    if (!t)
        return;
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    switch (t->dtype) {
    case DUET_DT_BF16:
    case DUET_DT_F32:
        check_shape(L, t, 2, rows, cols);
        w->dtype = t->dtype;
        return;
    case DUET_DT_F8_E4M3: {
        if (!check_shape(L, t, 2, rows, cols))
            return;
        const duet_st_tensor_t *s = find(L, sname);
        if (!s)
            return;
        if (s->dtype != DUET_DT_F8_E8M0 && s->dtype != DUET_DT_F32) {
            bad_dtype(L, s, "F8_E8M0, F32");
            return;
        }
        if (!check_shape(L, s, 2, (rows + 127) / 128, (cols + 127) / 128))
            return;
        w->dtype = DUET_DT_F8_E4M3;
        w->scale = s->data;
        w->scale_dtype = s->dtype;
        w->scale_cols = (cols + 127) / 128;
        return;
    }
    case DUET_DT_I8:
    case DUET_DT_U8:
    case DUET_DT_F4_E2M1X2: {
        if (cols % 32) {
            L->st = duet_err_set(L->err, DUET_ERR_SHAPE, "%s: fp4 tensor \"%s\" needs a multiple of 32 columns",
                                 t->file, name);
            return;
        }
        if (!check_shape(L, t, 2, rows, cols / 2))
            return;
        const duet_st_tensor_t *s = find(L, sname);
        if (!s)
            return;
        if (s->dtype != DUET_DT_F8_E8M0) {
            bad_dtype(L, s, "F8_E8M0");
            return;
        }
        if (!check_shape(L, s, 2, rows, cols / 32))
            return;
        w->dtype = DUET_DT_F4_E2M1X2;
        w->scale = s->data;
        w->scale_dtype = DUET_DT_F8_E8M0;
        w->scale_cols = cols / 32;
        return;
    }
    default:
        bad_dtype(L, t, "BF16, F32, F8_E4M3 (+scale), I8 packed fp4 (+scale)");
    }
}

/* A small float tensor of `n` values (any of F32/BF16/F16), copied to fp32. */
static float *get_vec(loader_t *L, const char *name, int ndim, int64_t d0, int64_t d1)
{
    const duet_st_tensor_t *t = find(L, name);
    if (!t || !check_shape(L, t, ndim, d0, d1))
        return NULL;
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    float *v = duet_malloc_array(n, sizeof(float));
    if (!v) {
        L->st = duet_err_set(L->err, DUET_ERR_NOMEM, "out of memory loading \"%s\"", name);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case DUET_DT_F32: memcpy(&v[i], (const uint8_t *)t->data + 4 * i, 4); break;
        case DUET_DT_BF16: {
            uint16_t h;
            memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
            v[i] = duet_bf16_to_f32(h);
            break;
        }
        case DUET_DT_F16: {
            uint16_t h;
            memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
            v[i] = duet_f16_to_f32(h);
            break;
        }
        default:
            free(v);
            bad_dtype(L, t, "F32, BF16, F16");
            return NULL;
        }
    }
    return v;
}

static void get_compressor(loader_t *L, duet_compressor_t *c, const char *prefix, int ratio, int dim)
{
    const duet_model_config_t *cfg = &L->m->cfg;
    char name[256];
    c->ratio = ratio;
    c->dim = dim;
    c->coff = ratio == 4 ? 2 : 1;
    snprintf(name, sizeof name, "%s.wkv", prefix);
    get_weight(L, &c->wkv, name, c->coff * dim, cfg->hidden_size);
    snprintf(name, sizeof name, "%s.wgate", prefix);
    get_weight(L, &c->wgate, name, c->coff * dim, cfg->hidden_size);
    snprintf(name, sizeof name, "%s.ape", prefix);
    c->ape = get_vec(L, name, 2, ratio, c->coff * dim);
    snprintf(name, sizeof name, "%s.norm.weight", prefix);
    c->norm = get_vec(L, name, 1, dim, 0);
}

static void get_tid2eid(loader_t *L, duet_layer_weights_t *lw, const char *name)
{
    const duet_model_config_t *cfg = &L->m->cfg;
    const duet_st_tensor_t *t = find(L, name);
    if (!t || !check_shape(L, t, 2, cfg->vocab_size, cfg->num_experts_per_tok))
        return;
    if (t->dtype != DUET_DT_I64 && t->dtype != DUET_DT_I32) {
        bad_dtype(L, t, "I64, I32");
        return;
    }
    size_t n = (size_t)cfg->vocab_size * (size_t)cfg->num_experts_per_tok;
    lw->tid2eid = duet_malloc_array(n, sizeof(int32_t));
    if (!lw->tid2eid) {
        L->st = duet_err_set(L->err, DUET_ERR_NOMEM, "out of memory loading \"%s\"", name);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (t->dtype == DUET_DT_I64)
            memcpy(&v, (const uint8_t *)t->data + 8 * i, 8);
        else {
            int32_t v32;
            memcpy(&v32, (const uint8_t *)t->data + 4 * i, 4);
            v = v32;
        }
        if (v < 0 || v >= cfg->n_routed_experts) {
            L->st = duet_err_set(L->err, DUET_ERR_RANGE, "%s: tensor \"%s\" holds expert id %lld outside [0, %d)",
                                 t->file, name, (long long)v, cfg->n_routed_experts);
            return;
        }
        lw->tid2eid[i] = (int32_t)v;
    }
}

static void load_layer(loader_t *L, int i)
{
    duet_model_t *m = L->m;
    const duet_model_config_t *c = &m->cfg;
    duet_layer_weights_t *lw = &m->layers[i];
    char p[64], name[256];
    snprintf(p, sizeof p, "layers.%d", i);
    int D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim, hc = c->hc_mult;
    int mix = (2 + hc) * hc;
    lw->ratio = c->compress_ratios[i];
    lw->is_hash = i < c->num_hash_layers;
#define NAME(fmt, ...) (snprintf(name, sizeof name, "%s." fmt, p, ##__VA_ARGS__), name)
    lw->attn_norm = get_vec(L, NAME("attn_norm.weight"), 1, D, 0);
    lw->ffn_norm = get_vec(L, NAME("ffn_norm.weight"), 1, D, 0);
    lw->hc_attn_fn = get_vec(L, NAME("hc_attn_fn"), 2, mix, (int64_t)hc * D);
    lw->hc_attn_base = get_vec(L, NAME("hc_attn_base"), 1, mix, 0);
    lw->hc_attn_scale = get_vec(L, NAME("hc_attn_scale"), 1, 3, 0);
    lw->hc_ffn_fn = get_vec(L, NAME("hc_ffn_fn"), 2, mix, (int64_t)hc * D);
    lw->hc_ffn_base = get_vec(L, NAME("hc_ffn_base"), 1, mix, 0);
    lw->hc_ffn_scale = get_vec(L, NAME("hc_ffn_scale"), 1, 3, 0);
    lw->attn_sink = get_vec(L, NAME("attn.attn_sink"), 1, H, 0);
    get_weight(L, &lw->wq_a, NAME("attn.wq_a"), c->q_lora_rank, D);
    lw->q_norm = get_vec(L, NAME("attn.q_norm.weight"), 1, c->q_lora_rank, 0);
    get_weight(L, &lw->wq_b, NAME("attn.wq_b"), H * hd, c->q_lora_rank);
    get_weight(L, &lw->wkv, NAME("attn.wkv"), hd, D);
    lw->kv_norm = get_vec(L, NAME("attn.kv_norm.weight"), 1, hd, 0);
    get_weight(L, &lw->wo_a, NAME("attn.wo_a"), c->o_groups * c->o_lora_rank, H * hd / c->o_groups);
    get_weight(L, &lw->wo_b, NAME("attn.wo_b"), D, c->o_groups * c->o_lora_rank);
    if (lw->ratio) {
        get_compressor(L, &lw->comp, NAME("attn.compressor"), lw->ratio, hd);
    }
    if (lw->ratio == 4) {
        get_compressor(L, &lw->icomp, NAME("attn.indexer.compressor"), 4, c->index_head_dim);
        get_weight(L, &lw->idx_wq_b, NAME("attn.indexer.wq_b"), c->index_n_heads * c->index_head_dim,
                   c->q_lora_rank);
        get_weight(L, &lw->idx_weights_proj, NAME("attn.indexer.weights_proj"), c->index_n_heads, D);
    }
    get_weight(L, &lw->gate, NAME("ffn.gate"), c->n_routed_experts, D);
    if (lw->is_hash)
        get_tid2eid(L, lw, NAME("ffn.gate.tid2eid"));
    else
        lw->gate_bias = get_vec(L, NAME("ffn.gate.bias"), 1, c->n_routed_experts, 0);
    if (L->st != DUET_OK)
        return;
    lw->experts = duet_calloc((size_t)c->n_routed_experts, sizeof(duet_expert_t));
    if (!lw->experts) {
        L->st = duet_err_set(L->err, DUET_ERR_NOMEM, "out of memory (experts of layer %d)", i);
        return;
    }
    int I = c->moe_intermediate_size;
    for (int e = 0; e < c->n_routed_experts && L->st == DUET_OK; e++) {
        get_weight(L, &lw->experts[e].w1, NAME("ffn.experts.%d.w1", e), I, D);
        get_weight(L, &lw->experts[e].w2, NAME("ffn.experts.%d.w2", e), D, I);
        get_weight(L, &lw->experts[e].w3, NAME("ffn.experts.%d.w3", e), I, D);
    }
    if (c->n_shared_experts > 0) {
        int SI = I * c->n_shared_experts;
        get_weight(L, &lw->shared.w1, NAME("ffn.shared_experts.w1"), SI, D);
        get_weight(L, &lw->shared.w2, NAME("ffn.shared_experts.w2"), D, SI);
        get_weight(L, &lw->shared.w3, NAME("ffn.shared_experts.w3"), SI, D);
    }
#undef NAME
}

duet_status_t duet_model_load(const char *dir, duet_model_t **out, duet_err_t *err)
{
    duet_model_t *m = DUET_NEW(duet_model_t);
    if (!m)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    loader_t L = {m, err, DUET_OK};
    m->dir = duet_strdup(dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    duet_status_t st = duet_model_config_load(path, &m->cfg, err);
    if (st != DUET_OK)
        goto err_free;
    st = duet_st_checkpoint_open(dir, &m->ck, err);
    if (st != DUET_OK)
        goto err_free;
    const duet_model_config_t *c = &m->cfg;
    int D = c->hidden_size, hc = c->hc_mult;
    const duet_st_tensor_t *t = find(&L, "embed.weight");
    if (t && check_shape(&L, t, 2, c->vocab_size, D)) {
        if (t->dtype != DUET_DT_BF16 && t->dtype != DUET_DT_F32)
            bad_dtype(&L, t, "BF16, F32");
        m->embed = (duet_weight_t){.dtype = t->dtype, .rows = c->vocab_size, .cols = D, .data = t->data};
    }
    t = find(&L, "head.weight");
    if (t && check_shape(&L, t, 2, c->vocab_size, D)) {
        if (t->dtype != DUET_DT_BF16 && t->dtype != DUET_DT_F32)
            bad_dtype(&L, t, "BF16, F32");
        m->head = (duet_weight_t){.dtype = t->dtype, .rows = c->vocab_size, .cols = D, .data = t->data};
    }
    m->norm = get_vec(&L, "norm.weight", 1, D, 0);
    m->hc_head_fn = get_vec(&L, "hc_head_fn", 2, hc, (int64_t)hc * D);
    m->hc_head_base = get_vec(&L, "hc_head_base", 1, hc, 0);
    float *hs = get_vec(&L, "hc_head_scale", 1, 1, 0);
    if (hs) {
        m->hc_head_scale = hs[0];
        free(hs);
    }
    if (L.st == DUET_OK) {
        m->layers = duet_calloc((size_t)c->num_hidden_layers, sizeof(duet_layer_weights_t));
        if (!m->layers)
            L.st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; L.st == DUET_OK && i < c->num_hidden_layers; i++)
        load_layer(&L, i);
    if (L.st != DUET_OK) {
        st = L.st;
        goto err_free;
    }
    size_t n_mtp = 0;
    for (size_t i = 0; i < duet_st_checkpoint_count(m->ck); i++)
        if (strncmp(duet_st_checkpoint_tensor(m->ck, i)->name, "mtp.", 4) == 0)
            n_mtp++;
    if (n_mtp)
        duet_info("%s: skipping %zu multi-token-prediction (mtp.*) tensors; speculative decoding is not used", dir,
                  n_mtp);
    duet_rope_init(&m->rope_main, c->qk_rope_head_dim, c->rope_theta, NULL);
    duet_rope_init(&m->rope_compress, c->qk_rope_head_dim, c->compress_rope_theta, &c->yarn);
    *out = m;
    return DUET_OK;
err_free:
    duet_model_destroy(&m);
    return st;
}

static void free_compressor(duet_compressor_t *c)
{
    free(c->ape);
    free(c->norm);
}

void duet_model_destroy(duet_model_t **mp)
{
    if (!mp || !*mp)
        return;
    duet_model_t *m = *mp;
    if (m->layers) {
        for (int i = 0; i < m->cfg.num_hidden_layers; i++) {
            duet_layer_weights_t *lw = &m->layers[i];
            free(lw->attn_norm); free(lw->ffn_norm);
            free(lw->hc_attn_fn); free(lw->hc_attn_base); free(lw->hc_attn_scale);
            free(lw->hc_ffn_fn); free(lw->hc_ffn_base); free(lw->hc_ffn_scale);
            free(lw->attn_sink); free(lw->q_norm); free(lw->kv_norm);
            free_compressor(&lw->comp);
            free_compressor(&lw->icomp);
            free(lw->gate_bias); free(lw->tid2eid); free(lw->experts);
        }
        free(m->layers);
    }
    free(m->norm);
    free(m->hc_head_fn);
    free(m->hc_head_base);
    duet_st_checkpoint_close(&m->ck);
    free(m->dir);
    free(m);
    *mp = NULL;
}
