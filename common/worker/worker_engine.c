#include "worker_engine.h"

#include <stdlib.h>
#include <string.h>

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
    size_t bytes = (size_t)e->logit_rows * (size_t)e->model->cfg.vocab_size * sizeof(float);
    if (duet_cuda_host_alloc(c0, (void **)&e->logits, bytes) != DUET_OK) {
        e->logits = NULL;
        if (err)
            *err = *duet_cuda_error(c0);
        return DUET_ERR_CUDA;
    }
    return DUET_OK;
}

static void gpu_close(duet_worker_engine_t *e)
{
    duet_tp_cuda_t *t = e->gpu;
    if (!t)
        return;
    if (e->logits)
        duet_cuda_host_free(duet_tp_cuda_context(t, 0), e->logits);
    e->logits = NULL;
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
    e->logit_rows = logit_rows ? logit_rows : 1;
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

duet_status_t duet_worker_engine_forward(duet_worker_engine_t *e, duet_fwd_item_t *items, int n_items,
                                         duet_layer_done_fn layer_done, void *arg, duet_err_t *err)
{
#if DUET_HAVE_CUDA
    if (e->gpu) {
        duet_fwd_cuda_opts_t fo = {.layer_done = layer_done, .arg = arg};
        return duet_tp_cuda_forward(e->gpu, items, n_items, &fo, err);
    }
#endif
    return duet_forward_hooked(e->model, e->cache, items, n_items, layer_done, arg, err);
}

duet_status_t duet_worker_engine_to_host(duet_worker_engine_t *e, int layer, const duet_seq_t *const *seqs,
                                         uint32_t n, duet_err_t *err)
{
#if DUET_HAVE_CUDA
    if (e->gpu && n) {
        uint64_t bytes = 0, t0 = duet_time_ns();
        duet_status_t st = duet_tp_cuda_stage(e->gpu, DUET_STAGE_TO_HOST, layer, seqs, NULL, n, &bytes, err);
        if (st != DUET_OK)
            return st;
        e->d2h_ns += duet_time_ns() - t0;
        e->d2h_bytes += bytes;
        e->d2h_calls++;
    }
#else
    (void)layer;
    (void)seqs;
#endif
    (void)e;
    (void)n;
    (void)err;
    return DUET_OK;
}

duet_status_t duet_worker_engine_to_device(duet_worker_engine_t *e, const duet_seq_t *seq, uint32_t n_pages,
                                           duet_err_t *err)
{
#if DUET_HAVE_CUDA
    if (e->gpu) {
        uint64_t bytes = 0, t0 = duet_time_ns();
        const duet_seq_t *one[1] = {seq};
        duet_status_t st = duet_tp_cuda_stage(e->gpu, DUET_STAGE_TO_DEVICE, -1, one, &n_pages, 1, &bytes, err);
        if (st != DUET_OK)
            return st;
        e->h2d_ns += duet_time_ns() - t0;
        e->h2d_bytes += bytes;
        e->h2d_calls++;
    }
#else
    (void)seq;
    (void)n_pages;
#endif
    (void)e;
    (void)err;
    return DUET_OK;
}

void duet_worker_engine_log_stats(const duet_worker_engine_t *e, const char *who)
{
    if (!e->gpu)
        return;
    duet_info("%s: staging device->host %llu copies, %.1f MB in %.1f ms (%.2f GB/s); host->device %llu copies, "
              "%.1f MB in %.1f ms (%.2f GB/s)",
              who, (unsigned long long)e->d2h_calls, e->d2h_bytes / 1e6, e->d2h_ns / 1e6,
              e->d2h_ns ? e->d2h_bytes / (double)e->d2h_ns : 0.0, (unsigned long long)e->h2d_calls,
              e->h2d_bytes / 1e6, e->h2d_ns / 1e6, e->h2d_ns ? e->h2d_bytes / (double)e->h2d_ns : 0.0);
}
