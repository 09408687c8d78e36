#include "worker_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "duet_config.h"
#include "log.h"
#include "time_util.h"

#if DUET_HAVE_CUDA
#include "tp_cuda.h"

static duet_status_t gpu_open(duet_worker_engine_t *e, duet_err_t *err)
{
    duet_tp_cuda_t *t = NULL;
    uint64_t t0 = duet_time_ns();
    /* every kernel loaded when CUDA starts, not at its first launch: loading one can wait for the
     * device to go idle, which a stuck device never does, and that wait has no deadline (seen on
     * the H200: a prefill worker's first forward queued behind a held device blocked in its launches
     * until the device came back, past the step deadline).  A first use late in a worker's life
     * would also stall that step.  Unless the operator chose otherwise. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    duet_status_t st = duet_tp_cuda_open(e->model, e->cache, e->device, e->tp, &t, err);
    if (st != DUET_OK)
        return st;
    e->gpu = t;
    if ((st = duet_tp_cuda_map_host(t, err)) != DUET_OK)
        return st;
    size_t pools = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        pools += duet_kv_cache_pool_bytes(e->cache, (duet_pool_kind_t)k);
    char what[400];
    duet_tp_cuda_describe(t, what, sizeof what);
    duet_info("device %s: %.3f GB of weights uploaded, %.1f MB of device pools mirroring the host pools%s, in "
              "%.2f s",
              what, duet_tp_cuda_weight_bytes(t) / 1e9, pools / 1e6, e->tp > 1 ? " on every GPU" : "",
              (duet_time_ns() - t0) / 1e9);
    duet_cuda_t *c0 = duet_tp_cuda_context(t, 0);
    const char *ph = getenv("DUET_CUDA_PHASES"); /* rank 0's forward calls timed by phase (log_stats) */
    if (ph && strcmp(ph, "0") != 0 && duet_cuda_phases_enable(c0, 1) != DUET_OK) {
        if (err)
            *err = *duet_cuda_error(c0);
        return DUET_ERR_CUDA;
    }
    size_t bytes = (size_t)e->logit_rows * (size_t)e->model->cfg.vocab_size * sizeof(float);
    if (duet_cuda_host_alloc(c0, (void **)&e->logits, bytes) != DUET_OK) {
        e->logits = NULL;
        if (err)
            *err = *duet_cuda_error(c0);
        return DUET_ERR_CUDA;
    }
    return DUET_OK;
}

/* ---- the data plane's memory (duet_worker_engine_xfer_prepare / _register) ---- */

/* What the data plane's progress thread uses: a context of its own on rank 0's GPU (a context
 * serves one thread at a time) and the pinned bounce buffer of the staging ops. */
typedef struct {
    duet_cuda_t *cu;
    void *bounce;
    duet_xfer_staging_t ops;
} xfer_gpu_t;

#define XFER_BOUNCE_BYTES ((size_t)32 << 20)

static duet_status_t xfer_copy(void *ctx, const duet_xfer_copy_t *copies, uint32_t n)
{
    xfer_gpu_t *x = ctx;
    duet_cuda_copy_t list[256];
    for (uint32_t i = 0; i < n;) {
        uint32_t k = 0;
        for (; k < 256 && i < n; k++, i++)
            list[k] = (duet_cuda_copy_t){.dst = copies[i].dst, .src = copies[i].src, .bytes = copies[i].bytes};
        duet_status_t st = duet_cuda_copy_list(x->cu, list, k);
        if (st != DUET_OK)
            return st;
    }
    return duet_cuda_sync(x->cu);
}

static duet_status_t xfer_thread_init(void *arg)
{
    xfer_gpu_t *x = arg;
    return duet_cuda_bind(x->cu);
}

static void xfer_gpu_close(duet_worker_engine_t *e)
{
    xfer_gpu_t *x = e->xfer_gpu;
    if (!x)
        return;
    if (x->bounce)
        duet_cuda_host_free(x->cu, x->bounce);
    duet_cuda_destroy(&x->cu);
    free(x);
    e->xfer_gpu = NULL;
}

static void gpu_close(duet_worker_engine_t *e)
{
    duet_tp_cuda_t *t = e->gpu;
    if (duet_worker_engine_gpu_lost(e))
        return; /* freeing would wait for a device that may never finish: the process ends anyway */
    xfer_gpu_close(e);
    if (!t)
        return;
    duet_cuda_t *c0 = duet_tp_cuda_context(t, 0);
    if (e->logits)
        duet_cuda_host_free(c0, e->logits);
    duet_cuda_free(c0, e->dlogits);
    duet_cuda_free(c0, e->dids);
    e->logits = NULL;
    e->dlogits = NULL;
    e->dids = NULL;
    duet_tp_cuda_close(&t);
    e->gpu = NULL;
}
#endif

duet_status_t duet_worker_engine_open(duet_worker_engine_t *e, const duet_worker_opts_t *o,
                                      const duet_model_t *model, duet_kv_cache_t *cache, uint32_t logit_rows,
                                      duet_err_t *err)
{
    memset(e, 0, sizeof *e);
    e->model = model;
    e->cache = cache;
    e->device = o->device;
    e->tp = o->tp ? (int)o->tp : 1;
    e->host_mirror = o->hicache_device_pages || o->hicache_host_gib > 0;
    e->logit_rows = logit_rows ? logit_rows : 1;
    const char *dh = getenv("DUET_DRAW_HOST");
    e->draw_host = dh && strcmp(dh, "1") == 0;
    const char *th = getenv("DUET_TEST_GPU_HOLD");
    if (th && *th) {
        unsigned at = 0, ms = 0;
        char end = 0;
        if (strspn(th, "0123456789:") != strlen(th) || sscanf(th, "%u:%u%c", &at, &ms, &end) != 2 || at == 0 ||
            ms == 0 || ms > 600000)
            return duet_err_set(err, DUET_ERR_INVALID,
                                "DUET_TEST_GPU_HOLD=%s: want N:MS (the Nth forward, from 1; 1 to 600000 ms)", th);
        e->test_hold_at = at;
        e->test_hold_ms = ms;
    }
    duet_status_t st = duet_worker_opts_check_device(o, err);
    if (st != DUET_OK)
        return st;
    if (e->device >= 0) {
#if DUET_HAVE_CUDA
    {
        duet_status_t gst = gpu_open(e, err);
        if (gst != DUET_OK)
            gpu_close(e);
        return gst;
    }
#endif
    }
    e->logits = duet_malloc_array((size_t)e->logit_rows * (size_t)model->cfg.vocab_size, sizeof(float));
    if (!e->logits)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory for %u rows of logits", e->logit_rows);
    return DUET_OK;
}

void duet_worker_engine_close(duet_worker_engine_t *e)
{
#if DUET_HAVE_CUDA
    if (e->gpu) {
        gpu_close(e);
        return;
    }
#endif
    free(e->logits);
    e->logits = NULL;
}

int duet_worker_engine_draw_threads(void)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    return ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
}

/* A step's draws into the counters (host ones, or the GPU's): rows, and the time since t0 (a
 * step with none is not counted). */
static void count_draws(duet_worker_engine_t *e, int rows, uint64_t t0, int on_gpu)
{
    if (rows <= 0)
        return;
    uint64_t ns = duet_time_ns() - t0;
    if (on_gpu) {
        e->gpu_draw_rows += (uint64_t)rows;
        e->gpu_draw_steps++;
        e->gpu_draw_ns += ns;
        return;
    }
    e->draw_rows += (uint64_t)rows;
    e->draw_steps++;
    e->draw_ns += ns;
}

void duet_worker_engine_log_draws(const duet_worker_engine_t *e, const char *who)
{
    duet_info("%s: rows drawn on the host: %llu of %llu, in %llu of %llu steps, %.1f a step, %.2f ms a step (%s)",
              who, (unsigned long long)e->draw_rows, (unsigned long long)e->step_rows,
              (unsigned long long)e->draw_steps, (unsigned long long)e->steps,
              e->draw_steps ? (double)e->draw_rows / e->draw_steps : 0.0,
              e->draw_steps ? e->draw_ns / 1e6 / e->draw_steps : 0.0,
              e->gpu ? "the sampled rows' logits downloaded and drawn" : "every row drawn");
    if (e->gpu)
        duet_info("%s: sampled rows drawn on the GPU: %llu, in %llu steps, %.1f a step, %.3f ms a step (argmax, "
                  "draw and the ids' download)",
                  who, (unsigned long long)e->gpu_draw_rows, (unsigned long long)e->gpu_draw_steps,
                  e->gpu_draw_steps ? (double)e->gpu_draw_rows / e->gpu_draw_steps : 0.0,
                  e->gpu_draw_steps ? e->gpu_draw_ns / 1e6 / e->gpu_draw_steps : 0.0);
}

#if DUET_HAVE_CUDA
/* The device rows a forward's logits go to and their ids (allocated at the first call). */
static duet_status_t dev_logits(duet_worker_engine_t *e, duet_cuda_t *c0, duet_err_t *err)
{
    if (e->dids)
        return DUET_OK;
    size_t V = (size_t)e->model->cfg.vocab_size;
    float *dl = NULL;
    int32_t *di = NULL;
    if (duet_cuda_bind(c0) != DUET_OK ||
        duet_cuda_malloc(c0, (void **)&dl, sizeof(float) * V * e->logit_rows) != DUET_OK ||
        duet_cuda_malloc(c0, (void **)&di, sizeof(int32_t) * e->logit_rows) != DUET_OK) {
        duet_cuda_free(c0, dl);
        if (err)
            *err = *duet_cuda_error(c0);
        return DUET_ERR_CUDA;
    }
    e->dlogits = dl;
    e->dids = di;
    return DUET_OK;
}
#endif

/* Tokens for the nr logits rows of a step: row k is item it[k]'s, drawn with sp[it[k]] at
 * position pos[it[k]] into tok[it[k]].  On the CPU the rows are in e->logits and every
 * one is drawn here, on up to `threads` threads.  On the GPU they are in e->dlogits: every row's
 * argmax, the sampled rows drawn on the device (duet_cuda_sample) or, with e->draw_host or a
 * vocabulary beyond the device draw's, their logits downloaded (one download a run of
 * consecutive rows) and drawn here; otherwise only ids come back.  `count`: into the draw
 * counters (decode's steps). */
static duet_status_t pick_tokens(duet_worker_engine_t *e, int nr, const int *it, const duet_sampling_t *const *sp,
                                 const int64_t *pos, int32_t *tok, int threads, int count, duet_err_t *err)
{
    size_t V = (size_t)e->model->cfg.vocab_size;
    const int dev = e->gpu != NULL;
    int *rows = malloc(sizeof(int) * (size_t)nr);
    const duet_sampling_t **sp2 = malloc(sizeof(*sp2) * (size_t)nr);
    int64_t *pos2 = malloc(sizeof(int64_t) * (size_t)nr);
    int32_t *out2 = malloc(sizeof(int32_t) * (size_t)nr);
    duet_status_t st = DUET_OK;
    if (!rows || !sp2 || !pos2 || !out2) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        goto out;
    }
    int nd = 0; /* the rows drawn (on the GPU: the sampled ones) */
    for (int k = 0; k < nr; k++)
        if (!dev || sp[it[k]]->temperature > 0.0f)
            rows[nd++] = k;
    uint64_t t0 = duet_time_ns();
#if DUET_HAVE_CUDA
    if (dev) {
        duet_cuda_t *c0 = duet_tp_cuda_context(e->gpu, 0);
        int on_gpu = !e->draw_host && V <= DUET_CUDA_SAMPLE_MAX_VOCAB;
        if (duet_cuda_bind(c0) != DUET_OK || duet_cuda_argmax(c0, e->dlogits, nr, (int)V, e->dids) != DUET_OK)
            goto cuda_fail;
        if (on_gpu && nd > 0) {
            duet_cuda_sample_row_t *sr = malloc(sizeof(*sr) * (size_t)nd);
            if (!sr) {
                st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
                goto out;
            }
            for (int j = 0; j < nd; j++) {
                const duet_sampling_t *s = sp[it[rows[j]]];
                sr[j] = (duet_cuda_sample_row_t){.row = rows[j],
                                                 .temperature = s->temperature,
                                                 .top_p = s->top_p,
                                                 .min_p = s->min_p,
                                                 .top_k = s->top_k,
                                                 .out = rows[j],
                                                 .u = duet_sample_draw53(s->seed, pos[it[rows[j]]])};
            }
            duet_status_t sst = duet_cuda_sample(c0, e->dlogits, (int)V, sr, nd, e->dids); /* sr copied */
            free(sr);
            if (sst != DUET_OK)
                goto cuda_fail;
        }
        if (duet_cuda_download(c0, out2, e->dids, sizeof(int32_t) * (size_t)nr) != DUET_OK)
            goto cuda_fail;
        for (int k = 0; k < nr; k++)
            tok[it[k]] = out2[k];
        if (on_gpu) {
            if (count)
                count_draws(e, nd, t0, 1);
            goto out;
        }
        t0 = duet_time_ns();
        for (int j = 0; j < nd;) { /* drawn row j's logits into e->logits row j */
            int l = j;
            while (l + 1 < nd && rows[l + 1] == rows[l] + 1)
                l++;
            if (duet_cuda_download(c0, e->logits + (size_t)j * V, e->dlogits + (size_t)rows[j] * V,
                                   sizeof(float) * V * (size_t)(l - j + 1)) != DUET_OK)
                goto cuda_fail;
            j = l + 1;
        }
        goto draw;
    cuda_fail:
        if (err)
            *err = *duet_cuda_error(c0);
        st = DUET_ERR_CUDA;
        goto out;
    }
draw:
#endif
    for (int j = 0; j < nd; j++) { /* drawn row j's logits in e->logits row j (on the CPU, rows[j] = j) */
        sp2[j] = sp[it[rows[j]]];
        pos2[j] = pos[it[rows[j]]];
    }
    duet_sample_batch(e->logits, (int)V, nd, sp2, pos2, out2, threads);
    for (int j = 0; j < nd; j++)
        tok[it[rows[j]]] = out2[j];
    if (count)
        count_draws(e, nd, t0, 0);
out:
    free(rows);
    free(sp2);
    free(pos2);
    free(out2);
    return st;
}

/* The forward of n items whose logits rows (it[k]: the item of row k, nr of them) go to e->logits
 * rows on the CPU, to e->dlogits on the GPU. */
static duet_status_t forward_rows(duet_worker_engine_t *e, duet_fwd_item_t *items, int n, int nr,
                                  duet_layer_done_fn layer_done, void *arg, duet_err_t *err)
{
    e->forwards++;
#if DUET_HAVE_CUDA
    if (e->gpu) {
        duet_cuda_t *c0 = duet_tp_cuda_context(e->gpu, 0);
        if (e->test_hold_at == e->forwards) {
            duet_warn("DUET_TEST_GPU_HOLD: forward %u: the GPU kept busy %u ms", e->forwards, e->test_hold_ms);
            if (duet_cuda_test_hold(c0, e->test_hold_ms) != DUET_OK) {
                if (err)
                    *err = *duet_cuda_error(c0);
                return DUET_ERR_CUDA;
            }
        }
        duet_status_t st = nr > 0 ? dev_logits(e, c0, err) : DUET_OK;
        if (st != DUET_OK)
            return st;
        duet_fwd_cuda_opts_t fo = {
            .layer_done = layer_done, .arg = arg, .layer_done_queued = 1, .logits_dev = nr > 0 ? e->dlogits : NULL};
        return duet_tp_cuda_forward(e->gpu, items, n, &fo, err);
    }
#endif
    return duet_forward_hooked(e->model, e->cache, items, n, layer_done, arg, err);
}

duet_status_t duet_worker_engine_decode(duet_worker_engine_t *e, duet_fwd_item_t *items, int n,
                                        const duet_sampling_t *const *sp, int32_t *tok, int threads, duet_err_t *err)
{
    if (n <= 0)
        return DUET_OK;
    if ((uint32_t)n > e->logit_rows)
        return duet_err_set(err, DUET_ERR_RANGE, "a decode step of %d rows, logits for %u", n, e->logit_rows);
    size_t V = (size_t)e->model->cfg.vocab_size;
    int *it = malloc(sizeof(int) * (size_t)n);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)n);
    duet_status_t st = DUET_OK;
    if (!it || !pos) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        items[i].logits = e->logits + (size_t)i * V;
        it[i] = i;
    }
    e->step_rows += (uint64_t)n;
    e->steps++;
    if ((st = forward_rows(e, items, n, n, NULL, NULL, err)) != DUET_OK)
        goto out;
    for (int i = 0; i < n; i++)
        pos[i] = items[i].seq->n_past;
    st = pick_tokens(e, n, it, sp, pos, tok, threads, 1, err);
out:
    free(it);
    free(pos);
    return st;
}

duet_status_t duet_worker_engine_prefill(duet_worker_engine_t *e, duet_fwd_item_t *items, int n,
                                         duet_layer_done_fn layer_done, void *arg, const duet_sampling_t *const *sp,
                                         const int64_t *pos, int32_t *tok, int threads, duet_err_t *err)
{
    if (n <= 0)
        return DUET_OK;
    size_t V = (size_t)e->model->cfg.vocab_size;
    int *it = malloc(sizeof(int) * (size_t)n);
    if (!it)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    int nr = 0;
    for (int i = 0; i < n; i++)
        if (items[i].logits_mode == DUET_LOGITS_LAST) {
            if ((uint32_t)nr == e->logit_rows) {
                free(it);
                return duet_err_set(err, DUET_ERR_RANGE, "a prefill step of more than %u final chunks", e->logit_rows);
            }
            items[i].logits = e->logits + (size_t)nr * V;
            it[nr++] = i;
        } else if (items[i].logits_mode != DUET_LOGITS_NONE) {
            free(it);
            return duet_err_set(err, DUET_ERR_INVALID, "prefill item %d: logits for every token", i);
        }
    duet_status_t st = forward_rows(e, items, n, nr, layer_done, arg, err);
    if (st == DUET_OK && nr > 0)
        st = pick_tokens(e, nr, it, sp, pos, tok, threads, 0, err);
    free(it);
    return st;
}

#if DUET_HAVE_CUDA
/* One staging copy of n sequences and `bytes`, begun at t0, into the counters of its direction */
static void count_stage(duet_worker_engine_t *e, int up, uint64_t bytes, uint32_t n, uint64_t t0)
{
    *(up ? &e->h2d_ns : &e->d2h_ns) += duet_time_ns() - t0;
    *(up ? &e->h2d_bytes : &e->d2h_bytes) += bytes;
    (*(up ? &e->h2d_calls : &e->d2h_calls))++;
    *(up ? &e->h2d_seqs : &e->d2h_seqs) += n;
}

/* A staging copy through the group (none when the data plane uses the device pools), counted. */
static duet_status_t stage(duet_worker_engine_t *e, duet_stage_dir_t dir, int layer, const duet_seq_t *const *seqs,
                           const uint32_t *n_pages, uint32_t n, duet_err_t *err)
{
    if (!e->gpu || !n || e->direct)
        return DUET_OK;
    uint64_t bytes = 0, t0 = duet_time_ns();
    duet_status_t st = duet_tp_cuda_stage(e->gpu, dir, layer, seqs, n_pages, n, &bytes, err);
    if (st != DUET_OK)
        return st;
    count_stage(e, dir == DUET_STAGE_TO_DEVICE, bytes, n, t0);
    return DUET_OK;
}
#endif

duet_status_t duet_worker_engine_to_host(duet_worker_engine_t *e, int layer, const duet_seq_t *const *seqs,
                                         uint32_t n, duet_err_t *err)
{
#if DUET_HAVE_CUDA
    return stage(e, DUET_STAGE_TO_HOST, layer, seqs, NULL, n, err);
#else
    (void)e, (void)layer, (void)seqs, (void)n, (void)err;
    return DUET_OK;
#endif
}

duet_status_t duet_worker_engine_to_host_queue(duet_worker_engine_t *e, int layer, const duet_seq_t *const *seqs,
                                               uint32_t n, int slot, duet_err_t *err)
{
#if DUET_HAVE_CUDA
    if (!e->gpu || !n)
        return DUET_OK;
    uint64_t bytes = 0, t0 = duet_time_ns();
    duet_status_t st = e->direct ? DUET_OK : duet_tp_cuda_stage_queue(e->gpu, layer, seqs, n, &bytes, err);
    if (st == DUET_OK)
        st = duet_tp_cuda_fence(e->gpu, slot, err);
    if (st != DUET_OK)
        return st;
    if (!e->direct)
        count_stage(e, 0, bytes, n, t0);
    return DUET_OK;
#else
    (void)e, (void)layer, (void)seqs, (void)n, (void)slot, (void)err;
    return DUET_OK;
#endif
}

int duet_worker_engine_gpu_lost(const duet_worker_engine_t *e)
{
#if DUET_HAVE_CUDA
    if (e->gpu && duet_tp_cuda_lost(e->gpu))
        return 1;
    const xfer_gpu_t *x = e->xfer_gpu;
    return x && x->cu && duet_cuda_stuck(x->cu);
#else
    (void)e;
    return 0;
#endif
}

duet_status_t duet_worker_engine_fence_wait(duet_worker_engine_t *e, int slot, duet_err_t *err)
{
    return duet_worker_engine_fence_wait_idle(e, slot, NULL, NULL, err);
}

duet_status_t duet_worker_engine_fence_wait_idle(duet_worker_engine_t *e, int slot, void (*idle)(void *), void *arg,
                                                 duet_err_t *err)
{
#if DUET_HAVE_CUDA
    if (!e->gpu)
        return DUET_OK;
    uint64_t t0 = duet_time_ns();
    duet_status_t st = duet_tp_cuda_fence_wait(e->gpu, slot, idle, arg, err);
    if (!e->direct)
        e->d2h_ns += duet_time_ns() - t0;
    return st;
#else
    (void)e, (void)slot, (void)idle, (void)arg, (void)err;
    return DUET_OK;
#endif
}

duet_status_t duet_worker_engine_to_device_n(duet_worker_engine_t *e, const duet_seq_t *const *seqs,
                                             const uint32_t *n_pages, uint32_t n, duet_err_t *err)
{
#if DUET_HAVE_CUDA
    return stage(e, DUET_STAGE_TO_DEVICE, -1, seqs, n_pages, n, err);
#else
    (void)e, (void)seqs, (void)n_pages, (void)n, (void)err;
    return DUET_OK;
#endif
}

duet_status_t duet_worker_engine_to_device(duet_worker_engine_t *e, const duet_seq_t *seq, uint32_t n_pages,
                                           duet_err_t *err)
{
    const duet_seq_t *one[1] = {seq};
    return duet_worker_engine_to_device_n(e, one, &n_pages, 1, err);
}

void duet_worker_engine_log_stats(const duet_worker_engine_t *e, const char *who)
{
    if (!e->gpu)
        return;
#if DUET_HAVE_CUDA
    duet_cuda_t *c0 = duet_tp_cuda_context(e->gpu, 0);
    if (duet_cuda_phases_enabled(c0)) {
        duet_cuda_phase_totals_t t;
        duet_cuda_phase_totals(c0, &t, 0);
        char line[1024];
        double total = duet_fwd_phase_line(&t, line, sizeof line);
        duet_info("%s: GPU ms a forward call by phase (DUET_CUDA_PHASES, %ld calls%s):%s total %.3f", who,
                  t.collections, t.dropped ? ", marks dropped" : "", line[0] ? line : " none", total);
    }
#endif
    if (e->direct) {
        duet_info("%s: data plane straight between GPU memory (no staging copies)", who);
        return;
    }
    duet_info("%s: staging device->host %llu copies of %llu sequences, %.1f MB in %.1f ms (%.2f GB/s); host->device "
              "%llu copies of %llu sequences, %.1f MB in %.1f ms (%.2f GB/s)",
              who, (unsigned long long)e->d2h_calls, (unsigned long long)e->d2h_seqs, e->d2h_bytes / 1e6,
              e->d2h_ns / 1e6, e->d2h_ns ? e->d2h_bytes / (double)e->d2h_ns : 0.0, (unsigned long long)e->h2d_calls,
              (unsigned long long)e->h2d_seqs, e->h2d_bytes / 1e6, e->h2d_ns / 1e6,
              e->h2d_ns ? e->h2d_bytes / (double)e->h2d_ns : 0.0);
}

duet_status_t duet_worker_engine_xfer_prepare(duet_worker_engine_t *e, duet_xfer_opts_t *xo, duet_err_t *err)
{
#if DUET_HAVE_CUDA
    if (!e->gpu)
        return DUET_OK;
    xfer_gpu_t *x = DUET_NEW(xfer_gpu_t);
    if (!x)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    e->xfer_gpu = x;
    duet_status_t st = duet_cuda_create(e->device, &x->cu, err);
    if (st != DUET_OK)
        return st;
    duet_cuda_set_wait_timeout(x->cu, duet_tp_cuda_step_timeout_ms(e->gpu));
    if (duet_cuda_host_alloc(x->cu, &x->bounce, XFER_BOUNCE_BYTES) != DUET_OK) {
        x->bounce = NULL;
        if (err)
            *err = *duet_cuda_error(x->cu);
        return DUET_ERR_CUDA;
    }
    x->ops = (duet_xfer_staging_t){.ctx = x, .d2h = xfer_copy, .h2d = xfer_copy, .host = x->bounce,
                                   .staging_bytes = XFER_BOUNCE_BYTES};
    xo->staging = &x->ops;
    xo->thread_init = xfer_thread_init;
    xo->thread_init_arg = x;
#else
    (void)e;
    (void)xo;
    (void)err;
#endif
    return DUET_OK;
}

duet_status_t duet_worker_engine_xfer_register(duet_worker_engine_t *e, duet_xfer_t *x, duet_err_t *err)
{
    e->direct = 0;
#if DUET_HAVE_CUDA
    const char *env = getenv("DUET_XFER_DEVICE");
    int want = !(env && strcmp(env, "0") == 0);
    if (e->gpu) {
        const char *why = NULL;
        if (!duet_xfer_cuda_capable(x))
            why = "this UCX has no CUDA support";
        else if (!want)
            why = "DUET_XFER_DEVICE=0";
        else if (e->tp > 1 && e->receives)
            why = "a tensor-parallel receiver keeps the host pools (each rank's device pools are filled from them)";
        else if (e->host_mirror && !e->receives)
            why = "the prefix cache keeps its tiers in the host pools";
        if (!why) {
            duet_kv_cache_cuda_t *dc = duet_tp_cuda_cache(e->gpu, 0);
            for (int k = 0; k < DUET_POOL_COUNT; k++) {
                const duet_cache_layout_t *l = duet_kv_cache_layout(e->cache, (duet_pool_kind_t)k);
                uint8_t *base = duet_kv_cache_cuda_pool_base(dc, (duet_pool_kind_t)k);
                if (!l || l->n_layers == 0 || !base)
                    continue;
                duet_xfer_pool_t p = {
                    .layout = *l,
                    .page_tokens = (uint32_t)duet_kv_cache_opts(e->cache)->page_tokens,
                    .base = base,
                    .n_units = l->paged ? duet_kv_cache_n_pages(e->cache) : duet_kv_cache_n_slots(e->cache),
                    .flags = DUET_XFER_POOL_DEVICE,
                };
                duet_status_t st = duet_xfer_register_pool(x, &p, err);
                if (st != DUET_OK)
                    return st;
            }
            e->direct = 1;
            duet_info("data plane: pages go straight between GPU memory (the device pools of cuda:%d are "
                      "registered with UCX); no staging through host memory",
                      e->device);
            return DUET_OK;
        }
        duet_info("data plane: pages are staged through the pinned host pools (%s)", why);
    }
#endif
    return duet_xfer_register_cache(x, e->cache, err);
}
