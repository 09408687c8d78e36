/* The exponential the sampler takes its probabilities from: e^x for x <= 0 as a float, from
 * single-precision multiplies and adds alone, each rounded to nearest, in a fixed order, with
 * no library call and no fused multiply-add.  So the same x gives the same bits on any IEEE
 * machine: the host (compiled with -ffp-contract=off), and a CUDA kernel (a device function
 * there), where the macros below take the intrinsics that nvcc never contracts.  A library's
 * expf gives no such promise (glibc's and CUDA's differ in the last bit for some x), and a
 * draw on the GPU has to pick what the host picks.
 *
 * Range reduction x = k ln 2 + r: k = x log2 e rounded to nearest (by adding and taking away
 * 1.5 * 2^23), r = x - k C1 - k C2 (C1 with nine significant bits, so k C1 is exact for
 * |k| < 2^15), |r| <= 0.35; e^r by the degree-7 Taylor series in Horner form, whose truncation
 * error is under 2^-26 on that interval; times 2^k, exact while the result is normal.  Error
 * against e^x at most 1.13 ulp over the sampler's range (tests/unit/test_sampling.c checks
 * under 2).  NaN, and x below -87 (results under 2^-125), give 0; x above 0 is taken as 0 (the
 * sampler's x is a logit less the largest, never above 0). */
#ifndef DUET_SAMPLE_EXP_H
#define DUET_SAMPLE_EXP_H

#include <stdint.h>

#ifdef __CUDACC__
#define DUET_SE_FN static __device__ __forceinline__
#define DUET_SE_MUL(a, b) __fmul_rn((a), (b))
#define DUET_SE_ADD(a, b) __fadd_rn((a), (b))
#else
#include <string.h>
#define DUET_SE_FN static inline
#define DUET_SE_MUL(a, b) ((a) * (b))
#define DUET_SE_ADD(a, b) ((a) + (b))
#endif

DUET_SE_FN float duet_sample_exp(float x)
{
    /* selects, not branches, so that a loop of calls vectorizes: NaN and x < -87 are computed
     * as -87 and give 0 at the end; x > 0 as 0 */
    int in = x >= -87.0f;
    float xc = in ? x : -87.0f;
    xc = xc > 0.0f ? 0.0f : xc;
    const float log2e = 1.44269504f, c1 = 0.693359375f, c2 = -2.12194440e-4f;
    const float rnd = 12582912.0f; /* 1.5 * 2^23: t + rnd - rnd is t rounded to nearest, ties even */
    float kf = DUET_SE_ADD(DUET_SE_ADD(DUET_SE_MUL(xc, log2e), rnd), -rnd); /* -126 .. 0 */
    float r = DUET_SE_ADD(xc, -DUET_SE_MUL(kf, c1));
    r = DUET_SE_ADD(r, -DUET_SE_MUL(kf, c2));
    /* 1 + r + r^2/2! + ... + r^7/7!, Horner from the top */
    float p = 1.98412698e-4f; /* 1/7! */
    p = DUET_SE_ADD(DUET_SE_MUL(p, r), 1.38888889e-3f);
    p = DUET_SE_ADD(DUET_SE_MUL(p, r), 8.33333333e-3f);
    p = DUET_SE_ADD(DUET_SE_MUL(p, r), 4.16666667e-2f);
    p = DUET_SE_ADD(DUET_SE_MUL(p, r), 1.66666667e-1f);
    p = DUET_SE_ADD(DUET_SE_MUL(p, r), 0.5f);
    p = DUET_SE_ADD(DUET_SE_MUL(p, r), 1.0f);
    p = DUET_SE_ADD(DUET_SE_MUL(p, r), 1.0f);
    int32_t sb = (127 + (int32_t)kf) * (1 << 23); /* 2^k, k >= -126 */
    float s;
#ifdef __CUDACC__
    s = __int_as_float(sb);
#else
    memcpy(&s, &sb, sizeof s);
#endif
    float e = DUET_SE_MUL(p, s);
    return in ? e : 0.0f;
}

#undef DUET_SE_FN
#undef DUET_SE_MUL
#undef DUET_SE_ADD

#endif
