/* Control-plane messages: codec, validation and builders (msg.h). */
#include "msg.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "alloc.h"
#include "model_config.h"
#include "time_util.h"

_Static_assert(DUET_PROTOCOL_VERSION == DUET__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT,
               "DUET_PROTOCOL_VERSION and duet.proto's PROTOCOL_VERSION_CURRENT differ");
_Static_assert(-DUET_STATUS_MIN == DUET__V1__ERROR_CODE__ERROR_CODE_INTERNAL,
               "ErrorCode in duet.proto does not cover every duet_status_t");
_Static_assert(DUET__V1__POOL_KIND__POOL_STATE_C128 == DUET_POOL_STATE_C128 + 1 && DUET_POOL_COUNT == 6,
               "PoolKind in duet.proto does not match duet_pool_kind_t");

#define N_ENUM_REQUEST_STATES 9 /* RequestState values, UNSPECIFIED included */

void duet_msg_limits_default(duet_msg_limits_t *l)
{
    l->max_message_bytes = (size_t)64 << 20;
    l->max_decoded_bytes = (size_t)256 << 20;
    l->max_tokens = 1u << 21;
    l->max_pages = 1u << 16;
    l->max_units = 1u << 24;
    l->max_checksums = 1u << 21;
    l->max_stop_ids = 256;
    l->max_layers = DUET_MAX_LAYERS;
    l->max_page_bytes = (uint64_t)1 << 30;
    l->max_blob_bytes = 64u << 10;
    l->max_text_bytes = 4096;
    l->max_url_bytes = 256;
    l->max_requests = 1u << 16;
    l->max_deadline_ms = 24u * 3600u * 1000u;
}

static const duet_msg_limits_t *limits_or_default(const duet_msg_limits_t *lim, duet_msg_limits_t *tmp)
{
    if (lim)
        return lim;
    duet_msg_limits_default(tmp);
    return tmp;
}

/* ------------------------------------------------------------------ names and codes */

duet_msg_kind_t duet_msg_kind(const duet_envelope_t *env)
{
    return env ? env->body_case : DUET__V1__ENVELOPE__BODY__NOT_SET;
}

const char *duet_msg_kind_name(duet_msg_kind_t kind)
{
    if (kind == DUET__V1__ENVELOPE__BODY__NOT_SET)
        return "none";
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&duet__v1__envelope__descriptor, (unsigned)kind);
    if (!fd || !(fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
        return "unknown";
    return fd->name;
}

const char *duet_msg_rid(const duet_envelope_t *env)
{
    if (!env || !env->header || !env->header->rid || !env->header->rid[0])
        return NULL;
    return env->header->rid;
}

const char *duet_msg_enum_name(const ProtobufCEnumDescriptor *desc, int value)
{
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(desc, value);
    return v ? v->name : "?";
}

Duet__V1__ErrorCode duet_msg_error_code(duet_status_t st)
{
    if (st == DUET_OK)
        return DUET__V1__ERROR_CODE__ERROR_CODE_UNSPECIFIED;
    if (st < DUET_STATUS_MIN || st > 0)
        return DUET__V1__ERROR_CODE__ERROR_CODE_INTERNAL;
    return (Duet__V1__ErrorCode)(-(int)st);
}

duet_status_t duet_msg_error_status(Duet__V1__ErrorCode code)
{
    if ((int)code < 1 || (int)code > -DUET_STATUS_MIN)
        return DUET_ERR_PROTOCOL;
    return (duet_status_t)(-(int)code);
}

Duet__V1__PoolKind duet_msg_pool_to_wire(duet_pool_kind_t kind)
{
    if ((int)kind < 0 || kind >= DUET_POOL_COUNT)
        return DUET__V1__POOL_KIND__POOL_KIND_UNSPECIFIED;
    return (Duet__V1__PoolKind)(kind + 1);
}

duet_status_t duet_msg_pool_from_wire(Duet__V1__PoolKind wire, duet_pool_kind_t *kind)
{
    if ((int)wire < 1 || (int)wire > DUET_POOL_COUNT)
        return DUET_ERR_PROTOCOL;
    *kind = (duet_pool_kind_t)((int)wire - 1);
    return DUET_OK;
}

Duet__V1__CacheDtype duet_msg_dtype_to_wire(duet_cache_dtype_t dt)
{
    switch (dt) {
    case DUET_CACHE_FP8: return DUET__V1__CACHE_DTYPE__CACHE_DTYPE_FP8;
    case DUET_CACHE_BF16: return DUET__V1__CACHE_DTYPE__CACHE_DTYPE_BF16;
    case DUET_CACHE_F32: return DUET__V1__CACHE_DTYPE__CACHE_DTYPE_F32;
    }
    return DUET__V1__CACHE_DTYPE__CACHE_DTYPE_UNSPECIFIED;
}

static const char *pool_wire_name(int wire)
{
    return duet_msg_enum_name(&duet__v1__pool_kind__descriptor, wire);
}

/* ------------------------------------------------------------------ validation */

/* A field path for error sentences: "prefill.descriptor.pools[2].rkey". */
typedef struct {
    char s[160];
    size_t len;
} path_t;

static size_t path_push(path_t *p, const char *name, long index)
{
    size_t old = p->len;
    int n;
    if (index >= 0)
        n = snprintf(p->s + p->len, sizeof p->s - p->len, "%s%s[%ld]", p->len ? "." : "", name, index);
    else
        n = snprintf(p->s + p->len, sizeof p->s - p->len, "%s%s", p->len ? "." : "", name);
    if (n > 0)
        p->len = p->len + (size_t)n < sizeof p->s ? p->len + (size_t)n : sizeof p->s - 1;
    return old;
}

static void path_pop(path_t *p, size_t old)
{
    p->len = old;
    p->s[old] = '\0';
}

/* Walk every (sub)message:
 *  - every enum value must be one this version knows: proto3 decoders keep
 *    unknown values, and an unknown reason or pool kind would change what
 *    the message means;
 *  - unknown fields (kept for forward compatibility) must be well formed:
 *    protobuf-c accepts a non-canonical tag of field number 0 ("80 00") as
 *    an unknown field, which would re-encode into bytes no decoder accepts. */
static duet_status_t check_enums(const ProtobufCMessage *m, path_t *p, duet_err_t *err)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;

    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
        if (u->tag == 0 || u->tag > 536870911u ||
            (u->wire_type != PROTOBUF_C_WIRE_TYPE_VARINT && u->wire_type != PROTOBUF_C_WIRE_TYPE_64BIT &&
             u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED && u->wire_type != PROTOBUF_C_WIRE_TYPE_32BIT))
            return duet_err_set(err, DUET_ERR_PARSE, "%s%sunknown field %u (wire type %d) is not a valid encoding",
                                p->s, p->len ? ": " : "", u->tag, (int)u->wire_type);
    }

    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        size_t n = 1;
        const void *arr = base + fd->offset;

        if (fd->type != PROTOBUF_C_TYPE_ENUM && fd->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(const void *)(base + fd->quantifier_offset) != fd->id)
            continue;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)(const void *)(base + fd->quantifier_offset);
            arr = *(const void *const *)(const void *)(base + fd->offset);
        }
        for (size_t i = 0; i < n; i++) {
            size_t old = path_push(p, fd->name, fd->label == PROTOBUF_C_LABEL_REPEATED ? (long)i : -1);
            if (fd->type == PROTOBUF_C_TYPE_ENUM) {
                int v = ((const int *)arr)[i];
                if (!protobuf_c_enum_descriptor_get_value(fd->descriptor, v))
                    return duet_err_set(err, DUET_ERR_PROTOCOL, "%s: unknown %s value %d", p->s,
                                        ((const ProtobufCEnumDescriptor *)fd->descriptor)->short_name, v);
            } else {
                const ProtobufCMessage *sub = ((const ProtobufCMessage *const *)arr)[i];
                if (sub) {
                    duet_status_t st = check_enums(sub, p, err);
                    if (st)
                        return st;
                }
            }
            path_pop(p, old);
        }
    }
    return DUET_OK;
}

#define FAIL(st, ...) return duet_err_set(err, (st), __VA_ARGS__)
static int id_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.' || c == ':';
}

/* rid, sender and worker ids: 1..64 of [A-Za-z0-9._:-] (UUIDs and host:port
 * names fit); empty allowed unless `required`. */
static duet_status_t check_id(const char *s, const char *field, int required, duet_err_t *err)
{
    size_t len = s ? strlen(s) : 0;
    if (len == 0) {
        if (required)
            FAIL(DUET_ERR_PROTOCOL, "%s: missing", field);
        return DUET_OK;
    }
    if (len > DUET_MSG_MAX_ID_LEN)
        FAIL(DUET_ERR_RANGE, "%s: %zu characters, at most %d allowed", field, len, DUET_MSG_MAX_ID_LEN);
    for (size_t i = 0; i < len; i++)
        if (!id_char((unsigned char)s[i]))
            FAIL(DUET_ERR_PROTOCOL, "%s: character 0x%02x at %zu is not one of [A-Za-z0-9._:-]", field,
                 (unsigned char)s[i], i);
    return DUET_OK;
}

/* URLs: printable ASCII without spaces. */
static duet_status_t check_url(const char *s, const char *field, int required, const duet_msg_limits_t *lim,
                               duet_err_t *err)
{
    size_t len = s ? strlen(s) : 0;
    if (len == 0) {
        if (required)
            FAIL(DUET_ERR_PROTOCOL, "%s: missing", field);
        return DUET_OK;
    }
    if (len > lim->max_url_bytes)
        FAIL(DUET_ERR_RANGE, "%s: %zu bytes, at most %u allowed", field, len, lim->max_url_bytes);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            FAIL(DUET_ERR_PROTOCOL, "%s: byte 0x%02x at %zu is not printable ASCII", field, (unsigned char)s[i],
                 i);
    return DUET_OK;
}

duet_status_t duet_msg_check_event_url(const char *url, const char *field, duet_err_t *err)
{
    static const char *const schemes[] = {"ipc://", "tcp://", "inproc://"};
    if (!url || !*url)
        return DUET_OK;
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++) {
        size_t n = strlen(schemes[i]);
        if (strncmp(url, schemes[i], n) == 0) {
            if (!url[n])
                FAIL(DUET_ERR_INVALID, "%s: \"%s\" names no address after the scheme", field, url);
            if (i == 1 && !strchr(url + n, ':'))
                FAIL(DUET_ERR_INVALID, "%s: \"%s\" has no port (tcp://HOST:PORT)", field, url);
            return DUET_OK;
        }
    }
    FAIL(DUET_ERR_INVALID, "%s: \"%.64s\" is not an ipc://, tcp:// or inproc:// URL", field, url);
}

static duet_status_t check_text(const char *s, const char *field, const duet_msg_limits_t *lim, duet_err_t *err)
{
    size_t len = s ? strlen(s) : 0;
    if (len > lim->max_text_bytes)
        FAIL(DUET_ERR_RANGE, "%s: %zu bytes, at most %u allowed", field, len, lim->max_text_bytes);
    return DUET_OK;
}

static duet_status_t check_count(size_t n, size_t lo, size_t hi, const char *field, duet_err_t *err)
{
    if (n < lo || n > hi)
        FAIL(DUET_ERR_RANGE, "%s: %zu entries, allowed %zu..%zu", field, n, lo, hi);
    return DUET_OK;
}

static duet_status_t check_u64(uint64_t v, uint64_t lo, uint64_t hi, const char *field, duet_err_t *err)
{
    if (v < lo || v > hi)
        FAIL(DUET_ERR_RANGE, "%s: %llu is outside %llu..%llu", field, (unsigned long long)v,
             (unsigned long long)lo, (unsigned long long)hi);
    return DUET_OK;
}

static duet_status_t check_tokens(const int32_t *t, size_t n, size_t lo, const char *field,
                                  const duet_msg_limits_t *lim, duet_err_t *err)
{
    DUET_TRY(check_count(n, lo, lim->max_tokens, field, err));
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0)
            FAIL(DUET_ERR_RANGE, "%s[%zu]: token id %d is negative", field, i, t[i]);
    return DUET_OK;
}

static duet_status_t require(const void *sub, const char *field, duet_err_t *err)
{
    if (!sub)
        FAIL(DUET_ERR_PROTOCOL, "%s: missing", field);
    return DUET_OK;
}

static duet_status_t require_enum(int v, const char *field, duet_err_t *err)
{
    if (v == 0)
        FAIL(DUET_ERR_PROTOCOL, "%s: UNSPECIFIED", field);
    return DUET_OK;
}

static duet_status_t check_unit_float(float v, float lo, float hi, const char *field, duet_err_t *err)
{
    if (!isfinite(v) || v < lo || v > hi)
        FAIL(DUET_ERR_RANGE, "%s: %g is outside [%g, %g]", field, (double)v, (double)lo, (double)hi);
    return DUET_OK;
}

static duet_status_t check_sampling(const Duet__V1__SamplingParams *s, const char *where,
                                    const duet_msg_limits_t *lim, duet_err_t *err)
{
    char f[96];
    snprintf(f, sizeof f, "%s.sampling", where);
    DUET_TRY(require(s, f, err));
    snprintf(f, sizeof f, "%s.sampling.temperature", where);
    DUET_TRY(check_unit_float(s->temperature, 0.0f, 100.0f, f, err));
    snprintf(f, sizeof f, "%s.sampling.top_p", where);
    DUET_TRY(check_unit_float(s->top_p, 0.0f, 1.0f, f, err));
    snprintf(f, sizeof f, "%s.sampling.min_p", where);
    DUET_TRY(check_unit_float(s->min_p, 0.0f, 1.0f, f, err));
    if (s->min_p >= 1.0f)
        FAIL(DUET_ERR_RANGE, "%s: %g is outside [0, 1)", f, (double)s->min_p);
    if (s->top_k < 0)
        FAIL(DUET_ERR_RANGE, "%s.sampling.top_k: %d is negative", where, s->top_k);
    snprintf(f, sizeof f, "%s.sampling.stop_token_ids", where);
    DUET_TRY(check_count(s->n_stop_token_ids, 0, lim->max_stop_ids, f, err));
    for (size_t i = 0; i < s->n_stop_token_ids; i++)
        if (s->stop_token_ids[i] < 0)
            FAIL(DUET_ERR_RANGE, "%s[%zu]: token id %d is negative", f, i, s->stop_token_ids[i]);
    return DUET_OK;
}

static int pool_is_paged(int wire)
{
    return wire == DUET__V1__POOL_KIND__POOL_C4_KV || wire == DUET__V1__POOL_KIND__POOL_C4_INDEX_K ||
           wire == DUET__V1__POOL_KIND__POOL_C128_KV;
}

static duet_status_t check_page_tokens(uint32_t pt, const char *field, duet_err_t *err)
{
    if (pt == 0 || pt > 65536 || pt % 128 != 0)
        FAIL(DUET_ERR_RANGE, "%s: %u is not a multiple of 128 in 128..65536", field, pt);
    return DUET_OK;
}

static duet_status_t check_descriptor(const Duet__V1__TransferDescriptor *d, const char *where, uint64_t epoch,
                                      const duet_msg_limits_t *lim, duet_err_t *err)
{
    char f[96];
    uint32_t seen = 0;
    uint64_t page_limit = UINT64_MAX, slot_limit = UINT64_MAX;
    int have_paged = 0;

    snprintf(f, sizeof f, "%s.descriptor", where);
    DUET_TRY(require(d, f, err));
    snprintf(f, sizeof f, "%s.descriptor.decode_worker_id", where);
    DUET_TRY(check_id(d->decode_worker_id, f, 1, err));
    snprintf(f, sizeof f, "%s.descriptor.ucx_address", where);
    DUET_TRY(check_u64(d->ucx_address.len, 1, lim->max_blob_bytes, f, err));
    snprintf(f, sizeof f, "%s.descriptor.page_tokens", where);
    DUET_TRY(check_page_tokens(d->page_tokens, f, err));
    if (d->epoch != epoch)
        FAIL(DUET_ERR_PROTOCOL, "%s.descriptor.epoch: %llu differs from the header's epoch %llu", where,
             (unsigned long long)d->epoch, (unsigned long long)epoch);
    if (epoch == 0)
        FAIL(DUET_ERR_PROTOCOL, "%s.descriptor.epoch: 0 (decode assigns epochs from 1)", where);
    snprintf(f, sizeof f, "%s.descriptor.pools", where);
    DUET_TRY(check_count(d->n_pools, 1, DUET_POOL_COUNT, f, err));
    for (size_t i = 0; i < d->n_pools; i++) {
        const Duet__V1__PoolDescriptor *p = d->pools[i];
        snprintf(f, sizeof f, "%s.descriptor.pools[%zu]", where, i);
        DUET_TRY(require(p, f, err));
        snprintf(f, sizeof f, "%s.descriptor.pools[%zu].kind", where, i);
        DUET_TRY(require_enum(p->kind, f, err));
        if (seen & (1u << p->kind))
            FAIL(DUET_ERR_PROTOCOL, "%s: %s appears twice", f, pool_wire_name(p->kind));
        seen |= 1u << p->kind;
        snprintf(f, sizeof f, "%s.descriptor.pools[%zu].rkey", where, i);
        DUET_TRY(check_u64(p->rkey.len, 1, lim->max_blob_bytes, f, err));
        snprintf(f, sizeof f, "%s.descriptor.pools[%zu].page_bytes", where, i);
        DUET_TRY(check_u64(p->page_bytes, 1, lim->max_page_bytes, f, err));
        snprintf(f, sizeof f, "%s.descriptor.pools[%zu].n_units", where, i);
        DUET_TRY(check_u64(p->n_units, 1, lim->max_units, f, err));
        snprintf(f, sizeof f, "%s.descriptor.pools[%zu].n_layers", where, i);
        DUET_TRY(check_u64(p->n_layers, 1, lim->max_layers, f, err));
        /* the whole pool must be addressable: base + layers * units * page_bytes
         * must not wrap (layers * units < 2^32 * 2^32 cannot overflow) */
        uint64_t span = (uint64_t)p->n_layers * p->n_units;
        if (p->remote_base == 0 || span > UINT64_MAX / p->page_bytes ||
            span * p->page_bytes > UINT64_MAX - p->remote_base)
            FAIL(DUET_ERR_RANGE,
                 "%s.descriptor.pools[%zu].remote_base: 0x%llx + %u layers x %u units x %llu bytes is not an address range",
                 where, i, (unsigned long long)p->remote_base, p->n_layers, p->n_units,
                 (unsigned long long)p->page_bytes);
        if (pool_is_paged(p->kind)) {
            have_paged = 1;
            if (p->n_units < page_limit)
                page_limit = p->n_units;
        } else if (p->n_units < slot_limit) {
            slot_limit = p->n_units;
        }
    }
    snprintf(f, sizeof f, "%s.descriptor.page_ids", where);
    DUET_TRY(check_count(d->n_page_ids, 0, lim->max_pages, f, err));
    if (!have_paged && d->n_page_ids)
        FAIL(DUET_ERR_RANGE, "%s: %zu page ids but no paged pool", f, d->n_page_ids);
    for (size_t i = 0; i < d->n_page_ids; i++)
        if (d->page_ids[i] >= page_limit)
            FAIL(DUET_ERR_RANGE, "%s[%zu]: page %u is outside the pools' %llu pages", f, i, d->page_ids[i],
                 (unsigned long long)page_limit);
    if (slot_limit != UINT64_MAX && d->slot != DUET_MSG_NO_SLOT && d->slot >= slot_limit)
        FAIL(DUET_ERR_RANGE, "%s.descriptor.slot: %u is outside the pools' %llu slots", where, d->slot,
             (unsigned long long)slot_limit);
    return DUET_OK;
}

static duet_status_t check_pool_layouts(Duet__V1__PoolLayout *const *pools, size_t n, const char *where,
                                        const duet_msg_limits_t *lim, duet_err_t *err)
{
    char f[96];
    uint32_t seen = 0;
    DUET_TRY(check_count(n, 0, DUET_POOL_COUNT, where, err));
    for (size_t i = 0; i < n; i++) {
        const Duet__V1__PoolLayout *p = pools[i];
        snprintf(f, sizeof f, "%s[%zu]", where, i);
        DUET_TRY(require(p, f, err));
        snprintf(f, sizeof f, "%s[%zu].kind", where, i);
        DUET_TRY(require_enum(p->kind, f, err));
        if (seen & (1u << p->kind))
            FAIL(DUET_ERR_PROTOCOL, "%s: %s appears twice", f, pool_wire_name(p->kind));
        seen |= 1u << p->kind;
        snprintf(f, sizeof f, "%s[%zu].dtype", where, i);
        DUET_TRY(require_enum(p->dtype, f, err));
        snprintf(f, sizeof f, "%s[%zu].page_bytes", where, i);
        DUET_TRY(check_u64(p->page_bytes, 1, lim->max_page_bytes, f, err));
        snprintf(f, sizeof f, "%s[%zu].n_layers", where, i);
        DUET_TRY(check_u64(p->n_layers, 1, lim->max_layers, f, err));
        snprintf(f, sizeof f, "%s[%zu].n_units", where, i);
        DUET_TRY(check_u64(p->n_units, 0, lim->max_units, f, err));
    }
    return DUET_OK;
}

static duet_status_t check_load(const Duet__V1__Load *l, const char *where, const duet_msg_limits_t *lim,
                                duet_err_t *err)
{
    char f[96];
    uint32_t seen = 0;
    snprintf(f, sizeof f, "%s.load", where);
    DUET_TRY(require(l, f, err));
    snprintf(f, sizeof f, "%s.load.requests", where);
    DUET_TRY(check_count(l->n_requests, 0, N_ENUM_REQUEST_STATES - 1, f, err));
    for (size_t i = 0; i < l->n_requests; i++) {
        snprintf(f, sizeof f, "%s.load.requests[%zu]", where, i);
        DUET_TRY(require(l->requests[i], f, err));
        snprintf(f, sizeof f, "%s.load.requests[%zu].state", where, i);
        DUET_TRY(require_enum(l->requests[i]->state, f, err));
        if (seen & (1u << l->requests[i]->state))
            FAIL(DUET_ERR_PROTOCOL, "%s: %s appears twice", f,
                 duet_msg_enum_name(&duet__v1__request_state__descriptor, l->requests[i]->state));
        seen |= 1u << l->requests[i]->state;
    }
    snprintf(f, sizeof f, "%s.load.oldest_waiting_rid", where);
    DUET_TRY(check_id(l->oldest_waiting_rid, f, 0, err));
    return DUET_OK;
}

static duet_status_t check_body(const duet_envelope_t *e, const duet_msg_limits_t *lim, duet_err_t *err)
{
    const Duet__V1__Header *h = e->header;
    char f[96];

    switch (e->body_case) {
    case DUET__V1__ENVELOPE__BODY_WORKER_REGISTER: {
        const Duet__V1__WorkerRegister *m = e->worker_register;
        DUET_TRY(require(m, "worker_register", err));
        if (m->role != DUET__V1__ROLE__ROLE_PREFILL && m->role != DUET__V1__ROLE__ROLE_DECODE)
            FAIL(DUET_ERR_PROTOCOL, "worker_register.role: %s is not a worker role",
                 duet_msg_enum_name(&duet__v1__role__descriptor, m->role));
        DUET_TRY(check_id(m->worker_id, "worker_register.worker_id", 1, err));
        DUET_TRY(check_url(m->control_url, "worker_register.control_url", 1, lim, err));
        DUET_TRY(check_url(m->event_url, "worker_register.event_url", 0, lim, err));
        DUET_TRY(require(m->capacity, "worker_register.capacity", err));
        DUET_TRY(check_page_tokens(m->capacity->page_tokens, "worker_register.capacity.page_tokens", err));
        DUET_TRY(check_u64(m->capacity->pages, 0, lim->max_units, "worker_register.capacity.pages", err));
        DUET_TRY(check_u64(m->capacity->slots, 0, lim->max_units, "worker_register.capacity.slots", err));
        return check_pool_layouts(m->capacity->pools, m->capacity->n_pools, "worker_register.capacity.pools", lim,
                                  err);
    }
    case DUET__V1__ENVELOPE__BODY_HEARTBEAT:
        DUET_TRY(require(e->heartbeat, "heartbeat", err));
        DUET_TRY(require_enum(e->heartbeat->role, "heartbeat.role", err));
        return check_load(e->heartbeat->load, "heartbeat", lim, err);
    case DUET__V1__ENVELOPE__BODY_RESERVE: {
        const Duet__V1__Reserve *m = e->reserve;
        DUET_TRY(require(m, "reserve", err));
        DUET_TRY(check_u64(m->prompt_len, 1, lim->max_tokens, "reserve.prompt_len", err));
        DUET_TRY(check_u64(m->max_new_tokens, 1, lim->max_tokens, "reserve.max_new_tokens", err));
        DUET_TRY(check_u64(m->deadline_ms, 1, lim->max_deadline_ms, "reserve.deadline_ms", err));
        DUET_TRY(check_id(m->prefill_worker_id, "reserve.prefill_worker_id", 0, err));
        DUET_TRY(check_url(m->event_url, "reserve.event_url", 0, lim, err));
        return check_sampling(m->sampling, "reserve", lim, err);
    }
    case DUET__V1__ENVELOPE__BODY_RESERVED:
        DUET_TRY(require(e->reserved, "reserved", err));
        return check_descriptor(e->reserved->descriptor, "reserved", h->epoch, lim, err);
    case DUET__V1__ENVELOPE__BODY_REJECTED:
        DUET_TRY(require(e->rejected, "rejected", err));
        DUET_TRY(require_enum(e->rejected->reason, "rejected.reason", err));
        return check_text(e->rejected->message, "rejected.message", lim, err);
    case DUET__V1__ENVELOPE__BODY_PREFILL: {
        const Duet__V1__Prefill *m = e->prefill;
        DUET_TRY(require(m, "prefill", err));
        DUET_TRY(check_tokens(m->tokens, m->n_tokens, 1, "prefill.tokens", lim, err));
        DUET_TRY(check_u64(m->deadline_ms, 1, lim->max_deadline_ms, "prefill.deadline_ms", err));
        DUET_TRY(check_url(m->event_url, "prefill.event_url", 0, lim, err));
        DUET_TRY(check_sampling(m->sampling, "prefill", lim, err));
        return check_descriptor(m->descriptor, "prefill", h->epoch, lim, err);
    }
    case DUET__V1__ENVELOPE__BODY_TRANSFER_DONE: {
        const Duet__V1__TransferDone *m = e->transfer_done;
        DUET_TRY(require(m, "transfer_done", err));
        if (h->epoch == 0)
            FAIL(DUET_ERR_PROTOCOL, "header.epoch: 0 in a transfer_done (decode assigns epochs from 1)");
        if (m->first_token < 0)
            FAIL(DUET_ERR_RANGE, "transfer_done.first_token: token id %d is negative", m->first_token);
        DUET_TRY(check_u64(m->n_tokens, 0, lim->max_tokens, "transfer_done.n_tokens", err));
        const Duet__V1__PageChecksums *c = m->checksums;
        if (!c)
            return DUET_OK;
        DUET_TRY(check_count(c->n_hash, 0, lim->max_checksums, "transfer_done.checksums.hash", err));
        if (c->n_pool != c->n_hash || c->n_layer != c->n_hash || c->n_page != c->n_hash)
            FAIL(DUET_ERR_PROTOCOL,
                 "transfer_done.checksums: pool, layer, page and hash have %zu, %zu, %zu and %zu entries", c->n_pool,
                 c->n_layer, c->n_page, c->n_hash);
        for (size_t i = 0; i < c->n_hash; i++) {
            if (c->pool[i] == DUET__V1__POOL_KIND__POOL_KIND_UNSPECIFIED)
                FAIL(DUET_ERR_PROTOCOL, "transfer_done.checksums.pool[%zu]: UNSPECIFIED", i);
            if (c->layer[i] >= lim->max_layers && c->layer[i] != DUET_MSG_ALL_LAYERS)
                FAIL(DUET_ERR_RANGE, "transfer_done.checksums.layer[%zu]: %u is not below %u", i, c->layer[i],
                     lim->max_layers);
            if (c->page[i] >= lim->max_units)
                FAIL(DUET_ERR_RANGE, "transfer_done.checksums.page[%zu]: %u is not below %u", i, c->page[i],
                     lim->max_units);
        }
        return DUET_OK;
    }
    case DUET__V1__ENVELOPE__BODY_ABORT:
        DUET_TRY(require(e->abort, "abort", err));
        DUET_TRY(require_enum(e->abort->reason, "abort.reason", err));
        return check_text(e->abort->message, "abort.message", lim, err);
    case DUET__V1__ENVELOPE__BODY_ABORT_ACK:
        DUET_TRY(require(e->abort_ack, "abort_ack", err));
        return check_u64(e->abort_ack->pages_quarantined, 0, lim->max_pages, "abort_ack.pages_quarantined", err);
    case DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK: {
        const Duet__V1__TokenChunk *m = e->token_chunk;
        DUET_TRY(require(m, "token_chunk", err));
        DUET_TRY(check_tokens(m->tokens, m->n_tokens, 1, "token_chunk.tokens", lim, err));
        return check_u64((uint64_t)m->first_index + m->n_tokens, 1, lim->max_tokens,
                         "token_chunk.first_index + tokens", err);
    }
    case DUET__V1__ENVELOPE__BODY_REQUEST_FINISHED: {
        const Duet__V1__RequestFinished *m = e->request_finished;
        DUET_TRY(require(m, "request_finished", err));
        DUET_TRY(require_enum(m->reason, "request_finished.reason", err));
        if (m->reason == DUET__V1__FINISH_REASON__FINISH_REASON_ERROR)
            DUET_TRY(require_enum(m->error, "request_finished.error", err));
        if (m->reason == DUET__V1__FINISH_REASON__FINISH_REASON_ABORT)
            DUET_TRY(require_enum(m->abort_reason, "request_finished.abort_reason", err));
        DUET_TRY(check_u64(m->prompt_tokens, 0, lim->max_tokens, "request_finished.prompt_tokens", err));
        DUET_TRY(check_u64(m->completion_tokens, 0, lim->max_tokens, "request_finished.completion_tokens", err));
        return check_u64(m->cached_tokens, 0, m->prompt_tokens, "request_finished.cached_tokens", err);
    }
    case DUET__V1__ENVELOPE__BODY_ERROR:
        DUET_TRY(require(e->error, "error", err));
        DUET_TRY(require_enum(e->error->code, "error.code", err));
        return check_text(e->error->message, "error.message", lim, err);
    case DUET__V1__ENVELOPE__BODY_ACK:
        return require(e->ack, "ack", err);
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST:
        return require(e->state_dump_request, "state_dump_request", err);
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP: {
        const Duet__V1__StateDump *m = e->state_dump;
        DUET_TRY(require(m, "state_dump", err));
        DUET_TRY(require_enum(m->role, "state_dump.role", err));
        DUET_TRY(check_load(m->load, "state_dump", lim, err));
        DUET_TRY(check_count(m->n_requests, 0, lim->max_requests, "state_dump.requests", err));
        for (size_t i = 0; i < m->n_requests; i++) {
            snprintf(f, sizeof f, "state_dump.requests[%zu]", i);
            DUET_TRY(require(m->requests[i], f, err));
            snprintf(f, sizeof f, "state_dump.requests[%zu].rid", i);
            DUET_TRY(check_id(m->requests[i]->rid, f, 1, err));
            snprintf(f, sizeof f, "state_dump.requests[%zu].state", i);
            DUET_TRY(require_enum(m->requests[i]->state, f, err));
        }
        return DUET_OK;
    }
    case DUET__V1__ENVELOPE__BODY__NOT_SET:
        break;
    default:
        break;
    }
    FAIL(DUET_ERR_PROTOCOL, "envelope.body: no body this version knows (body field %d)", (int)e->body_case);
}

/* Messages about one request carry its rid. */
static int kind_needs_rid(duet_msg_kind_t k)
{
    switch (k) {
    case DUET__V1__ENVELOPE__BODY_RESERVE:
    case DUET__V1__ENVELOPE__BODY_RESERVED:
    case DUET__V1__ENVELOPE__BODY_PREFILL:
    case DUET__V1__ENVELOPE__BODY_TRANSFER_DONE:
    case DUET__V1__ENVELOPE__BODY_ABORT:
    case DUET__V1__ENVELOPE__BODY_ABORT_ACK:
    case DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK:
    case DUET__V1__ENVELOPE__BODY_REQUEST_FINISHED:
        return 1;
    default:
        return 0;
    }
}

duet_status_t duet_msg_validate(const duet_envelope_t *e, const duet_msg_limits_t *lim, duet_err_t *err)
{
    duet_msg_limits_t tmp;
    path_t p = {{0}, 0};

    lim = limits_or_default(lim, &tmp);
    if (!e)
        FAIL(DUET_ERR_INVALID, "envelope: NULL");
    if (!e->header)
        FAIL(DUET_ERR_VERSION, "header: missing (a message without a header has no version)");
    if (e->header->version != DUET_PROTOCOL_VERSION)
        FAIL(DUET_ERR_VERSION, "header.version: %u, this process speaks version %d", e->header->version,
             DUET_PROTOCOL_VERSION);
    DUET_TRY(check_id(e->header->sender_id, "header.sender_id", 1, err));
    DUET_TRY(check_id(e->header->rid, "header.rid", kind_needs_rid(e->body_case), err));
    DUET_TRY(check_enums(&e->base, &p, err));
    return check_body(e, lim, err);
}

/* ------------------------------------------------------------------ codec */

/* Allocator for unpacking: plain malloc/free (so that decoded and built
 * envelopes free alike), with a budget so that a small message cannot make
 * the decoder allocate without bound (a packed field of one-byte varints,
 * or thousands of empty sub-messages, expand many times over). */
typedef struct {
    size_t used, cap;
    int over;
} budget_t;

static void *budget_alloc(void *data, size_t size)
{
    budget_t *b = data;
    if (size > b->cap - b->used) {
        b->over = 1;
        return NULL;
    }
    void *p = malloc(size ? size : 1);
    if (p)
        b->used += size;
    return p;
}

static void budget_free(void *data, void *p)
{
    (void)data;
    free(p);
}

duet_status_t duet_msg_decode(const void *buf, size_t len, const duet_msg_limits_t *lim, duet_envelope_t **out,
                              duet_err_t *err)
{
    duet_msg_limits_t tmp;
    budget_t b = {0, 0, 0};

    lim = limits_or_default(lim, &tmp);
    if (!buf && len)
        FAIL(DUET_ERR_INVALID, "message: NULL buffer of %zu bytes", len);
    if (len > lim->max_message_bytes)
        FAIL(DUET_ERR_RANGE, "message: %zu bytes, at most %zu allowed", len, lim->max_message_bytes);
    b.cap = lim->max_decoded_bytes;
    ProtobufCAllocator a = {budget_alloc, budget_free, &b};
    ProtobufCMessage *m = protobuf_c_message_unpack(&duet__v1__envelope__descriptor, &a, len,
                                                    len ? (const uint8_t *)buf : (const uint8_t *)"");
    if (!m) {
        if (b.over)
            FAIL(DUET_ERR_RANGE, "message: %zu bytes would decode into more than %zu bytes of memory", len,
                 lim->max_decoded_bytes);
        FAIL(DUET_ERR_PARSE, "message: %zu bytes are not a duet.v1.Envelope", len);
    }
    duet_envelope_t *e = (duet_envelope_t *)m;
    duet_status_t st = duet_msg_validate(e, lim, err);
    if (st) {
        duet_envelope_free(&e);
        return st;
    }
    *out = e;
    return DUET_OK;
}

duet_status_t duet_msg_encoded_size(const duet_envelope_t *e, const duet_msg_limits_t *lim, size_t *size,
                                    duet_err_t *err)
{
    duet_msg_limits_t tmp;
    lim = limits_or_default(lim, &tmp);
    DUET_TRY(duet_msg_validate(e, lim, err));
    size_t n = protobuf_c_message_get_packed_size(&e->base);
    if (n > lim->max_message_bytes)
        FAIL(DUET_ERR_RANGE, "%s message: %zu bytes, at most %zu allowed", duet_msg_kind_name(e->body_case), n,
             lim->max_message_bytes);
    *size = n;
    return DUET_OK;
}

size_t duet_msg_pack(const duet_envelope_t *e, uint8_t *buf)
{
    return protobuf_c_message_pack(&e->base, buf);
}

duet_status_t duet_msg_encode(const duet_envelope_t *e, const duet_msg_limits_t *lim, uint8_t **buf, size_t *len,
                              duet_err_t *err)
{
    size_t n = 0;
    DUET_TRY(duet_msg_encoded_size(e, lim, &n, err));
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        FAIL(DUET_ERR_NOMEM, "%s message: cannot allocate %zu bytes", duet_msg_kind_name(e->body_case), n);
    duet_msg_pack(e, b);
    *buf = b;
    *len = n;
    return DUET_OK;
}

void duet_envelope_free(duet_envelope_t **e)
{
    if (!e || !*e)
        return;
    protobuf_c_message_free_unpacked(&(*e)->base, NULL);
    *e = NULL;
}

/* ------------------------------------------------------------------ builders */

void *duet_msg_alloc(const ProtobufCMessageDescriptor *desc)
{
    void *m = duet_calloc(1, desc->sizeof_message);
    if (m)
        protobuf_c_message_init(desc, m);
    return m;
}

void duet_msg_free(ProtobufCMessage *m)
{
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
}

void *duet_msg_dup(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *copy = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
    free(buf);
    return copy;
}

duet_status_t duet_msg_set_str(char **field, const char *s)
{
    char *copy = duet_strdup(s ? s : "");
    if (!copy)
        return DUET_ERR_NOMEM;
    if (*field && *field != protobuf_c_empty_string)
        free(*field);
    *field = copy;
    return DUET_OK;
}

duet_status_t duet_msg_set_bytes(ProtobufCBinaryData *field, const void *data, size_t len)
{
    uint8_t *copy = NULL;
    if (len) {
        if (!(copy = malloc(len)))
            return DUET_ERR_NOMEM;
        memcpy(copy, data, len);
    }
    free(field->data);
    field->data = copy;
    field->len = len;
    return DUET_OK;
}

static duet_status_t set_array(void **field, size_t *n_field, const void *src, size_t n, size_t elem)
{
    void *copy = NULL;
    if (n) {
        if (!(copy = duet_malloc_array(n, elem)))
            return DUET_ERR_NOMEM;
        if (src)
            memcpy(copy, src, n * elem);
        else
            memset(copy, 0, n * elem);
    }
    free(*field);
    *field = copy;
    *n_field = n;
    return DUET_OK;
}

duet_status_t duet_msg_set_i32s(int32_t **field, size_t *n_field, const int32_t *src, size_t n)
{
    void *p = *field;
    duet_status_t st = set_array(&p, n_field, src, n, sizeof(int32_t));
    *field = p;
    return st;
}

duet_status_t duet_msg_set_u32s(uint32_t **field, size_t *n_field, const uint32_t *src, size_t n)
{
    void *p = *field;
    duet_status_t st = set_array(&p, n_field, src, n, sizeof(uint32_t));
    *field = p;
    return st;
}

/* Append a new element of type `desc` to a repeated message field. */
static void *append_sub(void ***arr, size_t *n, const ProtobufCMessageDescriptor *desc)
{
    void **grown = realloc(*arr, (*n + 1) * sizeof(void *));
    if (!grown)
        return NULL;
    *arr = grown;
    void *m = duet_msg_alloc(desc);
    if (!m)
        return NULL;
    grown[(*n)++] = m;
    return m;
}

duet_status_t duet_msg_create(duet_msg_kind_t kind, const duet_msg_origin_t *o, duet_envelope_t **out)
{
    const ProtobufCFieldDescriptor *fd =
        kind == DUET__V1__ENVELOPE__BODY__NOT_SET
            ? NULL
            : protobuf_c_message_descriptor_get_field(&duet__v1__envelope__descriptor, (unsigned)kind);
    if (!fd || !(fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || !o || !o->sender_id)
        return DUET_ERR_INVALID;

    duet_envelope_t *e = duet_msg_alloc(&duet__v1__envelope__descriptor);
    if (!e)
        return DUET_ERR_NOMEM;
    if (!(e->header = duet_msg_alloc(&duet__v1__header__descriptor)))
        goto err_free;
    e->header->version = DUET_PROTOCOL_VERSION;
    e->header->epoch = o->epoch;
    e->header->send_time_us = duet_wall_us();
    if (duet_msg_set_str(&e->header->sender_id, o->sender_id) ||
        (o->rid && o->rid[0] && duet_msg_set_str(&e->header->rid, o->rid)))
        goto err_free;
    void *body = duet_msg_alloc(fd->descriptor);
    if (!body)
        goto err_free;
    *(void **)(void *)((char *)e + fd->offset) = body;
    e->body_case = kind;
    *out = e;
    return DUET_OK;
err_free:
    duet_envelope_free(&e);
    return DUET_ERR_NOMEM;
}

/* Create, then run `fill`; on failure free and return its status. */
#define BUILD(kind, o, out, fill)                                                                  \
    do {                                                                                           \
        duet_envelope_t *e_ = NULL;                                                                \
        duet_status_t st_ = duet_msg_create((kind), (o), &e_);                                     \
        if (st_)                                                                                   \
            return st_;                                                                            \
        duet_envelope_t *e = e_;                                                                   \
        st_ = (fill);                                                                              \
        if (st_) {                                                                                 \
            duet_envelope_free(&e_);                                                               \
            return st_;                                                                            \
        }                                                                                          \
        *(out) = e_;                                                                               \
        return DUET_OK;                                                                            \
    } while (0)

static duet_status_t alloc_into(void **slot, const ProtobufCMessageDescriptor *desc)
{
    return (*slot = duet_msg_alloc(desc)) ? DUET_OK : DUET_ERR_NOMEM;
}

#define ALLOC_SUB(field, desc) alloc_into((void **)(void *)&(field), (desc))

duet_status_t duet_msg_new_error(const duet_msg_origin_t *o, duet_status_t code, const char *message,
                                 duet_envelope_t **out)
{
    if (code >= 0)
        return DUET_ERR_INVALID;
    BUILD(DUET__V1__ENVELOPE__BODY_ERROR, o, out,
          (e->error->code = duet_msg_error_code(code), duet_msg_set_str(&e->error->message, message)));
}

duet_status_t duet_msg_new_ack(const duet_msg_origin_t *o, duet_envelope_t **out)
{
    return duet_msg_create(DUET__V1__ENVELOPE__BODY_ACK, o, out);
}

static duet_status_t set_opt_str(char **field, const char *s) { return s && *s ? duet_msg_set_str(field, s) : DUET_OK; }

static duet_status_t fill_reserve(Duet__V1__Reserve *r, const char *event_url)
{
    DUET_TRY(ALLOC_SUB(r->sampling, &duet__v1__sampling_params__descriptor));
    return set_opt_str(&r->event_url, event_url);
}

duet_status_t duet_msg_new_reserve(const duet_msg_origin_t *o, uint32_t prompt_len, uint32_t max_new_tokens,
                                   uint32_t deadline_ms, const char *event_url, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_RESERVE, o, out,
          (e->reserve->prompt_len = prompt_len, e->reserve->max_new_tokens = max_new_tokens,
           e->reserve->deadline_ms = deadline_ms,
           fill_reserve(e->reserve, event_url)));
}

static duet_status_t fill_descriptor(Duet__V1__TransferDescriptor **slot, uint64_t epoch, const char *worker_id,
                                     const void *addr, size_t addr_len, uint32_t page_tokens, uint32_t slot_id)
{
    DUET_TRY(ALLOC_SUB(*slot, &duet__v1__transfer_descriptor__descriptor));
    Duet__V1__TransferDescriptor *d = *slot;
    d->epoch = epoch;
    d->page_tokens = page_tokens;
    d->slot = slot_id;
    DUET_TRY(duet_msg_set_str(&d->decode_worker_id, worker_id));
    return addr_len ? duet_msg_set_bytes(&d->ucx_address, addr, addr_len) : DUET_OK;
}

duet_status_t duet_msg_new_reserved(const duet_msg_origin_t *o, const char *decode_worker_id,
                                    const void *ucx_address, size_t ucx_address_len, uint32_t page_tokens,
                                    uint32_t slot, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_RESERVED, o, out,
          fill_descriptor(&e->reserved->descriptor, o->epoch, decode_worker_id, ucx_address, ucx_address_len,
                          page_tokens, slot));
}

duet_status_t duet_msg_new_rejected(const duet_msg_origin_t *o, Duet__V1__RejectReason reason,
                                    const char *message, uint32_t retry_after_ms, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_REJECTED, o, out,
          (e->rejected->reason = reason, e->rejected->retry_after_ms = retry_after_ms,
           duet_msg_set_str(&e->rejected->message, message)));
}

static duet_status_t fill_prefill(Duet__V1__Prefill *p, uint64_t epoch, const int32_t *tokens, size_t n,
                                  const Duet__V1__TransferDescriptor *descriptor, uint32_t deadline_ms,
                                  const char *event_url)
{
    p->deadline_ms = deadline_ms;
    DUET_TRY(set_opt_str(&p->event_url, event_url));
    DUET_TRY(duet_msg_set_i32s(&p->tokens, &p->n_tokens, tokens, n));
    DUET_TRY(ALLOC_SUB(p->sampling, &duet__v1__sampling_params__descriptor));
    if (descriptor)
        return (p->descriptor = duet_msg_dup(&descriptor->base)) ? DUET_OK : DUET_ERR_NOMEM;
    DUET_TRY(ALLOC_SUB(p->descriptor, &duet__v1__transfer_descriptor__descriptor));
    p->descriptor->epoch = epoch;
    return DUET_OK;
}

duet_status_t duet_msg_new_prefill(const duet_msg_origin_t *o, const int32_t *tokens, size_t n_tokens,
                                   const Duet__V1__TransferDescriptor *descriptor, uint32_t deadline_ms,
                                   const char *event_url, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_PREFILL, o, out,
          fill_prefill(e->prefill, o->epoch, tokens, n_tokens, descriptor, deadline_ms, event_url));
}

static duet_status_t fill_checksums(Duet__V1__TransferDone *t, size_t n)
{
    if (!n)
        return DUET_OK;
    DUET_TRY(ALLOC_SUB(t->checksums, &duet__v1__page_checksums__descriptor));
    Duet__V1__PageChecksums *c = t->checksums;
    if (!(c->pool = duet_calloc(n, sizeof *c->pool)) || !(c->layer = duet_calloc(n, sizeof *c->layer)) ||
        !(c->page = duet_calloc(n, sizeof *c->page)) || !(c->hash = duet_calloc(n, sizeof *c->hash)))
        return DUET_ERR_NOMEM; /* the caller frees what was allocated (counts stay 0 until here: fine) */
    c->n_pool = c->n_layer = c->n_page = c->n_hash = n;
    return DUET_OK;
}

duet_status_t duet_msg_new_transfer_done(const duet_msg_origin_t *o, int32_t first_token, uint32_t n_tokens,
                                         size_t n_checksums, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_TRANSFER_DONE, o, out,
          (e->transfer_done->first_token = first_token, e->transfer_done->n_tokens = n_tokens,
           fill_checksums(e->transfer_done, n_checksums)));
}

duet_status_t duet_msg_new_abort(const duet_msg_origin_t *o, Duet__V1__AbortReason reason, int prefill_quiesced,
                                 const char *message, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_ABORT, o, out,
          (e->abort->reason = reason, e->abort->prefill_quiesced = prefill_quiesced != 0,
           duet_msg_set_str(&e->abort->message, message)));
}

duet_status_t duet_msg_new_abort_ack(const duet_msg_origin_t *o, int known, Duet__V1__RequestState state,
                                     int transfer_started, uint32_t pages_quarantined, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_ABORT_ACK, o, out,
          (e->abort_ack->known = known != 0, e->abort_ack->state = state,
           e->abort_ack->transfer_started = transfer_started != 0,
           e->abort_ack->pages_quarantined = pages_quarantined, DUET_OK));
}

duet_status_t duet_msg_new_token_chunk(const duet_msg_origin_t *o, uint32_t first_index, const int32_t *tokens,
                                       size_t n_tokens, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK, o, out,
          (e->token_chunk->first_index = first_index,
           duet_msg_set_i32s(&e->token_chunk->tokens, &e->token_chunk->n_tokens, tokens, n_tokens)));
}

duet_status_t duet_msg_new_request_finished(const duet_msg_origin_t *o, Duet__V1__FinishReason reason,
                                            uint32_t prompt_tokens, uint32_t completion_tokens,
                                            duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_REQUEST_FINISHED, o, out,
          (e->request_finished->reason = reason, e->request_finished->prompt_tokens = prompt_tokens,
           e->request_finished->completion_tokens = completion_tokens, DUET_OK));
}

static uint64_t g_incarnation;
static pthread_once_t g_incarnation_once = PTHREAD_ONCE_INIT;

static void incarnation_init(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v || !v)
        v = duet_wall_us() ^ ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)&v;
    g_incarnation = v ? v : 1;
}

uint64_t duet_msg_incarnation(void)
{
    pthread_once(&g_incarnation_once, incarnation_init);
    return g_incarnation;
}

duet_status_t duet_msg_new_heartbeat(const duet_msg_origin_t *o, Duet__V1__Role role, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_HEARTBEAT, o, out,
          (e->heartbeat->role = role, e->heartbeat->incarnation = duet_msg_incarnation(),
           ALLOC_SUB(e->heartbeat->load, &duet__v1__load__descriptor)));
}

static duet_status_t fill_register(Duet__V1__WorkerRegister *w, Duet__V1__Role role, const char *worker_id,
                                   const char *control_url, const char *event_url, uint32_t pages, uint32_t slots,
                                   uint32_t page_tokens)
{
    w->role = role;
    DUET_TRY(duet_msg_set_str(&w->worker_id, worker_id));
    DUET_TRY(duet_msg_set_str(&w->control_url, control_url));
    DUET_TRY(duet_msg_set_str(&w->event_url, event_url));
    DUET_TRY(ALLOC_SUB(w->capacity, &duet__v1__capacity__descriptor));
    w->capacity->pages = pages;
    w->capacity->slots = slots;
    w->capacity->page_tokens = page_tokens;
    return DUET_OK;
}

duet_status_t duet_msg_new_worker_register(const duet_msg_origin_t *o, Duet__V1__Role role,
                                           const char *worker_id, const char *control_url,
                                           const char *event_url, uint32_t pages, uint32_t slots,
                                           uint32_t page_tokens, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_WORKER_REGISTER, o, out,
          fill_register(e->worker_register, role, worker_id, control_url, event_url, pages, slots, page_tokens));
}

duet_status_t duet_msg_new_state_dump_request(const duet_msg_origin_t *o, int include_requests,
                                              duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST, o, out,
          (e->state_dump_request->include_requests = include_requests != 0, DUET_OK));
}

duet_status_t duet_msg_new_state_dump(const duet_msg_origin_t *o, Duet__V1__Role role, duet_envelope_t **out)
{
    BUILD(DUET__V1__ENVELOPE__BODY_STATE_DUMP, o, out,
          (e->state_dump->role = role, e->state_dump->incarnation = duet_msg_incarnation(),
           ALLOC_SUB(e->state_dump->load, &duet__v1__load__descriptor)));
}

duet_status_t duet_msg_descriptor_add_pool(Duet__V1__TransferDescriptor *d, const duet_cache_layout_t *layout,
                                           const void *rkey, size_t rkey_len, uint64_t remote_base,
                                           uint32_t n_units)
{
    Duet__V1__PoolDescriptor *p =
        append_sub((void ***)(void *)&d->pools, &d->n_pools, &duet__v1__pool_descriptor__descriptor);
    if (!p)
        return DUET_ERR_NOMEM;
    p->kind = duet_msg_pool_to_wire(layout->kind);
    p->fingerprint = layout->fingerprint;
    p->page_bytes = layout->page_bytes;
    p->n_layers = layout->n_layers;
    p->n_units = n_units;
    p->remote_base = remote_base;
    return duet_msg_set_bytes(&p->rkey, rkey, rkey_len);
}

const Duet__V1__PoolDescriptor *duet_msg_descriptor_pool(const Duet__V1__TransferDescriptor *d,
                                                         duet_pool_kind_t kind)
{
    Duet__V1__PoolKind w = duet_msg_pool_to_wire(kind);
    for (size_t i = 0; d && i < d->n_pools; i++)
        if (d->pools[i] && d->pools[i]->kind == w)
            return d->pools[i];
    return NULL;
}

duet_status_t duet_msg_descriptor_check_layouts(const Duet__V1__TransferDescriptor *d,
                                                const duet_cache_layout_t *layouts, size_t n, duet_err_t *err)
{
    uint32_t local = 0;
    for (size_t i = 0; i < n; i++) {
        const duet_cache_layout_t *l = &layouts[i];
        if (l->n_layers == 0)
            continue;
        local |= 1u << duet_msg_pool_to_wire(l->kind);
        const Duet__V1__PoolDescriptor *p = duet_msg_descriptor_pool(d, l->kind);
        if (!p)
            FAIL(DUET_ERR_LAYOUT_MISMATCH, "descriptor: no %s pool", duet_pool_kind_name(l->kind));
        if (p->fingerprint != l->fingerprint || p->page_bytes != l->page_bytes || p->n_layers != l->n_layers)
            FAIL(DUET_ERR_LAYOUT_MISMATCH,
                 "descriptor: %s pool is fingerprint %016llx, %llu B x %u layers; here %016llx, %llu B x %u layers",
                 duet_pool_kind_name(l->kind), (unsigned long long)p->fingerprint,
                 (unsigned long long)p->page_bytes, p->n_layers, (unsigned long long)l->fingerprint,
                 (unsigned long long)l->page_bytes, l->n_layers);
    }
    for (size_t i = 0; i < d->n_pools; i++) {
        duet_pool_kind_t k;
        if (!d->pools[i] || duet_msg_pool_from_wire(d->pools[i]->kind, &k) != DUET_OK)
            FAIL(DUET_ERR_PROTOCOL, "descriptor.pools[%zu]: no valid pool kind", i);
        if (!(local & (1u << d->pools[i]->kind)))
            FAIL(DUET_ERR_LAYOUT_MISMATCH, "descriptor: %s pool does not exist here", duet_pool_kind_name(k));
    }
    return DUET_OK;
}

duet_status_t duet_msg_capacity_add_pool(Duet__V1__Capacity *c, const duet_cache_layout_t *layout, uint32_t n_units)
{
    Duet__V1__PoolLayout *p = append_sub((void ***)(void *)&c->pools, &c->n_pools, &duet__v1__pool_layout__descriptor);
    if (!p)
        return DUET_ERR_NOMEM;
    p->kind = duet_msg_pool_to_wire(layout->kind);
    p->dtype = duet_msg_dtype_to_wire(layout->dtype);
    p->fingerprint = layout->fingerprint;
    p->page_bytes = layout->page_bytes;
    p->n_layers = layout->n_layers;
    p->n_units = n_units;
    return DUET_OK;
}

duet_status_t duet_msg_load_add_state(Duet__V1__Load *l, Duet__V1__RequestState state, uint32_t count)
{
    Duet__V1__StateCount *s =
        append_sub((void ***)(void *)&l->requests, &l->n_requests, &duet__v1__state_count__descriptor);
    if (!s)
        return DUET_ERR_NOMEM;
    s->state = state;
    s->count = count;
    return DUET_OK;
}

duet_status_t duet_msg_state_dump_add_request(Duet__V1__StateDump *sd, const char *rid, uint64_t epoch,
                                              Duet__V1__RequestState state, uint64_t age_ms, uint32_t n_pages)
{
    Duet__V1__RequestSummary *r =
        append_sub((void ***)(void *)&sd->requests, &sd->n_requests, &duet__v1__request_summary__descriptor);
    if (!r)
        return DUET_ERR_NOMEM;
    r->epoch = epoch;
    r->state = state;
    r->age_ms = age_ms;
    r->n_pages = n_pages;
    return duet_msg_set_str(&r->rid, rid);
}
