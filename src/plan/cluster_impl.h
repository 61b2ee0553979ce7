/* cluster_impl.h — the emulated cluster's node-level lookups, for the cost model's pricing of large
 * layouts (include/shard/cluster.h has the rank-level ones). */
#ifndef SHARD_CLUSTER_IMPL_H
#define SHARD_CLUSTER_IMPL_H

#include "shard/cluster.h"

/* The node of rank `rank` (its device's, through the device map), or -1 when it has no device. */
int shard__cluster_rank_node(const shard_cluster *c, int rank);
/* The link between two devices on nodes na and nb (na == nb: two devices of one node). */
void shard__cluster_node_link(const shard_cluster *c, int na, int nb, double *alpha_seconds,
                              double *beta_bytes_per_second);

#endif
