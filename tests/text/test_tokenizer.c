/* Unit tests of the tokenizer on small synthetic tokenizer.json files: the
 * loader's typed errors, and the pre-tokenizer behaviours, regex
 * translation, added-token passes and id assignment that the DeepSeek file
 * does not exercise.  Expected ids come from the reference (`tokenizers`
 * 0.23.3) run on the same JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "tokenizer.h"

/* ---- a synthetic byte-level BPE ----------------------------------------- */

static void put_char(char *o, size_t *k, unsigned c)
{
    if (c < 0x80)
        o[(*k)++] = (char)c;
    else
        o[(*k)++] = (char)(0xC0 | c >> 6), o[(*k)++] = (char)(0x80 | (c & 63));
}

static unsigned byte_char(unsigned b)
{
    unsigned n = 0;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    for (unsigned x = 0; x < b; x++)
        n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    return 256 + n;
}

/* Vocabulary: the 256 byte characters (id = byte), then every pair of the
 * characters of "ab-' 1\n" (ids 256.., in the order of the merges). */
static json_t *synth_model(void)
{
    const char *alpha = "ab-' 1\n";
    json_t *vocab = json_object(), *merges = json_array();
    char s[8], m[16];
    int next = 256;
    for (unsigned b = 0; b < 256; b++) {
        size_t k = 0;
        put_char(s, &k, byte_char(b));
        s[k] = 0;
        json_object_set_new(vocab, s, json_integer(b));
    }
    for (const char *x = alpha; *x; x++)
        for (const char *y = alpha; *y; y++) {
            size_t kx = 0, ky = 0;
            char cx[4], cy[4];
            put_char(cx, &kx, byte_char((unsigned char)*x));
            put_char(cy, &ky, byte_char((unsigned char)*y));
            snprintf(m, sizeof m, "%.*s %.*s", (int)kx, cx, (int)ky, cy);
            json_array_append_new(merges, json_string(m));
            snprintf(s, sizeof s, "%.*s%.*s", (int)kx, cx, (int)ky, cy);
            json_object_set_new(vocab, s, json_integer(next++));
        }
    return json_pack("{s:s, s:o, s:o, s:n, s:n, s:n, s:b, s:b}", "type", "BPE", "vocab", vocab, "merges", merges,
                     "dropout", "unk_token", "continuing_subword_prefix", "fuse_unk", 0, "byte_fallback", 0);
}

static json_t *byte_level(bool use_regex)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                     "use_regex", use_regex);
}

static json_t *split_pre(const char *pattern, const char *behavior, bool invert, bool literal)
{
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", literal ? "String" : "Regex",
                              pattern, "behavior", behavior, "invert", invert);
    return json_pack("{s:s, s:[o, o]}", "type", "Sequence", "pretokenizers", split, byte_level(false));
}

static json_t *synth(json_t *pre, json_t *added)
{
    return json_pack("{s:s, s:o, s:n, s:o, s:n, s:o, s:o}", "version", "1.0", "added_tokens",
                     added ? added : json_array(), "normalizer", "pre_tokenizer", pre, "post_processor", "decoder",
                     byte_level(false), "model", synth_model());
}

/* Load `root` (consumed); returns the status, the tokenizer in *t on success. */
static duet_status_t load(json_t *root, duet_tok_t **t, duet_err_t *err, bool force_pcre2)
{
    char *s = json_dumps(root, 0);
    duet_tok_opts_t opts = { .force_pcre2 = force_pcre2 };
    duet_status_t st = duet_tok_create_from_json(s, strlen(s), "synth.json", &opts, t, err);
    free(s);
    json_decref(root);
    return st;
}

static bool roundtrip = true; /* off for behaviours that drop text */

static void expect_ids(duet_tok_t *t, const char *text, bool special, const int32_t *want, size_t n)
{
    duet_tok_ids_t ids = { 0 };
    duet_tok_bytes_t back = { 0 };
    duet_err_t err = { 0 };
    assert_int_equal(duet_tok_encode(t, text, strlen(text), special, &ids, &err), DUET_OK);
    if (ids.len != n || memcmp(ids.ids, want, n * sizeof *want)) {
        fprintf(stderr, "  \"%s\": got", text);
        for (size_t i = 0; i < ids.len; i++)
            fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, "\n");
        fail();
    }
    assert_int_equal(duet_tok_decode(t, ids.ids, ids.len, false, &back, &err), DUET_OK);
    assert_true(!roundtrip || (back.len == strlen(text) && !memcmp(back.data, text, back.len)));
    duet_tok_ids_fini(&ids);
    duet_tok_bytes_fini(&back);
}

#define IDS(...) ((const int32_t[]){ __VA_ARGS__ }), sizeof((const int32_t[]){ __VA_ARGS__ }) / sizeof(int32_t)

static const char *const inputs[] = { "a-b--a-", "--ab-", "a'b 11\n\nab", "-", "ab", "a b-1'", "ab--ba\n\n \n-" };

typedef struct {
    const int32_t *ids;
    size_t n;
} want_t;
#define W(...) { IDS(__VA_ARGS__) }

static void check_config(json_t *pre, const want_t *want)
{
    for (int pcre = 0; pcre < 2; pcre++) {
        duet_tok_t *t;
        duet_err_t err = { 0 };
        if (load(synth(json_deep_copy(pre), NULL), &t, &err, pcre) != DUET_OK)
            fail_msg("%s", duet_err_text(&err));
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
            if (want[i].n)
                expect_ids(t, inputs[i], true, want[i].ids, want[i].n);
        duet_tok_destroy(&t);
    }
    json_decref(pre);
}

static void test_split_behaviours(void **state)
{
    const want_t removed[] = { W(97, 98, 97), W(257), W(259, 267, 296, 304, 257), { NULL, 0 }, W(257),
                                      W(260, 98, 294), W(257, 98, 262, 10, 290) };
    const want_t merged_prev[] = { W(258, 265, 45, 258), W(45, 45, 257, 45), W(259, 267, 296, 304, 257),
                                          W(45), W(257), W(260, 265, 294), W(257, 45, 45, 98, 262, 10, 290, 45) };
    const want_t merged_next[] = { W(97, 271, 45, 270, 45), W(45, 45, 257, 45), W(259, 267, 296, 304, 257),
                                          W(45), W(257), W(260, 98, 275, 39), W(257, 45, 271, 262, 10, 290, 45) };
    const want_t contiguous[] = { W(97, 45, 98, 272, 97, 45), W(272, 257, 45), W(259, 267, 296, 304, 257),
                                         W(45), W(257), W(260, 98, 45, 294), W(257, 272, 98, 262, 10, 290, 45) };
    const want_t inverted[] = { W(97, 45, 98, 45, 45, 97, 45), W(45, 45, 257, 45), W(259, 267, 296, 304, 257),
                                       W(45), W(257), W(260, 98, 45, 294), W(257, 45, 45, 98, 262, 10, 290, 45) };
    const want_t literal[] = { W(258, 98, 272, 258), W(272, 257, 45), W(259, 267, 296, 304, 257), W(45),
                                      W(257), W(260, 265, 294), W(257, 272, 98, 262, 10, 290, 45) };
    const want_t lookahead[] = { W(97, 271, 45, 270, 45), W(45, 45, 257, 45), W(259, 267, 296, 304, 257),
                                        W(45), W(257), W(260, 98, 275, 39), W(257, 45, 271, 262, 10, 290, 45) };
    roundtrip = false;
    check_config(split_pre("-", "Removed", false, false), removed);
    roundtrip = true;
    check_config(split_pre("-", "MergedWithPrevious", false, false), merged_prev);
    check_config(split_pre("-", "MergedWithNext", false, false), merged_next);
    check_config(split_pre("-", "Contiguous", false, false), contiguous);
    check_config(split_pre("-", "Isolated", true, false), inverted);
    check_config(split_pre("--", "Isolated", false, true), literal);
    check_config(split_pre("(?=-)", "Isolated", false, false), lookahead); /* empty matches */
}

static void test_regex_translation(void **state)
{
    const want_t gpt2[] = { W(97, 45, 98, 272, 97, 45), W(272, 257, 45), W(97, 39, 98, 289, 49, 10, 10, 257),
                                   W(45), W(257), W(97, 285, 45, 49, 39), W(257, 272, 263, 10, 302, 10, 45) };
    const want_t word[] = { W(97, 45, 98, 272, 97, 45), W(272, 257, 45), W(97, 39, 98, 32, 296, 304, 257),
                                   W(45), W(257), W(97, 32, 98, 45, 49, 39), W(257, 272, 263, 304, 290, 45) };
    check_config(byte_level(true), gpt2); /* ByteLevel(use_regex): \s, \p{L}, \p{N}, (?!\S) */
    check_config(split_pre("\\w+", "Isolated", false, false), word);
}

/* Non-normalized added tokens are extracted before normalized ones, ids
 * are assigned as the reference assigns them, and allow_special=false
 * leaves all of them as text. */
static void test_added_tokens(void **state)
{
    duet_tok_t *t;
    duet_err_t err = { 0 };
    json_t *added = json_pack("[{s:i, s:s, s:b, s:b}, {s:i, s:s, s:b, s:b}, {s:i, s:s, s:b, s:b}, {s:i, s:s, s:b, s:b}]",
                              "id", 400, "content", "<x>", "special", 1, "normalized", 0,
                              "id", 401, "content", "<xy>", "special", 0, "normalized", 1,
                              "id", 402, "content", "y>", "special", 0, "normalized", 0,
                              "id", 9, "content", "ab", "special", 0, "normalized", 0);
    assert_int_equal(load(synth(split_pre("-", "Isolated", false, false), added), &t, &err, false), DUET_OK);
    assert_int_equal(duet_tok_token_to_id(t, "<x>", 3), 305);
    assert_int_equal(duet_tok_token_to_id(t, "<xy>", 4), 306);
    assert_int_equal(duet_tok_token_to_id(t, "ab", 2), 257); /* a vocabulary token keeps its id */
    assert_int_equal(duet_tok_vocab_size(t), 308);
    expect_ids(t, "a<xy>b<x>-<x", true, IDS(97, 60, 120, 307, 98, 305, 45, 60, 120));
    expect_ids(t, "<x<xy>>", true, IDS(60, 120, 60, 120, 307, 62));
    expect_ids(t, "a<x>b", false, IDS(97, 60, 120, 62, 98));
    duet_tok_bytes_t b = { 0 };
    int32_t ids[] = { 97, 305, 306, 98 };
    assert_int_equal(duet_tok_decode(t, ids, 4, true, &b, &err), DUET_OK);
    assert_true(b.len == 6 && !memcmp(b.data, "a<xy>b", 6));
    duet_tok_bytes_fini(&b);
    duet_tok_destroy(&t);
}

/* ---- loader errors ------------------------------------------------------- */

static void expect_error(json_t *root, duet_status_t want, const char *needle)
{
    duet_tok_t *t = NULL;
    duet_err_t err = { 0 };
    duet_status_t st = load(root, &t, &err, false);
    if (st != want || !strstr(err.msg, "synth.json") || !strstr(err.msg, needle))
        fail_msg("got %s, want %s with \"%s\"", duet_err_text(&err), duet_status_code(want), needle);
    assert_null(t);
}

static json_t *with(json_t *root, const char *path, json_t *v)
{
    /* path "a" or "a.b" */
    const char *dot = strchr(path, '.');
    if (!dot) {
        json_object_set_new(root, path, v);
    } else {
        char k[64];
        snprintf(k, sizeof k, "%.*s", (int)(dot - path), path);
        json_object_set_new(json_object_get(root, k), dot + 1, v);
    }
    return root;
}

static json_t *base(void)
{
    return synth(split_pre("-", "Isolated", false, false), NULL);
}

static void test_load_errors(void **state)
{
    duet_tok_t *t = NULL;
    duet_err_t err = { 0 };
    assert_int_equal(duet_tok_create("/nonexistent/tokenizer.json", NULL, &t, &err), DUET_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json"));
    assert_null(t);
    assert_int_equal(duet_tok_create_from_json("{\"model\": [1,", 13, "bad.json", NULL, &t, &err), DUET_ERR_PARSE);
    assert_non_null(strstr(err.msg, "bad.json"));
    assert_non_null(strstr(err.msg, "line 1"));
    assert_int_equal(duet_tok_create_from_json("[]", 2, "arr.json", NULL, &t, &err), DUET_ERR_PARSE);

    expect_error(with(base(), "model.type", json_string("WordPiece")), DUET_ERR_UNSUPPORTED, "WordPiece");
    expect_error(with(base(), "model", json_string("x")), DUET_ERR_PARSE, "model");
    expect_error(with(base(), "model.vocab", json_array()), DUET_ERR_PARSE, "model.vocab");
    expect_error(with(base(), "model.merges", json_pack("[s]", "a zzz")), DUET_ERR_CONFIG, "zzz");
    expect_error(with(base(), "model.merges", json_pack("[[s,s]]", "qq", "a")), DUET_ERR_CONFIG, "qq");
    /* both parts known, the merged token is not */
    expect_error(with(base(), "model.merges", json_pack("[s]", "x y")), DUET_ERR_CONFIG, "xy");
    expect_error(with(base(), "model.merges", json_pack("[s]", "a b c")), DUET_ERR_PARSE, "merges[0]");
    expect_error(with(base(), "model.merges", json_pack("[i]", 3)), DUET_ERR_PARSE, "merges[0]");
    expect_error(with(base(), "model.dropout", json_real(0.1)), DUET_ERR_UNSUPPORTED, "dropout");
    expect_error(with(base(), "model.byte_fallback", json_true()), DUET_ERR_UNSUPPORTED, "byte_fallback");
    expect_error(with(base(), "model.unk_token", json_string("<unk>")), DUET_ERR_CONFIG, "<unk>");
    json_t *v = base();
    json_object_set_new(json_object_get(json_object_get(v, "model"), "vocab"), "zz", json_string("7"));
    expect_error(v, DUET_ERR_PARSE, "model.vocab");
    v = base();
    json_object_set_new(json_object_get(json_object_get(v, "model"), "vocab"), "zz", json_integer(-4));
    expect_error(v, DUET_ERR_CONFIG, "-4");
    v = base();
    json_object_set_new(json_object_get(json_object_get(v, "model"), "vocab"), "zz", json_integer(5));
    expect_error(v, DUET_ERR_CONFIG, "id 5");

    expect_error(with(base(), "normalizer", json_pack("{s:s}", "type", "NFKC")), DUET_ERR_UNSUPPORTED, "NFKC");
    expect_error(with(base(), "decoder", json_null()), DUET_ERR_UNSUPPORTED, "decoder");
    expect_error(with(base(), "pre_tokenizer", json_null()), DUET_ERR_UNSUPPORTED, "ByteLevel");
    expect_error(with(base(), "pre_tokenizer", json_pack("{s:s}", "type", "Metaspace")), DUET_ERR_UNSUPPORTED,
                 "Metaspace");
    expect_error(with(base(), "pre_tokenizer", json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex",
                                                         "(", "behavior", "Isolated")),
                 DUET_ERR_UNSUPPORTED, "regex");
    expect_error(with(base(), "pre_tokenizer", json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex",
                                                         "a", "behavior", "Sideways")),
                 DUET_ERR_UNSUPPORTED, "Sideways");
    expect_error(with(base(), "pre_tokenizer", json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex",
                                                         "[^\\S]", "behavior", "Isolated")),
                 DUET_ERR_UNSUPPORTED, "\\S");
    expect_error(with(base(), "pre_tokenizer", json_pack("{s:s, s:b}", "type", "ByteLevel", "add_prefix_space", 1)),
                 DUET_ERR_UNSUPPORTED, "add_prefix_space");
    expect_error(with(base(), "added_tokens", json_pack("[{s:i, s:s, s:b}]", "id", 300, "content", "<a>", "lstrip", 1)),
                 DUET_ERR_UNSUPPORTED, "lstrip");
    expect_error(with(base(), "added_tokens", json_pack("[{s:s, s:s}]", "id", "x", "content", "<a>")), DUET_ERR_PARSE,
                 "added_tokens[0]");
    expect_error(with(base(), "added_tokens", json_pack("[{s:i}]", "id", 300)), DUET_ERR_PARSE, "content");
}

/* Invalid UTF-8 becomes U+FFFD per maximal ill-formed subpart before
 * encoding, as bytes.decode("utf-8", "replace") does. */
static void test_invalid_utf8(void **state)
{
    static const struct { const char *in, *out; } cases[] = {
        { "a\x80" "b", "a\xEF\xBF\xBD" "b" },
        { "\xE2\x82", "\xEF\xBF\xBD" },                                   /* truncated: one U+FFFD */
        { "\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },      /* surrogate: three */
        { "\xF0\x9F\x98" "x", "\xEF\xBF\xBD" "x" },
        { "\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD" },                      /* overlong */
        { "\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },
        { "\xE0\xA0", "\xEF\xBF\xBD" },
    };
    duet_tok_t *t;
    duet_err_t err = { 0 };
    assert_int_equal(load(base(), &t, &err, false), DUET_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        duet_tok_ids_t a = { 0 }, b = { 0 };
        assert_int_equal(duet_tok_encode(t, cases[i].in, strlen(cases[i].in), true, &a, &err), DUET_OK);
        assert_int_equal(duet_tok_encode(t, cases[i].out, strlen(cases[i].out), true, &b, &err), DUET_OK);
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.ids, b.ids, a.len * sizeof *a.ids);
        duet_tok_ids_fini(&a);
        duet_tok_ids_fini(&b);
    }
    duet_tok_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_behaviours),
        cmocka_unit_test(test_regex_translation),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_invalid_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
