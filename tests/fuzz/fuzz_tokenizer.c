/* Fuzz target: the input is arbitrary bytes handed to the encoder.  The
 * shipped DeepSeek-V4 tokenizer ($DUET_TOKENIZER_JSON, or
 * data/tokenizer/deepseek-v4/tokenizer.json under the source root) is loaded
 * once on the native splitters and once on PCRE2 with the cache off.  For
 * both special-token modes: both tokenizers give the same ids; plain mode
 * never yields an added token; decode(encode(x)) == x when x is valid UTF-8,
 * and otherwise is valid UTF-8 that encodes to the same ids (the invalid
 * bytes became U+FFFD).  The input is copied to an exact-size heap buffer so
 * sanitizers catch any read past `size`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "duet_config.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static duet_tok_t *native, *pcre;

static void load_once(void)
{
    const char *path = getenv("DUET_TOKENIZER_JSON");
    duet_tok_opts_t opts = { .force_pcre2 = true, .cache_entries = SIZE_MAX };
    duet_err_t err = { 0 };
    if (native)
        return;
    if (!path)
        path = DUET_SOURCE_ROOT "/data/tokenizer/deepseek-v4/tokenizer.json";
    if (duet_tok_create(path, NULL, &native, &err) || duet_tok_create(path, &opts, &pcre, &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", duet_err_text(&err));
        abort();
    }
}

/* Strict UTF-8 (no surrogates, overlongs or code points past U+10FFFF). */
static bool valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (!need || i + need > n)
            return false;
        for (size_t k = 1; k < need; k++, lo = 0x80, hi = 0xBF)
            if (s[i + k] < lo || s[i + k] > hi)
                return false;
        i += need;
    }
    return true;
}

static void encode(duet_tok_t *t, const char *s, size_t n, bool special, duet_tok_ids_t *ids)
{
    ids->len = 0;
    if (duet_tok_encode(t, s, n, special, ids, NULL) != DUET_OK)
        abort();
}

static bool same(const duet_tok_ids_t *x, const duet_tok_ids_t *y)
{
    return x->len == y->len && (!x->len || !memcmp(x->ids, y->ids, x->len * sizeof *x->ids));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    duet_tok_ids_t a = { 0 }, b = { 0 }, c = { 0 };
    duet_tok_bytes_t back = { 0 };
    char *copy = malloc(size ? size : 1);
    bool valid = valid_utf8(data, size);
    load_once();
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    for (int special = 0; special < 2; special++) {
        encode(native, copy, size, special, &a);
        encode(pcre, copy, size, special, &b);
        if (!same(&a, &b))
            abort(); /* native splitters and PCRE2 disagree */
        for (size_t i = 0; i < a.len && !special; i++)
            if (duet_tok_is_added(native, a.ids[i]))
                abort(); /* plain text produced an added token */
        back.len = 0;
        if (duet_tok_decode(native, a.ids, a.len, false, &back, NULL) != DUET_OK)
            abort();
        if (valid && (back.len != size || (size && memcmp(back.data, copy, size))))
            abort(); /* round trip */
        if (!valid_utf8((const uint8_t *)back.data, back.len))
            abort();
        if (!valid) { /* the replaced text encodes to the same ids */
            encode(native, back.data, back.len, special, &c);
            if (!same(&c, &a))
                abort();
        }
    }
    duet_tok_ids_fini(&a);
    duet_tok_ids_fini(&b);
    duet_tok_ids_fini(&c);
    duet_tok_bytes_fini(&back);
    free(copy);
    return 0;
}
