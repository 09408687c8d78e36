/* duet-bench-tokenizer: single-threaded encode speed of the tokenizer.
 *
 * Encodes every document of a corpus, one encode call per document, with
 * added tokens recognised (what the reference's encode() does), for
 * --passes timed passes after one warm-up pass, and prints MB/s (10^6 bytes
 * of UTF-8 input per second) and a hash of all ids so that
 * tools/bench_tokenizer_ref.py can check that the reference produced the
 * same ids on the same corpus.
 *
 * The corpus is a .jsonl.gz of {"t": text} records (default: the golden
 * parity corpus, 2.5 MB of mixed prose, code, CJK, emoji, numbers,
 * whitespace, special-token text and long documents) or, for any other
 * file, the whole file as one document. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <zlib.h>

#include "duet_config.h"
#include "tokenizer.h"

typedef struct {
    char *text;
    size_t len;
} doc_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whole file (gunzipped when it is gzip) into a new buffer. */
static char *slurp(const char *path, size_t *len)
{
    gzFile gz = gzopen(path, "rb");
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    int k;
    if (!gz || !buf) {
        free(buf);
        if (gz)
            gzclose(gz);
        return NULL;
    }
    while ((k = gzread(gz, buf + n, (unsigned)(cap - n))) > 0) {
        n += (size_t)k;
        if (n == cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) {
                free(buf);
                gzclose(gz);
                return NULL;
            }
            buf = p;
        }
    }
    gzclose(gz);
    *len = n;
    return buf;
}

static doc_t *load_docs(const char *path, size_t *ndocs)
{
    size_t len, n = 0, cap = 0;
    char *buf = slurp(path, &len);
    doc_t *docs = NULL;
    size_t pl = strlen(path);
    if (!buf)
        return NULL;
    if (pl < 9 || strcmp(path + pl - 9, ".jsonl.gz") != 0) {
        docs = malloc(sizeof *docs);
        docs[0] = (doc_t){ buf, len };
        *ndocs = 1;
        return docs;
    }
    for (char *line = buf, *end; line < buf + len; line = end + 1) {
        json_error_t jerr;
        end = memchr(line, '\n', (size_t)(buf + len - line));
        if (!end)
            end = buf + len;
        json_t *o = json_loadb(line, (size_t)(end - line), JSON_ALLOW_NUL, &jerr);
        json_t *t = json_object_get(o, "t");
        if (!json_is_string(t)) {
            json_decref(o);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            docs = realloc(docs, cap * sizeof *docs);
        }
        docs[n].len = json_string_length(t);
        docs[n].text = malloc(docs[n].len + 1);
        memcpy(docs[n].text, json_string_value(t), docs[n].len);
        n++;
        json_decref(o);
    }
    free(buf);
    *ndocs = n;
    return docs;
}

int main(int argc, char **argv)
{
    const char *tok_path = DUET_SOURCE_ROOT "/data/tokenizer/deepseek-v4/tokenizer.json";
    const char *corpus = DUET_SOURCE_ROOT "/tests/text/golden/tokenizer-corpus.jsonl.gz";
    int passes = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tok_path = argv[++i];
        else if (!strcmp(argv[i], "--corpus") && i + 1 < argc)
            corpus = argv[++i];
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc)
            passes = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--tokenizer tokenizer.json] [--corpus file] [--passes N]\n", argv[0]);
            return 2;
        }
    }
    duet_tok_t *t;
    duet_err_t err = { 0 };
    double t0 = now();
    if (duet_tok_create(tok_path, NULL, &t, &err) != DUET_OK) {
        fprintf(stderr, "duet-bench-tokenizer: %s\n", duet_err_text(&err));
        return 1;
    }
    double load_s = now() - t0;
    size_t ndocs = 0, bytes = 0;
    doc_t *docs = load_docs(corpus, &ndocs);
    if (!docs || !ndocs) {
        fprintf(stderr, "duet-bench-tokenizer: cannot read documents from %s\n", corpus);
        return 1;
    }
    for (size_t i = 0; i < ndocs; i++)
        bytes += docs[i].len;

    duet_tok_ids_t ids = { 0 };
    uint64_t hash = 1469598103934665603ull;
    size_t nids = 0;
    double best = 1e30, total = 0;
    for (int p = 0; p <= passes; p++) { /* pass 0 warms up */
        double s = now();
        for (size_t i = 0; i < ndocs; i++) {
            ids.len = 0;
            if (duet_tok_encode(t, docs[i].text, docs[i].len, true, &ids, &err) != DUET_OK) {
                fprintf(stderr, "duet-bench-tokenizer: %s\n", duet_err_text(&err));
                return 1;
            }
            if (p == 0) { /* FNV-1a over every id, in order */
                for (size_t k = 0; k < ids.len; k++)
                    hash = (hash ^ (uint32_t)ids.ids[k]) * 1099511628211ull;
                nids += ids.len;
            }
        }
        double d = now() - s;
        if (p > 0) {
            total += d;
            best = d < best ? d : best;
        }
    }
    printf("duet-bench-tokenizer: %zu documents, %.2f MB, %zu ids, load %.3f s\n", ndocs, bytes / 1e6, nids, load_s);
    printf("duet: %.2f MB/s mean, %.2f MB/s best over %d passes (single thread)\n",
           passes ? bytes / 1e6 / (total / passes) : 0.0, passes ? bytes / 1e6 / best : 0.0, passes);
    printf("RESULT bytes=%zu ids=%zu hash=%016llx mean_mbps=%.3f best_mbps=%.3f\n", bytes, nids,
           (unsigned long long)hash, passes ? bytes / 1e6 / (total / passes) : 0.0, passes ? bytes / 1e6 / best : 0.0);
    duet_tok_ids_fini(&ids);
    for (size_t i = 0; i < ndocs; i++)
        free(docs[i].text);
    free(docs);
    duet_tok_destroy(&t);
    return 0;
}
