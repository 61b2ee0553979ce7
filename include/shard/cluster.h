/* cluster.h — a cluster description (nodes of devices, the links between and within them) and its
 * emulation on one machine.
 *
 * A description is JSON:
 *   {"nodes": [{"name": "a", "devices": 4, "compute_tflops": 0.01, "available_memory_gb": 2}, ...],
 *    "network":    {"bandwidth_gbps": 10, "latency_us": 500},   between two nodes
 *    "intra_node": {"bandwidth_gbps": 100, "latency_us": 20},   between two devices of one node
 *    "links": [{"from": "a", "to": "b", "bandwidth_gbps": 1, "latency_us": 2000}]}   optional overrides
 * A node may also change during a run: "changes": [{"at_step": 40, "slowdown": 3},
 * {"at_step": 60, "available_memory_gb": 1.5}] (optional, in any order) — from step at_step on (steps
 * count from 1) its devices compute at compute_tflops / slowdown (1 restores the declared rate) or have
 * that much memory.
 * Bandwidths are in gigabits per second (1e9 bits), latencies in microseconds, memory in GiB (2^30
 * bytes), compute in TFLOP/s (1e12 floating-point operations per second).  A link applies both ways.
 * Ranks lie on the nodes' devices in order (rank 0 on the first node's first device); a device map
 * ("3,0,1,2") says instead that rank i runs on device map[i], devices numbered in that same order.
 *
 * Emulation (shard_launch_config's cluster): every rank's compute span (its work between two
 * communication calls) is padded to the time its GEMM FLOPs take on its device; every message and
 * collective is delayed to its link's alpha-beta time; the rank's accounted memory is limited to its
 * device's; before each training step the rate and the limit follow the node's changes.  A device
 * declared faster than this machine gives a rank (at any step) is refused. */
#ifndef SHARD_CLUSTER_H
#define SHARD_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_cluster shard_cluster;

/* Where a rank runs. */
typedef struct shard_cluster_device {
    const char *node;      /* the node's name (the cluster's, valid while it lives) */
    int node_index;        /* in the nodes list */
    int device;            /* the device's number over the whole cluster */
    int local;             /* its number within its node */
    double compute_tflops; /* its node's, divided by the slowdown */
    double memory_bytes;   /* available_memory_gb in bytes (a change's, from its step on) */
    double slowdown;       /* the node's changes' slowdown at that step (1: the declared rate) */
} shard_cluster_device;

/* Parse a description; `where` names it in messages (a path).  Free with shard_cluster_destroy. */
shard_status shard_cluster_parse(const char *json_text, const char *where, shard_cluster **out);
/* Read and parse a file. */
shard_status shard_cluster_load(const char *path, shard_cluster **out);
void shard_cluster_destroy(shard_cluster *cluster);

/* "3,0,1,2": rank i runs on device map[i]; each device at most once, each below the device count.
 * NULL or "" puts ranks back on the devices in order. */
shard_status shard_cluster_set_device_map(shard_cluster *cluster, const char *map);

/* The same from an array: rank i runs on device map[i] for i < n (n == 0: in order). */
shard_status shard_cluster_set_device_map_array(shard_cluster *cluster, const size_t *map, size_t n);

/* A copy of the description and its device map (free with shard_cluster_destroy). */
shard_status shard_cluster_copy(const shard_cluster *cluster, shard_cluster **out);

/* Device i computes at tflops[i] TFLOP/s (each above 0) at every step, in place of its node's rate and
 * changes, for the planner and the cost model (the emulation keeps the nodes' rates): a copy re-priced
 * on measured speeds.  n is the device count; n == 0 restores the nodes' rates. */
shard_status shard_cluster_set_device_tflops(shard_cluster *cluster, const double *tflops, size_t n);

/* The devices over all nodes. */
int shard_cluster_devices(const shard_cluster *cluster);

/* The device of rank `rank` (refused when the cluster has too few devices, or the device map is shorter),
 * as it is at step 1. */
shard_status shard_cluster_rank_device(const shard_cluster *cluster, int rank, shard_cluster_device *out);

/* The same device as it is at step `step` (counted from 1): its node's changes with at_step <= step
 * applied (step 0: none). */
shard_status shard_cluster_device_at(const shard_cluster *cluster, int rank, uint64_t step, shard_cluster_device *out);

/* Whether any node has a "changes" list (without one, every step's devices are step 1's). */
int shard_cluster_has_changes(const shard_cluster *cluster);

/* The link between two ranks: its latency alpha in seconds and bandwidth beta in bytes per second
 * (a rank and itself: alpha 0, beta infinite). */
shard_status shard_cluster_link(const shard_cluster *cluster, int rank_a, int rank_b, double *alpha_seconds,
                                double *beta_bytes_per_second);

/* The ranks the cluster can hold: its devices, or the device map's length when one is set. */
int shard_cluster_ranks(const shard_cluster *cluster);

#ifdef __cplusplus
}
#endif
#endif
