/* Where a worker's forward runs (--device cpu|cuda[:N]), behind one interface
 * for duet-prefill and duet-decode.
 *
 * CPU: duet_forward_hooked() over the host cache; the staging calls do nothing.
 * CUDA: the weights are uploaded once (duet_model_cuda_t), the forward runs on
 * the GPU (duet_forward_cuda_ex) over device pools that mirror the host cache
 * unit for unit (same pages, same slots: allocation stays on the host cache).
 * The host pools remain the data plane's registered memory, so transfers go
 * through them (docs/SERVERS.md, "On the GPU"): prefill copies each finished
 * layer of the requests completing in a step device -> host before its puts
 * (duet_worker_engine_to_host, from the layer hook), decode copies a request's
 * received pages and slot host -> device once its TransferDone has been
 * verified (duet_worker_engine_to_device_n: the requests whose transfers one
 * poll of the data plane reported, in one copy).  Both are batched page-copy
 * kernels, one launch per pool, and return once the copy is complete.
 *
 * Sampling: a token is the same function of (logits, seed, position) on both
 * backends.  On the CPU every row is drawn by duet_sample_batch().  On the GPU a
 * step's logits stay on the device: greedy rows take the device's argmax and
 * sampled rows the device's draw (duet_cuda_sample), each picking what
 * duet_sample() picks bit for bit, so only ids cross to the host
 * (duet_worker_engine_decode, and duet_worker_engine_prefill for the first
 * tokens); DUET_DRAW_HOST=1 draws sampled rows on the host instead (the logits
 * buffer is pinned). */
#ifndef DUET_WORKER_ENGINE_H
#define DUET_WORKER_ENGINE_H

#include <stdint.h>

#include "err.h"
#include "forward.h"
#include "kv_cache.h"
#include "model.h"
#include "sampling.h"
#include "worker_opts.h"
#include "xfer.h"

typedef struct {
    const duet_model_t *model;
    duet_kv_cache_t *cache;
    int device;         /* -1: the CPU; else the first GPU of the group */
    int tp;             /* tensor-parallel size (GPUs device .. device+tp-1) */
    int receives;       /* decode: the data plane writes into this cache (set before the xfer calls) */
    int host_mirror;    /* prefill: the prefix cache reads and fills the host pools, so the data plane stages through them */
    int direct;         /* the data plane uses the device pools straight (duet_worker_engine_xfer_register) */
    void *xfer_gpu;     /* the data plane thread's CUDA context and bounce buffer */
    void *gpu;          /* CUDA state (engine/tp_cuda.h: contexts, device weights, device pools); NULL on the CPU */
    float *logits;      /* (logit_rows, vocab) host rows the forward writes; pinned on the GPU */
    uint32_t logit_rows;
    float *dlogits;     /* GPU: (logit_rows, vocab) on the first GPU, a step's logits rows (made at the first) */
    int32_t *dids;      /* GPU: their logit_rows ids */
    /* staging counters: bytes moved, wall time of the copies (launch to completion), the calls and
     * the sequences they copied */
    uint64_t d2h_bytes, d2h_ns, d2h_calls, d2h_seqs;
    uint64_t h2d_bytes, h2d_ns, h2d_calls, h2d_seqs;
    /* decode steps (duet_worker_engine_decode): their rows and count, and of those the rows drawn
     * on the host, the steps that had any, and the wall time of their logits' download (GPU)
     * and the draws; on the GPU, the sampled rows drawn there, the steps that had any, and the
     * wall time from the argmax's launch to the ids' arrival */
    uint64_t step_rows, steps, draw_rows, draw_steps, draw_ns;
    uint64_t gpu_draw_rows, gpu_draw_steps, gpu_draw_ns;
    int draw_host; /* GPU: sampled rows drawn on the host all the same (DUET_DRAW_HOST=1) */
    /* GPU, for tests of the step deadline (DUET_TEST_GPU_HOLD=N:MS): before the engine's Nth
     * forward (from 1) its first device is kept busy MS ms, as a stuck device would be */
    uint32_t test_hold_at, test_hold_ms, forwards;
} duet_worker_engine_t;

/* Set up the forward for --device (o->device), over `cache`, with a logits buffer of
 * `logit_rows` rows.  CUDA: opens the device, uploads the weights, creates the device pools
 * and maps the host pools for the staging copies. */
duet_status_t duet_worker_engine_open(duet_worker_engine_t *e, const duet_worker_opts_t *o,
                                      const duet_model_t *model, duet_kv_cache_t *cache, uint32_t logit_rows,
                                      duet_err_t *err);
/* Release everything (safe on a zeroed or half-opened engine). */
void duet_worker_engine_close(duet_worker_engine_t *e);

static inline int duet_worker_engine_on_gpu(const duet_worker_engine_t *e) { return e->gpu != NULL; }
/* Whether the engine's GPUs can run nothing more: the GPU group is broken (a rank failed or
 * hung), or a wait of the host on a device (the step's, a copy's, the data plane's) passed the
 * step deadline (DUET_TP_STEP_TIMEOUT_MS), which leaves the device stuck: a kernel that never
 * ends cannot be taken back.  The servers then end the worker (its supervisor restarts it; to
 * the router and the other workers, a worker gone) instead of failing every later request.
 * Always 0 on the CPU. */
int duet_worker_engine_gpu_lost(const duet_worker_engine_t *e);

/* A decode step and its tokens: the forward of `n` items (one token each, logits LAST; their
 * logits pointers are set here to rows of e->logits), then tok[i] = duet_sample(row i, sp[i],
 * position items[i].seq->n_past after the step), sampled rows on up to `threads` threads.  On
 * the GPU the logits stay on the device: greedy rows (temperature not > 0) take the device
 * argmax, sampled rows the device draw (duet_cuda_sample, the host's token bit for bit), and
 * only the ids come back; with DUET_DRAW_HOST=1 in the environment, or a vocabulary beyond
 * the device draw's, sampled rows' logits are downloaded and drawn on the host.  RANGE for
 * more rows than the logits buffer holds. */
duet_status_t duet_worker_engine_decode(duet_worker_engine_t *e, duet_fwd_item_t *items, int n,
                                        const duet_sampling_t *const *sp, int32_t *tok, int threads,
                                        duet_err_t *err);

/* A prefill step and the first tokens of the requests it finishes: the forward of `n` items
 * (duet_forward_hooked on the chosen backend; layer_done may be NULL: on the CPU it runs after each
 * layer, on the GPU once the layer's attention is queued, without waiting for it, so a hook that
 * reads the layer's cache stages it with duet_worker_engine_to_host_queue and waits on the fence
 * before its puts), then for each item whose
 * logits_mode is LAST (its final chunk; at most logit_rows of them, their logits pointers set
 * here to rows of e->logits) tok[i] = duet_sample(its row, sp[i], pos[i]) on up to `threads`
 * threads; on the GPU drawn on the device as duet_worker_engine_decode's rows.  Other items'
 * sp, pos and tok are not read or written; logits_mode ALL is INVALID, more LAST items than
 * logit_rows RANGE. */
duet_status_t duet_worker_engine_prefill(duet_worker_engine_t *e, duet_fwd_item_t *items, int n,
                                         duet_layer_done_fn layer_done, void *arg, const duet_sampling_t *const *sp,
                                         const int64_t *pos, int32_t *tok, int threads, duet_err_t *err);
/* GPU: copy layer `layer`'s units of the sequences (all their pages in every paged pool the
 * layer has, and their slot) from the device pools into the host pools.  CPU: nothing. */
duet_status_t duet_worker_engine_to_host(duet_worker_engine_t *e, int layer, const duet_seq_t *const *seqs,
                                         uint32_t n, duet_err_t *err);
/* The same, queued behind the forward's work so far and not waited for, then a fence marked in
 * `slot` (0 .. 3) behind it (in direct mode, the fence alone: the data plane reads the device
 * pools).  duet_worker_engine_fence_wait(e, slot) returns once the stream has passed the slot's
 * mark: the copy is in the host pools.  The wait has a deadline (duet_tp_cuda_fence_wait); when
 * it fails the copy may still land, and the pages it writes must not be given back.  For the
 * hook of a forward run with layer_done_queued (duet_worker_engine_prefill on the GPU).  CPU:
 * nothing. */
duet_status_t duet_worker_engine_to_host_queue(duet_worker_engine_t *e, int layer, const duet_seq_t *const *seqs,
                                               uint32_t n, int slot, duet_err_t *err);
duet_status_t duet_worker_engine_fence_wait(duet_worker_engine_t *e, int slot, duet_err_t *err);
/* The same, calling idle(arg) for as long as the stream has not passed the mark (the prefill
 * server answers its control calls there, so a caller that sends one call at a time is not held
 * for the rest of the step).  idle should return within tens of microseconds when it has
 * nothing to do. */
duet_status_t duet_worker_engine_fence_wait_idle(duet_worker_engine_t *e, int slot, void (*idle)(void *), void *arg,
                                                 duet_err_t *err);
/* GPU: copy the first `n_pages` pages (every layer) and the slot of `seq` from the host pools
 * into the device pools.  CPU: nothing. */
duet_status_t duet_worker_engine_to_device(duet_worker_engine_t *e, const duet_seq_t *seq, uint32_t n_pages,
                                           duet_err_t *err);
/* The same for n sequences in one copy (one id list, one launch a pool, one wait): sequence i's
 * first n_pages[i] pages and its slot. */
duet_status_t duet_worker_engine_to_device_n(duet_worker_engine_t *e, const duet_seq_t *const *seqs,
                                             const uint32_t *n_pages, uint32_t n, duet_err_t *err);

/* The data plane on the GPU (docs/DATAPLANE.md, "Device memory").  prepare: before
 * duet_xfer_create, give the engine staging ops (a CUDA context of its own on the first GPU and
 * a pinned bounce buffer) and a thread hook binding that GPU to its progress thread; nothing on
 * the CPU.  register: after it, register the pools -- rank 0's device pools with
 * DUET_XFER_POOL_DEVICE when UCX has CUDA (then to_host / to_device do nothing: puts go GPU to
 * GPU), else the host pools (staging).  DUET_XFER_DEVICE=0 keeps the staging path; so does a
 * tensor-parallel receiver.  Logs which path it took. */
duet_status_t duet_worker_engine_xfer_prepare(duet_worker_engine_t *e, duet_xfer_opts_t *xo, duet_err_t *err);
duet_status_t duet_worker_engine_xfer_register(duet_worker_engine_t *e, duet_xfer_t *x, duet_err_t *err);

/* One log line with the staging counters (GPU only). */
void duet_worker_engine_log_stats(const duet_worker_engine_t *e, const char *who);
/* Threads for a step's host draws: the host's cores, at most 16. */
int duet_worker_engine_draw_threads(void);
/* The decode steps' draws: a line for the host's (rows drawn of the rows stepped, steps with any
 * of the steps, the mean time of a step's draws) and on the GPU one for the device's. */
void duet_worker_engine_log_draws(const duet_worker_engine_t *e, const char *who);

#endif
