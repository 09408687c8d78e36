/* SwiGLU on the GPU (contract in swiglu.cuh): elementwise, the CPU's
 * operations in its order (g / (1 + e^-g) * u), four values per thread. */
#include "common.cuh"

__device__ __forceinline__ float swiglu1(float g, float u, float limit)
{
    if (limit > 0.0f) {
        if (g > limit)
            g = limit;
        if (u > limit)
            u = limit;
        if (u < -limit)
            u = -limit;
    }
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, duet_ref_expf(-g))), u);
}

__global__ void swiglu_kernel(const float *gate, const float *up, size_t n, float limit, float *y)
{
    duet_pdl_wait();
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 4;
    if (i + 4 <= n && ((uintptr_t)(gate + i) | (uintptr_t)(up + i) | (uintptr_t)(y + i)) % 16 == 0) {
        float4 g = *(const float4 *)(gate + i), u = *(const float4 *)(up + i);
        float4 o;
        o.x = swiglu1(g.x, u.x, limit);
        o.y = swiglu1(g.y, u.y, limit);
        o.z = swiglu1(g.z, u.z, limit);
        o.w = swiglu1(g.w, u.w, limit);
        *(float4 *)(y + i) = o;
        return;
    }
    for (size_t j = i; j < i + 4 && j < n; j++)
        y[j] = swiglu1(gate[j], up[j], limit);
}

extern "C" duet_status_t duet_cuda_swiglu(duet_cuda_t *c, const float *gate, const float *up, int n, int inter,
                                          float limit, float *y)
{
    size_t total = (size_t)n * inter;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, swiglu_kernel, dim3(duet_cdiv(duet_cdiv(total, 4), 256)), dim3(256), 0, gate,
                                        up, total, limit, y));
    return DUET_OK;
}
