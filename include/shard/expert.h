/* expert.h — expert-parallel building blocks: the token exchange of a
 * mixture-of-experts layer whose E experts are split over the mesh's `expert`
 * axis (shard_split_even of the experts: rank r holds a contiguous range).
 * A model calls these as it calls the tensor-parallel blocks (tp.h), so it
 * depends on no strategy; a NULL or one-rank communicator keeps every expert
 * on this rank and the exchange is a local regrouping.
 *
 * A layer's router picks, for each of this rank's tokens, one or more experts:
 * n assignments (token-expert pairs).  The route counts them per expert and
 * exchanges the counts (an all_to_all of counts over the axis), so each rank
 * learns how many rows each of its experts receives from each rank; then
 * dispatch sends the assignments' rows to their experts' ranks and combine
 * brings the experts' outputs back (all_to_allv both ways).
 *
 * Order on the receiving side: grouped by local expert (expert 0 of the
 * range first), within an expert by sending rank, within a rank by the
 * sender's assignment order — a function of the assignments alone, the same
 * for any split of the experts, so an expert's rows on one rank are in the
 * order one rank holding every expert would see them.
 *
 * Backward: dispatch's backward is combine of the gradients (d x_experts ->
 * d x), combine's backward is dispatch (d y -> d y_experts), on the same route. */
#ifndef SHARD_EXPERT_H
#define SHARD_EXPERT_H

#include <stddef.h>
#include <stdint.h>

#include "shard/comm.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Experts [*first, *first + *count) of `experts` that rank `rank` of `ranks` holds (shard_split_even). */
void shard_expert_range(size_t experts, int ranks, int rank, size_t *first, size_t *count);

typedef struct shard_expert_route shard_expert_route;

/* One MoE layer's token exchange over comm (the mesh's expert axis; NULL or one rank: every expert here).
 * This rank has n assignments (token-expert pairs) whose experts are expert[0..n-1] (each in 0..experts-1),
 * listed in any order.  Collective: exchanges the per-expert counts.  An expert outside 0..experts-1 on
 * any rank fails every rank's call, naming the rank, the assignment and the valid range. */
shard_status shard_expert_route_create(shard_comm *comm, size_t experts, const int32_t *expert, size_t n,
                                       shard_expert_route **out);
/* Rows this rank's local expert e (0-based within its range) receives, summed over the sending ranks; and
 * the total over its local experts. */
size_t shard_expert_route_rows(const shard_expert_route *r, size_t local_expert);
size_t shard_expert_route_total(const shard_expert_route *r);
/* x[n, width] in assignment order -> x_experts[total, width] grouped by local expert (expert 0's rows
 * first), within an expert by sending rank then by assignment order (a deterministic order, the same
 * for any split).  Collective (all_to_allv). */
shard_status shard_expert_dispatch(shard_expert_route *r, const float *x, float *x_experts, size_t width);
/* The inverse: y_experts[total, width] (as dispatch laid them out) -> y[n, width] in assignment order.
 * Backward: dispatch's backward is combine of the gradients, combine's backward is dispatch. */
shard_status shard_expert_combine(shard_expert_route *r, const float *y_experts, float *y, size_t width);
void shard_expert_route_destroy(shard_expert_route *r);
/* The next forward's route in place of *route (NULL: none yet), as shard_expert_route_create makes it,
 * keeping the old one's staging buffers where they are large enough: a layer that routes every step
 * exchanges through memory already touched instead of fresh pages.  *route is replaced on success
 * only. */
shard_status shard_expert_route_renew(shard_expert_route **route, shard_comm *comm, size_t experts,
                                      const int32_t *expert, size_t n);

/* What this rank's exchanges cost: time inside the all_to_allv calls and the bytes they were handed, summed
 * since the last reset.  Kept per thread (ranks in one process are threads; a rank's layers run on its
 * thread), so a rank reads its own; the timer is two clock reads per call, always on.  Bytes are the whole
 * per-rank send buffer, the part kept for this rank's own experts included (what `shard bench comm --op
 * all_to_all` calls the size); a one-rank route moves nothing over a communicator and counts nothing.
 * Dispatch and combine are counted by the call: forward's dispatch and backward's combine-of-gradients
 * (dispatch's backward) are distinct calls, each counted where it is made. */
typedef struct shard_expert_stats {
    size_t struct_size;                        /* sizeof(shard_expert_stats) */
    double counts_ms, dispatch_ms, combine_ms; /* in the counts exchange, shard_expert_dispatch's, combine's */
    uint64_t counts_calls, dispatch_calls, combine_calls;
    uint64_t counts_bytes, dispatch_bytes, combine_bytes;
} shard_expert_stats;

/* This thread's totals since shard_expert_stats_reset (or the thread's start).  out->struct_size must be
 * set; fields past it are left alone. */
shard_status shard_expert_stats_get(shard_expert_stats *out);
void shard_expert_stats_reset(void);

/* One exchange as this rank saw it, for splitting its time into waiting and moving bytes: every rank of a
 * communicator logs the same calls in the same order, so call i of each rank's log is one collective, and
 * (on one host, where shard_clock_seconds is one clock) the latest enter_s over the ranks is when the bytes
 * could start to move; before it a rank waits for its peers, after it the call moves bytes (and waits for
 * the slowest copier).  enter_s and leave_s are the stats' own two clock reads. */
enum { SHARD_EXPERT_COUNTS, SHARD_EXPERT_DISPATCH, SHARD_EXPERT_COMBINE };
typedef struct shard_expert_call {
    int kind;                /* SHARD_EXPERT_COUNTS, _DISPATCH or _COMBINE */
    uint64_t bytes;          /* this rank's send buffer, as the stats count it */
    uint64_t recv_bytes;     /* this rank's receive buffer */
    double enter_s, leave_s; /* shard_clock_seconds at the call and its return */
} shard_expert_call;

/* Log this thread's exchanges into log[0..capacity-1] from now on, starting over at every
 * shard_expert_stats_reset (log NULL or capacity 0: stop logging).  The caller owns the array; calls past
 * the capacity are counted, not kept. */
void shard_expert_log_set(shard_expert_call *log, size_t capacity);
/* The exchanges this thread made since the last reset while logging, kept or not. */
size_t shard_expert_log_count(void);

#ifdef __cplusplus
}
#endif
#endif
