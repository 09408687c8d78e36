/* Bad checkpoints are refused, never crashed on.
 *
 * argv: TINY_BF16_DIR DUET_GENERATE.  Each case builds a broken copy of the
 * tiny fixture in its own mkdtemp() directory (config.json edited, shards
 * cut or byte-edited, or every tensor re-written through the safetensors
 * writer with one of them skipped, reshaped or re-typed) and checks that
 *   - duet_model_load returns the case's typed status, with a message naming
 *     the file (or the checkpoint directory) and the tensor or field;
 *   - duet-generate on that directory exits with status 1 (not a signal) and
 *     prints the status code word and the same names on stderr. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model.h"

extern char **environ;

static const char *g_fixture, *g_generate;

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
#define INDEX "model.safetensors.index.json"
#define REWRITTEN "model-00001-of-00001.safetensors" /* what the writer names its one shard */

/* ---- files -------------------------------------------------------------- */

static void path_of(char *out, size_t n, const char *dir, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static void write_all(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* dir/name = the fixture's file, its first `keep` bytes (all when keep < 0). */
static void copy_fixture(const char *dir, const char *name, long keep)
{
    char src[4096], dst[4096];
    size_t n;
    path_of(src, sizeof src, g_fixture, name);
    path_of(dst, sizeof dst, dir, name);
    char *b = read_all(src, &n);
    write_all(dst, b, keep >= 0 && (size_t)keep < n ? (size_t)keep : n);
    free(b);
}

/* Unchanged fixture files are symlinked (they are only read). */
static void link_fixture(const char *dir, const char *name)
{
    char src[4096], dst[4096], abs[4096];
    path_of(src, sizeof src, g_fixture, name);
    path_of(dst, sizeof dst, dir, name);
    assert_non_null(realpath(src, abs));
    assert_int_equal(symlink(abs, dst), 0);
}

static json_t *load_json(const char *dir, const char *name)
{
    char p[4096];
    json_error_t je;
    path_of(p, sizeof p, dir, name);
    json_t *j = json_load_file(p, 0, &je);
    if (!j)
        fail_msg("%s: %s", p, je.text);
    return j;
}

static void save_json(const char *dir, const char *name, json_t *j)
{
    char p[4096];
    path_of(p, sizeof p, dir, name);
    assert_int_equal(json_dump_file(j, p, JSON_INDENT(2)), 0);
    json_decref(j);
}

/* config.json with top-level `key` set to the JSON text `value` (NULL: removed). */
static void config_with(const char *dir, const char *key, const char *value)
{
    json_t *j = load_json(g_fixture, "config.json");
    if (value) {
        json_error_t je;
        json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
        assert_non_null(v);
        json_object_set_new(j, key, v);
    } else {
        json_object_del(j, key);
    }
    save_json(dir, "config.json", j);
}

static void link_shards(const char *dir)
{
    link_fixture(dir, SHARD1);
    link_fixture(dir, SHARD2);
    link_fixture(dir, INDEX);
}

/* ---- re-writing the checkpoint through duet_st_writer -------------------- */

typedef enum { ED_NONE, ED_SKIP, ED_RESHAPE, ED_I16, ED_FP8_NO_SCALE, ED_TID_RANGE } edit_t;

/* Every fixture tensor into one shard (+ index) in `dir`, `target` edited. */
static void rewrite(const char *dir, const char *target, edit_t ed)
{
    duet_st_checkpoint_t *ck = NULL;
    duet_st_writer_t *w = NULL;
    duet_err_t err = {0};
    int hit = 0;
    if (duet_st_checkpoint_open(g_fixture, &ck, &err) != DUET_OK)
        fail_msg("%s", duet_err_text(&err));
    assert_int_equal(duet_st_writer_create(&w), DUET_OK);
    for (size_t i = 0; i < duet_st_checkpoint_count(ck); i++) {
        const duet_st_tensor_t *t = duet_st_checkpoint_tensor(ck, i);
        int64_t shape[DUET_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        duet_dtype_t dt = t->dtype;
        void *data = malloc(t->nbytes ? t->nbytes : 1);
        size_t nbytes = t->nbytes;
        assert_non_null(data);
        memcpy(data, t->data, t->nbytes);
        if (target && strcmp(t->name, target) == 0) {
            hit = 1;
            switch (ed) {
            case ED_NONE: break;
            case ED_SKIP: free(data); continue;
            case ED_RESHAPE: /* same bytes, rows and columns swapped */
                assert_int_equal(t->ndim, 2);
                shape[0] = t->shape[1];
                shape[1] = t->shape[0];
                break;
            case ED_I16: /* bf16 bits relabelled */
                assert_int_equal(dt, DUET_DT_BF16);
                dt = DUET_DT_I16;
                break;
            case ED_FP8_NO_SCALE: /* a proper e4m3 weight, without its .scale */
                assert_int_equal(dt, DUET_DT_BF16);
                nbytes = t->nbytes / 2;
                for (size_t k = 0; k < nbytes; k++) {
                    uint16_t h;
                    memcpy(&h, (const uint8_t *)t->data + 2 * k, 2);
                    ((uint8_t *)data)[k] = duet_f32_to_e4m3(duet_bf16_to_f32(h) * 64.0f);
                }
                dt = DUET_DT_F8_E4M3;
                break;
            case ED_TID_RANGE: { /* one expert id == n_routed_experts (8) */
                assert_int_equal(dt, DUET_DT_I64);
                int64_t bad = 8;
                memcpy((uint8_t *)data + 8 * 1001, &bad, 8);
                break;
            }
            }
        }
        assert_int_equal(duet_st_writer_add_owned(w, t->name, dt, t->ndim, shape, data, nbytes), DUET_OK);
    }
    assert_true(hit || !target);
    if (duet_st_writer_write_dir(w, dir, 0, 1, &err) != DUET_OK)
        fail_msg("%s", duet_err_text(&err));
    duet_st_writer_destroy(&w);
    duet_st_checkpoint_close(&ck);
    link_fixture(dir, "config.json");
}

/* ---- the cases ---------------------------------------------------------- */

typedef struct {
    const char *name;
    void (*make)(const char *dir);
    duet_status_t want;
    const char *file;  /* the file the message must name, relative to the case dir ("" = the dir itself) */
    const char *what;  /* the tensor or field it must name (NULL: none) */
} case_t;

static void mk_no_config(const char *dir) { link_shards(dir); }

static void mk_malformed_config(const char *dir)
{
    char p[4096];
    path_of(p, sizeof p, dir, "config.json");
    const char *bad = "{\"vocab_size\": 129280,, }";
    write_all(p, bad, strlen(bad));
    link_shards(dir);
}

static void mk_truncated_config(const char *dir)
{
    copy_fixture(dir, "config.json", 600);
    link_shards(dir);
}

static void mk_no_hidden_size(const char *dir) { config_with(dir, "hidden_size", NULL); link_shards(dir); }
static void mk_layers_string(const char *dir) { config_with(dir, "num_hidden_layers", "\"5\""); link_shards(dir); }
static void mk_kv_heads_2(const char *dir) { config_with(dir, "num_key_value_heads", "2"); link_shards(dir); }
static void mk_ratio_5(const char *dir) { config_with(dir, "compress_ratios", "[0, 4, 5, 4, 0, 0]"); link_shards(dir); }

static void mk_shard_cut_header(const char *dir)
{
    copy_fixture(dir, SHARD1, 200);
    link_fixture(dir, SHARD2);
    link_fixture(dir, INDEX);
    link_fixture(dir, "config.json");
}

static void mk_shard_cut_data(const char *dir)
{
    char p[4096];
    struct stat sb;
    path_of(p, sizeof p, g_fixture, SHARD2);
    assert_int_equal(stat(p, &sb), 0);
    copy_fixture(dir, SHARD2, (long)sb.st_size - 4096);
    link_fixture(dir, SHARD1);
    link_fixture(dir, INDEX);
    link_fixture(dir, "config.json");
}

static void mk_header_len_past_end(const char *dir)
{
    char p[4096];
    size_t n;
    path_of(p, sizeof p, g_fixture, SHARD1);
    unsigned char *b = (unsigned char *)read_all(p, &n);
    uint64_t len = n; /* 8 bytes more than the file holds after the length */
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(len >> (8 * i));
    path_of(p, sizeof p, dir, SHARD1);
    write_all(p, b, n);
    free(b);
    link_fixture(dir, SHARD2);
    link_fixture(dir, INDEX);
    link_fixture(dir, "config.json");
}

static void mk_index_malformed(const char *dir)
{
    copy_fixture(dir, INDEX, 300);
    link_fixture(dir, SHARD1);
    link_fixture(dir, SHARD2);
    link_fixture(dir, "config.json");
}

static void mk_index_missing_shard(const char *dir)
{
    json_t *j = load_json(g_fixture, INDEX);
    json_t *wm = json_object_get(j, "weight_map");
    assert_non_null(json_object_get(wm, "layers.3.attn.wkv.weight"));
    json_object_set_new(wm, "layers.3.attn.wkv.weight", json_string("model-00003-of-00003.safetensors"));
    save_json(dir, INDEX, j);
    link_fixture(dir, SHARD1);
    link_fixture(dir, SHARD2);
    link_fixture(dir, "config.json");
}

static void mk_rewritten(const char *dir) { rewrite(dir, NULL, ED_NONE); }
static void mk_tensor_missing(const char *dir) { rewrite(dir, "layers.2.attn.compressor.ape", ED_SKIP); }
static void mk_tensor_misshaped(const char *dir) { rewrite(dir, "layers.1.attn.wq_a.weight", ED_RESHAPE); }
static void mk_tensor_i16(const char *dir) { rewrite(dir, "layers.0.attn.wkv.weight", ED_I16); }
static void mk_fp8_no_scale(const char *dir) { rewrite(dir, "layers.4.attn.wq_b.weight", ED_FP8_NO_SCALE); }
static void mk_tid2eid_range(const char *dir) { rewrite(dir, "layers.0.ffn.gate.tid2eid", ED_TID_RANGE); }

static const case_t k_cases[] = {
    {"rewritten_checkpoint_loads", mk_rewritten, DUET_OK, NULL, NULL},
    {"config_missing", mk_no_config, DUET_ERR_NOT_FOUND, "config.json", NULL},
    {"config_malformed", mk_malformed_config, DUET_ERR_PARSE, "config.json", NULL},
    {"config_truncated", mk_truncated_config, DUET_ERR_PARSE, "config.json", NULL},
    {"config_field_missing", mk_no_hidden_size, DUET_ERR_CONFIG, "config.json", "hidden_size"},
    {"config_wrong_type", mk_layers_string, DUET_ERR_CONFIG, "config.json", "num_hidden_layers"},
    {"config_kv_heads", mk_kv_heads_2, DUET_ERR_CONFIG, "config.json", "num_key_value_heads"},
    {"config_ratio_5", mk_ratio_5, DUET_ERR_CONFIG, "config.json", "compress_ratios"},
    {"shard_cut_in_header", mk_shard_cut_header, DUET_ERR_TRUNCATED, SHARD1, NULL},
    {"shard_cut_in_data", mk_shard_cut_data, DUET_ERR_TRUNCATED, SHARD2, NULL},
    {"shard_header_length_past_end", mk_header_len_past_end, DUET_ERR_TRUNCATED, SHARD1, NULL},
    {"index_malformed", mk_index_malformed, DUET_ERR_PARSE, INDEX, NULL},
    {"index_missing_shard", mk_index_missing_shard, DUET_ERR_NOT_FOUND, "model-00003-of-00003.safetensors",
     "layers.3.attn.wkv.weight"},
    {"tensor_missing", mk_tensor_missing, DUET_ERR_NOT_FOUND, "", "layers.2.attn.compressor.ape"},
    {"tensor_misshaped", mk_tensor_misshaped, DUET_ERR_SHAPE, REWRITTEN, "layers.1.attn.wq_a.weight"},
    {"tensor_unsupported_dtype", mk_tensor_i16, DUET_ERR_DTYPE, REWRITTEN, "layers.0.attn.wkv.weight"},
    {"fp8_weight_without_scale", mk_fp8_no_scale, DUET_ERR_NOT_FOUND, "", "layers.4.attn.wq_b.scale"},
    {"tid2eid_expert_out_of_range", mk_tid2eid_range, DUET_ERR_RANGE, REWRITTEN, "layers.0.ffn.gate.tid2eid"},
};

/* ---- running one case --------------------------------------------------- */

typedef struct {
    const case_t *c;
    char dir[256];
} fx_t;

static int fx_setup(void **state)
{
    fx_t *fx = calloc(1, sizeof *fx);
    const char *tmp = getenv("TMPDIR");
    if (!fx)
        return -1;
    fx->c = *state;
    snprintf(fx->dir, sizeof fx->dir, "%s/duet_load_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *fx = *state;
    DIR *d = opendir(fx->dir);
    struct dirent *de;
    char p[4096];
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            path_of(p, sizeof p, fx->dir, de->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(fx->dir);
    free(fx);
    return 0;
}

/* Check that `text` names the case's file and tensor/field. */
static void assert_names(const fx_t *fx, const char *text, const char *where)
{
    const case_t *c = fx->c;
    char file[4096];
    if (c->file && c->file[0])
        path_of(file, sizeof file, fx->dir, c->file);
    else
        snprintf(file, sizeof file, "%s", fx->dir);
    if (!strstr(text, file) || (c->what && !strstr(text, c->what)))
        fail_msg("%s: %s does not name \"%s\" and \"%s\": %s", c->name, where, file, c->what ? c->what : "", text);
}

/* Run duet-generate on the case directory; returns its wait status, stderr in `err_out`. */
static int run_generate(const char *dir, char *err_out, size_t cap)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    char *argv[] = {(char *)g_generate, "--model", (char *)dir, "--prompt-ids", "1,2,3", "--max-tokens", "1", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, g_generate, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0)
        fail_msg("posix_spawn %s: %s", g_generate, strerror(rc));
    size_t n = 0;
    ssize_t k;
    while ((k = read(fds[0], err_out + n, cap - 1 - n)) > 0 || (k < 0 && errno == EINTR))
        if (k > 0)
            n += (size_t)k;
    err_out[n] = 0;
    close(fds[0]);
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        assert_int_equal(errno, EINTR);
    return ws;
}

static void test_case(void **state)
{
    fx_t *fx = *state;
    const case_t *c = fx->c;
    c->make(fx->dir);

    duet_model_t *m = NULL;
    duet_err_t err = {0};
    duet_status_t st = duet_model_load(fx->dir, &m, &err);
    if (st != c->want)
        fail_msg("%s: want %s, got %s", c->name, duet_status_code(c->want), duet_err_text(&err));
    if (c->want == DUET_OK) {
        assert_non_null(m);
        duet_model_destroy(&m);
    } else {
        assert_null(m);
        assert_int_equal(err.status, c->want);
        assert_names(fx, err.msg, "the message");
    }
    if (getenv("DUET_TEST_VERBOSE"))
        print_message("%s: %s\n", c->name, duet_err_text(&err));

    static char out[65536];
    int ws = run_generate(fx->dir, out, sizeof out);
    if (WIFSIGNALED(ws))
        fail_msg("%s: duet-generate died of signal %d; stderr:\n%s", c->name, WTERMSIG(ws), out);
    assert_true(WIFEXITED(ws));
    if (WEXITSTATUS(ws) != (c->want == DUET_OK ? 0 : 1))
        fail_msg("%s: duet-generate exited %d; stderr:\n%s", c->name, WEXITSTATUS(ws), out);
    if (c->want != DUET_OK) {
        char code[64];
        snprintf(code, sizeof code, "%s: ", duet_status_code(c->want));
        if (!strstr(out, code))
            fail_msg("%s: duet-generate's stderr lacks \"%s\":\n%s", c->name, code, out);
        assert_names(fx, out, "duet-generate's stderr");
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TINY_BF16_DIR DUET_GENERATE\n", argv[0]);
        return 2;
    }
    g_fixture = argv[1];
    g_generate = argv[2];
    enum { N = sizeof k_cases / sizeof k_cases[0] };
    struct CMUnitTest tests[N];
    for (size_t i = 0; i < N; i++)
        tests[i] = (struct CMUnitTest){k_cases[i].name, test_case, fx_setup, fx_teardown, (void *)&k_cases[i]};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
