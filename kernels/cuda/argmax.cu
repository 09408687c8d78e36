/* Greedy sampling on the GPU (contract in argmax.cuh).
 *
 * Two kernels, so that a decode batch of a few rows still spreads over the
 * GPU: blocks (slice, row) each scan a contiguous slice of a row (four
 * independent loads in flight per thread) and reduce to their best
 * (value, index); one warp per row then reduces the slices.  Every step uses
 * the same rule (larger value, then lower index; NaN never wins), so the
 * result does not depend on the split. */
#include "common.cuh"

#define AM_THREADS 256
#define AM_UNROLL 4
#define AM_MAX_SPLIT 256

__global__ void __launch_bounds__(AM_THREADS) argmax_part_kernel(const float *logits, int vocab, int slice,
                                                                 float *pv, int *pi)
{
    duet_pdl_wait();
    __shared__ float sv[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    int s = blockIdx.x, S = gridDim.x, row = blockIdx.y;
    const float *x = logits + (size_t)row * vocab;
    int c0 = s * slice, c1 = min(vocab, c0 + slice);
    float bv = __uint_as_float(0x7fc00000u);
    int bi = 0x7fffffff;
    for (int base = c0 + threadIdx.x; base < c1; base += AM_THREADS * AM_UNROLL) {
        float v[AM_UNROLL];
#pragma unroll
        for (int u = 0; u < AM_UNROLL; u++) {
            int i = base + u * AM_THREADS;
            v[u] = i < c1 ? x[i] : __uint_as_float(0x7fc00000u);
        }
#pragma unroll
        for (int u = 0; u < AM_UNROLL; u++)
            if (duet_argmax_better(v[u], base + u * AM_THREADS, bv, bi)) {
                bv = v[u];
                bi = base + u * AM_THREADS;
            }
    }
    duet_argmax_warp(bv, bi);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < AM_THREADS / 32 ? sv[lane] : __uint_as_float(0x7fc00000u);
        bi = lane < AM_THREADS / 32 ? si[lane] : 0x7fffffff;
        duet_argmax_warp(bv, bi);
        if (lane == 0) {
            pv[(size_t)row * S + s] = bv;
            pi[(size_t)row * S + s] = bi;
        }
    }
}

__global__ void argmax_final_kernel(int S, const float *pv, const int *pi, int32_t *out)
{
    duet_pdl_wait();
    int row = blockIdx.x, lane = threadIdx.x;
    float bv = __uint_as_float(0x7fc00000u);
    int bi = 0x7fffffff;
    for (int s = lane; s < S; s += 32)
        if (duet_argmax_better(pv[(size_t)row * S + s], pi[(size_t)row * S + s], bv, bi)) {
            bv = pv[(size_t)row * S + s];
            bi = pi[(size_t)row * S + s];
        }
    duet_argmax_warp(bv, bi);
    if (lane == 0)
        out[row] = bv != bv ? 0 : bi; /* all NaN: 0 */
}

extern "C" duet_status_t duet_cuda_argmax(duet_cuda_t *c, const float *logits, int n_rows, int vocab, int32_t *out)
{
    if (n_rows <= 0)
        return DUET_OK;
    if (vocab <= 0 || n_rows > 65535)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "argmax: %d rows of vocab %d", n_rows, vocab);
    int S = (4 * c->info.sm_count + n_rows - 1) / n_rows;
    int max_s = (vocab + 1023) / 1024; /* at least 1024 values a slice */
    S = S > max_s ? max_s : S;
    S = S < 1 ? 1 : S > AM_MAX_SPLIT ? AM_MAX_SPLIT : S;
    int slice = (vocab + S - 1) / S;
    S = (vocab + slice - 1) / slice;
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, (size_t)n_rows * S * 8, &scr));
    float *pv = (float *)scr;
    int *pi = (int *)(pv + (size_t)n_rows * S);
    DUET_CUDA_CHECK(
        c, duet_cuda_launch(c, argmax_part_kernel, dim3(S, n_rows), dim3(AM_THREADS), 0, logits, vocab, slice, pv, pi));
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, argmax_final_kernel, dim3(n_rows), dim3(32), 0, S, pv, pi, out));
    return DUET_OK;
}
