/* Cache pools: page and slot state machines, pool memory, layer views and
 * the layer gate. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "kv_cache.h"
#include "../cache_fixture.h"

/* DeepSeek-V4-Flash: 43 layers, [0, 0] + [4, 128] * 20 + [4]. */
static void flash_config(duet_model_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->hidden_size = 4096;
    c->num_hidden_layers = 43;
    c->num_key_value_heads = 1;
    c->head_dim = 512;
    c->qk_rope_head_dim = 64;
    c->index_head_dim = 128;
    c->sliding_window = 128;
    int n = 2;
    for (int i = 0; i < 20; i++) {
        c->compress_ratios[n++] = 4;
        c->compress_ratios[n++] = 128;
    }
    c->compress_ratios[n++] = 4;
    c->compress_ratios[n++] = 0; /* MTP */
    c->n_compress_ratios = n;
}

static const duet_cache_opts_t fp8_opts = {.page_tokens = 256, .kv_dtype = DUET_CACHE_FP8,
                                           .index_k_dtype = DUET_CACHE_FP8};

static duet_kv_cache_t *make_tiny(uint32_t n_pages, uint32_t n_slots)
{
    duet_model_config_t cfg;
    tiny_config(&cfg);
    duet_kv_cache_t *c = NULL;
    duet_err_t err;
    duet_err_clear(&err);
    assert_int_equal(duet_kv_cache_create(&cfg, &fp8_opts, n_pages, n_slots, &c, &err), DUET_OK);
    assert_non_null(c);
    return c;
}

static void assert_states(duet_kv_cache_t *c, uint32_t from, uint32_t to, duet_unit_state_t s)
{
    for (uint32_t i = from; i < to; i++)
        if (duet_kv_cache_page_state(c, i) != s)
            fail_msg("page %u: state %d, expected %d", i, (int)duet_kv_cache_page_state(c, i), (int)s);
}

static void test_create_invalid(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    tiny_config(&cfg);
    duet_cache_opts_t o = fp8_opts;
    o.page_tokens = 100;
    duet_kv_cache_t *c = (duet_kv_cache_t *)(uintptr_t)1;
    duet_err_t err;
    duet_err_clear(&err);
    assert_int_equal(duet_kv_cache_create(&cfg, &o, 4, 4, &c, &err), DUET_ERR_INVALID);
    assert_true(c == (duet_kv_cache_t *)(uintptr_t)1); /* out untouched on failure */
    assert_true(err.msg[0] != '\0');
    assert_int_equal(duet_kv_cache_create(NULL, &fp8_opts, 4, 4, &c, NULL), DUET_ERR_INVALID);
    duet_kv_cache_destroy(NULL);
    c = NULL;
    duet_kv_cache_destroy(&c);
}

static void test_alloc_all(void **state)
{
    (void)state;
    enum { N = 200 }; /* crosses 64-bit words of the free bitmap */
    duet_kv_cache_t *c = make_tiny(N, 1);
    uint32_t ids[N];
    assert_int_equal(duet_kv_cache_n_pages(c), N);
    assert_int_equal(duet_kv_cache_free_page_count(c), N);
    assert_states(c, 0, N, DUET_UNIT_FREE);
    assert_int_equal(duet_kv_cache_alloc_pages(c, 0, NULL), DUET_OK);
    assert_int_equal(duet_kv_cache_alloc_pages(c, N, ids), DUET_OK);
    for (uint32_t i = 0; i < N; i++)
        assert_int_equal(ids[i], i);
    assert_int_equal(duet_kv_cache_free_page_count(c), 0);
    assert_states(c, 0, N, DUET_UNIT_USED);
    assert_int_equal(duet_kv_cache_alloc_pages(c, 1, ids), DUET_ERR_NO_SPACE);

    /* freed pages come back lowest id first, wherever they were freed */
    const uint32_t back[3] = {130, 5, 70};
    assert_int_equal(duet_kv_cache_free_pages(c, back, 3), DUET_OK);
    assert_int_equal(duet_kv_cache_free_page_count(c), 3);
    assert_int_equal(duet_kv_cache_alloc_pages(c, 3, ids), DUET_OK);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 70);
    assert_int_equal(ids[2], 130);

    /* free everything, in two calls */
    for (uint32_t i = 0; i < N; i++)
        ids[i] = N - 1 - i;
    assert_int_equal(duet_kv_cache_free_pages(c, ids, N / 2), DUET_OK);
    assert_int_equal(duet_kv_cache_free_pages(c, ids + N / 2, N / 2), DUET_OK);
    assert_int_equal(duet_kv_cache_free_page_count(c), N);
    assert_int_equal(duet_kv_cache_alloc_pages(c, 64, ids), DUET_OK);
    for (uint32_t i = 0; i < 64; i++)
        assert_int_equal(ids[i], i);
    duet_kv_cache_destroy(&c);
    assert_null(c);
}

static void test_no_space_all_or_nothing(void **state)
{
    (void)state;
    duet_kv_cache_t *c = make_tiny(200, 1);
    uint32_t ids[200];
    assert_int_equal(duet_kv_cache_alloc_pages(c, 150, ids), DUET_OK);
    memset(ids, 0xff, sizeof ids);
    assert_int_equal(duet_kv_cache_alloc_pages(c, 51, ids), DUET_ERR_NO_SPACE);
    assert_int_equal(duet_kv_cache_free_page_count(c), 50);
    assert_states(c, 0, 150, DUET_UNIT_USED);
    assert_states(c, 150, 200, DUET_UNIT_FREE);
    assert_int_equal(duet_kv_cache_alloc_pages(c, 50, ids), DUET_OK);
    for (uint32_t i = 0; i < 50; i++)
        assert_int_equal(ids[i], 150 + i);
    duet_kv_cache_destroy(&c);
}

static void test_page_transitions(void **state)
{
    (void)state;
    duet_kv_cache_t *c = make_tiny(16, 1);
    uint32_t ids[16];
    assert_int_equal(duet_kv_cache_alloc_pages(c, 10, ids), DUET_OK);

    const uint32_t q[2] = {2, 3};
    assert_int_equal(duet_kv_cache_quarantine_pages(c, q, 2), DUET_OK);
    assert_int_equal(duet_kv_cache_page_state(c, 2), DUET_UNIT_QUARANTINED);
    assert_int_equal(duet_kv_cache_quarantined_page_count(c), 2);
    assert_int_equal(duet_kv_cache_free_page_count(c), 6);
    /* quarantined pages are not handed out */
    assert_int_equal(duet_kv_cache_alloc_pages(c, 1, ids), DUET_OK);
    assert_int_equal(ids[0], 10);
    const uint32_t ten = 10;
    assert_int_equal(duet_kv_cache_free_pages(c, &ten, 1), DUET_OK);

    /* free / quarantine of a quarantined page, release of a used page: STATE, nothing changed */
    assert_int_equal(duet_kv_cache_free_pages(c, q, 1), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_quarantine_pages(c, q, 1), DUET_ERR_STATE);
    const uint32_t used_then_q[3] = {4, 5, 2};
    assert_int_equal(duet_kv_cache_free_pages(c, used_then_q, 3), DUET_ERR_STATE);
    assert_states(c, 4, 6, DUET_UNIT_USED);
    const uint32_t q_then_used[2] = {2, 4};
    assert_int_equal(duet_kv_cache_release_pages(c, q_then_used, 2), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_page_state(c, 2), DUET_UNIT_QUARANTINED);
    assert_int_equal(duet_kv_cache_quarantined_page_count(c), 2);
    assert_int_equal(duet_kv_cache_free_page_count(c), 6);

    /* release: QUARANTINED -> FREE; a second release is a STATE error */
    assert_int_equal(duet_kv_cache_release_pages(c, q, 2), DUET_OK);
    assert_int_equal(duet_kv_cache_page_state(c, 3), DUET_UNIT_FREE);
    assert_int_equal(duet_kv_cache_quarantined_page_count(c), 0);
    assert_int_equal(duet_kv_cache_free_page_count(c), 8);
    assert_int_equal(duet_kv_cache_release_pages(c, q, 1), DUET_ERR_STATE);
    /* quarantine of a free page */
    assert_int_equal(duet_kv_cache_quarantine_pages(c, q, 1), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_page_state(c, 2), DUET_UNIT_FREE);

    /* double free, in two calls and within one call */
    const uint32_t six = 6;
    assert_int_equal(duet_kv_cache_free_pages(c, &six, 1), DUET_OK);
    assert_int_equal(duet_kv_cache_free_pages(c, &six, 1), DUET_ERR_STATE);
    const uint32_t dup[3] = {7, 8, 7};
    assert_int_equal(duet_kv_cache_free_pages(c, dup, 3), DUET_ERR_STATE);
    assert_states(c, 7, 9, DUET_UNIT_USED);
    assert_int_equal(duet_kv_cache_quarantine_pages(c, dup, 3), DUET_ERR_STATE);
    assert_states(c, 7, 9, DUET_UNIT_USED);
    assert_int_equal(duet_kv_cache_free_page_count(c), 9);
    assert_int_equal(duet_kv_cache_quarantined_page_count(c), 0);

    /* out-of-range id: RANGE, nothing changed */
    const uint32_t oor[2] = {9, 16};
    assert_int_equal(duet_kv_cache_free_pages(c, oor, 2), DUET_ERR_RANGE);
    assert_int_equal(duet_kv_cache_quarantine_pages(c, oor, 2), DUET_ERR_RANGE);
    assert_int_equal(duet_kv_cache_release_pages(c, oor, 2), DUET_ERR_RANGE);
    assert_int_equal(duet_kv_cache_page_state(c, 9), DUET_UNIT_USED);
    assert_int_equal((int)duet_kv_cache_page_state(c, 16), -1);
    assert_int_equal(duet_kv_cache_free_page_count(c), 9);

    /* the freed ids are reused, lowest first */
    assert_int_equal(duet_kv_cache_alloc_pages(c, 3, ids), DUET_OK);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 6);
    duet_kv_cache_destroy(&c);
}

static void test_slots(void **state)
{
    (void)state;
    duet_kv_cache_t *c = make_tiny(4, 3);
    uint32_t s;
    assert_int_equal(duet_kv_cache_n_slots(c), 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(duet_kv_cache_alloc_slot(c, &s), DUET_OK);
        assert_int_equal(s, i);
    }
    assert_int_equal(duet_kv_cache_free_slot_count(c), 0);
    assert_int_equal(duet_kv_cache_alloc_slot(c, &s), DUET_ERR_NO_SPACE);

    assert_int_equal(duet_kv_cache_quarantine_slot(c, 1), DUET_OK);
    assert_int_equal(duet_kv_cache_quarantined_slot_count(c), 1);
    assert_int_equal(duet_kv_cache_alloc_slot(c, &s), DUET_ERR_NO_SPACE);
    assert_int_equal(duet_kv_cache_free_slot(c, 1), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_quarantine_slot(c, 1), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_release_slot(c, 0), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_release_slot(c, 1), DUET_OK);
    assert_int_equal(duet_kv_cache_release_slot(c, 1), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_quarantined_slot_count(c), 0);
    assert_int_equal(duet_kv_cache_free_slot_count(c), 1);

    assert_int_equal(duet_kv_cache_free_slot(c, 2), DUET_OK);
    assert_int_equal(duet_kv_cache_free_slot(c, 2), DUET_ERR_STATE);
    assert_int_equal(duet_kv_cache_free_slot(c, 3), DUET_ERR_RANGE);
    assert_int_equal(duet_kv_cache_quarantine_slot(c, 3), DUET_ERR_RANGE);
    assert_int_equal(duet_kv_cache_release_slot(c, 99), DUET_ERR_RANGE);
    assert_int_equal(duet_kv_cache_free_slot_count(c), 2);
    assert_int_equal(duet_kv_cache_alloc_slot(c, &s), DUET_OK);
    assert_int_equal(s, 1);
    assert_int_equal(duet_kv_cache_alloc_slot(c, &s), DUET_OK);
    assert_int_equal(s, 2);
    duet_kv_cache_destroy(&c);
}

static void test_flash_views(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    const uint32_t n_pages = 3, n_slots = 2;
    duet_kv_cache_t *c = NULL;
    assert_int_equal(duet_kv_cache_create(&cfg, &fp8_opts, n_pages, n_slots, &c, NULL), DUET_OK);
    assert_int_equal(duet_kv_cache_config(c)->num_hidden_layers, 43);
    assert_int_equal(duet_kv_cache_opts(c)->page_tokens, 256);

    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(c, (duet_pool_kind_t)k);
        uint32_t units = l->paged ? n_pages : n_slots;
        assert_int_equal(duet_kv_cache_pool_bytes(c, (duet_pool_kind_t)k),
                         (size_t)l->n_layers * units * l->page_bytes);
        assert_non_null(duet_kv_cache_pool_base(c, (duet_pool_kind_t)k));
        assert_int_equal((uintptr_t)duet_kv_cache_pool_base(c, (duet_pool_kind_t)k) % 64, 0);
    }
    assert_int_equal(duet_kv_cache_layout(c, DUET_POOL_C4_KV)->page_bytes, 37440);

    uint8_t *prev[DUET_POOL_COUNT] = {0};
    int seen[DUET_POOL_COUNT] = {0};
    for (int layer = 0; layer < 43; layer++) {
        duet_cache_layer_t v;
        assert_int_equal(duet_kv_cache_layer(c, layer, &v), DUET_OK);
        assert_int_equal(v.layer, layer);
        assert_int_equal(v.ratio, cfg.compress_ratios[layer]);
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            int has = k == DUET_POOL_SWA_KV ||
                      (v.ratio == 4 && (k == DUET_POOL_C4_KV || k == DUET_POOL_C4_INDEX_K || k == DUET_POOL_STATE_C4)) ||
                      (v.ratio == 128 && (k == DUET_POOL_C128_KV || k == DUET_POOL_STATE_C128));
            if (!has) {
                assert_null(v.base[k]);
                assert_null(duet_cache_layer_unit(&v, (duet_pool_kind_t)k, 0));
                continue;
            }
            const duet_cache_layout_t *l = v.layout[k];
            assert_true(l == duet_kv_cache_layout(c, (duet_pool_kind_t)k));
            uint8_t *pool = duet_kv_cache_pool_base(c, (duet_pool_kind_t)k);
            size_t bytes = duet_kv_cache_pool_bytes(c, (duet_pool_kind_t)k);
            uint32_t units = l->paged ? n_pages : n_slots;
            assert_int_equal(v.n_units[k], units);
            /* the layer's block lies inside the pool, right after the previous layer's */
            assert_true(v.base[k] >= pool);
            assert_true(v.base[k] + (size_t)units * l->page_bytes <= pool + bytes);
            size_t li = k == DUET_POOL_SWA_KV ? (size_t)layer
                                              : (size_t)duet_cfg_ratio_layer_index(&cfg, layer);
            assert_true(v.base[k] == pool + li * units * l->page_bytes);
            if (prev[k])
                assert_true(v.base[k] == prev[k] + (size_t)units * l->page_bytes);
            prev[k] = v.base[k];
            seen[k]++;
            assert_true(duet_cache_layer_unit(&v, (duet_pool_kind_t)k, units - 1) ==
                        v.base[k] + (size_t)(units - 1) * l->page_bytes);
            assert_null(duet_cache_layer_unit(&v, (duet_pool_kind_t)k, units));
        }
    }
    assert_int_equal(seen[DUET_POOL_C4_KV], 21);
    assert_int_equal(seen[DUET_POOL_C4_INDEX_K], 21);
    assert_int_equal(seen[DUET_POOL_STATE_C4], 21);
    assert_int_equal(seen[DUET_POOL_C128_KV], 20);
    assert_int_equal(seen[DUET_POOL_STATE_C128], 20);
    assert_int_equal(seen[DUET_POOL_SWA_KV], 43);

    /* the last layer of each pool ends exactly at the pool's end */
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(c, (duet_pool_kind_t)k);
        uint32_t units = l->paged ? n_pages : n_slots;
        assert_true(prev[k] + (size_t)units * l->page_bytes ==
                    duet_kv_cache_pool_base(c, (duet_pool_kind_t)k) + duet_kv_cache_pool_bytes(c, (duet_pool_kind_t)k));
    }

    duet_cache_layer_t v;
    assert_int_equal(duet_kv_cache_layer(c, 43, &v), DUET_ERR_RANGE);
    assert_int_equal(duet_kv_cache_layer(c, -1, &v), DUET_ERR_RANGE);
    duet_kv_cache_destroy(&c);
}

/* A pool with no layers (no ratio-128 layer) or no units has no memory. */
static void test_empty_pools(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    tiny_config(&cfg);
    cfg.compress_ratios[2] = 4;
    duet_kv_cache_t *c = NULL;
    assert_int_equal(duet_kv_cache_create(&cfg, &fp8_opts, 2, 0, &c, NULL), DUET_OK);
    assert_null(duet_kv_cache_pool_base(c, DUET_POOL_C128_KV));
    assert_int_equal(duet_kv_cache_pool_bytes(c, DUET_POOL_C128_KV), 0);
    assert_null(duet_kv_cache_pool_base(c, DUET_POOL_SWA_KV)); /* no slots */
    assert_non_null(duet_kv_cache_pool_base(c, DUET_POOL_C4_KV));
    uint32_t s;
    assert_int_equal(duet_kv_cache_alloc_slot(c, &s), DUET_ERR_NO_SPACE);
    duet_cache_layer_t v;
    assert_int_equal(duet_kv_cache_layer(c, 2, &v), DUET_OK);
    assert_non_null(v.base[DUET_POOL_C4_KV]);
    assert_null(v.base[DUET_POOL_SWA_KV]);
    assert_null(duet_cache_layer_unit(&v, DUET_POOL_SWA_KV, 0));
    duet_kv_cache_destroy(&c);
}

typedef struct {
    int calls[16];
    int n;
    int fail_layer;
} gate_rec_t;

static duet_status_t record_gate(void *arg, int layer)
{
    gate_rec_t *g = arg;
    if (g->n < 16)
        g->calls[g->n++] = layer;
    return layer == g->fail_layer ? DUET_ERR_BUSY : DUET_OK;
}

static void test_layer_gate(void **state)
{
    (void)state;
    duet_kv_cache_t *c = make_tiny(2, 2);
    gate_rec_t g = {.n = 0, .fail_layer = -1};
    duet_cache_layer_t v;
    duet_kv_cache_set_layer_gate(c, record_gate, &g);
    assert_int_equal(duet_kv_cache_layer(c, 3, &v), DUET_OK);
    assert_int_equal(duet_kv_cache_layer(c, 0, &v), DUET_OK);
    assert_int_equal(duet_kv_cache_layer(c, 5, &v), DUET_ERR_RANGE); /* the gate never sees a bad layer */
    assert_int_equal(g.n, 2);
    assert_int_equal(g.calls[0], 3);
    assert_int_equal(g.calls[1], 0);

    /* a failing gate: its status comes back and the view is not filled */
    g.fail_layer = 1;
    memset(&v, 0x7e, sizeof v);
    assert_int_equal(duet_kv_cache_layer(c, 1, &v), DUET_ERR_BUSY);
    assert_int_equal(v.layer, 0x7e7e7e7e);
    assert_int_equal(duet_kv_cache_layer(c, 2, &v), DUET_OK);
    assert_int_equal(g.n, 4);

    /* cleared: no more calls */
    duet_kv_cache_set_layer_gate(c, NULL, NULL);
    assert_int_equal(duet_kv_cache_layer(c, 1, &v), DUET_OK);
    assert_int_equal(g.n, 4);
    duet_kv_cache_destroy(&c);
}

/* Two threads allocating and freeing at once keep the counts exact. */
static void *churn(void *arg)
{
    duet_kv_cache_t *c = arg;
    uint32_t ids[8], s;
    for (int i = 0; i < 2000; i++) {
        if (duet_kv_cache_alloc_pages(c, 8, ids) == DUET_OK) {
            if (i % 3 == 0) {
                duet_kv_cache_quarantine_pages(c, ids, 8);
                duet_kv_cache_release_pages(c, ids, 8);
            } else {
                duet_kv_cache_free_pages(c, ids, 8);
            }
        }
        if (duet_kv_cache_alloc_slot(c, &s) == DUET_OK)
            duet_kv_cache_free_slot(c, s);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    duet_kv_cache_t *c = make_tiny(20, 1);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, c), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(duet_kv_cache_free_page_count(c), 20);
    assert_int_equal(duet_kv_cache_quarantined_page_count(c), 0);
    assert_int_equal(duet_kv_cache_free_slot_count(c), 1);
    assert_states(c, 0, 20, DUET_UNIT_FREE);
    duet_kv_cache_destroy(&c);
}

/* duet_kv_cache_entries against the division it replaces: runs starting anywhere in a page,
 * crossing several pages, ending on a page boundary, one entry a page, and empty. */
static void test_entries(void **state)
{
    (void)state;
    uint32_t pages[64], unit[700], idx[700];
    for (int i = 0; i < 64; i++)
        pages[i] = 1000u + 7u * (uint32_t)i; /* not their positions */
    const uint32_t epps[] = {1, 3, 4, 16, 64};
    const int64_t firsts[] = {0, 1, 15, 16, 33, 60};
    const size_t counts[] = {0, 1, 2, 16, 47, 64};
    for (size_t a = 0; a < sizeof epps / sizeof *epps; a++)
        for (size_t b = 0; b < sizeof firsts / sizeof *firsts; b++)
            for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
                uint32_t epp = epps[a];
                int64_t first = firsts[b];
                size_t n = counts[k];
                if ((size_t)first + n > (size_t)epp * 64)
                    continue;
                memset(unit, 0xab, sizeof unit);
                memset(idx, 0xab, sizeof idx);
                duet_kv_cache_entries(pages, first, n, epp, unit, idx);
                for (size_t i = 0; i < n; i++) {
                    int64_t e = first + (int64_t)i;
                    assert_int_equal(unit[i], pages[e / epp]);
                    assert_int_equal(idx[i], (uint32_t)(e % epp));
                }
                assert_int_equal(unit[n], 0xababababu); /* nothing written past the run */
                assert_int_equal(idx[n], 0xababababu);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_alloc_all),
        cmocka_unit_test(test_no_space_all_or_nothing),
        cmocka_unit_test(test_page_transitions),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_flash_views),
        cmocka_unit_test(test_empty_pools),
        cmocka_unit_test(test_layer_gate),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
