/* The workers' engine (common/worker/worker_engine.h) on the CPU, tiny fixture (path in argv[1]):
 *  - a prefill step with final and non-final chunks draws the first tokens of the final ones
 *    only, each the token duet_sample picks from a single-sequence forward's logits;
 *  - a decode step's tokens are duet_sample's too, and the draw counters count its rows;
 *  - a prefill item asking for every position's logits, more final chunks than logits rows, or
 *    a decode step of more rows than that, are refused with a typed error before any forward;
 *  - the step deadline's test hook (DUET_TEST_GPU_HOLD) is parsed strictly. */
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
#include "worker_engine.h"
#include "test_prompt.h"

static const char *g_model_dir;
static duet_model_t *g_model;

#define N_SEQ 3
static const int g_len[N_SEQ] = {40, 70, 30};

static duet_kv_cache_t *make_cache(void)
{
    duet_cache_opts_t o = {.page_tokens = 256, .kv_dtype = DUET_CACHE_BF16, .index_k_dtype = DUET_CACHE_BF16};
    duet_kv_cache_t *c = NULL;
    duet_err_t err = {0};
    if (duet_kv_cache_create(&g_model->cfg, &o, 16, 8, &c, &err) != DUET_OK)
        fail_msg("cache: %s", duet_err_text(&err));
    return c;
}

/* The reference: sequence k alone, its prompt then `extra` (NULL: none) one token at a time;
 * the token duet_sample picks from the last logits at the position after them. */
static int32_t reference(duet_kv_cache_t *ref, const int32_t *ids, int n, const int32_t *extra, int n_extra,
                         const duet_sampling_t *sp)
{
    int V = g_model->cfg.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    assert_non_null(lg);
    duet_err_t err = {0};
    duet_seq_t s = {0};
    assert_int_equal(duet_seq_init(ref, &s, &err), DUET_OK);
    assert_int_equal(duet_seq_reserve(ref, &s, n + n_extra + 8, &err), DUET_OK);
    duet_fwd_item_t it = {.seq = &s, .tokens = ids, .n_tokens = n, .logits_mode = DUET_LOGITS_LAST, .logits = lg};
    assert_int_equal(duet_forward(g_model, ref, &it, 1, &err), DUET_OK);
    for (int i = 0; i < n_extra; i++) {
        it = (duet_fwd_item_t){
            .seq = &s, .tokens = extra + i, .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST, .logits = lg};
        assert_int_equal(duet_forward(g_model, ref, &it, 1, &err), DUET_OK);
    }
    int32_t t = duet_sample(lg, V, sp, s.n_past);
    duet_seq_release(ref, &s);
    free(lg);
    return t;
}

static void test_prefill_and_decode(void **state)
{
    (void)state;
    int V = g_model->cfg.vocab_size;
    duet_kv_cache_t *cache = make_cache(), *ref = make_cache();
    duet_worker_opts_t o;
    memset(&o, 0, sizeof o);
    o.device = -1;
    duet_worker_engine_t e;
    duet_err_t err = {0};
    if (duet_worker_engine_open(&e, &o, g_model, cache, 2, &err) != DUET_OK)
        fail_msg("engine: %s", duet_err_text(&err));

    int32_t *ids[N_SEQ];
    duet_seq_t seq[N_SEQ];
    duet_sampling_t sp[N_SEQ];
    const duet_sampling_t *spp[N_SEQ];
    int64_t pos[N_SEQ];
    for (int k = 0; k < N_SEQ; k++) {
        ids[k] = malloc(sizeof(int32_t) * (size_t)g_len[k]);
        assert_non_null(ids[k]);
        make_prompt(ids[k], g_len[k], 11 + (uint64_t)k, V);
        memset(&seq[k], 0, sizeof seq[k]);
        assert_int_equal(duet_seq_init(cache, &seq[k], &err), DUET_OK);
        assert_int_equal(duet_seq_reserve(cache, &seq[k], g_len[k] + 8, &err), DUET_OK);
        duet_sampling_default(&sp[k]);
        spp[k] = &sp[k];
        pos[k] = g_len[k];
    }
    /* sequence 0 samples with top-p and min-p, 1 at temperature 1.3 with top-k, 2 is greedy */
    sp[0].temperature = 0.8f;
    sp[0].top_p = 0.9f;
    sp[0].min_p = 0.05f;
    sp[0].seed = 7;
    sp[1].temperature = 1.3f;
    sp[1].top_k = 50;
    sp[1].seed = 8;

    /* step 1: 0 and 2 whole (their final chunks), 1's first 50 tokens */
    duet_fwd_item_t items[N_SEQ] = {
        {.seq = &seq[0], .tokens = ids[0], .n_tokens = g_len[0], .logits_mode = DUET_LOGITS_LAST},
        {.seq = &seq[1], .tokens = ids[1], .n_tokens = 50, .logits_mode = DUET_LOGITS_NONE},
        {.seq = &seq[2], .tokens = ids[2], .n_tokens = g_len[2], .logits_mode = DUET_LOGITS_LAST},
    };
    int32_t tok[N_SEQ] = {-7, -7, -7};
    if (duet_worker_engine_prefill(&e, items, N_SEQ, NULL, NULL, spp, pos, tok, 2, &err) != DUET_OK)
        fail_msg("prefill: %s", duet_err_text(&err));
    assert_int_equal(tok[1], -7); /* not a final chunk: not drawn */
    int32_t first[N_SEQ];
    first[0] = tok[0];
    first[2] = tok[2];
    assert_int_equal(first[0], reference(ref, ids[0], g_len[0], NULL, 0, &sp[0]));
    assert_int_equal(first[2], reference(ref, ids[2], g_len[2], NULL, 0, &sp[2]));

    /* step 2: 1's last 20 tokens */
    duet_fwd_item_t rest = {
        .seq = &seq[1], .tokens = ids[1] + 50, .n_tokens = g_len[1] - 50, .logits_mode = DUET_LOGITS_LAST};
    int32_t t1 = -7;
    if (duet_worker_engine_prefill(&e, &rest, 1, NULL, NULL, &spp[1], &pos[1], &t1, 2, &err) != DUET_OK)
        fail_msg("prefill: %s", duet_err_text(&err));
    first[1] = t1;
    assert_int_equal(first[1], reference(ref, ids[1], g_len[1], NULL, 0, &sp[1]));

    /* a decode step of two rows (the logits hold two) */
    duet_fwd_item_t d[2] = {
        {.seq = &seq[0], .tokens = &first[0], .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST},
        {.seq = &seq[1], .tokens = &first[1], .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST},
    };
    int32_t dt[2] = {-7, -7};
    if (duet_worker_engine_decode(&e, d, 2, spp, dt, 2, &err) != DUET_OK)
        fail_msg("decode: %s", duet_err_text(&err));
    assert_int_equal(dt[0], reference(ref, ids[0], g_len[0], &first[0], 1, &sp[0]));
    assert_int_equal(dt[1], reference(ref, ids[1], g_len[1], &first[1], 1, &sp[1]));
    assert_int_equal(e.steps, 1);
    assert_int_equal(e.step_rows, 2);
    assert_int_equal(e.draw_rows, 2); /* on the CPU every row is drawn on the host */
    assert_int_equal(e.draw_steps, 1);

    /* refused before any forward: the sequences do not move */
    int64_t past = seq[2].n_past;
    duet_fwd_item_t all = {.seq = &seq[2], .tokens = &first[2], .n_tokens = 1, .logits_mode = DUET_LOGITS_ALL};
    assert_int_equal(duet_worker_engine_prefill(&e, &all, 1, NULL, NULL, &spp[2], &pos[2], tok, 1, &err),
                     DUET_ERR_INVALID);
    duet_fwd_item_t three[N_SEQ];
    for (int k = 0; k < N_SEQ; k++)
        three[k] =
            (duet_fwd_item_t){.seq = &seq[k], .tokens = &first[k], .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST};
    assert_int_equal(duet_worker_engine_prefill(&e, three, N_SEQ, NULL, NULL, spp, pos, tok, 1, &err), DUET_ERR_RANGE);
    assert_int_equal(duet_worker_engine_decode(&e, three, N_SEQ, spp, tok, 1, &err), DUET_ERR_RANGE);
    assert_int_equal(seq[2].n_past, past);
    assert_int_equal(e.steps, 1);

    for (int k = 0; k < N_SEQ; k++) {
        duet_seq_release(cache, &seq[k]);
        free(ids[k]);
    }
    duet_worker_engine_close(&e);
    duet_kv_cache_destroy(&cache);
    duet_kv_cache_destroy(&ref);
}

/* DUET_TEST_GPU_HOLD (the step deadline's test hook): a malformed value refuses the engine with
 * a typed error naming the variable; a good one is taken (on the CPU it holds nothing), and the
 * CPU engine is never lost. */
static void test_gpu_hold_hook(void **state)
{
    (void)state;
    static const char *bad[] = {"x", "3", "0:100", "3:0", "3:600001", "3:100ms", "-1:5"};
    duet_worker_opts_t o;
    memset(&o, 0, sizeof o);
    o.device = -1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        duet_kv_cache_t *cache = make_cache();
        duet_worker_engine_t e;
        duet_err_t err = {0};
        setenv("DUET_TEST_GPU_HOLD", bad[i], 1);
        duet_status_t st = duet_worker_engine_open(&e, &o, g_model, cache, 2, &err);
        if (st == DUET_OK)
            duet_worker_engine_close(&e);
        duet_kv_cache_destroy(&cache);
        if (st != DUET_ERR_INVALID || !strstr(err.msg, "DUET_TEST_GPU_HOLD"))
            fail_msg("DUET_TEST_GPU_HOLD=%s: status %d, '%s'", bad[i], (int)st, err.msg);
    }
    duet_kv_cache_t *cache = make_cache();
    duet_worker_engine_t e;
    duet_err_t err = {0};
    setenv("DUET_TEST_GPU_HOLD", "3:4000", 1);
    if (duet_worker_engine_open(&e, &o, g_model, cache, 2, &err) != DUET_OK)
        fail_msg("DUET_TEST_GPU_HOLD=3:4000: %s", duet_err_text(&err));
    assert_int_equal(e.test_hold_at, 3);
    assert_int_equal(e.test_hold_ms, 4000);
    assert_int_equal(duet_worker_engine_gpu_lost(&e), 0);
    duet_worker_engine_close(&e);
    duet_kv_cache_destroy(&cache);
    unsetenv("DUET_TEST_GPU_HOLD");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_worker_engine MODEL_DIR\n");
        return 2;
    }
    g_model_dir = argv[1];
    duet_err_t err = {0};
    if (duet_model_load(g_model_dir, &g_model, &err) != DUET_OK) {
        fprintf(stderr, "%s\n", duet_err_text(&err));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_and_decode),
        cmocka_unit_test(test_gpu_hold_hook),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    duet_model_destroy(&g_model);
    return rc;
}
