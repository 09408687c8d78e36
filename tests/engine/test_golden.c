/* duet's bf16-cache path against transformers' DeepseekV4ForCausalLM.
 *
 * argv: MODEL_DIR GOLDEN_JSON.  The golden file (tests/reference/golden_logits.py)
 * holds, per prompt and position, the reference argmax over the whole vocabulary and
 * the logits at 64 fixed columns, from a float32 run that rounds cached vectors to
 * bf16 where duet's bf16 cache does ("bf16"), and from a pure float32 run ("f32").
 *
 * Pass: the argmax agrees at every position, the normalized squared error over the
 * stored columns is below 1e-6 for the whole prompt and below 1e-4 at every
 * position.  The same comparison must FAIL with each deliberate fault (wrong rope,
 * a window one key too wide, no compressor overlap, no attention sink): that shows
 * the tolerance is tight enough to see them. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"

#define NMSE_TOTAL_TOL 1e-6
#define NMSE_ROW_TOL 1e-4

typedef struct {
    double nmse_total, nmse_row_max;
    int row_max, argmax_mismatch, first_mismatch;
} cmp_t;

static int run_prompt(const duet_model_t *m, json_t *ids_j, float **out, int *n_out)
{
    int n = (int)json_array_size(ids_j), V = m->cfg.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
    duet_cache_opts_t o = {.page_tokens = 256, .kv_dtype = DUET_CACHE_BF16, .index_k_dtype = DUET_CACHE_BF16};
    duet_kv_cache_t *c = NULL;
    duet_err_t err = {0};
    duet_seq_t s;
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    if (duet_kv_cache_create(&m->cfg, &o, (uint32_t)(n / 256 + 2), 1, &c, &err) != DUET_OK ||
        duet_seq_init(c, &s, &err) != DUET_OK || duet_seq_reserve(c, &s, n, &err) != DUET_OK) {
        fprintf(stderr, "cache: %s\n", duet_err_text(&err));
        return -1;
    }
    duet_fwd_item_t it = {.seq = &s, .tokens = ids, .n_tokens = n, .logits_mode = DUET_LOGITS_ALL, .logits = logits};
    if (duet_forward(m, c, &it, 1, &err) != DUET_OK) {
        fprintf(stderr, "forward: %s\n", duet_err_text(&err));
        return -1;
    }
    duet_seq_release(c, &s);
    duet_kv_cache_destroy(&c);
    free(ids);
    *out = logits;
    *n_out = n;
    return 0;
}

static cmp_t compare(const float *logits, int n, int V, json_t *cols, json_t *ref)
{
    cmp_t r = {0, 0, -1, 0, -1};
    json_t *am = json_object_get(ref, "argmax"), *lg = json_object_get(ref, "logits");
    int nc = (int)json_array_size(cols);
    double num = 0, den = 0;
    for (int p = 0; p < n; p++) {
        const float *row = logits + (size_t)p * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best])
                best = v;
        if (best != json_integer_value(json_array_get(am, (size_t)p))) {
            if (r.first_mismatch < 0)
                r.first_mismatch = p;
            r.argmax_mismatch++;
        }
        double rn = 0, rd = 0;
        for (int j = 0; j < nc; j++) {
            double want = json_number_value(json_array_get(lg, (size_t)p * nc + j));
            double got = row[json_integer_value(json_array_get(cols, (size_t)j))];
            rn += (got - want) * (got - want);
            rd += want * want;
        }
        num += rn;
        den += rd;
        if (rn / rd > r.nmse_row_max) {
            r.nmse_row_max = rn / rd;
            r.row_max = p;
        }
    }
    r.nmse_total = num / den;
    return r;
}

static int passes(const cmp_t *c)
{
    return c->argmax_mismatch == 0 && c->nmse_total < NMSE_TOTAL_TOL && c->nmse_row_max < NMSE_ROW_TOL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR GOLDEN_JSON\n", argv[0]);
        return 2;
    }
    json_error_t je;
    json_t *g = json_load_file(argv[2], 0, &je);
    if (!g) {
        fprintf(stderr, "%s: %s\n", argv[2], je.text);
        return 1;
    }
    duet_model_t *m = NULL;
    duet_err_t err = {0};
    if (duet_model_load(argv[1], &m, &err) != DUET_OK) {
        fprintf(stderr, "%s\n", duet_err_text(&err));
        return 1;
    }
    json_t *prompts = json_object_get(g, "prompts"), *cols = json_object_get(g, "columns");
    json_t *ref = json_object_get(g, "reference");
    int V = m->cfg.vocab_size, failed = 0, checks = 0;
    size_t n_prompts = json_array_size(prompts);
    for (size_t i = 0; i < n_prompts; i++) {
        float *logits;
        int n;
        if (run_prompt(m, json_array_get(prompts, i), &logits, &n) < 0)
            return 1;
        cmp_t b = compare(logits, n, V, cols, json_array_get(json_object_get(ref, "bf16"), i));
        cmp_t f = compare(logits, n, V, cols, json_array_get(json_object_get(ref, "f32"), i));
        int ok = passes(&b);
        printf("%s prompt %zu (%d tokens): vs bf16-cache reference nmse %.2e, worst position %d %.2e, argmax "
               "mismatches %d; vs float32 reference nmse %.2e, argmax mismatches %d\n",
               ok ? "ok  " : "FAIL", i, n, b.nmse_total, b.row_max, b.nmse_row_max, b.argmax_mismatch,
               f.nmse_total, f.argmax_mismatch);
        failed += !ok;
        checks++;
        free(logits);
    }
    /* Each fault must be caught on the longest prompt (it exercises every mechanism). */
    static const struct {
        duet_fault_t f;
        const char *name;
    } faults[] = {{DUET_FAULT_ROPE, "wrong rope"}, {DUET_FAULT_MASK, "window one key too wide"},
                  {DUET_FAULT_OVERLAP, "no compressor overlap"}, {DUET_FAULT_SINK, "no attention sink"}};
    size_t last = n_prompts - 1;
    for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++) {
        duet_forward_fault = faults[k].f;
        float *logits;
        int n;
        if (run_prompt(m, json_array_get(prompts, last), &logits, &n) < 0)
            return 1;
        duet_forward_fault = DUET_FAULT_NONE;
        cmp_t b = compare(logits, n, V, cols, json_array_get(json_object_get(ref, "bf16"), last));
        int caught = !passes(&b);
        printf("%s fault \"%s\": nmse %.2e, worst position %d %.2e, argmax mismatches %d (first at %d)\n",
               caught ? "ok  " : "FAIL", faults[k].name, b.nmse_total, b.row_max, b.nmse_row_max,
               b.argmax_mismatch, b.first_mismatch);
        failed += !caught;
        checks++;
        free(logits);
    }
    printf("%d passed, %d failed\n", checks - failed, failed);
    duet_model_destroy(&m);
    json_decref(g);
    return failed ? 1 : 0;
}
