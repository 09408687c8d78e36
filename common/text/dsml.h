/* DSML: DeepSeek-V4's tool-call markup, parsed from streamed model output.
 *
 * The model writes (｜DSML｜ is one special token; full-width bars):
 *
 *   {reasoning}</think>{content}\n\n<｜DSML｜tool_calls>
 *   <｜DSML｜invoke name="get_weather">
 *   <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
 *   <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 *   </｜DSML｜tool_calls>
 *
 * The parser is fed that text in arbitrary pieces and reports events: content
 * text, reasoning text (when the request's generation prompt ended with
 * `<think>`), complete tool calls, and at most one error.  Text that could be
 * the start of a tag is held back until the next piece decides it; a call is
 * reported only when its `</｜DSML｜invoke>` has arrived and the whole call
 * has been checked against the request's tools.  The events (after joining
 * adjacent text events of one kind) do not depend on how the text was split.
 *
 * After an error the parser interprets nothing more: the error event carries
 * the raw text of the failed block (from its start to where the error was
 * found) and every later byte is reported as content, so the router can return
 * the model's text as plain content with a warning — never a broken call.
 * docs/TEXT.md gives the accepted grammar and every rule in full. */
#ifndef DUET_TEXT_DSML_H
#define DUET_TEXT_DSML_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"

/* The DSML parse errors: enum name, code string (what tests, metrics and
 * warnings match on) and a sentence for people. */
#define DUET_DSML_CODE_LIST(X)                                                          \
    X(DUET_DSML_OK,                  "OK", "no error")                                  \
    X(DUET_DSML_UNCLOSED_TAG,        "DSML_UNCLOSED_TAG",                               \
      "the output ended inside a tool-call block, tag or parameter")                    \
    X(DUET_DSML_BAD_MARKUP,          "DSML_BAD_MARKUP",                                 \
      "a DSML tag is malformed or has an unknown name")                                 \
    X(DUET_DSML_UNEXPECTED_TAG,      "DSML_UNEXPECTED_TAG",                             \
      "a DSML tag appears where it is not allowed (nested, duplicated or unmatched)")   \
    X(DUET_DSML_BAD_ATTRIBUTE,       "DSML_BAD_ATTRIBUTE",                              \
      "a DSML tag has a missing, duplicated, unknown or malformed attribute")           \
    X(DUET_DSML_STRAY_TEXT,          "DSML_STRAY_TEXT",                                 \
      "text other than whitespace appears between DSML tags")                           \
    X(DUET_DSML_EMPTY_BLOCK,         "DSML_EMPTY_BLOCK",                                \
      "a tool-call block holds no invoke")                                              \
    X(DUET_DSML_DUPLICATE_PARAMETER, "DSML_DUPLICATE_PARAMETER",                        \
      "a tool call names the same parameter twice")                                     \
    X(DUET_DSML_BAD_JSON,            "DSML_BAD_JSON",                                   \
      "a non-string parameter or JSON argument body is not strict JSON")                \
    X(DUET_DSML_UNKNOWN_TOOL,        "DSML_UNKNOWN_TOOL",                               \
      "a tool call names a tool the request does not define")                           \
    X(DUET_DSML_MISSING_PARAMETER,   "DSML_MISSING_PARAMETER",                          \
      "a tool call lacks a parameter its schema requires")                              \
    X(DUET_DSML_UNKNOWN_PARAMETER,   "DSML_UNKNOWN_PARAMETER",                          \
      "a tool call passes a parameter its schema does not allow")                       \
    X(DUET_DSML_TYPE_MISMATCH,       "DSML_TYPE_MISMATCH",                              \
      "a tool-call argument has a type its schema does not allow")                      \
    X(DUET_DSML_MARKUP_IN_REASONING, "DSML_MARKUP_IN_REASONING",                        \
      "DSML markup appears inside the reasoning, before </think>")                      \
    X(DUET_DSML_TOO_LARGE,           "DSML_TOO_LARGE",                                  \
      "a tool-call block exceeds the size limit")

typedef enum {
#define DUET_DSML_CODE_ENUM(name, code, msg) name,
    DUET_DSML_CODE_LIST(DUET_DSML_CODE_ENUM)
#undef DUET_DSML_CODE_ENUM
    DUET_DSML_CODE_COUNT
} duet_dsml_code_t;

/* Fixed code string ("DSML_BAD_JSON"); "UNKNOWN" outside the table. */
const char *duet_dsml_code_str(duet_dsml_code_t code);
/* Sentence for people; "unknown DSML error" outside the table. */
const char *duet_dsml_code_message(duet_dsml_code_t code);
/* The code whose string is `s`, or -1. */
int duet_dsml_code_parse(const char *s);

typedef enum {
    DUET_DSML_EV_CONTENT,    /* text, len: assistant content */
    DUET_DSML_EV_REASONING,  /* text, len: reasoning (thinking mode, before </think>) */
    DUET_DSML_EV_TOOL_CALL,  /* index, id, name, arguments */
    DUET_DSML_EV_ERROR,      /* code, message; text, len: raw text of the failed block */
} duet_dsml_event_kind_t;

/* One event.  Every pointer is valid only during the callback. */
typedef struct {
    duet_dsml_event_kind_t kind;
    const char *text;        /* CONTENT, REASONING, ERROR (raw text); not NUL-terminated */
    size_t len;
    int index;               /* TOOL_CALL: 0-based position among this output's calls */
    const char *id;          /* TOOL_CALL: "call_" + 24 characters [A-Za-z0-9] */
    const char *name;        /* TOOL_CALL: tool name */
    const char *arguments;   /* TOOL_CALL: JSON object text (see docs/TEXT.md for its form) */
    duet_dsml_code_t code;   /* ERROR */
    const char *message;     /* ERROR: sentence naming what failed */
} duet_dsml_event_t;

typedef void (*duet_dsml_event_fn)(void *arg, const duet_dsml_event_t *ev);

typedef struct {
    /* The generation prompt ended with `<think>`: output starts as reasoning. */
    int thinking;
    /* The request's OpenAI `tools` array (borrowed; must outlive the parser).
     * NULL or empty: every tool call is DSML_UNKNOWN_TOOL. */
    const json_t *tools;
    /* Seed of the tool-call ids: the same seed gives the same ids. */
    uint64_t id_seed;
    /* Largest tool call, with the markup before it, in bytes; past it the
     * block fails with DSML_TOO_LARGE (0: DUET_DSML_DEFAULT_MAX_BLOCK; at
     * least 64). */
    size_t max_block_bytes;
} duet_dsml_opts_t;

#define DUET_DSML_DEFAULT_MAX_BLOCK ((size_t)16 << 20)

typedef struct duet_dsml_parser duet_dsml_parser_t;

/* Create a parser that reports events to `fn(arg, ev)`.  *out is written only
 * on success.  DUET_ERR_INVALID when opts or fn is NULL. */
duet_status_t duet_dsml_parser_create(const duet_dsml_opts_t *opts, duet_dsml_event_fn fn,
                                      void *arg, duet_dsml_parser_t **out);
/* Free the parser and set *p to NULL; safe on NULL. */
void duet_dsml_parser_destroy(duet_dsml_parser_t **p);
/* Feed the next piece of model output.  Events for everything the piece
 * decides are reported before it returns.  Fails only with DUET_ERR_NOMEM
 * (the parser is then unusable) or DUET_ERR_STATE after finish. */
duet_status_t duet_dsml_parser_feed(duet_dsml_parser_t *p, const char *text, size_t len);
/* End of output: report held-back text, or DSML_UNCLOSED_TAG when the output
 * stopped inside a block.  Later feeds fail with DUET_ERR_STATE. */
duet_status_t duet_dsml_parser_finish(duet_dsml_parser_t *p);
/* The error reported so far, or DUET_DSML_OK. */
duet_dsml_code_t duet_dsml_parser_error(const duet_dsml_parser_t *p);
/* Number of tool calls reported so far. */
int duet_dsml_parser_calls(const duet_dsml_parser_t *p);

/* One tool call to encode: `arguments` is a JSON object text. */
typedef struct {
    const char *name;
    const char *arguments;
} duet_dsml_call_t;

/* Render calls as a DSML block exactly as the model writes it (without the
 * "\n\n" that separates it from preceding content): string values raw with
 * string="true", everything else as JSON with string="false".  *out
 * (NUL-terminated, free()) and *out_len are written only on success.
 * DUET_ERR_INVALID (message in err) when arguments are not a JSON object, a
 * tool or parameter name is not a valid attribute value (empty, over 1024
 * bytes, a control character, invalid UTF-8, `"`, `<` or `>`), or a value
 * holds DSML markup: what could not be parsed back. */
duet_status_t duet_dsml_encode_calls(const duet_dsml_call_t *calls, size_t n, char **out,
                                     size_t *out_len, duet_err_t *err);

/* Canonical form of a JSON text (the form of tool-call arguments): strict
 * parse (no duplicate keys, no trailing text), then written with ", " and
 * ": " separators, strings with the shortest escapes and UTF-8 kept, numbers
 * exactly as written.  DUET_ERR_PARSE (message in err) on bad JSON. */
duet_status_t duet_dsml_json_canonical(const char *json, size_t len, char **out, size_t *out_len,
                                       duet_err_t *err);

#endif
