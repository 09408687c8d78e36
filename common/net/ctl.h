/* Control plane over NNG (DESIGN §6, docs/PROTOCOL.md): typed duet.v1
 * envelopes on four kinds of endpoint.
 *
 *   server  (rep, listens)  a worker's command socket: one request, one reply
 *   client  (req, dials)    the router's (or a tool's) side of a command socket
 *   pusher  (dials)         a worker's events to the router
 *   puller  (listens)       the router's event inbox, fed by every worker
 *
 * Pusher and puller behave as a push/pull pair (a queue on the sending side,
 * order kept per pusher, no answer to the caller) but run over req/rep:
 * each event is acknowledged by the puller before the next is sent.  NNG
 * 1.5.2's push protocol crashes the pushing process when a puller
 * disconnects while a send completes (ctl.c says how); req/rep does not.
 *
 * Every operation that waits takes a deadline: absolute CLOCK_MONOTONIC
 * nanoseconds (common/time_util.h, duet_deadline_after_ms()).  A deadline
 * already passed means "do not wait": the operation completes only if it can
 * at once.  Nothing here waits without one.
 *
 * The server is polled: duet_ctl_server_poll() receives, decodes, calls the
 * handler and replies on the caller's thread, so a worker serves commands
 * from its own loop between steps and its handler needs no locks (the decode
 * loop must never block, DESIGN §3).  duet_ctl_server_fd() gives a descriptor
 * that polls readable when a request waits, for loops that sleep in poll(2).
 * For processes with nothing better to do (tests, tools),
 * duet_ctl_server_start_thread() runs the same poll loop on a thread of its
 * own; the handler then runs on that thread.
 *
 * Requests that do not decode (garbage, truncated, oversized, wrong version,
 * out-of-range fields) are answered with an Error envelope carrying the
 * typed code and the decoder's sentence, counted, and logged; they never
 * reach the handler.  Messages are checked against duet_msg_limits_t; the
 * sockets' own receive limit is max_message_bytes + 1 MiB, so a message a
 * little over the limit is answered with Error RANGE, and one far over it is
 * dropped by the transport, which closes that connection (the sender sees
 * DUET_ERR_PEER).
 *
 * Status codes: NNG errors are translated where they enter, in one table
 * (duet_ctl_status_from_nng): a wait that reaches its deadline is
 * DUET_ERR_TIMEOUT, a peer that closed, reset or refused the connection is
 * DUET_ERR_PEER, a full queue is DUET_ERR_BUSY.
 *
 * URLs are NNG's: ipc:///path/sock, tcp://127.0.0.1:port, inproc://name.
 *
 * Threads: a client, pusher or puller may be used from several threads at
 * once (each client call has its own NNG context); a server is polled from
 * one thread at a time.  _destroy must not race with other calls on the same
 * object. */
#ifndef DUET_NET_CTL_H
#define DUET_NET_CTL_H

#include <stdint.h>

#include "err.h"
#include "msg.h"

typedef struct duet_ctl_server duet_ctl_server_t;
typedef struct duet_ctl_client duet_ctl_client_t;
typedef struct duet_ctl_pusher duet_ctl_pusher_t;
typedef struct duet_ctl_puller duet_ctl_puller_t;

/* Options shared by the four kinds; zero means the default. */
typedef struct {
    const char *url;                 /* required: where to listen (server, puller) or dial (client, pusher) */
    const char *sender_id;           /* server: header.sender_id of the Error replies it builds ("duet") */
    const duet_msg_limits_t *limits; /* NULL: duet_msg_limits_default(); copied */
    uint32_t queue_len;              /* pusher: events queued while the puller is slow or away (1024; at most 2^20) */
    uint32_t reconnect_max_ms;       /* client, pusher: longest wait between redial attempts (250) */
} duet_ctl_opts_t;

/* NNG error code -> duet status.  The one place where NNG codes are read. */
duet_status_t duet_ctl_status_from_nng(int nng_rv);

/* Operations this process's timeout watchdog cancelled because NNG had not ended them 100 ms past
 * their timeout (libnng 1.5.2's expiry threads can miss one); each was reported as the timeout it
 * was.  0 on a healthy run. */
unsigned long duet_ctl_timeouts_rescued(void);

/* ipc listeners of this process replaced because libnng 1.5.2 may have stopped them (a client
 * that left during the handshake): new clients reach a new listener, the old one serves its
 * connections until they are idle.  0 on a healthy run. */
unsigned long duet_ctl_listener_restarts(void);

/* ipc connections of this process's clients closed (and dialed again) because no reply ever came
 * on them and a call timed out a second or more after they came up (a server's stopped listener
 * took them).  0 on a healthy run. */
unsigned long duet_ctl_client_redials(void);
/* Dialers added (a client's or a pusher's) after a second without a connection in which no
 * dialer of theirs attempted one: libnng 1.5.2's dialer stops for good when an attempt ends in
 * NNG_ECLOSED (docs/PROTOCOL.md).  0 on a healthy run. */
unsigned long duet_ctl_dialer_revivals(void);

/* For tests: stop the dialers of a client or pusher the way libnng 1.5.2 stops one after an
 * attempt that ends in NNG_ECLOSED (closed, with their connection), so that a new one is needed. */
void duet_ctl_client_test_stop_dialer(duet_ctl_client_t *c);
void duet_ctl_pusher_test_stop_dialer(duet_ctl_pusher_t *p);

/* For tests: a receive that nothing answers and NNG never times out, left to the watchdog at
 * watch_ms; TIMEOUT when the watchdog ended it (*took_ns: how long it ran). */
duet_status_t duet_ctl_watchdog_selftest(uint32_t watch_ms, uint64_t *took_ns);

/* ------------------------------------------------------------------ server */

/* Called for every valid request.  Set *reply to a new envelope (ownership
 * passes to the server) and return DUET_OK; *reply left NULL means Ack.  A
 * returned error status is sent as an Error envelope with that code (any
 * *reply is then freed); to send an Error with a sentence, build it with
 * duet_msg_new_error() and return DUET_OK.  A reply that fails validation is
 * replaced by Error INTERNAL and logged.  `req` belongs to the server and
 * lives until the handler returns.  The handler must not block. */
typedef duet_status_t (*duet_ctl_handler_fn)(const duet_envelope_t *req, duet_envelope_t **reply, void *arg);

typedef struct {
    uint64_t requests;       /* requests received */
    uint64_t bad_requests;   /* answered with an Error because they did not decode */
    uint64_t handler_errors; /* answered with an Error because the handler failed */
    uint64_t bad_replies;    /* handler replies that failed validation */
    uint64_t send_failures;  /* replies NNG could not send (the client's call times out) */
} duet_ctl_server_stats_t;

/* Listen on o->url.  DUET_ERR_BUSY when the address is in use, DUET_ERR_INVALID
 * for a bad URL. */
duet_status_t duet_ctl_server_create(const duet_ctl_opts_t *o, duet_ctl_handler_fn handler, void *arg,
                                     duet_ctl_server_t **out, duet_err_t *err);
/* Serve: wait until `deadline_ns` for a request (not at all when it has
 * passed), then serve it and every request already waiting, at most 64;
 * *n_served (may be NULL) counts them.  DUET_OK also when none came;
 * DUET_ERR_STATE when the server runs its own thread, DUET_ERR_PEER once the
 * server is closed. */
duet_status_t duet_ctl_server_poll(duet_ctl_server_t *s, uint64_t deadline_ns, uint32_t *n_served);
/* A file descriptor that polls readable while a request waits (do not read it). */
duet_status_t duet_ctl_server_fd(duet_ctl_server_t *s, int *fd);
/* Serve on a new thread until destroy. */
duet_status_t duet_ctl_server_start_thread(duet_ctl_server_t *s, duet_err_t *err);
void duet_ctl_server_stats(const duet_ctl_server_t *s, duet_ctl_server_stats_t *out);
/* Close the socket (a request being served gets no reply), stop the thread
 * if any, free; *s = NULL.  NULL is fine. */
void duet_ctl_server_destroy(duet_ctl_server_t **s);

/* ------------------------------------------------------------------ client */

/* Dial o->url in the background (the server may start later; reconnection
 * is automatic).  Requests are never resent: a call either gets its reply,
 * fails with DUET_ERR_PEER when the connection carrying it breaks, or fails
 * with DUET_ERR_TIMEOUT at its deadline. */
duet_status_t duet_ctl_client_create(const duet_ctl_opts_t *o, duet_ctl_client_t **out, duet_err_t *err);
/* Send `req` and wait until `deadline_ns` for the reply.  On DUET_OK *reply
 * is a valid envelope whose rid, when set, is the request's; it may be an
 * Error body (duet_ctl_reply_status() turns that into a status).  Errors:
 * the request's own validation status (nothing sent), DUET_ERR_TIMEOUT,
 * DUET_ERR_PEER, or the reply's decode status (PARSE, VERSION, RANGE,
 * PROTOCOL). */
duet_status_t duet_ctl_client_call(duet_ctl_client_t *c, const duet_envelope_t *req, uint64_t deadline_ns,
                                   duet_envelope_t **reply, duet_err_t *err);
/* The same with raw request bytes, unchecked: for tests and tools that send
 * malformed commands on purpose. */
duet_status_t duet_ctl_client_call_raw(duet_ctl_client_t *c, const void *buf, size_t len, uint64_t deadline_ns,
                                       duet_envelope_t **reply, duet_err_t *err);
void duet_ctl_client_destroy(duet_ctl_client_t **c);

/* DUET_OK unless `reply` is an Error body: then its code as a status, with
 * err naming the sender and carrying its message. */
duet_status_t duet_ctl_reply_status(const duet_envelope_t *reply, duet_err_t *err);

/* ------------------------------------------------------------------ events */

/* Dial the puller at o->url in the background and start the pusher's
 * sending thread; events sent before the connection is up wait in the queue
 * (o->queue_len).  An event in flight when the connection breaks is lost
 * (logged); the queued ones wait for the next connection.  Destroy drops
 * what is still queued. */
duet_status_t duet_ctl_pusher_create(const duet_ctl_opts_t *o, duet_ctl_pusher_t **out, duet_err_t *err);
/* Validate, encode and queue `ev`; wait until `deadline_ns` for room (not at
 * all when passed).  DUET_ERR_BUSY when the queue stayed full (the puller is
 * slow or away), DUET_ERR_PEER once closed, or the event's validation
 * status.  Events from one pusher arrive in the order sent. */
duet_status_t duet_ctl_pusher_send(duet_ctl_pusher_t *p, const duet_envelope_t *ev, uint64_t deadline_ns,
                                   duet_err_t *err);
/* Wait until `deadline_ns` for every event queued so far to be answered by
 * the puller (or lost in flight, as above): DUET_OK, DUET_ERR_TIMEOUT with
 * the count still undelivered, or DUET_ERR_PEER once closed.  For a process
 * about to end, whose last events must not die in its queue. */
duet_status_t duet_ctl_pusher_flush(duet_ctl_pusher_t *p, uint64_t deadline_ns, duet_err_t *err);
void duet_ctl_pusher_destroy(duet_ctl_pusher_t **p);

/* Listen on o->url for events from any number of pushers.  Each event
 * received is answered at once: Ack, or Error with the decode status (the
 * pusher logs it). */
duet_status_t duet_ctl_puller_create(const duet_ctl_opts_t *o, duet_ctl_puller_t **out, duet_err_t *err);
/* Wait until `deadline_ns` for the next event: DUET_OK with *ev,
 * DUET_ERR_TIMEOUT, DUET_ERR_PEER once closed, or the decode status of a
 * malformed event (logged and dropped; the next call gets the next event). */
duet_status_t duet_ctl_puller_recv(duet_ctl_puller_t *p, uint64_t deadline_ns, duet_envelope_t **ev,
                                   duet_err_t *err);
/* A file descriptor that polls readable while an event waits. */
duet_status_t duet_ctl_puller_fd(duet_ctl_puller_t *p, int *fd);
void duet_ctl_puller_destroy(duet_ctl_puller_t **p);

#endif
