/* Fuzz target: the streaming detokenizer on a fake vocabulary (ids 0..255
 * are single bytes, 256..263 multi-byte and special tokens, 264.. unknown).
 * Input: a flags byte (bit 0 skip_special_tokens, bits 1-2 the number of stop
 * strings, bits 3-7 a chunk size), each stop string as a length byte and its
 * bytes, then ids as big-endian 16-bit values.  Feeding in chunks must give
 * the same text and stop as feeding one id at a time; the text must be valid
 * UTF-8, hold no stop string, and be the stop-free text cut where the stop
 * string begins. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "detok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_MULTI 8
#define VOCAB (256 + N_MULTI)

static uint8_t bytes1[256];
static const char *const multi[N_MULTI] = {
    "Hello", " world", "\xe4\xb8\xad", "<think>", "\xf0\x9f", "\x98\x80", "</\357\275\234DSML\357\275\234", "\n\n",
};

static const uint8_t *vb(void *arg, int32_t id, size_t *len)
{
    (void)arg;
    if (id < 0 || id >= VOCAB)
        return NULL;
    if (id < 256) {
        *len = 1;
        return &bytes1[id];
    }
    *len = strlen(multi[id - 256]);
    return (const uint8_t *)multi[id - 256];
}

static int vs(void *arg, int32_t id)
{
    (void)arg;
    return id == 259 || id == 262;
}

typedef struct {
    char *s;
    size_t len;
    int stopped;
    duet_detok_stop_t where;
} res_t;

static void append(res_t *r, const char *t, size_t l)
{
    if (!l)
        return;
    if (!(r->s = realloc(r->s, r->len + l + 1)))
        abort();
    memcpy(r->s + r->len, t, l);
    r->len += l;
    r->s[r->len] = '\0';
}

static void run(res_t *r, const int32_t *ids, size_t n, size_t chunk, int skip, const char *const *stop, size_t nstop)
{
    static const duet_detok_vocab_t vocab = {vb, vs, NULL};
    duet_detok_opts_t o = {.skip_special_tokens = skip, .stop = stop, .n_stop = nstop};
    duet_detok_t *d = NULL;
    const char *t;
    size_t l;
    memset(r, 0, sizeof *r);
    if (!(r->s = calloc(1, 1)))
        abort();
    if (duet_detok_create(&vocab, &o, &d) != DUET_OK)
        abort();
    for (size_t at = 0; at < n;) {
        size_t k = chunk && n - at > chunk ? chunk : n - at;
        if (duet_detok_feed(d, ids + at, k, &t, &l) != DUET_OK)
            abort();
        append(r, t, l);
        at += k;
    }
    if (duet_detok_finish(d, &t, &l) != DUET_OK)
        abort();
    append(r, t, l);
    if (duet_detok_emitted(d) != r->len)
        abort();
    r->stopped = duet_detok_stopped(d, &r->where);
    duet_detok_destroy(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int b = 0; b < 256; b++)
        bytes1[b] = (uint8_t)b;
    if (size < 1)
        return 0;
    int skip = data[0] & 1;
    size_t nstop = (data[0] >> 1) & 3, chunk = (size_t)(data[0] >> 3), at = 1;
    char stops[3][17];
    const char *sp[3];
    size_t ns = 0;
    for (size_t k = 0; k < nstop && at < size; k++) {
        size_t l = data[at++] % 16 + 1;
        if (l > size - at)
            l = size - at;
        memcpy(stops[ns], data + at, l);
        stops[ns][l] = '\0';
        at += l;
        /* only valid, non-empty UTF-8 stop strings are accepted */
        size_t sl = strlen(stops[ns]), i = 0;
        uint32_t cp;
        int r = 0;
        while (i < sl && (r = duet_utf8_scan((const uint8_t *)stops[ns] + i, sl - i, &cp)) > 0)
            i += (size_t)r;
        duet_detok_t *d = NULL;
        static const duet_detok_vocab_t vocab = {vb, vs, NULL};
        duet_detok_opts_t o = {.stop = (const char *const[]){stops[ns]}, .n_stop = 1};
        duet_status_t st = duet_detok_create(&vocab, &o, &d);
        if ((st == DUET_OK) != (sl > 0 && i == sl))
            abort();
        duet_detok_destroy(&d);
        if (st == DUET_OK) {
            sp[ns] = stops[ns];
            ns++;
        }
    }
    size_t n = (size - at) / 2;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return 0;
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t id = (int32_t)((data[at + 2 * k] << 8 | data[at + 2 * k + 1]) % (VOCAB + 4));
        if (id < VOCAB)
            ids[m++] = id;
    }
    res_t one, chunked, plain;
    run(&one, ids, m, 1, skip, sp, ns);
    run(&chunked, ids, m, chunk, skip, sp, ns);
    run(&plain, ids, m, 0, skip, NULL, 0);
    if (one.len != chunked.len || memcmp(one.s, chunked.s, one.len) != 0 || one.stopped != chunked.stopped ||
        one.where.stop_index != chunked.where.stop_index || one.where.text_offset != chunked.where.text_offset ||
        one.where.token_index != chunked.where.token_index)
        abort();
    /* valid UTF-8 */
    for (size_t i = 0; i < one.len;) {
        uint32_t cp;
        int r = duet_utf8_scan((const uint8_t *)one.s + i, one.len - i, &cp);
        if (r <= 0)
            abort();
        i += (size_t)r;
    }
    for (size_t k = 0; k < ns; k++)
        if (memmem(one.s, one.len, sp[k], strlen(sp[k])))
            abort();
    if (one.stopped) {
        const char *st = sp[one.where.stop_index];
        if (one.where.text_offset != one.len || one.len + strlen(st) > plain.len ||
            memcmp(plain.s, one.s, one.len) != 0 || memcmp(plain.s + one.len, st, strlen(st)) != 0 ||
            one.where.token_index >= m)
            abort();
    } else if (one.len != plain.len || memcmp(one.s, plain.s, one.len) != 0) {
        abort();
    }
    /* an unknown id is refused and changes nothing */
    {
        static const duet_detok_vocab_t vocab = {vb, vs, NULL};
        duet_detok_t *d = NULL;
        const char *t;
        size_t l;
        int32_t bad = VOCAB;
        if (duet_detok_create(&vocab, NULL, &d) != DUET_OK || duet_detok_feed(d, &bad, 1, &t, &l) != DUET_ERR_RANGE ||
            l != 0)
            abort();
        duet_detok_destroy(&d);
    }
    free(one.s);
    free(chunked.s);
    free(plain.s);
    free(ids);
    return 0;
}
