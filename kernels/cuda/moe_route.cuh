/* MoE routing and combination on the GPU, with no host round trip.
 *
 *   moe_route    per row: scores from the gate logits (sqrt-softplus, sigmoid or
 *                softmax: forward.c's moe()), the top-k of score + bias (descending
 *                value, then ascending index; NaN as -inf; ids written ascending, as
 *                duet_cpu_topk) or, on hash layers, tid2eid[token]; the weights
 *                score / (sum of the selected scores + 1e-20) when norm_topk_prob,
 *                times routed_scale, summed in the ids' order.  Expert ids are the
 *                CPU's and the weights too: the exponential and log(1 + y) are
 *                ref_math.h's on both, the other steps the CPU's IEEE operations in
 *                its order (both checked bit for bit).
 *   moe_sort     a counting sort of the (row, k) assignments by expert id, in one
 *                block: offs (E+1), tile prefix sums for 8-token, wide
 *                (duet_cuda_moe_wide_tile tokens: 32) and 64-token tiles
 *                (duet_cuda_moe_wg_tile)
 *                (duet_cuda_moe_plan_t, matmul.cuh), xrow (the row of each sorted
 *                position, ascending rows within an expert) and pos (the sorted position
 *                of assignment r*K + j; -1 for an id outside [0, E)).  Deterministic.
 *                The assignments are counted and placed in up to 32 segments at once
 *                (fewer for small batches or many experts); n_experts <= 12160.
 *   moe_combine  out[r] = sum over r's assignments in ascending expert id (then k) of
 *                y[pos] * w, from +0, then + shared[r] when shared is not NULL: the CPU's
 *                order of accumulation, each step one IEEE multiply and one add (no
 *                fused multiply-add), so with the same inputs bit-exact with forward.c. */
#ifndef DUET_CUDA_MOE_ROUTE_CUH
#define DUET_CUDA_MOE_ROUTE_CUH

#include "duet_cuda.h"

#define DUET_CUDA_MOE_MAX_K 32

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_experts, top_k;   /* top_k <= min(n_experts, DUET_CUDA_MOE_MAX_K) */
    int scoring;            /* duet_score_fn_t: DUET_SCORE_SOFTMAX, _SIGMOID, _SQRTSOFTPLUS */
    int norm_topk_prob;
    float routed_scale;
    const float *bias;      /* (E) device, or NULL (no bias) */
    const int32_t *tid2eid; /* (vocab, top_k) device on hash layers, else NULL */
    const int32_t *tok;     /* (rows) device token ids (hash layers) */
    int vocab;
} duet_cuda_moe_route_t;

/* logits (n_rows, E) -> sel (n_rows, K) expert ids, wt (n_rows, K) weights. */
duet_status_t duet_cuda_moe_route(duet_cuda_t *c, const duet_cuda_moe_route_t *p, const float *logits, int n_rows,
                                  int32_t *sel, float *wt);
/* Tokens a wide tile holds (the second tile prefix sums of moe_sort). */
int duet_cuda_moe_wide_tile(void);
/* Tokens a tile of the 64-token launches holds (the third). */
int duet_cuda_moe_wg_tile(void);
/* Rows of moe_sort's tile prefix sums: 8-token, wide and 64-token tiles. */
#define DUET_CUDA_MOE_TILE_ROWS 3
/* sel (n_rows, K) -> offs (E+1), tiles (DUET_CUDA_MOE_TILE_ROWS, E+1), xrow (n_rows*K), pos (n_rows*K). */
duet_status_t duet_cuda_moe_sort(duet_cuda_t *c, const int32_t *sel, int n_rows, int top_k, int n_experts,
                                 int32_t *offs, int32_t *tiles, int32_t *xrow, int32_t *pos);
/* y (n_rows*K, dim) in sorted order; shared (n_rows, dim) or NULL; out (n_rows, dim). */
duet_status_t duet_cuda_moe_combine(duet_cuda_t *c, const int32_t *sel, const float *wt, const int32_t *pos,
                                    int n_rows, int top_k, const float *y, const float *shared, int dim, float *out);
/* Tensor parallelism (rank r holds experts [e0, e1) = [r*E/T, (r+1)*E/T)):
 *   moe_tiles_own  restricts moe_sort's tile prefix sums (DUET_CUDA_MOE_TILE_ROWS, E+1), in place, to experts [e0, e1):
 *                  duet_cuda_matmul_grouped then computes this rank's experts only, each at its
 *                  usual sorted positions;
 *   moe_pick       y (n_assign, dim) = for each sorted position p, row p of the all-gathered
 *                  recv (n_ranks, n_assign, dim) of the rank that holds p's expert (offs from
 *                  moe_sort).  dim % 4 == 0.  Copies: bit-exact. */
duet_status_t duet_cuda_moe_tiles_own(duet_cuda_t *c, int32_t *tiles, int n_experts, int e0, int e1);
duet_status_t duet_cuda_moe_pick(duet_cuda_t *c, float *y, const float *recv, int n_assign, int dim,
                                 const int32_t *offs, int n_experts, int n_ranks);

#ifdef __cplusplus
}
#endif

#endif
