/* Compressor pooling on the GPU: duet_kernels_t.compress_pool for n_entries
 * entries in one launch.  Entry e reads kv + e*entry_stride and
 * gate + e*entry_stride (rows of `stride` floats, n_slots rows, first `dim`
 * used) and writes out + e*dim.  Same operation order as the CPU, the
 * exponential ref_math.h's on both: bit-exact. */
#ifndef DUET_CUDA_COMPRESS_POOL_CUH
#define DUET_CUDA_COMPRESS_POOL_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_compress_pool(duet_cuda_t *c, const float *kv, const float *gate, int n_slots, int dim,
                                      int stride, int n_entries, size_t entry_stride, float *out);

#ifdef __cplusplus
}
#endif

#endif
