/* model.c — the generic half of model.h: units, where each parameter and its
 * gradient live, the hook calls, and the factory that reads a config's
 * model_type and builds the GPT, the CNN or the MLP behind the same table. */
#include "shard/model.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "models/model_impl.h"
#include "shard/gpt.h"

shard_status shard_model_setup_units(shard_model *m, shard_params *params, const size_t *unit_first, size_t units) {
    size_t n = params->count;
    m->params = params, m->units = units;
    m->unit_first = malloc((units + 1) * sizeof *m->unit_first);
    m->unit_offset = malloc((units + 1) * sizeof *m->unit_offset);
    m->unit_of = malloc((n ? n : 1) * sizeof *m->unit_of);
    m->value = calloc(n ? n : 1, sizeof *m->value), m->grad = calloc(n ? n : 1, sizeof *m->grad);
    if (!m->unit_first || !m->unit_offset || !m->unit_of || !m->value || !m->grad)
        return shard_error(SHARD_ERR_NO_MEMORY, "model: out of memory");
    for (size_t u = 0; u < units; u++) {
        if (unit_first[u] >= unit_first[u + 1] || unit_first[u + 1] > n)
            return shard_error(SHARD_ERR_INTERNAL, "model: unit %zu holds no parameters", u);
        m->unit_first[u] = unit_first[u];
        m->unit_offset[u] = params->info[unit_first[u]].offset;
        for (size_t i = unit_first[u]; i < unit_first[u + 1]; i++) m->unit_of[i] = u;
    }
    m->unit_first[units] = n, m->unit_offset[units] = params->total;
    if (unit_first[0] != 0 || unit_first[units] != n)
        return shard_error(SHARD_ERR_INTERNAL, "model: the units do not cover the parameters");
    for (size_t i = 0; i < n; i++) m->value[i] = params->data ? params->data + params->info[i].offset : NULL;
    return SHARD_OK;
}

void shard_model_bind_values(shard_model *m, size_t unit, float *base) {
    for (size_t i = m->unit_first[unit]; i < m->unit_first[unit + 1]; i++)
        m->value[i] = base ? base + (m->params->info[i].offset - m->unit_offset[unit]) : NULL;
}

void shard_model_bind_grads(shard_model *m, size_t unit, float *base) {
    for (size_t i = m->unit_first[unit]; i < m->unit_first[unit + 1]; i++)
        m->grad[i] = base ? base + (m->params->info[i].offset - m->unit_offset[unit]) : NULL;
}

void shard_model_bind_grad_slab(shard_model *m, float *slab) {
    for (size_t u = 0; u < m->units; u++) shard_model_bind_grads(m, u, slab ? slab + m->unit_offset[u] : NULL);
}

shard_status shard_model_acquire(shard_model *m, size_t unit, int backward) {
    return m->hooks.acquire ? m->hooks.acquire(m->hooks.ctx, m, unit, backward) : SHARD_OK;
}

shard_status shard_model_release(shard_model *m, size_t unit, int backward) {
    return m->hooks.release ? m->hooks.release(m->hooks.ctx, m, unit, backward) : SHARD_OK;
}

shard_status shard_model_grads_ready(shard_model *m, size_t unit) {
    return m->hooks.grads_ready ? m->hooks.grads_ready(m->hooks.ctx, m, unit) : SHARD_OK;
}

static const shard_model_tensor_ops *tensor_ops(const shard_model *m) { return m->ops ? m->ops->tensor : NULL; }

void shard_model_whole_shape(const shard_model *m, size_t i, size_t *shape) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->whole_shape) t->whole_shape(m, i, shape);
    else memcpy(shape, m->params->info[i].shape, sizeof m->params->info[i].shape);
}

shard_status shard_model_gather_piece(shard_model *m, size_t i, const float *piece, float *whole) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->gather_piece) return t->gather_piece(m, i, piece, whole);
    memcpy(whole, piece, m->params->info[i].numel * sizeof *whole);
    return SHARD_OK;
}

void shard_model_take_piece(const shard_model *m, size_t i, const float *whole, float *piece) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->take_piece) t->take_piece(m, i, whole, piece);
    else memcpy(piece, whole, m->params->info[i].numel * sizeof *piece);
}

void shard_model_param_spec(const shard_model *m, size_t i, char *out, size_t bytes) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->param_spec) t->param_spec(m, i, out, bytes);
    else snprintf(out, bytes, "P()");
}

uint64_t shard_model_dropout_seed(const shard_model *m, uint64_t site) {
    uint64_t z = m->seed * 0x9e3779b97f4a7c15ULL ^ (m->step + 1) * 0xbf58476d1ce4e5b9ULL ^ (site + 1) * 0x94d049bb133111ebULL;
    z = (z ^ (z >> 31)) * 0xd6e8feb86659fd93ULL;
    return z ^ (z >> 32);
}

void shard__model_free_units(shard_model *m) {
    free(m->unit_first), free(m->unit_offset), free(m->unit_of), free(m->value), free(m->grad);
}

void shard_model_destroy(shard_model *m) {
    if (m && m->ops) m->ops->destroy(m);
}

/* The whole config file as text (NULL with the error set). */
char *shard__read_config(const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        shard_error(SHARD_ERR_IO, "%s: cannot read the config: %s", path,
                    !f ? strerror(errno) : "not a regular file; give a JSON config file");
        if (f) fclose(f);
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (int ch; (ch = fgetc(f)) != EOF;) {
        if (len + 1 >= cap) {
            char *more = realloc(text, cap ? 2 * cap : 4096);
            if (!more) {
                free(text), fclose(f);
                shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
                return NULL;
            }
            text = more, cap = cap ? 2 * cap : 4096;
        }
        text[len++] = (char)ch;
    }
    fclose(f);
    if (!text) {
        shard_error(SHARD_ERR_INVALID_ARG, "%s: the config is empty", path);
        return NULL;
    }
    text[len] = '\0';
    if (strlen(text) != len) { /* JSON text has no NUL: what follows one would be read past unseen */
        shard_error(SHARD_ERR_INVALID_ARG, "%s: a NUL byte at offset %zu; a config is JSON text", path, strlen(text));
        free(text);
        return NULL;
    }
    return text;
}

shard_status shard_model_create(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                shard_comm *tensor, int sequence_parallel, shard_model **out) {
    return shard_model_create_placed(config_path, data_dir, max_rows, seq, tensor, sequence_parallel, NULL, out);
}

shard_status shard_model_create_placed(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                       shard_comm *tensor, int sequence_parallel, const char *specs, shard_model **out) {
    return shard_model_create_stage(config_path, data_dir, max_rows, seq, tensor, sequence_parallel, specs, NULL, out);
}

/* The config's model_type ("gpt2" when absent); NULL text or root on failure. */
static const char *model_type(const char *config_path, char **text, json_t **root) {
    *root = NULL;
    if (!(*text = shard__read_config(config_path))) return NULL;
    *root = json_loads(*text, 0, NULL);
    const json_t *t = *root ? json_object_get(*root, "model_type") : NULL;
    return json_is_string(t) ? json_string_value(t) : "gpt2";
}

shard_status shard_model_stage_layers(const char *config_path, size_t *layers) {
    *layers = 0;
    char *text;
    json_t *root;
    const char *type = model_type(config_path, &text, &root);
    if (!type) return SHARD_ERR_IO;
    shard_status s = SHARD_OK;
    if (strcmp(type, "cnn") == 0) {
        *layers = 2; /* seed 000's two shards: features, classifier */
    } else if (strcmp(type, "mlp") != 0) {
        shard_gpt_config c;
        s = shard_gpt_config_parse(text, config_path, &c);
        if (s == SHARD_OK) *layers = c.n_layer;
    }
    json_decref(root);
    free(text);
    return s;
}

shard_status shard_model_create_stage(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                      shard_comm *tensor, int sequence_parallel, const char *specs,
                                      const shard_model_stage *stage, shard_model **out) {
    *out = NULL;
    char *text;
    json_t *root;
    const char *type = model_type(config_path, &text, &root);
    if (!type) return SHARD_ERR_IO;
    shard_status s;
    int pipelined = stage && stage->count > 1;
    int split = tensor && shard_comm_size(tensor) > 1;
    if (split && (strcmp(type, "cnn") == 0 || strcmp(type, "mlp") == 0))
        s = shard_error(SHARD_ERR_INVALID_ARG, "%s: model_type '%s' has no tensor-parallel layout here (the GPT has): give "
                        "tensor=1", config_path, type);
    else if (specs && *specs && strcmp(type, "gpt2") != 0 && strcmp(type, "gpt") != 0)
        s = shard_error(SHARD_ERR_INVALID_ARG, "--spec: model_type '%s' places every parameter whole; specs are for the "
                        "GPT's parameters", type);
    else if (pipelined && strcmp(type, "mlp") == 0)
        s = shard_error(SHARD_ERR_INVALID_ARG, "%s: model_type 'mlp' is not cut into pipeline stages (the GPT and the CNN "
                        "are): give pipe=1", config_path);
    else if (strcmp(type, "cnn") == 0) s = shard__cnn_model_create(text, config_path, data_dir, max_rows, stage, out);
    else if (strcmp(type, "mlp") == 0) s = shard__mlp_model_create(text, config_path, data_dir, max_rows, out);
    else s = shard__gpt_model_create(text, config_path, data_dir, max_rows, seq, tensor, sequence_parallel, specs, stage, out);
    json_decref(root);
    free(text);
    return s;
}
