/* Sampling on the GPU: for each row given, the token duet_sample() (engine/sampling.h) picks
 * from that row of logits(rows, vocab), bit for bit: the same probabilities (duet_sample_exp,
 * engine/sample_exp.h, the same function on both sides), the same order (probability
 * descending, id ascending) and the same exact sums, so the same top-k, min-p and top-p cuts and
 * the same draw.  Greedy rows (temperature <= 0, or NaN) take the argmax.
 *
 * A cluster of up to 8 blocks a row (one block when the rows fill the SMs).  Where the host
 * sorts the buckets a cut falls in, the kernel finds each cut by a radix search over the
 * probabilities' bits with a count and an exact sum per bin (three levels: 11, 9 and 8 bits),
 * and ties by id; since every sum is exact, a cut is the same whatever order its terms are
 * added in.  The rows' keys go to the context's scratch (vocab * 4 bytes a row). */
#ifndef DUET_CUDA_SAMPLE_CUH
#define DUET_CUDA_SAMPLE_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One row to draw: its logits row, its sampling parameters (duet_sampling_t's, with the seed and
 * position reduced to the draw u) and where its token goes. */
typedef struct {
    int32_t row;       /* logits + row * vocab */
    float temperature; /* <= 0 or NaN: greedy */
    float top_p;       /* off outside (0, 1) */
    float min_p;       /* off unless > 0 */
    int32_t top_k;     /* off unless > 0 */
    int32_t out;       /* the token goes to out[this] */
    uint64_t u;        /* duet_sample_draw53(seed, position): an integer below 2^53 */
} duet_cuda_sample_row_t;

/* The largest vocabulary: a bin's count and sum share a 64-bit word (sample.cu). */
#define DUET_CUDA_SAMPLE_MAX_VOCAB (1 << 18)

/* rows: n host structs (copied before the call returns); out: device int32s. */
duet_status_t duet_cuda_sample(duet_cuda_t *c, const float *logits, int vocab, const duet_cuda_sample_row_t *rows,
                               int n, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif
