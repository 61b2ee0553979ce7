/* checkpoint.h — sharded checkpoints: every rank writes only the chunks it
 * owns, and any mesh and specs can load them (resharding by intersection).
 *
 * On disk (`dir` given to save/load):
 *   dir/step_N/rank_RRRRR.safetensors   one file per rank that owns chunks
 *   dir/step_N/index.json               tensors -> dtype, global shape, spec,
 *                                       chunks (file, global offsets, sizes);
 *                                       files -> bytes, xxh3; mesh, step, config;
 *                                       last, its own xxh3 (index_xxh3)
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
 * Load resolves `latest` (or a given step_N directory), checks the index (its
 * own checksum, its step against its directory's name), the files' sizes and
 * checksums (each file hashed by one rank) and that each file holds exactly
 * the tensors the index lists in it, and falls back to the newest older step
 * that is complete when the latest is not, saying so on stderr.  Each rank
 * then copies from the mapped chunk files exactly the ranges that intersect
 * its own shards.
 *
 * Values are checked as a training step checks its gradients: a save whose
 * tensors hold a NaN or an infinity is refused before any file is written
 * (`latest` stays), and a load refuses one, naming the tensor and element. */
#ifndef SHARD_CHECKPOINT_H
#define SHARD_CHECKPOINT_H

#include <stdint.h>
#include <stdio.h>

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

/* ---- a checkpoint root's steps, without starting ranks ---- */

/* "root/step_N" into out. */
void shard_ckpt_step_dir(const char *root, uint64_t step, char *out, size_t out_bytes);
/* 1 and *step when name is exactly "step_N" (a step directory's name); else 0. */
int shard_ckpt_parse_step_name(const char *name, uint64_t *step);
/* 1 and the step that root/latest names (the newest complete checkpoint); 0 when it is absent or
 * unreadable. */
int shard_ckpt_latest_step(const char *root, uint64_t *step);
/* 1 when root/step_N exists and a load through the root could pick it (`latest` is absent or names step
 * N or later): a save of that step would overwrite a checkpoint.  A step_N past `latest` (left by a save
 * that crashed before moving `latest`, or by a run resumed from an older step) is moved aside by a save
 * of step N instead. */
int shard_ckpt_step_committed(const char *root, uint64_t step);
/* The steps of the step_N directories under root, in directory order (none when root does not exist);
 * *steps is malloc'd (NULL when *n is 0). */
shard_status shard_ckpt_list_steps(const char *root, uint64_t **steps, size_t *n);
/* The save policy of a run that trains steps first..last and saves to root every `every` steps (0:
 * only at the end) and at step `last`, checked before any work: refused when a step it would save is a
 * committed checkpoint (shard_ckpt_step_committed), or, for a fresh run (resumed 0), when root's latest
 * is past its first save (saving would move latest back among another run's steps).  A step directory
 * past latest, which the save will move aside instead, is said on `notes` (NULL: not said).  Messages
 * name root as the --save directory. */
shard_status shard_ckpt_save_check(const char *root, uint64_t first, uint64_t last, uint64_t every, int resumed,
                                   FILE *notes);
/* The model config stored with a checkpoint (JSON text, malloc'd into *json_text).  `where` is a step
 * directory, or a root: its `latest` step, or past one whose index is broken the newest older step, as a
 * load goes.  Fails when the checkpoint carries no config. */
shard_status shard_ckpt_read_config(const char *where, char **json_text);

/* ---- inspection and export (one process, no ranks) ---- */

/* Print a checkpoint (a root through `latest`, or a step directory): its step, mesh, files and tensors
 * (dtype, global shape, spec, chunks) to out.  verify: also check every file's size and xxh3 and that
 * each chunk is in its file, and print a line saying so; the first mismatch is the error. */
shard_status shard_ckpt_describe(const char *where, int verify, FILE *out);

/* What shard_ckpt_export wrote. */
typedef struct shard_ckpt_export_result {
    char step_dir[4096];      /* the step directory exported */
    size_t tensors;           /* tensors written */
    uint64_t total_bytes;     /* their data */
    size_t left_out;          /* the optimizer's tensors (optimizer.*) not written */
    int parts;                /* 1: one file at `out`; else Hugging Face's sharded layout */
    char parts_pattern[4096]; /* parts > 1: the parts' names, "DIR/NAME-0000k-of-0000N.safetensors" */
    char index_path[4096];    /* parts > 1: the NAME.safetensors.index.json written */
    int removed_single;       /* parts > 1: an earlier single file at `out` was removed (it would shadow the index) */
} shard_ckpt_export_result;

/* Write a checkpoint's full tensors as one safetensors file `out` (metadata format "pt" and the step),
 * or, past max_shard_bytes, as Hugging Face's sharded layout beside it (NAME-0000k-of-0000N.safetensors
 * files and NAME.safetensors.index.json), one tensor in memory at a time.  `where`: a step directory, or
 * a root: its `latest` step, or when that is not usable the newest older one that is (said on stderr).
 * The optimizer's tensors only with with_optimizer.  Refused before any work when out's directory is
 * missing or cannot be written, out is not a file, or out lies inside the checkpoint; a failed export
 * leaves an earlier one as it was.  result may be NULL. */
shard_status shard_ckpt_export(const char *where, const char *out, uint64_t max_shard_bytes, int with_optimizer,
                               shard_ckpt_export_result *result);

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
