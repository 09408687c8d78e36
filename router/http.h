/* The HTTP front door (libmicrohttpd): the OpenAI API, health, metrics and
 * the admin routes (DESIGN §10).
 *
 * Each connection has a thread of its own (MHD_USE_THREAD_PER_CONNECTION),
 * so the handler of a generation may wait: it tokenizes, submits the request
 * to the core, and waits on the request's eventfd and on the client's socket
 * at once, so a client that goes away is seen at once (POLLRDHUP) and the
 * request is cancelled, whether the response is streamed or not.  Streamed
 * responses are produced by MHD_create_response_from_callback from the
 * request's output buffer; the detokenizer and DSML parser run on the
 * connection's thread, never on the core's.
 *
 *   POST /v1/chat/completions, /v1/completions   (stream or not)
 *   GET  /v1/models, /v1/models/{id}
 *   GET  /health, /ready, /metrics
 *   GET  /v1/workers                              (admin)
 *   POST /v1/requests/{id}/abort                  (admin)
 *
 * Every response carries x-request-id: the client's when it sent one, else
 * the router's request id (also in x-duet-rid). */
#ifndef DUET_ROUTER_HTTP_H
#define DUET_ROUTER_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "core.h"
#include "err.h"
#include "metrics.h"
#include "store.h"
#include "tokenizer.h"

typedef struct {
    duet_core_t *core;
    duet_store_t *store;          /* NULL: no Redis */
    duet_metrics_t *metrics;
    const duet_tok_t *tok;
    const char *served_model;
    int32_t vocab_size;           /* the model's */
    uint32_t max_context;         /* prompt + completion tokens */
    uint32_t default_max_tokens;  /* chat completions without max_tokens (completions: 16) */
    uint32_t request_timeout_ms;  /* the whole request */
    size_t max_body;              /* request bodies over this get 413 */
    duet_chat_effort_profile_t effort_profile;
    const char *router_id, *nonce;
    uint32_t record_ttl_s;        /* Redis request record TTL beyond the deadline */
    uint64_t started_unix;
    const char *listen_host;      /* "127.0.0.1" */
    int port;                     /* 0: any free port */
    uint32_t max_connections;
} duet_http_opts_t;

typedef struct duet_http duet_http_t;

/* Listen and serve.  DUET_ERR_BUSY when the port is taken. */
duet_status_t duet_http_start(const duet_http_opts_t *o, duet_http_t **out, duet_err_t *err);
/* The port the server listens on. */
int duet_http_port(const duet_http_t *h);
/* Stop accepting connections (those open keep being served). */
void duet_http_quiesce(duet_http_t *h);
/* Stop: wait for every connection thread, free; *h = NULL. */
void duet_http_stop(duet_http_t **h);

#endif
