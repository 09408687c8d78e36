/* Token embedding on the GPU: h(n, hc, dim) = table[tok[r]] copied into each
 * of the hc streams of row r, the table bf16 or f32 [vocab][dim] (decoded to
 * fp32 exactly, as the CPU engine does).  tok: n device int32 ids, already
 * checked against the vocabulary.  Bit-exact. */
#ifndef DUET_CUDA_EMBED_CUH
#define DUET_CUDA_EMBED_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_embed(duet_cuda_t *c, const void *table, duet_dtype_t dtype, int dim, const int32_t *tok,
                              int n, int hc, float *h);

#ifdef __cplusplus
}
#endif

#endif
