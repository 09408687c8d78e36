/* Compressor pooling on the GPU (contract in compress_pool.cuh): one thread
 * per (entry, column), the CPU's loops and order (max, denominator, then the
 * weighted sum skipping -inf gates). */
#include "common.cuh"

__global__ void compress_pool_kernel(const float *kv, const float *gate, int n_slots, int dim, int stride,
                                     int n_entries, size_t entry_stride, float *out)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n_entries * dim)
        return;
    int e = (int)(i / dim), col = (int)(i % dim);
    const float *k = kv + e * entry_stride + col, *g = gate + e * entry_stride + col;
    float mx = -INFINITY;
    for (int s = 0; s < n_slots; s++)
        mx = fmaxf(mx, g[(size_t)s * stride]);
    if (mx == -INFINITY) {
        out[i] = 0.0f;
        return;
    }
    float denom = 0.0f, acc = 0.0f;
    for (int s = 0; s < n_slots; s++)
        denom = __fadd_rn(denom, duet_ref_expf(__fsub_rn(g[(size_t)s * stride], mx)));
    for (int s = 0; s < n_slots; s++) {
        float gs = g[(size_t)s * stride];
        if (gs == -INFINITY)
            continue;
        acc = __fadd_rn(acc, __fmul_rn(k[(size_t)s * stride], __fdiv_rn(duet_ref_expf(__fsub_rn(gs, mx)), denom)));
    }
    out[i] = acc;
}

extern "C" duet_status_t duet_cuda_compress_pool(duet_cuda_t *c, const float *kv, const float *gate, int n_slots,
                                                 int dim, int stride, int n_entries, size_t entry_stride, float *out)
{
    size_t total = (size_t)n_entries * dim;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, compress_pool_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, kv, gate,
                                        n_slots, dim, stride, n_entries, entry_stride, out));
    return DUET_OK;
}
