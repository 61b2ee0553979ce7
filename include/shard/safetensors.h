/* safetensors.h — Hugging Face's safetensors format, read and written.
 *
 * A file is: 8 bytes little-endian header length N; N bytes of UTF-8 JSON
 * that start with '{' (trailing spaces allowed); then the data area.  The
 * JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
 * end)} (offsets relative to the data area), plus an optional "__metadata__"
 * object of string values.  Tensors lie back to back from offset 0 to the end
 * of the file.
 *
 * The reader maps the file and checks every rule of the format before it
 * exposes anything; a bad file is refused with one line naming the file, the
 * tensor and the field (see shard_safetensors_parse).  Tensors are exposed
 * without copying where their data is aligned for their dtype.
 *
 * The writer streams: the header is written first (padded with spaces so the
 * data starts 8-byte aligned), then each tensor's bytes in order, into a
 * temporary file that is fsynced, renamed into place, and whose directory is
 * fsynced — a crash leaves either the old file or the new one. */
#ifndef SHARD_SAFETENSORS_H
#define SHARD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shard/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_SAFETENSORS_MAX_HEADER 100000000u /* bytes of JSON header accepted */

typedef struct shard_st_entry {
    const char *name; /* NUL-terminated, non-empty, no NUL inside */
    shard_dtype dtype;
    int ndim; /* 0..SHARD_MAX_DIMS */
    size_t shape[SHARD_MAX_DIMS];
    uint64_t begin, end; /* byte offsets in the data area */
} shard_st_entry;

typedef struct shard_safetensors shard_safetensors;

/* Map and check a file. */
shard_status shard_safetensors_open(const char *path, shard_safetensors **out);
/* Check a file's bytes already in memory (`name` is used in messages); the
 * buffer must outlive the handle.  Exactly the checks of _open. */
shard_status shard_safetensors_parse(const void *bytes, size_t size, const char *name, shard_safetensors **out);
void shard_safetensors_close(shard_safetensors *file);

/* Tensors in order of their data offsets. */
size_t shard_safetensors_count(const shard_safetensors *file);
const shard_st_entry *shard_safetensors_entry(const shard_safetensors *file, size_t index);
/* NULL when absent. */
const shard_st_entry *shard_safetensors_find(const shard_safetensors *file, const char *name);
/* The bytes of a tensor (read-only, valid until close). */
const void *shard_safetensors_data(const shard_safetensors *file, const shard_st_entry *entry);

/* "__metadata__": number of pairs, and the value of a key (NULL when absent). */
size_t shard_safetensors_metadata_count(const shard_safetensors *file);
void shard_safetensors_metadata_pair(const shard_safetensors *file, size_t index, const char **key, const char **value);
const char *shard_safetensors_metadata(const shard_safetensors *file, const char *key);

/* The tensor as a shard_tensor: a read-only view of the mapping (storage
 * NULL, valid until close) when its data is aligned for the dtype, else an
 * accounted copy.  *copied says which; free with shard_tensor_destroy either way. */
shard_status shard_safetensors_tensor(const shard_safetensors *file, const char *name, shard_mem_category category,
                                      shard_tensor **out, int *copied);

/* safetensors dtype strings: "F32", "F64", "BF16", "F16", "I8", "I32", "I64", "U8". */
const char *shard_safetensors_dtype_name(shard_dtype dtype);

/* ---- writing ---- */

typedef struct shard_st_writer shard_st_writer;

/* Start a file with these tensors (their data follows in this order) and
 * metadata pairs (keys[i] -> values[i]); nothing is visible at `path` until
 * commit.  Names must be unique, non-empty, and not "__metadata__". */
shard_status shard_st_writer_open(const char *path, const shard_st_entry *entries, size_t count,
                                  const char *const *meta_keys, const char *const *meta_values, size_t meta_count,
                                  shard_st_writer **out);
/* Append the next bytes of tensor data (any split into calls). */
shard_status shard_st_writer_write(shard_st_writer *w, const void *bytes, size_t size);
/* Check that every byte was written, fsync, rename into place, fsync the directory; frees w. */
shard_status shard_st_writer_commit(shard_st_writer *w);
/* The same, also giving the file's xxh3-64 (XXH3_64bits of every byte, as
 * `xxhsum -H3` prints it) and its size. */
shard_status shard_st_writer_commit_digest(shard_st_writer *w, uint64_t *xxh3, uint64_t *file_bytes);
/* Drop the temporary file; frees w. */
void shard_st_writer_abort(shard_st_writer *w);

/* Write whole tensors (contiguous or not) in one call. */
shard_status shard_safetensors_write(const char *path, const char *const *names, const shard_tensor *const *tensors,
                                     size_t count, const char *const *meta_keys, const char *const *meta_values,
                                     size_t meta_count);

/* ---- inspection (what `shard inspect ckpt` prints) ---- */

/* Print a safetensors file's tensors (name, dtype, shape, byte range) and metadata to out; opening checks
 * every rule of the format.  verify: print a line saying those checks passed. */
shard_status shard_safetensors_describe(const char *path, int verify, FILE *out);
/* 1 when path names Hugging Face's sharded layout's index (it ends in ".index.json"). */
int shard_safetensors_is_index(const char *path);
/* Print such an index (tensor count, total size) and each file it names as shard_safetensors_describe
 * does; verify: also check that every tensor is in the file the index gives. */
shard_status shard_safetensors_index_describe(const char *path, int verify, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
