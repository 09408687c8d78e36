/* Router metrics (metrics.h). */
#include "metrics.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "dsml.h"
#include "duet.pb-c.h"

void duet_text_printf(duet_text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p)
            return;
        t->p = p;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->p + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

void duet_text_fini(duet_text_t *t)
{
    free(t->p);
    memset(t, 0, sizeof *t);
}

#define MAX_BUCKETS 20

typedef struct {
    const char *name, *help;
    double bounds[MAX_BUCKETS];
    int n;
    atomic_ullong counts[MAX_BUCKETS + 1]; /* last: +Inf */
    atomic_ullong sum_us;
} hist_t;

static const int statuses[] = {200, 400, 404, 405, 413, 429, 499, 500, 502, 503, 504};
#define N_STATUS ((int)(sizeof statuses / sizeof statuses[0]))
static const char *const finishes[] = {"stop", "length", "tool_calls", "abort", "error"};
#define N_FINISH 5
#define N_REASONS 11 /* AbortReason values 0..10; 0 = stop string */

struct duet_metrics {
    hist_t h[DUET_HIST_COUNT];
    atomic_ullong responses[DUET_EP_COUNT][N_STATUS + 1]; /* last: other statuses */
    atomic_ullong finish[N_FINISH];
    atomic_ullong aborts[N_REASONS];
    atomic_ullong dsml[DUET_DSML_CODE_COUNT];
    atomic_ullong prompt_tokens, completion_tokens, redis_dropped;
};

static void hist_init(hist_t *h, const char *name, const char *help, const double *b, int n)
{
    h->name = name;
    h->help = help;
    h->n = n;
    memcpy(h->bounds, b, sizeof(double) * (size_t)n);
}

duet_metrics_t *duet_metrics_create(void)
{
    duet_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    static const double ttft[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
    static const double itl[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5};
    static const double e2e[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
    static const double queue[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30};
    hist_init(&m->h[DUET_HIST_TTFT], "duet_router_time_to_first_token_seconds",
              "Time from the request's arrival to its first generated token.", ttft, 14);
    hist_init(&m->h[DUET_HIST_ITL], "duet_router_inter_token_latency_seconds",
              "Time between consecutive generated tokens of a request, as the router receives them.", itl, 14);
    hist_init(&m->h[DUET_HIST_E2E], "duet_router_e2e_request_latency_seconds",
              "Time from the request's arrival to its end.", e2e, 14);
    hist_init(&m->h[DUET_HIST_QUEUE], "duet_router_queue_time_seconds",
              "Time from the request's arrival to the Reserve command (router queue).", queue, 13);
    return m;
}

void duet_metrics_destroy(duet_metrics_t **m)
{
    if (m && *m) {
        free(*m);
        *m = NULL;
    }
}

void duet_metrics_observe(duet_metrics_t *m, duet_hist_t which, double s)
{
    if (!m || which >= DUET_HIST_COUNT || !(s >= 0))
        return;
    hist_t *h = &m->h[which];
    int i = 0;
    while (i < h->n && s > h->bounds[i])
        i++;
    atomic_fetch_add(&h->counts[i], 1);
    atomic_fetch_add(&h->sum_us, (unsigned long long)(s * 1e6));
}

void duet_metrics_count_response(duet_metrics_t *m, duet_endpoint_t ep, int status)
{
    if (!m || ep >= DUET_EP_COUNT)
        return;
    int i = 0;
    while (i < N_STATUS && statuses[i] != status)
        i++;
    atomic_fetch_add(&m->responses[ep][i], 1);
}

void duet_metrics_count_finish(duet_metrics_t *m, const char *f)
{
    if (!m)
        return;
    for (int i = 0; i < N_FINISH; i++)
        if (!strcmp(finishes[i], f))
            atomic_fetch_add(&m->finish[i], 1);
}

void duet_metrics_count_abort(duet_metrics_t *m, int reason)
{
    if (m && reason >= 0 && reason < N_REASONS)
        atomic_fetch_add(&m->aborts[reason], 1);
}

void duet_metrics_count_dsml_error(duet_metrics_t *m, int code)
{
    if (m && code > 0 && code < DUET_DSML_CODE_COUNT)
        atomic_fetch_add(&m->dsml[code], 1);
}

void duet_metrics_add_tokens(duet_metrics_t *m, unsigned long p, unsigned long c)
{
    if (!m)
        return;
    atomic_fetch_add(&m->prompt_tokens, p);
    atomic_fetch_add(&m->completion_tokens, c);
}

void duet_metrics_count_redis_dropped(duet_metrics_t *m)
{
    if (m)
        atomic_fetch_add(&m->redis_dropped, 1);
}

static const char *abort_label(int reason)
{
    if (reason == 0)
        return "stop_string";
    const char *n = protobuf_c_enum_descriptor_get_value(&duet__v1__abort_reason__descriptor, reason)
                        ? protobuf_c_enum_descriptor_get_value(&duet__v1__abort_reason__descriptor, reason)->name
                        : NULL;
    return n ? n : "unknown";
}

void duet_metrics_render(duet_metrics_t *m, duet_text_t *t)
{
    static const char *const eps[] = {"chat", "completions", "other"};
    duet_text_printf(t, "# HELP duet_router_responses_total HTTP responses by endpoint and status "
                        "(499: the client went away first).\n# TYPE duet_router_responses_total counter\n");
    for (int e = 0; e < DUET_EP_COUNT; e++)
        for (int i = 0; i <= N_STATUS; i++) {
            unsigned long long v = atomic_load(&m->responses[e][i]);
            if (i < N_STATUS)
                duet_text_printf(t, "duet_router_responses_total{endpoint=\"%s\",status=\"%d\"} %llu\n", eps[e],
                                 statuses[i], v);
            else if (v)
                duet_text_printf(t, "duet_router_responses_total{endpoint=\"%s\",status=\"other\"} %llu\n", eps[e],
                                 v);
        }
    duet_text_printf(t, "# HELP duet_router_finished_total Generations by finish_reason.\n"
                        "# TYPE duet_router_finished_total counter\n");
    for (int i = 0; i < N_FINISH; i++)
        duet_text_printf(t, "duet_router_finished_total{finish_reason=\"%s\"} %llu\n", finishes[i],
                         atomic_load(&m->finish[i]));
    duet_text_printf(t, "# HELP duet_router_aborts_total Requests the router aborted on the workers, by reason "
                        "(stop_string: the output matched a stop string).\n"
                        "# TYPE duet_router_aborts_total counter\n");
    for (int i = 0; i < N_REASONS; i++) {
        const char *l = abort_label(i);
        if (!strncmp(l, "ABORT_REASON_", 13))
            l += 13;
        duet_text_printf(t, "duet_router_aborts_total{reason=\"%s\"} %llu\n", l, atomic_load(&m->aborts[i]));
    }
    duet_text_printf(t, "# HELP duet_router_dsml_errors_total Malformed tool-call blocks in model output, by code.\n"
                        "# TYPE duet_router_dsml_errors_total counter\n");
    for (int i = 1; i < DUET_DSML_CODE_COUNT; i++)
        duet_text_printf(t, "duet_router_dsml_errors_total{code=\"%s\"} %llu\n",
                         duet_dsml_code_str((duet_dsml_code_t)i), atomic_load(&m->dsml[i]));
    duet_text_printf(t, "# HELP duet_router_tokens_total Tokens through the router.\n"
                        "# TYPE duet_router_tokens_total counter\n"
                        "duet_router_tokens_total{kind=\"prompt\"} %llu\n"
                        "duet_router_tokens_total{kind=\"completion\"} %llu\n",
                     atomic_load(&m->prompt_tokens), atomic_load(&m->completion_tokens));
    duet_text_printf(t, "# HELP duet_router_ctl_listener_restarts_total ipc listeners replaced because libnng may "
                        "have stopped them (a client that left during the handshake).\n"
                        "# TYPE duet_router_ctl_listener_restarts_total counter\n"
                        "duet_router_ctl_listener_restarts_total %lu\n"
                        "# HELP duet_router_ctl_timeouts_rescued_total Control-plane operations cancelled 100 ms "
                        "past a timeout libnng missed.\n"
                        "# TYPE duet_router_ctl_timeouts_rescued_total counter\n"
                        "duet_router_ctl_timeouts_rescued_total %lu\n"
                        "# HELP duet_router_ctl_client_redials_total ipc connections to workers closed and dialed "
                        "again: no reply ever came on them (a worker's stopped listener took them).\n"
                        "# TYPE duet_router_ctl_client_redials_total counter\n"
                        "duet_router_ctl_client_redials_total %lu\n"
                        "# HELP duet_router_ctl_dialer_revivals_total Dialers added after a second without a connection "
                        "in which no dialer attempted (libnng's dialer stops for good after some failed attempts).\n"
                        "# TYPE duet_router_ctl_dialer_revivals_total counter\n"
                        "duet_router_ctl_dialer_revivals_total %lu\n",
                     duet_ctl_listener_restarts(), duet_ctl_timeouts_rescued(), duet_ctl_client_redials(),
                     duet_ctl_dialer_revivals());
    duet_text_printf(t, "# HELP duet_router_redis_dropped_total Redis writes dropped while Redis was down.\n"
                        "# TYPE duet_router_redis_dropped_total counter\nduet_router_redis_dropped_total %llu\n",
                     atomic_load(&m->redis_dropped));
    for (int k = 0; k < DUET_HIST_COUNT; k++) {
        hist_t *h = &m->h[k];
        duet_text_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
        unsigned long long cum = 0;
        for (int i = 0; i <= h->n; i++) {
            cum += atomic_load(&h->counts[i]);
            if (i < h->n)
                duet_text_printf(t, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->bounds[i], cum);
            else
                duet_text_printf(t, "%s_bucket{le=\"+Inf\"} %llu\n", h->name, cum);
        }
        duet_text_printf(t, "%s_sum %.6f\n%s_count %llu\n", h->name, atomic_load(&h->sum_us) / 1e6, h->name, cum);
    }
}
