/* check.c — the multi-rank test runner and its checks (see check.h). */
#include "check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PRINTED_PER_CASE = 8 };

static const char *program_name = "test";
static int world_ranks = 1;

static int report(test_ctx *t, const char *file, int line, const char *detail, const char *fmt, va_list ap) {
    t->failures++;
    t->total_failures++;
    if (t->failures > MAX_PRINTED_PER_CASE) return 0;
    char what[512];
    vsnprintf(what, sizeof what, fmt, ap);
    fprintf(stderr, "FAIL [case %s] rank %d of %d: %s:%d: %s%s%s (rerun: %s --ranks %d --case %s)\n", t->case_name,
            t->rank, t->size, file, line, what, detail[0] ? ": " : "", detail, program_name, world_ranks, t->case_name);
    return 0;
}

int test_check(test_ctx *t, int ok, const char *file, int line, const char *fmt, ...) {
    if (ok) return 1;
    va_list ap;
    va_start(ap, fmt);
    report(t, file, line, "", fmt, ap);
    va_end(ap);
    return 0;
}

int test_check_near(test_ctx *t, double got, double expect, double tol, const char *file, int line, const char *fmt,
                    ...) {
    if (fabs(got - expect) <= tol || (isnan(got) && isnan(expect))) return 1;
    char detail[160];
    snprintf(detail, sizeof detail, "got %.9g, expected %.9g (tolerance %g)", got, expect, tol);
    va_list ap;
    va_start(ap, fmt);
    report(t, file, line, detail, fmt, ap);
    va_end(ap);
    return 0;
}

int test_check_eq_int(test_ctx *t, int64_t got, int64_t expect, const char *file, int line, const char *fmt, ...) {
    if (got == expect) return 1;
    char detail[160];
    snprintf(detail, sizeof detail, "got %lld, expected %lld", (long long)got, (long long)expect);
    va_list ap;
    va_start(ap, fmt);
    report(t, file, line, detail, fmt, ap);
    va_end(ap);
    return 0;
}

int test_check_ok(test_ctx *t, shard_status s, const char *file, int line, const char *fmt, ...) {
    if (s == SHARD_OK) return 1;
    char detail[600];
    snprintf(detail, sizeof detail, "status %s: %s", shard_status_string(s), shard_last_error());
    va_list ap;
    va_start(ap, fmt);
    report(t, file, line, detail, fmt, ap);
    va_end(ap);
    return 0;
}

typedef struct run_args {
    const test_case *cases;
    size_t ncases;
    const char *only;
    int failed;
} run_args;

static shard_status rank_fn(shard_comm *comm, void *arg) {
    run_args *a = arg;
    test_ctx t = {.comm = comm, .rank = shard_comm_rank(comm), .size = shard_comm_size(comm)};
    for (size_t i = 0; i < a->ncases; i++) {
        if (a->only && strcmp(a->only, a->cases[i].name) != 0) continue;
        t.case_name = a->cases[i].name;
        t.failures = 0;
        a->cases[i].fn(&t);
        if (t.failures > MAX_PRINTED_PER_CASE)
            fprintf(stderr, "FAIL [case %s] rank %d: %d more failures not shown\n", t.case_name, t.rank,
                    t.failures - MAX_PRINTED_PER_CASE);
    }
    if (t.total_failures) return shard_error(SHARD_ERR_INTERNAL, "rank %d: %d checks failed", t.rank, t.total_failures);
    return SHARD_OK;
}

int test_main(int argc, char **argv, const char *program, const test_case *cases, size_t ncases) {
    program_name = program;
    shard_launch_config cfg = shard_launch_config_default();
    run_args a = {.cases = cases, .ncases = ncases};
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
            long n = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || n < 1 || n > 4096) {
                fprintf(stderr, "%s: --ranks '%s' is invalid: give an integer in 1..4096\n", program, argv[i]);
                return 2;
            }
            cfg.ranks = (int)n;
        } else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
            a.only = argv[++i];
        } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
            cfg.timeout_seconds = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(cfg.timeout_seconds > 0)) {
                fprintf(stderr, "%s: --timeout '%s' is invalid: give seconds > 0\n", program, argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--ranks N] [--case NAME] [--timeout S]\n", program);
            return 2;
        }
    }
    if (a.only) {
        int found = 0;
        for (size_t i = 0; i < ncases; i++) found |= strcmp(cases[i].name, a.only) == 0;
        if (!found) {
            fprintf(stderr, "%s: no case named '%s'; cases:", program, a.only);
            for (size_t i = 0; i < ncases; i++) fprintf(stderr, " %s", cases[i].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    int mpi_rank = 0, mpi_size = 0;
    if (shard_launch_detect_mpi(NULL, 0, &mpi_rank, &mpi_size))
        world_ranks = mpi_size;
    else
        world_ranks = cfg.ranks;
    shard_status s = shard_launch_with(&cfg, rank_fn, &a);
    if (s < 0) {
        fprintf(stderr, "%s: FAILED: %s\n", program, shard_last_error());
        return 1;
    }
    if (mpi_rank == 0) printf("%s: all cases passed on %d ranks\n", program, world_ranks);
    return 0;
}

void test_shared_dir(test_ctx *t, const char *prefix, char *dir, size_t bytes) {
    memset(dir, 0, bytes);
    if (t->rank == 0) {
        snprintf(dir, bytes, "/tmp/%s-XXXXXX", prefix);
        CHECK(t, mkdtemp(dir) != NULL, "mkdtemp %s", dir);
    }
    CHECK_OK(t, shard_comm_broadcast(t->comm, dir, bytes, SHARD_U8, 0), "share dir");
}

void test_remove_dir(test_ctx *t, const char *dir) {
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    if (t->rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(t, system(cmd) == 0, "rm %s", dir);
    }
}

void test_write_words(test_ctx *t, const char *path, const char *const *words, size_t nwords, size_t n, uint64_t seed) {
    uint32_t *tok = malloc(n * sizeof *tok);
    if (!CHECK(t, tok != NULL, "out of memory")) return;
    uint64_t r = seed;
    for (size_t i = 0; i < n;) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        for (const char *w = words[(r >> 33) % nwords]; *w && i < n; w++) tok[i++] = (uint8_t)*w;
    }
    CHECK_OK(t, shard_tokens_write(path, tok, n, 256), "tokens %s", path);
    free(tok);
}
