/* trainer_impl.h — what the library's own planners read of a trainer (src/plan/analyze.c). */
#ifndef SHARD_TRAINER_IMPL_H
#define SHARD_TRAINER_IMPL_H

#include "parallel/pipeline_schedule.h"
#include "shard/trainer.h"

/* The analyzer's dry build of one rank (its allocator in plan mode, its mesh on a plan communicator):
 * the trainer shard_trainer_create makes, without initialising the weights, reading rows of zeros
 * instead of data (the model's batch_shape says their layout).  Its steps run the engine's code path. */
shard_status shard__trainer_create_planned(shard_mesh *mesh, const shard_trainer_config *config, shard_trainer **out);

/* The pipeline's schedule (NULL without a pipe axis). */
const shard_pipe_schedule *shard__trainer_schedule(const shard_trainer *t);

#endif
