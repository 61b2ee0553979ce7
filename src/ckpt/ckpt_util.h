/* ckpt_util.h — internal helpers shared by checkpoint save, load and the
 * CLI: file and directory names, which rank writes a chunk, directory
 * creation and removal, argument checks. */
#ifndef SHARD_CKPT_UTIL_H
#define SHARD_CKPT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_index.h"
#include "shard/checkpoint.h"
#include "shard/safetensors.h"

/* "rank_00003.safetensors", under dir when dir is not NULL. */
void shard__ckpt_rank_file(const char *dir, int rank, char *out, size_t out_bytes);
/* "dir/step_N" */
void shard__ckpt_step_dir(const char *dir, uint64_t step, char *out, size_t out_bytes);
void shard__ckpt_my_coords(const shard_mesh *mesh, int *coords);
/* 1 when the rank at coords writes its block of t: coordinate 0 on every axis that splits no dim. */
int shard__ckpt_writes_chunk(const shard_dtensor *t, const int *coords);
/* "step_N" -> N; 0 if the name is not exactly that. */
int shard__ckpt_parse_step_name(const char *name, uint64_t *step);
/* 1 and the step that root/latest names; 0 when it is absent or unreadable. */
int shard__ckpt_read_latest(const char *root, uint64_t *step);
/* 1 when root/step_N exists and a load through the root could pick it: `latest` is absent or names step
 * N or later.  A step_N past `latest` was left by a save that crashed between its rename and `latest`,
 * or by an earlier run when a run resumed from an older step moved `latest` back: a load through the
 * root never picks it, and a save of step N moves it aside (shard__ckpt_move_aside) instead of refusing. */
int shard__ckpt_step_committed(const char *root, uint64_t step);
/* Rename path to path.replaced-<unix time>[-k], a name no load picks; the new name in moved_to. */
shard_status shard__ckpt_move_aside(const char *path, char *moved_to, size_t moved_to_bytes);
/* mkdir -p */
shard_status shard__ckpt_mkdirs(const char *dir);
/* rm -rf (absent is fine) */
shard_status shard__ckpt_remove_tree(const char *path);
/* count > 0, tensors set and on one mesh, names non-empty and unique. */
shard_status shard__ckpt_check_items(const char *what, const shard_ckpt_item *items, size_t count);

/* The first of n elements at data that is NaN or infinite, or SIZE_MAX when every one is finite (always
 * for an integer dtype): a checkpoint's values are finite, on save and on load. */
size_t shard__ckpt_first_nonfinite(const void *data, shard_dtype dtype, size_t n);
/* "tensor 'w' holds NaN at [3, 1]": element k of a contiguous block at global offsets off, sizes len. */
void shard__ckpt_nonfinite_text(const char *name, const void *data, shard_dtype dtype, size_t k, int ndim,
                                const size_t *off, const size_t *len, char *out, size_t out_bytes);
/* The tensors each file holds are those the index lists in it, each with the listed dtype and sizes:
 * files[i] is file i of the index opened, or NULL to leave it unchecked.  1, else 0 with the first
 * mismatch in why (a tensor the index lists that its file lacks, or one a file holds that the index does
 * not list there). */
int shard__ckpt_check_listings(const char *dir, const shard__ckpt_index *ix, shard_safetensors *const *files, char *why,
                               size_t why_bytes);
/* 1 when dir/f->name has the index's size and xxh3; else 0 with the reason. */
int shard__ckpt_check_file(const char *dir, const shard__ckpt_file *f, char *why, size_t why_bytes);
/* A step directory from a step directory or a root (through `latest`, no fallback). */
shard_status shard__ckpt_resolve(const char *where, char *out, size_t out_bytes);
/* Candidate steps under a root, newest first: `latest`'s, then every other step_N older than it (the
 * order a load tries them in); *out is malloc'd. */
shard_status shard__ckpt_candidates(const char *root, uint64_t **out, size_t *n);
/* shard_ckpt_load of a model's whole state: the checkpoint's tensors are exactly the items' (none missing,
 * none extra), else refused naming them; shard_ckpt_load itself loads any subset of a checkpoint. */
shard_status shard__ckpt_load_model(const char *where, const shard_ckpt_item *items, size_t count, uint64_t *step_out);
/* shard__ckpt_resolve, then read that step's index.json into ix. */
shard_status shard__ckpt_open_index(const char *where, char *dir, size_t dir_bytes, shard__ckpt_index *ix);

#endif
