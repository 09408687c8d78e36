/* Tokenizer loading (tokenizer.json through jansson), lookups and decoding.
 * Encoding lives in tokenizer_encode.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "hash.h"
#include "log.h"
#include "tokenizer_impl.h"
#include "unicode_table.h"

/* ---- byte-level map ------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order (0-32, then 127-160, then 173). */
uint32_t duet_tok_byte_char(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256u + b;
    if (b <= 160)
        return 256u + 33 + (b - 127u);
    return 256u + 33 + 34; /* 173 */
}

static size_t utf8_put(uint32_t c, char *o)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6);
        o[1] = (char)(0x80 | (c & 63));
        return 2;
    }
    o[0] = (char)(0xE0 | c >> 12); /* the byte map stays below U+0144 */
    o[1] = (char)(0x80 | ((c >> 6) & 63));
    o[2] = (char)(0x80 | (c & 63));
    return 3;
}

/* ---- buffers ------------------------------------------------------------- */

static duet_status_t grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return DUET_OK;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    size_t bytes;
    if (duet_mul_size(n, elem, &bytes) != 0)
        return DUET_ERR_NOMEM;
    void *q = realloc(*p, bytes);
    if (!q)
        return DUET_ERR_NOMEM;
    *p = q;
    *cap = n;
    return DUET_OK;
}

duet_status_t duet_tok_ids_push(duet_tok_ids_t *v, const int32_t *ids, size_t n)
{
    if (!n)
        return DUET_OK;
    if (n > SIZE_MAX - v->len || grow((void **)&v->ids, &v->cap, v->len + n, sizeof *ids))
        return DUET_ERR_NOMEM;
    memcpy(v->ids + v->len, ids, n * sizeof *ids);
    v->len += n;
    return DUET_OK;
}

duet_status_t duet_tok_bytes_push(duet_tok_bytes_t *b, const void *data, size_t n)
{
    if (!n)
        return DUET_OK;
    if (n > SIZE_MAX - b->len || grow((void **)&b->data, &b->cap, b->len + n, 1))
        return DUET_ERR_NOMEM;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    return DUET_OK;
}

void duet_tok_ids_fini(duet_tok_ids_t *v)
{
    free(v->ids);
    memset(v, 0, sizeof *v);
}

void duet_tok_bytes_fini(duet_tok_bytes_t *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- lookups ------------------------------------------------------------- */

int32_t duet_tok_vocab_find(const duet_tok_t *t, const char *s, size_t len)
{
    size_t i = (size_t)duet_hash64(s, len, 0) & t->vmask;
    for (;; i = (i + 1) & t->vmask) {
        const tok_vslot_t *v = &t->vindex[i];
        if (v->id < 0)
            return -1;
        if (v->len == len && memcmp(t->strs + v->off, s, len) == 0)
            return v->id;
    }
}

/* Exact lookup of an added-token text; -1 if absent. */
static int32_t trie_find(const tok_trie_t *tr, const char *s, size_t len)
{
    int32_t node = 0;
    for (size_t i = 0; i < len && node >= 0; i++) {
        int32_t c = tr->n ? tr->nodes[node].child : -1;
        while (c >= 0 && tr->nodes[c].byte != (uint8_t)s[i])
            c = tr->nodes[c].sibling;
        node = c;
    }
    return node > 0 ? tr->nodes[node].id : -1;
}

int32_t duet_tok_token_to_id(const duet_tok_t *t, const char *token, size_t len)
{
    int32_t id;
    if (len == 0)
        return -1;
    for (int k = 0; k < 2; k++)
        if ((id = trie_find(&t->added[k], token, len)) >= 0)
            return id;
    return duet_tok_vocab_find(t, token, len);
}

const char *duet_tok_id_to_token(const duet_tok_t *t, int32_t id)
{
    if (id < 0 || id >= t->vocab_size || !(t->flags[id] & TOK_F_PRESENT))
        return NULL;
    return t->strs + t->str_off[id];
}

const char *duet_tok_id_bytes(const duet_tok_t *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size || !(t->flags[id] & TOK_F_PRESENT))
        return NULL;
    *len = t->dec_len[id];
    return t->dec + t->dec_off[id];
}

bool duet_tok_is_special(const duet_tok_t *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size && (t->flags[id] & TOK_F_SPECIAL);
}

bool duet_tok_is_added(const duet_tok_t *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size && (t->flags[id] & TOK_F_ADDED);
}

int32_t duet_tok_vocab_size(const duet_tok_t *t)
{
    return t->vocab_size;
}

static const char *const special_text[DUET_TOK_NSPECIAL] = {
    [DUET_TOK_BOS] = "<｜begin▁of▁sentence｜>",
    [DUET_TOK_EOS] = "<｜end▁of▁sentence｜>",
    [DUET_TOK_PAD] = "<｜▁pad▁｜>",
    [DUET_TOK_USER] = "<｜User｜>",
    [DUET_TOK_ASSISTANT] = "<｜Assistant｜>",
    [DUET_TOK_THINK] = "<think>",
    [DUET_TOK_THINK_END] = "</think>",
    [DUET_TOK_DSML] = "｜DSML｜",
    [DUET_TOK_LATEST_REMINDER] = "<｜latest_reminder｜>",
};

const char *duet_tok_special_text(duet_tok_special_t which)
{
    return (unsigned)which < DUET_TOK_NSPECIAL ? special_text[which] : NULL;
}

int32_t duet_tok_special_id(const duet_tok_t *t, duet_tok_special_t which)
{
    return (unsigned)which < DUET_TOK_NSPECIAL ? t->special[which] : -1;
}

duet_status_t duet_tok_decode(const duet_tok_t *t, const int32_t *ids, size_t n, bool skip_special,
                              duet_tok_bytes_t *out, duet_err_t *err)
{
    size_t total = 0, len0 = out->len;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size || !(t->flags[id] & TOK_F_PRESENT))
            return duet_err_set(err, DUET_ERR_RANGE, "token id %d at position %zu names no token (vocab size %d)",
                                (int)id, i, (int)t->vocab_size);
        total += t->dec_len[id];
    }
    if (grow((void **)&out->data, &out->cap, len0 + total, 1))
        return duet_err_set(err, DUET_ERR_NOMEM, "decode: out of memory for %zu bytes", total);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (skip_special && (t->flags[id] & TOK_F_SPECIAL))
            continue;
        memcpy(out->data + out->len, t->dec + t->dec_off[id], t->dec_len[id]);
        out->len += t->dec_len[id];
    }
    return DUET_OK;
}

/* ---- loading ------------------------------------------------------------- */

typedef struct {
    const char *name;
    duet_err_t *err;
    duet_tok_t *t;
    size_t strs_len, strs_cap;
    const duet_tok_opts_t *opts;
    size_t n_vocab;    /* entries of model.vocab */
    int32_t *added_id; /* [added_tokens] id as the reference assigns it, -1 if skipped */
} loader_t;

#define LOAD_ERR(L, st, ...) duet_err_set((L)->err, (st), "%s: " __VA_ARGS__)

static int32_t str_add(loader_t *L, const char *s, size_t len)
{
    if (len >= UINT32_MAX / 2 || L->strs_len + len + 1 >= UINT32_MAX ||
        grow((void **)&L->t->strs, &L->strs_cap, L->strs_len + len + 1, 1))
        return -1;
    memcpy(L->t->strs + L->strs_len, s, len);
    L->t->strs[L->strs_len + len] = 0;
    int32_t off = (int32_t)L->strs_len;
    L->strs_len += len + 1;
    return off;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n)
        p *= 2;
    return p;
}

static duet_status_t trie_add(loader_t *L, tok_trie_t *tr, const char *s, size_t len, int32_t id)
{
    if (!tr->n) {
        if (grow((void **)&tr->nodes, &tr->cap, 1, sizeof *tr->nodes))
            return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
        tr->nodes[0] = (tok_trie_node_t){ .child = -1, .sibling = -1, .id = -1 };
        tr->n = 1;
    }
    tr->first[(uint8_t)s[0] >> 3] |= (uint8_t)(1u << ((uint8_t)s[0] & 7));
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t c = tr->nodes[node].child;
        while (c >= 0 && tr->nodes[c].byte != (uint8_t)s[i])
            c = tr->nodes[c].sibling;
        if (c < 0) {
            if (tr->n >= INT32_MAX || grow((void **)&tr->nodes, &tr->cap, tr->n + 1, sizeof *tr->nodes))
                return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
            c = (int32_t)tr->n++;
            tr->nodes[c] = (tok_trie_node_t){ .child = -1, .sibling = tr->nodes[node].child, .id = -1,
                                              .byte = (uint8_t)s[i] };
            tr->nodes[node].child = c;
        }
        node = c;
    }
    if (tr->nodes[node].id < 0) /* the first of duplicate texts wins */
        tr->nodes[node].id = id;
    return DUET_OK;
}

static duet_status_t get_id(loader_t *L, json_t *v, const char *what, int32_t *id)
{
    if (!json_is_integer(v))
        return LOAD_ERR(L, DUET_ERR_PARSE, "%s: id is not an integer", L->name, what);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= TOK_MAX_ID)
        return LOAD_ERR(L, DUET_ERR_CONFIG, "%s: id %lld is out of range [0, %d)", L->name, what,
                        (long long)x, TOK_MAX_ID);
    *id = (int32_t)x;
    return DUET_OK;
}

/* A JSON value that must be absent, null or false (for a flag duet does not implement). */
static duet_status_t want_off(loader_t *L, json_t *obj, const char *key, const char *where)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v) || (json_is_string(v) && !json_string_length(v)))
        return DUET_OK;
    if (json_is_real(v) && json_real_value(v) == 0.0)
        return DUET_OK;
    return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "%s.%s is set; duet does not implement it", L->name, where, key);
}

static duet_status_t load_normalizer(loader_t *L, json_t *n, const char *where)
{
    if (!n || json_is_null(n))
        return DUET_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *e;
        if (!json_is_array(list))
            return LOAD_ERR(L, DUET_ERR_PARSE, "%s.normalizers is not an array", L->name, where);
        json_array_foreach(list, i, e) {
            duet_status_t st = load_normalizer(L, e, "normalizer[]");
            if (st)
                return st;
        }
        return DUET_OK;
    }
    return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "%s: normalizer type %s is not implemented", L->name, where,
                    type ? type : "(none)");
}

/* The DeepSeek-V3/V4 split patterns, which run on native splitters. */
static const char ds_digits[] = "\\p{N}{1,3}";
static const char ds_cjk[] = "[一-龥぀-ゟ゠-ヿ]+";
static const char ds_main[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
static const char ds_main_esc[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* ByteLevel(use_regex=true): GPT-2's pattern. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static duet_status_t add_split(loader_t *L, const char *pat, size_t len, bool literal, tok_split_beh_t beh,
                               bool invert, const char *where)
{
    duet_tok_t *t = L->t;
    tok_split_t *s;
    size_t cap = (size_t)t->nsplits;
    if (grow((void **)&t->splits, &cap, (size_t)t->nsplits + 1, sizeof *t->splits))
        return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
    s = &t->splits[t->nsplits];
    *s = (tok_split_t){ .kind = TOK_SPLIT_PCRE2, .beh = beh, .invert = invert };
    if (!literal && beh == TOK_SPLIT_ISOLATED && !invert && !(L->opts && L->opts->force_pcre2)) {
        if (len == sizeof ds_digits - 1 && !memcmp(pat, ds_digits, len))
            s->kind = TOK_SPLIT_DS_DIGITS;
        else if (len == sizeof ds_cjk - 1 && !memcmp(pat, ds_cjk, len))
            s->kind = TOK_SPLIT_DS_CJK;
        else if ((len == sizeof ds_main - 1 && !memcmp(pat, ds_main, len)) ||
                 (len == sizeof ds_main_esc - 1 && !memcmp(pat, ds_main_esc, len)))
            s->kind = TOK_SPLIT_DS_MAIN;
    }
    if (s->kind == TOK_SPLIT_PCRE2) {
        char *tr = NULL;
        int ec;
        PCRE2_SIZE eo;
        char w[160];
        snprintf(w, sizeof w, "%s: %s", L->name, where);
        if (!literal && !(tr = duet_tok_regex_translate(pat, len, w, L->err)))
            return L->err ? L->err->status : DUET_ERR_UNSUPPORTED;
        s->re = pcre2_compile((PCRE2_SPTR)(literal ? pat : tr), literal ? len : PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &ec, &eo, NULL);
        free(tr);
        if (!s->re) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "%s: regex does not compile at offset %zu: %s", L->name,
                            where, (size_t)eo, (const char *)msg);
        }
        pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
        t->have_pcre2 = true;
    }
    t->nsplits++;
    return DUET_OK;
}

/* Flatten the pre-tokenizer into t->splits; sets *byte_level when a
 * ByteLevel step ends it. */
static duet_status_t load_pretok(loader_t *L, json_t *p, bool *byte_level)
{
    const char *type = json_string_value(json_object_get(p, "type"));
    duet_status_t st;
    if (*byte_level)
        return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "pre_tokenizer: steps after ByteLevel are not implemented",
                        L->name);
    if (!type)
        return LOAD_ERR(L, DUET_ERR_PARSE, "pre_tokenizer: missing type", L->name);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers"), *e;
        size_t i;
        if (!json_is_array(list))
            return LOAD_ERR(L, DUET_ERR_PARSE, "pre_tokenizer.pretokenizers is not an array", L->name);
        json_array_foreach(list, i, e) {
            if ((st = load_pretok(L, e, byte_level)))
                return st;
        }
        return DUET_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        if ((st = want_off(L, p, "add_prefix_space", "pre_tokenizer.ByteLevel")))
            return st;
        json_t *ur = json_object_get(p, "use_regex");
        if ((!ur || json_is_true(ur)) &&
            (st = add_split(L, gpt2_pattern, sizeof gpt2_pattern - 1, false, TOK_SPLIT_ISOLATED, false,
                            "pre_tokenizer.ByteLevel")))
            return st;
        *byte_level = true;
        return DUET_OK;
    }
    if (!strcmp(type, "Split")) {
        static const struct { const char *name; tok_split_beh_t beh; } behs[] = {
            { "Removed", TOK_SPLIT_REMOVED }, { "Isolated", TOK_SPLIT_ISOLATED },
            { "MergedWithPrevious", TOK_SPLIT_MERGED_PREV }, { "MergedWithNext", TOK_SPLIT_MERGED_NEXT },
            { "Contiguous", TOK_SPLIT_CONTIGUOUS },
        };
        json_t *pat = json_object_get(p, "pattern"), *re = json_object_get(pat, "Regex");
        json_t *lit = json_object_get(pat, "String");
        const char *bname = json_string_value(json_object_get(p, "behavior"));
        int b = -1;
        for (size_t i = 0; bname && i < sizeof behs / sizeof behs[0]; i++)
            if (!strcmp(bname, behs[i].name))
                b = (int)i;
        if (b < 0)
            return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "pre_tokenizer.Split: behavior %s is not implemented",
                            L->name, bname ? bname : "(none)");
        json_t *pv = json_is_string(re) ? re : lit;
        if (!json_is_string(pv) || !json_string_length(pv))
            return LOAD_ERR(L, DUET_ERR_PARSE, "pre_tokenizer.Split: pattern is not {\"Regex\"|\"String\": text}",
                            L->name);
        return add_split(L, json_string_value(pv), json_string_length(pv), pv == lit, behs[b].beh,
                         json_is_true(json_object_get(p, "invert")), "pre_tokenizer.Split");
    }
    return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "pre_tokenizer type %s is not implemented", L->name, type);
}

static duet_status_t load_vocab(loader_t *L, json_t *vocab)
{
    duet_tok_t *t = L->t;
    const char *key;
    json_t *v;
    size_t n = json_object_size(vocab);
    t->vmask = pow2_at_least(n * 2) - 1;
    if (!(t->vindex = duet_malloc_array(t->vmask + 1, sizeof *t->vindex)))
        return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
    for (size_t i = 0; i <= t->vmask; i++)
        t->vindex[i].id = -1;
    json_object_foreach(vocab, key, v) {
        int32_t id = -1, off;
        size_t len = strlen(key);
        duet_status_t st = get_id(L, v, "model.vocab", &id);
        if (st)
            return st;
        if (!len)
            return LOAD_ERR(L, DUET_ERR_CONFIG, "model.vocab: empty token string (id %d)", L->name, (int)id);
        if (duet_tok_vocab_find(t, key, len) >= 0)
            return LOAD_ERR(L, DUET_ERR_CONFIG, "model.vocab: duplicate token \"%s\"", L->name, key);
        if ((off = str_add(L, key, len)) < 0)
            return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
        size_t h = (size_t)duet_hash64(key, len, 0) & t->vmask;
        while (t->vindex[h].id >= 0)
            h = (h + 1) & t->vmask;
        t->vindex[h] = (tok_vslot_t){ .off = (uint32_t)off, .len = (uint32_t)len, .id = id };
    }
    return DUET_OK;
}

static duet_status_t load_merges(loader_t *L, json_t *merges)
{
    duet_tok_t *t = L->t;
    size_t n = json_array_size(merges), i;
    json_t *m;
    char buf[1024];
    t->mmask = pow2_at_least(n * 2) - 1;
    if (!(t->merges = duet_malloc_array(t->mmask + 1, sizeof *t->merges)))
        return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
    for (size_t k = 0; k <= t->mmask; k++)
        t->merges[k].key = UINT64_MAX;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == a || !sp[1])
                return LOAD_ERR(L, DUET_ERR_PARSE, "model.merges[%zu]: \"%s\" is not \"left right\"", L->name, i, a);
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            return LOAD_ERR(L, DUET_ERR_PARSE, "model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", L->name, i);
        }
        int32_t ia = duet_tok_vocab_find(t, a, la), ib = duet_tok_vocab_find(t, b, lb), ic = -1;
        if (la + lb <= sizeof buf) {
            memcpy(buf, a, la);
            memcpy(buf + la, b, lb);
            ic = duet_tok_vocab_find(t, buf, la + lb);
        }
        if (ia < 0 || ib < 0 || ic < 0)
            return LOAD_ERR(L, DUET_ERR_CONFIG, "model.merges[%zu]: \"%.*s\" is not in the vocabulary", L->name, i,
                            ia < 0 ? (int)la : ib < 0 ? (int)lb : (int)(la + lb),
                            ia < 0 ? a : ib < 0 ? b : (la + lb <= sizeof buf ? buf : "(too long)"));
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->mmask;
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key)
            h = (h + 1) & t->mmask;
        /* a repeated pair takes the later rank, as the reference's map does */
        t->merges[h] = (tok_merge_t){ .key = key, .rank = (uint32_t)i, .id = ic };
    }
    return DUET_OK;
}

static duet_status_t load_model(loader_t *L, json_t *model)
{
    duet_tok_t *t = L->t;
    duet_status_t st;
    const char *type = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(model))
        return LOAD_ERR(L, DUET_ERR_PARSE, "model is missing or not an object", L->name);
    if (type ? strcmp(type, "BPE") != 0 : !merges)
        return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "model type %s is not implemented (only BPE)", L->name,
                        type ? type : "(none)");
    if (!json_is_object(vocab))
        return LOAD_ERR(L, DUET_ERR_PARSE, "model.vocab is missing or not an object", L->name);
    if (!json_is_array(merges))
        return LOAD_ERR(L, DUET_ERR_PARSE, "model.merges is missing or not an array", L->name);
    if ((st = want_off(L, model, "dropout", "model")) || (st = want_off(L, model, "byte_fallback", "model")) ||
        (st = want_off(L, model, "continuing_subword_prefix", "model")) ||
        (st = want_off(L, model, "end_of_word_suffix", "model")))
        return st;
    L->n_vocab = json_object_size(vocab);
    if ((st = load_vocab(L, vocab)) || (st = load_merges(L, merges)))
        return st;
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk) && (t->unk_id = duet_tok_vocab_find(t, json_string_value(unk), json_string_length(unk))) < 0)
        return LOAD_ERR(L, DUET_ERR_CONFIG, "model.unk_token \"%s\" is not in the vocabulary", L->name,
                        json_string_value(unk));
    for (int b = 0; b < 256; b++) {
        char u[4];
        t->byte_id[b] = duet_tok_vocab_find(t, u, utf8_put(duet_tok_byte_char((uint8_t)b), u));
    }
    return DUET_OK;
}

/* Added tokens get their ids as the reference assigns them, not from the
 * file: the vocabulary id when the text is a vocabulary token, the earlier
 * id for a repeated text, otherwise the next id after the model vocabulary
 * (its entry count) or after the largest added id.  For files the
 * reference wrote the two agree; where they do not, the model was served
 * with the reference's ids. */
static duet_status_t load_added(loader_t *L, json_t *added)
{
    duet_tok_t *t = L->t;
    size_t i;
    json_t *a;
    int32_t max_added = -1;
    if (!added || json_is_null(added))
        return DUET_OK;
    if (!json_is_array(added))
        return LOAD_ERR(L, DUET_ERR_PARSE, "added_tokens is not an array", L->name);
    if (!(L->added_id = duet_malloc_array(json_array_size(added) + 1, sizeof *L->added_id)))
        return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
    json_array_foreach(added, i, a) {
        int32_t id = -1;
        char where[64];
        json_t *c = json_object_get(a, "content"), *norm = json_object_get(a, "normalized");
        duet_status_t st;
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        L->added_id[i] = -1;
        if ((st = get_id(L, json_object_get(a, "id"), where, &id)))
            return st;
        if (!json_is_string(c))
            return LOAD_ERR(L, DUET_ERR_PARSE, "%s: content is missing", L->name, where);
        if ((st = want_off(L, a, "lstrip", where)) || (st = want_off(L, a, "rstrip", where)) ||
            (st = want_off(L, a, "single_word", where)))
            return st;
        const char *text = json_string_value(c);
        size_t len = json_string_length(c);
        if (!len) /* skipped, as the reference does */
            continue;
        int32_t have = trie_find(&t->added[0], text, len);
        if (have < 0)
            have = trie_find(&t->added[1], text, len);
        if (have < 0)
            have = duet_tok_vocab_find(t, text, len);
        if (have < 0)
            have = max_added >= 0 && ((size_t)max_added >= L->n_vocab || !L->n_vocab) ? max_added + 1
                                                                                       : (int32_t)L->n_vocab;
        if (have >= TOK_MAX_ID)
            return LOAD_ERR(L, DUET_ERR_CONFIG, "%s: id %d is out of range", L->name, where, (int)have);
        if (have != id)
            duet_warn("%s: %s \"%s\": id %d in the file, %d as the reference assigns it; using %d", L->name,
                      where, text, (int)id, (int)have, (int)have);
        L->added_id[i] = have;
        if (have > max_added)
            max_added = have;
        bool special = json_is_true(json_object_get(a, "special"));
        /* normalized defaults to !special, as in the reference */
        bool normalized = norm ? json_is_true(norm) : !special;
        if ((st = trie_add(L, &t->added[normalized], text, len, have)))
            return st;
        t->have_added = true;
    }
    return DUET_OK;
}

/* Second pass over the added tokens once the id range is known. */
static duet_status_t fill_ids(loader_t *L, json_t *added)
{
    duet_tok_t *t = L->t;
    int32_t max_id = -1;
    size_t i;
    json_t *a;
    for (size_t k = 0; k <= t->vmask; k++)
        if (t->vindex[k].id > max_id)
            max_id = t->vindex[k].id;
    for (i = 0; i < json_array_size(added); i++)
        if (L->added_id[i] > max_id)
            max_id = L->added_id[i];
    t->vocab_size = max_id + 1;
    size_t n = (size_t)t->vocab_size;
    if (!(t->flags = duet_calloc(n ? n : 1, 1)) || !(t->str_off = duet_calloc(n ? n : 1, 4)) ||
        !(t->str_len = duet_calloc(n ? n : 1, 4)) || !(t->dec_off = duet_calloc(n ? n : 1, 4)) ||
        !(t->dec_len = duet_calloc(n ? n : 1, 4)))
        return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
    for (size_t k = 0; k <= t->vmask; k++) {
        const tok_vslot_t *v = &t->vindex[k];
        if (v->id < 0)
            continue;
        if (t->flags[v->id])
            return LOAD_ERR(L, DUET_ERR_CONFIG, "model.vocab: id %d is used by two tokens", L->name, (int)v->id);
        t->flags[v->id] = TOK_F_PRESENT;
        t->str_off[v->id] = v->off;
        t->str_len[v->id] = v->len;
    }
    json_array_foreach(added, i, a) {
        int32_t id = L->added_id[i];
        json_t *c = json_object_get(a, "content");
        if (id < 0)
            continue;
        int32_t off = str_add(L, json_string_value(c), json_string_length(c));
        if (off < 0)
            return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
        t->flags[id] = TOK_F_PRESENT | TOK_F_ADDED |
                       (json_is_true(json_object_get(a, "special")) ? TOK_F_SPECIAL : 0);
        t->str_off[id] = (uint32_t)off;
        t->str_len[id] = (uint32_t)json_string_length(c);
    }
    /* Decoded bytes: BPE tokens through the inverse byte map (a token with a
     * character outside the map decodes to its own UTF-8, as the reference's
     * ByteLevel decoder does), added tokens as their text. */
    int16_t inv[0x144];
    size_t dec_len = 0, dec_cap = 0;
    for (int c = 0; c < 0x144; c++)
        inv[c] = -1;
    for (int b = 0; b < 256; b++)
        inv[duet_tok_byte_char((uint8_t)b)] = (int16_t)b;
    for (int32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->flags[id] & TOK_F_PRESENT))
            continue;
        const uint8_t *s = (const uint8_t *)t->strs + t->str_off[id];
        size_t len = t->str_len[id], o = 0;
        if (grow((void **)&t->dec, &dec_cap, dec_len + len, 1))
            return LOAD_ERR(L, DUET_ERR_NOMEM, "out of memory", L->name);
        uint8_t *d = (uint8_t *)t->dec + dec_len;
        bool mapped = !(t->flags[id] & TOK_F_ADDED);
        for (size_t k = 0; k < len && mapped;) {
            uint32_t c;
            if (s[k] < 0x80)
                c = s[k++];
            else if ((s[k] & 0xE0) == 0xC0 && k + 1 < len)
                c = (uint32_t)(s[k] & 0x1F) << 6 | (s[k + 1] & 0x3F), k += 2;
            else
                c = 0x144;
            if (c >= 0x144 || inv[c] < 0)
                mapped = false;
            else
                d[o++] = (uint8_t)inv[c];
        }
        if (!mapped) {
            memcpy(d, s, len);
            o = len;
        }
        t->dec_off[id] = (uint32_t)dec_len;
        t->dec_len[id] = (uint32_t)o;
        dec_len += o;
    }
    return DUET_OK;
}

static duet_status_t load_decoder(loader_t *L, json_t *d)
{
    const char *type = json_string_value(json_object_get(d, "type"));
    if (type && !strcmp(type, "ByteLevel"))
        return DUET_OK;
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders");
        if (json_is_array(list) && json_array_size(list) == 1)
            return load_decoder(L, json_array_get(list, 0));
    }
    return LOAD_ERR(L, DUET_ERR_UNSUPPORTED, "decoder %s is not implemented (only ByteLevel)", L->name,
                    type ? type : "(none)");
}

duet_status_t duet_tok_create_from_json(const char *json, size_t len, const char *name,
                                        const duet_tok_opts_t *opts, duet_tok_t **out, duet_err_t *err)
{
    loader_t L = { .name = name ? name : "tokenizer.json", .err = err, .opts = opts };
    json_error_t jerr;
    duet_status_t st;
    bool byte_level = false;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return duet_err_set(err, DUET_ERR_PARSE, "%s: line %d column %d: %s", L.name, jerr.line, jerr.column,
                            jerr.text);
    if (!(L.t = DUET_NEW(duet_tok_t))) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", L.name);
        goto err_json;
    }
    if (!json_is_object(root)) {
        st = LOAD_ERR(&L, DUET_ERR_PARSE, "top level is not an object", L.name);
        goto err_tok;
    }
    json_t *added = json_object_get(root, "added_tokens"), *pre = json_object_get(root, "pre_tokenizer");
    if ((st = load_model(&L, json_object_get(root, "model"))) || (st = load_added(&L, added)) ||
        (st = fill_ids(&L, added)) || (st = load_normalizer(&L, json_object_get(root, "normalizer"), "normalizer")) ||
        (st = load_decoder(&L, json_object_get(root, "decoder"))))
        goto err_tok;
    if (!pre || json_is_null(pre) || (st = load_pretok(&L, pre, &byte_level)) || !byte_level) {
        if (!st)
            st = LOAD_ERR(&L, DUET_ERR_UNSUPPORTED, "pre_tokenizer does not end in ByteLevel: not a byte-level BPE",
                          L.name);
        goto err_tok;
    }
    for (int k = 0; k < DUET_TOK_NSPECIAL; k++)
        L.t->special[k] = duet_tok_token_to_id(L.t, special_text[k], strlen(special_text[k]));
    size_t ce = opts && opts->cache_entries ? opts->cache_entries : 16384;
    if (ce != SIZE_MAX) {
        L.t->cache_mask = pow2_at_least(ce) - 1;
        if (!(L.t->cache = duet_calloc(L.t->cache_mask + 1, sizeof *L.t->cache))) {
            st = LOAD_ERR(&L, DUET_ERR_NOMEM, "out of memory", L.name);
            goto err_tok;
        }
    }
    json_decref(root);
    free(L.added_id);
    *out = L.t;
    return DUET_OK;

err_tok:
    duet_tok_destroy(&L.t);
    free(L.added_id);
err_json:
    json_decref(root);
    return st;
}

duet_status_t duet_tok_create(const char *path, const duet_tok_opts_t *opts, duet_tok_t **out, duet_err_t *err)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len;
    duet_status_t st;
    if (!f)
        return duet_err_set(err, DUET_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = duet_err_set(err, DUET_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
        goto err_close;
    }
    if (!(buf = malloc(len ? (size_t)len : 1))) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory for %ld bytes", path, len);
        goto err_close;
    }
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        st = duet_err_set(err, DUET_ERR_IO, "%s: read failed", path);
        goto err_free;
    }
    st = duet_tok_create_from_json(buf, (size_t)len, path, opts, out, err);
err_free:
    free(buf);
err_close:
    fclose(f);
    return st;
}

void duet_tok_destroy(duet_tok_t **tp)
{
    duet_tok_t *t = tp ? *tp : NULL;
    if (!t)
        return;
    for (int i = 0; i < t->nsplits; i++)
        pcre2_code_free(t->splits[i].re);
    free(t->splits);
    free(t->added[0].nodes);
    free(t->added[1].nodes);
    free(t->flags);
    free(t->str_off);
    free(t->str_len);
    free(t->dec_off);
    free(t->dec_len);
    free(t->strs);
    free(t->dec);
    free(t->vindex);
    free(t->merges);
    free(t->cache);
    free(t);
    *tp = NULL;
}
