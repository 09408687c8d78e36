/* The router's request: one HTTP request on its way through the workers.
 *
 * Two threads share it.  The connection thread that received it (http.c)
 * fills the fixed part, submits it to the core, then waits on `efd` for
 * progress; the core thread (core.c) reports progress (accepted, tokens,
 * finished or failed) under `mu` and wakes it.  The fixed part is written
 * before submission and read-only afterwards.  Each side holds a reference;
 * the last duet_rreq_unref() frees it.
 *
 * Nothing here blocks: duet_rreq_wait() waits with a deadline. */
#ifndef DUET_ROUTER_REQUEST_H
#define DUET_ROUTER_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "err.h"

#define DUET_RID_LEN 36 /* a UUID */

/* How a request ended, as the core saw it. */
typedef enum {
    DUET_FIN_NONE = 0,
    DUET_FIN_STOP,   /* EOS or a stop token */
    DUET_FIN_LENGTH, /* max tokens */
    DUET_FIN_ABORT,  /* aborted after it was accepted (finish_reason "abort") */
    DUET_FIN_ERROR,  /* failed: http_status and the error fields say why */
} duet_fin_t;

/* Why the connection side cancels a request. */
typedef enum {
    DUET_CANCEL_DISCONNECT = 1, /* the client went away */
    DUET_CANCEL_STOP_STRING,    /* the output matched a stop string: the rest is not needed */
} duet_cancel_t;

typedef struct duet_rreq {
    atomic_int refs;

    /* ---- fixed before submission ---- */
    char rid[DUET_RID_LEN + 1];  /* router-assigned id, the rid on the wire */
    char client_rid[65];         /* x-request-id as the client sent it ("" when none) */
    char session[129];           /* session affinity key ("" when none) */
    char session_hint[65];       /* the session's prefill worker from Redis ("" when unknown) */
    const char *endpoint;        /* "chat" or "completions" (metrics label) */
    int32_t *prompt;             /* (n_prompt) prompt token ids */
    uint32_t n_prompt;
    uint32_t max_tokens;
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed;
    int32_t *stop_ids;           /* (n_stop_ids) stop token ids */
    uint32_t n_stop_ids;
    int ignore_eos;
    uint64_t created_ns;         /* monotonic */
    uint64_t deadline_ns;        /* the whole request must end by then */

    /* ---- shared, under mu ---- */
    pthread_mutex_t mu;
    int efd;                     /* eventfd: the core writes after each change */
    int accepted;                /* prefill took it: a 200 can be sent */
    int32_t *tokens;             /* generated ids so far */
    uint32_t n_tokens, cap_tokens;
    duet_fin_t fin;              /* != NONE once the core is done with the client side */
    int abort_reason;            /* FIN_ABORT: Duet__V1__AbortReason */
    int http_status;             /* FIN_ERROR: 429, 500, 502, 503, 504 */
    char err_type[32], err_code[48], err_msg[256];
    uint32_t prompt_tokens, completion_tokens, cached_tokens; /* from RequestFinished */
    char prefill_id[65], decode_id[65];
    uint64_t accepted_ns, first_token_ns, last_token_ns, finished_ns;
    int cancelled;               /* the connection side asked the core to stop it */
} duet_rreq_t;

/* New request with one reference, an eventfd and the fixed fields zeroed;
 * NULL when out of memory or out of descriptors. */
duet_rreq_t *duet_rreq_new(void);
void duet_rreq_ref(duet_rreq_t *r);
/* Drop a reference; the last one frees everything.  NULL is fine. */
void duet_rreq_unref(duet_rreq_t *r);

/* Core side, each under mu and followed by a wake-up. */
void duet_rreq_set_accepted(duet_rreq_t *r, const char *prefill_id, const char *decode_id);
/* Append generated ids; DUET_ERR_NOMEM leaves the request unchanged. */
duet_status_t duet_rreq_add_tokens(duet_rreq_t *r, const int32_t *ids, uint32_t n);
void duet_rreq_set_finished(duet_rreq_t *r, duet_fin_t fin, int abort_reason, uint32_t prompt_tokens,
                            uint32_t completion_tokens, uint32_t cached_tokens);
/* Fail with an HTTP status and an OpenAI error (type, code, message). */
void duet_rreq_set_failed(duet_rreq_t *r, int http_status, const char *type, const char *code, const char *fmt,
                          ...) __attribute__((format(printf, 5, 6)));
/* Wake the waiter without a change (used by the core on shutdown). */
void duet_rreq_wake(duet_rreq_t *r);
/* Clear pending wake-ups (the waiter, before looking at the state). */
void duet_rreq_drain(duet_rreq_t *r);

#endif
