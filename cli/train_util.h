/* train_util.h — pieces `shard train` and `shard generate` share: the
 * progress line, and a model's parameters to and from a sharded checkpoint
 * (on a one-rank mesh), with the model's config riding in the index. */
#ifndef SHARD_CLI_TRAIN_UTIL_H
#define SHARD_CLI_TRAIN_UTIL_H

#include <stdint.h>

#include "shard/shard.h"

/* A progress bar on a terminal (redrawn in place), else a line every ~5%. */
void cli_progress(int tty, long step, long steps, float loss, float lr, double tokens_per_s, double ms);

/* Save params as checkpoint step `step` under dir; the JSON of config_path goes in the index. */
shard_status train_save_checkpoint(shard_comm *comm, const char *dir, uint64_t step, const shard_params *params,
                                   const char *config_path);
/* The config JSON text stored in a checkpoint's index (root or step dir); free() it. */
shard_status train_checkpoint_config(const char *where, char **json_text);
/* Fill params from the checkpoint (by name, every one required). */
shard_status train_load_checkpoint(shard_comm *comm, const char *where, shard_params *params, uint64_t *step);

#endif
