/* duet-prefill: queues prefill work, runs it in chunks under a token budget
 * per step, pushes each layer's cache pages into the request's decode worker
 * as soon as that layer is computed, samples the first token, and sends
 * TransferDone after the flush (DESIGN §2).  Aborts are handled at every
 * stage (DESIGN §3): queued work is dropped; work whose transfer started stops
 * issuing puts, flushes, and sends AbortAck to decode.
 *
 * One thread owns the model, the cache and the queue; the loop serves
 * commands between steps, takes data-plane events, and runs one step. */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "ctl.h"
#include "msg_xfer.h"
#include "forward.h"
#include "hicache.h"
#include "log.h"
#include "msg.h"
#include "sampling.h"
#include "time_util.h"
#include "worker_engine.h"
#include "worker_net.h"
#include "xfer.h"

#define MAX_ITEMS 256  /* sequences per step */
#define MAX_FINALS 32  /* sequences whose prefill completes in one step */

typedef enum { PR_QUEUED = 0, PR_PREFILLING, PR_TRANSFERRING, PR_ABORTING } pr_state_t;

typedef struct preq {
    struct preq *next;
    char rid[DUET_MSG_MAX_ID_LEN + 1];
    uint64_t epoch;
    pr_state_t state;
    int32_t *tokens;
    int32_t n_tokens;
    int32_t done;             /* prompt tokens prefilled so far */
    duet_sampling_t sp;
    duet_xfer_desc_t desc;
    duet_seq_t seq;           /* this worker's pages for the request (a prefix hit's are HiCache's) */
    duet_hicache_req_t hreq;  /* prefix-cache bookkeeping (inactive without HiCache) */
    uint64_t tid;             /* data-plane transfer, once begun */
    int has_tid;
    int in_step;              /* part of the forward running now: an abort waits for its end */
    int abort_pending;
    uint64_t deadline_ns;
    uint64_t received_ns;
    int sink;                 /* where this request's events go (Prefill.event_url; held until unlinked) */
} preq_t;

typedef struct {
    duet_worker_opts_t o;
    duet_model_t *model;
    duet_kv_cache_t *cache;
    duet_worker_engine_t eng; /* where the forward runs (--device) */
    duet_hicache_t *hc;       /* prefix cache, NULL when off */
    uint64_t hc_logged;       /* lookups at the last stats line */
    uint64_t hc_log_ns;
    duet_worker_net_t net;
    preq_t *head, *tail;
    uint32_t n_queued, n_live;
    int sample_threads; /* threads that draw a step's first tokens on the host (its cores, at most 16) */
    /* step scratch for the layer hook */
    preq_t **finals;
    uint32_t n_finals;
    int staged; /* the layer whose copy to the host pools is queued and whose puts wait for it; -1: none */
} psrv_t;

static volatile int g_stop;

static duet_msg_origin_t origin(psrv_t *s, const char *rid, uint64_t epoch)
{
    return (duet_msg_origin_t){.sender_id = s->o.id, .rid = rid, .epoch = epoch};
}

/* An event about request r goes to the router that owns it (its Prefill's event_url). */
static void push_event(psrv_t *s, const preq_t *r, duet_envelope_t *ev)
{
    duet_worker_net_push_to(&s->net, r->sink, ev);
}

static void push_error(psrv_t *s, preq_t *r, duet_status_t st, const char *msg)
{
    duet_msg_origin_t o = origin(s, r->rid, r->epoch);
    duet_envelope_t *ev = NULL;
    if (duet_msg_new_error(&o, st, msg, &ev) == DUET_OK)
        push_event(s, r, ev);
}

/* Every request the worker holds gets its error (the worker is about to end: its GPU is lost). */
static void fail_held(psrv_t *s, duet_status_t st, const char *msg)
{
    for (preq_t *r = s->head; r; r = r->next)
        if (r->state != PR_ABORTING)
            push_error(s, r, st, msg);
}

static preq_t *find_req(psrv_t *s, const char *rid, uint64_t epoch)
{
    for (preq_t *r = s->head; r; r = r->next)
        if (strcmp(r->rid, rid) == 0 && (!epoch || r->epoch == epoch))
            return r;
    return NULL;
}

static void unlink_req(psrv_t *s, preq_t *r)
{
    preq_t **pp = &s->head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = r->next;
    if (s->tail == r)
        s->tail = prev;
    if (r->state == PR_QUEUED)
        s->n_queued--;
    s->n_live--;
    if (r->hreq.active) { /* the tree's pages stay; only the request's own go back */
        duet_hicache_end(s->hc, &r->hreq, r->seq.pages, r->seq.n_pages);
        r->seq.n_pages = 0;
    }
    if (r->seq.has_slot)
        duet_seq_release(s->cache, &r->seq);
    duet_worker_net_sink_release(&s->net, r->sink);
    duet_xfer_desc_fini(&r->desc);
    free(r->tokens);
    free(r);
}

/* ---- commands ---------------------------------------------------------- */

static duet_status_t on_prefill(psrv_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    const Duet__V1__Prefill *pf = req->prefill;
    const char *rid = req->header->rid;
    duet_msg_origin_t o = origin(s, rid, req->header->epoch);
    duet_err_t err = {0};
    if (!rid || !*rid || !pf->descriptor)
        return duet_msg_new_error(&o, DUET_ERR_INVALID, "Prefill needs a request id and a descriptor", reply);
    if (g_stop)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_SHUTTING_DOWN, "shutting down", 0,
                                     reply);
    if (find_req(s, rid, 0))
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_DUPLICATE_RID,
                                     "request id already queued", 0, reply);
    if (s->n_queued >= s->o.queue_max)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_OVERLOADED, "prefill queue full",
                                     50, reply);
    for (size_t i = 0; i < pf->n_tokens; i++)
        if (pf->tokens[i] < 0 || pf->tokens[i] >= s->model->cfg.vocab_size) {
            char m[96];
            snprintf(m, sizeof m, "token %zu = %d is outside the vocabulary", i, pf->tokens[i]);
            return duet_msg_new_error(&o, DUET_ERR_RANGE, m, reply);
        }
    /* refuse a descriptor whose layouts differ from ours, before anything else (never a silent copy) */
    duet_cache_layout_t layouts[DUET_POOL_COUNT];
    size_t nl = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(s->cache, (duet_pool_kind_t)k);
        if (l->n_layers)
            layouts[nl++] = *l;
    }
    duet_status_t st = duet_msg_descriptor_check_layouts(pf->descriptor, layouts, nl, &err);
    if (st == DUET_OK && pf->descriptor->page_tokens != (uint32_t)s->o.cache.page_tokens)
        st = duet_err_set(&err, DUET_ERR_LAYOUT_MISMATCH, "page_tokens %u differs from ours (%d)",
                          pf->descriptor->page_tokens, s->o.cache.page_tokens);
    uint32_t need = (uint32_t)((pf->n_tokens + s->o.cache.page_tokens - 1) / s->o.cache.page_tokens);
    if (st == DUET_OK && pf->descriptor->n_page_ids != need)
        st = duet_err_set(&err, DUET_ERR_RANGE, "descriptor has %zu pages, the prompt needs %u",
                          pf->descriptor->n_page_ids, need);
    if (st == DUET_OK && need > duet_kv_cache_n_pages(s->cache))
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_TOO_LONG,
                                     "prompt larger than this worker's cache", 0, reply);
    if (st != DUET_OK)
        return duet_msg_new_error(&o, st, err.msg, reply);
    /* where this request's events go: the owner router's pull socket, or --events */
    int sink;
    st = duet_worker_net_sink_acquire(&s->net, pf->event_url, "prefill.event_url", &sink, &err);
    if (st == DUET_ERR_BUSY)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_OVERLOADED, err.msg, 1000, reply);
    if (st != DUET_OK)
        return duet_msg_new_error(&o, st, err.msg, reply);
    preq_t *r = DUET_NEW(preq_t);
    if (!r) {
        duet_worker_net_sink_release(&s->net, sink);
        return DUET_ERR_NOMEM;
    }
    r->sink = sink;
    strcpy(r->rid, rid);
    r->epoch = req->header->epoch;
    r->n_tokens = (int32_t)pf->n_tokens;
    r->tokens = duet_malloc_array(pf->n_tokens, sizeof(int32_t));
    if (!r->tokens) {
        duet_worker_net_sink_release(&s->net, sink);
        free(r);
        return DUET_ERR_NOMEM;
    }
    memcpy(r->tokens, pf->tokens, sizeof(int32_t) * pf->n_tokens);
    duet_sampling_default(&r->sp);
    if (pf->sampling) {
        r->sp.temperature = pf->sampling->temperature;
        r->sp.top_p = pf->sampling->top_p > 0.0f ? pf->sampling->top_p : 1.0f;
        r->sp.top_k = pf->sampling->top_k;
        r->sp.min_p = pf->sampling->min_p;
        r->sp.seed = pf->sampling->seed;
    }
    st = duet_msg_descriptor_to_xfer(pf->descriptor, rid, &r->desc, &err);
    if (st != DUET_OK) {
        duet_worker_net_sink_release(&s->net, sink);
        duet_xfer_desc_fini(&r->desc);
        free(r->tokens);
        free(r);
        return duet_msg_new_error(&o, st, err.msg, reply);
    }
    r->received_ns = duet_time_ns();
    r->deadline_ns = r->received_ns + (uint64_t)(pf->deadline_ms ? pf->deadline_ms : 600000) * 1000000ull;
    if (s->tail)
        s->tail->next = r;
    else
        s->head = r;
    s->tail = r;
    s->n_queued++;
    s->n_live++;
    return duet_msg_new_ack(&o, reply);
}

static Duet__V1__RequestState pr_wire_state(pr_state_t st)
{
    switch (st) {
    case PR_QUEUED: return DUET__V1__REQUEST_STATE__REQUEST_STATE_QUEUED;
    case PR_PREFILLING: return DUET__V1__REQUEST_STATE__REQUEST_STATE_PREFILLING;
    default: return DUET__V1__REQUEST_STATE__REQUEST_STATE_TRANSFERRING;
    }
}

/* Stop a request: queued or not yet transferring -> dropped (nothing was put);
 * transferring -> stop puts, flush, AbortAck to decode (the SEND event ends it). */
static int stop_request(psrv_t *s, preq_t *r)
{
    if (r->state == PR_ABORTING)
        return 1;
    if (!r->has_tid) {
        unlink_req(s, r);
        return 0;
    }
    duet_xfer_send_abort(s->net.xfer, r->tid);
    if (r->state == PR_QUEUED)
        s->n_queued--;
    r->state = PR_ABORTING;
    return 1;
}

static duet_status_t on_abort(psrv_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    const char *rid = req->header->rid;
    duet_msg_origin_t o = origin(s, rid, req->header->epoch);
    preq_t *r = rid ? find_req(s, rid, req->header->epoch) : NULL;
    if (!r)
        return duet_msg_new_abort_ack(&o, 0, DUET__V1__REQUEST_STATE__REQUEST_STATE_UNSPECIFIED, 0, 0, reply);
    Duet__V1__RequestState was = pr_wire_state(r->state);
    if (r->in_step) {
        /* served between two layers of a step that computes it: stop it when the step ends */
        r->abort_pending = 1;
        return duet_msg_new_abort_ack(&o, 1, was, r->has_tid, 0, reply);
    }
    int started = stop_request(s, r);
    return duet_msg_new_abort_ack(&o, 1, was, started, 0, reply);
}

static void fill_load(psrv_t *s, Duet__V1__Load *l)
{
    uint32_t counts[4] = {0};
    uint64_t tokens = 0;
    for (preq_t *r = s->head; r; r = r->next) {
        counts[r->state]++;
        tokens += (uint64_t)(r->n_tokens - r->done);
    }
    l->queue_len = s->n_queued;
    l->tokens_in_flight = tokens;
    l->pages_free = duet_kv_cache_free_page_count(s->cache);
    l->pages_used = duet_kv_cache_n_pages(s->cache) - l->pages_free;
    l->slots_free = duet_kv_cache_free_slot_count(s->cache);
    l->slots_used = duet_kv_cache_n_slots(s->cache) - l->slots_free;
    if (s->hc && !l->prefix_cache && (l->prefix_cache = duet_msg_alloc(&duet__v1__prefix_cache_stats__descriptor))) {
        duet_hicache_stats_t hs;
        duet_hicache_stats(s->hc, &hs);
        Duet__V1__PrefixCacheStats *p = l->prefix_cache;
        p->lookups = hs.lookups;
        p->hits = hs.hits;
        p->misses = hs.misses;
        p->device_hits = hs.device_hits;
        p->host_hits = hs.host_hits;
        p->hit_tokens = hs.hit_tokens;
        p->inserts = hs.inserts;
        p->loaded_pages = hs.loaded_pages;
        p->backed_up_pages = hs.backed_up_pages;
        p->evicted_device_pages = hs.evicted_device_pages;
        p->evicted_host_pages = hs.evicted_host_pages;
        p->nodes = hs.nodes;
        p->device_pages = hs.device_pages;
        p->host_pages_used = hs.host_pages_used;
        p->host_pages_total = hs.host_pages_total;
    }
    if (counts[PR_QUEUED])
        duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_QUEUED, counts[PR_QUEUED]);
    if (counts[PR_PREFILLING])
        duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_PREFILLING, counts[PR_PREFILLING]);
    if (counts[PR_TRANSFERRING] + counts[PR_ABORTING])
        duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_TRANSFERRING,
                                counts[PR_TRANSFERRING] + counts[PR_ABORTING]);
}

static duet_status_t on_state_dump(psrv_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    duet_msg_origin_t o = origin(s, NULL, 0);
    duet_status_t st = duet_msg_new_state_dump(&o, DUET__V1__ROLE__ROLE_PREFILL, reply);
    if (st != DUET_OK)
        return st;
    fill_load(s, (*reply)->state_dump->load);
    if (req->state_dump_request->include_requests) {
        uint64_t now = duet_time_ns();
        for (preq_t *r = s->head; r; r = r->next)
            duet_msg_state_dump_add_request((*reply)->state_dump, r->rid, r->epoch, pr_wire_state(r->state),
                                            (now - r->received_ns) / 1000000ull, r->seq.n_pages);
    }
    return DUET_OK;
}

static duet_status_t handler(const duet_envelope_t *req, duet_envelope_t **reply, void *arg)
{
    psrv_t *s = arg;
    switch (duet_msg_kind(req)) {
    case DUET__V1__ENVELOPE__BODY_PREFILL: return on_prefill(s, req, reply);
    case DUET__V1__ENVELOPE__BODY_ABORT: return on_abort(s, req, reply);
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST: return on_state_dump(s, req, reply);
    default: {
        duet_msg_origin_t o = origin(s, duet_msg_rid(req), 0);
        return duet_msg_new_error(&o, DUET_ERR_PROTOCOL, "prefill does not serve this command", reply);
    }
    }
}

/* ---- data-plane events ------------------------------------------------- */

static void drain_xfer(psrv_t *s)
{
    duet_xfer_event_t ev[32];
    uint32_t n;
    while ((n = duet_xfer_poll(s->net.xfer, ev, 32)) > 0)
        for (uint32_t i = 0; i < n; i++) {
            if (ev[i].kind != DUET_XFER_EV_SEND)
                continue;
            preq_t *r = NULL;
            for (preq_t *q = s->head; q; q = q->next)
                if (q->has_tid && q->tid == ev[i].tid) {
                    r = q;
                    break;
                }
            if (!r)
                continue;
            if (ev[i].status != DUET_OK && ev[i].status != DUET_ERR_ABORTED) {
                duet_log_rid(DUET_LOG_WARN, r->rid, "transfer failed: %s %s", duet_status_code(ev[i].status),
                             ev[i].msg);
                push_error(s, r, ev[i].status, ev[i].msg);
            }
            unlink_req(s, r); /* every put has completed or failed: our pages are free again */
        }
}

/* ---- prefill step ------------------------------------------------------ */

/* The request's pages that hold its first `upto` tokens, without the prefix-cache hit's pages at
 * their head: those are the tree's, already in the host pools (and possibly being backed up), so
 * staging leaves them alone. */
static const duet_seq_t *own_pages(const psrv_t *s, const preq_t *r, int64_t upto, duet_seq_t *view)
{
    uint32_t hit = r->hreq.active ? r->hreq.hit_pages : 0;
    uint32_t used = (uint32_t)((upto + s->o.cache.page_tokens - 1) / s->o.cache.page_tokens);
    if (used > r->seq.n_pages)
        used = r->seq.n_pages;
    *view = r->seq;
    view->pages += hit;
    view->n_pages = used > hit ? used - hit : 0;
    view->cap_pages -= hit;
    return view;
}

/* The puts of layer `layer`'s units of the requests finishing in this step */
static void send_puts(psrv_t *s, int layer)
{
    const duet_model_config_t *c = &s->model->cfg;
    int ratio = c->compress_ratios[layer], ri = duet_cfg_ratio_layer_index(c, layer);
    for (uint32_t i = 0; i < s->n_finals; i++) {
        preq_t *r = s->finals[i];
        duet_xfer_send_put(s->net.xfer, r->tid, DUET_POOL_SWA_KV, (uint32_t)layer);
        if (ratio == 4) {
            duet_xfer_send_put(s->net.xfer, r->tid, DUET_POOL_C4_KV, (uint32_t)ri);
            duet_xfer_send_put(s->net.xfer, r->tid, DUET_POOL_C4_INDEX_K, (uint32_t)ri);
            duet_xfer_send_put(s->net.xfer, r->tid, DUET_POOL_STATE_C4, (uint32_t)ri);
        } else if (ratio == 128) {
            duet_xfer_send_put(s->net.xfer, r->tid, DUET_POOL_C128_KV, (uint32_t)ri);
            duet_xfer_send_put(s->net.xfer, r->tid, DUET_POOL_STATE_C128, (uint32_t)ri);
        }
    }
}

#define STAGE_FENCES 2 /* fence slots: the layer being copied and the one before */
#define STAGE_FENCE(layer) ((layer) % STAGE_FENCES)

/* While the host waits for the GPU inside a step: control calls answered (a caller that sends one
 * call at a time, Reserve then Prefill, would otherwise wait for the whole step), else a yield. */
static void serve_idle(void *arg)
{
    psrv_t *s = arg;
    uint32_t served = 0;
    duet_ctl_server_poll(s->net.srv, 0, &served);
    if (!served)
        sched_yield();
}

/* The staged layer's copy complete, then its puts; nothing staged afterwards. */
static duet_status_t ship_staged(psrv_t *s, duet_err_t *err)
{
    if (s->staged < 0)
        return DUET_OK;
    int layer = s->staged;
    s->staged = -1;
    duet_status_t st = duet_worker_engine_fence_wait_idle(&s->eng, STAGE_FENCE(layer), serve_idle, s, err);
    if (st != DUET_OK)
        return st;
    send_puts(s, layer);
    return DUET_OK;
}

/* After each layer's attention (on the GPU: once it is queued): the layer's units of the requests
 * finishing in this step go device -> host pools (one batched copy queued behind the layer, a
 * fence behind it), and the layer before, whose copy the GPU has passed by now or will before
 * this layer's, is shipped: its fence waited for, its puts sent.  So the host does not wait for
 * the layer it has just queued (but the last), and the GPU keeps the next layer's work. */
static duet_status_t layer_done(void *arg, int layer)
{
    psrv_t *s = arg;
    /* commands are served between layers too, so a long step does not hold the router's calls */
    duet_ctl_server_poll(s->net.srv, 0, NULL);
    duet_worker_notify_watchdog(&s->net);
    if (!s->n_finals)
        return DUET_OK;
    const duet_seq_t *seqs[MAX_FINALS];
    duet_seq_t views[MAX_FINALS];
    duet_err_t err = {0};
    for (uint32_t i = 0; i < s->n_finals; i++)
        seqs[i] = own_pages(s, s->finals[i], s->finals[i]->n_tokens, &views[i]);
    duet_status_t st = duet_worker_engine_to_host_queue(&s->eng, layer, seqs, s->n_finals, STAGE_FENCE(layer), &err);
    if (st == DUET_OK)
        st = ship_staged(s, &err);
    if (st == DUET_OK) {
        s->staged = layer;
        /* the last layer ships at once: nothing of the forward's is left to overlap with but the
         * last feed-forward half and the head, and the transfer should not wait for those and the draw */
        if (layer == s->model->cfg.num_hidden_layers - 1)
            st = ship_staged(s, &err);
    }
    if (st != DUET_OK)
        duet_error("layer %d: staging copy to the host pools failed: %s", layer, duet_err_text(&err));
    return st;
}

/* Prefix cache: continue from the longest cached prefix with a resume state.
 * The hit's pages (the tree's, loaded from the host tier where needed; the
 * forward's layer gate waits for each layer) head the request's page list,
 * so the transfer sends the whole prompt's pages.  -1: no room yet (wait). */
static int hicache_start(psrv_t *s, preq_t *r)
{
    duet_err_t err = {0};
    duet_status_t st = duet_hicache_begin(s->hc, r->tokens, r->n_tokens, r->seq.slot, &r->hreq, &err);
    if (st == DUET_ERR_NO_SPACE)
        return -1;
    if (st != DUET_OK) { /* serve it without the cache */
        duet_log_rid(DUET_LOG_WARN, r->rid, "prefix cache skipped: %s", duet_err_text(&err));
        return 0;
    }
    uint32_t total = (uint32_t)((r->n_tokens + s->o.cache.page_tokens - 1) / s->o.cache.page_tokens);
    uint32_t *pages = duet_malloc_array(total ? total : 1, sizeof(uint32_t));
    if (!pages) {
        duet_hicache_end(s->hc, &r->hreq, NULL, 0);
        return -1;
    }
    if (r->hreq.hit_pages)
        memcpy(pages, r->hreq.hit_page_ids, sizeof(uint32_t) * r->hreq.hit_pages);
    r->seq.pages = pages;
    r->seq.cap_pages = total ? total : 1;
    r->seq.n_pages = r->hreq.hit_pages;
    r->seq.n_past = r->hreq.hit_tokens;
    r->done = (int32_t)r->hreq.hit_tokens;
    duet_log_rid(DUET_LOG_DEBUG, r->rid, "prefix cache: %lld of %d tokens cached", (long long)r->hreq.hit_tokens,
                 r->n_tokens);
    return 0;
}

static void hicache_log(psrv_t *s, int force)
{
    duet_hicache_stats_t st;
    if (!s->hc)
        return;
    duet_hicache_stats(s->hc, &st);
    uint64_t now = duet_time_ns();
    if (!force && (st.lookups == s->hc_logged || now - s->hc_log_ns < 10000000000ull))
        return;
    s->hc_logged = st.lookups;
    s->hc_log_ns = now;
    duet_info("hicache: lookups %llu hits %llu (device %llu host %llu) misses %llu hit_tokens %llu inserts %llu "
              "loaded_pages %llu backed_up_pages %llu evicted_device_pages %llu evicted_host_pages %llu nodes %u "
              "device_pages %u host_pages %u/%u state_bytes %llu",
              (unsigned long long)st.lookups, (unsigned long long)st.hits, (unsigned long long)st.device_hits,
              (unsigned long long)st.host_hits, (unsigned long long)st.misses, (unsigned long long)st.hit_tokens,
              (unsigned long long)st.inserts, (unsigned long long)st.loaded_pages,
              (unsigned long long)st.backed_up_pages, (unsigned long long)st.evicted_device_pages,
              (unsigned long long)st.evicted_host_pages, st.nodes, st.device_pages, st.host_pages_used,
              st.host_pages_total, (unsigned long long)st.state_bytes);
}

/* Start a queued request: our own pages and slot, then the data-plane transfer
 * (which checks the decode worker's layouts again).  Returns 0 when it must wait. */
static int start_request(psrv_t *s, preq_t *r)
{
    duet_err_t err = {0};
    if (duet_kv_cache_free_slot_count(s->cache) == 0)
        return 0;
    if (duet_seq_init(s->cache, &r->seq, &err) != DUET_OK)
        return 0;
    if (s->hc && hicache_start(s, r) < 0) {
        duet_seq_release(s->cache, &r->seq);
        return 0;
    }
    if (duet_seq_reserve(s->cache, &r->seq, r->n_tokens, &err) != DUET_OK) {
        if (r->hreq.active) {
            duet_hicache_end(s->hc, &r->hreq, r->seq.pages, r->seq.n_pages);
            r->seq.n_pages = 0;
        }
        duet_seq_release(s->cache, &r->seq);
        r->done = 0;
        return 0;
    }
    if (r->hreq.active && r->hreq.hit_pages && duet_worker_engine_on_gpu(&s->eng)) {
        /* the forward reads the device pools: what the prefix cache loaded into the host pools --
         * the pages it brought back from the host tier and the resume state in the slot -- goes
         * up first (the hit's other pages never left the device) */
        duet_seq_t loaded = r->seq;
        loaded.pages = r->hreq.loaded_page_ids;
        loaded.n_pages = loaded.cap_pages = r->hreq.n_loaded;
        duet_status_t hs = duet_hicache_wait(s->hc, &r->hreq, &err);
        if (hs == DUET_OK)
            hs = duet_worker_engine_to_device(&s->eng, &loaded, loaded.n_pages, &err);
        if (hs != DUET_OK) {
            duet_log_rid(DUET_LOG_WARN, r->rid, "prefix cache hit not copied to the device: %s",
                         duet_err_text(&err));
            push_error(s, r, hs, err.msg);
            unlink_req(s, r);
            return -1;
        }
    }
    duet_status_t st = duet_xfer_send_begin(s->net.xfer, &r->desc, r->seq.pages, r->seq.n_pages, r->seq.slot, 0,
                                            &r->tid, &err);
    if (st != DUET_OK) {
        duet_log_rid(DUET_LOG_WARN, r->rid, "transfer refused: %s", duet_err_text(&err));
        push_error(s, r, st, err.msg);
        unlink_req(s, r);
        return -1;
    }
    r->has_tid = 1;
    r->state = PR_PREFILLING;
    s->n_queued--;
    return 1;
}

/* Before a prefix-cache insert on the GPU: the request's pages and slot, every layer, device
 * pools -> host pools (the tree keeps and backs up the host copies).  After the request's last
 * chunk the layer hook has copied them already. */
static duet_status_t sync_host(psrv_t *s, preq_t *r)
{
    if (!duet_worker_engine_on_gpu(&s->eng) || r->done >= r->n_tokens)
        return DUET_OK;
    duet_seq_t v;
    const duet_seq_t *one[1] = {own_pages(s, r, r->done, &v)};
    duet_err_t err = {0};
    duet_status_t st = duet_worker_engine_to_host(&s->eng, -1, one, 1, &err);
    if (st != DUET_OK)
        duet_log_rid(DUET_LOG_WARN, r->rid, "prefix cache insert skipped: copy to the host pools failed: %s",
                     duet_err_text(&err));
    return st;
}

static void prefill_step(psrv_t *s)
{
    uint64_t now = duet_time_ns();
    uint32_t budget = s->o.token_budget, n = 0;
    duet_fwd_item_t items[MAX_ITEMS];
    preq_t *owners[MAX_ITEMS];
    s->n_finals = 0;
    for (preq_t *r = s->head, *next; r && budget > 0 && n < MAX_ITEMS && s->n_finals < MAX_FINALS; r = next) {
        next = r->next;
        if (now > r->deadline_ns && (r->state == PR_QUEUED || r->state == PR_PREFILLING) && !r->in_step) {
            duet_log_rid(DUET_LOG_WARN, r->rid, "prefill deadline passed");
            push_error(s, r, DUET_ERR_TIMEOUT, "prefill deadline passed");
            stop_request(s, r);
            continue;
        }
        if (r->state == PR_QUEUED) {
            int ok = start_request(s, r);
            if (ok <= 0)
                continue;
        }
        if (r->state != PR_PREFILLING)
            continue;
        uint32_t left = (uint32_t)(r->n_tokens - r->done), take = left < budget ? left : budget;
        if (r->hreq.active) { /* a chunk ends at each boundary whose resume state goes into the prefix cache */
            int64_t stop = duet_hicache_next_stop(&r->hreq, r->done, r->n_tokens);
            if (stop - r->done < (int64_t)take)
                take = (uint32_t)(stop - r->done);
        }
        int final = take == left;
        items[n] = (duet_fwd_item_t){.seq = &r->seq,
                                     .tokens = r->tokens + r->done,
                                     .n_tokens = (int)take,
                                     .logits_mode = final ? DUET_LOGITS_LAST : DUET_LOGITS_NONE};
        owners[n++] = r;
        if (final)
            s->finals[s->n_finals++] = r;
        budget -= take;
    }
    if (!n)
        return;
    for (uint32_t i = 0; i < n; i++)
        owners[i]->in_step = 1;
    duet_err_t err = {0};
    const duet_sampling_t *sp[MAX_ITEMS];
    int64_t pos[MAX_ITEMS];
    int32_t tok[MAX_ITEMS];
    for (uint32_t i = 0; i < n; i++) {
        sp[i] = &owners[i]->sp;
        pos[i] = owners[i]->n_tokens; /* a first token's position: the prompt's length */
        tok[i] = 0;
    }
    s->staged = -1;
    duet_status_t st =
        duet_worker_engine_prefill(&s->eng, items, (int)n, layer_done, s, sp, pos, tok, s->sample_threads, &err);
    /* the last layer's hook shipped what was staged; a failed step sends nothing more, but waits for
     * both fences all the same: no queued copy may still write pages its requests give back.  When
     * that wait fails (a stuck or broken GPU: its deadline passed, or the group is broken), copies
     * may still land in them: the worker ends at once, giving no page back and tearing nothing down
     * (its supervisor restarts it; the router and decode see a worker gone, as when it is killed) */
    if (st != DUET_OK) {
        s->staged = -1;
        for (int slot = 0; slot < STAGE_FENCES; slot++) {
            duet_err_t e2 = {0};
            if (duet_worker_engine_fence_wait(&s->eng, slot, &e2) != DUET_OK) {
                duet_error("prefill step failed (%s), and its copies to the host pools may still land (%s): "
                           "the worker stops without giving their pages back",
                           duet_err_text(&err), duet_err_text(&e2));
                fail_held(s, st, err.msg);
                duet_worker_exit_gpu_lost(&s->net, &e2);
            }
        }
    }
    for (uint32_t i = 0; i < n; i++)
        owners[i]->in_step = 0;
    if (st != DUET_OK) {
        duet_error("prefill step failed: %s", duet_err_text(&err));
        if (duet_worker_engine_gpu_lost(&s->eng)) {
            /* nothing more will run here: every request the worker holds ends now, not at its
             * router's deadline; no page is given back (a copy may still land in it) */
            fail_held(s, st, err.msg);
            duet_worker_exit_gpu_lost(&s->net, &err);
        }
        for (uint32_t i = 0; i < n; i++) {
            push_error(s, owners[i], st, err.msg);
            stop_request(s, owners[i]);
        }
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        preq_t *r = owners[i];
        r->done += items[i].n_tokens;
        if (r->hreq.active && duet_hicache_is_stop(&r->hreq, r->done) && sync_host(s, r) == DUET_OK &&
            duet_hicache_insert(s->hc, &r->hreq, r->tokens, r->done, r->seq.pages, r->seq.n_pages, r->seq.slot,
                                &err) != DUET_OK)
            duet_log_rid(DUET_LOG_WARN, r->rid, "prefix cache insert failed: %s", duet_err_text(&err));
        if (r->abort_pending) {
            stop_request(s, r);
            continue;
        }
        if (r->done < r->n_tokens)
            continue;
        int32_t first = tok[i];
        uint32_t cached = r->hreq.active ? (uint32_t)r->hreq.hit_tokens : 0;
        /* decode's copy carries `cached` into its RequestFinished, so the count does not depend on
         * this copy reaching the router before decode finishes */
        duet_xfer_send_finish(s->net.xfer, r->tid, first, cached);
        r->state = PR_TRANSFERRING;
        duet_msg_origin_t o = origin(s, r->rid, r->epoch);
        duet_envelope_t *ev = NULL;
        if (duet_msg_new_transfer_done(&o, first, (uint32_t)r->n_tokens, 0, &ev) == DUET_OK) {
            ev->transfer_done->cached_tokens = cached;
            push_event(s, r, ev); /* the router's copy: the first token is known */
        }
    }
}

static void heartbeat(psrv_t *s)
{
    if (!duet_worker_net_heartbeat_due(&s->net, &s->o))
        return;
    duet_msg_origin_t o = origin(s, NULL, 0);
    duet_envelope_t *ev = NULL;
    if (duet_msg_new_heartbeat(&o, DUET__V1__ROLE__ROLE_PREFILL, &ev) == DUET_OK) {
        fill_load(s, ev->heartbeat->load);
        duet_worker_net_broadcast(&s->net, ev); /* every router that sends here hears the load */
    }
    hicache_log(s, 0);
}

int main(int argc, char **argv)
{
    psrv_t S;
    memset(&S, 0, sizeof S);
    duet_err_t err = {0};
    int rc = 1;
    if (duet_worker_start("prefill", argc, argv, &S.o, &g_stop, &S.model, &S.cache, &rc, &err) != DUET_OK) {
        if (rc == 2)
            return 2;
        goto fail;
    }
    if (duet_worker_engine_open(&S.eng, &S.o, S.model, S.cache, MAX_FINALS, &err) != DUET_OK)
        goto fail;
    S.sample_threads = duet_worker_engine_draw_threads();
    S.finals = duet_calloc(MAX_FINALS, sizeof(preq_t *));
    if (!S.finals) {
        duet_err_set(&err, DUET_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (S.o.hicache_device_pages || S.o.hicache_host_gib > 0) {
        duet_hicache_opts_t ho = {.device_pages = S.o.hicache_device_pages,
                                  .host_bytes = (uint64_t)(S.o.hicache_host_gib * 1073741824.0),
                                  .policy = (duet_hicache_policy_t)S.o.hicache_policy,
                                  .selective_hits = S.o.hicache_selective_hits};
        if (duet_hicache_create(S.cache, &ho, &S.hc, &err) != DUET_OK)
            goto fail;
        duet_hicache_stats_t hs;
        duet_hicache_stats(S.hc, &hs);
        duet_info("%s: prefix cache on: %u device pages, host tier %u pages (%.3f GiB), %s", S.o.id,
                  S.o.hicache_device_pages, hs.host_pages_total, S.o.hicache_host_gib,
                  duet_hicache_policy_name(ho.policy));
    }
    if (duet_worker_net_open(&S.net, &S.o, &S.eng, handler, &S, &err) != DUET_OK)
        goto fail;
    char dev[32];
    duet_info("%s: serving on %s (%u pages, %u slots, kv %s, index-k %s, budget %u tokens/step, device %s%s)",
              S.o.id, S.o.listen, S.o.pages, S.o.slots, duet_cache_dtype_name(S.o.cache.kv_dtype),
              duet_cache_dtype_name(S.o.cache.index_k_dtype), S.o.token_budget,
              duet_worker_device_name(&S.o, dev, sizeof dev),
              !duet_worker_engine_on_gpu(&S.eng) ? ""
              : S.eng.direct                     ? "; transfers straight from GPU memory"
                                                 : "; transfers staged through the host pools");
    duet_worker_notify_ready(&S.o);
    while (!g_stop) {
        int busy = 0;
        for (preq_t *r = S.head; r; r = r->next)
            busy |= r->state == PR_QUEUED || r->state == PR_PREFILLING;
        duet_ctl_server_poll(S.net.srv, busy ? 0 : duet_deadline_after_ms(2), NULL);
        drain_xfer(&S);
        prefill_step(&S);
        heartbeat(&S);
        duet_worker_notify_watchdog(&S.net);
    }
    duet_worker_notify_stopping();
    /* shutdown: stop everything in flight; give the data plane a bounded time to flush and ack */
    for (preq_t *r = S.head, *next; r; r = next) {
        next = r->next;
        push_error(&S, r, DUET_ERR_ABORTED, "prefill worker shutting down");
        stop_request(&S, r);
    }
    uint64_t until = duet_deadline_after_ms(5000);
    while (S.head && duet_time_ns() < until) {
        duet_xfer_event_t ev;
        if (duet_xfer_wait(S.net.xfer, &ev, 100) == DUET_OK)
            for (preq_t *r = S.head; r; r = r->next)
                if (r->has_tid && r->tid == ev.tid) {
                    unlink_req(&S, r);
                    break;
                }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "duet-prefill: %s\n", duet_err_text(&err));
done:
    duet_worker_net_close(&S.net); /* pages stay registered until here */
    while (S.head)
        unlink_req(&S, S.head);
    hicache_log(&S, 1);
    duet_hicache_destroy(&S.hc); /* after every request ended: the tree's pages go back to the cache */
    duet_worker_engine_log_stats(&S.eng, S.o.id ? S.o.id : "prefill");
    duet_worker_engine_close(&S.eng); /* before the cache: it unmaps the host pools */
    free(S.finals);
    duet_kv_cache_destroy(&S.cache);
    duet_model_destroy(&S.model);
    duet_worker_opts_fini(&S.o);
    return rc;
}
