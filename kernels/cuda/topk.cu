/* Top-k on the GPU (contract in topk.cuh): one block per row.
 *
 * Each value maps to a 32-bit key that orders like the CPU's comparison
 * (NaN -> -inf, -0 -> +0, larger value -> larger key).  Four 8-bit radix
 * passes find the key T of the k-th best element and how many of the
 * elements equal to T belong in the result (r); a last pass walks the row in
 * index order and keeps every key > T and the first r keys == T, writing
 * indices in ascending order: the CPU's set (value desc, then index asc),
 * in the CPU's output order.  That pass counts each warp's keys above and at
 * T a step, scans the counts once and then places every kept key, three
 * barriers a run of 32 steps (a scan of its flags at every step took six a
 * step).  Rows up to min(max_n, 32768) values are keyed once into shared
 * memory, so the five passes read global memory once. */
#include "common.cuh"

#define TOPK_THREADS 1024
#ifndef TOPK_STEPS
#define TOPK_STEPS 2 /* steps of a radix pass taken together */
#endif
#define TOPK_SMEM_KEYS 32768 /* rows up to this length are keyed once into shared memory (128 KB) */

__device__ __forceinline__ uint32_t topk_key(float f)
{
    if (f != f)
        f = -INFINITY;
    if (f == 0.0f)
        f = 0.0f;
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Inclusive scan of two values across a warp's lanes. */
__device__ __forceinline__ void warp_scan2(uint32_t *a, uint32_t *b)
{
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        uint32_t ta = __shfl_up_sync(0xffffffffu, *a, o), tb = __shfl_up_sync(0xffffffffu, *b, o);
        if (lane >= o) {
            *a += ta;
            *b += tb;
        }
    }
}

/* Exclusive prefix sums of two counts over the block in thread order, and their totals. */
__device__ __forceinline__ void block_scan2(uint32_t a, uint32_t b, uint32_t *a_ex, uint32_t *b_ex, uint32_t *a_tot,
                                            uint32_t *b_tot, uint32_t (*wsum)[2])
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint32_t ia = a, ib = b;
    warp_scan2(&ia, &ib);
    if (lane == 31) {
        wsum[warp][0] = ia;
        wsum[warp][1] = ib;
    }
    __syncthreads();
    if (warp == 0) {
        uint32_t va = lane < nw ? wsum[lane][0] : 0, vb = lane < nw ? wsum[lane][1] : 0, xa = va, xb = vb;
        warp_scan2(&xa, &xb);
        __syncwarp();
        if (lane < nw) {
            wsum[lane][0] = xa - va;
            wsum[lane][1] = xb - vb;
        }
        if (lane == 31) {
            wsum[32][0] = xa;
            wsum[32][1] = xb;
        }
    }
    __syncthreads();
    *a_ex = wsum[warp][0] + ia - a;
    *b_ex = wsum[warp][1] + ib - b;
    *a_tot = wsum[32][0];
    *b_tot = wsum[32][1];
}

__global__ void __launch_bounds__(TOPK_THREADS) topk_kernel(const float *v, const int32_t *off, const int32_t *nn,
                                                            int k, int cap, int32_t *idx)
{
    duet_pdl_wait();
    extern __shared__ uint32_t ks[]; /* [cap] */
    __shared__ uint32_t hist[256];
    __shared__ uint32_t wsum[33][2];
    __shared__ uint32_t cgt[TOPK_THREADS], ceq[TOPK_THREADS]; /* the last pass's counts a (step, warp) */
    __shared__ uint32_t s_prefix, s_remaining;
    int tid = threadIdx.x, bd = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const float *x = v + off[blockIdx.x];
    int n = nn[blockIdx.x];
    int kk = n < k ? n : k;
    if (kk < 0)
        kk = 0;
    int32_t *out = idx + (size_t)blockIdx.x * k;
    for (int i = kk + tid; i < k; i += bd)
        out[i] = -1;
    if (kk == 0)
        return;
    if (kk == n) {
        for (int i = tid; i < n; i += bd)
            out[i] = i;
        return;
    }

    /* keys in shared memory when the row fits: one pass over global memory, with many loads in flight */
    bool staged = n <= cap;
    if (staged) {
        for (int i = tid; i < n; i += bd)
            ks[i] = topk_key(x[i]);
        __syncthreads();
    }
#define KEY_AT(i) (staged ? ks[i] : topk_key(x[i]))

    uint32_t prefix = 0, mask = 0, remaining = (uint32_t)kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += bd)
            hist[i] = 0;
        __syncthreads();
        /* two steps at a time (their loads and matches overlap); lanes adding to the same bin
         * add once (values share their top bits); lanes out of the prefix match as bin 256 */
        for (int start = 0; start < n; start += TOPK_STEPS * bd) {
            uint32_t bin[TOPK_STEPS];
#pragma unroll
            for (int u = 0; u < TOPK_STEPS; u++) {
                int i = start + u * bd + tid;
                uint32_t key = i < n ? KEY_AT(i) : 0;
                bin[u] = i < n && (key & mask) == prefix ? (key >> shift) & 255u : 256u;
            }
#pragma unroll
            for (int u = 0; u < TOPK_STEPS; u++) {
                uint32_t peers = __match_any_sync(0xffffffffu, bin[u]);
                if (bin[u] < 256u && lane == __ffs(peers) - 1)
                    atomicAdd(&hist[bin[u]], (uint32_t)__popc(peers));
            }
        }
        __syncthreads();
        if (warp == 0) {
            /* lane l holds bins 255-8l .. 248-8l (highest first) */
            uint32_t cnt[8], total = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                cnt[j] = hist[255 - 8 * lane - j];
                total += cnt[j];
            }
            uint32_t incl = total;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += t;
            }
            uint32_t above = incl - total;
            if (above < remaining && remaining <= incl) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (remaining <= above + cnt[j]) {
                        s_prefix = prefix | ((uint32_t)(255 - 8 * lane - j) << shift);
                        s_remaining = remaining - above;
                        break;
                    }
                    above += cnt[j];
                }
            }
        }
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 255u << shift;
    }

    /* prefix: the k-th best key; remaining: how many keys equal to it are taken.  The selection
     * in index order, a run of up to 32 steps of bd keys at a time: each warp's counts of the keys
     * above the threshold and equal to it at each step (an entry a (step, warp): index order), one
     * scan of those entries, then each key's place: the keys above it before it, plus the equal
     * ones before it up to `remaining`.  Three barriers a run. */
    int nw = bd >> 5;
    uint32_t lt_mask = (1u << lane) - 1u, base_gt = 0, base_eq = 0;
    for (int run = 0; run < n; run += 32 * bd) {
        int steps = (n - run + bd - 1) / bd;
        if (steps > 32)
            steps = 32;
        for (int s = 0; s < steps; s++) {
            int i = run + s * bd + tid;
            uint32_t key = i < n ? KEY_AT(i) : 0;
            uint32_t bg = __ballot_sync(0xffffffffu, i < n && key > prefix);
            uint32_t be = __ballot_sync(0xffffffffu, i < n && key == prefix);
            if (lane == 0) {
                cgt[s * nw + warp] = __popc(bg);
                ceq[s * nw + warp] = __popc(be);
            }
        }
        __syncthreads();
        int ne = steps * nw; /* at most bd */
        uint32_t g = tid < ne ? cgt[tid] : 0, e = tid < ne ? ceq[tid] : 0, g_ex, e_ex, g_tot, e_tot;
        block_scan2(g, e, &g_ex, &e_ex, &g_tot, &e_tot, wsum);
        if (tid < ne) {
            cgt[tid] = base_gt + g_ex;
            ceq[tid] = base_eq + e_ex;
        }
        __syncthreads();
        for (int s = 0; s < steps; s++) {
            int i = run + s * bd + tid;
            uint32_t key = i < n ? KEY_AT(i) : 0;
            bool gt = i < n && key > prefix, eq = i < n && key == prefix;
            uint32_t bg = __ballot_sync(0xffffffffu, gt), be = __ballot_sync(0xffffffffu, eq);
            uint32_t gb = cgt[s * nw + warp] + __popc(bg & lt_mask), eb = ceq[s * nw + warp] + __popc(be & lt_mask);
            if (gt || (eq && eb < remaining))
                out[gb + (eb < remaining ? eb : remaining)] = i;
        }
        base_gt += g_tot;
        base_eq += e_tot;
        __syncthreads(); /* every read of this run's entries before the next run writes them */
    }
#undef KEY_AT
}

extern "C" duet_status_t duet_cuda_topk(duet_cuda_t *c, const float *v, const int32_t *off, const int32_t *n,
                                        int n_rows, int max_n, int k, int32_t *idx)
{
    if (n_rows <= 0 || k <= 0)
        return DUET_OK;
    int cap = max_n < TOPK_SMEM_KEYS ? (max_n > 0 ? max_n : 1) : TOPK_SMEM_KEYS;
    size_t smem = (size_t)cap * sizeof(uint32_t);
    if (!c->topk_smem_set) { /* static + dynamic shared memory may pass the default 48 KB */
        DUET_CUDA_CHECK(c, cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                TOPK_SMEM_KEYS * (int)sizeof(uint32_t)));
        c->topk_smem_set = 1;
    }
    DUET_CUDA_CHECK(c,
                    duet_cuda_launch(c, topk_kernel, dim3(n_rows), dim3(TOPK_THREADS), smem, v, off, n, k, cap, idx));
    return DUET_OK;
}
