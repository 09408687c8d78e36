/* One request's output: generated token ids in, OpenAI message parts out.
 *
 * Ids go through the streaming detokenizer (common/text/detok.h: UTF-8,
 * special tokens, stop strings) and, for chat, the DSML parser
 * (common/text/dsml.h: reasoning, content, tool calls).  The result is kept
 * twice: whole (for a non-streamed response) and as the part not yet taken
 * (for the next SSE chunk).  A malformed tool-call block becomes plain
 * content plus a warning, never a broken call.
 *
 * Used by one thread at a time (the request's connection thread). */
#ifndef DUET_ROUTER_OUTPUT_H
#define DUET_ROUTER_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "dsml.h"
#include "status.h"
#include "tokenizer.h"

typedef struct {
    const duet_tok_t *tok;       /* the vocabulary (borrowed) */
    int chat;                    /* parse DSML (chat completions) */
    int thinking;                /* the prompt ended with <think> */
    const json_t *tools;         /* the tools calls are checked against (borrowed); NULL: none */
    uint64_t id_seed;            /* tool-call ids are a function of it */
    const char *const *stop;     /* stop strings (copied) */
    size_t n_stop;
    int skip_special_tokens;
    /* Text the model is made to begin with (it ends the prompt; a forced tool call): parsed ahead
     * of the generated ids, not counted as output tokens.  NULL: none. */
    const char *prefix;
    size_t prefix_len;
} duet_out_opts_t;

typedef struct duet_out duet_out_t;

duet_status_t duet_out_create(const duet_out_opts_t *o, duet_out_t **out);
void duet_out_destroy(duet_out_t **o);

/* Feed generated ids.  Ids after a stop string are ignored.  DUET_ERR_RANGE
 * for an id outside the vocabulary (the ids before it are taken). */
duet_status_t duet_out_feed(duet_out_t *o, const int32_t *ids, size_t n);
/* End of output: held-back text is released, an unfinished tool-call block
 * becomes content with a DSML_UNCLOSED_TAG warning. */
duet_status_t duet_out_finish(duet_out_t *o);

/* Nonzero once a stop string matched. */
int duet_out_stopped(const duet_out_t *o);
/* Ids that count as output: all ids fed, or up to and including the one that
 * completed the stop string. */
size_t duet_out_n_tokens(const duet_out_t *o);
/* Number of tool calls reported. */
int duet_out_n_calls(const duet_out_t *o);

/* What arrived since the last take, as a chat delta object
 * ({"reasoning_content", "content", "tool_calls"}, only the parts present),
 * or NULL when nothing did.  New reference. */
json_t *duet_out_take_delta(duet_out_t *o);
/* Text since the last take (completions); *len bytes, valid until the next
 * call; NULL when none. */
const char *duet_out_take_text(duet_out_t *o, size_t *len);
/* Warnings since the last take ([{"code", "message"}]) or NULL.  New reference. */
json_t *duet_out_take_warnings(duet_out_t *o);

/* The whole output so far.  Borrowed, valid until the next feed. */
const char *duet_out_content(const duet_out_t *o, size_t *len);
const char *duet_out_reasoning(const duet_out_t *o, size_t *len);
const json_t *duet_out_tool_calls(const duet_out_t *o); /* array */
const json_t *duet_out_warnings(const duet_out_t *o);   /* array */
/* The DSML error reported, or DUET_DSML_OK. */
duet_dsml_code_t duet_out_dsml_error(const duet_out_t *o);

/* Add a warning of the router's own (code, message). */
void duet_out_warn(duet_out_t *o, const char *code, const char *message);

#endif
