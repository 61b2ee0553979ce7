/* optim.c — SGD with momentum, AdamW, clipping factors and the warm-up +
 * cosine schedule (see optim.h).  The arithmetic follows PyTorch's
 * single-tensor (foreach=False) implementations step for step in fp32, so
 * the weights after a few steps agree with PyTorch's to rounding. */
#include "shard/optim.h"

#include "core/parallel.h"
#include "core/simd.h"

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

shard_adamw_config shard_adamw_defaults(void) { return (shard_adamw_config){0.9f, 0.999f, 1e-8f, 0.01f}; }

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
    adamw_range(j->c, j->step_size, j->bc2_sqrt, j->decay, j->clip, j->p + at, j->zero_grad ? j->g + at : (float *)j->g_in + at,
                j->m + at, j->v + at, n, j->zero_grad);
}

static void adamw(const shard_adamw_config *c, uint64_t step, float lr, float clip, float *p, const float *g_in,
                  float *g, float *m, float *v, size_t n) {
    /* the scalars in double, as PyTorch computes them in Python, then used as floats */
    double bc1 = 1.0 - pow((double)c->beta1, (double)step), bc2 = 1.0 - pow((double)c->beta2, (double)step);
    adamw_job j = {.c = c, .step_size = (float)((double)lr / bc1), .bc2_sqrt = (float)sqrt(bc2),
                   .decay = (float)(1.0 - (double)lr * (double)c->weight_decay), .clip = clip, .p = p, .g = g, .m = m,
                   .v = v, .g_in = g_in, .n = n, .zero_grad = g != NULL};
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

float shard_lr_at(const shard_lr_schedule *s, uint64_t step) {
    if (s->warmup && step <= s->warmup) return s->lr_max * (float)step / (float)s->warmup;
    if (step >= s->total || s->total <= s->warmup) return s->total > s->warmup ? s->lr_min : s->lr_max;
    double progress = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    const double pi = 3.14159265358979323846;
    return (float)(s->lr_min + 0.5 * (1.0 + cos(pi * progress)) * (s->lr_max - s->lr_min));
}
