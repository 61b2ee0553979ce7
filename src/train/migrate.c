/* migrate.c — a running training job moved to another layout at a step boundary (trainer.h,
 * shard_trainer_migrate): stop-and-copy over the communicator, no files.
 *
 *   1. the new trainer is built on the new mesh (its own model, strategy and optimizer state);
 *   2. every piece of state the run keeps across steps moves to it: each parameter's values and each of
 *      the optimizer's state arrays (AdamW's two moments, SGD's momentum buffer).  The rest of what a
 *      step depends on is not state: the step count and the learning rate's place in its schedule are
 *      the step number the caller passes, and the rows and dropout masks are drawn from (seed, step,
 *      row), which the new trainer has from its config;
 *   3. every rank agrees that it all went well; only then is the old trainer destroyed.  A failure on
 *      any rank (an allocation refused, a deadline, a model that does not match) leaves every rank with
 *      the old trainer as it was — the copy only reads it — and the same one line saying why.
 *
 * How the bytes move: one tensor (and state array) at a time, the old layout's pieces are made whole on
 * every rank (a gather over the data axis for ZeRO's shards, over the tensor and expert axes for their
 * blocks, a sum over the pipe axis from the stage that holds it — as a checkpoint is saved), and each
 * rank keeps the pieces the new layout gives it (as a checkpoint is resumed).  Every rank receives
 * every tensor whole, so the bytes moved (the communicator's own count, reported in the stats) are
 * about world x the state's bytes.  The least traffic is the intersection a checkpoint load computes
 * (src/ckpt/checkpoint_load.c) done in memory: every rank knows both layouts, so each can work out
 * which ranges of its old pieces each new owner lacks, and one all_to_allv per tensor, with the lowest
 * rank holding a replicated range as its one sender, moves exactly those bytes — at most the state
 * once, nothing where a rank already holds what it will hold. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "shard/trainer.h"
#include "train/trainer_impl.h"

/* Collective over world: SHARD_OK when s is on every rank; else the first failing rank's status and
 * text on every rank (broadcast from it), so all stop together and say the same. */
static shard_status agree(shard_comm *world, shard_status s) {
    int rank = shard_comm_rank(world);
    int32_t mine = s < 0 ? rank : INT32_MAX, first = INT32_MAX, code = s;
    char why[1024] = "";
    shard_status c = shard_comm_all_reduce(world, &mine, &first, 1, SHARD_I32, SHARD_OP_MIN);
    if (c < 0) return s < 0 ? s : c;
    if (first == INT32_MAX) return SHARD_OK;
    if (rank == first) snprintf(why, sizeof why, "%s", shard_last_error());
    c = shard_comm_broadcast(world, why, sizeof why, SHARD_U8, first);
    if (c == SHARD_OK) c = shard_comm_broadcast(world, &code, 1, SHARD_I32, first);
    if (c < 0) return s < 0 ? s : c;
    why[sizeof why - 1] = '\0';
    if (shard_comm_size(world) == 1 || rank == first) return shard_error(code, "%s", why);
    return shard_error(code, "rank %d: %s", (int)first, why);
}

shard_status shard_trainer_migrate(shard_trainer *old, shard_mesh *new_mesh, const shard_trainer_config *new_config,
                                   shard_trainer **out, shard_migration_stats *stats) {
    if (out) *out = NULL;
    if (!old || !new_mesh || !new_config || !out)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_migrate: NULL argument");
    if (stats && stats->struct_size < sizeof *stats)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_trainer_migrate: stats->struct_size %zu: set it to sizeof(shard_migration_stats) "
                           "(%zu)",
                           stats->struct_size, sizeof *stats);
    shard_mesh *from_mesh = shard__trainer_mesh(old);
    shard_comm *world = shard_mesh_comm(from_mesh), *to_world = shard_mesh_comm(new_mesh);
    if (shard_comm_size(to_world) != shard_comm_size(world) || shard_comm_rank(to_world) != shard_comm_rank(world))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "migrate: the new mesh spans %d ranks and this is its rank %d; the old one %d ranks, "
                           "this its rank %d: a migration keeps the same ranks in the same order",
                           shard_comm_size(to_world), shard_comm_rank(to_world), shard_comm_size(world),
                           shard_comm_rank(world));
    double t0 = shard__now();
    uint64_t sent0 = shard_mesh_bytes_sent(from_mesh);
    shard_trainer *t = NULL;
    shard_status s = agree(world, shard_trainer_create(new_mesh, new_config, &t));
    if (s == SHARD_OK) s = agree(world, shard__trainer_copy_state(old, t));
    double took[2] = {(shard__now() - t0) * 1e3, (double)(shard_mesh_bytes_sent(from_mesh) - sent0)}, most[2] = {0};
    /* the stats: the slowest rank's time, every rank's bytes */
    if (s == SHARD_OK) s = shard_comm_all_reduce(world, &took[0], &most[0], 1, SHARD_F64, SHARD_OP_MAX);
    if (s == SHARD_OK) s = shard_comm_all_reduce(world, &took[1], &most[1], 1, SHARD_F64, SHARD_OP_SUM);
    if (s < 0) {
        shard_trainer_destroy(t);
        return s;
    }
    if (stats) stats->ms = most[0], stats->bytes = (uint64_t)most[1], stats->rank_bytes = (uint64_t)took[1];
    shard_trainer_destroy(old);
    *out = t;
    return SHARD_OK;
}
