/* test_blas.c — unit tests (cmocka) for shard_sgemm: every transpose
 * combination with padded strides and odd sizes against a plain triple loop
 * (in double), alpha/beta, empty shapes, refusals; and that OpenBLAS was
 * loaded with a core named in the description; large products, which are cut
 * into blocks of C over shard's threads, give the same bits on 1, 2 or 3
 * threads and when two callers (thread ranks) run products at once; the
 * product with a bias row (shard_sgemm_bias) small and split both ways; two products at once
 * (shard_sgemm_pair) with the bits of two calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
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
            float *A = malloc(arows * lda * sizeof *A), *B = malloc(brows * ldb * sizeof *B),
                  *C = malloc(M * ldc * sizeof *C);
            for (size_t i = 0; i < arows * lda; i++) A[i] = (float)((int)(i * 7 % 23) - 11) * 0.125f;
            for (size_t i = 0; i < brows * ldb; i++) B[i] = (float)((int)(i * 5 % 17) - 8) * 0.25f;
            for (size_t i = 0; i < M * ldc; i++) C[i] = (float)(i % 3);
            float *C0 = malloc(M * ldc * sizeof *C0);
            memcpy(C0, C, M * ldc * sizeof *C);
            assert_int_equal(shard_sgemm(ta, tb, M, N, K, 1.5f, A, lda, B, ldb, 0.5f, C, ldc), SHARD_OK);
            for (size_t i = 0; i < M; i++)
                for (size_t j = 0; j < N; j++) {
                    double want = 0.5 * C0[i * ldc + j];
                    for (size_t k = 0; k < K; k++)
                        want += 1.5 * (double)at(A, lda, ta, i, k) * (double)at(B, ldb, tb, k, j);
                    if (!(fabs(C[i * ldc + j] - want) <= 1e-4 * (1 + fabs(want)))) /* NaN fails too */
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

/* A product large enough to be split (M * N * K >= 4e6), wide or tall, every transpose. */
typedef struct big_product {
    size_t M, N, K;
    int ta, tb;
    float *A, *B, *C;
} big_product;

static void big_fill(big_product *p, size_t M, size_t N, size_t K, int ta, int tb) {
    *p = (big_product){
        M, N, K, ta, tb, malloc(M * K * sizeof(float)), malloc(K * N * sizeof(float)), malloc(M * N * sizeof(float))};
    for (size_t i = 0; i < M * K; i++) p->A[i] = (float)((int)(i * 7 % 23) - 11) / 16.0f;
    for (size_t i = 0; i < K * N; i++) p->B[i] = (float)((int)(i * 5 % 19) - 9) / 8.0f;
    for (size_t i = 0; i < M * N; i++) p->C[i] = (float)(i % 5);
}

static shard_status big_run(big_product *p) {
    return shard_sgemm(p->ta, p->tb, p->M, p->N, p->K, 0.75f, p->A, p->ta ? p->M : p->K, p->B, p->tb ? p->K : p->N,
                       0.5f, p->C, p->N);
}

static void *big_run_thread(void *arg) { return big_run(arg) == SHARD_OK ? arg : NULL; }

static void split_products_same_bits(void **state) {
    (void)state;
    size_t shapes[2][3] = {{301, 97, 160}, {67, 411, 200}}; /* split by rows, by columns */
    for (int sh = 0; sh < 2; sh++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                big_product one, many;
                big_fill(&one, shapes[sh][0], shapes[sh][1], shapes[sh][2], ta, tb);
                assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
                assert_int_equal(big_run(&one), SHARD_OK);
                for (int threads = 2; threads <= 3; threads++) {
                    big_fill(&many, shapes[sh][0], shapes[sh][1], shapes[sh][2], ta, tb);
                    assert_int_equal(shard_blas_set_threads(threads), SHARD_OK);
                    assert_int_equal(shard_blas_threads(), threads);
                    assert_int_equal(big_run(&many), SHARD_OK);
                    if (memcmp(one.C, many.C, one.M * one.N * sizeof(float)) != 0)
                        fail_msg("%zu x %zu x %zu (ta %d tb %d) on %d threads differs from 1 thread", one.M, one.N,
                                 one.K, ta, tb, threads);
                    free(many.A), free(many.B), free(many.C);
                }
                /* two callers at once: one has the helpers, the other runs its blocks itself */
                big_product twin[2];
                pthread_t t[2];
                for (int i = 0; i < 2; i++) big_fill(&twin[i], one.M, one.N, one.K, ta, tb);
                for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, big_run_thread, &twin[i]), 0);
                for (int i = 0; i < 2; i++) {
                    void *ok = NULL;
                    pthread_join(t[i], &ok);
                    assert_non_null(ok);
                    assert_memory_equal(one.C, twin[i].C, one.M * one.N * sizeof(float));
                    free(twin[i].A), free(twin[i].B), free(twin[i].C);
                }
                free(one.A), free(one.B), free(one.C);
            }
    assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
}

/* shard_sgemm_pair: two products (a tall one and a wide one, every transpose) give the bits of two
 * shard_sgemm calls on one thread, on 1, 2 (each product whole on its thread) and 3 threads; a bad
 * stride in either is refused with shard_sgemm's message. */
static shard_gemm as_gemm(const big_product *p) {
    return (shard_gemm){p->ta, p->tb, p->M, p->N, p->K, 0.75f, p->A, p->ta ? p->M : p->K, p->B, p->tb ? p->K : p->N,
                        0.5f,  p->C,  p->N};
}

static void pair_of_products(void **state) {
    (void)state;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            big_product want[2], got[2];
            big_fill(&want[0], 301, 97, 160, ta, tb), big_fill(&want[1], 67, 411, 200, 1 - ta, tb);
            assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
            for (int i = 0; i < 2; i++) assert_int_equal(big_run(&want[i]), SHARD_OK);
            for (int threads = 1; threads <= 3; threads++) {
                big_fill(&got[0], 301, 97, 160, ta, tb), big_fill(&got[1], 67, 411, 200, 1 - ta, tb);
                assert_int_equal(shard_blas_set_threads(threads), SHARD_OK);
                shard_gemm g0 = as_gemm(&got[0]), g1 = as_gemm(&got[1]);
                assert_int_equal(shard_sgemm_pair(&g0, &g1), SHARD_OK);
                for (int i = 0; i < 2; i++) {
                    if (memcmp(want[i].C, got[i].C, want[i].M * want[i].N * sizeof(float)) != 0)
                        fail_msg("product %d of the pair (ta %d tb %d) on %d threads differs from shard_sgemm", i, ta,
                                 tb, threads);
                    free(got[i].A), free(got[i].B), free(got[i].C);
                }
            }
            for (int i = 0; i < 2; i++) free(want[i].A), free(want[i].B), free(want[i].C);
        }
    /* one of the two NULL: the other alone, with shard_sgemm's bits */
    for (int threads = 1; threads <= 2; threads++) {
        big_product want, got;
        big_fill(&want, 301, 97, 160, 0, 1), big_fill(&got, 301, 97, 160, 0, 1);
        assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
        assert_int_equal(big_run(&want), SHARD_OK);
        assert_int_equal(shard_blas_set_threads(threads), SHARD_OK);
        shard_gemm g = as_gemm(&got);
        assert_int_equal(threads == 1 ? shard_sgemm_pair(&g, NULL) : shard_sgemm_pair(NULL, &g), SHARD_OK);
        assert_memory_equal(want.C, got.C, want.M * want.N * sizeof(float));
        assert_int_equal(shard_sgemm_pair(NULL, NULL), SHARD_OK);
        free(want.A), free(want.B), free(want.C), free(got.A), free(got.B), free(got.C);
    }
    big_product p[2];
    big_fill(&p[0], 301, 97, 160, 0, 0), big_fill(&p[1], 67, 411, 200, 0, 0);
    for (int threads = 1; threads <= 2; threads++) {
        assert_int_equal(shard_blas_set_threads(threads), SHARD_OK);
        shard_gemm g0 = as_gemm(&p[0]), g1 = as_gemm(&p[1]);
        g1.ldc = 5; /* shorter than its row of 411 */
        assert_int_equal(shard_sgemm_pair(&g0, &g1), SHARD_ERR_INVALID_ARG);
        assert_non_null(strstr(shard_last_error(), "a stride is shorter than its row"));
    }
    for (int i = 0; i < 2; i++) free(p[i].A), free(p[i].B), free(p[i].C);
    assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
}

/* C = alpha op(A) op(B) + bias on every row: against loops, with C's rows padded (the padding untouched)
 * and C's old values never read, for a product run whole and for ones split by rows and by columns (each
 * block fills its part of the bias), on 1, 2 and 3 threads, which must agree bit for bit (the inputs are
 * exact in float, so this checks where each block's bias lands); then no bias (C = the product) and
 * K = 0 (C = the bias). */
static void bias_rows(void **state) {
    (void)state;
    size_t shapes[3][3] = {{37, 23, 19}, {301, 97, 160}, {67, 411, 200}};
    for (int sh = 0; sh < 3; sh++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                big_product p;
                big_fill(&p, shapes[sh][0], shapes[sh][1], shapes[sh][2], ta, tb);
                size_t M = p.M, N = p.N, K = p.K, lda = ta ? M : K, ldb = tb ? K : N, ldc = N + 3;
                float *bias = malloc(N * sizeof *bias), *C = malloc(M * ldc * sizeof *C),
                      *first = malloc(M * ldc * sizeof *first);
                for (size_t j = 0; j < N; j++) bias[j] = (float)((int)(j * 3 % 11) - 5) * 0.5f;
                for (int threads = 1; threads <= 3; threads++) {
                    for (size_t i = 0; i < M * ldc; i++) C[i] = 1e9f; /* overwritten, never read; the padding kept */
                    assert_int_equal(shard_blas_set_threads(threads), SHARD_OK);
                    assert_int_equal(shard_sgemm_bias(ta, tb, M, N, K, 0.75f, p.A, lda, p.B, ldb, bias, C, ldc),
                                     SHARD_OK);
                    if (threads == 1) {
                        for (size_t i = 0; i < M; i++) {
                            for (size_t j = 0; j < N; j++) {
                                double want = bias[j];
                                for (size_t k = 0; k < K; k++)
                                    want += 0.75 * (double)at(p.A, lda, ta, i, k) * (double)at(p.B, ldb, tb, k, j);
                                if (!(fabs(C[i * ldc + j] - want) <= 1e-4 * (1 + fabs(want)))) /* NaN fails too */
                                    fail_msg("%zu x %zu x %zu (ta %d tb %d): C[%zu,%zu] = %g, want %g", M, N, K, ta, tb,
                                             i, j, C[i * ldc + j], want);
                            }
                            for (size_t j = N; j < ldc; j++) assert_true(C[i * ldc + j] == 1e9f);
                        }
                        memcpy(first, C, M * ldc * sizeof *first);
                    } else if (memcmp(first, C, M * ldc * sizeof *first) != 0) {
                        fail_msg("%zu x %zu x %zu (ta %d tb %d) with a bias on %d threads differs from 1 thread", M, N,
                                 K, ta, tb, threads);
                    }
                }
                /* no bias: the product alone, C's old values not read */
                for (size_t i = 0; i < M * ldc; i++) C[i] = 1e9f;
                assert_int_equal(shard_sgemm_bias(ta, tb, M, N, K, 0.75f, p.A, lda, p.B, ldb, NULL, C, ldc), SHARD_OK);
                for (size_t i = 0; i < M; i++)
                    for (size_t j = 0; j < N; j++) assert_true(C[i * ldc + j] == first[i * ldc + j] - bias[j]);
                /* K = 0: the bias alone */
                assert_int_equal(shard_sgemm_bias(ta, tb, M, N, 0, 0.75f, p.A, ta ? M : 1, p.B, ldb, bias, C, ldc),
                                 SHARD_OK);
                for (size_t i = 0; i < M; i++)
                    for (size_t j = 0; j < N; j++) assert_true(C[i * ldc + j] == bias[j]);
                free(p.A), free(p.B), free(p.C), free(bias), free(C), free(first);
            }
    assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bias_rows),          cmocka_unit_test(against_loops),
        cmocka_unit_test(edges_and_refusals), cmocka_unit_test(split_products_same_bits),
        cmocka_unit_test(pair_of_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
