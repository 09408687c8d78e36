/* Cache pool layouts and the entry codecs (contract in cache_layout.h).
 *
 * This is the only place that turns model dims and cache options into byte
 * sizes; the CPU entry store/load below are the reference encodings the copy
 * kernels are checked against. */
#include "cache_layout.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "hash.h"

#define FP8_MAX 448.0f
#define KV_SCALE_BLOCK 64 /* nope values per ue8m0 scale */
/* Fingerprint version: bump when the meaning of any layout field changes. */
#define LAYOUT_TAG "duet.cache_layout.v1"
/* Upper bound on model dims accepted here, so every byte count fits its field. */
#define MAX_DIM 65536

static uint64_t round_up_u64(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static int is_vec_dtype(duet_cache_dtype_t dt) { return dt == DUET_CACHE_FP8 || dt == DUET_CACHE_BF16; }

static duet_status_t check_inputs(const duet_model_config_t *cfg, const duet_cache_opts_t *opts,
                                  duet_pool_kind_t kind, duet_err_t *err)
{
    if (!cfg || !opts)
        return duet_err_set(err, DUET_ERR_INVALID, "cache layout: NULL config or options");
    if ((unsigned)kind >= DUET_POOL_COUNT)
        return duet_err_set(err, DUET_ERR_INVALID, "cache layout: unknown pool kind %d", (int)kind);
    if (opts->page_tokens <= 0 || opts->page_tokens % 128 != 0 || opts->page_tokens > (1 << 20))
        return duet_err_set(err, DUET_ERR_INVALID,
                            "cache layout: page_tokens %d is not a positive multiple of 128 (at most 2^20)",
                            opts->page_tokens);
    if (!is_vec_dtype(opts->kv_dtype))
        return duet_err_set(err, DUET_ERR_INVALID, "cache layout: kv dtype %d is not fp8 or bf16",
                            (int)opts->kv_dtype);
    if (!is_vec_dtype(opts->index_k_dtype))
        return duet_err_set(err, DUET_ERR_INVALID, "cache layout: index-k dtype %d is not fp8 or bf16",
                            (int)opts->index_k_dtype);
    if (cfg->num_hidden_layers <= 0 || cfg->num_hidden_layers > DUET_MAX_LAYERS)
        return duet_err_set(err, DUET_ERR_CONFIG, "cache layout: num_hidden_layers %d out of range",
                            cfg->num_hidden_layers);
    if (cfg->head_dim <= 0 || cfg->head_dim > MAX_DIM || cfg->qk_rope_head_dim < 0 ||
        cfg->qk_rope_head_dim >= cfg->head_dim)
        return duet_err_set(err, DUET_ERR_CONFIG, "cache layout: head_dim %d / qk_rope_head_dim %d invalid",
                            cfg->head_dim, cfg->qk_rope_head_dim);
    if (cfg->index_head_dim <= 0 || cfg->index_head_dim > MAX_DIM)
        return duet_err_set(err, DUET_ERR_CONFIG, "cache layout: index_head_dim %d invalid", cfg->index_head_dim);
    if (cfg->sliding_window <= 0 || cfg->sliding_window > (1 << 20))
        return duet_err_set(err, DUET_ERR_CONFIG, "cache layout: sliding_window %d invalid", cfg->sliding_window);
    return DUET_OK;
}

/* Data/scale rows of a K=V entry (head_dim values, nope + rope). */
static void kv_rows(const duet_model_config_t *cfg, duet_cache_dtype_t dt, duet_cache_layout_t *l)
{
    l->vec_dim = (uint32_t)cfg->head_dim;
    l->rope_dim = (uint32_t)cfg->qk_rope_head_dim;
    l->nope_dim = l->vec_dim - l->rope_dim;
    if (dt == DUET_CACHE_FP8) {
        l->entry_data_bytes = l->nope_dim + 2 * l->rope_dim;
        l->entry_scale_bytes = (uint32_t)round_up_u64((l->nope_dim + KV_SCALE_BLOCK - 1) / KV_SCALE_BLOCK, 8);
        l->align = l->entry_data_bytes; /* as sglang's serving layout: page padded to whole data rows */
    } else {
        /* nope/rope stay filled (the split of the vector); everything is bf16. */
        l->entry_data_bytes = 2 * l->vec_dim;
        l->entry_scale_bytes = 0;
        l->align = 64;
    }
}

static void index_rows(const duet_model_config_t *cfg, duet_cache_dtype_t dt, duet_cache_layout_t *l)
{
    l->vec_dim = (uint32_t)cfg->index_head_dim;
    l->entry_data_bytes = dt == DUET_CACHE_FP8 ? l->vec_dim : 2 * l->vec_dim;
    l->entry_scale_bytes = dt == DUET_CACHE_FP8 ? 4 : 0; /* one fp32 */
    l->align = 64;
}

static void state_rows(uint32_t floats, duet_cache_layout_t *l)
{
    l->vec_dim = floats;
    l->entry_data_bytes = 4 * floats;
    l->entry_scale_bytes = 0;
    l->align = 64;
}

duet_status_t duet_cache_layout_compute(const duet_model_config_t *cfg, const duet_cache_opts_t *opts,
                                        duet_pool_kind_t kind, duet_cache_layout_t *out, duet_err_t *err)
{
    duet_status_t st = check_inputs(cfg, opts, kind, err);
    if (st != DUET_OK)
        return st;

    duet_cache_layout_t l;
    memset(&l, 0, sizeof l);
    l.kind = kind;
    uint32_t pt = (uint32_t)opts->page_tokens, hd = (uint32_t)cfg->head_dim, ihd = (uint32_t)cfg->index_head_dim;
    switch (kind) {
    case DUET_POOL_C4_KV:
        l.dtype = opts->kv_dtype;
        l.n_layers = (uint32_t)duet_cfg_count_ratio(cfg, 4);
        l.paged = 1;
        l.entries_per_page = pt / 4;
        kv_rows(cfg, l.dtype, &l);
        break;
    case DUET_POOL_C4_INDEX_K:
        l.dtype = opts->index_k_dtype;
        l.n_layers = (uint32_t)duet_cfg_count_ratio(cfg, 4);
        l.paged = 1;
        l.entries_per_page = pt / 4;
        index_rows(cfg, l.dtype, &l);
        break;
    case DUET_POOL_C128_KV:
        l.dtype = opts->kv_dtype;
        l.n_layers = (uint32_t)duet_cfg_count_ratio(cfg, 128);
        l.paged = 1;
        l.entries_per_page = pt / 128;
        kv_rows(cfg, l.dtype, &l);
        break;
    case DUET_POOL_SWA_KV:
        l.dtype = opts->kv_dtype;
        l.n_layers = (uint32_t)cfg->num_hidden_layers;
        l.paged = 0;
        l.entries_per_page = (uint32_t)cfg->sliding_window;
        kv_rows(cfg, l.dtype, &l);
        break;
    case DUET_POOL_STATE_C4:
        /* 2*ratio rows (the current window and the overlap); per row the
         * compressor's kv|gate (2*head_dim each) then the indexer's (2*index_head_dim each). */
        l.dtype = DUET_CACHE_F32;
        l.n_layers = (uint32_t)duet_cfg_count_ratio(cfg, 4);
        l.paged = 0;
        l.entries_per_page = 2 * 4;
        state_rows(2 * hd + 2 * hd + 2 * ihd + 2 * ihd, &l);
        break;
    case DUET_POOL_STATE_C128:
        l.dtype = DUET_CACHE_F32;
        l.n_layers = (uint32_t)duet_cfg_count_ratio(cfg, 128);
        l.paged = 0;
        l.entries_per_page = 128;
        state_rows(2 * hd, &l);
        break;
    default:
        return duet_err_set(err, DUET_ERR_INVALID, "cache layout: unknown pool kind %d", (int)kind);
    }
    l.entry_bytes = l.entry_data_bytes + l.entry_scale_bytes;
    uint64_t data = (uint64_t)l.entries_per_page * l.entry_data_bytes;
    l.page_bytes = round_up_u64((uint64_t)l.entries_per_page * l.entry_bytes, l.align);
    if (l.page_bytes > UINT32_MAX) /* scale_offset and in-page offsets are 32-bit */
        return duet_err_set(err, DUET_ERR_INVALID, "cache layout: %s page of %llu bytes is too large",
                            duet_pool_kind_name(kind), (unsigned long long)l.page_bytes);
    l.scale_offset = (uint32_t)data;

    duet_hasher_t *h = duet_hasher_create(0);
    if (!h)
        return duet_err_set(err, DUET_ERR_NOMEM, "cache layout: hasher allocation failed");
    duet_hasher_str(h, LAYOUT_TAG);
    const uint64_t fields[] = {
        (uint64_t)l.kind, (uint64_t)l.dtype, l.n_layers, l.paged, l.entries_per_page, l.vec_dim,
        l.nope_dim, l.rope_dim, l.entry_data_bytes, l.entry_scale_bytes, l.entry_bytes, l.scale_offset,
        l.align, l.page_bytes,
        /* options and model dims, so that layouts equal by coincidence still differ */
        (uint64_t)opts->page_tokens, (uint64_t)opts->kv_dtype, (uint64_t)opts->index_k_dtype,
        (uint64_t)(int64_t)cfg->head_dim, (uint64_t)(int64_t)cfg->qk_rope_head_dim,
        (uint64_t)(int64_t)cfg->index_head_dim, (uint64_t)(int64_t)cfg->sliding_window,
        (uint64_t)(int64_t)cfg->hidden_size, (uint64_t)(int64_t)cfg->num_hidden_layers,
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        duet_hasher_u64(h, fields[i]);
    for (int i = 0; i < cfg->num_hidden_layers; i++)
        duet_hasher_u64(h, (uint64_t)(int64_t)cfg->compress_ratios[i]);
    l.fingerprint = duet_hasher_digest(h);
    duet_hasher_destroy(&h);

    *out = l;
    return DUET_OK;
}

const char *duet_pool_kind_name(duet_pool_kind_t kind)
{
    static const char *const names[DUET_POOL_COUNT] = {
        "c4_kv", "c4_index_k", "c128_kv", "swa_kv", "state_c4", "state_c128",
    };
    return (unsigned)kind < DUET_POOL_COUNT ? names[kind] : "unknown";
}

const char *duet_cache_dtype_name(duet_cache_dtype_t dt)
{
    switch (dt) {
    case DUET_CACHE_FP8: return "fp8";
    case DUET_CACHE_BF16: return "bf16";
    case DUET_CACHE_F32: return "f32";
    }
    return "unknown";
}

int duet_cache_dtype_parse(const char *s)
{
    if (!s)
        return -1;
    if (strcmp(s, "fp8") == 0 || strcmp(s, "fp8_e4m3") == 0)
        return DUET_CACHE_FP8;
    if (strcmp(s, "bf16") == 0)
        return DUET_CACHE_BF16;
    return -1;
}

/* ---- entry codecs ----
 * Rows are byte arrays at arbitrary offsets: multi-byte values (bf16, fp32)
 * go through memcpy in host byte order. */

static void put_bf16(uint8_t *p, float v)
{
    uint16_t h = duet_f32_to_bf16(v);
    memcpy(p, &h, 2);
}

static float get_bf16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return duet_bf16_to_f32(h);
}

static int is_state_pool(duet_pool_kind_t k) { return k == DUET_POOL_STATE_C4 || k == DUET_POOL_STATE_C128; }

/* fp8 KV: nope in 64-value blocks, each block b scaled by the ue8m0 scale
 * s_b = 2^ceil(log2(amax_b/448)), so |v|/s_b <= 448 and the block's largest
 * value lands in [224, 448]; stored byte = e4m3(v / s_b).  A block of zeros
 * (amax 0) takes the scale of amax 1e-4 (2^-22, byte 105): a small finite
 * power of two rather than the degenerate byte 0; its data bytes are all 0
 * and decode to exact zeros.
 * Unused scale bytes (padding to 8) are written 0 so the bytes of an entry
 * are a function of its values alone. */
static void kv_fp8_store(const duet_cache_layout_t *l, uint8_t *row, uint8_t *srow, const float *vec)
{
    uint32_t nope = l->nope_dim;
    memset(srow, 0, l->entry_scale_bytes);
    for (uint32_t b0 = 0, blk = 0; b0 < nope; b0 += KV_SCALE_BLOCK, blk++) {
        uint32_t b1 = b0 + KV_SCALE_BLOCK < nope ? b0 + KV_SCALE_BLOCK : nope;
        float amax = 0.0f;
        for (uint32_t i = b0; i < b1; i++)
            amax = fmaxf(amax, fabsf(vec[i]));
        if (amax == 0.0f)
            amax = 1e-4f;
        uint8_t sb = duet_f32_to_e8m0_ceil(amax / FP8_MAX);
        float scale = duet_e8m0_to_f32(sb);
        srow[blk] = sb;
        for (uint32_t i = b0; i < b1; i++)
            row[i] = duet_f32_to_e4m3(vec[i] / scale); /* exact: scale is a power of two */
    }
    for (uint32_t i = 0; i < l->rope_dim; i++)
        put_bf16(row + nope + 2 * i, vec[nope + i]);
}

static void kv_fp8_load(const duet_cache_layout_t *l, const uint8_t *row, const uint8_t *srow, float *vec)
{
    uint32_t nope = l->nope_dim;
    for (uint32_t i = 0; i < nope; i++)
        vec[i] = duet_e4m3_to_f32(row[i]) * duet_e8m0_to_f32(srow[i / KV_SCALE_BLOCK]);
    for (uint32_t i = 0; i < l->rope_dim; i++)
        vec[nope + i] = get_bf16(row + nope + 2 * i);
}

/* fp8 index-K: one fp32 scale amax/448 per entry (1 for a zero vector). */
static void index_fp8_store(const duet_cache_layout_t *l, uint8_t *row, uint8_t *srow, const float *vec)
{
    float amax = 0.0f;
    for (uint32_t i = 0; i < l->vec_dim; i++)
        amax = fmaxf(amax, fabsf(vec[i]));
    float scale = amax > 0.0f ? amax / FP8_MAX : 1.0f;
    for (uint32_t i = 0; i < l->vec_dim; i++)
        row[i] = duet_f32_to_e4m3(vec[i] / scale);
    memcpy(srow, &scale, 4);
}

static void index_fp8_load(const duet_cache_layout_t *l, const uint8_t *row, const uint8_t *srow, float *vec)
{
    float scale;
    memcpy(&scale, srow, 4);
    for (uint32_t i = 0; i < l->vec_dim; i++)
        vec[i] = duet_e4m3_to_f32(row[i]) * scale;
}

void duet_cache_entry_store(const duet_cache_layout_t *l, uint8_t *page, uint32_t idx, const float *vec)
{
    assert(!is_state_pool(l->kind) && idx < l->entries_per_page);
    if (is_state_pool(l->kind))
        return;
    uint8_t *row = page + (size_t)idx * l->entry_data_bytes;
    uint8_t *srow = page + l->scale_offset + (size_t)idx * l->entry_scale_bytes;
    if (l->dtype == DUET_CACHE_BF16) {
        for (uint32_t i = 0; i < l->vec_dim; i++)
            put_bf16(row + 2 * i, vec[i]);
    } else if (l->kind == DUET_POOL_C4_INDEX_K) {
        index_fp8_store(l, row, srow, vec);
    } else {
        kv_fp8_store(l, row, srow, vec);
    }
}

void duet_cache_entry_load(const duet_cache_layout_t *l, const uint8_t *page, uint32_t idx, float *vec)
{
    assert(!is_state_pool(l->kind) && idx < l->entries_per_page);
    if (is_state_pool(l->kind))
        return;
    const uint8_t *row = page + (size_t)idx * l->entry_data_bytes;
    const uint8_t *srow = page + l->scale_offset + (size_t)idx * l->entry_scale_bytes;
    if (l->dtype == DUET_CACHE_BF16) {
        for (uint32_t i = 0; i < l->vec_dim; i++)
            vec[i] = get_bf16(row + 2 * i);
    } else if (l->kind == DUET_POOL_C4_INDEX_K) {
        index_fp8_load(l, row, srow, vec);
    } else {
        kv_fp8_load(l, row, srow, vec);
    }
}
