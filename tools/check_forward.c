/* duet-check-forward: the GPU forward (engine/forward_cuda.h) against the CPU
 * engine, and its timings.
 *
 * Check mode (default): N seeded prompts of varied lengths (short, past the
 * sliding window, past several C128 windows).  The CPU engine generates T
 * greedy tokens for each (prompts spread over threads).  The GPU then runs
 * all prompts as one batch: one forward call prefills every prompt, then T-1
 * decode steps of N rows each, fed the CPU's tokens, so that every step's
 * logits are comparable.  Per prompt: the worst and mean normalized error
 * ||gpu - cpu||^2 / ||cpu||^2 over the steps, and the first step where the
 * GPU's greedy token differs from the CPU's (none: the GPU generates the same
 * tokens).  The pass criterion is the per-prompt median over the steps: a
 * top-k or routing decision that flips on a near-tie (the two backends sum in
 * different orders) makes isolated steps far worse, so the worst step is
 * reported, not bounded.  Every step whose greedy token differs is sorted and measured (the
 * `greedy:` line, greedy_diff_t); one within the tolerance whose CPU margin is beyond
 * GREEDY_MAX_SIGMAS times the step's rms error fails the check.  Batch invariance on the GPU:
 * some prompts run again alone, with a
 * single-shot and with a chunked prefill, for a few steps; their logits are
 * compared bit for bit with each other and with the batched run.
 *
 * With --exact (CPU-exact mode, duet_cuda_set_exact) every logit of every step must be the
 * CPU's bits, and so every prompt's greedy tokens the CPU's: the `bits:` line counts those that
 * are not (printed in both modes).
 *
 * Bench mode (--bench): on a real-width model (the slice fixture), prefill
 * tokens/s at a given context, decode step time at given batches with that
 * context, each beside its roofline: max(bytes / copy bandwidth, FLOPs /
 * bf16 GEMM rate), both ceilings measured in the same run.
 *
 * Staging mode (--staging N): the workers' data-plane copies (forward_cuda.h,
 * duet_kv_cache_cuda_stage) for one N-token sequence: device pools -> mapped
 * host pools layer by layer (what duet-prefill does from its layer hook) and
 * in one call, host -> device in one call (what duet-decode does on
 * TransferDone), each checked byte for byte and timed (median of 7) beside
 * pinned cudaMemcpy in both directions measured in the same run.
 *
 * Exit status: 0 all within tolerance (check) / ran (bench), 1 a check
 * failed, 2 usage or device error. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "fwd_ref.h"
#include "tp_cuda.h"
#include "log.h"
#include "sampling.h"
#include "time_util.h"

typedef struct {
    const char *model_dir;
    int n_prompts, n_tokens, device, chunk, inv_prompts, inv_steps, bench, ctx, staging, tp, decode_only, phases;
    int exact;           /* --exact: CPU-exact mode (duet_cuda_set_exact), every logit the CPU's bits */
    int profile_prefill; /* the profiler's span (ncu --profile-from-start off): the timed batch-invariant
                            prefill instead of the last decode step */
    int batches[8], n_batches;
    uint64_t seed;
    double tol;
    duet_cache_opts_t opts;
} args_t;

/* ---- GPU helpers ---- */

typedef struct {
    duet_cuda_t *cu;
    duet_model_cuda_t *mc;
    duet_kv_cache_t *hc;
    duet_kv_cache_cuda_t *dc;
    /* --tp N > 1: a tensor-parallel group over each cache instead of mc/dc */
    int tp, device;
    duet_tp_cuda_t *grp;
} gpu_t;

static int gpu_cache(gpu_t *g, const duet_model_t *m, const duet_cache_opts_t *o, uint32_t pages, uint32_t slots,
                     duet_err_t *err)
{
    if (duet_kv_cache_create(&m->cfg, o, pages, slots, &g->hc, err) != DUET_OK)
        return -1;
    if (g->tp > 1)
        return duet_tp_cuda_open(m, g->hc, g->device, g->tp, &g->grp, err) == DUET_OK ? 0 : -1;
    if (duet_kv_cache_cuda_create(g->cu, g->hc, &g->dc, err) != DUET_OK)
        return -1;
    return 0;
}

static duet_status_t fwd(gpu_t *g, duet_fwd_item_t *items, int n, duet_err_t *err)
{
    return g->grp ? duet_tp_cuda_forward(g->grp, items, n, NULL, err) : duet_forward_cuda(g->mc, g->dc, items, n, err);
}

static void gpu_cache_free(gpu_t *g)
{
    duet_tp_cuda_close(&g->grp);
    duet_kv_cache_cuda_destroy(&g->dc);
    duet_kv_cache_destroy(&g->hc);
}

/* Run prompt i alone (chunk 0: single shot) then `steps` decode steps fed `gen`; logits out (steps, V). */
static int gpu_alone(gpu_t *g, const duet_model_t *m, const args_t *a, const int32_t *prompt, int len,
                     const int32_t *gen, int steps, int chunk, float *out, duet_err_t *err)
{
    int V = m->cfg.vocab_size;
    int64_t total = len + steps;
    uint32_t np = (uint32_t)((total + a->opts.page_tokens - 1) / a->opts.page_tokens) + 1;
    if (gpu_cache(g, m, &a->opts, np, 1, err))
        return -1;
    duet_seq_t seq = {0};
    int rc = -1;
    if (duet_seq_init(g->hc, &seq, err) != DUET_OK || duet_seq_reserve(g->hc, &seq, total, err) != DUET_OK)
        goto out;
    int step = chunk > 0 ? chunk : len;
    for (int off = 0; off < len; off += step) {
        int n = len - off < step ? len - off : step;
        duet_fwd_item_t it = {.seq = &seq, .tokens = prompt + off, .n_tokens = n,
                              .logits_mode = off + n == len ? DUET_LOGITS_LAST : DUET_LOGITS_NONE, .logits = out};
        if (fwd(g, &it, 1, err) != DUET_OK)
            goto out;
    }
    for (int s = 1; s < steps; s++) {
        duet_fwd_item_t it = {.seq = &seq, .tokens = &gen[s - 1], .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST,
                              .logits = out + (size_t)s * V};
        if (fwd(g, &it, 1, err) != DUET_OK)
            goto out;
    }
    rc = 0;
out:
    duet_seq_release(g->hc, &seq);
    gpu_cache_free(g);
    return rc;
}

static size_t n_diff(const float *a, const float *b, size_t n, double *maxabs)
{
    size_t d = 0;
    *maxabs = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) {
            d++;
            double x = fabs((double)a[i] - (double)b[i]);
            if (x > *maxabs)
                *maxabs = x;
        }
    return d;
}

/* The teacher-forced steps whose GPU greedy token is not the CPU's, in two kinds: those whose
 * logits are within the tolerance (nmse <= tol) and those past it.  At a step of the first
 * kind the CPU's margin (its top logit minus its logit of the GPU's pick) is what a small error
 * overturned; set beside the CPU's top-2 gap over all steps, it tells a near-tie from a wrong
 * result.  Its margin is also measured in the step's own error (the root mean square of
 * gpu - cpu over the vocabulary): a rounding difference overturns a margin of a few of those at
 * most, so a step within the tolerance whose margin exceeds GREEDY_MAX_SIGMAS of them fails the
 * check (some logits wrong while the others agree).  A step of the second kind has logits far
 * from the CPU's, the mark of a discrete choice upstream (an expert, an index entry) taken the
 * other way: its worst nmse is shown. */
#define GREEDY_MAX_SIGMAS 16.0
typedef struct {
    long n;
    double margin_max, margin_sum; /* the CPU's logit gaps at these steps */
    double sigmas_max;             /* the largest margin in the step's rms errors */
    int rank_max;                  /* the GPU pick's place in the CPU's order (1: its second) */
    double nmse_max;
} greedy_kind_t;

typedef struct {
    long steps;
    greedy_kind_t in, out; /* differing steps within / past the tolerance */
    double *gap_all;       /* the CPU's top-2 gap at every step */
} greedy_diff_t;

static double cpu_top2_gap(const float *c, int V)
{
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int v = 0; v < V; v++) {
        if (isnan(c[v]))
            continue;
        if (c[v] > b1) {
            b2 = b1;
            b1 = c[v];
        } else if (c[v] > b2) {
            b2 = c[v];
        }
    }
    return (double)b1 - (double)b2;
}

static void greedy_diff_note(greedy_diff_t *gd, const float *c, const float *gp, int V, int32_t ref, int32_t pick,
                             double nmse, double tol)
{
    greedy_kind_t *k = nmse <= tol ? &gd->in : &gd->out;
    double m = (double)c[ref] - (double)c[pick], se = 0;
    int rank = 0;
    for (int v = 0; v < V; v++) {
        rank += c[v] > c[pick];
        double d = (double)gp[v] - (double)c[v];
        se += d * d;
    }
    double sigma = sqrt(se / V), sig = sigma > 0 ? m / sigma : (m > 0 ? INFINITY : 0);
    if (sig > k->sigmas_max || isnan(sig))
        k->sigmas_max = sig;
    k->n++;
    k->margin_sum += m;
    if (m > k->margin_max)
        k->margin_max = m;
    if (rank > k->rank_max)
        k->rank_max = rank;
    if (nmse > k->nmse_max || isnan(nmse))
        k->nmse_max = nmse;
}

/* Returns 1 when a step within the tolerance differs at a margin beyond GREEDY_MAX_SIGMAS. */
static int greedy_diff_print(greedy_diff_t *gd, double tol)
{
    if (!gd->steps)
        return 0;
    qsort(gd->gap_all, (size_t)gd->steps, sizeof(double), fwd_cmp_double);
    double med = gd->gap_all[gd->steps / 2];
    long below = 0; /* steps whose CPU top-2 gap is at most the largest margin within the tolerance */
    for (long k = 0; k < gd->steps && gd->gap_all[k] <= gd->in.margin_max; k++)
        below++;
    printf("greedy: %ld of %ld teacher-forced steps have the CPU's greedy token (the CPU's top-2 gap: median %.3e); ",
           gd->steps - gd->in.n - gd->out.n, gd->steps, med);
    if (gd->in.n)
        printf("%ld differ at steps within the tolerance (nmse <= %.1e), the CPU's margin over the GPU's pick at most "
               "%.3e (mean %.3e, at most %.1f times the step's rms error, bound %.0f; the pick's rank in the CPU's "
               "order at most %d, 1 being its second choice; %.2f%% of all steps have a top-2 gap that small); ",
               gd->in.n, tol, gd->in.margin_max, gd->in.margin_sum / (double)gd->in.n, gd->in.sigmas_max,
               GREEDY_MAX_SIGMAS, gd->in.rank_max, 100.0 * (double)below / (double)gd->steps);
    else
        printf("none differs at a step within the tolerance (nmse <= %.1e); ", tol);
    if (gd->out.n)
        printf("%ld differ at steps past it (nmse up to %.3e; the CPU's margin at most %.3e)\n", gd->out.n,
               gd->out.nmse_max, gd->out.margin_max);
    else
        printf("none at a step past it\n");
    int bad = gd->in.n && !(gd->in.sigmas_max <= GREEDY_MAX_SIGMAS);
    if (bad)
        printf("greedy: FAIL: a step within the tolerance differs at %.1f times its rms error (bound %.0f)\n",
               gd->in.sigmas_max, GREEDY_MAX_SIGMAS);
    return bad;
}

static int check(const args_t *a, const duet_model_t *m, gpu_t *g)
{
    int N = a->n_prompts, T = a->n_tokens, V = m->cfg.vocab_size;
    duet_err_t err = {0};
    int32_t **prompts = calloc((size_t)N, sizeof *prompts), **gen = calloc((size_t)N, sizeof *gen);
    float **cl = calloc((size_t)N, sizeof *cl);
    int *lens = calloc((size_t)N, sizeof *lens);
    for (int i = 0; i < N; i++) {
        lens[i] = fwd_prompt_len(i, a->seed);
        prompts[i] = fwd_make_prompt(i, lens[i], V, a->seed);
        gen[i] = calloc((size_t)T, sizeof(int32_t));
        cl[i] = duet_malloc_array((size_t)T * V, sizeof(float));
        if (!cl[i]) {
            fprintf(stderr, "check-forward: out of memory for the CPU logits\n");
            return 2;
        }
    }
    /* CPU */
    double t0 = duet_time_s();
    if (fwd_cpu_run(m, &a->opts, N, T, prompts, lens, gen, cl, NULL, NULL, NULL))
        return 2;
    double t_cpu = duet_time_s() - t0;

    /* GPU, all prompts in one batch */
    t0 = duet_time_s();
    uint32_t pages = 0;
    for (int i = 0; i < N; i++)
        pages += (uint32_t)((lens[i] + T + a->opts.page_tokens - 1) / a->opts.page_tokens) + 1;
    if (gpu_cache(g, m, &a->opts, pages, (uint32_t)N, &err)) {
        fprintf(stderr, "check-forward: %s\n", duet_err_text(&err));
        return 2;
    }
    duet_seq_t *seqs = calloc((size_t)N, sizeof *seqs);
    duet_fwd_item_t *items = calloc((size_t)N, sizeof *items);
    float *gl = duet_malloc_array((size_t)N * V, sizeof(float));
    int inv_n = a->inv_prompts < N ? a->inv_prompts : N, inv_s = a->inv_steps < T ? a->inv_steps : T;
    float *keep = duet_malloc_array((size_t)(inv_n ? inv_n : 1) * (inv_s ? inv_s : 1) * V, sizeof(float));
    double *worst = calloc((size_t)N, sizeof(double)), *sum = calloc((size_t)N, sizeof(double));
    double *errs = calloc((size_t)N * T, sizeof(double));
    int *first = malloc(sizeof(int) * (size_t)N), *worst_step = calloc((size_t)N, sizeof(int));
    greedy_diff_t gd = {.gap_all = calloc((size_t)N * T, sizeof(double))};
    size_t bits_diff = 0; /* logits whose bits are not the CPU's */
    double bits_max = 0;
    if (!seqs || !items || !gl || !keep || !worst || !sum || !errs || !first || !worst_step || !gd.gap_all) {
        fprintf(stderr, "check-forward: out of memory\n");
        return 2;
    }
    for (int i = 0; i < N; i++) {
        first[i] = -1;
        if (duet_seq_init(g->hc, &seqs[i], &err) != DUET_OK ||
            duet_seq_reserve(g->hc, &seqs[i], lens[i] + T, &err) != DUET_OK) {
            fprintf(stderr, "check-forward: %s\n", duet_err_text(&err));
            return 2;
        }
    }
    for (int s = 0; s < T; s++) {
        for (int i = 0; i < N; i++)
            items[i] = (duet_fwd_item_t){.seq = &seqs[i], .tokens = s ? &gen[i][s - 1] : prompts[i],
                                         .n_tokens = s ? 1 : lens[i], .logits_mode = DUET_LOGITS_LAST,
                                         .logits = gl + (size_t)i * V};
        if (fwd(g, items, N, &err) != DUET_OK) {
            fprintf(stderr, "check-forward: GPU step %d: %s\n", s, duet_err_text(&err));
            return 2;
        }
        for (int i = 0; i < N; i++) {
            const float *c = cl[i] + (size_t)s * V, *gp = gl + (size_t)i * V;
            double e = fwd_nmse(gp, c, (size_t)V), dmax;
            bits_diff += n_diff(gp, c, (size_t)V, &dmax);
            if (dmax > bits_max)
                bits_max = dmax;
            if (s == 0 || e > worst[i] || isnan(e)) {
                worst[i] = e;
                worst_step[i] = s;
            }
            sum[i] += e;
            errs[(size_t)i * T + s] = e;
            int32_t pick = fwd_argmax(gp, V);
            if (pick != gen[i][s]) {
                if (first[i] < 0)
                    first[i] = s;
                greedy_diff_note(&gd, c, gp, V, gen[i][s], pick, e, a->tol);
            }
            gd.gap_all[gd.steps++] = cpu_top2_gap(c, V);
            if (i < inv_n && s < inv_s)
                memcpy(keep + ((size_t)i * inv_s + s) * V, gp, sizeof(float) * V);
        }
    }
    double t_gpu = duet_time_s() - t0;
    for (int i = 0; i < N; i++)
        duet_seq_release(g->hc, &seqs[i]);
    gpu_cache_free(g);

    int bad = 0, same = 0;
    double all_worst = 0, all_sum = 0, all_med = 0;
    printf("prompt  len  tokens  median_nmse  mean_nmse  worst_nmse (step)  first_greedy_diff\n");
    for (int i = 0; i < N; i++) {
        double mean = sum[i] / T;
        qsort(errs + (size_t)i * T, (size_t)T, sizeof(double), fwd_cmp_double);
        double med = errs[(size_t)i * T + T / 2];
        int ok = med <= a->tol;
        bad += !ok;
        same += first[i] < 0;
        if (worst[i] > all_worst || isnan(worst[i]))
            all_worst = worst[i];
        if (med > all_med || isnan(med))
            all_med = med;
        all_sum += mean;
        char fd[32];
        if (first[i] < 0)
            snprintf(fd, sizeof fd, "none");
        else
            snprintf(fd, sizeof fd, "step %d", first[i]);
        printf("%6d %5d %6d  %11.3e  %9.3e  %10.3e (%4d)  %s%s\n", i, lens[i], T, med, mean, worst[i], worst_step[i], fd,
               ok ? "" : "  FAIL(tol)");
    }
    printf("forward: %d prompts x %d tokens, kv %s, index-k %s: greedy equal on %d/%d; per-prompt median nmse <= %.3e "
           "(tolerance %.1e), mean %.3e, worst step %.3e; CPU %.1f s, GPU %.1f s\n",
           N, T, duet_cache_dtype_name(a->opts.kv_dtype), duet_cache_dtype_name(a->opts.index_k_dtype), same, N,
           all_med, a->tol, all_sum / N, all_worst, t_cpu, t_gpu);

    int greedy_bad = greedy_diff_print(&gd, a->tol);
    free(gd.gap_all);
    printf("bits: %zu of %zu logits (%d prompts x %d steps x %d) differ from the CPU's bits (largest difference "
           "%.3g)%s\n", bits_diff, (size_t)N * T * V, N, T, V, bits_max,
           a->exact ? (bits_diff ? "; FAIL: CPU-exact mode requires none" : "; CPU-exact mode: none, as required") : "");
    if (a->exact && (bits_diff || same != N))
        bad++;

    /* batch invariance: alone single-shot vs batched, chunked vs single-shot */
    int inv_bad = 0;
    float *A = duet_malloc_array((size_t)inv_s * V, sizeof(float)), *B = duet_malloc_array((size_t)inv_s * V, sizeof(float));
    for (int i = 0; i < inv_n && inv_s > 0; i++) {
        if (gpu_alone(g, m, a, prompts[i], lens[i], gen[i], inv_s, 0, A, &err) ||
            gpu_alone(g, m, a, prompts[i], lens[i], gen[i], inv_s, a->chunk, B, &err)) {
            fprintf(stderr, "check-forward: GPU alone: %s\n", duet_err_text(&err));
            return 2;
        }
        double m1, m2;
        size_t d1 = n_diff(A, keep + (size_t)i * inv_s * V, (size_t)inv_s * V, &m1);
        size_t d2 = n_diff(B, A, (size_t)inv_s * V, &m2);
        printf("invariance prompt %d (len %d, %d steps): alone vs batch of %d: %zu values differ (max %.3g); "
               "chunk %d vs single-shot: %zu differ (max %.3g)\n",
               i, lens[i], inv_s, N, d1, m1, a->chunk, d2, m2);
        inv_bad += d1 != 0 || d2 != 0;
    }
    printf("invariance: %s (%d prompts, %d steps each, bit-exact logits required)\n", inv_bad ? "FAIL" : "ok", inv_n,
           inv_s);
    for (int i = 0; i < N; i++) {
        free(prompts[i]);
        free(gen[i]);
        free(cl[i]);
    }
    free(prompts); free(gen); free(cl); free(lens); free(seqs); free(items); free(gl); free(keep);
    free(worst); free(sum); free(errs); free(first); free(worst_step); free(A); free(B);
    return bad || inv_bad || greedy_bad ? 1 : 0;
}

/* ---- bench ---- */

/* The phase totals since the last call, per forward call, largest first; then cleared. */
static void print_phases(duet_cuda_t *cu, const char *what)
{
    duet_cuda_phase_totals_t t;
    duet_cuda_phase_totals(cu, &t, 1);
    if (!t.collections)
        return;
    char line[1024];
    double total = duet_fwd_phase_line(&t, line, sizeof line);
    printf("phases %s (GPU ms a call, %ld calls%s):%s total %.3f\n", what, t.collections,
           t.dropped ? ", marks dropped" : "", line, total);
}

static int bench(const args_t *a, const duet_model_t *m, gpu_t *g)
{
    duet_err_t err = {0};
    int V = m->cfg.vocab_size, ctx = a->ctx;
    double copy_gbps = 0, bf16_tf = 0;
    if (duet_cuda_measure_copy(g->cu, (size_t)2 << 30, 10, &copy_gbps) != DUET_OK ||
        duet_cuda_measure_gemm_bf16(g->cu, 8192, 8192, 8192, 5, &bf16_tf) != DUET_OK) {
        fprintf(stderr, "check-forward: ceilings: %s\n", duet_err_text(duet_cuda_error(g->cu)));
        return 2;
    }
    if (a->phases && duet_cuda_phases_enable(g->cu, 1) != DUET_OK) {
        fprintf(stderr, "check-forward: %s\n", duet_err_text(duet_cuda_error(g->cu)));
        return 2;
    }
    printf("ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s; weights on the device %.2f GB\n", copy_gbps, bf16_tf,
           duet_model_cuda_weight_bytes(g->mc) / 1e9);
    int maxb = 1;
    for (int i = 0; i < a->n_batches; i++)
        maxb = a->batches[i] > maxb ? a->batches[i] : maxb;
    int steps = 9; /* two warm-up steps, six timed, one profiled */
    uint32_t per = (uint32_t)((ctx + steps + 2 + a->opts.page_tokens - 1) / a->opts.page_tokens) + 1;
    if (gpu_cache(g, m, &a->opts, per * (uint32_t)(maxb + 2), (uint32_t)(maxb + 2), &err)) {
        fprintf(stderr, "check-forward: %s\n", duet_err_text(&err));
        return 2;
    }
    int32_t *prompt = fwd_make_prompt(999, ctx, V, a->seed);
    float *ldev = NULL;
    if (duet_cuda_malloc(g->cu, (void **)&ldev, sizeof(float) * (size_t)V * maxb) != DUET_OK)
        return 2;
    duet_seq_t *seqs = calloc((size_t)maxb + 2, sizeof *seqs);
    duet_fwd_cuda_opts_t o = {.logits_dev = ldev};
    duet_fwd_cuda_stats_t stt;
    o.stats = &stt;
    /* prefill: warm-up, then timed, in both matmul modes */
    for (int mode = 0; mode < (a->decode_only ? 0 : 2); mode++) {
        duet_cuda_set_invariant(g->cu, mode == 0);
        double best = 1e30;
        for (int rep = 0; rep < 2; rep++) {
            duet_seq_t s = {0};
            if (duet_seq_init(g->hc, &s, &err) != DUET_OK || duet_seq_reserve(g->hc, &s, ctx, &err) != DUET_OK)
                goto fail;
            duet_fwd_item_t it = {.seq = &s, .tokens = prompt, .n_tokens = ctx, .logits_mode = DUET_LOGITS_LAST};
            if (rep == 1)
                duet_cuda_phase_totals(g->cu, &(duet_cuda_phase_totals_t){0}, 1); /* the timed call's only */
            int span = a->profile_prefill && mode == 0 && rep == 1;
            if (span && duet_cuda_profile_span(g->cu, 1) != DUET_OK)
                goto cuda_fail;
            double t0 = duet_time_s();
            if (duet_forward_cuda_ex(g->mc, g->dc, &it, 1, &o, &err) != DUET_OK)
                goto fail;
            double t = duet_time_s() - t0;
            if (span && duet_cuda_profile_span(g->cu, 0) != DUET_OK)
                goto cuda_fail;
            if (rep > 0 && t < best)
                best = t;
            duet_seq_release(g->hc, &s);
        }
        double t_bytes = (stt.weight_bytes + stt.cache_bytes) / (copy_gbps * 1e9);
        double t_flops = stt.flops / (bf16_tf * 1e12);
        double roof = t_bytes > t_flops ? t_bytes : t_flops;
        printf("bench prefill %d tokens (%s matmul): %.1f ms, %.0f tok/s; %.2f TFLOP, %.2f GB weights; roofline %.1f "
               "ms (%s) -> %.1f%% of roofline\n",
               ctx, mode == 0 ? "batch-invariant" : "cuBLASLt for n>32", best * 1e3, ctx / best, stt.flops / 1e12,
               stt.weight_bytes / 1e9, roof * 1e3, t_bytes > t_flops ? "bytes" : "FLOPs", 100.0 * roof / best);
        print_phases(g->cu, mode == 0 ? "prefill (batch-invariant)" : "prefill (cuBLASLt)");
    }
    duet_cuda_set_invariant(g->cu, 1);
    /* decode: one sequence prefilled to ctx, copied to the others */
    for (int i = 0; i < maxb; i++)
        if (duet_seq_init(g->hc, &seqs[i], &err) != DUET_OK ||
            duet_seq_reserve(g->hc, &seqs[i], ctx + steps + 2, &err) != DUET_OK)
            goto fail;
    {
        duet_fwd_item_t it = {.seq = &seqs[0], .tokens = prompt, .n_tokens = ctx, .logits_mode = DUET_LOGITS_NONE};
        if (duet_forward_cuda_ex(g->mc, g->dc, &it, 1, &o, &err) != DUET_OK)
            goto fail;
    }
    for (int bi = 0; bi < a->n_batches; bi++) {
        int b = a->batches[bi];
        for (int i = 1; i < b; i++)
            if (duet_kv_cache_cuda_copy_seq(g->dc, &seqs[0], &seqs[i], &err) != DUET_OK)
                goto fail;
        duet_fwd_item_t *items = calloc((size_t)b, sizeof *items);
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)b * steps);
        for (int i = 0; i < b * steps; i++)
            toks[i] = 2 + (int32_t)(fwd_mix64(a->seed + 77 + (uint64_t)i) % (uint64_t)(V - 2));
        double tsum = 0, wb = 0, cb = 0, fl = 0, hp = 0, hq = 0;
        int timed = 0;
        for (int s = 0; s < steps; s++) {
            for (int i = 0; i < b; i++)
                items[i] = (duet_fwd_item_t){.seq = &seqs[i], .tokens = &toks[s * b + i], .n_tokens = 1,
                                             .logits_mode = DUET_LOGITS_LAST};
            if (s == 2)
                duet_cuda_phase_totals(g->cu, &(duet_cuda_phase_totals_t){0}, 1); /* the timed steps' only */
            /* one untimed step for a profiler run (ncu --profile-from-start off) */
            if (s == steps - 1 && a->phases)
                break;
            if (s == steps - 1 && !a->profile_prefill && duet_cuda_profile_span(g->cu, 1) != DUET_OK)
                goto cuda_fail;
            double t0 = duet_time_s();
            if (duet_forward_cuda_ex(g->mc, g->dc, items, b, &o, &err) != DUET_OK)
                goto fail;
            double t = duet_time_s() - t0;
            if (s == steps - 1) {
                if (!a->profile_prefill && duet_cuda_profile_span(g->cu, 0) != DUET_OK)
                    goto cuda_fail;
                continue;
            }
            if (s >= 2) {
                tsum += t;
                wb += stt.weight_bytes;
                cb += stt.cache_bytes;
                fl += stt.flops;
                hp += stt.host_plan_s;
                hq += stt.host_queue_s;
                timed++;
            }
        }
        double t = tsum / timed;
        wb /= timed;
        cb /= timed;
        fl /= timed;
        double t_bytes = (wb + cb) / (copy_gbps * 1e9), t_flops = fl / (bf16_tf * 1e12);
        double roof = t_bytes > t_flops ? t_bytes : t_flops;
        printf("bench decode batch %d at context %d: %.2f ms/step, %.0f tok/s; %.2f GB weights + %.3f GB cache, "
               "%.3f TFLOP a step; roofline %.3f ms (%s) -> %.1f%% of roofline\n",
               b, ctx, t * 1e3, b / t, wb / 1e9, cb / 1e9, fl / 1e12, roof * 1e3, t_bytes > t_flops ? "bytes" : "FLOPs",
               100.0 * roof / t);
        printf("host decode batch %d: plan built and queued at %.3f ms, last launch queued at %.3f ms of the %.3f ms "
               "step\n", b, hp / timed * 1e3, hq / timed * 1e3, t * 1e3);
        char what[64];
        snprintf(what, sizeof what, "decode batch %d", b);
        print_phases(g->cu, what);
        free(items);
        free(toks);
        /* rewind the copies for the next batch size */
        for (int i = 0; i < b; i++)
            seqs[i].n_past = ctx;
    }
    for (int i = 0; i < maxb; i++)
        duet_seq_release(g->hc, &seqs[i]);
    free(seqs);
    free(prompt);
    duet_cuda_free(g->cu, ldev);
    gpu_cache_free(g);
    return 0;
cuda_fail:
    err = *duet_cuda_error(g->cu);
fail:
    fprintf(stderr, "check-forward: bench: %s\n", duet_err_text(&err));
    return 2;
}

/* ---- staging ---- */

/* 1 when every unit of `s` (its pages, its slot) is equal in the host and device pools. */
static int stage_equal(gpu_t *g, const duet_seq_t *s, duet_err_t *err)
{
    uint32_t np = duet_kv_cache_n_pages(g->hc), ns = duet_kv_cache_n_slots(g->hc);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(g->hc, (duet_pool_kind_t)k);
        const uint8_t *hb = duet_kv_cache_pool_base(g->hc, (duet_pool_kind_t)k);
        const uint8_t *db = duet_kv_cache_cuda_pool_base(g->dc, (duet_pool_kind_t)k);
        size_t bytes = duet_kv_cache_pool_bytes(g->hc, (duet_pool_kind_t)k);
        if (!hb || !db || !bytes || !l->n_layers)
            continue;
        uint8_t *buf = malloc(bytes);
        if (!buf || duet_cuda_download(g->cu, buf, db, bytes) != DUET_OK) {
            free(buf);
            *err = *duet_cuda_error(g->cu);
            return -1;
        }
        uint32_t units = l->paged ? np : ns, per = l->paged ? s->n_pages : 1;
        for (uint32_t ly = 0; ly < l->n_layers; ly++)
            for (uint32_t j = 0; j < per; j++) {
                size_t off = ((size_t)ly * units + (l->paged ? s->pages[j] : s->slot)) * l->page_bytes;
                if (memcmp(hb + off, buf + off, l->page_bytes) != 0) {
                    fprintf(stderr, "check-forward: staging: pool %d layer %u unit %u differs\n", k, ly, j);
                    free(buf);
                    return 0;
                }
            }
        free(buf);
    }
    return 1;
}

/* Every device pool of g filled with seeded random bytes (pool k from seed + k). */
static duet_status_t fill_device_pools(gpu_t *g, uint64_t seed, duet_err_t *err)
{
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        uint8_t *db = duet_kv_cache_cuda_pool_base(g->dc, (duet_pool_kind_t)k);
        size_t bytes = duet_kv_cache_pool_bytes(g->hc, (duet_pool_kind_t)k);
        if (db && bytes && duet_cuda_fill_random(g->cu, db, bytes, DUET_DT_U8, seed + (uint64_t)k) != DUET_OK) {
            *err = *duet_cuda_error(g->cu);
            return DUET_ERR_CUDA;
        }
    }
    return DUET_OK;
}

static int staging(const args_t *a, const duet_model_t *m, gpu_t *g)
{
    duet_err_t err = {0};
    int tokens = a->staging, L = m->cfg.num_hidden_layers, reps = 7, bad = 0;
    uint32_t per = (uint32_t)((tokens + a->opts.page_tokens - 1) / a->opts.page_tokens);
    double h2d_pin = 0, d2h_pin = 0;
    if (duet_cuda_measure_host_copy(g->cu, (size_t)1 << 30, 0, 5, &d2h_pin) != DUET_OK ||
        duet_cuda_measure_host_copy(g->cu, (size_t)1 << 30, 1, 5, &h2d_pin) != DUET_OK) {
        fprintf(stderr, "check-forward: ceilings: %s\n", duet_err_text(duet_cuda_error(g->cu)));
        return 2;
    }
    /* two sequences: the timed one (the second) holds pages per..2*per-1 and slot 1 */
    duet_seq_t s0 = {0}, s1 = {0};
    if (gpu_cache(g, m, &a->opts, 2 * per + 1, 2, &err) || duet_kv_cache_cuda_map_host(g->dc, &err) != DUET_OK ||
        duet_seq_init(g->hc, &s0, &err) != DUET_OK || duet_seq_reserve(g->hc, &s0, tokens, &err) != DUET_OK ||
        duet_seq_init(g->hc, &s1, &err) != DUET_OK || duet_seq_reserve(g->hc, &s1, tokens, &err) != DUET_OK)
        goto fail;
    if (fill_device_pools(g, 1234, &err) != DUET_OK)
        goto fail;
    const duet_seq_t *one[1] = {&s1};
    double t_layer[16], t_all[16], t_up[16];
    uint64_t bytes = 0, b = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = duet_time_s();
        bytes = 0;
        for (int l = 0; l < L; l++) {
            if (duet_kv_cache_cuda_stage(g->dc, DUET_STAGE_TO_HOST, l, one, NULL, 1, &b, &err) != DUET_OK)
                goto fail;
            bytes += b;
        }
        t_layer[r] = duet_time_s() - t0;
        t0 = duet_time_s();
        if (duet_kv_cache_cuda_stage(g->dc, DUET_STAGE_TO_HOST, -1, one, NULL, 1, &b, &err) != DUET_OK)
            goto fail;
        t_all[r] = duet_time_s() - t0;
        if (b != bytes) {
            fprintf(stderr, "check-forward: staging: %llu bytes layer by layer, %llu in one call\n",
                    (unsigned long long)bytes, (unsigned long long)b);
            bad = 1;
        }
        int eq = stage_equal(g, &s1, &err);
        if (eq < 0)
            goto fail;
        bad |= !eq;
        /* the way back: clobber the device copy, then host -> device */
        if (fill_device_pools(g, 99 + (uint64_t)r * DUET_POOL_COUNT, &err) != DUET_OK)
            goto fail;
        if (duet_cuda_sync(g->cu) != DUET_OK) {
            err = *duet_cuda_error(g->cu);
            goto fail;
        }
        t0 = duet_time_s();
        if (duet_kv_cache_cuda_stage(g->dc, DUET_STAGE_TO_DEVICE, -1, one, NULL, 1, &b, &err) != DUET_OK)
            goto fail;
        t_up[r] = duet_time_s() - t0;
        eq = stage_equal(g, &s1, &err);
        if (eq < 0)
            goto fail;
        bad |= !eq;
    }
    qsort(t_layer, (size_t)reps, sizeof(double), fwd_cmp_double);
    qsort(t_all, (size_t)reps, sizeof(double), fwd_cmp_double);
    qsort(t_up, (size_t)reps, sizeof(double), fwd_cmp_double);
    double tl = t_layer[reps / 2], ta = t_all[reps / 2], tu = t_up[reps / 2];
    printf("staging ceilings: pinned cudaMemcpy device->host %.1f GB/s, host->device %.1f GB/s (1 GiB)\n", d2h_pin,
           h2d_pin);
    printf("staging %d tokens (%u pages, %d layers, kv %s, index-k %s): %.2f MB a request; bytes %s\n", tokens, per, L,
           duet_cache_dtype_name(a->opts.kv_dtype), duet_cache_dtype_name(a->opts.index_k_dtype), bytes / 1e6,
           bad ? "DIFFER" : "equal both ways");
    printf("staging device->host, layer by layer (%d calls, as prefill): %.3f ms, %.1f GB/s = %.0f%% of pinned\n", L,
           tl * 1e3, bytes / tl / 1e9, 100.0 * bytes / tl / 1e9 / d2h_pin);
    printf("staging device->host, one call: %.3f ms, %.1f GB/s = %.0f%% of pinned\n", ta * 1e3, bytes / ta / 1e9,
           100.0 * bytes / ta / 1e9 / d2h_pin);
    printf("staging host->device, one call (as decode): %.3f ms, %.1f GB/s = %.0f%% of pinned\n", tu * 1e3,
           bytes / tu / 1e9, 100.0 * bytes / tu / 1e9 / h2d_pin);
    duet_seq_release(g->hc, &s0);
    duet_seq_release(g->hc, &s1);
    gpu_cache_free(g);
    return bad ? 1 : 0;
fail:
    fprintf(stderr, "check-forward: staging: %s\n", duet_err_text(&err));
    return 2;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: duet-check-forward --model DIR [options]\n"
               "  --prompts N --tokens T    check: N prompts, T greedy tokens each (default 20, 256)\n"
               "  --kv-dtype fp8|bf16 --index-k-dtype fp8|bf16   cache encodings (default bf16)\n"
               "  --tol X                   per-prompt median normalized logits error allowed (default 1e-5)\n"
               "  --chunk N                 chunk size of the invariance check's chunked prefill (default 7)\n"
               "  --invariance N,S          prompts and steps of the invariance check (default 4,8)\n"
               "  --bench                   timings instead: --ctx N (default 4096), --batches 1,32\n"
               "  --decode-only             with --bench: the decode steps only (no prefill timings)\n"
               "  --phases                  with --bench: each timing's GPU time by phase of the forward call\n"
               "  --profile-prefill         with --bench: the profiler's span (cudaProfilerStart) around the\n"
               "                            timed batch-invariant prefill instead of the last decode step\n"
               "  --staging N               the workers' staging copies for an N-token sequence, checked and timed\n"
               "  --tp N                    check mode on a tensor-parallel group of GPUs N.. of --device (NCCL)\n"
               "  --exact                   CPU-exact mode (DUET_CUDA_EXACT): check mode requires every logit of\n"
               "                            every step to be the CPU's bits, so the same greedy tokens\n"
               "  --device N --seed S --page-tokens N\n");
}

int main(int argc, char **argv)
{
    args_t a = {.tp = 1, .n_prompts = 20, .n_tokens = 256, .chunk = 7, .inv_prompts = 4, .inv_steps = 8, .ctx = 4096,
                .batches = {1, 32}, .n_batches = 2, .seed = 20260101, .tol = 1e-5,
                .opts = {.page_tokens = 256, .kv_dtype = DUET_CACHE_BF16, .index_k_dtype = DUET_CACHE_BF16}};
    enum { O_MODEL = 256, O_P, O_T, O_KV, O_IK, O_TOL, O_CHUNK, O_INV, O_BENCH, O_CTX, O_BATCH, O_DEV, O_SEED, O_PT,
           O_STAGE, O_TP, O_DECODE_ONLY, O_PHASES, O_PROFILE_PREFILL, O_EXACT, O_HELP };
    static const struct option lo[] = {
        {"model", 1, 0, O_MODEL}, {"prompts", 1, 0, O_P}, {"tokens", 1, 0, O_T}, {"kv-dtype", 1, 0, O_KV},
        {"index-k-dtype", 1, 0, O_IK}, {"tol", 1, 0, O_TOL}, {"chunk", 1, 0, O_CHUNK}, {"invariance", 1, 0, O_INV},
        {"bench", 0, 0, O_BENCH}, {"ctx", 1, 0, O_CTX}, {"batches", 1, 0, O_BATCH}, {"device", 1, 0, O_DEV},
        {"seed", 1, 0, O_SEED}, {"page-tokens", 1, 0, O_PT}, {"staging", 1, 0, O_STAGE}, {"tp", 1, 0, O_TP},
        {"decode-only", 0, 0, O_DECODE_ONLY}, {"phases", 0, 0, O_PHASES},
        {"profile-prefill", 0, 0, O_PROFILE_PREFILL}, {"exact", 0, 0, O_EXACT}, {"help", 0, 0, O_HELP},
        {0, 0, 0, 0}};
    int o;
    duet_log_init_from_env();
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case O_MODEL: a.model_dir = optarg; break;
        case O_P: a.n_prompts = atoi(optarg); break;
        case O_T: a.n_tokens = atoi(optarg); break;
        case O_KV:
        case O_IK:
            if (fwd_cache_dtype_opt(optarg, o == O_KV, &a.opts)) {
                usage(stderr);
                return 2;
            }
            break;
        case O_TOL: a.tol = strtod(optarg, NULL); break;
        case O_CHUNK: a.chunk = atoi(optarg); break;
        case O_INV: sscanf(optarg, "%d,%d", &a.inv_prompts, &a.inv_steps); break;
        case O_BENCH: a.bench = 1; break;
        case O_DECODE_ONLY: a.decode_only = 1; break;
        case O_PHASES: a.phases = 1; break;
        case O_PROFILE_PREFILL: a.profile_prefill = 1; break;
        case O_EXACT: a.exact = 1; break;
        case O_CTX: a.ctx = atoi(optarg); break;
        case O_BATCH: {
            a.n_batches = 0;
            for (char *p = optarg; *p && a.n_batches < 8;) {
                a.batches[a.n_batches++] = (int)strtol(p, &p, 10);
                if (*p == ',')
                    p++;
                else
                    break;
            }
            break;
        }
        case O_DEV: a.device = atoi(optarg); break;
        case O_SEED: a.seed = strtoull(optarg, NULL, 10); break;
        case O_PT: a.opts.page_tokens = atoi(optarg); break;
        case O_STAGE: a.staging = atoi(optarg); break;
        case O_TP: a.tp = atoi(optarg); break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (a.exact && (a.tp > 1 || a.staging)) {
        fprintf(stderr, "duet-check-forward: --exact: check or bench mode on one GPU\n");
        return 2;
    }
    if (a.tp < 1 || a.tp > DUET_TP_MAX || (a.tp > 1 && (a.bench || a.staging))) {
        fprintf(stderr, "duet-check-forward: --tp %d: 1 to %d, check mode only\n", a.tp, DUET_TP_MAX);
        return 2;
    }
    if (!a.model_dir || a.n_prompts < 1 || a.n_tokens < 1 || a.staging < 0 || a.staging > (1 << 24)) {
        usage(stderr);
        return 2;
    }
    duet_err_t err = {0};
    duet_model_t *m = NULL;
    gpu_t g = {.tp = a.tp, .device = a.device};
    double t0 = duet_time_s();
    duet_status_t st = duet_model_load(a.model_dir, &m, &err);
    if (st == DUET_OK)
        st = duet_cuda_create(a.device, &g.cu, &err);
    if (st == DUET_OK && a.exact)
        duet_cuda_set_exact(g.cu, 1); /* before the upload, which then keeps the weights untiled */
    if (st == DUET_OK && !a.staging && a.tp == 1)
        st = duet_model_cuda_upload(g.cu, m, &g.mc, &err);
    if (st != DUET_OK) {
        fprintf(stderr, "duet-check-forward: %s\n", duet_err_text(&err));
        duet_model_cuda_destroy(&g.mc);
        duet_cuda_destroy(&g.cu);
        duet_model_destroy(&m);
        return 2;
    }
    duet_cuda_info_t info;
    duet_cuda_info(g.cu, &info);
    fprintf(stderr, "duet-check-forward: %s: loaded and uploaded in %.1f s (%.2f GB on %s)\n", a.model_dir,
            duet_time_s() - t0, g.mc ? duet_model_cuda_weight_bytes(g.mc) / 1e9 : 0.0, info.name);
    int rc = a.staging ? staging(&a, m, &g) : a.bench ? bench(&a, m, &g) : check(&a, m, &g);
    duet_model_cuda_destroy(&g.mc);
    duet_cuda_destroy(&g.cu);
    duet_model_destroy(&m);
    return rc;
}
