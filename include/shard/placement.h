/* placement.h — which device of a cluster each mesh position (rank) runs on.
 *
 * A placement is a permutation of the cluster's n devices: rank i runs on device perm[i] (ranks past the
 * layout's world leave their devices idle).  Three solvers:
 *   hungarian  the exact minimum of a linear cost (rank i on device j costs cost[i][j], independently of
 *              the other ranks): Kuhn-Munkres with potentials, O(n^3).  It sees each rank's compute on
 *              each device and what memory it would lack, not the links between ranks.
 *   anneal     simulated annealing over swaps of two positions, with geometric cooling, on a full
 *              objective (any cost of a whole permutation: for a plan, the cost model's predicted step),
 *              so pipeline neighbours, tensor and data groups are priced on the links they get.  The
 *              budget is spent in 8 rounds, the first from the best start, the others from random
 *              permutations, each ending in a swap descent (every pair tried until none improves).
 *   genetic    a permutation genetic algorithm on the same objective: tournament selection, order
 *              crossover, swap mutation, the best few kept from one generation to the next, a child
 *              that repeats one of its generation mutated again, all but the best renewed at random
 *              after 6 generations without a new best, and a swap descent from the best at the end.
 * The two searches spend a budget of objective evaluations, are deterministic given their seed, and start
 * from the identity and from a given permutation (the Hungarian answer of the linear part) when there is
 * one; their answer is never worse than those starts.
 *
 * For a plan, shard_placement_objective prices a permutation as the cost model does (shard_cost_predict
 * on the cluster with that device map) plus a penalty per byte a rank's peak exceeds its device's usable
 * memory, and gives the linear part for the Hungarian solver: each rank's GEMM FLOPs at each device's
 * rate plus the same memory penalty. */
#ifndef SHARD_PLACEMENT_H
#define SHARD_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "shard/analyze.h"
#include "shard/cluster.h"
#include "shard/cost_model.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Milliseconds added per byte a rank's peak exceeds its device's usable memory: large enough that no
 * placement that overfills a device beats one that does not. */
#define SHARD_PLACEMENT_PENALTY_MS_PER_BYTE 1.0

/* The exact minimum one-to-one assignment of the n x n row-major `cost` (row i -> column assign[i]),
 * its sum in *total (may be NULL).  Refuses n == 0 and a cost that is not a finite number. */
shard_status shard_assignment_hungarian(const double *cost, size_t n, size_t *assign, double *total);

/* The cost of a whole permutation (perm[i] the device of position i).  A cost that is not a number
 * stops the search with an error (the function may record its cause with shard_error first). */
typedef double (*shard_placement_cost_fn)(const size_t *perm, size_t n, void *ctx);

typedef struct shard_placement_options {
    size_t struct_size;  /* sizeof(shard_placement_options) */
    size_t evaluations;  /* the budget of objective evaluations (0: 4000) */
    const size_t *start; /* a further starting permutation of n (the Hungarian answer), or NULL */
    /* annealing: the first temperature (0: the mean rise of random swaps from the start over ln(1/0.7),
     * so that such a rise is first taken 70 % of the time) and the last as a fraction of the first
     * (0: 1e-3) */
    double temperature, final_fraction;
    /* genetic: the population (0: 40; at least 4), the tournament's size (0: 3), the best kept unchanged
     * each generation (0: 2), a child's chance of a swap mutation (0: 0.4; a second swap at its square,
     * ...) */
    size_t population, tournament, elite;
    double mutation;
} shard_placement_options;

/* Simulated annealing over swaps; the best permutation found in best[n], its cost in *cost.  o may be
 * NULL (the defaults).  The same seed gives the same answer. */
shard_status shard_placement_anneal(shard_placement_cost_fn fn, void *ctx, size_t n, uint64_t seed,
                                    const shard_placement_options *o, size_t *best, double *cost);

/* A permutation genetic algorithm; arguments as shard_placement_anneal's. */
shard_status shard_placement_genetic(shard_placement_cost_fn fn, void *ctx, size_t n, uint64_t seed,
                                     const shard_placement_options *o, size_t *best, double *cost);

/* A plan's placement objective: a layout's analysis on a cluster (copied: the caller's is not changed),
 * the profile's host part when given (may be NULL), a rank's peak allowed up to `max_memory_fraction` of
 * its device's memory (0: 0.9).  Its size is the cluster's devices; the analysis's world must fit them. */
typedef struct shard_placement_objective shard_placement_objective;

shard_status shard_placement_objective_create(const shard_analysis *a, const shard_machine_profile *profile,
                                              const shard_cluster *cluster, double max_memory_fraction,
                                              shard_placement_objective **out);
void shard_placement_objective_destroy(shard_placement_objective *obj);

/* The permutations' length: the cluster's devices. */
size_t shard_placement_objective_size(const shard_placement_objective *obj);

/* A shard_placement_cost_fn (ctx: the objective): the predicted step in ms with rank i on device perm[i],
 * plus the memory penalty; NaN with the cost model's error recorded when it fails. */
double shard_placement_objective_cost(const size_t *perm, size_t n, void *ctx);

/* The same prediction's parts: the step alone (ms) and the bytes by which ranks' peaks exceed their
 * devices' usable memory, summed over the ranks (either may be NULL). */
shard_status shard_placement_objective_predict(shard_placement_objective *obj, const size_t *perm, double *step_ms,
                                               double *over_bytes);

/* The linear part, n x n row-major: cost[i][j] = rank i's GEMM FLOPs at device j's rate (ms) plus the
 * memory penalty of rank i's peak on device j; rows past the world are 0. */
shard_status shard_placement_objective_linear(const shard_placement_objective *obj, double *cost);

#ifdef __cplusplus
}
#endif
#endif
