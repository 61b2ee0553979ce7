/* pipeline.h — internal: the `pipe` axis strategy.  Each pipe rank holds one
 * stage model (model.h: shard_model_create_stage) and walks its list of the
 * schedule (pipeline_schedule.h): F of micro-batch j receives the previous
 * stage's output, runs the chunk's range of blocks (the model's pipeline
 * table) over an activation slot this strategy owns and sends its own on; B
 * receives the gradient of its output, runs the range backward and sends the
 * gradient of its input back.  Receives are posted one op ahead and sends are
 * non-blocking, so transfers overlap compute.  With recompute a stage keeps
 * only its inputs and runs the forward again just before each backward.
 *
 * The data axis strategy (data_parallel.h) sees the stage model like any
 * model: the micro-batches are its micro-steps, synchronised on the last
 * backward.  A parameter the first and last stages share (the GPT's tied
 * wte) lives on stage 0; the last stage's copy (held here, lent to the
 * model) is refreshed from it before every step and its gradient is added to
 * stage 0's before stage 0's last backward, so both ends see the
 * single-device parameter. */
#ifndef SHARD_PIPELINE_H
#define SHARD_PIPELINE_H

#include <stdio.h>

#include "parallel/data_parallel.h"
#include "parallel/pipeline_schedule.h"
#include "shard/comm.h"
#include "shard/model.h"
#include "shard/trainer.h"

typedef struct shard_pp shard_pp;

/* Micro-batches this rank holds at once under `s` (the model's activation slots: 1 with recompute). */
int shard__pp_slots(const shard_pipe_schedule *s, int rank, int recompute);

/* Allocates shard__pp_slots activation slots for the stage model m.  Each step sizes the holders for its
 * micro-batches' largest activation on this rank (shard__pp_run). */
shard_status shard__pp_create(shard_comm *pipe, shard_model *m, const shard_pipe_schedule *s, int recompute,
                              shard_pp **out);
void shard__pp_destroy(shard_pp *pp);

/* Load micro-batch k's rows of this rank into the model (the trainer's). */
typedef shard_status (*shard_pp_load_fn)(void *ctx, size_t micro);

/* Every F and B of this rank's list; *loss: the sum of the micro-batches' losses (the last stage's; 0 on
 * the others).  dp: told before each backward whether it is the last (it then starts its communication). */
shard_status shard__pp_run(shard_pp *pp, shard_dp *dp, shard_pp_load_fn load, void *ctx, double denominator,
                           double *loss);

/* `--layers-per-stage balanced` (pipeline_balance.c): time the whole model's layers on `rows` rows of
 * src (its last `layers` units are the layers) and cut them into k stages, first[0..k]; *report: one
 * line. */
shard_status shard__pipe_balance(shard_model *whole, shard_batch_source *src, size_t layers, int k, uint64_t seed,
                                 size_t rows, size_t *first, char *report, size_t report_bytes);

/* Timing of the last run (trainer.h's shard_pipeline_stats, less the stage and schedule). */
void shard__pp_stats(const shard_pp *pp, shard_pipeline_stats *out);

#endif
