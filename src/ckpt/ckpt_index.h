/* ckpt_index.h — internal: the index.json of a sharded checkpoint, in memory
 * and on disk (jansson).  Layout of the file:
 *   {"format": "shard-checkpoint", "version": 1, "step": N, "mesh": "data=4",
 *    "world": 4, "config": {...} or null, "training": {...} (only when given),
 *    "files": {"rank_00000.safetensors": {"bytes": B, "xxh3": "16 hex digits"}, ...},
 *    "tensors": {"w": {"dtype": "F32", "shape": [8, 4], "spec": "P('data', None)",
 *                      "chunks": [{"file": "rank_00000.safetensors",
 *                                  "offsets": [0, 0], "sizes": [2, 4]}, ...]}, ...},
 *    "index_xxh3": "16 hex digits"}
 * The last key is the index's own checksum: the xxh3 of the file's bytes with those 16 digits written as
 * zeros, so an edit anywhere in the index (a step, a tensor's entry, a file's checksum) is refused by every
 * reader.  An index written before indexes carried one has no such key: it is read as it is, with a note. */
#ifndef SHARD_CKPT_INDEX_H
#define SHARD_CKPT_INDEX_H

#include <stdint.h>
#include <stdio.h>

#include "shard/tensor.h"

enum { SHARD__CKPT_NAME_BYTES = 64 };

typedef struct shard__ckpt_chunk {
    int file; /* index into files */
    size_t off[SHARD_MAX_DIMS], len[SHARD_MAX_DIMS];
} shard__ckpt_chunk;

typedef struct shard__ckpt_tensor {
    char *name;
    shard_dtype dtype;
    int ndim;
    size_t shape[SHARD_MAX_DIMS];
    char *spec;
    size_t nchunks;
    shard__ckpt_chunk *chunks;
} shard__ckpt_tensor;

typedef struct shard__ckpt_file {
    char name[SHARD__CKPT_NAME_BYTES];
    uint64_t bytes, xxh3;
} shard__ckpt_file;

typedef struct shard__ckpt_index {
    uint64_t step;
    char *mesh;
    int world;
    char *config;   /* JSON text, or NULL */
    char *training; /* JSON text of the run's training settings, or NULL */
    size_t ntensors, nfiles;
    shard__ckpt_tensor *tensors;
    shard__ckpt_file *files;
    size_t *by_name; /* tensors' indices sorted by name (set by index_read; NULL: find scans) */
    int checksummed; /* set by index_read: 1 when the index carries index_xxh3 (and it matched) */
} shard__ckpt_index;

shard_status shard__ckpt_index_write(const char *path, const shard__ckpt_index *ix);
/* Reads and checks (chunks inside the shape, files named, sizes sane, at least one tensor, its own
 * checksum when it has one, and a step that matches its step_N directory's name); messages name the path. */
shard_status shard__ckpt_index_read(const char *path, shard__ckpt_index *ix);
/* The one-line note that the index of step directory `dir` carries no checksum of its own, on out; nothing
 * when it does. */
void shard__ckpt_index_note(const char *dir, const shard__ckpt_index *ix, FILE *out);
void shard__ckpt_index_free(shard__ckpt_index *ix);
const shard__ckpt_tensor *shard__ckpt_index_find(const shard__ckpt_index *ix, const char *name);

/* dtype <-> safetensors string ("F32" ...) */
shard_status shard__ckpt_dtype_parse(const char *text, shard_dtype *out);

#endif
