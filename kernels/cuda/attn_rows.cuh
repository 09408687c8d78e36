/* Shared-KV MQA with sinks on the GPU, decode form: duet_kernels_t.attn_row
 * for n_rows query rows in one launch, each with its own gathered keys.
 * Row b: q + b*n_heads*dim, keys + key_off[b]*dim (n_keys[b] keys; key_off,
 * n_keys device arrays), out + b*n_heads*dim.  sinks(n_heads) on the device.
 * The keys of a row are split across blocks (each with an online softmax over
 * its part), then combined with the sink; fp32 throughout.  Summation order
 * and expf differ from the CPU (checked at 2e-5).  dim % 4 == 0, dim <= 1024.
 * The split follows the batch (n_rows, max_keys), except in batch-invariant
 * mode (duet_cuda_set_invariant): 8 parts per row, from its own n_keys only. */
#ifndef DUET_CUDA_ATTN_ROWS_CUH
#define DUET_CUDA_ATTN_ROWS_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* max_keys: an upper bound of n_keys[] (host-side hint that sizes the split). */
duet_status_t duet_cuda_attn_rows(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim, const float *keys,
                                  const int32_t *key_off, const int32_t *n_keys, int max_keys, const float *sinks,
                                  float scale, float *out);

#ifdef __cplusplus
}
#endif

#endif
