/* Cache layouts (DESIGN §4): V4-Flash byte sizes, fingerprints, option
 * checks and the entry codecs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache_layout.h"
#include "dtype.h"

/* DeepSeek-V4-Flash dims, as its config.json. */
static void flash_config(duet_model_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 129280;
    c->hidden_size = 4096;
    c->num_hidden_layers = 43;
    c->num_attention_heads = 64;
    c->num_key_value_heads = 1;
    c->head_dim = 512;
    c->qk_rope_head_dim = 64;
    c->q_lora_rank = 1024;
    c->o_lora_rank = 1024;
    c->o_groups = 8;
    c->n_routed_experts = 256;
    c->n_shared_experts = 1;
    c->num_experts_per_tok = 6;
    c->moe_intermediate_size = 2048;
    c->sliding_window = 128;
    c->index_n_heads = 64;
    c->index_head_dim = 128;
    c->index_topk = 512;
    c->num_nextn_predict_layers = 1;
    /* [0, 0] + [4, 128] * 20 + [4], then the MTP layer's 0 */
    int n = 0;
    c->compress_ratios[n++] = 0;
    c->compress_ratios[n++] = 0;
    for (int i = 0; i < 20; i++) {
        c->compress_ratios[n++] = 4;
        c->compress_ratios[n++] = 128;
    }
    c->compress_ratios[n++] = 4;
    c->compress_ratios[n++] = 0;
    c->n_compress_ratios = n;
}

static duet_cache_opts_t opts_of(duet_cache_dtype_t kv, duet_cache_dtype_t ik)
{
    duet_cache_opts_t o = {.page_tokens = 256, .kv_dtype = kv, .index_k_dtype = ik};
    return o;
}

static duet_cache_layout_t layout_of(const duet_model_config_t *cfg, const duet_cache_opts_t *o, duet_pool_kind_t k)
{
    duet_cache_layout_t l;
    duet_err_t err;
    duet_err_clear(&err);
    assert_int_equal(duet_cache_layout_compute(cfg, o, k, &l, &err), DUET_OK);
    return l;
}

static void test_ratio_helpers(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    assert_int_equal(duet_cfg_count_ratio(&cfg, 0), 2); /* the MTP entry does not count */
    assert_int_equal(duet_cfg_count_ratio(&cfg, 4), 21);
    assert_int_equal(duet_cfg_count_ratio(&cfg, 128), 20);
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, 0), 0);
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, 1), 1);
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, 2), 0);  /* first ratio-4 layer */
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, 3), 0);  /* first ratio-128 layer */
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, 41), 19);
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, 42), 20); /* last ratio-4 layer */
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, 43), -1);
    assert_int_equal(duet_cfg_ratio_layer_index(&cfg, -1), -1);
}

static void test_flash_fp8_sizes(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t o = opts_of(DUET_CACHE_FP8, DUET_CACHE_FP8);

    duet_cache_layout_t l = layout_of(&cfg, &o, DUET_POOL_C4_KV);
    assert_int_equal(l.kind, DUET_POOL_C4_KV);
    assert_int_equal(l.dtype, DUET_CACHE_FP8);
    assert_int_equal(l.n_layers, 21);
    assert_int_equal(l.paged, 1);
    assert_int_equal(l.entries_per_page, 64);
    assert_int_equal(l.vec_dim, 512);
    assert_int_equal(l.nope_dim, 448);
    assert_int_equal(l.rope_dim, 64);
    assert_int_equal(l.entry_data_bytes, 576);
    assert_int_equal(l.entry_scale_bytes, 8);
    assert_int_equal(l.entry_bytes, 584);
    assert_int_equal(l.scale_offset, 64 * 576);
    assert_int_equal(l.align, 576);
    assert_int_equal(l.page_bytes, 37440);

    l = layout_of(&cfg, &o, DUET_POOL_C128_KV);
    assert_int_equal(l.n_layers, 20);
    assert_int_equal(l.paged, 1);
    assert_int_equal(l.entries_per_page, 2);
    assert_int_equal(l.entry_bytes, 584);
    assert_int_equal(l.scale_offset, 2 * 576);
    assert_int_equal(l.page_bytes, 1728);

    l = layout_of(&cfg, &o, DUET_POOL_SWA_KV);
    assert_int_equal(l.n_layers, 43);
    assert_int_equal(l.paged, 0);
    assert_int_equal(l.entries_per_page, 128);
    assert_int_equal(l.entry_bytes, 584);
    assert_int_equal(l.page_bytes, 130 * 576); /* 128*584 = 74752 rounded up to whole 576 B rows */

    l = layout_of(&cfg, &o, DUET_POOL_C4_INDEX_K);
    assert_int_equal(l.dtype, DUET_CACHE_FP8);
    assert_int_equal(l.n_layers, 21);
    assert_int_equal(l.entries_per_page, 64);
    assert_int_equal(l.vec_dim, 128);
    assert_int_equal(l.entry_data_bytes, 128);
    assert_int_equal(l.entry_scale_bytes, 4);
    assert_int_equal(l.entry_bytes, 132);
    assert_int_equal(l.scale_offset, 64 * 128);
    assert_int_equal(l.align, 64);
    assert_int_equal(l.page_bytes, 8448);

    l = layout_of(&cfg, &o, DUET_POOL_STATE_C4);
    assert_int_equal(l.dtype, DUET_CACHE_F32);
    assert_int_equal(l.n_layers, 21);
    assert_int_equal(l.paged, 0);
    assert_int_equal(l.entries_per_page, 8);
    assert_int_equal(l.vec_dim, 2 * 512 + 2 * 512 + 2 * 128 + 2 * 128);
    assert_int_equal(l.entry_data_bytes, 4 * 2560);
    assert_int_equal(l.entry_scale_bytes, 0);
    assert_int_equal(l.page_bytes, 8 * 10240);

    l = layout_of(&cfg, &o, DUET_POOL_STATE_C128);
    assert_int_equal(l.dtype, DUET_CACHE_F32);
    assert_int_equal(l.n_layers, 20);
    assert_int_equal(l.entries_per_page, 128);
    assert_int_equal(l.vec_dim, 1024);
    assert_int_equal(l.page_bytes, 128 * 4096);
}

static void test_flash_bf16_sizes(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t o = opts_of(DUET_CACHE_BF16, DUET_CACHE_BF16);

    duet_cache_layout_t l = layout_of(&cfg, &o, DUET_POOL_C4_KV);
    assert_int_equal(l.dtype, DUET_CACHE_BF16);
    assert_int_equal(l.entry_data_bytes, 1024);
    assert_int_equal(l.entry_scale_bytes, 0);
    assert_int_equal(l.entry_bytes, 1024);
    assert_int_equal(l.align, 64);
    assert_int_equal(l.page_bytes, 64 * 1024);

    l = layout_of(&cfg, &o, DUET_POOL_C128_KV);
    assert_int_equal(l.page_bytes, 2 * 1024);

    l = layout_of(&cfg, &o, DUET_POOL_C4_INDEX_K);
    assert_int_equal(l.dtype, DUET_CACHE_BF16);
    assert_int_equal(l.entry_data_bytes, 256);
    assert_int_equal(l.entry_scale_bytes, 0);
    assert_int_equal(l.entry_bytes, 256);
    assert_int_equal(l.page_bytes, 64 * 256);

    /* page_tokens scales the paged pools only */
    o.page_tokens = 128;
    assert_int_equal(layout_of(&cfg, &o, DUET_POOL_C4_KV).entries_per_page, 32);
    assert_int_equal(layout_of(&cfg, &o, DUET_POOL_C128_KV).entries_per_page, 1);
    assert_int_equal(layout_of(&cfg, &o, DUET_POOL_SWA_KV).entries_per_page, 128);
}

/* One single-field change of the inputs. */
static void vary(int which, duet_model_config_t *c, duet_cache_opts_t *o)
{
    switch (which) {
    case 0: o->kv_dtype = DUET_CACHE_BF16; break;
    case 1: o->index_k_dtype = DUET_CACHE_BF16; break;
    case 2: o->page_tokens = 512; break;
    case 3: o->page_tokens = 128; break;
    case 4: c->head_dim = 576; break;
    case 5: c->qk_rope_head_dim = 32; break;
    case 6: c->index_head_dim = 64; break;
    case 7: c->sliding_window = 256; break;
    case 8: c->compress_ratios[5] = 4; break;    /* a ratio-128 layer becomes ratio 4 */
    case 9: c->compress_ratios[0] = 128; break;  /* a ratio-0 layer becomes ratio 128 */
    case 10: c->compress_ratios[40] = 128; c->compress_ratios[41] = 4; break; /* same counts, other order */
    case 11: c->num_hidden_layers = 42; break;
    case 12: c->hidden_size = 7168; break;
    }
}
#define N_VARIATIONS 13

static void test_fingerprints(void **state)
{
    (void)state;
    duet_model_config_t base_cfg, cfg;
    flash_config(&base_cfg);
    duet_cache_opts_t base_o = opts_of(DUET_CACHE_FP8, DUET_CACHE_FP8), o;
    uint64_t base_fp[DUET_POOL_COUNT];
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        base_fp[k] = layout_of(&base_cfg, &base_o, (duet_pool_kind_t)k).fingerprint;
        /* equal inputs (a fresh copy) give the same fingerprint */
        flash_config(&cfg);
        o = base_o;
        assert_true(layout_of(&cfg, &o, (duet_pool_kind_t)k).fingerprint == base_fp[k]);
        for (int j = 0; j < k; j++)
            assert_true(base_fp[j] != base_fp[k]);
    }
    for (int v = 0; v < N_VARIATIONS; v++) {
        flash_config(&cfg);
        o = base_o;
        vary(v, &cfg, &o);
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            uint64_t fp = layout_of(&cfg, &o, (duet_pool_kind_t)k).fingerprint;
            if (fp == base_fp[k])
                fail_msg("variation %d leaves the %s fingerprint unchanged", v, duet_pool_kind_name((duet_pool_kind_t)k));
        }
    }
    /* MTP entries past num_hidden_layers hold no pools and do not count */
    flash_config(&cfg);
    cfg.compress_ratios[43] = 4;
    assert_true(layout_of(&cfg, &base_o, DUET_POOL_C4_KV).fingerprint == base_fp[DUET_POOL_C4_KV]);
}

static void expect_invalid(const duet_model_config_t *cfg, const duet_cache_opts_t *o, int kind, duet_status_t want)
{
    duet_cache_layout_t l;
    duet_err_t err;
    duet_err_clear(&err);
    assert_int_equal(duet_cache_layout_compute(cfg, o, (duet_pool_kind_t)kind, &l, &err), want);
    assert_int_equal(err.status, want);
    assert_true(err.msg[0] != '\0');
}

static void test_invalid_options(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    const int bad_pt[] = {0, -128, 64, 100, 200, 257};
    for (size_t i = 0; i < sizeof bad_pt / sizeof bad_pt[0]; i++) {
        duet_cache_opts_t o = opts_of(DUET_CACHE_FP8, DUET_CACHE_FP8);
        o.page_tokens = bad_pt[i];
        for (int k = 0; k < DUET_POOL_COUNT; k++)
            expect_invalid(&cfg, &o, k, DUET_ERR_INVALID);
    }
    duet_cache_opts_t o = opts_of(DUET_CACHE_F32, DUET_CACHE_FP8);
    expect_invalid(&cfg, &o, DUET_POOL_C4_KV, DUET_ERR_INVALID);
    o = opts_of(DUET_CACHE_FP8, DUET_CACHE_F32);
    expect_invalid(&cfg, &o, DUET_POOL_C4_INDEX_K, DUET_ERR_INVALID);
    o = opts_of((duet_cache_dtype_t)7, DUET_CACHE_FP8);
    expect_invalid(&cfg, &o, DUET_POOL_SWA_KV, DUET_ERR_INVALID);
    o = opts_of(DUET_CACHE_FP8, DUET_CACHE_FP8);
    expect_invalid(&cfg, &o, DUET_POOL_COUNT, DUET_ERR_INVALID);
    expect_invalid(&cfg, &o, -1, DUET_ERR_INVALID);
    expect_invalid(NULL, &o, DUET_POOL_C4_KV, DUET_ERR_INVALID);
    expect_invalid(&cfg, NULL, DUET_POOL_C4_KV, DUET_ERR_INVALID);
    /* impossible model dims */
    cfg.qk_rope_head_dim = cfg.head_dim;
    expect_invalid(&cfg, &o, DUET_POOL_C4_KV, DUET_ERR_CONFIG);
    flash_config(&cfg);
    cfg.sliding_window = 0;
    expect_invalid(&cfg, &o, DUET_POOL_SWA_KV, DUET_ERR_CONFIG);
}

/* What the GPU indexer's direct pool read (duet_cuda_index_score_cache) takes for granted of
 * every index-K layout: bf16 values on 2-byte boundaries; fp8 scales 4-byte floats on 4-byte
 * boundaries, in pages of whole words.  Across index widths and page sizes. */
static void test_index_k_words(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    const int dims[] = {16, 32, 48, 64, 96, 128, 192, 256};
    const int pts[] = {128, 256, 384, 512, 1024, 4096};
    int checked = 0;
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (size_t p = 0; p < sizeof pts / sizeof pts[0]; p++)
            for (int fp8 = 0; fp8 < 2; fp8++) {
                cfg.index_head_dim = dims[d];
                duet_cache_opts_t o = opts_of(DUET_CACHE_FP8, fp8 ? DUET_CACHE_FP8 : DUET_CACHE_BF16);
                o.page_tokens = pts[p];
                duet_cache_layout_t l = layout_of(&cfg, &o, DUET_POOL_C4_INDEX_K);
                assert_int_equal(l.vec_dim, dims[d]);
                if (fp8) {
                    assert_int_equal(l.entry_scale_bytes, 4);
                    assert_int_equal(l.scale_offset % 4, 0);
                    assert_int_equal(l.page_bytes % 4, 0);
                    assert_int_equal(l.entry_data_bytes, dims[d]);
                } else {
                    assert_int_equal(l.entry_scale_bytes, 0);
                    assert_int_equal(l.entry_data_bytes, 2 * dims[d]);
                    assert_int_equal(l.page_bytes % 2, 0);
                }
                checked++;
            }
    assert_int_equal(checked, 96);
}

static void test_names(void **state)
{
    (void)state;
    const char *names[] = {"c4_kv", "c4_index_k", "c128_kv", "swa_kv", "state_c4", "state_c128"};
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        assert_string_equal(duet_pool_kind_name((duet_pool_kind_t)k), names[k]);
    assert_string_equal(duet_cache_dtype_name(DUET_CACHE_FP8), "fp8");
    assert_string_equal(duet_cache_dtype_name(DUET_CACHE_BF16), "bf16");
    assert_string_equal(duet_cache_dtype_name(DUET_CACHE_F32), "f32");
    assert_int_equal(duet_cache_dtype_parse("fp8"), DUET_CACHE_FP8);
    assert_int_equal(duet_cache_dtype_parse("fp8_e4m3"), DUET_CACHE_FP8);
    assert_int_equal(duet_cache_dtype_parse("bf16"), DUET_CACHE_BF16);
    assert_int_equal(duet_cache_dtype_parse("f32"), -1);
    assert_int_equal(duet_cache_dtype_parse("FP8"), -1);
    assert_int_equal(duet_cache_dtype_parse(""), -1);
}

/* ---- entry codecs ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
/* Uniform in [-1, 1) times 2^e, e spread over a wide range. */
static float rnd_val(int e) { return ldexpf((float)rng() / 2147483648.0f - 1.0f, e); }

/* Fill vec: each 64-block gets its own magnitude (so scales differ), some
 * values exactly zero. */
static void fill_vec(float *v, uint32_t n)
{
    int e = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (i % 64 == 0)
            e = (int)(rng() % 40) - 20;
        v[i] = rng() % 17 == 0 ? 0.0f : rnd_val(e);
    }
}

static uint8_t *page_new(const duet_cache_layout_t *l, uint8_t fill)
{
    uint8_t *p = malloc(l->page_bytes);
    assert_non_null(p);
    memset(p, fill, l->page_bytes);
    return p;
}

/* Bytes of entry idx (data row and scale row) and nothing else changed. */
static void check_only_entry_written(const duet_cache_layout_t *l, const uint8_t *p, uint32_t idx, uint8_t fill)
{
    size_t d0 = (size_t)idx * l->entry_data_bytes, d1 = d0 + l->entry_data_bytes;
    size_t s0 = l->scale_offset + (size_t)idx * l->entry_scale_bytes, s1 = s0 + l->entry_scale_bytes;
    for (size_t i = 0; i < l->page_bytes; i++)
        if (!((i >= d0 && i < d1) || (i >= s0 && i < s1)) && p[i] != fill)
            fail_msg("%s: byte %zu outside entry %u changed", duet_pool_kind_name(l->kind), i, idx);
}

static void test_kv_fp8_roundtrip(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t o = opts_of(DUET_CACHE_FP8, DUET_CACHE_FP8);
    const duet_pool_kind_t kinds[] = {DUET_POOL_C4_KV, DUET_POOL_C128_KV, DUET_POOL_SWA_KV};
    float vec[512], out[512];
    for (size_t ki = 0; ki < 3; ki++) {
        duet_cache_layout_t l = layout_of(&cfg, &o, kinds[ki]);
        uint8_t *p = page_new(&l, 0xa5), *q = page_new(&l, 0xa5);
        uint32_t idxs[] = {0, 1, l.entries_per_page - 1};
        for (int trial = 0; trial < 50; trial++) {
            uint32_t idx = idxs[trial % 3];
            fill_vec(vec, 512);
            memset(p, 0xa5, l.page_bytes);
            duet_cache_entry_store(&l, p, idx, vec);
            check_only_entry_written(&l, p, idx, 0xa5);
            /* deterministic: the same bytes a second time */
            memset(q, 0xa5, l.page_bytes);
            duet_cache_entry_store(&l, q, idx, vec);
            assert_memory_equal(p, q, l.page_bytes);

            duet_cache_entry_load(&l, p, idx, out);
            const uint8_t *srow = p + l.scale_offset + (size_t)idx * l.entry_scale_bytes;
            for (uint32_t b = 0; b < 448 / 64; b++) {
                float amax = 0.0f;
                for (uint32_t i = b * 64; i < b * 64 + 64; i++)
                    amax = fmaxf(amax, fabsf(vec[i]));
                /* the scale is a finite power of two with amax/scale in (224, 448] */
                float s = duet_e8m0_to_f32(srow[b]);
                assert_true(srow[b] > 0 && srow[b] < 255);
                int e;
                assert_true(frexpf(s, &e) == 0.5f);
                if (amax > 0.0f) {
                    assert_true(amax / s > 224.0f && amax / s <= 448.0f);
                }
                for (uint32_t i = b * 64; i < b * 64 + 64; i++)
                    if (fabsf(out[i] - vec[i]) > ldexpf(amax, -4))
                        fail_msg("nope[%u]: %g -> %g (block amax %g)", i, vec[i], out[i], amax);
            }
            for (uint32_t b = 448 / 64; b < l.entry_scale_bytes; b++)
                assert_int_equal(srow[b], 0); /* padding */
            for (uint32_t i = 448; i < 512; i++)
                assert_true(out[i] == duet_bf16_round(vec[i]));
        }
        /* zero vector round-trips to zeros (and a negative zero to a zero) */
        memset(vec, 0, sizeof vec);
        vec[3] = -0.0f;
        duet_cache_entry_store(&l, p, 1, vec);
        duet_cache_entry_load(&l, p, 1, out);
        for (int i = 0; i < 512; i++)
            assert_true(out[i] == 0.0f);
        const uint8_t *srow = p + l.scale_offset + l.entry_scale_bytes;
        assert_int_equal(srow[0], duet_f32_to_e8m0_ceil(1e-4f / 448.0f));
        free(p);
        free(q);
    }
}

static void test_index_fp8_roundtrip(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t o = opts_of(DUET_CACHE_FP8, DUET_CACHE_FP8);
    duet_cache_layout_t l = layout_of(&cfg, &o, DUET_POOL_C4_INDEX_K);
    uint8_t *p = page_new(&l, 0x5a), *q = page_new(&l, 0x5a);
    float vec[128], out[128];
    for (int trial = 0; trial < 100; trial++) {
        uint32_t idx = (uint32_t)trial % l.entries_per_page;
        int e = (int)(rng() % 40) - 20;
        float amax = 0.0f;
        for (int i = 0; i < 128; i++) {
            vec[i] = rnd_val(e);
            amax = fmaxf(amax, fabsf(vec[i]));
        }
        memset(p, 0x5a, l.page_bytes);
        duet_cache_entry_store(&l, p, idx, vec);
        check_only_entry_written(&l, p, idx, 0x5a);
        memset(q, 0x5a, l.page_bytes);
        duet_cache_entry_store(&l, q, idx, vec);
        assert_memory_equal(p, q, l.page_bytes);
        float s;
        memcpy(&s, p + l.scale_offset + 4 * idx, 4);
        assert_true(s == amax / 448.0f);
        duet_cache_entry_load(&l, p, idx, out);
        for (int i = 0; i < 128; i++)
            if (fabsf(out[i] - vec[i]) > ldexpf(amax, -4))
                fail_msg("index[%d]: %g -> %g (amax %g)", i, vec[i], out[i], amax);
    }
    memset(vec, 0, sizeof vec);
    duet_cache_entry_store(&l, p, 2, vec);
    duet_cache_entry_load(&l, p, 2, out);
    for (int i = 0; i < 128; i++)
        assert_true(out[i] == 0.0f);
    free(p);
    free(q);
}

/* bf16 pools: bf16-representable inputs come back exactly. */
static void test_bf16_roundtrip(void **state)
{
    (void)state;
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t o = opts_of(DUET_CACHE_BF16, DUET_CACHE_BF16);
    const duet_pool_kind_t kinds[] = {DUET_POOL_C4_KV, DUET_POOL_C4_INDEX_K, DUET_POOL_C128_KV, DUET_POOL_SWA_KV};
    float vec[512], out[512];
    for (size_t ki = 0; ki < 4; ki++) {
        duet_cache_layout_t l = layout_of(&cfg, &o, kinds[ki]);
        uint8_t *p = page_new(&l, 0x33);
        for (int trial = 0; trial < 20; trial++) {
            uint32_t idx = (uint32_t)(rng() % l.entries_per_page);
            fill_vec(vec, l.vec_dim);
            for (uint32_t i = 0; i < l.vec_dim; i++)
                vec[i] = duet_bf16_round(vec[i]);
            memset(p, 0x33, l.page_bytes);
            duet_cache_entry_store(&l, p, idx, vec);
            check_only_entry_written(&l, p, idx, 0x33);
            duet_cache_entry_load(&l, p, idx, out);
            assert_memory_equal(out, vec, l.vec_dim * sizeof(float));
        }
        free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ratio_helpers),
        cmocka_unit_test(test_flash_fp8_sizes),
        cmocka_unit_test(test_flash_bf16_sizes),
        cmocka_unit_test(test_fingerprints),
        cmocka_unit_test(test_invalid_options),
        cmocka_unit_test(test_index_k_words),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_kv_fp8_roundtrip),
        cmocka_unit_test(test_index_fp8_roundtrip),
        cmocka_unit_test(test_bf16_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
