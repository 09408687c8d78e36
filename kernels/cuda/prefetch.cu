/* Bytes into L2 ahead of their readers (contract in prefetch.cuh): a 128-byte line a thread and
 * step, the threads of a block on consecutive lines, the ranges one after the other. */
#include "common.cuh"

#define PF_THREADS 256
#define PF_LINE 128

struct pf_ranges {
    const char *p[DUET_CUDA_PREFETCH_MAX]; /* each on a line */
    size_t n[DUET_CUDA_PREFETCH_MAX];      /* its bytes from p, whole lines */
    int count;
};

template <bool KEEP> __global__ void __launch_bounds__(PF_THREADS) l2_prefetch_kernel(pf_ranges r)
{
    size_t stride = (size_t)gridDim.x * PF_THREADS * PF_LINE, o0 = ((size_t)blockIdx.x * PF_THREADS + threadIdx.x) * PF_LINE;
    for (int k = 0; k < r.count; k++)
        for (size_t o = o0; o < r.n[k]; o += stride) {
            if constexpr (KEEP)
                asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(r.p[k] + o));
            else
                asm volatile("prefetch.global.L2 [%0];" ::"l"(r.p[k] + o));
        }
    duet_pdl_wait(); /* reads weights only: the wait is for the launch's end to imply the ones before */
}

extern "C" duet_status_t duet_cuda_l2_prefetch(duet_cuda_t *c, const duet_cuda_range_t *r, int n, int keep)
{
    if (n < 0 || n > DUET_CUDA_PREFETCH_MAX || (n && !r))
        return duet_cuda_failf(c, DUET_ERR_INVALID, "l2_prefetch: %d ranges (0 to %d)", n, DUET_CUDA_PREFETCH_MAX);
    pf_ranges pr = {};
    size_t lines = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].bytes)
            continue;
        if (!r[i].p)
            return duet_cuda_failf(c, DUET_ERR_INVALID, "l2_prefetch: range %d is NULL with %zu bytes", i, r[i].bytes);
        uintptr_t a = (uintptr_t)r[i].p, b = a + r[i].bytes, a0 = a & ~(uintptr_t)(PF_LINE - 1);
        size_t len = duet_round_up(b - a0, PF_LINE);
        pr.p[pr.count] = (const char *)a0;
        pr.n[pr.count++] = len;
        lines += len / PF_LINE;
    }
    if (!lines)
        return DUET_OK;
    /* a few lines a thread: the launch asks for everything within its first microseconds */
    unsigned blocks = duet_cdiv(lines, (size_t)PF_THREADS * 4);
    unsigned sms = c->info.sm_count > 0 ? (unsigned)c->info.sm_count : 1;
    if (blocks > sms)
        blocks = sms;
    if (keep)
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, l2_prefetch_kernel<true>, dim3(blocks), dim3(PF_THREADS), 0, pr));
    else
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, l2_prefetch_kernel<false>, dim3(blocks), dim3(PF_THREADS), 0, pr));
    return DUET_OK;
}
