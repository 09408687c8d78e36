/* duet-bench-agents: agent-style load against a duet-router, with corruption,
 * wedge and leak detection (docs/BENCH.md).
 *
 *   duet-bench-agents --url http://127.0.0.1:8000 --model DIR [options]
 *
 * Sessions of N turns talk to the router like any OpenAI client: a system
 * prompt padded with seeded filler, tools, and per turn a user message, an
 * assistant tool call (valid against one tool's schema) and the tool's result;
 * the model's reply becomes the next turn's assistant message.  Every request
 * asks for return_token_ids; after the load, each completed request's output
 * ids are compared with a single-process duet-generate run on the exact
 * prompt ids the router returned (bench_agents_check.c).  Chaos options drop
 * clients, kill and restart a decode worker, restart Redis.
 *
 * One thread: libcurl's multi interface carries every request; the run, each
 * request and each chaos step have deadlines, and every loop is bounded. */
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_agents.h"
#include "time_util.h"

/* ---------------------------------------------------------------- seeded randomness */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rnd(rng_t *r) { return r->s = mix64(r->s); }
static int rnd_int(rng_t *r, int lo, int hi) { return lo + (int)(rnd(r) % (uint64_t)(hi - lo + 1)); }
static double rnd_unit(rng_t *r) { return (double)(rnd(r) >> 11) * (1.0 / 9007199254740992.0); }
static rng_t rng_for(uint64_t seed, uint64_t a, uint64_t b)
{
    return (rng_t){mix64(mix64(seed ^ 0x6a09e667f3bcc909ull) ^ mix64(a * 0x100000001b3ull + b))};
}

static const char *const WORDS[] = {
    "the",     "system",  "agent",   "file",    "read",    "write",   "value",   "result",  "check",   "build",
    "test",    "server",  "request", "page",    "cache",   "token",   "model",   "decode",  "prefill", "router",
    "session", "query",   "answer",  "error",   "status",  "report",  "number",  "table",   "list",    "index",
    "of",      "and",     "to",      "in",      "is",      "for",     "with",    "on",      "that",    "from",
    "weather", "city",    "search",  "path",    "line",    "command", "output",  "input",   "time",    "memory",
    "network", "disk",    "queue",   "thread",  "process", "signal",  "config",  "option",  "default", "limit",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

static const char *const CITIES[] = {"Paris", "Oslo", "Rome", "Lima", "Cairo", "Tokyo", "Quito", "Accra"};
static const char *const UNITS[] = {"celsius", "fahrenheit"};

static void sb_str(ba_buf_t *b, const char *s) { ba_buf_add(b, s, strlen(s)); }

static void words(ba_buf_t *b, rng_t *r, int n)
{
    for (int i = 0; i < n; i++) {
        if (i)
            ba_buf_add(b, (i % 12) ? " " : ". ", (i % 12) ? 1 : 2);
        sb_str(b, WORDS[rnd(r) % N_WORDS]);
    }
}

/* ---------------------------------------------------------------- tools and messages */

static json_t *prop(const char *type, const char *desc)
{
    return json_pack("{s:s, s:s}", "type", type, "description", desc);
}

static json_t *tool(const char *name, const char *desc, json_t *props, json_t *required)
{
    return json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:o, s:o}}}", "type", "function", "function", "name", name,
                     "description", desc, "parameters", "type", "object", "properties", props, "required",
                     required);
}

static json_t *make_tools(int n_tools)
{
    json_t *units = json_pack("{s:s, s:[s, s]}", "type", "string", "enum", UNITS[0], UNITS[1]);
    json_t *t = json_array();
    json_array_append_new(t, tool("get_weather", "Current weather and a forecast for a city",
                                  json_pack("{s:o, s:o, s:o}", "city", prop("string", "city name"), "days",
                                            prop("integer", "days of forecast, 1 to 7"), "units", units),
                                  json_pack("[s]", "city")));
    json_array_append_new(t, tool("search_files", "Search files under a path for a pattern",
                                  json_pack("{s:o, s:o, s:o}", "pattern", prop("string", "regular expression"),
                                            "path", prop("string", "directory"), "max_results",
                                            prop("integer", "at most this many matches")),
                                  json_pack("[s]", "pattern")));
    json_array_append_new(t, tool("read_file", "Read lines of a file",
                                  json_pack("{s:o, s:o, s:o}", "path", prop("string", "file path"), "start_line",
                                            prop("integer", "first line, 1-based"), "end_line",
                                            prop("integer", "last line")),
                                  json_pack("[s]", "path")));
    json_array_append_new(t, tool("run_command", "Run a shell command and return its output",
                                  json_pack("{s:o, s:o, s:o}", "command", prop("string", "the command line"),
                                            "timeout_s", prop("number", "seconds before it is stopped"), "cwd",
                                            prop("string", "working directory")),
                                  json_pack("[s]", "command")));
    while ((int)json_array_size(t) > n_tools)
        json_array_remove(t, json_array_size(t) - 1);
    return t;
}

static char *a_path(rng_t *r)
{
    char b[96];
    snprintf(b, sizeof b, "/srv/%s/%s_%d.%s", WORDS[rnd(r) % N_WORDS], WORDS[rnd(r) % N_WORDS], rnd_int(r, 0, 99),
             (rnd(r) & 1) ? "c" : "md");
    return strdup(b);
}

/* A call valid against one tool's schema, and the tool's result text. */
static void make_call(rng_t *r, int n_tools, int session, int turn, json_t **call_msg, json_t **result_msg)
{
    char id[48];
    snprintf(id, sizeof id, "call_s%d_t%d", session, turn);
    int which = rnd_int(r, 0, n_tools - 1);
    const char *name = NULL;
    json_t *args = json_object();
    ba_buf_t res = {0};
    switch (which) {
    case 0:
        name = "get_weather";
        json_object_set_new(args, "city", json_string(CITIES[rnd(r) % 8]));
        if (rnd(r) & 1)
            json_object_set_new(args, "days", json_integer(rnd_int(r, 1, 7)));
        if (rnd(r) & 1)
            json_object_set_new(args, "units", json_string(UNITS[rnd(r) & 1]));
        {
            char b[96];
            snprintf(b, sizeof b, "{\"temperature\": %d, \"sky\": \"%s\", \"wind_kmh\": %d}", rnd_int(r, -10, 35),
                     (rnd(r) & 1) ? "clear" : "cloudy", rnd_int(r, 0, 60));
            sb_str(&res, b);
        }
        break;
    case 1: {
        name = "search_files";
        ba_buf_t p = {0};
        words(&p, r, 2);
        json_object_set_new(args, "pattern", json_string(p.s));
        free(p.s);
        if (rnd(r) & 1) {
            char *path = a_path(r);
            json_object_set_new(args, "path", json_string(path));
            free(path);
        }
        if (rnd(r) & 1)
            json_object_set_new(args, "max_results", json_integer(rnd_int(r, 1, 50)));
        int n = rnd_int(r, 1, 4);
        for (int i = 0; i < n; i++) {
            char *path = a_path(r);
            char b[160];
            snprintf(b, sizeof b, "%s:%d: ", path, rnd_int(r, 1, 900));
            free(path);
            sb_str(&res, b);
            words(&res, r, rnd_int(r, 3, 8));
            sb_str(&res, "\n");
        }
        break;
    }
    case 2: {
        name = "read_file";
        char *path = a_path(r);
        json_object_set_new(args, "path", json_string(path));
        free(path);
        int a = rnd_int(r, 1, 200);
        if (rnd(r) & 1) {
            json_object_set_new(args, "start_line", json_integer(a));
            json_object_set_new(args, "end_line", json_integer(a + rnd_int(r, 1, 20)));
        }
        words(&res, r, rnd_int(r, 10, 40));
        break;
    }
    default: {
        name = "run_command";
        ba_buf_t c = {0};
        sb_str(&c, (rnd(r) & 1) ? "make " : "grep -rn ");
        words(&c, r, rnd_int(r, 1, 3));
        json_object_set_new(args, "command", json_string(c.s));
        free(c.s);
        if (rnd(r) & 1)
            json_object_set_new(args, "timeout_s", json_real((double)rnd_int(r, 1, 120) / 2.0));
        if (rnd(r) & 1) {
            char *path = a_path(r);
            json_object_set_new(args, "cwd", json_string(path));
            free(path);
        }
        sb_str(&res, "exit status 0\n");
        words(&res, r, rnd_int(r, 5, 25));
        break;
    }
    }
    char *arg_text = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(args);
    *call_msg = json_pack("{s:s, s:s, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role", "assistant", "content", "",
                          "tool_calls", "id", id, "type", "function", "function", "name", name, "arguments",
                          arg_text);
    *result_msg = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id, "content", res.s ? res.s : "");
    free(arg_text);
    free(res.s);
}

/* ---------------------------------------------------------------- sessions and transfers */

typedef struct transfer transfer_t;

typedef struct {
    int id;
    int turn;           /* the turn in flight or next */
    json_t *messages;   /* history */
    size_t committed;   /* messages before the turn in flight */
    int active, done;
    int last_prompt_len;
    double start_at;    /* open loop: arrival time */
    transfer_t *tx;
} session_t;

struct transfer {
    CURL *h;
    struct curl_slist *hdr;
    session_t *s;
    ba_req_t *q;
    char *body;
    ba_buf_t in;          /* response bytes not yet consumed */
    int got_done;       /* streamed: data: [DONE] */
    int drop;           /* the bench drops it now */
    ba_buf_t content;     /* the reply for the history */
    json_t *tool_calls;
};

typedef struct {
    ba_opts_t o;
    ba_run_t run;
    CURLM *multi;
    json_t *tools;
    char *system_prompt;
    session_t *sess;
    double t0;
    int in_flight;
    long out_tokens;
    long n_done, n_fail, n_disc, n_timeout;
    volatile sig_atomic_t *stop;
} bench_t;

volatile sig_atomic_t g_stop; /* SIGINT/SIGTERM seen (bench_agents.h) */
static void on_signal(int sig)
{
    (void)sig;
    g_stop++;
}

static double now_rel(const bench_t *b) { return duet_time_s() - b->t0; }

static void req_push_ids(int32_t **a, int *n, int *cap, const json_t *arr)
{
    size_t m = json_array_size(arr);
    if (!m)
        return;
    if (*n + (int)m > *cap) {
        int c = *cap ? *cap : 64;
        while (c < *n + (int)m)
            c *= 2;
        int32_t *p = realloc(*a, sizeof(int32_t) * (size_t)c);
        if (!p)
            return;
        *a = p;
        *cap = c;
    }
    for (size_t i = 0; i < m; i++)
        (*a)[(*n)++] = (int32_t)json_integer_value(json_array_get(arr, i));
}

static void add_gap(ba_req_t *q, double g)
{
    if (q->n_gaps == q->cap_gaps) {
        int c = q->cap_gaps ? q->cap_gaps * 2 : 32;
        double *p = realloc(q->gaps, sizeof(double) * (size_t)c);
        if (!p)
            return;
        q->gaps = p;
        q->cap_gaps = c;
    }
    q->gaps[q->n_gaps++] = g;
}

static void note_warnings(ba_req_t *q, const json_t *w)
{
    size_t i;
    const json_t *x;
    json_array_foreach(w, i, x)
    {
        const char *code = json_string_value(json_object_get(x, "code"));
        if (code && !strncmp(code, "DSML_", 5) && !q->dsml_code[0])
            snprintf(q->dsml_code, sizeof q->dsml_code, "%s", code);
    }
}

static void add_tool_call_delta(transfer_t *t, const json_t *calls)
{
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c)
    {
        json_t *copy = json_deep_copy(c);
        json_object_del(copy, "index");
        if (!t->tool_calls)
            t->tool_calls = json_array();
        json_array_append_new(t->tool_calls, copy);
    }
}

/* One SSE event's JSON. */
static void on_event(bench_t *b, transfer_t *t, const json_t *j)
{
    ba_req_t *q = t->q;
    const json_t *e = json_object_get(j, "error");
    if (e) {
        q->outcome = BA_STREAM_ERROR;
        const char *m = json_string_value(json_object_get(e, "message"));
        const char *code = json_string_value(json_object_get(e, "code"));
        snprintf(q->err, sizeof q->err, "SSE error event: %s (%s)", m ? m : "?", code ? code : "no code");
        return;
    }
    const json_t *p = json_object_get(j, "prompt_token_ids");
    if (p && !q->n_prompt) {
        int cap = 0;
        req_push_ids(&q->prompt, &q->n_prompt, &cap, p);
    }
    note_warnings(q, json_object_get(j, "warnings"));
    const json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    if (!c)
        return;
    const json_t *ids = json_object_get(c, "token_ids");
    size_t k = json_array_size(ids);
    if (k) {
        double t_now = now_rel(b);
        if (q->t_first < 0)
            q->t_first = t_now;
        else
            for (size_t i = 0; i < k; i++)
                add_gap(q, (t_now - q->t_last) / (double)k);
        q->t_last = t_now;
        req_push_ids(&q->out, &q->n_out, &q->cap_out, ids);
        b->out_tokens += (long)k;
        if (q->disc_plan == BA_DISC_MID_STREAM && q->n_out >= q->disc_after)
            t->drop = 1;
    }
    const json_t *d = json_object_get(c, "delta");
    const json_t *s = json_object_get(d, "content");
    if (json_is_string(s)) /* by its length: the text may hold U+0000 */
        ba_buf_add(&t->content, json_string_value(s), json_string_length(s));
    add_tool_call_delta(t, json_object_get(d, "tool_calls"));
    const char *fr = json_string_value(json_object_get(c, "finish_reason"));
    if (fr)
        snprintf(q->finish, sizeof q->finish, "%s", fr);
}

static void parse_sse(bench_t *b, transfer_t *t)
{
    size_t off = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        char *end = t->in.n > off ? strstr(t->in.s + off, "\n\n") : NULL;
        if (!end)
            break;
        *end = 0;
        const char *line = t->in.s + off;
        off = (size_t)(end - t->in.s) + 2;
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        line += 6;
        if (!strcmp(line, "[DONE]")) {
            t->got_done = 1;
            continue;
        }
        json_error_t je;
        json_t *j = json_loads(line, JSON_ALLOW_NUL, &je); /* a token may decode to U+0000: "\\u0000" */
        if (!j) {
            /* the parser's reason and the bytes around where it stopped, escaped */
            char near[48];
            size_t len = strlen(line), at = je.position > 0 && (size_t)je.position <= len ? (size_t)je.position : 0;
            size_t from = at > 12 ? at - 12 : 0, k = 0;
            for (size_t i = from; i < len && i < from + 24 && k + 5 < sizeof near; i++) {
                unsigned char ch = (unsigned char)line[i];
                k += (size_t)snprintf(near + k, sizeof near - k, ch >= 0x20 && ch < 0x7f && ch != '\\' ? "%c" : "\\x%02x",
                                      ch);
            }
            near[k] = 0;
            t->q->outcome = BA_STREAM_ERROR;
            snprintf(t->q->err, sizeof t->q->err, "an SSE event that is not JSON (%.60s at byte %d of %zu: \"%s\")",
                     je.text, je.position, len, near);
            continue;
        }
        on_event(b, t, j);
        json_decref(j);
    }
    if (off) {
        memmove(t->in.s, t->in.s + off, t->in.n - off);
        t->in.n -= off;
        t->in.s[t->in.n] = 0;
    }
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    transfer_t *t = ud;
    size_t n = size * nmemb;
    ba_buf_add(&t->in, ptr, n);
    return n;
}

static size_t on_header(char *buf, size_t size, size_t n, void *ud)
{
    transfer_t *t = ud;
    size_t len = size * n;
    if (len > 12 && !strncasecmp(buf, "x-duet-rid:", 11)) {
        const char *v = buf + 11;
        while (*v == ' ')
            v++;
        size_t m = len - (size_t)(v - buf);
        while (m && (v[m - 1] == '\r' || v[m - 1] == '\n'))
            m--;
        if (m >= sizeof t->q->rid)
            m = sizeof t->q->rid - 1;
        memcpy(t->q->rid, v, m);
        t->q->rid[m] = 0;
    }
    return len;
}

static ba_req_t *new_req(bench_t *b, session_t *s)
{
    ba_run_t *run = &b->run;
    if (run->n_reqs == run->cap_reqs) {
        size_t c = run->cap_reqs ? run->cap_reqs * 2 : 256;
        ba_req_t **p = realloc(run->reqs, sizeof(*p) * c);
        if (!p)
            return NULL;
        run->reqs = p;
        run->cap_reqs = c;
    }
    ba_req_t *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    run->reqs[run->n_reqs++] = q;
    q->session = s->id;
    q->turn = s->turn;
    q->t_first = -1;
    q->seed = mix64(b->o.seed * 0x9e3779b97f4a7c15ull + (uint64_t)s->id * 1000003ull + (uint64_t)s->turn) &
              ((1ull << 48) - 1);
    /* the disconnect plan is a function of the run seed too, so a run replays */
    rng_t r = rng_for(b->o.seed, (uint64_t)s->id, 0x1000u + (uint64_t)s->turn);
    if (b->o.disconnect_fraction > 0 && rnd_unit(&r) < b->o.disconnect_fraction) {
        if ((rnd(&r) & 1) || b->o.max_tokens < 2 || !b->o.stream) {
            q->disc_plan = BA_DISC_BEFORE_FIRST;
            q->disc_at = rnd_unit(&r) * 2.0; /* within 2 s of sending: queued, prefilling or just decoding */
        } else {
            q->disc_plan = BA_DISC_MID_STREAM;
            q->disc_after = rnd_int(&r, 1, b->o.max_tokens - 1);
        }
    }
    return q;
}

/* Append this turn's user message, tool call and tool result; send the request. */
static int start_turn(bench_t *b, session_t *s)
{
    rng_t r = rng_for(b->o.seed, (uint64_t)s->id, (uint64_t)s->turn + 1);
    s->committed = json_array_size(s->messages);
    ba_buf_t u = {0};
    char head[64];
    snprintf(head, sizeof head, "Step %d: ", s->turn + 1);
    sb_str(&u, head);
    words(&u, &r, rnd_int(&r, 8, 24));
    sb_str(&u, "?");
    json_array_append_new(s->messages, json_pack("{s:s, s:s}", "role", "user", "content", u.s));
    free(u.s);
    json_t *call = NULL, *result = NULL;
    make_call(&r, b->o.n_tools, s->id, s->turn, &call, &result);
    json_array_append_new(s->messages, call);
    json_array_append_new(s->messages, result);

    transfer_t *t = calloc(1, sizeof *t);
    ba_req_t *q = t ? new_req(b, s) : NULL;
    if (!q) {
        free(t);
        return -1;
    }
    t->s = s;
    t->q = q;
    char sid[48];
    snprintf(sid, sizeof sid, "bench-%llx-s%d", (unsigned long long)(b->o.seed & 0xffffffffu), s->id);
    json_t *body = json_pack("{s:O, s:O, s:s, s:i, s:b, s:b, s:s, s:I}", "messages", s->messages, "tools", b->tools, "tool_choice", "auto", "max_tokens", b->o.max_tokens,
                             "return_token_ids", 1, "stream", b->o.stream, "session_id", sid, "seed",
                             (json_int_t)q->seed);
    json_object_set_new(body, "temperature", json_real(b->o.temperature));
    json_object_set_new(body, "thinking", json_boolean(b->o.thinking));
    t->body = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    char url[512];
    snprintf(url, sizeof url, "%s/v1/chat/completions", b->o.url);
    t->h = curl_easy_init();
    t->hdr = curl_slist_append(NULL, "Content-Type: application/json");
    t->hdr = curl_slist_append(t->hdr, "Expect:");
    if (!t->h || !t->body) {
        free(t->body);
        free(t);
        return -1;
    }
    curl_easy_setopt(t->h, CURLOPT_URL, url);
    curl_easy_setopt(t->h, CURLOPT_HTTPHEADER, t->hdr);
    curl_easy_setopt(t->h, CURLOPT_POSTFIELDS, t->body);
    curl_easy_setopt(t->h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(t->h, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(t->h, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(t->h, CURLOPT_PRIVATE, t);
    curl_easy_setopt(t->h, CURLOPT_TIMEOUT_MS, (long)(b->o.timeout_s * 1000.0));
    curl_easy_setopt(t->h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(t->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->h, CURLOPT_TCP_NODELAY, 1L);
    q->t_start = now_rel(b);
    if (curl_multi_add_handle(b->multi, t->h) != CURLM_OK) {
        curl_easy_cleanup(t->h);
        curl_slist_free_all(t->hdr);
        free(t->body);
        free(t);
        return -1;
    }
    s->tx = t;
    b->in_flight++;
    return 0;
}

/* A failed transfer overlapping a chaos window is caused by it. */
static int in_chaos(const bench_t *b, const ba_req_t *q)
{
    for (int i = 0; i < b->run.n_chaos; i++) {
        const ba_chaos_t *c = &b->run.chaos[i];
        if (c->killed_s < 0)
            continue;
        double end = c->window_end_s >= 0 ? c->window_end_s : 1e18;
        if (q->t_end >= c->killed_s && q->t_start <= end)
            return 1;
    }
    return 0;
}

/* The transfer ended (done, failed or dropped): classify, update the session's history. */
static void finish_transfer(bench_t *b, transfer_t *t, CURLcode cc)
{
    ba_req_t *q = t->q;
    session_t *s = t->s;
    q->t_end = now_rel(b);
    long status = 0;
    curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
    q->http_status = (int)status;
    if (t->drop) {
        q->outcome = BA_DISCONNECTED;
        q->disc_done = q->t_first < 0 ? BA_DISC_BEFORE_FIRST : BA_DISC_MID_STREAM;
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
        q->outcome = BA_TIMEOUT;
        snprintf(q->err, sizeof q->err, "no end within %.0f s", b->o.timeout_s);
    } else if (cc != CURLE_OK) {
        q->outcome = BA_CONN_ERROR;
        snprintf(q->err, sizeof q->err, "%s", curl_easy_strerror(cc));
    } else if (status != 200) {
        q->outcome = BA_HTTP_ERROR;
        json_t *j = json_loads(t->in.s ? t->in.s : "", JSON_ALLOW_NUL, NULL);
        const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        snprintf(q->err, sizeof q->err, "HTTP %ld: %s", status, m ? m : "(no error message)");
        json_decref(j);
    } else if (b->o.stream) {
        if (t->in.n)
            parse_sse(b, t);
        if (q->outcome == BA_OK && (!t->got_done || !q->finish[0])) {
            q->outcome = BA_CONN_ERROR;
            snprintf(q->err, sizeof q->err, "the stream ended without %s", !q->finish[0] ? "a finish_reason" : "[DONE]");
        }
    } else {
        json_t *j = json_loads(t->in.s ? t->in.s : "", JSON_ALLOW_NUL, NULL);
        const json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        if (!j || !c) {
            q->outcome = BA_CONN_ERROR;
            snprintf(q->err, sizeof q->err, "a 200 response without choices");
        } else {
            int cap = 0;
            req_push_ids(&q->prompt, &q->n_prompt, &cap, json_object_get(j, "prompt_token_ids"));
            req_push_ids(&q->out, &q->n_out, &q->cap_out, json_object_get(c, "token_ids"));
            b->out_tokens += q->n_out;
            q->t_first = q->t_last = q->t_end;
            note_warnings(q, json_object_get(j, "warnings"));
            const json_t *m = json_object_get(c, "message");
            const json_t *s2 = json_object_get(m, "content");
            if (json_is_string(s2))
                ba_buf_add(&t->content, json_string_value(s2), json_string_length(s2));
            add_tool_call_delta(t, json_object_get(m, "tool_calls"));
            const char *fr = json_string_value(json_object_get(c, "finish_reason"));
            snprintf(q->finish, sizeof q->finish, "%s", fr ? fr : "");
        }
        json_decref(j);
    }
    if (q->outcome != BA_OK && q->outcome != BA_DISCONNECTED)
        q->chaos = in_chaos(b, q);
    /* the history: the reply on success; otherwise the turn is taken back and the session goes on */
    if (q->outcome == BA_OK) {
        /* the reply's text by its length (U+0000 included); jansson checked it as UTF-8 when it
         * parsed the events it came in */
        json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", t->content.s ? t->content.s : "",
                              t->content.n);
        if (!m) /* out of memory, or bytes jansson would not take back: the turn's text left out */
            m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
        if (t->tool_calls && json_array_size(t->tool_calls))
            json_object_set(m, "tool_calls", t->tool_calls);
        json_array_append_new(s->messages, m);
        if (s->last_prompt_len > 0 && q->n_prompt > 0) {
            b->run.growth_checked++;
            if (q->n_prompt <= s->last_prompt_len)
                b->run.growth_violations++;
        }
        if (q->n_prompt > 0)
            s->last_prompt_len = q->n_prompt;
        b->n_done++;
    } else {
        while (json_array_size(s->messages) > s->committed)
            json_array_remove(s->messages, json_array_size(s->messages) - 1);
        if (q->outcome == BA_DISCONNECTED)
            b->n_disc++;
        else if (q->outcome == BA_TIMEOUT)
            b->n_timeout++;
        else
            b->n_fail++;
    }
    curl_multi_remove_handle(b->multi, t->h);
    curl_easy_cleanup(t->h);
    curl_slist_free_all(t->hdr);
    free(t->body);
    free(t->in.s);
    free(t->content.s);
    json_decref(t->tool_calls);
    free(t);
    s->tx = NULL;
    b->in_flight--;
    s->turn++;
    if (s->turn >= b->o.turns) {
        s->active = 0;
        s->done = 1;
        b->run.sessions_done++;
    }
}

/* ---------------------------------------------------------------- chaos */

static void chaos_step(bench_t *b, ba_chaos_t *c, const char *kill_cmd, const char *restart_cmd)
{
    double t = now_rel(b);
    if (c->killed_s < 0 && t >= c->at_s) {
        fprintf(stderr, "\nduet-bench-agents: %s at %.1f s\n", c->kind, t);
        if (!strcmp(c->kind, "kill-decode") && b->o.decode_pid > 0)
            c->kill_rc = kill(b->o.decode_pid, SIGKILL) == 0 ? 0 : -1;
        else
            c->kill_rc = ba_run_shell(kill_cmd, 30.0);
        c->killed_s = now_rel(b);
        if (c->kill_rc != 0)
            snprintf(c->note, sizeof c->note, "the kill command exited with %d", c->kill_rc);
        return;
    }
    if (c->killed_s >= 0 && c->restarted_s < 0 && t >= c->killed_s + b->o.restart_delay_s) {
        if (restart_cmd) {
            c->restart_rc = ba_run_shell(restart_cmd, 60.0);
            if (c->restart_rc != 0)
                snprintf(c->note, sizeof c->note, "the restart command exited with %d", c->restart_rc);
        } else {
            snprintf(c->note, sizeof c->note, "no restart command: the component stays down");
        }
        c->restarted_s = now_rel(b);
        fprintf(stderr, "duet-bench-agents: %s: restarted at %.1f s\n", c->kind, c->restarted_s);
        return;
    }
    if (c->restarted_s >= 0 && c->ready_s < 0) {
        static double last_probe;
        if (t - last_probe < 0.5)
            return;
        last_probe = t;
        char url[512];
        long st = 0;
        snprintf(url, sizeof url, "%s/ready", b->o.url);
        char *body = ba_http_get(url, 500, &st);
        free(body);
        if (st == 200 || t - c->restarted_s > 120.0) {
            c->ready_s = now_rel(b);
            c->window_end_s = c->ready_s + b->o.chaos_grace_s;
            if (st != 200)
                snprintf(c->note, sizeof c->note, "the router was not ready 120 s after the restart");
            fprintf(stderr, "duet-bench-agents: %s: router ready at %.1f s\n", c->kind, c->ready_s);
        }
    }
}

/* ---------------------------------------------------------------- the run */

static void progress(bench_t *b, int final)
{
    static double last;
    double t = now_rel(b);
    if (!final && t - last < (b->o.progress ? 0.5 : 10.0))
        return;
    last = t;
    fprintf(stderr, "%s[%6.1f s] sessions %d/%d done, %d in flight | requests ok %ld, failed %ld, timed out %ld, "
            "dropped %ld | %ld tokens out (%.0f/s)%s",
            b->o.progress ? "\r" : "", t, b->run.sessions_done, b->o.sessions, b->in_flight, b->n_done, b->n_fail,
            b->n_timeout, b->n_disc, b->out_tokens, t > 0 ? (double)b->out_tokens / t : 0.0,
            b->o.progress && !final ? "   " : "\n");
}

static int run_load(bench_t *b)
{
    ba_opts_t *o = &b->o;
    b->sess = calloc((size_t)o->sessions, sizeof(session_t));
    if (!b->sess)
        return -1;
    rng_t arr = rng_for(o->seed, 0xa441u, 0);
    double at = 0;
    for (int i = 0; i < o->sessions; i++) {
        session_t *s = &b->sess[i];
        s->id = i;
        s->messages = json_array();
        json_array_append_new(s->messages, json_pack("{s:s, s:s}", "role", "system", "content", b->system_prompt));
        if (o->rate > 0) {
            at += -log(1.0 - rnd_unit(&arr)) / o->rate; /* Poisson arrivals */
            s->start_at = at;
        }
    }
    b->multi = curl_multi_init();
    curl_multi_setopt(b->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, 512L);
    b->t0 = duet_time_s();
    b->run.t0_wall = (double)duet_wall_us() / 1e6;
    /* the whole load phase is bounded: every session's turns at the per-request timeout, plus chaos */
    double bound = (o->rate > 0 ? at : 0) +
                   o->timeout_s * (double)o->turns * ((double)o->sessions / (double)o->concurrency + 1.0) + 300.0;
    int next = 0;
    int interrupted = 0;
    for (long iter = 0;; iter++) {
        double t = now_rel(b);
        if (g_stop && !interrupted) {
            interrupted = 1;
            fprintf(stderr, "\nduet-bench-agents: interrupted: dropping what is in flight\n");
            for (int i = 0; i < o->sessions; i++)
                if (b->sess[i].tx)
                    b->sess[i].tx->drop = 1;
        }
        if (t > bound) {
            fprintf(stderr, "\nduet-bench-agents: the load phase passed its bound (%.0f s): stopping\n", bound);
            for (int i = 0; i < o->sessions; i++)
                if (b->sess[i].tx)
                    b->sess[i].tx->drop = 1;
            interrupted = 1;
        }
        /* admit sessions */
        while (!interrupted && next < o->sessions) {
            session_t *s = &b->sess[next];
            if (o->rate > 0 ? s->start_at > t : b->run.sessions_started - b->run.sessions_done >= o->concurrency)
                break;
            if (o->rate > 0 && b->in_flight >= 1024)
                break;
            s->active = 1;
            b->run.sessions_started++;
            next++;
        }
        /* each active session without a request in flight starts its next turn */
        for (int i = 0; i < next; i++) {
            session_t *s = &b->sess[i];
            if (s->active && !s->tx && !interrupted && start_turn(b, s) != 0) {
                fprintf(stderr, "duet-bench-agents: cannot start a request (out of memory)\n");
                return -1;
            }
            if (interrupted && s->active && !s->tx) {
                s->active = 0;
                s->done = 1;
                b->run.sessions_done++;
            }
        }
        /* chaos */
        for (int i = 0; i < b->run.n_chaos; i++) {
            ba_chaos_t *c = &b->run.chaos[i];
            int dec = !strcmp(c->kind, "kill-decode");
            chaos_step(b, c, dec ? o->kill_cmd : o->redis_kill_cmd, dec ? o->restart_cmd : o->redis_restart_cmd);
        }
        int chaos_pending = 0;
        for (int i = 0; i < b->run.n_chaos; i++)
            if (b->run.chaos[i].ready_s < 0)
                chaos_pending = 1;
        if (b->in_flight == 0 && (next >= o->sessions || interrupted)) {
            int all_done = 1;
            for (int i = 0; i < next; i++)
                if (b->sess[i].active)
                    all_done = 0;
            if (all_done && (!chaos_pending || interrupted))
                break;
            if (all_done && chaos_pending && t > bound)
                break;
        }
        int running = 0;
        curl_multi_perform(b->multi, &running);
        /* consume streamed bytes; planned drops */
        t = now_rel(b);
        for (int i = 0; i < next; i++) {
            transfer_t *x = b->sess[i].tx;
            if (!x)
                continue;
            if (o->stream && x->in.n)
                parse_sse(b, x);
            ba_req_t *q = x->q;
            if (q->disc_plan == BA_DISC_BEFORE_FIRST && t >= q->t_start + q->disc_at)
                x->drop = 1;
            if (x->drop)
                finish_transfer(b, x, CURLE_OK);
        }
        CURLMsg *m;
        int left;
        for (int guard = 0; guard < 4096 && (m = curl_multi_info_read(b->multi, &left)); guard++) {
            if (m->msg != CURLMSG_DONE)
                continue;
            transfer_t *x = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            if (x)
                finish_transfer(b, x, m->data.result);
        }
        progress(b, 0);
        curl_multi_poll(b->multi, NULL, 0, 20, NULL);
    }
    b->run.duration_s = now_rel(b);
    progress(b, 1);
    /* a chaos window still open at the end closes now */
    for (int i = 0; i < b->run.n_chaos; i++) {
        ba_chaos_t *c = &b->run.chaos[i];
        if (c->killed_s >= 0 && c->window_end_s < 0)
            c->window_end_s = b->run.duration_s;
        if (c->killed_s < 0)
            snprintf(c->note, sizeof c->note, "the run ended before %.1f s: not exercised", c->at_s);
    }
    curl_multi_cleanup(b->multi);
    for (int i = 0; i < o->sessions; i++)
        json_decref(b->sess[i].messages);
    free(b->sess);
    return interrupted ? 1 : 0;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: duet-bench-agents --url URL [--model DIR] [options]\n"
            "load\n"
            "  --scenario NAME            agents-80x4: 80 sessions at once, 4 turns, 1 tool, ~350-token first prompt,\n"
            "                             32 tokens out\n"
            "  --concurrency C            closed loop: sessions at once, 1-256 (default 8)\n"
            "  --rate R                   open loop: sessions arrive at R per second (Poisson) instead\n"
            "  --sessions N               sessions in all (default: the concurrency)\n"
            "  --turns T                  turns per session (default 4)\n"
            "  --tools N                  tools offered, 1-4 (default 4; each call is valid against one of them)\n"
            "  --context TOKENS           approximate prompt tokens of the first turn (default 300)\n"
            "  --max-tokens N             output tokens per request (default 32)\n"
            "  --thinking on|off          (default off)\n"
            "  --temperature T | --greedy sampling (default 0.8, seeded per request)\n"
            "  --stream on|off            (default on)\n"
            "  --timeout S                per-request timeout in seconds (default 180)\n"
            "  --seed S                   run seed: the same seed replays the same run (default 1)\n"
            "checks\n"
            "  --compare exact|none       exact: outputs equal duet-generate's (default)\n"
            "  --reference-device cpu|cuda[:N]   where duet-generate runs the references (default cpu; cuda for a\n"
            "                             cluster whose workers run --device cuda: the batch-invariant GPU engine)\n"
            "  --reference-tp N           duet-generate --tp N for the references (workers with --tp N; default 1)\n"
            "  --model DIR                checkpoint for the references (required with --compare exact)\n"
            "  --kv-dtype, --index-k-dtype fp8|bf16   the cluster's cache encodings (default bf16, bf16)\n"
            "  --generate PATH, --driver PATH   duet-generate and duet-driver (default: beside this program)\n"
            "  --cache-dir DIR            reference cache (default ~/.cache/duet/bench-agents)\n"
            "  --jobs N                   reference processes at once (default: nproc)\n"
            "  --worker URL               a decode worker's control URL (repeat): exact state via duet-driver;\n"
            "                             without it, the router's GET /v1/workers\n"
            "  --settle S                 wait up to S seconds for idle workers after the load (default 30)\n"
            "  --slo-ttft-ms MS, --slo-itl-ms MS   goodput SLOs (default 2000, 200)\n"
            "chaos\n"
            "  --disconnect-fraction F    drop this fraction of requests (before the first token or mid-stream)\n"
            "  --kill-decode-at S         at S seconds: --kill-cmd CMD (or kill -9 of --decode-pid PID), then\n"
            "                             after --restart-delay S (default 2) --restart-cmd CMD\n"
            "  --redis-restart-at S       likewise with --redis-kill-cmd CMD and --redis-restart-cmd CMD\n"
            "  --chaos-grace S            failures up to S s after the router is ready again count as chaos (10)\n"
            "output\n"
            "  --json FILE, --plot FILE.png (gnuplot), --progress on|off (default: on for a terminal)\n"
            "exit status: 0 clean, 1 not clean (corrupted, timed out, leaked, failed), 2 usage\n");
}

static int parse_onoff(const char *v, int *out)
{
    if (!strcmp(v, "on") || !strcmp(v, "1") || !strcmp(v, "true"))
        *out = 1;
    else if (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "false"))
        *out = 0;
    else
        return -1;
    return 0;
}

static int num(const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno || !(d >= lo && d <= hi))
        return -1;
    *out = d;
    return 0;
}

static char *beside_self(const char *argv0, const char *name)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(self, sizeof self, "%s", argv0);
        n = (ssize_t)strlen(self);
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    char out[4200];
    if (!slash)
        snprintf(out, sizeof out, "%s", name);
    else {
        *slash = 0;
        snprintf(out, sizeof out, "%s/%s", self, name);
    }
    return strdup(out);
}

static int parse_opts(int argc, char **argv, ba_opts_t *o)
{
    *o = (ba_opts_t){.url = "http://127.0.0.1:8000", .kv_dtype = "bf16", .index_k_dtype = "bf16", .concurrency = 8,
                     .ref_device = "cpu",
                     .ref_tp = 1,
                     .turns = 4, .context = 300, .max_tokens = 32, .stream = 1, .temperature = 0.8, .timeout_s = 180,
                     .seed = 1, .compare = BA_COMPARE_EXACT, .slo_ttft_ms = 2000, .slo_itl_ms = 200, .settle_s = 30,
                     .kill_decode_at = -1, .redis_restart_at = -1, .restart_delay_s = 2, .chaos_grace_s = 10,
                     .n_tools = 4, .progress = isatty(2)};
    enum { O_URL = 256, O_MODEL, O_GEN, O_DRV, O_KV, O_IK, O_CACHE, O_JSON, O_PLOT, O_SCEN, O_WORKER, O_CONC, O_RATE,
           O_SESS, O_TURNS, O_CTX, O_MAXT, O_THINK, O_STREAM, O_TEMP, O_GREEDY, O_TIMEOUT, O_SEED, O_CMP, O_JOBS,
           O_SLO_TTFT, O_SLO_ITL, O_SETTLE, O_DISC, O_KILL_AT, O_KILL_CMD, O_RESTART_CMD, O_DPID, O_REDIS_AT,
           O_REDIS_KILL, O_REDIS_RESTART, O_RDELAY, O_GRACE, O_CORRUPT, O_PROGRESS, O_TOOLS, O_REFDEV, O_REFTP, O_HELP };
    static const struct option lo[] = {
        {"url", 1, 0, O_URL}, {"model", 1, 0, O_MODEL}, {"generate", 1, 0, O_GEN}, {"driver", 1, 0, O_DRV},
        {"kv-dtype", 1, 0, O_KV}, {"index-k-dtype", 1, 0, O_IK}, {"cache-dir", 1, 0, O_CACHE},
        {"json", 1, 0, O_JSON}, {"plot", 1, 0, O_PLOT}, {"scenario", 1, 0, O_SCEN}, {"worker", 1, 0, O_WORKER},
        {"concurrency", 1, 0, O_CONC}, {"rate", 1, 0, O_RATE}, {"sessions", 1, 0, O_SESS},
        {"turns", 1, 0, O_TURNS}, {"context", 1, 0, O_CTX}, {"max-tokens", 1, 0, O_MAXT},
        {"thinking", 1, 0, O_THINK}, {"stream", 1, 0, O_STREAM}, {"temperature", 1, 0, O_TEMP},
        {"greedy", 0, 0, O_GREEDY}, {"timeout", 1, 0, O_TIMEOUT}, {"seed", 1, 0, O_SEED},
        {"compare", 1, 0, O_CMP}, {"jobs", 1, 0, O_JOBS}, {"slo-ttft-ms", 1, 0, O_SLO_TTFT},
        {"slo-itl-ms", 1, 0, O_SLO_ITL}, {"settle", 1, 0, O_SETTLE}, {"disconnect-fraction", 1, 0, O_DISC},
        {"kill-decode-at", 1, 0, O_KILL_AT}, {"kill-cmd", 1, 0, O_KILL_CMD}, {"restart-cmd", 1, 0, O_RESTART_CMD},
        {"decode-pid", 1, 0, O_DPID}, {"redis-restart-at", 1, 0, O_REDIS_AT},
        {"redis-kill-cmd", 1, 0, O_REDIS_KILL}, {"redis-restart-cmd", 1, 0, O_REDIS_RESTART},
        {"restart-delay", 1, 0, O_RDELAY}, {"chaos-grace", 1, 0, O_GRACE},
        {"test-corrupt-reference", 1, 0, O_CORRUPT}, {"progress", 1, 0, O_PROGRESS}, {"tools", 1, 0, O_TOOLS},
        {"reference-device", 1, 0, O_REFDEV}, {"reference-tp", 1, 0, O_REFTP}, {"help", 0, 0, O_HELP},
        {0, 0, 0, 0}};
    int c, sessions_given = 0;
    double d;
    /* the scenario first, so that flags after or before it refine it */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--scenario")) {
            if (strcmp(argv[i + 1], "agents-80x4") != 0) {
                fprintf(stderr, "duet-bench-agents: INVALID: unknown scenario \"%s\" (agents-80x4)\n", argv[i + 1]);
                return 2;
            }
            o->scenario = "agents-80x4";
            o->concurrency = 80;
            o->turns = 4;
            o->context = 300;
            o->max_tokens = 32;
            o->n_tools = 1;
        }
#define NUM(lo_, hi_)                                                                                           \
    do {                                                                                                        \
        if (num(optarg, lo_, hi_, &d) < 0) {                                                                    \
            fprintf(stderr, "duet-bench-agents: INVALID: --%s %s (expected a number in [%g, %g])\n",            \
                    lo[c - O_URL].name, optarg, (double)(lo_), (double)(hi_));                                  \
            return 2;                                                                                           \
        }                                                                                                       \
    } while (0)
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_URL: o->url = optarg; break;
        case O_MODEL: o->model = optarg; break;
        case O_GEN: o->generate = optarg; break;
        case O_DRV: o->driver = optarg; break;
        case O_KV:
        case O_IK:
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp8")) {
                fprintf(stderr, "duet-bench-agents: INVALID: cache encoding \"%s\" (fp8 or bf16)\n", optarg);
                return 2;
            }
            *(c == O_KV ? &o->kv_dtype : &o->index_k_dtype) = optarg;
            break;
        case O_CACHE: o->cache_dir = optarg; break;
        case O_JSON: o->json_path = optarg; break;
        case O_PLOT: o->plot_path = optarg; break;
        case O_SCEN: break;
        case O_WORKER:
            if (o->n_workers == BA_MAX_WORKERS) {
                fprintf(stderr, "duet-bench-agents: INVALID: at most %d --worker URLs\n", BA_MAX_WORKERS);
                return 2;
            }
            o->workers[o->n_workers++] = optarg;
            break;
        case O_CONC: NUM(1, 256); o->concurrency = (int)d; break;
        case O_RATE: NUM(0.001, 1000); o->rate = d; break;
        case O_SESS: NUM(1, 1000000); o->sessions = (int)d; sessions_given = 1; break;
        case O_TURNS: NUM(1, 1000); o->turns = (int)d; break;
        case O_CTX: NUM(0, 1000000); o->context = (int)d; break;
        case O_MAXT: NUM(1, 1 << 20); o->max_tokens = (int)d; break;
        case O_THINK:
        case O_STREAM:
        case O_PROGRESS:
            if (parse_onoff(optarg, c == O_THINK ? &o->thinking : c == O_STREAM ? &o->stream : &o->progress) < 0) {
                fprintf(stderr, "duet-bench-agents: INVALID: --%s %s (on or off)\n", lo[c - O_URL].name, optarg);
                return 2;
            }
            break;
        case O_TEMP: NUM(0, 2); o->temperature = d; break;
        case O_GREEDY: o->temperature = 0; break;
        case O_TIMEOUT: NUM(0.1, 86400); o->timeout_s = d; break;
        case O_SEED: NUM(0, 9007199254740991.0); o->seed = (uint64_t)d; break;
        case O_CMP:
            if (!strcmp(optarg, "exact"))
                o->compare = BA_COMPARE_EXACT;
            else if (!strcmp(optarg, "none"))
                o->compare = BA_COMPARE_NONE;
            else {
                fprintf(stderr, "duet-bench-agents: INVALID: --compare %s (exact or none)\n", optarg);
                return 2;
            }
            break;
        case O_JOBS: NUM(1, 1024); o->jobs = (int)d; break;
        case O_SLO_TTFT: NUM(0, 1e9); o->slo_ttft_ms = d; break;
        case O_SLO_ITL: NUM(0, 1e9); o->slo_itl_ms = d; break;
        case O_SETTLE: NUM(0, 3600); o->settle_s = d; break;
        case O_DISC: NUM(0, 1); o->disconnect_fraction = d; break;
        case O_KILL_AT: NUM(0, 86400); o->kill_decode_at = d; break;
        case O_KILL_CMD: o->kill_cmd = optarg; break;
        case O_RESTART_CMD: o->restart_cmd = optarg; break;
        case O_DPID: NUM(1, 4194304); o->decode_pid = (int)d; break;
        case O_REDIS_AT: NUM(0, 86400); o->redis_restart_at = d; break;
        case O_REDIS_KILL: o->redis_kill_cmd = optarg; break;
        case O_REDIS_RESTART: o->redis_restart_cmd = optarg; break;
        case O_RDELAY: NUM(0, 3600); o->restart_delay_s = d; break;
        case O_GRACE: NUM(0, 3600); o->chaos_grace_s = d; break;
        case O_CORRUPT: NUM(0, 1000000); o->test_corrupt_reference = (int)d; break;
        case O_TOOLS: NUM(1, 4); o->n_tools = (int)d; break;
        case O_REFDEV: {
            const char *v = optarg;
            int ok = !strcmp(v, "cpu") || !strcmp(v, "cuda");
            if (!ok && !strncmp(v, "cuda:", 5) && v[5]) {
                ok = 1;
                for (const char *p = v + 5; *p; p++)
                    ok &= *p >= '0' && *p <= '9';
            }
            if (!ok) {
                fprintf(stderr, "duet-bench-agents: INVALID: --reference-device %s (cpu or cuda[:N])\n", v);
                return 2;
            }
            o->ref_device = v;
            break;
        }
        case O_REFTP: NUM(1, 8); o->ref_tp = (int)d; break;
        case O_HELP: usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
#undef NUM
    if (optind < argc) {
        fprintf(stderr, "duet-bench-agents: INVALID: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (!sessions_given)
        o->sessions = o->concurrency;
    if (o->compare == BA_COMPARE_EXACT && !o->model) {
        fprintf(stderr, "duet-bench-agents: INVALID: --compare exact needs --model DIR (the checkpoint the "
                        "cluster serves); --compare none skips the check\n");
        return 2;
    }
    if (o->kill_decode_at >= 0 && !o->kill_cmd && o->decode_pid <= 0) {
        fprintf(stderr, "duet-bench-agents: INVALID: --kill-decode-at needs --kill-cmd CMD or --decode-pid PID\n");
        return 2;
    }
    if (o->redis_restart_at >= 0 && !o->redis_kill_cmd) {
        fprintf(stderr, "duet-bench-agents: INVALID: --redis-restart-at needs --redis-kill-cmd CMD\n");
        return 2;
    }
    size_t ul = strlen(o->url);
    if (ul && o->url[ul - 1] == '/') {
        char *u = strdup(o->url);
        u[ul - 1] = 0;
        o->url = u;
    }
    if (!o->generate)
        o->generate = beside_self(argv[0], "duet-generate");
    if (!o->driver)
        o->driver = beside_self(argv[0], "duet-driver");
    if (!o->jobs) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->jobs = n > 0 ? (int)n : 1;
    }
    if (!o->cache_dir) {
        const char *home = getenv("HOME");
        char p[4096];
        snprintf(p, sizeof p, "%s/.cache/duet/bench-agents", home && *home ? home : "/tmp");
        o->cache_dir = strdup(p);
    }
    return 0;
}

/* The system prompt: an instruction, then seeded filler so that the first turn's prompt is
 * about --context tokens.  The DeepSeek-V4 encoding of the tools' schemas, the chat template
 * and the first turn's messages take about BASE_TOKENS[tools - 1] (measured on the shipped
 * tokenizer): that is the floor.  A filler word is about 1.1 tokens. */
static const int BASE_TOKENS[4] = {450, 560, 650, 745};
static char *system_prompt(const ba_opts_t *o)
{
    ba_buf_t b = {0};
    sb_str(&b, "You are a coding agent. Use the tools to inspect the machine, then answer briefly. Notes: ");
    rng_t r = rng_for(o->seed, 0x5157u, 0);
    int n = (int)((double)(o->context - BASE_TOKENS[o->n_tools - 1]) / 1.1);
    words(&b, &r, n > 0 ? n : 0);
    return b.s;
}

int main(int argc, char **argv)
{
    bench_t b = {0};
    int rc = parse_opts(argc, argv, &b.o);
    if (rc)
        return rc;
    b.run.o = &b.o;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "duet-bench-agents: libcurl did not initialize\n");
        return 1;
    }
    /* the router must answer before the load starts (bounded) */
    char url[512];
    snprintf(url, sizeof url, "%s/ready", b.o.url);
    long st = 0;
    double end = duet_time_s() + 60;
    for (int i = 0; i < 600 && duet_time_s() < end; i++) {
        char *body = ba_http_get(url, 2000, &st);
        free(body);
        if (st == 200)
            break;
        usleep(100000);
    }
    if (st != 200) {
        fprintf(stderr, "duet-bench-agents: %s is not ready (status %ld) after 60 s\n", url, st);
        return 1;
    }
    if (b.o.kill_decode_at >= 0) {
        ba_chaos_t *c = &b.run.chaos[b.run.n_chaos++];
        *c = (ba_chaos_t){.at_s = b.o.kill_decode_at, .killed_s = -1, .restarted_s = -1, .ready_s = -1,
                          .window_end_s = -1};
        snprintf(c->kind, sizeof c->kind, "kill-decode");
    }
    if (b.o.redis_restart_at >= 0) {
        ba_chaos_t *c = &b.run.chaos[b.run.n_chaos++];
        *c = (ba_chaos_t){.at_s = b.o.redis_restart_at, .killed_s = -1, .restarted_s = -1, .ready_s = -1,
                          .window_end_s = -1};
        snprintf(c->kind, sizeof c->kind, "restart-redis");
    }
    b.tools = make_tools(b.o.n_tools);
    b.system_prompt = system_prompt(&b.o);
    fprintf(stderr,
            "duet-bench-agents: %s%s%d sessions x %d turns, %s %d, --context %d, %d tokens out, %s, %s, "
            "temperature %.2f, seed %llu, against %s\n",
            b.o.scenario ? b.o.scenario : "", b.o.scenario ? ": " : "", b.o.sessions, b.o.turns,
            b.o.rate > 0 ? "rate" : "concurrency", b.o.rate > 0 ? (int)b.o.rate : b.o.concurrency, b.o.context,
            b.o.max_tokens, b.o.stream ? "streamed" : "not streamed", b.o.thinking ? "thinking" : "no thinking",
            b.o.temperature, (unsigned long long)b.o.seed, b.o.url);
    int interrupted = run_load(&b);
    if (interrupted < 0)
        return 1;
    ba_read_workers(&b.run);
    if (b.o.compare == BA_COMPARE_EXACT && !g_stop) {
        duet_err_t err = {0};
        if (ba_check_references(&b.run, &err) != DUET_OK)
            fprintf(stderr, "duet-bench-agents: references: %s\n", duet_err_text(&err));
    }
    rc = ba_report(&b.run);
    if (interrupted || g_stop)
        rc = 1;
    for (size_t i = 0; i < b.run.n_reqs; i++) {
        ba_req_t *q = b.run.reqs[i];
        free(q->prompt);
        free(q->out);
        free(q->gaps);
        free(q->ref);
        free(q);
    }
    free(b.run.reqs);
    json_decref(b.tools);
    free(b.system_prompt);
    curl_global_cleanup();
    return rc;
}
