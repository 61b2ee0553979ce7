/* test_tp.c — the tensor-parallel building blocks of tp.h against the
 * single-device layers of layers.h, on every rank count the harness runs
 * (thread ranks or MPI): each rank holds its piece of the same whole data,
 * runs the block, and its result must be its piece of the single-device
 * result.  Row counts and widths are chosen so that no split is even (the
 * first ranks hold one more), and every linear runs with and without
 * sequence parallel (the tokens split over the ranks outside the layer).
 *
 * Products summed over ranks round differently from the whole product, so
 * linear results are compared to a relative 1e-5; lookups, copies and the
 * redistributions are exact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard/shard.h"

enum { N = 7, IN = 6, OUT = 8, V = 11, C = 5 };

/* The same values on every rank: a seeded LCG in [-1, 1). */
static void fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* Columns c0 .. c0 + cn - 1 of a [rows, cols] matrix. */
static void columns(const float *m, size_t rows, size_t cols, size_t c0, size_t cn, float *out) {
    for (size_t r = 0; r < rows; r++) memcpy(out + r * cn, m + r * cols + c0, cn * sizeof *out);
}

static void check_close(test_ctx *t, const float *got, const float *want, size_t n, const char *what) {
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + 1e-3);
        if (!(err <= worst)) worst = err, at = i;
    }
    CHECK(t, worst <= 1e-5, "%s: element %zu is %.9g, one device %.9g", what, at, n ? got[at] : 0.0,
          n ? want[at] : 0.0);
}

static void check_same(test_ctx *t, const float *got, const float *want, size_t n, const char *what) {
    size_t bad = 0;
    while (bad < n && got[bad] == want[bad]) bad++;
    CHECK(t, bad == n, "%s: element %zu is %.9g, expected %.9g", what, bad, bad < n ? got[bad] : 0.0,
          bad < n ? want[bad] : 0.0);
}

/* This rank's part of n (split.h's rule). */
static void part(test_ctx *t, size_t n, size_t *first, size_t *count) {
    shard_split_even(n, (size_t)t->size, (size_t)t->rank, first, count);
}

/* The single-device linear over seeded x[N, IN], w[IN, OUT], b[OUT] and output gradient dy[N, OUT]:
 * y, and the gradients dx, dw, db. */
static void linear_reference(test_ctx *t, uint64_t seed, float *x, float *w, float *b, float *dy, float *y, float *dx,
                             float *dw, float *db) {
    fill(x, N * IN, seed), fill(w, IN * OUT, seed + 1), fill(b, OUT, seed + 2), fill(dy, N * OUT, seed + 3);
    CHECK_OK(t, shard_linear_forward(x, w, b, y, N, IN, OUT), "one device forward");
    memset(dw, 0, IN * OUT * sizeof *dw), memset(db, 0, OUT * sizeof *db);
    CHECK_OK(t, shard_linear_backward(x, w, dy, dx, dw, db, N, IN, OUT), "one device backward");
}

static void case_column(test_ctx *t) {
    float x[N * IN], w[IN * OUT], b[OUT], dy[N * OUT], y[N * OUT], dx[N * IN], dw[IN * OUT], db[OUT];
    linear_reference(t, 1, x, w, b, dy, y, dx, dw, db);
    size_t c0, cn, r0, rn;
    part(t, OUT, &c0, &cn);
    for (int sp = 0; sp <= 1; sp++) {
        shard_tp_place p = {.comm = t->comm, .split = 1, .tokens = sp};
        float xl[N * IN], wl[IN * OUT], yl[N * OUT], dyl[N * OUT], want[N * OUT], dxw[N * IN], dxl[N * IN];
        float dwl[IN * OUT] = {0}, dbl[OUT] = {0};
        shard_tp_token_range(t->comm, sp, N, &r0, &rn);
        memset(xl, 0, sizeof xl); /* under sequence parallel only this rank's tokens are there */
        memcpy(xl + r0 * IN, x + r0 * IN, rn * IN * sizeof *x);
        columns(w, IN, OUT, c0, cn, wl);
        CHECK_OK(t, shard_tp_column_forward(&p, xl, wl, b + c0, yl, N, IN, cn), "column forward sp=%d", sp);
        check_same(t, xl, x, N * IN, sp ? "column forward: the gathered tokens" : "column forward: the input");
        columns(y, N, OUT, c0, cn, want);
        check_close(t, yl, want, N * cn, sp ? "column forward, sequence parallel" : "column forward");
        columns(dy, N, OUT, c0, cn, dyl);
        CHECK_OK(t, shard_tp_column_backward(&p, xl, wl, dyl, dxw, sp ? dxl : dxw, dwl, dbl, N, IN, cn),
                 "column backward sp=%d", sp);
        check_close(t, sp ? dxl : dxw, dx + r0 * IN, rn * IN, "column backward: the input's gradient");
        columns(dw, IN, OUT, c0, cn, want);
        check_close(t, dwl, want, IN * cn, "column backward: the weight's gradient");
        check_close(t, dbl, db + c0, cn, "column backward: the bias's gradient");
    }
}

static void case_row(test_ctx *t) {
    float x[N * IN], w[IN * OUT], b[OUT], dy[N * OUT], y[N * OUT], dx[N * IN], dw[IN * OUT], db[OUT];
    linear_reference(t, 5, x, w, b, dy, y, dx, dw, db);
    size_t i0, in, r0, rn;
    part(t, IN, &i0, &in);
    for (int sp = 0; sp <= 1; sp++) {
        shard_tp_place p = {.comm = t->comm, .split = 1, .tokens = sp};
        float xl[N * IN], yw[N * OUT], yl[N * OUT], dyw[N * OUT], dxl[N * IN], want[N * IN];
        float dwl[IN * OUT] = {0}, dbl[OUT] = {0};
        shard_tp_token_range(t->comm, sp, N, &r0, &rn);
        columns(x, N, IN, i0, in, xl);
        const float *wl = w + i0 * OUT; /* this rank's rows */
        CHECK_OK(t, shard_tp_row_forward(&p, xl, wl, b, yw, sp ? yl : yw, N, in, OUT), "row forward sp=%d", sp);
        check_close(t, sp ? yl : yw, y + r0 * OUT, rn * OUT, sp ? "row forward, sequence parallel" : "row forward");
        CHECK_OK(t, shard_tp_row_backward(&p, xl, wl, dy + r0 * OUT, dyw, dxl, dwl, dbl, N, in, OUT),
                 "row backward sp=%d", sp);
        columns(dx, N, IN, i0, in, want);
        check_close(t, dxl, want, N * in, "row backward: the input's gradient");
        check_close(t, dwl, dw + i0 * OUT, in * OUT, "row backward: the weight's gradient");
        check_close(t, dbl, db, OUT, "row backward: the bias's gradient");
    }
    /* a layer placed whole (P()) on every rank: the single-device result, the bias added once */
    shard_tp_place whole = {.comm = t->comm, .split = 0, .tokens = 0};
    float yw[N * OUT];
    CHECK_OK(t, shard_tp_row_forward(&whole, x, w, b, yw, yw, N, IN, OUT), "row forward, whole");
    check_same(t, yw, y, N * OUT, "row forward of a layer placed whole");
}

static void case_embedding(test_ctx *t) {
    float table[V * C], dy[N * C], y[N * C], dtable[V * C] = {0};
    int32_t ids[N] = {3, 0, 10, 3, 7, 5, 9};
    fill(table, V * C, 9), fill(dy, N * C, 10);
    CHECK_OK(t, shard_embedding_forward(table, ids, y, N, V, C), "one device forward");
    CHECK_OK(t, shard_embedding_backward(ids, dy, dtable, N, V, C), "one device backward");
    size_t v0, vn, r0, rn;
    part(t, V, &v0, &vn);
    for (int sp = 0; sp <= 1; sp++) {
        shard_tp_place p = {.comm = t->comm, .split = 1, .tokens = sp};
        float yw[N * C], yl[N * C], dyw[N * C], dtl[V * C] = {0};
        shard_tp_token_range(t->comm, sp, N, &r0, &rn);
        CHECK_OK(t, shard_tp_embedding_forward(&p, table + v0 * C, ids, yw, sp ? yl : yw, N, v0, vn, V, C),
                 "embedding forward sp=%d", sp);
        check_same(t, sp ? yl : yw, y + r0 * C, rn * C, sp ? "embedding, sequence parallel" : "embedding");
        CHECK_OK(t, shard_tp_embedding_backward(&p, ids, dy + r0 * C, dyw, dtl, N, v0, vn, V, C),
                 "embedding backward sp=%d", sp);
        check_same(t, dtl, dtable + v0 * C, vn * C, "embedding backward: this rank's rows of the table");
    }
    int32_t bad[N] = {0, 1, 2, V, 4, 5, 6};
    float yw[N * C];
    shard_tp_place p = {.comm = t->comm, .split = 1};
    CHECK(t, shard_tp_embedding_forward(&p, table + v0 * C, bad, yw, yw, N, v0, vn, V, C) < 0,
          "an id outside the vocabulary is refused");
}

static void case_cross_entropy(test_ctx *t) {
    float logits[N * V], d[N * V];
    int32_t targets[N] = {1, -100, 10, 0, 5, 5, 7};
    fill(logits, N * V, 11);
    for (size_t i = 0; i < N * V; i++) logits[i] *= 4;
    double want = 0, got = 0;
    CHECK_OK(t, shard_cross_entropy_sum(logits, targets, -100, N, V, 6.0, &want, NULL, d), "one device");
    size_t v0, vn;
    part(t, V, &v0, &vn);
    float mine[N * V], dwant[N * V];
    columns(logits, N, V, v0, vn, mine);
    /* the gradient written over the logits, as a training model does */
    CHECK_OK(t, shard_tp_cross_entropy(t->comm, mine, targets, -100, N, v0, vn, V, 6.0, &got, mine), "split");
    CHECK_NEAR(t, got, want, 1e-6 * fabs(want), "vocabulary-parallel loss");
    columns(d, N, V, v0, vn, dwant);
    check_close(t, mine, dwant, N * vn, "vocabulary-parallel gradient of the logits");
}

static void case_redistribute(test_ctx *t) {
    enum { W = 3 };
    float whole[N * W], sum[N * W], local[N * W];
    size_t r0, rn;
    shard_tp_token_range(t->comm, 1, N, &r0, &rn);
    for (size_t i = 0; i < N * W; i++) sum[i] = (float)i * (float)(t->size * (t->size + 1) / 2);
    /* partial -> replicated: rank r holds (r + 1) x i */
    for (size_t i = 0; i < N * W; i++) whole[i] = (float)i * (float)(t->rank + 1);
    CHECK_OK(t, shard_tp_redistribute(t->comm, whole, whole, N, W, SHARD_TP_PARTIAL, SHARD_TP_REPLICATED), "sum");
    check_same(t, whole, sum, N * W, "partial -> replicated");
    /* partial -> split over tokens */
    for (size_t i = 0; i < N * W; i++) whole[i] = (float)i * (float)(t->rank + 1);
    CHECK_OK(t, shard_tp_redistribute(t->comm, whole, local, N, W, SHARD_TP_PARTIAL, SHARD_TP_TOKENS), "scatter");
    check_same(t, local, sum + r0 * W, rn * W, "partial -> split over tokens");
    /* split over tokens -> replicated, from a buffer apart from the whole */
    for (size_t i = 0; i < rn * W; i++) local[i] = (float)(r0 * W + i);
    memset(whole, 0, sizeof whole);
    CHECK_OK(t, shard_tp_redistribute(t->comm, whole, local, N, W, SHARD_TP_TOKENS, SHARD_TP_REPLICATED), "gather");
    for (size_t i = 0; i < N * W; i++) sum[i] = (float)i;
    check_same(t, whole, sum, N * W, "split over tokens -> replicated");
    /* replicated -> split over tokens: this rank's rows */
    memset(local, 0, sizeof local);
    CHECK_OK(t, shard_tp_redistribute(t->comm, whole, local, N, W, SHARD_TP_REPLICATED, SHARD_TP_TOKENS), "rows");
    check_same(t, local, sum + r0 * W, rn * W, "replicated -> split over tokens");
    /* no collective makes a summand of a whole */
    shard_status s = shard_tp_redistribute(t->comm, whole, local, N, W, SHARD_TP_REPLICATED, SHARD_TP_PARTIAL);
    CHECK(t, s < 0 && strstr(shard_last_error(), "replicated P() to partial"), "replicated -> partial refused: %s",
          shard_last_error());
    /* the single-device forms: NULL is one rank */
    for (size_t i = 0; i < N * W; i++) whole[i] = (float)i;
    CHECK_OK(t, shard_tp_redistribute(NULL, whole, local, N, W, SHARD_TP_PARTIAL, SHARD_TP_TOKENS), "one rank");
    check_same(t, local, sum, N * W, "one rank: partial -> split over tokens is every row");
}

static const test_case cases[] = {{"column", case_column},
                                  {"row", case_row},
                                  {"embedding", case_embedding},
                                  {"cross_entropy", case_cross_entropy},
                                  {"redistribute", case_redistribute}};

int main(int argc, char **argv) {
    shard_blas_set_threads(1);
    return test_main(argc, argv, "test_tp", cases, sizeof cases / sizeof cases[0]);
}
