/* batch.c — the library's batch sources (batch.h): token files, Fashion-MNIST's IDX files and generated
 * teacher rows, each behind the source table, each drawing rows as a pure function of (seed, step,
 * global row) so that how the rows are split over calls changes nothing; and the check a model's
 * set_batch makes of the rows it is given (model.h's shard_model_check_batch). */
#include "shard/batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/batch_impl.h"
#include "shard/blas.h"
#include "shard/data.h"
#include "shard/memory.h"
#include "shard/model.h"
#include "shard/params.h"

shard_status shard_batch_source_load(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row,
                                     size_t rows, shard_batch *into) {
    if (rows > src->max_rows)
        return shard_error(SHARD_ERR_INVALID_ARG, "batch source '%s': %zu rows asked; it was made for up to %zu",
                           src->ops->kind, rows, src->max_rows);
    return src->ops->load(src, seed, step, first_row, rows, into);
}

void shard_batch_source_destroy(shard_batch_source *src) {
    if (src && src->ops) src->ops->destroy(src);
}

/* The batch's description; the data itself the source wrote. */
static void describe(shard_batch *b, uint64_t seed, uint64_t step, size_t first_row, size_t rows, shard_dtype in_dtype,
                     size_t in_elems, void *inputs, shard_dtype target_dtype, size_t target_elems, void *targets) {
    *b = (shard_batch){.rows = rows,
                       .seed = seed,
                       .step = step,
                       .first_row = first_row,
                       .input_dtype = in_dtype,
                       .target_dtype = target_dtype,
                       .input_elems = in_elems,
                       .target_elems = target_elems,
                       .inputs = inputs,
                       .targets = targets};
}

/* ---------------------------------------------------------------- token files */

typedef struct token_source {
    shard_batch_source src;
    shard_tokens *tokens;
    size_t seq;
    int32_t *inputs, *targets;
} token_source;

static shard_status tokens_load(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                                shard_batch *into) {
    token_source *t = src->impl;
    describe(into, seed, step, first_row, rows, SHARD_I32, t->seq, t->inputs, SHARD_I32, t->seq, t->targets);
    return rows ? shard_tokens_batch(t->tokens, seed, step, first_row, rows, t->seq, t->inputs, t->targets) : SHARD_OK;
}

static void tokens_destroy(shard_batch_source *src) {
    token_source *t = src->impl;
    shard_tokens_close(t->tokens);
    free(t->inputs), free(t->targets), free(t);
}

static const shard_batch_source_ops token_ops = {
    .struct_size = sizeof(shard_batch_source_ops), .kind = "tokens", .load = tokens_load, .destroy = tokens_destroy};

shard_status shard_batch_source_tokens(const shard_batch_tokens_options *o, shard_batch_source **out) {
    *out = NULL;
    if (!o || o->struct_size < sizeof *o || !o->path)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_batch_source_tokens: options missing, from an older header "
                           "(struct_size) or without a path");
    shard_tokens *tokens = NULL;
    SHARD_CHECK(shard_tokens_open(o->path, &tokens));
    if (o->vocab_size && shard_tokens_vocab(tokens) > o->vocab_size) {
        shard_status s =
            shard_error(SHARD_ERR_INVALID_ARG,
                        "%s: key 'vocab_size' = %zu is smaller than the data's "
                        "vocabulary (%u)",
                        o->where ? o->where : "the model config", o->vocab_size, shard_tokens_vocab(tokens));
        shard_tokens_close(tokens);
        return s;
    }
    token_source *t = calloc(1, sizeof *t);
    size_t n = (o->max_rows ? o->max_rows : 1) * (o->seq ? o->seq : 1);
    if (t) t->inputs = calloc(n, sizeof *t->inputs), t->targets = calloc(n, sizeof *t->targets);
    if (!t || !t->inputs || !t->targets) {
        if (t) free(t->inputs), free(t->targets), free(t);
        shard_tokens_close(tokens);
        return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory for the batch", o->path);
    }
    t->tokens = tokens, t->seq = o->seq;
    t->src = (shard_batch_source){.ops = &token_ops, .max_rows = o->max_rows ? o->max_rows : 1, .impl = t};
    *out = &t->src;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- Fashion-MNIST */

typedef struct image_source {
    shard_batch_source src;
    shard_idx x, y;
    size_t pixels;
    float *images;
    int32_t *labels;
} image_source;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Row r of step s's global batch: training image mix(seed, s, r) mod count, scaled to [0, 1]. */
static shard_status images_load(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                                shard_batch *into) {
    image_source *m = src->impl;
    size_t pixels = m->pixels, count = m->y.count;
    describe(into, seed, step, first_row, rows, SHARD_F32, pixels, m->images, SHARD_I32, 1, m->labels);
    for (size_t i = 0; i < rows; i++) {
        size_t k = (size_t)(mix64(mix64(seed * 0x9e3779b97f4a7c15ULL + step) ^ (first_row + i)) % count);
        for (size_t p = 0; p < pixels; p++) m->images[i * pixels + p] = (float)m->x.data[k * pixels + p] / 255.0f;
        m->labels[i] = m->y.data[k];
    }
    return SHARD_OK;
}

static void images_destroy(shard_batch_source *src) {
    image_source *m = src->impl;
    shard_idx_free(&m->x), shard_idx_free(&m->y);
    free(m->images), free(m->labels), free(m);
}

static const shard_batch_source_ops image_ops = {.struct_size = sizeof(shard_batch_source_ops),
                                                 .kind = "fashion-mnist",
                                                 .load = images_load,
                                                 .destroy = images_destroy};

shard_status shard_batch_source_images(const shard_batch_images_options *o, shard_batch_source **out) {
    *out = NULL;
    if (!o || o->struct_size < sizeof *o)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_batch_source_images: options missing or from an older header "
                           "(struct_size)");
    const char *data_dir =
        o->data_dir ? o->data_dir : "/usr/share/datasets/fashion-mnist"; /* Debian's dataset-fashion-mnist */
    image_source *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "fashion-mnist: out of memory");
    m->src = (shard_batch_source){.ops = &image_ops, .max_rows = o->max_rows ? o->max_rows : 1, .impl = m};
    char xp[4096], yp[4096];
    snprintf(xp, sizeof xp, "%s/train-images-idx3-ubyte.gz", data_dir);
    snprintf(yp, sizeof yp, "%s/train-labels-idx1-ubyte.gz", data_dir);
    shard_status s = shard_idx_read(xp, &m->x);
    if (s == SHARD_OK) s = shard_idx_read(yp, &m->y);
    m->pixels = o->in_channels * o->height * o->width;
    /* the images' own shape, [N, H, W] (one channel) or [N, C, H, W]: a count that merely matches would train on
     * scrambled pixels */
    const shard_idx *x = &m->x, *y = &m->y;
    int x_ok = (x->ndim == 3 && o->in_channels == 1 && x->dims[1] == o->height && x->dims[2] == o->width) ||
        (x->ndim == 4 && x->dims[1] == o->in_channels && x->dims[2] == o->height && x->dims[3] == o->width);
    if (s == SHARD_OK && (!x_ok || y->ndim != 1 || y->count == 0 || x->dims[0] != y->count)) {
        char shape[96] = "";
        for (int d = 0, n = 0; d < x->ndim && n >= 0 && (size_t)n < sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%zu", d ? " x " : "", x->dims[d]);
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "%s: images of shape [%s] with %zu labels; the config wants %zu x %zu x %zu "
                        "images (in_channels x height x width), one label each",
                        xp, shape, y->count, o->in_channels, o->height, o->width);
    }
    for (size_t i = 0; s == SHARD_OK && i < m->y.count; i++)
        if (m->y.data[i] >= o->classes)
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s: label %u at %zu is outside the config's %zu classes", yp,
                            m->y.data[i], i, o->classes);
    if (s == SHARD_OK) {
        m->images = malloc(m->src.max_rows * (m->pixels ? m->pixels : 1) * sizeof *m->images);
        m->labels = malloc(m->src.max_rows * sizeof *m->labels);
        if (!m->images || !m->labels) s = shard_error(SHARD_ERR_NO_MEMORY, "fashion-mnist: out of memory");
    }
    if (s < 0) {
        images_destroy(&m->src);
        return s;
    }
    *out = &m->src;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- generated teacher rows */

typedef struct teacher_source {
    shard_batch_source src;
    char name[48];
    size_t d;
    float *teacher, *x, *target;
} teacher_source;

static shard_status teacher_load(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                                 shard_batch *into) {
    teacher_source *p = src->impl;
    describe(into, seed, step, first_row, rows, SHARD_F32, p->d, p->x, SHARD_F32, p->d, p->target);
    char name[80];
    snprintf(name, sizeof name, "%s.data.%llu", p->name, (unsigned long long)step);
    shard_init_normal(p->x, first_row * p->d, rows * p->d, 1.0f, seed, name); /* keyed by the global row */
    if (rows)
        SHARD_CHECK(shard_sgemm(0, 0, rows, p->d, p->d, 1.0f, p->x, p->d, p->teacher, p->d, 0.0f, p->target, p->d));
    for (size_t i = 0; i < rows * p->d; i++) p->target[i] = tanhf(p->target[i]);
    return SHARD_OK;
}

static void teacher_destroy(shard_batch_source *src) {
    teacher_source *p = src->impl;
    free(p->teacher), shard_free(p->x), free(p);
}

static const shard_batch_source_ops teacher_ops = {
    .struct_size = sizeof(shard_batch_source_ops), .kind = "teacher", .load = teacher_load, .destroy = teacher_destroy};

shard_status shard_batch_source_teacher(const shard_batch_teacher_options *o, shard_batch_source **out) {
    *out = NULL;
    if (!o || o->struct_size < sizeof *o || !o->name || strlen(o->name) >= sizeof((teacher_source *)0)->name || !o->dim)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_batch_source_teacher: options missing, from an older header "
                           "(struct_size), without a name of 1..47 bytes or with dim 0");
    teacher_source *p = calloc(1, sizeof *p);
    if (!p) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", o->name);
    size_t d = o->dim, R = o->max_rows ? o->max_rows : 1;
    p->src = (shard_batch_source){.ops = &teacher_ops, .max_rows = R, .impl = p};
    snprintf(p->name, sizeof p->name, "%s", o->name);
    p->d = d;
    p->teacher = malloc(d * d * sizeof *p->teacher), p->x = shard_alloc(2 * R * d * sizeof *p->x, SHARD_MEM_OTHER);
    if (!p->teacher || !p->x) {
        teacher_destroy(&p->src);
        return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", o->name);
    }
    p->target = p->x + R * d;
    char name[64];
    snprintf(name, sizeof name, "%s.teacher", p->name);
    shard_init_normal(p->teacher, 0, d * d, 1.0f / sqrtf((float)d), o->teacher_seed, name);
    *out = &p->src;
    return SHARD_OK;
}

/* The batch contract from the model side (model.h): whether b fits what a model takes. */
shard_status shard_model_check_batch(shard_model *m, const shard_batch *b, size_t max_rows, shard_dtype input_dtype,
                                     size_t input_elems, shard_dtype target_dtype, size_t target_elems) {
    const char *kind = m->ops && m->ops->kind ? m->ops->kind : "(unnamed)";
    if (!b) return shard_error(SHARD_ERR_INVALID_ARG, "model '%s': no batch given: load one from a batch source", kind);
    if (b->rows > max_rows)
        return shard_error(SHARD_ERR_INVALID_ARG, "model '%s': a batch of %zu rows; this model was made for up to %zu",
                           kind, b->rows, max_rows);
    if (b->rows &&
        (b->input_dtype != input_dtype || b->input_elems != input_elems || b->target_dtype != target_dtype ||
         b->target_elems != target_elems || !b->inputs || !b->targets))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': a batch of rows of %zu %s inputs and %zu %s targets; this "
                           "model takes %zu %s inputs and %zu %s targets per row",
                           kind, b->input_elems, shard_dtype_name(b->input_dtype), b->target_elems,
                           shard_dtype_name(b->target_dtype), input_elems, shard_dtype_name(input_dtype), target_elems,
                           shard_dtype_name(target_dtype));
    m->seed = b->seed, m->step = b->step, m->first_row = b->first_row, m->rows = b->rows;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- rows of zeros */

typedef struct zero_source {
    shard_batch_source src;
    shard_batch shape;
    void *inputs, *targets;
} zero_source;

static shard_status zeros_load(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                               shard_batch *into) {
    zero_source *z = src->impl;
    describe(into, seed, step, first_row, rows, z->shape.input_dtype, z->shape.input_elems, z->inputs,
             z->shape.target_dtype, z->shape.target_elems, z->targets);
    return SHARD_OK;
}

static void zeros_destroy(shard_batch_source *src) {
    zero_source *z = src->impl;
    free(z->inputs), free(z->targets), free(z);
}

static const shard_batch_source_ops zeros_ops = {
    .struct_size = sizeof(shard_batch_source_ops), .kind = "zeros", .load = zeros_load, .destroy = zeros_destroy};

shard_status shard__batch_source_zeros(const shard_batch *shape, size_t max_rows, shard_batch_source **out) {
    *out = NULL;
    zero_source *z = calloc(1, sizeof *z);
    if (!z) return shard_error(SHARD_ERR_NO_MEMORY, "batch source: out of memory");
    z->shape = *shape;
    size_t rows = max_rows ? max_rows : 1;
    z->inputs = calloc(rows * (shape->input_elems ? shape->input_elems : 1), shard_dtype_size(shape->input_dtype));
    z->targets = calloc(rows * (shape->target_elems ? shape->target_elems : 1), shard_dtype_size(shape->target_dtype));
    if (!z->inputs || !z->targets) {
        free(z->inputs), free(z->targets), free(z);
        return shard_error(SHARD_ERR_NO_MEMORY, "batch source: out of memory for %zu rows of zeros", rows);
    }
    z->src = (shard_batch_source){.ops = &zeros_ops, .max_rows = max_rows, .impl = z};
    *out = &z->src;
    return SHARD_OK;
}
