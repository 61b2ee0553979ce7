/* trainer.h — a training run on a device mesh: the model of a config
 * (model.h), its data, an optimizer (AdamW, or SGD; optim.h) with warm-up +
 * cosine learning rate and clipping by the global gradient norm, and the
 * parallel strategy of the mesh's `data` axis (plain data parallel, or
 * ZeRO-1/2/3 / FSDP, which shard whichever optimizer's state).
 *
 * Batch arithmetic: global batch = micro-batch x accumulation
 * steps x data size (data x expert with an expert axis).  Given two, the third is derived; an inconsistent triple
 * is refused with the numbers.  `batch` always means the global batch: each
 * micro-step's rows are split over the data ranks (the first ones taking one
 * more when uneven), rows are drawn by (seed, step, global row), and the loss
 * is the mean over the global batch's items — so the same settings train the
 * same model on 1 or N ranks. */
#ifndef SHARD_TRAINER_H
#define SHARD_TRAINER_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "shard/mesh.h"
#include "shard/model.h"
#include "shard/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_trainer_config {
    const char *config_path, *data_dir;
    size_t batch;              /* global rows per step (0: micro_batch x accum x data) */
    size_t micro_batch;        /* rows per rank per micro-step (0: derived) */
    size_t accum;              /* micro-steps per step (0: derived, else 1) */
    size_t seq;                /* tokens per row (the GPT) */
    uint64_t seed;             /* initialisation, data order and dropout */
    int zero;                  /* 0 (plain data parallel), 1, 2 or 3 */
    double bucket_mb;          /* gradient bucket size (MiB); <= 0: 25 */
    shard_dtype grad_dtype;    /* SHARD_F32, or SHARD_BF16 to halve gradient traffic */
    shard_dtype compute_dtype; /* SHARD_F32 (0), or SHARD_BF16: mixed precision, bf16 compute copies of
                                  f32 master values (the optimizer's state stays f32) */
    /* the optimizer: "adamw" (NULL) with `adamw`'s hyperparameters, or "sgd" with `sgd`'s (momentum 0:
     * plain SGD, which keeps no state); the other's fields are not read.  The learning rate is `lr`'s
     * schedule for either; another name is refused, listing the valid ones. */
    const char *optimizer;
    shard_adamw_config adamw;
    shard_sgd_config sgd;
    shard_lr_schedule lr;
    float clip;              /* max global gradient norm; 0: no clipping */
    int sequence_parallel;   /* with a tensor axis: LayerNorm / dropout / residual regions split over tokens */
    const char *param_specs; /* placement of parameters on the tensor axis, "NAME=SPEC;..." (model.h,
                                shard_model_create_placed); NULL: Megatron's layout */
    /* the pipe axis (a mesh with pipe > 1): the schedule ("gpipe" (NULL), "1f1b", "interleaved"), its
     * micro-batches (the accumulation count of the batch arithmetic; 0: accum), chunks per rank,
     * recomputation of each stage's forward in backward, and the layers per stage ("3,3,2"; NULL: even,
     * the remainder on the first stages) */
    const char *schedule;
    size_t micro_batches;
    int virtual_stages;
    int recompute;
    const char *layers_per_stage;
    /* rows of the global batch per data rank ("6,6,2,2": one count per rank of the rows' split, data x
     * expert, in rank order, summing to the batch; NULL: even).  Uneven shares suit devices of unequal
     * speed; the loss stays the mean over the global batch, so the math is one device's.  Each share is
     * split evenly over the micro-steps (at least one row each); --micro-batch does not combine with it. */
    const char *batch_shares;
} shard_trainer_config;

typedef struct shard_step_result {
    double loss, grad_norm; /* the global batch's mean loss; the gradient norm before clipping */
    float lr;
    double ms, exposed_comm_ms; /* the step; the part of it spent waiting on communication */
    uint64_t grad_bytes;        /* gradient bytes this rank handed to collectives */
    /* a model with routers (a mixture of experts; model.h's stats table), else zeros: the load-balancing
     * and z losses (loss is the task's alone; the step minimised loss + their coefficients' multiples),
     * the fraction of token-expert assignments dropped for capacity, and the assignments routed to each
     * expert over the global batch, [moe_layers x experts] (the trainer's, valid until its next step) */
    double aux_loss, z_loss, dropped_tokens;
    size_t moe_layers, experts;
    const double *expert_load;
} shard_step_result;

typedef struct shard_trainer shard_trainer;

/* Collective over the mesh: axes `data`, `expert`, `tensor` and `pipe` (others must have size 1).  The
 * model is the config's (config_path; model.h's registry builds the kind its model_type names), its rows
 * the kind's batch source's (data_dir): the trainer owns both.
 *
 * `expert` splits a mixture of experts' experts (a kind declaring expert_parallel; others are refused
 * an expert axis of more than one rank): the model is built with the axis's communicator and marks the
 * parameters it splits (model.h's expert_split).  An expert rank is also a data rank: the rows, and the
 * batch arithmetic's data size, follow data x expert; dense gradients are summed (ZeRO: sharded) over
 * data x expert, expert gradients over data alone; checkpoints hold every expert of an expert-split
 * parameter (a stack, model.h's stack table) as a tensor of its own by its global index
 * ("h.0.mlp.experts.3.c_fc.weight"), so any expert count resumes them. */
shard_status shard_trainer_create(shard_mesh *mesh, const shard_trainer_config *config, shard_trainer **out);

/* What shard_trainer_create would refuse in the config's batch arithmetic and pipeline flags for a mesh
 * of data_size data ranks (data x expert with an expert axis) and pipe_size stages, without a mesh, a
 * model or a communicator: for a program that checks its flags once before it starts ranks. */
shard_status shard_trainer_config_check(const shard_trainer_config *config, int data_size, int pipe_size);

/* A model the caller built, for shard_trainer_create_with_model.  Either form, not both:
 *
 *   model   this rank's model, built whole by the caller (as one builds a module, then wraps it for
 *           data parallel): each rank passes its own.  Only for meshes whose tensor, pipe and expert
 *           axes are 1 (data parallel and ZeRO); such an axis of more ranks is refused, since each of
 *           those ranks needs its own part of the model.  Build it for at least the micro-batch's rows
 *           (shard_trainer_batch's micro: the global batch over the data ranks, over the accumulation
 *           steps).  The trainer initialises its values from the run's seed like any model (load
 *           weights after with shard_trainer_load_weights), holds it while it lives, and does not
 *           destroy it: after shard_trainer_destroy the caller destroys it.  The strategy binds its
 *           values and gradients: under ZeRO-3 the whole values are released (read them with
 *           shard_trainer_values before the trainer goes), so a model serves one trainer.
 *   create  called on each rank where the trainer would build a config's model: for every mesh,
 *           tensor, pipe and expert axes included, with this rank's tensor and expert communicators and pipeline stage in
 *           the options (and once more, whole, on the world's rank 0 for --layers-per-stage balanced);
 *           the options carry the config's text when config_path is given (else NULL) and ctx.  The
 *           trainer owns and destroys what it returns.  stage_layers: the layers a pipe axis cuts into
 *           stages (0: refused on a pipe axis).
 *
 * The rows (batch.h), with either form: batch_source, a source the caller built for at least the
 * micro-batch's rows (the caller's: it outlives the trainer), or batch_source_create, called once per
 * rank with the options above and the model it will feed (the trainer destroys what it returns); with
 * neither, the batch source of the model's registered kind (shard_model_batch_source). */
typedef struct shard_model_factory {
    size_t struct_size; /* sizeof(shard_model_factory): lets the struct grow */
    shard_model *model;
    shard_model_create_fn create;
    void *ctx;
    size_t stage_layers;
    shard_batch_source *batch_source;
    shard_batch_source_fn batch_source_create;
} shard_model_factory;

/* shard_trainer_create for a model of the caller's (config->config_path may be NULL; the factory's
 * form decides what a NULL or given path means, above).  A registered kind (model.h) needs none of
 * this: shard_trainer_create builds it from a config naming it in model_type. */
shard_status shard_trainer_create_with_model(shard_mesh *mesh, const shard_trainer_config *config,
                                             const shard_model_factory *factory, shard_trainer **out);
void shard_trainer_destroy(shard_trainer *t);
shard_model *shard_trainer_model(shard_trainer *t);
/* The resolved batch arithmetic (data: the ranks the rows split over, data x expert with an expert axis). */
void shard_trainer_batch(const shard_trainer *t, size_t *global, size_t *micro, size_t *accum, size_t *data);
/* The pipe axis: the schedule printed as an ASCII timeline to out (nothing without a pipe axis). */
void shard_trainer_print_schedule(const shard_trainer *t, FILE *out);

/* What this pipe rank did in the last step: spans of compute ('F', 'B', 'r' recompute) and of waiting
 * ('f' for an activation, 'b' for a gradient, 't' for the tied parameter's gradient), in seconds from
 * begin_s (a monotonic clock shared by the ranks of one machine). */
typedef struct shard_trace_span {
    char what;
    int micro, chunk;
    double t0, t1;
} shard_trace_span;

typedef struct shard_pipeline_stats {
    int stage, stages, chunks; /* this pipe rank, the pipe size, chunks per rank */
    double begin_s, wall_s, compute_s;
    size_t held_peak, slots; /* micro-batches held at once in the step; activation slots made */
    size_t spans;
    const shard_trace_span *span;
} shard_pipeline_stats;
/* SHARD_ERR_INVALID_ARG without a pipe axis. */
shard_status shard_trainer_pipeline_stats(const shard_trainer *t, shard_pipeline_stats *out);

/* One optimizer step (steps count from 1). */
shard_status shard_trainer_step(shard_trainer *t, uint64_t step, shard_step_result *out);

/* A migration's figures (shard_trainer_migrate). */
typedef struct shard_migration_stats {
    size_t struct_size;   /* sizeof(shard_migration_stats): lets the struct grow */
    double ms;            /* the migration's wall time, the new trainer's creation included: the slowest rank's */
    uint64_t bytes;       /* the state's bytes every rank sent, summed (the communicator's count over the moves: what
                          * each new owner lacked, once; the layouts' descriptions are not in it) */
    uint64_t rank_bytes;  /* the part of them this rank sent */
    double pause_ms;      /* what training waited at the switchover (stop-and-copy: ms) */
    double added_ms;      /* what the migration added to steps in all, the pause included (stop-and-copy: ms) */
    uint64_t delta_bytes; /* live: the part of bytes that were the steps' gradients (0 for stop-and-copy) */
    double longest_ms;    /* the most the migration added to one step (stop-and-copy: ms) */
} shard_migration_stats;

/* Collective over the ranks of both meshes (the same ranks in the same order): the run moves to a new
 * layout at a step boundary, stop-and-copy.  A new trainer is made on new_mesh with new_config (the same
 * model and optimizer: shard_trainer_create's, so a trainer of a registered kind), every parameter's
 * values and every optimizer state array move to it over the communicator, and old is destroyed; *out
 * gets the new trainer, which goes on at the next step number (the learning rate's schedule, the rows
 * and the dropout masks follow the step, the seed and the global batch: give new_config the same ones
 * for the same run).  stats (NULL: none) gets the time and the bytes moved.  On failure on any rank
 * (an allocation refused, a model or optimizer that does not match), every rank returns the same error,
 * old is left as it was (the copy only reads it: the run can go on with it) and *out is NULL. */
shard_status shard_trainer_migrate(shard_trainer *old, shard_mesh *new_mesh, const shard_trainer_config *new_config,
                                   shard_trainer **out, shard_migration_stats *stats);

/* Live migration: the same move while training goes on, spread over `steps` steps of the old trainer
 * so that no step boundary waits long.  Collective over the ranks of both meshes, each call.  begin
 * makes the new trainer (as shard_trainer_migrate does); the old trainer then keeps a copy of each
 * update's gradient (memory: its gradient once more).  After each further step of old, advance does
 * the next part: the first plans the copy (as shard_trainer_migrate plans it); each later one sends,
 * for the parameters already sent, that step's gradient (by the same plan; as bf16 when every rank's
 * is bf16 exactly, as gradients reduced in bf16 are) and replays the update on the new trainer (same
 * step, learning rate and clip factor: the same element-wise arithmetic, so the copy stays bit for
 * bit), then the next of steps - 1 pieces of the state (parameters in order, about equal elements
 * each).  shard_migration_steps_left says how many advances remain before finish waits for nothing.
 * finish, at a step boundary, does whatever is left, destroys old and gives the new trainer (it goes on
 * at the next step number); stats as shard_trainer_migrate's, with pause_ms the switchover's wait,
 * added_ms begin's, the advances' and the switchover's, longest_ms the most of those at one step
 * boundary (the longest pause training sees), delta_bytes the gradients'.  On failure of any of them
 * on any rank every rank returns the same error, the migration is gone (the new trainer destroyed) and
 * old is as it was: the run goes on with it.  cancel abandons a migration without communication. */
typedef struct shard_migration shard_migration;
shard_status shard_trainer_migrate_begin(shard_trainer *old, shard_mesh *new_mesh,
                                         const shard_trainer_config *new_config, size_t steps, shard_migration **out);
shard_status shard_migration_advance(shard_migration *m, shard_trainer *old);
size_t shard_migration_steps_left(const shard_migration *m);
shard_status shard_migration_finish(shard_migration *m, shard_trainer *old, shard_trainer **out,
                                    shard_migration_stats *stats);
void shard_migration_cancel(shard_migration *m, shard_trainer *old);

/* The whole parameter values (params->total floats, the slab's layout) on every rank. */
shard_status shard_trainer_values(shard_trainer *t, float *whole);

/* Checkpoints: parameters by name plus each of the optimizer's state arrays as
 * "optimizer.<array>.<name>" (AdamW: "optimizer.exp_avg.<name>", "optimizer.exp_avg_sq.<name>"; SGD
 * with momentum: "optimizer.momentum_buffer.<name>"), whole, so any strategy and any number of ranks
 * can resume them.  config_json rides in the index, with the settings of shard_trainer_resume_differences
 * (the optimizer's name and hyperparameters among them). */
shard_status shard_trainer_save(shard_trainer *t, const char *dir, uint64_t step, const char *config_json);
/* Start from weights in a safetensors file (every parameter by name, at its whole shape: Hugging Face
 * GPT-2 names for the GPT), under any strategy: this rank's piece of each goes to the strategy's values
 * and compute copies; the optimizer's state is zero.  Call before the first step. */
shard_status shard_trainer_load_weights(shard_trainer *t, const char *path);
/* *step gets the checkpoint's step; training resumes at *step + 1.  A checkpoint trained with another
 * optimizer than this trainer's (its recorded settings say which; one without says AdamW) is refused:
 * its state arrays are not this optimizer's. */
shard_status shard_trainer_resume(shard_trainer *t, const char *where, uint64_t *step);
/* Where this trainer's settings that shape the numbers (seed, batch, seq, learning-rate schedule, the
 * optimizer and its hyperparameters, clip, dtypes) differ from those the checkpoint recorded: "lr 0.001 (the checkpoint's: 0.003); ..."
 * into out, "" when they agree (or the checkpoint predates the record).  Each save records them.
 * `where` as given to shard_trainer_resume, `step` the step it resumed. */
shard_status shard_trainer_resume_differences(shard_trainer *t, const char *where, uint64_t step, char *out,
                                              size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
