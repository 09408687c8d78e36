/* The shared request object (request.h). */
#include "request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "time_util.h"

duet_rreq_t *duet_rreq_new(void)
{
    duet_rreq_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->efd < 0) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    atomic_init(&r->refs, 1);
    return r;
}

void duet_rreq_ref(duet_rreq_t *r) { atomic_fetch_add(&r->refs, 1); }

void duet_rreq_unref(duet_rreq_t *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    close(r->efd);
    pthread_mutex_destroy(&r->mu);
    free(r->prompt);
    free(r->stop_ids);
    free(r->tokens);
    free(r);
}

void duet_rreq_wake(duet_rreq_t *r)
{
    uint64_t one = 1;
    ssize_t n = write(r->efd, &one, sizeof one);
    (void)n; /* a full counter already means "woken" */
}

void duet_rreq_drain(duet_rreq_t *r)
{
    uint64_t v;
    ssize_t n = read(r->efd, &v, sizeof v);
    (void)n;
}

void duet_rreq_set_accepted(duet_rreq_t *r, const char *prefill_id, const char *decode_id)
{
    pthread_mutex_lock(&r->mu);
    if (!r->accepted) {
        r->accepted = 1;
        r->accepted_ns = duet_time_ns();
        snprintf(r->prefill_id, sizeof r->prefill_id, "%s", prefill_id ? prefill_id : "");
        snprintf(r->decode_id, sizeof r->decode_id, "%s", decode_id ? decode_id : "");
    }
    pthread_mutex_unlock(&r->mu);
    duet_rreq_wake(r);
}

duet_status_t duet_rreq_add_tokens(duet_rreq_t *r, const int32_t *ids, uint32_t n)
{
    duet_status_t st = DUET_OK;
    pthread_mutex_lock(&r->mu);
    if (r->n_tokens + n > r->cap_tokens) {
        uint32_t cap = r->cap_tokens ? r->cap_tokens : 64;
        while (cap < r->n_tokens + n)
            cap *= 2;
        int32_t *t = realloc(r->tokens, sizeof(int32_t) * cap);
        if (!t) {
            st = DUET_ERR_NOMEM;
            goto out;
        }
        r->tokens = t;
        r->cap_tokens = cap;
    }
    memcpy(r->tokens + r->n_tokens, ids, sizeof(int32_t) * n);
    r->n_tokens += n;
    uint64_t now = duet_time_ns();
    if (!r->first_token_ns)
        r->first_token_ns = now;
    r->last_token_ns = now;
out:
    pthread_mutex_unlock(&r->mu);
    duet_rreq_wake(r);
    return st;
}

void duet_rreq_set_finished(duet_rreq_t *r, duet_fin_t fin, int abort_reason, uint32_t prompt_tokens,
                            uint32_t completion_tokens, uint32_t cached_tokens)
{
    pthread_mutex_lock(&r->mu);
    if (r->fin == DUET_FIN_NONE) {
        r->fin = fin;
        r->abort_reason = abort_reason;
        r->prompt_tokens = prompt_tokens;
        r->completion_tokens = completion_tokens;
        r->cached_tokens = cached_tokens;
        r->finished_ns = duet_time_ns();
    }
    pthread_mutex_unlock(&r->mu);
    duet_rreq_wake(r);
}

void duet_rreq_set_failed(duet_rreq_t *r, int http_status, const char *type, const char *code, const char *fmt, ...)
{
    pthread_mutex_lock(&r->mu);
    if (r->fin == DUET_FIN_NONE) {
        r->fin = DUET_FIN_ERROR;
        r->http_status = http_status;
        snprintf(r->err_type, sizeof r->err_type, "%s", type);
        snprintf(r->err_code, sizeof r->err_code, "%s", code ? code : "");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err_msg, sizeof r->err_msg, fmt, ap);
        va_end(ap);
        r->finished_ns = duet_time_ns();
    }
    pthread_mutex_unlock(&r->mu);
    duet_rreq_wake(r);
}
