/* Redis bookkeeping on the store thread (store.h). */
#include "store.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "time_util.h"

#define MAX_ARGS 64
#define MAX_QUEUED 65536 /* writes waiting for the thread; more are dropped */

typedef struct job {
    struct job *next;
    int argc;
    char **argv;
    size_t *argl;
    /* calls only */
    int sync;
    atomic_int refs;
    int done;
    duet_status_t st;
    duet_store_reply_t reply;
    pthread_cond_t cv;
} job_t;

struct duet_store {
    duet_store_opts_t o;
    char host[256], prefix[64], router_id[65], nonce[65];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work arrived or stop */
    job_t *head, *tail;
    size_t n_queued;
    int stop;
    atomic_int up;
    redisContext *rc; /* the store thread's only */
};

static void job_free(job_t *j)
{
    if (!j)
        return;
    for (int i = 0; i < j->argc; i++)
        free(j->argv[i]);
    free(j->argv);
    free(j->argl);
    if (j->sync)
        pthread_cond_destroy(&j->cv);
    free(j);
}

static void job_unref(job_t *j)
{
    if (j && atomic_fetch_sub(&j->refs, 1) == 1)
        job_free(j);
}

static job_t *job_new(int argc, const char *const *argv, int sync)
{
    if (argc < 1 || argc > MAX_ARGS)
        return NULL;
    job_t *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->argv = calloc((size_t)argc, sizeof(char *));
    j->argl = calloc((size_t)argc, sizeof(size_t));
    if (!j->argv || !j->argl)
        goto fail;
    j->argc = argc;
    for (int i = 0; i < argc; i++) {
        j->argl[i] = strlen(argv[i]);
        j->argv[i] = malloc(j->argl[i] + 1);
        if (!j->argv[i])
            goto fail;
        memcpy(j->argv[i], argv[i], j->argl[i] + 1);
    }
    j->sync = sync;
    atomic_init(&j->refs, 1);
    if (sync) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&j->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    return j;
fail:
    j->sync = 0;
    job_free(j);
    return NULL;
}

int duet_store_up(const duet_store_t *s) { return s ? atomic_load(&((duet_store_t *)s)->up) : 0; }
const char *duet_store_prefix(const duet_store_t *s) { return s ? s->prefix : ""; }

const char *duet_store_key(const duet_store_t *s, char *buf, size_t n, const char *fmt, ...)
{
    int k = snprintf(buf, n, "%s", s ? s->prefix : "");
    if (k < 0 || (size_t)k >= n)
        return buf;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + k, n - (size_t)k, fmt, ap);
    va_end(ap);
    return buf;
}

/* ---- the connection (store thread only) -------------------------------- */

static void disconnect(duet_store_t *s, const char *why)
{
    if (s->rc) {
        duet_warn("redis %s:%d: %s; new requests get 503 until it is back", s->host, s->o.port, why);
        redisFree(s->rc);
        s->rc = NULL;
    }
    atomic_store(&s->up, 0);
}

static int connect_once(duet_store_t *s)
{
    struct timeval tv = {0, 300000};
    redisContext *c = redisConnectWithTimeout(s->host, s->o.port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return -1;
    }
    uint32_t ms = s->o.command_timeout_ms ? s->o.command_timeout_ms : 1000;
    struct timeval ct = {ms / 1000, (ms % 1000) * 1000};
    redisSetTimeout(c, ct);
    redisReply *r = redisCommand(c, "PING");
    int ok = r && r->type != REDIS_REPLY_ERROR;
    if (r)
        freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return -1;
    }
    s->rc = c;
    atomic_store(&s->up, 1);
    duet_info("redis %s:%d: connected", s->host, s->o.port);
    return 0;
}

static void reply_copy(const redisReply *r, duet_store_reply_t *out)
{
    memset(out, 0, sizeof *out);
    if (!r)
        return;
    switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
        out->type = 1;
        snprintf(out->str, sizeof out->str, "%.*s", (int)r->len, r->str);
        break;
    case REDIS_REPLY_INTEGER:
        out->type = 2;
        out->integer = r->integer;
        break;
    case REDIS_REPLY_ERROR:
        out->type = 3;
        snprintf(out->str, sizeof out->str, "%.*s", (int)r->len, r->str);
        break;
    default:
        out->type = 0;
    }
}

/* Run a command on the connection: the reply (free it) or NULL after an I/O
 * error (then disconnected). */
static redisReply *run(duet_store_t *s, int argc, const char **argv, const size_t *argl)
{
    if (!s->rc)
        return NULL;
    redisReply *r = redisCommandArgv(s->rc, argc, argv, argl);
    if (!r || s->rc->err) {
        char why[160];
        snprintf(why, sizeof why, "%s", s->rc->errstr[0] ? s->rc->errstr : "no reply");
        if (r)
            freeReplyObject(r);
        disconnect(s, why);
        return NULL;
    }
    return r;
}

static redisReply *runf(duet_store_t *s, const char *a0, ...)
{
    const char *argv[MAX_ARGS];
    int argc = 0;
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && argc < MAX_ARGS; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    return run(s, argc, argv, NULL);
}

static void heartbeat(duet_store_t *s)
{
    char key[192], ttl[24];
    duet_store_key(s, key, sizeof key, "router:%s", s->nonce);
    snprintf(ttl, sizeof ttl, "%u", s->o.router_ttl_ms);
    redisReply *r = runf(s, "SET", key, s->router_id, "PX", ttl, NULL);
    if (r)
        freeReplyObject(r);
}

static const char *hget(const redisReply *h, const char *field)
{
    if (!h || h->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        if (h->element[i]->type == REDIS_REPLY_STRING && !strcmp(h->element[i]->str, field) &&
            h->element[i + 1]->type == REDIS_REPLY_STRING)
            return h->element[i + 1]->str;
    return NULL;
}

/* Is the router of this nonce alive?  Cached per sweep in a small table. */
typedef struct {
    char nonce[65];
    int alive;
} alive_t;

static int owner_alive(duet_store_t *s, const char *nonce, alive_t *cache, int *n_cache)
{
    for (int i = 0; i < *n_cache; i++)
        if (!strcmp(cache[i].nonce, nonce))
            return cache[i].alive;
    char key[192];
    duet_store_key(s, key, sizeof key, "router:%s", nonce);
    redisReply *r = runf(s, "EXISTS", key, NULL);
    int alive = !r || (r->type == REDIS_REPLY_INTEGER && r->integer > 0); /* unsure: alive */
    if (r)
        freeReplyObject(r);
    if (*n_cache < 64) {
        snprintf(cache[*n_cache].nonce, sizeof cache[*n_cache].nonce, "%s", nonce);
        cache[(*n_cache)++].alive = alive;
    }
    return alive;
}

static void check_record(duet_store_t *s, const char *key, alive_t *cache, int *n_cache)
{
    redisReply *h = runf(s, "HGETALL", key, NULL);
    if (!h)
        return;
    const char *state = hget(h, "state"), *owner = hget(h, "owner"), *owner_id = hget(h, "owner_id");
    if (!state || !owner || !strcmp(state, "finished") || !strcmp(state, "aborted") || !strcmp(state, "failed") ||
        !strcmp(owner, s->nonce))
        goto out;
    int orphan = (owner_id && !strcmp(owner_id, s->router_id)) || !owner_alive(s, owner, cache, n_cache);
    if (!orphan || !s->o.on_orphan)
        goto out;
    duet_orphan_t o;
    memset(&o, 0, sizeof o);
    snprintf(o.rid, sizeof o.rid, "%s", key + strlen(s->prefix) + 4);
    snprintf(o.owner, sizeof o.owner, "%s", owner);
    const char *v;
    if ((v = hget(h, "prefill")))
        snprintf(o.prefill_id, sizeof o.prefill_id, "%s", v);
    if ((v = hget(h, "prefill_url")))
        snprintf(o.prefill_url, sizeof o.prefill_url, "%s", v);
    if ((v = hget(h, "decode")))
        snprintf(o.decode_id, sizeof o.decode_id, "%s", v);
    if ((v = hget(h, "decode_url")))
        snprintf(o.decode_url, sizeof o.decode_url, "%s", v);
    if ((v = hget(h, "epoch")))
        o.epoch = strtoull(v, NULL, 10);
    if ((v = hget(h, "prefill_sent")))
        o.prefill_sent = atoi(v);
    /* one router takes each orphan */
    char ckey[192];
    duet_store_key(s, ckey, sizeof ckey, "claim:%s", o.rid);
    redisReply *c = runf(s, "SET", ckey, s->nonce, "NX", "PX", "60000", NULL);
    int mine = c && c->type == REDIS_REPLY_STATUS;
    if (c)
        freeReplyObject(c);
    if (!mine)
        goto out;
    redisReply *u = runf(s, "HSET", key, "state", "aborting", "owner", s->nonce, "owner_id", s->router_id, NULL);
    if (u)
        freeReplyObject(u);
    duet_warn("orphaned request %s of router %s%s: aborting it", o.rid, owner_id ? owner_id : "?",
              owner_id && !strcmp(owner_id, s->router_id) ? " (this router before a restart)" : " (gone)");
    s->o.on_orphan(s->o.arg, &o);
out:
    freeReplyObject(h);
}

/* Call fn for every key matching the pattern (under the prefix), in SCAN batches; stops early
 * when the connection drops, and after max_rounds batches at most. */
static void scan_keys(duet_store_t *s, const char *pattern, int max_rounds,
                      void (*fn)(duet_store_t *s, const char *key, void *arg), void *arg)
{
    char match[192];
    duet_store_key(s, match, sizeof match, "%s", pattern);
    char cursor[32] = "0";
    int rounds = 0;
    do {
        redisReply *r = runf(s, "SCAN", cursor, "MATCH", match, "COUNT", "500", NULL);
        if (!r)
            return;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING) {
            freeReplyObject(r);
            return;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements && s->rc; i++)
            if (keys->element[i]->type == REDIS_REPLY_STRING)
                fn(s, keys->element[i]->str, arg);
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0 && s->rc && ++rounds < max_rounds);
}

/* Several routers share one Redis, each with its own --id: a router takes
 * every unfinished request recorded under its id by another run as its own
 * from before a restart and aborts it.  Two live routers with one id would
 * so abort each other's requests; say so when another run's liveness key
 * carries our id (it may also be this router's previous run, killed less
 * than router_ttl_ms ago). */
static void check_liveness_key(duet_store_t *s, const char *key, void *arg)
{
    if (!strcmp(key, (const char *)arg))
        return;
    redisReply *v = runf(s, "GET", key, NULL);
    if (v && v->type == REDIS_REPLY_STRING && !strcmp(v->str, s->router_id))
        duet_warn("another run of router id %s has a liveness key (%s): its unfinished requests will be "
                  "aborted as this router's own before a restart. If that router is still running, give "
                  "each router its own --id",
                  s->router_id, key);
    if (v)
        freeReplyObject(v);
}

static void check_same_id(duet_store_t *s)
{
    char self[192];
    duet_store_key(s, self, sizeof self, "router:%s", s->nonce);
    scan_keys(s, "router:*", 1000, check_liveness_key, self);
}

typedef struct {
    alive_t cache[64];
    int n_cache;
} sweep_t;

static void sweep_key(duet_store_t *s, const char *key, void *arg)
{
    sweep_t *w = arg;
    check_record(s, key, w->cache, &w->n_cache);
}

static void sweep(duet_store_t *s)
{
    sweep_t w = {.n_cache = 0};
    scan_keys(s, "req:*", 10000, sweep_key, &w);
}

static void run_job(duet_store_t *s, job_t *j)
{
    redisReply *r = run(s, j->argc, (const char **)j->argv, j->argl);
    if (j->sync) {
        pthread_mutex_lock(&s->mu);
        j->st = r ? DUET_OK : DUET_ERR_PEER;
        reply_copy(r, &j->reply);
        j->done = 1;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&s->mu);
    } else if (!r) {
        duet_metrics_count_redis_dropped(s->o.metrics);
    } else if (r->type == REDIS_REPLY_ERROR) {
        duet_warn("redis: %s %s: %s", j->argv[0], j->argc > 1 ? j->argv[1] : "", r->str);
    }
    if (r)
        freeReplyObject(r);
}

/* Fail what is queued while Redis is down: writes are dropped, calls answered. */
static void fail_queued(duet_store_t *s)
{
    pthread_mutex_lock(&s->mu);
    job_t *j = s->head;
    s->head = s->tail = NULL;
    s->n_queued = 0;
    for (job_t *k = j; k; k = k->next)
        if (k->sync) {
            k->st = DUET_ERR_PEER;
            k->done = 1;
            pthread_cond_signal(&k->cv);
        }
    pthread_mutex_unlock(&s->mu);
    while (j) {
        job_t *next = j->next;
        if (!j->sync)
            duet_metrics_count_redis_dropped(s->o.metrics);
        job_unref(j);
        j = next;
    }
}

static void *store_main(void *arg)
{
    duet_store_t *s = arg;
    uint64_t backoff_ms = 100, next_try = 0, next_hb = 0, next_sweep = 0;
    int stopping = 0, checked_id = 0;
    for (;;) {
        uint64_t now = duet_time_ns();
        pthread_mutex_lock(&s->mu);
        stopping = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (!s->rc) {
            if (stopping)
                break;
            if (now >= next_try) {
                if (connect_once(s) == 0) {
                    backoff_ms = 100;
                    next_hb = 0;
                    next_sweep = now; /* look for orphans as soon as connected */
                    continue;
                }
                next_try = now + backoff_ms * 1000000ull;
                backoff_ms = backoff_ms * 2 > 2000 ? 2000 : backoff_ms * 2;
            }
            fail_queued(s);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_mutex_lock(&s->mu);
            if (!s->stop)
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        if (now >= next_hb) {
            heartbeat(s);
            next_hb = now + (uint64_t)s->o.router_ttl_ms / 3 * 1000000ull;
            continue;
        }
        if (now >= next_sweep && !stopping) {
            if (!checked_id) {
                check_same_id(s);
                checked_id = 1;
            }
            sweep(s);
            next_sweep = duet_time_ns() + (uint64_t)s->o.sweep_ms * 1000000ull;
            continue;
        }
        pthread_mutex_lock(&s->mu);
        job_t *j = s->head;
        if (j) {
            s->head = j->next;
            if (!s->head)
                s->tail = NULL;
            s->n_queued--;
        } else if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        pthread_mutex_unlock(&s->mu);
        if (j) {
            run_job(s, j);
            job_unref(j);
        }
    }
    if (s->rc) {
        char key[192];
        duet_store_key(s, key, sizeof key, "router:%s", s->nonce);
        redisReply *r = runf(s, "DEL", key, NULL);
        if (r)
            freeReplyObject(r);
        redisFree(s->rc);
        s->rc = NULL;
    }
    fail_queued(s);
    return NULL;
}

duet_status_t duet_store_create(const duet_store_opts_t *o, duet_store_t **out, duet_err_t *err)
{
    duet_store_t *s = calloc(1, sizeof *s);
    if (!s)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    s->o = *o;
    snprintf(s->host, sizeof s->host, "%s", o->host ? o->host : "127.0.0.1");
    snprintf(s->prefix, sizeof s->prefix, "%s", o->prefix ? o->prefix : "duet:");
    snprintf(s->router_id, sizeof s->router_id, "%s", o->router_id);
    snprintf(s->nonce, sizeof s->nonce, "%s", o->nonce);
    if (!s->o.router_ttl_ms)
        s->o.router_ttl_ms = 5000;
    if (!s->o.sweep_ms)
        s->o.sweep_ms = 5000;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->up, 0);
    if (pthread_create(&s->thread, NULL, store_main, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return duet_err_set(err, DUET_ERR_NOMEM, "cannot start the Redis thread");
    }
    *out = s;
    return DUET_OK;
}

void duet_store_destroy(duet_store_t **ps)
{
    duet_store_t *s = ps ? *ps : NULL;
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    *ps = NULL;
}

static int enqueue(duet_store_t *s, job_t *j)
{
    pthread_mutex_lock(&s->mu);
    if (s->stop || (!j->sync && s->n_queued >= MAX_QUEUED)) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void duet_store_sendv(duet_store_t *s, int argc, const char *const *argv)
{
    if (!s)
        return;
    if (!duet_store_up(s)) {
        duet_metrics_count_redis_dropped(s->o.metrics);
        return;
    }
    job_t *j = job_new(argc, argv, 0);
    if (!j || enqueue(s, j) != 0) {
        duet_metrics_count_redis_dropped(s->o.metrics);
        job_free(j);
    }
}

void duet_store_send(duet_store_t *s, const char *arg0, ...)
{
    const char *argv[MAX_ARGS];
    int argc = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < MAX_ARGS; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    duet_store_sendv(s, argc, argv);
}

duet_status_t duet_store_callv(duet_store_t *s, int argc, const char *const *argv, uint32_t timeout_ms,
                               duet_store_reply_t *reply)
{
    if (!s || !duet_store_up(s))
        return DUET_ERR_PEER;
    job_t *j = job_new(argc, argv, 1);
    if (!j)
        return DUET_ERR_NOMEM;
    atomic_fetch_add(&j->refs, 1); /* the caller's */
    if (enqueue(s, j) != 0) {
        job_unref(j);
        job_unref(j);
        return DUET_ERR_PEER;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&s->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&j->cv, &s->mu, &ts) != 0)
            break;
    duet_status_t st = j->done ? j->st : DUET_ERR_TIMEOUT;
    if (j->done && reply)
        *reply = j->reply;
    pthread_mutex_unlock(&s->mu);
    job_unref(j);
    return st;
}

duet_status_t duet_store_call(duet_store_t *s, uint32_t timeout_ms, duet_store_reply_t *reply, const char *arg0, ...)
{
    const char *argv[MAX_ARGS];
    int argc = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < MAX_ARGS; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    return duet_store_callv(s, argc, argv, timeout_ms, reply);
}
