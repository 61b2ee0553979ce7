/* bench_analyze.c — `shard bench analyze`: the cost model's predicted step time (shard analyze
 * --profile) against real runs of the same layouts of the tiny GPT on thread ranks, with each error and
 * whether the predicted ranking of the layouts is the measured one (pairs closer than 5 % aside).
 *
 *   shard bench analyze [--profile machine.json] [--limit N] [--steps S] [--warmup W] [--json]
 *
 * Without --profile the machine is profiled first (as `shard profile`, the full sweep). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"
#include "profile.h"

static const char *const USAGE =
    "usage: shard bench analyze [--profile FILE] [--cluster FILE [--device-map LIST]] [--limit N] [--steps S]\n"
    "                           [--warmup W] [--rounds R] [--json]\n"
    "\n"
    "The cost model's predicted step time against real runs of the tiny GPT (configs/gpt-tiny.json,\n"
    "batch 8, seq 64) on thread ranks, for 14 layouts (data, ZeRO 1-3, tensor with and without sequence\n"
    "parallel, pipe with gpipe, 1f1b and interleaved, 2-D and 3-D meshes): the median of --steps steps\n"
    "after --warmup, the error (predicted / measured - 1), whether the layout has more ranks than cores,\n"
    "and whether the layouts ranked by predicted time rank as measured (pairs measured within 5 % of\n"
    "each other aside).\n"
    "\n"
    "options:\n"
    "  --profile FILE           the machine profile (default: profile this machine first, as shard profile,\n"
    "                           unless --cluster is given)\n"
    "  --cluster FILE           run and predict every layout on this emulated cluster (its ranks on the\n"
    "                           devices in order): predictions from the cluster's rates and links, and\n"
    "                           the profile's for the host's part when --profile is given too\n"
    "  --device-map LIST        with --cluster: mesh position i on device LIST[i]\n"
    "  --limit N                the first N layouts only, 1..14 (default 14)\n"
    "  --steps S                timed steps per layout, 5..1000 (default 7)\n"
    "  --warmup W               untimed steps first, 1..100 (default 2)\n"
    "  --rounds R               measure the layouts R times in turn, 1..100 (default 1): each layout's\n"
    "                           figure the median of its rounds' medians, so a drift of the host's\n"
    "                           speed over the run touches every layout alike\n"
    "  --json                   one JSON object: profile, cluster, layouts [layout, ranks, predicted_ms,\n"
    "                           measured_ms, error, oversubscribed], ranking_matches, discordant_pairs\n";

typedef struct bench_layout {
    const char *mesh;
    int zero;
    const char *schedule;
    int virtual_stages, sequence_parallel;
} bench_layout;

static const bench_layout layouts[] = {
    {"data=1", 0, NULL, 0, 0},          {"data=2", 0, NULL, 0, 0},
    {"data=2", 1, NULL, 0, 0},          {"data=2", 2, NULL, 0, 0},
    {"data=2", 3, NULL, 0, 0},          {"tensor=2", 0, NULL, 0, 0},
    {"tensor=2", 0, NULL, 0, 1},        {"pipe=2", 0, "gpipe", 0, 0},
    {"pipe=2", 0, "1f1b", 0, 0},        {"pipe=2", 0, "interleaved", 2, 0},
    {"data=4", 1, NULL, 0, 0},          {"data=2,tensor=2", 0, NULL, 0, 0},
    {"data=2,pipe=2", 0, "1f1b", 0, 0}, {"data=2,tensor=2,pipe=2", 1, "1f1b", 0, 0},
};
#define LAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))

typedef struct measure_run {
    const shard_trainer_config *tc;
    const char *mesh;
    int warmup, steps;
    double median_ms;  /* rank 0's */
    double peak_bytes; /* the fullest rank's */
    double *each_ms;   /* NULL, or each timed step's slowest-rank time (in step order) */
} measure_run;

static shard_status measure_rank(shard_comm *world, void *arg) {
    measure_run *m = arg;
    SHARD_CHECK(shard_share_cores(world));
    shard_mesh *mesh = NULL;
    shard_trainer *t = NULL;
    double *ms = calloc((size_t)m->steps, sizeof *ms);
    shard_status s = ms ? shard_mesh_create(world, m->mesh, &mesh) : SHARD_ERR_NO_MEMORY;
    if (s == SHARD_OK) s = shard_trainer_create(mesh, m->tc, &t);
    for (int i = 0; s == SHARD_OK && i < m->warmup + m->steps; i++) {
        shard_step_result r;
        s = shard_comm_barrier(world);
        if (s == SHARD_OK) s = shard_trainer_step(t, (uint64_t)i + 1, &r);
        double slowest = r.ms;
        if (s == SHARD_OK) s = shard_comm_all_reduce(world, &slowest, &slowest, 1, SHARD_F64, SHARD_OP_MAX);
        if (s == SHARD_OK && i >= m->warmup) ms[i - m->warmup] = slowest;
    }
    shard_mem_stats st;
    shard_mem_stats_get(&st);
    double peak = (double)st.total_peak_bytes;
    if (s == SHARD_OK) s = shard_comm_all_reduce(world, &peak, &peak, 1, SHARD_F64, SHARD_OP_MAX);
    if (s == SHARD_OK && shard_comm_rank(world) == 0) {
        if (m->each_ms) memcpy(m->each_ms, ms, (size_t)m->steps * sizeof *ms);
        m->median_ms = cli_median(ms, m->steps), m->peak_bytes = peak;
    }
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    free(ms);
    return s;
}

static int mesh_ranks(const char *mesh) {
    int world = 1;
    for (const char *m = mesh; m; m = strchr(m, ',') ? strchr(m, ',') + 1 : NULL) world *= atoi(strchr(m, '=') + 1);
    return world;
}

/* m's layout on thread ranks (on the cluster's devices when given). */
static shard_status measure_layout(const char *mesh, const shard_cluster *cluster, measure_run *m) {
    shard_launch_config lc = shard_launch_config_default();
    lc.ranks = mesh_ranks(mesh), lc.backend = SHARD_BACKEND_THREADS, lc.cluster = cluster;
    /* a world of one computes on every core, as shard train's does (more ranks share them: one each) */
    if (lc.ranks == 1) SHARD_CHECK(shard_blas_set_threads(bench_cores()));
    return shard_launch_with(&lc, measure_rank, m);
}

shard_status layout_measure_each(const shard_trainer_config *tc, const char *mesh, int warmup, int steps,
                                 double *step_ms) {
    measure_run m = {.tc = tc, .mesh = mesh, .warmup = warmup, .steps = steps, .each_ms = step_ms};
    return measure_layout(mesh, NULL, &m);
}

shard_status layout_measure(const shard_trainer_config *tc, const char *mesh, const shard_cluster *cluster, int warmup,
                            int steps, double *median_ms, double *peak_bytes) {
    measure_run m = {.tc = tc, .mesh = mesh, .warmup = warmup, .steps = steps};
    SHARD_CHECK(measure_layout(mesh, cluster, &m));
    *median_ms = m.median_ms;
    if (peak_bytes) *peak_bytes = m.peak_bytes;
    return SHARD_OK;
}

shard_status layout_predict(const shard_trainer_config *tc, const char *mesh, const shard_machine_profile *p,
                            const shard_cluster *cluster, shard_analysis **analysis,
                            shard_step_prediction **prediction) {
    *prediction = NULL;
    shard_analyze_options ao = {.struct_size = sizeof ao, .train = tc, .mesh = mesh};
    SHARD_CHECK(shard_analyze(&ao, analysis));
    shard_cost_options co = {.struct_size = sizeof co, .backend = "threads", .cluster = cluster};
    return shard_cost_predict(*analysis, p, &co, prediction);
}

typedef struct bench_row {
    char layout[256];
    int ranks, oversubscribed;
    double predicted_ms, measured_ms;
} bench_row;

/* Pairs whose predicted order is not the measured one, of those measured 5 % or more apart. */
static int discordant_pairs(const bench_row *rows, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double a = rows[i].measured_ms, b = rows[j].measured_ms;
            if (fabs(a - b) < 0.05 * (a < b ? a : b)) continue;
            if ((a < b) != (rows[i].predicted_ms < rows[j].predicted_ms)) bad++;
        }
    return bad;
}

/* The layout's trainer config: the tiny GPT at batch 8, seq 64, the layout's flags. */
static shard_trainer_config layout_config(const bench_layout *l, const char *config, const char *dir) {
    shard_trainer_config tc = {.config_path = config,
                               .data_dir = dir,
                               .batch = 8,
                               .seq = 64,
                               .seed = 1,
                               .zero = l->zero,
                               .bucket_mb = 25,
                               .adamw = shard_adamw_defaults(),
                               .clip = 1.0f,
                               .sequence_parallel = l->sequence_parallel,
                               .schedule = l->schedule,
                               .micro_batches = l->schedule ? 4 : 0,
                               .virtual_stages = l->virtual_stages};
    tc.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 100000};
    return tc;
}

/* Every layout predicted, then measured `rounds` times round-robin (the layouts in turn, then again), so a
 * drift of the host's speed during the run touches every layout alike: the median of its rounds' medians. */
static shard_status run_matrix(const shard_machine_profile *p, const shard_cluster *cluster, const char *config,
                               const char *dir, int limit, int warmup, int steps, int rounds, bench_row *rows) {
    double *round_ms = calloc((size_t)limit * (size_t)rounds, sizeof *round_ms);
    if (!round_ms) return shard_error(SHARD_ERR_NO_MEMORY, "bench analyze: out of memory");
    shard_status s = SHARD_OK;
    for (int i = 0; i < limit && s == SHARD_OK; i++) {
        shard_trainer_config tc = layout_config(&layouts[i], config, dir);
        shard_analysis *a = NULL;
        shard_step_prediction *x = NULL;
        s = layout_predict(&tc, layouts[i].mesh, p, cluster, &a, &x);
        bench_row *r = &rows[i];
        if (s == SHARD_OK) {
            snprintf(r->layout, sizeof r->layout, "%s", a->layout);
            r->ranks = a->world, r->oversubscribed = x->oversubscribed, r->predicted_ms = x->step_ms;
        }
        shard_step_prediction_destroy(x);
        shard_analysis_destroy(a);
    }
    for (int k = 0; k < rounds && s == SHARD_OK; k++)
        for (int i = 0; i < limit && s == SHARD_OK; i++) {
            shard_trainer_config tc = layout_config(&layouts[i], config, dir);
            s = layout_measure(&tc, layouts[i].mesh, cluster, warmup, steps, &round_ms[i * rounds + k], NULL);
        }
    for (int i = 0; i < limit && s == SHARD_OK; i++) rows[i].measured_ms = cli_median(&round_ms[i * rounds], rounds);
    free(round_ms);
    return s;
}

static void print_rows(const shard_machine_profile *p, const char *cluster, const bench_row *rows, int n, int json) {
    int bad = discordant_pairs(rows, n);
    char cluster_json[600];
    if (json) {
        if (p)
            printf("{\"profile\": {\"machine\": \"%s\", \"date\": \"%s\", \"cores\": %d}, ", p->machine, p->date,
                   p->cores);
        else
            printf("{\"profile\": null, ");
        printf("\"cluster\": %s, \"layouts\": [",
               cluster ? cli_json_string(cluster, cluster_json, sizeof cluster_json) : "null");
        for (int i = 0; i < n; i++)
            printf("%s{\"layout\": \"%s\", \"ranks\": %d, \"predicted_ms\": %.4f, \"measured_ms\": %.4f, "
                   "\"error\": %.4f, \"oversubscribed\": %s}",
                   i ? ", " : "", rows[i].layout, rows[i].ranks, rows[i].predicted_ms, rows[i].measured_ms,
                   rows[i].predicted_ms / rows[i].measured_ms - 1, rows[i].oversubscribed ? "true" : "false");
        printf("], \"ranking_matches\": %s, \"discordant_pairs\": %d}\n", bad ? "false" : "true", bad);
    } else {
        if (p) printf("# shard bench analyze: %s, %d cores, profile of %s\n", p->machine, p->cores, p->date);
        if (cluster) printf("# on the emulated cluster %s (each run's ranks on its devices)\n", cluster);
        printf("%-48s %5s %12s %12s %8s %s\n", "layout", "ranks", "predicted_ms", "measured_ms", "error", "");
        for (int i = 0; i < n; i++)
            printf("%-48s %5d %12.2f %12.2f %+7.1f%% %s\n", rows[i].layout, rows[i].ranks, rows[i].predicted_ms,
                   rows[i].measured_ms, 100 * (rows[i].predicted_ms / rows[i].measured_ms - 1),
                   rows[i].oversubscribed ? "oversubscribed" : "");
        printf("ranking by predicted time %s the measured one (%d discordant pairs of those >= 5 %% apart)\n",
               bad ? "differs from" : "matches", bad);
    }
    fflush(stdout);
}

int cli_bench_analyze(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 0);
    const char *profile = NULL, *cluster_file = NULL, *device_map = NULL;
    long limit = LAYOUTS, steps = 7, warmup = 2, rounds = 1;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--profile") == 0) {
            if (!(profile = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--cluster") == 0 || strcmp(a, "--device-map") == 0) {
            if (!(*(a[2] == 'c' ? &cluster_file : &device_map) = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--rounds") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 100, &rounds)) return 2;
        } else if (strcmp(a, "--limit") == 0 || strcmp(a, "--steps") == 0 || strcmp(a, "--warmup") == 0) {
            long *into = a[2] == 'l' ? &limit : a[2] == 's' ? &steps : &warmup;
            long lo = a[2] == 's' ? 5 : 1, hi = a[2] == 'l' ? LAYOUTS : a[2] == 's' ? 1000 : 100;
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, lo, hi, into)) return 2;
        } else {
            cli_unknown_option("bench analyze", a, USAGE);
            return 2;
        }
    }
    shard_machine_profile *p = NULL;
    shard_cluster *cluster = NULL;
    bench_row *rows = calloc(LAYOUTS, sizeof *rows);
    char config[512], dir[256] = "";
    snprintf(config, sizeof config, "%s/configs/gpt-tiny.json", SHARD_SOURCE_DIR);
    shard_gpt_config gc;
    shard_status s = rows ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "bench analyze: out of memory");
    if (s == SHARD_OK) s = cli_load_cluster_profile("bench analyze", cluster_file, device_map, profile, &cluster, &p);
    if (s == SHARD_OK && !cluster_file && !profile) /* neither given: this machine's profile, measured */
        s = (p = malloc(sizeof *p)) ? profile_machine(0, p)
                                    : shard_error(SHARD_ERR_NO_MEMORY, "bench analyze: out of memory");
    if (s == SHARD_OK) s = bench_random_tokens(config, &gc, dir, sizeof dir);
    if (s == SHARD_OK) s = run_matrix(p, cluster, config, dir, (int)limit, (int)warmup, (int)steps, (int)rounds, rows);
    if (dir[0]) bench_remove_dir(dir);
    if (s == SHARD_OK) print_rows(p, cluster_file, rows, (int)limit, json);
    free(p), free(rows);
    shard_cluster_destroy(cluster);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}
