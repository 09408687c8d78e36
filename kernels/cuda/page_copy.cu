/* Batched page copies (contract in page_copy.cuh).
 *
 * One launch for the whole list, seen as one run of 16-byte vectors: each
 * thread moves four of them (all loads issued before the stores), with
 * streaming cache hints since every byte is touched once.  Pages whose size
 * or addresses are not 16-byte aligned take a byte loop, block (page, slice).
 * Bytes: each page read once and written once. */
#include <cstdlib>

#include "common.cuh"

#define PC_THREADS 256
#define PC_UNROLL 4
#define PC_SLICE (PC_THREADS * PC_UNROLL * 16)

/* The batch as one flat run of 16-byte vectors: vector v is vector v % vpp of page v / vpp, so
 * every block moves the same amount whatever the page size (no partial last slice per page). */
__global__ void __launch_bounds__(PC_THREADS) pages_vec_kernel(uint8_t *dst, const uint32_t *dst_ids,
                                                               const uint8_t *src, const uint32_t *src_ids,
                                                               uint64_t page_bytes, uint32_t vpp, uint32_t total)
{
    uint32_t base = blockIdx.x * (PC_THREADS * PC_UNROLL) + threadIdx.x;
    uint4 r[PC_UNROLL];
#pragma unroll
    for (int u = 0; u < PC_UNROLL; u++) {
        uint32_t v = base + u * PC_THREADS;
        if (v < total) {
            uint32_t j = v / vpp, e = v - j * vpp;
            const uint4 *sp = (const uint4 *)(src + (uint64_t)(src_ids ? src_ids[j] : j) * page_bytes) + e;
            r[u] = __ldcs(sp);
        }
    }
#pragma unroll
    for (int u = 0; u < PC_UNROLL; u++) {
        uint32_t v = base + u * PC_THREADS;
        if (v < total) {
            uint32_t j = v / vpp, e = v - j * vpp;
            uint4 *dp = (uint4 *)(dst + (uint64_t)(dst_ids ? dst_ids[j] : j) * page_bytes) + e;
            __stcs(dp, r[u]);
        }
    }
}

__global__ void __launch_bounds__(PC_THREADS) pages_byte_kernel(uint8_t *dst, const uint32_t *dst_ids,
                                                                const uint8_t *src, const uint32_t *src_ids,
                                                                uint64_t page_bytes, uint32_t slices)
{
    uint32_t j = blockIdx.x / slices, sl = blockIdx.x % slices;
    uint64_t so = (uint64_t)(src_ids ? src_ids[j] : j) * page_bytes;
    uint64_t dof = (uint64_t)(dst_ids ? dst_ids[j] : j) * page_bytes;
    uint64_t b0 = (uint64_t)sl * PC_SLICE, b1 = min(page_bytes, b0 + PC_SLICE);
    for (uint64_t i = b0 + threadIdx.x; i < b1; i += PC_THREADS)
        dst[dof + i] = src[so + i];
}

extern "C" duet_status_t duet_cuda_pages_copy_dev(duet_cuda_t *c, uint8_t *dst, const uint32_t *dst_ids_dev,
                                                  const uint8_t *src, const uint32_t *src_ids_dev, uint32_t n,
                                                  uint64_t page_bytes)
{
    if (!n || !page_bytes)
        return DUET_OK;
    uint64_t slices = (page_bytes + PC_SLICE - 1) / PC_SLICE;
    uint64_t blocks = slices * n;
    if (blocks > 0x7fffffffu)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "pages_copy: %u pages of %llu bytes in one launch", n,
                               (unsigned long long)page_bytes);
    uint64_t total = page_bytes / 16 * n;
    int aligned = page_bytes % 16 == 0 && ((uintptr_t)dst | (uintptr_t)src) % 16 == 0 && total < 0xffffffffull;
    if (aligned)
        pages_vec_kernel<<<duet_cdiv(total, PC_THREADS * PC_UNROLL), PC_THREADS, 0, c->stream>>>(
            dst, dst_ids_dev, src, src_ids_dev, page_bytes, (uint32_t)(page_bytes / 16), (uint32_t)total);
    else
        pages_byte_kernel<<<(unsigned)blocks, PC_THREADS, 0, c->stream>>>(dst, dst_ids_dev, src, src_ids_dev,
                                                                          page_bytes, (uint32_t)slices);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_pages_gather(duet_cuda_t *c, uint8_t *staging, const uint8_t *pool,
                                                const uint32_t *ids, uint32_t n, uint64_t page_bytes)
{
    if (!n)
        return DUET_OK;
    void *dev;
    DUET_TRY(duet_cuda_args(c, ids, sizeof(uint32_t) * n, &dev));
    return duet_cuda_pages_copy_dev(c, staging, NULL, pool, (const uint32_t *)dev, n, page_bytes);
}

extern "C" duet_status_t duet_cuda_pages_scatter(duet_cuda_t *c, uint8_t *pool, const uint32_t *ids,
                                                 const uint8_t *staging, uint32_t n, uint64_t page_bytes)
{
    if (!n)
        return DUET_OK;
    void *dev;
    DUET_TRY(duet_cuda_args(c, ids, sizeof(uint32_t) * n, &dev));
    return duet_cuda_pages_copy_dev(c, pool, (const uint32_t *)dev, staging, NULL, n, page_bytes);
}

extern "C" duet_status_t duet_cuda_pages_copy(duet_cuda_t *c, uint8_t *dst_pool, const uint32_t *dst_ids,
                                              const uint8_t *src_pool, const uint32_t *src_ids, uint32_t n,
                                              uint64_t page_bytes)
{
    if (!n)
        return DUET_OK;
    uint32_t *both = (uint32_t *)malloc(sizeof(uint32_t) * 2 * (size_t)n);
    if (!both)
        return duet_cuda_failf(c, DUET_ERR_NOMEM, "pages_copy: %u ids", n);
    memcpy(both, src_ids, sizeof(uint32_t) * n);
    memcpy(both + n, dst_ids, sizeof(uint32_t) * n);
    void *dev;
    duet_status_t st = duet_cuda_args(c, both, sizeof(uint32_t) * 2 * (size_t)n, &dev);
    free(both);
    if (st != DUET_OK)
        return st;
    const uint32_t *d = (const uint32_t *)dev;
    return duet_cuda_pages_copy_dev(c, dst_pool, d + n, src_pool, d, n, page_bytes);
}

extern "C" duet_status_t duet_cuda_pages_copy_parts(duet_cuda_t *c, const duet_cuda_page_part_t *parts, int n_parts,
                                                    const uint32_t *ids, uint32_t n_ids)
{
    for (int p = 0; p < n_parts; p++)
        if (parts[p].at > n_ids || parts[p].n > n_ids - parts[p].at)
            return duet_cuda_failf(c, DUET_ERR_INVALID, "pages_copy_parts: part %d's ids [%u, +%u) of %u", p,
                                   parts[p].at, parts[p].n, n_ids);
    if (!n_ids)
        return DUET_OK;
    void *dev;
    DUET_TRY(duet_cuda_args(c, ids, sizeof(uint32_t) * (size_t)n_ids, &dev));
    const uint32_t *d = (const uint32_t *)dev;
    for (int p = 0; p < n_parts; p++)
        DUET_TRY(duet_cuda_pages_copy_dev(c, parts[p].dst, d + parts[p].at, parts[p].src, d + parts[p].at, parts[p].n,
                                          parts[p].page_bytes));
    return DUET_OK;
}
