/* Incremental detokenizer.
 *
 * Bytes of each token go through the UTF-8 rule (duet_utf8_scan) at once: a
 * well-formed code point or a U+FFFD is appended to `hold`, and only a
 * well-formed but incomplete tail (at most three bytes) waits in `pend`.
 * After each token, `hold` is searched for stop strings; what cannot be the
 * start of a stop string is returned, the rest stays in `hold`.  Since no
 * stop string was complete before the token, a match found now ends inside
 * the token's text, and the match that ends first wins. */
#include "detok.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"

typedef struct {
    char *p;
    size_t len, cap;
} dbuf_t;

static int dbuf_add(dbuf_t *b, const void *s, size_t n)
{
    if (n > b->cap - b->len) {
        if (n > SIZE_MAX / 2 - b->len)
            return -1;
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len < n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np)
            return -1;
        b->p = np;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static void dbuf_drop(dbuf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

struct duet_detok {
    duet_detok_vocab_t vocab;
    int skip_special;
    char **stop;
    size_t *stop_len;
    size_t n_stop;
    uint8_t pend[4];        /* well-formed incomplete tail of the byte stream */
    size_t n_pend;
    dbuf_t hold;            /* decoded text not yet returned */
    dbuf_t out;             /* text returned by the last call */
    dbuf_t work;            /* scratch: pend + a token's bytes */
    size_t emitted;
    size_t n_tokens;
    int stopped, finished, broken;
    duet_detok_stop_t where;
};

int duet_utf8_scan(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    uint8_t b = s[0], lo = 0x80, hi = 0xbf;
    uint32_t c;
    size_t need;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b >= 0xc2 && b <= 0xdf) {
        need = 2;
        c = b & 0x1f;
    } else if (b >= 0xe0 && b <= 0xef) {
        need = 3;
        c = b & 0x0f;
        if (b == 0xe0)
            lo = 0xa0; /* no overlongs */
        if (b == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 4;
        c = b & 0x07;
        if (b == 0xf0)
            lo = 0x90; /* no overlongs */
        if (b == 0xf4)
            hi = 0x8f; /* nothing past U+10FFFF */
    } else {
        return -1; /* 80..C1, F5..FF never start a sequence */
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n)
            return 0;
        if (s[k] < lo || s[k] > hi)
            return -(int)k;
        lo = 0x80;
        hi = 0xbf;
        c = c << 6 | (s[k] & 0x3f);
    }
    *cp = c;
    return (int)need;
}

duet_status_t duet_detok_create(const duet_detok_vocab_t *vocab, const duet_detok_opts_t *opts, duet_detok_t **out)
{
    if (!vocab || !vocab->token_bytes || !out || (opts && opts->n_stop && !opts->stop))
        return DUET_ERR_INVALID;
    size_t n_stop = opts ? opts->n_stop : 0;
    for (size_t k = 0; k < n_stop; k++) {
        const char *s = opts->stop[k];
        size_t l = s ? strlen(s) : 0, i = 0;
        uint32_t cp;
        if (l == 0)
            return DUET_ERR_INVALID;
        while (i < l) {
            int r = duet_utf8_scan((const uint8_t *)s + i, l - i, &cp);
            if (r <= 0)
                return DUET_ERR_INVALID;
            i += (size_t)r;
        }
    }
    duet_detok_t *d = DUET_NEW(duet_detok_t);
    if (!d)
        return DUET_ERR_NOMEM;
    d->vocab = *vocab;
    d->skip_special = opts ? opts->skip_special_tokens : 0;
    d->where.stop_index = -1;
    if (n_stop) {
        d->stop = duet_calloc(n_stop, sizeof *d->stop);
        d->stop_len = duet_calloc(n_stop, sizeof *d->stop_len);
        if (!d->stop || !d->stop_len)
            goto oom;
        d->n_stop = n_stop;
        for (size_t k = 0; k < n_stop; k++) {
            if (!(d->stop[k] = duet_strdup(opts->stop[k])))
                goto oom;
            d->stop_len[k] = strlen(d->stop[k]);
        }
    }
    *out = d;
    return DUET_OK;
oom:
    duet_detok_destroy(&d);
    return DUET_ERR_NOMEM;
}

void duet_detok_destroy(duet_detok_t **dp)
{
    if (!dp || !*dp)
        return;
    duet_detok_t *d = *dp;
    for (size_t k = 0; d->stop && k < d->n_stop; k++)
        free(d->stop[k]);
    free(d->stop);
    free(d->stop_len);
    free(d->hold.p);
    free(d->out.p);
    free(d->work.p);
    free(d);
    *dp = NULL;
}

/* Decode work[0..len) into hold; a well-formed incomplete tail goes to pend
 * unless `final`, when it becomes U+FFFD. */
static int decode_into_hold(duet_detok_t *d, const uint8_t *s, size_t n, int final)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int r = duet_utf8_scan(s + i, n - i, &cp);
        if (r > 0) {
            /* runs of well-formed text are copied in one go */
            size_t j = i + (size_t)r;
            while (j < n && s[j] < 0x80)
                j++;
            if (dbuf_add(&d->hold, s + i, j - i) < 0)
                return -1;
            i = j;
        } else if (r < 0 || final) {
            if (dbuf_add(&d->hold, "\xef\xbf\xbd", 3) < 0)
                return -1;
            i += r < 0 ? (size_t)-r : n - i;
        } else {
            memcpy(d->pend, s + i, n - i);
            d->n_pend = n - i;
            return 0;
        }
    }
    d->n_pend = 0;
    return 0;
}

/* Look for a stop string in hold, return what is decided; token is the index
 * of the id whose text was just added. */
static int settle(duet_detok_t *d, size_t token)
{
    size_t best_end = SIZE_MAX, best_start = 0;
    int best = -1;
    if (d->hold.len == 0)
        return 0;
    for (size_t k = 0; k < d->n_stop; k++) {
        const char *hit = memmem(d->hold.p, d->hold.len, d->stop[k], d->stop_len[k]);
        if (!hit)
            continue;
        size_t start = (size_t)(hit - d->hold.p), end = start + d->stop_len[k];
        /* first to end wins; at the same end the longer one (earlier start) */
        if (end < best_end || (end == best_end && start < best_start)) {
            best_end = end;
            best_start = start;
            best = (int)k;
        }
    }
    if (best >= 0) {
        if (dbuf_add(&d->out, d->hold.p, best_start) < 0)
            return -1;
        d->emitted += best_start;
        d->hold.len = 0;
        d->stopped = 1;
        d->where.stop_index = best;
        d->where.text_offset = d->emitted;
        d->where.token_index = token;
        return 0;
    }
    /* Hold back the earliest suffix that is a proper prefix of a stop string. */
    size_t keep = d->hold.len;
    for (size_t k = 0; k < d->n_stop; k++) {
        size_t l = d->stop_len[k];
        size_t from = d->hold.len >= l ? d->hold.len - l + 1 : 0;
        for (size_t i = from; i < keep; i++)
            if (memcmp(d->hold.p + i, d->stop[k], d->hold.len - i) == 0) {
                keep = i;
                break;
            }
    }
    if (dbuf_add(&d->out, d->hold.p, keep) < 0)
        return -1;
    d->emitted += keep;
    dbuf_drop(&d->hold, keep);
    return 0;
}

duet_status_t duet_detok_feed(duet_detok_t *d, const int32_t *ids, size_t n, const char **text, size_t *len)
{
    duet_status_t st = DUET_OK;
    if (!d || (!ids && n))
        return DUET_ERR_INVALID;
    d->out.len = 0;
    if (text)
        *text = "";
    if (len)
        *len = 0;
    if (d->broken)
        return DUET_ERR_NOMEM;
    if (d->finished)
        return DUET_ERR_STATE;
    for (size_t t = 0; t < n && !d->stopped; t++) {
        size_t bl = 0;
        const uint8_t *b = d->vocab.token_bytes(d->vocab.arg, ids[t], &bl);
        if (!b) {
            st = DUET_ERR_RANGE;
            break;
        }
        size_t index = d->n_tokens++;
        if (d->skip_special && d->vocab.is_special && d->vocab.is_special(d->vocab.arg, ids[t]))
            continue;
        d->work.len = 0;
        if (dbuf_add(&d->work, d->pend, d->n_pend) < 0 || dbuf_add(&d->work, b, bl) < 0 ||
            decode_into_hold(d, (const uint8_t *)d->work.p, d->work.len, 0) < 0 || settle(d, index) < 0) {
            d->broken = 1;
            return DUET_ERR_NOMEM;
        }
    }
    if (text)
        *text = d->out.len ? d->out.p : "";
    if (len)
        *len = d->out.len;
    return st;
}

duet_status_t duet_detok_finish(duet_detok_t *d, const char **text, size_t *len)
{
    if (!d)
        return DUET_ERR_INVALID;
    d->out.len = 0;
    if (text)
        *text = "";
    if (len)
        *len = 0;
    if (d->broken)
        return DUET_ERR_NOMEM;
    if (d->finished)
        return DUET_ERR_STATE;
    d->finished = 1;
    if (d->stopped)
        return DUET_OK;
    uint8_t pend[4];
    size_t np = d->n_pend;
    memcpy(pend, d->pend, np);
    if (decode_into_hold(d, pend, np, 1) < 0 || settle(d, d->n_tokens ? d->n_tokens - 1 : 0) < 0 ||
        (!d->stopped && dbuf_add(&d->out, d->hold.p, d->hold.len) < 0)) {
        d->broken = 1;
        return DUET_ERR_NOMEM;
    }
    if (!d->stopped) {
        d->emitted += d->hold.len;
        d->hold.len = 0;
    }
    if (text)
        *text = d->out.len ? d->out.p : "";
    if (len)
        *len = d->out.len;
    return DUET_OK;
}

int duet_detok_stopped(const duet_detok_t *d, duet_detok_stop_t *where)
{
    if (!d)
        return 0;
    if (where)
        *where = d->where;
    return d->stopped;
}

size_t duet_detok_emitted(const duet_detok_t *d) { return d ? d->emitted : 0; }
