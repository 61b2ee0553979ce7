/* test_cost_model.c — unit tests (cmocka) of the cost model's formulas (cost_model.h): the alpha-beta
 * fit and a collective's time, the exposed part of overlapped communication, the bubble's time, the
 * profile's look-ups (a GEMM shape's rate, a collective kind's fit by rank count), and a prediction of
 * a hand-made two-rank analysis whose every part is known. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "shard/shard.h"

static void fit_recovers_alpha_beta(void **state) {
    (void)state;
    double bytes[4] = {1e3, 1e4, 1e5, 1e6}, us[4];
    for (int i = 0; i < 4; i++) us[i] = 20.0 + bytes[i] / (5.0 * 1e3); /* 20 us, 5 GB/s */
    double alpha, beta;
    assert_int_equal(shard_cost_fit_alpha_beta(bytes, us, 4, &alpha, &beta), SHARD_OK);
    assert_true(fabs(alpha - 20.0) < 1e-6 && fabs(beta - 5.0) < 1e-9);
    assert_true(fabs(shard_cost_collective_us(alpha, beta, 2e6, 3) - (60.0 + 400.0)) < 1e-6);
    assert_int_equal(shard_cost_fit_alpha_beta(bytes, us, 1, &alpha, &beta), SHARD_ERR_INVALID_ARG);
    double flat[4] = {5, 5, 5, 5};
    assert_int_equal(shard_cost_fit_alpha_beta(bytes, flat, 4, &alpha, &beta), SHARD_ERR_INVALID_ARG);
}

static void overlap_and_bubble(void **state) {
    (void)state;
    assert_true(fabs(shard_cost_exposed_ms(10, 4, 5) - 6) < 1e-12);  /* the excess over compute */
    assert_true(fabs(shard_cost_exposed_ms(10, 40, 5) - 2) < 1e-12); /* at least the last piece */
    assert_true(fabs(shard_cost_bubble_ms(30, 0.25) - 10) < 1e-12);  /* 30 busy at 25 % idle: 40 in all */
    assert_true(shard_cost_bubble_ms(30, 0) == 0);
}

static shard_machine_profile *profile(void) {
    shard_machine_profile *p = calloc(1, sizeof *p);
    p->struct_size = sizeof *p, p->cores = 4, p->copy_gbps = 10, p->add_gbps = 10, p->nongemm_fraction = 0.25;
    p->nongemm_fraction_loaded = 0.5; /* thread ranks: the loaded one */
    p->gemm[p->gemms++] = (shard_profile_gemm){64, 64, 64, 1, 10, 0};
    p->gemm[p->gemms++] = (shard_profile_gemm){64, 64, 64, 4, 40, 0};
    p->gemm[p->gemms++] = (shard_profile_gemm){1024, 1024, 1024, 1, 50, 0};
    p->comm[p->comms++] = (shard_profile_comm){"threads", "all_reduce", 2, 10, 1};
    p->comm[p->comms++] = (shard_profile_comm){"threads", "all_reduce", 4, 20, 2};
    p->comm[p->comms++] = (shard_profile_comm){"threads", "all_gather", 2, 5, 4};
    return p;
}

static void profile_lookups(void **state) {
    (void)state;
    shard_machine_profile *p = profile();
    assert_true(shard_profile_gemm_gflops(p, 64, 80, 60, 1) == 10);
    assert_true(shard_profile_gemm_gflops(p, 64, 64, 64, 2) == 20); /* between 1 and 4 threads */
    assert_true(shard_profile_gemm_gflops(p, 2048, 1024, 1024, 1) == 50);
    double a, b;
    assert_int_equal(shard_profile_comm_find(p, "threads", "all_gather", 2, &a, &b), SHARD_OK);
    assert_true(a == 5 && b == 4);
    assert_int_equal(shard_profile_comm_find(p, "threads", "all_reduce", 3, &a, &b), SHARD_OK);
    assert_true(a == 20 && b == 2); /* equally near: the larger count */
    assert_int_equal(shard_profile_comm_find(p, "threads", "all_to_all", 2, &a, &b), SHARD_OK);
    assert_true(a == 10 && b == 1); /* a kind without a fit: all_reduce's */
    assert_int_equal(shard_profile_comm_find(p, "mpi", "all_reduce", 2, &a, &b), SHARD_ERR_UNSUPPORTED);
    free(p);
}

static void predict_two_ranks(void **state) {
    (void)state;
    shard_machine_profile *p = profile();
    shard_analysis a = {.world = 2, .ranks = 2, .zero = 0, .tokens = 1000};
    snprintf(a.mesh, sizeof a.mesh, "tensor=2");
    snprintf(a.optimizer, sizeof a.optimizer, "sgd");
    shard_rank_analysis r[2];
    shard_gemm_shape g = {64, 64, 64, 1000};
    shard_analyze_collective c = {.axis = "tensor", .op = "all_reduce", .bytes = 1000000, .count = 10};
    for (int i = 0; i < 2; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].rank = i, r[i].params = 1000000, r[i].flops_forward = 2.0 * 64 * 64 * 64 * 1000;
        r[i].gemm_shapes = 1, r[i].gemm_shape = &g, r[i].collectives = 1, r[i].collective = &c;
    }
    a.rank = r;
    shard_step_prediction *x = NULL;
    assert_int_equal(shard_cost_predict(&a, p, NULL, &x), SHARD_OK);
    const shard_rank_time *t = &x->rank[1];
    double gemm = 2.0 * 64 * 64 * 64 * 1000 / 10e6; /* ms at 10 GFLOP/s: thread ranks run one thread */
    assert_true(fabs(t->gemm_ms - gemm) < 1e-9 && fabs(t->compute_ms - 1.5 * gemm) < 1e-9);
    assert_true(fabs(t->comm_ms - (10 * 10 + 1e6 / 1e3) / 1e3) < 1e-9); /* 10 x alpha + bytes / beta */
    assert_true(fabs(t->optimizer_ms - 1e6 * 16 / 10e6) < 1e-9);        /* sgd: 16 bytes an element */
    assert_true(t->bubble_ms == 0 && fabs(t->total_ms - (t->compute_ms + t->comm_ms + t->optimizer_ms)) < 1e-12);
    assert_true(fabs(x->tokens_per_s - 1000 / (x->step_ms / 1e3)) < 1e-6 && !x->oversubscribed);
    shard_step_prediction_destroy(x);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fit_recovers_alpha_beta),
        cmocka_unit_test(overlap_and_bubble),
        cmocka_unit_test(profile_lookups),
        cmocka_unit_test(predict_two_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
