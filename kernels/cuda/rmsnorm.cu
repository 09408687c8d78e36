/* rmsnorm on the GPU (contract in rmsnorm.cuh): one block per row; the sum
 * of squares in fp32 (a block reduction), then y = w * (x * inv) with the
 * CPU's roundings (no fused multiply-add). */
#include "common.cuh"

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
    if (n <= 0 || dim <= 0)
        return DUET_OK;
    int threads = duet_cuda_rmsnorm_threads(dim);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, rmsnorm_kernel, dim3(n), dim3(threads), 0, x, weight, dim, eps, y));
    return DUET_OK;
}
