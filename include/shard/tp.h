/* tp.h — tensor-parallel building blocks: the layers a model calls to run
 * split over the mesh's `tensor` axis, written once on the communicator.  A
 * NULL or one-rank communicator makes each block the plain single-device
 * layer, so one model code serves tensor=1 and tensor=N, and a model that
 * calls these depends on no strategy.
 *
 * Activations between layers are in one of three states, named after the
 * spec (spec.h) of a [rows, width] activation on the tensor axis:
 *   SHARD_TP_REPLICATED  P()                   every rank holds all rows
 *   SHARD_TP_PARTIAL     P(partial='tensor')   every rank holds a summand
 *   SHARD_TP_TOKENS      P('tensor', None)     rank r holds its rows only
 *                                              (shard_split_even of the rows)
 * and every communication of a block is a change of state, done by
 * shard_tp_redistribute: partial -> replicated is an all_reduce, partial ->
 * tokens a reduce_scatter, tokens -> replicated an all_gather.
 *
 *   column-parallel linear  weight split on its output dim: y holds this
 *                           rank's columns, no communication forward; under
 *                           sequence parallel the tokens are gathered first
 *   row-parallel linear     weight split on its input dim: y is partial,
 *                           summed (all_reduce, or reduce_scatter to the
 *                           tokens); the bias is added by rank 0 before the
 *                           sum, or under sequence parallel by every rank to
 *                           its own tokens after the reduce_scatter
 *   vocabulary-parallel     an embedding table split by rows: a lookup is
 *                           partial (zero for ids another rank holds); a
 *                           cross-entropy over logits split by columns that
 *                           never forms the whole [N, V] row
 *
 * A layer placed P() (its weight whole on every tensor rank) is computed
 * whole by every rank: its output is replicated, not partial; the same
 * blocks serve it with `split` 0. */
#ifndef SHARD_TP_H
#define SHARD_TP_H

#include <stddef.h>
#include <stdint.h>

#include "shard/comm.h"
#include "shard/spec.h"
#include "shard/split.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shard_tp_state {
    SHARD_TP_REPLICATED = 0, /* P() */
    SHARD_TP_PARTIAL = 1,    /* P(partial='tensor') */
    SHARD_TP_TOKENS = 2      /* P('tensor', None): split over the rows (tokens) */
} shard_tp_state;

/* How a layer sits on the tensor axis.  A value the caller builds and passes at each call (read whole,
 * never kept), so it has no struct_size. */
typedef struct shard_tp_place {
    shard_comm *comm; /* the tensor axis (borrowed); NULL or one rank: the single-device layer */
    int split;        /* the layer's weight is split over comm (0: held whole by every rank, P()) */
    int tokens;       /* sequence parallel: the activations outside the layer are SHARD_TP_TOKENS */
} shard_tp_place;

/* The tensor rank and rank count of comm (0 and 1 for NULL). */
int shard_tp_rank(shard_comm *comm);
int shard_tp_size(shard_comm *comm);

/* This rank's tokens [*first, *first + *count) of `rows` (all of them without `tokens` or a second rank). */
void shard_tp_token_range(shard_comm *comm, int tokens, size_t rows, size_t *first, size_t *count);

/* x summed over the tensor ranks, in place (the all_reduce of partial -> replicated). */
shard_status shard_tp_sum(shard_comm *comm, float *x, size_t n);

/* An activation of [rows, width] from state `from` to `to` over comm.  `whole` is the [rows, width]
 * buffer, `local` this rank's rows [count, width] (it may be whole + first * width).  A replicated or
 * partial activation is read from (and a replicated one written to) whole; a token-split one is read
 * from (and written to) local.  Transitions: partial -> replicated (all_reduce in place), partial ->
 * tokens (reduce_scatter), tokens -> replicated (all_gather), replicated -> tokens (this rank's rows
 * copied), and any state to itself (nothing).  Others fail. */
shard_status shard_tp_redistribute(shard_comm *comm, float *whole, float *local, size_t rows, size_t width,
                                   shard_tp_state from, shard_tp_state to);

/* Column-parallel linear: y[N, out] = x[N, in] @ w[in, out] + b[out], w and b this rank's columns.  With
 * p->tokens x holds only this rank's tokens on entry (at x + first * in); they are gathered in place,
 * so x is whole afterwards (as backward needs it). */
shard_status shard_tp_column_forward(const shard_tp_place *p, float *x, const float *w, const float *b, float *y,
                                     size_t N, size_t in, size_t out);
/* dw[in, out] += x^T dy, db[out] += column sums of dy (NULL: not wanted), and the input's gradient: dx[N, in]
 * (NULL: not wanted) is this rank's summand, made whole into dx_local: all of dx summed (dx_local == dx),
 * or with p->tokens this rank's tokens' rows summed [count, in].  A layer not split computes dx whole. */
shard_status shard_tp_column_backward(const shard_tp_place *p, const float *x, const float *w, const float *dy,
                                      float *dx, float *dx_local, float *dw, float *db, size_t N, size_t in,
                                      size_t out);

/* Row-parallel linear: x[N, in] this rank's input columns, w[in, out] its rows; y_whole[N, out] receives
 * the partial product and y the sum: all of it (y == y_whole), or with p->tokens this rank's tokens' rows
 * [count, out].  b[out] (may be NULL) is added once, by the bias rule. */
shard_status shard_tp_row_forward(const shard_tp_place *p, const float *x, const float *w, const float *b,
                                  float *y_whole, float *y, size_t N, size_t in, size_t out);
/* dy: the output's gradient, all rows (or with p->tokens this rank's rows, gathered into dy_whole[N, out]);
 * dw += x^T dy, db += column sums (NULL: not wanted), dx[N, in] = dy w^T (NULL: not wanted), no sum. */
shard_status shard_tp_row_backward(const shard_tp_place *p, const float *x, const float *w, const float *dy,
                                   float *dy_whole, float *dx, float *dw, float *db, size_t N, size_t in, size_t out);

/* Vocabulary-parallel embedding: table[Vl, C] holds rows v0 .. v0 + Vl - 1 of the whole [V, C] (split) or
 * all of them (v0 0, Vl V).  y receives the rows of ids[N]: all of them (y == y_whole) or with p->tokens
 * this rank's tokens' [count, C]; y_whole[N, C] is the partial lookup's room when split (with p->tokens). */
shard_status shard_tp_embedding_forward(const shard_tp_place *p, const float *table, const int32_t *ids, float *y_whole,
                                        float *y, size_t N, size_t v0, size_t Vl, size_t V, size_t C);
/* dtable rows this rank holds += dy rows of their ids; dy as y of the forward (with p->tokens this
 * rank's rows, gathered into dy_whole[N, C]). */
shard_status shard_tp_embedding_backward(const shard_tp_place *p, const int32_t *ids, const float *dy, float *dy_whole,
                                         float *dtable, size_t N, size_t v0, size_t Vl, size_t V, size_t C);

/* Vocabulary-parallel cross-entropy over logits split by columns: this rank's logits[N, Vl] are columns
 * v0 .. v0 + Vl - 1 of V (comm NULL: all of them).  *loss = (sum over rows with a target of
 * -log softmax[target]) / denominator, the same on every tensor rank; dlogits[N, Vl] = d(*loss)/d(logits),
 * this rank's columns (it may be logits itself: each target's logit is read before it is overwritten). */
shard_status shard_tp_cross_entropy(shard_comm *comm, const float *logits, const int32_t *targets, int32_t ignore_index,
                                    size_t N, size_t v0, size_t Vl, size_t V, double denominator, double *loss,
                                    float *dlogits);

/* The block of a parameter tensor rank `part` of `parts` holds under `spec` (written on the layout
 * "tensor=parts"; shard_tp_layout): offsets and lengths per dim of the whole `shape[ndim]`. */
shard_mesh_layout shard_tp_layout(int parts);
void shard_tp_piece(const shard_spec *spec, int ndim, const size_t *shape, int parts, int part, size_t *off,
                    size_t *len);

#ifdef __cplusplus
}
#endif
#endif
