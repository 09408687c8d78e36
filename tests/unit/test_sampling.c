/* duet_sample against a plain reference of the same contract (candidates sorted with qsort
 * by probability descending, then id ascending, sums exact): the same token for every draw, on
 * flat and peaked distributions with ties, for every truncation option. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample_exp.h"
#include "sampling.h"

typedef struct {
    float p;
    int32_t id;
} ref_cand_t;

static int ref_cmp(const void *a, const void *b)
{
    const ref_cand_t *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* p * 2^53, exact (p >= 1e-9 is a multiple of 2^-53) */
static unsigned __int128 ref_f53(float p)
{
    return (unsigned __int128)ldexp((double)p, 53);
}

/* The contract in its plainest form: every candidate sorted, exact sums as 128-bit integers of
 * 2^-53, each filter a prefix of the order. */
static int32_t ref_sample(const float *logits, int vocab, const duet_sampling_t *s, int64_t position)
{
    int32_t best = -1;
    for (int i = 0; i < vocab; i++)
        if (logits[i] == logits[i] && (best < 0 || logits[i] > logits[best]))
            best = i;
    if (best < 0)
        return 0;
    if (!(s->temperature > 0.0f) || isinf(logits[best]))
        return best;
    float inv_t = 1.0f / s->temperature, mx = logits[best] * inv_t;
    ref_cand_t *c = malloc(sizeof(ref_cand_t) * (size_t)vocab);
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        float e = duet_sample_exp(logits[i] * inv_t - mx);
        if (e >= 1e-9f)
            c[n++] = (ref_cand_t){e, i};
    }
    qsort(c, (size_t)n, sizeof(ref_cand_t), ref_cmp);
    if (s->top_k > 0 && n > s->top_k)
        n = s->top_k;
    if (s->min_p > 0.0f) {
        double thr = (double)s->min_p * (double)c[0].p;
        int keep = 0;
        while (keep < n && (double)c[keep].p >= thr)
            keep++;
        n = keep > 0 ? keep : 1;
    }
    unsigned __int128 sum = 0;
    for (int i = 0; i < n; i++)
        sum += ref_f53(c[i].p);
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        /* the shortest prefix whose sum P has P >= top_p * S, exactly: P * 2^55 >= (top_p *
         * 2^55) * S, top_p * 2^55 an integer for top_p >= 2^-32 (below that the first alone) */
        unsigned __int128 tp = (unsigned __int128)ldexp((double)s->top_p, 55), acc = 0;
        int keep = 0;
        while (keep < n) {
            acc += ref_f53(c[keep].p);
            keep++;
            if (s->top_p < 0x1p-32f || (acc << 55) >= tp * sum)
                break;
        }
        n = keep;
        sum = acc;
    }
    unsigned __int128 u = (unsigned __int128)ldexp(duet_sample_uniform(s->seed, position), 53) * sum, acc = 0;
    int32_t pick = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += ref_f53(c[i].p);
        if ((acc << 53) > u) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    return pick;
}

/* duet_sample_exp against e^x in double over the sampler's range: every float of [-20.8, -19.8]
 * (the bottom, where the cut at 1e-9 falls), strided sweeps of [-1, 0] and [-87, 0].  Within
 * 2 ulp (1.13 measured), never above 1 (the buckets take p <= 1), under 1e-9 below -20.8 (the sampler skips
 * those), 1 at 0, 0 for NaN and below -87. */
static void test_exp(void **state)
{
    (void)state;
    double worst = 0.0;
    float worst_x = 0.0f;
    long n = 0;
    for (int range = 0; range < 3; range++) {
        float lo = range == 0 ? -1.0f : range == 1 ? -20.8f : -87.0f, hi = range == 0 ? 0.0f : range == 1 ? -19.8f : 0.0f;
        uint32_t ulo, uhi; /* negative floats: larger bits are more negative */
        memcpy(&ulo, &hi, 4);
        memcpy(&uhi, &lo, 4);
        if (hi == 0.0f)
            ulo = 0x80000000u;
        uint32_t step = range == 0 ? 61 : range == 2 ? 997 : 1; /* [-1, 0] holds a billion floats */
        for (uint32_t b = ulo; b <= uhi && b >= ulo; b += step) {
            float x;
            memcpy(&x, &b, 4);
            float e = duet_sample_exp(x);
            double ref = exp((double)x);
            int ex;
            frexp(ref, &ex);
            double ulp = ldexp(1.0, (ex - 1 < -126 ? -126 : ex - 1) - 23);
            double err = fabs((double)e - ref) / ulp;
            if (err > worst) {
                worst = err;
                worst_x = x;
            }
            assert_true(e <= 1.0f);
            n++;
        }
    }
    print_message("duet_sample_exp: %ld values, worst %.2f ulp at %.9g\n", n, worst, (double)worst_x);
    assert_true(worst < 2.0);
    assert_true(duet_sample_exp(0.0f) == 1.0f);
    assert_true(duet_sample_exp(-20.8f) < 1e-9f);
    assert_true(duet_sample_exp(-87.5f) == 0.0f);
    assert_true(duet_sample_exp(NAN) == 0.0f);
}

static uint64_t rng = 88172645463325252ull;
static double rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void test_same_draws(void **state)
{
    (void)state;
    const int V = 129280;
    float *lg = malloc(sizeof(float) * V);
    const float temps[] = {0.3f, 0.8f, 1.0f, 2.0f};
    for (int round = 0; round < 24; round++) {
        int mode = round % 3;
        for (int i = 0; i < V; i++) {
            double x = mode == 0 ? rnd() * 0.5                      /* flat: nearly every id a candidate */
                       : mode == 1 ? (rnd() - 0.5) * 30.0            /* peaked */
                                   : (double)((int)(rnd() * 8)) * 0.25; /* coarse: many exact ties */
            lg[i] = (float)x;
        }
        for (int t = 0; t < 4; t++) {
            duet_sampling_t s;
            duet_sampling_default(&s);
            s.temperature = temps[t];
            s.seed = 1000u + (uint64_t)round;
            s.top_k = round % 4 == 1 ? 50 : 0;
            s.top_p = round % 4 == 2 ? 0.9f : 1.0f;
            s.min_p = round % 4 == 3 ? 0.05f : 0.0f;
            for (int64_t pos = 0; pos < 3; pos++)
                assert_int_equal(duet_sample(lg, V, &s, pos), ref_sample(lg, V, &s, pos));
        }
    }
    free(lg);
}

/* Many small rows with every filter combined, so that cuts land everywhere: inside buckets,
 * on their edges, on ties spread over several buckets, on the first candidate. */
static void test_filters_combined(void **state)
{
    (void)state;
    float lg[3000];
    for (int round = 0; round < 400; round++) {
        int V = 1 + (int)(rnd() * 3000);
        int mode = round % 4;
        for (int i = 0; i < V; i++) {
            double x = mode == 0 ? rnd() * 4.0                           /* spread */
                       : mode == 1 ? (double)((int)(rnd() * 5)) * 0.01     /* a few values, many ties */
                       : mode == 2 ? (rnd() < 0.5 ? 0.0 : -rnd() * 25.0)   /* half tied at the top */
                                   : (rnd() - 0.5) * 60.0;                 /* some below the 1e-9 cut */
            lg[i] = (float)x;
        }
        duet_sampling_t s;
        duet_sampling_default(&s);
        s.temperature = (float)(0.05 + rnd() * 2.0);
        s.seed = 77u + (uint64_t)round;
        s.top_k = rnd() < 0.5 ? (int)(rnd() * 40) : 0;
        s.top_p = rnd() < 0.5 ? (float)(0.01 + rnd() * 0.98) : 1.0f;
        s.min_p = rnd() < 0.4 ? (float)(rnd() * 0.9) : 0.0f;
        if (round % 50 == 7)
            s.top_p = 1e-12f; /* below 2^-32: the first candidate alone */
        for (int64_t pos = 0; pos < 8; pos++)
            assert_int_equal(duet_sample(lg, V, &s, pos), ref_sample(lg, V, &s, pos));
    }
}

/* Rows sampled on several threads: the same tokens as one call per row, in order. */
static void test_batch_same_as_rows(void **state)
{
    (void)state;
    const int V = 129280, N = 37;
    float *lg = malloc(sizeof(float) * (size_t)V * N);
    duet_sampling_t s[37];
    const duet_sampling_t *sp[37];
    int64_t pos[37];
    int32_t got[37];
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < V; i++)
            lg[(size_t)r * V + i] = (float)(r % 2 ? rnd() * 0.5 : (rnd() - 0.5) * 20.0);
        duet_sampling_default(&s[r]);
        s[r].temperature = r % 5 == 0 ? 0.0f : 0.8f; /* some greedy rows among sampled ones */
        s[r].top_p = r % 3 == 1 ? 0.9f : 1.0f;
        s[r].seed = 77u + (uint64_t)r;
        sp[r] = &s[r];
        pos[r] = 100 + r;
    }
    for (int threads = 1; threads <= 8; threads *= 2) {
        memset(got, 0xff, sizeof got);
        duet_sample_batch(lg, V, N, sp, pos, got, threads);
        for (int r = 0; r < N; r++)
            assert_int_equal(got[r], duet_sample(lg + (size_t)r * V, V, sp[r], pos[r]));
    }
    free(lg);
}

/* Greedy picks on rows built to break a two-pass argmax: NaN anywhere (first, last, between
 * equal maxima), -0/+0 ties, +inf and -inf, rows of only -inf or only NaN, the maximum in the
 * tail past the last group of eight, equal maxima far apart; every width from 1 to 40 and a
 * vocabulary-sized row.  duet_sample and duet_sample_batch (several threads) against the
 * one-pass reference. */
static void test_greedy_edges(void **state)
{
    (void)state;
    duet_sampling_t g;
    duet_sampling_default(&g);
    uint64_t x = 12345;
    float *row = malloc(sizeof(float) * 129280);
    assert_non_null(row);
    for (int vocab = 1; vocab <= 40; vocab++)
        for (int kind = 0; kind < 10; kind++)
            for (int rep = 0; rep < 8; rep++) {
                for (int i = 0; i < vocab; i++) {
                    x = x * 6364136223846793005ull + 1442695040888963407ull;
                    int r = (int)(x >> 33) % 7;
                    float v = (float)r - 3.0f;
                    switch (kind) {
                    case 1: v = r == 0 ? NAN : v; break;
                    case 2: v = r < 3 ? -0.0f : r < 5 ? 0.0f : -1.0f; break;
                    case 3: v = r == 0 ? INFINITY : r == 1 ? NAN : v; break;
                    case 4: v = r == 0 ? NAN : -INFINITY; break;
                    case 5: v = NAN; break;
                    case 6: v = -INFINITY; break;
                    case 7: v = i == vocab - 1 ? 10.0f : v; break; /* the maximum in the tail */
                    case 8: v = i == 0 || i == vocab - 1 ? 5.0f : r == 0 ? NAN : v; break;
                    case 9: v = i == 0 ? NAN : i == vocab - 1 ? NAN : v; break;
                    default: break;
                    }
                    row[i] = v;
                }
                int32_t want = ref_sample(row, vocab, &g, 0), got = duet_sample(row, vocab, &g, 0);
                if (want != got)
                    fail_msg("vocab %d kind %d rep %d: got %d, want %d", vocab, kind, rep, got, want);
            }
    /* vocabulary-sized rows in a batch spread over threads */
    enum { ROWS = 24, V = 129280 };
    float *big = malloc(sizeof(float) * (size_t)ROWS * V);
    assert_non_null(big);
    const duet_sampling_t *sp[ROWS];
    int64_t pos[ROWS];
    int32_t out[ROWS];
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < V; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            big[(size_t)r * V + i] = (float)((x >> 40) % 1000) / 100.0f;
        }
        if (r % 3 == 1)
            big[(size_t)r * V + (size_t)(r * 977 % V)] = NAN;
        sp[r] = &g;
        pos[r] = r;
    }
    duet_sample_batch(big, V, ROWS, sp, pos, out, 4);
    for (int r = 0; r < ROWS; r++)
        assert_int_equal(out[r], ref_sample(big + (size_t)r * V, V, &g, r));
    free(big);
    free(row);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_exp), cmocka_unit_test(test_same_draws),
                                       cmocka_unit_test(test_filters_combined),
                                       cmocka_unit_test(test_batch_same_as_rows),
                                       cmocka_unit_test(test_greedy_edges)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
