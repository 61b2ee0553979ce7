/* bench_tensor.c — `shard bench tensor`: the GPT under Megatron tensor
 * parallelism on T ranks (mesh tensor=T), with and without sequence
 * parallel, against one rank, in the same run:
 *   - ms/step of a training step (median), and forward-only latency of one
 *     sequence (batch 1);
 *   - bytes each rank sent on the tensor axis in one step, counted by the
 *     communication layer, against the closed-form count of the collectives
 *     the layers make (shard_cost_gpt_tensor_bytes) — they must match exactly;
 *   - activation bytes per rank (the model's activation slab).
 * Every rank runs BLAS on one thread; random tokens.
 *
 *   shard bench tensor --config CONFIG.json [--ranks 2] [--batch 8] [--seq 128] [--steps 10] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_train.h"
#include "cli_util.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/cost.h"
#include "shard/shard.h"

typedef struct tp_run {
    double ms, fwd_ms;
    uint64_t bytes, expected, activations;
} tp_run;

typedef struct tp_args {
    const char *config;
    char dir[256];
    long batch, seq, steps;
    shard_gpt_config gc;
    tp_run runs[3]; /* one rank; tensor=T; tensor=T with sequence parallel */
} tp_args;

/* Training steps and forward latency on a mesh "tensor=T" over comm; rank 0's figures. */
static shard_status measure(shard_comm *comm, tp_args *a, int sp, tp_run *out) {
    char text[32], path[300];
    int T = shard_comm_size(comm);
    snprintf(text, sizeof text, "tensor=%d", T);
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    shard_trainer_config c = {.config_path = a->config,
                              .data_dir = a->dir,
                              .batch = (size_t)a->batch,
                              .seq = (size_t)a->seq,
                              .seed = 1,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f,
                              .sequence_parallel = sp};
    c.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, (uint64_t)a->steps + 2};
    double *ms = calloc((size_t)a->steps, sizeof *ms), fw[11];
    shard_status s = ms ? shard_mesh_create(comm, text, &mesh) : SHARD_ERR_NO_MEMORY;
    shard_mem_stats before, after;
    shard_mem_stats_get(&before);
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &tr);
    shard_mem_stats_get(&after);
    shard_comm *tensor = mesh ? shard_mesh_axis_comm(mesh, shard_mesh_axis_index(mesh, "tensor")) : NULL;
    for (long i = 0; s == SHARD_OK && i < a->steps + 2; i++) {
        shard_step_result r;
        uint64_t b0 = shard_comm_bytes_sent(tensor);
        s = shard_comm_barrier(comm);
        if (s == SHARD_OK) s = shard_trainer_step(tr, (uint64_t)i + 1, &r);
        if (i == 0) out->bytes = shard_comm_bytes_sent(tensor) - b0;
        if (i >= 2) ms[i - 2] = r.ms;
    }
    shard_trainer_destroy(tr);
    /* forward only, one sequence */
    shard_model *m = NULL;
    shard_batch_source *src = NULL;
    shard_batch b;
    snprintf(path, sizeof path, "%s", a->config);
    if (s == SHARD_OK) s = shard_model_create(path, a->dir, 1, (size_t)a->seq, tensor, sp, &m);
    shard_model_create_options o = {
        .struct_size = sizeof o, .config_path = path, .data_dir = a->dir, .max_rows = 1, .seq = (size_t)a->seq};
    if (s == SHARD_OK) s = shard_model_batch_source(&o, m, &src);
    if (s == SHARD_OK) m->ops->init(m, 1);
    for (int i = 0; s == SHARD_OK && i < 11; i++) {
        double loss, t0;
        s = shard_batch_source_load(src, 1, (uint64_t)i + 1, 0, 1, &b);
        if (s == SHARD_OK) s = m->ops->set_batch(m, &b);
        if (s == SHARD_OK) s = shard_comm_barrier(comm);
        t0 = shard_clock_seconds();
        if (s == SHARD_OK) s = m->ops->forward(m, (double)a->seq, &loss);
        fw[i] = (shard_clock_seconds() - t0) * 1e3;
    }
    shard_batch_source_destroy(src);
    shard_model_destroy(m);
    shard_mesh_destroy(mesh);
    if (s == SHARD_OK) {
        out->ms = cli_median(ms, (int)a->steps), out->fwd_ms = cli_median(fw + 1, 10);
        out->activations = after.current_bytes[SHARD_MEM_ACTIVATIONS] - before.current_bytes[SHARD_MEM_ACTIVATIONS];
        out->expected = shard_cost_gpt_tensor_bytes(&a->gc, (size_t)(a->batch * a->seq), (size_t)T,
                                                    (size_t)shard_comm_rank(comm), sp);
    }
    free(ms);
    return s;
}

static shard_status tp_rank(shard_comm *world, void *arg) {
    tp_args *a = arg;
    int rank = shard_comm_rank(world);
    SHARD_CHECK(shard_share_cores(world));
    shard_comm *self = NULL;
    SHARD_CHECK(shard_comm_split(world, rank == 0 ? 0 : -1, 0, &self));
    tp_run r[3] = {{0}};
    shard_status alone = self ? measure(self, a, 0, &r[0]) : SHARD_OK;
    shard_comm_destroy(self); /* before a failure returns too */
    SHARD_CHECK(alone);
    SHARD_CHECK(shard_comm_barrier(world));
    SHARD_CHECK(measure(world, a, 0, &r[1]));
    SHARD_CHECK(measure(world, a, 1, &r[2]));
    /* bytes must match on every rank; report rank 0's figures and whether all matched */
    int64_t bad = (r[1].bytes != r[1].expected) + (r[2].bytes != r[2].expected), any = 0;
    SHARD_CHECK(shard_comm_all_reduce(world, &bad, &any, 1, SHARD_I64, SHARD_OP_SUM));
    if (any)
        return shard_error(SHARD_ERR_INTERNAL, "bench tensor: bytes sent differ from the formula on %lld rank runs",
                           (long long)any);
    if (rank == 0) memcpy(a->runs, r, sizeof r);
    return SHARD_OK;
}

int bench_model_options(int argc, char **argv, const char *verb, bench_model_opts *o) {
    for (int i = 1; i < argc; i++) {
        int cc = cli_common_option(&o->common, argc, argv, &i);
        if (cc < 0) return 2;
        if (cc > 0) continue;
        const char *a = argv[i], *v = NULL;
        long *ints[] = {&o->batch, &o->seq, &o->steps};
        const char *names[] = {"--batch", "--seq", "--steps"};
        const long lo[] = {o->batch_min > 0 ? o->batch_min : 1, 1, 5},
                   hi[] = {4096, 65536, 100000}; /* medians of >= 5 */
        int done = 0;
        for (int k = 0; k < 3 && !done; k++)
            if (strcmp(a, names[k]) == 0) {
                if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, lo[k], hi[k], ints[k])) return 2;
                done = 1;
            }
        if (done) continue;
        if (strcmp(a, "--config") == 0) {
            if (!(o->config = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else {
            cli_unknown_option(verb, a, NULL); /* its usage text follows */
            return 2;
        }
    }
    if (!o->config) {
        cli_error("%s: --config CONFIG.json is required (e.g. configs/gpt-bench.json)", verb);
        return 2;
    }
    if (o->common.ranks == 0) o->common.ranks = 2;
    return 0;
}

static const char *const USAGE =
    "usage: shard bench tensor --config CONFIG.json [options]\n"
    "\n"
    "The GPT under Megatron tensor parallelism on T ranks (mesh tensor=T), with and without sequence\n"
    "parallel, against one rank, in the same run: ms/step, the forward latency of one sequence, the bytes\n"
    "each rank sends on the tensor axis against their formula, and activation bytes per rank.  Random\n"
    "tokens; one BLAS thread per rank.\n"
    "\n"
    "options:\n"
    "  --batch B                rows per step (global), 1..4096 (default 8)\n" BENCH_MODEL_OPTIONS_USAGE
    "  --ranks T                the tensor ranks, 1..4096 (default 2; under mpirun the launcher's)\n";

int cli_bench_tensor(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 1);
    tp_args a = {0};
    bench_model_opts mo = {.batch = 8, .seq = 128, .steps = 10};
    int rc = bench_model_options(argc, argv, "bench tensor", &mo);
    if (rc) return rc;
    a.config = mo.config, a.batch = mo.batch, a.seq = mo.seq, a.steps = mo.steps;
    int json = mo.json;
    cli_common common = mo.common;
    shard_status s = bench_random_tokens(a.config, &a.gc, a.dir, sizeof a.dir);
    shard_launch_config launch = cli_launch_config(&common);
    if (s == SHARD_OK) s = shard_launch_with(&launch, tp_rank, &a);
    if (a.dir[0]) bench_remove_dir(a.dir);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    if (a.runs[0].ms <= 0) return 0; /* an MPI rank other than 0 */
    int T = common.ranks;
    char env[64];
    int mr, ms;
    if (shard_launch_detect_mpi(env, sizeof env, &mr, &ms)) T = ms;
    const char *label[3] = {"tensor=1", "tensor=T", "tensor=T, sequence parallel"};
    if (json) {
        char cfg_json[4200];
        for (int k = 0; k < 3; k++)
            printf("{\"config\": %s, \"tensor\": %d, \"sequence_parallel\": %d, \"batch\": %ld, \"seq\": %ld, "
                   "\"ms_per_step\": %.3f, \"forward_ms_batch1\": %.3f, \"tensor_bytes_sent\": %llu, "
                   "\"tensor_bytes_formula\": %llu, \"activation_bytes\": %llu}\n",
                   cli_json_string(a.config, cfg_json, sizeof cfg_json), k ? T : 1, k == 2, a.batch, a.seq,
                   a.runs[k].ms, a.runs[k].fwd_ms, (unsigned long long)a.runs[k].bytes,
                   (unsigned long long)a.runs[k].expected, (unsigned long long)a.runs[k].activations);
        return 0;
    }
    printf("# shard bench tensor: %s, batch %ld x %ld, T = %d; rank 0's figures, medians of %ld steps\n", a.config,
           a.batch, a.seq, T, a.steps);
    for (int k = 0; k < 3; k++)
        printf("%-28s %8.1f ms/step  forward (1 x %ld) %7.2f ms  tensor bytes/step %11llu (formula %llu)  "
               "activations %7.2f MiB\n",
               label[k], a.runs[k].ms, a.seq, a.runs[k].fwd_ms, (unsigned long long)a.runs[k].bytes,
               (unsigned long long)a.runs[k].expected, (double)a.runs[k].activations / 1048576.0);
    return 0;
}
