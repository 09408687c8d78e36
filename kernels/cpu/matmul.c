/* Reference matmul over bf16, f32, fp8 (128x128 block scales) and fp4 (1x32
 * group scales) weights.  y(n, rows) = x(n, cols) · Wᵀ, fp32 accumulation.
 * fp8: each 128-column block's dot product is accumulated separately and
 * scaled once (as the blockwise GEMM does); fp4 likewise per 32 columns.  The dot products
 * are ref_math.h's, which the GPU's CPU-exact kernels share. */
#include "kernels_cpu.h"
#include "ref_math.h"

static const void *scale_row(const duet_weight_t *w, int r)
{
    size_t i = (size_t)r * (size_t)w->scale_cols;
    return w->scale_dtype == DUET_DT_F32 ? (const void *)((const float *)w->scale + i)
                                         : (const void *)((const uint8_t *)w->scale + i);
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
            size_t rr = (size_t)r;
            int sf = w->scale_dtype == DUET_DT_F32;
            switch (w->dtype) {
            case DUET_DT_BF16: *o = duet_ref_row_bf16((const uint16_t *)w->data + rr * w->cols, xi, w->cols); break;
            case DUET_DT_F32: *o = duet_ref_row_f32((const float *)w->data + rr * w->cols, xi, w->cols); break;
            case DUET_DT_F8_E4M3:
                *o = duet_ref_row_fp8((const uint8_t *)w->data + rr * w->cols, xi, w->cols, lut, scale_row(w, r / 128),
                                      sf);
                break;
            case DUET_DT_F4_E2M1X2:
                *o = duet_ref_row_fp4((const uint8_t *)w->data + rr * (size_t)(w->cols / 2), xi, w->cols,
                                      scale_row(w, r), sf);
                break;
            default: *o = 0.0f; break;
            }
        }
    }
}
