/* Top-k on the GPU, batched over rows: duet_kernels_t.topk for each row
 * b < n_rows over v + off[b] (n[b] values; off and n device arrays), writing
 * min(k, n[b]) indices in ascending order to idx + b*k and -1 in the rest.
 * Bit-exact with the CPU: values ordered descending then index ascending,
 * NaN taken as -inf, -0 equal to +0 (a radix select over a 32-bit ordered key,
 * then an index-ordered compaction that takes the lowest indices among the
 * values equal to the k-th). */
#ifndef DUET_CUDA_TOPK_CUH
#define DUET_CUDA_TOPK_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* max_n: an upper bound of n[] (host hint: rows up to min(max_n, 32768) values are staged in shared memory). */
duet_status_t duet_cuda_topk(duet_cuda_t *c, const float *v, const int32_t *off, const int32_t *n, int n_rows,
                             int max_n, int k, int32_t *idx);

#ifdef __cplusplus
}
#endif

#endif
