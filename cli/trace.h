/* trace.h — the Chrome trace / Perfetto JSON of a training step (trace.c). */
#ifndef SHARD_CLI_TRACE_H
#define SHARD_CLI_TRACE_H

#include "shard/shard.h"

/* Collective over world: every rank's events of the trainer's last step (shard_trainer_trace) into one
 * file, written by rank 0. */
shard_status cli_write_trace(shard_comm *world, const shard_mesh *mesh, const shard_trainer *t, const char *path);

#endif
