/* matmul on the GPU (contract in matmul.cuh).
 *
 * Decode kernel (n <= 32): a block owns 4 consecutive output rows and its
 * warps split the columns; each lane streams 16-byte chunks of the 4 rows
 * (8 bf16, 16 e4m3, 32 e2m1 or 4 f32 values), decodes them in registers,
 * multiplies by the block/group scale, and accumulates against up to 8 token
 * rows of x (read through L1, shared by the 4 rows); lanes then warps are
 * summed in a fixed order.  Blocks along y take further groups of 8 tokens.  Bytes:
 * the weights once from memory; FLOPs: 2*n*rows*cols on the fp32 units.
 *
 * Prefill (n > 32): cuBLASLt, bf16 operands, fp32 accumulation and output;
 * fp8/fp4 weights are expanded to bf16 in scratch first (one extra pass of
 * 3 bytes per weight, small against the GEMM at large n).
 *
 * fp8 activations (duet_cuda_matmul_fp8_act): quantize x per 1×128, then
 * cuBLASLt's block-scaled e4m3 GEMM. */
#include <type_traits>
#include <cuda.h>
#include <cudaTypedefs.h>

#include "exact.cuh"
#include "common.cuh"
#include "wgmma.cuh"
#include "mbarrier.cuh"

enum { WT_BF16 = 0, WT_F8, WT_F4, WT_F32 };
enum { LT_BF16 = 1, LT_F32, LT_FP8_BLK, LT_FP8_BLK_D16 };

#define GEMV_ROWS_PER_WARP 4
#define GEMV_MAX_SPLIT 8
#define GEMV_TOKENS 8

struct gemv_args {
    const uint8_t *w; /* row 0 of the weight */
    const void *scale;
    int scale_f32;
    int scale_cols;
    size_t row_bytes;
    int row_begin, row_end, cols;
    const float *x;
    int n;
    float *y;
    int tiled; /* fp4 in the tiled layout (duet_cuda_weight_tile): the tensor-core kernels only */
    const uint4 *xrec;       /* the tensor-core kernels: x split ahead (tc_presplit), or NULL */
    const float *xrec_scale; /* its scales (fp8, fp4) */
    /* the loading-warp kernel on a block-diagonal product (duet_cuda_matmul_blockdiag): rows
     * row_begin + [g xg_rows, (g + 1) xg_rows) read the split x's units from g xg_units on; 0: none */
    int xg_rows, xg_units;
    int chunk_units; /* the running total's chunks (tc_chunk_units: every gemv_args is made by gemv_args_of) */
};

template <int WT> struct wt_traits;
template <> struct wt_traits<WT_BF16> { static constexpr int V = 8; };
template <> struct wt_traits<WT_F8> { static constexpr int V = 16; };
template <> struct wt_traits<WT_F4> { static constexpr int V = 32; };
template <> struct wt_traits<WT_F32> { static constexpr int V = 4; };

/* 16 bytes that are read once: keep them out of L1 (x lives there). */
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float scale_load(const void *s, int f32, size_t i)
{
    if (f32)
        return __ldg((const float *)s + i);
    return duet_d_e8m0_to_f32(__ldg((const uint8_t *)s + i));
}

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Values [p*P, p*P+P) of a 16-byte chunk, times s. */
template <int WT, int P>
__device__ __forceinline__ void decode_piece(const uint4 &v, int p, float s, float *out)
{
    if constexpr (WT == WT_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t u = u4_word(v, i);
            out[2 * i] = __uint_as_float(u << 16);
            out[2 * i + 1] = __uint_as_float(u & 0xffff0000u);
        }
    } else if constexpr (WT == WT_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            out[i] = __uint_as_float(u4_word(v, i));
    } else if constexpr (WT == WT_F8) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t u = u4_word(v, 2 * p + i);
            __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
            __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
            float2 a = __half22float2(*reinterpret_cast<__half2 *>(&lo));
            float2 b = __half22float2(*reinterpret_cast<__half2 *>(&hi));
            out[4 * i + 0] = a.x * s;
            out[4 * i + 1] = a.y * s;
            out[4 * i + 2] = b.x * s;
            out[4 * i + 3] = b.y * s;
        }
    } else { /* WT_F4: word p holds 8 values, low nibble first */
        uint32_t u = u4_word(v, p);
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[j] = duet_d_e2m1_to_f32(u >> (4 * j)) * s;
    }
}

/* Token rows of one launch.  tok_plain: token t is row t of x and of y, t < n.
 * tok_group: the tokens are expert e's assignments, sorted positions [base, base + m):
 * token t reads x row xrow[base + t] (the position itself when xrow is NULL) and
 * writes y row base + t.  Out-of-range tokens read the last valid row and write nothing,
 * so every token's arithmetic is the same whatever shares its tile. */
struct tok_plain {
    const float *x;
    int n, cols;
    __device__ __forceinline__ const float *xrow(int t) const { return x + (size_t)min(t, n - 1) * cols; }
    __device__ __forceinline__ bool ok(int t) const { return t < n; }
    __device__ __forceinline__ size_t yrow(int t) const { return (size_t)t; }
};

struct tok_group {
    const float *x;
    const int32_t *xr;
    int base, m, cols;
    __device__ __forceinline__ const float *xrow(int t) const
    {
        int p = base + min(t, m - 1);
        return x + (size_t)(xr ? __ldg(xr + p) : p) * cols;
    }
    __device__ __forceinline__ bool ok(int t) const { return t < m; }
    __device__ __forceinline__ size_t yrow(int t) const { return (size_t)(base + t); }
};

template <int WT, int NT, class TM>
__device__ __forceinline__ void gemv_body(const gemv_args &a, const TM &tm, int r0, int t0)
{
    constexpr int R = GEMV_ROWS_PER_WARP, V = wt_traits<WT>::V, P = V < 8 ? V : 8;
    __shared__ float red[GEMV_MAX_SPLIT][R * NT];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ksplit = blockDim.x >> 5;

    const uint8_t *wr[R];
    int rr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rr[r] = min(r0 + r, a.row_end - 1);
        wr[r] = a.w + (size_t)rr[r] * a.row_bytes;
    }
    duet_pdl_wait(); /* x is the kernel ahead's */
    const float *xt[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        xt[t] = tm.xrow(t0 + t);

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;

    int nchunks = (int)(a.row_bytes / 16);
#pragma unroll 2
    for (int ch = warp * 32 + lane; ch < nchunks; ch += ksplit * 32) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            wv[r] = ld_stream(wr[r] + (size_t)ch * 16);
        int col0 = ch * V;
        float s[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if constexpr (WT == WT_F8)
                s[r] = scale_load(a.scale, a.scale_f32, (size_t)(rr[r] / 128) * a.scale_cols + col0 / 128);
            else if constexpr (WT == WT_F4)
                s[r] = scale_load(a.scale, a.scale_f32, (size_t)rr[r] * a.scale_cols + col0 / 32);
            else
                s[r] = 1.0f;
        }
#pragma unroll
        for (int p = 0; p < V / P; p++) {
            float wf[R][P];
#pragma unroll
            for (int r = 0; r < R; r++)
                decode_piece<WT, P>(wv[r], p, s[r], wf[r]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float xv[P];
                const float4 *xp = (const float4 *)(xt[t] + col0 + p * P);
#pragma unroll
                for (int q = 0; q < P / 4; q++) {
                    float4 f = __ldg(xp + q);
                    xv[4 * q] = f.x;
                    xv[4 * q + 1] = f.y;
                    xv[4 * q + 2] = f.z;
                    xv[4 * q + 3] = f.w;
                }
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int i = 0; i < P; i++)
                        acc[r][t] = fmaf(wf[r][i], xv[i], acc[r][t]);
            }
        }
    }
    /* lanes, then the block's warps (in warp order) */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = duet_warp_sum(acc[r][t]);
            if (lane == 0)
                red[warp][r * NT + t] = v;
        }
    __syncthreads();
    int m = a.row_end - a.row_begin;
    if (threadIdx.x < R * NT) {
        int r = threadIdx.x / NT, t = threadIdx.x % NT;
        float v = 0.0f;
        for (int w = 0; w < ksplit; w++)
            v += red[w][threadIdx.x];
        if (r0 + r < a.row_end && tm.ok(t0 + t))
            a.y[tm.yrow(t0 + t) * m + (r0 + r - a.row_begin)] = v;
    }
}

template <int WT, int NT>
__global__ void __launch_bounds__(GEMV_MAX_SPLIT * 32) gemv_kernel(gemv_args a)
{
    tok_plain tm{a.x, a.n, a.cols};
    gemv_body<WT, NT>(a, tm, a.row_begin + blockIdx.x * GEMV_ROWS_PER_WARP, blockIdx.y * GEMV_TOKENS);
}

/* ---- decode kernel on the tensor cores ----
 *
 * mma.sync m16n8k16 with fp32 accumulation, the weight values exact in the
 * MMA's input type and x split into parts of it:
 *  - bf16 weights: bf16 MMAs, x = hi + mid + lo (residual below 2^-24 |x|), so
 *    the products carry fp32 accuracy;
 *  - fp8 and fp4 weights: fp16 MMAs (e4m3 exact in fp16; e2m1 as its value
 *    times 2^-14, built from the code's bits with shifts), x times a power of
 *    two per token and unit (its largest |x| into [2^14, 2^15)) as two fp16
 *    parts: 22 bits of x, two MMAs a k-step instead of three.
 *
 * A block is TC_WARPS warps; each warp owns 32 weight rows (two m16 tiles) and
 * every warp walks the same columns, 128 (a "unit") at a time, for up to 32
 * tokens (n8 tiles).  Per unit:
 *  - weights stream into shared memory with cp.async, STAGES - 1 units ahead.
 *    bf16/fp8: each lane copies the 16-byte chunks it will itself read back
 *    (rows g and g+8 of both m16 tiles; chunk 4j+tq of the row's unit slice, so
 *    one instruction of the warp covers whole 64-byte row pieces), and a lane's
 *    column quads pair its A and B fragments: k-slots {2tq, 2tq+1} and
 *    {2tq+8, 2tq+9} of k-step ks are the four columns of quad ks of its chunks.
 *    fp4: the warp's 32 rows are copied whole; a lane reads its 4-byte word of
 *    each row and 32-column scale group (columns 8tq..8tq+7 of the group) and
 *    turns it into the fragments of the group's two k-steps (columns 0,4|2,6
 *    and 1,5|3,7 of the word);
 *  - x is read ahead into registers (one unit; two with one token tile), and the
 *    block splits it once into the B fragments all its warps use (shared
 *    memory, double buffered: one barrier a unit).
 * Summation order, fixed by the weight's shape alone: a unit's products in
 * (k-step, part) order into a fresh partial (fp4: a 32-column scale group's
 * into a fresh partial, times the group's scale into the unit's partial, in
 * group order); the unit's partial times the token's x scale (fp8: and the
 * 128x128 block's scale; bf16: 1) into the chunk partial (TC_CHUNK_UNITS
 * units from column 0); chunks added in order to 0.  A launch may give each chunk its own block (split-K, when the
 * rows and tokens alone leave SMs idle); the last block of a tile to finish adds
 * the chunk partials in the same order, so the result is the same bit for bit
 * whichever way the launch is cut, and a token's result never depends on the
 * other tokens of its tile. */
#define TC_WARPS 4
#define TC_ROWS 32 /* rows a warp */
#define TC_BLOCK_ROWS (TC_WARPS * TC_ROWS)
#define TC_MAX_NT 4
/* Units a block of a split launch walks, and the grouping of every launch's running total (so
 * the bits depend on it).  1, 2 and 8 measured slower in decode steps at first; since the side
 * stream and wgmma, 8 measured 2% faster than 4 at batch 32 and 128 and 2 slower (docs/PERF.md,
 * "A side stream, and fp4 tiles in lane order"), and passed the full checks.  A build setting,
 * for timing variants. */
#ifndef TC_CHUNK_UNITS
#define TC_CHUNK_UNITS 8
#endif
#define TC_SPLIT_MAX_BYTES ((size_t)64 << 20)
/* A weight's chunks: its own (duet_weight_t.chunk_units) where set, else TC_CHUNK_UNITS.  A weight
 * of other chunks takes the decode kernel only (gemv_tc_*, dense and multi launches): the
 * loading-warp, wide and grouped launches total by TC_CHUNK_UNITS. */
static inline int tc_chunk_units(const duet_weight_t *w)
{
    return w->chunk_units > 0 ? w->chunk_units : TC_CHUNK_UNITS;
}
static inline bool tc_own_chunks(const duet_weight_t *w) { return tc_chunk_units(w) != TC_CHUNK_UNITS; }
/* grouped launches of fewer blocks than this many an SM are split along the columns; a build
 * setting for timing variants (a batch-32 step of the slice fixture routes to about 135
 * experts: 4,320 working blocks of 32 units (w1 and w3) or 16 (w2), 8.2 rounds of 132 SMs'
 * four blocks, the last a fifth full) */
#ifndef TC_GROUP_SPLIT_WAVES
#define TC_GROUP_SPLIT_WAVES 4
#endif
/* Launches of at most TC_NT2_MAX_ROW_BLOCKS row blocks (2,048 rows) and TC_NT2_MAX_N tokens take
 * at most two groups of 8 tokens a tile instead of four (tc_max_nt): 136 registers instead of
 * 228 for fp8, three blocks an SM instead of two, twice the blocks.  Measured on the H200
 * (docs/PERF.md): a decode step at batch 32 2% shorter (fp8 1024x4096 at 32 tokens 19.3 ->
 * 15.4 us); at 32 row blocks (4096 rows) the launches were slower, and at a 4096-token prefill
 * the batch-invariant column 4% slower, hence the two limits.  Build settings, for timing
 * variants (0: off). */
#ifndef TC_NT2_MAX_ROW_BLOCKS
#define TC_NT2_MAX_ROW_BLOCKS 16
#endif
#ifndef TC_NT2_MAX_N
#define TC_NT2_MAX_N 256
#endif
/* Launches of at most TC_NT1_MAX_ROW_BLOCKS row blocks (512 rows: the MoE gate) and TC_NT2_MAX_N
 * tokens take one-group tiles (0: off; a decode step at batch 32 about 1% shorter). */
#ifndef TC_NT1_MAX_ROW_BLOCKS
#define TC_NT1_MAX_ROW_BLOCKS 4
#endif
/* ... and launches of at most TC_NT1_FEW_ROW_BLOCKS row blocks (1,024 rows: a C128 compressor's pair
 * in one multi launch) and TC_NT1_FEW_MAX_N tokens too.  Measured on the H100 with
 * one-group tiles up to 12 row blocks at any n up to 256: fp8 1024x4096 at 32 tokens 16.96 -> 15.68
 * us, fp8 1000x1024 at 20 and 45 tokens 8% and 13% faster, bf16 1024x4224 at 13 tokens 11% faster,
 * in the slice's step (Nsight, cold L2) the bf16 multi launch of 8 row blocks 22.2 -> 19.8 us; but
 * the fp8 one of 12 (wq_a and wkv) 16.3 -> 18.5 us, its four token tiles reading the weights from
 * DRAM a third more, hence 8; at 130 and 200 tokens bf16 1024-row launches 36-45% slower and fp8
 * 1024x4096 at 256 tokens 26% slower, hence the token limit (docs/PERF.md).  0: off. */
#ifndef TC_NT1_FEW_ROW_BLOCKS
#define TC_NT1_FEW_ROW_BLOCKS 8
#endif
#ifndef TC_NT1_FEW_MAX_N
#define TC_NT1_FEW_MAX_N 48
#endif

/* CPR: 16-byte chunks of a row's unit slice a lane holds (bf16 256 B, fp8 128 B a row; fp4
 * stages whole rows instead, below); QPC: column quads a chunk holds (CPR * QPC = 8 k-steps);
 * STAGES: units in shared memory.  Measured on the H200 (with the bf16 split and again with
 * the fp16 one): two stages (one computed, one in flight) beat deeper pipelines and fetches
 * of several units a row, which cost blocks an SM; with one token tile, four or five stages
 * (a decode step's whole chunk in flight at once) measured no faster.  TC_BF16_STAGES,
 * TC_F8_STAGES and TC_F4_STAGES set them at build time, for timing variants (at four token
 * tiles, where a decode step's dense fp8 launches are latency-bound at two blocks an SM, three
 * stages fit those two blocks without spilling: 236 registers, sm_90a); x split ahead comes in
 * as many slots as there are weight stages (tc_xslots).  Three and four fp4 stages with x split
 * in the block (before the records took more than two) measured slower at batch 32 and 128
 * (docs/PERF.md); TC_F4_STAGES1 sets the one-token-tile launches' alone (127 registers, no
 * spill at three and four; four stages hold them to three blocks an SM). */
template <int WT> struct tc_traits;
#ifndef TC_BF16_STAGES
#define TC_BF16_STAGES 2
#endif
#ifndef TC_F8_STAGES
#define TC_F8_STAGES 2
#endif
template <> struct tc_traits<WT_BF16> { static constexpr int CPR = 4, QPC = 2, STAGES = TC_BF16_STAGES; };
template <> struct tc_traits<WT_F8> { static constexpr int CPR = 2, QPC = 4, STAGES = TC_F8_STAGES; };
#ifndef TC_F4_STAGES
#define TC_F4_STAGES 2
#endif
template <> struct tc_traits<WT_F4> { static constexpr int CPR = 1, QPC = 8, STAGES = TC_F4_STAGES; };
/* The one-token-tile fp4 launches (decode steps' experts) on their own, for timing variants:
 * their weight stages are the only bytes a warp has in flight */
#ifndef TC_F4_STAGES1
#define TC_F4_STAGES1 TC_F4_STAGES
#endif
/* the units a launch of WT weights in NT token tiles holds in shared memory */
template <int WT, int NT> __host__ __device__ constexpr int tc_stages()
{
    return WT == WT_F4 && NT == 1 ? TC_F4_STAGES1 : tc_traits<WT>::STAGES;
}
/* x slots: the split x (or its records) of the unit being computed and the next ones, at least
 * two (one written while the other is read), one a weight stage where records come with the
 * weights */
template <int WT, int NT> __host__ __device__ constexpr int tc_xslots()
{
    return tc_stages<WT, NT>() > 2 ? tc_stages<WT, NT>() : 2;
}

/* fp4 stages a warp's 32 rows whole: 64 bytes a row and unit, rows 16 bytes apart beyond that
 * (a warp's 4-byte reads, eight rows by four words, hit distinct banks), then the rows' scale
 * words ([row][unit]); tiled, the tile's 2 KB as they are in memory (the first 2 KB of the
 * rows' room), the scale words in the same place. */
#define TC_F4_ROW_STRIDE 80
/* The fp4 tiled layout (duet_cuda_weight_tile): a tile is a warp's TC_ROWS rows of one unit and,
 * apart, their scale words (4 bytes a row); tile (rt, u) at (rt * units + u) times its size.  The
 * 2 KB of codes in the order the MMAs take them: 16 bytes [fold group f][lane], lane (g, tq)'s
 * words of rows g, g + 8, g + 16, g + 24, each columns 32 f + 8 tq .. + 7 (f4_tile_word's bit
 * order), so that a lane reads a fold group's four words at once and the warp's 512 bytes are
 * consecutive. */
#define TC_F4_TILE_BYTES (TC_ROWS * 64)
#define TC_F4_TILE_SCALE_BYTES (TC_ROWS * 4)
/* The bf16 tiled layout: a tile is a warp's TC_ROWS rows of one unit (8 KB), as 16-byte records
 * [k-step][row half mt][lane], each the A operand of that lane's MMA for rows 16 mt + (g, g+8)
 * over the k-step's columns (tc_xcol: the untiled kernel's own, so the same bits): the words
 * (row g: c, c+1), (row g+8: c, c+1), (row g: c+2, c+3), (row g+8: c+2, c+3); tile (rt, u) at
 * (rt * units + u) times its size, the same bytes as rows 32 rt .. 32 rt + 31 untiled. */
#define TC_BF16_TILE_BYTES (TC_ROWS * 256)
template <int WT> __host__ __device__ constexpr int tc_wwarp_bytes()
{
    return WT == WT_F4 ? 32 * TC_F4_ROW_STRIDE + 32 * 4 : 4 * tc_traits<WT>::CPR * 32 * 16;
}
template <int WT> __host__ __device__ constexpr int tc_wstage_bytes() { return TC_WARPS * tc_wwarp_bytes<WT>(); }
/* fp8 and fp4 weights are exact in fp16 (fp4 as its value times 2^-14: the e2m1 bits moved
 * into an fp16's exponent and mantissa, its 0.5 an fp16 subnormal), so they multiply x in two
 * fp16 parts (x times a power of two per token and unit, keeping its largest value under
 * 2^15: 22 of its 24 bits), two MMAs a k-step where bf16 weights take three bf16 parts.  A
 * fold group is the columns a split item holds and, for fp4, the 32-column scale group whose
 * partial is scaled at once (two k-steps, eight columns a lane); fp8 64 columns (four k-steps,
 * sixteen columns a lane). */
template <int WT> struct h16_traits {
    static constexpr int FG = WT == WT_F4 ? 4 : 2; /* fold groups a unit */
    static constexpr int GC = 128 / (4 * FG);       /* columns a lane holds in one */
    static constexpr int KPG = 8 / FG;              /* k-steps in one */
};
template <int WT> __host__ __device__ constexpr int tc_parts() { return WT == WT_BF16 ? 3 : 2; }
/* The split of x into fp16 parts: item q is (token tile nt, token tok, fold group f, quad tq),
 * tq fastest, token-major: a token's items are 4 FG consecutive lanes, whose largest |x| (the
 * unit's, for one x scale a token and unit) comes from lanes q^1 .. q^(2 FG).  A warp's items
 * are few tokens' (fp8 four, fp4 two); with one token tile (and for fp8) the warps past a
 * tile's last token have none and skip the split (decode steps' experts hold one or two
 * tokens). */
template <int WT, int NT> __host__ __device__ constexpr bool h16_skip() { return WT == WT_F8 || NT == 1; }
/* A fragment record's lanes are stored permuted (lane ^ h16_swizzle(k-step)): a quarter warp's
 * items (one token's two fold groups) write two records at once, which would otherwise share
 * banks. */
template <int WT> __host__ __device__ constexpr int h16_swizzle(int ks) { return ks / h16_traits<WT>::KPG * 4; }
template <int WT> __device__ __forceinline__ void h16_item(int q, int &tq, int &f, int &tok, int &nt)
{
    constexpr int FG = h16_traits<WT>::FG;
    tq = q & 3;
    f = (q >> 2) % FG;
    tok = (q >> 2) / FG % 8;
    nt = (q >> 2) / FG / 8;
}
/* one stage of split x: [token tile][k-step][part][lane] fragments (fp16: [token tile][k-step]
 * [lane] records of both parts, 16 bytes), then (fp16) the x scales [token tile][token] */
template <int WT, int NT> __host__ __device__ constexpr int tc_split_bytes()
{
    return NT * 8 * tc_parts<WT>() * 32 * 8 + (WT == WT_BF16 ? 0 : NT * 8 * 4);
}
/* fp4: a warp's 32 rows' scales of the unit being computed, as floats ([row][fold group]):
 * each lane converts its row's four e8m0 bytes once instead of every lane of the row's quad
 * converting all sixteen of its rows' */
template <int WT> __host__ __device__ constexpr int tc_wscale_bytes() { return WT == WT_F4 ? TC_WARPS * 32 * 16 : 0; }
/* fp4 with more than one token tile keeps its running total in shared memory ([accumulator]
 * [thread]), added to once a chunk: the unit's partial that the fold groups add into leaves no
 * registers for it otherwise (spills, 26% slower at 300 tokens). */
template <int WT, int NT> __host__ __device__ constexpr bool tc_tot_smem() { return WT == WT_F4 && NT > 1; }
template <int WT, int NT> __host__ __device__ constexpr int tc_tot_bytes()
{
    return tc_tot_smem<WT, NT>() ? TC_WARPS * 32 * 2 * NT * 4 * 4 : 0;
}
template <int WT, int NT> __host__ __device__ constexpr int tc_smem_bytes()
{
    return tc_stages<WT, NT>() * tc_wstage_bytes<WT>() + tc_xslots<WT, NT>() * tc_split_bytes<WT, NT>() +
           tc_wscale_bytes<WT>() + tc_tot_bytes<WT, NT>();
}

/* A fragment register r (a0..a3) of row tile mt from a warp's operand words wa[r4][half] (rows
 * g, g + 8 of each m16 tile: r4 = 2 mt + row half; half: k-slots 2 tq.. or 2 tq + 8..): the one
 * order mma.sync and wgmma take it in */
__device__ __forceinline__ uint32_t tc_afrag(const uint32_t (&wa)[4][2], int mt, int r)
{
    return wa[2 * mt + (r & 1)][r >> 1];
}

__device__ __forceinline__ void mma_bf16(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* wgmma (sm_90a): the launches of four token tiles with bf16 or fp8 weights take their MMAs as
 * wgmma m64n32k16 instead of mma.sync m16n8k16: one instruction a k-step, part and warp row
 * tile (a warp's 16 rows of the warpgroup's 64, its A operand from its registers) for all 32
 * tokens, where mma.sync takes four; B (the split x) straight from shared memory.  On the H200
 * the two give the same bits on the same operands and accumulator (every result of 2.7e8
 * random cases, fp16 in, f32 accumulated), and mma.sync m16n8k16 reaches 647 TFLOP/s against
 * wgmma m64n32k16's 970 (fp16, A from registers; wgmma m64n8k16 only 298): so the tiles of
 * fewer tokens keep mma.sync and every token's result keeps its bits whichever tile it is in.
 * TC_WGMMA=0 keeps mma.sync everywhere (a build setting, for timing variants). */
#ifndef TC_WGMMA
#define TC_WGMMA 1
#endif
template <int WT, int NT, bool PRE> __device__ constexpr bool tc_wg()
{
    return TC_WGMMA && TC_HAVE_WGMMA && NT == 4 && !PRE && (WT == WT_F8 || WT == WT_BF16);
}
/* The split x as wgmma's B in shared memory (K-major, no swizzle): for each k-step and part a 1 KB
 * tile [kc][token n][16 bytes], k-slots 8 kc .. 8 kc + 7 of token n, so that the 32-bit word of
 * lane (n % 8, tq) of n tile n / 8 that mma.sync reads as b0 (k-slots 2 tq, 2 tq + 1) is at kc 0,
 * byte 16 n + 4 tq, and b1 (k-slots 2 tq + 8, + 9) the same at kc 1: the tensor core multiplies
 * the same x values in the same k-slots.  The tiles take the bytes the mma.sync records took. */
#define WG_B_ROW 16             /* bytes: a token's 8 k-slots */
#define WG_B_KC (32 * WG_B_ROW) /* a kc half of a tile: 32 tokens */
__device__ __forceinline__ uint32_t *wg_b_word(void *xs, int parts, int ks, int s, int kc, int n, int tq)
{
    return reinterpret_cast<uint32_t *>(reinterpret_cast<char *>(xs) + ((ks * parts + s) * 2 + kc) * WG_B_KC +
                                        n * WG_B_ROW + 4 * tq);
}
/* the descriptor of tile (ks, s): its start address, leading (k) byte offset a kc half, stride (n)
 * byte offset 8 tokens, in 16-byte units */
__device__ __forceinline__ uint64_t wg_b_desc(const void *xs, int parts, int ks, int s)
{
    uint32_t addr =
        (uint32_t)__cvta_generic_to_shared(reinterpret_cast<const char *>(xs) + (ks * parts + s) * 2 * WG_B_KC);
    return wg_desc(addr, WG_B_KC, 8 * WG_B_ROW);
}
/* d (a warp's m16 row tile by 32 tokens: [n tile][4], mma.sync's accumulator layout) += A B */
template <int WT> __device__ __forceinline__ void wg_mma(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc)
{
#if TC_HAVE_WGMMA
#define WG_D                                                                                                           \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),           \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3])
#define WG_MMA(T)                                                                                                      \
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,"      \
                 "%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;"                                               \
                 : WG_D                                                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))
    if constexpr (WT == WT_BF16)
        WG_MMA("bf16");
    else
        WG_MMA("f16");
#undef WG_MMA
#undef WG_D
#endif
}

/* A word of eight e2m1 codes c0..c7 (c0 in bits 0-3) as fp16 pairs of their values times 2^-14:
 * each code's fp16 high byte (magnitude to bits 1-3, sign to 7; the low byte is 0), the even
 * codes' bytes in one word (half 0: pairs (c0,c4), (c2,c6)) and the odd ones' in another
 * (half 1: (c1,c5), (c3,c7)), each pair then kept in bytes 1 and 3 or moved up from 0 and 2. */
/* TILED: the word as duet_cuda_weight_tile stores it (f4_tile_word): the even codes already
 * in place, (c0, c4) a byte below (c2, c6); the odd ones' magnitudes in bits 4-6 and signs in
 * bit 0 of each byte.  The same fp16 pairs in 9 operations instead of 11. */
template <bool TILED> __device__ __forceinline__ void f4_word_h16(uint32_t u, int half, uint32_t &lo, uint32_t &hi)
{
    if (TILED && !half) {
        lo = (u << 8) & 0x8e008e00u;
        hi = u & 0x8e008e00u;
        return;
    }
    uint32_t b = TILED  ? ((u >> 3) & 0x0e0e0e0eu) | ((u << 7) & 0x80808080u)
                 : half ? ((u >> 3) & 0x0e0e0e0eu) | (u & 0x80808080u)
                        : ((u << 1) & 0x0e0e0e0eu) | ((u << 4) & 0x80808080u);
    lo = __byte_perm(b, 0, 0x2404);
    hi = b & 0xff00ff00u;
}

/* A checkpoint word of eight e2m1 codes (c0 in bits 0-3, sign in bit 3) in the tiled layout's
 * bit order: byte k holds c(2k) as its fp16 high byte has it (magnitude in bits 1-3, sign in 7)
 * and c(2k+1)'s magnitude in bits 4-6, its sign in bit 0. */
__device__ __forceinline__ uint32_t f4_tile_word(uint32_t u)
{
    return ((u << 1) & 0x0e0e0e0eu) | ((u << 4) & 0x80808080u) | (u & 0x70707070u) | ((u >> 7) & 0x01010101u);
}

/* Two e4m3 values (low byte first) as an fp16 pair, exact. */
__device__ __forceinline__ uint32_t f8_pair_h16(uint32_t u16)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)u16, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

__device__ __forceinline__ uint32_t pack_h16(__half lo, __half hi)
{
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

/* bf16 weights: quad q (columns 4q..4q+3) of a 16-byte chunk as two bf16 pairs, w[0] =
 * columns 0,1, w[1] = columns 2,3; the lane's x columns of k-step ks match (tc_xcol, then
 * tc_xcol + 2). */
__device__ __forceinline__ void tc_quad(const uint4 &v, int q, uint32_t *w)
{
    w[0] = u4_word(v, 2 * q);
    w[1] = u4_word(v, 2 * q + 1);
}
__device__ __forceinline__ int tc_xcol(int tq, int ks)
{
    constexpr int QPC = tc_traits<WT_BF16>::QPC;
    return 4 * ((4 * (ks / QPC) + tq) * QPC + ks % QPC);
}

/* The split of x that the fp8/fp4 MMAs multiply (one item: GC columns of a token's unit, the
 * token's 4 FG items in consecutive lanes, all of the warp's lanes taking part): x times a
 * power of two per token and unit (its largest |x| in [2^14, 2^15), exact; 2^e stays a normal
 * float), as two fp16 parts; rec[k] is k-step k of the item's fold group, both parts (fp4
 * columns (k, k+4 | k+2, k+6), fp8 (4k, 4k+1 | 4k+2, 4k+3)); *scale what the unit's fold
 * multiplies by: 2^e, and for fp4 the 2^14 its fp16 weights lack.  The kernels' own split and
 * tc_presplit_kernel both come here, so their records are the same bits. */
template <int WT>
__device__ __forceinline__ void h16_split(const float4 *v4, uint4 (&rec)[h16_traits<WT>::KPG], float *scale)
{
    constexpr int FG = h16_traits<WT>::FG, GC = h16_traits<WT>::GC, KPG = h16_traits<WT>::KPG;
    float v[GC];
#pragma unroll
    for (int c = 0; c < GC / 4; c++) {
        v[4 * c] = v4[c].x;
        v[4 * c + 1] = v4[c].y;
        v[4 * c + 2] = v4[c].z;
        v[4 * c + 3] = v4[c].w;
    }
    float mx = 0.0f;
#pragma unroll
    for (int j = 0; j < GC; j++)
        mx = fmaxf(mx, fabsf(v[j]));
#pragma unroll
    for (int sh = 1; sh < 4 * FG; sh <<= 1) /* the token's items: its whole unit */
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
    int e = max((int)((__float_as_uint(mx) >> 23) & 0xffu) - 141, -126);
    float inv = __uint_as_float((uint32_t)(127 - e) << 23);
    __half h[GC], l[GC];
#pragma unroll
    for (int j = 0; j < GC; j++) {
        float t = v[j] * inv;
        h[j] = __float2half_rn(t);
        l[j] = __float2half_rn(t - __half2float(h[j]));
    }
#pragma unroll
    for (int k = 0; k < KPG; k++) {
        int c0 = WT == WT_F4 ? k : 4 * k, c1 = WT == WT_F4 ? k + 4 : 4 * k + 1;
        int c2 = WT == WT_F4 ? k + 2 : 4 * k + 2, c3 = WT == WT_F4 ? k + 6 : 4 * k + 3;
        rec[k] = make_uint4(pack_h16(h[c0], h[c1]), pack_h16(h[c2], h[c3]), pack_h16(l[c0], l[c1]),
                            pack_h16(l[c2], l[c3]));
    }
    *scale = __uint_as_float((uint32_t)(127 + e + (WT == WT_F4 ? 14 : 0)) << 23);
}

/* The split for bf16 weights: four columns (tc_xcol's quad) as three bf16 parts, hi + mid + lo,
 * p[part] = columns (0, 1 | 2, 3). */
__device__ __forceinline__ void bf16_split(const float4 &x, uint2 (&p)[3])
{
    uint32_t q[3][2];
    duet_d_bf16_split3(make_float2(x.x, x.y), q[0][0], q[1][0], q[2][0]);
    duet_d_bf16_split3(make_float2(x.z, x.w), q[0][1], q[1][1], q[2][1]);
#pragma unroll
    for (int s = 0; s < 3; s++)
        p[s] = make_uint2(q[s][0], q[s][1]);
}

/* x split ahead (fp8/fp4 weights), a record of 16 bytes per (k-step, lane quad position) of a
 * row's unit, [k-step][tq], both fp16 parts. */
#define TC_REC_PER_UNIT 32

/* f(mt, nt, e) for each accumulator value of a warp's 2 x NT m16n8 tiles (e: the four values
 * of a lane's fragment: row half e >> 1, token e & 1). */
template <int NT, class F> __device__ __forceinline__ void tc_each(F &&f)
{
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                f(mt, nt, e);
}

/* dst += src * s, then src = 0: s per row of the m16 tiles' accumulator halves (index
 * 2*mt + (e >> 1)); s = 1 is an exact add. */
template <int NT>
__device__ __forceinline__ void tc_fold(float (&dst)[2][NT][4], float (&src)[2][NT][4], const float (&s)[4])
{
    tc_each<NT>([&](int mt, int nt, int e) {
        dst[mt][nt][e] = fmaf(src[mt][nt][e], s[2 * mt + (e >> 1)], dst[mt][nt][e]);
        src[mt][nt][e] = 0.0f;
    });
}

/* Where a block's partial results go when its launch is split along the columns. */
struct tc_split {
    float *part;  /* [chunk][token][row - row_begin] */
    int *count;   /* a counter per (row block, token tile), 0 between launches */
    int chunks;   /* 1: no split */
};

/* Whether this block is the last of its tile's `sp.chunks` blocks to finish a split launch: every
 * block's partial written (fenced) before it counts itself in; the last one (and only it) returns
 * true, its reads of the others' partials after a second fence.  `flag` is a shared int the
 * block's threads read the answer from.  Every thread of the block calls it. */
__device__ __forceinline__ bool splitk_last(const tc_split &sp, int tile_id, int *flag)
{
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        *flag = atomicAdd(sp.count + tile_id, 1) == sp.chunks - 1;
    __syncthreads();
    if (!*flag)
        return false;
    __threadfence();
    return true;
}

/* The split launch's last block of a tile: one row's K consecutive outputs (those k with ok(k)),
 * m_out floats apart from offset o, the chunks' partials added in chunk order (two chunks' loads
 * in flight at once; four measured no faster: docs/PERF.md) */
template <int K, class OK>
__device__ __forceinline__ void splitk_sum(const tc_split &sp, size_t plane, size_t o, int m_out, float *y, OK ok)
{
    float v[K];
#pragma unroll
    for (int k = 0; k < K; k++)
        v[k] = 0.0f;
#pragma unroll 2
    for (int z = 0; z < sp.chunks; z++) {
        const float *pz = sp.part + z * plane + o;
        float p[K];
#pragma unroll
        for (int k = 0; k < K; k++)
            p[k] = ok(k) ? __ldcg(pz + (size_t)k * m_out) : 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++)
            v[k] += p[k];
    }
#pragma unroll
    for (int k = 0; k < K; k++)
        if (ok(k))
            y[o + (size_t)k * m_out] = v[k];
}

template <int WT, int NT, bool PRE, class TM>
__device__ __forceinline__ void gemv_tc_body(const gemv_args &a, const TM &tm, int rb0, int t0, const tc_split &sp,
                                             int tile_id)
{
    constexpr int CPR = tc_traits<WT>::CPR, QPC = tc_traits<WT>::QPC, S = tc_stages<WT, NT>();
    constexpr unsigned XS = tc_xslots<WT, NT>();
    constexpr int WSTAGE = tc_wstage_bytes<WT>(), XSPLIT = tc_split_bytes<WT, NT>();
    constexpr int NX = 2 * NT; /* bf16: x quads a thread splits per unit */
    constexpr bool WG = tc_wg<WT, NT, PRE>(); /* wgmma: every warp of the block takes part */
    extern __shared__ __align__(16) uint8_t tc_smem[];
    uint8_t *wsm = tc_smem;
    uint2 *xsm = reinterpret_cast<uint2 *>(tc_smem + S * WSTAGE);

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, tq = lane & 3;
    int r0 = rb0 + TC_ROWS * warp;
    bool active = r0 < a.row_end;
    const uint8_t *rp[4]; /* rows g, g+8, g+16, g+24 of the warp: (mt, h) = (r4 >> 1, r4 & 1) */
    int rrow[4];
#pragma unroll
    for (int r4 = 0; r4 < 4; r4++) {
        rrow[r4] = min(r0 + 16 * (r4 >> 1) + g + 8 * (r4 & 1), a.row_end - 1);
        rp[r4] = a.w + (size_t)rrow[r4] * a.row_bytes + 16 * tq;
    }
    /* fp4: lane copies 16-byte pieces (lane & 3) of rows (lane >> 2) + 8j, and row r0 + lane's
     * scales; tiled, the warp's 32 rows are one tile a unit (whole: the rows are a multiple of
     * 32 and r0 is on a tile), 2 KB and 128 bytes of scales on from the last */
    const uint8_t *srow = NULL, *frow[4];
    const uint8_t *btile = NULL; /* bf16 tiled: the lane's first record of the warp's tile for unit 0 */
    if constexpr (WT == WT_BF16)
        if (a.tiled)
            btile = a.w + (size_t)(r0 / TC_ROWS) * (a.cols / 128) * TC_BF16_TILE_BYTES + 16 * lane;
    if constexpr (WT == WT_F4) {
        if (a.tiled) {
            size_t t0 = (size_t)(r0 / TC_ROWS) * (a.cols / 128);
            srow = (const uint8_t *)a.scale + t0 * TC_F4_TILE_SCALE_BYTES + 4 * lane;
#pragma unroll
            for (int j = 0; j < 4; j++) /* piece 32j + lane of the tile: row (lane >> 2) + 8j, 16 (lane & 3) on */
                frow[j] = a.w + t0 * TC_F4_TILE_BYTES + 16 * (32 * j + lane);
        } else {
            srow = (const uint8_t *)a.scale + (size_t)min(r0 + lane, a.row_end - 1) * a.scale_cols;
#pragma unroll
            for (int j = 0; j < 4; j++)
                frow[j] = a.w + (size_t)min(r0 + (lane >> 2) + 8 * j, a.row_end - 1) * a.row_bytes + 16 * (lane & 3);
        }
    }

    int units = a.cols / 128, cu = a.chunk_units; /* the weight's chunks (gemv_args_of: tc_chunk_units) */
    int ub = 0, ue = units;
    if (sp.chunks > 1) {
        ub = blockIdx.z * cu;
        ue = min(ub + cu, units);
    }
    int chunk_end = ub + cu; /* the unit after the current chunk's last */

    /* The loads walk the block's units in order, one a call (ub, ub + 1, ...): each source is a
     * running pointer that a call moves on by a unit, instead of a product by the unit's index
     * (64-bit multiplies and adds a call in the unit loop). */
    const size_t w_step = WT == WT_F4                ? (a.tiled ? TC_F4_TILE_BYTES : 64)
                          : WT == WT_BF16 && a.tiled ? TC_BF16_TILE_BYTES
                                                     : CPR * 64;
    const size_t s_step = a.tiled ? TC_F4_TILE_SCALE_BYTES : 4; /* fp4 scales */
    const uint8_t *w_src, *s_src = NULL;
    ptrdiff_t w_d[4]; /* the other rows' (or pieces') distances from w_src, fixed */
    if constexpr (WT == WT_F4) {
        w_src = frow[0];
        s_src = srow + (size_t)ub * s_step;
#pragma unroll
        for (int k = 0; k < 4; k++)
            w_d[k] = a.tiled ? 512 * k : frow[k] - frow[0];
    } else {
        w_src = WT == WT_BF16 && a.tiled ? btile : rp[0];
#pragma unroll
        for (int k = 0; k < 4; k++)
            w_d[k] = rp[k] - rp[0];
    }
    w_src += (size_t)ub * w_step;
    auto load_w = [&](int slot) {
        if (!active)
            return;
        uint8_t *st = wsm + slot * WSTAGE + warp * tc_wwarp_bytes<WT>();
        if constexpr (WT == WT_F4) {
            if (a.tiled) { /* one run, the pieces 512 bytes apart, as they come */
#pragma unroll
                for (int j = 0; j < 4; j++)
                    cp_async16(st + 16 * (32 * j + lane), w_src + w_d[j]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    cp_async16(st + ((lane >> 2) + 8 * j) * TC_F4_ROW_STRIDE + 16 * (lane & 3), w_src + w_d[j]);
            }
            cp_async4(st + 32 * TC_F4_ROW_STRIDE + lane * 4, s_src);
            s_src += s_step;
        } else if (WT == WT_BF16 && a.tiled) { /* the tile's records in order: one run */
#pragma unroll
            for (int i = 0; i < TC_BF16_TILE_BYTES / 512; i++)
                cp_async16(st + 16 * (32 * i + lane), w_src + 512 * i);
        } else {
#pragma unroll
            for (int r4 = 0; r4 < 4; r4++)
#pragma unroll
                for (int j = 0; j < CPR; j++)
                    cp_async16(st + ((r4 * CPR + j) * 32 + lane) * 16, w_src + w_d[r4] + 64 * j);
        }
        w_src += w_step;
    };
    /* x: the thread's row pointers once (a gathered row's index is read once), each unit's
     * values read XD units ahead (two with one token tile, where a unit's MMAs are few).
     * bf16 weights: NX column quads a thread, split into three bf16 parts.  fp8/fp4: items
     * (token tile, fold group, lane) of GC columns, split into two fp16 parts under the
     * token's scale for the unit (its largest |x| there, from the 4 FG lanes of its items). */
    constexpr bool H16 = WT != WT_BF16;
    constexpr int FG = h16_traits<WT>::FG, GC = h16_traits<WT>::GC, KPG = h16_traits<WT>::KPG;
    static_assert(WT != WT_F8 || (QPC == KPG && CPR == FG), "fp8: a 16-byte chunk is a fold group");
    constexpr int ITEMS = NT * FG * 32, NXI = (ITEMS + TC_WARPS * 32 - 1) / (TC_WARPS * 32);
    constexpr int NXP = H16 ? NXI : NX, NXR = H16 ? NXI * GC / 4 : NX;
    constexpr int XFRAG = NT * 8 * tc_parts<WT>() * 32; /* fragments a stage (uint2) */
    constexpr int XD = NT == 1 ? 2 : 1;
    constexpr bool SKIP = h16_skip<WT, NT>(); /* warps past a tile's last token skip the split */
    const float *xb[NXP];
#pragma unroll
    for (int i = 0; i < NXP; i++) {
        int q = i * (TC_WARPS * 32) + threadIdx.x;
        if constexpr (PRE) {
            xb[i] = NULL;
        } else if constexpr (H16) {
            int tq, f, tok, nt;
            h16_item<WT>(q, tq, f, tok, nt);
            int wtq, wf, wtok, wnt; /* the warp's first item: whole warps are left out */
            h16_item<WT>(q & ~31, wtq, wf, wtok, wnt);
            bool any = q < ITEMS && (!SKIP || tm.ok(t0 + 8 * wnt + wtok));
            xb[i] = any ? tm.xrow(t0 + 8 * nt + tok) + f * (128 / FG) + tq * GC : NULL;
        } else {
            int ln = q & 31, ks = (q >> 5) & 7, nt = q >> 8;
            xb[i] = tm.xrow(t0 + 8 * nt + (ln >> 2)) + tc_xcol(ln & 3, ks);
        }
    }
    float4 xr[XD][NXR];
    auto load_x = [&](float4 (&dst)[NXR], int u) {
#pragma unroll
        for (int i = 0; i < NXP; i++) {
            if constexpr (H16) {
                if (SKIP ? !xb[i] : ITEMS % (TC_WARPS * 32) && i * (TC_WARPS * 32) + threadIdx.x >= ITEMS)
                    continue; /* past the items, or past the tile's last token (whole warps) */
#pragma unroll
                for (int c = 0; c < GC / 4; c++)
                    dst[i * (GC / 4) + c] = __ldg(reinterpret_cast<const float4 *>(xb[i] + u * 128) + c);
            } else {
                const float *xp = xb[i] + u * 128;
                float2 lo = __ldg(reinterpret_cast<const float2 *>(xp));
                float2 hi = __ldg(reinterpret_cast<const float2 *>(xp + 2));
                dst[i] = make_float4(lo.x, lo.y, hi.x, hi.y);
            }
        }
    };
    auto split_x = [&](const float4 (&src)[NXR], uint2 *dst) {
#pragma unroll
        for (int i = 0; i < NXP; i++) {
            int q = i * (TC_WARPS * 32) + threadIdx.x;
            if constexpr (H16) {
                /* warps whose tokens the tile lacks split nothing: those tokens' B columns hold
                 * stale values, which reach only those tokens' outputs, never stored */
                if (SKIP ? !xb[i] : ITEMS % (TC_WARPS * 32) && q >= ITEMS)
                    continue;
                int tq, f, tok, nt;
                h16_item<WT>(q, tq, f, tok, nt);
                int ln = 4 * tok + tq; /* its lane in the B fragments */
                uint4 rec[KPG];
                float scale;
                h16_split<WT>(&src[i * (GC / 4)], rec, &scale);
#pragma unroll
                for (int k = 0; k < KPG; k++) {
                    if constexpr (WG) { /* rec: hi b0, hi b1, lo b0, lo b1 */
                        int ks = f * KPG + k, n = 8 * nt + tok;
                        *wg_b_word(dst, 2, ks, 0, 0, n, tq) = rec[k].x;
                        *wg_b_word(dst, 2, ks, 0, 1, n, tq) = rec[k].y;
                        *wg_b_word(dst, 2, ks, 1, 0, n, tq) = rec[k].z;
                        *wg_b_word(dst, 2, ks, 1, 1, n, tq) = rec[k].w;
                    } else {
                        reinterpret_cast<uint4 *>(
                            dst)[(nt * 8 + f * KPG + k) * 32 + (ln ^ h16_swizzle<WT>(f * KPG + k))] = rec[k];
                    }
                }
                if (tq == 0 && f == 0)
                    reinterpret_cast<float *>(dst + XFRAG)[nt * 8 + tok] = scale;
            } else {
                int ln = q & 31, ks = (q >> 5) & 7, nt = q >> 8;
                uint2 p[3];
                bf16_split(src[i], p);
#pragma unroll
                for (int s = 0; s < 3; s++) {
                    if constexpr (WG) {
                        *wg_b_word(dst, 3, ks, s, 0, 8 * nt + (ln >> 2), ln & 3) = p[s].x;
                        *wg_b_word(dst, 3, ks, s, 1, 8 * nt + (ln >> 2), ln & 3) = p[s].y;
                    } else {
                        dst[((nt * 8 + ks) * 3 + s) * 32 + ln] = p[s];
                    }
                }
            }
        }
    };

    /* PRE: the tile's tokens' records of unit u (tc_presplit_kernel: x split once a row instead
     * of by every row block) copied into x slot `slot` where split_x would have written them;
     * absent tokens' fragments stay stale, as there.  Both token maps give consecutive tokens
     * consecutive record rows (yrow(t0 + k) = yrow(t0) + k).  A warp copies a token's 32 records
     * (512 contiguous bytes) a round, token 4 it + warp, so that its shared-memory offsets are
     * the round's constants on one base. */
    static_assert(!PRE || XS == S, "records come with the weights: an x slot a weight stage");
    static_assert(!PRE || H16, "x is split ahead for fp8 and fp4 weights only");
    constexpr int RU = TC_REC_PER_UNIT, NI = NT * 8 * RU / (TC_WARPS * 32);
    static_assert(NT * 8 * RU % (TC_WARPS * 32) == 0 && TC_WARPS == 4, "whole rounds of records, token 4 it + warp");
    const int units_all = a.cols / 128;
    /* the thread's record of its first round, and the rounds present (bit it) */
    const char *xr_g = NULL;
    size_t xr_step = 0;
    unsigned xr_s = 0, xr_ok = 0;
    if constexpr (PRE) {
        int ks = lane >> 2;
        xr_s = (unsigned)__cvta_generic_to_shared(xsm) +
               16 * (ks * 32 + ((4 * warp + (lane & 3)) ^ h16_swizzle<WT>(ks)));
        xr_g = reinterpret_cast<const char *>(a.xrec + ((size_t)(tm.yrow(t0) + warp) * units_all + ub) * RU + lane);
        xr_step = (size_t)4 * units_all * RU * 16;
#pragma unroll
        for (int it = 0; it < NI; it++)
            xr_ok |= (unsigned)tm.ok(t0 + 4 * it + warp) << it;
    }
    /* the thread's token scale (threads below NT * 8 whose token the tile has), walked as the
     * records are: a unit a call */
    const float *xs_src = NULL;
    if constexpr (PRE)
        if (threadIdx.x < NT * 8 && tm.ok(t0 + threadIdx.x))
            xs_src = a.xrec_scale + ((size_t)tm.yrow(t0) + threadIdx.x) * units_all + ub;
    auto load_xr = [&](int slot) {
        unsigned so = slot * XSPLIT;
#pragma unroll
        for (int it = 0; it < NI; it++)
            if (xr_ok >> it & 1)
                cp_async16_s(xr_s + so + 16 * ((it >> 1) * 256 + 16 * (it & 1)), xr_g + it * xr_step);
        xr_g += RU * 16;
        if (xs_src)
            cp_async4(reinterpret_cast<uint8_t *>(xsm) + so + 8 * XFRAG + 4 * threadIdx.x, xs_src++);
    };

    float pc[2][NT][4], tot[2][NT][4];
    constexpr bool TOT_SMEM = tc_tot_smem<WT, NT>();
    float *tot_s = reinterpret_cast<float *>(tc_smem + S * WSTAGE + XS * XSPLIT + tc_wscale_bytes<WT>()) +
                   threadIdx.x; /* accumulator k at tot_s[k * blockDim] */
    tc_each<NT>([&](int mt, int nt, int e) {
        pc[mt][nt][e] = tot[mt][nt][e] = 0.0f;
        if constexpr (TOT_SMEM)
            tot_s[((mt * NT + nt) * 4 + e) * (TC_WARPS * 32)] = 0.0f;
    });

    /* the first weight stages before the wait for the kernel ahead (a programmatic dependent
     * launch: duet_pdl_wait); sending the block's next units toward L2 there as well measured
     * slower (docs/PERF.md) */
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        if (ub + s < ue)
            load_w(s); /* unit ub + s */
    duet_pdl_wait();
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if constexpr (PRE)
            if (ub + s < ue)
                load_xr(s);
        cp_commit(); /* group 0 holds all the first stages' weights */
    }
    if constexpr (!PRE) {
        load_x(xr[0], ub);
        if (XD == 2 && ub + 1 < ue)
            load_x(xr[XD - 1], ub + 1);
    }
    for (int u = ub; u < ue; u++) {
        int i = u - ub;
        uint2 *xs = xsm + ((unsigned)i % XS) * (XSPLIT / 8);
        if constexpr (!PRE) { /* PRE: the records came with the weights */
            if (XD == 1 || !(i & 1)) {
                split_x(xr[0], xs);
                if (u + XD < ue)
                    load_x(xr[0], u + XD);
            } else {
                split_x(xr[XD - 1], xs);
                if (u + XD < ue)
                    load_x(xr[XD - 1], u + XD);
            }
        }
        if constexpr (WG) /* the split x, written through the generic proxy, read by wgmma's async one */
            wg_fence_proxy();
        cp_wait<S - 2>();
        __syncthreads();
        if (u + S - 1 < ue) {
            load_w((unsigned)(i + S - 1) % S); /* unit u + S - 1 */
            if constexpr (PRE)
                load_xr((unsigned)(i + S - 1) % XS);
        }
        cp_commit();
        if (active || WG) {
            const uint8_t *wwarp = wsm + ((unsigned)i % S) * WSTAGE + warp * tc_wwarp_bytes<WT>();
            float part[2][NT][4];
            tc_each<NT>([&](int mt, int nt, int e) { part[mt][nt][e] = 0.0f; });
            /* the parts in turn across all accumulators: consecutive MMAs are independent */
            auto mmas = [&](int ks, const uint32_t (&wa)[4][2]) {
                if constexpr (H16) {
                    uint4 b[NT];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        b[nt] = reinterpret_cast<const uint4 *>(xs)[(nt * 8 + ks) * 32 + (lane ^ h16_swizzle<WT>(ks))];
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                            for (int mt = 0; mt < 2; mt++)
                                mma_f16(part[mt][nt], tc_afrag(wa, mt, 0), tc_afrag(wa, mt, 1), tc_afrag(wa, mt, 2),
                                        tc_afrag(wa, mt, 3), s ? b[nt].z : b[nt].x, s ? b[nt].w : b[nt].y);
                } else {
#pragma unroll
                    for (int s = 0; s < 3; s++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                            uint2 b = xs[((nt * 8 + ks) * 3 + s) * 32 + lane];
#pragma unroll
                            for (int mt = 0; mt < 2; mt++)
                                mma_bf16(part[mt][nt], tc_afrag(wa, mt, 0), tc_afrag(wa, mt, 1), tc_afrag(wa, mt, 2),
                                         tc_afrag(wa, mt, 3), b.x, b.y);
                        }
                }
            };
            /* wgmma: the unit's A operands gathered first (each k-step's for both row tiles), then
             * its MMAs issued at once, in mma.sync's order for each accumulator ((k-step, part));
             * the A registers held until the unit's wait.  Issued a k-step at a time as decoded,
             * fp8 gained less against mma.sync in its own call (batch 32 2% and batch 128 4% shorter
             * instead of 3% and 5%, docs/PERF.md) and bf16 spilled (580 bytes, sm_90a). */
            uint32_t wga[WG ? 8 : 1][2][4];
            auto take = [&](int ks, const uint32_t(&wa)[4][2]) {
                if constexpr (WG) {
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int r = 0; r < 4; r++)
                            wga[ks][mt][r] = tc_afrag(wa, mt, r);
                } else {
                    mmas(ks, wa);
                }
            };
            auto wg_run = [&]() {
                if constexpr (WG) {
                    constexpr int P = tc_parts<WT>();
                    tc_each<NT>([&](int mt, int nt, int e) { wg_keep(part[mt][nt][e]); });
                    wg_fence();
#pragma unroll
                    for (int ks = 0; ks < 8; ks++)
#pragma unroll
                        for (int s = 0; s < P; s++) {
                            uint64_t desc = wg_b_desc(xs, P, ks, s);
#pragma unroll
                            for (int mt = 0; mt < 2; mt++)
                                wg_mma<WT>(part[mt], wga[ks][mt], desc);
                        }
                    wg_commit();
                    wg_wait0();
                    tc_each<NT>([&](int mt, int nt, int e) { wg_keep(part[mt][nt][e]); });
#pragma unroll
                    for (int ks = 0; ks < 8; ks++)
#pragma unroll
                        for (int mt = 0; mt < 2; mt++)
#pragma unroll
                            for (int r = 0; r < 4; r++)
                                wg_keep(wga[ks][mt][r]);
                }
            };
            /* bf16/fp8: the lane's 16-byte chunk j of its four rows, one k-step a column quad */
            auto chunk_mmas = [&](int j) {
                const uint4 *wst = reinterpret_cast<const uint4 *>(wwarp);
                uint4 wc[4];
#pragma unroll
                for (int r4 = 0; r4 < 4; r4++)
                    wc[r4] = wst[(r4 * CPR + j) * 32 + lane];
#pragma unroll
                for (int q = 0; q < QPC; q++) {
                    uint32_t wa[4][2];
#pragma unroll
                    for (int r4 = 0; r4 < 4; r4++) {
                        if constexpr (WT == WT_F8) {
                            uint32_t w = u4_word(wc[r4], q);
                            wa[r4][0] = f8_pair_h16(w & 0xffffu);
                            wa[r4][1] = f8_pair_h16(w >> 16);
                        } else {
                            tc_quad(wc[r4], q, wa[r4]);
                        }
                    }
                    take(j * QPC + q, wa);
                }
            };
            if constexpr (H16) {
                /* fp4: per fold group its k-steps, then the partial times the row's scale for
                 * the 32-column group into the unit's; fp8: the unit's k-steps.  Then the
                 * unit's partial times the token's x scale (and fp8 the 128x128 block's) */
                const float *xsc = reinterpret_cast<const float *>(xs + XFRAG);
                float ws[4], pu[2][NT][4];
                const float *wsf = NULL;
                if constexpr (WT == WT_F4) {
                    /* row `lane`'s four group scales, kept as [f][g][r4] (row g + 8 r4): a lane's
                     * four rows of a group in one 16-byte read */
                    uint32_t sc = reinterpret_cast<const uint32_t *>(wwarp + 32 * TC_F4_ROW_STRIDE)[lane];
                    float *own = reinterpret_cast<float *>(tc_smem + S * WSTAGE + XS * XSPLIT) + warp * 32 * 4;
                    float4 sv = duet_d_e8m0x4_to_f32(sc);
                    int at = 4 * (lane & 7) + (lane >> 3);
                    __syncwarp(); /* the previous unit's scales are read */
                    own[at] = sv.x;
                    own[32 + at] = sv.y;
                    own[64 + at] = sv.z;
                    own[96 + at] = sv.w;
                    __syncwarp();
                    wsf = own;
                } else {
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
                        ws[2 * mt] = ws[2 * mt + 1] =
                            scale_load(a.scale, a.scale_f32, (size_t)(rrow[2 * mt] / 128) * a.scale_cols + u);
                }
                /* fp4: the fold groups in turn, decoding words as they are laid out */
                auto f4_groups = [&](auto tiled) {
#pragma unroll
                    for (int f = 0; f < FG; f++) {
                        /* the lane's word of each row (g + 8 r4): columns 32f + 8tq .. +7 */
                        uint32_t wv[4];
                        if constexpr (decltype(tiled)::value) {
                            uint4 v = reinterpret_cast<const uint4 *>(wwarp)[32 * f + lane];
                            wv[0] = v.x, wv[1] = v.y, wv[2] = v.z, wv[3] = v.w;
                        } else {
#pragma unroll
                            for (int r4 = 0; r4 < 4; r4++)
                                wv[r4] = *reinterpret_cast<const uint32_t *>(wwarp + (g + 8 * r4) * TC_F4_ROW_STRIDE +
                                                                             16 * f + 4 * tq);
                        }
                        {
                            float4 v = reinterpret_cast<const float4 *>(wsf)[8 * f + g];
                            ws[0] = v.x, ws[1] = v.y, ws[2] = v.z, ws[3] = v.w;
                        }
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) { /* columns (0, 4 | 2, 6), then (1, 5 | 3, 7) */
                            uint32_t wa[4][2];
#pragma unroll
                            for (int r4 = 0; r4 < 4; r4++)
                                f4_word_h16<decltype(tiled)::value>(wv[r4], hf, wa[r4][0], wa[r4][1]);
                            mmas(2 * f + hf, wa);
                        }
                        tc_each<NT>([&](int mt, int nt, int e) {
                            float w = ws[2 * mt + (e >> 1)];
                            pu[mt][nt][e] = f ? fmaf(part[mt][nt][e], w, pu[mt][nt][e]) : part[mt][nt][e] * w;
                            part[mt][nt][e] = 0.0f;
                        });
                    }
                };
                if constexpr (WT == WT_F4) {
                    if (a.tiled)
                        f4_groups(std::true_type());
                    else
                        f4_groups(std::false_type());
                } else {
#pragma unroll
                    for (int f = 0; f < FG; f++) /* the lane's 16-byte chunk f of each row: columns 64f + 16tq .. +15 */
                        chunk_mmas(f);
                    wg_run();
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    float xa = xsc[nt * 8 + 2 * tq], xb1 = xsc[nt * 8 + 2 * tq + 1];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float xv = (e & 1) ? xb1 : xa;
                            if constexpr (WT == WT_F4) {
                                pc[mt][nt][e] = fmaf(pu[mt][nt][e], xv, pc[mt][nt][e]);
                            } else {
                                pc[mt][nt][e] = fmaf(part[mt][nt][e], ws[2 * mt + (e >> 1)] * xv, pc[mt][nt][e]);
                                part[mt][nt][e] = 0.0f;
                            }
                        }
                }
            } else {
                if (a.tiled) { /* each MMA's A operand one record: no moves into place */
                    static_assert(tc_wwarp_bytes<WT_BF16>() == TC_BF16_TILE_BYTES, "a warp's stage is its tile");
                    const uint4 *rec = reinterpret_cast<const uint4 *>(wwarp) + lane;
#pragma unroll
                    for (int ks = 0; ks < CPR * QPC; ks++) {
                        uint4 h0 = rec[(2 * ks) * 32], h1 = rec[(2 * ks + 1) * 32]; /* rows 0-15, 16-31 */
                        const uint32_t wa[4][2] = {{h0.x, h0.z}, {h0.y, h0.w}, {h1.x, h1.z}, {h1.y, h1.w}};
                        take(ks, wa);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < CPR; j++)
                        chunk_mmas(j);
                }
                wg_run();
                const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
                tc_fold<NT>(pc, part, one);
            }
            if (u + 1 == chunk_end || u + 1 == units) {
                chunk_end += cu;
                if constexpr (TOT_SMEM) {
                    tc_each<NT>([&](int mt, int nt, int e) {
                        float &t = tot_s[((mt * NT + nt) * 4 + e) * (TC_WARPS * 32)];
                        t = fmaf(pc[mt][nt][e], 1.0f, t);
                        pc[mt][nt][e] = 0.0f;
                    });
                } else {
                    const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
                    tc_fold<NT>(tot, pc, one);
                }
            }
        }
    }
    cp_wait<0>();
    if constexpr (TOT_SMEM)
        tc_each<NT>([&](int mt, int nt, int e) { tot[mt][nt][e] = tot_s[((mt * NT + nt) * 4 + e) * (TC_WARPS * 32)]; });

    /* y, or when the launch is split along the columns this chunk's partial (the tile's last
     * block then adds the partials in order) */
    int m_out = a.row_end - a.row_begin;
    size_t plane = (size_t)a.n * m_out;
    float *dst = sp.chunks <= 1 ? a.y : sp.part + blockIdx.z * plane;
    if (active)
        tc_each<NT>([&](int mt, int nt, int e) {
            int row = r0 + 16 * mt + g + 8 * (e >> 1);
            int tok = t0 + 8 * nt + 2 * tq + (e & 1);
            if (row < a.row_end && tm.ok(tok))
                dst[tm.yrow(tok) * m_out + (row - a.row_begin)] = tot[mt][nt][e];
        });
    if (sp.chunks <= 1)
        return;
    __shared__ int last;
    if (!splitk_last(sp, tile_id, &last))
        return;
    /* a thread a row (blockDim is TC_BLOCK_ROWS), all the tile's tokens side by side: each
     * chunk's loads for them are in flight together (a token's y row is yrow(t0) + k) */
    int row = rb0 + threadIdx.x;
    if (row < a.row_end) {
        size_t o = tm.yrow(t0) * m_out + (row - a.row_begin);
        splitk_sum<8 * NT>(sp, plane, o, m_out, a.y, [&](int k) { return tm.ok(t0 + k); });
    }
    if (threadIdx.x == 0)
        sp.count[tile_id] = 0;
}

template <int WT, int NT>
__global__ void __launch_bounds__(TC_WARPS * 32) gemv_tc_kernel(gemv_args a, tc_split sp)
{
    tok_plain tm{a.x, a.n, a.cols};
    gemv_tc_body<WT, NT, false>(a, tm, a.row_begin + blockIdx.x * TC_BLOCK_ROWS, blockIdx.y * (8 * NT), sp,
                                blockIdx.y * gridDim.x + blockIdx.x);
}

/* Shapes the tensor-core kernel takes: bf16/fp8/fp4 weights, columns a multiple of 128, rows
 * starting on a 16-row boundary (an fp8 scale block per row tile), 16-byte aligned rows and x;
 * fp4 with ue8m0 scales, 4-byte aligned scale rows. */
static int tc_eligible(const gemv_args &a, int wt)
{
    if (wt == WT_F32 || a.cols % 128 || a.row_begin % 16)
        return 0;
    if (a.tiled && ((wt != WT_F4 && wt != WT_BF16) || a.row_begin % TC_ROWS))
        return 0;
    if (wt == WT_F4 && (a.scale_f32 || a.scale_cols % 4 || (uintptr_t)a.scale % 4))
        return 0; /* fp4: ue8m0 group scales (powers of two), a word of four a row and unit */
    return ((uintptr_t)a.w % 16) == 0 && ((uintptr_t)a.x % 16) == 0 && a.row_bytes % 16 == 0;
}

/* Raise a kernel's dynamic shared memory limit once per context (the attribute is per device). */
template <class K> static duet_status_t tc_smem(duet_cuda_t *c, K kernel, int bytes, unsigned bit)
{
    unsigned long long *set = &c->tc_smem_set[bit >> 6 & 1], b = 1ull << (bit & 63);
    if (*set & b)
        return DUET_OK;
    DUET_CUDA_CHECK(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    *set |= b;
    return DUET_OK;
}

/* A scratch buffer of the context grown to at least `want` bytes (the stream drained first:
 * earlier launches may still use the old one). */
static duet_status_t tc_grow(duet_cuda_t *c, void **buf, size_t *have, size_t want)
{
    if (want <= *have)
        return DUET_OK;
    DUET_TRY(duet_cuda_wait_stream(c));
    DUET_CUDA_CHECK(c, cudaFree(*buf));
    *buf = NULL;
    *have = 0;
    DUET_CUDA_CHECK(c, cudaMalloc(buf, want));
    *have = want;
    return DUET_OK;
}

/* The split-K buffers: partials and zeroed counters, grown on demand. */
static duet_status_t tc_split_buffers(duet_cuda_t *c, size_t part_bytes, int counters, tc_split *sp)
{
    DUET_TRY(tc_grow(c, &c->tc_part, &c->tc_part_bytes, part_bytes));
    if (counters > c->tc_count_n) {
        int want = counters < 1024 ? 1024 : counters;
        DUET_TRY(duet_cuda_wait_stream(c));
        DUET_CUDA_CHECK(c, cudaFree(c->tc_count));
        c->tc_count = NULL;
        c->tc_count_n = 0;
        DUET_CUDA_CHECK(c, cudaMalloc(&c->tc_count, sizeof(int) * (size_t)want));
        DUET_CUDA_CHECK(c, cudaMemsetAsync(c->tc_count, 0, sizeof(int) * (size_t)want, c->stream));
        c->tc_count_n = want;
    }
    sp->part = (float *)c->tc_part;
    sp->count = (int *)c->tc_count;
    return DUET_OK;
}

/* Whether a launch of `blocks` tiles (a counter each) over `cols` columns is split along the
 * columns, a block per chunk of `cu` units (the weight's tc_chunk_units): when it has fewer tiles
 * than `waves` an SM and the partials (`outputs` floats a chunk) fit TC_SPLIT_MAX_BYTES.
 * sp->chunks stays 1 otherwise. */
static duet_status_t tc_split_plan(duet_cuda_t *c, int cols, int cu, long blocks, int waves, size_t outputs,
                                   tc_split *sp)
{
    int chunks = duet_cdiv(cols / 128, cu), sms = c->info.sm_count > 0 ? c->info.sm_count : 1;
    size_t part_bytes = sizeof(float) * (size_t)chunks * outputs;
    *sp = tc_split{NULL, NULL, 1};
    if (chunks > 1 && blocks < (long)waves * sms && part_bytes <= TC_SPLIT_MAX_BYTES) {
        DUET_TRY(tc_split_buffers(c, part_bytes, (int)blocks, sp));
        sp->chunks = chunks;
    }
    return DUET_OK;
}

/* ---- x split ahead ----
 *
 * A launch of several token tiles has every row block split the same x into its MMA parts
 * again: a fifth to a third of the loop's instructions at four tiles (fp8 764 -> 585, fp4
 * grouped 1561 -> 1288 a unit, sm_90a).  The grouped expert launch of four-tile blocks
 * (prefill) from TC_PRESPLIT_MIN_N positions on (duet_cuda_tc_presplit) takes x split once a
 * position ahead into records in the layout the blocks' shared memory holds (16 bytes a lane
 * and k-step; the token's scale a unit), which the blocks copy with cp.async beside the
 * weights.  The arithmetic is the same function (h16_split), so the results are the same bits
 * either way.  Decode steps' grouped launches (one-token tiles) take it too, from
 * TC_PRESPLIT_MIN_N1 positions: there it spares the block's first warp the split that the
 * other three waited for at the unit's barrier.  The dense and multi launches do not take it:
 * with records their decode steps at batch 32 and 128 measured 2-3% slower, and from 256
 * tokens on they slowed a 4096-token prefill by 4%; later, records in wgmma's B layout for the
 * four-group fp8 launches halved the loop's instructions and doubled their time (docs/PERF.md,
 * "What did not speed up the fp8 launches of 32 tokens": each block's records come from L2,
 * where the f32 x of a tile is shared in L1 by the two blocks of an SM). */
#ifndef TC_PRESPLIT_MIN_N
#define TC_PRESPLIT_MIN_N 9
#endif
/* The same for the grouped launch of one-token tiles (decode steps' experts), from this many
 * positions (0: never).  Measured on the H200 at V4-Flash widths: the decode step at batch 32
 * (192 positions) 4% faster, the launch at 48 positions 3% faster, batch 1 (6 positions) no
 * different; at small widths (512 x 256 experts) the extra launch costs more than it saves. */
#ifndef TC_PRESPLIT_MIN_N1
#define TC_PRESPLIT_MIN_N1 32
#endif

/* One thread per item of a row's unit: a fold group's GC columns (the 4 FG items of a unit in
 * consecutive lanes, for h16_split's shuffles).
 * Row r is x's row xrow[r] (or r); records [row][unit][TC_REC_PER_UNIT], scales [row][unit]. */
template <int WT>
__global__ void __launch_bounds__(256)
    tc_presplit_kernel(const float *x, const int32_t *xrow, int rows, int cols, uint4 *rec, float *rs)
{
    duet_pdl_wait();
    int units = cols / 128;
    size_t pairs = (size_t)rows * units, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    static_assert(WT != WT_BF16, "bf16 weights take x split in the block");
    constexpr int FG = h16_traits<WT>::FG, GC = h16_traits<WT>::GC, KPG = h16_traits<WT>::KPG;
    size_t items = pairs * 4 * FG;
    if ((i & ~(size_t)31) >= items) /* whole warps: the rest take part in the shuffles */
        return;
    size_t ru = min(i / (4 * FG), pairs - 1);
    int tq = (int)(i & 3), f = (int)(i >> 2) % FG, row = (int)(ru / units), u = (int)(ru % units);
    const float *xp =
        x + (size_t)(xrow ? __ldg(xrow + row) : row) * cols + u * 128 + f * (128 / FG) + tq * GC;
    float4 v[GC / 4];
#pragma unroll
    for (int c4 = 0; c4 < GC / 4; c4++)
        v[c4] = __ldg(reinterpret_cast<const float4 *>(xp) + c4);
    uint4 r[KPG];
    float scale;
    h16_split<WT>(v, r, &scale);
    if (i < items) {
#pragma unroll
        for (int k = 0; k < KPG; k++)
            rec[ru * TC_REC_PER_UNIT + (f * KPG + k) * 4 + tq] = r[k];
        if (tq == 0 && f == 0)
            rs[ru] = scale;
    }
}

/* Whether a launch of n tokens in tiles of NT token groups of 8 takes x split ahead: fp8 and
 * fp4 weights.  Not bf16: there the MMA's A operand is four words of two rows' 16-byte chunks,
 * moved into place before each MMA, and with the records' copies in the loop the compiler
 * moves them again for every MMA (1041 -> 1314 instructions a unit at four tiles, sm_90a). */
template <int WT> static bool tc_presplit_on(const duet_cuda_t *c, int nt, int n)
{
    int min_n = c->tc_presplit ? c->tc_presplit : nt > 1 ? TC_PRESPLIT_MIN_N : TC_PRESPLIT_MIN_N1;
    return WT != WT_BF16 && min_n > 0 && n >= min_n;
}

/* Split the `rows` rows of a.x (row r: x's row xrow[r], or r) ahead into the context's record
 * buffer and point a at it.  The buffer (516 bytes a row and unit) is grown on demand and kept:
 * a grouped launch's rows are its sorted positions, top_k a token. */
template <int WT> static duet_status_t tc_presplit(duet_cuda_t *c, gemv_args &a, const int32_t *xrow, int rows)
{
    size_t pairs = (size_t)rows * (size_t)(a.cols / 128);
    size_t rec_bytes = duet_round_up(pairs * TC_REC_PER_UNIT * 16, 256);
    size_t sc_bytes = pairs * sizeof(float);
    DUET_TRY(tc_grow(c, &c->tc_xrec, &c->tc_xrec_bytes, rec_bytes + sc_bytes));
    uint4 *rec = (uint4 *)c->tc_xrec;
    float *rs = (float *)((uint8_t *)c->tc_xrec + rec_bytes);
    size_t threads = pairs * 4 * h16_traits<WT>::FG;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, tc_presplit_kernel<WT>, dim3(duet_cdiv(threads, 256)), dim3(256), 0, a.x,
                                        xrow, rows, a.cols, rec, rs));
    a.xrec = rec;
    a.xrec_scale = rs;
    return DUET_OK;
}

extern "C" void duet_cuda_tc_presplit(duet_cuda_t *c, int min_n)
{
    c->tc_presplit = min_n < 0 ? 0 : min_n == 0 ? -1 : min_n;
}

/* tc_smem's bit for a kernel taking x split ahead: the second word */
#define TC_PRE_BIT 64
template <int WT, int NT> static duet_status_t gemv_tc_launch_nt(duet_cuda_t *c, const gemv_args &a)
{
    constexpr int smem = tc_smem_bytes<WT, NT>();
    DUET_TRY(tc_smem(c, gemv_tc_kernel<WT, NT>, smem, WT * 8 + NT));
    int rows = a.row_end - a.row_begin;
    int row_blocks = duet_cdiv(rows, TC_BLOCK_ROWS), tok_tiles = duet_cdiv(a.n, 8 * NT);
    tc_split sp;
    DUET_TRY(tc_split_plan(c, a.cols, a.chunk_units, (long)row_blocks * tok_tiles, 1, (size_t)a.n * rows, &sp));
    dim3 grid(row_blocks, tok_tiles, sp.chunks);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, gemv_tc_kernel<WT, NT>, grid, dim3(TC_WARPS * 32), smem, a, sp));
    return DUET_OK;
}

/* The groups of 8 tokens a tile of a launch of n tokens over row_blocks row blocks holds at most
 * (TC_NT2_MAX_ROW_BLOCKS and TC_NT1_FEW_ROW_BLOCKS above).  A token's result does not depend on
 * its tile, so either way gives the same bits. */
static int tc_max_nt(int row_blocks, int n)
{
    if (n > TC_NT2_MAX_N)
        return TC_MAX_NT;
    if (n <= TC_NT1_FEW_MAX_N && row_blocks <= TC_NT1_FEW_ROW_BLOCKS)
        return 1;
    return row_blocks <= TC_NT1_MAX_ROW_BLOCKS ? 1 : row_blocks <= TC_NT2_MAX_ROW_BLOCKS ? 2 : TC_MAX_NT;
}

/* f(std::integral_constant<int, NT>()) with the token tiles (8 tokens each) a block takes for
 * n tokens: as many as n needs, at most max_nt (TC_MAX_NT). */
static_assert(TC_MAX_NT == 4, "tc_with_nt instantiates one to four token tiles");
template <class F> static duet_status_t tc_with_nt(int n, F &&f, int max_nt = TC_MAX_NT)
{
    int nt = n >= 8 * TC_MAX_NT ? TC_MAX_NT : (n + 7) / 8;
    switch (nt < max_nt ? nt : max_nt) {
    case 1: return f(std::integral_constant<int, 1>());
    case 2: return f(std::integral_constant<int, 2>());
    case 3: return f(std::integral_constant<int, 3>());
    default: return f(std::integral_constant<int, 4>());
    }
}

template <int WT> static duet_status_t gemv_tc_launch(duet_cuda_t *c, const gemv_args &a)
{
    int row_blocks = duet_cdiv(a.row_end - a.row_begin, TC_BLOCK_ROWS);
    return tc_with_nt(
        a.n, [&](auto nt) { return gemv_tc_launch_nt<WT, decltype(nt)::value>(c, a); }, tc_max_nt(row_blocks, a.n));
}

/* ---- several weights times one x (duet_cuda_matmul_multi) ---- */

/* Each part's rows, pointers and where its output and split partials go; blockIdx.x walks the
 * parts' row blocks in order (tile0: their prefix sums). */
struct multi_args {
    int n_parts;
    int tile0[DUET_CUDA_MULTI_MAX + 1];
    const uint8_t *w[DUET_CUDA_MULTI_MAX];
    const void *scale[DUET_CUDA_MULTI_MAX];
    int scale_cols[DUET_CUDA_MULTI_MAX];
    int row_begin[DUET_CUDA_MULTI_MAX], row_end[DUET_CUDA_MULTI_MAX];
    size_t row_bytes[DUET_CUDA_MULTI_MAX];
    float *y[DUET_CUDA_MULTI_MAX];
    size_t part_off[DUET_CUDA_MULTI_MAX]; /* floats into the split partials */
};

template <int WT, int NT>
__global__ void __launch_bounds__(TC_WARPS * 32) gemv_tc_multi_kernel(gemv_args a, multi_args m, tc_split sp)
{
    int bx = blockIdx.x, rb0 = 0;
    size_t po = 0;
    /* constant indices only: the arguments stay in the parameter bank */
#pragma unroll
    for (int i = 0; i < DUET_CUDA_MULTI_MAX; i++)
        if (i < m.n_parts && bx >= m.tile0[i] && bx < m.tile0[i + 1]) {
            a.w = m.w[i];
            a.scale = m.scale[i];
            a.scale_cols = m.scale_cols[i];
            a.row_bytes = m.row_bytes[i];
            a.row_begin = m.row_begin[i];
            a.row_end = m.row_end[i];
            a.y = m.y[i];
            rb0 = m.row_begin[i] + (bx - m.tile0[i]) * TC_BLOCK_ROWS;
            po = m.part_off[i];
        }
    tok_plain tm{a.x, a.n, a.cols};
    tc_split s = sp;
    if (s.chunks > 1)
        s.part += po;
    gemv_tc_body<WT, NT, false>(a, tm, rb0, blockIdx.y * (8 * NT), s, blockIdx.y * gridDim.x + blockIdx.x);
}

template <int WT, int NT> static duet_status_t gemv_tc_multi_nt(duet_cuda_t *c, const gemv_args &a, multi_args &m)
{
    constexpr int smem = tc_smem_bytes<WT, NT>();
    DUET_TRY(tc_smem(c, gemv_tc_multi_kernel<WT, NT>, smem, 21 + WT * 4 + NT - 1)); /* bits 21-32: free */
    int tiles = m.tile0[m.n_parts], tok_tiles = duet_cdiv(a.n, 8 * NT);
    size_t rows = 0;
    for (int i = 0; i < m.n_parts; i++)
        rows += (size_t)(m.row_end[i] - m.row_begin[i]);
    tc_split sp;
    DUET_TRY(tc_split_plan(c, a.cols, a.chunk_units, (long)tiles * tok_tiles, 1, (size_t)a.n * rows, &sp));
    for (int i = 0, acc = 0; i < m.n_parts; i++) { /* each part's chunk planes, one after another */
        m.part_off[i] = (size_t)sp.chunks * a.n * acc;
        acc += m.row_end[i] - m.row_begin[i];
    }
    dim3 grid(tiles, tok_tiles, sp.chunks);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, gemv_tc_multi_kernel<WT, NT>, grid, dim3(TC_WARPS * 32), smem, a, m, sp));
    return DUET_OK;
}

template <int WT> static duet_status_t gemv_tc_multi(duet_cuda_t *c, const gemv_args &a, multi_args &m)
{
    return tc_with_nt(
        a.n, [&](auto nt) { return gemv_tc_multi_nt<WT, decltype(nt)::value>(c, a, m); },
        tc_max_nt(m.tile0[m.n_parts], a.n));
}

/* Any shape and alignment: one thread per (token, row), scalar decode. */
__global__ void gemv_simple_kernel(gemv_args a, int wt)
{
    int m = a.row_end - a.row_begin;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)m * a.n)
        return;
    int t = (int)(i / m), r = a.row_begin + (int)(i % m);
    const float *x = a.x + (size_t)t * a.cols;
    const uint8_t *wr = a.w + (size_t)r * a.row_bytes;
    float acc = 0.0f;
    for (int col = 0; col < a.cols; col++) {
        float w;
        switch (wt) {
        case WT_BF16: w = duet_d_bf16_to_f32((uint16_t)(wr[2 * col] | (wr[2 * col + 1] << 8))); break;
        case WT_F32: {
            float f;
            memcpy(&f, wr + 4 * col, 4);
            w = f;
            break;
        }
        case WT_F8: {
            float d = duet_d_e4m3_to_f32(wr[col]);
            w = (d != d ? 0.0f : d) * scale_load(a.scale, a.scale_f32, (size_t)(r / 128) * a.scale_cols + col / 128);
            break;
        }
        default: {
            uint8_t b = wr[col / 2];
            w = duet_d_e2m1_to_f32(col & 1 ? b >> 4 : b & 0xf) *
                scale_load(a.scale, a.scale_f32, (size_t)r * a.scale_cols + col / 32);
            break;
        }
        }
        acc = fmaf(w, x[col], acc);
    }
    a.y[(size_t)t * m + (r - a.row_begin)] = acc;
}

static int weight_kind(const duet_weight_t *w)
{
    switch (w->dtype) {
    case DUET_DT_BF16: return WT_BF16;
    case DUET_DT_F8_E4M3: return WT_F8;
    case DUET_DT_F4_E2M1X2: return WT_F4;
    case DUET_DT_F32: return WT_F32;
    default: return -1;
    }
}

static size_t row_bytes_of(const duet_weight_t *w)
{
    switch (w->dtype) {
    case DUET_DT_BF16: return 2 * (size_t)w->cols;
    case DUET_DT_F8_E4M3: return (size_t)w->cols;
    case DUET_DT_F4_E2M1X2: return (size_t)w->cols / 2;
    default: return 4 * (size_t)w->cols;
    }
}

static duet_status_t check_args(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, int n)
{
    if (weight_kind(w) < 0)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul: weight dtype %s", duet_dtype_name(w->dtype));
    if (row_begin < 0 || row_end > w->rows || row_begin > row_end || n < 0 || w->cols <= 0)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "matmul: rows [%d, %d) of %d, n %d, cols %d", row_begin, row_end,
                               w->rows, n, w->cols);
    if (w->dtype == DUET_DT_F4_E2M1X2 && w->cols % 32)
        return duet_cuda_failf(c, DUET_ERR_SHAPE, "matmul: fp4 weight with %d columns (not a multiple of 32)",
                               w->cols);
    if ((w->dtype == DUET_DT_F8_E4M3 || w->dtype == DUET_DT_F4_E2M1X2) &&
        (!w->scale || (w->scale_dtype != DUET_DT_F32 && w->scale_dtype != DUET_DT_F8_E8M0)))
        return duet_cuda_failf(c, DUET_ERR_DTYPE, "matmul: %s weight without f32/ue8m0 scales",
                               duet_dtype_name(w->dtype));
    return DUET_OK;
}

/* A block owns 4 rows; its warps split the columns (each lane at least two 16-byte chunks of a
 * row), so that even a short matrix puts thousands of loads in flight. */
template <int WT> static duet_status_t gemv_launch(duet_cuda_t *c, const gemv_args &a)
{
    int rows = a.row_end - a.row_begin;
    int nchunks = (int)(a.row_bytes / 16);
    int ksplit = nchunks / 64;
    ksplit = ksplit < 1 ? 1 : ksplit > GEMV_MAX_SPLIT ? GEMV_MAX_SPLIT : ksplit;
    dim3 grid(duet_cdiv(rows, GEMV_ROWS_PER_WARP), duet_cdiv(a.n, GEMV_TOKENS));
    int nt = a.n >= GEMV_TOKENS ? GEMV_TOKENS : a.n, threads = ksplit * 32;
    auto k = nt == 1   ? gemv_kernel<WT, 1>
             : nt == 2 ? gemv_kernel<WT, 2>
             : nt <= 4 ? gemv_kernel<WT, 4>
                       : gemv_kernel<WT, 8>;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, k, grid, dim3(threads), 0, a));
    return DUET_OK;
}

static void gemv_args_of(const duet_weight_t *w, int row_begin, int row_end, const float *x, int n, float *y,
                         gemv_args *a)
{
    memset(a, 0, sizeof *a);
    a->w = (const uint8_t *)w->data;
    a->scale = w->scale;
    a->scale_f32 = w->scale_dtype == DUET_DT_F32;
    a->scale_cols = w->scale_cols;
    a->row_bytes = row_bytes_of(w);
    a->row_begin = row_begin;
    a->row_end = row_end;
    a->cols = w->cols;
    a->x = x;
    a->n = n;
    a->y = y;
    a->tiled = w->tiled;
    a->chunk_units = tc_chunk_units(w);
}

extern "C" duet_status_t duet_cuda_matmul_gemv(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                               const float *x, int n, float *y)
{
    DUET_TRY(check_args(c, w, row_begin, row_end, n));
    if (w->tiled)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul_gemv: a tiled weight (the tensor-core kernels only)");
    if (n == 0 || row_end == row_begin)
        return DUET_OK;
    gemv_args a;
    gemv_args_of(w, row_begin, row_end, x, n, y, &a);
    int wt = weight_kind(w);
    int aligned = a.row_bytes % 16 == 0 && ((uintptr_t)a.w % 16) == 0 && ((uintptr_t)x % 16) == 0 && a.cols % 4 == 0;
    if (!aligned) {
        size_t total = (size_t)(row_end - row_begin) * n;
        gemv_simple_kernel<<<duet_cdiv(total, 128), 128, 0, c->stream>>>(a, wt);
    } else if (wt == WT_BF16) {
        DUET_TRY(gemv_launch<WT_BF16>(c, a));
    } else if (wt == WT_F8) {
        DUET_TRY(gemv_launch<WT_F8>(c, a));
    } else if (wt == WT_F4) {
        DUET_TRY(gemv_launch<WT_F4>(c, a));
    } else {
        DUET_TRY(gemv_launch<WT_F32>(c, a));
    }
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_matmul_gemv_tc(duet_cuda_t *c, const duet_weight_t *w, int row_begin,
                                                  int row_end, const float *x, int n, float *y)
{
    DUET_TRY(check_args(c, w, row_begin, row_end, n));
    if (n == 0 || row_end == row_begin)
        return DUET_OK;
    gemv_args a;
    gemv_args_of(w, row_begin, row_end, x, n, y, &a);
    int wt = weight_kind(w);
    if (!tc_eligible(a, wt))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "matmul_gemv_tc: %s weight, %d columns, row_begin %d (needs bf16/fp8/fp4, columns "
                               "a multiple of 128, row_begin a multiple of 16, aligned buffers)",
                               duet_dtype_name(w->dtype), w->cols, row_begin);
    if (wt == WT_BF16)
        DUET_TRY(gemv_tc_launch<WT_BF16>(c, a));
    else if (wt == WT_F8)
        DUET_TRY(gemv_tc_launch<WT_F8>(c, a));
    else
        DUET_TRY(gemv_tc_launch<WT_F4>(c, a));
    return DUET_OK;
}

/* ---- the fp4 tiled layout (duet_cuda_weight_tile) ---- */

static unsigned grid_for(size_t n, unsigned threads);

/* A thread a 16-byte piece of the tiled data: tile t = (rt, u), piece 32 f + lane of its
 * TC_F4_TILE_BYTES / 16: lane (g, tq)'s word 4 f + tq of rows g, g + 8, g + 16, g + 24. */
__global__ void f4_tile_kernel(const uint8_t *src, uint8_t *dst, size_t row_bytes, int units, size_t pieces)
{
    constexpr int TP = TC_F4_TILE_BYTES / 16;
    for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < pieces; q += (size_t)gridDim.x * blockDim.x) {
        size_t t = q / TP, rt = t / units, u = t % units;
        int pc = (int)(q % TP), f = pc >> 5, lane = pc & 31;
        const uint8_t *w = src + (rt * TC_ROWS + (lane >> 2)) * row_bytes + u * 64 + 4 * (4 * f + (lane & 3));
        uint32_t v[4];
#pragma unroll
        for (int r4 = 0; r4 < 4; r4++)
            v[r4] = f4_tile_word(*reinterpret_cast<const uint32_t *>(w + 8 * r4 * row_bytes));
        *reinterpret_cast<uint4 *>(dst + 16 * q) = make_uint4(v[0], v[1], v[2], v[3]);
    }
}

/* A thread a row's four scale bytes of a unit: word q of the tiled scales is tile q / TC_ROWS, row
 * q % TC_ROWS. */
__global__ void f4_tile_scale_kernel(const uint8_t *src, uint8_t *dst, int scale_cols, int units, size_t words)
{
    for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < words; q += (size_t)gridDim.x * blockDim.x) {
        size_t t = q / TC_ROWS, rt = t / units, u = t % units;
        int r = (int)(q % TC_ROWS);
        *reinterpret_cast<uint32_t *>(dst + 4 * q) =
            *reinterpret_cast<const uint32_t *>(src + (rt * TC_ROWS + r) * scale_cols + 4 * u);
    }
}

/* A thread a 16-byte record of the bf16 tiled layout (TC_BF16_TILE_BYTES), of the row tiles that
 * src holds (rows 32 rt0 on, row_bytes apart). */
__global__ void bf16_tile_kernel(const uint8_t *src, uint8_t *dst, size_t row_bytes, int units, size_t records)
{
    constexpr int TR = TC_BF16_TILE_BYTES / 16;
    for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < records; q += (size_t)gridDim.x * blockDim.x) {
        size_t t = q / TR, rt = t / units, u = t % units;
        int rc = (int)(q % TR), ks = rc >> 6, mt = (rc >> 5) & 1, lane = rc & 31;
        size_t c = u * 128 + tc_xcol(lane & 3, ks);
        const uint8_t *r0 = src + (rt * TC_ROWS + 16 * mt + (lane >> 2)) * row_bytes + 2 * c, *r1 = r0 + 8 * row_bytes;
        *reinterpret_cast<uint4 *>(dst + 16 * q) =
            make_uint4(*reinterpret_cast<const uint32_t *>(r0), *reinterpret_cast<const uint32_t *>(r1),
                       *reinterpret_cast<const uint32_t *>(r0 + 4), *reinterpret_cast<const uint32_t *>(r1 + 4));
    }
}

extern "C" int duet_cuda_weight_tile_ok(const duet_weight_t *w)
{
    if (w->tiled || !w->data || w->rows <= 0 || w->rows % TC_ROWS || w->cols <= 0 || w->cols % 128 ||
        (uintptr_t)w->data % 16)
        return 0;
    if (w->dtype == DUET_DT_BF16)
        return 1;
    return w->dtype == DUET_DT_F4_E2M1X2 && w->scale && w->scale_dtype == DUET_DT_F8_E8M0 &&
           w->scale_cols == w->cols / 32 && (uintptr_t)w->scale % 4 == 0;
}

/* bf16 tiles in place, a run of row tiles at a time through a scratch copy of at most
 * TILE_CHUNK_BYTES (a tiled run of row tiles takes the same bytes as the rows did). */
#define TILE_CHUNK_BYTES ((size_t)64 << 20)
static duet_status_t bf16_tile(duet_cuda_t *c, duet_weight_t *w)
{
    size_t row_bytes = row_bytes_of(w), tile_rows_bytes = row_bytes * TC_ROWS;
    size_t per = TILE_CHUNK_BYTES / tile_rows_bytes;
    per = per < 1 ? 1 : per;
    int row_tiles = w->rows / TC_ROWS, units = w->cols / 128;
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, per * tile_rows_bytes, &scr));
    for (int rt = 0; rt < row_tiles; rt += (int)per) {
        size_t n = (size_t)(row_tiles - rt) < per ? (size_t)(row_tiles - rt) : per;
        uint8_t *d = (uint8_t *)w->data + (size_t)rt * tile_rows_bytes;
        size_t bytes = n * tile_rows_bytes;
        DUET_CUDA_CHECK(c, cudaMemcpyAsync(scr, d, bytes, cudaMemcpyDeviceToDevice, c->stream));
        bf16_tile_kernel<<<grid_for(bytes / 16, 256), 256, 0, c->stream>>>((const uint8_t *)scr, d, row_bytes, units,
                                                                            bytes / 16);
        DUET_CUDA_CHECK_LAUNCH(c);
    }
    w->tiled = 1;
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_weight_tile(duet_cuda_t *c, duet_weight_t *w)
{
    if (!duet_cuda_weight_tile_ok(w))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "weight_tile: %s weight %dx%d%s (needs bf16, or fp4 with ue8m0 scales; rows a "
                               "multiple of 32, columns of 128, not tiled yet)",
                               duet_dtype_name(w->dtype), w->rows, w->cols, w->tiled ? ", tiled" : "");
    c->pdl_hold = 1; /* the weight's next reader may load it before its wait (duet_cuda_launch) */
    if (w->dtype == DUET_DT_BF16)
        return bf16_tile(c, w);
    size_t data_bytes = row_bytes_of(w) * (size_t)w->rows, scale_bytes = (size_t)w->rows * w->scale_cols;
    size_t off = duet_round_up(data_bytes, 256);
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, off + scale_bytes, &scr));
    uint8_t *s = (uint8_t *)scr;
    int units = w->cols / 128;
    DUET_CUDA_CHECK(c, cudaMemcpyAsync(s, w->data, data_bytes, cudaMemcpyDeviceToDevice, c->stream));
    DUET_CUDA_CHECK(c, cudaMemcpyAsync(s + off, w->scale, scale_bytes, cudaMemcpyDeviceToDevice, c->stream));
    f4_tile_kernel<<<grid_for(data_bytes / 16, 256), 256, 0, c->stream>>>(s, (uint8_t *)w->data, (size_t)w->cols / 2,
                                                                           units, data_bytes / 16);
    DUET_CUDA_CHECK_LAUNCH(c);
    f4_tile_scale_kernel<<<grid_for(scale_bytes / 4, 256), 256, 0, c->stream>>>(s + off, (uint8_t *)w->scale,
                                                                                 w->scale_cols, units, scale_bytes / 4);
    DUET_CUDA_CHECK_LAUNCH(c);
    w->tiled = 1;
    return DUET_OK;
}

/* ---- grouped expert matmuls (MoE) ----
 *
 * One launch over every expert's assignments: blockIdx.x is a token tile of one
 * expert (found in the tile prefix sums by binary search; tiles past the last
 * one exit), blockIdx.y a row tile of one of up to two matrices (w1 and w3 in
 * one launch).  Each block is the plain kernel's block for that expert's weight
 * with tok_group as its token map, so every token's result is bit for bit the
 * one duet_cuda_matmul_invariant gives for it alone. */
struct group_args {
    const void *const *w[2];
    const void *const *scale[2];
    float *y[2];
    const int32_t *offs, *tiles, *xrow;
    int n_experts, row_tiles;
};

__device__ __forceinline__ bool group_tile(const group_args &g, int tile, int tok_per_tile, int *e_out, int *t0)
{
    int E = g.n_experts;
    if (tile >= __ldg(g.tiles + E))
        return false;
    int lo = 0, hi = E - 1; /* the last expert whose first tile is <= tile (empty experts repeat a value) */
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (__ldg(g.tiles + mid) <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    *e_out = lo;
    *t0 = (tile - __ldg(g.tiles + lo)) * tok_per_tile;
    return true;
}

/* This block's expert tile: a's weight, scale and output become that expert's matrix (w1 or w3
 * by blockIdx.y), *tm its token map, *row_tile the row tile in it, *t0 the first token.  False
 * for tiles past the last one (the whole block returns). */
__device__ __forceinline__ bool group_block(gemv_args &a, const group_args &g, int tok_per_tile, tok_group *tm,
                                            int *row_tile, int *t0)
{
    int e;
    if (!group_tile(g, blockIdx.x, tok_per_tile, &e, t0))
        return false;
    int mi = blockIdx.y >= (unsigned)g.row_tiles;
    int off = __ldg(g.offs + e);
    const void *const *ws = mi ? g.w[1] : g.w[0], *const *ss = mi ? g.scale[1] : g.scale[0]; /* no local copy */
    a.w = (const uint8_t *)ws[e];
    a.scale = ss ? ss[e] : NULL;
    a.y = mi ? g.y[1] : g.y[0];
    *tm = tok_group{a.x, g.xrow, off, __ldg(g.offs + e + 1) - off, a.cols};
    *row_tile = (int)blockIdx.y - mi * g.row_tiles;
    return true;
}

template <int WT, int NT>
__global__ void __launch_bounds__(GEMV_MAX_SPLIT * 32) gemv_group_kernel(gemv_args a, group_args g)
{
    duet_pdl_wait(); /* the expert lists are the kernel ahead's */
    tok_group tm;
    int rt, t0;
    if (group_block(a, g, GEMV_TOKENS, &tm, &rt, &t0))
        gemv_body<WT, NT>(a, tm, rt * GEMV_ROWS_PER_WARP, t0);
}

/* Blocks an SM the one-tile grouped fp4 launch (the experts of a decode step) keeps registers
 * for: left alone it takes 155 registers (three blocks an SM); four blocks measured faster
 * (docs/PERF.md). */
#ifndef TC_GROUP_MIN_BLOCKS
#define TC_GROUP_MIN_BLOCKS 4
#endif
/* The same for it with x split ahead (TC_PRESPLIT_MIN_N1), which needs fewer registers: five
 * blocks an SM fit it in 96 without spilling (sm_90a), and timed within noise of four on the
 * H200 (docs/PERF.md). */
#ifndef TC_GROUP_PRE_MIN_BLOCKS
#define TC_GROUP_PRE_MIN_BLOCKS TC_GROUP_MIN_BLOCKS
#endif
template <int WT, int NT, bool PRE>
__global__ void __launch_bounds__(TC_WARPS * 32,
                                  NT == 1 && WT == WT_F4 ? (PRE ? TC_GROUP_PRE_MIN_BLOCKS : TC_GROUP_MIN_BLOCKS) : 1)
    gemv_tc_group_kernel(gemv_args a, group_args g, tc_split sp)
{
    duet_pdl_wait(); /* the expert lists (and x split ahead) are the kernels ahead's */
    tok_group tm;
    int rt, t0;
    if (!group_block(a, g, 8 * NT, &tm, &rt, &t0))
        return;
    /* split along the columns: each matrix its own partial planes */
    int mi = blockIdx.y >= (unsigned)g.row_tiles;
    tc_split s = sp;
    if (s.chunks > 1)
        s.part += (size_t)mi * s.chunks * a.n * (a.row_end - a.row_begin);
    gemv_tc_body<WT, NT, PRE>(a, tm, rt * TC_BLOCK_ROWS, t0, s, blockIdx.y * gridDim.x + blockIdx.x);
}

static int grouped_kind(const duet_weight_t *w, const float *x)
{
    int wt = weight_kind(w);
    if (wt < 0 || w->rows <= 0 || w->cols <= 0 || tc_own_chunks(w))
        return -1;
    if (w->dtype == DUET_DT_F4_E2M1X2 && w->cols % 32)
        return -1;
    if ((w->dtype == DUET_DT_F8_E4M3 || w->dtype == DUET_DT_F4_E2M1X2) &&
        w->scale_dtype != DUET_DT_F32 && w->scale_dtype != DUET_DT_F8_E8M0)
        return -1;
    gemv_args a;
    gemv_args_of(w, 0, w->rows, x, 0, NULL, &a);
    a.w = NULL; /* experts' own pointers: device allocations, 256-byte aligned */
    if (tc_eligible(a, wt))
        return 1;
    if (w->tiled)
        return -1;
    if (a.row_bytes % 16 == 0 && ((uintptr_t)x % 16) == 0 && a.cols % 4 == 0)
        return 0;
    return -1;
}

extern "C" int duet_cuda_matmul_grouped_ok(const duet_weight_t *proto, const float *x)
{
    return grouped_kind(proto, x) >= 0;
}

/* The grouped tensor-core launch of one-token (nt 1) or four-token-group tiles, x split ahead
 * where it pays (fp8/fp4: tc_presplit_on; a record a sorted position, reading x through the
 * row list). */
template <int W>
static duet_status_t tc_group_launch(duet_cuda_t *c, gemv_args &a, const group_args &g, const tc_split &sp, dim3 grid,
                                     int nt, int n)
{
    auto launch = [&](auto nt_c, auto pre_c) -> duet_status_t {
        constexpr int NT = decltype(nt_c)::value;
        constexpr bool PRE = decltype(pre_c)::value;
        constexpr int smem = tc_smem_bytes<W, NT>();
        DUET_TRY(tc_smem(c, gemv_tc_group_kernel<W, NT, PRE>, smem, (PRE ? TC_PRE_BIT : 0) + 32 + W * 8 + NT));
        DUET_CUDA_CHECK(
            c, duet_cuda_launch(c, gemv_tc_group_kernel<W, NT, PRE>, grid, dim3(TC_WARPS * 32), smem, a, g, sp));
        return DUET_OK;
    };
    using one = std::integral_constant<int, 1>;
    using all = std::integral_constant<int, DUET_CUDA_MOE_WIDE_TILE / 8>;
    if constexpr (W != WT_BF16) {
        if (tc_presplit_on<W>(c, nt, n)) {
            DUET_TRY(tc_presplit<W>(c, a, g.xrow, n));
            return nt == 1 ? launch(one(), std::true_type()) : launch(all(), std::true_type());
        }
    }
    return nt == 1 ? launch(one(), std::false_type()) : launch(all(), std::false_type());
}

/* the wide tiles' grouped form (below, with the plain one) */
static bool wide_group_ok(const duet_cuda_t *c, const duet_weight_t *w, int n, int E);
static duet_status_t wide_group_launch(duet_cuda_t *c, const gemv_args &a, group_args g, const int32_t *tiles64,
                                       const int32_t *xrow, int n, int n_mat, int nonempty);

extern "C" duet_status_t duet_cuda_matmul_grouped(duet_cuda_t *c, const duet_cuda_expert_mats_t *ma,
                                                  const duet_cuda_expert_mats_t *mb, const duet_cuda_moe_plan_t *p,
                                                  const float *x, int use_xrow, float *ya, float *yb)
{
    if (c->exact)
        return DUET_CUDA_NOT_EXACT(c, "matmul_grouped");
    const duet_weight_t *w = ma->proto;
    int kind = grouped_kind(w, x);
    if (kind < 0)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul_grouped: %s weight %dx%d, x %p",
                               duet_dtype_name(w->dtype), w->rows, w->cols, (const void *)x);
    if (mb && (mb->proto->dtype != w->dtype || mb->proto->rows != w->rows || mb->proto->cols != w->cols ||
               mb->proto->scale_dtype != w->scale_dtype || mb->proto->scale_cols != w->scale_cols))
        return duet_cuda_failf(c, DUET_ERR_SHAPE, "matmul_grouped: the two matrices differ in shape or dtype");
    if (p->n_assign <= 0 || p->n_experts <= 0)
        return DUET_OK;
    gemv_args a;
    gemv_args_of(w, 0, w->rows, x, p->n_assign, NULL, &a);
    group_args g;
    memset(&g, 0, sizeof g);
    g.w[0] = ma->data;
    g.scale[0] = ma->scale;
    g.y[0] = ya;
    int n_mat = 1;
    if (mb) {
        g.w[1] = mb->data;
        g.scale[1] = mb->scale;
        g.y[1] = yb;
        n_mat = 2;
    }
    g.offs = p->offs;
    g.xrow = use_xrow ? p->xrow : NULL;
    g.n_experts = p->n_experts;
    int wt = weight_kind(w), E = p->n_experts, n = p->n_assign;
    int nonempty = n < E ? n : E;
    if (kind == 1 && wide_group_ok(c, w, n, E))
        return wide_group_launch(c, a, g, p->tiles + 2 * (E + 1), use_xrow ? p->xrow : NULL, n, n_mat, nonempty);
    if (kind == 1) {
        /* wide tiles (DUET_CUDA_MOE_WIDE_TILE tokens) once experts average 16 tokens (each
         * weight row tile is read once a tile), else 8; a token's result does not depend on the
         * tile size */
        int nt = n >= 16 * E ? DUET_CUDA_MOE_WIDE_TILE / 8 : 1;
        g.tiles = p->tiles + (nt == 1 ? 0 : E + 1);
        g.row_tiles = duet_cdiv(w->rows, TC_BLOCK_ROWS);
        dim3 grid(duet_cdiv(n, 8 * nt) + nonempty, g.row_tiles * n_mat);
        /* few tiles (a batch of one or two tokens): split along the columns, as the plain
         * launch does, so that the SMs are not left with a wave and a half of long blocks */
        tc_split sp;
        DUET_TRY(tc_split_plan(c, w->cols, a.chunk_units, (long)grid.x * grid.y, TC_GROUP_SPLIT_WAVES,
                               (size_t)n_mat * n * w->rows, &sp));
        grid.z = sp.chunks;
        if (wt == WT_BF16)
            DUET_TRY(tc_group_launch<WT_BF16>(c, a, g, sp, grid, nt, n));
        else if (wt == WT_F8)
            DUET_TRY(tc_group_launch<WT_F8>(c, a, g, sp, grid, nt, n));
        else
            DUET_TRY(tc_group_launch<WT_F4>(c, a, g, sp, grid, nt, n));
    } else {
        g.tiles = p->tiles;
        g.row_tiles = duet_cdiv(w->rows, GEMV_ROWS_PER_WARP);
        int nchunks = (int)(a.row_bytes / 16);
        int ksplit = nchunks / 64;
        ksplit = ksplit < 1 ? 1 : ksplit > GEMV_MAX_SPLIT ? GEMV_MAX_SPLIT : ksplit;
        dim3 grid(duet_cdiv(n, GEMV_TOKENS) + nonempty, g.row_tiles * n_mat);
        int threads = ksplit * 32;
        if (wt == WT_BF16)
            DUET_CUDA_CHECK(c,
                            duet_cuda_launch(c, gemv_group_kernel<WT_BF16, GEMV_TOKENS>, grid, dim3(threads), 0, a, g));
        else if (wt == WT_F8)
            DUET_CUDA_CHECK(c,
                            duet_cuda_launch(c, gemv_group_kernel<WT_F8, GEMV_TOKENS>, grid, dim3(threads), 0, a, g));
        else if (wt == WT_F4)
            DUET_CUDA_CHECK(c,
                            duet_cuda_launch(c, gemv_group_kernel<WT_F4, GEMV_TOKENS>, grid, dim3(threads), 0, a, g));
        else
            DUET_CUDA_CHECK(c,
                            duet_cuda_launch(c, gemv_group_kernel<WT_F32, GEMV_TOKENS>, grid, dim3(threads), 0, a, g));
    }
    return DUET_OK;
}

/* ---- cuBLASLt ---- */

static void plan_destroy(struct duet_lt_plan *p)
{
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

/* D(m, n) = op(A)(m, k) · B(k, n), column-major: A is the weight (k x m, transposed), B the
 * activations (k x n), D the output (m x n, i.e. y row-major (n, m)).  For the fp8 kinds the
 * scale pointers are set on the descriptor by the caller before each use. */
static duet_status_t lt_plan(duet_cuda_t *c, int kind, int m, int n, int k, const void *a_scale,
                             const void *b_scale, struct duet_lt_plan **out)
{
    for (int i = 0; i < DUET_CUDA_MAX_PLANS; i++) {
        struct duet_lt_plan *p = &c->plans[i];
        if (p->used && p->kind == kind && p->m == m && p->n == n && p->k == k) {
            *out = p;
            return DUET_OK;
        }
    }
    int slot = -1;
    for (int i = 0; i < DUET_CUDA_MAX_PLANS && slot < 0; i++)
        if (!c->plans[i].used)
            slot = i;
    if (slot < 0) { /* full: drop one (round robin by m+n+k) */
        slot = (int)(((unsigned)m + (unsigned)n + (unsigned)k) % DUET_CUDA_MAX_PLANS);
        plan_destroy(&c->plans[slot]);
    }
    struct duet_lt_plan *p = &c->plans[slot];
    memset(p, 0, sizeof *p);
    cudaDataType_t ab = CUDA_R_16BF, dt = CUDA_R_32F;
    if (kind == LT_F32)
        ab = CUDA_R_32F;
    if (kind == LT_FP8_BLK || kind == LT_FP8_BLK_D16)
        ab = CUDA_R_8F_E4M3;
    if (kind == LT_FP8_BLK_D16)
        dt = CUDA_R_16BF;
    cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    duet_status_t st = DUET_OK;
#define PLAN_TRY(stmt)                                                                                             \
    do {                                                                                                           \
        cublasStatus_t s_ = (stmt);                                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                         \
            st = duet_cuda_fail(c, DUET_ERR_CUDA, #stmt, __FILE__, __LINE__, cublasGetStatusString(s_));          \
            goto fail;                                                                                             \
        }                                                                                                          \
    } while (0)
    {
        PLAN_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        PLAN_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
        PLAN_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
        if (ab == CUDA_R_8F_E4M3) {
            int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            PLAN_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
            PLAN_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
            PLAN_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                    sizeof a_scale));
            PLAN_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                    sizeof b_scale));
        }
        PLAN_TRY(cublasLtMatrixLayoutCreate(&p->a, ab, (uint64_t)k, (uint64_t)m, k));
        PLAN_TRY(cublasLtMatrixLayoutCreate(&p->b, ab, (uint64_t)k, (uint64_t)n, k));
        PLAN_TRY(cublasLtMatrixLayoutCreate(&p->d, dt, (uint64_t)m, (uint64_t)n, m));
        cublasLtMatmulPreference_t pref = NULL;
        PLAN_TRY(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = c->workspace_bytes;
        cublasStatus_t s1 =
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulHeuristicResult_t res;
        memset(&res, 0, sizeof res);
        int nres = 0;
        cublasStatus_t s2 = s1 == CUBLAS_STATUS_SUCCESS
                                ? cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1,
                                                                 &res, &nres)
                                : s1;
        cublasLtMatmulPreferenceDestroy(pref);
        if (s2 != CUBLAS_STATUS_SUCCESS || nres == 0) {
            st = duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                                 "cuBLASLt has no algorithm for kind %d (m %d, n %d, k %d) on sm_%d%d: %s", kind, m,
                                 n, k, c->info.cc_major, c->info.cc_minor,
                                 s2 != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(s2) : "no heuristic result");
            goto fail;
        }
        p->algo = res.algo;
    }
#undef PLAN_TRY
    p->used = 1;
    p->kind = kind;
    p->m = m;
    p->n = n;
    p->k = k;
    p->d_bf16 = kind == LT_FP8_BLK_D16;
    *out = p;
    return DUET_OK;
fail:
    plan_destroy(p);
    return st;
}

static duet_status_t lt_run(duet_cuda_t *c, struct duet_lt_plan *p, const void *a, const void *b, void *d)
{
    const float one = 1.0f, zero = 0.0f;
    DUET_CUBLAS_CHECK(c, cublasLtMatmul(c->lt, p->desc, &one, a, p->a, b, p->b, &zero, d, p->d, d, p->d, &p->algo,
                                        c->workspace, c->workspace_bytes, c->stream));
    return DUET_OK;
}

__global__ void f32_to_bf16_kernel(const float *x, size_t n, __nv_bfloat16 *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

/* W[row_begin:row_end] (fp8 or fp4, with scales) -> bf16 rows of `cols`; 8 values per thread. */
__global__ void dequant_bf16_kernel(gemv_args a, int wt, __nv_bfloat16 *out)
{
    size_t per_row = (size_t)a.cols / 8, total = (size_t)(a.row_end - a.row_begin) * per_row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int rr = (int)(i / per_row);
        int r = a.row_begin + rr, col = (int)(i % per_row) * 8;
        const uint8_t *wr = a.w + (size_t)r * a.row_bytes;
        float v[8];
        if (wt == WT_F8) {
            uint2 u = *(const uint2 *)(wr + col);
            float s = scale_load(a.scale, a.scale_f32, (size_t)(r / 128) * a.scale_cols + col / 128);
            for (int j = 0; j < 8; j++)
                v[j] = duet_d_e4m3_to_f32((uint8_t)((j < 4 ? u.x : u.y) >> (8 * (j & 3)))) * s;
        } else {
            uint32_t u = *(const uint32_t *)(wr + col / 2);
            float s = scale_load(a.scale, a.scale_f32, (size_t)r * a.scale_cols + col / 32);
            for (int j = 0; j < 8; j++)
                v[j] = duet_d_e2m1_to_f32(u >> (4 * j)) * s;
        }
        __nv_bfloat16 *o = out + (size_t)rr * a.cols + col;
        for (int j = 0; j < 8; j++)
            o[j] = __float2bfloat16_rn(v[j]);
    }
}

static unsigned grid_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 8192 ? 8192 : (b ? b : 1));
}

extern "C" duet_status_t duet_cuda_matmul_lt(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                             const float *x, int n, float *y)
{
    DUET_TRY(check_args(c, w, row_begin, row_end, n));
    if (w->tiled)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul_lt: a tiled weight (the tensor-core kernels only)");
    if (n == 0 || row_end == row_begin)
        return DUET_OK;
    int m = row_end - row_begin, k = w->cols, wt = weight_kind(w);
    struct duet_lt_plan *p;
    if (wt == WT_F32) {
        DUET_TRY(lt_plan(c, LT_F32, m, n, k, NULL, NULL, &p));
        return lt_run(c, p, (const float *)w->data + (size_t)row_begin * k, x, y);
    }
    if (k % 8)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul_lt: %d columns (not a multiple of 8)", k);
    size_t xb_bytes = duet_round_up((size_t)n * k * 2, 256);
    size_t wb_bytes = wt == WT_BF16 ? 0 : (size_t)m * k * 2;
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, xb_bytes + wb_bytes, &scr));
    __nv_bfloat16 *xb = (__nv_bfloat16 *)scr;
    f32_to_bf16_kernel<<<grid_for((size_t)n * k, 256), 256, 0, c->stream>>>(x, (size_t)n * k, xb);
    DUET_CUDA_CHECK_LAUNCH(c);
    const void *wa = (const uint16_t *)w->data + (size_t)row_begin * k;
    if (wt != WT_BF16) {
        gemv_args a;
        gemv_args_of(w, row_begin, row_end, x, n, y, &a);
        __nv_bfloat16 *wb = (__nv_bfloat16 *)((uint8_t *)scr + xb_bytes);
        dequant_bf16_kernel<<<grid_for((size_t)m * k / 8, 256), 256, 0, c->stream>>>(a, wt, wb);
        DUET_CUDA_CHECK_LAUNCH(c);
        wa = wb;
    }
    DUET_TRY(lt_plan(c, LT_BF16, m, n, k, NULL, NULL, &p));
    return lt_run(c, p, wa, xb, y);
}

/* ---- wide token tiles: fp8 and fp4 weights at prefill sizes ----
 *
 * The decode kernel multiplies a block's 128 rows by at most 32 tokens, so a 4096-token prefill
 * reads each weight 128 times and splits each x unit once per row block.  Here x is split once
 * (wide_split_kernel: the decode kernel's own h16_split, so the same fp16 parts and scales), laid
 * out as wgmma's B, and a block multiplies 64 rows by 64 tokens with wgmma m64n64k16: measured on
 * the H200 to give every result the bits of mma.sync m16n8k16 on the same operands
 * (duet-tc-rates).  Each output is the decode kernel's sequence: fp8, a unit's 8 k-steps, hi part
 * then lo part each, into a fresh partial, the partial times (weight block scale times the
 * token's x scale) into the chunk's sum; fp4, each 32-column scale group's two k-steps (hi then
 * lo each) into a fresh partial, that times the rows' group scale into the unit's partial in
 * group order, the unit's partial times the token's x scale into the chunk's sum; chunks of
 * TC_CHUNK_UNITS units into the total.  So a token's bits are those of a decode step.
 *
 * Plain launches: fp8 weights (untiled), row_begin a multiple of 64, from TC_WIDE_MIN_N tokens;
 * a block of one warpgroup, 64 rows by 64 tokens.  Grouped launches (duet_cuda_matmul_grouped:
 * the routed experts, the grouped output projection): fp8 weights, or fp4 in the tiled layout,
 * once the experts average TC_WIDE_GROUP_MIN_AVG positions; a block of three warpgroups, 192
 * rows of one expert's matrix by a tile of up to 64 of its sorted positions (moe_sort's 64-token
 * tile prefix sums).  Warp w takes rows 16 w .. 16 w + 15; fp4's 32-row weight tiles are two
 * warps' rows each.  sm_90 only (0: never; build settings, for timing variants).
 *
 * bf16 weights in the tiled layout (the output head) from TC_WIDE_BF16_MIN_N tokens: a block of
 * TC_WIDE_BF16_WGS warpgroups, x in the decode kernel's three bf16 parts (bf16_split over
 * tc_xcol's quads, the columns the tiled records' k-slots hold), each unit's 8 k-steps, hi, mid
 * then lo, into a fresh partial, added to the chunk's sum; the token tile is the block's fastest
 * index, so that a row block's tiles run together and read its weights from DRAM once.
 *
 * The split x: [unit][run][position][16 bytes], a run a (k-step, part, k half) (32 a unit; 48
 * with bf16's three parts), so that a tile of any 64 consecutive positions is 1 KB a run; npad
 * positions (64 past the last, so that a tile's reads stay inside).  Scales [unit][position]
 * (fp8, fp4; bf16 has none). */
/* From 32 tokens (half-empty tiles, the whole split x image read a unit and block) a decode step
 * at batch 32 measured 9% slower on the H200 (docs/PERF.md, "Every wait with a deadline"). */
#ifndef TC_WIDE_MIN_N
#define TC_WIDE_MIN_N 128
#endif
/* Measured on the H200 (docs/PERF.md): at 24 positions an expert the 32-token tiles are faster (a
 * 1024-token prefill 29.2 against 33.7 ms), at 48 these (2048 tokens: 52.7 against 55.0 ms) */
#ifndef TC_WIDE_GROUP_MIN_AVG
#define TC_WIDE_GROUP_MIN_AVG 48
#endif
#ifndef TC_WIDE_BF16_MIN_N
#define TC_WIDE_BF16_MIN_N 128
#endif
#ifndef TC_WIDE_BF16_WGS
#define TC_WIDE_BF16_WGS 2
#endif
/* Warpgroups a block (each 64 rows of its own, all on the one B image: the image's bytes from L2
 * over a block's rows) and units in shared memory (those after the one computed in flight), for
 * the plain launches and the grouped ones.  Measured on the H200 (docs/PERF.md): the grouped
 * launches of a 4096-token prefill faster with three warpgroups and three stages (one block an
 * SM), the plain ones at 128 tokens slower (too few blocks).  Build settings, for timing variants. */
#ifndef TC_WIDE_WGS
#define TC_WIDE_WGS 1
#endif
#ifndef TC_WIDE_STAGES
#define TC_WIDE_STAGES 2
#endif
#ifndef TC_WIDE_GROUP_WGS
#define TC_WIDE_GROUP_WGS 3
#endif
#ifndef TC_WIDE_GROUP_STAGES
#define TC_WIDE_GROUP_STAGES 3
#endif
#define WIDE_TOK DUET_CUDA_MOE_WG_TILE /* tokens a tile */
#define WIDE_WG_ROWS 64                /* rows a warpgroup: four warps of 16 */
#define WIDE_B_HALF (WIDE_TOK * 16)    /* bytes of a tile's run: 64 tokens' 8 k-slots */
#define WIDE_SMEM_BIT 120 /* tc_smem's bits: 120 + the wide kernel's form (four), then the loading-warp kernel's (four) */
/* x's parts (fp16 hi, lo; bf16 hi, mid, lo), runs a unit ([k-step 8][part][k half 2]), a unit's bytes */
template <int WT> __host__ __device__ constexpr int wide_parts() { return WT == WT_BF16 ? 3 : 2; }
template <int WT> __host__ __device__ constexpr int wide_runs() { return 8 * wide_parts<WT>() * 2; }
template <int WT> __host__ __device__ constexpr int wide_b_unit() { return wide_runs<WT>() * WIDE_B_HALF; }
static_assert(TC_WIDE_WGS >= 1 && TC_WIDE_WGS <= 4 && TC_WIDE_GROUP_WGS >= 1 && TC_WIDE_GROUP_WGS <= 4 &&
                  TC_WIDE_BF16_WGS >= 1 && TC_WIDE_BF16_WGS <= 4 && TC_WIDE_STAGES >= 2 &&
                  TC_WIDE_GROUP_STAGES >= 2,
              "one to four warpgroups, two stages or more");
/* a launch's form: warpgroups and stages */
template <bool GROUPED, int WT = WT_F8> struct wide_form {
    static constexpr int WGS = GROUPED ? TC_WIDE_GROUP_WGS : WT == WT_BF16 ? TC_WIDE_BF16_WGS : TC_WIDE_WGS;
    static constexpr int STAGES = GROUPED ? TC_WIDE_GROUP_STAGES : TC_WIDE_STAGES;
    static constexpr int ROWS = WGS * WIDE_WG_ROWS, THREADS = WGS * 128;
};
static_assert(WIDE_TOK == 64, "wgmma m64n64k16: a tile's 64 tokens are its N");
/* a stage: the block's weights of a unit (fp8: its rows of 128 bytes, chunk ^ 4 on odd rows; fp4:
 * its tiles' codes, then their scale words; bf16: its 8 KB tiles), the tile's B image of the
 * unit, its 64 x scales (not bf16) */
template <int WT, bool GROUPED> __host__ __device__ constexpr int wide_w_stage()
{
    constexpr int R = wide_form<GROUPED, WT>::ROWS;
    return WT == WT_F4     ? (R / TC_ROWS) * (TC_F4_TILE_BYTES + TC_F4_TILE_SCALE_BYTES)
           : WT == WT_BF16 ? (R / TC_ROWS) * TC_BF16_TILE_BYTES
                           : R * 128;
}
template <int WT, bool GROUPED> __host__ __device__ constexpr int wide_stage()
{
    return wide_w_stage<WT, GROUPED>() + wide_b_unit<WT>() + (WT == WT_BF16 ? 0 : WIDE_TOK * 4);
}

/* x's split runs as a dependent launch: it waits for the kernel that wrote x (and for every
 * earlier reader of the record buffer it overwrites) first thing, and with WIDE_SPLIT_EARLY lets
 * the matmul after it be placed at once, so that the matmul's blocks issue their first weight
 * loads while the split runs (they wait for the split's end before reading its records). */
#ifndef WIDE_SPLIT_EARLY
#define WIDE_SPLIT_EARLY 1
#endif
__device__ __forceinline__ void wide_split_start()
{
#if WIDE_SPLIT_EARLY
    duet_pdl_launch_dependents();
#endif
    duet_pdl_wait();
}

/* A warp a unit of a few positions (a position's 4 FG items in consecutive lanes, h16_split's
 * arrangement): position p reads x row xrow[p] (p when xrow is NULL); its words go to their
 * places in each run of unit u, its scale to xsc[u][p]. */
template <int WT>
__global__ void wide_split_kernel(const float *x, const int32_t *xrow, int npos, int npad, int cols, uint8_t *img,
                                  float *xsc)
{
    constexpr int FG = h16_traits<WT>::FG, GC = h16_traits<WT>::GC, KPG = h16_traits<WT>::KPG;
    constexpr int PPW = 32 / (4 * FG); /* positions a warp */
    wide_split_start();
    int units = cols / 128, lane = threadIdx.x & 31;
    size_t gw = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int u = (int)(gw % units);
    size_t pg = gw / units;
    if (pg * PPW >= (size_t)npos)
        return; /* whole warps */
    int tq, f, tok, nt;
    h16_item<WT>(lane, tq, f, tok, nt);
    int p = (int)pg * PPW + tok;
    bool ok = p < npos;
    float4 v[GC / 4];
    const float *xp = x + (size_t)(ok ? (xrow ? __ldg(xrow + p) : p) : 0) * cols + u * 128 + f * (128 / FG) + tq * GC;
#pragma unroll
    for (int c = 0; c < GC / 4; c++)
        v[c] = ok ? __ldg(reinterpret_cast<const float4 *>(xp) + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    uint4 rec[KPG];
    float scale;
    h16_split<WT>(v, rec, &scale); /* every lane: the shuffles */
    if (!ok)
        return;
    const size_t run = (size_t)npad * 16;
    uint8_t *base = img + ((size_t)u * wide_runs<WT>() * npad + p) * 16 + 4 * tq;
#pragma unroll
    for (int k = 0; k < KPG; k++) { /* rec: hi b0, hi b1, lo b0, lo b1 */
        int ks = f * KPG + k;
        *reinterpret_cast<uint32_t *>(base + ((ks * 2 + 0) * 2 + 0) * run) = rec[k].x;
        *reinterpret_cast<uint32_t *>(base + ((ks * 2 + 0) * 2 + 1) * run) = rec[k].y;
        *reinterpret_cast<uint32_t *>(base + ((ks * 2 + 1) * 2 + 0) * run) = rec[k].z;
        *reinterpret_cast<uint32_t *>(base + ((ks * 2 + 1) * 2 + 1) * run) = rec[k].w;
    }
    if (tq == 0 && f == 0)
        xsc[(size_t)u * npad + p] = scale;
}

/* bf16 weights: a warp a (position, unit), lane (k-step lane >> 2, quad tq = lane & 3) splits
 * the four columns tc_xcol(tq, k-step) into three bf16 parts (bf16_split: the decode kernel's),
 * part s's pair (c, c+1) into run (k-step, s, 0) and (c+2, c+3) into run (k-step, s, 1) at byte
 * 4 tq: the k-slots the tiled records' A operands hold for those columns. */
__global__ void wide_split_bf16_kernel(const float *x, const int32_t *xrow, int npos, int npad, int cols, uint8_t *img)
{
    wide_split_start();
    int units = cols / 128, lane = threadIdx.x & 31;
    size_t gw = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int u = (int)(gw % units);
    size_t p = gw / units;
    if (p >= (size_t)npos)
        return; /* whole warps */
    int ks = lane >> 2, tq = lane & 3;
    const float *xp = x + (size_t)(xrow ? __ldg(xrow + p) : (int)p) * cols + u * 128 + tc_xcol(tq, ks);
    uint2 q[3];
    bf16_split(__ldg(reinterpret_cast<const float4 *>(xp)), q);
    const size_t run = (size_t)npad * 16;
    uint8_t *base = img + ((size_t)u * wide_runs<WT_BF16>() * npad + p) * 16 + 4 * tq;
#pragma unroll
    for (int s = 0; s < 3; s++) {
        *reinterpret_cast<uint32_t *>(base + ((ks * 3 + s) * 2 + 0) * run) = q[s].x;
        *reinterpret_cast<uint32_t *>(base + ((ks * 3 + s) * 2 + 1) * run) = q[s].y;
    }
}

/* wgmma m64n64k16 of run pairs (k-step ks, part s) of the stage's B image into d, the A
 * operands wa[j] for k-steps ks0 + j, parts in turn (WT's: two fp16, or three bf16): the decode
 * kernel's order */
template <int KS, int WT = WT_F8>
__device__ __forceinline__ void wide_mmas(float (&d)[8][4], uint32_t (&wa)[KS][4], uint32_t bbase, int ks0)
{
    constexpr int P = wide_parts<WT>();
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            wg_keep(d[t][e]);
    wg_fence();
#pragma unroll
    for (int j = 0; j < KS; j++)
#pragma unroll
        for (int s = 0; s < P; s++) {
            uint32_t addr = bbase + ((ks0 + j) * P + s) * 2 * WIDE_B_HALF;
            wg_mma64<WT == WT_BF16>(d, wa[j], wg_desc(addr, WIDE_B_HALF, 8 * 16));
        }
    wg_commit();
    wg_wait0();
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            wg_keep(d[t][e]);
#pragma unroll
    for (int j = 0; j < KS; j++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            wg_keep(wa[j][r]);
}

/* Block (row block blockIdx.x of 64 rows, token tile blockIdx.y; grouped: blockIdx.x also picks
 * w1 or w3, blockIdx.y one expert's tile; bf16: token tile blockIdx.x, row block blockIdx.y):
 * wide_form's stages, the units after the one computed in flight; warp w's rows 16 w .. 16 w + 15
 * (warpgroup w / 4 takes its warps' rows). */
template <int WT, bool GROUPED>
__global__ void __launch_bounds__(wide_form<GROUPED, WT>::THREADS,
                                  WT == WT_F4 && wide_form<GROUPED, WT>::WGS == 1 ? 3 : 1)
    gemv_wide_kernel(gemv_args a, group_args g, const uint8_t *img, const float *xsc_all, int npad)
{
#if TC_HAVE_WGMMA
    using F = wide_form<GROUPED, WT>;
    constexpr int WSTAGE = wide_w_stage<WT, GROUPED>(), STAGE = wide_stage<WT, GROUPED>();
    constexpr int B_UNIT = wide_b_unit<WT>(), RUNS = wide_runs<WT>();
    constexpr int S = F::STAGES, NTH = F::THREADS, TILES = F::ROWS / TC_ROWS; /* fp4, bf16: weight tiles a block */
    static_assert(WT == WT_F8 || (WT == WT_F4 && GROUPED) || (WT == WT_BF16 && !GROUPED),
                  "fp8 weights, the experts' tiled fp4, or tiled bf16");
    extern __shared__ __align__(128) uint8_t wsm_[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    int units = a.cols / 128, p0, m, rb;
    if constexpr (GROUPED) {
        int e, t0;
        if (!group_tile(g, blockIdx.y, WIDE_TOK, &e, &t0))
            return;
        int mi = blockIdx.x >= (unsigned)g.row_tiles;
        p0 = __ldg(g.offs + e) + t0;
        m = min(__ldg(g.offs + e + 1) - p0, WIDE_TOK);
        const void *const *ws = mi ? g.w[1] : g.w[0], *const *ss = mi ? g.scale[1] : g.scale[0];
        a.w = (const uint8_t *)ws[e];
        a.scale = ss ? ss[e] : NULL;
        a.y = mi ? g.y[1] : g.y[0];
        rb = ((int)blockIdx.x - mi * g.row_tiles) * F::ROWS;
    } else if constexpr (WT == WT_BF16) {
        p0 = blockIdx.x * WIDE_TOK;
        m = min(a.n - p0, WIDE_TOK);
        rb = a.row_begin + blockIdx.y * F::ROWS;
    } else {
        p0 = blockIdx.y * WIDE_TOK;
        m = min(a.n - p0, WIDE_TOK);
        rb = a.row_begin + blockIdx.x * F::ROWS;
    }
    int rg = 16 * warp + gr; /* the lane's rows rg and rg + 8 of the block */
    /* fp4: the matrix's last row tile; bf16: the tile of the range's last row (the weight's rows
     * are whole tiles) */
    const int tile_last = WT == WT_BF16 ? (a.row_end - 1) / TC_ROWS : a.row_end / TC_ROWS - 1;
    const size_t b_round = (size_t)(NTH / 64) * npad * 16; /* a round's runs of the split x */
    auto load = [&](int s, int u) {
        uint8_t *st = wsm_ + s * STAGE;
        if constexpr (WT == WT_F4) { /* the tiles' 2 KB each, then their 128 bytes of scale words each */
#pragma unroll
            for (int i = 0; i < TILES * TC_F4_TILE_BYTES / 16 / NTH; i++) {
                int q = threadIdx.x + NTH * i, t = q >> 7, rt = min(rb / TC_ROWS + t, tile_last);
                cp_async16(st + TC_F4_TILE_BYTES * t + 16 * (q & 127),
                           a.w + ((size_t)rt * units + u) * TC_F4_TILE_BYTES + 16 * (q & 127));
            }
            if (threadIdx.x < TILES * TC_F4_TILE_SCALE_BYTES / 16) {
                int t = threadIdx.x >> 3, rt = min(rb / TC_ROWS + t, tile_last);
                cp_async16(st + TILES * TC_F4_TILE_BYTES + TC_F4_TILE_SCALE_BYTES * t + 16 * (threadIdx.x & 7),
                           reinterpret_cast<const uint8_t *>(a.scale) +
                               ((size_t)rt * units + u) * TC_F4_TILE_SCALE_BYTES + 16 * (threadIdx.x & 7));
            }
        } else if constexpr (WT == WT_BF16) { /* the block's tiles of the unit, 8 KB each, as they lie */
            constexpr int PT = TC_BF16_TILE_BYTES / 16; /* pieces a tile */
#pragma unroll
            for (int i = 0; i < TILES * PT / NTH; i++) {
                int q = threadIdx.x + NTH * i, t = q / PT, rt = min(rb / TC_ROWS + t, tile_last);
                cp_async16(st + TC_BF16_TILE_BYTES * t + 16 * (q % PT),
                           a.w + ((size_t)rt * units + u) * TC_BF16_TILE_BYTES + 16 * (q % PT));
            }
        } else {
#pragma unroll
            for (int i = 0; i < WSTAGE / 16 / NTH; i++) {
                int p = threadIdx.x + NTH * i, r = p >> 3, ch = p & 7;
                int row = min(rb + r, a.row_end - 1);
                cp_async16(st + r * 128 + 16 * (ch ^ ((r & 1) << 2)),
                           a.w + (size_t)row * a.row_bytes + u * 128 + 16 * ch);
            }
        }
        /* piece q = threadIdx.x + NTH i: run q / 64, token q % 64 (NTH / 64 runs a round) */
        const uint8_t *src = img + (((size_t)u * RUNS + (threadIdx.x >> 6)) * npad + p0 + (threadIdx.x & 63)) * 16;
#pragma unroll
        for (int i = 0; i < (B_UNIT / 16 + NTH - 1) / NTH; i++)
            if ((B_UNIT / 16) % NTH == 0 || threadIdx.x + NTH * i < B_UNIT / 16)
                cp_async16(st + WSTAGE + 16 * (threadIdx.x + NTH * i), src + i * b_round);
        if (WT != WT_BF16 && threadIdx.x < WIDE_TOK)
            cp_async4(st + WSTAGE + B_UNIT + 4 * threadIdx.x, xsc_all + (size_t)u * npad + p0 + threadIdx.x);
    };
    float part[8][4], pc[8][4], tot[8][4];
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            part[t][e] = pc[t][e] = tot[t][e] = 0.0f;
    const int srow = min(rb + rg, a.row_end - 1); /* fp8: the row whose 128-row block scales the lane's rows */
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < units)
            load(s, s);
        cp_commit();
    }
    for (int u = 0; u < units; u++) {
        if (u + S - 1 < units)
            load((u + S - 1) % S, u + S - 1);
        cp_commit();
        cp_wait<S - 1>();
        wg_fence_proxy(); /* the copies, read by wgmma's proxy */
        __syncthreads();
        const uint8_t *st = wsm_ + (u % S) * STAGE;
        uint32_t bbase = (uint32_t)__cvta_generic_to_shared(st + WSTAGE);
        const float *xsc = reinterpret_cast<const float *>(st + WSTAGE + B_UNIT);
        if constexpr (WT == WT_BF16) {
            /* the warp's 16 rows: row half warp & 1 of tile warp >> 1, a record a k-step (its A
             * operand as the decode kernel reads it); the unit's partial added to the chunk's sum */
            const uint4 *rec = reinterpret_cast<const uint4 *>(st + TC_BF16_TILE_BYTES * (warp >> 1)) + 32 * (warp & 1) +
                               lane;
            uint32_t wa[8][4];
#pragma unroll
            for (int ks = 0; ks < 8; ks++) {
                uint4 h = rec[64 * ks];
                wa[ks][0] = h.x, wa[ks][1] = h.y, wa[ks][2] = h.z, wa[ks][3] = h.w;
            }
            wide_mmas<8, WT_BF16>(part, wa, bbase, 0);
#pragma unroll
            for (int t = 0; t < 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    pc[t][e] = fmaf(part[t][e], 1.0f, pc[t][e]);
                    part[t][e] = 0.0f;
                }
        } else if constexpr (WT == WT_F4) {
            /* the warp's 16 rows: rows 16 mt + (g, g + 8) of tile warp / 2, the lane's words of
             * a fold group's columns 8 tq .. 8 tq + 7 in the tile's 16-byte record of that group
             * and lane (rows g, g + 8, g + 16, g + 24) */
            const int mt = warp & 1;
            const uint8_t *tile = st + TC_F4_TILE_BYTES * (warp >> 1);
            const uint32_t *sct = reinterpret_cast<const uint32_t *>(st + TILES * TC_F4_TILE_BYTES +
                                                                     TC_F4_TILE_SCALE_BYTES * (warp >> 1));
            uint32_t sw0 = sct[16 * mt + gr], sw1 = sct[16 * mt + gr + 8];
            float pu[8][4];
            /* fold group f's A operands (k-steps 2 f, 2 f + 1: a0 a2 of row g, a1 a3 of row g + 8) */
            auto decode = [&](int f, uint32_t(&wa)[2][4]) {
                uint2 wv = *reinterpret_cast<const uint2 *>(tile + 16 * (32 * f + lane) + 8 * mt);
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    f4_word_h16<true>(wv.x, hf, wa[hf][0], wa[hf][2]);
                    f4_word_h16<true>(wv.y, hf, wa[hf][1], wa[hf][3]);
                }
            };
            /* group f's partial times its rows' scales into the unit's */
            auto fold = [&](int f, float(&d)[8][4]) {
                float w0 = duet_d_e8m0_to_f32((uint8_t)(sw0 >> (8 * f)));
                float w1 = duet_d_e8m0_to_f32((uint8_t)(sw1 >> (8 * f)));
#pragma unroll
                for (int t = 0; t < 8; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float w = (e >> 1) ? w1 : w0;
                        pu[t][e] = f ? fmaf(d[t][e], w, pu[t][e]) : d[t][e] * w;
                        d[t][e] = 0.0f;
                    }
            };
#pragma unroll
            for (int f = 0; f < 4; f++) {
                uint32_t wa[2][4];
                decode(f, wa);
                wide_mmas<2>(part, wa, bbase, 2 * f);
                fold(f, part);
            }
#pragma unroll
            for (int t = 0; t < 8; t++) {
                float xa = xsc[8 * t + 2 * tq], xb1 = xsc[8 * t + 2 * tq + 1];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pc[t][e] = fmaf(pu[t][e], (e & 1) ? xb1 : xa, pc[t][e]);
            }
        } else {
            uint32_t wa[8][4];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint4 w0 = *reinterpret_cast<const uint4 *>(st + rg * 128 + 16 * ((4 * j + tq) ^ ((rg & 1) << 2)));
                uint4 w1 =
                    *reinterpret_cast<const uint4 *>(st + (rg + 8) * 128 + 16 * ((4 * j + tq) ^ (((rg + 8) & 1) << 2)));
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    uint32_t x0 = u4_word(w0, q), x1 = u4_word(w1, q);
                    int ks = 4 * j + q;
                    wa[ks][0] = f8_pair_h16(x0 & 0xffffu);
                    wa[ks][1] = f8_pair_h16(x1 & 0xffffu);
                    wa[ks][2] = f8_pair_h16(x0 >> 16);
                    wa[ks][3] = f8_pair_h16(x1 >> 16);
                }
            }
            float ws = scale_load(a.scale, a.scale_f32, (size_t)(srow / 128) * a.scale_cols + u);
            wide_mmas<8>(part, wa, bbase, 0);
#pragma unroll
            for (int t = 0; t < 8; t++) {
                float xa = xsc[8 * t + 2 * tq], xb1 = xsc[8 * t + 2 * tq + 1];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    pc[t][e] = fmaf(part[t][e], ws * ((e & 1) ? xb1 : xa), pc[t][e]);
                    part[t][e] = 0.0f;
                }
            }
        }
        if ((u + 1) % TC_CHUNK_UNITS == 0 || u + 1 == units)
#pragma unroll
            for (int t = 0; t < 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[t][e] = fmaf(pc[t][e], 1.0f, tot[t][e]);
                    pc[t][e] = 0.0f;
                }
        __syncthreads(); /* the stage is read before the next unit's copies overwrite it */
    }
    int m_out = a.row_end - a.row_begin;
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = rb + rg + 8 * (e >> 1), tok = 8 * t + 2 * tq + (e & 1);
            if (row < a.row_end && tok < m)
                a.y[(size_t)(p0 + tok) * m_out + (row - a.row_begin)] = tot[t][e];
        }
#endif
}

static bool wide_arch(const duet_cuda_t *c) { return c->info.cc_major == 9 && c->info.cc_minor == 0; }

/* what every plain wide launch needs: sm_90, whole units, rows from a warpgroup's boundary, aligned */
static bool wide_plain_ok(const duet_cuda_t *c, const duet_weight_t *w, int row_begin, const float *x)
{
    return wide_arch(c) && w->cols % 128 == 0 && row_begin % WIDE_WG_ROWS == 0 && (uintptr_t)x % 16 == 0 &&
           (uintptr_t)w->data % 16 == 0;
}

static bool wide_ok(const duet_cuda_t *c, const duet_weight_t *w, int row_begin, const float *x, int n)
{
    return TC_WIDE_MIN_N > 0 && n >= TC_WIDE_MIN_N && w->dtype == DUET_DT_F8_E4M3 && !w->tiled &&
           !tc_own_chunks(w) && wide_plain_ok(c, w, row_begin, x);
}

/* bf16 weights in the tiled layout (the output head), where the blocks fill the GPU once at least:
 * fewer (1024 rows at 130 tokens: 24 blocks) measured slower than the decode kernel, which splits
 * such launches along the columns (docs/PERF.md).  Either gives a token the same bits. */
static bool wide_bf16_ok(const duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const float *x,
                         int n)
{
    size_t blocks = (size_t)duet_cdiv((size_t)(row_end > row_begin ? row_end - row_begin : 0),
                              wide_form<false, WT_BF16>::ROWS) * duet_cdiv((size_t)n, WIDE_TOK);
    return TC_WIDE_BF16_MIN_N > 0 && n >= TC_WIDE_BF16_MIN_N && w->dtype == DUET_DT_BF16 && w->tiled &&
           !tc_own_chunks(w) && wide_plain_ok(c, w, row_begin, x) && blocks >= (size_t)c->info.sm_count;
}

/* The grouped launches' experts (shaped like proto, tensor-core eligible: grouped_kind 1) at n
 * positions over E experts */
static bool wide_group_ok(const duet_cuda_t *c, const duet_weight_t *w, int n, int E)
{
    if (TC_WIDE_GROUP_MIN_AVG <= 0 || (long)n < (long)TC_WIDE_GROUP_MIN_AVG * E || !wide_arch(c) || w->cols % 128 ||
        tc_own_chunks(w))
        return false;
    if (w->dtype == DUET_DT_F8_E4M3)
        return !w->tiled;
    return w->dtype == DUET_DT_F4_E2M1X2 && w->tiled && w->scale_dtype == DUET_DT_F8_E8M0 && w->rows % TC_ROWS == 0;
}

/* x's npos positions (position p: row xrow[p], or p) split for the wide tiles into the context's
 * record buffer (grown on demand, kept) */
template <int WT>
static duet_status_t wide_split(duet_cuda_t *c, const float *x, const int32_t *xrow, int npos, int cols,
                                const uint8_t **img_out, const float **xsc_out, int *npad_out)
{
    int units = cols / 128, npad = (int)duet_round_up((size_t)npos, 8) + WIDE_TOK;
    size_t img_bytes = (size_t)units * wide_runs<WT>() * npad * 16, sc_bytes = WT == WT_BF16 ? 0 : (size_t)units * npad * 4;
    DUET_TRY(tc_grow(c, &c->tc_xrec, &c->tc_xrec_bytes, img_bytes + sc_bytes));
    uint8_t *img = (uint8_t *)c->tc_xrec;
    float *xsc = WT == WT_BF16 ? NULL : (float *)(img + img_bytes);
    if constexpr (WT == WT_BF16) { /* a warp a position and unit */
        size_t threads = (size_t)npos * units * 32;
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, wide_split_bf16_kernel, dim3(duet_cdiv(threads, 256)), dim3(256), 0, x,
                                            xrow, npos, npad, cols, img));
    } else {
        constexpr int PPW = 32 / (4 * h16_traits<WT>::FG);
        size_t threads = (size_t)duet_cdiv(npos, PPW) * units * 32;
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, wide_split_kernel<WT>, dim3(duet_cdiv(threads, 256)), dim3(256), 0, x,
                                            xrow, npos, npad, cols, img, xsc));
    }
    *img_out = img;
    *xsc_out = xsc;
    *npad_out = npad;
    return DUET_OK;
}

template <int WT, bool GROUPED>
static duet_status_t wide_kernel_launch(duet_cuda_t *c, dim3 grid, const gemv_args &a, const group_args &g,
                                        const uint8_t *img, const float *xsc, int npad)
{
    constexpr int smem = wide_form<GROUPED, WT>::STAGES * wide_stage<WT, GROUPED>();
    DUET_TRY(tc_smem(c, gemv_wide_kernel<WT, GROUPED>, smem,
                     WIDE_SMEM_BIT + (GROUPED ? 1 + (WT == WT_F4) : WT == WT_BF16 ? 3 : 0)));
    gemv_wide_kernel<WT, GROUPED><<<grid, wide_form<GROUPED, WT>::THREADS, smem, c->stream>>>(a, g, img, xsc, npad);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

/* A plain wide launch on x split by wide_split<WT> (fp8, or tiled bf16 with the token tile as the
 * grid's fastest index: gemv_wide_kernel) */
template <int WT>
static duet_status_t wide_run(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const float *x, int n,
                              float *y, const uint8_t *img, const float *xsc, int npad)
{
    if (row_end <= row_begin)
        return DUET_OK;
    gemv_args a;
    gemv_args_of(w, row_begin, row_end, x, n, y, &a);
    group_args g;
    memset(&g, 0, sizeof g);
    unsigned row_blocks = duet_cdiv((size_t)(row_end - row_begin), wide_form<false, WT>::ROWS);
    unsigned tok_tiles = duet_cdiv((size_t)n, WIDE_TOK);
    dim3 grid = WT == WT_BF16 ? dim3(tok_tiles, row_blocks) : dim3(row_blocks, tok_tiles);
    return wide_kernel_launch<WT, false>(c, grid, a, g, img, xsc, npad);
}

template <int WT>
static duet_status_t wide_launch(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const float *x,
                                 int n, float *y)
{
    if (row_end <= row_begin)
        return DUET_OK;
    const uint8_t *img = NULL;
    const float *xsc = NULL;
    int npad = 0;
    DUET_TRY(wide_split<WT>(c, x, NULL, n, w->cols, &img, &xsc, &npad));
    return wide_run<WT>(c, w, row_begin, row_end, x, n, y, img, xsc, npad);
}

/* The grouped launch in wide tiles (tiles64: moe_sort's 64-token tile prefix sums); n positions
 * over `nonempty` experts at most take n / 64 + nonempty tiles */
static duet_status_t wide_group_launch(duet_cuda_t *c, const gemv_args &a, group_args g, const int32_t *tiles64,
                                       const int32_t *xrow, int n, int n_mat, int nonempty)
{
    const uint8_t *img = NULL;
    const float *xsc = NULL;
    int npad = 0;
    g.tiles = tiles64;
    g.row_tiles = duet_cdiv(a.row_end, wide_form<true>::ROWS);
    dim3 grid((unsigned)(g.row_tiles * n_mat), (unsigned)(duet_cdiv(n, WIDE_TOK) + nonempty));
    if (a.tiled) {
        DUET_TRY(wide_split<WT_F4>(c, a.x, xrow, n, a.cols, &img, &xsc, &npad));
        return wide_kernel_launch<WT_F4, true>(c, grid, a, g, img, xsc, npad);
    }
    DUET_TRY(wide_split<WT_F8>(c, a.x, xrow, n, a.cols, &img, &xsc, &npad));
    return wide_kernel_launch<WT_F8, true>(c, grid, a, g, img, xsc, npad);
}

/* ---- dense fp8 launches of a decode step's size: a loading warp and computing warpgroups ----
 *
 * The decode kernel's blocks (one warpgroup, 128 rows) each split x again every unit and walk a
 * chain of copy wait, barrier, split, conversion, MMAs and their wait, two blocks an SM: at 32
 * tokens its fp8 launches read their weights at a third of copy bandwidth, waiting on that
 * chain (docs/PERF.md, "x split once and multicast to a cluster of blocks").  Here x is split
 * once ahead (wide_split: the same h16_split, so the same bits), and a block's roles are apart:
 * one thread of a loading warp only copies (the tensor memory accelerator: a unit's rows of the
 * block as one 2D box of a tensor map, the tile's split x image as another, its scales as a
 * bulk copy, all counted by the stage's full barrier; a copy of 128 bytes a row measured three
 * times slower than the decode kernel, each copy an instruction of the copy unit); warpgroups of
 * 64 TC_WS_MT rows each only compute, each on its own, with no barrier across the block: a
 * warpgroup waits for a stage's full barrier, converts its rows to fp16 operands, issues the
 * unit's MMAs (wgmma m64n32k16, B from the stage's image) and arrives at the stage's empty
 * barrier once they are done.  TC_WS_STAGES stages are in flight.  A block takes one chunk of
 * TC_CHUNK_UNITS units (a launch of more columns is split along them), so it keeps no running
 * total past the chunk's.  The arithmetic is the decode kernel's, in its order (a unit's
 * partial over k-steps and parts, times the block scale and the token's x scale into the
 * chunk's; the chunks' partials added in order to 0), so every output has the decode kernel's
 * bits.  n from TC_WS_MIN_N to 32 tokens (one tile of 32; 0: never), sm_90a. */
#ifndef TC_WS_MIN_N
#define TC_WS_MIN_N 17
#endif
#ifndef TC_WS_STAGES
#define TC_WS_STAGES 4
#endif
/* m64 row tiles a warpgroup: 1 (four warpgroups a block, 96 registers: a block's 17 warps put
 * five on one scheduler, whose quarter of the register file holds them) or 2 (two warpgroups,
 * 151 registers; on the H200 the same for wq_b, 8% slower for wo_b, docs/PERF.md); a build
 * setting, for timing variants */
#ifndef TC_WS_MT
#define TC_WS_MT 1
#endif
/* The forms a launch may take: WS_WGS_MAX warpgroups a block, or half, or a quarter; the most
 * whose blocks number at least TC_WS_MIN_FILL percent of the SMs.  A launch that no form fills
 * that far keeps the decode kernel (at 40% the small projections of a layer came here too, and
 * their multi launch took 44 us instead of 23; at most two or one warpgroups a block measured
 * 5-9% slower on wq_b and wo_b). */
#ifndef TC_WS_MIN_FILL
#define TC_WS_MIN_FILL 90
#endif
#ifndef TC_WS_WGS_MAX
#define TC_WS_WGS_MAX (4 / TC_WS_MT)
#endif
#define WS_WGS_MAX TC_WS_WGS_MAX
/* The paired form: blocks of two warpgroups and TC_WS_PAIR_STAGES stages, two an SM (96
 * registers, 99 KB of shared memory each), so that an SM has 2 TC_WS_PAIR_STAGES stages in flight
 * where a block of four warpgroups has TC_WS_STAGES; taken by the launches whose blocks of that form
 * fill TC_WS_MIN_FILL percent of twice the SMs (on the H200 at 32 tokens: wo_b 4096 x 8192 25.0 ->
 * 23.2 us, wq_b 32768 x 1024 19.2 -> 18.7; the launches of fewer rows, which it cannot fill, 50%
 * slower with it, so they keep the forms above; docs/PERF.md).  0: never (a build setting). */
#ifndef TC_WS_PAIR
#define TC_WS_PAIR 1
#endif
#ifndef TC_WS_PAIR_STAGES
#define TC_WS_PAIR_STAGES 3
#endif
#define WS_PAIR (TC_WS_PAIR && TC_WS_MT == 1)
#define WS_PLAN_PAIR 8 /* ws_plan's answer for the paired form */
#define WS_TOK 32 /* tokens a tile: wgmma's N */
static_assert((TC_WS_MT == 1 || TC_WS_MT == 2) && (WS_WGS_MAX == 1 || WS_WGS_MAX == 2 || WS_WGS_MAX * TC_WS_MT == 4),
              "one or two row tiles a warpgroup, at most 256 rows a block");
template <int WGS, bool PAIR = false> struct ws_form {
    static constexpr int ROWS = 64 * TC_WS_MT * WGS, THREADS = 128 * WGS + 32, BLOCKS = PAIR ? 2 : 1;
    static constexpr int S = PAIR ? TC_WS_PAIR_STAGES : TC_WS_STAGES;
    static constexpr int WB = ROWS * 128;       /* a stage's weights: its rows' unit, 128 bytes each */
    static constexpr int BB = 32 * WS_TOK * 16; /* the unit's split x: 32 runs of the tile's tokens */
    static constexpr int SB = WS_TOK * 4;       /* the tokens' x scales */
    static constexpr int STAGE = WB + BB + SB;
    static constexpr int SMEM = 256 + S * STAGE; /* barriers first, stages from a 128-byte boundary */
    static_assert(ROWS <= 256 && STAGE % 128 == 0 && WB % 128 == 0 && BB % 128 == 0, "a box, stages on 128 bytes");
    /* the 2 S barriers and the reduction's flag in the first 128 bytes */
    static_assert(S >= 2 && S <= 7, "two to seven stages");
};
static_assert(ws_form<WS_WGS_MAX>::SMEM <= 227 * 1024, "the largest form's stages fit an SM");
static_assert(!WS_PAIR || 2 * (ws_form<2, true>::SMEM + 1024) <= 228 * 1024,
              "two blocks of the paired form fit an SM");

/* f(mt, j, k) over a warpgroup's [MT][J][4] values (an accumulator's [row tile][8-token tile][4],
 * or the A operands' [row tile][k-step][4]) */
template <int MT, int J = 4, class F> __device__ __forceinline__ void ws_each(F &&f)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                f(mt, j, k);
}

template <int WGS, bool PAIR>
__global__ void __launch_bounds__(ws_form<WGS, PAIR>::THREADS, ws_form<WGS, PAIR>::BLOCKS)
    gemv_ws_kernel(gemv_args a, tc_split sp, const __grid_constant__ CUtensorMap wmap,
                   const __grid_constant__ CUtensorMap xmap, const float *xsc_all, int npad)
{
#if TC_HAVE_WGMMA
    using F = ws_form<WGS, PAIR>;
    constexpr int S = F::S, MT = TC_WS_MT;
    extern __shared__ __align__(128) uint8_t wsm_[];
    /* full[s] at 8 s, empty[s] at 8 (S + s), the reduction's flag at 8 * 2 S; the stages from the
     * next 128-byte boundary on */
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(wsm_);
    const uint32_t st0 = (bar0 + 128 + 127) & ~127u;
    uint8_t *const stg = wsm_ + (st0 - bar0);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int units = a.cols / 128, ub = blockIdx.z * TC_CHUNK_UNITS, nu = min(TC_CHUNK_UNITS, units - ub);
    const int rb = a.row_begin + blockIdx.x * F::ROWS, p0 = blockIdx.y * WS_TOK, m = min(a.n - p0, WS_TOK);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mb_init(bar0 + 8 * s, 1);
            mb_init(bar0 + 8 * (S + s), 4 * WGS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == 4 * WGS) {
        /* the loading warp's first lane: a unit's rows of the block (rows past the weight's range
         * arrive as zeros), then the unit's runs of the split x and the tile's scales */
        if (lane != 0)
            duet_pdl_wait();
        else {
            auto weights = [&](int u, uint32_t st, uint32_t full) { tma_2d(st, &wmap, 128 * u, rb, full); };
            /* x's units for the block's rows (a block's rows lie in one group: ws_blockdiag_ok) */
            const int xu0 = a.xg_rows ? (rb - a.row_begin) / a.xg_rows * a.xg_units : 0;
            auto xpart = [&](int u, uint32_t st, uint32_t full) {
                tma_2d(st + F::WB, &xmap, 2 * p0, 32 * (xu0 + u), full);
                bulk_g2s(st + F::WB + F::BB, xsc_all + (size_t)(xu0 + u) * npad + p0, F::SB, full);
            };
            /* the first stages' weights before the wait for the kernel ahead (no operation writes
             * them), their split x after it */
            const int pre = min(S, nu);
            for (int i = 0; i < pre; i++) {
                mb_expect(bar0 + 8 * i, F::STAGE);
                weights(ub + i, st0 + i * F::STAGE, bar0 + 8 * i);
            }
            duet_pdl_wait();
            for (int i = 0; i < pre; i++)
                xpart(ub + i, st0 + i * F::STAGE, bar0 + 8 * i);
            for (int i = pre; i < nu; i++) {
                int s = i % S;
                uint32_t st = st0 + s * F::STAGE, full = bar0 + 8 * s;
                mb_wait(bar0 + 8 * (S + s), (unsigned)(i / S - 1) & 1u);
                mb_expect(full, F::STAGE);
                weights(ub + i, st, full);
                xpart(ub + i, st, full);
            }
        }
    } else {
        duet_pdl_wait(); /* y may be read by the kernels ahead */
        /* warpgroup wg's row tiles mt, warp wq's 16 rows of each: the lane's rows rg[mt], rg[mt] + 8 */
        const int wg = warp >> 2, wq = warp & 3, gr = lane >> 2, tq = lane & 3, odd = gr & 1;
        int rg[MT];
        size_t sc0[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            rg[mt] = 64 * (MT * wg + mt) + 16 * wq + gr;
            sc0[mt] = (size_t)(min(rb + rg[mt], a.row_end - 1) / 128) * a.scale_cols; /* its 128-row block's scales */
        }
        float part[MT][4][4], pc[MT][4][4];
        ws_each<MT>([&](int mt, int t, int e) { part[mt][t][e] = pc[mt][t][e] = 0.0f; });
        for (int i = 0; i < nu; i++) {
            const int u = ub + i, s = i % S;
            float ws[MT];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ws[mt] = scale_load(a.scale, a.scale_f32, sc0[mt] + u);
            mb_wait(bar0 + 8 * s, (unsigned)(i / S) & 1u);
            const uint8_t *st = stg + s * F::STAGE;
            uint32_t wa[MT][8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                /* the rows' 16-byte chunks tq and 4 + tq; odd rows read the second first, so that a
                 * quarter warp's two rows fall on distinct banks */
                const uint8_t *r0 = st + 128 * rg[mt] + 16 * tq, *r1 = r0 + 128 * 8;
                uint4 a0 = *reinterpret_cast<const uint4 *>(r0 + 64 * odd);
                uint4 b0 = *reinterpret_cast<const uint4 *>(r0 + 64 * (odd ^ 1));
                uint4 a1 = *reinterpret_cast<const uint4 *>(r1 + 64 * odd);
                uint4 b1 = *reinterpret_cast<const uint4 *>(r1 + 64 * (odd ^ 1));
                uint4 w0[2] = {odd ? b0 : a0, odd ? a0 : b0}, w1[2] = {odd ? b1 : a1, odd ? a1 : b1};
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        uint32_t x0 = u4_word(w0[j], q), x1 = u4_word(w1[j], q);
                        int ks = 4 * j + q;
                        wa[mt][ks][0] = f8_pair_h16(x0 & 0xffffu);
                        wa[mt][ks][1] = f8_pair_h16(x1 & 0xffffu);
                        wa[mt][ks][2] = f8_pair_h16(x0 >> 16);
                        wa[mt][ks][3] = f8_pair_h16(x1 >> 16);
                    }
            }
            const uint32_t bbase = st0 + s * F::STAGE + F::WB;
            ws_each<MT>([&](int mt, int t, int e) { wg_keep(part[mt][t][e]); });
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < 8; ks++)
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    uint32_t addr = bbase + (ks * 2 + p) * 2 * (WS_TOK * 16);
                    uint64_t desc = wg_desc(addr, WS_TOK * 16, 8 * 16);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        wg_mma<WT_F8>(part[mt], wa[mt][ks], desc);
                }
            wg_commit();
            wg_wait0();
            ws_each<MT>([&](int mt, int t, int e) { wg_keep(part[mt][t][e]); });
            ws_each<MT, 8>([&](int mt, int ks, int r) { wg_keep(wa[mt][ks][r]); });
            const float *xsc = reinterpret_cast<const float *>(st + F::WB + F::BB);
            float xa[4], xb[4];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                xa[t] = xsc[8 * t + 2 * tq];
                xb[t] = xsc[8 * t + 2 * tq + 1];
            }
            __syncwarp();
            if (lane == 0)
                mb_arrive(bar0 + 8 * (S + s));
            ws_each<MT>([&](int mt, int t, int e) {
                pc[mt][t][e] = fmaf(part[mt][t][e], ws[mt] * ((e & 1) ? xb[t] : xa[t]), pc[mt][t][e]);
                part[mt][t][e] = 0.0f;
            });
        }
        /* the chunk's total (the decode kernel's running total, from 0), to y, or when the launch is
         * split along the columns to the chunk's partial */
        int m_out = a.row_end - a.row_begin;
        float *dst = sp.chunks <= 1 ? a.y : sp.part + blockIdx.z * (size_t)a.n * m_out;
        ws_each<MT>([&](int mt, int t, int e) {
            int row = rb + rg[mt] + 8 * (e >> 1), tok = 8 * t + 2 * tq + (e & 1);
            if (row < a.row_end && tok < m)
                dst[(size_t)(p0 + tok) * m_out + (row - a.row_begin)] = fmaf(pc[mt][t][e], 1.0f, 0.0f);
        });
    }
    if (sp.chunks <= 1 || !sp.count) /* no count: ws_sum_kernel adds the partials after the launch */
        return;
    /* the tile's last block to finish adds the chunks' partials in order: a thread a row */
    const int tile_id = blockIdx.y * gridDim.x + blockIdx.x;
    if (!splitk_last(sp, tile_id, reinterpret_cast<int *>(wsm_ + 16 * S)))
        return;
    int m_out = a.row_end - a.row_begin;
    size_t plane = (size_t)a.n * m_out;
    /* a thread a row and half of the tile's tokens (the other half in a second pass) */
    constexpr int H = WS_TOK / 2;
    for (int r = threadIdx.x; r < 2 * F::ROWS; r += F::THREADS) {
        int row = rb + r % F::ROWS, k0 = H * (r / F::ROWS);
        if (row >= a.row_end || k0 >= m)
            continue;
        size_t o = (size_t)(p0 + k0) * m_out + (row - a.row_begin);
        splitk_sum<H>(sp, plane, o, m_out, a.y, [&](int k) { return k0 + k < m; });
    }
    if (threadIdx.x == 0)
        sp.count[tile_id] = 0;
#endif
}

/* Whether `name` is set to a value starting with 0 in the environment */
static bool env_zero(const char *name)
{
    const char *e = getenv(name);
    return e && e[0] == '0';
}

/* A split loading-warp launch's chunk sum as a dependent launch of its own: a thread an output of
 * the `outputs` (n x m_out, [token][row]), the `chunks` partials `plane` floats apart added in
 * chunk order from 0, as splitk_sum adds them, so the same bits.  It lets the launch after it be
 * scheduled at once, whose weight loads before its wait then overlap the sum.  Spread over the
 * SMs it takes 1-3 us off each split launch whose tiles' last blocks summed through one SM each
 * (at 32 tokens on an H100: wo_b 4096 x 8192 24.9 -> 22.1 us, docs/PERF.md). */
__global__ void __launch_bounds__(256) ws_sum_kernel(tc_split sp, float *y, size_t plane, size_t outputs)
{
    duet_pdl_launch_dependents();
    duet_pdl_wait();
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= outputs)
        return;
    /* the loop of splitk_sum at one output, without its `unroll 2` (which keeps a K-wide sum's
     * registers down): this way every chunk's load is in flight at once (sixteen a pass), as in
     * the form measured; with splitk_sum<1> two were, a round trip to L2 for every two chunks */
    float v = 0.0f;
    for (int z = 0; z < sp.chunks; z++)
        v += __ldcg(sp.part + z * plane + o);
    y[o] = v;
}

/* DUET_CUDA_WS_SUM=0 in the environment keeps the split loading-warp launches' chunk sum with
 * each tile's last block instead of ws_sum_kernel (timing variants) */
static bool ws_sum_env_on()
{
    static const bool on = !env_zero("DUET_CUDA_WS_SUM");
    return on;
}

/* DUET_CUDA_WS=0 in the environment keeps the decode kernel for these launches (timing variants) */
static bool ws_env_on()
{
    static const bool on = !env_zero("DUET_CUDA_WS");
    return on;
}

/* DUET_CUDA_WS_PAIR=0 in the environment keeps the paired form from every launch (timing variants) */
static bool ws_pair_env_on()
{
    static const bool on = !env_zero("DUET_CUDA_WS_PAIR");
    return on;
}

/* The warpgroups a block of a launch of `rows` rows over `cols` columns takes, WS_PLAN_PAIR for the
 * paired form (0: the launch keeps the decode kernel); every launch of more than a chunk is split
 * along the chunks */
static int ws_plan(const duet_cuda_t *c, int rows, int cols)
{
    long chunks = duet_cdiv((size_t)(cols / 128), TC_CHUNK_UNITS);
    int sms = c->info.sm_count > 0 ? c->info.sm_count : 1;
    if (WS_PAIR && ws_pair_env_on() &&
        (long)duet_cdiv((size_t)rows, ws_form<2, true>::ROWS) * chunks * 100 >= 2L * sms * TC_WS_MIN_FILL)
        return WS_PLAN_PAIR;
    for (int wgs = WS_WGS_MAX; wgs >= 1; wgs /= 2)
        if ((long)duet_cdiv((size_t)rows, (size_t)(64 * TC_WS_MT * wgs)) * chunks * 100 >= (long)sms * TC_WS_MIN_FILL)
            return wgs;
    return 0;
}

/* fp8 weights in the checkpoint's layout at TC_WS_MIN_N to 32 tokens, sm_90 */
static bool ws_ok(const duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const float *x, int n)
{
    return TC_WS_MIN_N > 0 && n >= TC_WS_MIN_N && n <= WS_TOK && w->dtype == DUET_DT_F8_E4M3 && !w->tiled &&
           !tc_own_chunks(w) && wide_arch(c) && w->cols % 128 == 0 && row_begin % 16 == 0 &&
           (uintptr_t)x % 16 == 0 && (uintptr_t)w->data % 16 == 0 && ws_env_on() && row_end > row_begin &&
           ws_plan(c, row_end - row_begin, w->cols) > 0 && tma_encoder();
}

/* The L2 promotion of the weights' boxes (a box row is one unit's 128 bytes of a weight row, the
 * rows 1 KB or more apart): 256 (L2 fetches 256-byte runs, the next unit's half with it), 128, 64
 * or 0 (none); a build setting, for timing variants */
#ifndef TC_WS_L2_PROMO
#define TC_WS_L2_PROMO 256
#endif
static_assert(TC_WS_L2_PROMO == 0 || TC_WS_L2_PROMO == 64 || TC_WS_L2_PROMO == 128 || TC_WS_L2_PROMO == 256,
              "an L2 promotion the tensor maps know");
static CUtensorMapL2promotion ws_weight_promotion()
{
    return TC_WS_L2_PROMO == 256   ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
           : TC_WS_L2_PROMO == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
           : TC_WS_L2_PROMO == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                   : CU_TENSOR_MAP_L2_PROMOTION_NONE;
}

/* A 2D tensor map of `d1` rows of `d0` elements (`esize` bytes each) `stride` bytes apart, boxes of
 * b0 x b1, fetched into L2 with promotion `promo`; elements past its end read as zeros */
static duet_status_t ws_map(duet_cuda_t *c, CUtensorMap *m, const void *base, CUtensorMapDataType type, uint64_t d0,
                            uint64_t d1, uint64_t stride, uint32_t b0, uint32_t b1,
                            CUtensorMapL2promotion promo = CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
{
    cuuint64_t dims[2] = {d0, d1}, strides[1] = {stride};
    cuuint32_t box[2] = {b0, b1}, es[2] = {1, 1};
    CUresult r = tma_encoder()(m, type, 2, const_cast<void *>(base), dims, strides, box, es,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, promo,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return duet_cuda_failf(c, DUET_ERR_CUDA, "matmul: tensor map of %llu x %llu (stride %llu, box %u x %u): error %d",
                               (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)stride, b0, b1,
                               (int)r);
    return DUET_OK;
}

/* x_units: the split x's units (0: the weight's, as every launch but a block-diagonal one) */
template <int WGS, bool PAIR = false>
static duet_status_t ws_launch_form(duet_cuda_t *c, const gemv_args &a, const uint8_t *img, const float *xsc, int npad,
                                   int x_units = 0)
{
    using F = ws_form<WGS, PAIR>;
    DUET_TRY(tc_smem(c, gemv_ws_kernel<WGS, PAIR>, F::SMEM,
                     WIDE_SMEM_BIT + 4 + (PAIR ? 3 : WGS == 4 ? 2 : WGS == 2 ? 1 : 0)));
    int rows = a.row_end - a.row_begin, units = a.cols / 128, xu = x_units > 0 ? x_units : units;
    int chunks = (int)duet_cdiv((size_t)units, TC_CHUNK_UNITS);
    /* the weight's rows 0 .. row_end - 1 (boxes of a unit's 128 bytes by the block's rows); the
     * split x as [unit][run] rows of npad positions' 16 bytes (boxes of 32 positions by 32 runs) */
    CUtensorMap wmap, xmap;
    DUET_TRY(ws_map(c, &wmap, a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, (uint64_t)a.cols, (uint64_t)a.row_end, a.row_bytes,
                    128, F::ROWS, ws_weight_promotion()));
    DUET_TRY(ws_map(c, &xmap, img, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2 * (uint64_t)npad, 32 * (uint64_t)xu,
                    16 * (uint64_t)npad, 2 * WS_TOK, 32));
    unsigned row_blocks = duet_cdiv((size_t)rows, F::ROWS);
    /* split: the partials summed by ws_sum_kernel after the launch (no counters), or with
     * DUET_CUDA_WS_SUM=0 by each tile's last block (a counter a tile) */
    const bool sum_apart = chunks > 1 && ws_sum_env_on();
    tc_split sp = tc_split{NULL, NULL, 1};
    if (chunks > 1) {
        size_t part_bytes = sizeof(float) * (size_t)chunks * a.n * rows;
        DUET_TRY(tc_split_buffers(c, part_bytes, sum_apart ? 0 : (int)row_blocks, &sp));
        sp.chunks = chunks;
        if (sum_apart)
            sp.count = NULL;
    }
    dim3 grid(row_blocks, duet_cdiv((size_t)a.n, WS_TOK), chunks);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, gemv_ws_kernel<WGS, PAIR>, grid, dim3(F::THREADS), F::SMEM, a, sp, wmap, xmap,
                                        xsc, npad));
    if (sum_apart) {
        /* the outputs are y's [token][row - row_begin] of m_out = rows, as the partials' (a plane
         * of them a chunk) */
        size_t outputs = (size_t)a.n * rows;
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, ws_sum_kernel, dim3(duet_cdiv(outputs, 256)), dim3(256), 0, sp, a.y,
                                            outputs, outputs));
    }
    return DUET_OK;
}

/* A launch on x split by wide_split<WT_F8> (ws_ok's shapes); group_rows > 0: a block-diagonal one
 * (duet_cuda_matmul_blockdiag), x's rows of groups * w->cols columns */
static duet_status_t ws_run(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const float *x, int n,
                            float *y, const uint8_t *img, const float *xsc, int npad, int group_rows = 0)
{
    gemv_args a;
    gemv_args_of(w, row_begin, row_end, x, n, y, &a);
    int xu = 0;
    if (group_rows > 0) {
        a.xg_rows = group_rows;
        a.xg_units = w->cols / 128;
        xu = (row_end - row_begin) / group_rows * a.xg_units;
    }
    switch (ws_plan(c, row_end - row_begin, w->cols)) {
#if WS_PAIR
    case WS_PLAN_PAIR: return ws_launch_form<2, true>(c, a, img, xsc, npad, xu);
#endif
    case 4: return ws_launch_form<WS_WGS_MAX == 4 ? 4 : 1>(c, a, img, xsc, npad, xu);
    case 2: return ws_launch_form<2>(c, a, img, xsc, npad, xu);
    default: return ws_launch_form<1>(c, a, img, xsc, npad, xu);
    }
}

/* The rows a block of the launch ws_plan picks takes */
static int ws_block_rows(const duet_cuda_t *c, int rows, int cols)
{
    switch (ws_plan(c, rows, cols)) {
#if WS_PAIR
    case WS_PLAN_PAIR: return ws_form<2, true>::ROWS;
#endif
    case 4: return ws_form<WS_WGS_MAX == 4 ? 4 : 1>::ROWS;
    case 2: return ws_form<2>::ROWS;
    case 1: return ws_form<1>::ROWS;
    default: return 0;
    }
}

static bool ws_blockdiag_ok(const duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, int group_rows,
                            const float *x, int n)
{
    if (c->exact || group_rows <= 0 || row_end <= row_begin || (row_end - row_begin) % group_rows ||
        row_end > w->rows || weight_kind(w) < 0 || !ws_ok(c, w, row_begin, row_end, x, n))
        return false;
    int br = ws_block_rows(c, row_end - row_begin, w->cols);
    return br > 0 && group_rows % br == 0; /* every block's rows in one group */
}

extern "C" int duet_cuda_matmul_blockdiag_ok(const duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                             int group_rows, const float *x, int n)
{
    return ws_blockdiag_ok(c, w, row_begin, row_end, group_rows, x, n);
}

extern "C" duet_status_t duet_cuda_matmul_blockdiag(duet_cuda_t *c, const duet_weight_t *w, int row_begin,
                                                    int row_end, int group_rows, const float *x, int n, float *y)
{
    if (!ws_blockdiag_ok(c, w, row_begin, row_end, group_rows, x, n))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "matmul_blockdiag: rows %d..%d in groups of %d, %d tokens (the loading-warp kernel's "
                               "fp8 launches of %d to %d tokens on sm_90, groups of whole blocks)",
                               row_begin, row_end, group_rows, n, TC_WS_MIN_N, WS_TOK);
    DUET_TRY(check_args(c, w, row_begin, row_end, n));
    int groups = (row_end - row_begin) / group_rows;
    const uint8_t *img = NULL;
    const float *xsc = NULL;
    int npad = 0;
    DUET_TRY(wide_split<WT_F8>(c, x, NULL, n, groups * w->cols, &img, &xsc, &npad));
    return ws_run(c, w, row_begin, row_end, x, n, y, img, xsc, npad, group_rows);
}

extern "C" int duet_cuda_matmul_invariant_tc(const duet_weight_t *w, int row_begin, const float *x)
{
    if (weight_kind(w) < 0)
        return 0;
    gemv_args a;
    gemv_args_of(w, row_begin, row_begin, x, 0, NULL, &a);
    return tc_eligible(a, weight_kind(w));
}

extern "C" duet_status_t duet_cuda_matmul_invariant(duet_cuda_t *c, const duet_weight_t *w, int row_begin,
                                                    int row_end, const float *x, int n, float *y)
{
    if (c->exact)
        return duet_cuda_exact_matmul(c, w, row_begin, row_end, x, n, y);
    if (duet_cuda_matmul_invariant_tc(w, row_begin, x)) {
        if (ws_ok(c, w, row_begin, row_end, x, n)) {
            DUET_TRY(check_args(c, w, row_begin, row_end, n));
            const uint8_t *img = NULL;
            const float *xsc = NULL;
            int npad = 0;
            DUET_TRY(wide_split<WT_F8>(c, x, NULL, n, w->cols, &img, &xsc, &npad));
            return ws_run(c, w, row_begin, row_end, x, n, y, img, xsc, npad);
        }
        if (wide_ok(c, w, row_begin, x, n)) {
            DUET_TRY(check_args(c, w, row_begin, row_end, n));
            return wide_launch<WT_F8>(c, w, row_begin, row_end, x, n, y);
        }
        if (wide_bf16_ok(c, w, row_begin, row_end, x, n)) {
            DUET_TRY(check_args(c, w, row_begin, row_end, n));
            return wide_launch<WT_BF16>(c, w, row_begin, row_end, x, n, y);
        }
        return duet_cuda_matmul_gemv_tc(c, w, row_begin, row_end, x, n, y);
    }
    return duet_cuda_matmul_gemv(c, w, row_begin, row_end, x, n, y);
}

extern "C" int duet_cuda_matmul_multi_ok(const duet_cuda_mm_part_t *parts, int n_parts, const float *x)
{
    if (n_parts < 1 || n_parts > DUET_CUDA_MULTI_MAX)
        return 0;
    for (int i = 0; i < n_parts; i++) {
        const duet_weight_t *w = parts[i].w;
        if (w->tiled || w->dtype != parts[0].w->dtype || w->cols != parts[0].w->cols ||
            tc_chunk_units(w) != tc_chunk_units(parts[0].w) ||
            (w->scale_dtype != parts[0].w->scale_dtype && w->scale) || parts[i].row_end <= parts[i].row_begin ||
            parts[i].row_end > w->rows || !duet_cuda_matmul_invariant_tc(w, parts[i].row_begin, x))
            return 0;
    }
    return 1;
}

extern "C" duet_status_t duet_cuda_matmul_multi(duet_cuda_t *c, const duet_cuda_mm_part_t *parts, int n_parts,
                                                const float *x, int n)
{
    if (c->exact) { /* a launch a part */
        for (int i = 0; i < n_parts; i++)
            DUET_TRY(duet_cuda_exact_matmul(c, parts[i].w, parts[i].row_begin, parts[i].row_end, x, n, parts[i].y));
        return DUET_OK;
    }
    if (!duet_cuda_matmul_multi_ok(parts, n_parts, x))
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "matmul_multi: %d parts not all tensor-core eligible weights of one dtype and width "
                               "(at most %d)", n_parts, DUET_CUDA_MULTI_MAX);
    for (int i = 0; i < n_parts; i++)
        DUET_TRY(check_args(c, parts[i].w, parts[i].row_begin, parts[i].row_end, n));
    if (n == 0)
        return DUET_OK;
    /* the parts that the wide tiles take (fp8 at prefill sizes) or the loading-warp kernel (fp8 at
     * a decode step's) there, x split once for them all: each part's bits are those of its own
     * launch either way */
    duet_cuda_mm_part_t rest[DUET_CUDA_MULTI_MAX];
    int n_rest = 0;
    const uint8_t *img = NULL;
    const float *xsc = NULL;
    int npad = 0;
    /* the loading-warp kernel only where it takes every part: beside a decode-kernel launch for
     * the rest it measured slower than one launch for all (docs/PERF.md) */
    bool all_ws = true;
    for (int i = 0; i < n_parts; i++)
        all_ws = all_ws && ws_ok(c, parts[i].w, parts[i].row_begin, parts[i].row_end, x, n);
    for (int i = 0; i < n_parts; i++) {
        bool ws = all_ws;
        if (!ws && !wide_ok(c, parts[i].w, parts[i].row_begin, x, n)) {
            rest[n_rest++] = parts[i];
            continue;
        }
        if (!img)
            DUET_TRY(wide_split<WT_F8>(c, x, NULL, n, parts[i].w->cols, &img, &xsc, &npad));
        if (ws)
            DUET_TRY(ws_run(c, parts[i].w, parts[i].row_begin, parts[i].row_end, x, n, parts[i].y, img, xsc, npad));
        else
            DUET_TRY(
                wide_run<WT_F8>(c, parts[i].w, parts[i].row_begin, parts[i].row_end, x, n, parts[i].y, img, xsc, npad));
    }
    if (n_rest == 0)
        return DUET_OK;
    parts = rest;
    n_parts = n_rest;
    gemv_args a;
    gemv_args_of(parts[0].w, parts[0].row_begin, parts[0].row_end, x, n, parts[0].y, &a);
    multi_args m;
    memset(&m, 0, sizeof m);
    m.n_parts = n_parts;
    for (int i = 0; i < n_parts; i++) {
        gemv_args pi;
        gemv_args_of(parts[i].w, parts[i].row_begin, parts[i].row_end, x, n, parts[i].y, &pi);
        m.w[i] = pi.w;
        m.scale[i] = pi.scale;
        m.scale_cols[i] = pi.scale_cols;
        m.row_begin[i] = pi.row_begin;
        m.row_end[i] = pi.row_end;
        m.row_bytes[i] = pi.row_bytes;
        m.y[i] = pi.y;
        m.tile0[i + 1] = m.tile0[i] + (int)duet_cdiv(pi.row_end - pi.row_begin, TC_BLOCK_ROWS);
    }
    switch (weight_kind(parts[0].w)) {
    case WT_BF16: DUET_TRY(gemv_tc_multi<WT_BF16>(c, a, m)); break;
    case WT_F8: DUET_TRY(gemv_tc_multi<WT_F8>(c, a, m)); break;
    default: DUET_TRY(gemv_tc_multi<WT_F4>(c, a, m)); break;
    }
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_matmul(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                          const float *x, int n, float *y)
{
    if (c->exact)
        return duet_cuda_exact_matmul(c, w, row_begin, row_end, x, n, y);
    if (c->invariant || w->tiled)
        return duet_cuda_matmul_invariant(c, w, row_begin, row_end, x, n, y);
    if (n > DUET_CUDA_GEMV_MAX_N || w->dtype == DUET_DT_F32) {
        duet_status_t st = duet_cuda_matmul_lt(c, w, row_begin, row_end, x, n, y);
        if (st != DUET_ERR_UNSUPPORTED)
            return st;
        /* no cuBLASLt algorithm for this shape: the decode kernels are correct at any n */
    }
    if (n >= (w->dtype == DUET_DT_F4_E2M1X2 ? DUET_CUDA_TC_MIN_N_FP4 : DUET_CUDA_TC_MIN_N)) {
        duet_status_t st = duet_cuda_matmul_gemv_tc(c, w, row_begin, row_end, x, n, y);
        if (st != DUET_ERR_UNSUPPORTED)
            return st;
    }
    return duet_cuda_matmul_gemv(c, w, row_begin, row_end, x, n, y);
}

/* ---- fp8 activations ---- */

/* One warp per 128-column block of four consecutive rows of x(n, k), its four loads issued
 * before any is used: scale amax/448 (1 for an all-zero block), e4m3 codes as
 * duet_f32_to_e4m3.  Rows n..n_pad (n_pad % 4 == 0) get code 0 and scale 1.  xq(n_pad, k)
 * bytes; sx(k/128, n_pad) floats, row index fastest (cuBLASLt's VEC128 layout), or
 * (n_pad, k/128) when row_major. */
#define ACT_QUANT_ROWS 4
__global__ void act_quant_kernel(const float *x, int n, int n_pad, int k, uint8_t *xq, float *sx, int row_major)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    int kb = k / 128;
    if (warp >= n_pad / ACT_QUANT_ROWS * kb)
        return;
    int row0 = warp / kb * ACT_QUANT_ROWS, b = warp % kb;
    float4 v[ACT_QUANT_ROWS];
#pragma unroll
    for (int i = 0; i < ACT_QUANT_ROWS; i++)
        v[i] = row0 + i < n ? *(const float4 *)(x + (size_t)(row0 + i) * k + b * 128 + lane * 4)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float s[ACT_QUANT_ROWS];
#pragma unroll
    for (int i = 0; i < ACT_QUANT_ROWS; i++) {
        s[i] = duet_d_act_scale(duet_warp_max(duet_d_amax4(v[i])));
        *(uint32_t *)(xq + (size_t)(row0 + i) * k + b * 128 + lane * 4) = duet_d_act_codes4(v[i], s[i]);
    }
    if (lane < ACT_QUANT_ROWS) { /* the column layout's four scales are one 16-byte line */
        float si = lane == 0 ? s[0] : lane == 1 ? s[1] : lane == 2 ? s[2] : s[3];
        sx[row_major ? (size_t)(row0 + lane) * kb + b : (size_t)b * n_pad + row0 + lane] = si;
    }
}
static_assert(ACT_QUANT_ROWS == 4, "act_quant_kernel picks its scales for four rows");

/* Weight block scales of rows [row_begin, row_end) -> f32 [m/128][kb_pad] (cuBLASLt's BLK128x128 layout). */
__global__ void wscale_kernel(const void *scale, int f32, int scale_cols, int block_row0, int n_brows, int kb,
                              int kb_pad, float *out, int transposed)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (!transposed) {
        if (i >= n_brows * kb_pad)
            return;
        int br = i / kb_pad, b = i % kb_pad;
        out[i] = b < kb ? scale_load(scale, f32, (size_t)(block_row0 + br) * scale_cols + b) : 1.0f;
    } else { /* [kb][n_brows padded to 4] */
        int nb_pad = (n_brows + 3) / 4 * 4;
        if (i >= kb * nb_pad)
            return;
        int b = i / nb_pad, br = i % nb_pad;
        out[i] = br < n_brows ? scale_load(scale, f32, (size_t)(block_row0 + br) * scale_cols + b) : 1.0f;
    }
}

extern "C" void duet_cuda_fp8_act_scale_layout(duet_cuda_t *c, int variant) { c->fp8_scale_layout = variant & 3; }

__global__ void bf16_to_f32_kernel(const __nv_bfloat16 *x, size_t n, float *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

extern "C" int duet_cuda_fp8_act_rows(int n) { return (n + ACT_QUANT_ROWS - 1) / ACT_QUANT_ROWS * ACT_QUANT_ROWS; }

static duet_status_t act_quant_run(duet_cuda_t *c, const float *x, int n, int k, uint8_t *xq, float *sx)
{
    int n_pad = duet_cuda_fp8_act_rows(n);
    unsigned warps = (unsigned)(n_pad / ACT_QUANT_ROWS * (k / 128));
    act_quant_kernel<<<duet_cdiv((size_t)warps * 32, 256), 256, 0, c->stream>>>(x, n, n_pad, k, xq, sx,
                                                                                c->fp8_scale_layout & 1);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_act_quant(duet_cuda_t *c, const float *x, int n, int k, uint8_t *xq, float *sx)
{
    if (n < 0 || k <= 0 || k % 128)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "act_quant: %d rows of %d columns (columns a multiple of 128)", n,
                               k);
    if (n && (!x || !xq || !sx || (uintptr_t)x % 16 || (uintptr_t)xq % 4 || (uintptr_t)sx % 16))
        return duet_cuda_failf(c, DUET_ERR_INVALID,
                               "act_quant: x, codes or scales missing or misaligned (16, 4, 16 bytes)");
    return n ? act_quant_run(c, x, n, k, xq, sx) : DUET_OK;
}

/* The weight's part of the fp8 GEMM's checks */
static duet_status_t fp8_gemm_args(duet_cuda_t *c, const char *op, const duet_weight_t *w, int row_begin, int row_end,
                                   int n)
{
    DUET_TRY(check_args(c, w, row_begin, row_end, n));
    if (w->dtype != DUET_DT_F8_E4M3 || w->cols % 128 || row_begin % 128 || c->info.cc_major < 9)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "%s: %s weight, %d columns, row_begin %d on sm_%d%d (needs fp8, "
                               "columns and row_begin multiples of 128, sm_90+)",
                               op, duet_dtype_name(w->dtype), w->cols, row_begin, c->info.cc_major, c->info.cc_minor);
    return DUET_OK;
}

/* the weight's block scales of m rows in cuBLASLt's layout: bytes, 256-aligned */
static size_t fp8_wscale_bytes(int m, int k)
{
    int kb_pad = (k / 128 + 3) / 4 * 4, n_brows = (m + 127) / 128;
    return duet_round_up((size_t)(n_brows + 3) * kb_pad * 4, 256);
}

static size_t fp8_gemm_scratch(int m, int n, int k)
{
    return fp8_wscale_bytes(m, k) + (size_t)m * duet_cuda_fp8_act_rows(n) * 4;
}

/* y(n, m) = x w^T from x's codes and scales (act_quant's layout), the weight's block scales
 * converted into scr (fp8_gemm_scratch bytes) and D there where y cannot take it */
static duet_status_t fp8_gemm(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const uint8_t *xq,
                              const float *sx, int n, float *y, uint8_t *scr)
{
    int m = row_end - row_begin, k = w->cols, kb = k / 128, kb_pad = (kb + 3) / 4 * 4;
    int n_pad = duet_cuda_fp8_act_rows(n), n_brows = (m + 127) / 128;
    float *sw = (float *)scr;
    void *dtmp = scr + fp8_wscale_bytes(m, k); /* fp32 D when padded, or bf16 D */
    int lay = c->fp8_scale_layout;
    wscale_kernel<<<duet_cdiv((size_t)(n_brows + 3) * kb_pad, 256), 256, 0, c->stream>>>(
        w->scale, w->scale_dtype == DUET_DT_F32, w->scale_cols, row_begin / 128, n_brows, kb, kb_pad, sw, lay & 2);
    DUET_CUDA_CHECK_LAUNCH(c);

    struct duet_lt_plan *p;
    duet_status_t st = lt_plan(c, LT_FP8_BLK, m, n_pad, k, sw, sx, &p);
    if (st == DUET_ERR_UNSUPPORTED)
        st = lt_plan(c, LT_FP8_BLK_D16, m, n_pad, k, sw, sx, &p);
    DUET_TRY(st);
    const void *sa = sw, *sb = sx;
    DUET_CUBLAS_CHECK(c, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    DUET_CUBLAS_CHECK(c, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    const uint8_t *wa = (const uint8_t *)w->data + (size_t)row_begin * k;
    if (p->d_bf16) {
        DUET_TRY(lt_run(c, p, wa, xq, dtmp));
        bf16_to_f32_kernel<<<grid_for((size_t)m * n, 256), 256, 0, c->stream>>>((const __nv_bfloat16 *)dtmp,
                                                                                 (size_t)m * n, y);
        DUET_CUDA_CHECK_LAUNCH(c);
    } else if (n_pad != n) {
        DUET_TRY(lt_run(c, p, wa, xq, dtmp));
        DUET_CUDA_CHECK(c, cudaMemcpyAsync(y, dtmp, (size_t)m * n * 4, cudaMemcpyDeviceToDevice, c->stream));
    } else {
        DUET_TRY(lt_run(c, p, wa, xq, y));
    }
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_matmul_fp8_q(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                                const uint8_t *xq, const float *sx, int n, float *y)
{
    DUET_TRY(fp8_gemm_args(c, "matmul_fp8_q", w, row_begin, row_end, n));
    if (n == 0 || row_end == row_begin)
        return DUET_OK;
    if (!xq || !sx || (uintptr_t)xq % 16 || (uintptr_t)sx % 16)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "matmul_fp8_q: codes or scales missing or not 16-byte aligned");
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, fp8_gemm_scratch(row_end - row_begin, n, w->cols), &scr));
    return fp8_gemm(c, w, row_begin, row_end, xq, sx, n, y, (uint8_t *)scr);
}

extern "C" duet_status_t duet_cuda_matmul_fp8_act(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                                  const float *x, int n, float *y)
{
    DUET_TRY(fp8_gemm_args(c, "matmul_fp8_act", w, row_begin, row_end, n));
    if (n == 0 || row_end == row_begin)
        return DUET_OK;
    if (((uintptr_t)x % 16) != 0)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "matmul_fp8_act: x not 16-byte aligned");
    int k = w->cols, n_pad = duet_cuda_fp8_act_rows(n);
    size_t xq_bytes = duet_round_up((size_t)n_pad * k, 256);
    size_t sx_bytes = duet_round_up((size_t)(k / 128) * n_pad * 4, 256);
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, xq_bytes + sx_bytes + fp8_gemm_scratch(row_end - row_begin, n, k), &scr));
    uint8_t *xq = (uint8_t *)scr;
    float *sx = (float *)(xq + xq_bytes);
    DUET_TRY(act_quant_run(c, x, n, k, xq, sx));
    return fp8_gemm(c, w, row_begin, row_end, xq, sx, n, y, (uint8_t *)sx + sx_bytes);
}

extern "C" int duet_cuda_fp8_act_output(const duet_cuda_t *c)
{
    int r = 0;
    for (int i = 0; i < DUET_CUDA_MAX_PLANS; i++) {
        if (c->plans[i].used && c->plans[i].kind == LT_FP8_BLK)
            r = r ? r : 1;
        if (c->plans[i].used && c->plans[i].kind == LT_FP8_BLK_D16)
            r = 2;
    }
    return r;
}
