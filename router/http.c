/* The HTTP front door (http.h). */
#include "http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api.h"
#include "log.h"
#include "output.h"
#include "request.h"
#include "time_util.h"

struct duet_http {
    duet_http_opts_t o;
    struct MHD_Daemon *d;
    int port;
};

typedef enum {
    R_NOT_FOUND = 0,
    R_BAD_METHOD,
    R_CHAT,
    R_COMPLETIONS,
    R_MODELS,
    R_MODEL,
    R_HEALTH,
    R_READY,
    R_METRICS,
    R_WORKERS,
    R_ABORT,
} route_t;

/* One HTTP request on one connection (MHD's con_cls).  Two references: MHD's
 * (dropped in on_completed) and a streamed response's (dropped when MHD frees
 * the response). */
typedef struct {
    atomic_int refs;
    duet_http_t *h;
    struct MHD_Connection *mc;
    route_t route;
    char path_id[160]; /* {id} of /v1/models/{id}, /v1/requests/{id}/abort */
    char *body;
    size_t len, cap;
    int too_large;
    char client_rid[65];
    char rid[DUET_RID_LEN + 1]; /* the router's id for this request (x-duet-rid) */
    int fd;
    int counted; /* a response status was counted */
    duet_endpoint_t ep;
    /* generation */
    duet_api_req_t api;
    int have_api;
    duet_rreq_t *r;
    duet_out_t *out;
    json_t *tools_for_parse; /* what tool calls are checked against (owned) */
    char *forced;            /* the forced start of the reply (tool_choice required or named), or NULL */
    size_t forced_len;
    uint32_t ids_sent;       /* generated ids already sent as token_ids (streaming) */
    char id[64];             /* "chatcmpl-RID" / "cmpl-RID" */
    long long created;
    uint32_t fed;            /* tokens fed to the output */
    int stop_cancelled;
    duet_fin_t fin;          /* snapshot once the core is done */
    /* SSE */
    char *sse;
    size_t sse_len, sse_off, sse_cap;
    int sent_role, sse_done, sent_prompt_ids;
    int finished_accounted;
} conn_t;

static void conn_unref(conn_t *k)
{
    if (!k || atomic_fetch_sub(&k->refs, 1) != 1)
        return;
    free(k->body);
    free(k->sse);
    duet_out_destroy(&k->out);
    json_decref(k->tools_for_parse);
    free(k->forced);
    if (k->have_api)
        duet_api_req_fini(&k->api);
    duet_rreq_unref(k->r);
    free(k);
}

/* ---- small helpers ------------------------------------------------------- */

static int valid_rid_header(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return 0;
    return 1;
}

static void new_uuid(char out[DUET_RID_LEN + 1])
{
    uint8_t b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t t = duet_time_ns() ^ ((uint64_t)rand() << 32);
        memcpy(b, &t, 8);
        t = duet_wall_us() * 6364136223846793005ull;
        memcpy(b + 8, &t, 8);
    }
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
    snprintf(out, DUET_RID_LEN + 1, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static uint64_t random_seed(void)
{
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
        s = duet_time_ns() * 0x9E3779B97F4A7C15ull;
    return s & 0x7fffffffffffffffull; /* fits a JSON integer everywhere */
}

static void count(conn_t *k, int status)
{
    if (k->counted)
        return;
    k->counted = 1;
    duet_metrics_count_response(k->h->o.metrics, k->ep, status);
}

static enum MHD_Result respond(conn_t *k, int status, const char *ctype, const char *body, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    MHD_add_response_header(resp, "x-request-id", k->client_rid[0] ? k->client_rid : k->rid);
    MHD_add_response_header(resp, "x-duet-rid", k->rid);
    enum MHD_Result ret = MHD_queue_response(k->mc, (unsigned)status, resp);
    MHD_destroy_response(resp);
    count(k, status);
    return ret;
}

static enum MHD_Result respond_json(conn_t *k, int status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return MHD_NO;
    enum MHD_Result ret = respond(k, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

static enum MHD_Result respond_error(conn_t *k, const duet_api_error_t *e)
{
    char *s = duet_api_error_json(e);
    if (!s)
        return MHD_NO;
    enum MHD_Result ret = respond(k, e->status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

static enum MHD_Result error_resp(conn_t *k, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result error_resp(conn_t *k, int status, const char *param, const char *code, const char *fmt, ...)
{
    duet_api_error_t e;
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    duet_api_error_set(&e, status, NULL, param, code, "%s", m);
    return respond_error(k, &e);
}

/* ---- routes without a request body --------------------------------------- */

static enum MHD_Result get_models(conn_t *k, const char *one)
{
    const duet_http_opts_t *o = &k->h->o;
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(o->served_model));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)o->started_unix));
    json_object_set_new(m, "owned_by", json_string("duet"));
    json_object_set_new(m, "max_model_len", json_integer(o->max_context));
    if (one) {
        if (strcmp(one, o->served_model)) {
            json_decref(m);
            return error_resp(k, 404, "model", "model_not_found", "The model '%.200s' does not exist", one);
        }
        return respond_json(k, 200, m);
    }
    json_t *l = json_object(), *a = json_array();
    json_array_append_new(a, m);
    json_object_set_new(l, "object", json_string("list"));
    json_object_set_new(l, "data", a);
    return respond_json(k, 200, l);
}

static enum MHD_Result get_ready(conn_t *k)
{
    int np = 0, nd = 0;
    duet_core_counts(k->h->o.core, &np, &nd);
    int redis_ok = !k->h->o.store || duet_store_up(k->h->o.store);
    int ready = np > 0 && nd > 0 && redis_ok;
    json_t *j = json_object();
    json_object_set_new(j, "ready", json_boolean(ready));
    json_object_set_new(j, "prefill_workers", json_integer(np));
    json_object_set_new(j, "decode_workers", json_integer(nd));
    json_object_set_new(j, "redis", json_string(!k->h->o.store ? "off" : redis_ok ? "up" : "down"));
    return respond_json(k, ready ? 200 : 503, j);
}

static enum MHD_Result get_metrics(conn_t *k)
{
    duet_text_t t = {0};
    duet_metrics_render(k->h->o.metrics, &t);
    duet_core_render_metrics(k->h->o.core, &t);
    duet_text_printf(&t, "# HELP duet_router_redis_up 1 while Redis is connected (0 also when not configured).\n"
                         "# TYPE duet_router_redis_up gauge\nduet_router_redis_up %d\n",
                     duet_store_up(k->h->o.store));
    enum MHD_Result ret = respond(k, 200, "text/plain; version=0.0.4; charset=utf-8", t.p ? t.p : "", t.len);
    duet_text_fini(&t);
    return ret;
}

static enum MHD_Result post_abort(conn_t *k)
{
    char rid[DUET_RID_LEN + 1];
    if (!duet_core_admin_abort(k->h->o.core, k->path_id, rid))
        return error_resp(k, 404, NULL, "request_not_found", "no request in flight is called '%.100s'", k->path_id);
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(k->path_id));
    json_object_set_new(j, "rid", json_string(rid));
    json_object_set_new(j, "aborted", json_true());
    return respond_json(k, 200, j);
}

/* ---- generation ----------------------------------------------------------- */

/* Wait up to timeout_ms for news about the request.  0 when the client went away. */
static int wait_news(conn_t *k, int timeout_ms)
{
    struct pollfd p[2] = {{.fd = k->r->efd, .events = POLLIN}, {.fd = k->fd, .events = POLLRDHUP}};
    int n = k->fd >= 0 ? 2 : 1;
    int rv = poll(p, (nfds_t)n, timeout_ms);
    if (rv > 0 && n == 2 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)))
        return 0;
    duet_rreq_drain(k->r);
    return 1;
}

/* Feed tokens that arrived to the output; snapshot the end.  Returns the fin. */
static duet_fin_t pump(conn_t *k)
{
    duet_rreq_t *r = k->r;
    int32_t buf[256];
    for (;;) {
        pthread_mutex_lock(&r->mu);
        uint32_t n = r->n_tokens - k->fed;
        if (n > 256)
            n = 256;
        if (n)
            memcpy(buf, r->tokens + k->fed, sizeof(int32_t) * n);
        duet_fin_t fin = n ? DUET_FIN_NONE : r->fin;
        pthread_mutex_unlock(&r->mu);
        if (!n) {
            k->fin = fin;
            break;
        }
        k->fed += n;
        if (!duet_out_stopped(k->out) && duet_out_feed(k->out, buf, n) == DUET_ERR_RANGE)
            duet_out_warn(k->out, "TOKEN_OUT_OF_RANGE", "the model produced a token outside the vocabulary");
    }
    if (duet_out_stopped(k->out) && !k->stop_cancelled) {
        k->stop_cancelled = 1;
        /* the rest of the output is not needed: free the decode worker now */
        pthread_mutex_lock(&r->mu);
        int open = r->fin == DUET_FIN_NONE;
        pthread_mutex_unlock(&r->mu);
        if (open)
            duet_core_cancel(k->h->o.core, r, DUET_CANCEL_STOP_STRING);
    }
    /* a stop string ends the output for the client at once */
    if (duet_out_stopped(k->out))
        return DUET_FIN_STOP;
    return k->fin;
}

static const char *finish_reason(conn_t *k, duet_fin_t fin)
{
    if (duet_out_stopped(k->out))
        return "stop";
    switch (fin) {
    case DUET_FIN_STOP: return duet_out_n_calls(k->out) > 0 ? "tool_calls" : "stop";
    case DUET_FIN_LENGTH: return "length";
    case DUET_FIN_ABORT: return "abort";
    default: return "error";
    }
}

static void finish_output(conn_t *k)
{
    duet_out_finish(k->out);
    if (k->api.kind == DUET_API_CHAT &&
        (k->api.tool_choice == DUET_TOOL_CHOICE_REQUIRED || k->api.tool_choice == DUET_TOOL_CHOICE_NAMED) &&
        duet_out_n_calls(k->out) == 0 && !duet_out_stopped(k->out))
        duet_out_warn(k->out, "TOOL_CHOICE_UNMET", "tool_choice asked for a tool call and the model made none");
}

static void account_end(conn_t *k, const char *fr)
{
    if (k->finished_accounted)
        return;
    k->finished_accounted = 1;
    duet_metrics_count_finish(k->h->o.metrics, fr);
    duet_dsml_code_t code = duet_out_dsml_error(k->out);
    if (code != DUET_DSML_OK)
        duet_metrics_count_dsml_error(k->h->o.metrics, (int)code);
    duet_metrics_add_tokens(k->h->o.metrics, k->r->n_prompt, duet_out_n_tokens(k->out));
}

static json_t *usage_json(conn_t *k)
{
    json_t *u = json_object();
    uint32_t completion = (uint32_t)duet_out_n_tokens(k->out);
    json_object_set_new(u, "prompt_tokens", json_integer(k->r->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(completion));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)k->r->n_prompt + completion));
    pthread_mutex_lock(&k->r->mu);
    uint32_t cached = k->r->cached_tokens;
    pthread_mutex_unlock(&k->r->mu);
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

/* ids[from, to) of the generated tokens as a JSON array (the return_token_ids extension). */
static json_t *token_ids_json(conn_t *k, const int32_t *ids, uint32_t from, uint32_t to)
{
    (void)k;
    json_t *a = json_array();
    for (uint32_t i = from; i < to; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *generated_ids_json(conn_t *k, uint32_t from)
{
    pthread_mutex_lock(&k->r->mu);
    uint32_t to = k->fed <= k->r->n_tokens ? k->fed : k->r->n_tokens;
    json_t *a = token_ids_json(k, k->r->tokens, from < to ? from : to, to);
    pthread_mutex_unlock(&k->r->mu);
    return a;
}

static json_t *envelope(conn_t *k, const char *object)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(k->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(k->created));
    json_object_set_new(o, "model", json_string(k->h->o.served_model));
    return o;
}

static json_t *error_json_for(conn_t *k)
{
    duet_api_error_t e;
    pthread_mutex_lock(&k->r->mu);
    duet_api_error_set(&e, k->r->http_status ? k->r->http_status : 500, k->r->err_type[0] ? k->r->err_type : NULL,
                       NULL, k->r->err_code, "%s", k->r->err_msg);
    pthread_mutex_unlock(&k->r->mu);
    char *s = duet_api_error_json(&e);
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    return j ? j : json_object();
}

static enum MHD_Result respond_failed(conn_t *k)
{
    duet_api_error_t e;
    pthread_mutex_lock(&k->r->mu);
    duet_api_error_set(&e, k->r->http_status ? k->r->http_status : 500, k->r->err_type[0] ? k->r->err_type : NULL,
                       NULL, k->r->err_code[0] ? k->r->err_code : NULL, "%s", k->r->err_msg);
    pthread_mutex_unlock(&k->r->mu);
    return respond_error(k, &e);
}

static enum MHD_Result respond_whole(conn_t *k, duet_fin_t fin)
{
    finish_output(k);
    const char *fr = finish_reason(k, fin);
    account_end(k, fr);
    int chat = k->api.kind == DUET_API_CHAT;
    json_t *o = envelope(k, chat ? "chat.completion" : "text_completion");
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    size_t len;
    const char *content = duet_out_content(k->out, &len);
    if (chat) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        const json_t *calls = duet_out_tool_calls(k->out);
        json_object_set_new(msg, "content", !len && json_array_size(calls) ? json_null() : json_stringn(content, len));
        size_t rl;
        const char *reasoning = duet_out_reasoning(k->out, &rl);
        if (k->api.thinking)
            json_object_set_new(msg, "reasoning_content", json_stringn(reasoning, rl));
        if (json_array_size(calls)) {
            /* "index" belongs to streamed deltas only */
            json_t *copy = json_deep_copy(calls);
            for (size_t i = 0; i < json_array_size(copy); i++)
                json_object_del(json_array_get(copy, i), "index");
            json_object_set_new(msg, "tool_calls", copy);
        }
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", json_stringn(content, len));
    }
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", json_string(fr));
    if (k->api.return_token_ids) {
        json_object_set_new(choice, "token_ids", generated_ids_json(k, 0));
        json_object_set_new(o, "prompt_token_ids", token_ids_json(k, k->r->prompt, 0, k->r->n_prompt));
    }
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage_json(k));
    if (json_array_size(duet_out_warnings(k->out)))
        json_object_set(o, "warnings", (json_t *)duet_out_warnings(k->out));
    return respond_json(k, 200, o);
}

/* ---- SSE -------------------------------------------------------------------- */

static void sse_add(conn_t *k, const char *s, size_t n)
{
    if (k->sse_len + n > k->sse_cap) {
        size_t cap = k->sse_cap ? k->sse_cap : 4096;
        while (cap < k->sse_len + n)
            cap *= 2;
        char *p = realloc(k->sse, cap);
        if (!p)
            return;
        k->sse = p;
        k->sse_cap = cap;
    }
    memcpy(k->sse + k->sse_len, s, n);
    k->sse_len += n;
}

static void sse_event(conn_t *k, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return;
    sse_add(k, "data: ", 6);
    sse_add(k, s, strlen(s));
    sse_add(k, "\n\n", 2);
    free(s);
}

/* One chunk: a chat delta or completion text, and the finish reason when given. */
static void sse_chunk(conn_t *k, json_t *delta, const char *text, size_t text_len, const char *fr, json_t *warnings)
{
    int chat = k->api.kind == DUET_API_CHAT;
    json_t *o = envelope(k, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (chat)
        json_object_set_new(c, "delta", delta ? delta : json_object());
    else
        json_object_set_new(c, "text", json_stringn(text ? text : "", text_len));
    json_object_set_new(c, "logprobs", json_null());
    json_object_set_new(c, "finish_reason", fr ? json_string(fr) : json_null());
    if (k->api.return_token_ids) {
        pthread_mutex_lock(&k->r->mu);
        uint32_t to = k->fed <= k->r->n_tokens ? k->fed : k->r->n_tokens;
        json_object_set_new(c, "token_ids", token_ids_json(k, k->r->tokens, k->ids_sent < to ? k->ids_sent : to, to));
        pthread_mutex_unlock(&k->r->mu);
        if (to > k->ids_sent)
            k->ids_sent = to;
        if (!k->sent_prompt_ids) {
            k->sent_prompt_ids = 1;
            json_object_set_new(o, "prompt_token_ids", token_ids_json(k, k->r->prompt, 0, k->r->n_prompt));
        }
    }
    json_t *cs = json_array();
    json_array_append_new(cs, c);
    json_object_set_new(o, "choices", cs);
    if (k->api.include_usage)
        json_object_set_new(o, "usage", json_null());
    if (warnings)
        json_object_set_new(o, "warnings", warnings);
    sse_event(k, o);
}

/* Move what the output has into SSE chunks. */
static void sse_take(conn_t *k, const char *fr)
{
    json_t *w = duet_out_take_warnings(k->out);
    if (k->api.kind == DUET_API_CHAT) {
        json_t *d = duet_out_take_delta(k->out);
        if (d || w || fr)
            sse_chunk(k, d, NULL, 0, fr, w);
    } else {
        size_t n = 0;
        const char *t = duet_out_take_text(k->out, &n);
        if (t || w || fr)
            sse_chunk(k, NULL, t, n, fr, w);
    }
}

static void sse_produce(conn_t *k)
{
    if (!k->sent_role) {
        k->sent_role = 1;
        if (k->api.kind == DUET_API_CHAT) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            sse_chunk(k, d, NULL, 0, NULL, NULL);
        }
    }
    duet_fin_t fin = pump(k);
    if (fin == DUET_FIN_NONE) {
        sse_take(k, NULL);
        return;
    }
    if (fin == DUET_FIN_ERROR && !duet_out_stopped(k->out)) {
        sse_take(k, NULL);
        json_t *e = error_json_for(k);
        sse_event(k, e);
        account_end(k, "error");
    } else {
        finish_output(k);
        sse_take(k, NULL);
        const char *fr = finish_reason(k, fin);
        account_end(k, fr);
        sse_chunk(k, NULL, NULL, 0, fr, NULL);
        if (k->api.include_usage) {
            json_t *o = envelope(k, k->api.kind == DUET_API_CHAT ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(k));
            sse_event(k, o);
        }
    }
    sse_add(k, "data: [DONE]\n\n", 14);
    k->sse_done = 1;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    conn_t *k = cls;
    (void)pos;
    for (;;) {
        if (k->sse_off < k->sse_len) {
            size_t n = k->sse_len - k->sse_off;
            if (n > max)
                n = max;
            memcpy(buf, k->sse + k->sse_off, n);
            k->sse_off += n;
            if (k->sse_off == k->sse_len)
                k->sse_off = k->sse_len = 0;
            return (ssize_t)n;
        }
        if (k->sse_done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        sse_produce(k);
        if (k->sse_len)
            continue;
        if (!wait_news(k, 500)) {
            duet_core_cancel(k->h->o.core, k->r, DUET_CANCEL_DISCONNECT);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void sse_free(void *cls) { conn_unref(cls); }

/* ---- a generation request ------------------------------------------------------ */

static enum MHD_Result reject_redis(conn_t *k)
{
    return error_resp(k, 503, NULL, "redis_unavailable",
                      "the router's Redis is unavailable; new requests are refused until it is back");
}

/* Build the prompt ids into r; on error respond and return -1. */
static int build_prompt(conn_t *k, duet_rreq_t *r, enum MHD_Result *ret)
{
    const duet_http_opts_t *o = &k->h->o;
    duet_api_req_t *a = &k->api;
    duet_tok_ids_t ids = {0};
    duet_err_t err = {0};
    int thinking = 0;
    if (a->kind == DUET_API_CHAT) {
        duet_chat_opts_t co = {.thinking = a->thinking, .effort = a->effort, .effort_profile = o->effort_profile,
                               .response_format = a->response_format};
        const json_t *last = json_array_get(a->messages, json_array_size(a->messages) - 1);
        const json_t *cf = json_object_get(a->root, "continue_final_message");
        co.continue_final = json_is_true(cf);
        if (json_is_object(last) && json_is_string(json_object_get(last, "role")) &&
            !strcmp(json_string_value(json_object_get(last, "role")), "assistant") && !co.continue_final) {
            *ret = error_resp(k, 400, "messages", "invalid_value",
                              "the last message is an assistant message; set continue_final_message to continue it");
            return -1;
        }
        /* tools in the prompt and tools calls are checked against */
        const json_t *tools = a->tool_choice == DUET_TOOL_CHOICE_NONE ? NULL : a->tools;
        json_t *named = NULL;
        if (a->tool_choice == DUET_TOOL_CHOICE_NAMED) {
            named = json_array();
            for (size_t i = 0; i < json_array_size(a->tools); i++) {
                json_t *t = json_array_get(a->tools, i);
                if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), a->tool_name))
                    json_array_append(named, t);
            }
            tools = named;
        }
        char *prompt = NULL;
        size_t plen = 0;
        duet_status_t st = duet_chat_encode(a->messages, tools, &co, &prompt, &plen, &err);
        if (st != DUET_OK) {
            json_decref(named);
            char param[128];
            duet_api_param_from_message(err.msg, param, sizeof param);
            if (st == DUET_ERR_NOMEM)
                *ret = error_resp(k, 500, NULL, "internal_error", "out of memory");
            else
                *ret = error_resp(k, 400, param, "invalid_value", "%s", err.msg);
            return -1;
        }
        k->tools_for_parse = named ? named : (tools ? json_incref((json_t *)tools) : NULL);
        thinking = a->thinking && plen >= 7 && !memcmp(prompt + plen - 7, "<think>", 7);
        if ((a->tool_choice == DUET_TOOL_CHOICE_REQUIRED || a->tool_choice == DUET_TOOL_CHOICE_NAMED) &&
            !co.continue_final) {
            /* A call is required: the reply is made to open a tool-call block (and, for a named tool, that
             * tool's invoke), so the model can only continue inside it.  In thinking mode the reasoning is
             * closed first: a forced call has no reasoning. */
            char *forced = NULL;
            int fl = asprintf(&forced, "%s\n\n<" DUET_CHAT_DSML "tool_calls>\n%s%s%s", thinking ? DUET_CHAT_THINK_END : "",
                              named ? "<" DUET_CHAT_DSML "invoke name=\"" : "", named ? a->tool_name : "",
                              named ? "\">\n" : "");
            char *np = fl > 0 ? realloc(prompt, plen + (size_t)fl + 1) : NULL;
            if (!np) {
                free(forced);
                free(prompt);
                *ret = error_resp(k, 500, NULL, "internal_error", "out of memory");
                return -1;
            }
            prompt = np;
            memcpy(prompt + plen, forced, (size_t)fl + 1);
            plen += (size_t)fl;
            k->forced = forced;
            k->forced_len = (size_t)fl;
        }
        st = duet_tok_encode(o->tok, prompt, plen, true, &ids, &err);
        free(prompt);
        if (st != DUET_OK) {
            *ret = error_resp(k, 500, NULL, "internal_error", "tokenizing failed: %s", err.msg);
            duet_tok_ids_fini(&ids);
            return -1;
        }
    } else if (a->prompt_ids) {
        duet_tok_ids_push(&ids, a->prompt_ids, a->n_prompt_ids);
    } else {
        int32_t bos = duet_tok_special_id(o->tok, DUET_TOK_BOS);
        if (bos >= 0 && (a->prompt_len < 22 || memcmp(a->prompt, DUET_CHAT_BOS, strlen(DUET_CHAT_BOS))))
            duet_tok_ids_push(&ids, &bos, 1);
        if (duet_tok_encode(o->tok, a->prompt, a->prompt_len, true, &ids, &err) != DUET_OK) {
            *ret = error_resp(k, 500, NULL, "internal_error", "tokenizing failed: %s", err.msg);
            duet_tok_ids_fini(&ids);
            return -1;
        }
    }
    if (ids.len == 0) {
        *ret = error_resp(k, 400, a->kind == DUET_API_CHAT ? "messages" : "prompt", "invalid_value", "the prompt is empty");
        duet_tok_ids_fini(&ids);
        return -1;
    }
    for (size_t i = 0; i < ids.len; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= o->vocab_size) {
            *ret = error_resp(k, 400, "prompt", "invalid_value", "token %d is outside the model's vocabulary (%d)",
                              ids.ids[i], o->vocab_size);
            duet_tok_ids_fini(&ids);
            return -1;
        }
    uint32_t max_tokens = a->max_tokens;
    if (!max_tokens) {
        uint32_t def = a->kind == DUET_API_CHAT ? o->default_max_tokens : 16;
        max_tokens = ids.len < o->max_context ? (uint32_t)(o->max_context - ids.len) : 0;
        if (max_tokens > def)
            max_tokens = def;
    }
    if (ids.len >= o->max_context || (uint64_t)ids.len + max_tokens > o->max_context || max_tokens == 0) {
        *ret = error_resp(k, 400, a->max_tokens ? "max_tokens" : a->kind == DUET_API_CHAT ? "messages" : "prompt",
                          "context_length_exceeded",
                          "This model's maximum context length is %u tokens; the request has %zu prompt tokens and "
                          "asks for %u more",
                          o->max_context, ids.len, max_tokens);
        duet_tok_ids_fini(&ids);
        return -1;
    }
    r->prompt = ids.ids; /* the request owns the ids now */
    r->n_prompt = (uint32_t)ids.len;
    r->max_tokens = max_tokens;
    k->api.thinking = thinking ? 1 : (a->kind == DUET_API_CHAT ? a->thinking : 0);
    return thinking;
}

static int redis_record(conn_t *k, duet_rreq_t *r)
{
    const duet_http_opts_t *o = &k->h->o;
    if (!o->store)
        return 0;
    char key[192], seed[24], created[24], deadline[24], ttl[24], np[16];
    duet_store_key(o->store, key, sizeof key, "req:%s", r->rid);
    uint64_t now_ms = duet_wall_us() / 1000;
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)r->seed);
    snprintf(created, sizeof created, "%llu", (unsigned long long)now_ms);
    snprintf(deadline, sizeof deadline, "%llu", (unsigned long long)(now_ms + o->request_timeout_ms));
    snprintf(ttl, sizeof ttl, "%llu", (unsigned long long)o->request_timeout_ms / 1000 + o->record_ttl_s);
    snprintf(np, sizeof np, "%u", r->n_prompt);
    duet_store_reply_t rep;
    const char *argv[32] = {"HSET", key, "state", "queued", "owner", o->nonce, "owner_id", o->router_id,
                            "created_ms", created, "deadline_ms", deadline, "seed", seed, "endpoint", r->endpoint,
                            "prompt_tokens", np};
    int argc = 18;
    if (k->client_rid[0]) {
        argv[argc++] = "x_request_id";
        argv[argc++] = k->client_rid;
    }
    if (r->session[0]) {
        argv[argc++] = "session";
        argv[argc++] = r->session;
    }
    duet_status_t st = duet_store_callv(o->store, argc, argv, 500, &rep);
    if (st != DUET_OK || rep.type == 3)
        return -1;
    duet_store_send(o->store, "EXPIRE", key, ttl, NULL);
    if (r->session[0]) {
        char skey[256];
        duet_store_key(o->store, skey, sizeof skey, "session:%s", r->session);
        if (duet_store_call(o->store, 100, &rep, "GET", skey, NULL) == DUET_OK && rep.type == 1)
            snprintf(r->session_hint, sizeof r->session_hint, "%.64s", rep.str);
    }
    return 0;
}

static enum MHD_Result generate(conn_t *k)
{
    const duet_http_opts_t *o = &k->h->o;
    duet_api_error_t e;
    duet_api_limits_t lim = {.served_model = o->served_model, .vocab_size = o->vocab_size,
                             .default_max_tokens_chat = o->default_max_tokens,
                             .default_max_tokens_completion = 16};
    duet_api_kind_t kind = k->route == R_CHAT ? DUET_API_CHAT : DUET_API_COMPLETION;
    if (duet_api_parse(kind, k->body ? k->body : "", k->len, &lim, &k->api, &e) != 0)
        return respond_error(k, &e);
    k->have_api = 1;
    if (o->store && !duet_store_up(o->store))
        return reject_redis(k);
    duet_rreq_t *r = duet_rreq_new();
    if (!r)
        return error_resp(k, 500, NULL, "internal_error", "out of memory");
    k->r = r;
    snprintf(r->rid, sizeof r->rid, "%s", k->rid);
    snprintf(r->client_rid, sizeof r->client_rid, "%s", k->client_rid);
    r->endpoint = kind == DUET_API_CHAT ? "chat" : "completions";
    snprintf(k->id, sizeof k->id, "%s%s", kind == DUET_API_CHAT ? "chatcmpl-" : "cmpl-", r->rid);
    k->created = (long long)time(NULL);
    enum MHD_Result ret = MHD_NO;
    int thinking = build_prompt(k, r, &ret);
    if (thinking < 0)
        return ret;
    const char *sess = k->api.session ? k->api.session : MHD_lookup_connection_value(k->mc, MHD_HEADER_KIND, "x-session-id");
    if (sess && strlen(sess) <= 128)
        snprintf(r->session, sizeof r->session, "%s", sess);
    r->temperature = k->api.temperature;
    r->top_p = k->api.top_p;
    r->top_k = k->api.top_k;
    r->min_p = k->api.min_p;
    r->seed = k->api.has_seed ? k->api.seed : random_seed();
    r->ignore_eos = k->api.ignore_eos;
    if (k->api.n_stop_ids) {
        r->stop_ids = malloc(sizeof(int32_t) * k->api.n_stop_ids);
        if (r->stop_ids) {
            memcpy(r->stop_ids, k->api.stop_ids, sizeof(int32_t) * k->api.n_stop_ids);
            r->n_stop_ids = (uint32_t)k->api.n_stop_ids;
        }
    }
    r->created_ns = duet_time_ns();
    r->deadline_ns = r->created_ns + (uint64_t)o->request_timeout_ms * 1000000ull;
    duet_out_opts_t oo = {.tok = o->tok, .chat = kind == DUET_API_CHAT, .thinking = thinking,
                          .tools = k->tools_for_parse, .id_seed = r->seed, .stop = k->api.stop,
                          .n_stop = k->api.n_stop, .skip_special_tokens = k->api.skip_special_tokens,
                          .prefix = k->forced, .prefix_len = k->forced_len};
    if (duet_out_create(&oo, &k->out) != DUET_OK)
        return error_resp(k, 400, "stop", "invalid_value", "'stop' strings must be valid UTF-8");
    if (redis_record(k, r) != 0)
        return reject_redis(k);
    duet_log_rid(DUET_LOG_DEBUG, r->rid, "%s: %u prompt tokens, max %u, seed %llu, x-request-id %s", r->endpoint,
                 r->n_prompt, r->max_tokens, (unsigned long long)r->seed, k->client_rid);
    duet_core_submit(o->core, r);
    /* wait until prefill took it (a 200 can then be promised) or it failed */
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int go = r->accepted || r->n_tokens || r->fin != DUET_FIN_NONE;
        duet_fin_t fin = r->fin;
        pthread_mutex_unlock(&r->mu);
        if (fin == DUET_FIN_ERROR)
            return respond_failed(k);
        if (go)
            break;
        if (!wait_news(k, 500)) {
            duet_core_cancel(o->core, r, DUET_CANCEL_DISCONNECT);
            count(k, 499);
            return MHD_NO;
        }
    }
    if (k->api.stream) {
        atomic_fetch_add(&k->refs, 1);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, k, sse_free);
        if (!resp) {
            conn_unref(k);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "x-request-id", k->client_rid[0] ? k->client_rid : r->rid);
        MHD_add_response_header(resp, "x-duet-rid", r->rid);
        enum MHD_Result q = MHD_queue_response(k->mc, 200, resp);
        MHD_destroy_response(resp);
        count(k, 200);
        return q;
    }
    for (;;) {
        duet_fin_t fin = pump(k);
        if (fin == DUET_FIN_ERROR)
            return respond_failed(k);
        if (fin != DUET_FIN_NONE)
            return respond_whole(k, fin);
        if (!wait_news(k, 500)) {
            duet_core_cancel(o->core, r, DUET_CANCEL_DISCONNECT);
            count(k, 499);
            return MHD_NO;
        }
    }
}

/* ---- MHD callbacks --------------------------------------------------------------- */

static route_t classify(conn_t *k, const char *url, const char *method)
{
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    struct {
        const char *path;
        route_t r;
        int is_post;
    } fixed[] = {
        {"/v1/chat/completions", R_CHAT, 1}, {"/v1/completions", R_COMPLETIONS, 1}, {"/v1/models", R_MODELS, 0},
        {"/health", R_HEALTH, 0},            {"/ready", R_READY, 0},               {"/metrics", R_METRICS, 0},
        {"/v1/workers", R_WORKERS, 0},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(url, fixed[i].path)) {
            if (fixed[i].is_post ? !post : !get)
                return R_BAD_METHOD;
            return fixed[i].r;
        }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        snprintf(k->path_id, sizeof k->path_id, "%s", url + 11);
        return get ? R_MODEL : R_BAD_METHOD;
    }
    size_t n = strlen(url);
    if (!strncmp(url, "/v1/requests/", 13) && n > 19 && !strcmp(url + n - 6, "/abort") && n - 19 < sizeof k->path_id) {
        memcpy(k->path_id, url + 13, n - 19);
        k->path_id[n - 19] = 0;
        return post ? R_ABORT : R_BAD_METHOD;
    }
    return R_NOT_FOUND;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    duet_http_t *h = cls;
    (void)version;
    conn_t *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k)
            return MHD_NO;
        atomic_init(&k->refs, 1);
        k->h = h;
        k->mc = mc;
        k->fd = -1;
        new_uuid(k->rid);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            k->fd = ci->connect_fd;
        k->route = classify(k, url, method);
        k->ep = k->route == R_CHAT ? DUET_EP_CHAT : k->route == R_COMPLETIONS ? DUET_EP_COMPLETIONS : DUET_EP_OTHER;
        const char *xr = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-request-id");
        if (xr && valid_rid_header(xr))
            snprintf(k->client_rid, sizeof k->client_rid, "%s", xr);
        *con_cls = k;
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->o.max_body) {
            k->too_large = 1;
            return error_resp(k, 413, NULL, "request_too_large", "the request body (%s bytes) is over the limit of %zu bytes",
                              cl, h->o.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_large && k->len + *upload_size > h->o.max_body) {
            k->too_large = 1;
            free(k->body);
            k->body = NULL;
            k->len = k->cap = 0;
        }
        if (!k->too_large) {
            if (k->len + *upload_size + 1 > k->cap) {
                size_t cap = k->cap ? k->cap : 4096;
                while (cap < k->len + *upload_size + 1)
                    cap *= 2;
                char *p = realloc(k->body, cap);
                if (!p)
                    return MHD_NO;
                k->body = p;
                k->cap = cap;
            }
            memcpy(k->body + k->len, upload, *upload_size);
            k->len += *upload_size;
            k->body[k->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->too_large)
        return error_resp(k, 413, NULL, "request_too_large", "the request body is over the limit of %zu bytes",
                          h->o.max_body);
    switch (k->route) {
    case R_CHAT:
    case R_COMPLETIONS: return generate(k);
    case R_MODELS: return get_models(k, NULL);
    case R_MODEL: return get_models(k, k->path_id);
    case R_HEALTH: {
        json_t *j = json_object();
        json_object_set_new(j, "status", json_string("ok"));
        return respond_json(k, 200, j);
    }
    case R_READY: return get_ready(k);
    case R_METRICS: return get_metrics(k);
    case R_WORKERS: {
        json_t *j = json_object();
        json_object_set_new(j, "object", json_string("list"));
        json_object_set_new(j, "data", duet_core_workers_json(h->o.core));
        json_object_set_new(j, "redis", json_string(!h->o.store ? "off" : duet_store_up(h->o.store) ? "up" : "down"));
        return respond_json(k, 200, j);
    }
    case R_ABORT: return post_abort(k);
    case R_BAD_METHOD:
        return error_resp(k, 405, NULL, "method_not_allowed", "%s is not allowed on %.200s", method, url);
    default: return error_resp(k, 404, NULL, "not_found", "no route %.200s", url);
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)mc;
    conn_t *k = *con_cls;
    if (!k)
        return;
    *con_cls = NULL;
    if (k->r && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* the client went away (or the connection failed) before the end: stop the workers */
        duet_core_cancel(k->h->o.core, k->r, DUET_CANCEL_DISCONNECT);
        if (!k->counted)
            count(k, 499);
    }
    conn_unref(k);
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && m[n - 1] == '\n')
        m[--n] = 0;
    duet_debug("http: %s", m);
}

duet_status_t duet_http_start(const duet_http_opts_t *o, duet_http_t **out, duet_err_t *err)
{
    duet_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    h->o = *o;
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->listen_host ? o->listen_host : "127.0.0.1", &sin.sin_addr) != 1) {
        free(h);
        return duet_err_set(err, DUET_ERR_INVALID, "--listen: '%s' is not an IPv4 address", o->listen_host);
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_access, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&sin, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->max_connections ? o->max_connections : 1024),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
                            MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return duet_err_set(err, DUET_ERR_BUSY, "cannot listen on %s:%d (in use?)", o->listen_host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return DUET_OK;
}

int duet_http_port(const duet_http_t *h) { return h->port; }

void duet_http_quiesce(duet_http_t *h)
{
    if (h && h->d)
        MHD_quiesce_daemon(h->d);
}

void duet_http_stop(duet_http_t **ph)
{
    duet_http_t *h = ph ? *ph : NULL;
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    free(h);
    *ph = NULL;
}
