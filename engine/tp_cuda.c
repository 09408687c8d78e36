/* Tensor-parallel group (contract in tp_cuda.h). */
#include "tp_cuda.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "log.h"
#include "time_util.h"

typedef struct {
    struct duet_tp_cuda *t;
    int rank;
    duet_cuda_t *cu;
    duet_model_cuda_t *mc;
    duet_kv_cache_cuda_t *dc;
    duet_cuda_comm_t *comm;
    pthread_t thread;
    int started;
    /* result of the current job */
    duet_status_t st;
    duet_err_t err;
} rank_t;

struct duet_tp_cuda {
    int size, device0;
    const duet_model_t *m;
    duet_kv_cache_t *host;
    rank_t *ranks;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;  /* job generation: a rank runs a job when gen moves */
    int n_done;
    int first_fail; /* the rank that failed first in this job (-1: none): its error, not a peer's abort */
    int stop;
    int broken;
    duet_err_t broken_err;
    uint32_t timeout_ms;
    /* the job */
    duet_fwd_item_t *items;
    int n_items;
    const duet_fwd_cuda_opts_t *opts;
};

static void abort_all(struct duet_tp_cuda *t)
{
    for (int r = 0; r < t->size; r++)
        duet_cuda_comm_abort(t->ranks[r].comm);
}

static void *rank_main(void *arg)
{
    rank_t *rk = arg;
    struct duet_tp_cuda *t = rk->t;
    duet_status_t bst = duet_cuda_bind(rk->cu);
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && t->gen == seen)
            pthread_cond_wait(&t->go, &t->mu);
        if (t->stop)
            break;
        seen = t->gen;
        duet_fwd_item_t *items = t->items;
        int n_items = t->n_items;
        duet_fwd_cuda_opts_t o = {.no_advance = 1};
        if (rk->rank == 0 && t->opts) {
            o = *t->opts;
            o.no_advance = 1;
        }
        pthread_mutex_unlock(&t->mu);
        duet_err_t e = {0};
        duet_status_t st = bst != DUET_OK ? duet_err_set(&e, bst, "%s", duet_cuda_error(rk->cu)->msg)
                                          : duet_forward_cuda_ex(rk->mc, rk->dc, items, n_items, &o, &e);
        if (st != DUET_OK) {
            pthread_mutex_lock(&t->mu);
            if (t->first_fail < 0)
                t->first_fail = rk->rank;
            pthread_mutex_unlock(&t->mu);
            abort_all(t); /* peers waiting on a collective with this rank end now */
        }
        pthread_mutex_lock(&t->mu);
        rk->st = st;
        rk->err = e;
        t->n_done++;
        pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static uint32_t step_timeout_ms(void)
{
    const char *s = getenv("DUET_TP_STEP_TIMEOUT_MS");
    long v = s ? strtol(s, NULL, 10) : 0;
    return v > 0 && v < 86400000 ? (uint32_t)v : 300000;
}

duet_status_t duet_tp_cuda_open(const duet_model_t *m, duet_kv_cache_t *host, int device0, int size,
                                duet_tp_cuda_t **out, duet_err_t *err)
{
    *out = NULL;
    duet_status_t st = duet_model_cuda_tp_check(&m->cfg, size, err);
    if (st != DUET_OK)
        return st;
    if (device0 < 0)
        return duet_err_set(err, DUET_ERR_INVALID, "device %d", device0);
    struct duet_tp_cuda *t = DUET_NEW(struct duet_tp_cuda);
    if (!t)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    t->size = size;
    t->device0 = device0;
    t->m = m;
    t->host = host;
    t->timeout_ms = step_timeout_ms();
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    t->ranks = duet_calloc((size_t)size, sizeof(rank_t));
    if (!t->ranks) {
        duet_tp_cuda_close(&t);
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    }
    for (int r = 0; r < size; r++) {
        rank_t *rk = &t->ranks[r];
        rk->t = t;
        rk->rank = r;
        if ((st = duet_cuda_create(device0 + r, &rk->cu, err)) == DUET_OK)
            duet_cuda_set_wait_timeout(rk->cu, t->timeout_ms); /* the host's every wait on it: the step's deadline */
        if (st != DUET_OK || (st = duet_model_cuda_upload_tp(rk->cu, m, r, size, &rk->mc, err)) != DUET_OK ||
            (st = duet_kv_cache_cuda_create(rk->cu, host, &rk->dc, err)) != DUET_OK) {
            duet_tp_cuda_close(&t);
            return st;
        }
    }
    if (size > 1) {
        duet_cuda_t *ctx[DUET_TP_MAX];
        duet_cuda_comm_t *comms[DUET_TP_MAX];
        for (int r = 0; r < size; r++)
            ctx[r] = t->ranks[r].cu;
        if ((st = duet_cuda_comm_init_all(ctx, size, comms, err)) != DUET_OK) {
            duet_tp_cuda_close(&t);
            return st;
        }
        for (int r = 0; r < size; r++) {
            t->ranks[r].comm = comms[r];
            duet_model_cuda_set_comm(t->ranks[r].mc, comms[r]);
        }
        for (int r = 0; r < size; r++) {
            if (pthread_create(&t->ranks[r].thread, NULL, rank_main, &t->ranks[r]) != 0) {
                duet_tp_cuda_close(&t);
                return duet_err_set(err, DUET_ERR_NOMEM, "tensor-parallel rank %d: no thread", r);
            }
            t->ranks[r].started = 1;
        }
    }
    *out = t;
    return DUET_OK;
}

static void deadline_after(struct timespec *ts, uint32_t ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

void duet_tp_cuda_close(duet_tp_cuda_t **pt)
{
    if (!pt || !*pt)
        return;
    struct duet_tp_cuda *t = *pt;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    if (t->ranks) {
        if (t->broken)
            abort_all(t); /* a rank still inside a collective leaves it */
        /* a rank is idle between steps, so it ends at once; one of a broken group may still be
         * stuck in its device: it gets a deadline, and if it misses it the group is left as it is
         * (the process is about to end) rather than waited on forever or freed under it */
        struct timespec dl;
        deadline_after(&dl, 10000);
        int stuck = 0;
        for (int r = 0; r < t->size; r++)
            if (t->ranks[r].started && pthread_timedjoin_np(t->ranks[r].thread, NULL, &dl) != 0)
                stuck++;
        if (stuck) {
            duet_error("tensor-parallel group: %d of %d ranks did not stop within 10 s; left running", stuck,
                       t->size);
            *pt = NULL;
            return;
        }
        for (int r = 0; r < t->size; r++) {
            rank_t *rk = &t->ranks[r];
            duet_cuda_comm_destroy(&rk->comm);
            duet_kv_cache_cuda_destroy(&rk->dc);
            duet_model_cuda_destroy(&rk->mc);
            duet_cuda_destroy(&rk->cu);
        }
    }
    free(t->ranks);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->mu);
    free(t);
    *pt = NULL;
}

int duet_tp_cuda_size(const duet_tp_cuda_t *t) { return t->size; }
duet_cuda_t *duet_tp_cuda_context(const duet_tp_cuda_t *t, int rank) { return t->ranks[rank].cu; }
duet_model_cuda_t *duet_tp_cuda_model(const duet_tp_cuda_t *t, int rank) { return t->ranks[rank].mc; }
duet_kv_cache_cuda_t *duet_tp_cuda_cache(const duet_tp_cuda_t *t, int rank) { return t->ranks[rank].dc; }

size_t duet_tp_cuda_weight_bytes(const duet_tp_cuda_t *t)
{
    size_t b = 0;
    for (int r = 0; r < t->size; r++)
        b += duet_model_cuda_weight_bytes(t->ranks[r].mc);
    return b;
}

void duet_tp_cuda_describe(const duet_tp_cuda_t *t, char *buf, size_t len)
{
    duet_cuda_info_t info;
    duet_cuda_info(t->ranks[0].cu, &info);
    if (t->size == 1) {
        snprintf(buf, len, "cuda:%d (%s, sm_%d%d)", t->device0, info.name, info.cc_major, info.cc_minor);
        return;
    }
    char nccl[200];
    duet_cuda_comm_describe(nccl, sizeof nccl);
    snprintf(buf, len, "cuda:%d-%d (%s, sm_%d%d), tensor-parallel over %d GPUs (%s)", t->device0,
             t->device0 + t->size - 1, info.name, info.cc_major, info.cc_minor, t->size, nccl);
}


/* Wait until every rank has reported or the deadline passes (t->mu held). */
static int wait_ranks(struct duet_tp_cuda *t, uint32_t ms)
{
    struct timespec ts;
    deadline_after(&ts, ms);
    while (t->n_done < t->size)
        if (pthread_cond_timedwait(&t->done, &t->mu, &ts) == ETIMEDOUT)
            return t->n_done == t->size;
    return 1;
}

duet_status_t duet_tp_cuda_forward(duet_tp_cuda_t *t, duet_fwd_item_t *items, int n_items,
                                   const duet_fwd_cuda_opts_t *opts, duet_err_t *err)
{
    if (t->size == 1)
        return duet_forward_cuda_ex(t->ranks[0].mc, t->ranks[0].dc, items, n_items, opts, err);
    /* bad items are refused here, before any rank starts: a rank's failure then always means
     * the group itself failed */
    int R = 0;
    duet_status_t vst = duet_fwd_items_check(&t->m->cfg, t->host, items, n_items, opts && opts->logits_dev, &R, err);
    if (vst != DUET_OK)
        return vst;
    if (R == 0)
        return DUET_OK;
    pthread_mutex_lock(&t->mu);
    if (t->broken) {
        if (err)
            *err = t->broken_err;
        pthread_mutex_unlock(&t->mu);
        return DUET_ERR_CUDA;
    }
    t->items = items;
    t->n_items = n_items;
    t->opts = opts;
    t->n_done = 0;
    t->first_fail = -1;
    for (int r = 0; r < t->size; r++)
        t->ranks[r].st = DUET_OK;
    t->gen++;
    pthread_cond_broadcast(&t->go);
    int all = wait_ranks(t, t->timeout_ms);
    if (!all) {
        /* a rank is stuck (a peer that never joined a collective, a hung device): abort the
         * communicators so collectives return, then give the ranks a last bounded wait */
        abort_all(t);
        all = wait_ranks(t, 30000);
    }
    duet_status_t st = DUET_OK;
    duet_err_t first = {0};
    if (all && t->first_fail >= 0) {
        st = t->ranks[t->first_fail].st; /* the rank that failed first; its peers only saw the abort */
        duet_err_set(&first, st, "rank %d: %s", t->first_fail, t->ranks[t->first_fail].err.msg);
    }
    if (!all) {
        st = DUET_ERR_TIMEOUT;
        duet_err_set(&first, st, "tensor-parallel step: %d of %d ranks finished within %u ms", t->n_done, t->size,
                     t->timeout_ms);
    }
    if (st != DUET_OK) {
        /* the ranks' streams are no longer in step: nothing more can run on this group */
        t->broken = 1;
        duet_err_set(&t->broken_err, DUET_ERR_CUDA, "tensor-parallel group is broken: %s", first.msg);
        abort_all(t);
        duet_error("%s", t->broken_err.msg);
    }
    pthread_mutex_unlock(&t->mu);
    if (st != DUET_OK) {
        if (err)
            *err = first;
        return st;
    }
    for (int i = 0; i < n_items; i++)
        items[i].seq->n_past += items[i].n_tokens;
    return DUET_OK;
}

duet_status_t duet_tp_cuda_map_host(duet_tp_cuda_t *t, duet_err_t *err)
{
    for (int r = 0; r < t->size; r++) {
        duet_status_t st = duet_cuda_bind(t->ranks[r].cu);
        if (st == DUET_OK) /* one registration (rank 0's), seen by every device */
            st = r == 0 ? duet_kv_cache_cuda_map_host(t->ranks[r].dc, err)
                        : duet_kv_cache_cuda_map_host_shared(t->ranks[r].dc, t->ranks[0].dc, err);
        else if (err)
            *err = *duet_cuda_error(t->ranks[r].cu);
        if (st != DUET_OK)
            return st;
    }
    return DUET_OK;
}

duet_status_t duet_tp_cuda_stage_queue(duet_tp_cuda_t *t, int layer, const duet_seq_t *const *seqs, uint32_t n,
                                       uint64_t *bytes, duet_err_t *err)
{
    duet_status_t st = t->size > 1 ? duet_cuda_bind(t->ranks[0].cu) : DUET_OK;
    if (st != DUET_OK) {
        if (err)
            *err = *duet_cuda_error(t->ranks[0].cu);
        return st;
    }
    return duet_kv_cache_cuda_stage_queue(t->ranks[0].dc, DUET_STAGE_TO_HOST, layer, seqs, NULL, n, bytes, err);
}

/* passed: NULL marks the fence, else asks whether rank 0's stream has passed it */
static duet_status_t fence_op(duet_tp_cuda_t *t, int slot, int *passed, duet_err_t *err)
{
    duet_cuda_t *c = t->ranks[0].cu;
    duet_status_t st = t->size > 1 ? duet_cuda_bind(c) : DUET_OK;
    if (st == DUET_OK)
        st = passed ? duet_cuda_fence_passed(c, slot, passed) : duet_cuda_fence(c, slot);
    if (st != DUET_OK && err)
        *err = *duet_cuda_error(c);
    return st;
}

duet_status_t duet_tp_cuda_fence(duet_tp_cuda_t *t, int slot, duet_err_t *err) { return fence_op(t, slot, NULL, err); }

uint32_t duet_tp_cuda_step_timeout_ms(const duet_tp_cuda_t *t) { return t->timeout_ms; }

int duet_tp_cuda_lost(duet_tp_cuda_t *t)
{
    pthread_mutex_lock(&t->mu);
    int lost = t->broken;
    pthread_mutex_unlock(&t->mu);
    for (int r = 0; r < t->size && !lost; r++)
        lost = t->ranks[r].cu && duet_cuda_stuck(t->ranks[r].cu);
    return lost;
}

duet_status_t duet_tp_cuda_fence_wait(duet_tp_cuda_t *t, int slot, void (*idle)(void *), void *arg, duet_err_t *err)
{
    uint64_t until = duet_deadline_after_ms(t->timeout_ms);
    for (;;) {
        pthread_mutex_lock(&t->mu);
        int broken = t->broken;
        duet_err_t why = t->broken_err;
        pthread_mutex_unlock(&t->mu);
        if (broken) { /* what the group's streams still hold is unknown: no fence counts as passed */
            if (err)
                *err = why;
            return DUET_ERR_CUDA;
        }
        if (duet_cuda_stuck(t->ranks[0].cu)) { /* an earlier wait on the device passed its deadline */
            if (err)
                duet_err_set(err, DUET_ERR_CUDA, "%s", duet_cuda_error(t->ranks[0].cu)->msg);
            return DUET_ERR_CUDA;
        }
        int passed = 0;
        duet_status_t st = fence_op(t, slot, &passed, err);
        if (st != DUET_OK || passed)
            return st;
        if (duet_time_ns() >= until)
            break;
        if (idle)
            idle(arg);
        else
            sched_yield();
    }
    /* a device that has not reached a mark in a whole step's deadline is stuck, as a rank that has
     * not finished its step: nothing more runs on the group */
    duet_err_t e = {0};
    duet_err_set(&e, DUET_ERR_TIMEOUT, "the GPU has not passed fence %d within %u ms", slot, t->timeout_ms);
    pthread_mutex_lock(&t->mu);
    if (!t->broken) {
        t->broken = 1;
        duet_err_set(&t->broken_err, DUET_ERR_CUDA, "tensor-parallel group is broken: %s", e.msg);
        abort_all(t);
        duet_error("%s", t->broken_err.msg);
    }
    pthread_mutex_unlock(&t->mu);
    if (err)
        *err = e;
    return DUET_ERR_TIMEOUT;
}

duet_status_t duet_tp_cuda_stage(duet_tp_cuda_t *t, duet_stage_dir_t dir, int layer, const duet_seq_t *const *seqs,
                                 const uint32_t *n_pages, uint32_t n, uint64_t *bytes, duet_err_t *err)
{
    int nr = dir == DUET_STAGE_TO_HOST ? 1 : t->size;
    uint64_t total = 0;
    for (int r = 0; r < nr; r++) {
        uint64_t b = 0;
        duet_status_t st = t->size > 1 ? duet_cuda_bind(t->ranks[r].cu) : DUET_OK;
        if (st != DUET_OK) {
            if (err)
                *err = *duet_cuda_error(t->ranks[r].cu);
            return st;
        }
        st = duet_kv_cache_cuda_stage(t->ranks[r].dc, dir, layer, seqs, n_pages, n, &b, err);
        if (st != DUET_OK)
            return st;
        total += b;
    }
    if (bytes)
        *bytes = total;
    return DUET_OK;
}
