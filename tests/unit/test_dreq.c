/* The decode request table: states, epochs, deadlines and the quarantine rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "requests.h"

static duet_model_config_t cfg;
static duet_kv_cache_t *cache;
static duet_dreq_table_t *tab;

static int setup(void **state)
{
    (void)state;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = 1000; cfg.hidden_size = 64; cfg.num_hidden_layers = 3; cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 1; cfg.head_dim = 128; cfg.qk_rope_head_dim = 64; cfg.sliding_window = 16;
    cfg.index_n_heads = 2; cfg.index_head_dim = 64; cfg.index_topk = 4;
    cfg.compress_ratios[0] = 0; cfg.compress_ratios[1] = 4; cfg.compress_ratios[2] = 128;
    cfg.n_compress_ratios = 3;
    duet_cache_opts_t o = {.page_tokens = 256, .kv_dtype = DUET_CACHE_FP8, .index_k_dtype = DUET_CACHE_FP8};
    duet_err_t err = {0};
    assert_int_equal(duet_kv_cache_create(&cfg, &o, 16, 4, &cache, &err), DUET_OK);
    assert_int_equal(duet_dreq_table_create(cache, 8, &tab, &err), DUET_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    duet_dreq_table_destroy(&tab);
    duet_kv_cache_destroy(&cache);
    return 0;
}

static void all_free(void)
{
    assert_int_equal(duet_kv_cache_free_page_count(cache), 16);
    assert_int_equal(duet_kv_cache_free_slot_count(cache), 4);
    assert_int_equal(duet_kv_cache_quarantined_page_count(cache), 0);
}

static void test_happy_path(void **state)
{
    (void)state;
    duet_dreq_t *r;
    duet_err_t err = {0};
    assert_int_equal(duet_dreq_reserve(tab, "a", "p0", 300, 100, 1000, 0, &r, &err), DUET_OK);
    assert_int_equal(r->state, DUET_REQ_WAITING_FOR_INPUT);
    assert_int_equal(r->seq.n_pages, 2); /* 400 tokens / 256 */
    assert_int_equal(duet_kv_cache_free_page_count(cache), 14);
    assert_int_equal(duet_dreq_reserve(tab, "a", "p0", 1, 1, 1000, 0, &r, &err), DUET_ERR_STATE);
    uint64_t ep = duet_dreq_find(tab, "a")->epoch;
    assert_int_equal(duet_dreq_transfer_done(tab, "a", ep + 1, NULL), DUET_ERR_STATE); /* stale epoch */
    assert_int_equal(duet_dreq_transfer_done(tab, "b", ep, NULL), DUET_ERR_NOT_FOUND);
    assert_int_equal(duet_dreq_transfer_done(tab, "a", ep, &r), DUET_OK);
    assert_int_equal(r->state, DUET_REQ_DECODING);
    assert_int_equal(duet_dreq_transfer_done(tab, "a", ep, NULL), DUET_ERR_STATE); /* twice */
    duet_dreq_stats_t st;
    duet_dreq_stats(tab, 0, &st);
    assert_int_equal(st.stale_transfer_done, 3);
    assert_int_equal(st.by_state[DUET_REQ_DECODING], 1);
    assert_int_equal(duet_dreq_finish(tab, "a"), DUET_OK);
    assert_null(duet_dreq_find(tab, "a"));
    all_free();
}

static void test_abort_before_transfer_quarantines(void **state)
{
    (void)state;
    duet_dreq_t *r;
    duet_err_t err = {0};
    assert_int_equal(duet_dreq_reserve(tab, "q1", "p0", 10, 10, 1000, 0, &r, &err), DUET_OK);
    uint64_t ep = r->epoch;
    assert_int_equal(duet_dreq_abort(tab, "q1", ep, 3), DUET_OK);
    assert_int_equal(duet_dreq_abort(tab, "q1", ep, 3), DUET_OK); /* idempotent */
    assert_int_equal(duet_dreq_abort(tab, "nope", 0, 3), DUET_OK); /* unknown rid acknowledged */
    assert_int_equal(duet_kv_cache_quarantined_page_count(cache), 1);
    assert_int_equal(duet_kv_cache_quarantined_slot_count(cache), 1);
    /* a late TransferDone for it is refused */
    assert_int_equal(duet_dreq_transfer_done(tab, "q1", ep, NULL), DUET_ERR_STATE);
    /* an ack for another epoch releases nothing */
    assert_int_equal(duet_dreq_abort_ack(tab, "q1", ep + 7), 0);
    assert_int_equal(duet_kv_cache_quarantined_page_count(cache), 1);
    assert_int_equal(duet_dreq_abort_ack(tab, "q1", ep), 1);
    all_free();
    /* release by prefill death and by router confirmation */
    assert_int_equal(duet_dreq_reserve(tab, "q2", "p1", 10, 10, 1000, 0, &r, &err), DUET_OK);
    assert_int_equal(duet_dreq_reserve(tab, "q3", "p2", 10, 10, 1000, 0, &r, &err), DUET_OK);
    uint64_t ep3 = r->epoch;
    duet_dreq_abort(tab, "q2", 0, 1);
    duet_dreq_abort(tab, "q3", 0, 1);
    assert_int_equal(duet_dreq_prefill_dead(tab, "p9"), 0);
    assert_int_equal(duet_dreq_prefill_dead(tab, "p1"), 1);
    assert_int_equal(duet_dreq_router_confirms_undelivered(tab, "q3", ep3), 1);
    all_free();
}

static void test_abort_after_transfer_frees(void **state)
{
    (void)state;
    duet_dreq_t *r;
    duet_err_t err = {0};
    assert_int_equal(duet_dreq_reserve(tab, "d", "p0", 10, 10, 1000, 0, &r, &err), DUET_OK);
    assert_int_equal(duet_dreq_transfer_done(tab, "d", r->epoch, NULL), DUET_OK);
    assert_int_equal(duet_dreq_abort(tab, "d", 0, 1), DUET_OK);
    assert_null(duet_dreq_find(tab, "d"));
    all_free();
}

static void test_deadline_and_prefill_death(void **state)
{
    (void)state;
    duet_dreq_t *r, *out[4];
    duet_err_t err = {0};
    assert_int_equal(duet_dreq_reserve(tab, "w1", "p0", 10, 10, 100, 0, &r, &err), DUET_OK);
    assert_int_equal(duet_dreq_reserve(tab, "w2", "p0", 10, 10, 500, 0, &r, &err), DUET_OK);
    duet_dreq_stats_t st;
    duet_dreq_stats(tab, 50000000ull, &st);
    assert_int_equal(st.by_state[DUET_REQ_WAITING_FOR_INPUT], 2);
    assert_int_equal(st.oldest_waiting_ns, 50000000ull);
    assert_int_equal(duet_dreq_expire(tab, 99000000ull, out, 4), 0);
    assert_int_equal(duet_dreq_expire(tab, 100000000ull, out, 4), 1);
    assert_string_equal(out[0]->rid, "w1");
    assert_int_equal(out[0]->abort_reason, DUET_DREQ_REASON_WAIT_DEADLINE);
    assert_int_equal(out[0]->state, DUET_REQ_ABORTED);
    /* the prefill worker dies: the expired one is released, the waiting one can no longer get input */
    assert_int_equal(duet_dreq_prefill_dead(tab, "p0"), 2);
    all_free();
}

static void test_capacity(void **state)
{
    (void)state;
    duet_dreq_t *r;
    duet_err_t err = {0};
    /* 16 pages: a request of 4096 tokens needs all of them */
    assert_int_equal(duet_dreq_reserve(tab, "big", "p0", 4000, 96, 100, 0, &r, &err), DUET_OK);
    assert_int_equal(duet_dreq_reserve(tab, "more", "p0", 1, 1, 100, 0, &r, &err), DUET_ERR_NO_SPACE);
    assert_int_equal(duet_kv_cache_free_slot_count(cache), 3); /* nothing leaked by the refusal */
    duet_dreq_abort(tab, "big", 0, 1);
    assert_int_equal(duet_dreq_reserve(tab, "more", "p0", 1, 1, 100, 0, &r, &err), DUET_ERR_NO_SPACE);
    duet_dreq_prefill_dead(tab, "p0");
    all_free();
    /* table entries: 8 max, 4 slots -> slots run out first */
    char rid[8];
    for (int i = 0; i < 4; i++) {
        snprintf(rid, sizeof rid, "r%d", i);
        assert_int_equal(duet_dreq_reserve(tab, rid, "p0", 1, 1, 100, 0, &r, &err), DUET_OK);
    }
    assert_int_equal(duet_dreq_reserve(tab, "r9", "p0", 1, 1, 100, 0, &r, &err), DUET_ERR_NO_SPACE);
    for (int i = 0; i < 4; i++) {
        snprintf(rid, sizeof rid, "r%d", i);
        duet_dreq_abort(tab, rid, 0, 1);
        duet_dreq_router_confirms_undelivered(tab, rid, 0);
    }
    all_free();
}

/* Many inserts and removals through the open-addressing table keep every entry findable. */
static void test_hash_churn(void **state)
{
    (void)state;
    duet_dreq_t *r;
    duet_err_t err = {0};
    char rid[16];
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 4; i++) {
            snprintf(rid, sizeof rid, "c%d-%d", round, i);
            assert_int_equal(duet_dreq_reserve(tab, rid, "p0", 1, 1, 100, 0, &r, &err), DUET_OK);
        }
        for (int i = 0; i < 4; i++) {
            snprintf(rid, sizeof rid, "c%d-%d", round, (i * 3) % 4);
            r = duet_dreq_find(tab, rid);
            assert_non_null(r);
            assert_int_equal(duet_dreq_transfer_done(tab, rid, r->epoch, NULL), DUET_OK);
            assert_int_equal(duet_dreq_finish(tab, rid), DUET_OK);
        }
    }
    all_free();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_happy_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_before_transfer_quarantines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_after_transfer_frees, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline_and_prefill_death, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capacity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hash_churn, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
