/* Control-plane messages: encoding, decoding and validation of duet.v1
 * envelopes (proto/duet.proto, docs/PROTOCOL.md), and helpers that build
 * them.
 *
 * Every message is one duet_envelope_t (the protoc-c type
 * Duet__V1__Envelope): a header (version, rid, epoch, sender id, send time)
 * and exactly one body, selected by env->body_case (DUET__V1__ENVELOPE__BODY_*)
 * and read through the anonymous union (env->reserve, env->prefill, ...).
 *
 * Decoding never trusts its input.  In this order:
 *   - a buffer longer than limits.max_message_bytes  -> DUET_ERR_RANGE (not unpacked)
 *   - bytes that do not unpack, or whose unpacking would allocate more than
 *     limits.max_decoded_bytes                        -> DUET_ERR_PARSE / DUET_ERR_RANGE
 *   - no header, or header.version != DUET_PROTOCOL_VERSION -> DUET_ERR_VERSION
 *   - no body (or one this version does not know), an enum value this version
 *     does not know, a required part missing, malformed ids, inconsistent
 *     parallel arrays                                 -> DUET_ERR_PROTOCOL
 *   - numbers, counts and lengths outside their limits -> DUET_ERR_RANGE
 * The error sentence names the field ("prefill.descriptor.page_ids[3]: ...").
 * Encoding runs the same validation, so a process cannot send what its peer
 * would refuse.
 *
 * Ownership: an envelope, and everything it points to, is heap memory from
 * malloc; duet_envelope_free() releases decoded and built envelopes alike.
 * Set strings, bytes and arrays in a built envelope with the duet_msg_set_*
 * helpers (never point a field at a literal or at memory you keep), and
 * allocate sub-messages with duet_msg_alloc().
 *
 * Thread safety: functions here touch only their arguments. */
#ifndef DUET_NET_MSG_H
#define DUET_NET_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "duet.pb-c.h"

#include "cache_layout.h"
#include "err.h"

/* The protocol version this build speaks (Header.version). */
#define DUET_PROTOCOL_VERSION 1

typedef Duet__V1__Envelope duet_envelope_t;
/* Which body an envelope carries: DUET__V1__ENVELOPE__BODY_RESERVE, ... */
typedef Duet__V1__Envelope__BodyCase duet_msg_kind_t;

/* Bounds every decoded (and encoded) message must respect. */
typedef struct {
    size_t max_message_bytes;  /* encoded envelope (64 MiB) */
    size_t max_decoded_bytes;  /* memory unpacking may allocate (256 MiB) */
    uint32_t max_tokens;       /* Prefill.tokens, TokenChunk.tokens, prompt_len, max_new_tokens, counts (1 << 21) */
    uint32_t max_pages;        /* TransferDescriptor.page_ids (1 << 16) */
    uint32_t max_units;        /* PoolDescriptor.n_units, PoolLayout.n_units, Capacity pages/slots (1 << 24) */
    uint32_t max_checksums;    /* TransferDone checksum entries (1 << 21) */
    uint32_t max_stop_ids;     /* SamplingParams.stop_token_ids (256) */
    uint32_t max_layers;       /* PoolDescriptor.n_layers, checksum layer + 1 (DUET_MAX_LAYERS) */
    uint64_t max_page_bytes;   /* PoolDescriptor/PoolLayout.page_bytes (1 GiB) */
    uint32_t max_blob_bytes;   /* UCX worker address, packed rkey (64 KiB) */
    uint32_t max_text_bytes;   /* human-readable messages (4096) */
    uint32_t max_url_bytes;    /* control/event URLs (256) */
    uint32_t max_requests;     /* StateDump.requests (1 << 16) */
    uint32_t max_deadline_ms;  /* Reserve/Prefill deadline_ms (24 h) */
} duet_msg_limits_t;

#define DUET_MSG_MAX_ID_LEN 64 /* rid, sender and worker ids: 1..64 of [A-Za-z0-9._:-] */
#define DUET_MSG_NO_SLOT UINT32_MAX       /* TransferDescriptor.slot: the request has none */
#define DUET_MSG_ALL_LAYERS UINT32_MAX    /* PageChecksums.layer: hash chained over every layer */

/* Fill `l` with the defaults above. */
void duet_msg_limits_default(duet_msg_limits_t *l);

/* ------------------------------------------------------------------ codec */

/* Decode `len` bytes into a new envelope and validate it (see the top of this
 * file for the statuses).  `lim` NULL means the defaults.  *out is written
 * only on DUET_OK; free it with duet_envelope_free(). */
duet_status_t duet_msg_decode(const void *buf, size_t len, const duet_msg_limits_t *lim,
                              duet_envelope_t **out, duet_err_t *err);

/* Validate an envelope (decoded or built): version, header, body and every
 * field against `lim` (NULL: defaults). */
duet_status_t duet_msg_validate(const duet_envelope_t *env, const duet_msg_limits_t *lim, duet_err_t *err);

/* Validate `env` and return its encoded size in *size; DUET_ERR_RANGE when
 * that exceeds lim->max_message_bytes.  Pair with duet_msg_pack() to encode
 * into memory the caller owns (an NNG or UCX buffer). */
duet_status_t duet_msg_encoded_size(const duet_envelope_t *env, const duet_msg_limits_t *lim, size_t *size,
                                    duet_err_t *err);
/* Encode a validated envelope into `buf` (duet_msg_encoded_size() bytes);
 * returns the number of bytes written. */
size_t duet_msg_pack(const duet_envelope_t *env, uint8_t *buf);
/* Validate and encode into a new malloc'd buffer (*buf, *len; free() it).
 * Outputs are written only on DUET_OK. */
duet_status_t duet_msg_encode(const duet_envelope_t *env, const duet_msg_limits_t *lim, uint8_t **buf,
                              size_t *len, duet_err_t *err);

/* Free an envelope from duet_msg_decode() or a builder and set *env to NULL;
 * NULL and *env == NULL are fine. */
void duet_envelope_free(duet_envelope_t **env);

/* ------------------------------------------------------------------ builders */

/* Who sends an envelope, and which request it is about. */
typedef struct {
    const char *sender_id; /* required */
    const char *rid;       /* NULL or "" when not about a request */
    uint64_t epoch;        /* decode's epoch for rid; 0 when none */
} duet_msg_origin_t;

/* New envelope carrying an empty body of `kind`, with the header filled:
 * version DUET_PROTOCOL_VERSION, rid, epoch, sender id and send_time_us from
 * duet_wall_us().  Sub-messages of the body start NULL (see the typed
 * builders below, which allocate the ones their message requires).
 * DUET_ERR_INVALID for kind NOT_SET or unknown, or no sender id. */
duet_status_t duet_msg_create(duet_msg_kind_t kind, const duet_msg_origin_t *o, duet_envelope_t **out);

/* A zero-initialized message of type `desc` (e.g.
 * &duet__v1__sampling_params__descriptor); NULL when out of memory. */
void *duet_msg_alloc(const ProtobufCMessageDescriptor *desc);
/* Deep copy of any message (by encoding and decoding it); NULL when out of
 * memory.  Free with duet_msg_free(). */
void *duet_msg_dup(const ProtobufCMessage *msg);
/* Free a message from duet_msg_alloc()/duet_msg_dup() (and everything it points to). */
void duet_msg_free(ProtobufCMessage *msg);

/* Replace a string field with a copy of `s` (NULL: empty). */
duet_status_t duet_msg_set_str(char **field, const char *s);
/* Replace a bytes field with a copy of data[0..len). */
duet_status_t duet_msg_set_bytes(ProtobufCBinaryData *field, const void *data, size_t len);
/* Replace a repeated int32 / uint32 field with a copy of src[0..n). */
duet_status_t duet_msg_set_i32s(int32_t **field, size_t *n_field, const int32_t *src, size_t n);
duet_status_t duet_msg_set_u32s(uint32_t **field, size_t *n_field, const uint32_t *src, size_t n);

/* Typed builders.  Each returns DUET_ERR_NOMEM / DUET_ERR_INVALID, or DUET_OK
 * with *out set; they do not validate (duet_msg_encode does). */

/* Error{code, message}; code must be an error status (< 0). */
duet_status_t duet_msg_new_error(const duet_msg_origin_t *o, duet_status_t code, const char *message,
                                 duet_envelope_t **out);
duet_status_t duet_msg_new_ack(const duet_msg_origin_t *o, duet_envelope_t **out);
/* Reserve with a SamplingParams (greedy, seed 0) for the caller to fill.
 * event_url: where decode sends this request's events (the sender's pull
 * socket); NULL or "" leaves it empty (decode's own --events). */
duet_status_t duet_msg_new_reserve(const duet_msg_origin_t *o, uint32_t prompt_len, uint32_t max_new_tokens,
                                   uint32_t deadline_ms, const char *event_url, duet_envelope_t **out);
/* Reserved with an empty TransferDescriptor whose epoch is o->epoch, to be
 * filled with duet_msg_descriptor_add_pool() and duet_msg_set_u32s(page_ids). */
duet_status_t duet_msg_new_reserved(const duet_msg_origin_t *o, const char *decode_worker_id,
                                    const void *ucx_address, size_t ucx_address_len, uint32_t page_tokens,
                                    uint32_t slot, duet_envelope_t **out);
duet_status_t duet_msg_new_rejected(const duet_msg_origin_t *o, Duet__V1__RejectReason reason,
                                    const char *message, uint32_t retry_after_ms, duet_envelope_t **out);
/* Prefill with a copy of tokens, a copy of `descriptor` (NULL: an empty one
 * whose epoch is o->epoch) and a SamplingParams for the caller to fill;
 * event_url as in duet_msg_new_reserve(). */
duet_status_t duet_msg_new_prefill(const duet_msg_origin_t *o, const int32_t *tokens, size_t n_tokens,
                                   const Duet__V1__TransferDescriptor *descriptor, uint32_t deadline_ms,
                                   const char *event_url, duet_envelope_t **out);
/* TransferDone with n_checksums zeroed checksum entries (none when 0) for
 * the caller to fill: td->checksums->{pool,layer,page,hash}[i]. */
duet_status_t duet_msg_new_transfer_done(const duet_msg_origin_t *o, int32_t first_token, uint32_t n_tokens,
                                         size_t n_checksums, duet_envelope_t **out);
duet_status_t duet_msg_new_abort(const duet_msg_origin_t *o, Duet__V1__AbortReason reason, int prefill_quiesced,
                                 const char *message, duet_envelope_t **out);
duet_status_t duet_msg_new_abort_ack(const duet_msg_origin_t *o, int known, Duet__V1__RequestState state,
                                     int transfer_started, uint32_t pages_quarantined, duet_envelope_t **out);
duet_status_t duet_msg_new_token_chunk(const duet_msg_origin_t *o, uint32_t first_index, const int32_t *tokens,
                                       size_t n_tokens, duet_envelope_t **out);
duet_status_t duet_msg_new_request_finished(const duet_msg_origin_t *o, Duet__V1__FinishReason reason,
                                            uint32_t prompt_tokens, uint32_t completion_tokens,
                                            duet_envelope_t **out);
/* Heartbeat with an empty Load for the caller to fill. */
/* This process's incarnation: random, fixed for its life, never 0.  Heartbeats
 * and state dumps carry it, so a router tells a restarted worker (same id,
 * same URL) from the one whose requests it was tracking. */
uint64_t duet_msg_incarnation(void);
duet_status_t duet_msg_new_heartbeat(const duet_msg_origin_t *o, Duet__V1__Role role, duet_envelope_t **out);
/* WorkerRegister with a Capacity (pages, slots, page_tokens) to which
 * duet_msg_capacity_add_pool() adds the pool layouts. */
duet_status_t duet_msg_new_worker_register(const duet_msg_origin_t *o, Duet__V1__Role role,
                                           const char *worker_id, const char *control_url,
                                           const char *event_url, uint32_t pages, uint32_t slots,
                                           uint32_t page_tokens, duet_envelope_t **out);
duet_status_t duet_msg_new_state_dump_request(const duet_msg_origin_t *o, int include_requests,
                                              duet_envelope_t **out);
/* StateDump with an empty Load for the caller to fill. */
duet_status_t duet_msg_new_state_dump(const duet_msg_origin_t *o, Duet__V1__Role role, duet_envelope_t **out);

/* Append a pool to a descriptor: kind, fingerprint, page_bytes and n_layers
 * come from `layout` (the one source of sizes, DESIGN §4). */
duet_status_t duet_msg_descriptor_add_pool(Duet__V1__TransferDescriptor *d, const duet_cache_layout_t *layout,
                                           const void *rkey, size_t rkey_len, uint64_t remote_base,
                                           uint32_t n_units);
/* The descriptor's pool of `kind`, or NULL. */
const Duet__V1__PoolDescriptor *duet_msg_descriptor_pool(const Duet__V1__TransferDescriptor *d,
                                                         duet_pool_kind_t kind);
/* Compare a descriptor with the receiver's own layouts (n of them; pools with
 * no layers are skipped): every local pool must appear with the same
 * fingerprint, page_bytes and n_layers, and the descriptor may carry no other
 * pool.  DUET_ERR_LAYOUT_MISMATCH naming the pool otherwise. */
duet_status_t duet_msg_descriptor_check_layouts(const Duet__V1__TransferDescriptor *d,
                                                const duet_cache_layout_t *layouts, size_t n, duet_err_t *err);
/* Append a pool layout to a Capacity. */
duet_status_t duet_msg_capacity_add_pool(Duet__V1__Capacity *c, const duet_cache_layout_t *layout,
                                         uint32_t n_units);
/* Append (state, count) to a Load. */
duet_status_t duet_msg_load_add_state(Duet__V1__Load *l, Duet__V1__RequestState state, uint32_t count);
/* Append a request summary to a StateDump. */
duet_status_t duet_msg_state_dump_add_request(Duet__V1__StateDump *sd, const char *rid, uint64_t epoch,
                                              Duet__V1__RequestState state, uint64_t age_ms, uint32_t n_pages);

/* Can a worker dial this URL to send events (Reserve/Prefill.event_url)?
 * Besides the decoder's checks (length, printable ASCII), it must be an NNG
 * URL of a transport duet uses: ipc://PATH, tcp://HOST:PORT or inproc://NAME,
 * with something after the "://".  DUET_ERR_INVALID naming `field` otherwise;
 * NULL and "" are fine (the worker's own --events). */
duet_status_t duet_msg_check_event_url(const char *url, const char *field, duet_err_t *err);

/* ------------------------------------------------------------------ names and codes */

duet_msg_kind_t duet_msg_kind(const duet_envelope_t *env);
/* "reserve", "transfer_done", ...; "none" for NOT_SET, "unknown" otherwise. */
const char *duet_msg_kind_name(duet_msg_kind_t kind);
/* The envelope's rid, or NULL when it has none (for duet_log_rid). */
const char *duet_msg_rid(const duet_envelope_t *env);
/* Name of an enum value ("ABORT_REASON_TIMEOUT"), "?" when unknown. */
const char *duet_msg_enum_name(const ProtobufCEnumDescriptor *desc, int value);

/* Wire code of an error status (ERROR_CODE_<duet_status_code(st)>); ERROR_CODE_INTERNAL
 * for values outside the table, UNSPECIFIED for DUET_OK. */
Duet__V1__ErrorCode duet_msg_error_code(duet_status_t st);
/* Status of a wire error code; DUET_ERR_PROTOCOL for UNSPECIFIED or unknown codes. */
duet_status_t duet_msg_error_status(Duet__V1__ErrorCode code);

/* Pool kinds and cache dtypes on the wire (value + 1; 0 is UNSPECIFIED). */
Duet__V1__PoolKind duet_msg_pool_to_wire(duet_pool_kind_t kind);
/* DUET_ERR_PROTOCOL for UNSPECIFIED or unknown values. */
duet_status_t duet_msg_pool_from_wire(Duet__V1__PoolKind wire, duet_pool_kind_t *kind);
Duet__V1__CacheDtype duet_msg_dtype_to_wire(duet_cache_dtype_t dt);

#endif
