/* Cache entry store/load on the GPU, batched: the codecs of
 * duet_cache_entry_store / duet_cache_entry_load (cache_layout.h) for n
 * entries in one launch, bit-exact with the CPU (same roundings, written out
 * operation by operation: e4m3 round-to-nearest-even with saturation, ue8m0
 * ceil scales per 64 nope values, bf16 rope; fp8 index-K with one fp32 scale;
 * bf16 entries).
 *
 * Entry i is vec[i*l->vec_dim ..] and lives at position idx[i] of unit
 * unit[i] of a pool whose unit u starts at base + u*l->page_bytes (a unit is a
 * page, a ring slot, or for a layer-major pool layer*n_units + page).  unit
 * and idx are device arrays of n entries.  KV and index-K pools only. */
#ifndef DUET_CUDA_CACHE_ENTRY_CUH
#define DUET_CUDA_CACHE_ENTRY_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_cache_store(duet_cuda_t *c, const duet_cache_layout_t *l, uint8_t *base,
                                    const uint32_t *unit, const uint32_t *idx, const float *vec, uint32_t n);
duet_status_t duet_cuda_cache_load(duet_cuda_t *c, const duet_cache_layout_t *l, const uint8_t *base,
                                   const uint32_t *unit, const uint32_t *idx, float *vec, uint32_t n);
/* Decode the entries a top-k picked, through each row's page list (a paged pool): for row
 * b < n_rows and j < n_sel[b], entry e = sel[b*k + j] (skipped when negative) of page
 * pages[page_off[b] + e / entries_per_page], index e % entries_per_page, goes to
 * out + (dst_off[b] + j) * vec_dim.  sel, n_sel, pages, page_off, dst_off: device arrays.
 * Bit-exact (the load codec above). */
duet_status_t duet_cuda_cache_load_sel(duet_cuda_t *c, const duet_cache_layout_t *l, const uint8_t *base,
                                       const int32_t *sel, int k, int n_rows, const int32_t *n_sel,
                                       const uint32_t *pages, const int32_t *page_off, const int32_t *dst_off,
                                       float *out);

/* duet_kv_cache_entries on the device, for n_runs sequences at once: run r (runs[3r .. 3r+2] =
 * page offset, output offset, entry count) writes, for its entries e from 0, unit[out + e] =
 * pages[page_off + e / epp] and idx[out + e] = e % epp.  runs, pages, unit, idx: device arrays;
 * max_count bounds every run's count. */
duet_status_t duet_cuda_kv_entries(duet_cuda_t *c, const uint32_t *pages, const int32_t *runs, int n_runs,
                                   int max_count, uint32_t epp, uint32_t *unit, uint32_t *idx);

/* The two loads into bf16 bits (2 bytes a value), where bf16 holds every value exactly: the KV
 * pools (SWA, C4, C128: bf16, or e4m3 times a power of two) and bf16 index-K; fp8 index-K (e4m3
 * times an fp32 scale) is refused. */
duet_status_t duet_cuda_cache_load_bf16(duet_cuda_t *c, const duet_cache_layout_t *l, const uint8_t *base,
                                        const uint32_t *unit, const uint32_t *idx, uint16_t *vec, uint32_t n);
duet_status_t duet_cuda_cache_load_sel_bf16(duet_cuda_t *c, const duet_cache_layout_t *l, const uint8_t *base,
                                            const int32_t *sel, int k, int n_rows, const int32_t *n_sel,
                                            const uint32_t *pages, const int32_t *page_off, const int32_t *dst_off,
                                            uint16_t *out);

#ifdef __cplusplus
}
#endif

#endif
