/* cores.c — how many threads each rank's kernels (GEMMs, element-wise
 * loops) use when several ranks share a machine's cores.  Thread ranks of one
 * process share one pool of helper threads: each runs its kernels on one
 * thread.  Processes (MPI ranks) count the ranks on their machine — by host
 * name, gathered over the world — and split its cores between them, so that
 * two ranks on 16 cores get 8 threads each and one rank per machine all 16;
 * never more than the cores a launcher bound the rank to, divided between
 * the ranks bound to the same set (a cpuset of 8 cores on a 64-core machine,
 * two ranks unbound: 4 each), and OPENBLAS_NUM_THREADS, when set, is the
 * user's word. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/blas.h"
#include "shard/launch.h"
#include "runtime/cores.h"

/* FNV-1a over bytes, continuing from h */
static uint64_t fnv1a(uint64_t h, const void *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)bytes)[i]) * 1099511628211ULL;
    return h;
}

int shard__cores_width(long online, int ranks_on_host, long allowed, int ranks_sharing_allowed) {
    long width = ranks_on_host > 0 ? online / ranks_on_host : 1;
    long share = ranks_sharing_allowed > 0 ? allowed / ranks_sharing_allowed : allowed;
    if (width > share) width = share;
    return width > 1 ? (int)width : 1;
}

shard_status shard_share_cores(shard_comm *world) {
    int n = shard_comm_size(world);
    if (n <= 1) return SHARD_OK;
    if (strcmp(shard_comm_backend(world), "threads") == 0 || strcmp(shard_comm_backend(world), "plan") == 0)
        return shard_blas_set_threads(1); /* ranks in one process; a plan rank (the analyzer) alike */
    /* per rank: its host (equal values share a machine) and the cores it may run on (a launcher that binds
     * each rank gives each its own set; a job's cpuset left unbound is one set that its ranks share) */
    char name[256] = "";
    if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    long online = sysconf(_SC_NPROCESSORS_ONLN), mine_cores = online;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        mine_cores = CPU_COUNT(&allowed);
    else
        CPU_ZERO(&allowed);
    uint64_t host = fnv1a(1469598103934665603ULL, name, strlen(name));
    int64_t mine[2] = {(int64_t)host, (int64_t)fnv1a(host, &allowed, sizeof allowed)},
            *all = calloc(2 * (size_t)n, sizeof *all);
    if (!all) return shard_error(SHARD_ERR_NO_MEMORY, "share cores: out of memory");
    shard_status s = shard_comm_all_gather(world, mine, all, 2, SHARD_I64);
    int here = 0, same_set = 0;
    for (int r = 0; s == SHARD_OK && r < n; r++) {
        here += all[2 * r] == mine[0];
        same_set += all[2 * r] == mine[0] && all[2 * r + 1] == mine[1];
    }
    free(all);
    if (s < 0) return s;
    int width = shard__cores_width(online, here, mine_cores, same_set);
    const char *user = getenv("OPENBLAS_NUM_THREADS"); /* the user's word, as with one rank (blas.h) */
    if (user && atoi(user) > 0) width = atoi(user);
    return shard_blas_set_threads(width);
}
