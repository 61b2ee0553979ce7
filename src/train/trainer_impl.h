/* trainer_impl.h — what the library's own planners read of a trainer (src/plan/analyze.c), and what
 * the migration to another layout moves (src/train/migrate.c). */
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

/* Collective over the world both trainers span (the same ranks): every parameter's values and optimizer
 * state arrays of `from`, one at a time made whole on every rank over from's mesh, and this rank's pieces
 * of them set in `to`'s strategy (src/train/migrate.c).  `from` is only read: when this fails it trains
 * on.  Both must train the same model with the same optimizer. */
shard_status shard__trainer_copy_state(shard_trainer *from, shard_trainer *to);

/* The mesh a trainer was made on. */
shard_mesh *shard__trainer_mesh(const shard_trainer *t);

#endif
