/* DSML parser and encoder: round trips for every JSON type, streamed ==
 * one-shot for every split point, the malformed corpus
 * (tests/text/golden/dsml-malformed.jsonl, path in argv[1]) with its error
 * codes, content/reasoning/tool-call interleavings, hold-back, ids, schema
 * checks and strict JSON. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsml.h"

#define D "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
#define O "<" D
#define C "</" D

static const char *corpus_path;

/* ------------------------------------------------------------ recording */

/* Events in normal form: adjacent text events of one kind are joined; each
 * item starts with a header line. */
typedef struct {
    char *s;
    size_t len, cap;
    int last;              /* kind of the last item, -1 at start */
    int calls, errors;
    duet_dsml_code_t code;
    char *content;         /* all content joined */
    size_t content_len, content_cap;
    size_t content_at_error;
    char *raw;             /* raw text of the error */
    size_t raw_len;
    char args[8][512];
    char names[8][64];
    char ids[8][32];
} rec_t;

static void add(char **s, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *s = realloc(*s, *cap);
        assert_non_null(*s);
    }
    memcpy(*s + *len, p, n);
    *len += n;
    (*s)[*len] = '\0';
}

static void rec_add(rec_t *r, const char *p, size_t n) { add(&r->s, &r->len, &r->cap, p, n); }
static void rec_str(rec_t *r, const char *p) { rec_add(r, p, strlen(p)); }

static void on_event(void *arg, const duet_dsml_event_t *ev)
{
    rec_t *r = arg;
    char line[1200];
    switch (ev->kind) {
    case DUET_DSML_EV_CONTENT:
    case DUET_DSML_EV_REASONING:
        assert_true(ev->len > 0);
        if (r->last != (int)ev->kind)
            rec_str(r, ev->kind == DUET_DSML_EV_CONTENT ? "\n[content]" : "\n[reasoning]");
        rec_add(r, ev->text, ev->len);
        if (ev->kind == DUET_DSML_EV_CONTENT)
            add(&r->content, &r->content_len, &r->content_cap, ev->text, ev->len);
        break;
    case DUET_DSML_EV_TOOL_CALL:
        assert_int_equal(ev->index, r->calls);
        snprintf(line, sizeof line, "\n[call %d %s %s %s]", ev->index, ev->id, ev->name, ev->arguments);
        rec_str(r, line);
        if (r->calls < 8) {
            snprintf(r->args[r->calls], sizeof r->args[0], "%s", ev->arguments);
            snprintf(r->names[r->calls], sizeof r->names[0], "%s", ev->name);
            snprintf(r->ids[r->calls], sizeof r->ids[0], "%s", ev->id);
        }
        r->calls++;
        break;
    case DUET_DSML_EV_ERROR:
        assert_int_equal(r->errors, 0);
        assert_true(ev->code > DUET_DSML_OK && ev->code < DUET_DSML_CODE_COUNT);
        assert_non_null(ev->message);
        assert_true(strlen(ev->message) > 0);
        snprintf(line, sizeof line, "\n[error %s: %s]\n[raw]", duet_dsml_code_str(ev->code), ev->message);
        rec_str(r, line);
        rec_add(r, ev->text, ev->len);
        r->raw = malloc(ev->len + 1);
        assert_non_null(r->raw);
        memcpy(r->raw, ev->text, ev->len);
        r->raw[ev->len] = '\0';
        r->raw_len = ev->len;
        r->content_at_error = r->content_len;
        r->errors++;
        r->code = ev->code;
        break;
    }
    r->last = (int)ev->kind;
}

static void rec_init(rec_t *r)
{
    memset(r, 0, sizeof *r);
    r->last = -1;
    rec_str(r, "");
    add(&r->content, &r->content_len, &r->content_cap, "", 0);
}

static void rec_fini(rec_t *r)
{
    free(r->s);
    free(r->content);
    free(r->raw);
}

/* Parse text cut at the given offsets (ascending). */
static void parse_cuts(rec_t *r, const char *text, size_t len, const size_t *cuts, size_t ncuts,
                       const duet_dsml_opts_t *o)
{
    duet_dsml_parser_t *p = NULL;
    rec_init(r);
    assert_int_equal(duet_dsml_parser_create(o, on_event, r, &p), DUET_OK);
    size_t at = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        assert_int_equal(duet_dsml_parser_feed(p, text + at, end - at), DUET_OK);
        at = end;
    }
    assert_int_equal(duet_dsml_parser_finish(p), DUET_OK);
    assert_int_equal(duet_dsml_parser_feed(p, "x", 1), DUET_ERR_STATE);
    assert_int_equal(duet_dsml_parser_calls(p), r->calls);
    assert_int_equal(duet_dsml_parser_error(p), r->errors ? r->code : DUET_DSML_OK);
    duet_dsml_parser_destroy(&p);
    assert_null(p);
}

static void parse_once(rec_t *r, const char *text, const duet_dsml_opts_t *o)
{
    parse_cuts(r, text, strlen(text), NULL, 0, o);
}

static void expect_same(const rec_t *ref, const rec_t *got, const char *text, const char *how)
{
    if (strcmp(ref->s, got->s) != 0) {
        fprintf(stderr, "streamed != one-shot (%s)\ninput: %s\none-shot:%s\nstreamed:%s\n", how, text, ref->s, got->s);
        fail();
    }
}

/* Every two-piece split, 1-byte pieces, and a few random multi-piece splits. */
static void check_streaming(const char *text, const duet_dsml_opts_t *o)
{
    size_t len = strlen(text);
    rec_t ref, got;
    parse_once(&ref, text, o);
    for (size_t cut = 0; cut <= len; cut++) {
        parse_cuts(&got, text, len, &cut, 1, o);
        char how[32];
        snprintf(how, sizeof how, "split at %zu", cut);
        expect_same(&ref, &got, text, how);
        rec_fini(&got);
    }
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    assert_non_null(cuts);
    for (size_t k = 0; k < len; k++)
        cuts[k] = k + 1;
    parse_cuts(&got, text, len, cuts, len ? len - 1 : 0, o);
    expect_same(&ref, &got, text, "1-byte pieces");
    rec_fini(&got);
    uint64_t s = 0x1234567 + len;
    for (int trial = 0; trial < 8 && len > 2; trial++) {
        size_t n = 0, at = 0;
        for (;;) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            at += 1 + (size_t)(s >> 33) % 7;
            if (at >= len)
                break;
            cuts[n++] = at;
        }
        parse_cuts(&got, text, len, cuts, n, o);
        expect_same(&ref, &got, text, "random pieces");
        rec_fini(&got);
    }
    free(cuts);
    rec_fini(&ref);
}

/* ------------------------------------------------------------ fixtures */

static const char *tools_json =
    "["
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"},"
    " \"unit\": {\"type\": [\"string\", \"null\"]}}, \"required\": [\"city\"], \"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"echo\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, \"n\": {\"type\": \"number\"},"
    " \"b\": {\"type\": \"boolean\"}, \"z\": {\"type\": \"null\"}, \"a\": {\"type\": \"array\"},"
    " \"o\": {\"type\": \"object\"}}}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"noargs\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {}}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"free\"}}"
    "]";

typedef struct {
    json_t *tools;
    duet_dsml_opts_t opts;
} fx_t;

static int fx_setup(void **state)
{
    fx_t *fx = calloc(1, sizeof *fx);
    json_error_t je;
    if (!fx || !(fx->tools = json_loads(tools_json, 0, &je)))
        return -1;
    fx->opts.tools = fx->tools;
    fx->opts.id_seed = 42;
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *fx = *state;
    json_decref(fx->tools);
    free(fx);
    return 0;
}

/* ------------------------------------------------------------ tests */

static void test_code_table(void **state)
{
    (void)state;
    for (int c = 0; c < DUET_DSML_CODE_COUNT; c++) {
        const char *s = duet_dsml_code_str((duet_dsml_code_t)c);
        assert_true(strlen(s) > 0);
        assert_true(strlen(duet_dsml_code_message((duet_dsml_code_t)c)) > 0);
        assert_int_equal(duet_dsml_code_parse(s), c);
        if (c)
            assert_memory_equal(s, "DSML_", 5);
        for (int d = 0; d < c; d++)
            assert_string_not_equal(s, duet_dsml_code_str((duet_dsml_code_t)d));
    }
    assert_string_equal(duet_dsml_code_str(DUET_DSML_CODE_COUNT), "UNKNOWN");
    assert_string_equal(duet_dsml_code_str(DUET_DSML_BAD_JSON), "DSML_BAD_JSON");
    assert_int_equal(duet_dsml_code_parse("DSML_NOPE"), -1);
}

/* Encode calls, put them after content, parse back. */
static void round_trip(fx_t *fx, const duet_dsml_call_t *calls, size_t n)
{
    char *block = NULL, *text;
    size_t blen;
    duet_err_t err = {0};
    assert_int_equal(duet_dsml_encode_calls(calls, n, &block, &blen, &err), DUET_OK);
    assert_int_equal(strlen(block), blen);
    assert_memory_equal(block, O "tool_calls>\n", strlen(O "tool_calls>\n"));
    text = malloc(blen + 64);
    assert_non_null(text);
    snprintf(text, blen + 64, "Let me check.\n\n%s", block);
    rec_t r;
    parse_once(&r, text, &fx->opts);
    if (r.errors)
        fprintf(stderr, "%s\n", r.s);
    assert_int_equal(r.errors, 0);
    assert_int_equal(r.calls, (int)n);
    assert_string_equal(r.content, "Let me check.");
    for (size_t k = 0; k < n; k++) {
        char *canon = NULL;
        assert_int_equal(duet_dsml_json_canonical(calls[k].arguments, strlen(calls[k].arguments), &canon, NULL, &err),
                         DUET_OK);
        assert_string_equal(r.args[k], canon);
        assert_string_equal(r.names[k], calls[k].name);
        free(canon);
    }
    rec_fini(&r);
    check_streaming(text, &fx->opts);
    free(text);
    free(block);
}

static void test_round_trip_types(void **state)
{
    fx_t *fx = *state;
    static const char *const args[] = {
        "{\"s\": \"plain text\"}",
        "{\"s\": \"\"}",
        "{\"s\": \"quotes \\\" and backslash \\\\ and slash /\"}",
        "{\"s\": \"line1\\nline2\\r\\n\\ttabbed\\b\\f\"}",
        "{\"s\": \"control \\u0001\\u001f and del \x7f\"}",
        "{\"s\": \"non-ASCII: caf\xc3\xa9, \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e, \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82\"}",
        "{\"s\": \"emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd and flag \xf0\x9f\x87\xab\xf0\x9f\x87\xb7\"}",
        "{\"s\": \"  padded with spaces  \"}",
        "{\"s\": \"\\n\\nleading newlines\"}",
        "{\"s\": \"{\\\"looks\\\": \\\"like json\\\"}\"}",
        "{\"s\": \"123\"}",
        "{\"s\": \"a </think> and <think> inside\"}",
        "{\"s\": \"html <b>bold</b> & <parameter>\"}",
        "{\"i\": 42}",
        "{\"i\": -17}",
        "{\"i\": 0}",
        "{\"i\": 12345678901234567890123}",
        "{\"i\": 1.0}",
        "{\"i\": 1e3}",
        "{\"i\": 2.50E+1}",
        "{\"n\": 3.14159}",
        "{\"n\": -0.5}",
        "{\"n\": 6.02e23}",
        "{\"n\": 2.5E-3}",
        "{\"n\": -1e-7}",
        "{\"b\": true}",
        "{\"b\": false}",
        "{\"z\": null}",
        "{\"a\": []}",
        "{\"a\": [1, \"two\", [3], {\"four\": 4.0}, null, true]}",
        "{\"a\": [\"\xf0\x9f\x98\x80\", \"\\\"q\\\"\", \"x\\ny\"]}",
        "{\"o\": {}}",
        "{\"o\": {\"a\": {\"b\": [1, 2, {\"c\": null}]}, \"d\": \"e\", \"f\": false}}",
        "{\"s\": \"all\", \"i\": 1, \"n\": 1.5, \"b\": false, \"z\": null, \"a\": [1], \"o\": {\"k\": \"v\"}}",
    };
    for (size_t k = 0; k < sizeof args / sizeof args[0]; k++) {
        duet_dsml_call_t c = {"echo", args[k]};
        round_trip(fx, &c, 1);
    }
    duet_dsml_call_t several[] = {
        {"get_weather", "{\"city\": \"Paris\", \"days\": 3}"},
        {"noargs", "{}"},
        {"get_weather", "{\"city\": \"S\xc3\xa3o Paulo\", \"unit\": null}"},
        {"free", "{\"anything\": [1, {\"x\": \"y\"}]}"},
    };
    round_trip(fx, several, 4);
}

/* The official form: `string="true"` raw, others JSON with ", " and ": ". */
static void test_encode_exact(void **state)
{
    (void)state;
    duet_dsml_call_t c[] = {{"get_weather", "{\"city\":\"Paris\",\"days\":3,\"tags\":[1,\"a\"]}"}, {"noargs", "{}"}};
    char *out = NULL;
    duet_err_t err = {0};
    assert_int_equal(duet_dsml_encode_calls(c, 2, &out, NULL, &err), DUET_OK);
    assert_string_equal(out, O "tool_calls>\n" O "invoke name=\"get_weather\">\n" O
                             "parameter name=\"city\" string=\"true\">Paris" C "parameter>\n" O
                             "parameter name=\"days\" string=\"false\">3" C "parameter>\n" O
                             "parameter name=\"tags\" string=\"false\">[1, \"a\"]" C "parameter>\n" C "invoke>\n" O
                             "invoke name=\"noargs\">\n\n" C "invoke>\n" C "tool_calls>");
    free(out);
    /* What cannot be written as DSML is refused. */
    static const duet_dsml_call_t bad[] = {
        {"bad\"name", "{}"},
        {"", "{}"},
        {"x", "[1]"},
        {"x", "{\"a\": 1,}"},
        {"x", "{\"a\": \"" C "parameter>\"}"},
        {"x", "{\"a\": [\"" O "invoke\"]}"},
        {"x", "{\"we\\\"ird\": 1}"},
        {"x", "{\"\": 1}"},
        {"x", "{\"a\\tb\": 1}"},
        {"x", "{\"a\\u0000b\": 1}"},
        {"x", "{\"a>b\": 1}"},
        {"tab\tname", "{}"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        out = NULL;
        duet_err_clear(&err);
        assert_int_equal(duet_dsml_encode_calls(&bad[k], 1, &out, NULL, &err), DUET_ERR_INVALID);
        assert_null(out);
        assert_true(strlen(err.msg) > 0);
    }
}

static void test_json_canonical(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"{\"a\":1,\"b\":[true,null],\"c\":\"\\u00e9\\/\"}", "{\"a\": 1, \"b\": [true, null], \"c\": \"\xc3\xa9/\"}"},
        {"  [ ]  ", "[]"},
        {"\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80\""},
        {"\"\\u0000\\u001F\\u007f\"", "\"\\u0000\\u001f\x7f\""},
        {"{\"a\" :\n{ } }", "{\"a\": {}}"},
        {"-0.0e-0", "-0.0e-0"},
        {"{\"\\u0061\": 1, \"b\": 2}", "{\"a\": 1, \"b\": 2}"},
    };
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        char *out = NULL;
        size_t len = 0;
        assert_int_equal(duet_dsml_json_canonical(pairs[k][0], strlen(pairs[k][0]), &out, &len, NULL), DUET_OK);
        assert_string_equal(out, pairs[k][1]);
        assert_int_equal(len, strlen(pairs[k][1]));
        free(out);
    }
    static const char *const bad[] = {
        "", "{", "{\"a\": 1, \"a\": 2}", "{\"a\": 1, \"\\u0061\": 2}", "[1,]", "01", "1.", ".5", "+1", "1e",
        "NaN", "Infinity", "'a'", "\"\\ud800\"", "\"\\udc00\"", "\"\\x\"", "\"a\nb\"", "\"\xff\"", "\"\xc0\x80\"",
        "[1] x", "{\"a\" 1}", "{1: 2}", "tru", "nul", "[\"a\"\"b\"]",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *out = NULL;
        duet_err_t err = {0};
        assert_int_equal(duet_dsml_json_canonical(bad[k], strlen(bad[k]), &out, NULL, &err), DUET_ERR_PARSE);
        assert_null(out);
    }
    /* Nesting is bounded. */
    char deep[600];
    memset(deep, '[', 300);
    memset(deep + 300, ']', 300);
    deep[599] = '\0';
    char *out = NULL;
    assert_int_equal(duet_dsml_json_canonical(deep, 598, &out, NULL, NULL), DUET_ERR_PARSE);
    assert_int_equal(duet_dsml_json_canonical(deep + 200, 200, &out, NULL, NULL), DUET_OK);
    free(out);
}

static void test_interleavings(void **state)
{
    fx_t *fx = *state;
    const char *call = O "tool_calls>\n" O "invoke name=\"get_weather\">\n" O
                       "parameter name=\"city\" string=\"true\">Paris" C "parameter>\n" C "invoke>\n" C "tool_calls>";
    char text[2048];
    rec_t r;
    duet_dsml_opts_t think = fx->opts;
    think.thinking = 1;

    /* content only, with look-alikes of tags that are not tags */
    const char *plain = "a < b, <｜User｜> is not markup, <think> neither, ｜DSML｜ alone neither, <｜DS end";
    parse_once(&r, plain, &fx->opts);
    assert_string_equal(r.content, plain);
    assert_int_equal(r.calls + r.errors, 0);
    rec_fini(&r);
    check_streaming(plain, &fx->opts);

    /* content, block, trailing whitespace dropped */
    snprintf(text, sizeof text, "It is sunny?\n\n%s\n\n  ", call);
    parse_once(&r, text, &fx->opts);
    assert_string_equal(r.content, "It is sunny?");
    assert_int_equal(r.calls, 1);
    assert_string_equal(r.args[0], "{\"city\": \"Paris\"}");
    rec_fini(&r);
    check_streaming(text, &fx->opts);

    /* block only (no content), one newline before it is kept as content */
    snprintf(text, sizeof text, "%s", call);
    parse_once(&r, text, &fx->opts);
    assert_string_equal(r.content, "");
    assert_int_equal(r.calls, 1);
    rec_fini(&r);
    snprintf(text, sizeof text, "x\n\n\n%s", call);
    parse_once(&r, text, &fx->opts);
    assert_string_equal(r.content, "x\n");
    rec_fini(&r);

    /* text after a block is content; two blocks */
    snprintf(text, sizeof text, "A\n\n%s\nB\n\n%s", call, call);
    parse_once(&r, text, &fx->opts);
    assert_string_equal(r.content, "A\nB");
    assert_int_equal(r.calls, 2);
    assert_string_not_equal(r.ids[0], r.ids[1]);
    rec_fini(&r);
    check_streaming(text, &fx->opts);

    /* thinking: reasoning, content, block */
    snprintf(text, sizeof text, "I need the weather.\nCall the tool.</think>Checking.\n\n%s", call);
    parse_once(&r, text, &think);
    assert_string_equal(r.content, "Checking.");
    assert_int_equal(r.calls, 1);
    assert_non_null(strstr(r.s, "[reasoning]I need the weather.\nCall the tool.\n[content]Checking.\n[call 0"));
    rec_fini(&r);
    check_streaming(text, &think);

    /* thinking: reasoning straight into the block */
    snprintf(text, sizeof text, "short</think>\n\n%s", call);
    parse_once(&r, text, &think);
    assert_string_equal(r.content, "");
    assert_int_equal(r.calls, 1);
    rec_fini(&r);
    check_streaming(text, &think);

    /* thinking with no </think> (length cut): all reasoning, no error */
    parse_once(&r, "still thinking </thi", &think);
    assert_string_equal(r.s, "\n[reasoning]still thinking </thi");
    rec_fini(&r);
    check_streaming("still thinking </thi", &think);

    /* thinking off: </think> is plain content; thinking on: a second one too */
    parse_once(&r, "a</think>b", &fx->opts);
    assert_string_equal(r.content, "a</think>b");
    rec_fini(&r);
    parse_once(&r, "a</think>b</think>c", &think);
    assert_string_equal(r.s, "\n[reasoning]a\n[content]b</think>c");
    rec_fini(&r);
    check_streaming("a</think>b</think>c", &think);

    /* empty reasoning */
    parse_once(&r, "</think>hi", &think);
    assert_string_equal(r.s, "\n[content]hi");
    rec_fini(&r);

    /* direct JSON argument body */
    snprintf(text, sizeof text, O "tool_calls>\n" O "invoke name=\"get_weather\">\n{\"city\":\"Oslo\",\"days\":2}\n" C
                                  "invoke>\n" C "tool_calls>");
    parse_once(&r, text, &fx->opts);
    assert_int_equal(r.errors, 0);
    assert_string_equal(r.args[0], "{\"city\": \"Oslo\", \"days\": 2}");
    rec_fini(&r);
    check_streaming(text, &fx->opts);

    /* loose whitespace and attribute order */
    snprintf(text, sizeof text, O "tool_calls>" O "invoke  name=\"get_weather\" >\t" O
                                  "parameter string=\"false\"  name=\"days\">\n 7 \n" C "parameter>" O
                                  "parameter name=\"city\" string=\"true\">\n Rome \n" C "parameter>" C "invoke>"
                                  "\r\n" C "tool_calls>");
    parse_once(&r, text, &fx->opts);
    assert_int_equal(r.errors, 0);
    assert_string_equal(r.args[0], "{\"days\": 7, \"city\": \"\\n Rome \\n\"}");
    rec_fini(&r);
    check_streaming(text, &fx->opts);
}

static void test_holdback(void **state)
{
    fx_t *fx = *state;
    duet_dsml_parser_t *p = NULL;
    rec_t r;
    rec_init(&r);
    assert_int_equal(duet_dsml_parser_create(&fx->opts, on_event, &r, &p), DUET_OK);
    assert_int_equal(duet_dsml_parser_feed(p, "Hello <", 7), DUET_OK);
    assert_string_equal(r.content, "Hello ");
    assert_int_equal(duet_dsml_parser_feed(p, "\xef\xbd", 2), DUET_OK);
    assert_string_equal(r.content, "Hello ");
    assert_int_equal(duet_dsml_parser_feed(p, "\x9c" "DS", 3), DUET_OK);
    assert_string_equal(r.content, "Hello ");
    assert_int_equal(duet_dsml_parser_feed(p, "X", 1), DUET_OK); /* not a tag after all */
    assert_string_equal(r.content, "Hello <\xef\xbd\x9c" "DSX");
    assert_int_equal(duet_dsml_parser_feed(p, " ok\n", 4), DUET_OK);
    assert_string_equal(r.content, "Hello <\xef\xbd\x9c" "DSX ok");
    assert_int_equal(duet_dsml_parser_feed(p, "\n", 1), DUET_OK);
    assert_string_equal(r.content, "Hello <\xef\xbd\x9c" "DSX ok");
    assert_int_equal(duet_dsml_parser_feed(p, "<", 1), DUET_OK);
    assert_int_equal(duet_dsml_parser_feed(p, "x", 1), DUET_OK);
    assert_string_equal(r.content, "Hello <\xef\xbd\x9c" "DSX ok\n\n<x");
    /* a call is reported only at its closing tag */
    const char *pieces[] = {O "tool_calls>\n", O "invoke name=\"noargs\">\n", C "invoke", ">", "\n" C "tool_calls>"};
    for (size_t k = 0; k < 5; k++) {
        assert_int_equal(r.calls, k < 4 ? 0 : 1);
        assert_int_equal(duet_dsml_parser_feed(p, pieces[k], strlen(pieces[k])), DUET_OK);
    }
    assert_int_equal(r.calls, 1);
    assert_string_equal(r.args[0], "{}");
    assert_int_equal(duet_dsml_parser_finish(p), DUET_OK);
    duet_dsml_parser_destroy(&p);
    rec_fini(&r);

    /* reasoning holds back a possible </think> */
    duet_dsml_opts_t think = fx->opts;
    think.thinking = 1;
    rec_init(&r);
    assert_int_equal(duet_dsml_parser_create(&think, on_event, &r, &p), DUET_OK);
    assert_int_equal(duet_dsml_parser_feed(p, "abc</th", 7), DUET_OK);
    assert_string_equal(r.s, "\n[reasoning]abc");
    assert_int_equal(duet_dsml_parser_feed(p, "ink>def", 7), DUET_OK);
    assert_string_equal(r.s, "\n[reasoning]abc\n[content]def");
    duet_dsml_parser_destroy(&p); /* destroy without finish is fine */
    rec_fini(&r);
}

static void test_ids(void **state)
{
    fx_t *fx = *state;
    const char *text = O "tool_calls>\n" O "invoke name=\"noargs\">\n" C "invoke>\n" O "invoke name=\"noargs\">\n" C
                       "invoke>\n" C "tool_calls>";
    rec_t a, b, c;
    parse_once(&a, text, &fx->opts);
    parse_once(&b, text, &fx->opts);
    duet_dsml_opts_t o2 = fx->opts;
    o2.id_seed = 43;
    parse_once(&c, text, &o2);
    assert_int_equal(a.calls, 2);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(strlen(a.ids[k]), 29);
        assert_memory_equal(a.ids[k], "call_", 5);
        for (int i = 5; i < 29; i++)
            assert_true((a.ids[k][i] >= 'a' && a.ids[k][i] <= 'z') || (a.ids[k][i] >= 'A' && a.ids[k][i] <= 'Z') ||
                        (a.ids[k][i] >= '0' && a.ids[k][i] <= '9'));
        assert_string_equal(a.ids[k], b.ids[k]);
        assert_string_not_equal(a.ids[k], c.ids[k]);
    }
    assert_string_not_equal(a.ids[0], a.ids[1]);
    rec_fini(&a);
    rec_fini(&b);
    rec_fini(&c);
}

static void test_schema_types(void **state)
{
    fx_t *fx = *state;
    static const struct {
        const char *param, *value, *string;
        int ok;
    } cases[] = {
        {"i", "5", "false", 1},      {"i", "5.0", "false", 1},   {"i", "5e2", "false", 1},
        {"i", "50e-1", "false", 1},  {"i", "5.5", "false", 0},   {"i", "5e-1", "false", 0},
        {"i", "0.000", "false", 1},  {"i", "\"5\"", "false", 0}, {"i", "5", "true", 0},
        {"n", "5", "false", 1},      {"n", "-5.25e-3", "false", 1}, {"n", "true", "false", 0},
        {"b", "false", "false", 1},  {"b", "0", "false", 0},     {"z", "null", "false", 1},
        {"z", "null", "true", 0},    {"a", "[]", "false", 1},    {"a", "{}", "false", 0},
        {"o", "{}", "false", 1},     {"o", "null", "false", 0},  {"s", "x", "true", 1},
        {"s", "\"x\"", "false", 1},  {"s", "1", "false", 0},     {"unlisted", "1", "false", 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char text[512];
        snprintf(text, sizeof text, O "tool_calls>\n" O "invoke name=\"echo\">\n" O "parameter name=\"%s\" string=\"%s\">%s" C
                 "parameter>\n" C "invoke>\n" C "tool_calls>", cases[k].param, cases[k].string, cases[k].value);
        rec_t r;
        parse_once(&r, text, &fx->opts);
        if (cases[k].ok != (r.errors == 0))
            fprintf(stderr, "case %zu: %s\n", k, r.s);
        assert_int_equal(r.calls, cases[k].ok);
        if (!cases[k].ok)
            assert_int_equal(r.code, DUET_DSML_TYPE_MISMATCH);
        rec_fini(&r);
    }
}

/* After an error the model's text is all there: content + raw + content. */
static void test_error_keeps_text(void **state)
{
    fx_t *fx = *state;
    const char *text = "Sure.\n\n" O "tool_calls>\n" O "invoke name=\"nope\">\n" C "invoke>\n" C "tool_calls>\nBye";
    rec_t r;
    parse_once(&r, text, &fx->opts);
    assert_int_equal(r.code, DUET_DSML_UNKNOWN_TOOL);
    assert_string_equal(r.raw, "\n\n" O "tool_calls>\n" O "invoke name=\"nope\">");
    assert_string_equal(r.content, "Sure.\n" C "invoke>\n" C "tool_calls>\nBye");
    rec_fini(&r);
}

static void test_size_limit(void **state)
{
    fx_t *fx = *state;
    duet_dsml_opts_t o = fx->opts;
    o.max_block_bytes = 300;
    char text[2048], val[500];
    memset(val, 'y', 150);
    val[150] = '\0';
    snprintf(text, sizeof text, O "tool_calls>\n" O "invoke name=\"echo\">\n" O "parameter name=\"s\" string=\"true\">%s" C
             "parameter>\n" C "invoke>\n" O "invoke name=\"echo\">\n" O "parameter name=\"s\" string=\"true\">%s" C
             "parameter>\n" C "invoke>\n" C "tool_calls>", val, val);
    rec_t r;
    parse_once(&r, text, &o);
    assert_int_equal(r.calls, 2); /* each call fits; the limit is per call */
    rec_fini(&r);
    memset(val, 'y', 400);
    val[400] = '\0';
    snprintf(text, sizeof text, O "tool_calls>\n" O "invoke name=\"echo\">\n" O "parameter name=\"s\" string=\"true\">%s" C
             "parameter>\n" C "invoke>\n" C "tool_calls>", val);
    parse_once(&r, text, &o);
    assert_int_equal(r.code, DUET_DSML_TOO_LARGE);
    assert_int_equal(r.raw_len, 300);
    rec_fini(&r);
    check_streaming(text, &o);
}

/* ------------------------------------------------------------ corpus */

static void test_malformed_corpus(void **state)
{
    (void)state;
    assert_non_null(corpus_path);
    FILE *f = fopen(corpus_path, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int count = 0, seen[DUET_DSML_CODE_COUNT] = {0};
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *row = json_loadb(line, (size_t)n, 0, &je);
        assert_non_null(row);
        const char *name = json_string_value(json_object_get(row, "name"));
        const char *text = json_string_value(json_object_get(row, "text"));
        const char *code = json_string_value(json_object_get(row, "code"));
        assert_non_null(name);
        assert_non_null(text);
        assert_non_null(code);
        int want = duet_dsml_code_parse(code);
        assert_true(want > 0);
        duet_dsml_opts_t o = {
            .thinking = json_is_true(json_object_get(row, "thinking")),
            .tools = json_object_get(row, "tools"),
            .id_seed = 7,
            .max_block_bytes = (size_t)json_integer_value(json_object_get(row, "max_block_bytes")),
        };
        rec_t r;
        parse_once(&r, text, &o);
        if ((int)r.code != want || r.calls != json_integer_value(json_object_get(row, "calls")))
            fprintf(stderr, "corpus case %s: want %s and %d calls, got%s\n", name, code,
                    (int)json_integer_value(json_object_get(row, "calls")), r.s);
        assert_int_equal(r.errors, 1);
        assert_int_equal(r.code, want);
        assert_int_equal(r.calls, (int)json_integer_value(json_object_get(row, "calls")));
        assert_true(r.raw_len > 0);
        /* Nothing is lost: with no call reported, content + raw + rest is the
         * text (after the reasoning in thinking mode). */
        if (r.calls == 0 && !o.thinking) {
            char *joined = NULL;
            size_t jl = 0, jc = 0;
            add(&joined, &jl, &jc, r.content, r.content_at_error);
            add(&joined, &jl, &jc, r.raw, r.raw_len);
            add(&joined, &jl, &jc, r.content + r.content_at_error, r.content_len - r.content_at_error);
            assert_string_equal(joined, text);
            free(joined);
        }
        rec_fini(&r);
        check_streaming(text, &o);
        seen[want]++;
        count++;
        json_decref(row);
    }
    free(line);
    fclose(f);
    assert_true(count >= 30);
    /* every error code is exercised */
    for (int c = 1; c < DUET_DSML_CODE_COUNT; c++) {
        if (!seen[c])
            fprintf(stderr, "no corpus case for %s\n", duet_dsml_code_str((duet_dsml_code_t)c));
        assert_true(seen[c] > 0);
    }
}

int main(int argc, char **argv)
{
    corpus_path = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_code_table),
        cmocka_unit_test_setup_teardown(test_round_trip_types, fx_setup, fx_teardown),
        cmocka_unit_test(test_encode_exact),
        cmocka_unit_test(test_json_canonical),
        cmocka_unit_test_setup_teardown(test_interleavings, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_holdback, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_ids, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_schema_types, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_error_keeps_text, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_size_limit, fx_setup, fx_teardown),
        cmocka_unit_test(test_malformed_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
