/* RoPE on the GPU (contract in rope.cuh): one thread per (row, head, pair);
 * the angle inv_freq[j] * (float)pos and the rotation are the CPU's float
 * operations in its order, without fused multiply-add. */
#include "common.cuh"

struct rope_table {
    float inv_freq[128];
};

__global__ void rope_kernel(float *x, int n, int n_heads, int head_dim, const int64_t *pos, rope_table t, int pairs,
                            float sign)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t total = (size_t)n * pairs * n_heads;
    if (i >= total)
        return;
    /* pair fastest: a warp touches consecutive pairs of one head (coalesced) */
    int j = (int)(i % pairs);
    int h = (int)((i / pairs) % n_heads);
    int row = (int)(i / ((size_t)n_heads * pairs));
    float p = (float)pos[row];
    float f = __fmul_rn(t.inv_freq[j], p);
    float co, si;
    duet_ref_sincosf(f, &si, &co);
    si = __fmul_rn(si, sign);
    float *v = x + ((size_t)row * n_heads + h) * head_dim + (head_dim - 2 * pairs);
    float a = v[2 * j], b = v[2 * j + 1];
    v[2 * j] = __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si));
    v[2 * j + 1] = __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
}

extern "C" duet_status_t duet_cuda_rope(duet_cuda_t *c, float *x, int n, int n_heads, int head_dim,
                                        const int64_t *pos, const duet_rope_t *r, int sign)
{
    int pairs = r->rope_dim / 2;
    if (pairs > 128 || r->rope_dim > head_dim || r->rope_dim < 0)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "rope: rope_dim %d with head_dim %d", r->rope_dim, head_dim);
    size_t total = (size_t)n * pairs * n_heads;
    if (!total)
        return DUET_OK;
    rope_table t;
    memset(&t, 0, sizeof t);
    memcpy(t.inv_freq, r->inv_freq, sizeof(float) * (size_t)pairs);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, rope_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, x, n, n_heads,
                                        head_dim, pos, t, pairs, (float)sign));
    return DUET_OK;
}
