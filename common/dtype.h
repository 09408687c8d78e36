/* Element types of checkpoint tensors and caches, and exact scalar
 * conversions between them.  These inline converters are the single
 * definition of each encoding; kernels and tools use them. */
#ifndef DUET_DTYPE_H
#define DUET_DTYPE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DUET_DT_INVALID = 0,
    DUET_DT_F32,
    DUET_DT_F16,
    DUET_DT_BF16,
    DUET_DT_F8_E4M3,   /* float8_e4m3fn: 1-4-3, bias 7, no inf, 0x7f/0xff NaN, max 448 */
    DUET_DT_F8_E8M0,   /* ue8m0 scale: 2^(e-127), 0xff NaN */
    DUET_DT_F4_E2M1X2, /* two e2m1 values per byte, low nibble first (stored as I8/U8 in files) */
    DUET_DT_I8,
    DUET_DT_U8,
    DUET_DT_I16,
    DUET_DT_I32,
    DUET_DT_I64,
    DUET_DT_BOOL,
    DUET_DT_COUNT,
} duet_dtype_t;

/* Safetensors name ("BF16", "F8_E4M3", ...) <-> dtype; DUET_DT_INVALID if unknown. */
duet_dtype_t duet_dtype_from_st_name(const char *name);
const char *duet_dtype_st_name(duet_dtype_t dt);
/* Human name ("bf16", "fp8_e4m3", ...). */
const char *duet_dtype_name(duet_dtype_t dt);
/* Bytes per element; for F4_E2M1X2 returns 1 (one byte holds two values). */
size_t duet_dtype_size(duet_dtype_t dt);

static inline float duet_u32_as_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t duet_f32_as_u32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float duet_bf16_to_f32(uint16_t h) { return duet_u32_as_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t duet_f32_to_bf16(float f)
{
    uint32_t u = duet_f32_as_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float duet_bf16_round(float f) { return duet_bf16_to_f32(duet_f32_to_bf16(f)); }

static inline float duet_f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    if (e == 31)
        return duet_u32_as_f32(s | 0x7f800000u | (m << 13));
    return duet_u32_as_f32(s | ((e + 112) << 23) | (m << 13));
}

static inline float duet_e4m3_to_f32(uint8_t b)
{
    uint32_t s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 0xf && m == 7)
        return NAN;
    if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8 + m), (int)e - 10);
    return s ? -v : v;
}

/* Round to nearest even, saturating to +-448 (float8_e4m3fn, as torch's satfinite cast). */
static inline uint8_t duet_f32_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 464.0f) /* halfway between 448 and the next (480) rounds to even (448's mantissa is 6) */
        return sign | 0x7e;
    if (a < ldexpf(1.0f, -6)) {
        /* subnormal: multiples of 2^-9 */
        float q = nearbyintf(a * 512.0f); /* default rounding mode: nearest even */
        return sign | (uint8_t)q;         /* q == 8 gives exponent 1, mantissa 0: correct */
    }
    int e;
    float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5,1) */
    /* mantissa with 3 bits: a = (1 + m/8) * 2^(e-1) */
    float scaled = ldexpf(fr, 4); /* in [8,16) */
    float q = nearbyintf(scaled);
    if (q >= 16.0f) {
        q = 8.0f;
        e += 1;
    }
    int exp = e - 1 + 7;
    if (exp > 15 || (exp == 15 && q - 8.0f > 6.0f))
        return sign | 0x7e;
    return sign | (uint8_t)(exp << 3) | (uint8_t)(q - 8.0f);
}

/* ue8m0: value 2^(b-127). */
static inline float duet_e8m0_to_f32(uint8_t b)
{
    if (b == 0xff)
        return NAN;
    if (b == 0)
        return ldexpf(1.0f, -127);
    return duet_u32_as_f32((uint32_t)b << 23);
}

/* Smallest power of two >= x (x > 0), as ue8m0 (the rounding-up scale used so that
 * |v| / scale never exceeds the fp8 range). */
static inline uint8_t duet_f32_to_e8m0_ceil(float x)
{
    if (!(x > 0.0f))
        return 0;
    uint32_t u = duet_f32_as_u32(x);
    uint32_t e = (u >> 23) & 0xff;
    if (u & 0x7fffffu)
        e += 1;
    if (e == 0)
        e = 1;
    if (e > 254)
        e = 254;
    return (uint8_t)e;
}

/* e2m1 (fp4): values {0, .5, 1, 1.5, 2, 3, 4, 6} with sign bit 3. */
static inline float duet_e2m1_to_f32(uint8_t nib)
{
    static const float lut[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = lut[nib & 7];
    return (nib & 8) ? -v : v;
}

/* Round to nearest e2m1 (ties to even mantissa), saturating at 6. */
static inline uint8_t duet_f32_to_e2m1(float f)
{
    uint8_t sign = signbit(f) ? 8 : 0;
    float a = fabsf(f);
    uint8_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return sign | c;
}

#endif
