#include "sampling.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

void duet_sampling_default(duet_sampling_t *s)
{
    s->temperature = 0.0f;
    s->top_p = 1.0f;
    s->top_k = 0;
    s->min_p = 0.0f;
    s->seed = 0;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double duet_sample_uniform(uint64_t seed, int64_t position)
{
    uint64_t r = splitmix64(splitmix64(seed) ^ (uint64_t)position);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
    float p;
    int32_t id;
} cand_t;

static int cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* What a sampled row needs besides the logits: the candidates, the radix sort's second array
 * and its counts.  One per thread of duet_sample_batch, reused row after row (fresh 1 MB
 * allocations per row are pages the kernel maps and zeroes each time: a fifth of a row's
 * time). */
typedef struct {
    cand_t *c, *tmp;
    uint32_t *cnt;
    int cap;
} sample_ws_t;

static int ws_reserve(sample_ws_t *w, int vocab)
{
    if (w->cap >= vocab)
        return 0;
    free(w->c);
    free(w->tmp);
    free(w->cnt);
    w->c = malloc(sizeof(cand_t) * (size_t)vocab);
    w->tmp = malloc(sizeof(cand_t) * (size_t)vocab);
    w->cnt = malloc(sizeof(uint32_t) * 3 * 2048);
    w->cap = w->c && w->tmp && w->cnt ? vocab : 0;
    return w->cap ? 0 : -1;
}

static void ws_free(sample_ws_t *w)
{
    free(w->c);
    free(w->tmp);
    free(w->cnt);
    memset(w, 0, sizeof *w);
}

/* Sort candidates by p descending, then id ascending: the order cand_cmp defines, in linear
 * time.  Every p is a positive finite float (an expf result >= 1e-9), so its bits order like
 * its value; an LSD radix sort on the complemented bits (3 passes of 11 bits) is stable, and
 * the candidates come in ascending id, so ties keep ascending id.  A full vocabulary (129k
 * candidates with a flat distribution) sorts in about a millisecond where qsort took ten or
 * more, on the decode worker's thread, for every sampled row.  w holds room for n. */
static void sort_candidates(cand_t *c, int n, sample_ws_t *w)
{
    if (n < 64) {
        qsort(c, (size_t)n, sizeof(cand_t), cand_cmp);
        return;
    }
    cand_t *tmp = w->tmp;
    uint32_t *cnt = w->cnt;
    memset(cnt, 0, sizeof(uint32_t) * 3 * 2048);
    for (int i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &c[i].p, sizeof bits);
        uint32_t k = ~bits;
        cnt[k & 2047]++;
        cnt[2048 + ((k >> 11) & 2047)]++;
        cnt[4096 + (k >> 22)]++;
    }
    cand_t *src = c, *dst = tmp;
    for (int pass = 0; pass < 3; pass++) {
        uint32_t *h = cnt + pass * 2048, sum = 0;
        for (int b = 0; b < 2048; b++) {
            uint32_t v = h[b];
            h[b] = sum;
            sum += v;
        }
        int shift = pass * 11;
        for (int i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &src[i].p, sizeof bits);
            dst[h[((~bits) >> shift) & 2047]++] = src[i];
        }
        cand_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != c) /* three passes: the result is in tmp */
        memcpy(c, src, sizeof(cand_t) * (size_t)n);
}

/* The largest logit's id, the lowest on ties (-0 and +0 tie), NaN never chosen; -1 when every
 * logit is NaN.  Two passes: the maximum over eight independent lanes (a comparison NaN never
 * passes, so NaN is ignored as in one pass), then the first position holding it; the same
 * answer as one pass that tracks the index, without its dependent chain of index loads (32
 * rows of a 129k vocabulary: 5.2 -> 2.9 ms on one core of the 2-core build machine). */
static int32_t argmax_first(const float *logits, int vocab)
{
    float m[8];
    for (int k = 0; k < 8; k++)
        m[k] = -INFINITY;
    int i = 0;
    for (; i + 8 <= vocab; i += 8)
        for (int k = 0; k < 8; k++)
            m[k] = logits[i + k] > m[k] ? logits[i + k] : m[k];
    for (; i < vocab; i++)
        m[0] = logits[i] > m[0] ? logits[i] : m[0];
    float mx = m[0];
    for (int k = 1; k < 8; k++)
        mx = m[k] > mx ? m[k] : mx;
    for (i = 0; i < vocab; i++)
        if (logits[i] == mx) /* rows of only -inf and NaN: the first -inf */
            return i;
    return -1; /* every logit NaN */
}

/* duet_sample with w's buffers (reserved here for the vocabulary; without memory, the greedy
 * pick, as before). */
static int32_t sample_ws(const float *logits, int vocab, const duet_sampling_t *s, int64_t position, sample_ws_t *w)
{
    /* NaN logits never win; +inf wins outright (greedy, and sampling falls back to it) */
    int32_t best = argmax_first(logits, vocab);
    if (best < 0)
        return 0;
    if (!(s->temperature > 0.0f) || isinf(logits[best]))
        return best;
    float inv_t = 1.0f / s->temperature, mx = logits[best] * inv_t;
    if (ws_reserve(w, vocab) != 0)
        return best;
    cand_t *c = w->c;
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        /* below -20.8 expf is under 9.3e-10 even with its rounding, so the candidate would be
         * dropped: skip the call (most of a peaked distribution's vocabulary) */
        float x = logits[i] * inv_t - mx;
        if (x < -20.8f)
            continue;
        float e = expf(x);
        if (e >= 1e-9f)
            c[n++] = (cand_t){e, i};
    }
    if (n == 0) /* only when the scaled maximum overflowed */
        return best;
    sort_candidates(c, n, w);
    if (s->top_k > 0 && n > s->top_k)
        n = s->top_k;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += c[i].p;
    if (s->min_p > 0.0f) {
        int keep = 0;
        while (keep < n && c[keep].p / sum >= s->min_p * (c[0].p / sum))
            keep++;
        n = keep > 0 ? keep : 1;
    }
    sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += c[i].p;
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        double acc = 0.0;
        int keep = 0;
        while (keep < n) {
            acc += c[keep].p / sum;
            keep++;
            if (acc >= s->top_p)
                break;
        }
        n = keep;
        sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += c[i].p;
    }
    double u = duet_sample_uniform(s->seed, position) * sum, acc = 0.0;
    int32_t pick = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    return pick;
}

int32_t duet_sample(const float *logits, int vocab, const duet_sampling_t *s, int64_t position)
{
    sample_ws_t w = {0};
    int32_t t = sample_ws(logits, vocab, s, position, &w);
    ws_free(&w);
    return t;
}

typedef struct {
    const float *logits;
    int vocab, n;
    const duet_sampling_t *const *sp;
    const int64_t *positions;
    int32_t *out;
    atomic_int next;
} sample_batch_t;

static void *sample_rows(void *arg)
{
    sample_batch_t *b = arg;
    sample_ws_t w = {0}; /* this thread's, for all its rows */
    for (;;) {
        int i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n)
            break;
        b->out[i] = sample_ws(b->logits + (size_t)i * (size_t)b->vocab, b->vocab, b->sp[i], b->positions[i], &w);
    }
    ws_free(&w);
    return NULL;
}

#define SAMPLE_MAX_THREADS 32

void duet_sample_batch(const float *logits, int vocab, int n, const duet_sampling_t *const *sp,
                       const int64_t *positions, int32_t *out, int max_threads)
{
    sample_batch_t b = {.logits = logits, .vocab = vocab, .n = n, .sp = sp, .positions = positions, .out = out};
    atomic_init(&b.next, 0);
    /* threads for the work: a sampled row is one unit (a sort over the vocabulary), a greedy row
     * two scans of it, a unit per 256k logits (32 greedy rows of a 129k vocabulary are about 3 ms
     * on one core, a decode step's worth; on two cores 1.4 ms) */
    double units = 0.0;
    for (int i = 0; i < n; i++)
        units += sp[i]->temperature > 0.0f ? 1.0 : (double)vocab / 262144.0;
    int t = max_threads < SAMPLE_MAX_THREADS ? max_threads : SAMPLE_MAX_THREADS;
    if (t > (int)units)
        t = (int)units;
    pthread_t th[SAMPLE_MAX_THREADS];
    int started = 0;
    for (; started < t - 1; started++) /* the caller is one of the t */
        if (pthread_create(&th[started], NULL, sample_rows, &b) != 0)
            break;
    sample_rows(&b);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}
