/* cores.c — how many threads each rank's kernels (GEMMs, element-wise
 * loops) use when several ranks share a machine's cores.  Thread ranks of one
 * process share one pool of helper threads: each runs its kernels on one
 * thread.  Processes (MPI ranks) count the ranks on their machine — by host
 * name, gathered over the world — and split its cores between them, so that
 * two ranks on 16 cores get 8 threads each and one rank per machine all 16;
 * never more than the cores a launcher bound the rank to, and
 * OPENBLAS_NUM_THREADS, when set, is the user's word. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/blas.h"
#include "shard/launch.h"

/* FNV-1a of the host name: ranks with equal values share a machine */
static uint64_t host_id(void) {
    char name[256] = "";
    if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return h;
}

shard_status shard_share_cores(shard_comm *world) {
    int n = shard_comm_size(world);
    if (n <= 1) return SHARD_OK;
    if (strcmp(shard_comm_backend(world), "threads") == 0) return shard_blas_set_threads(1);
    int64_t mine = (int64_t)host_id(), *all = calloc((size_t)n, sizeof *all);
    if (!all) return shard_error(SHARD_ERR_NO_MEMORY, "share cores: out of memory");
    shard_status s = shard_comm_all_gather(world, &mine, all, 1, SHARD_I64);
    int here = 0;
    for (int r = 0; s == SHARD_OK && r < n; r++) here += all[r] == mine;
    free(all);
    if (s < 0) return s;
    /* a launcher that binds each rank to some cores (Open MPI binds to one core for -np <= 2) decides */
    cpu_set_t allowed;
    long online = sysconf(_SC_NPROCESSORS_ONLN), mine_cores = online;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) mine_cores = CPU_COUNT(&allowed);
    long width = here > 0 ? online / here : 1;
    if (width > mine_cores) width = mine_cores;
    const char *user = getenv("OPENBLAS_NUM_THREADS"); /* the user's word, as with one rank (blas.h) */
    if (user && atoi(user) > 0) width = atoi(user);
    return shard_blas_set_threads(width > 1 ? (int)width : 1);
}
