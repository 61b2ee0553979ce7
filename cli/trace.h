/* trace.h — the Chrome trace / Perfetto JSON of a pipelined step (trace.c). */
#ifndef SHARD_CLI_TRACE_H
#define SHARD_CLI_TRACE_H

#include "shard/shard.h"

/* Collective over world: every rank's spans of its last step, written to path by rank 0. */
shard_status cli_write_trace(shard_comm *world, const shard_pipeline_stats *stats, const char *path);

#endif
