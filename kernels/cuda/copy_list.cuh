/* Batched copies of arbitrary (dst, src, bytes) entries: the data plane's
 * staging ops (xfer.h duet_xfer_staging_t: device pools to and from a pinned
 * bounce buffer), where page_copy's fixed page size and pool-relative ids do
 * not fit.  One launch for the whole list, never one cudaMemcpy per entry.
 * Either side of an entry may be device memory or mapped pinned host memory
 * (duet_cuda_host_alloc).  Bit-exact; entries must not overlap each other.
 *
 * Entries whose dst and src have the same offset modulo 16 are moved as
 * 16-byte vectors (a head and a tail of fewer than 16 bytes byte by byte);
 * others byte by byte.  The list is a host array, queued to the device through
 * the context's pinned argument buffer (duet_cuda_args); the copy is ordered
 * on the context's stream (duet_cuda_sync before reading the results). */
#ifndef DUET_CUDA_COPY_LIST_CUH
#define DUET_CUDA_COPY_LIST_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} duet_cuda_copy_t;

/* Queue the copy of every entry (n may be 0).  INVALID for a NULL pointer in an
 * entry of non-zero size. */
duet_status_t duet_cuda_copy_list(duet_cuda_t *c, const duet_cuda_copy_t *list, uint32_t n);

/* Peer copy ceiling: cudaMemcpyPeerAsync of `bytes` from this context's device
 * to device `peer` (peer access enabled first where the pair supports it;
 * *p2p says whether it does), warm-up then the median of `reps`; GB/s of bytes
 * moved, one direction.  INVALID for a peer that is this device or absent. */
duet_status_t duet_cuda_measure_peer_copy(duet_cuda_t *c, int peer, size_t bytes, int reps, double *gbps,
                                          int *p2p);

#ifdef __cplusplus
}
#endif

#endif
