/* emulate.h — the emulated cluster (shard/cluster.h) inside the communicator wrapper.
 *
 * A rank that runs on an emulated device has a context here (thread-local, installed by the launcher).
 * The wrapper (comm.c) calls these hooks only when it is set, so a run without a cluster pays one
 * branch per call:
 *   - at every communication call the compute span since the last one is padded to the time its GEMM
 *     FLOPs take at the device's rate (a sleep until span start + flops / rate);
 *   - a blocking call, and a request at its wait, end no earlier than its start + the alpha-beta time of
 *     its link (collectives: of their algorithm over the slowest link among their ranks). */
#ifndef SHARD_EMULATE_H
#define SHARD_EMULATE_H

#include <stdint.h>

#include "comm_impl.h"
#include "shard/cluster.h"

typedef struct shard__emu shard__emu;

extern _Thread_local shard__emu *shard__emu_current;

/* Collective over `world`, on every rank: the rank's device (refused, on every rank alike, when the
 * cluster has too few devices or one is faster than this machine gives a rank: its GEMM throughput
 * measured with every rank running at once), its memory limit on the calling thread's ledger, and the
 * context made current. */
shard_status shard__emu_rank_begin(shard_comm *world, const shard_cluster *cluster);
/* Before training step `step` (counted from 1), on each rank: the rank's compute rate and memory limit
 * become its device's at that step (the cluster's "changes"), and rank 0 prints one stderr line per
 * node whose device changed.  Without a context, or a cluster without changes: nothing. */
shard_status shard__emu_step_begin(uint64_t step);
/* Take the context down (the rank's function returned). */
void shard__emu_rank_end(void);

/* A communication call starts: the compute span is padded; returns the call's start. */
double shard__emu_call_begin(void);
/* It ends: sleep until `deadline` when earlier than that, and start the next compute span. */
void shard__emu_call_end(double deadline);

/* A collective's alpha-beta time as its terms, seconds = alphas x alpha + bytes / beta over its slowest
 * link, for rank r of n (ring all_reduce 2(n-1) steps of count / n, all_gather and reduce_scatter n-1 of
 * a block, all_to_all n-1 of the largest block): the emulation's delays and the analyzer's predictions
 * both come from here. */
void shard__emu_coll_terms(int n, int r, const shard__coll_args *a, double *alphas, double *bytes);

/* The alpha-beta seconds of collective `a` on `comm`, and of a message of `bytes` to or from `peer`. */
double shard__emu_coll_seconds(shard_comm *comm, const shard__coll_args *a);
/* When collective `a`, issued at `begin`, completes on `comm`'s emulated wire: its alpha-beta seconds
 * after `begin` or after the communicator's previous collective completes, whichever is later — the
 * collectives of one communicator take turns on its links, as a real network's stream runs them,
 * rather than each having the links to itself. */
double shard__emu_coll_deadline(shard_comm *comm, const shard__coll_args *a, double begin);
double shard__emu_p2p_seconds(shard_comm *comm, int peer, uint64_t bytes);

/* After a split made `*made` (NULL: this rank is in none): learn its ranks' world ranks (a collective on
 * the new communicator, kept out of its traffic figures). */
shard_status shard__emu_comm_split(shard_comm *made);
/* Free what a communicator keeps for the emulation. */
void shard__emu_comm_free(shard_comm *comm);

#endif
