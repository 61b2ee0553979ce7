/* cnn_fashion_mnist.c — the two-shard image classifier (conv 3x3 -> ReLU ->
 * max-pool 2 -> dense) trained on Debian's Fashion-MNIST on one device with
 * AdamW, then its accuracy on the 10,000 test images.
 *
 *   build/examples/cnn_fashion_mnist [STEPS=600] [BATCH=64]
 * Batches walk a seeded permutation of the 60,000 training images. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

static shard_status load(const char *images, const char *labels, shard_idx *x, shard_idx *y) {
    SHARD_CHECK(shard_idx_read(images, x));
    shard_status s = shard_idx_read(labels, y);
    if (s == SHARD_OK &&
        (x->ndim != 3 || y->ndim != 1 || x->dims[0] != y->dims[0] || x->dims[1] != 28 || x->dims[2] != 28))
        s = shard_error(SHARD_ERR_IO, "%s: expected N x 28 x 28 images with N labels", images);
    return s;
}

static void to_float(const shard_idx *x, size_t first, size_t n, const size_t *order, float *out) {
    for (size_t i = 0; i < n; i++) {
        size_t k = order ? order[first + i] : first + i;
        for (size_t p = 0; p < 784; p++) out[i * 784 + p] = (float)x->data[k * 784 + p] / 255.0f;
    }
}

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 600, batch = argc > 2 ? atol(argv[2]) : 64;
    if (steps <= 0 || batch <= 0 || batch > 4096) {
        fprintf(stderr, "usage: cnn_fashion_mnist [STEPS>0] [BATCH 1..4096]\n");
        return 2;
    }
    shard_idx train_x = {0}, train_y = {0}, test_x = {0}, test_y = {0}; /* freed on every path, loaded or not */
    shard_cnn *m = NULL;
    shard_params *grads = NULL, *mo = NULL, *ve = NULL;
    shard_cnn_config c;
    shard_status s = load(DATA "train-images-idx3-ubyte.gz", DATA "train-labels-idx1-ubyte.gz", &train_x, &train_y);
    if (s == SHARD_OK) s = load(DATA "t10k-images-idx3-ubyte.gz", DATA "t10k-labels-idx1-ubyte.gz", &test_x, &test_y);
    if (s == SHARD_OK) s = shard_cnn_config_parse("{\"model_type\": \"cnn\"}", "defaults", &c);
    size_t eval_batch = 500, cap = (size_t)batch > eval_batch ? (size_t)batch : eval_batch;
    if (s == SHARD_OK) s = shard_cnn_create(&c, cap, &m);
    if (s == SHARD_OK) s = shard_params_like(shard_cnn_params(m), SHARD_MEM_GRADS, &grads);
    if (s == SHARD_OK) s = shard_params_like(shard_cnn_params(m), SHARD_MEM_OPTIMIZER, &mo);
    if (s == SHARD_OK) s = shard_params_like(shard_cnn_params(m), SHARD_MEM_OPTIMIZER, &ve);
    float *images = malloc(cap * 784 * sizeof *images);
    int32_t *labels = malloc(cap * sizeof *labels);
    size_t n = train_y.count, *order = malloc(n * sizeof *order);
    if (s == SHARD_OK && (!images || !labels || !order)) s = shard_error(SHARD_ERR_NO_MEMORY, "out of memory");
    if (s == SHARD_OK) {
        shard_cnn_init(m, 1);
        uint64_t r = 12345; /* a seeded Fisher-Yates shuffle */
        for (size_t i = 0; i < n; i++) order[i] = i;
        for (size_t i = n - 1; i > 0; i--) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t j = (size_t)((r >> 33) % (i + 1)), t = order[i];
            order[i] = order[j], order[j] = t;
        }
    }
    shard_adamw_config ac = shard_adamw_defaults();
    ac.weight_decay = 0;
    shard_params *p = m ? shard_cnn_params(m) : NULL;
    float loss = 0, first = 0;
    for (long step = 1; step <= steps && s == SHARD_OK; step++) {
        size_t start = ((size_t)(step - 1) * (size_t)batch) % (n - (size_t)batch + 1);
        to_float(&train_x, start, (size_t)batch, order, images);
        for (long i = 0; i < batch; i++) labels[i] = train_y.data[order[start + (size_t)i]];
        shard_params_zero(grads);
        s = shard_cnn_forward(m, images, labels, (size_t)batch, &loss);
        if (s == SHARD_OK) s = shard_cnn_backward(m, grads);
        if (s == SHARD_OK)
            shard_adamw_update(&ac, (uint64_t)step, 2e-3f, p->data, grads->data, mo->data, ve->data, p->total);
        if (step == 1) first = loss;
    }
    size_t correct = 0;
    for (size_t at = 0; s == SHARD_OK && at < test_y.count; at += eval_batch) {
        size_t b = test_y.count - at < eval_batch ? test_y.count - at : eval_batch;
        to_float(&test_x, at, b, NULL, images);
        s = shard_cnn_forward(m, images, NULL, b, NULL);
        const float *logits = shard_cnn_logits(m);
        for (size_t i = 0; s == SHARD_OK && i < b; i++) {
            size_t best = 0;
            for (size_t k = 1; k < c.classes; k++)
                if (logits[i * c.classes + k] > logits[i * c.classes + best]) best = k;
            correct += best == test_y.data[at + i];
        }
    }
    if (s == SHARD_OK)
        printf("fashion-mnist: %ld steps of %ld images, loss %.3f -> %.3f, test accuracy %.1f%% (%zu/%zu)\n", steps,
               batch, first, loss, 100.0 * (double)correct / (double)test_y.count, correct, test_y.count);
    free(images), free(labels), free(order);
    shard_params_destroy(grads), shard_params_destroy(mo), shard_params_destroy(ve);
    shard_cnn_destroy(m);
    shard_idx_free(&train_x), shard_idx_free(&train_y), shard_idx_free(&test_x), shard_idx_free(&test_y);
    if (s < 0) {
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    return 0;
}
