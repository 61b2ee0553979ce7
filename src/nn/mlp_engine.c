/* mlp_engine.c — the engine API's MLP: ReLU(x W0) W1 with a tape of (x, z)
 * pairs for backward — on one device, or tensor parallel over a communicator
 * (Megatron's MLP through tp.h's blocks: W0 column-parallel, W1
 * row-parallel, one all_reduce of the output), the same code for both — and the engine helpers shared by every
 * engine (destroy, inference_loop).  See engine.h. */
#include <stdlib.h>
#include <string.h>

#include "shard/engine.h"
#include "shard/layers.h"
#include "shard/tp.h"

enum { TAPE_DEPTH = 64 };

typedef struct mlp_engine {
    shard_engine base;
    size_t model, hidden;                                  /* hidden: this rank's columns of W0 (rows of W1) */
    size_t hidden_whole, h0;                               /* all of them; where this rank's start */
    shard_comm *tp;                                        /* NULL: one device */
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

/* As the engine API asks: both weights, by name; every entry is checked before any is copied. */
static shard_status load_checkpoint(shard_engine *e, const shard_named *params, size_t count) {
    mlp_engine *m = (mlp_engine *)e;
    int seen[2] = {0, 0};
    for (size_t i = 0; i < count; i++) {
        const shard_param_info *info = params ? shard_params_find(e->params, params[i].name) : NULL;
        if (!info)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "load_checkpoint: no parameter '%s' (the MLP has layer_0/weights, layer_1/weights)",
                               params && params[i].name ? params[i].name : "(null)");
        const shard_tensor *src = params[i].tensor;
        int first = info == e->params->info; /* layer_0: [model, hidden], split by columns; layer_1 by rows */
        size_t want[2] = {first ? m->model : m->hidden_whole, first ? m->hidden_whole : m->model};
        if (!src || src->ndim != 2 || src->shape[0] != want[0] || src->shape[1] != want[1]) {
            char type[160] = "(null)";
            if (src) shard_tensor_type_string(src, type, sizeof type);
            return shard_error(SHARD_ERR_INVALID_ARG, "load_checkpoint: '%s' must be [%zu,%zu], got %s", info->name,
                               want[0], want[1], type);
        }
        if (seen[!first]++) return shard_error(SHARD_ERR_INVALID_ARG, "load_checkpoint: '%s' given twice", info->name);
    }
    for (int k = 0; k < 2; k++)
        if (!seen[k])
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "load_checkpoint: '%s' is missing (the MLP needs layer_0/weights "
                               "[%zu,%zu] and layer_1/weights [%zu,%zu])",
                               e->params->info[k].name, m->model, m->hidden_whole, m->hidden_whole, m->model);
    for (size_t i = 0; i < count; i++) {
        const shard_param_info *info = shard_params_find(e->params, params[i].name);
        const shard_tensor *src = params[i].tensor;
        int first = info == e->params->info;
        shard_tensor piece = *src; /* this rank's block of the whole (a view) */
        size_t d = first ? 1 : 0;
        piece.shape[d] = m->hidden,
        piece.data = (char *)src->data + m->h0 * src->strides[d] * shard_dtype_size(src->dtype);
        shard_tensor dst = shard_params_view(e->params, (size_t)(info - e->params->info));
        SHARD_CHECK(shard_tensor_cast(&dst, &piece));
    }
    return SHARD_OK;
}

static shard_status run(mlp_engine *m, const shard_tensor *x, shard_tensor *y, shard_tensor *z) {
    size_t B = x->shape[0];
    shard_tp_place tp = {.comm = m->tp, .split = 1};
    SHARD_CHECK(shard_tp_column_forward(&tp, x->data, shard_params_data(m->base.params, "layer_0/weights"), NULL,
                                        z->data, B, m->model, m->hidden));
    shard_tensor *h = NULL;
    size_t hs[2] = {B, m->hidden};
    SHARD_CHECK(shard_tensor_create(SHARD_F32, 2, hs, SHARD_MEM_ACTIVATIONS, &h));
    shard_relu_forward(z->data, h->data, B * m->hidden);
    shard_status s = shard_tp_row_forward(&tp, h->data, shard_params_data(m->base.params, "layer_1/weights"), NULL,
                                          y->data, y->data, B, m->hidden, m->model);
    shard_tensor_destroy(h);
    return s;
}

static shard_status forward_or_infer(shard_engine *e, const shard_tensor *x, shard_tensor *y, int keep) {
    mlp_engine *m = (mlp_engine *)e;
    SHARD_CHECK(check_batch(x, m->model, "input"));
    SHARD_CHECK(check_batch(y, m->model, "output"));
    if (y->shape[0] != x->shape[0])
        return shard_error(SHARD_ERR_INVALID_ARG, "mlp: %zu inputs but room for %zu outputs", x->shape[0], y->shape[0]);
    if (keep && m->depth == TAPE_DEPTH)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "mlp forward: %d forwards without a backward; call backward, or "
                           "inference_loop for outputs alone",
                           TAPE_DEPTH);
    size_t zs[2] = {x->shape[0], m->hidden};
    shard_tensor *z = NULL, *xc = NULL;
    SHARD_CHECK(shard_tensor_create(SHARD_F32, 2, zs, SHARD_MEM_ACTIVATIONS, &z));
    shard_status s = SHARD_OK; /* the input kept before the output is written: y may be x */
    if (keep) s = shard_tensor_create(SHARD_F32, 2, x->shape, SHARD_MEM_ACTIVATIONS, &xc);
    if (s == SHARD_OK && keep) s = shard_tensor_copy(xc, x);
    if (s == SHARD_OK) s = run(m, x, y, z);
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
    SHARD_CHECK(check_batch(dy, m->model, "output gradient"));
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
    }
    float *g0 = shard_params_data(grads, "layer_0/weights"), *g1 = shard_params_data(grads, "layer_1/weights");
    shard_tp_place tp = {.comm = m->tp, .split = 1};
    m->depth--;
    size_t hs[2] = {B, m->hidden};
    shard_tensor *h = NULL, *dh = NULL;
    shard_status s = shard_tensor_create(SHARD_F32, 2, hs, SHARD_MEM_ACTIVATIONS, &h);
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, hs, SHARD_MEM_ACTIVATIONS, &dh);
    if (s == SHARD_OK) {
        memset(g0, 0, m->model * m->hidden * sizeof *g0);
        memset(g1, 0, m->model * m->hidden * sizeof *g1);
        shard_relu_forward(z->data, h->data, B * m->hidden); /* h = ReLU(z), layer 1's input */
        s = shard_tp_row_backward(&tp, h->data, shard_params_data(e->params, "layer_1/weights"), dy->data, NULL,
                                  dh->data, g1, NULL, B, m->hidden, m->model);
    }
    if (s == SHARD_OK) {
        shard_relu_backward(z->data, dh->data, dh->data, B * m->hidden); /* dL/dz */
        s = shard_tp_column_backward(&tp, x->data, shard_params_data(e->params, "layer_0/weights"), dh->data, NULL,
                                     NULL, g0, NULL, B, m->model, m->hidden);
    }
    shard_tensor_destroy(dh);
    shard_tensor_destroy(h);
    shard_tensor_destroy(x);
    shard_tensor_destroy(z);
    return s;
}

static void destroy(shard_engine *e) {
    mlp_engine *m = (mlp_engine *)e;
    for (int i = 0; i < m->depth; i++) shard_tensor_destroy(m->tape_x[i]), shard_tensor_destroy(m->tape_z[i]);
}

static const shard_engine_ops mlp_ops = {"mlp (single device)", load_checkpoint, forward, backward, infer, destroy};
static const shard_engine_ops mlp_tp_ops = {
    "mlp (tensor parallel)", load_checkpoint, forward, backward, infer, destroy};

shard_status shard_mlp_engine_create(size_t model_dim, size_t hidden_dim, shard_engine **out) {
    return shard_mlp_engine_create_tp(NULL, model_dim, hidden_dim, out);
}

shard_status shard_mlp_engine_create_tp(shard_comm *tensor, size_t model_dim, size_t hidden_dim, shard_engine **out) {
    if (!out || !model_dim || !hidden_dim)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_mlp_engine_create: sizes must be > 0");
    *out = NULL;
    int parts = tensor ? shard_comm_size(tensor) : 1;
    if ((size_t)parts > hidden_dim)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_mlp_engine_create: %d tensor ranks for %zu hidden units",
                           parts, hidden_dim);
    mlp_engine *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "shard_mlp_engine_create: out of memory");
    m->tp = tensor, m->hidden_whole = hidden_dim;
    shard_split_even(hidden_dim, (size_t)parts, (size_t)shard_tp_rank(tensor), &m->h0, &hidden_dim);
    shard_param_info t[2] = {{.name = "layer_0/weights", .ndim = 2, .shape = {model_dim, hidden_dim}},
                             {.name = "layer_1/weights", .ndim = 2, .shape = {hidden_dim, model_dim}}};
    shard_status s = shard_params_create(t, 2, SHARD_MEM_PARAMS, &m->base.params);
    if (s < 0) {
        free(m);
        return s;
    }
    m->base.ops = parts > 1 ? &mlp_tp_ops : &mlp_ops, m->model = model_dim, m->hidden = hidden_dim;
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
