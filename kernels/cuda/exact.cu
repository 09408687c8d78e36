/* The CPU-exact forms (contract in exact.cuh): kernels/cpu/'s operations in their order,
 * ref_math.h's arithmetic (each operation rounded, none fused). */
#include "cache_codec.cuh"
#include "exact.cuh"

#define EX_THREADS 128
/* mixes of a hyper-connection row: (2 + hc) hc for hc up to 16 */
#define EX_HC_MAX 16
#define EX_MIX_MAX ((2 + EX_HC_MAX) * EX_HC_MAX)

static unsigned ex_blocks(size_t n)
{
    size_t b = (n + EX_THREADS - 1) / EX_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535u * 16u ? 65535u * 16u : b);
}

/* ---- matmul --------------------------------------------------------------------------------- */

struct ex_weight {
    int dtype, cols, scale_f32, scale_cols;
    const void *data, *scale;
};

/* Eight threads an output row (an "octet"), thread j the CPU's lane j: its partial sum over
 * columns j, j + 8, ... in order, for up to EX_MM_T tokens at once (each weight value read once
 * for them); the lanes then added in the CPU's tree ((a0 + a1) + (a2 + a3)) + ((a4 + a5) +
 * (a6 + a7)) by three xor shuffles (an IEEE add is commutative, so every lane ends with the
 * same bits).  fp8: the same per 128-column block, each block's sum times its scale into the
 * token's total in block order.  fp4: the CPU sums a 32-column group in column order, so lane j
 * takes groups j, j + 8, ... whole, and the groups' sums times their scales are added in group
 * order from the lanes by shuffles.  Octets are walked warp by warp (all 32 lanes reach every
 * shuffle; an octet past the end computes nothing and stores nothing). */
#define EX_MM_T 8

__device__ __forceinline__ float ex_lanes_sum(float v)
{
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
}

/* value c of a bf16 or f32 weight row */
__device__ __forceinline__ float ex_weight_at(const ex_weight &w, const uint8_t *row, int c)
{
    return w.dtype == DUET_DT_BF16 ? duet_d_bf16_to_f32(((const uint16_t *)row)[c]) : ((const float *)row)[c];
}

/* scale i of a scale row, f32 or e8m0 (the CPU's scale_at) */
__device__ __forceinline__ float ex_scale_at(const void *row, int f32, int i)
{
    return f32 ? ((const float *)row)[i] : duet_d_e8m0_to_f32(((const uint8_t *)row)[i]);
}

__global__ void __launch_bounds__(EX_THREADS) exact_matmul_kernel(ex_weight w, int row_begin, int m, const float *x,
                                                                   int n, float *y)
{
    duet_pdl_wait();
    __shared__ float lut[256];
    if (w.dtype == DUET_DT_F8_E4M3) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) {
            float v = duet_d_e4m3_to_f32((uint8_t)i);
            lut[i] = v != v ? 0.0f : v; /* NaN codes inert, as the CPU's table */
        }
        __syncthreads();
    }
    const int j = threadIdx.x & 7, cols = w.cols;
    const size_t chunks = ((size_t)n + EX_MM_T - 1) / EX_MM_T, octets = (size_t)m * chunks;
    const size_t per_pass = ((size_t)gridDim.x * blockDim.x) >> 3;
    size_t first = ((size_t)blockIdx.x * blockDim.x + (threadIdx.x & ~31u)) >> 3; /* the warp's first octet */
    for (size_t base = first; base < octets; base += per_pass) {
        size_t o = base + ((threadIdx.x & 31) >> 3);
        bool on = o < octets;
        int r = on ? row_begin + (int)(o % (size_t)m) : row_begin;
        int t0 = on ? (int)(o / (size_t)m) * EX_MM_T : 0;
        int nt = on ? min(EX_MM_T, n - t0) : 0;
        const float *xt = x + (size_t)t0 * cols;
        float acc[EX_MM_T];
#pragma unroll
        for (int t = 0; t < EX_MM_T; t++)
            acc[t] = 0.0f;
        if (w.dtype == DUET_DT_BF16 || w.dtype == DUET_DT_F32) {
            const uint8_t *row = (const uint8_t *)w.data + (size_t)r * cols * (w.dtype == DUET_DT_BF16 ? 2 : 4);
            for (int c = j; c < (on ? cols : 0); c += 8) {
                float wv = ex_weight_at(w, row, c);
#pragma unroll
                for (int t = 0; t < EX_MM_T; t++)
                    if (t < nt)
                        acc[t] = __fadd_rn(acc[t], __fmul_rn(xt[(size_t)t * cols + c], wv));
            }
#pragma unroll
            for (int t = 0; t < EX_MM_T; t++)
                acc[t] = ex_lanes_sum(acc[t]);
        } else if (w.dtype == DUET_DT_F8_E4M3) {
            const uint8_t *row = (const uint8_t *)w.data + (size_t)r * cols;
            size_t so = (size_t)(r / 128) * w.scale_cols;
            const void *sr = w.scale_f32 ? (const void *)((const float *)w.scale + so)
                                         : (const void *)((const uint8_t *)w.scale + so);
            for (int c0 = 0; c0 < cols; c0 += 128) { /* every lane, on or not: the shuffles */
                int c1 = c0 + 128 < cols ? c0 + 128 : cols;
                float part[EX_MM_T];
#pragma unroll
                for (int t = 0; t < EX_MM_T; t++)
                    part[t] = 0.0f;
                for (int c = c0 + j; c < (on ? c1 : 0); c += 8) {
                    float wv = lut[row[c]];
#pragma unroll
                    for (int t = 0; t < EX_MM_T; t++)
                        if (t < nt)
                            part[t] = __fadd_rn(part[t], __fmul_rn(xt[(size_t)t * cols + c], wv));
                }
                float sc = on ? ex_scale_at(sr, w.scale_f32, c0 / 128) : 0.0f;
#pragma unroll
                for (int t = 0; t < EX_MM_T; t++)
                    acc[t] = __fadd_rn(acc[t], __fmul_rn(ex_lanes_sum(part[t]), sc));
            }
        } else { /* fp4 */
            const uint8_t *row = (const uint8_t *)w.data + (size_t)r * (cols / 2);
            size_t so = (size_t)r * w.scale_cols;
            const void *sr = w.scale_f32 ? (const void *)((const float *)w.scale + so)
                                         : (const void *)((const uint8_t *)w.scale + so);
            int groups = cols / 32;
            for (int g0 = 0; g0 < groups; g0 += 8) {
                int g = g0 + j;
                float part[EX_MM_T];
#pragma unroll
                for (int t = 0; t < EX_MM_T; t++)
                    part[t] = 0.0f;
                if (on && g < groups)
                    for (int c = g * 32; c < g * 32 + 32; c += 2) {
                        uint8_t b = row[c / 2];
                        float lo = duet_d_e2m1_to_f32(b & 0xfu), hi = duet_d_e2m1_to_f32((uint32_t)b >> 4);
#pragma unroll
                        for (int t = 0; t < EX_MM_T; t++)
                            if (t < nt) {
                                part[t] = __fadd_rn(part[t], __fmul_rn(xt[(size_t)t * cols + c], lo));
                                part[t] = __fadd_rn(part[t], __fmul_rn(xt[(size_t)t * cols + c + 1], hi));
                            }
                    }
                for (int l = 0; l < 8; l++) { /* the groups in order, from their lanes */
                    float sc = on && g0 + l < groups ? ex_scale_at(sr, w.scale_f32, g0 + l) : 0.0f;
#pragma unroll
                    for (int t = 0; t < EX_MM_T; t++) {
                        float p = __shfl_sync(0xffffffffu, part[t], (int)(threadIdx.x & 24u) | l);
                        if (g0 + l < groups)
                            acc[t] = __fadd_rn(acc[t], __fmul_rn(p, sc));
                    }
                }
            }
        }
        if (on && j == 0)
            for (int t = 0; t < nt; t++)
                y[(size_t)(t0 + t) * m + (r - row_begin)] = acc[t];
    }
}

duet_status_t duet_cuda_exact_matmul(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                     const float *x, int n, float *y)
{
    int m = row_end - row_begin;
    if (n <= 0 || m <= 0)
        return DUET_OK;
    if (w->tiled)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul: a tiled weight has no CPU-exact form (upload the "
                               "weights untiled in CPU-exact mode)");
    if (w->dtype != DUET_DT_BF16 && w->dtype != DUET_DT_F32 && w->dtype != DUET_DT_F8_E4M3 &&
        w->dtype != DUET_DT_F4_E2M1X2)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul: weight dtype %d", (int)w->dtype);
    if ((w->dtype == DUET_DT_F8_E4M3 || w->dtype == DUET_DT_F4_E2M1X2) && !w->scale)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "matmul: a block-scaled weight without its scales");
    if (w->dtype == DUET_DT_F4_E2M1X2 && w->cols % 32)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul: fp4 columns %d not a multiple of 32", w->cols);
    ex_weight ew = {(int)w->dtype, w->cols, w->scale_dtype == DUET_DT_F32, w->scale_cols, w->data, w->scale};
    size_t octets = (size_t)m * (((size_t)n + EX_MM_T - 1) / EX_MM_T);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, exact_matmul_kernel, dim3(ex_blocks(8 * octets)), dim3(EX_THREADS), 0,
                                        ew, row_begin, m, x, n, y));
    return DUET_OK;
}

/* ---- rmsnorm -------------------------------------------------------------------------------- */

/* a block a row: its first thread sums the squares in column order, then every thread scales
 * its columns (x may equal y: each column is read before it is written, by the same thread) */
__global__ void __launch_bounds__(EX_THREADS) exact_rmsnorm_kernel(const float *x, const float *weight, int dim,
                                                                    float eps, float *y)
{
    duet_pdl_wait();
    __shared__ float inv_s;
    const float *xi = x + (size_t)blockIdx.x * dim;
    float *yi = y + (size_t)blockIdx.x * dim;
    if (threadIdx.x == 0)
        inv_s = duet_ref_rms_inv(duet_ref_dot(xi, xi, dim), dim, eps);
    __syncthreads();
    float inv = inv_s;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float v = __fmul_rn(xi[c], inv);
        yi[c] = weight ? __fmul_rn(weight[c], v) : v;
    }
}

duet_status_t duet_cuda_exact_rmsnorm(duet_cuda_t *c, const float *x, const float *weight, int n, int dim, float eps,
                                      float *y)
{
    if (n <= 0 || dim <= 0)
        return DUET_OK;
    for (int r0 = 0; r0 < n; r0 += 1 << 30) { /* grid.x up to 2^31 - 1 */
        int nr = n - r0 < (1 << 30) ? n - r0 : 1 << 30;
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, exact_rmsnorm_kernel, dim3(nr), dim3(EX_THREADS), 0,
                                            x + (size_t)r0 * dim, weight, dim, eps, y + (size_t)r0 * dim));
    }
    return DUET_OK;
}

/* ---- attention ------------------------------------------------------------------------------ */

/* a block a (row, head), duet_cpu_attn_row's steps: the keys' logits (a thread a key, each
 * dot product in column order) into lg, the block's slice of scratch; the first thread the
 * largest logit with the sink, then each key's e^(l - max) in key order into lg and the
 * denominator from the sink's term on; then a thread a column, its output summed key by key
 * (each key's probability lg / denominator recomputed: the same operation, the same bits) */
__global__ void __launch_bounds__(EX_THREADS) exact_attn_kernel(const float *q, int n_rows, int n_heads, int dim,
                                                                 const float *keys, const int32_t *key_off,
                                                                 const int32_t *n_keys, const float *sinks,
                                                                 float scale, float *out, float *scratch,
                                                                 int max_keys)
{
    duet_pdl_wait();
    __shared__ float denom_s;
    size_t total = (size_t)n_rows * n_heads;
    for (size_t t = blockIdx.x; t < total; t += gridDim.x) {
        int b = (int)(t / n_heads), h = (int)(t % n_heads);
        const float *qh = q + t * dim;
        float *oh = out + t * dim;
        const float *kb = keys + (size_t)key_off[b] * dim;
        int nk = min(n_keys[b], max_keys);
        float *lg = scratch + (size_t)blockIdx.x * max_keys;
        for (int k = threadIdx.x; k < nk; k += blockDim.x)
            lg[k] = __fmul_rn(duet_ref_dot(qh, kb + (size_t)k * dim, dim), scale);
        __syncthreads();
        if (threadIdx.x == 0) {
            float mx = sinks[h];
            for (int k = 0; k < nk; k++)
                if (lg[k] > mx)
                    mx = lg[k];
            float den = duet_ref_expf(__fsub_rn(sinks[h], mx));
            for (int k = 0; k < nk; k++) {
                lg[k] = duet_ref_expf(__fsub_rn(lg[k], mx));
                den = __fadd_rn(den, lg[k]);
            }
            denom_s = den;
        }
        __syncthreads();
        float den = denom_s;
        for (int cc = threadIdx.x; cc < dim; cc += blockDim.x) {
            float acc = 0.0f;
            for (int k = 0; k < nk; k++)
                acc = __fadd_rn(acc, __fmul_rn(__fdiv_rn(lg[k], den), kb[(size_t)k * dim + cc]));
            oh[cc] = acc;
        }
        __syncthreads(); /* lg and denom_s are the next pair's */
    }
}

duet_status_t duet_cuda_exact_attn_rows(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim,
                                        const float *keys, const int32_t *key_off, const int32_t *n_keys,
                                        int max_keys, const float *sinks, float scale, float *out)
{
    size_t total = (size_t)n_rows * n_heads;
    if (!total || dim <= 0)
        return DUET_OK;
    if (max_keys < 1)
        max_keys = 1;
    /* a block a (row, head) while the logits' scratch stays under 256 MiB; the blocks walk the rest */
    size_t blocks = total, cap = ((size_t)256 << 20) / (4 * (size_t)max_keys);
    if (blocks > cap)
        blocks = cap > 0 ? cap : 1;
    if (blocks > (1u << 30))
        blocks = 1u << 30;
    void *scratch = NULL;
    DUET_TRY(duet_cuda_scratch(c, blocks * (size_t)max_keys * 4, &scratch));
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, exact_attn_kernel, dim3((unsigned)blocks), dim3(EX_THREADS), 0, q, n_rows,
                                        n_heads, dim, keys, key_off, n_keys, sinks, scale, out, (float *)scratch,
                                        max_keys));
    return DUET_OK;
}

/* ---- indexer scores ------------------------------------------------------------------------- */

struct ex_keys {
    const float *f32; /* fp32 keys, or NULL: the pool below */
    entry_geom g;
    const uint8_t *base;
    const uint32_t *unit, *idx;
};

/* one thread a (row, key): duet_cpu_index_score's sum over the heads of relu(q_h · k) * scale *
 * w_h, each q_h · k in column order; a pool's key values decoded as duet_cuda_cache_load decodes
 * them (index_entry_value) */
__global__ void __launch_bounds__(EX_THREADS) exact_index_kernel(const float *q, const float *w, int n_heads, int dim,
                                                                  ex_keys ks, const int32_t *key_off,
                                                                  const int32_t *n_keys, const int32_t *score_off,
                                                                  float scale, float *score)
{
    duet_pdl_wait();
    int b = blockIdx.y;
    int kk = blockIdx.x * blockDim.x + threadIdx.x;
    if (kk >= n_keys[b])
        return;
    size_t e = (size_t)key_off[b] + kk;
    const float *qb = q + (size_t)b * n_heads * dim, *wb = w + (size_t)b * n_heads;
    const float *kf = ks.f32 ? ks.f32 + e * dim : NULL;
    const uint8_t *row = NULL;
    float ksc = 0.0f;
    if (!kf) {
        const uint8_t *page = ks.base + (size_t)ks.unit[e] * ks.g.page_bytes;
        uint32_t ix = ks.idx[e];
        row = page + (size_t)ix * ks.g.entry_data_bytes;
        if (ks.g.mode == 2)
            ksc = index_entry_scale(ks.g, page, ix);
    }
    float acc = 0.0f;
    for (int h = 0; h < n_heads; h++) {
        const float *qh = qb + (size_t)h * dim;
        float d = 0.0f;
        for (int cc = 0; cc < dim; cc++) {
            float kv = kf ? kf[cc] : index_entry_value(ks.g, row, ksc, (uint32_t)cc);
            d = __fadd_rn(d, __fmul_rn(qh[cc], kv));
        }
        if (d < 0.0f)
            d = 0.0f;
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(d, scale), wb[h]));
    }
    score[(size_t)(score_off ? score_off[b] : key_off[b]) + kk] = acc;
}

duet_status_t duet_cuda_exact_index_score(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads,
                                          int dim, const float *keys, const duet_cache_layout_t *l,
                                          const uint8_t *base, const uint32_t *unit, const uint32_t *idx,
                                          const int32_t *key_off, const int32_t *n_keys, const int32_t *score_off,
                                          int max_keys, float scale, float *score)
{
    if (n_rows <= 0 || max_keys <= 0)
        return DUET_OK;
    ex_keys ks;
    memset(&ks, 0, sizeof ks);
    ks.f32 = keys;
    if (!keys) {
        if (entry_geom_of(l, &ks.g) || (ks.g.mode != 0 && ks.g.mode != 2))
            return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "index_score: pool kind %d is not an index-K pool",
                                   (int)l->kind);
        ks.base = base;
        ks.unit = unit;
        ks.idx = idx;
    }
    for (int r0 = 0; r0 < n_rows; r0 += 65535) { /* grid.y up to 65535 */
        int nr = n_rows - r0 < 65535 ? n_rows - r0 : 65535;
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, exact_index_kernel, dim3(duet_cdiv((size_t)max_keys, EX_THREADS), nr),
                                            dim3(EX_THREADS), 0, q + (size_t)r0 * n_heads * dim,
                                            w + (size_t)r0 * n_heads, n_heads, dim, ks, key_off + r0, n_keys + r0,
                                            score_off ? score_off + r0 : (const int32_t *)NULL, scale, score));
    }
    return DUET_OK;
}

/* ---- hyper-connections ---------------------------------------------------------------------- */

/* a block a row of x(n, hc, dim): the first thread the norm's inverse over the flat row; thread m
 * mix m (the flat row, x times the inverse as the CPU's normalized copy holds it, times fn's row
 * m, in column order); the first thread the weights (ref_math.h's duet_ref_hc_mix for hc_pre;
 * for the head, pre_k = sigmoid(mix_k scale + base_k) + eps); every thread its columns of the
 * collapse Σ_k pre_k x_k */
template <bool HEAD>
__global__ void __launch_bounds__(EX_THREADS) exact_hc_kernel(const float *x, int hc, int dim, const float *fn,
                                                               const float *base, const float *scale_p,
                                                               float scale_v, int iters, float hc_eps, float norm_eps,
                                                               float *post, float *comb, float *y)
{
    duet_pdl_wait();
    __shared__ float mixes[EX_MIX_MAX];
    __shared__ float pre[EX_HC_MAX];
    __shared__ float inv_s;
    int row = blockIdx.x, flat_dim = hc * dim, mix = HEAD ? hc : (2 + hc) * hc;
    const float *xi = x + (size_t)row * flat_dim;
    if (threadIdx.x == 0)
        inv_s = duet_ref_rms_inv(duet_ref_dot(xi, xi, flat_dim), flat_dim, norm_eps);
    __syncthreads();
    float inv = inv_s;
    for (int m = threadIdx.x; m < mix; m += blockDim.x) {
        const float *f = fn + (size_t)m * flat_dim;
        float acc = 0.0f;
        for (int cc = 0; cc < flat_dim; cc++)
            acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(xi[cc], inv), f[cc]));
        mixes[m] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (HEAD) {
            for (int k = 0; k < hc; k++)
                pre[k] = __fadd_rn(duet_ref_sigmoidf(__fadd_rn(__fmul_rn(mixes[k], scale_v), base[k])), hc_eps);
        } else {
            float pr[EX_HC_MAX];
            duet_ref_hc_mix(mixes, hc, scale_p, base, iters, hc_eps, pr, post + (size_t)row * hc,
                            comb + (size_t)row * hc * hc);
            for (int k = 0; k < hc; k++)
                pre[k] = pr[k];
        }
    }
    __syncthreads();
    float *yi = y + (size_t)row * dim;
    for (int cc = threadIdx.x; cc < dim; cc += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < hc; k++)
            acc = __fadd_rn(acc, __fmul_rn(pre[k], xi[(size_t)k * dim + cc]));
        yi[cc] = acc;
    }
}

static duet_status_t exact_hc(duet_cuda_t *c, bool head, const float *x, int n, int hc, int dim, const float *fn,
                              const float *base, const float *scale_p, float scale_v, int iters, float hc_eps,
                              float norm_eps, float *post, float *comb, float *y)
{
    if (n <= 0)
        return DUET_OK;
    if (hc < 1 || hc > EX_HC_MAX || dim <= 0)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: hc %d (1..%d), dim %d", head ? "hc_head" : "hc_pre", hc,
                               EX_HC_MAX, dim);
    for (int r0 = 0; r0 < n; r0 += 1 << 30) {
        int nr = n - r0 < (1 << 30) ? n - r0 : 1 << 30;
        const float *xr = x + (size_t)r0 * hc * dim;
        float *yr = y + (size_t)r0 * dim;
        if (head)
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, exact_hc_kernel<true>, dim3(nr), dim3(EX_THREADS), 0, xr, hc, dim,
                                                fn, base, (const float *)NULL, scale_v, 0, hc_eps, norm_eps,
                                                (float *)NULL, (float *)NULL, yr));
        else
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, exact_hc_kernel<false>, dim3(nr), dim3(EX_THREADS), 0, xr, hc, dim,
                                                fn, base, scale_p, 0.0f, iters, hc_eps, norm_eps,
                                                post + (size_t)r0 * hc, comb + (size_t)r0 * hc * hc, yr));
    }
    return DUET_OK;
}

duet_status_t duet_cuda_exact_hc_pre(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                     const float *base, const float *scale, int sinkhorn_iters, float hc_eps,
                                     float norm_eps, float *post, float *comb, float *collapsed)
{
    return exact_hc(c, false, x, n, hc, dim, fn, base, scale, 0.0f, sinkhorn_iters, hc_eps, norm_eps, post, comb,
                    collapsed);
}

duet_status_t duet_cuda_exact_hc_head(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                      const float *base, float scale, float hc_eps, float norm_eps, float *y)
{
    return exact_hc(c, true, x, n, hc, dim, fn, base, NULL, scale, 0, hc_eps, norm_eps, NULL, NULL, y);
}
