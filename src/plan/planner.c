/* planner.c — see plan.h: the layouts a cluster could run, each analyzed by the dry run and priced on
 * the cluster, cut by memory, ranked by the goal.
 *
 * The search is exhaustive over a small space: every data x tensor x pipe factorisation of the
 * cluster's devices (x expert for a mixture of experts), ZeRO 0-3 where there is a data axis,
 * sequence parallel where there is a tensor axis, and on a pipe axis 1F1B with p or 2p micro-batches,
 * recomputation tried only where the same layout without it does not fit.  A layout the trainer
 * refuses (heads not divisible, too few rows per micro-step, ...) is kept with the trainer's reason. */
#include "shard/plan.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/analyze.h"
#include "shard/monitor.h"

void shard_plan_result_destroy(shard_plan_result *r) {
    if (!r) return;
    free(r->candidate);
    free(r);
}

/* The config's num_local_experts (0: dense, or not a GPT). */
static long config_experts(const char *path) {
    json_error_t err;
    json_t *root = path ? json_load_file(path, 0, &err) : NULL;
    json_t *e = root ? json_object_get(root, "num_local_experts") : NULL;
    long n = json_is_integer(e) ? (long)json_integer_value(e) : 0;
    json_decref(root);
    return n;
}

typedef struct search {
    const shard_plan_options *o;
    double fraction;
    shard_plan_candidate *c;
    size_t n, cap;
} search;

/* Analyze and price one layout into a new candidate. */
static shard_status try_layout(search *sr, const char *mesh, int zero, int sp, const char *schedule, size_t micro,
                               int recompute, shard_plan_candidate **made) {
    if (sr->n == sr->cap) {
        size_t cap = sr->cap ? 2 * sr->cap : 64;
        shard_plan_candidate *more = realloc(sr->c, cap * sizeof *more);
        if (!more) return shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
        sr->c = more, sr->cap = cap;
    }
    shard_plan_candidate *c = &sr->c[sr->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->mesh, sizeof c->mesh, "%s", mesh);
    snprintf(c->schedule, sizeof c->schedule, "%s", schedule ? schedule : "");
    c->zero = zero, c->sequence_parallel = sp, c->micro_batches = micro, c->recompute = recompute;
    *made = c;
    shard_trainer_config tc = *sr->o->train;
    tc.zero = zero, tc.sequence_parallel = sp, tc.schedule = schedule, tc.micro_batches = micro;
    tc.recompute = recompute, tc.micro_batch = 0, tc.accum = 0, tc.virtual_stages = 0;
    tc.layers_per_stage = NULL, tc.batch_shares = NULL;
    shard_analysis *a = NULL;
    shard_step_prediction *x = NULL;
    shard_analyze_options ao = {.struct_size = sizeof ao, .train = &tc, .mesh = mesh};
    shard_status s = shard_analyze(&ao, &a);
    if (s < 0) { /* the trainer's refusal: a reason, not a failure of the search */
        snprintf(c->why, sizeof c->why, "%s", shard_last_error());
        shard_clear_error();
        return SHARD_OK;
    }
    shard_cost_options co = {.struct_size = sizeof co, .backend = "threads", .cluster = sr->o->cluster};
    s = shard_cost_predict(a, sr->o->profile, &co, &x);
    if (s == SHARD_OK) {
        c->valid = 1, c->fits = 1;
        c->step_ms = x->step_ms, c->tokens_per_s = x->tokens_per_s, c->bubble = a->bubble;
        double *times = malloc(a->ranks * sizeof *times);
        for (size_t r = 0; times && r < a->ranks; r++) times[r] = x->rank[r].total_ms;
        c->imbalance = times ? shard_imbalance(times, a->ranks) : 0;
        free(times);
        for (size_t r = 0; r < a->ranks; r++) {
            double peak = (double)a->rank[r].memory_total_bytes;
            if (peak > c->peak_bytes) c->peak_bytes = peak;
            shard_cluster_device d;
            if (c->fits && shard_cluster_rank_device(sr->o->cluster, (int)r, &d) == SHARD_OK &&
                peak > sr->fraction * d.memory_bytes) {
                c->fits = 0;
                snprintf(c->why, sizeof c->why,
                         "needs %.2f GiB on node '%s' (device %d, rank %zu; has %.2f GiB, %.0f %% usable)",
                         peak / 1073741824.0, d.node, d.device, r, d.memory_bytes / 1073741824.0, 100 * sr->fraction);
            }
        }
    }
    shard_step_prediction_destroy(x);
    shard_analysis_destroy(a);
    return s;
}

static const char *goal_of(const shard_plan_options *o) { return o->goal ? o->goal : "throughput"; }

static double score(const shard_plan_candidate *c, const char *goal) {
    if (strcmp(goal, "memory") == 0) return c->peak_bytes;
    if (strcmp(goal, "balance") == 0) return c->imbalance;
    return c->step_ms; /* throughput and latency at a fixed batch order alike */
}

static const char *sort_goal;
static int by_goal(const void *pa, const void *pb) {
    const shard_plan_candidate *a = pa, *b = pb;
    if (a->fits != b->fits) return b->fits - a->fits;
    if (a->valid != b->valid) return b->valid - a->valid;
    double x = score(a, sort_goal), y = score(b, sort_goal);
    if (x != y) return x < y ? -1 : 1;
    return a->step_ms < b->step_ms ? -1 : a->step_ms > b->step_ms;
}

shard_status shard_plan_search(const shard_plan_options *o, shard_plan_result **out) {
    *out = NULL;
    if (!o || o->struct_size < sizeof *o || !o->train || !o->cluster)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan: give a trainer config and a cluster");
    const char *goal = goal_of(o);
    static const char *const goals[] = {"throughput", "latency", "memory", "balance"};
    int known = 0;
    for (int k = 0; k < 4; k++) known |= strcmp(goal, goals[k]) == 0;
    if (!known)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan: goal '%s': give throughput, latency, memory or balance", goal);
    int W = shard_cluster_ranks(o->cluster);
    if (W < 1) return shard_error(SHARD_ERR_INVALID_ARG, "plan: the cluster has no device");
    search sr = {.o = o, .fraction = o->max_memory_fraction > 0 ? o->max_memory_fraction : 0.9};
    long experts = config_experts(o->train->config_path);
    shard_status s = SHARD_OK;
    for (int d = 1; d <= W && s == SHARD_OK; d++) {
        if (W % d) continue;
        for (int t = 1; t <= W / d && s == SHARD_OK; t++) {
            if ((W / d) % t) continue;
            int p = W / d / t;
            for (int e = 1; e <= d && s == SHARD_OK; e++) { /* the expert axis splits the rows' ranks */
                if (d % e || (e > 1 && (experts < 2 || e > experts))) continue;
                char mesh[96];
                int used = snprintf(mesh, sizeof mesh, "data=%d", d / e);
                if (e > 1) used += snprintf(mesh + used, sizeof mesh - (size_t)used, ",expert=%d", e);
                if (t > 1) used += snprintf(mesh + used, sizeof mesh - (size_t)used, ",tensor=%d", t);
                if (p > 1) snprintf(mesh + used, sizeof mesh - (size_t)used, ",pipe=%d", p);
                for (int zero = 0; zero <= (d > 1 ? 3 : 0) && s == SHARD_OK; zero++)
                    for (int sp = 0; sp <= (t > 1) && s == SHARD_OK; sp++)
                        for (size_t m = p > 1 ? (size_t)p : 0; m <= (size_t)(2 * p) && s == SHARD_OK;
                             m = p > 1 ? m + (size_t)p : (size_t)(2 * p) + 1) {
                            shard_plan_candidate *c = NULL;
                            s = try_layout(&sr, mesh, zero, sp, p > 1 ? "1f1b" : NULL, m, 0, &c);
                            if (s == SHARD_OK && p > 1 && c && c->valid && !c->fits) /* recompute: the fallback */
                                s = try_layout(&sr, mesh, zero, sp, "1f1b", m, 1, &c);
                        }
            }
        }
    }
    shard_plan_result *r = calloc(1, sizeof *r);
    if (s == SHARD_OK && !r) s = shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
    if (s < 0) {
        free(sr.c), free(r);
        return s;
    }
    sort_goal = goal;
    qsort(sr.c, sr.n, sizeof *sr.c, by_goal);
    r->candidate = sr.c, r->count = sr.n, r->world = W;
    for (size_t i = 0; i < sr.n; i++) r->fitting += sr.c[i].fits;
    if (!r->fitting) {
        double least = 0;
        for (size_t i = 0; i < sr.n; i++)
            if (sr.c[i].valid && (least == 0 || sr.c[i].peak_bytes < least)) least = sr.c[i].peak_bytes;
        shard_plan_result_destroy(r);
        return shard_error(SHARD_ERR_NO_MEMORY,
                           "plan: no layout of the model fits the cluster's %d devices at %.0f %% of their memory "
                           "(ZeRO-3, tensor and pipe splits and recomputation tried): the least a device would "
                           "need is %.2f GiB",
                           W, 100 * sr.fraction, least / 1073741824.0);
    }
    *out = r;
    return SHARD_OK;
}

static void layout_text(const shard_plan_candidate *c, char *out, size_t bytes) {
    snprintf(out, bytes, "%s zero=%d%s%s%s%s", c->mesh, c->zero, c->sequence_parallel ? " sequence-parallel" : "",
             c->schedule[0] ? " schedule=" : "", c->schedule, c->recompute ? " recompute" : "");
    if (c->micro_batches) {
        size_t used = strlen(out);
        snprintf(out + used, bytes - used, " micro-batches=%zu", c->micro_batches);
    }
}

void shard_plan_explain(const shard_plan_result *r, const char *goal, char *out, size_t bytes) {
    const char *g = goal ? goal : "throughput";
    const shard_plan_candidate *w = &r->candidate[0];
    char best[200], second[200] = "";
    layout_text(w, best, sizeof best);
    size_t used =
        (size_t)snprintf(out, bytes,
                         "Chosen for %s: %s, predicted %.1f ms a step (%.0f tokens/s), %.2f GiB on the "
                         "fullest device, bubble %.2f, imbalance %.2f.",
                         g, best, w->step_ms, w->tokens_per_s, w->peak_bytes / 1073741824.0, w->bubble, w->imbalance);
    if (r->fitting > 1 && used < bytes) {
        layout_text(&r->candidate[1], second, sizeof second);
        used += (size_t)snprintf(out + used, bytes - used, " The runner-up, %s, predicts %.1f ms.", second,
                                 r->candidate[1].step_ms);
    }
    size_t refused = 0, too_big = 0;
    const shard_plan_candidate *eg_refused = NULL, *eg_big = NULL;
    for (size_t i = 0; i < r->count; i++) {
        const shard_plan_candidate *c = &r->candidate[i];
        if (!c->valid)
            refused++, eg_refused = eg_refused ? eg_refused : c;
        else if (!c->fits)
            too_big++, eg_big = eg_big ? eg_big : c;
    }
    if (used < bytes)
        used += (size_t)snprintf(out + used, bytes - used, " %zu of %zu layouts tried fit.", r->fitting, r->count);
    if (eg_big && used < bytes) {
        char t[200];
        layout_text(eg_big, t, sizeof t);
        used += (size_t)snprintf(out + used, bytes - used, " Memory cut %zu (e.g. %s: %s).", too_big, t, eg_big->why);
    }
    if (eg_refused && used < bytes) {
        char t[200];
        layout_text(eg_refused, t, sizeof t);
        snprintf(out + used, bytes - used, " The trainer refused %zu (e.g. %s: %s).", refused, t, eg_refused->why);
    }
}
