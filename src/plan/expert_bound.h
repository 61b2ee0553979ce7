/* expert_bound.h — a mixture of experts' routing-dependent figures in the analyzer's dry run: the
 * token exchange's bytes and the experts' activation rows when routing fills every expert to its
 * capacity (the bound), beside the balanced routing the dry run takes.
 *
 * The dry run's router spreads the tokens over the experts in turn (src/nn/moe.c), so the exchange it
 * counts is a balanced router's.  Real data routes unevenly, bounded by the capacity: a row (a
 * sequence of T tokens) sends an expert at most cap = ceil(factor x T x top_k / experts) assignments
 * (shard_moe_capacity), and never more than T (a token picks an expert once).  For a set S of experts
 * a row thus sends at most
 *     rows_to(S) = min(|S| x min(cap, T), T x min(top_k, |S|))
 * assignments.  Without a capacity (factor 0: nothing dropped) the first term is |S| x T, so the bound
 * is every token sending min(top_k, |S|) of its choices into S: all tokens routed to one rank's experts.
 * Per forward of a layer over `rows` rows, on a rank holding `held` of the experts on an expert axis of
 * R ranks (each of the others routing up to `peer_rows` rows), the bound is
 *     sent rows      rows x rows_to(the experts held elsewhere)         (dispatch: this rank's tokens out)
 *     received rows  (R - 1) x peer_rows x rows_to(the experts held here) (combine: their results back)
 *     held rows      received rows + rows x rows_to(the experts held here)
 * and each forward's exchange sends the counts, the sent rows (dispatch) and the received rows (combine)
 * of C floats each; its backward the same two exchanges of rows again.  The sum over a step's forwards
 * and backwards (micro-steps, recomputed forwards, a stage's layers) bounds the bytes the step sends
 * over `expert` in all_to_allv calls, as shard_comm_bytes_sent counts them (rows to other ranks only).
 * The held rows bound the experts' activation rows: six buffers per layer context, inputs, outputs and
 * the inputs' gradients of C floats, hidden units, GELU slope and their gradient of F floats.
 *
 * The tally is a thread's, set by the analyzer around one rank's dry run (NULL otherwise: the layer
 * then does nothing more). */
#ifndef SHARD_EXPERT_BOUND_H
#define SHARD_EXPERT_BOUND_H

#include <stddef.h>
#include <stdint.h>

typedef struct shard__expert_plan {
    size_t peer_rows;                /* the most rows another rank of the expert axis routes per forward (0:
                                          the calling rank's own, as when every rank's micro-batch is alike) */
    uint64_t bound_bytes;            /* the exchanges' bytes at capacity (the analyzer resets it per step) */
    uint64_t activation_bytes;       /* the expert rows' buffers the layers hold in the dry run's routing */
    uint64_t activation_bound_bytes; /* the same at capacity */
} shard__expert_plan;

extern _Thread_local shard__expert_plan *shard__expert_plan_current;

/* One forward's (or backward's) figures of a layer: shapes as the layer holds them. */
typedef struct shard__expert_shape {
    size_t experts, top_k, held; /* E, K, and the experts this rank holds */
    size_t width, hidden;        /* C, and the inner width F this rank holds */
    size_t rows, tokens;         /* the forward's rows and tokens per row (T) */
    size_t capacity;             /* per row and expert (shard_moe_capacity; SIZE_MAX: none) */
    int ranks;                   /* of the expert axis (1: no exchange) */
} shard__expert_shape;

/* Assignments a row of `tokens` tokens sends to `set` experts at most (rows_to above). */
size_t shard__expert_rows_to(size_t set, size_t tokens, size_t top_k, size_t capacity);
/* The most rows the layer's held experts receive in one forward (peer_rows: 0 is `rows`). */
size_t shard__expert_held_bound(const shard__expert_shape *s, size_t peer_rows);
/* The bytes of the forward's exchanges (counts, dispatch, combine; forward 0: the backward's dispatch
 * and combine) at capacity. */
uint64_t shard__expert_bytes_bound(const shard__expert_shape *s, size_t peer_rows, int forward);
/* The bytes of `rows` held rows' six buffers. */
uint64_t shard__expert_activation_bytes(const shard__expert_shape *s, size_t rows);

#endif
