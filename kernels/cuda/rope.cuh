/* RoPE on the GPU: duet_kernels_t.rope over device pointers (x and pos on
 * the device; the frequency table r is read on the host and passed by value).
 * Same float operations in the same order as the CPU (no fused multiply-add),
 * the sine and cosine ref_math.h's on both: bit-exact (duet-check-ops). */
#ifndef DUET_CUDA_ROPE_CUH
#define DUET_CUDA_ROPE_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_rope(duet_cuda_t *c, float *x, int n, int n_heads, int head_dim, const int64_t *pos,
                             const duet_rope_t *r, int sign);

#ifdef __cplusplus
}
#endif

#endif
