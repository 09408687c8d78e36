/* Internals of the tokenizer shared by its loader (tokenizer.c) and its
 * encoder (tokenizer_encode.c).  Nothing outside those two files includes
 * this header. */
#ifndef DUET_TOKENIZER_IMPL_H
#define DUET_TOKENIZER_IMPL_H

#include <stdatomic.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

#define TOK_MAX_ID (1 << 24)   /* ids must stay below this */
#define TOK_NO_RANK UINT32_MAX

enum { TOK_F_PRESENT = 1, TOK_F_ADDED = 2, TOK_F_SPECIAL = 4 };

/* How a Split turns matches into pieces (HF SplitDelimiterBehavior). */
typedef enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} tok_split_beh_t;

/* Which engine runs a Split: PCRE2, or a native splitter for one of the
 * DeepSeek-V3/V4 patterns (recognised verbatim at load). */
typedef enum {
    TOK_SPLIT_PCRE2,
    TOK_SPLIT_DS_DIGITS, /* \p{N}{1,3} */
    TOK_SPLIT_DS_CJK,    /* [一-龥぀-ゟ゠-ヿ]+ */
    TOK_SPLIT_DS_MAIN,   /* the punctuation / letters / whitespace alternation */
} tok_split_kind_t;

typedef struct {
    tok_split_kind_t kind;
    tok_split_beh_t beh;
    bool invert;
    pcre2_code *re; /* TOK_SPLIT_PCRE2 only */
} tok_split_t;

/* (left id, right id) -> (rank, merged id), open addressing. */
typedef struct {
    uint64_t key; /* (uint64_t)left << 32 | right; UINT64_MAX when empty */
    uint32_t rank;
    int32_t id;
} tok_merge_t;

/* Vocabulary string -> id, open addressing over the string blob. */
typedef struct {
    uint32_t off, len; /* in strs */
    int32_t id;        /* -1 when empty */
} tok_vslot_t;

/* Byte trie of added-token texts: first-child / next-sibling lists. */
typedef struct {
    int32_t child, sibling;
    int32_t id; /* token ending here, or -1 */
    uint8_t byte;
} tok_trie_node_t;

typedef struct {
    tok_trie_node_t *nodes; /* nodes[0] is the root */
    size_t n, cap;
    uint8_t first[32];      /* bitmap of first bytes */
} tok_trie_t;

/* One cache line per entry: a pre-token of up to 24 bytes and its ids,
 * guarded by a sequence lock.  Readers take no lock: they read the version,
 * the words, then the version again, and treat a change (or an odd version:
 * a write in progress) as a miss; a writer that finds the entry busy skips
 * it.  The words are relaxed atomics, so this is race-free C11 and costs
 * plain loads and stores on x86 and arm64. */
#define TOK_CACHE_KEY 24
#define TOK_CACHE_IDS 6
typedef struct {
    _Atomic uint64_t ver;
    _Atomic uint64_t meta;   /* hash << 32 | nids << 8 | klen */
    _Atomic uint64_t key[3];
    _Atomic uint64_t ids[3]; /* two ids per word */
} tok_cache_entry_t;

struct duet_tok {
    int32_t vocab_size;  /* one past the largest id */
    uint8_t *flags;      /* [vocab_size] TOK_F_* */
    uint32_t *str_off;   /* [vocab_size] token string in strs (NUL-terminated) */
    uint32_t *str_len;
    uint32_t *dec_off;   /* [vocab_size] decoded bytes in dec */
    uint32_t *dec_len;
    char *strs, *dec;

    tok_vslot_t *vindex; /* model vocabulary only (BPE lookups) */
    size_t vmask;
    tok_merge_t *merges;
    size_t mmask;
    int32_t byte_id[256]; /* id of each byte's one-character token, -1 if none */
    int32_t unk_id;       /* -1 when the model has no unk token */
    bool fuse_unk, ignore_merges;

    tok_trie_t added[2];  /* [0] matched on raw text first, [1] normalized */
    bool have_added;

    tok_split_t *splits;
    int nsplits;
    bool have_pcre2;

    int32_t special[DUET_TOK_NSPECIAL];

    tok_cache_entry_t *cache; /* NULL when off */
    size_t cache_mask;
};

/* Vocabulary lookup of `len` bytes (model vocabulary only); -1 if absent. */
int32_t duet_tok_vocab_find(const duet_tok_t *t, const char *s, size_t len);
/* Merge of (a, b); NULL when the pair does not merge. */
static inline const tok_merge_t *duet_tok_merge_find(const duet_tok_t *t, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->mmask;
    for (;; i = (i + 1) & t->mmask) {
        const tok_merge_t *m = &t->merges[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

/* The GPT-2 byte <-> unicode map: code point of byte b. */
uint32_t duet_tok_byte_char(uint8_t b);

/* Translate an HF (Oniguruma) regex to PCRE2 syntax into a new string;
 * NULL with `err` set (UNSUPPORTED naming the construct, or NOMEM). */
char *duet_tok_regex_translate(const char *src, size_t len, const char *where, duet_err_t *err);

#endif
