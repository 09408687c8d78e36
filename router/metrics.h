/* The router's own metrics (Prometheus text exposition format).
 *
 * Counters and histograms are atomics: any thread records, /metrics renders
 * without stopping anyone.  Gauges that describe the core's state (requests
 * per state, workers, the oldest WAITING_FOR_INPUT) are rendered by the core
 * (core.h) and appended by the HTTP layer. */
#ifndef DUET_ROUTER_METRICS_H
#define DUET_ROUTER_METRICS_H

#include <stddef.h>

typedef enum {
    DUET_HIST_TTFT = 0,  /* submission to the first token */
    DUET_HIST_ITL,       /* between consecutive tokens */
    DUET_HIST_E2E,       /* submission to the end */
    DUET_HIST_QUEUE,     /* submission to the Reserve command */
    DUET_HIST_COUNT
} duet_hist_t;

typedef enum { DUET_EP_CHAT = 0, DUET_EP_COMPLETIONS, DUET_EP_OTHER, DUET_EP_COUNT } duet_endpoint_t;

typedef struct duet_metrics duet_metrics_t;

/* A growable text buffer the renderers append to. */
typedef struct {
    char *p;
    size_t len, cap;
} duet_text_t;
void duet_text_printf(duet_text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void duet_text_fini(duet_text_t *t);

duet_metrics_t *duet_metrics_create(void);
void duet_metrics_destroy(duet_metrics_t **m);

void duet_metrics_observe(duet_metrics_t *m, duet_hist_t h, double seconds);
/* One HTTP response (any route).  499: the client went away first. */
void duet_metrics_count_response(duet_metrics_t *m, duet_endpoint_t ep, int status);
/* One finished generation: finish_reason stop, length, tool_calls, abort, error. */
void duet_metrics_count_finish(duet_metrics_t *m, const char *finish_reason);
/* One abort sent to the workers (Duet__V1__AbortReason), or the router stopping
 * a request whose output matched a stop string (reason 0). */
void duet_metrics_count_abort(duet_metrics_t *m, int reason);
void duet_metrics_count_dsml_error(duet_metrics_t *m, int code);
void duet_metrics_add_tokens(duet_metrics_t *m, unsigned long prompt, unsigned long completion);
/* Redis commands that could not be run because Redis was down. */
void duet_metrics_count_redis_dropped(duet_metrics_t *m);

/* Append the counters and histograms. */
void duet_metrics_render(duet_metrics_t *m, duet_text_t *out);

#endif
