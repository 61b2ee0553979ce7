/* test_engine.c — the engine API's MLP against numpy golden vectors
 * (tests/fixtures/mlp_golden.safetensors, from tools/reference/mlp_golden.py):
 * forward output within 1e-5 relative and gradients within 1e-4 (fp32 sums
 * in another order than numpy's einsum: rounding of order 1e-7 per term over
 * 16-32 terms), the tape across two forwards, inference_loop, and the errors
 * of wrong shapes and names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "shard/shard.h"

#ifndef SHARD_FIXTURE_DIR
#define SHARD_FIXTURE_DIR "tests/fixtures"
#endif

static shard_safetensors *golden;

static shard_tensor *get(const char *name) {
    shard_tensor *t = NULL;
    if (shard_safetensors_tensor(golden, name, SHARD_MEM_OTHER, &t, NULL) < 0) fail_msg("%s", shard_last_error());
    return t;
}

static void expect_close(const shard_tensor *got, const shard_tensor *want, double rel, const char *what) {
    shard_tensor_diff d;
    assert_int_equal(shard_tensor_compare(got, want, &d), SHARD_OK);
    double scale = 0;
    for (size_t i = 0; i < shard_tensor_numel(want); i++) scale = fmax(scale, fabs(shard_tensor_get(want, i)));
    if (d.max_abs > rel * scale)
        fail_msg("%s: worst element %zu: %.8g vs %.8g (|diff| %.3g > %.0e x max |value| %.3g)", what, d.worst_index,
                 d.worst_a, d.worst_b, d.max_abs, rel, scale);
}

static shard_engine *loaded_engine(void) {
    shard_engine *e = NULL;
    assert_int_equal(shard_mlp_engine_create(16, 32, &e), SHARD_OK);
    shard_tensor *w0 = get("layer_0/weights"), *w1 = get("layer_1/weights");
    shard_named params[2] = {{"layer_0/weights", w0}, {"layer_1/weights", w1}};
    assert_int_equal(shard_engine_load_checkpoint(e, params, 2), SHARD_OK);
    shard_tensor_destroy(w0);
    shard_tensor_destroy(w1);
    return e;
}

static void forward_backward(void **state) {
    (void)state;
    shard_engine *e = loaded_engine();
    shard_tensor *x = get("x"), *dy = get("dy"), *want = get("y"), *y = NULL;
    assert_int_equal(shard_tensor_create(SHARD_F32, 2, want->shape, SHARD_MEM_ACTIVATIONS, &y), SHARD_OK);
    assert_int_equal(shard_engine_forward(e, x, y), SHARD_OK);
    expect_close(y, want, 1e-5, "y");
    shard_params *grads = NULL;
    assert_int_equal(shard_params_like(e->params, SHARD_MEM_GRADS, &grads), SHARD_OK);
    assert_int_equal(shard_engine_backward(e, dy, grads), SHARD_OK);
    for (int l = 0; l < 2; l++) {
        const char *name = l ? "layer_1/weights" : "layer_0/weights";
        char key[64];
        snprintf(key, sizeof key, "grad/%s", name);
        shard_tensor *g = get(key), view = shard_params_view(grads, (size_t)l);
        expect_close(&view, g, 1e-4, key);
        shard_tensor_destroy(g);
    }
    /* the tape: two forwards, then two backwards in reverse order give the same gradients */
    shard_tensor *y2 = NULL, *x2 = NULL;
    size_t half[2] = {4, 16};
    assert_int_equal(shard_tensor_create(SHARD_F32, 2, half, SHARD_MEM_ACTIVATIONS, &x2), SHARD_OK);
    assert_int_equal(shard_tensor_create(SHARD_F32, 2, half, SHARD_MEM_ACTIVATIONS, &y2), SHARD_OK);
    assert_int_equal(shard_engine_forward(e, x, y), SHARD_OK);
    assert_int_equal(shard_engine_forward(e, x2, y2), SHARD_OK);
    shard_params *g2 = NULL;
    assert_int_equal(shard_params_like(e->params, SHARD_MEM_GRADS, &g2), SHARD_OK);
    assert_int_equal(shard_engine_backward(e, y2, g2), SHARD_OK); /* pops x2 */
    assert_int_equal(shard_engine_backward(e, dy, g2), SHARD_OK); /* pops x */
    assert_memory_equal(g2->data, grads->data, grads->total * sizeof(float));
    /* in place (y = x): the tape keeps the input, so the gradients are the same */
    shard_tensor *xin = NULL; /* a writable copy (the fixture's tensors are views of a read-only mapping) */
    assert_int_equal(shard_tensor_create(SHARD_F32, 2, x->shape, SHARD_MEM_ACTIVATIONS, &xin), SHARD_OK);
    assert_int_equal(shard_tensor_copy(xin, x), SHARD_OK);
    assert_int_equal(shard_engine_forward(e, xin, xin), SHARD_OK);
    expect_close(xin, want, 1e-5, "y in place");
    assert_int_equal(shard_engine_backward(e, dy, g2), SHARD_OK);
    assert_memory_equal(g2->data, grads->data, grads->total * sizeof(float));
    shard_tensor_destroy(xin);
    assert_int_equal(shard_engine_backward(e, dy, g2), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "no forward to go back through"));
    shard_params_destroy(g2);
    shard_params_destroy(grads);
    shard_tensor_destroy(x2), shard_tensor_destroy(y2);
    shard_tensor_destroy(x), shard_tensor_destroy(dy), shard_tensor_destroy(want), shard_tensor_destroy(y);
    shard_engine_destroy(e);
}

typedef struct stream {
    shard_tensor *items[3];
    int next, written;
    const shard_tensor *want;
} stream;

static int read_item(void *ctx, shard_tensor **x) {
    stream *s = ctx;
    if (s->next == 3) return 0;
    *x = s->items[s->next++];
    return 1;
}

static shard_status write_item(void *ctx, const shard_tensor *y) {
    stream *s = ctx;
    expect_close(y, s->want, 1e-5, "inference_loop output");
    s->written++;
    return SHARD_OK;
}

static void inference_loop(void **state) {
    (void)state;
    shard_engine *e = loaded_engine();
    stream s = {{get("x"), get("x"), get("x")}, 0, 0, get("y")};
    assert_int_equal(shard_engine_inference_loop(e, read_item, &s, write_item, &s, 16), SHARD_OK);
    assert_int_equal(s.written, 3);
    for (int i = 0; i < 3; i++) shard_tensor_destroy(s.items[i]);
    shard_tensor_destroy((shard_tensor *)s.want);
    shard_engine_destroy(e);
}

static void refusals(void **state) {
    (void)state;
    shard_engine *e = NULL;
    assert_int_equal(shard_mlp_engine_create(16, 32, &e), SHARD_OK);
    shard_tensor *w = get("layer_1/weights");
    shard_named wrong[1] = {{"layer_0/weights", w}}; /* [32,16] where [16,32] belongs */
    assert_int_equal(shard_engine_load_checkpoint(e, wrong, 1), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "'layer_0/weights' must be [16,32], got f32[32,16]"));
    shard_tensor *w0 = get("layer_0/weights");
    shard_named only0[1] = {{"layer_0/weights", w0}}; /* a load needs both weights */
    assert_int_equal(shard_engine_load_checkpoint(e, only0, 1), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "'layer_1/weights' is missing"));
    shard_named half_bad[2] = {{"layer_0/weights", w0}, {"layer_1/weights", w0}}; /* the second wrong: nothing copied */
    assert_int_equal(shard_engine_load_checkpoint(e, half_bad, 2), SHARD_ERR_INVALID_ARG);
    assert_true(shard_params_data(e->params, "layer_0/weights")[0] == 0.0f);
    shard_tensor_destroy(w0);
    shard_named unknown[1] = {{"layer_2/weights", w}};
    assert_int_equal(shard_engine_load_checkpoint(e, unknown, 1), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "no parameter 'layer_2/weights'"));
    shard_tensor *y = NULL;
    size_t shape[2] = {32, 16};
    assert_int_equal(shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &y), SHARD_OK);
    assert_int_equal(shard_engine_forward(e, w, y), SHARD_OK); /* 32 rows of 16 features: fine */
    shard_tensor *x8 = get("layer_0/weights");                 /* 16 rows of 32 features: not */
    assert_int_equal(shard_engine_forward(e, x8, y), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "expected a contiguous f32[batch,16], got f32[16,32]"));
    /* gradients: a slab of this engine's layout, not its params nor another's shapes */
    assert_int_equal(shard_engine_backward(e, y, e->params), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "give a gradient slab of the engine's layout"));
    shard_engine *other = NULL;
    shard_params *small = NULL;
    assert_int_equal(shard_mlp_engine_create(16, 8, &other), SHARD_OK);
    assert_int_equal(shard_params_like(other->params, SHARD_MEM_GRADS, &small), SHARD_OK);
    assert_int_equal(shard_engine_backward(e, y, small), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "grads 'layer_0/weights' is another shape; this engine's is [16,32]"));
    shard_params_destroy(small), shard_engine_destroy(other);
    shard_tensor_destroy(w), shard_tensor_destroy(x8), shard_tensor_destroy(y);
    shard_engine_destroy(e);
}

static int setup(void **state) {
    (void)state;
    return shard_safetensors_open(SHARD_FIXTURE_DIR "/mlp_golden.safetensors", &golden) == SHARD_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    shard_safetensors_close(golden);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_backward),
        cmocka_unit_test(inference_loop),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
