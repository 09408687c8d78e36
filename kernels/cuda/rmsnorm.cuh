/* rmsnorm on the GPU: duet_kernels_t.rmsnorm over device pointers (x may equal y).
 * One block per row; the sum of squares is reduced in a different order from
 * the CPU (normalized error ~1e-7; checked at 1e-5). */
#ifndef DUET_CUDA_RMSNORM_CUH
#define DUET_CUDA_RMSNORM_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_rmsnorm(duet_cuda_t *c, const float *x, const float *weight, int n, int dim, float eps,
                                float *y);
/* The threads of a row's block for `dim` columns (thread t sums columns t, t + threads, ...):
 * operations fused with the norm take the same, so that the result keeps its bits. */
int duet_cuda_rmsnorm_threads(int dim);

#ifdef __cplusplus
}
#endif

#endif
