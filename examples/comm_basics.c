/* comm_basics.c — the communicator in a page: the same function runs on every
 * rank (threads here, MPI processes under mpirun), averages a "gradient" with
 * a blocking all_reduce, then overlaps a non-blocking one with other work.
 *
 *   build/examples/comm_basics 4          4 thread ranks
 *   mpirun -np 4 build/examples/comm_basics   one rank per process */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "shard/shard.h"

enum { N = 1024 };

static shard_status step(shard_comm *world, void *arg) {
    (void)arg;
    int rank = shard_comm_rank(world), size = shard_comm_size(world);
    float grad[N];
    for (int i = 0; i < N; i++) grad[i] = (float)(rank + 1); /* this rank's gradient */
    SHARD_CHECK(shard_comm_all_reduce(world, grad, grad, N, SHARD_F32, SHARD_OP_AVG));

    shard_request *req = NULL; /* overlap communication with compute */
    float more[N];
    for (int i = 0; i < N; i++) more[i] = 1.0f;
    SHARD_CHECK(shard_comm_iall_reduce(world, more, more, N, SHARD_F32, SHARD_OP_SUM, &req));
    double busy = 0;
    for (int i = 0; i < 100000; i++) busy += (double)i * 1e-9; /* ... compute ... */
    SHARD_CHECK(shard_request_wait(&req));

    if (rank == 0)
        printf("%d ranks on %s: mean gradient %.2f (expected %.2f), sum of ones %.0f (busy %.3f)\n", size,
               shard_comm_backend(world), (double)grad[0], (size + 1) / 2.0, (double)more[0], busy);
    for (int i = 0; i < N; i++) /* every rank checks every element: the example is also a test */
        if (fabs(grad[i] - (size + 1) / 2.0) > 1e-6 * size || more[i] != (float)size)
            return shard_error(SHARD_ERR_INTERNAL, "rank %d: element %d is %g and %g; expected %g and %d", rank, i,
                               (double)grad[i], (double)more[i], (size + 1) / 2.0, size);
    return SHARD_OK;
}

int main(int argc, char **argv) {
    /* under mpirun the launcher decides how many ranks; alone, 2 threads unless told */
    int under_mpi = shard_launch_detect_mpi(NULL, 0, NULL, NULL);
    int ranks = argc > 1 ? atoi(argv[1]) : under_mpi ? 0 : 2;
    if (shard_launch(ranks, step, NULL) < 0) {
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    return 0;
}
