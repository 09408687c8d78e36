/* The reference's arithmetic, shared by the CPU table (kernels/cpu/) and the GPU
 * (kernels/cuda/): the same source compiled by both, so that the same inputs give the
 * same bits on any IEEE machine.
 *
 * Every operation here is a single IEEE add, multiply, divide or square root rounded to
 * nearest, in a fixed order, never fused: the host build has -ffp-contract=off, and in
 * device code the macros below take the intrinsics that nvcc never contracts.  A
 * library's expf or sinf makes no such promise (glibc picks an FMA variant at run time
 * on CPUs that have FMA, CUDA's differ from both in the last bit for some x), so the
 * exponential, log(1 + y), sine and cosine are ours: range reduction and a polynomial in double
 * precision, rounded once to float (within a few parts in 1e16 of the true value before
 * that rounding: correctly rounded but where e^x or sin x falls that close to a midpoint).
 *
 * Also here: the column-order dot product, the norm's inverse and the hyper-connection
 * weights, which the CPU table and the GPU's CPU-exact kernels (kernels/cuda/exact.cu) call as
 * they are. */
#ifndef DUET_REF_MATH_H
#define DUET_REF_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DUET_REF_FN static __host__ __device__ __forceinline__
#else
#include <string.h>
#define DUET_REF_FN static inline
#endif

#ifdef __CUDA_ARCH__
#define DUET_FMUL(a, b) __fmul_rn((a), (b))
#define DUET_FADD(a, b) __fadd_rn((a), (b))
#define DUET_FSUB(a, b) __fsub_rn((a), (b))
#define DUET_FDIV(a, b) __fdiv_rn((a), (b))
#define DUET_FSQRT(a) __fsqrt_rn(a)
#define DUET_DMUL(a, b) __dmul_rn((a), (b))
#define DUET_DADD(a, b) __dadd_rn((a), (b))
#define DUET_DSUB(a, b) __dsub_rn((a), (b))
#define DUET_DDIV(a, b) __ddiv_rn((a), (b))
#else
#define DUET_FMUL(a, b) ((a) * (b))
#define DUET_FADD(a, b) ((a) + (b))
#define DUET_FSUB(a, b) ((a) - (b))
#define DUET_FDIV(a, b) ((a) / (b))
#define DUET_FSQRT(a) sqrtf(a)
#define DUET_DMUL(a, b) ((a) * (b))
#define DUET_DADD(a, b) ((a) + (b))
#define DUET_DSUB(a, b) ((a) - (b))
#define DUET_DDIV(a, b) ((a) / (b))
#endif

/* A value's bits, and back (memcpy on the host, the intrinsics on the device). */
DUET_REF_FN uint32_t duet_ref_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

DUET_REF_FN int64_t duet_ref_f64_bits(double d)
{
#ifdef __CUDA_ARCH__
    return (int64_t)__double_as_longlong(d);
#else
    int64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
#endif
}

DUET_REF_FN double duet_ref_f64_of_bits(int64_t u)
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
#endif
}

/* t rounded to the nearest integer (ties to even), for |t| < 2^51: adding and taking away
 * 1.5 * 2^52 leaves no bits below the units */
DUET_REF_FN double duet_ref_rint(double t)
{
    const double big = 6755399441055744.0;
    return DUET_DSUB(DUET_DADD(t, big), big);
}

/* e^x as a float.  x = k ln 2 + r with k = x log2 e rounded, r = x - k L1 - k L2 (L1 = ln 2 with
 * 32 significant bits, so k L1 is exact), |r| <= 0.347; e^r by its Taylor series to r^13 (the
 * rest under 5e-18), Horner; times 2^k, exact in double for every k reached; one rounding to
 * float (which gives the float subnormals and infinity where they are due).  NaN gives NaN;
 * x > 89 gives +inf and x < -104 gives 0 (e^x beyond float's range or under half its
 * smallest subnormal). */
DUET_REF_FN float duet_ref_expf(float x)
{
    if (x != x)
        return x;
    if (x > 89.0f)
        return INFINITY;
    if (x < -104.0f)
        return 0.0f;
    const double log2e = 1.4426950408889634, l1 = 6.93147180369123816490e-01, l2 = 1.90821492927058770002e-10;
    double xd = (double)x;
    double k = duet_ref_rint(DUET_DMUL(xd, log2e)); /* -150 .. 129 */
    double r = DUET_DSUB(DUET_DSUB(xd, DUET_DMUL(k, l1)), DUET_DMUL(k, l2));
    double p = 1.6059043836821614e-10; /* 1/13! */
    p = DUET_DADD(DUET_DMUL(p, r), 2.08767569878680990e-09);
    p = DUET_DADD(DUET_DMUL(p, r), 2.50521083854417188e-08);
    p = DUET_DADD(DUET_DMUL(p, r), 2.75573192239858907e-07);
    p = DUET_DADD(DUET_DMUL(p, r), 2.75573192239858907e-06);
    p = DUET_DADD(DUET_DMUL(p, r), 2.48015873015873016e-05);
    p = DUET_DADD(DUET_DMUL(p, r), 1.98412698412698413e-04);
    p = DUET_DADD(DUET_DMUL(p, r), 1.38888888888888889e-03);
    p = DUET_DADD(DUET_DMUL(p, r), 8.33333333333333333e-03);
    p = DUET_DADD(DUET_DMUL(p, r), 4.16666666666666667e-02);
    p = DUET_DADD(DUET_DMUL(p, r), 1.66666666666666667e-01);
    p = DUET_DADD(DUET_DMUL(p, r), 0.5);
    p = DUET_DADD(DUET_DMUL(p, r), 1.0);
    p = DUET_DADD(DUET_DMUL(p, r), 1.0);
    double s = duet_ref_f64_of_bits((int64_t)(1023 + (int)k) << 52); /* 2^k, a normal double */
    return (float)DUET_DMUL(p, s);
}

/* log(1 + y) as a float, for y > -1 (y = -1: -inf; below: NaN).  1 + y in double (exact for
 * |y| >= 2^-29; below that the float result is y itself) = 2^k m with m in [sqrt(1/2), sqrt(2));
 * log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^23 (the rest
 * under 1e-19); plus k ln 2; one rounding to float. */
DUET_REF_FN float duet_ref_log1pf(float y)
{
    if (y != y || y > 3.0e38f)
        return y;
    if (y <= -1.0f)
        return y == -1.0f ? -INFINITY : NAN;
    if (y < 1.8626451e-9f && y > -1.8626451e-9f) /* |y| < 2^-29 */
        return y;
    double u = DUET_DADD(1.0, (double)y);
    int64_t bits = duet_ref_f64_bits(u);
    int k = (int)((bits >> 52) & 0x7ff) - 1023;
    double m = duet_ref_f64_of_bits((bits & 0x000fffffffffffffLL) | ((int64_t)1023 << 52)); /* [1, 2) */
    if (m > 1.4142135623730951) {
        m = DUET_DMUL(m, 0.5);
        k += 1;
    }
    double s = DUET_DDIV(DUET_DSUB(m, 1.0), DUET_DADD(m, 1.0));
    double s2 = DUET_DMUL(s, s);
    double p = 1.0 / 23.0;
    for (int n = 21; n >= 1; n -= 2)
        p = DUET_DADD(DUET_DMUL(p, s2), DUET_DDIV(1.0, (double)n));
    double lm = DUET_DMUL(DUET_DMUL(2.0, s), p);
    return (float)DUET_DADD(DUET_DMUL((double)k, 6.93147180559945286227e-01), lm);
}

/* The logistic function, as the reference writes it: 1 / (1 + e^-x). */
DUET_REF_FN float duet_ref_sigmoidf(float x) { return DUET_FDIV(1.0f, DUET_FADD(1.0f, duet_ref_expf(-x))); }

/* sin x and cos x as floats.  x = k pi/2 + r with k = x 2/pi rounded, r = x - k P1 - k P2 - k P3
 * (pi/2 in three pieces of 33 bits: k P1 and k P2 exact for |k| < 2^20, i.e. |x| up to about
 * 1.6e6, beyond which r loses bits gradually but stays the same on every machine); sin r and
 * cos r by their Taylor series on |r| <= pi/4 (to r^17 and r^18: the rest under 1e-18), the
 * quadrant k mod 4 choosing which and its sign; one rounding to float.  NaN or infinite x
 * gives NaN. */
DUET_REF_FN void duet_ref_sincosf(float x, float *sin_out, float *cos_out)
{
    if ((duet_ref_f32_bits(x) & 0x7f800000u) == 0x7f800000u) { /* NaN or infinite */
        *sin_out = NAN;
        *cos_out = NAN;
        return;
    }
    const double two_over_pi = 6.36619772367581382433e-01;
    const double p1 = 1.57079632673412561417e+00, p2 = 6.07710050630396597660e-11,
                 p3 = 2.02226624879595063154e-21;
    double xd = (double)x;
    double k = duet_ref_rint(DUET_DMUL(xd, two_over_pi));
    double r = DUET_DSUB(DUET_DSUB(DUET_DSUB(xd, DUET_DMUL(k, p1)), DUET_DMUL(k, p2)), DUET_DMUL(k, p3));
    double r2 = DUET_DMUL(r, r);
    /* sin r = r (1 - r^2/3! + r^4/5! - ... + r^16/17!) */
    double s = 2.81145725434552076e-15; /* 1/17! */
    s = DUET_DADD(DUET_DMUL(s, r2), -7.64716373181981648e-13);
    s = DUET_DADD(DUET_DMUL(s, r2), 1.60590438368216146e-10);
    s = DUET_DADD(DUET_DMUL(s, r2), -2.50521083854417188e-08);
    s = DUET_DADD(DUET_DMUL(s, r2), 2.75573192239858907e-06);
    s = DUET_DADD(DUET_DMUL(s, r2), -1.98412698412698413e-04);
    s = DUET_DADD(DUET_DMUL(s, r2), 8.33333333333333333e-03);
    s = DUET_DADD(DUET_DMUL(s, r2), -1.66666666666666667e-01);
    s = DUET_DADD(DUET_DMUL(s, r2), 1.0);
    s = DUET_DMUL(s, r);
    /* cos r = 1 - r^2/2! + r^4/4! - ... + r^18/18! */
    double c = -1.56192069685862265e-16; /* -1/18! */
    c = DUET_DADD(DUET_DMUL(c, r2), 4.77947733238738530e-14);
    c = DUET_DADD(DUET_DMUL(c, r2), -1.14707455977297247e-11);
    c = DUET_DADD(DUET_DMUL(c, r2), 2.08767569878680990e-09);
    c = DUET_DADD(DUET_DMUL(c, r2), -2.75573192239858907e-07);
    c = DUET_DADD(DUET_DMUL(c, r2), 2.48015873015873016e-05);
    c = DUET_DADD(DUET_DMUL(c, r2), -1.38888888888888889e-03);
    c = DUET_DADD(DUET_DMUL(c, r2), 4.16666666666666667e-02);
    c = DUET_DADD(DUET_DMUL(c, r2), -0.5);
    c = DUET_DADD(DUET_DMUL(c, r2), 1.0);
    int q = (int)((int64_t)k & 3);
    double sv = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
    double cv = q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
    *sin_out = (float)sv;
    *cos_out = (float)cv;
}

/* ---- dot products ------------------------------------------------------------------------ */

/* Σ a[c] b[c] in column order, one rounding a multiply and an add. */
DUET_REF_FN float duet_ref_dot(const float *a, const float *b, int n)
{
    float d = 0.0f;
    for (int c = 0; c < n; c++)
        d = DUET_FADD(d, DUET_FMUL(a[c], b[c]));
    return d;
}

/* 1 / sqrt(ss / dim + eps): the norm's inverse from a row's sum of squares. */
DUET_REF_FN float duet_ref_rms_inv(float ss, int dim, float eps)
{
    return DUET_FDIV(1.0f, DUET_FSQRT(DUET_FADD(DUET_FDIV(ss, (float)dim), eps)));
}

/* ---- hyper-connections -------------------------------------------------------------------- */

/* A row's hyper-connection comb (hc x hc) from its mixes((2 + hc) hc) = [pre | post | comb]
 * before scale and base: each row's softmax of mix s2 + b, + eps; a column normalisation; then
 * (iters - 1) times a row and a column normalisation; each sum in index order and divided by
 * sum + eps. */
DUET_REF_FN void duet_ref_hc_comb(const float *mixes, int hc, float scale2, const float *base, int iters,
                                  float hc_eps, float *cb)
{
    for (int j = 0; j < hc; j++) {
        float mx = -INFINITY;
        for (int k = 0; k < hc; k++) {
            float v = DUET_FADD(DUET_FMUL(mixes[2 * hc + j * hc + k], scale2), base[2 * hc + j * hc + k]);
            cb[j * hc + k] = v;
            if (v > mx)
                mx = v;
        }
        float s = 0.0f;
        for (int k = 0; k < hc; k++) {
            cb[j * hc + k] = duet_ref_expf(DUET_FSUB(cb[j * hc + k], mx));
            s = DUET_FADD(s, cb[j * hc + k]);
        }
        for (int k = 0; k < hc; k++)
            cb[j * hc + k] = DUET_FADD(DUET_FDIV(cb[j * hc + k], s), hc_eps);
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {
                float s = 0.0f;
                for (int k = 0; k < hc; k++)
                    s = DUET_FADD(s, cb[j * hc + k]);
                for (int k = 0; k < hc; k++)
                    cb[j * hc + k] = DUET_FDIV(cb[j * hc + k], DUET_FADD(s, hc_eps));
            }
        for (int k = 0; k < hc; k++) {
            float s = 0.0f;
            for (int j = 0; j < hc; j++)
                s = DUET_FADD(s, cb[j * hc + k]);
            for (int j = 0; j < hc; j++)
                cb[j * hc + k] = DUET_FDIV(cb[j * hc + k], DUET_FADD(s, hc_eps));
        }
    }
}

/* All of a row's hyper-connection weights (kernels.h's hc_pre): pre_k = sigmoid(mix_k s0 + b_k)
 * + eps, post_k = 2 sigmoid(mix_{hc+k} s1 + b_{hc+k}), and the comb above with s2. */
DUET_REF_FN void duet_ref_hc_mix(const float *mixes, int hc, const float *scale, const float *base, int iters,
                                 float hc_eps, float *pre, float *post, float *cb)
{
    for (int k = 0; k < hc; k++) {
        pre[k] = DUET_FADD(duet_ref_sigmoidf(DUET_FADD(DUET_FMUL(mixes[k], scale[0]), base[k])), hc_eps);
        post[k] = DUET_FMUL(2.0f, duet_ref_sigmoidf(DUET_FADD(DUET_FMUL(mixes[hc + k], scale[1]), base[hc + k])));
    }
    duet_ref_hc_comb(mixes, hc, scale[2], base, iters, hc_eps, cb);
}

#endif
