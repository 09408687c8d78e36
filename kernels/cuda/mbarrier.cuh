/* mbarrier, bulk-copy and tensor-map helpers (sm_90 and later) shared by the loading-warp matmul
 * (matmul.cu) and the ingest probe (tools/ingest_rates.cu), so that the probe times the copies
 * the kernel issues. */
#pragma once
#include <stdint.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include "common.cuh" /* d_globaltimer */

/* cuTensorMapEncodeTiled from the driver, looked up once (NULL where the driver has none) */
static inline PFN_cuTensorMapEncodeTiled_v12000 tma_encoder()
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = NULL;
        (void)cudaGetLastError();
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    return fn;
}

__device__ __forceinline__ void mb_init(uint32_t b, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_expect(uint32_t b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint32_t b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
/* Wait for the phase of parity `parity` of barrier b to complete.  Bounded: a phase that has
 * not completed after 4 s of waiting traps (the launch fails and the host reports the lost
 * GPU) where it would otherwise hold the SM forever. */
__device__ __forceinline__ void mb_wait(uint32_t b, unsigned parity)
{
    unsigned long long t0 = 0;
    for (unsigned i = 1;; i++) {
        uint32_t ok;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok)
                     : "r"(b), "r"(parity)
                     : "memory");
        if (ok)
            return;
        if ((i & 1023) == 0) {
            unsigned long long now = d_globaltimer();
            if (!t0)
                t0 = now;
            else if (now - t0 > 4000000000ull)
                __trap();
        }
    }
}
/* box (c0, c1) of 2D tensor map tm to shared dst (128-byte aligned), counted on barrier bar */
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *tm, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3}], [%4];" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(tm)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
/* bytes (a multiple of 16) from global src to shared dst, counted on barrier bar */
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, unsigned bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
