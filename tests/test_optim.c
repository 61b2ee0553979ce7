/* test_optim.c — unit tests (cmocka) for the optimizers against their
 * definitions worked by hand (in double): SGD with and without momentum and
 * weight decay, AdamW over three steps with decoupled decay and bias
 * correction, the clipping factor, and the warm-up + cosine schedule.  The
 * optimizer interface: SGD with momentum through it follows
 * torch.optim.SGD's formula (clipped gradient, gradient left zeroed, its
 * one state array "momentum_buffer"), AdamW through it gives
 * shard_adamw_update_clipped's bits, names are looked up and bad options
 * refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "shard/optim.h"

static void near(double got, double want, double rel, const char *what) {
    if (!(fabs(got - want) <= rel * (fabs(want) + 1e-12))) fail_msg("%s: %.9g, want %.9g", what, got, want);
}

static void sgd(void **state) {
    (void)state;
    shard_sgd_config c = {0.9f, 0.1f};
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f}, buf[2] = {0, 0};
    double pd[2] = {1.0, -2.0}, bd[2];
    for (uint64_t step = 1; step <= 3; step++) {
        shard_sgd_update(&c, step, 0.01f, p, g, buf, 2);
        for (int i = 0; i < 2; i++) {
            double d = g[i] + 0.1 * pd[i];
            bd[i] = step == 1 ? d : 0.9 * bd[i] + d;
            pd[i] -= 0.01 * bd[i];
            near(p[i], pd[i], 1e-6, "sgd momentum");
        }
    }
    shard_sgd_config plain = {0, 0};
    float q = 3.0f, gq = 2.0f;
    shard_sgd_update(&plain, 1, 0.5f, &q, &gq, NULL, 1);
    near(q, 2.0, 0, "plain sgd");
}

static void adamw(void **state) {
    (void)state;
    shard_adamw_config c = shard_adamw_defaults();
    assert_true(c.beta1 == 0.9f && c.beta2 == 0.999f && c.eps == 1e-8f && c.weight_decay == 0.01f);
    float p[3] = {0.5f, -1.0f, 2.0f}, m[3] = {0}, v[3] = {0};
    const float grads[3][3] = {{0.1f, -0.2f, 0.3f}, {0.05f, 0.1f, -0.3f}, {-0.2f, 0.0f, 0.01f}};
    double pd[3] = {0.5, -1.0, 2.0}, md[3] = {0}, vd[3] = {0};
    for (uint64_t step = 1; step <= 3; step++) {
        float lr = 1e-2f;
        shard_adamw_update(&c, step, lr, p, grads[step - 1], m, v, 3);
        for (int i = 0; i < 3; i++) {
            double g = grads[step - 1][i];
            pd[i] *= 1 - 1e-2 * 0.01;
            md[i] = 0.9 * md[i] + 0.1 * g;
            vd[i] = 0.999 * vd[i] + 0.001 * g * g;
            double mhat = md[i] / (1 - pow(0.9, (double)step)), vhat = vd[i] / (1 - pow(0.999, (double)step));
            pd[i] -= 1e-2 * mhat / (sqrt(vhat) + 1e-8);
            near(p[i], pd[i], 1e-6, "adamw parameter");
            near(m[i], md[i], 1e-6, "adamw m");
        }
    }
}

/* torch.optim.SGD (dampening 0, not nesterov) by its documented formula, in double, on the gradient
 * multiplied by the clipping factor: d = clip g + wd p; buf = d at the first step, else momentum buf + d;
 * p -= lr buf. */
static void interface_sgd(void **state) {
    (void)state;
    shard_optimizer_options o = shard_optimizer_defaults(SHARD_OPTIMIZER_SGD);
    assert_true(o.sgd.momentum == 0 && o.sgd.weight_decay == 0);
    o.sgd.momentum = 0.9f, o.sgd.weight_decay = 0.01f;
    shard_optimizer *opt = NULL;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_OK);
    assert_string_equal(shard_optimizer_name(opt), "sgd");
    assert_int_equal(shard_optimizer_state_count(opt), 1);
    assert_string_equal(shard_optimizer_state_name(opt, 0), "momentum_buffer");
    assert_null(shard_optimizer_state_name(opt, 1));
    const float grads[3][3] = {{0.5f, -0.25f, 1.0f}, {0.125f, 0.5f, -2.0f}, {-1.0f, 0.0f, 0.75f}};
    const float clips[3] = {1.0f, 0.5f, 0.25f};
    float p[3] = {1.0f, -2.0f, 0.5f}, buf[3] = {0}, g[3], *st[1] = {buf};
    double pd[3] = {1.0, -2.0, 0.5}, bd[3] = {0};
    for (uint64_t step = 1; step <= 3; step++) {
        memcpy(g, grads[step - 1], sizeof g);
        assert_int_equal(shard_optimizer_update(opt, step, 0.1f, clips[step - 1], p, g, st, 3), SHARD_OK);
        for (int i = 0; i < 3; i++) {
            double d = (double)clips[step - 1] * grads[step - 1][i] + 0.01 * pd[i];
            bd[i] = step == 1 ? d : 0.9 * bd[i] + d;
            pd[i] -= 0.1 * bd[i];
            near(p[i], pd[i], 1e-6, "sgd through the interface");
            near(buf[i], bd[i], 1e-6, "momentum_buffer");
            assert_true(g[i] == 0.0f);
        }
    }
    /* the first step by hand: d = 0.5 + 0.01 x 1 = 0.51, buf = 0.51, p = 1 - 0.1 x 0.51 = 0.949 */
    float q = 1.0f, gq = 0.5f, bq = 123.0f, *sq[1] = {&bq};
    assert_int_equal(shard_optimizer_update(opt, 1, 0.1f, 1.0f, &q, &gq, sq, 1), SHARD_OK);
    near(q, 0.949, 1e-6, "first step by hand");
    near(bq, 0.51, 1e-6, "first step's buffer (what it held before ignored)");
    assert_int_equal(shard_optimizer_update(opt, 2, 0.1f, 1.0f, &q, &gq, NULL, 1), SHARD_ERR_INVALID_ARG);
    shard_optimizer_destroy(opt);
    /* plain SGD keeps no state: p -= lr (clip g) */
    o.sgd.momentum = 0, o.sgd.weight_decay = 0;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_OK);
    assert_int_equal(shard_optimizer_state_count(opt), 0);
    q = 3.0f, gq = 2.0f;
    assert_int_equal(shard_optimizer_update(opt, 1, 0.5f, 0.5f, &q, &gq, NULL, 1), SHARD_OK);
    near(q, 2.5, 0, "plain sgd, clipped");
    assert_true(gq == 0.0f);
    shard_optimizer_destroy(opt);
}

/* AdamW through the interface: shard_adamw_update_clipped's bits, over several chunks and clipping factors. */
static void interface_adamw(void **state) {
    (void)state;
    enum { N = 200003 };
    shard_optimizer_options o = shard_optimizer_defaults(SHARD_OPTIMIZER_ADAMW);
    o.adamw.weight_decay = 0.1f;
    shard_optimizer *opt = NULL;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_OK);
    assert_string_equal(shard_optimizer_name(opt), "adamw");
    assert_int_equal(shard_optimizer_state_count(opt), 2);
    assert_string_equal(shard_optimizer_state_name(opt, 0), "exp_avg");
    assert_string_equal(shard_optimizer_state_name(opt, 1), "exp_avg_sq");
    float *a[8]; /* p, g, m, v through the interface; then the kernel's */
    for (int k = 0; k < 8; k++) assert_non_null(a[k] = calloc(N, sizeof(float)));
    for (size_t i = 0; i < N; i++) a[0][i] = a[4][i] = (float)((int)(i * 7919 % 2001) - 1000) * 1e-3f;
    const float clips[3] = {1.0f, 0.3f, 0.9f};
    for (uint64_t step = 1; step <= 3; step++) {
        for (size_t i = 0; i < N; i++) a[1][i] = a[5][i] = (float)((int)((i + step) * 104729 % 4001) - 2000) * 1e-4f;
        float *st[2] = {a[2], a[3]};
        assert_int_equal(shard_optimizer_update(opt, step, 1e-3f, clips[step - 1], a[0], a[1], st, N), SHARD_OK);
        shard_adamw_update_clipped(&o.adamw, step, 1e-3f, clips[step - 1], a[4], a[5], a[6], a[7], N);
        for (int k = 0; k < 4; k++) assert_memory_equal(a[k], a[k + 4], N * sizeof(float));
    }
    for (size_t i = 0; i < N; i++) assert_true(a[1][i] == 0.0f);
    for (int k = 0; k < 8; k++) free(a[k]);
    shard_optimizer_destroy(opt);
}

static void interface_names_and_refusals(void **state) {
    (void)state;
    shard_optimizer_kind kind = SHARD_OPTIMIZER_SGD;
    assert_int_equal(shard_optimizer_find("adamw", &kind), SHARD_OK);
    assert_int_equal(kind, SHARD_OPTIMIZER_ADAMW);
    assert_int_equal(shard_optimizer_find("sgd", &kind), SHARD_OK);
    assert_int_equal(kind, SHARD_OPTIMIZER_SGD);
    assert_int_equal(shard_optimizer_find("adam2", &kind), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "optimizer 'adam2' is unknown: give adamw or sgd"));
    shard_optimizer *opt = NULL;
    shard_optimizer_options o = shard_optimizer_defaults(SHARD_OPTIMIZER_SGD);
    o.struct_size = 0;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "struct_size"));
    o = shard_optimizer_defaults(SHARD_OPTIMIZER_SGD);
    o.sgd.momentum = -0.5f;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "sgd: momentum -0.5 is invalid"));
    o = shard_optimizer_defaults(SHARD_OPTIMIZER_ADAMW);
    o.adamw.beta2 = 1.0f;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "adamw: beta2 1 is invalid: give a number in [0, 1)"));
    o.adamw.beta2 = 0.999f, o.adamw.weight_decay = NAN;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_ERR_INVALID_ARG);
    o.adamw.weight_decay = 0, o.kind = (shard_optimizer_kind)7;
    assert_int_equal(shard_optimizer_create(&o, &opt), SHARD_ERR_INVALID_ARG);
    assert_null(opt);
}

static void clipping_and_schedule(void **state) {
    (void)state;
    float g[4] = {3, 4, 0, 0};
    double norm = sqrt(shard_sum_squares(g, 4));
    near(norm, 5.0, 0, "norm");
    float f = shard_clip_factor(norm, 1.0f);
    near(f, 1.0 / (5.0 + 1e-6), 1e-7, "clip factor");
    assert_true(shard_clip_factor(norm, 10.0f) == 1.0f);
    shard_scale(g, 4, f);
    near(sqrt(shard_sum_squares(g, 4)), 1.0, 1e-6, "clipped norm");
    shard_lr_schedule s = {1e-3f, 1e-4f, 10, 110};
    near(shard_lr_at(&s, 1), 1e-4, 1e-6, "warm-up step 1");
    near(shard_lr_at(&s, 10), 1e-3, 1e-6, "end of warm-up");
    near(shard_lr_at(&s, 60), 1e-4 + 0.5 * 9e-4, 1e-6, "half-way down the cosine");
    near(shard_lr_at(&s, 110), 1e-4, 1e-6, "end");
    near(shard_lr_at(&s, 500), 1e-4, 1e-6, "after the end");
    shard_lr_schedule constant = {3e-4f, 3e-4f, 0, 0};
    near(shard_lr_at(&constant, 7), 3e-4, 1e-6, "constant");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sgd),
        cmocka_unit_test(adamw),
        cmocka_unit_test(interface_sgd),
        cmocka_unit_test(interface_adamw),
        cmocka_unit_test(interface_names_and_refusals),
        cmocka_unit_test(clipping_and_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
