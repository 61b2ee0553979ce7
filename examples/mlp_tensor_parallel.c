/* mlp_tensor_parallel.c — the engine API's MLP tensor parallel, beside the
 * single-device one (examples/mlp_single_device.c), through the same engine
 * interface: W0 split by columns and W1 by rows over the ranks, one
 * all_reduce of the output.  Every rank also runs the single-device engine
 * on the same weights and batches, and the two are compared: the output, the
 * gradients (each rank's block against the matching block of the whole) and
 * the losses of 100 SGD steps.
 *
 *   build/examples/mlp_tensor_parallel [RANKS=2]      thread ranks
 *   mpirun -np 3 build/examples/mlp_tensor_parallel   one rank per process */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard.h"

enum { MODEL = 8, HIDDEN = 30, BATCH = 16, STEPS = 100 };

/* the larger difference, a NaN kept once seen (fmax would drop it and pass a broken run) */
static double worse(double worst, double d) { return isnan(worst) || d <= worst ? worst : d; }

static void fill_input(shard_tensor *x, int step) {
    float *v = x->data;
    for (size_t i = 0; i < shard_tensor_numel(x); i++) v[i] = (float)(((int)i * 7 + step * 13) % 17 - 8) / 8.0f;
}

/* loss = mean (y + x)^2 (learn y = -x) and its gradient */
static float loss_of(const shard_tensor *x, const shard_tensor *y, shard_tensor *dy) {
    const float *xv = x->data, *yv = y->data;
    float *g = dy->data, loss = 0;
    for (size_t i = 0; i < BATCH * MODEL; i++) {
        float d = yv[i] + xv[i];
        loss += d * d / (BATCH * MODEL);
        g[i] = 2 * d / (BATCH * MODEL);
    }
    return loss;
}

static shard_status run(shard_comm *world, void *arg) {
    (void)arg;
    int rank = shard_comm_rank(world), size = shard_comm_size(world);
    shard_engine *engines[2] = {NULL, NULL}; /* 0: tensor parallel, 1: one device */
    shard_params *weights = NULL, *grads[2] = {NULL, NULL}, *momentum[2] = {NULL, NULL};
    shard_tensor *x = NULL, *y[2] = {NULL, NULL}, *dy = NULL;
    size_t shape[2] = {BATCH, MODEL};
    shard_param_info layout[2] = {{.name = "layer_0/weights", .ndim = 2, .shape = {MODEL, HIDDEN}},
                                  {.name = "layer_1/weights", .ndim = 2, .shape = {HIDDEN, MODEL}}};
    shard_status s = shard_blas_set_threads(1);
    if (s == SHARD_OK) s = shard_mlp_engine_create_tp(world, MODEL, HIDDEN, &engines[0]);
    if (s == SHARD_OK) s = shard_mlp_engine_create(MODEL, HIDDEN, &engines[1]);
    if (s == SHARD_OK) s = shard_params_create(layout, 2, SHARD_MEM_OTHER, &weights);
    if (s == SHARD_OK) { /* the whole weights, the same on every rank; each engine keeps its part */
        shard_init_normal(shard_params_data(weights, "layer_0/weights"), 0, MODEL * HIDDEN, 0.35f, 1,
                          "layer_0/weights");
        shard_init_normal(shard_params_data(weights, "layer_1/weights"), 0, HIDDEN * MODEL, 0.18f, 1,
                          "layer_1/weights");
        shard_tensor w0 = shard_params_view(weights, 0), w1 = shard_params_view(weights, 1);
        shard_named params[2] = {{"layer_0/weights", &w0}, {"layer_1/weights", &w1}};
        for (int e = 0; s == SHARD_OK && e < 2; e++) s = shard_engine_load_checkpoint(engines[e], params, 2);
    }
    for (int e = 0; s == SHARD_OK && e < 2; e++) {
        s = shard_params_like(engines[e]->params, SHARD_MEM_GRADS, &grads[e]);
        if (s == SHARD_OK) s = shard_params_like(engines[e]->params, SHARD_MEM_OPTIMIZER, &momentum[e]);
        if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_ACTIVATIONS, &y[e]);
    }
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_ACTIVATIONS, &x);
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_ACTIVATIONS, &dy);
    shard_sgd_config sgd = {0.9f, 0.0f};
    double worst_y = 0, worst_g = 0, worst_loss = 0;
    float first = 0, last = 0;
    for (int step = 1; step <= STEPS && s == SHARD_OK; step++) {
        fill_input(x, step);
        float loss[2];
        for (int e = 0; s == SHARD_OK && e < 2; e++) {
            s = shard_engine_forward(engines[e], x, y[e]);
            loss[e] = loss_of(x, y[e], dy);
            if (s == SHARD_OK) s = shard_engine_backward(engines[e], dy, grads[e]);
        }
        for (size_t i = 0; s == SHARD_OK && i < BATCH * MODEL; i++)
            worst_y = worse(worst_y, fabs(((float *)y[0]->data)[i] - ((float *)y[1]->data)[i]));
        /* this rank's blocks: W0's columns h0.., W1's rows h0.. */
        size_t h = engines[0]->params->info[0].shape[1], h0 = 0;
        for (int r = 0; r < rank; r++) h0 += HIDDEN / size + ((size_t)r < HIDDEN % size);
        const float *g0 = shard_params_data(grads[0], "layer_0/weights"),
                    *g1 = shard_params_data(grads[0], "layer_1/weights");
        const float *w0 = shard_params_data(grads[1], "layer_0/weights"),
                    *w1 = shard_params_data(grads[1], "layer_1/weights");
        for (size_t i = 0; s == SHARD_OK && i < MODEL; i++)
            for (size_t j = 0; j < h; j++) {
                worst_g = worse(worst_g, fabs(g0[i * h + j] - w0[i * HIDDEN + h0 + j]));
                worst_g = worse(worst_g, fabs(g1[j * MODEL + i] - w1[(h0 + j) * MODEL + i]));
            }
        worst_loss = worse(worst_loss, fabs(loss[0] - loss[1]) / loss[1]);
        for (int e = 0; s == SHARD_OK && e < 2; e++)
            shard_sgd_update(&sgd, (uint64_t)step, 0.05f, engines[e]->params->data, grads[e]->data, momentum[e]->data,
                             engines[e]->params->total);
        if (step == 1) first = loss[0];
        last = loss[0];
    }
    if (s == SHARD_OK && rank == 0) {
        printf("%s on %d ranks (%s): rank 0 holds W0 [%d,%zu] and W1 [%zu,%d] of [%d,%d] and [%d,%d]\n",
               engines[0]->ops->name, size, shard_comm_backend(world), MODEL, engines[0]->params->info[0].shape[1],
               engines[0]->params->info[1].shape[0], MODEL, MODEL, HIDDEN, HIDDEN, MODEL);
        printf("%d SGD steps: loss %.4f -> %.4f; against one device: outputs within %.2g, gradient blocks within %.2g, "
               "losses within %.2g relative\n",
               STEPS, first, last, worst_y, worst_g, worst_loss);
    }
    if (s == SHARD_OK && !(worst_y <= 1e-5 && worst_g <= 1e-5 && worst_loss <= 1e-5 && last < first / 2))
        s = shard_error(SHARD_ERR_INTERNAL,
                        "tensor-parallel MLP differs from one device (outputs %g, gradients %g, loss %g)", worst_y,
                        worst_g, worst_loss);
    for (int e = 0; e < 2; e++) {
        shard_engine_destroy(engines[e]);
        shard_params_destroy(grads[e]), shard_params_destroy(momentum[e]);
        shard_tensor_destroy(y[e]);
    }
    shard_params_destroy(weights);
    shard_tensor_destroy(x), shard_tensor_destroy(dy);
    return s;
}

int main(int argc, char **argv) {
    int under_mpi = shard_launch_detect_mpi(NULL, 0, NULL, NULL);
    int ranks = argc > 1 ? atoi(argv[1]) : under_mpi ? 0 : 2;
    if (shard_launch(ranks, run, NULL) < 0) {
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    return 0;
}
