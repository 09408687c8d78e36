/* Hyper-connection mixing on the GPU (contract in hc.cuh).
 *
 * hc_pre / hc_head: one block per row.  The sum of squares of the row's
 * hc*dim stream gives the RMSNorm factor; each warp takes mix rows of fn and
 * reduces flat·fn[m] (flat = x*inv recomputed from L1); one thread then runs
 * the CPU's sigmoid / softmax / Sinkhorn code on the few mix values; all
 * threads form collapsed = Σ_k pre_k x_k.  fn (mix × hc*dim floats) is read
 * once per row, from L2 after the first row.
 * hc_post: one thread per (row, column), the CPU's loops. */
#include "common.cuh"

#define HC_THREADS 512
#define HC_MAX 16

__device__ __forceinline__ float sigm(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

/* Flat RMSNorm factor and mixes[m] = Σ_c (x_c*inv) fn[m][c] for m < mix, into shared `mixes`. */
__device__ void hc_mixes(const float *xi, int flat_dim, const float *fn, int mix, float norm_eps, float *mixes,
                         float *red)
{
    float ss = 0.0f;
    for (int c = threadIdx.x; c < flat_dim; c += blockDim.x)
        ss = fmaf(xi[c], xi[c], ss);
    ss = duet_block_sum(ss, red);
    float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)flat_dim), norm_eps)));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int m = warp; m < mix; m += nw) {
        const float *f = fn + (size_t)m * flat_dim;
        float acc = 0.0f;
        for (int c = lane * 4; c < flat_dim; c += 128) {
            float4 xv = *(const float4 *)(xi + c), fv = __ldg((const float4 *)(f + c));
            acc = fmaf(__fmul_rn(xv.x, inv), fv.x, acc);
            acc = fmaf(__fmul_rn(xv.y, inv), fv.y, acc);
            acc = fmaf(__fmul_rn(xv.z, inv), fv.z, acc);
            acc = fmaf(__fmul_rn(xv.w, inv), fv.w, acc);
        }
        acc = duet_warp_sum(acc);
        if (lane == 0)
            mixes[m] = acc;
    }
    __syncthreads();
}

__global__ void __launch_bounds__(HC_THREADS) hc_pre_kernel(const float *x, int hc, int dim, const float *fn,
                                                            const float *base, const float *scale,
                                                            int sinkhorn_iters, float hc_eps, float norm_eps,
                                                            float *post, float *comb, float *collapsed)
{
    __shared__ float red[33];
    __shared__ float mixes[(2 + HC_MAX) * HC_MAX];
    __shared__ float pre[HC_MAX];
    int flat_dim = hc * dim, mix = (2 + hc) * hc, i = blockIdx.x;
    const float *xi = x + (size_t)i * flat_dim;
    hc_mixes(xi, flat_dim, fn, mix, norm_eps, mixes, red);
    if (threadIdx.x == 0) {
        float *po = post + (size_t)i * hc, *cbo = comb + (size_t)i * hc * hc;
        float cb[HC_MAX * HC_MAX];
        for (int k = 0; k < hc; k++) {
            pre[k] = __fadd_rn(sigm(__fadd_rn(__fmul_rn(mixes[k], scale[0]), base[k])), hc_eps);
            po[k] = __fmul_rn(2.0f, sigm(__fadd_rn(__fmul_rn(mixes[hc + k], scale[1]), base[hc + k])));
        }
        for (int j = 0; j < hc; j++) {
            float mx = -INFINITY;
            for (int k = 0; k < hc; k++) {
                float v = __fadd_rn(__fmul_rn(mixes[2 * hc + j * hc + k], scale[2]), base[2 * hc + j * hc + k]);
                cb[j * hc + k] = v;
                if (v > mx)
                    mx = v;
            }
            float s = 0.0f;
            for (int k = 0; k < hc; k++) {
                cb[j * hc + k] = expf(__fsub_rn(cb[j * hc + k], mx));
                s = __fadd_rn(s, cb[j * hc + k]);
            }
            for (int k = 0; k < hc; k++)
                cb[j * hc + k] = __fadd_rn(__fdiv_rn(cb[j * hc + k], s), hc_eps);
        }
        for (int it = 0; it < sinkhorn_iters; it++) {
            if (it > 0)
                for (int j = 0; j < hc; j++) {
                    float s = 0.0f;
                    for (int k = 0; k < hc; k++)
                        s = __fadd_rn(s, cb[j * hc + k]);
                    for (int k = 0; k < hc; k++)
                        cb[j * hc + k] = __fdiv_rn(cb[j * hc + k], __fadd_rn(s, hc_eps));
                }
            for (int k = 0; k < hc; k++) {
                float s = 0.0f;
                for (int j = 0; j < hc; j++)
                    s = __fadd_rn(s, cb[j * hc + k]);
                for (int j = 0; j < hc; j++)
                    cb[j * hc + k] = __fdiv_rn(cb[j * hc + k], __fadd_rn(s, hc_eps));
            }
        }
        for (int j = 0; j < hc * hc; j++)
            cbo[j] = cb[j];
    }
    __syncthreads();
    float *y = collapsed + (size_t)i * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < hc; k++)
            acc = __fadd_rn(acc, __fmul_rn(pre[k], xi[(size_t)k * dim + c]));
        y[c] = acc;
    }
}

__global__ void __launch_bounds__(HC_THREADS) hc_head_kernel(const float *x, int hc, int dim, const float *fn,
                                                             const float *base, float scale, float hc_eps,
                                                             float norm_eps, float *y)
{
    __shared__ float red[33];
    __shared__ float mixes[HC_MAX];
    __shared__ float pre[HC_MAX];
    int flat_dim = hc * dim, i = blockIdx.x;
    const float *xi = x + (size_t)i * flat_dim;
    hc_mixes(xi, flat_dim, fn, hc, norm_eps, mixes, red);
    if (threadIdx.x < hc)
        pre[threadIdx.x] = __fadd_rn(sigm(__fadd_rn(__fmul_rn(mixes[threadIdx.x], scale), base[threadIdx.x])), hc_eps);
    __syncthreads();
    float *yi = y + (size_t)i * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < hc; k++)
            acc = __fadd_rn(acc, __fmul_rn(pre[k], xi[(size_t)k * dim + c]));
        yi[c] = acc;
    }
}

/* HCT > 0: hc known at compile time (registers); HCT == 0: any hc up to HC_MAX. */
template <int HCT>
__global__ void hc_post_kernel(float *x, int n, int hc_rt, int dim, const float *f, const float *post,
                               const float *comb)
{
    const int hc = HCT > 0 ? HCT : hc_rt;
    constexpr int CAP = HCT > 0 ? HCT : HC_MAX;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * dim)
        return;
    int row = (int)(i / dim), c = (int)(i % dim);
    float *xi = x + (size_t)row * hc * dim;
    const float *po = post + (size_t)row * hc, *cb = comb + (size_t)row * hc * hc;
    float fc = f[(size_t)row * dim + c];
    float xin[CAP], tmp[CAP];
#pragma unroll
    for (int j = 0; j < CAP; j++)
        if (j < hc)
            xin[j] = xi[(size_t)j * dim + c];
#pragma unroll
    for (int k = 0; k < CAP; k++) {
        if (k >= hc)
            break;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < CAP; j++)
            if (j < hc)
                acc = __fadd_rn(acc, __fmul_rn(cb[j * hc + k], xin[j]));
        tmp[k] = __fadd_rn(__fmul_rn(po[k], fc), acc);
    }
#pragma unroll
    for (int k = 0; k < CAP; k++)
        if (k < hc)
            xi[(size_t)k * dim + c] = tmp[k];
}

static duet_status_t hc_check(duet_cuda_t *c, const char *op, int hc, int dim, const void *x)
{
    if (hc < 1 || hc > HC_MAX || dim <= 0)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: hc %d (1..%d), dim %d", op, hc, HC_MAX, dim);
    if ((hc * dim) % 4 || (uintptr_t)x % 16)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: hc*dim %d not a multiple of 4 or x unaligned", op,
                               hc * dim);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_hc_pre(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                          const float *base, const float *scale, int sinkhorn_iters, float hc_eps,
                                          float norm_eps, float *post, float *comb, float *collapsed)
{
    DUET_TRY(hc_check(c, "hc_pre", hc, dim, x));
    if (n <= 0)
        return DUET_OK;
    hc_pre_kernel<<<n, HC_THREADS, 0, c->stream>>>(x, hc, dim, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps,
                                                   post, comb, collapsed);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_hc_post(duet_cuda_t *c, float *x, int n, int hc, int dim, const float *f,
                                           const float *post, const float *comb)
{
    if (hc < 1 || hc > HC_MAX)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "hc_post: hc %d (1..%d)", hc, HC_MAX);
    size_t total = (size_t)n * dim;
    if (!total)
        return DUET_OK;
    if (hc == 4)
        hc_post_kernel<4><<<duet_cdiv(total, 256), 256, 0, c->stream>>>(x, n, hc, dim, f, post, comb);
    else
        hc_post_kernel<0><<<duet_cdiv(total, 256), 256, 0, c->stream>>>(x, n, hc, dim, f, post, comb);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_hc_head(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                           const float *base, float scale, float hc_eps, float norm_eps, float *y)
{
    DUET_TRY(hc_check(c, "hc_head", hc, dim, x));
    if (n <= 0)
        return DUET_OK;
    hc_head_kernel<<<n, HC_THREADS, 0, c->stream>>>(x, hc, dim, fn, base, scale, hc_eps, norm_eps, y);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}
