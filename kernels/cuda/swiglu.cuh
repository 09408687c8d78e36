/* SwiGLU on the GPU: duet_kernels_t.swiglu over device pointers.  The CPU's
 * operations in its order, the exponential ref_math.h's on both: bit-exact. */
#ifndef DUET_CUDA_SWIGLU_CUH
#define DUET_CUDA_SWIGLU_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_swiglu(duet_cuda_t *c, const float *gate, const float *up, int n, int inter, float limit,
                               float *y);

#ifdef __cplusplus
}
#endif

#endif
