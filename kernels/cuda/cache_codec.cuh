/* The cache entry geometry, shared by the entry load and store kernels
 * (cache_entry.cu) and the indexer reading the index-K pool directly
 * (index_score.cu), and the index-K value decode: the load kernels read bytes,
 * the indexer aligned words, with the same operations side by side here, so
 * both produce the same floats. */
#ifndef DUET_CUDA_CACHE_CODEC_CUH
#define DUET_CUDA_CACHE_CODEC_CUH

#include "common.cuh"

struct entry_geom {
    uint64_t page_bytes;
    uint32_t entry_data_bytes, entry_scale_bytes, scale_offset;
    uint32_t vec_dim, nope_dim, rope_dim;
    int mode; /* 0 bf16, 1 kv fp8, 2 index fp8 */
};

/* 0, or -1 for a pool without an entry codec */
static inline int entry_geom_of(const duet_cache_layout_t *l, entry_geom *g)
{
    if (l->kind != DUET_POOL_C4_KV && l->kind != DUET_POOL_C4_INDEX_K && l->kind != DUET_POOL_C128_KV &&
        l->kind != DUET_POOL_SWA_KV)
        return -1;
    g->page_bytes = l->page_bytes;
    g->entry_data_bytes = l->entry_data_bytes;
    g->entry_scale_bytes = l->entry_scale_bytes;
    g->scale_offset = l->scale_offset;
    g->vec_dim = l->vec_dim;
    g->nope_dim = l->nope_dim;
    g->rope_dim = l->rope_dim;
    if (l->dtype == DUET_CACHE_BF16)
        g->mode = 0;
    else if (l->kind == DUET_POOL_C4_INDEX_K)
        g->mode = 2;
    else
        g->mode = 1;
    return 0;
}

__device__ __forceinline__ float get_bf16(const uint8_t *p) { return duet_d_bf16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* An fp8 index-K entry's fp32 scale (4 bytes, low first) */
__device__ __forceinline__ float index_entry_scale(const entry_geom &g, const uint8_t *page, uint32_t ix)
{
    const uint8_t *srow = page + g.scale_offset + (size_t)ix * g.entry_scale_bytes;
    return __uint_as_float((uint32_t)srow[0] | ((uint32_t)srow[1] << 8) | ((uint32_t)srow[2] << 16) |
                           ((uint32_t)srow[3] << 24));
}

/* Value i of entry ix of a bf16 entry (mode 0) or an fp8 index-K entry (mode 2, its scale given) */
__device__ __forceinline__ float index_entry_value(const entry_geom &g, const uint8_t *row, float scale, uint32_t i)
{
    return g.mode == 0 ? get_bf16(row + 2 * i) : __fmul_rn(duet_d_e4m3_to_f32(row[i]), scale);
}

/* The same two, read as aligned words where an index-K layout has them so (the indexer's direct
 * pool read; test_cache_layout's test_index_k_words): the scale one 4-byte float, a bf16 value
 * one 2-byte word.  The same operations on the same bits, so the same floats.  The scale is
 * taken by reference: read only where an fp8 value uses it. */
__device__ __forceinline__ float index_entry_scale_word(const entry_geom &g, const uint8_t *page, uint32_t ix)
{
    return *reinterpret_cast<const float *>(page + g.scale_offset + (size_t)ix * g.entry_scale_bytes);
}
template <int MODE> __device__ __forceinline__ float index_entry_value_word(const uint8_t *row, const float &scale, int i)
{
    static_assert(MODE == 0 || MODE == 2, "bf16 entries or fp8 index-K entries");
    if constexpr (MODE == 0)
        return duet_d_bf16_to_f32(*reinterpret_cast<const uint16_t *>(row + 2 * i));
    else
        return __fmul_rn(duet_d_e4m3_to_f32(row[i]), scale);
}

#endif
