/* trainer.c — the path of a training step (trainer.h):
 *
 *   for each micro-step k: load this rank's rows of micro-batch k from the
 *     batch source (the trainer's, made next to the model) and hand them to
 *     the model, forward
 *     (the loss divided by the global item count), backward — the strategy's
 *     hooks start gradient communication as units finish;
 *   the strategy waits for the gradients and gives the global norm;
 *   clip, the optimizer (optim.h: AdamW or SGD) on what this rank owns,
 *   values made whole again.
 *
 * The strategy of the `data` axis lives in src/parallel/data_parallel.c; with
 * a `pipe` axis the micro-batches run as src/parallel/pipeline.c's schedule
 * instead of one after the other.  An `expert` axis splits a mixture of
 * experts' experts (the model's, through expert.h): an expert rank is also a
 * data rank, so rows follow data x expert, dense gradients are summed over
 * data x expert and expert gradients over data (src/parallel/expert_parallel.c
 * holds the whole tensors' layout). */
#include "shard/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt/ckpt_index.h"
#include "ckpt/ckpt_util.h"
#include "comm/comm_impl.h"
#include "comm/emulate.h"
#include "core/flops.h"
#include "core/monitor_impl.h"
#include "data/batch_impl.h"
#include "train/trainer_impl.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline.h"
#include "shard/blas.h"
#include "shard/checkpoint.h"
#include "shard/dtensor.h"
#include "shard/launch.h"
#include "shard/memory.h"
#include "shard/monitor.h"
#include "shard/split.h"
#include "shard/text.h"

struct shard_trainer {
    shard_trainer_config c;
    shard_mesh *mesh;
    shard_comm *data, *tensor;     /* tensor: NULL without that axis */
    shard_comm *own_data;          /* made when the mesh has no data axis */
    shard_comm *expert;            /* the expert axis; NULL without one of more than one rank */
    shard_comm *rows;              /* what the rows are split over: data, or data x expert with an expert axis */
    shard__expert_layout *experts; /* the expert parameters' whole tensors; NULL: every tensor whole here */
    int data_rank, data_size;      /* in `rows`: the batch arithmetic's data ranks */
    size_t global, micro, accum;
    size_t *shares; /* --batch-shares: rows per data rank (NULL: even) */
    shard_model *model;
    /* shard_trainer_create_with_model's factory (struct_size 0: the config's model); a model the caller
     * built is theirs: the trainer gives its bindings back and does not destroy it */
    shard_model_factory factory;
    int owns_model;
    /* where the rows come from: the factory's (the caller's, kept) or one the trainer made (destroyed) */
    shard_batch_source *source;
    int owns_source;
    int planned; /* the analyzer's dry build: no initialisation, rows of zeros (src/plan/analyze.c) */
    int to_fill; /* a migration's target: no initialisation, every value about to be written (migrate.c) */
    shard_batch batch;
    shard_optimizer *opt;
    shard_dp *dp;
    /* the pipe axis (pipe NULL without one of size > 1) */
    shard_comm *pipe;
    shard_pipe_schedule *sched;
    shard_pp *pp;
    shard_model_stage stage;
    char partition[512]; /* how the layers were cut (printed with the schedule) */
    uint64_t step_now;
    double *routed;  /* a model with routers: aux, z, assigned, dropped, then the load table, summed over data */
    shard__mon *mon; /* each step's measurements (monitor.h), made by the first step */
};

/* The batch arithmetic: the global batch B, the accumulation count K and the rows per micro-step a
 * rank holds at most, from what the config gives and the data axis's D ranks. */
/* --batch-shares into shares[D] (NULL: only checked); *sum their total. */
static shard_status parse_shares(const char *text, size_t D, size_t *shares, size_t *sum) {
    *sum = 0;
    size_t n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || *p == '-' || *p == '+' || errno || v == 0 || v > (1u << 30) || (*end && *end != ','))
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "--batch-shares '%s': give positive row counts separated by commas, one per data "
                               "rank (%zu here), e.g. 6,2",
                               text, D);
        if (n < D && shares) shares[n] = (size_t)v;
        n++, *sum += (size_t)v;
        p = *end ? end + 1 : end;
    }
    if (n != D)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--batch-shares '%s' has %zu counts for %zu data ranks (the rows' split, data x expert): "
                           "give one per rank",
                           text, n, D);
    return SHARD_OK;
}

static shard_status batch_layout(const shard_trainer_config *c, size_t D, size_t *global, size_t *accum, size_t *micro,
                                 size_t *shares) {
    if (c->batch_shares) { /* each data rank's rows, each split evenly over the micro-steps */
        size_t sum, K = c->micro_batches ? c->micro_batches : c->accum ? c->accum : 1, most = 0;
        size_t *mine = shares ? shares : calloc(D ? D : 1, sizeof *mine);
        if (!mine) return shard_error(SHARD_ERR_NO_MEMORY, "batch: out of memory");
        shard_status s = parse_shares(c->batch_shares, D, mine, &sum);
        if (s == SHARD_OK && c->micro_batch)
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "batch: --batch-shares sets each data rank's rows, --micro-batch %zu every rank's: give "
                            "one of them (with --accum for the micro-steps)",
                            c->micro_batch);
        if (s == SHARD_OK && c->micro_batches && c->accum && c->accum != c->micro_batches)
            s = shard_error(SHARD_ERR_INVALID_ARG, "batch: --micro-batches %zu and --accum %zu disagree: give one",
                            c->micro_batches, c->accum);
        if (s == SHARD_OK && c->batch && c->batch != sum)
            s = shard_error(SHARD_ERR_INVALID_ARG, "batch: --batch-shares %s add up to %zu rows, not --batch %zu",
                            c->batch_shares, sum, c->batch);
        for (size_t r = 0; s == SHARD_OK && r < D; r++) {
            if (mine[r] < K)
                s = shard_error(SHARD_ERR_INVALID_ARG,
                                "batch: --batch-shares gives data rank %zu %zu rows for %zu micro-steps: every rank "
                                "needs at least one row per micro-step",
                                r, mine[r], K);
            size_t rows = (mine[r] + K - 1) / K;
            most = rows > most ? rows : most;
        }
        if (!shares) free(mine);
        SHARD_CHECK(s);
        *global = sum, *accum = K, *micro = most;
        return SHARD_OK;
    }
    size_t B = c->batch, m = c->micro_batch, K = c->accum;
    if (c->micro_batches && K && K != c->micro_batches)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "batch: --micro-batches %zu and --accum %zu disagree (a pipeline's micro-batches "
                           "are its accumulation steps): give one",
                           c->micro_batches, K);
    if (c->micro_batches) K = c->micro_batches;
    if (B && m && K) {
        if (m * K * D != B)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "batch: --batch %zu != --micro-batch %zu x --accum %zu x data %zu = %zu; "
                               "give two of them and the third is derived",
                               B, m, K, D, m * K * D);
    } else if (B && m) {
        if (B % (m * D))
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "batch: --batch %zu is not --micro-batch %zu x data %zu = %zu times an "
                               "accumulation count; give --accum instead",
                               B, m, D, m * D);
        K = B / (m * D);
    } else if (m && K) {
        B = m * K * D;
    } else if (B) {
        if (!K) K = 1;
        m = (B / K + D - 1) / D;
        if (B % K == 0 && (B / K) % D == 0) m = B / K / D;
    } else {
        return shard_error(SHARD_ERR_INVALID_ARG, "batch: give the global --batch, or --micro-batch with --accum");
    }
    if (B < K * D)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "batch: --batch %zu is smaller than --accum %zu x data %zu: every rank needs "
                           "at least one row per micro-step",
                           B, K, D);
    /* the largest slice any rank gets */
    size_t first, rows_max = 0;
    for (size_t k = 0; k < K; k++) {
        size_t mf, mc, rc;
        shard_split_even(B, K, k, &mf, &mc);
        shard_split_even(mc, D, 0, &first, &rc);
        rows_max = rc > rows_max ? rc : rows_max;
    }
    *global = B, *accum = K, *micro = m > rows_max ? m : rows_max;
    return SHARD_OK;
}

/* The pipeline's schedule for p stages and the config's flags (the caller destroys it). */
static shard_status pipe_schedule(const shard_trainer_config *c, int p, size_t accum, shard_pipe_schedule **out) {
    int v = c->virtual_stages > 0 ? c->virtual_stages : 1;
    shard_pipe_kind kind = SHARD_PIPE_GPIPE;
    if (c->schedule) SHARD_CHECK(shard__pipe_kind_parse(c->schedule, &kind));
    if (v > SHARD_MAX_STAGE_CHUNKS)
        return shard_error(SHARD_ERR_INVALID_ARG, "--virtual-stages %d: at most %d chunks per rank", v,
                           SHARD_MAX_STAGE_CHUNKS);
    if (accum > 1u << 20)
        return shard_error(SHARD_ERR_INVALID_ARG, "--micro-batches %zu: at most %u per step", accum, 1u << 20);
    return shard__pipe_schedule_create(kind, p, (int)accum, v, out);
}

shard_status shard_trainer_config_check(const shard_trainer_config *config, int data_size, int pipe_size) {
    if (!config || data_size < 1 || pipe_size < 1)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_config_check: no config, or an axis of no ranks");
    size_t global, accum, micro;
    SHARD_CHECK(batch_layout(config, (size_t)data_size, &global, &accum, &micro, NULL));
    if (pipe_size < 2) return SHARD_OK;
    shard_pipe_schedule *sched = NULL;
    SHARD_CHECK(pipe_schedule(config, pipe_size, accum, &sched));
    shard__pipe_schedule_destroy(sched);
    return SHARD_OK;
}

/* The create options of this trainer's models and batch sources (tensor and stage NULL: the whole model);
 * *text: the config's text when it has a path, for the caller to free. */
static shard_status create_options(const shard_trainer *t, shard_comm *tensor, shard_comm *expert,
                                   const shard_model_stage *stage, shard_model_create_options *o, char **text) {
    const shard_trainer_config *c = &t->c;
    *text = NULL;
    if (c->config_path) SHARD_CHECK(shard_model_config_read(c->config_path, text));
    *o = (shard_model_create_options){.struct_size = sizeof *o,
                                      .config_text = *text,
                                      .config_path = c->config_path,
                                      .data_dir = c->data_dir,
                                      .max_rows = t->micro,
                                      .seq = c->seq,
                                      .tensor = tensor,
                                      .sequence_parallel = c->sequence_parallel,
                                      .specs = c->param_specs,
                                      .stage = stage,
                                      .ctx = t->factory.ctx,
                                      .expert = expert};
    return SHARD_OK;
}

/* A model of this trainer's kind for this rank: the caller's (whole), the factory's create, or the
 * config's model (the registry's kind).  tensor, expert and stage NULL: the whole model. */
static shard_status make_model(const shard_trainer *t, shard_comm *tensor, shard_comm *expert,
                               const shard_model_stage *stage, shard_model **out) {
    const shard_trainer_config *c = &t->c;
    *out = NULL;
    if (t->factory.model) {
        *out = t->factory.model;
        return SHARD_OK;
    }
    if (!t->factory.create && !expert)
        return shard_model_create_stage(c->config_path, c->data_dir, t->micro, c->seq, tensor, c->sequence_parallel,
                                        c->param_specs, stage, out);
    char *text;
    shard_model_create_options o;
    SHARD_CHECK(create_options(t, tensor, expert, stage, &o, &text));
    shard_status s = t->factory.create ? t->factory.create(&o, out) : shard_model_create_with(&o, out);
    free(text);
    if (s == SHARD_OK && (!*out || !(*out)->ops))
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "shard_trainer_create_with_model: the factory's create returned no model "
                        "(it must set *out to a model with its table)");
    if (s == SHARD_OK) s = shard_model_check_tables(*out);
    if (s < 0 && *out) shard_model_destroy(*out), *out = NULL;
    return s;
}

/* The batch source for models like m, made once: the factory's, its create function's, or m's kind's. */
static shard_status make_source(shard_trainer *t, const shard_model *m) {
    if (t->source) return SHARD_OK;
    if (t->planned) { /* the model's own rows where it can read them (its data, or rows it makes), else
                         * rows of zeros laid out as it takes them */
        char *text;
        shard_model_create_options o;
        SHARD_CHECK(create_options(t, NULL, NULL, NULL, &o, &text));
        shard_status own = shard_model_batch_source(&o, m, &t->source);
        free(text);
        if (own == SHARD_OK && t->source) {
            t->owns_source = 1;
            return SHARD_OK;
        }
        t->source = NULL;
        shard_clear_error();
        shard_batch shape;
        if (!shard_model_batch_shape(m, &shape))
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "model '%s' does not describe its batch rows (its table's batch_shape): it cannot "
                               "be analyzed without data",
                               m->ops->kind);
        t->owns_source = 1;
        return shard__batch_source_zeros(&shape, t->micro, &t->source);
    }
    if (!m->ops->set_batch || !m->ops->batch_items)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its table lacks %s: the trainer hands each micro-batch "
                           "to the model and counts its items",
                           m->ops->kind, !m->ops->set_batch ? "set_batch" : "batch_items");
    if (t->factory.batch_source) {
        t->source = t->factory.batch_source;
        if (t->source->max_rows < t->micro)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "shard_trainer_create_with_model: the factory's batch source holds "
                               "up to %zu rows and a micro-batch is %zu: build it for at least %zu",
                               t->source->max_rows, t->micro, t->micro);
        return SHARD_OK;
    }
    char *text;
    shard_model_create_options o;
    SHARD_CHECK(create_options(t, NULL, NULL, NULL, &o, &text));
    shard_status s = t->factory.batch_source_create ? t->factory.batch_source_create(&o, m, &t->source)
                                                    : shard_model_batch_source(&o, m, &t->source);
    free(text);
    if (s == SHARD_OK && (!t->source || !t->source->ops || !t->source->ops->load || !t->source->ops->destroy))
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "shard_trainer_create_with_model: the factory's batch_source_create "
                        "returned no source with load and destroy");
    if (s == SHARD_OK && t->source->max_rows < t->micro)
        s = shard_error(SHARD_ERR_INVALID_ARG, "batch source '%s': made for up to %zu rows; a micro-batch is %zu",
                        t->source->ops->kind ? t->source->ops->kind : "(unnamed)", t->source->max_rows, t->micro);
    if (s == SHARD_OK)
        t->owns_source = 1;
    else if (t->source && t->source->ops && t->source->ops->destroy)
        shard_batch_source_destroy(t->source);
    if (s < 0) t->source = NULL;
    return s;
}

/* The pipe axis: the schedule, this rank's stage (its blocks) and the activation slots it needs. */
static shard_status plan_pipeline(shard_trainer *t, shard_comm *pipe) {
    int p = shard_comm_size(pipe), r = shard_comm_rank(pipe), v = t->c.virtual_stages > 0 ? t->c.virtual_stages : 1;
    SHARD_CHECK(pipe_schedule(&t->c, p, t->accum, &t->sched));
    size_t layers = t->factory.create ? t->factory.stage_layers : 0;
    if (!t->factory.create) SHARD_CHECK(shard_model_stage_layers(t->c.config_path, &layers));
    if (!layers)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--mesh pipe=%d: %s's model is not cut into pipeline stages by the trainer "
                           "yet (the GPT is): give pipe=1",
                           p, t->c.config_path ? t->c.config_path : "the factory");
    /* p * v virtual stages; rank r holds virtual stages r, p + r, 2p + r, ... */
    size_t *first = calloc((size_t)(p * v) + 1, sizeof *first);
    if (!first) return shard_error(SHARD_ERR_NO_MEMORY, "pipeline: out of memory");
    shard_status s = SHARD_OK;
    const char *list = t->c.layers_per_stage;
    if (list && strcmp(list, "balanced") == 0) { /* measured on the world's rank 0, the cut sent to all */
        shard_comm *all = shard_mesh_comm(t->mesh);
        int64_t *cut = calloc((size_t)(p * v) + 1, sizeof *cut);
        if (!cut) s = shard_error(SHARD_ERR_NO_MEMORY, "pipeline: out of memory");
        if (s == SHARD_OK && shard_comm_rank(all) == 0) {
            shard_model *whole = NULL;
            s = make_model(t, NULL, NULL, NULL, &whole);
            if (s == SHARD_OK) whole->ops->init(whole, t->c.seed);
            if (s == SHARD_OK) s = make_source(t, whole);
            if (s == SHARD_OK)
                s = shard__pipe_balance(whole, t->source, layers, p * v, t->c.seed, t->micro, first, t->partition,
                                        sizeof t->partition);
            shard_model_destroy(whole);
            for (int i = 0; s == SHARD_OK && i <= p * v; i++) cut[i] = (int64_t)first[i];
            if (s < 0) cut[0] = -1; /* the others learn of the failure */
        }
        shard_status b = cut ? shard_comm_broadcast(all, cut, (size_t)(p * v) + 1, SHARD_I64, 0) : SHARD_OK;
        if (s == SHARD_OK && b < 0) s = b;
        if (s == SHARD_OK && cut[0] < 0)
            s = shard_error(SHARD_ERR_ABORTED, "--layers-per-stage balanced: rank 0 could not measure the layers");
        for (int i = 0; s == SHARD_OK && i <= p * v; i++) first[i] = (size_t)cut[i];
        free(cut);
    } else {
        s = shard__pipe_partition(layers, p * v, list, first);
    }
    if (s == SHARD_OK) { /* "layers per stage 3,1" and how they were chosen */
        char counts[256];
        int at = 0;
        for (int i = 0; i < p * v && at < (int)sizeof counts; i++)
            at += snprintf(counts + at, sizeof counts - (size_t)at, "%s%zu", i ? "," : "", first[i + 1] - first[i]);
        char how[512];
        snprintf(how, sizeof how, "%s",
                 t->partition[0]                             ? t->partition
                     : list && strcmp(list, "balanced") == 0 ? "balanced on the world's rank 0's measurement"
                     : list && *list                         ? "given"
                                                             : "even, the remainder on the first stages");
        snprintf(t->partition, sizeof t->partition, "layers per stage %s; %s", counts, how);
    }
    t->stage = (shard_model_stage){.index = r, .count = p, .chunks = (size_t)v};
    for (int c = 0; s == SHARD_OK && c < v; c++)
        t->stage.first[c] = first[c * p + r], t->stage.last[c] = first[c * p + r + 1];
    free(first);
    t->pipe = pipe;
    return s;
}

/* The optimizer the config names (AdamW when none) with its hyperparameters. */
static shard_status make_optimizer(const shard_trainer_config *c, shard_optimizer **out) {
    shard_optimizer_kind kind = SHARD_OPTIMIZER_ADAMW;
    if (c->optimizer) SHARD_CHECK(shard_optimizer_find(c->optimizer, &kind));
    shard_optimizer_options o = shard_optimizer_defaults(kind);
    o.adamw = c->adamw, o.sgd = c->sgd;
    return shard_optimizer_create(&o, out);
}

void shard_trainer_print_schedule(const shard_trainer *t, FILE *out) {
    if (!t->sched) return;
    fprintf(out, "  %s\n", t->partition);
    shard__pipe_schedule_print(t->sched, out);
}

shard_status shard_trainer_pipeline_stats(const shard_trainer *t, shard_pipeline_stats *out) {
    if (!t->pp)
        return shard_error(SHARD_ERR_INVALID_ARG, "pipeline stats: this mesh has no pipe axis of more than one rank");
    shard__pp_stats(t->pp, out);
    return SHARD_OK;
}

/* A factory the trainer can use on this mesh, refused in one line otherwise. */
static shard_status check_factory(shard_mesh *mesh, const shard_trainer_config *config, const shard_model_factory *f) {
    const char *who = "shard_trainer_create_with_model";
    if (!f || f->struct_size < sizeof(shard_model_factory))
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: factory missing or from an older header (struct_size)", who);
    if (!f->model == !f->create)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: give the factory either a model built by the caller or a create "
                           "function, not %s",
                           who, f->model ? "both" : "neither");
    if (!f->model) return SHARD_OK;
    int tensor = shard_mesh_axis_index(mesh, "tensor"), pipe = shard_mesh_axis_index(mesh, "pipe");
    int expert = shard_mesh_axis_index(mesh, "expert");
    int tensor_size = tensor >= 0 ? shard_mesh_axis_size(mesh, tensor) : 1;
    int pipe_size = pipe >= 0 ? shard_mesh_axis_size(mesh, pipe) : 1;
    int expert_size = expert >= 0 ? shard_mesh_axis_size(mesh, expert) : 1;
    const shard_model *m = f->model;
    if (expert_size > 1)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: a model built by the caller holds every expert, and this mesh has expert=%d: give "
                           "the factory a create function, which is handed each rank's expert axis, or expert=1",
                           who, expert_size);
    if (tensor_size > 1 || pipe_size > 1)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: a model built by the caller runs whole on each rank, and this mesh "
                           "has tensor=%d, pipe=%d: give the factory a create function that builds each rank's part "
                           "instead, or a mesh of data ranks only",
                           who, tensor_size, pipe_size);
    if (config->param_specs && *config->param_specs)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: param_specs '%s': a model built by the caller places its own "
                           "parameters; give none",
                           who, config->param_specs);
    SHARD_CHECK(shard_model_check_tables(m));
    if (!m->ops || !m->params || !m->params->data)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: the model holds no values (%s): build a fresh one for each "
                           "trainer",
                           who, !m->ops || !m->params ? "no table or parameters" : "a ZeRO-3 trainer released them");
    if (m->hooks.acquire || m->hooks.release || m->hooks.grads_ready)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: the model is held by another trainer: destroy that one first, "
                           "or build a model for each",
                           who);
    return SHARD_OK;
}

/* How trainer_create builds: for training (the weights drawn from the seed), the analyzer's dry build,
 * or a migration's target (its weights and state all about to be written: drawing them is wasted). */
typedef enum trainer_build { BUILD_TRAINING, BUILD_PLANNED, BUILD_TO_FILL } trainer_build;

static shard_status trainer_create(shard_mesh *mesh, const shard_trainer_config *config, const shard_model_factory *f,
                                   trainer_build build, shard_trainer **out) {
    *out = NULL;
    int axis = shard_mesh_axis_index(mesh, "data"), tensor_axis = shard_mesh_axis_index(mesh, "tensor");
    int pipe_axis = shard_mesh_axis_index(mesh, "pipe"), expert_axis = shard_mesh_axis_index(mesh, "expert");
    static const char *const trained[] = {"data", "expert", "tensor", "pipe"};
    for (int a = 0; a < shard_mesh_ndim(mesh); a++)
        if (a != axis && a != tensor_axis && a != pipe_axis && a != expert_axis && shard_mesh_axis_size(mesh, a) > 1) {
            const char *name = shard_mesh_axis_name(mesh, a), *near = shard_text_nearest(name, trained, 4);
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "--mesh: axis '%s' = %d: training splits over 'data', 'expert', 'tensor' and "
                               "'pipe'%s%s%s; give %s=1 or leave it out",
                               name, shard_mesh_axis_size(mesh, a), near ? " (did you mean '" : "", near ? near : "",
                               near ? "'?)" : "", name);
        }
    int pipe_size = pipe_axis >= 0 ? shard_mesh_axis_size(mesh, pipe_axis) : 1;
    /* a tensor axis of one rank is accepted (sequence parallel is then the single-device math) */
    if (config->sequence_parallel && tensor_axis < 0)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--sequence-parallel splits the tokens over the tensor axis, and this mesh "
                           "has none: give e.g. --mesh data=1,tensor=2");
    shard_trainer *t = calloc(1, sizeof *t);
    if (!t) return shard_error(SHARD_ERR_NO_MEMORY, "trainer: out of memory");
    t->c = *config, t->mesh = mesh, t->owns_model = !f || !f->model;
    t->planned = build == BUILD_PLANNED, t->to_fill = build == BUILD_TO_FILL;
    if (f) t->factory = *f;
    t->tensor = tensor_axis >= 0 ? shard_mesh_axis_comm(mesh, tensor_axis) : NULL;
    t->data = axis >= 0 ? shard_mesh_axis_comm(mesh, axis) : NULL;
    if (!t->data) { /* no data axis: a one-rank data communicator of this rank's own */
        shard_status s0 = shard__comm_split_sized(shard_mesh_comm(mesh), shard_comm_rank(shard_mesh_comm(mesh)), 0, 1,
                                                  0, &t->own_data);
        if (s0 < 0) {
            free(t);
            return s0;
        }
        t->data = t->own_data;
    }
    /* an expert axis of more than one rank: its ranks are data ranks too (the rows split over data x
     * expert); of one rank it splits nothing, and the run is the data axis's alone */
    t->rows = t->data;
    shard_status s = SHARD_OK;
    if (expert_axis >= 0 && shard_mesh_axis_size(mesh, expert_axis) > 1) {
        t->expert = shard_mesh_axis_comm(mesh, expert_axis);
        s = axis >= 0 ? shard_mesh_axes_comm(mesh, "data,expert", &t->rows) : SHARD_OK;
        if (axis < 0) t->rows = t->expert;
    }
    if (s < 0) {
        shard_trainer_destroy(t);
        return s;
    }
    t->data_rank = shard_comm_rank(t->rows), t->data_size = shard_comm_size(t->rows);
    /* several ranks share the cores: thread ranks' kernels run on one thread each, processes split their
     * machine's cores */
    s = shard_share_cores(shard_mesh_comm(mesh));
    if (s == SHARD_OK) s = make_optimizer(config, &t->opt);
    if (s == SHARD_OK && config->batch_shares && !(t->shares = calloc((size_t)t->data_size, sizeof *t->shares)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "trainer: out of memory");
    if (s == SHARD_OK) s = batch_layout(&t->c, (size_t)t->data_size, &t->global, &t->accum, &t->micro, t->shares);
    if (s == SHARD_OK && pipe_size > 1) s = plan_pipeline(t, shard_mesh_axis_comm(mesh, pipe_axis));
    if (s == SHARD_OK) s = make_model(t, t->tensor, t->expert, t->pipe ? &t->stage : NULL, &t->model);
    if (s == SHARD_OK) s = shard__expert_layout_create(t->expert, t->model, &t->experts);
    if (s == SHARD_OK) s = make_source(t, t->model);
    if (s == SHARD_OK) {
        if (!t->planned && !t->to_fill) t->model->ops->init(t->model, config->seed); /* else no weights drawn */
        double mb = config->bucket_mb > 0 ? config->bucket_mb : 25;
        /* on tensor ranks other than 0, parameters every tensor rank holds whole stay out of the norm */
        int count_replicated = !t->tensor || shard_comm_rank(t->tensor) == 0;
        shard_dp_comms comms = {.dense = t->rows, .expert_data = t->data, .expert = t->expert};
        s = shard__dp_create(&comms, t->model, config->zero, (size_t)(mb * 1048576.0), config->grad_dtype,
                             count_replicated, config->compute_dtype, t->opt,
                             &t->dp); /* f32 or bf16, else refused there */
    }
    if (s == SHARD_OK && t->pipe) s = shard__pp_create(t->pipe, t->model, t->sched, config->recompute, &t->pp);
    if (s < 0) {
        shard_trainer_destroy(t);
        return s;
    }
    *out = t;
    return SHARD_OK;
}

shard_status shard_trainer_create(shard_mesh *mesh, const shard_trainer_config *config, shard_trainer **out) {
    *out = NULL;
    if (!config->config_path)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "trainer: no config_path: give a model config file, or a model of your "
                           "own through shard_trainer_create_with_model");
    return trainer_create(mesh, config, NULL, BUILD_TRAINING, out);
}

shard_status shard__trainer_create_to_fill(shard_mesh *mesh, const shard_trainer_config *config, shard_trainer **out) {
    *out = NULL;
    if (!config->config_path) return shard_error(SHARD_ERR_INVALID_ARG, "migrate: no config_path: give a model config");
    return trainer_create(mesh, config, NULL, BUILD_TO_FILL, out);
}

shard_status shard__trainer_create_planned(shard_mesh *mesh, const shard_trainer_config *config, shard_trainer **out) {
    *out = NULL;
    if (!config->config_path) return shard_error(SHARD_ERR_INVALID_ARG, "analyze: no config_path: give a model config");
    if (config->layers_per_stage && strcmp(config->layers_per_stage, "balanced") == 0)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--layers-per-stage balanced measures the layers on rank 0 by running them: give the "
                           "counts (e.g. 3,3,2), or leave it out for the even cut");
    return trainer_create(mesh, config, NULL, BUILD_PLANNED, out);
}

shard_status shard_trainer_create_with_model(shard_mesh *mesh, const shard_trainer_config *config,
                                             const shard_model_factory *factory, shard_trainer **out) {
    *out = NULL;
    SHARD_CHECK(check_factory(mesh, config, factory));
    return trainer_create(mesh, config, factory, BUILD_TRAINING, out);
}

void shard_trainer_destroy(shard_trainer *t) {
    if (!t) return;
    shard__pp_destroy(t->pp);
    shard__pipe_schedule_destroy(t->sched);
    shard__dp_destroy(t->dp);
    shard__expert_layout_destroy(t->experts);
    shard_optimizer_destroy(t->opt);
    if (t->owns_source) shard_batch_source_destroy(t->source);
    if (t->owns_model)
        shard_model_destroy(t->model);
    else if (t->model)
        shard_model_bind_grad_slab(t->model, NULL); /* the strategy's gradient buffers are gone */
    shard_comm_destroy(t->own_data);
    free(t->routed), free(t->shares);
    shard__mon_destroy(t->mon);
    free(t);
}

shard_model *shard_trainer_model(shard_trainer *t) { return t->model; }

const shard_pipe_schedule *shard__trainer_schedule(const shard_trainer *t) { return t->pipe ? t->sched : NULL; }

void shard_trainer_batch(const shard_trainer *t, size_t *global, size_t *micro, size_t *accum, size_t *data) {
    if (global) *global = t->global;
    if (micro) *micro = t->micro;
    if (accum) *accum = t->accum;
    if (data) *data = (size_t)t->data_size;
}

/* This rank's rows of micro-batch k. */
static void my_rows(const shard_trainer *t, size_t k, size_t *first, size_t *rows) {
    if (t->shares) { /* this rank's share of the global batch, [before, before + share), over the micro-steps */
        size_t before = 0, off;
        for (int r = 0; r < t->data_rank; r++) before += t->shares[r];
        shard_split_even(t->shares[t->data_rank], t->accum, k, &off, rows);
        *first = before + off;
        return;
    }
    size_t mf, mc, rf;
    shard_split_even(t->global, t->accum, k, &mf, &mc);
    shard_split_even(mc, (size_t)t->data_size, (size_t)t->data_rank, &rf, rows);
    *first = mf + rf;
}

static shard_status load(shard_trainer *t, uint64_t step, size_t k) {
    size_t first, rows;
    my_rows(t, k, &first, &rows);
    SHARD_CHECK(shard_batch_source_load(t->source, t->c.seed, step, first, rows, &t->batch));
    t->model->global_rows = t->global; /* per-row means over the global batch (a router's losses) */
    return t->model->ops->set_batch(t->model, &t->batch);
}

/* The pipeline's loader: micro-batch k of the step being run. */
static shard_status pp_load(void *ctx, size_t k) {
    shard_trainer *t = ctx;
    return load(t, t->step_now, k);
}

/* The routers' losses and counts of this step, summed over the ranks that split the rows (data x expert)
 * and over the pipeline's stages, into out. */
static shard_status router_stats(shard_trainer *t, const shard_model_stats_ops *routers, shard_step_result *out) {
    shard_model_router_stats rs;
    routers->read(t->model, &rs);
    size_t cells = rs.layers * rs.experts, n = 4 + cells;
    if (!t->routed && !(t->routed = malloc(2 * n * sizeof *t->routed)))
        return shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory for the expert load");
    double *mine = t->routed + n, *sum = t->routed;
    mine[0] = rs.aux_loss, mine[1] = rs.z_loss, mine[2] = rs.assigned, mine[3] = rs.dropped;
    if (cells) memcpy(mine + 4, rs.load, cells * sizeof *mine);
    SHARD_CHECK(shard_comm_all_reduce(t->rows, mine, sum, n, SHARD_F64, SHARD_OP_SUM));
    if (t->pipe) { /* each stage's layers are its own */
        memcpy(mine, sum, n * sizeof *mine);
        SHARD_CHECK(shard_comm_all_reduce(t->pipe, mine, sum, n, SHARD_F64, SHARD_OP_SUM));
    }
    out->aux_loss = sum[0], out->z_loss = sum[1], out->dropped_tokens = sum[2] > 0 ? sum[3] / sum[2] : 0;
    out->moe_layers = rs.layers, out->experts = rs.experts, out->expert_load = sum + 4;
    return SHARD_OK;
}

static shard_status step_run(shard_trainer *t, uint64_t step, shard_step_result *out) {
    double t0 = shard__now();
    shard_model *m = t->model;
    t->step_now = step;
    memset(out, 0, sizeof *out);
    /* the denominator: items of the whole global batch */
    double items = 0, global_items = 0, loss = 0, global_loss = 0;
    for (size_t k = 0; k < t->accum; k++) {
        SHARD_CHECK(load(t, step, k));
        items += (double)m->ops->batch_items(m);
    }
    SHARD_CHECK(shard_comm_all_reduce(t->rows, &items, &global_items, 1, SHARD_F64, SHARD_OP_SUM));
    SHARD_CHECK(shard__dp_begin_step(t->dp));
    const shard_model_stats_ops *routers = shard_model_stats(m);
    if (routers) routers->reset(m);
    if (t->pp) {
        SHARD_CHECK(shard__pp_run(t->pp, t->dp, pp_load, t, global_items, &loss));
    } else
        for (size_t k = 0; k < t->accum; k++) {
            double l = 0;
            if (t->accum > 1) SHARD_CHECK(load(t, step, k)); /* the last micro-batch is still loaded when accum is 1 */
            SHARD_CHECK(shard__dp_begin_micro(t->dp, k + 1 == t->accum));
            double f0 = shard__mon_tracing() ? shard__now() : 0;
            shard__flops_phase(SHARD__PHASE_FORWARD);
            shard_status s = m->ops->forward(m, global_items, &l);
            double b0 = f0 > 0 ? shard__now() : 0;
            shard__flops_phase(SHARD__PHASE_BACKWARD);
            if (s == SHARD_OK) s = m->ops->backward(m);
            shard__flops_phase(SHARD__PHASE_OTHER);
            SHARD_CHECK(s);
            if (f0 > 0) {
                shard__mon_span("compute", 0, (int)k, -1, f0, b0, "forward %zu", k);
                shard__mon_span("compute", 0, (int)k, -1, b0, shard__now(), "backward %zu", k);
            }
            loss += l;
        }
    /* the global norm: squares summed over the data axis by the strategy, then over the tensor axis (each
     * tensor-replicated parameter counted once) */
    double squares = 0, all_squares = 0;
    SHARD_CHECK(shard__dp_finish(t->dp, &squares));
    if (t->tensor && shard_comm_size(t->tensor) > 1)
        SHARD_CHECK(shard_comm_all_reduce(t->tensor, &squares, &all_squares, 1, SHARD_F64, SHARD_OP_SUM));
    else
        all_squares = squares;
    if (t->pipe) { /* each stage's parameters (the tied one counted on stage 0 only) */
        squares = all_squares;
        SHARD_CHECK(shard_comm_all_reduce(t->pipe, &squares, &all_squares, 1, SHARD_F64, SHARD_OP_SUM));
    }
    out->grad_norm = sqrt(all_squares);
    /* every rank holds the same all-reduced sum, so all stop here together: an update with a NaN or
     * infinite gradient would make every weight and moment NaN (and a checkpoint saved after it) */
    if (!isfinite(all_squares))
        return shard_error(
            SHARD_ERR_INVALID_ARG,
            "train step %llu: the gradients' global norm is %s: the weights or "
            "the gradients are not finite; the weights were not updated (a lower learning rate may help)",
            (unsigned long long)step, isnan(all_squares) ? "NaN" : "infinite");
    out->lr = shard_lr_at(&t->c.lr, step);
    float clip = t->c.clip > 0 ? shard_clip_factor(out->grad_norm, t->c.clip) : 1.0f;
    double o0 = shard__now(), exposed0 = t->mon->exposed_s;
    SHARD_CHECK(shard__dp_update(t->dp, step, out->lr, clip));
    double o1 = shard__now();
    t->mon->now.optimizer_s = o1 - o0 - (t->mon->exposed_s - exposed0);
    shard__mon_span("optimizer", 0, -1, -1, o0, o1, "optimizer");
    SHARD_CHECK(shard_comm_all_reduce(t->rows, &loss, &global_loss, 1, SHARD_F64, SHARD_OP_SUM));
    if (t->pipe) { /* the loss is the last stage's */
        loss = global_loss;
        SHARD_CHECK(shard_comm_all_reduce(t->pipe, &loss, &global_loss, 1, SHARD_F64, SHARD_OP_SUM));
    }
    if (routers) SHARD_CHECK(router_stats(t, routers, out));
    shard_dp_stats st;
    shard__dp_stats(t->dp, &st);
    out->loss = global_loss, out->ms = (shard__now() - t0) * 1e3;
    out->exposed_comm_ms = st.exposed_comm_s * 1e3, out->grad_bytes = st.grad_bytes;
    return SHARD_OK;
}

/* The step, measured (monitor.h): the recorder is this rank's for the length of the step, whatever
 * way the step ends. */
shard_status shard_trainer_step(shard_trainer *t, uint64_t step, shard_step_result *out) {
    if (!t->mon) SHARD_CHECK(shard__mon_create(&t->mon));
    SHARD_CHECK(shard__emu_step_begin(step)); /* an emulated cluster's device as it is at this step */
    shard__mon_begin(t->mon);
    shard_status s = step_run(t, step, out);
    shard__mon_end(t->mon);
    return s;
}

shard_status shard_trainer_step_monitor(const shard_trainer *t, shard_step_monitor *out) {
    if (!t || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_step_monitor: NULL argument");
    if (t->mon)
        *out = t->mon->last;
    else
        memset(out, 0, sizeof *out);
    return SHARD_OK;
}

shard_status shard_trainer_trace(shard_trainer *t, int on) {
    if (!t) return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_trace: trainer is NULL");
    if (!t->mon) SHARD_CHECK(shard__mon_create(&t->mon));
    t->mon->tracing = on != 0;
    return SHARD_OK;
}

shard_status shard_trainer_trace_events(const shard_trainer *t, const shard_trace_event **events, size_t *count) {
    if (!t || !events || !count) return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_trace_events: NULL argument");
    *events = t->mon ? t->mon->ev : NULL;
    *count = t->mon ? t->mon->events : 0;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- whole state, checkpoints */

shard_status shard_trainer_values(shard_trainer *t, float *whole) { return shard__dp_get_state(t->dp, whole, NULL); }

/* The checkpoint's parameters: this rank's, and with a pipe axis every stage's (names and whole shapes
 * gathered over `pipe`, in stage order); mine[j]: the index among this rank's parameters, or SIZE_MAX.
 * A stack (model.h's stack table) is written as its members, each a tensor of its own (its name with the
 * member's index inserted after `prefix` bytes, its shape the whole shape less dim 0); in memory, and in
 * the scratch a parameter is made whole in, it stays one stacked tensor. */
typedef struct ckpt_param {
    char name[SHARD_PARAM_NAME_BYTES];
    int64_t ndim, shape[SHARD_MAX_DIMS];
    int64_t members, prefix; /* a stack's members (shape[0]) and name prefix bytes; members 0: one tensor */
    int64_t first;           /* its first tensor among a checkpoint array's tensors */
} ckpt_param;

/* A checkpoint tensor's name: the parameter's, or one member's ... */
#define CKPT_TENSOR_BYTES (SHARD_PARAM_NAME_BYTES + 24)
/* ... and an array's item name: that, or "optimizer.<state>.<tensor>". */
#define CKPT_ITEM_BYTES (CKPT_TENSOR_BYTES + 48)

/* The checkpoint tensors parameter cp is written as: its members, or itself. */
static size_t tensors_of(const ckpt_param *cp) { return cp->members > 0 ? (size_t)cp->members : 1; }

/* Parameter i's whole shape: whole over the tensor axis (the model's table), then over the expert axis. */
static void whole_shape(const shard_trainer *t, size_t i, size_t *shape) {
    memcpy(shape, t->model->params->info[i].shape, SHARD_MAX_DIMS * sizeof *shape);
    shard_model_whole_shape(t->model, i, shape);
    shard__expert_whole_shape(t->experts, i, shape);
}

/* Elements per dim-0 row of parameter i whole over the tensor axis (what an expert is of an expert-split
 * stack). */
static size_t row_elems(const shard_trainer *t, size_t i) {
    size_t shape[SHARD_MAX_DIMS], n = 1;
    memcpy(shape, t->model->params->info[i].shape, sizeof shape);
    shard_model_whole_shape(t->model, i, shape);
    for (int d = 1; d < t->model->params->info[i].ndim; d++) n *= shape[d];
    return n;
}

static shard_status ckpt_params(shard_trainer *t, ckpt_param **out, size_t **mine, size_t *count) {
    const shard_params *p = t->model->params;
    ckpt_param *own = calloc(p->count + 1, sizeof *own), *all = NULL;
    shard_status s = own ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (size_t i = 0; s == SHARD_OK && i < p->count; i++) {
        size_t shape[SHARD_MAX_DIMS];
        whole_shape(t, i, shape);
        memcpy(own[i].name, p->info[i].name, sizeof own[i].name);
        own[i].ndim = p->info[i].ndim;
        for (int d = 0; d < SHARD_MAX_DIMS; d++) own[i].shape[d] = (int64_t)shape[d];
        size_t prefix = 0, members = shard_model_stack(t->model, i, &prefix);
        if (members && (p->info[i].ndim < 1 || members != shape[0]))
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "checkpoint: the model says parameter '%s' is a stack of %zu, and its whole shape's "
                            "dim 0 is %zu: a stack's members lie along dim 0",
                            p->info[i].name, members, p->info[i].ndim ? shape[0] : 0);
        own[i].members = (int64_t)members, own[i].prefix = (int64_t)prefix;
    }
    size_t n = p->count;
    if (s == SHARD_OK && t->pipe) { /* every stage's list, in stage order */
        int P = shard_comm_size(t->pipe);
        int64_t mine_n = (int64_t)(p->count * sizeof *own), *sizes = calloc((size_t)P, sizeof *sizes);
        size_t *counts = calloc((size_t)P, sizeof *counts), *displs = calloc((size_t)P, sizeof *displs), bytes = 0;
        if (!sizes || !counts || !displs) s = shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
        if (s == SHARD_OK) s = shard_comm_all_gather(t->pipe, &mine_n, sizes, 1, SHARD_I64);
        for (int r = 0; s == SHARD_OK && r < P; r++)
            counts[r] = (size_t)sizes[r], displs[r] = bytes, bytes += counts[r];
        if (s == SHARD_OK && !(all = malloc(bytes + sizeof *all)))
            s = shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
        if (s == SHARD_OK) s = shard_comm_all_gatherv(t->pipe, own, (size_t)mine_n, all, counts, displs, SHARD_U8);
        free(sizes), free(counts), free(displs);
        free(own);
        own = all, n = bytes / sizeof *own;
    }
    for (size_t j = 0, first = 0; s == SHARD_OK && j < n; first += tensors_of(&own[j]), j++)
        own[j].first = (int64_t)first;
    *mine = s == SHARD_OK ? calloc(n + 1, sizeof **mine) : NULL;
    if (s == SHARD_OK && !*mine) s = shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (size_t j = 0; s == SHARD_OK && j < n; j++) {
        const shard_param_info *info = shard_params_find(p, own[j].name);
        (*mine)[j] = info ? (size_t)(info - p->info) : SIZE_MAX;
    }
    if (s < 0) {
        free(own);
        return s;
    }
    *out = own, *count = n;
    return SHARD_OK;
}

/* A checkpoint tensor's spec: dim 0 split over every axis of the mesh (the first axis major), so each rank
 * holds and writes 1/world of every tensor and none holds the whole state; a scalar whole. */
static shard_status row_spec(const shard_trainer *t, int ndim, shard_spec *out) {
    if (ndim == 0) {
        *out = shard_spec_replicated(0);
        return SHARD_OK;
    }
    shard_mesh_layout layout;
    shard_mesh_layout_of(t->mesh, &layout);
    char text[SHARD_MESH_MAX_AXES * (SHARD_MESH_AXIS_NAME_BYTES + 4) + 16] = "P(";
    size_t used = strlen(text);
    if (layout.ndim > 1) text[used++] = '(', text[used] = '\0';
    for (int a = 0; a < layout.ndim; a++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s'%s'", a ? "," : "", layout.names[a]);
    snprintf(text + used, sizeof text - used, "%s)", layout.ndim > 1 ? ")" : "");
    return shard_spec_parse(text, &layout, ndim, out);
}

/* The arrays a checkpoint holds per parameter: the values, then each of the optimizer's state arrays. */
static size_t arrays_of(const shard_trainer *t) { return 1 + shard_optimizer_state_count(t->opt); }

/* The checkpoint tensors of one array: every parameter's (tensors_of each). */
static size_t tensors_per_array(const ckpt_param *cp, size_t n) {
    return n ? (size_t)cp[n - 1].first + tensors_of(&cp[n - 1]) : 0;
}

/* Array j's item of tensor m of parameter k (a stack's member m; 0 otherwise). */
static size_t item_at(const ckpt_param *cp, size_t n, size_t j, size_t k, size_t m) {
    return j * tensors_per_array(cp, n) + (size_t)cp[k].first + m;
}

/* arrays_of(t) dtensors per checkpoint tensor (the values as the tensor's name, state array k as
 * "optimizer.<its name>.<tensor>") on the trainer's mesh, split by rows, at item_at. */
static shard_status make_items(shard_trainer *t, const ckpt_param *cp, size_t n, shard_ckpt_item **items,
                               char (**names)[CKPT_ITEM_BYTES]) {
    size_t arrays = arrays_of(t), total = arrays * tensors_per_array(cp, n);
    *items = calloc(total + 1, sizeof **items), *names = calloc(total + 1, sizeof **names);
    if (!*items || !*names) return shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (size_t j = 0; j < arrays; j++)
        for (size_t i = 0; i < n; i++) {
            int stack = cp[i].members > 0, ndim = (int)cp[i].ndim - stack;
            size_t shape[SHARD_MAX_DIMS] = {0};
            for (int d = 0; d < ndim; d++) shape[d] = (size_t)cp[i].shape[d + stack];
            shard_spec spec;
            SHARD_CHECK(row_spec(t, ndim, &spec));
            for (size_t m = 0; m < tensors_of(&cp[i]); m++) {
                size_t at = item_at(cp, n, j, i, m);
                char tensor[CKPT_TENSOR_BYTES];
                if (stack)
                    shard_model_stack_member_name(cp[i].name, (size_t)cp[i].prefix, m, tensor, sizeof tensor);
                else
                    snprintf(tensor, sizeof tensor, "%s", cp[i].name);
                if (j == 0)
                    snprintf((*names)[at], sizeof(*names)[at], "%s", tensor);
                else
                    snprintf((*names)[at], sizeof(*names)[at], "optimizer.%s.%s",
                             shard_optimizer_state_name(t->opt, j - 1), tensor);
                (*items)[at].name = (*names)[at];
                SHARD_CHECK(
                    shard_dtensor_create(t->mesh, SHARD_F32, ndim, shape, &spec, SHARD_MEM_COMM, &(*items)[at].tensor));
            }
        }
    return SHARD_OK;
}

/* Elements of a checkpoint parameter's whole shape, and where this rank's rows start in it (flat). */
static size_t whole_numel(const ckpt_param *cp) {
    size_t n = 1;
    for (int d = 0; d < cp->ndim; d++) n *= (size_t)cp->shape[d];
    return n;
}

/* Where this rank's rows of checkpoint tensor d start in its whole tensor (flat). */
static size_t rows_start(const shard_dtensor *d) {
    if (d->ndim == 0 || d->global_shape[0] == 0) return 0;
    int coords[SHARD_MESH_MAX_AXES];
    for (int a = 0; a < d->layout.ndim; a++) coords[a] = shard_mesh_coord(d->mesh, a);
    size_t off = 0, len = 0, row = 1;
    shard_spec_local_range(&d->spec, &d->layout, d->global_shape, coords, 0, &off, &len);
    for (int k = 1; k < d->ndim; k++) row *= d->global_shape[k];
    return off * row;
}

/* Checkpoint parameter k's values (which 0) or an optimizer state array (1 + k) whole on every rank, into whole[whole_n]: from
 * the data axis (ZeRO's pieces) and the tensor axis (this rank's block) when this rank holds it (i), and
 * on a pipeline from the stage that does.  piece: scratch for its local elements. */
static shard_status param_whole(shard_trainer *t, size_t i, int which, size_t whole_n, float *piece, float *whole) {
    const shard_param_info *info = i == SIZE_MAX ? NULL : &t->model->params->info[i];
    shard_status s = SHARD_OK;
    if (!info)
        memset(whole, 0, whole_n * sizeof *whole);
    else
        s = shard__dp_get_range(t->dp, which, info->offset, info->numel, piece);
    if (info && s == SHARD_OK) { /* this rank's experts (all of it when dense) whole over the tensor axis, */
        size_t row = row_elems(t, i);
        s = shard_model_gather_piece(t->model, i, piece, whole + shard__expert_offset(t->experts, i, row));
        if (s == SHARD_OK) s = shard__expert_gather(t->experts, i, whole, row); /* then every expert rank's */
    }
    /* a pipeline: the stage that holds it gives it to the others (the rest add zeros) */
    if (s == SHARD_OK && t->pipe) s = shard_comm_all_reduce(t->pipe, whole, whole, whole_n, SHARD_F32, SHARD_OP_SUM);
    return s;
}

/* Scratch for one parameter's array at a time: the largest whole and local sizes. */
static shard_status param_scratch(const shard_trainer *t, const ckpt_param *cp, size_t n, float **whole,
                                  float **piece) {
    size_t most_whole = 1, most_local = 1;
    for (size_t k = 0; k < n; k++) most_whole = whole_numel(&cp[k]) > most_whole ? whole_numel(&cp[k]) : most_whole;
    for (size_t i = 0; i < t->model->params->count; i++)
        most_local = t->model->params->info[i].numel > most_local ? t->model->params->info[i].numel : most_local;
    *whole = shard_alloc(most_whole * sizeof(float), SHARD_MEM_OTHER);
    *piece = shard_alloc(most_local * sizeof(float), SHARD_MEM_OTHER);
    return *whole && *piece ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
}

static void free_items(shard_ckpt_item *items, void *names, size_t n) {
    for (size_t i = 0; items && i < n; i++) shard_dtensor_destroy(items[i].tensor);
    free(items), free(names);
}

/* This rank's piece of parameter i (its experts' rows, then a tensor-parallel block, or all of it) from
 * its whole tensor. */
static void take_piece(const shard_trainer *t, size_t i, const float *whole, float *piece) {
    shard_model_take_piece(t->model, i, whole + shard__expert_offset(t->experts, i, row_elems(t, i)), piece);
}

/* The settings that shape the run's numbers (not how it is split), as a JSON object: saved with each
 * checkpoint, compared when one is resumed. */
static double shown(float x) { /* a float as its shortest decimal: 0.003, not 0.00300000003 */
    char text[32];
    snprintf(text, sizeof text, "%.7g", (double)x);
    return strtod(text, NULL);
}

static json_t *training_record(const shard_trainer *t) {
    const shard_trainer_config *c = &t->c;
    const shard_optimizer_options *o = shard_optimizer_options_of(t->opt);
    json_t *hyper = o->kind == SHARD_OPTIMIZER_SGD
        ? json_pack("{s:f, s:f}", "weight_decay", shown(o->sgd.weight_decay), "momentum", shown(o->sgd.momentum))
        : json_pack("{s:f, s:f, s:f, s:f}", "weight_decay", shown(o->adamw.weight_decay), "beta1",
                    shown(o->adamw.beta1), "beta2", shown(o->adamw.beta2), "eps", shown(o->adamw.eps));
    json_t *record = json_pack("{s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:s}", "seed", (json_int_t)c->seed, "batch",
                               (json_int_t)t->global, "seq", (json_int_t)c->seq, "lr", shown(c->lr.lr_max), "min_lr",
                               shown(c->lr.lr_min), "warmup", (json_int_t)c->lr.warmup, "steps",
                               (json_int_t)c->lr.total, "optimizer", shard_optimizer_name(t->opt));
    json_t *rest = json_pack("{s:f, s:s, s:s}", "clip", shown(c->clip), "grad_dtype", shard_dtype_name(c->grad_dtype),
                             "compute_dtype", shard_dtype_name(c->compute_dtype));
    if (!hyper || !record || !rest || json_object_update(record, hyper) < 0 || json_object_update(record, rest) < 0) {
        json_decref(record);
        record = NULL;
    }
    json_decref(hyper), json_decref(rest);
    return record;
}

/* The optimizer a checkpoint was trained with, from its recorded settings: "adamw" when it records none
 * (the settings of a build that trained only with AdamW), "" when its index cannot be read here (the
 * load then says why). */
static void recorded_optimizer(const char *where, char *out, size_t bytes) {
    char dir[4096];
    shard__ckpt_index ix;
    snprintf(out, bytes, "%s", "");
    if (shard__ckpt_open_index(where, dir, sizeof dir, &ix) < 0) {
        shard_clear_error();
        return;
    }
    json_t *rec = ix.training ? json_loads(ix.training, 0, NULL) : NULL;
    const char *name = json_string_value(json_object_get(rec, "optimizer"));
    snprintf(out, bytes, "%s", name ? name : "adamw");
    json_decref(rec);
    shard__ckpt_index_free(&ix);
}

/* Collective: a checkpoint trained with another optimizer is refused (the world's rank 0 reads which, as
 * the load picks the step on rank 0's view). */
static shard_status same_optimizer(shard_trainer *t, const char *where) {
    shard_comm *world = shard_mesh_comm(t->mesh);
    char then[32] = "";
    if (shard_comm_rank(world) == 0) recorded_optimizer(where, then, sizeof then);
    SHARD_CHECK(shard_comm_broadcast(world, then, sizeof then, SHARD_U8, 0));
    then[sizeof then - 1] = '\0';
    const char *now = shard_optimizer_name(t->opt);
    if (!then[0] || strcmp(then, now) == 0) return SHARD_OK;
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "resume: %s was trained with %s, and this run's optimizer is %s: the "
                       "optimizer's state does not carry over: give --optimizer %s to resume it, or start from its "
                       "weights alone (shard ckpt export, then --init)",
                       where, then, now, then);
}

shard_status shard_trainer_resume_differences(shard_trainer *t, const char *where, uint64_t step, char *out,
                                              size_t bytes) {
    if (!bytes) return shard_error(SHARD_ERR_INVALID_ARG, "resume: no room for the differences");
    out[0] = '\0';
    char dir[4096], path[4096 + 16];
    snprintf(path, sizeof path, "%s/index.json", where);
    if (access(path, F_OK) == 0)
        snprintf(dir, sizeof dir, "%s", where); /* a step directory */
    else
        shard__ckpt_step_dir(where, step, dir, sizeof dir); /* a root: the step resumed, wherever latest points */
    shard__ckpt_index ix;
    SHARD_CHECK(shard__ckpt_open_index(dir, path, sizeof path, &ix));
    json_t *now = training_record(t), *then = ix.training ? json_loads(ix.training, 0, NULL) : NULL;
    shard_status s = now ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "resume: out of memory");
    size_t used = 0;
    const char *key;
    json_t *v;
    if (s == SHARD_OK && then) json_object_foreach(now, key, v) {
            const json_t *w = json_object_get(then, key);
            if (!w || json_equal(v, w)) continue; /* an older checkpoint may lack a key */
            char a[64], b[64];
            const json_t *pair[2] = {v, w};
            char *text[2] = {a, b};
            for (int i = 0; i < 2; i++) {
                if (json_is_string(pair[i]))
                    snprintf(text[i], 64, "%s", json_string_value(pair[i]));
                else
                    snprintf(text[i], 64, "%.6g", json_number_value(pair[i]));
            }
            if (strcmp(a, b) == 0) continue; /* a float stored and read back */
            int n = snprintf(out + used, bytes > used ? bytes - used : 0, "%s%s %s (the checkpoint's: %s)",
                             used ? "; " : "", key, a, b);
            if (n > 0) used += (size_t)n < bytes - used ? (size_t)n : bytes - used - 1;
        }
    json_decref(now), json_decref(then);
    shard__ckpt_index_free(&ix);
    return s;
}

/* One parameter at a time: whole on every rank for a moment (ZeRO's pieces and tensor blocks gathered),
 * then only this rank's rows kept; every rank writes its rows (checkpoint.h). */
shard_status shard_trainer_save(shard_trainer *t, const char *dir, uint64_t step, const char *config_json) {
    shard_ckpt_item *items = NULL;
    char(*names)[CKPT_ITEM_BYTES] = NULL;
    ckpt_param *cp = NULL;
    size_t *mine = NULL, n = 0;
    float *whole = NULL, *piece = NULL;
    shard_status s = ckpt_params(t, &cp, &mine, &n);
    if (s == SHARD_OK) s = make_items(t, cp, n, &items, &names);
    if (s == SHARD_OK) s = param_scratch(t, cp, n, &whole, &piece);
    int arrays = (int)arrays_of(t);
    size_t count = (size_t)arrays * tensors_per_array(cp, n);
    for (size_t k = 0; s == SHARD_OK && k < n; k++)
        for (int j = 0; s == SHARD_OK && j < arrays; j++) {
            s = param_whole(t, mine[k], j, whole_numel(&cp[k]), piece, whole);
            size_t each = whole_numel(&cp[k]) / tensors_of(&cp[k]); /* a member's elements */
            for (size_t m = 0; s == SHARD_OK && m < tensors_of(&cp[k]); m++) {
                const shard_dtensor *d = items[item_at(cp, n, (size_t)j, k, m)].tensor;
                memcpy(d->local->data, whole + m * each + rows_start(d), shard_tensor_numel(d->local) * sizeof(float));
            }
        }
    json_t *record = s == SHARD_OK ? training_record(t) : NULL;
    char *training = record ? json_dumps(record, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (s == SHARD_OK && !training) s = shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    shard_free(whole), shard_free(piece), whole = piece = NULL; /* before the writer's buffers */
    if (s == SHARD_OK) s = shard_ckpt_save_run(dir, step, items, count, config_json, training);
    json_decref(record), free(training);
    free_items(items, names, count);
    free(cp), free(mine);
    return s;
}

/* Parameter i's tensors in a weights file, at its whole shape, from info[*n] on: a stack's members, or
 * itself. */
static void file_tensors(const shard_trainer *t, size_t i, shard_param_info *info, size_t *n) {
    const shard_param_info *pi = &t->model->params->info[i];
    size_t shape[SHARD_MAX_DIMS], prefix = 0, members = shard_model_stack(t->model, i, &prefix);
    whole_shape(t, i, shape);
    if (!members || pi->ndim < 1) {
        info[*n] = *pi;
        memcpy(info[(*n)++].shape, shape, sizeof shape);
        return;
    }
    for (size_t m = 0; m < members; m++, (*n)++) {
        info[*n] = *pi;
        char name[CKPT_TENSOR_BYTES];
        shard_model_stack_member_name(pi->name, prefix, m, name, sizeof name);
        snprintf(info[*n].name, sizeof info[*n].name, "%.*s", (int)sizeof info[*n].name - 1, name);
        info[*n].ndim = pi->ndim - 1;
        memset(info[*n].shape, 0, sizeof info[*n].shape);
        memcpy(info[*n].shape, shape + 1, (size_t)(pi->ndim - 1) * sizeof *shape);
    }
}

shard_status shard_trainer_load_weights(shard_trainer *t, const char *path) {
    const shard_params *p = t->model->params;
    shard_params *whole = NULL; /* every parameter of this rank at its whole shape, as the file holds it */
    size_t tensors = 0, *first = calloc(p->count + 1, sizeof *first); /* parameter i's tensors there: first[i].. */
    for (size_t i = 0; i < p->count; i++) tensors += shard_model_stack(t->model, i, NULL) + 1;
    shard_param_info *info = calloc(tensors + 1, sizeof *info);
    float *joined = NULL, *piece = NULL; /* a stack's members joined whole; one parameter's local piece */
    shard_status s = info && first ? param_scratch(t, NULL, 0, &joined, &piece) : SHARD_ERR_NO_MEMORY;
    if (s < 0) s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    tensors = 0;
    for (size_t i = 0; s == SHARD_OK && i < p->count; i++) {
        first[i] = tensors;
        file_tensors(t, i, info, &tensors);
    }
    if (first) first[p->count] = tensors;
    if (s == SHARD_OK) s = shard_params_create(info, tensors, SHARD_MEM_OTHER, &whole);
    if (s == SHARD_OK) s = shard_params_load(whole, path, 1, NULL);
    for (size_t i = 0; s == SHARD_OK && i < tensors; i++) { /* loaded weights are checked as a checkpoint's are */
        const shard_param_info *w = &whole->info[i];
        size_t bad = shard__ckpt_first_nonfinite(whole->data + w->offset, SHARD_F32, w->numel);
        if (bad != SIZE_MAX) {
            char why[512];
            size_t off[SHARD_MAX_DIMS] = {0};
            shard__ckpt_nonfinite_text(w->name, whole->data + w->offset, SHARD_F32, bad, w->ndim, off, w->shape, why,
                                       sizeof why);
            s = shard_error(SHARD_ERR_INVALID_ARG, "--init %s: %s: the weights must be finite", path, why);
        }
    }
    size_t most = 1; /* the largest stack: its members joined in one whole tensor (the slab pads between them) */
    for (size_t i = 0; s == SHARD_OK && i < p->count; i++)
        if (first[i + 1] - first[i] > 1 && whole->info[first[i]].numel * (first[i + 1] - first[i]) > most)
            most = whole->info[first[i]].numel * (first[i + 1] - first[i]);
    if (s == SHARD_OK && most > 1) {
        shard_free(joined);
        if (!(joined = shard_alloc(most * sizeof *joined, SHARD_MEM_OTHER)))
            s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    for (size_t i = 0; s == SHARD_OK && i < p->count; i++) { /* the values; the optimizer's state starts at zero */
        const float *values = whole->data + whole->info[first[i]].offset;
        if (first[i + 1] - first[i] > 1) {
            for (size_t m = first[i], at = 0; m < first[i + 1]; at += whole->info[m].numel, m++)
                memcpy(joined + at, whole->data + whole->info[m].offset, whole->info[m].numel * sizeof *joined);
            values = joined;
        }
        take_piece(t, i, values, piece);
        for (int j = 0; s == SHARD_OK && j < (int)arrays_of(t); j++)
            s = shard__dp_set_range(t->dp, j, p->info[i].offset, p->info[i].numel, j == 0 ? piece : NULL);
    }
    shard_params_destroy(whole);
    shard_free(joined), shard_free(piece);
    free(info), free(first);
    return s;
}

/* The checkpoint loaded by rows (any layout it was saved under), then one parameter at a time made whole
 * on every rank and this rank's pieces kept. */
shard_status shard_trainer_resume(shard_trainer *t, const char *where, uint64_t *step) {
    const shard_params *p = t->model->params;
    shard_ckpt_item *items = NULL;
    char(*names)[CKPT_ITEM_BYTES] = NULL;
    ckpt_param *cp = NULL;
    size_t *mine = NULL, n = 0;
    float *whole = NULL, *piece = NULL;
    int arrays = (int)arrays_of(t);
    shard_status s = same_optimizer(t, where);
    if (s == SHARD_OK) s = ckpt_params(t, &cp, &mine, &n);
    if (s == SHARD_OK) s = make_items(t, cp, n, &items, &names);
    size_t count = (size_t)arrays * tensors_per_array(cp, n);
    if (s == SHARD_OK) s = shard__ckpt_load_model(where, items, count, step); /* none missing, none extra */
    if (s == SHARD_OK) s = param_scratch(t, cp, n, &whole, &piece);
    for (size_t k = 0; s == SHARD_OK && k < n; k++)
        for (int j = 0; s == SHARD_OK && j < arrays; j++) {
            size_t each = whole_numel(&cp[k]) / tensors_of(&cp[k]), i = mine[k];
            for (size_t m = 0; s == SHARD_OK && m < tensors_of(&cp[k]); m++) { /* a stack's members in turn */
                const shard_dtensor *d = items[item_at(cp, n, (size_t)j, k, m)].tensor;
                shard_tensor full = {.dtype = SHARD_F32, .ndim = d->ndim, .data = whole + m * each};
                size_t stride = 1;
                for (int e = full.ndim - 1; e >= 0; e--) /* a contiguous view of the scratch */
                    full.shape[e] = d->global_shape[e], full.strides[e] = stride, stride *= full.shape[e];
                s = shard_dtensor_gather(d, &full, -1); /* every rank, held here or not */
            }
            if (s < 0 || i == SIZE_MAX) continue; /* another stage's */
            take_piece(t, i, whole, piece);
            s = shard__dp_set_range(t->dp, j, p->info[i].offset, p->info[i].numel, piece);
        }
    shard_free(whole), shard_free(piece);
    free_items(items, names, count);
    free(cp), free(mine);
    return s;
}

/* ---------------------------------------------------------------- state moved to another trainer */

/* Whether every parameter this rank holds in `to` is one of from's (cp), at the same whole shape. */
static shard_status state_matches(shard_trainer *to, const ckpt_param *cp, size_t n) {
    const shard_params *p = to->model->params;
    for (size_t i = 0; i < p->count; i++) {
        size_t shape[SHARD_MAX_DIMS], k = 0;
        whole_shape(to, i, shape);
        while (k < n && strcmp(cp[k].name, p->info[i].name) != 0) k++;
        int same = k < n && cp[k].ndim == p->info[i].ndim;
        for (int d = 0; same && d < p->info[i].ndim; d++) same = (size_t)cp[k].shape[d] == shape[d];
        if (!same)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "migrate: parameter '%s' of the new layout is %s the old one's model: both trainers "
                               "must train the same model",
                               p->info[i].name, k < n ? "not at the shape it has in" : "not in");
    }
    return SHARD_OK;
}

/* from's list of parameters (every stage's), each with its index here in both trainers. */
shard_status shard__trainer_moved_params(shard_trainer *from, shard_trainer *to, shard__moved_param **out,
                                         size_t *count) {
    ckpt_param *cp = NULL;
    size_t *mine = NULL, n = 0;
    *out = NULL, *count = 0;
    shard_status s = ckpt_params(from, &cp, &mine, &n);
    if (s == SHARD_OK) s = state_matches(to, cp, n);
    shard__moved_param *list = s == SHARD_OK ? calloc(n + 1, sizeof *list) : NULL;
    if (s == SHARD_OK && !list) s = shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    for (size_t k = 0; s == SHARD_OK && k < n; k++) {
        const shard_param_info *info = shard_params_find(to->model->params, cp[k].name);
        list[k] = (shard__moved_param){.whole_n = whole_numel(&cp[k]),
                                       .from = mine[k],
                                       .to = info ? (size_t)(info - to->model->params->info) : SIZE_MAX};
    }
    free(cp), free(mine);
    if (s < 0) {
        free(list);
        return s;
    }
    *out = list, *count = n;
    return SHARD_OK;
}

const shard_optimizer *shard__trainer_optimizer(const shard_trainer *t) { return t->opt; }

size_t shard__trainer_piece_numel(const shard_trainer *t, size_t i) { return t->model->params->info[i].numel; }

void shard__trainer_take_piece(const shard_trainer *t, size_t i, const float *whole, float *piece) {
    take_piece(t, i, whole, piece);
}

shard_status shard__trainer_param_whole(shard_trainer *t, size_t i, int which, size_t whole_n, float *piece,
                                        float *whole) {
    return param_whole(t, i, which, whole_n, piece, whole);
}

shard_status shard__trainer_held(const shard_trainer *t, size_t i, int which, size_t *lo, size_t *hi, size_t cap,
                                 size_t *count) {
    const shard_param_info *info = &t->model->params->info[i];
    return shard__dp_held(t->dp, which, info->offset, info->numel, lo, hi, cap, count);
}

shard_status shard__trainer_get_held(const shard_trainer *t, size_t i, int which, float *piece) {
    const shard_param_info *info = &t->model->params->info[i];
    return shard__dp_get_held(t->dp, which, info->offset, info->numel, piece);
}

shard_status shard__trainer_set_piece(shard_trainer *t, size_t i, int which, const float *piece) {
    const shard_param_info *info = &t->model->params->info[i];
    return shard__dp_set_range(t->dp, which, info->offset, info->numel, piece);
}

shard_status shard__trainer_keep_grads(shard_trainer *t, int on) { return shard__dp_keep_grads(t->dp, on); }

void shard__trainer_kept(const shard_trainer *t, uint64_t *step, float *lr, float *clip) {
    shard__dp_kept(t->dp, step, lr, clip);
}

int shard__trainer_kept_is_bf16(const shard_trainer *t) { return shard__dp_kept_is_bf16(t->dp); }

shard_status shard__trainer_replay(shard_trainer *t, uint64_t step, float lr, float clip, const size_t *params,
                                   size_t n) {
    size_t *lo = malloc((n + 1) * sizeof *lo), *hi = malloc((n + 1) * sizeof *hi);
    shard_status s = lo && hi ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    for (size_t k = 0; s == SHARD_OK && k < n; k++) {
        const shard_param_info *info = &t->model->params->info[params[k]];
        lo[k] = info->offset, hi[k] = info->offset + info->numel;
    }
    if (s == SHARD_OK) s = shard__dp_replay(t->dp, step, lr, clip, lo, hi, n);
    free(lo), free(hi);
    return s;
}

shard_mesh *shard__trainer_mesh(const shard_trainer *t) { return t->mesh; }
