/* duet-scripted-decode: a decode worker for tests whose "model" is a script.
 *
 * It speaks the real protocol: Reserve -> Reserved with a transfer descriptor
 * made by its own data-plane engine over its own cache pools (the layouts a
 * real decode worker of the same model and cache options has, so prefill
 * accepts them); prefill pushes the prompt's pages into it over UCX; on
 * TransferDone it streams a chosen token sequence as TokenChunks and ends with
 * RequestFinished.  Abort, quarantine and StateDump behave as decode's do.
 * The router under test cannot tell it from duet-decode, but the tokens it
 * streams are known in advance: a DSML tool call, a malformed block, ...
 *
 *   duet-scripted-decode [duet-decode flags] --script FILE.json [--tokenizer FILE]
 *
 * FILE.json: {"outputs": {"NAME": "text", ...}}.  A request whose sampling
 * seed is n gets the n-th output in the file's order (1-based; seed 0 and
 * seeds past the end get the first); the text is tokenized with special
 * tokens allowed and followed by EOS. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "duet_config.h"
#include "kv_cache.h"
#include "log.h"
#include "model_config.h"
#include "msg.h"
#include "msg_xfer.h"
#include "time_util.h"
#include "tokenizer.h"
#include "worker_opts.h"
#include "xfer.h"

#define MAX_OUTPUTS 16
#define MAX_PAGES 4096
#define TOKEN_EVERY_MS 2

enum { S_WAITING = 1, S_QUARANTINED, S_STREAMING };

typedef struct sreq {
    struct sreq *next;
    char rid[DUET_MSG_MAX_ID_LEN + 1];
    uint64_t epoch;
    int state;
    uint32_t pages[MAX_PAGES];
    uint32_t n_pages, slot;
    uint32_t prompt_len, max_new;
    const int32_t *script;
    uint32_t n_script, pos;
    uint64_t next_ns, created_ns;
} sreq_t;

typedef struct {
    duet_worker_opts_t o;
    duet_model_config_t cfg;
    duet_kv_cache_t *cache;
    duet_xfer_t *xfer;
    duet_ctl_server_t *srv;
    duet_ctl_pusher_t *push;
    int32_t *outputs[MAX_OUTPUTS];
    uint32_t n_output[MAX_OUTPUTS];
    int n_outputs;
    sreq_t *head;
    uint64_t next_epoch, last_hb_ns;
} sd_t;

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { (void)s; g_stop = 1; }

static duet_msg_origin_t origin(sd_t *s, const char *rid, uint64_t epoch)
{
    return (duet_msg_origin_t){.sender_id = s->o.id, .rid = rid, .epoch = epoch};
}

static void push(sd_t *s, duet_envelope_t *ev)
{
    if (ev && s->push) {
        duet_err_t err = {0};
        duet_ctl_pusher_send(s->push, ev, duet_deadline_after_ms(50), &err);
    }
    duet_envelope_free(&ev);
}

static void finished(sd_t *s, sreq_t *r, Duet__V1__FinishReason why, Duet__V1__AbortReason ab)
{
    duet_msg_origin_t o = origin(s, r->rid, r->epoch);
    duet_envelope_t *ev = NULL;
    if (duet_msg_new_request_finished(&o, why, r->prompt_len, r->pos, &ev) == DUET_OK) {
        ev->request_finished->abort_reason = ab;
        push(s, ev);
    }
}

static sreq_t *find(sd_t *s, const char *rid, uint64_t epoch)
{
    for (sreq_t *r = s->head; r; r = r->next)
        if (!strcmp(r->rid, rid) && (!epoch || r->epoch == epoch))
            return r;
    return NULL;
}

/* Remove a request; its pages go back to the free list (quarantined ones are released). */
static void drop(sd_t *s, sreq_t *r)
{
    sreq_t **pp = &s->head;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp)
        *pp = r->next;
    if (r->state == S_QUARANTINED) {
        duet_kv_cache_release_pages(s->cache, r->pages, r->n_pages);
        duet_kv_cache_release_slot(s->cache, r->slot);
    } else {
        duet_kv_cache_free_pages(s->cache, r->pages, r->n_pages);
        duet_kv_cache_free_slot(s->cache, r->slot);
    }
    free(r);
}

static void quarantine(sd_t *s, sreq_t *r)
{
    duet_kv_cache_quarantine_pages(s->cache, r->pages, r->n_pages);
    duet_kv_cache_quarantine_slot(s->cache, r->slot);
    r->state = S_QUARANTINED;
}

static duet_status_t on_reserve(sd_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    const Duet__V1__Reserve *rv = req->reserve;
    const char *rid = req->header->rid;
    duet_msg_origin_t o = origin(s, rid, 0);
    duet_err_t err = {0};
    if (find(s, rid, 0))
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_DUPLICATE_RID, "duplicate", 0, reply);
    uint32_t pt = (uint32_t)s->o.cache.page_tokens;
    uint32_t total = (uint32_t)(((uint64_t)rv->prompt_len + rv->max_new_tokens + pt - 1) / pt);
    uint32_t prompt_pages = (rv->prompt_len + pt - 1) / pt;
    sreq_t *r = calloc(1, sizeof *r);
    if (!r)
        return DUET_ERR_NOMEM;
    if (total > MAX_PAGES || duet_kv_cache_alloc_pages(s->cache, total, r->pages) != DUET_OK) {
        free(r);
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_NO_PAGES, "no pages", 50, reply);
    }
    if (duet_kv_cache_alloc_slot(s->cache, &r->slot) != DUET_OK) {
        duet_kv_cache_free_pages(s->cache, r->pages, total);
        free(r);
        return duet_msg_new_rejected(&o, DUET__V1__REJECT_REASON__REJECT_REASON_NO_SLOTS, "no slots", 50, reply);
    }
    snprintf(r->rid, sizeof r->rid, "%s", rid);
    r->n_pages = total;
    r->epoch = ++s->next_epoch;
    r->prompt_len = rv->prompt_len;
    r->max_new = rv->max_new_tokens;
    r->state = S_WAITING;
    r->created_ns = duet_time_ns();
    uint64_t seed = rv->sampling ? rv->sampling->seed : 0;
    int k = seed >= 1 && seed <= (uint64_t)s->n_outputs ? (int)seed - 1 : 0;
    r->script = s->outputs[k];
    r->n_script = s->n_output[k];
    uint32_t wait = rv->deadline_ms ? rv->deadline_ms : 30000;
    duet_xfer_desc_t desc;
    memset(&desc, 0, sizeof desc);
    duet_status_t st = duet_xfer_recv_expect(s->xfer, rid, r->epoch, r->pages, prompt_pages, r->slot,
                                             duet_deadline_after_ms((uint64_t)wait + 60000), 0, &desc, &err);
    Duet__V1__TransferDescriptor *td = NULL;
    if (st == DUET_OK)
        st = duet_msg_descriptor_from_xfer(&desc, s->o.id, &td);
    o.epoch = r->epoch;
    if (st == DUET_OK)
        st = duet_msg_new_reserved(&o, s->o.id, desc.address, desc.address_len, desc.page_tokens, desc.slot, reply);
    duet_xfer_desc_fini(&desc);
    if (st != DUET_OK) {
        if (td)
            duet_msg_free(&td->base);
        duet_kv_cache_free_pages(s->cache, r->pages, r->n_pages);
        duet_kv_cache_free_slot(s->cache, r->slot);
        free(r);
        return duet_msg_new_error(&o, st, err.msg[0] ? err.msg : "reservation failed", reply);
    }
    duet_msg_free(&(*reply)->reserved->descriptor->base);
    (*reply)->reserved->descriptor = td;
    r->next = s->head;
    s->head = r;
    return DUET_OK;
}

static duet_status_t on_abort(sd_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    const char *rid = req->header->rid;
    duet_msg_origin_t o = origin(s, rid, req->header->epoch);
    sreq_t *r = find(s, rid, req->header->epoch);
    if (!r)
        return duet_msg_new_abort_ack(&o, 0, DUET__V1__REQUEST_STATE__REQUEST_STATE_UNSPECIFIED, 0, 0, reply);
    Duet__V1__RequestState was = r->state == S_WAITING     ? DUET__V1__REQUEST_STATE__REQUEST_STATE_WAITING_FOR_INPUT
                                 : r->state == S_STREAMING ? DUET__V1__REQUEST_STATE__REQUEST_STATE_DECODING
                                                           : DUET__V1__REQUEST_STATE__REQUEST_STATE_ABORTED;
    uint32_t q = 0;
    if (r->state == S_STREAMING) {
        finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT, req->abort->reason);
        drop(s, r);
    } else {
        if (r->state == S_WAITING) {
            finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT, req->abort->reason);
            duet_xfer_recv_cancel(s->xfer, r->rid, r->epoch);
            quarantine(s, r);
        }
        q = r->n_pages;
        if (req->abort->prefill_quiesced) {
            drop(s, r);
            q = 0;
        }
    }
    return duet_msg_new_abort_ack(&o, 1, was, 0, q, reply);
}

static void fill_load(sd_t *s, Duet__V1__Load *l)
{
    uint32_t np = duet_kv_cache_n_pages(s->cache), ns = duet_kv_cache_n_slots(s->cache);
    l->pages_free = duet_kv_cache_free_page_count(s->cache);
    l->pages_quarantined = duet_kv_cache_quarantined_page_count(s->cache);
    l->pages_used = np - l->pages_free - l->pages_quarantined;
    l->slots_free = duet_kv_cache_free_slot_count(s->cache);
    l->slots_quarantined = duet_kv_cache_quarantined_slot_count(s->cache);
    l->slots_used = ns - l->slots_free - l->slots_quarantined;
    uint32_t n[3] = {0, 0, 0};
    uint64_t oldest = 0, now = duet_time_ns();
    for (sreq_t *r = s->head; r; r = r->next) {
        n[r->state - 1]++;
        if (r->state == S_WAITING && now - r->created_ns > oldest)
            oldest = now - r->created_ns;
    }
    if (n[0])
        duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_WAITING_FOR_INPUT, n[0]);
    if (n[1])
        duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_ABORTED, n[1]);
    if (n[2])
        duet_msg_load_add_state(l, DUET__V1__REQUEST_STATE__REQUEST_STATE_DECODING, n[2]);
    l->oldest_waiting_age_ms = oldest / 1000000ull;
    l->queue_len = n[0];
}

static duet_status_t on_state(sd_t *s, const duet_envelope_t *req, duet_envelope_t **reply)
{
    duet_msg_origin_t o = origin(s, NULL, 0);
    duet_status_t st = duet_msg_new_state_dump(&o, DUET__V1__ROLE__ROLE_DECODE, reply);
    if (st != DUET_OK)
        return st;
    fill_load(s, (*reply)->state_dump->load);
    if (req->state_dump_request->include_requests) {
        uint64_t now = duet_time_ns();
        for (sreq_t *r = s->head; r; r = r->next)
            duet_msg_state_dump_add_request((*reply)->state_dump, r->rid, r->epoch,
                                            r->state == S_WAITING ? DUET__V1__REQUEST_STATE__REQUEST_STATE_WAITING_FOR_INPUT
                                            : r->state == S_STREAMING ? DUET__V1__REQUEST_STATE__REQUEST_STATE_DECODING
                                                                      : DUET__V1__REQUEST_STATE__REQUEST_STATE_ABORTED,
                                            (now - r->created_ns) / 1000000ull, r->n_pages);
    }
    return DUET_OK;
}

static duet_status_t handler(const duet_envelope_t *req, duet_envelope_t **reply, void *arg)
{
    sd_t *s = arg;
    switch (duet_msg_kind(req)) {
    case DUET__V1__ENVELOPE__BODY_RESERVE: return on_reserve(s, req, reply);
    case DUET__V1__ENVELOPE__BODY_ABORT: return on_abort(s, req, reply);
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST: return on_state(s, req, reply);
    default: {
        duet_msg_origin_t o = origin(s, duet_msg_rid(req), 0);
        return duet_msg_new_error(&o, DUET_ERR_PROTOCOL, "decode does not serve this command", reply);
    }
    }
}

static void on_recv(sd_t *s, const duet_xfer_event_t *ev)
{
    sreq_t *r = find(s, ev->rid, ev->epoch);
    if (!r)
        return;
    if (r->state == S_QUARANTINED) {
        drop(s, r); /* the sender is done with these pages, one way or the other */
        return;
    }
    if (r->state != S_WAITING)
        return;
    if (ev->status == DUET_OK) {
        r->state = S_STREAMING;
        r->next_ns = duet_time_ns();
        return;
    }
    finished(s, r, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT, DUET__V1__ABORT_REASON__ABORT_REASON_PEER_FAILURE);
    drop(s, r);
}

static void stream_step(sd_t *s)
{
    uint64_t now = duet_time_ns();
    for (sreq_t *r = s->head, *next; r; r = next) {
        next = r->next;
        if (r->state != S_STREAMING || now < r->next_ns)
            continue;
        r->next_ns = now + TOKEN_EVERY_MS * 1000000ull;
        int32_t tok = r->pos < r->n_script ? r->script[r->pos] : s->cfg.eos_token_id;
        duet_msg_origin_t o = origin(s, r->rid, r->epoch);
        duet_envelope_t *ev = NULL;
        if (duet_msg_new_token_chunk(&o, r->pos, &tok, 1, &ev) == DUET_OK)
            push(s, ev);
        r->pos++;
        if (tok == s->cfg.eos_token_id || r->pos >= r->max_new) {
            finished(s, r, tok == s->cfg.eos_token_id ? DUET__V1__FINISH_REASON__FINISH_REASON_STOP
                                                      : DUET__V1__FINISH_REASON__FINISH_REASON_LENGTH,
                     DUET__V1__ABORT_REASON__ABORT_REASON_UNSPECIFIED);
            drop(s, r);
        }
    }
}

static int load_script(sd_t *s, const char *path, const char *tok_path)
{
    duet_err_t err = {0};
    duet_tok_t *tok = NULL;
    if (duet_tok_create(tok_path, NULL, &tok, &err) != DUET_OK) {
        fprintf(stderr, "duet-scripted-decode: %s\n", duet_err_text(&err));
        return -1;
    }
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je), *outs = json_object_get(j, "outputs");
    if (!json_is_object(outs)) {
        fprintf(stderr, "duet-scripted-decode: %s: no \"outputs\" object\n", path);
        duet_tok_destroy(&tok);
        json_decref(j);
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(outs, key, v) {
        if (s->n_outputs >= MAX_OUTPUTS || !json_is_string(v))
            continue;
        duet_tok_ids_t ids = {0};
        duet_tok_encode(tok, json_string_value(v), json_string_length(v), true, &ids, &err);
        int32_t eos = s->cfg.eos_token_id;
        duet_tok_ids_push(&ids, &eos, 1);
        s->outputs[s->n_outputs] = ids.ids;
        s->n_output[s->n_outputs++] = (uint32_t)ids.len;
        duet_info("script output %d '%s': %zu tokens", s->n_outputs, key, ids.len);
    }
    json_decref(j);
    duet_tok_destroy(&tok);
    return s->n_outputs ? 0 : -1;
}

int main(int argc, char **argv)
{
    sd_t S;
    memset(&S, 0, sizeof S);
    duet_err_t err = {0};
    duet_log_init_from_env();
    duet_log_set_ident("duet-scripted-decode");
    const char *script = NULL, *tok_path = DUET_SOURCE_ROOT "/data/tokenizer/deepseek-v4/tokenizer.json";
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--script"))
            script = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--tokenizer"))
            tok_path = argv[++i];
        else
            args[n++] = argv[i];
    }
    if (!script || duet_worker_opts_parse(&S.o, "decode", n, args, &err) != DUET_OK) {
        fprintf(stderr, "usage: duet-scripted-decode [duet-decode flags] --script FILE.json (%s)\n",
                duet_err_text(&err));
        free(args);
        return 2;
    }
    free(args);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", S.o.model);
    int rc = 1;
    if (duet_model_config_load(cfg_path, &S.cfg, &err) != DUET_OK ||
        duet_kv_cache_create(&S.cfg, &S.o.cache, S.o.pages, S.o.slots, &S.cache, &err) != DUET_OK)
        goto fail;
    if (load_script(&S, script, tok_path) != 0)
        goto done;
    duet_xfer_opts_t xo = {.name = S.o.id};
    if (duet_xfer_create(&xo, &S.xfer, &err) != DUET_OK || duet_xfer_register_cache(S.xfer, S.cache, &err) != DUET_OK)
        goto fail;
    duet_ctl_opts_t co = {.url = S.o.listen, .sender_id = S.o.id};
    if (duet_ctl_server_create(&co, handler, &S, &S.srv, &err) != DUET_OK)
        goto fail;
    if (S.o.events) {
        duet_ctl_opts_t po = {.url = S.o.events, .queue_len = 65536};
        if (duet_ctl_pusher_create(&po, &S.push, &err) != DUET_OK)
            goto fail;
    }
    duet_info("%s: scripted decode worker on %s", S.o.id, S.o.listen);
    while (!g_stop) {
        duet_ctl_server_poll(S.srv, duet_deadline_after_ms(1), NULL);
        duet_xfer_event_t ev[16];
        uint32_t k;
        while ((k = duet_xfer_poll(S.xfer, ev, 16)) > 0)
            for (uint32_t i = 0; i < k; i++)
                if (ev[i].kind == DUET_XFER_EV_RECV)
                    on_recv(&S, &ev[i]);
        stream_step(&S);
        uint64_t now = duet_time_ns();
        if (S.push && now - S.last_hb_ns > (uint64_t)S.o.heartbeat_ms * 1000000ull) {
            S.last_hb_ns = now;
            duet_msg_origin_t o = origin(&S, NULL, 0);
            duet_envelope_t *hb = NULL;
            if (duet_msg_new_heartbeat(&o, DUET__V1__ROLE__ROLE_DECODE, &hb) == DUET_OK) {
                fill_load(&S, hb->heartbeat->load);
                push(&S, hb);
            }
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "duet-scripted-decode: %s\n", duet_err_text(&err));
done:
    while (S.head) {
        finished(&S, S.head, DUET__V1__FINISH_REASON__FINISH_REASON_ABORT,
                 DUET__V1__ABORT_REASON__ABORT_REASON_WORKER_SHUTDOWN);
        drop(&S, S.head);
    }
    duet_ctl_server_destroy(&S.srv);
    duet_ctl_pusher_destroy(&S.push);
    duet_xfer_destroy(&S.xfer);
    duet_kv_cache_destroy(&S.cache);
    for (int i = 0; i < S.n_outputs; i++)
        free(S.outputs[i]);
    duet_worker_opts_fini(&S.o);
    return rc;
}
