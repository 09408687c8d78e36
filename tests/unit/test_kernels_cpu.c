/* CPU reference kernels (kernels/cpu) against double-precision references,
 * the exact scalar converters of common/dtype.h, the RoPE tables, and token
 * sampling. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kernels.h"
#include "model_config.h"
#include "ref_math.h"
#include "sampling.h"

static duet_kernels_t K;

static int setup(void **state)
{
    (void)state;
    duet_kernels_init_cpu(&K);
    return 0;
}

/* ---- deterministic randomness ------------------------------------------- */

static uint64_t g_rng = 0x5eed;

static uint64_t rnd_u64(void)
{
    uint64_t x = (g_rng += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* uniform in [lo, hi) */
static float rnd(float lo, float hi) { return lo + (hi - lo) * (float)((rnd_u64() >> 40) * (1.0 / 16777216.0)); }

static float *rnd_vec(size_t n, float lo, float hi)
{
    float *v = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = rnd(lo, hi);
    return v;
}

static void assert_close(double got, double want, double tol, const char *what, int i)
{
    if (!(fabs(got - want) <= tol))
        fail_msg("%s[%d]: got %.9g, want %.9g (tolerance %.3g)", what, i, got, want, tol);
}

/* ---- scalar converters -------------------------------------------------- */

/* float8_e4m3fn from its definition: (-1)^s 2^(e-7) (1 + m/8), subnormals 2^-6 m/8. */
static double e4m3_ref(int b)
{
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e ? pow(2.0, e - 7) * (1.0 + m / 8.0) : pow(2.0, -6) * (m / 8.0);
    return s ? -v : v;
}

static void test_e4m3_decode(void **state)
{
    (void)state;
    for (int b = 0; b < 256; b++) {
        float v = duet_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            assert_true(isnan(v));
            continue;
        }
        assert_true((double)v == e4m3_ref(b));
        assert_int_equal(!!signbit(v), b >> 7);
    }
    assert_true(duet_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(duet_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(duet_e4m3_to_f32(0x38) == 1.0f);
    assert_true(duet_e4m3_to_f32(0x08) == ldexpf(1.0f, -6));
    assert_true(duet_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
}

static void test_e4m3_encode(void **state)
{
    (void)state;
    /* every finite code round-trips, -0 included */
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f)
            assert_int_equal(duet_f32_to_e4m3(duet_e4m3_to_f32((uint8_t)b)), b);
    /* between neighbours: ties go to the even code (= even mantissa), anything else to the nearer */
    for (int b = 0; b < 0x7e; b++)
        for (int s = 0; s < 2; s++) {
            uint8_t lo = (uint8_t)(b | s << 7), hi = (uint8_t)((b + 1) | s << 7);
            float a = duet_e4m3_to_f32(lo), c = duet_e4m3_to_f32(hi), mid = (a + c) / 2;
            assert_true((double)mid == (e4m3_ref(lo) + e4m3_ref(hi)) / 2); /* exact in f32 */
            assert_int_equal(duet_f32_to_e4m3(mid), (b & 1) ? hi : lo);
            assert_int_equal(duet_f32_to_e4m3(nextafterf(mid, a)), lo);
            assert_int_equal(duet_f32_to_e4m3(nextafterf(mid, c)), hi);
        }
    /* saturation at +-448 (the midpoint 464 to the next binade's 480 ties to 448), NaN stays NaN */
    static const float big[] = {448.0f, 450.0f, 463.99f, 464.0f, 464.01f, 480.0f, 1e6f, 3.4e38f, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        assert_int_equal(duet_f32_to_e4m3(big[i]), 0x7e);
        assert_int_equal(duet_f32_to_e4m3(-big[i]), 0xfe);
    }
    assert_int_equal(duet_f32_to_e4m3(NAN) & 0x7f, 0x7f);
    /* below half the smallest subnormal: zero, keeping the sign */
    assert_int_equal(duet_f32_to_e4m3(ldexpf(1.0f, -11)), 0x00);
    assert_int_equal(duet_f32_to_e4m3(-ldexpf(1.0f, -11)), 0x80);
    assert_int_equal(duet_f32_to_e4m3(ldexpf(1.0f, -10)), 0x00); /* tie between 0 and 2^-9: even (0) */
    assert_int_equal(duet_f32_to_e4m3(ldexpf(3.0f, -11)), 0x01);
}

static void test_e8m0(void **state)
{
    (void)state;
    for (int b = 0; b < 255; b++)
        assert_true((double)duet_e8m0_to_f32((uint8_t)b) == ldexp(1.0, b - 127));
    assert_true(isnan(duet_e8m0_to_f32(0xff)));
    /* ceil: the smallest power of two >= x, over the normal range */
    for (int e = -126; e < 127; e++) {
        float p = ldexpf(1.0f, e);
        assert_int_equal(duet_f32_to_e8m0_ceil(p), e + 127);
        assert_int_equal(duet_f32_to_e8m0_ceil(nextafterf(p, INFINITY)), e + 128);
        assert_int_equal(duet_f32_to_e8m0_ceil(p * 1.5f), e + 128);
        if (e > -126)
            assert_int_equal(duet_f32_to_e8m0_ceil(nextafterf(p, 0.0f)), e + 127);
    }
    for (int i = 0; i < 10000; i++) {
        float x = ldexpf(rnd(0.5f, 1.0f), (int)(rnd_u64() % 200) - 100);
        uint8_t b = duet_f32_to_e8m0_ceil(x);
        assert_true(duet_e8m0_to_f32(b) >= x);
        assert_true(duet_e8m0_to_f32((uint8_t)(b - 1)) < x);
    }
    assert_int_equal(duet_f32_to_e8m0_ceil(0.0f), 0);
    assert_int_equal(duet_f32_to_e8m0_ceil(-1.0f), 0);
    assert_int_equal(duet_f32_to_e8m0_ceil(NAN), 0);
    /* what the fp8 cache uses it for: amax / scale never exceeds 448 */
    for (int i = 0; i < 1000; i++) {
        float amax = ldexpf(rnd(0.5f, 1.0f), (int)(rnd_u64() % 40) - 20);
        assert_true(amax / duet_e8m0_to_f32(duet_f32_to_e8m0_ceil(amax / 448.0f)) <= 448.0f);
    }
}

static void test_e2m1(void **state)
{
    (void)state;
    static const double tab[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        float v = duet_e2m1_to_f32((uint8_t)c);
        assert_true(fabs((double)v) == tab[c & 7]);
        assert_int_equal(!!signbit(v), c >> 3);
        assert_int_equal(duet_f32_to_e2m1(v), c);
        assert_int_equal(duet_f32_as_u32(duet_e2m1_to_f32((uint8_t)(c | 0xa0))), duet_f32_as_u32(v)); /* low nibble only */
    }
    /* nearest, ties to the even code (= even mantissa), saturating at 6 */
    for (int i = 0; i <= 1600; i++) {
        float a = (float)i / 200.0f; /* 0 .. 8 in steps of 0.005: hits every midpoint exactly */
        int best = 0;
        for (int c = 1; c < 8; c++) {
            double dc = fabs(a - tab[c]), db = fabs(a - tab[best]);
            if (dc < db || (dc == db && c % 2 == 0))
                best = c;
        }
        assert_int_equal(duet_f32_to_e2m1(a), best);
        assert_int_equal(duet_f32_to_e2m1(-a), best | 8);
    }
    assert_int_equal(duet_f32_to_e2m1(1e30f), 7);
    assert_int_equal(duet_f32_to_e2m1(-INFINITY), 15);
}

/* Round to nearest even from the bits: compare the dropped half-word with 0x8000. */
static uint16_t bf16_ref(uint32_t u)
{
    uint32_t lo = u >> 16, rest = u & 0xffff;
    if (rest > 0x8000 || (rest == 0x8000 && (lo & 1)))
        lo++;
    return (uint16_t)lo;
}

static void test_bf16(void **state)
{
    (void)state;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rnd_u64();
        if ((u & 0x7f800000u) == 0x7f800000u)
            continue; /* inf/NaN below */
        assert_int_equal(duet_f32_to_bf16(duet_u32_as_f32(u)), bf16_ref(u));
    }
    /* every bf16 value round-trips, ties in both directions, overflow to inf */
    for (uint32_t h = 0; h < 0x10000; h++)
        if ((h & 0x7f80) != 0x7f80)
            assert_int_equal(duet_f32_to_bf16(duet_bf16_to_f32((uint16_t)h)), h);
    assert_int_equal(duet_f32_to_bf16(duet_u32_as_f32(0x3f808000u)), 0x3f80); /* tie, even below */
    assert_int_equal(duet_f32_to_bf16(duet_u32_as_f32(0x3f818000u)), 0x3f82); /* tie, even above */
    assert_int_equal(duet_f32_to_bf16(duet_u32_as_f32(0x3f808001u)), 0x3f81);
    assert_int_equal(duet_f32_to_bf16(duet_u32_as_f32(0xbf818000u)), 0xbf82);
    assert_int_equal(duet_f32_to_bf16(duet_u32_as_f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    assert_int_equal(duet_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(duet_f32_to_bf16(-INFINITY), 0xff80);
    /* NaN stays NaN, even with the payload only in the dropped bits, and keeps its sign */
    static const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0xffc00000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = duet_f32_to_bf16(duet_u32_as_f32(nans[i]));
        assert_true(isnan(duet_bf16_to_f32(h)));
        assert_int_equal(h >> 15, nans[i] >> 31);
    }
    assert_true(duet_bf16_round(1.0f + ldexpf(1.0f, -9)) == 1.0f);
}

/* ---- matmul ------------------------------------------------------------- */

typedef struct {
    duet_weight_t w;
    double *deq;   /* rows x cols dequantized */
    void *data, *scale;
} wfix_t;

/* A random weight of `dt` (scale_dt for fp8: F8_E8M0 or F32) and its exact dequantization. */
static wfix_t make_weight(duet_dtype_t dt, duet_dtype_t scale_dt, int rows, int cols)
{
    wfix_t f = {{.dtype = dt, .rows = rows, .cols = cols}, NULL, NULL, NULL};
    size_t n = (size_t)rows * cols;
    f.deq = malloc(sizeof(double) * n);
    assert_non_null(f.deq);
    if (dt == DUET_DT_F32) {
        float *d = rnd_vec(n, -1.0f, 1.0f);
        for (size_t i = 0; i < n; i++)
            f.deq[i] = d[i];
        f.data = d;
    } else if (dt == DUET_DT_BF16) {
        uint16_t *d = malloc(2 * n);
        assert_non_null(d);
        for (size_t i = 0; i < n; i++) {
            d[i] = duet_f32_to_bf16(rnd(-1.0f, 1.0f));
            f.deq[i] = duet_bf16_to_f32(d[i]);
        }
        f.data = d;
    } else if (dt == DUET_DT_F8_E4M3) {
        int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        uint8_t *d = malloc(n);
        double *s = malloc(sizeof(double) * (size_t)sr * sc);
        assert_non_null(d);
        assert_non_null(s);
        f.w.scale_dtype = scale_dt;
        f.w.scale_cols = sc;
        if (scale_dt == DUET_DT_F32) {
            float *fs = rnd_vec((size_t)sr * sc, 0.001f, 0.1f);
            for (int i = 0; i < sr * sc; i++)
                s[i] = fs[i];
            f.scale = fs;
        } else {
            uint8_t *bs = malloc((size_t)sr * sc);
            assert_non_null(bs);
            for (int i = 0; i < sr * sc; i++) {
                bs[i] = (uint8_t)(118 + rnd_u64() % 16);
                s[i] = ldexp(1.0, bs[i] - 127);
            }
            f.scale = bs;
        }
        for (size_t i = 0; i < n; i++) {
            do
                d[i] = (uint8_t)rnd_u64();
            while ((d[i] & 0x7f) == 0x7f);
            int r = (int)(i / cols), c = (int)(i % cols);
            f.deq[i] = e4m3_ref(d[i]) * s[(r / 128) * sc + c / 128];
        }
        free(s);
        f.data = d;
    } else {
        assert_int_equal(dt, DUET_DT_F4_E2M1X2);
        assert_int_equal(cols % 32, 0);
        uint8_t *d = malloc(n / 2), *bs = malloc(n / 32);
        assert_non_null(d);
        assert_non_null(bs);
        f.w.scale_dtype = DUET_DT_F8_E8M0;
        f.w.scale_cols = cols / 32;
        for (size_t i = 0; i < n / 32; i++)
            bs[i] = (uint8_t)(120 + rnd_u64() % 12);
        for (size_t i = 0; i < n / 2; i++)
            d[i] = (uint8_t)rnd_u64();
        for (size_t i = 0; i < n; i++) {
            int r = (int)(i / cols), c = (int)(i % cols);
            uint8_t b = d[(size_t)r * (cols / 2) + c / 2];
            f.deq[i] = duet_e2m1_to_f32((c & 1) ? b >> 4 : b & 0xf) * ldexp(1.0, bs[(size_t)r * (cols / 32) + c / 32] - 127);
        }
        f.data = d;
        f.scale = bs;
    }
    f.w.data = f.data;
    f.w.scale = f.scale;
    return f;
}

static void free_weight(wfix_t *f)
{
    free(f->deq);
    free(f->data);
    free(f->scale);
}

static void check_matmul(duet_dtype_t dt, duet_dtype_t scale_dt, int rows, int cols)
{
    enum { N = 7 };
    wfix_t f = make_weight(dt, scale_dt, rows, cols);
    float *x = rnd_vec((size_t)N * cols, -2.0f, 2.0f);
    float *y = malloc(sizeof(float) * N * rows), *y1 = malloc(sizeof(float) * rows);
    assert_non_null(y);
    assert_non_null(y1);
    K.matmul(&f.w, 0, rows, x, N, y);
    for (int i = 0; i < N; i++)
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                ref += (double)x[i * cols + c] * f.deq[(size_t)r * cols + c];
                mag += fabs((double)x[i * cols + c] * f.deq[(size_t)r * cols + c]);
            }
            assert_close(y[i * rows + r], ref, 1e-5 * mag, duet_dtype_name(dt), i * rows + r);
        }
    /* batch invariance: a row alone gives the same bits as inside the batch */
    for (int i = 0; i < N; i++) {
        K.matmul(&f.w, 0, rows, x + (size_t)i * cols, 1, y1);
        assert_memory_equal(y1, y + (size_t)i * rows, sizeof(float) * rows);
    }
    /* row ranges are slices of the full product */
    const int ranges[][2] = {{0, 1}, {5, rows - 2}, {rows - 1, rows}, {128, rows}, {3, 3}};
    float *ys = malloc(sizeof(float) * N * rows);
    assert_non_null(ys);
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
        int b = ranges[k][0], e = ranges[k][1], m = e - b;
        K.matmul(&f.w, b, e, x, N, ys);
        for (int i = 0; i < N; i++)
            assert_memory_equal(ys + (size_t)i * m, y + (size_t)i * rows + b, sizeof(float) * m);
    }
    free(ys);
    free(x);
    free(y);
    free(y1);
    free_weight(&f);
}

static void test_matmul_bf16(void **state) { (void)state; check_matmul(DUET_DT_BF16, 0, 200, 300); }
static void test_matmul_f32(void **state) { (void)state; check_matmul(DUET_DT_F32, 0, 200, 300); }
static void test_matmul_fp8(void **state)
{
    (void)state;
    check_matmul(DUET_DT_F8_E4M3, DUET_DT_F8_E8M0, 200, 300);
    check_matmul(DUET_DT_F8_E4M3, DUET_DT_F8_E8M0, 257, 130);
    check_matmul(DUET_DT_F8_E4M3, DUET_DT_F32, 200, 300);
}
static void test_matmul_fp4(void **state)
{
    (void)state;
    check_matmul(DUET_DT_F4_E2M1X2, 0, 200, 320);
    check_matmul(DUET_DT_F4_E2M1X2, 0, 131, 96);
}

/* ---- norms, rope -------------------------------------------------------- */

static void test_rmsnorm(void **state)
{
    (void)state;
    enum { N = 3, D = 77 };
    float *x = rnd_vec(N * D, -3.0f, 3.0f), *w = rnd_vec(D, 0.5f, 1.5f), y[N * D], z[N * D];
    const float eps = 1e-6f;
    K.rmsnorm(x, w, N, D, eps, y);
    K.rmsnorm(x, NULL, N, D, eps, z);
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int c = 0; c < D; c++)
            ss += (double)x[i * D + c] * x[i * D + c];
        double inv = 1.0 / sqrt(ss / D + eps);
        for (int c = 0; c < D; c++) {
            assert_close(z[i * D + c], x[i * D + c] * inv, 1e-6 * fabs(x[i * D + c] * inv) + 1e-7, "rmsnorm", c);
            assert_close(y[i * D + c], w[c] * x[i * D + c] * inv, 1e-6 * fabs(w[c] * x[i * D + c] * inv) + 1e-7,
                         "rmsnorm w", c);
        }
    }
    /* in place */
    K.rmsnorm(x, w, N, D, eps, x);
    assert_memory_equal(x, y, sizeof y);
    /* a zero row stays finite */
    float zero[D] = {0};
    K.rmsnorm(zero, w, 1, D, eps, zero);
    for (int c = 0; c < D; c++)
        assert_true(zero[c] == 0.0f);
    free(x);
    free(w);
}

static void test_rope(void **state)
{
    (void)state;
    enum { N = 4, H = 3, HD = 48, RD = 32 };
    duet_rope_t r;
    duet_rope_init(&r, RD, 10000.0, NULL);
    const int64_t pos[N] = {0, 1, 977, 65535};
    float *x = rnd_vec(N * H * HD, -1.0f, 1.0f), y[N * H * HD];
    memcpy(y, x, sizeof y);
    K.rope(y, N, H, HD, pos, &r, 1);
    for (int i = 0; i < N; i++)
        for (int h = 0; h < H; h++) {
            const float *a = x + (i * H + h) * HD, *b = y + (i * H + h) * HD;
            assert_memory_equal(a, b, sizeof(float) * (HD - RD)); /* nope channels untouched */
            if (pos[i] == 0)
                assert_memory_equal(a, b, sizeof(float) * HD);    /* position 0: identity */
            for (int j = 0; j < RD / 2; j++) {
                const float *pa = a + HD - RD + 2 * j, *pb = b + HD - RD + 2 * j;
                double na = hypot(pa[0], pa[1]), nb = hypot(pb[0], pb[1]);
                assert_close(nb, na, 1e-6 * na + 1e-7, "rope norm", j);
                /* the angle is inv_freq * pos (computed in f32, as the kernel does) */
                double th = (double)(r.inv_freq[j] * (float)pos[i]);
                assert_close(pb[0], pa[0] * cos(th) - pa[1] * sin(th), 2e-6, "rope re", j);
                assert_close(pb[1], pa[1] * cos(th) + pa[0] * sin(th), 2e-6, "rope im", j);
            }
        }
    K.rope(y, N, H, HD, pos, &r, -1);
    for (int i = 0; i < N * H * HD; i++)
        assert_close(y[i], x[i], 1e-6, "rope inverse", i);
    free(x);
}

/* transformers' _compute_yarn_parameters(rope_theta 160000, factor 16, original 65536, beta 32/1,
 * rope dim 64, attention_factor 1), the float32 inv_freq it returns. */
static const float k_yarn_ref[32] = {
    1.000000000e+00f, 6.876560450e-01f, 4.728707969e-01f, 3.251724541e-01f,
    2.236067951e-01f, 1.537645608e-01f, 1.057371199e-01f, 7.271077484e-02f,
    5.000000075e-02f, 3.438280150e-02f, 2.364354022e-02f, 1.625862345e-02f,
    1.118034031e-02f, 7.688228041e-03f, 5.286856554e-03f, 3.635538509e-03f,
    2.265624935e-03f, 1.396801323e-03f, 8.496897062e-04f, 5.080819828e-04f,
    2.969777852e-04f, 1.681799768e-04f, 9.086784121e-05f, 4.544423064e-05f,
    1.953125320e-05f, 5.372312444e-06f, 3.694303359e-06f, 2.540409696e-06f,
    1.746928206e-06f, 1.201285613e-06f, 8.260713003e-07f, 5.680529398e-07f,
};

static void test_rope_init(void **state)
{
    (void)state;
    duet_yarn_t y = {.enabled = 1, .factor = 16, .beta_fast = 32, .beta_slow = 1,
                     .original_max_position_embeddings = 65536};
    duet_rope_t r;
    duet_rope_init(&r, 64, 160000.0, &y);
    assert_int_equal(r.rope_dim, 64);
    for (int j = 0; j < 32; j++)
        assert_close(r.inv_freq[j], k_yarn_ref[j], 1e-6 * k_yarn_ref[j], "yarn inv_freq", j);
    /* no yarn (NULL or disabled): theta^(-2j/d) */
    y.enabled = 0;
    for (int k = 0; k < 2; k++) {
        duet_rope_init(&r, 64, 10000.0, k ? &y : NULL);
        for (int j = 0; j < 32; j++) {
            double want = pow(10000.0, -2.0 * j / 64);
            assert_close(r.inv_freq[j], want, 1e-6 * want, "inv_freq", j);
        }
    }
}

/* ---- attention, compressor, indexer, top-k ------------------------------ */

static void attn_ref(const float *q, int H, int D, const float *keys, int n, const float *sinks, float scale, double *out)
{
    for (int h = 0; h < H; h++) {
        double l[64], mx = sinks[h], den = 0;
        for (int j = 0; j < n; j++) {
            double d = 0;
            for (int c = 0; c < D; c++)
                d += (double)q[h * D + c] * keys[j * D + c];
            l[j] = d * scale;
            if (l[j] > mx)
                mx = l[j];
        }
        den = isinf(sinks[h]) ? 0 : exp(sinks[h] - mx);
        for (int j = 0; j < n; j++)
            den += (l[j] = exp(l[j] - mx));
        for (int c = 0; c < D; c++) {
            double acc = 0;
            for (int j = 0; j < n; j++)
                acc += l[j] / den * keys[j * D + c];
            out[h * D + c] = acc;
        }
    }
}

static void test_attn_row(void **state)
{
    (void)state;
    enum { H = 4, D = 24, NK = 37 };
    float *q = rnd_vec(H * D, -1.0f, 1.0f), *keys = rnd_vec(NK * D, -1.0f, 1.0f), sinks[H] = {0.5f, -2.0f, 3.0f, 0.0f};
    float out[H * D], scale = 1.0f / sqrtf((float)D) * 4.0f;
    double ref[H * D];
    K.attn_row(q, H, D, keys, NK, sinks, scale, out);
    attn_ref(q, H, D, keys, NK, sinks, scale, ref);
    for (int i = 0; i < H * D; i++)
        assert_close(out[i], ref[i], 1e-5, "attn", i);
    /* sink -inf: plain softmax */
    float none[H] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    K.attn_row(q, H, D, keys, NK, none, scale, out);
    attn_ref(q, H, D, keys, NK, none, scale, ref);
    for (int i = 0; i < H * D; i++)
        assert_close(out[i], ref[i], 1e-5, "attn no sink", i);
    /* one key, no sink: the output is that key */
    K.attn_row(q, H, D, keys, 1, none, scale, out);
    for (int i = 0; i < H * D; i++)
        assert_close(out[i], keys[i % D], 1e-7, "attn one key", i);
    /* zero keys (and no keys at all) give zero output */
    float zk[NK * D] = {0};
    K.attn_row(q, H, D, zk, NK, sinks, scale, out);
    for (int i = 0; i < H * D; i++)
        assert_true(out[i] == 0.0f);
    memset(out, 0x7f, sizeof out);
    K.attn_row(q, H, D, keys, 0, sinks, scale, out);
    for (int i = 0; i < H * D; i++)
        assert_true(out[i] == 0.0f);
    free(q);
    free(keys);
}

static void test_compress_pool(void **state)
{
    (void)state;
    enum { S = 8, D = 5, STRIDE = 7 };
    float *kv = rnd_vec(S * STRIDE, -2.0f, 2.0f), *gate = rnd_vec(S * STRIDE, -3.0f, 3.0f), out[D];
    /* window 0's overlap slots: gate -inf, kv garbage that must not leak */
    for (int s = 0; s < 4; s++)
        for (int c = 0; c < D; c++) {
            gate[s * STRIDE + c] = -INFINITY;
            kv[s * STRIDE + c] = NAN;
        }
    gate[5 * STRIDE + 2] = -INFINITY; /* one more, in one channel only */
    K.compress_pool(kv, gate, S, D, STRIDE, out);
    for (int c = 0; c < D; c++) {
        double mx = -INFINITY, den = 0, acc = 0;
        for (int s = 0; s < S; s++)
            mx = fmax(mx, gate[s * STRIDE + c]);
        for (int s = 0; s < S; s++)
            if (!isinf(gate[s * STRIDE + c])) {
                double e = exp(gate[s * STRIDE + c] - mx);
                den += e;
                acc += e * kv[s * STRIDE + c];
            }
        assert_close(out[c], acc / den, 1e-6, "compress_pool", c);
    }
    for (int i = 0; i < S * STRIDE; i++)
        gate[i] = -INFINITY;
    K.compress_pool(kv, gate, S, D, STRIDE, out);
    for (int c = 0; c < D; c++)
        assert_true(out[c] == 0.0f);
    free(kv);
    free(gate);
}

static void test_index_score(void **state)
{
    (void)state;
    enum { H = 5, D = 16, NK = 23 };
    float *q = rnd_vec(H * D, -1.0f, 1.0f), *w = rnd_vec(H, -1.0f, 1.0f), *keys = rnd_vec(NK * D, -1.0f, 1.0f);
    float score[NK], scale = 0.25f;
    K.index_score(q, w, H, D, keys, NK, scale, score);
    int clipped = 0;
    for (int s = 0; s < NK; s++) {
        double acc = 0;
        for (int h = 0; h < H; h++) {
            double d = 0;
            for (int c = 0; c < D; c++)
                d += (double)q[h * D + c] * keys[s * D + c];
            clipped += d < 0;
            acc += w[h] * scale * (d > 0 ? d : 0);
        }
        assert_close(score[s], acc, 1e-5, "index_score", s);
    }
    assert_true(clipped > 0);
    /* a key every head scores negatively scores exactly 0 */
    for (int c = 0; c < D; c++)
        for (int h = 0; h < H; h++)
            q[h * D + c] = 1.0f;
    for (int c = 0; c < D; c++)
        keys[c] = -1.0f;
    K.index_score(q, w, H, D, keys, 1, scale, score);
    assert_true(score[0] == 0.0f);
    free(q);
    free(w);
    free(keys);
}

static void test_topk(void **state)
{
    (void)state;
    const float v[] = {1, 5, 3, 5, 2, 5, NAN, 4, -INFINITY, 0};
    int32_t idx[16];
    K.topk(v, 10, 2, idx); /* three 5s: the two lowest indices */
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 3);
    K.topk(v, 10, 5, idx);
    const int32_t want5[] = {1, 2, 3, 5, 7};
    assert_memory_equal(idx, want5, sizeof want5);
    /* k > n: all n, ascending, nothing written past n */
    for (int i = 0; i < 16; i++)
        idx[i] = -7;
    K.topk(v, 10, 14, idx);
    for (int i = 0; i < 10; i++)
        assert_int_equal(idx[i], i);
    assert_int_equal(idx[10], -7);
    /* random, with many ties, against a brute-force selection */
    enum { N = 300 };
    float r[N];
    for (int t = 0; t < 20; t++) {
        for (int i = 0; i < N; i++)
            r[i] = (float)(rnd_u64() % 17);
        int k = 1 + (int)(rnd_u64() % 60);
        int32_t got[64];
        char taken[N] = {0};
        K.topk(r, N, k, got);
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int i = 0; i < N; i++)
                if (!taken[i] && (b < 0 || r[i] > r[b]))
                    b = i;
            taken[b] = 1;
        }
        for (int j = 0, i = 0; i < N; i++)
            if (taken[i])
                assert_int_equal(got[j++], i);
    }
}

/* ---- hyper-connections, swiglu ------------------------------------------ */

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static void test_hc(void **state)
{
    (void)state;
    enum { N = 2, HC = 4, D = 40, MIX = (2 + HC) * HC, ITERS = 20 };
    float *x = rnd_vec(N * HC * D, -2.0f, 2.0f), *fn = rnd_vec(MIX * HC * D, -0.1f, 0.1f);
    float *base = rnd_vec(MIX, -1.0f, 1.0f), scale[3] = {0.7f, 1.3f, 2.0f};
    float post[N * HC], comb[N * HC * HC], col[N * D];
    const float hc_eps = 1e-6f, norm_eps = 1e-6f;
    K.hc_pre(x, N, HC, D, fn, base, scale, ITERS, hc_eps, norm_eps, post, comb, col);
    for (int i = 0; i < N; i++) {
        const float *xi = x + i * HC * D;
        double ss = 0, mixes[MIX], pre[HC];
        for (int c = 0; c < HC * D; c++)
            ss += (double)xi[c] * xi[c];
        double inv = 1.0 / sqrt(ss / (HC * D) + norm_eps);
        for (int m = 0; m < MIX; m++) {
            double a = 0;
            for (int c = 0; c < HC * D; c++)
                a += xi[c] * inv * fn[m * HC * D + c];
            mixes[m] = a;
        }
        for (int k = 0; k < HC; k++) {
            pre[k] = sigmoid(mixes[k] * scale[0] + base[k]) + hc_eps;
            double po = 2 * sigmoid(mixes[HC + k] * scale[1] + base[HC + k]);
            assert_close(post[i * HC + k], po, 1e-6, "hc post", k);
            assert_true(post[i * HC + k] > 0.0f && post[i * HC + k] < 2.0f);
            assert_true(pre[k] > 0.0 && pre[k] <= 1.0 + hc_eps);
        }
        for (int c = 0; c < D; c++) {
            double a = 0;
            for (int k = 0; k < HC; k++)
                a += pre[k] * xi[k * D + c];
            assert_close(col[i * D + c], a, 1e-5, "hc collapsed", c);
        }
        /* Sinkhorn: every row and column of comb sums to ~1, entries positive */
        const float *cb = comb + i * HC * HC;
        for (int a = 0; a < HC; a++) {
            double rs = 0, cs = 0;
            for (int b = 0; b < HC; b++) {
                assert_true(cb[a * HC + b] > 0.0f);
                rs += cb[a * HC + b];
                cs += cb[b * HC + a];
            }
            assert_close(cs, 1.0, 1e-5, "comb column sum", a);
            assert_close(rs, 1.0, 1e-3, "comb row sum", a);
        }
    }
    /* hc_post: x[k] = post[k] f + sum_j comb[j][k] x[j] */
    float *f = rnd_vec(N * D, -1.0f, 1.0f), x2[N * HC * D];
    memcpy(x2, x, sizeof x2);
    K.hc_post(x2, N, HC, D, f, post, comb);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < HC; k++)
            for (int c = 0; c < D; c++) {
                double a = (double)post[i * HC + k] * f[i * D + c];
                for (int j = 0; j < HC; j++)
                    a += (double)comb[i * HC * HC + j * HC + k] * x[(i * HC + j) * D + c];
                assert_close(x2[(i * HC + k) * D + c], a, 1e-5, "hc_post", c);
            }
    free(x);
    free(fn);
    free(base);
    free(f);
}

static void test_swiglu(void **state)
{
    (void)state;
    enum { N = 2, I = 50 };
    float *g = rnd_vec(N * I, -20.0f, 20.0f), *u = rnd_vec(N * I, -20.0f, 20.0f), y[N * I];
    for (int lim = 0; lim < 2; lim++) {
        float limit = lim ? 10.0f : 0.0f;
        K.swiglu(g, u, N, I, limit, y);
        for (int i = 0; i < N * I; i++) {
            double gg = g[i], uu = u[i];
            if (limit > 0) {
                gg = fmin(gg, limit); /* gate: upper clamp only */
                uu = fmax(fmin(uu, limit), -limit);
            }
            double want = gg / (1 + exp(-gg)) * uu;
            assert_close(y[i], want, 1e-5 * (1 + fabs(want)), "swiglu", i);
        }
    }
    free(g);
    free(u);
}

/* ---- sampling ----------------------------------------------------------- */

static void test_sampling_greedy(void **state)
{
    (void)state;
    const float l[] = {0.1f, 2.0f, -1.0f, 3.5f, 3.5f, 1.0f, 3.5f};
    duet_sampling_t s;
    duet_sampling_default(&s);
    assert_true(s.temperature <= 0.0f);
    for (int64_t p = 0; p < 10; p++)
        assert_int_equal(duet_sample(l, 7, &s, p), 3);
    s.temperature = -1.0f;
    assert_int_equal(duet_sample(l, 7, &s, 0), 3);
    /* top_k 1 and a tiny top_p are greedy whatever the draw */
    const float m[] = {1.0f, 1.2f, 0.9f, 1.19f};
    duet_sampling_default(&s);
    s.temperature = 1.0f;
    for (int k = 0; k < 2; k++) {
        s.top_k = k ? 0 : 1;
        s.top_p = k ? 1e-6f : 1.0f;
        for (int64_t p = 0; p < 500; p++) {
            s.seed = (uint64_t)p * 7919u;
            assert_int_equal(duet_sample(m, 4, &s, p), 1);
        }
    }
}

static void test_sampling_draws(void **state)
{
    (void)state;
    enum { V = 16, P = 1000 };
    float flat[V] = {0};
    duet_sampling_t a, b;
    duet_sampling_default(&a);
    a.temperature = 1.0f;
    a.seed = 1;
    b = a;
    b.seed = 2;
    int differ = 0;
    for (int64_t p = 0; p < P; p++) {
        double u = duet_sample_uniform(a.seed, p);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(u == duet_sample_uniform(a.seed, p));
        int32_t t = duet_sample(flat, V, &a, p);
        assert_true(t >= 0 && t < V);
        assert_int_equal(duet_sample(flat, V, &a, p), t); /* same (seed, position): same token */
        differ += duet_sample(flat, V, &b, p) != t;
    }
    assert_true(differ > P / 2); /* ~15/16 of the draws differ */
}

static void test_sampling_min_p(void **state)
{
    (void)state;
    /* probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps p >= 0.25, tokens 0 and 1 */
    const float l[] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    duet_sampling_t s;
    duet_sampling_default(&s);
    s.temperature = 1.0f;
    s.min_p = 0.5f;
    s.seed = 99;
    int seen[4] = {0};
    for (int64_t p = 0; p < 2000; p++)
        seen[duet_sample(l, 4, &s, p)]++;
    assert_true(seen[0] > 0 && seen[1] > 0);
    assert_int_equal(seen[2] + seen[3], 0);
    /* top_p 0.7: tokens 0 and 1 (0.5 + 0.3 reaches it) */
    s.min_p = 0.0f;
    s.top_p = 0.7f;
    memset(seen, 0, sizeof seen);
    for (int64_t p = 0; p < 2000; p++)
        seen[duet_sample(l, 4, &s, p)]++;
    assert_true(seen[0] > 0 && seen[1] > 0);
    assert_int_equal(seen[2] + seen[3], 0);
}

static void test_sampling_frequencies(void **state)
{
    (void)state;
    /* logits 2, 1, 0, -1 at temperature 2: softmax of 1, .5, 0, -.5 */
    const float l[] = {2.0f, 1.0f, 0.0f, -1.0f};
    duet_sampling_t s;
    duet_sampling_default(&s);
    s.temperature = 2.0f;
    s.seed = 20240229;
    enum { P = 20000 };
    int cnt[4] = {0};
    for (int64_t p = 0; p < P; p++)
        cnt[duet_sample(l, 4, &s, p)]++;
    double z = 0, chi2 = 0, pr[4];
    for (int i = 0; i < 4; i++)
        z += pr[i] = exp(l[i] / 2.0);
    for (int i = 0; i < 4; i++) {
        double e = P * pr[i] / z;
        chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    /* 3 degrees of freedom: P(chi2 > 30) ~ 1e-6; the seed is fixed, so this is deterministic anyway */
    if (chi2 > 30.0)
        fail_msg("chi2 %.2f: counts %d %d %d %d", chi2, cnt[0], cnt[1], cnt[2], cnt[3]);
}

/* ref_math.h's functions (the CPU table's and the GPU's): against libm in double precision,
 * rounded, over seeded arguments of the ranges the engine gives them (softmax and sigmoid
 * arguments, rope angles up to a million radians, softplus's e^x), within 0.5 ulp plus a
 * hair (the double-precision evaluation before the one rounding); the special values. */
static double ulps(float got, double want)
{
    if (want == 0.0)
        return got == 0.0f ? 0.0 : INFINITY;
    int e;
    frexp(want, &e);
    double ulp = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
    return fabs((double)got - want) / ulp;
}

static void test_ref_math(void **state)
{
    (void)state;
    uint64_t s = 42;
    double we = 0, ws = 0, wc = 0, wl = 0;
    for (int i = 0; i < 2000000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(s >> 11) / 9007199254740992.0;
        float xe = (float)(u * 190.0 - 102.0); /* to the subnormal results and to 88 */
        double d = ulps(duet_ref_expf(xe), exp((double)xe));
        we = d > we ? d : we;
        float xa = (float)(i % 2 ? (u - 0.5) * 2.2e6 : (u - 0.5) * 20.0), sn, cs;
        duet_ref_sincosf(xa, &sn, &cs);
        d = ulps(sn, sin((double)xa));
        ws = d > ws ? d : ws;
        d = ulps(cs, cos((double)xa));
        wc = d > wc ? d : wc;
        float y = i % 3 ? (float)exp(u * 40.0 - 20.0) : (float)(u * 1.9 - 0.95);
        d = ulps(duet_ref_log1pf(y), log1p((double)y));
        wl = d > wl ? d : wl;
    }
    print_message("ref_math: worst ulp exp %.4f sin %.4f cos %.4f log1p %.4f\n", we, ws, wc, wl);
    assert_true(we <= 0.5001 && ws <= 0.5001 && wc <= 0.5001 && wl <= 0.5001);
    /* special values */
    assert_true(duet_ref_expf(0.0f) == 1.0f && duet_ref_expf(-0.0f) == 1.0f);
    assert_true(isinf(duet_ref_expf(89.0f)) && isinf(duet_ref_expf(1e30f)) && duet_ref_expf(88.7f) < INFINITY);
    assert_true(duet_ref_expf(-105.0f) == 0.0f && duet_ref_expf(-INFINITY) == 0.0f);
    assert_true(duet_ref_expf(-103.0f) > 0.0f); /* a subnormal */
    assert_true(isnan(duet_ref_expf(NAN)) && isinf(duet_ref_expf(INFINITY)));
    float sn, cs;
    duet_ref_sincosf(0.0f, &sn, &cs);
    assert_true(sn == 0.0f && cs == 1.0f);
    duet_ref_sincosf(INFINITY, &sn, &cs);
    assert_true(isnan(sn) && isnan(cs));
    duet_ref_sincosf(NAN, &sn, &cs);
    assert_true(isnan(sn) && isnan(cs));
    assert_true(duet_ref_log1pf(0.0f) == 0.0f && duet_ref_log1pf(1e-12f) == 1e-12f);
    assert_true(isinf(duet_ref_log1pf(-1.0f)) && duet_ref_log1pf(-1.0f) < 0 && isnan(duet_ref_log1pf(-2.0f)));
    assert_true(isnan(duet_ref_log1pf(NAN)) && isinf(duet_ref_log1pf(INFINITY)));
    assert_true(duet_ref_sigmoidf(0.0f) == 0.5f && duet_ref_sigmoidf(-200.0f) == 0.0f &&
                duet_ref_sigmoidf(200.0f) == 1.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_math),
        cmocka_unit_test(test_e4m3_decode),
        cmocka_unit_test(test_e4m3_encode),
        cmocka_unit_test(test_e8m0),
        cmocka_unit_test(test_e2m1),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_matmul_f32),
        cmocka_unit_test(test_matmul_fp8),
        cmocka_unit_test(test_matmul_fp4),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_init),
        cmocka_unit_test(test_attn_row),
        cmocka_unit_test(test_compress_pool),
        cmocka_unit_test(test_index_score),
        cmocka_unit_test(test_topk),
        cmocka_unit_test(test_hc),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_sampling_greedy),
        cmocka_unit_test(test_sampling_draws),
        cmocka_unit_test(test_sampling_min_p),
        cmocka_unit_test(test_sampling_frequencies),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
