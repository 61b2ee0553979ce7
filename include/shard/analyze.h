/* analyze.h — what a layout costs, per rank, before it runs.
 *
 * shard_analyze builds each rank of a layout the way shard_trainer_create does and runs two training
 * steps through the engine's own code path, on nothing: a dry run (the second step's work and traffic
 * are a steady step's: the first may differ, as ZeRO-3's first gathers every unit).  The rank's communicators are plan
 * communicators (one rank of a world whose others are not there: every collective and message
 * completes at once and is counted with the bytes the real run sends), its allocator is in plan mode
 * (every block charged to its category as in a real run, the pages mapped only when written), its
 * GEMMs are counted and not computed, and its batch is rows of zeros.  So the figures are the engine's
 * own, not a formula's:
 *   memory      each category's peak over the build and the steps (the accounted allocator's ledger);
 *   flops       the GEMMs' 2 x M x N x K by phase (forward, backward, recompute; other: anything
 *               outside a model's forward and backward);
 *   collectives each communicator's calls and bytes sent by kind (the bandwidth-optimal count of
 *               shard_comm_bytes_sent; "send" for a pipeline's point-to-point), keyed by its mesh axes
 *               ("data", "tensor", "pipe", "expert", "data,expert"; "world" for the whole mesh).
 * A mixture of experts routes the dry run's tokens over the experts in turn (src/nn/moe.c: a balanced
 * router's load, every other rank of the expert axis taken to send this rank's experts what this rank
 * sends them), so its expert traffic and expert activations are a balanced routing's, not those of real
 * data (whose imbalance the trainer's expert load shows).  Beside them each rank has their bound, what
 * the layers send and hold when routing fills every expert to its capacity: per row (sequence) and
 * expert at most cap = ceil(capacity factor x T x top_k / experts) assignments (shard_moe_capacity)
 * and never more than T, so at most min(|S| x min(cap, T), T x min(top_k, |S|)) into a set S of experts.
 * The bound takes this rank's tokens all sent to the experts held elsewhere, and every other rank's all
 * sent here; without a capacity (factor 0, nothing dropped) that is every token routed to one rank's
 * experts (src/plan/expert_bound.h).  It is the bound a run's bytes stay within whatever the data, as
 * shard_analysis_measure compares against a `shard train --log`.
 *
 * Ranks that differ only in their data coordinate hold the same pieces but for ZeRO's uneven shards (a
 * few elements): beyond `exact_ranks` ranks only data coordinates 0 and the last are built, the others
 * copy coordinate 0's figures (built counts the ranks built).
 *
 * The pipeline's bubble is the schedule's idle fraction with each op costing its stage's counted FLOPs
 * (backward and recompute against forward); the critical path is the rank with the most FLOPs in a
 * step and its largest phase. */
#ifndef SHARD_ANALYZE_H
#define SHARD_ANALYZE_H

#include <stddef.h>
#include <stdint.h>

#include "shard/memory.h"
#include "shard/mesh.h"
#include "shard/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_analyze_collective {
    char axis[64], op[32];
    uint64_t bytes, count;
    /* the calls' alpha-beta terms: time = alphas x alpha + wire_bytes / beta over the group's slowest link
     * (the emulated cluster's formulas, src/comm/emulate.h) */
    double alphas, wire_bytes;
    double largest_alphas, largest_wire_bytes; /* the terms of its largest burst: calls issued back to back
                                                  with no compute between them, which wait together (one
                                                  call alone is a burst; 0: not known) */
    double small_alphas, small_wire_bytes;     /* of its calls of at most 4 KiB (synchronisations: never hidden) */
} shard_analyze_collective;

/* A GEMM shape of the step and how many times it ran (the analyzer's histogram, for the cost model). */
typedef struct shard_gemm_shape {
    size_t m, n, k;
    uint64_t count;
} shard_gemm_shape;

typedef struct shard_rank_analysis {
    int rank;
    char coords[160];               /* "data=0,tensor=1" */
    int coord[SHARD_MESH_MAX_AXES]; /* the same, by axis (the analysis's axis order) */
    uint64_t params;                /* parameter elements the rank's model holds (its tensor, pipe and expert piece) */
    uint64_t memory_bytes[SHARD_MEM_CATEGORY_COUNT];
    uint64_t memory_total_bytes; /* the peak of the sum */
    double flops_forward, flops_backward, flops_recompute, flops_other;
    int backward_ops; /* backward passes in a step (micro-steps, or a pipeline's B ops) */
    int pipelined;    /* a pipeline stage: its gradients are reduced over `data` after its last B op,
                         else during the last micro-step's backward */
    size_t collectives;
    shard_analyze_collective *collective;
    size_t gemm_shapes; /* the step's GEMMs by (M, N, K) */
    shard_gemm_shape *gemm_shape;
    double gemm_unshaped_flops; /* GEMM FLOPs the histogram missed (no room, or run by another thread) */
    /* a mixture of experts' routing-dependent figures (0 without one): the bytes a step sends over `expert`
     * in the token exchange's all_to_allv calls (dispatch, combine, counts), and the bytes of the experts'
     * activation rows (the six buffers of rows each layer context holds: inputs, outputs and their
     * gradients, hidden units, GELU slope and their gradient), each in the dry run's balanced routing and
     * at capacity (the bound) */
    uint64_t expert_bytes, expert_bytes_bound;
    uint64_t expert_activation_bytes, expert_activation_bytes_bound;
    double expert_bytes_measured; /* a run's median expert bytes per step (shard_analysis_measure); -1: none */
    /* the run's expert activation bytes: the balanced figure plus what its median activation peak differs
     * from the dry run's (shard_analysis_measure); -1: none */
    double expert_activation_bytes_measured;
} shard_rank_analysis;

typedef struct shard_analysis {
    char layout[256]; /* the mesh and the flags that shape the step */
    int world;
    int axes; /* the mesh's axes, in its order */
    char axis_name[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int axis_size[SHARD_MESH_MAX_AXES];
    size_t ranks; /* = world */
    shard_rank_analysis *rank;
    int built;         /* ranks built (the others copied) */
    double bubble;     /* the pipeline's idle fraction (0 without a pipe axis) */
    int critical_rank; /* the rank with the most FLOPs */
    char critical_phase[16];
    /* what the cost model needs besides the ranks' figures */
    char mesh[128];        /* the mesh text, e.g. "data=2,tensor=2" */
    int zero;              /* the ZeRO stage */
    char optimizer[16];    /* "adamw" or "sgd" */
    uint64_t tokens;       /* tokens of one step over the whole mesh (global batch x seq) */
    size_t measured_steps; /* the steps of the log shard_analysis_measure read (0: none) */
} shard_analysis;

typedef struct shard_analyze_options {
    size_t struct_size; /* sizeof(shard_analyze_options) */
    const shard_trainer_config *train;
    const char *mesh; /* "data=2,tensor=2"; NULL: data=world */
    int world;        /* ranks; 0: the mesh's product */
    int exact_ranks;  /* build every rank up to this many (0: 64) */
} shard_analyze_options;

shard_status shard_analyze(const shard_analyze_options *o, shard_analysis **out);
void shard_analysis_destroy(shard_analysis *a);

/* Each rank's measured expert bytes from a `shard train --log` file of the same layout: the median over
 * the log's steps of the bytes its all_to_all(v) calls sent on `expert` (the lines' `ranks` list,
 * `all_to_all_bytes`), and its expert activation bytes derived from the lines' activation peaks.  A file that is not such a log, or one of another world, is refused in one line
 * naming the file and line. */
shard_status shard_analysis_measure(shard_analysis *a, const char *log_path);

/* Bytes rank `rank` sends on `axis` (every kind summed; NULL axis: every axis). */
uint64_t shard_rank_analysis_axis_bytes(const shard_rank_analysis *r, const char *axis);

#ifdef __cplusplus
}
#endif
#endif
