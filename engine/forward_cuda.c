/* DeepSeek-V4 forward on the GPU (contract in forward_cuda.h).  The steps and
 * their order are engine/forward.c's; comments name the CPU step each block
 * mirrors.  Shapes: R = rows of the batch, D = hidden, H = heads, hd =
 * head_dim, hc = hyper-connection streams. */
#include "forward_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "time_util.h"
#include "log.h"

/* ---- device model ------------------------------------------------------ */

typedef struct {
    duet_weight_t wq_a, wq_b, wkv, wo_a, wo_b;
    duet_weight_t comp_wkv, comp_wgate, icomp_wkv, icomp_wgate, idx_wq_b, idx_wproj, gate;
    duet_weight_t *experts; /* E * 3: w1, w2, w3 */
    duet_weight_t sh[3];
    float *attn_norm, *ffn_norm, *q_norm, *kv_norm;
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale, *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    float *attn_sink;
    float *comp_ape, *comp_norm, *icomp_ape, *icomp_norm;
    /* MoE routing and grouped experts on the device */
    float *gate_bias;     /* (E) or NULL */
    int32_t *tid2eid;     /* (vocab, K) on hash layers */
    const void **ex_ptr;  /* device (6, E): w1, w3, w2 data pointers, then their scale pointers */
    int grouped;          /* every expert alike: duet_cuda_matmul_grouped applies */
    /* wo_a as one grouped launch over this rank's output groups (each group's rows a matrix) */
    duet_weight_t wo_proto; /* one group's rows (the first this rank holds) */
    const void **wo_ptr;    /* device (2, Gl): each group's data pointer, then its scale pointer */
} layer_dev_t;

struct duet_model_cuda {
    duet_cuda_t *c;
    const duet_model_t *m;
    layer_dev_t *layers;
    duet_weight_t embed, head;
    float *norm, *hc_head_fn, *hc_head_base;
    float *neg_inf; /* (H) sinks of the DUET_FAULT_SINK test hook */
    void **allocs;
    size_t n_allocs, cap_allocs, weight_bytes;
    /* workspace reused between calls */
    uint8_t *ws;
    size_t ws_bytes;
    uint8_t *plan_host, *plan_dev; /* pinned staging and its device copy */
    size_t plan_bytes;
    uint8_t *moe_host, *moe_dev;
    size_t moe_bytes;
    int moe_host_route; /* DUET_MOE_HOST=1: routing on the host and one launch set per expert (the older path) */
    int no_tile;        /* DUET_CUDA_TILE=0: fp4 experts kept in the checkpoint's layout (for comparison) */
    int no_pdl;         /* DUET_CUDA_PDL=0: no dependent launches (for comparison) */
    int no_side;        /* DUET_CUDA_SIDE=0: no side stream, every launch on one (for comparison) */
    int no_blockdiag;   /* DUET_CUDA_WO_BLOCKDIAG=0: wo_a as the grouped launch (for comparison) */
    int no_post_fuse;   /* DUET_CUDA_HC_POST_FUSE=0: hc_post as its own operation (for comparison) */
    int no_sk_side;     /* DUET_CUDA_HC_SINKHORN_SIDE=0: comb's Sinkhorn in the pre-mix (for comparison) */
    int gate_chunks;    /* the MoE gate's chunk units (GATE_CHUNK_UNITS; DUET_CUDA_GATE_CHUNKS) */
    /* tensor parallelism (forward_cuda.h): this rank's share */
    int tp_rank, tp_size;
    int h0, h1, g0, g1, e0, e1; /* heads, output groups, routed experts [begin, end) */
    duet_cuda_comm_t *comm;
};

static duet_status_t cuda_fail(duet_cuda_t *c, duet_status_t st, duet_err_t *err)
{
    if (err)
        *err = *duet_cuda_error(c);
    return st;
}

static duet_status_t track(duet_model_cuda_t *mc, void *p)
{
    if (mc->n_allocs == mc->cap_allocs) {
        size_t cap = mc->cap_allocs ? mc->cap_allocs * 2 : 256;
        void **np = realloc(mc->allocs, cap * sizeof *np);
        if (!np)
            return DUET_ERR_NOMEM;
        mc->allocs = np;
        mc->cap_allocs = cap;
    }
    mc->allocs[mc->n_allocs++] = p;
    return DUET_OK;
}

static duet_status_t dev_copy(duet_model_cuda_t *mc, const void *src, size_t bytes, void **out, duet_err_t *err)
{
    void *p = NULL;
    *out = NULL;
    if (!src || !bytes)
        return DUET_OK;
    if (duet_cuda_malloc(mc->c, &p, bytes) != DUET_OK)
        return cuda_fail(mc->c, DUET_ERR_CUDA, err);
    if (track(mc, p) != DUET_OK) {
        duet_cuda_free(mc->c, p);
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    if (duet_cuda_upload(mc->c, p, src, bytes) != DUET_OK)
        return cuda_fail(mc->c, DUET_ERR_CUDA, err);
    mc->weight_bytes += bytes;
    *out = p;
    return DUET_OK;
}

static duet_status_t dev_floats(duet_model_cuda_t *mc, const float *src, size_t n, float **out, duet_err_t *err)
{
    return dev_copy(mc, src, n * sizeof(float), (void **)out, err);
}

static size_t weight_row_bytes(const duet_weight_t *w)
{
    switch (w->dtype) {
    case DUET_DT_BF16: return 2 * (size_t)w->cols;
    case DUET_DT_F8_E4M3: return (size_t)w->cols;
    case DUET_DT_F4_E2M1X2: return (size_t)w->cols / 2;
    default: return 4 * (size_t)w->cols;
    }
}

static size_t weight_scale_bytes(const duet_weight_t *w)
{
    size_t es = w->scale_dtype == DUET_DT_F32 ? 4 : 1;
    if (!w->scale)
        return 0;
    if (w->dtype == DUET_DT_F8_E4M3)
        return (size_t)((w->rows + 127) / 128) * (size_t)w->scale_cols * es;
    if (w->dtype == DUET_DT_F4_E2M1X2)
        return (size_t)w->rows * (size_t)w->scale_cols * es;
    return 0;
}

/* The MoE gate's matmul (256 x 4096 bf16 at V4-Flash widths: two row blocks of the tensor-core
 * decode kernel) totalled in chunks of this many units of 128 columns instead of the kernel's
 * default, so that a decode step's launch splits along the columns into 16 chunks instead of 4:
 * four times the blocks (32 at batch 32, 8 at batch 1 before).  Other bits than the default
 * grouping, the same at every batch size.  DUET_CUDA_GATE_CHUNKS=N sets N (0: the default). */
#define GATE_CHUNK_UNITS 2

static duet_status_t dev_weight(duet_model_cuda_t *mc, const duet_weight_t *h, duet_weight_t *d, duet_err_t *err)
{
    *d = *h;
    d->data = NULL;
    d->scale = NULL;
    if (!h->data)
        return DUET_OK;
    duet_status_t st = dev_copy(mc, h->data, weight_row_bytes(h) * (size_t)h->rows, (void **)&d->data, err);
    if (st == DUET_OK)
        st = dev_copy(mc, h->scale, weight_scale_bytes(h), (void **)&d->scale, err);
    return st;
}

static int same_shape(const duet_weight_t *a, const duet_weight_t *b)
{
    return a->dtype == b->dtype && a->rows == b->rows && a->cols == b->cols && a->scale_dtype == b->scale_dtype &&
           a->scale_cols == b->scale_cols && !a->scale == !b->scale && a->data && b->data;
}

/* Routing tables (gate bias, tid2eid) and the experts' pointer table for the grouped matmuls. */
static duet_status_t upload_moe_tables(duet_model_cuda_t *mc, int l, duet_err_t *err)
{
    const duet_model_config_t *c = &mc->m->cfg;
    const duet_layer_weights_t *h = &mc->m->layers[l];
    layer_dev_t *d = &mc->layers[l];
    int E = c->n_routed_experts, K = c->num_experts_per_tok;
    if (E <= 0 || K <= 0)
        return DUET_OK;
    if (h->gate_bias)
        DUET_TRY(dev_floats(mc, h->gate_bias, (size_t)E, &d->gate_bias, err));
    if (h->is_hash && h->tid2eid)
        DUET_TRY(dev_copy(mc, h->tid2eid, sizeof(int32_t) * (size_t)c->vocab_size * (size_t)K,
                          (void **)&d->tid2eid, err));
    const duet_weight_t *x0 = &d->experts[3 * (size_t)mc->e0]; /* the first expert this rank holds */
    int ok = K <= DUET_CUDA_MOE_MAX_K && K <= E && mc->e1 > mc->e0 && (!h->is_hash || h->tid2eid) &&
             same_shape(&x0[0], &x0[2]) && duet_cuda_matmul_grouped_ok(&x0[0], NULL) &&
             duet_cuda_matmul_grouped_ok(&x0[1], NULL);
    for (int e = mc->e0 + 1; ok && e < mc->e1; e++)
        for (int k = 0; k < 3; k++)
            ok &= same_shape(&d->experts[3 * e + k], &x0[k]);
    if (!ok)
        return DUET_OK; /* the per-expert path */
    /* fp4 (and bf16) experts in the tiled layouts the grouped kernel streams at full speed (the
     * pointers stay; the per-expert path of DUET_MOE_HOST reads them through the same kernels) */
    for (int k = 0; k < 3 && !mc->no_tile; k++)
        if (duet_cuda_weight_tile_ok(&x0[k]))
            for (int e = mc->e0; e < mc->e1; e++) {
                duet_status_t st = duet_cuda_weight_tile(mc->c, &d->experts[3 * e + k]);
                if (st != DUET_OK)
                    return cuda_fail(mc->c, st, err);
            }
    const void **tab = duet_calloc((size_t)6 * E, sizeof(void *));
    if (!tab)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    static const int order[3] = {0, 2, 1}; /* w1, w3, w2 */
    for (int k = 0; k < 3; k++)
        for (int e = 0; e < E; e++) {
            tab[(size_t)k * E + e] = d->experts[3 * e + order[k]].data;
            tab[(size_t)(3 + k) * E + e] = d->experts[3 * e + order[k]].scale;
        }
    duet_status_t st = dev_copy(mc, tab, sizeof(void *) * (size_t)6 * E, (void **)&d->ex_ptr, err);
    free(tab);
    d->grouped = st == DUET_OK;
    return st;
}

/* wo_a's rows of each output group this rank holds as a matrix of its own, for one grouped
 * launch at decode (attention()): left unset where the groups' rows cannot start a matrix
 * (fp8 groups not on 128-row scale blocks) or the grouped kernel does not take them. */
static duet_status_t upload_wo_table(duet_model_cuda_t *mc, int l, duet_err_t *err)
{
    const duet_model_config_t *c = &mc->m->cfg;
    layer_dev_t *d = &mc->layers[l];
    const duet_weight_t *w = &d->wo_a;
    int Gl = mc->g1 - mc->g0, orank = c->o_lora_rank;
    if (Gl < 2 || w->rows != c->o_groups * orank || (w->dtype == DUET_DT_F8_E4M3 && orank % 128))
        return DUET_OK;
    size_t rb = weight_row_bytes(w), es = w->scale_dtype == DUET_DT_F32 ? 4 : 1;
    const void **tab = duet_calloc((size_t)2 * Gl, sizeof(void *));
    if (!tab)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    for (int g = 0; g < Gl; g++) {
        size_t row = (size_t)(mc->g0 + g) * orank;
        tab[g] = (const uint8_t *)w->data + row * rb;
        if (w->scale && w->dtype == DUET_DT_F8_E4M3)
            tab[Gl + g] = (const uint8_t *)w->scale + row / 128 * w->scale_cols * es;
        else if (w->scale && w->dtype == DUET_DT_F4_E2M1X2)
            tab[Gl + g] = (const uint8_t *)w->scale + row * w->scale_cols * es;
    }
    duet_weight_t p = *w;
    p.rows = orank;
    p.data = (void *)tab[0];
    p.scale = (void *)tab[Gl];
    duet_status_t st = DUET_OK;
    if (duet_cuda_matmul_grouped_ok(&p, NULL) && (st = dev_copy(mc, tab, sizeof(void *) * (size_t)2 * Gl,
                                                                (void **)&d->wo_ptr, err)) == DUET_OK)
        d->wo_proto = p;
    free(tab);
    return st;
}

static duet_status_t upload_layer(duet_model_cuda_t *mc, int l, duet_err_t *err)
{
    const duet_model_config_t *c = &mc->m->cfg;
    const duet_layer_weights_t *h = &mc->m->layers[l];
    layer_dev_t *d = &mc->layers[l];
    int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc;
    DUET_TRY(dev_weight(mc, &h->wq_a, &d->wq_a, err));
    DUET_TRY(dev_weight(mc, &h->wq_b, &d->wq_b, err));
    DUET_TRY(dev_weight(mc, &h->wkv, &d->wkv, err));
    DUET_TRY(dev_weight(mc, &h->wo_a, &d->wo_a, err));
    DUET_TRY(upload_wo_table(mc, l, err));
    DUET_TRY(dev_weight(mc, &h->wo_b, &d->wo_b, err));
    DUET_TRY(dev_weight(mc, &h->gate, &d->gate, err));
    d->gate.chunk_units = mc->gate_chunks;
    DUET_TRY(dev_floats(mc, h->attn_norm, D, &d->attn_norm, err));
    DUET_TRY(dev_floats(mc, h->ffn_norm, D, &d->ffn_norm, err));
    DUET_TRY(dev_floats(mc, h->q_norm, c->q_lora_rank, &d->q_norm, err));
    DUET_TRY(dev_floats(mc, h->kv_norm, c->head_dim, &d->kv_norm, err));
    DUET_TRY(dev_floats(mc, h->hc_attn_fn, (size_t)mix * hc * D, &d->hc_attn_fn, err));
    DUET_TRY(dev_floats(mc, h->hc_attn_base, mix, &d->hc_attn_base, err));
    DUET_TRY(dev_floats(mc, h->hc_attn_scale, 3, &d->hc_attn_scale, err));
    DUET_TRY(dev_floats(mc, h->hc_ffn_fn, (size_t)mix * hc * D, &d->hc_ffn_fn, err));
    DUET_TRY(dev_floats(mc, h->hc_ffn_base, mix, &d->hc_ffn_base, err));
    DUET_TRY(dev_floats(mc, h->hc_ffn_scale, 3, &d->hc_ffn_scale, err));
    DUET_TRY(dev_floats(mc, h->attn_sink, c->num_attention_heads, &d->attn_sink, err));
    if (h->ratio) {
        const duet_compressor_t *cp = &h->comp;
        DUET_TRY(dev_weight(mc, &cp->wkv, &d->comp_wkv, err));
        DUET_TRY(dev_weight(mc, &cp->wgate, &d->comp_wgate, err));
        DUET_TRY(dev_floats(mc, cp->ape, (size_t)cp->ratio * cp->coff * cp->dim, &d->comp_ape, err));
        DUET_TRY(dev_floats(mc, cp->norm, cp->dim, &d->comp_norm, err));
    }
    if (h->ratio == 4) {
        const duet_compressor_t *cp = &h->icomp;
        DUET_TRY(dev_weight(mc, &cp->wkv, &d->icomp_wkv, err));
        DUET_TRY(dev_weight(mc, &cp->wgate, &d->icomp_wgate, err));
        DUET_TRY(dev_floats(mc, cp->ape, (size_t)cp->ratio * cp->coff * cp->dim, &d->icomp_ape, err));
        DUET_TRY(dev_floats(mc, cp->norm, cp->dim, &d->icomp_norm, err));
        DUET_TRY(dev_weight(mc, &h->idx_wq_b, &d->idx_wq_b, err));
        DUET_TRY(dev_weight(mc, &h->idx_weights_proj, &d->idx_wproj, err));
    }
    int E = c->n_routed_experts;
    d->experts = duet_calloc((size_t)E * 3, sizeof(duet_weight_t));
    if (!d->experts)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    for (int e = mc->e0; e < mc->e1; e++) { /* the experts this rank holds; the others stay empty */
        DUET_TRY(dev_weight(mc, &h->experts[e].w1, &d->experts[3 * e], err));
        DUET_TRY(dev_weight(mc, &h->experts[e].w2, &d->experts[3 * e + 1], err));
        DUET_TRY(dev_weight(mc, &h->experts[e].w3, &d->experts[3 * e + 2], err));
    }
    if (c->n_shared_experts > 0) {
        DUET_TRY(dev_weight(mc, &h->shared.w1, &d->sh[0], err));
        DUET_TRY(dev_weight(mc, &h->shared.w2, &d->sh[1], err));
        DUET_TRY(dev_weight(mc, &h->shared.w3, &d->sh[2], err));
    }
    return upload_moe_tables(mc, l, err);
}

duet_status_t duet_model_cuda_upload(duet_cuda_t *c, const duet_model_t *m, duet_model_cuda_t **out,
                                     duet_err_t *err)
{
    return duet_model_cuda_upload_tp(c, m, 0, 1, out, err);
}

duet_status_t duet_model_cuda_tp_check(const duet_model_config_t *cfg, int tp_size, duet_err_t *err)
{
    if (tp_size < 1 || tp_size > DUET_TP_MAX)
        return duet_err_set(err, DUET_ERR_INVALID, "tensor-parallel size %d: expected 1 to %d", tp_size, DUET_TP_MAX);
    if (cfg->num_attention_heads % tp_size || cfg->o_groups % tp_size)
        return duet_err_set(err, DUET_ERR_UNSUPPORTED,
                            "tensor parallelism over %d GPUs needs the attention heads (%d) and the output groups "
                            "(%d) to divide evenly",
                            tp_size, cfg->num_attention_heads, cfg->o_groups);
    if (cfg->n_routed_experts > 0 && cfg->n_routed_experts < tp_size)
        return duet_err_set(err, DUET_ERR_UNSUPPORTED, "tensor parallelism over %d GPUs: only %d routed experts",
                            tp_size, cfg->n_routed_experts);
    return DUET_OK;
}

duet_status_t duet_model_cuda_upload_tp(duet_cuda_t *c, const duet_model_t *m, int tp_rank, int tp_size,
                                        duet_model_cuda_t **out, duet_err_t *err)
{
    const duet_model_config_t *cfg = &m->cfg;
    *out = NULL;
    duet_status_t tst = duet_model_cuda_tp_check(cfg, tp_size, err);
    if (tst != DUET_OK)
        return tst;
    if (tp_rank < 0 || tp_rank >= tp_size)
        return duet_err_set(err, DUET_ERR_INVALID, "tensor-parallel rank %d of %d", tp_rank, tp_size);
    if (m->embed.dtype != DUET_DT_BF16 && m->embed.dtype != DUET_DT_F32)
        return duet_err_set(err, DUET_ERR_UNSUPPORTED, "GPU forward: embedding dtype %s",
                            duet_dtype_name(m->embed.dtype));
    if (cfg->head_dim % 4 || cfg->hidden_size % 4)
        return duet_err_set(err, DUET_ERR_UNSUPPORTED, "GPU forward: head_dim %d / hidden %d not multiples of 4",
                            cfg->head_dim, cfg->hidden_size);
    duet_model_cuda_t *mc = DUET_NEW(duet_model_cuda_t);
    if (!mc)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    mc->c = c;
    mc->m = m;
    mc->tp_rank = tp_rank;
    mc->tp_size = tp_size;
    mc->h0 = cfg->num_attention_heads / tp_size * tp_rank;
    mc->h1 = mc->h0 + cfg->num_attention_heads / tp_size;
    mc->g0 = cfg->o_groups / tp_size * tp_rank;
    mc->g1 = mc->g0 + cfg->o_groups / tp_size;
    mc->e0 = (int)((int64_t)cfg->n_routed_experts * tp_rank / tp_size);
    mc->e1 = (int)((int64_t)cfg->n_routed_experts * (tp_rank + 1) / tp_size);
    {
        const char *ev = getenv("DUET_MOE_HOST");
        mc->moe_host_route = ev && atoi(ev) != 0;
        ev = getenv("DUET_CUDA_TILE");
        mc->no_tile = ev && atoi(ev) == 0;
        ev = getenv("DUET_CUDA_ATTN_TC"); /* 0: attention on the fp32 units (for comparison) */
        duet_cuda_set_attn_tc(c, !(ev && atoi(ev) == 0));
        ev = getenv("DUET_CUDA_PDL"); /* 0: every kernel waits for the one ahead to end (for comparison) */
        mc->no_pdl = ev && *ev && atoi(ev) == 0;
        ev = getenv("DUET_CUDA_SIDE"); /* 0: every launch on one stream (for comparison) */
        mc->no_side = ev && *ev && atoi(ev) == 0;
        ev = getenv("DUET_CUDA_WO_BLOCKDIAG"); /* 0: wo_a as the grouped launch (for comparison) */
        mc->no_blockdiag = ev && *ev && atoi(ev) == 0;
        ev = getenv("DUET_CUDA_HC_POST_FUSE"); /* 0: hc_post as its own operation (for comparison) */
        mc->no_post_fuse = ev && *ev && atoi(ev) == 0;
        ev = getenv("DUET_CUDA_HC_SINKHORN_SIDE"); /* 0: comb's Sinkhorn in the pre-mix (for comparison) */
        mc->no_sk_side = ev && *ev && atoi(ev) == 0;
        ev = getenv("DUET_CUDA_GATE_CHUNKS"); /* the MoE gate's chunk units (0: the kernel's default) */
        mc->gate_chunks = GATE_CHUNK_UNITS;
        if (ev && *ev) {
            char *end;
            long v = strtol(ev, &end, 10);
            if (*end || v < 0 || v > 1024) {
                duet_model_cuda_destroy(&mc);
                return duet_err_set(err, DUET_ERR_INVALID,
                                    "DUET_CUDA_GATE_CHUNKS=%s: not a count of 128-column units (0 to 1024)", ev);
            }
            mc->gate_chunks = (int)v;
        }
        ev = getenv("DUET_CUDA_EXACT"); /* 1: the CPU engine's bits (duet_cuda_set_exact) */
        if (ev && atoi(ev) != 0)
            duet_cuda_set_exact(c, 1);
    }
    if (duet_cuda_get_exact(c)) {
        /* CPU-exact mode: weights in their checkpoint layouts, which its matmul reads (the forward
         * then routes on the host with forward.c's code and runs the experts one at a time) */
        mc->no_tile = 1;
        if (tp_size > 1) {
            duet_model_cuda_destroy(&mc);
            return duet_err_set(err, DUET_ERR_UNSUPPORTED, "CPU-exact mode runs on one GPU (tensor parallelism "
                                "splits the sums the CPU engine makes whole)");
        }
    }
    duet_cuda_set_invariant(c, 1);
    duet_status_t st = DUET_OK;
    int L = cfg->num_hidden_layers, D = cfg->hidden_size, hc = cfg->hc_mult;
    mc->layers = duet_calloc((size_t)L, sizeof(layer_dev_t));
    if (!mc->layers) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = dev_weight(mc, &m->embed, &mc->embed, err)) != DUET_OK ||
        (tp_rank == 0 && (st = dev_weight(mc, &m->head, &mc->head, err)) != DUET_OK) || /* logits: rank 0 */
        (st = dev_floats(mc, m->norm, D, &mc->norm, err)) != DUET_OK ||
        (st = dev_floats(mc, m->hc_head_fn, (size_t)hc * hc * D, &mc->hc_head_fn, err)) != DUET_OK ||
        (st = dev_floats(mc, m->hc_head_base, hc, &mc->hc_head_base, err)) != DUET_OK)
        goto fail;
    /* a bf16 output head in the tiled layout the tensor-core kernel loads its MMA operands from
     * whole (the same bits; the head is only ever multiplied from row 0) */
    if (!mc->no_tile && mc->head.data && duet_cuda_weight_tile_ok(&mc->head) &&
        (st = duet_cuda_weight_tile(c, &mc->head)) != DUET_OK) {
        st = cuda_fail(c, st, err);
        goto fail;
    }
    {
        int H = cfg->num_attention_heads;
        float *ninf = duet_malloc_array((size_t)H, sizeof(float));
        if (!ninf) {
            st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
            goto fail;
        }
        for (int h = 0; h < H; h++)
            ninf[h] = -INFINITY;
        st = dev_floats(mc, ninf, H, &mc->neg_inf, err);
        free(ninf);
        if (st != DUET_OK)
            goto fail;
    }
    if (tp_size > 1 && mc->moe_host_route) {
        st = duet_err_set(err, DUET_ERR_UNSUPPORTED, "tensor parallelism needs the grouped expert path: unset "
                          "DUET_MOE_HOST");
        goto fail;
    }
    for (int l = 0; l < L; l++) {
        if ((st = upload_layer(mc, l, err)) != DUET_OK)
            goto fail;
        if (tp_size > 1 && cfg->n_routed_experts > 0 && !mc->layers[l].grouped) {
            st = duet_err_set(err, DUET_ERR_UNSUPPORTED, "layer %d: tensor parallelism needs the grouped expert "
                              "path (every expert of one shape and dtype the grouped matmul takes)", l);
            goto fail;
        }
    }
    *out = mc;
    return DUET_OK;
fail:
    duet_model_cuda_destroy(&mc);
    return st;
}

void duet_model_cuda_destroy(duet_model_cuda_t **pmc)
{
    if (!pmc || !*pmc)
        return;
    duet_model_cuda_t *mc = *pmc;
    duet_cuda_sync(mc->c);
    for (size_t i = 0; i < mc->n_allocs; i++)
        duet_cuda_free(mc->c, mc->allocs[i]);
    if (mc->layers)
        for (int l = 0; l < mc->m->cfg.num_hidden_layers; l++)
            free(mc->layers[l].experts);
    free(mc->layers);
    free(mc->allocs);
    duet_cuda_free(mc->c, mc->ws);
    duet_cuda_free(mc->c, mc->plan_dev);
    duet_cuda_host_free(mc->c, mc->plan_host);
    duet_cuda_free(mc->c, mc->moe_dev);
    duet_cuda_host_free(mc->c, mc->moe_host);
    free(mc);
    *pmc = NULL;
}

size_t duet_model_cuda_weight_bytes(const duet_model_cuda_t *mc) { return mc->weight_bytes; }

void duet_model_cuda_set_comm(duet_model_cuda_t *mc, duet_cuda_comm_t *comm) { mc->comm = comm; }

duet_cuda_t *duet_model_cuda_context(const duet_model_cuda_t *mc) { return mc->c; }

/* ---- device cache ------------------------------------------------------ */

struct duet_kv_cache_cuda {
    duet_cuda_t *c;
    duet_kv_cache_t *host;
    uint8_t *mem[DUET_POOL_COUNT];
    size_t bytes[DUET_POOL_COUNT];
    uint8_t *hmap[DUET_POOL_COUNT]; /* the host pools as the device sees them (duet_kv_cache_cuda_map_host) */
    int mapped;
    int borrowed; /* hmap is another cache's registration (duet_kv_cache_cuda_map_host_shared) */
};

duet_status_t duet_kv_cache_cuda_create(duet_cuda_t *c, duet_kv_cache_t *host, duet_kv_cache_cuda_t **out,
                                        duet_err_t *err)
{
    *out = NULL;
    duet_kv_cache_cuda_t *dc = DUET_NEW(duet_kv_cache_cuda_t);
    if (!dc)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    dc->c = c;
    dc->host = host;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        size_t b = duet_kv_cache_pool_bytes(host, (duet_pool_kind_t)k);
        if (!b || !duet_kv_cache_pool_base(host, (duet_pool_kind_t)k))
            continue;
        if (duet_cuda_malloc(c, (void **)&dc->mem[k], b) != DUET_OK ||
            duet_cuda_memset(c, dc->mem[k], 0, b) != DUET_OK) {
            duet_status_t st = cuda_fail(c, DUET_ERR_CUDA, err);
            duet_kv_cache_cuda_destroy(&dc);
            return st;
        }
        dc->bytes[k] = b;
    }
    if (duet_cuda_sync(c) != DUET_OK) {
        duet_status_t st = cuda_fail(c, DUET_ERR_CUDA, err);
        duet_kv_cache_cuda_destroy(&dc);
        return st;
    }
    *out = dc;
    return DUET_OK;
}

void duet_kv_cache_cuda_destroy(duet_kv_cache_cuda_t **pdc)
{
    if (!pdc || !*pdc)
        return;
    duet_kv_cache_cuda_t *dc = *pdc;
    duet_cuda_sync(dc->c);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        duet_cuda_free(dc->c, dc->mem[k]);
        if (dc->hmap[k] && !dc->borrowed)
            duet_cuda_host_unregister(dc->c, duet_kv_cache_pool_base(dc->host, (duet_pool_kind_t)k));
    }
    free(dc);
    *pdc = NULL;
}

duet_kv_cache_t *duet_kv_cache_cuda_host(const duet_kv_cache_cuda_t *dc) { return dc->host; }

uint8_t *duet_kv_cache_cuda_pool_base(const duet_kv_cache_cuda_t *dc, duet_pool_kind_t kind) { return dc->mem[kind]; }

/* A layer's device view: the host view's addresses moved into the device pools. */
static duet_status_t dev_layer(duet_kv_cache_cuda_t *dc, int layer, duet_cache_layer_t *v)
{
    DUET_TRY(duet_kv_cache_layer(dc->host, layer, v));
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        if (!v->base[k])
            continue;
        uint8_t *hb = duet_kv_cache_pool_base(dc->host, (duet_pool_kind_t)k);
        v->base[k] = dc->mem[k] ? dc->mem[k] + (v->base[k] - hb) : NULL;
    }
    return DUET_OK;
}

duet_status_t duet_kv_cache_cuda_copy_seq(duet_kv_cache_cuda_t *dc, const duet_seq_t *src, duet_seq_t *dst,
                                          duet_err_t *err)
{
    if (!src->has_slot || !dst->has_slot || dst->n_pages < src->n_pages)
        return duet_err_set(err, DUET_ERR_INVALID, "copy_seq: destination without a slot or enough pages");
    uint32_t np = duet_kv_cache_n_pages(dc->host), ns = duet_kv_cache_n_slots(dc->host);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(dc->host, (duet_pool_kind_t)k);
        if (!dc->mem[k] || !l->n_layers)
            continue;
        uint32_t per = l->paged ? src->n_pages : 1, units = l->paged ? np : ns;
        size_t n = (size_t)per * l->n_layers;
        uint32_t *si = malloc(sizeof(uint32_t) * n), *di = malloc(sizeof(uint32_t) * n);
        if (!si || !di) {
            free(si);
            free(di);
            return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        }
        for (uint32_t ly = 0; ly < l->n_layers; ly++)
            for (uint32_t j = 0; j < per; j++) {
                si[(size_t)ly * per + j] = ly * units + (l->paged ? src->pages[j] : src->slot);
                di[(size_t)ly * per + j] = ly * units + (l->paged ? dst->pages[j] : dst->slot);
            }
        duet_status_t st = duet_cuda_pages_copy(dc->c, dc->mem[k], di, dc->mem[k], si, (uint32_t)n, l->page_bytes);
        free(si);
        free(di);
        if (st != DUET_OK)
            return cuda_fail(dc->c, st, err);
    }
    if (duet_cuda_sync(dc->c) != DUET_OK)
        return cuda_fail(dc->c, DUET_ERR_CUDA, err);
    dst->n_past = src->n_past;
    return DUET_OK;
}

duet_status_t duet_kv_cache_cuda_map_host(duet_kv_cache_cuda_t *dc, duet_err_t *err)
{
    if (dc->mapped)
        return DUET_OK;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        uint8_t *hb = duet_kv_cache_pool_base(dc->host, (duet_pool_kind_t)k);
        size_t b = duet_kv_cache_pool_bytes(dc->host, (duet_pool_kind_t)k);
        if (!hb || !b || !dc->mem[k])
            continue;
        void *dev = NULL;
        if (duet_cuda_host_register(dc->c, hb, b, &dev) != DUET_OK) {
            duet_status_t st = cuda_fail(dc->c, DUET_ERR_CUDA, err);
            for (int j = 0; j < k; j++)
                if (dc->hmap[j]) {
                    duet_cuda_host_unregister(dc->c, duet_kv_cache_pool_base(dc->host, (duet_pool_kind_t)j));
                    dc->hmap[j] = NULL;
                }
            return st;
        }
        dc->hmap[k] = dev;
    }
    dc->mapped = 1;
    return DUET_OK;
}

duet_status_t duet_kv_cache_cuda_map_host_shared(duet_kv_cache_cuda_t *dc, const duet_kv_cache_cuda_t *owner,
                                                duet_err_t *err)
{
    if (dc->mapped)
        return DUET_OK;
    if (!owner->mapped || owner->host != dc->host)
        return duet_err_set(err, DUET_ERR_INVALID, "staging: the owner's host pools are not mapped");
    memcpy(dc->hmap, owner->hmap, sizeof dc->hmap); /* portable registration, one address space (UVA) */
    dc->borrowed = 1;
    dc->mapped = 1;
    return DUET_OK;
}

/* One pool's unit ids of the sequences over `n_layers` layers of `units` units each
 * (layer-major), appended to *list (of *len ids, grown here); *cnt: how many. */
static duet_status_t stage_ids(const duet_cache_layout_t *l, uint32_t units, uint32_t n_layers,
                               const duet_seq_t *const *seqs, const uint32_t *n_pages, uint32_t n, uint32_t **list,
                               uint32_t *len, uint32_t *cnt, duet_err_t *err)
{
    size_t per = 0;
    for (uint32_t i = 0; i < n; i++)
        per += l->paged ? (n_pages ? n_pages[i] : seqs[i]->n_pages) : 1;
    *cnt = 0;
    if (!per)
        return DUET_OK;
    if (per * n_layers > UINT32_MAX / 2 - *len)
        return duet_err_set(err, DUET_ERR_RANGE, "staging: %zu units in one copy", per * n_layers + *len);
    uint32_t *grown = realloc(*list, sizeof(uint32_t) * (*len + per * n_layers));
    if (!grown)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    *list = grown;
    uint32_t *ids = grown + *len;
    size_t j = 0;
    for (uint32_t ly = 0; ly < n_layers; ly++)
        for (uint32_t i = 0; i < n; i++) {
            const duet_seq_t *s = seqs[i];
            if (!l->paged) {
                if (s->slot >= units)
                    return duet_err_set(err, DUET_ERR_RANGE, "staging: slot %u of %u", s->slot, units);
                ids[j++] = ly * units + s->slot;
                continue;
            }
            uint32_t np = n_pages ? n_pages[i] : s->n_pages;
            for (uint32_t p = 0; p < np; p++) {
                if (s->pages[p] >= units)
                    return duet_err_set(err, DUET_ERR_RANGE, "staging: page %u of %u", s->pages[p], units);
                ids[j++] = ly * units + s->pages[p];
            }
        }
    *cnt = (uint32_t)j;
    *len += (uint32_t)j;
    return DUET_OK;
}

static duet_status_t stage_copy(duet_kv_cache_cuda_t *dc, duet_stage_dir_t dir, int layer,
                                const duet_seq_t *const *seqs, const uint32_t *n_pages, uint32_t n, int wait,
                                uint64_t *bytes, duet_err_t *err)
{
    if (bytes)
        *bytes = 0;
    if (!dc->mapped)
        return duet_err_set(err, DUET_ERR_INVALID, "staging: the host pools are not mapped");
    for (uint32_t i = 0; i < n; i++) {
        if (!seqs[i] || !seqs[i]->has_slot)
            return duet_err_set(err, DUET_ERR_INVALID, "staging: sequence %u has no slot", i);
        if (n_pages && n_pages[i] > seqs[i]->n_pages)
            return duet_err_set(err, DUET_ERR_INVALID, "staging: %u pages asked of a sequence holding %u",
                                n_pages[i], seqs[i]->n_pages);
    }
    if (!n)
        return DUET_OK;
    duet_cache_layer_t v;
    if (layer >= 0 && duet_kv_cache_layer(dc->host, layer, &v) != DUET_OK)
        return duet_err_set(err, DUET_ERR_RANGE, "staging: no layer %d", layer);
    uint32_t np = duet_kv_cache_n_pages(dc->host), ns = duet_kv_cache_n_slots(dc->host);
    /* every pool's unit ids in one list, one copy to the device, then a launch a pool back to back
     * (duet_cuda_pages_copy_parts) */
    duet_cuda_page_part_t part[DUET_POOL_COUNT];
    int n_part = 0;
    uint32_t *all = NULL, total = 0;
    uint64_t moved = 0;
    duet_status_t st = DUET_OK;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(dc->host, (duet_pool_kind_t)k);
        uint8_t *hb = duet_kv_cache_pool_base(dc->host, (duet_pool_kind_t)k);
        if (!dc->mem[k] || !dc->hmap[k] || !hb || !l->n_layers)
            continue;
        size_t off = 0;
        uint32_t n_layers = l->n_layers, units = l->paged ? np : ns;
        if (layer >= 0) {
            if (!v.base[k])
                continue; /* this layer has no such pool */
            off = (size_t)(v.base[k] - hb);
            n_layers = 1;
            units = v.n_units[k];
        }
        uint32_t at = total, cnt = 0;
        if ((st = stage_ids(l, units, n_layers, seqs, n_pages, n, &all, &total, &cnt, err)) != DUET_OK)
            goto out;
        if (!cnt)
            continue;
        uint8_t *dev = dc->mem[k] + off, *host = dc->hmap[k] + off;
        int up = dir == DUET_STAGE_TO_DEVICE;
        part[n_part++] = (duet_cuda_page_part_t){up ? dev : host, up ? host : dev, at, cnt, l->page_bytes};
        moved += (uint64_t)cnt * l->page_bytes;
    }
    duet_status_t cs = duet_cuda_pages_copy_parts(dc->c, part, n_part, all, total);
    if (cs != DUET_OK) {
        st = cuda_fail(dc->c, cs, err);
        goto out;
    }
    if (wait && duet_cuda_sync(dc->c) != DUET_OK) {
        st = cuda_fail(dc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    if (bytes)
        *bytes = moved;
out:
    free(all);
    return st;
}

duet_status_t duet_kv_cache_cuda_stage(duet_kv_cache_cuda_t *dc, duet_stage_dir_t dir, int layer,
                                       const duet_seq_t *const *seqs, const uint32_t *n_pages, uint32_t n,
                                       uint64_t *bytes, duet_err_t *err)
{
    return stage_copy(dc, dir, layer, seqs, n_pages, n, 1, bytes, err);
}

duet_status_t duet_kv_cache_cuda_stage_queue(duet_kv_cache_cuda_t *dc, duet_stage_dir_t dir, int layer,
                                             const duet_seq_t *const *seqs, const uint32_t *n_pages, uint32_t n,
                                             uint64_t *bytes, duet_err_t *err)
{
    return stage_copy(dc, dir, layer, seqs, n_pages, n, 0, bytes, err);
}

/* ---- the per-call plan ---------------------------------------------------
 * Index lists built on the host in one buffer (offsets), copied to the device
 * once; every layer of a kind uses the same lists.  The offsets are laid out
 * first (hb_alloc: no memory yet), then the lists are written straight into the
 * model's pinned staging buffer, which the one copy reads. */

typedef struct {
    uint8_t *p; /* the pinned staging buffer, once the layout is known */
    size_t n;
} hbuf_t;

static size_t hb_alloc(hbuf_t *b, size_t bytes)
{
    size_t off = (b->n + 255) & ~(size_t)255;
    b->n = off + bytes;
    return off;
}

typedef struct {
    int ra, rb;                 /* rows [ra, rb) */
    size_t gw_off, gw_cnt;      /* window-key gather entries (layout 4: room for the C4 selection) */
    size_t g128_off, g128_cnt;  /* window + C128 gather entries */
    int maxk0, maxk4, maxk128;  /* the most keys of one row */
} group_t;

typedef struct {
    duet_model_cuda_t *mc;
    duet_kv_cache_cuda_t *dc;
    const duet_model_t *m;
    const duet_model_config_t *c;
    duet_cuda_t *cu;
    duet_cuda_t *side; /* the side stream (duet_cuda_side): the queries, the shared expert (NULL: one stream) */
    duet_fwd_item_t *items;
    int n_items, R;
    int has4, has128;
    int *row0;
    int32_t *tok_h; /* (R) host token ids */
    /* counts */
    size_t NL, NPT, N128e, NIK, NSC, NW4, NW128, NSW4, NSW128, NS, NLR;
    int max_nv;
    group_t *groups;
    int n_groups;
    size_t max_group_keys;
    /* plan offsets (bytes into the plan buffer) */
    size_t o_tok, o_pos, o_pt, o_ld_unit, o_ld_idx, o_rt_unit, o_rt_idx, o_st_row, o_st_unit, o_st_idx;
    size_t o_c128_unit, o_c128_idx, o_ik_unit, o_ik_idx, o_ikoff, o_nv, o_score_off;
    size_t o_w4kv_unit, o_w4kv_idx, o_w4ik_unit, o_w4ik_idx, o_w4pos, o_desc4, o_sw4;
    size_t o_w128_unit, o_w128_idx, o_w128pos, o_desc128, o_sw128;
    size_t o_gw_dst, o_gw_src, o_g128_dst, o_g128_src;
    size_t o_koff4, o_nk0, o_nk4, o_nsel, o_dst4, o_page_off, o_koff128, o_nk128, o_hrow;
    /* wo_a grouped (wo_group): offs (Gl+1), tiles (DUET_CUDA_MOE_TILE_ROWS, Gl+1), x rows (Gl*R), mid's rows (R*Gl) */
    int wo_group;
    int hc_fused; /* hyper-connection pre-mixes fused with their norms (hc_fused) */
    /* comb's Sinkhorn off the main stream (hc_pre_norm): sk_pending, comb holds the last pre-mix's
     * logits, the iterations not queued yet; sk_side, queued on the side stream and not joined yet */
    int sk_pending, sk_side;
    int exact;    /* the context's CPU-exact mode: the unfused forms, a launch a weight, the per-expert MoE */
    size_t o_wo_offs, o_wo_tiles, o_wo_xrow, o_wo_yrow;
    /* the index-K list is written on the device (duet_cuda_kv_entries) from the page table and a
     * run an item (o_ik_runs: page offset, list offset, count), past the plan's copied part */
    size_t o_ik_runs, plan_copy;
    int ik_max;
    uint32_t eppi;
    uint8_t *pd; /* device plan */
    /* device workspace */
    float *h, *x, *xn, *f, *post, *comb, *qlora, *q, *kv, *att, *ckv, *cg, *ikv, *ig, *iq, *iw;
    uint8_t *rt_tmp;
    float *src, *score, *kvg, *gg, *ent, *keys, *gx, *gy, *mid, *tmpv, *wy;
    uint16_t *keys16; /* the same buffer as bf16 keys, where attn_rows reads them (NULL otherwise) */
    int32_t *sel;
    float *logit, *xg, *eg, *eu, *yg, *hx, *logits;
    float *sg, *su;                                     /* the shared expert's w1 and w3 outputs (R, I) */
    int32_t *m_sel, *m_offs, *m_tiles, *m_xrow, *m_pos; /* device routing: (R,K), (L,E+1), (3,E+1), (R*K) x2 */
    float *m_wt;                                         /* (R,K) */
    float *tp_send, *tp_recv; /* tensor parallelism: this rank's part, every rank's parts */
    int no_advance;
    duet_fwd_cuda_stats_t st;
} fc_t;

#define PD(F, T, off) ((T *)((F)->pd + (off)))
#define WO_GROUP_MAX_ROWS 256
/* calls of at most this many rows (decode steps) run their kernels as dependent launches */
#define PDL_MAX_ROWS 256

static duet_status_t build_plan(fc_t *F, hbuf_t *b, duet_err_t *err)
{
    const duet_model_config_t *c = F->c;
    duet_kv_cache_t *hc = F->dc->host;
    int R = F->R, W = c->sliding_window, topk = c->index_topk;
    int64_t span = duet_forward_fault == DUET_FAULT_MASK ? W : W - 1;
    uint32_t epp4 = 1, eppi = 1, epp128 = 1;
    if (F->has4) {
        epp4 = duet_kv_cache_layout(hc, DUET_POOL_C4_KV)->entries_per_page;
        eppi = duet_kv_cache_layout(hc, DUET_POOL_C4_INDEX_K)->entries_per_page;
    }
    F->eppi = eppi;
    if (F->has128)
        epp128 = duet_kv_cache_layout(hc, DUET_POOL_C128_KV)->entries_per_page;

    /* counts */
    for (int it = 0; it < F->n_items; it++) {
        duet_fwd_item_t *item = &F->items[it];
        const duet_seq_t *s = item->seq;
        int64_t P = s->n_past, n = item->n_tokens, total = P + n;
        int64_t base = P - (P < W - 1 ? P : W - 1);
        F->NL += (size_t)(P - base);
        F->NPT += s->n_pages;
        if (F->has128) {
            F->N128e += (size_t)(total / 128);
            F->NW128 += (size_t)(total / 128 - P / 128);
            F->NSW128 += (size_t)(n < 128 ? n : 128);
        }
        if (F->has4) {
            F->NIK += (size_t)(total / 4);
            F->NW4 += (size_t)(total / 4 - P / 4);
            F->NSW4 += (size_t)(n < 8 ? n : 8);
            for (int64_t p = P; p < total; p++) {
                F->NSC += (size_t)((p + 1) / 4);
                if ((p + 1) / 4 > F->max_nv)
                    F->max_nv = (int)((p + 1) / 4);
            }
        }
        F->NS += (size_t)(n < W ? n : W);
        F->NLR += item->logits_mode == DUET_LOGITS_ALL ? (size_t)n : item->logits_mode == DUET_LOGITS_LAST ? 1 : 0;
    }
    /* row groups for attention: bounded keys and rows */
    int hd = c->head_dim, H = c->num_attention_heads;
    size_t key_cap = ((size_t)64 << 20) / (size_t)hd;          /* 256 MiB of fp32 keys */
    size_t row_cap = ((size_t)256 << 20) / ((size_t)8 * H * hd * 4); /* attn_rows' partials */
    if (row_cap < 1)
        row_cap = 1;
    if (row_cap > 65535)
        row_cap = 65535;
    F->groups = malloc(sizeof(group_t) * (size_t)(R > 0 ? R : 1));
    if (!F->groups)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    int *r_item = malloc(sizeof(int) * (size_t)R);
    int *r_nwin = malloc(sizeof(int) * (size_t)R), *r_nsel = malloc(sizeof(int) * (size_t)R);
    int *r_n128 = malloc(sizeof(int) * (size_t)R);
    if (!r_item || !r_nwin || !r_nsel || !r_n128) {
        free(r_item); free(r_nwin); free(r_nsel); free(r_n128);
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    size_t GW = 0, G128 = 0;
    for (int it = 0; it < F->n_items; it++) {
        const duet_seq_t *s = F->items[it].seq;
        int64_t P = s->n_past, base = P - (P < W - 1 ? P : W - 1);
        for (int i = 0; i < F->items[it].n_tokens; i++) {
            int r = F->row0[it] + i;
            int64_t p = P + i, lo = p - span > base ? p - span : base;
            r_item[r] = it;
            r_nwin[r] = (int)(p - lo + 1);
            int nv4 = (int)((p + 1) / 4);
            r_nsel[r] = F->has4 ? (nv4 < topk ? nv4 : topk) : 0;
            r_n128[r] = F->has128 ? (int)((p + 1) / 128) : 0;
            GW += (size_t)r_nwin[r];
            G128 += (size_t)(r_nwin[r] + r_n128[r]);
        }
    }
    {
        int g = 0, r = 0;
        size_t gw = 0, g128 = 0;
        while (r < R) {
            group_t *G = &F->groups[g++];
            memset(G, 0, sizeof *G);
            G->ra = r;
            G->gw_off = gw;
            G->g128_off = g128;
            size_t k4 = 0, k128 = 0;
            while (r < R && (size_t)(r - G->ra) < row_cap) {
                size_t a = (size_t)(r_nwin[r] + r_nsel[r]), bb = (size_t)(r_nwin[r] + r_n128[r]);
                if (r > G->ra && (k4 + a > key_cap || k128 + bb > key_cap))
                    break;
                k4 += a;
                k128 += bb;
                gw += (size_t)r_nwin[r];
                g128 += bb;
                if (r_nwin[r] > G->maxk0)
                    G->maxk0 = r_nwin[r];
                if ((int)a > G->maxk4)
                    G->maxk4 = (int)a;
                if ((int)bb > G->maxk128)
                    G->maxk128 = (int)bb;
                r++;
            }
            G->rb = r;
            G->gw_cnt = gw - G->gw_off;
            G->g128_cnt = g128 - G->g128_off;
            size_t need = k4 > k128 ? k4 : k128;
            if (need > F->max_group_keys)
                F->max_group_keys = need;
        }
        F->n_groups = g;
    }

    /* allocate */
    size_t R_ = (size_t)R;
    F->o_tok = hb_alloc(b, 4 * R_);
    F->o_pos = hb_alloc(b, 8 * R_);
    F->o_pt = hb_alloc(b, 4 * F->NPT);
    F->o_ld_unit = hb_alloc(b, 4 * F->NL);
    F->o_ld_idx = hb_alloc(b, 4 * F->NL);
    F->o_rt_unit = hb_alloc(b, 4 * R_);
    F->o_rt_idx = hb_alloc(b, 4 * R_);
    F->o_st_row = hb_alloc(b, 4 * F->NS);
    F->o_st_unit = hb_alloc(b, 4 * F->NS);
    F->o_st_idx = hb_alloc(b, 4 * F->NS);
    F->o_c128_unit = hb_alloc(b, 4 * F->N128e);
    F->o_c128_idx = hb_alloc(b, 4 * F->N128e);
    F->o_ik_runs = hb_alloc(b, 4 * 3 * (size_t)F->n_items);
    F->o_ikoff = hb_alloc(b, 4 * R_);
    F->o_nv = hb_alloc(b, 4 * R_);
    F->o_score_off = hb_alloc(b, 4 * R_);
    F->o_w4kv_unit = hb_alloc(b, 4 * F->NW4);
    F->o_w4kv_idx = hb_alloc(b, 4 * F->NW4);
    F->o_w4ik_unit = hb_alloc(b, 4 * F->NW4);
    F->o_w4ik_idx = hb_alloc(b, 4 * F->NW4);
    F->o_w4pos = hb_alloc(b, 8 * F->NW4);
    F->o_desc4 = hb_alloc(b, sizeof(duet_comp_slot_t) * 8 * F->NW4);
    F->o_sw4 = hb_alloc(b, sizeof(duet_comp_slot_t) * F->NSW4);
    F->o_w128_unit = hb_alloc(b, 4 * F->NW128);
    F->o_w128_idx = hb_alloc(b, 4 * F->NW128);
    F->o_w128pos = hb_alloc(b, 8 * F->NW128);
    F->o_desc128 = hb_alloc(b, sizeof(duet_comp_slot_t) * 128 * F->NW128);
    F->o_sw128 = hb_alloc(b, sizeof(duet_comp_slot_t) * F->NSW128);
    F->o_gw_dst = hb_alloc(b, 4 * GW);
    F->o_gw_src = hb_alloc(b, 4 * GW);
    F->o_g128_dst = hb_alloc(b, 4 * G128);
    F->o_g128_src = hb_alloc(b, 4 * G128);
    F->o_koff4 = hb_alloc(b, 4 * R_);
    F->o_nk0 = hb_alloc(b, 4 * R_);
    F->o_nk4 = hb_alloc(b, 4 * R_);
    F->o_nsel = hb_alloc(b, 4 * R_);
    F->o_dst4 = hb_alloc(b, 4 * R_);
    F->o_page_off = hb_alloc(b, 4 * R_);
    F->o_koff128 = hb_alloc(b, 4 * R_);
    F->o_nk128 = hb_alloc(b, 4 * R_);
    F->o_hrow = hb_alloc(b, 4 * (F->NLR ? F->NLR : 1));
    int Gl = F->mc->g1 - F->mc->g0;
    if (F->wo_group) {
        F->o_wo_offs = hb_alloc(b, 4 * ((size_t)Gl + 1));
        F->o_wo_tiles = hb_alloc(b, 4 * DUET_CUDA_MOE_TILE_ROWS * ((size_t)Gl + 1));
        F->o_wo_xrow = hb_alloc(b, 4 * (size_t)Gl * R);
        F->o_wo_yrow = hb_alloc(b, 4 * (size_t)Gl * R);
    }
    F->plan_copy = b->n; /* the host writes up to here; the index-K list past it is the device's */
    F->o_ik_unit = hb_alloc(b, 4 * F->NIK);
    F->o_ik_idx = hb_alloc(b, 4 * F->NIK);
    /* the pinned staging and its device copy, grown for this layout (a call ends with its stream
     * drained, so the previous call's copy out of the staging has finished) */
    duet_model_cuda_t *mc = F->mc;
    if (b->n > mc->plan_bytes) {
        duet_cuda_host_free(mc->c, mc->plan_host);
        duet_cuda_free(mc->c, mc->plan_dev);
        mc->plan_host = mc->plan_dev = NULL;
        mc->plan_bytes = 0;
        size_t want = b->n + b->n / 2 + (1 << 20);
        if (duet_cuda_host_alloc(mc->c, (void **)&mc->plan_host, want) != DUET_OK ||
            duet_cuda_malloc(mc->c, (void **)&mc->plan_dev, want) != DUET_OK) {
            free(r_item); free(r_nwin); free(r_nsel); free(r_n128);
            return cuda_fail(mc->c, DUET_ERR_CUDA, err);
        }
        mc->plan_bytes = want;
    }
    b->p = mc->plan_host;

    /* fill */
#define HB(T, off) ((T *)(b->p + (off)))
    int32_t *tok = HB(int32_t, F->o_tok);
    int64_t *pos = HB(int64_t, F->o_pos);
    uint32_t *pt = HB(uint32_t, F->o_pt);
    uint32_t *ld_unit = HB(uint32_t, F->o_ld_unit), *ld_idx = HB(uint32_t, F->o_ld_idx);
    uint32_t *rt_unit = HB(uint32_t, F->o_rt_unit), *rt_idx = HB(uint32_t, F->o_rt_idx);
    int32_t *st_row = HB(int32_t, F->o_st_row);
    uint32_t *st_unit = HB(uint32_t, F->o_st_unit), *st_idx = HB(uint32_t, F->o_st_idx);
    uint32_t *c128_unit = HB(uint32_t, F->o_c128_unit), *c128_idx = HB(uint32_t, F->o_c128_idx);
    int32_t *ik_runs = HB(int32_t, F->o_ik_runs);
    int32_t *ikoff = HB(int32_t, F->o_ikoff), *nvr = HB(int32_t, F->o_nv), *score_off = HB(int32_t, F->o_score_off);
    uint32_t *w4kv_unit = HB(uint32_t, F->o_w4kv_unit), *w4kv_idx = HB(uint32_t, F->o_w4kv_idx);
    uint32_t *w4ik_unit = HB(uint32_t, F->o_w4ik_unit), *w4ik_idx = HB(uint32_t, F->o_w4ik_idx);
    int64_t *w4pos = HB(int64_t, F->o_w4pos);
    duet_comp_slot_t *desc4 = HB(duet_comp_slot_t, F->o_desc4), *sw4 = HB(duet_comp_slot_t, F->o_sw4);
    uint32_t *w128_unit = HB(uint32_t, F->o_w128_unit), *w128_idx = HB(uint32_t, F->o_w128_idx);
    int64_t *w128pos = HB(int64_t, F->o_w128pos);
    duet_comp_slot_t *desc128 = HB(duet_comp_slot_t, F->o_desc128), *sw128 = HB(duet_comp_slot_t, F->o_sw128);
    int32_t *gw_dst = HB(int32_t, F->o_gw_dst), *gw_src = HB(int32_t, F->o_gw_src);
    int32_t *g128_dst = HB(int32_t, F->o_g128_dst), *g128_src = HB(int32_t, F->o_g128_src);
    int32_t *koff4 = HB(int32_t, F->o_koff4), *nk0 = HB(int32_t, F->o_nk0), *nk4 = HB(int32_t, F->o_nk4);
    int32_t *nsel = HB(int32_t, F->o_nsel), *dst4 = HB(int32_t, F->o_dst4), *page_off = HB(int32_t, F->o_page_off);
    int32_t *koff128 = HB(int32_t, F->o_koff128), *nk128 = HB(int32_t, F->o_nk128);
    int32_t *hrow = HB(int32_t, F->o_hrow);
    if (F->wo_group) { /* group g's rows g*R .. : att's row r*Gl + g; mid's row r*Gl + g from g*R + r */
        int32_t *wo_offs = HB(int32_t, F->o_wo_offs), *wo_tiles = HB(int32_t, F->o_wo_tiles);
        int32_t *wo_xrow = HB(int32_t, F->o_wo_xrow), *wo_yrow = HB(int32_t, F->o_wo_yrow);
        int wide = duet_cuda_moe_wide_tile(), wg = duet_cuda_moe_wg_tile();
        for (int g = 0; g <= Gl; g++) {
            wo_offs[g] = g * R;
            wo_tiles[g] = g * ((R + 7) / 8);
            wo_tiles[Gl + 1 + g] = g * ((R + wide - 1) / wide);
            wo_tiles[2 * (Gl + 1) + g] = g * ((R + wg - 1) / wg);
        }
        for (int g = 0; g < Gl; g++)
            for (int r = 0; r < R; r++) {
                wo_xrow[(size_t)g * R + r] = r * Gl + g;
                wo_yrow[(size_t)r * Gl + g] = g * R + r;
            }
    }
#undef HB
    size_t nl = 0, npt = 0, n128 = 0, nik = 0, nsc = 0, nw4 = 0, nw128 = 0, nsw4 = 0, nsw128 = 0, ns = 0, nlr = 0;
    size_t *ld_off = malloc(sizeof(size_t) * (size_t)F->n_items), *c128_off = malloc(sizeof(size_t) * (size_t)F->n_items);
    size_t *pt_off = malloc(sizeof(size_t) * (size_t)F->n_items), *ik_off = malloc(sizeof(size_t) * (size_t)F->n_items);
    if (!ld_off || !c128_off || !pt_off || !ik_off) {
        free(ld_off); free(c128_off); free(pt_off); free(ik_off);
        free(r_item); free(r_nwin); free(r_nsel); free(r_n128);
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    for (int it = 0; it < F->n_items; it++) {
        duet_fwd_item_t *item = &F->items[it];
        const duet_seq_t *s = item->seq;
        int r0 = F->row0[it], n = item->n_tokens;
        int64_t P = s->n_past, total = P + n, base = P - (P < W - 1 ? P : W - 1);
        for (int i = 0; i < n; i++) {
            tok[r0 + i] = item->tokens[i];
            pos[r0 + i] = P + i;
        }
        pt_off[it] = npt;
        memcpy(pt + npt, s->pages, sizeof(uint32_t) * s->n_pages);
        npt += s->n_pages;
        ld_off[it] = nl;
        for (int64_t t = base, ring = base % W; t < P; t++, nl++) { /* ring = t % W */
            ld_unit[nl] = s->slot;
            ld_idx[nl] = (uint32_t)ring;
            if (++ring == W)
                ring = 0;
        }
        for (int i = (n > W ? n - W : 0); i < n; i++, ns++) {
            st_row[ns] = r0 + i;
            st_unit[ns] = s->slot;
            st_idx[ns] = (uint32_t)((P + i) % W);
        }
        c128_off[it] = n128;
        if (F->has128) {
            duet_kv_cache_entries(s->pages, 0, (size_t)(total / 128), epp128, c128_unit + n128, c128_idx + n128);
            n128 += (size_t)(total / 128);
            for (int64_t p = P; p < total; p++) {
                if ((p + 1) % 128)
                    continue;
                int64_t w = p / 128;
                duet_kv_cache_entries(s->pages, w, 1, epp128, w128_unit + nw128, w128_idx + nw128);
                w128pos[nw128] = w * 128;
                for (int j = 0; j < 128; j++) {
                    int64_t q = w * 128 + j;
                    duet_comp_slot_t *d = &desc128[nw128 * 128 + (size_t)j];
                    d->row = q >= P ? (int32_t)(r0 + (q - P)) : -1;
                    d->slot = (int32_t)s->slot;
                    d->pos = (int32_t)q;
                    d->half = 0;
                }
                nw128++;
            }
            for (int i = (n > 128 ? n - 128 : 0); i < n; i++, nsw128++)
                sw128[nsw128] = (duet_comp_slot_t){r0 + i, (int32_t)s->slot, (int32_t)(P + i), 0};
        }
        ik_off[it] = nik;
        ik_runs[3 * it] = (int32_t)pt_off[it];
        ik_runs[3 * it + 1] = (int32_t)nik;
        ik_runs[3 * it + 2] = F->has4 ? (int32_t)(total / 4) : 0;
        if (F->has4 && total / 4 > F->ik_max)
            F->ik_max = (int)(total / 4);
        if (F->has4) {
            nik += (size_t)(total / 4);
            for (int64_t p = P; p < total; p++) {
                if ((p + 1) % 4)
                    continue;
                int64_t w = p / 4;
                duet_kv_cache_entries(s->pages, w, 1, epp4, w4kv_unit + nw4, w4kv_idx + nw4);
                duet_kv_cache_entries(s->pages, w, 1, eppi, w4ik_unit + nw4, w4ik_idx + nw4);
                w4pos[nw4] = w * 4;
                for (int j = 0; j < 8; j++) {
                    duet_comp_slot_t *d = &desc4[nw4 * 8 + (size_t)j];
                    /* slots 0..3: Ca of window w-1 (first half); 4..7: Cb of window w (second half) */
                    int64_t q = j < 4 ? (w - 1) * 4 + j : w * 4 + (j - 4);
                    if (j < 4 && (w == 0 || duet_forward_fault == DUET_FAULT_OVERLAP)) {
                        *d = (duet_comp_slot_t){-2, 0, 0, 0};
                        continue;
                    }
                    d->row = q >= P ? (int32_t)(r0 + (q - P)) : -1;
                    d->slot = (int32_t)s->slot;
                    d->pos = (int32_t)q;
                    d->half = j < 4 ? 0 : 1;
                }
                nw4++;
            }
            for (int i = (n > 8 ? n - 8 : 0); i < n; i++, nsw4++)
                sw4[nsw4] = (duet_comp_slot_t){r0 + i, (int32_t)s->slot, (int32_t)(P + i), 0};
        }
        for (int i = 0; i < n; i++) {
            int r = r0 + i;
            int64_t p = P + i;
            ikoff[r] = (int32_t)ik_off[it];
            nvr[r] = F->has4 ? (int32_t)((p + 1) / 4) : 0;
            score_off[r] = (int32_t)nsc;
            nsc += (size_t)nvr[r];
            page_off[r] = (int32_t)pt_off[it];
        }
        if (item->logits_mode == DUET_LOGITS_LAST)
            hrow[nlr++] = r0 + n - 1;
        else if (item->logits_mode == DUET_LOGITS_ALL)
            for (int i = 0; i < n; i++)
                hrow[nlr++] = r0 + i;
    }
    /* key lists per group: layout 4 = [window | C4 selection], layout 128 = [window | C128 entries] */
    for (int g = 0; g < F->n_groups; g++) {
        group_t *G = &F->groups[g];
        int32_t k4 = 0, k128 = 0;
        size_t iw = G->gw_off, i128 = G->g128_off;
        for (int r = G->ra; r < G->rb; r++) {
            int it = r_item[r];
            const duet_seq_t *s = F->items[it].seq;
            int64_t P = s->n_past, base = P - (P < W - 1 ? P : W - 1);
            int64_t p = P + (r - F->row0[it]), lo = p - r_nwin[r] + 1;
            koff4[r] = k4;
            nk0[r] = r_nwin[r];
            nk4[r] = r_nwin[r] + r_nsel[r];
            nsel[r] = r_nsel[r];
            dst4[r] = k4 + r_nwin[r];
            koff128[r] = k128;
            nk128[r] = r_nwin[r] + r_n128[r];
            for (int64_t t = lo; t <= p; t++) {
                int32_t sr = t < P ? (int32_t)(ld_off[it] + (size_t)(t - base))
                                   : (int32_t)(F->NL + (size_t)F->row0[it] + (size_t)(t - P));
                gw_dst[iw] = k4 + (int32_t)(t - lo);
                gw_src[iw++] = sr;
                g128_dst[i128] = k128 + (int32_t)(t - lo);
                g128_src[i128++] = sr;
            }
            for (int e = 0; e < r_n128[r]; e++) {
                g128_dst[i128] = k128 + r_nwin[r] + e;
                g128_src[i128++] = (int32_t)(F->NL + (size_t)R + c128_off[it] + (size_t)e);
            }
            k4 += nk4[r];
            k128 += nk128[r];
        }
    }
    uint32_t epp_swa = duet_kv_cache_layout(hc, DUET_POOL_SWA_KV)->entries_per_page;
    for (int r = 0; r < R; r++) {
        rt_unit[r] = (uint32_t)r / epp_swa;
        rt_idx[r] = (uint32_t)r % epp_swa;
    }
    free(ld_off); free(c128_off); free(pt_off); free(ik_off);
    free(r_item); free(r_nwin); free(r_nsel); free(r_n128);
    return DUET_OK;
}

/* ---- workspace ------------------------------------------------------------ */

typedef struct {
    size_t n;
    int dry;
    uint8_t *base;
} bump_t;

static void *bump(bump_t *b, size_t bytes)
{
    size_t off = (b->n + 255) & ~(size_t)255;
    b->n = off + (bytes ? bytes : 16);
    return b->dry ? NULL : b->base + off;
}

static void carve(fc_t *F, bump_t *b)
{
    const duet_model_config_t *c = F->c;
    size_t R = (size_t)F->R, D = (size_t)c->hidden_size, hc = (size_t)c->hc_mult, H = (size_t)c->num_attention_heads;
    size_t hd = (size_t)c->head_dim, qr = (size_t)c->q_lora_rank, ih = (size_t)c->index_n_heads;
    size_t id = (size_t)c->index_head_dim, G = (size_t)c->o_groups, orank = (size_t)c->o_lora_rank;
    size_t E = (size_t)c->n_routed_experts, K = (size_t)c->num_experts_per_tok, V = (size_t)c->vocab_size;
    size_t I = 1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const duet_layer_weights_t *lw = &F->m->layers[l];
        if (E && (size_t)lw->experts[0].w1.rows > I)
            I = (size_t)lw->experts[0].w1.rows;
        if (c->n_shared_experts > 0 && (size_t)lw->shared.w1.rows > I)
            I = (size_t)lw->shared.w1.rows;
    }
    const duet_cache_layout_t *swa_l = duet_kv_cache_layout(F->dc->host, DUET_POOL_SWA_KV);
    size_t swa_pb = swa_l->page_bytes, swa_epp = swa_l->entries_per_page;
    size_t gin = H * hd / G;
    F->h = bump(b, 4 * R * hc * D);
    F->x = bump(b, 4 * R * D);
    F->xn = bump(b, 4 * R * D);
    F->f = bump(b, 4 * R * D);
    F->post = bump(b, 4 * R * hc);
    F->comb = bump(b, 4 * R * hc * hc);
    F->qlora = bump(b, 4 * R * qr);
    F->q = bump(b, 4 * R * H * hd);
    F->kv = bump(b, 4 * R * hd);
    F->att = bump(b, 4 * R * H * hd);
    F->ckv = bump(b, 4 * R * 2 * hd);
    F->cg = bump(b, 4 * R * 2 * hd);
    F->ikv = bump(b, F->has4 ? 4 * R * 2 * id : 0);
    F->ig = bump(b, F->has4 ? 4 * R * 2 * id : 0);
    F->iq = bump(b, F->has4 ? 4 * R * ih * id : 0);
    F->iw = bump(b, F->has4 ? 4 * R * ih : 0);
    F->rt_tmp = bump(b, ((R + swa_epp - 1) / swa_epp) * swa_pb);
    F->src = bump(b, 4 * (F->NL + R + F->N128e) * hd);
    F->score = bump(b, 4 * F->NSC);
    F->sel = bump(b, 4 * R * (size_t)(c->index_topk > 0 ? c->index_topk : 1));
    size_t nd = F->NW4 * 8 > F->NW128 * 128 ? F->NW4 * 8 : F->NW128 * 128;
    size_t nwin = F->NW4 > F->NW128 ? F->NW4 : F->NW128;
    F->kvg = bump(b, 4 * nd * hd);
    F->gg = bump(b, 4 * nd * hd);
    F->ent = bump(b, 4 * nwin * hd);
    F->keys = bump(b, 4 * F->max_group_keys * hd);
    /* attention's gathered keys as bf16 where the tensor-core form reads them: half the bytes
     * written and read, the same values (every key is a decoded KV entry, exact in bf16) */
    F->keys16 = duet_cuda_attn_rows_bf16_ok(F->cu, hd) ? (uint16_t *)F->keys : NULL;
    F->gx = bump(b, 4 * R * gin);
    F->gy = bump(b, 4 * R * orank);
    F->mid = bump(b, 4 * R * G * orank);
    F->wy = bump(b, F->wo_group ? 4 * R * (size_t)(F->mc->g1 - F->mc->g0) * orank : 0);
    F->tmpv = bump(b, 4 * F->NS * hd);
    size_t RK = R * (K > 0 ? K : 1), L = (size_t)c->num_hidden_layers;
    F->logit = bump(b, 4 * R * E);
    F->xg = bump(b, 4 * R * D);
    F->eg = bump(b, 4 * RK * I);
    F->eu = bump(b, 4 * RK * I);
    F->yg = bump(b, 4 * RK * D);
    F->sg = bump(b, c->n_shared_experts > 0 ? 4 * R * I : 0);
    F->su = bump(b, c->n_shared_experts > 0 ? 4 * R * I : 0);
    F->m_sel = bump(b, 4 * RK);
    F->m_wt = bump(b, 4 * RK);
    F->m_xrow = bump(b, 4 * RK);
    F->m_pos = bump(b, 4 * RK);
    F->m_offs = bump(b, 4 * L * (E + 1));
    F->m_tiles = bump(b, 4 * DUET_CUDA_MOE_TILE_ROWS * (E + 1));
    F->hx = bump(b, 4 * F->NLR * D);
    F->logits = bump(b, 4 * F->NLR * V);
    size_t T = (size_t)F->mc->tp_size, part = RK * D > R * (G / T) * orank ? RK * D : R * (G / T) * orank;
    F->tp_send = bump(b, T > 1 ? 4 * R * (G / T) * orank : 0);
    F->tp_recv = bump(b, T > 1 ? 4 * T * part : 0);
}

/* ---- the layer steps ------------------------------------------------------ */

#define CU(expr)                                                                                                   \
    do {                                                                                                           \
        if ((expr) != DUET_OK)                                                                                     \
            return cuda_fail(F->cu, DUET_ERR_CUDA, err);                                                           \
    } while (0)

#define PH(id) CU(duet_cuda_phase(F->cu, (id)))

const char *duet_fwd_phase_name(int phase)
{
    static const char *const names[DUET_FP_COUNT] = {
        [DUET_FP_EMBED] = "embed",         [DUET_FP_HC] = "hc+norm",
        [DUET_FP_ATTN_PROJ] = "attn proj", [DUET_FP_COMPRESS] = "compress",
        [DUET_FP_KEYS] = "keys",           [DUET_FP_INDEX] = "indexer",
        [DUET_FP_ATTN] = "attention",      [DUET_FP_ATTN_OUT] = "attn out",
        [DUET_FP_MOE_ROUTE] = "moe route", [DUET_FP_MOE_EXPERTS] = "moe experts",
        [DUET_FP_MOE_SHARED] = "moe shared", [DUET_FP_HEAD] = "head",
    };
    return phase >= 0 && phase < DUET_FP_COUNT ? names[phase] : "?";
}

double duet_fwd_phase_line(const duet_cuda_phase_totals_t *t, char *buf, size_t len)
{
    double sum = 0;
    int order[DUET_FP_COUNT];
    for (int i = 0; i < DUET_FP_COUNT; i++) {
        sum += t->ms[i];
        order[i] = i;
    }
    for (int i = 1; i < DUET_FP_COUNT; i++) /* insertion sort, largest first */
        for (int j = i; j > 0 && t->ms[order[j]] > t->ms[order[j - 1]]; j--) {
            int k = order[j];
            order[j] = order[j - 1];
            order[j - 1] = k;
        }
    size_t o = 0;
    if (len)
        buf[0] = '\0';
    for (int i = 0; i < DUET_FP_COUNT && o < len; i++)
        if (t->count[order[i]])
            o += (size_t)snprintf(buf + o, len - o, " %s %.3f (%.0f%%);", duet_fwd_phase_name(order[i]),
                                  t->collections ? t->ms[order[i]] / t->collections : 0.0,
                                  sum > 0 ? 100.0 * t->ms[order[i]] / sum : 0.0);
    return t->collections ? sum / t->collections : 0.0;
}

static void count_mm(fc_t *F, const duet_weight_t *w, int rb, int re, int n)
{
    size_t rows = (size_t)(re - rb);
    F->st.weight_bytes += (double)(rows * weight_row_bytes(w)) +
                          (double)weight_scale_bytes(w) * (double)rows / (double)(w->rows ? w->rows : 1);
    F->st.flops += 2.0 * (double)n * (double)rows * (double)w->cols;
}

static duet_status_t mm(fc_t *F, const duet_weight_t *w, int rb, int re, const float *x, int n, float *y,
                        duet_err_t *err)
{
    if (n <= 0)
        return DUET_OK;
    count_mm(F, w, rb, re, n);
    CU(duet_cuda_matmul(F->cu, w, rb, re, x, n, y));
    return DUET_OK;
}

/* comb's Sinkhorn iterations over the logits the last pre-mix left in F->comb, queued on cu */
static duet_status_t sinkhorn_on(fc_t *F, duet_cuda_t *cu)
{
    return duet_cuda_hc_sinkhorn(cu, F->R, F->c->hc_mult, F->c->hc_sinkhorn_iters, (float)F->c->hc_eps, F->comb);
}

/* comb's Sinkhorn iterations of the last pre-mix (left as logits there: hc_pre_norm) queued on the
 * side stream, at a fork that the sublayer makes anyway (its queries', its shared expert's), ahead
 * of the side stream's own work: they run beside the main stream's matmuls instead of holding up
 * the pre-mix's norm.  The join that the sublayer makes anyway, or sinkhorn_ready, orders them
 * before the next hc_post. */
static duet_status_t sinkhorn_queue(fc_t *F, duet_err_t *err)
{
    if (!F->sk_pending)
        return DUET_OK;
    if (sinkhorn_on(F, F->side) != DUET_OK)
        return cuda_fail(F->side, DUET_ERR_CUDA, err);
    F->sk_pending = 0;
    F->sk_side = 1;
    return DUET_OK;
}

/* Before anything reads comb: the iterations still pending run here on the main stream (no fork
 * came: a sublayer without a shared expert), those on the side stream are joined unless the
 * sublayer's own join came after them. */
static duet_status_t sinkhorn_ready(fc_t *F)
{
    if (F->sk_pending) {
        DUET_TRY(sinkhorn_on(F, F->cu));
        F->sk_pending = 0;
    }
    if (F->sk_side) {
        DUET_TRY(duet_cuda_join(F->cu));
        F->sk_side = 0;
    }
    return DUET_OK;
}

/* Several weights times the same x: where the context is batch-invariant, the parts that one
 * launch can take together (one dtype, width and scale type: duet_cuda_matmul_multi_ok) in one
 * launch each, in the order of their first part (each row's bits as with a launch per weight);
 * the others, or all of them otherwise, one mm() each. */
static duet_status_t mm_multi(fc_t *F, const duet_cuda_mm_part_t *p, int n_parts, const float *x, int n,
                              duet_err_t *err)
{
    enum { MM_MULTI_PARTS = 16 };
    if (n > 0 && n_parts > 1 && n_parts <= MM_MULTI_PARTS && duet_cuda_get_invariant(F->cu) && !F->exact) {
        int used[MM_MULTI_PARTS] = {0};
        for (int i = 0; i < n_parts; i++) {
            if (used[i])
                continue;
            duet_cuda_mm_part_t g[DUET_CUDA_MULTI_MAX];
            int ng = 1;
            g[0] = p[i];
            used[i] = 1;
            for (int j = i + 1; j < n_parts && ng < DUET_CUDA_MULTI_MAX; j++) {
                if (used[j])
                    continue;
                g[ng] = p[j];
                if (duet_cuda_matmul_multi_ok(g, ng + 1, x)) {
                    used[j] = 1;
                    ng++;
                }
            }
            if (ng > 1) {
                for (int k = 0; k < ng; k++)
                    count_mm(F, g[k].w, g[k].row_begin, g[k].row_end, n);
                CU(duet_cuda_matmul_multi(F->cu, g, ng, x, n));
            } else {
                DUET_TRY(mm(F, g[0].w, g[0].row_begin, g[0].row_end, x, n, g[0].y, err));
            }
        }
        return DUET_OK;
    }
    for (int i = 0; i < n_parts; i++)
        DUET_TRY(mm(F, p[i].w, p[i].row_begin, p[i].row_end, x, n, p[i].y, err));
    return DUET_OK;
}

/* compressor_run for every item: closing windows pooled into the pool, then the state ring. */
static duet_status_t compressor(fc_t *F, const duet_cache_layer_t *v, const duet_compressor_t *hcp, const float *ape,
                                const float *norm, int row_off, const float *pkv, const float *pg,
                                duet_pool_kind_t out_pool, size_t nwin, size_t o_desc, size_t o_unit, size_t o_idx,
                                size_t o_pos, size_t nsw, size_t o_sw, duet_err_t *err)
{
    duet_pool_kind_t sk = hcp->ratio == 4 ? DUET_POOL_STATE_C4 : DUET_POOL_STATE_C128;
    const duet_cache_layout_t *sl = v->layout[sk];
    duet_comp_geom_t g = {.ratio = hcp->ratio, .ring = hcp->coff * hcp->ratio, .dim = hcp->dim,
                          .width = hcp->coff * hcp->dim, .stride = (int)sl->vec_dim, .row_off = row_off,
                          .slot_floats = sl->page_bytes / 4};
    float *state = (float *)v->base[sk];
    int ns = hcp->coff * hcp->ratio;
    if (nwin) {
        CU(duet_cuda_comp_gather(F->cu, &g, state, pkv, pg, ape, PD(F, duet_comp_slot_t, o_desc), (int)(nwin * ns),
                                 F->kvg, F->gg));
        CU(duet_cuda_compress_pool(F->cu, F->kvg, F->gg, ns, g.dim, g.dim, (int)nwin, (size_t)ns * g.dim, F->ent));
        CU(duet_cuda_rmsnorm(F->cu, F->ent, norm, (int)nwin, g.dim, (float)F->c->rms_norm_eps, F->ent));
        CU(duet_cuda_rope(F->cu, F->ent, (int)nwin, 1, g.dim, PD(F, int64_t, o_pos), &F->m->rope_compress, 1));
        CU(duet_cuda_cache_store(F->cu, v->layout[out_pool], v->base[out_pool], PD(F, uint32_t, o_unit),
                                 PD(F, uint32_t, o_idx), F->ent, (uint32_t)nwin));
    }
    CU(duet_cuda_comp_state_write(F->cu, &g, state, pkv, pg, ape, PD(F, duet_comp_slot_t, o_sw), (int)nsw));
    return DUET_OK;
}

/* The queries' chain of attention, on F->cu: q_lora's norm, the projections of the normalized q
 * latent (qp), q's norm and rotation, and for a C4 layer the indexer's iq rotation and iw scale. */
static duet_status_t queries(fc_t *F, int layer, const duet_cuda_mm_part_t *qp, int nqp, const int64_t *pos,
                             const duet_rope_t *rope, duet_err_t *err)
{
    const duet_model_config_t *c = F->c;
    const layer_dev_t *lw = &F->mc->layers[layer];
    int R = F->R, hd = c->head_dim, qr = c->q_lora_rank, ih = c->index_n_heads, id = c->index_head_dim;
    int Hl = F->mc->h1 - F->mc->h0;
    float eps = (float)c->rms_norm_eps;
    CU(duet_cuda_rmsnorm(F->cu, F->qlora, lw->q_norm, R, qr, eps, F->qlora));
    DUET_TRY(mm_multi(F, qp, nqp, F->qlora, R, err));
    CU(duet_cuda_rmsnorm(F->cu, F->q, NULL, R * Hl, hd, eps, F->q));
    CU(duet_cuda_rope(F->cu, F->q, R, Hl, hd, pos, rope, 1));
    if (F->m->layers[layer].ratio == 4) {
        CU(duet_cuda_rope(F->cu, F->iq, R, ih, id, pos, &F->m->rope_compress, 1));
        CU(duet_cuda_scale(F->cu, F->iw, (size_t)R * ih, 1.0f / sqrtf((float)ih)));
    }
    return DUET_OK;
}

static duet_status_t attention(fc_t *F, int layer, duet_err_t *err)
{
    const duet_model_config_t *c = F->c;
    const duet_layer_weights_t *hw = &F->m->layers[layer];
    const layer_dev_t *lw = &F->mc->layers[layer];
    int R = F->R, D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim, qr = c->q_lora_rank;
    int G = c->o_groups, orank = c->o_lora_rank, ih = c->index_n_heads, id = c->index_head_dim;
    /* tensor parallelism: this rank's heads [h0, h0 + Hl) and output groups [g0, g0 + Gl) */
    int h0 = F->mc->h0, Hl = F->mc->h1 - F->mc->h0, g0 = F->mc->g0, Gl = F->mc->g1 - F->mc->g0;
    float eps = (float)c->rms_norm_eps;
    const duet_rope_t *rope = duet_model_layer_rope(F->m, layer);
    if (duet_forward_fault == DUET_FAULT_ROPE)
        rope = &F->m->rope_main;
    duet_cache_layer_t v;
    duet_status_t st = dev_layer(F->dc, layer, &v);
    if (st != DUET_OK)
        return duet_err_set(err, st, "layer %d cache is not available", layer);
    const int64_t *pos = PD(F, int64_t, F->o_pos);

    PH(DUET_FP_ATTN_PROJ);
    /* the projections of xn, then those of the normalized q latent, each set in one launch
     * where it can be (mm_multi); the norms and rotations after */
    duet_cuda_mm_part_t xp[7], qp[2];
    int nxp = 0, nqp = 0;
    xp[nxp++] = (duet_cuda_mm_part_t){&lw->wq_a, 0, qr, F->qlora};
    xp[nxp++] = (duet_cuda_mm_part_t){&lw->wkv, 0, hd, F->kv};
    if (hw->ratio) {
        int w = hw->comp.coff * hd;
        xp[nxp++] = (duet_cuda_mm_part_t){&lw->comp_wkv, 0, w, F->ckv};
        xp[nxp++] = (duet_cuda_mm_part_t){&lw->comp_wgate, 0, w, F->cg};
    }
    qp[nqp++] = (duet_cuda_mm_part_t){&lw->wq_b, h0 * hd, (h0 + Hl) * hd, F->q};
    if (hw->ratio == 4) {
        xp[nxp++] = (duet_cuda_mm_part_t){&lw->icomp_wkv, 0, 2 * id, F->ikv};
        xp[nxp++] = (duet_cuda_mm_part_t){&lw->icomp_wgate, 0, 2 * id, F->ig};
        xp[nxp++] = (duet_cuda_mm_part_t){&lw->idx_wproj, 0, ih, F->iw};
        qp[nqp++] = (duet_cuda_mm_part_t){&lw->idx_wq_b, 0, ih * id, F->iq};
    }
    DUET_TRY(mm_multi(F, xp, nxp, F->xn, R, err));
    /* the queries (q, and the indexer's iq and iw) on the side stream where there is one, beside
     * the keys' chain below (kv, the compressors, the cache rows); joined before the index
     * scoring, the first to read them */
    duet_cuda_t *main_cu = F->cu;
    if (F->side) {
        CU(duet_cuda_fork(F->cu));
        DUET_TRY(sinkhorn_queue(F, err));
        F->cu = F->side;
    }
    st = queries(F, layer, qp, nqp, pos, rope, err);
    F->cu = main_cu;
    DUET_TRY(st);
    CU(duet_cuda_rmsnorm(F->cu, F->kv, lw->kv_norm, R, hd, eps, F->kv));
    CU(duet_cuda_rope(F->cu, F->kv, R, 1, hd, pos, rope, 1));
    /* 1. compressors */
    PH(DUET_FP_COMPRESS);
    if (hw->ratio == 4) {
        DUET_TRY(compressor(F, &v, &hw->comp, lw->comp_ape, lw->comp_norm, 0, F->ckv, F->cg, DUET_POOL_C4_KV, F->NW4,
                            F->o_desc4, F->o_w4kv_unit, F->o_w4kv_idx, F->o_w4pos, F->NSW4, F->o_sw4, err));
        DUET_TRY(compressor(F, &v, &hw->icomp, lw->icomp_ape, lw->icomp_norm, 4 * hd, F->ikv, F->ig,
                            DUET_POOL_C4_INDEX_K, F->NW4, F->o_desc4, F->o_w4ik_unit, F->o_w4ik_idx, F->o_w4pos,
                            F->NSW4, F->o_sw4, err));
    } else if (hw->ratio == 128) {
        DUET_TRY(compressor(F, &v, &hw->comp, lw->comp_ape, lw->comp_norm, 0, F->ckv, F->cg, DUET_POOL_C128_KV,
                            F->NW128, F->o_desc128, F->o_w128_unit, F->o_w128_idx, F->o_w128pos, F->NSW128, F->o_sw128,
                            err));
    }
    /* 2-3. keys decoded into src: cached window rows, this call's rows through the SWA encoding, C128 entries */
    const duet_cache_layout_t *swa_l = v.layout[DUET_POOL_SWA_KV];
    PH(DUET_FP_KEYS);
    CU(duet_cuda_cache_load(F->cu, swa_l, v.base[DUET_POOL_SWA_KV], PD(F, uint32_t, F->o_ld_unit),
                            PD(F, uint32_t, F->o_ld_idx), F->src, (uint32_t)F->NL));
    CU(duet_cuda_cache_store(F->cu, swa_l, F->rt_tmp, PD(F, uint32_t, F->o_rt_unit), PD(F, uint32_t, F->o_rt_idx),
                             F->kv, (uint32_t)R));
    CU(duet_cuda_cache_load(F->cu, swa_l, F->rt_tmp, PD(F, uint32_t, F->o_rt_unit), PD(F, uint32_t, F->o_rt_idx),
                            F->src + F->NL * (size_t)hd, (uint32_t)R));
    F->st.cache_bytes += (double)F->NL * swa_l->entry_bytes;
    if (hw->ratio == 128) {
        const duet_cache_layout_t *l = v.layout[DUET_POOL_C128_KV];
        CU(duet_cuda_cache_load(F->cu, l, v.base[DUET_POOL_C128_KV], PD(F, uint32_t, F->o_c128_unit),
                                PD(F, uint32_t, F->o_c128_idx), F->src + (F->NL + (size_t)R) * hd,
                                (uint32_t)F->N128e));
        F->st.cache_bytes += (double)F->N128e * l->entry_bytes;
    }
    if (F->side) {
        CU(duet_cuda_join(F->cu));
        F->sk_side = 0;
    }
    if (hw->ratio == 4 && F->NIK) {
        PH(DUET_FP_INDEX);
        const duet_cache_layout_t *l = v.layout[DUET_POOL_C4_INDEX_K];
        /* the keys decoded from the pool as the scoring reads them (no fp32 copy of them) */
        CU(duet_cuda_index_score_cache(F->cu, F->iq, F->iw, R, ih, id, l, v.base[DUET_POOL_C4_INDEX_K],
                                       PD(F, uint32_t, F->o_ik_unit), PD(F, uint32_t, F->o_ik_idx),
                                       PD(F, int32_t, F->o_ikoff), PD(F, int32_t, F->o_nv),
                                       PD(F, int32_t, F->o_score_off), F->max_nv, 1.0f / sqrtf((float)id), F->score));
        F->st.cache_bytes += (double)F->NIK * l->entry_bytes;
        F->st.flops += 2.0 * (double)F->NSC * ih * id;
        CU(duet_cuda_topk(F->cu, F->score, PD(F, int32_t, F->o_score_off), PD(F, int32_t, F->o_nv), R, F->max_nv,
                          c->index_topk, F->sel));
    }
    /* 4. attention per row group */
    const float *sinks = (duet_forward_fault == DUET_FAULT_SINK ? F->mc->neg_inf : lw->attn_sink) + h0;
    float scale = 1.0f / sqrtf((float)hd);
    PH(DUET_FP_ATTN);
    for (int g = 0; g < F->n_groups; g++) {
        const group_t *Gp = &F->groups[g];
        int ra = Gp->ra, nr = Gp->rb - Gp->ra, maxk;
        const int32_t *koff, *nk, *gdst, *gsrc;
        int gcnt;
        if (hw->ratio == 128) {
            gdst = PD(F, int32_t, F->o_g128_dst) + Gp->g128_off;
            gsrc = PD(F, int32_t, F->o_g128_src) + Gp->g128_off;
            gcnt = (int)Gp->g128_cnt;
            koff = PD(F, int32_t, F->o_koff128);
            nk = PD(F, int32_t, F->o_nk128);
            maxk = Gp->maxk128;
        } else {
            gdst = PD(F, int32_t, F->o_gw_dst) + Gp->gw_off;
            gsrc = PD(F, int32_t, F->o_gw_src) + Gp->gw_off;
            gcnt = (int)Gp->gw_cnt;
            koff = PD(F, int32_t, F->o_koff4);
            nk = PD(F, int32_t, hw->ratio == 4 ? F->o_nk4 : F->o_nk0);
            maxk = hw->ratio == 4 ? Gp->maxk4 : Gp->maxk0;
        }
        F->st.flops += 4.0 * (double)gcnt * Hl * hd;
        if (F->keys16)
            CU(duet_cuda_gather_rows_to_bf16(F->cu, F->keys16, gdst, F->src, gsrc, gcnt, hd));
        else
            CU(duet_cuda_gather_rows_to(F->cu, F->keys, gdst, F->src, gsrc, gcnt, hd));
        if (hw->ratio == 4) {
            const duet_cache_layout_t *l = v.layout[DUET_POOL_C4_KV];
            const int32_t *sel = F->sel + (size_t)ra * c->index_topk, *nsel = PD(F, int32_t, F->o_nsel) + ra;
            const int32_t *poff = PD(F, int32_t, F->o_page_off) + ra, *dst = PD(F, int32_t, F->o_dst4) + ra;
            if (F->keys16)
                CU(duet_cuda_cache_load_sel_bf16(F->cu, l, v.base[DUET_POOL_C4_KV], sel, c->index_topk, nr, nsel,
                                                 PD(F, uint32_t, F->o_pt), poff, dst, F->keys16));
            else
                CU(duet_cuda_cache_load_sel(F->cu, l, v.base[DUET_POOL_C4_KV], sel, c->index_topk, nr, nsel,
                                            PD(F, uint32_t, F->o_pt), poff, dst, F->keys));
        }
        const float *qg = F->q + (size_t)ra * Hl * hd;
        float *og = F->att + (size_t)ra * Hl * hd;
        if (F->keys16)
            CU(duet_cuda_attn_rows_bf16(F->cu, qg, nr, Hl, hd, F->keys16, koff + ra, nk + ra, maxk > 0 ? maxk : 1,
                                        sinks, scale, og));
        else
            CU(duet_cuda_attn_rows(F->cu, qg, nr, Hl, hd, F->keys, koff + ra, nk + ra, maxk > 0 ? maxk : 1, sinks,
                                   scale, og));
    }
    if (hw->ratio == 4) {
        /* selected entries: counted from the host-known selection sizes */
        double nsel = 0;
        for (int it = 0; it < F->n_items; it++) {
            int64_t P = F->items[it].seq->n_past;
            for (int i = 0; i < F->items[it].n_tokens; i++) {
                int64_t nv = (P + i + 1) / 4;
                nsel += (double)(nv < c->index_topk ? nv : c->index_topk);
            }
        }
        F->st.cache_bytes += nsel * v.layout[DUET_POOL_C4_KV]->entry_bytes;
        F->st.flops += 4.0 * nsel * Hl * hd;
    }
    /* 5. this call's K=V into the ring */
    PH(DUET_FP_ATTN_OUT);
    CU(duet_cuda_gather_rows(F->cu, F->tmpv, F->kv, PD(F, int32_t, F->o_st_row), (int)F->NS, hd));
    CU(duet_cuda_cache_store(F->cu, swa_l, v.base[DUET_POOL_SWA_KV], PD(F, uint32_t, F->o_st_unit),
                             PD(F, uint32_t, F->o_st_idx), F->tmpv, (uint32_t)F->NS));
    CU(duet_cuda_rope(F->cu, F->att, R, Hl, hd, pos, rope, -1));
    /* grouped output projection: this rank's groups, then (tensor parallelism) every rank's
     * groups gathered into mid, so wo_b sees the same input on every rank and as with one GPU */
    int gin = H * hd / G;
    size_t lw_cols = (size_t)Gl * orank;
    float *mid_l = F->mc->tp_size > 1 ? F->tp_send : F->mid;
    if (F->wo_group && !F->mc->no_blockdiag &&
        duet_cuda_matmul_blockdiag_ok(F->cu, &lw->wo_a, g0 * orank, (g0 + Gl) * orank, orank, F->att, R)) {
        /* one launch of the loading-warp kernel over the groups' rows, each reading its group's
         * columns of att and writing mid's layout directly: the same bits as a launch a group */
        for (int g = 0; g < Gl; g++)
            count_mm(F, &lw->wo_a, (g0 + g) * orank, (g0 + g + 1) * orank, R);
        CU(duet_cuda_matmul_blockdiag(F->cu, &lw->wo_a, g0 * orank, (g0 + Gl) * orank, orank, F->att, R, mid_l));
    } else if (F->wo_group && lw->wo_ptr && duet_cuda_matmul_invariant_tc(&lw->wo_a, g0 * orank, F->att)) {
        /* one launch: att as (R * Gl) rows of gin, group g's rows r * Gl + g; each token's result
         * is the batch-invariant kernel's, as with a launch per group below */
        duet_cuda_expert_mats_t ma = {&lw->wo_proto, lw->wo_ptr, lw->wo_proto.scale ? lw->wo_ptr + Gl : NULL};
        duet_cuda_moe_plan_t p = {.n_experts = Gl, .n_assign = R * Gl, .offs = PD(F, int32_t, F->o_wo_offs),
                                  .tiles = PD(F, int32_t, F->o_wo_tiles), .xrow = PD(F, int32_t, F->o_wo_xrow)};
        for (int g = 0; g < Gl; g++)
            count_mm(F, &lw->wo_a, (g0 + g) * orank, (g0 + g + 1) * orank, R);
        CU(duet_cuda_matmul_grouped(F->cu, &ma, NULL, &p, F->att, 1, F->wy, NULL));
        CU(duet_cuda_gather_rows(F->cu, mid_l, F->wy, PD(F, int32_t, F->o_wo_yrow), R * Gl, orank));
    } else {
        for (int g = 0; g < Gl; g++) {
            CU(duet_cuda_copy_2d(F->cu, F->gx, (size_t)gin, F->att + (size_t)g * gin, (size_t)Hl * hd, R, gin));
            DUET_TRY(mm(F, &lw->wo_a, (g0 + g) * orank, (g0 + g + 1) * orank, F->gx, R, F->gy, err));
            CU(duet_cuda_copy_2d(F->cu, mid_l + (size_t)g * orank, lw_cols, F->gy, (size_t)orank, R, orank));
        }
    }
    if (F->mc->tp_size > 1) {
        CU(duet_cuda_comm_allgather(F->mc->comm, F->cu, F->tp_send, F->tp_recv, (size_t)R * lw_cols));
        for (int r = 0; r < F->mc->tp_size; r++)
            CU(duet_cuda_copy_2d(F->cu, F->mid + (size_t)r * lw_cols, (size_t)G * orank,
                                 F->tp_recv + (size_t)r * R * lw_cols, lw_cols, R, lw_cols));
    }
    DUET_TRY(mm(F, &lw->wo_b, 0, D, F->mid, R, F->f, err));
    return DUET_OK;
}

/* y = w2 · swiglu(w1 · x, w3 · x), through g and u (m rows of w1's width each) */
static duet_status_t expert_mlp_in(fc_t *F, const duet_weight_t *w3, const float *x, int m, float *g, float *u,
                                   float *y, duet_err_t *err)
{
    int D = F->c->hidden_size, I = w3[0].rows;
    duet_cuda_mm_part_t p[2] = {{&w3[0], 0, I, g}, {&w3[2], 0, I, u}};
    DUET_TRY(mm_multi(F, p, 2, x, m, err));
    CU(duet_cuda_swiglu(F->cu, g, u, m, I, (float)F->c->swiglu_limit, g));
    DUET_TRY(mm(F, &w3[1], 0, D, g, m, y, err));
    return DUET_OK;
}

static duet_status_t expert_mlp(fc_t *F, const duet_weight_t *w3, const float *x, int m, float *y, duet_err_t *err)
{
    return expert_mlp_in(F, w3, x, m, F->eg, F->eu, y, err);
}

/* The shared expert into F->xg on the side stream, beside what the main stream queues next:
 * forked from the main stream here (xn written), joined by the caller before the sum reads it.
 * Its own buffers (sg, su), and the side context's scratch and split sums. */
static duet_status_t shared_on_side(fc_t *F, const layer_dev_t *lw, duet_err_t *err)
{
    CU(duet_cuda_fork(F->cu));
    DUET_TRY(sinkhorn_queue(F, err));
    duet_cuda_t *main_cu = F->cu;
    F->cu = F->side;
    duet_status_t st = expert_mlp_in(F, lw->sh, F->xn, F->R, F->sg, F->su, F->xg, err);
    F->cu = main_cu;
    return st;
}

static int use_grouped(const fc_t *F, int layer)
{
    const layer_dev_t *lw = &F->mc->layers[layer];
    size_t e = 3 * (size_t)F->mc->e0;
    return lw->grouped && !F->mc->moe_host_route && !F->exact && duet_cuda_matmul_grouped_ok(&lw->experts[e], F->xn) &&
           duet_cuda_matmul_grouped_ok(&lw->experts[e + 1], F->eg);
}

/* MoE all on the device: gate logits, routing (moe_route), a counting sort of the
 * assignments by expert (moe_sort), w1 and w3 of every expert in one grouped launch,
 * SwiGLU over all assignments, w2 grouped, the shared expert, then each row's sum
 * over its experts in ascending id plus the shared expert (moe_combine: forward.c's
 * order).  No host round trip; the expert counts stay on the device. */
static duet_status_t moe_grouped(fc_t *F, int layer, duet_err_t *err)
{
    const duet_model_config_t *c = F->c;
    const duet_layer_weights_t *hw = &F->m->layers[layer];
    const layer_dev_t *lw = &F->mc->layers[layer];
    int R = F->R, D = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    int I = lw->experts[3 * (size_t)F->mc->e0].rows; /* the first expert this rank holds */
    int side = c->n_shared_experts > 0 && F->side;
    if (side) /* first, so that it runs beside the routing's short launches too */
        DUET_TRY(shared_on_side(F, lw, err));
    PH(DUET_FP_MOE_ROUTE);
    DUET_TRY(mm(F, &lw->gate, 0, E, F->xn, R, F->logit, err));
    duet_cuda_moe_route_t rp = {
        .n_experts = E,
        .top_k = K,
        .scoring = (int)c->scoring_func,
        .norm_topk_prob = c->norm_topk_prob,
        .routed_scale = (float)c->routed_scaling_factor,
        .bias = hw->is_hash ? NULL : lw->gate_bias,
        .tid2eid = hw->is_hash ? lw->tid2eid : NULL,
        .tok = PD(F, int32_t, F->o_tok),
        .vocab = c->vocab_size,
    };
    int32_t *offs = F->m_offs + (size_t)layer * (E + 1);
    CU(duet_cuda_moe_route(F->cu, &rp, F->logit, R, F->m_sel, F->m_wt));
    CU(duet_cuda_moe_sort(F->cu, F->m_sel, R, K, E, offs, F->m_tiles, F->m_xrow, F->m_pos));
    int T = F->mc->tp_size;
    if (T > 1) /* this rank's experts only, at their usual sorted positions */
        CU(duet_cuda_moe_tiles_own(F->cu, F->m_tiles, E, F->mc->e0, F->mc->e1));
    duet_cuda_moe_plan_t p = {.n_experts = E, .n_assign = R * K, .offs = offs, .tiles = F->m_tiles, .xrow = F->m_xrow};
    const void **tab = lw->ex_ptr;
    const duet_weight_t *x0 = &lw->experts[3 * (size_t)F->mc->e0]; /* the first expert this rank holds */
    duet_cuda_expert_mats_t m1 = {&x0[0], tab, x0[0].scale ? tab + 3 * (size_t)E : NULL};
    duet_cuda_expert_mats_t m3 = {&x0[2], tab + (size_t)E, x0[2].scale ? tab + 4 * (size_t)E : NULL};
    duet_cuda_expert_mats_t m2 = {&x0[1], tab + 2 * (size_t)E, x0[1].scale ? tab + 5 * (size_t)E : NULL};
    PH(DUET_FP_MOE_EXPERTS);
    CU(duet_cuda_matmul_grouped(F->cu, &m1, &m3, &p, F->xn, 1, F->eg, F->eu));
    CU(duet_cuda_swiglu(F->cu, F->eg, F->eu, R * K, I, (float)c->swiglu_limit, F->eg));
    CU(duet_cuda_matmul_grouped(F->cu, &m2, NULL, &p, F->eg, 0, F->yg, NULL));
    if (T > 1) {
        /* every rank's expert outputs, each position taken from the rank that computed it: the
         * combination below then adds what one GPU adds, in its order */
        CU(duet_cuda_comm_allgather(F->mc->comm, F->cu, F->yg, F->tp_recv, (size_t)R * K * D));
        CU(duet_cuda_moe_pick(F->cu, F->yg, F->tp_recv, R * K, D, offs, E, T));
    }
    PH(DUET_FP_MOE_SHARED);
    const float *shared = NULL;
    if (side) {
        CU(duet_cuda_join(F->cu));
        F->sk_side = 0;
        shared = F->xg;
    } else if (c->n_shared_experts > 0) {
        DUET_TRY(expert_mlp(F, lw->sh, F->xn, R, F->xg, err)); /* eg / eu as scratch: the grouped w2 has read them */
        shared = F->xg;
    }
    CU(duet_cuda_moe_combine(F->cu, F->m_sel, F->m_wt, F->m_pos, R, K, F->yg, shared, D, F->f));
    return DUET_OK;
}

/* The routed experts' bytes and FLOPs of the grouped layers (each used expert once), from
 * the per-layer expert offsets: one download at the end of the call, for the stats only. */
static duet_status_t count_grouped(fc_t *F, duet_err_t *err)
{
    const duet_model_config_t *c = F->c;
    int L = c->num_hidden_layers, E = c->n_routed_experts;
    int any = 0;
    for (int l = 0; l < L; l++)
        any |= use_grouped(F, l);
    if (!any || E <= 0)
        return DUET_OK;
    size_t n = (size_t)L * (E + 1);
    int32_t *offs = duet_malloc_array(n, sizeof(int32_t));
    if (!offs)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    if (duet_cuda_download(F->cu, offs, F->m_offs, n * sizeof(int32_t)) != DUET_OK) {
        free(offs);
        return cuda_fail(F->cu, DUET_ERR_CUDA, err);
    }
    for (int l = 0; l < L; l++) {
        if (!use_grouped(F, l))
            continue;
        const layer_dev_t *lw = &F->mc->layers[l];
        const int32_t *o = offs + (size_t)l * (E + 1);
        for (int e = F->mc->e0; e < F->mc->e1; e++) { /* this rank's experts */
            int m = o[e + 1] - o[e];
            if (m <= 0)
                continue;
            for (int k = 0; k < 3; k++)
                count_mm(F, &lw->experts[3 * e + k], 0, lw->experts[3 * e + k].rows, m);
        }
    }
    free(offs);
    return DUET_OK;
}

/* MoE, the per-expert path: gate logits on the device, routing on the host (forward.c's
 * code), one gather, MLP and accumulate per expert (experts that are not all alike, or
 * DUET_MOE_HOST=1). */
static duet_status_t moe(fc_t *F, int layer, duet_err_t *err)
{
    if (use_grouped(F, layer))
        return moe_grouped(F, layer, err);
    if (F->mc->tp_size > 1)
        return duet_err_set(err, DUET_ERR_UNSUPPORTED,
                            "layer %d: tensor parallelism needs the grouped expert path (experts of one shape, "
                            "DUET_MOE_HOST unset)", layer);

    const duet_model_config_t *c = F->c;
    const duet_layer_weights_t *hw = &F->m->layers[layer];
    const layer_dev_t *lw = &F->mc->layers[layer];
    duet_model_cuda_t *mc = F->mc;
    int R = F->R, D = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    PH(DUET_FP_MOE_ROUTE);
    DUET_TRY(mm(F, &lw->gate, 0, E, F->xn, R, F->logit, err));
    float *logit = duet_malloc_array((size_t)R * E, sizeof(float));
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)R * K);
    float *wt = duet_malloc_array((size_t)R * K, sizeof(float)), *biased = duet_malloc_array((size_t)2 * E, sizeof(float));
    int *cnt = calloc((size_t)E + 1, sizeof(int));
    duet_status_t st = DUET_OK;
    if (!logit || !sel || !wt || !biased || !cnt) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (duet_cuda_download(F->cu, logit, F->logit, sizeof(float) * (size_t)R * E) != DUET_OK) {
        st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
        goto out;
    }
    for (int r = 0; r < R; r++)
        duet_moe_route_row(logit + (size_t)r * E, E, K, c->scoring_func, c->norm_topk_prob,
                           (float)c->routed_scaling_factor, hw->gate_bias,
                           hw->is_hash ? hw->tid2eid + (size_t)F->tok_h[r] * K : NULL, biased, sel + (size_t)r * K,
                           wt + (size_t)r * K);
    /* rows grouped by expert, ascending ids (the CPU's order of accumulation) */
    for (size_t i = 0; i < (size_t)R * K; i++)
        if (sel[i] >= 0 && sel[i] < E)
            cnt[sel[i] + 1]++;
    for (int e = 0; e < E; e++)
        cnt[e + 1] += cnt[e];
    size_t need = (size_t)R * K * 8;
    if (need > mc->moe_bytes) {
        duet_cuda_host_free(mc->c, mc->moe_host);
        duet_cuda_free(mc->c, mc->moe_dev);
        mc->moe_host = mc->moe_dev = NULL;
        mc->moe_bytes = 0;
        if (duet_cuda_host_alloc(mc->c, (void **)&mc->moe_host, need) != DUET_OK ||
            duet_cuda_malloc(mc->c, (void **)&mc->moe_dev, need) != DUET_OK) {
            st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
            goto out;
        }
        mc->moe_bytes = need;
    }
    int32_t *rows_h = (int32_t *)mc->moe_host;
    float *rw_h = (float *)(mc->moe_host + (size_t)R * K * 4);
    {
        int *fill = malloc(sizeof(int) * (size_t)E);
        if (!fill) {
            st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
            goto out;
        }
        memcpy(fill, cnt, sizeof(int) * (size_t)E);
        for (int r = 0; r < R; r++)
            for (int j = 0; j < K; j++) {
                int e = sel[(size_t)r * K + j];
                if (e < 0 || e >= E)
                    continue;
                rows_h[fill[e]] = r;
                rw_h[fill[e]] = wt[(size_t)r * K + j];
                fill[e]++;
            }
        free(fill);
    }
    int32_t *rows_d = (int32_t *)mc->moe_dev;
    float *rw_d = (float *)(mc->moe_dev + (size_t)R * K * 4);
    if (duet_cuda_memcpy(F->cu, mc->moe_dev, mc->moe_host, need) != DUET_OK ||
        duet_cuda_memset(F->cu, F->f, 0, sizeof(float) * (size_t)R * D) != DUET_OK) {
        st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
        goto out;
    }
    if (duet_cuda_phase(F->cu, DUET_FP_MOE_EXPERTS) != DUET_OK) {
        st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
        goto out;
    }
    for (int e = 0; e < E; e++) {
        int m = cnt[e + 1] - cnt[e];
        if (!m)
            continue;
        if (duet_cuda_gather_rows(F->cu, F->xg, F->xn, rows_d + cnt[e], m, D) != DUET_OK) {
            st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
            goto out;
        }
        if ((st = expert_mlp(F, &lw->experts[3 * e], F->xg, m, F->yg, err)) != DUET_OK)
            goto out;
        if (duet_cuda_scale_add_rows(F->cu, F->f, rows_d + cnt[e], rw_d + cnt[e], F->yg, m, D) != DUET_OK) {
            st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
            goto out;
        }
    }
    if (duet_cuda_phase(F->cu, DUET_FP_MOE_SHARED) != DUET_OK) {
        st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
        goto out;
    }
    if (c->n_shared_experts > 0) {
        if ((st = expert_mlp(F, lw->sh, F->xn, R, F->yg, err)) != DUET_OK)
            goto out;
        if (duet_cuda_add(F->cu, F->f, F->yg, (size_t)R * D) != DUET_OK) {
            st = cuda_fail(F->cu, DUET_ERR_CUDA, err);
            goto out;
        }
    }
out:
    free(logit); free(sel); free(wt); free(biased); free(cnt);
    return st;
}

/* ---- the call ------------------------------------------------------------- */

duet_status_t duet_forward_cuda(duet_model_cuda_t *mc, duet_kv_cache_cuda_t *dc, duet_fwd_item_t *items,
                                int n_items, duet_err_t *err)
{
    return duet_forward_cuda_ex(mc, dc, items, n_items, NULL, err);
}

/* Whether the hyper-connection pre-mixes take the fused operation with the norm (the same bits
 * either way): where the width allows and the rows are no more than the SMs.  Its block (a
 * row's, of the norm's 1024 threads) waits for one warp's Sinkhorn iterations (unless they go to
 * the side stream: sinkhorn_queue), which at decode sizes costs less than the third launch; with
 * more rows than SMs the blocks queue behind those waits (a 4096-token prefill measured 18 ms
 * against 10 for the two operations). */
static int hc_fused(const fc_t *F)
{
    duet_cuda_info_t info;
    duet_cuda_info(F->cu, &info);
    return duet_cuda_hc_norm_ok(F->c->hc_mult, F->c->hidden_size) && F->R <= info.sm_count && !F->exact;
}

/* A layer's hyper-connection pre-mix of F->h and the norm of its result into F->xn: one fused
 * operation (hc_fused), else hc_pre into F->x and rmsnorm.  post_first: hc_post of the sublayer
 * before (its output F->f, the post and comb of its pre-mix) first, in the fused operation's
 * first launch where hc_fused and not DUET_CUDA_HC_POST_FUSE=0 (the same bits). */
static duet_status_t hc_pre_norm(fc_t *F, int post_first, const float *fn, const float *base, const float *scale,
                                 const float *norm)
{
    const duet_model_config_t *c = F->c;
    int hc = c->hc_mult, D = c->hidden_size;
    float eps = (float)c->rms_norm_eps, hc_eps = (float)c->hc_eps;
    DUET_TRY(sinkhorn_ready(F));
    /* comb left as its logits, the iterations queued at the sublayer's fork (sinkhorn_queue) */
    int logits = F->hc_fused && F->side && !F->mc->no_sk_side && duet_cuda_hc_sinkhorn_ok(hc);
    if (post_first && F->hc_fused && !F->mc->no_post_fuse) {
        DUET_TRY(duet_cuda_hc_post_pre_norm(F->cu, F->h, F->R, hc, D, F->f, fn, base, scale, c->hc_sinkhorn_iters,
                                            hc_eps, eps, F->post, F->comb, norm, eps, F->xn, logits));
        F->sk_pending = logits;
        return DUET_OK;
    }
    if (post_first)
        DUET_TRY(duet_cuda_hc_post(F->cu, F->h, F->R, hc, D, F->f, F->post, F->comb));
    if (F->hc_fused) {
        DUET_TRY(duet_cuda_hc_pre_norm(F->cu, F->h, F->R, hc, D, fn, base, scale, c->hc_sinkhorn_iters, hc_eps, eps,
                                       F->post, F->comb, norm, eps, F->xn, logits));
        F->sk_pending = logits;
        return DUET_OK;
    }
    DUET_TRY(duet_cuda_hc_pre(F->cu, F->h, F->R, hc, D, fn, base, scale, c->hc_sinkhorn_iters, hc_eps, eps, F->post,
                              F->comb, F->x));
    return duet_cuda_rmsnorm(F->cu, F->x, norm, F->R, D, eps, F->xn);
}

/* The same for the head's pre-mix and the final norm. */
static duet_status_t hc_head_norm(fc_t *F, int post_first)
{
    const duet_model_config_t *c = F->c;
    const duet_model_cuda_t *mc = F->mc;
    int hc = c->hc_mult, D = c->hidden_size;
    float eps = (float)c->rms_norm_eps, hc_eps = (float)c->hc_eps;
    DUET_TRY(sinkhorn_ready(F));
    if (post_first && F->hc_fused && !mc->no_post_fuse)
        return duet_cuda_hc_post_head_norm(F->cu, F->h, F->R, hc, D, F->f, F->post, F->comb, mc->hc_head_fn,
                                           mc->hc_head_base, F->m->hc_head_scale, hc_eps, eps, mc->norm, eps, F->xn);
    if (post_first)
        DUET_TRY(duet_cuda_hc_post(F->cu, F->h, F->R, hc, D, F->f, F->post, F->comb));
    if (F->hc_fused)
        return duet_cuda_hc_head_norm(F->cu, F->h, F->R, hc, D, mc->hc_head_fn, mc->hc_head_base,
                                      F->m->hc_head_scale, hc_eps, eps, mc->norm, eps, F->xn);
    DUET_TRY(duet_cuda_hc_head(F->cu, F->h, F->R, hc, D, mc->hc_head_fn, mc->hc_head_base, F->m->hc_head_scale, hc_eps,
                               eps, F->x));
    return duet_cuda_rmsnorm(F->cu, F->x, mc->norm, F->R, D, eps, F->xn);
}

static duet_status_t run(fc_t *F, const duet_fwd_cuda_opts_t *opts, duet_err_t *err)
{
    const duet_model_config_t *c = F->c;
    duet_model_cuda_t *mc = F->mc;
    int R = F->R, D = c->hidden_size, hc = c->hc_mult;
    hbuf_t hb = {0};
    double t0 = duet_time_s();
    duet_status_t st = build_plan(F, &hb, err); /* written into mc->plan_host */
    if (st != DUET_OK)
        goto out;
    if (duet_cuda_phase(mc->c, DUET_FP_EMBED) != DUET_OK) {
        st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    if (duet_cuda_memcpy(mc->c, mc->plan_dev, mc->plan_host, F->plan_copy) != DUET_OK) {
        st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    F->pd = mc->plan_dev;
    if (F->NIK && duet_cuda_kv_entries(mc->c, PD(F, uint32_t, F->o_pt), PD(F, int32_t, F->o_ik_runs), F->n_items,
                                       F->ik_max, F->eppi, PD(F, uint32_t, F->o_ik_unit),
                                       PD(F, uint32_t, F->o_ik_idx)) != DUET_OK) {
        st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    F->st.host_plan_s = duet_time_s() - t0;
    /* workspace */
    {
        bump_t b = {.dry = 1};
        carve(F, &b);
        if (b.n > mc->ws_bytes) {
            if (duet_cuda_sync(mc->c) != DUET_OK) {
                st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
                goto out;
            }
            duet_cuda_free(mc->c, mc->ws);
            mc->ws = NULL;
            mc->ws_bytes = 0;
            size_t want = b.n + b.n / 4;
            if (duet_cuda_malloc(mc->c, (void **)&mc->ws, want) != DUET_OK) {
                st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
                goto out;
            }
            mc->ws_bytes = want;
        }
        bump_t w = {.base = mc->ws};
        carve(F, &w);
    }
    if (duet_cuda_embed(mc->c, mc->embed.data, mc->embed.dtype, D, PD(F, int32_t, F->o_tok), R, hc, F->h) !=
        DUET_OK) {
        st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    /* a sublayer's hc_post is made by the pre-mix after it (hc_pre_norm, hc_head_norm: in its first
     * launch where they fuse); post_pending: the last MoE's is still to be made */
    int post_pending = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const layer_dev_t *lw = &mc->layers[l];
        if (duet_cuda_phase(mc->c, DUET_FP_HC) != DUET_OK ||
            hc_pre_norm(F, post_pending, lw->hc_attn_fn, lw->hc_attn_base, lw->hc_attn_scale, lw->attn_norm) !=
                DUET_OK) {
            st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
            goto out;
        }
        if ((st = attention(F, l, err)) != DUET_OK)
            goto out;
        if (opts && opts->layer_done) {
            if (!opts->layer_done_queued && duet_cuda_sync(mc->c) != DUET_OK) {
                st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
                goto out;
            }
            if ((st = opts->layer_done(opts->arg, l)) != DUET_OK) {
                duet_err_set(err, st, "layer %d: the layer hook failed", l);
                goto out;
            }
        }
        if (duet_cuda_phase(mc->c, DUET_FP_HC) != DUET_OK ||
            hc_pre_norm(F, 1, lw->hc_ffn_fn, lw->hc_ffn_base, lw->hc_ffn_scale, lw->ffn_norm) != DUET_OK) {
            st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
            goto out;
        }
        if ((st = moe(F, l, err)) != DUET_OK)
            goto out;
        post_pending = 1;
    }
    int head = F->NLR && mc->head.data; /* tensor parallelism: rank 0 only */
    if (post_pending && !head &&
        (duet_cuda_phase(mc->c, DUET_FP_HC) != DUET_OK || sinkhorn_ready(F) != DUET_OK ||
         duet_cuda_hc_post(mc->c, F->h, R, hc, D, F->f, F->post, F->comb) != DUET_OK)) {
        st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    if (duet_cuda_phase(mc->c, DUET_FP_HEAD) != DUET_OK) {
        st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    if (head) {
        if (hc_head_norm(F, post_pending) != DUET_OK ||
            duet_cuda_gather_rows(mc->c, F->hx, F->xn, PD(F, int32_t, F->o_hrow), (int)F->NLR, D) != DUET_OK) {
            st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
            goto out;
        }
        float *lg = opts && opts->logits_dev ? opts->logits_dev : F->logits;
        if ((st = mm(F, &mc->head, 0, c->vocab_size, F->hx, (int)F->NLR, lg, err)) != DUET_OK)
            goto out;
        F->st.host_queue_s = duet_time_s() - t0; /* the downloads below wait for the device */
        if (!(opts && opts->logits_dev)) {
            size_t row = 0, V = (size_t)c->vocab_size;
            for (int i = 0; i < F->n_items; i++) {
                duet_fwd_item_t *it = &F->items[i];
                size_t nr = it->logits_mode == DUET_LOGITS_ALL ? (size_t)it->n_tokens
                            : it->logits_mode == DUET_LOGITS_LAST ? 1 : 0;
                if (nr && duet_cuda_download(mc->c, it->logits, lg + row * V, sizeof(float) * nr * V) != DUET_OK) {
                    st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
                    goto out;
                }
                row += nr;
            }
        }
    }
    if (!F->st.host_queue_s)
        F->st.host_queue_s = duet_time_s() - t0;
    if (duet_cuda_phase(mc->c, DUET_CUDA_PHASE_END) != DUET_OK || duet_cuda_sync(mc->c) != DUET_OK ||
        duet_cuda_phase_collect(mc->c) != DUET_OK) {
        st = cuda_fail(mc->c, DUET_ERR_CUDA, err);
        goto out;
    }
    if (opts && opts->stats && (st = count_grouped(F, err)) != DUET_OK)
        goto out;
    for (int i = 0; i < F->n_items && !F->no_advance; i++)
        F->items[i].seq->n_past += F->items[i].n_tokens;
out:
    return st;
}

duet_status_t duet_forward_cuda_ex(duet_model_cuda_t *mc, duet_kv_cache_cuda_t *dc, duet_fwd_item_t *items,
                                   int n_items, const duet_fwd_cuda_opts_t *opts, duet_err_t *err)
{
    const duet_model_t *m = mc->m;
    const duet_model_config_t *c = &m->cfg;
    duet_kv_cache_t *cache = dc->host;
    /* validate everything before touching any cache (forward.c's checks) */
    int R = 0;
    duet_status_t vst = duet_fwd_items_check(c, cache, items, n_items, opts && opts->logits_dev, &R, err);
    if (vst != DUET_OK)
        return vst;
    if (opts && opts->stats)
        memset(opts->stats, 0, sizeof *opts->stats);
    if (R == 0)
        return DUET_OK;
    fc_t F;
    memset(&F, 0, sizeof F);
    F.mc = mc;
    F.dc = dc;
    F.m = m;
    F.c = c;
    F.cu = mc->c;
    F.items = items;
    F.n_items = n_items;
    F.R = R;
    F.no_advance = opts && opts->no_advance;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        F.has4 |= m->layers[l].ratio == 4;
        F.has128 |= m->layers[l].ratio == 128;
        F.wo_group |= mc->layers[l].wo_ptr != NULL;
    }
    /* wo_a grouped: decode-sized calls with the batch-invariant matmuls (the launch per group
     * takes the same kernel there, so the same bits); larger calls keep a launch per group */
    F.exact = duet_cuda_get_exact(mc->c);
    F.wo_group = F.wo_group && R <= WO_GROUP_MAX_ROWS && duet_cuda_get_invariant(mc->c) && !F.exact;
    /* dependent launches for decode-sized calls; a prefill's kernels launch the ordinary way
     * (after cuBLASLt's GEMMs the dependent form made a prefill slower: docs/PERF.md) */
    duet_cuda_set_pdl(mc->c, !mc->no_pdl && R <= PDL_MAX_ROWS);
    /* a side stream at decode sizes, for the queries beside the keys and the shared expert beside
     * the routed experts; not with tensor parallelism (the collectives stay alone on the device)
     * nor with phase timing (one stream, so that each phase's events bound its own work) */
    if (!mc->no_side && mc->tp_size == 1 && R <= PDL_MAX_ROWS && !duet_cuda_phases_enabled(mc->c)) {
        F.side = duet_cuda_side(mc->c);
        if (!F.side)
            return cuda_fail(mc->c, DUET_ERR_CUDA, err);
    }
    F.hc_fused = hc_fused(&F);
    F.row0 = malloc(sizeof(int) * (size_t)n_items);
    F.tok_h = malloc(sizeof(int32_t) * (size_t)R);
    if (!F.row0 || !F.tok_h) {
        free(F.row0);
        free(F.tok_h);
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    for (int i = 0, r = 0; i < n_items; i++) {
        F.row0[i] = r;
        memcpy(F.tok_h + r, items[i].tokens, sizeof(int32_t) * (size_t)items[i].n_tokens);
        r += items[i].n_tokens;
    }
    F.st.rows = R;
    duet_status_t st = run(&F, opts, err);
    /* a call that failed between a fork and its join: what the next call queues on the main
     * stream still waits for the side stream's work (its buffers are the next call's too) */
    if (st != DUET_OK && F.side)
        duet_cuda_join(mc->c);
    if (st == DUET_OK && opts && opts->stats)
        *opts->stats = F.st;
    free(F.row0);
    free(F.tok_h);
    free(F.groups);
    return st;
}
