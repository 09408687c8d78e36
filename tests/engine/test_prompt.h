/* Pseudo-random prompts for the engine tests: n ids below vocab, a xorshift stream from seed. */
#ifndef DUET_TEST_PROMPT_H
#define DUET_TEST_PROMPT_H

#include <stdint.h>

static inline void make_prompt(int32_t *ids, int n, uint64_t seed, int vocab)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

#endif
