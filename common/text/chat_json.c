/* JSON text as Python's json module reads and writes it; see chat_json.h. */
#include "chat_json.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

/* ---- buffer ------------------------------------------------------------ */

static int buf_reserve(duet_chat_buf_t *b, size_t extra)
{
    if (b->failed)
        return -1;
    if (extra > SIZE_MAX - b->len - 1) {
        b->failed = 1;
        return -1;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void duet_chat_buf_put(duet_chat_buf_t *b, const char *s, size_t n)
{
    if (n == 0 || buf_reserve(b, n) < 0)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void duet_chat_buf_puts(duet_chat_buf_t *b, const char *s)
{
    duet_chat_buf_put(b, s, strlen(s));
}

void duet_chat_buf_putc(duet_chat_buf_t *b, char c)
{
    duet_chat_buf_put(b, &c, 1);
}

void duet_chat_buf_fini(duet_chat_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- writing ----------------------------------------------------------- */

void duet_chat_json_float(double x, char out[32])
{
    if (isnan(x)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        strcpy(out, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    /* The shortest digit string that reads back as x.  Among strings of that
     * length, the correctly rounded one printf gives is the closest to x,
     * which is the one Python's repr picks. */
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x)
            break;
    }
    const char *q = e;
    int neg = 0;
    if (*q == '-') {
        neg = 1;
        q++;
    }
    char digits[24];
    int nd = 0;
    for (; *q && *q != 'e' && nd < 20; q++)
        if (*q != '.')
            digits[nd++] = *q;
    int exp10 = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = exp10 + 1; /* x = 0.d1d2... * 10^decpt */

    char *o = out;
    if (neg)
        *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++)
                *o++ = '0';
            memcpy(o, digits, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd);
            o += nd;
            for (int i = nd; i < decpt; i++)
                *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = '\0';
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        int ex = decpt - 1; /* |ex| <= 324 for a double */
        unsigned ax = (unsigned)(ex < 0 ? -ex : ex) % 1000;
        *o++ = 'e';
        *o++ = ex < 0 ? '-' : '+';
        if (ax >= 100)
            *o++ = (char)('0' + ax / 100);
        *o++ = (char)('0' + ax / 10 % 10);
        *o++ = (char)('0' + ax % 10);
        *o = '\0';
    }
}

void duet_chat_json_string(duet_chat_buf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    duet_chat_buf_putc(b, '"');
    size_t run = 0; /* start of the pending run of bytes written as they are */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        duet_chat_buf_put(b, s + run, i - run);
        run = i + 1;
        char esc[7] = {'\\', 0};
        size_t el = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            el = 6;
        }
        duet_chat_buf_put(b, esc, el);
    }
    duet_chat_buf_put(b, s + run, n - run);
    duet_chat_buf_putc(b, '"');
}

static void dump_value(duet_chat_buf_t *b, const json_t *v)
{
    char num[40];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        size_t key_len;
        json_t *val;
        int first = 1;
        duet_chat_buf_putc(b, '{');
        json_object_keylen_foreach((json_t *)v, key, key_len, val) {
            if (!first)
                duet_chat_buf_put(b, ", ", 2);
            first = 0;
            duet_chat_json_string(b, key, key_len);
            duet_chat_buf_put(b, ": ", 2);
            dump_value(b, val);
        }
        duet_chat_buf_putc(b, '}');
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *val;
        duet_chat_buf_putc(b, '[');
        json_array_foreach(v, i, val) {
            if (i)
                duet_chat_buf_put(b, ", ", 2);
            dump_value(b, val);
        }
        duet_chat_buf_putc(b, ']');
        break;
    }
    case JSON_STRING:
        duet_chat_json_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        duet_chat_buf_puts(b, num);
        break;
    case JSON_REAL:
        duet_chat_json_float(json_real_value(v), num);
        duet_chat_buf_puts(b, num);
        break;
    case JSON_TRUE:
        duet_chat_buf_put(b, "true", 4);
        break;
    case JSON_FALSE:
        duet_chat_buf_put(b, "false", 5);
        break;
    case JSON_NULL:
        duet_chat_buf_put(b, "null", 4);
        break;
    }
}

duet_status_t duet_chat_json_dump(duet_chat_buf_t *b, const json_t *v, duet_err_t *err)
{
    dump_value(b, v);
    if (b->failed)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory writing JSON");
    return DUET_OK;
}

void duet_chat_json_write(duet_chat_buf_t *b, const duet_chat_json_t *v)
{
    switch (v->kind) {
    case DUET_CHAT_JSON_NULL:
        duet_chat_buf_put(b, "null", 4);
        break;
    case DUET_CHAT_JSON_FALSE:
        duet_chat_buf_put(b, "false", 5);
        break;
    case DUET_CHAT_JSON_TRUE:
        duet_chat_buf_put(b, "true", 4);
        break;
    case DUET_CHAT_JSON_NUMBER:
        duet_chat_buf_put(b, v->text, v->text_len);
        break;
    case DUET_CHAT_JSON_STRING:
        duet_chat_json_string(b, v->text, v->text_len);
        break;
    case DUET_CHAT_JSON_ARRAY:
        duet_chat_buf_putc(b, '[');
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                duet_chat_buf_put(b, ", ", 2);
            duet_chat_json_write(b, v->items[i]);
        }
        duet_chat_buf_putc(b, ']');
        break;
    case DUET_CHAT_JSON_OBJECT:
        duet_chat_buf_putc(b, '{');
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                duet_chat_buf_put(b, ", ", 2);
            duet_chat_json_string(b, v->keys[i], v->key_lens[i]);
            duet_chat_buf_put(b, ": ", 2);
            duet_chat_json_write(b, v->items[i]);
        }
        duet_chat_buf_putc(b, '}');
        break;
    }
}

void duet_chat_json_free(duet_chat_json_t **pv)
{
    duet_chat_json_t *v = *pv;
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++) {
        if (v->items)
            duet_chat_json_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
    free(v->text);
    free(v);
    *pv = NULL;
}

/* ---- parsing ----------------------------------------------------------- */

/* CPython refuses to turn a decimal string of more digits than this into an
 * int (sys.int_info.default_max_str_digits), so json.loads fails on it. */
#define PY_INT_MAX_STR_DIGITS 4300

typedef struct {
    const char *s;
    size_t len, pos;
    int depth;
    duet_err_t *err;
    duet_status_t st;
} parser_t;

static int fail(parser_t *p, duet_status_t st, const char *what)
{
    if (p->st == DUET_OK) {
        p->st = st;
        if (st == DUET_ERR_NOMEM)
            duet_err_set(p->err, st, "out of memory parsing JSON");
        else
            duet_err_set(p->err, st, "%s at offset %zu", what, p->pos);
    }
    return -1;
}

static void skip_ws(parser_t *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int match(parser_t *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos >= n && memcmp(p->s + p->pos, word, n) == 0) {
        p->pos += n;
        return 1;
    }
    return 0;
}

static duet_chat_json_t *new_node(parser_t *p, duet_chat_json_kind_t kind)
{
    duet_chat_json_t *v = DUET_NEW(duet_chat_json_t);
    if (!v) {
        fail(p, DUET_ERR_NOMEM, "");
        return NULL;
    }
    v->kind = kind;
    return v;
}

static int set_text(parser_t *p, duet_chat_json_t *v, const char *s, size_t n)
{
    v->text = malloc(n + 1);
    if (!v->text)
        return fail(p, DUET_ERR_NOMEM, "");
    memcpy(v->text, s, n);
    v->text[n] = '\0';
    v->text_len = n;
    return 0;
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(duet_chat_buf_t *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    duet_chat_buf_put(b, u, n);
}

/* Reads a string literal (p->pos at the opening quote) into `b`, decoded. */
static int parse_string(parser_t *p, duet_chat_buf_t *b)
{
    p->pos++; /* opening quote */
    size_t run = p->pos;
    for (;;) {
        if (p->pos >= p->len)
            return fail(p, DUET_ERR_PARSE, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            duet_chat_buf_put(b, p->s + run, p->pos - run);
            p->pos++;
            break;
        }
        if (c < 0x20)
            return fail(p, DUET_ERR_PARSE, "control character inside a string");
        if (c != '\\') {
            p->pos++;
            continue;
        }
        duet_chat_buf_put(b, p->s + run, p->pos - run);
        if (p->pos + 1 >= p->len)
            return fail(p, DUET_ERR_PARSE, "unterminated string");
        char e = p->s[p->pos + 1];
        p->pos += 2;
        switch (e) {
        case '"': duet_chat_buf_putc(b, '"'); break;
        case '\\': duet_chat_buf_putc(b, '\\'); break;
        case '/': duet_chat_buf_putc(b, '/'); break;
        case 'b': duet_chat_buf_putc(b, '\b'); break;
        case 'f': duet_chat_buf_putc(b, '\f'); break;
        case 'n': duet_chat_buf_putc(b, '\n'); break;
        case 'r': duet_chat_buf_putc(b, '\r'); break;
        case 't': duet_chat_buf_putc(b, '\t'); break;
        case 'u': {
            unsigned cp, lo;
            p->pos -= 2;
            if (p->len - p->pos < 6 || hex4(p->s + p->pos + 2, &cp) < 0)
                return fail(p, DUET_ERR_PARSE, "bad \\u escape");
            p->pos += 6;
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return fail(p, DUET_ERR_PARSE, "lone low surrogate escape");
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                    hex4(p->s + p->pos + 2, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
                    return fail(p, DUET_ERR_PARSE, "lone high surrogate escape");
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            put_utf8(b, cp);
            break;
        }
        default:
            p->pos -= 1;
            return fail(p, DUET_ERR_PARSE, "invalid escape");
        }
        run = p->pos;
    }
    if (b->failed)
        return fail(p, DUET_ERR_NOMEM, "");
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static duet_chat_json_t *parse_number(parser_t *p)
{
    size_t start = p->pos;
    const char *s = p->s;
    if (match(p, "-Infinity")) {
        duet_chat_json_t *v = new_node(p, DUET_CHAT_JSON_NUMBER);
        if (v && set_text(p, v, "-Infinity", 9) < 0)
            duet_chat_json_free(&v);
        return v;
    }
    if (p->pos < p->len && s[p->pos] == '-')
        p->pos++;
    if (p->pos >= p->len || !is_digit(s[p->pos])) {
        fail(p, DUET_ERR_PARSE, "expected a value");
        return NULL;
    }
    if (s[p->pos] == '0')
        p->pos++;
    else
        while (p->pos < p->len && is_digit(s[p->pos]))
            p->pos++;
    int is_float = 0;
    if (p->pos + 1 < p->len && s[p->pos] == '.' && is_digit(s[p->pos + 1])) {
        is_float = 1;
        p->pos++;
        while (p->pos < p->len && is_digit(s[p->pos]))
            p->pos++;
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        size_t q = p->pos + 1;
        if (q < p->len && (s[q] == '+' || s[q] == '-'))
            q++;
        if (q < p->len && is_digit(s[q])) {
            is_float = 1;
            while (q < p->len && is_digit(s[q]))
                q++;
            p->pos = q;
        }
    }
    duet_chat_json_t *v = new_node(p, DUET_CHAT_JSON_NUMBER);
    if (!v)
        return NULL;
    size_t n = p->pos - start;
    if (is_float) {
        char stackbuf[64];
        char *tmp = n < sizeof stackbuf ? stackbuf : malloc(n + 1);
        if (!tmp) {
            fail(p, DUET_ERR_NOMEM, "");
            duet_chat_json_free(&v);
            return NULL;
        }
        memcpy(tmp, s + start, n);
        tmp[n] = '\0';
        char repr[32];
        duet_chat_json_float(strtod(tmp, NULL), repr);
        if (tmp != stackbuf)
            free(tmp);
        if (set_text(p, v, repr, strlen(repr)) < 0)
            duet_chat_json_free(&v);
        return v;
    }
    const char *digits = s + start;
    if (*digits == '-')
        digits++;
    if ((size_t)(s + p->pos - digits) > PY_INT_MAX_STR_DIGITS) {
        p->pos = start;
        fail(p, DUET_ERR_PARSE, "integer longer than 4300 digits");
        duet_chat_json_free(&v);
        return NULL;
    }
    if (n == 2 && s[start] == '-' && s[start + 1] == '0') { /* int("-0") is 0 */
        start++;
        n = 1;
    }
    if (set_text(p, v, s + start, n) < 0)
        duet_chat_json_free(&v);
    return v;
}

static duet_chat_json_t *parse_value(parser_t *p);

static int grow(parser_t *p, duet_chat_json_t *v, size_t *cap, int with_keys)
{
    if (v->n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 4;
    duet_chat_json_t **items = realloc(v->items, nc * sizeof *items);
    if (!items)
        return fail(p, DUET_ERR_NOMEM, "");
    v->items = items;
    if (with_keys) {
        char **keys = realloc(v->keys, nc * sizeof *keys);
        if (!keys)
            return fail(p, DUET_ERR_NOMEM, "");
        v->keys = keys;
        size_t *lens = realloc(v->key_lens, nc * sizeof *lens);
        if (!lens)
            return fail(p, DUET_ERR_NOMEM, "");
        v->key_lens = lens;
    }
    *cap = nc;
    return 0;
}

static duet_chat_json_t *parse_array(parser_t *p)
{
    duet_chat_json_t *v = new_node(p, DUET_CHAT_JSON_ARRAY);
    if (!v)
        return NULL;
    size_t cap = 0;
    p->pos++; /* [ */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        return v;
    }
    for (;;) {
        skip_ws(p);
        if (grow(p, v, &cap, 0) < 0)
            goto err;
        duet_chat_json_t *item = parse_value(p);
        if (!item)
            goto err;
        v->items[v->n++] = item;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == ']') {
            p->pos++;
            return v;
        }
        fail(p, DUET_ERR_PARSE, "expected ',' or ']'");
        goto err;
    }
err:
    duet_chat_json_free(&v);
    return NULL;
}

static duet_chat_json_t *parse_object(parser_t *p)
{
    duet_chat_json_t *v = new_node(p, DUET_CHAT_JSON_OBJECT);
    json_t *index = NULL; /* key -> member position, for repeated keys */
    duet_chat_buf_t key = {0};
    if (!v)
        return NULL;
    size_t cap = 0;
    p->pos++; /* { */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        return v;
    }
    index = json_object();
    if (!index) {
        fail(p, DUET_ERR_NOMEM, "");
        goto err;
    }
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') {
            fail(p, DUET_ERR_PARSE, "expected a key in double quotes");
            goto err;
        }
        key.len = 0;
        if (parse_string(p, &key) < 0)
            goto err;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            fail(p, DUET_ERR_PARSE, "expected ':'");
            goto err;
        }
        p->pos++;
        skip_ws(p);
        duet_chat_json_t *item = parse_value(p);
        if (!item)
            goto err;
        const char *kp = key.p ? key.p : "";
        json_t *at = json_object_getn(index, kp, key.len);
        if (at) { /* dict semantics: first position, last value */
            size_t i = (size_t)json_integer_value(at);
            duet_chat_json_free(&v->items[i]);
            v->items[i] = item;
        } else {
            if (grow(p, v, &cap, 1) < 0) {
                duet_chat_json_free(&item);
                goto err;
            }
            char *k = malloc(key.len + 1);
            json_t *pos = json_integer((json_int_t)v->n);
            if (!k || !pos || json_object_setn_new_nocheck(index, kp, key.len, pos) < 0) {
                free(k);
                duet_chat_json_free(&item);
                fail(p, DUET_ERR_NOMEM, "");
                goto err;
            }
            memcpy(k, kp, key.len);
            k[key.len] = '\0';
            v->keys[v->n] = k;
            v->key_lens[v->n] = key.len;
            v->items[v->n] = item;
            v->n++;
        }
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == '}') {
            p->pos++;
            break;
        }
        fail(p, DUET_ERR_PARSE, "expected ',' or '}'");
        goto err;
    }
    json_decref(index);
    duet_chat_buf_fini(&key);
    return v;
err:
    json_decref(index);
    duet_chat_buf_fini(&key);
    duet_chat_json_free(&v);
    return NULL;
}

static duet_chat_json_t *parse_value(parser_t *p)
{
    if (p->pos >= p->len) {
        fail(p, DUET_ERR_PARSE, "expected a value");
        return NULL;
    }
    char c = p->s[p->pos];
    duet_chat_json_t *v = NULL;
    switch (c) {
    case '{':
    case '[':
        if (p->depth >= DUET_CHAT_JSON_MAX_DEPTH) {
            fail(p, DUET_ERR_PARSE, "nesting too deep");
            return NULL;
        }
        p->depth++;
        v = c == '{' ? parse_object(p) : parse_array(p);
        p->depth--;
        return v;
    case '"': {
        duet_chat_buf_t b = {0};
        if (parse_string(p, &b) < 0) {
            duet_chat_buf_fini(&b);
            return NULL;
        }
        v = new_node(p, DUET_CHAT_JSON_STRING);
        if (v && set_text(p, v, b.p ? b.p : "", b.len) < 0)
            duet_chat_json_free(&v);
        duet_chat_buf_fini(&b);
        return v;
    }
    case 'n':
        if (match(p, "null"))
            return new_node(p, DUET_CHAT_JSON_NULL);
        break;
    case 't':
        if (match(p, "true"))
            return new_node(p, DUET_CHAT_JSON_TRUE);
        break;
    case 'f':
        if (match(p, "false"))
            return new_node(p, DUET_CHAT_JSON_FALSE);
        break;
    case 'N':
        if (match(p, "NaN")) {
            v = new_node(p, DUET_CHAT_JSON_NUMBER);
            if (v && set_text(p, v, "NaN", 3) < 0)
                duet_chat_json_free(&v);
            return v;
        }
        break;
    case 'I':
        if (match(p, "Infinity")) {
            v = new_node(p, DUET_CHAT_JSON_NUMBER);
            if (v && set_text(p, v, "Infinity", 8) < 0)
                duet_chat_json_free(&v);
            return v;
        }
        break;
    default:
        if (c == '-' || is_digit(c))
            return parse_number(p);
        break;
    }
    fail(p, DUET_ERR_PARSE, "expected a value");
    return NULL;
}

duet_status_t duet_chat_json_parse(const char *text, size_t len, duet_chat_json_t **out,
                                   duet_err_t *err)
{
    parser_t p = {.s = text, .len = len, .err = err, .st = DUET_OK};
    skip_ws(&p);
    duet_chat_json_t *v = parse_value(&p);
    if (!v)
        return p.st;
    skip_ws(&p);
    if (p.pos != p.len) {
        fail(&p, DUET_ERR_PARSE, "extra data after the value");
        duet_chat_json_free(&v);
        return p.st;
    }
    *out = v;
    return DUET_OK;
}
