/* duet-check-ops: every CUDA operation against the CPU reference, and its
 * speed against ceilings measured in the same run (DESIGN §8; dav1d's
 * checkasm with CUDA in the place of assembly).
 *
 *   duet-check-ops [--op NAME] [--seed N] [--bench] [--device N]
 *                  [--ceilings-out FILE | --ceilings-in FILE] [--no-header] [--list] [--print-header] [--info]
 *
 * For each operation and several shapes (the V4-Flash widths among them) the
 * inputs are seeded random values (never zeros), the GPU output is poisoned
 * before the call (so an unwritten element fails), and the result is compared
 * with the CPU reference: element for element for copies, packing, quantized
 * cache entries, top-k indices and argmax; by normalized error
 * ||gpu - cpu|| / ||cpu|| against the tolerance stated per operation for float
 * math (docs/CUDA.md says why each).  Large shapes are checked on sampled rows.
 * A failing case prints its parameters and the first differing elements.
 * MoE (--op moe): moe_route's expert ids exactly and weights by normalized error;
 * moe_experts (sort, grouped w1+w3, SwiGLU, grouped w2, combine) against forward.c's
 * expert loop on the CPU ("cpu"), bit for bit against the per-expert device path
 * ("1by1"), and bit for bit for three rows run alone ("solo": batch invariance).
 * CPU-exact mode (--op exact): duet_cuda_set_exact's operations bit for bit against the CPU.
 * copy_list (--op copy_list): bit for bit against memcpy over the whole
 * destination, random lists of several shapes and alignments, device and pinned
 * host sides.
 *
 * --bench also times each case on the device: 3 warm-up calls, then the
 * median of 21 calls each timed with events after a read of twice the L2 size
 * (so every call starts with a cold L2, as a decode step reads weights from
 * memory), and prints time, achieved GB/s and TFLOP/s, and the ratio of the
 * roofline time max(bytes / copy bandwidth, FLOPs / matrix or fp32 rate) to
 * the measured time.  The ceilings (one large device copy, cuBLASLt bf16 and
 * block-scaled fp8 GEMMs, an fp32 FMA loop, pinned host copies) are measured
 * first, or read from --ceilings-in so that one process per operation
 * (scripts/device-check.sh) shares them.
 *
 * DUET_CHECK_CASE=SUBSTR runs only the matmul cases whose shape text contains SUBSTR (to
 * profile one launch, e.g. under ncu).
 *
 * Exit status: 0 all cases passed, 1 a case failed, 2 the device or a call failed. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache_layout.h"
#include "cpu/kernels_cpu.h"
#include "dtype.h"
#include "duet_cuda.h"
#include "forward.h"
#include "kernels.h"
#include "model_config.h"
#include "sampling.h"

#define N_TIMED 21
#define N_WARM 3

/* ---- run state ---- */

typedef struct {
    double copy_gbps, h2d_gbps, d2h_gbps;
    double bf16_tflops, fp8_tflops, fp32_tflops;
} ceilings_t;

typedef struct {
    duet_cuda_t *c;
    int device;
    uint64_t seed;
    int bench;
    const char *op;
    int threads;
    int n_pass, n_fail;
    ceilings_t ceil;
} ck_t;

typedef enum { BOUND_MEM = 0, BOUND_BF16, BOUND_FP8, BOUND_FP32 } bound_t;

typedef struct {
    const char *op;
    char shape[64];
    int exact;   /* 1: err counts differing elements; 0: normalized error */
    double err, tol;
    int pass;
    char note[256];
    /* bench */
    double us, bytes, flops;
    bound_t bound;
} row_t;

static void die(ck_t *ck, const char *what)
{
    fprintf(stderr, "duet-check-ops: %s failed: %s\n", what,
            ck->c ? duet_err_text(duet_cuda_error(ck->c)) : "no context");
    fflush(stdout);
    exit(2);
}

#define CK(expr)                                                                                                   \
    do {                                                                                                           \
        if ((expr) != DUET_OK)                                                                                     \
            die(ck, #expr);                                                                                        \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "duet-check-ops: out of host memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

static void *dmalloc(ck_t *ck, size_t n)
{
    void *p = NULL;
    CK(duet_cuda_malloc(ck->c, &p, n));
    return p;
}

static void *dupload(ck_t *ck, const void *h, size_t n)
{
    void *p = dmalloc(ck, n);
    CK(duet_cuda_upload(ck->c, p, h, n));
    return p;
}

static void dpoison(ck_t *ck, void *p, size_t n) { CK(duet_cuda_memset(ck->c, p, 0xff, n)); }

static void ddownload(ck_t *ck, void *h, const void *d, size_t n)
{
    CK(duet_cuda_sync(ck->c));
    CK(duet_cuda_download(ck->c, h, d, n));
}

/* ---- random inputs (xoshiro256**, seeded per case) ---- */

typedef struct {
    uint64_t s[4];
} rng_t;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_init(rng_t *r, uint64_t seed, const char *tag)
{
    uint64_t x = seed;
    for (const char *p = tag; *p; p++)
        x = x * 131 + (unsigned char)*p;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_u64(rng_t *r)
{
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

static double rng_unit(rng_t *r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

static float rng_normal(rng_t *r)
{
    double u1 = rng_unit(r), u2 = rng_unit(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float *rand_f32(rng_t *r, size_t n, float sd)
{
    float *p = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        p[i] = rng_normal(r) * sd;
    return p;
}

static uint8_t *rand_bytes(rng_t *r, size_t n)
{
    uint8_t *p = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng_u64(r);
    return p;
}

/* n distinct (unit, idx) slots of units pages of epp entries, in random order (n <= units * epp) */
static void random_slots(rng_t *r, uint32_t units, uint32_t epp, size_t n, uint32_t *unit, uint32_t *idx)
{
    uint32_t total = units * epp;
    uint32_t *perm = xmalloc(sizeof(uint32_t) * total);
    for (uint32_t i = 0; i < total; i++)
        perm[i] = i;
    for (uint32_t i = total - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rng_u64(r) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        unit[i] = perm[i] / epp;
        idx[i] = perm[i] % epp;
    }
    free(perm);
}

/* ---- comparisons ---- */

static double nerr(const float *a, const float *ref, size_t n, size_t *worst)
{
    double num = 0.0, den = 0.0, wmax = -1.0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        if (isnan(a[i]) != isnan(ref[i]) || (isinf(a[i]) && a[i] != ref[i]))
            return INFINITY;
        if (isnan(ref[i]) || isinf(ref[i]))
            continue;
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > wmax) {
            wmax = fabs(d);
            *worst = i;
        }
    }
    if (den == 0.0)
        return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

/* Set while the CPU-exact group reruns other groups' cases: their float rows then require the
 * CPU's bits instead of a tolerance. */
static int g_rows_bits;
static void row_f32_bits(row_t *row, const float *gpu, const float *ref, size_t n);

static void row_float(row_t *row, const float *gpu, const float *ref, size_t n, double tol)
{
    if (g_rows_bits) {
        row_f32_bits(row, gpu, ref, n);
        return;
    }
    size_t w;
    row->exact = 0;
    row->tol = tol;
    row->err = nerr(gpu, ref, n, &w);
    row->pass = row->err <= tol;
    if (!row->pass && !row->note[0])
        snprintf(row->note, sizeof row->note, "worst [%zu]: gpu %.9g cpu %.9g", w, gpu[w], ref[w]);
}

/* Elements of esz bytes whose bytes differ (NaN payloads included); *first the first such, else
 * (size_t)-1. */
static size_t count_diff(const void *gpu, const void *ref, size_t n, size_t esz, size_t *first)
{
    const uint8_t *a = gpu, *b = ref;
    size_t diff = 0;
    *first = (size_t)-1;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i * esz, b + i * esz, esz)) {
            if (*first == (size_t)-1)
                *first = i;
            diff++;
        }
    return diff;
}

/* Exact: err counts the differing elements. */
static void row_exact_diff(row_t *row, size_t diff)
{
    row->exact = 1;
    row->tol = 0;
    row->err = (double)diff;
    row->pass = diff == 0;
}

static void row_bytes(row_t *row, const void *gpu, const void *ref, size_t n)
{
    size_t first, diff = count_diff(gpu, ref, n, 1, &first);
    row_exact_diff(row, diff);
    if (diff && !row->note[0])
        snprintf(row->note, sizeof row->note, "first byte %zu: gpu 0x%02x cpu 0x%02x", first,
                 ((const uint8_t *)gpu)[first], ((const uint8_t *)ref)[first]);
}

/* Floats bit for bit: err counts the elements whose bits differ (NaN payloads included). */
static void row_f32_bits(row_t *row, const float *gpu, const float *ref, size_t n)
{
    size_t first, diff = count_diff(gpu, ref, n, sizeof(float), &first);
    row_exact_diff(row, diff);
    if (diff && !row->note[0])
        snprintf(row->note, sizeof row->note, "first [%zu]: gpu %.9g cpu %.9g", first, gpu[first], ref[first]);
}

/* Exact int32 results: several arrays one operation writes (n parts: name[i], n_el[i] values of
 * gpu[i] against ref[i]); the note names the first part and index that differ. */
static void row_i32_parts(row_t *row, int n, const char *const *name, const int32_t *const *gpu,
                          const int32_t *const *ref, const size_t *n_el)
{
    size_t diff = 0;
    int fp = -1;
    size_t fi = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < n_el[p]; i++)
            if (gpu[p][i] != ref[p][i]) {
                if (fp < 0) {
                    fp = p;
                    fi = i;
                }
                diff++;
            }
    row->exact = 1;
    row->tol = 0;
    row->err = (double)diff;
    row->pass = diff == 0;
    if (diff && !row->note[0])
        snprintf(row->note, sizeof row->note, "first %s[%zu]: gpu %d cpu %d", name[fp], fi, gpu[fp][fi], ref[fp][fi]);
}

static void row_i32(row_t *row, const int32_t *gpu, const int32_t *ref, size_t n)
{
    static const char *const whole[] = {""};
    row_i32_parts(row, 1, whole, &gpu, &ref, &n);
}

/* ---- output ---- */

static void print_header(const ck_t *ck)
{
    printf("%-13s %-30s %-5s %9s %8s %-4s", "op", "shape", "check", "error", "tol", "res");
    if (ck->bench)
        printf(" | %9s %8s %6s %8s %6s %-5s", "time_us", "GB/s", "copy%", "TFLOP/s", "roof%", "bound");
    printf("\n");
    fflush(stdout);
}

static double bound_rate(const ck_t *ck, bound_t b)
{
    switch (b) {
    case BOUND_BF16: return ck->ceil.bf16_tflops;
    case BOUND_FP8: return ck->ceil.fp8_tflops > 0 ? ck->ceil.fp8_tflops : ck->ceil.bf16_tflops;
    case BOUND_FP32: return ck->ceil.fp32_tflops;
    default: return 0.0;
    }
}

static void print_row(ck_t *ck, row_t *row)
{
    char err[32];
    if (row->exact)
        snprintf(err, sizeof err, "%.0f", row->err);
    else
        snprintf(err, sizeof err, "%.2e", row->err);
    printf("%-13s %-30.30s %-5s %9s %8.0e %-4s", row->op, row->shape, row->exact ? "exact" : "nerr", err,
           row->exact ? 0.0 : row->tol, row->pass ? "ok" : "FAIL");
    if (ck->bench) {
        if (row->us > 0) {
            double gbps = row->bytes / (row->us * 1e3), tf = row->flops / (row->us * 1e6);
            double t_mem = ck->ceil.copy_gbps > 0 ? row->bytes / (ck->ceil.copy_gbps * 1e3) : 0.0; /* us */
            double rate = bound_rate(ck, row->bound);
            double t_cmp = rate > 0 ? row->flops / (rate * 1e6) : 0.0;
            double floor_us = t_mem > t_cmp ? t_mem : t_cmp;
            const char *bn = t_cmp > t_mem ? (row->bound == BOUND_BF16   ? "bf16"
                                              : row->bound == BOUND_FP8 ? "fp8"
                                                                        : "fp32")
                                           : "copy";
            double copy_pct = ck->ceil.copy_gbps > 0 ? 100.0 * gbps / ck->ceil.copy_gbps : 0.0;
            printf(" | %9.2f %8.1f %5.0f%% %8.2f %5.0f%% %-5s", row->us, gbps, copy_pct, tf,
                   100.0 * floor_us / row->us, bn);
        } else {
            printf(" | %9s %8s %6s %8s %6s %-5s", "-", "-", "-", "-", "-", "-");
        }
    }
    if (row->note[0])
        printf("  %s", row->note);
    printf("\n");
    fflush(stdout);
    if (row->pass)
        ck->n_pass++;
    else
        ck->n_fail++;
}

static row_t row_new(const char *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static row_t row_new(const char *op, const char *fmt, ...)
{
    row_t r;
    memset(&r, 0, sizeof r);
    r.op = op;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.shape, sizeof r.shape, fmt, ap);
    va_end(ap);
    return r;
}

/* ---- timing ---- */

typedef duet_status_t (*op_fn)(ck_t *ck, void *arg);

static int cmp_i32_(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median microseconds of N_TIMED event-timed calls, each after an L2 flush (DUET_CHECK_WARM_L2=1:
 * after a 50 µs wait that touches no memory instead, so that an operation whose bytes fit in L2
 * reads them from there, the calls before having brought them in).  Either way the call is queued
 * behind a kernel when its timing starts: its host launch latency is not in the time. */
static double time_op(ck_t *ck, op_fn fn, void *arg)
{
    static int warm = -1;
    if (warm < 0) {
        const char *ev = getenv("DUET_CHECK_WARM_L2");
        warm = ev && atoi(ev) != 0;
    }
    for (int i = 0; i < N_WARM; i++)
        CK(fn(ck, arg));
    float t[N_TIMED];
    for (int i = 0; i < N_TIMED; i++) {
        CK(warm ? duet_cuda_busy_us(ck->c, 50) : duet_cuda_flush_l2(ck->c)); /* the call queued behind it */
        CK(duet_cuda_timer_start(ck->c));
        CK(fn(ck, arg));
        CK(duet_cuda_timer_stop(ck->c, &t[i]));
    }
    CK(duet_cuda_sync(ck->c));
    qsort(t, N_TIMED, sizeof(float), cmp_f);
    return t[N_TIMED / 2] * 1e3;
}

static void bench_row(ck_t *ck, row_t *row, op_fn fn, void *arg, double bytes, double flops, bound_t bound)
{
    if (!ck->bench)
        return;
    row->bytes = bytes;
    row->flops = flops;
    row->bound = bound;
    row->us = time_op(ck, fn, arg);
}

/* ---- CPU reference in threads (matmul dominates the check's time) ---- */

typedef struct {
    const duet_weight_t *w;
    int rb, re;
    const float *x;
    int n;
    float *y;
} mm_job_t;

static void *mm_thread(void *p)
{
    mm_job_t *j = p;
    duet_cpu_matmul(j->w, j->rb, j->re, j->x, j->n, j->y);
    return NULL;
}

/* duet_cpu_matmul split over row ranges (each row's result is independent of the split). */
static void ref_matmul(ck_t *ck, const duet_weight_t *w, int rb, int re, const float *x, int n, float *y)
{
    int nt = ck->threads, m = re - rb;
    if (nt > m)
        nt = m > 0 ? m : 1;
    pthread_t th[64];
    mm_job_t jobs[64];
    float *parts[64];
    int chunk = (m + nt - 1) / nt;
    chunk = (chunk + 127) / 128 * 128;
    int used = 0;
    for (int r0 = rb; r0 < re; r0 += chunk, used++) {
        int r1 = r0 + chunk < re ? r0 + chunk : re;
        parts[used] = xmalloc(sizeof(float) * (size_t)n * (size_t)(r1 - r0));
        jobs[used] = (mm_job_t){w, r0, r1, x, n, parts[used]};
        pthread_create(&th[used], NULL, mm_thread, &jobs[used]);
    }
    for (int i = 0; i < used; i++) {
        pthread_join(th[i], NULL);
        int r0 = jobs[i].rb, mm = jobs[i].re - jobs[i].rb;
        for (int t = 0; t < n; t++)
            memcpy(y + (size_t)t * m + (r0 - rb), parts[i] + (size_t)t * mm, sizeof(float) * (size_t)mm);
        free(parts[i]);
    }
}

/* ---- matmul ---- */

typedef struct {
    duet_weight_t hw, dw; /* host / device */
    void *d_data, *d_scale;
    size_t data_bytes, scale_bytes;
    uint8_t *h_data, *h_scale;
} weight_t;

static void weight_make(ck_t *ck, rng_t *r, weight_t *W, duet_dtype_t dt, int rows, int cols, duet_dtype_t sdt)
{
    memset(W, 0, sizeof *W);
    duet_weight_t *w = &W->hw;
    w->dtype = dt;
    w->rows = rows;
    w->cols = cols;
    size_t n = (size_t)rows * cols;
    if (dt == DUET_DT_BF16) {
        uint16_t *p = xmalloc(2 * n);
        for (size_t i = 0; i < n; i++)
            p[i] = duet_f32_to_bf16(rng_normal(r) * 0.05f);
        W->h_data = (uint8_t *)p;
        W->data_bytes = 2 * n;
    } else if (dt == DUET_DT_F32) {
        W->h_data = (uint8_t *)rand_f32(r, n, 0.05f);
        W->data_bytes = 4 * n;
    } else if (dt == DUET_DT_F8_E4M3) {
        W->h_data = rand_bytes(r, n);
        for (size_t i = 0; i < n; i++)
            if ((W->h_data[i] & 0x7f) == 0x7f)
                W->h_data[i] ^= 1; /* no NaN codes (the GPU decode does not special-case them) */
        W->data_bytes = n;
        w->scale_cols = (cols + 127) / 128;
        size_t ns = (size_t)((rows + 127) / 128) * w->scale_cols;
        w->scale_dtype = sdt;
        if (sdt == DUET_DT_F32) {
            float *s = xmalloc(4 * ns);
            for (size_t i = 0; i < ns; i++)
                s[i] = (float)(1e-3 * (1.0 + rng_unit(r)));
            W->h_scale = (uint8_t *)s;
            W->scale_bytes = 4 * ns;
        } else {
            W->h_scale = xmalloc(ns);
            for (size_t i = 0; i < ns; i++)
                W->h_scale[i] = (uint8_t)(116 + rng_u64(r) % 6); /* 2^-11 .. 2^-6 */
            W->scale_bytes = ns;
        }
    } else { /* fp4 */
        W->h_data = rand_bytes(r, n / 2);
        W->data_bytes = n / 2;
        w->scale_cols = cols / 32;
        size_t ns = (size_t)rows * w->scale_cols;
        w->scale_dtype = DUET_DT_F8_E8M0;
        W->h_scale = xmalloc(ns);
        for (size_t i = 0; i < ns; i++)
            W->h_scale[i] = (uint8_t)(120 + rng_u64(r) % 4);
        W->scale_bytes = ns;
    }
    w->data = W->h_data;
    w->scale = W->h_scale;
    W->dw = *w;
    W->d_data = dupload(ck, W->h_data, W->data_bytes);
    W->dw.data = W->d_data;
    if (W->h_scale) {
        W->d_scale = dupload(ck, W->h_scale, W->scale_bytes);
        W->dw.scale = W->d_scale;
    }
}

static void weight_free(ck_t *ck, weight_t *W)
{
    duet_cuda_free(ck->c, W->d_data);
    duet_cuda_free(ck->c, W->d_scale);
    free(W->h_data);
    free(W->h_scale);
}

typedef enum { MM_AUTO = 0, MM_GEMV, MM_GEMV_TC, MM_LT, MM_FP8ACT } mm_kind_t;

typedef struct {
    weight_t *W;
    int rb, re, n;
    float *dx, *dy;
    mm_kind_t kind;
} mm_arg_t;

static duet_status_t mm_call(ck_t *ck, void *p)
{
    mm_arg_t *a = p;
    switch (a->kind) {
    case MM_GEMV: return duet_cuda_matmul_gemv(ck->c, &a->W->dw, a->rb, a->re, a->dx, a->n, a->dy);
    case MM_GEMV_TC: return duet_cuda_matmul_gemv_tc(ck->c, &a->W->dw, a->rb, a->re, a->dx, a->n, a->dy);
    case MM_LT: return duet_cuda_matmul_lt(ck->c, &a->W->dw, a->rb, a->re, a->dx, a->n, a->dy);
    case MM_FP8ACT: return duet_cuda_matmul_fp8_act(ck->c, &a->W->dw, a->rb, a->re, a->dx, a->n, a->dy);
    default: return duet_cuda_matmul(ck->c, &a->W->dw, a->rb, a->re, a->dx, a->n, a->dy);
    }
}

/* The activations the fp8 GEMM sees: per row and 128 columns, scale amax/448 (1 if all zero), e4m3 codes. */
static void quantize_act(const float *x, int cols, float *out)
{
    for (int b = 0; b < cols; b += 128) {
        float amax = 0.0f;
        for (int i = b; i < b + 128; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        for (int i = b; i < b + 128; i++)
            out[i] = duet_e4m3_to_f32(duet_f32_to_e4m3(x[i] / s)) * s;
    }
}

static const char *kind_tag(mm_kind_t k)
{
    return k == MM_GEMV ? " simt" : k == MM_GEMV_TC ? " tc" : "";
}

static const char *dt_short(duet_dtype_t dt, duet_dtype_t sdt)
{
    switch (dt) {
    case DUET_DT_BF16: return "bf16";
    case DUET_DT_F32: return "f32";
    case DUET_DT_F8_E4M3: return sdt == DUET_DT_F32 ? "fp8/f32s" : "fp8";
    default: return "fp4";
    }
}

/* A case's call returned st: UNSUPPORTED fails the row with the context's reason (printed: 1,
 * the case stops there); another error ends the run; DUET_OK: 0. */
static int row_refused(ck_t *ck, row_t *row, duet_status_t st, const char *op)
{
    if (st == DUET_ERR_UNSUPPORTED) {
        row->pass = 0;
        snprintf(row->note, sizeof row->note, "unsupported: %s", duet_err_text(duet_cuda_error(ck->c)));
        print_row(ck, row);
        return 1;
    }
    if (st != DUET_OK)
        die(ck, op);
    return 0;
}

/* case_matmul's weights take these chunk units (duet_weight_t.chunk_units; 0: the default) */
static int mm_chunk_units;

static void case_matmul(ck_t *ck, const char *op, mm_kind_t kind, duet_dtype_t dt, duet_dtype_t sdt, int rows,
                        int cols, int rb, int re, int n, int n_check, double tol)
{
    rng_t r;
    char tag[96];
    snprintf(tag, sizeof tag, "%s/%d/%d/%d/%d/%d/%d", op, (int)dt, rows, cols, rb, re, n);
    rng_init(&r, ck->seed, tag);
    char range[32] = "";
    if (rb != 0 || re != rows)
        snprintf(range, sizeof range, " r%d:%d", rb, re);
    char chunks[32] = "";
    if (mm_chunk_units)
        snprintf(chunks, sizeof chunks, " chunks of %d", mm_chunk_units);
    row_t row = row_new(op, "%s %dx%d%s n=%d%s%s", dt_short(dt, sdt), rows, cols, range, n, kind_tag(kind), chunks);
    const char *only = getenv("DUET_CHECK_CASE"); /* one case (profiling): a substring of its shape */
    if (only && *only && !strstr(row.shape, only))
        return;
    weight_t W;
    weight_make(ck, &r, &W, dt, rows, cols, sdt);
    W.dw.chunk_units = mm_chunk_units;
    int m = re - rb;
    float *x = rand_f32(&r, (size_t)n * cols, 1.0f);
    float *dx = dupload(ck, x, sizeof(float) * (size_t)n * cols);
    float *dy = dmalloc(ck, sizeof(float) * (size_t)n * m);
    dpoison(ck, dy, sizeof(float) * (size_t)n * m);
    mm_arg_t a = {&W, rb, re, n, dx, dy, kind};
    if (row_refused(ck, &row, mm_call(ck, &a), op))
        goto out;
    /* sampled tokens: n_check of them, spread over n */
    int ns = n < n_check ? n : n_check;
    float *y = xmalloc(sizeof(float) * (size_t)n * m);
    ddownload(ck, y, dy, sizeof(float) * (size_t)n * m);
    float *xs = xmalloc(sizeof(float) * (size_t)ns * cols), *ys = xmalloc(sizeof(float) * (size_t)ns * m);
    float *gs = xmalloc(sizeof(float) * (size_t)ns * m);
    for (int i = 0; i < ns; i++) {
        int t = ns == n ? i : (int)((int64_t)i * (n - 1) / (ns - 1 > 0 ? ns - 1 : 1));
        if (kind == MM_FP8ACT)
            quantize_act(x + (size_t)t * cols, cols, xs + (size_t)i * cols);
        else
            memcpy(xs + (size_t)i * cols, x + (size_t)t * cols, sizeof(float) * cols);
        memcpy(gs + (size_t)i * m, y + (size_t)t * m, sizeof(float) * m);
    }
    ref_matmul(ck, &W.hw, rb, re, xs, ns, ys);
    row_float(&row, gs, ys, (size_t)ns * m, tol);
    if (kind == MM_FP8ACT) {
        /* how far the quantized activations move the result from the fp32-activation contract */
        for (int i = 0; i < ns; i++) {
            int t = ns == n ? i : (int)((int64_t)i * (n - 1) / (ns - 1 > 0 ? ns - 1 : 1));
            memcpy(xs + (size_t)i * cols, x + (size_t)t * cols, sizeof(float) * cols);
        }
        ref_matmul(ck, &W.hw, rb, re, xs, ns, ys);
        size_t w;
        double e = nerr(gs, ys, (size_t)ns * m, &w);
        int out = duet_cuda_fp8_act_output(ck->c);
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note),
                 "%svs fp32-x contract %.1e; D %s", row.note[0] ? "; " : "", e,
                 out == 2 ? "bf16" : out == 1 ? "fp32" : "?");
    }
    if (kind == MM_FP8ACT && !row.pass) {
        /* which scale layout cuBLASLt wanted instead (diagnostic) */
        for (int v = 1; v < 4; v++) {
            duet_cuda_fp8_act_scale_layout(ck->c, v);
            dpoison(ck, dy, sizeof(float) * (size_t)n * m);
            if (mm_call(ck, &a) != DUET_OK)
                break;
            ddownload(ck, y, dy, sizeof(float) * (size_t)n * m);
            for (int i = 0; i < ns; i++) {
                int t = ns == n ? i : (int)((int64_t)i * (n - 1) / (ns - 1 > 0 ? ns - 1 : 1));
                memcpy(gs + (size_t)i * m, y + (size_t)t * m, sizeof(float) * m);
                quantize_act(x + (size_t)t * cols, cols, xs + (size_t)i * cols);
            }
            ref_matmul(ck, &W.hw, rb, re, xs, ns, ys);
            size_t w;
            double e = nerr(gs, ys, (size_t)ns * m, &w);
            snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "; layout %d: %.1e", v, e);
        }
        duet_cuda_fp8_act_scale_layout(ck->c, 0);
    }
    if (kind == MM_GEMV_TC && row.pass) {
        /* batch invariance: three tokens run alone (the launch may then be split along the
         * columns where the batch was not) give the batch's values bit for bit */
        float *dx1 = dmalloc(ck, sizeof(float) * (size_t)cols), *dy1 = dmalloc(ck, sizeof(float) * (size_t)m);
        float *y1 = xmalloc(sizeof(float) * (size_t)m);
        int toks[3] = {0, n / 2, n - 1}, same = 1;
        for (int i = 0; i < 3 && same; i++) {
            int t = toks[i];
            duet_cuda_upload(ck->c, dx1, x + (size_t)t * cols, sizeof(float) * (size_t)cols);
            dpoison(ck, dy1, sizeof(float) * (size_t)m);
            mm_arg_t a1 = {&W, rb, re, 1, dx1, dy1, kind};
            if (mm_call(ck, &a1) != DUET_OK)
                die(ck, op);
            ddownload(ck, y1, dy1, sizeof(float) * (size_t)m);
            same = memcmp(y1, y + (size_t)t * m, sizeof(float) * (size_t)m) == 0;
        }
        if (!same)
            row.pass = 0;
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "%ssolo %s",
                 row.note[0] ? "; " : "", same ? "bit-exact" : "DIFFERS");
        free(y1);
        duet_cuda_free(ck->c, dx1);
        duet_cuda_free(ck->c, dy1);
    }
    if (ns < n && !row.note[0])
        snprintf(row.note, sizeof row.note, "checked %d sampled rows", ns);
    {
        double wbytes = (double)W.data_bytes * m / rows + (double)W.scale_bytes * m / rows;
        double bytes = wbytes + 4.0 * n * cols + 4.0 * n * m;
        int tc_min = dt == DUET_DT_F4_E2M1X2 ? DUET_CUDA_TC_MIN_N_FP4 : DUET_CUDA_TC_MIN_N;
        int tc = kind == MM_GEMV_TC || (kind == MM_AUTO && n >= tc_min && dt != DUET_DT_F32);
        bound_t b = kind == MM_FP8ACT ? BOUND_FP8
                    : (kind == MM_LT || tc || (kind == MM_AUTO && n > DUET_CUDA_GEMV_MAX_N)) ? BOUND_BF16
                                                                                             : BOUND_FP32;
        if (dt == DUET_DT_F32 && kind != MM_GEMV)
            b = BOUND_FP32;
        bench_row(ck, &row, mm_call, &a, bytes, 2.0 * n * (double)m * cols, b);
    }
    print_row(ck, &row);
    free(y);
    free(xs);
    free(ys);
    free(gs);
out:
    free(x);
    duet_cuda_free(ck->c, dx);
    duet_cuda_free(ck->c, dy);
    weight_free(ck, &W);
}

static size_t bytes_differ(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += x[i] != y[i];
    return d;
}

typedef struct {
    const duet_weight_t *w;
    int rb, re, n;
    const float *dx;
    float *dy;
    int decode; /* 1: the decode kernel (duet_cuda_matmul_gemv_tc), 0: the engine's entry */
} inv_arg_t;

static duet_status_t inv_call(ck_t *ck, void *p)
{
    inv_arg_t *a = p;
    return a->decode ? duet_cuda_matmul_gemv_tc(ck->c, a->w, a->rb, a->re, a->dx, a->n, a->dy)
                     : duet_cuda_matmul_invariant(ck->c, a->w, a->rb, a->re, a->dx, a->n, a->dy);
}

/* A weight in a tiled layout (duet_cuda_weight_tile: fp4, bf16) against the same weight untiled:
 * duet_cuda_matmul (the engine's entry, batch-invariant) must give the same bytes for n
 * tokens over rows [rb, re); the entry points that do not read the layout refuse it. */
static void case_matmul_tiled(ck_t *ck, duet_dtype_t wdt, int rows, int cols, int rb, int re, int n)
{
    rng_t r;
    char tag[96];
    if (wdt == DUET_DT_F4_E2M1X2) /* the seeds the fp4 cases had before bf16 was tiled too */
        snprintf(tag, sizeof tag, "matmul_tiled/%d/%d/%d/%d/%d", rows, cols, rb, re, n);
    else
        snprintf(tag, sizeof tag, "matmul_tiled/%d/%d/%d/%d/%d/%d", (int)wdt, rows, cols, rb, re, n);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("matmul", "%s %dx%d r%d:%d n=%d tiled", wdt == DUET_DT_F4_E2M1X2 ? "fp4" : "bf16", rows, cols,
                        rb, re, n);
    const char *only = getenv("DUET_CHECK_CASE");
    if (only && *only && !strstr(row.shape, only))
        return;
    weight_t W, T;
    weight_make(ck, &r, &W, wdt, rows, cols, DUET_DT_F8_E8M0);
    T = W; /* a second device copy of the same bytes, tiled */
    T.d_data = dupload(ck, W.h_data, W.data_bytes);
    T.d_scale = W.h_scale ? dupload(ck, W.h_scale, W.scale_bytes) : NULL;
    T.dw.data = T.d_data;
    T.dw.scale = T.d_scale;
    int m = re - rb;
    float *x = rand_f32(&r, (size_t)n * cols, 1.0f);
    float *dx = dupload(ck, x, sizeof(float) * (size_t)n * cols);
    float *dy = dmalloc(ck, sizeof(float) * (size_t)n * m), *dt = dmalloc(ck, sizeof(float) * (size_t)n * m);
    float *y = xmalloc(sizeof(float) * (size_t)n * m), *yt = xmalloc(sizeof(float) * (size_t)n * m);
    dpoison(ck, dt, sizeof(float) * (size_t)n * m);
    CK(duet_cuda_weight_tile(ck->c, &T.dw));
    int refused = duet_cuda_weight_tile(ck->c, &T.dw) == DUET_ERR_UNSUPPORTED && /* not twice */
                  duet_cuda_matmul_gemv(ck->c, &T.dw, rb, re, dx, n, dt) == DUET_ERR_UNSUPPORTED &&
                  duet_cuda_matmul_lt(ck->c, &T.dw, rb, re, dx, n, dt) == DUET_ERR_UNSUPPORTED &&
                  duet_cuda_matmul_gemv_tc(ck->c, &T.dw, rb + 16, re, dx, n, dt) == DUET_ERR_UNSUPPORTED;
    CK(duet_cuda_matmul_invariant(ck->c, &W.dw, rb, re, dx, n, dy));
    CK(duet_cuda_matmul(ck->c, &T.dw, rb, re, dx, n, dt));
    ddownload(ck, y, dy, sizeof(float) * (size_t)n * m);
    ddownload(ck, yt, dt, sizeof(float) * (size_t)n * m);
    row_bytes(&row, yt, y, sizeof(float) * (size_t)n * m);
    if (!refused) {
        row.pass = 0;
        snprintf(row.note, sizeof row.note, "an entry point without the tiled layout took the weight");
    }
    /* bf16 from 128 tokens (the head at prefill and batch 128 sizes): the engine's entry takes the
     * 64-token tiles on sm_90; timed against the tiled decode kernel */
    if (wdt == DUET_DT_BF16 && n >= 128 && row.pass) {
        inv_arg_t e = {&T.dw, rb, re, n, dx, dt, 0}, d = {&T.dw, rb, re, n, dx, dt, 1};
        double bytes = (double)W.data_bytes * m / rows + 4.0 * n * cols + 4.0 * n * m, flops = 2.0 * n * m * cols;
        bench_row(ck, &row, inv_call, &e, bytes, flops, BOUND_BF16);
        if (ck->bench && row.us > 0) {
            double td = time_op(ck, inv_call, &d);
            snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "%sdecode kernel %.1f us (%.2fx)",
                     row.note[0] ? "; " : "", td, td / row.us);
        }
    }
    print_row(ck, &row);
    duet_cuda_free(ck->c, T.d_data);
    duet_cuda_free(ck->c, T.d_scale);
    weight_free(ck, &W);
    duet_cuda_free(ck->c, dx);
    duet_cuda_free(ck->c, dy);
    duet_cuda_free(ck->c, dt);
    free(x);
    free(y);
    free(yt);
}

/* The batch-invariant entry at prefill sizes (fp8 weights there take 64-token tiles on sm_90)
 * against the decode kernel of 32-token tiles: every token's outputs bit for bit, and against
 * the CPU at the decode tolerance on sampled tokens.  Timed both ways. */
static void case_matmul_wide(ck_t *ck, int rows, int cols, int rb, int re, int n)
{
    rng_t r;
    char tag[96];
    snprintf(tag, sizeof tag, "matmul_wide/%d/%d/%d/%d/%d", rows, cols, rb, re, n);
    rng_init(&r, ck->seed, tag);
    char range[32] = "";
    if (rb != 0 || re != rows)
        snprintf(range, sizeof range, " r%d:%d", rb, re);
    row_t row = row_new("matmul", "fp8 %dx%d%s n=%d inv", rows, cols, range, n);
    const char *only = getenv("DUET_CHECK_CASE");
    if (only && *only && !strstr(row.shape, only))
        return;
    weight_t W;
    weight_make(ck, &r, &W, DUET_DT_F8_E4M3, rows, cols, DUET_DT_F8_E8M0);
    int m = re - rb;
    size_t ny = (size_t)n * m;
    float *x = rand_f32(&r, (size_t)n * cols, 1.0f);
    float *dx = dupload(ck, x, sizeof(float) * (size_t)n * cols);
    float *dy = dmalloc(ck, 4 * ny), *dd = dmalloc(ck, 4 * ny);
    dpoison(ck, dy, 4 * ny);
    dpoison(ck, dd, 4 * ny);
    inv_arg_t a = {&W.dw, rb, re, n, dx, dy, 0}, d = {&W.dw, rb, re, n, dx, dd, 1};
    CK(inv_call(ck, &a));
    CK(inv_call(ck, &d));
    float *y = xmalloc(4 * ny), *yd = xmalloc(4 * ny);
    ddownload(ck, y, dy, 4 * ny);
    ddownload(ck, yd, dd, 4 * ny);
    size_t diff = bytes_differ(y, yd, 4 * ny);
    int ns = n < 8 ? n : 8;
    float *xs = xmalloc(sizeof(float) * (size_t)ns * cols), *ys = xmalloc(sizeof(float) * (size_t)ns * m),
          *gs = xmalloc(sizeof(float) * (size_t)ns * m);
    for (int i = 0; i < ns; i++) {
        int t = (int)((int64_t)i * (n - 1) / (ns - 1 > 0 ? ns - 1 : 1));
        memcpy(xs + (size_t)i * cols, x + (size_t)t * cols, sizeof(float) * cols);
        memcpy(gs + (size_t)i * m, y + (size_t)t * m, sizeof(float) * m);
    }
    ref_matmul(ck, &W.hw, rb, re, xs, ns, ys);
    row_float(&row, gs, ys, (size_t)ns * m, 1e-5);
    if (diff)
        row.pass = 0;
    snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note),
             "%svs the decode kernel: %zu bytes differ", row.note[0] ? "; " : "", diff);
    double bytes = (double)W.data_bytes * m / rows + 4.0 * n * cols + 4.0 * ny, flops = 2.0 * ny * cols;
    bench_row(ck, &row, inv_call, &a, bytes, flops, BOUND_BF16);
    if (ck->bench && row.us > 0) {
        double td = time_op(ck, inv_call, &d);
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "; decode kernel %.1f us (%.2fx)", td,
                 td / row.us);
    }
    print_row(ck, &row);
    free(x);
    free(y);
    free(yd);
    free(xs);
    free(ys);
    free(gs);
    duet_cuda_free(ck->c, dx);
    duet_cuda_free(ck->c, dy);
    duet_cuda_free(ck->c, dd);
    weight_free(ck, &W);
}

/* The block-diagonal launch (wo_a's groups in one launch, duet_cuda_matmul_blockdiag): y bit for bit
 * each group's duet_cuda_matmul_invariant on its own columns of x, copied out alone; refused with
 * DUET_ERR_UNSUPPORTED where the loading-warp kernel does not take it (not sm_90, or groups that
 * are not whole blocks) */
typedef struct {
    weight_t *W;
    int rb, re, grows, n;
    float *dx, *dy;
} bd_arg_t;

static duet_status_t bd_call(ck_t *ck, void *p)
{
    bd_arg_t *a = p;
    return duet_cuda_matmul_blockdiag(ck->c, &a->W->dw, a->rb, a->re, a->grows, a->dx, a->n, a->dy);
}

static void case_blockdiag(ck_t *ck, int groups, int grows, int cols, int g0, int n)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "blockdiag/%d/%d/%d/%d", groups, grows, cols, n);
    rng_init(&r, ck->seed, tag);
    int rows_all = (g0 + groups) * grows, rb = g0 * grows, re = rb + groups * grows, rows = re - rb;
    row_t row = row_new("matmul", "fp8 block-diagonal %d x (%d x %d), rows %d.. n=%d (wo_a's groups in one launch)",
                        groups, grows, cols, rb, n);
    weight_t W;
    weight_make(ck, &r, &W, DUET_DT_F8_E4M3, rows_all, cols, DUET_DT_F8_E8M0);
    size_t xc = (size_t)groups * cols;
    float *hx = rand_f32(&r, (size_t)n * xc, 1.0f), *got = xmalloc(sizeof(float) * (size_t)n * rows),
          *want = xmalloc(sizeof(float) * (size_t)n * rows), *hxg = xmalloc(sizeof(float) * (size_t)n * cols),
          *hyg = xmalloc(sizeof(float) * (size_t)n * grows);
    float *dx = dupload(ck, hx, sizeof(float) * (size_t)n * xc), *dy = dmalloc(ck, sizeof(float) * (size_t)n * rows);
    float *dxg = dmalloc(ck, sizeof(float) * (size_t)n * cols), *dyg = dmalloc(ck, sizeof(float) * (size_t)n * grows);
    bd_arg_t a = {&W, rb, re, grows, n, dx, dy};
    if (!duet_cuda_matmul_blockdiag_ok(ck->c, &W.dw, rb, re, grows, dx, n)) {
        duet_status_t st = bd_call(ck, &a);
        row.exact = 1;
        row.pass = st == DUET_ERR_UNSUPPORTED;
        row.err = !row.pass;
        snprintf(row.note, sizeof row.note, "not this launch's kernel here: refused (%s)",
                 row.pass ? "as it must" : "not");
    } else {
        dpoison(ck, dy, sizeof(float) * (size_t)n * rows);
        CK(bd_call(ck, &a));
        ddownload(ck, got, dy, sizeof(float) * (size_t)n * rows);
        for (int g = 0; g < groups; g++) {
            for (int t = 0; t < n; t++)
                memcpy(hxg + (size_t)t * cols, hx + (size_t)t * xc + (size_t)g * cols, sizeof(float) * cols);
            CK(duet_cuda_memcpy(ck->c, dxg, hxg, sizeof(float) * (size_t)n * cols));
            dpoison(ck, dyg, sizeof(float) * (size_t)n * grows);
            CK(duet_cuda_matmul_invariant(ck->c, &W.dw, rb + g * grows, rb + (g + 1) * grows, dxg, n, dyg));
            ddownload(ck, hyg, dyg, sizeof(float) * (size_t)n * grows);
            for (int t = 0; t < n; t++)
                memcpy(want + (size_t)t * rows + (size_t)g * grows, hyg + (size_t)t * grows, sizeof(float) * grows);
        }
        row_f32_bits(&row, got, want, (size_t)n * rows);
        bench_row(ck, &row, bd_call, &a, (double)rows * cols + 4.0 * n * (xc + rows), 2.0 * n * (double)rows * cols,
                  BOUND_MEM);
    }
    print_row(ck, &row);
    weight_free(ck, &W);
    duet_cuda_free(ck->c, dx);
    duet_cuda_free(ck->c, dy);
    duet_cuda_free(ck->c, dxg);
    duet_cuda_free(ck->c, dyg);
    free(hx);
    free(got);
    free(want);
    free(hxg);
    free(hyg);
}

static void group_matmul(ck_t *ck)
{
    const duet_dtype_t E8 = DUET_DT_F8_E8M0, F32 = DUET_DT_F32;
    /* decode kernel: the tolerance of fp32 accumulation in another order */
    const double tg = 1e-5;
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 1, 8, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 8, 8, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 32, 32, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F8_E4M3, E8, 1024, 4096, 0, 1024, 1, 8, tg);     /* wq_a */
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F8_E4M3, E8, 1024, 4096, 0, 1024, 32, 32, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F8_E4M3, E8, 32768, 1024, 0, 32768, 1, 8, tg);   /* wq_b */
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F8_E4M3, E8, 32768, 1024, 0, 32768, 32, 32, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F8_E4M3, E8, 4096, 4096, 0, 4096, 1, 8, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F8_E4M3, F32, 4096, 4096, 0, 4096, 8, 8, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F8_E4M3, E8, 8192, 4096, 1024, 2048, 5, 5, tg);  /* wo_a group */
    case_blockdiag(ck, 8, 1024, 4096, 0, 32); /* wo_a's eight groups at a decode step of 32 rows */
    case_blockdiag(ck, 4, 1024, 4096, 4, 19); /* a rank's last four (tensor parallelism), a partial token tile */
    case_blockdiag(ck, 3, 96, 256, 0, 32);    /* groups of 96 rows: not whole blocks, refused */
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 1, 8, tg);   /* expert w1 */
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 8, 8, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 32, 32, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F4_E2M1X2, E8, 4096, 2048, 0, 4096, 1, 8, tg);   /* expert w2 */
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F4_E2M1X2, E8, 4096, 2048, 0, 4096, 3, 3, tg);
    case_matmul(ck, "matmul", MM_AUTO, DUET_DT_F32, E8, 64, 4096, 0, 64, 4, 4, tg);             /* idx weights */
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_BF16, E8, 100, 70, 3, 97, 3, 3, tg);             /* unaligned */
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_F8_E4M3, E8, 300, 200, 0, 300, 2, 2, tg);
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_BF16, E8, 1024, 512, 0, 1024, 100, 100, tg);     /* gemv at n>32 */
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_F8_E4M3, E8, 512, 1024, 126, 500, 3, 3, tg);     /* rows astride blocks */
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_F4_E2M1X2, E8, 1000, 1024, 0, 1000, 7, 7, tg);   /* partial warps */
    /* the two decode kernels side by side */
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 8, 8, tg);
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 32, 32, tg);
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_F8_E4M3, E8, 4096, 4096, 0, 4096, 32, 32, tg);
    case_matmul(ck, "matmul", MM_GEMV, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 8, 8, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 1, 1, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 4096, 4096, 0, 4096, 1, 1, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 4096, 4096, 0, 4096, 32, 32, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 2, 2, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 1000, 1024, 16, 1000, 20, 20, tg); /* partial tiles */
    /* four-group tiles: a partial last tile on a row range; 256 tokens split along the columns */
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 1000, 1024, 16, 1000, 45, 45, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 1024, 4096, 0, 1024, 256, 8, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 512, 1024, 0, 512, 100, 100, tg);     /* n > 32 */
    /* split along the columns at small n, whole at large n (solo compares the two) */
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 4096, 4096, 0, 4096, 300, 8, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F4_E2M1X2, E8, 4096, 2048, 0, 4096, 300, 8, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 1024, 4224, 32, 1000, 13, 13, tg);  /* 33 units */
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 1024, 4096, 0, 1024, 32, 32, tg);  /* wq_a */
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 32768, 1024, 0, 32768, 32, 32, tg); /* wq_b */
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 4096, 8192, 0, 4096, 32, 32, tg);   /* wo_b */
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 1, 1, tg);   /* expert */
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 32, 32, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 32, 32, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 256, 4096, 0, 256, 32, 32, tg); /* the MoE gate */
    /* weights of their own chunks (the MoE gate's 2 units): the CPU within the tolerance, rows run
     * alone bit for bit as in the batch (at 128 rows of the 16384-row weight the launch is not
     * split along the columns, alone it is) */
    mm_chunk_units = 2;
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 256, 4096, 0, 256, 1, 1, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 256, 4096, 0, 256, 32, 32, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 16384, 4096, 0, 16384, 128, 8, tg);
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_BF16, E8, 1024, 4224, 32, 1000, 13, 13, tg); /* a last chunk of 1 */
    mm_chunk_units = 3;
    case_matmul(ck, "matmul", MM_GEMV_TC, DUET_DT_F8_E4M3, E8, 1024, 4096, 0, 1024, 32, 32, tg);
    mm_chunk_units = 0;
    /* fp4 in the tiled layout: bit for bit the checkpoint layout's results */
    static const int tiled_n[] = {1, 2, 8, 20, 32, 40};
    for (size_t i = 0; i < sizeof tiled_n / sizeof tiled_n[0]; i++)
        case_matmul_tiled(ck, DUET_DT_F4_E2M1X2, 2048, 4096, 0, 2048, tiled_n[i]);
    case_matmul_tiled(ck, DUET_DT_F4_E2M1X2, 4096, 2048, 96, 4000, 3); /* a row range on tiles, ending inside one */
    /* bf16 in its tiled layout (the output head's): bit for bit the same */
    for (size_t i = 0; i < sizeof tiled_n / sizeof tiled_n[0]; i++)
        case_matmul_tiled(ck, DUET_DT_BF16, 4096, 4096, 0, 4096, tiled_n[i]);
    case_matmul_tiled(ck, DUET_DT_BF16, 1024, 4224, 32, 1000, 13); /* 33 units, split along the columns */
    case_matmul_tiled(ck, DUET_DT_BF16, 129280 / 8, 4096, 0, 129280 / 8, 128); /* a slice of the head, four tiles */
    /* from 128 tokens on sm_90 the 64-token tiles where their blocks fill the SMs: a partial token
     * tile, rows past the range's end inside a tile, 33 units; then the decode kernel again for too
     * few blocks (24) and for a row range off the 64-row grid */
    case_matmul_tiled(ck, DUET_DT_BF16, 129280 / 8, 4096, 0, 129280 / 8, 300);
    case_matmul_tiled(ck, DUET_DT_BF16, 16384, 4224, 64, 16360, 130);
    case_matmul_tiled(ck, DUET_DT_BF16, 1024, 4224, 64, 1000, 130);
    case_matmul_tiled(ck, DUET_DT_BF16, 1024, 4096, 32, 1024, 200);
    /* fp8 at prefill sizes through the batch-invariant entry: the decode kernel's bits */
    case_matmul_wide(ck, 4096, 4096, 0, 4096, 300);
    case_matmul_wide(ck, 4096, 4096, 0, 4096, 4096);
    case_matmul_wide(ck, 32768, 1024, 0, 32768, 4096); /* wq_b */
    case_matmul_wide(ck, 4096, 8192, 0, 4096, 4096);   /* wo_b */
    case_matmul_wide(ck, 1000, 1024, 64, 1000, 130);   /* rows past a block's end, a partial token tile */
    case_matmul_wide(ck, 2048, 4096, 128, 2048, 128);  /* one tile; f32-free ue8m0 scales on a row range */
    /* fp8 at a decode step's sizes (17-32 tokens) through the same entry: on sm_90 the kernel of a
     * loading warp and computing warpgroups (four, two or one a block), the decode kernel's bits */
    case_matmul_wide(ck, 32768, 1024, 0, 32768, 32);   /* wq_b: four warpgroups */
    case_matmul_wide(ck, 4096, 8192, 0, 4096, 32);     /* wo_b: four, eight chunks along the columns */
    case_matmul_wide(ck, 4096, 2048, 0, 4096, 32);     /* the shared expert's w2: one, two chunks */
    case_matmul_wide(ck, 16384, 1024, 16, 16360, 29);  /* two; rows off the grid, a partial block and tile */
    case_matmul_wide(ck, 4096, 1152, 0, 4096, 17);     /* one; nine units: a chunk of one */
}

/* Several weights times one x in one launch (duet_cuda_matmul_multi): each part against the
 * CPU at the decode tolerance and against its own batch-invariant launch bit for bit. */
typedef struct {
    duet_cuda_mm_part_t p[DUET_CUDA_MULTI_MAX];
    int n_parts, n;
    const float *dx;
} multi_arg_t;

static duet_status_t multi_call(ck_t *ck, void *p)
{
    multi_arg_t *a = p;
    return duet_cuda_matmul_multi(ck->c, a->p, a->n_parts, a->dx, a->n);
}

static void case_matmul_multi(ck_t *ck, duet_dtype_t dt, int cols, int n_parts, const int *rows, const int *rb,
                              const int *re, int n)
{
    rng_t r;
    char tag[96], sh[64] = "";
    snprintf(tag, sizeof tag, "matmul_multi/%d/%d/%d/%d/%d", (int)dt, cols, n_parts, rows[0], n);
    rng_init(&r, ck->seed, tag);
    for (int i = 0; i < n_parts && strlen(sh) < 40; i++)
        snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%d", i ? "+" : "", re[i] - rb[i]);
    row_t row = row_new("matmul_multi", "%s %sx%d n=%d", dt_short(dt, DUET_DT_F8_E8M0), sh, cols, n);
    const char *only = getenv("DUET_CHECK_CASE");
    if (only && *only && !strstr(row.shape, only))
        return;
    weight_t W[DUET_CUDA_MULTI_MAX];
    multi_arg_t a = {.n_parts = n_parts, .n = n};
    float *x = rand_f32(&r, (size_t)n * cols, 1.0f);
    float *dx = dupload(ck, x, sizeof(float) * (size_t)n * cols);
    a.dx = dx;
    size_t outs = 0;
    double wbytes = 0;
    for (int i = 0; i < n_parts; i++) {
        weight_make(ck, &r, &W[i], dt, rows[i], cols, DUET_DT_F8_E8M0);
        size_t m = (size_t)(re[i] - rb[i]);
        a.p[i] = (duet_cuda_mm_part_t){&W[i].dw, rb[i], re[i], dmalloc(ck, sizeof(float) * (size_t)n * m)};
        dpoison(ck, a.p[i].y, sizeof(float) * (size_t)n * m);
        outs += (size_t)n * m;
        wbytes += ((double)W[i].data_bytes + W[i].scale_bytes) * (double)m / rows[i];
    }
    if (multi_call(ck, &a) != DUET_OK)
        die(ck, "matmul_multi");
    double worst = 0;
    int same = 1;
    for (int i = 0; i < n_parts; i++) {
        size_t m = (size_t)(re[i] - rb[i]);
        float *y = xmalloc(sizeof(float) * (size_t)n * m), *y1 = xmalloc(sizeof(float) * (size_t)n * m);
        float *ref = xmalloc(sizeof(float) * (size_t)n * m);
        ddownload(ck, y, a.p[i].y, sizeof(float) * (size_t)n * m);
        ref_matmul(ck, &W[i].hw, rb[i], re[i], x, n, ref);
        size_t w;
        double e = nerr(y, ref, (size_t)n * m, &w);
        worst = e > worst ? e : worst;
        float *dy1 = dmalloc(ck, sizeof(float) * (size_t)n * m);
        dpoison(ck, dy1, sizeof(float) * (size_t)n * m);
        if (duet_cuda_matmul_invariant(ck->c, &W[i].dw, rb[i], re[i], dx, n, dy1) != DUET_OK)
            die(ck, "matmul_invariant");
        ddownload(ck, y1, dy1, sizeof(float) * (size_t)n * m);
        same &= memcmp(y, y1, sizeof(float) * (size_t)n * m) == 0;
        duet_cuda_free(ck->c, dy1);
        free(y);
        free(y1);
        free(ref);
    }
    row.exact = 0;
    row.tol = 1e-5;
    row.err = worst;
    row.pass = worst <= row.tol && same;
    snprintf(row.note, sizeof row.note, "one launch a part %s", same ? "bit-exact" : "DIFFERS");
    bench_row(ck, &row, multi_call, &a, wbytes + 4.0 * n * cols + 4.0 * (double)outs, 2.0 * (double)outs * cols,
              BOUND_BF16);
    print_row(ck, &row);
    for (int i = 0; i < n_parts; i++) {
        duet_cuda_free(ck->c, a.p[i].y);
        weight_free(ck, &W[i]);
    }
    free(x);
    duet_cuda_free(ck->c, dx);
}

static void group_matmul_multi(ck_t *ck)
{
    /* a C4 layer's projections of its input at V4-Flash widths (wq_a, wkv, the compressor's
     * and the indexer's, idx_wproj), then the shared expert's w1 and w3, then row ranges */
    static const int r7[7] = {1024, 512, 1024, 1024, 256, 256, 64}, z7[7] = {0};
    static const int r2[2] = {2048, 2048}, z2[2] = {0};
    static const int rr[3] = {256, 64, 512}, rb[3] = {32, 0, 128}, re[3] = {160, 64, 512};
    case_matmul_multi(ck, DUET_DT_F8_E4M3, 4096, 7, r7, z7, r7, 1);
    case_matmul_multi(ck, DUET_DT_F8_E4M3, 4096, 7, r7, z7, r7, 32);
    case_matmul_multi(ck, DUET_DT_F4_E2M1X2, 4096, 2, r2, z2, r2, 1);
    case_matmul_multi(ck, DUET_DT_F4_E2M1X2, 4096, 2, r2, z2, r2, 32);
    case_matmul_multi(ck, DUET_DT_BF16, 512, 3, rr, rb, re, 13);
    /* prefill sizes: fp8 parts on a 64-row boundary take the wide tiles, x split once for them */
    case_matmul_multi(ck, DUET_DT_F8_E4M3, 4096, 7, r7, z7, r7, 300);
    case_matmul_multi(ck, DUET_DT_F8_E4M3, 512, 3, rr, rb, re, 200); /* one part on the decode kernel */
    /* a decode step's size: both parts on the loading-warp kernel (the shared expert's w1 and w3);
     * one part it would take beside one it would not: both on the decode kernel */
    static const int rw[2] = {16384, 256}, zw[2] = {0}, rs[2] = {2048, 2048};
    case_matmul_multi(ck, DUET_DT_F8_E4M3, 4096, 2, rs, z2, rs, 32);
    case_matmul_multi(ck, DUET_DT_F8_E4M3, 1024, 2, rw, zw, rw, 32);
}

static void group_matmul_lt(ck_t *ck)
{
    const duet_dtype_t E8 = DUET_DT_F8_E8M0, F32 = DUET_DT_F32;
    /* bf16 operands: x rounded to bf16 (relative 2^-9) -> ~1e-3 normalized */
    const double tl = 4e-3;
    case_matmul(ck, "matmul_lt", MM_AUTO, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 4096, 8, tl);
    case_matmul(ck, "matmul_lt", MM_AUTO, DUET_DT_BF16, E8, 8192, 8192, 0, 8192, 8192, 4, tl);
    case_matmul(ck, "matmul_lt", MM_AUTO, DUET_DT_F8_E4M3, E8, 4096, 4096, 0, 4096, 4096, 8, tl);
    case_matmul(ck, "matmul_lt", MM_AUTO, DUET_DT_F8_E4M3, F32, 1024, 4096, 0, 1024, 512, 8, tl);
    case_matmul(ck, "matmul_lt", MM_AUTO, DUET_DT_F4_E2M1X2, E8, 2048, 4096, 0, 2048, 512, 8, tl);
    case_matmul(ck, "matmul_lt", MM_AUTO, DUET_DT_F32, E8, 64, 4096, 0, 64, 64, 8, 1e-5);
    case_matmul(ck, "matmul_lt", MM_LT, DUET_DT_BF16, E8, 4096, 4096, 0, 4096, 32, 32, tl);
}

static void group_fp8_act(ck_t *ck)
{
    const duet_dtype_t E8 = DUET_DT_F8_E8M0;
    /* against the CPU fed the same quantized activations: only accumulation differs */
    const double tq = 1e-3;
    case_matmul(ck, "fp8_act", MM_FP8ACT, DUET_DT_F8_E4M3, E8, 4096, 4096, 0, 4096, 4096, 8, tq);
    case_matmul(ck, "fp8_act", MM_FP8ACT, DUET_DT_F8_E4M3, E8, 8192, 8192, 0, 8192, 8192, 4, tq);
    case_matmul(ck, "fp8_act", MM_FP8ACT, DUET_DT_F8_E4M3, E8, 32768, 1024, 0, 32768, 4096, 4, tq);
    case_matmul(ck, "fp8_act", MM_FP8ACT, DUET_DT_F8_E4M3, DUET_DT_F32, 4096, 4096, 0, 4096, 130, 8, tq);
}

/* ---- fp8 activations made where they are produced ---- */

/* The CPU's codes and scales for x(n, k) in duet_cuda_act_quant's layout (scale layout 0:
 * [k/128][n_pad]): scale amax/448 (1 for an all-zero block), codes duet_f32_to_e4m3(x / s);
 * rows n .. n_pad code 0, scale 1. */
static void ref_act_quant(const float *x, int n, int k, uint8_t *q, float *sx)
{
    int n_pad = duet_cuda_fp8_act_rows(n), kb = k / 128;
    memset(q, 0, (size_t)n_pad * k);
    for (int r = 0; r < n_pad; r++)
        for (int b = 0; b < kb; b++) {
            float s = 1.0f;
            if (r < n) {
                const float *v = x + (size_t)r * k + b * 128;
                float amax = 0.0f;
                for (int i = 0; i < 128; i++)
                    amax = fmaxf(amax, fabsf(v[i]));
                s = amax > 0.0f ? amax / 448.0f : 1.0f;
                for (int i = 0; i < 128; i++)
                    q[(size_t)r * k + b * 128 + i] = duet_f32_to_e4m3(v[i] / s);
            }
            sx[(size_t)b * n_pad + r] = s;
        }
}

typedef struct {
    const float *dx, *dw;
    float *dy, *dsx, *dout;
    uint8_t *dq;
    int n, k;
    const duet_weight_t *W;
} q8_arg_t;

static duet_status_t act_quant_call(ck_t *ck, void *p)
{
    q8_arg_t *a = p;
    return duet_cuda_act_quant(ck->c, a->dx, a->n, a->k, a->dq, a->dsx);
}

static duet_status_t rms_q8_call(ck_t *ck, void *p)
{
    q8_arg_t *a = p;
    return duet_cuda_rmsnorm_q8(ck->c, a->dx, a->dw, a->n, a->k, 1e-6f, a->dy, a->dq, a->dsx);
}

static duet_status_t fp8_q_call(ck_t *ck, void *p)
{
    q8_arg_t *a = p;
    return duet_cuda_matmul_fp8_q(ck->c, a->W, 0, a->W->rows, a->dq, a->dsx, a->n, a->dout);
}

/* act_quant against the CPU's codes and scales, bit for bit (a zero block and large values
 * included) */
static void case_act_quant(ck_t *ck, int n, int k)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "act_quant/%d/%d", n, k);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("fp8_q", "act_quant n=%d k=%d", n, k);
    int n_pad = duet_cuda_fp8_act_rows(n);
    size_t nx = (size_t)n * k, nq = (size_t)n_pad * k, ns = (size_t)n_pad * (k / 128);
    float *x = rand_f32(&r, nx, 3.0f);
    memset(x, 0, 128 * sizeof(float)); /* row 0's first block: scale 1 */
    if (nx > 256)
        x[200] = 30000.0f; /* row 0's second block: one value far above the others */
    uint8_t *q = xmalloc(nq), *qr = xmalloc(nq);
    float *sx = xmalloc(4 * ns), *sr = xmalloc(4 * ns);
    q8_arg_t a = {.dx = dupload(ck, x, 4 * nx), .dq = dmalloc(ck, nq), .dsx = dmalloc(ck, 4 * ns), .n = n, .k = k};
    dpoison(ck, a.dq, nq);
    dpoison(ck, a.dsx, 4 * ns);
    CK(act_quant_call(ck, &a));
    ddownload(ck, q, a.dq, nq);
    ddownload(ck, sx, a.dsx, 4 * ns);
    ref_act_quant(x, n, k, qr, sr);
    size_t dq = bytes_differ(q, qr, nq), ds = bytes_differ(sx, sr, 4 * ns);
    row.exact = 1;
    row.err = (double)(dq + ds);
    row.pass = dq + ds == 0;
    snprintf(row.note, sizeof row.note, "codes %zu differ, scale bytes %zu", dq, ds);
    bench_row(ck, &row, act_quant_call, &a, 4.0 * nx + (double)nq + 4.0 * ns, 0, BOUND_MEM);
    print_row(ck, &row);
    free(x);
    free(q);
    free(qr);
    free(sx);
    free(sr);
    duet_cuda_free(ck->c, (void *)a.dx);
    duet_cuda_free(ck->c, a.dq);
    duet_cuda_free(ck->c, a.dsx);
}

/* rmsnorm_q8: its y, codes and scales bit for bit those of duet_cuda_rmsnorm then
 * duet_cuda_act_quant (two launches), and its y against the CPU's norm; with_y 0 times the
 * form that writes the codes alone */
static void case_rmsnorm_q8(ck_t *ck, int n, int dim, int weighted, int with_y)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "rms_q8/%d/%d/%d", n, dim, weighted);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("fp8_q", "rmsnorm_q8 n=%d dim=%d%s%s", n, dim, weighted ? " w" : "", with_y ? " +y" : "");
    int n_pad = duet_cuda_fp8_act_rows(n);
    size_t nx = (size_t)n * dim, nq = (size_t)n_pad * dim, ns = (size_t)n_pad * (dim / 128);
    float *x = rand_f32(&r, nx, 3.0f), *w = rand_f32(&r, dim, 1.0f);
    float *y = xmalloc(4 * nx), *y2 = xmalloc(4 * nx), *ref = xmalloc(4 * nx);
    uint8_t *q = xmalloc(nq), *q2 = xmalloc(nq);
    float *sx = xmalloc(4 * ns), *sx2 = xmalloc(4 * ns);
    q8_arg_t a = {.dx = dupload(ck, x, 4 * nx),
                  .dw = weighted ? dupload(ck, w, 4 * (size_t)dim) : NULL,
                  .dy = dmalloc(ck, 4 * nx),
                  .dq = dmalloc(ck, nq),
                  .dsx = dmalloc(ck, 4 * ns),
                  .n = n,
                  .k = dim};
    float *dy2 = dmalloc(ck, 4 * nx), *dsx2 = dmalloc(ck, 4 * ns);
    uint8_t *dq2 = dmalloc(ck, nq);
    dpoison(ck, a.dy, 4 * nx);
    dpoison(ck, a.dq, nq);
    dpoison(ck, a.dsx, 4 * ns);
    CK(rms_q8_call(ck, &a));
    CK(duet_cuda_rmsnorm(ck->c, a.dx, a.dw, n, dim, 1e-6f, dy2));
    CK(duet_cuda_act_quant(ck->c, dy2, n, dim, dq2, dsx2));
    ddownload(ck, y, a.dy, 4 * nx);
    ddownload(ck, q, a.dq, nq);
    ddownload(ck, sx, a.dsx, 4 * ns);
    ddownload(ck, y2, dy2, 4 * nx);
    ddownload(ck, q2, dq2, nq);
    ddownload(ck, sx2, dsx2, 4 * ns);
    size_t d = bytes_differ(y, y2, 4 * nx) + bytes_differ(q, q2, nq) + bytes_differ(sx, sx2, 4 * ns);
    duet_cpu_rmsnorm(x, weighted ? w : NULL, n, dim, 1e-6f, ref);
    size_t wi;
    double e = nerr(y, ref, nx, &wi);
    row.exact = 1;
    row.err = (double)d;
    row.pass = d == 0 && e <= 1e-5;
    snprintf(row.note, sizeof row.note, "vs rmsnorm + act_quant: %zu bytes differ; y vs CPU %.1e (1e-5)", d, e);
    if (!with_y)
        a.dy = NULL;
    bench_row(ck, &row, rms_q8_call, &a, 4.0 * nx + (double)nq + 4.0 * ns + (with_y ? 4.0 * nx : 0), 3.0 * nx,
              BOUND_MEM);
    print_row(ck, &row);
    free(x);
    free(w);
    free(y);
    free(y2);
    free(ref);
    free(q);
    free(q2);
    free(sx);
    free(sx2);
    duet_cuda_free(ck->c, (void *)a.dx);
    duet_cuda_free(ck->c, (void *)a.dw);
    duet_cuda_free(ck->c, dy2);
    duet_cuda_free(ck->c, a.dq);
    duet_cuda_free(ck->c, a.dsx);
    duet_cuda_free(ck->c, dq2);
    duet_cuda_free(ck->c, dsx2);
}

typedef struct {
    const duet_weight_t *W;
    const float *dx, *dnw;
    float *dxn, *dy;
    int n;
} pipe_arg_t;

/* a norm feeding a prefill matmul the way the engine runs it: rmsnorm, then cuBLASLt (x to bf16) */
static duet_status_t pipe_bf16_call(ck_t *ck, void *p)
{
    pipe_arg_t *a = p;
    DUET_TRY(duet_cuda_rmsnorm(ck->c, a->dx, a->dnw, a->n, a->W->cols, 1e-6f, a->dxn));
    return duet_cuda_matmul_lt(ck->c, a->W, 0, a->W->rows, a->dxn, a->n, a->dy);
}

static duet_status_t pipe_fp8_call(ck_t *ck, void *p)
{
    q8_arg_t *a = p;
    DUET_TRY(duet_cuda_rmsnorm_q8(ck->c, a->dx, a->dw, a->n, a->k, 1e-6f, NULL, a->dq, a->dsx));
    return duet_cuda_matmul_fp8_q(ck->c, a->W, 0, a->W->rows, a->dq, a->dsx, a->n, a->dout);
}

/* matmul_fp8_q on act_quant's codes: y bit for bit duet_cuda_matmul_fp8_act's.  Timed alone (the
 * fp8 GEMM with x as its producer leaves it) and, with `pipe`, after its norm against the bf16
 * form of the same pair (a bf16 weight of the shape). */
static void case_fp8_q(ck_t *ck, int rows, int cols, int n, int pipe)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "fp8_q/%d/%d/%d", rows, cols, n);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("fp8_q", "matmul_fp8_q %dx%d n=%d", rows, cols, n);
    weight_t W;
    weight_make(ck, &r, &W, DUET_DT_F8_E4M3, rows, cols, DUET_DT_F8_E8M0);
    int n_pad = duet_cuda_fp8_act_rows(n);
    size_t nx = (size_t)n * cols, nq = (size_t)n_pad * cols, ns = (size_t)n_pad * (cols / 128), ny = (size_t)n * rows;
    float *x = rand_f32(&r, nx, 1.0f), *nw = rand_f32(&r, cols, 1.0f);
    q8_arg_t a = {.dx = dupload(ck, x, 4 * nx),
                  .dw = dupload(ck, nw, 4 * (size_t)cols),
                  .dq = dmalloc(ck, nq),
                  .dsx = dmalloc(ck, 4 * ns),
                  .dout = dmalloc(ck, 4 * ny),
                  .n = n,
                  .k = cols,
                  .W = &W.dw};
    float *dy2 = dmalloc(ck, 4 * ny), *y = xmalloc(4 * ny), *y2 = xmalloc(4 * ny);
    dpoison(ck, a.dout, 4 * ny);
    dpoison(ck, dy2, 4 * ny);
    duet_status_t st = act_quant_call(ck, &a);
    if (st == DUET_OK)
        st = fp8_q_call(ck, &a);
    if (st == DUET_OK)
        st = duet_cuda_matmul_fp8_act(ck->c, &W.dw, 0, rows, a.dx, n, dy2);
    if (row_refused(ck, &row, st, "matmul_fp8_q"))
        goto out;
    ddownload(ck, y, a.dout, 4 * ny);
    ddownload(ck, y2, dy2, 4 * ny);
    row_bytes(&row, y, y2, 4 * ny);
    if (row.pass)
        snprintf(row.note, sizeof row.note, "= matmul_fp8_act bit for bit");
    bench_row(ck, &row, fp8_q_call, &a, (double)W.data_bytes + W.scale_bytes + (double)nq + 4.0 * ns + 4.0 * ny,
              2.0 * n * (double)rows * cols, BOUND_FP8);
    if (ck->bench && row.us > 0 && ck->ceil.bf16_tflops > 0) {
        double tf = 2.0 * n * (double)rows * cols / (row.us * 1e6);
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "; %.2fx the bf16 GEMM ceiling",
                 tf / ck->ceil.bf16_tflops);
        if (pipe) {
            weight_t B;
            weight_make(ck, &r, &B, DUET_DT_BF16, rows, cols, DUET_DT_F8_E8M0);
            pipe_arg_t pb = {&B.dw, a.dx, a.dw, dmalloc(ck, 4 * nx), a.dout, n};
            double t8 = time_op(ck, pipe_fp8_call, &a), t16 = time_op(ck, pipe_bf16_call, &pb);
            snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note),
                     "; rmsnorm_q8 + it %.1f us, rmsnorm + bf16 cuBLASLt %.1f us (%.2fx)", t8, t16, t16 / t8);
            duet_cuda_free(ck->c, pb.dxn);
            weight_free(ck, &B);
        }
    }
    print_row(ck, &row);
out:
    free(x);
    free(nw);
    free(y);
    free(y2);
    duet_cuda_free(ck->c, (void *)a.dx);
    duet_cuda_free(ck->c, (void *)a.dw);
    duet_cuda_free(ck->c, a.dq);
    duet_cuda_free(ck->c, a.dsx);
    duet_cuda_free(ck->c, a.dout);
    duet_cuda_free(ck->c, dy2);
    weight_free(ck, &W);
}

static void group_fp8_q(ck_t *ck)
{
    case_act_quant(ck, 4096, 4096);
    case_act_quant(ck, 130, 1024); /* rows padded to 132 */
    case_act_quant(ck, 8192, 8192);
    case_rmsnorm_q8(ck, 4096, 4096, 1, 1);
    case_rmsnorm_q8(ck, 4096, 4096, 1, 0);
    case_rmsnorm_q8(ck, 8192, 8192, 1, 0);
    case_rmsnorm_q8(ck, 33, 1024, 0, 1); /* q_norm's width, rows padded */
    case_rmsnorm_q8(ck, 5, 16384, 1, 1);
    case_fp8_q(ck, 4096, 4096, 4096, 1);
    case_fp8_q(ck, 8192, 8192, 8192, 1);
    case_fp8_q(ck, 32768, 1024, 4096, 0);
    case_fp8_q(ck, 1024, 4096, 130, 0);
}

/* ---- rmsnorm / rope / swiglu ---- */

typedef struct {
    float *dx, *dw, *dy, *dgate, *dup;
    int64_t *dpos;
    int n, dim, n_heads, head_dim, sign;
    float eps, limit;
    duet_rope_t rope;
} ew_arg_t;

static duet_status_t rms_call(ck_t *ck, void *p)
{
    ew_arg_t *a = p;
    return duet_cuda_rmsnorm(ck->c, a->dx, a->dw, a->n, a->dim, a->eps, a->dy);
}

/* Programmatic dependent launches (duet_cuda_set_pdl): a chain of launches, each reading what the
 * one before it wrote while that one may still be finishing (link i: t = W h, s = W t, h =
 * rmsnorm(s), with the engine's batch-invariant matmuls; `gemv` takes the fp32-unit kernel
 * instead), must give the bytes the same chain gives with every launch waiting for the one
 * ahead, and the same bytes again on a second run. */
typedef struct {
    weight_t *W;
    int dim, n, links, gemv;
    float *dh, *dt, *ds;
} pdl_arg_t;

static duet_status_t pdl_call(ck_t *ck, void *p)
{
    pdl_arg_t *a = p;
    for (int i = 0; i < a->links; i++) {
        if (a->gemv) {
            DUET_TRY(duet_cuda_matmul_gemv(ck->c, &a->W->dw, 0, a->dim, a->dh, a->n, a->dt));
            DUET_TRY(duet_cuda_matmul_gemv(ck->c, &a->W->dw, 0, a->dim, a->dt, a->n, a->ds));
        } else {
            DUET_TRY(duet_cuda_matmul(ck->c, &a->W->dw, 0, a->dim, a->dh, a->n, a->dt));
            DUET_TRY(duet_cuda_matmul(ck->c, &a->W->dw, 0, a->dim, a->dt, a->n, a->ds));
        }
        DUET_TRY(duet_cuda_rmsnorm(ck->c, a->ds, NULL, a->n, a->dim, 1e-6f, a->dh));
    }
    return DUET_OK;
}

static void case_pdl_chain(ck_t *ck, duet_dtype_t dt, int dim, int n, int links, int gemv)
{
    rng_t r;
    char tag[96];
    snprintf(tag, sizeof tag, "pdl/%d/%d/%d/%d/%d", (int)dt, dim, n, links, gemv);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("pdl", "%s %dx%d n=%d %d links%s", dt_short(dt, DUET_DT_F8_E8M0), dim, dim, n, links,
                        gemv ? " simt" : "");
    weight_t W;
    weight_make(ck, &r, &W, dt, dim, dim, DUET_DT_F8_E8M0);
    size_t nx = (size_t)n * dim;
    float *x = rand_f32(&r, nx, 1.0f), *out[3];
    pdl_arg_t a = {&W, dim, n, links, gemv, dupload(ck, x, 4 * nx), dmalloc(ck, 4 * nx), dmalloc(ck, 4 * nx)};
    int inv = duet_cuda_get_invariant(ck->c);
    duet_cuda_set_invariant(ck->c, !gemv);
    int was = duet_cuda_set_pdl(ck->c, 1), on = was;
    for (int run = 0; run < 3; run++) {
        on = duet_cuda_set_pdl(ck->c, run != 1); /* on, off, on */
        CK(duet_cuda_upload(ck->c, a.dh, x, 4 * nx));
        dpoison(ck, a.dt, 4 * nx);
        dpoison(ck, a.ds, 4 * nx);
        CK(pdl_call(ck, &a));
        out[run] = xmalloc(4 * nx);
        ddownload(ck, out[run], a.dh, 4 * nx);
    }
    row_bytes(&row, out[0], out[1], 4 * nx);
    if (row.pass && memcmp(out[2], out[0], 4 * nx)) {
        row.pass = 0;
        row.err = 1;
        snprintf(row.note, sizeof row.note, "a second run with the dependent launches differs");
    }
    snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "%sdependent launches %s",
             row.note[0] ? "; " : "", on ? "on" : "off (not on this device)");
    if (ck->bench) { /* the chain's time with them off, beside the row's (on) */
        duet_cuda_set_pdl(ck->c, 0);
        double off = time_op(ck, pdl_call, &a);
        duet_cuda_set_pdl(ck->c, 1);
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "; off %.2f us", off);
    }
    bench_row(ck, &row, pdl_call, &a, (double)links * 2 * W.data_bytes, 4.0 * links * nx * dim,
              gemv ? BOUND_FP32 : BOUND_BF16);
    print_row(ck, &row);
    duet_cuda_set_pdl(ck->c, was);
    duet_cuda_set_invariant(ck->c, inv);
    for (int i = 0; i < 3; i++)
        free(out[i]);
    free(x);
    duet_cuda_free(ck->c, a.dh);
    duet_cuda_free(ck->c, a.dt);
    duet_cuda_free(ck->c, a.ds);
    weight_free(ck, &W);
}

/* A side stream (duet_cuda_side, duet_cuda_fork, duet_cuda_join), as the engine runs the shared
 * expert: t = W x on the main stream; forked, the side stream runs `links` links of pdl_call's
 * chain from t while the main stream runs its own from x; joined, the main stream computes
 * y = W h_side.  y and the main chain's result must be the bytes of the same operations all on
 * the main stream, with dependent launches on and off; a side chain that started before t was
 * written, or a y that read h_side early, would differ. */
typedef struct {
    weight_t *W;
    int dim, n, links, side;
    float *dx, *dt, *dhm, *dtm, *dsm, *dts, *dss, *dy;
} side_arg_t;

static duet_status_t side_call(ck_t *ck, void *p)
{
    side_arg_t *a = p;
    size_t bytes = 4 * (size_t)a->n * a->dim;
    DUET_TRY(duet_cuda_memcpy(ck->c, a->dhm, a->dx, bytes));
    DUET_TRY(duet_cuda_matmul(ck->c, &a->W->dw, 0, a->dim, a->dx, a->n, a->dt));
    duet_cuda_t *sc = ck->c;
    if (a->side) {
        if (!(sc = duet_cuda_side(ck->c)))
            return DUET_ERR_CUDA;
        DUET_TRY(duet_cuda_fork(ck->c));
    }
    pdl_arg_t sa = {a->W, a->dim, a->n, a->links, 0, a->dt, a->dts, a->dss};
    pdl_arg_t ma = {a->W, a->dim, a->n, a->links, 0, a->dhm, a->dtm, a->dsm};
    ck_t side_ck = *ck;
    side_ck.c = sc;
    DUET_TRY(pdl_call(&side_ck, &sa));
    DUET_TRY(pdl_call(ck, &ma));
    if (a->side)
        DUET_TRY(duet_cuda_join(ck->c));
    return duet_cuda_matmul(ck->c, &a->W->dw, 0, a->dim, a->dt, a->n, a->dy);
}

static void case_side_chain(ck_t *ck, duet_dtype_t dt, int dim, int n, int links)
{
    rng_t r;
    char tag[96];
    snprintf(tag, sizeof tag, "side/%d/%d/%d/%d", (int)dt, dim, n, links);
    rng_init(&r, ck->seed, tag);
    row_t row =
        row_new("pdl", "%s %dx%d n=%d %d links, side stream", dt_short(dt, DUET_DT_F8_E8M0), dim, dim, n, links);
    weight_t W;
    weight_make(ck, &r, &W, dt, dim, dim, DUET_DT_F8_E8M0);
    size_t nx = (size_t)n * dim;
    float *x = rand_f32(&r, nx, 1.0f), *out[3];
    side_arg_t a = {&W, dim, n, links, 0, dupload(ck, x, 4 * nx)};
    float **bufs[] = {&a.dt, &a.dhm, &a.dtm, &a.dsm, &a.dts, &a.dss, &a.dy};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        *bufs[i] = dmalloc(ck, 4 * nx);
    int inv = duet_cuda_get_invariant(ck->c), was = duet_cuda_set_pdl(ck->c, 1);
    duet_cuda_set_invariant(ck->c, 1);
    for (int run = 0; run < 3; run++) { /* one stream; side stream with dependent launches; without */
        a.side = run > 0;
        duet_cuda_set_pdl(ck->c, run != 2);
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            dpoison(ck, *bufs[i], 4 * nx);
        CK(side_call(ck, &a));
        out[run] = xmalloc(8 * nx);
        ddownload(ck, out[run], a.dy, 4 * nx);
        ddownload(ck, out[run] + nx, a.dhm, 4 * nx);
    }
    row_bytes(&row, out[1], out[0], 8 * nx);
    if (row.pass && memcmp(out[2], out[0], 8 * nx)) {
        row.pass = 0;
        row.err = 1;
        snprintf(row.note, sizeof row.note, "the side stream without dependent launches differs");
    }
    a.side = 1;
    duet_cuda_set_pdl(ck->c, 1);
    if (ck->bench) { /* the same work on one stream, beside the row's (side stream) */
        a.side = 0;
        double one = time_op(ck, side_call, &a);
        a.side = 1;
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "%sone stream %.2f us",
                 row.note[0] ? "; " : "", one);
    }
    bench_row(ck, &row, side_call, &a, (double)(2 * links + 2) * W.data_bytes, 2.0 * (2 * links + 2) * nx * dim,
              BOUND_BF16);
    print_row(ck, &row);
    duet_cuda_set_pdl(ck->c, was);
    duet_cuda_set_invariant(ck->c, inv);
    for (int i = 0; i < 3; i++)
        free(out[i]);
    free(x);
    duet_cuda_free(ck->c, a.dx);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        duet_cuda_free(ck->c, *bufs[i]);
    weight_free(ck, &W);
}

static double wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The host's waits have the context's deadline (duet_cuda_set_wait_timeout): a second context on
 * the device whose stream is held busy `hold_ms` (duet_cuda_test_hold) and waited for with
 * `wait_ms`.  Past the deadline: DUET_ERR_TIMEOUT after about wait_ms, the context stuck, a later
 * wait failing at once with DUET_ERR_CUDA, while the checks' own context works on beside it.
 * Within it: the wait returns when the hold ends. */
static void case_wait(ck_t *ck, uint32_t hold_ms, uint32_t wait_ms)
{
    int late = hold_ms > wait_ms;
    row_t row = row_new("wait", "hold %u ms, deadline %u ms", hold_ms, wait_ms);
    row.exact = 1;
    duet_cuda_t *h = NULL;
    duet_err_t err = {0};
    if (duet_cuda_create(ck->device, &h, &err) != DUET_OK) {
        row.err = 1;
        snprintf(row.note, sizeof row.note, "second context: %.200s", err.msg);
        print_row(ck, &row);
        return;
    }
    duet_cuda_set_wait_timeout(h, wait_ms);
    char why[200] = "";
    int bad = 0;
#define WAIT_EXPECT(cond, ...)                                                                                         \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            bad++;                                                                                                     \
            if (!why[0])                                                                                               \
                snprintf(why, sizeof why, __VA_ARGS__);                                                                \
        }                                                                                                              \
    } while (0)
    void *hbuf = NULL; /* a copy's source on the held context (left with it when it is stuck) */
    WAIT_EXPECT(duet_cuda_malloc(h, &hbuf, 16) == DUET_OK, "cudaMalloc on the second context");
    WAIT_EXPECT(duet_cuda_test_hold(h, 600001) == DUET_ERR_INVALID, "a hold past 10 minutes was taken");
    WAIT_EXPECT(duet_cuda_test_hold(h, hold_ms) == DUET_OK, "hold: %.150s", duet_cuda_error(h)->msg);
    double t0 = wall_ms();
    duet_status_t st = duet_cuda_sync(h);
    double t1 = wall_ms(), first = t1 - t0;
    /* the checks' own context goes on meanwhile (the held stream is another one) */
    float *d = dmalloc(ck, 4096), back[1024], one[1024];
    for (int i = 0; i < 1024; i++)
        one[i] = (float)i;
    CK(duet_cuda_upload(ck->c, d, one, sizeof one));
    ddownload(ck, back, d, sizeof back);
    WAIT_EXPECT(!memcmp(back, one, sizeof one), "the other context's copy differs");
    duet_cuda_free(ck->c, d);
    if (late) {
        WAIT_EXPECT(st == DUET_ERR_TIMEOUT, "past the deadline: status %s, not TIMEOUT", duet_status_str(st));
        WAIT_EXPECT(first >= 0.9 * wait_ms && first < wait_ms + 1000.0, "the wait took %.0f ms", first);
        WAIT_EXPECT(duet_cuda_stuck(h), "not stuck after the deadline");
        double t2 = wall_ms();
        duet_status_t st2 = duet_cuda_sync(h);
        double again = wall_ms() - t2;
        WAIT_EXPECT(st2 == DUET_ERR_CUDA && again < 50.0, "the wait after it: %s in %.1f ms", duet_status_str(st2),
                    again);
        WAIT_EXPECT(hbuf && duet_cuda_download(h, back, hbuf, 4) == DUET_ERR_CUDA &&
                        strstr(duet_cuda_error(h)->msg, "taken as stuck"),
                    "a copy on the stuck context: %.150s", duet_cuda_error(h)->msg);
        snprintf(row.note, sizeof row.note, "timed out after %.0f ms, then %.2f ms", first, again);
    } else {
        WAIT_EXPECT(st == DUET_OK, "within the deadline: %.150s", duet_cuda_error(h)->msg);
        WAIT_EXPECT(first >= 0.9 * hold_ms && first < hold_ms + 1000.0, "the wait took %.0f ms", first);
        WAIT_EXPECT(!duet_cuda_stuck(h), "stuck within the deadline");
        snprintf(row.note, sizeof row.note, "returned after %.0f ms", first);
    }
#undef WAIT_EXPECT
    if (bad)
        snprintf(row.note, sizeof row.note, "%.200s", why);
    row.err = bad;
    row.pass = bad == 0;
    print_row(ck, &row);
    if (!duet_cuda_stuck(h))
        duet_cuda_free(h, hbuf);
    duet_cuda_destroy(&h); /* stuck: its memory stays, the hold ends on its own */
}

static void group_wait(ck_t *ck)
{
    case_wait(ck, 200, 5000);
    case_wait(ck, 3000, 500);
}

static void group_pdl(ck_t *ck)
{
    case_side_chain(ck, DUET_DT_F8_E4M3, 4096, 32, 4);
    case_side_chain(ck, DUET_DT_F8_E4M3, 2048, 3, 6);
    case_pdl_chain(ck, DUET_DT_F8_E4M3, 4096, 1, 8, 1);  /* decode batch 1: the fp32-unit kernel */
    case_pdl_chain(ck, DUET_DT_F8_E4M3, 4096, 32, 8, 0); /* batch 32: tensor cores, split along the columns */
    case_pdl_chain(ck, DUET_DT_F8_E4M3, 4096, 5, 8, 0);
    case_pdl_chain(ck, DUET_DT_BF16, 4096, 32, 4, 0);
    case_pdl_chain(ck, DUET_DT_F4_E2M1X2, 4096, 300, 4, 0);
}

static void case_rmsnorm(ck_t *ck, int n, int dim, int weighted)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "rms/%d/%d/%d", n, dim, weighted);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("rmsnorm", "n=%d dim=%d%s", n, dim, weighted ? " weighted" : "");
    size_t nx = (size_t)n * dim;
    float *x = rand_f32(&r, nx, 3.0f), *w = rand_f32(&r, dim, 1.0f), *y = xmalloc(4 * nx), *ref = xmalloc(4 * nx);
    ew_arg_t a;
    memset(&a, 0, sizeof a);
    a.dx = dupload(ck, x, 4 * nx);
    a.dw = weighted ? dupload(ck, w, 4 * (size_t)dim) : NULL;
    a.dy = dmalloc(ck, 4 * nx);
    a.n = n;
    a.dim = dim;
    a.eps = 1e-6f;
    dpoison(ck, a.dy, 4 * nx);
    CK(rms_call(ck, &a));
    ddownload(ck, y, a.dy, 4 * nx);
    duet_cpu_rmsnorm(x, weighted ? w : NULL, n, dim, a.eps, ref);
    row_float(&row, y, ref, nx, 1e-5);
    bench_row(ck, &row, rms_call, &a, 8.0 * nx + (weighted ? 4.0 * dim : 0), 3.0 * nx, BOUND_FP32);
    print_row(ck, &row);
    free(x); free(w); free(y); free(ref);
    duet_cuda_free(ck->c, a.dx); duet_cuda_free(ck->c, a.dw); duet_cuda_free(ck->c, a.dy);
}

static void group_rmsnorm(ck_t *ck)
{
    case_rmsnorm(ck, 32, 4096, 1);
    case_rmsnorm(ck, 4096, 4096, 1);
    case_rmsnorm(ck, 32 * 64, 512, 0);   /* per-head q norm */
    case_rmsnorm(ck, 32, 1024, 1);       /* q_norm */
    case_rmsnorm(ck, 7, 16384, 0);
    case_rmsnorm(ck, 3, 100, 1);
}

static duet_status_t rope_call(ck_t *ck, void *p)
{
    ew_arg_t *a = p;
    return duet_cuda_rope(ck->c, a->dx, a->n, a->n_heads, a->head_dim, a->dpos, &a->rope, a->sign);
}

static void case_rope(ck_t *ck, int n, int n_heads, int head_dim, int rope_dim, int yarn, int sign)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "rope/%d/%d/%d/%d/%d/%d", n, n_heads, head_dim, rope_dim, yarn, sign);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("rope", "n=%d %dx%d r=%d%s %s", n, n_heads, head_dim, rope_dim, yarn ? " yarn" : "",
                        sign > 0 ? "fwd" : "inv");
    ew_arg_t a;
    memset(&a, 0, sizeof a);
    duet_yarn_t y = {1, 16.0, 32.0, 1.0, 1.0, 1.0, 65536};
    duet_rope_init(&a.rope, rope_dim, yarn ? 160000.0 : 10000.0, yarn ? &y : NULL);
    size_t nx = (size_t)n * n_heads * head_dim;
    float *x = rand_f32(&r, nx, 1.0f), *ref = xmalloc(4 * nx), *out = xmalloc(4 * nx);
    int64_t *pos = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        pos[i] = (int64_t)(rng_u64(&r) % (i % 2 ? 1048576 : 4096));
    memcpy(ref, x, 4 * nx);
    a.dx = dupload(ck, x, 4 * nx);
    a.dpos = dupload(ck, pos, sizeof(int64_t) * (size_t)n);
    a.n = n;
    a.n_heads = n_heads;
    a.head_dim = head_dim;
    a.sign = sign;
    CK(rope_call(ck, &a));
    ddownload(ck, out, a.dx, 4 * nx);
    duet_cpu_rope(ref, n, n_heads, head_dim, pos, &a.rope, sign);
    row_f32_bits(&row, out, ref, nx); /* ref_math.h's sine and cosine on both */
    /* in place: bench on the rotated data (rotating again is the same work) */
    double rb = 8.0 * n * n_heads * rope_dim;
    bench_row(ck, &row, rope_call, &a, rb, 6.0 * n * n_heads * rope_dim / 2, BOUND_FP32);
    print_row(ck, &row);
    free(x); free(ref); free(out); free(pos);
    duet_cuda_free(ck->c, a.dx); duet_cuda_free(ck->c, a.dpos);
}

static void group_rope(ck_t *ck)
{
    case_rope(ck, 32, 64, 512, 64, 0, 1);
    case_rope(ck, 32, 64, 512, 64, 1, -1);
    case_rope(ck, 4096, 1, 512, 64, 1, 1);
    case_rope(ck, 32, 64, 128, 64, 1, 1); /* indexer q */
    case_rope(ck, 5, 3, 20, 8, 0, 1);
}

static duet_status_t swiglu_call(ck_t *ck, void *p)
{
    ew_arg_t *a = p;
    return duet_cuda_swiglu(ck->c, a->dgate, a->dup, a->n, a->dim, a->limit, a->dy);
}

static void case_swiglu(ck_t *ck, int n, int inter, float limit)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "swiglu/%d/%d/%g", n, inter, limit);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("swiglu", "n=%d inter=%d limit=%g", n, inter, limit);
    size_t nx = (size_t)n * inter;
    float *g = rand_f32(&r, nx, 6.0f), *u = rand_f32(&r, nx, 6.0f), *y = xmalloc(4 * nx), *ref = xmalloc(4 * nx);
    ew_arg_t a;
    memset(&a, 0, sizeof a);
    a.dgate = dupload(ck, g, 4 * nx);
    a.dup = dupload(ck, u, 4 * nx);
    a.dy = dmalloc(ck, 4 * nx);
    a.n = n;
    a.dim = inter;
    a.limit = limit;
    dpoison(ck, a.dy, 4 * nx);
    CK(swiglu_call(ck, &a));
    ddownload(ck, y, a.dy, 4 * nx);
    duet_cpu_swiglu(g, u, n, inter, limit, ref);
    row_f32_bits(&row, y, ref, nx); /* ref_math.h's exponential on both */
    bench_row(ck, &row, swiglu_call, &a, 12.0 * nx, 5.0 * nx, BOUND_FP32);
    print_row(ck, &row);
    free(g); free(u); free(y); free(ref);
    duet_cuda_free(ck->c, a.dgate); duet_cuda_free(ck->c, a.dup); duet_cuda_free(ck->c, a.dy);
}

static void group_swiglu(ck_t *ck)
{
    case_swiglu(ck, 32, 2048, 10.0f);
    case_swiglu(ck, 4096, 2048, 10.0f);
    case_swiglu(ck, 6, 1001, 0.0f);
}

/* ---- cache entries ---- */

static void flash_config(duet_model_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->hidden_size = 4096;
    cfg->num_hidden_layers = 4;
    cfg->head_dim = 512;
    cfg->qk_rope_head_dim = 64;
    cfg->index_head_dim = 128;
    cfg->sliding_window = 128;
    cfg->compress_ratios[0] = 0;
    cfg->compress_ratios[1] = 4;
    cfg->compress_ratios[2] = 128;
    cfg->compress_ratios[3] = 4;
    cfg->n_compress_ratios = 4;
}

/* The V4-Flash layout of pool `kind` with every cache in dt (256-token pages); a layout the
 * library refuses ends the run (exit 2). */
static duet_cache_layout_t flash_layout(duet_pool_kind_t kind, duet_cache_dtype_t dt)
{
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t opts = {256, dt, dt};
    duet_cache_layout_t l;
    duet_err_t err;
    if (duet_cache_layout_compute(&cfg, &opts, kind, &l, &err) != DUET_OK) {
        fprintf(stderr, "duet-check-ops: layout: %s\n", duet_err_text(&err));
        exit(2);
    }
    return l;
}

typedef struct {
    const duet_cache_layout_t *l;
    uint8_t *dpool;
    uint32_t *dunit, *didx;
    float *dvec;
    uint32_t n;
    int load;
} ce_arg_t;

static duet_status_t ce_call(ck_t *ck, void *p)
{
    ce_arg_t *a = p;
    if (a->load)
        return duet_cuda_cache_load(ck->c, a->l, a->dpool, a->dunit, a->didx, a->dvec, a->n);
    return duet_cuda_cache_store(ck->c, a->l, a->dpool, a->dunit, a->didx, a->dvec, a->n);
}

static void case_cache(ck_t *ck, duet_pool_kind_t kind, duet_cache_dtype_t dt, uint32_t n_entries)
{
    duet_cache_layout_t l = flash_layout(kind, dt);
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "cache/%d/%d/%u", (int)kind, (int)dt, n_entries);
    rng_init(&r, ck->seed, tag);
    uint32_t epp = l.entries_per_page;
    uint32_t units = (n_entries + epp - 1) / epp + 3;
    size_t pool_bytes = (size_t)units * l.page_bytes;
    uint32_t *unit = xmalloc(4 * (size_t)n_entries), *idx = xmalloc(4 * (size_t)n_entries);
    random_slots(&r, units, epp, n_entries, unit, idx);
    size_t nv = (size_t)n_entries * l.vec_dim;
    float *vec = rand_f32(&r, nv, 2.0f);
    /* a few all-zero nope blocks and extreme values exercise the scale corner cases */
    for (uint32_t i = 0; i < n_entries; i += 97)
        for (uint32_t c = 0; c < 64 && c < l.vec_dim; c++)
            vec[(size_t)i * l.vec_dim + c] = 0.0f;
    for (uint32_t i = 5; i < n_entries; i += 101)
        vec[(size_t)i * l.vec_dim + 3] = i % 2 ? 1e30f : -3e-30f;
    uint8_t *pool = rand_bytes(&r, pool_bytes), *gpool = xmalloc(pool_bytes);
    ce_arg_t a = {&l, dupload(ck, pool, pool_bytes), dupload(ck, unit, 4 * (size_t)n_entries),
                  dupload(ck, idx, 4 * (size_t)n_entries), dupload(ck, vec, 4 * nv), n_entries, 0};
    const char *dn = duet_cache_dtype_name(dt), *pn = duet_pool_kind_name(kind);
    /* store: the whole pool must equal the CPU's (written entries and untouched bytes) */
    row_t row = row_new("cache_store", "%s %s %u x %uB", pn, dn, n_entries, l.entry_bytes);
    CK(ce_call(ck, &a));
    ddownload(ck, gpool, a.dpool, pool_bytes);
    for (uint32_t i = 0; i < n_entries; i++)
        duet_cache_entry_store(&l, pool + (size_t)unit[i] * l.page_bytes, idx[i], vec + (size_t)i * l.vec_dim);
    row_bytes(&row, gpool, pool, pool_bytes);
    double io = 4.0 * nv + (double)n_entries * l.entry_bytes;
    bench_row(ck, &row, ce_call, &a, io, 0.0, BOUND_MEM);
    print_row(ck, &row);
    /* load: from the stored pool, bit for bit */
    row = row_new("cache_load", "%s %s %u x %uB", pn, dn, n_entries, l.entry_bytes);
    CK(duet_cuda_upload(ck->c, a.dpool, pool, pool_bytes));
    float *gv = xmalloc(4 * nv), *cv = xmalloc(4 * nv);
    dpoison(ck, a.dvec, 4 * nv);
    a.load = 1;
    CK(ce_call(ck, &a));
    ddownload(ck, gv, a.dvec, 4 * nv);
    for (uint32_t i = 0; i < n_entries; i++)
        duet_cache_entry_load(&l, pool + (size_t)unit[i] * l.page_bytes, idx[i], cv + (size_t)i * l.vec_dim);
    row_bytes(&row, gv, cv, 4 * nv);
    bench_row(ck, &row, ce_call, &a, io, 0.0, BOUND_MEM);
    print_row(ck, &row);
    /* load into bf16 (attention's keys): bit for bit with the CPU's load rounded to bf16, and that
     * rounding exact (the float comes back); fp8 index-K (an fp32 scale) refused */
    row = row_new("cache_load_bf16", "%s %s %u x %uB", pn, dn, n_entries, l.entry_bytes);
    uint16_t *g16 = xmalloc(2 * nv), *c16 = xmalloc(2 * nv);
    memset(c16, 0, 2 * nv); /* written below for every value; zeroed so that no compiler sees it unset */
    duet_status_t st16 = duet_cuda_cache_load_bf16(ck->c, &l, a.dpool, a.dunit, a.didx, (uint16_t *)a.dvec, a.n);
    if (kind == DUET_POOL_C4_INDEX_K && dt == DUET_CACHE_FP8) {
        row.exact = 1;
        row.pass = st16 == DUET_ERR_UNSUPPORTED;
        snprintf(row.note, sizeof row.note, "refused (%s)", st16 == DUET_ERR_UNSUPPORTED ? "as it must" : "not");
    } else {
        CK(st16);
        ddownload(ck, g16, a.dvec, 2 * nv);
        size_t inexact = 0;
        for (size_t i = 0; i < nv; i++) {
            c16[i] = duet_f32_to_bf16(cv[i]);
            inexact += duet_bf16_to_f32(c16[i]) != cv[i] && cv[i] == cv[i];
        }
        row_bytes(&row, g16, c16, 2 * nv);
        if (inexact) {
            row.pass = 0;
            snprintf(row.note, sizeof row.note, "%zu decoded values not exact in bf16", inexact);
        }
    }
    print_row(ck, &row);
    /* the same load from a pool 4 bytes off 16-byte alignment: the block-an-entry kernel that
     * layouts not aligned for the warp kernel take */
    row = row_new("cache_load", "%s %s %u x %uB, pool unaligned", pn, dn, n_entries, l.entry_bytes);
    uint8_t *dodd = dmalloc(ck, pool_bytes + 16);
    CK(duet_cuda_upload(ck->c, dodd + 4, pool, pool_bytes));
    dpoison(ck, a.dvec, 4 * nv);
    CK(duet_cuda_cache_load(ck->c, &l, dodd + 4, a.dunit, a.didx, a.dvec, a.n));
    ddownload(ck, gv, a.dvec, 4 * nv);
    row_bytes(&row, gv, cv, 4 * nv);
    print_row(ck, &row);
    duet_cuda_free(ck->c, dodd);
    free(g16); free(c16);
    free(unit); free(idx); free(vec); free(pool); free(gpool); free(gv); free(cv);
    duet_cuda_free(ck->c, a.dpool); duet_cuda_free(ck->c, a.dunit); duet_cuda_free(ck->c, a.didx);
    duet_cuda_free(ck->c, a.dvec);
}

/* duet_cuda_cache_load_sel(_bf16) against duet_cache_entry_load, bit for bit over the whole output
 * (slots not selected keep their poison): rows sequences of random lengths over one page table,
 * each with up to k selected entries (some -1), as attention's compressed keys are loaded. */
typedef struct {
    const duet_cache_layout_t *l;
    uint8_t *dpool;
    int32_t *dsel, *dnsel, *dpoff, *ddst;
    uint32_t *dpages;
    void *dout;
    int k, rows, bf16;
} ls_arg_t;

static duet_status_t ls_call(ck_t *ck, void *p)
{
    ls_arg_t *a = p;
    if (a->bf16)
        return duet_cuda_cache_load_sel_bf16(ck->c, a->l, a->dpool, a->dsel, a->k, a->rows, a->dnsel, a->dpages,
                                             a->dpoff, a->ddst, a->dout);
    return duet_cuda_cache_load_sel(ck->c, a->l, a->dpool, a->dsel, a->k, a->rows, a->dnsel, a->dpages, a->dpoff,
                                    a->ddst, a->dout);
}

static void case_load_sel(ck_t *ck, duet_pool_kind_t kind, duet_cache_dtype_t dt, int rows, int k, int max_entries)
{
    duet_cache_layout_t l = flash_layout(kind, dt);
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "lsel/%d/%d/%d/%d", (int)kind, (int)dt, rows, k);
    rng_init(&r, ck->seed, tag);
    uint32_t epp = l.entries_per_page, dim = l.vec_dim;
    int32_t *nsel = xmalloc(4 * (size_t)rows), *poff = xmalloc(4 * (size_t)rows), *dst = xmalloc(4 * (size_t)rows);
    int32_t *sel = xmalloc(4 * (size_t)rows * k), *len = xmalloc(4 * (size_t)rows);
    size_t n_pt = 0, n_out = 0, n_loaded = 0;
    for (int b = 0; b < rows; b++) {
        len[b] = (int32_t)(rng_u64(&r) % (uint64_t)(max_entries + 1));
        poff[b] = (int32_t)n_pt;
        n_pt += (len[b] + epp - 1) / epp;
        nsel[b] = len[b] < k ? len[b] : k;
        dst[b] = (int32_t)n_out;
        n_out += (size_t)k + b % 3; /* gaps between rows stay poisoned */
        for (int j = 0; j < k; j++)
            sel[(size_t)b * k + j] = j < nsel[b] && rng_u64(&r) % 16 ? (int32_t)(rng_u64(&r) % (uint64_t)len[b]) : -1;
    }
    uint32_t units = (uint32_t)n_pt + 5;
    uint32_t *pages = xmalloc(4 * (n_pt + 1));
    for (size_t i = 0; i < n_pt; i++) /* page ids in random order, some shared by two rows */
        pages[i] = (uint32_t)(rng_u64(&r) % units);
    size_t pool_bytes = (size_t)units * l.page_bytes;
    uint8_t *pool = rand_bytes(&r, pool_bytes);
    float *vec = xmalloc(4 * (size_t)dim);
    for (uint32_t u = 0; u < units; u++) /* every slot an entry the CPU's codec stored (random bytes would hold
                                            e4m3 NaN codes, whose product's NaN bits differ by the machine) */
        for (uint32_t ix = 0; ix < epp; ix++) {
            for (uint32_t i = 0; i < dim; i++)
                vec[i] = rng_normal(&r) * ((u + ix) % 29 == 0 ? 300.0f : 2.0f);
            if ((u + ix) % 31 == 0)
                memset(vec, 0, 4 * (dim < 64 ? dim : 64)); /* an all-zero scale block */
            duet_cache_entry_store(&l, pool + (size_t)u * l.page_bytes, ix, vec);
        }
    free(vec);
    size_t nv = n_out * dim;
    float *cv = xmalloc(4 * nv), *gv = xmalloc(4 * nv);
    uint16_t *c16 = xmalloc(2 * nv), *g16 = xmalloc(2 * nv);
    memset(cv, 0xff, 4 * nv);
    memset(c16, 0xff, 2 * nv);
    for (int b = 0; b < rows; b++)
        for (int j = 0; j < nsel[b]; j++) {
            int32_t e = sel[(size_t)b * k + j];
            if (e < 0)
                continue;
            float *o = cv + ((size_t)dst[b] + j) * dim;
            duet_cache_entry_load(&l, pool + (size_t)pages[poff[b] + e / (int32_t)epp] * l.page_bytes,
                                  (uint32_t)e % epp, o);
            for (uint32_t i = 0; i < dim; i++)
                c16[((size_t)dst[b] + j) * dim + i] = duet_f32_to_bf16(o[i]);
            n_loaded++;
        }
    ls_arg_t a = {&l,
                  dupload(ck, pool, pool_bytes),
                  dupload(ck, sel, 4 * (size_t)rows * k),
                  dupload(ck, nsel, 4 * (size_t)rows),
                  dupload(ck, poff, 4 * (size_t)rows),
                  dupload(ck, dst, 4 * (size_t)rows),
                  dupload(ck, pages, 4 * (n_pt + 1)),
                  dmalloc(ck, 4 * nv),
                  k,
                  rows,
                  0};
    const char *dn = duet_cache_dtype_name(dt), *pn = duet_pool_kind_name(kind);
    double io = (double)n_loaded * (l.entry_bytes + 4.0 * dim);
    row_t row = row_new("cache_load_sel", "%s %s rows=%d k=%d (%zu loaded)", pn, dn, rows, k, n_loaded);
    dpoison(ck, a.dout, 4 * nv);
    CK(ls_call(ck, &a));
    ddownload(ck, gv, a.dout, 4 * nv);
    row_bytes(&row, gv, cv, 4 * nv);
    bench_row(ck, &row, ls_call, &a, io, 0.0, BOUND_MEM);
    print_row(ck, &row);
    row = row_new("cache_load_sel_bf16", "%s %s rows=%d k=%d (%zu loaded)", pn, dn, rows, k, n_loaded);
    a.bf16 = 1;
    dpoison(ck, a.dout, 2 * nv);
    CK(ls_call(ck, &a));
    ddownload(ck, g16, a.dout, 2 * nv);
    row_bytes(&row, g16, c16, 2 * nv);
    bench_row(ck, &row, ls_call, &a, (double)n_loaded * (l.entry_bytes + 2.0 * dim), 0.0, BOUND_MEM);
    print_row(ck, &row);
    free(nsel);
    free(poff);
    free(dst);
    free(sel);
    free(len);
    free(pages);
    free(pool);
    free(cv);
    free(gv);
    free(c16);
    free(g16);
    duet_cuda_free(ck->c, a.dpool);
    duet_cuda_free(ck->c, a.dsel);
    duet_cuda_free(ck->c, a.dnsel);
    duet_cuda_free(ck->c, a.dpoff);
    duet_cuda_free(ck->c, a.ddst);
    duet_cuda_free(ck->c, a.dpages);
    duet_cuda_free(ck->c, a.dout);
}

/* duet_cuda_gather_rows_to(_bf16) against the plain loop, bit for bit over the whole output (rows
 * not written keep their poison).  off shifts both buffers by that many values: 16-byte alignment
 * and dim % 8 take the eight-a-thread kernel, anything else the element-a-thread one. */
typedef struct {
    void *ddst;
    float *dsrc;
    int32_t *ddi, *dsi;
    int n, dim, bf16;
} gt_arg_t;

static duet_status_t gt_call(ck_t *ck, void *p)
{
    gt_arg_t *a = p;
    if (a->bf16)
        return duet_cuda_gather_rows_to_bf16(ck->c, a->ddst, a->ddi, a->dsrc, a->dsi, a->n, a->dim);
    return duet_cuda_gather_rows_to(ck->c, a->ddst, a->ddi, a->dsrc, a->dsi, a->n, a->dim);
}

static void case_gather_to(ck_t *ck, int n, int dim, int src_rows, int dst_rows, int off)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "gto/%d/%d/%d", n, dim, off);
    rng_init(&r, ck->seed, tag);
    size_t ns = (size_t)src_rows * dim, nd = (size_t)dst_rows * dim;
    float *src = rand_f32(&r, ns, 3.0f);
    for (size_t i = 0; i < ns; i += 61) /* bf16's corner cases: NaN, infinities, a rounding tie */
        src[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? -INFINITY : 1.00390625f;
    int32_t *di = xmalloc(4 * (size_t)n), *si = xmalloc(4 * (size_t)n);
    uint32_t *perm = xmalloc(4 * (size_t)dst_rows);
    for (int i = 0; i < dst_rows; i++)
        perm[i] = (uint32_t)i;
    for (int i = dst_rows - 1; i > 0; i--) {
        int j = (int)(rng_u64(&r) % (uint64_t)(i + 1));
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < n; i++) {
        di[i] = (int32_t)perm[i]; /* distinct destinations */
        si[i] = (int32_t)(rng_u64(&r) % (uint64_t)src_rows);
    }
    float *cref = xmalloc(4 * nd), *gout = xmalloc(4 * nd);
    uint16_t *c16 = xmalloc(2 * nd), *g16 = xmalloc(2 * nd);
    memset(cref, 0xff, 4 * nd);
    memset(c16, 0xff, 2 * nd);
    for (int i = 0; i < n; i++)
        for (int d = 0; d < dim; d++) {
            float v = src[(size_t)si[i] * dim + d];
            cref[(size_t)di[i] * dim + d] = v;
            c16[(size_t)di[i] * dim + d] = duet_f32_to_bf16(v);
        }
    float *dsrc = dmalloc(ck, 4 * (ns + 8));
    uint8_t *dout = dmalloc(ck, 4 * (nd + 8));
    CK(duet_cuda_upload(ck->c, dsrc + off, src, 4 * ns));
    gt_arg_t a = {
        dout + 4 * off, dsrc + off, dupload(ck, di, 4 * (size_t)n), dupload(ck, si, 4 * (size_t)n), n, dim, 0};
    row_t row = row_new("gather_rows_to", "n=%d dim=%d%s", n, dim, off ? ", unaligned" : "");
    dpoison(ck, a.ddst, 4 * nd);
    CK(gt_call(ck, &a));
    ddownload(ck, gout, a.ddst, 4 * nd);
    row_bytes(&row, gout, cref, 4 * nd);
    bench_row(ck, &row, gt_call, &a, 8.0 * n * dim, 0.0, BOUND_MEM);
    print_row(ck, &row);
    row = row_new("gather_rows_to_bf16", "n=%d dim=%d%s", n, dim, off ? ", unaligned" : "");
    a.bf16 = 1;
    a.ddst = dout + 2 * off;
    dpoison(ck, a.ddst, 2 * nd);
    CK(gt_call(ck, &a));
    ddownload(ck, g16, a.ddst, 2 * nd);
    row_bytes(&row, g16, c16, 2 * nd);
    bench_row(ck, &row, gt_call, &a, 6.0 * n * dim, 0.0, BOUND_MEM);
    print_row(ck, &row);
    free(src);
    free(di);
    free(si);
    free(perm);
    free(cref);
    free(gout);
    free(c16);
    free(g16);
    duet_cuda_free(ck->c, dsrc);
    duet_cuda_free(ck->c, dout);
    duet_cuda_free(ck->c, a.ddi);
    duet_cuda_free(ck->c, a.dsi);
}

/* duet_cuda_kv_entries against duet_kv_cache_entries on the host, exactly: n_runs sequences of
 * random lengths (some empty) over one page table. */
typedef struct {
    const uint32_t *pages;
    const int32_t *runs;
    int n_runs, max_count;
    uint32_t epp;
    uint32_t *unit, *idx;
} kve_arg_t;

static duet_status_t kve_call(ck_t *ck, void *p)
{
    kve_arg_t *a = p;
    return duet_cuda_kv_entries(ck->c, a->pages, a->runs, a->n_runs, a->max_count, a->epp, a->unit, a->idx);
}

static void case_kv_entries(ck_t *ck, int n_runs, int max_count, uint32_t epp)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "kv_entries/%d/%d/%u", n_runs, max_count, epp);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("kv_entries", "%d runs up to %d entries, %u a page", n_runs, max_count, epp);
    int32_t *runs = xmalloc(sizeof(int32_t) * 3 * (size_t)n_runs);
    size_t n_pages = 0, total = 0;
    for (int i = 0; i < n_runs; i++) {
        int count = i % 5 == 3 ? 0 : (int)(rng_u64(&r) % (uint64_t)(max_count + 1));
        if (i == 0)
            count = max_count;
        runs[3 * i] = (int32_t)n_pages;
        runs[3 * i + 1] = (int32_t)total;
        runs[3 * i + 2] = count;
        n_pages += ((size_t)count + epp - 1) / epp + 1;
        total += (size_t)count;
    }
    uint32_t *pages = xmalloc(sizeof(uint32_t) * (n_pages ? n_pages : 1));
    for (size_t i = 0; i < n_pages; i++)
        pages[i] = (uint32_t)(rng_u64(&r) % 100000);
    size_t nt = total ? total : 1;
    uint32_t *unit = xmalloc(4 * nt), *idx = xmalloc(4 * nt), *g_unit = xmalloc(4 * nt), *g_idx = xmalloc(4 * nt);
    for (int i = 0; i < n_runs; i++)
        duet_kv_cache_entries(pages + runs[3 * i], 0, (size_t)runs[3 * i + 2], epp, unit + runs[3 * i + 1],
                              idx + runs[3 * i + 1]);
    kve_arg_t a = {dupload(ck, pages, sizeof(uint32_t) * (n_pages ? n_pages : 1)),
                   dupload(ck, runs, sizeof(int32_t) * 3 * (size_t)n_runs), n_runs, max_count, epp,
                   dmalloc(ck, 4 * nt), dmalloc(ck, 4 * nt)};
    dpoison(ck, a.unit, 4 * nt);
    dpoison(ck, a.idx, 4 * nt);
    CK(kve_call(ck, &a));
    ddownload(ck, g_unit, a.unit, 4 * nt);
    ddownload(ck, g_idx, a.idx, 4 * nt);
    static const char *const parts[] = {"unit", "idx"};
    const int32_t *gp[] = {(const int32_t *)g_unit, (const int32_t *)g_idx};
    const int32_t *rp[] = {(const int32_t *)unit, (const int32_t *)idx};
    const size_t np[] = {total, total};
    row_i32_parts(&row, 2, parts, gp, rp, np);
    bench_row(ck, &row, kve_call, &a, 8.0 * (double)total, 0, BOUND_MEM);
    print_row(ck, &row);
    free(runs); free(pages); free(unit); free(idx); free(g_unit); free(g_idx);
    duet_cuda_free(ck->c, (void *)a.pages); duet_cuda_free(ck->c, (void *)a.runs);
    duet_cuda_free(ck->c, a.unit); duet_cuda_free(ck->c, a.idx);
}

static void group_cache(ck_t *ck)
{
    case_cache(ck, DUET_POOL_C4_KV, DUET_CACHE_FP8, 4096);
    case_cache(ck, DUET_POOL_C4_KV, DUET_CACHE_BF16, 4096);
    case_cache(ck, DUET_POOL_SWA_KV, DUET_CACHE_FP8, 1000);
    case_cache(ck, DUET_POOL_C128_KV, DUET_CACHE_FP8, 37);
    case_cache(ck, DUET_POOL_C4_INDEX_K, DUET_CACHE_FP8, 8192);
    case_cache(ck, DUET_POOL_C4_INDEX_K, DUET_CACHE_BF16, 8192);
    /* attention's selected compressed keys, and its key rows gathered (batch 32 at 4k: 512 of up
     * to 1024 entries a row; 160 keys a row) */
    case_load_sel(ck, DUET_POOL_C4_KV, DUET_CACHE_FP8, 32, 512, 1024);
    case_load_sel(ck, DUET_POOL_C4_KV, DUET_CACHE_BF16, 32, 512, 1024);
    case_load_sel(ck, DUET_POOL_C4_KV, DUET_CACHE_FP8, 5, 37, 40);
    case_gather_to(ck, 32 * 160, 512, 32 * 160 + 17, 32 * 700, 0);
    case_gather_to(ck, 1000, 512, 1200, 1100, 2);
    case_gather_to(ck, 333, 12, 400, 350, 0);
    /* index lists from page tables (the forward's index-K list) */
    case_kv_entries(ck, 1, 1, 64);
    case_kv_entries(ck, 32, 1024, 64);   /* batch 32 at 4k context */
    case_kv_entries(ck, 128, 8192, 256); /* batch 128 at 32k context */
    case_kv_entries(ck, 7, 1000, 37);
}

/* ---- compress_pool ---- */

typedef struct {
    float *dkv, *dgate, *dout;
    int n_slots, dim, stride, n_entries;
    size_t entry_stride;
} cp_arg_t;

static duet_status_t cp_call(ck_t *ck, void *p)
{
    cp_arg_t *a = p;
    return duet_cuda_compress_pool(ck->c, a->dkv, a->dgate, a->n_slots, a->dim, a->stride, a->n_entries,
                                   a->entry_stride, a->dout);
}

static void case_compress(ck_t *ck, int n_slots, int dim, int stride, int n_entries)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "cp/%d/%d/%d/%d", n_slots, dim, stride, n_entries);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("compress_pool", "%d slots dim=%d/%d x%d", n_slots, dim, stride, n_entries);
    size_t es = (size_t)n_slots * stride, nx = es * n_entries, no = (size_t)n_entries * dim;
    float *kv = rand_f32(&r, nx, 1.0f), *g = rand_f32(&r, nx, 2.0f);
    /* masked slots (-inf gates), and one fully masked column per entry */
    for (int e = 0; e < n_entries; e++) {
        for (int s = 0; s < n_slots; s += 3)
            g[e * es + (size_t)s * stride + (size_t)((e * 7 + s) % dim)] = -INFINITY;
        for (int s = 0; s < n_slots; s++)
            g[e * es + (size_t)s * stride + (size_t)(e % dim)] = -INFINITY;
    }
    float *out = xmalloc(4 * no), *ref = xmalloc(4 * no);
    cp_arg_t a = {dupload(ck, kv, 4 * nx), dupload(ck, g, 4 * nx), dmalloc(ck, 4 * no), n_slots, dim, stride,
                  n_entries, es};
    dpoison(ck, a.dout, 4 * no);
    CK(cp_call(ck, &a));
    ddownload(ck, out, a.dout, 4 * no);
    for (int e = 0; e < n_entries; e++)
        duet_cpu_compress_pool(kv + e * es, g + e * es, n_slots, dim, stride, ref + (size_t)e * dim);
    row_f32_bits(&row, out, ref, no); /* the CPU's order, ref_math.h's exponential */
    bench_row(ck, &row, cp_call, &a, 8.0 * n_slots * (double)dim * n_entries + 4.0 * no,
              5.0 * n_slots * (double)dim * n_entries, BOUND_FP32);
    print_row(ck, &row);
    free(kv); free(g); free(out); free(ref);
    duet_cuda_free(ck->c, a.dkv); duet_cuda_free(ck->c, a.dgate); duet_cuda_free(ck->c, a.dout);
}

static void group_compress(ck_t *ck)
{
    case_compress(ck, 8, 512, 512, 1024);    /* C4 KV: 2x4 overlapping slots */
    case_compress(ck, 8, 128, 128, 1024);    /* C4 indexer */
    case_compress(ck, 128, 512, 512, 64);    /* C128 */
    case_compress(ck, 5, 33, 40, 7);
}

/* ---- index_score + topk ---- */

typedef struct {
    float *dq, *dw, *dkeys, *dscore, *dv;
    int32_t *doff, *dn, *didx;
    int rows, heads, dim, max_keys, k;
    float scale;
} is_arg_t;

static duet_status_t is_call(ck_t *ck, void *p)
{
    is_arg_t *a = p;
    return duet_cuda_index_score(ck->c, a->dq, a->dw, a->rows, a->heads, a->dim, a->dkeys, a->doff, a->dn,
                                 a->max_keys, a->scale, a->dscore);
}

static duet_status_t topk_call(ck_t *ck, void *p)
{
    is_arg_t *a = p;
    return duet_cuda_topk(ck->c, a->dv, a->doff, a->dn, a->rows, a->max_keys, a->k, a->didx);
}

/* Row b has nk[b] keys (row 0 the most, the others fewer) packed one after another. */
static int32_t *key_counts(int rows, int max_keys, int32_t *off, size_t *total)
{
    int32_t *nk = xmalloc(sizeof(int32_t) * (size_t)rows);
    size_t t = 0;
    for (int b = 0; b < rows; b++) {
        nk[b] = b == 0 ? max_keys : max_keys - (int)((int64_t)b * max_keys / (rows + 3));
        off[b] = (int32_t)t;
        t += (size_t)nk[b];
    }
    *total = t;
    return nk;
}

/* The CPU's scores of sampled rows (the first, the last, and evenly between; at most
 * check_rows) over keys (fp32, row b's at off[b]) into rs, the GPU's of the same rows from
 * score into gs, one after another; returns how many values, and the rows in *n_checked. */
static size_t index_ref_rows(const float *q, const float *w, int rows, int heads, int dim, const float *keys,
                             const int32_t *off, const int32_t *nk, float scale, int check_rows, const float *score,
                             float *gs, float *rs, int *n_checked)
{
    int nr = rows < check_rows ? rows : check_rows;
    size_t ncmp = 0;
    for (int i = 0; i < nr; i++) {
        int b = nr == rows ? i : (int)((int64_t)i * (rows - 1) / (nr - 1 > 0 ? nr - 1 : 1));
        duet_cpu_index_score(q + (size_t)b * heads * dim, w + (size_t)b * heads, heads, dim,
                             keys + (size_t)off[b] * dim, nk[b], scale, rs + ncmp);
        memcpy(gs + ncmp, score + off[b], 4 * (size_t)nk[b]);
        ncmp += (size_t)nk[b];
    }
    *n_checked = nr;
    return ncmp;
}

static void case_index(ck_t *ck, int rows, int heads, int dim, int max_keys, int k, int check_rows)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "is/%d/%d/%d/%d", rows, heads, dim, max_keys);
    rng_init(&r, ck->seed, tag);
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)rows);
    size_t total;
    int32_t *nk = key_counts(rows, max_keys, off, &total);
    size_t nq = (size_t)rows * heads * dim;
    float *q = rand_f32(&r, nq, 1.0f), *w = rand_f32(&r, (size_t)rows * heads, 0.125f);
    float *keys = rand_f32(&r, total * dim, 1.0f);
    float *score = xmalloc(4 * total);
    is_arg_t a;
    memset(&a, 0, sizeof a);
    a.dq = dupload(ck, q, 4 * nq);
    a.dw = dupload(ck, w, 4 * (size_t)rows * heads);
    a.dkeys = dupload(ck, keys, 4 * total * dim);
    a.dscore = dmalloc(ck, 4 * total);
    a.doff = dupload(ck, off, 4 * (size_t)rows);
    a.dn = dupload(ck, nk, 4 * (size_t)rows);
    a.didx = dmalloc(ck, 4 * (size_t)rows * k);
    a.rows = rows;
    a.heads = heads;
    a.dim = dim;
    a.max_keys = max_keys;
    a.k = k;
    a.scale = 1.0f / sqrtf((float)dim);
    a.dv = a.dscore;
    dpoison(ck, a.dscore, 4 * total);
    CK(is_call(ck, &a));
    ddownload(ck, score, a.dscore, 4 * total);
    float *gs = xmalloc(4 * total), *rs = xmalloc(4 * total);
    int nr;
    size_t ncmp = index_ref_rows(q, w, rows, heads, dim, keys, off, nk, a.scale, check_rows, score, gs, rs, &nr);
    row_t row = row_new("index_score", "rows=%d %dx%d keys<=%d", rows, heads, dim, max_keys);
    row_float(&row, gs, rs, ncmp, 1e-5);
    if (nr < rows && !row.note[0])
        snprintf(row.note, sizeof row.note, "checked %d sampled rows", nr);
    bench_row(ck, &row, is_call, &a, 4.0 * (total * dim + nq + total), 2.0 * heads * (double)dim * total,
              BOUND_FP32);
    print_row(ck, &row);

    /* top-k of the GPU's scores, every row: bit-exact with the CPU on the same values */
    row = row_new("topk", "rows=%d n<=%d k=%d scores", rows, max_keys, k);
    int32_t *gi = xmalloc(4 * (size_t)rows * k), *ci = xmalloc(4 * (size_t)rows * k);
    dpoison(ck, a.didx, 4 * (size_t)rows * k);
    CK(topk_call(ck, &a));
    ddownload(ck, gi, a.didx, 4 * (size_t)rows * k);
    for (int b = 0; b < rows; b++) {
        int kk = nk[b] < k ? nk[b] : k;
        for (int j = 0; j < k; j++)
            ci[(size_t)b * k + j] = -1;
        duet_cpu_topk(score + off[b], nk[b], kk, ci + (size_t)b * k);
    }
    row_i32(&row, gi, ci, (size_t)rows * k);
    bench_row(ck, &row, topk_call, &a, 4.0 * total + 4.0 * rows * k, 0.0, BOUND_MEM);
    print_row(ck, &row);

    free(off); free(nk); free(q); free(w); free(keys); free(score); free(gs); free(rs);
    free(gi); free(ci);
    duet_cuda_free(ck->c, a.dq); duet_cuda_free(ck->c, a.dw); duet_cuda_free(ck->c, a.dkeys);
    duet_cuda_free(ck->c, a.dscore); duet_cuda_free(ck->c, a.doff); duet_cuda_free(ck->c, a.dn);
    duet_cuda_free(ck->c, a.didx);
}

/* The indexer reading the index-K pool itself (duet_cuda_index_score_cache) against the pool
 * decoded into fp32 keys (duet_cuda_cache_load) then scored (duet_cuda_index_score_rows): the
 * same bits; and those two launches against the CPU (its codec's keys, duet_cpu_index_score)
 * on sampled rows.  Rows of different key counts over one entry list, each entry a random slot
 * of a pool the CPU's codec wrote. */
typedef struct {
    const duet_cache_layout_t *l;
    uint8_t *dpool;
    uint32_t *dunit, *didx;
    float *dq, *dw, *dkeys, *dscore;
    int32_t *doff, *dn;
    int rows, heads, dim, max_keys, total;
    float scale;
} isc_arg_t;

static duet_status_t isc_fused_call(ck_t *ck, void *p)
{
    isc_arg_t *a = p;
    return duet_cuda_index_score_cache(ck->c, a->dq, a->dw, a->rows, a->heads, a->dim, a->l, a->dpool, a->dunit,
                                       a->didx, a->doff, a->dn, NULL, a->max_keys, a->scale, a->dscore);
}

static duet_status_t isc_two_call(ck_t *ck, void *p)
{
    isc_arg_t *a = p;
    duet_status_t st = duet_cuda_cache_load(ck->c, a->l, a->dpool, a->dunit, a->didx, a->dkeys, (uint32_t)a->total);
    if (st != DUET_OK)
        return st;
    return duet_cuda_index_score_rows(ck->c, a->dq, a->dw, a->rows, a->heads, a->dim, a->dkeys, a->doff, a->dn,
                                      NULL, a->max_keys, a->scale, a->dscore);
}

static duet_status_t isc_alone_call(ck_t *ck, void *p)
{
    /* the last row alone: its q, w, key list and count, scores where the batch put them */
    isc_arg_t *a = p;
    int b = a->rows - 1;
    return duet_cuda_index_score_cache(ck->c, a->dq + (size_t)b * a->heads * a->dim, a->dw + (size_t)b * a->heads, 1,
                                       a->heads, a->dim, a->l, a->dpool, a->dunit, a->didx, a->doff + b, a->dn + b,
                                       NULL, a->max_keys, a->scale, a->dscore);
}

/* The index-K layout of the V4-Flash widths with `dim` values an entry (the tiny fixture's 64). */
static duet_cache_layout_t index_layout(duet_cache_dtype_t dt, int dim)
{
    duet_model_config_t cfg;
    flash_config(&cfg);
    cfg.index_head_dim = dim;
    duet_cache_opts_t opts = {256, dt, dt};
    duet_cache_layout_t l;
    duet_err_t err;
    if (duet_cache_layout_compute(&cfg, &opts, DUET_POOL_C4_INDEX_K, &l, &err) != DUET_OK) {
        fprintf(stderr, "duet-check-ops: layout: %s\n", duet_err_text(&err));
        exit(2);
    }
    return l;
}

static void case_index_cache(ck_t *ck, duet_cache_dtype_t dt, int rows, int heads, int max_keys, int idim)
{
    duet_cache_layout_t l = index_layout(dt, idim);
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "isc/%d/%d/%d/%d", (int)dt, rows, heads, max_keys);
    rng_init(&r, ck->seed, tag);
    int dim = (int)l.vec_dim;
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)rows);
    size_t total;
    int32_t *nk = key_counts(rows, max_keys, off, &total);
    uint32_t epp = l.entries_per_page, units = (uint32_t)((total + epp - 1) / epp) + 3;
    size_t pool_bytes = (size_t)units * l.page_bytes;
    uint32_t *unit = xmalloc(4 * total), *idx = xmalloc(4 * total);
    random_slots(&r, units, epp, total, unit, idx);
    uint8_t *pool = rand_bytes(&r, pool_bytes);
    float *vec = rand_f32(&r, (size_t)dim, 1.0f);
    for (size_t i = 0; i < total; i++) {
        for (int c = 0; c < dim; c++) /* a fresh key a slot, stored by the CPU's codec */
            vec[c] = rng_normal(&r) * (i % 53 == 0 ? 40.0f : 1.0f);
        duet_cache_entry_store(&l, pool + (size_t)unit[i] * l.page_bytes, idx[i], vec);
    }
    size_t nq = (size_t)rows * heads * dim;
    float *q = rand_f32(&r, nq, 1.0f), *w = rand_f32(&r, (size_t)rows * heads, 0.125f);
    isc_arg_t a = {&l, dupload(ck, pool, pool_bytes), dupload(ck, unit, 4 * total), dupload(ck, idx, 4 * total),
                   dupload(ck, q, 4 * nq), dupload(ck, w, 4 * (size_t)rows * heads), dmalloc(ck, 4 * total * dim),
                   dmalloc(ck, 4 * total), dupload(ck, off, 4 * (size_t)rows), dupload(ck, nk, 4 * (size_t)rows),
                   rows, heads, dim, max_keys, (int)total, 1.0f / sqrtf((float)dim)};
    float *two = xmalloc(4 * total), *fused = xmalloc(4 * total);
    dpoison(ck, a.dscore, 4 * total);
    CK(isc_two_call(ck, &a));
    ddownload(ck, two, a.dscore, 4 * total);
    dpoison(ck, a.dscore, 4 * total);
    CK(isc_fused_call(ck, &a));
    ddownload(ck, fused, a.dscore, 4 * total);
    /* the pool's scores (tensor cores where the shape allows: heads <= 64, dims a multiple of 16
     * up to 128; else the fp32 form) against the CPU on its codec's keys, sampled rows */
    float *keys = xmalloc(4 * total * (size_t)dim), *gs = xmalloc(4 * total), *rs = xmalloc(4 * total);
    for (size_t i = 0; i < total; i++)
        duet_cache_entry_load(&l, pool + (size_t)unit[i] * l.page_bytes, idx[i], keys + i * (size_t)dim);
    int nr;
    size_t ncmp = index_ref_rows(q, w, rows, heads, dim, keys, off, nk, a.scale, 4, fused, gs, rs, &nr);
    row_t row = row_new("index_score", "from the %s pool, rows=%d %dx%d keys<=%d", duet_cache_dtype_name(dt), rows,
                        heads, dim, max_keys);
    row_float(&row, gs, rs, ncmp, 1e-5);
    if (nr < rows && !row.note[0])
        snprintf(row.note, sizeof row.note, "checked %d sampled rows", nr);
    bench_row(ck, &row, isc_fused_call, &a, (double)total * l.entry_bytes + 4.0 * (nq + total),
              2.0 * heads * (double)dim * total, BOUND_FP32);
    print_row(ck, &row);
    /* a row's scores are the same bits alone as in the batch */
    {
        float *alone = xmalloc(4 * total);
        dpoison(ck, a.dscore, 4 * total);
        CK(isc_alone_call(ck, &a));
        ddownload(ck, alone, a.dscore, 4 * total);
        int b = rows - 1;
        row = row_new("index_score", "from the %s pool, row %d alone = in the batch", duet_cache_dtype_name(dt), b);
        row_bytes(&row, alone + off[b], fused + off[b], 4 * (size_t)nk[b]);
        print_row(ck, &row);
        free(alone);
    }
    /* the two launches of the fp32 form (load, then score), against the CPU */
    ncmp = index_ref_rows(q, w, rows, heads, dim, keys, off, nk, a.scale, 4, two, gs, rs, &nr);
    row = row_new("index_score", "load + score, %s pool, rows=%d keys<=%d", duet_cache_dtype_name(dt), rows,
                  max_keys);
    row_float(&row, gs, rs, ncmp, 1e-5);
    if (nr < rows && !row.note[0])
        snprintf(row.note, sizeof row.note, "checked %d sampled rows", nr);
    bench_row(ck, &row, isc_two_call, &a, (double)total * l.entry_bytes + 4.0 * (nq + total) + 8.0 * total * dim,
              2.0 * heads * (double)dim * total, BOUND_FP32);
    print_row(ck, &row);
    free(off); free(nk); free(unit); free(idx); free(pool); free(vec); free(q); free(w); free(two);
    free(fused); free(keys); free(gs); free(rs);
    duet_cuda_free(ck->c, a.dpool); duet_cuda_free(ck->c, a.dunit); duet_cuda_free(ck->c, a.didx);
    duet_cuda_free(ck->c, a.dq); duet_cuda_free(ck->c, a.dw); duet_cuda_free(ck->c, a.dkeys);
    duet_cuda_free(ck->c, a.dscore); duet_cuda_free(ck->c, a.doff); duet_cuda_free(ck->c, a.dn);
}

static void group_index(ck_t *ck)
{
    case_index(ck, 32, 64, 128, 8192, 512, 4);  /* 32k context, V4-Flash indexer */
    case_index(ck, 1, 64, 128, 32768, 512, 1);  /* 128k context, batch 1 */
    case_index(ck, 5, 4, 64, 40, 8, 5);         /* tiny fixture widths, partial tiles */
    case_index(ck, 3, 70, 48, 100, 16, 3);      /* heads beyond one tile */
    /* from the pool: batch 32 at 4k and 32k context, both encodings; a partial tile */
    case_index_cache(ck, DUET_CACHE_BF16, 32, 64, 1024, 128);
    case_index_cache(ck, DUET_CACHE_FP8, 32, 64, 1024, 128);
    case_index_cache(ck, DUET_CACHE_BF16, 32, 64, 8192, 128);
    case_index_cache(ck, DUET_CACHE_FP8, 32, 64, 8192, 128);
    case_index_cache(ck, DUET_CACHE_FP8, 3, 70, 100, 128); /* more heads than the tensor form takes */
    /* the tiny fixture's indexer (4 heads of 64): most of a block's heads absent, partial tiles */
    case_index_cache(ck, DUET_CACHE_BF16, 5, 4, 100, 64);
    case_index_cache(ck, DUET_CACHE_FP8, 5, 4, 100, 64);
    /* a prefill chunk's rows: many rows of few keys, and a row of 16 tiles in one block */
    case_index_cache(ck, DUET_CACHE_FP8, 300, 64, 1024, 128);
    /* entries of a number of 16-byte pieces that is not a multiple of 4 (6 and 5: the tile copies'
     * other map, a key's pieces on adjacent threads), on the tensor form */
    case_index_cache(ck, DUET_CACHE_BF16, 7, 64, 300, 48);
    case_index_cache(ck, DUET_CACHE_FP8, 7, 64, 300, 80);
}

/* top-k alone on hard inputs: ties, NaN, -0/+0, k >= n. */
static void case_topk(ck_t *ck, const char *what, int rows, int n_max, int k, int mode)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "topk/%s/%d/%d/%d", what, rows, n_max, k);
    rng_init(&r, ck->seed, tag);
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)rows);
    size_t total;
    int32_t *nk = key_counts(rows, n_max, off, &total);
    float *v = xmalloc(4 * total);
    for (size_t i = 0; i < total; i++) {
        float x = rng_normal(&r);
        if (mode == 1) /* few distinct values: many ties at the k-th */
            x = (float)(int)(x * 2.0f);
        if (mode == 2) { /* specials */
            uint64_t u = rng_u64(&r) % 16;
            x = u == 0 ? NAN : u == 1 ? -0.0f : u == 2 ? 0.0f : u == 3 ? -INFINITY : u == 4 ? INFINITY : x;
        }
        v[i] = x;
    }
    is_arg_t a;
    memset(&a, 0, sizeof a);
    a.dv = dupload(ck, v, 4 * total);
    a.doff = dupload(ck, off, 4 * (size_t)rows);
    a.dn = dupload(ck, nk, 4 * (size_t)rows);
    a.didx = dmalloc(ck, 4 * (size_t)rows * k);
    a.rows = rows;
    a.k = k;
    a.max_keys = n_max;
    row_t row = row_new("topk", "rows=%d n<=%d k=%d %s", rows, n_max, k, what);
    int32_t *gi = xmalloc(4 * (size_t)rows * k), *ci = xmalloc(4 * (size_t)rows * k);
    dpoison(ck, a.didx, 4 * (size_t)rows * k);
    CK(topk_call(ck, &a));
    ddownload(ck, gi, a.didx, 4 * (size_t)rows * k);
    for (int b = 0; b < rows; b++) {
        int kk = nk[b] < k ? nk[b] : k;
        for (int j = 0; j < k; j++)
            ci[(size_t)b * k + j] = -1;
        duet_cpu_topk(v + off[b], nk[b], kk, ci + (size_t)b * k);
    }
    row_i32(&row, gi, ci, (size_t)rows * k);
    bench_row(ck, &row, topk_call, &a, 4.0 * total + 4.0 * rows * k, 0.0, BOUND_MEM);
    print_row(ck, &row);
    free(off); free(nk); free(v); free(gi); free(ci);
    duet_cuda_free(ck->c, a.dv); duet_cuda_free(ck->c, a.doff); duet_cuda_free(ck->c, a.dn);
    duet_cuda_free(ck->c, a.didx);
}

static void group_topk(ck_t *ck)
{
    case_topk(ck, "normal", 32, 8192, 512, 0);
    case_topk(ck, "ties", 32, 8192, 512, 1);
    case_topk(ck, "nan/inf/-0", 16, 3000, 512, 2);
    case_topk(ck, "k>=n", 4, 300, 512, 0);
    case_topk(ck, "moe", 128, 256, 6, 0);
    case_topk(ck, "ties-moe", 128, 256, 8, 1);
    case_topk(ck, "long", 2, 262144, 2048, 0);
    case_topk(ck, "ties-long", 2, 100000, 2048, 1); /* past the keys kept in shared memory: runs of 32 steps */
    case_topk(ck, "128k ctx", 32, 32768, 512, 0);
}

/* ---- MoE: routing, sort, grouped experts, combine ---- */

/* forward.c's moe() routing for one row: the engine's own duet_moe_route_row. */
static void ref_route(const float *logit, int E, int K, int scoring, int norm, float scale, const float *bias,
                      const int32_t *hash_ids, int32_t *si, float *w)
{
    float *scratch = xmalloc(8 * (size_t)E);
    duet_moe_route_row(logit, E, K, (duet_score_fn_t)scoring, norm, scale, bias, hash_ids, scratch, si, w);
    free(scratch);
}

typedef struct {
    duet_cuda_moe_route_t p;
    float *dlogit, *dwt;
    int32_t *dsel;
    int rows;
} route_arg_t;

static duet_status_t route_call(ck_t *ck, void *p)
{
    route_arg_t *a = p;
    return duet_cuda_moe_route(ck->c, &a->p, a->dlogit, a->rows, a->dsel, a->dwt);
}

typedef struct {
    const int32_t *sel;
    int rows, K, E;
    int32_t *offs, *tiles, *xrow, *pos;
} sort_arg_t;

static duet_status_t sort_call(ck_t *ck, void *p)
{
    sort_arg_t *a = p;
    return duet_cuda_moe_sort(ck->c, a->sel, a->rows, a->K, a->E, a->offs, a->tiles, a->xrow, a->pos);
}

/* moe_sort against a stable counting sort on the host: offsets, both tile prefix sums, each
 * sorted position's row and each assignment's position, exactly (ascending rows within an
 * expert); `bad` ids (-1 and E) sprinkled in get position -1 and no place. */
static void case_moe_sort(ck_t *ck, int rows, int K, int E, int bad)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "moe_sort %d %d %d %d", rows, K, E, bad);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("moe_sort", "r%d k%d E%d%s", rows, K, E, bad ? " bad ids" : "");
    int n = rows * K;
    int32_t *sel = xmalloc(4 * (size_t)n);
    for (int i = 0; i < n; i++) { /* skewed: half the assignments on an eighth of the experts */
        uint64_t u = rng_u64(&r);
        sel[i] = (int32_t)((u & 1) ? (u >> 8) % (uint64_t)(E / 8 > 0 ? E / 8 : 1) : (u >> 8) % (uint64_t)E);
        if (bad && (u >> 40) % 17 == 0)
            sel[i] = (u >> 50) & 1 ? -1 : E;
    }
    int32_t *offs = xmalloc(4 * (size_t)(E + 1)), *tiles = xmalloc(4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    int32_t *xr = xmalloc(4 * (size_t)n), *pos = xmalloc(4 * (size_t)n);
    int32_t *g_offs = xmalloc(4 * (size_t)(E + 1)), *g_tiles = xmalloc(4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    int32_t *g_xr = xmalloc(4 * (size_t)n), *g_pos = xmalloc(4 * (size_t)n);
    memset(offs, 0, 4 * (size_t)(E + 1));
    for (int i = 0; i < n; i++)
        if (sel[i] >= 0 && sel[i] < E)
            offs[sel[i] + 1]++;
    const int size[DUET_CUDA_MOE_TILE_ROWS] = {8, duet_cuda_moe_wide_tile(), duet_cuda_moe_wg_tile()};
    for (int h = 0; h < DUET_CUDA_MOE_TILE_ROWS; h++)
        tiles[h * (E + 1)] = 0;
    for (int e = 0; e < E; e++) {
        int c = offs[e + 1];
        for (int h = 0; h < DUET_CUDA_MOE_TILE_ROWS; h++)
            tiles[h * (E + 1) + e + 1] = tiles[h * (E + 1) + e] + (c + size[h] - 1) / size[h];
        offs[e + 1] += offs[e];
    }
    int *next = xmalloc(sizeof(int) * (size_t)E);
    for (int e = 0; e < E; e++)
        next[e] = offs[e];
    memset(xr, 0xff, 4 * (size_t)n);
    for (int i = 0; i < n; i++) {
        int e = sel[i];
        pos[i] = e >= 0 && e < E ? next[e]++ : -1;
        if (pos[i] >= 0)
            xr[pos[i]] = i / K;
    }
    int32_t *dsel = dupload(ck, sel, 4 * (size_t)n);
    int32_t *doffs = dmalloc(ck, 4 * (size_t)(E + 1)),
            *dtiles = dmalloc(ck, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    int32_t *dxr = dmalloc(ck, 4 * (size_t)n), *dpos = dmalloc(ck, 4 * (size_t)n);
    dpoison(ck, dxr, 4 * (size_t)n);
    dpoison(ck, dpos, 4 * (size_t)n);
    sort_arg_t sa = {dsel, rows, K, E, doffs, dtiles, dxr, dpos};
    CK(sort_call(ck, &sa));
    ddownload(ck, g_offs, doffs, 4 * (size_t)(E + 1));
    ddownload(ck, g_tiles, dtiles, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    ddownload(ck, g_xr, dxr, 4 * (size_t)n);
    ddownload(ck, g_pos, dpos, 4 * (size_t)n);
    static const char *const parts[] = {"offsets", "tiles", "rows", "positions"};
    const int32_t *gp[] = {g_offs, g_tiles, g_xr, g_pos}, *rp[] = {offs, tiles, xr, pos};
    const size_t np[] = {(size_t)E + 1, DUET_CUDA_MOE_TILE_ROWS * ((size_t)E + 1), (size_t)offs[E], (size_t)n};
    row_i32_parts(&row, 4, parts, gp, rp, np);
    bench_row(ck, &row, sort_call, &sa, 4.0 * 3 * n + 12.0 * (E + 1), 0, BOUND_MEM);
    print_row(ck, &row);
    free(sel); free(offs); free(tiles); free(xr); free(pos); free(next);
    free(g_offs); free(g_tiles); free(g_xr); free(g_pos);
    duet_cuda_free(ck->c, dsel); duet_cuda_free(ck->c, doffs); duet_cuda_free(ck->c, dtiles);
    duet_cuda_free(ck->c, dxr); duet_cuda_free(ck->c, dpos);
}

static void case_moe_route(ck_t *ck, int rows, int E, int K, int scoring, int hash, int ties)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "moe_route/%d/%d/%d/%d/%d/%d", rows, E, K, scoring, hash, ties);
    rng_init(&r, ck->seed, tag);
    static const char *sn[] = {"smax", "sigm", "sqsp"};
    int vocab = 1000;
    float *logit = rand_f32(&r, (size_t)rows * E, 2.0f), *bias = rand_f32(&r, (size_t)E, 0.1f);
    if (ties) /* coarse logits and no bias: many equal scores at the k-th */
        for (size_t i = 0; i < (size_t)rows * E; i++)
            logit[i] = (float)(int)(logit[i] * 2.0f);
    int32_t *tok = xmalloc(4 * (size_t)rows), *tab = xmalloc(4 * (size_t)vocab * K);
    for (int i = 0; i < rows; i++)
        tok[i] = (int32_t)(rng_u64(&r) % (uint64_t)vocab);
    for (size_t i = 0; i < (size_t)vocab * K; i++)
        tab[i] = (int32_t)(rng_u64(&r) % (uint64_t)E);
    route_arg_t a;
    memset(&a, 0, sizeof a);
    a.rows = rows;
    a.p.n_experts = E;
    a.p.top_k = K;
    a.p.scoring = scoring;
    a.p.norm_topk_prob = scoring != DUET_SCORE_SOFTMAX;
    a.p.routed_scale = 1.5f;
    a.p.bias = ties ? NULL : dupload(ck, bias, 4 * (size_t)E);
    a.p.tid2eid = hash ? dupload(ck, tab, 4 * (size_t)vocab * K) : NULL;
    a.p.tok = dupload(ck, tok, 4 * (size_t)rows);
    a.p.vocab = vocab;
    a.dlogit = dupload(ck, logit, 4 * (size_t)rows * E);
    a.dsel = dmalloc(ck, 4 * (size_t)rows * K);
    a.dwt = dmalloc(ck, 4 * (size_t)rows * K);
    dpoison(ck, a.dsel, 4 * (size_t)rows * K);
    dpoison(ck, a.dwt, 4 * (size_t)rows * K);
    CK(route_call(ck, &a));
    int32_t *gs = xmalloc(4 * (size_t)rows * K), *cs = xmalloc(4 * (size_t)rows * K);
    float *gw = xmalloc(4 * (size_t)rows * K), *cw = xmalloc(4 * (size_t)rows * K);
    ddownload(ck, gs, a.dsel, 4 * (size_t)rows * K);
    ddownload(ck, gw, a.dwt, 4 * (size_t)rows * K);
    for (int i = 0; i < rows; i++)
        ref_route(logit + (size_t)i * E, E, K, scoring, a.p.norm_topk_prob, 1.5f, ties ? NULL : bias,
                  hash ? tab + (size_t)tok[i] * K : NULL, cs + (size_t)i * K, cw + (size_t)i * K);
    const char *what = hash ? "hash" : ties ? "ties" : "topk";
    row_t row = row_new("moe_route", "ids %s r%d E%d k%d %s", sn[scoring], rows, E, K, what);
    row_i32(&row, gs, cs, (size_t)rows * K);
    bench_row(ck, &row, route_call, &a, 4.0 * rows * E + 8.0 * rows * K, 0.0, BOUND_MEM);
    print_row(ck, &row);
    row = row_new("moe_route", "wts %s r%d E%d k%d %s", sn[scoring], rows, E, K, what);
    row_f32_bits(&row, gw, cw, (size_t)rows * K); /* ref_math.h's functions, the CPU's order */
    print_row(ck, &row);
    free(logit); free(bias); free(tok); free(tab); free(gs); free(cs); free(gw); free(cw);
    duet_cuda_free(ck->c, (void *)a.p.bias); duet_cuda_free(ck->c, (void *)a.p.tid2eid);
    duet_cuda_free(ck->c, (void *)a.p.tok); duet_cuda_free(ck->c, a.dlogit);
    duet_cuda_free(ck->c, a.dsel); duet_cuda_free(ck->c, a.dwt);
}

/* The routed experts of a MoE layer: grouped (sort, w1+w3, SwiGLU, w2, combine) against
 * the per-expert device path (bit for bit), the CPU (forward.c's loop) and each of a few
 * rows run alone (bit for bit: batch invariance). */
typedef struct {
    int E, K, D, I, rows;
    weight_t *W;            /* 3E: w1, w2, w3 per expert */
    duet_weight_t proto[3]; /* device protos */
    const void **dtab;      /* device (6, E) */
    int32_t *dsel, *doffs, *dtiles, *dxrow, *dpos;
    float *dwt, *dx, *dshared, *deg, *deu, *dy, *dout;
    float limit;
} gx_arg_t;

static duet_status_t gx_call(ck_t *ck, void *p)
{
    gx_arg_t *a = p;
    int E = a->E, K = a->K, n = a->rows * K;
    DUET_TRY(duet_cuda_moe_sort(ck->c, a->dsel, a->rows, K, E, a->doffs, a->dtiles, a->dxrow, a->dpos));
    duet_cuda_moe_plan_t pl = {.n_experts = E, .n_assign = n, .offs = a->doffs, .tiles = a->dtiles, .xrow = a->dxrow};
    const void **t = a->dtab;
    int sc = a->proto[0].scale != NULL;
    duet_cuda_expert_mats_t m1 = {&a->proto[0], t, sc ? t + 3 * (size_t)E : NULL};
    duet_cuda_expert_mats_t m3 = {&a->proto[2], t + (size_t)E, sc ? t + 4 * (size_t)E : NULL};
    duet_cuda_expert_mats_t m2 = {&a->proto[1], t + 2 * (size_t)E, sc ? t + 5 * (size_t)E : NULL};
    DUET_TRY(duet_cuda_matmul_grouped(ck->c, &m1, &m3, &pl, a->dx, 1, a->deg, a->deu));
    DUET_TRY(duet_cuda_swiglu(ck->c, a->deg, a->deu, n, a->I, a->limit, a->deg));
    DUET_TRY(duet_cuda_matmul_grouped(ck->c, &m2, NULL, &pl, a->deg, 0, a->dy, NULL));
    return duet_cuda_moe_combine(ck->c, a->dsel, a->dwt, a->dpos, a->rows, K, a->dy, a->dshared, a->D, a->dout);
}

static void gx_buffers(ck_t *ck, gx_arg_t *a, int rows)
{
    size_t n = (size_t)rows * a->K;
    a->rows = rows;
    a->dsel = dmalloc(ck, 4 * n);
    a->dwt = dmalloc(ck, 4 * n);
    a->dxrow = dmalloc(ck, 4 * n);
    a->dpos = dmalloc(ck, 4 * n);
    a->doffs = dmalloc(ck, 4 * (size_t)(a->E + 1));
    a->dtiles = dmalloc(ck, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(a->E + 1));
    a->deg = dmalloc(ck, 4 * n * a->I);
    a->deu = dmalloc(ck, 4 * n * a->I);
    a->dy = dmalloc(ck, 4 * n * a->D);
    a->dout = dmalloc(ck, 4 * (size_t)rows * a->D);
    dpoison(ck, a->dxrow, 4 * n);
    dpoison(ck, a->dpos, 4 * n);
    dpoison(ck, a->dy, 4 * n * a->D);
    dpoison(ck, a->dout, 4 * (size_t)rows * a->D);
}

static void gx_free_buffers(ck_t *ck, gx_arg_t *a)
{
    void *p[] = {a->dsel, a->dwt, a->dxrow, a->dpos, a->doffs, a->dtiles, a->deg, a->deu, a->dy, a->dout};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        duet_cuda_free(ck->c, p[i]);
}

/* tile: the experts' fp4 matrices in the tiled layout (duet_cuda_weight_tile) where they take it,
 * as the engine keeps them */
static void case_moe_experts(ck_t *ck, duet_dtype_t dt, int E, int K, int D, int I, int rows, int check_alone,
                             int tile)
{
    rng_t r;
    char tag[96];
    snprintf(tag, sizeof tag, "moe_experts/%d/%d/%d/%d/%d/%d", (int)dt, E, K, D, I, rows);
    rng_init(&r, ck->seed, tag);
    gx_arg_t a;
    memset(&a, 0, sizeof a);
    a.E = E;
    a.K = K;
    a.D = D;
    a.I = I;
    a.limit = 10.0f;
    a.W = xmalloc(sizeof(weight_t) * 3 * (size_t)E);
    for (int e = 0; e < E; e++) {
        weight_make(ck, &r, &a.W[3 * e], dt, I, D, DUET_DT_F8_E8M0);     /* w1 */
        weight_make(ck, &r, &a.W[3 * e + 1], dt, D, I, DUET_DT_F8_E8M0); /* w2 */
        weight_make(ck, &r, &a.W[3 * e + 2], dt, I, D, DUET_DT_F8_E8M0); /* w3 */
    }
    for (int k = 0; k < 3 && tile; k++)
        if (duet_cuda_weight_tile_ok(&a.W[k].dw))
            for (int e = 0; e < E; e++)
                CK(duet_cuda_weight_tile(ck->c, &a.W[3 * e + k].dw));
    const char *tl = tile ? " tiled" : "";
    for (int k = 0; k < 3; k++)
        a.proto[k] = a.W[k].dw;
    const void **tab = xmalloc(sizeof(void *) * 6 * (size_t)E);
    static const int order[3] = {0, 2, 1};
    for (int k = 0; k < 3; k++)
        for (int e = 0; e < E; e++) {
            tab[(size_t)k * E + e] = a.W[3 * e + order[k]].dw.data;
            tab[(size_t)(3 + k) * E + e] = a.W[3 * e + order[k]].dw.scale;
        }
    a.dtab = dupload(ck, tab, sizeof(void *) * 6 * (size_t)E);
    /* rows, their routing (distinct ids per row, ascending, as the router gives) and the shared expert's output */
    float *x = rand_f32(&r, (size_t)rows * D, 1.0f), *sh = rand_f32(&r, (size_t)rows * D, 0.1f);
    int32_t *sel = xmalloc(4 * (size_t)rows * K);
    float *wt = xmalloc(4 * (size_t)rows * K);
    for (int i = 0; i < rows; i++) {
        int32_t *si = sel + (size_t)i * K;
        for (int j = 0; j < K; j++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(rng_u64(&r) % (uint64_t)E);
                dup = 0;
                for (int q = 0; q < j; q++)
                    dup |= si[q] == e;
            } while (dup);
            si[j] = e;
            wt[(size_t)i * K + j] = (float)(0.2 + rng_unit(&r));
        }
        qsort(si, (size_t)K, sizeof(int32_t), cmp_i32_);
    }
    a.dx = dupload(ck, x, 4 * (size_t)rows * D);
    a.dshared = dupload(ck, sh, 4 * (size_t)rows * D);
    gx_buffers(ck, &a, rows);
    CK(duet_cuda_upload(ck->c, a.dsel, sel, 4 * (size_t)rows * K));
    CK(duet_cuda_upload(ck->c, a.dwt, wt, 4 * (size_t)rows * K));
    row_t row = row_new("moe_experts", "%s E%d k%d %dx%d r%d cpu%s", dt_short(dt, DUET_DT_F8_E8M0), E, K, D, I,
                        rows, tl);
    duet_status_t st = gx_call(ck, &a);
    if (st != DUET_OK) {
        row.pass = 0;
        snprintf(row.note, sizeof row.note, "%s", duet_err_text(duet_cuda_error(ck->c)));
        print_row(ck, &row);
        goto out;
    }
    float *g = xmalloc(4 * (size_t)rows * D);
    ddownload(ck, g, a.dout, 4 * (size_t)rows * D);
    /* the CPU: forward.c's loop over experts in ascending id */
    {
        float *ref = xmalloc(4 * (size_t)rows * D), *xg = xmalloc(4 * (size_t)rows * D);
        float *gg = xmalloc(4 * (size_t)rows * I), *uu = xmalloc(4 * (size_t)rows * I), *yy = xmalloc(4 * (size_t)rows * D);
        int *rr = xmalloc(sizeof(int) * (size_t)rows);
        float *rw = xmalloc(4 * (size_t)rows);
        memset(ref, 0, 4 * (size_t)rows * D);
        for (int e = 0; e < E; e++) {
            int m = 0;
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < K; j++)
                    if (sel[(size_t)i * K + j] == e) {
                        rr[m] = i;
                        rw[m] = wt[(size_t)i * K + j];
                        memcpy(xg + (size_t)m * D, x + (size_t)i * D, 4 * (size_t)D);
                        m++;
                    }
            if (!m)
                continue;
            ref_matmul(ck, &a.W[3 * e].hw, 0, I, xg, m, gg);
            ref_matmul(ck, &a.W[3 * e + 2].hw, 0, I, xg, m, uu);
            duet_cpu_swiglu(gg, uu, m, I, a.limit, gg);
            ref_matmul(ck, &a.W[3 * e + 1].hw, 0, D, gg, m, yy);
            for (int i = 0; i < m; i++)
                for (int d = 0; d < D; d++)
                    ref[(size_t)rr[i] * D + d] += yy[(size_t)i * D + d] * rw[i];
        }
        for (size_t i = 0; i < (size_t)rows * D; i++)
            ref[i] += sh[i];
        row_float(&row, g, ref, (size_t)rows * D, 1e-5);
        double wbytes = 0;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (size_t i = 0; i < (size_t)rows * K; i++)
                used |= sel[i] == e;
            if (used)
                for (int k = 0; k < 3; k++)
                    wbytes += (double)a.W[3 * e + k].data_bytes + (double)a.W[3 * e + k].scale_bytes;
        }
        bench_row(ck, &row, gx_call, &a, wbytes, 6.0 * rows * K * (double)D * I, BOUND_BF16);
        print_row(ck, &row);
        free(ref); free(xg); free(gg); free(uu); free(yy); free(rr); free(rw);
    }
    /* the per-expert device path (routing lists from the host): bit for bit */
    {
        row = row_new("moe_experts", "%s E%d k%d %dx%d r%d 1by1%s", dt_short(dt, DUET_DT_F8_E8M0), E, K, D,
                      I, rows, tl);
        int32_t *rl = xmalloc(4 * (size_t)rows * K);
        float *wl = xmalloc(4 * (size_t)rows * K), *ref = xmalloc(4 * (size_t)rows * D);
        int *cnt = calloc((size_t)E + 1, sizeof(int));
        for (size_t i = 0; i < (size_t)rows * K; i++)
            cnt[sel[i] + 1]++;
        for (int e = 0; e < E; e++)
            cnt[e + 1] += cnt[e];
        for (int e = 0, f = 0; e < E; e++)
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < K; j++)
                    if (sel[(size_t)i * K + j] == e) {
                        rl[f] = i;
                        wl[f] = wt[(size_t)i * K + j];
                        f++;
                    }
        int32_t *drl = dupload(ck, rl, 4 * (size_t)rows * K);
        float *dwl = dupload(ck, wl, 4 * (size_t)rows * K), *dref = dmalloc(ck, 4 * (size_t)rows * D);
        float *dxg = dmalloc(ck, 4 * (size_t)rows * D), *dyg = dmalloc(ck, 4 * (size_t)rows * D);
        CK(duet_cuda_memset(ck->c, dref, 0, 4 * (size_t)rows * D));
        for (int e = 0; e < E; e++) {
            int m = cnt[e + 1] - cnt[e];
            if (!m)
                continue;
            CK(duet_cuda_gather_rows(ck->c, dxg, a.dx, drl + cnt[e], m, D));
            CK(duet_cuda_matmul_invariant(ck->c, &a.W[3 * e].dw, 0, I, dxg, m, a.deg));
            CK(duet_cuda_matmul_invariant(ck->c, &a.W[3 * e + 2].dw, 0, I, dxg, m, a.deu));
            CK(duet_cuda_swiglu(ck->c, a.deg, a.deu, m, I, a.limit, a.deg));
            CK(duet_cuda_matmul_invariant(ck->c, &a.W[3 * e + 1].dw, 0, D, a.deg, m, dyg));
            CK(duet_cuda_scale_add_rows(ck->c, dref, drl + cnt[e], dwl + cnt[e], dyg, m, D));
        }
        CK(duet_cuda_add(ck->c, dref, a.dshared, (size_t)rows * D));
        ddownload(ck, ref, dref, 4 * (size_t)rows * D);
        row_bytes(&row, g, ref, 4 * (size_t)rows * D);
        print_row(ck, &row);
        free(rl); free(wl); free(ref); free(cnt);
        duet_cuda_free(ck->c, drl); duet_cuda_free(ck->c, dwl); duet_cuda_free(ck->c, dref);
        duet_cuda_free(ck->c, dxg); duet_cuda_free(ck->c, dyg);
    }
    /* fp8/fp4: x split ahead of the launch (duet_cuda_tc_presplit, forced on from one position)
     * against each block splitting it (forced off): the same bits */
    if (dt != DUET_DT_BF16) {
        row = row_new("moe_experts", "%s E%d k%d %dx%d r%d x split ahead%s", dt_short(dt, DUET_DT_F8_E8M0), E, K,
                      D, I, rows, tl);
        float *g0 = xmalloc(4 * (size_t)rows * D), *g1 = xmalloc(4 * (size_t)rows * D);
        duet_cuda_tc_presplit(ck->c, 0);
        st = gx_call(ck, &a);
        if (st == DUET_OK)
            ddownload(ck, g0, a.dout, 4 * (size_t)rows * D);
        duet_cuda_tc_presplit(ck->c, 1);
        if (st == DUET_OK)
            st = gx_call(ck, &a);
        duet_cuda_tc_presplit(ck->c, -1);
        CK(st);
        ddownload(ck, g1, a.dout, 4 * (size_t)rows * D);
        row_bytes(&row, g1, g0, 4 * (size_t)rows * D);
        print_row(ck, &row);
        free(g0);
        free(g1);
    }
    /* rows alone: the same bits as inside the batch */
    if (check_alone) {
        row = row_new("moe_experts", "%s E%d k%d %dx%d r%d solo%s", dt_short(dt, DUET_DT_F8_E8M0), E, K, D, I,
                      rows, tl);
        gx_arg_t b = a;
        gx_buffers(ck, &b, 1);
        float *one = xmalloc(4 * (size_t)D);
        size_t diff = 0;
        int picks[3] = {0, rows / 2, rows - 1};
        for (int q = 0; q < 3; q++) {
            int i = picks[q];
            b.dx = a.dx + (size_t)i * D;
            b.dshared = a.dshared + (size_t)i * D;
            CK(duet_cuda_upload(ck->c, b.dsel, sel + (size_t)i * K, 4 * (size_t)K));
            CK(duet_cuda_upload(ck->c, b.dwt, wt + (size_t)i * K, 4 * (size_t)K));
            CK(gx_call(ck, &b));
            ddownload(ck, one, b.dout, 4 * (size_t)D);
            diff += memcmp(one, g + (size_t)i * D, 4 * (size_t)D) != 0;
        }
        row.exact = 1;
        row.err = (double)diff;
        row.pass = diff == 0;
        if (diff)
            snprintf(row.note, sizeof row.note, "%zu of 3 rows differ from the batch", diff);
        print_row(ck, &row);
        free(one);
        gx_free_buffers(ck, &b);
    }
    free(g);
out:
    gx_free_buffers(ck, &a);
    for (int e = 0; e < 3 * E; e++)
        weight_free(ck, &a.W[e]);
    free(a.W);
    free(tab);
    free(x); free(sh); free(sel); free(wt);
    duet_cuda_free(ck->c, (void *)a.dtab); duet_cuda_free(ck->c, a.dx); duet_cuda_free(ck->c, a.dshared);
}

static void group_moe(ck_t *ck)
{
    case_moe_route(ck, 32, 256, 6, DUET_SCORE_SQRTSOFTPLUS, 0, 0);
    case_moe_route(ck, 300, 256, 6, DUET_SCORE_SQRTSOFTPLUS, 0, 0);
    case_moe_route(ck, 32, 256, 6, DUET_SCORE_SQRTSOFTPLUS, 0, 1);
    case_moe_route(ck, 32, 256, 6, DUET_SCORE_SQRTSOFTPLUS, 1, 0);
    case_moe_route(ck, 32, 64, 8, DUET_SCORE_SIGMOID, 0, 0);
    case_moe_route(ck, 32, 64, 8, DUET_SCORE_SOFTMAX, 0, 0);
    case_moe_route(ck, 20, 8, 2, DUET_SCORE_SQRTSOFTPLUS, 0, 0);
    case_moe_route(ck, 4096, 256, 6, DUET_SCORE_SQRTSOFTPLUS, 0, 0); /* a prefill of 4096 tokens */
    case_moe_route(ck, 37, 1024, 8, DUET_SCORE_SOFTMAX, 0, 1); /* four experts a thread, ties */
    case_moe_sort(ck, 1, 6, 256, 0);
    case_moe_sort(ck, 32, 6, 256, 0);   /* a decode step */
    case_moe_sort(ck, 33, 6, 256, 1);   /* past a warp's 32, with ids out of range */
    case_moe_sort(ck, 4096, 6, 256, 0); /* a prefill of 4096 tokens */
    case_moe_sort(ck, 500, 8, 384, 1);
    case_moe_sort(ck, 1000, 6, 256, 1); /* 23 segments, the last one short, with ids out of range */
    case_moe_sort(ck, 2048, 8, 1024, 0); /* 11 segments, as many as shared memory holds */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 16, 6, 4096, 2048, 8, 1, 0);   /* V4-Flash widths, decode */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 16, 6, 4096, 2048, 8, 1, 1);   /* the same, tiled (the engine's) */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 16, 6, 4096, 2048, 1, 1, 1);   /* batch 1: the launch split along the columns */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 256, 6, 512, 256, 32, 1, 0);   /* all 256 experts, batch 32 */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 256, 6, 512, 256, 32, 1, 1);
    /* 24 positions an expert: 32-token tiles; 192: 32-token tiles untiled, 64-token tiles (sm_90) tiled */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 32, 6, 512, 256, 128, 1, 1);
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 32, 6, 512, 256, 1024, 1, 0);
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 32, 6, 512, 256, 1024, 1, 1);
    /* V4-Flash widths, 48 positions an expert: 64-token tiles */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 16, 6, 4096, 2048, 128, 0, 1);
    case_moe_experts(ck, DUET_DT_F8_E4M3, 64, 6, 512, 256, 16, 1, 0);
    case_moe_experts(ck, DUET_DT_F8_E4M3, 32, 6, 512, 256, 128, 1, 0);    /* 32-token tiles, x split ahead */
    case_moe_experts(ck, DUET_DT_F8_E4M3, 32, 6, 512, 256, 1024, 1, 0);   /* 64-token tiles (sm_90) */
    case_moe_experts(ck, DUET_DT_BF16, 32, 6, 256, 128, 1024, 1, 0);      /* 32-token tiles */
    case_moe_experts(ck, DUET_DT_BF16, 32, 6, 256, 128, 1024, 1, 1);      /* the same, bf16 tiled */
    case_moe_experts(ck, DUET_DT_BF16, 64, 6, 256, 128, 16, 1, 1);        /* one-token tiles, bf16 tiled */
    case_moe_experts(ck, DUET_DT_BF16, 8, 2, 128, 64, 20, 1, 0);          /* the tiny fixture: w2 on the fp32 units */
    case_moe_experts(ck, DUET_DT_F4_E2M1X2, 8, 2, 128, 64, 20, 1, 1);     /* w1, w3 tiled, w2 (64 columns) not */
}

/* ---- attention ---- */

/* The form a case runs: the fp32 units (duet_cuda_set_attn_tc 0), the tensor cores reading
 * float keys, or reading bf16 keys (duet_cuda_attn_rows_bf16). */
enum { AT_FP32, AT_TC, AT_BF16 };

typedef struct {
    float *dq, *dkeys, *dsinks, *dout;
    uint16_t *dkeys16;
    int32_t *doff, *dn;
    int rows, heads, dim, max_keys, form;
    float scale;
} at_arg_t;

static duet_status_t at_call(ck_t *ck, void *p)
{
    at_arg_t *a = p;
    if (a->form == AT_BF16)
        return duet_cuda_attn_rows_bf16(ck->c, a->dq, a->rows, a->heads, a->dim, a->dkeys16, a->doff, a->dn,
                                        a->max_keys, a->dsinks, a->scale, a->dout);
    return duet_cuda_attn_rows(ck->c, a->dq, a->rows, a->heads, a->dim, a->dkeys, a->doff, a->dn, a->max_keys,
                               a->dsinks, a->scale, a->dout);
}

/* invariant: batch-invariant mode (the tensor-core form splits a row every 256 keys, so rows
 * shorter than the longest have splits without keys; the fp32 form 8 parts). AT_BF16 is also
 * checked bit for bit against AT_TC on the same keys (exact in bf16, as the engine's are). */
static void case_attn(ck_t *ck, int rows, int heads, int dim, int max_keys, int check_rows, int empty_row, int form,
                      int invariant)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "attn/%d/%d/%d/%d/%d", rows, heads, dim, max_keys, empty_row);
    rng_init(&r, ck->seed, tag);
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)rows);
    size_t total;
    int32_t *nk = key_counts(rows, max_keys, off, &total);
    if (empty_row && rows > 1) { /* a row with no keys: only the sink */
        total -= (size_t)nk[rows - 1];
        nk[rows - 1] = 0;
    }
    size_t nq = (size_t)rows * heads * dim, nkv = total * (size_t)dim;
    float *q = rand_f32(&r, nq, 1.0f), *keys = rand_f32(&r, nkv, 1.0f), *sinks = rand_f32(&r, heads, 1.0f);
    uint16_t *keys16 = xmalloc(2 * (nkv ? nkv : 1));
    for (size_t i = 0; i < nkv; i++) { /* keys are decoded cache entries: exact in bf16 */
        keys16[i] = duet_f32_to_bf16(keys[i]);
        keys[i] = duet_bf16_to_f32(keys16[i]);
    }
    float *out = xmalloc(4 * nq), *ref = xmalloc(4 * nq);
    at_arg_t a = {dupload(ck, q, 4 * nq), dupload(ck, keys, 4 * nkv), dupload(ck, sinks, 4 * (size_t)heads),
                  dmalloc(ck, 4 * nq), dupload(ck, keys16, 2 * (nkv ? nkv : 1)), dupload(ck, off, 4 * (size_t)rows),
                  dupload(ck, nk, 4 * (size_t)rows), rows, heads, dim, max_keys, form, 1.0f / sqrtf((float)dim)};
    dpoison(ck, a.dout, 4 * nq);
    duet_cuda_set_attn_tc(ck->c, form != AT_FP32);
    duet_cuda_set_invariant(ck->c, invariant);
    CK(at_call(ck, &a));
    ddownload(ck, out, a.dout, 4 * nq);
    int nr = rows < check_rows ? rows : check_rows;
    float *go = xmalloc(4 * nq), *ro = xmalloc(4 * nq);
    size_t ncmp = 0, per = (size_t)heads * dim;
    for (int i = 0; i < nr; i++) {
        int b = nr == rows ? i : (int)((int64_t)i * (rows - 1) / (nr - 1 > 0 ? nr - 1 : 1));
        duet_cpu_attn_row(q + b * per, heads, dim, keys + (size_t)off[b] * dim, nk[b], sinks, a.scale, ro + ncmp);
        memcpy(go + ncmp, out + b * per, 4 * per);
        ncmp += per;
    }
    const char *fname = form == AT_BF16 ? "tc bf16-keys"
                        : form == AT_FP32 || !duet_cuda_attn_rows_tc_ok(dim) ? "fp32" : "tc";
    row_t row = row_new("attn_rows", "rows=%d %dx%d keys<=%d%s %s%s", rows, heads, dim, max_keys,
                        empty_row ? " +empty" : "", fname, invariant ? " invariant" : "");
    row_float(&row, go, ro, ncmp, 2e-5);
    if (form == AT_BF16 && row.pass) { /* the same bits as the float keys' tensor-core run */
        float *fo = xmalloc(4 * nq);
        a.form = AT_TC;
        dpoison(ck, a.dout, 4 * nq);
        CK(at_call(ck, &a));
        ddownload(ck, fo, a.dout, 4 * nq);
        a.form = AT_BF16;
        size_t diff = 0;
        for (size_t i = 0; i < nq; i++)
            diff += memcmp(&fo[i], &out[i], 4) != 0;
        if (diff) {
            row.pass = 0;
            snprintf(row.note, sizeof row.note, "%zu of %zu outputs differ from the float keys' run", diff, nq);
        }
        free(fo);
    }
    if (nr < rows && !row.note[0])
        snprintf(row.note, sizeof row.note, "checked %d sampled rows", nr);
    double kbytes = (form == AT_BF16 ? 2.0 : 4.0) * (double)nkv;
    bench_row(ck, &row, at_call, &a, kbytes + 8.0 * nq, 4.0 * heads * (double)dim * total, BOUND_FP32);
    duet_cuda_set_attn_tc(ck->c, 1);
    duet_cuda_set_invariant(ck->c, 0);
    print_row(ck, &row);
    free(off); free(nk); free(q); free(keys); free(keys16); free(sinks); free(out); free(ref); free(go); free(ro);
    duet_cuda_free(ck->c, a.dq); duet_cuda_free(ck->c, a.dkeys); duet_cuda_free(ck->c, a.dsinks);
    duet_cuda_free(ck->c, a.dout); duet_cuda_free(ck->c, a.dkeys16); duet_cuda_free(ck->c, a.doff);
    duet_cuda_free(ck->c, a.dn);
}

static void group_attn(ck_t *ck)
{
    case_attn(ck, 32, 64, 512, 640, 8, 0, AT_TC, 0);   /* decode batch 32: window 128 + top-512 */
    case_attn(ck, 32, 64, 512, 640, 8, 0, AT_BF16, 0); /* the same, bf16 keys (what the engine passes) */
    case_attn(ck, 32, 64, 512, 640, 8, 0, AT_FP32, 0); /* the same on the fp32 units */
    case_attn(ck, 1, 64, 512, 640, 1, 0, AT_BF16, 0);
    case_attn(ck, 128, 64, 512, 640, 4, 0, AT_BF16, 0);
    case_attn(ck, 8, 64, 512, 4224, 2, 0, AT_BF16, 0); /* C128 layer at 512k: window + 4096 entries */
    case_attn(ck, 8, 64, 512, 4224, 2, 0, AT_TC, 0);
    case_attn(ck, 6, 64, 512, 300, 6, 1, AT_TC, 1);    /* invariant: 256-key splits, some without keys */
    case_attn(ck, 6, 64, 512, 300, 6, 1, AT_BF16, 1);
    case_attn(ck, 5, 24, 256, 300, 5, 0, AT_BF16, 0);  /* a head tile half full */
    case_attn(ck, 4, 4, 128, 40, 4, 1, AT_TC, 0);      /* tiny fixture widths, a row without keys */
    case_attn(ck, 4, 4, 128, 40, 4, 1, AT_BF16, 1);
    case_attn(ck, 4, 4, 128, 40, 4, 1, AT_FP32, 1);
    case_attn(ck, 3, 12, 36, 300, 3, 0, AT_TC, 0);     /* no tensor-core form: the fp32 units */
}

/* ---- hyper-connections ---- */

typedef struct {
    float *dx, *dfn, *dbase, *dscale, *dpost, *dcomb, *dout, *df, *dnw, *dy;
    int n, hc, dim, iters;
    float scale_head;
    int comb_logits; /* hc_pre_norm / hc_post_pre_norm leave comb's logits, then duet_cuda_hc_sinkhorn */
} hc_arg_t;

static duet_status_t hcpre_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    return duet_cuda_hc_pre(ck->c, a->dx, a->n, a->hc, a->dim, a->dfn, a->dbase, a->dscale, a->iters, 1e-6f, 1e-6f,
                            a->dpost, a->dcomb, a->dout);
}

static duet_status_t hchead_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    return duet_cuda_hc_head(ck->c, a->dx, a->n, a->hc, a->dim, a->dfn, a->dbase, a->scale_head, 1e-6f, 1e-6f,
                             a->dout);
}

static duet_status_t hcprenorm_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    duet_status_t st = duet_cuda_hc_pre_norm(ck->c, a->dx, a->n, a->hc, a->dim, a->dfn, a->dbase, a->dscale, a->iters,
                                             1e-6f, 1e-6f, a->dpost, a->dcomb, a->dnw, 1e-6f, a->dy, a->comb_logits);
    if (st == DUET_OK && a->comb_logits)
        st = duet_cuda_hc_sinkhorn(ck->c, a->n, a->hc, a->iters, 1e-6f, a->dcomb);
    return st;
}

/* the pre-mix with comb's logits left, without the iterations (its own time) */
static duet_status_t hcprenorm_logits_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    return duet_cuda_hc_pre_norm(ck->c, a->dx, a->n, a->hc, a->dim, a->dfn, a->dbase, a->dscale, a->iters, 1e-6f,
                                 1e-6f, a->dpost, a->dcomb, a->dnw, 1e-6f, a->dy, 1);
}

/* the iterations alone, over the logits that hcprenorm_logits_call left in a scratch copy */
static duet_status_t hcsinkhorn_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    return duet_cuda_hc_sinkhorn(ck->c, a->n, a->hc, a->iters, 1e-6f, a->dout);
}

static duet_status_t hcheadnorm_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    return duet_cuda_hc_head_norm(ck->c, a->dx, a->n, a->hc, a->dim, a->dfn, a->dbase, a->scale_head, 1e-6f, 1e-6f,
                                  a->dnw, 1e-6f, a->dy);
}

static duet_status_t hcpost_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    return duet_cuda_hc_post(ck->c, a->dx, a->n, a->hc, a->dim, a->df, a->dpost, a->dcomb);
}

static duet_status_t hcpostprenorm_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    duet_status_t st = duet_cuda_hc_post_pre_norm(ck->c, a->dx, a->n, a->hc, a->dim, a->df, a->dfn, a->dbase,
                                                  a->dscale, a->iters, 1e-6f, 1e-6f, a->dpost, a->dcomb, a->dnw, 1e-6f,
                                                  a->dy, a->comb_logits);
    if (st == DUET_OK && a->comb_logits)
        st = duet_cuda_hc_sinkhorn(ck->c, a->n, a->hc, a->iters, 1e-6f, a->dcomb);
    return st;
}

static duet_status_t hcpostheadnorm_call(ck_t *ck, void *p)
{
    hc_arg_t *a = p;
    return duet_cuda_hc_post_head_norm(ck->c, a->dx, a->n, a->hc, a->dim, a->df, a->dpost, a->dcomb, a->dfn, a->dbase,
                                       a->scale_head, 1e-6f, 1e-6f, a->dnw, 1e-6f, a->dy);
}

/* variant v's y, x, post and comb against variant 0's (the two operations), bit for bit */
static void hc_same_as_two(row_t *row, int v, float *const *hx, float *const *hp, float *const *hcb,
                           float *const *hy, size_t nx, size_t np, size_t nc, size_t ny)
{
    row_bytes(row, hy[v], hy[0], 4 * ny);
    const char *what = memcmp(hx[v], hx[0], 4 * nx) ? "x"
                       : memcmp(hp[v], hp[0], 4 * np) ? "post"
                       : memcmp(hcb[v], hcb[0], 4 * nc) ? "comb"
                                                        : NULL;
    if (row->pass && what) {
        row->pass = 0;
        snprintf(row->note, sizeof row->note, "%s differs from the two operations'", what);
    }
}

/* hc_post followed by hc_pre_norm (head: hc_head_norm) as one operation against the two, in the
 * default and the batch-invariant split: x, post, comb and y bit for bit.  post and comb start
 * as the CPU's (a pre-mix's), f fresh.  !head: the fused operation with comb's logits left and
 * duet_cuda_hc_sinkhorn after it too (where hc allows), the same bits. */
static void case_hc_post_fused(ck_t *ck, const hc_arg_t *a0, const float *x, const float *post, const float *comb,
                               const float *f, int head)
{
    int n = a0->n, hc = a0->hc, dim = a0->dim;
    size_t nx = (size_t)n * hc * dim, np = (size_t)n * hc, nc = (size_t)n * hc * hc, ny = (size_t)n * dim;
    float *hx[3], *hp[3], *hcb[3], *hy[3];
    int nv = !head && duet_cuda_hc_sinkhorn_ok(hc) ? 3 : 2;
    for (int inv = 0; inv < 2; inv++) {
        duet_cuda_set_invariant(ck->c, inv);
        hc_arg_t b[3];
        for (int v = 0; v < nv; v++) { /* 0: the two operations, 1: the fused one, 2: it with the logits left */
            b[v] = *a0;
            b[v].dx = dupload(ck, x, 4 * nx);
            b[v].df = dupload(ck, f, 4 * ny);
            b[v].dpost = dupload(ck, post, 4 * np);
            b[v].dcomb = dupload(ck, comb, 4 * nc);
            b[v].dy = dmalloc(ck, 4 * ny);
            b[v].comb_logits = v == 2;
            dpoison(ck, b[v].dy, 4 * ny);
        }
        CK(hcpost_call(ck, &b[0]));
        CK(head ? hcheadnorm_call(ck, &b[0]) : hcprenorm_call(ck, &b[0]));
        CK(head ? hcpostheadnorm_call(ck, &b[1]) : hcpostprenorm_call(ck, &b[1]));
        if (nv > 2)
            CK(hcpostprenorm_call(ck, &b[2]));
        for (int v = 0; v < nv; v++) {
            hx[v] = xmalloc(4 * nx);
            hp[v] = xmalloc(4 * np);
            hcb[v] = xmalloc(4 * nc);
            hy[v] = xmalloc(4 * ny);
            ddownload(ck, hx[v], b[v].dx, 4 * nx);
            ddownload(ck, hp[v], b[v].dpost, 4 * np);
            ddownload(ck, hcb[v], b[v].dcomb, 4 * nc);
            ddownload(ck, hy[v], b[v].dy, 4 * ny);
        }
        row_t row = row_new(head ? "hc_post_head_norm" : "hc_post_pre_norm", "n=%d hc=%d dim=%d%s", n, hc, dim,
                            inv ? " invariant" : "");
        hc_same_as_two(&row, 1, hx, hp, hcb, hy, nx, np, nc, ny);
        if (!inv) /* each call updates x again: the same work on other values */
            bench_row(ck, &row, head ? hcpostheadnorm_call : hcpostprenorm_call, &b[1],
                      4.0 * (2 * nx + (head ? (size_t)hc * hc * dim : (size_t)(2 + hc) * hc * hc * dim) + 2 * ny),
                      2.0 * (double)(head ? hc : (2 + hc) * hc) * hc * dim * n + 6.0 * nx, BOUND_FP32);
        print_row(ck, &row);
        if (nv > 2) {
            row = row_new("hc_post_pre_norm", "n=%d hc=%d dim=%d%s, comb's logits + hc_sinkhorn", n, hc, dim,
                          inv ? " invariant" : "");
            hc_same_as_two(&row, 2, hx, hp, hcb, hy, nx, np, nc, ny);
            print_row(ck, &row);
        }
        for (int v = 0; v < nv; v++) {
            free(hx[v]); free(hp[v]); free(hcb[v]); free(hy[v]);
            duet_cuda_free(ck->c, b[v].dx); duet_cuda_free(ck->c, b[v].df); duet_cuda_free(ck->c, b[v].dpost);
            duet_cuda_free(ck->c, b[v].dcomb); duet_cuda_free(ck->c, b[v].dy);
        }
    }
    duet_cuda_set_invariant(ck->c, 0);
}

static void case_hc(ck_t *ck, int n, int hc, int dim, int iters)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "hc/%d/%d/%d/%d", n, hc, dim, iters);
    rng_init(&r, ck->seed, tag);
    int mix = (2 + hc) * hc;
    size_t nx = (size_t)n * hc * dim, nfn = (size_t)mix * hc * dim;
    float *x = rand_f32(&r, nx, 1.0f), *fn = rand_f32(&r, nfn, 0.02f), *base = rand_f32(&r, mix, 0.5f);
    float scale[3] = {0.8f, 1.1f, 0.9f};
    float *post = xmalloc(4 * (size_t)n * hc), *comb = xmalloc(4 * (size_t)n * hc * hc);
    float *col = xmalloc(4 * (size_t)n * dim);
    float *gpost = xmalloc(4 * (size_t)n * hc), *gcomb = xmalloc(4 * (size_t)n * hc * hc);
    float *gcol = xmalloc(4 * (size_t)n * dim);
    hc_arg_t a;
    memset(&a, 0, sizeof a);
    a.dx = dupload(ck, x, 4 * nx);
    a.dfn = dupload(ck, fn, 4 * nfn);
    a.dbase = dupload(ck, base, 4 * (size_t)mix);
    a.dscale = dupload(ck, scale, sizeof scale);
    a.dpost = dmalloc(ck, 4 * (size_t)n * hc);
    a.dcomb = dmalloc(ck, 4 * (size_t)n * hc * hc);
    a.dout = dmalloc(ck, 4 * (size_t)n * dim);
    a.n = n;
    a.hc = hc;
    a.dim = dim;
    a.iters = iters;
    a.scale_head = 0.7f;
    /* hc_pre */
    dpoison(ck, a.dpost, 4 * (size_t)n * hc);
    dpoison(ck, a.dcomb, 4 * (size_t)n * hc * hc);
    dpoison(ck, a.dout, 4 * (size_t)n * dim);
    CK(hcpre_call(ck, &a));
    ddownload(ck, gpost, a.dpost, 4 * (size_t)n * hc);
    ddownload(ck, gcomb, a.dcomb, 4 * (size_t)n * hc * hc);
    ddownload(ck, gcol, a.dout, 4 * (size_t)n * dim);
    duet_cpu_hc_pre(x, n, hc, dim, fn, base, scale, iters, 1e-6f, 1e-6f, post, comb, col);
    row_t row = row_new("hc_pre", "n=%d hc=%d dim=%d iters=%d", n, hc, dim, iters);
    size_t w;
    double ep = nerr(gpost, post, (size_t)n * hc, &w), ec = nerr(gcomb, comb, (size_t)n * hc * hc, &w);
    row_float(&row, gcol, col, (size_t)n * dim, 1e-5);
    if (ep > row.err)
        row.err = ep;
    if (ec > row.err)
        row.err = ec;
    row.pass = row.err <= row.tol;
    snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "%spost %.1e comb %.1e",
             row.note[0] ? "; " : "", ep, ec);
    bench_row(ck, &row, hcpre_call, &a, 4.0 * (nx + nfn + (size_t)n * (dim + hc + hc * hc)),
              2.0 * (double)mix * hc * dim * n + 2.0 * nx, BOUND_FP32);
    print_row(ck, &row);
    /* hc_pre_norm: hc_pre then rmsnorm in one operation, bit-exact against the two launches */
    if (duet_cuda_hc_norm_ok(hc, dim)) {
        float *nw = rand_f32(&r, (size_t)dim, 1.0f);
        a.dnw = dupload(ck, nw, 4 * (size_t)dim);
        a.dy = dmalloc(ck, 4 * (size_t)n * dim);
        float *y2 = xmalloc(4 * (size_t)n * dim), *y1 = xmalloc(4 * (size_t)n * dim);
        float *p2 = xmalloc(4 * (size_t)n * hc), *c2 = xmalloc(4 * (size_t)n * hc * hc);
        /* the two launches: hc_pre's collapsed (a.dout) normalized into a.dy */
        CK(duet_cuda_rmsnorm(ck->c, a.dout, a.dnw, n, dim, 1e-6f, a.dy));
        ddownload(ck, y1, a.dy, 4 * (size_t)n * dim);
        dpoison(ck, a.dpost, 4 * (size_t)n * hc);
        dpoison(ck, a.dcomb, 4 * (size_t)n * hc * hc);
        dpoison(ck, a.dy, 4 * (size_t)n * dim);
        CK(hcprenorm_call(ck, &a));
        ddownload(ck, y2, a.dy, 4 * (size_t)n * dim);
        ddownload(ck, p2, a.dpost, 4 * (size_t)n * hc);
        ddownload(ck, c2, a.dcomb, 4 * (size_t)n * hc * hc);
        row = row_new("hc_pre_norm", "n=%d hc=%d dim=%d iters=%d", n, hc, dim, iters);
        row_bytes(&row, y2, y1, 4 * (size_t)n * dim);
        if (row.pass && (memcmp(p2, gpost, 4 * (size_t)n * hc) || memcmp(c2, gcomb, 4 * (size_t)n * hc * hc))) {
            row.pass = 0;
            snprintf(row.note, sizeof row.note, "post or comb differ from hc_pre's");
        }
        bench_row(ck, &row, hcprenorm_call, &a, 4.0 * (nx + nfn + (size_t)n * (2 * dim + hc + hc * hc)),
                  2.0 * (double)mix * hc * dim * n + 4.0 * nx, BOUND_FP32);
        print_row(ck, &row);
        /* comb's logits left, then duet_cuda_hc_sinkhorn: post, comb and y the same bits; timed
         * apart, the pre-mix without the iterations and the iterations alone */
        if (duet_cuda_hc_sinkhorn_ok(hc)) {
            size_t nc = (size_t)n * hc * hc;
            float *y3 = xmalloc(4 * (size_t)n * dim), *p3 = xmalloc(4 * (size_t)n * hc), *c3 = xmalloc(4 * nc);
            dpoison(ck, a.dpost, 4 * (size_t)n * hc);
            dpoison(ck, a.dcomb, 4 * nc);
            dpoison(ck, a.dy, 4 * (size_t)n * dim);
            a.comb_logits = 1;
            CK(hcprenorm_call(ck, &a));
            a.comb_logits = 0;
            ddownload(ck, y3, a.dy, 4 * (size_t)n * dim);
            ddownload(ck, p3, a.dpost, 4 * (size_t)n * hc);
            ddownload(ck, c3, a.dcomb, 4 * nc);
            row = row_new("hc_pre_norm", "n=%d hc=%d dim=%d iters=%d, comb's logits + hc_sinkhorn", n, hc, dim, iters);
            row_bytes(&row, y3, y2, 4 * (size_t)n * dim);
            if (row.pass && (memcmp(p3, p2, 4 * (size_t)n * hc) || memcmp(c3, c2, 4 * nc))) {
                row.pass = 0;
                snprintf(row.note, sizeof row.note, "post or comb differ from hc_pre_norm's");
            }
            bench_row(ck, &row, hcprenorm_logits_call, &a, 4.0 * (nx + nfn + (size_t)n * (2 * dim + hc + hc * hc)),
                      2.0 * (double)mix * hc * dim * n + 4.0 * nx, BOUND_FP32);
            print_row(ck, &row);
            /* the iterations alone, on the logits in a.dout (free here: hc_pre's output is checked) */
            CK(hcprenorm_logits_call(ck, &a));
            ddownload(ck, c3, a.dcomb, 4 * nc);
            CK(duet_cuda_upload(ck->c, a.dout, c3, 4 * nc));
            CK(hcsinkhorn_call(ck, &a));
            ddownload(ck, c3, a.dout, 4 * nc);
            row = row_new("hc_sinkhorn", "n=%d hc=%d iters=%d", n, hc, iters);
            row_bytes(&row, c3, c2, 4 * nc);
            bench_row(ck, &row, hcsinkhorn_call, &a, 8.0 * nc, 4.0 * (double)(iters + 1) * nc, BOUND_FP32);
            print_row(ck, &row);
            free(y3); free(p3); free(c3);
        }
        /* batch invariance (the engine's mode): the last row alone gives the bits it gets among the n
         * (at 64 rows and more the partial sums take eight rows a block, alone four) */
        if (n > 1) {
            duet_cuda_set_invariant(ck->c, 1);
            size_t last = (size_t)(n - 1);
            float *ya = xmalloc(4 * (size_t)dim), *pa = xmalloc(4 * (size_t)hc), *ca = xmalloc(4 * (size_t)hc * hc);
            CK(hcprenorm_call(ck, &a));
            ddownload(ck, y2, a.dy, 4 * (size_t)n * dim);
            ddownload(ck, p2, a.dpost, 4 * (size_t)n * hc);
            ddownload(ck, c2, a.dcomb, 4 * (size_t)n * hc * hc);
            hc_arg_t one = a;
            one.dx = a.dx + last * hc * dim;
            one.n = 1;
            dpoison(ck, a.dy, 4 * (size_t)dim);
            CK(hcprenorm_call(ck, &one));
            ddownload(ck, ya, a.dy, 4 * (size_t)dim);
            ddownload(ck, pa, a.dpost, 4 * (size_t)hc);
            ddownload(ck, ca, a.dcomb, 4 * (size_t)hc * hc);
            row = row_new("hc_pre_norm", "invariant: row %d of %d alone, hc=%d dim=%d", n - 1, n, hc, dim);
            row_bytes(&row, ya, y2 + last * dim, 4 * (size_t)dim);
            if (row.pass &&
                (memcmp(pa, p2 + last * hc, 4 * (size_t)hc) || memcmp(ca, c2 + last * hc * hc, 4 * (size_t)hc * hc))) {
                row.pass = 0;
                snprintf(row.note, sizeof row.note, "post or comb differ alone");
            }
            print_row(ck, &row);
            duet_cuda_set_invariant(ck->c, 0);
            free(ya);
            free(pa);
            free(ca);
        }
        /* hc_head_norm the same way */
        CK(hchead_call(ck, &a));
        CK(duet_cuda_rmsnorm(ck->c, a.dout, a.dnw, n, dim, 1e-6f, a.dy));
        ddownload(ck, y1, a.dy, 4 * (size_t)n * dim);
        dpoison(ck, a.dy, 4 * (size_t)n * dim);
        CK(hcheadnorm_call(ck, &a));
        ddownload(ck, y2, a.dy, 4 * (size_t)n * dim);
        row = row_new("hc_head_norm", "n=%d hc=%d dim=%d", n, hc, dim);
        row_bytes(&row, y2, y1, 4 * (size_t)n * dim);
        bench_row(ck, &row, hcheadnorm_call, &a, 4.0 * (nx + (size_t)hc * hc * dim + 2 * (size_t)n * dim),
                  2.0 * (double)hc * hc * dim * n + 4.0 * nx, BOUND_FP32);
        print_row(ck, &row);
        /* hc_post and the next pre-mix as one operation */
        float *fp = rand_f32(&r, (size_t)n * dim, 1.0f);
        case_hc_post_fused(ck, &a, x, post, comb, fp, 0);
        case_hc_post_fused(ck, &a, x, post, comb, fp, 1);
        free(fp);
        free(nw); free(y1); free(y2); free(p2); free(c2);
        duet_cuda_free(ck->c, a.dnw); duet_cuda_free(ck->c, a.dy);
    }
    /* hc_post on the CPU's post/comb (so it is checked on its own), in place: bit-exact */
    float *f = rand_f32(&r, (size_t)n * dim, 1.0f), *xg = xmalloc(4 * nx);
    a.df = dupload(ck, f, 4 * (size_t)n * dim);
    CK(duet_cuda_upload(ck->c, a.dpost, post, 4 * (size_t)n * hc));
    CK(duet_cuda_upload(ck->c, a.dcomb, comb, 4 * (size_t)n * hc * hc));
    CK(hcpost_call(ck, &a));
    ddownload(ck, xg, a.dx, 4 * nx);
    float *xc = xmalloc(4 * nx);
    memcpy(xc, x, 4 * nx);
    duet_cpu_hc_post(xc, n, hc, dim, f, post, comb);
    row = row_new("hc_post", "n=%d hc=%d dim=%d", n, hc, dim);
    row_bytes(&row, xg, xc, 4 * nx);
    bench_row(ck, &row, hcpost_call, &a, 4.0 * (2 * nx + (size_t)n * dim), 2.0 * hc * (double)nx, BOUND_FP32);
    print_row(ck, &row);
    /* hc_head */
    CK(duet_cuda_upload(ck->c, a.dx, x, 4 * nx));
    dpoison(ck, a.dout, 4 * (size_t)n * dim);
    CK(hchead_call(ck, &a));
    ddownload(ck, gcol, a.dout, 4 * (size_t)n * dim);
    duet_cpu_hc_head(x, n, hc, dim, fn, base, a.scale_head, 1e-6f, 1e-6f, col);
    row = row_new("hc_head", "n=%d hc=%d dim=%d", n, hc, dim);
    row_float(&row, gcol, col, (size_t)n * dim, 1e-5);
    bench_row(ck, &row, hchead_call, &a, 4.0 * (nx + (size_t)hc * hc * dim + (size_t)n * dim),
              2.0 * (double)hc * hc * dim * n + 2.0 * nx, BOUND_FP32);
    print_row(ck, &row);
    free(x); free(fn); free(base); free(post); free(comb); free(col); free(gpost); free(gcomb); free(gcol);
    free(f); free(xg); free(xc);
    duet_cuda_free(ck->c, a.dx); duet_cuda_free(ck->c, a.dfn); duet_cuda_free(ck->c, a.dbase);
    duet_cuda_free(ck->c, a.dscale); duet_cuda_free(ck->c, a.dpost); duet_cuda_free(ck->c, a.dcomb);
    duet_cuda_free(ck->c, a.dout); duet_cuda_free(ck->c, a.df);
}

static void group_hc(ck_t *ck)
{
    case_hc(ck, 32, 4, 4096, 20);
    case_hc(ck, 128, 4, 4096, 20);
    case_hc(ck, 1, 4, 4096, 20);
    case_hc(ck, 512, 4, 4096, 20);
    case_hc(ck, 3, 3, 100, 5);
}

/* ---- greedy sampling ---- */

typedef struct {
    float *dl;
    int32_t *dout;
    int rows, vocab;
} am_arg_t;

static duet_status_t am_call(ck_t *ck, void *p)
{
    am_arg_t *a = p;
    return duet_cuda_argmax(ck->c, a->dl, a->rows, a->vocab, a->dout);
}

static void case_argmax(ck_t *ck, const char *what, int rows, int vocab, int mode)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "am/%s/%d/%d", what, rows, vocab);
    rng_init(&r, ck->seed, tag);
    size_t nl = (size_t)rows * vocab;
    float *l = rand_f32(&r, nl, 3.0f);
    if (mode == 1) /* ties: few distinct values, the maximum repeated */
        for (size_t i = 0; i < nl; i++)
            l[i] = (float)(int)(l[i]);
    if (mode == 2) /* NaN sprinkled, row 1 starts with NaN, row 2 all -inf but a -0/+0 tie, row 3 all NaN */
        for (int b = 0; b < rows; b++)
            for (int i = 0; i < vocab; i++) {
                float *v = &l[(size_t)b * vocab + i];
                if (rng_u64(&r) % 7 == 0)
                    *v = NAN;
                if (b == 1 && i == 0)
                    *v = NAN;
                if (b == 2)
                    *v = i == 10 ? -0.0f : i == 11 ? 0.0f : -INFINITY;
                if (b == 3)
                    *v = NAN;
            }
    am_arg_t a = {dupload(ck, l, 4 * nl), dmalloc(ck, 4 * (size_t)rows), rows, vocab};
    dpoison(ck, a.dout, 4 * (size_t)rows);
    CK(am_call(ck, &a));
    int32_t *g = xmalloc(4 * (size_t)rows), *c = xmalloc(4 * (size_t)rows);
    ddownload(ck, g, a.dout, 4 * (size_t)rows);
    duet_sampling_t s;
    duet_sampling_default(&s);
    for (int b = 0; b < rows; b++)
        c[b] = duet_sample(l + (size_t)b * vocab, vocab, &s, 0);
    row_t row = row_new("argmax", "rows=%d vocab=%d %s", rows, vocab, what);
    row_i32(&row, g, c, (size_t)rows);
    bench_row(ck, &row, am_call, &a, 4.0 * nl, 0.0, BOUND_MEM);
    print_row(ck, &row);
    free(l); free(g); free(c);
    duet_cuda_free(ck->c, a.dl); duet_cuda_free(ck->c, a.dout);
}

static void group_argmax(ck_t *ck)
{
    case_argmax(ck, "normal", 32, 129280, 0);
    case_argmax(ck, "ties", 32, 129280, 1);
    case_argmax(ck, "nan/-0", 8, 129280, 2);
    case_argmax(ck, "batch128", 128, 129280, 0);
    case_argmax(ck, "small", 3, 7, 0);
}

/* ---- sampled rows ---- */

typedef struct {
    float *dl;
    int32_t *dout;
    duet_cuda_sample_row_t *rows;
    int n, vocab;
} sp_arg_t;

static duet_status_t sp_call(ck_t *ck, void *p)
{
    sp_arg_t *a = p;
    return duet_cuda_sample(ck->c, a->dl, a->vocab, a->rows, a->n, a->dout);
}

/* rows of logits (mode: 0 normal sd 3, 1 flat sd 0.3, 2 ties (integers), 3 one value almost
 * everywhere (the draw deep in one tie), 4 special rows, 5 wide sd 20 (few candidates)), each
 * with its own temperature, top-p, top-k, min-p and draw; the tokens against duet_sample */
static void case_sample(ck_t *ck, const char *what, int rows, int vocab, int mode)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "sample/%s/%d/%d", what, rows, vocab);
    rng_init(&r, ck->seed, tag);
    size_t nl = (size_t)rows * vocab;
    float *l = rand_f32(&r, nl, mode == 1 ? 0.3f : mode == 5 ? 20.0f : 3.0f);
    for (int b = 0; b < rows; b++)
        for (int i = 0; i < vocab; i++) {
            float *v = &l[(size_t)b * vocab + i];
            if (mode == 2)
                *v = (float)(int)*v;
            if (mode == 3 && rng_u64(&r) % 1000 != 0)
                *v = 1.5f;
            if (mode == 4) {
                if (rng_u64(&r) % 11 == 0)
                    *v = rng_u64(&r) % 2 ? NAN : -INFINITY;
                if (b == 1 && i == vocab / 3)
                    *v = INFINITY;
                if (b == 2)
                    *v = i == 10 ? -0.0f : i == 11 ? 0.0f : -INFINITY;
                if (b == 3)
                    *v = NAN;
                if (b == 4 && i % 5 == 0)
                    *v = 3e38f; /* scaled by 1 / 0.01: the maximum overflows, no candidate */
                if (b == 5 && i != vocab / 2)
                    *v = -INFINITY;
            }
        }
    static const float temps[] = {0.0f, 0.5f, 0.8f, 1.0f, 1.3f, 2.0f};
    static const float tps[] = {1.0f, 1.0f, 0.95f, 0.7f, 0.3f, 1e-12f};
    static const int tks[] = {0, 0, 1, 20, 200, 5000};
    static const float mps[] = {0.0f, 0.0f, 0.02f, 0.3f};
    duet_cuda_sample_row_t *sr = xmalloc(sizeof *sr * (size_t)rows);
    duet_sampling_t *sp = xmalloc(sizeof *sp * (size_t)rows);
    int64_t *poss = xmalloc(sizeof *poss * (size_t)rows);
    for (int b = 0; b < rows; b++) {
        duet_sampling_t *s = &sp[b];
        duet_sampling_default(s);
        s->temperature = temps[rng_u64(&r) % 6];
        if (mode == 4)
            s->temperature = b == 4 ? 0.01f : 1.0f;
        if (s->temperature > 0.0f && b % 4 != 0) { /* every fourth sampled row without filters */
            s->top_p = tps[rng_u64(&r) % 6];
            s->top_k = tks[rng_u64(&r) % 6];
            s->min_p = mps[rng_u64(&r) % 4];
        }
        s->seed = rng_u64(&r);
        int64_t pos = (int64_t)(rng_u64(&r) % 100000);
        sr[b] = (duet_cuda_sample_row_t){.row = b,
                                         .temperature = s->temperature,
                                         .top_p = s->top_p,
                                         .min_p = s->min_p,
                                         .top_k = s->top_k,
                                         .out = b,
                                         .u = duet_sample_draw53(s->seed, pos)};
        poss[b] = pos;
    }
    sp_arg_t a = {dupload(ck, l, 4 * nl), dmalloc(ck, 4 * (size_t)rows), sr, rows, vocab};
    dpoison(ck, a.dout, 4 * (size_t)rows);
    CK(sp_call(ck, &a));
    int32_t *g = xmalloc(4 * (size_t)rows), *c = xmalloc(4 * (size_t)rows);
    ddownload(ck, g, a.dout, 4 * (size_t)rows);
    for (int b = 0; b < rows; b++)
        c[b] = duet_sample(l + (size_t)b * vocab, vocab, &sp[b], poss[b]);
    row_t row = row_new("sample", "rows=%d vocab=%d %s", rows, vocab, what);
    row_i32(&row, g, c, (size_t)rows);
    bench_row(ck, &row, sp_call, &a, 4.0 * nl, 0.0, BOUND_MEM);
    print_row(ck, &row);
    free(l);
    free(g);
    free(c);
    free(sr);
    free(sp);
    free(poss);
    duet_cuda_free(ck->c, a.dl);
    duet_cuda_free(ck->c, a.dout);
}

static void group_sample(ck_t *ck)
{
    case_sample(ck, "normal", 64, 129280, 0);
    case_sample(ck, "flat", 64, 129280, 1);
    case_sample(ck, "ties", 64, 129280, 2);
    case_sample(ck, "one-value", 16, 129280, 3);
    case_sample(ck, "special", 8, 129280, 4);
    case_sample(ck, "wide", 64, 129280, 5);
    case_sample(ck, "batch1", 1, 129280, 0);
    case_sample(ck, "batch128", 128, 129280, 0); /* a block a row (rows beyond the clusters of two) */
    case_sample(ck, "small", 32, 1000, 0);
    case_sample(ck, "tiny", 16, 7, 2);
}

/* ---- page copies ---- */

typedef struct {
    uint8_t *dst, *src;
    uint32_t *ids_h, *ids2_h, *ids_d;
    uint32_t n;
    uint64_t page_bytes;
    int mode; /* 0 gather (host ids), 1 scatter, 2 pool->pool, 3 gather with device ids, 4 memcpy per page */
} pc_arg_t;

static duet_status_t pc_call(ck_t *ck, void *p)
{
    pc_arg_t *a = p;
    switch (a->mode) {
    case 0: return duet_cuda_pages_gather(ck->c, a->dst, a->src, a->ids_h, a->n, a->page_bytes);
    case 1: return duet_cuda_pages_scatter(ck->c, a->dst, a->ids_h, a->src, a->n, a->page_bytes);
    case 2: return duet_cuda_pages_copy(ck->c, a->dst, a->ids2_h, a->src, a->ids_h, a->n, a->page_bytes);
    case 3: return duet_cuda_pages_copy_dev(ck->c, a->dst, NULL, a->src, a->ids_d, a->n, a->page_bytes);
    default:
        for (uint32_t j = 0; j < a->n; j++) {
            duet_status_t st = duet_cuda_memcpy(ck->c, a->dst + (size_t)j * a->page_bytes,
                                                a->src + (size_t)a->ids_h[j] * a->page_bytes, a->page_bytes);
            if (st != DUET_OK)
                return st;
        }
        return DUET_OK;
    }
}

static void case_pages(ck_t *ck, const char *what, uint64_t page_bytes, uint32_t pool_pages, uint32_t n, int mode,
                       int host_staging)
{
    rng_t r;
    char tag[80];
    snprintf(tag, sizeof tag, "pages/%s/%llu/%u/%u/%d", what, (unsigned long long)page_bytes, pool_pages, n, mode);
    rng_init(&r, ck->seed, tag);
    size_t pool_bytes = (size_t)pool_pages * page_bytes, stage_bytes = (size_t)n * page_bytes;
    uint32_t *perm = xmalloc(4 * (size_t)pool_pages), *perm2 = xmalloc(4 * (size_t)pool_pages);
    for (uint32_t i = 0; i < pool_pages; i++)
        perm[i] = perm2[i] = i;
    for (uint32_t i = pool_pages - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rng_u64(&r) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        j = (uint32_t)(rng_u64(&r) % (i + 1));
        t = perm2[i];
        perm2[i] = perm2[j];
        perm2[j] = t;
    }
    uint8_t *pool = rand_bytes(&r, pool_bytes), *pool2 = rand_bytes(&r, pool_bytes);
    uint8_t *stage = rand_bytes(&r, stage_bytes);
    pc_arg_t a;
    memset(&a, 0, sizeof a);
    a.ids_h = perm;
    a.ids2_h = perm2;
    a.n = n;
    a.page_bytes = page_bytes;
    a.mode = mode;
    uint8_t *dpool = dupload(ck, pool, pool_bytes), *dpool2 = NULL, *dstage = NULL, *hstage = NULL;
    if (host_staging) {
        CK(duet_cuda_host_alloc(ck->c, (void **)&hstage, stage_bytes));
        memcpy(hstage, stage, stage_bytes);
        dstage = hstage;
    } else {
        dstage = dupload(ck, stage, stage_bytes);
    }
    size_t out_bytes;
    uint8_t *expect, *got;
    if (mode == 0 || mode == 3 || mode == 4) { /* gather: staging[j] = pool[perm[j]] */
        a.dst = dstage;
        a.src = dpool;
        a.ids_d = dupload(ck, perm, 4 * (size_t)n);
        expect = stage;
        for (uint32_t j = 0; j < n; j++)
            memcpy(expect + (size_t)j * page_bytes, pool + (size_t)perm[j] * page_bytes, page_bytes);
        out_bytes = stage_bytes;
    } else if (mode == 1) { /* scatter: pool[perm[j]] = staging[j] */
        a.dst = dpool;
        a.src = dstage;
        expect = pool;
        for (uint32_t j = 0; j < n; j++)
            memcpy(expect + (size_t)perm[j] * page_bytes, stage + (size_t)j * page_bytes, page_bytes);
        out_bytes = pool_bytes;
    } else { /* pool -> pool */
        dpool2 = dupload(ck, pool2, pool_bytes);
        a.dst = dpool2;
        a.src = dpool;
        expect = pool2;
        for (uint32_t j = 0; j < n; j++)
            memcpy(expect + (size_t)perm2[j] * page_bytes, pool + (size_t)perm[j] * page_bytes, page_bytes);
        out_bytes = pool_bytes;
    }
    CK(pc_call(ck, &a));
    got = xmalloc(out_bytes);
    CK(duet_cuda_sync(ck->c));
    if (host_staging && a.dst == hstage)
        memcpy(got, hstage, out_bytes);
    else
        ddownload(ck, got, a.dst, out_bytes);
    static const char *const mn[] = {"gather", "scatter", "pool>pool", "gather-dev", "memcpy/pg"};
    row_t row = row_new("pages", "%s %s %ux%llu%s", mn[mode], what, n, (unsigned long long)page_bytes,
                        host_staging ? " >host" : "");
    row_bytes(&row, got, expect, out_bytes);
    bench_row(ck, &row, pc_call, &a, host_staging ? (double)stage_bytes : 2.0 * stage_bytes, 0.0, BOUND_MEM);
    if (host_staging && ck->bench && row.us > 0) {
        double gbps = (double)stage_bytes / (row.us * 1e3);
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note),
                 "%sone-way %.1f GB/s = %.0f%% of pinned D2H copy", row.note[0] ? "; " : "", gbps,
                 ck->ceil.d2h_gbps > 0 ? 100.0 * gbps / ck->ceil.d2h_gbps : 0.0);
        row.bytes = 0; /* not comparable with the device copy ceiling */
    }
    print_row(ck, &row);
    free(perm); free(perm2); free(pool); free(pool2); free(stage); free(got);
    duet_cuda_free(ck->c, dpool); duet_cuda_free(ck->c, dpool2); duet_cuda_free(ck->c, a.ids_d);
    if (host_staging)
        duet_cuda_host_free(ck->c, hstage);
    else
        duet_cuda_free(ck->c, dstage);
}

typedef struct {
    duet_cuda_page_part_t *parts;
    int n_parts;
    uint32_t *ids;
    uint32_t n_ids;
} pp_arg_t;

static duet_status_t pp_call(ck_t *ck, void *p)
{
    pp_arg_t *a = p;
    return duet_cuda_pages_copy_parts(ck->c, a->parts, a->n_parts, a->ids, a->n_ids);
}

/* Several pools copied at the same units in one call (the workers' staging): pools of the given
 * page sizes, `n` random units of each, every destination byte against the CPU's copy (units not
 * listed keep their poison). */
static void case_pages_parts(ck_t *ck, const char *what, int n_parts, const uint64_t *page_bytes, uint32_t units,
                             uint32_t n)
{
    rng_t r;
    char tag[80];
    snprintf(tag, sizeof tag, "pages-parts/%s/%d/%u/%u", what, n_parts, units, n);
    rng_init(&r, ck->seed, tag);
    duet_cuda_page_part_t parts[8];
    uint8_t *src_h[8], *dst_h[8], *want[8];
    uint32_t *ids = xmalloc(sizeof(uint32_t) * (size_t)n * (size_t)n_parts), *perm = xmalloc(sizeof(uint32_t) * units);
    double bytes = 0.0;
    for (int p = 0; p < n_parts; p++) {
        size_t pool = (size_t)units * page_bytes[p];
        src_h[p] = rand_bytes(&r, pool);
        want[p] = xmalloc(pool);
        memset(want[p], 0xff, pool);
        for (uint32_t i = 0; i < units; i++)
            perm[i] = i;
        for (uint32_t i = 0; i < n; i++) { /* n distinct units, in random order */
            uint32_t j = i + (uint32_t)(rng_u64(&r) % (units - i)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
            ids[(size_t)p * n + i] = perm[i];
            memcpy(want[p] + (size_t)perm[i] * page_bytes[p], src_h[p] + (size_t)perm[i] * page_bytes[p],
                   page_bytes[p]);
        }
        parts[p] = (duet_cuda_page_part_t){.dst = dmalloc(ck, pool),
                                           .src = dupload(ck, src_h[p], pool),
                                           .at = (uint32_t)p * n,
                                           .n = n,
                                           .page_bytes = page_bytes[p]};
        dpoison(ck, parts[p].dst, pool);
        bytes += 2.0 * (double)n * (double)page_bytes[p];
    }
    pp_arg_t a = {parts, n_parts, ids, n * (uint32_t)n_parts};
    CK(pp_call(ck, &a));
    row_t row = row_new("pages_parts", "%s x%d units=%u n=%u", what, n_parts, units, n);
    size_t diff = 0, first = (size_t)-1;
    int fp = -1;
    for (int p = 0; p < n_parts; p++) {
        size_t pool = (size_t)units * page_bytes[p];
        dst_h[p] = xmalloc(pool);
        ddownload(ck, dst_h[p], parts[p].dst, pool);
        for (size_t i = 0; i < pool; i++)
            if (dst_h[p][i] != want[p][i]) {
                if (fp < 0) {
                    fp = p;
                    first = i;
                }
                diff++;
            }
    }
    row.exact = 1;
    row.tol = 0;
    row.err = (double)diff;
    row.pass = diff == 0;
    if (diff)
        snprintf(row.note, sizeof row.note, "part %d, first byte %zu differs", fp, first);
    bench_row(ck, &row, pp_call, &a, bytes, 0.0, BOUND_MEM);
    print_row(ck, &row);
    for (int p = 0; p < n_parts; p++) {
        free(src_h[p]);
        free(dst_h[p]);
        free(want[p]);
        duet_cuda_free(ck->c, parts[p].dst);
        duet_cuda_free(ck->c, (void *)parts[p].src);
    }
    free(ids);
    free(perm);
}

static void group_pages(ck_t *ck)
{
    duet_cache_layout_t kv = flash_layout(DUET_POOL_C4_KV, DUET_CACHE_FP8),
                        ik = flash_layout(DUET_POOL_C4_INDEX_K, DUET_CACHE_FP8),
                        swa = flash_layout(DUET_POOL_SWA_KV, DUET_CACHE_FP8);
    case_pages(ck, "c4kv", kv.page_bytes, 8192, 2048, 0, 0);
    case_pages(ck, "c4kv", kv.page_bytes, 8192, 2048, 1, 0);
    case_pages(ck, "c4kv", kv.page_bytes, 8192, 2048, 2, 0);
    case_pages(ck, "c4kv", kv.page_bytes, 8192, 2048, 3, 0);
    case_pages(ck, "c4idx", ik.page_bytes, 8192, 2048, 0, 0);
    case_pages(ck, "swa", swa.page_bytes, 1024, 256, 0, 0);
    case_pages(ck, "64KiB", 65536, 8192, 2048, 0, 0);
    case_pages(ck, "64KiB", 65536, 8192, 2048, 3, 0);
    case_pages(ck, "64KiB", 65536, 8192, 2048, 4, 0);
    case_pages(ck, "64KiB", 65536, 4096, 1024, 0, 1);
    case_pages(ck, "odd", 1000, 300, 77, 2, 0);
    const uint64_t pools[3] = {kv.page_bytes, ik.page_bytes, swa.page_bytes};
    case_pages_parts(ck, "c4kv+c4idx+swa", 3, pools, 1024, 40);
    const uint64_t odd[2] = {1000, 48};
    case_pages_parts(ck, "odd", 2, odd, 300, 77);
}

/* ---- copy_list ---- */

typedef struct {
    const duet_cuda_copy_t *list;
    uint32_t n;
} cl_arg_t;

static duet_status_t cl_call(ck_t *ck, void *p)
{
    cl_arg_t *a = p;
    return duet_cuda_copy_list(ck->c, a->list, a->n);
}

/* n entries of lo..hi bytes, bit for bit against memcpy over the whole
 * destination (bytes between entries must stay as they were).  align: 0 both
 * sides 16-byte aligned, 1 the same random offset mod 16 on both sides (vector
 * path with head and tail bytes), 2 independent random offsets (byte path where
 * they differ).  where: 0 device -> device, 1 device -> pinned host, 2 pinned
 * host -> device (the data plane's staging). */
static void case_copy_list(ck_t *ck, const char *what, uint32_t n, size_t lo, size_t hi, int align, int where)
{
    rng_t r;
    char tag[96];
    snprintf(tag, sizeof tag, "copy_list/%s/%u/%zu/%zu/%d/%d", what, n, lo, hi, align, where);
    rng_init(&r, ck->seed, tag);
    size_t *size = xmalloc(sizeof(size_t) * n), *soff = xmalloc(sizeof(size_t) * n);
    size_t *doff = xmalloc(sizeof(size_t) * n);
    uint32_t *perm = xmalloc(sizeof(uint32_t) * n);
    size_t sbytes = 16, dbytes = 16, total = 0;
    for (uint32_t i = 0; i < n; i++) {
        size[i] = lo + (size_t)(rng_u64(&r) % (hi - lo + 1));
        total += size[i];
        perm[i] = i;
    }
    for (uint32_t i = n; i > 1; i--) { /* sources in another order than destinations */
        uint32_t j = (uint32_t)(rng_u64(&r) % i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = perm[k];
        size_t ms = align == 0 ? 0 : (size_t)(rng_u64(&r) % 16);
        soff[i] = sbytes + ms;
        sbytes += (size[i] + 31) / 16 * 16 + 16 * (size_t)(rng_u64(&r) % 3);
    }
    for (uint32_t i = 0; i < n; i++) {
        size_t ms = soff[i] % 16, md = align == 0 ? 0 : align == 1 ? ms : (size_t)(rng_u64(&r) % 16);
        doff[i] = dbytes + md;
        dbytes += (size[i] + 31) / 16 * 16 + 16 * (size_t)(rng_u64(&r) % 3);
    }
    uint8_t *src = rand_bytes(&r, sbytes), *dst0 = rand_bytes(&r, dbytes);
    uint8_t *dsrc, *ddst, *hbuf = NULL;
    if (where == 2) {
        CK(duet_cuda_host_alloc(ck->c, (void **)&hbuf, sbytes));
        memcpy(hbuf, src, sbytes);
        dsrc = hbuf;
    } else {
        dsrc = dupload(ck, src, sbytes);
    }
    if (where == 1) {
        CK(duet_cuda_host_alloc(ck->c, (void **)&hbuf, dbytes));
        memcpy(hbuf, dst0, dbytes);
        ddst = hbuf;
    } else {
        ddst = dupload(ck, dst0, dbytes);
    }
    duet_cuda_copy_t *list = xmalloc(sizeof *list * (n ? n : 1));
    uint8_t *expect = xmalloc(dbytes), *got = xmalloc(dbytes);
    memcpy(expect, dst0, dbytes);
    for (uint32_t i = 0; i < n; i++) {
        list[i] = (duet_cuda_copy_t){.dst = ddst + doff[i], .src = dsrc + soff[i], .bytes = size[i]};
        memcpy(expect + doff[i], src + soff[i], size[i]);
    }
    cl_arg_t a = {list, n};
    CK(cl_call(ck, &a));
    CK(duet_cuda_sync(ck->c));
    if (where == 1)
        memcpy(got, hbuf, dbytes);
    else
        ddownload(ck, got, ddst, dbytes);
    row_t row = row_new("copy_list", "%s %ux%zu-%zu a%d%s", what, n, lo, hi, align,
                        where == 1 ? " >host" : where == 2 ? " <host" : "");
    row_bytes(&row, got, expect, dbytes);
    if (n)
        bench_row(ck, &row, cl_call, &a, where ? (double)total : 2.0 * total, 0.0, BOUND_MEM);
    if (where && ck->bench && row.us > 0) {
        double gbps = (double)total / (row.us * 1e3), ceil = where == 1 ? ck->ceil.d2h_gbps : ck->ceil.h2d_gbps;
        snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note),
                 "%sone-way %.1f GB/s = %.0f%% of pinned %s copy", row.note[0] ? "; " : "", gbps,
                 ceil > 0 ? 100.0 * gbps / ceil : 0.0, where == 1 ? "D2H" : "H2D");
        row.bytes = 0; /* not comparable with the device copy ceiling */
    }
    print_row(ck, &row);
    if (where != 2)
        duet_cuda_free(ck->c, dsrc);
    if (where != 1)
        duet_cuda_free(ck->c, ddst);
    duet_cuda_host_free(ck->c, hbuf);
    free(size); free(soff); free(doff); free(perm); free(src); free(dst0); free(list); free(expect); free(got);
}

static void group_copy_list(ck_t *ck)
{
    duet_cache_layout_t kv = flash_layout(DUET_POOL_C4_KV, DUET_CACHE_FP8);
    size_t pb = (size_t)kv.page_bytes;
    case_copy_list(ck, "c4kv", 2048, pb, pb, 0, 0);
    case_copy_list(ck, "c4kv", 2048, pb, pb, 0, 1);
    case_copy_list(ck, "c4kv", 2048, pb, pb, 0, 2);
    case_copy_list(ck, "64KiB", 1024, 65536, 65536, 0, 1);
    case_copy_list(ck, "mixed", 1000, 0, 70000, 1, 0);
    case_copy_list(ck, "mixed", 1000, 0, 70000, 2, 2);
    case_copy_list(ck, "odd", 500, 1, 5000, 2, 0);
    case_copy_list(ck, "tiny", 4096, 0, 40, 2, 0);
    case_copy_list(ck, "large", 3, 16u << 20, (16u << 20) + 15, 1, 0);
    case_copy_list(ck, "empty", 0, 0, 0, 0, 0);
}

/* ---- weight reads: the access pattern of the tensor-core matmul (duet_cuda_measure_runs) ----
 * Checked: every 32-bit word of an 8 MiB buffer read once (the wrapping sum against the host's);
 * --bench times the same reads over 1 GiB (beyond L2), runs of 64 bytes 2 KB apart (an fp4
 * weight as stored) up to 2 KB runs (its tiled layout). */

typedef struct {
    const void *buf;
    size_t bytes;
    int run;
    uint32_t sum;
} rd_arg_t;

static duet_status_t rd_call(ck_t *ck, void *p)
{
    rd_arg_t *a = p;
    return duet_cuda_measure_runs(ck->c, a->buf, a->bytes, a->run, 0, NULL, &a->sum);
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} dcopy_arg_t;

static duet_status_t dcopy_call(ck_t *ck, void *p)
{
    dcopy_arg_t *a = p;
    return duet_cuda_memcpy(ck->c, a->dst, a->src, a->bytes);
}

/* One device copy of a launch's size (the bytes a decode step's matmul reads): checked byte for
 * byte, and with --bench its rate against the ceiling's copy of 2 GiB, the share of copy
 * bandwidth that one launch of that many bytes reaches with its start and end in the time */
static void case_copy_size(ck_t *ck, size_t bytes)
{
    rng_t r;
    char tag[48];
    snprintf(tag, sizeof tag, "copy/%zu", bytes);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("reads", "one device copy of %zu MiB (read + written)", bytes >> 20);
    uint8_t *h = rand_bytes(&r, bytes), *back = xmalloc(bytes);
    void *src = dupload(ck, h, bytes), *dst = dmalloc(ck, bytes);
    dpoison(ck, dst, bytes);
    dcopy_arg_t a = {dst, src, bytes};
    CK(dcopy_call(ck, &a));
    ddownload(ck, back, dst, bytes);
    row_bytes(&row, back, h, bytes);
    bench_row(ck, &row, dcopy_call, &a, 2.0 * (double)bytes, 0.0, BOUND_MEM);
    print_row(ck, &row);
    duet_cuda_free(ck->c, src);
    duet_cuda_free(ck->c, dst);
    free(h);
    free(back);
}

static void group_reads(ck_t *ck)
{
    rng_t r;
    rng_init(&r, ck->seed, "reads");
    size_t small = (size_t)8 << 20, big = (size_t)1 << 30;
    uint8_t *h = rand_bytes(&r, small);
    uint32_t want = 0;
    for (size_t i = 0; i < small; i += 4) {
        uint32_t w;
        memcpy(&w, h + i, 4);
        want += w;
    }
    void *d = dupload(ck, h, small), *db = NULL;
    if (ck->bench) {
        db = dmalloc(ck, big);
        CK(duet_cuda_fill_random(ck->c, db, big, DUET_DT_U8, 7));
    }
    static const int runs[] = {16, 64, 128, 256, 2048};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        row_t row = row_new("reads", "runs of %d B, 2 KB a warp a step%s", runs[i], ck->bench ? " (1 GiB timed)" : "");
        rd_arg_t a = {d, small, runs[i], 0};
        CK(rd_call(ck, &a));
        row.exact = 1;
        row.err = a.sum != want;
        row.pass = a.sum == want;
        if (!row.pass)
            snprintf(row.note, sizeof row.note, "sum of the words read 0x%08x, host 0x%08x", a.sum, want);
        a.buf = db;
        a.bytes = big;
        bench_row(ck, &row, rd_call, &a, (double)big, 0.0, BOUND_MEM);
        print_row(ck, &row);
    }
    duet_cuda_free(ck->c, d);
    duet_cuda_free(ck->c, db);
    free(h);
    /* 16 MiB copied moves the bytes of wq_b's or wo_b's read at 32 tokens (32 MiB) */
    static const size_t sizes[] = {(size_t)4 << 20, (size_t)16 << 20, (size_t)64 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        case_copy_size(ck, sizes[i]);
}

/* ---- tensor parallelism's MoE steps: moe_tiles_own, moe_pick (forward_cuda.h) ---- */

/* rows x K expert ids, K distinct a row (as routing gives), uniform over E */
static int32_t *route_distinct(rng_t *r, int rows, int K, int E)
{
    int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)rows * K);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = (int)(rng_u64(r) % (uint64_t)E);
                dup = 0;
                for (int k = 0; k < j; k++)
                    dup |= sel[i * K + k] == e;
            } while (dup);
            sel[i * K + j] = e;
        }
    return sel;
}

static void case_moe_tp(ck_t *ck, int E, int K, int rows, int T, int D)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "moe_tp %d %d %d %d", E, K, rows, T);
    rng_init(&r, ck->seed, tag);
    int n = rows * K;
    int32_t *sel = route_distinct(&r, rows, K, E);
    int32_t *dsel = dupload(ck, sel, sizeof(int32_t) * (size_t)n);
    int32_t *doffs = dmalloc(ck, 4 * (size_t)(E + 1)),
            *dtiles = dmalloc(ck, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    int32_t *dxrow = dmalloc(ck, 4 * (size_t)n), *dpos = dmalloc(ck, 4 * (size_t)n);
    CK(duet_cuda_moe_sort(ck->c, dsel, rows, K, E, doffs, dtiles, dxrow, dpos));
    int32_t *offs = xmalloc(4 * (size_t)(E + 1)), *tiles = xmalloc(4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    int32_t *want = xmalloc(4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1)),
            *got = xmalloc(4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    CK(duet_cuda_sync(ck->c));
    ddownload(ck, offs, doffs, 4 * (size_t)(E + 1));
    ddownload(ck, tiles, dtiles, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
    /* moe_tiles_own for every rank: t'[e] = t[clamp(e, e0, e1)] - t[e0] in every row */
    row_t row = row_new("moe_tp", "tiles_own E%d k%d r%d T%d", E, K, rows, T);
    size_t bad = 0;
    for (int rk = 0; rk < T; rk++) {
        int e0 = (int)((int64_t)E * rk / T), e1 = (int)((int64_t)E * (rk + 1) / T);
        for (int h = 0; h < DUET_CUDA_MOE_TILE_ROWS; h++)
            for (int e = 0; e <= E; e++) {
                int ce = e < e0 ? e0 : e > e1 ? e1 : e;
                want[h * (E + 1) + e] = tiles[h * (E + 1) + ce] - tiles[h * (E + 1) + e0];
            }
        int32_t *dt = dupload(ck, tiles, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
        CK(duet_cuda_moe_tiles_own(ck->c, dt, E, e0, e1));
        CK(duet_cuda_sync(ck->c));
        ddownload(ck, got, dt, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1));
        bad += memcmp(got, want, 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1)) != 0;
        duet_cuda_free(ck->c, dt);
    }
    row_bytes(&row, &bad, &(size_t){0}, sizeof bad);
    print_row(ck, &row);
    /* moe_pick: every sorted position from the rank that holds its expert */
    float *recv = rand_f32(&r, (size_t)T * n * D, 1.0f), *pick = xmalloc(4 * (size_t)n * D);
    float *y0 = rand_f32(&r, (size_t)n * D, 1.0f);
    memcpy(pick, y0, 4 * (size_t)n * D);
    for (int p = 0; p < offs[E]; p++) {
        int e = 0;
        while (e + 1 < E && offs[e + 1] <= p)
            e++;
        int owner = T - 1;
        while (owner > 0 && (int)((int64_t)E * owner / T) > e)
            owner--;
        memcpy(pick + (size_t)p * D, recv + ((size_t)owner * n + p) * D, 4 * (size_t)D);
    }
    float *drecv = dupload(ck, recv, 4 * (size_t)T * n * D), *dy = dupload(ck, y0, 4 * (size_t)n * D);
    CK(duet_cuda_moe_pick(ck->c, dy, drecv, n, D, doffs, E, T));
    CK(duet_cuda_sync(ck->c));
    float *g = xmalloc(4 * (size_t)n * D);
    ddownload(ck, g, dy, 4 * (size_t)n * D);
    row = row_new("moe_tp", "pick E%d k%d r%d T%d D%d", E, K, rows, T, D);
    row_bytes(&row, g, pick, 4 * (size_t)n * D);
    print_row(ck, &row);
    duet_cuda_free(ck->c, dsel);
    duet_cuda_free(ck->c, doffs);
    duet_cuda_free(ck->c, dtiles);
    duet_cuda_free(ck->c, dxrow);
    duet_cuda_free(ck->c, dpos);
    duet_cuda_free(ck->c, drecv);
    duet_cuda_free(ck->c, dy);
    free(sel); free(offs); free(tiles); free(want); free(got); free(recv); free(pick); free(y0); free(g);
}

/* The grouped matmul on one rank's experts (moe_tiles_own) against the launch over all experts:
 * each rank's positions bit for bit, every other position left as it was; at few positions an
 * expert (8-token tiles), at 24 (32-token tiles) and at 192 (64-token tiles on sm_90, fp8 and tiled
 * fp4). */
static void case_moe_own(ck_t *ck, duet_dtype_t dt, int E, int K, int D, int I, int rows, int T, int tile)
{
    rng_t r;
    char tag[96];
    snprintf(tag, sizeof tag, "moe_own/%d/%d/%d/%d/%d/%d/%d", (int)dt, E, K, D, I, rows, T);
    rng_init(&r, ck->seed, tag);
    row_t row = row_new("moe_tp", "grouped own %s E%d k%d %dx%d r%d T%d%s", dt_short(dt, DUET_DT_F8_E8M0), E, K, D, I,
                        rows, T, tile ? " tiled" : "");
    int n = rows * K;
    weight_t *W = xmalloc(sizeof(weight_t) * (size_t)E);
    const void **tab = xmalloc(sizeof(void *) * 2 * (size_t)E);
    for (int e = 0; e < E; e++) {
        weight_make(ck, &r, &W[e], dt, I, D, DUET_DT_F8_E8M0);
        if (tile && duet_cuda_weight_tile_ok(&W[e].dw))
            CK(duet_cuda_weight_tile(ck->c, &W[e].dw));
        tab[e] = W[e].dw.data;
        tab[E + e] = W[e].dw.scale;
    }
    const void **dtab = dupload(ck, tab, sizeof(void *) * 2 * (size_t)E);
    int32_t *sel = route_distinct(&r, rows, K, E);
    float *x = rand_f32(&r, (size_t)rows * D, 1.0f);
    float *dx = dupload(ck, x, sizeof(float) * (size_t)rows * D);
    int32_t *dsel = dupload(ck, sel, sizeof(int32_t) * (size_t)n);
    size_t tb = 4 * DUET_CUDA_MOE_TILE_ROWS * (size_t)(E + 1), yb = sizeof(float) * (size_t)n * I;
    int32_t *doffs = dmalloc(ck, 4 * (size_t)(E + 1)), *dtiles = dmalloc(ck, tb), *dt_own = dmalloc(ck, tb);
    int32_t *dxrow = dmalloc(ck, 4 * (size_t)n), *dpos = dmalloc(ck, 4 * (size_t)n);
    float *dy = dmalloc(ck, yb), *dy_own = dmalloc(ck, yb);
    CK(duet_cuda_moe_sort(ck->c, dsel, rows, K, E, doffs, dtiles, dxrow, dpos));
    duet_cuda_expert_mats_t m1 = {&W[0].dw, dtab, W[0].dw.scale ? dtab + E : NULL};
    duet_cuda_moe_plan_t pl = {.n_experts = E, .n_assign = n, .offs = doffs, .tiles = dtiles, .xrow = dxrow};
    dpoison(ck, dy, yb);
    CK(duet_cuda_matmul_grouped(ck->c, &m1, NULL, &pl, dx, 1, dy, NULL));
    int32_t *offs = xmalloc(4 * (size_t)(E + 1));
    float *y = xmalloc(yb), *y_own = xmalloc(yb), *want = xmalloc(yb);
    ddownload(ck, offs, doffs, 4 * (size_t)(E + 1));
    ddownload(ck, y, dy, yb);
    size_t bad = 0;
    for (int rk = 0; rk < T; rk++) {
        int e0 = (int)((int64_t)E * rk / T), e1 = (int)((int64_t)E * (rk + 1) / T);
        CK(duet_cuda_memcpy(ck->c, dt_own, dtiles, tb));
        CK(duet_cuda_moe_tiles_own(ck->c, dt_own, E, e0, e1));
        duet_cuda_moe_plan_t po = pl;
        po.tiles = dt_own;
        dpoison(ck, dy_own, yb);
        CK(duet_cuda_matmul_grouped(ck->c, &m1, NULL, &po, dx, 1, dy_own, NULL));
        ddownload(ck, y_own, dy_own, yb);
        memset(want, 0xff, yb); /* the poison, outside the rank's positions */
        size_t p0 = (size_t)offs[e0], p1 = (size_t)offs[e1];
        memcpy(want + p0 * I, y + p0 * I, sizeof(float) * (p1 - p0) * I);
        bad += memcmp(y_own, want, yb) != 0;
    }
    row_bytes(&row, &bad, &(size_t){0}, sizeof bad);
    if (bad)
        snprintf(row.note, sizeof row.note, "%zu of %d ranks differ from the launch over all experts", bad, T);
    else
        snprintf(row.note, sizeof row.note, "%.0f positions an expert", (double)n / E);
    print_row(ck, &row);
    for (int e = 0; e < E; e++)
        weight_free(ck, &W[e]);
    free(W); free(tab); free(sel); free(x); free(offs); free(y); free(y_own); free(want);
    void *d[] = {(void *)dtab, dx, dsel, doffs, dtiles, dt_own, dxrow, dpos, dy, dy_own};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        duet_cuda_free(ck->c, d[i]);
}

static void group_moe_tp(ck_t *ck)
{
    case_moe_tp(ck, 16, 4, 1, 2, 128);
    case_moe_tp(ck, 16, 4, 37, 2, 128);
    case_moe_tp(ck, 256, 6, 300, 2, 4096);
    case_moe_tp(ck, 256, 6, 300, 8, 512);
    case_moe_tp(ck, 10, 3, 50, 4, 64); /* experts not divisible by the ranks */
    case_moe_own(ck, DUET_DT_F4_E2M1X2, 32, 6, 512, 256, 16, 3, 1);   /* 3 positions an expert */
    case_moe_own(ck, DUET_DT_F4_E2M1X2, 32, 6, 512, 256, 128, 3, 1);  /* 24 */
    case_moe_own(ck, DUET_DT_F4_E2M1X2, 32, 6, 512, 256, 1024, 3, 1); /* 192 */
    case_moe_own(ck, DUET_DT_F8_E4M3, 32, 6, 512, 256, 1024, 4, 0);
}

/* ---- ceilings ---- */

static void measure_ceilings(ck_t *ck)
{
    ceilings_t *c = &ck->ceil;
    CK(duet_cuda_measure_copy(ck->c, (size_t)2 << 30, 15, &c->copy_gbps));
    CK(duet_cuda_measure_host_copy(ck->c, (size_t)1 << 30, 1, 5, &c->h2d_gbps));
    CK(duet_cuda_measure_host_copy(ck->c, (size_t)1 << 30, 0, 5, &c->d2h_gbps));
    CK(duet_cuda_measure_gemm_bf16(ck->c, 8192, 8192, 8192, 15, &c->bf16_tflops));
    duet_status_t st = duet_cuda_measure_gemm_fp8(ck->c, 8192, 8192, 8192, 15, &c->fp8_tflops);
    if (st == DUET_ERR_UNSUPPORTED)
        c->fp8_tflops = 0.0;
    else if (st != DUET_OK)
        die(ck, "duet_cuda_measure_gemm_fp8");
    CK(duet_cuda_measure_fma(ck->c, 15, &c->fp32_tflops));
}

static void print_ceilings(const ck_t *ck)
{
    const ceilings_t *c = &ck->ceil;
    printf("ceilings: copy %.0f GB/s (2 GiB device copy, read+write) | bf16 GEMM %.0f TFLOP/s (cuBLASLt 8192^3) | "
           "fp8 GEMM %.0f TFLOP/s (cuBLASLt 1x128/128x128 block scales, 8192^3%s) | fp32 FMA %.1f TFLOP/s | "
           "pinned H2D %.1f GB/s, D2H %.1f GB/s\n",
           c->copy_gbps, c->bf16_tflops, c->fp8_tflops, c->fp8_tflops > 0 ? "" : ": unsupported", c->fp32_tflops,
           c->h2d_gbps, c->d2h_gbps);
}

/* ---- CPU-exact mode ---- */

/* duet_cuda_set_exact: each operation whose fast kernels sum in another order, against the CPU
 * table bit for bit, on shapes with ragged widths (columns not a multiple of the lanes, rows
 * not of the blocks) and the tiny fixture's. */
static void exact_matmul(ck_t *ck, duet_dtype_t dt, duet_dtype_t sdt, int rows, int cols, int rb, int re, int n)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "exact-mm/%d/%d/%d/%d/%d/%d", (int)dt, (int)sdt, rows, cols, rb, n);
    rng_init(&r, ck->seed, tag);
    weight_t W;
    weight_make(ck, &r, &W, dt, rows, cols, sdt);
    int m = re - rb;
    float *x = rand_f32(&r, (size_t)n * cols, 1.0f), *y = xmalloc(4 * (size_t)n * m), *ref = xmalloc(4 * (size_t)n * m);
    float *dx = dupload(ck, x, 4 * (size_t)n * cols), *dy = dmalloc(ck, 4 * (size_t)n * m);
    dpoison(ck, dy, 4 * (size_t)n * m);
    CK(duet_cuda_matmul(ck->c, &W.dw, rb, re, dx, n, dy));
    ddownload(ck, y, dy, 4 * (size_t)n * m);
    duet_cpu_matmul(&W.hw, rb, re, x, n, ref);
    row_t row = row_new("exact:matmul", "%s%s %dx%d [%d,%d) n=%d", duet_dtype_name(dt),
                        dt == DUET_DT_F8_E4M3 ? (sdt == DUET_DT_F32 ? "/f32" : "/e8m0") : "", rows, cols, rb, re, n);
    row_f32_bits(&row, y, ref, (size_t)n * m);
    print_row(ck, &row);
    weight_free(ck, &W);
    free(x); free(y); free(ref);
    duet_cuda_free(ck->c, dx); duet_cuda_free(ck->c, dy);
}

static void exact_rmsnorm(ck_t *ck, int n, int dim, int weighted)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "exact-rms/%d/%d/%d", n, dim, weighted);
    rng_init(&r, ck->seed, tag);
    size_t nx = (size_t)n * dim;
    float *x = rand_f32(&r, nx, 2.0f), *w = weighted ? rand_f32(&r, (size_t)dim, 1.0f) : NULL;
    float *y = xmalloc(4 * nx), *ref = xmalloc(4 * nx);
    float *dx = dupload(ck, x, 4 * nx), *dw = w ? dupload(ck, w, 4 * (size_t)dim) : NULL;
    CK(duet_cuda_rmsnorm(ck->c, dx, dw, n, dim, 1e-6f, dx)); /* in place, as the engine calls it */
    ddownload(ck, y, dx, 4 * nx);
    duet_cpu_rmsnorm(x, w, n, dim, 1e-6f, ref);
    row_t row = row_new("exact:rmsnorm", "n=%d dim=%d%s in place", n, dim, weighted ? " w" : "");
    row_f32_bits(&row, y, ref, nx);
    print_row(ck, &row);
    free(x); free(w); free(y); free(ref);
    duet_cuda_free(ck->c, dx); duet_cuda_free(ck->c, dw);
}

/* attention and the indexer: row b's keys at off[b] (key_counts), the last row with none */
static void exact_attn_index(ck_t *ck, int rows, int heads, int dim, int max_keys)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "exact-attn/%d/%d/%d/%d", rows, heads, dim, max_keys);
    rng_init(&r, ck->seed, tag);
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)rows);
    size_t total;
    int32_t *nk = key_counts(rows, max_keys, off, &total);
    nk[rows - 1] = 0;
    size_t nq = (size_t)rows * heads * dim;
    float *q = rand_f32(&r, nq, 0.5f), *keys = rand_f32(&r, total * dim, 1.0f), *sinks = rand_f32(&r, heads, 1.0f);
    float *w = rand_f32(&r, (size_t)rows * heads, 0.125f);
    float *out = xmalloc(4 * nq), *ref = xmalloc(4 * nq);
    float *score = xmalloc(4 * (total ? total : 1)), *sref = xmalloc(4 * (total ? total : 1));
    float *dq = dupload(ck, q, 4 * nq), *dk = dupload(ck, keys, 4 * total * dim), *ds = dupload(ck, sinks, 4 * heads);
    float *dw = dupload(ck, w, 4 * (size_t)rows * heads), *dout = dmalloc(ck, 4 * nq);
    float *dscore = dmalloc(ck, 4 * (total ? total : 1));
    int32_t *doff = dupload(ck, off, 4 * (size_t)rows), *dn = dupload(ck, nk, 4 * (size_t)rows);
    float scale = 1.0f / sqrtf((float)dim);
    dpoison(ck, dout, 4 * nq);
    CK(duet_cuda_attn_rows(ck->c, dq, rows, heads, dim, dk, doff, dn, max_keys, ds, scale, dout));
    ddownload(ck, out, dout, 4 * nq);
    for (int b = 0; b < rows; b++)
        duet_cpu_attn_row(q + (size_t)b * heads * dim, heads, dim, keys + (size_t)off[b] * dim, nk[b], sinks, scale,
                          ref + (size_t)b * heads * dim);
    row_t row = row_new("exact:attn", "rows=%d %dx%d keys<=%d", rows, heads, dim, max_keys);
    row_f32_bits(&row, out, ref, nq);
    print_row(ck, &row);

    dpoison(ck, dscore, 4 * (total ? total : 1));
    CK(duet_cuda_index_score(ck->c, dq, dw, rows, heads, dim, dk, doff, dn, max_keys, scale, dscore));
    ddownload(ck, score, dscore, 4 * total);
    for (int b = 0; b < rows; b++)
        duet_cpu_index_score(q + (size_t)b * heads * dim, w + (size_t)b * heads, heads, dim,
                             keys + (size_t)off[b] * dim, nk[b], scale, sref + off[b]);
    row = row_new("exact:index", "rows=%d %dx%d keys<=%d", rows, heads, dim, max_keys);
    row_f32_bits(&row, score, sref, (size_t)off[rows - 1]); /* the scores written: the last row has none */
    print_row(ck, &row);
    free(off); free(nk); free(q); free(keys); free(sinks); free(w); free(out); free(ref); free(score); free(sref);
    duet_cuda_free(ck->c, dq); duet_cuda_free(ck->c, dk); duet_cuda_free(ck->c, ds); duet_cuda_free(ck->c, dw);
    duet_cuda_free(ck->c, dout); duet_cuda_free(ck->c, dscore); duet_cuda_free(ck->c, doff);
    duet_cuda_free(ck->c, dn);
}

static void exact_hc(ck_t *ck, int n, int hc, int dim)
{
    rng_t r;
    char tag[64];
    snprintf(tag, sizeof tag, "exact-hc/%d/%d/%d", n, hc, dim);
    rng_init(&r, ck->seed, tag);
    int mix = (2 + hc) * hc, flat = hc * dim, iters = 20;
    float hc_eps = 1e-6f, norm_eps = 1e-6f;
    float *x = rand_f32(&r, (size_t)n * flat, 1.0f), *fn = rand_f32(&r, (size_t)mix * flat, 0.05f);
    float *base = rand_f32(&r, (size_t)mix, 0.5f), *scale = rand_f32(&r, 3, 1.0f);
    float *post = xmalloc(4 * (size_t)n * hc), *comb = xmalloc(4 * (size_t)n * hc * hc);
    float *col = xmalloc(4 * (size_t)n * dim), *rpost = xmalloc(4 * (size_t)n * hc);
    float *rcomb = xmalloc(4 * (size_t)n * hc * hc), *rcol = xmalloc(4 * (size_t)n * dim);
    float *dx = dupload(ck, x, 4 * (size_t)n * flat), *dfn = dupload(ck, fn, 4 * (size_t)mix * flat);
    float *dbase = dupload(ck, base, 4 * (size_t)mix), *dscale = dupload(ck, scale, 12);
    float *dpost = dmalloc(ck, 4 * (size_t)n * hc), *dcomb = dmalloc(ck, 4 * (size_t)n * hc * hc);
    float *dcol = dmalloc(ck, 4 * (size_t)n * dim);
    CK(duet_cuda_hc_pre(ck->c, dx, n, hc, dim, dfn, dbase, dscale, iters, hc_eps, norm_eps, dpost, dcomb, dcol));
    ddownload(ck, post, dpost, 4 * (size_t)n * hc);
    ddownload(ck, comb, dcomb, 4 * (size_t)n * hc * hc);
    ddownload(ck, col, dcol, 4 * (size_t)n * dim);
    duet_cpu_hc_pre(x, n, hc, dim, fn, base, scale, iters, hc_eps, norm_eps, rpost, rcomb, rcol);
    row_t row = row_new("exact:hc_pre", "n=%d hc=%d dim=%d", n, hc, dim);
    row_f32_bits(&row, post, rpost, (size_t)n * hc);
    if (row.pass)
        row_f32_bits(&row, comb, rcomb, (size_t)n * hc * hc);
    if (row.pass)
        row_f32_bits(&row, col, rcol, (size_t)n * dim);
    print_row(ck, &row);
    /* the head: hc mixes of fn's first rows, one scale */
    CK(duet_cuda_hc_head(ck->c, dx, n, hc, dim, dfn, dbase, scale[0], hc_eps, norm_eps, dcol));
    ddownload(ck, col, dcol, 4 * (size_t)n * dim);
    duet_cpu_hc_head(x, n, hc, dim, fn, base, scale[0], hc_eps, norm_eps, rcol);
    row = row_new("exact:hc_head", "n=%d hc=%d dim=%d", n, hc, dim);
    row_f32_bits(&row, col, rcol, (size_t)n * dim);
    print_row(ck, &row);
    free(x); free(fn); free(base); free(scale); free(post); free(comb); free(col); free(rpost); free(rcomb);
    free(rcol);
    duet_cuda_free(ck->c, dx); duet_cuda_free(ck->c, dfn); duet_cuda_free(ck->c, dbase);
    duet_cuda_free(ck->c, dscale); duet_cuda_free(ck->c, dpost); duet_cuda_free(ck->c, dcomb);
    duet_cuda_free(ck->c, dcol);
}

static void group_exact(ck_t *ck)
{
    duet_cuda_set_exact(ck->c, 1);
    exact_matmul(ck, DUET_DT_BF16, DUET_DT_F32, 300, 129, 5, 290, 3);
    exact_matmul(ck, DUET_DT_BF16, DUET_DT_F32, 4096, 128, 0, 4096, 2); /* the tiny head's width */
    exact_matmul(ck, DUET_DT_F32, DUET_DT_F32, 64, 100, 0, 64, 2);
    exact_matmul(ck, DUET_DT_F8_E4M3, DUET_DT_F32, 384, 300, 128, 384, 4);
    exact_matmul(ck, DUET_DT_F8_E4M3, DUET_DT_F8_E8M0, 256, 512, 0, 256, 2);
    exact_matmul(ck, DUET_DT_F4_E2M1X2, DUET_DT_F8_E8M0, 128, 256, 0, 128, 3);
    /* more tokens than one pass takes (8), a partial last pass; fp4 groups not a multiple of 8 */
    exact_matmul(ck, DUET_DT_BF16, DUET_DT_F32, 300, 129, 7, 300, 19);
    exact_matmul(ck, DUET_DT_F8_E4M3, DUET_DT_F8_E8M0, 130, 200, 0, 130, 9);
    exact_matmul(ck, DUET_DT_F4_E2M1X2, DUET_DT_F8_E8M0, 64, 96, 0, 64, 11);
    exact_rmsnorm(ck, 5, 128, 1);
    exact_rmsnorm(ck, 33, 500, 0);
    exact_attn_index(ck, 6, 4, 128, 40);
    exact_attn_index(ck, 3, 3, 20, 7);
    exact_hc(ck, 3, 4, 128);
    exact_hc(ck, 2, 3, 40);
    /* the indexer reading the index-K pool (both encodings, the tiny fixture's widths): every
     * comparison of index_score's pool cases bit for bit */
    g_rows_bits = 1;
    case_index_cache(ck, DUET_CACHE_BF16, 5, 4, 100, 64);
    case_index_cache(ck, DUET_CACHE_FP8, 5, 4, 100, 64);
    case_index_cache(ck, DUET_CACHE_FP8, 3, 70, 100, 128);
    g_rows_bits = 0;
    duet_cuda_set_exact(ck->c, 0);
}

/* ---- main ---- */

typedef struct {
    const char *name;
    void (*run)(ck_t *ck);
} group_t;

static const group_t GROUPS[] = {
    {"matmul", group_matmul},
    {"matmul_lt", group_matmul_lt},
    {"fp8_act", group_fp8_act},
    {"fp8_q", group_fp8_q},
    {"matmul_multi", group_matmul_multi},
    {"rmsnorm", group_rmsnorm},
    {"rope", group_rope},
    {"swiglu", group_swiglu},
    {"cache", group_cache},
    {"compress_pool", group_compress},
    {"index_score", group_index},
    {"topk", group_topk},
    {"attn_rows", group_attn},
    {"hc", group_hc},
    {"argmax", group_argmax},
    {"sample", group_sample},
    {"pages", group_pages},
    {"moe", group_moe},
    {"copy_list", group_copy_list},
    {"moe_tp", group_moe_tp},
    {"reads", group_reads},
    {"pdl", group_pdl},
    {"wait", group_wait},
    {"exact", group_exact},
};
#define N_GROUPS (sizeof GROUPS / sizeof GROUPS[0])

static void usage(void)
{
    fprintf(stderr, "usage: duet-check-ops [--op NAME] [--seed N] [--bench] [--device N]\n"
                    "                      [--ceilings-out FILE | --ceilings-in FILE] [--no-header] [--list]\n"
                    "                      [--print-header] [--info]\n"
                    "operations:");
    for (size_t i = 0; i < N_GROUPS; i++)
        fprintf(stderr, " %s", GROUPS[i].name);
    fprintf(stderr, "\n");
}

int main(int argc, char **argv)
{
    ck_t ck;
    memset(&ck, 0, sizeof ck);
    ck.seed = 20260101;
    int device = 0, header = 1, list = 0;
    const char *ceil_in = NULL, *ceil_out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--bench"))
            ck.bench = 1;
        else if (!strcmp(a, "--no-header"))
            header = 0;
        else if (!strcmp(a, "--list"))
            list = 1;
        else if (!strcmp(a, "--print-header"))
            list = 2;
        else if (!strcmp(a, "--info"))
            list = 3;
        else if (!strcmp(a, "--op") && has)
            ck.op = argv[++i];
        else if (!strcmp(a, "--seed") && has)
            ck.seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(a, "--device") && has)
            device = atoi(argv[++i]);
        else if (!strcmp(a, "--ceilings-in") && has)
            ceil_in = argv[++i];
        else if (!strcmp(a, "--ceilings-out") && has)
            ceil_out = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    if (list == 1) {
        for (size_t i = 0; i < N_GROUPS; i++)
            printf("%s\n", GROUPS[i].name);
        return 0;
    }
    if (list == 2) { /* the table's header (scripts that run one process per operation) */
        print_header(&ck);
        return 0;
    }
    int found = !ck.op;
    for (size_t i = 0; i < N_GROUPS && !found; i++)
        found = !strcmp(GROUPS[i].name, ck.op);
    if (!found) {
        usage();
        return 2;
    }
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    ck.threads = nproc < 1 ? 1 : nproc > 64 ? 64 : (int)nproc;

    duet_err_t err;
    ck.device = device;
    if (duet_cuda_create(device, &ck.c, &err) != DUET_OK) {
        fprintf(stderr, "duet-check-ops: no CUDA device: %s\n", duet_err_text(&err));
        return 2;
    }
    duet_cuda_info_t info;
    duet_cuda_info(ck.c, &info);
    if (header)
        printf("device: %s (sm_%d%d, %d SMs, %zu MiB L2, %zu GiB), driver %d, runtime %d, cuBLASLt %d; seed %" PRIu64
               "\n",
               info.name, info.cc_major, info.cc_minor, info.sm_count, info.l2_bytes >> 20, info.mem_bytes >> 30,
               info.driver_version, info.runtime_version, info.cublas_version, ck.seed);
    if (list == 3) {
        duet_cuda_destroy(&ck.c);
        return 0;
    }
    if (ck.bench || ceil_out) {
        FILE *f = ceil_in ? fopen(ceil_in, "r") : NULL;
        ceilings_t *c = &ck.ceil;
        if (f) {
            if (fscanf(f, "%lf %lf %lf %lf %lf %lf", &c->copy_gbps, &c->h2d_gbps, &c->d2h_gbps, &c->bf16_tflops,
                       &c->fp8_tflops, &c->fp32_tflops) != 6) {
                fprintf(stderr, "duet-check-ops: %s: malformed ceilings\n", ceil_in);
                return 2;
            }
            fclose(f);
        } else {
            if (ceil_in) {
                fprintf(stderr, "duet-check-ops: cannot read %s\n", ceil_in);
                return 2;
            }
            measure_ceilings(&ck);
        }
        if (header)
            print_ceilings(&ck);
        if (ceil_out) {
            FILE *o = fopen(ceil_out, "w");
            if (!o) {
                fprintf(stderr, "duet-check-ops: cannot write %s\n", ceil_out);
                return 2;
            }
            fprintf(o, "%.6g %.6g %.6g %.6g %.6g %.6g\n", c->copy_gbps, c->h2d_gbps, c->d2h_gbps, c->bf16_tflops,
                    c->fp8_tflops, c->fp32_tflops);
            fclose(o);
            if (!ck.op && !ck.bench) {
                duet_cuda_destroy(&ck.c);
                return 0;
            }
        }
    }
    if (header)
        print_header(&ck);
    for (size_t i = 0; i < N_GROUPS; i++)
        if (!ck.op || !strcmp(ck.op, GROUPS[i].name))
            GROUPS[i].run(&ck);
    if (duet_cuda_sync(ck.c) != DUET_OK)
        die(&ck, "duet_cuda_sync");
    duet_cuda_destroy(&ck.c);
    if (header || ck.n_fail)
        printf("%d passed, %d failed\n", ck.n_pass, ck.n_fail);
    return ck.n_fail ? 1 : 0;
}
