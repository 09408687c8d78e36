/* Ceilings measured on the device in the same run as the numbers they
 * judge (docs/PERF.md): copy bandwidth and matrix rates, on random data,
 * timed with events (warm-up, then the median of `reps`). */
#ifndef DUET_CUDA_ROOFLINE_CUH
#define DUET_CUDA_ROOFLINE_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One cudaMemcpyAsync of `bytes` device -> device; GB/s counting bytes read plus written. */
duet_status_t duet_cuda_measure_copy(duet_cuda_t *c, size_t bytes, int reps, double *gbps);
/* Pinned host <-> device cudaMemcpyAsync of `bytes`; GB/s of bytes moved (one direction). */
duet_status_t duet_cuda_measure_host_copy(duet_cuda_t *c, size_t bytes, int to_device, int reps, double *gbps);
/* cuBLASLt bf16 x bf16 -> bf16 (fp32 accumulate) GEMM of m x n x k; TFLOP/s. */
duet_status_t duet_cuda_measure_gemm_bf16(duet_cuda_t *c, int m, int n, int k, int reps, double *tflops);
/* cuBLASLt e4m3 x e4m3 -> bf16 GEMM with 1x128 / 128x128 block scales; TFLOP/s.
 * DUET_ERR_UNSUPPORTED where cuBLASLt has no such algorithm. */
duet_status_t duet_cuda_measure_gemm_fp8(duet_cuda_t *c, int m, int n, int k, int reps, double *tflops);

/* Reads `bytes` of device memory at buf the way the tensor-core matmul streams a weight: blocks
 * of four warps, each warp 2 KB a step through cp.async into shared memory (two stages), the 2 KB
 * being runs of `run` bytes (16 .. 2048, a power of two) from 2048/run consecutive rows of 32
 * steps' runs each: run 64 is an fp4 weight's rows as stored, 2048 its tiled layout
 * (duet_cuda_weight_tile).  bytes must be a multiple of 256 KiB.  *sum: the wrapping sum of the
 * 32-bit words read, every word once (to check the reads against the host).  One untimed run
 * when reps is 0; else GB/s of bytes read, the median of reps. */
duet_status_t duet_cuda_measure_runs(duet_cuda_t *c, const void *buf, size_t bytes, int run, int reps, double *gbps,
                                     uint32_t *sum);

/* Plain fp32 fused multiply-add rate (independent chains on every SM); TFLOP/s counting 2 per FMA. */
duet_status_t duet_cuda_measure_fma(duet_cuda_t *c, int reps, double *tflops);
/* Read a buffer of twice the L2 size, so the next operation starts with a cold L2
 * (clean lines only: nothing is written back during what follows). */
duet_status_t duet_cuda_flush_l2(duet_cuda_t *c);
/* A one-thread kernel that runs `us` microseconds (at most 100000): the launch after it is queued
 * behind it, so that a timing started between the two leaves out that launch's host latency, as
 * one started after duet_cuda_flush_l2 does; it leaves L2 as it finds it (no memory touched). */
duet_status_t duet_cuda_busy_us(duet_cuda_t *c, uint32_t us);

#ifdef __cplusplus
}
#endif

#endif
