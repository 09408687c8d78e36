/* The CUDA backend (DESIGN §8): a context, device memory, and one entry
 * point per operation.
 *
 * Every operation has the contract of the CPU reference it mirrors
 * (kernels.h, kernels/cpu/), with three differences: pointers are device
 * pointers, the work is queued on the context's stream (asynchronous: call
 * duet_cuda_sync() before reading results on the host), and the decode-time
 * operations are batched over rows (one launch for the whole batch).  Each
 * operation's header (<op>.cuh beside this file) states what it adds to the
 * CPU contract and how close to the CPU result it is; docs/CUDA.md lists the
 * tolerances and why.
 *
 * Errors: every CUDA, cuBLAS and cuBLASLt call is checked; a failure returns
 * DUET_ERR_CUDA (DUET_ERR_UNSUPPORTED for a shape or dtype an operation does
 * not take) and records a sentence naming the statement, file, line and
 * device, read with duet_cuda_error().  A context is used by one thread at a
 * time. */
#ifndef DUET_CUDA_H
#define DUET_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "cache_layout.h"
#include "err.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct duet_cuda duet_cuda_t;

typedef struct {
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    size_t l2_bytes;
    size_t mem_bytes;
    int driver_version;  /* e.g. 13000 */
    int runtime_version;
    int cublas_version;
} duet_cuda_info_t;

/* Open device `device`: a non-blocking stream, cuBLAS and cuBLASLt handles,
 * a 32 MiB GEMM workspace.  DUET_ERR_CUDA when there is no such device. */
duet_status_t duet_cuda_create(int device, duet_cuda_t **out, duet_err_t *err);
/* Wait for queued work, release everything; sets *c to NULL.  Safe on NULL. */
void duet_cuda_destroy(duet_cuda_t **c);
/* The last failure recorded on this context ("CUDA: cudaMemcpyAsync(...) at file:line on device 0: ..."). */
const duet_err_t *duet_cuda_error(const duet_cuda_t *c);
void duet_cuda_info(const duet_cuda_t *c, duet_cuda_info_t *info);
/* A side stream: a second context on the same device, owned by c (released with it), whose
 * stream has the device's highest priority, for a chain of operations that may run beside
 * the main stream's (its own scratch, split-sum buffers and argument staging, so the two never
 * share a buffer); the settings that choose kernels and decompositions (batch invariance,
 * dependent launches, x split ahead) copied from c at every call, so an operation gives the same
 * bits on either stream.  Created on the first call; NULL when it cannot be (the reason in
 * duet_cuda_error(c)).  duet_cuda_fork: what is queued on the side stream from now on waits for
 * all that c has queued so far; duet_cuda_join: what is queued on c from now on waits for all
 * that the side stream has queued so far.  DUET_ERR_STATE before duet_cuda_side. */
duet_cuda_t *duet_cuda_side(duet_cuda_t *c);
duet_status_t duet_cuda_fork(duet_cuda_t *c);
duet_status_t duet_cuda_join(duet_cuda_t *c);
/* Wait until every operation queued on the context has finished; reports asynchronous errors. */
duet_status_t duet_cuda_sync(duet_cuda_t *c);
/* Every wait of the host on the context's device work (duet_cuda_sync, the synchronous copies, a
 * buffer grown while queued work may read the old one, the timers) polls with this deadline
 * (default DUET_CUDA_WAIT_MS; 0 restores it), so that a device that never finishes its work (a
 * hung kernel, a lost GPU) is an error and not a thread blocked forever.  Past it the call fails
 * with DUET_ERR_TIMEOUT and the context is stuck: every later wait fails at once (DUET_ERR_CUDA,
 * with the first reason), since what its stream still holds is unknown, and duet_cuda_destroy
 * leaves its memory as it is (freeing would wait for the device).  A process whose context is
 * stuck ends; its supervisor starts a fresh one. */
#define DUET_CUDA_WAIT_MS 300000u
void duet_cuda_set_wait_timeout(duet_cuda_t *c, uint32_t ms);
int duet_cuda_stuck(const duet_cuda_t *c);
/* For tests: queue a kernel that keeps the stream busy for `ms` milliseconds of device time (one
 * block; a stuck device, as the deadline above sees it).  DUET_ERR_INVALID past 10 minutes. */
duet_status_t duet_cuda_test_hold(duet_cuda_t *c, uint32_t ms);
/* Fences: duet_cuda_fence(c, slot) marks the point the stream has reached (what is queued so
 * far); duet_cuda_fence_passed(c, slot, &passed) asks whether the stream has passed the slot's
 * last mark, not what was queued after it (a slot never marked: passed).  Callers poll it with a
 * deadline of their own (duet_tp_cuda_fence_wait).  DUET_CUDA_FENCES slots; DUET_ERR_INVALID for
 * another. */
#define DUET_CUDA_FENCES 4
duet_status_t duet_cuda_fence(duet_cuda_t *c, int slot);
duet_status_t duet_cuda_fence_passed(duet_cuda_t *c, int slot, int *passed);

/* Device memory (cudaMalloc; never managed memory).  Copies are ordered on the context's stream. */
duet_status_t duet_cuda_malloc(duet_cuda_t *c, void **p, size_t bytes);
void duet_cuda_free(duet_cuda_t *c, void *p);
duet_status_t duet_cuda_upload(duet_cuda_t *c, void *dst, const void *src, size_t bytes);   /* host -> device, synchronous */
duet_status_t duet_cuda_download(duet_cuda_t *c, void *dst, const void *src, size_t bytes); /* device -> host, synchronous */
duet_status_t duet_cuda_memset(duet_cuda_t *c, void *p, int byte, size_t bytes);
/* Pinned host memory, mapped into the device's address space (usable by kernels directly: the host tier). */
duet_status_t duet_cuda_host_alloc(duet_cuda_t *c, void **p, size_t bytes);
void duet_cuda_host_free(duet_cuda_t *c, void *p);
/* Pin and map existing host memory (cudaHostRegister, mapped and portable) so kernels can read and
 * write it; *dev is its address on the device.  Unregister before the memory is freed. */
duet_status_t duet_cuda_host_register(duet_cuda_t *c, void *p, size_t bytes, void **dev);
void duet_cuda_host_unregister(duet_cuda_t *c, void *p);
/* Plain stream-ordered copy (any direction; cudaMemcpyAsync). */
duet_status_t duet_cuda_memcpy(duet_cuda_t *c, void *dst, const void *src, size_t bytes);

/* Event timing on the context's stream: start, queue work, stop returns the
 * elapsed device time in milliseconds (it waits for the stop event). */
duet_status_t duet_cuda_timer_start(duet_cuda_t *c);
duet_status_t duet_cuda_timer_stop(duet_cuda_t *c, float *ms);

/* Phase timing, for finding where a step's GPU time goes without a profiler.  When enabled,
 * duet_cuda_phase(c, id) records an event on the stream: phase `id` starts there and the
 * phase marked before it ends there (DUET_CUDA_PHASE_END closes the last one).  Marks past
 * DUET_CUDA_PHASE_MARKS in one collection are dropped (counted in `dropped`).
 * duet_cuda_phase_collect waits for the last mark and adds every interval to its phase's
 * total.  Ids are the caller's, 0 .. DUET_CUDA_PHASE_IDS-1; an event costs a few
 * microseconds of host time, so leave this off outside measurements.  Marks of a call that
 * failed before its collection stay for the next one; duet_cuda_phase_totals(c, t, 1) drops
 * them. */
#define DUET_CUDA_PHASE_IDS 32
#define DUET_CUDA_PHASE_END (-1)
#define DUET_CUDA_PHASE_MARKS 4096
typedef struct {
    double ms[DUET_CUDA_PHASE_IDS];   /* GPU time between a phase's marks and the next */
    long count[DUET_CUDA_PHASE_IDS];  /* intervals added */
    long collections;                 /* duet_cuda_phase_collect calls that found marks */
    long dropped;
} duet_cuda_phase_totals_t;
duet_status_t duet_cuda_phases_enable(duet_cuda_t *c, int on); /* on: totals cleared */
int duet_cuda_phases_enabled(const duet_cuda_t *c);
duet_status_t duet_cuda_phase(duet_cuda_t *c, int id); /* DUET_OK and nothing recorded when off */
duet_status_t duet_cuda_phase_collect(duet_cuda_t *c);
/* The totals so far; `reset` clears them (and any uncollected marks). */
void duet_cuda_phase_totals(duet_cuda_t *c, duet_cuda_phase_totals_t *t, int reset);

/* Mark the start (on) or end (off) of a span for a profiler run with collection off at start
 * (ncu --profile-from-start off): cudaProfilerStart/Stop; harmless without a profiler. */
duet_status_t duet_cuda_profile_span(duet_cuda_t *c, int on);

/* Fill n elements at p with seeded pseudo-random values, on the device:
 * F32 / BF16 normal(0, 1), F8_E4M3 and U8 uniform over the valid codes (no NaN for e4m3). */
duet_status_t duet_cuda_fill_random(duet_cuda_t *c, void *p, size_t n, duet_dtype_t dtype, uint64_t seed);

/* Batch-invariant mode (off by default): every operation then splits its work
 * the same way whatever the number of rows, so a row's result never depends
 * on the batch (what the engine's chunked prefill needs): matmul takes
 * duet_cuda_matmul_invariant at every n, attn_rows a fixed key split, hc_pre /
 * hc_head a fixed column split.  The other operations are row-independent
 * in both modes. */
void duet_cuda_set_invariant(duet_cuda_t *c, int on);
int duet_cuda_get_invariant(const duet_cuda_t *c);

/* CPU-exact mode (off by default; docs/CUDA.md "CPU-exact mode"): the operations whose fast
 * kernels sum in another order than the CPU reference (matmul, rmsnorm, attn_rows,
 * index_score, hc_pre, hc_head) take kernels in its order and with its roundings instead
 * (exact.cuh), so that every result is the CPU table's bits: slow, for verification and for
 * deployments that need the GPU to reproduce the CPU engine.  The fused and tensor-core forms
 * (matmul_grouped, attn_rows_bf16, hc_pre_norm, hc_head_norm) then fail with
 * DUET_ERR_UNSUPPORTED, and weights are to be uploaded untiled. */
void duet_cuda_set_exact(duet_cuda_t *c, int on);
int duet_cuda_get_exact(const duet_cuda_t *c);

/* Programmatic dependent launches (on by default where the device has them, sm_90 and later):
 * the forward's kernels may be placed once the kernel ahead of them has no block left, before
 * its completion, and wait for it before they read or write anything (the matmuls load their
 * first weights meanwhile).  The same results either way; off (0) for comparison, and for
 * prefill-sized calls, which the engine runs with them off.  The page copy kernels always
 * launch the ordinary way.  Returns whether they are on. */
int duet_cuda_set_pdl(duet_cuda_t *c, int on);

#ifdef __cplusplus
}
#endif

/* One header per operation. */
#include "matmul.cuh"
#include "moe_route.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "cache_entry.cuh"
#include "compress_pool.cuh"
#include "index_score.cuh"
#include "topk.cuh"
#include "attn_rows.cuh"
#include "hc.cuh"
#include "swiglu.cuh"
#include "argmax.cuh"
#include "sample.cuh"
#include "page_copy.cuh"
#include "roofline.cuh"
#include "embed.cuh"
#include "rows.cuh"
#include "comm.cuh"
#include "compress_rows.cuh"
#include "copy_list.cuh"

#endif
