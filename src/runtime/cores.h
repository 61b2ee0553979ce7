/* cores.h — internal: the arithmetic of shard_share_cores (launch.h), apart
 * so that it can be tested without a machine of each shape. */
#ifndef SHARD_RUNTIME_CORES_H
#define SHARD_RUNTIME_CORES_H

/* Threads for one rank: the machine's online cores divided by the ranks on it, and no more than the
 * cores this rank may run on (`allowed`) divided by the ranks allowed exactly the same set; at least 1. */
int shard__cores_width(long online, int ranks_on_host, long allowed, int ranks_sharing_allowed);

#endif
