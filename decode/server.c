/* duet-decode: reserves pages for incoming requests, receives their cache
 * state from prefill workers, decodes them in a continuous batch and streams
 * tokens to the router (DESIGN §1–§3).
 *
 * One thread owns everything (model, cache, request table, sockets): the loop
 * serves commands between steps, takes data-plane events, expires waiting
 * requests, runs one decode step, and pushes events.  Nothing in it waits
 * without a deadline; with requests in the batch it does not wait at all. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "msg_xfer.h"
#include "forward.h"
#include "log.h"
#include "msg.h"
#include "ctl.h"
#include "requests.h"
#include "sampling.h"
#include "time_util.h"
#include "worker_engine.h"
#include "worker_net.h"
#include "xfer.h"

#define GRACE_MS 60000 /* data-plane record kept this long past the wait deadline */
#define DUET_XFER_POLL_MAX 32 /* data-plane events taken a poll; the arrivals among them share one upload */

typedef struct {
    duet_sampling_t sp;
    int32_t *stop_ids;
    size_t n_stop;
    int ignore_eos;
    int32_t last_token;
    uint32_t n_generated;
    uint32_t n_prompt_pages;
    uint32_t cached_tokens; /* prompt tokens prefill served from its prefix cache (its TransferDone) */
    int sink;            /* where this request's events go (Reserve.event_url; held until free_dd) */
} dd_t; /* per-request decode data (duet_dreq_t.user) */

typedef struct {
    duet_worker_opts_t o;
    duet_model_t *model;
    duet_kv_cache_t *cache;
    duet_dreq_table_t *tab;
    duet_worker_net_t net;
    duet_worker_engine_t eng; /* where the forward runs (--device) */
    uint64_t steps, step_ns_total, step_ns_max, tokens_out, tokens_stepped;
    uint32_t top_rows;        /* the largest batch a step has run, and the steps of that size */
    uint64_t top_steps, top_ns;
    int sample_threads;       /* threads that sample a step's rows (the host's cores, at most 16) */
} dsrv_t;

static volatile int g_stop;

static duet_msg_origin_t origin(dsrv_t *s, const char *rid, uint64_t epoch)
{
    return (duet_msg_origin_t){.sender_id = s->o.id, .rid = rid, .epoch = epoch};
}

/* An event about request r goes to the router that owns it (its Reserve's event_url). */
static void push_event(dsrv_t *s, const duet_dreq_t *r, duet_envelope_t *ev)
{
    const dd_t *u = r ? r->user : NULL;
    duet_worker_net_push_to(&s->net, u ? u->sink : DUET_WORKER_SINK_EVENTS, ev);
}

static void free_dd(dsrv_t *s, duet_dreq_t *r)
{
    dd_t *u = r->user;
    if (u) {
        duet_worker_net_sink_release(&s->net, u->sink);
        free(u->stop_ids);
        free(u);
        r->user = NULL;
    }
}

static void emit_finished(dsrv_t *s, duet_dreq_t *r, Duet__V1__FinishReason reason, Duet__V1__AbortReason why,
                          duet_status_t error)
{
    duet_msg_origin_t o = origin(s, r->rid, r->epoch);
    duet_envelope_t *ev = NULL;
    dd_t *u = r->user;
    if (duet_msg_new_request_finished(&o, reason, (uint32_t)r->prompt_len, u ? u->n_generated : 0, &ev) == DUET_OK) {
        ev->request_finished->abort_reason = why;
        /* the usage's cached count rides on the event that ends the request (the router's copy
         * from prefill may arrive after it) */
        if (u && reason != DUET__V1__FINISH_REASON__FINISH_REASON_ABORT)
            ev->request_finished->cached_tokens =
                u->cached_tokens <= (uint32_t)r->prompt_len ? u->cached_tokens : (uint32_t)r->prompt_len;
        if (error != DUET_OK)
            ev->request_finished->error = duet_msg_error_code(error);
        push_event(s, r, ev);
    }
}

/* Remove a request for good (pages freed or released by the table). */
static void finish_request(dsrv_t *s, duet_dreq_t *r, Duet__V1__FinishReason reason)
{
    emit_finished(s, r, reason, DUET__V1__ABORT_REASON__ABORT_REASON_UNSPECIFIED, DUET_OK);
    free_dd(s, r);
    duet_dreq_finish(s->tab, r->rid);
}

static Duet__V1__RequestState wire_state(duet_req_state_t st)
{
    switch (st) {
    case DUET_REQ_RESERVED: return DUET__V1__REQUEST_STATE__REQUEST_STATE_RESERVED;
    case DUET_REQ_WAITING_FOR_INPUT: return DUET__V1__REQUEST_STATE__REQUEST_STATE_WAITING_FOR_INPUT;
    case DUET_REQ_DECODING: return DUET__V1__REQUEST_STATE__REQUEST_STATE_DECODING;
    case DUET_REQ_FINISHED: return DUET__V1__REQUEST_STATE__REQUEST_STATE_FINISHED;
    default: return DUET__V1__REQUEST_STATE__REQUEST_STATE_ABORTED;
    }
}

/* ---- commands ---------------------------------------------------------- */

static duet_status_t on_reserve(dsrv_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    const Duet__V1__Reserve *rv = req->reserve;
    const char *rid = req->header->rid;
    duet_err_t err = {0};
    uint64_t now = duet_time_ns();
    uint32_t wait_ms = rv->deadline_ms ? rv->deadline_ms : s->o.wait_timeout_ms;
    int64_t total = (int64_t)rv->prompt_len + rv->max_new_tokens;
    duet_msg_origin_t o = origin(s, rid, 0);
    if (!rid || !*rid)
        return duet_msg_new_error(&o, DUET_ERR_INVALID, "Reserve without a request id", reply);
    if (total > s->model->cfg.max_position_embeddings)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_TOO_LONG,
                                     "prompt_len + max_new_tokens exceeds the model's context", 0, reply);
    if (g_stop)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_SHUTTING_DOWN, "shutting down",
                                     0, reply);
    /* where this request's events go: the owner router's pull socket, or --events */
    int sink;
    duet_status_t st = duet_worker_net_sink_acquire(&s->net, rv->event_url, "reserve.event_url", &sink, &err);
    if (st == DUET_ERR_BUSY)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_OVERLOADED, err.msg, 1000, reply);
    if (st != DUET_OK)
        return duet_msg_new_error(&o, st, err.msg, reply);
    duet_dreq_t *r;
    st = duet_dreq_reserve(s->tab, rid, rv->prefill_worker_id, (int32_t)rv->prompt_len, (int32_t)rv->max_new_tokens,
                           wait_ms, now, &r, &err);
    if (st != DUET_OK)
        duet_worker_net_sink_release(&s->net, sink);
    if (st == DUET_ERR_STATE)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_DUPLICATE_RID, err.msg, 0, reply);
    if (st != DUET_OK)
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_NO_PAGES, err.msg, 100, reply);
    dd_t *u = DUET_NEW(dd_t);
    if (!u) {
        duet_worker_net_sink_release(&s->net, sink);
        duet_dreq_abort(s->tab, rid, 0, 0);
        duet_dreq_router_confirms_undelivered(s->tab, rid, 0);
        return DUET_ERR_NOMEM;
    }
    u->sink = sink;
    r->user = u;
    duet_sampling_default(&u->sp);
    const Duet__V1__SamplingParams *sp = rv->sampling;
    if (sp) {
        u->sp.temperature = sp->temperature;
        u->sp.top_p = sp->top_p > 0.0f ? sp->top_p : 1.0f;
        u->sp.top_k = sp->top_k;
        u->sp.min_p = sp->min_p;
        u->sp.seed = sp->seed;
        u->ignore_eos = sp->ignore_eos;
        if (sp->n_stop_token_ids) {
            u->stop_ids = duet_malloc_array(sp->n_stop_token_ids, sizeof(int32_t));
            if (u->stop_ids) {
                memcpy(u->stop_ids, sp->stop_token_ids, sizeof(int32_t) * sp->n_stop_token_ids);
                u->n_stop = sp->n_stop_token_ids;
            }
        }
    }
    int64_t pt = s->o.cache.page_tokens;
    u->n_prompt_pages = (uint32_t)((rv->prompt_len + pt - 1) / pt);
    duet_xfer_desc_t desc;
    memset(&desc, 0, sizeof desc);
    st = duet_xfer_recv_expect(s->net.xfer, rid, r->epoch, r->seq.pages, u->n_prompt_pages, r->seq.slot,
                               now + (uint64_t)(wait_ms + GRACE_MS) * 1000000ull, 0, &desc, &err);
    if (st == DUET_OK) {
        o.epoch = r->epoch;
        Duet__V1__TransferDescriptor *td = NULL;
        st = duet_msg_descriptor_from_xfer(&desc, s->o.id, &td);
        if (st == DUET_OK)
            st = duet_msg_new_reserved(&o, s->o.id, desc.address, desc.address_len, desc.page_tokens, desc.slot,
                                       reply);
        if (st == DUET_OK) {
            duet_msg_free(&(*reply)->reserved->descriptor->base);
            (*reply)->reserved->descriptor = td;
        } else if (td) {
            duet_msg_free(&td->base);
        }
    }
    duet_xfer_desc_fini(&desc);
    if (st != DUET_OK) {
        duet_envelope_free(reply);
        free_dd(s, r);
        /* nothing was handed out: the pages can go back at once */
        duet_dreq_abort(s->tab, rid, 0, 0);
        duet_dreq_router_confirms_undelivered(s->tab, rid, 0);
        return duet_msg_new_error(&o, st, err.msg[0] ? err.msg : duet_status_str(st), reply);
    }
    duet_log_rid(DUET_LOG_DEBUG, rid, "reserved %u pages, slot %u, epoch %llu", r->seq.n_pages, r->seq.slot,
                 (unsigned long long)r->epoch);
    return DUET_OK;
}

static duet_status_t on_abort(dsrv_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    const char *rid = req->header->rid;
    uint64_t epoch = req->header->epoch;
    duet_msg_origin_t o = origin(s, rid, epoch);
    duet_dreq_t *r = rid ? duet_dreq_find(s->tab, rid) : NULL;
    if (!r || (epoch && r->epoch != epoch))
        return duet_msg_new_abort_ack(&o, 0, DUET__V1__REQUEST_STATE__REQUEST_STATE_UNSPECIFIED, 0, 0, reply);
    Duet__V1__RequestState was = wire_state(r->state);
    uint32_t quarantined = 0;
    if (r->state == DUET_REQ_DECODING) {
        emit_finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT, req->abort->reason, DUET_OK);
        free_dd(s, r);
        duet_dreq_abort(s->tab, r->rid, 0, req->abort->reason);
    } else {
        if (r->state == DUET_REQ_WAITING_FOR_INPUT) {
            emit_finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT, req->abort->reason, DUET_OK);
            free_dd(s, r);
            duet_dreq_abort(s->tab, r->rid, 0, req->abort->reason);
            duet_xfer_recv_cancel(s->net.xfer, r->rid, r->epoch);
        }
        if (req->abort->prefill_quiesced) {
            duet_dreq_router_confirms_undelivered(s->tab, rid, 0);
        } else {
            quarantined = r->seq.n_pages;
        }
    }
    return duet_msg_new_abort_ack(&o, 1, was, 0, quarantined, reply);
}

static int dump_one(duet_dreq_t *r, void *arg)
{
    Duet__V1__StateDump *sd = arg;
    uint64_t now = duet_time_ns();
    duet_msg_state_dump_add_request(sd, r->rid, r->epoch, wire_state(r->state), (now - r->created_ns) / 1000000ull,
                                    r->seq.n_pages);
    return 0;
}

static void fill_load(dsrv_t *s, Duet__V1__Load *l)
{
    duet_dreq_stats_t st;
    uint64_t now = duet_time_ns();
    duet_dreq_stats(s->tab, now, &st);
    uint32_t np = duet_kv_cache_n_pages(s->cache), ns = duet_kv_cache_n_slots(s->cache);
    l->pages_free = duet_kv_cache_free_page_count(s->cache);
    l->pages_quarantined = duet_kv_cache_quarantined_page_count(s->cache);
    l->pages_used = np - l->pages_free - l->pages_quarantined;
    l->slots_free = duet_kv_cache_free_slot_count(s->cache);
    l->slots_quarantined = duet_kv_cache_quarantined_slot_count(s->cache);
    l->slots_used = ns - l->slots_free - l->slots_quarantined;
    for (int i = 0; i < DUET_REQ_STATE_COUNT; i++)
        if (st.by_state[i])
            duet_msg_load_add_state(l, wire_state((duet_req_state_t)i), st.by_state[i]);
    l->oldest_waiting_age_ms = st.oldest_waiting_ns / 1000000ull;
    l->queue_len = st.by_state[DUET_REQ_WAITING_FOR_INPUT];
}

static duet_status_t on_state_dump(dsrv_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    duet_msg_origin_t o = origin(s, NULL, 0);
    duet_status_t st = duet_msg_new_state_dump(&o, DUET__V1__ROLE__ROLE_DECODE, reply);
    if (st != DUET_OK)
        return st;
    fill_load(s, (*reply)->state_dump->load);
    if (req->state_dump_request->include_requests)
        duet_dreq_foreach(s->tab, dump_one, (*reply)->state_dump);
    return DUET_OK;
}

static duet_status_t handler(const duet_envelope_t *req, duet_envelope_t **reply, void *arg)
{
    dsrv_t *s = arg;
    switch (duet_msg_kind(req)) {
    case DUET__V1__ENVELOPE__BODY_RESERVE: return on_reserve(s, req, reply);
    case DUET__V1__ENVELOPE__BODY_ABORT: return on_abort(s, req, reply);
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST: return on_state_dump(s, req, reply);
    default: {
        duet_msg_origin_t o = origin(s, duet_msg_rid(req), 0);
        return duet_msg_new_error(&o, DUET_ERR_PROTOCOL, "decode does not serve this command", reply);
    }
    }
}

/* ---- data-plane events ------------------------------------------------- */

static int is_stop(const dd_t *u, int32_t tok, int32_t eos)
{
    if (!u->ignore_eos && tok == eos)
        return 1;
    for (size_t i = 0; i < u->n_stop; i++)
        if (u->stop_ids[i] == tok)
            return 1;
    return 0;
}

/* A generated token: stream it, then finish the request if it ends here. Returns 1 when finished. */
static int deliver_token(dsrv_t *s, duet_dreq_t *r, int32_t tok)
{
    dd_t *u = r->user;
    duet_msg_origin_t o = origin(s, r->rid, r->epoch);
    duet_envelope_t *ev = NULL;
    if (duet_msg_new_token_chunk(&o, u->n_generated, &tok, 1, &ev) == DUET_OK)
        push_event(s, r, ev);
    u->n_generated++;
    u->last_token = tok;
    s->tokens_out++;
    if (is_stop(u, tok, s->model->cfg.eos_token_id)) {
        finish_request(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_STOP);
        return 1;
    }
    if ((int32_t)u->n_generated >= r->max_new_tokens) {
        finish_request(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_LENGTH);
        return 1;
    }
    return 0;
}

typedef struct {
    dsrv_t *s;
    const char *prefill_id;
} dead_ctx_t;

static int notify_dead_one(duet_dreq_t *r, void *arg)
{
    dead_ctx_t *c = arg;
    if (strcmp(r->prefill_id, c->prefill_id) == 0 && r->state == DUET_REQ_WAITING_FOR_INPUT) {
        emit_finished(c->s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT,
                      DUET__V1__ABORT_REASON__ABORT_REASON_PEER_FAILURE, DUET_ERR_PEER);
        free_dd(c->s, r);
    }
    return 0;
}

/* A request the worker still holds when its GPU is lost (the worker is about to end): its error. */
static int fail_held_one(duet_dreq_t *r, void *arg)
{
    dsrv_t *s = arg;
    if (r->state == DUET_REQ_RESERVED || r->state == DUET_REQ_WAITING_FOR_INPUT || r->state == DUET_REQ_DECODING)
        emit_finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ERROR,
                      DUET__V1__ABORT_REASON__ABORT_REASON_UNSPECIFIED, DUET_ERR_CUDA);
    return 0;
}

/* The data plane declared a prefill worker's endpoint failed and closed: no put
 * from it can land any more (it also refuses to reconnect to us), so every
 * request bound to it ends and its pages are released (DESIGN §3 (b)). */
static void prefill_dead(dsrv_t *s, const char *prefill_id)
{
    if (!prefill_id[0])
        return;
    char id[DUET_WORKER_ID_MAX + 1];
    snprintf(id, sizeof id, "%s", prefill_id);
    dead_ctx_t c = {s, id};
    duet_dreq_foreach(s->tab, notify_dead_one, &c);
    int n = duet_dreq_prefill_dead(s->tab, id);
    duet_warn("prefill worker %s failed: %d requests ended, their pages released", id, n);
}

/* A request whose input arrived in one poll of the data plane, its first token not yet delivered */
typedef struct {
    duet_dreq_t *r;
    int32_t first_token;
} arrival_t;

/* The poll's arrivals: on the GPU, their received pages and slots host -> device pools in one copy
 * (one wait for all instead of one each); then each one's first token, in arrival order.  Nothing
 * else runs between a request's TransferDone and here (no command is served inside a poll), so
 * each is still DECODING and holds its pages. */
static void arrive(dsrv_t *s, arrival_t *a, uint32_t n)
{
    if (!n)
        return;
    if (duet_worker_engine_on_gpu(&s->eng)) {
        const duet_seq_t *seqs[DUET_XFER_POLL_MAX];
        uint32_t np[DUET_XFER_POLL_MAX];
        for (uint32_t i = 0; i < n; i++) {
            const dd_t *u = a[i].r->user;
            seqs[i] = &a[i].r->seq;
            np[i] = u && u->n_prompt_pages <= a[i].r->seq.n_pages ? u->n_prompt_pages : a[i].r->seq.n_pages;
        }
        duet_err_t err = {0};
        duet_status_t st = duet_worker_engine_to_device_n(&s->eng, seqs, np, n, &err);
        if (st != DUET_OK) {
            for (uint32_t i = 0; i < n; i++) {
                duet_dreq_t *r = a[i].r;
                duet_log_rid(DUET_LOG_ERROR, r->rid, "copy of the received pages to the device failed: %s",
                             duet_err_text(&err));
                emit_finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ERROR,
                              DUET__V1__ABORT_REASON__ABORT_REASON_UNSPECIFIED, st);
                free_dd(s, r);
                duet_dreq_finish(s->tab, r->rid);
            }
            return;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        duet_log_rid(DUET_LOG_DEBUG, a[i].r->rid, "input arrived, first token %d", a[i].first_token);
        deliver_token(s, a[i].r, a[i].first_token);
    }
}

static void on_recv_event(dsrv_t *s, const duet_xfer_event_t *ev, arrival_t *arr, uint32_t *n_arr)
{
    duet_dreq_t *r = duet_dreq_find(s->tab, ev->rid);
    if (!r || r->epoch != ev->epoch)
        return;
    if (ev->status == DUET_ERR_PEER && r->prefill_id[0]) {
        prefill_dead(s, r->prefill_id);
        return;
    }
    if (r->quarantined) {
        /* any end of the receive means no put for this epoch can still land */
        if (ev->status == DUET_OK || ev->status == DUET_ERR_ABORTED || ev->status == DUET_ERR_PEER ||
            ev->status == DUET_ERR_CHECKSUM) {
            if (ev->status == DUET_ERR_PEER)
                duet_dreq_router_confirms_undelivered(s->tab, r->rid, r->epoch);
            else
                duet_dreq_abort_ack(s->tab, r->rid, r->epoch);
        }
        return;
    }
    if (r->state != DUET_REQ_WAITING_FOR_INPUT)
        return;
    if (ev->status == DUET_OK) {
        if (duet_dreq_transfer_done(s->tab, r->rid, r->epoch, &r) != DUET_OK)
            return;
        r->seq.n_past = r->prompt_len;
        if (r->user)
            ((dd_t *)r->user)->cached_tokens = ev->cached_tokens;
        /* what arrived (verified) in the host pools: the prompt's pages and the slot go to the device
         * pools with the poll's other arrivals (arrive) */
        arr[(*n_arr)++] = (arrival_t){r, ev->first_token};
        return;
    }
    /* the transfer failed: the request ends; whether its pages may be reused depends on why */
    duet_log_rid(DUET_LOG_WARN, r->rid, "transfer failed: %s %s", duet_status_code(ev->status), ev->msg);
    Duet__V1__AbortReason why = ev->status == DUET_ERR_TIMEOUT ? DUET__V1__ABORT_REASON__ABORT_REASON_WAIT_DEADLINE
                                                                : DUET__V1__ABORT_REASON__ABORT_REASON_PEER_FAILURE;
    emit_finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT, why, ev->status);
    free_dd(s, r);
    duet_dreq_abort(s->tab, r->rid, r->epoch, why);
    if (ev->status == DUET_ERR_PEER || ev->status == DUET_ERR_CHECKSUM || ev->status == DUET_ERR_ABORTED) {
        /* prefill is dead (endpoint failed and closed) or has flushed: nothing can land */
        duet_dreq_router_confirms_undelivered(s->tab, r->rid, r->epoch);
    }
}

static void drain_xfer(dsrv_t *s)
{
    duet_xfer_event_t ev[DUET_XFER_POLL_MAX];
    arrival_t arr[DUET_XFER_POLL_MAX];
    uint32_t n;
    while ((n = duet_xfer_poll(s->net.xfer, ev, DUET_XFER_POLL_MAX)) > 0) {
        uint32_t n_arr = 0;
        for (uint32_t i = 0; i < n; i++)
            if (ev[i].kind == DUET_XFER_EV_RECV)
                on_recv_event(s, &ev[i], arr, &n_arr);
        arrive(s, arr, n_arr);
    }
}

static void expire_waiting(dsrv_t *s)
{
    duet_dreq_t *out[64];
    int n;
    while ((n = duet_dreq_expire(s->tab, duet_time_ns(), out, 64)) > 0)
        for (int i = 0; i < n; i++) {
            duet_log_rid(DUET_LOG_WARN, out[i]->rid, "WAITING_FOR_INPUT deadline passed; pages quarantined");
            emit_finished(s, out[i], DUET__V1__FINISH_REASON__FINISH_REASON_ABORT,
                          DUET__V1__ABORT_REASON__ABORT_REASON_WAIT_DEADLINE, DUET_ERR_TIMEOUT);
            free_dd(s, out[i]);
            duet_xfer_recv_cancel(s->net.xfer, out[i]->rid, out[i]->epoch);
        }
}

/* ---- decode step ------------------------------------------------------- */

typedef struct {
    duet_dreq_t **v;
    uint32_t n, max;
} pick_t;

static int pick_decoding(duet_dreq_t *r, void *arg)
{
    pick_t *p = arg;
    if (r->state == DUET_REQ_DECODING && r->user)
        p->v[p->n++] = r;
    return p->n >= p->max;
}

static duet_status_t decode_step(dsrv_t *s, int *did_work)
{
    duet_dreq_t *batch[1024];
    pick_t p = {batch, 0, s->o.max_batch < 1024 ? s->o.max_batch : 1024};
    duet_dreq_foreach(s->tab, pick_decoding, &p);
    *did_work = p.n > 0;
    if (!p.n)
        return DUET_OK;
    duet_fwd_item_t items[1024];
    for (uint32_t i = 0; i < p.n; i++) {
        dd_t *u = batch[i]->user;
        items[i] = (duet_fwd_item_t){.seq = &batch[i]->seq, .tokens = &u->last_token, .n_tokens = 1,
                                     .logits_mode = DUET_LOGITS_LAST};
    }
    const duet_sampling_t *sp[1024];
    int32_t tok[1024];
    for (uint32_t i = 0; i < p.n; i++)
        sp[i] = &((dd_t *)batch[i]->user)->sp;
    duet_err_t err = {0};
    uint64_t t0 = duet_time_ns();
    /* the forward and the tokens (greedy rows picked on the GPU there, their logits not copied) */
    duet_status_t st = duet_worker_engine_decode(&s->eng, items, (int)p.n, sp, tok, s->sample_threads, &err);
    uint64_t dt = duet_time_ns() - t0;
    s->steps++;
    s->step_ns_total += dt;
    if (dt > s->step_ns_max)
        s->step_ns_max = dt;
    if (p.n > s->top_rows) {
        s->top_rows = p.n;
        s->top_steps = 0;
        s->top_ns = 0;
    }
    if (p.n == s->top_rows) {
        s->top_steps++;
        s->top_ns += dt;
    }
    if (st != DUET_OK) {
        duet_error("decode step failed: %s", duet_err_text(&err));
        for (uint32_t i = 0; i < p.n; i++) {
            emit_finished(s, batch[i], DUET__V1__FINISH_REASON__FINISH_REASON_ERROR,
                          DUET__V1__ABORT_REASON__ABORT_REASON_UNSPECIFIED, st);
            free_dd(s, batch[i]);
            duet_dreq_finish(s->tab, batch[i]->rid);
        }
        if (duet_worker_engine_gpu_lost(&s->eng)) {
            /* nothing more will run here: every other request the worker holds ends now as well,
             * its error queued for its router, rather than at the router's deadline */
            duet_dreq_foreach(s->tab, fail_held_one, s);
            duet_worker_exit_gpu_lost(&s->net, &err);
        }
        return DUET_OK;
    }
    s->tokens_stepped += p.n;
    for (uint32_t i = 0; i < p.n; i++)
        deliver_token(s, batch[i], tok[i]);
    return DUET_OK;
}

static void heartbeat(dsrv_t *s)
{
    if (!duet_worker_net_heartbeat_due(&s->net, &s->o))
        return;
    duet_msg_origin_t o = origin(s, NULL, 0);
    duet_envelope_t *ev = NULL;
    if (duet_msg_new_heartbeat(&o, DUET__V1__ROLE__ROLE_DECODE, &ev) == DUET_OK) {
        fill_load(s, ev->heartbeat->load);
        duet_worker_net_broadcast(&s->net, ev); /* every router that sends here hears the load */
    }
}

static int shutdown_one(duet_dreq_t *r, void *arg)
{
    dsrv_t *s = arg;
    if (r->state == DUET_REQ_DECODING || r->state == DUET_REQ_WAITING_FOR_INPUT)
        emit_finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT,
                      DUET__V1__ABORT_REASON__ABORT_REASON_WORKER_SHUTDOWN, DUET_OK);
    free_dd(s, r);
    return 0;
}

int main(int argc, char **argv)
{
    dsrv_t S;
    memset(&S, 0, sizeof S);
    duet_err_t err = {0};
    int rc = 1;
    if (duet_worker_start("decode", argc, argv, &S.o, &g_stop, &S.model, &S.cache, &rc, &err) != DUET_OK) {
        if (rc == 2)
            return 2;
        goto fail;
    }
    if (duet_dreq_table_create(S.cache, S.o.slots, &S.tab, &err) != DUET_OK)
        goto fail;
    if (duet_worker_engine_open(&S.eng, &S.o, S.model, S.cache, S.o.max_batch < 1024 ? S.o.max_batch : 1024,
                                &err) != DUET_OK)
        goto fail;
    S.sample_threads = duet_worker_engine_draw_threads();
    S.eng.receives = 1;
    if (duet_worker_net_open(&S.net, &S.o, &S.eng, handler, &S, &err) != DUET_OK)
        goto fail;
    char dev[32];
    duet_info("%s: serving on %s (%u pages, %u slots, kv %s, index-k %s, device %s%s)", S.o.id, S.o.listen,
              S.o.pages, S.o.slots, duet_cache_dtype_name(S.o.cache.kv_dtype),
              duet_cache_dtype_name(S.o.cache.index_k_dtype), duet_worker_device_name(&S.o, dev, sizeof dev),
              !duet_worker_engine_on_gpu(&S.eng) ? ""
              : S.eng.direct                     ? "; transfers straight into GPU memory"
                                                 : "; transfers staged through the host pools");
    duet_worker_notify_ready(&S.o);
    while (!g_stop) {
        int busy = 0;
        duet_dreq_stats_t ds;
        duet_dreq_stats(S.tab, 0, &ds);
        busy = ds.by_state[DUET_REQ_DECODING] > 0;
        /* idle: sleep in the command socket for up to 2 ms; busy: do not wait */
        duet_ctl_server_poll(S.net.srv, busy ? 0 : duet_deadline_after_ms(2), NULL);
        drain_xfer(&S);
        expire_waiting(&S);
        int did = 0;
        decode_step(&S, &did);
        heartbeat(&S);
        duet_worker_notify_watchdog(&S.net);
    }
    duet_worker_notify_stopping();
    duet_info("%s: shutting down: %llu steps, mean %.2f ms, max %.2f ms, %llu tokens, %.1f decoded tokens/s of step "
              "time; at the largest batch (%u rows) %llu steps, mean %.2f ms, %.1f tokens/s",
              S.o.id, (unsigned long long)S.steps, S.steps ? S.step_ns_total / 1e6 / S.steps : 0.0,
              S.step_ns_max / 1e6, (unsigned long long)S.tokens_out,
              S.step_ns_total ? S.tokens_stepped / (S.step_ns_total / 1e9) : 0.0, S.top_rows,
              (unsigned long long)S.top_steps, S.top_steps ? S.top_ns / 1e6 / S.top_steps : 0.0,
              S.top_ns ? (double)S.top_rows * S.top_steps / (S.top_ns / 1e9) : 0.0);
    duet_worker_engine_log_stats(&S.eng, S.o.id);
    duet_worker_engine_log_draws(&S.eng, S.o.id);
    duet_dreq_foreach(S.tab, shutdown_one, &S);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "duet-decode: %s\n", duet_err_text(&err));
done:
    duet_worker_net_close(&S.net);
    duet_dreq_table_destroy(&S.tab);
    duet_worker_engine_close(&S.eng); /* before the cache: it unmaps the host pools */
    duet_kv_cache_destroy(&S.cache);
    duet_model_destroy(&S.model);
    duet_worker_opts_fini(&S.o);
    return rc;
}
