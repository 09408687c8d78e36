/* wgmma (sm_90a) helpers shared by the kernels that take it: the matmul launches of 32 and 64
 * tokens (matmul.cu) and the indexer's scores (index_score.cu).  TC_HAVE_WGMMA is 1 only when
 * compiling for sm_90a; elsewhere the helpers compile to nothing and the callers keep mma.sync. */
#pragma once
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TC_HAVE_WGMMA 1
#else
#define TC_HAVE_WGMMA 0
#endif

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
/* keeps the compiler from moving a register's uses across the wgmma issue and wait */
__device__ __forceinline__ void wg_keep(float &r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wg_keep(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }

/* Shared memory written through the generic proxy (st.shared, cp.async) made visible to wgmma's
 * async proxy: each writer after its writes, then a barrier; nothing where there is no wgmma. */
__device__ __forceinline__ void wg_fence_proxy()
{
#if TC_HAVE_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* The shared-memory matrix descriptor of a K-major operand without swizzle: its start, the byte
 * offset between its two 8-value k halves (leading) and between 8-row groups (stride). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t smem_addr, uint32_t lead_bytes, uint32_t stride_bytes)
{
    return (uint64_t)((smem_addr & 0x3ffff) >> 4) | (uint64_t)(lead_bytes >> 4) << 16 |
           (uint64_t)(stride_bytes >> 4) << 32;
}

/* A warp's 32 accumulators of a m64n64 wgmma as asm operands (mma.sync's layout) */
#define WG_D64                                                                                                         \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),           \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),       \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),       \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])

/* d (a warp's m16 rows by 64 tokens: [8-token tile][4], mma.sync's layout) += A B; BF: bf16
 * operands, else fp16 */
template <bool BF> __device__ __forceinline__ void wg_mma64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc)
{
#if TC_HAVE_WGMMA
#define WG_MMA64(T)                                                                                                    \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,"      \
                 "%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "                  \
                 "{%32,%33,%34,%35}, %36, 1, 1, 1, 0;"                                                                 \
                 : WG_D64                                                                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))
    if constexpr (BF)
        WG_MMA64("bf16");
    else
        WG_MMA64("f16");
#undef WG_MMA64
#endif
}

/* d += A B with both operands in shared memory (bf16, K-major, no swizzle): the same product as
 * wg_mma64 with A's fragments in registers, A read through its descriptor instead */
__device__ __forceinline__ void wg_mma64_ss(float (&d)[8][4], uint64_t adesc, uint64_t bdesc)
{
#if TC_HAVE_WGMMA
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,"
                 "%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, 1, 1, 1, 0, 0;"
                 : WG_D64
                 : "l"(adesc), "l"(bdesc));
#endif
}
