/* pipeline_schedule.h — internal: pipeline schedules as data (the types are
 * public, in shard/schedule.h).
 *
 * A schedule is, for each of p pipe ranks, the ordered list of what it runs:
 * F (forward) or B (backward) of micro-batch j on one of its v chunks (model
 * chunk c of rank r is virtual stage s = c * p + r; v = 1 except for the
 * interleaved schedule).  The executor (pipeline.c) walks a rank's list and
 * nothing else, so GPipe, 1F1B and interleaved 1F1B are three generators here
 * and not three code paths there.
 *
 * A timeline places every op in unit-time slots honouring the dependencies
 * (F of stage s after F of s-1, B of s after B of s+1 and after F of s), which
 * gives the ASCII picture, the bubble fraction of equal-cost stages and the
 * micro-batches a stage holds at its peak. */
#ifndef SHARD_PIPELINE_SCHEDULE_H
#define SHARD_PIPELINE_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "shard/schedule.h"
#include "shard/status.h"

/* "gpipe", "1f1b", "interleaved" (NULL name on failure). */
shard_status shard__pipe_kind_parse(const char *text, shard_pipe_kind *out);
const char *shard__pipe_kind_name(shard_pipe_kind kind);

/* The schedule of `kind` for p ranks, m micro-batches, v chunks (v must be 1 unless interleaved; interleaved
 * needs m a multiple of p, as Megatron's). */
shard_status shard__pipe_schedule_create(shard_pipe_kind kind, int p, int m, int v, shard_pipe_schedule **out);
void shard__pipe_schedule_destroy(shard_pipe_schedule *s);

/* Slots of an equal-cost run: F costs f_cost slots, B b_cost; start[r][i] of op i of rank r; total slots.
 * Fails if the schedule deadlocks (an op waits on one that never runs).  *peak_in_flight[r]: the most
 * micro-batches rank r's stages hold (F done, B not yet) at once.  Any output may be NULL. */
shard_status shard__pipe_schedule_timeline(const shard_pipe_schedule *s, int f_cost, int b_cost, int **start,
                                           int *total_slots, int *peak_in_flight);
/* Idle fraction of the equal-cost timeline: 1 - busy / (p * total). */
double shard__pipe_schedule_bubble(const shard_pipe_schedule *s, int f_cost, int b_cost);

/* One line per rank: "rank 0 |F0 F1 B0 ..|" with '.' for idle slots (F and B one slot each); chunks as
 * F0a / F0b when v > 1. */
void shard__pipe_schedule_print(const shard_pipe_schedule *s, FILE *out);

/* Cut n layers into k consecutive parts: explicit counts "3,3,2" (must add up to n, each >= 1), or (list
 * NULL/"") evenly with the remainder spread over the first parts (10 over 4: 3, 3, 2, 2).  first[k + 1]. */
shard_status shard__pipe_partition(size_t n, int k, const char *list, size_t *first);

#endif
