/* device_placement.c — see placement.h (named apart from src/nn/placement.c, the parameters' blocks):
 * the Hungarian solver of a linear assignment, simulated annealing and a permutation genetic algorithm
 * over a full objective, and a plan's objective (the cost model's step on the cluster with the
 * permutation as its device map, plus a memory penalty).
 *
 * The searches count every evaluation against one budget and draw from their own generator (splitmix64)
 * so that an answer depends on the seed alone, never on the machine or the time. */
#include "shard/placement.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the Hungarian solver */

shard_status shard_assignment_hungarian(const double *cost, size_t n, size_t *assign, double *total) {
    if (n == 0 || !cost || !assign)
        return shard_error(SHARD_ERR_INVALID_ARG, "assignment: %s: give an n x n cost matrix with n >= 1",
                           n == 0 ? "n is 0" : "cost or assign is NULL");
    for (size_t k = 0; k < n * n; k++)
        if (!isfinite(cost[k]))
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "assignment: cost[%zu][%zu] is %s: give finite numbers (a forbidden pair a large one)",
                               k / n, k % n, isnan(cost[k]) ? "not a number" : "infinite");
    /* Kuhn-Munkres with potentials u (rows) and v (columns), 1-based with column 0 the free row's slot:
     * each row is added along a shortest augmenting path in the reduced costs, which stay >= 0 */
    size_t m = n + 1;
    double *u = calloc(m, sizeof *u), *v = calloc(m, sizeof *v), *minv = malloc(m * sizeof *minv);
    size_t *p = calloc(m, sizeof *p), *way = calloc(m, sizeof *way);
    char *used = malloc(m);
    shard_status s = SHARD_OK;
    if (!u || !v || !minv || !p || !way || !used) {
        s = shard_error(SHARD_ERR_NO_MEMORY, "assignment: out of memory for n = %zu", n);
        goto done;
    }
    for (size_t i = 1; i <= n; i++) {
        p[0] = i;
        size_t j0 = 0;
        for (size_t j = 0; j <= n; j++) minv[j] = INFINITY, used[j] = 0;
        do {
            used[j0] = 1;
            size_t i0 = p[j0], j1 = 0;
            double delta = INFINITY;
            for (size_t j = 1; j <= n; j++) {
                if (used[j]) continue;
                double cur = cost[(i0 - 1) * n + (j - 1)] - u[i0] - v[j];
                if (cur < minv[j]) minv[j] = cur, way[j] = j0;
                if (minv[j] < delta) delta = minv[j], j1 = j;
            }
            for (size_t j = 0; j <= n; j++)
                if (used[j])
                    u[p[j]] += delta, v[j] -= delta;
                else
                    minv[j] -= delta;
            j0 = j1;
        } while (p[j0] != 0);
        do { /* flip the path's matches back to the free row */
            size_t j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
        } while (j0);
    }
    double sum = 0;
    for (size_t j = 1; j <= n; j++) assign[p[j] - 1] = j - 1;
    for (size_t i = 0; i < n; i++) sum += cost[i * n + assign[i]];
    if (total) *total = sum;
done:
    free(u), free(v), free(minv), free(p), free(way), free(used);
    return s;
}

/* ---------------------------------------------------------------- the searches' common parts */

static uint64_t next_u64(uint64_t *state) { /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *state) { return (double)(next_u64(state) >> 11) * 0x1.0p-53; }

static size_t below(uint64_t *state, size_t n) { return (size_t)(uniform(state) * (double)n); }

typedef struct searcher {
    const char *method;
    shard_placement_cost_fn fn;
    void *ctx;
    size_t n, evaluations, budget;
    uint64_t rng;
    size_t *best;
    double best_cost;
    double identity_cost, start_cost; /* the starts' */
    shard_placement_options opt;      /* with the defaults */
    shard_status status;
} searcher;

/* The cost of perm, counted, kept as the best when strictly better (so ties keep the earlier start). */
static double evaluate(searcher *s, const size_t *perm) {
    double c = s->fn(perm, s->n, s->ctx);
    s->evaluations++;
    if (isnan(c)) {
        if (s->status == SHARD_OK) {
            const char *why = shard_last_error();
            s->status = shard_error(SHARD_ERR_INVALID_ARG,
                                    "placement (%s): the objective is not a number at "
                                    "evaluation %zu%s%s",
                                    s->method, s->evaluations, why[0] ? ": " : "", why);
        }
        return INFINITY;
    }
    if (c < s->best_cost) {
        s->best_cost = c;
        memcpy(s->best, perm, s->n * sizeof *perm);
    }
    return c;
}

static int is_permutation(const size_t *perm, size_t n, char *seen) {
    memset(seen, 0, n);
    for (size_t i = 0; i < n; i++) {
        if (perm[i] >= n || seen[perm[i]]) return 0;
        seen[perm[i]] = 1;
    }
    return 1;
}

/* The options with their defaults filled in (o may be NULL or an older, shorter layout). */
static shard_placement_options options_of(const shard_placement_options *o) {
    shard_placement_options d;
    memset(&d, 0, sizeof d);
    if (o) memcpy(&d, o, o->struct_size < sizeof d ? o->struct_size : sizeof d);
    d.struct_size = sizeof d;
    if (!d.evaluations) d.evaluations = 4000;
    if (!(d.final_fraction > 0 && d.final_fraction < 1)) d.final_fraction = 1e-3;
    if (!(d.temperature > 0)) d.temperature = 0;
    if (!d.population) d.population = 40;
    if (d.population < 4) d.population = 4;
    if (!d.tournament) d.tournament = 3;
    if (!d.elite) d.elite = 2;
    if (d.elite >= d.population) d.elite = d.population / 2;
    if (!(d.mutation > 0 && d.mutation <= 1)) d.mutation = 0.4;
    return d;
}

/* Check the arguments, set up the searcher, and evaluate the identity and the given start. */
static shard_status search_begin(searcher *s, const char *method, shard_placement_cost_fn fn, void *ctx, size_t n,
                                 uint64_t seed, const shard_placement_options *o, size_t *best) {
    memset(s, 0, sizeof *s);
    if (!fn || !best || n == 0)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "placement (%s): %s: give an objective, n >= 1 and room for the answer", method,
                           n == 0 ? "n is 0" : "the objective or the answer is NULL");
    if (o && o->struct_size < sizeof(size_t))
        return shard_error(SHARD_ERR_INVALID_ARG, "placement (%s): options of another layout (struct_size %zu)", method,
                           o->struct_size);
    shard_placement_options d = options_of(o);
    char *seen = malloc(n);
    size_t *identity = malloc(n * sizeof *identity);
    if (!seen || !identity) {
        free(seen), free(identity);
        return shard_error(SHARD_ERR_NO_MEMORY, "placement (%s): out of memory", method);
    }
    int valid = !d.start || is_permutation(d.start, n, seen);
    free(seen);
    if (!valid) {
        free(identity);
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "placement (%s): the starting permutation is not one of 0..%zu (each once)", method, n - 1);
    }
    *s = (searcher){.method = method,
                    .fn = fn,
                    .ctx = ctx,
                    .n = n,
                    .budget = d.evaluations,
                    .rng = seed,
                    .best = best,
                    .best_cost = INFINITY,
                    .opt = d};
    for (size_t i = 0; i < n; i++) identity[i] = i;
    memcpy(best, identity, n * sizeof *best);
    s->identity_cost = evaluate(s, identity);
    if (d.start && s->status == SHARD_OK) s->start_cost = evaluate(s, d.start);
    free(identity);
    return s->status;
}

static void swap_at(size_t *perm, size_t i, size_t j) {
    size_t t = perm[i];
    perm[i] = perm[j], perm[j] = t;
}

/* Two distinct positions (n >= 2). */
static void two_positions(searcher *s, size_t *i, size_t *j) {
    *i = below(&s->rng, s->n);
    *j = below(&s->rng, s->n - 1);
    if (*j >= *i) ++*j;
}

/* A uniformly random permutation (Fisher-Yates). */
static void shuffle(searcher *s, size_t *perm) {
    for (size_t i = 0; i < s->n; i++) perm[i] = i;
    for (size_t i = s->n; i > 1; i--) swap_at(perm, i - 1, below(&s->rng, i));
}

/* Swap descent from perm (cost c): every pair in turn, a swap kept when it lowers the cost, until a
 * whole pass keeps none or the budget is spent; perm and the cost returned are where it stops. */
static double descend(searcher *s, size_t *perm, double c) {
    for (int improved = 1; improved && s->evaluations < s->budget && s->status == SHARD_OK;) {
        improved = 0;
        for (size_t i = 0; i < s->n && s->evaluations < s->budget; i++)
            for (size_t j = i + 1; j < s->n && s->evaluations < s->budget && s->status == SHARD_OK; j++) {
                swap_at(perm, i, j);
                double e = evaluate(s, perm);
                if (e < c)
                    c = e, improved = 1;
                else
                    swap_at(perm, i, j);
            }
    }
    return c;
}

/* ---------------------------------------------------------------- simulated annealing */

enum { ANNEAL_ROUNDS = 8 };

shard_status shard_placement_anneal(shard_placement_cost_fn fn, void *ctx, size_t n, uint64_t seed,
                                    const shard_placement_options *o, size_t *best, double *cost) {
    searcher s;
    SHARD_CHECK(search_begin(&s, "anneal", fn, ctx, n, seed, o, best));
    size_t *cur = malloc(n * sizeof *cur);
    if (!cur) return shard_error(SHARD_ERR_NO_MEMORY, "placement (anneal): out of memory");
    memcpy(cur, best, n * sizeof *cur);
    double c = s.best_cost;
    /* the first temperature: a mean rise of random swaps from the start taken 70 % of the time */
    double t0 = s.opt.temperature;
    if (t0 == 0 && n >= 2) {
        double rise = 0;
        size_t rises = 0, probes = s.budget / 10 < 32 ? s.budget / 10 : 32;
        for (size_t k = 0; k < probes && s.evaluations < s.budget && s.status == SHARD_OK; k++) {
            size_t i, j;
            two_positions(&s, &i, &j);
            swap_at(cur, i, j);
            double d = evaluate(&s, cur) - c;
            if (d > 0 && isfinite(d)) rise += d, rises++;
            swap_at(cur, i, j);
        }
        t0 = rises ? rise / (double)rises / log(1 / 0.7) : 1e-9 * (fabs(c) + 1);
    }
    /* rounds: the first from the best start, the others from random permutations, each cooling from t0
     * over four fifths of its share and ending in a swap descent from the best found, so that one
     * cooling frozen in a poor basin costs a round, not the answer */
    for (size_t round = 0; round < ANNEAL_ROUNDS && n >= 2 && s.status == SHARD_OK; round++) {
        size_t left = s.budget > s.evaluations ? s.budget - s.evaluations : 0;
        size_t steps = left / (ANNEAL_ROUNDS - round) * 4 / 5;
        if (!steps) break;
        double before = s.best_cost;
        if (round == 0) {
            memcpy(cur, best, n * sizeof *cur);
            c = s.best_cost, before = INFINITY;
        } else {
            shuffle(&s, cur);
            c = evaluate(&s, cur);
        }
        double t = t0, cool = pow(s.opt.final_fraction, 1.0 / (double)steps);
        for (size_t k = 0; k < steps && s.status == SHARD_OK; k++) {
            size_t i, j;
            two_positions(&s, &i, &j);
            swap_at(cur, i, j);
            double e = evaluate(&s, cur), d = e - c;
            if (d <= 0 || uniform(&s.rng) < exp(-d / t))
                c = e;
            else
                swap_at(cur, i, j);
            t *= cool;
        }
        if (s.best_cost < before) { /* a new best: descend from it (an old one is already a local minimum) */
            memcpy(cur, best, n * sizeof *cur);
            descend(&s, cur, s.best_cost);
        }
    }
    free(cur);
    SHARD_CHECK(s.status);
    if (cost) *cost = s.best_cost;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- the genetic algorithm */

enum { GENETIC_STALL = 6 }; /* generations without a new best before the population is renewed */

/* The best of `k` members drawn at random. */
static size_t tournament(searcher *s, const double *costs, size_t population, size_t k) {
    size_t winner = below(&s->rng, population);
    for (size_t r = 1; r < k; r++) {
        size_t x = below(&s->rng, population);
        if (costs[x] < costs[winner]) winner = x;
    }
    return winner;
}

/* Order crossover: a's slice [i, j] kept in place, the other positions filled from j + 1 on, wrapping,
 * with b's entries in b's order from j + 1 on, skipping those the slice holds. */
static void order_crossover(searcher *s, const size_t *a, const size_t *b, size_t *child, char *taken) {
    size_t n = s->n, i = below(&s->rng, n), j = below(&s->rng, n);
    if (i > j) {
        size_t t = i;
        i = j, j = t;
    }
    memset(taken, 0, n);
    for (size_t k = i; k <= j; k++) child[k] = a[k], taken[a[k]] = 1;
    size_t at = (j + 1) % n;
    for (size_t r = 0; r < n; r++) {
        size_t gene = b[(j + 1 + r) % n];
        if (taken[gene]) continue;
        child[at] = gene, taken[gene] = 1;
        at = (at + 1) % n;
    }
}

/* Whether perm equals one of the first `count` permutations of `pool`. */
static int repeats(const size_t *perm, const size_t *pool, size_t count, size_t n) {
    for (size_t m = 0; m < count; m++)
        if (memcmp(perm, pool + m * n, n * sizeof *perm) == 0) return 1;
    return 0;
}

static int by_cost_ctx_less(const double *costs, size_t x, size_t y) {
    return costs[x] < costs[y] || (costs[x] == costs[y] && x < y);
}

shard_status shard_placement_genetic(shard_placement_cost_fn fn, void *ctx, size_t n, uint64_t seed,
                                     const shard_placement_options *o, size_t *best, double *cost) {
    searcher s;
    SHARD_CHECK(search_begin(&s, "genetic", fn, ctx, n, seed, o, best));
    size_t pop = s.opt.population, k = s.opt.tournament, elite = s.opt.elite;
    double mutation = s.opt.mutation;
    size_t *genes = malloc(2 * pop * n * sizeof *genes), *order = malloc(pop * sizeof *order);
    double *costs = malloc(2 * pop * sizeof *costs);
    char *taken = malloc(n);
    if (!genes || !order || !costs || !taken) {
        free(genes), free(order), free(costs), free(taken);
        return shard_error(SHARD_ERR_NO_MEMORY, "placement (genetic): out of memory for %zu x %zu", pop, n);
    }
    size_t *now = genes, *next = genes + pop * n;
    double *now_cost = costs, *next_cost = costs + pop;
    /* the first generation: the identity, the given start, the rest shuffled */
    size_t members = 0;
    for (size_t i = 0; i < n; i++) now[i] = i;
    now_cost[members++] = s.identity_cost;
    if (s.opt.start) memcpy(now + n, s.opt.start, n * sizeof *now), now_cost[members++] = s.start_cost;
    for (; members < pop && s.evaluations < s.budget && s.status == SHARD_OK; members++) {
        shuffle(&s, now + members * n);
        now_cost[members] = evaluate(&s, now + members * n);
    }
    size_t generations_end = s.budget - s.budget / 10; /* the last tenth: a swap descent from the best */
    double last_best = s.best_cost;
    size_t stalled = 0; /* generations without a new best */
    while (n >= 2 && members >= 2 && s.evaluations < generations_end && s.status == SHARD_OK) {
        stalled = s.best_cost < last_best ? 0 : stalled + 1;
        last_best = s.best_cost;
        for (size_t i = 0; i < members; i++) order[i] = i; /* the elite: the best few, by insertion */
        for (size_t i = 1; i < members; i++)
            for (size_t j = i; j > 0 && by_cost_ctx_less(now_cost, order[j], order[j - 1]); j--)
                swap_at(order, j, j - 1);
        size_t born = 0;
        for (; born < elite && born < members; born++) {
            memcpy(next + born * n, now + order[born] * n, n * sizeof *next);
            next_cost[born] = now_cost[order[born]];
        }
        for (; born < pop && s.evaluations < generations_end && s.status == SHARD_OK; born++) {
            size_t a = tournament(&s, now_cost, members, k), b = tournament(&s, now_cost, members, k);
            size_t *child = next + born * n;
            if (stalled >= GENETIC_STALL) { /* converged: all but the elite replaced by newcomers */
                shuffle(&s, child);
                next_cost[born] = evaluate(&s, child);
                continue;
            }
            order_crossover(&s, now + a * n, now + b * n, child, taken);
            /* swaps while a draw falls under the rate (one at its rate, two at its square, ...), and more
             * while the child repeats a member of its generation (16 swaps at most): a population of copies
             * stops searching */
            for (int tries = 0; tries < 16 && (uniform(&s.rng) < mutation || repeats(child, next, born, n)); tries++) {
                size_t i, j;
                two_positions(&s, &i, &j);
                swap_at(child, i, j);
            }
            next_cost[born] = evaluate(&s, child);
        }
        size_t *t = now;
        now = next, next = t;
        double *tc = now_cost;
        now_cost = next_cost, next_cost = tc;
        members = born;
        if (stalled >= GENETIC_STALL) stalled = 0;
    }
    free(genes), free(order), free(costs), free(taken);
    size_t *cur = s.status == SHARD_OK && n >= 2 ? malloc(n * sizeof *cur) : NULL;
    if (cur) {
        memcpy(cur, best, n * sizeof *cur);
        descend(&s, cur, s.best_cost);
        free(cur);
    }
    SHARD_CHECK(s.status);
    if (cost) *cost = s.best_cost;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- a plan's objective */

struct shard_placement_objective {
    const shard_analysis *analysis;
    const shard_machine_profile *profile;
    shard_cluster *cluster; /* our copy: its device map is each permutation's in turn */
    size_t n, world;
    double *flops, *peak;          /* per rank */
    double *tflops, *usable_bytes; /* per device: its rate, its memory x the fraction */
};

void shard_placement_objective_destroy(shard_placement_objective *obj) {
    if (!obj) return;
    shard_cluster_destroy(obj->cluster);
    free(obj->flops), free(obj->peak), free(obj->tflops), free(obj->usable_bytes);
    free(obj);
}

shard_status shard_placement_objective_create(const shard_analysis *a, const shard_machine_profile *profile,
                                              const shard_cluster *cluster, double fraction,
                                              shard_placement_objective **out) {
    if (!out || !a || !cluster)
        return shard_error(SHARD_ERR_INVALID_ARG, "placement objective: give an analysis, a cluster and room for it");
    *out = NULL;
    if (fraction < 0 || fraction > 1 || isnan(fraction))
        return shard_error(SHARD_ERR_INVALID_ARG, "placement objective: memory fraction %g: give one in (0, 1]",
                           fraction);
    int devices = shard_cluster_devices(cluster);
    if (a->world < 1 || a->world > devices || a->ranks != (size_t)a->world)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "placement objective: a layout of %d ranks on a cluster of %d devices: give a layout of "
                           "1..%d ranks",
                           a->world, devices, devices);
    shard_placement_objective *obj = calloc(1, sizeof *obj);
    if (!obj) return shard_error(SHARD_ERR_NO_MEMORY, "placement objective: out of memory");
    obj->analysis = a, obj->profile = profile, obj->n = (size_t)devices, obj->world = (size_t)a->world;
    shard_status s = shard_cluster_copy(cluster, &obj->cluster);
    if (s == SHARD_OK) s = shard_cluster_set_device_map_array(obj->cluster, NULL, 0);
    obj->flops = calloc(obj->world, sizeof *obj->flops), obj->peak = calloc(obj->world, sizeof *obj->peak);
    obj->tflops = calloc(obj->n, sizeof *obj->tflops), obj->usable_bytes = calloc(obj->n, sizeof *obj->usable_bytes);
    if (s == SHARD_OK && (!obj->flops || !obj->peak || !obj->tflops || !obj->usable_bytes))
        s = shard_error(SHARD_ERR_NO_MEMORY, "placement objective: out of memory for %zu devices", obj->n);
    for (size_t i = 0; s == SHARD_OK && i < obj->world; i++) {
        const shard_rank_analysis *r = &a->rank[i];
        obj->flops[i] = r->flops_forward + r->flops_backward + r->flops_recompute + r->flops_other;
        obj->peak[i] = (double)r->memory_total_bytes;
    }
    for (size_t j = 0; s == SHARD_OK && j < obj->n; j++) { /* in order, rank j is device j */
        shard_cluster_device d;
        s = shard_cluster_rank_device(obj->cluster, (int)j, &d);
        obj->tflops[j] = d.compute_tflops, obj->usable_bytes[j] = d.memory_bytes * (fraction > 0 ? fraction : 0.9);
    }
    if (s < 0) {
        shard_placement_objective_destroy(obj);
        return s;
    }
    *out = obj;
    return SHARD_OK;
}

size_t shard_placement_objective_size(const shard_placement_objective *obj) { return obj ? obj->n : 0; }

static double over_bytes_of(const shard_placement_objective *obj, size_t rank, size_t device) {
    double over = obj->peak[rank] - obj->usable_bytes[device];
    return over > 0 ? over : 0;
}

shard_status shard_placement_objective_predict(shard_placement_objective *obj, const size_t *perm, double *step_ms,
                                               double *over_bytes) {
    if (!obj || !perm) return shard_error(SHARD_ERR_INVALID_ARG, "placement objective: no objective or permutation");
    SHARD_CHECK(shard_cluster_set_device_map_array(obj->cluster, perm, obj->world));
    shard_cost_options co = {.struct_size = sizeof co, .backend = "threads", .cluster = obj->cluster};
    shard_step_prediction *x = NULL;
    SHARD_CHECK(shard_cost_predict(obj->analysis, obj->profile, &co, &x));
    double over = 0;
    for (size_t i = 0; i < obj->world; i++) over += over_bytes_of(obj, i, perm[i]);
    if (step_ms) *step_ms = x->step_ms;
    if (over_bytes) *over_bytes = over;
    shard_step_prediction_destroy(x);
    return SHARD_OK;
}

double shard_placement_objective_cost(const size_t *perm, size_t n, void *ctx) {
    shard_placement_objective *obj = ctx;
    if (!obj || n != obj->n) {
        shard_error(SHARD_ERR_INVALID_ARG, "placement objective: a permutation of %zu for %zu devices", n,
                    obj ? obj->n : 0);
        return NAN;
    }
    double step = 0, over = 0;
    if (shard_placement_objective_predict(obj, perm, &step, &over) < 0) return NAN;
    return step + SHARD_PLACEMENT_PENALTY_MS_PER_BYTE * over;
}

shard_status shard_placement_objective_linear(const shard_placement_objective *obj, double *cost) {
    if (!obj || !cost) return shard_error(SHARD_ERR_INVALID_ARG, "placement objective: no objective or matrix");
    size_t n = obj->n;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            cost[i * n + j] = i < obj->world ? obj->flops[i] / (obj->tflops[j] * 1e12) * 1e3 +
                    SHARD_PLACEMENT_PENALTY_MS_PER_BYTE * over_bytes_of(obj, i, j)
                                             : 0;
    return SHARD_OK;
}
