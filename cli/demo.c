/* demo.c — `shard demo`: a short tour of the communication layer.
 * Ranks pass a token round a ring, all_reduce and all_gather small vectors,
 * check the answers, then the all_reduce benchmark runs at a few sizes. */
#include <stdio.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"

enum { LINE_BYTES = 96 };

/* Rank 0 prints one line from every rank, in rank order. */
static shard_status print_from_all(shard_comm *comm, const char *line) {
    int n = shard_comm_size(comm);
    char mine[LINE_BYTES] = {0};
    char all[64][LINE_BYTES];
    snprintf(mine, sizeof mine, "%s", line);
    if (n > 64) return SHARD_OK;
    SHARD_CHECK(shard_comm_all_gather(comm, mine, all, LINE_BYTES, SHARD_U8));
    if (shard_comm_rank(comm) == 0)
        for (int p = 0; p < n; p++) printf("  %s\n", all[p]);
    return SHARD_OK;
}

static shard_status demo_rank(shard_comm *comm, void *arg) {
    (void)arg;
    int n = shard_comm_size(comm), r = shard_comm_rank(comm);
    char line[LINE_BYTES];
    if (r == 0)
        printf("shard demo: %d ranks on the %s backend\n\n1. a token passed round a ring (send/recv)\n", n,
               shard_comm_backend(comm));
    int token = 100 + r, got = -1;
    shard_request *reqs[2];
    SHARD_CHECK(shard_comm_irecv(comm, &got, 1, SHARD_I32, (r + n - 1) % n, 0, &reqs[0]));
    SHARD_CHECK(shard_comm_isend(comm, &token, 1, SHARD_I32, (r + 1) % n, 0, &reqs[1]));
    SHARD_CHECK(shard_request_wait_all(2, reqs));
    snprintf(line, sizeof line, "rank %d sent %d to rank %d and received %d from rank %d", r, token, (r + 1) % n, got,
             (r + n - 1) % n);
    SHARD_CHECK(print_from_all(comm, line));

    float v[4] = {(float)(r + 1), (float)(r + 1) * 10, 1, (float)r};
    SHARD_CHECK(shard_comm_all_reduce(comm, v, v, 4, SHARD_F32, SHARD_OP_SUM));
    float expect = (float)n * (float)(n + 1) / 2;
    if (v[0] != expect || v[2] != (float)n)
        return shard_error(SHARD_ERR_INTERNAL, "demo: all_reduce gave %g, expected %g", (double)v[0], (double)expect);
    if (r == 0)
        printf("\n2. all_reduce (sum) of [rank+1, 10(rank+1), 1, rank] = [%g, %g, %g, %g] on every rank\n",
               (double)v[0], (double)v[1], (double)v[2], (double)v[3]);

    int32_t ids[64];
    int32_t me = r * r;
    if (n <= 64) {
        SHARD_CHECK(shard_comm_all_gather(comm, &me, ids, 1, SHARD_I32));
        if (r == 0) {
            printf("\n3. all_gather of rank^2: [");
            for (int p = 0; p < n; p++) printf("%s%d", p ? ", " : "", ids[p]);
            printf("]\n\n4. all_reduce bandwidth\n");
        }
    }
    fflush(stdout);
    return shard_comm_barrier(comm);
}

static const char *const USAGE =
    "usage: shard demo [options]\n"
    "\n"
    "A short tour of the communication layer: the ranks pass a token round a ring, all_reduce and\n"
    "all_gather small vectors and check the answers, then the all_reduce benchmark runs from 1M to 64M.\n"
    "\n"
    "options:\n"
    "  --ranks N                ranks, 1..4096 (default 4; under mpirun the launcher's)\n";

int cli_demo(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 1);
    cli_common common = {0};
    for (int i = 1; i < argc; i++) {
        int c = cli_common_option(&common, argc, argv, &i);
        if (c < 0) return 2;
        if (c == 0) {
            cli_unknown_option("demo", argv[i], USAGE);
            return 2;
        }
    }
    if (common.ranks == 0) common.ranks = 4;
    shard_launch_config cfg = cli_launch_config(&common);
    shard_status s = shard_launch_with(&cfg, demo_rank, NULL);
    if (s == SHARD_OK) {
        bench_options opt;
        bench_options_default(&opt);
        opt.launch = cfg;
        opt.min_bytes = 1 << 20;
        opt.max_bytes = 64 << 20;
        opt.iters = 5;
        s = bench_comm_run(&opt);
    }
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}
