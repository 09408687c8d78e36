/* Lightning-indexer scores on the GPU (contract in index_score.cuh).
 *
 * A block computes 64 keys × 64 heads of q·k as a small fp32 GEMM: 32-column
 * chunks of q and of the keys are staged transposed in shared memory and
 * each thread accumulates a 4 heads × 4 keys tile.  Then relu, × scale ×
 * w[h], and a sum over the heads (across the 16 head-tiles through shared
 * memory).  Bytes: keys once (q, 32 KB a row, is re-read from L2 per tile);
 * FLOPs: 2*heads*dim per key.
 *
 * The staging is double buffered: the next chunk is copied into the other
 * buffer with cp.async while the current one is multiplied (one barrier a
 * chunk, no registers held for it).  A warp stages 4 rows × 8 columns at a
 * time, so that its transposed writes fall in 32 distinct banks (row stride
 * 68 floats: bank 4 d + r) and its reads are whole 32-byte sectors.  Each
 * (head, key) product is still summed over the columns in order, and the
 * heads in the same order, so the scores are the same bits as with one
 * buffer.  Reading an index-K pool directly (duet_cuda_index_score_cache),
 * the keys' values are decoded into registers the same way ahead of their
 * chunk and stored transposed after it. */
#include "cache_codec.cuh"

#define IS_KT 64
#define IS_HT 64
#define IS_DC 32
#define IS_PAD 68
#define IS_THREADS 256
/* values a thread stages a chunk, of q and of the keys each: 64 rows × 32 columns / 256 */
#define IS_SV (IS_HT * IS_DC / IS_THREADS)
/* blocks an SM the registers are held to: five, as the single-buffered kernel had (48
 * registers, no spill, 195 KB of shared memory; sm_90a) */
#ifndef IS_MIN_BLOCKS
#define IS_MIN_BLOCKS 5
#endif
/* the same reading the index-K pool (its key values through registers): four, which it fits in
 * 64 registers without spilling (48 spill a few bytes) */
#ifndef IS_MIN_BLOCKS_CACHE
#define IS_MIN_BLOCKS_CACHE 4
#endif

/* Where a row's keys come from: key kk of row b is key_off[b] + kk of an fp32 array (f32), or
 * (CACHE) that entry of an index-K pool, page unit[e] at base and index idx[e], decoded with
 * index_entry_value's operations (bf16 bits moved up; e4m3 times the entry's fp32 scale, one
 * rounding), read as aligned 2- and 4-byte words: the floats duet_cuda_cache_load writes. */
struct is_keys {
    const float *f32;
    entry_geom g;
    const uint8_t *base;
    const uint32_t *unit, *idx;
};

/* KS: the keys' source, 0 an fp32 array, 1 a bf16 index-K pool, 2 an fp8 one */
template <int KS>
__global__ void __launch_bounds__(IS_THREADS, KS ? IS_MIN_BLOCKS_CACHE : IS_MIN_BLOCKS)
    index_score_kernel(const float *q, const float *w, int n_heads, int dim, is_keys ks, const int32_t *key_off,
                       const int32_t *n_keys, const int32_t *score_off, float scale, float *score)
{
    duet_pdl_wait();
    constexpr bool CACHE = KS != 0;
    static_assert(IS_HT == IS_KT && IS_DC == 32 && IS_THREADS == 256 && IS_SV == 8,
                  "a warp stages 4 rows x 8 columns, 8 warps x 8 rounds cover 64 rows x 32 columns");
    __shared__ __align__(16) float qT[2][IS_DC][IS_PAD];
    __shared__ __align__(16) float kT[2][IS_DC][IS_PAD];
    __shared__ float red[16][IS_KT + 1];
    int b = blockIdx.y, key0 = blockIdx.x * IS_KT;
    int nk = n_keys[b];
    if (key0 >= nk)
        return;
    const float *kb = CACHE ? NULL : ks.f32 + (size_t)key_off[b] * dim;
    const float *qb = q + (size_t)b * n_heads * dim;
    const float *wb = w + (size_t)b * n_heads;
    int t = threadIdx.x, tx = t & 15, ty = t >> 4;
    int lane = t & 31, wp = t >> 5;
    /* round it: rows 4 rg + (lane >> 3), columns 8 dg + (lane & 7) of the chunk, task 8 it + wp */
    auto srow = [&](int it) { return 4 * ((8 * it + wp) >> 2) + (lane >> 3); };
    auto scol = [&](int it) { return 8 * ((8 * it + wp) & 3) + (lane & 7); };
    /* chunk (h0, c0) into buffer buf: cp.async, or 0 past the heads, keys or columns */
    auto issue = [&](int buf, int h0, int c0) {
#pragma unroll
        for (int it = 0; it < IS_SV; it++) {
            int r = srow(it), d = scol(it), cc = c0 + d;
            int h = h0 + r, kk = key0 + r;
            if (h < n_heads && cc < dim)
                cp_async4(&qT[buf][d][r], qb + (size_t)h * dim + cc);
            else
                qT[buf][d][r] = 0.0f;
            if (CACHE)
                continue; /* the keys come through registers (fetch_keys, stash_keys) */
            if (kk < nk && cc < dim)
                cp_async4(&kT[buf][d][r], kb + (size_t)kk * dim + cc);
            else
                kT[buf][d][r] = 0.0f;
        }
        cp_commit();
    };
    /* CACHE: each key's entry (and an fp8 entry's scale) found once, by its own thread, ahead of
     * the chunks: the chunks' loads then wait on no other global load */
    __shared__ const uint8_t *krow[CACHE ? IS_KT : 1];
    __shared__ float kscale[CACHE ? IS_KT : 1];
    if (CACHE && t < IS_KT) {
        const uint8_t *row = NULL;
        float sc = 0.0f;
        if (key0 + t < nk) {
            size_t e = (size_t)key_off[b] + key0 + t;
            const uint8_t *page = ks.base + (size_t)__ldg(ks.unit + e) * ks.g.page_bytes;
            uint32_t ix = __ldg(ks.idx + e);
            row = page + (size_t)ix * ks.g.entry_data_bytes;
            if (KS == 2)
                sc = index_entry_scale_word(ks.g, page, ix);
        }
        krow[CACHE ? t : 0] = row;
        kscale[CACHE ? t : 0] = sc;
    }
    if (CACHE)
        __syncthreads();
    /* CACHE: chunk c0's key values decoded into registers, then stored transposed */
    float pk[CACHE ? IS_SV : 1];
    auto fetch_keys = [&](int c0) {
#pragma unroll
        for (int it = 0; it < IS_SV; it++) {
            int r = srow(it), cc = c0 + scol(it), kk = key0 + r;
            float v = 0.0f;
            if (kk < nk && cc < dim) {
                v = index_entry_value_word<KS == 1 ? 0 : 2>(krow[CACHE ? r : 0], kscale[CACHE ? r : 0], cc);
            }
            pk[CACHE ? it : 0] = v;
        }
    };
    auto stash_keys = [&](int buf) {
#pragma unroll
        for (int it = 0; it < IS_SV; it++)
            kT[buf][scol(it)][srow(it)] = pk[CACHE ? it : 0];
    };
    int ncc = (dim + IS_DC - 1) / IS_DC, nch = ((n_heads + IS_HT - 1) / IS_HT) * ncc;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float acc[4][4];
    issue(0, 0, 0);
    if (CACHE) {
        fetch_keys(0);
        stash_keys(0);
    }
    cp_wait<0>();
    __syncthreads();
    for (int ci = 0; ci < nch; ci++) {
        int buf = ci & 1, h0 = (ci / ncc) * IS_HT, c0 = (ci % ncc) * IS_DC;
        if (c0 == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = 0.0f;
        }
        /* the next chunk into the other buffer (its last readers passed the previous barrier),
         * in flight while this one is multiplied */
        if (ci + 1 < nch) {
            issue(buf ^ 1, ((ci + 1) / ncc) * IS_HT, ((ci + 1) % ncc) * IS_DC);
            if (CACHE)
                fetch_keys(((ci + 1) % ncc) * IS_DC);
        }
#pragma unroll 8
        for (int d = 0; d < IS_DC; d++) {
            float4 qa = *(const float4 *)&qT[buf][d][4 * ty];
            float4 ka = *(const float4 *)&kT[buf][d][4 * tx];
            float qv[4] = {qa.x, qa.y, qa.z, qa.w}, kv[4] = {ka.x, ka.y, ka.z, ka.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(qv[i], kv[j], acc[i][j]);
        }
        if (c0 + IS_DC >= dim) { /* the head tile's last chunk: its heads into the keys' sums */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int h = h0 + 4 * ty + i;
                if (h >= n_heads)
                    continue;
                float wh = wb[h];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float d = acc[i][j] < 0.0f ? 0.0f : acc[i][j];
                    part[j] = __fadd_rn(part[j], __fmul_rn(__fmul_rn(d, scale), wh));
                }
            }
        }
        if (CACHE && ci + 1 < nch)
            stash_keys(buf ^ 1);
        cp_wait<0>();
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        red[ty][4 * tx + j] = part[j];
    __syncthreads();
    if (t < IS_KT && key0 + t < nk) {
        float s = 0.0f;
        for (int y = 0; y < 16; y++)
            s += red[y][t];
        score[(size_t)(score_off ? score_off[b] : key_off[b]) + key0 + t] = s;
    }
}

template <int KS>
static duet_status_t is_launch(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads, int dim,
                               const is_keys &ks, const int32_t *key_off, const int32_t *n_keys,
                               const int32_t *score_off, int max_keys, float scale, float *score)
{
    if (n_rows <= 0 || max_keys <= 0 || n_heads <= 0 || dim <= 0)
        return DUET_OK;
    if (n_rows > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "index_score: %d rows (at most 65535)", n_rows);
    dim3 grid(duet_cdiv(max_keys, IS_KT), n_rows);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, index_score_kernel<KS>, grid, dim3(IS_THREADS), 0, q, w, n_heads, dim, ks,
                                        key_off, n_keys, score_off, scale, score));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_index_score(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                               int n_heads, int dim, const float *keys, const int32_t *key_off,
                                               const int32_t *n_keys, int max_keys, float scale, float *score)
{
    return duet_cuda_index_score_rows(c, q, w, n_rows, n_heads, dim, keys, key_off, n_keys, NULL, max_keys, scale,
                                      score);
}

extern "C" duet_status_t duet_cuda_index_score_rows(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                                    int n_heads, int dim, const float *keys, const int32_t *key_off,
                                                    const int32_t *n_keys, const int32_t *score_off, int max_keys,
                                                    float scale, float *score)
{
    is_keys ks = {};
    ks.f32 = keys;
    return is_launch<0>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
}

extern "C" duet_status_t duet_cuda_index_score_cache(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                                     int n_heads, int dim, const duet_cache_layout_t *l,
                                                     const uint8_t *base, const uint32_t *unit, const uint32_t *idx,
                                                     const int32_t *key_off, const int32_t *n_keys,
                                                     const int32_t *score_off, int max_keys, float scale,
                                                     float *score)
{
    is_keys ks = {};
    if (entry_geom_of(l, &ks.g) || l->kind != DUET_POOL_C4_INDEX_K || (int)l->vec_dim != dim ||
        (ks.g.mode == 0 && (ks.g.page_bytes % 2 || ks.g.entry_data_bytes % 2)) ||
        (ks.g.mode == 2 && (ks.g.page_bytes % 4 || ks.g.scale_offset % 4 || ks.g.entry_scale_bytes != 4)) ||
        (uintptr_t)base % 4)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "index_score_cache: pool %s of %u values an entry, keys of %d (needs the index-K pool "
                               "of that width, its values and scales aligned)",
                               duet_pool_kind_name(l->kind), l->vec_dim, dim);
    ks.base = base;
    ks.unit = unit;
    ks.idx = idx;
    if (ks.g.mode == 0)
        return is_launch<1>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
    return is_launch<2>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
}
