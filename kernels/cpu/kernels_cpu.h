/* CPU reference operations (see kernels.h for each contract). */
#ifndef DUET_KERNELS_CPU_H
#define DUET_KERNELS_CPU_H

#include "kernels.h"

void duet_cpu_matmul(const duet_weight_t *w, int row_begin, int row_end, const float *x, int n, float *y);
void duet_cpu_rmsnorm(const float *x, const float *weight, int n, int dim, float eps, float *y);
void duet_cpu_rope(float *x, int n, int n_heads, int head_dim, const int64_t *pos, const duet_rope_t *r, int sign);
void duet_cpu_attn_row(const float *q, int n_heads, int dim, const float *keys, int n_keys, const float *sinks,
                       float scale, float *out);
void duet_cpu_compress_pool(const float *kv, const float *gate, int n_slots, int dim, int stride, float *out);
void duet_cpu_index_score(const float *q, const float *w, int n_heads, int dim, const float *keys, int n_keys,
                          float scale, float *score);
void duet_cpu_topk(const float *v, int n, int k, int32_t *idx);
void duet_cpu_hc_pre(const float *x, int n, int hc, int dim, const float *fn, const float *base, const float *scale,
                     int sinkhorn_iters, float hc_eps, float norm_eps, float *post, float *comb, float *collapsed);
void duet_cpu_hc_post(float *x, int n, int hc, int dim, const float *f, const float *post, const float *comb);
void duet_cpu_hc_head(const float *x, int n, int hc, int dim, const float *fn, const float *base, float scale,
                      float hc_eps, float norm_eps, float *y);
void duet_cpu_swiglu(const float *gate, const float *up, int n, int inter, float limit, float *y);

#endif
