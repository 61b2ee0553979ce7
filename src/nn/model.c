/* model.c — the generic half of model.h: units, where each parameter and its
 * gradient live, the hook calls, the registry of model kinds (the GPT, the CNN
 * and the MLP among them, and any a program adds), and the factory that reads
 * a config's model_type and builds that kind behind the same table, or the
 * batch source its rows come from. */
#include "shard/model.h"

#include <jansson.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_read.h"
#include "models/model_impl.h"
#include "shard/cnn.h"
#include "shard/files.h"
#include "shard/gpt.h"
#include "shard/text.h"

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

static const shard_model_tensor_ops *tensor_ops(const shard_model *m) { return m->ops ? m->ops->tensor : NULL; }

void shard_model_whole_shape(const shard_model *m, size_t i, size_t *shape) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->whole_shape)
        t->whole_shape(m, i, shape);
    else
        memcpy(shape, m->params->info[i].shape, sizeof m->params->info[i].shape);
}

shard_status shard_model_gather_piece(shard_model *m, size_t i, const float *piece, float *whole) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->gather_piece) return t->gather_piece(m, i, piece, whole);
    memcpy(whole, piece, m->params->info[i].numel * sizeof *whole);
    return SHARD_OK;
}

void shard_model_take_piece(const shard_model *m, size_t i, const float *whole, float *piece) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->take_piece)
        t->take_piece(m, i, whole, piece);
    else
        memcpy(piece, whole, m->params->info[i].numel * sizeof *piece);
}

void shard_model_param_spec(const shard_model *m, size_t i, char *out, size_t bytes) {
    const shard_model_tensor_ops *t = tensor_ops(m);
    if (t && t->param_spec)
        t->param_spec(m, i, out, bytes);
    else
        snprintf(out, bytes, "P()");
}

/* Whether a model table built against an older header has `field` (later fields read as NULL). */
#define HAS(o, field) ((o)->struct_size >= offsetof(shard_model_ops, field) + sizeof((o)->field))

/* The table's first fields every model gives, through the pipeline table; the optional ones after it
 * may be missing from a table built against an older header. */
#define OPS_REQUIRED_BYTES offsetof(shard_model_ops, stats)

shard_status shard_model_check_tables(const shard_model *m) {
    const shard_model_ops *o = m ? m->ops : NULL;
    if (!o) return shard_error(SHARD_ERR_INVALID_ARG, "model: no table (m->ops is NULL)");
    const char *kind = o->struct_size >= OPS_REQUIRED_BYTES && o->kind ? o->kind : "(unnamed)";
    if (o->struct_size < OPS_REQUIRED_BYTES)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its table's struct_size %zu is less than the %zu bytes of its required "
                           "entries: set .struct_size = sizeof(shard_model_ops) and rebuild against these headers",
                           kind, o->struct_size, (size_t)OPS_REQUIRED_BYTES);
    if (!o->kind || !o->forward || !o->backward || !o->destroy)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its table lacks %s: every model gives kind, forward, "
                           "backward and destroy",
                           kind,
                           !o->kind           ? "kind"
                               : !o->forward  ? "forward"
                               : !o->backward ? "backward"
                                              : "destroy");
    if (o->tensor && o->tensor->struct_size < sizeof *o->tensor)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its tensor table's struct_size %zu is not this "
                           "library's %zu",
                           kind, o->tensor->struct_size, sizeof *o->tensor);
    if (o->pipe && o->pipe->struct_size < sizeof *o->pipe)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its pipeline table's struct_size %zu is not this "
                           "library's %zu",
                           kind, o->pipe->struct_size, sizeof *o->pipe);
    if (o->pipe && (!o->pipe->blocks || !o->pipe->forward_range || !o->pipe->backward_range))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its pipeline table lacks blocks, forward_range or "
                           "backward_range",
                           kind);
    if (HAS(o, stacks) && o->stacks && (o->stacks->struct_size < sizeof *o->stacks || !o->stacks->stack))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its stack table is not this library's (struct_size %zu, need %zu) or "
                           "lacks stack",
                           kind, o->stacks->struct_size, sizeof *o->stacks);
    if (HAS(o, stats) && o->stats &&
        (o->stats->struct_size < sizeof *o->stats || !o->stats->routed || !o->stats->reset || !o->stats->read))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': its stats table is not this library's (struct_size %zu, need %zu) or "
                           "lacks routed, reset or read",
                           kind, o->stats->struct_size, sizeof *o->stats);
    return SHARD_OK;
}

const shard_model_stats_ops *shard_model_stats(const shard_model *m) {
    const shard_model_ops *o = m ? m->ops : NULL;
    if (!o || !HAS(o, stats) || !o->stats || !o->stats->routed) return NULL;
    return o->stats->routed(m) ? o->stats : NULL;
}

size_t shard_model_stack(const shard_model *m, size_t i, size_t *name_prefix_bytes) {
    const shard_model_ops *o = m ? m->ops : NULL;
    size_t prefix = 0, members = 0;
    if (o && HAS(o, stacks) && o->stacks && o->stacks->stack) members = o->stacks->stack(m, i, &prefix);
    if (name_prefix_bytes) *name_prefix_bytes = members ? prefix : 0;
    return members;
}

int shard_model_batch_shape(const shard_model *m, shard_batch *shape) {
    const shard_model_ops *o = m ? m->ops : NULL;
    if (!o || !HAS(o, batch_shape) || !o->batch_shape) return 0;
    memset(shape, 0, sizeof *shape);
    o->batch_shape(m, shape);
    return 1;
}

void shard_model_stack_member_name(const char *name, size_t name_prefix_bytes, size_t j, char *out, size_t bytes) {
    size_t len = strlen(name), at = name_prefix_bytes < len ? name_prefix_bytes : len;
    snprintf(out, bytes, "%.*s%zu.%s", (int)at, name, j, name + at);
}

shard_status shard_model_stored_params(const shard_model *m, shard_params **out) {
    const shard_params *p = m->params;
    size_t n = 0;
    for (size_t i = 0; i < p->count; i++) n += shard_model_stack(m, i, NULL) + 1;
    shard_param_info *info = calloc(n + 1, sizeof *info);
    if (!info) return shard_error(SHARD_ERR_NO_MEMORY, "model: out of memory for the stored parameters");
    n = 0;
    for (size_t i = 0; i < p->count; i++) {
        const shard_param_info *pi = &p->info[i];
        size_t prefix = 0, members = pi->ndim > 0 ? shard_model_stack(m, i, &prefix) : 0;
        if (members && members != pi->shape[0]) {
            free(info);
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "model: parameter '%s' holds %zu of its stack's %zu members here: stored parameters "
                               "are a whole model's",
                               pi->name, pi->shape[0], members);
        }
        if (!members) info[n++] = *pi;
        for (size_t j = 0; j < members; j++, n++) { /* member j: the stack's dim 0 dropped */
            char name[SHARD_PARAM_NAME_BYTES + 24];
            shard_model_stack_member_name(pi->name, prefix, j, name, sizeof name);
            snprintf(info[n].name, sizeof info[n].name, "%.*s", (int)sizeof info[n].name - 1, name);
            info[n].ndim = pi->ndim - 1;
            memcpy(info[n].shape, pi->shape + 1, (size_t)(pi->ndim - 1) * sizeof *pi->shape);
        }
    }
    shard_status s = shard_params_create(info, n, SHARD_MEM_OTHER, out);
    free(info);
    return s;
}

void shard_model_take_stored(shard_model *m, const shard_params *stored) {
    const shard_params *p = m->params;
    for (size_t i = 0, k = 0; i < p->count; i++) {
        size_t members = p->info[i].ndim > 0 ? shard_model_stack(m, i, NULL) : 0, at = 0;
        for (size_t j = 0; j < (members ? members : 1); j++, k++) { /* a stack's members one after the other */
            memcpy(p->data + p->info[i].offset + at, stored->data + stored->info[k].offset,
                   stored->info[k].numel * sizeof *p->data);
            at += stored->info[k].numel;
        }
    }
}

void shard_model_free_units(shard_model *m) {
    free(m->unit_first), free(m->unit_offset), free(m->unit_of), free(m->value), free(m->grad);
    m->unit_first = m->unit_offset = m->unit_of = NULL, m->value = m->grad = NULL;
}

void shard__model_free_units(shard_model *m) { shard_model_free_units(m); }

void shard_model_destroy(shard_model *m) {
    if (m && m->ops) m->ops->destroy(m);
}

shard_status shard_model_config_read(const char *path, char **out) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    SHARD_CHECK(shard_file_read(path, "cannot read the config", SHARD__CONFIG_MAX_BYTES, &text, &len));
    if (len == 0) {
        free(text);
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: the config is empty", path);
    }
    if (strlen(text) != len) { /* JSON text has no NUL: what follows one would be read past unseen */
        size_t at = strlen(text);
        free(text);
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: a NUL byte at offset %zu; a config is JSON text", path, at);
    }
    *out = text;
    return SHARD_OK;
}

/* The whole config file as text (NULL with the error set). */
char *shard__read_config(const char *path) {
    char *text = NULL;
    return shard_model_config_read(path, &text) == SHARD_OK ? text : NULL;
}

shard_status shard__unknown_key(const char *where, const char *key, const char *const *keys, size_t count,
                                const char *listing) {
    const char *near = shard_text_nearest(key, keys, count);
    return shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' is unknown (%s)%s%s%s", where, key, listing,
                       near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
}

/* ---------------------------------------------------------------- the registry */

/* Kinds are few and never removed: a fixed table, its names copied, behind one lock (thread ranks
 * create their models at once while a program may still register). */
#define MAX_KINDS 64
#define KIND_NAME_BYTES 64
typedef struct kind_entry {
    shard_model_kind kind;
    char name[KIND_NAME_BYTES];
    /* a built-in kind's config check without building the model (NULL for a registered kind: its create
     * function checks its keys) */
    shard_status (*check)(const char *text, const char *where);
} kind_entry;

static kind_entry g_kinds[MAX_KINDS];
static size_t g_count;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_builtins = PTHREAD_ONCE_INIT;

/* The registered names, "gpt2, gpt, cnn, mlp", for messages (the lock held). */
static void kind_names(char *out, size_t bytes) {
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < g_count && at < bytes; i++) {
        int n = snprintf(out + at, bytes - at, "%s%s", i ? ", " : "", g_kinds[i].name);
        if (n > 0) at += (size_t)n;
    }
}

static shard_status add_kind(const shard_model_kind *k) {
    if (!k || k->struct_size < sizeof(shard_model_kind))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_model_register_kind: kind missing or from an older header "
                           "(struct_size)");
    if (!k->name || !*k->name || strlen(k->name) >= KIND_NAME_BYTES)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_model_register: kind name '%s': give 1..%d bytes",
                           k->name ? k->name : "(null)", KIND_NAME_BYTES - 1);
    if (!k->create)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_model_register: kind '%s' has no create function", k->name);
    pthread_mutex_lock(&g_lock);
    shard_status s = SHARD_OK;
    char names[MAX_KINDS * (KIND_NAME_BYTES + 2)];
    for (size_t i = 0; s == SHARD_OK && i < g_count; i++)
        if (strcmp(g_kinds[i].name, k->name) == 0) {
            kind_names(names, sizeof names);
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "shard_model_register: model kind '%s' is registered already "
                            "(registered: %s): pick another name",
                            k->name, names);
        }
    if (s == SHARD_OK && g_count == MAX_KINDS)
        s = shard_error(SHARD_ERR_INVALID_ARG, "shard_model_register: kind '%s': the registry holds at most %d kinds",
                        k->name, MAX_KINDS);
    if (s == SHARD_OK) {
        kind_entry *e = &g_kinds[g_count++];
        e->kind = *k, e->kind.struct_size = sizeof e->kind;
        snprintf(e->name, sizeof e->name, "%s", k->name);
        e->kind.name = e->name;
    }
    pthread_mutex_unlock(&g_lock);
    return s;
}

static shard_status gpt_check(const char *text, const char *where) {
    shard_gpt_config c;
    return shard_gpt_config_parse(text, where, &c);
}

static shard_status cnn_check(const char *text, const char *where) {
    shard_cnn_config c;
    return shard_cnn_config_parse(text, where, &c);
}

static shard_status mlp_check(const char *text, const char *where) {
    size_t d, h;
    return shard__mlp_config_parse(text, where, &d, &h);
}

/* The GPT's maker takes its settings one by one (gpt.c); the registry hands them over. */
static shard_status gpt_create(const shard_model_create_options *o, shard_model **out) {
    return shard__gpt_model_create(o->config_text, o->config_path, o->max_rows, o->seq, o->tensor, o->expert,
                                   o->sequence_parallel, o->specs, o->stage, out);
}

static shard_status gpt_layers(const shard_model_create_options *o, size_t *layers) {
    shard_gpt_config c;
    SHARD_CHECK(shard_gpt_config_parse(o->config_text, o->config_path, &c));
    *layers = c.n_layer;
    return SHARD_OK;
}

static shard_status cnn_layers(const shard_model_create_options *o, size_t *layers) {
    (void)o;
    *layers = 2; /* the CNN's two shards: features, classifier */
    return SHARD_OK;
}

static void register_builtins(void) {
    const shard_model_kind gpt = {.struct_size = sizeof(shard_model_kind),
                                  .name = "gpt2",
                                  .create = gpt_create,
                                  .stage_layers = gpt_layers,
                                  .tensor_parallel = 1,
                                  .expert_parallel = 1,
                                  .placed = 1,
                                  .batch_source = shard__gpt_batch_source};
    shard_model_kind gpt_alias = gpt; /* "gpt", as configs may name it */
    gpt_alias.name = "gpt";
    const shard_model_kind kinds[] = {
        gpt,
        gpt_alias,
        {.struct_size = sizeof(shard_model_kind),
         .name = "cnn",
         .create = shard__cnn_model_create,
         .stage_layers = cnn_layers,
         .batch_source = shard__cnn_batch_source},
        {.struct_size = sizeof(shard_model_kind),
         .name = "mlp",
         .create = shard__mlp_model_create,
         .tensor_parallel = 1,
         .batch_source = shard__mlp_batch_source},
    };
    shard_status (*const checks[])(const char *, const char *) = {gpt_check, gpt_check, cnn_check, mlp_check};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (add_kind(&kinds[i]) == SHARD_OK) g_kinds[g_count - 1].check = checks[i]; /* before any lookup */
}

shard_status shard_model_register_kind(const shard_model_kind *kind) {
    pthread_once(&g_builtins, register_builtins);
    return add_kind(kind);
}

shard_status shard_model_register(const char *kind, shard_model_create_fn create) {
    return shard_model_register_kind(
        &(shard_model_kind){.struct_size = sizeof(shard_model_kind), .name = kind, .create = create});
}

/* The kind of that name (and a built-in kind's config check into *check, when check is not NULL);
 * `where` (NULL: none) opens the refusal of an unknown one. */
static shard_status find_kind_check(const char *name, const char *where, shard_model_kind *out,
                                    shard_status (**check)(const char *, const char *)) {
    pthread_once(&g_builtins, register_builtins);
    pthread_mutex_lock(&g_lock);
    shard_status s = SHARD_ERR_INVALID_ARG;
    for (size_t i = 0; s < 0 && i < g_count; i++)
        if (name && strcmp(g_kinds[i].name, name) == 0) {
            *out = g_kinds[i].kind, s = SHARD_OK;
            if (check) *check = g_kinds[i].check;
        }
    if (s < 0) {
        char names[MAX_KINDS * (KIND_NAME_BYTES + 2)];
        const char *list[MAX_KINDS];
        kind_names(names, sizeof names);
        for (size_t i = 0; i < g_count; i++) list[i] = g_kinds[i].name;
        const char *near = name ? shard_text_nearest(name, list, g_count) : NULL;
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "%s%smodel_type '%s' is not a registered model kind: give one of %s (or "
                        "register it with shard_model_register)%s%s%s",
                        where ? where : "", where ? ": " : "", name ? name : "(null)", names,
                        near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
    }
    pthread_mutex_unlock(&g_lock);
    return s;
}

static shard_status find_kind(const char *name, const char *where, shard_model_kind *out) {
    return find_kind_check(name, where, out, NULL);
}

shard_status shard_model_kind_find(const char *name, shard_model_kind *out) { return find_kind(name, NULL, out); }

/* ---------------------------------------------------------------- the factory */

/* The kind a config's text names: its model_type, "gpt2" when absent (or when the text is not JSON:
 * the GPT's parser then says where). */
static shard_status kind_of_check(const shard_model_create_options *o, shard_model_kind *k,
                                  shard_status (**check)(const char *, const char *)) {
    json_t *root = o->config_text ? json_loads(o->config_text, 0, NULL) : NULL;
    const json_t *t = json_object_get(root, "model_type");
    shard_status s;
    if (t && !json_is_string(t)) {
        char names[MAX_KINDS * (KIND_NAME_BYTES + 2)];
        pthread_once(&g_builtins, register_builtins);
        pthread_mutex_lock(&g_lock);
        kind_names(names, sizeof names);
        pthread_mutex_unlock(&g_lock);
        s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'model_type' must be a string, one of %s", o->config_path,
                        names);
    } else {
        s = find_kind_check(t ? json_string_value(t) : "gpt2", o->config_path, k, check);
    }
    json_decref(root);
    return s;
}

static shard_status kind_of(const shard_model_create_options *o, shard_model_kind *k) {
    return kind_of_check(o, k, NULL);
}

shard_status shard_model_config_check(const char *config_path) {
    if (!config_path) return shard_error(SHARD_ERR_INVALID_ARG, "shard_model_config_check: config_path is NULL");
    char *text = shard__read_config(config_path);
    if (!text) return SHARD_ERR_IO;
    shard_model_create_options o = {.struct_size = sizeof o, .config_text = text, .config_path = config_path};
    shard_model_kind k;
    shard_status (*check)(const char *, const char *) = NULL;
    shard_status s = kind_of_check(&o, &k, &check);
    if (s == SHARD_OK && check) s = check(text, config_path);
    free(text);
    return s;
}

shard_status shard_model_create_with(const shard_model_create_options *options, shard_model **out) {
    *out = NULL;
    if (!options || options->struct_size < sizeof(shard_model_create_options))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_model_create_with: options missing or from an older header "
                           "(struct_size)");
    if (!options->config_text) /* the kind is the text's model_type: without a text there is none to build */
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_model_create_with: no config text: give the config's JSON, "
                           "its model_type naming the kind");
    shard_model_create_options o = *options;
    o.struct_size = sizeof o;
    if (!o.config_path) o.config_path = "the model config";
    shard_model_kind k;
    SHARD_CHECK(kind_of(&o, &k));
    if (o.tensor && shard_comm_size(o.tensor) > 1 && !k.tensor_parallel)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: model_type '%s' has no tensor-parallel layout here (the GPT "
                           "and the MLP have): give tensor=1",
                           o.config_path, k.name);
    if (o.expert && shard_comm_size(o.expert) > 1 && !k.expert_parallel)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: model_type '%s' has no experts to split over an expert axis: give expert=1",
                           o.config_path, k.name);
    if (o.specs && *o.specs && !k.placed)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--spec: model_type '%s' places every parameter whole; specs are for "
                           "the GPT's parameters",
                           k.name);
    if (o.stage && o.stage->count > 1 && !k.stage_layers)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: model_type '%s' is not cut into pipeline stages (the GPT and "
                           "the CNN are): give pipe=1",
                           o.config_path, k.name);
    o.ctx = k.ctx;
    SHARD_CHECK(k.create(&o, out));
    shard_status s = *out
        ? shard_model_check_tables(*out)
        : shard_error(SHARD_ERR_INTERNAL, "model_type '%s': its create function made no model", k.name);
    if (s < 0 && *out) shard_model_destroy(*out), *out = NULL;
    return s;
}

shard_status shard_model_create(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                shard_comm *tensor, int sequence_parallel, shard_model **out) {
    return shard_model_create_placed(config_path, data_dir, max_rows, seq, tensor, sequence_parallel, NULL, out);
}

shard_status shard_model_create_placed(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                       shard_comm *tensor, int sequence_parallel, const char *specs,
                                       shard_model **out) {
    return shard_model_create_stage(config_path, data_dir, max_rows, seq, tensor, sequence_parallel, specs, NULL, out);
}

shard_status shard_model_stage_layers(const char *config_path, size_t *layers) {
    *layers = 0;
    char *text = shard__read_config(config_path);
    if (!text) return SHARD_ERR_IO;
    shard_model_create_options o = {.struct_size = sizeof o, .config_text = text, .config_path = config_path};
    shard_model_kind k;
    shard_status s = kind_of(&o, &k);
    if (s == SHARD_OK && k.stage_layers) {
        o.ctx = k.ctx;
        s = k.stage_layers(&o, layers);
    }
    free(text);
    return s;
}

shard_status shard_model_create_stage(const char *config_path, const char *data_dir, size_t max_rows, size_t seq,
                                      shard_comm *tensor, int sequence_parallel, const char *specs,
                                      const shard_model_stage *stage, shard_model **out) {
    *out = NULL;
    char *text = shard__read_config(config_path);
    if (!text) return SHARD_ERR_IO;
    shard_model_create_options o = {.struct_size = sizeof o,
                                    .config_text = text,
                                    .config_path = config_path,
                                    .data_dir = data_dir,
                                    .max_rows = max_rows,
                                    .seq = seq,
                                    .tensor = tensor,
                                    .sequence_parallel = sequence_parallel,
                                    .specs = specs,
                                    .stage = stage};
    shard_status s = shard_model_create_with(&o, out);
    free(text);
    return s;
}

shard_status shard_model_batch_source(const shard_model_create_options *options, const shard_model *m,
                                      shard_batch_source **out) {
    *out = NULL;
    if (!options || options->struct_size < sizeof(shard_model_create_options) || !m || !m->ops || !m->ops->kind)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_model_batch_source: options from an older header "
                           "(struct_size), or no model with its table's kind");
    shard_model_kind k;
    SHARD_CHECK(find_kind(m->ops->kind, "the batch source", &k));
    if (!k.batch_source)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model kind '%s' names no batch source: register it with one, or give "
                           "the trainer's factory a batch_source",
                           k.name);
    shard_model_create_options o = *options;
    o.struct_size = sizeof o, o.ctx = k.ctx;
    if (!o.config_path) o.config_path = "the model config";
    SHARD_CHECK(k.batch_source(&o, m, out));
    if (!*out || !(*out)->ops || !(*out)->ops->load || !(*out)->ops->destroy) {
        shard_batch_source_destroy(*out && (*out)->ops && (*out)->ops->destroy ? *out : NULL);
        *out = NULL;
        return shard_error(SHARD_ERR_INTERNAL,
                           "model kind '%s': its batch_source made no source with load and "
                           "destroy",
                           k.name);
    }
    return SHARD_OK;
}
