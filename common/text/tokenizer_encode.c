/* Encoding: invalid UTF-8 replacement, added-token extraction, the
 * pre-tokenizer (native DeepSeek splitters or PCRE2), byte-level BPE with a
 * bounded pre-token cache.  Every step mirrors the `tokenizers` package; the
 * comments name the rule of the reference each piece follows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "hash.h"
#include "tokenizer_impl.h"
#include "unicode_table.h"

/* ---- regex translation (Oniguruma syntax -> PCRE2) ----------------------- */

typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1)
            c *= 2;
        char *p = realloc(b->s, c);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = c;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_str(sbuf_t *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

/* Class body for a class escape or property name; -1 when PCRE2 may keep it. */
static int class_bit(const char *name, size_t n)
{
    static const struct { const char *name; int bit; } props[] = {
        { "L", 0 }, { "Letter", 0 }, { "M", 1 }, { "Mark", 1 }, { "N", 2 }, { "Number", 2 },
        { "P", 3 }, { "Punctuation", 3 }, { "S", 4 }, { "Symbol", 4 }, { "Nd", 6 }, { "Decimal_Number", 6 },
    };
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)
        if (strlen(props[i].name) == n && !memcmp(props[i].name, name, n))
            return props[i].bit;
    return -1;
}

/* Oniguruma and PCRE2 agree on most syntax; they differ on what \s, \w, \d,
 * \h and the Unicode properties match (Oniguruma: White_Space, its own word
 * class, hex digits, and a newer Unicode version).  Those become explicit
 * classes from unicode_table.c, so the translated regex matches what the
 * reference matches whatever the Unicode version of the system PCRE2 (14 or
 * later).  A negated class escape inside a bracket ([^\S]) has no PCRE2
 * spelling and is refused. */
char *duet_tok_regex_translate(const char *src, size_t len, const char *where, duet_err_t *err)
{
    sbuf_t b = { 0 };
    bool in_class = false;
    char tmp[16];
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '[' && !in_class) {
            in_class = true;
            sb_put(&b, "[", 1);
            if (i + 1 < len && src[i + 1] == '^')
                sb_put(&b, &src[++i], 1);
            if (i + 1 < len && src[i + 1] == ']') /* leading ] is literal */
                sb_put(&b, "\\]", 2), i++;
            continue;
        }
        if (c == '[' && in_class && !(i + 1 < len && src[i + 1] == ':')) {
            duet_err_set(err, DUET_ERR_UNSUPPORTED, "%s: nested character classes are not implemented", where);
            goto err;
        }
        if (c == ']' && in_class) {
            in_class = false;
            sb_put(&b, "]", 1);
            continue;
        }
        if (c != '\\' || i + 1 >= len) {
            sb_put(&b, &c, 1);
            continue;
        }
        char e = src[++i];
        int bit = -1;
        bool neg = false;
        const char *body = NULL;
        switch (e) {
        case 's': case 'S': bit = 5; neg = e == 'S'; break;
        case 'w': case 'W': bit = 7; neg = e == 'W'; break;
        case 'd': case 'D': bit = 6; neg = e == 'D'; break;
        case 'h': case 'H': body = "0-9a-fA-F"; neg = e == 'H'; break;
        case 'p': case 'P': {
            const char *close = i + 1 < len && src[i + 1] == '{' ? memchr(src + i + 2, '}', len - i - 2) : NULL;
            if (close) {
                const char *name = src + i + 2;
                neg = e == 'P';
                if (name < close && *name == '^')
                    neg = !neg, name++;
                bit = class_bit(name, (size_t)(close - name));
                if (bit >= 0)
                    i = (size_t)(close - src);
            }
            break;
        }
        case 'u': /* \uHHHH */
            if (i + 4 < len) {
                snprintf(tmp, sizeof tmp, "\\x{%.4s}", src + i + 1);
                sb_str(&b, tmp);
                i += 4;
                continue;
            }
            break;
        default:
            break;
        }
        if (bit >= 0)
            body = duet_uni_pcre2_class[bit];
        if (!body) {
            char esc[2] = { '\\', e };
            sb_put(&b, esc, 2);
            continue;
        }
        if (in_class && neg) {
            duet_err_set(err, DUET_ERR_UNSUPPORTED, "%s: negated class escape \\%c inside [...] is not implemented",
                         where, e);
            goto err;
        }
        if (!in_class)
            sb_str(&b, neg ? "[^" : "[");
        sb_str(&b, body);
        if (!in_class)
            sb_str(&b, "]");
    }
    if (b.oom || !b.s) {
        duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", where);
        goto err;
    }
    return b.s;
err:
    free(b.s);
    return NULL;
}

/* ---- UTF-8 --------------------------------------------------------------- */

/* Length of the well-formed sequence at s[0..n) (Unicode table 3-7), or 0
 * with *bad the length of its maximal ill-formed subpart. */
static size_t utf8_valid_len(const uint8_t *s, size_t n, size_t *bad)
{
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n || s[k] < lo || s[k] > hi) {
            *bad = k;
            return 0;
        }
        lo = 0x80, hi = 0xBF;
    }
    return need;
}

/* NULL when s is valid UTF-8; otherwise a new buffer in which each maximal
 * ill-formed subpart became U+FFFD (Python's "replace"), its length in *outn.
 * Sets *oom on allocation failure. */
static char *utf8_sanitize(const char *text, size_t n, size_t *outn, bool *oom)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0, bad = 0, l;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        if (!(l = utf8_valid_len(s + i, n - i, &bad)))
            break;
        i += l;
    }
    if (i == n)
        return NULL;
    size_t cap;
    char *o;
    /* each bad byte grows to at most 3; 64 bytes of slack for the JIT (below) */
    if (duet_mul_size(n, 3, &cap) || cap > SIZE_MAX - 64 || !(o = malloc(cap += 64))) {
        *oom = true;
        return NULL;
    }
    memcpy(o, text, i);
    size_t k = i;
    while (i < n) {
        if ((l = utf8_valid_len(s + i, n - i, &bad))) {
            memcpy(o + k, s + i, l);
            k += l;
            i += l;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i += bad;
        }
    }
    /* PCRE2's JIT loads whole aligned vectors, which may reach past the
     * subject's end: keep those bytes inside the block and defined */
    memset(o + k, 0, cap - k);
    *outn = k;
    return o;
}

/* Decode the (valid) character at s[*i] and advance. */
static inline uint32_t utf8_next(const uint8_t *s, size_t *i)
{
    uint32_t c = s[*i];
    if (c < 0x80) {
        *i += 1;
        return c;
    }
    if (c < 0xE0) {
        c = (c & 0x1F) << 6 | (s[*i + 1] & 0x3F);
        *i += 2;
    } else if (c < 0xF0) {
        c = (c & 0x0F) << 12 | (uint32_t)(s[*i + 1] & 0x3F) << 6 | (s[*i + 2] & 0x3F);
        *i += 3;
    } else {
        c = (c & 0x07) << 18 | (uint32_t)(s[*i + 1] & 0x3F) << 12 | (uint32_t)(s[*i + 2] & 0x3F) << 6 |
            (s[*i + 3] & 0x3F);
        *i += 4;
    }
    return c;
}

/* ---- encoder state ------------------------------------------------------- */

typedef struct {
    const duet_tok_t *t;
    duet_tok_ids_t *out;
    bool oom;
    pcre2_match_data *md;
    /* BPE scratch for long pieces */
    void *scratch;
    size_t scratch_cap;
} enc_t;

static inline void emit(enc_t *e, const int32_t *ids, size_t n)
{
    if (!e->oom && duet_tok_ids_push(e->out, ids, n))
        e->oom = true;
}

/* ---- BPE ----------------------------------------------------------------- */

#define BPE_SMALL 256 /* pieces up to this many bytes merge on the stack */

/* Initial symbols: one per byte, through the byte map; a byte without a
 * token becomes unk (fused when fuse_unk) or is dropped, as the reference
 * does.  Returns the symbol count. */
static size_t bpe_init(const duet_tok_t *t, const uint8_t *s, size_t n, int32_t *id)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t x = t->byte_id[s[i]];
        if (x < 0) {
            if (t->unk_id < 0 || (t->fuse_unk && m && id[m - 1] == t->unk_id))
                continue;
            x = t->unk_id;
        }
        id[m++] = x;
    }
    return m;
}

static inline uint32_t pair_rank(const duet_tok_t *t, int32_t a, int32_t b, int32_t *merged)
{
    const tok_merge_t *mg = duet_tok_merge_find(t, a, b);
    if (!mg)
        return TOK_NO_RANK;
    *merged = mg->id;
    return mg->rank;
}

/* Merge the lowest-ranked adjacent pair, leftmost first, until none is left:
 * the reference's rule.  Small pieces scan a rank array (n is small, the
 * scan is cache-friendly); long ones (CJK runs, whitespace runs) use a
 * binary heap with lazy invalidation, as the reference does. */
static size_t bpe_merge_small(const duet_tok_t *t, int32_t *id, size_t n)
{
    uint32_t rank[BPE_SMALL];
    int32_t merged[BPE_SMALL];
    for (size_t i = 0; i + 1 < n; i++)
        rank[i] = pair_rank(t, id[i], id[i + 1], &merged[i]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best])
                best = i;
        if (rank[best] == TOK_NO_RANK)
            break;
        id[best] = merged[best];
        /* drop symbol best+1 and pair best+1; pairs after it shift left */
        size_t tail = n >= best + 3 ? n - best - 3 : 0;
        memmove(&id[best + 1], &id[best + 2], (n - best - 2) * sizeof *id);
        memmove(&rank[best + 1], &rank[best + 2], tail * sizeof *rank);
        memmove(&merged[best + 1], &merged[best + 2], tail * sizeof *merged);
        n--;
        if (best > 0)
            rank[best - 1] = pair_rank(t, id[best - 1], id[best], &merged[best - 1]);
        if (best + 1 < n)
            rank[best] = pair_rank(t, id[best], id[best + 1], &merged[best]);
    }
    return n;
}

static inline void heap_push(uint64_t *h, size_t *hn, uint64_t v)
{
    size_t i = (*hn)++;
    while (i && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *hn)
{
    uint64_t top = h[0], v = h[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    if (n)
        h[i] = v;
    return top;
}

/* Heap entries are rank << 32 | position: the lowest rank pops first, and
 * among equal ranks the leftmost.  An entry is stale when its left symbol
 * is gone or the pair now there has another rank (a pair's text only grows,
 * so an equal rank means the same pair). */
static size_t bpe_merge_heap(enc_t *e, int32_t *id, size_t n)
{
    const duet_tok_t *t = e->t;
    size_t need, hn = 0;
    if (duet_mul_size(n, 3 * sizeof(uint64_t) + 2 * sizeof(int32_t), &need)) {
        e->oom = true;
        return 0;
    }
    if (need > e->scratch_cap) {
        void *p = realloc(e->scratch, need);
        if (!p) {
            e->oom = true;
            return 0;
        }
        e->scratch = p;
        e->scratch_cap = need;
    }
    uint64_t *heap = e->scratch;
    int32_t *next = (int32_t *)(heap + 2 * n), *prev = next + n;
    for (size_t i = 0; i < n; i++) {
        int32_t m;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
        uint32_t r = i + 1 < n ? pair_rank(t, id[i], id[i + 1], &m) : TOK_NO_RANK;
        if (r != TOK_NO_RANK)
            heap_push(heap, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t r = (uint32_t)(top >> 32), pos = (uint32_t)top;
        int32_t m = -1, nx = next[pos];
        if (id[pos] < 0 || nx < 0 || pair_rank(t, id[pos], id[nx], &m) != r)
            continue;
        id[pos] = m;
        id[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0)
            prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0 && (r = pair_rank(t, id[prev[pos]], m, &m)) != TOK_NO_RANK)
            heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && (r = pair_rank(t, id[pos], id[next[pos]], &m)) != TOK_NO_RANK)
            heap_push(heap, &hn, (uint64_t)r << 32 | pos);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (id[i] >= 0)
            id[k++] = id[i];
    return k;
}

static inline uint32_t piece_hash(const uint8_t *s, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    if (i < n) {
        w = 0;
        memcpy(&w, s + i, n - i);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    }
    h ^= h >> 29;
    return (uint32_t)(h * 0x94D049BB133111EBull >> 32);
}

/* Cache probe: the ids of piece s[0..n) (n <= TOK_CACHE_KEY) into ids;
 * their count, 0 on a miss. */
static size_t cache_get(tok_cache_entry_t *ce, uint32_t h, const uint8_t *s, size_t n, int32_t *ids)
{
    uint64_t key[3] = { 0 }, v1 = atomic_load_explicit(&ce->ver, memory_order_acquire);
    if (v1 & 1)
        return 0;
    uint64_t meta = atomic_load_explicit(&ce->meta, memory_order_relaxed);
    if ((uint32_t)(meta >> 32) != h || (meta & 0xFF) != n)
        return 0;
    memcpy(key, s, n);
    for (int i = 0; i < 3; i++)
        if (atomic_load_explicit(&ce->key[i], memory_order_relaxed) != key[i])
            return 0;
    size_t nids = (meta >> 8) & 0xFF;
    for (size_t i = 0; i < nids; i += 2) {
        uint64_t w = atomic_load_explicit(&ce->ids[i / 2], memory_order_relaxed);
        ids[i] = (int32_t)(uint32_t)w;
        ids[i + 1] = (int32_t)(uint32_t)(w >> 32);
    }
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&ce->ver, memory_order_relaxed) == v1 ? nids : 0;
}

static void cache_put(tok_cache_entry_t *ce, uint32_t h, const uint8_t *s, size_t n, const int32_t *ids,
                      size_t nids)
{
    uint64_t key[3] = { 0 }, v = atomic_load_explicit(&ce->ver, memory_order_relaxed);
    if ((v & 1) || !atomic_compare_exchange_strong_explicit(&ce->ver, &v, v + 1, memory_order_acquire,
                                                            memory_order_relaxed))
        return; /* another thread is writing it: skip */
    atomic_thread_fence(memory_order_release);
    memcpy(key, s, n);
    atomic_store_explicit(&ce->meta, (uint64_t)h << 32 | nids << 8 | n, memory_order_relaxed);
    for (int i = 0; i < 3; i++)
        atomic_store_explicit(&ce->key[i], key[i], memory_order_relaxed);
    for (size_t i = 0; i < nids; i += 2)
        atomic_store_explicit(&ce->ids[i / 2],
                              (uint64_t)(uint32_t)ids[i] | (i + 1 < nids ? (uint64_t)(uint32_t)ids[i + 1] << 32 : 0),
                              memory_order_relaxed);
    atomic_store_explicit(&ce->ver, v + 2, memory_order_release);
}

/* Encode one pre-token. */
static void bpe_piece(enc_t *e, const uint8_t *s, size_t n)
{
    const duet_tok_t *t = e->t;
    int32_t small[BPE_SMALL], *id = small;
    tok_cache_entry_t *ce = NULL;
    uint32_t h = 0;

    /* one or two bytes: no cache needed */
    if (n <= 2 && t->byte_id[s[0]] >= 0 && t->byte_id[s[n - 1]] >= 0 && !t->ignore_merges) {
        int32_t two[2] = { t->byte_id[s[0]], t->byte_id[s[n - 1]] };
        const tok_merge_t *m = n == 2 ? duet_tok_merge_find(t, two[0], two[1]) : NULL;
        if (m)
            emit(e, &m->id, 1);
        else
            emit(e, two, n);
        return;
    }
    if (t->ignore_merges) { /* the whole piece as one token, when it is one */
        char buf[4 * BPE_SMALL];
        size_t k = 0;
        for (size_t i = 0; i < n && n <= BPE_SMALL; i++) {
            uint32_t c = duet_tok_byte_char(s[i]);
            if (c < 0x80)
                buf[k++] = (char)c;
            else
                buf[k++] = (char)(0xC0 | c >> 6), buf[k++] = (char)(0x80 | (c & 63));
        }
        int32_t whole = n <= BPE_SMALL ? duet_tok_vocab_find(t, buf, k) : -1;
        if (whole >= 0) {
            emit(e, &whole, 1);
            return;
        }
    }
    if (t->cache && n <= TOK_CACHE_KEY) {
        int32_t hit[TOK_CACHE_IDS];
        size_t nh;
        h = piece_hash(s, n);
        ce = &t->cache[h & t->cache_mask];
        if ((nh = cache_get(ce, h, s, n, hit))) {
            emit(e, hit, nh);
            return;
        }
    }
    if (n > BPE_SMALL && !(id = malloc(n * sizeof *id))) {
        e->oom = true;
        return;
    }
    size_t m = bpe_init(t, s, n, id);
    m = m <= BPE_SMALL ? bpe_merge_small(t, id, m) : bpe_merge_heap(e, id, m);
    emit(e, id, m);
    if (ce && m && m <= TOK_CACHE_IDS)
        cache_put(ce, h, s, n, id, m);
    if (id != small)
        free(id);
}

/* ---- pre-tokenizer --------------------------------------------------------- */

static void pretok(enc_t *e, int k, const uint8_t *s, size_t n);

/* Hand a piece to the next step (empty pieces are dropped, as the
 * reference drops them). */
static inline void next_step(enc_t *e, int k, const uint8_t *s, size_t a, size_t b)
{
    if (b > a)
        pretok(e, k + 1, s + a, b - a);
}

/* \p{N}{1,3}, Isolated: runs of numbers cut every three characters. */
static void split_digits(enc_t *e, int k, const uint8_t *s, size_t n)
{
    size_t i = 0, gap = 0;
    while (i < n) {
        size_t j = i;
        uint32_t c = utf8_next(s, &j);
        if (!(duet_uni_class(c) & DUET_UNI_N)) {
            i = j;
            continue;
        }
        next_step(e, k, s, gap, i);
        for (int cnt = 1; cnt < 3 && j < n; cnt++) {
            size_t j2 = j;
            if (!(duet_uni_class(utf8_next(s, &j2)) & DUET_UNI_N))
                break;
            j = j2;
        }
        next_step(e, k, s, i, j);
        i = gap = j;
    }
    next_step(e, k, s, gap, n);
}

static inline bool is_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);
}

/* [一-龥぀-ゟ゠-ヿ]+, Isolated. */
static void split_cjk(enc_t *e, int k, const uint8_t *s, size_t n)
{
    size_t i = 0, gap = 0;
    while (i < n) {
        if (s[i] < 0xE3 || s[i] > 0xE9) { /* every such character starts with E3..E9 */
            i += s[i] < 0x80 ? 1 : s[i] < 0xE0 ? 2 : s[i] < 0xF0 ? 3 : 4;
            continue;
        }
        size_t j = i;
        if (!is_cjk(utf8_next(s, &j))) {
            i = j;
            continue;
        }
        next_step(e, k, s, gap, i);
        for (;;) {
            size_t j2 = j;
            if (j >= n || !is_cjk(utf8_next(s, &j2)))
                break;
            j = j2;
        }
        next_step(e, k, s, i, j);
        i = gap = j;
    }
    next_step(e, k, s, gap, n);
}

static inline bool ascii_punct(uint8_t c)
{
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

static inline bool ascii_alpha(uint8_t c)
{
    return (uint8_t)((c | 0x20) - 'a') < 26;
}

/* Class of the character at s[i] (i < n) and its end in *j; 0 past the end. */
static inline unsigned cls_at(const uint8_t *s, size_t n, size_t i, size_t *j, uint32_t *cp)
{
    if (i >= n) {
        *j = i;
        *cp = UINT32_MAX;
        return 0;
    }
    *j = i;
    *cp = utf8_next(s, j);
    return duet_uni_class(*cp);
}

/* End of the run of characters with any of `bits` starting at i. */
static inline size_t run_end(const uint8_t *s, size_t n, size_t i, unsigned bits)
{
    size_t j;
    uint32_t cp;
    while (i < n && (cls_at(s, n, i, &j, &cp) & bits))
        i = j;
    return i;
}

#define LM (DUET_UNI_L | DUET_UNI_M)
#define PS (DUET_UNI_P | DUET_UNI_S)

/* The DeepSeek alternation, Isolated.  At each position the first
 * alternative that matches wins, as in a backtracking engine:
 *   A  [!-/:-@[-`{-~][A-Za-z]+
 *   B  [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
 *   C   ?[\p{P}\p{S}]+[\r\n]*
 *   D  \s*[\r\n]+          up to the last CR/LF of the whitespace run
 *   E  \s+(?!\S)           the run, less its last character unless at the end
 *   F  \s+
 * Characters no alternative matches (digits, controls, lone format
 * characters) collect into gap pieces. */
static void split_main(enc_t *e, int k, const uint8_t *s, size_t n)
{
    size_t i = 0, gap = 0;
    while (i < n) {
        size_t j0, j1, end = 0;
        uint32_t c0, c1;
        unsigned k0 = cls_at(s, n, i, &j0, &c0);
        if (ascii_punct(s[i]) && j0 < n && ascii_alpha(s[j0])) { /* A */
            end = j0 + 1;
            while (end < n && ascii_alpha(s[end]))
                end++;
        } else {
            unsigned k1 = cls_at(s, n, j0, &j1, &c1);
            bool x0 = !(k0 & (DUET_UNI_L | PS)) && c0 != '\r' && c0 != '\n';
            if (x0 && (k1 & LM)) /* B with its optional character */
                end = run_end(s, n, j1, LM);
            else if (k0 & LM) /* B without it */
                end = run_end(s, n, j0, LM);
            else if ((c0 == ' ' && (k1 & PS)) || (k0 & PS)) { /* C */
                end = run_end(s, n, (k0 & PS) ? j0 : j1, PS);
                while (end < n && (s[end] == '\r' || s[end] == '\n'))
                    end++;
            } else if (k0 & DUET_UNI_SPACE) { /* D, E, F */
                size_t last_nl = SIZE_MAX, last_start = i, p = i, q;
                uint32_t cp;
                while (p < n && (cls_at(s, n, p, &q, &cp) & DUET_UNI_SPACE)) {
                    if (cp == '\r' || cp == '\n')
                        last_nl = p;
                    last_start = p;
                    p = q;
                }
                if (last_nl != SIZE_MAX)
                    end = last_nl + 1;                   /* D */
                else if (p == n || last_start == i)
                    end = p;                             /* E at the end, or F */
                else
                    end = last_start;                    /* E */
            }
        }
        if (!end) {
            i = j0;
            continue;
        }
        next_step(e, k, s, gap, i);
        next_step(e, k, s, i, end);
        i = gap = end;
    }
    next_step(e, k, s, gap, n);
}

/* A generic Split on PCRE2.  Matches are found as the reference's Oniguruma
 * iterator finds them (an empty match right after the previous match is
 * skipped by one character), then the behaviour folds them into pieces. */
static void split_pcre2(enc_t *e, int k, const uint8_t *s, size_t n)
{
    const tok_split_t *sp = &e->t->splits[k];
    size_t last_end = 0, prev = 0, last_match_end = SIZE_MAX;
    /* pending piece for the merging behaviours */
    size_t pa = 0, pb = 0;
    bool have = false, prev_match = false;

    if (!e->md && !(e->md = pcre2_match_data_create(1, NULL))) {
        e->oom = true;
        return;
    }
    for (;;) {
        size_t ms = n, me = n;
        bool found = false;
        while (last_end <= n) {
            int rc = pcre2_match(sp->re, s, n, last_end, PCRE2_NO_UTF_CHECK, e->md, NULL);
            if (rc < 0)
                break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            if (ov[0] == ov[1] && ov[1] == last_match_end) {
                if (last_end >= n)
                    break;
                size_t j = last_end;
                utf8_next(s, &j);
                last_end = j;
                continue;
            }
            ms = ov[0], me = ov[1];
            last_end = last_match_end = me;
            found = true;
            break;
        }
        /* segments: the gap before the match, then the match */
        for (int seg = 0; seg < 2; seg++) {
            size_t a = seg ? ms : prev, b = seg ? me : ms;
            bool m = seg == 1;
            if ((seg == 0 && a == b) || (seg == 1 && !found))
                continue;
            if (sp->invert)
                m = !m;
            switch (sp->beh) {
            case TOK_SPLIT_REMOVED:
                if (!m)
                    next_step(e, k, s, a, b);
                break;
            case TOK_SPLIT_ISOLATED:
                next_step(e, k, s, a, b);
                break;
            case TOK_SPLIT_MERGED_PREV: /* a match joins the non-match before it */
                if (m && !prev_match && have)
                    pb = b;
                else {
                    if (have)
                        next_step(e, k, s, pa, pb);
                    pa = a, pb = b, have = true;
                }
                break;
            case TOK_SPLIT_CONTIGUOUS: /* consecutive matches join */
                if (m == prev_match && have)
                    pb = b;
                else {
                    if (have)
                        next_step(e, k, s, pa, pb);
                    pa = a, pb = b, have = true;
                }
                break;
            case TOK_SPLIT_MERGED_NEXT: /* a match joins the non-match after it */
                if (have && prev_match && !m) {
                    next_step(e, k, s, pa, b);
                    have = false;
                } else {
                    if (have)
                        next_step(e, k, s, pa, pb);
                    have = m;
                    pa = a, pb = b;
                    if (!m)
                        next_step(e, k, s, a, b);
                }
                break;
            }
            prev_match = m;
        }
        if (!found)
            break;
        prev = me;
    }
    if (have)
        next_step(e, k, s, pa, pb);
}

static void pretok(enc_t *e, int k, const uint8_t *s, size_t n)
{
    if (e->oom)
        return;
    if (k == e->t->nsplits) {
        bpe_piece(e, s, n);
        return;
    }
    switch (e->t->splits[k].kind) {
    case TOK_SPLIT_DS_DIGITS: split_digits(e, k, s, n); break;
    case TOK_SPLIT_DS_CJK: split_cjk(e, k, s, n); break;
    case TOK_SPLIT_DS_MAIN: split_main(e, k, s, n); break;
    case TOK_SPLIT_PCRE2: split_pcre2(e, k, s, n); break;
    }
}

/* ---- added tokens -------------------------------------------------------- */

/* Longest added token of `tr` starting at s[0..n); its length, 0 if none. */
static size_t trie_longest(const tok_trie_t *tr, const uint8_t *s, size_t n, int32_t *id)
{
    int32_t node = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = tr->nodes[node].child;
        while (c >= 0 && tr->nodes[c].byte != s[i])
            c = tr->nodes[c].sibling;
        if (c < 0)
            break;
        node = c;
        if (tr->nodes[c].id >= 0)
            best = i + 1, *id = tr->nodes[c].id;
    }
    return best;
}

/* Extract the added tokens of trie `pass` leftmost-longest, then hand the
 * text between them to the next pass (pass 1: normalized tokens; the
 * normalizer is the identity) and finally to the pre-tokenizer. */
static void split_added(enc_t *e, int pass, const uint8_t *s, size_t n)
{
    if (pass == 2) {
        if (n)
            pretok(e, 0, s, n);
        return;
    }
    const tok_trie_t *tr = &e->t->added[pass];
    size_t gap = 0;
    if (!tr->n) {
        split_added(e, pass + 1, s, n);
        return;
    }
    for (size_t i = 0; i < n && !e->oom;) {
        int32_t id;
        size_t l;
        if (!(tr->first[s[i] >> 3] & (1u << (s[i] & 7))) || !(l = trie_longest(tr, s + i, n - i, &id))) {
            i++;
            continue;
        }
        split_added(e, pass + 1, s + gap, i - gap);
        emit(e, &id, 1);
        i = gap = i + l;
    }
    split_added(e, pass + 1, s + gap, n - gap);
}

duet_status_t duet_tok_encode(const duet_tok_t *t, const char *text, size_t len, bool allow_special,
                              duet_tok_ids_t *out, duet_err_t *err)
{
    enc_t e = { .t = t, .out = out };
    size_t len0 = out->len, n = len;
    if (!len)
        return DUET_OK;
    char *fixed = utf8_sanitize(text, len, &n, &e.oom);
    const uint8_t *s = (const uint8_t *)(fixed ? fixed : text);
    if (!e.oom) {
        if (allow_special && t->have_added)
            split_added(&e, 0, s, n);
        else
            pretok(&e, 0, s, n);
    }
    free(fixed);
    free(e.scratch);
    pcre2_match_data_free(e.md);
    if (e.oom) {
        out->len = len0;
        return duet_err_set(err, DUET_ERR_NOMEM, "encode: out of memory (%zu bytes of input)", len);
    }
    return DUET_OK;
}
