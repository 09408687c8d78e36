/* Incremental detokenizer: token ids in, complete UTF-8 text out.
 *
 * Each id stands for raw bytes (after byte-level decoding); the bytes of
 * consecutive tokens are joined and decoded as UTF-8.  Only complete code
 * points are ever returned: a trailing sequence that may still become valid
 * waits for the next token, and a sequence that can no longer become valid is
 * returned as U+FFFD by the rule of duet_utf8_scan (the rule of Python's
 * bytes.decode("utf-8", errors="replace")).  Special tokens are dropped when
 * skip_special_tokens is set.  Stop strings are matched on the decoded text,
 * across token boundaries: text that could be the start of a stop string is
 * held back until it is decided, and the stop string and everything after it
 * are never returned.  docs/TEXT.md states the rules in full. */
#ifndef DUET_TEXT_DETOK_H
#define DUET_TEXT_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* The vocabulary, as the detokenizer sees it.  token_bytes returns the raw
 * bytes id stands for and their count in *len, or NULL for an id outside the
 * vocabulary; the bytes must stay valid while the detokenizer lives.
 * is_special returns nonzero for special (control) tokens. */
typedef struct {
    const uint8_t *(*token_bytes)(void *arg, int32_t id, size_t *len);
    int (*is_special)(void *arg, int32_t id);
    void *arg;
} duet_detok_vocab_t;

typedef struct {
    int skip_special_tokens;     /* drop the bytes of special tokens */
    const char *const *stop;     /* stop strings (copied; valid non-empty UTF-8) */
    size_t n_stop;
} duet_detok_opts_t;

/* Where generation stopped on a stop string. */
typedef struct {
    int stop_index;       /* index into opts.stop; -1 while no stop string matched */
    size_t text_offset;   /* byte offset of the stop string in the decoded text
                           * (= bytes returned in all) */
    size_t token_index;   /* 0-based index, among all ids fed, of the id whose
                           * bytes completed the match */
} duet_detok_stop_t;

typedef struct duet_detok duet_detok_t;

/* Create a detokenizer.  DUET_ERR_INVALID when a stop string is empty or not
 * valid UTF-8, or the vocabulary lacks token_bytes.  *out written on success. */
duet_status_t duet_detok_create(const duet_detok_vocab_t *vocab, const duet_detok_opts_t *opts,
                                duet_detok_t **out);
/* Free and set *d to NULL; safe on NULL. */
void duet_detok_destroy(duet_detok_t **d);
/* Feed n ids.  *text and *len receive the text they complete (valid UTF-8, not
 * NUL-terminated; valid until the next call on d).  After a stop string has
 * matched, the rest of the ids and every later feed are ignored.  An id
 * outside the vocabulary stops the feed there with DUET_ERR_RANGE (the ids
 * before it are taken, their text returned); DUET_ERR_NOMEM leaves d unusable. */
duet_status_t duet_detok_feed(duet_detok_t *d, const int32_t *ids, size_t n, const char **text,
                              size_t *len);
/* End of stream: an incomplete trailing sequence becomes U+FFFD and held-back
 * text is returned (it can no longer start a stop string). */
duet_status_t duet_detok_finish(duet_detok_t *d, const char **text, size_t *len);
/* Nonzero once a stop string matched; *where (may be NULL) receives where. */
int duet_detok_stopped(const duet_detok_t *d, duet_detok_stop_t *where);
/* Bytes of text returned so far. */
size_t duet_detok_emitted(const duet_detok_t *d);

/* The UTF-8 rule shared by the text layer.  Looks at s[0..n):
 *   > 0: a well-formed code point of that many bytes (stored in *cp);
 *   < 0: an ill-formed sequence of -r bytes that stands for one U+FFFD: the
 *        longest prefix that could still have begun a well-formed sequence
 *        (a "maximal subpart", at least one byte);
 *   0:   s is empty or a well-formed but incomplete prefix (more bytes needed).
 * Well-formed sequences are those of Unicode Table 3-7 (no overlongs, no
 * surrogates, nothing past U+10FFFF). */
int duet_utf8_scan(const uint8_t *s, size_t n, uint32_t *cp);

#endif
