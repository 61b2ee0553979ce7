/* trainer_impl.h — what the library's own planners read of a trainer (src/plan/analyze.c), and what
 * the migration to another layout reads and writes of the two trainers (src/train/migrate.c). */
#ifndef SHARD_TRAINER_IMPL_H
#define SHARD_TRAINER_IMPL_H

#include "parallel/pipeline_schedule.h"
#include "shard/trainer.h"

/* The analyzer's dry build of one rank (its allocator in plan mode, its mesh on a plan communicator):
 * the trainer shard_trainer_create makes, without initialising the weights, reading rows of zeros
 * instead of data (the model's batch_shape says their layout).  Its steps run the engine's code path. */
shard_status shard__trainer_create_planned(shard_mesh *mesh, const shard_trainer_config *config, shard_trainer **out);

/* A migration's target: the trainer shard_trainer_create makes, its weights not drawn (zeros), as every
 * value and optimizer state is written by the migration before its first step. */
shard_status shard__trainer_create_to_fill(shard_mesh *mesh, const shard_trainer_config *config, shard_trainer **out);

/* The pipeline's schedule (NULL without a pipe axis). */
const shard_pipe_schedule *shard__trainer_schedule(const shard_trainer *t);

/* What a migration (src/train/migrate.c) reads of the trainer it leaves and writes in the one it moves
 * to, one parameter at a time.  The list of parameters it moves: from's (every pipeline stage's,
 * gathered over from's `pipe`: collective over it), the same on every rank, each with its whole
 * element count and its index among this rank's parameters of `from` and of `to` (SIZE_MAX: that
 * layout gives this rank none of it); refused when `to` holds a parameter from's model lacks or has at
 * another shape.  *out is the caller's to free. */
typedef struct shard__moved_param {
    size_t whole_n, from, to;
} shard__moved_param;
shard_status shard__trainer_moved_params(shard_trainer *from, shard_trainer *to, shard__moved_param **out,
                                         size_t *count);

const shard_optimizer *shard__trainer_optimizer(const shard_trainer *t);
/* Elements of this rank's piece of parameter i. */
size_t shard__trainer_piece_numel(const shard_trainer *t, size_t i);
/* This rank's piece of parameter i (its experts' rows, then its tensor block, or all of it) from the
 * whole tensor: the map from the whole tensor's elements to the piece's, as a resume applies it. */
void shard__trainer_take_piece(const shard_trainer *t, size_t i, const float *whole, float *piece);
/* Array `which` (0 the values, 1 + k the optimizer's state array k) of parameter i (SIZE_MAX: another
 * stage's) whole on every rank, as a save makes it: collective over t's mesh.  piece: scratch of
 * the piece's elements; whole: whole_n elements. */
shard_status shard__trainer_param_whole(shard_trainer *t, size_t i, int which, size_t whole_n, float *piece,
                                        float *whole);
/* Without communication: the ranges of parameter i's piece that this rank holds of array `which` (all
 * of it, or its ZeRO pieces; data_parallel.h's shard__dp_held), and their values into piece (the rest
 * left as it is); and the whole piece set (the parts this rank holds kept). */
shard_status shard__trainer_held(const shard_trainer *t, size_t i, int which, size_t *lo, size_t *hi, size_t cap,
                                 size_t *count);
shard_status shard__trainer_get_held(const shard_trainer *t, size_t i, int which, float *piece);
shard_status shard__trainer_set_piece(shard_trainer *t, size_t i, int which, const float *piece);

/* A live migration's use of the update (data_parallel.h's shard__dp_keep_grads): keep a copy of each
 * update's gradient (array 1 + the optimizer's state count of the calls above), read its scalars, and
 * replay an update on the gradient written to the new trainer (collective over t's data axis, as a
 * step's update is). */
shard_status shard__trainer_keep_grads(shard_trainer *t, int on);
void shard__trainer_kept(const shard_trainer *t, uint64_t *step, float *lr, float *clip);
/* 1 when the kept gradient is bf16 exactly (data_parallel.h's shard__dp_kept_is_bf16). */
int shard__trainer_kept_is_bf16(const shard_trainer *t);
/* The replay on parameters params[0..n) of t only (indices among t's; collective over t's data axis). */
shard_status shard__trainer_replay(shard_trainer *t, uint64_t step, float lr, float clip, const size_t *params,
                                   size_t n);

/* The mesh a trainer was made on. */
shard_mesh *shard__trainer_mesh(const shard_trainer *t);

#endif
