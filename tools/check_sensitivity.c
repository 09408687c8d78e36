/* duet-check-sensitivity: how far rounding-level noise moves the CPU engine's greedy tokens.
 *
 *   duet-check-sensitivity --model DIR [--eps E] [--prompts N] [--tokens N]
 *                          [--kv-dtype bf16|fp8] [--index-k-dtype bf16|fp8] [--seed N] [--page-tokens N]
 *
 * The CPU engine runs duet-check-forward's seeded prompts greedily (prefill, then --tokens
 * steps); then again, fed the same tokens (teacher forcing), with every RMSNorm output
 * multiplied by 1 + E*u, u in [-1, 1) a hash of the element's value and position: noise of
 * the size another correct implementation's rounding leaves (E = 6e-8 is half an fp32 ulp;
 * default 1e-7).  Printed as duet-check-forward prints the GPU against the CPU: per prompt,
 * the logits' nmse per step (median, mean, worst) and the first step whose greedy token
 * differs.  It measures what "the same greedy tokens as the CPU" can ask of any
 * implementation that is not bit-exact.  With --eps 0 the second run must equal the first bit
 * for bit (the engine is deterministic across runs and threads): exit 1 if it does not.
 * Otherwise exit 0 (a measurement); 2 when it cannot run. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "fwd_ref.h"
#include "kernels.h"
#include "log.h"
#include "time_util.h"

static void (*g_rmsnorm)(const float *x, const float *weight, int n, int dim, float eps, float *y);
static float g_eps;

static void rmsnorm_noisy(const float *x, const float *weight, int n, int dim, float eps, float *y)
{
    g_rmsnorm(x, weight, n, dim, eps, y);
    for (size_t i = 0; i < (size_t)n * dim; i++) {
        uint32_t b;
        memcpy(&b, &y[i], sizeof b);
        uint64_t h = fwd_mix64(((uint64_t)b << 32) ^ (uint64_t)i);
        float u = (float)((double)(h >> 11) * 0x1.0p-52 - 1.0);
        y[i] *= 1.0f + g_eps * u;
    }
}

typedef struct {
    int V, T;
    float **ref;      /* (T, V) reference logits per prompt */
    int32_t **gen;    /* reference greedy tokens */
    double *errs;     /* (N, T) nmse per step */
    int *first;       /* first step whose greedy token differs, -1: none */
} cmp_t;

static void on_step(void *arg, int i, int s, const float *logits)
{
    cmp_t *c = arg;
    c->errs[(size_t)i * c->T + s] = fwd_nmse(logits, c->ref[i] + (size_t)s * c->V, (size_t)c->V);
    if (c->first[i] < 0 && fwd_argmax(logits, c->V) != c->gen[i][s])
        c->first[i] = s;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: duet-check-sensitivity --model DIR [--eps E] [--prompts N] [--tokens N]\n"
               "                              [--kv-dtype bf16|fp8] [--index-k-dtype bf16|fp8] [--seed N] "
               "[--page-tokens N]\n");
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int N = 20, T = 256;
    uint64_t seed = 20260101;
    double eps = 1e-7;
    duet_cache_opts_t opts = {.page_tokens = 256, .kv_dtype = DUET_CACHE_BF16, .index_k_dtype = DUET_CACHE_BF16};
    enum { O_MODEL = 256, O_EPS, O_P, O_T, O_KV, O_IK, O_SEED, O_PT, O_HELP };
    static const struct option lo[] = {{"model", 1, 0, O_MODEL},       {"eps", 1, 0, O_EPS},
                                       {"prompts", 1, 0, O_P},         {"tokens", 1, 0, O_T},
                                       {"kv-dtype", 1, 0, O_KV},       {"index-k-dtype", 1, 0, O_IK},
                                       {"seed", 1, 0, O_SEED},         {"page-tokens", 1, 0, O_PT},
                                       {"help", 0, 0, O_HELP},         {0, 0, 0, 0}};
    duet_log_init_from_env();
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case O_MODEL: dir = optarg; break;
        case O_EPS: eps = strtod(optarg, NULL); break;
        case O_P: N = atoi(optarg); break;
        case O_T: T = atoi(optarg); break;
        case O_KV:
        case O_IK:
            if (fwd_cache_dtype_opt(optarg, o == O_KV, &opts)) {
                usage(stderr);
                return 2;
            }
            break;
        case O_SEED: seed = strtoull(optarg, NULL, 10); break;
        case O_PT: opts.page_tokens = atoi(optarg); break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!dir || N < 1 || T < 1 || !(eps >= 0 && eps < 1) || opts.page_tokens < 1) {
        usage(stderr);
        return 2;
    }
    duet_err_t err = {0};
    duet_model_t *m = NULL;
    if (duet_model_load(dir, &m, &err) != DUET_OK) {
        fprintf(stderr, "duet-check-sensitivity: %s\n", duet_err_text(&err));
        return 2;
    }
    int V = m->cfg.vocab_size, rc = 2;
    int32_t **prompts = calloc((size_t)N, sizeof *prompts), **gen = calloc((size_t)N, sizeof *gen);
    float **ref = calloc((size_t)N, sizeof *ref);
    int *lens = calloc((size_t)N, sizeof *lens), *first = malloc(sizeof(int) * (size_t)N);
    double *errs = calloc((size_t)N * T, sizeof(double));
    if (!prompts || !gen || !ref || !lens || !first || !errs)
        goto out;
    for (int i = 0; i < N; i++) {
        lens[i] = fwd_prompt_len(i, seed);
        prompts[i] = fwd_make_prompt(i, lens[i], V, seed);
        gen[i] = calloc((size_t)T, sizeof(int32_t));
        ref[i] = duet_malloc_array((size_t)T * V, sizeof(float));
        first[i] = -1;
        if (!prompts[i] || !gen[i] || !ref[i]) {
            fprintf(stderr, "duet-check-sensitivity: out of memory for %d x %d logits\n", N, T);
            goto out;
        }
    }
    double t0 = duet_time_s();
    if (fwd_cpu_run(m, &opts, N, T, prompts, lens, gen, ref, NULL, NULL, NULL))
        goto out;
    double t_ref = duet_time_s() - t0;
    duet_kernels_t *k = duet_kernels_mutable();
    g_rmsnorm = k->rmsnorm;
    g_eps = (float)eps;
    k->rmsnorm = rmsnorm_noisy;
    cmp_t c = {.V = V, .T = T, .ref = ref, .gen = gen, .errs = errs, .first = first};
    t0 = duet_time_s();
    int run = fwd_cpu_run(m, &opts, N, T, prompts, lens, NULL, NULL, gen, on_step, &c);
    k->rmsnorm = g_rmsnorm;
    if (run)
        goto out;
    double t_noisy = duet_time_s() - t0;

    int same = 0;
    double all_med = 0, all_mean = 0, all_worst = 0;
    printf("prompt  len  tokens  median_nmse  mean_nmse  worst_nmse  first_greedy_diff\n");
    for (int i = 0; i < N; i++) {
        double *e = errs + (size_t)i * T, sum = 0, worst = 0;
        for (int s = 0; s < T; s++) {
            sum += e[s];
            worst = e[s] > worst || isnan(e[s]) ? e[s] : worst;
        }
        qsort(e, (size_t)T, sizeof(double), fwd_cmp_double);
        double med = e[T / 2];
        same += first[i] < 0;
        all_med = med > all_med ? med : all_med;
        all_mean += sum / T;
        all_worst = worst > all_worst || isnan(worst) ? worst : all_worst;
        char fd[32];
        snprintf(fd, sizeof fd, first[i] < 0 ? "none" : "step %d", first[i]);
        printf("%6d %5d %6d  %11.3e  %9.3e  %10.3e  %s\n", i, lens[i], T, med, sum / T, worst, fd);
    }
    printf("sensitivity: eps %.1e on every RMSNorm output, %d prompts x %d tokens, kv %s, index-k %s: greedy equal "
           "on %d/%d; per-prompt median nmse <= %.3e, mean %.3e, worst step %.3e; reference %.1f s, noisy %.1f s\n",
           eps, N, T, duet_cache_dtype_name(opts.kv_dtype), duet_cache_dtype_name(opts.index_k_dtype), same, N,
           all_med, all_mean / N, all_worst, t_ref, t_noisy);
    rc = 0;
    if (eps == 0 && (same != N || all_worst != 0)) {
        printf("sensitivity: FAIL: without noise the second run differs from the first\n");
        rc = 1;
    }
out:
    for (int i = 0; prompts && gen && ref && i < N; i++) {
        free(prompts[i]);
        free(gen[i]);
        free(ref[i]);
    }
    free(prompts);
    free(gen);
    free(ref);
    free(lens);
    free(first);
    free(errs);
    duet_model_destroy(&m);
    return rc;
}
