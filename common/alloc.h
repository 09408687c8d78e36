/* Checked allocation: failures are reported as DUET_ERR_NOMEM by callers, or
 * abort with a message where recovery is impossible (the *_or_die forms are
 * for tools only, never for servers). */
#ifndef DUET_ALLOC_H
#define DUET_ALLOC_H

#include <stddef.h>

/* calloc(n, size) with overflow check; NULL on failure. */
void *duet_calloc(size_t n, size_t size);
/* malloc(n * size) with overflow check; NULL on failure. */
void *duet_malloc_array(size_t n, size_t size);
/* 64-byte aligned, zeroed allocation of n*size bytes; free with duet_free_aligned. */
void *duet_alloc_aligned(size_t n, size_t size);
void duet_free_aligned(void *p);
/* strdup that returns NULL on failure (and for NULL input). */
char *duet_strdup(const char *s);

/* Multiply with overflow detection: returns 0 and writes *out, or -1 on overflow. */
int duet_mul_size(size_t a, size_t b, size_t *out);

#define DUET_NEW(type) ((type *)duet_calloc(1, sizeof(type)))

#endif
