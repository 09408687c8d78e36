/* The compressor's state rows on the GPU (the CPU engine's compressor_run,
 * around compress_pool).  A compressor projects each token to kv and gate
 * rows of width = coff*dim; a ring of `ring` state rows per request slot
 * (stride floats a row, the compressor's part at row_off) keeps what later
 * windows still need, as [kv (width) | gate + ape (width)].
 *
 * duet_cuda_comp_gather builds the pooling input of closing windows: slot
 * descriptor i (n of them, n_slots per entry, in the CPU's slot order) gives
 * kv_out / gate_out row i (dim floats) from
 *   row >= 0   the projections of this call: pkv/pgate row `row`, columns
 *              half*dim.., gate + ape[pos % ratio] (the CPU's single add);
 *   row == -1  the state ring: slot `slot`, row pos % ring, columns half*dim..;
 *   row == -2  an absent slot (C4's first window has no overlap half): kv 0 and
 *              gate -inf, which compress_pool ignores exactly as the CPU's
 *              shorter slot list.
 * duet_cuda_comp_state_write then stores projection rows into the ring
 * (descriptor: row, slot, pos).  Gather before writing: a chunk longer than
 * the ring overwrites rows its own windows read.  Bit-exact copies and adds. */
#ifndef DUET_CUDA_COMPRESS_ROWS_CUH
#define DUET_CUDA_COMPRESS_ROWS_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int32_t row;  /* projection row, -1 state ring, -2 absent */
    int32_t slot; /* request slot (state ring) */
    int32_t pos;  /* token position */
    int32_t half; /* column half: 0 (cols [0, dim)) or 1 (cols [dim, 2*dim)) */
} duet_comp_slot_t;

typedef struct {
    int ratio, ring;        /* window length, ring rows */
    int dim, width;         /* pooled width, projection width (coff*dim) */
    int stride, row_off;    /* floats per state row, this compressor's offset in it */
    size_t slot_floats;     /* floats per request slot (layout page_bytes / 4) */
} duet_comp_geom_t;

duet_status_t duet_cuda_comp_gather(duet_cuda_t *c, const duet_comp_geom_t *g, const float *state, const float *pkv,
                                    const float *pgate, const float *ape, const duet_comp_slot_t *desc, int n,
                                    float *kv_out, float *gate_out);
duet_status_t duet_cuda_comp_state_write(duet_cuda_t *c, const duet_comp_geom_t *g, float *state, const float *pkv,
                                         const float *pgate, const float *ape, const duet_comp_slot_t *desc, int n);

#ifdef __cplusplus
}
#endif

#endif
