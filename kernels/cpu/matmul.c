/* Reference matmul over bf16, f32, fp8 (128x128 block scales) and fp4 (1x32
 * group scales) weights.  y(n, rows) = x(n, cols) · Wᵀ, fp32 accumulation.
 * fp8: each 128-column block's dot product is accumulated separately and
 * scaled once (as the blockwise GEMM does); fp4 likewise per 32 columns.  The GPU's CPU-exact
 * matmul (kernels/cuda/exact.cu) keeps this order: a thread a lane, the same tree. */
#include "kernels_cpu.h"

static inline float scale_at(const duet_weight_t *w, int r, int c)
{
    size_t i = (size_t)r * (size_t)w->scale_cols + (size_t)c;
    if (w->scale_dtype == DUET_DT_F32)
        return ((const float *)w->scale)[i];
    return duet_e8m0_to_f32(((const uint8_t *)w->scale)[i]);
}

/* Dot products use 8 interleaved partial sums (lane j takes columns j, j+8, ...),
 * added in a fixed order at the end: the result depends only on the inputs and
 * the column count, and the compiler can keep the lanes in one vector register. */
#define LANES 8

static inline float lanes_sum(const float *acc) 
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void row_bf16(const duet_weight_t *w, int r, const float *x, float *out)
{
    const uint16_t *wr = (const uint16_t *)w->data + (size_t)r * (size_t)w->cols;
    float acc[LANES] = {0};
    int c = 0;
    for (; c + LANES <= w->cols; c += LANES)
        for (int j = 0; j < LANES; j++)
            acc[j] += x[c + j] * duet_u32_as_f32((uint32_t)wr[c + j] << 16);
    for (; c < w->cols; c++)
        acc[c % LANES] += x[c] * duet_bf16_to_f32(wr[c]);
    *out = lanes_sum(acc);
}

static void row_f32(const duet_weight_t *w, int r, const float *x, float *out)
{
    const float *wr = (const float *)w->data + (size_t)r * (size_t)w->cols;
    float acc[LANES] = {0};
    int c = 0;
    for (; c + LANES <= w->cols; c += LANES)
        for (int j = 0; j < LANES; j++)
            acc[j] += x[c + j] * wr[c + j];
    for (; c < w->cols; c++)
        acc[c % LANES] += x[c] * wr[c];
    *out = lanes_sum(acc);
}

static void row_fp8(const duet_weight_t *w, int r, const float *x, const float *lut, float *out)
{
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * (size_t)w->cols;
    float acc = 0.0f;
    for (int c0 = 0; c0 < w->cols; c0 += 128) {
        int c1 = c0 + 128 < w->cols ? c0 + 128 : w->cols;
        float part[LANES] = {0};
        int c = c0;
        for (; c + LANES <= c1; c += LANES)
            for (int j = 0; j < LANES; j++)
                part[j] += x[c + j] * lut[wr[c + j]];
        for (; c < c1; c++)
            part[(c - c0) % LANES] += x[c] * lut[wr[c]];
        acc += lanes_sum(part) * scale_at(w, r / 128, c0 / 128);
    }
    *out = acc;
}

static void row_fp4(const duet_weight_t *w, int r, const float *x, float *out)
{
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 2);
    float acc = 0.0f;
    for (int c0 = 0; c0 < w->cols; c0 += 32) {
        float part = 0.0f;
        for (int c = c0; c < c0 + 32; c += 2) {
            uint8_t b = wr[c / 2];
            part += x[c] * duet_e2m1_to_f32(b & 0xf);
            part += x[c + 1] * duet_e2m1_to_f32(b >> 4);
        }
        acc += part * scale_at(w, r, c0 / 32);
    }
    *out = acc;
}

void duet_cpu_matmul(const duet_weight_t *w, int row_begin, int row_end, const float *x, int n, float *y)
{
    float lut[256];
    if (w->dtype == DUET_DT_F8_E4M3)
        for (int i = 0; i < 256; i++) {
            lut[i] = duet_e4m3_to_f32((uint8_t)i);
            if (lut[i] != lut[i]) /* NaN encodings never appear in valid weights; keep them inert */
                lut[i] = 0.0f;
        }
    int m = row_end - row_begin;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * (size_t)w->cols;
        float *yi = y + (size_t)i * (size_t)m;
        for (int r = row_begin; r < row_end; r++) {
            float *o = &yi[r - row_begin];
            switch (w->dtype) {
            case DUET_DT_BF16: row_bf16(w, r, xi, o); break;
            case DUET_DT_F32: row_f32(w, r, xi, o); break;
            case DUET_DT_F8_E4M3: row_fp8(w, r, xi, lut, o); break;
            case DUET_DT_F4_E2M1X2: row_fp4(w, r, xi, o); break;
            default: *o = 0.0f; break;
            }
        }
    }
}
