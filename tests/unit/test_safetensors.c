/* Safetensors reader/writer: round trips (single file, sharded, always_index)
 * and every class of malformed input, checking the status and that the
 * message names the file and tensor. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

typedef struct {
    char dir[256];
    char path[300]; /* dir/x.safetensors */
} fx_t;

static int fx_setup(void **state)
{
    fx_t *fx = calloc(1, sizeof *fx);
    const char *tmp = getenv("TMPDIR");
    if (!fx)
        return -1;
    snprintf(fx->dir, sizeof fx->dir, "%s/duet_st_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    snprintf(fx->path, sizeof fx->path, "%s/x.safetensors", fx->dir);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *fx = *state;
    DIR *d = opendir(fx->dir);
    struct dirent *de;
    char p[600];
    while (d && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", fx->dir, de->d_name);
            unlink(p);
        }
    }
    if (d)
        closedir(d);
    rmdir(fx->dir);
    free(fx);
    return 0;
}

static void write_raw(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A file with 8-byte length `hlen`, header text `hdr` and `data_len` zero bytes. */
static void write_st_len(const char *path, uint64_t hlen, const char *hdr, size_t data_len)
{
    size_t hl = strlen(hdr), n = 8 + hl + data_len;
    unsigned char *b = calloc(1, n);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, hdr, hl);
    write_raw(path, b, n);
    free(b);
}

static void write_st(const char *path, const char *hdr, size_t data_len)
{
    write_st_len(path, strlen(hdr), hdr, data_len);
}

static void expect_open_fails(const char *path, duet_status_t want, const char *t1, const char *t2)
{
    duet_err_t err = {0};
    duet_st_file_t *f = NULL;
    duet_status_t st = duet_st_file_open(path, &f, &err);
    if (st != want)
        print_error("got %s: %s\n", duet_status_code(st), err.msg);
    assert_int_equal(st, want);
    assert_int_equal(err.status, want);
    assert_null(f);
    if (!strstr(err.msg, path) || (t1 && !strstr(err.msg, t1)) || (t2 && !strstr(err.msg, t2)))
        print_error("message lacks '%s' / '%s' / '%s': %s\n", path, t1 ? t1 : "", t2 ? t2 : "", err.msg);
    assert_non_null(strstr(err.msg, path));
    if (t1)
        assert_non_null(strstr(err.msg, t1));
    if (t2)
        assert_non_null(strstr(err.msg, t2));
    if (getenv("DUET_TEST_VERBOSE"))
        print_message("%s\n", duet_err_text(&err));
}

/* ---- round trips -------------------------------------------------------- */

typedef struct {
    const char *name;
    duet_dtype_t dt;
    int ndim;
    int64_t shape[DUET_ST_MAX_DIMS];
    size_t nbytes;
} spec_t;

/* Deliberately not in name order. */
static const spec_t k_specs[] = {
    {"i.i32", DUET_DT_I32, 8, {1, 1, 1, 1, 1, 1, 1, 2}, 8},
    {"a.f32", DUET_DT_F32, 2, {2, 3}, 24},
    {"h.e8m0", DUET_DT_F8_E8M0, 1, {3}, 3},
    {"c.fp8", DUET_DT_F8_E4M3, 3, {2, 2, 2}, 8},
    {"b.bf16", DUET_DT_BF16, 1, {4}, 8},
    {"d.i64", DUET_DT_I64, 0, {0}, 8},
    {"e.empty", DUET_DT_U8, 2, {0, 5}, 0},
    {"f.fp4", DUET_DT_F4_E2M1X2, 2, {3, 4}, 12},
    {"g.bool", DUET_DT_BOOL, 1, {5}, 5},
    {"j.f16", DUET_DT_F16, 2, {3, 1}, 6},
    {"k.i8", DUET_DT_I8, 1, {7}, 7},
    {"l.i16", DUET_DT_I16, 1, {2}, 4},
};
#define N_SPECS (sizeof k_specs / sizeof k_specs[0])

static void fill(unsigned char *p, size_t n, size_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed * 31 + i * 7 + 1);
}

static void add_specs(duet_st_writer_t *w)
{
    unsigned char buf[64];
    for (size_t i = 0; i < N_SPECS; i++) {
        const spec_t *s = &k_specs[i];
        size_t want;
        assert_int_equal(duet_st_expected_bytes(s->dt, s->ndim, s->shape, &want), 0);
        assert_int_equal(want, s->nbytes);
        fill(buf, s->nbytes, i);
        assert_int_equal(duet_st_writer_add(w, s->name, s->dt, s->ndim, s->shape, buf, s->nbytes), DUET_OK);
    }
}

static void check_tensor(const duet_st_tensor_t *t, size_t i)
{
    const spec_t *s = &k_specs[i];
    unsigned char buf[64];
    assert_non_null(t);
    assert_string_equal(t->name, s->name);
    assert_int_equal(t->dtype, s->dt);
    assert_int_equal(t->ndim, s->ndim);
    for (int d = 0; d < s->ndim; d++)
        assert_int_equal(t->shape[d], s->shape[d]);
    assert_int_equal(t->nbytes, s->nbytes);
    assert_non_null(t->data);
    fill(buf, s->nbytes, i);
    if (s->nbytes)
        assert_memory_equal(t->data, buf, s->nbytes);
}

static int exists(const fx_t *fx, const char *name)
{
    char p[600];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", fx->dir, name);
    return stat(p, &sb) == 0;
}

static void test_round_trip_single(void **state)
{
    fx_t *fx = *state;
    duet_st_writer_t *w = NULL;
    duet_err_t err = {0};
    char path[600];

    assert_int_equal(duet_st_writer_create(&w), DUET_OK);
    add_specs(w);
    assert_int_equal(duet_st_writer_set_metadata(w, "format", "pt"), DUET_OK);
    assert_int_equal(duet_st_writer_set_metadata(w, "producer", "duet-test"), DUET_OK);
    assert_int_equal(duet_st_writer_write_dir(w, fx->dir, 0, 0, &err), DUET_OK);
    duet_st_writer_destroy(&w);
    assert_null(w);
    assert_true(exists(fx, "model.safetensors"));
    assert_false(exists(fx, "model.safetensors.index.json"));

    snprintf(path, sizeof path, "%s/model.safetensors", fx->dir);
    duet_st_file_t *f = NULL;
    assert_int_equal(duet_st_file_open(path, &f, &err), DUET_OK);
    assert_int_equal(duet_st_file_count(f), N_SPECS);
    for (size_t i = 0; i < N_SPECS; i++) {
        const duet_st_tensor_t *t = duet_st_file_find(f, k_specs[i].name);
        check_tensor(t, i);
        assert_string_equal(t->file, path);
    }
    for (size_t i = 1; i < N_SPECS; i++)
        assert_true(strcmp(duet_st_file_tensor(f, i - 1)->name, duet_st_file_tensor(f, i)->name) < 0);
    assert_null(duet_st_file_tensor(f, N_SPECS));
    assert_null(duet_st_file_find(f, "nope"));
    assert_string_equal(duet_st_file_metadata(f, "format"), "pt");
    assert_string_equal(duet_st_file_metadata(f, "producer"), "duet-test");
    assert_null(duet_st_file_metadata(f, "absent"));
    duet_st_file_close(&f);
    assert_null(f);

    /* Layout: data section 8-aligned, header in insertion order, metadata first. */
    FILE *fp = fopen(path, "rb");
    unsigned char len8[8];
    assert_non_null(fp);
    assert_int_equal(fread(len8, 1, 8, fp), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | len8[i];
    assert_int_equal(hlen % 8, 0);
    char *hdr = calloc(1, hlen + 1);
    assert_non_null(hdr);
    assert_int_equal(fread(hdr, 1, hlen, fp), hlen);
    fclose(fp);
    assert_memory_equal(hdr, "{\"__metadata__\"", 15);
    const char *prev = hdr;
    for (size_t i = 0; i < N_SPECS; i++) {
        const char *at = strstr(hdr, k_specs[i].name);
        assert_non_null(at);
        assert_true(at > prev);
        prev = at;
    }
    free(hdr);

    /* The directory opens as a checkpoint without an index. */
    duet_st_checkpoint_t *ck = NULL;
    assert_int_equal(duet_st_checkpoint_open(fx->dir, &ck, &err), DUET_OK);
    assert_int_equal(duet_st_checkpoint_count(ck), N_SPECS);
    for (size_t i = 0; i < N_SPECS; i++)
        check_tensor(duet_st_checkpoint_find(ck, k_specs[i].name), i);
    assert_null(duet_st_checkpoint_find(ck, "nope"));
    assert_null(duet_st_checkpoint_tensor(ck, N_SPECS));
    duet_st_checkpoint_close(&ck);
    assert_null(ck);
}

static void test_round_trip_sharded(void **state)
{
    fx_t *fx = *state;
    duet_st_writer_t *w = NULL;
    duet_err_t err = {0};

    assert_int_equal(duet_st_writer_create(&w), DUET_OK);
    add_specs(w); /* 93 bytes in all */
    /* one tensor bigger than a shard, added through add_owned; with 24-byte
     * shards the sizes 8|24|3,8,8|8,0,12|5,6,7,4|40 give six shards */
    unsigned char *big = malloc(40);
    assert_non_null(big);
    memset(big, 0xab, 40);
    int64_t shp = 40;
    assert_int_equal(duet_st_writer_add_owned(w, "z.big", DUET_DT_U8, 1, &shp, big, 40), DUET_OK);
    assert_int_equal(duet_st_writer_write_dir(w, fx->dir, 24, 0, &err), DUET_OK);
    duet_st_writer_destroy(&w);

    assert_true(exists(fx, "model.safetensors.index.json"));
    assert_true(exists(fx, "model-00001-of-00006.safetensors"));
    assert_true(exists(fx, "model-00006-of-00006.safetensors"));
    assert_false(exists(fx, "model.safetensors"));

    duet_st_checkpoint_t *ck = NULL;
    assert_int_equal(duet_st_checkpoint_open(fx->dir, &ck, &err), DUET_OK);
    assert_int_equal(duet_st_checkpoint_count(ck), N_SPECS + 1);
    for (size_t i = 0; i < N_SPECS; i++)
        check_tensor(duet_st_checkpoint_find(ck, k_specs[i].name), i);
    for (size_t i = 1; i < N_SPECS + 1; i++)
        assert_true(strcmp(duet_st_checkpoint_tensor(ck, i - 1)->name, duet_st_checkpoint_tensor(ck, i)->name) < 0);
    const duet_st_tensor_t *t = duet_st_checkpoint_find(ck, "z.big");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 40);
    assert_int_equal(((const unsigned char *)t->data)[39], 0xab);
    assert_non_null(strstr(t->file, "model-00006-of-00006.safetensors"));
    assert_non_null(strstr(duet_st_checkpoint_find(ck, "i.i32")->file, "model-00001-of-00006.safetensors"));
    duet_st_checkpoint_close(&ck);

    /* index content */
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", fx->dir);
    FILE *fp = fopen(p, "rb");
    char buf[4096] = {0};
    assert_non_null(fp);
    assert_true(fread(buf, 1, sizeof buf - 1, fp) > 0);
    fclose(fp);
    assert_non_null(strstr(buf, "\"total_size\": 133"));
    assert_non_null(strstr(buf, "\"z.big\": \"model-00006-of-00006.safetensors\""));
}

static void test_always_index(void **state)
{
    fx_t *fx = *state;
    duet_st_writer_t *w = NULL;
    duet_err_t err = {0};
    duet_st_checkpoint_t *ck = NULL;

    assert_int_equal(duet_st_writer_create(&w), DUET_OK);
    add_specs(w);
    assert_int_equal(duet_st_writer_write_dir(w, fx->dir, 0, 1, &err), DUET_OK);
    duet_st_writer_destroy(&w);
    assert_true(exists(fx, "model-00001-of-00001.safetensors"));
    assert_true(exists(fx, "model.safetensors.index.json"));
    assert_int_equal(duet_st_checkpoint_open(fx->dir, &ck, &err), DUET_OK);
    assert_int_equal(duet_st_checkpoint_count(ck), N_SPECS);
    check_tensor(duet_st_checkpoint_find(ck, "f.fp4"), 7);
    duet_st_checkpoint_close(&ck);
}

static void test_writer_errors(void **state)
{
    fx_t *fx = *state;
    duet_st_writer_t *w = NULL;
    duet_err_t err = {0};
    int64_t shp[2] = {2, 2};
    float v[4] = {0};

    assert_int_equal(duet_st_writer_create(&w), DUET_OK);
    assert_int_equal(duet_st_writer_add(w, "a", DUET_DT_F32, 2, shp, v, 12), DUET_ERR_SHAPE);
    assert_int_equal(duet_st_writer_add(w, "a", DUET_DT_INVALID, 2, shp, v, 16), DUET_ERR_SHAPE);
    assert_int_equal(duet_st_writer_add(w, "", DUET_DT_F32, 2, shp, v, 16), DUET_ERR_INVALID);
    assert_int_equal(duet_st_writer_add(w, "__metadata__", DUET_DT_F32, 2, shp, v, 16), DUET_ERR_INVALID);
    assert_int_equal(duet_st_writer_add(w, "bad\xff", DUET_DT_F32, 2, shp, v, 16), DUET_ERR_INVALID);
    assert_int_equal(duet_st_writer_set_metadata(w, "k", "bad\xff"), DUET_ERR_INVALID);
    assert_int_equal(duet_st_writer_add(w, "a", DUET_DT_F32, 2, shp, v, 16), DUET_OK);
    assert_int_equal(duet_st_writer_add(w, "a", DUET_DT_F32, 2, shp, v, 16), DUET_OK);
    assert_int_equal(duet_st_writer_write_dir(w, fx->dir, 0, 0, &err), DUET_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'a'"));
    assert_false(exists(fx, "model.safetensors"));
    duet_st_writer_destroy(&w);
}

/* ---- header parsing alone ----------------------------------------------- */

static void test_parse_header_direct(void **state)
{
    (void)state;
    const char *h = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                    "\"a\":{\"dtype\":\"I8\",\"shape\":[3,0],\"data_offsets\":[2,2]},"
                    "\"c\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[8,12]}}";
    duet_st_tensor_t *t = NULL;
    size_t n = 0;
    duet_err_t err = {0};
    assert_int_equal(duet_st_parse_header(h, strlen(h), 16, "hdr.json", &t, &n, &err), DUET_OK);
    assert_int_equal(n, 3);
    assert_string_equal(t[0].name, "a");
    assert_string_equal(t[1].name, "b");
    assert_string_equal(t[2].name, "c");
    assert_int_equal(t[2].dtype, DUET_DT_F4_E2M1X2);
    assert_int_equal(t[2].offset, 8);
    assert_int_equal(t[2].nbytes, 4);
    assert_null(t[0].data);
    assert_int_equal(t[0].nbytes, 0);
    duet_st_tensors_free(t, n);

    /* gaps are fine, data section too short is not */
    assert_int_equal(duet_st_parse_header(h, strlen(h), 11, "hdr.json", &t, &n, &err), DUET_ERR_TRUNCATED);
    assert_non_null(strstr(err.msg, "hdr.json"));
    assert_non_null(strstr(err.msg, "'c'"));
    assert_int_equal(duet_st_parse_header("{}", 2, 0, NULL, &t, &n, &err), DUET_OK);
    assert_int_equal(n, 0);
    duet_st_tensors_free(t, n);
    assert_int_equal(duet_st_parse_header("", 0, 0, "e", &t, &n, &err), DUET_ERR_PARSE);
    assert_int_equal(duet_st_parse_header("{\"a\":\0}", 7, 0, "nul", &t, &n, &err), DUET_ERR_PARSE);
}

/* ---- malformed files ---------------------------------------------------- */

typedef struct {
    const char *hdr;
    size_t data_len;
    duet_status_t want;
    const char *t1, *t2; /* substrings the message must hold */
} bad_t;

#define E(dt, shape, offs) "{\"dtype\":" dt ",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const bad_t k_bad[] = {
    {"{\"w\": ", 0, DUET_ERR_PARSE, "not valid JSON", NULL},
    {"[1,2,3]", 0, DUET_ERR_PARSE, "not a JSON object", NULL},
    {"\"str\"", 0, DUET_ERR_PARSE, NULL, NULL},
    {"{} trailing", 0, DUET_ERR_PARSE, NULL, NULL},
    {"{\"w\":5}", 0, DUET_ERR_PARSE, "'w'", "not an object"},
    {"{\"w\":[]}", 0, DUET_ERR_PARSE, "'w'", NULL},
    {"{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DUET_ERR_PARSE, "'w'", "dtype"},
    {"{\"w\":" E("7", "[1]", "[0,4]") "}", 4, DUET_ERR_PARSE, "'w'", "dtype"},
    {"{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, DUET_ERR_PARSE, "'w'", "shape"},
    {"{\"w\":" E("\"F32\"", "3", "[0,4]") "}", 4, DUET_ERR_PARSE, "'w'", "shape"},
    {"{\"w\":" E("\"F32\"", "[1.5]", "[0,4]") "}", 4, DUET_ERR_PARSE, "'w'", "shape[0]"},
    {"{\"w\":" E("\"F32\"", "[\"1\"]", "[0,4]") "}", 4, DUET_ERR_PARSE, "'w'", "shape[0]"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, DUET_ERR_PARSE, "'w'", "data_offsets"},
    {"{\"w\":" E("\"F32\"", "[1]", "[0]") "}", 4, DUET_ERR_PARSE, "'w'", "data_offsets"},
    {"{\"w\":" E("\"F32\"", "[1]", "[0,4,8]") "}", 8, DUET_ERR_PARSE, "'w'", "data_offsets"},
    {"{\"w\":" E("\"F32\"", "[1]", "\"0-4\"") "}", 4, DUET_ERR_PARSE, "'w'", "data_offsets"},
    {"{\"w\":" E("\"F32\"", "[1]", "[0,4.0]") "}", 4, DUET_ERR_PARSE, "'w'", "data_offsets"},
    {"{\"w\":" E("\"Q7\"", "[1]", "[0,4]") "}", 4, DUET_ERR_DTYPE, "'w'", "Q7"},
    {"{\"w\":" E("\"f32\"", "[1]", "[0,4]") "}", 4, DUET_ERR_DTYPE, "'w'", NULL},
    {"{\"w\":" E("\"F32\"", "[-1]", "[0,4]") "}", 4, DUET_ERR_SHAPE, "'w'", "negative"},
    {"{\"w\":" E("\"U8\"", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, DUET_ERR_SHAPE, "'w'", "dimensions"},
    {"{\"w\":" E("\"F32\"", "[4294967296,4294967296,4294967296]", "[0,4]") "}", 4, DUET_ERR_SHAPE, "'w'",
     "overflow"},
    {"{\"w\":" E("\"F32\"", "[2]", "[0,4]") "}", 8, DUET_ERR_SHAPE, "'w'", "needs 8"},
    {"{\"w\":" E("\"BF16\"", "[3]", "[0,8]") "}", 8, DUET_ERR_SHAPE, "'w'", NULL},
    {"{\"w\":" E("\"F32\"", "[2]", "[0,8]") "}", 4, DUET_ERR_TRUNCATED, "'w'", "past"},
    {"{\"w\":" E("\"F32\"", "[2]", "[8,0]") "}", 8, DUET_ERR_RANGE, "'w'", "begin"},
    {"{\"w\":" E("\"F32\"", "[1]", "[-4,0]") "}", 8, DUET_ERR_RANGE, "'w'", "negative"},
    {"{\"w\":" E("\"F32\"", "[1]", "[0,99999999999999999999]") "}", 8, DUET_ERR_PARSE, NULL, NULL},
    {"{\"a\":" E("\"F32\"", "[2]", "[0,8]") ",\"b\":" E("\"F32\"", "[2]", "[4,12]") "}", 12, DUET_ERR_RANGE,
     "'a'", "'b'"},
    {"{\"a\":" E("\"U8\"", "[8]", "[0,8]") ",\"b\":" E("\"U8\"", "[2]", "[2,4]") "}", 8, DUET_ERR_RANGE, "'a'",
     "overlap"},
    {"{\"a\":" E("\"U8\"", "[4]", "[0,4]") ",\"a\":" E("\"U8\"", "[4]", "[4,8]") "}", 8, DUET_ERR_PARSE,
     "duplicate", NULL},
    {"{\"__metadata__\":[1]}", 0, DUET_ERR_PARSE, "__metadata__", NULL},
    {"{\"__metadata__\":{\"k\":1}}", 0, DUET_ERR_PARSE, "__metadata__", "'k'"},
    {"{\"__metadata__\":{\"k\":\"v\"},\"__metadata__\":{}}", 0, DUET_ERR_PARSE, "duplicate", NULL},
};

static void test_malformed_headers(void **state)
{
    fx_t *fx = *state;
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        write_st(fx->path, k_bad[i].hdr, k_bad[i].data_len);
        expect_open_fails(fx->path, k_bad[i].want, k_bad[i].t1, k_bad[i].t2);
    }
}

static void test_deep_nesting(void **state)
{
    fx_t *fx = *state;
    size_t depth = 100000;
    char *h = malloc(2 * depth + 64);
    assert_non_null(h);
    strcpy(h, "{\"__metadata__\":");
    size_t k = strlen(h);
    memset(h + k, '[', depth);
    memset(h + k + depth, ']', depth);
    strcpy(h + k + 2 * depth, "}");
    write_st(fx->path, h, 0);
    free(h);
    expect_open_fails(fx->path, DUET_ERR_PARSE, NULL, NULL);
}

static void test_framing(void **state)
{
    fx_t *fx = *state;
    write_raw(fx->path, "", 0);
    expect_open_fails(fx->path, DUET_ERR_TRUNCATED, NULL, NULL);
    write_raw(fx->path, "\x02\0\0", 3);
    expect_open_fails(fx->path, DUET_ERR_TRUNCATED, NULL, NULL);
    write_st_len(fx->path, (uint64_t)1 << 40, "{}", 0);
    expect_open_fails(fx->path, DUET_ERR_RANGE, "header length", NULL);
    write_st_len(fx->path, UINT64_MAX, "{}", 0);
    expect_open_fails(fx->path, DUET_ERR_RANGE, NULL, NULL);
    write_st_len(fx->path, DUET_ST_MAX_HEADER, "{}", 0);
    expect_open_fails(fx->path, DUET_ERR_TRUNCATED, NULL, NULL);
    write_st_len(fx->path, 200, "{\"w\":" E("\"U8\"", "[1]", "[0,1]") "}", 1);
    expect_open_fails(fx->path, DUET_ERR_TRUNCATED, "past the end", NULL);
    /* header length too small: JSON cut short */
    write_st_len(fx->path, 5, "{\"w\":" E("\"U8\"", "[1]", "[0,1]") "}", 1);
    expect_open_fails(fx->path, DUET_ERR_PARSE, NULL, NULL);

    char missing[600];
    snprintf(missing, sizeof missing, "%s/none.safetensors", fx->dir);
    expect_open_fails(missing, DUET_ERR_NOT_FOUND, NULL, NULL);
    expect_open_fails(fx->dir, DUET_ERR_IO, NULL, NULL);

    /* the minimal valid file */
    duet_st_file_t *f = NULL;
    duet_err_t err = {0};
    write_st(fx->path, "{}", 0);
    assert_int_equal(duet_st_file_open(fx->path, &f, &err), DUET_OK);
    assert_int_equal(duet_st_file_count(f), 0);
    assert_null(duet_st_file_metadata(f, "format"));
    duet_st_file_close(&f);
}

static void test_truncated_file(void **state)
{
    fx_t *fx = *state;
    duet_st_writer_t *w = NULL;
    duet_err_t err = {0};
    char path[600];
    struct stat sb;

    assert_int_equal(duet_st_writer_create(&w), DUET_OK);
    add_specs(w);
    assert_int_equal(duet_st_writer_write_dir(w, fx->dir, 0, 0, &err), DUET_OK);
    duet_st_writer_destroy(&w);
    snprintf(path, sizeof path, "%s/model.safetensors", fx->dir);
    assert_int_equal(stat(path, &sb), 0);
    /* cut into the last tensor's data (insertion order: l.i16 is last) */
    assert_int_equal(truncate(path, sb.st_size - 3), 0);
    expect_open_fails(path, DUET_ERR_TRUNCATED, "'l.i16'", NULL);
    /* cut into the header */
    assert_int_equal(truncate(path, 40), 0);
    expect_open_fails(path, DUET_ERR_TRUNCATED, NULL, NULL);
    assert_int_equal(truncate(path, 7), 0);
    expect_open_fails(path, DUET_ERR_TRUNCATED, NULL, NULL);
}

/* ---- checkpoints -------------------------------------------------------- */

static void write_sharded(fx_t *fx)
{
    duet_st_writer_t *w = NULL;
    duet_err_t err = {0};
    assert_int_equal(duet_st_writer_create(&w), DUET_OK);
    add_specs(w);
    /* 40-byte shards: 8,24,3 | 8,8,8,0,12 | 5,6,7,4 */
    assert_int_equal(duet_st_writer_write_dir(w, fx->dir, 40, 0, &err), DUET_OK);
    duet_st_writer_destroy(&w);
    assert_true(exists(fx, "model-00003-of-00003.safetensors"));
}

static void expect_ck_fails(const fx_t *fx, duet_status_t want, const char *t1, const char *t2)
{
    duet_st_checkpoint_t *ck = NULL;
    duet_err_t err = {0};
    duet_status_t st = duet_st_checkpoint_open(fx->dir, &ck, &err);
    if (st != want)
        print_error("got %s: %s\n", duet_status_code(st), err.msg);
    assert_int_equal(st, want);
    assert_null(ck);
    if (getenv("DUET_TEST_VERBOSE"))
        print_message("%s\n", duet_err_text(&err));
    assert_non_null(strstr(err.msg, fx->dir));
    if (t1)
        assert_non_null(strstr(err.msg, t1));
    if (t2)
        assert_non_null(strstr(err.msg, t2));
}

static void write_index(const fx_t *fx, const char *text)
{
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", fx->dir);
    write_raw(p, text, strlen(text));
}

static void test_checkpoint_empty_dir(void **state)
{
    expect_ck_fails(*state, DUET_ERR_NOT_FOUND, NULL, NULL);
}

static void test_checkpoint_missing_shard(void **state)
{
    fx_t *fx = *state;
    char p[600];
    write_sharded(fx);
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", fx->dir);
    assert_int_equal(unlink(p), 0);
    expect_ck_fails(fx, DUET_ERR_NOT_FOUND, "model-00002-of-00003.safetensors", NULL);
}

static void test_checkpoint_missing_tensor(void **state)
{
    fx_t *fx = *state;
    write_sharded(fx);
    write_index(fx, "{\"metadata\":{\"total_size\":1},\"weight_map\":{"
                    "\"a.f32\":\"model-00001-of-00003.safetensors\","
                    "\"ghost.weight\":\"model-00002-of-00003.safetensors\"}}");
    expect_ck_fails(fx, DUET_ERR_NOT_FOUND, "'ghost.weight'", "model-00002-of-00003.safetensors");
    /* a tensor listed under the wrong shard */
    write_index(fx, "{\"weight_map\":{\"i.i32\":\"model-00003-of-00003.safetensors\"}}");
    expect_ck_fails(fx, DUET_ERR_NOT_FOUND, "'i.i32'", "model-00003-of-00003.safetensors");
    /* a subset of the tensors is fine: the index is authoritative */
    duet_st_checkpoint_t *ck = NULL;
    duet_err_t err = {0};
    write_index(fx, "{\"weight_map\":{\"i.i32\":\"model-00001-of-00003.safetensors\"}}");
    assert_int_equal(duet_st_checkpoint_open(fx->dir, &ck, &err), DUET_OK);
    assert_int_equal(duet_st_checkpoint_count(ck), 1);
    check_tensor(duet_st_checkpoint_find(ck, "i.i32"), 0);
    assert_null(duet_st_checkpoint_find(ck, "a.f32"));
    duet_st_checkpoint_close(&ck);
}

static void test_checkpoint_bad_index(void **state)
{
    fx_t *fx = *state;
    write_sharded(fx);
    write_index(fx, "{\"weight_map\":{\"a.f32\":\"../model-00001-of-00003.safetensors\"}}");
    expect_ck_fails(fx, DUET_ERR_PARSE, "'a.f32'", "shard name");
    write_index(fx, "{\"weight_map\":{\"a.f32\":\"sub/model.safetensors\"}}");
    expect_ck_fails(fx, DUET_ERR_PARSE, "'a.f32'", NULL);
    write_index(fx, "{\"weight_map\":{\"a.f32\":\"\"}}");
    expect_ck_fails(fx, DUET_ERR_PARSE, "'a.f32'", NULL);
    write_index(fx, "{\"weight_map\":{\"a.f32\":3}}");
    expect_ck_fails(fx, DUET_ERR_PARSE, "'a.f32'", NULL);
    write_index(fx, "{\"weight_map\":[]}");
    expect_ck_fails(fx, DUET_ERR_PARSE, "weight_map", NULL);
    write_index(fx, "{\"weight_map\": {");
    expect_ck_fails(fx, DUET_ERR_PARSE, "index.json", NULL);
    write_index(fx, "{\"weight_map\":{\"a.f32\":\"x\",\"a.f32\":\"y\"}}");
    expect_ck_fails(fx, DUET_ERR_PARSE, NULL, NULL);
}

static void test_checkpoint_bad_shard(void **state)
{
    fx_t *fx = *state;
    char p[600];
    write_sharded(fx);
    snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors", fx->dir);
    write_st(p, "{\"w\":" E("\"Q7\"", "[1]", "[0,4]") "}", 4);
    expect_ck_fails(fx, DUET_ERR_DTYPE, "model-00003-of-00003.safetensors", "'w'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_single, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_sharded, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_always_index, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_errors, fx_setup, fx_teardown),
        cmocka_unit_test(test_parse_header_direct),
        cmocka_unit_test_setup_teardown(test_malformed_headers, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_deep_nesting, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_framing, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_truncated_file, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_empty_dir, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_missing_shard, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_missing_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_bad_index, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_bad_shard, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
