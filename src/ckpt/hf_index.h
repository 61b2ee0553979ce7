/* hf_index.h — internal: Hugging Face's sharded safetensors layout, NAME.index.json, whose
 * "weight_map" gives each tensor's file (a bare .safetensors name beside the index).  One reader for
 * `--init` (params.c) and `shard inspect ckpt` (ckpt_inspect.c). */
#ifndef SHARD_HF_INDEX_H
#define SHARD_HF_INDEX_H

#include <stddef.h>

#include "shard/status.h"

typedef struct shard__hf_index {
    void *root;         /* the parsed JSON (jansson), which owns the names below */
    const char *path;   /* the index, as given */
    size_t dir_len;     /* the length of path's directory part, with its '/' (0: none) */
    const char **files; /* the distinct files, in first-use order */
    size_t nfiles, ntensors;
    long long total_size; /* metadata.total_size; -1 when absent */
} shard__hf_index;

/* 1 when path names such an index (it ends in ".index.json"). */
int shard__hf_index_is(const char *path);

/* Reads and checks the index: a "weight_map" object whose every value is a bare file name ending in
 * .safetensors.  Errors name the index and the entry. */
shard_status shard__hf_index_open(const char *path, shard__hf_index *ix);

/* The file (an index into ix->files) that holds tensor `name`, or -1 when the index does not list it. */
long shard__hf_index_file_of(const shard__hf_index *ix, const char *name);

/* Calls fn(ctx, tensor name, file index) for every tensor of the index, in the index's order, until fn
 * returns non-zero (which is returned). */
int shard__hf_index_each(const shard__hf_index *ix, int (*fn)(void *ctx, const char *name, size_t file), void *ctx);

/* The path of ix->files[file], beside the index; returns out. */
char *shard__hf_index_file_path(const shard__hf_index *ix, size_t file, char *out, size_t out_bytes);

void shard__hf_index_close(shard__hf_index *ix);

#endif
