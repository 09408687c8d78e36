/* Cache entry codecs on the GPU (contract in cache_entry.cuh): one block of
 * 128 threads per entry (loads: a warp per entry where the layout is 16-byte aligned).  The per-block amax is a max
 * (order-free), every division and product is a single IEEE operation as in cache_layout.c, and the e4m3 / ue8m0 / bf16
 * encoders are common.cuh's copies of dtype.h's, so the bytes equal the CPU's. */
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

/* A warp an entry, 16 bytes of its data a lane and step, where every piece is 16-byte aligned
 * (load_warp_ok: V4's entries, 512 bf16, 448 e4m3 + 64 bf16, 128 e4m3).  Each value is the same
 * operations on the same bits as load_entry's, so the same floats and bf16 bits; a block of one
 * entry moved 1 KB with 2-byte loads, and its launch and scheduling cost more than the copy. */
#define LOAD_WARPS (ENTRY_THREADS / 32)
static bool load_warp_ok(const entry_geom &g, const void *base, const void *out)
{
    uint32_t data = g.mode == 0 ? 2 * g.vec_dim : g.mode == 2 ? g.vec_dim : g.nope_dim + 2 * g.rope_dim;
    return g.vec_dim % 16 == 0 && g.nope_dim % 16 == 0 && data % 16 == 0 && data <= g.entry_data_bytes &&
           g.entry_data_bytes % 16 == 0 && g.page_bytes % 16 == 0 && (uintptr_t)base % 16 == 0 &&
           (uintptr_t)out % 16 == 0;
}
__device__ __forceinline__ void put8(float *o, const float (&v)[8])
{
    reinterpret_cast<float4 *>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void put8(uint16_t *o, const float (&v)[8])
{
    uint4 w;
    w.x = (uint32_t)duet_d_f32_to_bf16(v[0]) | (uint32_t)duet_d_f32_to_bf16(v[1]) << 16;
    w.y = (uint32_t)duet_d_f32_to_bf16(v[2]) | (uint32_t)duet_d_f32_to_bf16(v[3]) << 16;
    w.z = (uint32_t)duet_d_f32_to_bf16(v[4]) | (uint32_t)duet_d_f32_to_bf16(v[5]) << 16;
    w.w = (uint32_t)duet_d_f32_to_bf16(v[6]) | (uint32_t)duet_d_f32_to_bf16(v[7]) << 16;
    *reinterpret_cast<uint4 *>(o) = w;
}
/* the eight bf16 values of a 16-byte piece, in order */
__device__ __forceinline__ void bf16x8(const uint4 &u, float (&v)[8])
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = duet_d_bf16_to_f32((uint16_t)(w[i] & 0xffffu));
        v[2 * i + 1] = duet_d_bf16_to_f32((uint16_t)(w[i] >> 16));
    }
}
/* eight e4m3 values (bytes 8h .. 8h+7 of the piece) times s */
__device__ __forceinline__ void e4m3x8(const uint4 &u, int h, float s, float (&v)[8])
{
    const uint32_t w[2] = {h ? u.z : u.x, h ? u.w : u.y};
#pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = __fmul_rn(duet_d_e4m3_to_f32((uint8_t)(w[i / 4] >> (8 * (i % 4)))), s);
}
template <typename O>
__device__ __forceinline__ void load_entry_warp(const entry_geom &g, const uint8_t *page, uint32_t ix, O *vec)
{
    const uint8_t *row = page + (size_t)ix * g.entry_data_bytes;
    const uint8_t *srow = page + g.scale_offset + (size_t)ix * g.entry_scale_bytes;
    int lane = threadIdx.x & 31;
    uint32_t data = g.mode == 0 ? 2 * g.vec_dim : g.mode == 2 ? g.vec_dim : g.nope_dim + 2 * g.rope_dim;
    float s2 = g.mode == 2 ? index_entry_scale(g, page, ix) : 1.0f;
    for (uint32_t b = 16 * lane; b < data; b += 32 * 16) {
        uint4 u = *reinterpret_cast<const uint4 *>(row + b);
        float v[8];
        if (g.mode == 0 || (g.mode == 1 && b >= g.nope_dim)) { /* bf16: values from (b - bf16 start) / 2 */
            uint32_t at = g.mode == 0 ? b / 2 : g.nope_dim + (b - g.nope_dim) / 2;
            bf16x8(u, v);
            put8(vec + at, v);
        } else { /* e4m3: 16 values from b, one scale (a 64-value block holds the piece) */
            float s = g.mode == 2 ? s2 : duet_d_e8m0_to_f32(srow[b / KV_SCALE_BLOCK]);
            e4m3x8(u, 0, s, v);
            put8(vec + b, v);
            e4m3x8(u, 1, s, v);
            put8(vec + b + 8, v);
        }
    }
}

/* WARP: a warp an entry (load_entry_warp), LOAD_WARPS entries a block; else a block an entry. */
template <typename O, bool WARP>
__device__ __forceinline__ void load_one(const entry_geom &g, const uint8_t *page, uint32_t ix, O *vec)
{
    if constexpr (WARP)
        load_entry_warp(g, page, ix, vec);
    else
        load_entry(g, page, ix, vec);
}
template <bool WARP> __device__ __forceinline__ uint32_t load_slot()
{
    return WARP ? blockIdx.x * LOAD_WARPS + (threadIdx.x >> 5) : blockIdx.x;
}

template <typename O, bool WARP>
__global__ void __launch_bounds__(ENTRY_THREADS)
    cache_load_kernel(entry_geom g, const uint8_t *base, const uint32_t *unit, const uint32_t *idx, O *vecs, uint32_t n)
{
    duet_pdl_wait();
    uint32_t e = load_slot<WARP>();
    if (e >= n)
        return;
    load_one<O, WARP>(g, base + (size_t)unit[e] * g.page_bytes, idx[e], vecs + (size_t)e * g.vec_dim);
}

/* block (j, b) (WARP: entries LOAD_WARPS j .. LOAD_WARPS j + 3): entry sel[b*k + j] of row b's
 * sequence, through its page list. */
template <typename O, bool WARP>
__global__ void __launch_bounds__(ENTRY_THREADS)
    cache_load_sel_kernel(entry_geom g, const uint8_t *base, uint32_t epp, const int32_t *sel, int k,
                          const int32_t *n_sel, const uint32_t *pages, const int32_t *page_off, const int32_t *dst_off,
                          O *out)
{
    duet_pdl_wait();
    int j = (int)load_slot<WARP>(), b = blockIdx.y;
    if (j >= n_sel[b])
        return;
    int32_t e = sel[(size_t)b * k + j];
    if (e < 0)
        return;
    uint32_t unit = pages[page_off[b] + e / epp];
    load_one<O, WARP>(g, base + (size_t)unit * g.page_bytes, (uint32_t)(e % epp),
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
    bool warp = load_warp_ok(g, base, out);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, warp ? cache_load_sel_kernel<O, true> : cache_load_sel_kernel<O, false>,
                                        dim3(warp ? duet_cdiv(k, LOAD_WARPS) : k, n_rows), dim3(ENTRY_THREADS), 0, g,
                                        base, l->entries_per_page, sel, k, n_sel, pages, page_off, dst_off, out));
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
    bool warp = load_warp_ok(g, base, vec);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, warp ? cache_load_kernel<O, true> : cache_load_kernel<O, false>,
                                        dim3(warp ? duet_cdiv(n, LOAD_WARPS) : n), dim3(ENTRY_THREADS), 0, g, base,
                                        unit, idx, vec, n));
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
