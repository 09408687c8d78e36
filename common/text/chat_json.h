/* JSON text exactly as the DeepSeek-V4 chat encoder writes it.
 *
 * The official encoder serializes tool schemas and tool-call argument values
 * with Python's `json.dumps(value, ensure_ascii=False)` and reads argument
 * strings with `json.loads`.  The model was trained on those bytes, so duet
 * writes them the same way:
 *
 *   - separators ", " and ": ", no newlines, keys in the order given;
 *   - strings escape only '"', '\\' and U+0000..U+001F (\b \f \n \r \t by
 *     name, the rest as \u00xx in lowercase hex); every other code point,
 *     U+007F and non-ASCII included, is written as raw UTF-8;
 *   - floats as Python's repr(): the shortest digits that round-trip,
 *     fixed notation for 1e-4 <= |x| < 1e16 with a ".0" on integral values
 *     ("1.0", "0.1", "1000000000000000.0"), otherwise "1e+20", "1.5e-07";
 *     NaN and infinities as NaN, Infinity, -Infinity;
 *   - integers as written, of any length ("-0" becomes "0").
 *
 * The parser reads what `json.loads` reads: NaN, Infinity and -Infinity are
 * accepted, a repeated key keeps its first position and takes its last
 * value, integers keep every digit.  Unlike Python it rejects an escaped lone
 * surrogate (such a string cannot be written as UTF-8, so it could never be
 * tokenized) and nesting deeper than DUET_CHAT_JSON_MAX_DEPTH. */
#ifndef DUET_TEXT_CHAT_JSON_H
#define DUET_TEXT_CHAT_JSON_H

#include <stddef.h>

#include <jansson.h>

#include "err.h"

#define DUET_CHAT_JSON_MAX_DEPTH 512

/* A growable byte buffer.  Appends after an allocation failure are dropped
 * and `failed` stays set, so a caller checks once at the end.  Zeroed memory
 * is an empty buffer; `p` is NUL-terminated whenever `len` > 0. */
typedef struct {
    char *p;
    size_t len, cap;
    int failed;
} duet_chat_buf_t;

void duet_chat_buf_put(duet_chat_buf_t *b, const char *s, size_t n);
void duet_chat_buf_puts(duet_chat_buf_t *b, const char *s);
void duet_chat_buf_putc(duet_chat_buf_t *b, char c);
/* Free the storage and zero the buffer; safe on zeroed memory. */
void duet_chat_buf_fini(duet_chat_buf_t *b);

/* Python's repr() of a double, as json.dumps writes it ("1.0", "1e+20",
 * "NaN", "-Infinity").  `out` holds at least 32 bytes. */
void duet_chat_json_float(double x, char out[32]);

/* Append `s` (UTF-8, `n` bytes) as a JSON string literal, quotes included. */
void duet_chat_json_string(duet_chat_buf_t *b, const char *s, size_t n);

/* Append the JSON text of a jansson value as json.dumps(v, ensure_ascii=False)
 * writes it.  Returns DUET_ERR_NOMEM when the buffer could not grow. */
duet_status_t duet_chat_json_dump(duet_chat_buf_t *b, const json_t *v, duet_err_t *err);

/* A value read by duet_chat_json_parse. */
typedef enum {
    DUET_CHAT_JSON_NULL = 0,
    DUET_CHAT_JSON_FALSE,
    DUET_CHAT_JSON_TRUE,
    DUET_CHAT_JSON_NUMBER,
    DUET_CHAT_JSON_STRING,
    DUET_CHAT_JSON_ARRAY,
    DUET_CHAT_JSON_OBJECT,
} duet_chat_json_kind_t;

typedef struct duet_chat_json duet_chat_json_t;
struct duet_chat_json {
    duet_chat_json_kind_t kind;
    char *text;              /* STRING: decoded UTF-8; NUMBER: Python's text ("12", "1.0") */
    size_t text_len;
    size_t n;                /* ARRAY: elements; OBJECT: members (after merging repeated keys) */
    duet_chat_json_t **items; /* (n) elements or member values */
    char **keys;             /* OBJECT: (n) decoded keys, NUL-terminated */
    size_t *key_lens;        /* OBJECT: (n) key lengths in bytes (a key may hold U+0000) */
};

/* Parse `len` bytes of JSON text with json.loads semantics into a tree
 * written to `*out` (only on success).  Malformed text gives DUET_ERR_PARSE
 * with the byte offset and what was expected; memory gives DUET_ERR_NOMEM. */
duet_status_t duet_chat_json_parse(const char *text, size_t len, duet_chat_json_t **out,
                                   duet_err_t *err);

/* Append a parsed value as json.dumps writes it. */
void duet_chat_json_write(duet_chat_buf_t *b, const duet_chat_json_t *v);

/* Free a tree (NULL is fine) and set the pointer to NULL. */
void duet_chat_json_free(duet_chat_json_t **v);

#endif
