/* The router's OpenAI request parser and output pipeline, in process.
 *
 *   test_router_api TOKENIZER.json CORPUS_DIR
 *
 * - every class of bad parameter gives 400 naming the field; an unknown model 404;
 * - good requests give the values asked for, defaults where absent;
 * - the error body has the OpenAI shape;
 * - the output pipeline: text, stop strings (token count up to the stop),
 *   thinking mode, a DSML tool call, a malformed block (content + warning);
 * - fuzz: every corpus body, truncated at every byte and with bytes flipped
 *   (a fixed seed), through both parsers: never a crash, always 0 or an
 *   error with a status and a message. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api.h"
#include "output.h"
#include "tokenizer.h"

static const char *g_tok_path, *g_corpus;
static duet_tok_t *g_tok;

static duet_api_limits_t lim = {.served_model = "tiny", .vocab_size = 129280, .default_max_tokens_chat = 4096,
                                .default_max_tokens_completion = 16};

static int parse(duet_api_kind_t k, const char *body, duet_api_req_t *r, duet_api_error_t *e)
{
    return duet_api_parse(k, body, strlen(body), &lim, r, e);
}

static void expect_bad(duet_api_kind_t k, const char *body, int status, const char *param)
{
    duet_api_req_t r;
    duet_api_error_t e;
    int rc = parse(k, body, &r, &e);
    if (rc != -1 || e.status != status || strcmp(e.param, param ? param : "") != 0 || !e.message[0])
        fail_msg("%s: got rc %d status %d param '%s' (%s); want %d '%s'", body, rc, e.status, e.param, e.message,
                 status, param ? param : "");
}

static void test_bad_params(void **state)
{
    (void)state;
    const duet_api_kind_t C = DUET_API_COMPLETION, H = DUET_API_CHAT;
    expect_bad(C, "", 400, NULL);
    expect_bad(C, "{", 400, NULL);
    expect_bad(C, "[]", 400, NULL);
    expect_bad(C, "{\"prompt\":\"x\",\"prompt\":\"y\"}", 400, NULL); /* duplicate key */
    expect_bad(C, "{\"prompt\":\"x\",\"model\":5}", 400, "model");
    expect_bad(C, "{\"prompt\":\"x\",\"model\":\"other\"}", 404, "model");
    expect_bad(C, "{\"prompt\":\"x\",\"temperature\":-0.1}", 400, "temperature");
    expect_bad(C, "{\"prompt\":\"x\",\"temperature\":2.5}", 400, "temperature");
    expect_bad(C, "{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p");
    expect_bad(C, "{\"prompt\":\"x\",\"top_p\":1.01}", 400, "top_p");
    expect_bad(C, "{\"prompt\":\"x\",\"min_p\":1}", 400, "min_p");
    expect_bad(C, "{\"prompt\":\"x\",\"top_k\":-5}", 400, "top_k");
    expect_bad(C, "{\"prompt\":\"x\",\"top_k\":1.5}", 400, "top_k");
    expect_bad(C, "{\"prompt\":\"x\",\"seed\":\"1\"}", 400, "seed");
    expect_bad(C, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens");
    expect_bad(C, "{\"prompt\":\"x\",\"max_tokens\":-1}", 400, "max_tokens");
    expect_bad(C, "{\"prompt\":\"x\",\"n\":2}", 400, "n");
    expect_bad(C, "{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of");
    expect_bad(C, "{\"prompt\":\"x\",\"stop\":\"\"}", 400, "stop");
    expect_bad(C, "{\"prompt\":\"x\",\"stop\":[\"a\",3]}", 400, "stop[1]");
    expect_bad(C, "{\"prompt\":\"x\",\"stop\":[\"a\\u0000b\"]}", 400, "stop[0]");
    expect_bad(C, "{\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
                  "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", 400, "stop");
    expect_bad(C, "{\"prompt\":\"x\",\"stop_token_ids\":[1,129280]}", 400, "stop_token_ids[1]");
    expect_bad(C, "{\"prompt\":\"x\",\"stop_token_ids\":5}", 400, "stop_token_ids");
    expect_bad(C, "{\"prompt\":\"x\",\"stream\":\"true\"}", 400, "stream");
    expect_bad(C, "{\"prompt\":\"x\",\"ignore_eos\":1}", 400, "ignore_eos");
    expect_bad(C, "{\"prompt\":\"x\",\"stream_options\":[]}", 400, "stream_options");
    expect_bad(C, "{\"prompt\":\"x\",\"frequency_penalty\":1}", 400, "frequency_penalty");
    expect_bad(C, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":1}}", 400, "logit_bias");
    expect_bad(C, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo");
    expect_bad(C, "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix");
    expect_bad(C, "{\"prompt\":\"x\",\"logprobs\":2}", 400, "logprobs");
    expect_bad(C, "{\"prompt\":\"x\",\"session_id\":\"\"}", 400, "session_id");
    expect_bad(C, "{}", 400, "prompt");
    expect_bad(C, "{\"prompt\":5}", 400, "prompt");
    expect_bad(C, "{\"prompt\":[]}", 400, "prompt");
    expect_bad(C, "{\"prompt\":[1,\"a\"]}", 400, "prompt");
    expect_bad(C, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
    expect_bad(C, "{\"prompt\":[1,-1]}", 400, "prompt[1]");
    expect_bad(C, "{\"prompt\":[[1,2],[3]]}", 400, "prompt");
    expect_bad(H, "{}", 400, "messages");
    expect_bad(H, "{\"messages\":[]}", 400, "messages");
    expect_bad(H, "{\"messages\":{}}", 400, "messages");
    const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[1024];
#define CHAT(extra) (snprintf(b, sizeof b, "{%s,%s}", m, extra), b)
    expect_bad(H, CHAT("\"max_completion_tokens\":0"), 400, "max_completion_tokens");
    expect_bad(H, CHAT("\"tools\":{}"), 400, "tools");
    expect_bad(H, CHAT("\"tools\":[5]"), 400, "tools[0]");
    expect_bad(H, CHAT("\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}]"), 400, "tools[0]");
    expect_bad(H, CHAT("\"tools\":[{\"type\":\"function\"}]"), 400, "tools[0].function");
    expect_bad(H, CHAT("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]"), 400,
               "tools[0].function.name");
    expect_bad(H, CHAT("\"tool_choice\":\"sometimes\""), 400, "tool_choice");
    expect_bad(H, CHAT("\"tool_choice\":5"), 400, "tool_choice");
    expect_bad(H, CHAT("\"tool_choice\":\"required\""), 400, "tool_choice");
    expect_bad(H, CHAT("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                       "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}"),
               400, "tool_choice.function.name");
    expect_bad(H, CHAT("\"tool_choice\":{\"type\":\"function\"}"), 400, "tool_choice.function.name");
    expect_bad(H, CHAT("\"parallel_tool_calls\":\"yes\""), 400, "parallel_tool_calls");
    expect_bad(H, CHAT("\"response_format\":{\"type\":\"xml\"}"), 400, "response_format.type");
    expect_bad(H, CHAT("\"thinking\":\"on\""), 400, "thinking");
    expect_bad(H, CHAT("\"thinking\":{\"type\":\"maybe\"}"), 400, "thinking.type");
    expect_bad(H, CHAT("\"chat_template_kwargs\":{\"thinking\":1}"), 400, "chat_template_kwargs.thinking");
    expect_bad(H, CHAT("\"reasoning_effort\":\"extreme\""), 400, "reasoning_effort");
    expect_bad(H, CHAT("\"logprobs\":true"), 400, "logprobs");
    expect_bad(H, CHAT("\"top_logprobs\":3"), 400, "top_logprobs");
    expect_bad(H, CHAT("\"stream_options\":{\"include_usage\":\"yes\"}"), 400, "stream_options.include_usage");
#undef CHAT
}

static void test_good(void **state)
{
    (void)state;
    duet_api_req_t r;
    duet_api_error_t e;
    assert_int_equal(parse(DUET_API_COMPLETION, "{\"prompt\":\"hi\"}", &r, &e), 0);
    assert_true(r.temperature == 1.0f && r.top_p == 1.0f && r.top_k == 0 && r.min_p == 0.0f);
    assert_int_equal(r.has_seed, 0);
    assert_int_equal(r.max_tokens, 0); /* the router applies the default */
    assert_int_equal(r.skip_special_tokens, 1);
    assert_string_equal(r.prompt, "hi");
    duet_api_req_fini(&r);

    const char *body = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":0,"
                       "\"top_p\":0.5,\"top_k\":-1,\"min_p\":0.1,\"seed\":-3,\"max_tokens\":10,"
                       "\"max_completion_tokens\":20,\"stop\":[\"a\",\"bc\"],\"stop_token_ids\":[7],"
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":1,\"session_id\":\"s1\","
                       "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                       "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}],"
                       "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}},"
                       "\"reasoning_effort\":\"high\",\"presence_penalty\":0,\"logprobs\":false}";
    assert_int_equal(parse(DUET_API_CHAT, body, &r, &e), 0);
    assert_true(r.temperature == 0.0f && r.top_p == 0.5f && r.top_k == 0 && r.min_p > 0.09f);
    assert_true(r.has_seed && r.seed == (uint64_t)-3);
    assert_int_equal(r.max_tokens, 20);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_int_equal(r.n_stop_ids, 1);
    assert_int_equal(r.stop_ids[0], 7);
    assert_true(r.stream && r.include_usage);
    assert_string_equal(r.session, "s1");
    assert_int_equal(r.tool_choice, DUET_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_name, "g");
    assert_true(r.thinking);
    assert_int_equal(r.effort, DUET_CHAT_EFFORT_HIGH);
    duet_api_req_fini(&r);

    assert_int_equal(parse(DUET_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                          "\"reasoning_effort\":\"low\",\"thinking\":false}", &r, &e), 0);
    assert_false(r.thinking);
    duet_api_req_fini(&r);
    assert_int_equal(parse(DUET_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                          "\"chat_template_kwargs\":{\"enable_thinking\":true},"
                                          "\"response_format\":{\"type\":\"text\"},\"tool_choice\":\"none\"}", &r, &e), 0);
    assert_true(r.thinking);
    assert_null(r.response_format);
    assert_int_equal(r.tool_choice, DUET_TOOL_CHOICE_NONE);
    duet_api_req_fini(&r);
    assert_int_equal(parse(DUET_API_COMPLETION, "{\"prompt\":[[0,5,129279]],\"max_tokens\":2.0}", &r, &e), 0);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 129279);
    assert_int_equal(r.max_tokens, 2);
    duet_api_req_fini(&r);
}

static void test_error_json(void **state)
{
    (void)state;
    duet_api_error_t e;
    duet_api_error_set(&e, 400, NULL, "temperature", "invalid_value", "bad %s", "thing");
    char *s = duet_api_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"bad thing\",\"type\":\"invalid_request_error\","
                           "\"param\":\"temperature\",\"code\":\"invalid_value\"}}");
    free(s);
    duet_api_error_set(&e, 503, NULL, NULL, NULL, "down");
    s = duet_api_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"down\",\"type\":\"service_unavailable_error\","
                           "\"param\":null,\"code\":null}}");
    free(s);
    char p[128];
    duet_api_param_from_message("messages[2].tool_calls[0].function.name must be a string", p, sizeof p);
    assert_string_equal(p, "messages[2].tool_calls[0].function.name");
    duet_api_param_from_message("something else", p, sizeof p);
    assert_string_equal(p, "messages");
}

/* ---- output pipeline ---- */

static void ids_of(const char *text, duet_tok_ids_t *ids)
{
    memset(ids, 0, sizeof *ids);
    assert_int_equal(duet_tok_encode(g_tok, text, strlen(text), true, ids, NULL), DUET_OK);
}

static void test_output_text_and_stop(void **state)
{
    (void)state;
    duet_tok_ids_t ids;
    ids_of("Hello there, general Kenobi. You are a bold one.", &ids);
    const char *stop[] = {"Kenobi"};
    duet_out_opts_t o = {.tok = g_tok, .stop = stop, .n_stop = 1, .skip_special_tokens = 1};
    duet_out_t *out = NULL;
    assert_int_equal(duet_out_create(&o, &out), DUET_OK);
    size_t stopped_at = 0;
    for (size_t i = 0; i < ids.len; i++) {
        duet_out_feed(out, &ids.ids[i], 1);
        if (duet_out_stopped(out) && !stopped_at)
            stopped_at = i + 1;
    }
    duet_out_finish(out);
    size_t len;
    const char *t = duet_out_content(out, &len);
    assert_string_equal(t, "Hello there, general ");
    assert_true(duet_out_stopped(out));
    assert_int_equal(duet_out_n_tokens(out), stopped_at);
    assert_true(stopped_at < ids.len);
    size_t n;
    const char *take = duet_out_take_text(out, &n);
    assert_non_null(take);
    assert_int_equal(n, strlen("Hello there, general "));
    duet_out_destroy(&out);
    duet_tok_ids_fini(&ids);
}

static void test_output_tool_call(void **state)
{
    (void)state;
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                               "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                               "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}]", 0, NULL);
    duet_tok_ids_t ids;
    ids_of("Because</think>Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
           "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
           "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
           "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>", &ids);
    duet_out_opts_t o = {.tok = g_tok, .chat = 1, .thinking = 1, .tools = tools, .id_seed = 5,
                         .skip_special_tokens = 1};
    duet_out_t *out = NULL;
    assert_int_equal(duet_out_create(&o, &out), DUET_OK);
    json_t *calls_seen = json_array();
    for (size_t i = 0; i < ids.len; i++) {
        duet_out_feed(out, &ids.ids[i], 1);
        json_t *d = duet_out_take_delta(out);
        if (d && json_object_get(d, "tool_calls"))
            json_array_extend(calls_seen, json_object_get(d, "tool_calls"));
        json_decref(d);
    }
    duet_out_finish(out);
    size_t len;
    assert_string_equal(duet_out_reasoning(out, &len), "Because");
    assert_string_equal(duet_out_content(out, &len), "Checking.");
    assert_int_equal(duet_out_n_calls(out), 1);
    assert_int_equal(json_array_size(calls_seen), 1);
    json_t *c = json_array_get(duet_out_tool_calls(out), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "function"), "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "function"), "arguments")),
                        "{\"city\": \"Paris\", \"days\": 3}");
    assert_int_equal(duet_out_dsml_error(out), DUET_DSML_OK);
    duet_out_destroy(&out);
    duet_tok_ids_fini(&ids);
    json_decref(calls_seen);

    /* malformed: the block comes back as content, with a warning, and no call */
    ids_of("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
           "<｜DSML｜parameter name=\"days\" string=\"false\">three</｜DSML｜parameter>\n"
           "</｜DSML｜invoke>\n</｜DSML｜tool_calls>", &ids);
    o.thinking = 0;
    assert_int_equal(duet_out_create(&o, &out), DUET_OK);
    duet_out_feed(out, ids.ids, ids.len);
    duet_out_finish(out);
    assert_int_equal(duet_out_n_calls(out), 0);
    assert_int_equal(duet_out_dsml_error(out), DUET_DSML_BAD_JSON);
    const char *content = duet_out_content(out, &len);
    assert_non_null(strstr(content, "three"));
    json_t *w = duet_out_take_warnings(out);
    assert_int_equal(json_array_size(w), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(w, 0), "code")), "DSML_BAD_JSON");
    json_decref(w);
    duet_out_destroy(&out);
    duet_tok_ids_fini(&ids);
    json_decref(tools);
}

/* ---- fuzz: corpus bodies, truncated and mutated ---- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void run_one(const char *buf, size_t len)
{
    for (int k = 0; k < 2; k++) {
        duet_api_req_t r;
        duet_api_error_t e;
        int rc = duet_api_parse(k ? DUET_API_CHAT : DUET_API_COMPLETION, buf, len, &lim, &r, &e);
        if (rc == 0) {
            duet_api_req_fini(&r);
        } else {
            assert_int_equal(rc, -1);
            assert_true(e.status == 400 || e.status == 404 || e.status == 500);
            assert_true(e.message[0] != 0);
            char *j = duet_api_error_json(&e);
            assert_non_null(j);
            free(j);
        }
    }
}

static void test_fuzz_corpus(void **state)
{
    (void)state;
    DIR *d = opendir(g_corpus);
    assert_non_null(d);
    struct dirent *de;
    int files = 0;
    long runs = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", g_corpus, de->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        files++;
        for (size_t cut = 0; cut <= n; cut++, runs++)
            run_one(buf, cut);
        char m[65536];
        for (int i = 0; i < 2000; i++, runs++) {
            memcpy(m, buf, n);
            int flips = 1 + (int)(next_rand() % 4);
            for (int k = 0; k < flips; k++) {
                size_t at = (size_t)(next_rand() % (n ? n : 1));
                static const char alphabet[] = "{}[]\":,0123456789.-eE tfnul\\x\xff\xc3";
                m[at] = (next_rand() & 1) ? alphabet[next_rand() % (sizeof alphabet - 1)] : (char)next_rand();
            }
            run_one(m, n);
        }
    }
    closedir(d);
    assert_true(files >= 5);
    print_message("fuzz: %d corpus files, %ld parses\n", files, runs * 2);
}

static int setup(void **state)
{
    (void)state;
    return duet_tok_create(g_tok_path, NULL, &g_tok, NULL) == DUET_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    duet_tok_destroy(&g_tok);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s TOKENIZER.json CORPUS_DIR\n", argv[0]);
        return 2;
    }
    g_tok_path = argv[1];
    g_corpus = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_params),      cmocka_unit_test(test_good),
        cmocka_unit_test(test_error_json),      cmocka_unit_test(test_output_text_and_stop),
        cmocka_unit_test(test_output_tool_call), cmocka_unit_test(test_fuzz_corpus),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
