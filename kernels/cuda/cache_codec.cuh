/* The cache entry geometry, shared by the entry load and store kernels
 * (cache_entry.cu) and the indexer reading the index-K pool directly
 * (index_score.cu), and the index-K value decode: the load kernels call it;
 * the indexer does the same operations on aligned words, so both produce the
 * same floats. */
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

#endif
