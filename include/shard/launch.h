/* launch.h — start an SPMD job: the same rank function on every rank.
 *
 * Threads backend (the embedded default): shard_launch runs fn on `ranks`
 * threads of this process, each with its own world communicator handle,
 * last-error text and memory ledger.
 * MPI backend: when this process was started by mpirun / mpiexec / srun
 * (OMPI_COMM_WORLD_*, PMI_*, PMIX_*, or SLURM_* of a job step in the
 * environment), this process is one rank and fn runs once here. */
#ifndef SHARD_LAUNCH_H
#define SHARD_LAUNCH_H

#include <stddef.h>

#include "shard/comm.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef shard_status (*shard_rank_fn)(shard_comm *world, void *arg);

typedef enum shard_backend_choice {
    SHARD_BACKEND_AUTO = 0, /* MPI when started by a launcher, else threads */
    SHARD_BACKEND_THREADS,
    SHARD_BACKEND_MPI
} shard_backend_choice;

typedef struct shard_launch_config {
    size_t struct_size; /* sizeof(shard_launch_config): lets the struct grow */
    int ranks;          /* threads: number of ranks (0: 1); MPI: 0 or the launcher's size */
    shard_backend_choice backend;
    double timeout_seconds; /* 0: SHARD_TIMEOUT from the environment, else 300 */
    int verbose;            /* say which backend and environment were used (stderr) */
    /* an emulated cluster (shard/cluster.h) the ranks run on: `cluster`, else the description in
     * `cluster_file` with `device_map` ("3,0,1,2": rank i on device map[i]; NULL: in order) */
    const struct shard_cluster *cluster;
    const char *cluster_file;
    const char *device_map;
} shard_launch_config;

/* A config with the defaults filled in. */
shard_launch_config shard_launch_config_default(void);

/* Run fn on every rank.  Returns the first root-cause failure of any rank
 * (its text in shard_last_error()), SHARD_OK when all ranks succeeded. */
shard_status shard_launch(int ranks, shard_rank_fn fn, void *arg);
shard_status shard_launch_with(const shard_launch_config *config, shard_rank_fn fn, void *arg);

/* What an MPI launcher left in the environment: 1 and a description
 * ("OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4") when started by one. */
int shard_launch_detect_mpi(char *description, size_t description_bytes, int *rank, int *size);

/* Collective over `world`: the threads each rank's kernels use (shard_blas_set_threads) when ranks
 * share cores — thread ranks of one process 1 each; processes the cores of their machine divided by
 * the ranks on it (one rank per machine: all its cores).  A world of one rank is left as it is. */
shard_status shard_share_cores(shard_comm *world);

/* Default deadline in seconds: SHARD_TIMEOUT when set and valid, else 300. */
double shard_default_timeout(void);

/* 1 when this build includes the MPI backend. */
int shard_have_mpi(void);

#ifdef __cplusplus
}
#endif
#endif
