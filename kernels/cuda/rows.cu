/* Row movement and elementwise steps (contract in rows.cuh): one thread per element (gather_rows_to:
 * eight where the shape allows). */
#include "common.cuh"

__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *idx, int n, int dim)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim)
        return;
    size_t r = i / dim, d = i % dim;
    dst[i] = src[(size_t)idx[r] * dim + d];
}

/* O: float, or bf16 bits (duet_d_store's rounding; exact for values bf16 holds). */
template <typename O>
__global__ void gather_rows_to_kernel(O *dst, const int32_t *dst_idx, const float *src, const int32_t *src_idx,
                                      int n, int dim)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim)
        return;
    size_t r = i / dim, d = i % dim;
    duet_d_store(dst + (size_t)dst_idx[r] * dim + d, src[(size_t)src_idx[r] * dim + d]);
}

/* The same, eight consecutive elements a thread (two 16-byte loads; one 16-byte bf16 store or
 * two float ones) and 32-bit indices: where dim is a multiple of 8, both buffers 16-byte aligned
 * and n * dim below 2^31 (attention's key rows: the element a thread was 3x slower). The same
 * values: each element goes through duet_d_store as above. */
#define GATHER_V 8
__device__ __forceinline__ void store8(float *o, const float4 &a, const float4 &b)
{
    reinterpret_cast<float4 *>(o)[0] = a;
    reinterpret_cast<float4 *>(o)[1] = b;
}
__device__ __forceinline__ void store8(uint16_t *o, const float4 &a, const float4 &b)
{
    uint4 v;
    v.x = (uint32_t)duet_d_f32_to_bf16(a.x) | (uint32_t)duet_d_f32_to_bf16(a.y) << 16;
    v.y = (uint32_t)duet_d_f32_to_bf16(a.z) | (uint32_t)duet_d_f32_to_bf16(a.w) << 16;
    v.z = (uint32_t)duet_d_f32_to_bf16(b.x) | (uint32_t)duet_d_f32_to_bf16(b.y) << 16;
    v.w = (uint32_t)duet_d_f32_to_bf16(b.z) | (uint32_t)duet_d_f32_to_bf16(b.w) << 16;
    *reinterpret_cast<uint4 *>(o) = v;
}
template <typename O>
__global__ void gather_rows_to_v_kernel(O *dst, const int32_t *dst_idx, const float *src, const int32_t *src_idx, int n,
                                        int dim_v)
{
    duet_pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * dim_v)
        return;
    int r = i / dim_v, d = (i - r * dim_v) * GATHER_V, dim = dim_v * GATHER_V;
    const float4 *s = reinterpret_cast<const float4 *>(src + (size_t)src_idx[r] * dim + d);
    float4 a = s[0], b = s[1];
    store8(dst + (size_t)dst_idx[r] * dim + d, a, b);
}

template <typename O>
static duet_status_t gather_rows_to(duet_cuda_t *c, O *dst, const int32_t *dst_idx, const float *src,
                                    const int32_t *src_idx, int n, int dim)
{
    size_t total = (size_t)n * dim;
    if (!total)
        return DUET_OK;
    if (dim % GATHER_V == 0 && total < ((size_t)1 << 31) && (uintptr_t)dst % 16 == 0 && (uintptr_t)src % 16 == 0) {
        size_t threads = total / GATHER_V;
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, gather_rows_to_v_kernel<O>, dim3(duet_cdiv(threads, 256)), dim3(256), 0,
                                            dst, dst_idx, src, src_idx, n, dim / GATHER_V));
        return DUET_OK;
    }
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, gather_rows_to_kernel<O>, dim3(duet_cdiv(total, 256)), dim3(256), 0, dst,
                                        dst_idx, src, src_idx, n, dim));
    return DUET_OK;
}

__global__ void copy_2d_kernel(float *dst, size_t dst_ld, const float *src, size_t src_ld, int rows, int cols)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols)
        return;
    size_t r = i / cols, c = i % cols;
    dst[r * dst_ld + c] = src[r * src_ld + c];
}

__global__ void scale_add_rows_kernel(float *y, const int32_t *rows, const float *w, const float *x, int n, int dim)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim)
        return;
    size_t r = i / dim, d = i % dim;
    float *o = y + (size_t)rows[r] * dim + d;
    *o = __fadd_rn(*o, __fmul_rn(x[i], w[r]));
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void scale_kernel(float *x, size_t n, float s)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = __fmul_rn(x[i], s);
}

extern "C" duet_status_t duet_cuda_gather_rows(duet_cuda_t *c, float *dst, const float *src, const int32_t *idx,
                                               int n, int dim)
{
    size_t total = (size_t)n * dim;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(
        c, duet_cuda_launch(c, gather_rows_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, dst, src, idx, n, dim));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_gather_rows_to(duet_cuda_t *c, float *dst, const int32_t *dst_idx,
                                                  const float *src, const int32_t *src_idx, int n, int dim)
{
    return gather_rows_to(c, dst, dst_idx, src, src_idx, n, dim);
}

extern "C" duet_status_t duet_cuda_gather_rows_to_bf16(duet_cuda_t *c, uint16_t *dst, const int32_t *dst_idx,
                                                       const float *src, const int32_t *src_idx, int n, int dim)
{
    return gather_rows_to(c, dst, dst_idx, src, src_idx, n, dim);
}

extern "C" duet_status_t duet_cuda_copy_2d(duet_cuda_t *c, float *dst, size_t dst_ld, const float *src,
                                           size_t src_ld, int rows, int cols)
{
    size_t total = (size_t)rows * cols;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, copy_2d_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, dst, dst_ld, src,
                                        src_ld, rows, cols));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_scale_add_rows(duet_cuda_t *c, float *y, const int32_t *rows, const float *w,
                                                  const float *x, int n, int dim)
{
    size_t total = (size_t)n * dim;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, scale_add_rows_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, y, rows, w,
                                        x, n, dim));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_add(duet_cuda_t *c, float *y, const float *x, size_t n)
{
    if (!n)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, add_kernel, dim3(duet_cdiv(n, 256)), dim3(256), 0, y, x, n));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_scale(duet_cuda_t *c, float *x, size_t n, float s)
{
    if (!n)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, scale_kernel, dim3(duet_cdiv(n, 256)), dim3(256), 0, x, n, s));
    return DUET_OK;
}
