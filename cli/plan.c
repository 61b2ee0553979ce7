/* plan.c — `shard plan`: the layout to run a model with on a cluster (include/shard/plan.h).
 *
 *   shard plan --config CONFIG.json --cluster cluster.json [--profile machine.json] --batch B --seq S
 *              [--device-map LIST] [--goal throughput|latency|memory|balance] [--max-memory-fraction 0.9]
 *              [--latency-budget-ms X] [--max-comm-fraction F] [--max-compute-imbalance X] [--grow-batch]
 *              [--grad-dtype f32|bf16|f32,bf16] [--refine 8] [--place-top 3]
 *              [--placement hungarian|anneal|genetic] [--top 5] [--search exhaustive|screen] [--verify 3]
 *              [--json] [--out plan.json] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "shard/shard.h"

static const char *const USAGE =
    "usage: shard plan --config CONFIG.json --cluster FILE [--profile FILE] --batch B --seq S [options]\n"
    "\n"
    "The layout to run a model with on a cluster: every data x tensor x pipe split of its devices (x\n"
    "expert for a mixture of experts), ZeRO 0-3, sequence parallel, 1F1B with p or 2p micro-batches,\n"
    "the gradient dtypes asked, recomputation or accumulation where a layout does not fit without it,\n"
    "then the leading meshes' variants (GPipe, interleaved, more micro-batches, accumulation); each\n"
    "analyzed by a dry run of the engine (shard analyze) and priced on the cluster's devices and links\n"
    "(and the machine profile's host part when given), those that do not fit a device's memory or a\n"
    "budget cut, the rest ranked by the goal. Prints the top layouts, why the others were cut, and a\n"
    "paragraph on the choice. The leading layouts are then placed: which device each mesh position\n"
    "runs on, solved three ways and priced by the same model; the best placed one wins.\n"
    "\n"
    "options:\n"
    "  --config FILE                       the model config\n"
    "  --cluster FILE                      the devices and links (docs/cli.md, Emulated clusters)\n"
    "  --device-map LIST                   mesh position i on device LIST[i] (default: in order); kept\n"
    "                                      as given, the solvers' placements only reported\n"
    "  --profile FILE                      a machine profile (shard profile) for the host's part\n"
    "  --batch N                           the global batch (default 8)\n"
    "  --seq N                             tokens per row (default 128)\n"
    "  --goal G                            throughput (default), latency, memory or balance\n"
    "  --max-memory-fraction X             of each device's memory a rank may use, (0, 1] (default 0.9)\n"
    "  --latency-budget-ms X               cut the layouts that predict a longer step (default: no budget)\n"
    "  --max-comm-fraction F               the communication budget: cut the layouts whose ranks' exposed\n"
    "                                      communication takes more than F of the step, (0, 1]\n"
    "  --max-compute-imbalance X           the compute budget: cut the layouts whose ranks' predicted\n"
    "                                      compute is more imbalanced (max/mean - 1) than X\n"
    "  --grad-dtype LIST                   gradient dtypes searched: f32 (default), bf16, or f32,bf16\n"
    "                                      (bf16 halves the reduction but rounds the gradients)\n"
    "  --refine N                          meshes whose best layout's variants are tried, 0..100 (default\n"
    "                                      8; 0: none)\n"
    "  --place-top N                       leading layouts placed, the best placed one the winner, 1..100\n"
    "                                      (default 3)\n"
    "  --grow-batch                        goal throughput: run the winner at the larger global batch found\n"
    "                                      (2, 4 or 8 times --batch, fitting, >= 5 % more tokens/s; without\n"
    "                                      it the explanation only names it); its flags gain --batch\n"
    "  --placement M                       whose device map the plan uses: hungarian (the exact best of\n"
    "                                      each rank's compute and memory per device, links unseen),\n"
    "                                      anneal (default: simulated annealing on the whole predicted\n"
    "                                      step, links included; as good as genetic on the example\n"
    "                                      clusters, and nearer the optimum on harder tests) or genetic\n"
    "                                      (a permutation genetic algorithm on the same step)\n"
    "  --top N                             layouts listed (default 5)\n"
    "  --search exhaustive|screen          every layout by dry run, or every layout by the closed-form\n"
    "                                      screen and the best --verify by dry run (default: the screen\n"
    "                                      for a dense GPT on more than 16 devices or of more than 24\n"
    "                                      blocks)\n"
    "  --verify N                          with the screen: fitting layouts checked by dry run, 0..100\n"
    "                                      (default 3; 0: none, the figures the screen's estimates)\n"
    "  --out FILE                          the chosen plan as JSON: mesh, flags, layers_per_stage,\n"
    "                                      batch_shares, device_map, predicted {step_ms, tokens_per_s,\n"
    "                                      peak_bytes}, explanation\n"
    "  --json                              one JSON object: goal, world, tried, fitting, plans [...],\n"
    "                                      placement [{method, step_ms, seconds, device_map}],\n"
    "                                      placed_by, layouts_placed, placed_rank, explanation\n";

typedef struct plan_opts {
    const char *config, *cluster, *device_map, *profile, *goal, *out, *placement, *search, *grad_dtypes;
    long batch, seq, top, verify, refine, place_top;
    double fraction, latency_budget, comm_fraction, compute_imbalance;
    int json, grow_batch;
} plan_opts;

/* The flags `shard train` takes for candidate c. */
static json_t *flags_json(const shard_plan_candidate *c) {
    json_t *f = json_array();
    char text[64];
    json_array_append_new(f, json_string("--mesh")), json_array_append_new(f, json_string(c->mesh));
    snprintf(text, sizeof text, "%d", c->zero);
    json_array_append_new(f, json_string("--zero")), json_array_append_new(f, json_string(text));
    if (c->sequence_parallel) json_array_append_new(f, json_string("--sequence-parallel"));
    if (c->schedule[0])
        json_array_append_new(f, json_string("--schedule")), json_array_append_new(f, json_string(c->schedule));
    if (c->virtual_stages) {
        snprintf(text, sizeof text, "%d", c->virtual_stages);
        json_array_append_new(f, json_string("--virtual-stages")), json_array_append_new(f, json_string(text));
    }
    if (c->micro_batches) {
        snprintf(text, sizeof text, "%zu", c->micro_batches);
        json_array_append_new(f, json_string("--micro-batches")), json_array_append_new(f, json_string(text));
    }
    if (c->accum) {
        snprintf(text, sizeof text, "%zu", c->accum);
        json_array_append_new(f, json_string("--accum")), json_array_append_new(f, json_string(text));
    }
    if (c->grad_dtype[0])
        json_array_append_new(f, json_string("--grad-dtype")), json_array_append_new(f, json_string(c->grad_dtype));
    if (c->recompute) json_array_append_new(f, json_string("--recompute"));
    if (c->batch) {
        snprintf(text, sizeof text, "%zu", c->batch);
        json_array_append_new(f, json_string("--batch")), json_array_append_new(f, json_string(text));
    }
    if (c->layers_per_stage[0])
        json_array_append_new(f, json_string("--layers-per-stage")),
            json_array_append_new(f, json_string(c->layers_per_stage));
    if (c->batch_shares[0])
        json_array_append_new(f, json_string("--batch-shares")), json_array_append_new(f, json_string(c->batch_shares));
    return f;
}

static json_t *candidate_json(const shard_plan_candidate *c) {
    json_t *o = json_object();
    json_object_set_new(o, "mesh", json_string(c->mesh));
    json_object_set_new(o, "flags", flags_json(c));
    json_object_set_new(o, "fits", json_boolean(c->fits));
    json_object_set_new(o, "step_ms", c->valid ? json_real(c->step_ms) : json_null());
    json_object_set_new(o, "tokens_per_s", c->valid ? json_real(c->tokens_per_s) : json_null());
    json_object_set_new(o, "peak_bytes", c->valid ? json_real(c->peak_bytes) : json_null());
    json_object_set_new(o, "bubble", json_real(c->bubble));
    json_object_set_new(o, "imbalance", json_real(c->imbalance));
    json_object_set_new(o, "comm_fraction", json_real(c->comm_fraction));
    json_object_set_new(o, "compute_imbalance", json_real(c->compute_imbalance));
    json_object_set_new(o, "screened", json_boolean(c->screened));
    if (c->why[0]) json_object_set_new(o, "cut", json_string(c->why));
    return o;
}

/* The chosen plan's file, written whole or not at all. */
/* A device map as a list of device numbers. */
static json_t *map_json(const size_t *map, int world) {
    json_t *list = json_array();
    for (int i = 0; map && i < world; i++) json_array_append_new(list, json_integer((json_int_t)map[i]));
    return list;
}

static shard_status write_plan(const char *path, const shard_plan_result *r, const char *explanation) {
    const shard_plan_candidate *w = &r->candidate[0];
    json_t *root = json_object(), *pred = json_object();
    json_object_set_new(root, "mesh", json_string(w->mesh));
    json_object_set_new(root, "flags", flags_json(w));
    json_object_set_new(root, "layers_per_stage",
                        w->layers_per_stage[0] ? json_string(w->layers_per_stage) : json_null());
    json_object_set_new(root, "batch_shares", w->batch_shares[0] ? json_string(w->batch_shares) : json_null());
    json_object_set_new(root, "device_map", r->device_map ? map_json(r->device_map, r->world) : json_null());
    json_object_set_new(pred, "step_ms", json_real(w->step_ms));
    json_object_set_new(pred, "tokens_per_s", json_real(w->tokens_per_s));
    json_object_set_new(pred, "peak_bytes", json_real(w->peak_bytes));
    json_object_set_new(root, "predicted", pred);
    json_object_set_new(root, "explanation", json_string(explanation));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (!text) return shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
    shard_status s = shard_atomic_write_file(path, text, strlen(text));
    free(text);
    return s;
}

/* The candidate's layout in the table's short words: "data=2,pipe=2 zero=1 sp 1f1b m=4 shares=6,2". */
static void table_text(const shard_plan_candidate *c, char *out, size_t bytes) {
    static const char *const words[][2] = {
        {" sequence-parallel", " sp"},  {" schedule=", " "},         {" micro-batches=", " m="},
        {" virtual-stages=", " v="},    {" grad-dtype=", " grads="}, {" layers-per-stage=", " layers="},
        {" batch-shares=", " shares="},
    };
    char long_text[400];
    shard_plan_candidate_text(c, long_text, sizeof long_text);
    size_t used = 0;
    for (const char *at = long_text; *at && used + 1 < bytes;) {
        size_t k = 0, n = sizeof words / sizeof *words;
        while (k < n && strncmp(at, words[k][0], strlen(words[k][0])) != 0) k++;
        if (k < n) {
            used += (size_t)snprintf(out + used, bytes - used, "%s", words[k][1]);
            at += strlen(words[k][0]);
        } else {
            out[used++] = *at++;
        }
    }
    out[used < bytes ? used : bytes - 1] = '\0';
}

static int take(plan_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    const char **strs[] = {&o->config, &o->cluster, &o->device_map, &o->profile,
                           &o->goal,   &o->out,     &o->search,     &o->grad_dtypes};
    static const char *const names[] = {"--config", "--cluster", "--device-map", "--profile",
                                        "--goal",   "--out",     "--search",     "--grad-dtype"};
    for (int k = 0; k < 8; k++)
        if (strcmp(a, names[k]) == 0) return (*strs[k] = cli_value(argc, argv, i)) ? 1 : -1;
    long *ints[] = {&o->batch, &o->seq, &o->top, &o->verify, &o->refine, &o->place_top};
    static const char *const int_names[] = {"--batch", "--seq", "--top", "--verify", "--refine", "--place-top"};
    static const long lo[] = {1, 1, 1, 0, 0, 1}, hi[] = {1 << 20, 1 << 20, 1000, 100, 100, 100};
    for (int k = 0; k < 6; k++)
        if (strcmp(a, int_names[k]) == 0)
            return (v = cli_value(argc, argv, i)) && !cli_parse_int(a, v, lo[k], hi[k], ints[k]) ? 1 : -1;
    if (strcmp(a, "--latency-budget-ms") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!cli_number(v, &o->latency_budget) || !(o->latency_budget > 0)) {
            cli_error("--latency-budget-ms '%s' is invalid: give milliseconds > 0, e.g. 250", v);
            return -1;
        }
        return 1;
    }
    if (strcmp(a, "--max-comm-fraction") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!cli_number(v, &o->comm_fraction) || !(o->comm_fraction > 0) || o->comm_fraction > 1) {
            cli_error("--max-comm-fraction '%s' is invalid: give a fraction of the step in (0, 1], e.g. 0.4", v);
            return -1;
        }
        return 1;
    }
    if (strcmp(a, "--max-compute-imbalance") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!cli_number(v, &o->compute_imbalance) || !(o->compute_imbalance > 0)) {
            cli_error("--max-compute-imbalance '%s' is invalid: give max/mean - 1 of the ranks' compute > 0, e.g. 0.25",
                      v);
            return -1;
        }
        return 1;
    }
    if (strcmp(a, "--max-memory-fraction") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!cli_number(v, &o->fraction) || !(o->fraction > 0) || o->fraction > 1) {
            cli_error("--max-memory-fraction '%s' is invalid: give a number in (0, 1], e.g. 0.9", v);
            return -1;
        }
        return 1;
    }
    if (strcmp(a, "--placement") == 0) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (strcmp(v, "hungarian") != 0 && strcmp(v, "anneal") != 0 && strcmp(v, "genetic") != 0) {
            cli_error("--placement '%s' is invalid: give hungarian, anneal or genetic", v);
            return -1;
        }
        o->placement = v;
        return 1;
    }
    if (strcmp(a, "--json") == 0) return o->json = 1;
    if (strcmp(a, "--grow-batch") == 0) return o->grow_batch = 1;
    return 0;
}

int cli_plan(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 0);
    plan_opts o = {.batch = 8, .seq = 128, .top = 5, .fraction = 0.9, .verify = -1, .refine = -1, .place_top = 3};
    for (int i = 1; i < argc; i++) {
        int t = take(&o, argc, argv, &i);
        if (t < 0) return 2;
        if (!t) {
            cli_error("plan: unknown option '%s' (shard plan --help lists them)", argv[i]);
            return 2;
        }
    }
    if (!o.config || !o.cluster) {
        cli_error("plan: give --config (the model) and --cluster (the devices it may run on)");
        return 2;
    }
    shard_cluster *cluster = NULL;
    shard_machine_profile *prof = NULL;
    shard_plan_result *r = NULL;
    shard_status s = shard_model_config_check(o.config);
    if (s == SHARD_OK) s = cli_load_cluster_profile("plan", o.cluster, o.device_map, o.profile, &cluster, &prof);
    shard_trainer_config tc = {.config_path = o.config,
                               .batch = (size_t)o.batch,
                               .seq = (size_t)o.seq,
                               .seed = 1,
                               .adamw = shard_adamw_defaults(),
                               .clip = 1.0f,
                               .bucket_mb = 25};
    tc.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 1};
    shard_plan_options po = {.struct_size = sizeof po,
                             .train = &tc,
                             .cluster = cluster,
                             .profile = prof,
                             .goal = o.goal,
                             .max_memory_fraction = o.fraction,
                             .search = o.search,
                             .latency_budget_ms = o.latency_budget,
                             .grow_batch = o.grow_batch,
                             .grad_dtypes = o.grad_dtypes,
                             .max_comm_fraction = o.comm_fraction,
                             .max_compute_imbalance = o.compute_imbalance,
                             .refine = o.refine == 0 ? -1
                                 : o.refine == -1    ? 0
                                                     : (int)o.refine,
                             .place_top = (int)o.place_top,
                             .verify = o.verify == 0 ? -1
                                 : o.verify == -1    ? 0
                                                     : (int)o.verify};
    if (s == SHARD_OK) s = shard_plan_search(&po, &r);
    if (s == SHARD_OK) s = shard_plan_place(&po, r, o.placement, o.device_map != NULL);
    char explanation[2048] = "";
    if (s == SHARD_OK) shard_plan_explain(r, o.goal, explanation, sizeof explanation);
    if (s == SHARD_OK && o.out) s = write_plan(o.out, r, explanation);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        shard_cluster_destroy(cluster), free(prof), shard_plan_result_destroy(r);
        return 1;
    }
    size_t top = (size_t)o.top < r->fitting ? (size_t)o.top : r->fitting;
    if (o.json) {
        json_t *root = json_object(), *plans = json_array();
        json_object_set_new(root, "goal", json_string(o.goal ? o.goal : "throughput"));
        json_object_set_new(root, "world", json_integer(r->world));
        json_object_set_new(root, "tried", json_integer((json_int_t)r->count));
        json_object_set_new(root, "fitting", json_integer((json_int_t)r->fitting));
        json_object_set_new(
            root, "batch",
            json_integer((json_int_t)(r->candidate[0].batch ? r->candidate[0].batch : r->requested_batch)));
        json_t *larger = json_null();
        if (r->larger.batch) {
            larger = json_object();
            json_object_set_new(larger, "batch", json_integer((json_int_t)r->larger.batch));
            json_object_set_new(larger, "step_ms", json_real(r->larger.step_ms));
            json_object_set_new(larger, "tokens_per_s", json_real(r->larger.tokens_per_s));
            json_object_set_new(larger, "peak_bytes", json_real(r->larger.peak_bytes));
        }
        json_object_set_new(root, "larger_batch", larger);
        json_object_set_new(root, "search_seconds", json_real(r->search_seconds));
        json_object_set_new(root, "verify_seconds", json_real(r->verify_seconds));
        for (size_t i = 0; i < top; i++) json_array_append_new(plans, candidate_json(&r->candidate[i]));
        json_object_set_new(root, "plans", plans);
        json_t *placed = json_array();
        for (size_t i = 0; i < r->placements; i++) {
            const shard_plan_placement *p = &r->placement[i];
            json_t *x = json_object();
            json_object_set_new(x, "method", json_string(p->method));
            json_object_set_new(x, "step_ms", json_real(p->step_ms));
            json_object_set_new(x, "seconds", json_real(p->seconds));
            json_object_set_new(x, "device_map", map_json(p->device_map, r->world));
            if (p->over_bytes > 0) json_object_set_new(x, "over_bytes", json_real(p->over_bytes));
            json_array_append_new(placed, x);
        }
        json_object_set_new(root, "placement", placed);
        json_object_set_new(root, "placed_by", json_string(r->placed_by));
        json_object_set_new(root, "layouts_placed", json_integer((json_int_t)r->candidates_placed));
        json_object_set_new(root, "placed_rank", json_integer((json_int_t)r->placed_rank + 1));
        json_object_set_new(root, "explanation", json_string(explanation));
        char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(10));
        json_decref(root);
        if (text) puts(text);
        free(text);
    } else {
        printf("plan: %zu layouts tried on %d devices, %zu fit (%.2f s%s", r->count, r->world, r->fitting,
               r->search_seconds, r->screened && r->verify_seconds > 0 ? "" : ")\n");
        if (r->screened && r->verify_seconds > 0)
            printf(", then %.2f s checking the best by dry run)\n", r->verify_seconds);
        printf("  %-4s %-48s %10s %12s %10s %8s\n", "#", "layout", "step ms", "tokens/s", "peak GiB", "bubble");
        for (size_t i = 0; i < top; i++) {
            const shard_plan_candidate *c = &r->candidate[i];
            char flags[400];
            table_text(c, flags, sizeof flags);
            printf("  %-4zu %-48s %10.2f %12.0f %10.3f %8.3f\n", i + 1, flags, c->step_ms, c->tokens_per_s,
                   c->peak_bytes / 1073741824.0, c->bubble);
        }
        if (r->placements) {
            printf("placement:");
            for (size_t i = 0; i < r->placements; i++)
                printf("%s %s %.2f ms (%.3f s)", i ? "," : "", r->placement[i].method, r->placement[i].step_ms,
                       r->placement[i].seconds);
            printf("; device map");
            for (int i = 0; i < r->world; i++) printf("%s%zu", i ? "," : " ", r->device_map[i]);
            printf(" (%s)\n",
                   strcmp(r->placed_by, "given") == 0 ? "as given"
                       : r->placed_by[0]              ? r->placed_by
                                                      : "as searched: no placement predicts less");
        }
        printf("%s\n", explanation);
        if (o.out) printf("plan: written to %s\n", o.out);
    }
    shard_cluster_destroy(cluster), free(prof), shard_plan_result_destroy(r);
    return 0;
}
