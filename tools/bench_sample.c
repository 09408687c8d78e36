/* duet-bench-sample: the host's share of a decode step, picking its tokens.
 *
 * Times duet_sample_batch over a batch of logits rows (seeded uniform logits, so every
 * sampled row has a flat distribution: nearly the whole vocabulary is a candidate, the
 * slowest case) for greedy rows and for sampled rows (temperature 0.8, top-p 0.95), then for
 * sampled rows of the same logits six times wider (a peaked distribution), on 1 and
 * on the requested threads, and prints each best-of time beside the time this machine takes
 * to read the same bytes once with every thread (the scan's ceiling).
 *
 *   duet-bench-sample [--rows N] [--vocab V] [--threads T] [--reps R]
 * defaults: 32 rows, the V4 vocabulary (129280), the online cores up to 16, 10 repetitions. */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sampling.h"
#include "time_util.h"

typedef struct {
    const float *p;
    size_t n;
    double sum;
} read_part_t;

static void *read_part(void *arg)
{
    read_part_t *r = arg;
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= r->n; i += 8) /* eight independent sums: bound by the reads, not the adds */
        for (int k = 0; k < 8; k++)
            s[k] += r->p[i + k];
    for (; i < r->n; i++)
        s[0] += r->p[i];
    double t = 0.0;
    for (int k = 0; k < 8; k++)
        t += s[k];
    r->sum = t;
    return NULL;
}

/* Seconds to read n floats once on `threads` threads (a sum each, so nothing is skipped). */
static double read_time(const float *p, size_t n, int threads)
{
    pthread_t th[64];
    read_part_t part[64];
    double t0 = duet_time_s();
    size_t per = (n + (size_t)threads - 1) / (size_t)threads;
    for (int t = 0; t < threads; t++) {
        size_t b = (size_t)t * per < n ? (size_t)t * per : n, e = b + per < n ? b + per : n;
        part[t] = (read_part_t){p + b, e - b, 0.0};
        if (t > 0 && pthread_create(&th[t], NULL, read_part, &part[t]) != 0)
            read_part(&part[t]);
    }
    read_part(&part[0]);
    for (int t = 1; t < threads; t++)
        pthread_join(th[t], NULL);
    double dt = duet_time_s() - t0, s = 0.0;
    for (int t = 0; t < threads; t++)
        s += part[t].sum;
    if (s == 1234.5) /* keeps the sums */
        fprintf(stderr, "%g\n", s);
    return dt;
}

int main(int argc, char **argv)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int rows = 32, vocab = 129280, threads = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu, reps = 10;
    static const struct option lo[] = {{"rows", 1, 0, 'r'}, {"vocab", 1, 0, 'v'}, {"threads", 1, 0, 't'},
                                       {"reps", 1, 0, 'n'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'r': rows = atoi(optarg); break;
        case 'v': vocab = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'n': reps = atoi(optarg); break;
        default:
            fprintf(o == 'h' ? stdout : stderr,
                    "usage: duet-bench-sample [--rows N] [--vocab V] [--threads T] [--reps R]\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (rows < 1 || rows > 4096 || vocab < 1 || vocab > (1 << 24) || threads < 1 || threads > 64 || reps < 1) {
        fprintf(stderr, "duet-bench-sample: rows 1..4096, vocab 1..16777216, threads 1..64, reps >= 1\n");
        return 2;
    }
    size_t n = (size_t)rows * (size_t)vocab;
    float *logits = malloc(sizeof(float) * n);
    duet_sampling_t *sp = malloc(sizeof(duet_sampling_t) * (size_t)rows);
    const duet_sampling_t **spp = malloc(sizeof(*spp) * (size_t)rows);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)rows);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)rows);
    if (!logits || !sp || !spp || !pos || !out) {
        fprintf(stderr, "duet-bench-sample: out of memory\n");
        return 2;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        logits[i] = (float)((x >> 40) % 100000) / 10000.0f - 5.0f;
    }
    double rd1 = 1e30, rdt = 1e30;
    for (int r = 0; r < reps; r++) {
        double a = read_time(logits, n, 1), b = read_time(logits, n, threads);
        rd1 = a < rd1 ? a : rd1;
        rdt = b < rdt ? b : rdt;
    }
    printf("sample: %d rows x %d logits (%.1f MB); one read of them: %.3f ms on 1 thread (%.1f GB/s), %.3f ms on %d "
           "(%.1f GB/s)\n",
           rows, vocab, n * 4 / 1e6, rd1 * 1e3, n * 4 / rd1 / 1e9, rdt * 1e3, threads, n * 4 / rdt / 1e9);
    for (int kind = 0; kind < 3; kind++) {
        if (kind == 2) /* a peaked distribution: the same logits six times wider */
            for (size_t i = 0; i < n; i++)
                logits[i] *= 6.0f;
        for (int i = 0; i < rows; i++) {
            duet_sampling_default(&sp[i]);
            if (kind >= 1) {
                sp[i].temperature = 0.8f;
                sp[i].top_p = 0.95f;
                sp[i].seed = 1000 + (uint64_t)i;
            }
            spp[i] = &sp[i];
            pos[i] = 100 + i;
        }
        int tl[2] = {1, threads};
        for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = duet_time_s();
                duet_sample_batch(logits, vocab, rows, spp, pos, out, tl[k]);
                double dt = duet_time_s() - t0;
                best = dt < best ? dt : best;
            }
            double ceil = k ? rdt : rd1;
            printf("sample %s rows, %d thread%s: %.3f ms a batch (%.3f ms a row); the read alone %.3f ms = %.0f%% of "
                   "this time (first token %d)\n",
                   kind == 2   ? "sampled, peaked (logits 6x wider)"
                   : kind == 1 ? "sampled (temperature 0.8, top-p 0.95)"
                               : "greedy",
                   tl[k], tl[k] > 1 ? "s" : "",
                   best * 1e3, best * 1e3 / rows, ceil * 1e3, 100.0 * ceil / best, out[0]);
        }
    }
    free(logits);
    free(sp);
    free(spp);
    free(pos);
    free(out);
    return 0;
}
