/* expert_parallel.h — internal: the trainer's side of the expert axis beyond
 * the token exchange of expert.h — where each expert rank's experts sit in a
 * parameter's whole tensor.  A parameter the model marks expert_split holds
 * this rank's experts stacked along dim 0; the whole tensor is every expert
 * rank's stack in rank order ([E, ...], experts in global order, as
 * shard_expert_range assigns them), which checkpoints and --init files hold
 * one expert per tensor (the model's stack table names them).
 *
 * A NULL layout (no expert axis of more than one rank, or a model without
 * expert parameters) makes every call the identity: the whole tensor is the
 * one held here. */
#ifndef SHARD_EXPERT_PARALLEL_H
#define SHARD_EXPERT_PARALLEL_H

#include "shard/comm.h"
#include "shard/model.h"

typedef struct shard__expert_layout {
    shard_comm *comm;
    int ranks, rank;
    size_t count;               /* the model's parameters */
    size_t *rows;               /* [count * ranks]: dim 0 of parameter i on expert rank r (0: dense) */
    const unsigned char *split; /* the model's expert_split */
} shard__expert_layout;

/* Collective over `expert`: every expert rank's dim 0 of each expert-split parameter (at its shape whole
 * over the tensor axis, shard_model_whole_shape).  *out NULL when there is nothing to gather.  Ranks
 * that mark different parameters are refused, naming one. */
shard_status shard__expert_layout_create(shard_comm *expert, const shard_model *m, shard__expert_layout **out);
void shard__expert_layout_destroy(shard__expert_layout *x);
/* Parameter i's whole shape from its shape whole over the tensor axis (dim 0 summed over expert ranks). */
void shard__expert_whole_shape(const shard__expert_layout *x, size_t i, size_t *shape);
/* Where this rank's experts start in parameter i's whole tensor, in elements; row_elems: elements per
 * dim-0 row. */
size_t shard__expert_offset(const shard__expert_layout *x, size_t i, size_t row_elems);
/* The whole tensor on every expert rank from each rank's experts, already at shard__expert_offset in
 * `whole` (collective over the expert axis, in place). */
shard_status shard__expert_gather(const shard__expert_layout *x, size_t i, float *whole, size_t row_elems);

#endif
