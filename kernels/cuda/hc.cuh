/* Hyper-connection mixing on the GPU: duet_kernels_t.hc_pre, hc_post and
 * hc_head over device pointers (fn, base, scale included; hc <= 16).
 * hc_pre / hc_head: one block per row (RMSNorm of the hc*dim stream, the mix
 * products, then the tiny sigmoid / Sinkhorn part in one thread, in the CPU's
 * order, ref_math.h's exponential); the summation order differs (checked at 1e-5;
 * CPU-exact mode, duet_cuda_set_exact, takes exact.cu's forms, the CPU's bits).
 * hc_post: the CPU's operations in its order without fused multiply-add,
 * bit-exact.  The column split of hc_pre / hc_head follows n, except in
 * batch-invariant mode (duet_cuda_set_invariant), where it is that of n = 1. */
#ifndef DUET_CUDA_HC_CUH
#define DUET_CUDA_HC_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_hc_pre(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                               const float *base, const float *scale, int sinkhorn_iters, float hc_eps,
                               float norm_eps, float *post, float *comb, float *collapsed);
duet_status_t duet_cuda_hc_post(duet_cuda_t *c, float *x, int n, int hc, int dim, const float *f, const float *post,
                                const float *comb);
/* hc_pre followed by duet_cuda_rmsnorm(collapsed, norm_w, eps) -> y in two launches instead of
 * three, bit for bit the same post, comb and y (collapsed is not stored).  Takes rows of up to
 * 8 x duet_cuda_rmsnorm_threads(dim) columns (duet_cuda_hc_norm_ok; UNSUPPORTED beyond). */
int duet_cuda_hc_norm_ok(int hc, int dim);
duet_status_t duet_cuda_hc_pre_norm(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                    const float *base, const float *scale, int sinkhorn_iters, float hc_eps,
                                    float norm_eps, float *post, float *comb, const float *norm_w, float eps,
                                    float *y, int comb_logits);
/* comb_logits (hc_pre_norm, hc_post_pre_norm; only where duet_cuda_hc_sinkhorn_ok(hc)): comb is
 * left as its logits, the row softmax's and Sinkhorn iterations' input, and duet_cuda_hc_sinkhorn
 * turns them into comb with the same bits as the operation's own: the iterations, one warp's
 * serial chain that only the next hc_post reads, can then run on another stream (a fork after the
 * pre-mix, a join before that hc_post) while y goes on to its matmuls. */
int duet_cuda_hc_sinkhorn_ok(int hc);
duet_status_t duet_cuda_hc_sinkhorn(duet_cuda_t *c, int n, int hc, int sinkhorn_iters, float hc_eps, float *comb);
/* hc_head followed by the rmsnorm, the same way. */
duet_status_t duet_cuda_hc_head_norm(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                     const float *base, float scale, float hc_eps, float norm_eps,
                                     const float *norm_w, float eps, float *y);
/* hc_post(x, f, post, comb) followed by hc_pre_norm / hc_head_norm of the updated x, bit for
 * bit the two operations; where the partial sums take their decode-size path and hc <= 4, the
 * update is made in their launch (a slice of columns holds every stream's value there), one
 * launch and one read of x fewer.  post and comb are read as hc_post's, then hc_post_pre_norm
 * writes the new ones over them. */
duet_status_t duet_cuda_hc_post_pre_norm(duet_cuda_t *c, float *x, int n, int hc, int dim, const float *f,
                                         const float *fn, const float *base, const float *scale, int sinkhorn_iters,
                                         float hc_eps, float norm_eps, float *post, float *comb, const float *norm_w,
                                         float eps, float *y, int comb_logits);
duet_status_t duet_cuda_hc_post_head_norm(duet_cuda_t *c, float *x, int n, int hc, int dim, const float *f,
                                          const float *post, const float *comb, const float *fn, const float *base,
                                          float scale, float hc_eps, float norm_eps, const float *norm_w, float eps,
                                          float *y);
/* scale: a host value, as in the CPU contract. */
duet_status_t duet_cuda_hc_head(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                const float *base, float scale, float hc_eps, float norm_eps, float *y);

#ifdef __cplusplus
}
#endif

#endif
