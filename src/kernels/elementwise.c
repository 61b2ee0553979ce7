/* elementwise.c — ReLU, GELU (and its slope form), add, multiply and dropout, with their plain
 * references.
 *
 * GELU, add and multiply over many elements run in chunks on the process's threads (the chunks cut by
 * size alone, so the bits do not depend on the thread count); each chunk's loop is compiled for
 * several vector widths (core/simd.h).  The references at the end are the definitions written as
 * loops, in double where there is arithmetic (see reference.h). */
#include "shard/layers.h"

#include <math.h>

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/reference.h"
#include "kernels/vec.h"

SHARD_VECTOR_CLONES
void shard_relu_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] <= 0 ? 0.0f : x[i]; /* NaN stays NaN, as in PyTorch */
}

SHARD_VECTOR_CLONES
void shard_relu_backward(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = x[i] <= 0 ? 0.0f : dy[i];
}

static const float GELU_S = 0.7978845608028654f; /* sqrt(2 / pi) */
static const float GELU_C = 0.044715f;

/* tanh as a 13/6 rational function on [-7.9, 7.9] (+-1 beyond), within a few
 * ulp of tanhf (the coefficients of Eigen's fast float tanh); no calls, so
 * the GELU loops vectorise. */
static inline float fast_tanh(float x) {
    x = x < -7.90531110763549805f ? -7.90531110763549805f : x > 7.90531110763549805f ? 7.90531110763549805f : x;
    float x2 = x * x;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 - 8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    p = p * x;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return p / q;
}

SHARD_VECTOR_CLONES
static void gelu_forward_range(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + fast_tanh(GELU_S * (v + GELU_C * v * v * v)));
    }
}

/* GELU'(v) given t = tanh(sqrt(2/pi) (v + 0.044715 v^3)) */
static inline float gelu_slope(float v, float t) {
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3.0f * GELU_C * v * v);
}

SHARD_VECTOR_CLONES
static void gelu_backward_range(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i], t = fast_tanh(GELU_S * (v + GELU_C * v * v * v));
        dx[i] = dy[i] * gelu_slope(v, t);
    }
}

/* y = GELU(x) and x = GELU'(x), one tanh for both, while x is in cache */
SHARD_VECTOR_CLONES
static void gelu_forward_slope_range(float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i], t = fast_tanh(GELU_S * (v + GELU_C * v * v * v));
        y[i] = 0.5f * v * (1.0f + t);
        x[i] = gelu_slope(v, t);
    }
}

SHARD_VECTOR_CLONES
static void mul_range(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

SHARD_VECTOR_CLONES
static void add_range(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* An element-wise kernel over n elements, its chunks on the process's threads. */
typedef struct ew_job {
    int kind; /* 0 gelu forward, 1 gelu backward, 2 add, 3 gelu forward keeping the slope, 4 multiply */
    const float *a, *b;
    float *y, *slope;
    size_t n;
} ew_job;

static void ew_chunk(void *ctx, size_t chunk, size_t chunks) {
    const ew_job *j = ctx;
    size_t at, n;
    shard__chunk_range(j->n, chunks, chunk, &at, &n);
    if (j->kind == 0)
        gelu_forward_range(j->a + at, j->y + at, n);
    else if (j->kind == 1)
        gelu_backward_range(j->a + at, j->b + at, j->y + at, n);
    else if (j->kind == 2)
        add_range(j->a + at, j->b + at, j->y + at, n);
    else if (j->kind == 3)
        gelu_forward_slope_range(j->slope + at, j->y + at, n);
    else
        mul_range(j->a + at, j->b + at, j->y + at, n);
}

static void elementwise(int kind, const float *a, const float *b, float *y, size_t n) {
    ew_job j = {kind, a, b, y, NULL, n};
    shard__parallel_for(shard__chunks_for(n, GRAIN), ew_chunk, &j);
}

void shard_gelu_forward(const float *x, float *y, size_t n) { elementwise(0, x, NULL, y, n); }
void shard_gelu_backward(const float *x, const float *dy, float *dx, size_t n) { elementwise(1, x, dy, dx, n); }
void shard_add(const float *a, const float *b, float *y, size_t n) { elementwise(2, a, b, y, n); }
void shard_mul(const float *a, const float *b, float *y, size_t n) { elementwise(4, a, b, y, n); }

void shard_gelu_forward_slope(float *x, float *y, size_t n) {
    ew_job j = {3, NULL, NULL, y, x, n};
    shard__parallel_for(shard__chunks_for(n, GRAIN), ew_chunk, &j);
}

/* ---------------------------------------------------------------- dropout */

void shard_dropout_forward(const float *x, float *y, size_t n, float p, uint64_t seed, uint64_t offset) {
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < n; i++)
        y[i] = p > 0 ? (shard__dropout_keeps(seed, offset + i, p) ? x[i] * scale : 0.0f) : x[i];
}

void shard_dropout_backward(const float *dy, float *dx, size_t n, float p, uint64_t seed, uint64_t offset) {
    shard_dropout_forward(dy, dx, n, p, seed, offset);
}

/* ---------------------------------------------------------------- reference */

void shard__ref_relu_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0.0f;
}

void shard__ref_relu_backward(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = x[i] > 0 ? dy[i] : 0.0f;
}

/* GELU's tanh form and its derivative, with libm's tanh in double */
static const double REF_GELU_S = 0.79788456080286535588; /* sqrt(2 / pi) */

static double ref_gelu(double v) { return 0.5 * v * (1.0 + tanh(REF_GELU_S * (v + 0.044715 * v * v * v))); }

static double ref_gelu_slope(double v) {
    double u = REF_GELU_S * (v + 0.044715 * v * v * v), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * REF_GELU_S * (1.0 + 3.0 * 0.044715 * v * v);
}

void shard__ref_gelu_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = (float)ref_gelu(x[i]);
}

void shard__ref_gelu_backward(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = (float)((double)dy[i] * ref_gelu_slope(x[i]));
}

void shard__ref_gelu_forward_slope(float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (float)ref_gelu(v);
        x[i] = (float)ref_gelu_slope(v);
    }
}

void shard__ref_add(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void shard__ref_mul(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

void shard__ref_dropout(const float *x, float *y, size_t n, float p, uint64_t seed, uint64_t offset) {
    for (size_t i = 0; i < n; i++) {
        if (p <= 0)
            y[i] = x[i];
        else
            y[i] = shard__dropout_keeps(seed, offset + i, p) ? (float)((double)x[i] / (1.0 - (double)p)) : 0.0f;
    }
}
