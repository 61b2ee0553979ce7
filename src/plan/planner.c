/* planner.c — see plan.h: the layouts a cluster could run, each analyzed by the dry run and priced on
 * the cluster, cut by memory and the budgets, ranked by the goal, the leading ones placed.
 *
 * The broad search is exhaustive over a small space: every data x tensor x pipe factorisation of the
 * cluster's devices (x expert for a mixture of experts), ZeRO 0-3 and the gradient dtypes asked where
 * there is a data axis, sequence parallel where there is a tensor axis, and on a pipe axis 1F1B with p
 * or 2p micro-batches; recomputation (pipe) or accumulation (no pipe) tried only where the same layout
 * without it does not fit.  The refinement then tries the variants of each leading mesh's best layout
 * (other schedules, more micro-batches or micro-steps): dimensions that rarely decide the winner alone,
 * so not multiplied into every layout.  A layout the trainer refuses (heads not divisible, too few rows
 * per micro-step, ...) is kept with the trainer's reason. */
#include "shard/plan.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/analyze.h"
#include "shard/clock.h"
#include "shard/monitor.h"
#include "shard/placement.h"
#include "shard/split.h"
#include "plan_screen.h"

enum { SHARD_PLAN_MAX_SPLIT = 64 };

/* Bytes in words a person reads at any size: "9.10 GiB", "12.4 MiB". */
static const char *bytes_text(double bytes, char *out, size_t size) {
    if (bytes >= 1073741824.0)
        snprintf(out, size, "%.2f GiB", bytes / 1073741824.0);
    else
        snprintf(out, size, "%.1f MiB", bytes / 1048576.0);
    return out;
} /* data ranks or stages an uneven split is tried for */

void shard_plan_result_destroy(shard_plan_result *r) {
    if (!r) return;
    for (size_t i = 0; i < r->placements; i++) free(r->placement[i].device_map);
    free(r->device_map);
    free(r->candidate);
    free(r);
}

/* The config's num_local_experts (0: dense, or not a GPT). */
static long config_int(const char *path, const char *key) {
    json_error_t err;
    json_t *root = path ? json_load_file(path, 0, &err) : NULL;
    json_t *e = root ? json_object_get(root, key) : NULL;
    long n = json_is_integer(e) ? (long)json_integer_value(e) : 0;
    json_decref(root);
    return n;
}

typedef struct search {
    const shard_plan_options *o;
    double fraction;
    long layers; /* the GPT's n_layer (0: not a GPT, whose layers the pipeline cannot cut unevenly) */
    int screen;  /* candidates priced by the closed-form screen first (plan_screen.h), the best checked */
    shard_gpt_config gpt;
    shard_plan_candidate *c;
    size_t n, cap;
} search;

/* What an even layout's analysis says about splitting it unevenly: per data rank and per pipe stage,
 * the rate of the slowest device in it (TFLOPS), and per stage its FLOPs (the busiest rank's) and the
 * bytes per device it may use (the least of its devices', times the fraction) and it used. */
typedef struct split_hints {
    int data, pipe; /* the axes' sizes (1 when absent) */
    double data_rate[SHARD_PLAN_MAX_SPLIT], stage_rate[SHARD_PLAN_MAX_SPLIT];
    double stage_flops[SHARD_PLAN_MAX_SPLIT], stage_room[SHARD_PLAN_MAX_SPLIT], stage_peak[SHARD_PLAN_MAX_SPLIT];
} split_hints;

/* Analyze and price one layout into a new candidate. */
static int axis_index(const shard_analysis *a, const char *name) {
    for (int k = 0; k < a->axes; k++)
        if (strcmp(a->axis_name[k], name) == 0) return k;
    return -1;
}

/* The hints of an analyzed layout on the cluster (h->data = h->pipe = 0 when a rank has no device). */
static void hints_of(const search *sr, const shard_analysis *a, split_hints *h) {
    memset(h, 0, sizeof *h);
    int dk = axis_index(a, "data"), pk = axis_index(a, "pipe");
    int data = dk >= 0 ? a->axis_size[dk] : 1, pipe = pk >= 0 ? a->axis_size[pk] : 1;
    if (axis_index(a, "expert") >= 0) data = 1, dk = -1; /* rows split over data x expert: left even */
    if (data > SHARD_PLAN_MAX_SPLIT || pipe > SHARD_PLAN_MAX_SPLIT) return;
    for (size_t r = 0; r < a->ranks; r++) {
        shard_cluster_device d;
        if (shard_cluster_rank_device(sr->o->cluster, (int)r, &d) < 0) {
            shard_clear_error();
            return;
        }
        const shard_rank_analysis *x = &a->rank[r];
        int i = dk >= 0 ? x->coord[dk] : 0, j = pk >= 0 ? x->coord[pk] : 0;
        double flops = x->flops_forward + x->flops_backward + x->flops_recompute + x->flops_other;
        double room = sr->fraction * d.memory_bytes, peak = (double)x->memory_total_bytes;
        if (h->data_rate[i] == 0 || d.compute_tflops < h->data_rate[i]) h->data_rate[i] = d.compute_tflops;
        if (h->stage_rate[j] == 0 || d.compute_tflops < h->stage_rate[j]) h->stage_rate[j] = d.compute_tflops;
        if (flops > h->stage_flops[j]) h->stage_flops[j] = flops;
        if (h->stage_room[j] == 0 || room < h->stage_room[j]) h->stage_room[j] = room;
        if (peak > h->stage_peak[j]) h->stage_peak[j] = peak;
    }
    h->data = data, h->pipe = pipe;
}

static int rates_differ(const double *rate, int n) {
    for (int i = 1; i < n; i++)
        if (rate[i] != rate[0]) return 1;
    return 0;
}

/* Rows per data rank in proportion to its rate (largest remainders), each at least `least` (one per
 * micro-step): "6,2", or 0 when that is the even split or no such split exists. */
static int shares_for(const split_hints *h, size_t batch, size_t least, char *out, size_t bytes) {
    int D = h->data;
    if (D < 2 || !rates_differ(h->data_rate, D) || batch < least * (size_t)D) return 0;
    double total = 0, want[SHARD_PLAN_MAX_SPLIT];
    size_t rows[SHARD_PLAN_MAX_SPLIT], given = 0;
    for (int i = 0; i < D; i++) total += h->data_rate[i];
    for (int i = 0; i < D; i++) {
        want[i] = (double)batch * h->data_rate[i] / total;
        rows[i] = (size_t)want[i] < least ? least : (size_t)want[i];
        given += rows[i];
    }
    while (given < batch) { /* the largest shortfall gets the next row */
        int best = 0;
        for (int i = 1; i < D; i++)
            if (want[i] - (double)rows[i] > want[best] - (double)rows[best]) best = i;
        rows[best]++, given++;
    }
    while (given > batch) { /* the largest excess gives one back, never below `least` */
        int best = -1;
        for (int i = 0; i < D; i++)
            if (rows[i] > least && (best < 0 || (double)rows[i] - want[i] > (double)rows[best] - want[best])) best = i;
        if (best < 0) return 0;
        rows[best]--, given--;
    }
    int even = 1;
    size_t used = 0;
    for (int i = 0; i < D; i++) {
        size_t at, count;
        shard_split_even(batch, (size_t)D, (size_t)i, &at, &count);
        even &= rows[i] == count;
        used += (size_t)snprintf(out + used, used < bytes ? bytes - used : 0, "%s%zu", i ? "," : "", rows[i]);
    }
    return !even && used < bytes;
}

/* Layers per stage so that the slowest stage's time (its layers' FLOPs plus its fixed part, the
 * embedding or the head, over its rate) is least and no stage holds more layers than its memory
 * allows: "3,1", or 0 when that is the even cut.  The per-layer FLOPs and bytes come from the even
 * cut's analysis: a stage's FLOPs less its layers' is its fixed part. */
static int layers_for(const split_hints *h, long layers, char *out, size_t bytes) {
    int P = h->pipe;
    if (P < 2 || layers < P || !rates_differ(h->stage_rate, P)) return 0;
    size_t even[SHARD_PLAN_MAX_SPLIT], cap[SHARD_PLAN_MAX_SPLIT], n[SHARD_PLAN_MAX_SPLIT];
    double per_layer = 0, fixed[SHARD_PLAN_MAX_SPLIT];
    for (int j = 0; j < P; j++) {
        size_t at;
        shard_split_even((size_t)layers, (size_t)P, (size_t)j, &at, &even[j]);
        double f = h->stage_flops[j] / (double)even[j];
        if (j == 0 || f < per_layer) per_layer = f; /* the stage with the least fixed part per layer */
    }
    if (!(per_layer > 0)) return 0;
    for (int j = 0; j < P; j++) {
        fixed[j] = h->stage_flops[j] - per_layer * (double)even[j];
        if (fixed[j] < 0) fixed[j] = 0;
        /* memory: the even cut's peak scaled by layers is an upper bound per layer (it includes the fixed part) */
        double per_layer_bytes = h->stage_peak[j] / (double)even[j];
        cap[j] = per_layer_bytes > 0 ? (size_t)(h->stage_room[j] / per_layer_bytes) : (size_t)layers;
        if (cap[j] < 1) cap[j] = 1;
    }
    /* the least time T at which every stage's layers (those it can run within T and hold) cover the model */
    double best_t = INFINITY;
    for (int j = 0; j < P; j++)
        for (long k = 1; k <= layers; k++) {
            double t = (per_layer * (double)k + fixed[j]) / h->stage_rate[j];
            if (t >= best_t) break;
            size_t room = 0;
            for (int q = 0; q < P; q++) {
                double fit = (t * h->stage_rate[q] - fixed[q]) / per_layer;
                size_t c = fit < 1 ? 0 : (size_t)(fit + 1e-9);
                if (c > cap[q]) c = cap[q];
                n[q] = c, room += c;
            }
            int each = 1;
            for (int q = 0; q < P; q++) each &= n[q] >= 1;
            if (each && room >= (size_t)layers) best_t = t;
        }
    if (!isfinite(best_t)) return 0;
    size_t room = 0;
    for (int q = 0; q < P; q++) {
        double fit = (best_t * h->stage_rate[q] - fixed[q]) / per_layer;
        n[q] = fit < 1 ? 1 : (size_t)(fit + 1e-9);
        if (n[q] > cap[q]) n[q] = cap[q];
        room += n[q];
    }
    while (room > (size_t)layers) { /* give back from the stage that would be slowest */
        int worst = -1;
        double worst_t = -1;
        for (int q = 0; q < P; q++) {
            double t = (per_layer * (double)n[q] + fixed[q]) / h->stage_rate[q];
            if (n[q] > 1 && t > worst_t) worst = q, worst_t = t;
        }
        if (worst < 0) return 0;
        n[worst]--, room--;
    }
    int same = 1;
    size_t used = 0;
    for (int q = 0; q < P; q++) {
        same &= n[q] == even[q];
        used += (size_t)snprintf(out + used, used < bytes ? bytes - used : 0, "%s%zu", q ? "," : "", n[q]);
    }
    return !same && used < bytes;
}

void shard_plan_candidate_apply(const shard_plan_candidate *c, shard_trainer_config *tc) {
    tc->zero = c->zero, tc->sequence_parallel = c->sequence_parallel;
    tc->schedule = c->schedule[0] ? c->schedule : NULL, tc->micro_batches = c->micro_batches;
    tc->recompute = c->recompute, tc->micro_batch = 0, tc->accum = c->accum, tc->virtual_stages = c->virtual_stages;
    tc->grad_dtype = strcmp(c->grad_dtype, "bf16") == 0 ? SHARD_BF16 : SHARD_F32;
    tc->layers_per_stage = c->layers_per_stage[0] ? c->layers_per_stage : NULL;
    tc->batch_shares = c->batch_shares[0] ? c->batch_shares : NULL;
    if (c->batch) tc->batch = c->batch;
}

/* Price analysis a on the cluster (with its device map) into c: the step, its ranks' balance, the
 * fullest rank's peak, and whether every rank fits its device and the budgets (else c->cut and why). */
static shard_status price(const shard_plan_options *o, double fraction, const shard_cluster *cluster,
                          const shard_analysis *a, shard_plan_candidate *c) {
    shard_step_prediction *x = NULL;
    shard_cost_options co = {.struct_size = sizeof co, .backend = "threads", .cluster = cluster};
    SHARD_CHECK(shard_cost_predict(a, o->profile, &co, &x));
    c->valid = 1, c->fits = 1, c->cut = SHARD_PLAN_FITS, c->why[0] = '\0', c->peak_bytes = 0;
    c->step_ms = x->step_ms, c->tokens_per_s = x->tokens_per_s, c->bubble = a->bubble;
    double *times = malloc(2 * a->ranks * sizeof *times);
    c->comm_fraction = 0;
    for (size_t r = 0; times && r < a->ranks; r++) {
        times[r] = x->rank[r].total_ms, times[a->ranks + r] = x->rank[r].compute_ms;
        double f = x->step_ms > 0 ? x->rank[r].comm_ms / x->step_ms : 0;
        if (f > c->comm_fraction) c->comm_fraction = f;
    }
    c->imbalance = times ? shard_imbalance(times, a->ranks) : 0;
    c->compute_imbalance = times ? shard_imbalance(times + a->ranks, a->ranks) : 0;
    free(times);
    shard_step_prediction_destroy(x);
    for (size_t r = 0; r < a->ranks; r++) {
        double peak = (double)a->rank[r].memory_total_bytes;
        if (peak > c->peak_bytes) c->peak_bytes = peak;
        shard_cluster_device d;
        if (c->fits && shard_cluster_rank_device(cluster, (int)r, &d) == SHARD_OK && peak > fraction * d.memory_bytes) {
            c->fits = 0, c->cut = SHARD_PLAN_CUT_MEMORY;
            char need[32], has[32];
            snprintf(c->why, sizeof c->why, "needs %s on node '%s' (device %d, rank %zu; has %s, %.0f %% usable)",
                     bytes_text(peak, need, sizeof need), d.node, d.device, r,
                     bytes_text(d.memory_bytes, has, sizeof has), 100 * fraction);
        }
    }
    if (c->fits && o->latency_budget_ms > 0 && c->step_ms > o->latency_budget_ms) {
        c->fits = 0, c->cut = SHARD_PLAN_CUT_LATENCY;
        snprintf(c->why, sizeof c->why, "predicts %.1f ms a step, over the latency budget of %.1f ms", c->step_ms,
                 o->latency_budget_ms);
    }
    if (c->fits && o->max_comm_fraction > 0 && c->comm_fraction > o->max_comm_fraction) {
        c->fits = 0, c->cut = SHARD_PLAN_CUT_COMM;
        snprintf(c->why, sizeof c->why,
                 "exposed communication takes %.0f %% of the step, over the communication budget of %.0f %%",
                 100 * c->comm_fraction, 100 * o->max_comm_fraction);
    }
    if (c->fits && o->max_compute_imbalance > 0 && c->compute_imbalance > o->max_compute_imbalance) {
        c->fits = 0, c->cut = SHARD_PLAN_CUT_COMPUTE;
        snprintf(c->why, sizeof c->why, "compute imbalance %.2f over the ranks, over the compute budget of %.2f",
                 c->compute_imbalance, o->max_compute_imbalance);
    }
    return SHARD_OK;
}

/* Analyze (by the screen's closed forms when `screened`, else by the dry run) and price candidate c,
 * filling its figures; the trainer's refusal and a memory cut are reasons kept in c->why. */
static shard_status evaluate(search *sr, shard_plan_candidate *c, int screened, split_hints *hints) {
    if (hints) memset(hints, 0, sizeof *hints);
    c->valid = c->fits = 0, c->why[0] = 0, c->peak_bytes = 0, c->screened = screened;
    c->cut = SHARD_PLAN_CUT_REFUSED;
    shard_trainer_config tc = *sr->o->train;
    shard_plan_candidate_apply(c, &tc);
    shard_analysis *a = NULL;
    shard_analyze_options ao = {.struct_size = sizeof ao, .train = &tc, .mesh = c->mesh};
    shard_status s = screened ? shard__plan_screen(&sr->gpt, &tc, c->mesh, &a) : shard_analyze(&ao, &a);
    if (s < 0) { /* the trainer's refusal: a reason, not a failure of the search */
        snprintf(c->why, sizeof c->why, "%s", shard_last_error());
        shard_clear_error();
        return SHARD_OK;
    }
    s = price(sr->o, sr->fraction, sr->o->cluster, a, c);
    if (s == SHARD_OK && hints) hints_of(sr, a, hints);
    shard_analysis_destroy(a);
    return s;
}

/* A new candidate: `like`'s layout (its figures cleared) analyzed and priced, with the hints of its
 * analysis when asked.  *made points into sr->c until the next candidate is made. */
static shard_status try_candidate(search *sr, const shard_plan_candidate *like, split_hints *hints,
                                  shard_plan_candidate **made) {
    shard_plan_candidate layout = *like; /* like may point into sr->c, which may move */
    if (sr->n == sr->cap) {
        size_t cap = sr->cap ? 2 * sr->cap : 64;
        shard_plan_candidate *more = realloc(sr->c, cap * sizeof *more);
        if (!more) return shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
        sr->c = more, sr->cap = cap;
    }
    shard_plan_candidate *c = &sr->c[sr->n++];
    *c = layout;
    *made = c;
    return evaluate(sr, c, sr->screen, hints);
}

/* A layout, its fallbacks where it does not fit (recomputation on a pipe axis; gradient accumulation,
 * 2, 4 or 8 micro-steps, without one), and on a cluster whose devices differ its uneven splits: shares,
 * layers, and both. */
static shard_status try_layout_family(search *sr, const shard_plan_candidate *base) {
    shard_plan_candidate *c = NULL, layout = *base;
    split_hints h;
    SHARD_CHECK(try_candidate(sr, &layout, &h, &c));
    if (layout.schedule[0] && c->valid && !c->fits) { /* recompute: the pipeline's fallback */
        layout.recompute = 1;
        SHARD_CHECK(try_candidate(sr, &layout, &h, &c));
    }
    for (size_t k = 2; !layout.schedule[0] && c->valid && c->cut == SHARD_PLAN_CUT_MEMORY && k <= 8; k *= 2) {
        layout.accum = k; /* accumulation: fewer rows' activations at once */
        SHARD_CHECK(try_candidate(sr, &layout, &h, &c));
        if (!c->valid) { /* too few rows for k micro-steps: the last that ran stands */
            layout.accum = k / 2 > 1 ? k / 2 : 0;
            break;
        }
    }
    if (!c->valid || (!h.data && !h.pipe)) return SHARD_OK;
    char shares[160], layers[96];
    size_t least = layout.micro_batches ? layout.micro_batches : layout.accum ? layout.accum : 1;
    int uneven_shares = shares_for(&h, sr->o->train->batch, least, shares, sizeof shares);
    int uneven_layers = sr->layers > 0 && layers_for(&h, sr->layers, layers, sizeof layers);
    if (uneven_shares) {
        shard_plan_candidate x = layout;
        snprintf(x.batch_shares, sizeof x.batch_shares, "%s", shares);
        SHARD_CHECK(try_candidate(sr, &x, NULL, &c));
    }
    if (uneven_layers) {
        shard_plan_candidate x = layout;
        snprintf(x.layers_per_stage, sizeof x.layers_per_stage, "%s", layers);
        SHARD_CHECK(try_candidate(sr, &x, NULL, &c));
        if (uneven_shares) {
            snprintf(x.batch_shares, sizeof x.batch_shares, "%s", shares);
            SHARD_CHECK(try_candidate(sr, &x, NULL, &c));
        }
    }
    return SHARD_OK;
}

/* Whether a candidate with c's layout was tried already. */
static int tried(const search *sr, const shard_plan_candidate *c) {
    char want[400], have[400];
    shard_plan_candidate_text(c, want, sizeof want);
    for (size_t i = 0; i < sr->n; i++) {
        shard_plan_candidate_text(&sr->c[i], have, sizeof have);
        if (strcmp(want, have) == 0 && sr->c[i].batch == c->batch) return 1;
    }
    return 0;
}

static shard_status try_variant(search *sr, const shard_plan_candidate *v) {
    if (tried(sr, v)) return SHARD_OK;
    shard_plan_candidate *c = NULL;
    SHARD_CHECK(try_candidate(sr, v, NULL, &c));
    c->variant = 1;
    return SHARD_OK;
}

/* The variants of a leading layout the broad search does not try: on a pipe axis the other schedules
 * (GPipe; interleaved with two chunks per rank), four micro-batches per stage, and recomputation; without
 * one, two micro-steps of accumulation. */
static shard_status try_variants(search *sr, const shard_plan_candidate *lead) {
    shard_plan_candidate base = *lead, v;
    if (base.schedule[0]) {
        int p = 1;
        const char *at = strstr(base.mesh, "pipe=");
        if (at) p = atoi(at + 5);
        v = base, snprintf(v.schedule, sizeof v.schedule, "gpipe"), v.virtual_stages = 0;
        SHARD_CHECK(try_variant(sr, &v));
        if (!base.layers_per_stage[0] && sr->layers >= 2 * p) {
            v = base, snprintf(v.schedule, sizeof v.schedule, "interleaved"), v.virtual_stages = 2;
            SHARD_CHECK(try_variant(sr, &v));
        }
        v = base, v.micro_batches = 4 * (size_t)p;
        SHARD_CHECK(try_variant(sr, &v));
        v = base, v.recompute = !base.recompute;
        SHARD_CHECK(try_variant(sr, &v));
    } else {
        v = base, v.accum = base.accum ? 2 * base.accum : 2;
        SHARD_CHECK(try_variant(sr, &v));
    }
    return SHARD_OK;
}

/* The winner w's layout at 2, 4 and 8 times the global batch (its shares scaled alike), priced as the
 * search priced w, while it fits: into *out the one predicting the most tokens per second if that is
 * at least 5 % above w's (out->batch 0: none). */
static shard_status grow(search *sr, const shard_plan_candidate *w, shard_plan_candidate *out) {
    memset(out, 0, sizeof *out);
    size_t base = sr->o->train->batch;
    double best = w->tokens_per_s * 1.05;
    for (size_t times = 2; times <= 8 && base; times *= 2) {
        shard_plan_candidate c = *w;
        c.batch = base * times;
        if (w->batch_shares[0]) { /* each data rank's rows times as many */
            size_t used = 0;
            const char *at = w->batch_shares;
            for (int k = 0; *at; k++) {
                char *end;
                unsigned long v = strtoul(at, &end, 10);
                used += (size_t)snprintf(c.batch_shares + used, sizeof c.batch_shares - used, "%s%lu", k ? "," : "",
                                         v * (unsigned long)times);
                at = *end ? end + 1 : end;
            }
        }
        SHARD_CHECK(evaluate(sr, &c, w->screened, NULL));
        if (!c.valid || !c.fits) break;
        if (c.tokens_per_s > best) *out = c, best = c.tokens_per_s;
    }
    return SHARD_OK;
}

static const char *goal_of(const shard_plan_options *o) { return o->goal ? o->goal : "throughput"; }

static double score(const shard_plan_candidate *c, const char *goal) {
    if (strcmp(goal, "memory") == 0) return c->peak_bytes;
    if (strcmp(goal, "balance") == 0) return c->imbalance;
    if (strcmp(goal, "latency") == 0) return c->step_ms;
    return -c->tokens_per_s; /* the step's order at a fixed batch, and right for a grown batch too */
}

static const char *sort_goal;
static int by_goal(const void *pa, const void *pb) {
    const shard_plan_candidate *a = pa, *b = pb;
    if (a->fits != b->fits) return b->fits - a->fits;
    if (a->valid != b->valid) return b->valid - a->valid;
    if (a->screened != b->screened) return a->screened - b->screened; /* checked by dry run first */
    double x = score(a, sort_goal), y = score(b, sort_goal);
    if (x != y) return x < y ? -1 : 1;
    return a->step_ms < b->step_ms ? -1 : a->step_ms > b->step_ms;
}

/* The gradient dtypes to search ("f32", "bf16" or "f32,bf16"; NULL: f32) as the candidates spell them. */
static shard_status grad_dtypes_of(const char *list, const char **dtype, int *n) {
    *n = 0;
    const char *at = list ? list : "f32";
    while (*at) {
        size_t len = strcspn(at, ",");
        const char *name = len == 3 && strncmp(at, "f32", 3) == 0 ? ""
            : len == 4 && strncmp(at, "bf16", 4) == 0             ? "bf16"
                                                                  : NULL;
        if (!name || *n == 2 || (*n == 1 && strcmp(dtype[0], name) == 0))
            return shard_error(SHARD_ERR_INVALID_ARG, "plan: gradient dtypes '%s': give f32, bf16 or f32,bf16", list);
        dtype[(*n)++] = name;
        at += len + (at[len] == ',');
    }
    if (!*n) return shard_error(SHARD_ERR_INVALID_ARG, "plan: gradient dtypes '%s': give f32, bf16 or f32,bf16", at);
    return SHARD_OK;
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
    long experts = config_int(o->train->config_path, "num_local_experts");
    sr.layers = config_int(o->train->config_path, "n_layer");
    shard_status s = SHARD_OK;
    if (o->search && strcmp(o->search, "exhaustive") != 0 && strcmp(o->search, "screen") != 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan: search '%s': give exhaustive or screen", o->search);
    int gpt = experts == 0 && sr.layers > 0 && shard_gpt_config_load(o->train->config_path, &sr.gpt) == SHARD_OK;
    shard_clear_error();
    if (o->search && strcmp(o->search, "screen") == 0 && !gpt)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "plan: --search screen prices a dense GPT's layouts; %s is not one: give --search "
                           "exhaustive",
                           o->train->config_path ? o->train->config_path : "the model");
    sr.screen = o->search ? strcmp(o->search, "screen") == 0 : gpt && (W > 16 || sr.layers > 24);
    int dtypes = 0; /* the gradient dtypes searched: "" (f32) and/or "bf16" */
    const char *dtype[2];
    SHARD_CHECK(grad_dtypes_of(o->grad_dtypes, dtype, &dtypes));
    double started = shard_clock_seconds();
    for (int d = 1; d <= W && s == SHARD_OK; d++) {
        if (W % d) continue;
        for (int t = 1; t <= W / d && s == SHARD_OK; t++) {
            if ((W / d) % t) continue;
            int p = W / d / t;
            for (int e = 1; e <= d && s == SHARD_OK; e++) { /* the expert axis splits the rows' ranks */
                if (d % e || (e > 1 && (experts < 2 || e > experts))) continue;
                shard_plan_candidate base;
                memset(&base, 0, sizeof base);
                int used = snprintf(base.mesh, sizeof base.mesh, "data=%d", d / e);
                if (e > 1) used += snprintf(base.mesh + used, sizeof base.mesh - (size_t)used, ",expert=%d", e);
                if (t > 1) used += snprintf(base.mesh + used, sizeof base.mesh - (size_t)used, ",tensor=%d", t);
                if (p > 1) snprintf(base.mesh + used, sizeof base.mesh - (size_t)used, ",pipe=%d", p);
                if (p > 1) snprintf(base.schedule, sizeof base.schedule, "1f1b");
                /* the dtype of gradients matters only where they are summed over ranks */
                for (int g = 0; g < (d > 1 ? dtypes : 1) && s == SHARD_OK; g++)
                    for (int zero = 0; zero <= (d > 1 ? 3 : 0) && s == SHARD_OK; zero++)
                        for (int sp = 0; sp <= (t > 1) && s == SHARD_OK; sp++)
                            for (size_t m = p > 1 ? (size_t)p : 0; m <= (size_t)(2 * p) && s == SHARD_OK;
                                 m = p > 1 ? m + (size_t)p : (size_t)(2 * p) + 1) {
                                base.zero = zero, base.sequence_parallel = sp, base.micro_batches = m;
                                snprintf(base.grad_dtype, sizeof base.grad_dtype, "%s", d > 1 ? dtype[g] : "");
                                s = try_layout_family(&sr, &base);
                            }
            }
        }
    }
    sort_goal = goal;
    if (s == SHARD_OK && o->refine >= 0) { /* the leading layouts' variants */
        qsort(sr.c, sr.n, sizeof *sr.c, by_goal);
        size_t want = o->refine ? (size_t)o->refine : 8, leads = 0, n = sr.n;
        shard_plan_candidate *lead = malloc(want * sizeof *lead);
        if (!lead) s = shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
        for (size_t i = 0; lead && i < n && leads < want; i++) { /* the best fitting layout of each mesh */
            int seen = !sr.c[i].fits;
            for (size_t j = 0; j < leads && !seen; j++) seen = strcmp(lead[j].mesh, sr.c[i].mesh) == 0;
            if (!seen) lead[leads++] = sr.c[i];
        }
        for (size_t i = 0; i < leads && s == SHARD_OK; i++) s = try_variants(&sr, &lead[i]);
        free(lead);
    }
    shard_plan_result *r = calloc(1, sizeof *r);
    if (s == SHARD_OK && !r) s = shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
    if (s < 0) {
        free(sr.c), free(r);
        return s;
    }
    qsort(sr.c, sr.n, sizeof *sr.c, by_goal);
    double searched = shard_clock_seconds();
    if (sr.screen && o->verify >= 0) { /* the screen's best, checked by dry run in order until `verify` fit */
        size_t want = o->verify ? (size_t)o->verify : 3, checked = 0;
        for (size_t i = 0; i < sr.n && checked < want && i < 4 * want && s == SHARD_OK; i++) {
            if (!sr.c[i].fits) break;
            s = evaluate(&sr, &sr.c[i], 0, NULL);
            checked += sr.c[i].fits;
        }
        if (s == SHARD_OK) qsort(sr.c, sr.n, sizeof *sr.c, by_goal);
    }
    if (s == SHARD_OK && strcmp(goal, "throughput") == 0 && sr.n && sr.c[0].fits) s = grow(&sr, &sr.c[0], &r->larger);
    if (s < 0) {
        free(sr.c), free(r);
        return s;
    }
    r->requested_batch = o->train->batch;
    if (o->grow_batch && r->larger.batch) sr.c[0] = r->larger;
    r->candidate = sr.c, r->count = sr.n, r->world = W;
    r->screened = sr.screen;
    r->search_seconds = searched - started, r->verify_seconds = shard_clock_seconds() - searched;
    for (size_t i = 0; i < sr.n; i++) r->fitting += sr.c[i].fits;
    if (!r->fitting) {
        /* the least memory any layout needs; per budget, the least figure among the layouts it cut */
        double least = 0, nearest[SHARD_PLAN_CUT_COMPUTE + 1] = {0};
        for (size_t i = 0; i < sr.n; i++) {
            const shard_plan_candidate *c = &sr.c[i];
            if (c->valid && (least == 0 || c->peak_bytes < least)) least = c->peak_bytes;
            double figure = c->cut == SHARD_PLAN_CUT_LATENCY ? c->step_ms
                : c->cut == SHARD_PLAN_CUT_COMM              ? c->comm_fraction
                                                             : c->compute_imbalance;
            if (c->valid && c->cut >= SHARD_PLAN_CUT_LATENCY && (nearest[c->cut] == 0 || figure < nearest[c->cut]))
                nearest[c->cut] = figure;
        }
        shard_plan_result_destroy(r);
        char need[32];
        if (nearest[SHARD_PLAN_CUT_LATENCY] > 0)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "plan: no layout that fits memory meets the latency budget of %.1f ms: the fastest "
                               "predicts %.1f ms a step; give a budget of at least that, or more devices",
                               o->latency_budget_ms, nearest[SHARD_PLAN_CUT_LATENCY]);
        if (nearest[SHARD_PLAN_CUT_COMM] > 0)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "plan: no layout that fits memory meets the communication budget of %.0f %%: the "
                               "least exposed communication predicted is %.0f %% of a step; give "
                               "--max-comm-fraction %.2f or more",
                               100 * o->max_comm_fraction, 100 * nearest[SHARD_PLAN_CUT_COMM],
                               ceil(100 * nearest[SHARD_PLAN_CUT_COMM]) / 100);
        if (nearest[SHARD_PLAN_CUT_COMPUTE] > 0)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "plan: no layout that fits memory meets the compute budget of imbalance %.2f: the "
                               "least predicted is %.2f; give --max-compute-imbalance %.2f or more",
                               o->max_compute_imbalance, nearest[SHARD_PLAN_CUT_COMPUTE],
                               ceil(100 * nearest[SHARD_PLAN_CUT_COMPUTE]) / 100);
        return shard_error(SHARD_ERR_NO_MEMORY,
                           "plan: no layout of the model fits the cluster's %d devices at %.0f %% of their memory "
                           "(ZeRO-3, tensor and pipe splits, recomputation and accumulation tried): the least a "
                           "device would need is %s",
                           W, 100 * sr.fraction, bytes_text(least, need, sizeof need));
    }
    *out = r;
    return SHARD_OK;
}

static double memory_fraction(const shard_plan_options *o) {
    return o->max_memory_fraction > 0 ? o->max_memory_fraction : 0.9;
}

/* ---------------------------------------------------------------- placing the winner */

/* The full permutation a device map of `world` entries extends to: the unused devices after it, in order. */
static void full_permutation(const size_t *map, size_t world, size_t n, size_t *perm) {
    char *used = calloc(n, 1);
    size_t k = world;
    memcpy(perm, map, world * sizeof *perm);
    for (size_t i = 0; used && i < world; i++) used[map[i]] = 1;
    for (size_t d = 0; used && d < n; d++)
        if (!used[d]) perm[k++] = d;
    free(used);
}

/* The slowest link (bytes per second) between neighbours along axis k (coordinates one apart, the others
 * equal) with rank i on device perm[i]; infinite when the axis has no neighbours. */
static double slowest_neighbour_link(const shard_analysis *a, const shard_cluster *cluster, const size_t *perm, int k) {
    double slowest = INFINITY;
    shard_cluster *c = NULL;
    if (shard_cluster_copy(cluster, &c) < 0 || shard_cluster_set_device_map_array(c, perm, (size_t)a->world) < 0) {
        shard_cluster_destroy(c);
        shard_clear_error();
        return slowest;
    }
    for (size_t i = 0; i < a->ranks; i++)
        for (size_t j = 0; j < a->ranks; j++) {
            int neighbours = 1;
            for (int x = 0; x < a->axes; x++)
                neighbours &= x == k ? a->rank[j].coord[x] - a->rank[i].coord[x] == 1
                                     : a->rank[j].coord[x] == a->rank[i].coord[x];
            double alpha, beta;
            if (neighbours && shard_cluster_link(c, (int)i, (int)j, &alpha, &beta) == SHARD_OK && beta < slowest)
                slowest = beta;
        }
    shard_cluster_destroy(c);
    return slowest;
}

/* What the placement changed, in words: the axes whose neighbours it put on faster links than before,
 * else how many ranks it moved. */
static void placement_note(const shard_analysis *a, const shard_cluster *cluster, const size_t *before,
                           const size_t *after, char *out, size_t bytes) {
    size_t used = 0, moved = 0;
    out[0] = '\0';
    for (size_t i = 0; i < a->ranks; i++) moved += before[i] != after[i];
    for (int k = 0; k < a->axes && used < bytes; k++) {
        if (a->axis_size[k] < 2) continue;
        double was = slowest_neighbour_link(a, cluster, before, k), now = slowest_neighbour_link(a, cluster, after, k);
        if (now > was)
            used += (size_t)snprintf(out + used, bytes - used,
                                     "%sputs %s neighbours on links of %s%g Gb/s (before: %g)", used ? " and " : "",
                                     a->axis_name[k], isfinite(now) ? "" : "no limit: ", now * 8 / 1e9, was * 8 / 1e9);
    }
    if (!used) snprintf(out, bytes, "moves %zu of %d ranks", moved, a->world);
}

static shard_status solve(const char *method, shard_placement_objective *obj, const double *linear, const size_t *start,
                          shard_plan_placement *out, size_t *perm, double *objective) {
    size_t n = shard_placement_objective_size(obj);
    double t0 = shard_clock_seconds();
    shard_placement_options po = {.struct_size = sizeof po, .start = start};
    if (strcmp(method, "hungarian") == 0)
        SHARD_CHECK(shard_assignment_hungarian(linear, n, perm, NULL));
    else if (strcmp(method, "anneal") == 0)
        SHARD_CHECK(shard_placement_anneal(shard_placement_objective_cost, obj, n, 1, &po, perm, NULL));
    else
        SHARD_CHECK(shard_placement_genetic(shard_placement_objective_cost, obj, n, 1, &po, perm, NULL));
    out->seconds = shard_clock_seconds() - t0;
    snprintf(out->method, sizeof out->method, "%s", method);
    SHARD_CHECK(shard_placement_objective_predict(obj, perm, &out->step_ms, &out->over_bytes));
    *objective = out->step_ms + SHARD_PLACEMENT_PENALTY_MS_PER_BYTE * out->over_bytes;
    return SHARD_OK;
}

/* One candidate's placement: what the result keeps of the winner's. */
typedef struct placed {
    size_t placements;
    shard_plan_placement placement[SHARD_PLAN_PLACEMENTS];
    char placed_by[16];
    size_t *device_map;
    double unplaced_step_ms;
    char note[256];
} placed;

static void placed_clear(placed *p) {
    for (size_t i = 0; i < p->placements; i++) free(p->placement[i].device_map);
    free(p->device_map);
    memset(p, 0, sizeof *p);
}

static const char *const placement_methods[SHARD_PLAN_PLACEMENTS] = {"hungarian", "anneal", "genetic"};

/* Place candidate w (its figures priced again with the map chosen) into *out: see shard_plan_place. */
static shard_status place_candidate(const shard_plan_options *o, const shard_plan_result *r, shard_plan_candidate *w,
                                    int chosen, int keep_map, placed *out) {
    memset(out, 0, sizeof *out);
    out->unplaced_step_ms = w->step_ms;
    size_t n = (size_t)shard_cluster_devices(o->cluster), world = (size_t)r->world;
    if (!(out->device_map = malloc(world * sizeof *out->device_map)))
        return shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
    for (size_t i = 0; i < world; i++) { /* the map the search priced: the cluster's own, or in order */
        shard_cluster_device d;
        SHARD_CHECK(shard_cluster_rank_device(o->cluster, (int)i, &d));
        out->device_map[i] = (size_t)d.device;
    }
    if (keep_map) snprintf(out->placed_by, sizeof out->placed_by, "given");
    if (n > SHARD_PLAN_PLACEMENT_MOST_DEVICES) return SHARD_OK;
    shard_trainer_config tc = *o->train;
    shard_plan_candidate_apply(w, &tc);
    shard_analyze_options ao = {.struct_size = sizeof ao, .train = &tc, .mesh = w->mesh};
    shard_gpt_config gpt;
    shard_analysis *a = NULL;
    shard_placement_objective *obj = NULL;
    shard_cluster *cluster = NULL;
    double *linear = malloc(n * n * sizeof *linear), objective[SHARD_PLAN_PLACEMENTS];
    size_t *perm = malloc(SHARD_PLAN_PLACEMENTS * n * sizeof *perm), *searched = malloc(n * sizeof *searched);
    shard_status s = linear && perm && searched ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
    SHARD_CHECK_GOTO(s, s, done);
    /* a screened candidate is placed on the screen's figures (a dry run of a large layout, for every device
     * map the solvers try, would take minutes); the search's own figures otherwise */
    if (w->screened) SHARD_CHECK_GOTO(shard_gpt_config_load(o->train->config_path, &gpt), s, done);
    SHARD_CHECK_GOTO(w->screened ? shard__plan_screen(&gpt, &tc, w->mesh, &a) : shard_analyze(&ao, &a), s, done);
    SHARD_CHECK_GOTO(shard_placement_objective_create(a, o->profile, o->cluster, memory_fraction(o), &obj), s, done);
    SHARD_CHECK_GOTO(shard_placement_objective_linear(obj, linear), s, done);
    for (int m = 0; m < SHARD_PLAN_PLACEMENTS; m++) {
        shard_plan_placement *p = &out->placement[m];
        SHARD_CHECK_GOTO(solve(placement_methods[m], obj, linear, perm, p, perm + (size_t)m * n, &objective[m]), s,
                         done);
        if (!(p->device_map = malloc(world * sizeof *p->device_map))) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "plan: out of memory");
            goto done;
        }
        memcpy(p->device_map, perm + (size_t)m * n, world * sizeof *p->device_map);
        out->placements++;
    }
    full_permutation(out->device_map, world, n, searched);
    double before = shard_placement_objective_cost(searched, n, obj);
    if (!keep_map && objective[chosen] < before) {
        snprintf(out->placed_by, sizeof out->placed_by, "%s", placement_methods[chosen]);
        placement_note(a, o->cluster, searched, perm + (size_t)chosen * n, out->note, sizeof out->note);
        memcpy(out->device_map, perm + (size_t)chosen * n, world * sizeof *out->device_map);
        SHARD_CHECK_GOTO(shard_cluster_copy(o->cluster, &cluster), s, done);
        SHARD_CHECK_GOTO(shard_cluster_set_device_map_array(cluster, out->device_map, world), s, done);
        SHARD_CHECK_GOTO(price(o, memory_fraction(o), cluster, a, w), s, done);
    }
done:
    shard_cluster_destroy(cluster);
    shard_placement_objective_destroy(obj);
    shard_analysis_destroy(a);
    free(linear), free(perm), free(searched);
    return s;
}

shard_status shard_plan_place(const shard_plan_options *o, shard_plan_result *r, const char *method, int keep_map) {
    const char *want = method ? method : "anneal";
    int chosen = -1;
    for (int m = 0; m < SHARD_PLAN_PLACEMENTS; m++)
        if (strcmp(want, placement_methods[m]) == 0) chosen = m;
    if (chosen < 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan: placement '%s': give hungarian, anneal or genetic", want);
    if (!o || o->struct_size < sizeof *o || !o->cluster || !r || !r->fitting)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan: placement needs the search's options and a fitting winner");
    /* a second call starts afresh */
    for (size_t i = 0; i < r->placements; i++) free(r->placement[i].device_map);
    free(r->device_map);
    r->device_map = NULL, r->placements = 0, r->placed_by[0] = r->placement_note[0] = '\0';
    size_t k = o->place_top > 1 ? (size_t)o->place_top : 1;
    if (k > r->fitting) k = r->fitting;
    if (shard_cluster_devices(o->cluster) > 64) k = 1; /* each placement of a large cluster takes seconds */
    placed best = {0}, next;
    size_t best_i = 0, count = 0;
    shard_status s = SHARD_OK;
    for (size_t i = 0; i < k && s == SHARD_OK; i++) {
        if (r->candidate[i].screened != r->candidate[0].screened) break; /* a dry run's figures beat estimates */
        s = place_candidate(o, r, &r->candidate[i], chosen, keep_map, &next);
        count += s == SHARD_OK;
        if (s == SHARD_OK && r->candidate[i].fits &&
            (i == 0 || score(&r->candidate[i], goal_of(o)) < score(&r->candidate[best_i], goal_of(o)))) {
            placed_clear(&best);
            best = next, best_i = i;
        } else {
            placed_clear(&next);
        }
    }
    if (s < 0) {
        placed_clear(&best);
        return s;
    }
    if (best_i) { /* a placed runner-up beats the placed winner: it moves to the front */
        shard_plan_candidate winner = r->candidate[best_i];
        memmove(r->candidate + 1, r->candidate, best_i * sizeof *r->candidate);
        r->candidate[0] = winner;
    }
    r->placements = best.placements;
    memcpy(r->placement, best.placement, sizeof r->placement);
    memcpy(r->placed_by, best.placed_by, sizeof r->placed_by);
    memcpy(r->placement_note, best.note, sizeof r->placement_note);
    r->device_map = best.device_map, r->unplaced_step_ms = best.unplaced_step_ms, r->placed_rank = best_i;
    r->candidates_placed = count;
    return SHARD_OK;
}

void shard_plan_candidate_text(const shard_plan_candidate *c, char *out, size_t bytes) {
    snprintf(out, bytes, "%s zero=%d%s%s%s%s", c->mesh, c->zero, c->sequence_parallel ? " sequence-parallel" : "",
             c->schedule[0] ? " schedule=" : "", c->schedule, c->recompute ? " recompute" : "");
    size_t used = strlen(out);
    if (c->virtual_stages && used < bytes)
        used += (size_t)snprintf(out + used, bytes - used, " virtual-stages=%d", c->virtual_stages);
    if (c->micro_batches && used < bytes)
        used += (size_t)snprintf(out + used, bytes - used, " micro-batches=%zu", c->micro_batches);
    if (c->accum && used < bytes) used += (size_t)snprintf(out + used, bytes - used, " accum=%zu", c->accum);
    if (c->grad_dtype[0] && used < bytes)
        used += (size_t)snprintf(out + used, bytes - used, " grad-dtype=%s", c->grad_dtype);
    if (c->layers_per_stage[0] && used < bytes)
        used += (size_t)snprintf(out + used, bytes - used, " layers-per-stage=%s", c->layers_per_stage);
    if (c->batch_shares[0] && used < bytes) snprintf(out + used, bytes - used, " batch-shares=%s", c->batch_shares);
}

/* The memory-cut candidate that is the winner w without one of its fallbacks (recomputation, half the
 * accumulation, or for ZeRO-3 the highest lower stage tried, provided no lower stage fits), if tried. */
static const shard_plan_candidate *without(const shard_plan_result *r, const shard_plan_candidate *w, int fallback) {
    shard_plan_candidate want = *w;
    if (fallback == 0) want.recompute = 0;
    if (fallback == 1) want.accum = w->accum > 2 ? w->accum / 2 : 0;
    const shard_plan_candidate *cut = NULL;
    char text[400], have[400];
    for (int zero = fallback == 2 ? 2 : want.zero; zero >= (fallback == 2 ? 0 : want.zero); zero--) {
        want.zero = zero;
        shard_plan_candidate_text(&want, text, sizeof text);
        for (size_t i = 0; i < r->count; i++) {
            shard_plan_candidate_text(&r->candidate[i], have, sizeof have);
            if (strcmp(text, have) != 0 || r->candidate[i].batch != w->batch) continue;
            if (r->candidate[i].fits) return NULL; /* it fits without the fallback */
            if (!cut && r->candidate[i].cut == SHARD_PLAN_CUT_MEMORY) cut = &r->candidate[i];
        }
    }
    return cut;
}

/* Which fallbacks the winner needed to fit, in words appended at out + used: recomputation, accumulation
 * or ZeRO-3 where the same layout without it was cut by memory; a tensor or pipe split where every layout
 * without one was. */
static size_t explain_fallbacks(const shard_plan_result *r, char *out, size_t bytes, size_t used) {
    const shard_plan_candidate *w = &r->candidate[0];
    static const char *const what[] = {"recomputation", "gradient accumulation", "ZeRO-3"};
    const int uses[] = {w->recompute, w->accum > 0, w->zero == 3};
    for (int f = 0; f < 3 && used < bytes; f++) {
        const shard_plan_candidate *c = uses[f] ? without(r, w, f) : NULL;
        if (c)
            used += (size_t)snprintf(out + used, bytes - used, " It needs %s to fit: %s, the layout %s.", what[f],
                                     f == 2                       ? "at a lower ZeRO stage"
                                         : f == 1 && w->accum > 2 ? "with half the micro-steps"
                                                                  : "without it",
                                     c->why);
    }
    if (strstr(w->mesh, "tensor=") || strstr(w->mesh, "pipe=")) {
        size_t unsplit = 0, cut = 0;
        for (size_t i = 0; i < r->count; i++) {
            const shard_plan_candidate *c = &r->candidate[i];
            if (strstr(c->mesh, "tensor=") || strstr(c->mesh, "pipe=") || !c->valid) continue;
            unsplit++, cut += c->cut == SHARD_PLAN_CUT_MEMORY;
        }
        if (unsplit && cut == unsplit && used < bytes)
            used += (size_t)snprintf(out + used, bytes - used,
                                     " The model is split over tensor or pipe ranks because every layout without such "
                                     "a split (%zu tried) is cut by memory.",
                                     unsplit);
    }
    return used < bytes ? used : bytes;
}

void shard_plan_explain(const shard_plan_result *r, const char *goal, char *out, size_t bytes) {
    const char *g = goal ? goal : "throughput";
    const shard_plan_candidate *w = &r->candidate[0];
    char best[400], second[400] = "", peak[32];
    shard_plan_candidate_text(w, best, sizeof best);
    size_t used = (size_t)snprintf(out, bytes,
                                   "Chosen for %s: %s, predicted %.1f ms a step (%.0f tokens/s), %s on the "
                                   "fullest device, bubble %.2f, imbalance %.2f.",
                                   g, best, w->step_ms, w->tokens_per_s, bytes_text(w->peak_bytes, peak, sizeof peak),
                                   w->bubble, w->imbalance);
    if (r->placement_note[0] && strcmp(r->placed_by, "given") != 0 && used < bytes)
        used += (size_t)snprintf(out + used, bytes - used, " Placement (%s) %s: %.1f -> %.1f ms.", r->placed_by,
                                 r->placement_note, r->unplaced_step_ms, w->step_ms);
    if (r->placed_rank && used < bytes)
        used +=
            (size_t)snprintf(out + used, bytes - used,
                             " Of the %zu leading layouts placed, the search's #%zu predicts the least once placed.",
                             r->candidates_placed, r->placed_rank + 1);
    const shard_plan_placement *least = NULL; /* the given map kept: what the solvers would have given */
    for (size_t i = 0; i < r->placements; i++)
        if (!r->placement[i].over_bytes && (!least || r->placement[i].step_ms < least->step_ms))
            least = &r->placement[i];
    if (strcmp(r->placed_by, "given") == 0 && least && least->step_ms < w->step_ms && used < bytes)
        used += (size_t)snprintf(out + used, bytes - used,
                                 " The device map is kept as given; %s's placement would predict %.1f ms.",
                                 least->method, least->step_ms);
    used = explain_fallbacks(r, out, bytes, used);
    const shard_plan_candidate *x = &r->larger;
    if (x->batch && used < bytes) {
        if (w->batch == x->batch)
            used += (size_t)snprintf(out + used, bytes - used,
                                     " The global batch grows to %zu (%zu asked): %.0f tokens/s, %s on the "
                                     "fullest device.",
                                     x->batch, r->requested_batch, x->tokens_per_s,
                                     bytes_text(x->peak_bytes, peak, sizeof peak));
        else
            used += (size_t)snprintf(out + used, bytes - used,
                                     " A global batch of %zu also fits (%s on the fullest device) and predicts "
                                     "%.0f tokens/s (%+.0f %%): --grow-batch chooses it.",
                                     x->batch, bytes_text(x->peak_bytes, peak, sizeof peak), x->tokens_per_s,
                                     100 * (x->tokens_per_s / w->tokens_per_s - 1));
    }
    if (r->fitting > 1 && used < bytes) {
        shard_plan_candidate_text(&r->candidate[1], second, sizeof second);
        used += (size_t)snprintf(out + used, bytes - used, " The runner-up, %s, predicts %.1f ms.", second,
                                 r->candidate[1].step_ms);
    }
    static const char *const cut_words[] = {
        [SHARD_PLAN_CUT_MEMORY] = "Memory cut",
        [SHARD_PLAN_CUT_LATENCY] = "The latency budget cut",
        [SHARD_PLAN_CUT_COMM] = "The communication budget cut",
        [SHARD_PLAN_CUT_COMPUTE] = "The compute budget cut",
        [SHARD_PLAN_CUT_REFUSED] = "The trainer refused",
    };
    static const shard_plan_cut order[] = {SHARD_PLAN_CUT_MEMORY, SHARD_PLAN_CUT_LATENCY, SHARD_PLAN_CUT_COMM,
                                           SHARD_PLAN_CUT_COMPUTE, SHARD_PLAN_CUT_REFUSED};
    if (used < bytes)
        used += (size_t)snprintf(out + used, bytes - used, " %zu of %zu layouts tried fit.", r->fitting, r->count);
    for (size_t k = 0; k < sizeof order / sizeof *order && used < bytes; k++) {
        size_t count = 0;
        const shard_plan_candidate *eg = NULL;
        for (size_t i = 0; i < r->count; i++)
            if (!r->candidate[i].fits && r->candidate[i].cut == order[k]) count++, eg = eg ? eg : &r->candidate[i];
        if (!eg) continue;
        char t[400];
        shard_plan_candidate_text(eg, t, sizeof t);
        used += (size_t)snprintf(out + used, bytes - used, " %s %zu (e.g. %s: %s).", cut_words[order[k]], count, t,
                                 eg->why);
    }
}
