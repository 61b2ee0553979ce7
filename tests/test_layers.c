/* test_layers.c — finite-difference gradient checks (cmocka) for every layer
 * in layers.h on tiny shapes, plus a few closed-form values.
 *
 * Each check takes L = sum_i y_i r_i for fixed random r (so dL/dy = r), gets
 * the analytic gradient from the layer's backward, and compares it with the
 * central difference (L(p + e) - L(p - e)) / 2e at e = 1e-2, L summed in
 * double.  Tolerance: |num - ana| <= 3e-3 + 3e-2 max(|num|, |ana|): with fp32
 * forwards the difference quotient carries ~1e-4 rounding and O(e^2)
 * curvature error, while a wrong formula is off by O(1).  Inputs of ReLU and
 * max-pool are kept away from their kinks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "shard/blas.h"
#include "shard/layers.h"
#include "shard/memory.h"

static uint64_t rng = 12345;
static float uniform(void) { /* in [-1, 1) */
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng >> 11) * 0x1.0p-52 - 1.0);
}
static float *randv(size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = uniform() * scale;
    return v;
}
static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

typedef double (*loss_fn)(void *ctx);

static void grad_check(const char *what, float *p, size_t n, const float *analytic, loss_fn f, void *ctx) {
    const float e = 1e-2f;
    size_t step = n > 200 ? n / 97 : 1; /* large tensors: a spread sample */
    for (size_t i = 0; i < n; i += step) {
        float v = p[i];
        p[i] = v + e;
        double lp = f(ctx);
        p[i] = v - e;
        double lm = f(ctx);
        p[i] = v;
        double num = (lp - lm) / (2.0 * (double)e), ana = analytic[i];
        double tol = 3e-3 + 3e-2 * fmax(fabs(num), fabs(ana));
        if (!(fabs(num - ana) <= tol)) fail_msg("%s: element %zu: numeric %.6g, analytic %.6g", what, i, num, ana);
    }
}

static double dot(const float *y, const float *r, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)y[i] * (double)r[i];
    return s;
}

/* ---------------------------------------------------------------- linear */

typedef struct lin_ctx {
    float *x, *W, *b, *y, *r;
    size_t N, in, out;
} lin_ctx;

static double lin_loss(void *p) {
    lin_ctx *c = p;
    assert_int_equal(shard_linear_forward(c->x, c->W, c->b, c->y, c->N, c->in, c->out), SHARD_OK);
    return dot(c->y, c->r, c->N * c->out);
}

static void linear(void **state) {
    (void)state;
    lin_ctx c = {randv(15, 1), randv(15, 1), randv(3, 1), zeros(9), randv(9, 1), 3, 5, 3};
    float *dx = zeros(15), *dW = zeros(15), *db = zeros(3);
    lin_loss(&c);
    assert_int_equal(shard_linear_backward(c.x, c.W, c.r, dx, dW, db, 3, 5, 3), SHARD_OK);
    grad_check("linear dx", c.x, 15, dx, lin_loss, &c);
    grad_check("linear dW", c.W, 15, dW, lin_loss, &c);
    grad_check("linear db", c.b, 3, db, lin_loss, &c);
    /* parameter gradients accumulate */
    assert_int_equal(shard_linear_backward(c.x, c.W, c.r, NULL, dW, NULL, 3, 5, 3), SHARD_OK);
    float *dW1 = zeros(15);
    assert_int_equal(shard_linear_backward(c.x, c.W, c.r, NULL, dW1, NULL, 3, 5, 3), SHARD_OK);
    for (int i = 0; i < 15; i++) assert_true(fabsf(dW[i] - 2 * dW1[i]) <= 1e-5f * (1 + fabsf(dW[i])));
    free(c.x), free(c.W), free(c.b), free(c.y), free(c.r), free(dx), free(dW), free(db), free(dW1);
}

/* The bias gradient of wide layers (its columns cut into chunks for the threads, in groups of 16 with
 * a remainder): each column is the rows' sum in row order, the same bits as a plain loop, added to
 * what db held. */
static void linear_bias_grad_wide(void **state) {
    (void)state;
    assert_int_equal(shard_blas_set_threads(3), SHARD_OK); /* the chunks on helper threads too (TSan's run) */
    size_t widths[] = {5, 37, 300, 1029}, N = 150, in = 2;
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        size_t out = widths[w];
        float *x = randv(N * in, 1), *W = randv(in * out, 1), *dy = randv(N * out, 1), *db = randv(out, 1);
        float *want = malloc(out * sizeof *want);
        for (size_t o = 0; o < out; o++) {
            want[o] = db[o];
            for (size_t n = 0; n < N; n++) want[o] += dy[n * out + o];
        }
        assert_int_equal(shard_linear_backward(x, W, dy, NULL, NULL, db, N, in, out), SHARD_OK);
        for (size_t o = 0; o < out; o++)
            if (db[o] != want[o])
                fail_msg("width %zu: db[%zu] = %.9g, a plain row-order sum gives %.9g", out, o, db[o], want[o]);
        free(x), free(W), free(dy), free(db), free(want);
    }
    assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
}

/* ---------------------------------------------------------------- element-wise */

typedef struct ew_ctx {
    float *x, *y, *r;
    size_t n;
    int kind; /* 0 relu, 1 gelu, 2 dropout */
} ew_ctx;

static double ew_loss(void *p) {
    ew_ctx *c = p;
    if (c->kind == 0)
        shard_relu_forward(c->x, c->y, c->n);
    else if (c->kind == 1)
        shard_gelu_forward(c->x, c->y, c->n);
    else
        shard_dropout_forward(c->x, c->y, c->n, 0.3f, 99, 1000);
    return dot(c->y, c->r, c->n);
}

static void elementwise(void **state) {
    (void)state;
    size_t n = 64;
    for (int kind = 0; kind < 3; kind++) {
        ew_ctx c = {randv(n, 3), zeros(n), randv(n, 1), n, kind};
        for (size_t i = 0; kind == 0 && i < n; i++) /* away from the kink */
            if (fabsf(c.x[i]) < 0.1f) c.x[i] = 0.5f;
        float *dx = zeros(n);
        if (kind == 0)
            shard_relu_backward(c.x, c.r, dx, n);
        else if (kind == 1)
            shard_gelu_backward(c.x, c.r, dx, n);
        else
            shard_dropout_backward(c.r, dx, n, 0.3f, 99, 1000);
        grad_check(kind == 0 ? "relu" : kind == 1 ? "gelu" : "dropout", c.x, n, dx, ew_loss, &c);
        free(c.x), free(c.y), free(c.r), free(dx);
    }
    /* closed forms: gelu(1) (tanh form) and a dropout that keeps about 1 - p, reproducibly */
    float one = 1.0f, g;
    shard_gelu_forward(&one, &g, 1);
    assert_true(fabsf(g - 0.841192f) < 1e-5f);
    float *x = randv(10000, 1), *y1 = zeros(10000), *y2 = zeros(10000);
    shard_dropout_forward(x, y1, 10000, 0.25f, 7, 0);
    shard_dropout_forward(x, y2, 10000, 0.25f, 7, 0);
    size_t kept = 0;
    for (int i = 0; i < 10000; i++) kept += y1[i] != 0, assert_true(y1[i] == y2[i]);
    assert_true(kept > 7300 && kept < 7700);
    free(x), free(y1), free(y2);
}

/* The forward that keeps GELU's slope (the GPT's MLP): the same outputs, and the backward as a product
 * with the slope gives the same bits as the backward from the input; over a range that takes in the
 * clamp of tanh (|x| large) and on 3 threads (chunks of the parallel-for) */
static void gelu_slope(void **state) {
    (void)state;
    size_t n = 200003;
    float *x = randv(n, 1), *dy = randv(n, 1);
    for (size_t i = 0; i < n; i++) x[i] = x[i] * 12.0f; /* about -12..12 */
    float *slope = malloc(n * sizeof *slope), *y = zeros(n), *y_slope = zeros(n), *dx = zeros(n), *dx_slope = zeros(n);
    memcpy(slope, x, n * sizeof *slope);
    assert_int_equal(shard_blas_set_threads(3), SHARD_OK);
    shard_gelu_forward(x, y, n);
    shard_gelu_backward(x, dy, dx, n);
    shard_gelu_forward_slope(slope, y_slope, n);
    shard_mul(dy, slope, dx_slope, n);
    assert_int_equal(shard_blas_set_threads(1), SHARD_OK);
    for (size_t i = 0; i < n; i++) {
        if (y_slope[i] != y[i])
            fail_msg("x = %.9g: gelu %.9g with the slope kept, %.9g without", x[i], y_slope[i], y[i]);
        if (dx_slope[i] != dx[i]) fail_msg("x = %.9g: dx %.9g from the slope, %.9g from x", x[i], dx_slope[i], dx[i]);
    }
    free(x), free(dy), free(slope), free(y), free(y_slope), free(dx), free(dx_slope);
}

/* ---------------------------------------------------------------- layer norm */

typedef struct ln_ctx {
    float *x, *g, *b, *y, *mean, *rstd, *r;
    size_t N, C;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    shard_layernorm_forward(c->x, c->g, c->b, 1e-5f, c->y, c->mean, c->rstd, c->N, c->C);
    return dot(c->y, c->r, c->N * c->C);
}

/* C = 7 (the scalar tail alone), 32 (two 16-lane blocks) and 37 (two blocks and a tail of 5): mean and
 * 1/std against double, and the gradients against finite differences */
static void layernorm(void **state) {
    (void)state;
    size_t widths[] = {7, 32, 37};
    for (size_t w = 0, N = 4, C; w < 3 && (C = widths[w]); w++) {
        ln_ctx c = {randv(N * C, 2), randv(C, 1), randv(C, 1), zeros(N * C), zeros(N), zeros(N), randv(N * C, 1), N, C};
        float *dx = zeros(N * C), *dg = zeros(C), *db = zeros(C);
        ln_loss(&c);
        shard_layernorm_backward(c.x, c.g, c.mean, c.rstd, c.r, dx, dg, db, N, C);
        grad_check("layernorm dx", c.x, N * C, dx, ln_loss, &c);
        grad_check("layernorm dgamma", c.g, C, dg, ln_loss, &c);
        grad_check("layernorm dbeta", c.b, C, db, ln_loss, &c);
        free(c.x), free(c.g), free(c.b), free(c.y), free(c.mean), free(c.rstd), free(c.r), free(dx), free(dg), free(db);
    }
}

/* ---------------------------------------------------------------- cross-entropy, softmax */

typedef struct ce_ctx {
    float *logits;
    int32_t *targets;
    size_t N, V;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    float loss;
    assert_int_equal(shard_cross_entropy(c->logits, c->targets, -100, c->N, c->V, &loss, NULL, NULL), SHARD_OK);
    return loss;
}

static void cross_entropy(void **state) {
    (void)state;
    int32_t targets[5] = {2, -100, 0, 4, 1};
    ce_ctx c = {randv(25, 3), targets, 5, 5};
    float *d = zeros(25), loss;
    size_t count;
    assert_int_equal(shard_cross_entropy(c.logits, targets, -100, 5, 5, &loss, &count, d), SHARD_OK);
    assert_int_equal(count, 4);
    for (int v = 0; v < 5; v++) assert_true(d[5 + v] == 0.0f); /* the ignored row */
    grad_check("cross_entropy", c.logits, 25, d, ce_loss, &c);
    /* uniform logits: loss = log V */
    float flat[8] = {0}, l;
    int32_t t2[2] = {1, 3};
    assert_int_equal(shard_cross_entropy(flat, t2, -100, 2, 4, &l, NULL, NULL), SHARD_OK);
    assert_true(fabsf(l - logf(4.0f)) < 1e-6f);
    int32_t bad[1] = {9};
    assert_int_equal(shard_cross_entropy(flat, bad, -100, 1, 4, &l, NULL, NULL), SHARD_ERR_INVALID_ARG);
    float p[4];
    float x[4] = {1, 2, 3, 4};
    shard_softmax_forward(x, p, 1, 4);
    assert_true(fabsf(p[0] + p[1] + p[2] + p[3] - 1.0f) < 1e-6f && p[3] > p[2]);
    free(c.logits), free(d);
}

/* The gradient written over the logits themselves (layers.h allows dlogits == logits): the same loss and
 * gradient bits as into a separate buffer, over several chunks (N * V >= 4 * 32768), a width that is no
 * multiple of 16 (the vector tails) and ignored rows. */
static void cross_entropy_in_place(void **state) {
    (void)state;
    enum { N = 4000, V = 37 };
    int32_t *targets = malloc(N * sizeof *targets);
    for (size_t n = 0; n < N; n++) targets[n] = n % 7 == 3 ? -100 : (int32_t)((n * 13) % V);
    float *logits = randv(N * V, 11), *d = zeros(N * V), *inplace = malloc(N * V * sizeof *inplace);
    memcpy(inplace, logits, N * V * sizeof *inplace);
    float loss[2];
    size_t count[2];
    assert_int_equal(shard_cross_entropy(logits, targets, -100, N, V, &loss[0], &count[0], d), SHARD_OK);
    assert_int_equal(shard_cross_entropy(inplace, targets, -100, N, V, &loss[1], &count[1], inplace), SHARD_OK);
    assert_memory_equal(&loss[0], &loss[1], sizeof loss[0]);
    assert_int_equal(count[0], count[1]);
    assert_memory_equal(d, inplace, N * V * sizeof *d);
    free(targets), free(logits), free(d), free(inplace);
}

/* Softmax rows of every width from 1 to 70 (16-lane blocks plus every tail), logits spread over
 * [-60, 60] so that some fall more than 87 below the row's maximum (exp's clamp: ~1e-38 there),
 * against exp in double: within 1e-6 relative plus the rounding of x - max in float (|x - max| 2^-23
 * relative: exp turns the argument's absolute error into a relative one), or 1e-30 past the clamp. */
static void softmax_widths(void **state) {
    (void)state;
    for (size_t C = 1; C <= 70; C++) {
        float *x = randv(C, 60), *y = zeros(C);
        shard_softmax_forward(x, y, 1, C);
        double m = -INFINITY, sum = 0;
        for (size_t c = 0; c < C; c++) m = fmax(m, x[c]);
        for (size_t c = 0; c < C; c++) sum += exp((double)x[c] - m);
        for (size_t c = 0; c < C; c++) {
            double want = exp((double)x[c] - m) / sum;
            double gap = m - (double)x[c], tol = gap < 87.0 ? (1e-6 + gap * 0x1p-23) * want : 1e-30;
            if (!(fabs(y[c] - want) <= tol)) fail_msg("softmax width %zu: p[%zu] = %.9g, want %.9g", C, c, y[c], want);
        }
        free(x), free(y);
    }
}

/* ---------------------------------------------------------------- embedding */

typedef struct emb_ctx {
    float *table, *y, *r;
    int32_t *ids;
    size_t N, rows, C;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    assert_int_equal(shard_embedding_forward(c->table, c->ids, c->y, c->N, c->rows, c->C), SHARD_OK);
    return dot(c->y, c->r, c->N * c->C);
}

static void embedding(void **state) {
    (void)state;
    int32_t ids[6] = {3, 0, 3, 5, 1, 3}; /* repeated rows accumulate */
    emb_ctx c = {randv(24, 1), zeros(24), randv(24, 1), ids, 6, 6, 4};
    float *dt = zeros(24);
    emb_loss(&c);
    assert_int_equal(shard_embedding_backward(ids, c.r, dt, 6, 6, 4), SHARD_OK);
    grad_check("embedding", c.table, 24, dt, emb_loss, &c);
    int32_t bad[1] = {6};
    assert_int_equal(shard_embedding_forward(c.table, bad, c.y, 1, 6, 4), SHARD_ERR_INVALID_ARG);
    free(c.table), free(c.y), free(c.r), free(dt);
}

/* ---------------------------------------------------------------- attention */

typedef struct att_ctx {
    float *qkv, *y, *att, *r;
    size_t B, T, C, H;
    float p_drop;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    assert_int_equal(
        shard_attention_forward_dropout(c->qkv, c->y, c->att, c->B, c->T, c->C, c->H, c->p_drop, 7, 0, c->H, 0),
        SHARD_OK);
    return dot(c->y, c->r, c->B * c->T * c->C);
}

/* 70 positions: the products run in blocks of 32 rows that skip the masked keys (32, 32 and a part block of
 * 6), with and without dropout on the probabilities; 3 x 4 (batch, head) pairs, more than the 8 chunks, so
 * some chunk runs two pairs on the same scratch */
static void attention_blocks(void **state) {
    (void)state;
    size_t B = 3, T = 70, C = 8, H = 4;
    for (int drop = 0; drop < 2; drop++) {
        att_ctx c = {randv(B * T * 3 * C, 1), zeros(B * T * C), zeros(B * H * T * T), randv(B * T * C, 1), B, T, C, H,
                     drop ? 0.2f : 0.0f};
        float *d = zeros(B * T * 3 * C);
        att_loss(&c);
        for (size_t h = 0; h < B * H; h++) /* each probability row sums to 1 over the causal keys, zeros beyond */
            for (size_t t = 0; t < T; t++) {
                double sum = 0;
                for (size_t j = 0; j < T; j++) {
                    float a = c.att[(h * T + t) * T + j];
                    if (j > t) assert_true(a == 0.0f);
                    sum += a;
                }
                assert_true(fabs(sum - 1.0) < 1e-5);
            }
        assert_int_equal(shard_attention_backward_dropout(c.qkv, c.att, c.r, d, B, T, C, H, c.p_drop, 7, 0, H, 0),
                         SHARD_OK);
        grad_check(drop ? "attention dqkv (70 positions, dropout)" : "attention dqkv (70 positions)", c.qkv,
                   B * T * 3 * C, d, att_loss, &c);
        free(c.qkv), free(c.y), free(c.att), free(c.r), free(d);
    }
}

/* The backward against the formulas in double (dV = P^T dY; dP = dY V^T; dS = P (dP - rowsum(P dP)) / sqrt(D);
 * dQ = dS K; dK = dS^T Q) from the forward's own P, for T = 1..40: rows ending inside, on and past a
 * 16-lane vector, in one and several 32-row blocks; within 1e-5 of the largest gradient element. */
static void attention_backward_exact(void **state) {
    (void)state;
    size_t B = 1, C = 8, H = 2, D = C / H;
    for (size_t T = 1; T <= 40; T++) {
        float *qkv = randv(B * T * 3 * C, 1), *y = zeros(B * T * C), *att = zeros(B * H * T * T),
              *dy = randv(B * T * C, 1);
        float *d = zeros(B * T * 3 * C);
        double *want = calloc(B * T * 3 * C, sizeof *want), *ds = calloc(T * T, sizeof *ds);
        assert_int_equal(shard_attention_forward(qkv, y, att, B, T, C, H), SHARD_OK);
        assert_int_equal(shard_attention_backward(qkv, att, dy, d, B, T, C, H), SHARD_OK);
        double biggest = 0;
        for (size_t h = 0; h < H; h++) {
            const float *P = att + h * T * T;
#define Q_(t, k) qkv[(t)*3 * C + h * D + (k)]
#define K_(t, k) qkv[(t)*3 * C + C + h * D + (k)]
#define V_(t, k) qkv[(t)*3 * C + 2 * C + h * D + (k)]
#define DY_(t, k) dy[(t)*C + h * D + (k)]
            for (size_t t = 0; t < T; t++) {
                double dot = 0;
                for (size_t j = 0; j <= t; j++) {
                    double dp = 0;
                    for (size_t k = 0; k < D; k++) dp += (double)DY_(t, k) * V_(j, k);
                    ds[t * T + j] = dp;
                    dot += P[t * T + j] * dp;
                }
                for (size_t j = 0; j <= t; j++) ds[t * T + j] = P[t * T + j] * (ds[t * T + j] - dot) / sqrt((double)D);
            }
            for (size_t t = 0; t < T; t++)
                for (size_t k = 0; k < D; k++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (size_t j = 0; j <= t; j++) dq += ds[t * T + j] * K_(j, k);
                    for (size_t i = t; i < T; i++)
                        dk += ds[i * T + t] * Q_(i, k), dv += P[i * T + t] * (double)DY_(i, k);
                    want[t * 3 * C + h * D + k] = dq, want[t * 3 * C + C + h * D + k] = dk;
                    want[t * 3 * C + 2 * C + h * D + k] = dv;
                }
#undef Q_
#undef K_
#undef V_
#undef DY_
        }
        for (size_t i = 0; i < B * T * 3 * C; i++) biggest = fmax(biggest, fabs(want[i]));
        for (size_t i = 0; i < B * T * 3 * C; i++)
            if (!(fabs(d[i] - want[i]) <= 1e-5 * biggest + 1e-7))
                fail_msg("attention backward, T = %zu: dqkv[%zu] = %.9g, want %.9g", T, i, d[i], want[i]);
        free(qkv), free(y), free(att), free(dy), free(d), free(want), free(ds);
    }
}

/* The attention's scratch (backward's dS per chunk of pairs; dropout's kept probabilities) comes from the
 * accounted allocator: the caller's activation peak rises by at least one T x T block during the call,
 * and the current bytes are back where they were after it. */
static void attention_scratch_accounted(void **state) {
    (void)state;
    size_t B = 2, T = 48, C = 8, H = 2;
    float *qkv = randv(B * T * 3 * C, 1), *y = zeros(B * T * C), *att = zeros(B * H * T * T), *dy = randv(B * T * C, 1);
    float *d = zeros(B * T * 3 * C);
    for (int drop = 0; drop < 2; drop++) {
        shard_mem_stats before, after;
        shard_mem_stats_reset_peak();
        shard_mem_stats_get(&before);
        assert_int_equal(shard_attention_forward_dropout(qkv, y, att, B, T, C, H, drop ? 0.1f : 0.0f, 3, 0, H, 0),
                         SHARD_OK);
        assert_int_equal(shard_attention_backward_dropout(qkv, att, dy, d, B, T, C, H, drop ? 0.1f : 0.0f, 3, 0, H, 0),
                         SHARD_OK);
        shard_mem_stats_get(&after);
        size_t least = (drop ? 2 : 1) * T * T * sizeof(float);
        if (after.peak_bytes[SHARD_MEM_ACTIVATIONS] < before.current_bytes[SHARD_MEM_ACTIVATIONS] + least)
            fail_msg("attention scratch (dropout %d): activation peak %llu, before %llu, want at least %zu more", drop,
                     (unsigned long long)after.peak_bytes[SHARD_MEM_ACTIVATIONS],
                     (unsigned long long)before.current_bytes[SHARD_MEM_ACTIVATIONS], least);
        assert_true(after.current_bytes[SHARD_MEM_ACTIVATIONS] == before.current_bytes[SHARD_MEM_ACTIVATIONS]);
    }
    /* heads of width 0: nothing to pack, and no NULL scratch reaches memcpy (UBSan's run) */
    assert_int_equal(shard_attention_forward_dropout(qkv, y, att, 1, 5, 0, 2, 0.0f, 3, 0, 2, 0), SHARD_OK);
    assert_int_equal(shard_attention_backward_dropout(qkv, att, dy, d, 1, 5, 0, 2, 0.0f, 3, 0, 2, 0), SHARD_OK);
    free(qkv), free(y), free(att), free(dy), free(d);
}

static void attention(void **state) {
    (void)state;
    size_t B = 2, T = 5, C = 6, H = 2;
    att_ctx c = {
        randv(B * T * 3 * C, 1), zeros(B * T * C), zeros(B * H * T * T), randv(B * T * C, 1), B, T, C, H, 0.0f};
    float *d = zeros(B * T * 3 * C);
    att_loss(&c);
    assert_int_equal(shard_attention_backward(c.qkv, c.att, c.r, d, B, T, C, H), SHARD_OK);
    grad_check("attention dqkv", c.qkv, B * T * 3 * C, d, att_loss, &c);
    /* causal: the first position attends only to itself, so its output is its own v */
    for (size_t h = 0; h < H; h++)
        for (size_t k = 0; k < C / H; k++)
            assert_true(fabsf(c.y[h * (C / H) + k] - c.qkv[2 * C + h * (C / H) + k]) < 1e-6f);
    assert_int_equal(shard_attention_forward(c.qkv, c.y, c.att, B, T, C, 4), SHARD_ERR_INVALID_ARG);
    free(c.qkv), free(c.y), free(c.att), free(c.r), free(d);
}

/* ---------------------------------------------------------------- conv2d, max-pool */

typedef struct conv_ctx {
    float *x, *w, *b, *y, *r;
    size_t N, Cin, H, W, Cout, K, pad, out;
} conv_ctx;

static double conv_loss(void *p) {
    conv_ctx *c = p;
    assert_int_equal(shard_conv2d_forward(c->x, c->w, c->b, c->y, c->N, c->Cin, c->H, c->W, c->Cout, c->K, c->pad),
                     SHARD_OK);
    return dot(c->y, c->r, c->out);
}

static void conv2d(void **state) {
    (void)state;
    for (size_t pad = 0; pad <= 1; pad++) {
        size_t N = 2, Cin = 2, H = 5, W = 4, Cout = 3, K = 3, Ho = H + 2 * pad - 2, Wo = W + 2 * pad - 2;
        size_t out = N * Cout * Ho * Wo;
        conv_ctx c = {randv(N * Cin * H * W, 1),
                      randv(Cout * Cin * K * K, 1),
                      randv(Cout, 1),
                      zeros(out),
                      randv(out, 1),
                      N,
                      Cin,
                      H,
                      W,
                      Cout,
                      K,
                      pad,
                      out};
        float *dx = zeros(N * Cin * H * W), *dw = zeros(Cout * Cin * K * K), *db = zeros(Cout);
        conv_loss(&c);
        assert_int_equal(shard_conv2d_backward(c.x, c.w, c.r, dx, dw, db, N, Cin, H, W, Cout, K, pad), SHARD_OK);
        grad_check("conv2d dx", c.x, N * Cin * H * W, dx, conv_loss, &c);
        grad_check("conv2d dw", c.w, Cout * Cin * K * K, dw, conv_loss, &c);
        grad_check("conv2d db", c.b, Cout, db, conv_loss, &c);
        free(c.x), free(c.w), free(c.b), free(c.y), free(c.r), free(dx), free(dw), free(db);
    }
}

typedef struct pool_ctx {
    float *x, *y, *r;
    uint32_t *arg;
} pool_ctx;

static double pool_loss(void *p) {
    pool_ctx *c = p;
    shard_maxpool2d_forward(c->x, c->y, c->arg, 2, 3, 4, 6, 2);
    return dot(c->y, c->r, 2 * 3 * 2 * 3);
}

static void maxpool(void **state) {
    (void)state;
    size_t n = 2 * 3 * 4 * 6;
    pool_ctx c = {zeros(n), zeros(36), randv(36, 1), calloc(36, sizeof(uint32_t))};
    for (size_t i = 0; i < n; i++) c.x[i] = (float)((i * 37) % n) * 0.1f; /* distinct, 0.1 apart: no ties */
    float *dx = zeros(n);
    pool_loss(&c);
    shard_maxpool2d_backward(c.r, c.arg, dx, 2, 3, 4, 6, 2);
    grad_check("maxpool", c.x, n, dx, pool_loss, &c);
    free(c.x), free(c.y), free(c.r), free(c.arg), free(dx);
}

/* NaN propagates as in PyTorch: relu(NaN) = NaN and its gradient passes; a window holding a NaN pools to NaN. */
static void nan_propagates(void **state) {
    (void)state;
    float x[4] = {NAN, -1.0f, 2.0f, -0.0f}, y[4], dy[4] = {5, 6, 7, 8}, dx[4];
    shard_relu_forward(x, y, 4);
    assert_true(isnan(y[0]) && y[1] == 0.0f && y[2] == 2.0f && y[3] == 0.0f && !signbit(y[3]));
    shard_relu_backward(x, dy, dx, 4);
    assert_true(dx[0] == 5.0f && dx[1] == 0.0f && dx[2] == 7.0f && dx[3] == 0.0f);
    float plane[4] = {1.0f, NAN, 3.0f, 2.0f}, out;
    uint32_t arg;
    shard_maxpool2d_forward(plane, &out, &arg, 1, 1, 2, 2, 2);
    assert_true(isnan(out) && arg == 1);
    plane[1] = 0.5f;
    shard_maxpool2d_forward(plane, &out, &arg, 1, 1, 2, 2, 2);
    assert_true(out == 3.0f && arg == 2);
    float two[4] = {NAN, 1.0f, NAN, 2.0f}; /* several NaNs: the last takes the gradient, as PyTorch's CPU kernel */
    shard_maxpool2d_forward(two, &out, &arg, 1, 1, 2, 2, 2);
    assert_true(isnan(out) && arg == 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nan_propagates),
        cmocka_unit_test(linear),
        cmocka_unit_test(linear_bias_grad_wide),
        cmocka_unit_test(softmax_widths),
        cmocka_unit_test(elementwise),
        cmocka_unit_test(gelu_slope),
        cmocka_unit_test(layernorm),
        cmocka_unit_test(cross_entropy),
        cmocka_unit_test(cross_entropy_in_place),
        cmocka_unit_test(embedding),
        cmocka_unit_test(attention),
        cmocka_unit_test(attention_blocks),
        cmocka_unit_test(attention_backward_exact),
        cmocka_unit_test(attention_scratch_accounted),
        cmocka_unit_test(conv2d),
        cmocka_unit_test(maxpool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
