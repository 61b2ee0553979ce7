/* optim_kernels.c — the optimizers' updates over flat arrays (SGD with momentum, AdamW, AdamW with the
 * clipping factor folded in), the sum of squares and scaling behind gradient clipping, and their plain
 * references.
 *
 * The arithmetic follows PyTorch's single-tensor (foreach=False) implementations step for step in fp32,
 * so the weights after a few steps agree with PyTorch's to rounding.  AdamW and the sum of squares run
 * in chunks on the process's threads (cut by size alone; the sum's partials added in chunk order).  The
 * references at the end are the formulas in double (see reference.h). */
#include "shard/optim.h"

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/reference.h"

#include <math.h>

void shard_sgd_update(const shard_sgd_config *c, uint64_t step, float lr, float *p, const float *g, float *buf,
                      size_t n) {
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        if (c->weight_decay != 0) d += c->weight_decay * p[i];
        if (c->momentum != 0) {
            buf[i] = step <= 1 ? d : c->momentum * buf[i] + d;
            d = buf[i];
        }
        p[i] -= lr * d;
    }
}

SHARD_VECTOR_CLONES
static void adamw_range(const shard_adamw_config *c, float step_size, float bc2_sqrt, float decay, float clip, float *p,
                        float *g, float *m, float *v, size_t n, int zero_grad) {
    for (size_t i = 0; i < n; i++) {
        float gi = clip != 1.0f ? g[i] * clip : g[i];
        p[i] *= decay;
        m[i] = c->beta1 * m[i] + (1.0f - c->beta1) * gi;
        v[i] = c->beta2 * v[i] + (1.0f - c->beta2) * gi * gi;
        float denom = sqrtf(v[i]) / bc2_sqrt + c->eps;
        p[i] -= step_size * m[i] / denom;
        if (zero_grad) g[i] = 0.0f;
    }
}

typedef struct adamw_job {
    const shard_adamw_config *c;
    float step_size, bc2_sqrt, decay, clip, *p, *g, *m, *v;
    const float *g_in;
    size_t n;
    int zero_grad;
} adamw_job;

static void adamw_chunk(void *ctx, size_t chunk, size_t chunks) {
    const adamw_job *j = ctx;
    size_t at, n;
    shard__chunk_range(j->n, chunks, chunk, &at, &n);
    adamw_range(j->c, j->step_size, j->bc2_sqrt, j->decay, j->clip, j->p + at,
                j->zero_grad ? j->g + at : (float *)j->g_in + at, j->m + at, j->v + at, n, j->zero_grad);
}

static void adamw(const shard_adamw_config *c, uint64_t step, float lr, float clip, float *p, const float *g_in,
                  float *g, float *m, float *v, size_t n) {
    /* the scalars in double, as PyTorch computes them in Python, then used as floats */
    double bc1 = 1.0 - pow((double)c->beta1, (double)step), bc2 = 1.0 - pow((double)c->beta2, (double)step);
    adamw_job j = {.c = c,
                   .step_size = (float)((double)lr / bc1),
                   .bc2_sqrt = (float)sqrt(bc2),
                   .decay = (float)(1.0 - (double)lr * (double)c->weight_decay),
                   .clip = clip,
                   .p = p,
                   .g = g,
                   .m = m,
                   .v = v,
                   .g_in = g_in,
                   .n = n,
                   .zero_grad = g != NULL};
    shard__parallel_for(shard__chunks_for(n, 65536), adamw_chunk, &j);
}

void shard_adamw_update(const shard_adamw_config *c, uint64_t step, float lr, float *p, const float *g, float *m,
                        float *v, size_t n) {
    adamw(c, step, lr, 1.0f, p, g, NULL, m, v, n);
}

void shard_adamw_update_clipped(const shard_adamw_config *c, uint64_t step, float lr, float clip, float *p, float *g,
                                float *m, float *v, size_t n) {
    adamw(c, step, lr, clip, p, g, g, m, v, n);
}

SHARD_VECTOR_CLONES
static double sum_squares_range(const float *g, size_t n) {
    double part[8] = {0}, s = 0; /* 8 running sums in a fixed order: vectorises, same result every run */
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) part[k] += (double)g[i + (size_t)k] * (double)g[i + (size_t)k];
    for (int k = 0; k < 8; k++) s += part[k];
    for (; i < n; i++) s += (double)g[i] * (double)g[i];
    return s;
}

typedef struct squares_job {
    const float *g;
    size_t n;
    double part[SHARD_MAX_CHUNKS];
} squares_job;

static void squares_chunk(void *ctx, size_t chunk, size_t chunks) {
    squares_job *j = ctx;
    size_t at, n;
    shard__chunk_range(j->n, chunks, chunk, &at, &n);
    j->part[chunk] = sum_squares_range(j->g + at, n);
}

double shard_sum_squares(const float *g, size_t n) {
    squares_job j = {.g = g, .n = n};
    size_t chunks = shard__chunks_for(n, 65536);
    shard__parallel_for(chunks, squares_chunk, &j);
    double s = 0;
    for (size_t k = 0; k < chunks; k++) s += j.part[k];
    return s;
}

float shard_clip_factor(double global_norm, float max_norm) {
    double f = (double)max_norm / (global_norm + 1e-6);
    return f < 1.0 ? (float)f : 1.0f;
}

SHARD_VECTOR_CLONES
void shard_scale(float *g, size_t n, float factor) {
    for (size_t i = 0; i < n; i++) g[i] *= factor;
}

/* ---------------------------------------------------------------- reference */

void shard__ref_sgd_update(const shard_sgd_config *c, uint64_t step, float lr, float *p, const float *g, float *buf,
                           size_t n) {
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i] + (double)c->weight_decay * p[i];
        if (c->momentum != 0) d = buf[i] = (float)(step <= 1 ? d : (double)c->momentum * buf[i] + d);
        p[i] = (float)(p[i] - (double)lr * d);
    }
}

void shard__ref_adamw_update(const shard_adamw_config *c, uint64_t step, float lr, float clip, float *p, const float *g,
                             float *m, float *v, size_t n) {
    double b1 = c->beta1, b2 = c->beta2, bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * clip, pi = p[i] * (1.0 - (double)lr * c->weight_decay);
        double mi = b1 * m[i] + (1.0 - b1) * gi, vi = b2 * v[i] + (1.0 - b2) * gi * gi;
        p[i] = (float)(pi - (double)lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + c->eps));
        m[i] = (float)mi, v[i] = (float)vi;
    }
}

double shard__ref_sum_squares(const float *g, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

float shard__ref_clip_factor(double global_norm, float max_norm) {
    double f = max_norm / (global_norm + 1e-6);
    return (float)(f < 1.0 ? f : 1.0);
}

void shard__ref_scale(float *g, size_t n, float factor) {
    for (size_t i = 0; i < n; i++) g[i] = (float)((double)g[i] * factor);
}
