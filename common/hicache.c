/* HiCache (contract in hicache.h, description in docs/HICACHE.md).
 *
 * Tree: a sentinel root; every other node's edge is `n_pages` whole pages of
 * tokens (key).  Children of a node differ in their first page.  Every node
 * holds its data on at least one tier; a node that loses its last copy is
 * removed (with the subtree under it, which can no longer be reached).
 * lock counts the requests whose path runs through the node; a locked node
 * is never evicted from either tier.  last_use is a tick for LRU.
 *
 * Host tier: per paged pool one buffer (n_layers, host_pages, page_bytes),
 * layer-major like the device pool, and a stack of free host page indices.
 * Resume states are separate host blocks of one slot's bytes of every
 * ring/state pool, (n_layers, page_bytes) per pool.
 *
 * Copy thread: load jobs in FIFO order; for each job, layer by layer, copy
 * the layer's host pages into device pages (and the resume state into the
 * request's slot), then publish done_layer[l] = job id.  The gate for layer l
 * waits until done_layer[l] reaches the newest job issued.  Writes to the
 * host tier (backups) and snapshots run on the owning thread through the
 * gated accessor. */
#include "hicache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "log.h"

#define DEFAULT_LOAD_TIMEOUT_MS 60000

struct duet_hicache_node {
    duet_hicache_node_t *parent, *child, *sibling;
    duet_hicache_node_t *all_prev, *all_next; /* every node, for eviction scans */
    int32_t *key;      /* (n_pages * page_tokens) */
    uint32_t n_pages;
    uint32_t *dev;     /* (n_pages) device page ids; NULL: not on the device tier */
    uint32_t *host;    /* (n_pages) host page indices; NULL: not on the host tier */
    uint8_t *state;    /* resume state after this node's last token; NULL: none */
    uint32_t lock;
    uint32_t hits;
    uint64_t last_use;
};

typedef struct load_job {
    struct load_job *next;
    uint64_t id;
    uint32_t n;          /* page copies */
    uint32_t *host_idx;  /* (n) */
    uint32_t *dev_page;  /* (n) */
    const uint8_t *state;/* resume state to restore into `slot`, or NULL */
    uint32_t slot;
} load_job_t;

struct duet_hicache {
    duet_kv_cache_t *cache;
    duet_hicache_opts_t o;
    const duet_model_config_t *cfg;
    int n_layers;
    int64_t pt;
    const duet_cache_layout_t *layout[DUET_POOL_COUNT];
    /* host tier */
    uint32_t host_pages;
    uint8_t *host_mem[DUET_POOL_COUNT];
    uint32_t *host_free; /* (host_pages) stack */
    uint32_t n_host_free;
    /* resume states */
    size_t state_off[DUET_POOL_COUNT];
    size_t state_bytes;
    /* tree */
    duet_hicache_node_t root;
    duet_hicache_node_t *all;
    uint32_t n_nodes, n_states;
    uint64_t tick;
    uint32_t dev_pages;
    duet_hicache_stats_t st;
    /* copy thread; mu guards everything below */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    pthread_t thr;
    int sync_ready, thr_ready;
    load_job_t *q_head, *q_tail;
    uint64_t issued;
    uint64_t done_job;
    uint64_t done_layer[DUET_MAX_LAYERS];
    int stopping;
    int gate_on;
    int delay_layer;
    uint32_t delay_ms;
};

static int pool_paged(duet_pool_kind_t k)
{
    return k == DUET_POOL_C4_KV || k == DUET_POOL_C4_INDEX_K || k == DUET_POOL_C128_KV;
}

/* ---- policy ------------------------------------------------------------- */

duet_status_t duet_hicache_policy_parse(const char *s, duet_hicache_policy_t *policy, uint32_t *n,
                                        duet_err_t *err)
{
    static const char sel[] = "write-through-selective";
    if (!s || !policy || !n)
        return duet_err_set(err, DUET_ERR_INVALID, "hicache policy: NULL argument");
    if (strcmp(s, "write-through") == 0) {
        *policy = DUET_HICACHE_WRITE_THROUGH;
        *n = 0;
        return DUET_OK;
    }
    if (strcmp(s, "write-back") == 0) {
        *policy = DUET_HICACHE_WRITE_BACK;
        *n = 0;
        return DUET_OK;
    }
    if (strncmp(s, sel, sizeof sel - 1) == 0) {
        const char *p = s + sizeof sel - 1;
        unsigned long v = 2;
        if (*p == ':') {
            char *end;
            v = strtoul(p + 1, &end, 10);
            if (end == p + 1 || *end || v < 1 || v > 1000000)
                return duet_err_set(err, DUET_ERR_INVALID,
                                    "hicache policy \"%s\": N of write-through-selective:N must be 1..1000000", s);
        } else if (*p) {
            goto bad;
        }
        *policy = DUET_HICACHE_WRITE_THROUGH_SELECTIVE;
        *n = (uint32_t)v;
        return DUET_OK;
    }
bad:
    return duet_err_set(err, DUET_ERR_INVALID,
                        "hicache policy \"%s\" is not write-through, write-through-selective[:N] or write-back", s);
}

const char *duet_hicache_policy_name(duet_hicache_policy_t p)
{
    switch (p) {
    case DUET_HICACHE_WRITE_THROUGH: return "write-through";
    case DUET_HICACHE_WRITE_THROUGH_SELECTIVE: return "write-through-selective";
    case DUET_HICACHE_WRITE_BACK: return "write-back";
    }
    return "unknown";
}

/* ---- addresses ------------------------------------------------------------ */

/* Layer index of model layer l within pool k. */
static int pool_layer(const duet_hicache_t *hc, duet_pool_kind_t k, int l)
{
    return k == DUET_POOL_SWA_KV ? l : duet_cfg_ratio_layer_index(hc->cfg, l);
}

static uint8_t *host_addr(const duet_hicache_t *hc, duet_pool_kind_t k, int li, uint32_t h)
{
    return hc->host_mem[k] + ((size_t)li * hc->host_pages + h) * hc->layout[k]->page_bytes;
}

/* ---- copy thread and the gate --------------------------------------------- */

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) /* interrupted: the rest of the time is in ts */
        ;
}

static void copy_layer(duet_hicache_t *hc, const load_job_t *j, int l)
{
    duet_cache_layer_t v;
    if (duet_kv_cache_layer_for_loader(hc->cache, l, &v) != DUET_OK)
        return;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        duet_pool_kind_t kind = (duet_pool_kind_t)k;
        if (!v.base[k])
            continue;
        int li = pool_layer(hc, kind, l);
        size_t pb = v.layout[k]->page_bytes;
        if (pool_paged(kind)) {
            for (uint32_t i = 0; i < j->n; i++)
                memcpy(duet_cache_layer_unit(&v, kind, j->dev_page[i]), host_addr(hc, kind, li, j->host_idx[i]), pb);
        } else if (j->state) {
            memcpy(duet_cache_layer_unit(&v, kind, j->slot), j->state + hc->state_off[k] + (size_t)li * pb, pb);
        }
    }
}

static void *copy_thread(void *arg)
{
    duet_hicache_t *hc = arg;
    for (;;) {
        pthread_mutex_lock(&hc->mu);
        while (!hc->q_head && !hc->stopping)
            pthread_cond_wait(&hc->cv_job, &hc->mu);
        load_job_t *j = hc->q_head;
        int delay_layer = hc->delay_layer;
        uint32_t delay_ms = hc->delay_ms;
        pthread_mutex_unlock(&hc->mu);
        if (!j)
            break; /* stopping and nothing left */
        for (int l = 0; l < hc->n_layers; l++) {
            if (l == delay_layer && delay_ms)
                sleep_ms(delay_ms);
            copy_layer(hc, j, l);
            pthread_mutex_lock(&hc->mu);
            hc->done_layer[l] = j->id;
            pthread_cond_broadcast(&hc->cv_done);
            pthread_mutex_unlock(&hc->mu);
        }
        pthread_mutex_lock(&hc->mu);
        hc->q_head = j->next;
        if (!hc->q_head)
            hc->q_tail = NULL;
        hc->done_job = j->id;
        pthread_cond_broadcast(&hc->cv_done);
        pthread_mutex_unlock(&hc->mu);
        free(j->host_idx);
        free(j->dev_page);
        free(j);
    }
    return NULL;
}

static struct timespec deadline_ts(uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Wait (mu held) until *counter >= target or the load timeout passes. */
static duet_status_t wait_counter_locked(duet_hicache_t *hc, const uint64_t *counter, uint64_t target)
{
    struct timespec dl = deadline_ts(hc->o.load_timeout_ms);
    while (*counter < target)
        if (pthread_cond_timedwait(&hc->cv_done, &hc->mu, &dl) != 0 && *counter < target)
            return DUET_ERR_TIMEOUT;
    return DUET_OK;
}

static duet_status_t layer_gate(void *arg, int layer)
{
    duet_hicache_t *hc = arg;
    pthread_mutex_lock(&hc->mu);
    duet_status_t st = DUET_OK;
    if (hc->gate_on && layer >= 0 && layer < hc->n_layers)
        st = wait_counter_locked(hc, &hc->done_layer[layer], hc->issued);
    pthread_mutex_unlock(&hc->mu);
    if (st != DUET_OK)
        duet_error("hicache: layer %d load not complete after %u ms", layer, hc->o.load_timeout_ms);
    return st;
}

static duet_status_t wait_job(duet_hicache_t *hc, uint64_t id)
{
    if (!id)
        return DUET_OK;
    pthread_mutex_lock(&hc->mu);
    duet_status_t st = wait_counter_locked(hc, &hc->done_job, id);
    pthread_mutex_unlock(&hc->mu);
    return st;
}

duet_status_t duet_hicache_wait(duet_hicache_t *hc, const duet_hicache_req_t *rq, duet_err_t *err)
{
    if (!rq->active || wait_job(hc, rq->job) == DUET_OK)
        return DUET_OK;
    return duet_err_set(err, DUET_ERR_TIMEOUT, "prefix cache: the hit's load did not finish within %u ms",
                        hc->o.load_timeout_ms);
}

/* Queue a job (takes ownership); returns its id. */
static uint64_t issue_job(duet_hicache_t *hc, load_job_t *j)
{
    pthread_mutex_lock(&hc->mu);
    uint64_t id = j->id = ++hc->issued;
    if (hc->q_tail)
        hc->q_tail->next = j;
    else
        hc->q_head = j;
    hc->q_tail = j;
    pthread_cond_signal(&hc->cv_job);
    pthread_mutex_unlock(&hc->mu); /* j belongs to the copy thread from here */
    hc->st.load_jobs++;
    return id;
}

/* ---- tree basics ----------------------------------------------------------- */

static void touch(duet_hicache_t *hc, duet_hicache_node_t *x)
{
    uint64_t t = ++hc->tick;
    for (; x && x != &hc->root; x = x->parent)
        x->last_use = t;
}

static void lock_path(duet_hicache_t *hc, duet_hicache_node_t *x, int delta)
{
    for (; x && x != &hc->root; x = x->parent)
        x->lock = (uint32_t)((int64_t)x->lock + delta);
}

static duet_hicache_node_t *node_new(duet_hicache_t *hc, duet_hicache_node_t *parent, const int32_t *key,
                                     uint32_t n_pages)
{
    duet_hicache_node_t *x = DUET_NEW(duet_hicache_node_t);
    if (!x)
        return NULL;
    x->key = duet_malloc_array((size_t)n_pages * (size_t)hc->pt, sizeof(int32_t));
    if (!x->key) {
        free(x);
        return NULL;
    }
    memcpy(x->key, key, sizeof(int32_t) * (size_t)n_pages * (size_t)hc->pt);
    x->n_pages = n_pages;
    x->parent = parent;
    x->sibling = parent->child;
    parent->child = x;
    x->all_next = hc->all;
    if (hc->all)
        hc->all->all_prev = x;
    hc->all = x;
    hc->n_nodes++;
    return x;
}

static void host_release(duet_hicache_t *hc, duet_hicache_node_t *x)
{
    if (!x->host)
        return;
    for (uint32_t i = 0; i < x->n_pages; i++)
        hc->host_free[hc->n_host_free++] = x->host[i];
    free(x->host);
    x->host = NULL;
}

static void dev_release(duet_hicache_t *hc, duet_hicache_node_t *x)
{
    if (!x->dev)
        return;
    if (duet_kv_cache_free_pages(hc->cache, x->dev, x->n_pages) != DUET_OK)
        duet_error("hicache: device pages of a node were not in use");
    hc->dev_pages -= x->n_pages;
    free(x->dev);
    x->dev = NULL;
}

/* Remove a node without children. */
static void node_remove(duet_hicache_t *hc, duet_hicache_node_t *x)
{
    dev_release(hc, x);
    host_release(hc, x);
    if (x->state) {
        duet_free_aligned(x->state);
        hc->n_states--;
    }
    duet_hicache_node_t **pp = &x->parent->child;
    while (*pp && *pp != x)
        pp = &(*pp)->sibling;
    if (*pp)
        *pp = x->sibling;
    if (x->all_prev)
        x->all_prev->all_next = x->all_next;
    else
        hc->all = x->all_next;
    if (x->all_next)
        x->all_next->all_prev = x->all_prev;
    hc->n_nodes--;
    hc->st.dropped_nodes++;
    free(x->key);
    free(x);
}

/* Remove x and everything under it (none of it locked). */
static void subtree_remove(duet_hicache_t *hc, duet_hicache_node_t *x)
{
    for (uint32_t guard = 0; x->child && guard <= hc->n_nodes; guard++) {
        duet_hicache_node_t *n = x->child;
        for (uint32_t d = 0; n->child && d <= hc->n_nodes; d++)
            n = n->child;
        node_remove(hc, n);
    }
    node_remove(hc, x);
}

/* Split x after its first k pages (0 < k < n_pages): a new node takes the
 * first k pages and becomes x's parent.  Returns the new node. */
static duet_hicache_node_t *node_split(duet_hicache_t *hc, duet_hicache_node_t *x, uint32_t k)
{
    uint32_t rest = x->n_pages - k;
    size_t pt = (size_t)hc->pt;
    int32_t *tail_key = duet_malloc_array(rest * pt, sizeof(int32_t));
    uint32_t *head_dev = x->dev ? duet_malloc_array(k, sizeof(uint32_t)) : NULL;
    uint32_t *tail_dev = x->dev ? duet_malloc_array(rest, sizeof(uint32_t)) : NULL;
    uint32_t *head_host = x->host ? duet_malloc_array(k, sizeof(uint32_t)) : NULL;
    uint32_t *tail_host = x->host ? duet_malloc_array(rest, sizeof(uint32_t)) : NULL;
    duet_hicache_node_t *y = NULL;
    if (!tail_key || (x->dev && (!head_dev || !tail_dev)) || (x->host && (!head_host || !tail_host)))
        goto fail;
    /* y is created under x's parent, then takes x's place in the sibling list */
    y = node_new(hc, x->parent, x->key, k);
    if (!y)
        goto fail;
    memcpy(tail_key, x->key + (size_t)k * pt, sizeof(int32_t) * rest * pt);
    if (x->dev) {
        memcpy(head_dev, x->dev, sizeof(uint32_t) * k);
        memcpy(tail_dev, x->dev + k, sizeof(uint32_t) * rest);
        free(x->dev);
        y->dev = head_dev;
        x->dev = tail_dev;
    }
    if (x->host) {
        memcpy(head_host, x->host, sizeof(uint32_t) * k);
        memcpy(tail_host, x->host + k, sizeof(uint32_t) * rest);
        free(x->host);
        y->host = head_host;
        x->host = tail_host;
    }
    free(x->key);
    x->key = tail_key;
    x->n_pages = rest;
    /* unlink x from its parent's children (y was pushed at the front) and hang it under y */
    duet_hicache_node_t **pp = &x->parent->child;
    while (*pp && *pp != x)
        pp = &(*pp)->sibling;
    if (*pp)
        *pp = x->sibling;
    x->parent = y;
    x->sibling = NULL;
    y->child = x;
    y->lock = x->lock;
    y->hits = x->hits;
    y->last_use = x->last_use;
    return y;
fail:
    free(tail_key);
    free(head_dev);
    free(tail_dev);
    free(head_host);
    free(tail_host);
    return NULL;
}

static int page_eq(const duet_hicache_t *hc, const int32_t *a, const int32_t *b)
{
    return memcmp(a, b, sizeof(int32_t) * (size_t)hc->pt) == 0;
}

static duet_hicache_node_t *find_child(const duet_hicache_t *hc, const duet_hicache_node_t *x, const int32_t *page)
{
    for (duet_hicache_node_t *c = x->child; c; c = c->sibling)
        if (page_eq(hc, c->key, page))
            return c;
    return NULL;
}

/* ---- tiers --------------------------------------------------------------------- */

static duet_hicache_node_t *lru_pick(duet_hicache_t *hc, int device)
{
    duet_hicache_node_t *best = NULL;
    for (duet_hicache_node_t *x = hc->all; x; x = x->all_next) {
        if (x->lock)
            continue;
        if (device) {
            if (!x->dev)
                continue;
            int dev_child = 0;
            for (duet_hicache_node_t *c = x->child; c && !dev_child; c = c->sibling)
                dev_child = c->dev != NULL;
            if (dev_child)
                continue;
        } else {
            if (!x->host || (!x->dev && x->child))
                continue;
        }
        if (!best || x->last_use < best->last_use)
            best = x;
    }
    return best;
}

/* Drop the host copy of the least recently used unlocked host leaf. 0 when none. */
static int evict_one_host(duet_hicache_t *hc)
{
    duet_hicache_node_t *x = lru_pick(hc, 0);
    if (!x)
        return 0;
    hc->st.evicted_host_pages += x->n_pages;
    host_release(hc, x);
    if (!x->dev)
        node_remove(hc, x);
    return 1;
}

/* Copy a device node to the host tier (evicting host leaves for room).  0 on success. */
static int backup(duet_hicache_t *hc, duet_hicache_node_t *x)
{
    if (x->host || !x->dev || !hc->host_pages || x->n_pages > hc->host_pages)
        return x->host ? 0 : -1;
    uint32_t *h = duet_malloc_array(x->n_pages, sizeof(uint32_t));
    if (!h)
        return -1;
    x->lock++; /* not a candidate for the host evictions below */
    for (uint32_t guard = 0; hc->n_host_free < x->n_pages && guard <= hc->host_pages; guard++)
        if (!evict_one_host(hc))
            break;
    x->lock--;
    if (hc->n_host_free < x->n_pages) {
        free(h);
        return -1;
    }
    for (uint32_t i = 0; i < x->n_pages; i++)
        h[i] = hc->host_free[--hc->n_host_free];
    for (int l = 0; l < hc->n_layers; l++) {
        duet_cache_layer_t v;
        if (duet_kv_cache_layer(hc->cache, l, &v) != DUET_OK) { /* a load that never completes */
            for (uint32_t i = 0; i < x->n_pages; i++)
                hc->host_free[hc->n_host_free++] = h[i];
            free(h);
            return -1;
        }
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            duet_pool_kind_t kind = (duet_pool_kind_t)k;
            if (!pool_paged(kind) || !v.base[k])
                continue;
            int li = pool_layer(hc, kind, l);
            for (uint32_t i = 0; i < x->n_pages; i++)
                memcpy(host_addr(hc, kind, li, h[i]), duet_cache_layer_unit(&v, kind, x->dev[i]),
                       v.layout[k]->page_bytes);
        }
    }
    x->host = h;
    hc->st.backed_up_pages += x->n_pages;
    return 0;
}

/* Drop the device copy of the least recently used unlocked device leaf
 * (backing it up first under write-back).  0 when none. */
static int evict_one_device(duet_hicache_t *hc)
{
    duet_hicache_node_t *x = lru_pick(hc, 1);
    if (!x)
        return 0;
    if (!x->host && hc->o.policy == DUET_HICACHE_WRITE_BACK)
        backup(hc, x);
    hc->st.evicted_device_pages += x->n_pages;
    dev_release(hc, x);
    if (!x->host)
        subtree_remove(hc, x);
    return 1;
}

static void trim_device(duet_hicache_t *hc)
{
    for (uint32_t guard = 0; hc->dev_pages > hc->o.device_pages && guard <= hc->n_nodes + 1; guard++)
        if (!evict_one_device(hc))
            break;
}

uint32_t duet_hicache_reclaim(duet_hicache_t *hc, uint32_t n)
{
    for (uint32_t guard = 0; duet_kv_cache_free_page_count(hc->cache) < n && guard <= hc->n_nodes + 1; guard++)
        if (!evict_one_device(hc))
            break;
    return duet_kv_cache_free_page_count(hc->cache);
}

/* ---- create / destroy ------------------------------------------------------------ */

void duet_hicache_destroy(duet_hicache_t **phc)
{
    if (!phc || !*phc)
        return;
    duet_hicache_t *hc = *phc;
    if (hc->thr_ready) {
        pthread_mutex_lock(&hc->mu);
        hc->stopping = 1;
        pthread_cond_broadcast(&hc->cv_job);
        pthread_mutex_unlock(&hc->mu);
        pthread_join(hc->thr, NULL); /* the thread finishes the queued jobs first */
    }
    if (hc->cache)
        duet_kv_cache_set_layer_gate(hc->cache, NULL, NULL);
    for (uint32_t guard = 0; hc->all && guard < (1u << 31); guard++) {
        duet_hicache_node_t *x = hc->all;
        x->child = NULL; /* every node goes; no need to keep the tree consistent */
        dev_release(hc, x);
        host_release(hc, x);
        if (x->state)
            duet_free_aligned(x->state);
        hc->all = x->all_next;
        free(x->key);
        free(x);
    }
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        duet_free_aligned(hc->host_mem[k]);
    free(hc->host_free);
    if (hc->sync_ready) {
        pthread_cond_destroy(&hc->cv_job);
        pthread_cond_destroy(&hc->cv_done);
        pthread_mutex_destroy(&hc->mu);
    }
    free(hc);
    *phc = NULL;
}

duet_status_t duet_hicache_create(duet_kv_cache_t *cache, const duet_hicache_opts_t *opts, duet_hicache_t **out,
                                  duet_err_t *err)
{
    if (!cache || !opts || !out)
        return duet_err_set(err, DUET_ERR_INVALID, "hicache: NULL argument");
    if (opts->policy > DUET_HICACHE_WRITE_BACK ||
        (opts->policy == DUET_HICACHE_WRITE_THROUGH_SELECTIVE && opts->selective_hits == 0))
        return duet_err_set(err, DUET_ERR_INVALID, "hicache: unknown policy or write-through-selective with N = 0");
    duet_hicache_t *hc = DUET_NEW(duet_hicache_t);
    if (!hc)
        return duet_err_set(err, DUET_ERR_NOMEM, "hicache: out of memory");
    duet_status_t st;
    hc->cache = cache;
    hc->o = *opts;
    if (!hc->o.load_timeout_ms)
        hc->o.load_timeout_ms = DEFAULT_LOAD_TIMEOUT_MS;
    hc->cfg = duet_kv_cache_config(cache);
    hc->n_layers = hc->cfg->num_hidden_layers;
    hc->pt = duet_kv_cache_opts(cache)->page_tokens;
    hc->gate_on = 1;
    hc->delay_layer = -1;
    uint64_t unit = 0; /* host bytes of one page in every paged pool */
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(cache, (duet_pool_kind_t)k);
        hc->layout[k] = l;
        if (pool_paged((duet_pool_kind_t)k)) {
            unit += (uint64_t)l->n_layers * l->page_bytes;
        } else {
            hc->state_off[k] = hc->state_bytes;
            hc->state_bytes += (size_t)l->n_layers * l->page_bytes;
        }
    }
    uint64_t hp = unit ? opts->host_bytes / unit : 0;
    if (hp > (1u << 30))
        hp = 1u << 30;
    hc->host_pages = (uint32_t)hp;
    if (hc->host_pages) {
        hc->host_free = duet_malloc_array(hc->host_pages, sizeof(uint32_t));
        if (!hc->host_free) {
            st = duet_err_set(err, DUET_ERR_NOMEM, "hicache: out of memory for %u host pages", hc->host_pages);
            goto fail;
        }
        for (uint32_t i = 0; i < hc->host_pages; i++)
            hc->host_free[i] = hc->host_pages - 1 - i; /* lowest index on top */
        hc->n_host_free = hc->host_pages;
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            const duet_cache_layout_t *l = hc->layout[k];
            if (!pool_paged((duet_pool_kind_t)k) || !l->n_layers)
                continue;
            size_t per_layer, total;
            if (duet_mul_size(hc->host_pages, (size_t)l->page_bytes, &per_layer) < 0 ||
                duet_mul_size(per_layer, l->n_layers, &total) < 0 ||
                !(hc->host_mem[k] = duet_alloc_aligned(total, 1))) {
                st = duet_err_set(err, DUET_ERR_NOMEM, "hicache: cannot allocate the host tier's %s pool (%u pages)",
                                  duet_pool_kind_name((duet_pool_kind_t)k), hc->host_pages);
                goto fail;
            }
        }
    }
    pthread_condattr_t ca;
    if (pthread_mutex_init(&hc->mu, NULL) != 0 || pthread_condattr_init(&ca) != 0) {
        st = duet_err_set(err, DUET_ERR_INTERNAL, "hicache: mutex init failed");
        goto fail;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&hc->cv_job, NULL);
    pthread_cond_init(&hc->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    hc->sync_ready = 1;
    if (pthread_create(&hc->thr, NULL, copy_thread, hc) != 0) {
        st = duet_err_set(err, DUET_ERR_INTERNAL, "hicache: cannot start the copy thread");
        goto fail;
    }
    hc->thr_ready = 1;
    duet_kv_cache_set_layer_gate(cache, layer_gate, hc);
    *out = hc;
    return DUET_OK;
fail:
    hc->cache = NULL; /* the gate was not installed */
    duet_hicache_destroy(&hc);
    return st;
}

/* ---- requests ----------------------------------------------------------------- */

static void req_clear(duet_hicache_req_t *rq)
{
    free(rq->hit_page_ids);
    free(rq->loaded_page_ids);
    free(rq->tree_page);
    memset(rq, 0, sizeof *rq);
}

duet_status_t duet_hicache_begin(duet_hicache_t *hc, const int32_t *tokens, int64_t n_tokens, uint32_t slot,
                                 duet_hicache_req_t *rq, duet_err_t *err)
{
    if (!hc || !rq || !tokens || n_tokens <= 0)
        return duet_err_set(err, DUET_ERR_INVALID, "hicache: bad request");
    memset(rq, 0, sizeof *rq);
    int64_t pt = hc->pt;
    uint32_t total = (uint32_t)((n_tokens + pt - 1) / pt), cap = (uint32_t)((n_tokens - 1) / pt),
             full = (uint32_t)(n_tokens / pt);
    /* walk: fully matched nodes (their end page count), then a partial match */
    duet_hicache_node_t *x = &hc->root, *hit = NULL;
    uint32_t pos = 0, hit_end = 0;
    for (uint32_t guard = 0; pos < full && guard <= full; guard++) {
        duet_hicache_node_t *c = find_child(hc, x, tokens + (size_t)pos * pt);
        if (!c)
            break;
        uint32_t k = 1;
        while (k < c->n_pages && pos + k < full && page_eq(hc, c->key + (size_t)k * pt, tokens + (size_t)(pos + k) * pt))
            k++;
        pos += k;
        if (k < c->n_pages)
            break; /* ends inside c */
        x = c;
        if (c->state && pos <= cap) {
            hit = c;
            hit_end = pos;
        }
    }
    uint32_t matched = pos;
    /* every page of the prompt past the hit is the request's own; host-only pages of the hit path need device pages */
    uint32_t need_load = 0;
    for (duet_hicache_node_t *y = hit; y && y != &hc->root; y = y->parent)
        if (!y->dev)
            need_load += y->n_pages;
    if (hit)
        lock_path(hc, hit, +1);
    uint32_t need = total - hit_end + need_load;
    if (duet_hicache_reclaim(hc, need) < need) {
        if (hit)
            lock_path(hc, hit, -1);
        return duet_err_set(err, DUET_ERR_NO_SPACE, "hicache: %u pages needed, %u free after eviction", need,
                            duet_kv_cache_free_page_count(hc->cache));
    }
    rq->tree_page = duet_calloc(total, 1);
    rq->hit_page_ids = hit_end ? duet_malloc_array(hit_end, sizeof(uint32_t)) : NULL;
    load_job_t *job = hit ? DUET_NEW(load_job_t) : NULL;
    if (hit && job && need_load) {
        job->host_idx = duet_malloc_array(need_load, sizeof(uint32_t));
        job->dev_page = duet_malloc_array(need_load, sizeof(uint32_t));
        rq->loaded_page_ids = duet_malloc_array(need_load, sizeof(uint32_t));
    }
    if (!rq->tree_page || (hit_end && !rq->hit_page_ids) || (hit && !job) ||
        (job && need_load && (!job->host_idx || !job->dev_page || !rq->loaded_page_ids))) {
        if (job) {
            free(job->host_idx);
            free(job->dev_page);
            free(job);
        }
        if (hit)
            lock_path(hc, hit, -1);
        req_clear(rq);
        return duet_err_set(err, DUET_ERR_NOMEM, "hicache: out of memory");
    }
    rq->active = 1;
    rq->n_pages = total;
    hc->st.lookups++;
    if (hit) {
        /* selective write-through: count the hit, back up nodes that reached N (before any load is queued,
         * so the backup's reads do not wait for it) */
        for (duet_hicache_node_t *y = hit; y != &hc->root; y = y->parent) {
            y->hits++;
            if (hc->o.policy == DUET_HICACHE_WRITE_THROUGH_SELECTIVE && y->hits >= hc->o.selective_hits && y->dev &&
                !y->host)
                backup(hc, y);
        }
        /* device pages for the host-only nodes (free pages were made above); every array first, so that a
         * failure leaves the tree as it was */
        uint32_t n_new = 0;
        for (duet_hicache_node_t *y = hit; y != &hc->root; y = y->parent)
            n_new += !y->dev;
        uint32_t **arrs = n_new ? duet_calloc(n_new, sizeof(uint32_t *)) : NULL;
        int oom = n_new && !arrs;
        uint32_t ai = 0;
        for (duet_hicache_node_t *y = hit; !oom && y != &hc->root; y = y->parent)
            if (!y->dev && !(arrs[ai++] = duet_malloc_array(y->n_pages, sizeof(uint32_t))))
                oom = 1;
        duet_status_t ast = oom ? DUET_ERR_NOMEM
                                : need_load ? duet_kv_cache_alloc_pages(hc->cache, need_load, job->dev_page) : DUET_OK;
        if (ast != DUET_OK) {
            for (uint32_t i = 0; arrs && i < n_new; i++)
                free(arrs[i]);
            free(arrs);
            free(job->host_idx);
            free(job->dev_page);
            free(job);
            lock_path(hc, hit, -1);
            req_clear(rq);
            hc->st.lookups--;
            return duet_err_set(err, ast, "hicache: no memory or device pages for the load");
        }
        uint32_t at = 0;
        ai = 0;
        for (duet_hicache_node_t *y = hit; y != &hc->root; y = y->parent) {
            if (y->dev)
                continue;
            uint32_t *d = arrs[ai++];
            memcpy(d, job->dev_page + at, sizeof(uint32_t) * y->n_pages);
            memcpy(job->host_idx + at, y->host, sizeof(uint32_t) * y->n_pages);
            y->dev = d;
            hc->dev_pages += y->n_pages;
            at += y->n_pages;
        }
        free(arrs);
        job->n = at;
        if (at)
            memcpy(rq->loaded_page_ids, job->dev_page, sizeof(uint32_t) * at);
        rq->n_loaded = at;
        job->state = hit->state;
        job->slot = slot;
        hc->st.loaded_pages += at;
        /* page ids of the hit, root first */
        uint32_t end = hit_end;
        for (duet_hicache_node_t *y = hit; y != &hc->root; y = y->parent) {
            end -= y->n_pages;
            memcpy(rq->hit_page_ids + end, y->dev, sizeof(uint32_t) * y->n_pages);
        }
        rq->job = issue_job(hc, job);
        rq->locked[rq->n_locked++] = hit;
        touch(hc, hit);
        hc->st.hits++;
        if (at)
            hc->st.host_hits++;
        else
            hc->st.device_hits++;
        hc->st.hit_tokens += (uint64_t)hit_end * (uint64_t)pt;
    } else {
        hc->st.misses++;
        if (x != &hc->root)
            touch(hc, x);
    }
    rq->hit_pages = hit_end;
    rq->hit_tokens = (int64_t)hit_end * pt;
    for (uint32_t i = 0; i < hit_end; i++)
        rq->tree_page[i] = 1;
    /* resume states worth inserting, ascending: where the prompt leaves the tree inside a node (the branch
     * point other prompts share), the last boundary before the prompt's end (a repeat of this prompt hits
     * it), and the prompt's last whole page (a longer prompt with this prefix hits it) */
    const uint32_t cand[3] = {matched < cap ? matched : 0, cap, full};
    for (int i = 0; i < 3; i++)
        if (cand[i] > hit_end && (rq->n_stops == 0 || rq->stops[rq->n_stops - 1] < (int64_t)cand[i] * pt))
            rq->stops[rq->n_stops++] = (int64_t)cand[i] * pt;
    return DUET_OK;
}

int64_t duet_hicache_next_stop(const duet_hicache_req_t *rq, int64_t done, int64_t n_tokens)
{
    for (int i = 0; rq && rq->active && i < rq->n_stops; i++)
        if (rq->stops[i] > done && rq->stops[i] < n_tokens)
            return rq->stops[i];
    return n_tokens;
}

int duet_hicache_is_stop(const duet_hicache_req_t *rq, int64_t done)
{
    for (int i = 0; rq && rq->active && i < rq->n_stops; i++)
        if (rq->stops[i] == done)
            return 1;
    return 0;
}

/* Copy `slot`'s ring/state contents into a new resume state. */
static uint8_t *snapshot(duet_hicache_t *hc, uint32_t slot)
{
    uint8_t *s = duet_alloc_aligned(hc->state_bytes ? hc->state_bytes : 1, 1);
    if (!s)
        return NULL;
    for (int l = 0; l < hc->n_layers; l++) {
        duet_cache_layer_t v;
        if (duet_kv_cache_layer(hc->cache, l, &v) != DUET_OK) {
            duet_free_aligned(s);
            return NULL;
        }
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            duet_pool_kind_t kind = (duet_pool_kind_t)k;
            const uint8_t *src = v.base[k] && !pool_paged(kind) ? duet_cache_layer_unit(&v, kind, slot) : NULL;
            if (!src)
                continue;
            size_t pb = v.layout[k]->page_bytes;
            memcpy(s + hc->state_off[k] + (size_t)pool_layer(hc, kind, l) * pb, src, pb);
        }
    }
    return s;
}

duet_status_t duet_hicache_insert(duet_hicache_t *hc, duet_hicache_req_t *rq, const int32_t *tokens, int64_t upto,
                                  const uint32_t *seq_pages, uint32_t n_seq_pages, uint32_t slot, duet_err_t *err)
{
    if (!hc || !rq || !rq->active || !tokens || !seq_pages)
        return duet_err_set(err, DUET_ERR_INVALID, "hicache insert: no active request");
    int64_t pt = hc->pt;
    if (upto <= 0 || upto % pt || upto / pt > n_seq_pages || upto / pt > rq->n_pages)
        return duet_err_set(err, DUET_ERR_RANGE, "hicache insert: %lld tokens is not a page boundary of the request",
                            (long long)upto);
    if (rq->n_locked >= 1 + DUET_HICACHE_MAX_STOPS)
        return duet_err_set(err, DUET_ERR_STATE, "hicache insert: too many inserts for one request");
    uint32_t b = (uint32_t)(upto / pt);
    uint8_t *snap = snapshot(hc, slot);
    if (!snap)
        return duet_err_set(err, DUET_ERR_NOMEM, "hicache insert: cannot take the resume state");
    duet_hicache_node_t *x = &hc->root, *created = NULL;
    uint32_t pos = 0;
    for (uint32_t guard = 0; pos < b && guard <= b; guard++) {
        duet_hicache_node_t *c = find_child(hc, x, tokens + (size_t)pos * pt);
        if (!c) {
            for (uint32_t i = pos; i < b; i++)
                if (rq->tree_page[i]) {
                    duet_free_aligned(snap);
                    return duet_err_set(err, DUET_ERR_STATE, "hicache insert: page %u is not the request's", i);
                }
            uint32_t *d = duet_malloc_array(b - pos, sizeof(uint32_t));
            created = d ? node_new(hc, x, tokens + (size_t)pos * pt, b - pos) : NULL;
            if (!created) {
                free(d);
                duet_free_aligned(snap);
                return duet_err_set(err, DUET_ERR_NOMEM, "hicache insert: out of memory");
            }
            memcpy(d, seq_pages + pos, sizeof(uint32_t) * (b - pos));
            created->dev = d;
            hc->dev_pages += b - pos;
            for (uint32_t i = pos; i < b; i++)
                rq->tree_page[i] = 1;
            x = created;
            pos = b;
            break;
        }
        uint32_t k = 1;
        while (k < c->n_pages && pos + k < b && page_eq(hc, c->key + (size_t)k * pt, tokens + (size_t)(pos + k) * pt))
            k++;
        if (k < c->n_pages) {
            duet_hicache_node_t *y = node_split(hc, c, k);
            if (!y) {
                duet_free_aligned(snap);
                return duet_err_set(err, DUET_ERR_NOMEM, "hicache insert: out of memory");
            }
            c = y;
        }
        x = c;
        pos += k;
    }
    if (pos != b || x == &hc->root) {
        duet_free_aligned(snap);
        return duet_err_set(err, DUET_ERR_INTERNAL, "hicache insert: walk ended at page %u of %u", pos, b);
    }
    if (!x->state) {
        x->state = snap;
        hc->n_states++;
        hc->st.inserts++;
    } else {
        duet_free_aligned(snap);
    }
    lock_path(hc, x, +1);
    rq->locked[rq->n_locked++] = x;
    touch(hc, x);
    if (created && hc->o.policy == DUET_HICACHE_WRITE_THROUGH)
        backup(hc, created);
    return DUET_OK;
}

void duet_hicache_end(duet_hicache_t *hc, duet_hicache_req_t *rq, const uint32_t *seq_pages, uint32_t n_seq_pages)
{
    if (!hc || !rq || !rq->active)
        return;
    if (wait_job(hc, rq->job) != DUET_OK)
        duet_error("hicache: a load did not complete within %u ms", hc->o.load_timeout_ms);
    if (seq_pages && n_seq_pages) {
        uint32_t *own = duet_malloc_array(n_seq_pages, sizeof(uint32_t));
        uint32_t n = 0;
        for (uint32_t i = 0; own && i < n_seq_pages; i++)
            if (i >= rq->n_pages || !rq->tree_page[i])
                own[n++] = seq_pages[i];
        if (!own)
            duet_error("hicache: out of memory; a request's pages are not freed");
        else if (n && duet_kv_cache_free_pages(hc->cache, own, n) != DUET_OK)
            duet_error("hicache: a request's own pages were not in use");
        free(own);
    }
    for (int i = 0; i < rq->n_locked; i++)
        lock_path(hc, rq->locked[i], -1);
    req_clear(rq);
    trim_device(hc);
}

void duet_hicache_stats(duet_hicache_t *hc, duet_hicache_stats_t *out)
{
    *out = hc->st;
    out->nodes = hc->n_nodes;
    out->device_pages = hc->dev_pages;
    out->host_pages_total = hc->host_pages;
    out->host_pages_used = hc->host_pages - hc->n_host_free;
    out->state_bytes = (uint64_t)hc->n_states * hc->state_bytes;
}

void duet_hicache_test_delay_layer(duet_hicache_t *hc, int layer, uint32_t ms)
{
    pthread_mutex_lock(&hc->mu);
    hc->delay_layer = layer;
    hc->delay_ms = ms;
    pthread_mutex_unlock(&hc->mu);
}

void duet_hicache_test_set_gate(duet_hicache_t *hc, int on)
{
    pthread_mutex_lock(&hc->mu);
    hc->gate_on = on;
    pthread_mutex_unlock(&hc->mu);
}

void duet_hicache_test_evict_device(duet_hicache_t *hc)
{
    for (uint32_t guard = 0; guard <= hc->n_nodes + 1; guard++)
        if (!evict_one_device(hc))
            break;
}
