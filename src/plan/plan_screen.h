/* plan_screen.h — the planner's screen: a GPT layout's per-rank figures from closed forms, in the shape
 * of the dry run's analysis (analyze.h), so that the cost model prices it as it prices a dry run.
 *
 * A dry run builds every distinct rank of a layout and runs its steps: exact, and seconds per layout
 * for a deep model on hundreds of ranks.  The screen computes the same categories from the model's
 * sizes in microseconds — parameters held per rank (Megatron's split of each block over `tensor`, the
 * vocabulary split, the blocks of each pipeline stage), model-state bytes by ZeRO stage, activation bytes
 * by stage and in-flight micro-batches (cost.h), GEMM FLOPs by phase, and each axis's collectives with
 * their alpha-beta terms — so that a search over every layout of a large cluster can rank them all and
 * then check the best few by dry run.  Its figures are estimates (within tens of per cent of the dry
 * run's): the planner never emits a figure the dry run has not checked. */
#ifndef SHARD_PLAN_SCREEN_H
#define SHARD_PLAN_SCREEN_H

#include "shard/analyze.h"
#include "shard/gpt.h"

/* The screened analysis of layout `mesh` (data, tensor and pipe axes; no expert axis) for trainer
 * config tc (its ZeRO stage, schedule and micro-batches, recomputation, sequence parallel, layers per
 * stage and batch shares).  Free with shard_analysis_destroy. */
shard_status shard__plan_screen(const shard_gpt_config *g, const shard_trainer_config *tc, const char *mesh,
                                shard_analysis **out);

#endif
