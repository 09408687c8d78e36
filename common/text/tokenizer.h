/* Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`.
 *
 * Supported: model BPE over the GPT-2 byte<->unicode map (vocab, merges as
 * "a b" strings or [a, b] pairs, unk_token, ignore_merges), added tokens
 * (special or not), the pre-tokenizer Split(regex or string, any behaviour,
 * invert) and ByteLevel(add_prefix_space false) alone or in a Sequence,
 * decoder ByteLevel, normalizer absent, null or an empty Sequence.  Anything
 * else is refused at load with DUET_ERR_UNSUPPORTED naming the field.
 * Encoding follows the `tokenizers` package id for id (docs/TEXT.md): the
 * DeepSeek-V3/V4 split patterns run on native splitters, other patterns on
 * PCRE2 with HF's (Oniguruma's) syntax translated.
 *
 * A tokenizer is immutable after creation apart from an internal bounded
 * cache of encoded pre-tokens that is safe under concurrent use: every
 * function below may be called from several threads on one tokenizer. */
#ifndef DUET_TOKENIZER_H
#define DUET_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct duet_tok duet_tok_t;

/* Growable id array; zero-initialise, append with the functions below, free
 * with duet_tok_ids_fini. */
typedef struct {
    int32_t *ids;
    size_t len, cap;
} duet_tok_ids_t;

/* Growable byte buffer (not NUL-terminated); free with duet_tok_bytes_fini. */
typedef struct {
    char *data;
    size_t len, cap;
} duet_tok_bytes_t;

typedef struct {
    /* Run every Split on PCRE2 even where a native splitter exists (tests
     * compare both paths). */
    bool force_pcre2;
    /* Entries of the pre-token cache; 0 picks the default (16384), and
     * SIZE_MAX turns the cache off. */
    size_t cache_entries;
} duet_tok_opts_t;

/* Well-known DeepSeek tokens, looked up by their text at load. */
typedef enum {
    DUET_TOK_BOS,             /* <｜begin▁of▁sentence｜> */
    DUET_TOK_EOS,             /* <｜end▁of▁sentence｜> */
    DUET_TOK_PAD,             /* <｜▁pad▁｜> */
    DUET_TOK_USER,            /* <｜User｜> */
    DUET_TOK_ASSISTANT,       /* <｜Assistant｜> */
    DUET_TOK_THINK,           /* <think> */
    DUET_TOK_THINK_END,       /* </think> */
    DUET_TOK_DSML,            /* ｜DSML｜ */
    DUET_TOK_LATEST_REMINDER, /* <｜latest_reminder｜> */
    DUET_TOK_NSPECIAL
} duet_tok_special_t;

/* Load the tokenizer.json at `path` (`opts` may be NULL).  On success stores
 * a new tokenizer in *out.  Failures are typed and name the file and the
 * field: IO (cannot read), PARSE (not JSON, or a field of the wrong type),
 * UNSUPPORTED (model, pre-tokenizer, normalizer or decoder duet does not
 * implement), CONFIG (inconsistent content: a merge whose parts or result are
 * not in the vocabulary, a bad id), NOMEM. */
duet_status_t duet_tok_create(const char *path, const duet_tok_opts_t *opts, duet_tok_t **out,
                              duet_err_t *err);
/* Same from `len` bytes of JSON in memory; `name` stands for the file in
 * error messages. */
duet_status_t duet_tok_create_from_json(const char *json, size_t len, const char *name,
                                        const duet_tok_opts_t *opts, duet_tok_t **out,
                                        duet_err_t *err);
/* Free *t and set it to NULL; safe on NULL and on *t == NULL. */
void duet_tok_destroy(duet_tok_t **t);

/* Encode `len` bytes of `text` and append the ids to `out`.  With
 * `allow_special` the added tokens (special or not: <｜User｜>, <think>,
 * ｜DSML｜, ...) are recognised in the text first, leftmost-longest, as the
 * reference's encode() does; without it the text is plain text and only BPE
 * tokens come out (what user-supplied content needs).  Invalid UTF-8 is
 * first replaced, each maximal ill-formed subsequence by U+FFFD, as
 * Python's bytes.decode("utf-8", "replace") does before the reference sees a
 * string.  No BOS/EOS is added.  Fails only with NOMEM (out keeps what it
 * had). */
duet_status_t duet_tok_encode(const duet_tok_t *t, const char *text, size_t len, bool allow_special,
                              duet_tok_ids_t *out, duet_err_t *err);

/* Append the bytes of `n` ids to `out`: BPE tokens through the byte-level
 * map, added tokens as their text.  With `skip_special` ids of tokens marked
 * special are left out.  The output is raw bytes: a cut inside a multi-byte
 * character stays cut (the streaming detokenizer deals with that).  RANGE
 * for an id that names no token (out keeps what it had), NOMEM. */
duet_status_t duet_tok_decode(const duet_tok_t *t, const int32_t *ids, size_t n, bool skip_special,
                              duet_tok_bytes_t *out, duet_err_t *err);

/* The decoded bytes of one token and their count in *len; NULL when `id`
 * names no token.  The pointer lives as long as the tokenizer. */
const char *duet_tok_id_bytes(const duet_tok_t *t, int32_t id, size_t *len);
/* True when `id` is an added token marked special. */
bool duet_tok_is_special(const duet_tok_t *t, int32_t id);
/* True when `id` is an added token (special or not). */
bool duet_tok_is_added(const duet_tok_t *t, int32_t id);

/* Id of the token whose vocabulary string (byte-level form, "Ġthe") or added
 * token text is `len` bytes at `token`; -1 when there is none. */
int32_t duet_tok_token_to_id(const duet_tok_t *t, const char *token, size_t len);
/* Vocabulary string of `id` (NUL-terminated, byte-level form for BPE
 * tokens); NULL when `id` names no token. */
const char *duet_tok_id_to_token(const duet_tok_t *t, int32_t id);
/* One past the largest id (129280 for DeepSeek-V4, including added tokens). */
int32_t duet_tok_vocab_size(const duet_tok_t *t);
/* Id of a well-known token; -1 when this tokenizer does not have it. */
int32_t duet_tok_special_id(const duet_tok_t *t, duet_tok_special_t which);
/* Text of a well-known token ("<think>"); NULL for values outside the enum. */
const char *duet_tok_special_text(duet_tok_special_t which);

/* Append ids / bytes; NOMEM on failure (the array keeps what it had). */
duet_status_t duet_tok_ids_push(duet_tok_ids_t *v, const int32_t *ids, size_t n);
duet_status_t duet_tok_bytes_push(duet_tok_bytes_t *b, const void *data, size_t n);
/* Free the storage and zero the struct; safe on zeroed structs. */
void duet_tok_ids_fini(duet_tok_ids_t *v);
void duet_tok_bytes_fini(duet_tok_bytes_t *b);

#endif
