/* duet-driver: plays the router over the control plane, for tests and for
 * operators poking at workers.
 *
 *   duet-driver run --prefill URL[,URL..] --decode URL[,URL..] --events URL
 *                   --requests FILE.jsonl --out FILE.jsonl [--concurrency N]
 *                   [--abort-rate F --abort-seed S] [--timeout-ms T] [--wait-ms W]
 *   duet-driver state URL [--requests]     print a worker's state dump as JSON
 *   duet-driver abort URL RID               send Abort{rid} and print the AbortAck
 *   duet-driver bad-input PREFILL_URL DECODE_URL   malformed commands, each must get a typed error
 *
 * run: each request line is {"rid"?, "tokens": [...], "max_tokens": N,
 * "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos"}.  For each:
 * Reserve on a decode worker, Prefill on a prefill worker with the
 * descriptor, then collect TokenChunk/RequestFinished events.  With
 * --abort-rate a random share of requests is aborted at a random stage
 * (before Reserve, while WAITING_FOR_INPUT, just after Prefill, after some
 * tokens), the way the router does it: prefill first, then decode, telling
 * decode when no put can still land.  Output lines: {"rid", "status":
 * ok|aborted|rejected|error|timeout, "finish", "tokens", "abort_stage",
 * "cached_tokens" (decode's RequestFinished: prompt tokens prefill served from
 * its prefix cache)}. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "ctl.h"
#include "log.h"
#include "msg.h"
#include "time_util.h"

#define CALL_MS 10000

typedef enum { RQ_PENDING = 0, RQ_RUNNING, RQ_DONE } rq_phase_t;
enum { AB_NONE = 0, AB_BEFORE_RESERVE, AB_WAITING, AB_AFTER_PREFILL, AB_MID_DECODE };
static const char *const ab_names[] = {"none", "before_reserve", "waiting", "after_prefill", "mid_decode"};

typedef struct {
    char rid[65];
    int32_t *tokens;
    size_t n_tokens;
    uint32_t max_tokens;
    float temperature, top_p, min_p;
    int top_k, ignore_eos;
    uint64_t seed;
    rq_phase_t phase;
    int p_idx, d_idx;
    uint64_t epoch;
    int32_t *out;
    uint32_t n_out;
    const char *status, *finish;
    uint32_t cached_tokens; /* from decode's RequestFinished */
    int abort_stage, abort_after;
    int prefill_sent;
    uint64_t deadline_ns;
} rq_t;

typedef struct {
    duet_ctl_client_t **p, **d;
    int np, nd;
    duet_ctl_puller_t *events;
    const char *events_url;      /* sent as Reserve/Prefill.event_url: the workers answer here */
    rq_t *rq;
    size_t n_rq;
    uint32_t wait_ms;
    int never_prefill;           /* reserve only: a prefill worker that never sends */
    uint32_t request_timeout_ms; /* one request's whole life */
    uint32_t abort_all_after_ms; /* mass abort: abort every running request at this time */
    const char *abort_prefix;    /* ... whose rid starts with this */
} drv_t;

/* The events, pulled on a thread of their own as the router does: a call that waits on a worker
 * (its step running, or the worker ending) must not keep the other workers' events from being
 * taken (a worker that ends gives its queued events a bounded time to be taken, then drops them). */
typedef struct ev_node {
    duet_envelope_t *ev;
    struct ev_node *next;
} ev_node_t;
typedef struct {
    duet_ctl_puller_t *puller;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_node_t *head, *tail;
    int stop;
} evq_t;

static void *evq_main(void *arg)
{
    evq_t *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int stop = q->stop;
        pthread_mutex_unlock(&q->mu);
        if (stop)
            return NULL;
        duet_envelope_t *ev = NULL;
        duet_err_t err = {0};
        if (duet_ctl_puller_recv(q->puller, duet_deadline_after_ms(50), &ev, &err) != DUET_OK)
            continue;
        ev_node_t *n = malloc(sizeof *n);
        if (!n) {
            fprintf(stderr, "duet-driver: out of memory: an event dropped\n");
            duet_envelope_free(&ev);
            continue;
        }
        n->ev = ev;
        n->next = NULL;
        pthread_mutex_lock(&q->mu);
        if (q->tail)
            q->tail->next = n;
        else
            q->head = n;
        q->tail = n;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
    }
}

/* The next event, waiting up to `ms`; NULL when none came. */
static duet_envelope_t *evq_pop(evq_t *q, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&q->mu);
    while (!q->head && pthread_cond_timedwait(&q->cv, &q->mu, &ts) == 0)
        ;
    ev_node_t *n = q->head;
    if (n) {
        q->head = n->next;
        if (!q->head)
            q->tail = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    duet_envelope_t *ev = n ? n->ev : NULL;
    free(n);
    return ev;
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int split_urls(const char *s, duet_ctl_client_t ***out)
{
    char *dup = duet_strdup(s), *save = NULL;
    int n = 0;
    *out = NULL;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        *out = realloc(*out, sizeof(**out) * (size_t)(n + 1));
        duet_ctl_opts_t o = {.url = t};
        duet_err_t err = {0};
        if (duet_ctl_client_create(&o, &(*out)[n], &err) != DUET_OK) {
            fprintf(stderr, "duet-driver: %s: %s\n", t, duet_err_text(&err));
            exit(1);
        }
        n++;
    }
    free(dup);
    return n;
}

static duet_msg_origin_t origin(const rq_t *r) { return (duet_msg_origin_t){.sender_id = "driver", .rid = r ? r->rid : NULL, .epoch = r ? r->epoch : 0}; }

static duet_status_t call(duet_ctl_client_t *c, duet_envelope_t *req, duet_envelope_t **reply)
{
    duet_err_t err = {0};
    duet_status_t st = duet_ctl_client_call(c, req, duet_deadline_after_ms(CALL_MS), reply, &err);
    duet_envelope_free(&req);
    if (st != DUET_OK)
        fprintf(stderr, "duet-driver: call failed: %s\n", duet_err_text(&err));
    return st;
}

static void finish(rq_t *r, const char *status, const char *fin)
{
    if (r->phase == RQ_DONE)
        return;
    r->phase = RQ_DONE;
    r->status = status;
    if (fin)
        r->finish = fin;
}

/* Abort the way the router does: prefill first; decode learns whether a put can still land. */
static void abort_request(drv_t *D, rq_t *r, int prefill_sent)
{
    int quiesced = 1;
    duet_envelope_t *req = NULL, *reply = NULL;
    duet_msg_origin_t o = origin(r);
    if (prefill_sent) {
        duet_msg_new_abort(&o, DUET__V1__ABORT_REASON__ABORT_REASON_CLIENT_DISCONNECT, 0, "test abort", &req);
        duet_status_t st = call(D->p[r->p_idx], req, &reply);
        if (st == DUET_OK && duet_msg_kind(reply) == DUET__V1__ENVELOPE__BODY_ABORT_ACK)
            quiesced = !(reply->abort_ack->known && reply->abort_ack->transfer_started);
        else
            /* Prefill does not answer.  A router declares it dead from its heartbeat TTL
             * before telling decode so; this driver has no heartbeats and takes a failed
             * call as that verdict (tests kill prefill workers on purpose). */
            quiesced = st == DUET_ERR_PEER || st == DUET_ERR_TIMEOUT;
        duet_envelope_free(&reply);
    }
    if (r->epoch) {
        duet_msg_new_abort(&o, DUET__V1__ABORT_REASON__ABORT_REASON_CLIENT_DISCONNECT, quiesced, "test abort", &req);
        if (call(D->d[r->d_idx], req, &reply) == DUET_OK)
            duet_envelope_free(&reply);
    }
    finish(r, "aborted", "abort");
}

static void start_request(drv_t *D, rq_t *r, size_t i)
{
    r->phase = RQ_RUNNING;
    r->p_idx = (int)(i % (size_t)D->np);
    r->d_idx = (int)(i % (size_t)D->nd);
    r->deadline_ns = duet_deadline_after_ms(D->request_timeout_ms);
    if (r->abort_stage == AB_BEFORE_RESERVE) {
        finish(r, "aborted", "abort");
        return;
    }
    duet_msg_origin_t o = origin(r);
    duet_envelope_t *req = NULL, *reply = NULL;
    duet_msg_new_reserve(&o, (uint32_t)r->n_tokens, r->max_tokens, D->wait_ms, D->events_url, &req);
    Duet__V1__SamplingParams *sp = req->reserve->sampling;
    sp->temperature = r->temperature;
    sp->top_p = r->top_p;
    sp->top_k = r->top_k;
    sp->min_p = r->min_p;
    sp->seed = r->seed;
    sp->ignore_eos = r->ignore_eos;
    char pid[16];
    snprintf(pid, sizeof pid, "p%d", r->p_idx);
    duet_msg_set_str(&req->reserve->prefill_worker_id, pid);
    if (call(D->d[r->d_idx], req, &reply) != DUET_OK) {
        finish(r, "error", "error");
        return;
    }
    if (duet_msg_kind(reply) != DUET__V1__ENVELOPE__BODY_RESERVED) {
        finish(r, duet_msg_kind(reply) == DUET__V1__ENVELOPE__BODY_REJECTED ? "rejected" : "error", "error");
        duet_envelope_free(&reply);
        return;
    }
    r->epoch = reply->header->epoch;
    o.epoch = r->epoch;
    if (r->abort_stage == AB_WAITING) {
        duet_envelope_free(&reply);
        abort_request(D, r, 0);
        return;
    }
    if (D->never_prefill) {
        duet_envelope_free(&reply);
        return;
    }
    duet_msg_new_prefill(&o, r->tokens, r->n_tokens, reply->reserved->descriptor, D->request_timeout_ms,
                         D->events_url, &req);
    duet_envelope_free(&reply);
    sp = req->prefill->sampling;
    sp->temperature = r->temperature;
    sp->top_p = r->top_p;
    sp->top_k = r->top_k;
    sp->min_p = r->min_p;
    sp->seed = r->seed;
    if (call(D->p[r->p_idx], req, &reply) != DUET_OK || duet_msg_kind(reply) != DUET__V1__ENVELOPE__BODY_ACK) {
        if (reply && duet_msg_kind(reply) == DUET__V1__ENVELOPE__BODY_ERROR)
            fprintf(stderr, "duet-driver: %s: prefill refused: %s\n", r->rid, reply->error->message);
        duet_envelope_free(&reply);
        abort_request(D, r, 0); /* prefill never took it: decode may free at once */
        r->status = "error";
        return;
    }
    duet_envelope_free(&reply);
    r->prefill_sent = 1;
    if (r->abort_stage == AB_AFTER_PREFILL)
        abort_request(D, r, 1);
}

static rq_t *find_rq(drv_t *D, const char *rid)
{
    for (size_t i = 0; i < D->n_rq; i++)
        if (strcmp(D->rq[i].rid, rid) == 0)
            return &D->rq[i];
    return NULL;
}

static void on_event(drv_t *D, duet_envelope_t *ev)
{
    const char *rid = duet_msg_rid(ev);
    rq_t *r = rid ? find_rq(D, rid) : NULL;
    if (!r || r->phase != RQ_RUNNING)
        return;
    switch (duet_msg_kind(ev)) {
    case DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK: {
        const Duet__V1__TokenChunk *tc = ev->token_chunk;
        if (tc->first_index != r->n_out) {
            fprintf(stderr, "duet-driver: %s: token index %u, expected %u\n", rid, tc->first_index, r->n_out);
            finish(r, "error", "error");
            return;
        }
        r->out = realloc(r->out, sizeof(int32_t) * (r->n_out + tc->n_tokens));
        memcpy(r->out + r->n_out, tc->tokens, sizeof(int32_t) * tc->n_tokens);
        r->n_out += (uint32_t)tc->n_tokens;
        if (r->abort_stage == AB_MID_DECODE && (int)r->n_out >= r->abort_after)
            abort_request(D, r, 1);
        break;
    }
    case DUET__V1__ENVELOPE__BODY_REQUEST_FINISHED: {
        Duet__V1__FinishReason fr = ev->request_finished->reason;
        if (fr == DUET__V1__FINISH_REASON__FINISH_REASON_ABORT) {
            /* decode gave up on its own (deadline, peer failure): stop prefill, and tell decode
             * whether a put can still land so it can release the quarantine */
            abort_request(D, r, r->prefill_sent);
            return;
        }
        r->cached_tokens = ev->request_finished->cached_tokens;
        finish(r, fr == DUET__V1__FINISH_REASON__FINISH_REASON_ABORT   ? "aborted"
                  : fr == DUET__V1__FINISH_REASON__FINISH_REASON_ERROR ? "error"
                                                                       : "ok",
               fr == DUET__V1__FINISH_REASON__FINISH_REASON_STOP     ? "stop"
               : fr == DUET__V1__FINISH_REASON__FINISH_REASON_LENGTH ? "length"
               : fr == DUET__V1__FINISH_REASON__FINISH_REASON_ABORT  ? "abort"
                                                                     : "error");
        break;
    }
    case DUET__V1__ENVELOPE__BODY_ERROR:
        fprintf(stderr, "duet-driver: %s: worker error %s: %s\n", rid,
                duet_msg_enum_name(&duet__v1__error_code__descriptor, ev->error->code), ev->error->message);
        abort_request(D, r, 1);
        r->status = "error";
        break;
    default:
        break;
    }
}

static int load_requests(drv_t *D, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)len, 0, &je);
        if (!j)
            continue;
        D->rq = realloc(D->rq, sizeof(rq_t) * (D->n_rq + 1));
        rq_t *r = &D->rq[D->n_rq];
        memset(r, 0, sizeof *r);
        const char *rid = json_string_value(json_object_get(j, "rid"));
        if (rid)
            snprintf(r->rid, sizeof r->rid, "%s", rid);
        else
            snprintf(r->rid, sizeof r->rid, "req-%zu-%08llx", D->n_rq, (unsigned long long)(rng() & 0xffffffff));
        json_t *t = json_object_get(j, "tokens");
        r->n_tokens = json_array_size(t);
        r->tokens = malloc(sizeof(int32_t) * (r->n_tokens ? r->n_tokens : 1));
        for (size_t k = 0; k < r->n_tokens; k++)
            r->tokens[k] = (int32_t)json_integer_value(json_array_get(t, k));
        r->max_tokens = (uint32_t)json_integer_value(json_object_get(j, "max_tokens"));
        r->temperature = (float)json_number_value(json_object_get(j, "temperature"));
        r->top_p = json_object_get(j, "top_p") ? (float)json_number_value(json_object_get(j, "top_p")) : 1.0f;
        r->top_k = (int)json_integer_value(json_object_get(j, "top_k"));
        r->min_p = (float)json_number_value(json_object_get(j, "min_p"));
        r->seed = (uint64_t)json_integer_value(json_object_get(j, "seed"));
        r->ignore_eos = json_is_true(json_object_get(j, "ignore_eos"));
        r->status = "pending";
        r->finish = "";
        D->n_rq++;
        json_decref(j);
    }
    free(line);
    fclose(f);
    return 0;
}

static int cmd_run(int argc, char **argv)
{
    drv_t D;
    memset(&D, 0, sizeof D);
    const char *purls = NULL, *durls = NULL, *events = NULL, *reqs = NULL, *outp = NULL;
    int conc = 1;
    double abort_rate = 0;
    uint32_t timeout_ms = 120000;
    D.wait_ms = 30000;
    D.request_timeout_ms = 300000;
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--prefill")) purls = v;
        else if (!strcmp(k, "--decode")) durls = v;
        else if (!strcmp(k, "--events")) events = v;
        else if (!strcmp(k, "--requests")) reqs = v;
        else if (!strcmp(k, "--out")) outp = v;
        else if (!strcmp(k, "--concurrency")) conc = atoi(v);
        else if (!strcmp(k, "--abort-rate")) abort_rate = atof(v);
        else if (!strcmp(k, "--abort-seed")) rng_state = strtoull(v, NULL, 10) * 2654435761ull + 1;
        else if (!strcmp(k, "--timeout-ms")) timeout_ms = (uint32_t)atoi(v);
        else if (!strcmp(k, "--wait-ms")) D.wait_ms = (uint32_t)atoi(v);
        else if (!strcmp(k, "--never-prefill")) D.never_prefill = atoi(v);
        else if (!strcmp(k, "--request-timeout-ms")) D.request_timeout_ms = (uint32_t)atoi(v);
        else if (!strcmp(k, "--abort-all-after-ms")) D.abort_all_after_ms = (uint32_t)atoi(v);
        else if (!strcmp(k, "--abort-only-prefix")) D.abort_prefix = v;
        else {
            fprintf(stderr, "duet-driver: unknown option %s\n", k);
            return 2;
        }
    }
    if (!purls || !durls || !events || !reqs || !outp || conc < 1) {
        fprintf(stderr, "duet-driver run: --prefill --decode --events --requests --out are required\n");
        return 2;
    }
    if (load_requests(&D, reqs) < 0) {
        fprintf(stderr, "duet-driver: cannot read %s\n", reqs);
        return 1;
    }
    for (size_t i = 0; i < D.n_rq; i++)
        if ((double)(rng() % 1000000) / 1e6 < abort_rate) {
            D.rq[i].abort_stage = 1 + (int)(rng() % 4);
            D.rq[i].abort_after = 1 + (int)(rng() % (D.rq[i].max_tokens ? D.rq[i].max_tokens : 1));
        }
    D.np = split_urls(purls, &D.p);
    D.nd = split_urls(durls, &D.d);
    duet_ctl_opts_t po = {.url = events};
    D.events_url = events;
    duet_err_t err = {0};
    if (duet_ctl_puller_create(&po, &D.events, &err) != DUET_OK) {
        fprintf(stderr, "duet-driver: %s\n", duet_err_text(&err));
        return 1;
    }
    evq_t Q = {.puller = D.events};
    pthread_t evt;
    pthread_mutex_init(&Q.mu, NULL);
    pthread_cond_init(&Q.cv, NULL);
    if (pthread_create(&evt, NULL, evq_main, &Q) != 0) {
        fprintf(stderr, "duet-driver: cannot start the events thread\n");
        duet_ctl_puller_destroy(&D.events);
        return 1;
    }
    size_t next = 0, done = 0;
    uint64_t end = duet_deadline_after_ms(timeout_ms);
    uint64_t mass_at = D.abort_all_after_ms ? duet_deadline_after_ms(D.abort_all_after_ms) : 0;
    while (done < D.n_rq && duet_time_ns() < end) {
        size_t running = 0;
        for (size_t i = 0; i < D.n_rq; i++)
            running += D.rq[i].phase == RQ_RUNNING;
        while (running < (size_t)conc && next < D.n_rq) {
            start_request(&D, &D.rq[next], next);
            next++;
            running++;
        }
        duet_envelope_t *ev = evq_pop(&Q, 20);
        if (ev) {
            on_event(&D, ev);
            duet_envelope_free(&ev);
        }
        uint64_t now = duet_time_ns();
        if (mass_at && now >= mass_at) {
            uint64_t t0 = duet_time_ns();
            size_t n_ab = 0;
            for (size_t i = 0; i < D.n_rq; i++) {
                rq_t *r = &D.rq[i];
                if (r->phase == RQ_RUNNING && (!D.abort_prefix || !strncmp(r->rid, D.abort_prefix, strlen(D.abort_prefix)))) {
                    abort_request(&D, r, r->prefill_sent);
                    n_ab++;
                }
            }
            fprintf(stderr, "duet-driver: mass abort of %zu requests took %.1f ms\n", n_ab, (duet_time_ns() - t0) / 1e6);
            mass_at = 0;
        }
        done = 0;
        for (size_t i = 0; i < D.n_rq; i++) {
            rq_t *r = &D.rq[i];
            if (r->phase == RQ_RUNNING && now > r->deadline_ns) {
                abort_request(&D, r, 1);
                r->status = "timeout";
            }
            done += r->phase == RQ_DONE;
        }
    }
    pthread_mutex_lock(&Q.mu);
    Q.stop = 1;
    pthread_mutex_unlock(&Q.mu);
    pthread_join(evt, NULL);
    for (duet_envelope_t *ev; (ev = evq_pop(&Q, 0));)
        duet_envelope_free(&ev);
    pthread_mutex_destroy(&Q.mu);
    pthread_cond_destroy(&Q.cv);
    FILE *f = fopen(outp, "w");
    int failures = 0;
    for (size_t i = 0; i < D.n_rq; i++) {
        rq_t *r = &D.rq[i];
        if (r->phase != RQ_DONE)
            r->status = "timeout";
        json_t *o = json_object(), *toks = json_array();
        for (uint32_t k = 0; k < r->n_out; k++)
            json_array_append_new(toks, json_integer(r->out[k]));
        json_object_set_new(o, "rid", json_string(r->rid));
        json_object_set_new(o, "status", json_string(r->status));
        json_object_set_new(o, "finish", json_string(r->finish ? r->finish : ""));
        json_object_set_new(o, "abort_stage", json_string(ab_names[r->abort_stage]));
        json_object_set_new(o, "cached_tokens", json_integer(r->cached_tokens));
        json_object_set_new(o, "tokens", toks);
        char *s = json_dumps(o, JSON_COMPACT);
        fprintf(f, "%s\n", s);
        free(s);
        json_decref(o);
        failures += strcmp(r->status, "ok") != 0 && strcmp(r->status, "aborted") != 0;
        free(r->tokens);
        free(r->out);
    }
    fclose(f);
    for (int i = 0; i < D.np; i++)
        duet_ctl_client_destroy(&D.p[i]);
    for (int i = 0; i < D.nd; i++)
        duet_ctl_client_destroy(&D.d[i]);
    free(D.p);
    free(D.d);
    duet_ctl_puller_destroy(&D.events);
    fprintf(stderr, "duet-driver: %zu requests, %d failed\n", D.n_rq, failures);
    free(D.rq);
    return failures ? 1 : 0;
}

static int cmd_state(const char *url, int with_requests)
{
    duet_ctl_client_t *c = NULL;
    duet_ctl_opts_t o = {.url = url};
    duet_err_t err = {0};
    if (duet_ctl_client_create(&o, &c, &err) != DUET_OK)
        return 1;
    duet_msg_origin_t og = origin(NULL);
    duet_envelope_t *req = NULL, *reply = NULL;
    duet_msg_new_state_dump_request(&og, with_requests, &req);
    if (call(c, req, &reply) != DUET_OK || duet_msg_kind(reply) != DUET__V1__ENVELOPE__BODY_STATE_DUMP) {
        duet_ctl_client_destroy(&c);
        return 1;
    }
    const Duet__V1__Load *l = reply->state_dump->load;
    json_t *j = json_object(), *states = json_object(), *reqs = json_array();
    json_object_set_new(j, "sender", json_string(reply->header->sender_id));
    json_object_set_new(j, "pages_free", json_integer(l->pages_free));
    json_object_set_new(j, "pages_used", json_integer(l->pages_used));
    json_object_set_new(j, "pages_quarantined", json_integer(l->pages_quarantined));
    json_object_set_new(j, "slots_free", json_integer(l->slots_free));
    json_object_set_new(j, "slots_used", json_integer(l->slots_used));
    json_object_set_new(j, "slots_quarantined", json_integer(l->slots_quarantined));
    json_object_set_new(j, "queue_len", json_integer(l->queue_len));
    json_object_set_new(j, "oldest_waiting_age_ms", json_integer((json_int_t)l->oldest_waiting_age_ms));
    for (size_t i = 0; i < l->n_requests; i++)
        json_object_set_new(states, duet_msg_enum_name(&duet__v1__request_state__descriptor, l->requests[i]->state),
                            json_integer(l->requests[i]->count));
    json_object_set_new(j, "requests_per_state", states);
    for (size_t i = 0; i < reply->state_dump->n_requests; i++) {
        const Duet__V1__RequestSummary *rs = reply->state_dump->requests[i];
        json_t *e = json_object();
        json_object_set_new(e, "rid", json_string(rs->rid));
        json_object_set_new(e, "state", json_string(duet_msg_enum_name(&duet__v1__request_state__descriptor, rs->state)));
        json_object_set_new(e, "age_ms", json_integer((json_int_t)rs->age_ms));
        json_array_append_new(reqs, e);
    }
    json_object_set_new(j, "requests", reqs);
    char *s = json_dumps(j, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(j);
    duet_envelope_free(&reply);
    duet_ctl_client_destroy(&c);
    return 0;
}

static int cmd_abort(const char *url, const char *rid)
{
    duet_ctl_client_t *c = NULL;
    duet_ctl_opts_t o = {.url = url};
    duet_err_t err = {0};
    if (duet_ctl_client_create(&o, &c, &err) != DUET_OK)
        return 1;
    duet_msg_origin_t og = {.sender_id = "driver", .rid = rid};
    duet_envelope_t *req = NULL, *reply = NULL;
    duet_msg_new_abort(&og, DUET__V1__ABORT_REASON__ABORT_REASON_ADMIN, 0, "admin abort", &req);
    int rc = call(c, req, &reply) == DUET_OK && duet_msg_kind(reply) == DUET__V1__ENVELOPE__BODY_ABORT_ACK ? 0 : 1;
    if (!rc)
        printf("{\"known\":%s}\n", reply->abort_ack->known ? "true" : "false");
    duet_envelope_free(&reply);
    duet_ctl_client_destroy(&c);
    return rc;
}

/* ---- bad input: each malformed command gets a typed error and changes nothing ---- */

static int bi_pass, bi_fail;

static void bi_check(int cond, const char *what)
{
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
    cond ? bi_pass++ : bi_fail++;
}

/* Send raw bytes; return the reply's error code (0 when not an Error), -1 when no reply. */
static int bi_raw(duet_ctl_client_t *c, const void *buf, size_t len)
{
    duet_envelope_t *reply = NULL;
    duet_err_t err = {0};
    if (duet_ctl_client_call_raw(c, buf, len, duet_deadline_after_ms(CALL_MS), &reply, &err) != DUET_OK)
        return -1;
    int code = duet_msg_kind(reply) == DUET__V1__ENVELOPE__BODY_ERROR ? (int)reply->error->code : 0;
    duet_envelope_free(&reply);
    return code;
}

static int bi_call(duet_ctl_client_t *c, duet_envelope_t *req, duet_envelope_t **reply)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    duet_err_t err = {0};
    /* encode without validation so deliberately bad fields reach the worker */
    size_t n = protobuf_c_message_get_packed_size(&req->base);
    buf = malloc(n ? n : 1);
    len = protobuf_c_message_pack(&req->base, buf);
    duet_envelope_free(&req);
    duet_status_t st = duet_ctl_client_call_raw(c, buf, len, duet_deadline_after_ms(CALL_MS), reply, &err);
    free(buf);
    if (st != DUET_OK) {
        fprintf(stderr, "duet-driver: no reply: %s\n", duet_err_text(&err));
        return -1;
    }
    return duet_msg_kind(*reply) == DUET__V1__ENVELOPE__BODY_ERROR ? (int)(*reply)->error->code : 0;
}

static int cmd_bad_input(const char *purl, const char *durl)
{
    duet_ctl_client_t *p = NULL, *d = NULL;
    duet_ctl_opts_t po = {.url = purl}, dopt = {.url = durl};
    duet_err_t err = {0};
    if (duet_ctl_client_create(&po, &p, &err) != DUET_OK || duet_ctl_client_create(&dopt, &d, &err) != DUET_OK)
        return 1;
    static const uint8_t garbage[] = {0xff, 0x13, 0x37, 0x00, 0x42, 0x99, 0x01};
    int code0;
    bi_check(bi_raw(d, garbage, sizeof garbage) == DUET__V1__ERROR_CODE__ERROR_CODE_PARSE, "decode: garbage -> PARSE");
    bi_check(bi_raw(p, garbage, sizeof garbage) == DUET__V1__ERROR_CODE__ERROR_CODE_PARSE, "prefill: garbage -> PARSE");
    duet_msg_origin_t ot = {.sender_id = "driver", .rid = "bad-trunc"};
    duet_msg_origin_t o = {.sender_id = "driver", .rid = "bad-1"};
    duet_envelope_t *req = NULL, *reply = NULL;
    duet_msg_new_reserve(&ot, 40, 4, 5000, NULL, &req);
    uint8_t *buf;
    size_t len;
    duet_msg_encode(req, NULL, &buf, &len, &err);
    int trunc_ok = 1;
    for (size_t cut = 1; cut < len; cut += 3) {
        int code = bi_raw(d, buf, cut);
        /* a prefix may still decode to a valid (smaller) message; it must never go unanswered */
        trunc_ok &= code != -1;
    }
    bi_check(trunc_ok, "decode: every truncation of a Reserve is answered");
    free(buf);
    /* a prefix that still decodes may have reserved "bad-trunc": release it */
    duet_envelope_t *ab = NULL;
    duet_msg_new_abort(&ot, DUET__V1__ABORT_REASON__ABORT_REASON_ADMIN, 1, NULL, &ab);
    if (bi_call(d, ab, &reply) >= 0)
        duet_envelope_free(&reply);
    req->header->version = 7;
    bi_check(bi_call(d, req, &reply) == DUET__V1__ERROR_CODE__ERROR_CODE_VERSION, "decode: wrong version -> VERSION");
    duet_envelope_free(&reply);
    duet_msg_new_reserve(&o, 40, 4, 5000, NULL, &req);
    code0 = bi_call(p, req, &reply);
    bi_check(code0 == DUET__V1__ERROR_CODE__ERROR_CODE_PROTOCOL, "prefill: Reserve -> PROTOCOL");
    if (code0 != DUET__V1__ERROR_CODE__ERROR_CODE_PROTOCOL)
        fprintf(stderr, "  got %d (%s)\n", code0, reply ? duet_msg_kind_name(duet_msg_kind(reply)) : "no reply");
    duet_envelope_free(&reply);
    /* event URLs a worker cannot dial: INVALID; one over the URL limit: RANGE (nothing reserved) */
    duet_msg_new_reserve(&o, 40, 4, 5000, "http://router:7100", &req);
    bi_check(bi_call(d, req, &reply) == DUET__V1__ERROR_CODE__ERROR_CODE_INVALID,
             "decode: Reserve with an http:// event_url -> INVALID");
    duet_envelope_free(&reply);
    duet_msg_new_reserve(&o, 40, 4, 5000, "tcp://router-without-port", &req);
    bi_check(bi_call(d, req, &reply) == DUET__V1__ERROR_CODE__ERROR_CODE_INVALID,
             "decode: Reserve with a tcp:// event_url without a port -> INVALID");
    duet_envelope_free(&reply);
    {
        char longurl[300];
        memset(longurl, 'a', sizeof longurl - 1);
        memcpy(longurl, "ipc:///", 7);
        longurl[sizeof longurl - 1] = 0;
        duet_msg_new_reserve(&o, 40, 4, 5000, NULL, &req);
        duet_msg_set_str(&req->reserve->event_url, longurl);
        bi_check(bi_call(d, req, &reply) == DUET__V1__ERROR_CODE__ERROR_CODE_RANGE,
                 "decode: Reserve with a 299-byte event_url -> RANGE");
        duet_envelope_free(&reply);
    }
    /* a real reservation, then Prefills with doctored descriptors */
    duet_msg_new_reserve(&o, 40, 4, 5000, NULL, &req);
    if (bi_call(d, req, &reply) != 0 || duet_msg_kind(reply) != DUET__V1__ENVELOPE__BODY_RESERVED) {
        bi_check(0, "decode: Reserve -> Reserved");
        return 1;
    }
    Duet__V1__TransferDescriptor *td = reply->reserved->descriptor;
    o.epoch = reply->header->epoch;
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = 1000 + i;
    /* out-of-range page id */
    duet_envelope_t *pf = NULL, *r2 = NULL;
    duet_msg_new_prefill(&o, toks, 40, td, 5000, NULL, &pf);
    pf->prefill->descriptor->page_ids[0] = 0x7fffffff;
    int code = bi_call(p, pf, &r2);
    bi_check(code == DUET__V1__ERROR_CODE__ERROR_CODE_RANGE, "prefill: page id out of range -> RANGE");
    duet_envelope_free(&r2);
    /* another layout */
    duet_msg_new_prefill(&o, toks, 40, td, 5000, NULL, &pf);
    pf->prefill->descriptor->pools[0]->fingerprint ^= 1;
    code = bi_call(p, pf, &r2);
    bi_check(code == DUET__V1__ERROR_CODE__ERROR_CODE_LAYOUT_MISMATCH, "prefill: other fingerprint -> LAYOUT_MISMATCH");
    duet_envelope_free(&r2);
    /* token outside the vocabulary */
    toks[3] = 1 << 30;
    duet_msg_new_prefill(&o, toks, 40, td, 5000, NULL, &pf);
    code = bi_call(p, pf, &r2);
    bi_check(code == DUET__V1__ERROR_CODE__ERROR_CODE_RANGE, "prefill: token outside the vocabulary -> RANGE");
    duet_envelope_free(&r2);
    toks[3] = 5;
    /* an event URL prefill cannot dial (the request is otherwise valid: nothing is queued) */
    duet_msg_new_prefill(&o, toks, 40, td, 5000, "udp://10.0.0.1:7100", &pf);
    code = bi_call(p, pf, &r2);
    bi_check(code == DUET__V1__ERROR_CODE__ERROR_CODE_INVALID, "prefill: udp:// event_url -> INVALID");
    duet_envelope_free(&r2);
    /* too many pages for the prompt */
    duet_msg_new_prefill(&o, toks, 40, td, 5000, NULL, &pf);
    uint32_t extra[2] = {td->page_ids[0], td->page_ids[0]};
    duet_msg_set_u32s(&pf->prefill->descriptor->page_ids, &pf->prefill->descriptor->n_page_ids, extra, 2);
    code = bi_call(p, pf, &r2);
    bi_check(code == DUET__V1__ERROR_CODE__ERROR_CODE_RANGE, "prefill: page count differs from the prompt's -> RANGE");
    duet_envelope_free(&r2);
    duet_envelope_free(&reply);
    /* nothing reached the pages: the router may free them at once */
    duet_msg_new_abort(&o, DUET__V1__ABORT_REASON__ABORT_REASON_ADMIN, 1, "bad input test", &req);
    bi_check(bi_call(d, req, &reply) == 0 && duet_msg_kind(reply) == DUET__V1__ENVELOPE__BODY_ABORT_ACK &&
                 reply->abort_ack->known, "decode: abort of the reservation acknowledged");
    duet_envelope_free(&reply);
    /* an unknown rid is acknowledged as unknown */
    duet_msg_origin_t o2 = {.sender_id = "driver", .rid = "never-seen"};
    duet_msg_new_abort(&o2, DUET__V1__ABORT_REASON__ABORT_REASON_ADMIN, 0, NULL, &req);
    bi_check(bi_call(d, req, &reply) == 0 && !reply->abort_ack->known, "decode: abort of an unknown rid -> known=false");
    duet_envelope_free(&reply);
    duet_ctl_client_destroy(&p);
    duet_ctl_client_destroy(&d);
    printf("%d passed, %d failed\n", bi_pass, bi_fail);
    return bi_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
    duet_log_init_from_env();
    duet_log_set_ident("duet-driver");
    if (argc >= 2 && !strcmp(argv[1], "run"))
        return cmd_run(argc, argv);
    if (argc >= 3 && !strcmp(argv[1], "state"))
        return cmd_state(argv[2], argc >= 4 && !strcmp(argv[3], "--requests"));
    if (argc >= 4 && !strcmp(argv[1], "bad-input"))
        return cmd_bad_input(argv[2], argv[3]);
    if (argc >= 4 && !strcmp(argv[1], "abort"))
        return cmd_abort(argv[2], argv[3]);
    fprintf(stderr, "usage: duet-driver run ... | state URL [--requests] | abort URL RID\n");
    return 2;
}
