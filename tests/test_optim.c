/* test_optim.c — unit tests (cmocka) for the optimizers against their
 * definitions worked by hand (in double): SGD with and without momentum and
 * weight decay, AdamW over three steps with decoupled decay and bias
 * correction, the clipping factor, and the warm-up + cosine schedule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>

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
        cmocka_unit_test(clipping_and_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
