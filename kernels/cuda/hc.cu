/* Hyper-connection mixing on the GPU (contract in hc.cuh).
 *
 * hc_pre / hc_head: two kernels.  The first splits the rows' hc streams of
 * dim columns into slices of columns (enough blocks to fill the GPU at decode
 * batch sizes; a slice holds the same columns of every stream) and writes per
 * slice and row Σ x² and Σ x·fn[m] for every mix row m, 4 rows a block so that
 * each fn value read serves 4 rows.  The second sums
 * the slices in order (mixes = inv · Σ x·fn, where the CPU sums (x·inv)·fn),
 * runs the sigmoids and the Sinkhorn normalisation of comb (one warp, one
 * lane per entry, a row's or column's entries gathered by shuffles and summed
 * in the CPU's index order), and forms collapsed = Σ_k pre_k x_k.  fn (mix ×
 * hc*dim floats) is read once per 4 rows, from L2 after the first.
 * hc_pre_norm / hc_head_norm: the second kernel also takes the RMSNorm of
 * collapsed (rmsnorm.cu's threads and order), so the row is not stored and
 * read back by a third launch.
 * hc_post: one thread per (row, column), the CPU's loops.
 * hc_post_pre_norm / hc_post_head_norm: hc_post and the next pre-mix's first
 * kernel in one launch at decode sizes: a slice of columns holds everything
 * hc_post needs (every stream's value at those columns), so the block updates
 * its rows' slice, stores it, and sums it from shared memory; the same bits as
 * the two operations, one launch and one read of x fewer. */
#include "exact.cuh"
#include "common.cuh"
#include "rmsnorm.cuh"

#define HC_THREADS 256
#define HC_MAX 16
#define HC_MAX_SPLIT 32

__device__ __forceinline__ float sigm(float x) { return duet_ref_sigmoidf(x); }

/* Partial sums over one slice of HC_RG rows' hc streams: part[0] = Σ x², part[1+m] = Σ x·fn[m],
 * per row.  grid (slices, row groups); a warp takes mix rows m and reads each fn value once for
 * the group's rows.  Slice s holds columns c0 = s·cols .. c1 of every stream: L = hc·(c1 - c0)
 * values a row, in the slice's own order q = k·(c1 - c0) + (c - c0) (hc_flat), which the sums
 * follow; c0 and the stream widths are multiples of 4, so a float4 never straddles two streams.
 * PRE (decode sizes: at most HC_PRE_ROWS rows, slices of at most HC_PRE_COLS values a row, at
 * most HC_PRE_M mix rows a warp) the same sums in the same order by a shorter path:
 * the warp's fn values read before the wait for the kernel ahead (weights), all at once, and the
 * rows' x slice staged in shared memory by one round of loads, where the loop reads each x value
 * again for every mix row, a round of loads a 128 columns.  Its registers and shared memory
 * would cost the larger calls blocks an SM (512 rows: 78 -> 134 us in one kernel with both
 * paths), so those keep the loop. */
#define HC_RG 4
#define HC_PRE_COLS 512
#define HC_PRE_M 3
#define HC_PRE_ROWS 256

/* hc_post's new value of stream k at one column: post_k·f + Σ_j comb[j][k]·x_j, in the CPU's
 * order without fused multiply-add (xin: the column's value in each stream). */
template <int CAP>
__device__ __forceinline__ float hc_post_value(const float *po, const float *cb, const float (&xin)[CAP], float fc,
                                               int hc, int k)
{
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < CAP; j++)
        if (j < hc)
            acc = __fadd_rn(acc, __fmul_rn(cb[j * hc + k], xin[j]));
    return __fadd_rn(__fmul_rn(po[k], fc), acc);
}

/* Where the slice's value q of a row lies in its hc·dim floats (slice columns c0 .. c0 + w). */
__device__ __forceinline__ int hc_flat(int q, int w, int c0, int dim)
{
    int k = q / w;
    return k * dim + c0 + (q - k * w);
}

/* The rows' Σ x² of the slice (ss: the thread's share of each), a block sum each (duet_block_sum's
 * tree, the rows side by side), into part. */
__device__ __forceinline__ void hc_sumsq_store(float (&ss)[HC_RG], float (*red)[32], int i0, int nr, int S, int s,
                                               int mix, float *part)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int r = 0; r < HC_RG; r++) {
        ss[r] = duet_warp_sum(ss[r]);
        if (lane == 0)
            red[r][warp] = ss[r];
    }
    __syncthreads();
    if (warp == 0)
#pragma unroll
        for (int r = 0; r < HC_RG; r++) {
            float t = duet_warp_sum(lane < nw ? red[r][lane] : 0.0f);
            if (lane == 0 && r < nr)
                part[((size_t)(i0 + r) * S + s) * (1 + mix)] = t;
        }
}

/* acc += x · f over four columns, in column order */
__device__ __forceinline__ void hc_fma4(float &acc, const float4 &xv, const float4 &fv)
{
    acc = fmaf(xv.x, fv.x, acc);
    acc = fmaf(xv.y, fv.y, acc);
    acc = fmaf(xv.z, fv.z, acc);
    acc = fmaf(xv.w, fv.w, acc);
}

/* Mix row m's sums of the rows (acc: the lane's share of each), a warp sum each, into part. */
__device__ __forceinline__ void hc_mix_store(float (&acc)[HC_RG], int i0, int nr, int S, int s, int mix, int m,
                                             float *part)
{
#pragma unroll
    for (int r = 0; r < HC_RG; r++) {
        float v = duet_warp_sum(acc[r]);
        if ((threadIdx.x & 31) == 0 && r < nr)
            part[((size_t)(i0 + r) * S + s) * (1 + mix) + 1 + m] = v;
    }
}

__global__ void __launch_bounds__(HC_THREADS) hc_partial_kernel(const float *x, int n, int hc, int dim,
                                                                const float *fn, int mix, int cols, float *part)
{
    duet_pdl_wait();
    __shared__ float red[HC_RG][32];
    int s = blockIdx.x, S = gridDim.x, i0 = blockIdx.y * HC_RG, flat_dim = hc * dim;
    int nr = min(HC_RG, n - i0); /* rows of this group */
    int c0 = s * cols, w = min(dim, c0 + cols) - c0, L = hc * w;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float *xr[HC_RG];
#pragma unroll
    for (int r = 0; r < HC_RG; r++)
        xr[r] = x + (size_t)min(i0 + r, n - 1) * flat_dim;
    float ss[HC_RG];
#pragma unroll
    for (int r = 0; r < HC_RG; r++)
        ss[r] = 0.0f;
    /* the slice's values q in the order of the shorter path; (k, cc): q's stream and column,
     * stepped along with q (no division a value) */
    for (int q = threadIdx.x, k = q / w, cc = q - k * w; q < L; q += blockDim.x) {
        int c = k * dim + c0 + cc;
#pragma unroll
        for (int r = 0; r < HC_RG; r++) /* rows past n read the last one's (in bounds, unused) */
            ss[r] = fmaf(xr[r][c], xr[r][c], ss[r]);
        for (cc += blockDim.x; cc >= w; cc -= w)
            k++;
    }
    hc_sumsq_store(ss, red, i0, nr, S, s, mix, part);
    for (int m = warp; m < mix; m += nw) {
        const float *f = fn + (size_t)m * flat_dim;
        float acc[HC_RG];
#pragma unroll
        for (int r = 0; r < HC_RG; r++)
            acc[r] = 0.0f;
#pragma unroll 4
        for (int q = lane * 4, k = q / w, cc = q - k * w; q < L; q += 128) {
            int c = k * dim + c0 + cc;
            float4 fv = __ldg((const float4 *)(f + c));
#pragma unroll
            for (int r = 0; r < HC_RG; r++)
                hc_fma4(acc[r], *(const float4 *)(xr[r] + c), fv);
            for (cc += 128; cc >= w; cc -= w)
                k++;
        }
        hc_mix_store(acc, i0, nr, S, s, mix, m, part);
    }
}

/* The shorter path's fn values: a warp's mix rows m = warp + mi·nw, a lane's float4 at slice
 * values q = lane·4 + 128·j (hc_partial_kernel's order), read where the kernel starts. */
constexpr int HC_PJ = HC_PRE_COLS / 128;
__device__ __forceinline__ void hc_pre_fn(const float *fn, int flat_dim, int mix, int w, int c0, int dim,
                                          float4 (&fpre)[HC_PRE_M][HC_PJ])
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, L = (flat_dim / dim) * w;
#pragma unroll
    for (int mi = 0; mi < HC_PRE_M; mi++)
#pragma unroll
        for (int j = 0; j < HC_PJ; j++) {
            int m = warp + mi * nw, q = lane * 4 + 128 * j;
            fpre[mi][j] = m < mix && q < L
                              ? __ldg((const float4 *)(fn + (size_t)m * flat_dim + hc_flat(q, w, c0, dim)))
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
}

/* The shorter path's sums over the rows' slice staged in xs (L values a row, the slice's order):
 * hc_partial_kernel's, in its order. */
__device__ __forceinline__ void hc_pre_sums(const float (*xs)[HC_PRE_COLS], const float4 (&fpre)[HC_PRE_M][HC_PJ],
                                            int L, int i0, int nr, int S, int s, int mix, float (*red)[32],
                                            float *part)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float ss[HC_RG];
#pragma unroll
    for (int r = 0; r < HC_RG; r++)
        ss[r] = 0.0f;
    for (int q = threadIdx.x; q < L; q += blockDim.x)
#pragma unroll
        for (int r = 0; r < HC_RG; r++)
            ss[r] = fmaf(xs[r][q], xs[r][q], ss[r]);
    hc_sumsq_store(ss, red, i0, nr, S, s, mix, part);
#pragma unroll
    for (int mi = 0; mi < HC_PRE_M; mi++) {
        int m = warp + mi * nw;
        if (m >= mix)
            break;
        float acc[HC_RG];
#pragma unroll
        for (int r = 0; r < HC_RG; r++)
            acc[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < HC_PJ; j++) {
            int q = lane * 4 + 128 * j;
            if (q >= L)
                break;
            float4 fv = fpre[mi][j];
#pragma unroll
            for (int r = 0; r < HC_RG; r++)
                hc_fma4(acc[r], reinterpret_cast<const float4 *>(xs[r])[q / 4], fv);
        }
        hc_mix_store(acc, i0, nr, S, s, mix, m, part);
    }
}

/* hc_partial_kernel's sums, in its order, at decode sizes (the host checked the slice and mix
 * widths: hc_launch) */
__global__ void __launch_bounds__(HC_THREADS)
    hc_partial_pre_kernel(const float *x, int n, int hc, int dim, const float *fn, int mix, int cols, float *part)
{
    __shared__ float red[HC_RG][32];
    __shared__ __align__(16) float xs[HC_RG][HC_PRE_COLS];
    int s = blockIdx.x, S = gridDim.x, i0 = blockIdx.y * HC_RG, flat_dim = hc * dim;
    int nr = min(HC_RG, n - i0); /* rows of this group */
    int c0 = s * cols, w = min(dim, c0 + cols) - c0, L = hc * w;
    float4 fpre[HC_PRE_M][HC_PJ];
    hc_pre_fn(fn, flat_dim, mix, w, c0, dim, fpre);
    duet_pdl_wait();
    /* the rows' slice; rows past n read the last one's (in bounds, unused): a thread's loads all
     * issued before its stores (one memory latency, where a loop storing each load waited for
     * them in turn) */
    constexpr int XQ = HC_RG * (HC_PRE_COLS / 4) / HC_THREADS; /* float4 a thread at most */
    static_assert(XQ * HC_THREADS == HC_RG * (HC_PRE_COLS / 4), "whole float4 a thread");
    int q4 = L / 4;
    float4 xv[XQ];
#pragma unroll
    for (int j = 0; j < XQ; j++) {
        int q = threadIdx.x + j * HC_THREADS, r = q / q4, k = q % q4;
        if (q < HC_RG * q4)
            xv[j] = *(const float4 *)(x + (size_t)min(i0 + r, n - 1) * flat_dim + hc_flat(4 * k, w, c0, dim));
    }
#pragma unroll
    for (int j = 0; j < XQ; j++) {
        int q = threadIdx.x + j * HC_THREADS, r = q / q4, k = q % q4;
        if (q < HC_RG * q4)
            reinterpret_cast<float4 *>(xs[r])[k] = xv[j];
    }
    __syncthreads();
    hc_pre_sums(xs, fpre, L, i0, nr, S, s, mix, red, part);
}

/* hc_post's update of its rows' slice (every stream at the slice's columns) in hc_post_kernel's
 * operations and order, stored in place and into xs for the partial sums that follow (rows past
 * n: zeros, unused).  HCT > 0: hc known at compile time. */
template <int HCT>
__global__ void __launch_bounds__(HC_THREADS)
    hc_post_partial_kernel(float *x, int n, int hc_rt, int dim, const float *f, const float *post, const float *comb,
                           const float *fn, int mix, int cols, float *part)
{
    const int hc = HCT > 0 ? HCT : hc_rt;
    constexpr int CAP = HCT > 0 ? HCT : 4; /* the shorter path's mix rows hold hc <= 4 */
    __shared__ float red[HC_RG][32];
    __shared__ __align__(16) float xs[HC_RG][HC_PRE_COLS];
    __shared__ float pc[HC_RG][CAP + CAP * CAP]; /* the rows' post, then comb */
    int s = blockIdx.x, S = gridDim.x, i0 = blockIdx.y * HC_RG, flat_dim = hc * dim;
    int nr = min(HC_RG, n - i0);
    int c0 = s * cols, w = min(dim, c0 + cols) - c0, L = hc * w;
    float4 fpre[HC_PRE_M][HC_PJ];
    hc_pre_fn(fn, flat_dim, mix, w, c0, dim, fpre);
    duet_pdl_wait();
    int per = hc + hc * hc;
    for (int t = threadIdx.x; t < nr * per; t += blockDim.x) {
        int r = t / per, e = t % per;
        const float *src = e < hc ? post + (size_t)(i0 + r) * hc + e : comb + (size_t)(i0 + r) * hc * hc + (e - hc);
        pc[r][e] = *src;
    }
    /* (row, column) pairs of the slice, a thread's values all loaded before the first is used */
    constexpr int PP = (HC_RG * HC_PRE_COLS / (HCT > 0 ? HCT : 1) + HC_THREADS - 1) / HC_THREADS;
    float xin[PP][CAP], fc[PP];
#pragma unroll
    for (int t = 0; t < PP; t++) {
        int p = threadIdx.x + t * HC_THREADS, r = p / w, cc = p % w;
        if (r < nr) {
            const float *xi = x + (size_t)(i0 + r) * flat_dim + c0 + cc;
#pragma unroll
            for (int j = 0; j < CAP; j++)
                if (j < hc)
                    xin[t][j] = xi[(size_t)j * dim];
            fc[t] = f[(size_t)(i0 + r) * dim + c0 + cc];
        }
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < PP; t++) {
        int p = threadIdx.x + t * HC_THREADS, r = p / w, cc = p % w;
        if (r >= HC_RG)
            break;
        if (r >= nr) {
            for (int k = 0; k < hc; k++)
                xs[r][k * w + cc] = 0.0f;
            continue;
        }
        float *xo = x + (size_t)(i0 + r) * flat_dim + c0 + cc;
        const float *po = pc[r], *cb = pc[r] + hc;
#pragma unroll
        for (int k = 0; k < CAP; k++) {
            if (k >= hc)
                break;
            float v = hc_post_value(po, cb, xin[t], fc[t], hc, k);
            xo[(size_t)k * dim] = v;
            xs[r][k * w + cc] = v;
        }
    }
    __syncthreads();
    hc_pre_sums(xs, fpre, L, i0, nr, S, s, mix, red, part);
}

/* Sums the slices in order into vals[0..mix] and returns the RMSNorm factor; mixes = vals[1..] * inv. */
__device__ float hc_gather(const float *part, int S, int mix, int flat_dim, float norm_eps, float *vals)
{
    const float *p = part + (size_t)blockIdx.x * S * (1 + mix);
    for (int v = threadIdx.x; v < 1 + mix; v += blockDim.x) {
        float t[HC_MAX_SPLIT]; /* all loads in flight, then the sum in slice order */
#pragma unroll
        for (int s = 0; s < HC_MAX_SPLIT; s++)
            t[s] = s < S ? p[(size_t)s * (1 + mix) + v] : 0.0f;
        float a = 0.0f;
#pragma unroll
        for (int s = 0; s < HC_MAX_SPLIT; s++)
            if (s < S)
                a += t[s];
        vals[v] = a;
    }
    __syncthreads();
    float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(vals[0], (float)flat_dim), norm_eps)));
    for (int v = threadIdx.x; v < mix; v += blockDim.x)
        vals[1 + v] = __fmul_rn(vals[1 + v], inv);
    __syncthreads();
    return inv;
}

/* comb's row softmax and Sinkhorn normalisation in the CPU's operation order; one warp,
 * lane l < hc*hc holds entry (l / hc, l % hc) and reads the others of its row or column from
 * their lanes (shuffles, all in flight at once), then sums them in index order.  HCT > 0: hc
 * known at compile time. */
template <int HCT>
__device__ void sinkhorn_lanes(float v, int hc_rt, int iters, float hc_eps, float *cbo)
{
    const int hc = HCT > 0 ? HCT : hc_rt;
    constexpr int CAP = HCT > 0 ? HCT : 5; /* hc * hc <= 32 */
    int lane = threadIdx.x & 31, n2 = hc * hc;
    int j = lane / hc, k = lane % hc;
    bool on = lane < n2;
    float t[CAP];
    auto row = [&](float x) {
#pragma unroll
        for (int q = 0; q < CAP; q++)
            t[q] = __shfl_sync(0xffffffffu, x, (j * hc + (q < hc ? q : 0)) & 31);
    };
    auto col = [&](float x) {
#pragma unroll
        for (int q = 0; q < CAP; q++)
            t[q] = __shfl_sync(0xffffffffu, x, ((q < hc ? q : 0) * hc + k) & 31);
    };
    auto sum = [&]() {
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < CAP; q++)
            if (q < hc)
                s = __fadd_rn(s, t[q]);
        return s;
    };
    row(v);
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < CAP; q++)
        if (q < hc)
            mx = fmaxf(mx, t[q]);
    float e = on ? duet_ref_expf(__fsub_rn(v, mx)) : 0.0f;
    row(e);
    float s = sum();
    v = on ? __fadd_rn(__fdiv_rn(e, s), hc_eps) : 0.0f;
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            row(v);
            s = sum();
            if (on)
                v = __fdiv_rn(v, __fadd_rn(s, hc_eps));
        }
        col(v);
        s = sum();
        if (on)
            v = __fdiv_rn(v, __fadd_rn(s, hc_eps));
    }
    if (on)
        cbo[lane] = v;
}

/* comb's logit of lane l < hc*hc (entry l / hc, l % hc), the Sinkhorn's input */
__device__ __forceinline__ float comb_logit(const float *mixes, int hc, const float *base, float scale2, int lane)
{
    return lane < hc * hc ? __fadd_rn(__fmul_rn(mixes[2 * hc + lane], scale2), base[2 * hc + lane]) : 0.0f;
}

template <int HCT>
__device__ void sinkhorn_warp(const float *mixes, int hc_rt, const float *base, float scale2, int iters, float hc_eps,
                              float *cbo)
{
    const int hc = HCT > 0 ? HCT : hc_rt;
    sinkhorn_lanes<HCT>(comb_logit(mixes, hc, base, scale2, threadIdx.x & 31), hc, iters, hc_eps, cbo);
}

/* duet_cuda_hc_sinkhorn: comb's logits (left by a pre-mix with comb_logits) into comb in place,
 * a warp a row, sinkhorn_warp's operations from the same values: the same bits. */
#define HC_SK_WARPS 4
template <int HCT> __global__ void __launch_bounds__(HC_SK_WARPS * 32) hc_sinkhorn_kernel(int n, int hc_rt, int iters,
                                                                                        float hc_eps, float *comb)
{
    duet_pdl_wait();
    const int hc = HCT > 0 ? HCT : hc_rt;
    int row = blockIdx.x * HC_SK_WARPS + (int)(threadIdx.x / 32), lane = threadIdx.x & 31;
    if (row >= n) /* the warp whole: its shuffles are its own */
        return;
    float *cb = comb + (size_t)row * hc * hc;
    float v = lane < hc * hc ? cb[lane] : 0.0f; /* each lane writes back only its own entry */
    sinkhorn_lanes<HCT>(v, hc, iters, hc_eps, cb);
}

/* The same for any hc, in one thread (hc*hc > 32). */
__device__ void sinkhorn_serial(const float *mixes, int hc, const float *base, float scale2, int iters,
                                float hc_eps, float *cb, float *cbo)
{
    duet_ref_hc_comb(mixes, hc, scale2, base, iters, hc_eps, cb);
    for (int j = 0; j < hc * hc; j++)
        cbo[j] = cb[j];
}

/* collapsed(dim) = Σ_k pre_k x_k in the CPU's order */
__device__ __forceinline__ void hc_collapse(const float *xi, const float *pre, int hc, int dim, float *y)
{
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < hc; k++)
            acc = __fadd_rn(acc, __fmul_rn(pre[k], xi[(size_t)k * dim + c]));
        y[c] = acc;
    }
}

/* The second kernel's start, for row blockIdx.x: the slices summed into the mixes (vals), the
 * pre weights into pre (visible to the whole block on return), and for hc_pre (!HEAD) post,
 * then comb by the Sinkhorn on warp 0 (the other warps go on to the collapse meanwhile).
 * HCT > 0: hc known at compile time. */
template <bool HEAD, int HCT>
__device__ __forceinline__ void hc_finish_mix(int hc, int dim, int S, const float *part, const float *base,
                                              const float *scale_d, float scale_h, int sinkhorn_iters,
                                              float hc_eps, float norm_eps, int comb_logits, float *post,
                                              float *comb, float *vals, float *cb_s, float *pre)
{
    int i = blockIdx.x, mix = HEAD ? hc : (2 + hc) * hc;
    hc_gather(part, S, mix, hc * dim, norm_eps, vals);
    const float *mixes = vals + 1;
    if (threadIdx.x < hc) {
        int k = threadIdx.x;
        if (HEAD) {
            pre[k] = __fadd_rn(sigm(__fadd_rn(__fmul_rn(mixes[k], scale_h), base[k])), hc_eps);
        } else {
            pre[k] = __fadd_rn(sigm(__fadd_rn(__fmul_rn(mixes[k], scale_d[0]), base[k])), hc_eps);
            post[(size_t)i * hc + k] =
                __fmul_rn(2.0f, sigm(__fadd_rn(__fmul_rn(mixes[hc + k], scale_d[1]), base[hc + k])));
        }
    }
    __syncthreads();
    if (!HEAD && threadIdx.x < 32) {
        if (comb_logits) { /* hc * hc <= 32: duet_cuda_hc_sinkhorn takes them on */
            if (threadIdx.x < hc * hc)
                comb[(size_t)i * hc * hc + threadIdx.x] = comb_logit(mixes, hc, base, scale_d[2], threadIdx.x);
        } else if (hc * hc <= 32)
            sinkhorn_warp<HCT>(mixes, hc, base, scale_d[2], sinkhorn_iters, hc_eps, comb + (size_t)i * hc * hc);
        else if (threadIdx.x == 0)
            sinkhorn_serial(mixes, hc, base, scale_d[2], sinkhorn_iters, hc_eps, cb_s, comb + (size_t)i * hc * hc);
    }
}

/* hc_pre (!HEAD) / hc_head's second kernel: the mixes, then collapsed = Σ_k pre_k x_k. */
template <bool HEAD, int HCT>
__global__ void __launch_bounds__(HC_THREADS) hc_finish_kernel(const float *x, int hc_rt, int dim, int S,
                                                               const float *part, const float *base,
                                                               const float *scale_d, float scale_h,
                                                               int sinkhorn_iters, float hc_eps, float norm_eps,
                                                               int comb_logits, float *post, float *comb,
                                                               float *collapsed)
{
    duet_pdl_wait();
    __shared__ float vals[1 + (2 + HC_MAX) * HC_MAX];
    __shared__ float cb_s[HC_MAX * HC_MAX];
    __shared__ float pre[HC_MAX];
    const int hc = HCT > 0 ? HCT : hc_rt;
    hc_finish_mix<HEAD, HCT>(hc, dim, S, part, base, scale_d, scale_h, sinkhorn_iters, hc_eps, norm_eps, comb_logits,
                             post, comb, vals, cb_s, pre);
    hc_collapse(x + (size_t)blockIdx.x * hc * dim, pre, hc, dim, collapsed + (size_t)blockIdx.x * dim);
}

/* hc_pre / hc_head's second kernel fused with the RMSNorm of its output: y = rmsnorm(collapsed,
 * norm_w), the collapsed row never stored.  A block of duet_cuda_rmsnorm's threads for dim, each
 * thread the columns that kernel gives it (at most HC_NORM_COLS), so the sum of squares has its
 * order and y its bits; the collapse is hc_collapse's per column. */
#define HC_NORM_COLS 8
#define HC_PRE_J 4 /* dim 4096 at 1024 threads */
template <bool HEAD, int HCT>
__global__ void __launch_bounds__(1024) hc_finish_norm_kernel(const float *x, int hc_rt, int dim, int S,
                                                              const float *part, const float *base,
                                                              const float *scale_d, float scale_h,
                                                              int sinkhorn_iters, float hc_eps, float norm_eps,
                                                              int comb_logits, float *post, float *comb,
                                                              const float *norm_w, float eps, float *y)
{
    duet_pdl_wait();
    __shared__ float vals[1 + (2 + HC_MAX) * HC_MAX];
    __shared__ float cb_s[HC_MAX * HC_MAX];
    __shared__ float pre[HC_MAX];
    __shared__ float red[33];
    const int hc = HCT > 0 ? HCT : hc_rt;
    const float *xi = x + (size_t)blockIdx.x * hc * dim;
    /* hc known: the thread's x values of its first HC_PRE_J columns read before the mixes are
     * (their loads beside the slices'), HC_PRE_J x hc registers */
    constexpr int XK = HCT > 0 ? HCT : 1;
    float xk[HC_PRE_J][XK];
    if constexpr (HCT > 0)
#pragma unroll
        for (int j = 0; j < HC_PRE_J; j++) {
            int c = threadIdx.x + j * blockDim.x;
#pragma unroll
            for (int k = 0; k < XK; k++)
                xk[j][k] = c < dim ? xi[(size_t)k * dim + c] : 0.0f;
        }
    hc_finish_mix<HEAD, HCT>(hc, dim, S, part, base, scale_d, scale_h, sinkhorn_iters, hc_eps, norm_eps, comb_logits,
                             post, comb, vals, cb_s, pre);
    float v[HC_NORM_COLS], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < HC_NORM_COLS; j++) {
        int c = threadIdx.x + j * blockDim.x;
        v[j] = 0.0f;
        if (c < dim) {
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < (HCT > 0 ? HCT : HC_MAX); k++) {
                if (k >= hc)
                    break;
                float xv;
                if constexpr (HCT > 0)
                    xv = j < HC_PRE_J ? xk[j < HC_PRE_J ? j : 0][k] : xi[(size_t)k * dim + c];
                else
                    xv = xi[(size_t)k * dim + c];
                acc = __fadd_rn(acc, __fmul_rn(pre[k], xv));
            }
            v[j] = acc;
            ss = fmaf(acc, acc, ss);
        }
    }
    ss = duet_block_sum(ss, red);
    float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
    float *yi = y + (size_t)blockIdx.x * dim;
#pragma unroll
    for (int j = 0; j < HC_NORM_COLS; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c < dim) {
            float t = __fmul_rn(v[j], inv);
            yi[c] = norm_w ? __fmul_rn(norm_w[c], t) : t;
        }
    }
}

/* Slices per row so that the partial kernel fills the GPU: cols columns each (a multiple of 32,
 * so that every slice starts on a float4 of every stream), S of them. */
static void hc_split(const duet_cuda_t *c, int n, int dim, int *S, int *cols)
{
    int groups = c->invariant ? 1 : (n + HC_RG - 1) / HC_RG; /* invariant: the split of one row group at any n */
    int s = (2 * c->info.sm_count + groups - 1) / groups;
    s = s < 1 ? 1 : s > HC_MAX_SPLIT ? HC_MAX_SPLIT : s;
    int w = (dim + s - 1) / s;
    w = (w + 31) / 32 * 32;
    *cols = w;
    *S = (dim + w - 1) / w;
}

/* HCT > 0: hc known at compile time (registers); HCT == 0: any hc up to HC_MAX. */
template <int HCT>
__global__ void hc_post_kernel(float *x, int n, int hc_rt, int dim, const float *f, const float *post,
                               const float *comb)
{
    duet_pdl_wait();
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
        tmp[k] = hc_post_value(po, cb, xin, fc, hc, k);
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
    if (dim % 4 || (uintptr_t)x % 16)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: dim %d not a multiple of 4 or x unaligned", op, dim);
    return DUET_OK;
}

/* hc_post's launch: a thread per (row, column) */
static duet_status_t hc_post_launch(duet_cuda_t *c, float *x, int n, int hc, int dim, const float *f,
                                    const float *post, const float *comb)
{
    size_t total = (size_t)n * dim;
    if (!total)
        return DUET_OK;
    if (hc == 4)
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_post_kernel<4>, dim3(duet_cdiv(total, 256)), dim3(256), 0, x, n, hc,
                                            dim, f, post, comb));
    else
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_post_kernel<0>, dim3(duet_cdiv(total, 256)), dim3(256), 0, x, n, hc,
                                            dim, f, post, comb));
    return DUET_OK;
}

/* hc_post ahead of a pre-mix (hc_launch): x replaced in place by post·f + comb·x, from the post
 * and comb of the pre-mix before (which this pre-mix then overwrites) */
typedef struct {
    const float *f, *post, *comb;
} hc_post_in;

/* hc_pre (!head) / hc_head, and their fused forms with the norm (norm: y = rmsnorm(collapsed,
 * norm_w, eps), else y = collapsed): the slice partials, then the second kernel, with hc known
 * at compile time where it is 4.  With hp, hc_post first: in the partials' launch where it
 * takes the shorter path and hc <= 4, else as its own launch ahead (the same bits). */
static duet_status_t hc_launch(duet_cuda_t *c, const char *op, bool head, bool norm, const hc_post_in *hp,
                               const float *x, int n, int hc, int dim, const float *fn, const float *base,
                               const float *scale_d, float scale_h, int sinkhorn_iters, float hc_eps, float norm_eps,
                               float *post, float *comb, const float *norm_w, float eps, float *y,
                               bool comb_logits = false)
{
    DUET_TRY(hc_check(c, op, hc, dim, x));
    if (comb_logits && (head || !duet_cuda_hc_sinkhorn_ok(hc)))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: comb's logits asked for with hc %d (hc * hc at most 32)",
                               op, hc);
    int threads = norm ? duet_cuda_rmsnorm_threads(dim) : HC_THREADS;
    if (norm && dim > HC_NORM_COLS * threads)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: dim %d over %d", op, dim, HC_NORM_COLS * threads);
    if (n <= 0)
        return DUET_OK;
    if (n > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: %d rows (at most 65535)", op, n);
    int mix = head ? hc : (2 + hc) * hc, S, cols;
    hc_split(c, n, dim, &S, &cols);
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, sizeof(float) * (size_t)n * S * (1 + mix), &scr));
    const float *part = (const float *)scr;
    /* the partial kernel's shorter path (its slices and mix rows within what it holds) */
    bool pre = n <= HC_PRE_ROWS && hc * cols <= HC_PRE_COLS && mix <= HC_PRE_M * (HC_THREADS / 32);
    dim3 pgrid(S, (n + HC_RG - 1) / HC_RG);
    if (hp && pre && hc <= 4) {
        float *xw = (float *)x; /* the caller's x, updated in place */
        if (hc == 4)
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_post_partial_kernel<4>, pgrid, dim3(HC_THREADS), 0, xw, n, hc,
                                                dim, hp->f, hp->post, hp->comb, fn, mix, cols, (float *)scr));
        else
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_post_partial_kernel<0>, pgrid, dim3(HC_THREADS), 0, xw, n, hc,
                                                dim, hp->f, hp->post, hp->comb, fn, mix, cols, (float *)scr));
    } else {
        if (hp)
            DUET_TRY(hc_post_launch(c, (float *)x, n, hc, dim, hp->f, hp->post, hp->comb));
        if (pre)
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_partial_pre_kernel, pgrid, dim3(HC_THREADS), 0, x, n, hc, dim,
                                                fn, mix, cols, (float *)scr));
        else
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_partial_kernel, pgrid, dim3(HC_THREADS), 0, x, n, hc, dim, fn,
                                                mix, cols, (float *)scr));
    }
#define HC_FINISH(HEAD, HCT)                                                                                           \
    do {                                                                                                               \
        if (norm)                                                                                                      \
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_finish_norm_kernel<HEAD, HCT>, dim3(n), dim3(threads), 0, x, hc, \
                                                dim, S, part, base, scale_d, scale_h, sinkhorn_iters, hc_eps,          \
                                                norm_eps, comb_logits, post, comb, norm_w, eps, y));                   \
        else                                                                                                           \
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_finish_kernel<HEAD, HCT>, dim3(n), dim3(threads), 0, x, hc, dim, \
                                                S, part, base, scale_d, scale_h, sinkhorn_iters, hc_eps, norm_eps,     \
                                                comb_logits, post, comb, y));                                          \
    } while (0)
    if (head && hc == 4)
        HC_FINISH(true, 4);
    else if (head)
        HC_FINISH(true, 0);
    else if (hc == 4)
        HC_FINISH(false, 4);
    else
        HC_FINISH(false, 0);
#undef HC_FINISH
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_hc_pre(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                          const float *base, const float *scale, int sinkhorn_iters, float hc_eps,
                                          float norm_eps, float *post, float *comb, float *collapsed)
{
    if (c->exact)
        return duet_cuda_exact_hc_pre(c, x, n, hc, dim, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, post, comb,
                                      collapsed);
    return hc_launch(c, "hc_pre", false, false, NULL, x, n, hc, dim, fn, base, scale, 0.0f, sinkhorn_iters, hc_eps,
                     norm_eps, post, comb, NULL, 0.0f, collapsed);
}

extern "C" duet_status_t duet_cuda_hc_post(duet_cuda_t *c, float *x, int n, int hc, int dim, const float *f,
                                           const float *post, const float *comb)
{
    if (hc < 1 || hc > HC_MAX)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "hc_post: hc %d (1..%d)", hc, HC_MAX);
    return hc_post_launch(c, x, n, hc, dim, f, post, comb);
}

extern "C" int duet_cuda_hc_norm_ok(int hc, int dim)
{
    return hc >= 1 && hc <= HC_MAX && dim > 0 && (hc * dim) % 4 == 0 &&
           dim <= HC_NORM_COLS * duet_cuda_rmsnorm_threads(dim);
}

extern "C" duet_status_t duet_cuda_hc_pre_norm(duet_cuda_t *c, const float *x, int n, int hc, int dim,
                                               const float *fn, const float *base, const float *scale,
                                               int sinkhorn_iters, float hc_eps, float norm_eps, float *post,
                                               float *comb, const float *norm_w, float eps, float *y,
                                               int comb_logits)
{
    if (c->exact)
        return DUET_CUDA_NOT_EXACT(c, "hc_pre_norm");
    return hc_launch(c, "hc_pre_norm", false, true, NULL, x, n, hc, dim, fn, base, scale, 0.0f, sinkhorn_iters, hc_eps,
                     norm_eps, post, comb, norm_w, eps, y, comb_logits != 0);
}

extern "C" duet_status_t duet_cuda_hc_head_norm(duet_cuda_t *c, const float *x, int n, int hc, int dim,
                                                const float *fn, const float *base, float scale, float hc_eps,
                                                float norm_eps, const float *norm_w, float eps, float *y)
{
    if (c->exact)
        return DUET_CUDA_NOT_EXACT(c, "hc_head_norm");
    return hc_launch(c, "hc_head_norm", true, true, NULL, x, n, hc, dim, fn, base, NULL, scale, 0, hc_eps, norm_eps,
                     NULL, NULL, norm_w, eps, y);
}

extern "C" duet_status_t duet_cuda_hc_head(duet_cuda_t *c, const float *x, int n, int hc, int dim, const float *fn,
                                           const float *base, float scale, float hc_eps, float norm_eps, float *y)
{
    if (c->exact)
        return duet_cuda_exact_hc_head(c, x, n, hc, dim, fn, base, scale, hc_eps, norm_eps, y);
    return hc_launch(c, "hc_head", true, false, NULL, x, n, hc, dim, fn, base, NULL, scale, 0, hc_eps, norm_eps, NULL,
                     NULL, NULL, 0.0f, y);
}

extern "C" duet_status_t duet_cuda_hc_post_pre_norm(duet_cuda_t *c, float *x, int n, int hc, int dim, const float *f,
                                                    const float *fn, const float *base, const float *scale,
                                                    int sinkhorn_iters, float hc_eps, float norm_eps, float *post,
                                                    float *comb, const float *norm_w, float eps, float *y,
                                                    int comb_logits)
{
    if (c->exact)
        return DUET_CUDA_NOT_EXACT(c, "hc_post_pre_norm");
    hc_post_in hp = {f, post, comb};
    return hc_launch(c, "hc_post_pre_norm", false, true, &hp, x, n, hc, dim, fn, base, scale, 0.0f, sinkhorn_iters,
                     hc_eps, norm_eps, post, comb, norm_w, eps, y, comb_logits != 0);
}

extern "C" int duet_cuda_hc_sinkhorn_ok(int hc) { return hc >= 1 && hc * hc <= 32; }

extern "C" duet_status_t duet_cuda_hc_sinkhorn(duet_cuda_t *c, int n, int hc, int sinkhorn_iters, float hc_eps,
                                               float *comb)
{
    if (c->exact)
        return DUET_CUDA_NOT_EXACT(c, "hc_sinkhorn");
    if (!duet_cuda_hc_sinkhorn_ok(hc))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "hc_sinkhorn: hc %d (hc * hc at most 32)", hc);
    if (n < 0 || sinkhorn_iters < 0)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "hc_sinkhorn: %d rows, %d iterations", n, sinkhorn_iters);
    if (n == 0)
        return DUET_OK;
    dim3 grid(duet_cdiv((size_t)n, HC_SK_WARPS));
    if (hc == 4)
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_sinkhorn_kernel<4>, grid, dim3(HC_SK_WARPS * 32), 0, n, hc,
                                            sinkhorn_iters, hc_eps, comb));
    else
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, hc_sinkhorn_kernel<0>, grid, dim3(HC_SK_WARPS * 32), 0, n, hc,
                                            sinkhorn_iters, hc_eps, comb));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_hc_post_head_norm(duet_cuda_t *c, float *x, int n, int hc, int dim,
                                                     const float *f, const float *post, const float *comb,
                                                     const float *fn, const float *base, float scale, float hc_eps,
                                                     float norm_eps, const float *norm_w, float eps, float *y)
{
    if (c->exact)
        return DUET_CUDA_NOT_EXACT(c, "hc_post_head_norm");
    hc_post_in hp = {f, post, comb};
    return hc_launch(c, "hc_post_head_norm", true, true, &hp, x, n, hc, dim, fn, base, NULL, scale, 0, hc_eps,
                     norm_eps, NULL, NULL, norm_w, eps, y);
}
