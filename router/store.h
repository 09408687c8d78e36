/* The router's Redis bookkeeping (DESIGN §10), on a thread of its own.
 *
 * One hiredis connection, owned by the store thread; nobody else touches it.
 * Other threads hand it commands: fire-and-forget writes (duet_store_send*)
 * or calls that wait for the reply with a deadline (duet_store_call*).
 * Every Redis command has a timeout, so a hung Redis never hangs the router.
 *
 * Keys, under a configurable prefix (default "duet:"):
 *   router:{nonce}      this router's liveness (its id), short TTL, refreshed
 *   worker:{id}         a worker's record (hash), written from its heartbeats, short TTL
 *   req:{rid}           a request: state, owner nonce and id, workers, epoch, deadline (hash), TTL
 *   session:{id}        session affinity: the prefill worker of the conversation, TTL
 *   claim:{rid}         an orphan being aborted by one router (SET NX), TTL
 *   counter:{name}      counters (INCR)
 *
 * Redis down: duet_store_up() is 0, writes are dropped (and counted), calls
 * fail at once; the thread reconnects with backoff (100 ms doubling to 2 s)
 * and the store is up again as soon as a connection works.  Once connected,
 * and every sweep interval after, the thread looks for orphans: request
 * records that are not finished and whose owner is this router's earlier
 * incarnation (same router id, another nonce) or a router whose liveness key
 * is gone.  It claims each (claim:{rid}, SET NX) and hands it to the
 * orphan callback, which aborts it on the workers. */
#ifndef DUET_ROUTER_STORE_H
#define DUET_ROUTER_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "metrics.h"

/* An orphaned request, as its record in Redis describes it. */
typedef struct {
    char rid[65];
    char owner[65];      /* owner nonce */
    char prefill_id[65], prefill_url[257];
    char decode_id[65], decode_url[257];
    uint64_t epoch;      /* 0: not known (Reserve may not have been answered) */
    int prefill_sent;    /* the Prefill command may have reached prefill */
} duet_orphan_t;

typedef void (*duet_store_orphan_fn)(void *arg, const duet_orphan_t *o);

typedef struct {
    const char *host;            /* "127.0.0.1" */
    int port;
    const char *prefix;          /* key prefix ("duet:") */
    const char *router_id;       /* stable id of this router (--id) */
    const char *nonce;           /* this run's nonce */
    uint32_t router_ttl_ms;      /* router:{nonce} TTL (5000) */
    uint32_t sweep_ms;           /* orphan sweep interval (5000) */
    uint32_t command_timeout_ms; /* one Redis command (1000) */
    duet_metrics_t *metrics;     /* may be NULL */
    duet_store_orphan_fn on_orphan;
    void *arg;
} duet_store_opts_t;

typedef struct duet_store duet_store_t;

/* Start the store thread (it connects in the background).  *out on success. */
duet_status_t duet_store_create(const duet_store_opts_t *o, duet_store_t **out, duet_err_t *err);
/* Stop the thread after running what is queued (at most 1 s), delete this
 * router's liveness key, free; *s = NULL.  NULL is fine. */
void duet_store_destroy(duet_store_t **s);

/* 1 while connected.  NULL store: 0. */
int duet_store_up(const duet_store_t *s);
const char *duet_store_prefix(const duet_store_t *s);

/* Queue one command (argv copied): the prefix is NOT added; build keys with
 * duet_store_key().  Dropped (and counted) while Redis is down. */
void duet_store_sendv(duet_store_t *s, int argc, const char *const *argv);
/* The same with a NULL-terminated list of arguments. */
void duet_store_send(duet_store_t *s, const char *arg0, ...) __attribute__((sentinel));

/* The reply of a call. */
typedef struct {
    int type;          /* 0 nil, 1 string/status, 2 integer, 3 error */
    long long integer;
    char str[512];
} duet_store_reply_t;

/* Run one command and wait for its reply until `timeout_ms`.  DUET_OK with
 * *reply (may be NULL); DUET_ERR_PEER while Redis is down or when the
 * connection failed, DUET_ERR_TIMEOUT when no reply came in time. */
duet_status_t duet_store_callv(duet_store_t *s, int argc, const char *const *argv, uint32_t timeout_ms,
                               duet_store_reply_t *reply);
duet_status_t duet_store_call(duet_store_t *s, uint32_t timeout_ms, duet_store_reply_t *reply, const char *arg0, ...)
    __attribute__((sentinel));

/* prefix + formatted name into buf. */
const char *duet_store_key(const duet_store_t *s, char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
