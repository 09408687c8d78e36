/* Engine invariants on the tiny fixture (path in argv[1]):
 *  - any chunking of a prompt gives bit-identical logits at every position,
 *    and prefill of t+1 tokens equals prefill of t then one decode step,
 *    for every KV x index-K cache encoding;
 *  - a row's result does not depend on the other sequences in the batch;
 *  - greedy generation is identical whether the prompt was chunked or not;
 *  - bad input is refused before anything is written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "sampling.h"
#include "test_prompt.h"

static const char *g_model_dir;
static duet_model_t *g_model;

#define PROMPT_LEN 300

/* Prefill `n` tokens in chunks of the given sizes (cycled), collecting all logits (n, V). */
static float *prefill_chunked(duet_kv_cache_t *cache, duet_seq_t *seq, const int32_t *ids, int n,
                              const int *chunks, int n_chunks)
{
    int V = g_model->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    assert_non_null(logits);
    duet_err_t err = {0};
    assert_int_equal(duet_seq_reserve(cache, seq, n + 64, &err), DUET_OK);
    int off = 0, ci = 0;
    while (off < n) {
        int c = chunks[ci++ % n_chunks];
        if (c > n - off)
            c = n - off;
        duet_fwd_item_t it = {.seq = seq, .tokens = ids + off, .n_tokens = c, .logits_mode = DUET_LOGITS_ALL,
                              .logits = logits + (size_t)off * V};
        duet_status_t st = duet_forward(g_model, cache, &it, 1, &err);
        if (st != DUET_OK)
            fail_msg("forward: %s", duet_err_text(&err));
        off += c;
    }
    return logits;
}

static duet_kv_cache_t *make_cache(duet_cache_dtype_t kv, duet_cache_dtype_t ik, uint32_t slots)
{
    duet_cache_opts_t o = {.page_tokens = 256, .kv_dtype = kv, .index_k_dtype = ik};
    duet_kv_cache_t *c = NULL;
    duet_err_t err = {0};
    if (duet_kv_cache_create(&g_model->cfg, &o, 64, slots, &c, &err) != DUET_OK)
        fail_msg("cache: %s", duet_err_text(&err));
    return c;
}

/* Prefill with a chunk plan, then 12 greedy decode steps; returns all prompt logits and
 * writes the decoded tokens and the last decode step's logits. */
static float *run_plan(duet_kv_cache_t *cache, const int32_t *ids, const int *plan, int plan_len, int32_t *toks,
                       float *last)
{
    int V = g_model->cfg.vocab_size;
    duet_err_t err = {0};
    duet_seq_t s = {0};
    assert_int_equal(duet_seq_init(cache, &s, &err), DUET_OK);
    float *all = prefill_chunked(cache, &s, ids, PROMPT_LEN, plan, plan_len);
    memcpy(last, all + (size_t)(PROMPT_LEN - 1) * V, sizeof(float) * V);
    duet_sampling_t sp;
    duet_sampling_default(&sp);
    for (int t = 0; t < 12; t++) {
        toks[t] = duet_sample(last, V, &sp, s.n_past);
        duet_fwd_item_t it = {.seq = &s, .tokens = &toks[t], .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST,
                              .logits = last};
        if (duet_forward(g_model, cache, &it, 1, &err) != DUET_OK)
            fail_msg("decode: %s", duet_err_text(&err));
    }
    duet_seq_release(cache, &s);
    return all;
}

static void check_chunking(duet_cache_dtype_t kv, duet_cache_dtype_t ik)
{
    int V = g_model->cfg.vocab_size;
    int32_t ids[PROMPT_LEN];
    make_prompt(ids, PROMPT_LEN, 7, V);
    duet_kv_cache_t *cache = make_cache(kv, ik, 2);
    static const int one_shot[] = {PROMPT_LEN};
    /* 299+1 is "prefill t then decode 1"; the others cross window, entry and page boundaries */
    static const int p0[] = {7}, p1[] = {64, 1, 100}, p2[] = {299, 1}, p3[] = {128, 3};
    static const int *const plans[] = {p0, p1, p2, p3};
    static const int plan_len[] = {1, 3, 2, 2};
    int32_t want_tok[12], got_tok[12];
    float *want_last = malloc(sizeof(float) * V), *got_last = malloc(sizeof(float) * V);
    float *want = run_plan(cache, ids, one_shot, 1, want_tok, want_last);
    for (int p = 0; p < 4; p++) {
        float *got = run_plan(cache, ids, plans[p], plan_len[p], got_tok, got_last);
        for (int r = 0; r < PROMPT_LEN; r++)
            if (memcmp(want + (size_t)r * V, got + (size_t)r * V, sizeof(float) * V) != 0)
                fail_msg("kv=%s index-k=%s plan %d: logits of position %d differ from single-shot prefill",
                         duet_cache_dtype_name(kv), duet_cache_dtype_name(ik), p, r);
        assert_memory_equal(want_tok, got_tok, sizeof want_tok);
        assert_memory_equal(want_last, got_last, sizeof(float) * V);
        free(got);
    }
    assert_int_equal(duet_kv_cache_free_page_count(cache), duet_kv_cache_n_pages(cache));
    assert_int_equal(duet_kv_cache_free_slot_count(cache), duet_kv_cache_n_slots(cache));
    free(want);
    free(want_last);
    free(got_last);
    duet_kv_cache_destroy(&cache);
}

static void test_chunking_bf16_bf16(void **state) { (void)state; check_chunking(DUET_CACHE_BF16, DUET_CACHE_BF16); }
static void test_chunking_bf16_fp8(void **state) { (void)state; check_chunking(DUET_CACHE_BF16, DUET_CACHE_FP8); }
static void test_chunking_fp8_bf16(void **state) { (void)state; check_chunking(DUET_CACHE_FP8, DUET_CACHE_BF16); }
static void test_chunking_fp8_fp8(void **state) { (void)state; check_chunking(DUET_CACHE_FP8, DUET_CACHE_FP8); }

/* Three sequences of different lengths in one batch give the same logits as each alone. */
static void test_batch_invariance(void **state)
{
    (void)state;
    int V = g_model->cfg.vocab_size;
    const int lens[3] = {37, 150, 5};
    int32_t ids[3][150];
    for (int i = 0; i < 3; i++)
        make_prompt(ids[i], lens[i], 100 + (uint64_t)i, V);
    duet_kv_cache_t *cache = make_cache(DUET_CACHE_FP8, DUET_CACHE_FP8, 6);
    duet_err_t err = {0};
    duet_seq_t alone[3], batch[3];
    float *la[3], *lb[3];
    duet_fwd_item_t items[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(duet_seq_init(cache, &alone[i], &err), DUET_OK);
        assert_int_equal(duet_seq_init(cache, &batch[i], &err), DUET_OK);
        assert_int_equal(duet_seq_reserve(cache, &alone[i], 200, &err), DUET_OK);
        assert_int_equal(duet_seq_reserve(cache, &batch[i], 200, &err), DUET_OK);
        la[i] = malloc(sizeof(float) * (size_t)lens[i] * V);
        lb[i] = malloc(sizeof(float) * (size_t)lens[i] * V);
        duet_fwd_item_t it = {.seq = &alone[i], .tokens = ids[i], .n_tokens = lens[i],
                              .logits_mode = DUET_LOGITS_ALL, .logits = la[i]};
        assert_int_equal(duet_forward(g_model, cache, &it, 1, &err), DUET_OK);
        items[i] = (duet_fwd_item_t){.seq = &batch[i], .tokens = ids[i], .n_tokens = lens[i],
                                     .logits_mode = DUET_LOGITS_ALL, .logits = lb[i]};
    }
    assert_int_equal(duet_forward(g_model, cache, items, 3, &err), DUET_OK);
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(la[i], lb[i], sizeof(float) * (size_t)lens[i] * V);
        duet_seq_release(cache, &alone[i]);
        duet_seq_release(cache, &batch[i]);
        free(la[i]);
        free(lb[i]);
    }
    duet_kv_cache_destroy(&cache);
}

static void test_bad_input(void **state)
{
    (void)state;
    duet_kv_cache_t *cache = make_cache(DUET_CACHE_BF16, DUET_CACHE_BF16, 2);
    duet_err_t err = {0};
    duet_seq_t s;
    assert_int_equal(duet_seq_init(cache, &s, &err), DUET_OK);
    int32_t bad[2] = {5, g_model->cfg.vocab_size};
    duet_fwd_item_t it = {.seq = &s, .tokens = bad, .n_tokens = 2};
    /* no pages yet */
    assert_int_equal(duet_forward(g_model, cache, &it, 1, &err), DUET_ERR_NO_SPACE);
    assert_int_equal(duet_seq_reserve(cache, &s, 2, &err), DUET_OK);
    assert_int_equal(duet_forward(g_model, cache, &it, 1, &err), DUET_ERR_RANGE);
    assert_non_null(strstr(err.msg, "token id"));
    assert_int_equal(s.n_past, 0);
    duet_fwd_item_t twice[2] = {it, it};
    bad[1] = 6;
    assert_int_equal(duet_forward(g_model, cache, twice, 2, &err), DUET_ERR_INVALID);
    it.logits_mode = DUET_LOGITS_LAST;
    assert_int_equal(duet_forward(g_model, cache, &it, 1, &err), DUET_ERR_INVALID);
    assert_int_equal(s.n_past, 0);
    duet_seq_release(cache, &s);
    duet_kv_cache_destroy(&cache);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    g_model_dir = argv[1];
    duet_err_t err = {0};
    if (duet_model_load(g_model_dir, &g_model, &err) != DUET_OK) {
        fprintf(stderr, "cannot load %s: %s\n", g_model_dir, duet_err_text(&err));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunking_bf16_bf16), cmocka_unit_test(test_chunking_bf16_fp8),
        cmocka_unit_test(test_chunking_fp8_bf16),  cmocka_unit_test(test_chunking_fp8_fp8),
        cmocka_unit_test(test_batch_invariance),   cmocka_unit_test(test_bad_input),
    };
    /* argv[2] == "fp8-only": one cache encoding (the weight formats are what that run is about) */
    const struct CMUnitTest quick[] = {
        cmocka_unit_test(test_chunking_fp8_fp8),
        cmocka_unit_test(test_batch_invariance),
    };
    int rc = argc > 2 && strcmp(argv[2], "fp8-only") == 0 ? cmocka_run_group_tests(quick, NULL, NULL)
                                                          : cmocka_run_group_tests(tests, NULL, NULL);
    duet_model_destroy(&g_model);
    return rc;
}
