/* mlp_model.c — the 2-layer MLP, y = ReLU(x W0) W1, behind the generic model
 * table (model.h) so strategies can train it: parameters `layer_0/weights`
 * [model_dim, hidden_dim] (unit 0) and `layer_1/weights` [hidden_dim,
 * model_dim] (unit 1).  The one MLP of the library: the engine API's MLP
 * (engine.h, nn/mlp_engine.c) runs this model's rows through shard__mlp_rows_*.
 *
 * Split over a tensor axis it is Megatron's MLP through tp.h's blocks: W0
 * column-parallel (P(None, 'tensor')), W1 row-parallel (P('tensor', None)),
 * each rank holding its hidden units (the even rule), one all_reduce of the
 * output in forward; the output, the loss and dL/dy are replicated.
 *
 * Config: {"model_type": "mlp", "model_dim": 64, "hidden_dim": 256}.
 * Its kind's batch source generates the rows, a regression onto a fixed
 * teacher: row r of step s's global batch is x ~ N(0, 1) keyed by (seed, s,
 * r), target tanh(x A) with A drawn once (seed 7, std 1/sqrt(model_dim))
 * (batch.h's teacher rows).  A row's loss is the mean squared error over its
 * model_dim outputs. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model_impl.h"
#include "nn/placement.h"
#include "shard/layers.h"
#include "shard/tp.h"

typedef struct mlp_model {
    shard_model model;
    size_t d, h, max_rows; /* h: this rank's hidden units */
    shard_comm *tp;        /* the tensor axis (NULL: one device) */
    int tp_rank;
    shard_mesh_layout layout;
    shard__placement place[2]; /* W0 split by columns, W1 by rows */
    shard_params *params;
    float *x, *target, *hidden, *relu, *y, *dy, *dhidden;
} mlp_model;

static mlp_model *impl(const shard_model *m) { return (mlp_model *)m->impl; }

shard_status shard__mlp_config_parse(const char *text, const char *where, size_t *d, size_t *h) {
    static const char *const keys[] = {"model_type", "model_dim", "hidden_dim", "comment"};
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (!root) return shard_error(SHARD_ERR_INVALID_ARG, "%s: not valid JSON: %s (line %d)", where, err.text, err.line);
    shard_status s = json_is_object(root)
        ? SHARD_OK
        : shard_error(SHARD_ERR_INVALID_ARG, "%s: the config must be a JSON object", where);
    const char *key;
    json_t *v;
    *d = 0, *h = 0;
    json_object_foreach(root, key, v) {
        if (s < 0) break;
        size_t *field = strcmp(key, "model_dim") == 0 ? d : strcmp(key, "hidden_dim") == 0 ? h : NULL;
        if (field) {
            if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 20))
                s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' must be an integer in 1..1048576", where, key);
            else
                *field = (size_t)json_integer_value(v);
        } else if (strcmp(key, "model_type") != 0 && strcmp(key, "comment") != 0) {
            s = shard__unknown_key(where, key, keys, 4, "MLP keys: model_type, model_dim, hidden_dim");
        }
    }
    json_decref(root);
    if (s == SHARD_OK && (!*d || !*h))
        s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' is missing", where, *d ? "hidden_dim" : "model_dim");
    return s;
}

/* The rows are copied: the activations that follow x stay in one allocation. */
static shard_status set_batch(shard_model *m, const shard_batch *b) {
    mlp_model *p = impl(m);
    SHARD_CHECK(shard_model_check_batch(m, b, p->max_rows, SHARD_F32, p->d, SHARD_F32, p->d));
    if (b->rows)
        memcpy(p->x, b->inputs, b->rows * p->d * sizeof *p->x),
            memcpy(p->target, b->targets, b->rows * p->d * sizeof *p->target);
    return SHARD_OK;
}

static size_t items(const shard_model *m) { return m->rows; }

/* Rows x[n, d] -> y[n, d] (replicated over the tensor axis), keeping z = x W0 and h = ReLU(z) ([n, this
 * rank's hidden units]) for the backward. */
shard_status shard__mlp_rows_forward(shard_model *m, const float *x, float *z, float *h, float *y, size_t n) {
    mlp_model *p = impl(m);
    shard_tp_place tp = {.comm = p->tp, .split = 1};
    SHARD_CHECK(shard_model_acquire(m, 0, 0));
    SHARD_CHECK(shard_tp_column_forward(&tp, (float *)x, m->value[0], NULL, z, n, p->d, p->h)); /* x is not written */
    SHARD_CHECK(shard_model_release(m, 0, 0));
    shard_relu_forward(z, h, n * p->h);
    SHARD_CHECK(shard_model_acquire(m, 1, 0));
    SHARD_CHECK(shard_tp_row_forward(&tp, h, m->value[1], NULL, y, y, n, p->h, p->d));
    return shard_model_release(m, 1, 0);
}

/* The gradients of the rows forward's parameters from dL/dy[n, d] (replicated) added to grad[] (dh[n,
 * this rank's hidden units] is scratch). */
shard_status shard__mlp_rows_backward(shard_model *m, const float *x, const float *z, const float *h, const float *dy,
                                      float *dh, size_t n) {
    mlp_model *p = impl(m);
    shard_tp_place tp = {.comm = p->tp, .split = 1};
    SHARD_CHECK(shard_model_acquire(m, 1, 1));
    SHARD_CHECK(shard_tp_row_backward(&tp, h, m->value[1], dy, NULL, dh, m->grad[1], NULL, n, p->h, p->d));
    SHARD_CHECK(shard_model_release(m, 1, 1));
    SHARD_CHECK(shard_model_grads_ready(m, 1));
    shard_relu_backward(z, dh, dh, n * p->h);
    SHARD_CHECK(shard_model_acquire(m, 0, 1));
    SHARD_CHECK(shard_tp_column_backward(&tp, x, m->value[0], dh, NULL, NULL, m->grad[0], NULL, n, p->d, p->h));
    SHARD_CHECK(shard_model_release(m, 0, 1));
    return shard_model_grads_ready(m, 0);
}

static shard_status forward(shard_model *m, double denominator, double *loss) {
    mlp_model *p = impl(m);
    size_t n = m->rows, d = p->d;
    *loss = 0;
    if (!n) return SHARD_OK;
    SHARD_CHECK(shard__mlp_rows_forward(m, p->x, p->hidden, p->relu, p->y, n));
    double total = 0, k = denominator > 0 ? 2.0 / ((double)d * denominator) : 0;
    for (size_t i = 0; i < n * d; i++) {
        float e = p->y[i] - p->target[i];
        total += (double)e * e;
        p->dy[i] = (float)(k * e);
    }
    *loss = denominator > 0 ? total / (double)d / denominator : 0;
    return SHARD_OK;
}

static shard_status backward(shard_model *m) {
    mlp_model *p = impl(m);
    if (!m->rows) return SHARD_OK;
    return shard__mlp_rows_backward(m, p->x, p->hidden, p->relu, p->dy, p->dhidden, m->rows);
}

/* Each element drawn by its index in the whole tensor: every split initialises the same model. */
static void init(shard_model *m, uint64_t seed) {
    mlp_model *p = impl(m);
    float fan_in[2] = {(float)p->place[0].shape[0], (float)p->place[1].shape[0]};
    for (int k = 0; k < 2; k++)
        shard__placement_init_normal(&p->place[k], &p->layout, p->tp_rank, m->value[k], 1.0f / sqrtf(fan_in[k]), seed,
                                     p->params->info[k].name);
}

/* ---- the tensor table: pieces of the whole [d, H] and [H, d] ---- */

static void whole_shape(const shard_model *m, size_t i, size_t *shape) {
    const shard__placement *pl = &impl(m)->place[i];
    shard__placement_stored_shape(pl, pl->shape, shape);
}

static shard_status gather_piece(shard_model *m, size_t i, const float *piece, float *whole) {
    mlp_model *p = impl(m);
    return shard__placement_gather(p->tp, &p->place[i], &p->layout, piece, whole, p->params->info[i].name);
}

static void take_piece(const shard_model *m, size_t i, const float *whole, float *piece) {
    const mlp_model *p = impl(m);
    shard__placement_take(&p->place[i], &p->layout, p->tp_rank, whole, piece);
}

static void param_spec(const shard_model *m, size_t i, char *out, size_t bytes) {
    const mlp_model *p = impl(m);
    char spec[64];
    shard__placement_spec_text(&p->place[i], &p->layout, spec, sizeof spec);
    snprintf(out, bytes, "%s of [%zu, %zu]", spec, p->place[i].shape[0], p->place[i].shape[1]);
}

static const shard_model_tensor_ops mlp_tensor_ops = {.struct_size = sizeof(shard_model_tensor_ops),
                                                      .whole_shape = whole_shape,
                                                      .gather_piece = gather_piece,
                                                      .take_piece = take_piece,
                                                      .param_spec = param_spec};

static void describe(const shard_model *m, char *out, size_t bytes) {
    const mlp_model *p = impl(m);
    size_t H = p->place[0].shape[1];
    int parts = p->layout.sizes[0];
    if (parts > 1)
        snprintf(out, bytes,
                 "MLP ReLU(x W0) W1, %zu -> %zu -> %zu: %zu parameters (%zu hidden units on this of %d tensor ranks)",
                 p->d, H, p->d, 2 * p->d * H, p->h, parts);
    else
        snprintf(out, bytes, "MLP ReLU(x W0) W1, %zu -> %zu -> %zu: %zu parameters", p->d, H, p->d, 2 * p->d * H);
}

static void destroy(shard_model *m) {
    mlp_model *p = impl(m);
    shard__model_free_units(m);
    shard_params_destroy(p->params);
    shard_free(p->x);
    free(p);
}

static void batch_shape(const shard_model *m, shard_batch *shape) {
    const mlp_model *p = impl(m);
    shape->input_dtype = shape->target_dtype = SHARD_F32, shape->input_elems = shape->target_elems = p->d;
}

static const shard_model_ops mlp_ops = {.struct_size = sizeof(shard_model_ops),
                                        .kind = "mlp",
                                        .set_batch = set_batch,
                                        .batch_items = items,
                                        .forward = forward,
                                        .backward = backward,
                                        .init = init,
                                        .describe = describe,
                                        .destroy = destroy,
                                        .tensor = &mlp_tensor_ops,
                                        .batch_shape = batch_shape};

shard_status shard__mlp_model_create(const shard_model_create_options *o, shard_model **out) {
    const char *text = o->config_text, *where = o->config_path;
    size_t max_rows = o->max_rows;
    size_t d, h;
    SHARD_CHECK(shard__mlp_config_parse(text, where, &d, &h));
    int parts = shard_tp_size(o->tensor);
    if (parts > 1 && o->sequence_parallel)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: model_type 'mlp' has no token dimension to split: drop sequence "
                           "parallel (the MLP splits its hidden units over the tensor axis)",
                           where);
    if ((size_t)parts > h)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: %d tensor ranks for hidden_dim %zu: give at most %zu", where,
                           parts, h, h);
    mlp_model *p = calloc(1, sizeof *p);
    if (!p) return shard_error(SHARD_ERR_NO_MEMORY, "mlp: out of memory");
    p->d = d, p->max_rows = max_rows ? max_rows : 1, p->model.impl = p, p->model.ops = &mlp_ops;
    p->tp = parts > 1 ? o->tensor : NULL, p->tp_rank = shard_tp_rank(p->tp), p->layout = shard_tp_layout(parts);
    shard__placement_make(&p->place[0], 2, (size_t[]){d, h}, 2, NULL, 1);
    shard__placement_make(&p->place[1], 2, (size_t[]){h, d}, 2, NULL, 0);
    size_t h0;
    shard__placement_range(&p->place[0], &p->layout, p->tp_rank, &h0, &h);
    p->h = h;
    shard_param_info t[2] = {{.name = "layer_0/weights", .ndim = 2, .shape = {d, h}},
                             {.name = "layer_1/weights", .ndim = 2, .shape = {h, d}}};
    static const size_t unit_first[3] = {0, 1, 2};
    size_t R = p->max_rows;
    shard_status s = shard_params_create(t, 2, SHARD_MEM_PARAMS, &p->params);
    if (s == SHARD_OK) s = shard_model_setup_units(&p->model, p->params, unit_first, 2);
    if (s == SHARD_OK) {
        p->x = shard_alloc((R * d * 4 + R * h * 3) * sizeof(float), SHARD_MEM_ACTIVATIONS);
        if (!p->x) s = shard_error(SHARD_ERR_NO_MEMORY, "mlp: out of memory");
    }
    if (s < 0) {
        destroy(&p->model);
        return s;
    }
    p->target = p->x + R * d, p->y = p->target + R * d, p->dy = p->y + R * d;
    p->hidden = p->dy + R * d, p->relu = p->hidden + R * h, p->dhidden = p->relu + R * h;
    *out = &p->model;
    return SHARD_OK;
}

shard_status shard__mlp_batch_source(const shard_model_create_options *o, const shard_model *m,
                                     shard_batch_source **out) {
    *out = NULL;
    if (o->data_dir) /* a user who passes files expects them read: say they are not, rather than train on other data */
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--data %s: model_type 'mlp' (%s) trains on rows it generates from a "
                           "seeded teacher and reads no files; drop --data",
                           o->data_dir, o->config_path);
    shard_batch_teacher_options t = {.struct_size = sizeof t,
                                     .name = "mlp",
                                     .dim = impl(m)->d,
                                     .max_rows = o->max_rows ? o->max_rows : 1,
                                     .teacher_seed = 7};
    return shard_batch_source_teacher(&t, out);
}
