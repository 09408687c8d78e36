/* A tensor-parallel group on the GPUs of one process (docs/CUDA.md, "Tensor
 * parallelism"): one context, one share of the weights (forward_cuda.h,
 * duet_model_cuda_upload_tp) and one set of device pools per GPU, and one host
 * thread per GPU that runs its rank's forward.  The host cache (pages, slots,
 * the transfer's registered memory) stays one, shared by the ranks: every
 * rank's device pools mirror it unit for unit and, the MQA cache being
 * replicated, hold the same bytes.
 *
 * Size 1 is the plain single-GPU engine (no threads, no NCCL).  Size T > 1
 * uses devices device0 .. device0+T-1 and NCCL (kernels/cuda/comm.cuh).
 *
 * A forward call hands the items to every rank and waits for all of them
 * with a deadline (DUET_TP_STEP_TIMEOUT_MS, default 300000).  If a rank fails
 * or the deadline passes, every communicator is aborted (so no rank waits on
 * a collective forever), the call returns the first error, and the group is
 * broken: every later call fails at once (the worker is restarted by its
 * supervisor).  Only rank 0 writes logits, runs the layer hook and reports
 * stats; the items' n_past advance once, after every rank has finished. */
#ifndef DUET_TP_CUDA_H
#define DUET_TP_CUDA_H

#include "forward_cuda.h"

typedef struct duet_tp_cuda duet_tp_cuda_t;

duet_status_t duet_tp_cuda_open(const duet_model_t *m, duet_kv_cache_t *host, int device0, int size,
                                duet_tp_cuda_t **out, duet_err_t *err);
void duet_tp_cuda_close(duet_tp_cuda_t **t);

int duet_tp_cuda_size(const duet_tp_cuda_t *t);
duet_cuda_t *duet_tp_cuda_context(const duet_tp_cuda_t *t, int rank);
duet_model_cuda_t *duet_tp_cuda_model(const duet_tp_cuda_t *t, int rank);
duet_kv_cache_cuda_t *duet_tp_cuda_cache(const duet_tp_cuda_t *t, int rank);
/* Device bytes of weights over every rank. */
size_t duet_tp_cuda_weight_bytes(const duet_tp_cuda_t *t);
/* One line: "cuda:0 (NVIDIA H200, sm_90)" or "cuda:0-1, tensor-parallel over 2 GPUs (NCCL 2.27.3)". */
void duet_tp_cuda_describe(const duet_tp_cuda_t *t, char *buf, size_t len);

/* duet_forward_cuda_ex on every rank (opts apply to rank 0; NULL: none). */
duet_status_t duet_tp_cuda_forward(duet_tp_cuda_t *t, duet_fwd_item_t *items, int n_items,
                                   const duet_fwd_cuda_opts_t *opts, duet_err_t *err);

/* Staging (forward_cuda.h): map every rank's view of the host pools; TO_HOST copies from rank 0's
 * device pools (every rank holds the same bytes), TO_DEVICE into every rank's. */
duet_status_t duet_tp_cuda_map_host(duet_tp_cuda_t *t, duet_err_t *err);
duet_status_t duet_tp_cuda_stage(duet_tp_cuda_t *t, duet_stage_dir_t dir, int layer, const duet_seq_t *const *seqs,
                                 const uint32_t *n_pages, uint32_t n, uint64_t *bytes, duet_err_t *err);
/* TO_HOST from rank 0, queued behind rank 0's forward and not waited for (duet_kv_cache_cuda_stage_queue);
 * then duet_tp_cuda_fence marks rank 0's stream, and duet_tp_cuda_fence_wait returns once the
 * stream has passed the mark, calling idle(arg) between its polls (NULL: a yield).  The wait has
 * the group's step deadline (DUET_TP_STEP_TIMEOUT_MS): past it the device is taken as stuck, the
 * group is broken and the wait returns DUET_ERR_TIMEOUT; on a broken group it fails at once.
 * Either way the copies behind the mark may still land: the pages they write must not be given
 * back. */
duet_status_t duet_tp_cuda_stage_queue(duet_tp_cuda_t *t, int layer, const duet_seq_t *const *seqs, uint32_t n,
                                       uint64_t *bytes, duet_err_t *err);
duet_status_t duet_tp_cuda_fence(duet_tp_cuda_t *t, int slot, duet_err_t *err);
/* Whether the group can run nothing more: it is broken (a rank failed or hung), or a wait of the
 * host on one of its devices passed the step deadline (every rank context's waits have it:
 * duet_cuda_set_wait_timeout), which leaves that device stuck. */
int duet_tp_cuda_lost(duet_tp_cuda_t *t);
/* The step deadline (DUET_TP_STEP_TIMEOUT_MS, default 300000 ms), for the other contexts of the
 * process on the group's devices. */
uint32_t duet_tp_cuda_step_timeout_ms(const duet_tp_cuda_t *t);
duet_status_t duet_tp_cuda_fence_wait(duet_tp_cuda_t *t, int slot, void (*idle)(void *), void *arg, duet_err_t *err);

#endif
