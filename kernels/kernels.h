/* The operation table (DESIGN §8).
 *
 * Each operation's signature is declared once here.  duet_kernels_init_cpu()
 * fills every slot with the plain-C reference (kernels/cpu/); a GPU backend
 * overrides the slots it implements and the reference stays as the oracle
 * its check harness compares against.
 *
 * Conventions: activations are fp32 row-major; every operation is
 * batch-invariant (a row's result never depends on the other rows or on how
 * many there are), which is what makes chunked prefill bit-exact with
 * single-shot prefill.  Shapes are given as (rows, cols). */
#ifndef DUET_KERNELS_H
#define DUET_KERNELS_H

#include <stdint.h>

#include "cache_layout.h"
#include "dtype.h"

/* A linear layer's weight [rows = out features, cols = in features], in the
 * dtype it was stored with:
 *   BF16         data: bf16[rows][cols]
 *   F32          data: f32[rows][cols]
 *   F8_E4M3      data: e4m3[rows][cols], scale: [ceil(rows/128)][ceil(cols/128)] (ue8m0 or f32)
 *   F4_E2M1X2    data: byte[rows][cols/2] (low nibble = even column), scale: [rows][cols/32] (ue8m0)
 * A device copy may be `tiled` (duet_cuda_weight_tile, kernels/cuda/matmul.cuh): the same bytes
 * regrouped for the tensor-core kernel's reads, which only it takes. */
typedef struct {
    duet_dtype_t dtype;
    int rows, cols;
    const void *data;
    const void *scale;
    duet_dtype_t scale_dtype; /* F8_E8M0 or F32 */
    int scale_cols;           /* columns of the scale grid */
    int tiled;                /* 0: the layouts above; 1: fp4 tiled (duet_cuda_weight_tile; device copies) */
    /* device copies, the tensor-core decode kernel: its running total's chunks in units of 128
     * columns (0: the kernel's default).  Another grouping gives other bits, the same ones at
     * every batch size; a weight set so takes only that kernel (kernels/cuda/matmul.cu). */
    int chunk_units;
} duet_weight_t;

/* Interleaved RoPE frequencies: one inverse frequency per pair. */
typedef struct {
    int rope_dim;          /* rotated channels (pairs = rope_dim/2) */
    float inv_freq[256];   /* rope_dim/2 entries */
} duet_rope_t;

typedef struct duet_kernels {
    /* y(n, row_end-row_begin) = x(n, w->cols) · W[row_begin:row_end]ᵀ; accumulation in fp32 in
     * ascending column order (per 128-column block for fp8, per 32 for fp4). */
    void (*matmul)(const duet_weight_t *w, int row_begin, int row_end, const float *x, int n, float *y);
    /* y(n, dim) = x / sqrt(mean(x²) + eps) * weight (weight may be NULL: unweighted). x may equal y. */
    void (*rmsnorm)(const float *x, const float *weight, int n, int dim, float eps, float *y);
    /* Rotate the last rope_dim channels of each of n_heads vectors of length head_dim in x(n, n_heads*head_dim)
     * at positions pos[n]; sign -1 applies the inverse rotation. */
    void (*rope)(float *x, int n, int n_heads, int head_dim, const int64_t *pos, const duet_rope_t *r, int sign);
    /* Encode/decode cache entries (fp8 / bf16 layouts of DESIGN §4). */
    void (*cache_store)(const duet_cache_layout_t *l, uint8_t *page, uint32_t idx, const float *vec);
    void (*cache_load)(const duet_cache_layout_t *l, const uint8_t *page, uint32_t idx, float *vec);
    /* Shared-KV MQA with a per-head sink for one query row:
     * q(n_heads, dim), keys(n_keys, dim) serve as K and V; out(n_heads, dim).
     * logits = q·k * scale; p = softmax over [logits, sink_h] with the sink dropped. */
    void (*attn_row)(const float *q, int n_heads, int dim, const float *keys, int n_keys, const float *sinks,
                     float scale, float *out);
    /* Gated softmax pooling of one compressed entry: kv(n_slots, dim), gate(n_slots, dim) with
     * rows whose gate is -inf ignored; out[c] = Σ_s softmax_s(gate[s][c]) kv[s][c]. */
    void (*compress_pool)(const float *kv, const float *gate, int n_slots, int dim, int stride, float *out);
    /* Lightning indexer scores for one query: q(n_heads, dim), w(n_heads), keys(n_keys, dim):
     * score[s] = Σ_h w[h] * relu(q_h·k_s) * scale. */
    void (*index_score)(const float *q, const float *w, int n_heads, int dim, const float *keys, int n_keys,
                        float scale, float *score);
    /* Indices of the k largest values of v(n) (ties: lower index first), returned in ascending index order. */
    void (*topk)(const float *v, int n, int k, int32_t *idx);
    /* Hyper-connection weights for n rows of hc streams (n, hc, dim):
     * pre(n, hc), post(n, hc), comb(n, hc, hc) from fn(mix, hc*dim), base(mix), scale(3);
     * collapsed(n, dim) = Σ_i pre_i x_i. */
    void (*hc_pre)(const float *x, int n, int hc, int dim, const float *fn, const float *base, const float *scale,
                   int sinkhorn_iters, float hc_eps, float norm_eps, float *post, float *comb, float *collapsed);
    /* x_new[k] = post[k] * f + Σ_j comb[j][k] x[j], for n rows; x updated in place. */
    void (*hc_post)(float *x, int n, int hc, int dim, const float *f, const float *post, const float *comb);
    /* Final collapse: y(n, dim) = Σ_i (sigmoid(mix_i*scale + base_i) + eps) x_i. */
    void (*hc_head)(const float *x, int n, int hc, int dim, const float *fn, const float *base, float scale,
                    float hc_eps, float norm_eps, float *y);
    /* y(n, inter) = silu(min(gate, limit)) * clamp(up, -limit, limit); limit <= 0 disables the clamp. */
    void (*swiglu)(const float *gate, const float *up, int n, int inter, float limit, float *y);
} duet_kernels_t;

/* Fill every slot with the CPU reference. */
void duet_kernels_init_cpu(duet_kernels_t *k);

/* The process-wide table (CPU reference unless a backend replaced slots). */
const duet_kernels_t *duet_kernels(void);
/* The same table, writable: a tool wraps a slot before any forward runs and puts it back
 * after (duet-check-sensitivity). */
duet_kernels_t *duet_kernels_mutable(void);

/* RoPE tables from the model config: `main` (rope_theta, no scaling; ratio-0 layers) and
 * `compress` (compress_rope_theta with yarn; compressed layers, their compressors and indexers). */
void duet_rope_init(duet_rope_t *r, int rope_dim, double theta, const void *yarn /* const duet_yarn_t* or NULL */);

#endif
