/* profile.h — `shard profile` (profile.c) and the real runs `shard bench analyze` sets the cost model's
 * predictions against (bench_analyze.c), shared so that the profile calibrates on the same runs. */
#ifndef SHARD_CLI_PROFILE_H
#define SHARD_CLI_PROFILE_H

#include "shard/shard.h"

/* Measure this machine into *p (quick: a few seconds, coarser). */
shard_status profile_machine(int quick, shard_machine_profile *p);

/* The median over `steps` steps, after `warmup` more, of the slowest rank's step time in ms: the
 * trainer config `tc` (its data_dir filled) on `mesh` over thread ranks (on an emulated cluster's
 * devices when `cluster` is not NULL); with peak_bytes, the fullest rank's peak accounted bytes too. */
shard_status layout_measure(const shard_trainer_config *tc, const char *mesh, const shard_cluster *cluster, int warmup,
                            int steps, double *median_ms, double *peak_bytes);

/* Each of `steps` (at most 16) timed steps' slowest-rank time in ms into step_ms[], after `warmup` more:
 * as layout_measure, on this machine. */
shard_status layout_measure_each(const shard_trainer_config *tc, const char *mesh, int warmup, int steps,
                                 double *step_ms);

/* The analysis of `tc` on `mesh` and its prediction on thread ranks: the profile's (p), the cluster's, or
 * both (either may be NULL, not both). */
shard_status layout_predict(const shard_trainer_config *tc, const char *mesh, const shard_machine_profile *p,
                            const shard_cluster *cluster, shard_analysis **analysis,
                            shard_step_prediction **prediction);

int cli_profile(int argc, char **argv);
int cli_bench_analyze(int argc, char **argv);
/* `shard bench plan` (bench_plan.c). */
int cli_bench_plan(int argc, char **argv);
int cli_bench_reshard(int argc, char **argv);

#endif
