/* test_expert.c — the expert-parallel exchange of expert.h on every rank count
 * the harness runs (thread ranks or MPI): random assignments of each rank's
 * tokens to E experts split over the ranks (E = 6 on 4 ranks: 2, 2, 1, 1;
 * fewer experts than ranks: ranks holding none), ranks with no assignments,
 * experts that receive no rows.
 *
 *   - the rows each expert receives are, in order, the rows one rank holding
 *     every expert receives for it (a route over no communicator fed every
 *     rank's assignments in rank order);
 *   - combine after dispatch gives back each rank's rows (the identity);
 *   - an expert outside 0..E-1 on one rank fails every rank, naming it;
 *   - the exchange's counters (shard_expert_stats) count each all_to_allv's
 *     calls and send-buffer bytes; one rank counts nothing; the call log
 *     (shard_expert_log_set) keeps each call's kind and bytes, counts the
 *     calls past its capacity, and starts over at a reset.
 * Moves are copies: every comparison is exact.
 *
 *   test_expert --skip   (threads) a rank that skips the dispatch: the others
 *                        time out naming it */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard/shard.h"

enum { WIDTH = 5, MAX_N = 23 };

/* Rank p's assignments for a configuration: n in 0..MAX_N (0 on the ranks `empty` marks), experts drawn
 * from the seed; `stride` 2 picks even experts only (the odd ones get none).  The same on every rank. */
static size_t assignments(uint64_t seed, int p, size_t experts, int empty, int stride, int32_t *expert) {
    uint64_t s = (seed + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)p + 7) * 0xbf58476d1ce4e5b9ull;
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    size_t n = empty ? 0 : (size_t)(s >> 33) % (MAX_N + 1);
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t e = (size_t)(s >> 33) % experts;
        expert[i] = (int32_t)(stride == 2 ? e - e % 2 : e);
    }
    return n;
}

/* Row i of rank p's tokens, column c: distinct for every (p, i, c). */
static float value(int p, size_t i, size_t c) { return (float)(p * 10000 + (int)i * 10 + (int)c); }

typedef struct config {
    size_t experts;
    int empty_rank; /* this rank has no assignments (-1: none) */
    int stride;
} config;

static void run_config(test_ctx *t, const config *cf, uint64_t seed) {
    int32_t mine[MAX_N], all[MAX_N * 64];
    float x[MAX_N * WIDTH], y[MAX_N * WIDTH];
    size_t n = assignments(seed, t->rank, cf->experts, t->rank == cf->empty_rank, cf->stride, mine);
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < WIDTH; c++) x[i * WIDTH + c] = value(t->rank, i, c);
    /* the one-rank reference: every rank's assignments, in rank order */
    size_t total_n = 0;
    float *xs = malloc(MAX_N * 64 * WIDTH * sizeof *xs), *one = malloc(MAX_N * 64 * WIDTH * sizeof *one);
    for (int p = 0; p < t->size && p < 64; p++) {
        size_t k = assignments(seed, p, cf->experts, p == cf->empty_rank, cf->stride, all + total_n);
        for (size_t i = 0; i < k; i++)
            for (size_t c = 0; c < WIDTH; c++) xs[(total_n + i) * WIDTH + c] = value(p, i, c);
        total_n += k;
    }
    shard_expert_route *ref = NULL, *r = NULL;
    CHECK_OK(t, shard_expert_route_create(NULL, cf->experts, all, total_n, &ref), "the one-rank route");
    CHECK_OK(t, shard_expert_dispatch(ref, xs, one, WIDTH), "the one-rank dispatch");
    shard_expert_call log[3]; /* fewer than the 5 exchanges below: the rest are counted, not kept */
    shard_expert_log_set(log, 3);
    shard_expert_stats_reset();
    shard_status s = shard_expert_route_create(t->comm, cf->experts, mine, n, &r);
    CHECK_OK(t, s, "route over %d ranks, %zu experts", t->size, cf->experts);
    if (s < 0) {
        shard_expert_route_destroy(ref);
        free(xs), free(one);
        return;
    }
    size_t first, local, at_one = 0;
    shard_expert_range(cf->experts, t->size, t->rank, &first, &local);
    for (size_t e = 0; e < first; e++) at_one += shard_expert_route_rows(ref, e); /* my experts' rows in `one` */
    size_t total = shard_expert_route_total(r), sum = 0;
    for (size_t e = 0; e < local; e++) {
        CHECK_EQ_INT(t, shard_expert_route_rows(r, e), shard_expert_route_rows(ref, first + e),
                     "rows of expert %zu (%zu experts)", first + e, cf->experts);
        sum += shard_expert_route_rows(r, e);
    }
    CHECK_EQ_INT(t, total, sum, "the route's total against its experts' rows");
    float *got = malloc((total + 1) * WIDTH * sizeof *got);
    CHECK_OK(t, shard_expert_dispatch(r, x, got, WIDTH), "dispatch");
    size_t bad = 0;
    while (bad < total * WIDTH && got[bad] == one[at_one * WIDTH + bad]) bad++;
    CHECK(t, bad == total * WIDTH, "dispatch: element %zu of this rank's experts' rows is %g, one rank's %g", bad,
          bad < total * WIDTH ? got[bad] : 0.0, bad < total * WIDTH ? one[at_one * WIDTH + bad] : 0.0);
    memset(y, 0, sizeof y);
    CHECK_OK(t, shard_expert_combine(r, got, y, WIDTH), "combine");
    CHECK(t, memcmp(x, y, n * WIDTH * sizeof *x) == 0, "combine after dispatch is not the identity (%zu rows)", n);
    /* twice on one route: the staging kept from the first exchange serves the second */
    CHECK_OK(t, shard_expert_dispatch(r, x, got, WIDTH), "dispatch again");
    CHECK_OK(t, shard_expert_combine(r, got, y, WIDTH), "combine again");
    CHECK(t, memcmp(x, y, n * WIDTH * sizeof *x) == 0, "the second round trip differs");
    /* the counters: one counts exchange of [2 + experts of q] i64 per rank q, two dispatches of n rows, two
     * combines of total rows (none on one rank: nothing crosses a communicator) */
    shard_expert_stats st = {.struct_size = sizeof st};
    CHECK_OK(t, shard_expert_stats_get(&st), "the exchange's counters");
    int many = t->size > 1;
    CHECK_EQ_INT(t, st.counts_calls, (uint64_t)many, "counts exchanges");
    CHECK_EQ_INT(t, st.dispatch_calls + st.combine_calls, (uint64_t)(4 * many), "dispatch and combine calls");
    CHECK_EQ_INT(t, st.counts_bytes, (uint64_t)many * (2 * (size_t)t->size + cf->experts) * 8, "counts bytes");
    CHECK_EQ_INT(t, st.dispatch_bytes, (uint64_t)many * 2 * n * WIDTH * 4, "dispatch bytes");
    CHECK_EQ_INT(t, st.combine_bytes, (uint64_t)many * 2 * total * WIDTH * 4, "combine bytes");
    CHECK(t, st.counts_ms >= 0 && st.dispatch_ms >= 0 && st.combine_ms >= 0, "negative exchange times");
    /* the log: the same calls, one record each, in order (counts, dispatch, combine, ...) */
    CHECK_EQ_INT(t, shard_expert_log_count(), (size_t)(5 * many), "exchanges logged");
    for (size_t i = 0; many && i < 3; i++) {
        int kind = i == 0 ? SHARD_EXPERT_COUNTS : i == 1 ? SHARD_EXPERT_DISPATCH : SHARD_EXPERT_COMBINE;
        uint64_t bytes = i == 0 ? st.counts_bytes : i == 1 ? st.dispatch_bytes / 2 : st.combine_bytes / 2;
        uint64_t recv = i == 0 ? (uint64_t)t->size * (2 + local) * 8 : i == 1 ? total * WIDTH * 4 : n * WIDTH * 4;
        CHECK(t, log[i].kind == kind && log[i].bytes == bytes && log[i].recv_bytes == recv,
              "logged call %zu: kind %d, %llu bytes sent, %llu received; expected %d, %llu, %llu", i, log[i].kind,
              (unsigned long long)log[i].bytes, (unsigned long long)log[i].recv_bytes, kind, (unsigned long long)bytes,
              (unsigned long long)recv);
        CHECK(t, log[i].enter_s <= log[i].leave_s, "logged call %zu leaves before it enters", i);
    }
    shard_expert_log_set(NULL, 0);
    shard_expert_stats_reset();
    CHECK_EQ_INT(t, shard_expert_log_count(), (size_t)0, "exchanges logged after a reset");
    shard_expert_stats none = {.struct_size = 0};
    CHECK(t, shard_expert_stats_get(&none) == SHARD_ERR_INVALID_ARG, "a struct_size of 0 was accepted");
    free(got);
    shard_expert_route_destroy(r);
    shard_expert_route_destroy(ref);
    free(xs), free(one);
}

static void case_range(test_ctx *t) {
    for (size_t experts = 1; experts <= 9; experts++)
        for (int ranks = 1; ranks <= 5; ranks++) {
            size_t next = 0;
            for (int q = 0; q < ranks; q++) {
                size_t f, c, ef, ec;
                shard_expert_range(experts, ranks, q, &f, &c);
                shard_split_even(experts, (size_t)ranks, (size_t)q, &ef, &ec);
                CHECK(t, f == next && f == ef && c == ec, "%zu experts on %d ranks, rank %d: [%zu, +%zu)", experts,
                      ranks, q, f, c);
                next = f + c;
            }
            CHECK_EQ_INT(t, next, experts, "%zu experts on %d ranks: the ranges cover them", experts, ranks);
        }
}

static void case_uneven(test_ctx *t) { /* E = 6: uneven on 4 ranks */
    for (uint64_t seed = 1; seed <= 4; seed++) run_config(t, &(config){.experts = 6, .empty_rank = -1}, seed);
}

static void case_few_experts(test_ctx *t) { /* fewer experts than ranks on 3 and 4 ranks: some hold none */
    run_config(t, &(config){.experts = 2, .empty_rank = -1}, 11);
    run_config(t, &(config){.experts = 1, .empty_rank = -1}, 12);
}

static void case_empty(test_ctx *t) { /* a rank with no tokens; experts that receive none */
    run_config(t, &(config){.experts = 6, .empty_rank = 0}, 21);
    run_config(t, &(config){.experts = 7, .empty_rank = t->size - 1, .stride = 2}, 22);
    run_config(t, &(config){.experts = 5, .empty_rank = -1, .stride = 2}, 23);
}

static void case_bad_expert(test_ctx *t) {
    int32_t e[3] = {0, 1, 2};
    int culprit = t->size - 1;
    if (t->rank == culprit) e[1] = 6; /* 6 experts: 0..5 */
    shard_expert_route *r = NULL;
    shard_status s = shard_expert_route_create(t->comm, 6, e, 3, &r);
    char want[128];
    snprintf(want, sizeof want, "rank %d's assignment 1 names expert 6: give experts in 0..5", culprit);
    CHECK(t, s == SHARD_ERR_INVALID_ARG && r == NULL, "an invalid expert on rank %d was accepted", culprit);
    CHECK(t, strstr(shard_last_error(), want) != NULL, "the error '%s' lacks '%s'", shard_last_error(), want);
    shard_expert_route_destroy(r);
}

static const test_case cases[] = {
    {"range", case_range}, {"uneven", case_uneven},         {"few_experts", case_few_experts},
    {"empty", case_empty}, {"bad_expert", case_bad_expert},
};

/* ---- a rank that skips the dispatch (threads, its own job with a 1 s deadline) */

static shard_status skip_rank(shard_comm *comm, void *arg) {
    char(*text)[512] = arg;
    int r = shard_comm_rank(comm);
    int32_t e[2] = {0, 3};
    float x[2 * WIDTH] = {0}, got[8 * 2 * WIDTH];
    shard_expert_route *route = NULL;
    shard_status s = shard_expert_route_create(comm, 4, e, 2, &route);
    if (s == SHARD_OK && r != 1) s = shard_expert_dispatch(route, x, got, WIDTH); /* rank 1 never dispatches */
    snprintf(text[r], sizeof text[r], "%s", s < 0 ? shard_last_error() : "");
    shard_expert_route_destroy(route);
    return s;
}

static int skip_check(void) {
    static char text[3][512];
    shard_launch_config cfg = shard_launch_config_default();
    cfg.ranks = 3, cfg.backend = SHARD_BACKEND_THREADS, cfg.timeout_seconds = 1.0;
    shard_status s = shard_launch_with(&cfg, skip_rank, text);
    const char *want = "timeout after 1 s in all_to_allv #2 on comm 'world': rank 1 never entered it";
    int ok = s == SHARD_ERR_TIMEOUT;
    for (int r = 0; r < 3; r += 2) ok &= strstr(text[r], want) != NULL;
    printf("%s skip: %s\n", ok ? "ok  " : "FAIL", ok ? want : shard_last_error());
    for (int r = 0; !ok && r < 3; r += 2) fprintf(stderr, "  rank %d: '%s' (wanted '%s')\n", r, text[r], want);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--skip") == 0) return skip_check();
    return test_main(argc, argv, "test_expert", cases, sizeof cases / sizeof cases[0]);
}
