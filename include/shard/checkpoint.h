/* checkpoint.h — sharded checkpoints: every rank writes only the chunks it
 * owns, and any mesh and specs can load them (resharding by intersection).
 *
 * On disk (`dir` given to save/load):
 *   dir/step_N/rank_RRRRR.safetensors   one file per rank that owns chunks
 *   dir/step_N/index.json               tensors -> dtype, global shape, spec,
 *                                       chunks (file, global offsets, sizes);
 *                                       files -> bytes, xxh3; mesh, step, config
 *   dir/latest                          "step_N": the newest complete checkpoint
 *
 * A chunk is a distinct block of a tensor: the ranks that differ only along
 * axes that split no dim hold the same block, and only the one at coordinate
 * 0 of those axes writes it (a replicated tensor is written once).  A tensor
 * with a pending reduction is reduced first (as a redistribution to the spec
 * without it), so checkpoints hold values, never summands.
 *
 * Commit protocol: rank 0 clears a stale dir/step_N.tmp/ and creates it; each
 * rank writes its file there (temporary name, fsync, rename); a collective
 * carries every rank's status, file size and checksum; rank 0 writes
 * index.json, fsyncs, renames step_N.tmp to step_N, fsyncs dir, and replaces
 * `latest` atomically.  A crash at any point leaves the previous checkpoint
 * complete and `latest` naming it.
 *
 * Load resolves `latest` (or a given step_N directory), checks the index, the
 * files' sizes and checksums (each file hashed by one rank), and falls back to
 * the newest older step that is complete when the latest is not, saying so on
 * stderr.  Each rank then copies from the mapped chunk files exactly the
 * ranges that intersect its own shards. */
#ifndef SHARD_CHECKPOINT_H
#define SHARD_CHECKPOINT_H

#include <stdint.h>

#include "shard/dtensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_ckpt_item {
    const char *name;      /* unique, non-empty */
    shard_dtensor *tensor; /* save: the values; load: filled, under its own mesh and spec */
} shard_ckpt_item;

/* Collective over the items' mesh (every item on the same mesh).
 * `config_json`: the run's configuration, stored in the index (NULL: none). */
shard_status shard_ckpt_save(const char *dir, uint64_t step, const shard_ckpt_item *items, size_t count,
                             const char *config_json);
/* The same, with the run's training settings (a JSON object's text: learning rate, schedule, seed ...)
 * stored in the index as "training", so a resumed run can say where its settings differ. */
shard_status shard_ckpt_save_run(const char *dir, uint64_t step, const shard_ckpt_item *items, size_t count,
                                 const char *config_json, const char *training_json);

/* Collective.  `where` is a checkpoint root (uses `latest`, with fallback) or
 * one step_N directory (no fallback).  *step_out (may be NULL) gets the step. */
shard_status shard_ckpt_load(const char *where, const shard_ckpt_item *items, size_t count, uint64_t *step_out);

/* Testing hook: make save stop at a point of the commit protocol as if the
 * process had crashed there, leaving whatever it wrote so far.  Points:
 * "before_write", "after_write", "before_index", "before_rename",
 * "before_latest"; rank < 0: every rank, else that rank only.  NULL clears.
 * Also read from SHARD_CKPT_CRASH_AT="point" or "point@rank". */
void shard_ckpt_set_crash_point(const char *point, int rank);

#ifdef __cplusplus
}
#endif
#endif
