/* test_blas.c — unit tests (cmocka) for shard_sgemm: every transpose
 * combination with padded strides and odd sizes against a plain triple loop
 * (in double), alpha/beta, empty shapes, refusals; and that OpenBLAS was
 * loaded with a core named in the description. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "shard/blas.h"

static float at(const float *m, size_t ld, int t, size_t i, size_t j) { return t ? m[j * ld + i] : m[i * ld + j]; }

static void against_loops(void **state) {
    (void)state;
    size_t M = 37, N = 23, K = 19;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            size_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            size_t arows = ta ? K : M, brows = tb ? N : K;
            float *A = malloc(arows * lda * sizeof *A), *B = malloc(brows * ldb * sizeof *B), *C = malloc(M * ldc * sizeof *C);
            for (size_t i = 0; i < arows * lda; i++) A[i] = (float)((int)(i * 7 % 23) - 11) * 0.125f;
            for (size_t i = 0; i < brows * ldb; i++) B[i] = (float)((int)(i * 5 % 17) - 8) * 0.25f;
            for (size_t i = 0; i < M * ldc; i++) C[i] = (float)(i % 3);
            float *C0 = malloc(M * ldc * sizeof *C0);
            memcpy(C0, C, M * ldc * sizeof *C);
            assert_int_equal(shard_sgemm(ta, tb, M, N, K, 1.5f, A, lda, B, ldb, 0.5f, C, ldc), SHARD_OK);
            for (size_t i = 0; i < M; i++)
                for (size_t j = 0; j < N; j++) {
                    double want = 0.5 * C0[i * ldc + j];
                    for (size_t k = 0; k < K; k++) want += 1.5 * (double)at(A, lda, ta, i, k) * (double)at(B, ldb, tb, k, j);
                    if (fabs(C[i * ldc + j] - want) > 1e-4 * (1 + fabs(want)))
                        fail_msg("ta %d tb %d: C[%zu,%zu] = %g, want %g", ta, tb, i, j, C[i * ldc + j], want);
                }
            for (size_t i = 0; i < M; i++) /* the padding between rows is untouched */
                for (size_t j = N; j < ldc; j++) assert_true(C[i * ldc + j] == C0[i * ldc + j]);
            free(A), free(B), free(C), free(C0);
        }
}

static void edges_and_refusals(void **state) {
    (void)state;
    float a[4] = {1, 2, 3, 4}, c[4] = {9, 9, 9, 9};
    assert_int_equal(shard_sgemm(0, 0, 2, 2, 0, 1.0f, a, 1, a, 2, 0.0f, c, 2), SHARD_OK); /* K = 0: C = beta C */
    for (int i = 0; i < 4; i++) assert_true(c[i] == 0.0f);
    assert_int_equal(shard_sgemm(0, 0, 0, 5, 3, 1.0f, NULL, 3, NULL, 5, 0.0f, NULL, 5), SHARD_OK);
    assert_int_equal(shard_sgemm(0, 0, 2, 2, 2, 1.0f, a, 1, a, 2, 0.0f, c, 2), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "a stride is shorter than its row"));
    assert_non_null(strstr(shard_blas_description(), "core"));
    assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
    assert_int_equal(shard_blas_threads(), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(against_loops),
        cmocka_unit_test(edges_and_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
