/* Parity of the tokenizer with the reference (`tokenizers` from PyPI) on the
 * committed golden corpus (tests/text/golden/tokenizer-corpus.jsonl.gz,
 * written by make_tokenizer_golden.py): identical ids for every string with
 * added tokens recognised and with them as plain text, decode(encode(s)) ==
 * s, the same on the PCRE2 path, and the DeepSeek-V4 special-token ids.
 * Usage: test_tokenizer_golden TOKENIZER_JSON CORPUS_GZ */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <zlib.h>

#include "tokenizer.h"

static const char *tok_path, *corpus_path;

typedef struct {
    char *cat;
    char *text;      /* input bytes */
    size_t text_len;
    char *expect;    /* decode(encode(text)): text, or its U+FFFD-replaced form */
    size_t expect_len;
    int32_t *ids, *plain;
    size_t n_ids, n_plain;
} rec_t;

static rec_t *recs;
static size_t n_recs;

static int32_t *json_ids(json_t *a, size_t *n)
{
    size_t i;
    json_t *v;
    int32_t *ids = malloc((json_array_size(a) + 1) * sizeof *ids);
    assert_non_null(ids);
    json_array_foreach(a, i, v) ids[i] = (int32_t)json_integer_value(v);
    *n = json_array_size(a);
    return ids;
}

static void load_corpus(void)
{
    gzFile gz = gzopen(corpus_path, "rb");
    size_t cap = 0, len = 0, rcap = 0;
    char *buf = NULL;
    int k;
    if (!gz)
        fail_msg("cannot open %s", corpus_path);
    do {
        if (len + 65536 > cap) {
            cap = cap ? cap * 2 : 1 << 22;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        k = gzread(gz, buf + len, 65536);
        assert_true(k >= 0);
        len += (size_t)k;
    } while (k > 0);
    gzclose(gz);
    for (char *line = buf, *end; line < buf + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(buf + len - line));
        if (!end)
            end = buf + len;
        json_error_t jerr;
        json_t *o = json_loadb(line, (size_t)(end - line), JSON_ALLOW_NUL, &jerr);
        if (!o)
            fail_msg("%s: record %zu: %s", corpus_path, n_recs, jerr.text);
        if (n_recs == rcap) {
            rcap = rcap ? rcap * 2 : 1024;
            recs = realloc(recs, rcap * sizeof *recs);
            assert_non_null(recs);
        }
        rec_t *r = &recs[n_recs++];
        memset(r, 0, sizeof *r);
        json_t *t = json_object_get(o, "t"), *b = json_object_get(o, "b"), *p = json_object_get(o, "plain");
        r->cat = strdup(json_string_value(json_object_get(o, "cat")));
        r->expect_len = json_string_length(t);
        r->expect = malloc(r->expect_len + 1);
        memcpy(r->expect, json_string_value(t), r->expect_len);
        if (b) { /* raw bytes in hex */
            const char *h = json_string_value(b);
            r->text_len = strlen(h) / 2;
            r->text = malloc(r->text_len + 1);
            for (size_t i = 0; i < r->text_len; i++) {
                unsigned x;
                sscanf(h + 2 * i, "%2x", &x);
                r->text[i] = (char)x;
            }
        } else {
            r->text_len = r->expect_len;
            r->text = malloc(r->text_len + 1);
            memcpy(r->text, r->expect, r->text_len);
        }
        r->ids = json_ids(json_object_get(o, "ids"), &r->n_ids);
        if (p)
            r->plain = json_ids(p, &r->n_plain);
        json_decref(o);
    }
    free(buf);
}

static int setup(void **state)
{
    duet_tok_t *t;
    duet_err_t err = { 0 };
    if (duet_tok_create(tok_path, NULL, &t, &err) != DUET_OK) {
        fprintf(stderr, "%s\n", duet_err_text(&err));
        return -1;
    }
    *state = t;
    if (!recs)
        load_corpus();
    return 0;
}

static int teardown(void **state)
{
    duet_tok_t *t = *state;
    duet_tok_destroy(&t);
    return 0;
}

static void show_diff(const rec_t *r, size_t idx, const char *what, const int32_t *got, size_t ng,
                      const int32_t *want, size_t nw)
{
    size_t i = 0;
    while (i < ng && i < nw && got[i] == want[i])
        i++;
    fprintf(stderr, "  record %zu (%s, %zu bytes) %s: first difference at id %zu: got %d, want %d; text: %.60s\n",
            idx, r->cat, r->text_len, what, i, i < ng ? got[i] : -1, i < nw ? want[i] : -1, r->expect);
}

/* Every record, with one tokenizer; returns the number of failures. */
static size_t check_corpus(duet_tok_t *t, const char *label)
{
    size_t bad = 0, ids_total = 0;
    duet_err_t err = { 0 };
    for (size_t i = 0; i < n_recs; i++) {
        rec_t *r = &recs[i];
        bool ok = true;
        for (int special = 1; special >= 0; special--) {
            duet_tok_ids_t ids = { 0 };
            duet_tok_bytes_t back = { 0 };
            const int32_t *want = special || !r->plain ? r->ids : r->plain;
            size_t nw = special || !r->plain ? r->n_ids : r->n_plain;
            assert_int_equal(duet_tok_encode(t, r->text, r->text_len, special, &ids, &err), DUET_OK);
            if (ids.len != nw || memcmp(ids.ids, want, nw * sizeof *want)) {
                if (bad < 10)
                    show_diff(r, i, special ? "with added tokens" : "plain", ids.ids, ids.len, want, nw);
                ok = false;
            }
            assert_int_equal(duet_tok_decode(t, ids.ids, ids.len, false, &back, &err), DUET_OK);
            if (back.len != r->expect_len || memcmp(back.data, r->expect, back.len)) {
                if (bad < 10)
                    fprintf(stderr, "  record %zu (%s): decode(encode(s)) != s (%s)\n", i, r->cat,
                            special ? "with added tokens" : "plain");
                ok = false;
            }
            ids_total += ids.len;
            duet_tok_ids_fini(&ids);
            duet_tok_bytes_fini(&back);
        }
        bad += !ok;
    }
    printf("%s: %zu of %zu strings identical to the reference (%zu ids), round trip included\n", label,
           n_recs - bad, n_recs, ids_total);
    return bad;
}

static void test_corpus(void **state)
{
    assert_true(n_recs >= 10000);
    assert_int_equal(check_corpus(*state, "native splitters"), 0);
}

static void test_corpus_pcre2(void **state)
{
    duet_tok_t *t;
    duet_err_t err = { 0 };
    duet_tok_opts_t opts = { .force_pcre2 = true, .cache_entries = SIZE_MAX };
    assert_int_equal(duet_tok_create(tok_path, &opts, &t, &err), DUET_OK);
    assert_int_equal(check_corpus(t, "PCRE2 splitters, no cache"), 0);
    duet_tok_destroy(&t);
}

/* Concurrent encoders on one tokenizer with a tiny cache, so that they
 * evict and rewrite each other's entries all the time: ids stay exact. */
typedef struct {
    duet_tok_t *t;
    int dir;
    size_t bad;
} worker_t;

static void *worker(void *arg)
{
    worker_t *w = arg;
    for (size_t k = 0; k < n_recs; k++) {
        const rec_t *r = &recs[w->dir > 0 ? k : n_recs - 1 - k];
        duet_tok_ids_t ids = { 0 };
        if (duet_tok_encode(w->t, r->text, r->text_len, true, &ids, NULL) != DUET_OK || ids.len != r->n_ids ||
            memcmp(ids.ids, r->ids, ids.len * sizeof *ids.ids))
            w->bad++;
        duet_tok_ids_fini(&ids);
    }
    return NULL;
}

static void test_corpus_threads(void **state)
{
    duet_tok_t *t;
    duet_err_t err = { 0 };
    duet_tok_opts_t opts = { .cache_entries = 64 };
    pthread_t th[2];
    worker_t w[2];
    assert_int_equal(duet_tok_create(tok_path, &opts, &t, &err), DUET_OK);
    for (int i = 0; i < 2; i++) {
        w[i] = (worker_t){ .t = t, .dir = i ? -1 : 1 };
        assert_int_equal(pthread_create(&th[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(w[0].bad + w[1].bad, 0);
    duet_tok_destroy(&t);
}

static void test_special_ids(void **state)
{
    duet_tok_t *t = *state;
    static const struct { duet_tok_special_t which; int32_t id; } want[] = {
        { DUET_TOK_BOS, 0 }, { DUET_TOK_EOS, 1 }, { DUET_TOK_PAD, 2 }, { DUET_TOK_USER, 128803 },
        { DUET_TOK_ASSISTANT, 128804 }, { DUET_TOK_THINK, 128821 }, { DUET_TOK_THINK_END, 128822 },
        { DUET_TOK_DSML, 128825 }, { DUET_TOK_LATEST_REMINDER, 128828 },
    };
    assert_int_equal(duet_tok_vocab_size(t), 129280);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *s = duet_tok_special_text(want[i].which);
        size_t n;
        assert_int_equal(duet_tok_special_id(t, want[i].which), want[i].id);
        assert_int_equal(duet_tok_token_to_id(t, s, strlen(s)), want[i].id);
        assert_string_equal(duet_tok_id_to_token(t, want[i].id), s);
        const char *b = duet_tok_id_bytes(t, want[i].id, &n);
        assert_true(n == strlen(s) && !memcmp(b, s, n));
        assert_true(duet_tok_is_added(t, want[i].id));
    }
    /* BOS/EOS/PAD are special (skipped by skip_special); the chat markers are not */
    assert_true(duet_tok_is_special(t, 0) && duet_tok_is_special(t, 1));
    assert_false(duet_tok_is_special(t, 128821) || duet_tok_is_special(t, 128825));
    assert_int_equal(duet_tok_token_to_id(t, "Ġthe", strlen("Ġthe")) >= 0, 1);
    assert_null(duet_tok_id_to_token(t, 129280));
    assert_null(duet_tok_id_to_token(t, -1));
}

/* Added tokens both ways, and decode's skip_special. */
static void test_special_both_ways(void **state)
{
    duet_tok_t *t = *state;
    duet_err_t err = { 0 };
    const char *s = "<｜begin▁of▁sentence｜>hi<｜User｜>x<think>y</think><｜end▁of▁sentence｜>";
    duet_tok_ids_t on = { 0 }, off = { 0 };
    duet_tok_bytes_t b = { 0 };
    assert_int_equal(duet_tok_encode(t, s, strlen(s), true, &on, &err), DUET_OK);
    assert_int_equal(duet_tok_encode(t, s, strlen(s), false, &off, &err), DUET_OK);
    assert_int_equal(on.ids[0], 0);
    assert_int_equal(on.ids[on.len - 1], 1);
    for (size_t i = 0; i < off.len; i++)
        assert_false(duet_tok_is_added(t, off.ids[i]));
    assert_int_equal(duet_tok_decode(t, on.ids, on.len, true, &b, &err), DUET_OK);
    assert_true(b.len == strlen("hi<｜User｜>x<think>y</think>") &&
                !memcmp(b.data, "hi<｜User｜>x<think>y</think>", b.len));
    int32_t bogus = 1 << 20;
    size_t before = b.len;
    assert_int_equal(duet_tok_decode(t, &bogus, 1, false, &b, &err), DUET_ERR_RANGE);
    assert_int_equal(b.len, before);
    duet_tok_ids_fini(&on);
    duet_tok_ids_fini(&off);
    duet_tok_bytes_fini(&b);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS_GZ\n", argv[0]);
        return 2;
    }
    tok_path = argv[1];
    corpus_path = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_special_ids, setup, teardown),
        cmocka_unit_test_setup_teardown(test_special_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corpus, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corpus_pcre2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corpus_threads, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (size_t i = 0; i < n_recs; i++) {
        free(recs[i].cat);
        free(recs[i].text);
        free(recs[i].expect);
        free(recs[i].ids);
        free(recs[i].plain);
    }
    free(recs);
    return rc;
}
