/* train_util.h — CLI pieces around training: the layout flags `shard train` and `shard analyze` share
 * (and a plan file's flags, `train --plan`), the progress line (`shard train`), and a checkpoint's
 * parameters read back on one rank (`shard generate`; the trainer writes them, trainer.h). */
#ifndef SHARD_CLI_TRAIN_UTIL_H
#define SHARD_CLI_TRAIN_UTIL_H

#include <stdint.h>

#include "shard/shard.h"

/* The layout flags: how the model is split over the mesh and how the batch is cut.  One parser for
 * every place they are read, so that a flag means the same and is refused in the same words wherever
 * it is given. */
typedef struct cli_layout {
    const char *mesh, *schedule, *layers_per_stage, *batch_shares, *grad_dtype, *compute_dtype, *optimizer;
    long batch, micro_batch, accum, seq, zero, micro_batches, virtual_stages;
    double bucket_mb;
    int recompute, sequence_parallel;
    char specs[4096];    /* --spec NAME=SPEC, repeated: joined with ';' */
    unsigned long given; /* bit k: the table's flag k was given */
} cli_layout;

/* The defaults a parse starts from. */
#define CLI_LAYOUT_DEFAULTS                                                                                            \
    { .seq = 128, .bucket_mb = 25 }

/* Try to consume argv[*i] (and its value) as a layout flag: 1 consumed, 0 not a layout flag, -1 a bad
 * value (message printed). */
int cli_layout_option(cli_layout *l, int argc, char **argv, int *i);

/* "--mesh, --schedule, ..., --spec": the layout flags' names. */
void cli_layout_flag_names(char *out, size_t bytes);

/* The names the flags take (--grad-dtype, --compute-dtype, --optimizer, --schedule), checked: a wrong
 * one is SHARD_ERR_INVALID_ARG with its message. */
shard_status cli_layout_check_names(const cli_layout *l);

/* The trainer's config for the layout and the model config; what is not a layout flag (data, seed,
 * learning rate, clipping, weight decay) at the trainer's defaults for the caller to set. */
shard_trainer_config cli_layout_trainer_config(const cli_layout *l, const char *config_path);

/* Take from's flags into into: each flag from was given, and with whole every flag of the layout proper
 * (the mesh, ZeRO, the pipeline's flags, sequence parallel, the batch shares) at from's value, its
 * default when from was not given it.  A flag into was given with another value stops the merge: 0 and
 * the two written as flags ("--zero 2" and "--zero 1", or "no --recompute") in mine and theirs; else 1. */
int cli_layout_merge(cli_layout *into, const cli_layout *from, int whole, char *mine, char *theirs, size_t bytes);

/* A progress bar on a terminal (redrawn in place), else a line every ~5%. */
/* Whether a step gets the line (the first, the last, every ~5% between). */
int cli_progress_due(long step, long steps);
void cli_progress(int tty, long step, long steps, float loss, float lr, double tokens_per_s, double ms);

/* Fill a whole model's parameters from the checkpoint (by name, every one required; an expert stack from its
 * members' tensors). */
shard_status train_load_checkpoint(shard_comm *comm, const char *where, shard_model *model, uint64_t *step);
/* The same from a weights file (safetensors, or a sharded export's index). */
shard_status train_load_weights(const char *path, shard_model *model);

#endif
