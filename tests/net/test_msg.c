/* Control-plane messages: round trip of every body kind, and every class of
 * malformed input (garbage, truncation, bit flips, oversized, wrong version,
 * missing header, out-of-range fields) giving its typed status with a
 * sentence that names the field. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cache_layout.h"
#include "msg.h"
#include "msg_samples.h"
#include "msg_xfer.h"
#include "../cache_fixture.h"

/* Decode must fail with one of the statuses a peer may send back, and say why. */
static int is_decode_status(duet_status_t st)
{
    return st == DUET_ERR_PARSE || st == DUET_ERR_VERSION || st == DUET_ERR_PROTOCOL || st == DUET_ERR_RANGE;
}

static duet_status_t decode_bytes(const uint8_t *buf, size_t len, const duet_msg_limits_t *lim, duet_err_t *err)
{
    duet_envelope_t *e = NULL;
    /* exact-size copy so that valgrind sees any read past the end */
    uint8_t *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    if (len)
        memcpy(copy, buf, len);
    duet_status_t st = duet_msg_decode(copy, len, lim, &e, err);
    free(copy);
    if (st == DUET_OK) {
        assert_non_null(e);
        duet_envelope_free(&e);
    } else {
        assert_null(e);
        assert_int_equal(err->status, st);
        assert_true(err->msg[0] != '\0');
    }
    return st;
}

static void test_status_table(void **state)
{
    (void)state;
    for (int v = -1; v >= DUET_STATUS_MIN; v--) {
        duet_status_t st = (duet_status_t)v;
        Duet__V1__ErrorCode c = duet_msg_error_code(st);
        char want[64];
        snprintf(want, sizeof want, "ERROR_CODE_%s", duet_status_code(st));
        assert_string_equal(duet_msg_enum_name(&duet__v1__error_code__descriptor, (int)c), want);
        assert_int_equal(duet_msg_error_status(c), st);
    }
    assert_int_equal(duet_msg_error_code(DUET_OK), DUET__V1__ERROR_CODE__ERROR_CODE_UNSPECIFIED);
    assert_int_equal(duet_msg_error_code((duet_status_t)-999), DUET__V1__ERROR_CODE__ERROR_CODE_INTERNAL);
    assert_int_equal(duet_msg_error_status(DUET__V1__ERROR_CODE__ERROR_CODE_UNSPECIFIED), DUET_ERR_PROTOCOL);
    assert_int_equal(duet_msg_error_status((Duet__V1__ErrorCode)77), DUET_ERR_PROTOCOL);

    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        duet_pool_kind_t back;
        Duet__V1__PoolKind w = duet_msg_pool_to_wire((duet_pool_kind_t)k);
        char want[64];
        snprintf(want, sizeof want, "POOL_%s", duet_pool_kind_name((duet_pool_kind_t)k));
        assert_int_equal(strcasecmp(duet_msg_enum_name(&duet__v1__pool_kind__descriptor, (int)w), want), 0);
        assert_int_equal(duet_msg_pool_from_wire(w, &back), DUET_OK);
        assert_int_equal(back, k);
    }
    duet_pool_kind_t back;
    assert_int_equal(duet_msg_pool_from_wire(DUET__V1__POOL_KIND__POOL_KIND_UNSPECIFIED, &back), DUET_ERR_PROTOCOL);
    assert_int_equal(duet_msg_pool_from_wire((Duet__V1__PoolKind)7, &back), DUET_ERR_PROTOCOL);
}

/* Every body kind the envelope declares has a sample, and every sample
 * survives encode -> decode -> encode byte for byte. */
static void test_roundtrip_every_kind(void **state)
{
    (void)state;
    const ProtobufCMessageDescriptor *d = &duet__v1__envelope__descriptor;
    int n_oneof = 0;
    for (unsigned f = 0; f < d->n_fields; f++)
        if (d->fields[f].flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            n_oneof++;
    assert_int_equal(n_oneof, n_sample_kinds);

    for (int i = 0; i < n_sample_kinds; i++) {
        duet_err_t err = {0};
        uint8_t *buf = NULL, *buf2 = NULL;
        size_t len = 0, len2 = 0;
        duet_envelope_t *e = sample_msg(sample_kinds[i]), *back = NULL;
        assert_non_null(e);
        duet_status_t st = duet_msg_encode(e, NULL, &buf, &len, &err);
        if (st)
            fail_msg("%s: %s", duet_msg_kind_name(sample_kinds[i]), duet_err_text(&err));
        assert_int_equal(duet_msg_decode(buf, len, NULL, &back, &err), DUET_OK);
        assert_int_equal(duet_msg_kind(back), sample_kinds[i]);
        assert_int_equal(back->header->version, DUET_PROTOCOL_VERSION);
        assert_string_equal(back->header->sender_id, e->header->sender_id);
        assert_string_equal(back->header->rid, e->header->rid);
        assert_int_equal(back->header->epoch, e->header->epoch);
        assert_int_equal(duet_msg_encode(back, NULL, &buf2, &len2, &err), DUET_OK);
        assert_int_equal(len, len2);
        assert_memory_equal(buf, buf2, len);
        /* the name is the oneof field's name */
        assert_string_not_equal(duet_msg_kind_name(sample_kinds[i]), "unknown");
        free(buf);
        free(buf2);
        duet_envelope_free(&back);
        duet_envelope_free(&e);
    }
    assert_string_equal(duet_msg_kind_name(DUET__V1__ENVELOPE__BODY_PREFILL), "prefill");
    assert_string_equal(duet_msg_kind_name(DUET__V1__ENVELOPE__BODY__NOT_SET), "none");
}

/* Field-level checks after a round trip, for the messages with most structure. */
static void test_roundtrip_fields(void **state)
{
    (void)state;
    duet_err_t err = {0};
    uint8_t *buf;
    size_t len;
    duet_envelope_t *e = sample_msg(DUET__V1__ENVELOPE__BODY_PREFILL), *b = NULL;
    assert_int_equal(duet_msg_encode(e, NULL, &buf, &len, &err), DUET_OK);
    assert_int_equal(duet_msg_decode(buf, len, NULL, &b, &err), DUET_OK);
    free(buf);
    const Duet__V1__Prefill *p = b->prefill;
    assert_int_equal(p->n_tokens, 6);
    assert_int_equal(p->tokens[5], 128000);
    assert_int_equal(p->deadline_ms, 60000);
    assert_string_equal(p->event_url, SAMPLE_EVENT_URL);
    assert_true(fabsf(p->sampling->temperature - 0.7f) == 0.0f);
    assert_int_equal(p->sampling->top_k, 40);
    assert_int_equal(p->sampling->seed, 0x1234567890abcdefull);
    assert_int_equal(p->sampling->n_stop_token_ids, 2);
    assert_int_equal(p->sampling->stop_token_ids[1], 128799);
    assert_true(p->sampling->ignore_eos);
    const Duet__V1__TransferDescriptor *d = p->descriptor;
    assert_string_equal(d->decode_worker_id, "decode-0");
    assert_int_equal(d->ucx_address.len, 10);
    assert_int_equal(d->page_tokens, 256);
    assert_int_equal(d->n_pools, DUET_POOL_COUNT);
    assert_int_equal(d->n_page_ids, 4);
    assert_int_equal(d->page_ids[3], 9);
    assert_int_equal(d->slot, 2);
    assert_int_equal(d->epoch, SAMPLE_EPOCH);
    const Duet__V1__PoolDescriptor *pool = duet_msg_descriptor_pool(d, DUET_POOL_C128_KV);
    assert_non_null(pool);
    assert_int_equal(pool->n_layers, 20);
    assert_int_equal(pool->rkey.len, 8);
    assert_int_equal(pool->rkey.data[0], 0xde);
    assert_int_equal(pool->remote_base, 0x7f0000000000ull + (2ull << 36));
    duet_envelope_free(&b);
    duet_envelope_free(&e);

    e = sample_msg(DUET__V1__ENVELOPE__BODY_TRANSFER_DONE);
    assert_int_equal(duet_msg_encode(e, NULL, &buf, &len, &err), DUET_OK);
    assert_int_equal(duet_msg_decode(buf, len, NULL, &b, &err), DUET_OK);
    free(buf);
    assert_int_equal(b->transfer_done->first_token, 4242);
    assert_int_equal(b->transfer_done->checksums->n_hash, 5);
    assert_int_equal(b->transfer_done->checksums->hash[4], 0xfedcba9876543210ull ^ 4);
    assert_int_equal(b->transfer_done->checksums->pool[1], DUET__V1__POOL_KIND__POOL_C4_INDEX_K);
    duet_envelope_free(&b);
    duet_envelope_free(&e);

    /* an Error carries its typed code */
    e = sample_msg(DUET__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(duet_msg_error_status(e->error->code), DUET_ERR_LAYOUT_MISMATCH);
    duet_envelope_free(&e);

    /* the send time comes from the wall clock */
    duet_msg_origin_t o = {"x", NULL, 0};
    assert_int_equal(duet_msg_new_ack(&o, &e), DUET_OK);
    assert_true(e->header->send_time_us > 1600000000000000ull);
    assert_null(duet_msg_rid(e));
    duet_envelope_free(&e);
}

static void test_builder_misuse(void **state)
{
    (void)state;
    duet_envelope_t *e = NULL;
    duet_msg_origin_t o = {"x", NULL, 0};
    duet_msg_origin_t nobody = {NULL, NULL, 0};
    assert_int_equal(duet_msg_create(DUET__V1__ENVELOPE__BODY__NOT_SET, &o, &e), DUET_ERR_INVALID);
    assert_int_equal(duet_msg_create((duet_msg_kind_t)1, &o, &e), DUET_ERR_INVALID); /* the header field */
    assert_int_equal(duet_msg_create((duet_msg_kind_t)99, &o, &e), DUET_ERR_INVALID);
    assert_int_equal(duet_msg_create(DUET__V1__ENVELOPE__BODY_ACK, &nobody, &e), DUET_ERR_INVALID);
    assert_int_equal(duet_msg_new_error(&o, DUET_OK, "no", &e), DUET_ERR_INVALID);
    assert_null(e);
    duet_envelope_free(&e); /* NULL is fine */
    duet_envelope_free(NULL);

    /* an invalid message is refused at encode with the status decode would give */
    uint8_t *buf = NULL;
    size_t len = 0;
    duet_err_t err = {0};
    assert_int_equal(duet_msg_new_reserve(&o, 0, 1, 1, NULL, &e), DUET_OK);
    assert_string_equal(e->reserve->event_url, ""); /* NULL: empty, the worker's own --events */
    assert_int_equal(duet_msg_encode(e, NULL, &buf, &len, &err), DUET_ERR_PROTOCOL); /* no rid */
    assert_non_null(strstr(err.msg, "header.rid"));
    assert_null(buf);
    duet_envelope_free(&e);
}

static void test_garbage(void **state)
{
    (void)state;
    duet_err_t err = {0};
    uint8_t junk[64];
    memset(junk, 0xff, sizeof junk);
    assert_int_equal(decode_bytes(junk, sizeof junk, NULL, &err), DUET_ERR_PARSE);
    assert_non_null(strstr(err.msg, "not a duet.v1.Envelope"));
    static const uint8_t text[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_true(is_decode_status(decode_bytes(text, sizeof text - 1, NULL, &err)));
    /* an empty buffer is an envelope without a header */
    assert_int_equal(decode_bytes(junk, 0, NULL, &err), DUET_ERR_VERSION);

    /* random buffers, seeded: never OK by accident, never a crash */
    uint64_t x = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 20000; i++) {
        size_t len = (size_t)(i % 200);
        uint8_t buf[200];
        for (size_t j = 0; j < len; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[j] = (uint8_t)x;
        }
        duet_status_t st = decode_bytes(buf, len, NULL, &err);
        assert_true(st == DUET_OK || is_decode_status(st));
    }
}

/* Every proper prefix of every valid message fails with a typed status. */
static void test_truncated(void **state)
{
    (void)state;
    for (int i = 0; i < n_sample_kinds; i++) {
        duet_err_t err = {0};
        uint8_t *buf;
        size_t len;
        duet_envelope_t *e = sample_msg(sample_kinds[i]);
        assert_int_equal(duet_msg_encode(e, NULL, &buf, &len, &err), DUET_OK);
        for (size_t cut = 0; cut < len; cut++) {
            duet_status_t st = decode_bytes(buf, cut, NULL, &err);
            if (st == DUET_OK)
                fail_msg("%s cut at %zu of %zu decoded", duet_msg_kind_name(sample_kinds[i]), cut, len);
            assert_true(st == DUET_ERR_PARSE || st == DUET_ERR_VERSION || st == DUET_ERR_PROTOCOL);
        }
        assert_int_equal(decode_bytes(buf, len, NULL, &err), DUET_OK);
        free(buf);
        duet_envelope_free(&e);
    }
}

/* Every single-bit flip of every valid message decodes or fails typed. */
static void test_bit_flips(void **state)
{
    (void)state;
    for (int i = 0; i < n_sample_kinds; i++) {
        duet_err_t err = {0};
        uint8_t *buf;
        size_t len;
        duet_envelope_t *e = sample_msg(sample_kinds[i]);
        assert_int_equal(duet_msg_encode(e, NULL, &buf, &len, &err), DUET_OK);
        for (size_t bit = 0; bit < len * 8; bit++) {
            buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            duet_status_t st = decode_bytes(buf, len, NULL, &err);
            assert_true(st == DUET_OK || is_decode_status(st));
            buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        free(buf);
        duet_envelope_free(&e);
    }
}

static void test_oversized(void **state)
{
    (void)state;
    duet_err_t err = {0};
    duet_msg_limits_t lim;
    duet_msg_limits_default(&lim);
    assert_int_equal(lim.max_message_bytes, 64u << 20);

    /* over the default limit: refused before unpacking (the bytes are never read) */
    size_t big = ((size_t)64 << 20) + 1;
    uint8_t *buf = malloc(big);
    assert_non_null(buf);
    buf[0] = 0xff;
    duet_envelope_t *e = NULL;
    assert_int_equal(duet_msg_decode(buf, big, NULL, &e, &err), DUET_ERR_RANGE);
    assert_non_null(strstr(err.msg, "67108865 bytes"));
    assert_null(e);
    free(buf);

    /* a configured limit */
    uint8_t *enc;
    size_t len;
    e = sample_msg(DUET__V1__ENVELOPE__BODY_PREFILL);
    assert_int_equal(duet_msg_encode(e, NULL, &enc, &len, &err), DUET_OK);
    lim.max_message_bytes = len - 1;
    assert_int_equal(decode_bytes(enc, len, &lim, &err), DUET_ERR_RANGE);
    free(enc);
    assert_int_equal(duet_msg_encode(e, &lim, &enc, &len, &err), DUET_ERR_RANGE);
    duet_envelope_free(&e);

    /* a small message that would expand past the decode budget */
    int32_t *toks = calloc(100000, sizeof *toks); /* packed: one byte per token */
    duet_msg_origin_t o = {"x", "r", 0};
    assert_int_equal(duet_msg_new_token_chunk(&o, 0, toks, 100000, &e), DUET_OK);
    free(toks);
    enc = sample_pack_raw(e, &len);
    duet_msg_limits_default(&lim);
    lim.max_decoded_bytes = 200000; /* 400 kB of int32 needed */
    assert_int_equal(decode_bytes(enc, len, &lim, &err), DUET_ERR_RANGE);
    assert_non_null(strstr(err.msg, "memory"));
    duet_msg_limits_default(&lim);
    assert_int_equal(decode_bytes(enc, len, &lim, &err), DUET_OK);
    free(enc);
    duet_envelope_free(&e);
}

static void test_version_and_header(void **state)
{
    (void)state;
    duet_err_t err = {0};
    uint8_t *buf;
    size_t len;
    for (int i = 0; i < n_sample_kinds; i++) {
        duet_envelope_t *e = sample_msg(sample_kinds[i]);
        e->header->version = 2;
        buf = sample_pack_raw(e, &len);
        assert_int_equal(decode_bytes(buf, len, NULL, &err), DUET_ERR_VERSION);
        assert_non_null(strstr(err.msg, "header.version: 2"));
        free(buf);
        e->header->version = 0;
        buf = sample_pack_raw(e, &len);
        assert_int_equal(decode_bytes(buf, len, NULL, &err), DUET_ERR_VERSION);
        free(buf);
        duet_msg_free(&e->header->base);
        e->header = NULL;
        buf = sample_pack_raw(e, &len);
        assert_int_equal(decode_bytes(buf, len, NULL, &err), DUET_ERR_VERSION);
        assert_non_null(strstr(err.msg, "header: missing"));
        free(buf);
        duet_envelope_free(&e);
    }
}

/* Forward compatibility: a field this version does not know is ignored; a
 * body this version does not know is refused. */
static void test_unknown_fields(void **state)
{
    (void)state;
    duet_err_t err = {0};
    size_t len;
    duet_envelope_t *e = sample_msg(DUET__V1__ENVELOPE__BODY_ACK);
    uint8_t *buf = sample_pack_raw(e, &len);
    uint8_t *more = malloc(len + 8);
    memcpy(more, buf, len);
    /* field 99, varint 5: tag (99 << 3 | 0) = 792 = 0x98 0x06 */
    more[len] = 0x98;
    more[len + 1] = 0x06;
    more[len + 2] = 0x05;
    assert_int_equal(decode_bytes(more, len + 3, NULL, &err), DUET_OK);
    /* field number 0 in a non-canonical tag ("80 00"): not an encoding */
    more[len] = 0x80;
    more[len + 1] = 0x00;
    more[len + 2] = 0x00;
    assert_int_equal(decode_bytes(more, len + 3, NULL, &err), DUET_ERR_PARSE);
    assert_non_null(strstr(err.msg, "unknown field 0"));
    free(more);
    free(buf);

    /* only the header, plus an unknown length-delimited field 40 */
    duet_envelope_free(&e);
    e = sample_msg(DUET__V1__ENVELOPE__BODY_ACK);
    duet_msg_free(&e->ack->base);
    e->ack = NULL;
    e->body_case = DUET__V1__ENVELOPE__BODY__NOT_SET;
    buf = sample_pack_raw(e, &len);
    assert_int_equal(decode_bytes(buf, len, NULL, &err), DUET_ERR_PROTOCOL);
    assert_non_null(strstr(err.msg, "envelope.body"));
    more = malloc(len + 8);
    memcpy(more, buf, len);
    more[len] = 0xc2; /* tag (40 << 3 | 2) = 322 = 0xc2 0x02 */
    more[len + 1] = 0x02;
    more[len + 2] = 0x00; /* empty */
    assert_int_equal(decode_bytes(more, len + 3, NULL, &err), DUET_ERR_PROTOCOL);
    free(more);
    free(buf);
    duet_envelope_free(&e);
}

/* ------------------------------------------------------------------ out-of-range fields */

typedef struct {
    const char *name;
    duet_msg_kind_t kind;
    void (*mutate)(duet_envelope_t *e, duet_msg_limits_t *lim);
    duet_status_t want;
    const char *field; /* must appear in the error sentence */
} mutation_t;

static void set_str(char **f, const char *s) { assert_int_equal(duet_msg_set_str(f, s), DUET_OK); }

static void m_rid_long(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->header->rid, "0123456789012345678901234567890123456789012345678901234567890123x"); }
static void m_rid_space(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->header->rid, "a b"); }
static void m_rid_ctrl(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->header->rid, "abc\x01"); }
static void m_rid_empty(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->header->rid, ""); }
static void m_sender_empty(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->header->sender_id, ""); }
static void m_sender_utf8(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->header->sender_id, "d\xc3\xa9""code"); }
static void m_token_negative(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->prefill->tokens[1] = -5; }
static void m_tokens_empty(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->prefill->n_tokens = 0; }
static void m_tokens_over(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_tokens = 5; }
static void m_pages_over(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_pages = 3; }
static void m_page_id_range(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->prefill->descriptor->page_ids[2] = 1024; }
static void m_slot_range(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->prefill->descriptor->slot = 16; }
static void m_no_descriptor(duet_envelope_t *e, duet_msg_limits_t *l)
{
    (void)l;
    duet_msg_free(&e->prefill->descriptor->base);
    e->prefill->descriptor = NULL;
}
static void m_no_sampling(duet_envelope_t *e, duet_msg_limits_t *l)
{
    (void)l;
    duet_msg_free(&e->reserve->sampling->base);
    e->reserve->sampling = NULL;
}
static void m_epoch_mismatch(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->prefill->descriptor->epoch = 8; }
static void m_epoch_zero(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->header->epoch = 0; e->reserved->descriptor->epoch = 0; }
static void m_pool_kind_unknown(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->prefill->descriptor->pools[0]->kind = (Duet__V1__PoolKind)42; }
static void m_pool_kind_dup(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->prefill->descriptor->pools[1]->kind = e->prefill->descriptor->pools[0]->kind; }
static void m_pool_kind_unspec(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserved->descriptor->pools[3]->kind = DUET__V1__POOL_KIND__POOL_KIND_UNSPECIFIED; }
static void m_rkey_empty(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; assert_int_equal(duet_msg_set_bytes(&e->reserved->descriptor->pools[2]->rkey, NULL, 0), DUET_OK); }
static void m_ucx_empty(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; assert_int_equal(duet_msg_set_bytes(&e->reserved->descriptor->ucx_address, NULL, 0), DUET_OK); }
static void m_ucx_big(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_blob_bytes = 9; }
static void m_base_wrap(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserved->descriptor->pools[0]->remote_base = UINT64_MAX - 4096; }
static void m_page_bytes_zero(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserved->descriptor->pools[0]->page_bytes = 0; }
static void m_layers_over(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserved->descriptor->pools[0]->n_layers = 100000; }
static void m_page_tokens(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserved->descriptor->page_tokens = 100; }
static void m_no_pools(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserved->descriptor->n_pools = 0; } /* restored before free */
static void m_temp_nan(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->sampling->temperature = NAN; }
static void m_temp_neg(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->sampling->temperature = -1.0f; }
static void m_top_p(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->sampling->top_p = 1.5f; }
static void m_min_p(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->sampling->min_p = 1.0f; }
static void m_top_k(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->sampling->top_k = -1; }
static void m_stop_neg(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->sampling->stop_token_ids[0] = -2; }
static void m_stop_many(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_stop_ids = 1; }
static void m_prompt_zero(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->prompt_len = 0; }
static void m_max_new_over(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->max_new_tokens = 1u << 30; }
static void m_deadline_zero(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->deadline_ms = 0; }
static void m_deadline_huge(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->reserve->deadline_ms = UINT32_MAX; }
static void m_prefill_worker(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->reserve->prefill_worker_id, "p/0"); }
static void m_event_url_space(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->reserve->event_url, "ipc:///tmp/a b"); }
static void m_event_url_long(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_url_bytes = 8; }
static void m_prefill_event_url(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->prefill->event_url, "ipc://\x7f"); }
static void m_abort_unknown(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->abort->reason = (Duet__V1__AbortReason)99; }
static void m_abort_unspec(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->abort->reason = DUET__V1__ABORT_REASON__ABORT_REASON_UNSPECIFIED; }
static void m_abort_text(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_text_bytes = 4; }
static void m_ack_state(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->abort_ack->state = (Duet__V1__RequestState)-3; }
static void m_error_unspec(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->error->code = DUET__V1__ERROR_CODE__ERROR_CODE_UNSPECIFIED; }
static void m_error_unknown(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->error->code = (Duet__V1__ErrorCode)24; }
static void m_chunk_neg(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->token_chunk->tokens[2] = INT32_MIN; }
static void m_chunk_empty(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->token_chunk->n_tokens = 0; }
static void m_chunk_index(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->token_chunk->first_index = UINT32_MAX; }
static void m_done_first(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->transfer_done->first_token = -1; }
static void m_done_epoch(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->header->epoch = 0; }
static void m_done_lengths(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->transfer_done->checksums->n_layer = 4; }
static void m_done_pool(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->transfer_done->checksums->pool[3] = (Duet__V1__PoolKind)9; }
static void m_done_layer(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->transfer_done->checksums->layer[0] = 5000; }
static void m_done_many(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_checksums = 4; }
static void m_finish_unspec(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->request_finished->reason = 0; }
static void m_finish_error(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->request_finished->reason = DUET__V1__FINISH_REASON__FINISH_REASON_ERROR; }
static void m_finish_cached(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->request_finished->cached_tokens = 7; }
static void m_reject_unspec(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->rejected->reason = 0; }
static void m_reg_role(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->worker_register->role = DUET__V1__ROLE__ROLE_ROUTER; }
static void m_reg_url(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->worker_register->control_url, "ipc:///tmp/a b"); }
static void m_reg_no_url(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->worker_register->control_url, ""); }
static void m_reg_page_tokens(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->worker_register->capacity->page_tokens = 0; }
static void m_reg_dtype(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->worker_register->capacity->pools[1]->dtype = 0; }
static void m_reg_no_capacity(duet_envelope_t *e, duet_msg_limits_t *l)
{
    (void)l;
    duet_msg_free(&e->worker_register->capacity->base);
    e->worker_register->capacity = NULL;
}
static void m_hb_dup_state(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->heartbeat->load->requests[1]->state = e->heartbeat->load->requests[0]->state; }
static void m_hb_no_load(duet_envelope_t *e, duet_msg_limits_t *l)
{
    (void)l;
    duet_msg_free(&e->heartbeat->load->base);
    e->heartbeat->load = NULL;
}
static void m_hb_role(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; e->heartbeat->role = 0; }
static void m_dump_rid(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->state_dump->requests[1]->rid, ""); }
static void m_dump_many(duet_envelope_t *e, duet_msg_limits_t *l) { (void)e; l->max_requests = 1; }
static void m_dump_oldest(duet_envelope_t *e, duet_msg_limits_t *l) { (void)l; set_str(&e->state_dump->load->oldest_waiting_rid, "x\ty"); }

#define K(x) DUET__V1__ENVELOPE__BODY_##x
static const mutation_t mutations[] = {
    {"rid too long", K(PREFILL), m_rid_long, DUET_ERR_RANGE, "header.rid: 65 characters"},
    {"rid with a space", K(PREFILL), m_rid_space, DUET_ERR_PROTOCOL, "header.rid: character 0x20"},
    {"rid with a control byte", K(TOKEN_CHUNK), m_rid_ctrl, DUET_ERR_PROTOCOL, "header.rid"},
    {"rid missing on reserve", K(RESERVE), m_rid_empty, DUET_ERR_PROTOCOL, "header.rid: missing"},
    {"rid missing on abort", K(ABORT), m_rid_empty, DUET_ERR_PROTOCOL, "header.rid: missing"},
    {"sender missing", K(ACK), m_sender_empty, DUET_ERR_PROTOCOL, "header.sender_id: missing"},
    {"sender not ASCII", K(HEARTBEAT), m_sender_utf8, DUET_ERR_PROTOCOL, "header.sender_id"},
    {"negative token", K(PREFILL), m_token_negative, DUET_ERR_RANGE, "prefill.tokens[1]: token id -5"},
    {"no tokens", K(PREFILL), m_tokens_empty, DUET_ERR_RANGE, "prefill.tokens"},
    {"too many tokens", K(PREFILL), m_tokens_over, DUET_ERR_RANGE, "prefill.tokens: 6 entries"},
    {"too many page ids", K(PREFILL), m_pages_over, DUET_ERR_RANGE, "prefill.descriptor.page_ids: 4 entries"},
    {"page id out of range", K(PREFILL), m_page_id_range, DUET_ERR_RANGE, "prefill.descriptor.page_ids[2]: page 1024"},
    {"slot out of range", K(PREFILL), m_slot_range, DUET_ERR_RANGE, "prefill.descriptor.slot: 16"},
    {"prefill without descriptor", K(PREFILL), m_no_descriptor, DUET_ERR_PROTOCOL, "prefill.descriptor: missing"},
    {"reserve without sampling", K(RESERVE), m_no_sampling, DUET_ERR_PROTOCOL, "reserve.sampling: missing"},
    {"descriptor epoch differs", K(PREFILL), m_epoch_mismatch, DUET_ERR_PROTOCOL, "prefill.descriptor.epoch: 8"},
    {"reserved without epoch", K(RESERVED), m_epoch_zero, DUET_ERR_PROTOCOL, "reserved.descriptor.epoch: 0"},
    {"unknown pool kind", K(PREFILL), m_pool_kind_unknown, DUET_ERR_PROTOCOL, "prefill.descriptor.pools[0].kind: unknown PoolKind value 42"},
    {"pool kind twice", K(PREFILL), m_pool_kind_dup, DUET_ERR_PROTOCOL, "prefill.descriptor.pools[1].kind: POOL_C4_KV appears twice"},
    {"pool kind unspecified", K(RESERVED), m_pool_kind_unspec, DUET_ERR_PROTOCOL, "reserved.descriptor.pools[3].kind: UNSPECIFIED"},
    {"empty rkey", K(RESERVED), m_rkey_empty, DUET_ERR_RANGE, "reserved.descriptor.pools[2].rkey"},
    {"empty ucx address", K(RESERVED), m_ucx_empty, DUET_ERR_RANGE, "reserved.descriptor.ucx_address"},
    {"ucx address too long", K(RESERVED), m_ucx_big, DUET_ERR_RANGE, "reserved.descriptor.ucx_address: 10"},
    {"pool range wraps", K(RESERVED), m_base_wrap, DUET_ERR_RANGE, "reserved.descriptor.pools[0].remote_base"},
    {"page_bytes zero", K(RESERVED), m_page_bytes_zero, DUET_ERR_RANGE, "reserved.descriptor.pools[0].page_bytes"},
    {"too many layers", K(RESERVED), m_layers_over, DUET_ERR_RANGE, "reserved.descriptor.pools[0].n_layers"},
    {"page_tokens not a multiple of 128", K(RESERVED), m_page_tokens, DUET_ERR_RANGE, "reserved.descriptor.page_tokens: 100"},
    {"no pools", K(RESERVED), m_no_pools, DUET_ERR_RANGE, "reserved.descriptor.pools: 0 entries"},
    {"temperature NaN", K(RESERVE), m_temp_nan, DUET_ERR_RANGE, "reserve.sampling.temperature"},
    {"temperature negative", K(RESERVE), m_temp_neg, DUET_ERR_RANGE, "reserve.sampling.temperature: -1"},
    {"top_p over 1", K(RESERVE), m_top_p, DUET_ERR_RANGE, "reserve.sampling.top_p: 1.5"},
    {"min_p 1", K(RESERVE), m_min_p, DUET_ERR_RANGE, "reserve.sampling.min_p"},
    {"top_k negative", K(RESERVE), m_top_k, DUET_ERR_RANGE, "reserve.sampling.top_k: -1"},
    {"negative stop token", K(RESERVE), m_stop_neg, DUET_ERR_RANGE, "reserve.sampling.stop_token_ids[0]"},
    {"too many stop tokens", K(RESERVE), m_stop_many, DUET_ERR_RANGE, "reserve.sampling.stop_token_ids: 2 entries"},
    {"prompt_len 0", K(RESERVE), m_prompt_zero, DUET_ERR_RANGE, "reserve.prompt_len: 0"},
    {"max_new_tokens huge", K(RESERVE), m_max_new_over, DUET_ERR_RANGE, "reserve.max_new_tokens"},
    {"deadline 0", K(RESERVE), m_deadline_zero, DUET_ERR_RANGE, "reserve.deadline_ms: 0"},
    {"deadline huge", K(RESERVE), m_deadline_huge, DUET_ERR_RANGE, "reserve.deadline_ms"},
    {"prefill worker id", K(RESERVE), m_prefill_worker, DUET_ERR_PROTOCOL, "reserve.prefill_worker_id"},
    {"event URL with a space", K(RESERVE), m_event_url_space, DUET_ERR_PROTOCOL, "reserve.event_url: byte 0x20"},
    {"event URL too long", K(RESERVE), m_event_url_long, DUET_ERR_RANGE, "reserve.event_url"},
    {"prefill event URL not printable", K(PREFILL), m_prefill_event_url, DUET_ERR_PROTOCOL, "prefill.event_url: byte 0x7f"},
    {"unknown abort reason", K(ABORT), m_abort_unknown, DUET_ERR_PROTOCOL, "abort.reason: unknown AbortReason value 99"},
    {"abort reason unspecified", K(ABORT), m_abort_unspec, DUET_ERR_PROTOCOL, "abort.reason: UNSPECIFIED"},
    {"abort message too long", K(ABORT), m_abort_text, DUET_ERR_RANGE, "abort.message"},
    {"unknown request state", K(ABORT_ACK), m_ack_state, DUET_ERR_PROTOCOL, "abort_ack.state"},
    {"error code unspecified", K(ERROR), m_error_unspec, DUET_ERR_PROTOCOL, "error.code: UNSPECIFIED"},
    {"unknown error code", K(ERROR), m_error_unknown, DUET_ERR_PROTOCOL, "error.code: unknown ErrorCode value 24"},
    {"negative generated token", K(TOKEN_CHUNK), m_chunk_neg, DUET_ERR_RANGE, "token_chunk.tokens[2]"},
    {"empty token chunk", K(TOKEN_CHUNK), m_chunk_empty, DUET_ERR_RANGE, "token_chunk.tokens: 0 entries"},
    {"token index past the limit", K(TOKEN_CHUNK), m_chunk_index, DUET_ERR_RANGE, "token_chunk.first_index"},
    {"negative first token", K(TRANSFER_DONE), m_done_first, DUET_ERR_RANGE, "transfer_done.first_token: token id -1"},
    {"transfer_done without epoch", K(TRANSFER_DONE), m_done_epoch, DUET_ERR_PROTOCOL, "header.epoch: 0"},
    {"checksum arrays differ", K(TRANSFER_DONE), m_done_lengths, DUET_ERR_PROTOCOL, "transfer_done.checksums: pool, layer, page and hash have 5, 4, 5 and 5"},
    {"checksum pool unknown", K(TRANSFER_DONE), m_done_pool, DUET_ERR_PROTOCOL, "transfer_done.checksums.pool[3]: unknown PoolKind value 9"},
    {"checksum layer over", K(TRANSFER_DONE), m_done_layer, DUET_ERR_RANGE, "transfer_done.checksums.layer[0]: 5000"},
    {"too many checksums", K(TRANSFER_DONE), m_done_many, DUET_ERR_RANGE, "transfer_done.checksums.hash: 5 entries"},
    {"finish reason unspecified", K(REQUEST_FINISHED), m_finish_unspec, DUET_ERR_PROTOCOL, "request_finished.reason"},
    {"error finish without code", K(REQUEST_FINISHED), m_finish_error, DUET_ERR_PROTOCOL, "request_finished.error"},
    {"more cached than prompt", K(REQUEST_FINISHED), m_finish_cached, DUET_ERR_RANGE, "request_finished.cached_tokens: 7"},
    {"reject reason unspecified", K(REJECTED), m_reject_unspec, DUET_ERR_PROTOCOL, "rejected.reason"},
    {"register as a router", K(WORKER_REGISTER), m_reg_role, DUET_ERR_PROTOCOL, "worker_register.role: ROLE_ROUTER"},
    {"URL with a space", K(WORKER_REGISTER), m_reg_url, DUET_ERR_PROTOCOL, "worker_register.control_url"},
    {"no control URL", K(WORKER_REGISTER), m_reg_no_url, DUET_ERR_PROTOCOL, "worker_register.control_url: missing"},
    {"capacity page_tokens 0", K(WORKER_REGISTER), m_reg_page_tokens, DUET_ERR_RANGE, "worker_register.capacity.page_tokens"},
    {"capacity dtype unspecified", K(WORKER_REGISTER), m_reg_dtype, DUET_ERR_PROTOCOL, "worker_register.capacity.pools[1].dtype"},
    {"no capacity", K(WORKER_REGISTER), m_reg_no_capacity, DUET_ERR_PROTOCOL, "worker_register.capacity: missing"},
    {"state counted twice", K(HEARTBEAT), m_hb_dup_state, DUET_ERR_PROTOCOL, "heartbeat.load.requests[1].state"},
    {"heartbeat without load", K(HEARTBEAT), m_hb_no_load, DUET_ERR_PROTOCOL, "heartbeat.load: missing"},
    {"heartbeat role unspecified", K(HEARTBEAT), m_hb_role, DUET_ERR_PROTOCOL, "heartbeat.role"},
    {"dump entry without rid", K(STATE_DUMP), m_dump_rid, DUET_ERR_PROTOCOL, "state_dump.requests[1].rid: missing"},
    {"dump too long", K(STATE_DUMP), m_dump_many, DUET_ERR_RANGE, "state_dump.requests: 2 entries"},
    {"dump oldest rid", K(STATE_DUMP), m_dump_oldest, DUET_ERR_PROTOCOL, "state_dump.load.oldest_waiting_rid"},
};
#undef K

static void test_out_of_range_fields(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof mutations / sizeof mutations[0]; i++) {
        const mutation_t *m = &mutations[i];
        duet_err_t err = {0};
        duet_msg_limits_t lim;
        size_t len, n_pools_saved = 0;
        duet_msg_limits_default(&lim);
        duet_envelope_t *e = sample_msg(m->kind);
        m->mutate(e, &lim);
        if (m->mutate == m_no_pools)
            n_pools_saved = DUET_POOL_COUNT;
        uint8_t *buf = sample_pack_raw(e, &len);
        duet_status_t st = decode_bytes(buf, len, &lim, &err);
        if (st != m->want || !strstr(err.msg, m->field))
            fail_msg("%s: got %s \"%s\", want %s naming \"%s\"", m->name, duet_status_code(st), err.msg,
                     duet_status_code(m->want), m->field);
        /* the sender refuses it too */
        uint8_t *out = NULL;
        size_t out_len = 0;
        duet_err_t err2 = {0};
        assert_int_equal(duet_msg_encode(e, &lim, &out, &out_len, &err2), m->want);
        assert_null(out);
        free(buf);
        if (n_pools_saved)
            e->reserved->descriptor->n_pools = n_pools_saved; /* so that free sees the pools */
        duet_envelope_free(&e);
    }
}

/* ------------------------------------------------------------------ descriptors and layouts */

static void test_descriptor_layouts(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    duet_cache_opts_t opts = {256, DUET_CACHE_FP8, DUET_CACHE_FP8};
    duet_cache_layout_t lay[DUET_POOL_COUNT], other[DUET_POOL_COUNT];
    duet_err_t err = {0};
    tiny_config(&cfg);
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        assert_int_equal(duet_cache_layout_compute(&cfg, &opts, (duet_pool_kind_t)k, &lay[k], &err), DUET_OK);
    opts.index_k_dtype = DUET_CACHE_BF16;
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        assert_int_equal(duet_cache_layout_compute(&cfg, &opts, (duet_pool_kind_t)k, &other[k], &err), DUET_OK);

    static const uint8_t addr[4] = {1, 2, 3, 4}, rkey[3] = {9, 9, 9};
    duet_msg_origin_t o = {"decode-0", "r1", 3};
    duet_envelope_t *e = NULL;
    assert_int_equal(duet_msg_new_reserved(&o, "decode-0", addr, 4, 256, 0, &e), DUET_OK);
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        if (lay[k].n_layers)
            assert_int_equal(duet_msg_descriptor_add_pool(e->reserved->descriptor, &lay[k], rkey, 3,
                                                          0x10000000ull * (uint64_t)(k + 1), 8),
                             DUET_OK);
    uint32_t pages[2] = {0, 7};
    assert_int_equal(duet_msg_set_u32s(&e->reserved->descriptor->page_ids, &e->reserved->descriptor->n_page_ids,
                                       pages, 2),
                     DUET_OK);
    assert_int_equal(duet_msg_validate(e, NULL, &err), DUET_OK);
    const Duet__V1__TransferDescriptor *d = e->reserved->descriptor;
    assert_int_equal(duet_msg_descriptor_check_layouts(d, lay, DUET_POOL_COUNT, &err), DUET_OK);

    /* a different index-K dtype: refused */
    assert_int_equal(duet_msg_descriptor_check_layouts(d, other, DUET_POOL_COUNT, &err), DUET_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.msg, "fingerprint"));
    /* one pool's fingerprint differs: refused, naming that pool */
    memcpy(other, lay, sizeof lay);
    other[DUET_POOL_C4_INDEX_K].fingerprint ^= 1;
    assert_int_equal(duet_msg_descriptor_check_layouts(d, other, DUET_POOL_COUNT, &err), DUET_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.msg, duet_pool_kind_name(DUET_POOL_C4_INDEX_K)));
    /* a pool missing on one side */
    assert_int_equal(duet_msg_descriptor_check_layouts(d, lay, 1, &err), DUET_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.msg, "does not exist here"));

    /* dup gives an equal, independent copy */
    Duet__V1__TransferDescriptor *copy = duet_msg_dup(&d->base);
    assert_non_null(copy);
    assert_int_equal(copy->n_pools, d->n_pools);
    assert_int_equal(copy->page_ids[1], 7);
    assert_memory_equal(copy->pools[0]->rkey.data, rkey, 3);
    duet_msg_free(&copy->base);
    duet_envelope_free(&e);
}

/* The data plane's descriptor survives the wire: xfer -> proto -> bytes -> proto -> xfer. */
/* Which event URLs a worker can dial (Reserve/Prefill.event_url). */
static void test_event_url(void **state)
{
    (void)state;
    duet_err_t err = {0};
    static const char *const good[] = {NULL, "", "ipc:///run/duet/events.sock", "tcp://10.0.0.5:7100",
                                       "tcp://router-1.example:7100", "tcp://[::1]:7100", "inproc://events"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        assert_int_equal(duet_msg_check_event_url(good[i], "reserve.event_url", &err), DUET_OK);
    static const char *const bad[] = {"http://router:7100", "ipc://", "tcp://router", "events.sock", "udp://1.2.3.4:5",
                                      "IPC:///x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(duet_msg_check_event_url(bad[i], "reserve.event_url", &err), DUET_ERR_INVALID);
        assert_non_null(strstr(err.msg, "reserve.event_url"));
    }
}

static void test_descriptor_xfer_roundtrip(void **state)
{
    (void)state;
    duet_xfer_desc_t x, back;
    duet_err_t err = {0};
    memset(&x, 0, sizeof x);
    static uint8_t addr[40], rkey0[12], rkey1[20];
    static uint32_t pages[3] = {4, 5, 11};
    for (size_t i = 0; i < sizeof addr; i++)
        addr[i] = (uint8_t)(i * 7);
    memset(rkey0, 0xab, sizeof rkey0);
    memset(rkey1, 0xcd, sizeof rkey1);
    x.worker_id = 0xfeedfacecafebeefull;
    snprintf(x.rid, sizeof x.rid, "%s", SAMPLE_RID);
    x.epoch = 42;
    x.page_tokens = 256;
    x.address = addr;
    x.address_len = sizeof addr;
    x.n_pools = 2;
    x.pools[0] = (duet_xfer_pool_desc_t){DUET_POOL_C4_KV, 0x1111, 0x7f0000001000ull, 37376, 16, 21, sizeof rkey0, rkey0};
    x.pools[1] = (duet_xfer_pool_desc_t){DUET_POOL_SWA_KV, 0x2222, 0x7f0000900000ull, 74752, 4, 43, sizeof rkey1, rkey1};
    x.n_pages = 3;
    x.page_ids = pages;
    x.slot = 3;

    duet_msg_origin_t o = {"decode-0", SAMPLE_RID, 42};
    duet_envelope_t *e = NULL, *d = NULL;
    assert_int_equal(duet_msg_new_reserved(&o, "decode-0", NULL, 0, 256, 0, &e), DUET_OK);
    duet_msg_free(&e->reserved->descriptor->base);
    assert_int_equal(duet_msg_descriptor_from_xfer(&x, "decode-0", &e->reserved->descriptor), DUET_OK);
    uint8_t *buf;
    size_t len;
    if (duet_msg_encode(e, NULL, &buf, &len, &err) != DUET_OK)
        fail_msg("%s", duet_err_text(&err));
    assert_int_equal(duet_msg_decode(buf, len, NULL, &d, &err), DUET_OK);
    free(buf);
    assert_int_equal(d->reserved->descriptor->engine_id, 0xfeedfacecafebeefull);
    assert_int_equal(duet_msg_descriptor_to_xfer(d->reserved->descriptor, duet_msg_rid(d), &back, &err), DUET_OK);
    assert_int_equal(duet_xfer_desc_validate(&back, &err), DUET_OK);
    assert_string_equal(back.rid, SAMPLE_RID);
    assert_int_equal(back.worker_id, x.worker_id);
    assert_int_equal(back.epoch, 42);
    assert_int_equal(back.page_tokens, 256);
    assert_int_equal(back.address_len, sizeof addr);
    assert_memory_equal(back.address, addr, sizeof addr);
    assert_int_equal(back.n_pools, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(back.pools[i].kind, x.pools[i].kind);
        assert_int_equal(back.pools[i].fingerprint, x.pools[i].fingerprint);
        assert_int_equal(back.pools[i].remote_base, x.pools[i].remote_base);
        assert_int_equal(back.pools[i].page_bytes, x.pools[i].page_bytes);
        assert_int_equal(back.pools[i].n_units, x.pools[i].n_units);
        assert_int_equal(back.pools[i].n_layers, x.pools[i].n_layers);
        assert_int_equal(back.pools[i].rkey_len, x.pools[i].rkey_len);
        assert_memory_equal(back.pools[i].rkey, x.pools[i].rkey, x.pools[i].rkey_len);
    }
    assert_int_equal(back.n_pages, 3);
    assert_memory_equal(back.page_ids, pages, sizeof pages);
    assert_int_equal(back.slot, 3);
    duet_xfer_desc_fini(&back);

    /* "no slot" crosses the wire too */
    d->reserved->descriptor->slot = DUET_MSG_NO_SLOT;
    assert_int_equal(duet_msg_validate(d, NULL, &err), DUET_OK);
    assert_int_equal(duet_msg_descriptor_to_xfer(d->reserved->descriptor, duet_msg_rid(d), &back, &err), DUET_OK);
    assert_int_equal(back.slot, DUET_XFER_NO_SLOT);
    duet_xfer_desc_fini(&back);
    /* the longest rid the control plane allows fits the data plane; a longer one does not */
    char long_rid[66];
    memset(long_rid, 'a', 64);
    long_rid[64] = '\0';
    assert_int_equal(duet_msg_descriptor_to_xfer(d->reserved->descriptor, long_rid, &back, &err), DUET_OK);
    duet_xfer_desc_fini(&back);
    long_rid[64] = 'a';
    long_rid[65] = '\0';
    assert_int_equal(duet_msg_descriptor_to_xfer(d->reserved->descriptor, long_rid, &back, &err), DUET_ERR_RANGE);
    duet_envelope_free(&d);
    duet_envelope_free(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_table),
        cmocka_unit_test(test_roundtrip_every_kind),
        cmocka_unit_test(test_roundtrip_fields),
        cmocka_unit_test(test_builder_misuse),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_version_and_header),
        cmocka_unit_test(test_unknown_fields),
        cmocka_unit_test(test_out_of_range_fields),
        cmocka_unit_test(test_descriptor_layouts),
        cmocka_unit_test(test_descriptor_xfer_roundtrip),
        cmocka_unit_test(test_event_url),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
