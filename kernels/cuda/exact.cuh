/* The CPU-exact forms (duet_cuda_set_exact, duet_cuda.h): the operations whose fast kernels
 * sum in another order than the CPU reference, redone in its order with its roundings, so
 * that each result is the CPU's bits.  One thread per output (or per row where the reference
 * runs a row as one sequence; the matmul eight, one per lane of its dot product; attention a
 * block a row and head, its steps split where the CPU's order allows), ref_math.h's
 * dot products and functions: correct at any shape, far slower than the fast kernels (a
 * verification mode); the wrappers of
 * matmul.cuh, rmsnorm.cuh, attn_rows.cuh, index_score.cuh and hc.cuh call these when the
 * context is in CPU-exact mode.  The other operations the forward takes (rope, SwiGLU,
 * compressor pooling, hc_post, the cache codecs, top-k, the copies) are the CPU's bits in
 * every mode. */
#ifndef DUET_CUDA_EXACT_CUH
#define DUET_CUDA_EXACT_CUH

#include "common.cuh"

duet_status_t duet_cuda_exact_matmul(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                     const float *x, int n, float *y);
duet_status_t duet_cuda_exact_rmsnorm(duet_cuda_t *c, const float *x, const float *weight, int n, int dim, float eps,
                                      float *y);
duet_status_t duet_cuda_exact_attn_rows(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim,
                                        const float *keys, const int32_t *key_off, const int32_t *n_keys,
                                        int max_keys, const float *sinks, float scale, float *out);
/* keys: fp32 keys (l NULL), or entries of an index-K pool (l, base, unit, idx as in
 * duet_cuda_index_score_cache). */
duet_status_t duet_cuda_exact_index_score(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads,
                                          int dim, const float *keys, const duet_cache_layout_t *l,
                                          const uint8_t *base, const uint32_t *unit, const uint32_t *idx,
                                          const int32_t *key_off, const int32_t *n_keys, const int32_t *score_off,
                                          int max_keys, float scale, float *score);
duet_status_t duet_cuda_exact_hc_pre(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                     const float *base, const float *scale, int sinkhorn_iters, float hc_eps,
                                     float norm_eps, float *post, float *comb, float *collapsed);
duet_status_t duet_cuda_exact_hc_head(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                      const float *base, float scale, float hc_eps, float norm_eps, float *y);

/* The error a fast-only operation returns in CPU-exact mode. */
#define DUET_CUDA_NOT_EXACT(c, op)                                                                                 \
    duet_cuda_failf((c), DUET_ERR_UNSUPPORTED, "%s has no CPU-exact form (duet_cuda_set_exact)", (op))

#endif
