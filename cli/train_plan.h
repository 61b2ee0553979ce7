/* train_plan.h — `shard train --plan plan.json`: the layout a plan file (`shard plan --out`) names, read
 * with the parser of train's own layout flags; the command line's layout flags held to it; and at the
 * end of the run the plan's predictions against what the run measured. */
#ifndef SHARD_CLI_TRAIN_PLAN_H
#define SHARD_CLI_TRAIN_PLAN_H

#include <stddef.h>

#include "cli_util.h"
#include "shard/shard.h"
#include "train_util.h"

typedef struct train_plan {
    const char *path;
    void *root;                      /* the parsed file (json_t): holds the texts the layout points into */
    cli_layout layout;               /* mesh, flags, layers_per_stage and batch_shares as layout flags */
    int ranks;                       /* the mesh's product */
    char device_map[1024];           /* "" when the plan has none */
    char layers[1024], shares[1024]; /* layers_per_stage and batch_shares given as lists, as flag values */
    double step_ms;                  /* predicted.step_ms (0: not given) */
    double *peak_bytes;              /* predicted.peak_bytes: one (the fullest rank) or one per rank */
    size_t peaks;
} train_plan;

/* Read the plan file at path into *p (which must stay where it is while the layout is used): 0, or -1
 * with one line printed naming the key and what it should hold. */
int train_plan_load(const char *path, train_plan *p);

/* The plan's layout taken into the command line's: a layout flag given on the command line must agree
 * with the plan; --ranks must be the mesh's size; --device-map must agree with the plan's, which is
 * used under --cluster when none is given.  0, or -1 with the line printed. */
int train_plan_apply(train_plan *p, cli_layout *l, cli_common *common);

/* Rank 0, at the end of the run: the plan's predicted step against the median of the measured ones
 * (step_ms[0..steps-1], the first step left out when there are more), and its predicted peak bytes
 * against the measured ones (peak_bytes[rank], each rank's peak total). */
void train_plan_report(const train_plan *p, const shard_mesh *mesh, const double *step_ms, size_t steps,
                       const double *peak_bytes, int world);

void train_plan_free(train_plan *p);

#endif
