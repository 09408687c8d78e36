/* HiCache: the hierarchical prefix cache of a prefill worker (DESIGN §7,
 * docs/HICACHE.md).
 *
 * A radix tree over page-aligned token prefixes.  Every edge of the tree is a
 * run of whole pages (page_tokens tokens each).  A node holds its pages of the
 * three paged pools (C4 KV, C4 index-K, C128 KV):
 *   - on the device tier: page ids of the worker's own kv_cache, and/or
 *   - on the host tier: pages of a separate host buffer with the same layouts
 *     and page bytes (duet_cache_layout_t; no size is computed here),
 * plus, optionally, the resume state at the node's end: one request slot's
 * contents of the ring/state pools (SWA ring, compressor and indexer state
 * with the overlap rows) after exactly that many tokens.  A request can only
 * continue at a node that has a resume state; it then runs exactly as if it
 * had computed the prefix itself (chunked prefill is bit-exact).
 *
 * Loads from the host tier (and every resume-state restore) run on a copy
 * thread, layer by layer; layer l is marked complete after its copies.  The
 * cache's layer gate (duet_kv_cache_set_layer_gate) waits for layer l of every
 * load issued so far, so nothing reads a layer early.
 *
 * Use, per request (one thread owns the tree; only the copies run elsewhere):
 *   duet_hicache_begin()      match, lock the path, schedule loads; gives the
 *                             hit's page ids and token count
 *   duet_hicache_next_stop()  where the next chunk must end (a boundary whose
 *                             resume state is inserted)
 *   duet_hicache_insert()     at such a boundary, after the chunk ran
 *   duet_hicache_end()        frees the request's own pages, unlocks
 * Pages the tree holds are never written: a request writes only pages past
 * its hit, and gives whole pages to the tree at a boundary. */
#ifndef DUET_HICACHE_H
#define DUET_HICACHE_H

#include <stdint.h>

#include "err.h"
#include "kv_cache.h"

typedef enum {
    DUET_HICACHE_WRITE_THROUGH = 0,           /* host copy when a node is inserted */
    DUET_HICACHE_WRITE_THROUGH_SELECTIVE = 1, /* host copy once a node has been hit N times */
    DUET_HICACHE_WRITE_BACK = 2,              /* host copy only when evicted from the device tier */
} duet_hicache_policy_t;

typedef struct {
    uint32_t device_pages;       /* most unreferenced pages the tree keeps in the worker's pool */
    uint64_t host_bytes;         /* host tier size (whole pages of every paged pool) */
    duet_hicache_policy_t policy;
    uint32_t selective_hits;     /* write-through-selective: N (>= 1) */
    uint32_t load_timeout_ms;    /* bound on a gate wait (default 60000 when 0) */
} duet_hicache_opts_t;

typedef struct {
    uint64_t lookups;            /* duet_hicache_begin calls that matched */
    uint64_t hits, misses;       /* requests that continued from a node / did not */
    uint64_t device_hits;        /* hits whose pages were all on the device tier */
    uint64_t host_hits;          /* hits that loaded at least one page from the host tier */
    uint64_t hit_tokens;         /* prompt tokens not computed thanks to hits */
    uint64_t inserts;            /* resume states inserted */
    uint64_t loaded_pages;       /* pages copied host -> device */
    uint64_t load_jobs;          /* layer-by-layer load jobs (one per request that needs any copy) */
    uint64_t backed_up_pages;    /* pages copied device -> host */
    uint64_t evicted_device_pages, evicted_host_pages;
    uint64_t dropped_nodes;      /* nodes removed when their last copy went */
    uint32_t nodes, device_pages, host_pages_used, host_pages_total;
    uint64_t state_bytes;        /* resume states held (host memory) */
} duet_hicache_stats_t;

typedef struct duet_hicache duet_hicache_t;
typedef struct duet_hicache_node duet_hicache_node_t;

/* Per-request bookkeeping, zeroed before duet_hicache_begin(). */
#define DUET_HICACHE_MAX_STOPS 3
typedef struct {
    int active;
    uint32_t hit_pages;          /* seq pages [0, hit_pages) are the tree's */
    int64_t hit_tokens;          /* hit_pages * page_tokens */
    uint32_t *hit_page_ids;      /* (hit_pages) device page ids of the hit */
    uint32_t n_loaded;           /* of those, the pages the load job fills from the host tier (any order) */
    uint32_t *loaded_page_ids;   /* (n_loaded) */
    uint32_t n_pages;            /* pages of the whole prompt */
    uint8_t *tree_page;          /* (n_pages) 1: the page belongs to the tree, not to the request */
    int64_t stops[DUET_HICACHE_MAX_STOPS]; /* boundaries to insert at, ascending */
    int n_stops;
    duet_hicache_node_t *locked[1 + DUET_HICACHE_MAX_STOPS];
    int n_locked;
    uint64_t job;                /* load job the request's reads depend on (0: none) */
} duet_hicache_req_t;

/* "write-through", "write-through-selective:N" (N >= 1; plain "write-through-selective" is 2),
 * "write-back". */
duet_status_t duet_hicache_policy_parse(const char *s, duet_hicache_policy_t *policy, uint32_t *n,
                                        duet_err_t *err);
const char *duet_hicache_policy_name(duet_hicache_policy_t p);

/* Create over `cache` (the worker's pools) and install the layer gate.  The
 * host tier gets floor(host_bytes / bytes of one page in every paged pool)
 * pages. */
duet_status_t duet_hicache_create(duet_kv_cache_t *cache, const duet_hicache_opts_t *opts, duet_hicache_t **out,
                                  duet_err_t *err);
/* Waits for the copy thread, removes the gate, gives every tree page back to
 * the cache.  Every request must have ended. */
void duet_hicache_destroy(duet_hicache_t **hc);

/* Match tokens[0..n_tokens) against the tree and prepare the request:
 * rq->hit_pages of the tree's device pages (loaded from the host tier where
 * needed, restoring the resume state into `slot` on the copy thread), the
 * boundaries where the request should insert, and room in the cache for the
 * rest of the prompt's pages (unreferenced device pages are evicted for it).
 * The hit leaves at least one token to compute.  DUET_ERR_NO_SPACE when the
 * cache cannot hold the prompt even after eviction (nothing held then). */
duet_status_t duet_hicache_begin(duet_hicache_t *hc, const int32_t *tokens, int64_t n_tokens, uint32_t slot,
                                 duet_hicache_req_t *rq, duet_err_t *err);
/* The smallest boundary > done the request inserts at, or n_tokens. */
int64_t duet_hicache_next_stop(const duet_hicache_req_t *rq, int64_t done, int64_t n_tokens);
/* Whether `done` tokens is one of the request's insert boundaries. */
int duet_hicache_is_stop(const duet_hicache_req_t *rq, int64_t done);
/* The request has computed exactly `upto` tokens (a stop): snapshot `slot`
 * as the resume state and insert tokens[0..upto), giving the tree the
 * request's pages that the tree lacks (seq_pages[i] for i < upto/page_tokens). */
duet_status_t duet_hicache_insert(duet_hicache_t *hc, duet_hicache_req_t *rq, const int32_t *tokens, int64_t upto,
                                  const uint32_t *seq_pages, uint32_t n_seq_pages, uint32_t slot, duet_err_t *err);
/* Wait for the request's load job (its host-tier pages and resume state are in the cache's
 * pools afterwards), bounded by the load timeout: DUET_ERR_TIMEOUT past it.  For a forward
 * that does not read the cache's pools through the layer gate (the GPU: the worker copies the
 * hit to the device after this). */
duet_status_t duet_hicache_wait(duet_hicache_t *hc, const duet_hicache_req_t *rq, duet_err_t *err);
/* End the request: wait for its load job (bounded), free its own pages among
 * seq_pages (the tree's stay), unlock, then trim the device tier to its
 * budget.  Safe on a request that never began. */
void duet_hicache_end(duet_hicache_t *hc, duet_hicache_req_t *rq, const uint32_t *seq_pages, uint32_t n_seq_pages);

void duet_hicache_stats(duet_hicache_t *hc, duet_hicache_stats_t *out);

/* Evict unreferenced device pages until `n` pages are free in the cache (or
 * nothing more can go).  Returns the free page count afterwards. */
uint32_t duet_hicache_reclaim(duet_hicache_t *hc, uint32_t n);

/* Test hooks.  Delay the completion of layer `layer` of every later load by
 * `ms` milliseconds (layer -1: none); turn the gate off (0) or on (1). */
void duet_hicache_test_delay_layer(duet_hicache_t *hc, int layer, uint32_t ms);
void duet_hicache_test_set_gate(duet_hicache_t *hc, int on);
/* Drop every device copy that can go (unreferenced nodes, backing up under
 * write-back), so that the next hit loads from the host tier. */
void duet_hicache_test_evict_device(duet_hicache_t *hc);

#endif
