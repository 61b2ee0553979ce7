/* train.c — `shard train`: training on a mesh of ranks (threads, or MPI
 * processes under mpirun).
 *
 *   shard train --config CONFIG.json --data DIR --batch 8 --seq 128 --steps N --lr X --seed S
 *               [--ranks N] [--mesh data=N,tensor=T] [--sequence-parallel] [--zero 0|1|2|3] [--accum K] [--micro-batch M]
 *               [--spec NAME=SPEC ...] [--print-specs]
 *               [--mesh data=D,pipe=P --schedule gpipe|1f1b|interleaved --micro-batches M [--virtual-stages V]
 *                [--recompute] [--layers-per-stage 3,3,2] [--trace run.json]]
 *               [--bucket-mb 25] [--grad-dtype f32|bf16] [--compute-dtype f32|bf16] [--resume DIR]
 *               [--init weights.safetensors] [--log run.jsonl] [--save DIR] [--save-every K]
 *               [--warmup W] [--min-lr X] [--weight-decay 0.1] [--clip 1.0]
 *               [--optimizer adamw|sgd] [--momentum M (sgd; default 0)]
 *               [--plan plan.json (the layout of `shard plan --out`; its predictions against the run's)]
 *               [--reshard-at STEP:MESH [--reshard-zero Z] [--migration stop-and-copy|live [--live-steps N]]]
 *               [--adaptive [--reshard-on imbalance=0.25,memory=0.9,comm=0.4] [--monitor-every K]]
 *
 * The config's model_type picks the model (gpt2, cnn, mlp; model.h); a step
 * is src/train/trainer.c's.  A progress bar on a terminal, plain lines
 * otherwise (rank 0 prints); --log writes a JSON line per step and a summary
 * record at the end; --save writes a checkpoint (values and the optimizer's
 * state, the config in its index) every K steps, at the end, and when SIGTERM
 * or SIGINT stops the run (train_stop.h), holding the root's writer lock
 * meanwhile; --resume continues one, on any mesh and ZeRO stage; --reshard-at moves the running job to
 * another mesh after a step (shard_trainer_migrate), its losses unchanged; --adaptive moves it to the
 * planner's layout for the speeds the monitor measures when a threshold is crossed (train_adaptive.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/checkpoint.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/files.h"
#include "shard/model.h"
#include "shard/safetensors.h"
#include "shard/shard.h"
#include "shard/text.h"
#include "monitor.h"
#include "trace.h"
#include "train_adaptive.h"
#include "train_phases.h"
#include "train_plan.h"
#include "train_stop.h"
#include "train_util.h"

typedef struct train_opts {
    const char *config, *data, *init, *log, *save, *resume, *trace, *plan_path;
    cli_layout layout; /* the mesh, the batch arithmetic, the strategies' flags (train_util.h) */
    long steps, save_every, warmup;
    long monitor_every; /* 0: with the progress line */
    double lr, min_lr, weight_decay, clip, momentum;
    unsigned long long seed;
    int have_min_lr, have_warmup, have_momentum, print_specs;
    const train_plan *plan; /* --plan: its predictions, reported at the end */
    /* --reshard-at STEP:MESH: after step reshard_step the run moves to reshard_mesh, with ZeRO stage
     * reshard_zero (-1: the run's), by the --migration mode (stop-and-copy or live) */
    const char *reshard_at, *migration;
    long reshard_step, reshard_zero, live_steps; /* live_steps: --live-steps (0: not given) */
    char reshard_mesh[256];
    /* --adaptive: the thresholds of --reshard-on (0: a trigger not watched) on the --cluster's devices */
    int adaptive;
    const char *reshard_on;
    double thresholds[ADAPTIVE_TRIGGERS];
    const shard_cluster *cluster;
    const char *cluster_path; /* --cluster's file (NULL: none): the phases of the step time cut at its changes */
    shard_ckpt_lock *lock;    /* --save's writer lock, taken before thread ranks start */
    int lock_in_rank;         /* under an MPI launcher: rank 0 takes it in train_rank instead */
} train_opts;

/* Rank 0: each parameter's name, whole shape, placement on the tensor axis and this rank's piece. */
static void print_specs(shard_model *m) {
    printf("  parameters (name, whole shape, spec on the tensor axis, rank 0's piece):\n");
    for (size_t i = 0; i < m->params->count; i++) {
        const shard_param_info *pi = &m->params->info[i];
        size_t whole[SHARD_MAX_DIMS] = {0};
        memcpy(whole, pi->shape, sizeof pi->shape);
        shard_model_whole_shape(m, i, whole);
        size_t members = shard_model_stack(m, i, NULL); /* an expert stack: every expert, whatever this rank holds */
        if (members && pi->ndim > 0) whole[0] = members;
        char spec[192], ws[64], ls[64];
        shard_model_param_spec(m, i, spec, sizeof spec);
        int a = snprintf(ws, sizeof ws, "[%zu", whole[0]), b = snprintf(ls, sizeof ls, "[%zu", pi->shape[0]);
        for (int d = 1; d < pi->ndim; d++) {
            a += snprintf(ws + a, sizeof ws - (size_t)a, ", %zu", whole[d]);
            b += snprintf(ls + b, sizeof ls - (size_t)b, ", %zu", pi->shape[d]);
        }
        snprintf(ws + a, sizeof ws - (size_t)a, "]"), snprintf(ls + b, sizeof ls - (size_t)b, "]");
        printf("    %-26s %-14s %-48s %s\n", pi->name, ws, spec, ls);
    }
}

/* Collective: every rank's peak bytes by category and total (the accounted allocator's ledger of that
 * rank), gathered: (*all)[rank * (SHARD_MEM_CATEGORY_COUNT + 1) + c], the total last (malloc'd). */
enum { PEAK_FIELDS = SHARD_MEM_CATEGORY_COUNT + 1 };

static shard_status gather_peaks(shard_comm *comm, double **all) {
    int world = shard_comm_size(comm);
    shard_mem_stats st;
    shard_mem_stats_get(&st);
    double mine[PEAK_FIELDS];
    if (!(*all = calloc((size_t)(world * PEAK_FIELDS), sizeof **all)))
        return shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory");
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++) mine[c] = (double)st.peak_bytes[c];
    mine[SHARD_MEM_CATEGORY_COUNT] = (double)st.total_peak_bytes;
    return shard_comm_all_gather(comm, mine, *all, PEAK_FIELDS, SHARD_F64);
}

/* Rank 0: each rank's mesh coordinates and peak bytes by category (gather_peaks's). */
static void print_memory(const shard_mesh *mesh, const double *all, int world) {
    printf("  peak MiB per rank   params    grads  optimizer  activations     comm    other    total\n");
    for (int r = 0; r < world; r++) {
        char where[64];
        cli_mesh_where(mesh, r, where, sizeof where);
        const double *v = all + r * PEAK_FIELDS, M = 1048576.0;
        printf("  rank %-2d %-18s %7.2f %8.2f %10.2f %12.2f %8.2f %8.2f %8.2f\n", r, where, v[0] / M, v[1] / M,
               v[2] / M, v[3] / M, v[4] / M, v[5] / M, v[SHARD_MEM_CATEGORY_COUNT] / M);
    }
}

/* Rank 0 under --plan: the plan's predictions against the run's step times and peaks. */
static void report_plan(const train_opts *o, const shard_mesh *mesh, const double *step_ms, size_t steps,
                        const double *peaks, int world) {
    double *totals = malloc((size_t)world * sizeof *totals);
    if (!totals) {
        fprintf(stderr, "shard: train: out of memory for the plan's comparison\n");
        return;
    }
    for (int r = 0; r < world; r++) totals[r] = peaks[r * PEAK_FIELDS + SHARD_MEM_CATEGORY_COUNT];
    train_plan_report(o->plan, mesh, step_ms, steps, totals, world);
    free(totals);
}

/* How the --log's summary record starts (a resumed run knows an earlier one by it). */
static const char SUMMARY_START[] = "{\"event\": \"summary\"";

/* Rank 0, a run that ended at its last step: the --log's final record, one line written whole, of the steps
 * this run trained, the median step time (the first step left out, as in the plan's comparison), the
 * tokens (rows for a model without tokens) per second at that median, the last loss and each rank's peak
 * bytes (gather_peaks's totals); under --plan, the plan's predicted step_ms and peak_bytes beside them. */
static shard_status log_summary(shard_text_file *log, const train_opts *o, uint64_t first, const double *step_ms,
                                size_t steps, double items_per_step, double final_loss, const double *peaks,
                                int world) {
    double median = 0;
    SHARD_CHECK(cli_median_step_ms(step_ms, steps, &median));
    char *text = NULL;
    size_t bytes = 0;
    FILE *f = open_memstream(&text, &bytes); /* grows with the ranks and with the plan's numbers */
    if (!f) return shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory for the --log summary");
    fprintf(f,
            "%s, \"steps\": %llu, \"last_step\": %ld, \"median_step_ms\": %.3f, \"tokens_per_s\": %.1f, "
            "\"final_loss\": %.7f, \"peak_bytes\": [",
            SUMMARY_START, (unsigned long long)((uint64_t)o->steps - first + 1), o->steps, median,
            median > 0 ? items_per_step / (median / 1e3) : 0.0, final_loss);
    for (int r = 0; r < world; r++)
        fprintf(f, "%s%.0f", r ? ", " : "", peaks[r * PEAK_FIELDS + SHARD_MEM_CATEGORY_COUNT]);
    fprintf(f, "]");
    if (o->plan) {
        fprintf(f, ", \"predicted\": {\"step_ms\": %.3f, \"peak_bytes\": [", o->plan->step_ms);
        for (size_t i = 0; i < o->plan->peaks; i++) fprintf(f, "%s%.0f", i ? ", " : "", o->plan->peak_bytes[i]);
        fprintf(f, "]}");
    }
    fprintf(f, "}\n");
    int failed = ferror(f);
    failed |= fclose(f) != 0; /* the text is whole only once closed */
    shard_status s = failed || !text ? shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory for the --log summary")
                                     : shard_text_file_printf(log, "%s", text);
    free(text);
    return s;
}

/* A path the run will write (--log, --trace, --save): refused before any work when it is one of the run's
 * inputs (truncating a mapped token file kills the run and loses the data), when a file is wanted and a
 * directory stands there or the other way round, when its directory does not exist, or when no file can
 * be written there. */
static int same_file(const char *a, const char *b) {
    struct stat x, y;
    return a && b && stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static int check_output(const char *option, const char *path, int want_dir, const train_opts *o) {
    struct stat st;
    char parent[4096];
    if (stat(path, &st) == 0 && (S_ISDIR(st.st_mode) ? 1 : 0) != want_dir) {
        cli_error("%s %s: it exists and is %s; give %s", option, path, want_dir ? "not a directory" : "a directory",
                  want_dir ? "a directory (it is made when missing)" : "a file name");
        return 0;
    }
    /* --save may be --resume's root: a run goes on there */
    const char *inputs[] = {o->config, o->init, o->resume, o->plan_path};
    for (size_t i = 0; !want_dir && i < 4; i++)
        if (same_file(path, inputs[i])) {
            cli_error("%s %s is also the run's input %s: give another path", option, path, inputs[i]);
            return 0;
        }
    DIR *d = o->data && !want_dir ? opendir(o->data) : NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        char inside[8192];
        snprintf(inside, sizeof inside, "%s/%s", o->data, e->d_name);
        if (e->d_name[0] != '.' && same_file(path, inside)) {
            cli_error("%s %s is the run's data file %s: give another path", option, path, inside);
            closedir(d);
            return 0;
        }
    }
    if (d) closedir(d);
    shard_path_dir(path, parent, sizeof parent);
    if (!want_dir && (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))) {
        cli_error("%s %s: its directory %s does not exist; create it first", option, path, parent);
        return 0;
    }
    if (shard_dir_probe_writable(want_dir ? path : parent) < 0) { /* found now, not after the training */
        cli_error("%s %s: %s: give a path where files can be written", option, path, shard_last_error());
        return 0;
    }
    return 1;
}

/* The trainer's config from the flags. */
static shard_trainer_config trainer_config(const train_opts *o) {
    shard_trainer_config tc = cli_layout_trainer_config(&o->layout, o->config);
    tc.data_dir = o->data;
    tc.seed = o->seed;
    tc.sgd = (shard_sgd_config){.momentum = (float)o->momentum, .weight_decay = (float)o->weight_decay};
    tc.clip = (float)o->clip;
    tc.adamw.weight_decay = (float)o->weight_decay; /* whichever optimizer runs */
    tc.lr = (shard_lr_schedule){(float)o->lr, (float)(o->have_min_lr ? o->min_lr : o->lr / 10),
                                (uint64_t)(o->have_warmup ? o->warmup : (o->steps >= 20 ? o->steps / 20 : 0)),
                                (uint64_t)o->steps};
    return tc;
}

/* A training mesh's axes (text NULL: data over the world): its data ranks (data x expert: the rows'
 * split; 0 when the world is not known yet), its pipe size and whether it names a pipe or a tensor axis.
 * An axis training does not split over is refused unless it has one rank; `flag` names the flag. */
static shard_status mesh_axes(const char *flag, const char *text, int world, int *data, int *pipe, int *has_pipe,
                              int *tensor) {
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES], axes = 0, expert = 1;
    *data = text ? 1 : world, *pipe = 1, *has_pipe = 0, *tensor = 0;
    if (text && (axes = shard_mesh_parse(text, world, names, sizes)) < 0) return SHARD_ERR_INVALID_ARG;
    static const char *const trained[] = {"data", "expert", "tensor", "pipe"};
    for (int a = 0; a < axes; a++) {
        int known = 0;
        for (int k = 0; k < 4; k++) known |= strcmp(names[a], trained[k]) == 0;
        const char *near = shard_text_nearest(names[a], trained, 4);
        if (!known && sizes[a] > 1) /* an axis of one rank splits nothing: accepted, as the trainer does */
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "%s: axis '%s' = %d: training splits over 'data', 'expert', 'tensor' and "
                               "'pipe'%s%s%s; give %s=1 or leave it out",
                               flag, names[a], sizes[a], near ? " (did you mean '" : "", near ? near : "",
                               near ? "'?)" : "", names[a]);
        if (strcmp(names[a], "pipe") == 0) *pipe = sizes[a], *has_pipe = 1;
        if (strcmp(names[a], "tensor") == 0) *tensor = 1;
        if (strcmp(names[a], "data") == 0) *data = sizes[a];
        if (strcmp(names[a], "expert") == 0) expert = sizes[a];
    }
    *data *= expert; /* an expert rank is a data rank too: the rows split over data x expert */
    return SHARD_OK;
}

/* The trainer's config after --reshard-at: the run's, on the new mesh (with --reshard-zero's stage), for
 * the same global batch (global: the run's, resolved), the micro-batch derived again for the new data
 * ranks; the flags of a pipe axis whose size changed (the schedule, chunks, layers per stage) and the
 * batch shares (one per old data rank) at their defaults, and sequence parallelism off without a tensor
 * axis. */
static shard_trainer_config reshard_config(const train_opts *o, size_t global, int old_pipe, int new_pipe,
                                           int new_tensor) {
    train_opts n = *o;
    n.layout.mesh = o->reshard_mesh;
    if (o->reshard_zero >= 0) n.layout.zero = o->reshard_zero;
    n.layout.batch = (long)global, n.layout.micro_batch = 0, n.layout.batch_shares = NULL;
    if (new_pipe != old_pipe) n.layout.schedule = NULL, n.layout.virtual_stages = 0, n.layout.layers_per_stage = NULL;
    if (!new_tensor) n.layout.sequence_parallel = 0;
    return trainer_config(&n);
}

/* The run's global batch on `data` data ranks: --batch, else micro-batch x accum x data. */
static size_t global_batch(const train_opts *o, int data) {
    size_t K = o->layout.micro_batches ? (size_t)o->layout.micro_batches
        : o->layout.accum              ? (size_t)o->layout.accum
                                       : 1;
    return o->layout.batch ? (size_t)o->layout.batch : (size_t)o->layout.micro_batch * K * (size_t)data;
}

/* Collective, --resume with --reshard-at: the step of the checkpoint to resume (rank 0 reads it: a step_N
 * directory's, else the root's `latest`; 0 when neither says) and, when it is --reshard-at's step or
 * later, the trainer's config on --reshard-at's mesh as the move would have made it (*past 1). */
static shard_status resume_past_move(shard_comm *comm, const train_opts *o, uint64_t *at, int *past,
                                     shard_trainer_config *tc) {
    *at = 0, *past = 0;
    if (shard_comm_rank(comm) == 0) {
        char root[4096];
        snprintf(root, sizeof root, "%s", o->resume);
        for (size_t n = strlen(root); n > 1 && root[n - 1] == '/';) root[--n] = '\0';
        const char *base = strrchr(root, '/');
        if (!shard_ckpt_parse_step_name(base ? base + 1 : root, at) && !shard_ckpt_latest_step(root, at)) *at = 0;
    }
    SHARD_CHECK(shard_comm_broadcast(comm, at, sizeof *at, SHARD_U8, 0));
    if (*at < (uint64_t)o->reshard_step) return SHARD_OK;
    int world = shard_comm_size(comm), data = 0, pipe = 1, has_pipe = 0, tensor = 0, new_data = 0, new_pipe = 1;
    SHARD_CHECK(mesh_axes("--mesh", o->layout.mesh, world, &data, &pipe, &has_pipe, &tensor));
    SHARD_CHECK(mesh_axes("--reshard-at", o->reshard_mesh, world, &new_data, &new_pipe, &has_pipe, &tensor));
    *tc = reshard_config(o, global_batch(o, data), pipe, new_pipe, tensor);
    *past = 1;
    return SHARD_OK;
}

/* --reshard-at's mesh on the world (world 0: not known before the ranks) and the layout it makes, as the
 * trainer would refuse it: checked before the run so as not to fail at its step. */
static shard_status check_reshard(const train_opts *o, int world, int data, int pipe) {
    int new_data = 0, new_pipe = 1, has_pipe = 0, tensor = 0;
    if (o->reshard_step >= o->steps)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--reshard-at %s: the run's last step is %ld, and the move happens after step %ld: give a "
                           "step in 1..%ld",
                           o->reshard_at, o->steps, o->reshard_step, o->steps - 1);
    if (world > 0 && shard_mesh_parse(o->reshard_mesh, world, NULL, NULL) < 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "--reshard-at %s: %s (the new mesh spans the run's %d ranks)",
                           o->reshard_at, shard_last_error(), world);
    SHARD_CHECK(mesh_axes("--reshard-at", o->reshard_mesh, world, &new_data, &new_pipe, &has_pipe, &tensor));
    if (data <= 0 || new_data <= 0) return SHARD_OK; /* the ranks check the rest */
    shard_trainer_config tc = reshard_config(o, global_batch(o, data), pipe, new_pipe, tensor);
    shard_status s = shard_trainer_config_check(&tc, new_data, new_pipe);
    if (s < 0)
        return shard_error(s, "--reshard-at %s: the new layout is refused: %s", o->reshard_at, shard_last_error());
    return SHARD_OK;
}

/* The flags and the config, checked once on the calling thread before any rank starts (under an MPI
 * launch by every process, before the communicator exists): a mistake is one line without a rank number,
 * the same on every run.  What needs the ranks (the data, a checkpoint to resume) is theirs to check. */
static shard_status check_before_ranks(const train_opts *o, const cli_common *common) {
    char launcher[256] = "";
    int env_rank = -1, env_size = -1;
    int under_mpi = common->backend != SHARD_BACKEND_THREADS &&
        shard_launch_detect_mpi(launcher, sizeof launcher, &env_rank, &env_size);
    if (under_mpi && common->ranks > 1 && env_size > 0 && common->ranks != env_size)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--ranks %d: under an MPI launch (%s) mpirun's -np sets the ranks, and it started %d: "
                           "leave --ranks out, or start mpirun -np %d",
                           common->ranks, launcher, env_size, common->ranks);
    int world = under_mpi ? (env_size > 0 ? env_size : 0) : common->ranks > 0 ? common->ranks : 1;
    int pipe = 1, has_pipe = 0, tensor = 0, data = 0;
    SHARD_CHECK(mesh_axes("--mesh", o->layout.mesh, world, &data, &pipe, &has_pipe, &tensor));
    /* the pipeline's flags on a mesh without a pipe axis would act on nothing: a mistake in the command line
     * (the library accepts them there, so that one configuration serves a reference run of one stage) */
    const char *pipe_flag = o->layout.schedule ? "--schedule"
        : o->layout.virtual_stages > 0         ? "--virtual-stages"
        : o->layout.recompute                  ? "--recompute"
        : o->layout.layers_per_stage           ? "--layers-per-stage"
                                               : NULL;
    if (pipe_flag && pipe < 2)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s acts on a pipe axis of 2 or more ranks, and this mesh has %s: give "
                           "e.g. --mesh pipe=2, or leave %s out",
                           pipe_flag, has_pipe ? "pipe=1" : "none", pipe_flag);
    if (o->layout.sequence_parallel && !tensor)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--sequence-parallel splits the tokens over the tensor axis, and this mesh has none: "
                           "give e.g. --mesh data=1,tensor=2");
    if (data > 0) { /* the batch arithmetic and the pipeline's flags (unknown data ranks: the ranks check) */
        shard_trainer_config tc = trainer_config(o);
        SHARD_CHECK(shard_trainer_config_check(&tc, data, pipe));
    }
    if (o->reshard_at) SHARD_CHECK(check_reshard(o, world, data, pipe));
    SHARD_CHECK(shard_model_config_check(o->config)); /* read, then key by key */
    char *text = NULL; /* a GPT's positions against --seq, as its ranks would find (a config read above) */
    shard_gpt_config gc;
    shard_status read = shard_model_config_read(o->config, &text);
    /* only a GPT's config parses as one (the other kinds' keys are refused by it) */
    shard_status s = read == SHARD_OK && shard_gpt_config_parse(text, o->config, &gc) == SHARD_OK &&
            (size_t)o->layout.seq > gc.n_positions
        ? shard_error(SHARD_ERR_INVALID_ARG,
                      "%s: key 'n_positions' = %zu is shorter than --seq %ld: give --seq %zu or less", o->config,
                      gc.n_positions, o->layout.seq, gc.n_positions)
        : SHARD_OK;
    free(text);
    SHARD_CHECK(s);
    size_t len = o->init ? strlen(o->init) : 0, suffix = strlen(".index.json");
    if (o->init && !(len >= suffix && strcmp(o->init + len - suffix, ".index.json") == 0)) {
        /* the weights' file read once here too (an index's files are the ranks' to read): one that is not
         * safetensors is said once */
        shard_safetensors *f = NULL;
        SHARD_CHECK(shard_safetensors_open(o->init, &f));
        shard_safetensors_close(f);
    }
    return SHARD_OK;
}

/* A mixture of experts' fields of a --log line (NULL for a model without routers): the router losses,
 * the fraction of assignments dropped, and the expert load as a list per MoE layer. */
static shard_status routed_fields(const shard_step_result *r, char **out) {
    *out = NULL;
    if (!r->moe_layers) return SHARD_OK;
    size_t bytes = 128 + r->moe_layers * (4 + r->experts * 24);
    char *text = malloc(bytes);
    if (!text) return shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory for the --log line");
    size_t at = (size_t)snprintf(text, bytes,
                                 ", \"aux_loss\": %.7g, \"z_loss\": %.7g, \"dropped_tokens\": %.6g, "
                                 "\"expert_load\": [",
                                 r->aux_loss, r->z_loss, r->dropped_tokens);
    for (size_t l = 0; l < r->moe_layers; l++)
        for (size_t e = 0; e < r->experts; e++)
            at += (size_t)snprintf(text + at, bytes - at, "%s%s%.0f%s",
                                   e       ? ""
                                       : l ? ", "
                                           : "",
                                   e ? ", " : "[", r->expert_load[l * r->experts + e], e + 1 == r->experts ? "]" : "");
    snprintf(text + at, bytes - at, "]");
    *out = text;
    return SHARD_OK;
}

/* The run's expert load so far plus this step's (rank 0). */
static shard_status load_add(const shard_step_result *r, double **load, size_t *cells) {
    size_t n = r->moe_layers * r->experts;
    if (!n) return SHARD_OK;
    if (!*load && !(*load = calloc(n, sizeof **load)))
        return shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory for the expert load");
    *cells = n;
    for (size_t i = 0; i < n; i++) (*load)[i] += r->expert_load[i];
    return SHARD_OK;
}

/* The run's expert load: per MoE layer, each expert's share of the assignments routed. */
static void print_load(const shard_step_result *shape, const double *load) {
    printf("train: expert load over the run (share of the token-expert assignments each expert was routed)\n");
    for (size_t l = 0; l < shape->moe_layers; l++) {
        const double *row = load + l * shape->experts;
        double all = 0;
        for (size_t e = 0; e < shape->experts; e++) all += row[e];
        printf("  MoE layer %zu:", l);
        for (size_t e = 0; e < shape->experts; e++) printf(" e%zu %5.1f%%", e, all > 0 ? 100.0 * row[e] / all : 0.0);
        printf("  (%.0f assignments)\n", all);
    }
}

/* A resumed run's --log: the lines of steps after the checkpoint (an interrupted run went on past it)
 * are dropped, and so is a last line without its newline (a run killed while writing it), so the file
 * holds each step once, every line whole; an earlier run's summary record goes too (it may count steps
 * now dropped, and the resumed run ends the file with its own); the rest stays, and the run adds to it. */
static shard_status cut_log(const char *path, uint64_t done) {
    if (access(path, F_OK) != 0) return SHARD_OK; /* no earlier log: the run starts one */
    int fd = -1;
    SHARD_CHECK(shard_file_open(path, "cannot read the earlier --log", 0, &fd, NULL));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return shard_error(SHARD_ERR_NO_MEMORY, "--log %s: out of memory", path);
    }
    char *kept = NULL, *line = NULL;
    size_t used = 0, cap = 0, line_cap = 0;
    shard_status s = SHARD_OK;
    int cut = 0;
    for (ssize_t n; s == SHARD_OK && (n = getline(&line, &line_cap, f)) > 0;) {
        const char *at = strstr(line, "\"step\": ");
        if (line[n - 1] != '\n' || (at && strtoull(at + 8, NULL, 10) > done) ||
            strncmp(line, SUMMARY_START, strlen(SUMMARY_START)) == 0) {
            cut = 1;
            continue;
        }
        if (used + (size_t)n + 1 > cap) {
            char *more = realloc(kept, cap = 2 * (used + (size_t)n + 1));
            if (!more)
                s = shard_error(SHARD_ERR_NO_MEMORY, "--log %s: out of memory", path);
            else
                kept = more;
        }
        if (s == SHARD_OK) memcpy(kept + used, line, (size_t)n), used += (size_t)n;
    }
    if (s == SHARD_OK && ferror(f)) s = shard_error(SHARD_ERR_IO, "--log %s: cannot read: %s", path, strerror(errno));
    fclose(f);
    free(line);
    if (s == SHARD_OK && cut) s = shard_atomic_write_file(path, kept ? kept : "", used);
    free(kept);
    return s;
}

/* The run's end when rank 0 could not write step's --log line (why: the error, on rank 0): one line naming
 * the file and the reason, and where the step's checkpoint went (saved: the save's status) when --save was
 * given.  The other ranks stop with a status that does not hide rank 0's line. */
static shard_status log_failed(const train_opts *o, int rank, uint64_t step, shard_status saved, const char *why) {
    char ckpt[1024] = "";
    if (o->save && saved == SHARD_OK)
        snprintf(ckpt, sizeof ckpt, "; the step is saved in %s/step_%llu (--resume %s goes on from it)", o->save,
                 (unsigned long long)step, o->save);
    else if (o->save)
        snprintf(ckpt, sizeof ckpt, "; its checkpoint could not be saved either: %s", shard_last_error());
    if (rank != 0)
        return shard_error(SHARD_ERR_ABORTED, "--log %s: rank 0 could not write it; the run stopped after step %llu",
                           o->log, (unsigned long long)step);
    return shard_error(SHARD_ERR_IO, "--log %s; the run stopped after step %llu%s", why, (unsigned long long)step,
                       ckpt);
}

/* One more step time kept (rank 0 under --plan). */
static shard_status keep_step_ms(double **all, size_t *count, double ms) {
    if (*count == 0 || (*count >= 64 && (*count & (*count - 1)) == 0)) { /* full: room for as many again */
        double *more = realloc(*all, (*count ? 2 * *count : 64) * sizeof **all);
        if (!more) return shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory for the step times");
        *all = more;
    }
    (*all)[(*count)++] = ms;
    return SHARD_OK;
}

/* A mesh's size along the named axis (1 without it). */
static int axis_size(const shard_mesh *mesh, const char *name) {
    int a = shard_mesh_axis_index(mesh, name);
    return a < 0 ? 1 : shard_mesh_axis_size(mesh, a);
}

static shard_status log_record(shard_comm *comm, const train_opts *o, shard_text_file *log, uint64_t step,
                               const char *record);

/* One of --adaptive's turns after a step (a check, or a live move's advance): the call, then for a move
 * the new trainer's trace and the phase it starts, then the decision's --log record. */
typedef shard_status (*adaptive_call)(train_adaptive *a, shard_comm *comm, uint64_t step, shard_mesh **mesh,
                                      shard_trainer **t, char **record);
static shard_status adaptive_turn(adaptive_call call, train_adaptive *a, shard_comm *comm, const train_opts *o,
                                  shard_text_file *log, uint64_t step, shard_mesh **mesh, shard_trainer **t,
                                  train_phases *phases) {
    shard_trainer *was = *t;
    char *record = NULL;
    shard_status s = call(a, comm, step, mesh, t, &record);
    if (s == SHARD_OK && *t != was && o->trace) s = shard_trainer_trace(*t, 1);
    if (*t != was) train_phases_moved(phases, step);
    if (s == SHARD_OK) s = log_record(comm, o, log, step, record);
    free(record);
    return s;
}

/* --migration live (TRAIN_LIVE_STEPS, train_adaptive.h): after the step the move begins at, the new
 * trainer is built; after the next, the copy is planned; after each of the next 4, a quarter of the
 * state goes, with the gradients of what went before; the switch follows the last (step STEP + 5;
 * sooner when the run ends first).  Spread so, no step boundary waits for more than one part, and the
 * old and new state live together for few steps. */

/* The steps a live move spans: --live-steps, or TRAIN_LIVE_STEPS. */
static int live_steps(const train_opts *o) { return o->live_steps > 0 ? (int)o->live_steps : TRAIN_LIVE_STEPS; }

/* A --reshard-at move under way (live: from its begin to its switch). */
typedef struct reshard_move {
    shard_migration *live; /* NULL: none under way */
    shard_mesh *next;
    uint64_t begun, switch_at;
    char from[128];
} reshard_move;

/* Collective: --reshard-at's new mesh and the trainer's config on it, into mv->next and *tc. */
static shard_status reshard_target(shard_comm *comm, const train_opts *o, shard_mesh *mesh, shard_trainer *t,
                                   reshard_move *mv, shard_trainer_config *tc) {
    size_t B = 0, micro = 0, K = 0, D = 0;
    shard_trainer_batch(t, &B, &micro, &K, &D);
    shard_mesh_string(mesh, mv->from, sizeof mv->from);
    SHARD_CHECK(shard_mesh_create(comm, o->reshard_mesh, &mv->next));
    *tc = reshard_config(o, B, axis_size(mesh, "pipe"), axis_size(mv->next, "pipe"),
                         shard_mesh_axis_index(mv->next, "tensor") >= 0);
    return SHARD_OK;
}

/* Collective: a move that failed (live: at its begin, an advance or its switch) leaves the run on its
 * layout: rank 0 prints one line saying why and writes it in a --log record with failed true; mv->next is
 * destroyed on every rank. */
static shard_status reshard_failed(shard_comm *comm, const train_opts *o, uint64_t step, shard_text_file *log,
                                   reshard_move *mv, int live) {
    int rank = shard_comm_rank(comm);
    char to[128] = "", line[1024], reason[1200], record[2048] = "";
    if (mv->next) shard_mesh_string(mv->next, to, sizeof to);
    long zero_to = o->reshard_zero >= 0 ? o->reshard_zero : o->layout.zero;
    if (rank == 0) {
        snprintf(line, sizeof line, "reshard: step %llu: %s; the run goes on as %s zero=%ld", (unsigned long long)step,
                 shard_last_error(), mv->from, o->layout.zero);
        fprintf(stderr, "shard: %s\n", line);
        snprintf(record, sizeof record,
                 "{\"event\": \"reshard\", \"step\": %llu, \"failed\": true, \"reason\": %s, \"from\": \"%s\", "
                 "\"to\": \"%s\", \"zero_from\": %ld, \"zero_to\": %ld, \"migration\": \"%s\", \"trigger\": "
                 "\"reshard-at\"}\n",
                 (unsigned long long)step, cli_json_string(line, reason, sizeof reason), mv->from,
                 to[0] ? to : o->reshard_mesh, o->layout.zero, zero_to, live ? "live" : "stop-and-copy");
    }
    shard_mesh_destroy(mv->next);
    mv->next = NULL, mv->live = NULL;
    return log_record(comm, o, log, step, rank == 0 ? record : NULL);
}

/* Collective: the run is on mv->next (*mesh and *t become the new ones); rank 0 prints one line and
 * writes the --log record. */
static shard_status reshard_done(shard_comm *comm, const train_opts *o, uint64_t step, shard_text_file *log,
                                 reshard_move *mv, shard_mesh **mesh, shard_trainer **t, shard_trainer *moved,
                                 const shard_migration_stats *st, int live) {
    int rank = shard_comm_rank(comm);
    shard_mesh_destroy(*mesh);
    *mesh = mv->next, *t = moved;
    mv->next = NULL, mv->live = NULL;
    if (o->trace) SHARD_CHECK(shard_trainer_trace(moved, 1));
    char to[128], how[160], record[1024] = "";
    shard_mesh_string(*mesh, to, sizeof to);
    long zero_to = o->reshard_zero >= 0 ? o->reshard_zero : o->layout.zero;
    if (live)
        snprintf(how, sizeof how,
                 "live over steps %llu-%llu: pause %.1f ms at most (%.1f ms added to steps in all), %.1f ms",
                 (unsigned long long)mv->begun, (unsigned long long)step, st->longest_ms, st->added_ms, st->ms);
    else
        snprintf(how, sizeof how, "stop-and-copy: %.1f ms", st->ms);
    if (rank == 0) {
        printf("reshard: step %llu, %s -> %s zero=%ld -> %ld, %s, %.1f MiB moved\n", (unsigned long long)step, mv->from,
               to, o->layout.zero, zero_to, how, (double)st->bytes / 1048576.0);
        fflush(stdout);
        snprintf(record, sizeof record,
                 "{\"event\": \"reshard\", \"step\": %llu, \"from\": \"%s\", \"to\": \"%s\", "
                 "\"zero_from\": %ld, \"zero_to\": %ld, \"migration\": \"%s\", "
                 "\"trigger\": \"reshard-at\", \"migration_ms\": %.3f, \"bytes\": %llu, \"pause_ms\": %.3f, "
                 "\"added_ms\": %.3f}\n",
                 (unsigned long long)step, mv->from, to, o->layout.zero, zero_to, live ? "live" : "stop-and-copy",
                 st->ms, (unsigned long long)st->bytes, st->longest_ms, st->added_ms);
    }
    return log_record(comm, o, log, step, rank == 0 ? record : NULL);
}

/* Collective, after step: the --reshard-at move's part at this step.  Stop-and-copy moves at
 * --reshard-at's step; live begins there, advances after each step after it and switches at
 * mv->switch_at.  A migration that fails leaves the run on its layout with one line saying why; a
 * record that cannot be written stops the run, as a step's line does. */
static shard_status reshard(shard_comm *comm, const train_opts *o, uint64_t step, uint64_t last, shard_text_file *log,
                            reshard_move *mv, shard_mesh **mesh, shard_trainer **t) {
    int live = o->migration && strcmp(o->migration, "live") == 0;
    shard_migration_stats st = {.struct_size = sizeof st};
    shard_trainer *moved = NULL;
    if (step == (uint64_t)o->reshard_step) {
        shard_trainer_config tc;
        SHARD_CHECK(reshard_target(comm, o, *mesh, *t, mv, &tc));
        if (!live) {
            if (shard_trainer_migrate(*t, mv->next, &tc, &moved, &st) < 0)
                return reshard_failed(comm, o, step, log, mv, 0);
            return reshard_done(comm, o, step, log, mv, mesh, t, moved, &st, 0);
        }
        mv->begun = step;
        uint64_t span = (uint64_t)live_steps(o);
        mv->switch_at = step + span < last ? step + span : last - 1;
        if (shard_trainer_migrate_begin(*t, mv->next, &tc, (size_t)span, &mv->live) < 0)
            return reshard_failed(comm, o, step, log, mv, 1);
    } else if (!mv->live)
        return SHARD_OK;
    else if (shard_migration_advance(mv->live, *t) < 0)
        return reshard_failed(comm, o, step, log, mv, 1);
    if (step < mv->switch_at) return SHARD_OK;
    if (shard_migration_finish(mv->live, *t, &moved, &st) < 0) return reshard_failed(comm, o, step, log, mv, 1);
    return reshard_done(comm, o, step, log, mv, mesh, t, moved, &st, 1);
}

/* Collective under --log: rank 0 writes record (NULL: none) to the --log; a record that cannot be written
 * stops the run on every rank, as a step's line does. */
static shard_status log_record(shard_comm *comm, const train_opts *o, shard_text_file *log, uint64_t step,
                               const char *record) {
    int rank = shard_comm_rank(comm);
    int32_t logged = 1;
    char why[512] = "";
    if (rank == 0 && log && record && shard_text_file_printf(log, "%s", record) < 0)
        logged = 0, snprintf(why, sizeof why, "%s", shard_last_error());
    if (o->log) SHARD_CHECK(shard_comm_broadcast(comm, &logged, 1, SHARD_I32, 0));
    if (logged) return SHARD_OK;
    if (rank != 0)
        return shard_error(SHARD_ERR_ABORTED, "--log %s: rank 0 could not write it; the run stopped after step %llu",
                           o->log, (unsigned long long)step);
    return shard_error(SHARD_ERR_IO, "--log %s; the run stopped after step %llu", why, (unsigned long long)step);
}

/* Collective under --log with a --cluster whose nodes change: for each node holding one of the run's ranks
 * whose slowdown or memory at `step` differs from the step before (a "changes" entry reaching its at_step;
 * the emulation says it in its "cluster: step N: node ..." line), rank 0 writes one record per changed
 * figure.  Step 1 is the cluster as the run starts: no record. */
static shard_status log_cluster_changes(shard_comm *comm, const train_opts *o, shard_text_file *log, uint64_t step) {
    if (!o->log || !o->cluster || step < 2 || !shard_cluster_has_changes(o->cluster)) return SHARD_OK;
    int world = shard_comm_size(comm), rank = shard_comm_rank(comm);
    for (int r = 0; r < world && r < shard_cluster_ranks(o->cluster); r++) {
        shard_cluster_device was, now, other;
        SHARD_CHECK(shard_cluster_device_at(o->cluster, r, step - 1, &was));
        SHARD_CHECK(shard_cluster_device_at(o->cluster, r, step, &now));
        int seen = 0; /* its node said already, for an earlier rank */
        for (int q = 0; q < r && !seen; q++)
            seen =
                shard_cluster_device_at(o->cluster, q, step, &other) == SHARD_OK && other.node_index == now.node_index;
        char name[300], record[512];
        cli_json_string(now.node, name, sizeof name);
        if (!seen && was.slowdown != now.slowdown) {
            snprintf(record, sizeof record,
                     "{\"event\": \"cluster_change\", \"step\": %llu, \"node\": %s, \"slowdown\": %.6g}\n",
                     (unsigned long long)step, name, now.slowdown);
            SHARD_CHECK(log_record(comm, o, log, step, rank == 0 ? record : NULL));
        }
        if (!seen && was.memory_bytes != now.memory_bytes) {
            snprintf(record, sizeof record,
                     "{\"event\": \"cluster_change\", \"step\": %llu, \"node\": %s, \"available_memory_gb\": "
                     "%.6g}\n",
                     (unsigned long long)step, name, now.memory_bytes / 1073741824.0);
            SHARD_CHECK(log_record(comm, o, log, step, rank == 0 ? record : NULL));
        }
    }
    return SHARD_OK;
}

static shard_status train_rank(shard_comm *comm, void *arg) {
    const train_opts *o = arg;
    int rank = shard_comm_rank(comm), world = shard_comm_size(comm);
    char mesh_text[64];
    snprintf(mesh_text, sizeof mesh_text, "data=%d", world);
    shard_trainer_config tc = trainer_config(o);
    uint64_t resumed_at = 0;
    int past_move = 0; /* resumed at --reshard-at's step or later: the run starts on the layout it moved to */
    if (o->resume && o->reshard_at) SHARD_CHECK(resume_past_move(comm, o, &resumed_at, &past_move, &tc));
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_mesh_create(comm,
                                  past_move            ? o->reshard_mesh
                                      : o->layout.mesh ? o->layout.mesh
                                                       : mesh_text,
                                  &mesh));
    /* under an MPI launcher rank 0 takes the --save root's lock once MPI is up: a process that ended before
     * MPI_Init would leave its peers waiting in theirs */
    shard_ckpt_lock *own_lock = NULL;
    if (o->lock_in_rank && rank == 0) {
        shard_status refused = shard_ckpt_lock_acquire(o->save, "--save", stderr, &own_lock);
        if (refused < 0) {
            shard_mesh_destroy(mesh);
            return refused;
        }
    }
    shard_ckpt_lock *lock = o->lock ? o->lock : own_lock;
    shard_trainer *t = NULL;
    shard_text_file *log = NULL;
    char *config_text = NULL;
    uint64_t first = 1;
    shard_status s = shard_trainer_create(mesh, &tc, &t);
    shard_model *m = t ? shard_trainer_model(t) : NULL;
    if (s == SHARD_OK && o->init) s = shard_trainer_load_weights(t, o->init); /* every parameter, by name */
    if (s == SHARD_OK && o->resume) {
        uint64_t done = 0;
        s = shard_trainer_resume(t, o->resume, &done);
        first = done + 1;
        if (s == SHARD_OK && first > (uint64_t)o->steps)
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "--steps %ld: the checkpoint in %s is at step %llu already; give --steps "
                            "%llu or more",
                            o->steps, o->resume, (unsigned long long)done, (unsigned long long)done + 1);
        char differ[1024];
        if (s == SHARD_OK && rank == 0 &&
            shard_trainer_resume_differences(t, o->resume, done, differ, sizeof differ) == SHARD_OK && differ[0])
            fprintf(stderr,
                    "train: warning: resuming with settings other than the checkpoint's: %s; the run will not "
                    "match one that was never interrupted\n",
                    differ);
    }
    /* what would fail after the training, found before it: a step directory --save would overwrite, a trace
     */
    uint64_t every = o->save_every > 0 ? (uint64_t)o->save_every : 0, last = (uint64_t)o->steps;
    if (s == SHARD_OK && o->save)
        s = shard_ckpt_save_check(o->save, first, last, every, o->resume != NULL, rank == 0 ? stderr : NULL);
    if (s == SHARD_OK && o->trace) s = shard_trainer_trace(t, 1);
    if (s == SHARD_OK && o->save) s = shard_model_config_read(o->config, &config_text);
    if (s == SHARD_OK && o->resume && o->log && rank == 0) s = cut_log(o->log, first - 1); /* once nothing can refuse */
    char log_error[512] = ""; /* rank 0: why --log could not be written */
    if (s == SHARD_OK && rank == 0 && o->log &&
        shard_text_file_open(o->log, o->resume != NULL, &log) < 0) { /* a resumed run adds */
        snprintf(log_error, sizeof log_error, "%s", shard_last_error());
        s = shard_error(SHARD_ERR_IO, "--log %s", log_error);
    }
    int tty = rank == 0 && isatty(STDOUT_FILENO);
    reshard_move move = {0};
    size_t B = 0, micro = 0, K = 0, D = 0;
    if (t) shard_trainer_batch(t, &B, &micro, &K, &D);
    double started = shard_clock_seconds(), first_loss = 0, last_loss = 0, tokens_done = 0;
    double *load = NULL; /* rank 0, a mixture of experts: the run's assignments per layer and expert */
    size_t load_cells = 0;
    shard_step_result load_shape = {0};
    double *step_ms = NULL; /* rank 0 under --plan or --log: each step's time */
    size_t step_count = 0;
    size_t items_per_row = strcmp(m ? m->ops->kind : "", "gpt2") == 0 ? (size_t)o->layout.seq : 1;
    if (s == SHARD_OK && rank == 0) {
        char what[256], mesh_str[128];
        m->ops->describe(m, what, sizeof what);
        shard_mesh_string(mesh, mesh_str, sizeof mesh_str);
        char split_str[160]; /* an uneven split gives some ranks one row fewer: say so rather than a wrong product */
        if (micro * K * D == B)
            snprintf(split_str, sizeof split_str, "micro-batch %zu x accum %zu x data %zu", micro, K, D);
        else
            snprintf(split_str, sizeof split_str, "accum %zu x data %zu slices of %zu-%zu rows (split unevenly)", K, D,
                     B / (K * D), micro);
        printf("train: %s\n  mesh %s (%s), zero %ld, compute %s, gradients sent as %s; global batch %zu = %s; %ld "
               "steps%s\n"
               "  blas: %s\n",
               what, mesh_str, shard_comm_backend(comm), (long)tc.zero,
               tc.compute_dtype == SHARD_BF16 ? "bf16 (f32 masters)" : "f32",
               tc.grad_dtype == SHARD_BF16 ? "bf16" : "f32", B, split_str, o->steps, o->resume ? " (resumed)" : "",
               shard_blas_description());
        if (past_move)
            printf("train: --reshard-at %s: the checkpoint is at step %llu, past the move: the run resumes on %s "
                   "zero=%d\n",
                   o->reshard_at, (unsigned long long)resumed_at, mesh_str, tc.zero);
        if (o->print_specs) print_specs(m);
        if (o->layout.specs[0] &&
            shard_mesh_axis_index(mesh, "tensor") < 0) /* valid, and placing nothing: said, not silent */
            fprintf(stderr, "shard: note: --spec has no effect here: this mesh has no tensor axis to place over\n");
        shard_trainer_print_schedule(t, stdout);
    }
    /* from the first step on, SIGTERM and SIGINT end the run after a step (before it, the default action
     * loses nothing and ends a process that waits, e.g. for peers that never came): one handler per process */
    int catches = rank == 0 || strcmp(shard_comm_backend(comm), "threads") != 0, stopped = 0;
    if (catches) train_stop_catch(lock, o->save);
    train_adaptive adaptive = {0};
    train_phases phases = {.moves = 0};
    if (s == SHARD_OK && o->adaptive) { /* the layout as the plans describe it: the global batch resolved */
        shard_trainer_config now = tc;
        now.batch = B, now.micro_batch = 0;
        train_adaptive_start(&adaptive, o->thresholds, o->monitor_every, o->cluster, &now,
                             o->layout.mesh ? o->layout.mesh : mesh_text);
        adaptive.live = o->migration && strcmp(o->migration, "live") == 0, adaptive.last = last;
        adaptive.live_steps = live_steps(o);
    }
    for (uint64_t step = first; step <= (uint64_t)o->steps && s == SHARD_OK; step++) {
        int why = 0; /* a signal, or the lock lost: every rank stops before the same step */
        s = train_stop_agree(comm, rank == 0 ? lock : NULL, &why);
        if (s == SHARD_OK && why) {
            s = train_stop_finish(comm, t, why, first, step - 1, o->save, every, config_text, lock);
            stopped = 1;
            break;
        }
        shard_step_result r;
        if (s == SHARD_OK) s = log_cluster_changes(comm, o, log, step);
        if (s == SHARD_OK) s = shard_trainer_step(t, step, &r);
        if (s < 0) break;
        if (!isfinite(r.loss)) {
            s = shard_error(SHARD_ERR_INTERNAL, "train: the loss became %g at step %llu (try a lower --lr)", r.loss,
                            (unsigned long long)step);
            break;
        }
        double tps = (double)(B * items_per_row) / (r.ms / 1e3);
        if (rank == 0 && (s = keep_step_ms(&step_ms, &step_count, r.ms)) < 0) break;
        if (step == first) first_loss = r.loss;
        last_loss = r.loss, tokens_done += (double)(B * items_per_row);
        int32_t logged = 1;    /* rank 0 writes the line; every rank learns whether it could, to stop together */
        char *routed = NULL;   /* a mixture of experts' fields of the line ("" for a dense model) */
        char *per_rank = NULL; /* rank 0: the line's `ranks` list */
        if (s == SHARD_OK && o->log) s = cli_monitor_ranks_json(comm, t, &per_rank);
        if (s == SHARD_OK && rank == 0) s = routed_fields(&r, &routed);
        if (s == SHARD_OK && rank == 0) s = load_add(&r, &load, &load_cells), load_shape = r;
        if (s < 0) break;
        if (log &&
            shard_text_file_printf(log,
                                   "{\"step\": %llu, \"loss\": %.7f, \"lr\": %.6g, \"grad_norm\": %.6g, "
                                   "\"tokens_per_s\": %.1f, \"ms\": %.3f, \"comm_wait_ms\": %.3f%s, %s}\n",
                                   (unsigned long long)step, r.loss, r.lr, r.grad_norm, tps, r.ms, r.exposed_comm_ms,
                                   routed ? routed : "", per_rank ? per_rank : "\"ranks\": []") < 0)
            logged = 0, snprintf(log_error, sizeof log_error, "%s", shard_last_error());
        free(routed);
        free(per_rank);
        if (o->log && (s = shard_comm_broadcast(comm, &logged, 1, SHARD_I32, 0)) < 0) break;
        if (rank == 0) cli_progress(tty, (long)step, o->steps, (float)r.loss, r.lr, tps, r.ms);
        if (world > 1 &&
            (o->monitor_every ? step % (uint64_t)o->monitor_every == 0 : cli_progress_due((long)step, o->steps))) {
            if (tty) printf("\n");
            if ((s = cli_monitor_line(comm, mesh, t)) < 0) break;
        }
        if (o->save &&
            ((o->save_every > 0 && step % (uint64_t)o->save_every == 0) || step == (uint64_t)o->steps ||
             !logged)) /* a log that cannot be written stops the run, its last step saved first */
            s = shard_trainer_save(t, o->save, step, config_text);
        if (!logged) {
            s = log_failed(o, rank, step, s, log_error);
            break;
        }
        if (o->reshard_at && !past_move && step >= (uint64_t)o->reshard_step && step < last) {
            if (tty && (step == (uint64_t)o->reshard_step || step == move.switch_at)) printf("\n");
            shard_trainer *was = t;
            if ((s = reshard(comm, o, step, last, log, &move, &mesh, &t)) < 0) break;
            if (t != was) train_phases_moved(&phases, step);
            m = shard_trainer_model(t);
        }
        if (o->adaptive && (s = train_adaptive_record(&adaptive, t)) < 0) break;
        if (o->adaptive && adaptive.moving) {
            if (tty && step == adaptive.switch_at) printf("\n");
            s = adaptive_turn(train_adaptive_advance, &adaptive, comm, o, log, step, &mesh, &t, &phases);
            if (s < 0) break;
            m = shard_trainer_model(t);
        }
        if (o->adaptive && step % adaptive.every == 0 && step < last) {
            if (tty) printf("\n");
            s = adaptive_turn(train_adaptive_check, &adaptive, comm, o, log, step, &mesh, &t, &phases);
            if (s < 0) break;
            m = shard_trainer_model(t);
        }
    }
    if (tty) printf("\n");
    if (s == SHARD_OK && !stopped && rank == 0 && load) print_load(&load_shape, load);
    free(load);
    double *peaks = NULL;
    if (s == SHARD_OK && !stopped && (world > 1 || o->plan || o->log)) s = gather_peaks(comm, &peaks);
    if (s == SHARD_OK && !stopped && world > 1 && rank == 0) print_memory(mesh, peaks, world);
    if (s == SHARD_OK && !stopped && o->plan && rank == 0) report_plan(o, mesh, step_ms, step_count, peaks, world);
    if (s == SHARD_OK && !stopped && rank == 0)
        train_phases_print(&phases, step_ms, first, step_count, o->cluster_path);
    if (s == SHARD_OK && !stopped && o->trace) { /* the last step as it ran */
        s = cli_write_trace(comm, mesh, t, o->trace);
        if (s == SHARD_OK && rank == 0)
            printf("train: the last step's trace in %s (chrome://tracing, ui.perfetto.dev)\n", o->trace);
    }
    if (s == SHARD_OK && !stopped && log) { /* rank 0 alone, after the last collective */
        s = log_summary(log, o, first, step_ms, step_count, (double)(B * items_per_row), last_loss, peaks, world);
        if (s < 0) {
            snprintf(log_error, sizeof log_error, "%s", shard_last_error());
            s = shard_error(s, "--log %s", log_error);
        }
    }
    free(peaks);
    free(step_ms);
    if (log) { /* before the last line: a log that did not reach the disk whole is not a success */
        shard_status closed = shard_text_file_close(log);
        if (closed < 0) snprintf(log_error, sizeof log_error, "%s", shard_last_error());
        if (s == SHARD_OK && closed < 0) s = shard_error(closed, "--log %s", log_error);
    }
    if (s == SHARD_OK && !stopped && rank == 0)
        printf("train: %ld steps in %.1f s, loss %.4f -> %.4f, %.0f %s/s on average%s%s\n", o->steps - (long)first + 1,
               shard_clock_seconds() - started, first_loss, last_loss, tokens_done / (shard_clock_seconds() - started),
               items_per_row > 1 ? "tokens" : "rows", o->save ? ", checkpoint in " : "", o->save ? o->save : "");
    free(config_text);
    shard_migration_cancel(move.live, t); /* a run that stopped before a live move's switch */
    if (o->adaptive) train_adaptive_end(&adaptive, t);
    shard_mesh_destroy(move.next);
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    if (catches) train_stop_end();
    shard_ckpt_lock_release(own_lock);
    return s;
}

/* Grouped as a user looks for them; a new option goes in its group, one line (and a wrapped one) each. */
static const char *const USAGE =
    "usage: shard train --config CONFIG.json [--data DIR] [options]\n"
    "\n"
    "Train the config's model (model_type gpt2, cnn or mlp) on a mesh of ranks with data, tensor and pipe\n"
    "axes: a progress line every ~5 % of the steps (a bar on a terminal), each rank's peak memory at the\n"
    "end.  The same settings train the same model on 1 or N ranks.\n"
    "\n"
    "model and data:\n"
    "  --config FILE            the model's config JSON (required)\n"
    "  --data DIR               the training data: a GPT's token files (shard data text; required for\n"
    "                           gpt2), the CNN's Fashion-MNIST files (default\n"
    "                           /usr/share/datasets/fashion-mnist); the MLP generates its rows, takes none\n"
    "  --init FILE              start from these weights, a .safetensors file, every parameter by name\n"
    "                           (default: initialised from --seed)\n"
    "  --resume DIR             continue a checkpoint (a --save root or a step_N directory), on any mesh\n"
    "                           and ZeRO stage\n"
    "  --seed S                 initialisation, data order and dropout, 0..2^62 (default 1)\n"
    "steps and batch (global batch = micro-batch x accum x data ranks; given two, the third follows):\n"
    "  --steps N                the last step: a fresh run trains N, a resumed one goes on to N, 1..2^40\n"
    "                           (default 100)\n"
    "  --batch B                global rows per step, 1..1048576 (default 8 without --micro-batch)\n"
    "  --micro-batch M          rows per rank per micro-step, 1..1048576 (default: derived)\n"
    "  --accum K                micro-steps per step (gradient accumulation), 1..1048576 (default:\n"
    "                           derived, else 1)\n"
    "  --seq T                  tokens per row (the GPT), 1..1048576 (default 128)\n"
    "optimizer and learning rate (warm-up, then cosine decay to --min-lr):\n"
    "  --optimizer NAME         adamw (torch.optim.AdamW: betas 0.9, 0.999, eps 1e-8) or sgd\n"
    "                           (torch.optim.SGD) (default adamw)\n"
    "  --momentum M             sgd's momentum, [0, 1e6] (default 0: plain SGD); refused with adamw\n"
    "  --lr X                   the peak learning rate, (0, 1e6] (default 1e-3)\n"
    "  --min-lr X               the learning rate at the end, [0, --lr] (default --lr / 10)\n"
    "  --warmup W               warm-up steps, 0..2^40 (default --steps / 20 from 20 steps, else 0)\n"
    "  --weight-decay X         weight decay, [0, 1e6]: AdamW's decoupled, SGD's added to the gradient\n"
    "                           (default 0.1)\n"
    "  --clip X                 the most global gradient norm, [0, 1e6]; 0: no clipping (default 1.0)\n"
    "mesh and parallelism:\n"
    "  --plan FILE              run the layout a plan file names (shard plan --out): its mesh, flags,\n"
    "                           layers per stage, batch shares and device map (with --cluster); a layout\n"
    "                           flag given too must agree with it; at the end the plan's predicted step\n"
    "                           time and peak memory against the run's\n"
    "  --mesh MESH              axes data, tensor and pipe, e.g. data=2,tensor=2 or data=1,pipe=4\n"
    "                           (default data=N over the ranks)\n"
    "  --zero K                 the ZeRO stage on the data axis, 0..3: 0 plain data parallel, 3 FSDP\n"
    "                           (default 0)\n"
    "  --bucket-mb M            the gradient bucket size in MiB, (0, 1e6] (default 25)\n"
    "  --grad-dtype D           gradients sent as f32 or bf16 (default f32)\n"
    "  --compute-dtype D        f32, or bf16 compute copies of f32 master values (default f32)\n"
    "  --sequence-parallel      with a tensor axis: LayerNorm, dropout and residual regions split over\n"
    "                           the tokens (default off)\n"
    "  --spec NAME=SPEC         a GPT parameter's placement on the tensor axis, repeatable; NAME may hold\n"
    "                           *, e.g. --spec 'h.*.mlp.*=P()' (default Megatron's: heads, MLP columns\n"
    "                           and the vocabulary split)\n"
    "  --print-specs            list every parameter's placement at the start\n"
    "pipeline (a pipe axis of 2 or more ranks):\n"
    "  --schedule S             gpipe, 1f1b or interleaved (default gpipe)\n"
    "  --micro-batches M        micro-batches per step, 1..65536, the same as --accum (default --accum)\n"
    "  --virtual-stages V       chunks per rank with interleaved, 1..16 (default 1)\n"
    "  --recompute              recompute each stage's forward in its backward instead of keeping its\n"
    "                           activations (default off)\n"
    "  --layers-per-stage L     blocks per stage, e.g. 3,3,2, or balanced (cut on measured times)\n"
    "                           (default: even, the remainder on the first stages)\n"
    "  --batch-shares LIST      rows of the global batch per data rank, e.g. 6,2 (summing to --batch;\n"
    "                           default: even): faster devices take more; the loss is still the global\n"
    "                           batch's mean\n"
    "  --trace FILE             the last step as a Chrome trace / Perfetto JSON file: a process per\n"
    "                           rank, compute per unit, every collective with its axis and bytes\n"
    "resharding (the run moves to another layout of the same ranks, its losses unchanged):\n"
    "  --reshard-at STEP:MESH   after step STEP, move the parameters and the optimizer's state to the\n"
    "                           mesh MESH over the communicator, e.g. 10:data=2,pipe=2; the new\n"
    "                           layout's pipeline flags at their defaults, the global batch kept\n"
    "  --reshard-zero Z         the ZeRO stage after the move, 0..3 (default: --zero's)\n"
    "  --migration MODE         how the state moves (--reshard-at, --adaptive): stop-and-copy, the\n"
    "                           training paused while it moves (default), or live: the state sent\n"
    "                           over the next --live-steps steps while training goes on, each step's\n"
    "                           gradients replayed on the copy, the switch after the last (--adaptive's\n"
    "                           memory trigger still stops and copies: no room for a second copy)\n"
    "  --live-steps N           the steps a live move spans, 1..64 (default 5): after the first the\n"
    "                           plan, after each other one piece of the state; more, smaller pieces\n"
    "  --adaptive               every --monitor-every steps (default 10) check the monitor's figures of\n"
    "                           those steps against --reshard-on's thresholds; one crossed at two checks\n"
    "                           in a row re-plans on the --cluster's devices at their measured speeds,\n"
    "                           and a plan predicted 10 %% faster or more is moved to (stop-and-copy)\n"
    "  --reshard-on LIST        the triggers --adaptive watches and their thresholds: imbalance (max/mean\n"
    "                           - 1 of the ranks' compute, (0, 100]), memory (peak / the device's\n"
    "                           memory, (0, 1]), comm (exposed communication / step time, (0, 1])\n"
    "                           (default imbalance=0.25,memory=0.9,comm=0.4)\n"
    "output:\n"
    "  --log FILE               a JSON line per step (step, loss, lr, grad_norm, tokens_per_s, ms,\n"
    "                           comm_wait_ms, and ranks: each rank's compute_ms, comm_ms by axis,\n"
    "                           comm_bytes sent by axis and all_to_all_bytes (the part of them its\n"
    "                           all_to_alls sent: analyze --measured reads `expert`'s), wait_ms,\n"
    "                           optimizer_ms, peak_bytes by category), and at the end a summary\n"
    "                           ({\"event\": \"summary\"}: steps, median step ms, tokens/s, final loss, each\n"
    "                           rank's peak bytes, a --plan's predictions); a resumed run adds to it\n"
    "  --monitor-every K        every K steps, with 2 or more ranks, a line of the imbalance of compute\n"
    "                           over the ranks and the slowest rank, 1..2^40 (default: with the\n"
    "                           progress line)\n"
    "  --save DIR               a checkpoint (values, AdamW's moments, the config) at the end, and at\n"
    "                           SIGTERM / SIGINT after the step under way (exit 143 / 130); one run\n"
    "                           at a time writes DIR (DIR/writer.lock)\n"
    "  --save-every K           also one every K steps, 0..2^40; 0: at the end only (default 0)\n"
    "ranks:\n"
    "  --ranks N                ranks, 1..4096 (default: the mesh's size, else 1; under mpirun the\n"
    "                           launcher's)\n";

/* The flags read (and a plan's layout taken): what is checked before the ranks start, then the run. */
static int train_checked(train_opts *o, cli_common *common) {
    if (!o->layout.batch && !o->layout.micro_batch) o->layout.batch = 8;
    if (o->have_min_lr && o->min_lr > o->lr) {
        cli_error("--min-lr %g is above --lr %g: the schedule decays from --lr down to --min-lr", o->min_lr, o->lr);
        return 2;
    }
    if (o->reshard_on && !o->adaptive) {
        cli_error("--reshard-on %s sets --adaptive's thresholds: give --adaptive too", o->reshard_on);
        return 2;
    }
    if (o->adaptive && o->reshard_at) {
        cli_error("--adaptive and --reshard-at %s both move the run: give one of them", o->reshard_at);
        return 2;
    }
    if (o->adaptive && !common->cluster) {
        cli_error("--adaptive re-plans on a cluster's devices: give --cluster FILE (docs/cli.md, Emulated clusters)");
        return 2;
    }
    if ((o->reshard_zero >= 0 || (o->migration && !o->adaptive)) && !o->reshard_at) {
        cli_error("%s needs --reshard-at STEP:MESH (the step and the mesh the run moves to)",
                  o->migration && !o->adaptive ? "--migration" : "--reshard-zero");
        return 2;
    }
    if (o->live_steps && !(o->migration && strcmp(o->migration, "live") == 0)) {
        cli_error("--live-steps %ld spreads a live move: give it with --migration live", o->live_steps);
        return 2;
    }
    if (o->save_every && !o->save) {
        cli_error("--save-every %ld needs --save DIR (where the checkpoints go)", o->save_every);
        return 2;
    }
    shard_optimizer_kind kind = SHARD_OPTIMIZER_ADAMW;
    if (cli_layout_check_names(&o->layout) < 0) {
        cli_error("%s", shard_last_error());
        return 2;
    }
    if (o->layout.optimizer) shard_optimizer_find(o->layout.optimizer, &kind);
    if (o->have_momentum && kind != SHARD_OPTIMIZER_SGD) {
        cli_error("--momentum is for --optimizer sgd; AdamW's momentum is its beta1 (0.9): leave --momentum out, or "
                  "give --optimizer sgd");
        return 2;
    }
    if ((o->log && !check_output("--log", o->log, 0, o)) || (o->trace && !check_output("--trace", o->trace, 0, o)) ||
        (o->save && !check_output("--save", o->save, 1, o)))
        return 2;
    if (o->log && o->trace && (strcmp(o->log, o->trace) == 0 || same_file(o->log, o->trace))) {
        cli_error("--log and --trace are both %s: give each its own file", o->log);
        return 2;
    }
    cli_ranks_from_mesh(common, o->layout.mesh);
    shard_status checked = check_before_ranks(o, common);
    if (checked < 0) {
        int mpi_rank = 0; /* under an MPI launch every process found the same: rank 0 says it */
        if (common->backend == SHARD_BACKEND_THREADS || !shard_launch_detect_mpi(NULL, 0, &mpi_rank, NULL) ||
            mpi_rank == 0)
            cli_error("%s", shard_last_error());
        return 1; /* as when a rank found it */
    }
    shard_launch_config launch = cli_launch_config(common);
    /* one writer per --save root, for the whole run, so that a second run is refused at once: thread ranks'
     * process takes it before they start, an MPI job's rank 0 in train_rank */
    o->lock_in_rank = o->save && shard_launch_detect_mpi(NULL, 0, NULL, NULL);
    if (o->save && !o->lock_in_rank && shard_ckpt_lock_acquire(o->save, "--save", stderr, &o->lock) < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    shard_cluster *cluster = NULL; /* --adaptive's memory capacities and re-plan; the --log's cluster changes */
    shard_status s = common->cluster ? shard_cluster_load(common->cluster, &cluster) : SHARD_OK;
    if (s == SHARD_OK && cluster && common->device_map) s = shard_cluster_set_device_map(cluster, common->device_map);
    o->cluster = cluster, o->cluster_path = common->cluster;
    if (s == SHARD_OK) s = shard_launch_with(&launch, train_rank, o);
    shard_cluster_destroy(cluster);
    o->cluster = NULL;
    shard_ckpt_lock_release(o->lock);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return train_stop_exit_code();
}

/* --reshard-at STEP:MESH, --reshard-zero Z or --migration MODE with its value (NULL: missing, said by
 * cli_value): 0, or -1 with the line printed. */
static int parse_reshard(train_opts *o, const char *flag, const char *val) {
    if (!val) return -1;
    if (strcmp(flag, "--reshard-zero") == 0) return cli_parse_int(flag, val, 0, 3, &o->reshard_zero) ? -1 : 0;
    if (strcmp(flag, "--live-steps") == 0)
        return cli_parse_int(flag, val, 1, TRAIN_LIVE_STEPS_MOST, &o->live_steps) ? -1 : 0;
    if (strcmp(flag, "--migration") == 0) {
        if (strcmp(val, "stop-and-copy") != 0 && strcmp(val, "live") != 0) {
            cli_error("--migration '%s' is invalid: give stop-and-copy or live", val);
            return -1;
        }
        o->migration = val;
        return 0;
    }
    const char *colon = strchr(val, ':');
    char *end = NULL;
    errno = 0;
    long step = colon && val[0] >= '0' && val[0] <= '9' ? strtol(val, &end, 10) : 0;
    if (!colon || end != colon || errno || step < 1 || !colon[1] || strlen(colon + 1) >= sizeof o->reshard_mesh) {
        cli_error("--reshard-at '%s' is invalid: give STEP:MESH, the step after which the run moves (1 or more) "
                  "and the new mesh, e.g. 10:data=2,pipe=2",
                  val);
        return -1;
    }
    snprintf(o->reshard_mesh, sizeof o->reshard_mesh, "%s", colon + 1);
    o->reshard_at = val, o->reshard_step = step;
    return 0;
}

int cli_train(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 1);
    train_opts o = {.layout = CLI_LAYOUT_DEFAULTS,
                    .steps = 100,
                    .lr = 1e-3,
                    .seed = 1,
                    .weight_decay = 0.1,
                    .clip = 1.0,
                    .reshard_zero = -1};
    cli_common common = {0};
    for (int i = 1; i < argc; i++) {
        int cc = cli_common_option(&common, argc, argv, &i);
        if (cc == 0) cc = cli_layout_option(&o.layout, argc, argv, &i);
        if (cc < 0) return 2;
        if (cc > 0) continue;
        const char *a = argv[i], *val = NULL;
        const char **strs[] = {&o.config, &o.data, &o.init, &o.log, &o.save, &o.resume, &o.trace, &o.plan_path};
        const char *str_names[] = {"--config", "--data", "--init", "--log", "--save", "--resume", "--trace", "--plan"};
        int done = 0;
        for (int k = 0; k < 8 && !done; k++)
            if (strcmp(a, str_names[k]) == 0) {
                if (!(*strs[k] = cli_value(argc, argv, &i))) return 2;
                done = 1;
            }
        if (done) continue;
        long *ints[] = {&o.steps, &o.save_every, &o.warmup, &o.monitor_every};
        const char *int_names[] = {"--steps", "--save-every", "--warmup", "--monitor-every"};
        const long lo[] = {1, 0, 0, 1};
        const long hi[] = {1L << 40, 1L << 40, 1L << 40, 1L << 40};
        for (int k = 0; k < 4 && !done; k++)
            if (strcmp(a, int_names[k]) == 0) {
                if (!(val = cli_value(argc, argv, &i)) || cli_parse_int(a, val, lo[k], hi[k], ints[k])) return 2;
                if (k == 2) o.have_warmup = 1;
                done = 1;
            }
        if (done) continue;
        double *dbls[] = {&o.lr, &o.min_lr, &o.weight_decay, &o.clip, &o.momentum};
        const char *dbl_names[] = {"--lr", "--min-lr", "--weight-decay", "--clip", "--momentum"};
        for (int k = 0; k < 5 && !done; k++)
            if (strcmp(a, dbl_names[k]) == 0) {
                if (!(val = cli_value(argc, argv, &i))) return 2;
                if (!cli_number(val, dbls[k]) || !(*dbls[k] >= 0) || (k == 0 && !(*dbls[k] > 0)) || *dbls[k] > 1e6) {
                    cli_error("%s '%s' is invalid: give a number in %s", a, val,
                              k == 0 ? "(0, 1e6], e.g. 3e-4" : "[0, 1e6]");
                    return 2;
                }
                if (k == 1) o.have_min_lr = 1;
                if (k == 4) o.have_momentum = 1;
                done = 1;
            }
        if (done) continue;
        if (strcmp(a, "--print-specs") == 0) {
            o.print_specs = 1;
            continue;
        }
        if (strcmp(a, "--adaptive") == 0) {
            o.adaptive = 1;
            continue;
        }
        if (strcmp(a, "--reshard-on") == 0) {
            if (!(o.reshard_on = cli_value(argc, argv, &i)) || train_adaptive_parse(o.reshard_on, o.thresholds) < 0)
                return 2;
            continue;
        }
        if (strcmp(a, "--reshard-at") == 0 || strcmp(a, "--reshard-zero") == 0 || strcmp(a, "--migration") == 0 ||
            strcmp(a, "--live-steps") == 0) {
            if (parse_reshard(&o, a, cli_value(argc, argv, &i)) < 0) return 2;
            continue;
        }
        if (strcmp(a, "--seed") == 0) {
            long sd;
            if (!(val = cli_value(argc, argv, &i)) || cli_parse_int(a, val, 0, 1L << 62, &sd)) return 2;
            o.seed = (unsigned long long)sd;
            continue;
        }
        cli_unknown_option("train", a, USAGE);
        return 2;
    }
    if (!o.reshard_on) train_adaptive_defaults(o.thresholds);
    if (!o.config) {
        cli_error("train: --config CONFIG.json is required (and --data DIR for a GPT's token files)");
        return 2;
    }
    train_plan plan;
    if (o.plan_path) { /* the plan's layout, the command line's layout flags held to it */
        if (train_plan_load(o.plan_path, &plan) < 0 || train_plan_apply(&plan, &o.layout, &common) < 0) {
            train_plan_free(&plan);
            return 2;
        }
        o.plan = &plan;
    }
    int rc = train_checked(&o, &common);
    if (o.plan_path) train_plan_free(&plan);
    return rc;
}
