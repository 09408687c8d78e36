/* Bytes asked of memory into the L2 cache ahead of the kernels that read them.
 *
 * A decode step has stretches where the memory is idle: attention (bound by its MMAs), the
 * hyper-connection mixes and norms (short launches).  A weight read next can be fetched into L2
 * there, on the side stream, so that its matmul reads it from L2 instead of from memory.  The
 * prefetch only asks: it writes nothing, changes no result, and lines it brought in may be
 * evicted again before they are read (then the reader fetches them as before). */
#ifndef DUET_CUDA_PREFETCH_CUH
#define DUET_CUDA_PREFETCH_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At most this many ranges a call. */
#define DUET_CUDA_PREFETCH_MAX 16

typedef struct {
    const void *p; /* device memory; NULL with bytes 0 is an empty range */
    size_t bytes;
} duet_cuda_range_t;

/* One launch on the context's stream asking for every 128-byte line of the n ranges
 * (`prefetch.global.L2`; with keep != 0 `.L2::evict_last`, lines kept before others when L2 needs
 * room).  DUET_ERR_INVALID for more than DUET_CUDA_PREFETCH_MAX ranges or a NULL range with bytes. */
duet_status_t duet_cuda_l2_prefetch(duet_cuda_t *c, const duet_cuda_range_t *r, int n, int keep);

#ifdef __cplusplus
}
#endif

#endif
