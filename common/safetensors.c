#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"

#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

struct duet_st_file {
    char *path;
    void *map;
    size_t map_len;
    duet_st_tensor_t *t; /* sorted by name */
    size_t n;
    json_t *meta; /* "__metadata__" object or NULL */
};

struct duet_st_checkpoint {
    duet_st_file_t **shards;
    size_t n_shards;
    const duet_st_tensor_t **t; /* all tensors, sorted by name */
    size_t n;
};

typedef struct {
    char *name;
    duet_dtype_t dt;
    int ndim;
    int64_t shape[DUET_ST_MAX_DIMS];
    void *data;
    size_t nbytes;
} st_wentry_t;

struct duet_st_writer {
    st_wentry_t *e;
    size_t n, cap;
    json_t *meta;
};

/* ---- helpers ------------------------------------------------------------ */

static int st_cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const duet_st_tensor_t *)a)->name, ((const duet_st_tensor_t *)b)->name);
}

static int st_cmp_tensor_ptr(const void *a, const void *b)
{
    return strcmp((*(const duet_st_tensor_t *const *)a)->name, (*(const duet_st_tensor_t *const *)b)->name);
}

static int st_cmp_wentry_ptr(const void *a, const void *b)
{
    return strcmp((*(const st_wentry_t *const *)a)->name, (*(const st_wentry_t *const *)b)->name);
}

/* Order by (offset, nbytes) for the overlap check. */
static int st_cmp_offset(const void *a, const void *b)
{
    const duet_st_tensor_t *x = *(const duet_st_tensor_t *const *)a, *y = *(const duet_st_tensor_t *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static char *st_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

int duet_st_expected_bytes(duet_dtype_t dt, int ndim, const int64_t *shape, size_t *out)
{
    size_t n = duet_dtype_size(dt), elems = 1;
    int zero = 0;
    if (n == 0 || ndim < 0 || ndim > DUET_ST_MAX_DIMS || (ndim > 0 && !shape))
        return -1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > SIZE_MAX)
            return -1;
        zero |= shape[i] == 0;
    }
    if (zero) {
        *out = 0;
        return 0;
    }
    for (int i = 0; i < ndim; i++)
        if (duet_mul_size(elems, (size_t)shape[i], &elems) < 0)
            return -1;
    return duet_mul_size(elems, n, out);
}

/* ---- header parsing ----------------------------------------------------- */

static duet_status_t st_parse_entry(const char *name, json_t *v, uint64_t data_len, const char *file,
                                    duet_st_tensor_t *t, duet_err_t *err)
{
    if (!json_is_object(v))
        return duet_err_set(err, DUET_ERR_PARSE, "%s: tensor '%s': entry is not an object", file, name);
    json_t *jdt = json_object_get(v, "dtype"), *jshape = json_object_get(v, "shape");
    json_t *joff = json_object_get(v, "data_offsets");
    if (!json_is_string(jdt))
        return duet_err_set(err, DUET_ERR_PARSE, "%s: tensor '%s': missing or non-string \"dtype\"", file, name);
    if (!json_is_array(jshape))
        return duet_err_set(err, DUET_ERR_PARSE, "%s: tensor '%s': missing or non-array \"shape\"", file, name);
    if (!json_is_array(joff) || json_array_size(joff) != 2 || !json_is_integer(json_array_get(joff, 0)) ||
        !json_is_integer(json_array_get(joff, 1)))
        return duet_err_set(err, DUET_ERR_PARSE, "%s: tensor '%s': \"data_offsets\" must be [begin, end] integers",
                            file, name);
    t->dtype = duet_dtype_from_st_name(json_string_value(jdt));
    if (t->dtype == DUET_DT_INVALID)
        return duet_err_set(err, DUET_ERR_DTYPE, "%s: tensor '%s': unknown dtype \"%.32s\"", file, name,
                            json_string_value(jdt));
    size_t nd = json_array_size(jshape);
    if (nd > DUET_ST_MAX_DIMS)
        return duet_err_set(err, DUET_ERR_SHAPE, "%s: tensor '%s': %zu dimensions (at most %d)", file, name, nd,
                            DUET_ST_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(jshape, i);
        if (!json_is_integer(d))
            return duet_err_set(err, DUET_ERR_PARSE, "%s: tensor '%s': shape[%zu] is not an integer", file, name, i);
        if (json_integer_value(d) < 0)
            return duet_err_set(err, DUET_ERR_SHAPE, "%s: tensor '%s': shape[%zu] is negative", file, name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
    }
    json_int_t b = json_integer_value(json_array_get(joff, 0)), e = json_integer_value(json_array_get(joff, 1));
    if (b < 0 || e < 0)
        return duet_err_set(err, DUET_ERR_RANGE, "%s: tensor '%s': negative data offset", file, name);
    if (b > e)
        return duet_err_set(err, DUET_ERR_RANGE, "%s: tensor '%s': data_offsets begin %lld > end %lld", file, name,
                            (long long)b, (long long)e);
    size_t want;
    if (duet_st_expected_bytes(t->dtype, t->ndim, t->shape, &want) < 0)
        return duet_err_set(err, DUET_ERR_SHAPE, "%s: tensor '%s': shape size overflows", file, name);
    if ((uint64_t)e > data_len)
        return duet_err_set(err, DUET_ERR_TRUNCATED,
                            "%s: tensor '%s': data [%lld, %lld) extends past the %llu-byte data section", file, name,
                            (long long)b, (long long)e, (unsigned long long)data_len);
    if ((uint64_t)(e - b) != (uint64_t)want)
        return duet_err_set(err, DUET_ERR_SHAPE, "%s: tensor '%s': %lld bytes but %s of this shape needs %zu", file,
                            name, (long long)(e - b), duet_dtype_st_name(t->dtype), want);
    t->offset = (uint64_t)b;
    t->nbytes = want;
    t->file = file;
    t->data = NULL;
    return DUET_OK;
}

static duet_status_t st_check_metadata(json_t *m, const char *file, duet_err_t *err)
{
    const char *k;
    json_t *v;
    if (!json_is_object(m))
        return duet_err_set(err, DUET_ERR_PARSE, "%s: \"__metadata__\" is not an object", file);
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return duet_err_set(err, DUET_ERR_PARSE, "%s: \"__metadata__\" value '%s' is not a string", file, k);
    }
    return DUET_OK;
}

/* Tensors sorted by offset must not share bytes (empty tensors share none). */
static duet_status_t st_check_overlap(duet_st_tensor_t *t, size_t n, const char *file, duet_err_t *err)
{
    if (n < 2)
        return DUET_OK;
    duet_st_tensor_t **o = duet_malloc_array(n, sizeof *o);
    if (!o)
        return duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < n; i++)
        o[i] = &t[i];
    qsort(o, n, sizeof *o, st_cmp_offset);
    const duet_st_tensor_t *prev = NULL;
    duet_status_t st = DUET_OK;
    for (size_t i = 0; i < n && st == DUET_OK; i++) {
        if (o[i]->nbytes == 0)
            continue;
        if (prev && o[i]->offset < prev->offset + prev->nbytes)
            st = duet_err_set(err, DUET_ERR_RANGE, "%s: tensors '%s' and '%s' overlap in the data section", file,
                              prev->name, o[i]->name);
        if (!prev || o[i]->offset + o[i]->nbytes > prev->offset + prev->nbytes)
            prev = o[i];
    }
    free(o);
    return st;
}

/* Parse and validate; *meta_out (optional) gets a reference to "__metadata__". */
static duet_status_t st_parse(const char *json, size_t json_len, uint64_t data_len, const char *file,
                              duet_st_tensor_t **out, size_t *n_out, json_t **meta_out, duet_err_t *err)
{
    json_error_t jerr;
    duet_st_tensor_t *t = NULL;
    size_t n = 0;
    duet_status_t st;
    const char *key;
    json_t *v, *meta = NULL;

    if (!file)
        file = "<safetensors>";
    if (!out || !n_out || (!json && json_len))
        return duet_err_set(err, DUET_ERR_INVALID, "%s: invalid arguments", file);
    json_t *root = json_loadb(json ? json : "", json_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return duet_err_set(err, DUET_ERR_PARSE, "%s: header is not valid JSON: %s (line %d, column %d)", file,
                            jerr.text, jerr.line, jerr.column);
    if (!json_is_object(root)) {
        st = duet_err_set(err, DUET_ERR_PARSE, "%s: header is not a JSON object", file);
        goto err_root;
    }
    t = duet_calloc(json_object_size(root) + 1, sizeof *t);
    if (!t) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory for %zu tensors", file, json_object_size(root));
        goto err_root;
    }
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((st = st_check_metadata(v, file, err)) != DUET_OK)
                goto err_tensors;
            meta = v;
            continue;
        }
        if ((st = st_parse_entry(key, v, data_len, file, &t[n], err)) != DUET_OK)
            goto err_tensors;
        if (!(t[n].name = duet_strdup(key))) {
            st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", file);
            goto err_tensors;
        }
        n++;
    }
    if ((st = st_check_overlap(t, n, file, err)) != DUET_OK)
        goto err_tensors;
    qsort(t, n, sizeof *t, st_cmp_tensor);
    if (meta_out)
        *meta_out = meta ? json_incref(meta) : NULL;
    json_decref(root);
    *out = t;
    *n_out = n;
    return DUET_OK;

err_tensors:
    duet_st_tensors_free(t, n);
err_root:
    json_decref(root);
    return st;
}

duet_status_t duet_st_parse_header(const char *json, size_t json_len, uint64_t data_len, const char *file,
                                   duet_st_tensor_t **out, size_t *n_out, duet_err_t *err)
{
    return st_parse(json, json_len, data_len, file, out, n_out, NULL, err);
}

void duet_st_tensors_free(duet_st_tensor_t *t, size_t n)
{
    if (!t)
        return;
    for (size_t i = 0; i < n; i++)
        free((char *)t[i].name);
    free(t);
}

/* ---- one file ----------------------------------------------------------- */

duet_status_t duet_st_file_open(const char *path, duet_st_file_t **out, duet_err_t *err)
{
    struct stat sb;
    duet_status_t st;
    int fd;
    duet_st_file_t *f = DUET_NEW(duet_st_file_t);

    if (!f || !(f->path = duet_strdup(path))) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", path);
        goto err_free;
    }
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        st = duet_err_set(err, errno == ENOENT ? DUET_ERR_NOT_FOUND : DUET_ERR_IO, "%s: cannot open: %s", path,
                          strerror(errno));
        goto err_free;
    }
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        st = duet_err_set(err, DUET_ERR_IO, "%s: not a readable regular file", path);
        goto err_close;
    }
    if (sb.st_size < 8) {
        st = duet_err_set(err, DUET_ERR_TRUNCATED, "%s: %lld bytes, shorter than the 8-byte header length", path,
                          (long long)sb.st_size);
        goto err_close;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = duet_err_set(err, DUET_ERR_RANGE, "%s: file too large to map", path);
        goto err_close;
    }
    f->map_len = (size_t)sb.st_size;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st = duet_err_set(err, DUET_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        goto err_close;
    }
    close(fd);

    const unsigned char *base = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | base[i];
    if (hlen > DUET_ST_MAX_HEADER) {
        st = duet_err_set(err, DUET_ERR_RANGE, "%s: header length %llu exceeds the %u-byte limit", path,
                          (unsigned long long)hlen, DUET_ST_MAX_HEADER);
        goto err_free;
    }
    if (hlen > f->map_len - 8) {
        st = duet_err_set(err, DUET_ERR_TRUNCATED, "%s: header length %llu runs past the end of the %zu-byte file",
                          path, (unsigned long long)hlen, f->map_len);
        goto err_free;
    }
    st = st_parse((const char *)base + 8, (size_t)hlen, f->map_len - 8 - hlen, f->path, &f->t, &f->n, &f->meta, err);
    if (st != DUET_OK)
        goto err_free;
    for (size_t i = 0; i < f->n; i++)
        f->t[i].data = base + 8 + hlen + f->t[i].offset;
    *out = f;
    return DUET_OK;

err_close:
    close(fd);
err_free:
    duet_st_file_close(&f);
    return st;
}

void duet_st_file_close(duet_st_file_t **fp)
{
    duet_st_file_t *f = fp ? *fp : NULL;
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_len);
    duet_st_tensors_free(f->t, f->n);
    json_decref(f->meta);
    free(f->path);
    free(f);
    *fp = NULL;
}

size_t duet_st_file_count(const duet_st_file_t *f) { return f ? f->n : 0; }

const duet_st_tensor_t *duet_st_file_tensor(const duet_st_file_t *f, size_t i)
{
    return f && i < f->n ? &f->t[i] : NULL;
}

const duet_st_tensor_t *duet_st_file_find(const duet_st_file_t *f, const char *name)
{
    if (!f || !name)
        return NULL;
    duet_st_tensor_t key = {.name = name};
    return bsearch(&key, f->t, f->n, sizeof *f->t, st_cmp_tensor);
}

const char *duet_st_file_metadata(const duet_st_file_t *f, const char *key)
{
    return f && f->meta && key ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

/* ---- checkpoint directory ----------------------------------------------- */

static int st_shard_name_ok(const char *s) { return s[0] && !strchr(s, '/') && !strstr(s, ".."); }

static duet_status_t st_ck_add_shard(duet_st_checkpoint_t *ck, const char *path, duet_err_t *err)
{
    duet_st_file_t **ns = realloc(ck->shards, (ck->n_shards + 1) * sizeof *ns);
    if (!ns)
        return duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", path);
    ck->shards = ns;
    duet_status_t st = duet_st_file_open(path, &ns[ck->n_shards], err);
    if (st == DUET_OK)
        ck->n_shards++;
    return st;
}

/* Open the shards named by the index; ck->t gets the tensors of weight_map. */
static duet_status_t st_ck_load_index(duet_st_checkpoint_t *ck, const char *dir, const char *ipath,
                                      duet_err_t *err)
{
    json_error_t jerr;
    duet_status_t st = DUET_OK;
    const char *tname, **names = NULL; /* shard names, parallel to ck->shards */
    json_t *v, *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &jerr);
    size_t last = 0;

    if (!root)
        return duet_err_set(err, DUET_ERR_PARSE, "%s: invalid JSON: %s (line %d)", ipath, jerr.text, jerr.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        st = duet_err_set(err, DUET_ERR_PARSE, "%s: missing or non-object \"weight_map\"", ipath);
        goto err_root;
    }
    if (!(ck->t = duet_calloc(json_object_size(wm) + 1, sizeof *ck->t)) ||
        !(names = duet_calloc(json_object_size(wm) + 1, sizeof *names))) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", ipath);
        goto err_root;
    }
    json_object_foreach(wm, tname, v) {
        const char *shard = json_string_value(v);
        if (!shard || !st_shard_name_ok(shard)) {
            st = duet_err_set(err, DUET_ERR_PARSE, "%s: tensor '%s': invalid shard name \"%.64s\"", ipath, tname,
                              shard ? shard : "(not a string)");
            goto err_root;
        }
        if (last >= ck->n_shards || strcmp(names[last], shard) != 0) {
            for (last = 0; last < ck->n_shards && strcmp(names[last], shard) != 0; last++)
                ;
            if (last == ck->n_shards) {
                char *p = st_join(dir, shard);
                st = p ? st_ck_add_shard(ck, p, err) : duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", dir);
                free(p);
                if (st != DUET_OK) {
                    if (err && st != DUET_ERR_NOMEM) {
                        char inner[sizeof err->msg];
                        memcpy(inner, err->msg, sizeof inner);
                        duet_err_set(err, st, "%s (shard of tensor '%s' in %s)", inner, tname, ipath);
                    }
                    goto err_root;
                }
                names[last] = shard;
            }
        }
        const duet_st_tensor_t *t = duet_st_file_find(ck->shards[last], tname);
        if (!t) {
            st = duet_err_set(err, DUET_ERR_NOT_FOUND, "%s: tensor '%s' listed in the index is missing from shard %s",
                              ipath, tname, shard);
            goto err_root;
        }
        ck->t[ck->n++] = t;
    }
    qsort(ck->t, ck->n, sizeof *ck->t, st_cmp_tensor_ptr);

err_root:
    free(names);
    json_decref(root);
    return st;
}

duet_status_t duet_st_checkpoint_open(const char *dir, duet_st_checkpoint_t **out, duet_err_t *err)
{
    struct stat sb;
    duet_status_t st;
    duet_st_checkpoint_t *ck = DUET_NEW(duet_st_checkpoint_t);
    char *ipath = st_join(dir, ST_INDEX_NAME), *spath = st_join(dir, ST_SINGLE_NAME);

    if (!ck || !ipath || !spath) {
        st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", dir);
        goto err_free;
    }
    if (stat(ipath, &sb) == 0) {
        st = st_ck_load_index(ck, dir, ipath, err);
    } else if (stat(spath, &sb) == 0) {
        if ((st = st_ck_add_shard(ck, spath, err)) != DUET_OK)
            goto err_free;
        const duet_st_file_t *f = ck->shards[0];
        if (!(ck->t = duet_calloc(f->n + 1, sizeof *ck->t))) {
            st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory", spath);
            goto err_free;
        }
        for (size_t i = 0; i < f->n; i++)
            ck->t[i] = &f->t[i];
        ck->n = f->n;
    } else {
        st = duet_err_set(err, DUET_ERR_NOT_FOUND, "%s: neither %s nor %s found", dir, ST_INDEX_NAME,
                          ST_SINGLE_NAME);
    }
    if (st != DUET_OK)
        goto err_free;
    free(ipath);
    free(spath);
    *out = ck;
    return DUET_OK;

err_free:
    free(ipath);
    free(spath);
    duet_st_checkpoint_close(&ck);
    return st;
}

void duet_st_checkpoint_close(duet_st_checkpoint_t **ckp)
{
    duet_st_checkpoint_t *ck = ckp ? *ckp : NULL;
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n_shards; i++)
        duet_st_file_close(&ck->shards[i]);
    free(ck->shards);
    free(ck->t);
    free(ck);
    *ckp = NULL;
}

const duet_st_tensor_t *duet_st_checkpoint_find(const duet_st_checkpoint_t *ck, const char *name)
{
    if (!ck || !name)
        return NULL;
    duet_st_tensor_t key = {.name = name};
    const duet_st_tensor_t *kp = &key, *const *hit = bsearch(&kp, ck->t, ck->n, sizeof *ck->t, st_cmp_tensor_ptr);
    return hit ? *hit : NULL;
}

size_t duet_st_checkpoint_count(const duet_st_checkpoint_t *ck) { return ck ? ck->n : 0; }

const duet_st_tensor_t *duet_st_checkpoint_tensor(const duet_st_checkpoint_t *ck, size_t i)
{
    return ck && i < ck->n ? ck->t[i] : NULL;
}

/* ---- writer ------------------------------------------------------------- */

duet_status_t duet_st_writer_create(duet_st_writer_t **out)
{
    duet_st_writer_t *w = DUET_NEW(duet_st_writer_t);
    if (!w || !(w->meta = json_object())) {
        free(w);
        return DUET_ERR_NOMEM;
    }
    *out = w;
    return DUET_OK;
}

/* Ownership of `data` passes to the writer only when DUET_OK is returned; on
 * an error the caller still owns it. */
duet_status_t duet_st_writer_add_owned(duet_st_writer_t *w, const char *name, duet_dtype_t dt, int ndim,
                                       const int64_t *shape, void *data, size_t nbytes)
{
    size_t want;
    if (!w || !name || !name[0] || strcmp(name, "__metadata__") == 0 || (!data && nbytes))
        return DUET_ERR_INVALID;
    if (duet_st_expected_bytes(dt, ndim, shape, &want) < 0 || want != nbytes)
        return DUET_ERR_SHAPE;
    json_t *probe = json_string(name); /* NULL unless valid UTF-8 */
    if (!probe)
        return DUET_ERR_INVALID;
    json_decref(probe);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        st_wentry_t *ne = realloc(w->e, cap * sizeof *ne);
        if (!ne)
            return DUET_ERR_NOMEM;
        w->e = ne;
        w->cap = cap;
    }
    st_wentry_t *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = duet_strdup(name)))
        return DUET_ERR_NOMEM;
    e->dt = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->data = data;
    e->nbytes = nbytes;
    w->n++;
    return DUET_OK;
}

duet_status_t duet_st_writer_add(duet_st_writer_t *w, const char *name, duet_dtype_t dt, int ndim,
                                 const int64_t *shape, const void *data, size_t nbytes)
{
    if (!data && nbytes)
        return DUET_ERR_INVALID;
    void *copy = malloc(nbytes ? nbytes : 1);
    if (!copy)
        return DUET_ERR_NOMEM;
    if (nbytes)
        memcpy(copy, data, nbytes);
    duet_status_t st = duet_st_writer_add_owned(w, name, dt, ndim, shape, copy, nbytes);
    if (st != DUET_OK)
        free(copy);
    return st;
}

duet_status_t duet_st_writer_set_metadata(duet_st_writer_t *w, const char *key, const char *value)
{
    if (!w || !key || !value)
        return DUET_ERR_INVALID;
    json_t *s = json_string(value);
    if (!s || json_object_set_new(w->meta, key, s) < 0)
        return DUET_ERR_INVALID; /* invalid UTF-8 (json_object_set_new frees s) */
    return DUET_OK;
}

static duet_status_t st_write_all(int fd, const void *p, size_t n, const char *path, duet_err_t *err)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return duet_err_set(err, DUET_ERR_IO, "%s: write failed: %s", path, k < 0 ? strerror(errno) : "no progress");
        c += k;
        n -= (size_t)k;
    }
    return DUET_OK;
}

/* Write `head` (a JSON document) then the data of entries [b, e) to `path`
 * through a temporary file renamed into place.  With `framed`, `head` is a
 * safetensors header: prefixed by its length and padded with spaces to 8. */
static duet_status_t st_write_file(const char *path, const char *head, int framed, const st_wentry_t *ents, size_t b,
                                   size_t e, duet_err_t *err)
{
    duet_status_t st = DUET_ERR_NOMEM;
    size_t hl = strlen(head), padded = (hl + 7) & ~(size_t)7;
    char *tmp = malloc(strlen(path) + 32);
    int fd = -1;
    if (!tmp)
        return duet_err_set(err, st, "%s: out of memory", path);
    snprintf(tmp, strlen(path) + 32, "%s.tmp.%ld", path, (long)getpid());
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        st = duet_err_set(err, DUET_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto err_free;
    }
    if (framed) {
        unsigned char len8[8];
        static const char spaces[8] = "        ";
        for (int i = 0; i < 8; i++)
            len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        if ((st = st_write_all(fd, len8, 8, tmp, err)) != DUET_OK ||
            (st = st_write_all(fd, head, hl, tmp, err)) != DUET_OK ||
            (st = st_write_all(fd, spaces, padded - hl, tmp, err)) != DUET_OK)
            goto err_unlink;
    } else if ((st = st_write_all(fd, head, hl, tmp, err)) != DUET_OK) {
        goto err_unlink;
    }
    for (size_t i = b; i < e; i++)
        if ((st = st_write_all(fd, ents[i].data, ents[i].nbytes, tmp, err)) != DUET_OK)
            goto err_unlink;
    if (fsync(fd) < 0 || close(fd) < 0) {
        fd = -1;
        st = duet_err_set(err, DUET_ERR_IO, "%s: sync/close failed: %s", tmp, strerror(errno));
        goto err_unlink;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        st = duet_err_set(err, DUET_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
        goto err_unlink;
    }
    free(tmp);
    return DUET_OK;

err_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
err_free:
    free(tmp);
    return st;
}

/* Header JSON of entries [b, e), offsets relative to the shard's data section. */
static char *st_shard_header(const duet_st_writer_t *w, size_t b, size_t e)
{
    json_t *h = json_object();
    char *s = NULL;
    uint64_t off = 0;
    if (!h)
        return NULL;
    if (json_object_size(w->meta) && json_object_set(h, "__metadata__", w->meta) < 0)
        goto err_h;
    for (size_t i = b; i < e; i++) {
        const st_wentry_t *x = &w->e[i];
        json_t *shape = json_array();
        for (int d = 0; shape && d < x->ndim; d++) {
            if (json_array_append_new(shape, json_integer((json_int_t)x->shape[d])) < 0) {
                json_decref(shape);
                shape = NULL;
            }
        }
        /* "o" steals `shape` and fails on NULL */
        json_t *ent = json_pack("{s:s, s:o, s:[I,I]}", "dtype", duet_dtype_st_name(x->dt), "shape", shape,
                                "data_offsets", (json_int_t)off, (json_int_t)(off + x->nbytes));
        if (!ent || json_object_set_new(h, x->name, ent) < 0)
            goto err_h;
        off += x->nbytes;
    }
    s = json_dumps(h, JSON_COMPACT);
err_h:
    json_decref(h);
    return s;
}

duet_status_t duet_st_writer_write_dir(duet_st_writer_t *w, const char *dir, size_t shard_bytes, int always_index,
                                       duet_err_t *err)
{
    duet_status_t st = DUET_OK;
    size_t n = w ? w->n : 0, nshard = 1, cur = 0, total = 0;
    size_t *start = NULL; /* first entry of each shard, plus n */
    st_wentry_t **sorted = NULL;
    json_t *index = NULL, *wm = NULL;
    char name[64], *path = NULL, *head = NULL;

    if (!w || !dir)
        return duet_err_set(err, DUET_ERR_INVALID, "st writer: invalid arguments");
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return duet_err_set(err, DUET_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    if (!(sorted = duet_malloc_array(n + 1, sizeof *sorted)) || !(start = duet_malloc_array(n + 2, sizeof *start)))
        goto err_nomem;
    for (size_t i = 0; i < n; i++)
        sorted[i] = &w->e[i];
    qsort(sorted, n, sizeof *sorted, st_cmp_wentry_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            st = duet_err_set(err, DUET_ERR_INVALID, "%s: tensor '%s' added twice", dir, sorted[i]->name);
            goto err_free;
        }
    start[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nb = w->e[i].nbytes;
        if (shard_bytes && cur > 0 && (cur >= shard_bytes || nb > shard_bytes - cur)) {
            start[nshard++] = i;
            cur = 0;
        }
        cur += nb;
        total += nb;
    }
    start[nshard] = n;
    int indexed = nshard > 1 || always_index;
    if (indexed && (!(index = json_pack("{s:{s:I}, s:{}}", "metadata", "total_size", (json_int_t)total,
                                        "weight_map")) ||
                    !(wm = json_object_get(index, "weight_map"))))
        goto err_nomem;
    for (size_t s = 0; s < nshard; s++) {
        if (indexed)
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, nshard);
        else
            snprintf(name, sizeof name, "%s", ST_SINGLE_NAME);
        if (!(path = st_join(dir, name)) || !(head = st_shard_header(w, start[s], start[s + 1])))
            goto err_nomem;
        if ((st = st_write_file(path, head, 1, w->e, start[s], start[s + 1], err)) != DUET_OK)
            goto err_free;
        for (size_t i = start[s]; indexed && i < start[s + 1]; i++)
            if (json_object_set_new(wm, w->e[i].name, json_string(name)) < 0)
                goto err_nomem;
        free(path), path = NULL;
        free(head), head = NULL;
    }
    if (indexed) {
        if (!(path = st_join(dir, ST_INDEX_NAME)) || !(head = json_dumps(index, JSON_INDENT(2))))
            goto err_nomem;
        st = st_write_file(path, head, 0, NULL, 0, 0, err);
    }
    goto err_free;

err_nomem:
    st = duet_err_set(err, DUET_ERR_NOMEM, "%s: out of memory writing checkpoint", dir);
err_free:
    free(path);
    free(head);
    json_decref(index);
    free(start);
    free(sorted);
    return st;
}

void duet_st_writer_destroy(duet_st_writer_t **wp)
{
    duet_st_writer_t *w = wp ? *wp : NULL;
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    json_decref(w->meta);
    free(w);
    *wp = NULL;
}
