/* analyze.c — `shard analyze`: what a layout costs per rank, without training (include/shard/analyze.h:
 * a dry run of the engine's own build and step).
 *
 *   shard analyze --config CONFIG.json [--mesh data=2,tensor=2] [--batch B --seq S --micro-batch M
 *                 --accum K --zero Z --schedule ... --virtual-stages V --recompute --sequence-parallel
 *                 --grad-dtype ... --compute-dtype ...] [--profile machine.json] [--measured run.jsonl]
 *                 [--json]
 *
 * The layout flags are `shard train`'s, with the same meanings and checks. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "shard/shard.h"
#include "train_util.h"

static const char *const USAGE =
    "usage: shard analyze --config CONFIG.json [--mesh AXES] [--ranks N] [layout flags] [--json]\n"
    "\n"
    "What a layout costs per rank, before running it: each rank is built as `shard train` builds it and\n"
    "runs one step through the engine's own code on nothing (a dry run: collectives complete at once and\n"
    "are counted, memory is charged but not touched, GEMMs are counted, not computed, the batch is\n"
    "zeros). Per rank: the parameters it holds, the peak bytes by category (the categories of train's\n"
    "memory table), the FLOPs of a step (forward, backward, recompute), the bytes it sends per mesh axis\n"
    "and per collective; then the pipeline's bubble and the critical path (the rank with the most FLOPs\n"
    "and its largest phase). A mixture of experts spreads the tokens over its experts in turn (a balanced\n"
    "router's load and traffic); beside that balanced figure each rank's expert traffic (the all_to_allv\n"
    "bytes on `expert`) and expert activation rows have their bound, every expert filled to capacity.\n"
    "Meshes of up to 4096 ranks: past --exact-ranks ranks, only the\n"
    "first and last data coordinates are built and the others copy the first's figures.\n"
    "\n"
    "options:\n"
    "  --config FILE                       the model config (as shard train)\n"
    "  --mesh AXES                         e.g. data=2,tensor=2,pipe=2 (default data=RANKS)\n"
    "  --ranks N                           the world size (default: the mesh's product, else 1)\n"
    "  --batch N                           global rows per step (default: micro-batch x accum x data)\n"
    "  --seq N                             tokens per row (default 128)\n"
    "  --micro-batch N                     rows per rank per micro-step\n"
    "  --accum N                           micro-steps per step\n"
    "  --zero N                            ZeRO stage 0, 1, 2 or 3 (default 0)\n"
    "  --bucket-mb X                       gradient bucket size in MiB (default 25)\n"
    "  --grad-dtype f32|bf16               gradient communication dtype (default f32)\n"
    "  --compute-dtype f32|bf16            compute copies' dtype (default f32)\n"
    "  --optimizer adamw|sgd               the optimizer whose state is counted (default adamw)\n"
    "  --sequence-parallel                 split the tokens over the tensor axis\n"
    "  --spec NAME=SPEC                    a parameter's placement on the tensor axis (repeatable)\n"
    "  --schedule gpipe|1f1b|interleaved   the pipeline's schedule (default gpipe)\n"
    "  --micro-batches N                   the pipeline's micro-batches (default: accum)\n"
    "  --virtual-stages V                  model chunks per pipe rank (interleaved)\n"
    "  --recompute                         recompute each stage's forward in its backward\n"
    "  --layers-per-stage L                blocks per pipeline stage, e.g. 3,3,2\n"
    "  --batch-shares LIST                 rows of the global batch per data rank, e.g. 6,2\n"
    "  --exact-ranks N                     build every rank up to N ranks (default 64)\n"
    "  --profile FILE                      a machine profile (shard profile): predict each rank's step\n"
    "                                      time (compute, comm, bubble, optimizer) and tokens/s\n"
    "  --cluster FILE                      an emulated cluster (docs/cli.md, Emulated clusters): each rank's\n"
    "                                      device and whether its memory fits there; with it, the step time\n"
    "                                      is predicted for the cluster (GEMM FLOPs at the device's rate,\n"
    "                                      collectives over its links; --profile adds the host's parts)\n"
    "  --device-map LIST                   with --cluster: mesh position i on device LIST[i] (e.g. 3,0,1,2)\n"
    "  --measured FILE                     a `shard train --log` file of this layout: each rank's expert\n"
    "                                      bytes per step (median over its steps) beside the bound, and\n"
    "                                      measured / bound\n"
    "  --json                              one JSON object: layout, world, ranks [rank, coords, params,\n"
    "                                      memory, flops, comm_bytes, collectives], bubble, critical_path,\n"
    "                                      step_ms, tokens_per_s (the last two null without --profile;\n"
    "                                      with it each rank also has time_ms; with --cluster, device),\n"
    "                                      and per rank expert: {balanced_bytes, bound_bytes,\n"
    "                                      activation_bytes, activation_bound_bytes, measured_bytes,\n"
    "                                      measured_ratio, activation_measured_bytes} (the measured ones null\n"
    "                                      without --measured)\n";

typedef struct analyze_opts {
    const char *config, *profile, *cluster, *device_map, *measured;
    cli_layout layout; /* the mesh, the batch arithmetic, the strategies' flags: train's (train_util.h) */
    long ranks, exact;
    int json;
} analyze_opts;

/* One option of argv at *i into o: 1 taken, 0 not this verb's, -1 a bad value (message printed). */
static int take_option(analyze_opts *o, int argc, char **argv, int *i) {
    int layout = cli_layout_option(&o->layout, argc, argv, i);
    if (layout) return layout;
    const char *a = argv[*i], *val;
    const char **strs[] = {&o->config, &o->profile, &o->cluster, &o->device_map, &o->measured};
    static const char *const str_names[] = {"--config", "--profile", "--cluster", "--device-map", "--measured"};
    for (int k = 0; k < 5; k++)
        if (strcmp(a, str_names[k]) == 0) return (*strs[k] = cli_value(argc, argv, i)) ? 1 : -1;
    long *ints[] = {&o->ranks, &o->exact};
    static const char *const int_names[] = {"--ranks", "--exact-ranks"};
    for (int k = 0; k < 2; k++)
        if (strcmp(a, int_names[k]) == 0)
            return (val = cli_value(argc, argv, i)) && !cli_parse_int(a, val, 1, 4096, ints[k]) ? 1 : -1;
    if (strcmp(a, "--json") == 0) return o->json = 1;
    return 0;
}

/* The flags that need no ranks, checked as train checks them. */
static shard_status check_layout(const analyze_opts *o, const shard_trainer_config *tc) {
    if (!o->config) return shard_error(SHARD_ERR_INVALID_ARG, "analyze: --config is required: give a model config");
    SHARD_CHECK(cli_layout_check_names(&o->layout));
    const char *mesh = o->layout.mesh;
    char axis[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES], data = 1, pipe = 1, expert = 1, world = 1;
    int axes = mesh ? shard_mesh_parse(mesh, 0, axis, sizes) : 0;
    if (axes < 0) return SHARD_ERR_INVALID_ARG;
    for (int a = 0; a < axes; a++) {
        world *= sizes[a];
        data *= strcmp(axis[a], "data") == 0 ? sizes[a] : 1;
        pipe *= strcmp(axis[a], "pipe") == 0 ? sizes[a] : 1;
        expert *= strcmp(axis[a], "expert") == 0 ? sizes[a] : 1;
    }
    if (!mesh) data = world = o->ranks > 0 ? (int)o->ranks : 1;
    if (o->ranks > 0 && o->ranks != world)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--ranks %ld: --mesh %s spans %d ranks: give --ranks %d or leave it out", o->ranks, mesh,
                           world, world);
    SHARD_CHECK(shard_trainer_config_check(tc, data * expert, pipe));
    return shard_model_config_check(o->config);
}

/* "data=0,tensor=1" as {"data": 0, "tensor": 1}. */
static json_t *coords_json(const char *text) {
    json_t *o = json_object();
    char copy[160];
    snprintf(copy, sizeof copy, "%s", text);
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq) continue;
        *eq = '\0';
        json_object_set_new(o, item, json_integer(atoi(eq + 1)));
    }
    return o;
}

static json_t *time_json(const shard_rank_time *t) {
    json_t *o = json_object();
    json_object_set_new(o, "compute", json_real(t->compute_ms));
    json_object_set_new(o, "comm", json_real(t->comm_ms));
    json_object_set_new(o, "bubble", json_real(t->bubble_ms));
    json_object_set_new(o, "optimizer", json_real(t->optimizer_ms));
    json_object_set_new(o, "total", json_real(t->total_ms));
    return o;
}

/* A rank's device on the cluster and whether its peak memory fits the device's. */
static json_t *device_json(const shard_cluster *cluster, const shard_rank_analysis *r) {
    shard_cluster_device d;
    if (shard_cluster_rank_device(cluster, r->rank, &d) < 0) return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "node", json_string(d.node));
    json_object_set_new(o, "device", json_integer(d.device));
    json_object_set_new(o, "compute_tflops", json_real(d.compute_tflops));
    json_object_set_new(o, "memory_bytes", json_real(d.memory_bytes));
    json_object_set_new(o, "fits", json_boolean((double)r->memory_total_bytes <= d.memory_bytes));
    return o;
}

/* measured / bound of a rank's expert bytes (-1: not measured, or no bound to compare with). */
static double measured_ratio(const shard_rank_analysis *r) {
    return r->expert_bytes_measured >= 0 && r->expert_bytes_bound
        ? r->expert_bytes_measured / (double)r->expert_bytes_bound
        : -1;
}

static json_t *expert_json(const shard_rank_analysis *r) {
    json_t *o = json_object();
    json_object_set_new(o, "balanced_bytes", json_integer((json_int_t)r->expert_bytes));
    json_object_set_new(o, "bound_bytes", json_integer((json_int_t)r->expert_bytes_bound));
    json_object_set_new(o, "activation_bytes", json_integer((json_int_t)r->expert_activation_bytes));
    json_object_set_new(o, "activation_bound_bytes", json_integer((json_int_t)r->expert_activation_bytes_bound));
    double ratio = measured_ratio(r);
    json_object_set_new(o, "measured_bytes",
                        r->expert_bytes_measured >= 0 ? json_real(r->expert_bytes_measured) : json_null());
    json_object_set_new(o, "measured_ratio", ratio >= 0 ? json_real(ratio) : json_null());
    json_object_set_new(o, "activation_measured_bytes",
                        r->expert_activation_bytes_measured >= 0 ? json_real(r->expert_activation_bytes_measured)
                                                                 : json_null());
    return o;
}

static int print_json(const shard_analysis *a, const shard_step_prediction *pred, const shard_cluster *cluster) {
    json_t *root = json_object(), *ranks = json_array();
    json_object_set_new(root, "layout", json_string(a->layout));
    json_object_set_new(root, "world", json_integer(a->world));
    json_object_set_new(root, "built", json_integer(a->built));
    for (size_t i = 0; i < a->ranks; i++) {
        const shard_rank_analysis *r = &a->rank[i];
        json_t *x = json_object(), *mem = json_object(), *fl = json_object(), *axes = json_object(),
               *coll = json_array();
        json_object_set_new(x, "rank", json_integer(r->rank));
        json_object_set_new(x, "coords", coords_json(r->coords));
        json_object_set_new(x, "params", json_integer((json_int_t)r->params));
        for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++)
            json_object_set_new(mem, shard_mem_category_name((shard_mem_category)c),
                                json_integer((json_int_t)r->memory_bytes[c]));
        json_object_set_new(mem, "total", json_integer((json_int_t)r->memory_total_bytes));
        json_object_set_new(x, "memory", mem);
        json_object_set_new(fl, "forward", json_real(r->flops_forward));
        json_object_set_new(fl, "backward", json_real(r->flops_backward));
        json_object_set_new(fl, "recompute", json_real(r->flops_recompute));
        json_object_set_new(fl, "other", json_real(r->flops_other));
        json_object_set_new(x, "flops", fl);
        for (size_t k = 0; k < r->collectives; k++) {
            const shard_analyze_collective *c = &r->collective[k];
            json_object_set_new(axes, c->axis, json_integer((json_int_t)shard_rank_analysis_axis_bytes(r, c->axis)));
            json_t *e = json_object();
            json_object_set_new(e, "op", json_string(c->op));
            json_object_set_new(e, "axis", json_string(c->axis));
            json_object_set_new(e, "bytes", json_integer((json_int_t)c->bytes));
            json_object_set_new(e, "count", json_integer((json_int_t)c->count));
            json_array_append_new(coll, e);
        }
        json_object_set_new(x, "comm_bytes", axes);
        json_object_set_new(x, "collectives", coll);
        json_object_set_new(x, "expert", expert_json(r));
        if (pred) json_object_set_new(x, "time_ms", time_json(&pred->rank[i]));
        if (cluster) json_object_set_new(x, "device", device_json(cluster, r));
        json_array_append_new(ranks, x);
    }
    json_object_set_new(root, "ranks", ranks);
    json_object_set_new(root, "bubble", json_real(a->bubble));
    json_t *cp = json_object();
    json_object_set_new(cp, "rank", json_integer(a->critical_rank));
    json_object_set_new(cp, "phase", json_string(a->critical_phase));
    json_object_set_new(root, "critical_path", cp);
    json_object_set_new(root, "step_ms", pred ? json_real(pred->step_ms) : json_null());
    json_object_set_new(root, "tokens_per_s", pred ? json_real(pred->tokens_per_s) : json_null());
    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (!text) return cli_error("analyze: out of memory for the JSON output"), 1;
    int ok = puts(text) >= 0 && fflush(stdout) == 0;
    free(text);
    return ok ? 0 : 1;
}

/* A mixture of experts' routing-dependent figures per rank: balanced, bound and (--measured) the run's. */
static void print_experts(const shard_analysis *a) {
    int any = 0;
    for (size_t i = 0; i < a->ranks; i++) any |= a->rank[i].expert_activation_bytes > 0;
    if (!any) return;
    printf("experts per step (bytes; bound: every expert filled to capacity%s):\n",
           a->measured_steps ? "; measured: the log's median step" : "");
    printf("  %-26s %12s %12s %14s %14s", "rank", "sent", "sent bound", "activations", "act. bound");
    if (a->measured_steps) printf(" %12s %14s %14s", "measured", "act. measured", "measured/bound");
    printf("\n");
    for (size_t i = 0; i < a->ranks; i++) {
        const shard_rank_analysis *r = &a->rank[i];
        char who[64];
        snprintf(who, sizeof who, "%d %s", r->rank, r->coords);
        printf("  %-26s %12llu %12llu %14llu %14llu", who, (unsigned long long)r->expert_bytes,
               (unsigned long long)r->expert_bytes_bound, (unsigned long long)r->expert_activation_bytes,
               (unsigned long long)r->expert_activation_bytes_bound);
        double ratio = measured_ratio(r);
        if (a->measured_steps) {
            printf(" %12.0f", r->expert_bytes_measured);
            if (r->expert_activation_bytes_measured >= 0)
                printf(" %14.0f", r->expert_activation_bytes_measured);
            else
                printf(" %14s", "-");
            if (ratio >= 0)
                printf(" %14.3f", ratio);
            else
                printf(" %14s", "-");
        }
        printf("\n");
    }
}

static void print_table(const shard_analysis *a, const shard_step_prediction *pred, const shard_cluster *cluster) {
    printf("analyze: %s, %d ranks (%d built)\n", a->layout, a->world, a->built);
    printf("  %-26s %12s %9s %9s %9s %11s %8s %8s %9s %9s %9s %9s\n", "rank", "params", "params", "grads", "optimizer",
           "activations", "comm", "other", "total MiB", "fwd GF", "bwd GF", "sent MiB");
    const double mib = 1048576.0;
    for (size_t i = 0; i < a->ranks; i++) {
        const shard_rank_analysis *r = &a->rank[i];
        char who[64];
        snprintf(who, sizeof who, "%d %s", r->rank, r->coords);
        const uint64_t *m = r->memory_bytes;
        printf("  %-26s %12llu %9.2f %9.2f %9.2f %11.2f %8.2f %8.2f %9.2f %9.3f %9.3f %9.2f\n", who,
               (unsigned long long)r->params, (double)m[SHARD_MEM_PARAMS] / mib, (double)m[SHARD_MEM_GRADS] / mib,
               (double)m[SHARD_MEM_OPTIMIZER] / mib, (double)m[SHARD_MEM_ACTIVATIONS] / mib,
               (double)m[SHARD_MEM_COMM] / mib, (double)m[SHARD_MEM_OTHER] / mib, (double)r->memory_total_bytes / mib,
               r->flops_forward / 1e9, (r->flops_backward + r->flops_recompute) / 1e9,
               (double)shard_rank_analysis_axis_bytes(r, NULL) / mib);
    }
    const shard_rank_analysis *r0 = &a->rank[0];
    printf("rank 0 sends per step:");
    for (size_t k = 0; k < r0->collectives; k++)
        if (r0->collective[k].bytes)
            printf(" %s %s x%llu %.0f bytes;", r0->collective[k].axis, r0->collective[k].op,
                   (unsigned long long)r0->collective[k].count, (double)r0->collective[k].bytes);
    printf("\nbubble %.3f; critical path: rank %d, %s\n", a->bubble, a->critical_rank, a->critical_phase);
    print_experts(a);
    for (size_t i = 0; cluster && i < a->ranks; i++) { /* where each rank runs, and what does not fit there */
        shard_cluster_device d;
        if (shard_cluster_rank_device(cluster, a->rank[i].rank, &d) < 0) continue;
        int fits = (double)a->rank[i].memory_total_bytes <= d.memory_bytes;
        printf("rank %d on node '%s' device %d (%g TFLOP/s, %.2f GiB): %s\n", a->rank[i].rank, d.node, d.device,
               d.compute_tflops, d.memory_bytes / 1073741824.0, fits ? "fits" : "DOES NOT FIT");
    }
    if (!pred) return;
    printf("predicted step (ms): %-26s %9s %9s %9s %9s %9s\n", "rank", "compute", "comm", "bubble", "optimizer",
           "total");
    for (size_t i = 0; i < pred->ranks; i++) {
        const shard_rank_time *t = &pred->rank[i];
        printf("                     %-26d %9.2f %9.2f %9.2f %9.2f %9.2f\n", a->rank[i].rank, t->compute_ms, t->comm_ms,
               t->bubble_ms, t->optimizer_ms, t->total_ms);
    }
    printf("step %.2f ms (rank %d), %.0f tokens/s%s\n", pred->step_ms, pred->slowest_rank, pred->tokens_per_s,
           pred->oversubscribed ? "; more ranks than cores: compute time-shared" : "");
}

int cli_analyze(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 0);
    analyze_opts o = {.layout = CLI_LAYOUT_DEFAULTS};
    for (int i = 1; i < argc; i++) {
        int taken = take_option(&o, argc, argv, &i);
        if (taken < 0) return 2;
        if (!taken) {
            cli_error("analyze: unknown option '%s' (shard analyze --help lists them)", argv[i]);
            return 2;
        }
    }
    shard_trainer_config tc = cli_layout_trainer_config(&o.layout, o.config);
    shard_status s = check_layout(&o, &tc);
    shard_analysis *a = NULL;
    shard_analyze_options ao = {.struct_size = sizeof ao,
                                .train = &tc,
                                .mesh = o.layout.mesh,
                                .world = (int)o.ranks,
                                .exact_ranks = (int)o.exact};
    if (s == SHARD_OK) s = shard_analyze(&ao, &a);
    if (s == SHARD_OK && o.measured) s = shard_analysis_measure(a, o.measured);
    shard_machine_profile *prof = NULL;
    shard_step_prediction *pred = NULL;
    shard_cluster *cluster = NULL;
    if (s == SHARD_OK) s = cli_load_cluster_profile("analyze", o.cluster, o.device_map, o.profile, &cluster, &prof);
    if (s == SHARD_OK && cluster && shard_cluster_ranks(cluster) < a->world)
        s = shard_error(SHARD_ERR_INVALID_ARG, "--cluster %s: %d devices for the %d ranks of --mesh %s", o.cluster,
                        shard_cluster_ranks(cluster), a->world, a->mesh);
    shard_cost_options co = {.struct_size = sizeof co, .backend = "threads", .cluster = cluster};
    if (s == SHARD_OK && (prof || cluster)) s = shard_cost_predict(a, prof, &co, &pred);
    free(prof);
    if (s < 0) {
        shard_cluster_destroy(cluster);
        shard_analysis_destroy(a);
        cli_error("%s", shard_last_error());
        return 1;
    }
    int rc = 0;
    if (o.json)
        rc = print_json(a, pred, cluster);
    else
        print_table(a, pred, cluster);
    shard_step_prediction_destroy(pred);
    shard_cluster_destroy(cluster);
    shard_analysis_destroy(a);
    return rc;
}
