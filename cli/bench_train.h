/* bench_train.h — options of `shard bench train`, shared by the single-rank
 * benchmark (bench_train.c) and the data-parallel one (bench_train_dp.c). */
#ifndef SHARD_CLI_BENCH_TRAIN_H
#define SHARD_CLI_BENCH_TRAIN_H

#include "cli_util.h"
#include "shard/shard.h"

typedef struct bench_train_opts {
    const char *config;
    long batch, seq, steps, warmup, threads, zero;
    double bucket_mb;
    int json, torch, bf16, bf16_compute;
} bench_train_opts;

/* --ranks N > 1, --zero K, or under mpirun: the trainer on a data mesh. */
int cli_bench_train_dp(const bench_train_opts *o, const cli_common *common);

/* A temporary directory with a token file of random tokens over the GPT config's vocabulary. */
shard_status bench_random_tokens(const char *config, shard_gpt_config *gc, char *dir, size_t dir_bytes);
void bench_remove_dir(const char *dir);

/* tools/reference/SCRIPT run with /usr/bin/python3 (no shell) as SCRIPT CONFIG N0 .. N4 (batch, seq,
 * steps, warm-up, threads or world) [EXTRA] (NULL: none), with OMP_WAIT_POLICY=PASSIVE when passive_omp:
 * the "ms_per_step" of its JSON line, or -1 with why (the last other line it printed, or its exit code)
 * written (bench_reference.c). */
double bench_reference_ms(const char *script, const char *config, const long numbers[5], const char *extra,
                          int passive_omp, char *why, size_t why_bytes);

/* The usage lines of the options bench_model_options reads besides --batch and --ranks (whose ranges
 * differ between `bench tensor` and `bench pipeline`). */
#define BENCH_MODEL_OPTIONS_USAGE                                                                                      \
    "  --config FILE            the GPT's config JSON (required), e.g. configs/gpt-bench.json\n"                       \
    "  --seq T                  tokens per row, 1..65536 (default 128)\n"                                              \
    "  --steps S                timed steps, 5..100000 (default 10)\n"                                                 \
    "  --json                   one JSON object per run instead of the table\n"

/* The options `bench tensor` and `bench pipeline` share: --config C.json [--batch B] [--seq T] [--steps S]
 * [--json] and the rank options (ranks default 2).  0, or the exit code after one error line. */
typedef struct bench_model_opts {
    const char *config;
    long batch, seq, steps, batch_min;
    int json;
    cli_common common;
} bench_model_opts;
int bench_model_options(int argc, char **argv, const char *verb, bench_model_opts *o);

/* `shard bench tensor`: tensor parallel (and sequence parallel) against one rank (bench_tensor.c). */
int cli_bench_tensor(int argc, char **argv);
/* `shard bench pipeline`: bubbles of the schedules, activations per stage, pipe=P against one rank
 * (bench_pipeline.c). */
int cli_bench_pipeline(int argc, char **argv);
/* `shard bench moe`: the mixture-of-experts GPT on an expert mesh, its all_to_alls and load, against
 * PyTorch on one process (bench_moe.c). */
int cli_bench_moe(int argc, char **argv);

#endif
