/* What duet-prefill and duet-decode share around their loops: the data-plane
 * engine with the cache registered, the polled command server, the event
 * pushers to the routers, and the heartbeat clock.
 *
 * Event sockets ("sinks"): several routers can share one set of workers.
 * Each Reserve and Prefill may name the pull socket of the router that owns
 * the request (event_url); every event about that request goes there, and
 * events of requests that name none go to --events.  The worker keeps a
 * bounded table of pushers keyed by URL: entry 0 is --events (permanent; no
 * pusher without the flag), the others are created on first use, held by a
 * reference count while a live request points at them, and closed once
 * unreferenced and unused for --event-idle-ms.  When the table is full the
 * least recently used unreferenced entry is closed; when every entry serves
 * live requests a new URL is refused (DUET_ERR_BUSY).  Heartbeats go to
 * every pusher in the table, so each router that has used the worker hears
 * its load; a new pusher gets one at the next heartbeat check.
 *
 * Sending never waits longer than 50 ms (the pusher's own queue); closing a
 * pusher runs on a thread of its own, so the loop does not wait for it.
 * Everything else runs on the worker's loop thread. */
#ifndef DUET_WORKER_NET_H
#define DUET_WORKER_NET_H

#include <stdint.h>

#include "ctl.h"
#include "kv_cache.h"
#include "worker_engine.h"
#include "worker_opts.h"
#include "xfer.h"

#define DUET_WORKER_MAX_SINKS 16  /* --events and up to 15 routers' event sockets */
#define DUET_WORKER_SINK_EVENTS 0 /* the --events entry: requests without an event_url */
#define DUET_WORKER_URL_MAX 256   /* duet_msg_limits_t.max_url_bytes */

typedef struct {
    char url[DUET_WORKER_URL_MAX + 1]; /* "": unused */
    duet_ctl_pusher_t *push;           /* NULL: unused (or --events not given) */
    uint32_t refs;                     /* live requests whose events go here */
    uint64_t last_used_ns;             /* created, acquired, released, or a request event sent */
    uint64_t refused;                  /* sends refused since the last that went through */
    int greet;                         /* new: send it a heartbeat at the next check */
} duet_worker_sink_t;

typedef struct {
    duet_xfer_t *xfer;
    duet_ctl_server_t *srv;
    duet_worker_sink_t sinks[DUET_WORKER_MAX_SINKS]; /* [DUET_WORKER_SINK_EVENTS]: --events */
    uint32_t idle_ms;
    uint64_t last_heartbeat_ns;
    uint64_t events_dropped;
    uint64_t last_watchdog_ns;
} duet_worker_net_t;

/* Create the data-plane engine (data path from --xfer-path, checksums from
 * --verify-checksums), register the pools of `eng`'s cache (its device pools
 * or its host pools: duet_worker_engine_xfer_register), listen on --listen
 * with `handler`, and dial --events when given.  On error everything made
 * so far is closed. */
duet_status_t duet_worker_net_open(duet_worker_net_t *n, const duet_worker_opts_t *o, duet_worker_engine_t *eng,
                                   duet_ctl_handler_fn handler, void *arg, duet_err_t *err);
/* Only the event table (no engine, no server): for tests of the table. */
duet_status_t duet_worker_net_open_events(duet_worker_net_t *n, const char *events_url, uint32_t idle_ms,
                                          duet_err_t *err);

/* The sink for a request's event_url, held until released: NULL, "" or
 * --events itself give DUET_WORKER_SINK_EVENTS.  Errors: DUET_ERR_INVALID
 * (not a URL a worker can dial: duet_msg_check_event_url, or NNG refused
 * it), DUET_ERR_BUSY (every entry serves live requests), DUET_ERR_NOMEM.
 * `field` names the message field in the sentence ("reserve.event_url"). */
duet_status_t duet_worker_net_sink_acquire(duet_worker_net_t *n, const char *url, const char *field, int *sink,
                                           duet_err_t *err);
/* Drop a request's hold on its sink (DUET_WORKER_SINK_EVENTS and < 0 are no-ops). */
void duet_worker_net_sink_release(duet_worker_net_t *n, int sink);

/* Queue an event about a request for its sink's router (never waits more
 * than 50 ms; a drop is counted and logged) and free it.  NULL is fine; a
 * sink out of range or unused means --events. */
void duet_worker_net_push_to(duet_worker_net_t *n, int sink, duet_envelope_t *ev);
/* Wait until `deadline_ns` for the events queued so far, on every sink, to
 * reach their routers: the number of sinks that still hold some (each
 * logged), 0 when all went out. */
int duet_worker_net_flush(duet_worker_net_t *n, uint64_t deadline_ns);
/* The servers' end when their GPUs are lost (duet_worker_engine_gpu_lost), once every request
 * they hold has its error queued: log why (`why`, the step's error), give the queued events up to
 * DUET_WORKER_EXIT_FLUSH_MS to reach the routers (an event still queued would die with the
 * process, and its request wait for the router's deadline), and end the process (_exit: nothing
 * torn down, no page given back, nothing that waits on the device; its supervisor restarts it, and
 * to the routers and the other workers it is a worker gone).  Does not return. */
#define DUET_WORKER_EXIT_FLUSH_MS 2000
void duet_worker_exit_gpu_lost(duet_worker_net_t *n, const duet_err_t *why) __attribute__((noreturn));
/* The same for --events. */
void duet_worker_net_push(duet_worker_net_t *n, duet_envelope_t *ev);
/* Queue a copy of an event (Heartbeat) for every pusher in the table and
 * free it: --events waits up to 50 ms for room, the others not at all. */
void duet_worker_net_broadcast(duet_worker_net_t *n, duet_envelope_t *ev);
/* 1 once per heartbeat interval, and at the next call after a pusher was
 * created (never without a pusher).  Closes idle sinks on the way. */
int duet_worker_net_heartbeat_due(duet_worker_net_t *n, const duet_worker_opts_t *o);
/* Pushers in the table now (tests, logs). */
int duet_worker_net_sink_count(const duet_worker_net_t *n);
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

/* Close the server and the pushers, then the engine (pending transfers
 * end); waits up to 2 s for pushers being closed in the background. */
void duet_worker_net_close(duet_worker_net_t *n);

#endif
