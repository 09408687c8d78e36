/* Token embedding (contract in embed.cuh): one thread per (row, column), all streams. */
#include "common.cuh"

__global__ void embed_kernel(const void *table, int bf16, int dim, const int32_t *tok, int n, int hc, float *h)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim)
        return;
    int r = (int)(i / dim), d = (int)(i % dim);
    size_t o = (size_t)tok[r] * dim + d;
    float v = bf16 ? duet_d_bf16_to_f32(((const uint16_t *)table)[o]) : ((const float *)table)[o];
    float *hr = h + (size_t)r * hc * dim + d;
    for (int s = 0; s < hc; s++)
        hr[(size_t)s * dim] = v;
}

extern "C" duet_status_t duet_cuda_embed(duet_cuda_t *c, const void *table, duet_dtype_t dtype, int dim,
                                         const int32_t *tok, int n, int hc, float *h)
{
    if (dtype != DUET_DT_BF16 && dtype != DUET_DT_F32)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "embed: table dtype %s", duet_dtype_name(dtype));
    size_t total = (size_t)n * dim;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, embed_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, table,
                                        dtype == DUET_DT_BF16, dim, tok, n, hc, h));
    return DUET_OK;
}
