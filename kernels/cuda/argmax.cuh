/* Greedy sampling on the GPU: for each row b < n_rows of logits(n_rows,
 * vocab) the token duet_sample() picks at temperature 0: the largest logit,
 * the lowest id on ties, NaN never chosen (0 when every logit is NaN).
 * Bit-exact.  out: n_rows int32 on the device. */
#ifndef DUET_CUDA_ARGMAX_CUH
#define DUET_CUDA_ARGMAX_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_argmax(duet_cuda_t *c, const float *logits, int n_rows, int vocab, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif
