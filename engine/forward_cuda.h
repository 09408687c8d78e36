/* The forward pass on the GPU: engine/forward.c's algorithm step for step,
 * on the CUDA backend's operations (kernels/cuda/duet_cuda.h), with the
 * weights and the cache pools in device memory.
 *
 * - duet_model_cuda_t: device copies of a loaded model's weights (uploaded
 *   once), plus the device workspace the forward reuses between calls.
 * - duet_kv_cache_cuda_t: device pools beside a host duet_kv_cache_t, with
 *   the same layouts byte for byte (duet_cache_layout_compute).  Pages and
 *   slots are still allocated on the host cache (duet_seq_* and its page
 *   lists); the host pools' memory is left untouched (the host cache
 *   allocates it lazily zeroed, so it costs no resident memory).  Every
 *   layer's device addresses come from duet_kv_cache_layer() (so the layer
 *   gate still applies) by the offset of the host view in its pool.
 * - duet_forward_cuda(): same items, validation, cache discipline and output
 *   as duet_forward().  Positions are known on the host, so the host builds
 *   the index lists (window keys, compressor windows, page tables) once per
 *   call, uploads them in one copy and every layer reuses them; the top-k
 *   selection of C4 entries stays on the device.  MoE routing is computed
 *   on the host from the device's gate logits (one download per layer) with
 *   the CPU engine's code, then the experts run on the device.
 *
 * Batch invariance: the context is switched to duet_cuda_set_invariant(),
 * so a row's result does not depend on the other rows or on the chunking
 * (docs/CUDA.md).  Against the CPU engine the logits agree to a stated
 * normalized error (docs/CUDA.md, "The engine on the GPU"), not bit for bit. */
#ifndef DUET_FORWARD_CUDA_H
#define DUET_FORWARD_CUDA_H

#include "duet_cuda.h"
#include "forward.h"

typedef struct duet_model_cuda duet_model_cuda_t;
typedef struct duet_kv_cache_cuda duet_kv_cache_cuda_t;

/* Upload every weight of `m` (which must outlive the result) to the device of `c`. */
duet_status_t duet_model_cuda_upload(duet_cuda_t *c, const duet_model_t *m, duet_model_cuda_t **out,
                                     duet_err_t *err);

/* Tensor parallelism (docs/CUDA.md, "Tensor parallelism"): rank r of T computes
 *   attention: heads [r*H/T, (r+1)*H/T) (its rows of wq_b, its heads of the attention) and output
 *              groups [r*G/T, (r+1)*G/T) of wo_a (both matrices are held whole: only the routed
 *              experts and the head are split in memory); the groups' outputs are all-gathered
 *              and wo_b (whole on every rank) reads what one GPU reads.  What writes the cache
 *              (wkv, the compressors, the indexer) is whole on every rank: the MQA cache is
 *              replicated and every rank's device pools hold the same bytes.
 *   MoE:       routed experts [r*E/T, (r+1)*E/T), each held by its rank only; routing, the sort
 *              and the shared expert run whole on every rank; each rank computes its experts'
 *              rows at their sorted positions, the rows are all-gathered and every rank
 *              combines them in one GPU's order.
 *   head:      rank 0 only (the logits are rank 0's).
 * Every step is one GPU's arithmetic on the same values (the batch-invariant kernels give a
 * row, a head or an expert's tile the same bits whatever else is in the launch), so the
 * group's output is bit for bit the single GPU's, and a cache written by a group of one size
 * is read by a group of any other.  H and G must be divisible by T and the experts must take the
 * grouped path (duet_model_cuda_tp_check, upload).  Every rank runs duet_forward_cuda_ex with
 * the same items at the same time on its own host thread (engine/tp_cuda.h); set the
 * communicator first (duet_model_cuda_set_comm). */
#define DUET_TP_MAX 8
duet_status_t duet_model_cuda_tp_check(const duet_model_config_t *cfg, int tp_size, duet_err_t *err);
duet_status_t duet_model_cuda_upload_tp(duet_cuda_t *c, const duet_model_t *m, int tp_rank, int tp_size,
                                        duet_model_cuda_t **out, duet_err_t *err);
void duet_model_cuda_set_comm(duet_model_cuda_t *mc, duet_cuda_comm_t *comm);
void duet_model_cuda_destroy(duet_model_cuda_t **mc);
/* Device bytes held by the weights. */
size_t duet_model_cuda_weight_bytes(const duet_model_cuda_t *mc);
duet_cuda_t *duet_model_cuda_context(const duet_model_cuda_t *mc);

/* Device pools for `host` (zeroed), which must outlive the result. */
duet_status_t duet_kv_cache_cuda_create(duet_cuda_t *c, duet_kv_cache_t *host, duet_kv_cache_cuda_t **out,
                                        duet_err_t *err);
void duet_kv_cache_cuda_destroy(duet_kv_cache_cuda_t **dc);
duet_kv_cache_t *duet_kv_cache_cuda_host(const duet_kv_cache_cuda_t *dc);
/* Whole device memory of a pool (NULL when the pool is empty). */
uint8_t *duet_kv_cache_cuda_pool_base(const duet_kv_cache_cuda_t *dc, duet_pool_kind_t kind);
/* Copy `src`'s cached state (its pages in every paged pool, its slot in the ring and state
 * pools) into `dst`, which holds a slot and at least as many pages; dst->n_past = src->n_past. */
duet_status_t duet_kv_cache_cuda_copy_seq(duet_kv_cache_cuda_t *dc, const duet_seq_t *src, duet_seq_t *dst,
                                          duet_err_t *err);

/* The data plane through staging (docs/SERVERS.md, "On the GPU").  Where UCX cannot register
 * device memory, the host pools stay the transfer's memory and mirror the device pools unit for
 * unit: a sender copies a finished layer's units device -> host before putting them, a receiver
 * copies what arrived host -> device before decoding.  The copies are batched page-copy kernels
 * (one launch per pool per call, never one cudaMemcpy per page) that write or read the host
 * pools through the device's mapping of them. */

/* Pin and map every host pool (cudaHostRegister), once, before any staging copy; undone by
 * duet_kv_cache_cuda_destroy().  Idempotent. */
duet_status_t duet_kv_cache_cuda_map_host(duet_kv_cache_cuda_t *dc, duet_err_t *err);
/* The same for a second device's pools over the same host cache: the registration is portable
 * (every device sees the host pools at one address), so `dc` uses `owner`'s and does not
 * unregister it; `owner` must outlive `dc`'s staging. */
duet_status_t duet_kv_cache_cuda_map_host_shared(duet_kv_cache_cuda_t *dc, const duet_kv_cache_cuda_t *owner,
                                                duet_err_t *err);

typedef enum { DUET_STAGE_TO_HOST = 0, DUET_STAGE_TO_DEVICE = 1 } duet_stage_dir_t;

/* Copy the units of `n` sequences between the device pools and the mapped host pools: the first
 * n_pages[i] pages of seqs[i] (n_pages NULL: all of its pages) in every paged pool and its slot
 * in the ring and state pools.  layer >= 0: that layer's units only (the pools it has), one
 * launch per pool; layer < 0: every layer, one launch per pool.  Returns once the copy is
 * complete; *bytes (optional) gets the bytes moved.  INVALID before duet_kv_cache_cuda_map_host,
 * for a sequence without a slot, or for more pages than it holds; RANGE for a unit out of range. */
duet_status_t duet_kv_cache_cuda_stage(duet_kv_cache_cuda_t *dc, duet_stage_dir_t dir, int layer,
                                       const duet_seq_t *const *seqs, const uint32_t *n_pages, uint32_t n,
                                       uint64_t *bytes, duet_err_t *err);
/* The same copy queued on the forward's stream behind what is queued there (a layer's work), and
 * not waited for: the caller marks a fence (duet_cuda_fence on the pools' context) and waits on it
 * before anything reads what the copy writes. */
duet_status_t duet_kv_cache_cuda_stage_queue(duet_kv_cache_cuda_t *dc, duet_stage_dir_t dir, int layer,
                                             const duet_seq_t *const *seqs, const uint32_t *n_pages, uint32_t n,
                                             uint64_t *bytes, duet_err_t *err);

/* What one forward call moved and computed (for roofline ratios). */
typedef struct {
    double weight_bytes; /* weight bytes the matmuls read (each routed expert once) */
    double cache_bytes;  /* encoded cache entries read (window, compressed, indexer keys) */
    double flops;        /* matmuls + attention + indexer, 2 per multiply-add */
    double host_plan_s;  /* host seconds from the call's start to the plan's upload queued */
    double host_queue_s; /* host seconds from the call's start to its last launch queued (the wait
                          * for the device follows): near the call's time, the host bounds it */
    int rows;
} duet_fwd_cuda_stats_t;

typedef struct {
    duet_layer_done_fn layer_done; /* as duet_forward_hooked (called after a device sync) */
    /* layer_done called as soon as the layer's attention is queued, without the sync: the hook
     * orders its own work on the stream and fences it (the prefill server's staging copies) */
    int layer_done_queued;
    void *arg;
    /* Non-NULL: the logits rows go here (device memory, the items' rows in item order:
     * one for LAST, n_tokens for ALL) and the items' host buffers are not written. */
    float *logits_dev;
    duet_fwd_cuda_stats_t *stats; /* optional out */
    int no_advance; /* leave the items' n_past alone (tensor parallelism: the group advances them once) */
} duet_fwd_cuda_opts_t;

/* The phases a forward call marks when its context's phase timing is on
 * (duet_cuda_phases_enable; duet-check-forward --bench --phases prints them). */
typedef enum {
    DUET_FP_EMBED = 0,   /* the plan's upload, embedding */
    DUET_FP_HC,          /* hyper-connection pre/post, the layer norms */
    DUET_FP_ATTN_PROJ,   /* q, kv, compressor and indexer projections, their norms and RoPE */
    DUET_FP_COMPRESS,    /* compressors: pooled entries into the caches, state rings */
    DUET_FP_KEYS,        /* window and C128 entries decoded from the caches */
    DUET_FP_INDEX,       /* indexer: keys decoded, scores, top-k */
    DUET_FP_ATTN,        /* keys gathered (selected C4 entries decoded), sparse attention */
    DUET_FP_ATTN_OUT,    /* the window store, inverse RoPE, wo_a and wo_b */
    DUET_FP_MOE_ROUTE,   /* gate logits, routing, the assignments sorted */
    DUET_FP_MOE_EXPERTS, /* routed experts: w1 and w3, SwiGLU, w2 */
    DUET_FP_MOE_SHARED,  /* the shared expert, each row's sum over its experts */
    DUET_FP_HEAD,        /* final norm, output head, logits */
    DUET_FP_COUNT
} duet_fwd_phase_t;
const char *duet_fwd_phase_name(int phase);
/* The totals as " phase ms (share%);" for each phase that ran, largest first, the ms per
 * collected call, into buf (truncated to len); returns the total GPU ms a call. */
double duet_fwd_phase_line(const duet_cuda_phase_totals_t *t, char *buf, size_t len);

duet_status_t duet_forward_cuda(duet_model_cuda_t *mc, duet_kv_cache_cuda_t *dc, duet_fwd_item_t *items,
                                int n_items, duet_err_t *err);
duet_status_t duet_forward_cuda_ex(duet_model_cuda_t *mc, duet_kv_cache_cuda_t *dc, duet_fwd_item_t *items,
                                   int n_items, const duet_fwd_cuda_opts_t *opts, duet_err_t *err);

#endif
