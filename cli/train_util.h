/* train_util.h — CLI pieces around training: the progress line (`shard
 * train`), and a checkpoint's parameters read back on one
 * rank (`shard generate`; the trainer writes them, trainer.h). */
#ifndef SHARD_CLI_TRAIN_UTIL_H
#define SHARD_CLI_TRAIN_UTIL_H

#include <stdint.h>

#include "shard/shard.h"

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
