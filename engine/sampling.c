#include "sampling.h"
#include "sample_exp.h"

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

uint64_t duet_sample_draw53(uint64_t seed, int64_t position)
{
    return splitmix64(splitmix64(seed) ^ (uint64_t)position) >> 11;
}

double duet_sample_uniform(uint64_t seed, int64_t position)
{
    return (double)duet_sample_draw53(seed, position) * (1.0 / 9007199254740992.0);
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

/* Exact sums: a candidate's p (a float in [1e-9, 1]) is an integer multiple of 2^-53, so p *
 * 2^53 is an integer below 2^54 and any sum of a vocabulary of them fits 128 bits.  Sums in this
 * form do not depend on the order of their terms. */
__extension__ typedef unsigned __int128 u128;

/* The candidates are bucketed by their key 0x3f800000 - bits(p) (in [0, 0x0ef68fa1], smaller for
 * larger p) on its top bits: 2048 buckets of 2^17 keys, 1/64 of a binade each, in the order of
 * the sort.  A row's filters and draw then sort only the buckets where a cut falls. */
#define SB_SHIFT 17
#define SB_N 2048

/* What a sampled row needs besides the logits: the candidates (in id order, then scattered by
 * bucket), the radix sort's second array and counts, and the buckets' counts, starts, exact
 * sums and sorted flags.  One per thread of duet_sample_batch, reused row after row (fresh 1 MB
 * allocations per row are pages the kernel maps and zeroes each time: a fifth of a row's
 * time). */
typedef struct {
    cand_t *c, *tmp, *g;
    uint32_t *cnt, *bcnt, *bstart; /* cnt: 3 * 2048; bcnt, bstart: SB_N */
    u128 *bsum;
    uint8_t *bsorted;
    int cap;
} sample_ws_t;

static void ws_free(sample_ws_t *w)
{
    free(w->c);
    free(w->tmp);
    free(w->g);
    free(w->cnt);
    free(w->bsum);
    free(w->bsorted);
    memset(w, 0, sizeof *w);
}

static int ws_reserve(sample_ws_t *w, int vocab)
{
    if (w->cap >= vocab)
        return 0;
    ws_free(w);
    w->c = malloc(sizeof(cand_t) * (size_t)vocab);
    w->tmp = malloc(sizeof(cand_t) * (size_t)vocab);
    w->g = malloc(sizeof(cand_t) * (size_t)vocab);
    w->cnt = malloc(sizeof(uint32_t) * (3 * 2048 + 2 * SB_N));
    w->bsum = malloc(sizeof(u128) * SB_N);
    w->bsorted = malloc(SB_N);
    if (!w->c || !w->tmp || !w->g || !w->cnt || !w->bsum || !w->bsorted) {
        ws_free(w);
        return -1;
    }
    w->bcnt = w->cnt + 3 * 2048;
    w->bstart = w->bcnt + SB_N;
    w->cap = vocab;
    return 0;
}

static inline uint32_t f_bits(float p)
{
    uint32_t bits;
    memcpy(&bits, &p, sizeof bits);
    return bits;
}

/* Sort candidates by p descending, then id ascending: the order cand_cmp defines, in linear
 * time.  Every p is a positive finite float (a duet_sample_exp result >= 1e-9), so its bits order like
 * its value; an LSD radix sort on the complemented bits (3 passes of 11 bits) is stable, and
 * the candidates come in ascending id, so ties keep ascending id.  Used on the buckets a row's
 * cuts fall in (a full vocabulary sorted this way takes about a millisecond, qsort ten or
 * more).  w holds room for n. */
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
        uint32_t k = ~f_bits(c[i].p);
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
        for (int i = 0; i < n; i++)
            dst[h[(~f_bits(src[i].p) >> shift) & 2047]++] = src[i];
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

/* p * 2^53 for a candidate's p (normal, exponent >= 97 since p >= 1e-9): exact. */
static inline uint64_t f53(float p)
{
    uint32_t bits = f_bits(p);
    return (uint64_t)((bits & 0x7fffffu) | 0x800000u) << (((bits >> 23) & 0xffu) - 97u);
}

static inline int sb_of(float p) { return (int)((0x3f800000u - f_bits(p)) >> SB_SHIFT); }

/* Bucket b's candidates in the order of the sort (sorted once, when a cut or the draw needs
 * their order). */
static cand_t *sb_sorted(sample_ws_t *w, int b)
{
    cand_t *g = w->g + w->bstart[b];
    if (!w->bsorted[b]) {
        sort_candidates(g, (int)w->bcnt[b], w);
        w->bsorted[b] = 1;
    }
    return g;
}

/* The candidates kept so far: every bucket before kb, and the first kj (>= 1) of bucket kb in
 * sorted order. */
typedef struct {
    int kb, kj;
} sb_keep_t;

/* The first candidate alone (the largest p: its bucket sorted). */
static sb_keep_t sb_first(sample_ws_t *w)
{
    int b = 0;
    while (!w->bcnt[b])
        b++;
    (void)sb_sorted(w, b);
    return (sb_keep_t){b, 1};
}

/* Their exact sum. */
static u128 sb_keep_sum(sample_ws_t *w, sb_keep_t k)
{
    u128 sum = 0;
    for (int b = 0; b < k.kb; b++)
        sum += w->bsum[b];
    if (k.kj == (int)w->bcnt[k.kb]) {
        sum += w->bsum[k.kb];
    } else {
        const cand_t *g = sb_sorted(w, k.kb);
        for (int i = 0; i < k.kj; i++)
            sum += f53(g[i].p);
    }
    return sum;
}

/* The first kept candidate (in sorted order) at which the running exact sum P, including it,
 * passes the test: P * 2^z >= rhs (reach 1) or P * 2^z > rhs (reach 0).  Returns the
 * position just after it as a keep, and its id in *id; the running sum there in *at. */
static sb_keep_t sb_cross(sample_ws_t *w, sb_keep_t k, int z, u128 rhs, int reach, int32_t *id, u128 *at)
{
    u128 cum = 0;
    for (int b = 0; b <= k.kb; b++) {
        int m = b < k.kb ? (int)w->bcnt[b] : k.kj;
        if (!m)
            continue;
        if (b < k.kb) { /* a whole bucket short of the target: past it without its order */
            u128 next = (cum + w->bsum[b]) << z;
            if (reach ? next < rhs : next <= rhs) {
                cum += w->bsum[b];
                continue;
            }
        }
        const cand_t *g = sb_sorted(w, b);
        for (int i = 0; i < m; i++) {
            cum += f53(g[i].p);
            u128 v = cum << z;
            if (reach ? v >= rhs : v > rhs) {
                *id = g[i].id;
                *at = cum;
                return i + 1 < m || b < k.kb ? (sb_keep_t){b, i + 1} : k;
            }
        }
    }
    /* not reached: both callers' targets lie below the whole sum (top_p < 1, u < 1) */
    const cand_t *g = sb_sorted(w, k.kb);
    *id = g[k.kj - 1].id;
    *at = cum;
    return k;
}

/* ev[i] = duet_sample_exp(logits[i] * inv_t - mx): a loop without branches, which the compiler
 * vectorizes (engine/meson.build builds this file with -fno-trapping-math) */
static void exp_row(const float *logits, int vocab, float inv_t, float mx, float *ev)
{
    for (int i = 0; i < vocab; i++)
        ev[i] = duet_sample_exp(logits[i] * inv_t - mx);
}

/* duet_sample with w's buffers (reserved here for the vocabulary; without memory, the greedy
 * pick, as before).  The order is (p desc, id asc); sums are exact, so the draw is the same
 * whatever order they are taken in: only the buckets where top-k, min-p, top-p or the draw
 * cut are sorted (a flat distribution's 129k candidates: about 110 a bucket). */
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
    memset(w->bcnt, 0, sizeof(uint32_t) * SB_N);
    memset(w->bsorted, 0, SB_N);
    int n = 0;
    /* every id's p first (the radix sort's array holds them until it sorts), then the candidates */
    float *ev = (float *)(void *)w->tmp;
    exp_row(logits, vocab, inv_t, mx, ev);
    for (int i = 0; i < vocab; i++) {
        float e = ev[i];
        if (e >= 1e-9f) { /* and e <= 1: x <= 0 */
            w->bcnt[sb_of(e)]++;
            c[n++] = (cand_t){e, i};
        }
    }
    if (n == 0) /* only when the scaled maximum overflowed */
        return best;
    /* scatter by bucket, each in id order */
    uint32_t at = 0;
    int last = 0;
    for (int b = 0; b < SB_N; b++) {
        w->bstart[b] = at;
        at += w->bcnt[b];
        if (w->bcnt[b])
            last = b;
    }
    uint32_t *pos = w->cnt; /* sort_candidates' counters, free until a bucket is sorted */
    memcpy(pos, w->bstart, sizeof(uint32_t) * SB_N);
    for (int i = 0; i < n; i++)
        w->g[pos[sb_of(c[i].p)]++] = c[i];
    for (int b = 0; b <= last; b++) { /* the buckets' exact sums, each a run of g */
        u128 sum = 0;
        const cand_t *g = w->g + w->bstart[b];
        for (uint32_t i = 0; i < w->bcnt[b]; i++)
            sum += f53(g[i].p);
        w->bsum[b] = sum;
    }
    sb_keep_t k = {last, (int)w->bcnt[last]};
    int32_t id;
    u128 cut;
    if (s->top_k > 0 && n > s->top_k) /* the first top_k: the k-th is where the count reaches k */
        for (int b = 0, cum = 0; b < SB_N; b++) {
            if (cum + (int)w->bcnt[b] >= s->top_k) {
                k = (sb_keep_t){b, s->top_k - cum};
                break;
            }
            cum += (int)w->bcnt[b];
        }
    if (s->min_p > 0.0f) {
        /* p >= min_p * p_max in double: p >= tf, the smallest float not below it */
        sb_keep_t f = sb_first(w);
        double thr = (double)s->min_p * (double)w->g[w->bstart[f.kb]].p;
        float tf = (float)thr;
        if ((double)tf < thr)
            tf = nextafterf(tf, INFINITY);
        if (tf > 1e-9f && tf <= 1.0f) { /* tf <= min_p * 1: the largest p, duet_sample_exp(0), is 1 */
            int bl = sb_of(tf);
            /* the kept prefix of bucket bl: its candidates with p >= tf */
            int j = 0;
            if (bl <= k.kb && w->bcnt[bl]) {
                const cand_t *g = sb_sorted(w, bl);
                int lim = bl < k.kb ? (int)w->bcnt[bl] : k.kj;
                while (j < lim && g[j].p >= tf)
                    j++;
            }
            if (bl < k.kb || (bl == k.kb && j < k.kj)) {
                if (j > 0) {
                    k = (sb_keep_t){bl, j};
                } else { /* nothing of bucket bl: up to the last nonempty bucket before it (p_max's
                          * at least, since p_max >= tf) */
                    int b = bl - 1;
                    while (b >= 0 && !w->bcnt[b])
                        b--;
                    k = b >= 0 ? (sb_keep_t){b, (int)w->bcnt[b]} : f;
                }
            }
        }
    }
    u128 sum = sb_keep_sum(w, k);
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        /* the shortest prefix whose exact sum P reaches top_p * S: P * 2^z >= M * S with top_p =
         * M * 2^-z; below 2^-32 the first candidate alone reaches it (p_max = 1, S < 2^17) */
        uint32_t tb = f_bits(s->top_p);
        int e = (int)((tb >> 23) & 0xffu);
        if (e < 95) {
            k = sb_first(w);
            sum = sb_keep_sum(w, k);
        } else {
            k = sb_cross(w, k, 150 - e, (u128)((tb & 0x7fffffu) | 0x800000u) * sum, 1, &id, &cut);
            sum = cut;
        }
    }
    /* the draw: the first candidate whose running sum exceeds u * S (u = U * 2^-53) */
    uint64_t u = duet_sample_draw53(s->seed, position);
    (void)sb_cross(w, k, 53, (u128)u * sum, 0, &id, &cut);
    return id;
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
