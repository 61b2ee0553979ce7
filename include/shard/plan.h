/* plan.h — choosing a layout for a cluster: candidate layouts (data, tensor, pipe and expert degrees,
 * ZeRO stage, pipeline schedule, virtual stages and micro-batches, accumulation, recomputation,
 * sequence parallel, gradient dtype) each analyzed by the engine's dry run (analyze.h) and priced by
 * the cost model on the cluster (cost_model.h: its devices' rates and links, with a machine profile for
 * the host's part when given), those whose peak memory exceeds a device's (times the allowed fraction)
 * or that break a budget (latency, communication, compute) cut, the rest ranked by the goal.
 *
 * On a cluster whose devices differ, each layout is also tried with uneven splits: batch shares per data
 * rank in proportion to the speed of its slowest device, and layers per pipeline stage cut so that the
 * slowest stage's predicted time is least (compute-aware: the stage's device rate; memory-aware: no
 * stage past its devices' memory), each again analyzed and priced like any other candidate.
 *
 * For throughput the winner's layout is also priced at 2, 4 and 8 times the global batch (batch shares
 * scaled alike) while it fits: a larger batch that predicts at least 5 % more tokens per second is
 * reported, and chosen with grow_batch (its candidate's `batch` set).
 *
 * Goals: "throughput" (tokens per second at the given batch), "latency" (time per step: the same
 * order at a fixed batch), "memory" (the least peak bytes on the fullest device), "balance" (the least
 * imbalance of the ranks' predicted step times, shard_imbalance).  Every candidate is kept with why it
 * was cut (memory: which rank, node and bytes; a budget and its figure; or the trainer's refusal of the
 * layout).  The search prices every layout with the ranks on the devices in order (or the cluster's
 * device map); shard_plan_place then places the leading ones (placement.h). */
#ifndef SHARD_PLAN_H
#define SHARD_PLAN_H

#include <stddef.h>

#include "shard/cluster.h"
#include "shard/cost_model.h"
#include "shard/placement.h"
#include "shard/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why a candidate was cut (SHARD_PLAN_FITS: it was not). */
typedef enum shard_plan_cut {
    SHARD_PLAN_FITS = 0,
    SHARD_PLAN_CUT_REFUSED, /* the trainer refuses the layout */
    SHARD_PLAN_CUT_MEMORY,  /* a rank's peak past its device's memory x the fraction */
    SHARD_PLAN_CUT_LATENCY, /* a longer step than the latency budget */
    SHARD_PLAN_CUT_COMM,    /* more exposed communication than the communication budget */
    SHARD_PLAN_CUT_COMPUTE  /* a compute imbalance over the ranks past the compute budget */
} shard_plan_cut;

typedef struct shard_plan_candidate {
    char mesh[96];
    int zero, recompute, sequence_parallel;
    char schedule[16]; /* "" without a pipe axis */
    size_t micro_batches;
    int virtual_stages;        /* model chunks per pipe rank (the interleaved schedule; 0 otherwise) */
    size_t accum;              /* micro-steps per step without a pipe axis (0: one) */
    char grad_dtype[8];        /* the gradients' communication dtype: "" (f32) or "bf16" */
    char layers_per_stage[96]; /* "3,1" for an uneven cut of the layers over pipe stages; "" even */
    char batch_shares[160];    /* "6,2": rows per data rank in proportion to their devices' speed; "" even */
    size_t batch;              /* the global batch it runs (0: the request's) */
    int valid;                 /* the trainer accepts the layout */
    int fits;                  /* every rank's peak within its device's memory x the fraction */
    double step_ms, tokens_per_s;
    double peak_bytes; /* the fullest rank's peak total */
    double imbalance;  /* of the ranks' predicted step times */
    double bubble;
    double comm_fraction;     /* the most any rank's exposed communication takes of the step */
    double compute_imbalance; /* of the ranks' predicted compute times (shard_imbalance) */
    int screened;             /* its figures are the screen's estimates, not yet checked by a dry run */
    int variant;              /* a variant of a leading layout (another schedule, accumulation, dtype) */
    shard_plan_cut cut;       /* why it was cut */
    char why[256];            /* why it was cut, in words ("" when it fits) */
} shard_plan_candidate;

typedef struct shard_plan_options {
    size_t struct_size;                   /* sizeof(shard_plan_options) */
    const shard_trainer_config *train;    /* the model config, batch and seq; its layout fields are the search's */
    const shard_cluster *cluster;         /* the devices and links (required) */
    const shard_machine_profile *profile; /* the host's part (NULL: the cluster's rates alone) */
    const char *goal;                     /* "throughput" (NULL), "latency", "memory" or "balance" */
    double max_memory_fraction;           /* of each device's memory a rank may use (0: 0.9) */
    const char *search;                   /* "exhaustive" (every layout by dry run), "screen" (every layout by
                                             closed forms, the best `verify` by dry run); NULL: the screen for a
                                             dense GPT on more than 16 devices or of more than 24 blocks */
    int verify;                           /* with the screen: fitting layouts checked by dry run (0: 3; negative:
                                             none, every figure the screen's estimate) */
    double latency_budget_ms;             /* layouts predicting a longer step are cut (0: no budget) */
    int grow_batch;                       /* goal throughput: the winner runs the larger global batch found */
    /* the gradients' communication dtypes searched, "f32" (NULL), "bf16" or "f32,bf16": bf16 halves the
     * data axis's traffic but rounds the gradients it sums, so it is searched only when asked */
    const char *grad_dtypes;
    double max_comm_fraction;     /* the communication budget: layouts whose ranks' exposed communication
                                     takes more of the step are cut (0: no budget) */
    double max_compute_imbalance; /* the compute budget: layouts whose ranks' predicted compute times are
                                     more imbalanced (max / mean - 1) are cut (0: no budget) */
    int refine;                   /* meshes whose best layout's variants are tried (0: 8; negative: none) */
    int place_top;                /* shard_plan_place: fitting layouts placed, the best placed one the
                                     winner (0: 1, the winner alone) */
} shard_plan_options;

/* The winner's placement by one solver (placement.h). */
typedef struct shard_plan_placement {
    char method[16];    /* "hungarian", "anneal" or "genetic" */
    double step_ms;     /* the winner's predicted step with this device map */
    double over_bytes;  /* by which its ranks' peaks exceed their devices' usable memory (0: it fits) */
    double seconds;     /* to solve */
    size_t *device_map; /* world entries: rank i on device device_map[i] */
} shard_plan_placement;

#define SHARD_PLAN_PLACEMENTS 3

typedef struct shard_plan_result {
    size_t count;                    /* candidates tried */
    shard_plan_candidate *candidate; /* the fitting ones first, best first by the goal; then the cut ones */
    size_t fitting;
    int world;
    double search_seconds; /* pricing every layout (by dry run, or by the screen) */
    double verify_seconds; /* the screen's best checked by dry run */
    int screened;          /* the search priced by the screen (placement then uses the screen's figures) */
    /* goal throughput: the winner's layout at 2, 4 and 8 times the batch, the best that fits and predicts
     * at least 5 % more tokens per second (larger.batch 0: none); with grow_batch the winner is it */
    shard_plan_candidate larger;
    size_t requested_batch;
    /* set by shard_plan_place */
    size_t placements; /* solved (0: not placed, or more devices than the solvers take) */
    shard_plan_placement placement[SHARD_PLAN_PLACEMENTS];
    char placed_by[16];       /* whose device map the winner uses: a method, "given" (the cluster's own map
                                kept) or "" (the search's: no solver predicts a shorter step) */
    size_t *device_map;       /* the winner's, world entries (NULL before shard_plan_place) */
    double unplaced_step_ms;  /* the winner's predicted step before placement */
    size_t candidates_placed; /* the leading fitting layouts placed (options' place_top) */
    size_t placed_rank;       /* the winner's place in the search's order before placement (0: first) */
    char placement_note[256]; /* what the placement changed, for the explanation ("" when nothing) */
} shard_plan_result;

shard_status shard_plan_search(const shard_plan_options *o, shard_plan_result **out);
void shard_plan_result_destroy(shard_plan_result *r);

/* The candidate's layout in words: "data=2,pipe=2 zero=1 schedule=1f1b micro-batches=4 batch-shares=6,2". */
void shard_plan_candidate_text(const shard_plan_candidate *c, char *out, size_t bytes);
/* Set tc's layout fields (ZeRO, schedule, micro-batches, recomputation, sequence parallel, layers per
 * stage, batch shares) to the candidate's; the strings point into c.  The mesh is c->mesh. */
void shard_plan_candidate_apply(const shard_plan_candidate *c, shard_trainer_config *tc);
/* The most devices the placement solvers take (the linear part is n x n, the Hungarian solver O(n^3)). */
#define SHARD_PLAN_PLACEMENT_MOST_DEVICES 1024

/* Place the leading fitting layouts (the options' place_top, at most 1 on a cluster of more than 64
 * devices) on the cluster's devices: each layout analyzed again and its device map solved by each of
 * hungarian, anneal and genetic (placement.h; the two searches from the Hungarian answer, seed 1, the
 * default budget), each priced by the cost model.  A layout uses `method`'s map ("anneal" when NULL)
 * when it predicts a shorter step than the map the search priced (the cluster's, or in order), and its
 * figures are priced again with it; with keep_map the cluster's device map (the caller's) is kept
 * instead and reported as "given".  The best placed layout by the goal becomes r->candidate[0] (the
 * others move down one), and the result keeps its solvers' maps.  Refuses a method it does not know;
 * a second call places afresh. */
shard_status shard_plan_place(const shard_plan_options *o, shard_plan_result *r, const char *method, int keep_map);

/* One paragraph on the winner: its layout and predicted figures, against the runner-up, and what cut
 * the others (the count and one example of each reason). */
void shard_plan_explain(const shard_plan_result *r, const char *goal, char *out, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
