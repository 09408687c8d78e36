/* Safetensors checkpoints: reading (mmap, zero copy) and writing.
 *
 * File format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"k": "v"}}, then the data section.  Offsets are relative
 * to the data section.  A checkpoint directory holds either one
 * `model.safetensors` or shards listed by `model.safetensors.index.json`
 * ({"metadata": {...}, "weight_map": {"tensor": "shard file"}}).
 *
 * Every structural problem (short file, header length past the end, bad JSON,
 * unknown dtype, shape/byte-count mismatch, overlapping or out-of-range
 * offsets, duplicate names, a tensor the index names but its shard lacks) is a
 * typed error whose message names the file and, where there is one, the
 * tensor. */
#ifndef DUET_SAFETENSORS_H
#define DUET_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "err.h"

#define DUET_ST_MAX_DIMS 8
/* Header larger than this is refused (the format's reference reader uses 100 MB). */
#define DUET_ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct {
    const char *name;        /* owned by the file/checkpoint */
    duet_dtype_t dtype;
    int ndim;
    int64_t shape[DUET_ST_MAX_DIMS];
    const void *data;        /* points into the mapping; NULL only for headers parsed alone */
    uint64_t offset;         /* offset in the data section */
    size_t nbytes;
    const char *file;        /* path of the shard holding it */
} duet_st_tensor_t;

typedef struct duet_st_file duet_st_file_t;

/* Parse a header (the JSON bytes only, without the 8-byte length) against a
 * data section of `data_len` bytes.  On success *out holds the tensors
 * (sorted by name) and *n_out their count; free with duet_st_tensors_free.
 * `file` is used in messages.  This is the fuzz entry point. */
duet_status_t duet_st_parse_header(const char *json, size_t json_len, uint64_t data_len,
                                   const char *file, duet_st_tensor_t **out, size_t *n_out,
                                   duet_err_t *err);
void duet_st_tensors_free(duet_st_tensor_t *t, size_t n);

/* Open and mmap one .safetensors file. */
duet_status_t duet_st_file_open(const char *path, duet_st_file_t **out, duet_err_t *err);
void duet_st_file_close(duet_st_file_t **f);
size_t duet_st_file_count(const duet_st_file_t *f);
const duet_st_tensor_t *duet_st_file_tensor(const duet_st_file_t *f, size_t i);
/* Lookup by name (binary search); NULL when absent. */
const duet_st_tensor_t *duet_st_file_find(const duet_st_file_t *f, const char *name);
/* Value of a "__metadata__" key, or NULL. */
const char *duet_st_file_metadata(const duet_st_file_t *f, const char *key);

/* A checkpoint directory: the index (if present) and all its shards. */
typedef struct duet_st_checkpoint duet_st_checkpoint_t;

duet_status_t duet_st_checkpoint_open(const char *dir, duet_st_checkpoint_t **out, duet_err_t *err);
void duet_st_checkpoint_close(duet_st_checkpoint_t **ck);
/* NULL when the checkpoint has no such tensor. */
const duet_st_tensor_t *duet_st_checkpoint_find(const duet_st_checkpoint_t *ck, const char *name);
size_t duet_st_checkpoint_count(const duet_st_checkpoint_t *ck);
const duet_st_tensor_t *duet_st_checkpoint_tensor(const duet_st_checkpoint_t *ck, size_t i);

/* Writer: collects tensors (data copied), then writes shards of at most
 * `shard_bytes` each (0: one file) plus model.safetensors.index.json when
 * there is more than one shard (always writes the index when `always_index`). */
typedef struct duet_st_writer duet_st_writer_t;

duet_status_t duet_st_writer_create(duet_st_writer_t **out);
duet_status_t duet_st_writer_add(duet_st_writer_t *w, const char *name, duet_dtype_t dt, int ndim,
                                 const int64_t *shape, const void *data, size_t nbytes);
/* Like _add but takes ownership of a malloc'd buffer. */
duet_status_t duet_st_writer_add_owned(duet_st_writer_t *w, const char *name, duet_dtype_t dt, int ndim,
                                       const int64_t *shape, void *data, size_t nbytes);
duet_status_t duet_st_writer_set_metadata(duet_st_writer_t *w, const char *key, const char *value);
duet_status_t duet_st_writer_write_dir(duet_st_writer_t *w, const char *dir, size_t shard_bytes,
                                       int always_index, duet_err_t *err);
void duet_st_writer_destroy(duet_st_writer_t **w);

/* Bytes a tensor of this dtype and shape occupies (F4_E2M1X2: shape counts bytes). */
int duet_st_expected_bytes(duet_dtype_t dt, int ndim, const int64_t *shape, size_t *out);

#endif
