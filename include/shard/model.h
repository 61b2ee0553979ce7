/* model.h — a trainable model as parallel strategies see it, whatever its
 * architecture: the GPT, the CNN and the engine API's MLP all sit behind this table,
 * so a strategy (data parallel, ZeRO, ...) holds no model-specific code.
 *
 * Parameters live in one slab (params.h) cut into units: contiguous ranges of
 * whole parameters, a layer or a group of layers (the GPT: unit 0 = the
 * embeddings and the final LayerNorm, unit 1 + l = block l).  A model reads a
 * parameter through value[i] and adds its gradient through grad[i]; both
 * point into slabs by default, and a strategy may point a unit elsewhere
 * (ZeRO-3's gathered buffer, ZeRO-2's per-unit gradient buffer).
 *
 * Around each use of a unit's parameters the model calls the hooks:
 * acquire before reading them, release after, and grads_ready once the
 * unit's gradients for this backward are complete (in backward order: the
 * moment a gradient bucket may start its all_reduce).  A unit may be
 * acquired more than once in a pass (the GPT's tied embedding).
 *
 * A model reads no data: the trainer draws each micro-batch's rows from a batch
 * source (batch.h; the kind's, or one the caller gives) and hands them over
 * through set_batch.
 *
 * A step's loss is the mean over the global batch's items (tokens, images,
 * rows): each rank is given its rows, the strategy sums the item counts over
 * ranks, and forward divides the local loss sum by that global denominator,
 * so the gradients of all ranks add up to the single-device gradient. */
#ifndef SHARD_MODEL_H
#define SHARD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "shard/batch.h"
#include "shard/comm.h"
#include "shard/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_model shard_model;

typedef struct shard_model_hooks {
    void *ctx;
    shard_status (*acquire)(void *ctx, shard_model *m, size_t unit, int backward);
    shard_status (*release)(void *ctx, shard_model *m, size_t unit, int backward);
    shard_status (*grads_ready)(void *ctx, shard_model *m, size_t unit);
} shard_model_hooks;

typedef struct shard_model_ops {
    size_t struct_size; /* sizeof(shard_model_ops), as the model's header had it: lets the table grow */
    const char *kind;   /* "gpt2", "cnn", "mlp" */
    /* Take a batch source's rows (rows first_row .. first_row + rows - 1 of step's global batch): point at
     * its buffers or copy them, after shard_model_check_batch against what the model was made for. */
    shard_status (*set_batch)(shard_model *m, const shard_batch *b);
    /* Loss terms in the rows set (tokens with a target, images, rows). */
    size_t (*batch_items)(const shard_model *m);
    /* *loss = (sum of the loaded rows' item losses) / denominator; keeps what backward needs. */
    shard_status (*forward)(shard_model *m, double denominator, double *loss);
    /* Adds d(loss)/d(parameter) through grad[]. */
    shard_status (*backward)(shard_model *m);
    void (*init)(shard_model *m, uint64_t seed);
    /* One line: the architecture and its sizes. */
    void (*describe)(const shard_model *m, char *out, size_t bytes);
    void (*destroy)(shard_model *m);
    /* The optional tables: split over a tensor axis (NULL: every parameter whole on every rank), cut
     * into pipeline stages (NULL: the model runs whole). */
    const struct shard_model_tensor_ops *tensor;
    const struct shard_model_pipe_ops *pipe;
    /* Optional: a model with routers (a mixture of experts) reports their losses and loads (NULL: none). */
    const struct shard_model_stats_ops *stats;
    /* Optional: parameters that are stacks of like tensors along dim 0 (a mixture of experts' experts),
     * which checkpoints and weight files hold member by member (NULL: every parameter one tensor). */
    const struct shard_model_stack_ops *stacks;
    /* Optional: what a row of its batches holds (shape's input_dtype, input_elems, target_dtype and
     * target_elems; the rest left zero), so a planner can hand it rows of zeros (NULL: not told). */
    void (*batch_shape)(const shard_model *m, shard_batch *shape);
} shard_model_ops;

/* A model with routers: what its forwards since the last reset added up, this rank's rows and layers
 * only (the trainer sums them over the data axis, and over the pipe axis: a stage's layers are its own).  The loss the forward returns is the task's (the LM loss);
 * the model minimises it plus aux_coef x aux_loss + z_coef x z_loss, each a per-row mean divided by the
 * global row count (model's global_rows) as the loss is.
 *   aux_loss, z_loss   the load-balancing and router z losses (unscaled by their coefficients)
 *   assigned, dropped  token-expert assignments made, and dropped for capacity
 *   layers, experts    routed layers of the whole model and experts per layer: load's shape
 *   load               [layers x experts] assignments routed to each expert (before capacity drops),
 *                      zero in the rows of layers another pipeline stage holds; the model's, valid
 *                      until its next forward or reset */
typedef struct shard_model_router_stats {
    double aux_loss, z_loss;
    double assigned, dropped;
    size_t layers, experts;
    const double *load;
} shard_model_router_stats;

typedef struct shard_model_stats_ops {
    size_t struct_size;
    /* Whether the model routes at all (a GPT config without experts: 0, and the trainer logs nothing). */
    int (*routed)(const shard_model *m);
    void (*reset)(shard_model *m);
    void (*read)(const shard_model *m, shard_model_router_stats *out);
} shard_model_stats_ops;

/* m's stats table when its ops have one (struct_size covering it) and it routes; NULL otherwise. */
const shard_model_stats_ops *shard_model_stats(const shard_model *m);

/* A model whose parameter i is a stack of `members` tensors along dim 0 (its whole tensor [members, ...],
 * whatever part of it this rank holds) stores member j under the parameter's name with "j." inserted
 * after its first name_prefix_bytes bytes: "h.0.mlp.experts.c_fc.weight" [E, C, 4C] with prefix
 * "h.0.mlp.experts." is written as E tensors "h.0.mlp.experts.J.c_fc.weight" [C, 4C].  In memory the
 * parameter stays one stacked tensor; checkpoints, exports and --init files hold the members.
 *   stack   parameter i's members in its whole tensor (0: not a stack), and the name's prefix bytes */
typedef struct shard_model_stack_ops {
    size_t struct_size;
    size_t (*stack)(const shard_model *m, size_t i, size_t *name_prefix_bytes);
} shard_model_stack_ops;

/* Parameter i's members when m's stack table says it is a stack, with *name_prefix_bytes set (NULL: not
 * asked); 0 otherwise (a model without the table: none). */
size_t shard_model_stack(const shard_model *m, size_t i, size_t *name_prefix_bytes);
/* Member j's name of a stack named `name` with that prefix, into out[bytes]. */
void shard_model_stack_member_name(const char *name, size_t name_prefix_bytes, size_t j, char *out, size_t bytes);
/* m's parameters as weight files and checkpoints hold them, at their shapes here (a whole model: its whole
 * shapes): a stack's members, dim 0 dropped, each parameter else as it is, in order; values zero.  Load
 * them by name (shard_params_load, shard_ckpt_load), then shard_model_take_stored puts them in m. */
shard_status shard_model_stored_params(const shard_model *m, shard_params **out);
/* m's values from `stored` (shard_model_stored_params of m): a stack's members joined. */
void shard_model_take_stored(shard_model *m, const shard_params *stored);

/* A pipe rank's part of the model: `chunks` runs of layers (one; v with virtual stages, chunk c being
 * virtual stage c * count + index), chunk c holding layers first[c] .. last[c]-1 of the model's
 * `layers` (the GPT: its blocks; the embeddings live on virtual stage 0, the final LayerNorm and the
 * LM head on the last).  A model keeps no per-micro-batch buffers: the pipeline allocates them. */
#define SHARD_MAX_STAGE_CHUNKS 16
typedef struct shard_model_stage {
    int index, count;
    size_t chunks;
    size_t first[SHARD_MAX_STAGE_CHUNKS], last[SHARD_MAX_STAGE_CHUNKS];
} shard_model_stage;

/* A model split over a tensor axis (tp.h) holds a piece of some parameters:
 *   whole_shape   parameter i's whole (stored) shape
 *   gather_piece  the whole tensor from every tensor rank's piece (collective over that axis)
 *   take_piece    this rank's piece of the whole tensor
 *   param_spec    parameter i's placement as text, e.g. "P(None, 'tensor') of [256, 1024]" (the spec and
 *                 the logical shape it is written on) */
typedef struct shard_model_tensor_ops {
    size_t struct_size;
    void (*whole_shape)(const shard_model *m, size_t i, size_t *shape);
    shard_status (*gather_piece)(shard_model *m, size_t i, const float *piece, float *whole);
    void (*take_piece)(const shard_model *m, size_t i, const float *whole, float *piece);
    void (*param_spec)(const shard_model *m, size_t i, char *out, size_t bytes);
} shard_model_tensor_ops;

/* A model a pipeline cuts into stages exposes its ordered blocks (the GPT: its transformer blocks; the
 * CNN: features, classifier) and runs a range of them; the pipeline strategy (src/parallel/pipeline.c)
 * owns everything per micro-batch: the activation buffers, which buffer a micro-batch uses, the stage
 * transfers, and the copy of a parameter the first and last stages share.  A model whose layers keep
 * state of a size the data decides (a mixture of experts' routing: the rows each expert receives) keys
 * it by the activation buffer: a micro-batch's backward gets the buffer of its forward, and no other
 * forward gets that buffer in between (with recompute, the one buffer is forwarded again just before
 * each backward, with the model's `recomputing` set).
 *
 * What comes before block 0 (the GPT's embeddings) runs with the range that starts at block 0 on the
 * stage holding it; what comes after the last block (ln_f, the LM head and the loss) with the range
 * that ends at `blocks` on the stage holding it.  Between ranges travels one activation of io_floats
 * floats for the loaded rows (the GPT: the residual stream [rows, T, C], this rank's tokens under
 * sequence parallel).
 *
 *   blocks          the whole model's blocks
 *   stage_blocks    chunk c of this stage model (shard_model_create_stage): blocks [*first, *last)
 *   io_floats       the activation between blocks, for the loaded rows
 *   acts_floats     floats of the buffer a forward of blocks [first, last) keeps for its backward (for
 *                   the largest batch the model was made for, what comes before and after included)
 *   forward_range   blocks [first, last) of the loaded rows over `acts` (acts_floats of them): `in` is
 *                   the previous range's output (NULL: the range starts at block 0 and embeds), `out`
 *                   receives this range's (NULL: it ends at `blocks`, *loss = the loss sum over
 *                   `denominator`, else 0)
 *   backward_range  the same range and acts after its forward: d_out is the gradient of `out` (NULL at
 *                   the end), d_in receives the gradient of `in` (NULL at block 0)
 *   tied            a parameter what comes before and what comes after share (the GPT's wte: the
 *                   embedding and the LM head): its elements, 0 when none or when this stage holds
 *                   neither end or both.  On the stage holding block 0 its unit and, valid between
 *                   acquire and release, its value and gradient; on the stage holding the end *unit =
 *                   SIZE_MAX and *value = *grad = NULL: the pipeline keeps a copy there
 *   use_tied        where that copy lives (the pipeline's buffers, borrowed): the end reads the
 *                   parameter from value and adds its gradient to grad */
typedef struct shard_model_pipe_ops {
    size_t struct_size;
    size_t (*blocks)(const shard_model *m);
    void (*stage_blocks)(const shard_model *m, size_t chunk, size_t *first, size_t *last);
    size_t (*io_floats)(const shard_model *m);
    size_t (*acts_floats)(const shard_model *m, size_t first, size_t last);
    shard_status (*forward_range)(shard_model *m, float *acts, size_t first, size_t last, const float *in, float *out,
                                  double denominator, double *loss);
    shard_status (*backward_range)(shard_model *m, float *acts, size_t first, size_t last, const float *d_out,
                                   float *d_in);
    size_t (*tied)(shard_model *m, size_t *unit, float **value, float **grad);
    void (*use_tied)(shard_model *m, float *value, float *grad);
} shard_model_pipe_ops;

struct shard_model {
    const shard_model_ops *ops;
    shard_params *params; /* the layout; values in params->data unless a strategy moved them */
    size_t units;
    size_t *unit_first;    /* [units + 1]: unit u holds parameters unit_first[u] .. unit_first[u+1]-1 */
    size_t *unit_offset;   /* [units + 1]: and slab elements unit_offset[u] .. unit_offset[u+1]-1 */
    size_t *unit_of;       /* [params->count]: the unit of each parameter */
    float **value, **grad; /* [params->count] */
    const unsigned char *tensor_replicated; /* [params->count] or NULL: held whole by every tensor rank */
    /* [params->count] or NULL (none): the parameter is split over the mesh's expert axis, a stack of this
     * expert rank's experts along dim 0 ([E_local, ...], experts shard_expert_range of expert.h), the
     * whole tensor being [E, ...] in global expert order.  A unit is all expert-split or all dense (the
     * strategy reduces and shards a unit over one communicator: the data axis for expert units, data x
     * expert for dense ones) and is refused otherwise. */
    const unsigned char *expert_split;
    shard_model_hooks hooks;
    uint64_t seed, step; /* of the loaded batch (dropout masks are keyed by them and the global row) */
    size_t first_row, rows;
    /* rows of the step's global batch, the denominator of per-row means (a router's losses): set by the
     * trainer; 0: the rows loaded */
    size_t global_rows;
    /* set by the pipeline around a forward that recomputes one already run for the same rows (its
     * recompute option): statistics counted per forward (a router's load) are left as they are */
    int recomputing;
    void *impl;
};

/* Build the model a JSON config describes ("model_type": "gpt2" (default: the
 * GPT's describe line then says "model_type missing: gpt2 assumed"),
 * "cnn", "mlp" or a kind a program registered: the registry below), for
 * batches of up to max_rows rows of seq tokens.  data_dir is handed to the
 * kind's create function; the built-in models read no data (their kinds' batch
 * sources do: shard_model_batch_source).
 * `tensor` (NULL: none): the mesh's tensor axis; the GPT then holds its
 * Megatron pieces (heads, MLP columns, vocabulary rows) of every layer;
 * sequence_parallel: its residual stream, LayerNorms and dropout hold only
 * this rank's tokens (all_gather / reduce_scatter instead of all_reduce). */
shard_status shard_model_create(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                shard_comm *tensor, int sequence_parallel, shard_model **out);
/* The same, with the parameters' placement chosen by `specs`: "NAME=SPEC;NAME=SPEC", each NAME a glob
 * over parameter names, each SPEC the parameter's default split (Megatron's: heads of c_attn and
 * attn.c_proj, columns of c_fc and rows of mlp.c_proj, rows of wte) or P() (whole on every tensor
 * rank).  E.g. "h.*.mlp.*=P()" computes every MLP whole on each tensor rank, "wte.weight=P()" keeps the
 * whole vocabulary.  The layers read their placement from these specs.  NULL or "": the defaults. */
shard_status shard_model_create_placed(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                       shard_comm *tensor, int sequence_parallel, const char *specs, shard_model **out);
/* The same, holding only one pipeline stage's layers (stage NULL: the whole model, one slot). */
shard_status shard_model_create_stage(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                      shard_comm *tensor, int sequence_parallel, const char *specs,
                                      const shard_model_stage *stage, shard_model **out);
/* Layers a pipeline cuts into stages (the GPT's n_layer); 0 when the config's model cannot be pipelined. */
shard_status shard_model_stage_layers(const char *config_path, size_t *layers);
/* A config file's whole text (malloc'd into *text), refused when it is not a regular file, is empty or
 * holds a NUL byte: what a checkpoint stores as the run's config. */
shard_status shard_model_config_read(const char *path, char **text);
/* Whether the config at config_path describes a model this library can build, without building it:
 * readable, its model_type a registered kind, and for the built-in kinds (gpt2, cnn, mlp) every key and
 * value as their create functions check them (a registered kind's keys are its create function's to
 * check).  One line naming the file and the key otherwise, with the nearest valid key for a mistyped
 * one.  Allocates no model and reads no data: a program checks a config once, before it starts ranks. */
shard_status shard_model_config_check(const char *config_path);
void shard_model_destroy(shard_model *m);

/* Parameters per unit (unit_first), given the layout; points value[] into
 * params->data and grad[] nowhere (bind before backward).  For model makers. */
shard_status shard_model_setup_units(shard_model *m, shard_params *params, const size_t *unit_first, size_t units);
/* Point unit u's values (or gradients) at base, laid out as in the slab. */
void shard_model_bind_values(shard_model *m, size_t unit, float *base);
void shard_model_bind_grads(shard_model *m, size_t unit, float *base);
/* Every unit's gradients into one slab of the parameters' layout. */
void shard_model_bind_grad_slab(shard_model *m, float *slab);
static inline size_t shard_model_unit_elems(const shard_model *m, size_t u) {
    return m->unit_offset[u + 1] - m->unit_offset[u];
}

/* The hooks, for model code (no-ops when a hook is NULL); inline, as every layer of every step calls them. */
static inline shard_status shard_model_acquire(shard_model *m, size_t unit, int backward) {
    return m->hooks.acquire ? m->hooks.acquire(m->hooks.ctx, m, unit, backward) : SHARD_OK;
}
static inline shard_status shard_model_release(shard_model *m, size_t unit, int backward) {
    return m->hooks.release ? m->hooks.release(m->hooks.ctx, m, unit, backward) : SHARD_OK;
}
static inline shard_status shard_model_grads_ready(shard_model *m, size_t unit) {
    return m->hooks.grads_ready ? m->hooks.grads_ready(m->hooks.ctx, m, unit) : SHARD_OK;
}

/* The tensor table's entries with their single-device meaning for a model without it (or a NULL
 * entry): the parameter's own shape, pieces that are the whole tensor, and "P()". */
void shard_model_whole_shape(const shard_model *m, size_t i, size_t *shape);
shard_status shard_model_gather_piece(shard_model *m, size_t i, const float *piece, float *whole);
void shard_model_take_piece(const shard_model *m, size_t i, const float *whole, float *piece);
void shard_model_param_spec(const shard_model *m, size_t i, char *out, size_t bytes);
/* Whether m's tables were filled for this library: the core table, and the tensor and pipeline tables
 * where given, each with its struct_size at least this header's size and the entries every model needs
 * (kind, forward, backward, destroy; a pipeline table's ranges).  One line naming the model's kind and
 * what is missing otherwise.  The factory and the trainer check every model they are given. */
shard_status shard_model_check_tables(const shard_model *m);
/* m's batch row layout into *shape through its table's batch_shape: 1, or 0 when the model does not say. */
int shard_model_batch_shape(const shard_model *m, shard_batch *shape);

/* Whether batch b fits a model made for up to max_rows rows whose rows are input_elems inputs of
 * input_dtype and target_elems targets of target_dtype: one line naming the model's kind, what the
 * batch holds and what would be valid otherwise.  Then m's seed, step, first_row and rows are b's.
 * For a model's set_batch. */
shard_status shard_model_check_batch(shard_model *m, const shard_batch *b, size_t max_rows, shard_dtype input_dtype,
                                     size_t input_elems, shard_dtype target_dtype, size_t target_elems);

/* Dropout keys for a site: a mask element is a function of (run seed, step,
 * site, global position) only, so every strategy draws the same masks. */
static inline uint64_t shard_model_dropout_seed(const shard_model *m, uint64_t site) {
    uint64_t z =
        m->seed * 0x9e3779b97f4a7c15ULL ^ (m->step + 1) * 0xbf58476d1ce4e5b9ULL ^ (site + 1) * 0x94d049bb133111ebULL;
    z = (z ^ (z >> 31)) * 0xd6e8feb86659fd93ULL;
    return z ^ (z >> 32);
}

/* ---- the model registry: a model defined outside the library trains as the built-in ones do ----
 *
 * A kind is a name a config's "model_type" gives, and the function that builds it.  The GPT ("gpt2",
 * also "gpt"), the CNN ("cnn") and the MLP ("mlp") are registered by the library itself; a program
 * adds its own with shard_model_register before it creates a model or a trainer of that kind.  The
 * registry is process-wide and safe to use from thread ranks at once; a kind cannot be removed or
 * replaced. */

/* What a kind's create function is given (the library sets struct_size to its sizeof). */
typedef struct shard_model_create_options {
    size_t struct_size;
    const char *config_text;        /* the config's JSON text; NULL when the caller built no config */
    const char *config_path;        /* where the text came from, for messages ("the model config" when none) */
    const char *data_dir;           /* NULL: none given */
    size_t max_rows, seq;           /* the most rows one batch holds; tokens per row (sequence models) */
    shard_comm *tensor;             /* the mesh's tensor axis (NULL: none): build this rank's piece */
    int sequence_parallel;          /* with `tensor`: split the token dimension as well */
    const char *specs;              /* parameter placement on the tensor axis (shard_model_create_placed) */
    const shard_model_stage *stage; /* a pipe rank's layers; NULL: the whole model */
    void *ctx;                      /* the registration's (or the trainer factory's) context */
    shard_comm *expert;             /* the mesh's expert axis (NULL: none): hold this rank's experts and
                                       mark them in the model's expert_split */
} shard_model_create_options;

/* Builds the model the options describe into *out (destroyed through its table's destroy). */
typedef shard_status (*shard_model_create_fn)(const shard_model_create_options *o, shard_model **out);

/* The batch source a model of the kind trains on (the options' data_dir, max_rows, seq, config_text,
 * config_path and ctx are read; m is the model it will feed, already built), into *out, destroyed by
 * the caller (shard_batch_source_destroy).  A data_dir the source cannot use is refused here. */
typedef shard_status (*shard_batch_source_fn)(const shard_model_create_options *o, const shard_model *m,
                                              shard_batch_source **out);

/* A kind and what it can do; the factory refuses what it cannot in one line before calling create. */
typedef struct shard_model_kind {
    size_t struct_size; /* sizeof(shard_model_kind): lets the struct grow */
    const char *name;   /* the config's model_type; copied (at most 63 bytes) */
    shard_model_create_fn create;
    /* The layers a pipeline cuts into stages for the options' config (only config_text, config_path
     * and ctx are read); NULL: the kind is not cut into pipeline stages. */
    shard_status (*stage_layers)(const shard_model_create_options *o, size_t *layers);
    int tensor_parallel; /* create builds a piece per rank of a tensor axis of more than one rank */
    int placed;          /* create reads `specs`; otherwise every parameter is whole and specs are refused */
    void *ctx;           /* handed to create, stage_layers and batch_source as options->ctx */
    /* Where its rows come from (the trainer makes it next to the model); NULL: the trainer needs a
     * source from its caller (trainer.h's factory). */
    shard_batch_source_fn batch_source;
    int expert_parallel; /* create splits its experts over an expert axis of more than one rank */
} shard_model_kind;

/* Adds a kind; a name already registered, an empty or over-long one, or no create function is refused. */
shard_status shard_model_register_kind(const shard_model_kind *kind);
/* The short form: a kind that runs whole (no tensor axis, no pipeline stages, no specs). */
shard_status shard_model_register(const char *kind, shard_model_create_fn create);
/* The registered kind of that name into *out (its name points into the registry); an unknown name is
 * refused naming the registered kinds. */
shard_status shard_model_kind_find(const char *name, shard_model_kind *out);
/* The factory behind shard_model_create_stage, from options: the kind o->config_text's model_type names
 * ("gpt2" when the text has none; no text is refused), checked against what the kind can do, then its
 * create with the kind's ctx. */
shard_status shard_model_create_with(const shard_model_create_options *o, shard_model **out);
/* The batch source of m's kind (the registered kind its table's `kind` names), from the options, with
 * the kind's ctx; a kind without one is refused in one line. */
shard_status shard_model_batch_source(const shard_model_create_options *o, const shard_model *m,
                                      shard_batch_source **out);
/* Frees what shard_model_setup_units allocated: for a model's destroy. */
void shard_model_free_units(shard_model *m);

#ifdef __cplusplus
}
#endif
#endif
