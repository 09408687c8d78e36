#include "worker_net.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "model.h"
#include "time_util.h"

#define EVENT_DEADLINE_MS 50
#define EVENTS_QUEUE_LEN 65536 /* --events */
#define SINK_QUEUE_LEN 16384   /* the others: a router gone for good fills it in hours of heartbeats */
#define REAP_WAIT_MS 2000

static atomic_int g_reaping; /* pushers being closed on threads of their own */

static void *reap_main(void *arg)
{
    duet_ctl_pusher_t *p = arg;
    duet_ctl_pusher_destroy(&p);
    atomic_fetch_sub(&g_reaping, 1);
    return NULL;
}

/* Close a pusher without waiting for it: destroy gives an event in flight a
 * grace and bounds its close, which the loop must not sit through. */
static void reap(duet_ctl_pusher_t *p)
{
    if (!p)
        return;
    pthread_t t;
    pthread_attr_t a;
    atomic_fetch_add(&g_reaping, 1);
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rv = pthread_create(&t, &a, reap_main, p);
    pthread_attr_destroy(&a);
    if (rv != 0) {
        atomic_fetch_sub(&g_reaping, 1);
        duet_ctl_pusher_destroy(&p);
    }
}

static duet_status_t open_sink(duet_worker_sink_t *k, const char *url, uint32_t queue_len, duet_err_t *err)
{
    duet_ctl_opts_t po = {.url = url, .queue_len = queue_len};
    duet_status_t st = duet_ctl_pusher_create(&po, &k->push, err);
    if (st != DUET_OK)
        return st;
    snprintf(k->url, sizeof k->url, "%s", url);
    k->refs = 0;
    k->refused = 0;
    k->last_used_ns = duet_time_ns();
    return DUET_OK;
}

static void close_sink(duet_worker_sink_t *k, int in_background)
{
    if (in_background)
        reap(k->push);
    else
        duet_ctl_pusher_destroy(&k->push);
    memset(k, 0, sizeof *k);
}

duet_status_t duet_worker_net_open_events(duet_worker_net_t *n, const char *events_url, uint32_t idle_ms,
                                          duet_err_t *err)
{
    n->idle_ms = idle_ms ? idle_ms : 600000;
    if (!events_url || !*events_url)
        return DUET_OK;
    if (strlen(events_url) > DUET_WORKER_URL_MAX)
        return duet_err_set(err, DUET_ERR_INVALID, "--events: longer than %d bytes", DUET_WORKER_URL_MAX);
    return open_sink(&n->sinks[DUET_WORKER_SINK_EVENTS], events_url, EVENTS_QUEUE_LEN, err);
}

duet_status_t duet_worker_net_open(duet_worker_net_t *n, const duet_worker_opts_t *o, duet_worker_engine_t *eng,
                                   duet_ctl_handler_fn handler, void *arg, duet_err_t *err)
{
    memset(n, 0, sizeof *n);
    duet_xfer_opts_t xo = {.name = o->id, .verify_checksums = o->verify_checksums};
    if (o->xfer_path)
        xo.data_path = strcmp(o->xfer_path, "rma") == 0  ? DUET_XFER_PATH_RMA
                       : strcmp(o->xfer_path, "am") == 0 ? DUET_XFER_PATH_AM
                                                         : DUET_XFER_PATH_AUTO;
    duet_status_t st = duet_worker_engine_xfer_prepare(eng, &xo, err);
    if (st == DUET_OK)
        st = duet_xfer_create(&xo, &n->xfer, err);
    if (st == DUET_OK)
        st = duet_worker_engine_xfer_register(eng, n->xfer, err);
    if (st == DUET_OK) {
        duet_ctl_opts_t co = {.url = o->listen, .sender_id = o->id};
        st = duet_ctl_server_create(&co, handler, arg, &n->srv, err);
    }
    if (st == DUET_OK)
        st = duet_worker_net_open_events(n, o->events, o->event_idle_ms, err);
    if (st != DUET_OK)
        duet_worker_net_close(n);
    return st;
}

duet_status_t duet_worker_net_sink_acquire(duet_worker_net_t *n, const char *url, const char *field, int *sink,
                                           duet_err_t *err)
{
    *sink = DUET_WORKER_SINK_EVENTS;
    if (!url || !*url)
        return DUET_OK;
    duet_status_t st = duet_msg_check_event_url(url, field, err);
    if (st != DUET_OK)
        return st;
    if (strlen(url) > DUET_WORKER_URL_MAX)
        return duet_err_set(err, DUET_ERR_INVALID, "%s: longer than %d bytes", field, DUET_WORKER_URL_MAX);
    duet_worker_sink_t *ev = &n->sinks[DUET_WORKER_SINK_EVENTS];
    if (ev->push && strcmp(ev->url, url) == 0)
        return DUET_OK;
    uint64_t now = duet_time_ns();
    int free_i = -1, lru = -1;
    for (int i = 1; i < DUET_WORKER_MAX_SINKS; i++) {
        duet_worker_sink_t *k = &n->sinks[i];
        if (!k->push) {
            if (free_i < 0)
                free_i = i;
            continue;
        }
        if (strcmp(k->url, url) == 0) {
            k->refs++;
            k->last_used_ns = now;
            *sink = i;
            return DUET_OK;
        }
        if (!k->refs && (lru < 0 || k->last_used_ns < n->sinks[lru].last_used_ns))
            lru = i;
    }
    if (free_i < 0) {
        if (lru < 0)
            return duet_err_set(err, DUET_ERR_BUSY,
                                "%s: every one of this worker's %d event sockets serves live requests", field,
                                DUET_WORKER_MAX_SINKS);
        duet_info("event socket %s: closed (the least recently used, for %s)", n->sinks[lru].url, url);
        close_sink(&n->sinks[lru], 1);
        free_i = lru;
    }
    duet_worker_sink_t *k = &n->sinks[free_i];
    duet_err_t e2 = {0};
    st = open_sink(k, url, SINK_QUEUE_LEN, &e2);
    if (st != DUET_OK) {
        memset(k, 0, sizeof *k);
        return duet_err_set(err, st == DUET_ERR_NOMEM ? st : DUET_ERR_INVALID, "%s: %s", field, e2.msg);
    }
    k->refs = 1;
    k->greet = 1;
    *sink = free_i;
    duet_info("event socket %s: opened (%d in use)", url, duet_worker_net_sink_count(n));
    return DUET_OK;
}

void duet_worker_net_sink_release(duet_worker_net_t *n, int sink)
{
    if (sink <= DUET_WORKER_SINK_EVENTS || sink >= DUET_WORKER_MAX_SINKS)
        return;
    duet_worker_sink_t *k = &n->sinks[sink];
    if (k->refs)
        k->refs--;
    k->last_used_ns = duet_time_ns();
}

static void sink_send(duet_worker_net_t *n, duet_worker_sink_t *k, const duet_envelope_t *ev, uint64_t deadline)
{
    duet_err_t err = {0};
    if (duet_ctl_pusher_send(k->push, ev, deadline, &err) == DUET_OK) {
        if (k->refused)
            duet_info("event socket %s takes events again (%llu refused meanwhile)", k->url,
                      (unsigned long long)k->refused);
        k->refused = 0;
        return;
    }
    n->events_dropped++;
    /* a router gone for good refuses every event: say so once, then when it takes them again */
    if (k->refused++ == 0 || ev->body_case != DUET__V1__ENVELOPE__BODY_HEARTBEAT)
        duet_log_rid(k->refused == 1 ? DUET_LOG_WARN : DUET_LOG_DEBUG, duet_msg_rid(ev), "event %s for %s not sent: %s",
                     duet_msg_kind_name(duet_msg_kind(ev)), k->url, duet_err_text(&err));
}

void duet_worker_net_push_to(duet_worker_net_t *n, int sink, duet_envelope_t *ev)
{
    if (!ev)
        return;
    if (sink < 0 || sink >= DUET_WORKER_MAX_SINKS || !n->sinks[sink].push)
        sink = DUET_WORKER_SINK_EVENTS;
    duet_worker_sink_t *k = &n->sinks[sink];
    if (k->push) {
        sink_send(n, k, ev, duet_deadline_after_ms(EVENT_DEADLINE_MS));
        if (sink != DUET_WORKER_SINK_EVENTS)
            k->last_used_ns = duet_time_ns();
    }
    duet_envelope_free(&ev);
}

int duet_worker_net_flush(duet_worker_net_t *n, uint64_t deadline_ns)
{
    int left = 0;
    for (int i = 0; i < DUET_WORKER_MAX_SINKS; i++) {
        duet_err_t err = {0};
        if (n->sinks[i].push && duet_ctl_pusher_flush(n->sinks[i].push, deadline_ns, &err) != DUET_OK) {
            duet_warn("event socket %s: %s", n->sinks[i].url, duet_err_text(&err));
            left++;
        }
    }
    return left;
}

void duet_worker_exit_gpu_lost(duet_worker_net_t *n, const duet_err_t *why)
{
    duet_error("the GPU can run nothing more (%s): the worker stops", duet_err_text(why));
    duet_worker_net_flush(n, duet_deadline_after_ms(DUET_WORKER_EXIT_FLUSH_MS));
    _exit(EXIT_FAILURE);
}

void duet_worker_net_push(duet_worker_net_t *n, duet_envelope_t *ev)
{
    duet_worker_net_push_to(n, DUET_WORKER_SINK_EVENTS, ev);
}

void duet_worker_net_broadcast(duet_worker_net_t *n, duet_envelope_t *ev)
{
    if (!ev)
        return;
    for (int i = 0; i < DUET_WORKER_MAX_SINKS; i++)
        if (n->sinks[i].push)
            sink_send(n, &n->sinks[i], ev,
                      i == DUET_WORKER_SINK_EVENTS ? duet_deadline_after_ms(EVENT_DEADLINE_MS) : 0);
    duet_envelope_free(&ev);
}

int duet_worker_net_sink_count(const duet_worker_net_t *n)
{
    int c = 0;
    for (int i = 0; i < DUET_WORKER_MAX_SINKS; i++)
        c += n->sinks[i].push != NULL;
    return c;
}

int duet_worker_net_heartbeat_due(duet_worker_net_t *n, const duet_worker_opts_t *o)
{
    uint64_t now = duet_time_ns();
    int greet = 0, any = 0;
    for (int i = 0; i < DUET_WORKER_MAX_SINKS; i++) {
        duet_worker_sink_t *k = &n->sinks[i];
        if (!k->push)
            continue;
        if (i != DUET_WORKER_SINK_EVENTS && !k->refs && now - k->last_used_ns > (uint64_t)n->idle_ms * 1000000ull) {
            duet_info("event socket %s: closed (unused for %llu s)", k->url,
                      (unsigned long long)((now - k->last_used_ns) / 1000000000ull));
            close_sink(k, 1);
            continue;
        }
        any = 1;
        greet |= k->greet;
    }
    if (!any || (!greet && now - n->last_heartbeat_ns < (uint64_t)o->heartbeat_ms * 1000000ull))
        return 0;
    for (int i = 0; i < DUET_WORKER_MAX_SINKS; i++)
        n->sinks[i].greet = 0;
    n->last_heartbeat_ns = now;
    return 1;
}

void duet_worker_net_close(duet_worker_net_t *n)
{
    unsigned long restarts = duet_ctl_listener_restarts(), rescued = duet_ctl_timeouts_rescued(),
                  redials = duet_ctl_client_redials(), revivals = duet_ctl_dialer_revivals();
    if (restarts || rescued || redials || revivals)
        duet_warn("ctl: %lu listener(s) replaced that libnng may have stopped, %lu operation(s) cancelled past a "
                  "timeout libnng missed, %lu silent connection(s) dialed again, %lu dialer(s) added after a second "
                  "without a connection or an attempt (docs/PROTOCOL.md)",
                  restarts, rescued, redials, revivals);
    duet_ctl_server_destroy(&n->srv);
    /* the routers' pushers close side by side (each may take its grace), --events here */
    for (int i = 0; i < DUET_WORKER_MAX_SINKS; i++)
        if (n->sinks[i].push && i != DUET_WORKER_SINK_EVENTS)
            close_sink(&n->sinks[i], 1);
    if (n->sinks[DUET_WORKER_SINK_EVENTS].push)
        close_sink(&n->sinks[DUET_WORKER_SINK_EVENTS], 0);
    uint64_t until = duet_deadline_after_ms(REAP_WAIT_MS);
    while (atomic_load(&g_reaping) > 0 && duet_time_ns() < until)
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    duet_xfer_destroy(&n->xfer);
}

void duet_worker_notify_ready(const duet_worker_opts_t *o)
{
    sd_notifyf(0, "READY=1\nSTATUS=%s %s serving on %s\nMAINPID=%lu", o->role, o->id, o->listen,
               (unsigned long)getpid());
}

void duet_worker_notify_watchdog(duet_worker_net_t *n)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
        return;
    uint64_t now = duet_time_ns();
    if (now - n->last_watchdog_ns < usec * 1000ull / 4)
        return;
    n->last_watchdog_ns = now;
    sd_notify(0, "WATCHDOG=1");
}

void duet_worker_notify_stopping(void) { sd_notify(0, "STOPPING=1"); }

static volatile int *g_stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    if (g_stop_flag)
        *g_stop_flag = 1;
}

duet_status_t duet_worker_start(const char *role, int argc, char **argv, duet_worker_opts_t *o,
                                volatile int *stop_flag, struct duet_model **model, duet_kv_cache_t **cache,
                                int *exit_code, duet_err_t *err)
{
    char ident[32];
    snprintf(ident, sizeof ident, "duet-%s", role);
    duet_log_init_from_env();
    duet_log_set_ident(role[0] == 'p' ? "duet-prefill" : "duet-decode");
    *exit_code = 1;
    duet_status_t st = duet_worker_opts_parse(o, role, argc, argv, err);
    if (st != DUET_OK) {
        if (strcmp(err->msg, "help") != 0)
            fprintf(stderr, "%s: %s\n", ident, duet_err_text(err));
        duet_worker_opts_usage(role);
        *exit_code = 2;
        return DUET_ERR_INVALID;
    }
    if ((st = duet_worker_opts_check_device(o, err)) != DUET_OK)
        return st; /* before the model loads: a build or option that cannot serve says so at once */
    g_stop_flag = stop_flag;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if ((st = duet_model_load(o->model, model, err)) != DUET_OK)
        return st;
    return duet_kv_cache_create(&(*model)->cfg, &o->cache, o->pages, o->slots, cache, err);
}
