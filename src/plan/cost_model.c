/* cost_model.c — see cost_model.h: a step's time per rank from an analysis and a machine profile.
 *
 * The formulas are few on purpose: each part of the step is priced from what the profile measured (a
 * GEMM shape's throughput, a collective's alpha and beta, the copy bandwidth, the non-GEMM fraction),
 * and the overlap rules are the engine's own (data_parallel.c starts a bucket's reduction while
 * backward goes on and prefetches ZeRO-3's next gather), not per-layout factors. */
#include "shard/cost_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/cluster.h"

shard_status shard_cost_fit_alpha_beta(const double *bytes, const double *us, size_t n, double *alpha_us,
                                       double *beta_gbps) {
    if (n < 2) return shard_error(SHARD_ERR_INVALID_ARG, "alpha-beta fit: %zu points: give at least 2", n);
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) sx += bytes[i], sy += us[i], sxx += bytes[i] * bytes[i], sxy += bytes[i] * us[i];
    double den = (double)n * sxx - sx * sx;
    if (!(den > 0)) return shard_error(SHARD_ERR_INVALID_ARG, "alpha-beta fit: the sizes must differ");
    double slope = ((double)n * sxy - sx * sy) / den, alpha = (sy - slope * sx) / (double)n;
    if (alpha < 0) alpha = 0, slope = sxy / sxx; /* through the origin */
    if (!(slope > 0))
        return shard_error(SHARD_ERR_INVALID_ARG, "alpha-beta fit: time does not grow with size (slope %g us/byte)",
                           slope);
    *alpha_us = alpha;
    *beta_gbps = 1.0 / (slope * 1e3); /* bytes per us / 1e3 = GB/s */
    return SHARD_OK;
}

double shard_cost_collective_us(double alpha_us, double beta_gbps, double bytes, double calls) {
    return calls * alpha_us + (beta_gbps > 0 ? bytes / (beta_gbps * 1e3) : 0);
}

double shard_cost_exposed_ms(double comm_ms, double overlap_ms, double calls) {
    double piece = calls > 0 ? comm_ms / calls : comm_ms, over = comm_ms - overlap_ms;
    return over > piece ? over : piece;
}

double shard_cost_bubble_ms(double busy_ms, double bubble) {
    return bubble > 0 && bubble < 1 ? busy_ms * bubble / (1 - bubble) : 0;
}

void shard_step_prediction_destroy(shard_step_prediction *p) {
    if (!p) return;
    free(p->rank);
    free(p);
}

/* The size of the group a communicator named `axes` ("data", "data,expert", "world") spans on `mesh`. */
static int axes_size(const char *mesh, int world, const char *axes) {
    if (strcmp(axes, "world") == 0) return world;
    int size = 1, found = 0;
    char copy[128];
    snprintf(copy, sizeof copy, "%s", axes);
    for (char *save = NULL, *ax = strtok_r(copy, ",", &save); ax; ax = strtok_r(NULL, ",", &save)) {
        size_t len = strlen(ax);
        for (const char *m = mesh; m && *m; m = strchr(m, ',') ? strchr(m, ',') + 1 : NULL)
            if (strncmp(m, ax, len) == 0 && m[len] == '=') size *= atoi(m + len + 1), found = 1;
    }
    return found ? size : world;
}

/* The profile's name for a counted kind: the v-variants as their plain kind, point-to-point as send. */
static const char *fit_kind(const char *op) {
    static const char *const plain[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strncmp(op, plain[i], strlen(plain[i])) == 0) return plain[i];
    return "all_reduce"; /* barrier, broadcast: a small all_reduce's latency */
}

static int has_axis(const char *axes, const char *name) {
    size_t len = strlen(name);
    for (const char *m = axes; m && *m; m = strchr(m, ',') ? strchr(m, ',') + 1 : NULL)
        if (strncmp(m, name, len) == 0 && (m[len] == ',' || m[len] == '\0')) return 1;
    return 0;
}

/* The rank's GEMM time: each recorded shape at its throughput, the unshaped rest at the mean rate. */
static double gemm_ms(const shard_machine_profile *p, const shard_rank_analysis *r, int threads) {
    double ms = 0, flops = 0;
    for (size_t i = 0; i < r->gemm_shapes; i++) {
        const shard_gemm_shape *g = &r->gemm_shape[i];
        double f = 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->count;
        double rate = shard_profile_gemm_gflops(p, g->m, g->n, g->k, threads);
        if (rate > 0) ms += f / (rate * 1e6), flops += f;
    }
    double mean = flops > 0 ? flops / (ms * 1e6) : shard_profile_gemm_gflops(p, 256, 256, 256, threads);
    if (r->gemm_unshaped_flops > 0 && mean > 0) ms += r->gemm_unshaped_flops / (mean * 1e6);
    return ms;
}

/* The slowest link among the ranks of rank r's group on `axes` (every axis not named fixed at r's
 * coordinate; "world": all ranks), memoised by group: the emulated cluster prices a collective by it. */
typedef struct link_memo {
    char axes[64];
    int color;
    double alpha, beta;
} link_memo;

typedef struct cluster_ctx {
    const shard_cluster *cluster;
    link_memo *memo;
    size_t n, cap;
} cluster_ctx;

static int in_group(const shard_analysis *a, const char *axes, int k) {
    return strcmp(axes, "world") == 0 || has_axis(axes, a->axis_name[k]);
}

static int group_color(const shard_analysis *a, const char *axes, const shard_rank_analysis *r) {
    int color = 0;
    for (int k = 0; k < a->axes; k++)
        if (!in_group(a, axes, k)) color = color * a->axis_size[k] + r->coord[k];
    return color;
}

static shard_status group_link(cluster_ctx *cc, const shard_analysis *a, const shard_rank_analysis *r, const char *axes,
                               double *alpha, double *beta) {
    int color = group_color(a, axes, r);
    for (size_t i = 0; i < cc->n; i++)
        if (cc->memo[i].color == color && strcmp(cc->memo[i].axes, axes) == 0) {
            *alpha = cc->memo[i].alpha, *beta = cc->memo[i].beta;
            return SHARD_OK;
        }
    double al = 0, be = INFINITY;
    int *members = malloc(a->ranks * sizeof *members), m = 0;
    if (!members) return shard_error(SHARD_ERR_NO_MEMORY, "cost model: out of memory");
    for (size_t q = 0; q < a->ranks; q++)
        if (group_color(a, axes, &a->rank[q]) == color) members[m++] = (int)q;
    shard_status s = SHARD_OK;
    for (int i = 0; i < m && s == SHARD_OK; i++)
        for (int j = i + 1; j < m && s == SHARD_OK; j++) {
            double x, y;
            s = shard_cluster_link(cc->cluster, members[i], members[j], &x, &y);
            if (s == SHARD_OK) al = x > al ? x : al, be = y < be ? y : be;
        }
    free(members);
    SHARD_CHECK(s);
    if (cc->n == cc->cap) {
        size_t cap = cc->cap ? 2 * cc->cap : 32;
        link_memo *more = realloc(cc->memo, cap * sizeof *more);
        if (!more) return shard_error(SHARD_ERR_NO_MEMORY, "cost model: out of memory");
        cc->memo = more, cc->cap = cap;
    }
    link_memo *e = &cc->memo[cc->n++];
    snprintf(e->axes, sizeof e->axes, "%s", axes);
    e->color = color, e->alpha = al, e->beta = be;
    *alpha = al, *beta = be;
    return SHARD_OK;
}

/* One rank's time (scale: compute's share of the cores, > 1 when ranks outnumber them; cc: the emulated
 * cluster's, or NULL). */
static shard_status rank_time(const shard_analysis *a, const shard_machine_profile *p, const char *backend, int threads,
                              double scale, int spare_core, cluster_ctx *cc, const shard_rank_analysis *r,
                              shard_rank_time *t) {
    double all = r->flops_forward + r->flops_backward + r->flops_recompute + r->flops_other;
    if (p) {
        t->gemm_ms = gemm_ms(p, r, threads) * scale;
        t->nongemm_ms = t->gemm_ms * (a->world > 1 ? p->nongemm_fraction_loaded : p->nongemm_fraction);
    }
    t->compute_ms = t->gemm_ms + t->nongemm_ms;
    if (cc) { /* each span lasts at least its GEMM FLOPs at the device's rate */
        shard_cluster_device d;
        SHARD_CHECK(shard_cluster_rank_device(cc->cluster, r->rank, &d));
        double device_ms = all / (d.compute_tflops * 1e12) * 1e3;
        if (device_ms > t->compute_ms) t->compute_ms = device_ms;
    }
    /* the data axis reduces the gradients while the step's last backward pass runs (the strategy syncs on
     * the last micro-step only): that pass's compute is what hides them; a pipeline stage hands its
     * units over after its last B op, so nothing hides them there */
    double backward = all > 0 ? t->compute_ms * (r->flops_backward + r->flops_recompute) / all : 0;
    if (r->backward_ops > 1) backward /= r->backward_ops;
    if (r->pipelined) backward = 0;
    double overlap_ms[2] = {0, 0}, overlap_calls[2] = {0, 0}; /* gradient reductions; ZeRO-3 gathers */
    for (size_t i = 0; i < r->collectives; i++) {
        const shard_analyze_collective *c = &r->collective[i];
        int n = axes_size(a->mesh, a->world, c->axis);
        if (n <= 1 || c->count == 0) continue;
        const char *kind = fit_kind(c->op);
        double alpha, beta, ms;
        if (cc) {
            SHARD_CHECK(group_link(cc, a, r, c->axis, &alpha, &beta));
            ms = (c->alphas * alpha + (beta > 0 && isfinite(beta) ? c->wire_bytes / beta : 0)) * 1e3;
        } else {
            SHARD_CHECK(shard_profile_comm_find(p, backend, kind, n, &alpha, &beta));
            ms = shard_cost_collective_us(alpha, beta, (double)c->bytes, (double)c->count) / 1e3;
        }
        t->comm_whole_ms += ms;
        int data = has_axis(c->axis, "data");
        if (data && (strcmp(kind, "all_reduce") == 0 || strcmp(kind, "reduce_scatter") == 0))
            overlap_ms[0] += ms, overlap_calls[0] += (double)c->count;
        else if (data && a->zero == 3 && strcmp(kind, "all_gather") == 0)
            overlap_ms[1] += ms, overlap_calls[1] += (double)c->count;
        else
            t->comm_ms += ms;
    }
    /* overlap needs a core for the collective's progress (the threads backend's helper thread): with
     * every core computing, the overlapped copies take their time from compute, so all is exposed; an
     * emulated link's time is a wait, which overlaps */
    double hide = spare_core || cc ? 1.0 : 0.0;
    if (overlap_ms[0] > 0) t->comm_ms += shard_cost_exposed_ms(overlap_ms[0], hide * backward, overlap_calls[0]);
    if (overlap_ms[1] > 0) t->comm_ms += shard_cost_exposed_ms(overlap_ms[1], hide * t->compute_ms, overlap_calls[1]);
    t->bubble_ms = shard_cost_bubble_ms(t->compute_ms + t->comm_ms, a->bubble);
    /* the update reads values, gradients and state and writes values and state; the norm reads gradients */
    int data_size = axes_size(a->mesh, a->world, "data");
    double elements = (double)r->params / (a->zero >= 1 && data_size > 1 ? (double)data_size : 1.0);
    double bytes_each = strcmp(a->optimizer, "sgd") == 0 ? 16.0 : 32.0;
    t->optimizer_ms = p ? elements * bytes_each / (p->copy_gbps * 1e6) * scale : 0;
    t->total_ms = t->compute_ms + t->comm_ms + t->bubble_ms + t->optimizer_ms;
    return SHARD_OK;
}

shard_status shard_cost_predict(const shard_analysis *a, const shard_machine_profile *p, const shard_cost_options *o,
                                shard_step_prediction **out) {
    *out = NULL;
    const shard_cluster *cluster = o && o->struct_size >= sizeof *o ? o->cluster : NULL;
    if (!a || (!p && !cluster) || (p && p->struct_size < sizeof *p) || (o && o->struct_size < sizeof *o))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "cost model: no analysis, no profile or cluster, or options of another layout");
    if (cluster && shard_cluster_ranks(cluster) < a->world)
        return shard_error(SHARD_ERR_INVALID_ARG, "cost model: the cluster has %d devices for a layout of %d ranks",
                           shard_cluster_ranks(cluster), a->world);
    const char *backend = o && o->backend ? o->backend : "threads";
    shard_step_prediction *x = calloc(1, sizeof *x);
    if (!x || !(x->rank = calloc(a->ranks ? a->ranks : 1, sizeof *x->rank))) {
        free(x);
        return shard_error(SHARD_ERR_NO_MEMORY, "cost model: out of memory for %zu ranks", a->ranks);
    }
    int cores = p && p->cores > 0 ? p->cores : 1;
    /* shard_share_cores: a world of one keeps every core; thread ranks run one each; processes split
     * the machine's cores */
    int threads = a->world <= 1           ? cores
        : strcmp(backend, "threads") == 0 ? 1
                                          : (cores / a->world > 1 ? cores / a->world : 1);
    x->oversubscribed = p && a->world > cores;
    double scale = x->oversubscribed ? (double)a->world / (double)cores : 1.0;
    int spare_core = strcmp(backend, "threads") != 0 || a->world < cores;
    x->ranks = a->ranks;
    cluster_ctx cc = {.cluster = cluster};
    shard_status s = SHARD_OK;
    for (size_t i = 0; i < a->ranks && s == SHARD_OK; i++) {
        s = rank_time(a, p, backend, threads, scale, spare_core, cluster ? &cc : NULL, &a->rank[i], &x->rank[i]);
        if (x->rank[i].total_ms > x->step_ms) x->step_ms = x->rank[i].total_ms, x->slowest_rank = (int)i;
    }
    free(cc.memo);
    if (s < 0) {
        shard_step_prediction_destroy(x);
        return s;
    }
    x->tokens_per_s = x->step_ms > 0 ? (double)a->tokens / (x->step_ms / 1e3) : 0;
    *out = x;
    return SHARD_OK;
}
