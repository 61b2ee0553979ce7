/* mpi_absent.c — built instead of mpi_backend.c when no MPI library was found:
 * every MPI entry point reports clearly that this build lacks the backend. */
#include "../comm_impl.h"

int shard__mpi_built(void) { return 0; }

shard_status shard__mpi_world(shard_comm **out, int verbose, double timeout_seconds) {
    (void)verbose, (void)timeout_seconds;
    *out = NULL;
    return shard_error(SHARD_ERR_UNSUPPORTED,
                       "this build has no MPI backend: install libopenmpi-dev (make deps) and rebuild");
}

shard_status shard__mpi_raw_op(shard_comm *comm, const char *op, const void *send, void *recv, size_t count_per_rank,
                               shard_dtype dtype) {
    (void)comm, (void)send, (void)recv, (void)count_per_rank, (void)dtype;
    return shard_error(SHARD_ERR_UNSUPPORTED, "raw MPI timing of %s: this build has no MPI backend", op);
}

void shard__mpi_finalize_at_exit(void) {}
