/* The OpenAI HTTP API surface: request bodies in, validated parameters out,
 * and the error body every failure is answered with.
 *
 * duet_api_parse() takes the raw body of POST /v1/chat/completions or
 * /v1/completions and either fills a duet_api_req_t or returns an error
 * naming the offending field (`param`), as the OpenAI API does:
 *   {"error": {"message": "...", "type": "invalid_request_error",
 *              "param": "temperature", "code": "invalid_value"}}
 * It never trusts its input and never aborts; tests/router/test_api.c runs
 * it on every class of bad input and a fuzz corpus.
 *
 * Pure functions: no I/O, no global state. */
#ifndef DUET_ROUTER_API_H
#define DUET_ROUTER_API_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "chat.h"

typedef enum {
    DUET_API_CHAT = 0,   /* /v1/chat/completions */
    DUET_API_COMPLETION, /* /v1/completions */
} duet_api_kind_t;

typedef enum {
    DUET_TOOL_CHOICE_AUTO = 0,
    DUET_TOOL_CHOICE_NONE,
    DUET_TOOL_CHOICE_REQUIRED,
    DUET_TOOL_CHOICE_NAMED,
} duet_tool_choice_t;

#define DUET_API_MAX_STOP 16      /* stop strings per request */
#define DUET_API_MAX_STOP_IDS 256 /* stop token ids (the protocol's limit) */
#define DUET_API_MAX_TOOLS 512

/* An OpenAI error: HTTP status, type, the offending parameter ("" for none),
 * a code ("" for none) and a sentence. */
typedef struct {
    int status;
    char type[40];
    char param[128];
    char code[48];
    char message[512];
} duet_api_error_t;

/* Limits the parser checks against (from the router's options). */
typedef struct {
    const char *served_model; /* the one model name served; requests may omit "model" */
    int32_t vocab_size;       /* stop_token_ids and prompt ids must be below it */
    uint32_t default_max_tokens_chat; /* max_tokens when the request gives none (applied by the */
    uint32_t default_max_tokens_completion; /* router once it knows the prompt's length, not here) */
} duet_api_limits_t;

/* A validated request.  Members that point into `root` live as long as it. */
typedef struct {
    duet_api_kind_t kind;
    json_t *root;          /* the parsed body (owned) */
    int stream;
    int include_usage;     /* stream_options.include_usage */
    /* sampling */
    float temperature;     /* default 1 */
    float top_p;           /* default 1 */
    int32_t top_k;         /* 0: off */
    float min_p;           /* 0: off */
    int has_seed;
    uint64_t seed;
    uint32_t max_tokens;   /* 0: none given (the router picks) */
    const char *stop[DUET_API_MAX_STOP]; /* borrowed from root */
    size_t n_stop;
    int32_t stop_ids[DUET_API_MAX_STOP_IDS];
    size_t n_stop_ids;
    int ignore_eos;
    int skip_special_tokens; /* default 1 */
    int return_token_ids;    /* extension: prompt_token_ids and each choice's token_ids in the response */
    /* chat */
    const json_t *messages;  /* borrowed */
    const json_t *tools;     /* borrowed; NULL when none */
    duet_tool_choice_t tool_choice;
    const char *tool_name;   /* NAMED: the tool */
    int thinking;
    duet_chat_effort_t effort;
    const json_t *response_format; /* NULL for none or {"type": "text"} */
    /* completion: either text or ids */
    const char *prompt;      /* borrowed; NULL when ids were given */
    size_t prompt_len;
    int32_t *prompt_ids;     /* owned; NULL when text was given */
    size_t n_prompt_ids;
    /* routing */
    const char *session;     /* "session_id" extension; NULL when none */
} duet_api_req_t;

/* Parse and validate a body.  Returns 0 and fills *out (release with
 * duet_api_req_fini), or -1 and fills *err (status 400 for bad JSON or
 * parameters, 404 for an unknown model).  `out` is zeroed on error. */
int duet_api_parse(duet_api_kind_t kind, const char *body, size_t len, const duet_api_limits_t *lim,
                   duet_api_req_t *out, duet_api_error_t *err);
void duet_api_req_fini(duet_api_req_t *r);

/* Fill an error.  `param` and `code` may be NULL. */
void duet_api_error_set(duet_api_error_t *e, int status, const char *type, const char *param, const char *code,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error as its JSON body (malloc'd, NUL-terminated; free()). */
char *duet_api_error_json(const duet_api_error_t *e);
/* Error type for an HTTP status: invalid_request_error, not_found_error, ... */
const char *duet_api_error_type(int status);

/* The field a chat-encoder message names ("messages[2].tool_calls[0]..."
 * at the start of `msg`) copied into param; "messages" when there is none. */
void duet_api_param_from_message(const char *msg, char *param, size_t n);

#endif
