/* mlp_single_device.c — the engine API's single-device engine: the 2-layer MLP
 * ReLU(x W0) W1 behind load_checkpoint / forward / backward /
 * inference_loop.
 *
 *   build/examples/mlp_single_device
 * trains the MLP for a few SGD steps to map x to -x (a mean-squared loss the
 * caller computes: the engine leaves the loss to its caller), then
 * streams three batches through inference_loop. */
#include <stdio.h>
#include <string.h>

#include "shard/shard.h"

enum { MODEL = 8, HIDDEN = 32, BATCH = 16 };

static void fill_input(shard_tensor *x, int step) {
    float *v = x->data;
    for (size_t i = 0; i < shard_tensor_numel(x); i++) v[i] = (float)(((int)i * 7 + step * 13) % 17 - 8) / 8.0f;
}

typedef struct batches {
    shard_tensor *x;
    int left;
} batches;

static int next_batch(void *ctx, shard_tensor **x) { /* the input stream */
    batches *b = ctx;
    if (b->left-- == 0) return 0;
    fill_input(b->x, 100 + b->left);
    *x = b->x;
    return 1;
}

static shard_status print_batch(void *ctx, const shard_tensor *y) { /* the output stream */
    int *n = ctx;
    printf("inference batch %d: y[0,0:3] = %+.3f %+.3f %+.3f\n", ++*n, ((float *)y->data)[0], ((float *)y->data)[1],
           ((float *)y->data)[2]);
    return SHARD_OK;
}

int main(void) {
    shard_engine *engine = NULL;
    shard_params *weights = NULL, *grads = NULL;
    shard_tensor *x = NULL, *y = NULL, *dy = NULL;
    size_t shape[2] = {BATCH, MODEL};
    shard_param_info layout[2] = {{.name = "layer_0/weights", .ndim = 2, .shape = {MODEL, HIDDEN}},
                                  {.name = "layer_1/weights", .ndim = 2, .shape = {HIDDEN, MODEL}}};
    shard_status s = shard_mlp_engine_create(MODEL, HIDDEN, &engine);
    /* load_checkpoint(params by name): a seeded initialisation stands in for a checkpoint file */
    if (s == SHARD_OK) s = shard_params_create(layout, 2, SHARD_MEM_OTHER, &weights);
    if (s == SHARD_OK) {
        shard_init_normal(shard_params_data(weights, "layer_0/weights"), 0, MODEL * HIDDEN, 0.35f, 1,
                          "layer_0/weights");
        shard_init_normal(shard_params_data(weights, "layer_1/weights"), 0, HIDDEN * MODEL, 0.18f, 1,
                          "layer_1/weights");
        shard_tensor w0 = shard_params_view(weights, 0), w1 = shard_params_view(weights, 1);
        shard_named params[2] = {{"layer_0/weights", &w0}, {"layer_1/weights", &w1}};
        s = shard_engine_load_checkpoint(engine, params, 2);
    }
    if (s == SHARD_OK) s = shard_params_like(engine->params, SHARD_MEM_GRADS, &grads);
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_ACTIVATIONS, &x);
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_ACTIVATIONS, &y);
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_ACTIVATIONS, &dy);
    shard_sgd_config sgd = {0.9f, 0.0f};
    shard_params *momentum = NULL;
    if (s == SHARD_OK) s = shard_params_like(engine->params, SHARD_MEM_OPTIMIZER, &momentum);
    float first = 0, last = 0;
    for (int step = 1; step <= 200 && s == SHARD_OK; step++) {
        fill_input(x, step);
        s = shard_engine_forward(engine, x, y); /* keeps x and the pre-activation on the tape */
        float *xv = x->data, *yv = y->data, *g = dy->data, loss = 0;
        for (size_t i = 0; i < BATCH * MODEL; i++) { /* loss = mean (y + x)^2: learn y = -x */
            float d = yv[i] + xv[i];
            loss += d * d / (BATCH * MODEL);
            g[i] = 2 * d / (BATCH * MODEL);
        }
        if (s == SHARD_OK) s = shard_engine_backward(engine, dy, grads); /* gradients by name */
        if (s == SHARD_OK)
            shard_sgd_update(&sgd, (uint64_t)step, 0.05f, engine->params->data, grads->data, momentum->data,
                             engine->params->total);
        if (step == 1) first = loss;
        last = loss;
    }
    if (s == SHARD_OK) printf("trained 200 SGD steps: loss %.4f -> %.4f\n", first, last);
    batches in = {x, 3};
    int written = 0;
    if (s == SHARD_OK) s = shard_engine_inference_loop(engine, next_batch, &in, print_batch, &written, MODEL);
    shard_tensor_destroy(x), shard_tensor_destroy(y), shard_tensor_destroy(dy);
    shard_params_destroy(weights), shard_params_destroy(grads), shard_params_destroy(momentum);
    shard_engine_destroy(engine);
    if (s < 0) {
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    if (!(last < first / 4) || written != 3) { /* the example is also a test (ctest looks at the exit code) */
        fprintf(stderr, "mlp_single_device: loss %g -> %g (want a quarter or less), %d of 3 batches out\n", first, last,
                written);
        return 1;
    }
    return 0;
}
