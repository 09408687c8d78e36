/* The cache pools of one process (contract in kv_cache.h).
 *
 * Memory: one 64-byte aligned, zeroed block per pool, layer-major:
 *   pool[kind]  (n_layers, n_units, page_bytes)   n_units = n_pages or n_slots
 * Allocators: pages and slots each have a unit_alloc_t: a state byte per unit
 * and a bitmap of free units (bit set = free) scanned from `hint`, the lowest
 * word that may hold a free bit.  Taking n units costs O(n_units/64 + n) at
 * worst; freeing one costs O(1).  One mutex guards both allocators and the
 * gate; the pool memory itself is not locked (its users own their units). */
#include "kv_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"

typedef struct {
    uint32_t n;          /* units */
    uint8_t *state;      /* (n) duet_unit_state_t */
    uint64_t *free_bits; /* (ceil(n/64)) bit u%64 of word u/64 set: unit u is FREE */
    uint32_t n_words;
    uint32_t hint;       /* words below hint have no free bit */
    uint32_t n_free, n_quarantined;
} unit_alloc_t;

struct duet_kv_cache {
    duet_model_config_t cfg;
    duet_cache_opts_t opts;
    uint32_t n_pages, n_slots;
    duet_cache_layout_t layout[DUET_POOL_COUNT];
    uint8_t *mem[DUET_POOL_COUNT]; /* NULL when the pool has no bytes */
    size_t bytes[DUET_POOL_COUNT];
    pthread_mutex_t mu;            /* guards pages, slots, gate, gate_arg */
    int mu_ready;
    unit_alloc_t pages, slots;
    duet_layer_gate_fn gate;
    void *gate_arg;
};

/* ---- unit allocator (caller holds the mutex) ---- */

static int ua_init(unit_alloc_t *a, uint32_t n)
{
    a->n = n;
    a->n_words = (uint32_t)(((uint64_t)n + 63) / 64);
    a->state = duet_calloc(n ? n : 1, 1); /* all DUET_UNIT_FREE (0) */
    a->free_bits = duet_calloc(a->n_words ? a->n_words : 1, sizeof(uint64_t));
    if (!a->state || !a->free_bits)
        return -1;
    for (uint32_t w = 0; w < a->n_words; w++) {
        uint32_t left = n - w * 64;
        a->free_bits[w] = left >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << left) - 1);
    }
    a->hint = 0;
    a->n_free = n;
    a->n_quarantined = 0;
    return 0;
}

static void ua_fini(unit_alloc_t *a)
{
    free(a->state);
    free(a->free_bits);
    memset(a, 0, sizeof *a);
}

/* Move unit u to state `to`, keeping the bitmap and counters in step. */
static void ua_set(unit_alloc_t *a, uint32_t u, duet_unit_state_t to)
{
    duet_unit_state_t from = (duet_unit_state_t)a->state[u];
    uint32_t w = u / 64;
    uint64_t bit = (uint64_t)1 << (u % 64);
    if (from == DUET_UNIT_FREE) {
        a->free_bits[w] &= ~bit;
        a->n_free--;
    } else if (from == DUET_UNIT_QUARANTINED) {
        a->n_quarantined--;
    }
    if (to == DUET_UNIT_FREE) {
        a->free_bits[w] |= bit;
        a->n_free++;
        if (w < a->hint)
            a->hint = w;
    } else if (to == DUET_UNIT_QUARANTINED) {
        a->n_quarantined++;
    }
    a->state[u] = (uint8_t)to;
}

/* Take n FREE units, lowest ids first; all or none. */
static duet_status_t ua_take(unit_alloc_t *a, uint32_t n, uint32_t *ids)
{
    if (n > a->n_free)
        return DUET_ERR_NO_SPACE;
    uint32_t got = 0, w = a->hint;
    while (got < n) {
        uint64_t word = a->free_bits[w];
        while (word && got < n) {
            uint32_t u = w * 64 + (uint32_t)__builtin_ctzll(word);
            word &= word - 1;
            ids[got++] = u;
        }
        if (got < n || word == 0)
            w++;
        /* the loop ends inside the bitmap: n <= n_free free bits lie at or above hint */
    }
    for (uint32_t i = 0; i < n; i++)
        ua_set(a, ids[i], DUET_UNIT_USED);
    a->hint = w < a->n_words ? w : a->n_words;
    return DUET_OK;
}

/* Move every id from `from` to `to`.  All ids are checked first: RANGE for
 * an id >= n, STATE for one not in `from` (a duplicate id is caught when it
 * is reached the second time and the moves so far are undone). */
static duet_status_t ua_move(unit_alloc_t *a, const uint32_t *ids, uint32_t n, duet_unit_state_t from,
                             duet_unit_state_t to)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= a->n)
            return DUET_ERR_RANGE;
    for (uint32_t i = 0; i < n; i++)
        if (a->state[ids[i]] != from)
            return DUET_ERR_STATE;
    for (uint32_t i = 0; i < n; i++) {
        if (a->state[ids[i]] != from) {
            while (i-- > 0)
                ua_set(a, ids[i], from);
            return DUET_ERR_STATE;
        }
        ua_set(a, ids[i], to);
    }
    return DUET_OK;
}

/* ---- create / destroy ---- */

/* A pool owns whole memory pages (page-aligned, its size rounded up to pages), zeroed: so that
 * registering it with a transport or pinning it for a device (cudaHostRegister works on whole
 * pages and refuses pages registered twice) touches nothing but the pool. */
static void *pool_alloc(size_t bytes)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096, total = (bytes + page - 1) / page * page;
    if (total < bytes)
        return NULL;
    void *p = aligned_alloc(page, total);
    if (p)
        memset(p, 0, total);
    return p;
}

static void cache_free(duet_kv_cache_t *c)
{
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        duet_free_aligned(c->mem[k]);
    ua_fini(&c->pages);
    ua_fini(&c->slots);
    if (c->mu_ready)
        pthread_mutex_destroy(&c->mu);
    free(c);
}

duet_status_t duet_kv_cache_create(const duet_model_config_t *cfg, const duet_cache_opts_t *opts,
                                   uint32_t n_pages, uint32_t n_slots, duet_kv_cache_t **out,
                                   duet_err_t *err)
{
    if (!cfg || !opts || !out)
        return duet_err_set(err, DUET_ERR_INVALID, "kv cache: NULL argument");
    duet_kv_cache_t *c = DUET_NEW(duet_kv_cache_t);
    if (!c)
        return duet_err_set(err, DUET_ERR_NOMEM, "kv cache: out of memory");
    duet_status_t st;
    c->cfg = *cfg;
    c->opts = *opts;
    c->n_pages = n_pages;
    c->n_slots = n_slots;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        st = duet_err_set(err, DUET_ERR_INTERNAL, "kv cache: mutex init failed");
        goto fail;
    }
    c->mu_ready = 1;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        duet_cache_layout_t *l = &c->layout[k];
        st = duet_cache_layout_compute(cfg, opts, (duet_pool_kind_t)k, l, err);
        if (st != DUET_OK)
            goto fail;
        size_t units = l->paged ? n_pages : n_slots, per_layer, total;
        if (duet_mul_size(units, (size_t)l->page_bytes, &per_layer) < 0 ||
            duet_mul_size(per_layer, l->n_layers, &total) < 0) {
            st = duet_err_set(err, DUET_ERR_NOMEM, "kv cache: %s pool size overflows",
                              duet_pool_kind_name((duet_pool_kind_t)k));
            goto fail;
        }
        if (total == 0)
            continue;
        c->mem[k] = pool_alloc(total);
        if (!c->mem[k]) {
            st = duet_err_set(err, DUET_ERR_NOMEM, "kv cache: cannot allocate %zu bytes for the %s pool", total,
                              duet_pool_kind_name((duet_pool_kind_t)k));
            goto fail;
        }
        c->bytes[k] = total;
    }
    if (ua_init(&c->pages, n_pages) < 0 || ua_init(&c->slots, n_slots) < 0) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "kv cache: cannot allocate unit tables");
        goto fail;
    }
    *out = c;
    return DUET_OK;
fail:
    cache_free(c);
    return st;
}

void duet_kv_cache_destroy(duet_kv_cache_t **c)
{
    if (c && *c) {
        cache_free(*c);
        *c = NULL;
    }
}

/* ---- accessors ---- */

const duet_cache_layout_t *duet_kv_cache_layout(const duet_kv_cache_t *c, duet_pool_kind_t kind)
{
    return (unsigned)kind < DUET_POOL_COUNT ? &c->layout[kind] : NULL;
}

const duet_cache_opts_t *duet_kv_cache_opts(const duet_kv_cache_t *c) { return &c->opts; }
const duet_model_config_t *duet_kv_cache_config(const duet_kv_cache_t *c) { return &c->cfg; }
uint32_t duet_kv_cache_n_pages(const duet_kv_cache_t *c) { return c->n_pages; }
uint32_t duet_kv_cache_n_slots(const duet_kv_cache_t *c) { return c->n_slots; }

uint8_t *duet_kv_cache_pool_base(const duet_kv_cache_t *c, duet_pool_kind_t kind)
{
    return (unsigned)kind < DUET_POOL_COUNT ? c->mem[kind] : NULL;
}

size_t duet_kv_cache_pool_bytes(const duet_kv_cache_t *c, duet_pool_kind_t kind)
{
    return (unsigned)kind < DUET_POOL_COUNT ? c->bytes[kind] : 0;
}

/* ---- pages and slots ---- */

/* The read-only queries lock too: the object is never really const. */
static void lock(const duet_kv_cache_t *c) { pthread_mutex_lock((pthread_mutex_t *)&c->mu); }
static void unlock(const duet_kv_cache_t *c) { pthread_mutex_unlock((pthread_mutex_t *)&c->mu); }

static duet_status_t move_locked(duet_kv_cache_t *c, unit_alloc_t *a, const uint32_t *ids, uint32_t n,
                                 duet_unit_state_t from, duet_unit_state_t to)
{
    if (n && !ids)
        return DUET_ERR_INVALID;
    lock(c);
    duet_status_t st = ua_move(a, ids, n, from, to);
    unlock(c);
    return st;
}

duet_status_t duet_kv_cache_alloc_pages(duet_kv_cache_t *c, uint32_t n, uint32_t *ids)
{
    if (n && !ids)
        return DUET_ERR_INVALID;
    lock(c);
    duet_status_t st = ua_take(&c->pages, n, ids);
    unlock(c);
    return st;
}

duet_status_t duet_kv_cache_free_pages(duet_kv_cache_t *c, const uint32_t *ids, uint32_t n)
{
    return move_locked(c, &c->pages, ids, n, DUET_UNIT_USED, DUET_UNIT_FREE);
}

duet_status_t duet_kv_cache_quarantine_pages(duet_kv_cache_t *c, const uint32_t *ids, uint32_t n)
{
    return move_locked(c, &c->pages, ids, n, DUET_UNIT_USED, DUET_UNIT_QUARANTINED);
}

duet_status_t duet_kv_cache_release_pages(duet_kv_cache_t *c, const uint32_t *ids, uint32_t n)
{
    return move_locked(c, &c->pages, ids, n, DUET_UNIT_QUARANTINED, DUET_UNIT_FREE);
}

/* An id out of range reads as (duet_unit_state_t)-1, which matches no state. */
duet_unit_state_t duet_kv_cache_page_state(const duet_kv_cache_t *c, uint32_t id)
{
    if (id >= c->n_pages)
        return (duet_unit_state_t)-1;
    lock(c);
    duet_unit_state_t s = (duet_unit_state_t)c->pages.state[id];
    unlock(c);
    return s;
}

static uint32_t read_count(const duet_kv_cache_t *c, const uint32_t *field)
{
    lock(c);
    uint32_t v = *field;
    unlock(c);
    return v;
}

uint32_t duet_kv_cache_free_page_count(const duet_kv_cache_t *c) { return read_count(c, &c->pages.n_free); }
uint32_t duet_kv_cache_quarantined_page_count(const duet_kv_cache_t *c)
{
    return read_count(c, &c->pages.n_quarantined);
}

duet_status_t duet_kv_cache_alloc_slot(duet_kv_cache_t *c, uint32_t *slot)
{
    if (!slot)
        return DUET_ERR_INVALID;
    lock(c);
    duet_status_t st = ua_take(&c->slots, 1, slot);
    unlock(c);
    return st;
}

duet_status_t duet_kv_cache_free_slot(duet_kv_cache_t *c, uint32_t slot)
{
    return move_locked(c, &c->slots, &slot, 1, DUET_UNIT_USED, DUET_UNIT_FREE);
}

duet_status_t duet_kv_cache_quarantine_slot(duet_kv_cache_t *c, uint32_t slot)
{
    return move_locked(c, &c->slots, &slot, 1, DUET_UNIT_USED, DUET_UNIT_QUARANTINED);
}

duet_status_t duet_kv_cache_release_slot(duet_kv_cache_t *c, uint32_t slot)
{
    return move_locked(c, &c->slots, &slot, 1, DUET_UNIT_QUARANTINED, DUET_UNIT_FREE);
}

uint32_t duet_kv_cache_free_slot_count(const duet_kv_cache_t *c) { return read_count(c, &c->slots.n_free); }
uint32_t duet_kv_cache_quarantined_slot_count(const duet_kv_cache_t *c)
{
    return read_count(c, &c->slots.n_quarantined);
}

/* ---- layer views ---- */

void duet_kv_cache_set_layer_gate(duet_kv_cache_t *c, duet_layer_gate_fn fn, void *arg)
{
    lock(c);
    c->gate = fn;
    c->gate_arg = fn ? arg : NULL;
    unlock(c);
}

/* Does a layer of compress ratio `ratio` hold pool `kind`? */
static int layer_has_pool(int ratio, duet_pool_kind_t kind)
{
    switch (kind) {
    case DUET_POOL_SWA_KV: return 1;
    case DUET_POOL_C4_KV:
    case DUET_POOL_C4_INDEX_K:
    case DUET_POOL_STATE_C4: return ratio == 4;
    case DUET_POOL_C128_KV:
    case DUET_POOL_STATE_C128: return ratio == 128;
    default: return 0;
    }
}

static void fill_layer(duet_kv_cache_t *c, int layer, duet_cache_layer_t *out)
{
    memset(out, 0, sizeof *out);
    out->layer = layer;
    out->ratio = duet_cfg_ratio(&c->cfg, layer);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = &c->layout[k];
        if (!layer_has_pool(out->ratio, (duet_pool_kind_t)k))
            continue;
        /* SWA holds every layer in order; the others only their ratio's layers */
        int li = k == DUET_POOL_SWA_KV ? layer : duet_cfg_ratio_layer_index(&c->cfg, layer);
        uint32_t units = l->paged ? c->n_pages : c->n_slots;
        out->layout[k] = l;
        out->n_units[k] = units;
        out->base[k] = c->mem[k] ? c->mem[k] + (size_t)li * units * l->page_bytes : NULL;
    }
}

duet_status_t duet_kv_cache_layer(duet_kv_cache_t *c, int layer, duet_cache_layer_t *out)
{
    if (!c || !out)
        return DUET_ERR_INVALID;
    if (layer < 0 || layer >= c->cfg.num_hidden_layers)
        return DUET_ERR_RANGE;
    lock(c);
    duet_layer_gate_fn gate = c->gate;
    void *arg = c->gate_arg;
    unlock(c);
    if (gate) { /* called unlocked: it may wait for a host-tier load */
        duet_status_t st = gate(arg, layer);
        if (st != DUET_OK)
            return st;
    }
    fill_layer(c, layer, out);
    return DUET_OK;
}

duet_status_t duet_kv_cache_layer_for_loader(duet_kv_cache_t *c, int layer, duet_cache_layer_t *out)
{
    if (!c || !out)
        return DUET_ERR_INVALID;
    if (layer < 0 || layer >= c->cfg.num_hidden_layers)
        return DUET_ERR_RANGE;
    fill_layer(c, layer, out);
    return DUET_OK;
}

void duet_kv_cache_entries(const uint32_t *pages, int64_t first, size_t n, uint32_t epp, uint32_t *unit,
                           uint32_t *idx)
{
    if (!n)
        return;
    size_t pg = (size_t)(first / epp);
    uint32_t off = (uint32_t)(first % epp);
    for (size_t i = 0; i < n; i++) {
        unit[i] = pages[pg];
        idx[i] = off;
        if (++off == epp) {
            off = 0;
            pg++;
        }
    }
}
