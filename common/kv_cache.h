/* The cache pools of one process: memory for every pool (DESIGN §4), the page
 * and slot allocators, and the per-layer accessor through which every cache
 * read and write goes.
 *
 * Pages (shared numbering across C4_KV, C4_INDEX_K, C128_KV) are FREE, USED
 * or QUARANTINED.  A quarantined page is not on the free list: it waits for
 * a late write to become impossible (DESIGN §3) and is only released by
 * duet_kv_cache_release_quarantine().  Slots (SWA ring + compressor state,
 * one per request) are FREE, USED or QUARANTINED likewise.
 *
 * duet_kv_cache_layer() is the only way to get at a layer's cache memory.
 * It first calls the layer gate (if one is installed) so that a layer whose
 * contents are still being loaded (HiCache host tier) cannot be read early. */
#ifndef DUET_KV_CACHE_H
#define DUET_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cache_layout.h"
#include "err.h"
#include "model_config.h"

typedef struct duet_kv_cache duet_kv_cache_t;

typedef enum {
    DUET_UNIT_FREE = 0,
    DUET_UNIT_USED = 1,
    DUET_UNIT_QUARANTINED = 2,
} duet_unit_state_t;

/* Gate called by duet_kv_cache_layer() before handing out `layer`; it must
 * return only once the layer's memory is valid (or return an error). */
typedef duet_status_t (*duet_layer_gate_fn)(void *arg, int layer);

/* Allocate the pools for `n_pages` token pages and `n_slots` request slots
 * (zeroed host memory; each pool owns whole memory pages).  Layouts come from
 * duet_cache_layout_compute(); a pool with no layers has no memory. */
duet_status_t duet_kv_cache_create(const duet_model_config_t *cfg, const duet_cache_opts_t *opts,
                                   uint32_t n_pages, uint32_t n_slots, duet_kv_cache_t **out,
                                   duet_err_t *err);
void duet_kv_cache_destroy(duet_kv_cache_t **c);

const duet_cache_layout_t *duet_kv_cache_layout(const duet_kv_cache_t *c, duet_pool_kind_t kind);
const duet_cache_opts_t *duet_kv_cache_opts(const duet_kv_cache_t *c);
const duet_model_config_t *duet_kv_cache_config(const duet_kv_cache_t *c);
uint32_t duet_kv_cache_n_pages(const duet_kv_cache_t *c);
uint32_t duet_kv_cache_n_slots(const duet_kv_cache_t *c);
/* Whole memory of a pool (for registration with a transport); NULL/0 when the pool is empty. */
uint8_t *duet_kv_cache_pool_base(const duet_kv_cache_t *c, duet_pool_kind_t kind);
size_t duet_kv_cache_pool_bytes(const duet_kv_cache_t *c, duet_pool_kind_t kind);

/* Take `n` free pages (all or none: DUET_ERR_NO_SPACE leaves nothing taken),
 * lowest ids first, into ids[0..n). */
duet_status_t duet_kv_cache_alloc_pages(duet_kv_cache_t *c, uint32_t n, uint32_t *ids);
/* Return USED pages to the free list.  Nothing changes on error:
 * DUET_ERR_RANGE for an id out of range, DUET_ERR_STATE for an id that is not
 * USED or appears twice. */
duet_status_t duet_kv_cache_free_pages(duet_kv_cache_t *c, const uint32_t *ids, uint32_t n);
/* Move USED pages to QUARANTINED. Same checks as free. */
duet_status_t duet_kv_cache_quarantine_pages(duet_kv_cache_t *c, const uint32_t *ids, uint32_t n);
/* Move QUARANTINED pages to the free list. Same checks (state must be QUARANTINED). */
duet_status_t duet_kv_cache_release_pages(duet_kv_cache_t *c, const uint32_t *ids, uint32_t n);
duet_unit_state_t duet_kv_cache_page_state(const duet_kv_cache_t *c, uint32_t id);
uint32_t duet_kv_cache_free_page_count(const duet_kv_cache_t *c);
uint32_t duet_kv_cache_quarantined_page_count(const duet_kv_cache_t *c);

/* Slots: same state machine as pages, one unit at a time. */
duet_status_t duet_kv_cache_alloc_slot(duet_kv_cache_t *c, uint32_t *slot);
duet_status_t duet_kv_cache_free_slot(duet_kv_cache_t *c, uint32_t slot);
duet_status_t duet_kv_cache_quarantine_slot(duet_kv_cache_t *c, uint32_t slot);
duet_status_t duet_kv_cache_release_slot(duet_kv_cache_t *c, uint32_t slot);
uint32_t duet_kv_cache_free_slot_count(const duet_kv_cache_t *c);
uint32_t duet_kv_cache_quarantined_slot_count(const duet_kv_cache_t *c);

/* Where entries [first, first + n) of a sequence lie, its pages `pages` holding `epp` entries
 * each (epp > 0, first >= 0): unit[i] = pages[(first + i) / epp], idx[i] = (first + i) % epp,
 * with one division for the whole run (index lists a forward call rebuilds every step). */
void duet_kv_cache_entries(const uint32_t *pages, int64_t first, size_t n, uint32_t epp, uint32_t *unit,
                           uint32_t *idx);

/* Install (or clear with NULL) the layer gate. */
void duet_kv_cache_set_layer_gate(duet_kv_cache_t *c, duet_layer_gate_fn fn, void *arg);

/* One layer's view of the pools. */
typedef struct {
    int layer;
    int ratio;                                   /* 0, 4 or 128 */
    const duet_cache_layout_t *layout[DUET_POOL_COUNT];
    uint8_t *base[DUET_POOL_COUNT];              /* this layer's first unit, NULL if the layer has no such pool */
    uint32_t n_units[DUET_POOL_COUNT];           /* pages or slots */
} duet_cache_layer_t;

/* Fill `out` for `layer` after the gate allows it. */
duet_status_t duet_kv_cache_layer(duet_kv_cache_t *c, int layer, duet_cache_layer_t *out);
/* The same view without calling the gate.  Only for the loader whose
 * per-layer completion the gate waits for (HiCache's copy thread): it writes
 * the layer that readers are held back from. */
duet_status_t duet_kv_cache_layer_for_loader(duet_kv_cache_t *c, int layer, duet_cache_layer_t *out);

/* Address of page/slot `unit` of pool `kind` in a layer view (NULL when absent or out of range). */
static inline uint8_t *duet_cache_layer_unit(const duet_cache_layer_t *v, duet_pool_kind_t kind, uint32_t unit)
{
    if (!v->base[kind] || unit >= v->n_units[kind])
        return NULL;
    return v->base[kind] + (size_t)unit * v->layout[kind]->page_bytes;
}

#endif
