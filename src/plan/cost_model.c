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
#include "cluster_impl.h"

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

/* Per communicator name ("data", "data,expert", "world") of the analysis: its group size, the mesh
 * axes it spans, and (on a cluster) the slowest link of each of its groups, by the group's color (the
 * coordinates of the axes it does not span), found once: the emulated cluster prices a collective by
 * it. */
typedef struct axes_memo {
    char axes[64];
    int size;             /* ranks in one group */
    int data;             /* it spans `data` */
    unsigned spans;       /* bit k: it spans mesh axis k */
    double *alpha, *beta; /* by color; NULL without a cluster */
    unsigned char *known;
} axes_memo;

enum { AXES_MEMOS = 16 };

typedef struct price_ctx {
    const shard_cluster *cluster;
    const shard_analysis *a;
    axes_memo memo[AXES_MEMOS];
    size_t n;
    int *node;  /* by rank: its device's node (cluster only) */
    int *count; /* by node: scratch, a group's ranks on it */
    int *nodes; /* the group's distinct nodes */
} price_ctx;

static void price_ctx_free(price_ctx *pc) {
    for (size_t i = 0; i < pc->n; i++) free(pc->memo[i].alpha), free(pc->memo[i].beta), free(pc->memo[i].known);
    free(pc->node), free(pc->count), free(pc->nodes);
}

static int group_color(const shard_analysis *a, unsigned spans, const shard_rank_analysis *r) {
    int color = 0;
    for (int k = 0; k < a->axes; k++)
        if (!(spans & (1u << k))) color = color * a->axis_size[k] + r->coord[k];
    return color;
}

static shard_status memo_of(price_ctx *pc, const char *axes, axes_memo **out) {
    for (size_t i = 0; i < pc->n; i++)
        if (strcmp(pc->memo[i].axes, axes) == 0) {
            *out = &pc->memo[i];
            return SHARD_OK;
        }
    if (pc->n == AXES_MEMOS)
        return shard_error(SHARD_ERR_INTERNAL, "cost model: more than %d communicators in one layout", AXES_MEMOS);
    const shard_analysis *a = pc->a;
    axes_memo *m = &pc->memo[pc->n++];
    memset(m, 0, sizeof *m);
    snprintf(m->axes, sizeof m->axes, "%s", axes);
    m->size = axes_size(a->mesh, a->world, axes), m->data = has_axis(axes, "data");
    int world = strcmp(axes, "world") == 0;
    for (int k = 0; k < a->axes; k++)
        if (world || has_axis(axes, a->axis_name[k])) m->spans |= 1u << k;
    if (pc->cluster) {
        size_t colors = a->ranks ? a->ranks : 1;
        m->alpha = malloc(colors * sizeof *m->alpha), m->beta = malloc(colors * sizeof *m->beta);
        m->known = calloc(colors, 1);
        if (!m->alpha || !m->beta || !m->known) return shard_error(SHARD_ERR_NO_MEMORY, "cost model: out of memory");
    }
    *out = m;
    return SHARD_OK;
}

/* The slowest link among the ranks of rank r's group in m: by the nodes its ranks are on (two ranks of
 * one node: the node's link within; of two nodes: theirs). */
static shard_status group_link(price_ctx *pc, axes_memo *m, const shard_rank_analysis *r, double *alpha, double *beta) {
    const shard_analysis *a = pc->a;
    int color = group_color(a, m->spans, r);
    if (m->known[color]) {
        *alpha = m->alpha[color], *beta = m->beta[color];
        return SHARD_OK;
    }
    int nodes = 0;
    for (size_t q = 0; q < a->ranks; q++) {
        if (group_color(a, m->spans, &a->rank[q]) != color) continue;
        int n = pc->node[q];
        if (n < 0) return shard_error(SHARD_ERR_INVALID_ARG, "cost model: rank %zu has no device on the cluster", q);
        if (pc->count[n]++ == 0) pc->nodes[nodes++] = n;
    }
    double al = 0, be = INFINITY, x, y;
    for (int i = 0; i < nodes; i++) {
        if (pc->count[pc->nodes[i]] > 1) { /* two of the group's ranks within one node */
            shard__cluster_node_link(pc->cluster, pc->nodes[i], pc->nodes[i], &x, &y);
            al = x > al ? x : al, be = y < be ? y : be;
        }
        for (int j = i + 1; j < nodes; j++) {
            shard__cluster_node_link(pc->cluster, pc->nodes[i], pc->nodes[j], &x, &y);
            al = x > al ? x : al, be = y < be ? y : be;
        }
    }
    for (int i = 0; i < nodes; i++) pc->count[pc->nodes[i]] = 0;
    m->known[color] = 1, m->alpha[color] = al, m->beta[color] = be;
    *alpha = al, *beta = be;
    return SHARD_OK;
}

/* One rank's time (scale: compute's share of the cores, > 1 when ranks outnumber them; cc: the emulated
 * cluster's, or NULL). */
static shard_status rank_time(const shard_analysis *a, const shard_machine_profile *p, const char *backend, int threads,
                              double scale, int spare_core, price_ctx *pc, const shard_rank_analysis *r,
                              shard_rank_time *t) {
    double all = r->flops_forward + r->flops_backward + r->flops_recompute + r->flops_other;
    if (p) {
        t->gemm_ms = gemm_ms(p, r, threads) * scale;
        t->nongemm_ms = t->gemm_ms * (a->world > 1 ? p->nongemm_fraction_loaded : p->nongemm_fraction);
    }
    t->compute_ms = t->gemm_ms + t->nongemm_ms;
    if (pc->cluster) { /* each span lasts at least its GEMM FLOPs at the device's rate */
        shard_cluster_device d;
        SHARD_CHECK(shard_cluster_rank_device(pc->cluster, r->rank, &d));
        double device_ms = all / (d.compute_tflops * 1e12) * 1e3;
        if (device_ms > t->compute_ms) t->compute_ms = device_ms;
    }
    /* the data axis reduces the gradients while the step's last backward pass runs (the strategy syncs on
     * the last micro-step only): that pass's compute is what hides them; a pipeline stage hands its
     * units over after its last B op, so nothing hides them there */
    double backward = all > 0 ? t->compute_ms * (r->flops_backward + r->flops_recompute) / all : 0;
    if (r->backward_ops > 1) backward /= r->backward_ops;
    if (r->pipelined) backward = 0;
    double overlap_ms[2] = {0, 0}, overlap_piece[2] = {0, 0}, overlap_calls[2] = {0, 0}; /* gradient
                                                                       reductions; ZeRO-3 gathers */
    for (size_t i = 0; i < r->collectives; i++) {
        const shard_analyze_collective *c = &r->collective[i];
        axes_memo *m = NULL;
        SHARD_CHECK(memo_of(pc, c->axis, &m));
        int n = m->size;
        if (n <= 1 || c->count == 0) continue;
        const char *kind = fit_kind(c->op);
        /* the largest burst's time (calls issued together), where known; the small calls' (synchronisations) */
        double alpha, beta, ms, largest = -1, small = 0;
        if (pc->cluster) {
            SHARD_CHECK(group_link(pc, m, r, &alpha, &beta));
            double per_byte = beta > 0 && isfinite(beta) ? 1 / beta : 0;
            ms = (c->alphas * alpha + c->wire_bytes * per_byte) * 1e3;
            if (c->largest_wire_bytes > 0)
                largest = (c->largest_alphas * alpha + c->largest_wire_bytes * per_byte) * 1e3;
            small = (c->small_alphas * alpha + c->small_wire_bytes * per_byte) * 1e3;
            if (small > ms) small = ms;
        } else {
            SHARD_CHECK(shard_profile_comm_find(p, backend, kind, n, &alpha, &beta));
            ms = shard_cost_collective_us(alpha, beta, (double)c->bytes, (double)c->count) / 1e3;
        }
        t->comm_whole_ms += ms;
        int data = m->data;
        /* the largest burst of a kind waits whole (the last bucket fills as backward ends) */
        int k = data && (strcmp(kind, "all_reduce") == 0 || strcmp(kind, "reduce_scatter") == 0) ? 0
            : data && a->zero == 3 && strcmp(kind, "all_gather") == 0                            ? 1
                                                                                                 : -1;
        if (k < 0) {
            t->comm_ms += ms;
        } else { /* the small calls are synchronisations: they wait whole */
            t->comm_ms += small, ms -= small;
            overlap_ms[k] += ms, overlap_calls[k] += (double)c->count;
            double piece = largest >= 0 ? largest : ms / (double)c->count;
            if (piece > overlap_piece[k]) overlap_piece[k] = piece;
        }
    }
    /* overlap needs a core for the collective's progress (the threads backend's helper thread): with
     * every core computing, the overlapped copies take their time from compute, so all is exposed; an
     * emulated link's time is a wait, which overlaps */
    double hide = spare_core || pc->cluster ? 1.0 : 0.0;
    if (overlap_ms[0] > 0)
        t->comm_ms += shard_cost_exposed_ms(overlap_ms[0], hide * backward, overlap_ms[0] / overlap_piece[0]);
    if (overlap_ms[1] > 0) { /* ZeRO-3 gathers the next unit while this one computes: the first waits
                                whole, each other for what its gather takes beyond one unit's compute */
        double n = overlap_calls[1], each = overlap_ms[1] / n, compute_each = hide * t->compute_ms / n;
        t->comm_ms += overlap_piece[1] + (n - 1) * (each > compute_each ? each - compute_each : 0);
    }
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
    price_ctx pc = {.cluster = cluster, .a = a};
    shard_status s = SHARD_OK;
    if (cluster) {
        int nodes = shard_cluster_devices(cluster) + 1; /* no more nodes than devices */
        pc.node = malloc(a->ranks * sizeof *pc.node), pc.count = calloc((size_t)nodes, sizeof *pc.count);
        pc.nodes = malloc((size_t)nodes * sizeof *pc.nodes);
        if (!pc.node || !pc.count || !pc.nodes) s = shard_error(SHARD_ERR_NO_MEMORY, "cost model: out of memory");
        for (size_t i = 0; s == SHARD_OK && i < a->ranks; i++) pc.node[i] = shard__cluster_rank_node(cluster, (int)i);
    }
    for (size_t i = 0; i < a->ranks && s == SHARD_OK; i++) {
        s = rank_time(a, p, backend, threads, scale, spare_core, &pc, &a->rank[i], &x->rank[i]);
        if (x->rank[i].total_ms > x->step_ms) x->step_ms = x->rank[i].total_ms, x->slowest_rank = (int)i;
    }
    price_ctx_free(&pc);
    if (s < 0) {
        shard_step_prediction_destroy(x);
        return s;
    }
    x->tokens_per_s = x->step_ms > 0 ? (double)a->tokens / (x->step_ms / 1e3) : 0;
    *out = x;
    return SHARD_OK;
}
