/* Top-k on the GPU (contract in topk.cuh): one block per row.
 *
 * Each value maps to a 32-bit key that orders like the CPU's comparison
 * (NaN -> -inf, -0 -> +0, larger value -> larger key).  Four 8-bit radix
 * passes find the key T of the k-th best element and how many of the
 * elements equal to T belong in the result (r); a last pass walks the row in
 * index order and keeps every key > T and the first r keys == T, writing
 * indices in ascending order: the CPU's set (value desc, then index asc),
 * in the CPU's output order.  Rows up to min(max_n, 32768) values are keyed
 * once into shared memory, so the five passes read global memory once. */
#include "common.cuh"

#define TOPK_THREADS 1024
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

/* Exclusive prefix count of a 0/1 flag over the block in thread order, and the total. */
__device__ __forceinline__ void block_scan01(int flag, uint32_t *excl, uint32_t *tot, uint32_t *wsum)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint32_t bal = __ballot_sync(0xffffffffu, flag);
    uint32_t in_warp = __popc(bal & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0)
        wsum[warp] = __popc(bal);
    __syncthreads();
    if (warp == 0) {
        uint32_t v = lane < nw ? wsum[lane] : 0, incl = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += t;
        }
        wsum[lane] = incl - v;
        if (lane == 31)
            wsum[32] = incl;
    }
    __syncthreads();
    *excl = wsum[warp] + in_warp;
    *tot = wsum[32];
}

__global__ void __launch_bounds__(TOPK_THREADS) topk_kernel(const float *v, const int32_t *off, const int32_t *nn,
                                                            int k, int cap, int32_t *idx)
{
    duet_pdl_wait();
    extern __shared__ uint32_t ks[]; /* [cap] */
    __shared__ uint32_t hist[256];
    __shared__ uint32_t wsum[33];
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
        for (int start = 0; start < n; start += bd) {
            int i = start + tid;
            uint32_t key = i < n ? KEY_AT(i) : 0;
            int in = i < n && (key & mask) == prefix;
            uint32_t bin = (key >> shift) & 255u;
            /* lanes adding to the same bin add once (values share their top bits) */
            uint32_t act = __ballot_sync(0xffffffffu, in);
            if (in) {
                uint32_t peers = __match_any_sync(act, bin);
                if (lane == __ffs(peers) - 1)
                    atomicAdd(&hist[bin], (uint32_t)__popc(peers));
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

    /* prefix: the k-th best key; remaining: how many keys equal to it are taken */
    uint32_t base_eq = 0, base_out = 0;
    for (int start = 0; start < n && base_out < (uint32_t)kk; start += bd) {
        int i = start + tid;
        uint32_t key = i < n ? KEY_AT(i) : 0;
        int gt = i < n && key > prefix, eq = i < n && key == prefix;
        uint32_t eq_excl, eq_tot, sel_excl, sel_tot;
        block_scan01(eq, &eq_excl, &eq_tot, wsum);
        int sel = gt || (eq && base_eq + eq_excl < remaining);
        block_scan01(sel, &sel_excl, &sel_tot, wsum);
        if (sel)
            out[base_out + sel_excl] = i;
        base_eq += eq_tot;
        base_out += sel_tot;
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
