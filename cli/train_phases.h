/* train_phases.h — `shard train`'s step time by phase: when a run moves to another layout (--reshard-at,
 * --adaptive) or its emulated cluster changes (a node's `changes`), rank 0 prints the median step time
 * of each stretch between those events, so the effect of each shows in one line:
 *   train: step time by phase (median ms): steps 1-39 242.5 | steps 40-60 679.3 (node 'flaky' 3x slower)
 *   | steps 61-70 348.6 (after a move) */
#ifndef SHARD_CLI_TRAIN_PHASES_H
#define SHARD_CLI_TRAIN_PHASES_H

#include <stddef.h>
#include <stdint.h>

#include "shard/shard.h"

enum { TRAIN_PHASES_MAX = 64 };

typedef struct train_phases {
    uint64_t moved_after[TRAIN_PHASES_MAX]; /* the steps after which the run moved */
    size_t moves;
} train_phases;

/* The run moved to another layout after `step`. */
void train_phases_moved(train_phases *p, uint64_t step);

/* Rank 0 after the run: the phases of step_ms[count] (steps first, first + 1, ...), cut at each move and
 * at each step from which the cluster at cluster_path (NULL: none) changes; nothing when neither
 * happened. */
void train_phases_print(const train_phases *p, const double *step_ms, uint64_t first, size_t count,
                        const char *cluster_path);

#endif
