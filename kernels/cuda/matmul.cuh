/* matmul on the GPU: duet_kernels_t.matmul over device pointers.
 *
 * y(n, row_end-row_begin) = x(n, w->cols) · W[row_begin:row_end]ᵀ, x and y
 * fp32, W in its stored dtype (w->data / w->scale are device pointers; the
 * other fields as in kernels.h).  Kernels, chosen by n:
 *   n <= DUET_CUDA_GEMV_MAX_N  the decode kernels: fp32 activations, weights
 *        decoded in registers (bf16, e4m3 × its 128×128 block scale, e2m1 × its
 *        1×32 group scale, f32), fp32 accumulation.  From DUET_CUDA_TC_MIN_N
 *        tokens on (fp4: DUET_CUDA_TC_MIN_N_FP4), on the tensor cores with the
 *        weights exact in the MMA's type: bf16 weights against x split into
 *        three bf16 parts (hi + mid + lo, residual < 2^-24 |x|), fp8 and fp4
 *        weights as fp16 against x scaled by a power of two per token and
 *        fold group and split into two fp16 parts (22 bits of x); block and
 *        group scales applied to each fold group's partial; summed in an
 *        order fixed by the weight's shape: a launch split along the columns
 *        (small n) gives the same bits as one that is not;
 *        below, or where that kernel does not apply, on the fp32 units.  Both
 *        differ from the CPU only in summation order (normalized error ~1e-7;
 *        checked at 1e-5).
 *   n >  DUET_CUDA_GEMV_MAX_N  cuBLASLt with bf16 operands and fp32
 *        accumulation: x is rounded to bf16; fp8 and fp4 weights are first
 *        expanded to bf16 (exact for ue8m0 scales) in a scratch buffer.
 *        Normalized error ~1e-3 from rounding x (checked at 4e-3).
 *        f32 weights take cuBLASLt fp32 (no TF32) at every n.
 * The choice depends on n, so a row's result can differ by rounding between
 * batch sizes, unless the context is in batch-invariant mode
 * (duet_cuda_set_invariant: duet_cuda_matmul_invariant at every n). */
#ifndef DUET_CUDA_MATMUL_CUH
#define DUET_CUDA_MATMUL_CUH

#include "duet_cuda.h"

#define DUET_CUDA_GEMV_MAX_N 32
#define DUET_CUDA_TC_MIN_N 4     /* bf16 and fp8 weights */
#define DUET_CUDA_TC_MIN_N_FP4 16 /* fp4 (measured with the bf16 path; not re-measured since e2m1 decodes to fp16) */

#ifdef __cplusplus
extern "C" {
#endif

duet_status_t duet_cuda_matmul(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end, const float *x,
                               int n, float *y);

/* Force one kernel (checks and benchmarks): the fp32-unit decode kernel at any n, or
 * cuBLASLt at any n (DUET_ERR_UNSUPPORTED when cuBLASLt has no algorithm). */
duet_status_t duet_cuda_matmul_gemv(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                    const float *x, int n, float *y);
duet_status_t duet_cuda_matmul_lt(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                  const float *x, int n, float *y);
/* The tensor-core decode kernel at any n (DUET_ERR_UNSUPPORTED for f32 weights, columns not a
 * multiple of 128, row_begin not a multiple of 16, unaligned buffers). */
duet_status_t duet_cuda_matmul_gemv_tc(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                       const float *x, int n, float *y);

/* The batch-invariant choice (duet_cuda_set_invariant routes duet_cuda_matmul here): one
 * kernel per weight whatever n is, so a row's result never depends on the other rows: the
 * tensor-core decode kernel (fp32-faithful through the 3-way split of x) where it applies,
 * else the fp32-unit kernel.  Both split the columns by the weight's shape only and keep
 * each token's accumulation to itself.  Same tolerance as the decode kernels (1e-5), at
 * every n; slower than cuBLASLt at prefill sizes (docs/PERF.md). */
duet_status_t duet_cuda_matmul_invariant(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                         const float *x, int n, float *y);
/* 1 when duet_cuda_matmul_invariant takes the tensor-core kernel for this weight, row_begin and x. */
int duet_cuda_matmul_invariant_tc(const duet_weight_t *w, int row_begin, const float *x);

/* A block-diagonal product in one launch (the output projection's wo_a over its groups): rows
 * row_begin + [g group_rows, (g + 1) group_rows) of w times x's columns [g w->cols, (g + 1) w->cols),
 * x being n rows of (row_end - row_begin) / group_rows * w->cols floats; y is n x (row_end -
 * row_begin).  Each group's rows bit for bit what duet_cuda_matmul_invariant gives on that group's
 * columns of x alone (the loading-warp kernel, reading the group's units of x split once).  Where
 * that kernel takes the launch (fp8 weights, TC_WS_MIN_N to 32 tokens, sm_90, groups of whole
 * blocks: _ok); DUET_ERR_UNSUPPORTED elsewhere, when the caller runs the groups its other way. */
int duet_cuda_matmul_blockdiag_ok(const duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                  int group_rows, const float *x, int n);
duet_status_t duet_cuda_matmul_blockdiag(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                         int group_rows, const float *x, int n, float *y);

/* Several weights times the same x in one launch (a decode step's projections of one
 * input): part i computes rows [row_begin, row_end) of its weight into its y (n × its rows),
 * each token's result bit for bit what duet_cuda_matmul_invariant gives (the same block code;
 * blockIdx walks the parts' row blocks).  All parts one dtype and width, each
 * tensor-core eligible (duet_cuda_matmul_invariant_tc); DUET_ERR_UNSUPPORTED otherwise, when
 * the caller launches them one by one. */
#define DUET_CUDA_MULTI_MAX 8
typedef struct {
    const duet_weight_t *w;
    int row_begin, row_end;
    float *y;
} duet_cuda_mm_part_t;
int duet_cuda_matmul_multi_ok(const duet_cuda_mm_part_t *parts, int n_parts, const float *x);
duet_status_t duet_cuda_matmul_multi(duet_cuda_t *c, const duet_cuda_mm_part_t *parts, int n_parts, const float *x,
                                     int n);

/* Grouped expert matmuls (MoE): every expert's assigned token rows in one launch.
 * The assignments are sorted by expert (duet_cuda_moe_sort, moe_route.cuh): expert e
 * owns positions [offs[e], offs[e+1]); position p reads x row xrow[p] (or row p when
 * use_xrow is 0) and writes y row p, y(n_assign, rows).  Each block runs the
 * batch-invariant kernel's block (duet_cuda_matmul_invariant: tensor-core where it
 * applies, else fp32 units) on one expert's weight for a tile of its tokens, so a
 * token's output is bit for bit what that kernel gives for it alone, whichever tokens
 * share its tile.  `mb` (optional) is a second matrix of the same shape and dtype
 * (w1 and w3), multiplied by the same rows into yb in the same launch.  The grid is
 * sized from n_assign and n_experts alone (the counts stay on the device): tiles past
 * the last one exit at once.  Bytes: each used expert's weight once per tile of 8
 * (32 from an average of 16 tokens an expert; on sm_90, fp8 and tiled fp4 weights 64 from an
 * average of 48) tokens. */
typedef struct {
    const duet_weight_t *proto; /* host struct: dtype, rows, cols, scale dtype and columns of every expert */
    const void *const *data;    /* (E) device array of the experts' device weight pointers (16-byte aligned) */
    const void *const *scale;   /* (E) device array of their scale pointers, or NULL (bf16, f32) */
} duet_cuda_expert_mats_t;

typedef struct {
    int n_experts;
    int n_assign;         /* rows * top_k: the sorted positions */
    const int32_t *offs;  /* (E+1) device */
    const int32_t *tiles; /* (DUET_CUDA_MOE_TILE_ROWS, E+1) device: prefix sums of ceil(m_e / 8), of
                             ceil(m_e / wide tile) and of ceil(m_e / 64) */
    const int32_t *xrow;  /* (n_assign) device: the x row of each position */
} duet_cuda_moe_plan_t;

duet_status_t duet_cuda_matmul_grouped(duet_cuda_t *c, const duet_cuda_expert_mats_t *ma,
                                       const duet_cuda_expert_mats_t *mb, const duet_cuda_moe_plan_t *p,
                                       const float *x, int use_xrow, float *ya, float *yb);
/* 1 when duet_cuda_matmul_grouped takes experts shaped like proto with activations x. */
int duet_cuda_matmul_grouped_ok(const duet_weight_t *proto, const float *x);

/* The tiled layouts (duet_weight_t.tiled = 1), made on the device from the usual one by
 * duet_cuda_weight_tile, in place.  fp4: the same bytes in tiles of 32 rows by 128 columns
 * (2 KB, row r of the tile at 64 r), tile (rt, u) at (rt * cols/128 + u) * 2048, and the ue8m0
 * scales likewise, 32 rows by 4 bytes a tile (128 B) at (rt * cols/128 + u) * 128.  A warp of
 * the tensor-core kernel reads a unit of its 32 rows as one 2 KB run instead of 32 runs of 64
 * bytes 2 KB apart, a pattern the H200's memory serves at about 2.7 of 4.6 TB/s (docs/PERF.md).
 * bf16: tiles of 32 rows by 128 columns (8 KB) as 16-byte records, each an MMA's A operand for
 * one lane (rows g and g + 8, two column pairs), so that the kernel loads it whole instead of
 * moving four words of two rows into place (matmul.cu, TC_BF16_TILE_BYTES).
 * Only the tensor-core kernels read it: duet_cuda_matmul, _invariant, _gemv_tc and _grouped
 * take a tiled weight at any n from a row_begin on a 32-row boundary; _gemv, _lt, _fp8_act and
 * _multi refuse it (DUET_ERR_UNSUPPORTED).  The results are the untiled weight's, bit for bit. */
duet_status_t duet_cuda_weight_tile(duet_cuda_t *c, duet_weight_t *w);
/* 1 when duet_cuda_weight_tile takes w: bf16, or fp4 with ue8m0 scales; rows a multiple of 32,
 * columns of 128, on the device and not tiled yet. */
int duet_cuda_weight_tile_ok(const duet_weight_t *w);

/* fp8 weights on the fp8 tensor cores (prefill): each row of x is quantized
 * to e4m3 per 128 columns with an fp32 scale amax/448 (as the model's own
 * inference code does), then cuBLASLt multiplies with 1×128 activation and
 * 128×128 weight block scales, fp32 out.  A different function from the
 * contract (activations lose ~2.5% rms to e4m3): checked against the CPU
 * reference fed the same quantized activations.  Needs sm_90 and cuBLASLt
 * 12.9+, w->cols % 128 == 0, row_begin % 128 == 0; DUET_ERR_UNSUPPORTED
 * otherwise. */
duet_status_t duet_cuda_matmul_fp8_act(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                       const float *x, int n, float *y);
/* Its two steps on their own, for activations quantized where they are made (duet_cuda_rmsnorm_q8):
 * duet_cuda_act_quant writes x(n, k)'s e4m3 codes xq (duet_cuda_fp8_act_rows(n) rows of k bytes;
 * rows past n code 0) and scales sx (k/128 of them a row; past n, 1) in the layout cuBLASLt
 * reads (duet_cuda_fp8_act_scale_layout); duet_cuda_matmul_fp8_q multiplies them, y =
 * duet_cuda_matmul_fp8_act's bit for bit.  k a multiple of 128; x and sx 16-byte aligned, xq 4
 * (for matmul_fp8_q 16); DUET_ERR_INVALID otherwise. */
int duet_cuda_fp8_act_rows(int n);
duet_status_t duet_cuda_act_quant(duet_cuda_t *c, const float *x, int n, int k, uint8_t *xq, float *sx);
duet_status_t duet_cuda_matmul_fp8_q(duet_cuda_t *c, const duet_weight_t *w, int row_begin, int row_end,
                                     const uint8_t *xq, const float *sx, int n, float *y);
/* Grouped expert launches (fp8 and fp4 weights) from min_n positions on split x into its MMA
 * parts once a position, ahead, instead of in every row block (the same bits either way):
 * min_n > 0 that threshold, 0 never, < 0 the build's defaults (TC_PRESPLIT_MIN_N for 32-token
 * tiles, TC_PRESPLIT_MIN_N1 for one-token tiles, in matmul.cu). */
void duet_cuda_tc_presplit(duet_cuda_t *c, int min_n);
/* The output type cuBLASLt accepted for the fp8 GEMM so far (for reports):
 * 0 not used yet, 1 fp32, 2 bf16 (then converted to fp32: ~3e-3 more error). */
int duet_cuda_fp8_act_output(const duet_cuda_t *c);
/* Diagnostic for the check harness: the scale layouts handed to cuBLASLt.
 * 0 (the documented one, default): activation scales [k/128][n] with the row
 * index fastest, weight scales [rows/128][k/128 padded to 4].  Bit 0 makes the
 * activation scales [n][k/128], bit 1 the weight scales [k/128][rows/128
 * padded to 4]. */
void duet_cuda_fp8_act_scale_layout(duet_cuda_t *c, int variant);

#ifdef __cplusplus
}
#endif

#endif
