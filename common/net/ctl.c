/* Control plane over NNG (ctl.h). */
#include "ctl.h"

/* client_exchange(): accept a reply about any rid (raw calls) */
static const char ctl_any_rid[] = "";

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include "alloc.h"
#include "log.h"
#include "time_util.h"

/* Events queued on a pusher go out together, as one message: CTL_BATCH_MAGIC (a byte no
 * protobuf message starts with: field 31, wire type 7), then per event a varint length and
 * the encoded Envelope.  A single event goes as itself. */
#define CTL_BATCH_MAGIC 0xFF
#define CTL_BATCH_MAX 512
#define CTL_BATCH_BYTES (1u << 20)
#define CTL_POLL_BATCH 64          /* requests served per poll at most */
#define CTL_REPLY_TIMEOUT_MS 100   /* a reply that cannot be queued by then is dropped */
#define CTL_RECV_SLACK (1u << 20)  /* transport limit above max_message_bytes */
#define CTL_RECONNECT_MIN_MS 10
#define CTL_DEFAULT_RECONNECT_MAX_MS 250
#define CTL_DEFAULT_QUEUE_LEN 1024
#define CTL_MAX_QUEUE_LEN (1u << 20)
#define CTL_URL_MAX 256
#define CTL_PUSHER_GRACE_MS 200    /* destroy: time a delivery in progress gets to end */

duet_status_t duet_ctl_status_from_nng(int rv)
{
    switch (rv) {
    case 0:
        return DUET_OK;
    case NNG_ETIMEDOUT:
        return DUET_ERR_TIMEOUT;
    case NNG_ECLOSED:       /* our socket, or the peer's connection, is closed */
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:    /* req: the connection carrying a request broke */
    case NNG_ECONNABORTED:
    case NNG_ECONNSHUT:
    case NNG_EUNREACHABLE:
    case NNG_ECANCELED:     /* only our close cancels operations */
    case NNG_EPEERAUTH:
        return DUET_ERR_PEER;
    case NNG_EAGAIN:
    case NNG_EBUSY:
    case NNG_EADDRINUSE:
        return DUET_ERR_BUSY;
    case NNG_ENOMEM:
        return DUET_ERR_NOMEM;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
    case NNG_ENOARG:
    case NNG_EBADTYPE:
    case NNG_EAMBIGUOUS:
        return DUET_ERR_INVALID;
    case NNG_ENOTSUP:
        return DUET_ERR_UNSUPPORTED;
    case NNG_EMSGSIZE:
        return DUET_ERR_RANGE;
    case NNG_EPROTO:
        return DUET_ERR_PROTOCOL;
    case NNG_ESTATE:
        return DUET_ERR_STATE;
    case NNG_ENOENT:
        return DUET_ERR_NOT_FOUND;
    case NNG_ENOFILES:
    case NNG_ENOSPC:
        return DUET_ERR_NO_SPACE;
    case NNG_EINTR:
    case NNG_EPERM:
    case NNG_ECRYPTO:
    case NNG_EREADONLY:
    case NNG_EWRITEONLY:
        return DUET_ERR_IO;
    default:
        if (rv & (NNG_ESYSERR | NNG_ETRANERR))
            return DUET_ERR_IO;
        return DUET_ERR_INTERNAL;
    }
}

/* Record an NNG failure: the translated status and a sentence with NNG's text. */
static duet_status_t nng_fail(duet_err_t *err, int rv, const char *url, const char *what)
{
    duet_status_t st = duet_ctl_status_from_nng(rv);
    return duet_err_set(err, st, "%s: %s: %s", url, what, nng_strerror(rv));
}

/* Milliseconds until a deadline, rounded up, as an NNG timeout (0: now). */
static nng_duration ms_until(uint64_t deadline_ns)
{
    uint64_t now = duet_time_ns();
    if (deadline_ns <= now)
        return NNG_DURATION_ZERO;
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > INT32_MAX ? INT32_MAX : (nng_duration)ms;
}

typedef struct {
    duet_msg_limits_t lim;
    char url[CTL_URL_MAX];
    char sender_id[DUET_MSG_MAX_ID_LEN + 1]; /* header.sender_id of the answers we build */
} common_t;

static duet_status_t common_init(common_t *c, const duet_ctl_opts_t *o, duet_err_t *err)
{
    if (!o || !o->url || !o->url[0])
        return duet_err_set(err, DUET_ERR_INVALID, "ctl: no URL");
    if (strlen(o->url) >= sizeof c->url)
        return duet_err_set(err, DUET_ERR_INVALID, "ctl: URL longer than %d bytes", CTL_URL_MAX - 1);
    if (o->sender_id) {
        size_t n = strlen(o->sender_id);
        if (n > DUET_MSG_MAX_ID_LEN || strspn(o->sender_id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789._:-") != n)
            return duet_err_set(err, DUET_ERR_INVALID, "ctl: sender id \"%s\" is not 1..%d of [A-Za-z0-9._:-]",
                                o->sender_id, DUET_MSG_MAX_ID_LEN);
    }
    snprintf(c->url, sizeof c->url, "%s", o->url);
    snprintf(c->sender_id, sizeof c->sender_id, "%s", o->sender_id && o->sender_id[0] ? o->sender_id : "duet");
    if (o->limits)
        c->lim = *o->limits;
    else
        duet_msg_limits_default(&c->lim);
    return DUET_OK;
}

static int set_recv_limit(nng_socket sock, const duet_msg_limits_t *lim)
{
    size_t max = lim->max_message_bytes > SIZE_MAX - CTL_RECV_SLACK ? SIZE_MAX
                                                                    : lim->max_message_bytes + CTL_RECV_SLACK;
    return nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, max);
}

static int set_reconnect(nng_socket sock, const duet_ctl_opts_t *o)
{
    int rv = nng_socket_set_ms(sock, NNG_OPT_RECONNMINT, CTL_RECONNECT_MIN_MS);
    if (rv == 0)
        rv = nng_socket_set_ms(sock, NNG_OPT_RECONNMAXT,
                               o->reconnect_max_ms ? (nng_duration)o->reconnect_max_ms
                                                   : CTL_DEFAULT_RECONNECT_MAX_MS);
    return rv;
}

/* nng_close() with a bound.  libnng 1.5.2 can leave a pipe's receive
 * pending forever when the socket is closed while its peer is sending (a
 * rep socket under a steady stream of requests reproduces it within
 * seconds; later NNG releases do not), and nng_close() then never returns.
 * A process must still be able to shut down, so the close runs on a thread
 * of its own: 0 when it finished within CTL_CLOSE_TIMEOUT_MS, -1 when it is
 * still stuck (the socket, and whatever NNG still holds of it, is left
 * behind; the caller must not free what NNG may still call into). */
#define CTL_CLOSE_TIMEOUT_MS 1000

typedef struct {
    nng_socket sock;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, abandoned;
} closer_t;

static void closer_free(closer_t *c)
{
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void *closer_main(void *arg)
{
    closer_t *c = arg;
    nng_close(c->sock);
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    int abandoned = c->abandoned;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (abandoned)
        closer_free(c);
    return NULL;
}

static int close_bounded(nng_socket sock, const char *url)
{
    pthread_condattr_t ca;
    pthread_t th;
    closer_t *c = DUET_NEW(closer_t);
    if (!c) {
        nng_close(sock);
        return 0;
    }
    c->sock = sock;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&th, NULL, closer_main, c) != 0) {
        closer_free(c);
        nng_close(sock);
        return 0;
    }
    uint64_t deadline = duet_deadline_after_ms(CTL_CLOSE_TIMEOUT_MS);
    struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
    pthread_mutex_lock(&c->mu);
    while (!c->done && duet_time_ns() < deadline)
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    int done = c->done;
    if (!done)
        c->abandoned = 1;
    pthread_mutex_unlock(&c->mu);
    if (!done) {
        pthread_detach(th);
        duet_error("ctl %s: NNG did not close the socket within %d ms; leaving it behind", url,
                   CTL_CLOSE_TIMEOUT_MS);
        return -1;
    }
    pthread_join(th, NULL);
    closer_free(c);
    return 0;
}

/* Validate and encode an envelope into a new NNG message. */
static duet_status_t msg_encode(const duet_envelope_t *env, const duet_msg_limits_t *lim, nng_msg **out,
                                duet_err_t *err)
{
    size_t n;
    nng_msg *m;
    duet_status_t st = duet_msg_encoded_size(env, lim, &n, err);
    if (st)
        return st;
    int rv = nng_msg_alloc(&m, n);
    if (rv)
        return duet_err_set(err, duet_ctl_status_from_nng(rv), "cannot allocate a message of %zu bytes", n);
    duet_msg_pack(env, nng_msg_body(m));
    *out = m;
    return DUET_OK;
}

/* A deadline of our own behind NNG's timeouts.  libnng 1.5.2's expiry threads can miss one: a
 * worker's control server was seen waiting in a 2 ms receive for minutes, its aio still on the
 * expiry list 674 ms past its deadline while that list's thread slept with no wake-up due
 * (docs/PROTOCOL.md, "The event channel, and libnng 1.5.2").  Every operation aio_run starts with
 * a finite timeout is registered here; one watchdog thread, started on first use, cancels those
 * still pending CTL_AIO_GRACE_MS after their timeout (nng_aio_cancel runs the operation's cancel
 * function itself, not through the expiry list), and aio_run then reports the timeout NNG should
 * have given.  A cancel that lands after the operation ended does nothing.  Lock order: the
 * watchdog calls nng_aio_cancel (NNG's locks) while holding g_watch_mu; the only other taker of
 * g_watch_mu is aio_run, which holds none of NNG's locks and never runs on NNG's threads. */
#define CTL_AIO_GRACE_MS 100

typedef struct aio_watch {
    struct aio_watch *prev, *next;
    nng_aio *aio;
    uint64_t deadline_ns;
    int fired;
} aio_watch_t;

static pthread_mutex_t g_watch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_watch_cv;
static pthread_once_t g_watch_once = PTHREAD_ONCE_INIT;
static aio_watch_t *g_watch_head;
static uint64_t g_watch_wake = UINT64_MAX; /* when the watchdog wakes next (under g_watch_mu) */
static int g_watch_ok;                     /* the watchdog runs */
static atomic_ulong g_watch_fired;

static void *watch_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_watch_mu);
    for (;;) {
        uint64_t now = duet_time_ns(), next = UINT64_MAX;
        for (aio_watch_t *w = g_watch_head; w; w = w->next) {
            if (w->fired)
                continue;
            if (w->deadline_ns <= now) {
                w->fired = 1;
                if (atomic_fetch_add(&g_watch_fired, 1) == 0)
                    duet_warn("ctl: an NNG operation was still pending %d ms past its timeout; cancelled "
                              "(libnng's expiry missed it; later ones are counted, not logged)",
                              CTL_AIO_GRACE_MS);
                nng_aio_cancel(w->aio);
            } else if (w->deadline_ns < next) {
                next = w->deadline_ns;
            }
        }
        g_watch_wake = next;
        if (next == UINT64_MAX) {
            pthread_cond_wait(&g_watch_cv, &g_watch_mu);
        } else {
            struct timespec ts = {(time_t)(next / 1000000000u), (long)(next % 1000000000u)};
            pthread_cond_timedwait(&g_watch_cv, &g_watch_mu, &ts);
        }
    }
    return NULL;
}

static void watch_start(void)
{
    pthread_condattr_t ca;
    pthread_attr_t a;
    pthread_t th;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_watch_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    g_watch_ok = pthread_create(&th, &a, watch_main, NULL) == 0;
    pthread_attr_destroy(&a);
    if (!g_watch_ok)
        duet_warn("ctl: cannot start the timeout watchdog; NNG's own timeouts only");
}

unsigned long duet_ctl_timeouts_rescued(void) { return atomic_load(&g_watch_fired); }

/* Run one asynchronous operation with NNG's timeout `timeout`, cancelled by the watchdog if it is
 * still pending `watch_ms` from now (0: not watched); returns NNG's result, NNG_ETIMEDOUT where
 * the watchdog cancelled it. */
static int aio_run_watched(nng_aio *aio, nng_duration timeout, uint32_t watch_ms,
                           void (*start)(void *, nng_aio *), void *target)
{
    aio_watch_t w = {.aio = aio};
    int watched = 0;
    nng_aio_set_timeout(aio, timeout);
    if (watch_ms > 0) {
        pthread_once(&g_watch_once, watch_start);
        if (g_watch_ok) {
            w.deadline_ns = duet_deadline_after_ms(watch_ms);
            pthread_mutex_lock(&g_watch_mu);
            w.next = g_watch_head;
            if (g_watch_head)
                g_watch_head->prev = &w;
            g_watch_head = &w;
            if (w.deadline_ns < g_watch_wake) {
                g_watch_wake = w.deadline_ns;
                pthread_cond_signal(&g_watch_cv);
            }
            pthread_mutex_unlock(&g_watch_mu);
            watched = 1;
        }
    }
    start(target, aio);
    nng_aio_wait(aio);
    int rv = nng_aio_result(aio);
    if (watched) {
        pthread_mutex_lock(&g_watch_mu);
        if (w.prev)
            w.prev->next = w.next;
        else
            g_watch_head = w.next;
        if (w.next)
            w.next->prev = w.prev;
        pthread_mutex_unlock(&g_watch_mu);
        if (w.fired && rv == NNG_ECANCELED)
            rv = NNG_ETIMEDOUT;
    }
    return rv;
}

/* Run one asynchronous operation to completion or deadline; returns NNG's result. */
static int aio_run(nng_aio *aio, nng_duration timeout, void (*start)(void *, nng_aio *), void *target)
{
    return aio_run_watched(aio, timeout, timeout > 0 ? (uint32_t)timeout + CTL_AIO_GRACE_MS : 0, start, target);
}

static void start_sock_recv(void *sock, nng_aio *aio) { nng_recv_aio(*(nng_socket *)sock, aio); }
static void start_sock_send(void *sock, nng_aio *aio) { nng_send_aio(*(nng_socket *)sock, aio); }
static void start_ctx_recv(void *ctx, nng_aio *aio) { nng_ctx_recv(*(nng_ctx *)ctx, aio); }
static void start_ctx_send(void *ctx, nng_aio *aio) { nng_ctx_send(*(nng_ctx *)ctx, aio); }

duet_status_t duet_ctl_watchdog_selftest(uint32_t watch_ms, uint64_t *took_ns)
{
    nng_socket sock;
    nng_aio *aio;
    if (nng_rep0_open(&sock) != 0)
        return DUET_ERR_INTERNAL;
    if (nng_aio_alloc(&aio, NULL, NULL) != 0) {
        nng_close(sock);
        return DUET_ERR_NOMEM;
    }
    uint64_t t0 = duet_time_ns();
    /* a receive nobody answers, with no NNG timeout: only the watchdog ends it */
    int rv = aio_run_watched(aio, NNG_DURATION_INFINITE, watch_ms, start_sock_recv, &sock);
    *took_ns = duet_time_ns() - t0;
    nng_aio_free(aio);
    nng_close(sock);
    return duet_ctl_status_from_nng(rv);
}

duet_status_t duet_ctl_reply_status(const duet_envelope_t *reply, duet_err_t *err)
{
    if (!reply || reply->body_case != DUET__V1__ENVELOPE__BODY_ERROR || !reply->error)
        return DUET_OK;
    duet_status_t st = duet_msg_error_status(reply->error->code);
    return duet_err_set(err, st, "%s answered %s: %s",
                        reply->header && reply->header->sender_id[0] ? reply->header->sender_id : "peer",
                        duet_status_code(st), reply->error->message ? reply->error->message : "");
}

/* A listener that stopped accepting, and its replacement.  libnng 1.5.2's ipc transport answers a
 * client that connects and closes before the handshake (its header written to a closed peer:
 * EPIPE, which NNG reads as NNG_ECLOSED) by ending the listener's accept loop as if the listener
 * itself had closed: every later client's connection is taken by the kernel and its requests are
 * never read (docs/PROTOCOL.md, "The event channel, and libnng 1.5.2"; tcp and NNG 1.10 do not do
 * it).  The listener counts that error under its "other" statistic, which keeper_check reads every
 * CTL_LISTEN_CHECK_MS.
 *
 * So an ipc socket path is a relay: the listeners bind "PATH.lN" (N counting up) and PATH is a
 * symbolic link to the current one (connect(2) follows it).  A listener with a new "other" error is
 * replaced at once: a new one on the next name, the link swapped to it by rename(2) (atomic: a
 * client dialing meanwhile reaches one or the other), and the old one retired.  A retired
 * listener keeps serving the connections it made (closing a listener closes them, and a client
 * whose connection closes fails its next call) and is closed once none is attached; only when
 * CTL_LISTENERS are taken is the one whose connections have brought no request (an event, for a
 * puller) for longest closed, if that is CTL_LISTEN_IDLE_MS.  A client that dialed the stopped
 * listener has a connection that is never read: clients and pushers close such a connection
 * themselves (conn_drop_silent).  The error is also counted when NNG recovered by itself, and for
 * clients that connect and leave at once after the handshake: a listener with a new one is
 * replaced only when a probe finds that it no longer accepts (keeper_accepts). */
#define CTL_LISTEN_CHECK_MS 250
#define CTL_SILENT_PIPE_MS 2000 /* conn_drop_silent */
#define CTL_LISTEN_IDLE_MS 500
#define CTL_LISTENERS 8 /* the current listener and retired ones still holding connections */

static atomic_ulong g_listener_restarts;

unsigned long duet_ctl_listener_restarts(void) { return atomic_load(&g_listener_restarts); }

typedef struct {
    int id;              /* nng_listener_id, 0: a free slot (the serving thread's alone) */
    nng_listener l;
    uint64_t retired_ns; /* when it was replaced */
    uint64_t active_ns; /* the last request (or event) taken from one of them */
} keeper_slot_t;

typedef struct {
    nng_socket sock;
    const char *url;
    int relay;                  /* an ipc path: listeners on PATH.lN, PATH a link to the current one */
    char path[108];             /* PATH (sun_path's size) */
    unsigned gen;               /* N of the current listener */
    int cur;                    /* its slot */
    keeper_slot_t slot[CTL_LISTENERS];
    uint64_t next_check_ns;     /* keeper_check's next look */
    uint64_t other_seen;        /* the current listener's "other" errors seen so far */
    int full_warned;            /* no free slot for a replacement: said once */
} keeper_t;

static keeper_slot_t *keeper_slot_of(keeper_t *k, int id)
{
    for (int i = 0; i < CTL_LISTENERS; i++)
        if (id > 0 && k->slot[i].id == id)
            return &k->slot[i];
    return NULL;
}

/* A request or event taken from the socket, in message m (the thread that serves it). */
static void keeper_touch(keeper_t *k, nng_msg *m)
{
    keeper_slot_t *sl = keeper_slot_of(k, nng_listener_id(nng_pipe_listener(nng_msg_get_pipe(m))));
    if (sl)
        sl->active_ns = duet_time_ns();
}

/* The child of scope st named name, or NULL. */
static nng_stat *stat_child_named(nng_stat *st, const char *name)
{
    for (nng_stat *c = nng_stat_child(st); c; c = nng_stat_next(c))
        if (strcmp(nng_stat_name(c), name) == 0)
            return c;
    return NULL;
}

/* The scope named scope ("listener", "dialer") whose "id" is id, under st.  (libnng 1.5.2's
 * nng_stat_find_listener returns the first listener of the tree whatever its id: its search
 * recurses by name only.) */
static nng_stat *stat_find_scope(nng_stat *st, const char *scope, int id)
{
    if (nng_stat_type(st) != NNG_STAT_SCOPE)
        return NULL;
    if (strcmp(nng_stat_name(st), scope) == 0) {
        nng_stat *i = stat_child_named(st, "id");
        return i && nng_stat_value(i) == (uint64_t)id ? st : NULL;
    }
    for (nng_stat *c = nng_stat_child(st); c; c = nng_stat_next(c)) {
        nng_stat *r = stat_find_scope(c, scope, id);
        if (r)
            return r;
    }
    return NULL;
}

/* A counter of the listener's statistics ("other": its errors of no known kind; "pipes": the
 * connections it made that are open), or -1 when NNG keeps none.  (Counting connections from pipe
 * events instead does not work: NNG clears a pipe's listener before its removal event.) */
static int64_t listener_stat(nng_listener l, const char *name)
{
    nng_stat *root = NULL;
    int64_t v = -1;
    if (nng_stats_get(&root) != 0 || !root)
        return -1;
    nng_stat *ls = stat_find_scope(root, "listener", nng_listener_id(l));
    nng_stat *o = ls ? stat_child_named(ls, name) : NULL;
    if (o)
        v = (int64_t)nng_stat_value(o);
    nng_stats_free(root);
    return v;
}

/* The name of listener n (relay), and the link's text: the name within PATH's directory. */
static int relay_name(const keeper_t *k, unsigned n, char *out, size_t cap)
{
    int len = snprintf(out, cap, "%s.l%u", k->path, n);
    return len > 0 && (size_t)len < cap ? 0 : NNG_EADDRINVAL;
}

static int nng_sys_error(int e) { return NNG_ESYSERR | e; }

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

#define CTL_PROBE_MS 2000       /* unix_live: the server's header, at start */
#define CTL_PROBE_ACCEPT_MS 100 /* keeper_accepts: the header, then the accept (the serving thread waits) */
/* A connection to the unix socket at path with the SP handshake done as a req peer (up to ms for
 * the server's header): the descriptor, -2 when nothing accepts there, -1 when something does but
 * the handshake did not complete (or its queue of connections is full). */
static int unix_handshake(const char *path, uint64_t ms)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path)
        return -2;
    memcpy(a.sun_path, path, strlen(path) + 1);
    /* non-blocking: a connect to a listener whose queue is full (one that stopped accepting,
     * with clients redialling it) would otherwise wait until it has room, which may be never */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -2;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        return e == EAGAIN || e == EWOULDBLOCK ? -1 : -2; /* a full queue: there, not accepting */
    }
    static const uint8_t hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}; /* SP, version 0, req0 (48) */
    uint8_t got[8];
    size_t have = 0;
    uint64_t until = duet_deadline_after_ms(ms);
    if (send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) == (ssize_t)sizeof hdr)
        while (have < sizeof got && duet_time_ns() < until) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            if (poll(&pf, 1, 20) < 0 && errno != EINTR)
                break;
            ssize_t n = pf.revents ? recv(fd, got + have, sizeof got - have, MSG_DONTWAIT) : 0;
            if (n == 0 && pf.revents)
                break; /* closed */
            if (n > 0)
                have += (size_t)n;
        }
    if (have == sizeof got)
        return fd;
    close(fd);
    return -1;
}

/* Whether something accepts connections on the unix socket at path (a live server).  The probe
 * completes the handshake before it closes: a connection closed before it is what stops a libnng
 * 1.5.2 listener. */
static int unix_live(const char *path)
{
    int fd = unix_handshake(path, CTL_PROBE_MS);
    if (fd >= 0)
        close(fd);
    return fd != -2;
}

/* Listen in slot i: on k->url, or (relay) on listener n's name. */
static int keeper_listen(keeper_t *k, int i, unsigned n)
{
    char url[sizeof k->path + 32];
    keeper_slot_t *sl = &k->slot[i];
    int rv = 0;
    if (k->relay) {
        char name[sizeof k->path + 16];
        if ((rv = relay_name(k, n, name, sizeof name)))
            return rv;
        snprintf(url, sizeof url, "ipc://%s", name);
    } else {
        snprintf(url, sizeof url, "%s", k->url);
    }
    if ((rv = nng_listener_create(&sl->l, k->sock, url)))
        return rv;
    sl->active_ns = duet_time_ns();
    sl->id = nng_listener_id(sl->l); /* before any connection can come */
    if ((rv = nng_listener_start(sl->l, 0)) != 0) {
        nng_listener_close(sl->l);
        sl->id = 0;
    }
    return rv;
}

/* Point PATH at listener n: a new link beside it, renamed over it. */
static int relay_point(keeper_t *k, unsigned n)
{
    char name[sizeof k->path + 16], tmp[sizeof k->path + 16];
    int rv;
    if ((rv = relay_name(k, n, name, sizeof name)))
        return rv;
    snprintf(tmp, sizeof tmp, "%s.t", k->path);
    (void)unlink(tmp);
    if (symlink(base_name(name), tmp) != 0)
        return nng_sys_error(errno);
    if (rename(tmp, k->path) != 0) {
        rv = nng_sys_error(errno);
        (void)unlink(tmp);
        return rv;
    }
    return 0;
}

/* PATH before the first listener: free, or what a server that died left there (a link to its
 * listener, or a socket from before relays), removed; a live server's address is in use. */
static int relay_claim(keeper_t *k)
{
    struct stat st;
    if (lstat(k->path, &st) != 0)
        return errno == ENOENT ? 0 : nng_sys_error(errno);
    if (!S_ISLNK(st.st_mode) && !S_ISSOCK(st.st_mode))
        return NNG_EADDRINUSE;
    if (unix_live(k->path))
        return NNG_EADDRINUSE;
    if (S_ISLNK(st.st_mode)) { /* the dead server's listener file too, when it is one of ours */
        char t[sizeof k->path + 16];
        ssize_t n = readlink(k->path, t, sizeof t - 1);
        size_t bl = strlen(base_name(k->path));
        if (n > 0) {
            t[n] = 0;
            if (!strchr(t, '/') && strncmp(t, base_name(k->path), bl) == 0 && strncmp(t + bl, ".l", 2) == 0) {
                char full[2 * sizeof k->path + 16];
                snprintf(full, sizeof full, "%.*s%s", (int)(base_name(k->path) - k->path), k->path, t);
                if (!unix_live(full))
                    (void)unlink(full);
            }
        }
    }
    return unlink(k->path) == 0 || errno == ENOENT ? 0 : nng_sys_error(errno);
}

/* Count sock's connections and listen on url (k must stay where it is while sock is open). */
static int keeper_start(keeper_t *k, nng_socket sock, const char *url)
{
    memset(k, 0, sizeof *k);
    k->sock = sock;
    k->url = url;
    if (strncmp(url, "ipc://", 6) == 0) {
        if (strlen(url + 6) + 16 > sizeof k->path)
            return NNG_EADDRINVAL; /* PATH.lN must fit a unix socket address */
        snprintf(k->path, sizeof k->path, "%s", url + 6);
        k->relay = 1;
    }
    int rv = 0;
    if (k->relay)
        rv = relay_claim(k);
    if (rv == 0)
        rv = keeper_listen(k, 0, 0);
    if (rv == 0 && k->relay && (rv = relay_point(k, 0)) != 0)
        nng_listener_close(k->slot[0].l); /* its own file goes with it */
    return rv;
}

/* After the socket closed (its listeners and their files with it): PATH, when it still points
 * at our listener. */
static void keeper_stop(keeper_t *k)
{
    char t[sizeof k->path + 16], name[sizeof k->path + 16];
    if (!k->relay || relay_name(k, k->gen, name, sizeof name))
        return;
    ssize_t n = readlink(k->path, t, sizeof t - 1);
    if (n > 0) {
        t[n] = 0;
        if (strcmp(t, base_name(name)) == 0)
            (void)unlink(k->path);
    }
}

/* Whether the current listener still hands connections to the socket: a connection to its own
 * file, the handshake done, counted by its "accept" statistic within CTL_PROBE_ACCEPT_MS.  The
 * "other" statistic also counts errors NNG recovers from (a client that leaves just after the
 * handshake, or during it but after the listener's header went out); those listeners are kept.
 * A few milliseconds on a live listener; a stopped one costs the wait (CTL_PROBE_ACCEPT_MS for
 * the header and the accept together). */
static int keeper_accepts(keeper_t *k)
{
    char name[sizeof k->path + 16];
    nng_listener l = k->slot[k->cur].l;
    int64_t before = listener_stat(l, "accept");
    if (before < 0 || relay_name(k, k->gen, name, sizeof name))
        return 0;
    uint64_t until = duet_deadline_after_ms(CTL_PROBE_ACCEPT_MS);
    int fd = unix_handshake(name, CTL_PROBE_ACCEPT_MS), alive = 0;
    if (fd < 0)
        return 0;
    while (!(alive = listener_stat(l, "accept") > before) && duet_time_ns() < until)
        nng_msleep(1);
    close(fd); /* after the accept: an ordinary connection's end */
    return alive;
}

/* From the one thread that serves the socket. */
static void keeper_check(keeper_t *k)
{
    uint64_t now = duet_time_ns();
    if (!k->relay || now < k->next_check_ns)
        return;
    k->next_check_ns = now + (uint64_t)CTL_LISTEN_CHECK_MS * 1000000u;
    int free_slot = -1, idlest = -1;
    for (int i = 0; i < CTL_LISTENERS; i++) {
        keeper_slot_t *sl = &k->slot[i];
        if (i == k->cur)
            continue;
        if (sl->id != 0 && (now - sl->retired_ns < (uint64_t)(CTL_SILENT_PIPE_MS + 1000) * 1000000u ||
                            listener_stat(sl->l, "pipes") != 0 /* -1: cannot tell, kept */)) {
            if (idlest < 0 || sl->active_ns < k->slot[idlest].active_ns)
                idlest = i;
            continue; /* retired: its clients still connected, or those that dialed it while it was
                         stopped not yet gone on their own (conn_drop_silent) */
        }
        if (sl->id != 0) {
            nng_listener_close(sl->l);
            sl->id = 0;
        }
        if (free_slot < 0)
            free_slot = i;
    }
    int64_t other = listener_stat(k->slot[k->cur].l, "other");
    if (other <= (int64_t)k->other_seen)
        return;
    if (keeper_accepts(k)) { /* an error NNG went on from */
        k->other_seen = (uint64_t)other;
        return;
    }
    if (free_slot < 0 && idlest >= 0 && now - k->slot[idlest].active_ns >= (uint64_t)CTL_LISTEN_IDLE_MS * 1000000u) {
        keeper_slot_t *sl = &k->slot[idlest]; /* room for the new one: the retired one idle longest */
        duet_warn("ctl %s: closing a retired listener with %lld idle connection(s) to make room", k->url,
                  (long long)listener_stat(sl->l, "pipes"));
        nng_listener_close(sl->l);
        sl->id = 0;
        free_slot = idlest;
    }
    if (free_slot < 0) {
        if (!k->full_warned)
            duet_warn("ctl %s: the listener may have stopped accepting, and %d retired ones still hold busy "
                      "connections: replaced once one of them is free",
                      k->url, CTL_LISTENERS - 1);
        k->full_warned = 1;
        return;
    }
    int rv = keeper_listen(k, free_slot, k->gen + 1);
    if (rv == 0 && (rv = relay_point(k, k->gen + 1)) != 0) {
        nng_listener_close(k->slot[free_slot].l);
        k->slot[free_slot].id = 0;
    }
    if (rv) {
        duet_error("ctl %s: the listener may have stopped accepting and a new one did not start: %s; trying again",
                   k->url, nng_strerror(rv));
        return;
    }
    duet_warn("ctl %s: the listener stopped accepting (libnng's accept loop ends on a client that leaves during "
              "its handshake): new clients reach a new one; the old one serves its %d connection(s) until they "
              "close",
              k->url, (int)listener_stat(k->slot[k->cur].l, "pipes"));
    k->slot[k->cur].retired_ns = now;
    k->cur = free_slot;
    k->gen++;
    k->other_seen = 0;
    k->full_warned = 0;
    atomic_fetch_add(&g_listener_restarts, 1);
}

/* ------------------------------------------------------------------ server */

struct duet_ctl_server {
    common_t c;
    nng_socket sock;
    keeper_t keep;
    nng_aio *recv_aio;
    nng_aio *send_aio;
    duet_ctl_handler_fn handler;
    void *arg;
    pthread_t thread;
    int threaded;
    atomic_int stopping;
    _Atomic uint64_t requests, bad_requests, handler_errors, bad_replies, send_failures;
};

static duet_envelope_t *server_error(const duet_ctl_server_t *s, const duet_envelope_t *req, duet_status_t code,
                                     const char *message)
{
    duet_envelope_t *e = NULL;
    const char *rid = duet_msg_rid(req);
    duet_msg_origin_t o = {s->c.sender_id, rid, rid ? req->header->epoch : 0};
    if (duet_msg_new_error(&o, code, message, &e) != DUET_OK)
        return NULL;
    return e;
}

/* Answer one request (which `m` holds; it is reused for the reply). */
static void server_serve(duet_ctl_server_t *s, nng_msg *m)
{
    duet_envelope_t *req = NULL, *reply = NULL;
    duet_err_t err = {0};
    size_t len = nng_msg_len(m), n = 0;
    char sentence[sizeof err.msg + 64];

    atomic_fetch_add(&s->requests, 1);
    duet_status_t st = duet_msg_decode(nng_msg_body(m), len, &s->c.lim, &req, &err);
    if (st) {
        atomic_fetch_add(&s->bad_requests, 1);
        duet_warn("ctl %s: refused a request of %zu bytes: %s", s->c.url, len, duet_err_text(&err));
        reply = server_error(s, NULL, st, err.msg);
    } else {
        st = s->handler(req, &reply, s->arg);
        if (st) {
            atomic_fetch_add(&s->handler_errors, 1);
            duet_envelope_free(&reply);
            snprintf(sentence, sizeof sentence, "%s failed: %s", duet_msg_kind_name(req->body_case),
                     duet_status_str(st));
            duet_log_rid(DUET_LOG_WARN, duet_msg_rid(req), "ctl %s: %s", s->c.url, sentence);
            reply = server_error(s, req, st, sentence);
        } else if (!reply) {
            const char *rid = duet_msg_rid(req);
            duet_msg_origin_t o = {s->c.sender_id, rid, req->header->epoch};
            if (duet_msg_new_ack(&o, &reply) != DUET_OK)
                reply = NULL;
        }
    }
    if (reply && (st = duet_msg_encoded_size(reply, &s->c.lim, &n, &err)) != DUET_OK) {
        atomic_fetch_add(&s->bad_replies, 1);
        duet_log_rid(DUET_LOG_ERROR, duet_msg_rid(req), "ctl %s: the handler's %s reply is invalid: %s", s->c.url,
                     duet_msg_kind_name(reply->body_case), duet_err_text(&err));
        snprintf(sentence, sizeof sentence, "invalid reply: %s", duet_err_text(&err));
        duet_envelope_free(&reply);
        reply = server_error(s, req, DUET_ERR_INTERNAL, sentence);
        if (reply && duet_msg_encoded_size(reply, &s->c.lim, &n, &err) != DUET_OK)
            duet_envelope_free(&reply);
    }
    if (!reply) {
        duet_log_rid(DUET_LOG_ERROR, duet_msg_rid(req), "ctl %s: out of memory building a reply", s->c.url);
        goto err_drop;
    }
    nng_msg_clear(m);
    if (nng_msg_realloc(m, n) != 0) {
        duet_log_rid(DUET_LOG_ERROR, duet_msg_rid(req), "ctl %s: out of memory for a %zu-byte reply", s->c.url, n);
        goto err_drop;
    }
    duet_msg_pack(reply, nng_msg_body(m));
    nng_aio_set_msg(s->send_aio, m);
    m = NULL;
    int rv = aio_run(s->send_aio, CTL_REPLY_TIMEOUT_MS, start_sock_send, &s->sock);
    if (rv) {
        nng_msg_free(nng_aio_get_msg(s->send_aio));
        atomic_fetch_add(&s->send_failures, 1);
        if (rv != NNG_ECLOSED)
            duet_log_rid(DUET_LOG_WARN, duet_msg_rid(req), "ctl %s: reply not sent: %s", s->c.url,
                         nng_strerror(rv));
    }
err_drop:
    if (m) {
        atomic_fetch_add(&s->send_failures, 1);
        nng_msg_free(m);
    }
    duet_envelope_free(&reply);
    duet_envelope_free(&req);
}

static duet_status_t server_poll(duet_ctl_server_t *s, uint64_t deadline_ns, uint32_t *n_served)
{
    uint32_t served = 0;
    duet_status_t st = DUET_OK;

    keeper_check(&s->keep);

    while (served < CTL_POLL_BATCH) {
        int rv = aio_run(s->recv_aio, served ? NNG_DURATION_ZERO : ms_until(deadline_ns), start_sock_recv,
                         &s->sock);
        if (rv == NNG_ETIMEDOUT)
            break;
        if (rv) {
            st = duet_ctl_status_from_nng(rv);
            break;
        }
        keeper_touch(&s->keep, nng_aio_get_msg(s->recv_aio));
        server_serve(s, nng_aio_get_msg(s->recv_aio));
        served++;
    }
    if (n_served)
        *n_served = served;
    return st;
}

duet_status_t duet_ctl_server_create(const duet_ctl_opts_t *o, duet_ctl_handler_fn handler, void *arg,
                                     duet_ctl_server_t **out, duet_err_t *err)
{
    duet_status_t st;
    int rv;

    if (!handler)
        return duet_err_set(err, DUET_ERR_INVALID, "ctl server: no handler");
    duet_ctl_server_t *s = DUET_NEW(duet_ctl_server_t);
    if (!s)
        return duet_err_set(err, DUET_ERR_NOMEM, "ctl server: out of memory");
    if ((st = common_init(&s->c, o, err)))
        goto err_free;
    s->handler = handler;
    s->arg = arg;
    if ((rv = nng_rep0_open(&s->sock))) {
        st = nng_fail(err, rv, s->c.url, "cannot open a rep socket");
        goto err_free;
    }
    if ((rv = set_recv_limit(s->sock, &s->c.lim)) || (rv = nng_aio_alloc(&s->recv_aio, NULL, NULL)) ||
        (rv = nng_aio_alloc(&s->send_aio, NULL, NULL))) {
        st = nng_fail(err, rv, s->c.url, "cannot set up the rep socket");
        goto err_close;
    }
    if ((rv = keeper_start(&s->keep, s->sock, s->c.url))) {
        st = nng_fail(err, rv, s->c.url, "cannot listen");
        goto err_close;
    }
    *out = s;
    return DUET_OK;
err_close:
    nng_close(s->sock);
    if (s->recv_aio)
        nng_aio_free(s->recv_aio);
    if (s->send_aio)
        nng_aio_free(s->send_aio);
err_free:
    free(s);
    return st;
}

duet_status_t duet_ctl_server_poll(duet_ctl_server_t *s, uint64_t deadline_ns, uint32_t *n_served)
{
    if (n_served)
        *n_served = 0;
    if (s->threaded)
        return DUET_ERR_STATE;
    return server_poll(s, deadline_ns, n_served);
}

duet_status_t duet_ctl_server_fd(duet_ctl_server_t *s, int *fd)
{
    return duet_ctl_status_from_nng(nng_socket_get_int(s->sock, NNG_OPT_RECVFD, fd));
}

/* Poll in short slices so that destroy's stop is seen quickly even when it
 * lands between two receives. */
#define CTL_THREAD_POLL_MS 100

static void *server_thread(void *arg)
{
    duet_ctl_server_t *s = arg;
    while (!atomic_load(&s->stopping)) {
        duet_status_t st = server_poll(s, duet_deadline_after_ms(CTL_THREAD_POLL_MS), NULL);
        if (st == DUET_ERR_PEER)
            break; /* cancelled or closed by destroy */
        if (st) {
            duet_warn("ctl %s: serving failed: %s", s->c.url, duet_status_str(st));
            nng_msleep(10);
        }
    }
    return NULL;
}

duet_status_t duet_ctl_server_start_thread(duet_ctl_server_t *s, duet_err_t *err)
{
    if (s->threaded)
        return duet_err_set(err, DUET_ERR_STATE, "ctl %s: already serving on a thread", s->c.url);
    if (pthread_create(&s->thread, NULL, server_thread, s) != 0)
        return duet_err_set(err, DUET_ERR_NOMEM, "ctl %s: cannot start the server thread", s->c.url);
    s->threaded = 1;
    return DUET_OK;
}

void duet_ctl_server_stats(const duet_ctl_server_t *s, duet_ctl_server_stats_t *out)
{
    out->requests = atomic_load(&s->requests);
    out->bad_requests = atomic_load(&s->bad_requests);
    out->handler_errors = atomic_load(&s->handler_errors);
    out->bad_replies = atomic_load(&s->bad_replies);
    out->send_failures = atomic_load(&s->send_failures);
}

void duet_ctl_server_destroy(duet_ctl_server_t **sp)
{
    duet_ctl_server_t *s = sp ? *sp : NULL;
    if (!s)
        return;
    *sp = NULL;
    /* stop the serving thread before closing, so that no receive is pending
     * on the socket when it closes (libnng 1.5.2 can hang otherwise) */
    if (s->threaded) {
        atomic_store(&s->stopping, 1);
        nng_aio_cancel(s->recv_aio);
        pthread_join(s->thread, NULL);
    }
    if (close_bounded(s->sock, s->c.url) != 0)
        return; /* left behind: NNG may still complete our aios */
    keeper_stop(&s->keep);
    nng_aio_free(s->recv_aio);
    nng_aio_free(s->send_aio);
    free(s);
}

/* ------------------------------------------------------------------ client */

/* Contexts are opened on demand and kept until the socket closes, never
 * closed one by one: libnng 1.5.2 can free a context while its timer thread
 * still holds it (nng_ctx_close racing the aio expiry: a use after free seen
 * under valgrind, and a router crash in nng:aio:expire).  A req context whose
 * last call timed out is safe to reuse: the next send abandons the old
 * request and a late reply to it is discarded. */
#define CTL_CTX_POOL_MAX 1024

/* The dialers of a client or pusher (conn_redial_stuck adds one when the others stopped). */
#define CTL_MAX_DIALERS 4
typedef struct {
    nng_dialer d;
    int64_t stat;        /* the sum of its counters at the last look (-1: none) */
    uint64_t changed_ns; /* when that sum last moved (or the dialer was made) */
} dialer_slot_t;

/* What a client or pusher keeps of its one connection (its dialers make one at a time).  A
 * connection on which no reply has ever come is closed over ipc, and the dialer dials again, when
 * a call times out (a delivery waits) after it was up for CTL_SILENT_PIPE_MS: a server's listener
 * that libnng 1.5.2 stopped (above) completes the handshake of the connections it took and never
 * hands them to the server, so a client that dialed just then would wait for ever on a connection
 * that looks up, while the path already leads to a new listener.  (On a healthy server the same
 * rule only ends a connection whose first call the server never answered.) */
typedef struct {
    atomic_uint pipe_id;      /* the connection now, 0: none */
    _Atomic uint64_t up_ns;   /* since when it is up */
    _Atomic uint64_t down_ns; /* when the last connection went away (the watch's start at first) */
    atomic_uint answered;     /* the last connection a reply came on */
    _Atomic uint64_t ans_ns;  /* when a reply last came */
    atomic_uint dropped;      /* the last one conn_drop_silent closed */
    int ipc;
    uint64_t created_ns;
    /* the dialers (conn_redial_stuck) */
    nng_socket sock;
    const char *url;
    pthread_mutex_t rmu; /* one look at a time; guards dl, n_dl */
    dialer_slot_t dl[CTL_MAX_DIALERS];
    int n_dl;
    _Atomic uint64_t redial_ns; /* the last look */
    uint64_t stuck_ns;          /* no connection this long: the dialers are looked at */
} conn_watch_t;

static atomic_ulong g_client_redials, g_dialer_revivals;

unsigned long duet_ctl_client_redials(void) { return atomic_load(&g_client_redials); }
unsigned long duet_ctl_dialer_revivals(void) { return atomic_load(&g_dialer_revivals); }

/* No connection for this long (and at least four of the longest waits between redials) makes
 * conn_redial_stuck look at the dialers. */
#define CTL_DIALER_STUCK_MS 1000
/* A dialer whose counters have not moved for this long is stopped for good: longer than libnng's
 * 10 s bound on a connection's handshake, during which a live dialer's counters stay still too. */
#define CTL_DIALER_DEAD_MS 12000

static void conn_watch_init(conn_watch_t *w, nng_socket sock, const char *url, const duet_ctl_opts_t *o)
{
    w->ipc = strncmp(url, "ipc://", 6) == 0;
    w->created_ns = duet_time_ns();
    atomic_store(&w->down_ns, w->created_ns);
    w->sock = sock;
    w->url = url;
    pthread_mutex_init(&w->rmu, NULL);
    uint64_t rmax = o->reconnect_max_ms ? o->reconnect_max_ms : CTL_DEFAULT_RECONNECT_MAX_MS;
    w->stuck_ns = (4 * rmax > CTL_DIALER_STUCK_MS ? 4 * rmax : CTL_DIALER_STUCK_MS) * 1000000ull;
}

/* A dialer more (non-blocking: it keeps redialling until a server is there); under rmu. */
static int conn_watch_add_dialer(conn_watch_t *w)
{
    dialer_slot_t *s = &w->dl[w->n_dl];
    int rv = nng_dial(w->sock, w->url, &s->d, NNG_FLAG_NONBLOCK);
    if (rv == 0) {
        s->stat = -1;
        s->changed_ns = duet_time_ns();
        w->n_dl++;
    }
    return rv;
}

/* The first dial. */
static int conn_watch_dial(conn_watch_t *w)
{
    pthread_mutex_lock(&w->rmu);
    int rv = conn_watch_add_dialer(w);
    pthread_mutex_unlock(&w->rmu);
    return rv;
}

/* The req socket of a client or pusher (`what`: "req" or "event", for the error) on `cm`'s url: never
 * resending, since a command (Reserve, Prefill) must not run twice because a reply was slow (with
 * resending off, NNG fails a request whose connection breaks with NNG_ECONNRESET instead of
 * requeueing it); its pipe events to `cb`; watched by `w` and dialled.  Closed again on failure. */
static duet_status_t req_open_dial(nng_socket *sock, conn_watch_t *w, const common_t *cm, const duet_ctl_opts_t *o,
                                   nng_pipe_cb cb, void *arg, const char *what, duet_err_t *err)
{
    char msg[48];
    int rv = nng_req0_open(sock);
    if (rv)
        return nng_fail(err, rv, cm->url, "cannot open a req socket");
    if ((rv = nng_socket_set_ms(*sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) ||
        (rv = set_recv_limit(*sock, &cm->lim)) || (rv = set_reconnect(*sock, o)) ||
        (rv = nng_pipe_notify(*sock, NNG_PIPE_EV_ADD_POST, cb, arg)) ||
        (rv = nng_pipe_notify(*sock, NNG_PIPE_EV_REM_POST, cb, arg))) {
        snprintf(msg, sizeof msg, "cannot set up the %s socket", what);
        duet_status_t st = nng_fail(err, rv, cm->url, msg);
        nng_close(*sock);
        return st;
    }
    conn_watch_init(w, *sock, cm->url, o);
    if ((rv = conn_watch_dial(w))) {
        duet_status_t st = nng_fail(err, rv, cm->url, "cannot dial");
        pthread_mutex_destroy(&w->rmu);
        nng_close(*sock);
        return st;
    }
    return DUET_OK;
}

/* From the socket's pipe events (NNG's threads). */
static void conn_watch_event(conn_watch_t *w, nng_pipe pipe, nng_pipe_ev ev)
{
    if (ev == NNG_PIPE_EV_ADD_POST) {
        atomic_store(&w->up_ns, duet_time_ns());
        atomic_store(&w->pipe_id, nng_pipe_id(pipe));
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        uint32_t id = (uint32_t)nng_pipe_id(pipe);
        atomic_compare_exchange_strong(&w->pipe_id, &id, 0);
        if (!atomic_load(&w->pipe_id))
            atomic_store(&w->down_ns, duet_time_ns());
    }
}

/* The sum of dialer d's counters in the snapshot root (its connections and each kind of failed
 * attempt), or -1 when NNG keeps none for it (closed). */
static int64_t dialer_stat_sum(nng_stat *root, nng_dialer d)
{
    nng_stat *ds = root ? stat_find_scope(root, "dialer", nng_dialer_id(d)) : NULL;
    if (!ds)
        return -1;
    int64_t sum = 0;
    for (nng_stat *c = nng_stat_child(ds); c; c = nng_stat_next(c))
        if (nng_stat_type(c) == NNG_STAT_COUNTER)
            sum += (int64_t)nng_stat_value(c);
    return sum;
}

/* libnng 1.5.2's dialer stops for good when a connection attempt ends in NNG_ECLOSED
 * (dialer_connect_cb: "No further action"), and over ipc a write of the SP header to a server
 * whose process is ending fails with EPIPE, which NNG reads as NNG_ECLOSED: a client or pusher
 * whose server restarted at that moment would never connect again (seen as a new puller that got
 * no event for 5 s while its pusher waited for a connection, tests/net/test_ctl.c
 * test_puller_churn under load).  When there has been no connection for stuck_ns (since the last
 * one's end, the last reply, the last look or the watch's start), the dialers' counters are read
 * (NNG's statistics): a live dialer's move with every attempt (one each 250 ms at most while no
 * server is there).  If none moved for stuck_ns, a dialer is added (at most CTL_MAX_DIALERS).  A
 * dialer is closed only once its counters have stood still for CTL_DIALER_DEAD_MS, past the 10 s
 * that libnng gives a handshake: closing a dialer whose connection is in its handshake lets
 * libnng 1.5.2 lock a freed mutex ("panic: pthread_mutex_lock: Invalid argument", seen when the
 * first form of this closed the dialer after one second).  Called only where nothing of its own
 * is in flight on a connection (there is none). */
static void conn_redial_stuck(conn_watch_t *w)
{
    if (atomic_load(&w->pipe_id))
        return;
    uint64_t now = duet_time_ns(), since = atomic_load(&w->down_ns), r = atomic_load(&w->redial_ns),
             u = atomic_load(&w->up_ns), a = atomic_load(&w->ans_ns);
    if (r > since)
        since = r;
    if (u > since) /* a reply counts as a connection too: libnng 1.5.2 may run ADD_POST late */
        since = u;
    if (a > since)
        since = a;
    if (now - since < w->stuck_ns || pthread_mutex_trylock(&w->rmu) != 0)
        return;
    if (atomic_load(&w->pipe_id) || duet_time_ns() - atomic_load(&w->redial_ns) < w->stuck_ns) {
        pthread_mutex_unlock(&w->rmu);
        return;
    }
    nng_stat *root = NULL;
    if (nng_stats_get(&root) != 0)
        root = NULL;
    now = duet_time_ns();
    int alive = 0;
    for (int i = 0; i < w->n_dl;) {
        dialer_slot_t *s = &w->dl[i];
        int64_t v = dialer_stat_sum(root, s->d);
        if (v != s->stat) {
            s->stat = v;
            s->changed_ns = now;
        }
        if (now - s->changed_ns > (uint64_t)CTL_DIALER_DEAD_MS * 1000000u) {
            nng_dialer_close(s->d); /* stopped for good: no handshake of its own can be running */
            w->dl[i] = w->dl[--w->n_dl];
            continue;
        }
        alive |= now - s->changed_ns < w->stuck_ns;
        i++;
    }
    if (root)
        nng_stats_free(root);
    if (!alive && w->n_dl < CTL_MAX_DIALERS && conn_watch_add_dialer(w) == 0 &&
        atomic_fetch_add(&g_dialer_revivals, 1) == 0)
        duet_warn("ctl %s: no connection for %llu ms and no dialer attempting: one more dialer (later ones "
                  "counted)",
                  w->url, (unsigned long long)(w->stuck_ns / 1000000u));
    atomic_store(&w->redial_ns, now);
    pthread_mutex_unlock(&w->rmu);
}

/* For tests: the dialers stopped as libnng 1.5.2 stops one (closed). */
static void conn_watch_test_stop_dialer(conn_watch_t *w)
{
    pthread_mutex_lock(&w->rmu);
    for (int i = 0; i < w->n_dl; i++)
        nng_dialer_close(w->dl[i].d);
    pthread_mutex_unlock(&w->rmu);
}

/* A reply (an answer) came in m; 0 when it came on a connection conn_drop_silent has closed
 * (closing is not at once: a slow server's reply can still come on it), which does not count. */
static int conn_watch_answered(conn_watch_t *w, nng_msg *m)
{
    uint32_t id = (uint32_t)nng_pipe_id(nng_msg_get_pipe(m));
    if (id == atomic_load(&w->dropped))
        return 0;
    atomic_store(&w->answered, id);
    atomic_store(&w->ans_ns, duet_time_ns());
    return 1;
}

/* Whether the connection now is not one that answered before (none yet counts). */
static int conn_unproven(conn_watch_t *w)
{
    uint32_t id = atomic_load(&w->pipe_id);
    return !id || id != atomic_load(&w->answered);
}

/* The rule above; 1 when it closed the connection. */
static int conn_drop_silent(conn_watch_t *w, const char *url)
{
    uint32_t id = atomic_load(&w->pipe_id);
    if (!w->ipc || !id || id == atomic_load(&w->answered) ||
        duet_time_ns() - atomic_load(&w->up_ns) < (uint64_t)CTL_SILENT_PIPE_MS * 1000000u ||
        !atomic_compare_exchange_strong(&w->pipe_id, &id, 0))
        return 0;
    atomic_store(&w->dropped, id);
    nng_pipe p = NNG_PIPE_INITIALIZER;
    p.id = id;
    nng_pipe_close(p);
    if (atomic_fetch_add(&g_client_redials, 1) == 0)
        duet_warn("ctl %s: no reply ever came on the connection: closed, dialing again (later ones counted)", url);
    return 1;
}

/* A client or pusher closed just after it was made may close its connection during the SP
 * handshake, which is what stops a libnng 1.5.2 ipc listener: a fresh one (under
 * CTL_FRESH_CLOSE_MS old) first waits, that long at most, for its connection to come up. */
#define CTL_FRESH_CLOSE_MS 300
static void conn_wait_fresh(conn_watch_t *w)
{
    uint64_t until = w->created_ns + (uint64_t)CTL_FRESH_CLOSE_MS * 1000000u;
    while (w->ipc && !atomic_load(&w->pipe_id) && duet_time_ns() < until)
        nng_msleep(2);
}

#define CTL_CLIENT_PIPES 8 /* connections a client tracks by id */
struct duet_ctl_client {
    common_t c;
    nng_socket sock;
    pthread_mutex_t mu;   /* guards the context pool */
    nng_ctx *pool;
    int n_pool, cap_pool;
    atomic_int n_pipes; /* connections to the server now (0 or 1 with one dialer) */
    pthread_mutex_t pmu; /* guards the ids below */
    unsigned pipe_ids[CTL_CLIENT_PIPES]; /* the connections counted (0: a free slot) */
    unsigned gone_ids[CTL_CLIENT_PIPES]; /* the last ones that closed, a ring */
    unsigned gone_next;
    atomic_int was_up;  /* a reply came once: the server was there (a connection a stopped listener
                           took, closed before it answered, is not a server that went away) */
    conn_watch_t watch;
};

/* The client's connections, counted from NNG's pipe events: a call while the server's
 * connection is gone (it closed, its process ended) fails at once with PEER, as a call whose
 * connection breaks under it does, rather than waiting for its deadline on a send that has no
 * pipe to go to (a router's Abort to a worker that ended held its call thread the full deadline).
 * The dialer keeps redialling; a server back on the address takes calls again. */
#define CTL_SEND_SLICE_MS 50
/* A connection counts from its ADD_POST, or from the first reply that came on it, to its
 * REM_POST.  libnng 1.5.2 runs REM_POST for every connection whose ADD_PRE ran, also one that
 * closed before its ADD_POST (a handshake cut short: common on a loaded host), and runs ADD_POST
 * on the thread that started the connection, which a loaded host may hold while requests and
 * replies already go over it.  A plain counter of the two events therefore read 0 under a live
 * connection (every call then failing at once with PEER), so the count goes by ids: an id that
 * came up once (by its event or a reply on it) and has not closed. */
static void client_pipe_up(duet_ctl_client_t *c, unsigned id)
{
    if (id == 0)
        return;
    pthread_mutex_lock(&c->pmu);
    int seen = 0, free_at = -1;
    for (int i = 0; i < CTL_CLIENT_PIPES; i++) {
        seen |= c->pipe_ids[i] == id || c->gone_ids[i] == id;
        if (free_at < 0 && c->pipe_ids[i] == 0)
            free_at = i;
    }
    if (!seen) {
        if (free_at >= 0) /* with one dialer there are one or two at a time */
            c->pipe_ids[free_at] = id;
        atomic_fetch_add(&c->n_pipes, 1);
    }
    pthread_mutex_unlock(&c->pmu);
}

static void client_pipe_event(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    duet_ctl_client_t *c = arg;
    unsigned id = (unsigned)nng_pipe_id(pipe);
    conn_watch_event(&c->watch, pipe, ev);
    if (ev == NNG_PIPE_EV_ADD_POST) {
        client_pipe_up(c, id);
    } else if (ev == NNG_PIPE_EV_REM_POST && id != 0) {
        pthread_mutex_lock(&c->pmu);
        c->gone_ids[c->gone_next++ % CTL_CLIENT_PIPES] = id;
        for (int i = 0; i < CTL_CLIENT_PIPES; i++)
            if (c->pipe_ids[i] == id) {
                c->pipe_ids[i] = 0;
                atomic_fetch_sub(&c->n_pipes, 1);
                break;
            }
        pthread_mutex_unlock(&c->pmu);
    }
}

static int client_ctx_get(duet_ctl_client_t *c, nng_ctx *ctx)
{
    pthread_mutex_lock(&c->mu);
    if (c->n_pool > 0) {
        *ctx = c->pool[--c->n_pool];
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    pthread_mutex_unlock(&c->mu);
    return nng_ctx_open(ctx, c->sock);
}

static void client_ctx_put(duet_ctl_client_t *c, nng_ctx ctx)
{
    pthread_mutex_lock(&c->mu);
    if (c->n_pool == c->cap_pool && c->cap_pool < CTL_CTX_POOL_MAX) {
        int cap = c->cap_pool ? c->cap_pool * 2 : 8;
        nng_ctx *np = realloc(c->pool, sizeof(nng_ctx) * (size_t)cap);
        if (np) {
            c->pool = np;
            c->cap_pool = cap;
        }
    }
    if (c->n_pool < c->cap_pool) {
        c->pool[c->n_pool++] = ctx;
        ctx.id = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (ctx.id)
        nng_ctx_close(ctx); /* more calls at once than the pool keeps: rare */
}

duet_status_t duet_ctl_client_create(const duet_ctl_opts_t *o, duet_ctl_client_t **out, duet_err_t *err)
{
    duet_status_t st;

    duet_ctl_client_t *c = DUET_NEW(duet_ctl_client_t);
    if (!c)
        return duet_err_set(err, DUET_ERR_NOMEM, "ctl client: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->pmu, NULL);
    if ((st = common_init(&c->c, o, err)))
        goto err_free;
    if ((st = req_open_dial(&c->sock, &c->watch, &c->c, o, client_pipe_event, c, "req", err)))
        goto err_free;
    *out = c;
    return DUET_OK;
err_free:
    free(c);
    return st;
}

/* Send `m` (consumed) and wait for the reply; `rid` is the request's or NULL. */
static duet_status_t client_exchange(duet_ctl_client_t *c, nng_msg *m, const char *rid, uint64_t deadline_ns,
                                     duet_envelope_t **reply, duet_err_t *err)
{
    nng_ctx ctx;
    nng_aio *aio = NULL;
    duet_envelope_t *rep = NULL;
    duet_status_t st;
    int rv;

    if (duet_time_ns() >= deadline_ns) {
        nng_msg_free(m);
        return duet_err_set(err, DUET_ERR_TIMEOUT, "%s: deadline passed before the call", c->c.url);
    }
    conn_redial_stuck(&c->watch);
    if (atomic_load(&c->was_up) && atomic_load(&c->n_pipes) <= 0) {
        nng_msg_free(m);
        return duet_err_set(err, DUET_ERR_PEER, "%s: the connection to the server closed and is not back", c->c.url);
    }
    if ((rv = nng_aio_alloc(&aio, NULL, NULL))) {
        nng_msg_free(m);
        return nng_fail(err, rv, c->c.url, "cannot allocate an aio");
    }
    if ((rv = client_ctx_get(c, &ctx))) {
        nng_msg_free(m);
        st = nng_fail(err, rv, c->c.url, "cannot open a context");
        goto err_aio;
    }
    nng_aio_set_msg(aio, m);
    /* the send in slices: a send waiting for a connection that closed meanwhile gives up (a timed
     * out send hands its message back and leaves the context ready for the next one) */
    for (;;) {
        nng_duration left = ms_until(deadline_ns);
        rv = aio_run(aio, left < CTL_SEND_SLICE_MS ? left : CTL_SEND_SLICE_MS, start_ctx_send, &ctx);
        if (rv != NNG_ETIMEDOUT || left <= CTL_SEND_SLICE_MS)
            break;
        conn_redial_stuck(&c->watch);
        if (atomic_load(&c->was_up) && atomic_load(&c->n_pipes) <= 0) {
            nng_msg_free(nng_aio_get_msg(aio));
            st =
                duet_err_set(err, DUET_ERR_PEER, "%s: request not sent: the connection to the server closed", c->c.url);
            goto err_ctx;
        }
    }
    if (rv) {
        nng_msg_free(nng_aio_get_msg(aio));
        st = nng_fail(err, rv, c->c.url, "request not sent");
        goto err_ctx;
    }
    if ((rv = aio_run(aio, ms_until(deadline_ns), start_ctx_recv, &ctx))) {
        if (rv == NNG_ETIMEDOUT)
            conn_drop_silent(&c->watch, c->c.url);
        st = nng_fail(err, rv, c->c.url, "no reply");
        goto err_ctx;
    }
    m = nng_aio_get_msg(aio);
    if (conn_watch_answered(&c->watch, m)) {
        client_pipe_up(c, (unsigned)nng_pipe_id(nng_msg_get_pipe(m))); /* before its ADD_POST, maybe */
        atomic_store(&c->was_up, 1);
    }
    st = duet_msg_decode(nng_msg_body(m), nng_msg_len(m), &c->c.lim, &rep, err);
    nng_msg_free(m);
    if (st) {
        duet_warn("ctl %s: refused a reply: %s", c->c.url, duet_err_text(err));
        goto err_ctx;
    }
    const char *rrid = duet_msg_rid(rep);
    if (rrid && rid != ctl_any_rid && (!rid || strcmp(rid, rrid) != 0)) {
        st = duet_err_set(err, DUET_ERR_PROTOCOL, "%s: reply is about rid %s, the request about %s", c->c.url, rrid,
                          rid ? rid : "none");
        duet_envelope_free(&rep);
        goto err_ctx;
    }
    *reply = rep;
    st = DUET_OK;
err_ctx:
    nng_aio_free(aio); /* waits for the aio to be done with the context */
    aio = NULL;
    client_ctx_put(c, ctx);
err_aio:
    if (aio)
        nng_aio_free(aio);
    return st;
}

duet_status_t duet_ctl_client_call(duet_ctl_client_t *c, const duet_envelope_t *req, uint64_t deadline_ns,
                                   duet_envelope_t **reply, duet_err_t *err)
{
    nng_msg *m = NULL;
    duet_status_t st = msg_encode(req, &c->c.lim, &m, err);
    if (st)
        return st;
    return client_exchange(c, m, duet_msg_rid(req), deadline_ns, reply, err);
}

duet_status_t duet_ctl_client_call_raw(duet_ctl_client_t *c, const void *buf, size_t len, uint64_t deadline_ns,
                                       duet_envelope_t **reply, duet_err_t *err)
{
    nng_msg *m;
    int rv = nng_msg_alloc(&m, len);
    if (rv)
        return nng_fail(err, rv, c->c.url, "cannot allocate a message");
    if (len)
        memcpy(nng_msg_body(m), buf, len);
    /* raw bytes are not decoded here, so the reply's rid cannot be checked against them */
    return client_exchange(c, m, ctl_any_rid, deadline_ns, reply, err);
}

void duet_ctl_client_destroy(duet_ctl_client_t **cp)
{
    duet_ctl_client_t *c = cp ? *cp : NULL;
    if (!c)
        return;
    *cp = NULL;
    conn_wait_fresh(&c->watch);
    if (close_bounded(c->sock, c->c.url) == 0) { /* closes the pooled contexts too */
        free(c->pool);
        pthread_mutex_destroy(&c->mu);
        pthread_mutex_destroy(&c->pmu);
        pthread_mutex_destroy(&c->watch.rmu);
        free(c);
    }
}

/* ------------------------------------------------------------------ events
 *
 * Events ride on req/rep, not on NNG's push/pull: libnng 1.5.2 (Debian's)
 * push0 can put a pipe that is closing back on its ready list when a send
 * completes while the puller disconnects, and the next send then follows
 * freed memory (a worker crashed that way whenever a router or driver went
 * away while it was sending; tests/net/test_ctl.c test_puller_churn).  req0
 * and rep0 guard their pipe lists against that race.
 *
 * The pusher keeps its own bounded queue (so a send never waits on the
 * network) and one thread that sends the queued events one at a time, each
 * answered by the puller with Ack once received: events from one pusher
 * arrive in order.  An event whose connection breaks while it is in flight
 * is lost (as with push/pull: at most once); the ones behind it wait for the
 * next connection. */

struct duet_ctl_pusher {
    common_t c;
    nng_socket sock;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t room; /* signalled when the queue has room (monotonic clock) */
    pthread_cond_t work; /* signalled when the queue has an event or we stop */
    pthread_cond_t idle; /* signalled when a delivery ends (monotonic clock) */
    nng_msg **q;         /* ring of encoded events */
    uint32_t cap, head, n;
    int stopping;
    int taken;           /* events taken from the queue and not yet answered (a delivery, under mu) */
    nng_aio *inflight;   /* the delivery's aio while one is running (under mu) */
    nng_ctx ctx;         /* the delivery thread's context, kept until the socket closes */
    int have_ctx;
    conn_watch_t watch;  /* a delivery that waits on a connection that never answered: conn_drop_silent */
    pthread_mutex_t dmu; /* an operation's end (pusher_aio_done) */
    pthread_cond_t dcv;  /* monotonic clock */
    int ddone;
};

struct duet_ctl_puller {
    common_t c;
    nng_socket sock;
    keeper_t keep;
    pthread_mutex_t mu;  /* one receive at a time on the one context */
    nng_ctx ctx;         /* kept until the socket closes (see CTL_CTX_POOL_MAX) */
    int have_ctx;
    duet_envelope_t **pend; /* events of a batch not yet returned, in order */
    size_t n_pend, i_pend;
};

static void pusher_pipe_event(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    duet_ctl_pusher_t *p = arg;
    conn_watch_event(&p->watch, pipe, ev);
}

static void pusher_aio_done(void *arg)
{
    duet_ctl_pusher_t *p = arg;
    pthread_mutex_lock(&p->dmu);
    p->ddone = 1;
    pthread_cond_signal(&p->dcv);
    pthread_mutex_unlock(&p->dmu);
}

/* Start one operation of a delivery unless the pusher is stopping, then
 * wait for it.  Starting under the mutex orders it against destroy, which
 * lets a running operation end (or cancels it after a grace) before it
 * closes the socket: libnng 1.5.2 can hang in nng_close() when a context
 * operation is still pending.  *silent: a receive whose connection was
 * closed by conn_drop_silent. */
static int pusher_op(duet_ctl_pusher_t *p, nng_aio *aio, void (*start)(void *, nng_aio *), nng_ctx *ctx, int *silent)
{
    pthread_mutex_lock(&p->mu);
    if (p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return NNG_ECLOSED;
    }
    /* no timeout: the send waits for a connection, the receive for the
     * puller to take the event; destroy cancels either */
    nng_aio_set_timeout(aio, NNG_DURATION_INFINITE);
    pthread_mutex_lock(&p->dmu);
    p->ddone = 0;
    pthread_mutex_unlock(&p->dmu);
    start(ctx, aio);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&p->dmu);
    while (!p->ddone) {
        uint64_t at = duet_deadline_after_ms(CTL_LISTEN_CHECK_MS);
        struct timespec ts = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
        if (pthread_cond_timedwait(&p->dcv, &p->dmu, &ts) == ETIMEDOUT && !p->ddone) {
            pthread_mutex_unlock(&p->dmu);
            if (!silent) /* a send waiting for a connection: nothing of it is in flight */
                conn_redial_stuck(&p->watch);
            else if (!*silent)
                *silent = conn_drop_silent(&p->watch, p->c.url);
            pthread_mutex_lock(&p->dmu);
        }
    }
    pthread_mutex_unlock(&p->dmu);
    return nng_aio_result(aio);
}

/* Deliver one event (consumed) and wait for the puller's answer.  On a connection that never
 * answered, a copy is kept: if the connection is closed as silent (conn_drop_silent), the
 * puller never took the event, and it goes again on the next connection (twice at most). */
static int pusher_deliver(duet_ctl_pusher_t *p, nng_msg *m)
{
    nng_aio *aio;
    int rv = nng_aio_alloc(&aio, pusher_aio_done, p);
    if (rv) {
        nng_msg_free(m);
        return rv;
    }
    if (!p->have_ctx && (rv = nng_ctx_open(&p->ctx, p->sock))) {
        nng_msg_free(m);
        nng_aio_free(aio);
        return rv;
    }
    p->have_ctx = 1;
    nng_ctx ctx = p->ctx;
    pthread_mutex_lock(&p->mu);
    p->inflight = aio;
    pthread_mutex_unlock(&p->mu);
    for (int attempt = 0;; attempt++) {
        nng_msg *copy = NULL;
        if (p->watch.ipc && attempt < 2 && conn_unproven(&p->watch) && nng_msg_dup(&copy, m) != 0)
            copy = NULL;
        int silent = 0;
        nng_aio_set_msg(aio, m);
        if ((rv = pusher_op(p, aio, start_ctx_send, &ctx, NULL))) {
            nng_msg_free(nng_aio_get_msg(aio));
        } else if ((rv = pusher_op(p, aio, start_ctx_recv, &ctx, &silent)) == 0) {
            nng_msg *r = nng_aio_get_msg(aio);
            (void)conn_watch_answered(&p->watch, r);
            duet_envelope_t *reply = NULL;
            duet_err_t err = {0};
            if (duet_msg_decode(nng_msg_body(r), nng_msg_len(r), &p->c.lim, &reply, &err) != DUET_OK)
                duet_warn("ctl %s: the puller's answer does not decode: %s", p->c.url, duet_err_text(&err));
            else if (duet_ctl_reply_status(reply, &err) != DUET_OK)
                duet_warn("ctl %s: the puller refused an event: %s", p->c.url, duet_err_text(&err));
            duet_envelope_free(&reply);
            nng_msg_free(r);
        }
        if (rv && silent && copy && rv != NNG_ECLOSED && rv != NNG_ECANCELED) {
            m = copy; /* the silent connection's event, again */
            continue;
        }
        if (copy)
            nng_msg_free(copy);
        break;
    }
    pthread_mutex_lock(&p->mu);
    p->inflight = NULL;
    pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->mu);
    nng_aio_free(aio);
    return rv;
}

/* The events taken for a delivery are answered (or lost): a flush may end. */
static void pusher_taken_done(duet_ctl_pusher_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->taken = 0;
    pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->mu);
}

static void *pusher_main(void *arg)
{
    duet_ctl_pusher_t *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->n && !p->stopping)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stopping) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        /* take what is queued, up to a batch: one round trip carries them all (a decode step's
         * tokens for every request would otherwise cost one acknowledged round trip each) */
        nng_msg *batch[CTL_BATCH_MAX] = {NULL};
        size_t nb = 0, bytes = 0;
        size_t budget = p->c.lim.max_message_bytes < CTL_BATCH_BYTES ? p->c.lim.max_message_bytes : CTL_BATCH_BYTES;
        while (p->n && nb < CTL_BATCH_MAX) {
            nng_msg *m = p->q[p->head];
            size_t len = nng_msg_len(m) + 10;
            if (nb && bytes + len + 1 > budget)
                break;
            batch[nb++] = m;
            bytes += len;
            p->head = (p->head + 1) % p->cap;
            p->n--;
        }
        p->taken = 1;
        pthread_cond_broadcast(&p->room);
        pthread_mutex_unlock(&p->mu);

        nng_msg *m = batch[0];
        if (nb > 1) {
            nng_msg *bm = NULL;
            if (nng_msg_alloc(&bm, 0) == 0 && nng_msg_append(bm, (const uint8_t[]){CTL_BATCH_MAGIC}, 1) == 0) {
                int ok = 1;
                for (size_t i = 0; i < nb && ok; i++) {
                    uint8_t v[10];
                    size_t len = nng_msg_len(batch[i]), k = 0;
                    do {
                        v[k++] = (uint8_t)((len & 0x7f) | (len > 0x7f ? 0x80 : 0));
                        len >>= 7;
                    } while (len);
                    ok = nng_msg_append(bm, v, k) == 0 && nng_msg_append(bm, nng_msg_body(batch[i]), nng_msg_len(batch[i])) == 0;
                }
                if (ok) {
                    for (size_t i = 0; i < nb; i++)
                        nng_msg_free(batch[i]);
                    m = bm;
                    nb = 1;
                } else {
                    nng_msg_free(bm);
                }
            } else if (bm) {
                nng_msg_free(bm);
            }
            if (nb > 1) { /* no memory for a batch: one at a time */
                int rv = 0;
                for (size_t i = 0; i < nb; i++)
                    rv = rv == NNG_ECLOSED || rv == NNG_ECANCELED ? (nng_msg_free(batch[i]), rv) : pusher_deliver(p, batch[i]);
                pusher_taken_done(p);
                if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
                    break;
                continue;
            }
        }

        int rv = pusher_deliver(p, m);
        pusher_taken_done(p);
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
            break; /* destroy */
        if (rv)
            duet_warn("ctl %s: an event was lost in flight: %s", p->c.url, nng_strerror(rv));
    }
    return NULL;
}

duet_status_t duet_ctl_pusher_create(const duet_ctl_opts_t *o, duet_ctl_pusher_t **out, duet_err_t *err)
{
    duet_status_t st;
    pthread_condattr_t ca;

    duet_ctl_pusher_t *p = DUET_NEW(duet_ctl_pusher_t);
    if (!p)
        return duet_err_set(err, DUET_ERR_NOMEM, "ctl pusher: out of memory");
    if ((st = common_init(&p->c, o, err)))
        goto err_free;
    p->cap = o->queue_len ? o->queue_len : CTL_DEFAULT_QUEUE_LEN;
    if (p->cap > CTL_MAX_QUEUE_LEN)
        p->cap = CTL_MAX_QUEUE_LEN;
    if (!(p->q = duet_calloc(p->cap, sizeof *p->q))) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "ctl pusher: out of memory");
        goto err_free;
    }
    if ((st = req_open_dial(&p->sock, &p->watch, &p->c, o, pusher_pipe_event, p, "event", err)))
        goto err_queue;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->dmu, NULL);
    pthread_cond_init(&p->dcv, &ca);
    pthread_cond_init(&p->room, &ca);
    pthread_cond_init(&p->idle, &ca);
    pthread_cond_init(&p->work, NULL);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&p->thread, NULL, pusher_main, p) != 0) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "ctl %s: cannot start the pusher thread", p->c.url);
        goto err_sync;
    }
    p->thread_started = 1;
    *out = p;
    return DUET_OK;
err_sync:
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->room);
    pthread_cond_destroy(&p->dcv);
    pthread_mutex_destroy(&p->dmu);
    pthread_mutex_destroy(&p->mu);
    nng_close(p->sock);
    pthread_mutex_destroy(&p->watch.rmu);
err_queue:
    free(p->q);
err_free:
    free(p);
    return st;
}

duet_status_t duet_ctl_pusher_send(duet_ctl_pusher_t *p, const duet_envelope_t *ev, uint64_t deadline_ns,
                                   duet_err_t *err)
{
    nng_msg *m = NULL;
    duet_status_t st = msg_encode(ev, &p->c.lim, &m, err);
    if (st)
        return st;
    struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
    pthread_mutex_lock(&p->mu);
    while (p->n == p->cap && !p->stopping && duet_time_ns() < deadline_ns)
        pthread_cond_timedwait(&p->room, &p->mu, &ts);
    if (p->stopping) {
        st = duet_err_set(err, DUET_ERR_PEER, "%s: the pusher is closed", p->c.url);
    } else if (p->n == p->cap) {
        st = duet_err_set(err, DUET_ERR_BUSY, "%s: event queue full (%u events; puller slow or away)", p->c.url,
                          p->cap);
    } else {
        p->q[(p->head + p->n) % p->cap] = m;
        p->n++;
        m = NULL;
        pthread_cond_signal(&p->work);
    }
    pthread_mutex_unlock(&p->mu);
    if (m)
        nng_msg_free(m);
    return st;
}

duet_status_t duet_ctl_pusher_flush(duet_ctl_pusher_t *p, uint64_t deadline_ns, duet_err_t *err)
{
    struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
    duet_status_t st = DUET_OK;
    pthread_mutex_lock(&p->mu);
    while ((p->n || p->taken) && !p->stopping && duet_time_ns() < deadline_ns)
        pthread_cond_timedwait(&p->idle, &p->mu, &ts);
    if (p->n || p->taken)
        st = duet_err_set(err, p->stopping ? DUET_ERR_PEER : DUET_ERR_TIMEOUT,
                          "%s: events not delivered (%u queued%s; %s)", p->c.url, p->n,
                          p->taken ? ", more in flight" : "",
                          p->stopping ? "the pusher is closed" : "the puller did not take them in time");
    pthread_mutex_unlock(&p->mu);
    return st;
}

void duet_ctl_pusher_destroy(duet_ctl_pusher_t **pp)
{
    duet_ctl_pusher_t *p = pp ? *pp : NULL;
    if (!p)
        return;
    /* Stop the sending thread first, so that nothing is pending on the
     * socket when it closes.  A delivery in progress gets a moment to end
     * on its own: with libnng 1.5.2, cancelling (or closing) while the
     * puller's answer is arriving can leave the connection unable to close
     * (reproduced: a close right after the answer hangs within a hundred
     * rounds; 20 ms later it never did).  A puller that does not answer
     * within the grace is cancelled. */
    uint64_t grace = duet_deadline_after_ms(CTL_PUSHER_GRACE_MS);
    struct timespec ts = {(time_t)(grace / 1000000000u), (long)(grace % 1000000000u)};
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->room);
    while (p->inflight && duet_time_ns() < grace)
        pthread_cond_timedwait(&p->idle, &p->mu, &ts);
    if (p->inflight)
        nng_aio_cancel(p->inflight);
    pthread_mutex_unlock(&p->mu);
    if (p->thread_started)
        pthread_join(p->thread, NULL);
    *pp = NULL;
    conn_wait_fresh(&p->watch);
    if (close_bounded(p->sock, p->c.url) != 0)
        return; /* left behind */
    for (uint32_t i = 0; i < p->n; i++)
        nng_msg_free(p->q[(p->head + i) % p->cap]);
    free(p->q);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->room);
    pthread_cond_destroy(&p->dcv);
    pthread_mutex_destroy(&p->dmu);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->watch.rmu);
    free(p);
}

duet_status_t duet_ctl_puller_create(const duet_ctl_opts_t *o, duet_ctl_puller_t **out, duet_err_t *err)
{
    duet_status_t st;
    int rv;

    duet_ctl_puller_t *p = DUET_NEW(duet_ctl_puller_t);
    if (!p)
        return duet_err_set(err, DUET_ERR_NOMEM, "ctl puller: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    if ((st = common_init(&p->c, o, err)))
        goto err_free;
    if ((rv = nng_rep0_open(&p->sock))) {
        st = nng_fail(err, rv, p->c.url, "cannot open a rep socket");
        goto err_free;
    }
    if ((rv = set_recv_limit(p->sock, &p->c.lim))) {
        st = nng_fail(err, rv, p->c.url, "cannot set up the event socket");
        goto err_close;
    }
    if ((rv = keeper_start(&p->keep, p->sock, p->c.url))) {
        st = nng_fail(err, rv, p->c.url, "cannot listen");
        goto err_close;
    }
    *out = p;
    return DUET_OK;
err_close:
    nng_close(p->sock);
err_free:
    free(p);
    return st;
}

/* Decode a batch (after its magic byte) into p->pend; every event must decode, or none is kept. */
static duet_status_t puller_unbatch(duet_ctl_puller_t *p, const uint8_t *b, size_t len, duet_err_t *err)
{
    size_t off = 0, n = 0, cap = 0;
    duet_envelope_t **v = NULL;
    duet_status_t st = DUET_OK;
    while (off < len && st == DUET_OK) {
        uint64_t l = 0;
        int shift = 0;
        for (;;) {
            if (off >= len || shift > 63) {
                st = duet_err_set(err, DUET_ERR_PARSE, "%s: a batch of events ends inside a length", p->c.url);
                break;
            }
            uint8_t c = b[off++];
            l |= (uint64_t)(c & 0x7f) << shift;
            shift += 7;
            if (!(c & 0x80))
                break;
        }
        if (st != DUET_OK)
            break;
        if (l > len - off) {
            st = duet_err_set(err, DUET_ERR_PARSE, "%s: a batch of events ends inside an event (%llu bytes)",
                              p->c.url, (unsigned long long)l);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            duet_envelope_t **nv = realloc(v, sizeof *v * cap);
            if (!nv) {
                st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        duet_envelope_t *e = NULL;
        st = duet_msg_decode(b + off, (size_t)l, &p->c.lim, &e, err);
        if (st == DUET_OK)
            v[n++] = e;
        off += (size_t)l;
    }
    if (st != DUET_OK) {
        for (size_t i = 0; i < n; i++)
            duet_envelope_free(&v[i]);
        free(v);
        return st;
    }
    free(p->pend);
    p->pend = v;
    p->n_pend = n;
    p->i_pend = 0;
    return DUET_OK;
}

duet_status_t duet_ctl_puller_recv(duet_ctl_puller_t *p, uint64_t deadline_ns, duet_envelope_t **ev,
                                   duet_err_t *err)
{
    nng_aio *aio;
    duet_envelope_t *e = NULL, *answer = NULL;
    duet_status_t st;
    int rv = nng_aio_alloc(&aio, NULL, NULL);
    if (rv)
        return nng_fail(err, rv, p->c.url, "cannot allocate an aio");
    pthread_mutex_lock(&p->mu);
    keeper_check(&p->keep); /* receives are one at a time (mu) */
    if (p->i_pend < p->n_pend) { /* the rest of a batch first */
        *ev = p->pend[p->i_pend];
        p->pend[p->i_pend++] = NULL;
        if (p->i_pend == p->n_pend)
            p->i_pend = p->n_pend = 0;
        pthread_mutex_unlock(&p->mu);
        nng_aio_free(aio);
        return DUET_OK;
    }
    if (!p->have_ctx && (rv = nng_ctx_open(&p->ctx, p->sock))) {
        pthread_mutex_unlock(&p->mu);
        nng_aio_free(aio);
        return nng_fail(err, rv, p->c.url, "cannot open a context");
    }
    p->have_ctx = 1;
    nng_ctx ctx = p->ctx;
    if ((rv = aio_run(aio, ms_until(deadline_ns), start_ctx_recv, &ctx))) {
        st = nng_fail(err, rv, p->c.url, "no event");
        goto out;
    }
    nng_msg *m = nng_aio_get_msg(aio);
    keeper_touch(&p->keep, m);
    size_t len = nng_msg_len(m);
    duet_msg_origin_t o = {p->c.sender_id, NULL, 0};
    const uint8_t *body = nng_msg_body(m);
    if (len > 0 && body[0] == CTL_BATCH_MAGIC) {
        st = puller_unbatch(p, body + 1, len - 1, err);
        if (st == DUET_OK && p->n_pend == 0)
            st = duet_err_set(err, DUET_ERR_PARSE, "%s: an empty batch of events", p->c.url);
        if (st == DUET_OK) {
            e = p->pend[p->i_pend];
            p->pend[p->i_pend++] = NULL;
            if (p->i_pend == p->n_pend)
                p->i_pend = p->n_pend = 0;
        }
    } else {
        st = duet_msg_decode(body, len, &p->c.lim, &e, err);
    }
    if (st) {
        duet_warn("ctl %s: dropped an event of %zu bytes: %s", p->c.url, len, duet_err_text(err));
        duet_msg_new_error(&o, st, err->msg, &answer);
    } else {
        duet_msg_new_ack(&o, &answer);
    }
    /* answer at once (the pusher sends its next event on it); a lost answer
     * only delays that pusher until its connection is redialled */
    size_t n;
    duet_err_t aerr = {0};
    if (answer && duet_msg_encoded_size(answer, &p->c.lim, &n, &aerr) == DUET_OK && nng_msg_realloc(m, n) == 0) {
        duet_msg_pack(answer, nng_msg_body(m));
        nng_aio_set_msg(aio, m);
        if (aio_run(aio, CTL_REPLY_TIMEOUT_MS, start_ctx_send, &ctx) != 0)
            nng_msg_free(nng_aio_get_msg(aio));
    } else {
        nng_msg_free(m);
    }
    duet_envelope_free(&answer);
    if (st == DUET_OK)
        *ev = e;
out:
    nng_aio_free(aio);
    pthread_mutex_unlock(&p->mu);
    return st;
}

duet_status_t duet_ctl_puller_fd(duet_ctl_puller_t *p, int *fd)
{
    return duet_ctl_status_from_nng(nng_socket_get_int(p->sock, NNG_OPT_RECVFD, fd));
}

void duet_ctl_puller_destroy(duet_ctl_puller_t **pp)
{
    duet_ctl_puller_t *p = pp ? *pp : NULL;
    if (!p)
        return;
    *pp = NULL;
    if (close_bounded(p->sock, p->c.url) == 0) {
        keeper_stop(&p->keep);
        for (size_t i = p->i_pend; i < p->n_pend; i++)
            duet_envelope_free(&p->pend[i]);
        free(p->pend);
        pthread_mutex_destroy(&p->mu);
        free(p);
    }
}

void duet_ctl_client_test_stop_dialer(duet_ctl_client_t *c) { conn_watch_test_stop_dialer(&c->watch); }

void duet_ctl_pusher_test_stop_dialer(duet_ctl_pusher_t *p) { conn_watch_test_stop_dialer(&p->watch); }
