/* data_parallel.h — internal: the `data` axis strategy the trainer drives —
 * plain data parallel (zero 0) and ZeRO stages 1, 2, 3 (FSDP) — through the
 * model's hooks (model.h).  No model-specific code: it sees units only.
 *
 * Sharding (zero >= 1): each unit's slab range is split over the data ranks
 * by the even rule (the first size % D ranks hold one element more); a
 * rank's "shard" is its pieces of every unit, concatenated.  With an expert
 * axis a dense unit's ranks are data x expert and an expert unit's the data
 * axis alone (shard_dp_comms). */
#ifndef SHARD_DATA_PARALLEL_H
#define SHARD_DATA_PARALLEL_H

#include "shard/comm.h"
#include "shard/model.h"
#include "shard/optim.h"

typedef struct shard_dp shard_dp;

typedef struct shard_dp_stats {
    double exposed_comm_s; /* time the step waited on communication (not hidden behind compute) */
    uint64_t grad_bytes;   /* gradient bytes this rank handed to collectives this step */
} shard_dp_stats;

/* The communicators: dense units' gradients are summed (ZeRO: sharded) over `dense` — the data axis, or
 * data x expert on a mesh with an expert axis (an expert rank is also a data rank) — and the units the
 * model marks expert_split over `expert_data` (the data axis alone; NULL: dense), each expert rank
 * holding other experts.  `expert` (NULL: none): the expert axis, over which the squares of the expert
 * units are summed too, so the norm counts each expert once. */
typedef struct shard_dp_comms {
    shard_comm *dense, *expert_data, *expert;
} shard_dp_comms;

/* The model's values must be initialised (or loaded) before: stage 3 keeps only this rank's pieces. */
/* count_replicated 0: parameters the model marks tensor_replicated stay out of the squared norm (a
 * tensor rank other than 0 holds copies of them).  opt: the optimizer every update runs (the caller's,
 * kept until shard__dp_destroy); its state arrays start at zero. */
shard_status shard__dp_create(const shard_dp_comms *comms, shard_model *m, int zero, size_t bucket_bytes,
                              shard_dtype grad_dtype, int count_replicated, shard_dtype compute_dtype,
                              const shard_optimizer *opt, shard_dp **out);
void shard__dp_destroy(shard_dp *dp);

/* Before a step's first micro-step: zero the gradients, and clear what a step that stopped part-way left
 * (collectives in flight, gathered copies, unit gradients, acquire counts). */
shard_status shard__dp_begin_step(shard_dp *dp);
/* Before each micro-step: sync = this micro-step's gradients are communicated
 * (the last one; stages 2 and 3 reduce-scatter every micro-step). */
shard_status shard__dp_begin_micro(shard_dp *dp, int sync);
/* A pipeline runs the micro-batches' forwards and backwards interleaved: one begin_micro(0) before the
 * step's first op (the ZeRO-3 prefetch order is then the whole step's), and set_sync(1) before the
 * rank's last backward. */
void shard__dp_set_sync(shard_dp *dp, int sync);
/* After the last backward: wait for the gradients; *squares = the sum of the squared gradients over
 * the data axis (this rank's parameters), and with expert units over the expert axis too (every
 * expert once, every dense parameter once). */
shard_status shard__dp_finish(shard_dp *dp, double *squares);
/* Scale the gradients by clip, the optimizer's update on what this rank owns, then make every
 * replica's values whole again. */
shard_status shard__dp_update(shard_dp *dp, uint64_t step, float lr, float clip);
/* A live migration's hold on the update: on, each update first copies the gradient it reads (array
 * 1 + n_states of the range calls below reads that copy) with its step, learning rate and clip factor
 * (shard__dp_kept); off frees the copy. */
shard_status shard__dp_keep_grads(shard_dp *dp, int on);
void shard__dp_kept(const shard_dp *dp, uint64_t *step, float *lr, float *clip);
/* A live migration's replay of an update on the new layout, on the slab ranges [lo[r], hi[r]) only (the
 * parameters it holds so far; the rest is written later): shard__dp_update's arithmetic on what this
 * rank owns of them, then, at ZeRO 1/2, the units they touch made whole again on every replica
 * (collective over the data axis: every rank gives the same ranges). */
shard_status shard__dp_replay(shard_dp *dp, uint64_t step, float lr, float clip, const size_t *lo, const size_t *hi,
                              size_t ranges);
/* 1 when every element of the kept gradient is a bf16 value (its low 16 bits zero: gradients reduced in
 * bf16 are), so it travels as bf16 exactly; 0 otherwise or with none kept. */
int shard__dp_kept_is_bf16(const shard_dp *dp);
void shard__dp_stats(const shard_dp *dp, shard_dp_stats *out);

/* Whole values and, unless state is NULL, each of the optimizer's state arrays into state[k] (each
 * params->total floats) on every rank (shard_trainer_values). */
shard_status shard__dp_get_state(shard_dp *dp, float *values, float *const *state);
/* The slab range [off, off + n) (a parameter's) of the values (which 0) or the optimizer's state array
 * which - 1 (AdamW: 1 exp_avg, 2 exp_avg_sq; SGD with momentum: 1 momentum_buffer), whole on every rank
 * of the data axis (collective over it): checkpoints go one parameter and one array at a time, so no
 * rank holds the whole state of a model that ZeRO shards.  And back: every rank passes the same src
 * (NULL: zeros).  A `which` past the optimizer's arrays, or a range past the values, is refused. */
shard_status shard__dp_get_range(shard_dp *dp, int which, size_t off, size_t n, float *dst);
shard_status shard__dp_set_range(shard_dp *dp, int which, size_t off, size_t n, const float *src);

/* Without communication (a migration's reads, src/train/migrate.c): the parts of the slab range
 * [off, off + n) of array `which` this rank holds itself — all of it where the array is whole here,
 * else its ZeRO pieces — as ranges [lo[k], hi[k]) relative to off, in order, *count of them (only the
 * first cap stored; at most one per unit the range meets); and those parts' values into dst[0 .. n)
 * (the rest of dst left as it is). */
shard_status shard__dp_held(const shard_dp *dp, int which, size_t off, size_t n, size_t *lo, size_t *hi, size_t cap,
                            size_t *count);
shard_status shard__dp_get_held(const shard_dp *dp, int which, size_t off, size_t n, float *dst);

#endif
