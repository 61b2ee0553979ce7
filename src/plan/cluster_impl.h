/* cluster_impl.h — the emulated cluster's node-level lookups, for the cost model's pricing of large
 * layouts and the emulation's following of the nodes' changes (include/shard/cluster.h has the
 * rank-level ones). */
#ifndef SHARD_CLUSTER_IMPL_H
#define SHARD_CLUSTER_IMPL_H

#include "shard/cluster.h"

/* The node of rank `rank` (its device's, through the device map), or -1 when it has no device. */
int shard__cluster_rank_node(const shard_cluster *c, int rank);
/* The link between two devices on nodes na and nb (na == nb: two devices of one node). */
void shard__cluster_node_link(const shard_cluster *c, int na, int nb, double *alpha_seconds,
                              double *beta_bytes_per_second);

/* The nodes, and node n's name and declared compute_tflops. */
int shard__cluster_node_count(const shard_cluster *c);
const char *shard__cluster_node_name(const shard_cluster *c, int n);
double shard__cluster_node_tflops(const shard_cluster *c, int n);
/* Node n at step `step`: its changes' slowdown (1: none) and its devices' memory in bytes. */
void shard__cluster_node_at(const shard_cluster *c, int n, uint64_t step, double *slowdown, double *memory_bytes);
/* The highest rate node n's devices reach at any step, in TFLOP/s (a slowdown below 1 raises it). */
double shard__cluster_node_peak_tflops(const shard_cluster *c, int n);

#endif
