/* Lightning-indexer scores on the GPU (contract in index_score.cuh).
 *
 * A block computes 64 keys × 64 heads of q·k as a small fp32 GEMM: 32-column
 * chunks of q and of the keys are staged transposed in shared memory and
 * each thread accumulates a 4 heads × 4 keys tile.  Then relu, × scale ×
 * w[h], and a sum over the heads (across the 16 head-tiles through shared
 * memory).  Bytes: keys once (q, 32 KB a row, is re-read from L2 per tile);
 * FLOPs: 2*heads*dim per key.
 *
 * The staging is double buffered: the next chunk is copied into the other
 * buffer with cp.async while the current one is multiplied (one barrier a
 * chunk, no registers held for it).  A warp stages 4 rows × 8 columns at a
 * time, so that its transposed writes fall in 32 distinct banks (row stride
 * 68 floats: bank 4 d + r) and its reads are whole 32-byte sectors.  Each
 * (head, key) product is still summed over the columns in order, and the
 * heads in the same order, so the scores are the same bits as with one
 * buffer.  Reading an index-K pool directly (duet_cuda_index_score_cache),
 * the keys' values are decoded into registers the same way ahead of their
 * chunk and stored transposed after it. */
#include "exact.cuh"
#include "cache_codec.cuh"
#include "wgmma.cuh"

#define IS_KT 64
#define IS_HT 64
#define IS_DC 32
#define IS_PAD 68
#define IS_THREADS 256
/* values a thread stages a chunk, of q and of the keys each: 64 rows × 32 columns / 256 */
#define IS_SV (IS_HT * IS_DC / IS_THREADS)
/* blocks an SM the registers are held to: five, as the single-buffered kernel had (48
 * registers, no spill, 195 KB of shared memory; sm_90a) */
#ifndef IS_MIN_BLOCKS
#define IS_MIN_BLOCKS 5
#endif
/* the same reading the index-K pool (its key values through registers): four, which it fits in
 * 64 registers without spilling (48 spill a few bytes) */
#ifndef IS_MIN_BLOCKS_CACHE
#define IS_MIN_BLOCKS_CACHE 4
#endif

/* Where a row's keys come from: key kk of row b is key_off[b] + kk of an fp32 array (f32), or
 * (CACHE) that entry of an index-K pool, page unit[e] at base and index idx[e], decoded with
 * index_entry_value's operations (bf16 bits moved up; e4m3 times the entry's fp32 scale, one
 * rounding), read as aligned 2- and 4-byte words: the floats duet_cuda_cache_load writes. */
struct is_keys {
    const float *f32;
    entry_geom g;
    const uint8_t *base;
    const uint32_t *unit, *idx;
};

/* KS: the keys' source, 0 an fp32 array, 1 a bf16 index-K pool, 2 an fp8 one */
template <int KS>
__global__ void __launch_bounds__(IS_THREADS, KS ? IS_MIN_BLOCKS_CACHE : IS_MIN_BLOCKS)
    index_score_kernel(const float *q, const float *w, int n_heads, int dim, is_keys ks, const int32_t *key_off,
                       const int32_t *n_keys, const int32_t *score_off, float scale, float *score)
{
    duet_pdl_wait();
    constexpr bool CACHE = KS != 0;
    static_assert(IS_HT == IS_KT && IS_DC == 32 && IS_THREADS == 256 && IS_SV == 8,
                  "a warp stages 4 rows x 8 columns, 8 warps x 8 rounds cover 64 rows x 32 columns");
    __shared__ __align__(16) float qT[2][IS_DC][IS_PAD];
    __shared__ __align__(16) float kT[2][IS_DC][IS_PAD];
    __shared__ float red[16][IS_KT + 1];
    int b = blockIdx.y, key0 = blockIdx.x * IS_KT;
    int nk = n_keys[b];
    if (key0 >= nk)
        return;
    const float *kb = CACHE ? NULL : ks.f32 + (size_t)key_off[b] * dim;
    const float *qb = q + (size_t)b * n_heads * dim;
    const float *wb = w + (size_t)b * n_heads;
    int t = threadIdx.x, tx = t & 15, ty = t >> 4;
    int lane = t & 31, wp = t >> 5;
    /* round it: rows 4 rg + (lane >> 3), columns 8 dg + (lane & 7) of the chunk, task 8 it + wp */
    auto srow = [&](int it) { return 4 * ((8 * it + wp) >> 2) + (lane >> 3); };
    auto scol = [&](int it) { return 8 * ((8 * it + wp) & 3) + (lane & 7); };
    /* chunk (h0, c0) into buffer buf: cp.async, or 0 past the heads, keys or columns */
    auto issue = [&](int buf, int h0, int c0) {
#pragma unroll
        for (int it = 0; it < IS_SV; it++) {
            int r = srow(it), d = scol(it), cc = c0 + d;
            int h = h0 + r, kk = key0 + r;
            if (h < n_heads && cc < dim)
                cp_async4(&qT[buf][d][r], qb + (size_t)h * dim + cc);
            else
                qT[buf][d][r] = 0.0f;
            if (CACHE)
                continue; /* the keys come through registers (fetch_keys, stash_keys) */
            if (kk < nk && cc < dim)
                cp_async4(&kT[buf][d][r], kb + (size_t)kk * dim + cc);
            else
                kT[buf][d][r] = 0.0f;
        }
        cp_commit();
    };
    /* CACHE: each key's entry (and an fp8 entry's scale) found once, by its own thread, ahead of
     * the chunks: the chunks' loads then wait on no other global load */
    __shared__ const uint8_t *krow[CACHE ? IS_KT : 1];
    __shared__ float kscale[CACHE ? IS_KT : 1];
    if (CACHE && t < IS_KT) {
        const uint8_t *row = NULL;
        float sc = 0.0f;
        if (key0 + t < nk) {
            size_t e = (size_t)key_off[b] + key0 + t;
            const uint8_t *page = ks.base + (size_t)__ldg(ks.unit + e) * ks.g.page_bytes;
            uint32_t ix = __ldg(ks.idx + e);
            row = page + (size_t)ix * ks.g.entry_data_bytes;
            if (KS == 2)
                sc = index_entry_scale_word(ks.g, page, ix);
        }
        krow[CACHE ? t : 0] = row;
        kscale[CACHE ? t : 0] = sc;
    }
    if (CACHE)
        __syncthreads();
    /* CACHE: chunk c0's key values decoded into registers, then stored transposed */
    float pk[CACHE ? IS_SV : 1];
    auto fetch_keys = [&](int c0) {
#pragma unroll
        for (int it = 0; it < IS_SV; it++) {
            int r = srow(it), cc = c0 + scol(it), kk = key0 + r;
            float v = 0.0f;
            if (kk < nk && cc < dim) {
                v = index_entry_value_word<KS == 1 ? 0 : 2>(krow[CACHE ? r : 0], kscale[CACHE ? r : 0], cc);
            }
            pk[CACHE ? it : 0] = v;
        }
    };
    auto stash_keys = [&](int buf) {
#pragma unroll
        for (int it = 0; it < IS_SV; it++)
            kT[buf][scol(it)][srow(it)] = pk[CACHE ? it : 0];
    };
    int ncc = (dim + IS_DC - 1) / IS_DC, nch = ((n_heads + IS_HT - 1) / IS_HT) * ncc;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float acc[4][4];
    issue(0, 0, 0);
    if (CACHE) {
        fetch_keys(0);
        stash_keys(0);
    }
    cp_wait<0>();
    __syncthreads();
    for (int ci = 0; ci < nch; ci++) {
        int buf = ci & 1, h0 = (ci / ncc) * IS_HT, c0 = (ci % ncc) * IS_DC;
        if (c0 == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = 0.0f;
        }
        /* the next chunk into the other buffer (its last readers passed the previous barrier),
         * in flight while this one is multiplied */
        if (ci + 1 < nch) {
            issue(buf ^ 1, ((ci + 1) / ncc) * IS_HT, ((ci + 1) % ncc) * IS_DC);
            if (CACHE)
                fetch_keys(((ci + 1) % ncc) * IS_DC);
        }
#pragma unroll 8
        for (int d = 0; d < IS_DC; d++) {
            float4 qa = *(const float4 *)&qT[buf][d][4 * ty];
            float4 ka = *(const float4 *)&kT[buf][d][4 * tx];
            float qv[4] = {qa.x, qa.y, qa.z, qa.w}, kv[4] = {ka.x, ka.y, ka.z, ka.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(qv[i], kv[j], acc[i][j]);
        }
        if (c0 + IS_DC >= dim) { /* the head tile's last chunk: its heads into the keys' sums */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int h = h0 + 4 * ty + i;
                if (h >= n_heads)
                    continue;
                float wh = wb[h];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float d = acc[i][j] < 0.0f ? 0.0f : acc[i][j];
                    part[j] = __fadd_rn(part[j], __fmul_rn(__fmul_rn(d, scale), wh));
                }
            }
        }
        if (CACHE && ci + 1 < nch)
            stash_keys(buf ^ 1);
        cp_wait<0>();
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        red[ty][4 * tx + j] = part[j];
    __syncthreads();
    if (t < IS_KT && key0 + t < nk) {
        float s = 0.0f;
        for (int y = 0; y < 16; y++)
            s += red[y][t];
        score[(size_t)(score_off ? score_off[b] : key_off[b]) + key0 + t] = s;
    }
}

/* ---- the tensor-core form (the index-K pools) ----
 *
 * index_score_tc_kernel: block (key tiles [x T, x T + T), row b), four warps (one warpgroup);
 * warp w owns the heads [16 w, 16 w + 16) and keeps their q in its registers as A fragments
 * (mma.sync m16n8k16's layout, which is also a warp's slice of wgmma's register A) for every
 * k-step: each value split once into three bf16 parts (hi, mid, lo: its 24 bits; bf16 keeps
 * fp32's exponents, so no scaling).  The entry pointers (and fp8 scales) of all the block's keys
 * are found at its start; then per tile of 64 keys, the next tile's bytes in flight (cp.async)
 * meanwhile:
 *   1. the keys staged in shared memory as bf16, piece-major (below): bf16 entries as they are,
 *      e4m3 values widened to bf16 a piece a thread (exact: 3 mantissa bits), the fp8 scale kept
 *      apart;
 *   2. the 64 heads times the 64 keys, fp32 accumulation: on sm_90a one wgmma m64n64k16 a k-step
 *      and part for the whole warpgroup, elsewhere each warp three mma.sync a k-step and 8-key
 *      column, the same k-steps and parts in the same order into each accumulator (the two give
 *      the same bits); then relu(q.k (x the key's scale)) x scale x w[h] summed over the warp's
 *      heads (its two rows, then across the eight lanes of a column by shuffles), and the four
 *      warps' sums in warp order.
 * Against the fp32 form the products are the same to 2^-24 of q and the sums run in another
 * fixed order: the scores agree with the CPU to its rounding (checked at 1e-5), and a row's
 * scores never depend on the other rows or on T (each key's whole sum is one tile's). */
#define IST_KT 64
#define IST_WARPS 4
/* A staged tile: piece-major, [16-byte piece pc: dims 8 pc .. 8 pc + 7][key][8 bf16 values]: each
 * k-step's two pieces are wgmma's K-major B without swizzle (8-key groups 128 bytes apart, the k
 * halves a piece apart), and mma.sync's B words of a warp (key 8 nt + g, word tq) hit 32 banks. */
#define IST_PIECE (IST_KT * 8) /* bf16 values a piece of the tile */
#define IST_MAX_DIM 128
#define IST_MAX_T 16 /* tiles a block at most: their keys' entries found at its start */
/* q's parts: 3 (hi, mid, lo: fp32's 24 bits) or 2 (hi, mid: 16 bits, each product within 2^-17 of
 * q's value; a build setting, for timing variants) */
#ifndef IST_PARTS
#define IST_PARTS 3
#endif
/* blocks an SM the registers are held to (q's 32 IST_PARTS words of fragments a lane) */
#ifndef IST_MIN_BLOCKS
#define IST_MIN_BLOCKS 3
#endif
#ifndef IS_TC
#define IS_TC 1
#endif
/* tiles in flight a block: the one multiplied and IST_STAGES - 1 landing (bf16 pools: staged
 * buffers; fp8: raw buffers, widened into one staged buffer) */
#ifndef IST_STAGES
#define IST_STAGES 2
#endif
/* the kernel's dynamic shared memory: the staged buffers, then (fp8) the raw ones */
template <int KS> __host__ __device__ constexpr size_t ist_smem_bytes()
{
    return (size_t)(KS == 1 ? IST_STAGES : 1) * IST_KT * IST_MAX_DIM * 2 +
           (KS == 2 ? (size_t)IST_STAGES * IST_KT * IST_MAX_DIM : 0);
}

/* Eight e4m3 values (two words, low byte first) as eight bf16 values (four words), exact. */
__device__ __forceinline__ void ist_e4m3x4_to_bf16(uint32_t u, uint32_t &w0, uint32_t &w1)
{
    __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
    __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
    float2 fa = __half22float2(*reinterpret_cast<__half2 *>(&a));
    float2 fb = __half22float2(*reinterpret_cast<__half2 *>(&b));
    w0 = __byte_perm(__float_as_uint(fa.x), __float_as_uint(fa.y), 0x7632);
    w1 = __byte_perm(__float_as_uint(fb.x), __float_as_uint(fb.y), 0x7632);
}

/* A warp's share of a tile's scores from its accumulators (its 16 heads x the tile's 64 keys,
 * mma.sync's layout): relu(q.k (x the key's fp8 scale ksc[key])) x scale x w[h], summed over the
 * warp's heads into red_w[key]; a warp past the heads (has false) writes zeros. */
template <int KS>
__device__ __forceinline__ void ist_head_sums(const float (&acc)[IST_KT / 8][4], bool has, const float *ksc,
                                              float scale, float w_lo, float w_hi, int lane, float *red_w)
{
    const int g = lane >> 2, tq = lane & 3;
    if (has) {
        /* the lane's 16 values v[2 nt + j] (its two heads' share of key 8 nt + 2 tq + j: heads
         * h_lo then h_hi), summed over the warp's 8 lane groups g in the tree g, g ^ 1 / g ^ 2 / g ^ 4 */
        float v[IST_KT / 4];
#pragma unroll
        for (int nt = 0; nt < IST_KT / 8; nt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int key = 8 * nt + 2 * tq + j;
                float d0 = acc[nt][j], d1 = acc[nt][2 + j];
                if (KS == 2) {
                    d0 = __fmul_rn(d0, ksc[key]);
                    d1 = __fmul_rn(d1, ksc[key]);
                }
                d0 = d0 < 0.0f ? 0.0f : d0;
                d1 = d1 < 0.0f ? 0.0f : d1;
                v[2 * nt + j] =
                    __fadd_rn(__fmul_rn(__fmul_rn(d0, scale), w_lo), __fmul_rn(__fmul_rn(d1, scale), w_hi));
            }
        /* as a reduce-scatter: at each level a lane keeps the half of its values its bit of g picks
         * and sends the other half to the partner, which keeps that one: 14 shuffles where summing
         * every value on every lane took 48 (16% off the fp8 pool's launch at 32 rows,
         * docs/PERF.md); each sum adds the same two operands as that tree did, so the scores are
         * the same bits.  The lane ends with v[8 b0 + 4 b1 + 2 b2 + k], k = 0, 1 */
        const bool b0 = g & 1, b1 = g & 2, b2 = g & 4;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float keep = b0 ? v[k + 8] : v[k], send = b0 ? v[k] : v[k + 8];
            v[k] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 4));
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float keep = b1 ? v[k + 4] : v[k], send = b1 ? v[k] : v[k + 4];
            v[k] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 8));
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float keep = b2 ? v[k + 2] : v[k], send = b2 ? v[k] : v[k + 2];
            v[k] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 16));
        }
        const int nt = 4 * b0 + 2 * b1 + b2;
        red_w[8 * nt + 2 * tq] = v[0];
        red_w[8 * nt + 2 * tq + 1] = v[1];
    } else {
        red_w[2 * lane] = 0.0f;
        red_w[2 * lane + 1] = 0.0f;
    }
}

/* An fp8 tile's landed e4m3 bytes (raw, [16-value piece][key]) widened into the staged bf16 tile
 * kb0: a piece of the tile a thread t of the warpgroup, adjacent keys on adjacent threads. */
__device__ __forceinline__ void ist_widen(const uint8_t *raw, uint16_t *kb0, int cpk, int t)
{
    for (int c = t; c < IST_KT * cpk; c += IST_WARPS * 32) {
        int kk = c % IST_KT, p = c / IST_KT;
        uint4 v = *reinterpret_cast<const uint4 *>(raw + 16 * c), lo, hi;
        ist_e4m3x4_to_bf16(v.x, lo.x, lo.y);
        ist_e4m3x4_to_bf16(v.y, lo.z, lo.w);
        ist_e4m3x4_to_bf16(v.z, hi.x, hi.y);
        ist_e4m3x4_to_bf16(v.w, hi.z, hi.w);
        *reinterpret_cast<uint4 *>(kb0 + 2 * p * IST_PIECE + 8 * kk) = lo;
        *reinterpret_cast<uint4 *>(kb0 + (2 * p + 1) * IST_PIECE + 8 * kk) = hi;
    }
}

/* A tile's accumulators set to zero, and held in place across the wgmma issue and wait */
__device__ __forceinline__ void ist_acc_zero(float (&acc)[IST_KT / 8][4])
{
#pragma unroll
    for (int nt = 0; nt < IST_KT / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[nt][e] = 0.0f;
}

__device__ __forceinline__ void ist_acc_keep(float (&acc)[IST_KT / 8][4])
{
#pragma unroll
    for (int nt = 0; nt < IST_KT / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            wg_keep(acc[nt][e]);
}

/* The staged pieces past the dims of a warpgroup's NB staged buffers kb, set to zeros once (never
 * written after): thread t of the warpgroup */
template <int NB>
__device__ __forceinline__ void ist_zero_tail(uint16_t (*kb)[IST_KT * IST_MAX_DIM], int dim, int t)
{
    for (int c = (dim / 8) * IST_PIECE + 8 * t; c < IST_KT * IST_MAX_DIM; c += 8 * IST_WARPS * 32)
#pragma unroll
        for (int j = 0; j < NB; j++)
            *reinterpret_cast<uint4 *>(kb[j] + c) = make_uint4(0, 0, 0, 0);
}

/* A tile's 64 keys into shared memory, in flight (cp.async): bf16 entries straight into their
 * staged pieces, fp8 entries' e4m3 bytes into a raw buffer of the same order ([16-value
 * piece][key], widened after they land); keys past the row's count as zeros. */
template <int KS>
__device__ __forceinline__ void ist_issue(const uint8_t *const *krow, int cpk, uint16_t *kb, uint8_t *raw,
                                          int t = threadIdx.x)
{
    auto copy = [&](const uint8_t *row, int kk, int p) {
        void *dst = KS == 1 ? static_cast<void *>(kb + p * IST_PIECE + 8 * kk)
                            : static_cast<void *>(raw + 16 * (p * IST_KT + kk));
        if (row)
            cp_async16(dst, row + 16 * p);
        else
            *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
    };
    if (cpk % 4 == 0) {
        /* a warp takes 8 keys x 4 pieces: each key's 64 contiguous bytes from global memory, and
         * in shared memory a piece's 8 keys side by side (128 bytes: no bank conflict), where a
         * warp taking two keys' 16 pieces wrote 1 KB apart (eight-way conflicts).  Thread t: keys
         * k0 = 8 (t / 32) + t % 8 and k0 + 32, pieces 4 m + (t / 8) % 4: two entry pointers a tile */
        static_assert(IST_KT == 64 && IST_WARPS == 4, "four warps of 8 keys, twice, cover the tile");
        const int k0 = 8 * (t >> 5) + (t & 7), p0 = (t >> 3) & 3;
        const uint8_t *r0 = krow[k0], *r1 = krow[k0 + 32];
        for (int m = 0; m < cpk / 4; m++) {
            copy(r0, k0, 4 * m + p0);
            copy(r1, k0 + 32, 4 * m + p0);
        }
    } else { /* pieces a key not a multiple of 4: a key's pieces on adjacent threads */
        for (int c = t; c < IST_KT * cpk; c += IST_WARPS * 32) {
            int kk = c / cpk;
            copy(krow[kk], kk, c - kk * cpk);
        }
    }
    cp_commit();
}

/* KS: 1 a bf16 index-K pool, 2 an fp8 one */
template <int KS>
__global__ void __launch_bounds__(IST_WARPS * 32, IST_MIN_BLOCKS)
    index_score_tc_kernel(const float *q, const float *w, int n_heads, int dim, is_keys ks, const int32_t *key_off,
                          const int32_t *n_keys, const int32_t *score_off, float scale, int tiles_per_block,
                          float *score)
{
    static_assert(KS == 1 || KS == 2, "index-K pools only");
    /* bf16: IST_STAGES staged buffers (one multiplied, the others landing); fp8: one, and
     * IST_STAGES raw buffers */
    constexpr int S = IST_STAGES, NB = KS == 1 ? S : 1;
    static_assert(S >= 2 && S <= 4, "two to four tiles in flight");
    extern __shared__ __align__(128) unsigned char ist_dyn[];
    auto kb = reinterpret_cast<uint16_t(*)[IST_KT * IST_MAX_DIM]>(ist_dyn);
    auto raw = reinterpret_cast<uint8_t(*)[IST_KT * IST_MAX_DIM]>(ist_dyn + (size_t)NB * IST_KT * IST_MAX_DIM * 2);
    __shared__ const uint8_t *krow[IST_MAX_T * IST_KT];
    __shared__ float kscale[KS == 2 ? IST_MAX_T * IST_KT : 1];
    __shared__ float red[IST_WARPS][IST_KT];
    duet_pdl_wait();
    int b = blockIdx.y, nk = n_keys[b];
    int tile0 = blockIdx.x * tiles_per_block, tile1 = min(tile0 + tiles_per_block, (nk + IST_KT - 1) / IST_KT);
    if (tile0 >= tile1)
        return;
    int t = threadIdx.x, lane = t & 31, warp = t >> 5, g = lane >> 2, tq = lane & 3;
    int nks = dim / 16, h_lo = 16 * warp + g, h_hi = h_lo + 8, ntiles = tile1 - tile0;
    bool has = 16 * warp < n_heads;
    /* every key's entry (and fp8 scale) of the block's tiles, found at once: their loads overlap */
    for (int i = t; i < ntiles * IST_KT; i += IST_WARPS * 32) {
        int key = tile0 * IST_KT + i;
        const uint8_t *row = NULL;
        float sc = 0.0f;
        if (key < nk) {
            size_t e = (size_t)key_off[b] + key;
            const uint8_t *page = ks.base + (size_t)__ldg(ks.unit + e) * ks.g.page_bytes;
            uint32_t ix = __ldg(ks.idx + e);
            row = page + (size_t)ix * ks.g.entry_data_bytes;
            if (KS == 2)
                sc = index_entry_scale_word(ks.g, page, ix);
        }
        krow[i] = row;
        if (KS == 2)
            kscale[i] = sc;
    }
    /* q of the lane's heads h_lo, h_hi as its A fragments: a0 (h_lo, dims 2tq, 2tq+1), a1 (h_hi, the
     * same), a2 (h_lo, 2tq+8, +9), a3 (h_hi, the same) of each k-step; 0 past the heads and dims */
    uint32_t qa[IST_MAX_DIM / 16][IST_PARTS][4];
    const float *qb = q + (size_t)b * n_heads * dim;
#pragma unroll
    for (int k = 0; k < IST_MAX_DIM / 16; k++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int h = (r & 1) ? h_hi : h_lo, c = 16 * k + 2 * tq + ((r & 2) ? 8 : 0);
            float2 v = make_float2(0.0f, 0.0f);
            if (k < nks && h < n_heads)
                v = *reinterpret_cast<const float2 *>(qb + (size_t)h * dim + c);
            uint32_t lo;
            duet_d_bf16_split3(v, qa[k][0][r], qa[k][1][r], lo);
            if constexpr (IST_PARTS == 3)
                qa[k][IST_PARTS - 1][r] = lo;
        }
    float w_lo = h_lo < n_heads ? w[(size_t)b * n_heads + h_lo] : 0.0f;
    float w_hi = h_hi < n_heads ? w[(size_t)b * n_heads + h_hi] : 0.0f;
    const int cpk = KS == 1 ? dim / 8 : dim / 16; /* 16-byte pieces of a key's entry */
    ist_zero_tail<NB>(kb, dim, t);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < S - 1; j++) {
        if (j < ntiles)
            ist_issue<KS>(krow + j * IST_KT, cpk, kb[j % NB], KS == 2 ? raw[j] : NULL);
        else
            cp_commit();
    }
    for (int i = 0; i < ntiles; i++) {
        int key0 = (tile0 + i) * IST_KT;
        /* S - 1 tiles on in flight while this one is multiplied; their buffer's readers (the
         * tile before this one) passed the barrier that ended their tile */
        int nx = i + S - 1;
        if (nx < ntiles)
            ist_issue<KS>(krow + nx * IST_KT, cpk, kb[nx % NB], KS == 2 ? raw[nx % S] : NULL);
        else
            cp_commit();
        cp_wait<S - 1>();
        wg_fence_proxy(); /* the landed bytes, read by wgmma's proxy */
        __syncthreads();
        const uint16_t *kt = kb[i % NB];
        if constexpr (KS == 2) {
            ist_widen(raw[i % S], kb[0], cpk, t);
            wg_fence_proxy();
            __syncthreads();
        }
        /* every warp multiplies (wgmma takes the warpgroup; warps past the heads hold zeros) */
        float acc[IST_KT / 8][4];
        ist_acc_zero(acc);
#if TC_HAVE_WGMMA
        /* sm_90a: one wgmma m64n64k16 a k-step and part for the warpgroup's 64 heads and the
         * tile's 64 keys, q from the registers (the same fragments, the same bits as mma.sync) */
        {
            uint32_t kaddr = (uint32_t)__cvta_generic_to_shared(kt);
            ist_acc_keep(acc);
            wg_fence();
            /* every k-step, with no branch between the MMAs: past the dims q's fragments and the
             * staged pieces are zeros, whose products add nothing */
#pragma unroll
            for (int k = 0; k < IST_MAX_DIM / 16; k++)
#pragma unroll
                for (int p = 0; p < IST_PARTS; p++)
                    wg_mma64<true>(acc, qa[k][p], wg_desc(kaddr + 2 * k * IST_PIECE * 2, IST_PIECE * 2, 8 * 16));
            wg_commit();
            wg_wait0();
            ist_acc_keep(acc);
        }
#else
        {
            const uint32_t *kw = reinterpret_cast<const uint32_t *>(kt) + 4 * g + tq;
#pragma unroll
            for (int k = 0; k < IST_MAX_DIM / 16; k++) {
                if (k >= nks)
                    break;
                /* the k-step's B fragments of all eight 8-key tiles first: key 8 nt + g, dims
                 * 16 k + 2 tq (+1) (piece 2 k) and 16 k + 2 tq + 8 (+9) (piece 2 k + 1) */
                uint32_t b0[IST_KT / 8], b1[IST_KT / 8];
#pragma unroll
                for (int nt = 0; nt < IST_KT / 8; nt++) {
                    b0[nt] = kw[2 * k * (IST_PIECE / 2) + 32 * nt];
                    b1[nt] = kw[(2 * k + 1) * (IST_PIECE / 2) + 32 * nt];
                }
                /* then part by part across the tiles: each accumulator takes its k-steps and
                 * parts in wgmma's order */
#pragma unroll
                for (int p = 0; p < IST_PARTS; p++)
#pragma unroll
                    for (int nt = 0; nt < IST_KT / 8; nt++)
                        duet_d_mma_bf16(acc[nt], qa[k][p], b0[nt], b1[nt]);
            }
        }
#endif
        ist_head_sums<KS>(acc, has, KS == 2 ? kscale + i * IST_KT : NULL, scale, w_lo, w_hi, lane, red[warp]);
        __syncthreads();
        if (t < IST_KT && key0 + t < nk) {
            float s = __fadd_rn(__fadd_rn(red[0][t], red[1][t]), __fadd_rn(red[2][t], red[3][t]));
            score[(size_t)(score_off ? score_off[b] : key_off[b]) + key0 + t] = s;
        }
    }
    cp_wait<0>();
}

/* ---- the shared-q form (a build setting, IST_WG > 1; sm_90a) ----
 *
 * index_score_wg_kernel: block (key tiles of one row, row b), IST_WG warpgroups, each with its own
 * tiles (the block's tiles dealt round the warpgroups), staged buffers and named barrier, as the
 * one-warpgroup kernel's block is.  What they share is the row's q: its hi part stays in each
 * lane's registers as A fragments, its mid and lo parts are written once into shared memory
 * ([part][piece][head][8 values], K-major like the staged keys) and read by wgmma through a
 * descriptor.  A lane then holds 32 words of q where it held 96, so the registers no longer hold
 * an SM to three warpgroups; shared memory does (a warpgroup's buffers and the 32 KB of q).  Each
 * accumulator takes the same k-steps and parts in the same order as in the one-warpgroup kernel:
 * the same bits. */
#ifndef IST_WG
#define IST_WG 1
#endif
/* tiles a warpgroup at most: their keys' entries found at its start (enough for one wave of blocks
 * at 32 rows of 8,193 keys: 129 tiles a row in 4 blocks of 4 x 9 or of 5 x 7) */
#ifndef ISW_MAX_T
#define ISW_MAX_T 16
#endif
#define ISW_QVALS (IST_MAX_DIM / 8 * IST_PIECE) /* bf16 values of a part of q in shared memory */

template <int KS> __host__ __device__ constexpr size_t isw_smem_bytes()
{
    return (size_t)2 * ISW_QVALS * 2 + (size_t)IST_WG * ist_smem_bytes<KS>();
}

__device__ __forceinline__ void isw_bar(int id) { asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory"); }

template <int KS>
__global__ void __launch_bounds__(IST_WG * 128, 1)
    index_score_wg_kernel(const float *q, const float *w, int n_heads, int dim, is_keys ks, const int32_t *key_off,
                          const int32_t *n_keys, const int32_t *score_off, float scale, int tiles_per_wg,
                          float *score)
{
#if TC_HAVE_WGMMA
    static_assert(KS == 1 || KS == 2, "index-K pools only");
    constexpr int S = IST_STAGES, NB = KS == 1 ? S : 1, W = IST_WG;
    static_assert(W >= 1 && W <= 8, "one to eight warpgroups");
    extern __shared__ __align__(128) unsigned char ist_dyn[];
    uint16_t *qs = reinterpret_cast<uint16_t *>(ist_dyn);
    __shared__ const uint8_t *krow[W][ISW_MAX_T * IST_KT];
    __shared__ float kscale[KS == 2 ? W : 1][KS == 2 ? ISW_MAX_T * IST_KT : 1];
    __shared__ float red[W][IST_WARPS][IST_KT];
    duet_pdl_wait();
    int b = blockIdx.y, nk = n_keys[b];
    int tile0 = blockIdx.x * W * tiles_per_wg, tile1 = min(tile0 + W * tiles_per_wg, (nk + IST_KT - 1) / IST_KT);
    if (tile0 >= tile1)
        return;
    const int wg = threadIdx.x >> 7, t = threadIdx.x & 127, lane = t & 31, warp = t >> 5, g = lane >> 2, tq = lane & 3;
    unsigned char *mine = ist_dyn + (size_t)2 * ISW_QVALS * 2 + (size_t)wg * ist_smem_bytes<KS>();
    auto kb = reinterpret_cast<uint16_t(*)[IST_KT * IST_MAX_DIM]>(mine);
    auto raw = reinterpret_cast<uint8_t(*)[IST_KT * IST_MAX_DIM]>(mine + (size_t)NB * IST_KT * IST_MAX_DIM * 2);
    const int h_lo = 16 * warp + g, h_hi = h_lo + 8, left = tile1 - tile0 - wg;
    const int ntiles = left > 0 ? (left + W - 1) / W : 0; /* tiles tile0 + wg + W j */
    const bool has = 16 * warp < n_heads;
    for (int i = t; i < ntiles * IST_KT; i += 128) {
        /* as the one-warpgroup kernel finds its keys' entries (its tiles dealt round the warpgroups) */
        int j = i / IST_KT, key = (tile0 + wg + W * j) * IST_KT + (i - j * IST_KT);
        const uint8_t *row = NULL;
        float sc = 0.0f;
        if (key < nk) {
            size_t e = (size_t)key_off[b] + key;
            const uint8_t *page = ks.base + (size_t)__ldg(ks.unit + e) * ks.g.page_bytes;
            uint32_t ix = __ldg(ks.idx + e);
            row = page + (size_t)ix * ks.g.entry_data_bytes;
            if (KS == 2)
                sc = index_entry_scale_word(ks.g, page, ix);
        }
        krow[wg][i] = row;
        if (KS == 2)
            kscale[KS == 2 ? wg : 0][i] = sc;
    }
    /* q's hi part as the lane's A fragments (as in the one-warpgroup kernel); warpgroup 0 writes the
     * mid and lo words of the same fragments into shared memory, which every head and dim covers */
    uint32_t qa[IST_MAX_DIM / 16][4];
    const float *qb = q + (size_t)b * n_heads * dim;
#pragma unroll
    for (int k = 0; k < IST_MAX_DIM / 16; k++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int h = (r & 1) ? h_hi : h_lo, c = 16 * k + 2 * tq + ((r & 2) ? 8 : 0);
            float2 v = make_float2(0.0f, 0.0f);
            if (k < dim / 16 && h < n_heads)
                v = *reinterpret_cast<const float2 *>(qb + (size_t)h * dim + c);
            uint32_t mid, lo;
            duet_d_bf16_split3(v, qa[k][r], mid, lo);
            if (wg == 0) {
                int off = (c >> 3) * IST_PIECE + 8 * h + (c & 7);
                *reinterpret_cast<uint32_t *>(qs + off) = mid;
                *reinterpret_cast<uint32_t *>(qs + ISW_QVALS + off) = lo;
            }
        }
    float w_lo = h_lo < n_heads ? w[(size_t)b * n_heads + h_lo] : 0.0f;
    float w_hi = h_hi < n_heads ? w[(size_t)b * n_heads + h_hi] : 0.0f;
    const int cpk = KS == 1 ? dim / 8 : dim / 16;
    ist_zero_tail<NB>(kb, dim, t);
    wg_fence_proxy();
    __syncthreads();
    const int bar = 1 + wg;
    const uint32_t qaddr = (uint32_t)__cvta_generic_to_shared(qs);
#pragma unroll
    for (int j = 0; j < S - 1; j++) {
        if (j < ntiles)
            ist_issue<KS>(krow[wg] + j * IST_KT, cpk, kb[j % NB], KS == 2 ? raw[j] : NULL, t);
        else
            cp_commit();
    }
    for (int i = 0; i < ntiles; i++) {
        int key0 = (tile0 + wg + W * i) * IST_KT;
        int nx = i + S - 1;
        if (nx < ntiles)
            ist_issue<KS>(krow[wg] + nx * IST_KT, cpk, kb[nx % NB], KS == 2 ? raw[nx % S] : NULL, t);
        else
            cp_commit();
        cp_wait<S - 1>();
        wg_fence_proxy();
        isw_bar(bar);
        const uint16_t *kt = kb[i % NB];
        if constexpr (KS == 2) {
            ist_widen(raw[i % S], kb[0], cpk, t);
            wg_fence_proxy();
            isw_bar(bar);
        }
        float acc[IST_KT / 8][4];
        ist_acc_zero(acc);
        {
            uint32_t kaddr = (uint32_t)__cvta_generic_to_shared(kt);
            ist_acc_keep(acc);
            wg_fence();
#pragma unroll
            for (int k = 0; k < IST_MAX_DIM / 16; k++) {
                uint64_t bd = wg_desc(kaddr + 2 * k * IST_PIECE * 2, IST_PIECE * 2, 8 * 16);
                wg_mma64<true>(acc, qa[k], bd);
                wg_mma64_ss(acc, wg_desc(qaddr + 2 * k * IST_PIECE * 2, IST_PIECE * 2, 8 * 16), bd);
                wg_mma64_ss(acc, wg_desc(qaddr + (ISW_QVALS + 2 * k * IST_PIECE) * 2, IST_PIECE * 2, 8 * 16), bd);
            }
            wg_commit();
            wg_wait0();
            ist_acc_keep(acc);
        }
        ist_head_sums<KS>(acc, has, KS == 2 ? kscale[KS == 2 ? wg : 0] + i * IST_KT : NULL, scale, w_lo, w_hi, lane,
                          red[wg][warp]);
        isw_bar(bar);
        if (t < IST_KT && key0 + t < nk) {
            float s = __fadd_rn(__fadd_rn(red[wg][0][t], red[wg][1][t]), __fadd_rn(red[wg][2][t], red[wg][3][t]));
            score[(size_t)(score_off ? score_off[b] : key_off[b]) + key0 + t] = s;
        }
    }
    cp_wait<0>();
#endif
}

/* Tiles a block of the tensor-core kernel, from a model of the launch: an SM holding `occ` blocks
 * (asked of CUDA once) and given `per` of them takes about max(per, occ) / occ times a block's
 * time, a block about its tiles and half a tile for its start (q split, the keys' entries found).
 * The fewest such units, the most tiles a block on a tie, the tiles then spread evenly over a
 * row's blocks.  (At 32 rows of 8,193 keys the earlier rule, four blocks an SM in all, made 544
 * blocks of 8 tiles for 396 places: a second wave, a launch of 16 tiles' time where 12 blocks a
 * row of 11 tiles take 11.) */
template <typename K>
static duet_status_t ist_tiles_model(duet_cuda_t *c, K kernel, int threads, size_t smem, int *occ_c, int wgs,
                                     int max_t, int tiles, int n_rows, int *T)
{
    if (!*occ_c) {
        int nb = 0;
        /* the staged buffers may pass the default 48 KB of dynamic shared memory: raised once, with
         * the occupancy question (which needs the same size) */
        DUET_CUDA_CHECK(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        DUET_CUDA_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, threads, smem));
        *occ_c = nb > 0 ? nb : 1;
    }
    long occ = *occ_c, sms = c->info.sm_count > 0 ? c->info.sm_count : 1;
    long best = -1;
    int best_t = 1;
    /* t: tiles a warpgroup; a block's wgs warpgroups take wgs t of a row's tiles */
    for (int t = 1; t <= max_t && (long)(t - 1) * wgs < tiles; t++) {
        long nb = (tiles + (long)wgs * t - 1) / ((long)wgs * t); /* a row's blocks */
        long te = (tiles + nb * wgs - 1) / (nb * wgs);            /* their warpgroups' tiles */
        long per = (nb * n_rows + sms - 1) / sms;
        long cost = (per > occ ? per : occ) * (2 * te + 1); /* in units of occ / 2 tiles */
        if (best < 0 || cost < best || (cost == best && te > best_t)) {
            best = cost;
            best_t = (int)te;
        }
    }
    *T = best_t;
    return DUET_OK;
}

template <int KS> static duet_status_t ist_tiles_per_block(duet_cuda_t *c, int tiles, int n_rows, int *T)
{
    return ist_tiles_model(c, index_score_tc_kernel<KS>, IST_WARPS * 32, ist_smem_bytes<KS>(), &c->ist_blocks[KS - 1], 1,
                           IST_MAX_T, tiles, n_rows, T);
}

/* The shared-q form: the same model with a block of IST_WG warpgroups as the unit an SM holds */
template <int KS> static duet_status_t isw_tiles_per_wg(duet_cuda_t *c, int tiles, int n_rows, int *T)
{
    return ist_tiles_model(c, index_score_wg_kernel<KS>, IST_WG * 128, isw_smem_bytes<KS>(), &c->isw_blocks[KS - 1],
                           IST_WG, ISW_MAX_T, tiles, n_rows, T);
}

template <int KS>
static duet_status_t is_launch(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads, int dim,
                               const is_keys &ks, const int32_t *key_off, const int32_t *n_keys,
                               const int32_t *score_off, int max_keys, float scale, float *score)
{
    if (n_rows <= 0 || max_keys <= 0 || n_heads <= 0 || dim <= 0)
        return DUET_OK;
    if (n_rows > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "index_score: %d rows (at most 65535)", n_rows);
    dim3 grid(duet_cdiv(max_keys, IS_KT), n_rows);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, index_score_kernel<KS>, grid, dim3(IS_THREADS), 0, q, w, n_heads, dim, ks,
                                        key_off, n_keys, score_off, scale, score));
    return DUET_OK;
}

template <int KS>
static duet_status_t isw_launch(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads, int dim,
                                const is_keys &ks, const int32_t *key_off, const int32_t *n_keys,
                                const int32_t *score_off, int max_keys, float scale, float *score)
{
    int T = 1, tiles = duet_cdiv(max_keys, IST_KT);
    DUET_TRY(isw_tiles_per_wg<KS>(c, tiles, n_rows, &T));
    dim3 grid((unsigned)duet_cdiv(tiles, (size_t)IST_WG * T), (unsigned)n_rows);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, index_score_wg_kernel<KS>, grid, dim3(IST_WG * 128), isw_smem_bytes<KS>(),
                                        q, w, n_heads, dim, ks, key_off, n_keys, score_off, scale, T, score));
    return DUET_OK;
}

/* The tensor-core form's launch: KS 1 a bf16 index-K pool, 2 an fp8 one */
template <int KS>
static duet_status_t ist_launch(duet_cuda_t *c, const float *q, const float *w, int n_rows, int n_heads, int dim,
                                const is_keys &ks, const int32_t *key_off, const int32_t *n_keys,
                                const int32_t *score_off, int max_keys, float scale, float *score)
{
    int T = 1, tiles = duet_cdiv(max_keys, IST_KT);
    DUET_TRY(ist_tiles_per_block<KS>(c, tiles, n_rows, &T));
    dim3 grid((unsigned)duet_cdiv(tiles, T), (unsigned)n_rows);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, index_score_tc_kernel<KS>, grid, dim3(IST_WARPS * 32), ist_smem_bytes<KS>(),
                                        q, w, n_heads, dim, ks, key_off, n_keys, score_off, scale, T, score));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_index_score(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                               int n_heads, int dim, const float *keys, const int32_t *key_off,
                                               const int32_t *n_keys, int max_keys, float scale, float *score)
{
    return duet_cuda_index_score_rows(c, q, w, n_rows, n_heads, dim, keys, key_off, n_keys, NULL, max_keys, scale,
                                      score);
}

extern "C" duet_status_t duet_cuda_index_score_rows(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                                    int n_heads, int dim, const float *keys, const int32_t *key_off,
                                                    const int32_t *n_keys, const int32_t *score_off, int max_keys,
                                                    float scale, float *score)
{
    if (c->exact)
        return duet_cuda_exact_index_score(c, q, w, n_rows, n_heads, dim, keys, NULL, NULL, NULL, NULL, key_off,
                                           n_keys, score_off, max_keys, scale, score);
    is_keys ks = {};
    ks.f32 = keys;
    return is_launch<0>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
}

extern "C" duet_status_t duet_cuda_index_score_cache(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                                     int n_heads, int dim, const duet_cache_layout_t *l,
                                                     const uint8_t *base, const uint32_t *unit, const uint32_t *idx,
                                                     const int32_t *key_off, const int32_t *n_keys,
                                                     const int32_t *score_off, int max_keys, float scale,
                                                     float *score)
{
    is_keys ks = {};
    if (c->exact && l->kind == DUET_POOL_C4_INDEX_K && (int)l->vec_dim == dim)
        return duet_cuda_exact_index_score(c, q, w, n_rows, n_heads, dim, NULL, l, base, unit, idx, key_off, n_keys,
                                           score_off, max_keys, scale, score);
    if (entry_geom_of(l, &ks.g) || l->kind != DUET_POOL_C4_INDEX_K || (int)l->vec_dim != dim ||
        (ks.g.mode == 0 && (ks.g.page_bytes % 2 || ks.g.entry_data_bytes % 2)) ||
        (ks.g.mode == 2 && (ks.g.page_bytes % 4 || ks.g.scale_offset % 4 || ks.g.entry_scale_bytes != 4)) ||
        (uintptr_t)base % 4)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "index_score_cache: pool %s of %u values an entry, keys of %d (needs the index-K pool "
                               "of that width, its values and scales aligned)",
                               duet_pool_kind_name(l->kind), l->vec_dim, dim);
    ks.base = base;
    ks.unit = unit;
    ks.idx = idx;
    if (IS_TC && n_heads <= IST_WARPS * 16 && dim % 16 == 0 && dim <= IST_MAX_DIM && ks.g.page_bytes % 16 == 0 &&
        ks.g.entry_data_bytes % 16 == 0 && (uintptr_t)base % 16 == 0 && n_rows > 0 && max_keys > 0) {
        if (n_rows > 65535)
            return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "index_score: %d rows (at most 65535)", n_rows);
        if (IST_WG > 1 && c->info.cc_major == 9 && c->info.cc_minor == 0) {
            if (ks.g.mode == 0)
                return isw_launch<1>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale,
                                     score);
            return isw_launch<2>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
        }
        if (ks.g.mode == 0)
            return ist_launch<1>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
        return ist_launch<2>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
    }
    if (ks.g.mode == 0)
        return is_launch<1>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
    return is_launch<2>(c, q, w, n_rows, n_heads, dim, ks, key_off, n_keys, score_off, max_keys, scale, score);
}
