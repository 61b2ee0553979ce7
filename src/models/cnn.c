/* cnn.c — the two-shard image classifier (see cnn.h): conv -> ReLU -> max-pool
 * -> dense, forward and backward on the layers of layers.h.  As a pipeline it
 * has two layers, its two shards: the features (conv, ReLU, pool) on
 * stage 0 and the classifier (dense, loss) on stage 1; the pooled maps travel
 * between them. */
#include "shard/cnn.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/layers.h"
#include "models/model_impl.h"

struct shard_cnn {
    shard_model model; /* model.impl = this; units: features (if held), classifier (if held) */
    shard_cnn_config c;
    size_t max_b, B;
    shard_params *params;
    int features, classifier; /* the layers this model (stage) holds */
    size_t idx[4];            /* parameter indices of CONV_W, CONV_B, DENSE_W, DENSE_B (SIZE_MAX: not held) */
    float *own_acts;     /* the whole model's buffer of a forward's activations (NULL on a stage: the pipeline's) */
    const float *images; /* the caller's, kept for backward */
    float *conv, *relu, *pool, *logits, *dlogits, *dpool,
        *drelu; /* the bound buffer's (carve), and backward's scratch */
    uint32_t *argmax;
    int32_t *labels;
    int have_labels;
    float *batch_x; /* the model table's rows (set_batch's copy; the labels go to `labels`) */
};

static const char *const config_keys[] = {"in_channels", "height", "width", "channels", "kernel", "pool", "classes"};

/* a * b into *p, 0 when it wraps */
static int mul_ok(size_t a, size_t b, size_t *p) { return !__builtin_mul_overflow(a, b, p); }

/* The rules every config keeps, parsed or given to shard_cnn_create as a struct: each size within its cap
 * (height and width so that a plane's pixel index fits max-pool's 32 bits), an odd kernel (same padding), a
 * pool dividing the image, and every buffer the model sizes for `max_batch` rows within size_t. */
static shard_status check_config(const shard_cnn_config *c, const char *where, size_t max_batch) {
    const size_t value[] = {c->in_channels, c->height, c->width, c->channels, c->kernel, c->pool, c->classes};
    const size_t most[] = {1u << 20, 1u << 16, 1u << 16, 1u << 20, 1u << 10, 1u << 16, 1u << 24};
    for (int i = 0; i < 7; i++)
        if (value[i] == 0 || value[i] > most[i])
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' = %zu; valid: 1..%zu", where, config_keys[i],
                               value[i], most[i]);
    if (c->kernel % 2 == 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'kernel' = %zu must be odd (same padding)", where,
                           c->kernel);
    if (c->height % c->pool || c->width % c->pool)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'pool' = %zu must divide height %zu and width %zu", where,
                           c->pool, c->height, c->width);
    size_t plane = c->height * c->width, image, maps, taps, unfolded, weights, dense;
    if (!mul_ok(plane, c->in_channels, &image) || !mul_ok(image, max_batch, &image) ||
        !mul_ok(plane, c->channels, &maps) || !mul_ok(maps, max_batch, &maps) ||
        !mul_ok(c->in_channels, c->kernel * c->kernel, &taps) || !mul_ok(taps, plane, &unfolded) ||
        !mul_ok(taps, c->channels, &weights) || !mul_ok(shard_cnn_features(c), c->classes, &dense) ||
        !mul_ok(maps, sizeof(float), &maps) || !mul_ok(unfolded, sizeof(float), &unfolded) ||
        !mul_ok(image, sizeof(float), &image))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: %zu x %zu x %zu images to %zu channels (kernel %zu, %zu classes, "
                           "batch %zu) need buffers larger than memory can address",
                           where, c->in_channels, c->height, c->width, c->channels, c->kernel, c->classes, max_batch);
    return SHARD_OK;
}

shard_status shard_cnn_config_parse(const char *text, const char *where, shard_cnn_config *out) {
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (!root) return shard_error(SHARD_ERR_INVALID_ARG, "%s: not valid JSON: %s (line %d)", where, err.text, err.line);
    shard_cnn_config c = {1, 28, 28, 8, 3, 2, 10};
    size_t *fields[] = {&c.in_channels, &c.height, &c.width, &c.channels, &c.kernel, &c.pool, &c.classes};
    shard_status s = json_is_object(root)
        ? SHARD_OK
        : shard_error(SHARD_ERR_INVALID_ARG, "%s: the config must be a JSON object", where);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (s < 0) break;
        int known = 0;
        for (int i = 0; i < 7; i++)
            if (strcmp(key, config_keys[i]) == 0) {
                known = 1;
                if (!json_is_integer(v) || json_integer_value(v) <= 0)
                    s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' must be a positive integer", where, key);
                else
                    *fields[i] = (size_t)json_integer_value(v);
            }
        if (!known && strcmp(key, "model_type") == 0) {
            known = 1;
            if (!json_is_string(v) || strcmp(json_string_value(v), "cnn") != 0)
                s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'model_type' must be \"cnn\"", where);
        }
        if (!known && strcmp(key, "comment") == 0) known = 1;
        if (!known) {
            const char *keys[9] = {"model_type", "comment"};
            for (int i = 0; i < 7; i++) keys[2 + i] = config_keys[i];
            s = shard__unknown_key(where, key, keys, 9,
                                   "CNN keys: model_type, in_channels, height, width, channels, kernel, pool, classes");
        }
    }
    json_decref(root);
    if (s < 0) return s;
    SHARD_CHECK(check_config(&c, where, 1));
    *out = c;
    return SHARD_OK;
}

size_t shard_cnn_features(const shard_cnn_config *c) {
    return c->channels * (c->height / c->pool) * (c->width / c->pool);
}

/* What a forward of the layers this model holds keeps for its backward, carved from base (NULL: only
 * counted): the pooled maps; the features' conv and ReLU outputs and max-pool's choices (32-bit, in
 * float-sized elements); the classifier's logits and the loss's gradient. */
static size_t carve(shard_cnn *m, float *base) {
    const shard_cnn_config *c = &m->c;
    size_t map = m->max_b * c->channels * c->height * c->width, pooled = m->max_b * shard_cnn_features(c);
    size_t cls = m->max_b * c->classes, at = 0;
#define TAKE(ptr, n_) ((ptr) = base ? base + at : NULL, at += (n_))
    TAKE(m->pool, pooled);
    if (m->features) {
        TAKE(m->conv, map), TAKE(m->relu, map);
        m->argmax = base ? (uint32_t *)(void *)(base + at) : NULL, at += pooled;
    }
    if (m->classifier) TAKE(m->logits, cls), TAKE(m->dlogits, cls);
#undef TAKE
    return at;
}

/* The whole model (stage NULL) or one pipeline stage of its two layers. */
static shard_status cnn_create(const shard_cnn_config *c, size_t max_batch, const shard_model_stage *stage,
                               shard_cnn **out) {
    *out = NULL;
    SHARD_CHECK(check_config(c, "cnn", max_batch));
    if (stage && (stage->chunks != 1 || stage->first[0] >= stage->last[0] || stage->last[0] > 2))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "cnn: a pipeline stage holds one run of its 2 layers (features, classifier)");
    shard_cnn *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "cnn: out of memory");
    m->c = *c, m->max_b = max_batch;
    m->features = !stage || stage->first[0] == 0, m->classifier = !stage || stage->last[0] == 2;
    size_t F = shard_cnn_features(c), K = c->kernel;
    shard_param_info all[4] = {
        {.name = "features.conv.weight", .ndim = 4, .shape = {c->channels, c->in_channels, K, K}},
        {.name = "features.conv.bias", .ndim = 1, .shape = {c->channels}},
        {.name = "classifier.weight", .ndim = 2, .shape = {F, c->classes}},
        {.name = "classifier.bias", .ndim = 1, .shape = {c->classes}}};
    shard_param_info t[4];
    size_t n = 0, units = 0, unit_first[3];
    for (size_t i = 0; i < 4; i++) {
        int held = i < 2 ? m->features : m->classifier;
        if (held && (i == 0 || i == 2)) unit_first[units++] = n;
        m->idx[i] = held ? n : SIZE_MAX;
        if (held) t[n++] = all[i];
    }
    unit_first[units] = n;
    shard_status s = shard_params_create(t, n, SHARD_MEM_PARAMS, &m->params);
    m->model.impl = m;
    if (s == SHARD_OK) s = shard_model_setup_units(&m->model, m->params, unit_first, units);
    size_t map = max_batch * c->channels * c->height * c->width, pooled = max_batch * F;
    if (s == SHARD_OK && !stage && !(m->own_acts = shard_alloc(carve(m, NULL) * sizeof(float), SHARD_MEM_ACTIVATIONS)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "cnn: out of memory for activations");
    if (s == SHARD_OK) {
        m->dpool = shard_alloc(pooled * sizeof(float), SHARD_MEM_ACTIVATIONS),
        m->labels = malloc(max_batch * sizeof(int32_t));
        if (m->features) m->drelu = shard_alloc(map * sizeof(float), SHARD_MEM_ACTIVATIONS);
        if (!m->dpool || !m->labels || (m->features && !m->drelu))
            s = shard_error(SHARD_ERR_NO_MEMORY, "cnn: out of memory for activations");
    }
    if (s < 0) {
        shard_cnn_destroy(m);
        return s;
    }
    if (m->own_acts) carve(m, m->own_acts);
    *out = m;
    return SHARD_OK;
}

shard_status shard_cnn_create(const shard_cnn_config *c, size_t max_batch, shard_cnn **out) {
    return cnn_create(c, max_batch, NULL, out);
}

void shard_cnn_destroy(shard_cnn *m) {
    if (!m) return;
    shard__model_free_units(&m->model);
    shard_params_destroy(m->params);
    free(m->batch_x);
    shard_free(m->own_acts), shard_free(m->drelu), shard_free(m->dpool), free(m->labels);
    free(m);
}

shard_params *shard_cnn_params(shard_cnn *m) { return m->params; }
const float *shard_cnn_logits(const shard_cnn *m) { return m->logits; }

void shard_cnn_init(shard_cnn *m, uint64_t seed) {
    const shard_cnn_config *c = &m->c;
    float conv_bound = 1.0f / sqrtf((float)(c->in_channels * c->kernel * c->kernel));
    float dense_bound = 1.0f / sqrtf((float)shard_cnn_features(c));
    for (size_t i = 0; i < m->params->count; i++) {
        const shard_param_info *info = &m->params->info[i];
        float bound = strncmp(info->name, "features", 8) == 0 ? conv_bound : dense_bound;
        shard_init_uniform(m->model.value[i], 0, info->numel, bound, seed, info->name);
    }
}

enum { CONV_W, CONV_B, DENSE_W, DENSE_B };
static float *P(const shard_cnn *m, size_t i) { return m->model.value[m->idx[i]]; }
static float *G(const shard_cnn *m, size_t i) { return m->model.grad[m->idx[i]]; }
static size_t classifier_unit(const shard_cnn *m) { return m->features ? 1 : 0; }

/* in: the pooled maps from the previous stage (the classifier alone); out: this stage's (the features
 * alone); both NULL for the whole model. */
static shard_status cnn_forward(shard_cnn *m, const float *images, const int32_t *labels, size_t B, double denominator,
                                double *loss, const float *in, float *out) {
    const shard_cnn_config *c = &m->c;
    if (B == 0 || B > m->max_b)
        return shard_error(SHARD_ERR_INVALID_ARG, "cnn forward: batch %zu (this model was made for 1..%zu)", B,
                           m->max_b);
    size_t HW = c->height * c->width, F = shard_cnn_features(c);
    m->B = B, m->images = images, m->have_labels = labels != NULL;
    if (!m->features) {
        if (in) memcpy(m->pool, in, B * F * sizeof *m->pool);
    } else {
        SHARD_CHECK(shard_model_acquire(&m->model, 0, 0));
        SHARD_CHECK(shard_conv2d_forward(images, P(m, CONV_W), P(m, CONV_B), m->conv, B, c->in_channels, c->height,
                                         c->width, c->channels, c->kernel, c->kernel / 2));
        SHARD_CHECK(shard_model_release(&m->model, 0, 0));
        shard_relu_forward(m->conv, m->relu, B * c->channels * HW);
        shard_maxpool2d_forward(m->relu, m->pool, m->argmax, B, c->channels, c->height, c->width, c->pool);
    }
    if (!m->classifier) { /* the first shard (features) ends here: the next stage classifies */
        if (out) memcpy(out, m->pool, B * F * sizeof *out);
        return SHARD_OK;
    }
    SHARD_CHECK(shard_model_acquire(&m->model, classifier_unit(m), 0));
    SHARD_CHECK(shard_linear_forward(m->pool, P(m, DENSE_W), P(m, DENSE_B), m->logits, B, F,
                                     c->classes)); /* the pooled maps, flattened, feed the dense layer */
    SHARD_CHECK(shard_model_release(&m->model, classifier_unit(m), 0));
    if (!labels) return SHARD_OK;
    if (labels != m->labels) memcpy(m->labels, labels, B * sizeof *labels);
    return shard_cross_entropy_sum(m->logits, labels, -100, B, c->classes, denominator, loss, NULL, m->dlogits);
}

shard_status shard_cnn_forward(shard_cnn *m, const float *images, const int32_t *labels, size_t B, float *loss) {
    size_t used = 0;
    for (size_t n = 0; labels && n < B; n++) used += labels[n] != -100;
    double l = 0;
    SHARD_CHECK(cnn_forward(m, images, labels, B, (double)used, &l, NULL, NULL));
    if (loss && labels) *loss = (float)l;
    return SHARD_OK;
}

static shard_status cnn_backward(shard_cnn *m, const float *d_out, float *d_in) {
    const shard_cnn_config *c = &m->c;
    size_t B = m->B, F = shard_cnn_features(c), HW = c->height * c->width;
    if (!m->classifier) {
        if (d_out) memcpy(m->dpool, d_out, B * F * sizeof *m->dpool);
    } else {
        SHARD_CHECK(shard_model_acquire(&m->model, classifier_unit(m), 1));
        SHARD_CHECK(shard_linear_backward(m->pool, P(m, DENSE_W), m->dlogits, m->dpool, G(m, DENSE_W), G(m, DENSE_B), B,
                                          F, c->classes));
        SHARD_CHECK(shard_model_release(&m->model, classifier_unit(m), 1));
        SHARD_CHECK(shard_model_grads_ready(&m->model, classifier_unit(m)));
    }
    if (!m->features) { /* the previous stage goes on with the gradient of the pooled maps */
        if (d_in) memcpy(d_in, m->dpool, B * F * sizeof *d_in);
        return SHARD_OK;
    }
    shard_maxpool2d_backward(m->dpool, m->argmax, m->drelu, B, c->channels, c->height, c->width, c->pool);
    shard_relu_backward(m->conv, m->drelu, m->drelu, B * c->channels * HW);
    SHARD_CHECK(shard_model_acquire(&m->model, 0, 1));
    SHARD_CHECK(shard_conv2d_backward(m->images, P(m, CONV_W), m->drelu, NULL, G(m, CONV_W), G(m, CONV_B), B,
                                      c->in_channels, c->height, c->width, c->channels, c->kernel, c->kernel / 2));
    SHARD_CHECK(shard_model_release(&m->model, 0, 1));
    return shard_model_grads_ready(&m->model, 0);
}

shard_status shard_cnn_backward(shard_cnn *m, shard_params *grads) {
    if (!m->have_labels) return shard_error(SHARD_ERR_INVALID_ARG, "cnn backward: the last forward had no labels");
    if (grads) {
        if (grads->total != m->params->total)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "cnn backward: grads must have the parameters' layout (shard_params_like)");
        shard_model_bind_grad_slab(&m->model, grads->data);
    }
    return cnn_backward(m, NULL, NULL);
}

shard_model *shard_cnn_model(shard_cnn *m) { return &m->model; }

/* ---------------------------------------------------------------- the model table */

static shard_cnn *impl(const shard_model *mm) { return (shard_cnn *)mm->impl; }

/* Images and labels copied: a pipeline's backward reads a micro-batch's images after the next one was set
 * (the source's buffers hold only the last). */
static shard_status model_set_batch(shard_model *mm, const shard_batch *b) {
    shard_cnn *m = impl(mm);
    size_t pixels = m->c.in_channels * m->c.height * m->c.width;
    SHARD_CHECK(shard_model_check_batch(mm, b, m->max_b, SHARD_F32, pixels, SHARD_I32, 1));
    if (b->rows) memcpy(m->batch_x, b->inputs, b->rows * pixels * sizeof *m->batch_x);
    if (b->rows) memcpy(m->labels, b->targets, b->rows * sizeof *m->labels);
    return SHARD_OK;
}

static size_t model_items(const shard_model *mm) { return mm->rows; }

/* A pipeline stage's model runs through the pipeline table, over the pipeline's buffers. */
static shard_status whole_only(const shard_cnn *m) {
    if (m->own_acts) return SHARD_OK;
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "cnn: this model holds one pipeline stage: run it through its pipeline "
                       "table (forward_range, backward_range)");
}

static shard_status model_forward(shard_model *mm, double denominator, double *loss) {
    shard_cnn *m = impl(mm);
    *loss = 0;
    SHARD_CHECK(whole_only(m));
    return mm->rows ? cnn_forward(m, m->batch_x, m->labels, mm->rows, denominator, loss, NULL, NULL) : SHARD_OK;
}

static shard_status model_backward(shard_model *mm) {
    SHARD_CHECK(whole_only(impl(mm)));
    return mm->rows ? cnn_backward(impl(mm), NULL, NULL) : SHARD_OK;
}

/* ---- pipeline stages (model.h): the pooled maps travel between the two stages ---- */

static size_t pipe_blocks(const shard_model *mm) {
    (void)mm;
    return 2;
}

static void pipe_stage_blocks(const shard_model *mm, size_t chunk, size_t *first, size_t *last) {
    (void)chunk; /* one run of layers per stage */
    *first = impl(mm)->features ? 0 : 1, *last = impl(mm)->classifier ? 2 : 1;
}

static size_t pipe_io_floats(const shard_model *mm) { return mm->rows * shard_cnn_features(&impl(mm)->c); }

static size_t pipe_acts_floats(const shard_model *mm, size_t first, size_t last) {
    (void)first, (void)last; /* a stage runs all it holds */
    return carve(impl(mm), NULL);
}

/* A range is the layers this stage holds. */
static shard_status check_range(const shard_model *mm, size_t first, size_t last) {
    size_t a, b;
    pipe_stage_blocks(mm, 0, &a, &b);
    if (first != a || last != b)
        return shard_error(SHARD_ERR_INVALID_ARG, "cnn: layers %zu..%zu of a stage holding %zu..%zu", first, last, a,
                           b);
    return SHARD_OK;
}

static shard_status pipe_forward_range(shard_model *mm, float *acts, size_t first, size_t last, const float *in,
                                       float *out, double denominator, double *loss) {
    shard_cnn *m = impl(mm);
    *loss = 0;
    SHARD_CHECK(check_range(mm, first, last));
    carve(m, acts);
    return mm->rows ? cnn_forward(m, m->batch_x, m->labels, mm->rows, denominator, loss, in, out) : SHARD_OK;
}

static shard_status pipe_backward_range(shard_model *mm, float *acts, size_t first, size_t last, const float *d_out,
                                        float *d_in) {
    shard_cnn *m = impl(mm);
    SHARD_CHECK(check_range(mm, first, last));
    carve(m, acts);
    /* this micro-batch's rows and images (a pipeline may have run another micro-batch's forward since) */
    m->B = mm->rows, m->images = m->batch_x;
    return mm->rows ? cnn_backward(m, d_out, d_in) : SHARD_OK;
}

static void model_init(shard_model *mm, uint64_t seed) { shard_cnn_init(impl(mm), seed); }
static void model_destroy(shard_model *mm) { shard_cnn_destroy(impl(mm)); }

static void model_describe(const shard_model *mm, char *out, size_t bytes) {
    const shard_cnn_config *c = &impl(mm)->c;
    const shard_params *p = impl(mm)->params;
    size_t held = 0,
           whole =
               c->channels * (c->in_channels * c->kernel * c->kernel + 1) + (shard_cnn_features(c) + 1) * c->classes;
    for (size_t i = 0; i < p->count; i++) held += p->info[i].numel;
    char stage[64] = "";
    if (held != whole) snprintf(stage, sizeof stage, " (%zu on this stage)", held);
    snprintf(out, bytes,
             "CNN %zux%zux%zu images: conv %zux%zu -> %zu channels -> ReLU -> max-pool %zu -> dense %zu classes: "
             "%zu parameters%s",
             c->in_channels, c->height, c->width, c->kernel, c->kernel, c->channels, c->pool, c->classes, whole, stage);
}

static const shard_model_pipe_ops cnn_pipe_ops = {.struct_size = sizeof(shard_model_pipe_ops),
                                                  .blocks = pipe_blocks,
                                                  .stage_blocks = pipe_stage_blocks,
                                                  .io_floats = pipe_io_floats,
                                                  .acts_floats = pipe_acts_floats,
                                                  .forward_range = pipe_forward_range,
                                                  .backward_range = pipe_backward_range};

static void model_batch_shape(const shard_model *mm, shard_batch *shape) {
    const shard_cnn *m = impl(mm);
    shape->input_dtype = SHARD_F32, shape->input_elems = m->c.in_channels * m->c.height * m->c.width;
    shape->target_dtype = SHARD_I32, shape->target_elems = 1;
}

static const shard_model_ops cnn_model_ops = {.struct_size = sizeof(shard_model_ops),
                                              .kind = "cnn",
                                              .set_batch = model_set_batch,
                                              .batch_items = model_items,
                                              .forward = model_forward,
                                              .backward = model_backward,
                                              .init = model_init,
                                              .describe = model_describe,
                                              .destroy = model_destroy,
                                              .pipe = &cnn_pipe_ops,
                                              .batch_shape = model_batch_shape};

shard_status shard__cnn_model_create(const shard_model_create_options *o, shard_model **out) {
    const char *text = o->config_text, *where = o->config_path;
    size_t max_rows = o->max_rows;
    const shard_model_stage *stage = o->stage;
    shard_cnn_config c;
    SHARD_CHECK(shard_cnn_config_parse(text, where, &c));
    shard_cnn *m = NULL;
    SHARD_CHECK(cnn_create(&c, max_rows ? max_rows : 1, stage, &m));
    size_t pixels = c.in_channels * c.height * c.width;
    shard_status s = SHARD_OK;
    if (!(m->batch_x = malloc((max_rows ? max_rows : 1) * pixels * sizeof(float))))
        s = shard_error(SHARD_ERR_NO_MEMORY, "cnn: out of memory");
    if (s < 0) {
        shard_cnn_destroy(m);
        return s;
    }
    m->model.ops = &cnn_model_ops;
    *out = &m->model;
    return SHARD_OK;
}

/* Fashion-MNIST in the config's image shape and classes (data_dir NULL: Debian's copy). */
shard_status shard__cnn_batch_source(const shard_model_create_options *o, const shard_model *mm,
                                     shard_batch_source **out) {
    const shard_cnn_config *c = &impl(mm)->c;
    shard_batch_images_options io = {.struct_size = sizeof io,
                                     .data_dir = o->data_dir,
                                     .in_channels = c->in_channels,
                                     .height = c->height,
                                     .width = c->width,
                                     .classes = c->classes,
                                     .max_rows = o->max_rows ? o->max_rows : 1};
    return shard_batch_source_images(&io, out);
}
