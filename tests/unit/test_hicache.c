/* HiCache core: the radix tree over page-aligned prefixes, the device and
 * host tiers, the write policies, LRU eviction under pressure, the layer
 * gate with a delayed load, and bad input.
 *
 * Requests are simulated without a model: "computing" tokens [a, b) writes
 * every paged pool's pages of that range with a byte derived from the prefix
 * that ends at the page, and the slot (ring/state pools) with a byte derived
 * from the whole prefix computed so far.  A hit must then hand back exactly
 * those bytes, wherever they were kept. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "hicache.h"
#include "time_util.h"
#include "../cache_fixture.h"

#define PT 128

typedef struct {
    duet_kv_cache_t *cache;
    duet_hicache_t *hc;
} env_t;

static uint32_t g_load_timeout_ms = 5000;

static env_t make_env(uint32_t pages, uint32_t dev_budget, double host_pages, duet_hicache_policy_t pol, uint32_t n)
{
    duet_model_config_t cfg;
    tiny_config(&cfg);
    duet_cache_opts_t o = {.page_tokens = PT, .kv_dtype = DUET_CACHE_FP8, .index_k_dtype = DUET_CACHE_BF16};
    env_t e = {0};
    duet_err_t err = {0};
    assert_int_equal(duet_kv_cache_create(&cfg, &o, pages, 4, &e.cache, &err), DUET_OK);
    uint64_t unit = 0;
    for (int k = 0; k < 3; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(e.cache, (duet_pool_kind_t)k);
        unit += (uint64_t)l->n_layers * l->page_bytes;
    }
    duet_hicache_opts_t ho = {.device_pages = dev_budget, .host_bytes = (uint64_t)(host_pages * (double)unit),
                              .policy = pol, .selective_hits = n, .load_timeout_ms = g_load_timeout_ms};
    if (duet_hicache_create(e.cache, &ho, &e.hc, &err) != DUET_OK)
        fail_msg("hicache: %s", duet_err_text(&err));
    return e;
}

static void free_env(env_t *e)
{
    duet_hicache_destroy(&e->hc);
    /* every tree page went back */
    assert_int_equal(duet_kv_cache_free_page_count(e->cache), duet_kv_cache_n_pages(e->cache));
    duet_kv_cache_destroy(&e->cache);
}

static uint8_t prefix_byte(const int32_t *tokens, int64_t n, int salt)
{
    uint8_t b = (uint8_t)duet_hash64(tokens, sizeof(int32_t) * (size_t)n, (uint64_t)salt);
    return b ? b : 1; /* never 0, the content of fresh memory */
}

/* "Compute" pages [p0, p1) and the slot after `upto` tokens. */
static void compute(duet_kv_cache_t *c, const uint32_t *pages, uint32_t p0, uint32_t p1, uint32_t slot,
                    const int32_t *tokens, int64_t upto)
{
    for (int l = 0; l < 5; l++) {
        duet_cache_layer_t v;
        assert_int_equal(duet_kv_cache_layer(c, l, &v), DUET_OK);
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            if (!v.base[k])
                continue;
            size_t pb = v.layout[k]->page_bytes;
            if (k <= DUET_POOL_C128_KV) {
                for (uint32_t i = p0; i < p1; i++)
                    memset(duet_cache_layer_unit(&v, (duet_pool_kind_t)k, pages[i]),
                           prefix_byte(tokens, (int64_t)(i + 1) * PT, l * 8 + k), pb);
            } else {
                memset(duet_cache_layer_unit(&v, (duet_pool_kind_t)k, slot), prefix_byte(tokens, upto, l * 8 + k),
                       pb);
            }
        }
    }
}

/* Pages [0, n) and the slot hold what computing `upto` tokens wrote. */
static void check(duet_kv_cache_t *c, const uint32_t *pages, uint32_t n, uint32_t slot, const int32_t *tokens,
                  int64_t upto)
{
    for (int l = 0; l < 5; l++) {
        duet_cache_layer_t v;
        assert_int_equal(duet_kv_cache_layer(c, l, &v), DUET_OK);
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            if (!v.base[k])
                continue;
            size_t pb = v.layout[k]->page_bytes;
            for (uint32_t i = 0; i < (k <= DUET_POOL_C128_KV ? n : 1); i++) {
                const uint8_t *u = duet_cache_layer_unit(&v, (duet_pool_kind_t)k, k <= DUET_POOL_C128_KV ? pages[i]
                                                                                                      : slot);
                uint8_t want = k <= DUET_POOL_C128_KV ? prefix_byte(tokens, (int64_t)(i + 1) * PT, l * 8 + k)
                                                      : prefix_byte(tokens, upto, l * 8 + k);
                for (size_t b = 0; b < pb; b++)
                    if (u[b] != want)
                        fail_msg("layer %d pool %s unit %u byte %zu: %u, expected %u", l,
                                 duet_pool_kind_name((duet_pool_kind_t)k), i, b, u[b], want);
            }
        }
    }
}

/* The pages loaded from the host tier are distinct hit pages. */
static void check_loaded(const duet_hicache_req_t *rq)
{
    assert_true(rq->n_loaded <= rq->hit_pages);
    for (uint32_t i = 0; i < rq->n_loaded; i++) {
        uint32_t j = 0;
        while (j < rq->hit_pages && rq->hit_page_ids[j] != rq->loaded_page_ids[i])
            j++;
        assert_true(j < rq->hit_pages);
        for (uint32_t k = 0; k < i; k++)
            assert_int_not_equal(rq->loaded_page_ids[k], rq->loaded_page_ids[i]);
    }
}

/* One simulated request: returns the hit token count. */
static int64_t run_req(env_t *e, const int32_t *tokens, int64_t n)
{
    duet_err_t err = {0};
    uint32_t slot;
    assert_int_equal(duet_kv_cache_alloc_slot(e->cache, &slot), DUET_OK);
    duet_hicache_req_t rq;
    if (duet_hicache_begin(e->hc, tokens, n, slot, &rq, &err) != DUET_OK)
        fail_msg("begin: %s", duet_err_text(&err));
    uint32_t total = (uint32_t)((n + PT - 1) / PT);
    uint32_t *pages = calloc(total, sizeof(uint32_t));
    if (rq.hit_pages)
        memcpy(pages, rq.hit_page_ids, sizeof(uint32_t) * rq.hit_pages);
    assert_int_equal(duet_kv_cache_alloc_pages(e->cache, total - rq.hit_pages, pages + rq.hit_pages), DUET_OK);
    int64_t hit = rq.hit_tokens;
    assert_true(hit < n);
    check_loaded(&rq);
    if (hit)
        check(e->cache, pages, rq.hit_pages, slot, tokens, hit);
    int64_t done = hit;
    for (int guard = 0; done < n && guard < 8; guard++) {
        int64_t stop = duet_hicache_next_stop(&rq, done, n);
        compute(e->cache, pages, (uint32_t)(done / PT), (uint32_t)((stop + PT - 1) / PT), slot, tokens, stop);
        done = stop;
        if (duet_hicache_is_stop(&rq, done) &&
            duet_hicache_insert(e->hc, &rq, tokens, done, pages, total, slot, &err) != DUET_OK)
            fail_msg("insert: %s", duet_err_text(&err));
    }
    assert_int_equal(done, n);
    check(e->cache, pages, (uint32_t)(n / PT), slot, tokens, n);
    duet_hicache_end(e->hc, &rq, pages, total);
    free(pages);
    assert_int_equal(duet_kv_cache_free_slot(e->cache, slot), DUET_OK);
    return hit;
}

static int32_t *prompt(int n, uint32_t seed)
{
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t[i] = (int32_t)(x % 1000);
    }
    return t;
}

static duet_hicache_stats_t stats(env_t *e)
{
    duet_hicache_stats_t s;
    duet_hicache_stats(e->hc, &s);
    return s;
}

static void test_policy_parse(void **state)
{
    (void)state;
    duet_hicache_policy_t p;
    uint32_t n;
    duet_err_t err = {0};
    assert_int_equal(duet_hicache_policy_parse("write-through", &p, &n, &err), DUET_OK);
    assert_int_equal(p, DUET_HICACHE_WRITE_THROUGH);
    assert_int_equal(duet_hicache_policy_parse("write-back", &p, &n, &err), DUET_OK);
    assert_int_equal(p, DUET_HICACHE_WRITE_BACK);
    assert_int_equal(duet_hicache_policy_parse("write-through-selective:3", &p, &n, &err), DUET_OK);
    assert_int_equal(p, DUET_HICACHE_WRITE_THROUGH_SELECTIVE);
    assert_int_equal(n, 3);
    assert_int_equal(duet_hicache_policy_parse("write-through-selective", &p, &n, &err), DUET_OK);
    assert_int_equal(n, 2);
    const char *bad[] = {"", "write", "write-through-selective:", "write-through-selective:0",
                         "write-through-selective:x", "write-through-selectivex", "write-back:2", NULL};
    for (int i = 0; bad[i]; i++) {
        assert_int_equal(duet_hicache_policy_parse(bad[i], &p, &n, &err), DUET_ERR_INVALID);
        assert_true(err.msg[0] != '\0');
    }
    assert_int_equal(duet_hicache_policy_parse(NULL, &p, &n, &err), DUET_ERR_INVALID);
}

/* Device-tier hits: a repeat, a longer prompt, a prompt branching inside a node (split point), and a
 * page-aligned repeat (the boundary before its end). */
static void test_device_hits(void **state)
{
    (void)state;
    env_t e = make_env(32, 32, 0, DUET_HICACHE_WRITE_THROUGH, 0);
    int32_t *a = prompt(5 * PT, 1);
    assert_int_equal(run_req(&e, a, 3 * PT + 10), 0);     /* inserts [0,3) */
    assert_int_equal(run_req(&e, a, 3 * PT + 10), 3 * PT);
    assert_int_equal(run_req(&e, a, 5 * PT + 10), 3 * PT); /* inserts [3,5) */
    int32_t *b = prompt(6 * PT, 2);
    memcpy(b, a, sizeof(int32_t) * 4 * PT);                /* shares 4 pages: branches inside [3,5) */
    assert_int_equal(run_req(&e, b, 6 * PT), 3 * PT);      /* inserts at 4 (split), 5 and 6 */
    assert_int_equal(run_req(&e, b, 4 * PT + 1), 4 * PT);
    assert_int_equal(run_req(&e, a, 5 * PT + 1), 5 * PT);
    assert_int_equal(run_req(&e, b, 6 * PT + 1), 6 * PT);
    assert_int_equal(run_req(&e, a, 3 * PT), 0);           /* the hit must leave a token: inserts at 2 */
    assert_int_equal(run_req(&e, a, 3 * PT), 2 * PT);
    duet_hicache_stats_t s = stats(&e);
    assert_int_equal(s.hits, 7);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.device_hits, 7);
    assert_int_equal(s.host_hits, 0);
    assert_int_equal(s.loaded_pages, 0);
    assert_int_equal(s.hit_tokens, (3 + 3 + 3 + 4 + 5 + 6 + 2) * PT);
    assert_int_equal(s.nodes, 6); /* a: [0,2) [2,3) [3,4) [4,5); b: [4,5) [5,6) */
    assert_int_equal(s.device_pages, 7);
    free(a);
    free(b);
    free_env(&e);
}

/* Write-through: every node is on the host; after the device copies go, hits load from the host tier. */
static void test_host_hits_write_through(void **state)
{
    (void)state;
    env_t e = make_env(32, 32, 16, DUET_HICACHE_WRITE_THROUGH, 0);
    int32_t *a = prompt(4 * PT, 3);
    assert_int_equal(run_req(&e, a, 4 * PT), 0);
    duet_hicache_stats_t s = stats(&e);
    assert_int_equal(s.backed_up_pages, 4);
    duet_hicache_test_evict_device(e.hc);
    s = stats(&e);
    assert_int_equal(s.device_pages, 0);
    assert_int_equal(s.host_pages_used, 4);
    assert_int_equal(duet_kv_cache_free_page_count(e.cache), 32);
    assert_int_equal(run_req(&e, a, 4 * PT + 5), 4 * PT);
    s = stats(&e);
    assert_int_equal(s.host_hits, 1);
    assert_int_equal(s.loaded_pages, 4);
    /* and once more, now from the device tier */
    assert_int_equal(run_req(&e, a, 4 * PT + 7), 4 * PT);
    assert_int_equal(stats(&e).device_hits, 1);
    free(a);
    free_env(&e);
}

/* Write-back: nothing reaches the host until the device copy is evicted. */
static void test_write_back(void **state)
{
    (void)state;
    env_t e = make_env(32, 32, 16, DUET_HICACHE_WRITE_BACK, 0);
    int32_t *a = prompt(3 * PT, 4);
    assert_int_equal(run_req(&e, a, 3 * PT), 0);
    assert_int_equal(stats(&e).backed_up_pages, 0);
    duet_hicache_test_evict_device(e.hc);
    duet_hicache_stats_t s = stats(&e);
    assert_int_equal(s.backed_up_pages, 3);
    assert_int_equal(s.evicted_device_pages, 3);
    assert_int_equal(run_req(&e, a, 3 * PT + 1), 3 * PT);
    assert_int_equal(stats(&e).host_hits, 1);
    free(a);
    free_env(&e);
}

/* Write-through-selective:2: the host copy is made at the second hit. */
static void test_write_through_selective(void **state)
{
    (void)state;
    env_t e = make_env(32, 32, 16, DUET_HICACHE_WRITE_THROUGH_SELECTIVE, 2);
    int32_t *a = prompt(3 * PT, 5);
    assert_int_equal(run_req(&e, a, 2 * PT), 0);
    assert_int_equal(run_req(&e, a, 2 * PT + 1), 2 * PT);
    assert_int_equal(stats(&e).backed_up_pages, 0);
    assert_int_equal(run_req(&e, a, 2 * PT + 2), 2 * PT);
    assert_int_equal(stats(&e).backed_up_pages, 2);
    duet_hicache_test_evict_device(e.hc);
    assert_int_equal(run_req(&e, a, 2 * PT + 3), 2 * PT);
    assert_int_equal(stats(&e).host_hits, 1);
    /* without a host copy (write-through-selective, one hit) an evicted node is gone */
    int32_t *b = prompt(3 * PT, 6);
    assert_int_equal(run_req(&e, b, 2 * PT), 0);
    duet_hicache_test_evict_device(e.hc);
    assert_int_equal(run_req(&e, b, 2 * PT + 1), 0);
    free(a);
    free(b);
    free_env(&e);
}

/* A device budget of 2 pages and a host tier of 3 pages, with 6 prompts of 2 pages:
 * both tiers evict (LRU) and every hit still returns exact bytes. */
static void test_pressure(void **state)
{
    (void)state;
    env_t e = make_env(16, 2, 3.5, DUET_HICACHE_WRITE_BACK, 0);
    int32_t *p[6];
    for (int i = 0; i < 6; i++)
        p[i] = prompt(2 * PT, 10 + (uint32_t)i);
    for (int round = 0; round < 3; round++) {
        run_req(&e, p[0], 2 * PT + 1 + round);
        for (int i = 1; i < 6; i++) {
            run_req(&e, p[i], 2 * PT + 1 + round);
            run_req(&e, p[i - 1], 2 * PT + 1 + round); /* evicted to the host tier by the run before */
        }
    }
    duet_hicache_stats_t s = stats(&e);
    assert_true(s.host_hits > 0);
    assert_true(s.evicted_device_pages > 0);
    assert_true(s.evicted_host_pages > 0);
    assert_true(s.device_pages <= 2);
    assert_true(s.host_pages_used <= 3);
    assert_int_equal(s.host_pages_total, 3);
    /* the most recent prompt is still cached somewhere */
    assert_int_equal(run_req(&e, p[5], 2 * PT + 9), 2 * PT);
    for (int i = 0; i < 6; i++)
        free(p[i]);
    free_env(&e);
}

/* The worker's pool is full of unreferenced tree pages: a new request evicts them. */
static void test_reclaim_and_no_space(void **state)
{
    (void)state;
    env_t e = make_env(6, 100, 0, DUET_HICACHE_WRITE_THROUGH, 0);
    int32_t *a = prompt(4 * PT, 20), *b = prompt(4 * PT, 21);
    run_req(&e, a, 4 * PT);
    assert_int_equal(stats(&e).device_pages, 4);
    run_req(&e, b, 4 * PT); /* needs 4 of 6 pages: a's node goes */
    assert_int_equal(stats(&e).device_pages, 4);
    assert_int_equal(run_req(&e, a, 2 * PT), 0);
    /* a prompt larger than the pool */
    int32_t *c = prompt(7 * PT, 22);
    duet_hicache_req_t rq;
    duet_err_t err = {0};
    assert_int_equal(duet_hicache_begin(e.hc, c, 7 * PT, 0, &rq, &err), DUET_ERR_NO_SPACE);
    assert_false(rq.active);
    duet_hicache_end(e.hc, &rq, NULL, 0); /* harmless */
    /* bad input */
    assert_int_equal(duet_hicache_begin(e.hc, c, 0, 0, &rq, &err), DUET_ERR_INVALID);
    assert_int_equal(duet_hicache_begin(e.hc, NULL, 5, 0, &rq, &err), DUET_ERR_INVALID);
    uint32_t pg[1] = {0};
    assert_int_equal(duet_hicache_insert(e.hc, &rq, c, PT, pg, 1, 0, &err), DUET_ERR_INVALID);
    assert_int_equal(duet_hicache_begin(e.hc, c, PT + 1, 0, &rq, &err), DUET_OK);
    assert_int_equal(duet_hicache_insert(e.hc, &rq, c, PT / 2, pg, 1, 0, &err), DUET_ERR_RANGE);
    assert_int_equal(duet_hicache_insert(e.hc, &rq, c, 3 * PT, pg, 1, 0, &err), DUET_ERR_RANGE);
    duet_hicache_end(e.hc, &rq, NULL, 0);
    free(a);
    free(b);
    free(c);
    free_env(&e);
}

/* A load whose layer 2 is delayed: a read of layer 2 waits for it (gate on);
 * with the gate off the read returns at once and sees the old bytes. */
/* A request for a + one token: its two-page hit (loads scheduled, not waited for). */
static uint32_t begin_hit(env_t *e, const int32_t *a, duet_hicache_req_t *rq)
{
    duet_err_t err = {0};
    uint32_t slot;
    assert_int_equal(duet_kv_cache_alloc_slot(e->cache, &slot), DUET_OK);
    assert_int_equal(duet_hicache_begin(e->hc, a, 2 * PT + 1, slot, rq, &err), DUET_OK);
    assert_int_equal(rq->hit_pages, 2);
    return slot;
}

/* End begin_hit's request (one page of its own; waits for the load), gate back on. */
static void end_hit(env_t *e, duet_hicache_req_t *rq, uint32_t slot)
{
    uint32_t pages[3];
    memcpy(pages, rq->hit_page_ids, sizeof(uint32_t) * 2);
    assert_int_equal(duet_kv_cache_alloc_pages(e->cache, 1, pages + 2), DUET_OK);
    duet_hicache_end(e->hc, rq, pages, 3);
    duet_hicache_test_set_gate(e->hc, 1);
    assert_int_equal(duet_kv_cache_free_slot(e->cache, slot), DUET_OK);
}

static void test_gate_delay(void **state)
{
    (void)state;
    for (int gate = 1; gate >= 0; gate--) {
        env_t e = make_env(16, 16, 8, DUET_HICACHE_WRITE_THROUGH, 0);
        int32_t *a = prompt(2 * PT, 30);
        run_req(&e, a, 2 * PT);
        duet_hicache_test_evict_device(e.hc);
        /* poison every free page so a read before the copy is visible */
        for (int l = 0; l < 5; l++) {
            duet_cache_layer_t v;
            assert_int_equal(duet_kv_cache_layer(e.cache, l, &v), DUET_OK);
            for (int k = 0; k <= DUET_POOL_C128_KV; k++)
                if (v.base[k])
                    memset(v.base[k], 0, (size_t)v.n_units[k] * v.layout[k]->page_bytes);
        }
        duet_hicache_test_delay_layer(e.hc, 2, 200);
        duet_hicache_test_set_gate(e.hc, gate);
        duet_hicache_req_t rq;
        uint64_t t0 = duet_time_ns();
        uint32_t slot = begin_hit(&e, a, &rq);
        duet_cache_layer_t v;
        assert_int_equal(duet_kv_cache_layer(e.cache, 2, &v), DUET_OK);
        uint64_t waited_ms = (duet_time_ns() - t0) / 1000000;
        uint8_t first = duet_cache_layer_unit(&v, DUET_POOL_C128_KV, rq.hit_page_ids[0])[0];
        if (gate) {
            assert_true(waited_ms >= 150);
            assert_int_equal(first, prefix_byte(a, PT, 2 * 8 + DUET_POOL_C128_KV));
        } else {
            assert_true(waited_ms < 150);
            assert_int_equal(first, 0); /* read before the copy */
        }
        end_hit(&e, &rq, slot);
        free(a);
        free_env(&e);
    }
}

/* duet_hicache_wait (the GPU's per-request wait, without the gate): returns once the hit's
 * pages and resume state are in the pools; TIMEOUT when the load outlasts the bound. */
static void test_wait(void **state)
{
    (void)state;
    for (int late = 0; late < 2; late++) {
        g_load_timeout_ms = late ? 100 : 5000;
        env_t e = make_env(16, 16, 8, DUET_HICACHE_WRITE_THROUGH, 0);
        int32_t *a = prompt(2 * PT, 31);
        run_req(&e, a, 2 * PT);
        duet_hicache_test_evict_device(e.hc);
        duet_hicache_test_delay_layer(e.hc, 4, late ? 400 : 200);
        duet_hicache_test_set_gate(e.hc, 0);
        duet_hicache_req_t rq;
        duet_err_t err = {0};
        uint64_t t0 = duet_time_ns();
        uint32_t slot = begin_hit(&e, a, &rq);
        /* both hit pages come back from the host tier (the device copies were dropped) */
        assert_int_equal(rq.n_loaded, 2);
        check_loaded(&rq);
        duet_status_t st = duet_hicache_wait(e.hc, &rq, &err);
        uint64_t waited_ms = (duet_time_ns() - t0) / 1000000;
        if (late) {
            assert_int_equal(st, DUET_ERR_TIMEOUT);
            assert_true(strstr(err.msg, "did not finish") != NULL);
            assert_true(waited_ms >= 80 && waited_ms < 350);
        } else {
            assert_int_equal(st, DUET_OK);
            assert_true(waited_ms >= 150);
            check(e.cache, rq.hit_page_ids, 2, slot, a, rq.hit_tokens); /* every layer, the slot too */
        }
        end_hit(&e, &rq, slot);
        free(a);
        free_env(&e); /* the copy thread finishes the late load first */
    }
    g_load_timeout_ms = 5000;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_parse),
        cmocka_unit_test(test_device_hits),
        cmocka_unit_test(test_host_hits_write_through),
        cmocka_unit_test(test_write_back),
        cmocka_unit_test(test_write_through_selective),
        cmocka_unit_test(test_pressure),
        cmocka_unit_test(test_reclaim_and_no_space),
        cmocka_unit_test(test_gate_delay),
        cmocka_unit_test(test_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
