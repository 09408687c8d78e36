/* HiCache with the real forward on the tiny fixture (path in argv[1]).
 *
 * Prefill runs the way duet-prefill runs it: begin (hit or not), chunks that
 * end at the request's insert boundaries, insert, end.  Every request is
 * compared bit for bit with a plain single-shot prefill on a fresh cache:
 * the last token's logits and every cache byte decode would receive that
 * holds data (the compressed entries of the prompt in the three paged pools,
 * the sliding-window rows and the compressor/indexer state rows of the last
 * positions).  For every KV x index-K encoding:
 *   - no hit, a device-tier hit, a host-tier hit (after eviction), a hit at
 *     a split point;
 *   - a host tier smaller than the working set (pressure, write-back);
 *   - one layer's load delayed by 150 ms: with the gate, outputs exact; with
 *     the gate turned off, the same run must differ (the test sees the race). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "hicache.h"
#include "test_prompt.h"

#define PT 128
#define N_PAGES 64

static duet_model_t *g_model;

static duet_kv_cache_t *make_cache(duet_cache_dtype_t kv, duet_cache_dtype_t ik)
{
    duet_cache_opts_t o = {.page_tokens = PT, .kv_dtype = kv, .index_k_dtype = ik};
    duet_kv_cache_t *c = NULL;
    duet_err_t err = {0};
    if (duet_kv_cache_create(&g_model->cfg, &o, N_PAGES, 4, &c, &err) != DUET_OK)
        fail_msg("cache: %s", duet_err_text(&err));
    return c;
}

static duet_hicache_t *make_hc(duet_kv_cache_t *c, uint32_t dev_pages, uint32_t host_pages, duet_hicache_policy_t p)
{
    uint64_t unit = 0;
    for (int k = 0; k <= DUET_POOL_C128_KV; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(c, (duet_pool_kind_t)k);
        unit += (uint64_t)l->n_layers * l->page_bytes;
    }
    duet_hicache_opts_t o = {.device_pages = dev_pages, .host_bytes = unit * host_pages, .policy = p,
                             .selective_hits = 2, .load_timeout_ms = 10000};
    duet_hicache_t *hc = NULL;
    duet_err_t err = {0};
    if (duet_hicache_create(c, &o, &hc, &err) != DUET_OK)
        fail_msg("hicache: %s", duet_err_text(&err));
    return hc;
}

/* Bytes of unit `u` of pool `k` in layer view v that hold entry/row `idx`: data row, then scale row. */
static int entry_eq(const duet_cache_layer_t *a, uint32_t ua, const duet_cache_layer_t *b, uint32_t ub,
                    duet_pool_kind_t k, uint32_t idx)
{
    const duet_cache_layout_t *l = a->layout[k];
    const uint8_t *pa = duet_cache_layer_unit(a, k, ua), *pb = duet_cache_layer_unit(b, k, ub);
    if (memcmp(pa + (size_t)idx * l->entry_data_bytes, pb + (size_t)idx * l->entry_data_bytes, l->entry_data_bytes))
        return 0;
    if (l->entry_scale_bytes &&
        memcmp(pa + l->scale_offset + (size_t)idx * l->entry_scale_bytes,
               pb + l->scale_offset + (size_t)idx * l->entry_scale_bytes, l->entry_scale_bytes))
        return 0;
    return 1;
}

/* Every cache byte with data after prefilling n tokens: 1 when equal. */
static int caches_equal(duet_kv_cache_t *ca, const duet_seq_t *sa, duet_kv_cache_t *cb, const duet_seq_t *sb,
                        int64_t n, char *why, size_t why_len)
{
    for (int l = 0; l < g_model->cfg.num_hidden_layers; l++) {
        duet_cache_layer_t va, vb;
        assert_int_equal(duet_kv_cache_layer(ca, l, &va), DUET_OK);
        assert_int_equal(duet_kv_cache_layer(cb, l, &vb), DUET_OK);
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            duet_pool_kind_t kind = (duet_pool_kind_t)k;
            if (!va.base[k])
                continue;
            const duet_cache_layout_t *lay = va.layout[k];
            if (lay->paged) {
                int64_t ratio = k == DUET_POOL_C128_KV ? 128 : 4, n_ent = n / ratio;
                for (int64_t e = 0; e < n_ent; e++) {
                    uint32_t pg = (uint32_t)(e / lay->entries_per_page), idx = (uint32_t)(e % lay->entries_per_page);
                    if (!entry_eq(&va, sa->pages[pg], &vb, sb->pages[pg], kind, idx)) {
                        snprintf(why, why_len, "layer %d %s entry %lld", l, duet_pool_kind_name(kind), (long long)e);
                        return 0;
                    }
                }
            } else {
                int64_t ring = lay->entries_per_page;
                for (int64_t p = n > ring ? n - ring : 0; p < n; p++)
                    if (!entry_eq(&va, sa->slot, &vb, sb->slot, kind, (uint32_t)(p % ring))) {
                        snprintf(why, why_len, "layer %d %s row of position %lld", l, duet_pool_kind_name(kind),
                                 (long long)p);
                        return 0;
                    }
            }
        }
    }
    return 1;
}

typedef struct {
    duet_kv_cache_t *ref;  /* plain prefill */
    duet_kv_cache_t *c;    /* the HiCache worker's pools */
    duet_hicache_t *hc;
    float *want, *got;     /* (vocab) */
    const char *label;
} env_t;

/* Prefill through HiCache and compare with the plain run.  Returns 1 when bit-identical; *hit gets the hit. */
static int run(env_t *e, const int32_t *t, int n, int64_t *hit)
{
    duet_err_t err = {0};
    int V = g_model->cfg.vocab_size;
    /* reference */
    duet_seq_t rs;
    assert_int_equal(duet_seq_init(e->ref, &rs, &err), DUET_OK);
    assert_int_equal(duet_seq_reserve(e->ref, &rs, n, &err), DUET_OK);
    duet_fwd_item_t it = {.seq = &rs, .tokens = t, .n_tokens = n, .logits_mode = DUET_LOGITS_LAST, .logits = e->want};
    if (duet_forward(g_model, e->ref, &it, 1, &err) != DUET_OK)
        fail_msg("reference forward: %s", duet_err_text(&err));
    /* through the tree */
    duet_seq_t s;
    duet_hicache_req_t rq;
    assert_int_equal(duet_seq_init(e->c, &s, &err), DUET_OK);
    if (duet_hicache_begin(e->hc, t, n, s.slot, &rq, &err) != DUET_OK)
        fail_msg("begin: %s", duet_err_text(&err));
    uint32_t total = (uint32_t)((n + PT - 1) / PT);
    s.pages = calloc(total, sizeof(uint32_t));
    s.cap_pages = total;
    if (rq.hit_pages)
        memcpy(s.pages, rq.hit_page_ids, sizeof(uint32_t) * rq.hit_pages);
    s.n_pages = rq.hit_pages;
    s.n_past = rq.hit_tokens;
    *hit = rq.hit_tokens;
    assert_int_equal(duet_seq_reserve(e->c, &s, n, &err), DUET_OK);
    int64_t done = s.n_past;
    for (int guard = 0; done < n && guard < 8; guard++) {
        int64_t stop = duet_hicache_next_stop(&rq, done, n);
        duet_fwd_item_t gi = {.seq = &s, .tokens = t + done, .n_tokens = (int)(stop - done),
                              .logits_mode = stop == n ? DUET_LOGITS_LAST : DUET_LOGITS_NONE,
                              .logits = stop == n ? e->got : NULL};
        if (duet_forward(g_model, e->c, &gi, 1, &err) != DUET_OK)
            fail_msg("forward: %s", duet_err_text(&err));
        done = stop;
        if (duet_hicache_is_stop(&rq, done) &&
            duet_hicache_insert(e->hc, &rq, t, done, s.pages, s.n_pages, s.slot, &err) != DUET_OK)
            fail_msg("insert: %s", duet_err_text(&err));
    }
    char why[160] = "";
    int same = memcmp(e->want, e->got, sizeof(float) * (size_t)V) == 0;
    if (!same)
        snprintf(why, sizeof why, "last-token logits");
    else
        same = caches_equal(e->ref, &rs, e->c, &s, n, why, sizeof why);
    if (!same)
        printf("     %s: %d tokens, hit %lld: differs at %s\n", e->label, n, (long long)*hit, why);
    duet_hicache_end(e->hc, &rq, s.pages, s.n_pages);
    s.n_pages = 0;
    duet_seq_release(e->c, &s);
    duet_seq_release(e->ref, &rs);
    return same;
}

static env_t env_new(duet_cache_dtype_t kv, duet_cache_dtype_t ik, uint32_t dev, uint32_t host,
                     duet_hicache_policy_t p, const char *label)
{
    env_t e = {.ref = make_cache(kv, ik), .c = make_cache(kv, ik), .label = label};
    e.hc = make_hc(e.c, dev, host, p);
    e.want = malloc(sizeof(float) * (size_t)g_model->cfg.vocab_size);
    e.got = malloc(sizeof(float) * (size_t)g_model->cfg.vocab_size);
    return e;
}

static void env_free(env_t *e)
{
    duet_hicache_destroy(&e->hc);
    assert_int_equal(duet_kv_cache_free_page_count(e->c), N_PAGES);
    duet_kv_cache_destroy(&e->c);
    duet_kv_cache_destroy(&e->ref);
    free(e->want);
    free(e->got);
}

/* Prefix of `base` (plen tokens) followed by `tail` tokens of seed `seed`. */
static int32_t *with_tail(const int32_t *base, int plen, int tail, uint64_t seed)
{
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(plen + tail));
    memcpy(t, base, sizeof(int32_t) * (size_t)plen);
    make_prompt(t + plen, tail, seed, g_model->cfg.vocab_size);
    return t;
}

static void check_tiers(duet_cache_dtype_t kv, duet_cache_dtype_t ik)
{
    char label[64];
    snprintf(label, sizeof label, "kv=%s index-k=%s", duet_cache_dtype_name(kv), duet_cache_dtype_name(ik));
    env_t e = env_new(kv, ik, N_PAGES, 16, DUET_HICACHE_WRITE_THROUGH, label);
    int V = g_model->cfg.vocab_size;
    int32_t base[3 * PT];
    make_prompt(base, 3 * PT, 11, V);
    int64_t hit;
    int32_t *a = with_tail(base, 3 * PT, 40, 1), *b = with_tail(base, 3 * PT, 61, 2),
            *c = with_tail(base, 3 * PT, 30, 3), *d = with_tail(base, 2 * PT, 77, 4), *d2 = with_tail(base, 2 * PT, 5, 5);
    assert_true(run(&e, a, 3 * PT + 40, &hit));
    assert_int_equal(hit, 0);
    assert_true(run(&e, b, 3 * PT + 61, &hit)); /* device tier */
    assert_int_equal(hit, 3 * PT);
    duet_hicache_stats_t st;
    duet_hicache_stats(e.hc, &st);
    assert_int_equal(st.device_hits, 1);
    duet_hicache_test_evict_device(e.hc);
    assert_true(run(&e, c, 3 * PT + 30, &hit)); /* host tier, after eviction */
    assert_int_equal(hit, 3 * PT);
    duet_hicache_stats(e.hc, &st);
    assert_int_equal(st.host_hits, 1);
    assert_true(run(&e, d, 2 * PT + 77, &hit)); /* branches inside the node: inserts at the split */
    assert_int_equal(hit, 0);
    assert_true(run(&e, d2, 2 * PT + 5, &hit)); /* continues at the split point */
    assert_int_equal(hit, 2 * PT);
    duet_hicache_test_evict_device(e.hc);
    assert_true(run(&e, d, 2 * PT + 77, &hit)); /* reload: the split node and its tail from the host */
    assert_true(hit >= 2 * PT);
    free(a); free(b); free(c); free(d); free(d2);
    env_free(&e);
}

/* A device budget of 0 pages and a host tier of 3 pages under write-back; prompts of 2 pages: the host
 * tier cannot hold the working set; whatever hits, outputs stay exact. */
static void check_pressure(duet_cache_dtype_t kv, duet_cache_dtype_t ik)
{
    char label[64];
    snprintf(label, sizeof label, "pressure kv=%s index-k=%s", duet_cache_dtype_name(kv), duet_cache_dtype_name(ik));
    env_t e = env_new(kv, ik, 0, 3, DUET_HICACHE_WRITE_BACK, label);
    int V = g_model->cfg.vocab_size;
    int32_t p[4][2 * PT + 20];
    for (int i = 0; i < 4; i++)
        make_prompt(p[i], 2 * PT + 20, 100 + (uint64_t)i, V);
    int64_t hit, hits = 0;
    static const int order[] = {0, 1, 1, 2, 0, 3, 2, 3};
    for (int i = 0; i < 8; i++) {
        assert_true(run(&e, p[order[i]], 2 * PT + 10 + i, &hit));
        hits += hit > 0;
    }
    duet_hicache_stats_t st;
    duet_hicache_stats(e.hc, &st);
    assert_true(st.evicted_host_pages > 0);
    assert_true(st.host_hits > 0);
    assert_true(hits > 0);
    assert_int_equal(st.device_pages, 0);
    env_free(&e);
}

/* Layer 1 (a ratio-4 layer: C4 KV, index-K, compressor state) loads 150 ms late. */
static void check_gate(duet_cache_dtype_t kv, duet_cache_dtype_t ik)
{
    char label[64];
    snprintf(label, sizeof label, "gate kv=%s index-k=%s", duet_cache_dtype_name(kv), duet_cache_dtype_name(ik));
    env_t e = env_new(kv, ik, N_PAGES, 16, DUET_HICACHE_WRITE_THROUGH, label);
    int V = g_model->cfg.vocab_size;
    int32_t base[2 * PT];
    make_prompt(base, 2 * PT, 21, V);
    int64_t hit;
    int32_t *a = with_tail(base, 2 * PT, 10, 1), *b = with_tail(base, 2 * PT, 50, 2);
    assert_true(run(&e, a, 2 * PT + 10, &hit));
    duet_hicache_test_delay_layer(e.hc, 1, 150);
    for (int gate = 1; gate >= 0; gate--) {
        duet_hicache_test_evict_device(e.hc);
        /* poison the free pages and slots: whatever is read before its copy is visible */
        for (int l = 0; l < g_model->cfg.num_hidden_layers; l++) {
            duet_cache_layer_t v;
            assert_int_equal(duet_kv_cache_layer(e.c, l, &v), DUET_OK);
            for (int k = 0; k < DUET_POOL_COUNT; k++) {
                if (!v.base[k])
                    continue;
                for (uint32_t u = 0; u < v.n_units[k]; u++)
                    if (!v.layout[k]->paged || duet_kv_cache_page_state(e.c, u) == DUET_UNIT_FREE)
                        memset(duet_cache_layer_unit(&v, (duet_pool_kind_t)k, u), 0x3c, v.layout[k]->page_bytes);
            }
        }
        if (!gate)
            printf("     %s: gate off, the run below must differ\n", label);
        duet_hicache_test_set_gate(e.hc, gate);
        int same = run(&e, b, 2 * PT + 50, &hit);
        duet_hicache_test_set_gate(e.hc, 1);
        assert_int_equal(hit, 2 * PT);
        if (gate && !same)
            fail_msg("%s: with the gate, a delayed load changed the output", label);
        if (!gate && same)
            fail_msg("%s: without the gate the delayed load went unnoticed: the test cannot see the race", label);
    }
    free(a);
    free(b);
    env_free(&e);
}

#define COMBOS(X) X(bf16, bf16, DUET_CACHE_BF16, DUET_CACHE_BF16) X(bf16, fp8, DUET_CACHE_BF16, DUET_CACHE_FP8) \
    X(fp8, bf16, DUET_CACHE_FP8, DUET_CACHE_BF16) X(fp8, fp8, DUET_CACHE_FP8, DUET_CACHE_FP8)
#define DEFINE(a, b, KV, IK)                                                                       \
    static void test_tiers_##a##_##b(void **state) { (void)state; check_tiers(KV, IK); }          \
    static void test_pressure_##a##_##b(void **state) { (void)state; check_pressure(KV, IK); }    \
    static void test_gate_##a##_##b(void **state) { (void)state; check_gate(KV, IK); }
COMBOS(DEFINE)
#define LIST(a, b, KV, IK) cmocka_unit_test(test_tiers_##a##_##b), cmocka_unit_test(test_pressure_##a##_##b), \
    cmocka_unit_test(test_gate_##a##_##b),

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    duet_err_t err = {0};
    if (duet_model_load(argv[1], &g_model, &err) != DUET_OK) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], duet_err_text(&err));
        return 1;
    }
    const struct CMUnitTest tests[] = {COMBOS(LIST)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    duet_model_destroy(&g_model);
    return rc;
}
