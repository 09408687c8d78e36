/* The forward pass: one call runs any mix of prefill chunks and single decode
 * tokens for a batch of sequences, each with its own cache state.
 *
 * Cache discipline (what makes chunking and batching bit-exact): every K=V
 * vector, compressed entry and indexer key is written to its pool in the
 * pool's encoding and attention reads it back from there, so a key has the
 * same bits whether it was computed in this call or an earlier one.  Rows of
 * the current chunk that are not yet in the SWA ring go through the same
 * encode/decode.  All reads go through duet_kv_cache_layer(). */
#ifndef DUET_FORWARD_H
#define DUET_FORWARD_H

#include <stdint.h>

#include "err.h"
#include "kv_cache.h"
#include "model.h"

/* A sequence's cache state: its token pages, its ring/state slot, and how many tokens are cached. */
typedef struct {
    uint32_t *pages;
    uint32_t n_pages, cap_pages;
    uint32_t slot;
    int has_slot;
    int64_t n_past;
} duet_seq_t;

/* Take a slot for a new sequence (n_past = 0, no pages). */
duet_status_t duet_seq_init(duet_kv_cache_t *c, duet_seq_t *s, duet_err_t *err);
/* Make sure pages cover `n_tokens` tokens (all-or-nothing). */
duet_status_t duet_seq_reserve(duet_kv_cache_t *c, duet_seq_t *s, int64_t n_tokens, duet_err_t *err);
/* Give every page and the slot back (free list) and reset the sequence. */
void duet_seq_release(duet_kv_cache_t *c, duet_seq_t *s);

typedef enum {
    DUET_LOGITS_NONE = 0,
    DUET_LOGITS_LAST = 1, /* one row: the last token of the chunk */
    DUET_LOGITS_ALL = 2,  /* n_tokens rows */
} duet_logits_mode_t;

typedef struct {
    duet_seq_t *seq;
    const int32_t *tokens;     /* at positions seq->n_past .. + n_tokens - 1 */
    int n_tokens;
    duet_logits_mode_t logits_mode;
    float *logits;             /* (rows, vocab), caller-owned */
} duet_fwd_item_t;

/* Run the items; on success each seq->n_past advances by its n_tokens.  Token
 * ids outside the vocabulary, a sequence without enough pages, or a sequence
 * appearing twice give a typed error before anything is written. */
duet_status_t duet_forward(const duet_model_t *m, duet_kv_cache_t *cache, duet_fwd_item_t *items, int n_items,
                           duet_err_t *err);

/* The checks every backend's forward makes before touching a cache: each item has a sequence
 * with a slot, tokens inside the vocabulary, pages for every position, no sequence twice, and a
 * logits buffer when it asks for logits (unless logits_elsewhere: the caller collects them).
 * *rows: the items' tokens in all. */
duet_status_t duet_fwd_items_check(const duet_model_config_t *c, const duet_kv_cache_t *cache,
                                   const duet_fwd_item_t *items, int n_items, int logits_elsewhere, int *rows,
                                   duet_err_t *err);

/* MoE routing of one row (the model's contract, shared by every backend's host path and the
 * CUDA routing check): logit(E) gate logits are scored (sqrt-softplus, sigmoid or softmax),
 * the K experts picked (hash_ids when the layer routes by token id, else the top K of score +
 * bias, ties to the lower id), and their weights normalized (norm) and scaled.
 * scratch: 2*E floats. */
void duet_moe_route_row(const float *logit, int E, int K, duet_score_fn_t scoring, int norm, float scale,
                        const float *bias, const int32_t *hash_ids, float *scratch, int32_t *sel, float *w);

/* Called once per layer as soon as every cache write of that layer (pools,
 * ring, compressor state) for all items is complete — before the next layer
 * starts.  Prefill uses it to push a layer's pages while later layers
 * compute (DESIGN §2 step 5).  Returning an error stops the forward. */
typedef duet_status_t (*duet_layer_done_fn)(void *arg, int layer);

duet_status_t duet_forward_hooked(const duet_model_t *m, duet_kv_cache_t *cache, duet_fwd_item_t *items,
                                  int n_items, duet_layer_done_fn layer_done, void *arg, duet_err_t *err);

/* Test hook: deliberately wrong math, so the numerical tests can show they
 * would notice a wrong RoPE, mask, compressor overlap or attention sink.
 * Always DUET_FAULT_NONE outside those tests. */
typedef enum {
    DUET_FAULT_NONE = 0,
    DUET_FAULT_ROPE,    /* compressed layers use the main rope table */
    DUET_FAULT_MASK,    /* sliding window one key too wide */
    DUET_FAULT_OVERLAP, /* C4 entries pool without the previous window's overlap slice */
    DUET_FAULT_SINK,    /* attention ignores the sink */
} duet_fault_t;

extern duet_fault_t duet_forward_fault;

#endif
