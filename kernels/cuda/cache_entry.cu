/* Cache entry codecs on the GPU (contract in cache_entry.cuh): one block of
 * 128 threads per entry.  The per-block amax is a max (order-free), every
 * division and product is a single IEEE operation as in cache_layout.c, and
 * the e4m3 / ue8m0 / bf16 encoders are common.cuh's copies of dtype.h's, so
 * the bytes equal the CPU's. */
#include "cache_codec.cuh"

#define ENTRY_THREADS 128
#define KV_SCALE_BLOCK 64
#define FP8_MAX 448.0f

__device__ __forceinline__ void put_bf16(uint8_t *p, float v)
{
    uint16_t h = duet_d_f32_to_bf16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

__device__ float block_max(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = duet_warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nw ? red[lane] : 0.0f;
        t = duet_warp_max(t);
        if (lane == 0)
            red[32] = t;
    }
    __syncthreads();
    return red[32];
}

__global__ void __launch_bounds__(ENTRY_THREADS) cache_store_kernel(entry_geom g, uint8_t *base, const uint32_t *unit,
                                                                    const uint32_t *idx, const float *vecs)
{
    duet_pdl_wait();
    __shared__ float red[33];
    uint32_t e = blockIdx.x;
    const float *vec = vecs + (size_t)e * g.vec_dim;
    uint8_t *page = base + (size_t)unit[e] * g.page_bytes;
    uint32_t ix = idx[e];
    uint8_t *row = page + (size_t)ix * g.entry_data_bytes;
    uint8_t *srow = page + g.scale_offset + (size_t)ix * g.entry_scale_bytes;
    int t = threadIdx.x, lane = t & 31, warp = t >> 5, nw = blockDim.x >> 5;
    if (g.mode == 0) {
        for (uint32_t i = t; i < g.vec_dim; i += blockDim.x)
            put_bf16(row + 2 * i, vec[i]);
        return;
    }
    if (g.mode == 2) {
        float amax = 0.0f;
        for (uint32_t i = t; i < g.vec_dim; i += blockDim.x)
            amax = fmaxf(amax, fabsf(vec[i]));
        amax = block_max(amax, red);
        float scale = amax > 0.0f ? __fdiv_rn(amax, FP8_MAX) : 1.0f;
        for (uint32_t i = t; i < g.vec_dim; i += blockDim.x)
            row[i] = duet_d_f32_to_e4m3(__fdiv_rn(vec[i], scale));
        if (t < 4)
            srow[t] = (uint8_t)(__float_as_uint(scale) >> (8 * t));
        return;
    }
    /* kv fp8: nope in 64-value blocks (one warp per block), rope as bf16 */
    uint32_t nope = g.nope_dim, n_blocks = (nope + KV_SCALE_BLOCK - 1) / KV_SCALE_BLOCK;
    for (uint32_t blk = warp; blk < n_blocks; blk += nw) {
        uint32_t b0 = blk * KV_SCALE_BLOCK, b1 = min(b0 + KV_SCALE_BLOCK, nope);
        float amax = 0.0f;
        for (uint32_t i = b0 + lane; i < b1; i += 32)
            amax = fmaxf(amax, fabsf(vec[i]));
        amax = duet_warp_max(amax);
        if (amax == 0.0f)
            amax = 1e-4f;
        uint8_t sb = duet_d_f32_to_e8m0_ceil(__fdiv_rn(amax, FP8_MAX));
        float scale = duet_d_e8m0_to_f32(sb);
        if (lane == 0)
            srow[blk] = sb;
        for (uint32_t i = b0 + lane; i < b1; i += 32)
            row[i] = duet_d_f32_to_e4m3(__fdiv_rn(vec[i], scale));
    }
    for (uint32_t i = n_blocks + t; i < g.entry_scale_bytes; i += blockDim.x)
        srow[i] = 0;
    for (uint32_t i = t; i < g.rope_dim; i += blockDim.x)
        put_bf16(row + nope + 2 * i, vec[nope + i]);
}

/* Decode entry ix of a page into vec with the block's threads (O: float, or bf16 bits: exact
 * for every KV pool's values, which are bf16 or e4m3 times a power of two). */
template <typename O>
__device__ __forceinline__ void load_entry(const entry_geom &g, const uint8_t *page, uint32_t ix, O *vec)
{
    const uint8_t *row = page + (size_t)ix * g.entry_data_bytes;
    const uint8_t *srow = page + g.scale_offset + (size_t)ix * g.entry_scale_bytes;
    int t = threadIdx.x;
    if (g.mode == 0 || g.mode == 2) {
        float scale = g.mode == 2 ? index_entry_scale(g, page, ix) : 1.0f;
        for (uint32_t i = t; i < g.vec_dim; i += blockDim.x)
            duet_d_store(vec + i, index_entry_value(g, row, scale, i));
    } else {
        uint32_t nope = g.nope_dim;
        for (uint32_t i = t; i < nope; i += blockDim.x)
            duet_d_store(vec + i, __fmul_rn(duet_d_e4m3_to_f32(row[i]), duet_d_e8m0_to_f32(srow[i / KV_SCALE_BLOCK])));
        for (uint32_t i = t; i < g.rope_dim; i += blockDim.x)
            duet_d_store(vec + nope + i, get_bf16(row + nope + 2 * i));
    }
}

template <typename O>
__global__ void __launch_bounds__(ENTRY_THREADS) cache_load_kernel(entry_geom g, const uint8_t *base,
                                                                   const uint32_t *unit, const uint32_t *idx,
                                                                   O *vecs)
{
    duet_pdl_wait();
    uint32_t e = blockIdx.x;
    load_entry(g, base + (size_t)unit[e] * g.page_bytes, idx[e], vecs + (size_t)e * g.vec_dim);
}

/* block (j, b): entry sel[b*k + j] of row b's sequence, through its page list. */
template <typename O>
__global__ void __launch_bounds__(ENTRY_THREADS) cache_load_sel_kernel(entry_geom g, const uint8_t *base,
                                                                       uint32_t epp, const int32_t *sel, int k,
                                                                       const int32_t *n_sel, const uint32_t *pages,
                                                                       const int32_t *page_off,
                                                                       const int32_t *dst_off, O *out)
{
    duet_pdl_wait();
    int j = blockIdx.x, b = blockIdx.y;
    if (j >= n_sel[b])
        return;
    int32_t e = sel[(size_t)b * k + j];
    if (e < 0)
        return;
    uint32_t unit = pages[page_off[b] + e / epp];
    load_entry(g, base + (size_t)unit * g.page_bytes, (uint32_t)(e % epp),
               out + ((size_t)dst_off[b] + j) * g.vec_dim);
}

/* bf16 output where it is exact: bf16 entries, and KV fp8 (e4m3 times a power of two); not fp8
 * index-K, whose values are e4m3 times an fp32 scale. */
static int bf16_refused(const entry_geom &g) { return g.mode == 2; }

template <typename O>
static duet_status_t load_sel(duet_cuda_t *c, const char *name, const duet_cache_layout_t *l, const uint8_t *base,
                              const int32_t *sel, int k, int n_rows, const int32_t *n_sel, const uint32_t *pages,
                              const int32_t *page_off, const int32_t *dst_off, O *out)
{
    entry_geom g;
    if (entry_geom_of(l, &g) || !l->paged || (sizeof(O) == 2 && bf16_refused(g)))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: pool %s is not a paged %s pool", name,
                               duet_pool_kind_name(l->kind), sizeof(O) == 2 ? "KV entry" : "entry");
    if (k <= 0 || n_rows <= 0)
        return DUET_OK;
    if (n_rows > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: %d rows (at most 65535)", name, n_rows);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, cache_load_sel_kernel<O>, dim3(k, n_rows), dim3(ENTRY_THREADS), 0, g, base,
                                        l->entries_per_page, sel, k, n_sel, pages, page_off, dst_off, out));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_cache_load_sel(duet_cuda_t *c, const duet_cache_layout_t *l, const uint8_t *base,
                                                  const int32_t *sel, int k, int n_rows, const int32_t *n_sel,
                                                  const uint32_t *pages, const int32_t *page_off,
                                                  const int32_t *dst_off, float *out)
{
    return load_sel(c, "cache_load_sel", l, base, sel, k, n_rows, n_sel, pages, page_off, dst_off, out);
}

extern "C" duet_status_t duet_cuda_cache_load_sel_bf16(duet_cuda_t *c, const duet_cache_layout_t *l,
                                                       const uint8_t *base, const int32_t *sel, int k, int n_rows,
                                                       const int32_t *n_sel, const uint32_t *pages,
                                                       const int32_t *page_off, const int32_t *dst_off,
                                                       uint16_t *out)
{
    return load_sel(c, "cache_load_sel_bf16", l, base, sel, k, n_rows, n_sel, pages, page_off, dst_off, out);
}

extern "C" duet_status_t duet_cuda_cache_store(duet_cuda_t *c, const duet_cache_layout_t *l, uint8_t *base,
                                               const uint32_t *unit, const uint32_t *idx, const float *vec,
                                               uint32_t n)
{
    entry_geom g;
    if (entry_geom_of(l, &g))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "cache_store: pool %s has no entry codec",
                               duet_pool_kind_name(l->kind));
    if (!n)
        return DUET_OK;
    DUET_CUDA_CHECK(c,
                    duet_cuda_launch(c, cache_store_kernel, dim3(n), dim3(ENTRY_THREADS), 0, g, base, unit, idx, vec));
    return DUET_OK;
}

template <typename O>
static duet_status_t load(duet_cuda_t *c, const char *name, const duet_cache_layout_t *l, const uint8_t *base,
                          const uint32_t *unit, const uint32_t *idx, O *vec, uint32_t n)
{
    entry_geom g;
    if (entry_geom_of(l, &g) || (sizeof(O) == 2 && bf16_refused(g)))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: pool %s has no %s codec", name,
                               duet_pool_kind_name(l->kind), sizeof(O) == 2 ? "KV entry" : "entry");
    if (!n)
        return DUET_OK;
    DUET_CUDA_CHECK(
        c, duet_cuda_launch(c, cache_load_kernel<O>, dim3(n), dim3(ENTRY_THREADS), 0, g, base, unit, idx, vec));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_cache_load(duet_cuda_t *c, const duet_cache_layout_t *l, const uint8_t *base,
                                              const uint32_t *unit, const uint32_t *idx, float *vec, uint32_t n)
{
    return load(c, "cache_load", l, base, unit, idx, vec, n);
}

extern "C" duet_status_t duet_cuda_cache_load_bf16(duet_cuda_t *c, const duet_cache_layout_t *l, const uint8_t *base,
                                                   const uint32_t *unit, const uint32_t *idx, uint16_t *vec,
                                                   uint32_t n)
{
    return load(c, "cache_load_bf16", l, base, unit, idx, vec, n);
}

/* A run a grid row, its entries over the row's blocks. */
__global__ void kv_entries_kernel(const uint32_t *pages, const int32_t *runs, uint32_t epp, uint32_t *unit,
                                  uint32_t *idx)
{
    duet_pdl_wait();
    const int32_t *r = runs + 3 * (size_t)blockIdx.y;
    int32_t page_off = r[0], out = r[1], count = r[2];
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < count; e += gridDim.x * blockDim.x) {
        unit[out + e] = pages[page_off + e / epp];
        idx[out + e] = (uint32_t)e % epp;
    }
}

extern "C" duet_status_t duet_cuda_kv_entries(duet_cuda_t *c, const uint32_t *pages, const int32_t *runs,
                                              int n_runs, int max_count, uint32_t epp, uint32_t *unit,
                                              uint32_t *idx)
{
    if (epp == 0 || n_runs < 0 || n_runs > 65535 || max_count < 0)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "kv_entries: %d runs of up to %d entries, %u entries a page",
                               n_runs, max_count, epp);
    if (!n_runs || !max_count)
        return DUET_OK;
    unsigned bx = duet_cdiv((size_t)max_count, 256);
    dim3 grid(bx < 64 ? bx : 64, (unsigned)n_runs);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, kv_entries_kernel, grid, dim3(256), 0, pages, runs, epp, unit, idx));
    return DUET_OK;
}
