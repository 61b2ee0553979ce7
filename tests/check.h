/* check.h — assertions for multi-rank tests.
 *
 * A failed check prints the case, rank, file:line and both values, then lets
 * the case go on: returning early would leave the other ranks waiting in a
 * collective.  Checks work the same in release builds (they are not assert).
 * test_main runs the cases on every rank (threads: --ranks N; MPI: under
 * mpiexec) and exits non-zero if any rank saw a failure. */
#ifndef SHARD_TEST_CHECK_H
#define SHARD_TEST_CHECK_H

#include <stdint.h>

#include "shard/shard.h"

typedef struct test_ctx {
    shard_comm *comm;
    int rank, size;
    const char *case_name;
    int failures; /* in this case */
    int total_failures;
} test_ctx;

typedef struct test_case {
    const char *name;
    void (*fn)(test_ctx *t);
} test_case;

int test_check(test_ctx *t, int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int test_check_near(test_ctx *t, double got, double expect, double tol, const char *file, int line, const char *fmt,
                    ...) __attribute__((format(printf, 7, 8)));
int test_check_eq_int(test_ctx *t, int64_t got, int64_t expect, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
int test_check_ok(test_ctx *t, shard_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define CHECK(t, cond, ...) test_check((t), (cond) ? 1 : 0, __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_NEAR(t, got, expect, tol, ...)                                                                           \
    test_check_near((t), (double)(got), (double)(expect), (double)(tol), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_EQ_INT(t, got, expect, ...)                                                                              \
    test_check_eq_int((t), (int64_t)(got), (int64_t)(expect), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_OK(t, status, ...) test_check_ok((t), (status), __FILE__, __LINE__, __VA_ARGS__)

/* Parse --ranks N, --case NAME, --timeout S; run the cases; 0 when all passed. */
int test_main(int argc, char **argv, const char *program, const test_case *cases, size_t ncases);

/* A fresh directory /tmp/<prefix>-XXXXXX made by rank 0 and shared with every rank (collective). */
void test_shared_dir(test_ctx *t, const char *prefix, char *dir, size_t bytes);
/* After a barrier, rank 0 removes dir and all it holds (collective). */
void test_remove_dir(test_ctx *t, const char *dir);
/* A token file of n byte tokens: words from the list, picked by a seeded LCG (a corpus with structure). */
void test_write_words(test_ctx *t, const char *path, const char *const *words, size_t nwords, size_t n, uint64_t seed);

#endif
