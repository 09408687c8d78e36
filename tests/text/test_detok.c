/* Streaming detokenizer on a fake vocabulary: multi-byte characters split
 * across tokens, an emoji over four tokens, invalid bytes (against outputs of
 * Python's bytes.decode("utf-8", errors="replace")), special tokens skipped
 * or kept, stop strings spanning one to four tokens, at the very start and
 * overlapping, and chunked feeding equal to one-at-a-time feeding. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "detok.h"

/* ------------------------------------------------------------ vocabulary */

enum {
    T_HELLO, T_WORLD, T_ZH1, T_ZH2, T_E1, T_E2, T_E3, T_E4, T_FF, T_EOS, T_THINK, T_BANG,
    T_A, T_B, T_C, T_D, T_AB, T_CD, T_NL, T_EMPTY, T_E4LEAD, T_UPA, T_STOP, T_FFFD, T_COUNT
};

static const struct {
    const char *bytes;
    int special;
} fixed[T_COUNT] = {
    [T_HELLO] = {"Hello", 0},
    [T_WORLD] = {" world", 0},
    [T_ZH1] = {"\xe4\xb8", 0},    /* U+4E2D split 2 + 1 */
    [T_ZH2] = {"\xad", 0},
    [T_E1] = {"\xf0", 0},         /* U+1F600 over four tokens */
    [T_E2] = {"\x9f", 0},
    [T_E3] = {"\x98", 0},
    [T_E4] = {"\x80", 0},
    [T_FF] = {"\xff", 0},
    [T_EOS] = {"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", 1},
    [T_THINK] = {"<think>", 1},
    [T_BANG] = {"!", 0},
    [T_A] = {"a", 0},
    [T_B] = {"b", 0},
    [T_C] = {"c", 0},
    [T_D] = {"d", 0},
    [T_AB] = {"ab", 0},
    [T_CD] = {"cd", 0},
    [T_NL] = {"\n", 0},
    [T_EMPTY] = {"", 0},
    [T_E4LEAD] = {"\xe4", 0},
    [T_UPA] = {"A", 0},
    [T_STOP] = {"STOP", 0},
    [T_FFFD] = {"\xef\xbf\xbd", 0},
};

/* Ids T_COUNT.. are single bytes 0..255 (for random streams). */
#define BYTE_ID(b) (T_COUNT + (b))
#define VOCAB_SIZE (T_COUNT + 256)

static uint8_t byte_tokens[256];

static const uint8_t *fake_bytes(void *arg, int32_t id, size_t *len)
{
    (void)arg;
    if (id < 0 || id >= VOCAB_SIZE)
        return NULL;
    if (id >= T_COUNT) {
        *len = 1;
        return &byte_tokens[id - T_COUNT];
    }
    *len = strlen(fixed[id].bytes);
    return (const uint8_t *)fixed[id].bytes;
}

static int fake_special(void *arg, int32_t id)
{
    (void)arg;
    return id >= 0 && id < T_COUNT && fixed[id].special;
}

static const duet_detok_vocab_t vocab = {fake_bytes, fake_special, NULL};

/* ------------------------------------------------------------ helpers */

typedef struct {
    char text[4096];
    size_t len;
    int stopped;
    duet_detok_stop_t where;
} out_t;

/* Feed ids in chunks of `chunk` (0: all at once), then finish. */
static void run(out_t *o, const int32_t *ids, size_t n, size_t chunk, int skip, const char *const *stop, size_t nstop)
{
    duet_detok_opts_t opts = {.skip_special_tokens = skip, .stop = stop, .n_stop = nstop};
    duet_detok_t *d = NULL;
    const char *t;
    size_t l;
    memset(o, 0, sizeof *o);
    assert_int_equal(duet_detok_create(&vocab, &opts, &d), DUET_OK);
    size_t at = 0;
    do {
        size_t k = chunk && n - at > chunk ? chunk : n - at;
        assert_int_equal(duet_detok_feed(d, ids + at, k, &t, &l), DUET_OK);
        assert_true(o->len + l < sizeof o->text);
        memcpy(o->text + o->len, t, l);
        o->len += l;
        at += k;
    } while (at < n);
    assert_int_equal(duet_detok_finish(d, &t, &l), DUET_OK);
    memcpy(o->text + o->len, t, l);
    o->len += l;
    o->text[o->len] = '\0';
    assert_int_equal(duet_detok_emitted(d), o->len);
    o->stopped = duet_detok_stopped(d, &o->where);
    assert_int_equal(duet_detok_feed(d, ids, n ? 1 : 0, &t, &l), DUET_ERR_STATE);
    duet_detok_destroy(&d);
    assert_null(d);
}

/* Same result fed one id at a time, all at once, and in chunks of 3. */
static void run_all_ways(out_t *o, const int32_t *ids, size_t n, int skip, const char *const *stop, size_t nstop)
{
    out_t b, c;
    run(o, ids, n, 1, skip, stop, nstop);
    run(&b, ids, n, 0, skip, stop, nstop);
    run(&c, ids, n, 3, skip, stop, nstop);
    assert_string_equal(o->text, b.text);
    assert_string_equal(o->text, c.text);
    assert_int_equal(o->stopped, b.stopped);
    assert_int_equal(o->where.stop_index, b.where.stop_index);
    assert_int_equal(o->where.text_offset, b.where.text_offset);
    assert_int_equal(o->where.token_index, b.where.token_index);
    assert_int_equal(o->where.token_index, c.where.token_index);
}

static size_t unhex(const char *h, uint8_t *out)
{
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return n;
}

/* ------------------------------------------------------------ tests */

static void test_utf8_scan(void **state)
{
    (void)state;
    uint32_t cp;
    assert_int_equal(duet_utf8_scan((const uint8_t *)"", 0, &cp), 0);
    assert_int_equal(duet_utf8_scan((const uint8_t *)"A", 1, &cp), 1);
    assert_int_equal(cp, 'A');
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xe4\xb8\xad", 3, &cp), 3);
    assert_int_equal(cp, 0x4e2d);
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xf4\x8f\xbf\xbf", 4, &cp), 4);
    assert_int_equal(cp, 0x10ffff);
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xe4\xb8", 2, &cp), 0);        /* may complete */
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xf0\x9f\x98", 3, &cp), 0);
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xe4\xb8" "A", 3, &cp), -2);   /* maximal subpart */
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xe0\x80", 2, &cp), -1);       /* overlong */
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xed\xa0\x80", 3, &cp), -1);   /* surrogate */
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xf4\x90", 2, &cp), -1);       /* > U+10FFFF */
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xc0\x80", 2, &cp), -1);
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\x80", 1, &cp), -1);
    assert_int_equal(duet_utf8_scan((const uint8_t *)"\xff", 1, &cp), -1);
}

/* Outputs of Python's bytes.decode("utf-8", errors="replace"), as hex. */
static const char *const python_replace[][2] = {
    {"e4b8ad", "e4b8ad"},
    {"e4b8", "efbfbd"},
    {"e4b841", "efbfbd41"},
    {"ff", "efbfbd"},
    {"c080", "efbfbdefbfbd"},
    {"c1bf", "efbfbdefbfbd"},
    {"e08080", "efbfbdefbfbdefbfbd"},
    {"e0a080", "e0a080"},
    {"eda080", "efbfbdefbfbdefbfbd"},
    {"ed9fbf", "ed9fbf"},
    {"f0808080", "efbfbdefbfbdefbfbdefbfbd"},
    {"f09f98", "efbfbd"},
    {"f09f9841", "efbfbd41"},
    {"f4908080", "efbfbdefbfbdefbfbdefbfbd"},
    {"f580", "efbfbdefbfbd"},
    {"8080", "efbfbdefbfbd"},
    {"f09f9880", "f09f9880"},
    {"61f09f628063", "61efbfbd62efbfbd63"},
    {"e4e4b8ad", "efbfbde4b8ad"},
    {"f48fbfbf", "f48fbfbf"},
    {"c2", "efbfbd"},
    {"f0eff09f9880c3a98fc2", "efbfbdefbfbdf09f9880c3a9efbfbdefbfbd"},
    {"f020f141edbfefa09fffed", "efbfbd20efbfbd41efbfbdefbfbdefa09fefbfbdefbfbd"},
    {"efeddff48fa0f48fee", "efbfbdefbfbdefbfbdefbfbdefbfbdefbfbd"},
    {"41f520e4b8adf09f9880c3a990f07ac0", "41efbfbd20e4b8adf09f9880c3a9efbfbdefbfbd7aefbfbd"},
    {"edf1dfffe0", "efbfbdefbfbdefbfbdefbfbdefbfbd"},
    {"f0e18fc2807a8f", "efbfbdefbfbdc2807aefbfbd"},
    {"9fbff5e0f09f9880c3a9f4c0e0ee", "efbfbdefbfbdefbfbdefbfbdf09f9880c3a9efbfbdefbfbdefbfbdefbfbd"},
    {"c2eff0e0f0a0c1f541bf", "efbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbd41efbfbd"},
    {"f5ff90ffc1eff0f080ff", "efbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbd"},
    {"9ff4f0bfc0adf09f9880c3a98020edf4ed20", "efbfbdefbfbdefbfbdefbfbdefbfbdf09f9880c3a9efbfbd20efbfbdefbfbdefbfbd20"},
    {"e08f", "efbfbdefbfbd"},
    {"e0807aadf09f9880c3a9f1f17adf", "efbfbdefbfbd7aefbfbdf09f9880c3a9efbfbdefbfbd7aefbfbd"},
    {"bfeea07ac0412080f1", "efbfbdefbfbd7aefbfbd4120efbfbdefbfbd"},
    {"7a9fe0c0f1bf8fff7a", "7aefbfbdefbfbdefbfbdefbfbdefbfbd7a"},
    {"c1c28ff09f9880c3a9dfdfe1", "efbfbdc28ff09f9880c3a9efbfbdefbfbdefbfbd"},
    {"f1f5ef80f1eebfe0f4ffa0", "efbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbd"},
    {"41e0f0b8adf09f9880c3a9c141df", "41efbfbdefbfbdf09f9880c3a9efbfbd41efbfbd"},
    {"c1e1c2f5c2f1ffbfed41f0", "efbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbd41efbfbd"},
    {"90c290c1c2f1", "efbfbdc290efbfbdefbfbdefbfbd"},
    {"c0dfb8adf09f9880c3a98041f0", "efbfbddfb8efbfbdf09f9880c3a9efbfbd41efbfbd"},
    {"a0e19020c1f49ff0e1bfa0", "efbfbdefbfbd20efbfbdefbfbdefbfbdefbfbde1bfa0"},
    {"20f1c2f08fe0c0eebfe1c2", "20efbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbdefbfbd"},
    {"e0c0e0f0e07ae08f9f41ed", "efbfbdefbfbdefbfbdefbfbdefbfbd7aefbfbdefbfbdefbfbd41efbfbd"},
    {"eee0efffa0adf09f9880c3a97ae1f5eec0", "efbfbdefbfbdefbfbdefbfbdefbfbdefbfbdf09f9880c3a97aefbfbdefbfbdefbfbdefbfbd"},
    {"8090eec0a0f541eeefe07af1", "efbfbdefbfbdefbfbdefbfbdefbfbdefbfbd41efbfbdefbfbdefbfbd7aefbfbd"},
    {"efedb8adf09f9880c3a97ac2a0", "efbfbdefbfbdefbfbdefbfbdf09f9880c3a97ac2a0"},
};

static void test_replacement_matches_python(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof python_replace / sizeof python_replace[0]; k++) {
        uint8_t in[64], want[256];
        size_t n = unhex(python_replace[k][0], in), wn = unhex(python_replace[k][1], want);
        int32_t ids[64];
        for (size_t i = 0; i < n; i++) {
            byte_tokens[in[i]] = in[i];
            ids[i] = BYTE_ID(in[i]);
        }
        out_t o;
        run_all_ways(&o, ids, n, 0, NULL, 0);
        if (o.len != wn || memcmp(o.text, want, wn) != 0)
            fprintf(stderr, "case %s\n", python_replace[k][0]);
        assert_int_equal(o.len, wn);
        assert_memory_equal(o.text, want, wn);
    }
}

static void test_split_characters(void **state)
{
    (void)state;
    duet_detok_t *d = NULL;
    const char *t;
    size_t l;
    assert_int_equal(duet_detok_create(&vocab, NULL, &d), DUET_OK);
    int32_t zh[] = {T_ZH1, T_ZH2};
    assert_int_equal(duet_detok_feed(d, &zh[0], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 0); /* never half a character */
    assert_int_equal(duet_detok_feed(d, &zh[1], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 3);
    assert_memory_equal(t, "\xe4\xb8\xad", 3);
    int32_t emoji[] = {T_E1, T_E2, T_E3, T_E4};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(duet_detok_feed(d, &emoji[k], 1, &t, &l), DUET_OK);
        assert_int_equal(l, 0);
    }
    assert_int_equal(duet_detok_feed(d, &emoji[3], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 4);
    assert_memory_equal(t, "\xf0\x9f\x98\x80", 4);
    /* a lead byte followed by ASCII: U+FFFD as soon as the ASCII arrives */
    int32_t bad[] = {T_E4LEAD, T_UPA, T_FF, T_EMPTY, T_E1, T_E2};
    assert_int_equal(duet_detok_feed(d, &bad[0], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 0);
    assert_int_equal(duet_detok_feed(d, &bad[1], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 4);
    assert_memory_equal(t, "\xef\xbf\xbd" "A", 4);
    assert_int_equal(duet_detok_feed(d, &bad[2], 3, &t, &l), DUET_OK); /* FF, empty, F0 */
    assert_int_equal(l, 3);
    assert_memory_equal(t, "\xef\xbf\xbd", 3);
    assert_int_equal(duet_detok_feed(d, &bad[5], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 0);
    /* the stream ends inside a character: one U+FFFD */
    assert_int_equal(duet_detok_finish(d, &t, &l), DUET_OK);
    assert_int_equal(l, 3);
    assert_memory_equal(t, "\xef\xbf\xbd", 3);
    assert_int_equal(duet_detok_finish(d, &t, &l), DUET_ERR_STATE);
    assert_int_equal(duet_detok_emitted(d), 3 + 4 + 4 + 3 + 3);
    duet_detok_destroy(&d);
}

static void test_special_tokens(void **state)
{
    (void)state;
    int32_t ids[] = {T_THINK, T_HELLO, T_EOS, T_WORLD, T_ZH1, T_EOS, T_ZH2};
    out_t o;
    run_all_ways(&o, ids, 7, 1, NULL, 0);
    assert_string_equal(o.text, "Hello world\xe4\xb8\xad"); /* skipped: the split character joins */
    run_all_ways(&o, ids, 7, 0, NULL, 0);
    assert_string_equal(o.text, "<think>Hello<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c> world"
                                "\xef\xbf\xbd<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>\xef\xbf\xbd");
    /* skipped tokens still count for token_index */
    const char *stop[] = {"wor"};
    run_all_ways(&o, ids, 7, 1, stop, 1);
    assert_string_equal(o.text, "Hello ");
    assert_int_equal(o.where.token_index, 3);
}

static void test_stop_strings(void **state)
{
    (void)state;
    out_t o;
    /* within one token */
    {
        int32_t ids[] = {T_HELLO, T_WORLD, T_BANG};
        const char *stop[] = {"world"};
        run_all_ways(&o, ids, 3, 0, stop, 1);
        assert_string_equal(o.text, "Hello ");
        assert_true(o.stopped);
        assert_int_equal(o.where.stop_index, 0);
        assert_int_equal(o.where.text_offset, 6);
        assert_int_equal(o.where.token_index, 1);
    }
    /* across two tokens */
    {
        int32_t ids[] = {T_HELLO, T_WORLD, T_BANG};
        const char *stop[] = {"xyz", "lo wo"};
        run_all_ways(&o, ids, 3, 0, stop, 2);
        assert_string_equal(o.text, "Hel");
        assert_int_equal(o.where.stop_index, 1);
        assert_int_equal(o.where.text_offset, 3);
        assert_int_equal(o.where.token_index, 1);
    }
    /* across three and four tokens */
    {
        int32_t ids[] = {T_NL, T_A, T_B, T_C, T_D, T_NL};
        const char *stop3[] = {"abc"}, *stop4[] = {"\nabc"};
        run_all_ways(&o, ids, 6, 0, stop3, 1);
        assert_string_equal(o.text, "\n");
        assert_int_equal(o.where.token_index, 3);
        run_all_ways(&o, ids, 6, 0, stop4, 1);
        assert_string_equal(o.text, "");
        assert_int_equal(o.where.text_offset, 0);
        assert_int_equal(o.where.token_index, 3);
        int32_t emoji[] = {T_HELLO, T_E1, T_E2, T_E3, T_E4, T_BANG};
        const char *stop_e[] = {"\xf0\x9f\x98\x80"};
        run_all_ways(&o, emoji, 6, 0, stop_e, 1);
        assert_string_equal(o.text, "Hello");
        assert_int_equal(o.where.token_index, 4);
        int32_t zh[] = {T_A, T_ZH1, T_ZH2};
        const char *stop_zh[] = {"\xe4\xb8\xad"};
        run_all_ways(&o, zh, 3, 0, stop_zh, 1);
        assert_string_equal(o.text, "a");
    }
    /* at the very start */
    {
        int32_t ids[] = {T_STOP, T_HELLO};
        const char *stop[] = {"STOP"};
        run_all_ways(&o, ids, 2, 0, stop, 1);
        assert_string_equal(o.text, "");
        assert_true(o.stopped);
        assert_int_equal(o.where.text_offset, 0);
        assert_int_equal(o.where.token_index, 0);
    }
    /* overlapping: the stop string that ends first wins */
    {
        int32_t ids[] = {T_A, T_B, T_C, T_D};
        const char *stop[] = {"abcd", "bc"};
        run_all_ways(&o, ids, 4, 0, stop, 2);
        assert_string_equal(o.text, "a");
        assert_int_equal(o.where.stop_index, 1);
        int32_t one[] = {T_AB, T_CD};
        run_all_ways(&o, one, 2, 0, stop, 2);
        assert_string_equal(o.text, "a");
        assert_int_equal(o.where.stop_index, 1);
        assert_int_equal(o.where.token_index, 1);
        /* same end: the longer (earlier start) wins */
        const char *same[] = {"bc", "abc"};
        run_all_ways(&o, ids, 4, 0, same, 2);
        assert_string_equal(o.text, "");
        assert_int_equal(o.where.stop_index, 1);
        /* a stop string that is a prefix of another */
        const char *pre[] = {"abcd", "ab"};
        run_all_ways(&o, ids, 4, 0, pre, 2);
        assert_string_equal(o.text, "");
        assert_int_equal(o.where.stop_index, 1);
        assert_int_equal(o.where.token_index, 1);
        /* self-overlapping */
        int32_t aab[] = {T_A, T_A, T_A, T_B};
        const char *aabs[] = {"aab"};
        run_all_ways(&o, aab, 4, 0, aabs, 1);
        assert_string_equal(o.text, "a");
    }
    /* a stop string made of a replacement character */
    {
        int32_t ids[] = {T_HELLO, T_E4LEAD, T_UPA};
        const char *stop[] = {"\xef\xbf\xbd" "A"};
        run_all_ways(&o, ids, 3, 0, stop, 1);
        assert_string_equal(o.text, "Hello");
        int32_t lit[] = {T_HELLO, T_FFFD, T_UPA};
        run_all_ways(&o, lit, 3, 0, stop, 1);
        assert_string_equal(o.text, "Hello");
        /* U+FFFD made at the end of the stream can complete a stop string */
        const char *end[] = {"o\xef\xbf\xbd"};
        int32_t tail[] = {T_HELLO, T_E1, T_E2};
        run_all_ways(&o, tail, 3, 0, end, 1);
        assert_string_equal(o.text, "Hell");
        assert_int_equal(o.where.token_index, 2);
    }
    /* no match: held-back text comes out at the end */
    {
        int32_t ids[] = {T_HELLO, T_WORLD};
        const char *stop[] = {"world!", "d?"};
        run_all_ways(&o, ids, 2, 0, stop, 2);
        assert_string_equal(o.text, "Hello world");
        assert_false(o.stopped);
        assert_int_equal(o.where.stop_index, -1);
    }
}

/* Text that could start a stop string is held back until decided. */
static void test_holdback(void **state)
{
    (void)state;
    const char *stop[] = {"world!"};
    duet_detok_opts_t opts = {.stop = stop, .n_stop = 1};
    duet_detok_t *d = NULL;
    const char *t;
    size_t l;
    assert_int_equal(duet_detok_create(&vocab, &opts, &d), DUET_OK);
    int32_t ids[] = {T_HELLO, T_WORLD, T_HELLO, T_WORLD, T_BANG, T_HELLO};
    assert_int_equal(duet_detok_feed(d, &ids[0], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 5);
    assert_int_equal(duet_detok_feed(d, &ids[1], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 1); /* " " out, "world" held */
    assert_memory_equal(t, " ", 1);
    assert_int_equal(duet_detok_feed(d, &ids[2], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 10);
    assert_memory_equal(t, "worldHello", 10);
    assert_int_equal(duet_detok_feed(d, &ids[3], 2, &t, &l), DUET_OK);
    assert_int_equal(l, 1);
    assert_true(duet_detok_stopped(d, NULL));
    /* nothing after the stop string is ever returned */
    assert_int_equal(duet_detok_feed(d, &ids[5], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 0);
    assert_int_equal(duet_detok_finish(d, &t, &l), DUET_OK);
    assert_int_equal(l, 0);
    assert_int_equal(duet_detok_emitted(d), 17);
    duet_detok_destroy(&d);
}

static void test_errors(void **state)
{
    (void)state;
    duet_detok_t *d = NULL;
    const char *empty[] = {""}, *bad[] = {"\xe4\xb8"}, *none[] = {NULL};
    duet_detok_opts_t o = {.stop = empty, .n_stop = 1};
    assert_int_equal(duet_detok_create(&vocab, &o, &d), DUET_ERR_INVALID);
    o.stop = bad;
    assert_int_equal(duet_detok_create(&vocab, &o, &d), DUET_ERR_INVALID);
    o.stop = none;
    assert_int_equal(duet_detok_create(&vocab, &o, &d), DUET_ERR_INVALID);
    duet_detok_vocab_t novocab = {0};
    assert_int_equal(duet_detok_create(&novocab, NULL, &d), DUET_ERR_INVALID);
    assert_null(d);
    duet_detok_destroy(&d);
    duet_detok_destroy(NULL);

    /* an id outside the vocabulary stops the feed there */
    assert_int_equal(duet_detok_create(&vocab, NULL, &d), DUET_OK);
    int32_t ids[] = {T_HELLO, VOCAB_SIZE, T_WORLD};
    const char *t;
    size_t l;
    assert_int_equal(duet_detok_feed(d, ids, 3, &t, &l), DUET_ERR_RANGE);
    assert_int_equal(l, 5);
    assert_memory_equal(t, "Hello", 5);
    int32_t neg = -1;
    assert_int_equal(duet_detok_feed(d, &neg, 1, &t, &l), DUET_ERR_RANGE);
    assert_int_equal(duet_detok_feed(d, &ids[2], 1, &t, &l), DUET_OK);
    assert_int_equal(l, 6);
    assert_int_equal(duet_detok_feed(d, NULL, 0, &t, &l), DUET_OK);
    assert_int_equal(l, 0);
    duet_detok_destroy(&d);
}

/* Random byte streams and stop strings: feeding in any chunks gives the same
 * text and stop; the text matches a plain decode cut at the first stop. */
static void test_random_streams(void **state)
{
    (void)state;
    static const uint8_t pool[] = {'a', 'b', ' ', 0x80, 0x9f, 0xa0, 0xbf, 0xc3, 0xa9, 0xe4, 0xb8, 0xad, 0xf0, 0x9f, 0x98,
                                   0xff, 0xed};
    for (int b = 0; b < 256; b++)
        byte_tokens[b] = (uint8_t)b;
    uint64_t s = 99;
    for (int trial = 0; trial < 2000; trial++) {
        int32_t ids[40];
        size_t n = 0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = 1 + (s >> 33) % 40;
        for (size_t i = 0; i < len; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[n++] = (s >> 40) % 5 == 0 ? (int32_t)((s >> 20) % T_COUNT) : BYTE_ID(pool[(s >> 33) % sizeof pool]);
        }
        static const char *const stops[] = {"ab", "b a", "\xc3\xa9", "\xef\xbf\xbd\xef\xbf\xbd", "a", "Hello w", "\xe4\xb8\xad"};
        size_t first = (s >> 13) % 7, nstop = (s >> 17) % 3;
        if (first + nstop > 7)
            nstop = 7 - first;
        out_t o, plain;
        run_all_ways(&o, ids, n, (int)(s >> 23) & 1, stops + first, nstop);
        run(&plain, ids, n, 0, (int)(s >> 23) & 1, NULL, 0);
        /* the result is the plain text cut at the stop (or all of it) */
        if (o.stopped) {
            assert_int_equal(o.where.text_offset, o.len);
            assert_true(o.len < plain.len);
            assert_memory_equal(o.text, plain.text, o.len);
            const char *st = stops[first + (size_t)o.where.stop_index];
            assert_memory_equal(plain.text + o.len, st, strlen(st));
            /* no stop string occurs in the returned text */
            for (size_t k = 0; k < nstop; k++)
                assert_null(strstr(o.text, stops[first + k]));
        } else {
            assert_string_equal(o.text, plain.text);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_scan),
        cmocka_unit_test(test_replacement_matches_python),
        cmocka_unit_test(test_split_characters),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_holdback),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_random_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
