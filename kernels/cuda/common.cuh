/* Internals shared by the CUDA backend's .cu files: the context, the check
 * macros, launch helpers and the device-side scalar codecs.
 *
 * Check macros (one per library, as ggml-cuda does): each names the
 * statement, file, line and device, records them in the context and returns
 * DUET_ERR_CUDA from the enclosing function.  Kernel launches are followed by
 * DUET_CUDA_CHECK_LAUNCH, which reads cudaGetLastError() (launch
 * configuration errors; faults inside a kernel surface at the next
 * synchronizing call, duet_cuda_sync()). */
#ifndef DUET_CUDA_COMMON_CUH
#define DUET_CUDA_COMMON_CUH

/* System headers first, so that the C headers below (included with C linkage)
 * find them already included. */
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ref_math.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

extern "C" {
#include "cache_layout.h"
#include "dtype.h"
#include "err.h"
#include "kernels.h"
}
#include "duet_cuda.h"

#define DUET_CUDA_MAX_PLANS 32
/* Tokens a wide tile of the grouped matmul holds (moe_sort's second tile prefix sums; a build
 * setting for timing variants, a multiple of 8 up to 32) */
#ifndef DUET_CUDA_MOE_WIDE_TILE
#define DUET_CUDA_MOE_WIDE_TILE 32
#endif
static_assert(DUET_CUDA_MOE_WIDE_TILE % 8 == 0 && DUET_CUDA_MOE_WIDE_TILE >= 8 && DUET_CUDA_MOE_WIDE_TILE <= 32,
              "a wide tile is one to four groups of 8 tokens");
/* Tokens a tile of the 64-token (wgmma) grouped launches holds: moe_sort's third tile prefix sums */
#define DUET_CUDA_MOE_WG_TILE 64

/* A cached cuBLASLt problem: descriptors and the algorithm the heuristic chose. */
struct duet_lt_plan {
    int used;
    int kind;            /* what the plan computes (matmul_lt.cu's enum) */
    int m, n, k;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    int d_bf16;          /* fp8 plans: 1 when D had to be bf16 */
};

struct duet_cuda {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    void *scratch; /* grown on demand; operations carve it up */
    size_t scratch_bytes;
    void *args_host; /* pinned staging for small argument lists (page ids) */
    void *args_dev;
    size_t args_bytes;
    cudaEvent_t args_done; /* the last copy out of args_host has finished after this */
    cudaEvent_t t0, t1;
    int fp8_scale_layout; /* duet_cuda_fp8_act_scale_layout */
    int topk_smem_set;    /* topk's shared-memory limit raised */
    int ist_blocks[2];    /* index_score's tensor-core kernels (bf16, fp8 pool): blocks an SM (0: not asked yet) */
    int isw_blocks[2];    /* the same for its shared-q form (IST_WG warpgroups a block) */
    int sample_clusters[3]; /* sample: clusters of 8, 4, 2 blocks resident at once (0: not asked yet) */
    unsigned long long tc_smem_set[2]; /* matmul tensor-core kernels whose shared-memory limit was raised */
    void *tc_part;        /* matmul split-K partials, grown on demand */
    size_t tc_part_bytes;
    void *tc_xrec;        /* matmul: x split into its MMA parts ahead of a launch, grown on demand */
    size_t tc_xrec_bytes;
    int tc_presplit;      /* duet_cuda_tc_presplit: 0 the default, -1 never, else the smallest n */
    void *tc_count;       /* matmul split-K counters (int), zero between launches */
    int tc_count_n;
    int invariant;        /* duet_cuda_set_invariant: decompositions that never depend on the row count */
    int exact;            /* duet_cuda_set_exact: the CPU reference's order and roundings (exact.cuh) */
    int attn_no_tc;       /* duet_cuda_set_attn_tc(c, 0): attn_rows on the fp32 units only */
    int pdl;              /* duet_cuda_set_pdl: launches that may start before the kernel ahead ends */
    int pdl_hold;         /* the next duet_cuda_launch the ordinary way: the stream wrote weights */
    unsigned attn_smem_set; /* attn_rows' tensor-core kernels whose shared-memory limit was raised */
    struct duet_cuda_phases *phases; /* duet_cuda_phases_enable: NULL when off */
    struct duet_cuda *side;          /* duet_cuda_side: NULL until asked for */
    cudaEvent_t order;               /* duet_cuda_fork / duet_cuda_join: the point other streams wait for */
    cudaEvent_t fence[DUET_CUDA_FENCES]; /* duet_cuda_fence: made at a slot's first mark */
    void *flush_buf; /* duet_cuda_flush_l2 */
    size_t flush_bytes;
    duet_cuda_info_t info;
    struct duet_lt_plan plans[DUET_CUDA_MAX_PLANS];
    cudaEvent_t wait_ev; /* duet_cuda_wait_stream's mark */
    uint32_t wait_ms;    /* the deadline of every host wait on this context (duet_cuda_set_wait_timeout) */
    int stuck;           /* a wait passed its deadline: what the stream holds is unknown from then on */
    duet_err_t stuck_err;
    duet_err_t err;
};

/* The host's waits for the device, each with the context's deadline (duet_cuda_set_wait_timeout):
 * until `ev` has passed, or every operation queued on the stream so far has finished.  Past the
 * deadline the context is stuck (DUET_ERR_TIMEOUT, and every later wait fails at once with
 * DUET_ERR_CUDA): a kernel that never ends cannot be taken back. */
duet_status_t duet_cuda_wait_event(duet_cuda_t *c, cudaEvent_t ev);
duet_status_t duet_cuda_wait_stream(duet_cuda_t *c);

/* Record a failure ("<what> at <file>:<line> on device <d>: <detail>") and return `st`. */
duet_status_t duet_cuda_fail(duet_cuda_t *c, duet_status_t st, const char *what, const char *file, int line,
                             const char *detail);
/* Record a failure with a formatted reason (shape or dtype checks) and return `st`. */
duet_status_t duet_cuda_failf(duet_cuda_t *c, duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define DUET_CUDA_CHECK(c, stmt)                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (stmt);                                                                                   \
        if (e_ != cudaSuccess)                                                                                     \
            return duet_cuda_fail((c), DUET_ERR_CUDA, #stmt, __FILE__, __LINE__, cudaGetErrorString(e_));        \
    } while (0)

#define DUET_CUBLAS_CHECK(c, stmt)                                                                                 \
    do {                                                                                                           \
        cublasStatus_t s_ = (stmt);                                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                           \
            return duet_cuda_fail((c), DUET_ERR_CUDA, #stmt, __FILE__, __LINE__, cublasGetStatusString(s_));     \
    } while (0)

#define DUET_CUDA_CHECK_LAUNCH(c) DUET_CUDA_CHECK((c), cudaGetLastError())

/* Scratch of at least `bytes` (16-byte aligned at its start; valid until the next call). */
duet_status_t duet_cuda_scratch(duet_cuda_t *c, size_t bytes, void **p);
/* Queue `bytes` of host data to a device buffer owned by the context (valid
 * for kernels queued after this call and before the next one). */
duet_status_t duet_cuda_args(duet_cuda_t *c, const void *host, size_t bytes, void **dev);

/* the GPU's nanosecond clock */
__device__ __forceinline__ unsigned long long d_globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Programmatic dependent launch (sm_90 and later).  A kernel launched with duet_cuda_launch while
 * the context has them on (duet_cuda_set_pdl) may be scheduled as soon as every block of the
 * kernel ahead of it in the stream has exited, before that kernel's completion (its memory flush)
 * and without the gap of an ordinary launch.  It must call duet_pdl_wait() in every block before
 * it reads anything an earlier operation wrote, writes anything an earlier one reads, or exits (so
 * that its own end still implies the end of everything before it); before the wait it may only
 * read what no operation of the stream writes (weights) and use its shared memory.  The one
 * operation that writes weights, duet_cuda_weight_tile (at upload), sets pdl_hold, so that the
 * next launch waits for it whole; the launches after that one start after it has begun, so after
 * the tiling has ended.
 * duet_pdl_wait() returns at once in a kernel launched the ordinary way, and is a no-op below
 * sm_90.  No kernel lets its dependents start earlier than its blocks' exits
 * (griddepcontrol.launch_dependents first thing in every kernel measured 2% slower at prefill,
 * its dependents' blocks placed while the SMs were still busy; docs/PERF.md). */
__device__ __forceinline__ void duet_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Let the kernel after this one in the stream (a dependent launch) be scheduled once every block
 * of this one has run this, instead of at their exits.  Only for a short kernel of few blocks
 * ahead of a long one that has reads to issue before its duet_pdl_wait (the weights of the
 * matmul after x's split): the dependent's wait still waits for this kernel's completion. */
__device__ __forceinline__ void duet_pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* duet_cuda_launch with the grid's blocks in clusters of `cluster` along x (0: no cluster
 * dimension; the grid's x a multiple of it). */
template <typename... P, typename... A>
static inline cudaError_t duet_cuda_launch_cluster(duet_cuda_t *c, void (*kernel)(P...), dim3 grid, dim3 block,
                                                   size_t smem, unsigned cluster, A &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[2] = {};
    unsigned na = 0;
    if (cluster) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = cluster;
        at[na].val.clusterDim.y = 1;
        at[na].val.clusterDim.z = 1;
        na++;
    }
    if (c->pdl && !c->pdl_hold) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    c->pdl_hold = 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

/* Launch `kernel` on the context's stream, a programmatic dependent launch while the context has
 * them on: every kernel launched this way calls duet_pdl_wait() first (the matmuls after their
 * first weight loads). */
template <typename... P, typename... A>
static inline cudaError_t duet_cuda_launch(duet_cuda_t *c, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                           A &&...args)
{
    return duet_cuda_launch_cluster(c, kernel, grid, block, smem, 0, static_cast<A &&>(args)...);
}

static inline unsigned duet_cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
static inline size_t duet_round_up(size_t a, size_t b) { return (a + b - 1) / b * b; }

/* ---- device helpers ---- */

/* cp.async: global -> shared copies the thread issues and waits for in groups (sm_80+);
 * 16 bytes bypassing L1, or 4 through it. */
/* 16 bytes to a shared-window address (__cvta_generic_to_shared), for callers that keep one
 * base and add constant offsets; cp_async16 with a generic pointer. */
__device__ __forceinline__ void cp_async16_s(unsigned s, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    cp_async16_s((unsigned)__cvta_generic_to_shared(smem), gmem);
}

__device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Wait until at most N of the thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ float duet_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float duet_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
 * `red` is shared memory of at least 33 floats; the call contains barriers. */
__device__ __forceinline__ float duet_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = duet_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nw ? red[lane] : 0.0f;
        t = duet_warp_sum(t);
        if (lane == 0)
            red[32] = t;
    }
    __syncthreads();
    return red[32];
}

__device__ __forceinline__ float duet_d_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* duet_f32_to_bf16 (dtype.h), operation for operation. */
__device__ __forceinline__ uint16_t duet_d_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Two floats as a bf16 pair, each rounded to nearest, lo in the low half (the order a
 * fragment's consecutive columns take). */
__device__ __forceinline__ uint32_t duet_d_pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Two floats as three bf16 pairs, v = hi + mid + lo exactly: each part the rounding of what the
 * parts before it leave (exact in fp32; what hi and mid leave has at most 8 bits), v.x low. */
__device__ __forceinline__ void duet_d_bf16_split3(float2 v, uint32_t &hi, uint32_t &mid, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
    float2 r1 = make_float2(v.x - __bfloat162float(h.x), v.y - __bfloat162float(h.y));
    __nv_bfloat162 m = __floats2bfloat162_rn(r1.x, r1.y);
    float2 r2 = make_float2(r1.x - __bfloat162float(m.x), r1.y - __bfloat162float(m.y));
    __nv_bfloat162 l = __floats2bfloat162_rn(r2.x, r2.y);
    hi = *reinterpret_cast<uint32_t *>(&h);
    mid = *reinterpret_cast<uint32_t *>(&m);
    lo = *reinterpret_cast<uint32_t *>(&l);
}

/* d += a b on mma.sync m16n8k16 bf16 with fp32 accumulation (a: A's four words, b0 b1: B's two). */
__device__ __forceinline__ void duet_d_mma_bf16(float *d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* A float into an output element: a float as it is, or bf16 bits (duet_d_f32_to_bf16). */
__device__ __forceinline__ void duet_d_store(float *o, float v) { *o = v; }
__device__ __forceinline__ void duet_d_store(uint16_t *o, float v) { *o = duet_d_f32_to_bf16(v); }

/* duet_e8m0_to_f32 */
__device__ __forceinline__ float duet_d_e8m0_to_f32(uint8_t b)
{
    /* selects, not branches: inner loops convert several a step */
    uint32_t u = (uint32_t)b << 23;
    u = b == 0 ? 0x00400000u : u; /* 2^-127 */
    u = b == 0xff ? 0x7fc00000u : u;
    return __uint_as_float(u);
}

/* A word of four e8m0 scales (the first in bits 0-7), as duet_d_e8m0_to_f32 of each: shifts
 * and masks unless a byte is 0 or 0xff (exponent bits that are not simply moved). */
__device__ __forceinline__ float4 duet_d_e8m0x4_to_f32(uint32_t w)
{
    uint32_t special = (((w - 0x01010101u) & ~w) | ((~w - 0x01010101u) & w)) & 0x80808080u;
    if (special)
        return make_float4(duet_d_e8m0_to_f32((uint8_t)w), duet_d_e8m0_to_f32((uint8_t)(w >> 8)),
                           duet_d_e8m0_to_f32((uint8_t)(w >> 16)), duet_d_e8m0_to_f32((uint8_t)(w >> 24)));
    return make_float4(__uint_as_float((w << 23) & 0x7f800000u), __uint_as_float((w << 15) & 0x7f800000u),
                       __uint_as_float((w << 7) & 0x7f800000u), __uint_as_float((w >> 1) & 0x7f800000u));
}

/* duet_f32_to_e8m0_ceil */
__device__ __forceinline__ uint8_t duet_d_f32_to_e8m0_ceil(float x)
{
    if (!(x > 0.0f))
        return 0;
    uint32_t u = __float_as_uint(x);
    uint32_t e = (u >> 23) & 0xff;
    if (u & 0x7fffffu)
        e += 1;
    if (e == 0)
        e = 1;
    if (e > 254)
        e = 254;
    return (uint8_t)e;
}

/* duet_e4m3_to_f32 (NaN codes give NaN). */
__device__ __forceinline__ float duet_d_e4m3_to_f32(uint8_t b)
{
    uint32_t s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 0xf && m == 7)
        return __uint_as_float(0x7fc00000u);
    if (e == 0)
        v = __fmul_rn((float)m, 0.001953125f); /* m * 2^-9, exact */
    else
        v = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return s ? -v : v;
}

/* duet_f32_to_e4m3, operation for operation (round to nearest even, saturate to +-448). */
__device__ __forceinline__ uint8_t duet_d_f32_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 464.0f)
        return sign | 0x7e;
    if (a < 0.015625f) { /* 2^-6: subnormal, multiples of 2^-9 */
        float q = rintf(__fmul_rn(a, 512.0f));
        return sign | (uint8_t)q;
    }
    int e;
    float fr = frexpf(a, &e);
    float scaled = ldexpf(fr, 4);
    float q = rintf(scaled);
    if (q >= 16.0f) {
        q = 8.0f;
        e += 1;
    }
    int ex = e - 1 + 7;
    if (ex > 15 || (ex == 15 && q - 8.0f > 6.0f))
        return sign | 0x7e;
    return sign | (uint8_t)(ex << 3) | (uint8_t)(q - 8.0f);
}

/* fp8 activations (duet_cuda_act_quant and the norms that write them): a 128-column block's
 * scale amax/448 (1 when the block is all zero), and four of its values' e4m3 codes under it,
 * duet_f32_to_e4m3(v / s): |v / s| <= 448 there, where the hardware's round-to-nearest-even
 * with saturation gives the same codes.  Byte i of the word: value i. */
__device__ __forceinline__ float duet_d_act_scale(float amax) { return amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f; }
__device__ __forceinline__ uint32_t duet_d_act_codes4(float4 v, float s)
{
    __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)), __NV_SATFINITE, __NV_E4M3);
    __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)), __NV_SATFINITE, __NV_E4M3);
    return (uint32_t)lo | ((uint32_t)hi << 16);
}
__device__ __forceinline__ float duet_d_amax4(float4 v)
{
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

/* e2m1 nibble -> float: the fp16 high byte of {0, .5, 1, 1.5, 2, 3, 4, 6} picked by __byte_perm. */
__device__ __forceinline__ float duet_d_e2m1_to_f32(uint32_t nib)
{
    uint32_t hi = __byte_perm(0x3e3c3800u, 0x46444240u, nib & 7) & 0xffu;
    hi |= (nib & 8) << 4; /* sign -> bit 7 of the high byte */
    return __half2float(__ushort_as_half((unsigned short)(hi << 8)));
}

/* Splitmix64: the seeded hash behind duet_cuda_fill_random. */
__host__ __device__ __forceinline__ uint64_t duet_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The argmax's rule (duet_cuda_argmax, duet_cuda_sample): a better than b when larger, or equal
 * and of a lower index; NaN is never better, anything beats NaN (-0 and +0 are equal). */
__device__ __forceinline__ bool duet_argmax_better(float av, int ai, float bv, int bi)
{
    if (av != av)
        return false;
    if (bv != bv)
        return true;
    return av > bv || (av == bv && ai < bi);
}

/* The best (value, index) of a warp's lanes by that rule, in every lane. */
__device__ __forceinline__ void duet_argmax_warp(float &bv, int &bi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (duet_argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

#endif
