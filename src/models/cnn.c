/* cnn.c — seed 000's image classifier (see cnn.h): conv -> ReLU -> max-pool
 * -> dense, forward and backward on the layers of layers.h. */
#include "shard/cnn.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard/layers.h"

struct shard_cnn {
    shard_cnn_config c;
    size_t max_b, B;
    shard_params *params;
    const float *images; /* the caller's, kept for backward */
    float *conv, *relu, *pool, *logits, *dlogits, *dpool, *drelu;
    uint32_t *argmax;
    int32_t *labels;
    int have_labels;
};

shard_status shard_cnn_config_parse(const char *text, const char *where, shard_cnn_config *out) {
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (!root) return shard_error(SHARD_ERR_INVALID_ARG, "%s: not valid JSON: %s (line %d)", where, err.text, err.line);
    shard_cnn_config c = {1, 28, 28, 8, 3, 2, 10};
    size_t *fields[] = {&c.in_channels, &c.height, &c.width, &c.channels, &c.kernel, &c.pool, &c.classes};
    const char *names[] = {"in_channels", "height", "width", "channels", "kernel", "pool", "classes"};
    shard_status s = json_is_object(root) ? SHARD_OK : shard_error(SHARD_ERR_INVALID_ARG, "%s: the config must be a JSON object", where);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (s < 0) break;
        int known = 0;
        for (int i = 0; i < 7; i++)
            if (strcmp(key, names[i]) == 0) {
                known = 1;
                if (!json_is_integer(v) || json_integer_value(v) <= 0)
                    s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' must be a positive integer", where, key);
                else *fields[i] = (size_t)json_integer_value(v);
            }
        if (!known && strcmp(key, "model_type") == 0) {
            known = 1;
            if (!json_is_string(v) || strcmp(json_string_value(v), "cnn") != 0)
                s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'model_type' must be \"cnn\"", where);
        }
        if (!known && strcmp(key, "comment") == 0) known = 1;
        if (!known)
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' is unknown (CNN keys: model_type, in_channels, height, "
                            "width, channels, kernel, pool, classes)", where, key);
    }
    json_decref(root);
    if (s < 0) return s;
    if (c.kernel % 2 == 0) return shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'kernel' must be odd (same padding)", where);
    if (c.height % c.pool || c.width % c.pool)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'pool' = %zu must divide height %zu and width %zu", where,
                           c.pool, c.height, c.width);
    *out = c;
    return SHARD_OK;
}

size_t shard_cnn_features(const shard_cnn_config *c) { return c->channels * (c->height / c->pool) * (c->width / c->pool); }

shard_status shard_cnn_create(const shard_cnn_config *c, size_t max_batch, shard_cnn **out) {
    *out = NULL;
    shard_cnn *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "cnn: out of memory");
    m->c = *c, m->max_b = max_batch;
    size_t F = shard_cnn_features(c), K = c->kernel;
    shard_param_info t[4] = {{.name = "features.conv.weight", .ndim = 4, .shape = {c->channels, c->in_channels, K, K}},
                             {.name = "features.conv.bias", .ndim = 1, .shape = {c->channels}},
                             {.name = "classifier.weight", .ndim = 2, .shape = {F, c->classes}},
                             {.name = "classifier.bias", .ndim = 1, .shape = {c->classes}}};
    shard_status s = shard_params_create(t, 4, SHARD_MEM_PARAMS, &m->params);
    size_t map = max_batch * c->channels * c->height * c->width, pooled = max_batch * F, cls = max_batch * c->classes;
    if (s == SHARD_OK) {
        m->conv = malloc(map * sizeof(float)), m->relu = malloc(map * sizeof(float)), m->drelu = malloc(map * sizeof(float));
        m->pool = malloc(pooled * sizeof(float)), m->dpool = malloc(pooled * sizeof(float));
        m->logits = malloc(cls * sizeof(float)), m->dlogits = malloc(cls * sizeof(float));
        m->argmax = malloc(pooled * sizeof(uint32_t)), m->labels = malloc(max_batch * sizeof(int32_t));
        if (!m->conv || !m->relu || !m->drelu || !m->pool || !m->dpool || !m->logits || !m->dlogits || !m->argmax ||
            !m->labels)
            s = shard_error(SHARD_ERR_NO_MEMORY, "cnn: out of memory for activations");
    }
    if (s < 0) {
        shard_cnn_destroy(m);
        return s;
    }
    *out = m;
    return SHARD_OK;
}

void shard_cnn_destroy(shard_cnn *m) {
    if (!m) return;
    shard_params_destroy(m->params);
    free(m->conv), free(m->relu), free(m->drelu), free(m->pool), free(m->dpool), free(m->logits), free(m->dlogits);
    free(m->argmax), free(m->labels);
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
        shard_init_uniform(m->params->data + info->offset, 0, info->numel, bound, seed, info->name);
    }
}

static float *param(const shard_cnn *m, const char *name) { return shard_params_data(m->params, name); }

shard_status shard_cnn_forward(shard_cnn *m, const float *images, const int32_t *labels, size_t B, float *loss) {
    const shard_cnn_config *c = &m->c;
    if (B == 0 || B > m->max_b)
        return shard_error(SHARD_ERR_INVALID_ARG, "cnn forward: batch %zu (this model was made for 1..%zu)", B, m->max_b);
    size_t HW = c->height * c->width, F = shard_cnn_features(c);
    m->B = B, m->images = images, m->have_labels = labels != NULL;
    SHARD_CHECK(shard_conv2d_forward(images, param(m, "features.conv.weight"), param(m, "features.conv.bias"), m->conv, B,
                                     c->in_channels, c->height, c->width, c->channels, c->kernel, c->kernel / 2));
    shard_relu_forward(m->conv, m->relu, B * c->channels * HW);
    shard_maxpool2d_forward(m->relu, m->pool, m->argmax, B, c->channels, c->height, c->width, c->pool);
    SHARD_CHECK(shard_linear_forward(m->pool, param(m, "classifier.weight"), param(m, "classifier.bias"), m->logits, B, F,
                                     c->classes)); /* the pooled maps, flattened, feed the dense layer */
    if (!labels) return SHARD_OK;
    memcpy(m->labels, labels, B * sizeof *labels);
    float l = 0;
    SHARD_CHECK(shard_cross_entropy(m->logits, labels, -100, B, c->classes, &l, NULL, m->dlogits));
    if (loss) *loss = l;
    return SHARD_OK;
}

shard_status shard_cnn_backward(shard_cnn *m, shard_params *grads) {
    const shard_cnn_config *c = &m->c;
    if (!m->have_labels) return shard_error(SHARD_ERR_INVALID_ARG, "cnn backward: the last forward had no labels");
    size_t B = m->B, F = shard_cnn_features(c), HW = c->height * c->width;
    SHARD_CHECK(shard_linear_backward(m->pool, param(m, "classifier.weight"), m->dlogits, m->dpool,
                                      shard_params_data(grads, "classifier.weight"),
                                      shard_params_data(grads, "classifier.bias"), B, F, c->classes));
    shard_maxpool2d_backward(m->dpool, m->argmax, m->drelu, B, c->channels, c->height, c->width, c->pool);
    shard_relu_backward(m->conv, m->drelu, m->drelu, B * c->channels * HW);
    return shard_conv2d_backward(m->images, param(m, "features.conv.weight"), m->drelu, NULL,
                                 shard_params_data(grads, "features.conv.weight"),
                                 shard_params_data(grads, "features.conv.bias"), B, c->in_channels, c->height, c->width,
                                 c->channels, c->kernel, c->kernel / 2);
}
