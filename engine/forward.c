/* DeepSeek-V4 forward on the kernel table.  Buffers carry their shapes in
 * comments: R = rows of the batch (all items' tokens), D = hidden size,
 * H = heads, hd = head_dim, hc = hyper-connection streams. */
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "log.h"
#include "ref_math.h"

duet_fault_t duet_forward_fault = DUET_FAULT_NONE;

duet_status_t duet_seq_init(duet_kv_cache_t *c, duet_seq_t *s, duet_err_t *err)
{
    memset(s, 0, sizeof *s);
    duet_status_t st = duet_kv_cache_alloc_slot(c, &s->slot);
    if (st != DUET_OK)
        return duet_err_set(err, st, "no free request slot (all %u in use)", duet_kv_cache_n_slots(c));
    s->has_slot = 1;
    return DUET_OK;
}

duet_status_t duet_seq_reserve(duet_kv_cache_t *c, duet_seq_t *s, int64_t n_tokens, duet_err_t *err)
{
    int64_t pt = duet_kv_cache_opts(c)->page_tokens;
    uint32_t need = (uint32_t)((n_tokens + pt - 1) / pt);
    if (need <= s->n_pages)
        return DUET_OK;
    if (need > s->cap_pages) {
        uint32_t cap = s->cap_pages ? s->cap_pages : 4;
        while (cap < need)
            cap *= 2;
        uint32_t *np = realloc(s->pages, sizeof(uint32_t) * cap);
        if (!np)
            return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        s->pages = np;
        s->cap_pages = cap;
    }
    duet_status_t st = duet_kv_cache_alloc_pages(c, need - s->n_pages, s->pages + s->n_pages);
    if (st != DUET_OK)
        return duet_err_set(err, st, "need %u more cache pages, %u free", need - s->n_pages,
                            duet_kv_cache_free_page_count(c));
    s->n_pages = need;
    return DUET_OK;
}

void duet_seq_release(duet_kv_cache_t *c, duet_seq_t *s)
{
    if (s->n_pages)
        duet_kv_cache_free_pages(c, s->pages, s->n_pages);
    if (s->has_slot)
        duet_kv_cache_free_slot(c, s->slot);
    free(s->pages);
    memset(s, 0, sizeof *s);
}

/* ---- scratch ---------------------------------------------------------- */

typedef struct {
    const duet_model_t *m;
    const duet_model_config_t *c;
    const duet_kernels_t *k;
    duet_kv_cache_t *cache;
    duet_fwd_item_t *items;
    int n_items;
    int R;              /* rows */
    int32_t *tok;       /* (R) */
    int64_t *pos;       /* (R) */
    int *row0;          /* (n_items) first row of each item */
    float *h;           /* (R, hc, D) residual streams */
    float *x;           /* (R, D) collapsed */
    float *xn;          /* (R, D) normed block input */
    float *f;           /* (R, D) block output */
    float *post;        /* (R, hc) */
    float *comb;        /* (R, hc, hc) */
} fwd_t;

#define ALLOC_F(n) ((float *)duet_malloc_array((size_t)(n), sizeof(float)))

static float softplusf_(float x) { return x > 20.0f ? x : duet_ref_log1pf(duet_ref_expf(x)); }

/* Encode then decode one vector with a pool's layout, so it carries the cache's rounding. */
static void cache_round_trip(const duet_kernels_t *k, const duet_cache_layout_t *l, uint8_t *tmp, const float *v,
                             float *out)
{
    k->cache_store(l, tmp, 0, v);
    k->cache_load(l, tmp, 0, out);
}

/* Address of entry `e` of a paged pool for sequence s: (page, index in page). */
static uint8_t *paged_entry(const duet_cache_layer_t *v, duet_pool_kind_t kind, const duet_seq_t *s, int64_t e,
                            uint32_t *idx)
{
    uint32_t epp = v->layout[kind]->entries_per_page;
    *idx = (uint32_t)(e % epp);
    return duet_cache_layer_unit(v, kind, s->pages[e / epp]);
}

/* Insert rows into a compressor's state ring and emit entries for every window that closes.
 * proj_kv/proj_gate: (n, coff*dim) for the n rows at positions p0..p0+n-1 (gate without ape).
 * State rows hold [kv (coff*dim) | gate+ape (coff*dim)] at `row_off` floats into the slot's row. */
static void compressor_run(fwd_t *F, const duet_cache_layer_t *v, const duet_compressor_t *cp, duet_seq_t *s,
                           int64_t p0, int n, const float *proj_kv, const float *proj_gate, int row_off,
                           duet_pool_kind_t out_pool, const float *scratch_unused)
{
    const duet_kernels_t *k = F->k;
    const duet_cache_layout_t *sl = v->layout[cp->ratio == 4 ? DUET_POOL_STATE_C4 : DUET_POOL_STATE_C128];
    float *state = (float *)duet_cache_layer_unit(v, sl->kind, s->slot);
    int ratio = cp->ratio, dim = cp->dim, width = cp->coff * dim;
    int ring = cp->coff * ratio;         /* rows kept: two windows with overlap, one without */
    int stride = (int)sl->vec_dim;       /* floats per state row */
    float *slots_kv = ALLOC_F((size_t)2 * ratio * dim), *slots_g = ALLOC_F((size_t)2 * ratio * dim);
    float *ent = ALLOC_F(dim);
    int64_t epos[1];
    (void)scratch_unused;
    for (int i = 0; i < n; i++) {
        int64_t p = p0 + i;
        float *row = state + (size_t)(p % ring) * stride + row_off;
        const float *ape = cp->ape + (size_t)(p % ratio) * width;
        for (int c = 0; c < width; c++) {
            row[c] = proj_kv[(size_t)i * width + c];
            row[width + c] = proj_gate[(size_t)i * width + c] + ape[c];
        }
        if ((p + 1) % ratio)
            continue;
        int64_t w = p / ratio; /* entry index; its rope position is w * ratio */
        int ns = 0;
        if (cp->coff == 2) {
            /* Ca (first half) of window w-1, when there is one; Cb (second half) of window w */
            if (w > 0 && duet_forward_fault != DUET_FAULT_OVERLAP)
                for (int j = 0; j < ratio; j++) {
                    const float *r = state + (size_t)(((w - 1) * ratio + j) % ring) * stride + row_off;
                    memcpy(slots_kv + (size_t)ns * dim, r, sizeof(float) * dim);
                    memcpy(slots_g + (size_t)ns * dim, r + width, sizeof(float) * dim);
                    ns++;
                }
            for (int j = 0; j < ratio; j++) {
                const float *r = state + (size_t)((w * ratio + j) % ring) * stride + row_off;
                memcpy(slots_kv + (size_t)ns * dim, r + dim, sizeof(float) * dim);
                memcpy(slots_g + (size_t)ns * dim, r + width + dim, sizeof(float) * dim);
                ns++;
            }
        } else {
            for (int j = 0; j < ratio; j++) {
                const float *r = state + (size_t)((w * ratio + j) % ring) * stride + row_off;
                memcpy(slots_kv + (size_t)ns * dim, r, sizeof(float) * dim);
                memcpy(slots_g + (size_t)ns * dim, r + width, sizeof(float) * dim);
                ns++;
            }
        }
        k->compress_pool(slots_kv, slots_g, ns, dim, dim, ent);
        k->rmsnorm(ent, cp->norm, 1, dim, (float)F->c->rms_norm_eps, ent);
        epos[0] = w * ratio;
        k->rope(ent, 1, 1, dim, epos, &F->m->rope_compress, 1);
        uint32_t idx;
        uint8_t *page = paged_entry(v, out_pool, s, w, &idx);
        k->cache_store(v->layout[out_pool], page, idx, ent);
    }
    free(slots_kv);
    free(slots_g);
    free(ent);
}

/* Attention block for all rows: F->xn -> F->f. */
static duet_status_t attention(fwd_t *F, int layer, duet_err_t *err)
{
    const duet_model_config_t *c = F->c;
    const duet_kernels_t *k = F->k;
    const duet_layer_weights_t *lw = &F->m->layers[layer];
    int R = F->R, D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim, qr = c->q_lora_rank;
    int W = c->sliding_window, G = c->o_groups, orank = c->o_lora_rank;
    int ih = c->index_n_heads, id = c->index_head_dim;
    float eps = (float)c->rms_norm_eps;
    const duet_rope_t *rope = duet_model_layer_rope(F->m, layer);
    if (duet_forward_fault == DUET_FAULT_ROPE)
        rope = &F->m->rope_main;
    duet_cache_layer_t v;
    duet_status_t st = duet_kv_cache_layer(F->cache, layer, &v);
    if (st != DUET_OK)
        return duet_err_set(err, st, "layer %d cache is not available", layer);

    float *qlora = ALLOC_F((size_t)R * qr);      /* (R, qr) */
    float *q = ALLOC_F((size_t)R * H * hd);      /* (R, H, hd) */
    float *kv = ALLOC_F((size_t)R * hd);         /* (R, hd) */
    float *att = ALLOC_F((size_t)R * H * hd);    /* (R, H, hd) */
    float *ckv = NULL, *cg = NULL, *ikv = NULL, *ig = NULL, *iq = NULL, *iw = NULL;
    k->matmul(&lw->wq_a, 0, qr, F->xn, R, qlora);
    k->rmsnorm(qlora, lw->q_norm, R, qr, eps, qlora);
    k->matmul(&lw->wq_b, 0, H * hd, qlora, R, q);
    k->rmsnorm(q, NULL, R * H, hd, eps, q);
    k->rope(q, R, H, hd, F->pos, rope, 1);
    k->matmul(&lw->wkv, 0, hd, F->xn, R, kv);
    k->rmsnorm(kv, lw->kv_norm, R, hd, eps, kv);
    k->rope(kv, R, 1, hd, F->pos, rope, 1);
    if (lw->ratio) {
        int w = lw->comp.coff * hd;
        ckv = ALLOC_F((size_t)R * w);
        cg = ALLOC_F((size_t)R * w);
        k->matmul(&lw->comp.wkv, 0, w, F->xn, R, ckv);
        k->matmul(&lw->comp.wgate, 0, w, F->xn, R, cg);
    }
    if (lw->ratio == 4) {
        ikv = ALLOC_F((size_t)R * 2 * id);
        ig = ALLOC_F((size_t)R * 2 * id);
        iq = ALLOC_F((size_t)R * ih * id);
        iw = ALLOC_F((size_t)R * ih);
        k->matmul(&lw->icomp.wkv, 0, 2 * id, F->xn, R, ikv);
        k->matmul(&lw->icomp.wgate, 0, 2 * id, F->xn, R, ig);
        k->matmul(&lw->idx_wq_b, 0, ih * id, qlora, R, iq);
        k->rope(iq, R, ih, id, F->pos, &F->m->rope_compress, 1);
        k->matmul(&lw->idx_weights_proj, 0, ih, F->xn, R, iw);
        float ws = 1.0f / sqrtf((float)ih);
        for (size_t i = 0; i < (size_t)R * ih; i++)
            iw[i] *= ws;
    }

    const duet_cache_layout_t *swa_l = v.layout[DUET_POOL_SWA_KV];
    uint8_t *tmp = duet_alloc_aligned(1, swa_l->page_bytes);
    float scale = 1.0f / sqrtf((float)hd);
    float *sinks = ALLOC_F(H); /* (H) */
    for (int h = 0; h < H; h++)
        sinks[h] = duet_forward_fault == DUET_FAULT_SINK ? -INFINITY : lw->attn_sink[h];
    for (int it = 0; it < F->n_items; it++) {
        duet_fwd_item_t *item = &F->items[it];
        duet_seq_t *s = item->seq;
        int r0 = F->row0[it], n = item->n_tokens;
        int64_t P = s->n_past, total = P + n;
        /* 1. compressors: state rows in, closed windows out to the pools */
        if (lw->ratio == 4) {
            compressor_run(F, &v, &lw->comp, s, P, n, ckv + (size_t)r0 * 2 * hd, cg + (size_t)r0 * 2 * hd, 0,
                           DUET_POOL_C4_KV, NULL);
            compressor_run(F, &v, &lw->icomp, s, P, n, ikv + (size_t)r0 * 2 * id, ig + (size_t)r0 * 2 * id,
                           4 * hd, DUET_POOL_C4_INDEX_K, NULL);
        } else if (lw->ratio == 128) {
            compressor_run(F, &v, &lw->comp, s, P, n, ckv + (size_t)r0 * hd, cg + (size_t)r0 * hd, 0,
                           DUET_POOL_C128_KV, NULL);
        }
        /* 2. decoded compressed entries of this sequence (every entry any row may see) */
        int64_t n_ent = lw->ratio ? total / lw->ratio : 0;
        float *ent = NULL, *ikeys = NULL;
        if (n_ent) {
            if (lw->ratio == 128) { /* every row attends to all entries it may see */
                ent = ALLOC_F((size_t)n_ent * hd);
                for (int64_t e = 0; e < n_ent; e++) {
                    uint32_t idx;
                    const uint8_t *pg = paged_entry(&v, DUET_POOL_C128_KV, s, e, &idx);
                    k->cache_load(v.layout[DUET_POOL_C128_KV], pg, idx, ent + (size_t)e * hd);
                }
            } else { /* C4: every indexer key is scored; only the selected K=V entries are decoded */
                ikeys = ALLOC_F((size_t)n_ent * id);
                for (int64_t e = 0; e < n_ent; e++) {
                    uint32_t idx;
                    const uint8_t *pg = paged_entry(&v, DUET_POOL_C4_INDEX_K, s, e, &idx);
                    k->cache_load(v.layout[DUET_POOL_C4_INDEX_K], pg, idx, ikeys + (size_t)e * id);
                }
            }
        }
        /* 3. sliding-window keys: up to W-1 cached positions, then this chunk's rows */
        int64_t base = P - (P < W - 1 ? P : W - 1);
        int n_win = (int)(P - base) + n;
        float *win = ALLOC_F((size_t)n_win * hd);
        uint8_t *ring = duet_cache_layer_unit(&v, DUET_POOL_SWA_KV, s->slot);
        for (int64_t t = base; t < P; t++)
            k->cache_load(swa_l, ring, (uint32_t)(t % W), win + (size_t)(t - base) * hd);
        for (int i = 0; i < n; i++)
            cache_round_trip(k, swa_l, tmp, kv + (size_t)(r0 + i) * hd, win + (size_t)(P - base + i) * hd);
        /* 4. per row: window + compressed keys, attention, inverse rope */
        int max_keys = W + 1 + (int)(lw->ratio == 4 ? (n_ent < c->index_topk ? n_ent : c->index_topk) : n_ent);
        float *keys = ALLOC_F((size_t)(max_keys > 0 ? max_keys : 1) * hd);
        float *score = ALLOC_F(n_ent > 0 ? n_ent : 1);
        int32_t *sel = malloc(sizeof(int32_t) * (size_t)(c->index_topk > 0 ? c->index_topk : 1));
        for (int i = 0; i < n; i++) {
            int r = r0 + i;
            int64_t p = P + i;
            int64_t span = duet_forward_fault == DUET_FAULT_MASK ? W : W - 1;
            int64_t lo = p - span > base ? p - span : base;
            int nk = (int)(p - lo + 1);
            memcpy(keys, win + (size_t)(lo - base) * hd, sizeof(float) * (size_t)nk * hd);
            if (lw->ratio == 128) {
                int64_t nv = (p + 1) / 128;
                memcpy(keys + (size_t)nk * hd, ent, sizeof(float) * (size_t)nv * hd);
                nk += (int)nv;
            } else if (lw->ratio == 4) {
                int nv = (int)((p + 1) / 4);
                if (nv > 0) {
                    k->index_score(iq + (size_t)r * ih * id, iw + (size_t)r * ih, ih, id, ikeys, nv,
                                   1.0f / sqrtf((float)id), score);
                    int kk = nv < c->index_topk ? nv : c->index_topk;
                    k->topk(score, nv, kk, sel);
                    for (int j = 0; j < kk; j++) {
                        uint32_t idx;
                        const uint8_t *pg = paged_entry(&v, DUET_POOL_C4_KV, s, sel[j], &idx);
                        k->cache_load(v.layout[DUET_POOL_C4_KV], pg, idx, keys + (size_t)(nk + j) * hd);
                    }
                    nk += kk;
                }
            }
            k->attn_row(q + (size_t)r * H * hd, H, hd, keys, nk, sinks, scale, att + (size_t)r * H * hd);
        }
        /* 5. this chunk's K=V into the ring (after every row has read the old contents) */
        for (int i = (n > W ? n - W : 0); i < n; i++)
            k->cache_store(swa_l, ring, (uint32_t)((P + i) % W), kv + (size_t)(r0 + i) * hd);
        free(keys);
        free(score);
        free(sel);
        free(win);
        free(ent);
        free(ikeys);
    }
    k->rope(att, R, H, hd, F->pos, rope, -1);

    /* grouped output projection: group g = heads [g*H/G, (g+1)*H/G) through wo_a rows [g*orank, (g+1)*orank) */
    int gin = H * hd / G;
    float *gx = ALLOC_F((size_t)R * gin);        /* (R, gin) */
    float *gy = ALLOC_F((size_t)R * orank);      /* (R, orank) */
    float *mid = ALLOC_F((size_t)R * G * orank); /* (R, G*orank) */
    for (int g = 0; g < G; g++) {
        for (int r = 0; r < R; r++)
            memcpy(gx + (size_t)r * gin, att + (size_t)r * H * hd + (size_t)g * gin, sizeof(float) * gin);
        k->matmul(&lw->wo_a, g * orank, (g + 1) * orank, gx, R, gy);
        for (int r = 0; r < R; r++)
            memcpy(mid + (size_t)r * G * orank + (size_t)g * orank, gy + (size_t)r * orank, sizeof(float) * orank);
    }
    k->matmul(&lw->wo_b, 0, D, mid, R, F->f);

    free(gx); free(gy); free(mid); free(tmp); free(sinks);
    free(qlora); free(q); free(kv); free(att);
    free(ckv); free(cg); free(ikv); free(ig); free(iq); free(iw);
    return DUET_OK;
}

void duet_moe_route_row(const float *logit, int E, int K, duet_score_fn_t scoring, int norm, float scale,
                        const float *bias, const int32_t *hash_ids, float *scratch, int32_t *sel, float *w)
{
    float *sc = scratch, *biased = scratch + E;
    for (int e = 0; e < E; e++) {
        float z = logit[e];
        sc[e] = scoring == DUET_SCORE_SQRTSOFTPLUS ? sqrtf(softplusf_(z))
                : scoring == DUET_SCORE_SIGMOID    ? duet_ref_sigmoidf(z)
                                                   : z;
    }
    if (scoring == DUET_SCORE_SOFTMAX) {
        float mx = -INFINITY, s = 0.0f;
        for (int e = 0; e < E; e++)
            mx = sc[e] > mx ? sc[e] : mx;
        for (int e = 0; e < E; e++)
            s += (sc[e] = duet_ref_expf(sc[e] - mx));
        for (int e = 0; e < E; e++)
            sc[e] /= s;
    }
    if (hash_ids) {
        memcpy(sel, hash_ids, sizeof(int32_t) * (size_t)K);
    } else {
        for (int e = 0; e < E; e++)
            biased[e] = sc[e] + (bias ? bias[e] : 0.0f);
        duet_kernels()->topk(biased, E, K, sel);
    }
    float sum = 0.0f;
    for (int j = 0; j < K; j++)
        sum += sc[sel[j]];
    for (int j = 0; j < K; j++) {
        float v = sc[sel[j]];
        if (norm)
            v = v / (sum + 1e-20f);
        w[j] = v * scale;
    }
}

/* One expert's SwiGLU MLP over m rows: x(m, D) -> y(m, D). */
static void expert_mlp(fwd_t *F, const duet_expert_t *e, const float *x, int m, float *y)
{
    int D = F->c->hidden_size, I = e->w1.rows;
    float *g = ALLOC_F((size_t)m * I), *u = ALLOC_F((size_t)m * I);
    F->k->matmul(&e->w1, 0, I, x, m, g);
    F->k->matmul(&e->w3, 0, I, x, m, u);
    F->k->swiglu(g, u, m, I, (float)F->c->swiglu_limit, g);
    F->k->matmul(&e->w2, 0, D, g, m, y);
    free(g);
    free(u);
}

/* MoE block for all rows: F->xn -> F->f. */
static void moe(fwd_t *F, int layer)
{
    const duet_model_config_t *c = F->c;
    const duet_layer_weights_t *lw = &F->m->layers[layer];
    int R = F->R, D = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    float *logit = ALLOC_F((size_t)R * E);      /* (R, E) */
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)R * K);
    float *wt = ALLOC_F((size_t)R * K);
    float *scratch = ALLOC_F((size_t)2 * E);
    F->k->matmul(&lw->gate, 0, E, F->xn, R, logit);
    for (int r = 0; r < R; r++)
        duet_moe_route_row(logit + (size_t)r * E, E, K, c->scoring_func, c->norm_topk_prob,
                           (float)c->routed_scaling_factor, lw->gate_bias,
                           lw->is_hash ? lw->tid2eid + (size_t)F->tok[r] * K : NULL, scratch, sel + (size_t)r * K,
                           wt + (size_t)r * K);
    /* routed experts in ascending id; rows of one expert batched (per-row results do not depend on it) */
    memset(F->f, 0, sizeof(float) * (size_t)R * D);
    int *rows = malloc(sizeof(int) * (size_t)R);
    float *rw = ALLOC_F(R), *xg = ALLOC_F((size_t)R * D), *yg = ALLOC_F((size_t)R * D);
    for (int e = 0; e < E; e++) {
        int m = 0;
        for (int r = 0; r < R; r++)
            for (int j = 0; j < K; j++)
                if (sel[(size_t)r * K + j] == e) {
                    rows[m] = r;
                    rw[m] = wt[(size_t)r * K + j];
                    memcpy(xg + (size_t)m * D, F->xn + (size_t)r * D, sizeof(float) * D);
                    m++;
                }
        if (!m)
            continue;
        expert_mlp(F, &lw->experts[e], xg, m, yg);
        for (int i = 0; i < m; i++) {
            float *o = F->f + (size_t)rows[i] * D;
            for (int d = 0; d < D; d++)
                o[d] += yg[(size_t)i * D + d] * rw[i];
        }
    }
    if (c->n_shared_experts > 0) {
        expert_mlp(F, &lw->shared, F->xn, R, yg);
        for (size_t i = 0; i < (size_t)R * D; i++)
            F->f[i] += yg[i];
    }
    free(rows); free(rw); free(xg); free(yg);
    free(logit); free(sel); free(wt); free(scratch);
}

duet_status_t duet_fwd_items_check(const duet_model_config_t *c, const duet_kv_cache_t *cache,
                                   const duet_fwd_item_t *items, int n_items, int logits_elsewhere, int *rows,
                                   duet_err_t *err)
{
    int64_t pt = duet_kv_cache_opts(cache)->page_tokens;
    int R = 0;
    for (int i = 0; i < n_items; i++) {
        const duet_fwd_item_t *it = &items[i];
        if (!it->seq || !it->seq->has_slot || it->n_tokens <= 0 || !it->tokens)
            return duet_err_set(err, DUET_ERR_INVALID, "batch item %d: no sequence, slot or tokens", i);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq)
                return duet_err_set(err, DUET_ERR_INVALID, "batch items %d and %d share a sequence", j, i);
        int64_t total = it->seq->n_past + it->n_tokens;
        if ((int64_t)it->seq->n_pages * pt < total)
            return duet_err_set(err, DUET_ERR_NO_SPACE, "batch item %d: pages cover %lld tokens, %lld needed", i,
                                (long long)it->seq->n_pages * pt, (long long)total);
        if (total > c->max_position_embeddings)
            return duet_err_set(err, DUET_ERR_RANGE, "batch item %d: position %lld beyond the model's %lld", i,
                                (long long)total, (long long)c->max_position_embeddings);
        for (int j = 0; j < it->n_tokens; j++)
            if (it->tokens[j] < 0 || it->tokens[j] >= c->vocab_size)
                return duet_err_set(err, DUET_ERR_RANGE, "batch item %d: token id %d outside [0, %d)", i,
                                    it->tokens[j], c->vocab_size);
        if (it->logits_mode != DUET_LOGITS_NONE && !it->logits && !logits_elsewhere)
            return duet_err_set(err, DUET_ERR_INVALID, "batch item %d: logits requested without a buffer", i);
        R += it->n_tokens;
    }
    *rows = R;
    return DUET_OK;
}

duet_status_t duet_forward(const duet_model_t *m, duet_kv_cache_t *cache, duet_fwd_item_t *items, int n_items,
                           duet_err_t *err)
{
    return duet_forward_hooked(m, cache, items, n_items, NULL, NULL, err);
}

duet_status_t duet_forward_hooked(const duet_model_t *m, duet_kv_cache_t *cache, duet_fwd_item_t *items,
                                  int n_items, duet_layer_done_fn layer_done, void *arg, duet_err_t *err)
{
    const duet_model_config_t *c = &m->cfg;
    fwd_t F;
    memset(&F, 0, sizeof F);
    F.m = m;
    F.c = c;
    F.k = duet_kernels();
    F.cache = cache;
    F.items = items;
    F.n_items = n_items;
    /* validate everything before touching any cache */
    int R = 0;
    duet_status_t vst = duet_fwd_items_check(c, cache, items, n_items, 0, &R, err);
    if (vst != DUET_OK)
        return vst;
    if (R == 0)
        return DUET_OK;
    int D = c->hidden_size, hc = c->hc_mult;
    F.R = R;
    F.tok = malloc(sizeof(int32_t) * (size_t)R);
    F.pos = malloc(sizeof(int64_t) * (size_t)R);
    F.row0 = malloc(sizeof(int) * (size_t)n_items);
    F.h = ALLOC_F((size_t)R * hc * D);
    F.x = ALLOC_F((size_t)R * D);
    F.xn = ALLOC_F((size_t)R * D);
    F.f = ALLOC_F((size_t)R * D);
    F.post = ALLOC_F((size_t)R * hc);
    F.comb = ALLOC_F((size_t)R * hc * hc);
    duet_status_t st = DUET_OK;
    if (!F.tok || !F.pos || !F.row0 || !F.h || !F.x || !F.xn || !F.f || !F.post || !F.comb) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory for %d rows", R);
        goto out;
    }
    for (int i = 0, r = 0; i < n_items; i++) {
        F.row0[i] = r;
        for (int j = 0; j < items[i].n_tokens; j++, r++) {
            F.tok[r] = items[i].tokens[j];
            F.pos[r] = items[i].seq->n_past + j;
        }
    }
    /* embedding, copied into every stream: h (R, hc, D) */
    for (int r = 0; r < R; r++) {
        float *hr = F.h + (size_t)r * hc * D;
        for (int d = 0; d < D; d++) {
            size_t o = (size_t)F.tok[r] * D + d;
            hr[d] = m->embed.dtype == DUET_DT_BF16 ? duet_bf16_to_f32(((const uint16_t *)m->embed.data)[o])
                                                   : ((const float *)m->embed.data)[o];
        }
        for (int s = 1; s < hc; s++)
            memcpy(hr + (size_t)s * D, hr, sizeof(float) * D);
    }
    float eps = (float)c->rms_norm_eps, hc_eps = (float)c->hc_eps;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const duet_layer_weights_t *lw = &m->layers[l];
        F.k->hc_pre(F.h, R, hc, D, lw->hc_attn_fn, lw->hc_attn_base, lw->hc_attn_scale, c->hc_sinkhorn_iters,
                    hc_eps, eps, F.post, F.comb, F.x);
        F.k->rmsnorm(F.x, lw->attn_norm, R, D, eps, F.xn);
        st = attention(&F, l, err);
        if (st != DUET_OK)
            goto out;
        if (layer_done && (st = layer_done(arg, l)) != DUET_OK) {
            duet_err_set(err, st, "layer %d: the layer hook failed", l);
            goto out;
        }
        F.k->hc_post(F.h, R, hc, D, F.f, F.post, F.comb);
        F.k->hc_pre(F.h, R, hc, D, lw->hc_ffn_fn, lw->hc_ffn_base, lw->hc_ffn_scale, c->hc_sinkhorn_iters, hc_eps,
                    eps, F.post, F.comb, F.x);
        F.k->rmsnorm(F.x, lw->ffn_norm, R, D, eps, F.xn);
        moe(&F, l);
        F.k->hc_post(F.h, R, hc, D, F.f, F.post, F.comb);
    }
    F.k->hc_head(F.h, R, hc, D, m->hc_head_fn, m->hc_head_base, m->hc_head_scale, hc_eps, eps, F.x);
    F.k->rmsnorm(F.x, m->norm, R, D, eps, F.xn);
    for (int i = 0; i < n_items; i++) {
        duet_fwd_item_t *it = &items[i];
        if (it->logits_mode == DUET_LOGITS_LAST)
            F.k->matmul(&m->head, 0, c->vocab_size, F.xn + (size_t)(F.row0[i] + it->n_tokens - 1) * D, 1,
                        it->logits);
        else if (it->logits_mode == DUET_LOGITS_ALL)
            F.k->matmul(&m->head, 0, c->vocab_size, F.xn + (size_t)F.row0[i] * D, it->n_tokens, it->logits);
        it->seq->n_past += it->n_tokens;
    }
out:
    free(F.tok); free(F.pos); free(F.row0); free(F.h); free(F.x); free(F.xn); free(F.f);
    free(F.post); free(F.comb);
    return st;
}
