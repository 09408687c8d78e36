/* The CPU reference run shared by duet-check-forward and duet-check-sensitivity: the
 * same seeded prompts, the CPU engine run greedily on each (threads over prompts), its
 * logits and tokens kept for comparison. */
#ifndef DUET_TOOLS_FWD_REF_H
#define DUET_TOOLS_FWD_REF_H

#include <stddef.h>
#include <stdint.h>

#include "forward.h"
#include "kv_cache.h"
#include "model.h"

uint64_t fwd_mix64(uint64_t x);
/* Index of the largest value (NaN skipped; ties: lowest index). */
int32_t fwd_argmax(const float *v, int n);
/* ||a - ref||² / ||ref||² in double (||a - ref||² when ref is all zero). */
double fwd_nmse(const float *a, const float *ref, size_t n);
int fwd_cmp_double(const void *x, const void *y);
/* --kv-dtype / --index-k-dtype: "fp8" or "bf16" into o; -1 for anything else. */
int fwd_cache_dtype_opt(const char *s, int kv, duet_cache_opts_t *o);
/* Prompt i of a seeded set: its length (1..511 for the first 20) and its token ids (2..vocab-1). */
int fwd_prompt_len(int i, uint64_t seed);
int32_t *fwd_make_prompt(int i, int len, int vocab, uint64_t seed);

/* n_prompts prompts, each prefilled then decoded for n_tokens greedy steps on the CPU.
 * force == NULL: the engine's own greedy tokens go into gen[i] and the step logits into
 * logits[i] ((n_tokens, vocab) each).  force != NULL: teacher forcing -- step s feeds
 * force[i][s - 1] -- and each step's logits go to on_step(arg, i, s, logits) instead (gen and
 * logits unused).  Returns 0, or 2 after printing why a prompt failed. */
typedef void (*fwd_step_fn)(void *arg, int prompt, int step, const float *logits);
int fwd_cpu_run(const duet_model_t *m, const duet_cache_opts_t *opts, int n_prompts, int n_tokens,
                int32_t *const *prompts, const int *lens, int32_t **gen, float **logits, int32_t *const *force,
                fwd_step_fn on_step, void *arg);

#endif
