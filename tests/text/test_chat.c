/* Chat encoding: the Python-compatible JSON reader and writer, the format's
 * rules on small inputs, and every kind of malformed input rejected with a
 * typed error that names the message and field. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "chat.h"
#include "chat_json.h"

/* ---- JSON writer ------------------------------------------------------- */

static void test_float_repr(void **state)
{
    (void)state;
    /* Each pair is Python's repr(float). */
    static const struct {
        double x;
        const char *want;
    } cases[] = {
        {1.0, "1.0"},
        {0.1, "0.1"},
        {-2.5, "-2.5"},
        {100.0, "100.0"},
        {1e20, "1e+20"},
        {1e16, "1e+16"},
        {1e15, "1000000000000000.0"},
        {1234567890123456.0, "1234567890123456.0"},
        {12345678901234567890.0, "1.2345678901234567e+19"},
        {1e-4, "0.0001"},
        {1e-5, "1e-05"},
        {1.5e-7, "1.5e-07"},
        {0.000123, "0.000123"},
        {123.456, "123.456"},
        {1.0 / 3.0, "0.3333333333333333"},
        {2.0 / 3.0, "0.6666666666666666"},
        {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"},
        {1e100, "1e+100"},
        {1.5e300, "1.5e+300"},
        {0.0, "0.0"},
        {-0.0, "-0.0"},
        {9007199254740993.0, "9007199254740992.0"},
    };
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        duet_chat_json_float(cases[i].x, buf);
        assert_string_equal(buf, cases[i].want);
    }
    duet_chat_json_float(NAN, buf);
    assert_string_equal(buf, "NaN");
    duet_chat_json_float(INFINITY, buf);
    assert_string_equal(buf, "Infinity");
    duet_chat_json_float(-INFINITY, buf);
    assert_string_equal(buf, "-Infinity");
}

static void test_string_escapes(void **state)
{
    (void)state;
    static const char in[] = "a\"b\\c\n\r\t\b\f\x01\x1f\x7f \xc3\xa9 \xf0\x9f\x8e\x89 /";
    duet_chat_buf_t b = {0};
    duet_chat_json_string(&b, in, sizeof in - 1);
    assert_false(b.failed);
    assert_string_equal(b.p, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\x7f \xc3\xa9 \xf0\x9f\x8e\x89 /\"");
    duet_chat_buf_fini(&b);

    /* U+0000 inside a string */
    duet_chat_json_string(&b, "x\0y", 3);
    assert_string_equal(b.p, "\"x\\u0000y\"");
    duet_chat_buf_fini(&b);
}

static void test_dump_jansson(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *v = json_loads("{\"z\": 1, \"a\": [1.0, 0.1, 1e20, -0.0, true, false, null, \"s\"],"
                           " \"m\": {}, \"n\": [], \"a2\": {\"k\": \"\\u00e9\\n\"}}",
                           0, &jerr);
    assert_non_null(v);
    duet_chat_buf_t b = {0};
    assert_int_equal(duet_chat_json_dump(&b, v, NULL), DUET_OK);
    assert_string_equal(b.p, "{\"z\": 1, \"a\": [1.0, 0.1, 1e+20, -0.0, true, false, null, \"s\"], "
                             "\"m\": {}, \"n\": [], \"a2\": {\"k\": \"\xc3\xa9\\n\"}}");
    duet_chat_buf_fini(&b);
    json_decref(v);
}

/* ---- JSON reader ------------------------------------------------------- */

static char *roundtrip(const char *text, duet_status_t *st_out)
{
    duet_chat_json_t *v = NULL;
    duet_err_t err = {0};
    duet_status_t st = duet_chat_json_parse(text, strlen(text), &v, &err);
    *st_out = st;
    if (st != DUET_OK) {
        assert_null(v);
        assert_true(strstr(err.msg, "offset") != NULL);
        return NULL;
    }
    duet_chat_buf_t b = {0};
    duet_chat_json_write(&b, v);
    duet_chat_json_free(&v);
    assert_null(v);
    char *s = strdup(b.p ? b.p : "");
    duet_chat_buf_fini(&b);
    return s;
}

static void test_parse_python_semantics(void **state)
{
    (void)state;
    /* Each pair is json.dumps(json.loads(text), ensure_ascii=False). */
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"{\"a\": 1, \"b\": 2, \"a\": 3}", "{\"a\": 3, \"b\": 2}"},
        {"{\"k\": {\"x\": 1, \"x\": {\"y\": 2}}}", "{\"k\": {\"x\": {\"y\": 2}}}"},
        {"123456789012345678901234567890", "123456789012345678901234567890"},
        {"-0", "0"},
        {"-0.0", "-0.0"},
        {"1E5", "100000.0"},
        {"2.50", "2.5"},
        {"1e400", "Infinity"},
        {"[NaN, Infinity, -Infinity]", "[NaN, Infinity, -Infinity]"},
        {" \t\r\n{\"a\":[1,2,{}],\"b\":\"\"} \n", "{\"a\": [1, 2, {}], \"b\": \"\"}"},
        {"\"\\u00e9\\ud83d\\ude00\\/\"", "\"\xc3\xa9\xf0\x9f\x98\x80/\""},
        {"\"\\u0000\"", "\"\\u0000\""},
        {"[]", "[]"},
        {"{}", "{}"},
        {"true", "true"},
        {"null", "null"},
        {"\"\xe4\xb8\xad\"", "\"\xe4\xb8\xad\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        duet_status_t st;
        char *got = roundtrip(cases[i].in, &st);
        assert_int_equal(st, DUET_OK);
        assert_string_equal(got, cases[i].want);
        free(got);
    }
}

static void test_parse_rejects(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", "   ", "{", "[1,]", "{\"a\":1,}", "{'a': 1}", "{\"a\" 1}", "01", "1.", ".5",
        "1e", "-", "+1", "tru", "nul", "\"abc", "\"a\x01b\"", "\"\\x\"", "\"\\u12\"",
        "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "1 2", "{} x", "\xef\xbb\xbf{}",
        "-Inf", "nan", "[1] ]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        duet_status_t st;
        char *got = roundtrip(bad[i], &st);
        if (st != DUET_ERR_PARSE)
            fail_msg("accepted %s", bad[i]);
        assert_null(got);
    }
    /* nesting: 512 levels are fine, 513 are not */
    char deep[2 * 513 + 1];
    for (int depth = 512; depth <= 513; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        deep[2 * depth] = '\0';
        duet_status_t st;
        char *got = roundtrip(deep, &st);
        assert_int_equal(st, depth == 512 ? DUET_OK : DUET_ERR_PARSE);
        free(got);
    }
    /* CPython refuses integers of more than 4300 digits */
    char big[4302];
    memset(big, '7', 4301);
    big[4301] = '\0';
    duet_status_t st;
    assert_null(roundtrip(big, &st));
    assert_int_equal(st, DUET_ERR_PARSE);
    big[4300] = '\0';
    char *ok = roundtrip(big, &st);
    assert_int_equal(st, DUET_OK);
    free(ok);
}

/* ---- encoder ----------------------------------------------------------- */

static json_t *J(const char *text)
{
    json_error_t jerr;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &jerr);
    if (!v)
        fail_msg("bad test JSON (%s): %s", jerr.text, text);
    return v;
}

static char *encode_ok(const char *messages, const char *tools, const duet_chat_opts_t *opts)
{
    json_t *m = J(messages);
    json_t *t = tools ? J(tools) : NULL;
    char *out = NULL;
    size_t len = 0;
    duet_err_t err = {0};
    duet_status_t st = duet_chat_encode(m, t, opts, &out, &len, &err);
    if (st != DUET_OK)
        fail_msg("encode failed: %s", duet_err_text(&err));
    assert_int_equal(strlen(out), len);
    json_decref(m);
    json_decref(t);
    return out;
}

#define BOS DUET_CHAT_BOS
#define EOS DUET_CHAT_EOS
#define USER DUET_CHAT_USER
#define ASSIST DUET_CHAT_ASSISTANT

static void test_basic_turns(void **state)
{
    (void)state;
    char *p = encode_ok("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"hi\"}]",
                        NULL, NULL);
    assert_string_equal(p, BOS "S" USER "hi" ASSIST "</think>");
    free(p);

    duet_chat_opts_t o = {.thinking = 1};
    p = encode_ok("[{\"role\":\"user\",\"content\":\"a\"},"
                  "{\"role\":\"assistant\",\"content\":\"b\",\"reasoning_content\":\"r\"},"
                  "{\"role\":\"user\",\"content\":\"c\"}]",
                  NULL, &o);
    /* earlier reasoning dropped, the turn closed with </think> */
    assert_string_equal(p, BOS USER "a" ASSIST "</think>b" EOS USER "c" ASSIST "<think>");
    free(p);

    o.keep_reasoning = 1;
    p = encode_ok("[{\"role\":\"user\",\"content\":\"a\"},"
                  "{\"role\":\"assistant\",\"content\":\"b\",\"reasoning_content\":\"r\"},"
                  "{\"role\":\"user\",\"content\":\"c\"}]",
                  NULL, &o);
    assert_string_equal(p, BOS USER "a" ASSIST "<think>r</think>b" EOS USER "c" ASSIST "<think>");
    free(p);

    o = (duet_chat_opts_t){.no_bos = 1, .continue_final = 1};
    p = encode_ok("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},"
                  "{\"type\":\"text\",\"text\":\"y\"}]},{\"role\":\"assistant\",\"content\":\"par\"}]",
                  NULL, &o);
    assert_string_equal(p, USER "x y" ASSIST "</think>par");
    free(p);
}

static void test_tool_calls_dsml(void **state)
{
    (void)state;
    char *p = encode_ok(
        "[{\"role\":\"user\",\"content\":\"go\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{\\\"s\\\": \\\"x\\\", \\\"n\\\": 1.50, \\\"o\\\": {\\\"k\\\": [true, null]}}\"}},"
        "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":{\"q\":2}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"A\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"B\"}]",
        NULL, NULL);
    assert_string_equal(
        p, BOS USER "go" ASSIST "</think>\n\n<｜DSML｜tool_calls>\n"
                               "<｜DSML｜invoke name=\"f\">\n"
                               "<｜DSML｜parameter name=\"s\" string=\"true\">x</｜DSML｜parameter>\n"
                               "<｜DSML｜parameter name=\"n\" string=\"false\">1.5</｜DSML｜parameter>\n"
                               "<｜DSML｜parameter name=\"o\" string=\"false\">{\"k\": [true, null]}"
                               "</｜DSML｜parameter>\n"
                               "</｜DSML｜invoke>\n"
                               "<｜DSML｜invoke name=\"g\">\n"
                               "<｜DSML｜parameter name=\"q\" string=\"false\">2</｜DSML｜parameter>\n"
                               "</｜DSML｜invoke>\n"
                               "</｜DSML｜tool_calls>" EOS USER
                               "<tool_result>B</tool_result>\n\n<tool_result>A</tool_result>" ASSIST
                               "</think>");
    free(p);
}

static void test_tools_section(void **state)
{
    (void)state;
    duet_chat_opts_t o = {.thinking = 1};
    char *p = encode_ok("[{\"role\":\"user\",\"content\":\"u\"}]",
                        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"d\":1.0}}}]",
                        &o);
    const char *head = BOS "\n\n## Tools\n\nYou have access to a set of tools";
    assert_memory_equal(p, head, strlen(head));
    const char *tail = "### Available Tool Schemas\n\n{\"name\": \"f\", \"parameters\": {\"d\": 1.0}}\n\n"
                       "You MUST strictly follow the above defined tool name and parameter schemas "
                       "to invoke tool calls.\n" USER "u" ASSIST "<think>";
    assert_non_null(strstr(p, tail));
    assert_string_equal(strstr(p, tail), tail);
    free(p);
}

/* ---- errors ------------------------------------------------------------ */

static void expect_error(const char *messages, const char *tools, const duet_chat_opts_t *opts,
                         duet_status_t want, const char *needle)
{
    json_t *m = J(messages);
    json_t *t = tools ? J(tools) : NULL;
    char *out = (char *)"untouched";
    size_t len = 12345;
    duet_err_t err = {0};
    duet_status_t st = duet_chat_encode(m, t, opts, &out, &len, &err);
    if (st != want)
        fail_msg("%s: got %s (%s), want %s", messages, duet_status_code(st), err.msg,
                 duet_status_code(want));
    assert_int_equal(err.status, want);
    if (!strstr(err.msg, needle))
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
    assert_string_equal(out, "untouched");
    assert_int_equal(len, 12345);
    json_decref(m);
    json_decref(t);
}

#define INVALID DUET_ERR_INVALID
#define PARSE DUET_ERR_PARSE
#define U0 "{\"role\":\"user\",\"content\":\"q\"}"
#define CALL(args) \
    "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\"," \
    "\"function\":{\"name\":\"f\",\"arguments\":" args "}}]}"

static void test_errors_messages(void **state)
{
    (void)state;
    expect_error("{}", NULL, NULL, INVALID, "messages must be an array");
    expect_error("[]", NULL, NULL, INVALID, "messages must not be empty");
    expect_error("[" U0 ", 3]", NULL, NULL, INVALID, "messages[1] must be an object");
    expect_error("[{\"content\":\"x\"}]", NULL, NULL, INVALID, "messages[0].role must be a string");
    expect_error("[" U0 ",{\"role\":\"function\",\"content\":\"x\"}]", NULL, NULL, INVALID,
                 "messages[1].role \"function\" is unknown");
    expect_error("[{\"role\":7}]", NULL, NULL, INVALID, "messages[0].role");
    expect_error("[{\"role\":\"user\",\"content\":5}]", NULL, NULL, INVALID,
                 "messages[0].content must be a string, null or a list");
    expect_error("[{\"role\":\"user\",\"content\":[\"text\"]}]", NULL, NULL, INVALID,
                 "messages[0].content[0] must be an object");
    expect_error("[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]", NULL, NULL, INVALID,
                 "messages[0].content[0] must be an object with a string \"type\"");
    expect_error("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]",
                 NULL, NULL, INVALID, "messages[0].content[1] has type \"image_url\"");
    expect_error("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]", NULL, NULL,
                 INVALID, "messages[0].content[0].text must be a string");
    expect_error("[" U0 ",{\"role\":\"developer\",\"content\":\"\"}]", NULL, NULL, INVALID,
                 "messages[1].content must not be empty for a developer message");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":1}]",
                 NULL, NULL, INVALID, "messages[1].reasoning_content");
}

static void test_errors_tool_calls(void **state)
{
    (void)state;
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":{}}]", NULL, NULL, INVALID,
                 "messages[1].tool_calls must be an array");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[1]}]", NULL, NULL, INVALID,
                 "messages[1].tool_calls[0] must be an object");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"custom\",\"function\":"
                 "{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
                 NULL, NULL, INVALID, "messages[1].tool_calls[0].type must be \"function\"");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\"}]}]", NULL,
                 NULL, INVALID, "messages[1].tool_calls[0].function must be an object");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]",
                 NULL, NULL, INVALID, "messages[1].tool_calls[0].function.name");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"\","
                 "\"arguments\":\"{}\"}}]}]",
                 NULL, NULL, INVALID, "function.name must be a non-empty string");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[{\"id\":4,\"function\":{\"name\":\"f\","
                 "\"arguments\":\"{}\"}}]}]",
                 NULL, NULL, INVALID, "messages[1].tool_calls[0].id must be a string");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}]",
                 NULL, NULL, INVALID, "messages[1].tool_calls[0].function.arguments must be");
    expect_error("[" U0 "," CALL("7") "]", NULL, NULL, INVALID,
                 "messages[1].tool_calls[0].function.arguments must be a JSON text");
    expect_error("[" U0 "," CALL("\"not json\"") "]", NULL, NULL, PARSE,
                 "messages[1].tool_calls[0].function.arguments is not valid JSON");
    expect_error("[" U0 "," CALL("\"{\\\"a\\\": 1\"") "]", NULL, NULL, PARSE,
                 "is not valid JSON: expected ',' or '}' at offset 7");
    expect_error("[" U0 "," CALL("\"{\\\"a\\\": \\\"\\\\ud800\\\"}\"") "]", NULL, NULL, PARSE,
                 "lone high surrogate");
    expect_error("[" U0 "," CALL("\"[1, 2]\"") "]", NULL, NULL, INVALID,
                 "messages[1].tool_calls[0].function.arguments must be a JSON object");
    expect_error("[" U0 "," CALL("\"\\\"text\\\"\"") "]", NULL, NULL, INVALID,
                 "must be a JSON object");
    /* the second call is the bad one */
    expect_error("[" U0 ",{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                 "\"arguments\":\"{}\"}},{\"function\":{\"name\":\"g\",\"arguments\":\"{\"}}]}]",
                 NULL, NULL, PARSE, "messages[1].tool_calls[1].function.arguments");
}

static void test_errors_tool_messages(void **state)
{
    (void)state;
    expect_error("[{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"}]", NULL, NULL, INVALID,
                 "messages[0] is a tool result with no assistant tool call before it");
    expect_error("[" U0 ",{\"role\":\"assistant\",\"content\":\"a\"},"
                 "{\"role\":\"tool\",\"content\":\"r\"}]",
                 NULL, NULL, INVALID, "messages[2] is a tool result with no assistant tool call");
    expect_error("[" U0 "," CALL("\"{}\"") "," U0 ",{\"role\":\"tool\",\"tool_call_id\":\"c1\"}]", NULL,
                 NULL, INVALID, "messages[3] is a tool result with no assistant tool call");
    expect_error("[" U0 "," CALL("\"{}\"") ",{\"role\":\"tool\",\"tool_call_id\":5}]", NULL, NULL,
                 INVALID, "messages[2].tool_call_id must be a string");
    expect_error("[" U0 "," CALL("\"{}\"") ",{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"x\"},"
                 "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"y\"}]",
                 NULL, NULL, INVALID, "messages[3].tool_call_id \"zz\" names no tool call of messages[1]");
    expect_error("[" U0 "," CALL("\"{}\"") ",{\"role\":\"tool\",\"content\":[{\"type\":7}]}]", NULL,
                 NULL, INVALID, "messages[2].content[0]");
}

static void test_errors_tools_and_options(void **state)
{
    (void)state;
    expect_error("[" U0 "]", "{}", NULL, INVALID, "tools must be an array");
    expect_error("[" U0 "]", "[1]", NULL, INVALID, "tools[0] must be an object");
    expect_error("[" U0 "]", "[{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}]", NULL, INVALID,
                 "tools[0].type must be \"function\"");
    expect_error("[" U0 "]", "[{\"type\":\"function\"}]", NULL, INVALID,
                 "tools[0].function must be an object");
    expect_error("[" U0 "]", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                 "{\"type\":\"function\",\"function\":{\"description\":\"d\"}}]",
                 NULL, INVALID, "tools[1].function.name must be a non-empty string");

    duet_chat_opts_t o = {.task = DUET_CHAT_TASK_QUERY};
    expect_error("[{\"role\":\"system\",\"content\":\"s\"}]", NULL, &o, INVALID,
                 "task \"query\" needs a user or developer message");
    o = (duet_chat_opts_t){.continue_final = 1};
    expect_error("[" U0 "]", NULL, &o, INVALID,
                 "continue_final needs an assistant message last, but messages[0] is user");
    o = (duet_chat_opts_t){.effort = DUET_CHAT_EFFORT_LOW};
    expect_error("[" U0 "]", NULL, &o, INVALID, "not known to the preview profile");
    o = (duet_chat_opts_t){.task = (duet_chat_task_t)99};
    expect_error("[" U0 "]", NULL, &o, INVALID, "unknown task");

    duet_chat_effort_t eff;
    duet_err_t err = {0};
    assert_int_equal(duet_chat_effort_parse("medium", &eff, &err), INVALID);
    assert_non_null(strstr(err.msg, "medium"));
    assert_int_equal(duet_chat_effort_parse("max", &eff, NULL), DUET_OK);
    assert_int_equal(eff, DUET_CHAT_EFFORT_MAX);
    duet_chat_task_t task;
    assert_int_equal(duet_chat_task_parse("read_url", &task, NULL), DUET_OK);
    assert_int_equal(task, DUET_CHAT_TASK_READ_URL);
    assert_int_equal(duet_chat_task_parse("nope", &task, NULL), INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_repr),
        cmocka_unit_test(test_string_escapes),
        cmocka_unit_test(test_dump_jansson),
        cmocka_unit_test(test_parse_python_semantics),
        cmocka_unit_test(test_parse_rejects),
        cmocka_unit_test(test_basic_turns),
        cmocka_unit_test(test_tool_calls_dsml),
        cmocka_unit_test(test_tools_section),
        cmocka_unit_test(test_errors_messages),
        cmocka_unit_test(test_errors_tool_calls),
        cmocka_unit_test(test_errors_tool_messages),
        cmocka_unit_test(test_errors_tools_and_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
