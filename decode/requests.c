#include "requests.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "hash.h"
#include "time_util.h"

struct duet_dreq_table {
    duet_kv_cache_t *cache;
    uint32_t max_requests, n_live;
    uint32_t cap;              /* hash slots, power of two >= 2 * max_requests */
    duet_dreq_t **slots;       /* open addressing, linear probing, backward-shift deletion */
    uint64_t next_epoch;
    duet_dreq_stats_t counters; /* only the monotonic counters are kept here */
};

const char *duet_req_state_name(duet_req_state_t s)
{
    static const char *const names[] = {"RESERVED", "WAITING_FOR_INPUT", "DECODING", "FINISHED", "ABORTED"};
    return (unsigned)s < DUET_REQ_STATE_COUNT ? names[s] : "UNKNOWN";
}

static uint32_t rid_hash(const duet_dreq_table_t *t, const char *rid)
{
    return (uint32_t)duet_hash64(rid, strlen(rid), 0x64756574) & (t->cap - 1);
}

duet_status_t duet_dreq_table_create(duet_kv_cache_t *cache, uint32_t max_requests, duet_dreq_table_t **out,
                                     duet_err_t *err)
{
    if (max_requests == 0 || max_requests > (1u << 24))
        return duet_err_set(err, DUET_ERR_INVALID, "max_requests %u outside [1, 2^24]", max_requests);
    duet_dreq_table_t *t = DUET_NEW(duet_dreq_table_t);
    if (!t)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    t->cache = cache;
    t->max_requests = max_requests;
    t->cap = 16;
    while (t->cap < 2 * max_requests)
        t->cap *= 2;
    t->slots = duet_calloc(t->cap, sizeof(duet_dreq_t *));
    if (!t->slots) {
        free(t);
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    t->next_epoch = 1;
    *out = t;
    return DUET_OK;
}

static void release_memory(duet_dreq_table_t *t, duet_dreq_t *r)
{
    duet_seq_t *s = &r->seq;
    if (r->quarantined) {
        if (s->n_pages)
            duet_kv_cache_release_pages(t->cache, s->pages, s->n_pages);
        if (s->has_slot)
            duet_kv_cache_release_slot(t->cache, s->slot);
        free(s->pages);
        memset(s, 0, sizeof *s);
        r->quarantined = 0;
    } else {
        duet_seq_release(t->cache, s);
    }
}

static void table_remove_at(duet_dreq_table_t *t, uint32_t i)
{
    t->slots[i] = NULL;
    t->n_live--;
    /* backward-shift: move later entries of the probe run into the hole */
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & (t->cap - 1);
        duet_dreq_t *e = t->slots[j];
        if (!e)
            return;
        uint32_t home = rid_hash(t, e->rid);
        /* e may move to i when i lies cyclically in [home, j) */
        if (((j - home) & (t->cap - 1)) >= ((j - i) & (t->cap - 1))) {
            t->slots[i] = e;
            t->slots[j] = NULL;
            i = j;
        }
    }
}

static int32_t find_index(const duet_dreq_table_t *t, const char *rid)
{
    uint32_t i = rid_hash(t, rid);
    for (uint32_t n = 0; n < t->cap; n++, i = (i + 1) & (t->cap - 1)) {
        if (!t->slots[i])
            return -1;
        if (strcmp(t->slots[i]->rid, rid) == 0)
            return (int32_t)i;
    }
    return -1;
}

static void drop(duet_dreq_table_t *t, duet_dreq_t *r)
{
    int32_t i = find_index(t, r->rid);
    if (i >= 0)
        table_remove_at(t, (uint32_t)i);
    release_memory(t, r);
    free(r);
}

void duet_dreq_table_destroy(duet_dreq_table_t **tp)
{
    if (!tp || !*tp)
        return;
    duet_dreq_table_t *t = *tp;
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->slots[i]) {
            release_memory(t, t->slots[i]);
            free(t->slots[i]);
        }
    free(t->slots);
    free(t);
    *tp = NULL;
}

duet_dreq_t *duet_dreq_find(duet_dreq_table_t *t, const char *rid)
{
    int32_t i = find_index(t, rid);
    return i < 0 ? NULL : t->slots[i];
}

duet_status_t duet_dreq_reserve(duet_dreq_table_t *t, const char *rid, const char *prefill_id, int32_t prompt_len,
                                int32_t max_new_tokens, uint64_t wait_ms, uint64_t now_ns, duet_dreq_t **out,
                                duet_err_t *err)
{
    if (!rid || !*rid || strlen(rid) > DUET_RID_MAX)
        return duet_err_set(err, DUET_ERR_INVALID, "request id must have 1 to %d characters", DUET_RID_MAX);
    if (prefill_id && strlen(prefill_id) > DUET_WORKER_ID_MAX)
        return duet_err_set(err, DUET_ERR_INVALID, "prefill worker id longer than %d", DUET_WORKER_ID_MAX);
    if (prompt_len <= 0 || max_new_tokens < 0)
        return duet_err_set(err, DUET_ERR_INVALID, "prompt_len %d / max_new_tokens %d out of range", prompt_len,
                            max_new_tokens);
    if (find_index(t, rid) >= 0)
        return duet_err_set(err, DUET_ERR_STATE, "request %s is already reserved", rid);
    if (t->n_live >= t->max_requests)
        return duet_err_set(err, DUET_ERR_NO_SPACE, "request table full (%u)", t->max_requests);
    duet_dreq_t *r = DUET_NEW(duet_dreq_t);
    if (!r)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    strcpy(r->rid, rid);
    if (prefill_id)
        strcpy(r->prefill_id, prefill_id);
    duet_status_t st = duet_seq_init(t->cache, &r->seq, err);
    if (st == DUET_OK)
        st = duet_seq_reserve(t->cache, &r->seq, (int64_t)prompt_len + max_new_tokens, err);
    if (st != DUET_OK) {
        duet_seq_release(t->cache, &r->seq);
        free(r);
        return st == DUET_ERR_NOMEM ? st : DUET_ERR_NO_SPACE;
    }
    r->epoch = t->next_epoch++;
    r->prompt_len = prompt_len;
    r->max_new_tokens = max_new_tokens;
    r->created_ns = now_ns;
    r->deadline_ns = now_ns + wait_ms * 1000000ull;
    r->state = DUET_REQ_WAITING_FOR_INPUT;
    uint32_t i = rid_hash(t, rid);
    while (t->slots[i])
        i = (i + 1) & (t->cap - 1);
    t->slots[i] = r;
    t->n_live++;
    *out = r;
    return DUET_OK;
}

duet_status_t duet_dreq_transfer_done(duet_dreq_table_t *t, const char *rid, uint64_t epoch, duet_dreq_t **out)
{
    duet_dreq_t *r = duet_dreq_find(t, rid);
    if (!r) {
        t->counters.stale_transfer_done++;
        return DUET_ERR_NOT_FOUND;
    }
    if (r->epoch != epoch || r->state != DUET_REQ_WAITING_FOR_INPUT) {
        t->counters.stale_transfer_done++;
        return DUET_ERR_STATE;
    }
    r->state = DUET_REQ_DECODING;
    r->deadline_ns = 0;
    if (out)
        *out = r;
    return DUET_OK;
}

duet_status_t duet_dreq_abort(duet_dreq_table_t *t, const char *rid, uint64_t epoch, int reason)
{
    duet_dreq_t *r = duet_dreq_find(t, rid);
    if (!r || (epoch && r->epoch != epoch) || r->state == DUET_REQ_ABORTED || r->state == DUET_REQ_FINISHED)
        return DUET_OK;
    r->abort_reason = reason;
    if (r->state == DUET_REQ_DECODING) {
        /* the prefill worker flushed before TransferDone: nothing can still land */
        drop(t, r);
        return DUET_OK;
    }
    duet_seq_t *s = &r->seq;
    if (s->n_pages)
        duet_kv_cache_quarantine_pages(t->cache, s->pages, s->n_pages);
    if (s->has_slot)
        duet_kv_cache_quarantine_slot(t->cache, s->slot);
    r->quarantined = 1;
    r->state = DUET_REQ_ABORTED;
    r->deadline_ns = 0;
    return DUET_OK;
}

duet_status_t duet_dreq_finish(duet_dreq_table_t *t, const char *rid)
{
    duet_dreq_t *r = duet_dreq_find(t, rid);
    if (!r)
        return DUET_ERR_NOT_FOUND;
    if (r->state != DUET_REQ_DECODING)
        return DUET_ERR_STATE;
    drop(t, r);
    return DUET_OK;
}

int duet_dreq_abort_ack(duet_dreq_table_t *t, const char *rid, uint64_t epoch)
{
    duet_dreq_t *r = duet_dreq_find(t, rid);
    if (!r || !r->quarantined || r->epoch != epoch)
        return 0;
    t->counters.released_by_ack++;
    drop(t, r);
    return 1;
}

int duet_dreq_router_confirms_undelivered(duet_dreq_table_t *t, const char *rid, uint64_t epoch)
{
    duet_dreq_t *r = duet_dreq_find(t, rid);
    if (!r || !r->quarantined || (epoch && r->epoch != epoch))
        return 0;
    t->counters.released_by_router++;
    drop(t, r);
    return 1;
}

int duet_dreq_prefill_dead(duet_dreq_table_t *t, const char *prefill_id)
{
    int n = 0;
    /* collect first: dropping shifts the hash table */
    duet_dreq_t **victims = malloc(sizeof(duet_dreq_t *) * (t->n_live ? t->n_live : 1));
    if (!victims)
        return 0;
    for (uint32_t i = 0; i < t->cap; i++) {
        duet_dreq_t *r = t->slots[i];
        if (r && strcmp(r->prefill_id, prefill_id) == 0 &&
            (r->quarantined || r->state == DUET_REQ_WAITING_FOR_INPUT))
            victims[n++] = r;
    }
    for (int i = 0; i < n; i++) {
        duet_dreq_t *r = victims[i];
        if (!r->quarantined) /* its input can no longer arrive: abort, then release at once */
            duet_dreq_abort(t, r->rid, 0, r->abort_reason);
        t->counters.released_by_peer_death++;
        drop(t, r);
    }
    free(victims);
    return n;
}

int duet_dreq_expire(duet_dreq_table_t *t, uint64_t now_ns, duet_dreq_t **out, int max)
{
    int n = 0;
    for (uint32_t i = 0; i < t->cap && n < max; i++) {
        duet_dreq_t *r = t->slots[i];
        if (r && r->state == DUET_REQ_WAITING_FOR_INPUT && r->deadline_ns && now_ns >= r->deadline_ns) {
            duet_dreq_abort(t, r->rid, 0, DUET_DREQ_REASON_WAIT_DEADLINE);
            out[n++] = r;
        }
    }
    return n;
}

void duet_dreq_foreach(duet_dreq_table_t *t, int (*fn)(duet_dreq_t *r, void *arg), void *arg)
{
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->slots[i] && fn(t->slots[i], arg))
            return;
}

void duet_dreq_stats(const duet_dreq_table_t *t, uint64_t now_ns, duet_dreq_stats_t *out)
{
    *out = t->counters;
    memset(out->by_state, 0, sizeof out->by_state);
    out->quarantined_requests = 0;
    out->oldest_waiting_ns = 0;
    for (uint32_t i = 0; i < t->cap; i++) {
        const duet_dreq_t *r = t->slots[i];
        if (!r)
            continue;
        out->by_state[r->state]++;
        out->quarantined_requests += r->quarantined != 0;
        if (r->state == DUET_REQ_WAITING_FOR_INPUT && now_ns > r->created_ns &&
            now_ns - r->created_ns > out->oldest_waiting_ns)
            out->oldest_waiting_ns = now_ns - r->created_ns;
    }
}
