/* test_params.c — unit tests (cmocka) for the parameter slab: layout and
 * alignment, views, counter-based initialisation (reproducible, independent
 * of order, statistics of the normal), and safetensors load/save by name with
 * the errors a wrong file gives. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "shard/shard.h"

static shard_params *make(void) {
    shard_param_info t[3] = {{.name = "layer_0/weights", .ndim = 2, .shape = {5, 7}},
                             {.name = "layer_1/weights", .ndim = 2, .shape = {7, 3}},
                             {.name = "bias", .ndim = 1, .shape = {3}}};
    shard_params *p = NULL;
    assert_int_equal(shard_params_create(t, 3, SHARD_MEM_PARAMS, &p), SHARD_OK);
    return p;
}

static void layout(void **state) {
    (void)state;
    shard_params *p = make();
    assert_int_equal(p->count, 3);
    assert_int_equal(p->info[0].offset, 0);
    assert_int_equal(p->info[1].offset, 48); /* 35 rounded up to 16 */
    assert_int_equal(p->info[2].offset, 80); /* + 21 rounded up to 32 */
    assert_int_equal(p->total, 96);
    for (size_t i = 0; i < 3; i++) assert_int_equal(((uintptr_t)(p->data + p->info[i].offset)) % 64, 0);
    assert_ptr_equal(shard_params_data(p, "bias"), p->data + 80);
    assert_null(shard_params_data(p, "nope"));
    shard_tensor v = shard_params_view(p, 1);
    assert_int_equal(v.shape[0], 7);
    assert_int_equal(v.strides[0], 3);
    shard_params *g = NULL;
    assert_int_equal(shard_params_like(p, SHARD_MEM_GRADS, &g), SHARD_OK);
    assert_int_equal(g->total, p->total);
    assert_int_equal(g->info[2].offset, 80);
    shard_param_info dup[2] = {{.name = "a", .ndim = 0}, {.name = "a", .ndim = 0}};
    shard_params *bad = NULL;
    assert_int_equal(shard_params_create(dup, 2, SHARD_MEM_PARAMS, &bad), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "the name 'a' is given twice"));
    shard_params_destroy(g);
    shard_params_destroy(p);
}

static void init(void **state) {
    (void)state;
    size_t n = 200000;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    shard_init_normal(a, 0, n, 0.02f, 42, "h.0.attn.c_attn.weight");
    shard_init_normal(b, 0, n, 0.02f, 42, "h.0.attn.c_attn.weight");
    shard_init_normal(c, 0, n, 0.02f, 42, "h.1.attn.c_attn.weight");
    assert_memory_equal(a, b, n * sizeof *a);      /* reproducible */
    assert_true(memcmp(a, c, n * sizeof *a) != 0); /* another name, another stream */
    /* element i depends on i only: a slice made alone equals that slice of the whole */
    shard_init_normal(b, 12345, 777, 0.02f, 42, "h.0.attn.c_attn.weight");
    assert_memory_equal(a + 12345, b, 777 * sizeof *a);
    double mean = 0, var = 0;
    for (size_t i = 0; i < n; i++) mean += a[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (a[i] - mean) * (a[i] - mean);
    var /= (double)n;
    assert_true(fabs(mean) < 3 * 0.02 / sqrt((double)n) * 2);
    assert_true(fabs(sqrt(var) - 0.02) < 0.0005);
    shard_init_uniform(a, 0, n, 0.5f, 1, "w");
    float lo = 1, hi = -1;
    for (size_t i = 0; i < n; i++) lo = a[i] < lo ? a[i] : lo, hi = a[i] > hi ? a[i] : hi;
    assert_true(lo >= -0.5f && hi <= 0.5f && lo < -0.49f && hi > 0.49f);
    free(a), free(b), free(c);
}

static void load_save(void **state) {
    (void)state;
    char path[] = "/tmp/shard-params-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    shard_params *p = make(), *q = make();
    for (size_t i = 0; i < p->count; i++)
        shard_init_normal(p->data + p->info[i].offset, 0, p->info[i].numel, 1.0f, 3, p->info[i].name);
    const char *k = "format", *v = "pt";
    assert_int_equal(shard_params_save(p, path, &k, &v, 1), SHARD_OK);
    size_t loaded = 0;
    assert_int_equal(shard_params_load(q, path, 1, &loaded), SHARD_OK);
    assert_int_equal(loaded, 3);
    assert_memory_equal(p->data, q->data, p->total * sizeof(float));
    /* a model with another shape for one tensor, and one the file lacks */
    shard_param_info other[2] = {{.name = "bias", .ndim = 1, .shape = {4}}, {.name = "extra", .ndim = 1, .shape = {2}}};
    shard_params *r = NULL;
    assert_int_equal(shard_params_create(other, 2, SHARD_MEM_PARAMS, &r), SHARD_OK);
    assert_int_equal(shard_params_load(r, path, 0, NULL), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "tensor 'bias' has shape [3], the model needs [4]"));
    shard_params_destroy(r);
    shard_param_info only_extra[1] = {{.name = "extra", .ndim = 1, .shape = {2}}};
    assert_int_equal(shard_params_create(only_extra, 1, SHARD_MEM_PARAMS, &r), SHARD_OK);
    assert_int_equal(shard_params_load(r, path, 1, NULL), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "has no tensor 'extra', which the model needs"));
    assert_int_equal(shard_params_load(r, path, 0, &loaded), SHARD_OK);
    assert_int_equal(loaded, 0);
    shard_params_destroy(r);
    shard_params_destroy(p);
    shard_params_destroy(q);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layout),
        cmocka_unit_test(init),
        cmocka_unit_test(load_save),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
