/* residual_mlp.c — a model defined outside the library, through the public
 * headers only, registered as a model kind and trained by the trainer:
 *
 *   h1 = ReLU(x W1), h2 = ReLU(h1 W2), y = (h2 + h1) W3
 *
 * a 3-layer MLP with a residual connection, one unit per layer, fitted by
 * mean squared error to a fixed teacher's outputs tanh(x A).  Its rows come
 * from its own batch source (batch.h), registered with the kind: row r of
 * step s's global batch is drawn from (seed, s, r) alone, so every split of
 * the batch over ranks sees the same rows.
 *
 * It checks, and exits 1 when one fails:
 *   - the backward against central differences of the forward;
 *   - one rank against two data ranks under ZeRO-3 (each rank builds its
 *     model, then hands it to the trainer) and two data ranks under ZeRO-1
 *     building the kind from a config file (as `shard train` would): the
 *     same losses within 1e-5 relative (fp32: only the order of the
 *     gradient sums differs);
 *   - the loss falls below half its first value.
 *
 *   build/examples/residual_mlp        thread ranks (1, then 2) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/shard.h"

#define KIND "residual_mlp"
#define STEPS 30
#define BATCH 16
#define CONFIG "{\"model_type\": \"" KIND "\", \"dim\": 8, \"hidden\": 24}"

/* ---------------------------------------------------------------- the model */

typedef struct residual_mlp {
    shard_model model; /* first: the table's shard_model is this struct */
    size_t d, h, max_rows;
    shard_params *params;
    /* activations for max_rows rows: what backward needs, and its gradients */
    float *x, *target, *a1, *h1, *a2, *h2, *sum, *y, *dy, *dsum, *dh1, *da2;
} residual_mlp;

static residual_mlp *impl(const shard_model *m) { return (residual_mlp *)m->impl; }

/* The rows copied in: x and target sit in one allocation with the activations. */
static shard_status set_batch(shard_model *m, const shard_batch *b) {
    residual_mlp *p = impl(m);
    SHARD_CHECK(shard_model_check_batch(m, b, p->max_rows, SHARD_F32, p->d, SHARD_F32, p->d));
    if (!b->rows) return SHARD_OK;
    memcpy(p->x, b->inputs, b->rows * p->d * sizeof *p->x);
    memcpy(p->target, b->targets, b->rows * p->d * sizeof *p->target);
    return SHARD_OK;
}

static size_t batch_items(const shard_model *m) { return m->rows; }

/* One linear layer of unit u between the hooks: the strategy may gather its values just for it. */
static shard_status layer_forward(shard_model *m, size_t u, const float *in, float *out, size_t n_in, size_t n_out) {
    SHARD_CHECK(shard_model_acquire(m, u, 0));
    SHARD_CHECK(shard_linear_forward(in, m->value[u], NULL, out, m->rows, n_in, n_out));
    return shard_model_release(m, u, 0);
}

/* The layer's backward, then its gradients are complete: the strategy may send them. */
static shard_status layer_backward(shard_model *m, size_t u, const float *in, const float *d_out, float *d_in,
                                   size_t n_in, size_t n_out) {
    SHARD_CHECK(shard_model_acquire(m, u, 1));
    SHARD_CHECK(shard_linear_backward(in, m->value[u], d_out, d_in, m->grad[u], NULL, m->rows, n_in, n_out));
    SHARD_CHECK(shard_model_release(m, u, 1));
    return shard_model_grads_ready(m, u);
}

/* The loss of the loaded rows over the global batch's `denominator` rows: each row's mean squared
 * error over its d outputs. */
static shard_status forward(shard_model *m, double denominator, double *loss) {
    residual_mlp *p = impl(m);
    size_t n = m->rows, d = p->d, h = p->h;
    *loss = 0;
    if (!n) return SHARD_OK;
    SHARD_CHECK(layer_forward(m, 0, p->x, p->a1, d, h));
    shard_relu_forward(p->a1, p->h1, n * h);
    SHARD_CHECK(layer_forward(m, 1, p->h1, p->a2, h, h));
    shard_relu_forward(p->a2, p->h2, n * h);
    shard_add(p->h2, p->h1, p->sum, n * h); /* the residual */
    SHARD_CHECK(layer_forward(m, 2, p->sum, p->y, h, d));
    double total = 0, k = denominator > 0 ? 2.0 / ((double)d * denominator) : 0;
    for (size_t i = 0; i < n * d; i++) {
        double e = (double)p->y[i] - p->target[i];
        total += e * e;
        p->dy[i] = (float)(k * e);
    }
    *loss = denominator > 0 ? total / (double)d / denominator : 0;
    return SHARD_OK;
}

/* Units in reverse: W3, then W2, then W1; the residual's gradient reaches h1 by both paths. */
static shard_status backward(shard_model *m) {
    residual_mlp *p = impl(m);
    size_t n = m->rows, d = p->d, h = p->h;
    if (!n) return SHARD_OK;
    SHARD_CHECK(layer_backward(m, 2, p->sum, p->dy, p->dsum, h, d));
    shard_relu_backward(p->a2, p->dsum, p->da2, n * h);
    SHARD_CHECK(layer_backward(m, 1, p->h1, p->da2, p->dh1, h, h));
    shard_add(p->dh1, p->dsum, p->dh1, n * h);
    shard_relu_backward(p->a1, p->dh1, p->dh1, n * h);
    return layer_backward(m, 0, p->x, p->dh1, NULL, d, h);
}

static void init(shard_model *m, uint64_t seed) {
    residual_mlp *p = impl(m);
    for (size_t i = 0; i < 3; i++) {
        const shard_param_info *info = &p->params->info[i];
        shard_init_normal(m->value[i], 0, info->numel, 1.0f / sqrtf((float)info->shape[0]), seed, info->name);
    }
}

static void describe(const shard_model *m, char *out, size_t bytes) {
    const residual_mlp *p = impl(m);
    snprintf(out, bytes, "residual MLP (ReLU(ReLU(x W1) W2) + ReLU(x W1)) W3, %zu -> %zu -> %zu -> %zu: %zu parameters",
             p->d, p->h, p->h, p->d, 2 * p->d * p->h + p->h * p->h);
}

static void destroy(shard_model *m) {
    residual_mlp *p = impl(m);
    shard_model_free_units(m);
    shard_params_destroy(p->params);
    shard_free(p->x);
    free(p);
}

static const shard_model_ops residual_mlp_ops = {.struct_size = sizeof(shard_model_ops),
                                                 .kind = KIND,
                                                 .set_batch = set_batch,
                                                 .batch_items = batch_items,
                                                 .forward = forward,
                                                 .backward = backward,
                                                 .init = init,
                                                 .describe = describe,
                                                 .destroy = destroy};

/* A positive integer key of the config text ("dim": 8); 0 when absent or not one. */
static size_t config_size(const char *text, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *at = text ? strstr(text, quoted) : NULL;
    if (!at || !(at = strchr(at + strlen(quoted), ':'))) return 0;
    char *end;
    long v = strtol(at + 1, &end, 10);
    return end != at + 1 && v > 0 && v <= 4096 ? (size_t)v : 0;
}

/* The kind's create function: sizes from the config, buffers for o->max_rows rows. */
static shard_status residual_mlp_create(const shard_model_create_options *o, shard_model **out) {
    size_t d = config_size(o->config_text, "dim"), h = config_size(o->config_text, "hidden");
    if (!d || !h)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: key '%s' is missing or not an integer in 1..4096 (" KIND " keys: dim, hidden)",
                           o->config_path, d ? "hidden" : "dim");
    residual_mlp *p = calloc(1, sizeof *p);
    if (!p) return shard_error(SHARD_ERR_NO_MEMORY, KIND ": out of memory");
    p->d = d, p->h = h, p->max_rows = o->max_rows ? o->max_rows : 1;
    p->model.impl = p, p->model.ops = &residual_mlp_ops;
    shard_param_info t[3] = {{.name = "layer_1/weights", .ndim = 2, .shape = {d, h}},
                             {.name = "layer_2/weights", .ndim = 2, .shape = {h, h}},
                             {.name = "layer_3/weights", .ndim = 2, .shape = {h, d}}};
    static const size_t unit_first[4] = {0, 1, 2, 3}; /* one unit per layer */
    size_t R = p->max_rows;
    shard_status s = shard_params_create(t, 3, SHARD_MEM_PARAMS, &p->params);
    if (s == SHARD_OK) s = shard_model_setup_units(&p->model, p->params, unit_first, 3);
    if (s == SHARD_OK) {
        p->x = shard_alloc(R * (4 * d + 9 * h) * sizeof(float), SHARD_MEM_ACTIVATIONS);
        if (!p->x) s = shard_error(SHARD_ERR_NO_MEMORY, KIND ": out of memory");
    }
    if (s < 0) {
        destroy(&p->model);
        return s;
    }
    float **rows_d[] = {&p->target, &p->y, &p->dy},
          **rows_h[] = {&p->a1, &p->h1, &p->a2, &p->h2, &p->sum, &p->dsum, &p->dh1, &p->da2};
    float *at = p->x + R * d;
    for (size_t i = 0; i < 3; i++) *rows_d[i] = at, at += R * d;
    for (size_t i = 0; i < 8; i++) *rows_h[i] = at, at += R * h;
    *out = &p->model;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- the rows */

/* Its batch source: x ~ N(0, 1) keyed by (seed, step, global row), target tanh(x A), A drawn once. */
typedef struct teacher_rows {
    shard_batch_source src;      /* first: the table's source is this struct */
    float *teacher, *x, *target; /* A [d, d]; the loaded rows */
    size_t d;
} teacher_rows;

static shard_status rows_load(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                              shard_batch *into) {
    teacher_rows *r = src->impl;
    *into = (shard_batch){.rows = rows,
                          .seed = seed,
                          .step = step,
                          .first_row = first_row,
                          .input_dtype = SHARD_F32,
                          .target_dtype = SHARD_F32,
                          .input_elems = r->d,
                          .target_elems = r->d,
                          .inputs = r->x,
                          .targets = r->target};
    char name[64];
    snprintf(name, sizeof name, KIND ".data.%llu", (unsigned long long)step);
    shard_init_normal(r->x, first_row * r->d, rows * r->d, 1.0f, seed, name); /* keyed by the global row */
    if (!rows) return SHARD_OK;
    SHARD_CHECK(shard_linear_forward(r->x, r->teacher, NULL, r->target, rows, r->d, r->d));
    for (size_t i = 0; i < rows * r->d; i++) r->target[i] = tanhf(r->target[i]);
    return SHARD_OK;
}

static void rows_destroy(shard_batch_source *src) {
    teacher_rows *r = src->impl;
    free(r->teacher), shard_free(r->x), free(r);
}

static const shard_batch_source_ops teacher_rows_ops = {
    .struct_size = sizeof(shard_batch_source_ops), .kind = KIND " rows", .load = rows_load, .destroy = rows_destroy};

/* The kind's batch source, for the model m it will feed: rows of its width, up to o->max_rows of them. */
static shard_status teacher_rows_create(const shard_model_create_options *o, const shard_model *m,
                                        shard_batch_source **out) {
    if (o->data_dir)
        return shard_error(SHARD_ERR_INVALID_ARG, "--data %s: " KIND " generates its rows; drop --data", o->data_dir);
    size_t d = impl(m)->d, R = o->max_rows ? o->max_rows : 1;
    teacher_rows *r = calloc(1, sizeof *r);
    if (!r) return shard_error(SHARD_ERR_NO_MEMORY, KIND ": out of memory");
    r->src = (shard_batch_source){.ops = &teacher_rows_ops, .max_rows = R, .impl = r}, r->d = d;
    r->teacher = malloc(d * d * sizeof(float));
    r->x = shard_alloc(2 * R * d * sizeof(float), SHARD_MEM_OTHER);
    if (!r->teacher || !r->x) {
        rows_destroy(&r->src);
        return shard_error(SHARD_ERR_NO_MEMORY, KIND ": out of memory");
    }
    r->target = r->x + R * d;
    shard_init_normal(r->teacher, 0, d * d, 1.0f / sqrtf((float)d), 11, KIND ".teacher");
    *out = &r->src;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- the checks */

/* The backward against central differences of the forward on one batch: a wrong gradient trains every
 * strategy alike, so the agreement of the strategies alone would not show it. */
static shard_status check_gradient(void) {
    shard_model *m = NULL;
    shard_model_create_options o = {.struct_size = sizeof o, .config_text = CONFIG, .max_rows = BATCH};
    SHARD_CHECK(shard_model_create_with(&o, &m));
    shard_params *grads = NULL;
    shard_batch_source *src = NULL;
    shard_batch b;
    shard_status s = shard_params_like(m->params, SHARD_MEM_GRADS, &grads);
    double loss = 0, worst = 0;
    if (s == SHARD_OK) s = shard_model_batch_source(&o, m, &src); /* the kind's, as the trainer makes it */
    if (s == SHARD_OK) {
        m->ops->init(m, 5);
        shard_model_bind_grad_slab(m, grads->data);
        s = shard_batch_source_load(src, 5, 1, 0, BATCH, &b);
    }
    if (s == SHARD_OK) s = m->ops->set_batch(m, &b);
    if (s == SHARD_OK) s = m->ops->forward(m, BATCH, &loss);
    if (s == SHARD_OK) s = m->ops->backward(m);
    for (size_t i = 0; s == SHARD_OK && i < m->params->count; i++)
        for (size_t e = 0; s == SHARD_OK && e < m->params->info[i].numel; e += 7) {
            /* the closest of three steps: a long one may move a ReLU input across 0, a short one meets
             * fp32 rounding; a wrong backward is off at all three */
            float *w = m->value[i] + e, keep = *w;
            double analytic = m->grad[i][e], numeric = 0, best = INFINITY;
            for (float step = 1e-2f; s == SHARD_OK && step > 5e-5f; step /= 10) {
                double up = 0, down = 0;
                *w = keep + step;
                s = m->ops->forward(m, BATCH, &up);
                *w = keep - step;
                if (s == SHARD_OK) s = m->ops->forward(m, BATCH, &down);
                *w = keep;
                double fd = (up - down) / (2.0 * step), off = fabs(fd - analytic) / (1e-3 + fabs(fd));
                if (off < best) best = off, numeric = fd;
            }
            worst = best > worst ? best : worst;
            if (s == SHARD_OK && best > 2e-2)
                s = shard_error(SHARD_ERR_INTERNAL, "%s[%zu]: backward gives %.6g, central differences %.6g",
                                m->params->info[i].name, e, analytic, numeric);
        }
    if (s == SHARD_OK) printf("gradient: the backward within %.2g relative of central differences\n", worst);
    shard_params_destroy(grads);
    shard_batch_source_destroy(src);
    shard_model_destroy(m);
    return s;
}

typedef struct run {
    int zero;
    const char *config_path; /* NULL: each rank builds its model and hands it to the trainer */
    double loss[STEPS];
} run;

static shard_status train(shard_comm *world, void *arg) {
    run *r = arg;
    char axes[32];
    snprintf(axes, sizeof axes, "data=%d", shard_comm_size(world));
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_mesh_create(world, axes, &mesh));
    shard_trainer_config c = {.config_path = r->config_path,
                              .batch = BATCH,
                              .seed = 1,
                              .zero = r->zero,
                              .bucket_mb = 0.001 /* a bucket per unit */,
                              .adamw = shard_adamw_defaults(),
                              .lr = {1e-2f, 1e-3f, 3, STEPS},
                              .clip = 1.0f};
    shard_model *mine = NULL; /* this rank's model: built here, as one builds a module and then wraps it */
    shard_trainer *t = NULL;
    shard_status s = SHARD_OK;
    if (r->config_path) {
        s = shard_trainer_create(mesh, &c, &t); /* the registry builds the kind the config names */
    } else {
        shard_model_create_options o = {.struct_size = sizeof o, .config_text = CONFIG, .max_rows = BATCH};
        s = shard_model_create_with(&o, &mine);
        shard_model_factory f = {.struct_size = sizeof f, .model = mine};
        if (s == SHARD_OK) s = shard_trainer_create_with_model(mesh, &c, &f, &t);
    }
    for (uint64_t step = 1; s == SHARD_OK && step <= STEPS; step++) {
        shard_step_result res;
        s = shard_trainer_step(t, step, &res);
        if (s == SHARD_OK && shard_comm_rank(world) == 0) r->loss[step - 1] = res.loss;
    }
    shard_trainer_destroy(t);
    shard_model_destroy(mine); /* the caller's: the trainer leaves it */
    shard_mesh_destroy(mesh);
    return s;
}

/* The config as a file, for the run that builds the model by its model_type. */
static shard_status write_config(char *path, size_t bytes) {
    const char *tmp = getenv("TMPDIR");
    snprintf(path, bytes, "%s/residual_mlp.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return shard_error(SHARD_ERR_IO, "%s: cannot create the config file", path);
    ssize_t n = write(fd, CONFIG, strlen(CONFIG));
    close(fd);
    return n == (ssize_t)strlen(CONFIG) ? SHARD_OK : shard_error(SHARD_ERR_IO, "%s: cannot write the config", path);
}

static int agree(const char *what, const run *ref, const run *got) {
    for (int i = 0; i < STEPS; i++) {
        double rel = fabs(got->loss[i] - ref->loss[i]) / fmax(fabs(ref->loss[i]), 1e-12);
        if (!(rel <= 1e-5)) {
            fprintf(stderr, "residual_mlp: %s step %d: loss %.9g, one rank's %.9g (%.2g relative; at most 1e-5)\n",
                    what, i + 1, got->loss[i], ref->loss[i], rel);
            return 0;
        }
    }
    printf("%s: the one rank's losses within 1e-5 relative at every step\n", what);
    return 1;
}

int main(void) {
    static run one = {.zero = 0}, zero3 = {.zero = 3}, by_config = {.zero = 1};
    char path[4096] = "";
    shard_model_kind kind = {.struct_size = sizeof kind,
                             .name = KIND,
                             .create = residual_mlp_create,
                             .batch_source = teacher_rows_create}; /* the model and where its rows come from */
    shard_status s = shard_model_register_kind(&kind);
    if (s == SHARD_OK) s = check_gradient();
    if (s == SHARD_OK) s = shard_launch(1, train, &one);
    if (s == SHARD_OK) s = shard_launch(2, train, &zero3);
    if (s == SHARD_OK) s = write_config(path, sizeof path);
    if (s == SHARD_OK) by_config.config_path = path, s = shard_launch(2, train, &by_config);
    if (path[0]) remove(path);
    if (s < 0) {
        fprintf(stderr, "residual_mlp: %s\n", shard_last_error());
        return 1;
    }
    printf("one rank: loss %.4f at step 1, %.4f at step %d\n", one.loss[0], one.loss[STEPS - 1], STEPS);
    int ok = agree("data=2, ZeRO-3, the caller's models", &one, &zero3) &&
        agree("data=2, ZeRO-1, model_type " KIND, &one, &by_config);
    if (ok && !(one.loss[STEPS - 1] < one.loss[0] / 2)) {
        fprintf(stderr, "residual_mlp: the loss went from %g to %g: not learning\n", one.loss[0], one.loss[STEPS - 1]);
        ok = 0;
    }
    return ok ? 0 : 1;
}
