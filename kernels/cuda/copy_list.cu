/* Batched list copies and the peer copy ceiling (contract in copy_list.cuh).
 *
 * The list is cut into chunks: CL_VPC 16-byte vectors (16 KiB) for entries on
 * the vector path, CL_BPC bytes (4 KiB) for the others.  A prefix of chunk
 * counts (host-computed, queued with the entries) lets block b find its entry
 * by binary search, so one launch covers entries of any sizes and every block
 * moves about the same amount; a grid-stride loop caps the grid.  Vector
 * chunks: each thread moves four vectors, all loads issued before the stores,
 * with streaming cache hints (every byte is touched once), as page_copy.cu.
 * Bytes: each entry read once and written once. */
#include <cstdlib>

#include "common.cuh"

#define CL_THREADS 256
#define CL_UNROLL 4
#define CL_VPC ((uint64_t)CL_THREADS * CL_UNROLL) /* vectors per vector chunk */
#define CL_BPC ((uint64_t)CL_THREADS * 16)        /* bytes per byte chunk */
#define CL_MAX_GRID 65536u

struct cl_entry {
    uint64_t dst, src, bytes;
};

/* The vector path: dst and src equally misaligned, at least one whole vector
 * after the `head` bytes that reach the first 16-byte boundary.  *nvec = 0:
 * the byte path. */
__host__ __device__ static inline void cl_shape(uint64_t dst, uint64_t src, uint64_t bytes, uint64_t *head,
                                                uint64_t *nvec)
{
    uint64_t mis = dst & 15, h = (16 - mis) & 15;
    if ((src & 15) == mis && bytes >= h + 16) {
        *head = h;
        *nvec = (bytes - h) / 16;
    } else {
        *head = 0;
        *nvec = 0;
    }
}

__host__ __device__ static inline uint64_t cl_chunks(uint64_t dst, uint64_t src, uint64_t bytes)
{
    uint64_t head, nvec;
    if (!bytes)
        return 0;
    cl_shape(dst, src, bytes, &head, &nvec);
    return nvec ? (nvec + CL_VPC - 1) / CL_VPC : (bytes + CL_BPC - 1) / CL_BPC;
}

/* first[e] = chunks of the entries before e; first[n] = total. */
__global__ void __launch_bounds__(CL_THREADS) copy_list_kernel(const cl_entry *ents, const uint64_t *first,
                                                               uint32_t n, uint64_t total)
{
    for (uint64_t b = blockIdx.x; b < total; b += gridDim.x) {
        /* the entry with first[e] <= b < first[e + 1] (entries without chunks are skipped) */
        uint32_t lo = 0, hi = n;
        while (hi - lo > 1) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (first[mid] <= b)
                lo = mid;
            else
                hi = mid;
        }
        const cl_entry en = ents[lo];
        uint64_t c = b - first[lo];
        uint8_t *dst = (uint8_t *)en.dst;
        const uint8_t *src = (const uint8_t *)en.src;
        uint64_t head, nvec;
        cl_shape(en.dst, en.src, en.bytes, &head, &nvec);
        if (nvec) {
            const uint4 *sv = (const uint4 *)(src + head);
            uint4 *dv = (uint4 *)(dst + head);
            uint64_t v0 = c * CL_VPC + threadIdx.x;
            uint4 r[CL_UNROLL];
#pragma unroll
            for (int u = 0; u < CL_UNROLL; u++) {
                uint64_t v = v0 + (uint64_t)u * CL_THREADS;
                if (v < nvec)
                    r[u] = __ldcs(sv + v);
            }
#pragma unroll
            for (int u = 0; u < CL_UNROLL; u++) {
                uint64_t v = v0 + (uint64_t)u * CL_THREADS;
                if (v < nvec)
                    __stcs(dv + v, r[u]);
            }
            if (c == 0 && threadIdx.x < head)
                dst[threadIdx.x] = src[threadIdx.x];
            uint64_t tail = head + nvec * 16;
            if (c == (nvec - 1) / CL_VPC && threadIdx.x < en.bytes - tail)
                dst[tail + threadIdx.x] = src[tail + threadIdx.x];
        } else {
            uint64_t b0 = c * CL_BPC + threadIdx.x;
#pragma unroll 4
            for (int k = 0; k < 16; k++) {
                uint64_t i = b0 + (uint64_t)k * CL_THREADS;
                if (i < en.bytes)
                    dst[i] = src[i];
            }
        }
    }
}

extern "C" duet_status_t duet_cuda_copy_list(duet_cuda_t *c, const duet_cuda_copy_t *list, uint32_t n)
{
    if (!n)
        return DUET_OK;
    if (!list)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "copy_list: %u entries and no list", n);
    size_t eb = sizeof(cl_entry) * (size_t)n, fb = sizeof(uint64_t) * ((size_t)n + 1);
    uint8_t *buf = (uint8_t *)malloc(eb + fb);
    if (!buf)
        return duet_cuda_failf(c, DUET_ERR_NOMEM, "copy_list: %u entries", n);
    cl_entry *e = (cl_entry *)buf;
    uint64_t *first = (uint64_t *)(buf + eb);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (list[i].bytes && (!list[i].dst || !list[i].src)) {
            free(buf);
            return duet_cuda_failf(c, DUET_ERR_INVALID, "copy_list: entry %u of %zu bytes has a NULL pointer", i,
                                   list[i].bytes);
        }
        e[i].dst = (uint64_t)(uintptr_t)list[i].dst;
        e[i].src = (uint64_t)(uintptr_t)list[i].src;
        e[i].bytes = list[i].bytes;
        first[i] = total;
        total += cl_chunks(e[i].dst, e[i].src, e[i].bytes);
    }
    first[n] = total;
    if (!total) {
        free(buf);
        return DUET_OK;
    }
    void *dev;
    duet_status_t st = duet_cuda_args(c, buf, eb + fb, &dev);
    free(buf);
    if (st != DUET_OK)
        return st;
    unsigned grid = total < CL_MAX_GRID ? (unsigned)total : CL_MAX_GRID;
    copy_list_kernel<<<grid, CL_THREADS, 0, c->stream>>>((const cl_entry *)dev,
                                                         (const uint64_t *)((uint8_t *)dev + eb), n, total);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of `reps` peer copies after one warm-up. */
static duet_status_t peer_copy_time(duet_cuda_t *c, int peer, void *dst, const void *src, size_t bytes, int reps,
                                    float *ms)
{
    DUET_CUDA_CHECK(c, cudaMemcpyPeerAsync(dst, peer, src, c->device, bytes, c->stream));
    DUET_TRY(duet_cuda_wait_stream(c));
    float t[64];
    if (reps > 64)
        reps = 64;
    for (int i = 0; i < reps; i++) {
        DUET_TRY(duet_cuda_timer_start(c));
        DUET_CUDA_CHECK(c, cudaMemcpyPeerAsync(dst, peer, src, c->device, bytes, c->stream));
        DUET_TRY(duet_cuda_timer_stop(c, &t[i]));
    }
    qsort(t, (size_t)reps, sizeof(float), cmp_float);
    *ms = t[reps / 2];
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_measure_peer_copy(duet_cuda_t *c, int peer, size_t bytes, int reps, double *gbps,
                                                     int *p2p)
{
    int n = 0;
    DUET_CUDA_CHECK(c, cudaGetDeviceCount(&n));
    if (peer < 0 || peer >= n || peer == c->device)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "peer copy: device %d from device %d (%d present)", peer,
                               c->device, n);
    if (!bytes)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "peer copy: 0 bytes");
    if (reps < 1)
        reps = 1;
    int can = 0;
    DUET_CUDA_CHECK(c, cudaDeviceCanAccessPeer(&can, c->device, peer));
    DUET_CUDA_CHECK(c, cudaSetDevice(c->device));
    if (can) {
        cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError(); /* enabled earlier in this process: fine */
        else if (e != cudaSuccess)
            return duet_cuda_fail(c, DUET_ERR_CUDA, "cudaDeviceEnablePeerAccess(peer, 0)", __FILE__, __LINE__,
                                  cudaGetErrorString(e));
    }
    *p2p = can;
    void *src = NULL, *dst = NULL;
    cudaError_t e = cudaMalloc(&src, bytes);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(src, 0x5a, bytes, c->stream);
    if (e == cudaSuccess) {
        e = cudaSetDevice(peer);
        if (e == cudaSuccess)
            e = cudaMalloc(&dst, bytes);
        cudaError_t back = cudaSetDevice(c->device);
        if (e == cudaSuccess)
            e = back;
    }
    duet_status_t st = DUET_OK;
    float ms = 0.0f;
    if (e != cudaSuccess)
        st = duet_cuda_fail(c, DUET_ERR_CUDA, "cudaMalloc of the peer copy buffers", __FILE__, __LINE__,
                            cudaGetErrorString(e));
    else
        st = peer_copy_time(c, peer, dst, src, bytes, reps, &ms);
    /* release: the buffers go whatever failed above (not on a stuck device: freeing would wait
     * for it); the first failure is the one reported */
    duet_status_t ws = duet_cuda_wait_stream(c);
    if (st == DUET_OK)
        st = ws;
    if (duet_cuda_stuck(c))
        return st;
    cudaError_t re = cudaFree(src), fe;
    if (dst) {
        fe = cudaSetDevice(peer);
        if (fe == cudaSuccess)
            fe = cudaFree(dst);
        if (re == cudaSuccess)
            re = fe;
        fe = cudaSetDevice(c->device);
        if (re == cudaSuccess)
            re = fe;
    }
    if (st == DUET_OK && re != cudaSuccess)
        st = duet_cuda_fail(c, DUET_ERR_CUDA, "releasing the peer copy buffers", __FILE__, __LINE__,
                            cudaGetErrorString(re));
    if (st == DUET_OK && !(ms > 0.0f))
        st = duet_cuda_failf(c, DUET_ERR_CUDA, "peer copy: %zu bytes timed at %g ms", bytes, (double)ms);
    if (st == DUET_OK)
        *gbps = (double)bytes / ((double)ms * 1e-3) / 1e9;
    return st;
}
