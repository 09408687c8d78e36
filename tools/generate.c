/* duet-generate: single-process generation on the CPU reference engine (or,
 * with --device cuda[:N], on the GPU forward of engine/forward_cuda.h).
 * Prints the generated token ids on stdout (space separated, one line) and
 * timings on stderr.  It is the oracle that disaggregated serving must match
 * bit for bit. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "duet_config.h"
#include "forward.h"
#if DUET_HAVE_CUDA
#include "tp_cuda.h"
#endif
#include "log.h"
#include "sampling.h"
#include "time_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: duet-generate --model DIR (--prompt-ids 0,1,2 | --prompt-file FILE) [options]\n"
            "  --max-tokens N          tokens to generate (default 16)\n"
            "  --kv-dtype fp8|bf16     KV cache encoding (default bf16)\n"
            "  --index-k-dtype fp8|bf16 indexer key encoding (default bf16)\n"
            "  --temperature T --top-p P --top-k K --min-p M --seed S   sampling (default greedy)\n"
            "  --chunk N               prefill in chunks of N tokens (default: whole prompt)\n"
            "  --page-tokens N         tokens per cache page (default 256)\n"
            "  --stop-at-eos           stop after the model's eos token\n"
            "  --dump-logits FILE      write the prompt's logits (f32, rows x vocab) and exit\n"
            "  --device cpu|cuda[:N]   where the forward runs (default cpu; cuda needs a CUDA build;\n"
            "                          DUET_CUDA_EXACT=1: the CPU engine's bits on the GPU, slowly)\n"
            "  --tp N                  tensor-parallel over GPUs N.. of --device cuda:N (default 1; needs NCCL)\n"
            "  --version\n");
}

/* Parse "1,2,3" or whitespace/comma separated ids. */
static int parse_ids(const char *s, int32_t **out, int *n_out)
{
    int cap = 64, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffff) {
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            ids = realloc(ids, sizeof(int32_t) * (size_t)cap);
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[len] = 0;
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt_ids = NULL, *prompt_file = NULL, *dump = NULL;
    int max_tokens = 16, chunk = 0, page_tokens = 256, stop_eos = 0, device = -1, tp = 1;
    duet_cache_opts_t opts = {.page_tokens = 256, .kv_dtype = DUET_CACHE_BF16, .index_k_dtype = DUET_CACHE_BF16};
    duet_sampling_t sp;
    duet_sampling_default(&sp);
    enum { O_MODEL = 256, O_IDS, O_FILE, O_MAX, O_KV, O_IK, O_T, O_P, O_K, O_MINP, O_SEED, O_CHUNK, O_PT, O_EOS,
           O_DUMP, O_DEV, O_TP, O_VER, O_HELP };
    static const struct option lo[] = {
        {"model", 1, 0, O_MODEL}, {"prompt-ids", 1, 0, O_IDS}, {"prompt-file", 1, 0, O_FILE},
        {"max-tokens", 1, 0, O_MAX}, {"kv-dtype", 1, 0, O_KV}, {"index-k-dtype", 1, 0, O_IK},
        {"temperature", 1, 0, O_T}, {"top-p", 1, 0, O_P}, {"top-k", 1, 0, O_K}, {"min-p", 1, 0, O_MINP},
        {"seed", 1, 0, O_SEED}, {"chunk", 1, 0, O_CHUNK}, {"page-tokens", 1, 0, O_PT},
        {"stop-at-eos", 0, 0, O_EOS}, {"dump-logits", 1, 0, O_DUMP}, {"device", 1, 0, O_DEV}, {"tp", 1, 0, O_TP}, {"version", 0, 0, O_VER},
        {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    int o;
    duet_log_init_from_env();
    duet_log_set_ident("duet-generate");
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case O_MODEL: model_dir = optarg; break;
        case O_IDS: prompt_ids = optarg; break;
        case O_FILE: prompt_file = optarg; break;
        case O_MAX: max_tokens = atoi(optarg); break;
        case O_KV:
        case O_IK: {
            int d = duet_cache_dtype_parse(optarg);
            if (d != DUET_CACHE_FP8 && d != DUET_CACHE_BF16) {
                fprintf(stderr, "duet-generate: INVALID: cache dtype \"%s\" (fp8 or bf16)\n", optarg);
                return 2;
            }
            if (o == O_KV)
                opts.kv_dtype = (duet_cache_dtype_t)d;
            else
                opts.index_k_dtype = (duet_cache_dtype_t)d;
            break;
        }
        case O_T: sp.temperature = strtof(optarg, NULL); break;
        case O_P: sp.top_p = strtof(optarg, NULL); break;
        case O_K: sp.top_k = atoi(optarg); break;
        case O_MINP: sp.min_p = strtof(optarg, NULL); break;
        case O_SEED: sp.seed = strtoull(optarg, NULL, 10); break;
        case O_CHUNK: chunk = atoi(optarg); break;
        case O_PT: page_tokens = atoi(optarg); break;
        case O_EOS: stop_eos = 1; break;
        case O_DUMP: dump = optarg; break;
        case O_DEV:
            if (!strcmp(optarg, "cpu"))
                device = -1;
            else if (!strncmp(optarg, "cuda", 4) && (optarg[4] == 0 || optarg[4] == ':'))
                device = optarg[4] ? atoi(optarg + 5) : 0;
            else {
                fprintf(stderr, "duet-generate: INVALID: device \"%s\" (cpu or cuda[:N])\n", optarg);
                return 2;
            }
            break;
        case O_TP: tp = atoi(optarg); break;
        case O_VER: printf("duet-generate %s\n", DUET_VERSION); return 0;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (tp < 1 || tp > 8 || (tp > 1 && device < 0)) {
        fprintf(stderr, "duet-generate: INVALID: --tp %d (1 to 8, with --device cuda)\n", tp);
        return 2;
    }
    if (!model_dir || (!prompt_ids == !prompt_file) || max_tokens < 0 || chunk < 0) {
        usage(stderr);
        return 2;
    }
    opts.page_tokens = page_tokens;
#if !DUET_HAVE_CUDA
    if (device >= 0) {
        fprintf(stderr, "duet-generate: UNSUPPORTED: this build has no CUDA backend (--device cuda)\n");
        return 2;
    }
#endif
    int32_t *prompt = NULL;
    int n_prompt = 0;
    char *text = prompt_file ? read_file(prompt_file) : NULL;
    if (prompt_file && !text) {
        fprintf(stderr, "duet-generate: IO: %s: %s\n", prompt_file, strerror(errno));
        return 1;
    }
    if (parse_ids(text ? text : prompt_ids, &prompt, &n_prompt) < 0 || n_prompt == 0) {
        fprintf(stderr, "duet-generate: INVALID: the prompt must be a non-empty list of token ids\n");
        free(text);
        return 2;
    }
    free(text);

    duet_err_t err = {0};
    duet_model_t *m = NULL;
    duet_kv_cache_t *cache = NULL;
    duet_seq_t seq = {0};
    float *logits = NULL;
    int rc = 1;
#if DUET_HAVE_CUDA
    duet_tp_cuda_t *tpg = NULL;
#define FORWARD(it) (device >= 0 ? duet_tp_cuda_forward(tpg, (it), 1, NULL, &err) : duet_forward(m, cache, (it), 1, &err))
#else
#define FORWARD(it) duet_forward(m, cache, (it), 1, &err)
#endif
    double t0 = duet_time_s();
    if (duet_model_load(model_dir, &m, &err) != DUET_OK)
        goto fail;
    double t_load = duet_time_s() - t0;
    int64_t total = (int64_t)n_prompt + max_tokens;
    uint32_t n_pages = (uint32_t)((total + page_tokens - 1) / page_tokens) + 1;
    if (duet_kv_cache_create(&m->cfg, &opts, n_pages, 1, &cache, &err) != DUET_OK)
        goto fail;
    if (duet_seq_init(cache, &seq, &err) != DUET_OK || duet_seq_reserve(cache, &seq, total, &err) != DUET_OK)
        goto fail;
#if DUET_HAVE_CUDA
    if (device >= 0 && duet_tp_cuda_open(m, cache, device, tp, &tpg, &err) != DUET_OK)
        goto fail;
#endif
    int V = m->cfg.vocab_size;
    size_t rows = dump ? (size_t)n_prompt : 1;
    logits = duet_malloc_array(rows * (size_t)V, sizeof(float));
    if (!logits) {
        duet_err_set(&err, DUET_ERR_NOMEM, "out of memory for logits");
        goto fail;
    }
    int step = chunk > 0 ? chunk : n_prompt;
    double t1 = duet_time_s();
    for (int off = 0; off < n_prompt; off += step) {
        int n = n_prompt - off < step ? n_prompt - off : step;
        duet_fwd_item_t it = {.seq = &seq, .tokens = prompt + off, .n_tokens = n,
                              .logits_mode = dump ? DUET_LOGITS_ALL : (off + n == n_prompt ? DUET_LOGITS_LAST
                                                                                          : DUET_LOGITS_NONE),
                              .logits = dump ? logits + (size_t)off * V : logits};
        if (FORWARD(&it) != DUET_OK)
            goto fail;
    }
    double t_prefill = duet_time_s() - t1;
    if (dump) {
        FILE *f = fopen(dump, "wb");
        if (!f || fwrite(logits, sizeof(float) * (size_t)V, rows, f) != rows) {
            duet_err_set(&err, DUET_ERR_IO, "%s: cannot write logits", dump);
            if (f)
                fclose(f);
            goto fail;
        }
        fclose(f);
        fprintf(stderr, "duet-generate: wrote %zu x %d logits to %s\n", rows, V, dump);
        rc = 0;
        goto done;
    }
    double t2 = duet_time_s();
    int n_gen = 0;
    for (int i = 0; i < max_tokens; i++) {
        int32_t tok = duet_sample(logits, V, &sp, seq.n_past);
        printf(i ? " %d" : "%d", tok);
        n_gen++;
        if ((stop_eos && tok == m->cfg.eos_token_id) || i + 1 == max_tokens)
            break;
        duet_fwd_item_t it = {.seq = &seq, .tokens = &tok, .n_tokens = 1, .logits_mode = DUET_LOGITS_LAST,
                              .logits = logits};
        if (FORWARD(&it) != DUET_OK)
            goto fail;
    }
    printf("\n");
    double t_decode = duet_time_s() - t2;
    fprintf(stderr,
            "duet-generate: load %.3f s; prefill %d tokens %.3f s (%.1f tok/s); decode %d tokens %.3f s (%.1f tok/s)\n",
            t_load, n_prompt, t_prefill, n_prompt / (t_prefill > 0 ? t_prefill : 1e-9), n_gen, t_decode,
            n_gen > 1 ? (n_gen - 1) / (t_decode > 0 ? t_decode : 1e-9) : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "duet-generate: %s\n", duet_err_text(&err));
done:
    free(logits);
    free(prompt);
#if DUET_HAVE_CUDA
    duet_tp_cuda_close(&tpg);
#endif
    if (cache)
        duet_seq_release(cache, &seq);
    duet_kv_cache_destroy(&cache);
    duet_model_destroy(&m);
    return rc;
}
