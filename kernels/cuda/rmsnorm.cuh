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
/* The norm writing fp8 activations for duet_cuda_matmul_fp8_q: xq and sx as duet_cuda_act_quant
 * writes them from duet_cuda_rmsnorm's output (the same codes and scales, bit for bit; rows up
 * to duet_cuda_fp8_act_rows(n)), and that output in y too unless y is NULL (x may equal y).
 * dim a multiple of 128; x, weight and y 16-byte aligned; DUET_ERR_INVALID otherwise. */
duet_status_t duet_cuda_rmsnorm_q8(duet_cuda_t *c, const float *x, const float *weight, int n, int dim, float eps,
                                   float *y, uint8_t *xq, float *sx);

#ifdef __cplusplus
}
#endif

#endif
