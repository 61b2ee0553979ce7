/* cnn_pipeline.c — the two-shard image classifier as a 2-stage pipeline: the
 * feature shard (conv 3x3 -> ReLU -> max-pool) on stage 0 and the classifier
 * shard (dense, loss) on stage 1, the pooled maps travelling between them, on
 * Debian's Fashion-MNIST.  The same training runs on one device beside it
 * (the same global batches); both models are then scored on the 10,000 test
 * images and the accuracies must agree.
 *
 *   build/examples/cnn_pipeline [STEPS=300] [BATCH=64]     2 thread ranks (1F1B, 4 micro-batches)
 *   mpirun -np 2 build/examples/cnn_pipeline              one stage per process
 * Exit 1 when the pipelined model's test accuracy differs from the single-device one's by more than
 * 0.05 points (5 images: a last-bit difference in the summed gradients may move an argmax or two). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard.h"

#define DATA "/usr/share/datasets/fashion-mnist/"
#define CONFIG "{\"model_type\": \"cnn\"}"

typedef struct run_args {
    long steps, batch;
    char config[256];
    size_t correct[2]; /* pipelined, one device */
    double loss[2];
} run_args;

/* Train on `mesh_text` over comm; the whole trained parameters (every stage's, put together) in *out. */
static shard_status train(shard_comm *comm, const run_args *a, const char *mesh_text, shard_params *whole,
                          double *last) {
    shard_trainer_config c = {.config_path = a->config,
                              .batch = (size_t)a->batch,
                              .seed = 7,
                              .adamw = shard_adamw_defaults(),
                              .clip = 0,
                              .schedule = "1f1b",
                              .micro_batches = 4};
    c.adamw.weight_decay = 0;
    c.lr = (shard_lr_schedule){2e-3f, 2e-3f, 0, (uint64_t)a->steps};
    shard_mesh *mesh = NULL;
    shard_trainer *t = NULL;
    shard_status s = shard_mesh_create(comm, mesh_text, &mesh);
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &t);
    for (long step = 1; s == SHARD_OK && step <= a->steps; step++) {
        shard_step_result r;
        s = shard_trainer_step(t, (uint64_t)step, &r);
        *last = r.loss;
    }
    if (s == SHARD_OK) { /* each stage's parameters by name into the whole layout, summed over the ranks */
        memset(whole->data, 0, whole->total * sizeof(float));
        const shard_params *mine = shard_trainer_model(t)->params;
        for (size_t i = 0; i < mine->count; i++) {
            const shard_param_info *w = shard_params_find(whole, mine->info[i].name);
            if (w) memcpy(whole->data + w->offset, mine->data + mine->info[i].offset, w->numel * sizeof(float));
        }
        s = shard_comm_all_reduce(comm, whole->data, whole->data, whole->total, SHARD_F32, SHARD_OP_SUM);
    }
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    return s;
}

/* Correct answers of the model with these parameters on the test set. */
static shard_status score(const shard_params *values, size_t *correct) {
    shard_idx x = {0}, y = {0}; /* freed on every path, read or not */
    shard_cnn_config c;
    shard_cnn *m = NULL;
    enum { EVAL = 500 };
    float *images = malloc(EVAL * 784 * sizeof *images);
    shard_status s = images ? shard_idx_read(DATA "t10k-images-idx3-ubyte.gz", &x) : SHARD_ERR_NO_MEMORY;
    if (s == SHARD_OK) s = shard_idx_read(DATA "t10k-labels-idx1-ubyte.gz", &y);
    if (s == SHARD_OK && (x.ndim != 3 || y.ndim != 1 || x.dims[0] != y.count || x.dims[1] != 28 || x.dims[2] != 28))
        s = shard_error(SHARD_ERR_IO, DATA "t10k-images-idx3-ubyte.gz: expected N x 28 x 28 images with N labels");
    if (s == SHARD_OK) s = shard_cnn_config_parse(CONFIG, "cnn_pipeline", &c);
    if (s == SHARD_OK) s = shard_cnn_create(&c, EVAL, &m);
    if (s == SHARD_OK) memcpy(shard_cnn_params(m)->data, values->data, values->total * sizeof(float));
    *correct = 0;
    for (size_t at = 0; s == SHARD_OK && at < y.count; at += EVAL) {
        size_t b = y.count - at < EVAL ? y.count - at : EVAL;
        for (size_t i = 0; i < b * 784; i++) images[i] = (float)x.data[at * 784 + i] / 255.0f;
        s = shard_cnn_forward(m, images, NULL, b, NULL);
        const float *logits = shard_cnn_logits(m);
        for (size_t i = 0; s == SHARD_OK && i < b; i++) {
            size_t best = 0;
            for (size_t k = 1; k < c.classes; k++)
                if (logits[i * c.classes + k] > logits[i * c.classes + best]) best = k;
            *correct += best == y.data[at + i];
        }
    }
    shard_cnn_destroy(m);
    shard_idx_free(&x), shard_idx_free(&y);
    free(images);
    return s;
}

static shard_status rank_main(shard_comm *world, void *arg) {
    run_args *a = arg;
    int rank = shard_comm_rank(world);
    if (shard_comm_size(world) != 2)
        return shard_error(SHARD_ERR_INVALID_ARG, "cnn_pipeline: 2 ranks (one per shard), got %d",
                           shard_comm_size(world));
    if (rank == 0) SHARD_CHECK(shard_blas_set_threads(1));
    shard_cnn_config c;
    shard_cnn *layout = NULL;
    SHARD_CHECK(shard_cnn_config_parse(CONFIG, "cnn_pipeline", &c));
    SHARD_CHECK(shard_cnn_create(&c, 1, &layout));
    shard_params *whole = NULL;
    shard_status s = shard_params_like(shard_cnn_params(layout), SHARD_MEM_OTHER, &whole);
    double loss = 0; /* every rank's; rank 0 reports (thread ranks share `a`) */
    if (s == SHARD_OK) s = train(world, a, "pipe=2", whole, &loss);
    if (s == SHARD_OK && rank == 0) a->loss[0] = loss, s = score(whole, &a->correct[0]);
    shard_comm *self = NULL;
    if (s == SHARD_OK) s = shard_comm_split(world, rank == 0 ? 0 : -1, 0, &self);
    if (s == SHARD_OK && self) { /* one device: the same global batches, accumulated over the same micro-batches */
        s = train(self, a, "data=1", whole, &a->loss[1]);
        if (s == SHARD_OK) s = score(whole, &a->correct[1]);
    }
    shard_comm_destroy(self);
    shard_params_destroy(whole);
    shard_cnn_destroy(layout);
    return s;
}

int main(int argc, char **argv) {
    run_args a = {.steps = argc > 1 ? atol(argv[1]) : 300, .batch = argc > 2 ? atol(argv[2]) : 64};
    if (a.steps <= 0 || a.batch < 4 || a.batch > 4096) {
        fprintf(stderr, "usage: cnn_pipeline [STEPS>0] [BATCH 4..4096]\n");
        return 2;
    }
    /* the trainer reads the model's config from a file */
    snprintf(a.config, sizeof a.config, "/tmp/shard-cnn-pipeline-XXXXXX");
    int fd = mkstemp(a.config);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f || fputs(CONFIG, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "shard: cannot write a config in /tmp\n");
        return 1;
    }
    int under_mpi = shard_launch_detect_mpi(NULL, 0, NULL, NULL);
    shard_status s = shard_launch(under_mpi ? 0 : 2, rank_main, &a);
    remove(a.config);
    if (s < 0) {
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    if (!a.correct[1]) return 0; /* an MPI rank other than 0 */
    double acc[2] = {100.0 * (double)a.correct[0] / 10000.0, 100.0 * (double)a.correct[1] / 10000.0};
    printf("fashion-mnist, %ld steps of %ld images: 2-stage pipeline (features | classifier, 1F1B, 4 micro-batches) "
           "loss %.4f, test accuracy %.2f%%; one device loss %.4f, test accuracy %.2f%%\n",
           a.steps, a.batch, a.loss[0], acc[0], a.loss[1], acc[1]);
    if (fabs(acc[0] - acc[1]) > 0.05) {
        fprintf(stderr, "shard: the pipelined model's accuracy differs from the single-device one's\n");
        return 1;
    }
    return 0;
}
