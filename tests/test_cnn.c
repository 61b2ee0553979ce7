/* test_cnn.c — the two-shard image classifier against PyTorch autograd golden
 * vectors (tests/fixtures/cnn_golden.safetensors, tools/reference/cnn_golden.py):
 * logits and loss within 1e-5 relative, gradients within 1e-4 of each
 * tensor's largest element; config refusals naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "shard/shard.h"

#ifndef SHARD_FIXTURE_DIR
#define SHARD_FIXTURE_DIR "tests/fixtures"
#endif

static const float *data_of(shard_safetensors *f, const char *name, size_t *n) {
    const shard_st_entry *e = shard_safetensors_find(f, name);
    if (!e) fail_msg("fixture lacks %s", name);
    if (n) *n = (size_t)(e->end - e->begin) / 4;
    return shard_safetensors_data(f, e);
}

static void compare(const float *got, const float *want, size_t n, double rel, const char *what) {
    double scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) /* a NaN is the worst element: !(d <= worst) holds for it */
        if (!(fabs((double)got[i] - want[i]) <= worst))
            worst = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]), at = i;
    if (!(worst <= rel * scale)) fail_msg("%s: element %zu: %.9g vs %.9g", what, at, got[at], want[at]);
}

static void golden(void **state) {
    (void)state;
    const char *path = SHARD_FIXTURE_DIR "/cnn_golden.safetensors";
    shard_safetensors *f = NULL;
    if (shard_safetensors_open(path, &f) < 0) fail_msg("%s", shard_last_error());
    shard_cnn_config c;
    assert_int_equal(shard_cnn_config_parse(shard_safetensors_metadata(f, "config"), "fixture", &c), SHARD_OK);
    shard_cnn *m = NULL;
    assert_int_equal(shard_cnn_create(&c, 4, &m), SHARD_OK);
    assert_int_equal(shard_params_load(shard_cnn_params(m), path, 1, NULL), SHARD_OK);
    shard_params *grads = NULL;
    assert_int_equal(shard_params_like(shard_cnn_params(m), SHARD_MEM_GRADS, &grads), SHARD_OK);
    float loss;
    size_t n;
    assert_int_equal(
        shard_cnn_forward(m, data_of(f, "images", NULL), (const int32_t *)data_of(f, "labels", NULL), 4, &loss),
        SHARD_OK);
    const float *logits = data_of(f, "logits", &n);
    compare(shard_cnn_logits(m), logits, n, 1e-5, "logits");
    const float *want_loss = data_of(f, "loss", NULL);
    assert_true(fabs(loss - want_loss[0]) <= 1e-5 * fabs(want_loss[0]));
    assert_int_equal(shard_cnn_backward(m, grads), SHARD_OK);
    for (size_t i = 0; i < grads->count; i++) {
        char key[160];
        snprintf(key, sizeof key, "grad/%s", grads->info[i].name);
        const float *want = data_of(f, key, &n); /* before n is read */
        assert_int_equal(n, grads->info[i].numel);
        compare(grads->data + grads->info[i].offset, want, n, 1e-4, key);
    }
    shard_params_destroy(grads);
    shard_cnn_destroy(m);
    shard_safetensors_close(f);
}

static void refusals(void **state) {
    (void)state;
    shard_cnn_config c;
    assert_int_equal(shard_cnn_config_parse("{\"channels\": 8, \"kernal\": 3}", "cnn.json", &c), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "cnn.json: key 'kernal' is unknown"));
    assert_int_equal(shard_cnn_config_parse("{\"pool\": 3}", "cnn.json", &c), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "key 'pool' = 3 must divide height 28"));
    assert_int_equal(shard_cnn_config_parse("{\"kernel\": 4}", "cnn.json", &c), SHARD_ERR_INVALID_ARG);
    /* sizes past their caps, and products that would wrap size_t (2^60 + 1 channels once wrapped to 784 pixels) */
    assert_int_equal(shard_cnn_config_parse("{\"in_channels\": 1152921504606846977}", "cnn.json", &c),
                     SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "key 'in_channels' = 1152921504606846977; valid: 1..1048576"));
    assert_int_equal(shard_cnn_config_parse("{\"in_channels\": 1048576, \"kernel\": 1023, \"height\": 65536, "
                                            "\"width\": 65536, \"pool\": 1}",
                                            "cnn.json", &c),
                     SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "need buffers larger than memory can address"));
    assert_int_equal(shard_cnn_config_parse("{}", "cnn.json", &c), SHARD_OK);
    assert_int_equal(shard_cnn_features(&c), 8 * 14 * 14);
    /* a struct given to create directly keeps the same rules (an even kernel overran its output, pool 0 divided by 0) */
    shard_cnn *m = NULL;
    shard_cnn_config even = c, no_pool = c;
    even.kernel = 2, no_pool.pool = 0;
    assert_int_equal(shard_cnn_create(&even, 4, &m), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "key 'kernel' = 2 must be odd"));
    assert_int_equal(shard_cnn_create(&no_pool, 4, &m), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "key 'pool' = 0; valid: 1..65536"));
    assert_null(m);
    assert_int_equal(shard_cnn_create(&c, (size_t)1 << 62, &m), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "batch 4611686018427387904) need buffers larger"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(golden), cmocka_unit_test(refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
