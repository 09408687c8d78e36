/* DSML streaming parser, strict JSON canonicalizer and DSML encoder.
 *
 * The parser keeps the bytes it has not yet decided in one buffer `in`.  In
 * text modes (reasoning, content) that buffer holds only a possible tag start
 * that was held back.  In block mode it holds the current unit: from the start
 * of the block (or the end of the last reported call) to what has arrived,
 * and `pos` is the parse cursor inside it.  Every decision is a function of
 * the bytes of the unit alone (never of where a piece ended), which is what
 * makes streamed and one-shot parsing agree; in block mode the parser never
 * looks past the unit's first max_block_bytes bytes, so even the size limit
 * fires at the same place however the text was split. */
#include "dsml.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "detok.h"

/* ---------------------------------------------------------------- buffers */

typedef struct {
    char *p;
    size_t len, cap;
} sbuf_t;

static int sbuf_reserve(sbuf_t *b, size_t extra)
{
    if (extra <= b->cap - b->len)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return -1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < extra)
        cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np)
        return -1;
    b->p = np;
    b->cap = cap;
    return 0;
}

static int sbuf_add(sbuf_t *b, const void *s, size_t n)
{
    if (sbuf_reserve(b, n + 1) < 0)
        return -1;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static int sbuf_str(sbuf_t *b, const char *s) { return sbuf_add(b, s, strlen(s)); }

static void sbuf_drop(sbuf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
    if (b->p)
        b->p[b->len] = '\0';
}

static void sbuf_free(sbuf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---------------------------------------------------------------- markup */

#define BAR "\xef\xbd\x9c" /* U+FF5C FULLWIDTH VERTICAL LINE */
#define DSML_TOK BAR "DSML" BAR
#define MK_OPEN "<" DSML_TOK
#define MK_CLOSE "</" DSML_TOK
#define MK_OPEN_LEN (sizeof MK_OPEN - 1)
#define MK_CLOSE_LEN (sizeof MK_CLOSE - 1)
#define THINK_END "</think>"

#define TAG_MAX_BYTES 4096
#define TAG_NAME_MAX 32
#define ATTR_VALUE_MAX 1024
#define JSON_MAX_DEPTH 128

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Earliest occurrence in s[0..n) of any marker; returns its offset (n when
 * none) and the marker's index in *which. */
static size_t find_first(const char *s, size_t n, const char *const *mk, size_t nmk, int *which)
{
    size_t best = n;
    *which = -1;
    for (size_t k = 0; k < nmk; k++) {
        const char *hit = memmem(s, n, mk[k], strlen(mk[k]));
        if (hit && (size_t)(hit - s) < best) {
            best = (size_t)(hit - s);
            *which = (int)k;
        }
    }
    return best;
}

/* Smallest i such that s[i..n) is a proper prefix of some marker (n if none):
 * the text from i on must be held back. */
static size_t holdback_start(const char *s, size_t n, const char *const *mk, size_t nmk)
{
    size_t maxlen = 0;
    for (size_t k = 0; k < nmk; k++)
        if (strlen(mk[k]) > maxlen)
            maxlen = strlen(mk[k]);
    size_t i = n >= maxlen ? n - maxlen + 1 : 0;
    for (; i < n; i++)
        for (size_t k = 0; k < nmk; k++) {
            size_t ml = strlen(mk[k]);
            if (n - i < ml && memcmp(s + i, mk[k], n - i) == 0)
                return i;
        }
    return n;
}

/* Copy `s` for a message: valid UTF-8 kept, other bytes and controls become
 * '?', cut to about `cap` bytes. */
static void sanitize(char *dst, size_t cap, const char *s, size_t n)
{
    size_t o = 0, i = 0;
    while (i < n && o + 8 < cap) {
        uint32_t cp;
        int r = duet_utf8_scan((const uint8_t *)s + i, n - i, &cp);
        if (r > 0 && cp >= 0x20 && cp != 0x7f) {
            memcpy(dst + o, s + i, (size_t)r);
            o += (size_t)r;
            i += (size_t)r;
        } else {
            dst[o++] = '?';
            i += r > 0 ? (size_t)r : r < 0 ? (size_t)-r : n - i;
        }
    }
    if (i < n && o + 4 <= cap) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
}

/* ------------------------------------------------------------------ JSON */

enum { JT_NULL, JT_BOOL, JT_INT, JT_NUM, JT_STR, JT_ARR, JT_OBJ };

static const char *jt_name(int t)
{
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
    return names[t];
}

/* Append `s` as a JSON string in canonical form: \" \\ \n \r \t \b \f, other
 * controls as \u00xx, everything else as is; ill-formed UTF-8 becomes U+FFFD. */
static int json_escape(sbuf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (sbuf_reserve(b, n + 3) < 0 || sbuf_add(b, "\"", 1) < 0)
        return -1;
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        const char *w = e;
        size_t wl = 2;
        uint32_t cp;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            size_t j = i;
            while (j < n && (unsigned char)s[j] >= 0x20 && (unsigned char)s[j] < 0x80 && s[j] != '"' &&
                   s[j] != '\\')
                j++;
            if (sbuf_add(b, s + i, j - i) < 0)
                return -1;
            i = j;
            continue;
        }
        if (c >= 0x80) {
            int r = duet_utf8_scan((const uint8_t *)s + i, n - i, &cp);
            if (r > 0) {
                w = s + i;
                wl = (size_t)r;
                i += (size_t)r;
            } else {
                w = "\xef\xbf\xbd";
                wl = 3;
                i += r < 0 ? (size_t)-r : n - i;
            }
        } else {
            e[0] = '\\';
            switch (c) {
            case '"': e[1] = '"'; break;
            case '\\': e[1] = '\\'; break;
            case '\n': e[1] = 'n'; break;
            case '\r': e[1] = 'r'; break;
            case '\t': e[1] = 't'; break;
            case '\b': e[1] = 'b'; break;
            case '\f': e[1] = 'f'; break;
            default:
                memcpy(e + 1, "u00", 3);
                e[4] = hex[c >> 4];
                e[5] = hex[c & 15];
                wl = 6;
            }
            i++;
        }
        if (sbuf_add(b, w, wl) < 0)
            return -1;
    }
    return sbuf_add(b, "\"", 1);
}

/* Inverse of json_escape on its own output (without the quotes). */
static int json_unescape_canonical(sbuf_t *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            i++;
            switch (s[i]) {
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u':
                c = (char)strtol((char[]){s[i + 3], s[i + 4], 0}, NULL, 16);
                i += 4;
                break;
            default: c = s[i];
            }
        }
        if (sbuf_add(b, &c, 1) < 0)
            return -1;
    }
    return 0;
}

typedef struct {
    char *key;          /* decoded, NUL-terminated (may hold NUL bytes) */
    size_t key_len;
    int type;
    size_t val_off, val_len; /* canonical value text in the parser's output */
} jmember_t;

typedef struct {
    const char *s;
    size_t n, i;
    sbuf_t *out;        /* canonical text */
    sbuf_t dec;         /* scratch: decoded string */
    int nomem;
    char msg[160];
    jmember_t *mem;     /* top-level object members, when asked for */
    size_t n_mem, cap_mem;
} jp_t;

static int jp_fail(jp_t *j, const char *what)
{
    if (!j->msg[0])
        snprintf(j->msg, sizeof j->msg, "%s at offset %zu", what, j->i);
    return -1;
}

static int jp_oom(jp_t *j)
{
    j->nomem = 1;
    return jp_fail(j, "out of memory");
}

static void jp_ws(jp_t *j)
{
    while (j->i < j->n && is_ws((unsigned char)j->s[j->i]))
        j->i++;
}

static int hex4(const char *s, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* String at j->i (on the opening quote): decoded into j->dec, canonical form
 * appended to j->out. */
static int jp_string(jp_t *j)
{
    j->dec.len = 0;
    j->i++;
    for (;;) {
        if (j->i >= j->n)
            return jp_fail(j, "unterminated string");
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') {
            j->i++;
            break;
        }
        if (c < 0x20)
            return jp_fail(j, "control character in string");
        if (c == '\\') {
            if (j->i + 1 >= j->n)
                return jp_fail(j, "unterminated string");
            char e = j->s[j->i + 1], o[4];
            size_t ol = 1;
            j->i += 2;
            switch (e) {
            case '"': o[0] = '"'; break;
            case '\\': o[0] = '\\'; break;
            case '/': o[0] = '/'; break;
            case 'b': o[0] = '\b'; break;
            case 'f': o[0] = '\f'; break;
            case 'n': o[0] = '\n'; break;
            case 'r': o[0] = '\r'; break;
            case 't': o[0] = '\t'; break;
            case 'u': {
                uint32_t cp, lo;
                if (j->n - j->i < 4 || hex4(j->s + j->i, &cp) < 0)
                    return jp_fail(j, "bad \\u escape");
                j->i += 4;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return jp_fail(j, "lone low surrogate");
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (j->n - j->i < 6 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u' ||
                        hex4(j->s + j->i + 2, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
                        return jp_fail(j, "lone high surrogate");
                    j->i += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                ol = put_utf8(o, cp);
                break;
            }
            default: return jp_fail(j, "bad escape");
            }
            if (sbuf_add(&j->dec, o, ol) < 0)
                return jp_oom(j);
            continue;
        }
        size_t k = 1;
        if (c >= 0x80) {
            uint32_t cp;
            int r = duet_utf8_scan((const uint8_t *)j->s + j->i, j->n - j->i, &cp);
            if (r <= 0)
                return jp_fail(j, "invalid UTF-8 in string");
            k = (size_t)r;
        }
        if (sbuf_add(&j->dec, j->s + j->i, k) < 0)
            return jp_oom(j);
        j->i += k;
    }
    if (json_escape(j->out, j->dec.p ? j->dec.p : "", j->dec.len) < 0)
        return jp_oom(j);
    return JT_STR;
}

static int jp_number(jp_t *j)
{
    size_t start = j->i, int0, int1, fr0 = 0, fr1 = 0;
    long long ex = 0;
    int exneg = 0;
    if (j->s[j->i] == '-')
        j->i++;
    int0 = j->i;
    if (j->i < j->n && j->s[j->i] == '0') {
        j->i++;
    } else if (j->i < j->n && j->s[j->i] >= '1' && j->s[j->i] <= '9') {
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
            j->i++;
    } else {
        return jp_fail(j, "bad number");
    }
    int1 = j->i;
    if (j->i < j->n && j->s[j->i] == '.') {
        fr0 = ++j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
            j->i++;
        fr1 = j->i;
        if (fr1 == fr0)
            return jp_fail(j, "bad number fraction");
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            exneg = j->s[j->i++] == '-';
        size_t e0 = j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
            if (ex < 1000000000)
                ex = ex * 10 + (j->s[j->i] - '0');
            j->i++;
        }
        if (j->i == e0)
            return jp_fail(j, "bad number exponent");
    }
    if (sbuf_add(j->out, j->s + start, j->i - start) < 0)
        return jp_oom(j);
    /* The value is D * 10^e10 for the digit string D (integer and fraction
     * digits): integral when the digits below the units place are all zero. */
    long long e10 = (exneg ? -ex : ex) - (long long)(fr1 - fr0);
    if (e10 >= 0)
        return JT_INT;
    size_t ni = int1 - int0, nd = ni + (fr1 - fr0), k = (size_t)-e10;
    for (size_t d = 0; d < nd; d++) {
        char c = d < ni ? j->s[int0 + d] : j->s[fr0 + d - ni];
        if (nd - d <= k && c != '0') /* digit d sits (nd - d) places from the right */
            return JT_NUM;
    }
    return JT_INT;
}

typedef struct {
    const char *p;
    size_t len;
} span_t;

static int span_cmp(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return memcmp(x->p, y->p, x->len);
}

static int jp_value(jp_t *j, int depth, int top);

static int jp_object(jp_t *j, int depth, int top)
{
    size_t *koff = NULL, n = 0, cap = 0;
    int rc = JT_OBJ;
    j->i++;
    if (sbuf_add(j->out, "{", 1) < 0)
        return jp_oom(j);
    jp_ws(j);
    if (j->i < j->n && j->s[j->i] == '}') {
        j->i++;
        return sbuf_add(j->out, "}", 1) < 0 ? jp_oom(j) : JT_OBJ;
    }
    for (;;) {
        if (j->i >= j->n || j->s[j->i] != '"') {
            rc = jp_fail(j, "expected a string key");
            goto out;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 8;
            size_t *nk = realloc(koff, nc * 2 * sizeof *nk);
            if (!nk) {
                rc = jp_oom(j);
                goto out;
            }
            koff = nk;
            cap = nc;
        }
        koff[2 * n] = j->out->len;
        if (jp_string(j) < 0) {
            rc = -1;
            goto out;
        }
        koff[2 * n + 1] = j->out->len - koff[2 * n];
        n++;
        jmember_t *m = NULL;
        if (top) {
            if (j->n_mem == j->cap_mem) {
                size_t nc = j->cap_mem ? j->cap_mem * 2 : 8;
                jmember_t *nm = realloc(j->mem, nc * sizeof *nm);
                if (!nm) {
                    rc = jp_oom(j);
                    goto out;
                }
                j->mem = nm;
                j->cap_mem = nc;
            }
            m = &j->mem[j->n_mem];
            if (!(m->key = malloc(j->dec.len + 1))) {
                rc = jp_oom(j);
                goto out;
            }
            if (j->dec.len)
                memcpy(m->key, j->dec.p, j->dec.len);
            m->key[j->dec.len] = '\0';
            m->key_len = j->dec.len;
            j->n_mem++;
        }
        jp_ws(j);
        if (j->i >= j->n || j->s[j->i] != ':') {
            rc = jp_fail(j, "expected ':'");
            goto out;
        }
        j->i++;
        if (sbuf_add(j->out, ": ", 2) < 0) {
            rc = jp_oom(j);
            goto out;
        }
        jp_ws(j);
        size_t voff = j->out->len;
        int t = jp_value(j, depth + 1, 0);
        if (t < 0) {
            rc = -1;
            goto out;
        }
        if (m) {
            m->type = t;
            m->val_off = voff;
            m->val_len = j->out->len - voff;
        }
        jp_ws(j);
        if (j->i < j->n && j->s[j->i] == ',') {
            j->i++;
            if (sbuf_add(j->out, ", ", 2) < 0) {
                rc = jp_oom(j);
                goto out;
            }
            jp_ws(j);
            continue;
        }
        if (j->i < j->n && j->s[j->i] == '}') {
            j->i++;
            if (sbuf_add(j->out, "}", 1) < 0)
                rc = jp_oom(j);
            break;
        }
        rc = jp_fail(j, "expected ',' or '}'");
        goto out;
    }
    if (n > 1) {
        /* Canonical key text is a function of the decoded key, so equal
         * canonical text means a duplicate key. */
        span_t *sp = duet_malloc_array(n, sizeof *sp);
        if (!sp) {
            rc = jp_oom(j);
            goto out;
        }
        for (size_t k = 0; k < n; k++)
            sp[k] = (span_t){j->out->p + koff[2 * k], koff[2 * k + 1]};
        qsort(sp, n, sizeof *sp, span_cmp);
        for (size_t k = 1; k < n && rc >= 0; k++)
            if (span_cmp(&sp[k - 1], &sp[k]) == 0) {
                char kb[96];
                sanitize(kb, sizeof kb, sp[k].p, sp[k].len);
                snprintf(j->msg, sizeof j->msg, "duplicate key %s", kb);
                rc = -1;
            }
        free(sp);
    }
out:
    free(koff);
    return rc;
}

static int jp_array(jp_t *j, int depth)
{
    j->i++;
    if (sbuf_add(j->out, "[", 1) < 0)
        return jp_oom(j);
    jp_ws(j);
    if (j->i < j->n && j->s[j->i] == ']') {
        j->i++;
        return sbuf_add(j->out, "]", 1) < 0 ? jp_oom(j) : JT_ARR;
    }
    for (;;) {
        if (jp_value(j, depth + 1, 0) < 0)
            return -1;
        jp_ws(j);
        if (j->i < j->n && j->s[j->i] == ',') {
            j->i++;
            if (sbuf_add(j->out, ", ", 2) < 0)
                return jp_oom(j);
            jp_ws(j);
            continue;
        }
        if (j->i < j->n && j->s[j->i] == ']') {
            j->i++;
            return sbuf_add(j->out, "]", 1) < 0 ? jp_oom(j) : JT_ARR;
        }
        return jp_fail(j, "expected ',' or ']'");
    }
}

static int jp_literal(jp_t *j, const char *lit, int type)
{
    size_t l = strlen(lit);
    if (j->n - j->i < l || memcmp(j->s + j->i, lit, l) != 0)
        return jp_fail(j, "unexpected character");
    j->i += l;
    return sbuf_add(j->out, lit, l) < 0 ? jp_oom(j) : type;
}

static int jp_value(jp_t *j, int depth, int top)
{
    if (depth > JSON_MAX_DEPTH)
        return jp_fail(j, "nesting too deep");
    if (j->i >= j->n)
        return jp_fail(j, "expected a value");
    switch (j->s[j->i]) {
    case '{': return jp_object(j, depth, top);
    case '[': return jp_array(j, depth);
    case '"': return jp_string(j);
    case 't': return jp_literal(j, "true", JT_BOOL);
    case 'f': return jp_literal(j, "false", JT_BOOL);
    case 'n': return jp_literal(j, "null", JT_NULL);
    default:
        if (j->s[j->i] == '-' || (j->s[j->i] >= '0' && j->s[j->i] <= '9'))
            return jp_number(j);
        return jp_fail(j, "unexpected character");
    }
}

static void jp_fini(jp_t *j)
{
    for (size_t k = 0; k < j->n_mem; k++)
        free(j->mem[k].key);
    free(j->mem);
    sbuf_free(&j->dec);
}

/* Parse the whole of s[0..n) (surrounding whitespace allowed) as one value;
 * canonical text to `out`; top-level object members collected when
 * `members`.  Returns the type, or -1 with j->msg set. */
static int jp_parse(jp_t *j, const char *s, size_t n, sbuf_t *out, int members)
{
    memset(j, 0, sizeof *j);
    j->s = s;
    j->n = n;
    j->out = out;
    jp_ws(j);
    int t = jp_value(j, 0, members);
    if (t < 0)
        return -1;
    jp_ws(j);
    if (j->i != j->n)
        return jp_fail(j, "text after the JSON value");
    return t;
}

duet_status_t duet_dsml_json_canonical(const char *json, size_t len, char **out, size_t *out_len,
                                       duet_err_t *err)
{
    sbuf_t b = {0};
    jp_t j;
    if (!json || !out)
        return duet_err_set(err, DUET_ERR_INVALID, "no JSON text");
    int t = jp_parse(&j, json, len, &b, 0);
    duet_status_t st = DUET_OK;
    if (t < 0)
        st = duet_err_set(err, j.nomem ? DUET_ERR_NOMEM : DUET_ERR_PARSE, "JSON: %s", j.msg);
    else if (sbuf_add(&b, "", 0) < 0)
        st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    jp_fini(&j);
    if (st != DUET_OK) {
        sbuf_free(&b);
        return st;
    }
    *out = b.p;
    if (out_len)
        *out_len = b.len;
    return DUET_OK;
}

/* ------------------------------------------------------------ code table */

const char *duet_dsml_code_str(duet_dsml_code_t code)
{
    switch (code) {
#define DUET_DSML_CODE_STR(name, code, msg) case name: return code;
    DUET_DSML_CODE_LIST(DUET_DSML_CODE_STR)
#undef DUET_DSML_CODE_STR
    default: return "UNKNOWN";
    }
}

const char *duet_dsml_code_message(duet_dsml_code_t code)
{
    switch (code) {
#define DUET_DSML_CODE_MSG(name, code, msg) case name: return msg;
    DUET_DSML_CODE_LIST(DUET_DSML_CODE_MSG)
#undef DUET_DSML_CODE_MSG
    default: return "unknown DSML error";
    }
}

int duet_dsml_code_parse(const char *s)
{
    for (int c = 0; s && c < DUET_DSML_CODE_COUNT; c++)
        if (strcmp(s, duet_dsml_code_str((duet_dsml_code_t)c)) == 0)
            return c;
    return -1;
}

/* ------------------------------------------------------------ the parser */

enum mode { M_REASONING, M_CONTENT, M_AFTER_BLOCK, M_BLOCK, M_FAILED, M_BROKEN };

enum bstate {
    BS_TAG0,      /* at a DSML tag met in content: must open tool_calls */
    BS_CALLS,     /* inside tool_calls, between invokes */
    BS_INVOKE,    /* inside invoke, between parameters */
    BS_VALUE,     /* inside a parameter value */
    BS_JSON,      /* inside a direct JSON argument body */
};

enum tag_name { TN_TOOL_CALLS, TN_INVOKE, TN_PARAMETER };
static const char *const tag_names[] = {"tool_calls", "invoke", "parameter"};

typedef struct {
    char *name;             /* decoded UTF-8, NUL-terminated */
    size_t name_len;
    int type;
    char *value;            /* canonical JSON text */
    size_t value_len;
} arg_t;

/* Step results. */
enum { ST_MORE = 0, ST_NEXT = 1, ST_NOMEM = -1 };

struct duet_dsml_parser {
    duet_dsml_event_fn fn;
    void *arg;
    const json_t *tools;
    uint64_t id_seed;
    size_t max_unit;
    int mode;
    int finished;
    duet_dsml_code_t error;
    int n_calls;
    sbuf_t in;
    size_t pos;             /* block mode: parse cursor in `in` */
    size_t scan;            /* BS_VALUE / BS_JSON: marker search resumes here */
    int bstate;
    int invokes_in_block;
    /* current invoke */
    char *tool;
    size_t tool_len;
    const json_t *schema;   /* the tool's "parameters" (may be NULL) */
    arg_t *args;
    size_t n_args, cap_args;
    size_t value_start;     /* BS_VALUE / BS_JSON: start of the value in `in` */
    int value_is_string;
    char msg[400];
    char names[2][120];     /* sanitized names for messages */
};

static void emit_text(duet_dsml_parser_t *p, duet_dsml_event_kind_t kind, const char *s, size_t n)
{
    if (!n)
        return;
    duet_dsml_event_t ev = {.kind = kind, .text = s, .len = n};
    p->fn(p->arg, &ev);
}

static void call_reset(duet_dsml_parser_t *p)
{
    for (size_t k = 0; k < p->n_args; k++) {
        free(p->args[k].name);
        free(p->args[k].value);
    }
    p->n_args = 0;
    free(p->tool);
    p->tool = NULL;
    p->tool_len = 0;
    p->schema = NULL;
}

/* Report error `code` with the raw text in[0..boundary); the rest of `in` and
 * everything later is content.  The message is p->msg. */
static int fail(duet_dsml_parser_t *p, duet_dsml_code_t code, size_t boundary)
{
    if (boundary > p->in.len)
        boundary = p->in.len;
    duet_dsml_event_t ev = {
        .kind = DUET_DSML_EV_ERROR,
        .text = p->in.p ? p->in.p : "",
        .len = boundary,
        .code = code,
        .message = p->msg,
    };
    p->error = code;
    p->mode = M_FAILED;
    p->fn(p->arg, &ev);
    emit_text(p, DUET_DSML_EV_CONTENT, p->in.p + boundary, p->in.len - boundary);
    sbuf_drop(&p->in, p->in.len);
    call_reset(p);
    return ST_MORE;
}

static int failf(duet_dsml_parser_t *p, duet_dsml_code_t code, size_t boundary, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int failf(duet_dsml_parser_t *p, duet_dsml_code_t code, size_t boundary, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    return fail(p, code, boundary);
}

static const char *name0(duet_dsml_parser_t *p, const char *s, size_t n)
{
    sanitize(p->names[0], sizeof p->names[0], s, n);
    return p->names[0];
}

static const char *name1(duet_dsml_parser_t *p, const char *s, size_t n)
{
    sanitize(p->names[1], sizeof p->names[1], s, n);
    return p->names[1];
}

/* ---- tags */

/* An attribute value: 1..ATTR_VALUE_MAX bytes of valid UTF-8 without control
 * characters, '"', '<' or '>'.  The parser and the encoder share this rule. */
static int attr_value_ok(const char *s, size_t n)
{
    if (n == 0 || n > ATTR_VALUE_MAX)
        return 0;
    for (size_t k = 0; k < n;) {
        uint32_t cp;
        int r = duet_utf8_scan((const uint8_t *)s + k, n - k, &cp);
        if (r <= 0 || cp < 0x20 || cp == 0x7f || cp == '"' || cp == '<' || cp == '>')
            return 0;
        k += (size_t)r;
    }
    return 1;
}

typedef struct {
    int closing;
    int name;               /* enum tag_name */
    size_t name_end;        /* offset just past the name */
    size_t len;             /* whole tag, through '>' */
    size_t attr[2][2];      /* name="..", string=".." value spans (offset, length) */
    int has_attr[2];
} tag_t;

enum { LX_MORE, LX_OK, LX_ERR };

/* Name of the tag at s (which starts with MK_OPEN or MK_CLOSE). */
static int lex_tag_name(duet_dsml_parser_t *p, const char *s, size_t n, tag_t *t)
{
    memset(t, 0, sizeof *t);
    t->closing = s[1] == '/';
    size_t i = t->closing ? MK_CLOSE_LEN : MK_OPEN_LEN, n0 = i;
    while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_') && i - n0 <= TAG_NAME_MAX)
        i++;
    if (i >= n)
        return LX_MORE;
    size_t nl = i - n0;
    t->name = -1;
    for (int k = 0; k < 3; k++)
        if (nl == strlen(tag_names[k]) && memcmp(s + n0, tag_names[k], nl) == 0)
            t->name = k;
    if (t->name < 0 || (t->closing && s[i] != '>') || (!t->closing && s[i] != '>' && !is_ws((unsigned char)s[i]))) {
        snprintf(p->msg, sizeof p->msg, "malformed DSML tag <%s%s%s...>", t->closing ? "/" : "", DSML_TOK,
                 name0(p, s + n0, nl));
        return LX_ERR;
    }
    t->name_end = i;
    if (t->closing)
        t->len = i + 1;
    return LX_OK;
}

/* Attributes of an opening tag whose name lex_tag_name accepted. */
static int lex_tag_attrs(duet_dsml_parser_t *p, const char *s, size_t n, tag_t *t)
{
    const char *tn = tag_names[t->name];
    size_t i = t->name_end;
    if (n > TAG_MAX_BYTES)
        n = TAG_MAX_BYTES + 1;
    for (;;) {
        size_t ws0 = i;
        while (i < n && is_ws((unsigned char)s[i]))
            i++;
        if (i >= n)
            goto more;
        if (s[i] == '>') {
            t->len = i + 1;
            break;
        }
        if (i == ws0) {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: attributes must be separated by whitespace", DSML_TOK, tn);
            return LX_ERR;
        }
        size_t a0 = i;
        while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_' ||
                         s[i] == '-' || (i > a0 && s[i] >= '0' && s[i] <= '9')) && i - a0 <= TAG_NAME_MAX)
            i++;
        if (i >= n)
            goto more;
        size_t al = i - a0;
        int which = -1;
        if (t->name == TN_INVOKE && al == 4 && memcmp(s + a0, "name", 4) == 0)
            which = 0;
        if (t->name == TN_PARAMETER && al == 4 && memcmp(s + a0, "name", 4) == 0)
            which = 0;
        if (t->name == TN_PARAMETER && al == 6 && memcmp(s + a0, "string", 6) == 0)
            which = 1;
        if (al == 0 || which < 0) {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: unknown attribute \"%s\"", DSML_TOK, tn,
                     name0(p, s + a0, al ? al : 1));
            return LX_ERR;
        }
        if (t->has_attr[which]) {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: duplicate attribute \"%s\"", DSML_TOK, tn,
                     which ? "string" : "name");
            return LX_ERR;
        }
        if (s[i] != '=') {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: expected '=' after attribute \"%s\"", DSML_TOK, tn,
                     which ? "string" : "name");
            return LX_ERR;
        }
        if (++i >= n)
            goto more;
        if (s[i] != '"') {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: attribute value must be in double quotes", DSML_TOK, tn);
            return LX_ERR;
        }
        size_t v0 = ++i;
        while (i < n && s[i] != '"' && s[i] != '<' && s[i] != '>' && s[i] != '\n' && s[i] != '\r' &&
               i - v0 < ATTR_VALUE_MAX)
            i++;
        if (i >= n)
            goto more;
        if (s[i] != '"') {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: unterminated or overlong attribute value", DSML_TOK, tn);
            return LX_ERR;
        }
        if (i > v0 && !attr_value_ok(s + v0, i - v0)) {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: attribute value holds a control character or invalid UTF-8",
                     DSML_TOK, tn);
            return LX_ERR;
        }
        t->attr[which][0] = v0;
        t->attr[which][1] = i - v0;
        t->has_attr[which] = 1;
        i++;
        if (i >= n)
            goto more;
        if (s[i] != '>' && !is_ws((unsigned char)s[i])) {
            snprintf(p->msg, sizeof p->msg, "<%s%s>: attributes must be separated by whitespace", DSML_TOK, tn);
            return LX_ERR;
        }
    }
    if (t->name != TN_TOOL_CALLS && (!t->has_attr[0] || t->attr[0][1] == 0)) {
        snprintf(p->msg, sizeof p->msg, "<%s%s>: missing or empty attribute \"name\"", DSML_TOK, tn);
        return LX_ERR;
    }
    if (t->name == TN_PARAMETER) {
        const char *v = s + t->attr[1][0];
        size_t vl = t->attr[1][1];
        if (!t->has_attr[1] || !((vl == 4 && memcmp(v, "true", 4) == 0) || (vl == 5 && memcmp(v, "false", 5) == 0))) {
            snprintf(p->msg, sizeof p->msg, "<%s%s name=\"%s\">: attribute \"string\" must be \"true\" or \"false\"",
                     DSML_TOK, tn, name0(p, s + t->attr[0][0], t->attr[0][1]));
            return LX_ERR;
        }
    }
    return LX_OK;
more:
    if (n > TAG_MAX_BYTES) {
        snprintf(p->msg, sizeof p->msg, "<%s%s>: tag longer than %d bytes", DSML_TOK, tn, TAG_MAX_BYTES);
        return LX_ERR;
    }
    return LX_MORE;
}

/* ---- schema checks */

static const json_t *tool_find(const json_t *tools, const char *name, size_t len)
{
    const json_t *found = NULL;
    size_t k;
    json_t *tool;
    if (!json_is_array(tools))
        return NULL;
    json_array_foreach((json_t *)tools, k, tool) {
        json_t *fn = json_object_get(tool, "function");
        if (!json_is_object(fn))
            fn = tool;
        json_t *nm = json_object_get(fn, "name");
        if (json_is_string(nm) && json_string_length(nm) == len && memcmp(json_string_value(nm), name, len) == 0)
            found = fn; /* the last definition wins */
    }
    return found;
}

static int type_is(const char *want, int t)
{
    if (!strcmp(want, "string")) return t == JT_STR;
    if (!strcmp(want, "number")) return t == JT_INT || t == JT_NUM;
    if (!strcmp(want, "integer")) return t == JT_INT;
    if (!strcmp(want, "boolean")) return t == JT_BOOL;
    if (!strcmp(want, "null")) return t == JT_NULL;
    if (!strcmp(want, "array")) return t == JT_ARR;
    if (!strcmp(want, "object")) return t == JT_OBJ;
    return 1; /* a type this check does not know constrains nothing */
}

/* 1 when the property schema's "type" admits t; the wanted types to `want`. */
static int schema_admits(const json_t *prop, int t, char *want, size_t cap)
{
    json_t *ty = json_object_get(prop, "type");
    want[0] = '\0';
    if (json_is_string(ty)) {
        snprintf(want, cap, "%s", json_string_value(ty));
        return type_is(json_string_value(ty), t);
    }
    if (!json_is_array(ty) || json_array_size(ty) == 0)
        return 1;
    size_t k;
    json_t *e;
    int ok = 0, any = 0;
    json_array_foreach(ty, k, e) {
        if (!json_is_string(e))
            continue;
        size_t l = strlen(want);
        snprintf(want + l, cap - l, "%s%s", any ? "|" : "", json_string_value(e));
        any = 1;
        ok |= type_is(json_string_value(e), t);
    }
    return ok || !any;
}

/* Check one argument against the tool schema at its name (unknown) or its
 * value (type); returns 0 or the failing code with p->msg set. */
static duet_dsml_code_t check_arg(duet_dsml_parser_t *p, const char *name, size_t len, int type, int check_type)
{
    json_t *props = json_object_get(p->schema, "properties");
    json_t *prop = json_is_object(props) ? json_object_getn(props, name, len) : NULL;
    if (!prop) {
        if (json_is_false(json_object_get(p->schema, "additionalProperties"))) {
            snprintf(p->msg, sizeof p->msg, "tool \"%s\" has no parameter \"%s\"", name1(p, p->tool, p->tool_len),
                     name0(p, name, len));
            return DUET_DSML_UNKNOWN_PARAMETER;
        }
        return DUET_DSML_OK;
    }
    char want[96];
    if (check_type && json_is_object(prop) && !schema_admits(prop, type, want, sizeof want)) {
        snprintf(p->msg, sizeof p->msg, "tool \"%s\": parameter \"%s\" is %s %s, its schema wants %s",
                 name1(p, p->tool, p->tool_len), name0(p, name, len),
                 type == JT_INT || type == JT_ARR || type == JT_OBJ ? "an" : "a", jt_name(type), want);
        return DUET_DSML_TYPE_MISMATCH;
    }
    return DUET_DSML_OK;
}

static duet_dsml_code_t check_required(duet_dsml_parser_t *p)
{
    json_t *req = json_object_get(p->schema, "required"), *r;
    size_t k;
    if (!json_is_array(req))
        return DUET_DSML_OK;
    json_array_foreach(req, k, r) {
        if (!json_is_string(r))
            continue;
        const char *rn = json_string_value(r);
        size_t rl = json_string_length(r), a;
        for (a = 0; a < p->n_args; a++)
            if (p->args[a].name_len == rl && memcmp(p->args[a].name, rn, rl) == 0)
                break;
        if (a == p->n_args) {
            snprintf(p->msg, sizeof p->msg, "tool \"%s\" requires parameter \"%s\"", name1(p, p->tool, p->tool_len),
                     name0(p, rn, rl));
            return DUET_DSML_MISSING_PARAMETER;
        }
    }
    return DUET_DSML_OK;
}

static int args_push(duet_dsml_parser_t *p, const char *name, size_t nl, int type, const char *val, size_t vl)
{
    if (p->n_args == p->cap_args) {
        size_t nc = p->cap_args ? p->cap_args * 2 : 8;
        arg_t *na = realloc(p->args, nc * sizeof *na);
        if (!na)
            return -1;
        p->args = na;
        p->cap_args = nc;
    }
    arg_t *a = &p->args[p->n_args];
    a->name = malloc(nl + 1);
    a->value = malloc(vl + 1);
    if (!a->name || !a->value) {
        free(a->name);
        free(a->value);
        return -1;
    }
    memcpy(a->name, name, nl);
    a->name[nl] = '\0';
    a->name_len = nl;
    memcpy(a->value, val, vl);
    a->value[vl] = '\0';
    a->value_len = vl;
    a->type = type;
    p->n_args++;
    return 0;
}

/* ---- ids */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_id(uint64_t seed, int index, char id[32])
{
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t s = seed ^ ((uint64_t)(index + 1) * 0xd1b54a32d192ed03ull);
    memcpy(id, "call_", 5);
    for (int k = 0; k < 24; k++)
        id[5 + k] = alpha[splitmix64(&s) % 62];
    id[29] = '\0';
}

/* Report the current invoke (args validated) and drop its text. */
static int emit_call(duet_dsml_parser_t *p, size_t unit_end)
{
    sbuf_t a = {0};
    char id[32];
    if (sbuf_add(&a, "{", 1) < 0)
        goto oom;
    for (size_t k = 0; k < p->n_args; k++) {
        if ((k && sbuf_add(&a, ", ", 2) < 0) || json_escape(&a, p->args[k].name, p->args[k].name_len) < 0 ||
            sbuf_add(&a, ": ", 2) < 0 || sbuf_add(&a, p->args[k].value, p->args[k].value_len) < 0)
            goto oom;
    }
    if (sbuf_add(&a, "}", 1) < 0)
        goto oom;
    make_id(p->id_seed, p->n_calls, id);
    duet_dsml_event_t ev = {
        .kind = DUET_DSML_EV_TOOL_CALL,
        .index = p->n_calls,
        .id = id,
        .name = p->tool,
        .arguments = a.p,
    };
    p->n_calls++;
    p->invokes_in_block++;
    p->fn(p->arg, &ev);
    sbuf_free(&a);
    call_reset(p);
    sbuf_drop(&p->in, unit_end);
    p->pos = 0;
    return ST_NEXT;
oom:
    sbuf_free(&a);
    return ST_NOMEM;
}

/* ---- block mode steps; each works on in[pos..avail) */

/* An opening or closing DSML tag at `pos`, in state bstate. */
static int step_tag(duet_dsml_parser_t *p, size_t avail)
{
    const char *s = p->in.p + p->pos;
    size_t n = avail - p->pos, mk_end = p->pos + (s[1] == '/' ? MK_CLOSE_LEN : MK_OPEN_LEN);
    tag_t t;
    int r = lex_tag_name(p, s, n, &t);
    if (r == LX_MORE)
        return ST_MORE;
    if (r == LX_ERR)
        return fail(p, DUET_DSML_BAD_MARKUP, mk_end);
    /* Is this tag allowed here? */
    int ok;
    switch (p->bstate) {
    case BS_TAG0: ok = !t.closing && t.name == TN_TOOL_CALLS; break;
    case BS_CALLS: ok = (!t.closing && t.name == TN_INVOKE) || (t.closing && t.name == TN_TOOL_CALLS); break;
    case BS_INVOKE: ok = (!t.closing && t.name == TN_PARAMETER) || (t.closing && t.name == TN_INVOKE); break;
    case BS_VALUE: ok = t.closing && t.name == TN_PARAMETER; break;
    default: ok = t.closing && t.name == TN_INVOKE; break; /* BS_JSON */
    }
    if (!ok) {
        static const char *const where[] = {"in content", "between invokes", "inside an invoke",
                                            "inside a parameter value", "after a JSON argument body"};
        return failf(p, DUET_DSML_UNEXPECTED_TAG, mk_end, "<%s%s%s> is not allowed %s", t.closing ? "/" : "",
                     DSML_TOK, tag_names[t.name], where[p->bstate]);
    }
    if (!t.closing) {
        r = lex_tag_attrs(p, s, n, &t);
        if (r == LX_MORE)
            return ST_MORE;
        if (r == LX_ERR)
            return fail(p, DUET_DSML_BAD_ATTRIBUTE, mk_end);
    }
    size_t end = p->pos + t.len;
    const char *an = s + t.attr[0][0];
    size_t al = t.attr[0][1];
    switch (p->bstate) {
    case BS_TAG0:
        p->bstate = BS_CALLS;
        p->invokes_in_block = 0;
        p->pos = end;
        return ST_NEXT;
    case BS_CALLS:
        if (t.closing) {
            if (p->invokes_in_block == 0)
                return failf(p, DUET_DSML_EMPTY_BLOCK, end, "<%stool_calls> block holds no invoke", DSML_TOK);
            sbuf_drop(&p->in, end);
            p->pos = 0;
            p->mode = M_AFTER_BLOCK;
            return ST_NEXT;
        }
        {
            call_reset(p);
            if (!(p->tool = malloc(al + 1)))
                return ST_NOMEM;
            memcpy(p->tool, an, al);
            p->tool[al] = '\0';
            p->tool_len = al;
            const json_t *fn = tool_find(p->tools, an, al);
            if (!fn)
                return failf(p, DUET_DSML_UNKNOWN_TOOL, end, "the request defines no tool \"%s\"", name0(p, an, al));
            p->schema = json_object_get(fn, "parameters");
            p->bstate = BS_INVOKE;
            p->pos = end;
            return ST_NEXT;
        }
    case BS_INVOKE:
        if (t.closing) {
            duet_dsml_code_t c = check_required(p);
            if (c)
                return fail(p, c, end);
            p->bstate = BS_CALLS;
            return emit_call(p, end);
        }
        for (size_t k = 0; k < p->n_args; k++)
            if (p->args[k].name_len == al && memcmp(p->args[k].name, an, al) == 0)
                return failf(p, DUET_DSML_DUPLICATE_PARAMETER, end, "tool \"%s\": parameter \"%s\" given twice",
                             name1(p, p->tool, p->tool_len), name0(p, an, al));
        {
            duet_dsml_code_t c = check_arg(p, an, al, 0, 0);
            if (c)
                return fail(p, c, end);
        }
        /* Keep the name as a provisional argument; the value fills it in. */
        if (args_push(p, an, al, JT_NULL, "", 0) < 0)
            return ST_NOMEM;
        p->value_is_string = s[t.attr[1][0]] == 't';
        p->bstate = BS_VALUE;
        p->pos = p->value_start = p->scan = end;
        return ST_NEXT;
    case BS_VALUE: {
        arg_t *a = &p->args[p->n_args - 1];
        const char *v = p->in.p + p->value_start;
        size_t vl = p->pos - p->value_start;
        sbuf_t canon = {0};
        int type = JT_STR;
        if (p->value_is_string) {
            if (json_escape(&canon, v, vl) < 0)
                goto oom_value;
        } else {
            jp_t j;
            type = jp_parse(&j, v, vl, &canon, 0);
            if (type < 0) {
                int nomem = j.nomem;
                jp_fini(&j);
                sbuf_free(&canon);
                if (nomem)
                    return ST_NOMEM;
                return failf(p, DUET_DSML_BAD_JSON, end, "tool \"%s\": parameter \"%s\": %s",
                             name1(p, p->tool, p->tool_len), name0(p, a->name, a->name_len), j.msg);
            }
            jp_fini(&j);
        }
        free(a->value);
        a->value = canon.p ? canon.p : duet_strdup("");
        a->value_len = canon.len;
        a->type = type;
        if (!a->value)
            return ST_NOMEM;
        duet_dsml_code_t c = check_arg(p, a->name, a->name_len, type, 1);
        if (c)
            return fail(p, c, end);
        p->bstate = BS_INVOKE;
        p->pos = end;
        return ST_NEXT;
    oom_value:
        sbuf_free(&canon);
        return ST_NOMEM;
    }
    default: { /* BS_JSON: closing invoke */
        const char *v = p->in.p + p->value_start;
        size_t vl = p->pos - p->value_start;
        sbuf_t canon = {0};
        jp_t j;
        int type = jp_parse(&j, v, vl, &canon, 1);
        if (type != JT_OBJ) {
            int nomem = j.nomem;
            if (type >= 0)
                snprintf(j.msg, sizeof j.msg, "the argument body is %s %s, not an object",
                         type == JT_INT || type == JT_ARR ? "an" : "a", jt_name(type));
            if (!nomem)
                failf(p, DUET_DSML_BAD_JSON, end, "tool \"%s\": %s", name1(p, p->tool, p->tool_len), j.msg);
            jp_fini(&j);
            sbuf_free(&canon);
            return nomem ? ST_NOMEM : ST_MORE;
        }
        int rc = ST_NEXT;
        duet_dsml_code_t c = DUET_DSML_OK;
        for (size_t k = 0; k < j.n_mem && rc == ST_NEXT && !c; k++) {
            jmember_t *m = &j.mem[k];
            if (args_push(p, m->key, m->key_len, m->type, canon.p + m->val_off, m->val_len) < 0)
                rc = ST_NOMEM;
            else
                c = check_arg(p, m->key, m->key_len, m->type, 1);
        }
        jp_fini(&j);
        sbuf_free(&canon);
        if (rc != ST_NEXT)
            return rc;
        if (!c)
            c = check_required(p);
        if (c)
            return fail(p, c, end);
        p->bstate = BS_CALLS;
        return emit_call(p, end);
    }
    }
}

/* Whitespace, then a tag (or '{' opening a JSON body in a fresh invoke). */
static int step_between(duet_dsml_parser_t *p, size_t avail)
{
    while (p->pos < avail && is_ws((unsigned char)p->in.p[p->pos]))
        p->pos++;
    if (p->pos >= avail)
        return ST_MORE;
    const char *s = p->in.p + p->pos;
    size_t n = avail - p->pos;
    if (s[0] == '<') {
        if ((n >= MK_OPEN_LEN && memcmp(s, MK_OPEN, MK_OPEN_LEN) == 0) ||
            (n >= MK_CLOSE_LEN && memcmp(s, MK_CLOSE, MK_CLOSE_LEN) == 0))
            return step_tag(p, avail);
        if ((n < MK_OPEN_LEN && memcmp(s, MK_OPEN, n) == 0) || (n < MK_CLOSE_LEN && memcmp(s, MK_CLOSE, n) == 0))
            return ST_MORE; /* a marker may follow: wait */
    }
    if (s[0] == '{' && p->bstate == BS_INVOKE && p->n_args == 0) {
        p->bstate = BS_JSON;
        p->value_start = p->scan = p->pos;
        return ST_NEXT;
    }
    static const char *const where[] = {"", "between invokes", "inside an invoke"};
    return failf(p, DUET_DSML_STRAY_TEXT, p->pos, "unexpected text %s", where[p->bstate]);
}

/* A parameter value or JSON body: everything up to the next DSML tag. */
static int step_value(duet_dsml_parser_t *p, size_t avail)
{
    static const char *const mk[] = {MK_OPEN, MK_CLOSE};
    int which;
    size_t from = p->scan;
    size_t q = from + find_first(p->in.p + from, avail - from, mk, 2, &which);
    if (which < 0) {
        p->scan = avail >= MK_CLOSE_LEN - 1 && avail - (MK_CLOSE_LEN - 1) > from ? avail - (MK_CLOSE_LEN - 1) : from;
        return ST_MORE;
    }
    p->pos = q;
    p->scan = q;
    return step_tag(p, avail);
}

static int step_block(duet_dsml_parser_t *p)
{
    size_t avail = p->in.len < p->max_unit ? p->in.len : p->max_unit;
    int r;
    switch (p->bstate) {
    case BS_TAG0: r = step_tag(p, avail); break;
    case BS_CALLS:
    case BS_INVOKE: r = step_between(p, avail); break;
    default: r = step_value(p, avail); break;
    }
    if (r == ST_MORE && p->mode == M_BLOCK && p->in.len > p->max_unit) {
        size_t b = p->max_unit;
        for (int k = 0; k < 3 && b > 1 && ((unsigned char)p->in.p[b] & 0xc0) == 0x80; k++)
            b--;
        return failf(p, DUET_DSML_TOO_LARGE, b, "a tool call with its markup exceeds %zu bytes", p->max_unit);
    }
    return r;
}

/* ---- text modes */

static int step_reasoning(duet_dsml_parser_t *p)
{
    static const char *const mk[] = {THINK_END, MK_OPEN, MK_CLOSE};
    int which;
    size_t q = find_first(p->in.p, p->in.len, mk, 3, &which);
    if (which < 0) {
        size_t h = holdback_start(p->in.p, p->in.len, mk, 3);
        emit_text(p, DUET_DSML_EV_REASONING, p->in.p, h);
        sbuf_drop(&p->in, h);
        return ST_MORE;
    }
    emit_text(p, DUET_DSML_EV_REASONING, p->in.p, q);
    sbuf_drop(&p->in, q);
    if (which == 0) {
        sbuf_drop(&p->in, strlen(THINK_END));
        p->mode = M_CONTENT;
        return ST_NEXT;
    }
    return failf(p, DUET_DSML_MARKUP_IN_REASONING, which == 1 ? MK_OPEN_LEN : MK_CLOSE_LEN,
                 "DSML markup before </think> (the reasoning was not closed)");
}

static int step_content(duet_dsml_parser_t *p)
{
    static const char *const mk[] = {MK_OPEN, MK_CLOSE};
    static const char *const hold[] = {"\n\n" MK_OPEN, "\n\n" MK_CLOSE, MK_OPEN, MK_CLOSE};
    int which;
    size_t q = find_first(p->in.p, p->in.len, mk, 2, &which);
    if (which < 0) {
        size_t h = holdback_start(p->in.p, p->in.len, hold, 4);
        emit_text(p, DUET_DSML_EV_CONTENT, p->in.p, h);
        sbuf_drop(&p->in, h);
        return ST_MORE;
    }
    /* The "\n\n" that separates content from a block belongs to the block. */
    size_t c = q >= 2 && p->in.p[q - 1] == '\n' && p->in.p[q - 2] == '\n' ? q - 2 : q;
    emit_text(p, DUET_DSML_EV_CONTENT, p->in.p, c);
    sbuf_drop(&p->in, c);
    p->mode = M_BLOCK;
    p->bstate = BS_TAG0;
    p->pos = q - c;
    return ST_NEXT;
}

static int step_after_block(duet_dsml_parser_t *p)
{
    size_t i = 0;
    while (i < p->in.len && is_ws((unsigned char)p->in.p[i]))
        i++;
    if (i == p->in.len)
        return ST_MORE; /* whitespace after the last block is dropped at the end */
    p->mode = M_CONTENT;
    return ST_NEXT;
}

static duet_status_t run(duet_dsml_parser_t *p)
{
    for (;;) {
        int r;
        switch (p->mode) {
        case M_REASONING: r = step_reasoning(p); break;
        case M_CONTENT: r = step_content(p); break;
        case M_AFTER_BLOCK: r = step_after_block(p); break;
        case M_BLOCK: r = step_block(p); break;
        case M_FAILED:
            emit_text(p, DUET_DSML_EV_CONTENT, p->in.p, p->in.len);
            sbuf_drop(&p->in, p->in.len);
            return DUET_OK;
        default: return DUET_ERR_NOMEM;
        }
        if (r == ST_NOMEM) {
            p->mode = M_BROKEN;
            return DUET_ERR_NOMEM;
        }
        if (r == ST_MORE)
            return DUET_OK;
    }
}

duet_status_t duet_dsml_parser_create(const duet_dsml_opts_t *opts, duet_dsml_event_fn fn, void *arg,
                                      duet_dsml_parser_t **out)
{
    if (!opts || !fn || !out)
        return DUET_ERR_INVALID;
    duet_dsml_parser_t *p = DUET_NEW(duet_dsml_parser_t);
    if (!p)
        return DUET_ERR_NOMEM;
    p->fn = fn;
    p->arg = arg;
    p->tools = opts->tools;
    p->id_seed = opts->id_seed;
    p->max_unit = opts->max_block_bytes ? opts->max_block_bytes : DUET_DSML_DEFAULT_MAX_BLOCK;
    if (p->max_unit < 64)
        p->max_unit = 64;
    p->mode = opts->thinking ? M_REASONING : M_CONTENT;
    *out = p;
    return DUET_OK;
}

void duet_dsml_parser_destroy(duet_dsml_parser_t **pp)
{
    if (!pp || !*pp)
        return;
    duet_dsml_parser_t *p = *pp;
    call_reset(p);
    free(p->args);
    sbuf_free(&p->in);
    free(p);
    *pp = NULL;
}

duet_status_t duet_dsml_parser_feed(duet_dsml_parser_t *p, const char *text, size_t len)
{
    if (!p || (!text && len))
        return DUET_ERR_INVALID;
    if (p->finished)
        return DUET_ERR_STATE;
    if (p->mode == M_BROKEN)
        return DUET_ERR_NOMEM;
    if (p->mode == M_FAILED) {
        emit_text(p, DUET_DSML_EV_CONTENT, text, len);
        return DUET_OK;
    }
    if (sbuf_add(&p->in, text, len) < 0) {
        p->mode = M_BROKEN;
        return DUET_ERR_NOMEM;
    }
    return run(p);
}

duet_status_t duet_dsml_parser_finish(duet_dsml_parser_t *p)
{
    if (!p)
        return DUET_ERR_INVALID;
    if (p->finished)
        return DUET_ERR_STATE;
    p->finished = 1;
    switch (p->mode) {
    case M_REASONING:
        emit_text(p, DUET_DSML_EV_REASONING, p->in.p, p->in.len);
        break;
    case M_CONTENT:
        emit_text(p, DUET_DSML_EV_CONTENT, p->in.p, p->in.len);
        break;
    case M_BLOCK: {
        static const char *const what[] = {"a DSML tag", "a tool_calls block", "an invoke", "a parameter value",
                                           "a JSON argument body"};
        failf(p, DUET_DSML_UNCLOSED_TAG, p->in.len, "the output ended inside %s", what[p->bstate]);
        break;
    }
    case M_BROKEN: return DUET_ERR_NOMEM;
    default: break;
    }
    sbuf_drop(&p->in, p->in.len);
    return DUET_OK;
}

duet_dsml_code_t duet_dsml_parser_error(const duet_dsml_parser_t *p) { return p ? p->error : DUET_DSML_OK; }

int duet_dsml_parser_calls(const duet_dsml_parser_t *p) { return p ? p->n_calls : 0; }

/* ------------------------------------------------------------ the encoder */

static int has_markup(const char *s, size_t n)
{
    return memmem(s, n, MK_OPEN, MK_OPEN_LEN) || memmem(s, n, MK_CLOSE, MK_CLOSE_LEN);
}

duet_status_t duet_dsml_encode_calls(const duet_dsml_call_t *calls, size_t n, char **out, size_t *out_len,
                                     duet_err_t *err)
{
    sbuf_t b = {0}, canon = {0}, raw = {0};
    jp_t j;
    int have_j = 0;
    duet_status_t st = DUET_OK;
    char nb[120];
    if ((!calls && n) || !out)
        return duet_err_set(err, DUET_ERR_INVALID, "no calls or no output");
    if (sbuf_str(&b, MK_OPEN "tool_calls>\n") < 0)
        goto oom;
    for (size_t c = 0; c < n; c++) {
        const char *name = calls[c].name ? calls[c].name : "";
        if (!attr_value_ok(name, strlen(name))) {
            sanitize(nb, sizeof nb, name, strlen(name));
            st = duet_err_set(err, DUET_ERR_INVALID, "tool call %zu: name \"%s\" cannot be written as DSML", c, nb);
            goto fail;
        }
        const char *args = calls[c].arguments ? calls[c].arguments : "{}";
        canon.len = 0;
        int t = jp_parse(&j, args, strlen(args), &canon, 1);
        have_j = 1;
        if (j.nomem)
            goto oom;
        if (t != JT_OBJ) {
            st = duet_err_set(err, DUET_ERR_INVALID, "tool call %zu (%s): arguments are not a JSON object%s%s", c, name,
                              t < 0 ? ": " : "", t < 0 ? j.msg : "");
            goto fail;
        }
        if ((c && sbuf_str(&b, "\n") < 0) || sbuf_str(&b, MK_OPEN "invoke name=\"") < 0 || sbuf_str(&b, name) < 0 ||
            sbuf_str(&b, "\">\n") < 0)
            goto oom;
        for (size_t k = 0; k < j.n_mem; k++) {
            jmember_t *m = &j.mem[k];
            const char *v = canon.p + m->val_off;
            size_t vl = m->val_len;
            raw.len = 0;
            if (m->type == JT_STR) {
                if (json_unescape_canonical(&raw, v + 1, vl - 2) < 0)
                    goto oom;
                v = raw.p ? raw.p : "";
                vl = raw.len;
            }
            if (!attr_value_ok(m->key, m->key_len) || has_markup(v, vl)) {
                sanitize(nb, sizeof nb, m->key, m->key_len);
                st = duet_err_set(err, DUET_ERR_INVALID, "tool call %zu (%s): parameter \"%s\" cannot be written as DSML",
                                  c, name, nb);
                goto fail;
            }
            if ((k && sbuf_str(&b, "\n") < 0) || sbuf_str(&b, MK_OPEN "parameter name=\"") < 0 ||
                sbuf_add(&b, m->key, m->key_len) < 0 ||
                sbuf_str(&b, m->type == JT_STR ? "\" string=\"true\">" : "\" string=\"false\">") < 0 ||
                sbuf_add(&b, v, vl) < 0 || sbuf_str(&b, MK_CLOSE "parameter>") < 0)
                goto oom;
        }
        jp_fini(&j);
        have_j = 0;
        if (sbuf_str(&b, "\n" MK_CLOSE "invoke>") < 0)
            goto oom;
    }
    if (sbuf_str(&b, "\n" MK_CLOSE "tool_calls>") < 0)
        goto oom;
    sbuf_free(&canon);
    sbuf_free(&raw);
    *out = b.p;
    if (out_len)
        *out_len = b.len;
    return DUET_OK;
oom:
    st = duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
fail:
    if (have_j)
        jp_fini(&j);
    sbuf_free(&b);
    sbuf_free(&canon);
    sbuf_free(&raw);
    return st;
}
