/* DeepSeek-V4 chat encoding; see chat.h and docs/TEXT.md ("Chat encoding").
 *
 * The work is done in the order of the official encoder, so that each of its
 * rules has one place here:
 *   1. read and check every message (roles, content, tool calls, arguments);
 *   2. put the request tools (and response format) into the first message,
 *      adding an empty system message in front when the first is not one;
 *   3. merge tool results and consecutive user messages into user turns made
 *      of blocks, then order each turn's tool results as the calls were made;
 *   4. in thinking mode without tools, drop earlier reasoning (and developer
 *      messages before the last user turn);
 *   5. render each message, then the transition that follows it. */
#include "chat.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "chat_json.h"

/* ---- fixed texts --------------------------------------------------------- */

#define TOOLS_HEAD                                                                              \
    "## Tools\n\n"                                                                              \
    "You have access to a set of tools to help answer the user's question. You can invoke "     \
    "tools by writing a \"<" DUET_CHAT_DSML "tool_calls>\" block like the following:\n\n"       \
    "<" DUET_CHAT_DSML "tool_calls>\n"                                                          \
    "<" DUET_CHAT_DSML "invoke name=\"$TOOL_NAME\">\n"                                          \
    "<" DUET_CHAT_DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"              \
    "$PARAMETER_VALUE</" DUET_CHAT_DSML "parameter>\n"                                          \
    "...\n"                                                                                     \
    "</" DUET_CHAT_DSML "invoke>\n"                                                             \
    "<" DUET_CHAT_DSML "invoke name=\"$TOOL_NAME2\">\n"                                         \
    "...\n"                                                                                     \
    "</" DUET_CHAT_DSML "invoke>\n"                                                             \
    "</" DUET_CHAT_DSML "tool_calls>\n\n"                                                       \
    "String parameters should be specified as is and set `string=\"true\"`. For all other "     \
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "        \
    "`string=\"false\"`.\n\n"                                                                   \
    "If thinking_mode is enabled (triggered by " DUET_CHAT_THINK_START "), you MUST output "    \
    "your complete reasoning inside " DUET_CHAT_THINK_START "..." DUET_CHAT_THINK_END          \
    " BEFORE any tool calls or final response.\n\n"                                             \
    "Otherwise, output directly after " DUET_CHAT_THINK_END                                     \
    " with tool calls or final response.\n\n"                                                   \
    "### Available Tool Schemas\n\n"

#define TOOLS_TAIL                                                                              \
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "        \
    "invoke tool calls.\n"

#define RESPONSE_FORMAT_HEAD                                                                    \
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"

/* Effort prefixes, written before the first message in thinking mode. */
static const char effort_text_high[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n";

static const char effort_text_official_max[] =
    "Reasoning Effort: Beyond maximum \xe2\x80\x94 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every "
    "causal chain to its root, and resolve the underlying cause rather than any surface "
    "symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple "
    "angles and are certain that no assumption remains unchecked and no error remains "
    "undiscovered.\n\n";

static const char *const task_tokens[] = {
    [DUET_CHAT_TASK_NONE] = "",
    [DUET_CHAT_TASK_ACTION] = "<｜action｜>",
    [DUET_CHAT_TASK_QUERY] = "<｜query｜>",
    [DUET_CHAT_TASK_AUTHORITY] = "<｜authority｜>",
    [DUET_CHAT_TASK_DOMAIN] = "<｜domain｜>",
    [DUET_CHAT_TASK_TITLE] = "<｜title｜>",
    [DUET_CHAT_TASK_READ_URL] = "<｜read_url｜>",
};

static const char *const task_names[] = {
    [DUET_CHAT_TASK_NONE] = "",
    [DUET_CHAT_TASK_ACTION] = "action",
    [DUET_CHAT_TASK_QUERY] = "query",
    [DUET_CHAT_TASK_AUTHORITY] = "authority",
    [DUET_CHAT_TASK_DOMAIN] = "domain",
    [DUET_CHAT_TASK_TITLE] = "title",
    [DUET_CHAT_TASK_READ_URL] = "read_url",
};

/* ---- internal messages ----------------------------------------------------- */

typedef enum {
    ROLE_SYSTEM = 0,
    ROLE_DEVELOPER,
    ROLE_USER,
    ROLE_ASSISTANT,
    ROLE_TOOL,
    ROLE_REMINDER,
} role_t;

static const char *const role_names[] = {
    "system", "developer", "user", "assistant", "tool", "latest_reminder",
};

typedef struct {
    const char *p;
    size_t n;
} str_t;

typedef struct {
    str_t name;
    const char *id;          /* "" when the call has none */
    duet_chat_json_t *args;  /* arguments given as JSON text, parsed */
    const json_t *args_obj;  /* arguments given as an object */
} call_t;

typedef struct {
    int is_tool;             /* a tool result; otherwise user text */
    str_t text;
    const char *tool_use_id; /* NULL when the tool message named no call */
} block_t;

typedef struct {
    role_t role;
    size_t src;              /* index in `messages`; SIZE_MAX for an added system message */
    str_t content;
    str_t reasoning;         /* .p NULL when absent */
    const char *tool_call_id; /* tool messages; NULL when absent */
    call_t *calls;           /* assistant tool calls (owned by the message read from input) */
    size_t n_calls;
    block_t *blocks;         /* user turns after merging */
    size_t n_blocks, cap_blocks;
    int host;                /* holds the request tools and response format */
    duet_chat_task_t task;
    int wo_eos;
} msg_t;

typedef struct {
    duet_err_t *err;
    char **owned;            /* strings built while reading (flattened content) */
    size_t n_owned, cap_owned;
    msg_t *in;               /* messages as read, plus the added system message */
    size_t n_in;
    msg_t *turns;            /* after merging */
    size_t n_turns;
    const json_t *tools;     /* request tools, when non-empty */
    const json_t *response_format; /* when truthy */
} enc_t;

static duet_status_t bad(enc_t *e, duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static duet_status_t bad(enc_t *e, duet_status_t st, const char *fmt, ...)
{
    if (e->err) {
        va_list ap;
        va_start(ap, fmt);
        e->err->status = st;
        vsnprintf(e->err->msg, sizeof e->err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

static duet_status_t nomem(enc_t *e)
{
    return bad(e, DUET_ERR_NOMEM, "out of memory encoding the chat");
}

static int keep_string(enc_t *e, char *s)
{
    if (e->n_owned == e->cap_owned) {
        size_t nc = e->cap_owned ? e->cap_owned * 2 : 8;
        char **o = realloc(e->owned, nc * sizeof *o);
        if (!o)
            return -1;
        e->owned = o;
        e->cap_owned = nc;
    }
    e->owned[e->n_owned++] = s;
    return 0;
}

/* Python truthiness of a JSON value: null, false, 0, 0.0, "", [] and {} are false. */
static int truthy(const json_t *v)
{
    if (!v)
        return 0;
    switch (json_typeof(v)) {
    case JSON_NULL:
    case JSON_FALSE:
        return 0;
    case JSON_TRUE:
        return 1;
    case JSON_INTEGER:
        return json_integer_value(v) != 0;
    case JSON_REAL:
        return json_real_value(v) != 0;
    case JSON_STRING:
        return json_string_length(v) != 0;
    case JSON_ARRAY:
        return json_array_size(v) != 0;
    case JSON_OBJECT:
        return json_object_size(v) != 0;
    }
    return 0;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* ---- reading --------------------------------------------------------------- */

/* The text of `content`: a string, null or missing (""), or a list of parts.
 * Text parts of a tool result are joined with a blank line and other parts
 * stand as "[Unsupported TYPE]" (the official encoder's rule); elsewhere
 * text parts are joined with a space and any other part is an error. */
static duet_status_t read_content(enc_t *e, size_t mi, const json_t *c, int tool, str_t *out)
{
    if (!c || json_is_null(c)) {
        *out = (str_t){"", 0};
        return DUET_OK;
    }
    if (json_is_string(c)) {
        *out = (str_t){json_string_value(c), json_string_length(c)};
        return DUET_OK;
    }
    if (!json_is_array(c))
        return bad(e, DUET_ERR_INVALID,
                   "messages[%zu].content must be a string, null or a list of text parts, not %s",
                   mi, type_name(c));
    duet_chat_buf_t b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        if (!json_is_string(type)) {
            duet_chat_buf_fini(&b);
            return bad(e, DUET_ERR_INVALID,
                       "messages[%zu].content[%zu] must be an object with a string \"type\"", mi, i);
        }
        const char *t = json_string_value(type);
        int is_text = strcmp(t, "text") == 0 || (!tool && strcmp(t, "input_text") == 0);
        if (i)
            duet_chat_buf_puts(&b, tool ? "\n\n" : " ");
        if (is_text) {
            const json_t *text = json_object_get(part, "text");
            if (!json_is_string(text)) {
                duet_chat_buf_fini(&b);
                return bad(e, DUET_ERR_INVALID, "messages[%zu].content[%zu].text must be a string",
                           mi, i);
            }
            duet_chat_buf_put(&b, json_string_value(text), json_string_length(text));
        } else if (tool) {
            duet_chat_buf_puts(&b, "[Unsupported ");
            duet_chat_buf_put(&b, t, json_string_length(type));
            duet_chat_buf_putc(&b, ']');
        } else {
            duet_chat_buf_fini(&b);
            return bad(e, DUET_ERR_INVALID,
                       "messages[%zu].content[%zu] has type \"%.64s\"; only text parts are supported",
                       mi, i, t);
        }
    }
    if (b.failed) {
        duet_chat_buf_fini(&b);
        return nomem(e);
    }
    if (b.len == 0) {
        duet_chat_buf_fini(&b);
        *out = (str_t){"", 0};
        return DUET_OK;
    }
    if (keep_string(e, b.p) < 0) {
        duet_chat_buf_fini(&b);
        return nomem(e);
    }
    *out = (str_t){b.p, b.len};
    return DUET_OK;
}

static int all_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            return 0;
    return 1;
}

static duet_status_t read_call(enc_t *e, size_t mi, size_t ci, const json_t *tc, call_t *call)
{
    if (!json_is_object(tc))
        return bad(e, DUET_ERR_INVALID, "messages[%zu].tool_calls[%zu] must be an object, not %s",
                   mi, ci, type_name(tc));
    const json_t *type = json_object_get(tc, "type");
    if (type && !json_is_null(type) &&
        (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0))
        return bad(e, DUET_ERR_INVALID, "messages[%zu].tool_calls[%zu].type must be \"function\"",
                   mi, ci);
    const json_t *fn = json_object_get(tc, "function");
    if (!json_is_object(fn))
        return bad(e, DUET_ERR_INVALID,
                   "messages[%zu].tool_calls[%zu].function must be an object", mi, ci);
    const json_t *name = json_object_get(fn, "name");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return bad(e, DUET_ERR_INVALID,
                   "messages[%zu].tool_calls[%zu].function.name must be a non-empty string", mi, ci);
    call->name = (str_t){json_string_value(name), json_string_length(name)};

    /* The id orders tool results; like the official encoder, fall back to an
     * id inside the function object. */
    call->id = "";
    const json_t *id = json_object_get(tc, "id");
    if (id && !json_is_null(id) && !json_is_string(id))
        return bad(e, DUET_ERR_INVALID, "messages[%zu].tool_calls[%zu].id must be a string",
                   mi, ci);
    if (json_is_string(id) && json_string_length(id) > 0) {
        call->id = json_string_value(id);
    } else {
        const json_t *fid = json_object_get(fn, "id");
        if (json_is_string(fid))
            call->id = json_string_value(fid);
    }

    const json_t *args = json_object_get(fn, "arguments");
    if (json_is_object(args)) {
        call->args_obj = args;
        return DUET_OK;
    }
    if (!json_is_string(args))
        return bad(e, DUET_ERR_INVALID,
                   "messages[%zu].tool_calls[%zu].function.arguments must be a JSON text "
                   "(a string) or an object, not %s",
                   mi, ci, args ? type_name(args) : "missing");
    const char *text = json_string_value(args);
    size_t len = json_string_length(args);
    if (all_space(text, len)) { /* "" is taken as a call without arguments */
        text = "{}";
        len = 2;
    }
    duet_err_t perr = {0};
    duet_status_t st = duet_chat_json_parse(text, len, &call->args, &perr);
    if (st == DUET_ERR_NOMEM)
        return nomem(e);
    if (st != DUET_OK)
        return bad(e, DUET_ERR_PARSE,
                   "messages[%zu].tool_calls[%zu].function.arguments is not valid JSON: %s", mi,
                   ci, perr.msg);
    if (call->args->kind != DUET_CHAT_JSON_OBJECT)
        return bad(e, DUET_ERR_INVALID,
                   "messages[%zu].tool_calls[%zu].function.arguments must be a JSON object", mi,
                   ci);
    return DUET_OK;
}

static duet_status_t read_message(enc_t *e, size_t mi, const json_t *m, msg_t *out)
{
    if (!json_is_object(m))
        return bad(e, DUET_ERR_INVALID, "messages[%zu] must be an object, not %s", mi,
                   type_name(m));
    const json_t *role = json_object_get(m, "role");
    if (!json_is_string(role))
        return bad(e, DUET_ERR_INVALID, "messages[%zu].role must be a string", mi);
    const char *r = json_string_value(role);
    size_t k;
    for (k = 0; k < sizeof role_names / sizeof role_names[0]; k++)
        if (strcmp(r, role_names[k]) == 0)
            break;
    if (k == sizeof role_names / sizeof role_names[0])
        return bad(e, DUET_ERR_INVALID,
                   "messages[%zu].role \"%.64s\" is unknown (system, developer, user, assistant, "
                   "tool or latest_reminder)",
                   mi, r);
    out->role = (role_t)k;
    out->src = mi;

    duet_status_t st = read_content(e, mi, json_object_get(m, "content"), out->role == ROLE_TOOL,
                                    &out->content);
    if (st != DUET_OK)
        return st;

    switch (out->role) {
    case ROLE_DEVELOPER:
        if (out->content.n == 0)
            return bad(e, DUET_ERR_INVALID,
                       "messages[%zu].content must not be empty for a developer message", mi);
        break;
    case ROLE_TOOL: {
        const json_t *id = json_object_get(m, "tool_call_id");
        if (id && !json_is_null(id) && !json_is_string(id))
            return bad(e, DUET_ERR_INVALID, "messages[%zu].tool_call_id must be a string", mi);
        out->tool_call_id = json_is_string(id) ? json_string_value(id) : NULL;
        break;
    }
    case ROLE_ASSISTANT: {
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (rc && !json_is_null(rc) && !json_is_string(rc))
            return bad(e, DUET_ERR_INVALID,
                       "messages[%zu].reasoning_content must be a string or null", mi);
        if (json_is_string(rc))
            out->reasoning = (str_t){json_string_value(rc), json_string_length(rc)};
        const json_t *tcs = json_object_get(m, "tool_calls");
        if (!tcs || json_is_null(tcs))
            break;
        if (!json_is_array(tcs))
            return bad(e, DUET_ERR_INVALID, "messages[%zu].tool_calls must be an array, not %s",
                       mi, type_name(tcs));
        size_t n = json_array_size(tcs);
        if (n == 0)
            break;
        out->calls = duet_calloc(n, sizeof *out->calls);
        if (!out->calls)
            return nomem(e);
        out->n_calls = n;
        for (size_t ci = 0; ci < n; ci++) {
            st = read_call(e, mi, ci, json_array_get(tcs, ci), &out->calls[ci]);
            if (st != DUET_OK)
                return st;
        }
        break;
    }
    default:
        break;
    }
    return DUET_OK;
}

/* A tool message answers the assistant message before it (other tool
 * messages may stand between them); a tool_call_id it names must be one of
 * that message's call ids when those calls carry ids.  `a` is the nearest
 * message before in[i] that is not a tool message, NULL when none. */
static duet_status_t check_tool_message(enc_t *e, size_t i, const msg_t *a)
{
    const msg_t *m = &e->in[i];
    if (!a || a->role != ROLE_ASSISTANT || a->n_calls == 0)
        return bad(e, DUET_ERR_INVALID,
                   "messages[%zu] is a tool result with no assistant tool call before it", m->src);
    if (!m->tool_call_id || !m->tool_call_id[0])
        return DUET_OK;
    int any_id = 0;
    for (size_t c = 0; c < a->n_calls; c++) {
        if (!a->calls[c].id[0])
            continue;
        any_id = 1;
        if (strcmp(a->calls[c].id, m->tool_call_id) == 0)
            return DUET_OK;
    }
    if (!any_id)
        return DUET_OK;
    return bad(e, DUET_ERR_INVALID,
               "messages[%zu].tool_call_id \"%.64s\" names no tool call of messages[%zu]", m->src,
               m->tool_call_id, a->src);
}

/* ---- merging --------------------------------------------------------------- */

static int add_block(msg_t *m, block_t b)
{
    if (m->n_blocks == m->cap_blocks) {
        size_t nc = m->cap_blocks ? m->cap_blocks * 2 : 4;
        block_t *nb = realloc(m->blocks, nc * sizeof *nb);
        if (!nb)
            return -1;
        m->blocks = nb;
        m->cap_blocks = nc;
    }
    m->blocks[m->n_blocks++] = b;
    return 0;
}

/* Tool results become blocks of a user turn; a tool result or a user
 * message right after a user turn joins it (a user message only when that
 * turn carries no task). */
static duet_status_t merge(enc_t *e)
{
    e->turns = duet_calloc(e->n_in, sizeof *e->turns);
    if (!e->turns)
        return nomem(e);
    for (size_t i = 0; i < e->n_in; i++) {
        const msg_t *m = &e->in[i];
        msg_t *last = e->n_turns ? &e->turns[e->n_turns - 1] : NULL;
        if (m->role == ROLE_TOOL || m->role == ROLE_USER) {
            block_t b = {m->role == ROLE_TOOL, m->content,
                         m->role == ROLE_TOOL ? (m->tool_call_id ? m->tool_call_id : "") : NULL};
            int join = last && last->role == ROLE_USER &&
                       (m->role == ROLE_TOOL || last->task == DUET_CHAT_TASK_NONE);
            if (!join) {
                last = &e->turns[e->n_turns++];
                last->role = ROLE_USER;
                last->src = m->src;
                if (m->role == ROLE_USER) {
                    last->content = m->content;
                    last->task = m->task;
                    last->wo_eos = m->wo_eos;
                }
            }
            if (add_block(last, b) < 0)
                return nomem(e);
        } else {
            e->turns[e->n_turns] = *m;
            e->turns[e->n_turns].blocks = NULL;
            e->turns[e->n_turns].n_blocks = e->turns[e->n_turns].cap_blocks = 0;
            e->n_turns++;
        }
    }
    return DUET_OK;
}

typedef struct {
    size_t key, seq;
    block_t b;
} keyed_block_t;

static int cmp_keyed(const void *a, const void *b)
{
    const keyed_block_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Tool results of one user turn follow the order of the calls of the last
 * assistant message with calls; a result naming no known call sorts as the
 * first call (stable). */
static duet_status_t sort_tool_results(enc_t *e)
{
    const msg_t *calls_of = NULL;
    for (size_t t = 0; t < e->n_turns; t++) {
        msg_t *m = &e->turns[t];
        if (m->role == ROLE_ASSISTANT && m->n_calls) {
            calls_of = NULL;
            for (size_t c = 0; c < m->n_calls; c++)
                if (m->calls[c].id[0])
                    calls_of = m;
            continue;
        }
        if (m->role != ROLE_USER || !calls_of)
            continue;
        size_t n_tool = 0;
        for (size_t k = 0; k < m->n_blocks; k++)
            n_tool += (size_t)m->blocks[k].is_tool;
        if (n_tool < 2)
            continue;
        keyed_block_t *kb = duet_calloc(n_tool, sizeof *kb);
        if (!kb)
            return nomem(e);
        size_t n = 0;
        for (size_t k = 0; k < m->n_blocks; k++) {
            if (!m->blocks[k].is_tool)
                continue;
            size_t key = 0;
            for (size_t c = 0; c < calls_of->n_calls; c++) /* a repeated id: its last call */
                if (calls_of->calls[c].id[0] &&
                    strcmp(calls_of->calls[c].id, m->blocks[k].tool_use_id) == 0)
                    key = c;
            kb[n] = (keyed_block_t){key, n, m->blocks[k]};
            n++;
        }
        qsort(kb, n, sizeof *kb, cmp_keyed);
        n = 0;
        for (size_t k = 0; k < m->n_blocks; k++)
            if (m->blocks[k].is_tool)
                m->blocks[k] = kb[n++].b;
        free(kb);
    }
    return DUET_OK;
}

/* ---- rendering ------------------------------------------------------------- */

static void put_str(duet_chat_buf_t *b, str_t s)
{
    duet_chat_buf_put(b, s.p, s.n);
}

static void render_tools(duet_chat_buf_t *b, const json_t *tools)
{
    duet_chat_buf_puts(b, TOOLS_HEAD);
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        if (i)
            duet_chat_buf_putc(b, '\n');
        duet_chat_json_dump(b, json_object_get(tool, "function"), NULL);
    }
    duet_chat_buf_puts(b, TOOLS_TAIL);
}

static void render_param(duet_chat_buf_t *b, const char *key, size_t key_len, int is_str)
{
    duet_chat_buf_puts(b, "<" DUET_CHAT_DSML "parameter name=\"");
    duet_chat_buf_put(b, key, key_len);
    duet_chat_buf_puts(b, is_str ? "\" string=\"true\">" : "\" string=\"false\">");
}

static void render_call(duet_chat_buf_t *b, const call_t *c)
{
    duet_chat_buf_puts(b, "<" DUET_CHAT_DSML "invoke name=\"");
    put_str(b, c->name);
    duet_chat_buf_puts(b, "\">\n");
    if (c->args) {
        const duet_chat_json_t *a = c->args;
        for (size_t i = 0; i < a->n; i++) {
            const duet_chat_json_t *v = a->items[i];
            if (i)
                duet_chat_buf_putc(b, '\n');
            render_param(b, a->keys[i], a->key_lens[i], v->kind == DUET_CHAT_JSON_STRING);
            if (v->kind == DUET_CHAT_JSON_STRING)
                duet_chat_buf_put(b, v->text, v->text_len);
            else
                duet_chat_json_write(b, v);
            duet_chat_buf_puts(b, "</" DUET_CHAT_DSML "parameter>");
        }
    } else {
        const char *key;
        size_t key_len;
        json_t *v;
        int first = 1;
        json_object_keylen_foreach((json_t *)c->args_obj, key, key_len, v) {
            if (!first)
                duet_chat_buf_putc(b, '\n');
            first = 0;
            render_param(b, key, key_len, json_is_string(v));
            if (json_is_string(v))
                duet_chat_buf_put(b, json_string_value(v), json_string_length(v));
            else
                duet_chat_json_dump(b, v, NULL);
            duet_chat_buf_puts(b, "</" DUET_CHAT_DSML "parameter>");
        }
    }
    duet_chat_buf_puts(b, "\n</" DUET_CHAT_DSML "invoke>");
}

static void render_host_sections(duet_chat_buf_t *b, const enc_t *e, const msg_t *m)
{
    if (!m->host)
        return;
    if (e->tools) {
        duet_chat_buf_puts(b, "\n\n");
        render_tools(b, e->tools);
    }
    if (e->response_format) {
        duet_chat_buf_puts(b, "\n\n" RESPONSE_FORMAT_HEAD);
        duet_chat_json_dump(b, e->response_format, NULL);
    }
}

static int is_user_like(role_t r)
{
    return r == ROLE_USER || r == ROLE_DEVELOPER;
}

/* Render turns[kept[0..n)] (the turns left after dropping). */
static void render(duet_chat_buf_t *b, const enc_t *e, const size_t *kept, size_t n,
                   const duet_chat_opts_t *o, int drop, const char *effort_text)
{
    const int thinking = o->thinking;
    size_t last_user = SIZE_MAX; /* none */
    for (size_t k = n; k-- > 0;)
        if (is_user_like(e->turns[kept[k]].role)) {
            last_user = k;
            break;
        }

    for (size_t k = 0; k < n; k++) {
        const msg_t *m = &e->turns[kept[k]];
        if (k == 0 && thinking)
            duet_chat_buf_puts(b, effort_text);

        switch (m->role) {
        case ROLE_SYSTEM:
            put_str(b, m->content);
            render_host_sections(b, e, m);
            break;
        case ROLE_DEVELOPER:
            duet_chat_buf_puts(b, DUET_CHAT_USER);
            put_str(b, m->content);
            render_host_sections(b, e, m);
            break;
        case ROLE_USER:
            duet_chat_buf_puts(b, DUET_CHAT_USER);
            for (size_t i = 0; i < m->n_blocks; i++) {
                if (i)
                    duet_chat_buf_puts(b, "\n\n");
                if (m->blocks[i].is_tool)
                    duet_chat_buf_puts(b, "<tool_result>");
                put_str(b, m->blocks[i].text);
                if (m->blocks[i].is_tool)
                    duet_chat_buf_puts(b, "</tool_result>");
            }
            break;
        case ROLE_REMINDER:
            duet_chat_buf_puts(b, DUET_CHAT_LATEST_REMINDER);
            put_str(b, m->content);
            break;
        case ROLE_ASSISTANT: {
            int prev_task = k > 0 && e->turns[kept[k - 1]].task != DUET_CHAT_TASK_NONE;
            int after_last_user = last_user == SIZE_MAX || k > last_user;
            if (thinking && !prev_task && (!drop || after_last_user)) {
                if (m->reasoning.p)
                    put_str(b, m->reasoning);
                duet_chat_buf_puts(b, DUET_CHAT_THINK_END);
            }
            put_str(b, m->content);
            if (m->n_calls) {
                duet_chat_buf_puts(b, "\n\n<" DUET_CHAT_DSML "tool_calls>\n");
                for (size_t c = 0; c < m->n_calls; c++) {
                    if (c)
                        duet_chat_buf_putc(b, '\n');
                    render_call(b, &m->calls[c]);
                }
                duet_chat_buf_puts(b, "\n</" DUET_CHAT_DSML "tool_calls>");
            }
            if (!m->wo_eos)
                duet_chat_buf_puts(b, DUET_CHAT_EOS);
            break;
        }
        case ROLE_TOOL: /* merged away */
            break;
        }

        /* What follows: nothing unless the next turn is the assistant's (or a
         * reminder) or this is the last one. */
        if (k + 1 < n) {
            role_t next = e->turns[kept[k + 1]].role;
            if (next != ROLE_ASSISTANT && next != ROLE_REMINDER)
                continue;
        }
        if (m->task != DUET_CHAT_TASK_NONE) {
            if (m->task == DUET_CHAT_TASK_ACTION) {
                duet_chat_buf_puts(b, DUET_CHAT_ASSISTANT);
                duet_chat_buf_puts(b, thinking ? DUET_CHAT_THINK_START : DUET_CHAT_THINK_END);
            }
            duet_chat_buf_puts(b, task_tokens[m->task]);
        } else if (is_user_like(m->role)) {
            duet_chat_buf_puts(b, DUET_CHAT_ASSISTANT);
            int open = thinking && (!drop || last_user == SIZE_MAX || k >= last_user);
            duet_chat_buf_puts(b, open ? DUET_CHAT_THINK_START : DUET_CHAT_THINK_END);
        }
    }
}

/* ---- entry ----------------------------------------------------------------- */

static duet_status_t effort_prefix(enc_t *e, const duet_chat_opts_t *o, const char **out)
{
    duet_chat_effort_t eff = o->effort;
    switch (o->effort_profile) {
    case DUET_CHAT_PROFILE_PREVIEW:
        if (eff == DUET_CHAT_EFFORT_LOW)
            return bad(e, DUET_ERR_INVALID,
                       "reasoning effort \"low\" is not known to the preview profile (high, max)");
        *out = eff == DUET_CHAT_EFFORT_MAX ? effort_text_high : "";
        return DUET_OK;
    case DUET_CHAT_PROFILE_OFFICIAL:
        *out = eff == DUET_CHAT_EFFORT_MAX    ? effort_text_official_max
               : eff == DUET_CHAT_EFFORT_HIGH ? effort_text_high
                                              : "";
        return DUET_OK;
    }
    return bad(e, DUET_ERR_INVALID, "unknown reasoning effort profile %d", (int)o->effort_profile);
}

static void enc_fini(enc_t *e)
{
    for (size_t i = 0; i < e->n_in; i++) {
        for (size_t c = 0; c < e->in[i].n_calls; c++)
            duet_chat_json_free(&e->in[i].calls[c].args);
        free(e->in[i].calls);
    }
    for (size_t i = 0; i < e->n_turns; i++)
        free(e->turns[i].blocks);
    for (size_t i = 0; i < e->n_owned; i++)
        free(e->owned[i]);
    free(e->owned);
    free(e->in);
    free(e->turns);
}

static duet_status_t encode(enc_t *e, const json_t *messages, const json_t *tools,
                            const duet_chat_opts_t *o, duet_chat_buf_t *b)
{
    const char *effort_text = "";
    duet_status_t st = effort_prefix(e, o, &effort_text);
    if (st != DUET_OK)
        return st;
    if ((unsigned)o->task > DUET_CHAT_TASK_READ_URL)
        return bad(e, DUET_ERR_INVALID, "unknown task %d", (int)o->task);
    if (!json_is_array(messages))
        return bad(e, DUET_ERR_INVALID, "messages must be an array");
    size_t n = json_array_size(messages);
    if (n == 0)
        return bad(e, DUET_ERR_INVALID, "messages must not be empty");

    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return bad(e, DUET_ERR_INVALID, "tools must be an array, not %s", type_name(tools));
        size_t i;
        json_t *tool;
        json_array_foreach(tools, i, tool) {
            if (!json_is_object(tool))
                return bad(e, DUET_ERR_INVALID, "tools[%zu] must be an object", i);
            const json_t *type = json_object_get(tool, "type");
            if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0))
                return bad(e, DUET_ERR_INVALID, "tools[%zu].type must be \"function\"", i);
            const json_t *fn = json_object_get(tool, "function");
            if (!json_is_object(fn))
                return bad(e, DUET_ERR_INVALID, "tools[%zu].function must be an object", i);
            const json_t *name = json_object_get(fn, "name");
            if (!json_is_string(name) || json_string_length(name) == 0)
                return bad(e, DUET_ERR_INVALID,
                           "tools[%zu].function.name must be a non-empty string", i);
        }
        if (json_array_size(tools))
            e->tools = tools;
    }
    if (truthy(o->response_format))
        e->response_format = o->response_format;

    e->in = duet_calloc(n + 1, sizeof *e->in);
    if (!e->in)
        return nomem(e);
    size_t first = 0;
    if (e->tools || e->response_format) {
        /* The tools live in the first message; a system message with no
         * text is added in front when the first message is not one. */
        const json_t *m0 = json_array_get(messages, 0);
        const json_t *r0 = json_is_object(m0) ? json_object_get(m0, "role") : NULL;
        if (!json_is_string(r0) || strcmp(json_string_value(r0), "system") != 0) {
            e->in[0] = (msg_t){.role = ROLE_SYSTEM, .src = SIZE_MAX, .content = {"", 0}};
            first = 1;
        }
    }
    e->n_in = first;
    for (size_t i = 0; i < n; i++) {
        st = read_message(e, i, json_array_get(messages, i), &e->in[e->n_in]);
        e->n_in++; /* counted even on failure, so enc_fini frees its calls */
        if (st != DUET_OK)
            return st;
    }
    if (e->tools || e->response_format)
        e->in[0].host = 1;
    const msg_t *answered = NULL;
    for (size_t i = 0; i < e->n_in; i++) {
        if (e->in[i].role != ROLE_TOOL)
            answered = &e->in[i];
        else if ((st = check_tool_message(e, i, answered)) != DUET_OK)
            return st;
    }

    if (o->task != DUET_CHAT_TASK_NONE) {
        size_t i = e->n_in;
        while (i > 0 && !is_user_like(e->in[i - 1].role))
            i--;
        if (i == 0)
            return bad(e, DUET_ERR_INVALID,
                       "task \"%s\" needs a user or developer message", task_names[o->task]);
        e->in[i - 1].task = o->task;
    }
    if (o->continue_final) {
        msg_t *last = &e->in[e->n_in - 1];
        if (last->role != ROLE_ASSISTANT)
            return bad(e, DUET_ERR_INVALID,
                       "continue_final needs an assistant message last, but messages[%zu] is %s",
                       last->src, role_names[last->role]);
        last->wo_eos = 1;
    }

    if ((st = merge(e)) != DUET_OK || (st = sort_tool_results(e)) != DUET_OK)
        return st;

    /* Earlier reasoning is dropped in thinking mode unless asked to keep it
     * or tools are defined. */
    int drop = !o->keep_reasoning && !e->tools;
    size_t *kept = duet_calloc(e->n_turns, sizeof *kept);
    if (!kept)
        return nomem(e);
    size_t n_kept = 0;
    if (o->thinking && drop) {
        size_t last_user = SIZE_MAX;
        for (size_t t = e->n_turns; t-- > 0;)
            if (is_user_like(e->turns[t].role)) {
                last_user = t;
                break;
            }
        for (size_t t = 0; t < e->n_turns; t++) {
            msg_t *m = &e->turns[t];
            if (last_user != SIZE_MAX && t < last_user) {
                if (m->role == ROLE_DEVELOPER)
                    continue;
                if (m->role == ROLE_ASSISTANT)
                    m->reasoning = (str_t){NULL, 0};
            }
            kept[n_kept++] = t;
        }
    } else {
        for (size_t t = 0; t < e->n_turns; t++)
            kept[n_kept++] = t;
    }

    if (!o->no_bos)
        duet_chat_buf_puts(b, DUET_CHAT_BOS);
    render(b, e, kept, n_kept, o, drop, effort_text);
    free(kept);
    if (b->failed)
        return nomem(e);
    return DUET_OK;
}

duet_status_t duet_chat_encode(const json_t *messages, const json_t *tools,
                               const duet_chat_opts_t *opts, char **out, size_t *out_len,
                               duet_err_t *err)
{
    static const duet_chat_opts_t defaults = {0};
    enc_t e = {.err = err};
    duet_chat_buf_t b = {0};
    duet_status_t st = encode(&e, messages, tools, opts ? opts : &defaults, &b);
    enc_fini(&e);
    if (st != DUET_OK) {
        duet_chat_buf_fini(&b);
        return st;
    }
    if (!b.p) { /* everything was empty and BOS was left out */
        b.p = malloc(1);
        if (!b.p)
            return duet_err_set(err, DUET_ERR_NOMEM, "out of memory encoding the chat");
        b.p[0] = '\0';
    }
    *out = b.p;
    if (out_len)
        *out_len = b.len;
    return DUET_OK;
}

duet_status_t duet_chat_effort_parse(const char *s, duet_chat_effort_t *out, duet_err_t *err)
{
    if (!s)
        *out = DUET_CHAT_EFFORT_DEFAULT;
    else if (strcmp(s, "low") == 0)
        *out = DUET_CHAT_EFFORT_LOW;
    else if (strcmp(s, "high") == 0)
        *out = DUET_CHAT_EFFORT_HIGH;
    else if (strcmp(s, "max") == 0)
        *out = DUET_CHAT_EFFORT_MAX;
    else
        return duet_err_set(err, DUET_ERR_INVALID,
                            "reasoning effort \"%.64s\" is unknown (low, high or max)", s);
    return DUET_OK;
}

duet_status_t duet_chat_task_parse(const char *s, duet_chat_task_t *out, duet_err_t *err)
{
    for (int t = DUET_CHAT_TASK_ACTION; t <= DUET_CHAT_TASK_READ_URL; t++)
        if (s && strcmp(s, task_names[t]) == 0) {
            *out = (duet_chat_task_t)t;
            return DUET_OK;
        }
    return duet_err_set(err, DUET_ERR_INVALID,
                        "task \"%.64s\" is unknown (action, query, authority, domain, title or "
                        "read_url)",
                        s ? s : "(null)");
}
