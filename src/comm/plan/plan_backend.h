/* plan_backend.h — the plan communicator (plan_backend.c): one rank of a world whose other ranks are not
 * there, for the analyzer's dry run of the engine.  Every call completes at once and is tallied. */
#ifndef SHARD_PLAN_BACKEND_H
#define SHARD_PLAN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "shard/comm.h"

/* Calls and bytes sent by communicator name ("world", an axis such as "data" or "data,expert") and kind
 * (a collective's name, or "send" for point-to-point). */
typedef struct shard__plan_count {
    char comm[64], op[32];
    uint64_t calls, bytes;
    double alphas, wire_bytes; /* the alpha-beta terms of the calls (shard__emu_coll_terms; a send: 1, its bytes) */
    /* the terms of the largest burst: calls issued back to back, with no GEMM FLOPs between them (a
     * bucket's per-unit calls, issued together as backward ends), which wait together; a lone call is a
     * burst of one */
    double largest_alphas, largest_wire_bytes;
    double burst_alphas, burst_wire_bytes; /* the burst under way */
    uint64_t burst_flops;                  /* the rank's FLOP count at its last call */
    double small_alphas, small_wire_bytes; /* the terms of its calls of at most SHARD__PLAN_SMALL_BYTES */
} shard__plan_count;

/* A call this small is a synchronisation (a norm, a loss, a count), not a bucket of gradients: the cost
 * model does not hide it behind compute. */
#define SHARD__PLAN_SMALL_BYTES 4096

typedef struct shard__plan_tally {
    shard__plan_count *at;
    size_t n, cap;
} shard__plan_tally;

/* Rank `rank` of a plan world of `size` ranks; it and every communicator split from it count into
 * `tally` (which must outlive them). */
shard_status shard__comm_plan_world(int size, int rank, shard__plan_tally *tally, shard_comm **out);
int shard__comm_is_plan(const shard_comm *comm);
void shard__plan_tally_free(shard__plan_tally *tally);

#endif
