/* What duet-prefill and duet-decode share around their loops: the data-plane
 * engine with the cache registered, the polled command server, the event
 * pusher to the router, and the heartbeat clock. */
#ifndef DUET_WORKER_NET_H
#define DUET_WORKER_NET_H

#include <stdint.h>

#include "ctl.h"
#include "kv_cache.h"
#include "worker_opts.h"
#include "xfer.h"

typedef struct {
    duet_xfer_t *xfer;
    duet_ctl_server_t *srv;
    duet_ctl_pusher_t *push;   /* NULL without --events */
    uint64_t last_heartbeat_ns;
    uint64_t events_dropped;
    uint64_t last_watchdog_ns;
} duet_worker_net_t;

/* Create the engine (data path from --xfer-path, checksums from
 * --verify-checksums), register every pool of `cache`, listen on --listen
 * with `handler`, and dial --events when given.  On error everything made
 * so far is closed. */
duet_status_t duet_worker_net_open(duet_worker_net_t *n, const duet_worker_opts_t *o, const duet_kv_cache_t *cache,
                                   duet_ctl_handler_fn handler, void *arg, duet_err_t *err);
/* Queue an event for the router (never waits more than 50 ms; a drop is
 * counted and logged) and free it.  NULL is fine. */
void duet_worker_net_push(duet_worker_net_t *n, duet_envelope_t *ev);
/* 1 once per heartbeat interval (and never without a pusher). */
int duet_worker_net_heartbeat_due(duet_worker_net_t *n, const duet_worker_opts_t *o);
/* systemd: READY=1 once serving (with a status line), WATCHDOG=1 from the
 * loop (rate-limited to a quarter of the watchdog interval; a no-op when no
 * watchdog is set), STOPPING=1 on shutdown.  No-ops outside systemd. */
void duet_worker_notify_ready(const duet_worker_opts_t *o);
void duet_worker_notify_watchdog(duet_worker_net_t *n);
void duet_worker_notify_stopping(void);

/* The start every worker shares: logging ident, options (exit code 2 and
 * usage on a usage error: *exit_code set, DUET_ERR_INVALID returned),
 * SIGINT/SIGTERM setting *stop_flag, SIGPIPE ignored, the model loaded and
 * the cache pools created. */
struct duet_model;
duet_status_t duet_worker_start(const char *role, int argc, char **argv, duet_worker_opts_t *o,
                                volatile int *stop_flag, struct duet_model **model, duet_kv_cache_t **cache,
                                int *exit_code, duet_err_t *err);

/* Close the server and pusher, then the engine (pending transfers end). */
void duet_worker_net_close(duet_worker_net_t *n);

#endif
