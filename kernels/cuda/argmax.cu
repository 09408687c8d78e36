/* Greedy sampling on the GPU (contract in argmax.cuh): one block per row;
 * each thread scans its stride keeping the best (value, index), then a
 * shuffle and shared-memory reduction with the same rule. */
#include "common.cuh"

#define ARGMAX_THREADS 1024

/* a better than b: larger value, or equal value and lower index; NaN is never better, anything beats NaN. */
__device__ __forceinline__ bool am_better(float av, int ai, float bv, int bi)
{
    if (av != av)
        return false;
    if (bv != bv)
        return true;
    return av > bv || (av == bv && ai < bi);
}

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *logits, int vocab, int32_t *out)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *x = logits + (size_t)blockIdx.x * vocab;
    float bv = __uint_as_float(0x7fc00000u);
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (am_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nw ? sv[lane] : __uint_as_float(0x7fc00000u);
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (am_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0)
            out[blockIdx.x] = bv != bv ? 0 : bi; /* all NaN: 0 */
    }
}

extern "C" duet_status_t duet_cuda_argmax(duet_cuda_t *c, const float *logits, int n_rows, int vocab, int32_t *out)
{
    if (n_rows <= 0)
        return DUET_OK;
    if (vocab <= 0)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "argmax: vocab %d", vocab);
    argmax_kernel<<<n_rows, ARGMAX_THREADS, 0, c->stream>>>(logits, vocab, out);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}
