/* Sample envelopes (msg_samples.h). */
#include "msg_samples.h"

#include <stdlib.h>
#include <string.h>

const duet_msg_kind_t sample_kinds[] = {
    DUET__V1__ENVELOPE__BODY_WORKER_REGISTER, DUET__V1__ENVELOPE__BODY_HEARTBEAT,
    DUET__V1__ENVELOPE__BODY_RESERVE,         DUET__V1__ENVELOPE__BODY_RESERVED,
    DUET__V1__ENVELOPE__BODY_REJECTED,        DUET__V1__ENVELOPE__BODY_PREFILL,
    DUET__V1__ENVELOPE__BODY_TRANSFER_DONE,   DUET__V1__ENVELOPE__BODY_ABORT,
    DUET__V1__ENVELOPE__BODY_ABORT_ACK,       DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK,
    DUET__V1__ENVELOPE__BODY_REQUEST_FINISHED, DUET__V1__ENVELOPE__BODY_ERROR,
    DUET__V1__ENVELOPE__BODY_ACK,             DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST,
    DUET__V1__ENVELOPE__BODY_STATE_DUMP,
};
const int n_sample_kinds = (int)(sizeof sample_kinds / sizeof sample_kinds[0]);

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if ((x) != DUET_OK)                                                                        \
            abort();                                                                               \
    } while (0)

/* A layout as cache_layout.h would give it (values only need to be plausible here). */
static duet_cache_layout_t layout(duet_pool_kind_t kind, uint64_t page_bytes, uint32_t n_layers)
{
    duet_cache_layout_t l;
    memset(&l, 0, sizeof l);
    l.kind = kind;
    l.dtype = kind >= DUET_POOL_STATE_C4 ? DUET_CACHE_F32 : DUET_CACHE_FP8;
    l.n_layers = n_layers;
    l.page_bytes = page_bytes;
    l.fingerprint = 0x9e3779b97f4a7c15ull * (uint64_t)(kind + 1);
    return l;
}

static void fill_descriptor(Duet__V1__TransferDescriptor *d)
{
    static const uint8_t rkey[] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4};
    static const uint32_t pages[] = {3, 4, 5, 9};
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        duet_cache_layout_t l = layout((duet_pool_kind_t)k, 37376u + 64u * (unsigned)k, k == DUET_POOL_C128_KV ? 20 : 21);
        CHECK(duet_msg_descriptor_add_pool(d, &l, rkey, sizeof rkey, 0x7f0000000000ull + ((uint64_t)k << 36),
                                           k >= DUET_POOL_SWA_KV ? 16 : 1024));
    }
    CHECK(duet_msg_set_u32s(&d->page_ids, &d->n_page_ids, pages, 4));
}

static void fill_sampling(Duet__V1__SamplingParams *s)
{
    static const int32_t stops[] = {1, 128799};
    s->temperature = 0.7f;
    s->top_p = 0.95f;
    s->top_k = 40;
    s->min_p = 0.05f;
    s->seed = 0x1234567890abcdefull;
    s->ignore_eos = 1;
    CHECK(duet_msg_set_i32s(&s->stop_token_ids, &s->n_stop_token_ids, stops, 2));
}

static void fill_load(Duet__V1__Load *l)
{
    l->queue_len = 3;
    l->tokens_in_flight = 12345;
    l->pages_free = 900;
    l->pages_used = 100;
    l->pages_quarantined = 24;
    l->slots_free = 10;
    l->slots_used = 5;
    l->slots_quarantined = 1;
    l->oldest_waiting_age_ms = 1500;
    CHECK(duet_msg_set_str(&l->oldest_waiting_rid, SAMPLE_RID));
    CHECK(duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_WAITING_FOR_INPUT, 2));
    CHECK(duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_DECODING, 3));
}

duet_envelope_t *sample_msg(duet_msg_kind_t kind)
{
    duet_msg_origin_t o = {SAMPLE_SENDER, SAMPLE_RID, SAMPLE_EPOCH};
    duet_msg_origin_t anon = {SAMPLE_SENDER, NULL, 0};
    duet_envelope_t *e = NULL;
    static const int32_t prompt[] = {0, 100, 200, 300, 65535, 128000};
    static const int32_t chunk[] = {11, 12, 13};
    static const uint8_t ucx_addr[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a};

    switch (kind) {
    case DUET__V1__ENVELOPE__BODY_WORKER_REGISTER: {
        CHECK(duet_msg_new_worker_register(&anon, DUET__V1__ROLE__ROLE_DECODE, "decode-0", "ipc:///tmp/duet-d0.sock",
                                           "tcp://127.0.0.1:7000", 1024, 16, 256, &e));
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            duet_cache_layout_t l = layout((duet_pool_kind_t)k, 4096u * (unsigned)(k + 1), 21);
            CHECK(duet_msg_capacity_add_pool(e->worker_register->capacity, &l, k >= DUET_POOL_SWA_KV ? 16 : 1024));
        }
        break;
    }
    case DUET__V1__ENVELOPE__BODY_HEARTBEAT:
        CHECK(duet_msg_new_heartbeat(&anon, DUET__V1__ROLE__ROLE_PREFILL, &e));
        fill_load(e->heartbeat->load);
        break;
    case DUET__V1__ENVELOPE__BODY_RESERVE:
        CHECK(duet_msg_new_reserve(&(duet_msg_origin_t){"router-0", SAMPLE_RID, 0}, 6, 128, 30000, SAMPLE_EVENT_URL,
                                   &e));
        fill_sampling(e->reserve->sampling);
        CHECK(duet_msg_set_str(&e->reserve->prefill_worker_id, "prefill-0"));
        break;
    case DUET__V1__ENVELOPE__BODY_RESERVED:
        CHECK(duet_msg_new_reserved(&o, "decode-0", ucx_addr, sizeof ucx_addr, 256, 2, &e));
        fill_descriptor(e->reserved->descriptor);
        break;
    case DUET__V1__ENVELOPE__BODY_REJECTED:
        CHECK(duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_NO_PAGES, "need 4 pages, 1 free", 50,
                                    &e));
        break;
    case DUET__V1__ENVELOPE__BODY_PREFILL: {
        duet_envelope_t *r = sample_msg(DUET__V1__ENVELOPE__BODY_RESERVED);
        CHECK(duet_msg_new_prefill(&(duet_msg_origin_t){"router-0", SAMPLE_RID, SAMPLE_EPOCH}, prompt, 6,
                                   r->reserved->descriptor, 60000, SAMPLE_EVENT_URL, &e));
        fill_sampling(e->prefill->sampling);
        duet_envelope_free(&r);
        break;
    }
    case DUET__V1__ENVELOPE__BODY_TRANSFER_DONE: {
        CHECK(duet_msg_new_transfer_done(&(duet_msg_origin_t){"prefill-0", SAMPLE_RID, SAMPLE_EPOCH}, 4242, 6, 5, &e));
        Duet__V1__PageChecksums *c = e->transfer_done->checksums;
        for (size_t i = 0; i < 5; i++) {
            c->pool[i] = duet_msg_pool_to_wire((duet_pool_kind_t)(i % DUET_POOL_COUNT));
            c->layer[i] = (uint32_t)i * 2;
            c->page[i] = 3 + (uint32_t)i;
            c->hash[i] = 0xfedcba9876543210ull ^ i;
        }
        break;
    }
    case DUET__V1__ENVELOPE__BODY_ABORT:
        CHECK(duet_msg_new_abort(&(duet_msg_origin_t){"router-0", SAMPLE_RID, SAMPLE_EPOCH},
                                 DUET__V1__ABORT_REASON__ABORT_REASON_CLIENT_DISCONNECT, 1, "client went away", &e));
        break;
    case DUET__V1__ENVELOPE__BODY_ABORT_ACK:
        CHECK(duet_msg_new_abort_ack(&o, 1, DUET__V1__REQUEST_STATE__REQUEST_STATE_WAITING_FOR_INPUT, 0, 4, &e));
        break;
    case DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK:
        CHECK(duet_msg_new_token_chunk(&o, 1, chunk, 3, &e));
        break;
    case DUET__V1__ENVELOPE__BODY_REQUEST_FINISHED:
        CHECK(duet_msg_new_request_finished(&o, DUET__V1__FINISH_REASON__FINISH_REASON_LENGTH, 6, 128, &e));
        e->request_finished->cached_tokens = 4;
        break;
    case DUET__V1__ENVELOPE__BODY_ERROR:
        CHECK(duet_msg_new_error(&o, DUET_ERR_LAYOUT_MISMATCH, "C4_KV fingerprints differ", &e));
        break;
    case DUET__V1__ENVELOPE__BODY_ACK:
        CHECK(duet_msg_new_ack(&o, &e));
        break;
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST:
        CHECK(duet_msg_new_state_dump_request(&(duet_msg_origin_t){"tool", NULL, 0}, 1, &e));
        break;
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP:
        CHECK(duet_msg_new_state_dump(&anon, DUET__V1__ROLE__ROLE_DECODE, &e));
        fill_load(e->state_dump->load);
        CHECK(duet_msg_state_dump_add_request(e->state_dump, SAMPLE_RID, SAMPLE_EPOCH,
                                              DUET__V1__REQUEST_STATE__REQUEST_STATE_WAITING_FOR_INPUT, 1500, 4));
        CHECK(duet_msg_state_dump_add_request(e->state_dump, "req-2", 8, DUET__V1__REQUEST_STATE__REQUEST_STATE_DECODING,
                                              20, 2));
        break;
    default:
        return NULL;
    }
    e->header->send_time_us = 1700000000000000ull; /* fixed, so encodings are reproducible */
    return e;
}

uint8_t *sample_pack_raw(const duet_envelope_t *e, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(&e->base);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        abort();
    *len = protobuf_c_message_pack(&e->base, buf);
    return buf;
}
