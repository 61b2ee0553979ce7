/* bench_plan.c — `shard bench plan`: how good the planner's choice is, measured.  For each cluster and
 * config, the planner's top layouts and a fixed list of hand-picked layouts (the ones a person would try
 * first on that many devices, those of them that fit) each train a few steps under the cluster's
 * emulation; the chosen plan's measured step time is set against the best measured one, and against the
 * best layout that splits evenly (what a planner that ignores how the devices differ could pick).
 *
 *   shard bench plan [--config FILE]... [--cluster FILE]... [--goal G] [--batch B] [--seq S] [--top N]
 *                    [--steps S] [--warmup W] [--json] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"
#include "profile.h"

static const char *const USAGE =
    "usage: shard bench plan [--config FILE]... [--cluster FILE]... [--goal G] [--batch B] [--seq S]\n"
    "                        [--top N] [--steps S] [--warmup W] [--json]\n"
    "\n"
    "The planner against measurement: for each cluster and config, shard plan's top layouts and a fixed\n"
    "list of about 20 hand-picked ones (every data/tensor/pipe split a person would try first, with ZeRO\n"
    "and sequence parallel variants; those that fit) train --warmup + --steps steps each under the\n"
    "cluster's emulation (thread ranks, random tokens).  Reports the chosen plan's measured step time\n"
    "against the best measured layout (ratio = best / chosen: 1 means the planner found the best), and\n"
    "against the best layout with even splits (even_best_ms: equal batch shares and layers per stage).\n"
    "\n"
    "options:\n"
    "  --config FILE            a GPT config, repeatable (default configs/gpt-tiny.json)\n"
    "  --cluster FILE           a cluster, repeatable (default the three of examples/clusters/)\n"
    "  --goal G                 the planner's goal: throughput (default), latency, memory or balance\n"
    "  --batch B                global batch rows, 1..4096 (default 8)\n"
    "  --seq S                  tokens per row, 1..4096 (default 64)\n"
    "  --top N                  the planner's best N layouts measured, 1..20 (default 5)\n"
    "  --steps S                timed steps per layout, 5..1000 (default 5)\n"
    "  --warmup W               untimed steps first, 1..100 (default 1)\n"
    "  --json                   one JSON object per cluster and config: cluster, config, goal, chosen,\n"
    "                           chosen_ms, chosen_predicted_ms, chosen_peak_bytes,\n"
    "                           chosen_predicted_peak_bytes, best, best_ms, ratio, even_best,\n"
    "                           even_best_ms, gain_vs_even, layouts [layout, predicted_ms, measured_ms,\n"
    "                           predicted_peak_bytes, peak_bytes, planner_rank, hand_picked]\n";

enum { MAX_FILES = 8, MAX_MEASURED = 48 };

/* A hand-picked layout for W devices: the mesh's degrees as fractions of W (0: the axis absent). */
typedef struct hand_layout {
    int tensor, pipe; /* the degree (data takes the rest) */
    int zero, sp, micro_per_stage;
} hand_layout;

static const hand_layout hand_picked[] = {
    {1, 1, 0, 0, 0}, {1, 1, 1, 0, 0}, {1, 1, 2, 0, 0}, {1, 1, 3, 0, 0}, /* data parallel, ZeRO 0-3 */
    {2, 1, 0, 0, 0}, {2, 1, 1, 0, 0}, {2, 1, 0, 1, 0}, {2, 1, 3, 0, 0}, /* data x tensor=2 */
    {4, 1, 0, 0, 0}, {4, 1, 0, 1, 0},                                   /* data x tensor=4 */
    {1, 2, 0, 0, 2}, {1, 2, 1, 0, 2}, {1, 2, 0, 0, 1},                  /* data x pipe=2 */
    {1, 4, 0, 0, 2}, {1, 4, 0, 0, 1},                                   /* data x pipe=4 */
    {2, 2, 0, 0, 2}, {2, 2, 1, 0, 2}, {2, 2, 0, 1, 2},                  /* data x tensor=2 x pipe=2 */
    {4, 2, 0, 0, 2}, {2, 4, 0, 0, 2},
};
#define HAND_PICKED ((int)(sizeof hand_picked / sizeof hand_picked[0]))

/* Whether candidate c is hand-picked layout h on W devices (even splits only). */
static int is_picked(const shard_plan_candidate *c, const hand_layout *h, int W) {
    if (W % (h->tensor * h->pipe)) return 0;
    char mesh[96];
    int d = W / (h->tensor * h->pipe), used = snprintf(mesh, sizeof mesh, "data=%d", d);
    if (h->tensor > 1) used += snprintf(mesh + used, sizeof mesh - (size_t)used, ",tensor=%d", h->tensor);
    if (h->pipe > 1) snprintf(mesh + used, sizeof mesh - (size_t)used, ",pipe=%d", h->pipe);
    if (h->zero && d < 2) return 0;
    return strcmp(c->mesh, mesh) == 0 && c->zero == h->zero && c->sequence_parallel == h->sp && !c->recompute &&
        c->micro_batches == (size_t)(h->micro_per_stage * (h->pipe > 1 ? h->pipe : 0)) && !c->layers_per_stage[0] &&
        !c->batch_shares[0] && !c->accum && !c->virtual_stages && !c->grad_dtype[0] &&
        (h->pipe == 1 || strcmp(c->schedule, "1f1b") == 0);
}

typedef struct measured {
    const shard_plan_candidate *c;
    size_t rank; /* in the planner's order, from 1 */
    int picked;
    double ms, peak_bytes; /* measured: the median step; the fullest rank's peak */
} measured;

typedef struct plan_bench {
    const char *configs[MAX_FILES], *clusters[MAX_FILES];
    int nconfigs, nclusters;
    const char *goal;
    long batch, seq, top, steps, warmup;
    int json;
} plan_bench;

static int is_even(const shard_plan_candidate *c) { return !c->layers_per_stage[0] && !c->batch_shares[0]; }

/* The layouts one cluster and config measure: the top fitting ones and the hand-picked that fit. */
static int select_layouts(const shard_plan_result *r, long top, measured *m) {
    int n = 0;
    for (size_t i = 0; i < r->fitting && n < MAX_MEASURED; i++) {
        const shard_plan_candidate *c = &r->candidate[i];
        int picked = 0;
        for (int h = 0; h < HAND_PICKED; h++) picked |= is_picked(c, &hand_picked[h], r->world);
        if ((long)i < top || picked) m[n++] = (measured){c, i + 1, picked, 0, 0};
    }
    return n;
}

static shard_status bench_one(const plan_bench *b, const char *config, const char *cluster_file, const char *dir) {
    shard_cluster *cluster = NULL;
    shard_plan_result *r = NULL;
    shard_trainer_config tc = {.config_path = config,
                               .data_dir = dir,
                               .batch = (size_t)b->batch,
                               .seq = (size_t)b->seq,
                               .seed = 1,
                               .bucket_mb = 25,
                               .adamw = shard_adamw_defaults(),
                               .clip = 1.0f};
    tc.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 100000};
    shard_status s = shard_cluster_load(cluster_file, &cluster);
    shard_plan_options po = {.struct_size = sizeof po, .train = &tc, .cluster = cluster, .goal = b->goal};
    if (s == SHARD_OK) s = shard_plan_search(&po, &r);
    measured m[MAX_MEASURED];
    int n = s == SHARD_OK ? select_layouts(r, b->top, m) : 0;
    for (int i = 0; i < n && s == SHARD_OK; i++) {
        shard_trainer_config run = tc;
        shard_plan_candidate_apply(m[i].c, &run);
        s = layout_measure(&run, m[i].c->mesh, cluster, (int)b->warmup, (int)b->steps, &m[i].ms, &m[i].peak_bytes);
        if (!b->json) {
            char text[256];
            shard_plan_candidate_text(m[i].c, text, sizeof text);
            fprintf(stderr, "bench plan: %s: %s measured %.1f ms (predicted %.1f)\n", cluster_file, text, m[i].ms,
                    m[i].c->step_ms);
        }
    }
    if (s == SHARD_OK && n > 0) {
        int best = 0, even = -1;
        for (int i = 0; i < n; i++) {
            if (m[i].ms < m[best].ms) best = i;
            if (is_even(m[i].c) && (even < 0 || m[i].ms < m[even].ms)) even = i;
        }
        const measured *chosen = &m[0]; /* the planner's first is measured first */
        char ctext[256], btext[256], etext[256] = "", j1[600], j2[600], j3[300], j4[300], j5[600];
        shard_plan_candidate_text(chosen->c, ctext, sizeof ctext);
        shard_plan_candidate_text(m[best].c, btext, sizeof btext);
        if (even >= 0) shard_plan_candidate_text(m[even].c, etext, sizeof etext);
        double ratio = m[best].ms / chosen->ms, gain = even >= 0 ? m[even].ms / chosen->ms : 0;
        if (b->json) {
            printf("{\"cluster\": %s, \"config\": %s, \"goal\": \"%s\", \"chosen\": %s, \"chosen_ms\": %.4f, "
                   "\"chosen_predicted_ms\": %.4f, \"chosen_peak_bytes\": %.0f, \"chosen_predicted_peak_bytes\": "
                   "%.0f, \"best\": %s, \"best_ms\": %.4f, \"ratio\": %.4f, ",
                   cli_json_string(cluster_file, j1, sizeof j1), cli_json_string(config, j2, sizeof j2),
                   b->goal ? b->goal : "throughput", cli_json_string(ctext, j3, sizeof j3), chosen->ms,
                   chosen->c->step_ms, chosen->peak_bytes, chosen->c->peak_bytes, cli_json_string(btext, j4, sizeof j4),
                   m[best].ms, ratio);
            if (even >= 0)
                printf("\"even_best\": %s, \"even_best_ms\": %.4f, \"gain_vs_even\": %.4f, \"layouts\": [",
                       cli_json_string(etext, j5, sizeof j5), m[even].ms, gain);
            else
                printf("\"even_best\": null, \"even_best_ms\": null, \"gain_vs_even\": null, \"layouts\": [");
            for (int i = 0; i < n; i++) {
                char t[256];
                shard_plan_candidate_text(m[i].c, t, sizeof t);
                printf("%s{\"layout\": %s, \"predicted_ms\": %.4f, \"measured_ms\": %.4f, \"predicted_peak_bytes\": "
                       "%.0f, \"peak_bytes\": %.0f, \"planner_rank\": %zu, \"hand_picked\": %s}",
                       i ? ", " : "", cli_json_string(t, j1, sizeof j1), m[i].c->step_ms, m[i].ms, m[i].c->peak_bytes,
                       m[i].peak_bytes, m[i].rank, m[i].picked ? "true" : "false");
            }
            printf("]}\n");
        } else {
            printf("# %s, %s, goal %s: %d layouts measured (%ld steps after %ld)\n", cluster_file, config,
                   b->goal ? b->goal : "throughput", n, b->steps, b->warmup);
            printf("  %-4s %-60s %12s %12s %s\n", "rank", "layout", "predicted_ms", "measured_ms", "");
            for (int i = 0; i < n; i++) {
                char t[256];
                shard_plan_candidate_text(m[i].c, t, sizeof t);
                printf("  %-4zu %-60s %12.2f %12.2f %s\n", m[i].rank, t, m[i].c->step_ms, m[i].ms,
                       m[i].picked ? "hand-picked" : "");
            }
            printf("chosen %s: %.2f ms (predicted %.2f, %+.1f %%), peak %.0f bytes on the fullest rank (predicted "
                   "%.0f, %+.2f %%); best measured %s: %.2f ms; ratio %.3f\n",
                   ctext, chosen->ms, chosen->c->step_ms, 100 * (chosen->c->step_ms / chosen->ms - 1),
                   chosen->peak_bytes, chosen->c->peak_bytes, 100 * (chosen->c->peak_bytes / chosen->peak_bytes - 1),
                   btext, m[best].ms, ratio);
            if (even >= 0)
                printf("best with even splits %s: %.2f ms; the chosen plan is %.2fx as fast\n", etext, m[even].ms,
                       gain);
        }
        fflush(stdout);
    }
    shard_plan_result_destroy(r);
    shard_cluster_destroy(cluster);
    return s;
}

static int add_file(const char **list, int *n, const char *what, const char *v) {
    if (*n == MAX_FILES) {
        cli_error("bench plan: more than %d %s files: give at most %d", MAX_FILES, what, MAX_FILES);
        return 2;
    }
    list[(*n)++] = v;
    return 0;
}

int cli_bench_plan(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 0);
    plan_bench b = {.batch = 8, .seq = 64, .top = 5, .steps = 5, .warmup = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--json") == 0) {
            b.json = 1;
        } else if (strcmp(a, "--config") == 0 || strcmp(a, "--cluster") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            int bad = strcmp(a, "--config") == 0 ? add_file(b.configs, &b.nconfigs, "config", v)
                                                 : add_file(b.clusters, &b.nclusters, "cluster", v);
            if (bad) return bad;
        } else if (strcmp(a, "--goal") == 0) {
            if (!(b.goal = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--batch") == 0 || strcmp(a, "--seq") == 0 || strcmp(a, "--top") == 0 ||
                   strcmp(a, "--steps") == 0 || strcmp(a, "--warmup") == 0) {
            long *into = strcmp(a, "--batch") == 0 ? &b.batch
                : strcmp(a, "--seq") == 0          ? &b.seq
                : strcmp(a, "--top") == 0          ? &b.top
                : strcmp(a, "--steps") == 0        ? &b.steps
                                                   : &b.warmup;
            long lo = into == &b.steps ? 5 : 1,
                 hi = into == &b.top ? 20
                : into == &b.steps   ? 1000
                : into == &b.warmup  ? 100
                                     : 4096;
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, lo, hi, into)) return 2;
        } else {
            cli_unknown_option("bench plan", a, USAGE);
            return 2;
        }
    }
    char defaults[4][512];
    if (!b.nconfigs) {
        snprintf(defaults[0], sizeof defaults[0], "%s/configs/gpt-tiny.json", SHARD_SOURCE_DIR);
        b.configs[b.nconfigs++] = defaults[0];
    }
    static const char *const example[] = {"homogeneous-8", "two-nodes-slow-link", "heterogeneous"};
    for (int k = 0; !b.nclusters && k < 3; k++) {
        snprintf(defaults[1 + k], sizeof defaults[1 + k], "%s/examples/clusters/%s.json", SHARD_SOURCE_DIR, example[k]);
        b.clusters[k] = defaults[1 + k];
        if (k == 2) b.nclusters = 3;
    }
    shard_status s = SHARD_OK;
    for (int k = 0; k < b.nconfigs && s == SHARD_OK; k++) {
        char dir[256] = "";
        shard_gpt_config gc;
        s = shard_model_config_check(b.configs[k]);
        if (s == SHARD_OK) s = bench_random_tokens(b.configs[k], &gc, dir, sizeof dir);
        for (int c = 0; c < b.nclusters && s == SHARD_OK; c++) s = bench_one(&b, b.configs[k], b.clusters[c], dir);
        if (dir[0]) bench_remove_dir(dir);
    }
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}
