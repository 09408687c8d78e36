/* Fuzz target: the router's request-body parser (router/api.h).
 *
 * The first byte picks the endpoint (even: POST /v1/chat/completions, odd:
 * POST /v1/completions; the stored corpus uses 'H' for chat and 'C' for
 * completions), the rest is the body, copied to an exact-size heap buffer so
 * that sanitizers catch any read past it.  It goes through duet_api_parse as
 * the router calls it; an accepted chat request's messages then go through
 * the chat encoder as the router does next (router/http.c), so that unknown
 * roles and malformed tool calls are exercised too.
 *
 * Checked: no crash; every failure is an OpenAI error with a status, a type,
 * a message and the offending field in `param` (only a body that is not a
 * JSON object, code "invalid_json", and out-of-memory have none), and its
 * JSON body builds; every accepted request holds what api.h promises.
 *
 * With -DDUET_FUZZ_LIBFUZZER (tests/fuzz/run_fuzz.sh, which compiles only
 * common/ and common/text/) the parser's source is compiled in here; the
 * plain build links duet_router_lib instead. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../../router/api.h"
#include "chat.h"
#include "err.h"

#ifdef DUET_FUZZ_LIBFUZZER
#include "../../router/api.c"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const duet_api_limits_t g_lim = {.served_model = "tiny",
                                        .vocab_size = 129280,
                                        .default_max_tokens_chat = 4096,
                                        .default_max_tokens_completion = 16};

/* The error must be complete and render as an OpenAI error body. */
static void check_error(const duet_api_error_t *e)
{
    if (e->status != 400 && e->status != 404 && e->status != 500)
        abort();
    if (!e->type[0] || !e->message[0])
        abort();
    if (!e->param[0] && strcmp(e->code, "invalid_json") != 0 && e->status != 500)
        abort(); /* a failure that names no field */
    if (!memchr(e->param, 0, sizeof e->param) || !memchr(e->message, 0, sizeof e->message))
        abort();
    char *body = duet_api_error_json(e);
    if (!body)
        abort();
    json_t *back = json_loads(body, 0, NULL);
    json_t *in = json_object_get(back, "error");
    if (!json_is_object(in) || !json_is_string(json_object_get(in, "message")) ||
        !json_is_string(json_object_get(in, "type")))
        abort();
    json_decref(back);
    free(body);
}

static void check_accepted(const duet_api_req_t *r, duet_api_kind_t kind)
{
    if (!json_is_object(r->root) || r->kind != kind)
        abort();
    if (!(r->temperature >= 0 && r->temperature <= 2) || !(r->top_p > 0 && r->top_p <= 1) ||
        !(r->min_p >= 0 && r->min_p < 1) || r->top_k < 0 || r->max_tokens > (1u << 24))
        abort();
    if (r->n_stop > DUET_API_MAX_STOP || r->n_stop_ids > DUET_API_MAX_STOP_IDS)
        abort();
    for (size_t i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0])
            abort();
    for (size_t i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= g_lim.vocab_size)
            abort();
    if (r->session && (!r->session[0] || strlen(r->session) > 128))
        abort();
    if (kind == DUET_API_COMPLETION) {
        if (!r->prompt == !r->prompt_ids) /* exactly one of text and ids */
            abort();
        for (size_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= g_lim.vocab_size)
                abort();
        if (r->prompt_ids && r->n_prompt_ids == 0)
            abort();
        return;
    }
    if (!json_is_array(r->messages) || json_array_size(r->messages) == 0)
        abort();
    if (r->tools && (!json_is_array(r->tools) || json_array_size(r->tools) > DUET_API_MAX_TOOLS))
        abort();
    if ((r->tool_choice == DUET_TOOL_CHOICE_REQUIRED || r->tool_choice == DUET_TOOL_CHOICE_NAMED) && !r->tools)
        abort();
    if ((r->tool_choice == DUET_TOOL_CHOICE_NAMED) != (r->tool_name != NULL))
        abort();
}

/* The next step of an accepted chat request in the router: the chat encoder,
 * whose failures are answered with the field its message names. */
static void encode_chat(const duet_api_req_t *r)
{
    duet_chat_opts_t co = {0};
    co.thinking = r->thinking;
    co.effort = r->effort;
    co.response_format = r->response_format;
    const json_t *tools = r->tool_choice == DUET_TOOL_CHOICE_NONE ? NULL : r->tools;
    json_t *named = NULL;
    if (r->tool_choice == DUET_TOOL_CHOICE_NAMED) {
        named = json_array();
        for (size_t i = 0; i < json_array_size(r->tools); i++) {
            json_t *t = json_array_get(r->tools, i);
            if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), r->tool_name))
                json_array_append(named, t);
        }
        if (json_array_size(named) == 0)
            abort(); /* the parser promised the named tool exists */
        tools = named;
    }
    char *prompt = NULL;
    size_t plen = 0;
    duet_err_t err = {0};
    duet_status_t st = duet_chat_encode(r->messages, tools, &co, &prompt, &plen, &err);
    if (st == DUET_OK) {
        if (!prompt || strlen(prompt) > plen)
            abort();
        free(prompt);
    } else if (st != DUET_ERR_NOMEM) {
        duet_api_error_t e;
        char param[128];
        if (!err.msg[0] || prompt)
            abort();
        duet_api_param_from_message(err.msg, param, sizeof param);
        if (!param[0] || (strncmp(param, "messages", 8) != 0 && strncmp(param, "tools", 5) != 0))
            abort();
        duet_api_error_set(&e, 400, NULL, param, "invalid_value", "%s", err.msg);
        check_error(&e);
    }
    json_decref(named);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    duet_api_kind_t kind = (data[0] & 1) ? DUET_API_COMPLETION : DUET_API_CHAT;
    size_t len = size - 1;
    char *body = malloc(len ? len : 1);
    if (!body)
        return 0;
    memcpy(body, data + 1, len);

    duet_api_req_t r;
    duet_api_error_t e;
    int rc = duet_api_parse(kind, body, len, &g_lim, &r, &e);
    if (rc == 0) {
        check_accepted(&r, kind);
        if (kind == DUET_API_CHAT)
            encode_chat(&r);
        duet_api_req_fini(&r);
        if (r.root || r.prompt_ids)
            abort(); /* fini clears */
    } else if (rc == -1) {
        if (r.root || r.prompt_ids || r.messages)
            abort(); /* `out` is zeroed on error */
        check_error(&e);
    } else {
        abort();
    }
    free(body);
    return 0;
}
