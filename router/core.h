/* The router core: the one thread that owns the worker table, the request
 * table and every conversation with the workers (DESIGN §2, §3).
 *
 * Other threads never touch that state; they hand the core messages through
 * its inbox (a mutex-guarded list and an eventfd): a new request, a cancel,
 * an admin abort, an orphan found in Redis.  Commands to a worker (Reserve,
 * Prefill, Abort, StateDump) run on that worker's call threads, so a slow
 * worker never stalls the core or the other workers; their replies come back
 * through the inbox.  Events (heartbeats, TransferDone, TokenChunk,
 * RequestFinished, errors) arrive on the router's pull socket, read by an
 * event thread that also feeds the inbox.
 *
 * A request: queued → Reserve on a decode worker (free pages, health) →
 * Prefill on a prefill worker (session affinity, then shortest queue) with
 * decode's descriptor → tokens stream in from decode → finished.  Every wait
 * has a deadline (the request's own, and each command's).
 *
 * Abort (client gone, timeout, admin, shutdown, a worker's failure): Abort to
 * prefill first; decode gets its Abort when prefill answers (or its call
 * fails), with prefill_quiesced set only when no put can still land (prefill
 * never got the descriptor, or says no transfer started).  A request that is
 * already decoding is aborted on decode at once as well: decode frees its
 * pages immediately, whatever prefill does.  A Prefill command still in flight
 * is never overtaken by its Abort.  Each Abort is sent on the worker's urgent
 * queue, ahead of its other commands; a prefill worker in the middle of a long
 * step answers when the step ends. 
 *
 * Workers are configured by URL (their ids are learned from a StateDump) or
 * announce themselves with WorkerRegister; heartbeats keep them healthy.
 * Redis (store.h), when configured, gets worker records, request records and
 * session affinity. */
#ifndef DUET_ROUTER_CORE_H
#define DUET_ROUTER_CORE_H

#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "metrics.h"
#include "request.h"
#include "store.h"

typedef struct {
    const char *router_id;          /* sender id on the wire; required */
    const char *nonce;              /* this run (Redis owner field) */
    const char *events_url;         /* the router's pull socket; required */
    const char *events_advertise;   /* the URL workers dial to reach it, sent as Reserve/Prefill.event_url
                                     * (NULL: events_url) */
    const char *const *prefill_urls;
    size_t n_prefill;
    const char *const *decode_urls;
    size_t n_decode;
    uint32_t calls_per_worker;      /* concurrent commands per worker (64) */
    uint32_t max_inflight;          /* requests holding workers at once (256) */
    uint32_t queue_size;            /* requests waiting beyond that; more get 429 (0: none wait) */
    uint32_t worker_timeout_ms;     /* silent this long: unhealthy, its requests fail (10000; a
                                     * prefill worker is silent during a long step) */
    uint32_t wait_ms;               /* decode's WAITING_FOR_INPUT deadline (30000) */
    uint32_t call_ms;               /* one command's deadline, queueing included (30000) */
    const char *decode_policy;      /* "free-pages" (default), "least-loaded", "round-robin" */
    const char *prefill_policy;     /* "affinity" (default), "shortest-queue", "round-robin" */
    uint32_t session_ttl_s;         /* Redis session affinity TTL (3600) */
    uint32_t record_ttl_s;          /* Redis request record TTL after the deadline (600) */
    duet_metrics_t *metrics;        /* required */
    duet_store_t *store;            /* NULL: no Redis */
} duet_core_opts_t;

typedef struct duet_core duet_core_t;

/* Start the core, its event thread and the configured workers' call threads.
 * DUET_ERR_BUSY when the events URL is taken, DUET_ERR_INVALID for a bad
 * option or URL. */
duet_status_t duet_core_create(const duet_core_opts_t *o, duet_core_t **out, duet_err_t *err);
/* Abort every request in flight (ROUTER_SHUTDOWN, prefill then decode),
 * wait for the workers' answers up to `grace_ms`, and stop every thread of
 * the core.  Clients get 503.  The core then refuses new requests (503) and
 * ignores cancels, so connection threads may still call it until destroy. */
void duet_core_shutdown(duet_core_t *c, uint32_t grace_ms);
/* Shut down (if not done) and free; NULL is fine. */
void duet_core_destroy(duet_core_t **c);

/* Hand a request to the core (it takes a reference).  Progress and the end
 * come back through the request (request.h). */
void duet_core_submit(duet_core_t *c, duet_rreq_t *r);
/* The connection side no longer wants the request. */
void duet_core_cancel(duet_core_t *c, duet_rreq_t *r, duet_cancel_t why);
/* Admin abort of a request by its rid, its x-request-id or its response id
 * ("chatcmpl-RID").  Returns 1 and writes the rid when found, 0 otherwise. */
int duet_core_admin_abort(duet_core_t *c, const char *id, char rid_out[DUET_RID_LEN + 1]);
/* Abort an orphan found in Redis (called from the store thread). */
void duet_core_orphan(duet_core_t *c, const duet_orphan_t *o);

/* Healthy workers per role (for /ready). */
void duet_core_counts(duet_core_t *c, int *prefill, int *decode);
/* The worker table as JSON (GET /v1/workers).  New reference. */
json_t *duet_core_workers_json(duet_core_t *c);
/* Gauges: requests per state, workers, worker load, oldest WAITING_FOR_INPUT. */
void duet_core_render_metrics(duet_core_t *c, duet_text_t *t);
/* Monotonic time of the core loop's last turn (for the watchdog). */
uint64_t duet_core_last_turn_ns(duet_core_t *c);

#endif
