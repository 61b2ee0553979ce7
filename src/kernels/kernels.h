/* kernels.h — internal: kernels the rest of the library calls that are not public API.
 *
 * The vocabulary-parallel pieces: an embedding table and a cross-entropy whose rows (table) or columns
 * (logits) are split over the tensor ranks.  The kernels here do one rank's arithmetic; combining over
 * the ranks (the all-reduces) is the caller's, in nn/tp.c. */
#ifndef SHARD_KERNELS_KERNELS_H
#define SHARD_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

/* Targets outside 0..V-1 other than ignore_index refused (one line naming the row); *used gets the rows
 * whose target is not ignore_index. */
shard_status shard__cross_entropy_check_targets(const int32_t *targets, int32_t ignore_index, size_t N, size_t V,
                                                size_t *used);

/* Cross-entropy over logits split by columns: this rank's logits[N, Vl] are columns v0 .. v0 + Vl - 1
 * of V.  Three steps, the caller combining their results over the ranks in between:
 *   1. mx[n] = the largest of row n's logits here          then mx: the maximum over the ranks
 *   2. dlogits = exp(logits - mx) (dlogits may be logits);
 *      st[2n] = row n's sum of them, st[2n+1] = its target's
 *      logit where this rank holds it, else 0              then st: the sum over the ranks
 *   3. dlogits = the gradient of (sum of loss terms) * scale (rows of ignored targets zero); returns
 *      that sum of loss terms (every row's, the same on every rank). */
void shard__cross_entropy_split_max(const float *logits, size_t N, size_t Vl, float *mx);
void shard__cross_entropy_split_exp(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N,
                                    size_t v0, size_t Vl, const float *mx, double *st, float *dlogits);
double shard__cross_entropy_split_finish(const int32_t *targets, int32_t ignore_index, size_t N, size_t v0, size_t Vl,
                                         const float *mx, const double *st, double scale, float *dlogits);

/* y[N, C] = rows of table[Vl, C] (rows v0 .. v0 + Vl - 1 of the whole V) for the ids this rank holds,
 * zero for the others: summed over the tensor ranks (all_reduce, or reduce_scatter under sequence
 * parallel), every token has its row.  Ids outside 0..V-1 refused. */
shard_status shard__embedding_forward_split(const float *table, const int32_t *ids, float *y, size_t N, size_t v0,
                                            size_t Vl, size_t V, size_t C);
/* dtable rows this rank holds += dy rows of their ids. */
void shard__embedding_backward_split(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t v0, size_t Vl,
                                     size_t C);

#endif
