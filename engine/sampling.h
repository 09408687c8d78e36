/* Token sampling.  The random draw for a token is a pure function of the
 * request seed and the token's position (DESIGN §2), so a request yields the
 * same tokens whichever process samples each of them. */
#ifndef DUET_SAMPLING_H
#define DUET_SAMPLING_H

#include <stdint.h>

typedef struct {
    float temperature; /* <= 0: greedy */
    float top_p;       /* (0, 1]; 1: off */
    int top_k;         /* 0: off */
    float min_p;       /* [0, 1); 0: off */
    uint64_t seed;
} duet_sampling_t;

/* Defaults: greedy, no filters, seed 0. */
void duet_sampling_default(duet_sampling_t *s);

/* Uniform [0, 1) draw for (seed, position): splitmix64 of the pair. */
double duet_sample_uniform(uint64_t seed, int64_t position);
/* The same draw as an integer below 2^53: duet_sample_uniform() * 2^53, exactly (what a draw
 * compares, and what duet_cuda_sample takes). */
uint64_t duet_sample_draw53(uint64_t seed, int64_t position);

/* Pick a token from logits(vocab) for the token at `position`.  Greedy takes
 * the largest logit (lowest id on ties).  Otherwise: logits / temperature,
 * top-k, softmax (p = duet_sample_exp(logit / temperature - the largest),
 * engine/sample_exp.h: the same bits on the host and a GPU), min-p (p >= min_p *
 * p_max, compared in double), top-p
 * (smallest prefix of the probability-sorted list whose mass reaches top_p),
 * then the draw u * S over what remains in (probability desc, id asc) order.
 * Candidates whose probability is below 1e-9 of the largest are dropped first
 * (their total mass is below vocab * 1e-9).  The masses are exact sums (each
 * probability a float, a multiple of 2^-53; summed as integers), so the result
 * depends on no summation order: the rule is the same everywhere and results
 * stay reproducible. */
int32_t duet_sample(const float *logits, int vocab, const duet_sampling_t *s, int64_t position);

/* duet_sample for n rows (row i: logits + i * vocab, sp[i], positions[i]) into out[i], on up
 * to max_threads threads (rows are independent, so the result is the same as n calls in
 * order; 1 or fewer: the calling thread alone).  A sampled row over a flat distribution costs
 * a millisecond or more, so a decode step of many rows spreads them over the host's cores. */
void duet_sample_batch(const float *logits, int vocab, int n, const duet_sampling_t *const *sp,
                       const int64_t *positions, int32_t *out, int max_threads);

#endif
