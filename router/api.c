/* OpenAI request parsing and validation (api.h). */
#include "api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(duet_api_error_t *e, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A 400 naming `param`; returns -1 so that callers can `return bad(...)`. */
static int bad(duet_api_error_t *e, const char *param, const char *code, const char *fmt, ...)
{
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    duet_api_error_set(e, 400, "invalid_request_error", param, code, "%s", m);
    return -1;
}

void duet_api_error_set(duet_api_error_t *e, int status, const char *type, const char *param, const char *code,
                        const char *fmt, ...)
{
    memset(e, 0, sizeof *e);
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : duet_api_error_type(status));
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

const char *duet_api_error_type(int status)
{
    switch (status) {
    case 400: return "invalid_request_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    case 504: return "timeout_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

char *duet_api_error_json(const duet_api_error_t *e)
{
    json_t *o = json_object(), *in = json_object();
    /* a message is built by snprintf from our own text and the client's field
     * names, which jansson may refuse as invalid UTF-8: fall back to a fixed one */
    json_t *msg = json_string(e->message);
    if (!msg)
        msg = json_string("the request is invalid (the error message was not valid UTF-8)");
    json_object_set_new(in, "message", msg);
    json_object_set_new(in, "type", json_string(e->type));
    json_t *param = e->param[0] ? json_string(e->param) : NULL; /* NULL also for a non-UTF-8 name */
    json_object_set_new(in, "param", param ? param : json_null());
    json_object_set_new(in, "code", e->code[0] ? json_string(e->code) : json_null());
    json_object_set_new(o, "error", in);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

void duet_api_param_from_message(const char *msg, char *param, size_t n)
{
    size_t k = 0;
    while (msg[k] && k + 1 < n &&
           ((msg[k] >= 'a' && msg[k] <= 'z') || (msg[k] >= 'A' && msg[k] <= 'Z') || (msg[k] >= '0' && msg[k] <= '9') ||
            msg[k] == '_' || msg[k] == '.' || msg[k] == '[' || msg[k] == ']'))
        k++;
    if (k == 0 || (strncmp(msg, "messages", 8) != 0 && strncmp(msg, "tools", 5) != 0)) {
        snprintf(param, n, "messages");
        return;
    }
    memcpy(param, msg, k);
    param[k] = 0;
}

void duet_api_req_fini(duet_api_req_t *r)
{
    json_decref(r->root);
    free(r->prompt_ids);
    memset(r, 0, sizeof *r);
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A member that is absent or null counts as not given. */
static const json_t *get(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(const json_t *o, const char *k, int *out, duet_api_error_t *e)
{
    const json_t *v = get(o, k);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad(e, k, "invalid_type", "'%s' must be a boolean, not %s", k, type_name(v));
    *out = json_is_true(v);
    return 0;
}

/* A finite number in [lo, hi]; `lo_open` excludes lo. */
static int get_num(const json_t *o, const char *k, double lo, double hi, int lo_open, float *out, duet_api_error_t *e)
{
    const json_t *v = get(o, k);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return bad(e, k, "invalid_type", "'%s' must be a number, not %s", k, type_name(v));
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return bad(e, k, "invalid_value", "'%s' is %g; it must be in %s%g, %g]", k, d, lo_open ? "(" : "[", lo, hi);
    *out = (float)d;
    return 0;
}

/* An integer (or a number with an integral value) in [lo, hi]. */
static int get_int(const json_t *o, const char *k, long long lo, long long hi, long long *out, int *given,
                   duet_api_error_t *e)
{
    const json_t *v = get(o, k);
    if (given)
        *given = 0;
    if (!v)
        return 0;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);
    } else {
        return bad(e, k, "invalid_type", "'%s' must be an integer, not %s", k, type_name(v));
    }
    if (x < lo || x > hi)
        return bad(e, k, "invalid_value", "'%s' is %lld; it must be in [%lld, %lld]", k, x, lo, hi);
    *out = x;
    if (given)
        *given = 1;
    return 0;
}

/* A parameter duet does not implement: absent, null or its neutral value only. */
static int unsupported_unless_neutral(const json_t *o, const char *k, duet_api_error_t *e)
{
    const json_t *v = get(o, k);
    if (!v)
        return 0;
    int neutral = (json_is_false(v)) || (json_is_number(v) && json_number_value(v) == 0) ||
                  (json_is_object(v) && json_object_size(v) == 0) || (json_is_array(v) && json_array_size(v) == 0);
    if (!neutral)
        return (duet_api_error_set(e, 400, "invalid_request_error", k, "unsupported_parameter",
                                   "'%s' is not supported by this server", k),
                -1);
    return 0;
}

static int parse_stop(duet_api_req_t *r, duet_api_error_t *e)
{
    const json_t *v = get(r->root, "stop");
    if (!v)
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return bad(e, "stop", "invalid_value", "'stop' must not be an empty string");
        if (strlen(json_string_value(v)) != json_string_length(v))
            return bad(e, "stop", "invalid_value", "'stop' must not contain U+0000");
        r->stop[r->n_stop++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v))
        return bad(e, "stop", "invalid_type", "'stop' must be a string or an array of strings, not %s", type_name(v));
    if (json_array_size(v) > DUET_API_MAX_STOP)
        return bad(e, "stop", "invalid_value", "'stop' has %zu strings; at most %d are allowed", json_array_size(v),
                   DUET_API_MAX_STOP);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *s = json_array_get(v, i);
        char p[32];
        snprintf(p, sizeof p, "stop[%zu]", i);
        if (!json_is_string(s))
            return bad(e, p, "invalid_type", "'%s' must be a string, not %s", p, type_name(s));
        if (json_string_length(s) == 0 || strlen(json_string_value(s)) != json_string_length(s))
            return bad(e, p, "invalid_value", "'%s' must be a non-empty string without U+0000", p);
        r->stop[r->n_stop++] = json_string_value(s);
    }
    return 0;
}

static int parse_stop_ids(duet_api_req_t *r, const duet_api_limits_t *lim, duet_api_error_t *e)
{
    const json_t *v = get(r->root, "stop_token_ids");
    if (!v)
        return 0;
    if (!json_is_array(v))
        return bad(e, "stop_token_ids", "invalid_type", "'stop_token_ids' must be an array of integers, not %s",
                   type_name(v));
    if (json_array_size(v) > DUET_API_MAX_STOP_IDS)
        return bad(e, "stop_token_ids", "invalid_value", "'stop_token_ids' has %zu ids; at most %d are allowed",
                   json_array_size(v), DUET_API_MAX_STOP_IDS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *x = json_array_get(v, i);
        char p[40];
        snprintf(p, sizeof p, "stop_token_ids[%zu]", i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= lim->vocab_size)
            return bad(e, p, "invalid_value", "'%s' must be a token id in [0, %d)", p, lim->vocab_size);
        r->stop_ids[r->n_stop_ids++] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int parse_sampling(duet_api_req_t *r, const duet_api_limits_t *lim, duet_api_error_t *e)
{
    const json_t *o = r->root;
    long long x;
    int given;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    r->skip_special_tokens = 1;
    if (get_num(o, "temperature", 0, 2, 0, &r->temperature, e) || get_num(o, "top_p", 0, 1, 1, &r->top_p, e) ||
        get_num(o, "min_p", 0, 1, 0, &r->min_p, e))
        return -1;
    if (r->min_p >= 1.0f)
        return bad(e, "min_p", "invalid_value", "'min_p' must be below 1");
    if (get_int(o, "top_k", -1, 1 << 30, &x, &given, e))
        return -1;
    r->top_k = given && x > 0 ? (int32_t)x : 0;
    const json_t *seed = get(o, "seed");
    if (seed) {
        if (!json_is_integer(seed))
            return bad(e, "seed", "invalid_type", "'seed' must be an integer, not %s", type_name(seed));
        r->has_seed = 1;
        r->seed = (uint64_t)json_integer_value(seed);
    }
    /* max_completion_tokens is the current name; max_tokens the older one */
    long long mt = 0;
    if (get_int(o, "max_tokens", 1, 1 << 24, &mt, &given, e))
        return -1;
    if (given)
        r->max_tokens = (uint32_t)mt;
    if (r->kind == DUET_API_CHAT) {
        if (get_int(o, "max_completion_tokens", 1, 1 << 24, &mt, &given, e))
            return -1;
        if (given)
            r->max_tokens = (uint32_t)mt;
    }
    if (get_int(o, "n", 1, 1, &x, &given, e)) {
        if (get(o, "n") && json_is_integer(get(o, "n")))
            snprintf(e->message, sizeof e->message, "'n' must be 1: this server returns one choice per request");
        return -1;
    }
    if (parse_stop(r, e) || parse_stop_ids(r, lim, e))
        return -1;
    if (get_bool(o, "ignore_eos", &r->ignore_eos, e) || get_bool(o, "skip_special_tokens", &r->skip_special_tokens, e) ||
        get_bool(o, "return_token_ids", &r->return_token_ids, e))
        return -1;
    if (unsupported_unless_neutral(o, "presence_penalty", e) || unsupported_unless_neutral(o, "frequency_penalty", e) ||
        unsupported_unless_neutral(o, "logit_bias", e) || unsupported_unless_neutral(o, "repetition_penalty", e) ||
        unsupported_unless_neutral(o, "min_tokens", e))
        return -1;
    const json_t *so = get(o, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return bad(e, "stream_options", "invalid_type", "'stream_options' must be an object, not %s", type_name(so));
        if (get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    const json_t *sess = get(o, "session_id");
    if (sess) {
        if (!json_is_string(sess) || json_string_length(sess) == 0 || json_string_length(sess) > 128)
            return bad(e, "session_id", "invalid_value", "'session_id' must be a string of 1 to 128 bytes");
        r->session = json_string_value(sess);
    }
    return 0;
}

static int parse_thinking(duet_api_req_t *r, duet_api_error_t *e)
{
    const json_t *o = r->root;
    int thinking = -1; /* not said */
    const json_t *t = get(o, "thinking");
    if (t) {
        if (json_is_boolean(t)) {
            thinking = json_is_true(t);
        } else if (json_is_object(t) && json_is_string(json_object_get(t, "type"))) {
            const char *ty = json_string_value(json_object_get(t, "type"));
            if (!strcmp(ty, "enabled"))
                thinking = 1;
            else if (!strcmp(ty, "disabled"))
                thinking = 0;
            else
                return bad(e, "thinking.type", "invalid_value", "'thinking.type' must be \"enabled\" or \"disabled\"");
        } else {
            return bad(e, "thinking", "invalid_type",
                       "'thinking' must be a boolean or {\"type\": \"enabled\"|\"disabled\"}, not %s", type_name(t));
        }
    }
    const json_t *kw = get(o, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw))
            return bad(e, "chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object");
        for (int i = 0; i < 2; i++) {
            const char *k = i ? "enable_thinking" : "thinking";
            const json_t *v = get(kw, k);
            if (!v)
                continue;
            if (!json_is_boolean(v))
                return bad(e, i ? "chat_template_kwargs.enable_thinking" : "chat_template_kwargs.thinking",
                           "invalid_type", "'chat_template_kwargs.%s' must be a boolean", k);
            if (thinking < 0)
                thinking = json_is_true(v);
        }
    }
    const json_t *re = get(o, "reasoning_effort");
    r->effort = DUET_CHAT_EFFORT_DEFAULT;
    if (re) {
        const char *s = json_is_string(re) ? json_string_value(re) : NULL;
        if (s && !strcmp(s, "low"))
            r->effort = DUET_CHAT_EFFORT_LOW;
        else if (s && !strcmp(s, "medium"))
            r->effort = DUET_CHAT_EFFORT_DEFAULT;
        else if (s && !strcmp(s, "high"))
            r->effort = DUET_CHAT_EFFORT_HIGH;
        else if (s && !strcmp(s, "max"))
            r->effort = DUET_CHAT_EFFORT_MAX;
        else
            return bad(e, "reasoning_effort", "invalid_value",
                       "'reasoning_effort' must be one of \"low\", \"medium\", \"high\", \"max\"");
        if (thinking < 0)
            thinking = 1; /* an effort asks for reasoning */
    }
    r->thinking = thinking > 0;
    return 0;
}

static int parse_tools(duet_api_req_t *r, duet_api_error_t *e)
{
    const json_t *o = r->root;
    const json_t *tools = get(o, "tools");
    if (tools) {
        if (!json_is_array(tools))
            return bad(e, "tools", "invalid_type", "'tools' must be an array, not %s", type_name(tools));
        if (json_array_size(tools) > DUET_API_MAX_TOOLS)
            return bad(e, "tools", "invalid_value", "'tools' has %zu entries; at most %d are allowed",
                       json_array_size(tools), DUET_API_MAX_TOOLS);
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i), *f = json_object_get(t, "function");
            char p[48];
            snprintf(p, sizeof p, "tools[%zu]", i);
            if (!json_is_object(t))
                return bad(e, p, "invalid_type", "'%s' must be an object, not %s", p, type_name(t));
            const json_t *ty = json_object_get(t, "type");
            if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "function")))
                return bad(e, p, "invalid_value", "'%s.type' must be \"function\"", p);
            snprintf(p, sizeof p, "tools[%zu].function", i);
            if (!json_is_object(f))
                return bad(e, p, "invalid_type", "'%s' must be an object", p);
            const json_t *name = json_object_get(f, "name");
            if (!json_is_string(name) || json_string_length(name) == 0) {
                snprintf(p, sizeof p, "tools[%zu].function.name", i);
                return bad(e, p, "invalid_value", "'%s' must be a non-empty string", p);
            }
        }
        if (json_array_size(tools))
            r->tools = tools;
    }
    const json_t *tc = get(o, "tool_choice");
    r->tool_choice = DUET_TOOL_CHOICE_AUTO;
    if (tc) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "auto"))
                r->tool_choice = DUET_TOOL_CHOICE_AUTO;
            else if (!strcmp(s, "none"))
                r->tool_choice = DUET_TOOL_CHOICE_NONE;
            else if (!strcmp(s, "required"))
                r->tool_choice = DUET_TOOL_CHOICE_REQUIRED;
            else
                return bad(e, "tool_choice", "invalid_value",
                           "'tool_choice' must be \"auto\", \"none\", \"required\" or a named function");
        } else if (json_is_object(tc)) {
            const json_t *f = json_object_get(tc, "function");
            const json_t *name = json_is_object(f) ? json_object_get(f, "name") : NULL;
            if (!json_is_string(name) || json_string_length(name) == 0)
                return bad(e, "tool_choice.function.name", "invalid_value",
                           "'tool_choice.function.name' must be a non-empty string");
            r->tool_choice = DUET_TOOL_CHOICE_NAMED;
            r->tool_name = json_string_value(name);
        } else {
            return bad(e, "tool_choice", "invalid_type", "'tool_choice' must be a string or an object, not %s",
                       type_name(tc));
        }
    }
    if (!r->tools && (r->tool_choice == DUET_TOOL_CHOICE_REQUIRED || r->tool_choice == DUET_TOOL_CHOICE_NAMED))
        return bad(e, "tool_choice", "invalid_value", "'tool_choice' asks for a tool call but 'tools' is empty");
    if (r->tool_choice == DUET_TOOL_CHOICE_NAMED) {
        int found = 0;
        for (size_t i = 0; i < json_array_size(r->tools) && !found; i++) {
            const json_t *n = json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name");
            found = !strcmp(json_string_value(n), r->tool_name);
        }
        if (!found)
            return bad(e, "tool_choice.function.name", "invalid_value", "no tool is named '%s'", r->tool_name);
    }
    if (get_bool(o, "parallel_tool_calls", &(int){0}, e))
        return -1;
    const json_t *rf = get(o, "response_format");
    if (rf) {
        const json_t *ty = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        const char *s = json_is_string(ty) ? json_string_value(ty) : NULL;
        if (!s || (strcmp(s, "text") && strcmp(s, "json_object") && strcmp(s, "json_schema")))
            return bad(e, "response_format.type", "invalid_value",
                       "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
        if (strcmp(s, "text"))
            r->response_format = rf;
    }
    return 0;
}

static int parse_prompt(duet_api_req_t *r, const duet_api_limits_t *lim, duet_api_error_t *e)
{
    const json_t *p = get(r->root, "prompt");
    if (!p)
        return bad(e, "prompt", "missing_required_parameter", "'prompt' is required");
    /* a list of one prompt is the same as the prompt */
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        r->prompt_len = json_string_length(p);
        return 0;
    }
    if (!json_is_array(p))
        return bad(e, "prompt", "invalid_type", "'prompt' must be a string or an array of token ids, not %s",
                   type_name(p));
    size_t n = json_array_size(p);
    if (n == 0)
        return bad(e, "prompt", "invalid_value", "'prompt' must not be empty");
    r->prompt_ids = malloc(sizeof(int32_t) * n);
    if (!r->prompt_ids)
        return (duet_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(p, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= lim->vocab_size) {
            char q[40];
            snprintf(q, sizeof q, "prompt[%zu]", i);
            if (json_is_string(x) || json_is_array(x))
                return bad(e, "prompt", "invalid_value",
                           "'prompt' holds several prompts; send one prompt per request");
            return bad(e, q, "invalid_value", "'%s' must be a token id in [0, %d)", q, lim->vocab_size);
        }
        r->prompt_ids[i] = (int32_t)json_integer_value(x);
    }
    r->n_prompt_ids = n;
    return 0;
}

int duet_api_parse(duet_api_kind_t kind, const char *body, size_t len, const duet_api_limits_t *lim,
                   duet_api_req_t *out, duet_api_error_t *err)
{
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    json_error_t je;
    out->root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!out->root) {
        duet_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                           "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        goto fail;
    }
    if (!json_is_object(out->root)) {
        bad(err, NULL, "invalid_json", "the body must be a JSON object, not %s", type_name(out->root));
        goto fail;
    }
    const json_t *model = json_object_get(out->root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            bad(err, "model", "invalid_type", "'model' must be a string, not %s", type_name(model));
            goto fail;
        }
        if (lim->served_model && strcmp(json_string_value(model), lim->served_model) != 0) {
            duet_api_error_set(err, 404, "invalid_request_error", "model", "model_not_found",
                               "The model '%.200s' does not exist; this server serves '%.200s'",
                               json_string_value(model), lim->served_model);
            goto fail;
        }
    }
    if (get_bool(out->root, "stream", &out->stream, err))
        goto fail;
    if (parse_sampling(out, lim, err))
        goto fail;
    if (kind == DUET_API_CHAT) {
        const json_t *m = json_object_get(out->root, "messages");
        if (!m || json_is_null(m)) {
            bad(err, "messages", "missing_required_parameter", "'messages' is required");
            goto fail;
        }
        if (!json_is_array(m) || json_array_size(m) == 0) {
            bad(err, "messages", "invalid_value", "'messages' must be a non-empty array");
            goto fail;
        }
        out->messages = m;
        if (parse_thinking(out, err) || parse_tools(out, err))
            goto fail;
        if (unsupported_unless_neutral(out->root, "logprobs", err) ||
            unsupported_unless_neutral(out->root, "top_logprobs", err))
            goto fail;
    } else {
        if (parse_prompt(out, lim, err))
            goto fail;
        if (unsupported_unless_neutral(out->root, "echo", err) || unsupported_unless_neutral(out->root, "logprobs", err))
            goto fail;
        const json_t *sfx = get(out->root, "suffix");
        if (sfx && !(json_is_string(sfx) && json_string_length(sfx) == 0)) {
            duet_api_error_set(err, 400, "invalid_request_error", "suffix", "unsupported_parameter",
                               "'suffix' is not supported by this server");
            goto fail;
        }
        long long bo;
        int given;
        if (get_int(out->root, "best_of", 1, 1, &bo, &given, err))
            goto fail;
    }
    return 0;
fail:
    duet_api_req_fini(out);
    if (!err->status)
        duet_api_error_set(err, 400, "invalid_request_error", NULL, NULL, "invalid request");
    return -1;
}
