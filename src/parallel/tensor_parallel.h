/* tensor_parallel.h — internal: the pieces Megatron-style tensor parallelism
 * adds to a model's layers (the GPT's, src/models/gpt.c), over the mesh's
 * `tensor` communicator.  A NULL or one-rank communicator makes each of them
 * the plain single-device operation, so one layer code serves tensor=1 and
 * tensor=N.
 *
 *   column-parallel linear  weight split on the output dim: no communication
 *   row-parallel linear     weight split on the input dim: partial outputs summed
 *                           (tp_sum); the bias added by tensor rank 0 only before
 *                           the sum, or under sequence parallelism by every rank
 *                           to its own tokens after the reduce-scatter
 *   vocab-parallel          the embedding table and the tied LM head split by
 *                           rows (vocabulary): lookups summed, and a cross-entropy
 *                           that never forms the whole [N, V] logits (one rank's
 *                           arithmetic of both: src/kernels/kernels.h) */
#ifndef SHARD_TENSOR_PARALLEL_H
#define SHARD_TENSOR_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "shard/comm.h"

/* The even rule: part `part` of n over `parts` (the first n % parts parts one larger). */
void shard__tp_split(size_t n, int parts, int part, size_t *first, size_t *count);

/* x summed over the tensor ranks, in place (the row-parallel all_reduce). */
shard_status shard__tp_sum(shard_comm *tp, float *x, size_t n);

/* Cross-entropy over logits split by columns: this rank's logits[N, Vl] are columns v0 .. v0 + Vl - 1
 * of V.  *loss = (sum over rows with a target of -log softmax[target]) / denominator, the same on every
 * tensor rank; dlogits[N, Vl] = d(*loss)/d(logits), this rank's columns (it may be logits itself). */
shard_status shard__tp_cross_entropy(shard_comm *tp, const float *logits, const int32_t *targets, int32_t ignore_index,
                                     size_t N, size_t v0, size_t Vl, size_t V, double denominator, double *loss,
                                     float *dlogits);

#endif
