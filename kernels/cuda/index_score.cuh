/* Lightning-indexer scores on the GPU, batched over query rows:
 * duet_kernels_t.index_score for each row b < n_rows with
 *   q      = q + b*n_heads*dim,  w = w + b*n_heads,
 *   keys   = keys + key_off[b]*dim (n_keys[b] keys, device arrays),
 *   score  = score + key_off[b]     (so top-k can read the same packing).
 * A tiled fp32 product (64 heads × 64 keys per block); summation order
 * differs from the CPU (checked at 1e-5).  The pool form below runs on
 * tensor cores where the shape allows (index_score.cu). */
#ifndef DUET_CUDA_INDEX_SCORE_CUH
#define DUET_CUDA_INDEX_SCORE_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* max_keys: an upper bound of n_keys[] (host-side hint that sizes the grid). */
duet_status_t duet_cuda_index_score(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads, int dim,
                                    const float *keys, const int32_t *key_off, const int32_t *n_keys, int max_keys,
                                    float scale, float *score);
/* The same with the scores of row b at score + score_off[b] (a device array; NULL: key_off),
 * for query rows that share one key list (the rows of a prefill chunk): each row then gets
 * its own n_keys[b] scores over the same keys. */
duet_status_t duet_cuda_index_score_rows(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads,
                                         int dim, const float *keys, const int32_t *key_off, const int32_t *n_keys,
                                         const int32_t *score_off, int max_keys, float scale, float *score);

/* duet_cuda_index_score_rows with the keys read from the index-K pool: key kk of row b is entry
 * e = key_off[b] + kk of the lists unit and idx (device arrays: page unit[e] of l at base,
 * index idx[e]), decoded as duet_cuda_cache_load decodes it, so the scores are the same bits as
 * that load into an fp32 array followed by duet_cuda_index_score_rows, without the array.  dim
 * must be the pool's vec_dim. */
duet_status_t duet_cuda_index_score_cache(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads,
                                          int dim, const duet_cache_layout_t *l, const uint8_t *base,
                                          const uint32_t *unit, const uint32_t *idx, const int32_t *key_off,
                                          const int32_t *n_keys, const int32_t *score_off, int max_keys,
                                          float scale, float *score);

#ifdef __cplusplus
}
#endif

#endif
