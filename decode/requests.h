/* The decode worker's request table: every request's state, deadline, pages
 * and slot, and the quarantine rule of DESIGN §3.
 *
 *   RESERVED ─(descriptor sent)→ WAITING_FOR_INPUT ─(TransferDone, same epoch)→ DECODING
 *       │                              │                                          │
 *       └──────────── abort / deadline ┴→ ABORTED (quarantined)                   ├→ FINISHED (pages freed)
 *                                                                                 └→ ABORTED  (pages freed)
 *
 * A request aborted before its TransferDone arrived may still receive puts
 * from its prefill worker, so its pages and slot go to QUARANTINE, not to the
 * free list.  They are released only when (a) the prefill worker's AbortAck
 * for that epoch arrives (it sends it after flushing its endpoint), (b) that
 * prefill worker is declared dead, or (c) the router confirms the prefill
 * worker never received the descriptor.  After TransferDone the prefill
 * worker has flushed, so a later abort frees the pages at once.
 *
 * The table is not thread-safe: the decode loop owns it. */
#ifndef DUET_DECODE_REQUESTS_H
#define DUET_DECODE_REQUESTS_H

#include <stdint.h>

#include "err.h"
#include "forward.h"
#include "kv_cache.h"

#define DUET_RID_MAX 64
#define DUET_WORKER_ID_MAX 64

typedef enum {
    DUET_REQ_RESERVED = 0,
    DUET_REQ_WAITING_FOR_INPUT,
    DUET_REQ_DECODING,
    DUET_REQ_FINISHED,
    DUET_REQ_ABORTED,
    DUET_REQ_STATE_COUNT,
} duet_req_state_t;

const char *duet_req_state_name(duet_req_state_t s);

/* Abort reasons the table itself uses (the protocol's reasons pass through as ints). */
#define DUET_DREQ_REASON_WAIT_DEADLINE (-1)

typedef struct duet_dreq {
    char rid[DUET_RID_MAX + 1];
    char prefill_id[DUET_WORKER_ID_MAX + 1]; /* the prefill worker that may write into our pages */
    uint64_t epoch;
    duet_req_state_t state;
    int quarantined;              /* pages/slot held until a release condition */
    int abort_reason;             /* caller's reason code, for metrics */
    duet_seq_t seq;               /* pages + slot */
    int32_t prompt_len, max_new_tokens;
    uint64_t created_ns, deadline_ns; /* deadline of the current waiting state (0: none) */
    void *user;                   /* the server's per-request data (sampling, output) */
} duet_dreq_t;

typedef struct duet_dreq_table duet_dreq_table_t;

typedef struct {
    uint32_t by_state[DUET_REQ_STATE_COUNT];
    uint32_t quarantined_requests;
    uint64_t oldest_waiting_ns;   /* age of the oldest WAITING_FOR_INPUT request, 0 if none */
    uint64_t stale_transfer_done; /* TransferDone for an unknown rid or another epoch */
    uint64_t released_by_ack, released_by_peer_death, released_by_router;
} duet_dreq_stats_t;

duet_status_t duet_dreq_table_create(duet_kv_cache_t *cache, uint32_t max_requests, duet_dreq_table_t **out,
                                     duet_err_t *err);
/* Release everything (quarantined memory included: the caller has closed the transport). */
void duet_dreq_table_destroy(duet_dreq_table_t **t);

/* Reserve pages for prompt_len + max_new_tokens tokens and a slot; the request
 * enters WAITING_FOR_INPUT with deadline now + wait_ms and a fresh epoch.
 * DUET_ERR_NO_SPACE (nothing taken) when pages, slots or table entries run
 * out; DUET_ERR_STATE when the rid is already present. */
duet_status_t duet_dreq_reserve(duet_dreq_table_t *t, const char *rid, const char *prefill_id, int32_t prompt_len,
                                int32_t max_new_tokens, uint64_t wait_ms, uint64_t now_ns, duet_dreq_t **out,
                                duet_err_t *err);

duet_dreq_t *duet_dreq_find(duet_dreq_table_t *t, const char *rid);

/* TransferDone: the request must be WAITING_FOR_INPUT with this epoch; then it
 * becomes DECODING.  Anything else is counted as stale and refused with
 * DUET_ERR_STATE (unknown rid: DUET_ERR_NOT_FOUND); nothing changes. */
duet_status_t duet_dreq_transfer_done(duet_dreq_table_t *t, const char *rid, uint64_t epoch, duet_dreq_t **out);

/* Abort (idempotent: an unknown rid or a finished/aborted one is OK).  epoch 0
 * matches any epoch.  Before TransferDone: ABORTED + quarantine; after it:
 * ABORTED + pages freed and the entry removed. */
duet_status_t duet_dreq_abort(duet_dreq_table_t *t, const char *rid, uint64_t epoch, int reason);

/* The request finished decoding: pages freed, entry removed. */
duet_status_t duet_dreq_finish(duet_dreq_table_t *t, const char *rid);

/* Release conditions (a), (b), (c). Each returns the number of requests released. */
int duet_dreq_abort_ack(duet_dreq_table_t *t, const char *rid, uint64_t epoch);
int duet_dreq_prefill_dead(duet_dreq_table_t *t, const char *prefill_id);
int duet_dreq_router_confirms_undelivered(duet_dreq_table_t *t, const char *rid, uint64_t epoch);

/* Requests in WAITING_FOR_INPUT past their deadline become ABORTED
 * (quarantined); up to `max` of them are written to out[] (pointers stay valid
 * until the next table call) so the caller can tell the router.  Returns the
 * count written. */
int duet_dreq_expire(duet_dreq_table_t *t, uint64_t now_ns, duet_dreq_t **out, int max);

/* Iterate all live entries (order unspecified): fn returns non-zero to stop. */
void duet_dreq_foreach(duet_dreq_table_t *t, int (*fn)(duet_dreq_t *r, void *arg), void *arg);

void duet_dreq_stats(const duet_dreq_table_t *t, uint64_t now_ns, duet_dreq_stats_t *out);

#endif
