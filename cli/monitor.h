/* monitor.h — `shard train`'s per-rank step figures (monitor.c): the `ranks`
 * list of a --log line, the console's imbalance and bottleneck line, and a
 * rank's mesh coordinates as the memory table, the line and the trace name
 * them. */
#ifndef SHARD_CLI_MONITOR_H
#define SHARD_CLI_MONITOR_H

#include <stddef.h>

#include "shard/shard.h"

/* "data=0,pipe=1": rank's coordinates on every axis of the mesh. */
void cli_mesh_where(const shard_mesh *mesh, int rank, char *out, size_t out_bytes);

/* Collective: rank 0 gets `"ranks": [{...}, ...]` (malloc'd; NULL elsewhere), every rank's last step
 * (shard_trainer_step_monitor) in one gather. */
shard_status cli_monitor_ranks_json(shard_comm *comm, const shard_trainer *t, char **out);

/* Collective: rank 0 prints the imbalance of compute over the ranks and the bottleneck of the last step:
 *   imbalance 0.12; bottleneck: rank 2 (pipe=1), compute 41.0 ms; others wait 18.0 ms on it */
shard_status cli_monitor_line(shard_comm *comm, const shard_mesh *mesh, const shard_trainer *t);

#endif
