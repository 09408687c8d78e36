#include "hash.h"

#include <string.h>
#include <xxhash.h>

uint64_t duet_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

duet_hasher_t *duet_hasher_create(uint64_t seed)
{
    XXH3_state_t *st = XXH3_createState();
    if (st)
        XXH3_64bits_reset_withSeed(st, seed);
    return (duet_hasher_t *)st;
}

void duet_hasher_update(duet_hasher_t *h, const void *data, size_t len)
{
    XXH3_64bits_update((XXH3_state_t *)h, data, len);
}

void duet_hasher_u64(duet_hasher_t *h, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    duet_hasher_update(h, b, 8);
}

void duet_hasher_str(duet_hasher_t *h, const char *s)
{
    size_t n = strlen(s);
    duet_hasher_u64(h, n);
    duet_hasher_update(h, s, n);
}

uint64_t duet_hasher_digest(const duet_hasher_t *h) { return XXH3_64bits_digest((const XXH3_state_t *)h); }

void duet_hasher_destroy(duet_hasher_t **h)
{
    if (h && *h) {
        XXH3_freeState((XXH3_state_t *)*h);
        *h = NULL;
    }
}
