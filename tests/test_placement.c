/* test_placement.c — the placement solvers against brute force: the Hungarian solver's optimum equals the
 * best of all permutations on random 7 x 7 matrices; annealing and the genetic algorithm come within 2 %
 * of the best permutation of random quadratic assignment instances (flow between positions x distance
 * between devices, plus a linear part), answer the same for the same seed and spend no more than their
 * budget; a plan's objective prices a layout's tensor pairs across a slow link and a rank's memory past
 * its device's, and the searches find its best placement; bad input is refused in one line. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "shard/shard.h"

static int failures;

enum { MOST = 8 };

static uint64_t rng = 12345;
static double draw(void) { /* a fixed sequence: every run tests the same instances */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1.0p-53;
}

/* Every permutation of n in turn (Heap's algorithm), the least `fn` over them. */
static double brute_force(double (*fn)(const size_t *, size_t, void *), void *ctx, size_t n) {
    size_t perm[MOST] = {0}, c[MOST] = {0};
    for (size_t i = 0; i < n; i++) perm[i] = i;
    double best = fn(perm, n, ctx);
    for (size_t i = 1; i < n;) {
        if (c[i] < i) {
            size_t j = i % 2 ? c[i] : 0, t = perm[j];
            perm[j] = perm[i], perm[i] = t;
            double x = fn(perm, n, ctx);
            if (x < best) best = x;
            c[i]++, i = 1;
        } else {
            c[i++] = 0;
        }
    }
    return best;
}

static int is_permutation(const size_t *perm, size_t n) {
    char seen[MOST] = {0};
    for (size_t i = 0; i < n; i++) {
        if (perm[i] >= n || seen[perm[i]]) return 0;
        seen[perm[i]] = 1;
    }
    return 1;
}

/* ---------------------------------------------------------------- Hungarian against brute force */

static double linear_cost(const size_t *perm, size_t n, void *ctx) {
    const double *m = ctx;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += m[i * n + perm[i]];
    return sum;
}

static void test_hungarian(void) {
    enum { N = 7 };
    double worst = 0;
    for (int t = 0; t < 50; t++) {
        double m[N * N];
        for (size_t k = 0; k < N * N; k++) /* some instances with many ties, some negative */
            m[k] = t % 5 == 0 ? floor(draw() * 4) : t % 5 == 1 ? draw() * 200 - 100 : draw() * 1000;
        size_t assign[N];
        double total = -1;
        shard_status s = shard_assignment_hungarian(m, N, assign, &total);
        double best = brute_force(linear_cost, m, N);
        EXPECT(s == SHARD_OK && is_permutation(assign, N), "hungarian %d: status %d, %s", t, s, shard_last_error());
        EXPECT(fabs(total - best) <= 1e-9 && fabs(linear_cost(assign, N, m) - total) <= 1e-9,
               "hungarian %d: %.12g, the best permutation %.12g", t, total, best);
        if (fabs(total - best) > worst) worst = fabs(total - best);
    }
    double one = 3.5;
    size_t a1 = 9;
    EXPECT(shard_assignment_hungarian(&one, 1, &a1, NULL) == SHARD_OK && a1 == 0, "hungarian of one: %zu", a1);
    printf("hungarian: 50 random 7 x 7 matrices, the most any optimum differs from brute force: %.3g\n", worst);
}

/* ---------------------------------------------------------------- the searches on quadratic assignment */

typedef struct qap {
    size_t n;
    double flow[MOST][MOST], dist[MOST][MOST], linear[MOST * MOST];
    size_t evaluations;
} qap;

static double qap_cost(const size_t *perm, size_t n, void *ctx) {
    qap *q = ctx;
    q->evaluations++;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += q->linear[i * n + perm[i]];
        for (size_t k = i + 1; k < n; k++) sum += q->flow[i][k] * q->dist[perm[i]][perm[k]];
    }
    return sum;
}

/* Positions that talk in pairs and chains (as pipeline neighbours and tensor groups do), devices on a
 * plane in two or three clusters (nodes), a linear part as large as a tenth of the whole. */
static void make_qap(qap *q, size_t n) {
    memset(q, 0, sizeof *q);
    q->n = n;
    double x[MOST], y[MOST];
    int groups = draw() < 0.5 ? 2 : 3;
    for (size_t j = 0; j < n; j++) {
        int g = (int)(draw() * groups);
        x[j] = 10.0 * g + draw(), y[j] = 3.0 * (g % 2) + draw();
    }
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < n; k++) {
            q->dist[i][k] = hypot(x[i] - x[k], y[i] - y[k]);
            if (k > i) q->flow[i][k] = q->flow[k][i] = k == i + 1 ? 5 + 10 * draw() : draw() < 0.3 ? 3 * draw() : 0;
        }
    for (size_t k = 0; k < n * n; k++) q->linear[k] = 20 * draw();
}

static void test_searches(void) {
    double worst[2] = {0, 0};
    int instances = 0;
    for (size_t n = 7; n <= 8; n++)
        for (int t = 0; t < 6; t++, instances++) {
            qap q;
            make_qap(&q, n);
            double best = brute_force(qap_cost, &q, n);
            size_t start[MOST];
            EXPECT(shard_assignment_hungarian(q.linear, n, start, NULL) == SHARD_OK, "%s", shard_last_error());
            shard_placement_options o = {.struct_size = sizeof o, .evaluations = 4000, .start = start};
            for (int m = 0; m < 2; m++) {
                const char *name = m ? "genetic" : "anneal";
                size_t got[MOST], again[MOST];
                double cost = 0, cost2 = 0;
                q.evaluations = 0;
                shard_status s = (m ? shard_placement_genetic
                                    : shard_placement_anneal)(qap_cost, &q, n, 7 + (uint64_t)t, &o, got, &cost);
                size_t spent = q.evaluations;
                shard_status s2 = (m ? shard_placement_genetic
                                     : shard_placement_anneal)(qap_cost, &q, n, 7 + (uint64_t)t, &o, again, &cost2);
                EXPECT(s == SHARD_OK && s2 == SHARD_OK && is_permutation(got, n), "%s: %s", name, shard_last_error());
                EXPECT(fabs(qap_cost(got, n, &q) - cost) <= 1e-9 * fabs(cost), "%s: its cost is not its answer's",
                       name);
                EXPECT(cost2 == cost && memcmp(got, again, n * sizeof *got) == 0, "%s: the same seed, another answer",
                       name);
                EXPECT(spent <= o.evaluations, "%s: %zu evaluations for a budget of %zu", name, spent, o.evaluations);
                double ratio = cost / best - 1;
                EXPECT(ratio <= 0.02, "%s on %zu positions (instance %d): %.6g, %.2f %% over the best %.6g", name, n, t,
                       cost, 100 * ratio, best);
                if (ratio > worst[m]) worst[m] = ratio;
            }
        }
    printf("quadratic assignment, %d instances of 7 and 8 positions, 4000 evaluations: anneal at most %.2f %%, "
           "genetic at most %.2f %% over brute force\n",
           instances, 100 * worst[0], 100 * worst[1]);
}

/* ---------------------------------------------------------------- a plan's objective */

/* Four ranks, mesh tensor=2,data=2 (tensor outer: rank r is tensor r / 2, data r % 2), so that in order
 * the tensor pairs {0, 2} and {1, 3} cross the nodes; rank 0's peak fits only node a's devices. */
static const char *const TWO_NODES =
    "{\"nodes\": [{\"name\": \"a\", \"devices\": 2, \"compute_tflops\": 0.004, \"available_memory_gb\": 1},"
    "             {\"name\": \"b\", \"devices\": 2, \"compute_tflops\": 0.002, \"available_memory_gb\": 0.5}],"
    " \"network\": {\"bandwidth_gbps\": 10, \"latency_us\": 100},"
    " \"intra_node\": {\"bandwidth_gbps\": 40, \"latency_us\": 10},"
    " \"links\": [{\"from\": \"a\", \"to\": \"b\", \"bandwidth_gbps\": 0.5, \"latency_us\": 2000}]}";

static void test_plan_objective(void) {
    shard_cluster *c = NULL;
    if (shard_cluster_parse(TWO_NODES, "test.json", &c) < 0) {
        EXPECT(0, "cluster: %s", shard_last_error());
        return;
    }
    shard_analysis a = {.world = 4, .ranks = 4, .axes = 2, .tokens = 4096};
    snprintf(a.mesh, sizeof a.mesh, "tensor=2,data=2");
    snprintf(a.optimizer, sizeof a.optimizer, "sgd");
    snprintf(a.axis_name[0], sizeof a.axis_name[0], "tensor"), a.axis_size[0] = 2;
    snprintf(a.axis_name[1], sizeof a.axis_name[1], "data"), a.axis_size[1] = 2;
    shard_analyze_collective coll = {
        .axis = "tensor", .op = "all_reduce", .bytes = 1 << 20, .count = 4, .alphas = 4, .wire_bytes = 1 << 20};
    shard_rank_analysis r[4];
    for (int i = 0; i < 4; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].rank = i, r[i].coord[0] = i / 2, r[i].coord[1] = i % 2, r[i].flops_forward = 4e7;
        r[i].memory_total_bytes = i == 0 ? (uint64_t)700 << 20 : (uint64_t)100 << 20;
        r[i].collectives = 1, r[i].collective = &coll;
    }
    a.rank = r;
    shard_placement_objective *obj = NULL;
    shard_status s = shard_placement_objective_create(&a, NULL, c, 0.9, &obj);
    EXPECT(s == SHARD_OK && shard_placement_objective_size(obj) == 4, "objective: %s", shard_last_error());
    if (s < 0) {
        shard_cluster_destroy(c);
        return;
    }
    double m[16];
    EXPECT(shard_placement_objective_linear(obj, m) == SHARD_OK, "linear: %s", shard_last_error());
    /* 4e7 FLOPs at 0.004 and 0.002 TFLOP/s: 10 and 20 ms; rank 0's 700 MiB past b's 0.45 GiB usable */
    double over = 700.0 * (1 << 20) - 0.9 * 0.5 * (1 << 30);
    EXPECT(fabs(m[0] - 10) < 1e-9 && fabs(m[1 * 4 + 3] - 20) < 1e-9 &&
               fabs(m[2] - (20 + SHARD_PLACEMENT_PENALTY_MS_PER_BYTE * over)) < 1e-6,
           "linear part: %g %g %g", m[0], m[7], m[2]);
    size_t identity[4] = {0, 1, 2, 3}, paired[4] = {0, 2, 1, 3};
    double in_order = shard_placement_objective_cost(identity, 4, obj);
    double within = shard_placement_objective_cost(paired, 4, obj);
    double best = brute_force(shard_placement_objective_cost, obj, 4);
    EXPECT(within < in_order && fabs(within - best) < 1e-9,
           "tensor pairs within a node: %.3f ms, across: %.3f ms, the best placement %.3f ms", within, in_order, best);
    for (int k = 0; k < 2; k++) {
        size_t got[4];
        double cost = 0;
        s = (k ? shard_placement_genetic : shard_placement_anneal)(shard_placement_objective_cost, obj, 4, 1, NULL, got,
                                                                   &cost);
        EXPECT(s == SHARD_OK && fabs(cost - best) < 1e-9 && got[0] < 2,
               "%s on the plan's objective: %.3f ms (rank 0 on device %zu), the best %.3f ms", k ? "genetic" : "anneal",
               cost, got[0], best);
    }
    printf("plan objective: in order %.2f ms, tensor pairs within a node %.2f ms\n", in_order, within);
    /* the caller's cluster keeps its own (empty) device map */
    EXPECT(shard_cluster_ranks(c) == 4, "the caller's cluster changed: %d ranks", shard_cluster_ranks(c));
    shard_placement_objective_destroy(obj);
    a.world = 5, a.ranks = 5;
    EXPECT(shard_placement_objective_create(&a, NULL, c, 0.9, &obj) < 0 &&
               strstr(shard_last_error(), "a layout of 5 ranks on a cluster of 4 devices"),
           "5 ranks on 4 devices: %s", shard_last_error());
    shard_cluster_destroy(c);
}

/* ---------------------------------------------------------------- refusals */

static double failing(const size_t *perm, size_t n, void *ctx) {
    (void)perm, (void)n;
    int *calls = ctx;
    if (++*calls < 3) return 1.0;
    shard_error(SHARD_ERR_INVALID_ARG, "the model cannot price it");
    return NAN;
}

static void expect_one_line(shard_status s, const char *text, const char *what) {
    EXPECT(s < 0 && strstr(shard_last_error(), text) && !strchr(shard_last_error(), '\n'),
           "%s: status %d, message '%s', wanted '%s'", what, s, shard_last_error(), text);
}

static void test_refusals(void) {
    double m[4] = {1, 2, NAN, 4};
    size_t a[2];
    expect_one_line(shard_assignment_hungarian(m, 0, a, NULL), "n is 0", "hungarian n = 0");
    expect_one_line(shard_assignment_hungarian(m, 2, a, NULL), "cost[1][0] is not a number", "hungarian NaN");
    m[2] = INFINITY;
    expect_one_line(shard_assignment_hungarian(m, 2, a, NULL), "cost[1][0] is infinite", "hungarian inf");
    qap q;
    make_qap(&q, 4);
    size_t best[4], bad_start[4] = {0, 1, 1, 3};
    shard_placement_options o = {.struct_size = sizeof o, .start = bad_start};
    expect_one_line(shard_placement_anneal(qap_cost, &q, 0, 1, NULL, best, NULL), "n is 0", "anneal n = 0");
    expect_one_line(shard_placement_genetic(qap_cost, &q, 4, 1, &o, best, NULL), "starting permutation",
                    "genetic, a start that is no permutation");
    int calls = 0;
    expect_one_line(shard_placement_anneal(failing, &calls, 4, 1, NULL, best, NULL),
                    "placement (anneal): the objective is not a number at evaluation 3: the model cannot price it",
                    "anneal, an objective that fails");
    calls = 0;
    expect_one_line(shard_placement_genetic(failing, &calls, 4, 1, NULL, best, NULL),
                    "placement (genetic): the objective is not a number at evaluation 3",
                    "genetic, an objective that fails");
    shard_cluster *c = NULL;
    if (shard_cluster_parse(TWO_NODES, "test.json", &c) == SHARD_OK) {
        size_t twice[2] = {1, 1}, past[1] = {4};
        expect_one_line(shard_cluster_set_device_map_array(c, twice, 2), "names a device given before",
                        "a device twice");
        expect_one_line(shard_cluster_set_device_map_array(c, past, 1), "is past the last device", "device 4 of 4");
        size_t fine[2] = {3, 0};
        shard_cluster *copy = NULL;
        EXPECT(shard_cluster_set_device_map_array(c, fine, 2) == SHARD_OK && shard_cluster_copy(c, &copy) == SHARD_OK &&
                   shard_cluster_ranks(copy) == 2,
               "map 3,0 and a copy: %s", shard_last_error());
        shard_cluster_device d;
        EXPECT(copy && shard_cluster_rank_device(copy, 0, &d) == SHARD_OK && d.device == 3 && strcmp(d.node, "b") == 0,
               "the copy's rank 0 is not on device 3 of node b");
        shard_cluster_destroy(copy);
    }
    shard_cluster_destroy(c);
}

int main(void) {
    test_hungarian();
    test_searches();
    test_plan_objective();
    test_refusals();
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
