/* moe.h — a mixture-of-experts MLP layer as building blocks a model calls (it holds no model-specific
 * code): a router, per-expert MLPs (GPT-2's c_fc, GELU, c_proj) and the gate-weighted combine.
 *
 * For N = rows x T tokens x[N, C]:
 *   logits = x' gate^T (x' = x, or x times uniform noise in [1 - jitter, 1 + jitter] while training),
 *   probs = softmax(logits) over the E experts (f32), the top-k experts per token (ties: the lower
 *   index), their gates (k = 1: the softmax probability; norm_topk_prob: the top-k probabilities
 *   renormalised to sum to 1; else the probabilities themselves),
 *   y[t] = sum over the token's kept choices of gate x expert_e(x[t]).
 * The routing group is one row: an expert takes at most capacity = ceil(capacity_factor x T x k / E)
 * of a row's assignments (0: no limit), admitted by position (earlier tokens first, whatever their
 * choice rank); the rest are dropped (their output is zero) and counted.  With random routing (GShard,
 * k >= 2, training only) a token's second choice is kept with probability min(1, 2 x its gate).
 * Jitter and random routing draw from counters keyed by (the caller's seed, global row, position), so
 * any split of the rows draws the same numbers.
 *
 * Router losses, each a mean over a row's tokens and then summed over the rows and divided by
 * row_denominator (the global batch's row count, as the model's loss is a mean over the global batch):
 *   aux (Switch / GShard load balancing) = E x sum_e f_e P_e, f_e the fraction of the row's top-k
 *     choices that went to e (each token's k choices counted, divided by k: the f_e sum to 1; for k = 1
 *     the top-1 choice), P_e the row's mean router probability of e;
 *   z (ST-MoE) = mean over the row's tokens of logsumexp(logits)^2.
 * The layer's backward adds aux_coef x d(aux) + z_coef x d(z) to the router's gradient.
 *
 * The tokens move to their experts through the expert exchange (expert.h's interface: one gather of
 * rows for the experts, one scatter of results back), so on an expert rank the layer computes only
 * the experts it holds, [first_expert, first_expert + held_experts).
 *
 * Over a tensor axis (`tensor`, Megatron's expert tensor parallel) each expert's c_fc is column-parallel
 * and its c_proj row-parallel: a rank holds `hidden` of the 4C inner units, the tokens (and the router,
 * computed whole) are the same on every tensor rank, and the experts' partial outputs are summed over
 * the axis before the combine (c_proj's bias added once, by tensor rank 0), their inputs' gradients
 * before the combine's backward. */
#ifndef SHARD_MOE_H
#define SHARD_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "shard/comm.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_moe_options {
    size_t struct_size; /* sizeof(shard_moe_options) */
    size_t experts, top_k;
    size_t width, hidden;  /* C and the experts' inner width this rank holds (4C, or its share over `tensor`) */
    float capacity_factor; /* 0: no token is dropped */
    float jitter;          /* router input noise while training (0: none) */
    int random_routing;    /* GShard's random routing of the second choice while training */
    int norm_topk_prob;    /* renormalise the top-k gates (k >= 2) */
    float aux_coef, z_coef;
    size_t first_expert, held_experts; /* the experts whose weights this rank holds (0, 0: all) */
    shard_comm *comm;                  /* the expert axis; NULL: every expert here */
    size_t max_tokens;                 /* the most tokens one forward routes */
    shard_comm *tensor;                /* the axis the inner width is split over; NULL: held whole */
} shard_moe_options;

/* The layer's parameters: the router [E, C] (no bias) and the held experts' stacked weights, in GPT-2's
 * Conv1D layout per expert: fc_w [held, C, F], fc_b [held, F], proj_w [held, F, C], proj_b [held, C]
 * (F: `hidden`, this rank's inner units; proj_b whole on every tensor rank).
 * Gradients in the same layout (added into). */
typedef struct shard_moe_weights {
    const float *gate, *fc_w, *fc_b, *proj_w, *proj_b;
} shard_moe_weights;
typedef struct shard_moe_grads {
    float *gate, *fc_w, *fc_b, *proj_w, *proj_b;
} shard_moe_grads;

/* What one forward draws its noise from (training 0: no jitter, no random routing). */
typedef struct shard_moe_keys {
    int training;
    uint64_t jitter_seed, routing_seed; /* e.g. shard_model_dropout_seed of two sites */
    size_t first_row;                   /* the global index of the forward's first row */
    int uncounted; /* a recomputation of a forward already run (a pipeline's recompute): the statistics stay */
} shard_moe_keys;

/* Counts since the last shard_moe_stats_reset. */
typedef struct shard_moe_stats {
    double aux, z;            /* the losses (sums over rows / row_denominator) */
    double assigned, dropped; /* token-expert assignments the router made; dropped for capacity */
    const double *load;       /* [experts]: assignments routed to each expert (before capacity) */
} shard_moe_stats;

typedef struct shard_moe shard_moe;

shard_status shard_moe_create(const shard_moe_options *o, shard_moe **out);
void shard_moe_destroy(shard_moe *m);

/* Which context the next forward and backward use (0 after create).  A context holds one forward's
 * routing and activations until its backward: a pipeline stage with several micro-batches in flight
 * gives each its own, and a backward runs on the context of its forward.  Made at its first selection. */
shard_status shard_moe_select(shard_moe *m, size_t context);

/* y[N, C] = the layer's output for x[N, C] (N = rows x T); x stays readable until the backward. */
shard_status shard_moe_forward(shard_moe *m, const shard_moe_weights *w, const float *x, size_t rows, size_t T,
                               const shard_moe_keys *keys, double row_denominator, float *y);
/* After a forward: dx[N, C] written from dy[N, C]; the parameters' gradients added. */
shard_status shard_moe_backward(shard_moe *m, const shard_moe_weights *w, const float *dy, float *dx,
                                const shard_moe_grads *g);

void shard_moe_stats_reset(shard_moe *m);
void shard_moe_stats_read(const shard_moe *m, shard_moe_stats *out);

/* The per-expert capacity of a row of T tokens: ceil(factor x T x k / E); SIZE_MAX when factor is 0. */
size_t shard_moe_capacity(float factor, size_t T, size_t top_k, size_t experts);

#ifdef __cplusplus
}
#endif
#endif
