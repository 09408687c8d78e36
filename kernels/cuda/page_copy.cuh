/* Batched page copies: a list of pages moves in one launch (never one
 * cudaMemcpy per page: on the H200, 64 KiB copies one by one reach a few
 * percent of the copy bandwidth).  Pages are units of `page_bytes` (a
 * duet_cache_layout_t's page_bytes; for a layer-major pool the unit index is
 * layer*n_units + page).  Either side may be device memory or mapped pinned
 * host memory (duet_cuda_host_alloc: the host tier).  Bit-exact copies.
 *
 *   gather   staging[j] = pool[ids[j]]          (pool -> contiguous staging)
 *   scatter  pool[ids[j]] = staging[j]          (staging -> pool)
 *   copy     dst_pool[dst_ids[j]] = src_pool[src_ids[j]]   (pool -> pool)
 *
 * The id lists here are host arrays (queued to the device through a pinned
 * buffer); duet_cuda_pages_copy_dev takes device arrays (NULL = identity
 * j -> j).  Ranges must not overlap. */
#ifndef DUET_CUDA_PAGE_COPY_CUH
#define DUET_CUDA_PAGE_COPY_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_pages_gather(duet_cuda_t *c, uint8_t *staging, const uint8_t *pool, const uint32_t *ids,
                                     uint32_t n, uint64_t page_bytes);
duet_status_t duet_cuda_pages_scatter(duet_cuda_t *c, uint8_t *pool, const uint32_t *ids, const uint8_t *staging,
                                      uint32_t n, uint64_t page_bytes);
duet_status_t duet_cuda_pages_copy(duet_cuda_t *c, uint8_t *dst_pool, const uint32_t *dst_ids,
                                   const uint8_t *src_pool, const uint32_t *src_ids, uint32_t n,
                                   uint64_t page_bytes);
duet_status_t duet_cuda_pages_copy_dev(duet_cuda_t *c, uint8_t *dst, const uint32_t *dst_ids_dev,
                                       const uint8_t *src, const uint32_t *src_ids_dev, uint32_t n,
                                       uint64_t page_bytes);

/* Several pools' copies at the same units (dst[ids[j]] = src[ids[j]] for the part's ids): one
 * host id list for all the parts (part p's at ids + at, n of them), queued to the device in one
 * copy, then a launch a part, back to back.  (duet_cuda_pages_copy a part at a time waits, before
 * queuing each part's ids, for the launch ahead of it.) */
typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    uint32_t at, n;
    uint64_t page_bytes;
} duet_cuda_page_part_t;

duet_status_t duet_cuda_pages_copy_parts(duet_cuda_t *c, const duet_cuda_page_part_t *parts, int n_parts,
                                         const uint32_t *ids, uint32_t n_ids);

#ifdef __cplusplus
}
#endif

#endif
