/* rmsnorm on the GPU (contract in rmsnorm.cuh): one block per row; the sum
 * of squares in fp32 (a block reduction), then y = w * (x * inv) with the
 * CPU's roundings (no fused multiply-add). */
#include "exact.cuh"
#include "common.cuh"
#include "matmul.cuh"

__global__ void rmsnorm_kernel(const float *x, const float *weight, int dim, float eps, float *y)
{
    duet_pdl_wait();
    __shared__ float red[33];
    const float *xi = x + (size_t)blockIdx.x * dim;
    float *yi = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        ss = fmaf(xi[c], xi[c], ss);
    ss = duet_block_sum(ss, red);
    float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float v = __fmul_rn(xi[c], inv);
        yi[c] = weight ? __fmul_rn(weight[c], v) : v;
    }
}

extern "C" int duet_cuda_rmsnorm_threads(int dim) { return dim >= 4096 ? 1024 : dim >= 1024 ? 256 : 128; }

extern "C" duet_status_t duet_cuda_rmsnorm(duet_cuda_t *c, const float *x, const float *weight, int n, int dim,
                                           float eps, float *y)
{
    if (c->exact)
        return duet_cuda_exact_rmsnorm(c, x, weight, n, dim, eps, y);
    if (n <= 0 || dim <= 0)
        return DUET_OK;
    int threads = duet_cuda_rmsnorm_threads(dim);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, rmsnorm_kernel, dim3(n), dim3(threads), 0, x, weight, dim, eps, y));
    return DUET_OK;
}

/* rmsnorm_kernel's sum and inverse, then a warp a 128-column block: the normalized values (y
 * when asked for), their largest magnitude, the block's scale and e4m3 codes as
 * duet_cuda_act_quant writes them.  Rows n .. n_pad: codes 0, scale 1. */
__global__ void rmsnorm_q8_kernel(const float *x, const float *weight, int n, int n_pad, int dim, float eps, float *y,
                                  uint8_t *xq, float *sx, int row_major)
{
    duet_pdl_wait();
    __shared__ float red[33];
    int row = blockIdx.x, kb = dim / 128;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    uint8_t *qi = xq + (size_t)row * dim;
    if (row >= n) {
        for (int b = warp; b < kb; b += warps) {
            *(uint32_t *)(qi + b * 128 + lane * 4) = 0;
            if (lane == 0)
                sx[row_major ? (size_t)row * kb + b : (size_t)b * n_pad + row] = 1.0f;
        }
        return;
    }
    const float *xi = x + (size_t)row * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        ss = fmaf(xi[c], xi[c], ss);
    ss = duet_block_sum(ss, red);
    float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
    for (int b = warp; b < kb; b += warps) {
        int c0 = b * 128 + lane * 4;
        float4 v = *(const float4 *)(xi + c0);
        v = make_float4(__fmul_rn(v.x, inv), __fmul_rn(v.y, inv), __fmul_rn(v.z, inv), __fmul_rn(v.w, inv));
        if (weight) {
            float4 w = *(const float4 *)(weight + c0);
            v = make_float4(__fmul_rn(w.x, v.x), __fmul_rn(w.y, v.y), __fmul_rn(w.z, v.z), __fmul_rn(w.w, v.w));
        }
        if (y)
            *(float4 *)(y + (size_t)row * dim + c0) = v;
        float s = duet_d_act_scale(duet_warp_max(duet_d_amax4(v)));
        *(uint32_t *)(qi + c0) = duet_d_act_codes4(v, s);
        if (lane == 0)
            sx[row_major ? (size_t)row * kb + b : (size_t)b * n_pad + row] = s;
    }
}

extern "C" duet_status_t duet_cuda_rmsnorm_q8(duet_cuda_t *c, const float *x, const float *weight, int n, int dim,
                                              float eps, float *y, uint8_t *xq, float *sx)
{
    if (n < 0 || dim <= 0 || dim % 128)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "rmsnorm_q8: %d rows of %d columns (a multiple of 128)", n, dim);
    if (n && (!x || !xq || !sx || (uintptr_t)x % 16 || (uintptr_t)(weight ? weight : x) % 16 ||
              (uintptr_t)(y ? y : x) % 16 || (uintptr_t)xq % 4 || (uintptr_t)sx % 4))
        return duet_cuda_failf(c, DUET_ERR_INVALID, "rmsnorm_q8: x, weight, y, codes or scales missing or misaligned");
    if (n == 0)
        return DUET_OK;
    int n_pad = duet_cuda_fp8_act_rows(n), threads = duet_cuda_rmsnorm_threads(dim);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, rmsnorm_q8_kernel, dim3(n_pad), dim3(threads), 0, x, weight, n, n_pad, dim,
                                        eps, y, xq, sx, c->fp8_scale_layout & 1));
    return DUET_OK;
}
