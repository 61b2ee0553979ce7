/* expect.h — the check of single-process C tests that run every case to the end.
 *
 * A failed EXPECT prints file:line and its message, counts itself in the including file's `failures`
 * (an int, or an _Atomic int where ranks are threads) and lets the test go on, so that one run reports
 * every broken promise; main then exits non-zero if `failures` is set.  It works the same in release
 * builds (it is not assert).  Multi-rank tests use check.h instead. */
#ifndef SHARD_TEST_EXPECT_H
#define SHARD_TEST_EXPECT_H

#include <stdio.h>

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
        }                                                                                                              \
    } while (0)

#endif
