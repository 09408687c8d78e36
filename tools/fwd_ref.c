#include "fwd_ref.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

uint64_t fwd_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int32_t fwd_argmax(const float *v, int n)
{
    int32_t best = 0;
    float bv = -INFINITY;
    int found = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(v[i]))
            continue;
        if (!found || v[i] > bv) {
            bv = v[i];
            best = i;
            found = 1;
        }
    }
    return best;
}

double fwd_nmse(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

int fwd_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int fwd_cache_dtype_opt(const char *s, int kv, duet_cache_opts_t *o)
{
    int d = duet_cache_dtype_parse(s);
    if (d != DUET_CACHE_FP8 && d != DUET_CACHE_BF16)
        return -1;
    if (kv)
        o->kv_dtype = (duet_cache_dtype_t)d;
    else
        o->index_k_dtype = (duet_cache_dtype_t)d;
    return 0;
}

int fwd_prompt_len(int i, uint64_t seed)
{
    static const int lens[] = {1, 3, 7, 16, 17, 31, 64, 100, 129, 200, 255, 256, 257, 300, 390, 511, 5, 77, 140, 260};
    int n = (int)(sizeof lens / sizeof lens[0]);
    return i < n ? lens[i] : 1 + (int)(fwd_mix64(seed ^ (uint64_t)i) % 400);
}

int32_t *fwd_make_prompt(int i, int len, int vocab, uint64_t seed)
{
    int32_t *p = malloc(sizeof(int32_t) * (size_t)len);
    for (int j = 0; p && j < len; j++)
        p[j] = 2 + (int32_t)(fwd_mix64(seed * 1000003u + (uint64_t)i * 7919u + (uint64_t)j) % (uint64_t)(vocab - 2));
    return p;
}

typedef struct {
    const duet_model_t *m;
    const duet_cache_opts_t *opts;
    int n_prompts, n_tokens;
    int32_t *const *prompts;
    const int *lens;
    int32_t **gen;
    float **logits;
    int32_t *const *force;
    fwd_step_fn on_step;
    void *arg;
    atomic_int next;
    atomic_int failed;
} job_t;

static void *worker(void *p)
{
    job_t *J = p;
    int V = J->m->cfg.vocab_size, T = J->n_tokens;
    float *own = J->force ? malloc(sizeof(float) * (size_t)V) : NULL;
    if (J->force && !own) {
        atomic_store(&J->failed, 1);
        return NULL;
    }
    for (;;) {
        int i = atomic_fetch_add(&J->next, 1);
        if (i >= J->n_prompts)
            break;
        duet_err_t err = {0};
        duet_kv_cache_t *cache = NULL;
        duet_seq_t seq = {0};
        int64_t total = J->lens[i] + T;
        uint32_t np = (uint32_t)((total + J->opts->page_tokens - 1) / J->opts->page_tokens) + 1;
        if (duet_kv_cache_create(&J->m->cfg, J->opts, np, 1, &cache, &err) != DUET_OK ||
            duet_seq_init(cache, &seq, &err) != DUET_OK || duet_seq_reserve(cache, &seq, total, &err) != DUET_OK) {
            fprintf(stderr, "CPU prompt %d: %s\n", i, duet_err_text(&err));
            atomic_store(&J->failed, 1);
            duet_kv_cache_destroy(&cache);
            continue;
        }
        float *lg = J->force ? own : J->logits[i];
        duet_fwd_item_t it = {.seq = &seq, .tokens = J->prompts[i], .n_tokens = J->lens[i],
                              .logits_mode = DUET_LOGITS_LAST, .logits = lg};
        duet_status_t st = duet_forward(J->m, cache, &it, 1, &err);
        for (int s = 0; st == DUET_OK && s < T; s++) {
            const int32_t *next;
            if (J->force) {
                J->on_step(J->arg, i, s, own);
                next = &J->force[i][s];
            } else {
                lg = J->logits[i] + (size_t)s * V;
                J->gen[i][s] = fwd_argmax(lg, V);
                next = &J->gen[i][s];
            }
            if (s + 1 == T)
                break;
            duet_fwd_item_t d = {.seq = &seq, .tokens = next, .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST,
                                 .logits = J->force ? own : lg + V};
            st = duet_forward(J->m, cache, &d, 1, &err);
        }
        if (st != DUET_OK) {
            fprintf(stderr, "CPU prompt %d: %s\n", i, duet_err_text(&err));
            atomic_store(&J->failed, 1);
        }
        duet_seq_release(cache, &seq);
        duet_kv_cache_destroy(&cache);
    }
    free(own);
    return NULL;
}

int fwd_cpu_run(const duet_model_t *m, const duet_cache_opts_t *opts, int n_prompts, int n_tokens,
                int32_t *const *prompts, const int *lens, int32_t **gen, float **logits, int32_t *const *force,
                fwd_step_fn on_step, void *arg)
{
    job_t J = {.m = m, .opts = opts, .n_prompts = n_prompts, .n_tokens = n_tokens, .prompts = prompts,
               .lens = lens, .gen = gen, .logits = logits, .force = force, .on_step = on_step, .arg = arg};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = (int)(ncpu < 1 ? 1 : ncpu > n_prompts ? n_prompts : ncpu);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    if (!th)
        return 2;
    int started = 0;
    for (int i = 0; i < nt; i++)
        if (pthread_create(&th[started], NULL, worker, &J) == 0)
            started++;
    if (!started)
        worker(&J);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    return atomic_load(&J.failed) ? 2 : 0;
}
