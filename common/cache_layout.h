/* Cache pool layouts: the single source of truth for every byte size (DESIGN §4).
 *
 * A request's cache state lives in six pools:
 *   C4_KV       compressed K=V entries of the ratio-4 layers   (page_tokens/4 per page)
 *   C4_INDEX_K  lightning-indexer keys of the ratio-4 layers  (page_tokens/4 per page)
 *   C128_KV     compressed K=V entries of the ratio-128 layers (page_tokens/128 per page)
 *   SWA_KV      sliding-window ring of every layer            (sliding_window entries per slot)
 *   STATE_C4    compressor + indexer state of ratio-4 layers   (2*4 token rows per slot, fp32)
 *   STATE_C128  compressor state of ratio-128 layers           (128 token rows per slot, fp32)
 * The three paged pools share one page numbering: page i of a request covers
 * its tokens [i*page_tokens, (i+1)*page_tokens).  The ring/state pools are
 * indexed by a per-request slot.  Every pool is layer-major: unit u of the
 * pool's layer l starts at base + (l * n_units + u) * page_bytes.
 *
 * Within a page (or slot) the entries' data rows come first, then their
 * scale rows, then padding up to `align`.
 *   KV fp8:      row = nope fp8 | rope bf16; scales = one ue8m0 per 64 nope values, padded to 8 B
 *                (V4-Flash: 448 + 128 = 576 B data, 8 B scales, 584 B per entry)
 *   KV bf16:     row = head_dim bf16 (1024 B), no scales
 *   index fp8:   row = index_head_dim fp8, scale = one fp32 (132 B)
 *   index bf16:  row = index_head_dim bf16 (256 B), no scales
 *   state:       row = fp32 [kv | gate] of the compressor (C4: 2*head_dim each, then the
 *                indexer's 2*index_head_dim each; C128: head_dim each)
 * No other code computes these sizes: pools, host mirrors, transfer
 * descriptors and copy kernels all take a duet_cache_layout_t. */
#ifndef DUET_CACHE_LAYOUT_H
#define DUET_CACHE_LAYOUT_H

#include <stdint.h>

#include "err.h"
#include "model_config.h"

typedef enum {
    DUET_POOL_C4_KV = 0,
    DUET_POOL_C4_INDEX_K,
    DUET_POOL_C128_KV,
    DUET_POOL_SWA_KV,
    DUET_POOL_STATE_C4,
    DUET_POOL_STATE_C128,
    DUET_POOL_COUNT,
} duet_pool_kind_t;

typedef enum {
    DUET_CACHE_FP8 = 0,  /* fp8_e4m3 */
    DUET_CACHE_BF16 = 1,
    DUET_CACHE_F32 = 2,  /* state pools only */
} duet_cache_dtype_t;

typedef struct {
    int page_tokens;                 /* default 256; a multiple of 128 */
    duet_cache_dtype_t kv_dtype;     /* fp8 or bf16 */
    duet_cache_dtype_t index_k_dtype;/* fp8 or bf16 */
} duet_cache_opts_t;

typedef struct {
    duet_pool_kind_t kind;
    duet_cache_dtype_t dtype;
    uint32_t n_layers;          /* layers holding this pool */
    uint32_t paged;             /* 1: page-numbered pool, 0: per-request slot pool */
    uint32_t entries_per_page;  /* entries per page (or rows per slot) */
    uint32_t vec_dim;           /* floats per entry (head_dim, index_head_dim, state row floats) */
    uint32_t nope_dim;          /* KV fp8: values stored as fp8 (head_dim - rope) */
    uint32_t rope_dim;          /* KV fp8: values stored as bf16 */
    uint32_t entry_data_bytes;  /* bytes of one entry's data row */
    uint32_t entry_scale_bytes; /* bytes of one entry's scale row (0: none) */
    uint32_t entry_bytes;       /* data + scale */
    uint32_t scale_offset;      /* where the scale rows start within a page */
    uint32_t align;             /* page size is a multiple of this */
    uint64_t page_bytes;        /* padded bytes per page (or slot) */
    uint64_t fingerprint;       /* xxh3 over every field above and the model dims */
} duet_cache_layout_t;

/* Compute the layout of pool `kind`.  DUET_ERR_INVALID for options outside
 * the supported set (page_tokens not a positive multiple of 128, dtype not
 * allowed for the pool). */
duet_status_t duet_cache_layout_compute(const duet_model_config_t *cfg, const duet_cache_opts_t *opts,
                                        duet_pool_kind_t kind, duet_cache_layout_t *out, duet_err_t *err);

const char *duet_pool_kind_name(duet_pool_kind_t kind);
const char *duet_cache_dtype_name(duet_cache_dtype_t dt);
/* "fp8" / "bf16" -> dtype; -1 when unknown. */
int duet_cache_dtype_parse(const char *s);

/* Encode one entry `vec` (vec_dim floats) into position `idx` of a page
 * (KV and index-K pools).  fp8 KV: each 64-value block of nope gets the
 * ue8m0 scale 2^ceil(log2(amax/448)) and values round to nearest e4m3; rope
 * rounds to bf16.  fp8 index-K: one fp32 scale amax/448 per entry. */
void duet_cache_entry_store(const duet_cache_layout_t *l, uint8_t *page, uint32_t idx, const float *vec);
/* Decode entry `idx` of a page into vec_dim floats. */
void duet_cache_entry_load(const duet_cache_layout_t *l, const uint8_t *page, uint32_t idx, float *vec);

#endif
