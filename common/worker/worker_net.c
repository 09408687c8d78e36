#include "worker_net.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "log.h"
#include "model.h"
#include "time_util.h"

#define EVENT_DEADLINE_MS 50

duet_status_t duet_worker_net_open(duet_worker_net_t *n, const duet_worker_opts_t *o, const duet_kv_cache_t *cache,
                                   duet_ctl_handler_fn handler, void *arg, duet_err_t *err)
{
    memset(n, 0, sizeof *n);
    duet_xfer_opts_t xo = {.name = o->id, .verify_checksums = o->verify_checksums};
    if (o->xfer_path)
        xo.data_path = strcmp(o->xfer_path, "rma") == 0  ? DUET_XFER_PATH_RMA
                       : strcmp(o->xfer_path, "am") == 0 ? DUET_XFER_PATH_AM
                                                         : DUET_XFER_PATH_AUTO;
    duet_status_t st = duet_xfer_create(&xo, &n->xfer, err);
    if (st == DUET_OK)
        st = duet_xfer_register_cache(n->xfer, cache, err);
    if (st == DUET_OK) {
        duet_ctl_opts_t co = {.url = o->listen, .sender_id = o->id};
        st = duet_ctl_server_create(&co, handler, arg, &n->srv, err);
    }
    if (st == DUET_OK && o->events) {
        duet_ctl_opts_t po = {.url = o->events, .queue_len = 65536};
        st = duet_ctl_pusher_create(&po, &n->push, err);
    }
    if (st != DUET_OK)
        duet_worker_net_close(n);
    return st;
}

void duet_worker_net_push(duet_worker_net_t *n, duet_envelope_t *ev)
{
    if (!ev)
        return;
    if (n->push) {
        duet_err_t err = {0};
        if (duet_ctl_pusher_send(n->push, ev, duet_deadline_after_ms(EVENT_DEADLINE_MS), &err) != DUET_OK) {
            n->events_dropped++;
            duet_log_rid(DUET_LOG_WARN, duet_msg_rid(ev), "event %s not sent: %s",
                         duet_msg_kind_name(duet_msg_kind(ev)), duet_err_text(&err));
        }
    }
    duet_envelope_free(&ev);
}

int duet_worker_net_heartbeat_due(duet_worker_net_t *n, const duet_worker_opts_t *o)
{
    uint64_t now = duet_time_ns();
    if (!n->push || now - n->last_heartbeat_ns < (uint64_t)o->heartbeat_ms * 1000000ull)
        return 0;
    n->last_heartbeat_ns = now;
    return 1;
}

void duet_worker_net_close(duet_worker_net_t *n)
{
    duet_ctl_server_destroy(&n->srv);
    duet_ctl_pusher_destroy(&n->push);
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
    g_stop_flag = stop_flag;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if ((st = duet_model_load(o->model, model, err)) != DUET_OK)
        return st;
    return duet_kv_cache_create(&(*model)->cfg, &o->cache, o->pages, o->slots, cache, err);
}
