/* The router core (core.h).
 *
 * Threads:
 *   core     owns `workers`, the request table and the pending queue; runs
 *            the lifecycle and the abort protocol.  Holds state_mu while it
 *            works, so readers of the tables (/ready, /metrics, /v1/workers)
 *            see a consistent picture; it never blocks while holding it.
 *   events   receives from the pull socket, hands each event to the inbox.
 *   calls    per worker, `calls_per_worker` threads run that worker's
 *            commands (aborts first) and hand each reply to the inbox.
 * The inbox is a list under in_mu plus an eventfd the core polls. */
#include "core.h"

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "log.h"
#include "msg.h"
#include "time_util.h"

#define MAX_WORKERS 256
#define HASH_BUCKETS 4096
#define CLEANUP_ATTEMPTS 5      /* a timed-out cleanup Abort is sent again this many times */
#define PROBE_MS 1000          /* a worker silent this long gets a StateDump */
#define ORPHAN_RESOLVE_MS 15000 /* an orphan whose workers stay unknown is dropped after this */
#define SESSIONS 4096           /* local session-affinity cache */

#define ROLE_PREFILL DUET__V1__ROLE__ROLE_PREFILL
#define ROLE_DECODE DUET__V1__ROLE__ROLE_DECODE
#define KIND(e) duet_msg_kind(e)
#define B(x) DUET__V1__ENVELOPE__BODY_##x
#define AR(x) DUET__V1__ABORT_REASON__ABORT_REASON_##x
#define ABORT_STOP_STRING 0 /* metrics label of the router's own stop */

typedef struct duet_core core_t;
typedef struct worker worker_t;
typedef struct crq crq_t;

/* ---- commands to workers --------------------------------------------- */

typedef enum { OP_RESERVE, OP_PREFILL, OP_ABORT_P, OP_ABORT_D, OP_PROBE, OP_CLEANUP } op_t;
static const char *const op_names[] = {"Reserve", "Prefill", "Abort(prefill)", "Abort(decode)", "StateDump",
                                       "Abort(cleanup)"};

typedef struct job {
    struct job *next;
    op_t op;
    worker_t *w;
    crq_t *q;               /* the request, or NULL (probe, cleanup) */
    duet_envelope_t *req;   /* owned */
    uint64_t deadline_ns;
    uint64_t sent_ns;       /* when a call thread put it on the wire */
    duet_status_t st;
    duet_envelope_t *reply; /* owned once the call ends */
    duet_err_t err;
    int attempt;            /* OP_CLEANUP: how many times it was sent before */
    uint64_t incarnation;   /* the worker's when the job was queued */
} job_t;

/* ---- workers ------------------------------------------------------------ */

typedef struct {
    uint32_t queue_len, pages_free, pages_used, pages_quarantined, slots_free, slots_used, slots_quarantined;
    uint64_t tokens_in_flight, oldest_waiting_ms;
    char oldest_waiting_rid[65];
    uint32_t states[9]; /* RequestState -> count */
    int have_pc;        /* prefill with a prefix cache: pc is its last report */
    Duet__V1__PrefixCacheStats pc;
} load_t;

struct worker {
    core_t *c;
    char id[DUET_MSG_MAX_ID_LEN + 1]; /* "" until known */
    char url[257];                    /* "" when only heard from */
    int role;                         /* ROLE_PREFILL, ROLE_DECODE, 0 unknown */
    int configured;                   /* from the command line */
    int gone;                         /* merged into another entry */
    duet_ctl_client_t *client;
    /* call queue (mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_t *uh, *ut, *nh, *nt; /* urgent (aborts), normal */
    pthread_t *threads;
    uint32_t n_threads;
    int stop;
    /* core only */
    uint64_t last_seen_ns, last_probe_ns;
    uint64_t incarnation;   /* the worker process's, from its heartbeats and state dumps; 0: not yet known */
    int probing, healthy, have_load;
    load_t load;
    uint32_t page_tokens, pages_total;
    uint32_t bound;         /* router requests using this worker */
    uint32_t outstanding;   /* prefill: requests sent whose first token has not come */
    uint32_t pages_claimed; /* decode: pages reserved since the last load report */
    uint64_t last_redis_ns;
};

/* ---- requests ----------------------------------------------------------- */

typedef enum { Q_PENDING, Q_RESERVING, Q_PREFILLING, Q_RUNNING, Q_ABORTING, Q_NSTATES } qstate_t;
static const char *const qstate_names[] = {"queued", "reserving", "prefilling", "running", "aborting"};

struct crq {
    crq_t *next, *prev; /* the table */
    crq_t *hnext;       /* hash chain by rid */
    crq_t *pnext;       /* pending queue */
    char rid[65];
    duet_rreq_t *r;     /* NULL for an orphan */
    qstate_t st;
    worker_t *P, *D;
    uint64_t epoch;
    uint32_t cached_tokens; /* prompt tokens prefill served from its prefix cache (its TransferDone copy) */
    int calls;            /* jobs in flight */
    int reserve_inflight; /* Reserve sent, no answer yet */
    int reserved;         /* decode may hold it */
    int prefill_inflight; /* Prefill sent, no answer yet */
    int prefill_maybe;    /* prefill may hold it */
    int first_seen;       /* a first token arrived (prefill is done with it) */
    int abort_reason;     /* != 0 while aborting (AbortReason; -1: stop string) */
    int abort_p;          /* 0 not sent, 1 sent, 2 answered */
    int quiesced;         /* no put can land any more */
    int abort_d_sent, abort_d_q_sent, abort_d_inflight;
    uint64_t abort_ns;
    uint64_t retry_at_ns;
    int attempts;
    uint32_t n_tokens;
    uint64_t last_token_ns;
    int finished;
    int pending;          /* in the pending queue */
    int active;           /* counted in n_active (holds or may hold workers) */
    int outstanding;      /* counted in P->outstanding */
    int orphan;
    uint64_t orphan_since_ns;
    char orphan_p_id[65], orphan_p_url[257], orphan_d_id[65], orphan_d_url[257];
};

/* ---- inbox -------------------------------------------------------------- */

typedef struct admin {
    atomic_int refs;
    char id[160];
    int done, found;
    char rid[DUET_RID_LEN + 1];
} admin_t;

typedef enum { M_SUBMIT, M_CANCEL, M_DONE, M_EVENT, M_ORPHAN, M_ADMIN } mkind_t;

typedef struct msg {
    struct msg *next;
    mkind_t kind;
    duet_rreq_t *r;
    int why;
    job_t *job;
    duet_envelope_t *ev;
    duet_orphan_t orphan;
    admin_t *admin;
} msg_t;

typedef struct {
    char key[129];
    char prefill[DUET_MSG_MAX_ID_LEN + 1];
    uint64_t at_ns;
} session_t;

struct duet_core {
    duet_core_opts_t o;
    char router_id[65], nonce[65], events_url[257];
    char event_url_wire[257]; /* Reserve/Prefill.event_url: where workers send this router's events */
    duet_ctl_puller_t *puller;
    pthread_t core_thread, event_thread;
    atomic_int stop_events;
    /* inbox */
    pthread_mutex_t in_mu;
    pthread_cond_t admin_cv;
    msg_t *in_head, *in_tail;
    int in_efd;
    /* state (core thread; readers hold state_mu) */
    pthread_mutex_t state_mu;
    worker_t *workers[MAX_WORKERS];
    int n_workers;
    crq_t *head;
    crq_t *hash[HASH_BUCKETS];
    crq_t *pend_head, *pend_tail;
    uint32_t n_pending, n_active;
    uint32_t n_state[Q_NSTATES];
    uint64_t rr_decode, rr_prefill;
    session_t sessions[SESSIONS];
    int shutting_down;
    uint64_t shutdown_deadline_ns;
    int closed;    /* the loop has ended: the inbox takes nothing more (in_mu) */
    int shut;      /* duet_core_shutdown ran */
    atomic_ullong last_turn_ns;
};

/* ------------------------------------------------------------------------ */

static void msg_discard(core_t *c, msg_t *m);

/* Hand a message to the core; once the core has stopped it is answered here. */
static void post(core_t *c, msg_t *m)
{
    pthread_mutex_lock(&c->in_mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->in_mu);
        msg_discard(c, m);
        return;
    }
    if (c->in_tail)
        c->in_tail->next = m;
    else
        c->in_head = m;
    c->in_tail = m;
    pthread_mutex_unlock(&c->in_mu);
    uint64_t one = 1;
    ssize_t n = write(c->in_efd, &one, sizeof one);
    (void)n;
}

static unsigned hash_rid(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % HASH_BUCKETS;
}

static crq_t *find_rid(core_t *c, const char *rid)
{
    for (crq_t *q = c->hash[hash_rid(rid)]; q; q = q->hnext)
        if (!strcmp(q->rid, rid))
            return q;
    return NULL;
}

static void set_state(core_t *c, crq_t *q, qstate_t st)
{
    c->n_state[q->st]--;
    q->st = st;
    c->n_state[st]++;
}

/* ---- Redis -------------------------------------------------------------- */

static void redis_req(core_t *c, crq_t *q, const char *f0, ...) __attribute__((sentinel));
static void redis_req(core_t *c, crq_t *q, const char *f0, ...)
{
    if (!c->o.store)
        return;
    char key[192];
    const char *argv[40];
    int argc = 0;
    argv[argc++] = "HSET";
    argv[argc++] = duet_store_key(c->o.store, key, sizeof key, "req:%s", q->rid);
    va_list ap;
    va_start(ap, f0);
    for (const char *a = f0; a && argc < 40; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    duet_store_sendv(c->o.store, argc, argv);
}

static void redis_req_end(core_t *c, crq_t *q, const char *state)
{
    if (!c->o.store)
        return;
    char key[192];
    duet_store_key(c->o.store, key, sizeof key, "req:%s", q->rid);
    duet_store_send(c->o.store, "HSET", key, "state", state, NULL);
    duet_store_send(c->o.store, "EXPIRE", key, "300", NULL);
    char ckey[192];
    duet_store_key(c->o.store, ckey, sizeof ckey, "counter:requests_%s", state);
    duet_store_send(c->o.store, "INCR", ckey, NULL);
}

static void redis_worker(core_t *c, worker_t *w)
{
    if (!c->o.store || !w->id[0])
        return;
    uint64_t now = duet_time_ns();
    if (now - w->last_redis_ns < 500000000ull)
        return;
    w->last_redis_ns = now;
    char key[192], pf[16], pu[16], pq[16], ql[16], ow[24], seen[24], ttl[16];
    duet_store_key(c->o.store, key, sizeof key, "worker:%s", w->id);
    snprintf(pf, sizeof pf, "%u", w->load.pages_free);
    snprintf(pu, sizeof pu, "%u", w->load.pages_used);
    snprintf(pq, sizeof pq, "%u", w->load.pages_quarantined);
    snprintf(ql, sizeof ql, "%u", w->load.queue_len);
    snprintf(ow, sizeof ow, "%llu", (unsigned long long)w->load.oldest_waiting_ms);
    snprintf(seen, sizeof seen, "%llu", (unsigned long long)(duet_wall_us() / 1000));
    snprintf(ttl, sizeof ttl, "%u", c->o.worker_timeout_ms);
    duet_store_send(c->o.store, "HSET", key, "role", w->role == ROLE_PREFILL ? "prefill" : "decode", "control_url",
                    w->url, "pages_free", pf, "pages_used", pu, "pages_quarantined", pq, "queue_len", ql,
                    "oldest_waiting_ms", ow, "last_seen_ms", seen, "router", c->router_id, NULL);
    duet_store_send(c->o.store, "PEXPIRE", key, ttl, NULL);
}

/* ---- workers ------------------------------------------------------------ */

static void *call_main(void *arg)
{
    worker_t *w = arg;
    core_t *c = w->c;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->stop && !w->uh && !w->nh)
            pthread_cond_wait(&w->cv, &w->mu);
        job_t *j = NULL;
        if (w->uh) {
            j = w->uh;
            w->uh = j->next;
            if (!w->uh)
                w->ut = NULL;
        } else if (w->nh) {
            j = w->nh;
            w->nh = j->next;
            if (!w->nh)
                w->nt = NULL;
        }
        int stop = w->stop && !j;
        pthread_mutex_unlock(&w->mu);
        if (stop)
            break;
        if (!j)
            continue;
        j->next = NULL;
        j->sent_ns = duet_time_ns();
        j->st = duet_ctl_client_call(w->client, j->req, j->deadline_ns, &j->reply, &j->err);
        if (j->st == DUET_OK && KIND(j->reply) == B(ERROR)) {
            duet_log_rid(DUET_LOG_DEBUG, duet_msg_rid(j->req), "%s on %s: %s %s", op_names[j->op], w->url,
                         duet_msg_enum_name(&duet__v1__error_code__descriptor, j->reply->error->code),
                         j->reply->error->message);
        } else if (j->st != DUET_OK) {
            duet_log_rid(DUET_LOG_WARN, duet_msg_rid(j->req), "%s on %s failed: %s", op_names[j->op], w->url,
                         duet_err_text(&j->err));
        }
        msg_t *m = calloc(1, sizeof *m);
        if (!m) {
            duet_error("out of memory: reply of %s lost", op_names[j->op]);
            continue;
        }
        m->kind = M_DONE;
        m->job = j;
        post(c, m);
    }
    return NULL;
}

static worker_t *worker_add(core_t *c, const char *url, const char *id, int role, int configured)
{
    if (c->n_workers >= MAX_WORKERS)
        return NULL;
    worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->c = c;
    w->role = role;
    w->configured = configured;
    w->page_tokens = 256;
    snprintf(w->id, sizeof w->id, "%s", id ? id : "");
    snprintf(w->url, sizeof w->url, "%s", url ? url : "");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (w->url[0]) {
        duet_ctl_opts_t co = {.url = w->url, .sender_id = c->router_id};
        duet_err_t err = {0};
        if (duet_ctl_client_create(&co, &w->client, &err) != DUET_OK) {
            duet_error("worker %s: %s", w->url, duet_err_text(&err));
            goto fail;
        }
        uint32_t n = c->o.calls_per_worker ? c->o.calls_per_worker : 64;
        w->threads = calloc(n, sizeof(pthread_t));
        if (!w->threads)
            goto fail;
        for (; w->n_threads < n; w->n_threads++)
            if (pthread_create(&w->threads[w->n_threads], NULL, call_main, w) != 0)
                break;
        if (!w->n_threads)
            goto fail;
    }
    c->workers[c->n_workers++] = w;
    return w;
fail:
    duet_ctl_client_destroy(&w->client);
    free(w->threads);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    return NULL;
}

static void worker_stop(worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void worker_free(worker_t *w)
{
    worker_stop(w);
    for (uint32_t i = 0; i < w->n_threads; i++)
        pthread_join(w->threads[i], NULL);
    for (int u = 0; u < 2; u++)
        for (job_t *j = u ? w->uh : w->nh, *n; j; j = n) {
            n = j->next;
            duet_envelope_free(&j->req);
            free(j);
        }
    duet_ctl_client_destroy(&w->client);
    free(w->threads);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

static worker_t *worker_by_id(core_t *c, const char *id)
{
    if (!id || !*id)
        return NULL;
    for (int i = 0; i < c->n_workers; i++)
        if (!c->workers[i]->gone && !strcmp(c->workers[i]->id, id))
            return c->workers[i];
    return NULL;
}

static worker_t *worker_by_url(core_t *c, const char *url)
{
    if (!url || !*url)
        return NULL;
    for (int i = 0; i < c->n_workers; i++)
        if (!c->workers[i]->gone && !strcmp(c->workers[i]->url, url))
            return c->workers[i];
    return NULL;
}

static int worker_usable(const worker_t *w, int role)
{
    return !w->gone && w->healthy && w->client && w->id[0] && w->role == role;
}

static const char *wname(const worker_t *w) { return w ? (w->id[0] ? w->id : w->url) : "-"; }

static void load_from_wire(worker_t *w, const Duet__V1__Load *l)
{
    if (!l)
        return;
    load_t *d = &w->load;
    d->queue_len = l->queue_len;
    d->tokens_in_flight = l->tokens_in_flight;
    d->pages_free = l->pages_free;
    d->pages_used = l->pages_used;
    d->pages_quarantined = l->pages_quarantined;
    d->slots_free = l->slots_free;
    d->slots_used = l->slots_used;
    d->slots_quarantined = l->slots_quarantined;
    d->oldest_waiting_ms = l->oldest_waiting_age_ms;
    snprintf(d->oldest_waiting_rid, sizeof d->oldest_waiting_rid, "%s", l->oldest_waiting_rid ? l->oldest_waiting_rid : "");
    memset(d->states, 0, sizeof d->states);
    for (size_t i = 0; i < l->n_requests; i++)
        if (l->requests[i]->state >= 0 && l->requests[i]->state < 9)
            d->states[l->requests[i]->state] = l->requests[i]->count;
    d->have_pc = l->prefix_cache != NULL;
    if (d->have_pc) {
        d->pc = *l->prefix_cache;
        d->pc.base.unknown_fields = NULL; /* a copy of the numbers only */
        d->pc.base.n_unknown_fields = 0;
    }
    w->pages_total = l->pages_free + l->pages_used + l->pages_quarantined;
    w->have_load = 1;
    w->pages_claimed = 0;
}

static void worker_seen(core_t *c, worker_t *w)
{
    w->last_seen_ns = duet_time_ns();
    if (!w->healthy && w->role && (w->client || !w->url[0])) {
        w->healthy = 1;
        if (w->client)
            duet_info("worker %s (%s, %s) is up", wname(w), w->role == ROLE_PREFILL ? "prefill" : "decode",
                  w->url[0] ? w->url : "no control URL yet");
    }
    redis_worker(c, w);
}

/* ---- sending commands ----------------------------------------------------- */

static void send_job_ex(core_t *c, worker_t *w, crq_t *q, op_t op, duet_envelope_t *req, int urgent, int attempt)
{
    if (!req)
        return;
    if (!w || !w->client) {
        duet_envelope_free(&req);
        return;
    }
    job_t *j = calloc(1, sizeof *j);
    if (!j) {
        duet_envelope_free(&req);
        return;
    }
    j->incarnation = w->incarnation;
    j->attempt = attempt;
    j->op = op;
    j->w = w;
    j->q = q;
    j->req = req;
    uint64_t d = duet_deadline_after_ms(c->o.call_ms);
    if (q && q->r && op != OP_ABORT_P && op != OP_ABORT_D && q->r->deadline_ns < d)
        d = q->r->deadline_ns;
    j->deadline_ns = d;
    if (q)
        q->calls++;
    pthread_mutex_lock(&w->mu);
    if (urgent) {
        if (w->ut)
            w->ut->next = j;
        else
            w->uh = j;
        w->ut = j;
    } else {
        if (w->nt)
            w->nt->next = j;
        else
            w->nh = j;
        w->nt = j;
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void send_job(core_t *c, worker_t *w, crq_t *q, op_t op, duet_envelope_t *req, int urgent)
{
    send_job_ex(c, w, q, op, req, urgent, 0);
}

static duet_msg_origin_t origin(core_t *c, crq_t *q, uint64_t epoch)
{
    return (duet_msg_origin_t){.sender_id = c->router_id, .rid = q ? q->rid : NULL, .epoch = epoch};
}

static void fill_sampling(Duet__V1__SamplingParams *sp, const duet_rreq_t *r)
{
    sp->temperature = r->temperature;
    sp->top_p = r->top_p >= 1.0f ? 0.0f : r->top_p;
    sp->top_k = r->top_k;
    sp->min_p = r->min_p;
    sp->seed = r->seed;
    sp->ignore_eos = r->ignore_eos;
    if (r->n_stop_ids)
        duet_msg_set_i32s(&sp->stop_token_ids, &sp->n_stop_token_ids, r->stop_ids, r->n_stop_ids);
}

static void send_abort(core_t *c, crq_t *q, worker_t *w, op_t op, int quiesced)
{
    duet_envelope_t *req = NULL;
    duet_msg_origin_t o = origin(c, q, q->epoch);
    int reason = q->abort_reason > 0 ? q->abort_reason : AR(ADMIN);
    const char *why = q->abort_reason < 0 ? "stop string matched" : NULL;
    if (duet_msg_new_abort(&o, (Duet__V1__AbortReason)reason, quiesced, why, &req) == DUET_OK)
        send_job(c, w, q, op, req, 1);
}

static void release_outstanding(crq_t *q)
{
    if (q->outstanding && q->P && q->P->outstanding)
        q->P->outstanding--;
    q->outstanding = 0;
}

static void bind_workers(core_t *c, crq_t *q, worker_t *P, worker_t *D)
{
    q->P = P;
    q->D = D;
    if (P)
        P->bound++;
    if (D)
        D->bound++;
    if (!q->active)
        c->n_active++;
    q->active = 1;
}

static void unbind_workers(core_t *c, crq_t *q)
{
    release_outstanding(q);
    if (q->D)
        q->D->bound--;
    if (q->P)
        q->P->bound--;
    q->D = q->P = NULL;
    if (q->active)
        c->n_active--;
    q->active = 0;
}

/* ---- the client side -------------------------------------------------------- */

static void fail(crq_t *q, int status, const char *code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void fail(crq_t *q, int status, const char *code, const char *fmt, ...)
{
    if (!q->r)
        return;
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    const char *type = status == 429 ? "rate_limit_error" : status == 504 ? "timeout_error"
                       : status == 503                    ? "service_unavailable_error"
                       : status < 500                     ? "invalid_request_error"
                                                          : "server_error";
    duet_rreq_set_failed(q->r, status, type, code, "%s", m);
}

/* ---- lifecycle ------------------------------------------------------------- */

static void close_request(core_t *c, crq_t *q);
static void advance_abort(core_t *c, crq_t *q);
static void begin_abort(core_t *c, crq_t *q, int reason);

static void pend_push(core_t *c, crq_t *q)
{
    q->pnext = NULL;
    if (c->pend_tail)
        c->pend_tail->pnext = q;
    else
        c->pend_head = q;
    c->pend_tail = q;
    q->pending = 1;
    c->n_pending++;
}

static void pend_remove(core_t *c, crq_t *q)
{
    crq_t **pp = &c->pend_head, *prev = NULL;
    while (*pp && *pp != q) {
        prev = *pp;
        pp = &(*pp)->pnext;
    }
    if (!*pp)
        return;
    *pp = q->pnext;
    if (c->pend_tail == q)
        c->pend_tail = prev;
    q->pending = 0;
    c->n_pending--;
}

static uint32_t pages_needed(const crq_t *q, const worker_t *d)
{
    uint32_t pt = d->page_tokens ? d->page_tokens : 256;
    uint64_t tokens = (uint64_t)q->r->n_prompt + q->r->max_tokens;
    return (uint32_t)((tokens + pt - 1) / pt);
}

/* The usable workers of a role, in registration order; returns how many. */
static int usable_workers(core_t *c, int role, worker_t **cand)
{
    int n = 0;
    for (int i = 0; i < c->n_workers; i++)
        if (worker_usable(c->workers[i], role))
            cand[n++] = c->workers[i];
    return n;
}

static worker_t *pick_decode(core_t *c, crq_t *q)
{
    const char *pol = c->o.decode_policy ? c->o.decode_policy : "free-pages";
    worker_t *cand[MAX_WORKERS];
    int n = usable_workers(c, ROLE_DECODE, cand);
    if (!n)
        return NULL;
    if (!strcmp(pol, "round-robin"))
        return cand[c->rr_decode++ % (uint64_t)n];
    worker_t *best = NULL;
    int64_t best_free = INT64_MIN;
    worker_t *fit[MAX_WORKERS];
    int nf = 0;
    for (int i = 0; i < n; i++) {
        int64_t f = cand[i]->have_load ? (int64_t)cand[i]->load.pages_free - cand[i]->pages_claimed : INT32_MAX;
        if (f > best_free) {
            best_free = f;
            best = cand[i];
        }
        if (f >= (int64_t)pages_needed(q, cand[i]))
            fit[nf++] = cand[i];
    }
    if (!strcmp(pol, "least-loaded") || !nf)
        return best;
    /* free-pages: round-robin among the workers that have room for it */
    return fit[c->rr_decode++ % (uint64_t)nf];
}

static session_t *session_slot(core_t *c, const char *key)
{
    return &c->sessions[hash_rid(key) % SESSIONS];
}

static worker_t *pick_prefill(core_t *c, crq_t *q)
{
    const char *pol = c->o.prefill_policy ? c->o.prefill_policy : "affinity";
    worker_t *cand[MAX_WORKERS];
    int n = usable_workers(c, ROLE_PREFILL, cand);
    if (!n)
        return NULL;
    if (!strcmp(pol, "round-robin"))
        return cand[c->rr_prefill++ % (uint64_t)n];
    if (!strcmp(pol, "affinity") && q->r->session[0]) {
        session_t *s = session_slot(c, q->r->session);
        const char *hint = !strcmp(s->key, q->r->session) ? s->prefill : q->r->session_hint;
        worker_t *w = worker_by_id(c, hint);
        if (w && worker_usable(w, ROLE_PREFILL))
            return w;
    }
    /* shortest queue: the worker's own report, or what this router has sent it and not heard back */
    uint32_t best = UINT32_MAX;
    int nb = 0;
    worker_t *ties[MAX_WORKERS];
    for (int i = 0; i < n; i++) {
        uint32_t ql = cand[i]->load.queue_len > cand[i]->outstanding ? cand[i]->load.queue_len : cand[i]->outstanding;
        if (ql < best) {
            best = ql;
            nb = 0;
        }
        if (ql == best)
            ties[nb++] = cand[i];
    }
    return ties[c->rr_prefill++ % (uint64_t)nb];
}

static int count_usable(core_t *c, int role)
{
    int n = 0;
    for (int i = 0; i < c->n_workers; i++)
        n += worker_usable(c->workers[i], role);
    return n;
}

static void start_request(core_t *c, crq_t *q)
{
    duet_rreq_t *r = q->r;
    worker_t *D = pick_decode(c, q), *P = pick_prefill(c, q);
    if (!D || !P) {
        fail(q, 503, "no_workers", "no healthy %s worker", !D ? "decode" : "prefill");
        close_request(c, q);
        return;
    }
    bind_workers(c, q, P, D);
    set_state(c, q, Q_RESERVING);
    if (q->attempts == 0)
        duet_metrics_observe(c->o.metrics, DUET_HIST_QUEUE, (duet_time_ns() - r->created_ns) / 1e9);
    q->attempts++;
    if (r->session[0]) {
        session_t *s = session_slot(c, r->session);
        snprintf(s->key, sizeof s->key, "%s", r->session);
        snprintf(s->prefill, sizeof s->prefill, "%s", P->id);
        s->at_ns = duet_time_ns();
        if (c->o.store) {
            char key[256], ttl[16];
            snprintf(ttl, sizeof ttl, "%u", c->o.session_ttl_s ? c->o.session_ttl_s : 3600);
            duet_store_send(c->o.store, "SET", duet_store_key(c->o.store, key, sizeof key, "session:%s", r->session),
                            P->id, "EX", ttl, NULL);
        }
    }
    redis_req(c, q, "state", "reserving", "prefill", P->id, "prefill_url", P->url, "decode", D->id, "decode_url",
              D->url, NULL);
    uint64_t left = duet_deadline_left_ms(r->deadline_ns);
    uint32_t wait = c->o.wait_ms;
    if (left < wait)
        wait = left ? (uint32_t)left : 1;
    duet_envelope_t *req = NULL;
    duet_msg_origin_t o = origin(c, q, 0);
    /* event_url: the workers send this request's events to this router, whichever router they default to */
    if (duet_msg_new_reserve(&o, r->n_prompt, r->max_tokens, wait, c->event_url_wire, &req) != DUET_OK) {
        fail(q, 500, "internal_error", "out of memory");
        close_request(c, q);
        return;
    }
    fill_sampling(req->reserve->sampling, r);
    duet_msg_set_str(&req->reserve->prefill_worker_id, P->id);
    q->reserve_inflight = 1;
    q->reserved = 1; /* from now on decode may hold it */
    send_job(c, D, q, OP_RESERVE, req, 0);
}

/* Give up the workers of this attempt and wait in the queue again. */
static void requeue(core_t *c, crq_t *q, uint32_t after_ms)
{
    unbind_workers(c, q);
    q->reserved = q->prefill_maybe = 0;
    q->epoch = 0;
    set_state(c, q, Q_PENDING);
    q->retry_at_ns = duet_deadline_after_ms(after_ms < 10 ? 10 : after_ms);
    pend_push(c, q);
}

/* Free a reservation that prefill never saw, without waiting for the answer. */
static void cleanup_decode(core_t *c, crq_t *q, worker_t *D, uint64_t epoch)
{
    duet_envelope_t *req = NULL;
    duet_msg_origin_t o = {.sender_id = c->router_id, .rid = q->rid, .epoch = epoch};
    if (duet_msg_new_abort(&o, AR(INTERNAL_ERROR), 1, "reservation not used", &req) == DUET_OK)
        send_job(c, D, NULL, OP_CLEANUP, req, 1);
}

static void on_reserve_done(core_t *c, crq_t *q, job_t *j)
{
    q->reserve_inflight = 0;
    duet_envelope_t *rep = j->reply;
    if (q->abort_reason) {
        if (j->st == DUET_OK && KIND(rep) == B(RESERVED))
            q->epoch = rep->header->epoch;
        else if (j->st == DUET_OK)
            q->reserved = 0; /* refused: nothing held */
        advance_abort(c, q);
        return;
    }
    if (j->st != DUET_OK) {
        /* no answer: decode may have reserved; prefill has not seen the descriptor */
        cleanup_decode(c, q, q->D, 0);
        if (q->attempts < 3 && duet_time_ns() < q->r->deadline_ns) {
            requeue(c, q, 20);
            return;
        }
        fail(q, 503, "decode_unavailable", "decode worker %s did not answer: %s", wname(q->D), duet_status_code(j->st));
        q->reserved = 0;
        close_request(c, q);
        return;
    }
    switch (KIND(rep)) {
    case B(RESERVED): {
        q->epoch = rep->header->epoch;
        Duet__V1__TransferDescriptor *td = rep->reserved->descriptor;
        if (td && td->page_tokens)
            q->D->page_tokens = td->page_tokens;
        if (td)
            q->D->pages_claimed += (uint32_t)td->n_page_ids + (uint32_t)(q->r->max_tokens / (q->D->page_tokens ? q->D->page_tokens : 256));
        duet_envelope_t *req = NULL;
        duet_msg_origin_t o = origin(c, q, q->epoch);
        uint64_t left = duet_deadline_left_ms(q->r->deadline_ns);
        if (!left || duet_msg_new_prefill(&o, q->r->prompt, q->r->n_prompt, td, (uint32_t)(left ? left : 1),
                                          c->event_url_wire, &req) != DUET_OK) {
            fail(q, left ? 500 : 504, left ? "internal_error" : "timeout", "request could not be sent to prefill");
            begin_abort(c, q, left ? AR(INTERNAL_ERROR) : AR(TIMEOUT));
            return;
        }
        fill_sampling(req->prefill->sampling, q->r);
        char ep[24];
        snprintf(ep, sizeof ep, "%llu", (unsigned long long)q->epoch);
        redis_req(c, q, "state", "prefilling", "epoch", ep, "prefill_sent", "1", NULL);
        set_state(c, q, Q_PREFILLING);
        q->prefill_inflight = 1;
        q->prefill_maybe = 1;
        q->P->outstanding++;
        q->outstanding = 1;
        send_job(c, q->P, q, OP_PREFILL, req, 0);
        return;
    }
    case B(REJECTED): {
        q->reserved = 0;
        const Duet__V1__Rejected *rj = rep->rejected;
        switch (rj->reason) {
        case DUET__V1__REJECT_REASON__REJECT_REASON_TOO_LONG:
            fail(q, 400, "context_length_exceeded", "the prompt (%u tokens) plus max_tokens (%u) is too long: %s",
                 q->r->n_prompt, q->r->max_tokens, rj->message);
            close_request(c, q);
            return;
        case DUET__V1__REJECT_REASON__REJECT_REASON_DUPLICATE_RID:
            fail(q, 500, "internal_error", "decode refused the request id: %s", rj->message);
            close_request(c, q);
            return;
        case DUET__V1__REJECT_REASON__REJECT_REASON_SHUTTING_DOWN:
            q->D->healthy = 0;
            /* fall through */
        default:
            if (q->D->pages_total && pages_needed(q, q->D) > q->D->pages_total && count_usable(c, ROLE_DECODE) <= 1) {
                fail(q, 400, "context_length_exceeded",
                     "the request needs %u cache pages; the decode worker has %u in all", pages_needed(q, q->D),
                     q->D->pages_total);
                close_request(c, q);
                return;
            }
            requeue(c, q, rj->retry_after_ms ? rj->retry_after_ms : 50);
            return;
        }
    }
    default: {
        q->reserved = 0;
        const char *m = KIND(rep) == B(ERROR) ? rep->error->message : duet_msg_kind_name(KIND(rep));
        fail(q, 502, "worker_error", "decode worker %s refused the request: %s", wname(q->D), m);
        close_request(c, q);
        return;
    }
    }
}

static void on_prefill_done(core_t *c, crq_t *q, job_t *j)
{
    q->prefill_inflight = 0;
    duet_envelope_t *rep = j->reply;
    int acked = j->st == DUET_OK && KIND(rep) == B(ACK);
    if (j->st == DUET_OK && !acked)
        q->prefill_maybe = 0; /* refused: prefill never took the descriptor */
    if (!acked)
        release_outstanding(q);
    if (q->abort_reason) {
        advance_abort(c, q);
        return;
    }
    if (acked) {
        if (q->st == Q_PREFILLING)
            set_state(c, q, Q_RUNNING);
        duet_rreq_set_accepted(q->r, q->P->id, q->D->id);
        redis_req(c, q, "state", "running", NULL);
        return;
    }
    if (j->st != DUET_OK) {
        fail(q, 502, "prefill_unavailable", "prefill worker %s did not answer: %s", wname(q->P), duet_status_code(j->st));
        begin_abort(c, q, AR(PEER_FAILURE));
        return;
    }
    if (KIND(rep) == B(REJECTED)) {
        const Duet__V1__Rejected *rj = rep->rejected;
        if (rj->reason == DUET__V1__REJECT_REASON__REJECT_REASON_TOO_LONG) {
            fail(q, 400, "context_length_exceeded", "prefill refused the prompt: %s", rj->message);
            begin_abort(c, q, AR(INTERNAL_ERROR));
            return;
        }
        if (rj->reason == DUET__V1__REJECT_REASON__REJECT_REASON_OVERLOADED ||
            rj->reason == DUET__V1__REJECT_REASON__REJECT_REASON_SHUTTING_DOWN) {
            if (rj->reason == DUET__V1__REJECT_REASON__REJECT_REASON_SHUTTING_DOWN)
                q->P->healthy = 0;
            cleanup_decode(c, q, q->D, q->epoch);
            requeue(c, q, rj->retry_after_ms ? rj->retry_after_ms : 50);
            return;
        }
        fail(q, 500, "internal_error", "prefill refused the request: %s", rj->message);
        begin_abort(c, q, AR(INTERNAL_ERROR));
        return;
    }
    int layout = KIND(rep) == B(ERROR) && rep->error->code == DUET__V1__ERROR_CODE__ERROR_CODE_LAYOUT_MISMATCH;
    fail(q, 502, layout ? "layout_mismatch" : "worker_error", "prefill worker %s refused the request: %s", wname(q->P),
         KIND(rep) == B(ERROR) ? rep->error->message : duet_msg_kind_name(KIND(rep)));
    begin_abort(c, q, layout ? AR(LAYOUT_MISMATCH) : AR(INTERNAL_ERROR));
}

/* ---- abort ----------------------------------------------------------------- */

static void begin_abort(core_t *c, crq_t *q, int reason)
{
    if (q->abort_reason)
        return;
    q->abort_reason = reason;
    q->abort_ns = duet_time_ns();
    duet_metrics_count_abort(c->o.metrics, reason < 0 ? ABORT_STOP_STRING : reason);
    if (q->pending) {
        pend_remove(c, q);
        close_request(c, q);
        return;
    }
    if (q->st == Q_PENDING) {
        close_request(c, q);
        return;
    }
    set_state(c, q, Q_ABORTING);
    if (q->r)
        duet_log_rid(DUET_LOG_INFO, q->rid, "aborting (%s)",
                     reason < 0 ? "stop string" : duet_msg_enum_name(&duet__v1__abort_reason__descriptor, reason));
    redis_req(c, q, "state", "aborting", NULL);
    advance_abort(c, q);
}

/* One step of the abort protocol; called whenever something it waits for happened. */
static void advance_abort(core_t *c, crq_t *q)
{
    /* prefill first, never overtaking a Prefill command in flight */
    if (q->prefill_maybe && q->abort_p == 0 && !q->prefill_inflight && q->P) {
        send_abort(c, q, q->P, OP_ABORT_P, 0);
        q->abort_p = 1;
    }
    if (!q->prefill_maybe && !q->prefill_inflight)
        q->quiesced = 1; /* prefill never had the descriptor */
    if (q->reserved && !q->reserve_inflight && q->D && !q->abort_d_inflight) {
        if (q->quiesced && !q->abort_d_q_sent) {
            send_abort(c, q, q->D, OP_ABORT_D, 1);
            q->abort_d_q_sent = q->abort_d_sent = q->abort_d_inflight = 1;
        } else if (!q->abort_d_sent) {
            /* At once, without waiting for prefill's answer: decode drops the request and its pages
             * wait in quarantine for prefill's AbortAck or TransferDone (or its endpoint's failure);
             * when prefill then says no transfer started, a second Abort with prefill_quiesced
             * releases them.  A request already decoding has its pages freed at once. */
            send_abort(c, q, q->D, OP_ABORT_D, 0);
            q->abort_d_sent = q->abort_d_inflight = 1;
        }
    }
    int p_settled = !q->prefill_inflight && (!q->prefill_maybe || q->abort_p == 2);
    int d_settled = !q->reserve_inflight && (!q->reserved || (q->abort_d_sent && !q->abort_d_inflight &&
                                                              (q->abort_d_q_sent || !q->quiesced)));
    if (p_settled && d_settled && q->calls == 0)
        close_request(c, q);
}

static void on_abort_done(core_t *c, crq_t *q, job_t *j)
{
    if (j->op == OP_ABORT_P) {
        q->abort_p = 2;
        if (j->st == DUET_OK && KIND(j->reply) == B(ABORT_ACK)) {
            const Duet__V1__AbortAck *a = j->reply->abort_ack;
            if (!(a->known && a->transfer_started))
                q->quiesced = 1;
        }
        /* no answer: prefill may still put; decode keeps the pages quarantined until prefill's
         * AbortAck or its endpoint failure */
    } else {
        q->abort_d_inflight = 0;
        if (q->r && j->st == DUET_OK)
            duet_log_rid(DUET_LOG_INFO, q->rid,
                         "Abort sent to decode %s %.1f ms after the abort began, answered after %.1f ms%s",
                         wname(q->D), (j->sent_ns - q->abort_ns) / 1e6, (duet_time_ns() - q->abort_ns) / 1e6,
                         j->req->abort->prefill_quiesced ? " (prefill quiesced)" : "");
    }
    advance_abort(c, q);
}

static void close_request(core_t *c, crq_t *q)
{
    if (q->pending)
        pend_remove(c, q);
    if (q->r) {
        /* the client side always gets an answer */
        pthread_mutex_lock(&q->r->mu);
        int open = q->r->fin == DUET_FIN_NONE;
        pthread_mutex_unlock(&q->r->mu);
        if (open)
            duet_rreq_set_finished(q->r, DUET_FIN_ABORT, q->abort_reason > 0 ? q->abort_reason : AR(ADMIN), q->r->n_prompt,
                                   q->n_tokens, 0);
        uint64_t now = duet_time_ns();
        duet_metrics_observe(c->o.metrics, DUET_HIST_E2E, (now - q->r->created_ns) / 1e9);
    }
    unbind_workers(c, q);
    redis_req_end(c, q, q->finished || q->abort_reason < 0 ? "finished" : q->abort_reason ? "aborted" : "failed");
    /* unlink */
    if (q->prev)
        q->prev->next = q->next;
    else
        c->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    crq_t **pp = &c->hash[hash_rid(q->rid)];
    while (*pp && *pp != q)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = q->hnext;
    c->n_state[q->st]--;
    duet_rreq_unref(q->r);
    free(q);
}

/* ---- events ------------------------------------------------------------------ */

/* The requests that depend on worker w fail now: decode's at any point, prefill's until
 * decode has the first token. */
static void fail_worker_requests(core_t *c, worker_t *w, const char *why)
{
    for (crq_t *q = c->head, *next; q; q = next) {
        next = q->next; /* begin_abort may close q */
        if (q->abort_reason || q->finished || !q->r)
            continue;
        if (q->D == w || (q->P == w && !q->first_seen && q->st >= Q_PREFILLING)) {
            fail(q, 502, "worker_failed", "%s worker %s %s", q->D == w ? "decode" : "prefill", wname(w), why);
            begin_abort(c, q, AR(PEER_FAILURE));
        }
    }
}

/* A heartbeat or state dump told the worker's incarnation: a new one under a known id
 * means the process restarted, and whatever the old one held is gone with it. */
static void worker_incarnation(core_t *c, worker_t *w, uint64_t inc)
{
    if (!inc || inc == w->incarnation)
        return;
    if (w->incarnation) {
        duet_warn("worker %s (%s) restarted: a new process answers under its id; its requests fail now", wname(w),
                  w->url[0] ? w->url : "no control URL");
        fail_worker_requests(c, w, "restarted");
        w->pages_claimed = 0;
    }
    w->incarnation = inc;
}

static void on_heartbeat(core_t *c, const duet_envelope_t *ev)
{
    const char *id = ev->header->sender_id;
    worker_t *w = worker_by_id(c, id);
    int role = ev->heartbeat->role;
    if (!w) {
        if (role != ROLE_PREFILL && role != ROLE_DECODE)
            return;
        /* heard from, not yet probed: known by id until a StateDump ties it to a URL */
        w = worker_add(c, NULL, id, role, 0);
        if (!w)
            return;
        duet_debug("worker %s (%s) heard from; its control URL is not known yet", id,
                   role == ROLE_PREFILL ? "prefill" : "decode");
    }
    if (!w->role)
        w->role = role;
    worker_incarnation(c, w, ev->heartbeat->incarnation);
    load_from_wire(w, ev->heartbeat->load);
    worker_seen(c, w);
}

static void on_register(core_t *c, const duet_envelope_t *ev)
{
    const Duet__V1__WorkerRegister *wr = ev->worker_register;
    worker_t *w = worker_by_id(c, wr->worker_id);
    if (!w)
        w = worker_by_url(c, wr->control_url);
    if (w && !w->url[0] && wr->control_url[0]) {
        w->gone = 1; /* an id-only entry: replaced by one that can be called */
        w = NULL;
    }
    if (!w)
        w = worker_add(c, wr->control_url, wr->worker_id, wr->role, 0);
    if (!w)
        return;
    snprintf(w->id, sizeof w->id, "%s", wr->worker_id);
    w->role = wr->role;
    if (wr->capacity) {
        if (wr->capacity->page_tokens)
            w->page_tokens = wr->capacity->page_tokens;
        w->pages_total = wr->capacity->pages;
    }
    duet_info("worker %s registered (%s, %s)", w->id, w->role == ROLE_PREFILL ? "prefill" : "decode", w->url);
    worker_seen(c, w);
}

static void on_token_chunk(core_t *c, crq_t *q, const duet_envelope_t *ev)
{
    const Duet__V1__TokenChunk *tc = ev->token_chunk;
    if (q->abort_reason || !q->r || (q->epoch && ev->header->epoch && ev->header->epoch != q->epoch))
        return;
    uint32_t skip = 0;
    if (tc->first_index < q->n_tokens)
        skip = q->n_tokens - tc->first_index; /* a repeat */
    else if (tc->first_index > q->n_tokens) {
        fail(q, 502, "worker_error", "decode skipped tokens (got index %u, expected %u)", tc->first_index, q->n_tokens);
        begin_abort(c, q, AR(INTERNAL_ERROR));
        return;
    }
    if (skip >= tc->n_tokens)
        return;
    uint32_t n = (uint32_t)tc->n_tokens - skip;
    uint64_t now = duet_time_ns();
    if (q->n_tokens == 0) {
        duet_metrics_observe(c->o.metrics, DUET_HIST_TTFT, (now - q->r->created_ns) / 1e9);
        q->first_seen = 1;
        release_outstanding(q);
        if (q->st == Q_PREFILLING)
            set_state(c, q, Q_RUNNING);
    } else {
        for (uint32_t i = 0; i < n; i++)
            duet_metrics_observe(c->o.metrics, DUET_HIST_ITL, (now - q->last_token_ns) / 1e9 / n);
    }
    q->last_token_ns = now;
    q->n_tokens += n;
    if (duet_rreq_add_tokens(q->r, tc->tokens + skip, n) != DUET_OK) {
        fail(q, 500, "internal_error", "out of memory");
        begin_abort(c, q, AR(INTERNAL_ERROR));
    }
}

static void on_finished(core_t *c, crq_t *q, const duet_envelope_t *ev)
{
    const Duet__V1__RequestFinished *f = ev->request_finished;
    if (q->epoch && ev->header->epoch && ev->header->epoch != q->epoch)
        return;
    if (q->abort_reason) {
        advance_abort(c, q);
        return;
    }
    switch (f->reason) {
    case DUET__V1__FINISH_REASON__FINISH_REASON_STOP:
    case DUET__V1__FINISH_REASON__FINISH_REASON_LENGTH:
        q->finished = 1;
        if (q->r)
            duet_rreq_set_finished(q->r, f->reason == DUET__V1__FINISH_REASON__FINISH_REASON_STOP ? DUET_FIN_STOP
                                                                                                : DUET_FIN_LENGTH,
                                   0, f->prompt_tokens, f->completion_tokens,
                                   f->cached_tokens > q->cached_tokens ? f->cached_tokens : q->cached_tokens);
        /* decode freed its pages; prefill finished its transfer (decode decoded it) */
        q->reserved = 0;
        q->prefill_maybe = 0;
        if (q->calls == 0)
            close_request(c, q); /* else when the last call ends (on_done) */
        return;
    case DUET__V1__FINISH_REASON__FINISH_REASON_ABORT: {
        /* decode gave up on its own (deadline, prefill's failure, shutdown): stop prefill and tell decode
         * whether a put can still land */
        int why = f->abort_reason ? f->abort_reason : AR(PEER_FAILURE);
        if (q->r && !q->n_tokens)
            fail(q, why == AR(WAIT_DEADLINE) ? 504 : 503, "worker_abort", "decode worker %s aborted the request (%s)",
                 wname(q->D), duet_msg_enum_name(&duet__v1__abort_reason__descriptor, why));
        else if (q->r)
            duet_rreq_set_finished(q->r, DUET_FIN_ABORT, why, f->prompt_tokens, f->completion_tokens, 0);
        q->abort_d_sent = 1;
        begin_abort(c, q, why);
        return;
    }
    default:
        fail(q, 502, "worker_error", "decode worker %s failed the request (%s)", wname(q->D),
             duet_msg_enum_name(&duet__v1__error_code__descriptor, f->error));
        q->reserved = 0; /* decode ended it and freed its pages */
        begin_abort(c, q, AR(INTERNAL_ERROR));
        return;
    }
}

static void on_event(core_t *c, duet_envelope_t *ev)
{
    switch (KIND(ev)) {
    case B(HEARTBEAT): on_heartbeat(c, ev); return;
    case B(WORKER_REGISTER): on_register(c, ev); return;
    default: break;
    }
    worker_t *w = worker_by_id(c, ev->header->sender_id);
    if (w)
        worker_seen(c, w);
    const char *rid = duet_msg_rid(ev);
    crq_t *q = rid ? find_rid(c, rid) : NULL;
    if (!q)
        return; /* not ours (any more): ended here, or another router's request on a worker we share */
    switch (KIND(ev)) {
    case B(TOKEN_CHUNK): on_token_chunk(c, q, ev); break;
    case B(REQUEST_FINISHED): on_finished(c, q, ev); break;
    case B(TRANSFER_DONE): /* the first token comes from decode too; this copy says what prefill had cached */
        if (ev->transfer_done->cached_tokens > q->cached_tokens)
            q->cached_tokens = ev->transfer_done->cached_tokens;
        break;
    case B(ERROR):
        if (q->abort_reason)
            break;
        fail(q, ev->error->code == DUET__V1__ERROR_CODE__ERROR_CODE_TIMEOUT ? 504 : 502, "worker_error",
             "worker %s: %s", ev->header->sender_id, ev->error->message);
        begin_abort(c, q, ev->error->code == DUET__V1__ERROR_CODE__ERROR_CODE_TIMEOUT ? AR(TIMEOUT) : AR(INTERNAL_ERROR));
        break;
    default: break;
    }
}

/* ---- probes ------------------------------------------------------------------ */

static void on_probe_done(core_t *c, job_t *j)
{
    worker_t *w = j->w;
    w->probing = 0;
    if (j->st != DUET_OK || KIND(j->reply) != B(STATE_DUMP))
        return;
    const char *id = j->reply->header->sender_id;
    int role = j->reply->state_dump->role;
    worker_t *other = worker_by_id(c, id);
    if (other && other != w) {
        if (!other->url[0]) {
            other->gone = 1; /* the id-only entry heard from heartbeats is this one */
        } else {
            duet_error("workers %s and %s both call themselves %s; ignoring %s", other->url, w->url, id, w->url);
            w->healthy = 0;
            return;
        }
    }
    if (!w->id[0] || strcmp(w->id, id)) {
        snprintf(w->id, sizeof w->id, "%s", id);
    }
    if (w->role && w->role != role)
        duet_warn("worker %s was configured as %s but is a %s worker", w->url,
                  w->role == ROLE_PREFILL ? "prefill" : "decode", role == ROLE_PREFILL ? "prefill" : "decode");
    w->role = role;
    worker_incarnation(c, w, j->reply->state_dump->incarnation);
    load_from_wire(w, j->reply->state_dump->load);
    worker_seen(c, w);
}

/* ---- orphans ------------------------------------------------------------------ */

static worker_t *resolve_worker(core_t *c, const char *id, const char *url, int role)
{
    worker_t *w = worker_by_url(c, url);
    if (!w) {
        w = worker_by_id(c, id);
        if (w && !w->client)
            w = NULL;
    }
    if (!w && url && *url) {
        w = worker_add(c, url, id, role, 0);
        if (w) {
            w->healthy = 0;
            duet_info("worker %s (%s) added from a request record in Redis", wname(w), url);
        }
    }
    return w;
}

static void try_orphan(core_t *c, crq_t *q)
{
    worker_t *P = q->orphan_p_id[0] || q->orphan_p_url[0] ? resolve_worker(c, q->orphan_p_id, q->orphan_p_url, ROLE_PREFILL) : NULL;
    worker_t *D = q->orphan_d_id[0] || q->orphan_d_url[0] ? resolve_worker(c, q->orphan_d_id, q->orphan_d_url, ROLE_DECODE) : NULL;
    int need_p = q->prefill_maybe && (q->orphan_p_id[0] || q->orphan_p_url[0]);
    int need_d = q->orphan_d_id[0] || q->orphan_d_url[0];
    if ((need_p && !P) || (need_d && !D)) {
        if (duet_time_ns() - q->orphan_since_ns > (uint64_t)ORPHAN_RESOLVE_MS * 1000000ull) {
            duet_warn("orphan %s: its workers are unknown; dropping it", q->rid);
            q->prefill_maybe = q->reserved = 0;
            begin_abort(c, q, AR(ROUTER_RESTART));
        }
        return;
    }
    q->P = P;
    q->D = D;
    if (P)
        P->bound++;
    if (D)
        D->bound++;
    q->prefill_maybe = need_p;
    q->reserved = need_d;
    q->orphan = 2;
    set_state(c, q, Q_RUNNING);
    begin_abort(c, q, AR(ROUTER_RESTART));
}

static crq_t *table_add(core_t *c, const char *rid, duet_rreq_t *r)
{
    crq_t *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    snprintf(q->rid, sizeof q->rid, "%s", rid);
    q->r = r;
    q->st = Q_PENDING;
    c->n_state[Q_PENDING]++;
    q->next = c->head;
    if (c->head)
        c->head->prev = q;
    c->head = q;
    unsigned h = hash_rid(rid);
    q->hnext = c->hash[h];
    c->hash[h] = q;
    return q;
}

static void on_orphan(core_t *c, const duet_orphan_t *o)
{
    if (find_rid(c, o->rid))
        return;
    crq_t *q = table_add(c, o->rid, NULL);
    if (!q)
        return;
    q->orphan = 1;
    q->orphan_since_ns = duet_time_ns();
    q->epoch = o->epoch;
    q->prefill_maybe = o->prefill_sent;
    snprintf(q->orphan_p_id, sizeof q->orphan_p_id, "%s", o->prefill_id);
    snprintf(q->orphan_p_url, sizeof q->orphan_p_url, "%s", o->prefill_url);
    snprintf(q->orphan_d_id, sizeof q->orphan_d_id, "%s", o->decode_id);
    snprintf(q->orphan_d_url, sizeof q->orphan_d_url, "%s", o->decode_url);
    try_orphan(c, q);
}

/* ---- inbox handlers --------------------------------------------------------------- */

static void on_submit(core_t *c, duet_rreq_t *r)
{
    if (c->shutting_down) {
        duet_rreq_set_failed(r, 503, "service_unavailable_error", "shutting_down", "the router is shutting down");
        duet_rreq_unref(r);
        return;
    }
    if (find_rid(c, r->rid)) {
        duet_rreq_set_failed(r, 500, "server_error", "internal_error", "duplicate request id");
        duet_rreq_unref(r);
        return;
    }
    if (!count_usable(c, ROLE_DECODE) || !count_usable(c, ROLE_PREFILL)) {
        duet_rreq_set_failed(r, 503, "service_unavailable_error", "no_workers",
                             "no healthy %s worker", !count_usable(c, ROLE_DECODE) ? "decode" : "prefill");
        duet_rreq_unref(r);
        return;
    }
    if (c->n_active >= c->o.max_inflight && c->n_pending >= c->o.queue_size) {
        duet_rreq_set_failed(r, 429, "rate_limit_error", "queue_full",
                             "the router's queue is full (%u requests in flight, %u waiting)", c->n_active,
                             c->n_pending);
        duet_rreq_unref(r);
        return;
    }
    crq_t *q = table_add(c, r->rid, r); /* the message's reference becomes the table's */
    if (!q) {
        duet_rreq_set_failed(r, 500, "server_error", "internal_error", "out of memory");
        duet_rreq_unref(r);
        return;
    }
    if (c->n_active < c->o.max_inflight && !c->n_pending)
        start_request(c, q);
    else
        pend_push(c, q);
}

static void on_cancel(core_t *c, duet_rreq_t *r, int why)
{
    crq_t *q = find_rid(c, r->rid);
    if (!q || q->r != r || q->abort_reason || q->finished)
        return;
    if (why == DUET_CANCEL_STOP_STRING) {
        begin_abort(c, q, -1);
    } else {
        duet_log_rid(DUET_LOG_INFO, q->rid, "client went away");
        begin_abort(c, q, AR(CLIENT_DISCONNECT));
    }
}

static void on_admin(core_t *c, admin_t *a)
{
    crq_t *q = find_rid(c, a->id);
    for (crq_t *x = c->head; x && !q; x = x->next) {
        if (!x->r)
            continue;
        const char *id = a->id;
        if (!strncmp(id, "chatcmpl-", 9))
            id += 9;
        else if (!strncmp(id, "cmpl-", 5))
            id += 5;
        if (!strcmp(x->rid, id) || (x->r->client_rid[0] && !strcmp(x->r->client_rid, a->id)))
            q = x;
    }
    if (q && !q->abort_reason && !q->finished) {
        a->found = 1;
        snprintf(a->rid, sizeof a->rid, "%.36s", q->rid);
        if (q->r)
            duet_rreq_set_finished(q->r, DUET_FIN_ABORT, AR(ADMIN), q->r->n_prompt, q->n_tokens, 0);
        begin_abort(c, q, AR(ADMIN));
    }
    pthread_mutex_lock(&c->in_mu);
    a->done = 1;
    pthread_cond_broadcast(&c->admin_cv);
    pthread_mutex_unlock(&c->in_mu);
    if (atomic_fetch_sub(&a->refs, 1) == 1)
        free(a);
}

static void on_done(core_t *c, job_t *j)
{
    crq_t *q = j->q;
    char rid[65] = "";
    if (q) {
        q->calls--;
        snprintf(rid, sizeof rid, "%s", q->rid); /* the handler may close (free) q */
    }
    switch (j->op) {
    case OP_RESERVE: on_reserve_done(c, q, j); break;
    case OP_PREFILL: on_prefill_done(c, q, j); break;
    case OP_ABORT_P:
    case OP_ABORT_D: on_abort_done(c, q, j); break;
    case OP_PROBE: on_probe_done(c, j); break;
    case OP_CLEANUP:
        /* the reservation must not outlive the router's interest in it: try again while the decode
         * worker is the same process and the call only timed out (a failed process frees it anyway) */
        if (j->st == DUET_ERR_TIMEOUT && j->attempt < CLEANUP_ATTEMPTS && j->w->healthy && !c->shutting_down &&
            j->incarnation == j->w->incarnation) {
            duet_log_rid(DUET_LOG_INFO, duet_msg_rid(j->req), "the cleanup Abort to %s timed out; sending it again",
                         wname(j->w));
            duet_envelope_t *again = j->req;
            j->req = NULL;
            send_job_ex(c, j->w, NULL, OP_CLEANUP, again, 1, j->attempt + 1);
        }
        break;
    }
    /* a request whose last call just ended may now close */
    if (q && find_rid(c, rid) == q && q->calls == 0 && (q->abort_reason || q->finished)) {
        if (q->finished && !q->abort_reason)
            close_request(c, q);
        else
            advance_abort(c, q);
    }
    duet_envelope_free(&j->req);
    duet_envelope_free(&j->reply);
    free(j);
}

/* ---- the loop ------------------------------------------------------------------------ */

static void tick(core_t *c)
{
    uint64_t now = duet_time_ns();
    /* workers: health and probes */
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = c->workers[i];
        if (w->gone)
            continue;
        uint64_t silent = now - w->last_seen_ns;
        if (w->healthy && silent > (uint64_t)c->o.worker_timeout_ms * 1000000ull) {
            w->healthy = 0;
            duet_warn("worker %s (%s) has been silent for %llu ms: not used until it is heard from again", wname(w),
                      w->url, (unsigned long long)(silent / 1000000ull));
            /* its requests that wait on it fail now rather than at their deadline */
            fail_worker_requests(c, w, "stopped answering");
        }
        if (w->client && !w->probing && !c->shutting_down &&
            (silent > (uint64_t)PROBE_MS * 1000000ull || !w->id[0]) &&
            now - w->last_probe_ns > (uint64_t)PROBE_MS * 1000000ull / 2) {
            duet_envelope_t *req = NULL;
            duet_msg_origin_t o = origin(c, NULL, 0);
            if (duet_msg_new_state_dump_request(&o, 0, &req) == DUET_OK) {
                w->probing = 1;
                w->last_probe_ns = now;
                send_job(c, w, NULL, OP_PROBE, req, 0);
            }
        }
    }
    /* requests: deadlines, the abort fallback, orphans waiting for their workers */
    for (crq_t *q = c->head, *next; q; q = next) {
        next = q->next;
        if (q->orphan == 1) {
            try_orphan(c, q);
            continue;
        }
        if (q->abort_reason) {
            if (!q->abort_d_sent)
                advance_abort(c, q);
            continue;
        }
        if (q->r && !q->finished && now > q->r->deadline_ns) {
            fail(q, 504, "timeout", "the request did not finish within its deadline");
            begin_abort(c, q, AR(TIMEOUT));
        }
    }
    /* the queue */
    for (crq_t *q = c->pend_head, *next; q && c->n_active < c->o.max_inflight; q = next) {
        next = q->pnext;
        if (q->retry_at_ns > now)
            continue;
        pend_remove(c, q);
        start_request(c, q);
    }
}

static void *core_main(void *arg)
{
    core_t *c = arg;
    for (;;) {
        struct pollfd pfd = {.fd = c->in_efd, .events = POLLIN};
        poll(&pfd, 1, 10);
        uint64_t v;
        ssize_t nr = read(c->in_efd, &v, sizeof v);
        (void)nr;
        pthread_mutex_lock(&c->in_mu);
        msg_t *m = c->in_head;
        c->in_head = c->in_tail = NULL;
        pthread_mutex_unlock(&c->in_mu);
        pthread_mutex_lock(&c->state_mu);
        while (m) {
            msg_t *next = m->next;
            switch (m->kind) {
            case M_SUBMIT: on_submit(c, m->r); break;
            case M_CANCEL:
                on_cancel(c, m->r, m->why);
                duet_rreq_unref(m->r);
                break;
            case M_DONE: on_done(c, m->job); break;
            case M_EVENT:
                on_event(c, m->ev);
                duet_envelope_free(&m->ev);
                break;
            case M_ORPHAN: on_orphan(c, &m->orphan); break;
            case M_ADMIN: on_admin(c, m->admin); break;
            }
            free(m);
            m = next;
        }
        tick(c);
        atomic_store(&c->last_turn_ns, duet_time_ns());
        int done = c->shutting_down && (!c->head || duet_time_ns() > c->shutdown_deadline_ns);
        pthread_mutex_unlock(&c->state_mu);
        if (done)
            break;
    }
    pthread_mutex_lock(&c->in_mu);
    c->closed = 1;
    msg_t *m = c->in_head;
    c->in_head = c->in_tail = NULL;
    pthread_mutex_unlock(&c->in_mu);
    while (m) {
        msg_t *next = m->next;
        msg_discard(c, m);
        m = next;
    }
    return NULL;
}

static void *event_main(void *arg)
{
    core_t *c = arg;
    while (!atomic_load(&c->stop_events)) {
        duet_envelope_t *ev = NULL;
        duet_err_t err = {0};
        duet_status_t st = duet_ctl_puller_recv(c->puller, duet_deadline_after_ms(100), &ev, &err);
        if (st == DUET_ERR_PEER)
            break;
        if (st != DUET_OK)
            continue;
        msg_t *m = calloc(1, sizeof *m);
        if (!m) {
            duet_envelope_free(&ev);
            continue;
        }
        m->kind = M_EVENT;
        m->ev = ev;
        post(c, m);
    }
    return NULL;
}

/* ---- public ---------------------------------------------------------------------------- */

duet_status_t duet_core_create(const duet_core_opts_t *o, duet_core_t **out, duet_err_t *err)
{
    if (!o->router_id || !o->events_url || !o->metrics)
        return duet_err_set(err, DUET_ERR_INVALID, "the core needs a router id, an events URL and metrics");
    core_t *c = calloc(1, sizeof *c);
    if (!c)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    c->o = *o;
    snprintf(c->router_id, sizeof c->router_id, "%s", o->router_id);
    snprintf(c->nonce, sizeof c->nonce, "%s", o->nonce ? o->nonce : "");
    snprintf(c->events_url, sizeof c->events_url, "%s", o->events_url);
    snprintf(c->event_url_wire, sizeof c->event_url_wire, "%s",
             o->events_advertise && *o->events_advertise ? o->events_advertise : o->events_url);
    c->o.events_advertise = c->event_url_wire;
    c->o.router_id = c->router_id;
    c->o.events_url = c->events_url;
    if (!c->o.max_inflight)
        c->o.max_inflight = 256;
    if (!c->o.worker_timeout_ms)
        c->o.worker_timeout_ms = 10000;
    if (!c->o.wait_ms)
        c->o.wait_ms = 30000;
    if (!c->o.call_ms)
        c->o.call_ms = 30000;
    pthread_mutex_init(&c->in_mu, NULL);
    pthread_mutex_init(&c->state_mu, NULL);
    pthread_cond_init(&c->admin_cv, NULL);
    c->in_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    duet_status_t st;
    if (c->in_efd < 0) {
        st = duet_err_set(err, DUET_ERR_IO, "eventfd failed");
        goto fail;
    }
    duet_ctl_opts_t po = {.url = c->events_url, .sender_id = c->router_id};
    if ((st = duet_ctl_puller_create(&po, &c->puller, err)) != DUET_OK)
        goto fail;
    for (size_t i = 0; i < o->n_prefill + o->n_decode; i++) {
        int pre = i < o->n_prefill;
        const char *url = pre ? o->prefill_urls[i] : o->decode_urls[i - o->n_prefill];
        if (worker_by_url(c, url))
            continue;
        if (!worker_add(c, url, NULL, pre ? ROLE_PREFILL : ROLE_DECODE, 1)) {
            st = duet_err_set(err, DUET_ERR_INVALID, "worker %s: cannot create its client", url);
            goto fail;
        }
    }
    if (pthread_create(&c->event_thread, NULL, event_main, c) != 0) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "cannot start the event thread");
        goto fail;
    }
    if (pthread_create(&c->core_thread, NULL, core_main, c) != 0) {
        atomic_store(&c->stop_events, 1);
        pthread_join(c->event_thread, NULL);
        st = duet_err_set(err, DUET_ERR_NOMEM, "cannot start the core thread");
        goto fail;
    }
    atomic_store(&c->last_turn_ns, duet_time_ns());
    *out = c;
    return DUET_OK;
fail:
    for (int i = 0; i < c->n_workers; i++)
        worker_free(c->workers[i]);
    duet_ctl_puller_destroy(&c->puller);
    if (c->in_efd >= 0)
        close(c->in_efd);
    pthread_mutex_destroy(&c->in_mu);
    pthread_mutex_destroy(&c->state_mu);
    pthread_cond_destroy(&c->admin_cv);
    free(c);
    return st;
}

/* Answer a message the core will never handle. */
static void msg_discard(core_t *c, msg_t *m)
{
    switch (m->kind) {
    case M_DONE:
        duet_envelope_free(&m->job->req);
        duet_envelope_free(&m->job->reply);
        free(m->job);
        break;
    case M_EVENT: duet_envelope_free(&m->ev); break;
    case M_SUBMIT:
        duet_rreq_set_failed(m->r, 503, "service_unavailable_error", "shutting_down", "the router is shutting down");
        duet_rreq_unref(m->r);
        break;
    case M_CANCEL: duet_rreq_unref(m->r); break;
    case M_ADMIN:
        pthread_mutex_lock(&c->in_mu);
        m->admin->done = 1;
        pthread_cond_broadcast(&c->admin_cv);
        pthread_mutex_unlock(&c->in_mu);
        if (atomic_fetch_sub(&m->admin->refs, 1) == 1)
            free(m->admin);
        break;
    case M_ORPHAN: break;
    }
    free(m);
}

void duet_core_shutdown(duet_core_t *c, uint32_t grace_ms)
{
    if (!c || c->shut)
        return;
    c->shut = 1;
    pthread_mutex_lock(&c->state_mu);
    c->shutting_down = 1;
    c->shutdown_deadline_ns = duet_deadline_after_ms(grace_ms);
    for (crq_t *q = c->head, *next; q; q = next) {
        next = q->next;
        if (q->abort_reason || q->finished)
            continue;
        fail(q, 503, "shutting_down", "the router is shutting down");
        begin_abort(c, q, AR(ROUTER_SHUTDOWN));
    }
    pthread_mutex_unlock(&c->state_mu);
    uint64_t one = 1;
    ssize_t n = write(c->in_efd, &one, sizeof one);
    (void)n;
    pthread_join(c->core_thread, NULL);
    atomic_store(&c->stop_events, 1);
    pthread_join(c->event_thread, NULL);
    for (int i = 0; i < c->n_workers; i++)
        worker_stop(c->workers[i]);
    for (int i = 0; i < c->n_workers; i++)
        for (uint32_t t = 0; t < c->workers[i]->n_threads; t++)
            pthread_join(c->workers[i]->threads[t], NULL);
    for (int i = 0; i < c->n_workers; i++)
        c->workers[i]->n_threads = 0;
    /* requests still open (their workers did not answer within the grace time) */
    pthread_mutex_lock(&c->state_mu);
    for (crq_t *q = c->head; q; q = q->next)
        if (q->r)
            duet_rreq_set_failed(q->r, 503, "service_unavailable_error", "shutting_down", "the router is shutting down");
    pthread_mutex_unlock(&c->state_mu);
}

void duet_core_destroy(duet_core_t **pc)
{
    core_t *c = pc ? *pc : NULL;
    if (!c)
        return;
    duet_core_shutdown(c, 0);
    duet_ctl_puller_destroy(&c->puller);
    for (int i = 0; i < c->n_workers; i++)
        worker_free(c->workers[i]);
    for (crq_t *q = c->head, *next; q; q = next) {
        next = q->next;
        duet_rreq_unref(q->r);
        free(q);
    }
    close(c->in_efd);
    pthread_mutex_destroy(&c->in_mu);
    pthread_mutex_destroy(&c->state_mu);
    pthread_cond_destroy(&c->admin_cv);
    free(c);
    *pc = NULL;
}

void duet_core_submit(duet_core_t *c, duet_rreq_t *r)
{
    msg_t *m = calloc(1, sizeof *m);
    if (!m) {
        duet_rreq_set_failed(r, 500, "server_error", "internal_error", "out of memory");
        return;
    }
    duet_rreq_ref(r);
    m->kind = M_SUBMIT;
    m->r = r;
    post(c, m);
}

void duet_core_cancel(duet_core_t *c, duet_rreq_t *r, duet_cancel_t why)
{
    pthread_mutex_lock(&r->mu);
    int already = r->cancelled;
    r->cancelled = 1;
    pthread_mutex_unlock(&r->mu);
    if (already)
        return;
    msg_t *m = calloc(1, sizeof *m);
    if (!m)
        return;
    duet_rreq_ref(r);
    m->kind = M_CANCEL;
    m->r = r;
    m->why = why;
    post(c, m);
}

int duet_core_admin_abort(duet_core_t *c, const char *id, char rid_out[DUET_RID_LEN + 1])
{
    admin_t *a = calloc(1, sizeof *a);
    msg_t *m = calloc(1, sizeof *m);
    if (!a || !m) {
        free(a);
        free(m);
        return 0;
    }
    atomic_init(&a->refs, 2);
    snprintf(a->id, sizeof a->id, "%s", id);
    m->kind = M_ADMIN;
    m->admin = a;
    post(c, m);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    pthread_mutex_lock(&c->in_mu);
    while (!a->done)
        if (pthread_cond_timedwait(&c->admin_cv, &c->in_mu, &ts) != 0)
            break;
    int found = a->done && a->found;
    if (found)
        snprintf(rid_out, DUET_RID_LEN + 1, "%.36s", a->rid);
    pthread_mutex_unlock(&c->in_mu);
    if (atomic_fetch_sub(&a->refs, 1) == 1)
        free(a);
    return found;
}

void duet_core_orphan(duet_core_t *c, const duet_orphan_t *o)
{
    msg_t *m = calloc(1, sizeof *m);
    if (!m)
        return;
    m->kind = M_ORPHAN;
    m->orphan = *o;
    post(c, m);
}

void duet_core_counts(duet_core_t *c, int *prefill, int *decode)
{
    pthread_mutex_lock(&c->state_mu);
    *prefill = count_usable(c, ROLE_PREFILL);
    *decode = count_usable(c, ROLE_DECODE);
    pthread_mutex_unlock(&c->state_mu);
}

uint64_t duet_core_last_turn_ns(duet_core_t *c) { return atomic_load(&c->last_turn_ns); }

static const char *state_label(int s)
{
    const char *n = duet_msg_enum_name(&duet__v1__request_state__descriptor, s);
    return !strncmp(n, "REQUEST_STATE_", 14) ? n + 14 : n;
}

json_t *duet_core_workers_json(duet_core_t *c)
{
    json_t *arr = json_array();
    uint64_t now = duet_time_ns();
    pthread_mutex_lock(&c->state_mu);
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = c->workers[i];
        if (w->gone)
            continue;
        json_t *o = json_object(), *st = json_object();
        json_object_set_new(o, "id", json_string(w->id));
        json_object_set_new(o, "url", json_string(w->url));
        json_object_set_new(o, "role", json_string(w->role == ROLE_PREFILL ? "prefill" : w->role == ROLE_DECODE ? "decode" : "unknown"));
        json_object_set_new(o, "healthy", json_boolean(w->healthy));
        json_object_set_new(o, "configured", json_boolean(w->configured));
        json_object_set_new(o, "last_seen_ms_ago",
                            w->last_seen_ns ? json_integer((json_int_t)((now - w->last_seen_ns) / 1000000ull)) : json_null());
        json_object_set_new(o, "router_requests", json_integer(w->bound));
        json_object_set_new(o, "page_tokens", json_integer(w->page_tokens));
        json_object_set_new(o, "pages_free", json_integer(w->load.pages_free));
        json_object_set_new(o, "pages_used", json_integer(w->load.pages_used));
        json_object_set_new(o, "pages_quarantined", json_integer(w->load.pages_quarantined));
        json_object_set_new(o, "slots_free", json_integer(w->load.slots_free));
        json_object_set_new(o, "queue_len", json_integer(w->load.queue_len));
        json_object_set_new(o, "tokens_in_flight", json_integer((json_int_t)w->load.tokens_in_flight));
        json_object_set_new(o, "oldest_waiting_ms", json_integer((json_int_t)w->load.oldest_waiting_ms));
        for (int s = 1; s < 9; s++)
            if (w->load.states[s])
                json_object_set_new(st, state_label(s), json_integer(w->load.states[s]));
        json_object_set_new(o, "requests_per_state", st);
        json_array_append_new(arr, o);
    }
    pthread_mutex_unlock(&c->state_mu);
    return arr;
}

void duet_core_render_metrics(duet_core_t *c, duet_text_t *t)
{
    pthread_mutex_lock(&c->state_mu);
    duet_text_printf(t, "# HELP duet_router_requests Requests the router holds, by its state.\n"
                        "# TYPE duet_router_requests gauge\n");
    for (int s = 0; s < Q_NSTATES; s++)
        duet_text_printf(t, "duet_router_requests{state=\"%s\"} %u\n", qstate_names[s], c->n_state[s]);
    int n[2][2] = {{0, 0}, {0, 0}};
    uint64_t oldest = 0;
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = c->workers[i];
        if (w->gone || !w->role)
            continue;
        n[w->role == ROLE_DECODE][w->healthy]++;
        if (w->role == ROLE_DECODE && w->healthy && w->load.oldest_waiting_ms > oldest)
            oldest = w->load.oldest_waiting_ms;
    }
    duet_text_printf(t, "# HELP duet_router_workers Workers the router knows, by role and health.\n"
                        "# TYPE duet_router_workers gauge\n"
                        "duet_router_workers{role=\"prefill\",healthy=\"true\"} %d\n"
                        "duet_router_workers{role=\"prefill\",healthy=\"false\"} %d\n"
                        "duet_router_workers{role=\"decode\",healthy=\"true\"} %d\n"
                        "duet_router_workers{role=\"decode\",healthy=\"false\"} %d\n",
                     n[0][1], n[0][0], n[1][1], n[1][0]);
    duet_text_printf(t, "# HELP duet_router_oldest_waiting_for_input_seconds Age of the oldest request in "
                        "WAITING_FOR_INPUT on any healthy decode worker (from heartbeats).\n"
                        "# TYPE duet_router_oldest_waiting_for_input_seconds gauge\n"
                        "duet_router_oldest_waiting_for_input_seconds %.3f\n",
                     oldest / 1e3);
    duet_text_printf(t, "# HELP duet_worker_pages Cache pages of each worker (from heartbeats).\n"
                        "# TYPE duet_worker_pages gauge\n");
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = c->workers[i];
        if (w->gone || !w->id[0] || !w->have_load)
            continue;
        const char *role = w->role == ROLE_PREFILL ? "prefill" : "decode";
        duet_text_printf(t, "duet_worker_pages{worker=\"%s\",role=\"%s\",kind=\"free\"} %u\n", w->id, role, w->load.pages_free);
        duet_text_printf(t, "duet_worker_pages{worker=\"%s\",role=\"%s\",kind=\"used\"} %u\n", w->id, role, w->load.pages_used);
        duet_text_printf(t, "duet_worker_pages{worker=\"%s\",role=\"%s\",kind=\"quarantined\"} %u\n", w->id, role,
                         w->load.pages_quarantined);
    }
    /* prefix cache of each prefill worker that has one (counters since the worker started) */
    static const struct {
        const char *name, *type, *help;
        size_t off;
        int u32;
    } pcm[] = {
#define PCM(n, t, h, f, u) {n, t, h, offsetof(Duet__V1__PrefixCacheStats, f), u}
        PCM("lookups_total", "counter", "Requests looked up in the prefix cache.", lookups, 0),
        PCM("hits_total", "counter", "Requests that continued from a cached prefix.", hits, 0),
        PCM("misses_total", "counter", "Requests with no usable cached prefix.", misses, 0),
        PCM("device_hits_total", "counter", "Hits served from the device tier alone.", device_hits, 0),
        PCM("host_hits_total", "counter", "Hits that loaded pages from the host tier.", host_hits, 0),
        PCM("hit_tokens_total", "counter", "Prompt tokens not computed thanks to prefix hits.", hit_tokens, 0),
        PCM("loaded_pages_total", "counter", "Pages loaded from the host tier.", loaded_pages, 0),
        PCM("backed_up_pages_total", "counter", "Pages written to the host tier.", backed_up_pages, 0),
        PCM("evicted_device_pages_total", "counter", "Pages evicted from the device tier.", evicted_device_pages, 0),
        PCM("evicted_host_pages_total", "counter", "Pages evicted from the host tier.", evicted_host_pages, 0),
        PCM("device_pages", "gauge", "Pages of the worker's pool held by the prefix cache.", device_pages, 1),
        PCM("host_pages", "gauge", "Host-tier pages in use.", host_pages_used, 1),
#undef PCM
    };
    for (size_t m = 0; m < sizeof pcm / sizeof pcm[0]; m++) {
        int any = 0;
        for (int i = 0; i < c->n_workers; i++) {
            worker_t *w = c->workers[i];
            if (w->gone || !w->id[0] || !w->have_load || !w->load.have_pc)
                continue;
            if (!any++)
                duet_text_printf(t, "# HELP duet_worker_prefix_cache_%s %s\n# TYPE duet_worker_prefix_cache_%s %s\n",
                                 pcm[m].name, pcm[m].help, pcm[m].name, pcm[m].type);
            const char *base = (const char *)&w->load.pc;
            unsigned long long v = pcm[m].u32 ? *(const uint32_t *)(base + pcm[m].off)
                                              : (unsigned long long)*(const uint64_t *)(base + pcm[m].off);
            duet_text_printf(t, "duet_worker_prefix_cache_%s{worker=\"%s\"} %llu\n", pcm[m].name, w->id, v);
        }
    }
    duet_text_printf(t, "# HELP duet_worker_requests Requests on each worker by state (from heartbeats).\n"
                        "# TYPE duet_worker_requests gauge\n");
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = c->workers[i];
        if (w->gone || !w->id[0] || !w->have_load)
            continue;
        for (int s = 1; s < 9; s++)
            if (w->load.states[s])
                duet_text_printf(t, "duet_worker_requests{worker=\"%s\",state=\"%s\"} %u\n", w->id, state_label(s),
                                 w->load.states[s]);
    }
    duet_text_printf(t, "# HELP duet_worker_oldest_waiting_for_input_seconds Oldest WAITING_FOR_INPUT request per "
                        "decode worker.\n# TYPE duet_worker_oldest_waiting_for_input_seconds gauge\n");
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = c->workers[i];
        if (!w->gone && w->id[0] && w->role == ROLE_DECODE)
            duet_text_printf(t, "duet_worker_oldest_waiting_for_input_seconds{worker=\"%s\"} %.3f\n", w->id,
                             w->load.oldest_waiting_ms / 1e3);
    }
    duet_text_printf(t, "# HELP duet_worker_queue_length Requests queued on each worker.\n"
                        "# TYPE duet_worker_queue_length gauge\n");
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = c->workers[i];
        if (!w->gone && w->id[0] && w->have_load)
            duet_text_printf(t, "duet_worker_queue_length{worker=\"%s\"} %u\n", w->id, w->load.queue_len);
    }
    pthread_mutex_unlock(&c->state_mu);
}
