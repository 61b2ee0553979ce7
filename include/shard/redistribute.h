/* redistribute.h — plans that move a distributed tensor from one spec to
 * another with the least traffic.
 *
 * A plan is computed from the mesh layout, shape and the two specs alone (no
 * communicator), identically on every rank, so `shard inspect` can print it.
 * Each step is one collective over the mesh axes it changes:
 *
 *   replicated -> split     slice           a local sub-block, no traffic
 *   split -> replicated     all_gather      over the axes removed from the end of a dim
 *   partial -> replicated   all_reduce      over the partial axes
 *   partial -> split        reduce_scatter  each rank keeps its piece of the reduction
 *   split moved to a dim    all_to_all      the last axis of one dim becomes the next of another
 *   replicated -> partial   make_partial    local: sum keeps the value at coordinate 0, zeros elsewhere
 *
 * Compositions chain these, shrinking first (slices, reduce_scatters) and
 * growing last (all_gathers).  When the data-moving tail of that chain would
 * send more in total than sending every rank exactly the elements it lacks,
 * the tail is replaced by one `exchange` (all_to_allv over the axes that split
 * the tensor, each element sent once to each rank that needs it), which is
 * the minimum for specs without pending reductions. */
#ifndef SHARD_REDISTRIBUTE_H
#define SHARD_REDISTRIBUTE_H

#include <stdint.h>
#include <stdio.h>

#include "shard/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_REDISTRIBUTE_MAX_STEPS 32

typedef enum shard_redistribute_kind {
    SHARD_REDIST_SLICE = 0,
    SHARD_REDIST_MAKE_PARTIAL,
    SHARD_REDIST_ALL_REDUCE,
    SHARD_REDIST_REDUCE_SCATTER,
    SHARD_REDIST_ALL_GATHER,
    SHARD_REDIST_ALL_TO_ALL,
    SHARD_REDIST_EXCHANGE,
} shard_redistribute_kind;

typedef struct shard_redistribute_step {
    shard_redistribute_kind kind;
    unsigned axes;        /* the mesh axes of its communicator (bit k: axis k); 0: local */
    int from_dim, to_dim; /* the dim losing / gaining a split, or -1 */
    shard_spec after;     /* the placement once the step is done */
} shard_redistribute_step;

typedef struct shard_redistribute_plan {
    shard_mesh_layout layout;
    shard_dtype dtype;
    int ndim;
    size_t shape[SHARD_MAX_DIMS];
    shard_spec from, to;
    int nsteps; /* 0: the specs are equal, a local copy */
    shard_redistribute_step steps[SHARD_REDISTRIBUTE_MAX_STEPS];
} shard_redistribute_plan;

const char *shard_redistribute_kind_name(shard_redistribute_kind kind);

/* The plan from `from` to `to` (both checked against layout and ndim). */
shard_status shard_redistribute_plan_make(const shard_mesh_layout *layout, shard_dtype dtype, int ndim,
                                          const size_t *shape, const shard_spec *from, const shard_spec *to,
                                          shard_redistribute_plan *out);

/* The spec in force before step i (i == nsteps: the target). */
const shard_spec *shard_redistribute_plan_spec_before(const shard_redistribute_plan *plan, int step);

/* Bytes the rank at `coords` (one per mesh axis) sends in step `step`, or in
 * all steps when step < 0, counted as the communication layer counts them. */
uint64_t shard_redistribute_plan_bytes(const shard_redistribute_plan *plan, int step, const int *coords);
/* The same summed over every rank of the mesh. */
uint64_t shard_redistribute_plan_total_bytes(const shard_redistribute_plan *plan, int step);

/* "all_gather over a, dim 0: P('a', None) -> P()" */
void shard_redistribute_step_string(const shard_redistribute_plan *plan, int step, char *out, size_t out_bytes);
/* One line per step with its total bytes, or "no steps: same placement". */
void shard_redistribute_plan_print(const shard_redistribute_plan *plan, FILE *to);

#ifdef __cplusplus
}
#endif
#endif
