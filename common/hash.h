/* xxh3 hashing (libxxhash): page checksums, layout fingerprints, prefix keys. */
#ifndef DUET_HASH_H
#define DUET_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t duet_hash64(const void *data, size_t len, uint64_t seed);

/* Incremental form for fingerprints over several fields. */
typedef struct duet_hasher duet_hasher_t;
duet_hasher_t *duet_hasher_create(uint64_t seed);
void duet_hasher_update(duet_hasher_t *h, const void *data, size_t len);
void duet_hasher_u64(duet_hasher_t *h, uint64_t v);
void duet_hasher_str(duet_hasher_t *h, const char *s);
uint64_t duet_hasher_digest(const duet_hasher_t *h);
void duet_hasher_destroy(duet_hasher_t **h);

#endif
