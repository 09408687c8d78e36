/* CPU reference: norms, RoPE, attention, compressor pooling, indexer, top-k,
 * hyper-connections, SwiGLU.  Plain loops; shapes in the comments.  The exponential,
 * sine, cosine, the dot products, the norm's inverse and the hyper-connection weights are
 * ref_math.h's (the same bits on every machine and on the GPU). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu.h"
#include "ref_math.h"

void duet_cpu_rmsnorm(const float *x, const float *weight, int n, int dim, float eps, float *y)
{
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *yi = y + (size_t)i * dim;
        float inv = duet_ref_rms_inv(duet_ref_dot(xi, xi, dim), dim, eps);
        for (int c = 0; c < dim; c++)
            yi[c] = weight ? weight[c] * (xi[c] * inv) : xi[c] * inv;
    }
}

void duet_cpu_rope(float *x, int n, int n_heads, int head_dim, const int64_t *pos, const duet_rope_t *r, int sign)
{
    int rd = r->rope_dim, off = head_dim - rd;
    for (int i = 0; i < n; i++) {
        float p = (float)pos[i];
        for (int j = 0; j < rd / 2; j++) {
            float f = r->inv_freq[j] * p;
            float c, s;
            duet_ref_sincosf(f, &s, &c);
            s = s * (float)sign;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)i * n_heads + h) * head_dim + off;
                float a = v[2 * j], b = v[2 * j + 1];
                v[2 * j] = a * c - b * s;
                v[2 * j + 1] = b * c + a * s;
            }
        }
    }
}

/* q(n_heads, dim), keys(n_keys, dim) -> out(n_heads, dim) */
void duet_cpu_attn_row(const float *q, int n_heads, int dim, const float *keys, int n_keys, const float *sinks,
                       float scale, float *out)
{
    float *logit = malloc(sizeof(float) * (size_t)(n_keys > 0 ? n_keys : 1));
    for (int h = 0; h < n_heads; h++) {
        const float *qh = q + (size_t)h * dim;
        float *oh = out + (size_t)h * dim;
        float mx = sinks[h];
        for (int j = 0; j < n_keys; j++) {
            logit[j] = duet_ref_dot(qh, keys + (size_t)j * dim, dim) * scale;
            if (logit[j] > mx)
                mx = logit[j];
        }
        float denom = duet_ref_expf(sinks[h] - mx);
        for (int j = 0; j < n_keys; j++) {
            logit[j] = duet_ref_expf(logit[j] - mx);
            denom += logit[j];
        }
        for (int c = 0; c < dim; c++)
            oh[c] = 0.0f;
        for (int j = 0; j < n_keys; j++) {
            const float *k = keys + (size_t)j * dim;
            float p = logit[j] / denom;
            for (int c = 0; c < dim; c++)
                oh[c] += p * k[c];
        }
    }
    free(logit);
}

/* kv, gate: (n_slots, stride) rows, first `dim` used; out(dim) */
void duet_cpu_compress_pool(const float *kv, const float *gate, int n_slots, int dim, int stride, float *out)
{
    for (int c = 0; c < dim; c++) {
        float mx = -INFINITY;
        for (int s = 0; s < n_slots; s++) {
            float g = gate[(size_t)s * stride + c];
            if (g > mx)
                mx = g;
        }
        float denom = 0.0f, acc = 0.0f;
        if (mx == -INFINITY) {
            out[c] = 0.0f;
            continue;
        }
        for (int s = 0; s < n_slots; s++)
            denom += duet_ref_expf(gate[(size_t)s * stride + c] - mx);
        for (int s = 0; s < n_slots; s++) {
            float g = gate[(size_t)s * stride + c];
            if (g == -INFINITY)
                continue;
            acc += kv[(size_t)s * stride + c] * (duet_ref_expf(g - mx) / denom);
        }
        out[c] = acc;
    }
}

/* q(n_heads, dim), w(n_heads), keys(n_keys, dim) -> score(n_keys) */
void duet_cpu_index_score(const float *q, const float *w, int n_heads, int dim, const float *keys, int n_keys,
                          float scale, float *score)
{
    for (int s = 0; s < n_keys; s++) {
        const float *k = keys + (size_t)s * dim;
        float acc = 0.0f;
        for (int h = 0; h < n_heads; h++) {
            float d = duet_ref_dot(q + (size_t)h * dim, k, dim);
            if (d < 0.0f)
                d = 0.0f;
            acc += d * scale * w[h];
        }
        score[s] = acc;
    }
}

typedef struct {
    float v;
    int32_t i;
} topk_item_t;

/* Descending value, then ascending index: a total order, so selection is deterministic. */
static int topk_better(const topk_item_t *a, const topk_item_t *b)
{
    if (a->v != b->v)
        return a->v > b->v;
    return a->i < b->i;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void duet_cpu_topk(const float *v, int n, int k, int32_t *idx)
{
    if (k > n)
        k = n;
    if (k <= 0)
        return;
    /* min-heap of the k best seen so far (root = worst) */
    topk_item_t *heap = malloc(sizeof(topk_item_t) * (size_t)k);
    int len = 0;
    for (int i = 0; i < n; i++) {
        topk_item_t it = {v[i] != v[i] ? -INFINITY : v[i], i};
        if (len < k) {
            int j = len++;
            heap[j] = it;
            while (j > 0) {
                int p = (j - 1) / 2;
                if (!topk_better(&heap[p], &heap[j]))
                    break;
                topk_item_t t = heap[p]; heap[p] = heap[j]; heap[j] = t;
                j = p;
            }
        } else if (topk_better(&it, &heap[0])) {
            heap[0] = it;
            int j = 0;
            for (;;) {
                int l = 2 * j + 1, r = l + 1, w = j;
                if (l < len && topk_better(&heap[w], &heap[l]))
                    w = l;
                if (r < len && topk_better(&heap[w], &heap[r]))
                    w = r;
                if (w == j)
                    break;
                topk_item_t t = heap[w]; heap[w] = heap[j]; heap[j] = t;
                j = w;
            }
        }
    }
    for (int j = 0; j < k; j++)
        idx[j] = heap[j].i;
    free(heap);
    qsort(idx, (size_t)k, sizeof(int32_t), cmp_i32);
}

/* x(n, hc, dim); fn(mix = (2+hc)*hc, hc*dim) */
void duet_cpu_hc_pre(const float *x, int n, int hc, int dim, const float *fn, const float *base, const float *scale,
                     int sinkhorn_iters, float hc_eps, float norm_eps, float *post, float *comb, float *collapsed)
{
    int flat_dim = hc * dim, mix = (2 + hc) * hc;
    float *flat = malloc(sizeof(float) * (size_t)flat_dim);
    float *mixes = malloc(sizeof(float) * (size_t)mix);
    float pre[64];
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * flat_dim;
        duet_cpu_rmsnorm(xi, NULL, 1, flat_dim, norm_eps, flat);
        for (int m = 0; m < mix; m++)
            mixes[m] = duet_ref_dot(flat, fn + (size_t)m * flat_dim, flat_dim);
        float *po = post + (size_t)i * hc, *cb = comb + (size_t)i * hc * hc;
        duet_ref_hc_mix(mixes, hc, scale, base, sinkhorn_iters, hc_eps, pre, po, cb);
        float *y = collapsed + (size_t)i * dim;
        for (int c = 0; c < dim; c++) {
            float acc = 0.0f;
            for (int k = 0; k < hc; k++)
                acc += pre[k] * xi[(size_t)k * dim + c];
            y[c] = acc;
        }
    }
    free(flat);
    free(mixes);
}

void duet_cpu_hc_post(float *x, int n, int hc, int dim, const float *f, const float *post, const float *comb)
{
    float *tmp = malloc(sizeof(float) * (size_t)hc);
    for (int i = 0; i < n; i++) {
        float *xi = x + (size_t)i * hc * dim;
        const float *fi = f + (size_t)i * dim, *po = post + (size_t)i * hc, *cb = comb + (size_t)i * hc * hc;
        for (int c = 0; c < dim; c++) {
            for (int k = 0; k < hc; k++) {
                float acc = 0.0f;
                for (int j = 0; j < hc; j++)
                    acc += cb[j * hc + k] * xi[(size_t)j * dim + c];
                tmp[k] = po[k] * fi[c] + acc;
            }
            for (int k = 0; k < hc; k++)
                xi[(size_t)k * dim + c] = tmp[k];
        }
    }
    free(tmp);
}

void duet_cpu_hc_head(const float *x, int n, int hc, int dim, const float *fn, const float *base, float scale,
                      float hc_eps, float norm_eps, float *y)
{
    int flat_dim = hc * dim;
    float *flat = malloc(sizeof(float) * (size_t)flat_dim);
    float pre[64];
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * flat_dim;
        duet_cpu_rmsnorm(xi, NULL, 1, flat_dim, norm_eps, flat);
        for (int k = 0; k < hc; k++) {
            pre[k] = duet_ref_sigmoidf(duet_ref_dot(flat, fn + (size_t)k * flat_dim, flat_dim) * scale + base[k]) +
                     hc_eps;
        }
        float *yi = y + (size_t)i * dim;
        for (int c = 0; c < dim; c++) {
            float acc = 0.0f;
            for (int k = 0; k < hc; k++)
                acc += pre[k] * xi[(size_t)k * dim + c];
            yi[c] = acc;
        }
    }
    free(flat);
}

void duet_cpu_swiglu(const float *gate, const float *up, int n, int inter, float limit, float *y)
{
    for (size_t i = 0; i < (size_t)n * inter; i++) {
        float g = gate[i], u = up[i];
        if (limit > 0.0f) {
            if (g > limit)
                g = limit;
            if (u > limit)
                u = limit;
            if (u < -limit)
                u = -limit;
        }
        y[i] = g / (1.0f + duet_ref_expf(-g)) * u;
    }
}
