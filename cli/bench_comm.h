/* bench_comm.h — the communication benchmark behind `shard bench comm`. */
#ifndef SHARD_CLI_BENCH_COMM_H
#define SHARD_CLI_BENCH_COMM_H

#include <stdint.h>

#include "shard/shard.h"

typedef struct bench_options {
    const char *op; /* all_reduce | all_gather | reduce_scatter | all_to_all | sendrecv */
    shard_dtype dtype;
    uint64_t min_bytes, max_bytes;
    int warmup, iters; /* iters 0: as many as fit in ~0.2 s, at least 5 */
    int json;
    int baseline; /* under MPI, also time the raw MPI call */
    int cold;     /* before each call write the send buffer afresh and sweep the caches (as a step leaves them) */
    shard_launch_config launch;
} bench_options;

void bench_options_default(bench_options *opt);
int bench_op_valid(const char *op);
/* Run the benchmark and print its table (or JSON lines) on rank 0. */
shard_status bench_comm_run(const bench_options *opt);
/* Collective over comm: one size of `shard bench comm --op OP` measured as it measures it (default warm-up,
 * as many iterations as fit in ~0.2 s, the slowest rank's time, the median), without its check, with
 * `--cold` when cold: *median_us, and *moved the bytes the figure counts (the size rounded down to whole
 * elements per rank). */
shard_status bench_comm_op_time(shard_comm *comm, const char *op, uint64_t bytes, shard_dtype dtype, int cold,
                                double *median_us, uint64_t *moved);

/* `shard bench redistribute` (bench_redistribute.c). */
typedef struct bench_redist_options {
    const char *mesh; /* NULL: data=<ranks> */
    uint64_t bytes;   /* global tensor size (default 64 MiB) */
    int warmup, iters;
    int json;
    shard_launch_config launch;
} bench_redist_options;
shard_status bench_redistribute_run(const bench_redist_options *opt);

/* `shard bench ckpt` (bench_ckpt.c). */
typedef struct bench_ckpt_options {
    uint64_t bytes;  /* the model's size (default 1 GiB) */
    int iters;       /* >= 5 */
    int json, keep;  /* keep: leave the last checkpoint in dir */
    const char *dir; /* NULL: a new directory under /tmp */
    shard_launch_config launch;
} bench_ckpt_options;
shard_status bench_ckpt_run(const bench_ckpt_options *opt);

/* `shard bench gemm` (bench_gemm.c). */
typedef struct bench_gemm_options {
    size_t size; /* square M = N = K */
    int threads, iters, json;
} bench_gemm_options;
shard_status bench_gemm_run(const bench_gemm_options *opt);
/* GFLOP/s of `threads` threads running independent FMA chains together (~0.2 s). */
double bench_fma_peak(int threads);
/* The cores this process may run on (its affinity mask; the online cores when that cannot be read). */
int bench_cores(void);
/* The FMA peak of `threads` BLAS threads: one core's (median of `samples`, ~0.2 s each) times the cores
 * they can use, no more than bench_cores(): more threads than cores add no arithmetic. */
double bench_peak_of_threads(int threads, int samples);
/* The GPT step's matrix products (its linear layers' and tied LM head's: forward, input and weight
 * gradients) for `rows` = batch x seq tokens, each timed on its own with warm operands on the current
 * BLAS threads (median of `iters` runs per shape), summed over the step: the least time OpenBLAS needs
 * for them.  Attention's per-head products are left out (about 1 % of the step's FLOPs). */
shard_status bench_gpt_products(const shard_gpt_config *c, size_t rows, int iters, double *ms, double *gflop);

/* `shard bench train` (bench_train.c). */
int cli_bench_train(int argc, char **argv);

int cli_bench(int argc, char **argv);
int cli_demo(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_inspect_ckpt(int argc, char **argv); /* ckpt.c */
int cli_ckpt(int argc, char **argv);         /* ckpt.c */
int cli_data(int argc, char **argv);         /* data.c */
int cli_train(int argc, char **argv);        /* train.c */
int cli_analyze(int argc, char **argv);      /* analyze.c */
int cli_plan(int argc, char **argv);         /* plan.c */
int cli_generate(int argc, char **argv);     /* generate.c */

#endif
