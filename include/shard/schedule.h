/* schedule.h — pipeline schedules as data: for each of p pipe ranks the ordered
 * forward (F) and backward (B) ops it runs, GPipe, 1F1B or interleaved 1F1B,
 * the same lists the pipeline executes.  A timeline places the ops in
 * equal-cost slots honouring their dependencies, which gives the picture,
 * the bubble (idle fraction) and the micro-batches a rank holds at its peak. */
#ifndef SHARD_SCHEDULE_H
#define SHARD_SCHEDULE_H

#include <stdio.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shard_pipe_kind { SHARD_PIPE_GPIPE, SHARD_PIPE_1F1B, SHARD_PIPE_INTERLEAVED } shard_pipe_kind;

typedef struct shard_pipe_op {
    char what; /* 'F' or 'B' */
    int micro; /* 0 .. m-1 */
    int chunk; /* 0 .. v-1: the rank's model chunk (virtual stage chunk * p + rank) */
} shard_pipe_op;

typedef struct shard_pipe_schedule {
    shard_pipe_kind kind;
    int p, m, v;         /* pipe ranks, micro-batches, chunks per rank */
    int *count;          /* [p]: ops of rank r (2 * m * v) */
    shard_pipe_op **ops; /* [p][count[r]] */
} shard_pipe_schedule;

/* "gpipe", "1f1b" or "interleaved"; anything else is refused naming the three. */
shard_status shard_pipe_kind_parse(const char *text, shard_pipe_kind *out);

/* The schedule of `kind` for p ranks, m micro-batches and v model chunks per rank (v must be 1 unless
 * interleaved; interleaved needs m a multiple of p).  Free with shard_pipe_schedule_destroy. */
shard_status shard_pipe_schedule_create(shard_pipe_kind kind, int p, int m, int v, shard_pipe_schedule **out);
void shard_pipe_schedule_destroy(shard_pipe_schedule *s);

/* The equal-cost timeline: F costs f_cost slots, B b_cost; start[r][i]: the first slot of op i of rank r
 * (caller's arrays of count[r] + 1), *total_slots, peak_in_flight[r]: the most micro-batches rank r holds
 * at once (F done, B not yet).  Any output may be NULL.  Fails if the schedule deadlocks. */
shard_status shard_pipe_schedule_timeline(const shard_pipe_schedule *s, int f_cost, int b_cost, int **start,
                                          int *total_slots, int *peak_in_flight);
/* The idle fraction of that timeline, 1 - busy / (p * total); -1 when it has none (the textbook figure:
 * shard_cost_pipe_bubble, shard/cost.h). */
double shard_pipe_schedule_bubble(const shard_pipe_schedule *s, int f_cost, int b_cost);
/* One line per rank ("rank 0 |F0 F1 B0 ..|", '.' idle, one slot per op; chunks as F0a / F0b when v > 1). */
void shard_pipe_schedule_print(const shard_pipe_schedule *s, FILE *out);

#ifdef __cplusplus
}
#endif

#endif
