/* Fuzz target: the DSML parser.  The first byte picks thinking mode (bit 0)
 * and where to split the rest (the text) into two pieces; the text is parsed
 * in one piece, in those two pieces and, for short inputs, one byte at a time,
 * and the event transcripts (adjacent text events joined) must be equal.
 * Every reported call must have JSON-object arguments and a well-formed id,
 * at most one error may be reported, and a call written back to DSML by the
 * encoder must parse back to the same call. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *tools_text =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"},"
    " \"unit\": {\"type\": [\"string\", \"null\"]}}, \"required\": [\"city\"], \"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"echo\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, \"n\": {\"type\": \"number\"},"
    " \"b\": {\"type\": \"boolean\"}, \"a\": {\"type\": \"array\"}, \"o\": {\"type\": \"object\"}}}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";

typedef struct {
    char *s;
    size_t len, cap;
    int last, calls, errors;
    int check_calls;
    const duet_dsml_opts_t *opts;
} tr_t;

static void tr_add(tr_t *t, const char *p, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        if (!(t->s = realloc(t->s, t->cap)))
            abort();
    }
    memcpy(t->s + t->len, p, n);
    t->len += n;
    t->s[t->len] = '\0';
}

static void tr_str(tr_t *t, const char *p) { tr_add(t, p, strlen(p)); }

static void parse(tr_t *t, const char *text, size_t len, const size_t *cuts, size_t ncuts,
                  const duet_dsml_opts_t *o, int check_calls);

/* Encode the call, parse it back: the same call must come out. */
static void check_reencode(const duet_dsml_event_t *ev, const duet_dsml_opts_t *o)
{
    duet_dsml_call_t call = {ev->name, ev->arguments};
    char *block = NULL;
    size_t blen;
    duet_status_t st = duet_dsml_encode_calls(&call, 1, &block, &blen, NULL);
    if (st == DUET_ERR_INVALID)
        return; /* e.g. a JSON-body key holding '"': not expressible as DSML */
    if (st != DUET_OK)
        abort();
    tr_t back = {0};
    duet_dsml_opts_t plain = *o;
    plain.thinking = 0;
    plain.max_block_bytes = 0;
    parse(&back, block, blen, NULL, 0, &plain, 0);
    tr_t want = {0};
    tr_str(&want, "\n[call 0 ");
    tr_str(&want, ev->name);
    tr_str(&want, " ");
    tr_str(&want, ev->arguments);
    tr_str(&want, "]");
    if (back.calls != 1 || back.errors || strcmp(back.s, want.s) != 0)
        abort();
    free(want.s);
    free(back.s);
    free(block);
}

static void on_event(void *arg, const duet_dsml_event_t *ev)
{
    tr_t *t = arg;
    char head[160];
    switch (ev->kind) {
    case DUET_DSML_EV_CONTENT:
    case DUET_DSML_EV_REASONING:
        if (ev->len == 0 || t->errors > 1)
            abort();
        if (t->last != (int)ev->kind)
            tr_str(t, ev->kind == DUET_DSML_EV_CONTENT ? "\n[content]" : "\n[reasoning]");
        tr_add(t, ev->text, ev->len);
        break;
    case DUET_DSML_EV_TOOL_CALL: {
        if (t->errors || ev->index != t->calls || strlen(ev->id) != 29 || memcmp(ev->id, "call_", 5) != 0)
            abort();
        /* a reported call always has object arguments, in canonical form */
        char *canon = NULL;
        size_t alen = strlen(ev->arguments);
        if (ev->arguments[0] != '{' ||
            duet_dsml_json_canonical(ev->arguments, alen, &canon, NULL, NULL) != DUET_OK ||
            strcmp(canon, ev->arguments) != 0)
            abort();
        free(canon);
        /* and a JSON library agrees (it takes no NUL in keys) */
        if (!strstr(ev->arguments, "\\u0000")) {
            json_error_t je;
            json_t *a = json_loads(ev->arguments, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
            if (!json_is_object(a))
                abort();
            json_decref(a);
        }
        tr_str(t, "\n[call ");
        snprintf(head, sizeof head, "%d ", ev->index);
        tr_str(t, head);
        tr_str(t, ev->name);
        tr_str(t, " ");
        tr_str(t, ev->arguments);
        tr_str(t, "]");
        t->calls++;
        if (t->check_calls)
            check_reencode(ev, t->opts);
        break;
    }
    case DUET_DSML_EV_ERROR:
        if (t->errors || ev->code <= DUET_DSML_OK || ev->code >= DUET_DSML_CODE_COUNT || !ev->message)
            abort();
        t->errors++;
        snprintf(head, sizeof head, "\n[error %s]", duet_dsml_code_str(ev->code));
        tr_str(t, head);
        tr_str(t, ev->message);
        tr_str(t, "\n[raw]");
        tr_add(t, ev->text, ev->len);
        break;
    }
    t->last = (int)ev->kind;
}

static void parse(tr_t *t, const char *text, size_t len, const size_t *cuts, size_t ncuts,
                  const duet_dsml_opts_t *o, int check_calls)
{
    duet_dsml_parser_t *p = NULL;
    memset(t, 0, sizeof *t);
    t->last = -1;
    t->check_calls = check_calls;
    t->opts = o;
    tr_str(t, "");
    if (duet_dsml_parser_create(o, on_event, t, &p) != DUET_OK)
        abort();
    size_t at = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        if (duet_dsml_parser_feed(p, text + at, end - at) != DUET_OK)
            abort();
        at = end;
    }
    if (duet_dsml_parser_finish(p) != DUET_OK)
        abort();
    if (duet_dsml_parser_calls(p) != t->calls || (duet_dsml_parser_error(p) != DUET_DSML_OK) != t->errors)
        abort();
    duet_dsml_parser_destroy(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *tools;
    if (!tools) {
        json_error_t je;
        if (!(tools = json_loads(tools_text, 0, &je)))
            abort();
    }
    if (size < 1)
        return 0;
    duet_dsml_opts_t o = {.thinking = data[0] & 1, .tools = tools, .id_seed = data[0]};
    if (data[0] & 2)
        o.max_block_bytes = 256; /* exercise the size limit */
    size_t len = size - 1;
    /* exact-size copy so that sanitizers see reads past the text */
    char *text = malloc(len ? len : 1);
    if (!text)
        return 0;
    memcpy(text, data + 1, len);
    size_t cut = len * (data[0] >> 2) / 63;
    tr_t one, two;
    parse(&one, text, len, NULL, 0, &o, 1);
    parse(&two, text, len, &cut, 1, &o, 0);
    if (strcmp(one.s, two.s) != 0)
        abort();
    if (len <= 512) {
        size_t *cuts = malloc((len + 1) * sizeof *cuts);
        if (cuts) {
            for (size_t k = 0; k + 1 < len; k++)
                cuts[k] = k + 1;
            tr_t bytes;
            parse(&bytes, text, len, cuts, len > 1 ? len - 1 : 0, &o, 0);
            if (strcmp(one.s, bytes.s) != 0)
                abort();
            free(bytes.s);
            free(cuts);
        }
    }
    free(one.s);
    free(two.s);
    free(text);
    return 0;
}
