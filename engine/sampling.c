#include "sampling.h"

#include <math.h>
#include <stdlib.h>

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

int32_t duet_sample(const float *logits, int vocab, const duet_sampling_t *s, int64_t position)
{
    /* NaN logits never win; +inf wins outright (greedy, and sampling falls back to it) */
    int32_t best = -1;
    for (int i = 0; i < vocab; i++)
        if (logits[i] == logits[i] && (best < 0 || logits[i] > logits[best]))
            best = i;
    if (best < 0)
        return 0;
    if (!(s->temperature > 0.0f) || isinf(logits[best]))
        return best;
    float inv_t = 1.0f / s->temperature, mx = logits[best] * inv_t;
    cand_t *c = malloc(sizeof(cand_t) * (size_t)vocab);
    if (!c)
        return best;
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        float e = expf(logits[i] * inv_t - mx);
        if (e >= 1e-9f)
            c[n++] = (cand_t){e, i};
    }
    if (n == 0) { /* only when the scaled maximum overflowed */
        free(c);
        return best;
    }
    qsort(c, (size_t)n, sizeof(cand_t), cand_cmp);
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
    free(c);
    return pick;
}
