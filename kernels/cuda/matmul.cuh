/* matmul on the GPU: duet_kernels_t.matmul over device pointers.
 *
 * y(n, row_end-row_begin) = x(n, w->cols) · W[row_begin:row_end]ᵀ, x and y
 * fp32, W in its stored dtype (w->data / w->scale are device pointers; the
 * other fields as in kernels.h).  Kernels, chosen by n:
 *   n <= DUET_CUDA_GEMV_MAX_N  the decode kernels: fp32 activations, weights
 *        decoded in registers (bf16, e4m3 × its 128×128 block scale, e2m1 × its
 *        1×32 group scale, f32), fp32 accumulation.  From DUET_CUDA_TC_MIN_N
 *        tokens on (fp4: DUET_CUDA_TC_MIN_N_FP4), on the tensor cores with x
 *        split into three bf16 parts
 *        (hi + mid + lo, residual < 2^-24 |x|) against exact bf16 weights;
 *        below, or where that kernel does not apply, on the fp32 units.  Both
 *        differ from the CPU only in summation order (normalized error ~1e-7;
 *        checked at 1e-5).
 *   n >  DUET_CUDA_GEMV_MAX_N  cuBLASLt with bf16 operands and fp32
 *        accumulation: x is rounded to bf16; fp8 and fp4 weights are first
 *        expanded to bf16 (exact for ue8m0 scales) in a scratch buffer.
 *        Normalized error ~1e-3 from rounding x (checked at 4e-3).
 *        f32 weights take cuBLASLt fp32 (no TF32) at every n.
 * The choice depends on n, so a row's result can differ by rounding between
 * batch sizes, unless the context is in batch-invariant mode
 * (duet_cuda_set_invariant: duet_cuda_matmul_invariant at every n). */
#ifndef DUET_CUDA_MATMUL_CUH
#define DUET_CUDA_MATMUL_CUH

#include "duet_cuda.h"

#define DUET_CUDA_GEMV_MAX_N 32
#define DUET_CUDA_TC_MIN_N 4     /* bf16 and fp8 weights */
#define DUET_CUDA_TC_MIN_N_FP4 16 /* fp4: decoding e2m1 to bf16 costs more than the fp32 units lose */

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_matmul(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const float *x,
                               int n, float *y);

/* Force one kernel (checks and benchmarks): the fp32-unit decode kernel at any n, or
 * cuBLASLt at any n (DUET_ERR_UNSUPPORTED when cuBLASLt has no algorithm). */
duet_status_t duet_cuda_matmul_gemv(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                    const float *x, int n, float *y);
duet_status_t duet_cuda_matmul_lt(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                  const float *x, int n, float *y);
/* The tensor-core decode kernel at any n (DUET_ERR_UNSUPPORTED for f32 weights, columns not a
 * multiple of 128, row_begin not a multiple of 16, unaligned buffers). */
duet_status_t duet_cuda_matmul_gemv_tc(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                       const float *x, int n, float *y);

/* The batch-invariant choice (duet_cuda_set_invariant routes duet_cuda_matmul here): one
 * kernel per weight whatever n is, so a row's result never depends on the other rows: the
 * tensor-core decode kernel (fp32-faithful through the 3-way split of x) where it applies,
 * else the fp32-unit kernel.  Both split the columns by the weight's shape only and keep
 * each token's accumulation to itself.  Same tolerance as the decode kernels (1e-5), at
 * every n; slower than cuBLASLt at prefill sizes (docs/PERF.md). */
duet_status_t duet_cuda_matmul_invariant(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                         const float *x, int n, float *y);
/* 1 when duet_cuda_matmul_invariant takes the tensor-core kernel for this weight, row_begin and x. */
int duet_cuda_matmul_invariant_tc(const duet_weight_t *w, int row_begin, const float *x);

/* fp8 weights on the fp8 tensor cores (prefill): each row of x is quantized
 * to e4m3 per 128 columns with an fp32 scale amax/448 (as the model's own
 * inference code does), then cuBLASLt multiplies with 1×128 activation and
 * 128×128 weight block scales, fp32 out.  A different function from the
 * contract (activations lose ~2.5% rms to e4m3): checked against the CPU
 * reference fed the same quantized activations.  Needs sm_90 and cuBLASLt
 * 12.9+, w->cols % 128 == 0, row_begin % 128 == 0; DUET_ERR_UNSUPPORTED
 * otherwise. */
duet_status_t duet_cuda_matmul_fp8_act(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                       const float *x, int n, float *y);
/* The output type cuBLASLt accepted for the fp8 GEMM so far (for reports):
 * 0 not used yet, 1 fp32, 2 bf16 (then converted to fp32: ~3e-3 more error). */
int duet_cuda_fp8_act_output(const duet_cuda_t *c);
/* Diagnostic for the check harness: the scale layouts handed to cuBLASLt.
 * 0 (the documented one, default): activation scales [k/128][n] with the row
 * index fastest, weight scales [rows/128][k/128 padded to 4].  Bit 0 makes the
 * activation scales [n][k/128], bit 1 the weight scales [k/128][rows/128
 * padded to 4]. */
void duet_cuda_fp8_act_scale_layout(duet_cuda_t *c, int variant);

#ifdef __cplusplus
}
#endif

#endif
