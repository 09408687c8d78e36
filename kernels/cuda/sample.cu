/* Sampling on the GPU (contract in sample.cuh).
 *
 * A cluster of 1, 2, 4 or 8 blocks of 1024 threads a row (the largest with which every row's
 * cluster is resident at once), each block over its part of the row, in passes; after each
 * pass the blocks read one another's counts through distributed shared memory, so that every
 * block takes the same decisions:
 *   1. the argmax (larger value, then lower id; NaN never wins), as duet_cuda_argmax;
 *   2. each id's p = duet_sample_exp(logit * (1 / T) - max * (1 / T)), rounded as the host rounds
 *      it, and its key 0x3f800000 - bits(p) (smaller for larger p; ids with p below 1e-9 get
 *      none) written to scratch, with a count and an exact sum of p * 2^53 for each of 2048
 *      bins of the key's top 11 bits;
 *   3. each cut (top-k, min-p, top-p, the draw) as the first position of the order (p
 *      descending, id ascending) whose running count or running exact sum passes a test:
 *      the bin where it falls from the counts and sums of the level above, then 512 bins of
 *      the next 9 bits among that bin's keys (a pass), then 256 bins of the last 8 (a pass),
 *      then the rank among the ids of that one key (equal p: a running sum grows by the same
 *      amount each step, so a binary search), and the id of that rank (the lowest id with the
 *      key from the last pass; a pass over the row for a later rank).
 * Sums of p * 2^53 are integers below 2^71 (p >= 1e-9 is a float, a multiple of 2^-53): a
 * shared-memory bin holds its count and its sum scaled down by its binade (exact) in one 64-bit
 * word, scans and tests are in unsigned __int128.  So every cut is what the host finds by
 * sorting (engine/sampling.c). */
#include "common.cuh"
#include "sample_exp.h"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define SP_THREADS 1024
#define SP_WARPS (SP_THREADS / 32)
#define SP_B1 2048          /* key >> 17 (keys are below 2^28) */
#define SP_B2 512           /* (key >> 8) & 511 */
#define SP_B3 256           /* key & 255 */
#define SP_NONE 0xffffffffu /* p below 1e-9: not a candidate */
#define SP_ONE 0x3f800000u  /* bits of 1.0f */

typedef unsigned long long sp_u64;
typedef unsigned __int128 sp_u128;

struct sp_smem {
    sp_u64 w1[SP_B1]; /* this block's bins: a count and sum, packed (sp_add_warp) */
    sp_u64 w2[SP_B2];
    uint32_t c3[SP_B3];
    int32_t id3[SP_B3];
    sp_u64 m1[SP_B1]; /* the cluster's: every block's summed (the lowest id of the last level) */
    sp_u64 m2[SP_B2];
    uint32_t m3c[SP_B3];
    int32_t m3id[SP_B3];
    float xv; /* this block's share, read by the cluster's other blocks: its argmax, a count and sum */
    int32_t xi;
    uint32_t xc;
    sp_u64 xlo, xhi;
    uint32_t wc[SP_WARPS]; /* block scans: a warp's count and sum */
    sp_u64 wlo[SP_WARPS], whi[SP_WARPS];
    float wv[SP_WARPS]; /* the argmax's reduction */
    int32_t wi[SP_WARPS];
    int found; /* sp_find's answer: the bin (-1: none), the running count and sum before it */
    uint32_t fc;
    sp_u64 flo, fhi;
    uint32_t kmin;
    int32_t id;
};

/* a cut's test on a running count c and exact sum s: c >= k when k > 0; else (s << z) >= rhs,
 * or > rhs when strict */
struct sp_pred {
    uint32_t k;
    int z, strict;
    sp_u128 rhs;
};

__device__ __forceinline__ bool sp_pass(const sp_pred &p, uint32_t c, sp_u128 s)
{
    if (p.k)
        return c >= p.k;
    sp_u128 v = s << p.z;
    return p.strict ? v > p.rhs : v >= p.rhs;
}

/* p * 2^53 for the bits of a candidate's p (normal, exponent >= 97) */
__device__ __forceinline__ sp_u64 sp_f53(uint32_t bits)
{
    return (sp_u64)((bits & 0x7fffffu) | 0x800000u) << (((bits >> 23) & 0xffu) - 97u);
}

/* A bin of levels 1 and 2 is one 64-bit word: its count << SP_CNT_SHIFT plus the sum of its
 * candidates' p * 2^53 >> sp_bin_shift(its level-1 bin).  A level-1 bin's keys (2^17 of them,
 * aligned) lie in one binade of p but for its largest p, which may be the next binade's first
 * value; so p * 2^53 of each is a multiple of 2^shift, shift the binade's exponent less 97, and
 * each term is at most 2^24: a vocabulary of 2^18 sums below 2^42, counts at most 2^18 above.
 * One atomic a candidate. */
#define SP_CNT_SHIFT 43
#define SP_SUM_MASK ((1ull << SP_CNT_SHIFT) - 1)

__device__ __forceinline__ int sp_bin_shift(uint32_t b1) { return (int)((SP_ONE - 1u - (b1 << 17)) >> 23) - 97; }

/* A candidate's term, p * 2^53 >> sp_bin_shift(its bin): its 24-bit significand, or 2^24 for a
 * power of two (always the largest key of its bin, one binade up). */
__device__ __forceinline__ uint32_t sp_term(uint32_t bits)
{
    uint32_t m = bits & 0x7fffffu;
    return m ? m | 0x800000u : 0x1000000u;
}

/* Candidates into bins, from all 32 lanes of a warp at once (every lane calls it; `active`: this
 * lane has one, for bin b, adding the term v, at most 2^24; v is not read where not active).
 * When the warp's candidates share one bin (a row of many equal keys, which would otherwise
 * serialize on one address) the lowest of them adds their count and sum in one atomic.
 * Otherwise each lane adds its own: a vote and a shuffle decide, where matching lanes by bin
 * cost more than the atomics they save.  (sp_add3_warp repeats this head: the two sharing a
 * helper measured 800 more instructions in the kernel.) */
__device__ __forceinline__ void sp_add_warp(sp_u64 *w, bool active, int b, uint32_t v)
{
    unsigned act = __ballot_sync(0xffffffffu, active);
    if (!act)
        return;
    int lead = __ffs(act) - 1;
    int b0 = __shfl_sync(0xffffffffu, b, lead);
    if (__all_sync(0xffffffffu, !active || b == b0)) {
        uint32_t sum = __reduce_add_sync(0xffffffffu, active ? v : 0u); /* below 2^29 */
        if ((int)(threadIdx.x & 31) == lead)
            atomicAdd(&w[b], ((sp_u64)__popc(act) << SP_CNT_SHIFT) + sum);
        return;
    }
    if (active)
        atomicAdd(&w[b], (1ull << SP_CNT_SHIFT) + v);
}

/* The last level's bins, as sp_add_warp: a count, and the lowest id (when the warp's candidates
 * share one key, the lowest lane holds the lowest id). */
__device__ __forceinline__ void sp_add3_warp(sp_smem &sh, bool active, uint32_t k, int i)
{
    unsigned act = __ballot_sync(0xffffffffu, active);
    if (!act)
        return;
    int lead = __ffs(act) - 1;
    uint32_t k0 = __shfl_sync(0xffffffffu, k, lead);
    if (__all_sync(0xffffffffu, !active || k == k0)) {
        if ((int)(threadIdx.x & 31) == lead) {
            atomicAdd(&sh.c3[k & 255], (uint32_t)__popc(act));
            atomicMin(&sh.id3[k & 255], i);
        }
    } else if (active) {
        atomicAdd(&sh.c3[k & 255], 1u);
        atomicMin(&sh.id3[k & 255], i);
    }
}

__device__ __forceinline__ void sp_warp_scan(int lane, uint32_t &c, sp_u128 &s)
{
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        uint32_t oc = __shfl_up_sync(0xffffffffu, c, o);
        sp_u64 ol = __shfl_up_sync(0xffffffffu, (sp_u64)s, o);
        sp_u64 oh = __shfl_up_sync(0xffffffffu, (sp_u64)(s >> 64), o);
        if (lane >= o) {
            c += oc;
            s += ((sp_u128)oh << 64) | ol;
        }
    }
}

/* Block-wide exclusive scan of (c, s) in thread order: *ec, *es; the block's totals in *tc, *ts. */
__device__ void sp_exscan(sp_smem &sh, uint32_t c, sp_u128 s, uint32_t *ec, sp_u128 *es, uint32_t *tc, sp_u128 *ts)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t ic = c;
    sp_u128 is = s;
    sp_warp_scan(lane, ic, is);
    if (lane == 31) {
        sh.wc[warp] = ic;
        sh.wlo[warp] = (sp_u64)is;
        sh.whi[warp] = (sp_u64)(is >> 64);
    }
    __syncthreads();
    if (warp == 0) {
        uint32_t wc = sh.wc[lane];
        sp_u128 ws = ((sp_u128)sh.whi[lane] << 64) | sh.wlo[lane];
        sp_warp_scan(lane, wc, ws); /* its shuffles order every lane's read before the writes */
        sh.wc[lane] = wc;
        sh.wlo[lane] = (sp_u64)ws;
        sh.whi[lane] = (sp_u64)(ws >> 64);
    }
    __syncthreads();
    uint32_t pc = warp ? sh.wc[warp - 1] : 0;
    sp_u128 ps = warp ? ((sp_u128)sh.whi[warp - 1] << 64) | sh.wlo[warp - 1] : 0;
    *ec = pc + ic - c;
    *es = ps + is - s;
    *tc = sh.wc[SP_WARPS - 1];
    *ts = ((sp_u128)sh.whi[SP_WARPS - 1] << 64) | sh.wlo[SP_WARPS - 1];
    __syncthreads();
}

struct sp_hit {
    int bin; /* -1: the test never passes */
    uint32_t c;
    sp_u128 s; /* running count and sum before the bin */
};

/* The first of nbins bins (in key order, after a running count c0 and sum s0) through which the
 * running count and sum pass pr: bin(b, &count, &sum) gives a bin's.  Every thread gets it. */
template <class Bin>
__device__ sp_hit sp_find(sp_smem &sh, int nbins, Bin bin, uint32_t c0, sp_u128 s0, const sp_pred &pr)
{
    const int per = (nbins + SP_THREADS - 1) / SP_THREADS;
    int b0 = (int)threadIdx.x * per;
    uint32_t lc = 0;
    sp_u128 ls = 0;
    for (int q = 0; q < per && b0 + q < nbins; q++) {
        uint32_t bc;
        sp_u128 bs;
        bin(b0 + q, &bc, &bs);
        lc += bc;
        ls += bs;
    }
    if (threadIdx.x == 0)
        sh.found = -1;
    uint32_t ec, tc;
    sp_u128 es, ts;
    sp_exscan(sh, lc, ls, &ec, &es, &tc, &ts);
    uint32_t c = c0 + ec;
    sp_u128 s = s0 + es;
    for (int q = 0; q < per && b0 + q < nbins; q++) {
        uint32_t bc;
        sp_u128 bs;
        bin(b0 + q, &bc, &bs);
        if (bc && !sp_pass(pr, c, s) && sp_pass(pr, c + bc, s + bs)) { /* one bin at most: the tests are monotone */
            sh.found = b0 + q;
            sh.fc = c;
            sh.flo = (sp_u64)s;
            sh.fhi = (sp_u64)(s >> 64);
        }
        c += bc;
        s += bs;
    }
    __syncthreads();
    sp_hit h = {sh.found, sh.fc, ((sp_u128)sh.fhi << 64) | sh.flo};
    __syncthreads();
    return h;
}

/* A level's bins for sp_find, unpacked: level 1 (sh < 0) with each bin's own shift, level 2 with
 * its level-1 bin's. */
struct sp_bins {
    const sp_u64 *w;
    int sh;
    __device__ void operator()(int b, uint32_t *n, sp_u128 *s) const
    {
        sp_u64 x = w[b], m = x & SP_SUM_MASK;
        int t = sh >= 0 ? sh : sp_bin_shift((uint32_t)b);
        *n = (uint32_t)(x >> SP_CNT_SHIFT);
        t = *n ? t : 0; /* 0 to 30 where there is a candidate */
        *s = ((sp_u128)(t ? m >> (64 - t) : 0) << 64) | (m << t);
    }
};

/* A position of the order: its key, its rank j among the m ids of that key, the running count
 * and exact sum through it, and the lowest id of the key. */
struct sp_pos {
    int ok;
    uint32_t key, j, m, cnt;
    sp_u128 sum;
    int32_t id1;
};

/* A block's part of a row: the cluster's blocks split the row's 4-id vectors into ranges in
 * rank order, so that each block's ids follow the ones before it. */
struct sp_part {
    const uint32_t *keys; /* the row's (V of them, padded with SP_NONE to a multiple of 4, 16-byte aligned) */
    int V, beg4, end4;    /* this block's vectors [beg4, end4) */
};

/* f(i, key, in(key)) for the keys of the block's part, skipping each group of a warp's keys where
 * `in` holds for none: four 16-byte loads a thread in flight (64 KiB a block), each warp's lanes
 * on consecutive vectors so that a warp calls f together (sp_add_warp) and, for one call, lane
 * order is id order.  A pass looks for the few keys of one bin: the test and a vote are all most
 * keys cost (the kernel's time is its instructions, not its loads). */
template <class In, class F> __device__ __forceinline__ void sp_each_key(const sp_part &pt, In in, F f)
{
    const uint4 *k4 = (const uint4 *)pt.keys;
    const int lane = threadIdx.x & 31;
    for (int w0 = pt.beg4 + (int)(threadIdx.x & ~31u); w0 < pt.end4; w0 += 4 * SP_THREADS) { /* a warp's trips */
        uint4 q[4];
        bool any = false;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int j = w0 + lane + u * SP_THREADS;
            q[u] = j < pt.end4 ? k4[j] : make_uint4(SP_NONE, SP_NONE, SP_NONE, SP_NONE);
            any |= in(q[u].x) | in(q[u].y) | in(q[u].z) | in(q[u].w);
        }
        if (!__any_sync(0xffffffffu, any))
            continue;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = 4 * (w0 + lane + u * SP_THREADS);
            f(i, q[u].x, in(q[u].x));
            f(i + 1, q[u].y, in(q[u].y));
            f(i + 2, q[u].z, in(q[u].z));
            f(i + 3, q[u].w, in(q[u].w));
        }
    }
}

/* dst[b] = the sum over the cluster's blocks of their src[b] (src: this block's array, at the same
 * place in every block), b < nb.  Integers: the order of the terms does not matter. */
__device__ __forceinline__ void sp_merge(cg::cluster_group &cl, sp_u64 *dst, sp_u64 *src, int nb)
{
    const unsigned P = cl.num_blocks();
    for (int b = threadIdx.x; b < nb; b += SP_THREADS) {
        sp_u64 v = 0;
        for (unsigned q = 0; q < P; q++)
            v += cl.map_shared_rank(src, q)[b];
        dst[b] = v;
    }
}

/* Four logits from x[4j], NaN past V: one 16-byte load where the row is aligned. */
__device__ __forceinline__ float4 sp_load4(const float *__restrict__ x, int j, int V, bool aligned)
{
    const float nan = __uint_as_float(0x7fc00000u);
    int i = 4 * j;
    if (aligned && i + 3 < V)
        return ((const float4 *)x)[j];
    return make_float4(i < V ? x[i] : nan, i + 1 < V ? x[i + 1] : nan, i + 2 < V ? x[i + 2] : nan,
                       i + 3 < V ? x[i + 3] : nan);
}

/* The first position whose running count and sum pass pr (the level-1 bins already merged into
 * m1).  Each level's bins are counted by every block over its part, then merged; every block
 * then takes the same decisions.  The cluster barrier before a level's bins are cleared waits
 * for the other blocks' reads of the previous search's. */
__device__ sp_pos sp_locate(sp_smem &sh, cg::cluster_group &cl, const sp_part &pt, const sp_pred &pr)
{
    sp_pos r = {};
    sp_hit h1 = sp_find(sh, SP_B1, sp_bins{sh.m1, -1}, 0, 0, pr);
    if (h1.bin < 0)
        return r;
    cl.sync();
    for (int b = threadIdx.x; b < SP_B2; b += SP_THREADS)
        sh.w2[b] = 0;
    for (int b = threadIdx.x; b < SP_B3; b += SP_THREADS) {
        sh.c3[b] = 0;
        sh.id3[b] = 0x7fffffff;
    }
    __syncthreads();
    const uint32_t b1 = (uint32_t)h1.bin;
    const int sh1 = sp_bin_shift(b1);
    sp_each_key(
        pt, [&](uint32_t k) { return (k >> 17) == b1; },
        [&](int, uint32_t k, bool in) { sp_add_warp(sh.w2, in, (int)((k >> 8) & 511), sp_term(SP_ONE - k)); });
    cl.sync();
    sp_merge(cl, sh.m2, sh.w2, SP_B2);
    __syncthreads();
    sp_hit h2 = sp_find(sh, SP_B2, sp_bins{sh.m2, sh1}, h1.c, h1.s, pr);
    if (h2.bin < 0)
        return r;
    const uint32_t pre = (b1 << 9) | (uint32_t)h2.bin;
    sp_each_key(
        pt, [&](uint32_t k) { return (k >> 8) == pre; },
        [&](int i, uint32_t k, bool in) { sp_add3_warp(sh, in, k, i); });
    cl.sync();
    for (int b = threadIdx.x; b < SP_B3; b += SP_THREADS) {
        uint32_t c = 0;
        int32_t id = 0x7fffffff;
        for (unsigned q = 0; q < cl.num_blocks(); q++) {
            c += cl.map_shared_rank(sh.c3, q)[b];
            id = min(id, cl.map_shared_rank(sh.id3, q)[b]);
        }
        sh.m3c[b] = c;
        sh.m3id[b] = id;
    }
    __syncthreads();
    sp_hit h3 = sp_find(
        sh, SP_B3,
        [&](int b, uint32_t *c, sp_u128 *s) {
            *c = sh.m3c[b];
            *s = *c ? (sp_u128)*c * sp_f53(SP_ONE - ((pre << 8) | (uint32_t)b)) : 0;
        },
        h2.c, h2.s, pr);
    if (h3.bin < 0)
        return r;
    r.key = (pre << 8) | (uint32_t)h3.bin;
    r.m = sh.m3c[h3.bin];
    r.id1 = sh.m3id[h3.bin];
    __syncthreads(); /* m3c and m3id read before anything rewrites them */
    /* the rank: the smallest j in [1, m] that passes (j = m does: the bin passed) */
    sp_u64 f = sp_f53(SP_ONE - r.key);
    uint32_t lo = 1, hi = r.m;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (sp_pass(pr, h3.c + mid, h3.s + (sp_u128)mid * f))
            hi = mid;
        else
            lo = mid + 1;
    }
    r.ok = 1;
    r.j = lo;
    r.cnt = h3.c + lo;
    r.sum = h3.s + (sp_u128)lo * f;
    return r;
}

/* The j-th (from 1) lowest id whose key is `key` (-1 when there are fewer), in every block: each
 * block counts its part (each warp its own contiguous range of it), the block whose part holds
 * the j-th finds it (the warp whose range holds it walks that range again), and every block reads
 * it from there. */
__device__ int32_t sp_nth_id(sp_smem &sh, cg::cluster_group &cl, const sp_part &pt, uint32_t key, uint32_t j)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int pbeg = 4 * pt.beg4, pend = min(pt.V, 4 * pt.end4);
    int chunk = ((max(pend - pbeg, 0) + SP_WARPS - 1) / SP_WARPS + 31) & ~31;
    int beg = pbeg + warp * chunk, end = min(pend, beg + chunk);
    uint32_t cnt = 0;
    for (int i = beg + lane; i < end; i += 32)
        cnt += pt.keys[i] == key;
    cnt = __reduce_add_sync(0xffffffffu, cnt);
    if (lane == 0)
        sh.wc[warp] = cnt;
    if (threadIdx.x == 0)
        sh.id = -1;
    __syncthreads();
    uint32_t acc = 0;
    for (int w = 0; w < SP_WARPS; w++)
        acc += sh.wc[w];
    if (threadIdx.x == 0)
        sh.xc = acc;
    cl.sync(); /* every block's count */
    uint32_t before = 0;
    int qt = -1;
    for (unsigned q = 0; q < cl.num_blocks(); q++) {
        uint32_t c = *cl.map_shared_rank(&sh.xc, q);
        if (qt < 0 && before + c >= j)
            qt = (int)q;
        else if (qt < 0)
            before += c;
    }
    if (qt == (int)cl.block_rank()) {
        uint32_t need = j - before;
        int wt = -1;
        acc = 0;
        for (int w = 0; w < SP_WARPS; w++) {
            uint32_t c = sh.wc[w];
            if (wt < 0 && acc + c >= need) {
                wt = w;
                need -= acc;
            }
            acc += c;
        }
        if (warp == wt)
            for (int base = beg; base < end; base += 32) {
                int i = base + lane;
                unsigned m = __ballot_sync(0xffffffffu, i < end && pt.keys[i] == key);
                uint32_t pc = (uint32_t)__popc(m);
                if (need <= pc) {
                    for (uint32_t t = 1; t < need; t++)
                        m &= m - 1;
                    if (lane == 0)
                        sh.id = base + __ffs(m) - 1;
                    break;
                }
                need -= pc;
            }
    }
    cl.sync(); /* the id written */
    return qt >= 0 ? *cl.map_shared_rank(&sh.id, (unsigned)qt) : -1;
}

/* A row's token, the same in every block of its cluster; -1 for the argmax (bi). */
__device__ int32_t sp_row(sp_smem &sh, cg::cluster_group &cl, const duet_cuda_sample_row_t &r, const float *x,
                          const sp_part &pt, int32_t *bi_out)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, V = pt.V;
    const bool aligned = ((uintptr_t)x & 15) == 0;
    const float nan = __uint_as_float(0x7fc00000u);

    /* 1. the argmax: the block's over its part, then the cluster's over the blocks' */
    float bv = nan;
    int bi = 0x7fffffff;
    for (int j0 = pt.beg4 + (int)threadIdx.x; j0 < pt.end4; j0 += 4 * SP_THREADS) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = j0 + u * SP_THREADS < pt.end4 ? sp_load4(x, j0 + u * SP_THREADS, V, aligned)
                                                 : make_float4(nan, nan, nan, nan);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = 4 * (j0 + u * SP_THREADS);
            float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int t = 0; t < 4; t++)
                if (duet_argmax_better(e[t], i + t, bv, bi)) {
                    bv = e[t];
                    bi = i + t;
                }
        }
    }
    duet_argmax_warp(bv, bi);
    if (lane == 0) {
        sh.wv[warp] = bv;
        sh.wi[warp] = bi;
    }
    for (int b = threadIdx.x; b < SP_B1; b += SP_THREADS)
        sh.w1[b] = 0;
    if (threadIdx.x == 0)
        sh.kmin = SP_NONE;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SP_WARPS; w++)
            if (duet_argmax_better(sh.wv[w], sh.wi[w], bv, bi)) {
                bv = sh.wv[w];
                bi = sh.wi[w];
            }
        sh.xv = bv;
        sh.xi = bi;
    }
    cl.sync();
    bv = nan;
    bi = 0x7fffffff;
    for (unsigned q = 0; q < cl.num_blocks(); q++) {
        float qv = *cl.map_shared_rank(&sh.xv, q);
        int qi = *cl.map_shared_rank(&sh.xi, q);
        if (duet_argmax_better(qv, qi, bv, bi)) {
            bv = qv;
            bi = qi;
        }
    }
    *bi_out = bi;
    if (bv != bv) /* every logit NaN */
        return 0;
    if (!(r.temperature > 0.0f) || isinf(bv)) /* greedy; +inf wins outright, a row of -inf is its first */
        return -1;

    /* 2. p, keys and the level-1 bins of the block's part, then the cluster's */
    const float inv_t = __fdiv_rn(1.0f, r.temperature), mx = __fmul_rn(bv, inv_t);
    uint32_t kloc = SP_NONE;
    uint4 *k4 = (uint4 *)pt.keys;
    for (int w0 = pt.beg4 + (int)(threadIdx.x & ~31u); w0 < pt.end4; w0 += 4 * SP_THREADS) { /* a warp's trips */
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int j = w0 + lane + u * SP_THREADS;
            v[u] = j < pt.end4 ? sp_load4(x, j, V, aligned) : make_float4(nan, nan, nan, nan);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int j = w0 + lane + u * SP_THREADS;
            float l[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
            uint32_t k[4];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                float e = duet_sample_exp(__fsub_rn(__fmul_rn(l[t], inv_t), mx));
                bool cand = e >= 1e-9f && j < pt.end4; /* and e <= 1; past V the logit is NaN: e = 0 */
                uint32_t bits = __float_as_uint(e);
                k[t] = cand ? SP_ONE - bits : SP_NONE;
                sp_add_warp(sh.w1, cand, (int)(k[t] >> 17), sp_term(bits));
                kloc = min(kloc, k[t]);
            }
            if (j < pt.end4)
                ((uint4 *)k4)[j] = make_uint4(k[0], k[1], k[2], k[3]);
        }
    }
    kloc = __reduce_min_sync(0xffffffffu, kloc);
    if (lane == 0)
        atomicMin(&sh.kmin, kloc);
    cl.sync();
    sp_merge(cl, sh.m1, sh.w1, SP_B1);
    uint32_t kmin = SP_NONE;
    for (unsigned q = 0; q < cl.num_blocks(); q++)
        kmin = min(kmin, *cl.map_shared_rank(&sh.kmin, q));
    __syncthreads();
    if (kmin == SP_NONE) /* no candidate: only when the scaled maximum overflowed */
        return -1;
    /* the whole: count and exact sum of every candidate */
    uint32_t n;
    sp_u128 S;
    {
        uint32_t lc = 0, ec;
        sp_u128 ls = 0, es;
        const sp_bins bins1 = {sh.m1, -1};
        for (int b = threadIdx.x; b < SP_B1; b += SP_THREADS) {
            uint32_t bc;
            sp_u128 bs;
            bins1(b, &bc, &bs);
            lc += bc;
            ls += bs;
        }
        sp_exscan(sh, lc, ls, &ec, &es, &n, &S);
    }
    const uint32_t pmax_bits = SP_ONE - kmin;

    /* 3. the cuts, as the host takes them: top-k, min-p, top-p, then the draw */
    uint32_t L = n;
    bool bad = false;
    if (r.top_k > 0 && n > (uint32_t)r.top_k) {
        sp_pred p = {(uint32_t)r.top_k, 0, 0, 0};
        sp_pos q = sp_locate(sh, cl, pt, p);
        bad |= !q.ok;
        L = q.cnt;
        S = q.sum;
    }
    if (r.min_p > 0.0f) {
        /* p >= min_p * p_max in double: p >= tf, the smallest float not below it */
        float tf = __double2float_ru((double)r.min_p * (double)__uint_as_float(pmax_bits));
        if (tf > 1e-9f && tf <= 1.0f) {
            const uint32_t kt = SP_ONE - __float_as_uint(tf);
            uint32_t lc = 0, ec, tc;
            sp_u128 ls = 0, es, ts;
            sp_each_key(
                pt, [&](uint32_t k) { return k <= kt; },
                [&](int, uint32_t k, bool in) {
                    if (in) {
                        lc++;
                        ls += sp_f53(SP_ONE - k);
                    }
                });
            sp_exscan(sh, lc, ls, &ec, &es, &tc, &ts);
            if (threadIdx.x == 0) {
                sh.xc = tc;
                sh.xlo = (sp_u64)ts;
                sh.xhi = (sp_u64)(ts >> 64);
            }
            cl.sync();
            tc = 0;
            ts = 0;
            for (unsigned q = 0; q < cl.num_blocks(); q++) {
                tc += *cl.map_shared_rank(&sh.xc, q);
                ts += ((sp_u128)*cl.map_shared_rank(&sh.xhi, q) << 64) | *cl.map_shared_rank(&sh.xlo, q);
            }
            if (tc < L) {
                L = tc;
                S = ts;
            }
        }
    }
    if (r.top_p > 0.0f && r.top_p < 1.0f) {
        /* the shortest prefix whose sum P reaches top_p * S: P * 2^z >= M * S, top_p = M * 2^-z;
         * below 2^-32 the first candidate alone */
        uint32_t tb = __float_as_uint(r.top_p);
        int e = (int)((tb >> 23) & 0xffu);
        if (e < 95) {
            L = 1;
            S = sp_f53(pmax_bits);
        } else {
            sp_pred p = {0, 150 - e, 0, (sp_u128)((tb & 0x7fffffu) | 0x800000u) * S};
            sp_pos q = sp_locate(sh, cl, pt, p);
            bad |= !q.ok;
            L = q.cnt;
            S = q.sum;
        }
    }
    (void)L;
    /* the draw: the first position whose running sum exceeds u * S (u = U * 2^-53) */
    sp_pred p = {0, 53, 1, (sp_u128)r.u * S};
    sp_pos q = sp_locate(sh, cl, pt, p);
    if (!q.ok || bad) /* a failed search cannot happen (the sums are exact); the argmax then */
        return -1;
    int32_t id = q.j == 1 ? q.id1 : sp_nth_id(sh, cl, pt, q.key, q.j);
    return id >= 0 ? id : -1;
}

/* Blocks in clusters of P (the launch's cluster size), a cluster a row: block q of a cluster
 * takes the row's 4-id vectors [q * per, (q + 1) * per). */
__global__ void __launch_bounds__(SP_THREADS, 1)
    sample_kernel(const float *__restrict__ logits, int V, const duet_cuda_sample_row_t *__restrict__ rows,
                  int32_t *__restrict__ out, uint32_t *__restrict__ keys_all)
{
    duet_pdl_wait();
    __shared__ sp_smem sh;
    cg::cluster_group cl = cg::this_cluster();
    const unsigned P = cl.num_blocks(), rank = cl.block_rank();
    const int row = (int)(blockIdx.x / P);
    const duet_cuda_sample_row_t r = rows[row];
    const int n4 = (V + 3) >> 2, per = (n4 + (int)P - 1) / (int)P;
    sp_part pt;
    pt.keys = keys_all + (size_t)row * (size_t)((V + 3) & ~3); /* 16-byte rows */
    pt.V = V;
    pt.beg4 = min(n4, (int)rank * per);
    pt.end4 = min(n4, pt.beg4 + per);
    int32_t bi = 0;
    int32_t id = sp_row(sh, cl, r, logits + (size_t)r.row * V, pt, &bi);
    cl.sync(); /* no block leaves while another may still read its shared memory */
    if (rank == 0 && threadIdx.x == 0)
        out[r.out] = id >= 0 ? id : bi;
}

extern "C" duet_status_t duet_cuda_sample(duet_cuda_t *c, const float *logits, int vocab,
                                          const duet_cuda_sample_row_t *rows, int n, int32_t *out)
{
    if (n <= 0)
        return DUET_OK;
    if (vocab <= 0 || vocab > DUET_CUDA_SAMPLE_MAX_VOCAB)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "sample: a vocabulary of %d (1 to %d)", vocab,
                               DUET_CUDA_SAMPLE_MAX_VOCAB);
    for (int k = 0; k < n; k++) {
        if (rows[k].row < 0 || rows[k].out < 0)
            return duet_cuda_failf(c, DUET_ERR_INVALID, "sample: row %d reads row %d, writes %d", k, rows[k].row,
                                   rows[k].out);
        if (rows[k].u >> 53)
            return duet_cuda_failf(c, DUET_ERR_INVALID, "sample: row %d's draw %llu is not below 2^53", k,
                                   (unsigned long long)rows[k].u);
    }
    /* the largest cluster with which every row's is resident at once: a row of 129,280 ids is
     * about 0.12 ms on one block (its instructions), so rows fewer than the SMs spread over them */
    static const unsigned sizes[3] = {8, 4, 2};
    unsigned P = 1;
    for (int k = 0; k < 3 && P == 1; k++) {
        if ((unsigned)vocab < sizes[k] * 8192u) /* below 8,192 ids a block the cluster's barriers cost more */
            continue;
        if (!c->sample_clusters[k]) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(sizes[k] * (unsigned)c->info.sm_count);
            cfg.blockDim = dim3(SP_THREADS);
            cudaLaunchAttribute at = {};
            at.id = cudaLaunchAttributeClusterDimension;
            at.val.clusterDim.x = sizes[k];
            at.val.clusterDim.y = 1;
            at.val.clusterDim.z = 1;
            cfg.attrs = &at;
            cfg.numAttrs = 1;
            int num = 0;
            DUET_CUDA_CHECK(c, cudaOccupancyMaxActiveClusters(&num, sample_kernel, &cfg));
            c->sample_clusters[k] = num > 0 ? num : -1;
        }
        if (c->sample_clusters[k] >= n)
            P = sizes[k];
    }
    void *keys, *args;
    DUET_TRY(duet_cuda_scratch(c, sizeof(uint32_t) * (size_t)((vocab + 3) & ~3) * (size_t)n, &keys));
    DUET_TRY(duet_cuda_args(c, rows, sizeof(*rows) * (size_t)n, &args));
    DUET_CUDA_CHECK(c, duet_cuda_launch_cluster(c, sample_kernel, dim3((unsigned)n * P), dim3(SP_THREADS), 0, P,
                                                logits, vocab, (const duet_cuda_sample_row_t *)args, out,
                                                (uint32_t *)keys));
    return DUET_OK;
}
