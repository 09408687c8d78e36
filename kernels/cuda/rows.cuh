/* Row movement and the engine's elementwise steps on the GPU (fp32, device
 * pointers, device index lists).  All bit-exact with the CPU engine's loops:
 * each output element is one IEEE operation sequence in the CPU's order,
 * without fused multiply-add.
 *
 *   gather_rows     dst[i] = src[idx[i]]                 (rows of dim floats)
 *   gather_rows_to  dst[dst_idx[i]] = src[src_idx[i]]    (destinations distinct; _bf16: dst
 *                   bf16 bits, each value rounded as duet_f32_to_bf16, exact where bf16 holds it)
 *   copy_2d         dst[r*dst_ld + c] = src[r*src_ld + c] (rows x cols)
 *   scale_add_rows  y[rows[i]] += x[i] * w[i]            (MoE: an expert's output into its
 *                   tokens' rows; rows distinct within one call, so calls in ascending expert
 *                   order add in the CPU's order)
 *   add             y[i] += x[i]
 *   scale           x[i] *= s */
#ifndef DUET_CUDA_ROWS_CUH
#define DUET_CUDA_ROWS_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_gather_rows(duet_cuda_t *c, float *dst, const float *src, const int32_t *idx, int n, int dim);
duet_status_t duet_cuda_gather_rows_to(duet_cuda_t *c, float *dst, const int32_t *dst_idx, const float *src,
                                       const int32_t *src_idx, int n, int dim);
duet_status_t duet_cuda_gather_rows_to_bf16(duet_cuda_t *c, uint16_t *dst, const int32_t *dst_idx, const float *src,
                                            const int32_t *src_idx, int n, int dim);
duet_status_t duet_cuda_copy_2d(duet_cuda_t *c, float *dst, size_t dst_ld, const float *src, size_t src_ld, int rows,
                                int cols);
duet_status_t duet_cuda_scale_add_rows(duet_cuda_t *c, float *y, const int32_t *rows, const float *w, const float *x,
                                       int n, int dim);
duet_status_t duet_cuda_add(duet_cuda_t *c, float *y, const float *x, size_t n);
duet_status_t duet_cuda_scale(duet_cuda_t *c, float *x, size_t n, float s);

#ifdef __cplusplus
}
#endif

#endif
