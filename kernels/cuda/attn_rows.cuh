/* Shared-KV MQA with sinks on the GPU, decode form: duet_kernels_t.attn_row
 * for n_rows query rows in one launch, each with its own gathered keys.
 * Row b: q + b*n_heads*dim, keys + key_off[b]*dim (n_keys[b] keys; key_off,
 * n_keys device arrays), out + b*n_heads*dim.  sinks(n_heads) on the device.
 * The keys of a row are split across blocks (each with an online softmax over
 * its part), then combined with the sink.  dim % 4 == 0, dim <= 1024.
 * Two forms: for dim 128, 256 and 512 (duet_cuda_attn_rows_tc_ok) the products
 * run on the tensor cores (bf16, q and the weights each as three bf16 parts
 * that add up to them exactly, fp32 accumulation), which reads the keys as
 * bf16: every key the engine passes is a decoded cache entry, exact in bf16;
 * other float keys are rounded to bf16.  Other dims, or duet_cuda_set_attn_tc(c, 0),
 * take the fp32 units.  Summation order and expf differ from the CPU (checked
 * at 2e-5).  The split follows the batch (n_rows, max_keys), except in
 * batch-invariant mode (duet_cuda_set_invariant): 8 parts per row, from its
 * own n_keys only. */
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
/* The same with the keys as bf16 (bits, 2 bytes a value): half the bytes of the float form,
 * the same results bit for bit where the float keys are exact in bf16 (the engine's are).
 * Only the tensor-core form reads them: DUET_ERR_UNSUPPORTED unless
 * duet_cuda_attn_rows_bf16_ok(c, dim). */
duet_status_t duet_cuda_attn_rows_bf16(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim,
                                       const uint16_t *keys, const int32_t *key_off, const int32_t *n_keys,
                                       int max_keys, const float *sinks, float scale, float *out);
int duet_cuda_attn_rows_bf16_ok(const duet_cuda_t *c, int dim);
/* 1 when dim has the tensor-core form. */
int duet_cuda_attn_rows_tc_ok(int dim);
/* on 0: attn_rows on the fp32 units at every dim (for comparison); 1 (the default): the
 * tensor-core form where it exists. */
void duet_cuda_set_attn_tc(duet_cuda_t *c, int on);

#ifdef __cplusplus
}
#endif

#endif
