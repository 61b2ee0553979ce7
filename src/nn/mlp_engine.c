/* mlp_engine.c — the engine API (engine.h) on the model stack: the MLP
 * engine is the MLP model (models/mlp_model.c) — the same parameters, the
 * same initialisation rule, the same rows code, one device or tensor parallel
 * over a communicator — plus what the engine API adds: whole tensors in by
 * name (each rank keeps its piece), a tape of (x, z) pairs so forwards and
 * backwards nest, gradients into the caller's slab, and inference without the
 * tape.  Also the helpers every engine shares (destroy, inference_loop). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model_impl.h"
#include "shard/engine.h"
#include "shard/layers.h"
#include "shard/model.h"
#include "shard/tp.h"

enum { TAPE_DEPTH = 64 };

typedef struct mlp_engine {
    shard_engine base;                                     /* base.params: the model's */
    shard_model *model;                                    /* kind "mlp", this rank's piece */
    size_t model_dim, hidden, hidden_whole;                /* hidden: this rank's units */
    shard_tensor *tape_x[TAPE_DEPTH], *tape_z[TAPE_DEPTH]; /* copies of each forward's input and pre-activation */
    int depth;
} mlp_engine;

static shard_status check_batch(const shard_tensor *t, size_t features, const char *what) {
    if (!t || t->dtype != SHARD_F32 || t->ndim != 2 || t->shape[1] != features || !shard_tensor_is_contiguous(t)) {
        char type[160] = "(null)";
        if (t) shard_tensor_type_string(t, type, sizeof type);
        return shard_error(SHARD_ERR_INVALID_ARG, "mlp %s: expected a contiguous f32[batch,%zu], got %s", what,
                           features, type);
    }
    return SHARD_OK;
}

/* As the engine API asks: both weights whole, by name; every entry is checked before any is copied. */
static shard_status load_checkpoint(shard_engine *e, const shard_named *params, size_t count) {
    mlp_engine *m = (mlp_engine *)e;
    int seen[2] = {0, 0};
    size_t want[2][2];
    for (size_t k = 0; k < 2; k++) shard_model_whole_shape(m->model, k, want[k]);
    for (size_t i = 0; i < count; i++) {
        const shard_param_info *info = params ? shard_params_find(e->params, params[i].name) : NULL;
        if (!info)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "load_checkpoint: no parameter '%s' (the MLP has layer_0/weights, layer_1/weights)",
                               params && params[i].name ? params[i].name : "(null)");
        const shard_tensor *src = params[i].tensor;
        size_t k = (size_t)(info - e->params->info);
        if (!src || src->ndim != 2 || src->shape[0] != want[k][0] || src->shape[1] != want[k][1]) {
            char type[160] = "(null)";
            if (src) shard_tensor_type_string(src, type, sizeof type);
            return shard_error(SHARD_ERR_INVALID_ARG, "load_checkpoint: '%s' must be [%zu,%zu], got %s", info->name,
                               want[k][0], want[k][1], type);
        }
        if (seen[k]++) return shard_error(SHARD_ERR_INVALID_ARG, "load_checkpoint: '%s' given twice", info->name);
    }
    for (int k = 0; k < 2; k++)
        if (!seen[k])
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "load_checkpoint: '%s' is missing (the MLP needs layer_0/weights "
                               "[%zu,%zu] and layer_1/weights [%zu,%zu])",
                               e->params->info[k].name, want[0][0], want[0][1], want[1][0], want[1][1]);
    for (size_t i = 0; i < count; i++) { /* any dtype or strides: a whole f32 copy, then this rank's piece */
        size_t k = (size_t)(shard_params_find(e->params, params[i].name) - e->params->info);
        shard_tensor *whole = NULL;
        SHARD_CHECK(shard_tensor_create(SHARD_F32, 2, want[k], SHARD_MEM_ACTIVATIONS, &whole));
        shard_status s = shard_tensor_cast(whole, params[i].tensor);
        if (s == SHARD_OK) shard_model_take_piece(m->model, k, whole->data, m->model->value[k]);
        shard_tensor_destroy(whole);
        SHARD_CHECK(s);
    }
    return SHARD_OK;
}

static shard_status forward_or_infer(shard_engine *e, const shard_tensor *x, shard_tensor *y, int keep) {
    mlp_engine *m = (mlp_engine *)e;
    SHARD_CHECK(check_batch(x, m->model_dim, "input"));
    SHARD_CHECK(check_batch(y, m->model_dim, "output"));
    if (y->shape[0] != x->shape[0])
        return shard_error(SHARD_ERR_INVALID_ARG, "mlp: %zu inputs but room for %zu outputs", x->shape[0], y->shape[0]);
    if (keep && m->depth == TAPE_DEPTH)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "mlp forward: %d forwards without a backward; call backward, or "
                           "inference_loop for outputs alone",
                           TAPE_DEPTH);
    size_t zs[2] = {x->shape[0], m->hidden};
    shard_tensor *z = NULL, *h = NULL, *xc = NULL;
    SHARD_CHECK(shard_tensor_create(SHARD_F32, 2, zs, SHARD_MEM_ACTIVATIONS, &z));
    shard_status s = shard_tensor_create(SHARD_F32, 2, zs, SHARD_MEM_ACTIVATIONS, &h);
    /* the input kept before the output is written: y may be x */
    if (s == SHARD_OK && keep) s = shard_tensor_create(SHARD_F32, 2, x->shape, SHARD_MEM_ACTIVATIONS, &xc);
    if (s == SHARD_OK && keep) s = shard_tensor_copy(xc, x);
    if (s == SHARD_OK) s = shard__mlp_rows_forward(m->model, x->data, z->data, h->data, y->data, x->shape[0]);
    shard_tensor_destroy(h);
    if (s == SHARD_OK && keep) {
        m->tape_x[m->depth] = xc, m->tape_z[m->depth] = z, m->depth++;
        return SHARD_OK;
    }
    shard_tensor_destroy(xc);
    shard_tensor_destroy(z);
    return s;
}

static shard_status forward(shard_engine *e, const shard_tensor *x, shard_tensor *y) {
    return forward_or_infer(e, x, y, 1);
}
static shard_status infer(shard_engine *e, const shard_tensor *x, shard_tensor *y) {
    return forward_or_infer(e, x, y, 0);
}

static shard_status backward(shard_engine *e, const shard_tensor *dy, shard_params *grads) {
    mlp_engine *m = (mlp_engine *)e;
    if (m->depth == 0) return shard_error(SHARD_ERR_INVALID_ARG, "mlp backward: no forward to go back through");
    SHARD_CHECK(check_batch(dy, m->model_dim, "output gradient"));
    shard_tensor *x = m->tape_x[m->depth - 1], *z = m->tape_z[m->depth - 1];
    size_t B = x->shape[0];
    if (dy->shape[0] != B)
        return shard_error(SHARD_ERR_INVALID_ARG, "mlp backward: gradient for %zu rows, the forward had %zu",
                           dy->shape[0], B);
    if (!grads || grads == e->params)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "mlp backward: give a gradient slab of the engine's layout "
                           "(shard_params_like of its params), not %s",
                           grads ? "its params" : "NULL");
    for (size_t k = 0; k < 2; k++) { /* the names, and this engine's shapes (a tensor-parallel rank's block) */
        const shard_param_info *want = &e->params->info[k], *have = shard_params_find(grads, want->name);
        if (!have || have->ndim != 2 || have->shape[0] != want->shape[0] || have->shape[1] != want->shape[1])
            return shard_error(SHARD_ERR_INVALID_ARG, "mlp backward: grads '%s' is %s; this engine's is [%zu,%zu]",
                               want->name, have ? "another shape" : "missing", want->shape[0], want->shape[1]);
        m->model->grad[k] = shard_params_data(grads, want->name); /* the model adds into them */
        memset(m->model->grad[k], 0, want->numel * sizeof(float));
    }
    m->depth--;
    size_t hs[2] = {B, m->hidden};
    shard_tensor *h = NULL, *dh = NULL;
    shard_status s = shard_tensor_create(SHARD_F32, 2, hs, SHARD_MEM_ACTIVATIONS, &h);
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, hs, SHARD_MEM_ACTIVATIONS, &dh);
    if (s == SHARD_OK) {
        shard_relu_forward(z->data, h->data, B * m->hidden); /* h = ReLU(z), layer 1's input */
        s = shard__mlp_rows_backward(m->model, x->data, z->data, h->data, dy->data, dh->data, B);
    }
    m->model->grad[0] = m->model->grad[1] = NULL;
    shard_tensor_destroy(dh);
    shard_tensor_destroy(h);
    shard_tensor_destroy(x);
    shard_tensor_destroy(z);
    return s;
}

static void destroy(shard_engine *e) {
    mlp_engine *m = (mlp_engine *)e;
    for (int i = 0; i < m->depth; i++) shard_tensor_destroy(m->tape_x[i]), shard_tensor_destroy(m->tape_z[i]);
    shard_model_destroy(m->model);
    e->params = NULL; /* the model's, freed with it */
}

static const shard_engine_ops mlp_ops = {.name = "mlp (single device)",
                                         .load_checkpoint = load_checkpoint,
                                         .forward = forward,
                                         .backward = backward,
                                         .infer = infer,
                                         .destroy = destroy};
static const shard_engine_ops mlp_tp_ops = {.name = "mlp (tensor parallel)",
                                            .load_checkpoint = load_checkpoint,
                                            .forward = forward,
                                            .backward = backward,
                                            .infer = infer,
                                            .destroy = destroy};

shard_status shard_mlp_engine_create(size_t model_dim, size_t hidden_dim, shard_engine **out) {
    return shard_mlp_engine_create_tp(NULL, model_dim, hidden_dim, out);
}

shard_status shard_mlp_engine_create_tp(shard_comm *tensor, size_t model_dim, size_t hidden_dim, shard_engine **out) {
    if (!out || !model_dim || !hidden_dim)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_mlp_engine_create: sizes must be > 0");
    *out = NULL;
    char config[160];
    snprintf(config, sizeof config, "{\"model_type\": \"mlp\", \"model_dim\": %zu, \"hidden_dim\": %zu}", model_dim,
             hidden_dim);
    shard_model_create_options o = {.struct_size = sizeof o,
                                    .config_text = config,
                                    .config_path = "shard_mlp_engine_create",
                                    .max_rows = 1, /* the engine brings its own rows */
                                    .tensor = tensor};
    mlp_engine *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "shard_mlp_engine_create: out of memory");
    shard_status s = shard_model_create_with(&o, &m->model);
    if (s < 0) {
        free(m);
        return s;
    }
    m->base.params = m->model->params;
    m->base.ops = shard_tp_size(tensor) > 1 ? &mlp_tp_ops : &mlp_ops;
    m->model_dim = model_dim, m->hidden_whole = hidden_dim, m->hidden = m->base.params->info[0].shape[1];
    *out = &m->base;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- shared by engines */

void shard_engine_destroy(shard_engine *e) {
    if (!e) return;
    if (e->ops && e->ops->destroy) e->ops->destroy(e);
    shard_params_destroy(e->params);
    free(e);
}

shard_status shard_engine_inference_loop(shard_engine *e, shard_stream_read next, void *in_ctx, shard_stream_write emit,
                                         void *out_ctx, size_t out_features) {
    if (!e || !next || !emit) return shard_error(SHARD_ERR_INVALID_ARG, "inference_loop: NULL engine or stream");
    for (;;) {
        shard_tensor *x = NULL, *y = NULL;
        int got = next(in_ctx, &x);
        if (got < 0) return shard_error(SHARD_ERR_IO, "inference_loop: the input stream failed (returned %d)", got);
        if (got == 0) return SHARD_OK;
        if (!x) return shard_error(SHARD_ERR_INVALID_ARG, "inference_loop: the input stream gave no tensor");
        size_t shape[2] = {x->shape[0], out_features};
        SHARD_CHECK(shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_ACTIVATIONS, &y));
        shard_status s = e->ops->infer(e, x, y);
        if (s == SHARD_OK) s = emit(out_ctx, y);
        shard_tensor_destroy(y);
        SHARD_CHECK(s);
    }
}
