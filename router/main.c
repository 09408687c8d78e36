/* duet-router: the OpenAI HTTP front door of a duet deployment (DESIGN §1, §10).
 *
 *   duet-router --events URL --prefill URL[,URL...] --decode URL[,URL...]
 *               [--model DIR] [--listen 127.0.0.1:8000] [--redis HOST:PORT] ...
 *
 * Startup: tokenizer, metrics, Redis (store.h), the core (core.h), then the
 * HTTP server (http.h); READY=1 goes to systemd once it listens.  SIGTERM or
 * SIGINT: stop accepting, abort what is in flight on the workers
 * (ROUTER_SHUTDOWN), answer the clients, exit.  --help lists every flag. */
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "duet_config.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "msg.h"
#include "store.h"
#include "time_util.h"
#include "tokenizer.h"

#define MAX_URLS 64

typedef struct {
    const char *listen, *events, *events_advertise, *model, *tokenizer, *served_name, *redis, *redis_prefix, *id, *port_file;
    const char *decode_policy, *prefill_policy, *effort_profile;
    const char *prefill[MAX_URLS], *decode[MAX_URLS];
    size_t n_prefill, n_decode;
    unsigned long max_body, max_inflight, queue_size, request_timeout_ms, wait_ms, worker_timeout_ms,
        calls_per_worker, default_max_tokens, max_connections, session_ttl_s, shutdown_grace_ms,
        call_ms, max_context;
} opts_t;

static void usage(void)
{
    fprintf(stderr,
            "usage: duet-router --events URL --prefill URL[,URL..] --decode URL[,URL..] [options]\n"
            "  --listen HOST:PORT        HTTP address (127.0.0.1:8000; port 0 picks a free one)\n"
            "  --port-file FILE          write the bound HTTP port here once listening\n"
            "  --events URL              where workers push events (the router listens): ipc:///run/duet/events.sock\n"
            "  --events-advertise URL    the URL workers dial to reach --events, sent in every Reserve and Prefill\n"
            "                            (default: --events; set it when --events listens on a wildcard address)\n"
            "  --prefill URL             a prefill worker's control URL (repeat or comma-separate)\n"
            "  --decode URL              a decode worker's control URL (repeat or comma-separate)\n"
            "  --model DIR               checkpoint directory: config.json, tokenizer.json, the model's name\n"
            "  --tokenizer FILE          tokenizer.json (default: DIR/tokenizer.json, else the shipped DeepSeek-V4 one)\n"
            "  --served-model-name NAME  the model name of the API (default: the model directory's name)\n"
            "  --redis HOST:PORT         Redis for worker, request and session records (none by default)\n"
            "  --redis-prefix P          key prefix (duet:)\n"
            "  --id ID                   router id, stable across restarts (router-HOSTNAME)\n"
            "  --max-body-bytes N        request bodies over this get 413 (16777216)\n"
            "  --max-inflight N          requests holding workers at once (256)\n"
            "  --queue-size N            requests waiting beyond that before 429 (1024)\n"
            "  --request-timeout-ms N    a request's whole life; then 504 and abort (600000)\n"
            "  --wait-ms N               decode's WAITING_FOR_INPUT deadline (30000)\n"
            "  --call-ms N               one command to a worker, queueing included (30000)\n"
            "  --worker-timeout-ms N     a worker silent this long is not used, its requests fail (10000)\n"
            "  --calls-per-worker N      concurrent commands per worker (64)\n"
            "  --decode-policy P         free-pages | least-loaded | round-robin (free-pages)\n"
            "  --prefill-policy P        affinity | shortest-queue | round-robin (affinity)\n"
            "  --default-max-tokens N    chat completions without max_tokens (4096)\n"
            "  --max-context N           prompt + completion limit (default: the model's max_position_embeddings)\n"
            "  --effort-profile P        preview | official (reasoning-effort prompts; preview)\n"
            "  --session-ttl-s N         session affinity records (3600)\n"
            "  --max-connections N       concurrent HTTP connections (1024)\n"
            "  --shutdown-grace-ms N     time given to in-flight aborts on shutdown (5000)\n"
            "Environment: DUET_LOG_LEVEL=error|warn|info|debug|trace.\n");
}

static int add_urls(const char **dst, size_t *n, const char *list)
{
    char *dup = strdup(list), *save = NULL;
    if (!dup)
        return -1;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_URLS) {
            free(dup);
            return -1;
        }
        dst[(*n)++] = strdup(t);
    }
    free(dup);
    return 0;
}

static int parse_ul(const char *name, const char *v, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long x = strtoul(v, &end, 10);
    if (errno || !*v || *end || v[0] == '-') {
        fprintf(stderr, "duet-router: %s: '%s' is not a number\n", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->listen = "127.0.0.1:8000";
    o->redis_prefix = "duet:";
    o->max_body = 16u << 20;
    o->max_inflight = 256;
    o->queue_size = 1024;
    o->request_timeout_ms = 600000;
    o->wait_ms = 30000;
    o->worker_timeout_ms = 10000;
    o->calls_per_worker = 64;
    o->default_max_tokens = 4096;
    o->max_connections = 1024;
    o->session_ttl_s = 3600;
    o->shutdown_grace_ms = 5000;
    o->call_ms = 30000;
    o->effort_profile = "preview";
    struct {
        const char *name;
        const char **s;
        unsigned long *n;
    } t[] = {
        {"--listen", &o->listen, NULL},
        {"--port-file", &o->port_file, NULL},
        {"--events", &o->events, NULL},
        {"--events-advertise", &o->events_advertise, NULL},
        {"--model", &o->model, NULL},
        {"--tokenizer", &o->tokenizer, NULL},
        {"--served-model-name", &o->served_name, NULL},
        {"--redis", &o->redis, NULL},
        {"--redis-prefix", &o->redis_prefix, NULL},
        {"--id", &o->id, NULL},
        {"--decode-policy", &o->decode_policy, NULL},
        {"--prefill-policy", &o->prefill_policy, NULL},
        {"--effort-profile", &o->effort_profile, NULL},
        {"--max-body-bytes", NULL, &o->max_body},
        {"--max-inflight", NULL, &o->max_inflight},
        {"--queue-size", NULL, &o->queue_size},
        {"--request-timeout-ms", NULL, &o->request_timeout_ms},
        {"--wait-ms", NULL, &o->wait_ms},
        {"--call-ms", NULL, &o->call_ms},
        {"--worker-timeout-ms", NULL, &o->worker_timeout_ms},
        {"--calls-per-worker", NULL, &o->calls_per_worker},
        {"--default-max-tokens", NULL, &o->default_max_tokens},
        {"--max-context", NULL, &o->max_context},
        {"--max-connections", NULL, &o->max_connections},
        {"--session-ttl-s", NULL, &o->session_ttl_s},
        {"--shutdown-grace-ms", NULL, &o->shutdown_grace_ms},
    };
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            usage();
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "duet-router: %s needs a value\n", k);
            return -1;
        }
        const char *v = argv[++i];
        if (!strcmp(k, "--prefill") || !strcmp(k, "--decode")) {
            int pre = !strcmp(k, "--prefill");
            if (add_urls(pre ? o->prefill : o->decode, pre ? &o->n_prefill : &o->n_decode, v) != 0) {
                fprintf(stderr, "duet-router: too many workers\n");
                return -1;
            }
            continue;
        }
        size_t j = 0;
        while (j < sizeof t / sizeof t[0] && strcmp(t[j].name, k))
            j++;
        if (j == sizeof t / sizeof t[0]) {
            fprintf(stderr, "duet-router: unknown option %s (--help lists them)\n", k);
            return -1;
        }
        if (t[j].s)
            *t[j].s = v;
        else if (parse_ul(k, v, t[j].n) != 0)
            return -1;
    }
    if (!o->events) {
        fprintf(stderr, "duet-router: --events is required\n");
        return -1;
    }
    {
        /* workers dial this URL for the events of this router's requests: refuse one they would refuse */
        const char *adv = o->events_advertise ? o->events_advertise : o->events;
        duet_err_t e = {0};
        if (strlen(adv) > 256 || duet_msg_check_event_url(adv, o->events_advertise ? "--events-advertise" : "--events",
                                                           &e) != DUET_OK) {
            fprintf(stderr, "duet-router: %s\n", e.msg[0] ? e.msg : "the events URL is longer than 256 bytes");
            return -1;
        }
    }
    if (strcmp(o->effort_profile, "preview") && strcmp(o->effort_profile, "official")) {
        fprintf(stderr, "duet-router: --effort-profile must be preview or official\n");
        return -1;
    }
    static const char *const dp[] = {"free-pages", "least-loaded", "round-robin"};
    static const char *const pp[] = {"affinity", "shortest-queue", "round-robin"};
    int ok_d = !o->decode_policy, ok_p = !o->prefill_policy;
    for (int i = 0; i < 3; i++) {
        ok_d |= o->decode_policy && !strcmp(o->decode_policy, dp[i]);
        ok_p |= o->prefill_policy && !strcmp(o->prefill_policy, pp[i]);
    }
    if (!ok_d || !ok_p) {
        fprintf(stderr, "duet-router: unknown --%s-policy\n", !ok_d ? "decode" : "prefill");
        return -1;
    }
    if (!o->max_body || !o->max_inflight || !o->request_timeout_ms || !o->wait_ms || !o->calls_per_worker) {
        fprintf(stderr, "duet-router: limits must be positive\n");
        return -1;
    }
    return 0;
}

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

typedef struct {
    duet_core_t *_Atomic core;
} orphan_sink_t;

/* Orphans found in Redis before the core runs wait for it (bounded). */
static void orphan_to_core(void *arg, const duet_orphan_t *o)
{
    orphan_sink_t *s = arg;
    for (int i = 0; i < 500 && !atomic_load(&s->core); i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    duet_core_t *c = atomic_load(&s->core);
    if (c)
        duet_core_orphan(c, o);
}

int main(int argc, char **argv)
{
    duet_log_init_from_env();
    duet_log_set_ident("duet-router");
    opts_t o;
    if (parse_args(argc, argv, &o) != 0) {
        usage();
        return 2;
    }
    /* signals go to the main thread only (sigtimedwait below) */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    duet_err_t err = {0};
    duet_tok_t *tok = NULL;
    duet_metrics_t *metrics = NULL;
    duet_store_t *store = NULL;
    duet_core_t *core = NULL;
    duet_http_t *http = NULL;
    orphan_sink_t sink;
    atomic_init(&sink.core, NULL);
    char host[128] = "localhost", id[80], nonce[40], tok_path[4096], name[256] = "duet";

    /* the model: its limits and its name */
    int32_t vocab = 129280;
    unsigned long max_ctx = 1u << 20;
    if (o.model) {
        char cfg[4096];
        snprintf(cfg, sizeof cfg, "%s/config.json", o.model);
        json_error_t je;
        json_t *j = json_load_file(cfg, 0, &je);
        if (!j) {
            fprintf(stderr, "duet-router: %s: %s\n", cfg, je.text);
            return 1;
        }
        if (json_is_integer(json_object_get(j, "vocab_size")))
            vocab = (int32_t)json_integer_value(json_object_get(j, "vocab_size"));
        if (json_is_integer(json_object_get(j, "max_position_embeddings")))
            max_ctx = (unsigned long)json_integer_value(json_object_get(j, "max_position_embeddings"));
        json_decref(j);
        char *dup = strdup(o.model);
        size_t n = strlen(dup);
        while (n > 1 && dup[n - 1] == '/')
            dup[--n] = 0;
        snprintf(name, sizeof name, "%s", basename(dup));
        free(dup);
    }
    if (o.max_context)
        max_ctx = o.max_context;
    if (o.served_name)
        snprintf(name, sizeof name, "%s", o.served_name);
    if (o.tokenizer)
        snprintf(tok_path, sizeof tok_path, "%s", o.tokenizer);
    else if (o.model && (snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o.model), file_exists(tok_path)))
        ;
    else {
        snprintf(tok_path, sizeof tok_path, "%s/share/duet/tokenizer/deepseek-v4/tokenizer.json", DUET_INSTALL_PREFIX);
        if (!file_exists(tok_path))
            snprintf(tok_path, sizeof tok_path, "%s/data/tokenizer/deepseek-v4/tokenizer.json", DUET_SOURCE_ROOT);
    }
    duet_info("loading the tokenizer %s", tok_path);
    double t0 = duet_time_s();
    if (duet_tok_create(tok_path, NULL, &tok, &err) != DUET_OK) {
        fprintf(stderr, "duet-router: %s\n", duet_err_text(&err));
        return 1;
    }
    duet_info("tokenizer loaded in %.2f s (%d ids)", duet_time_s() - t0, duet_tok_vocab_size(tok));

    gethostname(host, sizeof host - 1);
    if (o.id)
        snprintf(id, sizeof id, "%s", o.id);
    else
        snprintf(id, sizeof id, "router-%.60s", host);
    for (char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == ':' || *p == '-'))
            *p = '-';
    uint64_t rnd[2] = {0, 0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rnd[0] = duet_time_ns() ^ (uint64_t)getpid();
    snprintf(nonce, sizeof nonce, "%016llx%08x", (unsigned long long)rnd[0], (unsigned)(rnd[1] & 0xffffffffu));

    metrics = duet_metrics_create();
    if (!metrics)
        goto out;
    if (o.redis) {
        char rh[256];
        const char *colon = strrchr(o.redis, ':');
        int port = colon ? atoi(colon + 1) : 6379;
        snprintf(rh, sizeof rh, "%.*s", colon ? (int)(colon - o.redis) : (int)strlen(o.redis), o.redis);
        duet_store_opts_t so = {.host = rh, .port = port, .prefix = o.redis_prefix, .router_id = id, .nonce = nonce,
                                .router_ttl_ms = 5000, .sweep_ms = 5000, .command_timeout_ms = 1000,
                                .metrics = metrics, .on_orphan = orphan_to_core, .arg = &sink};
        if (duet_store_create(&so, &store, &err) != DUET_OK) {
            fprintf(stderr, "duet-router: %s\n", duet_err_text(&err));
            goto out;
        }
    }
    duet_core_opts_t co = {
        .router_id = id, .nonce = nonce, .events_url = o.events, .events_advertise = o.events_advertise,
        .prefill_urls = o.prefill,
        .n_prefill = o.n_prefill, .decode_urls = o.decode, .n_decode = o.n_decode,
        .calls_per_worker = (uint32_t)o.calls_per_worker, .max_inflight = (uint32_t)o.max_inflight,
        .queue_size = (uint32_t)o.queue_size, .worker_timeout_ms = (uint32_t)o.worker_timeout_ms,
        .wait_ms = (uint32_t)o.wait_ms, .call_ms = (uint32_t)o.call_ms,
.decode_policy = o.decode_policy,
        .prefill_policy = o.prefill_policy, .session_ttl_s = (uint32_t)o.session_ttl_s, .metrics = metrics,
        .store = store,
    };
    if (duet_core_create(&co, &core, &err) != DUET_OK) {
        fprintf(stderr, "duet-router: %s\n", duet_err_text(&err));
        goto out;
    }
    atomic_store(&sink.core, core);

    char lh[128];
    const char *colon = strrchr(o.listen, ':');
    snprintf(lh, sizeof lh, "%.*s", colon ? (int)(colon - o.listen) : (int)strlen(o.listen), o.listen);
    duet_http_opts_t ho = {
        .core = core, .store = store, .metrics = metrics, .tok = tok, .served_model = name, .vocab_size = vocab,
        .max_context = (uint32_t)(max_ctx > UINT32_MAX ? UINT32_MAX : max_ctx),
        .default_max_tokens = (uint32_t)o.default_max_tokens, .request_timeout_ms = (uint32_t)o.request_timeout_ms,
        .max_body = o.max_body,
        .effort_profile = strcmp(o.effort_profile, "official") ? DUET_CHAT_PROFILE_PREVIEW : DUET_CHAT_PROFILE_OFFICIAL,
        .router_id = id, .nonce = nonce, .record_ttl_s = 600, .started_unix = (uint64_t)time(NULL),
        .listen_host = lh, .port = colon ? atoi(colon + 1) : 8000, .max_connections = (uint32_t)o.max_connections,
    };
    if (duet_http_start(&ho, &http, &err) != DUET_OK) {
        fprintf(stderr, "duet-router: %s\n", duet_err_text(&err));
        goto out;
    }
    int port = duet_http_port(http);
    if (o.port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", o.port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, o.port_file) != 0) {
            fprintf(stderr, "duet-router: cannot write %s\n", o.port_file);
            goto out;
        }
    }
    duet_info("%s: serving '%s' on http://%s:%d (events %s, %zu prefill and %zu decode workers configured, redis %s)",
              id, name, lh, port, o.events, o.n_prefill, o.n_decode, o.redis ? o.redis : "off");
    sd_notifyf(0, "READY=1\nSTATUS=serving on %s:%d\nMAINPID=%lu", lh, port, (unsigned long)getpid());

    uint64_t wd_usec = 0;
    int wd = sd_watchdog_enabled(0, &wd_usec) > 0;
    for (;;) {
        struct timespec ts = {0, 250 * 1000000L};
        if (wd && wd_usec / 2 < 250000) {
            ts.tv_sec = 0;
            ts.tv_nsec = (long)(wd_usec / 2 * 1000);
        }
        int sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM) {
            duet_info("signal %d: shutting down", sig);
            break;
        }
        /* the watchdog is fed only while the core's loop turns */
        if (wd && duet_time_ns() - duet_core_last_turn_ns(core) < wd_usec * 1000ull / 2)
            sd_notify(0, "WATCHDOG=1");
    }
    sd_notify(0, "STOPPING=1");
    rc = 0;
out:
    duet_http_quiesce(http);
    duet_core_shutdown(core, (uint32_t)o.shutdown_grace_ms);
    duet_http_stop(&http);
    duet_store_destroy(&store); /* before the core is freed: its orphan callback posts to it */
    atomic_store(&sink.core, NULL);
    duet_core_destroy(&core);
    duet_store_destroy(&store);
    duet_metrics_destroy(&metrics);
    duet_tok_destroy(&tok);
    for (size_t i = 0; i < o.n_prefill; i++)
        free((void *)o.prefill[i]);
    for (size_t i = 0; i < o.n_decode; i++)
        free((void *)o.decode[i]);
    return rc;
}
