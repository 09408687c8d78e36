#include "worker_opts.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "duet_config.h"
#include "hicache.h"

typedef enum { OPT_STR, OPT_U32, OPT_BOOL, OPT_DTYPE, OPT_F64, OPT_POLICY, OPT_DEVICE } opt_type_t;

typedef struct {
    const char *name;
    opt_type_t type;
    size_t off;
    const char *help;
} opt_def_t;

#define OFF(f) offsetof(duet_worker_opts_t, f)
static const opt_def_t defs[] = {
    {"model", OPT_STR, OFF(model), "checkpoint directory (required)"},
    {"id", OPT_STR, OFF(id), "worker id (default ROLE-PID)"},
    {"listen", OPT_STR, OFF(listen), "command socket URL, e.g. ipc:///tmp/d0.sock (required)"},
    {"events", OPT_STR, OFF(events), "router event socket URL"},
    {"pages", OPT_U32, OFF(pages), "cache pages (default 256)"},
    {"slots", OPT_U32, OFF(slots), "request slots (default 64)"},
    {"max-batch", OPT_U32, OFF(max_batch), "decode: sequences per step (default 64)"},
    {"token-budget", OPT_U32, OFF(token_budget), "prefill: tokens per step (default 2048)"},
    {"queue-max", OPT_U32, OFF(queue_max), "prefill: queued requests before OVERLOADED (default 1024)"},
    {"wait-timeout-ms", OPT_U32, OFF(wait_timeout_ms), "decode: default WAITING_FOR_INPUT deadline (30000)"},
    {"heartbeat-ms", OPT_U32, OFF(heartbeat_ms), "heartbeat interval (default 1000)"},
    {"event-idle-ms", OPT_U32, OFF(event_idle_ms),
     "close a router's event socket unused this long (default 600000; --events stays)"},
    {"page-tokens", OPT_U32, OFF(cache.page_tokens), "tokens per cache page (default 256)"},
    {"kv-dtype", OPT_DTYPE, OFF(cache.kv_dtype), "KV cache encoding fp8|bf16 (default fp8)"},
    {"index-k-dtype", OPT_DTYPE, OFF(cache.index_k_dtype), "indexer key encoding fp8|bf16 (default fp8)"},
    {"verify-checksums", OPT_BOOL, OFF(verify_checksums), "decode: verify page checksums (default off)"},
    {"xfer-path", OPT_STR, OFF(xfer_path), "data path auto|rma|am (default auto)"},
    {"hicache-device-pages", OPT_U32, OFF(hicache_device_pages),
     "prefill: pages of --pages the prefix cache keeps (default 0)"},
    {"hicache-host-gib", OPT_F64, OFF(hicache_host_gib), "prefill: prefix cache host tier in GiB (default 0)"},
    {"hicache-policy", OPT_POLICY, OFF(hicache_policy),
     "prefill: write-through|write-through-selective:N|write-back (default write-through)"},
    {"device", OPT_DEVICE, OFF(device), "where the forward runs: cpu|cuda[:N] (default cpu; cuda needs a CUDA build)"},
    {"tp", OPT_U32, OFF(tp),
     "tensor-parallel size: GPUs N .. N+tp-1 of --device cuda:N, over NCCL (default 1)"},
};
#define N_DEFS (sizeof defs / sizeof defs[0])

void duet_worker_opts_usage(const char *role)
{
    fprintf(stderr, "usage: duet-%s --model DIR --listen URL [options]\n", role);
    fprintf(stderr, "  --config FILE          JSON object with any of the options below\n");
    for (size_t i = 0; i < N_DEFS; i++)
        fprintf(stderr, "  --%-20s %s\n", defs[i].name, defs[i].help);
}

static duet_status_t set_value(duet_worker_opts_t *o, const opt_def_t *d, const char *sval, json_t *jval,
                               duet_err_t *err)
{
    char *base = (char *)o + d->off;
    char buf[64];
    if (jval) {
        if (json_is_string(jval))
            sval = json_string_value(jval);
        else if (json_is_integer(jval)) {
            snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(jval));
            sval = buf;
        } else if (json_is_real(jval)) {
            snprintf(buf, sizeof buf, "%.17g", json_real_value(jval));
            sval = buf;
        } else if (json_is_boolean(jval))
            sval = json_is_true(jval) ? "1" : "0";
        else
            return duet_err_set(err, DUET_ERR_CONFIG, "option \"%s\": unsupported JSON type", d->name);
    }
    switch (d->type) {
    case OPT_STR: {
        char **p = (char **)(void *)base;
        free(*p);
        *p = duet_strdup(sval);
        return *p ? DUET_OK : duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    case OPT_U32: {
        char *end;
        unsigned long long v = strtoull(sval, &end, 10);
        if (!*sval || *end || v > UINT32_MAX)
            return duet_err_set(err, DUET_ERR_CONFIG, "option \"%s\": \"%s\" is not a 32-bit unsigned integer",
                                d->name, sval);
        *(uint32_t *)(void *)base = (uint32_t)v;
        return DUET_OK;
    }
    case OPT_BOOL:
        *(int *)(void *)base = strcmp(sval, "0") != 0 && strcmp(sval, "false") != 0;
        return DUET_OK;
    case OPT_F64: {
        char *end;
        double v = strtod(sval, &end);
        if (!*sval || *end || !isfinite(v) || v < 0 || v > 1e6)
            return duet_err_set(err, DUET_ERR_CONFIG, "option \"%s\": \"%s\" is not a number in [0, 1e6]", d->name,
                                sval);
        *(double *)(void *)base = v;
        return DUET_OK;
    }
    case OPT_POLICY: {
        duet_hicache_policy_t p;
        uint32_t n;
        duet_err_t perr = {0};
        if (duet_hicache_policy_parse(sval, &p, &n, &perr) != DUET_OK)
            return duet_err_set(err, DUET_ERR_CONFIG, "option \"%s\": %s", d->name, perr.msg);
        *(int *)(void *)base = (int)p;
        o->hicache_selective_hits = n;
        return DUET_OK;
    }
    case OPT_DEVICE: {
        int dev = -1;
        if (strcmp(sval, "cpu") != 0) {
            char *end = NULL;
            unsigned long v = 0;
            if (strncmp(sval, "cuda", 4) != 0 || (sval[4] != 0 && sval[4] != ':'))
                return duet_err_set(err, DUET_ERR_CONFIG, "option \"%s\": \"%s\" is not cpu, cuda or cuda:N",
                                    d->name, sval);
            if (sval[4] == ':') {
                v = strtoul(sval + 5, &end, 10);
                if (!sval[5] || *end || v > 1023)
                    return duet_err_set(err, DUET_ERR_CONFIG, "option \"%s\": \"%s\" names no device number",
                                        d->name, sval);
            }
            dev = (int)v;
        }
        *(int *)(void *)base = dev;
        return DUET_OK;
    }
    case OPT_DTYPE: {
        int dt = duet_cache_dtype_parse(sval);
        if (dt != DUET_CACHE_FP8 && dt != DUET_CACHE_BF16)
            return duet_err_set(err, DUET_ERR_CONFIG, "option \"%s\": \"%s\" is not fp8 or bf16", d->name, sval);
        *(duet_cache_dtype_t *)(void *)base = (duet_cache_dtype_t)dt;
        return DUET_OK;
    }
    }
    return DUET_ERR_INTERNAL;
}

static const opt_def_t *find_def(const char *name)
{
    for (size_t i = 0; i < N_DEFS; i++)
        if (strcmp(defs[i].name, name) == 0)
            return &defs[i];
    return NULL;
}

duet_status_t duet_worker_opts_parse(duet_worker_opts_t *o, const char *role, int argc, char **argv,
                                     duet_err_t *err)
{
    memset(o, 0, sizeof *o);
    o->role = role;
    o->pages = 256;
    o->slots = 64;
    o->max_batch = 64;
    o->token_budget = 2048;
    o->queue_max = 1024;
    o->wait_timeout_ms = 30000;
    o->heartbeat_ms = 1000;
    o->event_idle_ms = 600000;
    o->cache.page_tokens = 256;
    o->cache.kv_dtype = DUET_CACHE_FP8;
    o->cache.index_k_dtype = DUET_CACHE_FP8;
    o->device = -1;
    o->tp = 1;
    duet_status_t st;
    /* config file first */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--config") == 0) {
            json_error_t je;
            json_t *root = json_load_file(argv[i + 1], JSON_REJECT_DUPLICATES, &je);
            if (!root)
                return duet_err_set(err, DUET_ERR_CONFIG, "%s: line %d: %s", argv[i + 1], je.line, je.text);
            if (!json_is_object(root)) {
                json_decref(root);
                return duet_err_set(err, DUET_ERR_CONFIG, "%s: not a JSON object", argv[i + 1]);
            }
            const char *key;
            json_t *val;
            json_object_foreach(root, key, val) {
                const opt_def_t *d = find_def(key);
                if (!d) {
                    json_decref(root);
                    return duet_err_set(err, DUET_ERR_CONFIG, "%s: unknown option \"%s\"", argv[i + 1], key);
                }
                if ((st = set_value(o, d, NULL, val, err)) != DUET_OK) {
                    json_decref(root);
                    return st;
                }
            }
            json_decref(root);
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return duet_err_set(err, DUET_ERR_INVALID, "help");
        if (strncmp(a, "--", 2) != 0)
            return duet_err_set(err, DUET_ERR_INVALID, "unexpected argument \"%s\"", a);
        if (strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        const opt_def_t *d = find_def(a + 2);
        if (!d)
            return duet_err_set(err, DUET_ERR_INVALID, "unknown option \"%s\"", a);
        if (d->type == OPT_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            *(int *)(void *)((char *)o + d->off) = 1;
            continue;
        }
        if (i + 1 >= argc)
            return duet_err_set(err, DUET_ERR_INVALID, "option \"%s\" needs a value", a);
        if ((st = set_value(o, d, argv[++i], NULL, err)) != DUET_OK)
            return st;
    }
    if (!o->model || !o->listen)
        return duet_err_set(err, DUET_ERR_INVALID, "--model and --listen are required");
    if (!o->id) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s-%d", role, (int)getpid());
        o->id = duet_strdup(buf);
    }
    if (o->pages == 0 || o->slots == 0 || o->max_batch == 0 || o->token_budget == 0)
        return duet_err_set(err, DUET_ERR_CONFIG, "pages, slots, max-batch and token-budget must be positive");
    if (o->tp < 1 || o->tp > 8)
        return duet_err_set(err, DUET_ERR_CONFIG, "--tp %u: expected 1 to 8 GPUs", o->tp);
    return DUET_OK;
}

duet_status_t duet_worker_opts_check_device(const duet_worker_opts_t *o, duet_err_t *err)
{
    if (o->device < 0 && o->tp > 1)
        return duet_err_set(err, DUET_ERR_UNSUPPORTED,
                            "--tp %u needs --device cuda: tensor parallelism runs on GPUs only", o->tp);
    if (o->device < 0)
        return DUET_OK;
    if (!DUET_HAVE_CUDA)
        return duet_err_set(err, DUET_ERR_UNSUPPORTED,
                            "--device cuda:%d: this build has no CUDA backend (configure with -Dcuda=enabled)",
                            o->device);
    return DUET_OK;
}

const char *duet_worker_device_name(const duet_worker_opts_t *o, char *buf, size_t len)
{
    if (o->device < 0)
        snprintf(buf, len, "cpu");
    else if (o->tp > 1)
        snprintf(buf, len, "cuda:%d-%d", o->device, o->device + (int)o->tp - 1);
    else
        snprintf(buf, len, "cuda:%d", o->device);
    return buf;
}

void duet_worker_opts_fini(duet_worker_opts_t *o)
{
    free(o->model);
    free(o->id);
    free(o->listen);
    free(o->events);
    free(o->xfer_path);
    memset(o, 0, sizeof *o);
}
