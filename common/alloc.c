#include "alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int duet_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return -1;
    *out = a * b;
    return 0;
}

void *duet_calloc(size_t n, size_t size)
{
    size_t total;
    if (duet_mul_size(n, size, &total) < 0)
        return NULL;
    return calloc(total ? n : 1, total ? size : 1);
}

void *duet_malloc_array(size_t n, size_t size)
{
    size_t total;
    if (duet_mul_size(n, size, &total) < 0)
        return NULL;
    return malloc(total ? total : 1);
}

void *duet_alloc_aligned(size_t n, size_t size)
{
    size_t total;
    if (duet_mul_size(n, size, &total) < 0)
        return NULL;
    total = (total + 63) & ~(size_t)63;
    if (total == 0)
        total = 64;
    void *p = aligned_alloc(64, total);
    if (p)
        memset(p, 0, total);
    return p;
}

void duet_free_aligned(void *p) { free(p); }

char *duet_strdup(const char *s) { return s ? strdup(s) : NULL; }
