/* Chat-encoding parity: every conversation of tests/text/golden/chat-encoding.jsonl
 * (written by make_chat_golden.py from the official DeepSeek-V4 encoder) is
 * encoded with duet_chat_encode and must give the same prompt, byte for
 * byte, and — tokenized with duet's tokenizer, special tokens allowed — the
 * same ids.
 *
 * Usage: test_chat_golden [GOLDEN.jsonl [tokenizer.json]] */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "duet_config.h"
#include "chat.h"
#include "tokenizer.h"

static const char *golden_path = DUET_SOURCE_ROOT "/tests/text/golden/chat-encoding.jsonl";
static const char *tokenizer_path = DUET_SOURCE_ROOT "/data/tokenizer/deepseek-v4/tokenizer.json";

static int opts_from_json(const json_t *o, duet_chat_opts_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->thinking = json_is_true(json_object_get(o, "thinking"));
    opts->keep_reasoning = json_is_true(json_object_get(o, "keep_reasoning"));
    opts->no_bos = json_is_true(json_object_get(o, "no_bos"));
    opts->continue_final = json_is_true(json_object_get(o, "continue_final"));
    const json_t *eff = json_object_get(o, "reasoning_effort");
    if (duet_chat_effort_parse(json_is_string(eff) ? json_string_value(eff) : NULL,
                               &opts->effort, NULL) != DUET_OK)
        return -1;
    const char *prof = json_string_value(json_object_get(o, "effort_profile"));
    opts->effort_profile = prof && strcmp(prof, "official") == 0 ? DUET_CHAT_PROFILE_OFFICIAL
                                                                 : DUET_CHAT_PROFILE_PREVIEW;
    const json_t *task = json_object_get(o, "task");
    if (json_is_string(task) &&
        duet_chat_task_parse(json_string_value(task), &opts->task, NULL) != DUET_OK)
        return -1;
    opts->response_format = json_object_get(o, "response_format");
    return 0;
}

/* Prints where two byte strings part. */
static void show_diff(const char *name, const char *want, size_t want_len, const char *got,
                      size_t got_len)
{
    size_t i = 0;
    while (i < want_len && i < got_len && want[i] == got[i])
        i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "%s: prompt differs at byte %zu (want %zu bytes, got %zu)\n", name, i,
            want_len, got_len);
    fprintf(stderr, "  want: ...%.*s|%.*s\n", (int)(i - from), want + from,
            (int)(want_len - i < 80 ? want_len - i : 80), want + i);
    fprintf(stderr, "  got:  ...%.*s|%.*s\n", (int)(i - from), got + from,
            (int)(got_len - i < 80 ? got_len - i : 80), got + i);
}

static void test_golden(void **state)
{
    (void)state;
    FILE *f = fopen(golden_path, "r");
    if (!f)
        fail_msg("cannot open %s", golden_path);

    duet_tok_t *tok = NULL;
    duet_err_t err = {0};
    FILE *tf = fopen(tokenizer_path, "r");
    if (tf) {
        fclose(tf);
        if (duet_tok_create(tokenizer_path, NULL, &tok, &err) != DUET_OK)
            fail_msg("tokenizer: %s", duet_err_text(&err));
    } else {
        fprintf(stderr, "note: %s is missing; comparing prompts only\n", tokenizer_path);
    }

    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    size_t total = 0, prompt_ok = 0, ids_ok = 0, ids_checked = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t jerr;
        json_t *rec = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &jerr);
        if (!rec)
            fail_msg("golden line %zu: %s", total + 1, jerr.text);
        total++;
        const char *name = json_string_value(json_object_get(rec, "name"));
        const json_t *want = json_object_get(rec, "prompt");
        duet_chat_opts_t opts;
        if (opts_from_json(json_object_get(rec, "options"), &opts) < 0)
            fail_msg("%s: bad options", name);

        char *got = NULL;
        size_t got_len = 0;
        duet_status_t st = duet_chat_encode(json_object_get(rec, "messages"),
                                            json_object_get(rec, "tools"), &opts, &got, &got_len,
                                            &err);
        if (st != DUET_OK) {
            fprintf(stderr, "%s: encode failed: %s\n", name, duet_err_text(&err));
            json_decref(rec);
            continue;
        }
        if (got_len == json_string_length(want) && memcmp(got, json_string_value(want), got_len) == 0)
            prompt_ok++;
        else
            show_diff(name, json_string_value(want), json_string_length(want), got, got_len);

        if (tok) {
            ids_checked++;
            duet_tok_ids_t ids = {0};
            const json_t *want_ids = json_object_get(rec, "ids");
            if (duet_tok_encode(tok, got, got_len, true, &ids, &err) != DUET_OK)
                fail_msg("%s: tokenizer: %s", name, duet_err_text(&err));
            size_t i = 0;
            int same = ids.len == json_array_size(want_ids);
            for (; same && i < ids.len; i++)
                if (ids.ids[i] != json_integer_value(json_array_get(want_ids, i)))
                    same = 0;
            if (same)
                ids_ok++;
            else
                fprintf(stderr, "%s: ids differ at %zu (want %zu ids, got %zu)\n", name,
                        i ? i - 1 : 0, json_array_size(want_ids), ids.len);
            duet_tok_ids_fini(&ids);
        }
        free(got);
        json_decref(rec);
    }
    free(line);
    fclose(f);
    duet_tok_destroy(&tok);

    printf("chat encoding: %zu conversations, %zu prompts identical, %zu of %zu id lists identical\n",
           total, prompt_ok, ids_ok, ids_checked);
    assert_true(total >= 200);
    assert_int_equal(prompt_ok, total);
    assert_int_equal(ids_ok, ids_checked);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        golden_path = argv[1];
    if (argc > 2)
        tokenizer_path = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
