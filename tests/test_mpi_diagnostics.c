/* test_mpi_diagnostics.c — failure scenarios for the MPI backend, one per run:
 *   mpiexec -np 3 test_mpi_diagnostics timeout|mismatch|abort|recv_timeout|itimeout|send_timeout|exit_wait
 * Each scenario is meant to fail; tests/expect_failure.py checks that the job
 * ends non-zero, within its time limit, printing the expected line. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "shard/shard.h"

static const char *scenario;

static shard_status rank_fn(shard_comm *comm, void *arg) {
    (void)arg;
    int r = shard_comm_rank(comm);
    float x[1024] = {0};
    double xd[1024] = {0};
    if (strcmp(scenario, "timeout") == 0) { /* rank 1 never enters the all_reduce */
        if (r == 1) return SHARD_OK;
        return shard_comm_all_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM);
    }
    if (strcmp(scenario, "mismatch") == 0) /* needs SHARD_DEBUG=1 */
        return r == 1 ? shard_comm_all_reduce(comm, xd, xd, 1024, SHARD_F64, SHARD_OP_SUM)
                      : shard_comm_all_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM);
    if (strcmp(scenario, "abort") == 0) {
        if (r == 1) return shard_error(SHARD_ERR_IO, "injected failure: disk on fire");
        return shard_comm_all_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM);
    }
    if (strcmp(scenario, "recv_timeout") == 0) {
        if (r == 0) return shard_comm_recv(comm, x, 4, SHARD_F32, 1, 7);
        return SHARD_OK;
    }
    if (strcmp(scenario, "exit_wait") == 0) { /* rank 1 works on past the others' deadline at the final barrier */
        if (r == 1) {
            struct timespec pause = {20, 0};
            nanosleep(&pause, NULL);
        }
        return SHARD_OK;
    }
    if (strcmp(scenario, "itimeout") == 0 || strcmp(scenario, "send_timeout") == 0) {
        /* rank 1 never takes part.  MPI cannot cancel a started collective or a large send, so the
         * wait must end the process: returning would let the caller free buffers MPI still uses */
        static float big[1 << 20];
        if (r == 1) return SHARD_OK;
        shard_request *req = NULL;
        shard_status s = scenario[0] == 'i' ? shard_comm_iall_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM, &req)
            : r == 0                        ? shard_comm_isend(comm, big, 1 << 20, SHARD_F32, 1, 7, &req)
                                            : SHARD_OK;
        if (s == SHARD_OK && req) s = shard_request_wait(&req);
        if (r == 0 || scenario[0] == 'i') fprintf(stderr, "rank %d: the wait returned (%d)\n", r, (int)s);
        return s;
    }
    return shard_error(SHARD_ERR_INVALID_ARG, "unknown scenario '%s'", scenario);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: mpiexec -np 3 %s timeout|mismatch|abort|recv_timeout|itimeout|send_timeout|exit_wait\n",
                argv[0]);
        return 2;
    }
    scenario = argv[1];
    shard_status s = shard_launch(0, rank_fn, NULL);
    if (s < 0) {
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    return 0;
}
