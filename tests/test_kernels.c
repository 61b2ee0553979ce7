/* test_kernels.c — every CPU kernel (src/kernels/) against its plain reference (src/kernels/reference.h),
 * over odd shapes, on 1, 2 and 3 threads.
 *
 * A case is one op on one shape at one thread count, named "<op> K=v ... threads=n" (for example
 * "layernorm_backward N=37 C=65 threads=3"); its name is printed as it runs.  The shapes are sizes 1, 7,
 * 37, 65 and 129 and ragged combinations of them (tails of every vector width, heads of odd widths,
 * ignored targets), plus one larger shape per op where the kernel cuts its work into chunks for the
 * threads (chunks are cut by size, so small shapes run as one).
 *
 *   test_kernels                 every case; exit 1 if any failed
 *   test_kernels --list          the case names, one a line
 *   test_kernels --op NAME       the cases of one op
 *   test_kernels --case 'NAME'   exactly one case
 *
 * Inputs come from a generator seeded by the case's name without its thread count: a rerun sees the
 * same numbers, and every thread count the same inputs.  A fast result passes where
 * |fast - reference| <= atol + rtol |reference| element by element, with a tolerance per op (the
 * references sum in double; the fast kernels round differently, and exp and tanh are polynomials).  A
 * failure prints the case, the output, the first index past the tolerance, both values and the
 * tolerance. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/reference.h"
#include "shard/blas.h"
#include "shard/layers.h"
#include "shard/optim.h"

enum { MAX_DIMS = 7, MAX_BUFFERS = 48 };

typedef struct op_def op_def;

typedef struct kcase {
    const op_def *op;
    size_t d[MAX_DIMS]; /* the shape, in the order of the op's keys */
    int threads;
    char name[192];
} kcase;

struct op_def {
    const char *name;
    const char *keys[MAX_DIMS]; /* the shape's names, NULL-terminated */
    const size_t (*shapes)[MAX_DIMS];
    size_t count;
    int (*run)(const kcase *c); /* failed checks: 0 passes */
    double atol, rtol;
};

/* ---------------------------------------------------------------- inputs, freed after each case */

static uint64_t rng_state;
static void *buffers[MAX_BUFFERS];
static size_t buffer_count;

static uint64_t next_random(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void *keep(void *p) {
    if (!p || buffer_count == MAX_BUFFERS) {
        fprintf(stderr, "test_kernels: out of memory or of buffer slots (%d)\n", MAX_BUFFERS);
        exit(2);
    }
    return buffers[buffer_count++] = p;
}

static float *zeros(size_t n) { return keep(calloc(n ? n : 1, sizeof(float))); }

static float *uniform(size_t n, float lo, float hi) {
    float *v = zeros(n);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (float)((double)(next_random() >> 11) * 0x1.0p-53);
    return v;
}

static float *copy(const float *x, size_t n) { return memcpy(zeros(n), x, n * sizeof *x); }

static int32_t *ids(size_t n, size_t below) {
    int32_t *v = keep(calloc(n ? n : 1, sizeof *v));
    for (size_t i = 0; i < n; i++) v[i] = (int32_t)(next_random() % below);
    return v;
}

static void free_buffers(void) {
    while (buffer_count) free(buffers[--buffer_count]);
}

/* ---------------------------------------------------------------- checks */

static int close_to(const kcase *c, const char *what, size_t i, double got, double want) {
    double tol = c->op->atol + c->op->rtol * fabs(want);
    if (fabs(got - want) <= tol) return 1;
    printf("FAIL %s: %s[%zu] = %.9g, reference %.9g, |difference| %.3g > tolerance %.3g (atol %g + rtol %g x "
           "|reference|)\n",
           c->name, what, i, got, want, fabs(got - want), tol, c->op->atol, c->op->rtol);
    return 0;
}

/* 1 (a failed check) at the first element past the tolerance, else 0 */
static int check(const kcase *c, const char *what, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!close_to(c, what, i, got[i], want[i])) return 1;
    return 0;
}

static int check_value(const kcase *c, const char *what, double got, double want) {
    return !close_to(c, what, 0, got, want);
}

static int check_ok(const kcase *c, const char *what, shard_status s) {
    if (s == SHARD_OK) return 0;
    printf("FAIL %s: %s returned %d: %s\n", c->name, what, (int)s, shard_last_error());
    return 1;
}

/* ---------------------------------------------------------------- matrix products, linear */

/* op(X) is rows x cols; X is stored with a row stride 3 longer than its row (the strides are honoured) */
static size_t stride_of(int transposed, size_t rows, size_t cols) { return (transposed ? rows : cols) + 3; }

static int run_sgemm_either(const kcase *c, int with_bias) {
    size_t M = c->d[0], N = c->d[1], K = c->d[2];
    int ta = (int)c->d[3], tb = (int)c->d[4];
    size_t lda = stride_of(ta, M, K), ldb = stride_of(tb, K, N), ldc = N + 3;
    const float *A = uniform((ta ? K : M) * lda, -1, 1), *B = uniform((tb ? N : K) * ldb, -1, 1);
    const float *bias = with_bias ? uniform(N, -1, 1) : NULL;
    float *C = uniform(M * ldc, -1, 1), *want = copy(C, M * ldc); /* C's padding must stay as it was */
    shard_status s = with_bias ? shard_sgemm_bias(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, bias, C, ldc)
                               : shard_sgemm(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C, ldc);
    shard__ref_sgemm(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, bias, 0.5f, want, ldc);
    return check_ok(c, "the product", s) || check(c, "C", C, want, M * ldc);
}

static int run_sgemm(const kcase *c) { return run_sgemm_either(c, 0); }
static int run_sgemm_bias(const kcase *c) { return run_sgemm_either(c, 1); }

static int run_linear_forward(const kcase *c) {
    size_t N = c->d[0], in = c->d[1], out = c->d[2];
    const float *x = uniform(N * in, -1, 1), *W = uniform(in * out, -1, 1), *b = uniform(out, -1, 1);
    float *y = zeros(N * out), *want = zeros(N * out);
    shard_status s = shard_linear_forward(x, W, b, y, N, in, out);
    shard__ref_linear_forward(x, W, b, want, N, in, out);
    return check_ok(c, "shard_linear_forward", s) || check(c, "y", y, want, N * out);
}

static int run_linear_backward(const kcase *c) {
    size_t N = c->d[0], in = c->d[1], out = c->d[2];
    const float *x = uniform(N * in, -1, 1), *W = uniform(in * out, -1, 1), *dy = uniform(N * out, -1, 1);
    float *dx = zeros(N * in), *dW = uniform(in * out, -1, 1), *db = uniform(out, -1, 1); /* dW, db are added to */
    float *want_dx = zeros(N * in), *want_dW = copy(dW, in * out), *want_db = copy(db, out);
    shard_status s = shard_linear_backward(x, W, dy, dx, dW, db, N, in, out);
    shard__ref_linear_backward(x, W, dy, want_dx, want_dW, want_db, N, in, out);
    return check_ok(c, "shard_linear_backward", s) || check(c, "dx", dx, want_dx, N * in) ||
        check(c, "dW", dW, want_dW, in * out) || check(c, "db", db, want_db, out);
}

/* ---------------------------------------------------------------- element-wise */

/* a unary or binary kernel and its reference, on inputs in [-4, 4] */
typedef void (*unary_fn)(const float *x, float *y, size_t n);
typedef void (*binary_fn)(const float *a, const float *b, float *y, size_t n);

static int run_unary(const kcase *c, unary_fn fast, unary_fn ref) {
    size_t n = c->d[0];
    const float *x = uniform(n, -4, 4);
    float *y = zeros(n), *want = zeros(n);
    fast(x, y, n), ref(x, want, n);
    return check(c, "y", y, want, n);
}

static int run_binary(const kcase *c, binary_fn fast, binary_fn ref) {
    size_t n = c->d[0];
    const float *a = uniform(n, -4, 4), *b = uniform(n, -4, 4);
    float *y = zeros(n), *want = zeros(n);
    fast(a, b, y, n), ref(a, b, want, n);
    return check(c, "y", y, want, n);
}

static int run_relu_forward(const kcase *c) { return run_unary(c, shard_relu_forward, shard__ref_relu_forward); }
static int run_gelu_forward(const kcase *c) { return run_unary(c, shard_gelu_forward, shard__ref_gelu_forward); }
static int run_relu_backward(const kcase *c) { return run_binary(c, shard_relu_backward, shard__ref_relu_backward); }
static int run_gelu_backward(const kcase *c) { return run_binary(c, shard_gelu_backward, shard__ref_gelu_backward); }
static int run_add(const kcase *c) { return run_binary(c, shard_add, shard__ref_add); }
static int run_mul(const kcase *c) { return run_binary(c, shard_mul, shard__ref_mul); }

static int run_gelu_forward_slope(const kcase *c) {
    size_t n = c->d[0];
    float *x = uniform(n, -4, 4), *want_x = copy(x, n), *y = zeros(n), *want_y = zeros(n);
    shard_gelu_forward_slope(x, y, n);
    shard__ref_gelu_forward_slope(want_x, want_y, n);
    return check(c, "y", y, want_y, n) || check(c, "slope (x)", x, want_x, n);
}

static int run_dropout(const kcase *c) {
    size_t n = c->d[0];
    float p = (float)c->d[1] / 100.0f;
    const float *x = uniform(n, -4, 4);
    float *y = zeros(n), *dx = zeros(n), *want = zeros(n);
    shard_dropout_forward(x, y, n, p, 11, n);
    shard_dropout_backward(x, dx, n, p, 11, n);
    shard__ref_dropout(x, want, n, p, 11, n);
    return check(c, "y", y, want, n) || check(c, "dx", dx, want, n);
}

/* ---------------------------------------------------------------- layer norm, softmax, cross-entropy */

/* rows of x[N, C] with a mean and spread of their own */
static float *rows_with_offsets(size_t N, size_t C) {
    float *x = uniform(N * C, -2, 2);
    for (size_t n = 0; n < N; n++)
        for (size_t c = 0; c < C; c++) x[n * C + c] = x[n * C + c] * (float)(1 + n % 3) + (float)(n % 5) - 2.0f;
    return x;
}

static int run_layernorm_forward(const kcase *c) {
    size_t N = c->d[0], C = c->d[1];
    const float *x = rows_with_offsets(N, C), *gamma = uniform(C, 0.5f, 1.5f), *beta = uniform(C, -1, 1);
    float *y = zeros(N * C), *mean = zeros(N), *rstd = zeros(N);
    float *want_y = zeros(N * C), *want_mean = zeros(N), *want_rstd = zeros(N);
    shard_layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd, N, C);
    shard__ref_layernorm_forward(x, gamma, beta, 1e-5f, want_y, want_mean, want_rstd, N, C);
    return check(c, "y", y, want_y, N * C) || check(c, "mean", mean, want_mean, N) ||
        check(c, "rstd", rstd, want_rstd, N);
}

static int run_layernorm_backward(const kcase *c) {
    size_t N = c->d[0], C = c->d[1];
    const float *x = rows_with_offsets(N, C), *gamma = uniform(C, 0.5f, 1.5f), *beta = uniform(C, -1, 1);
    const float *dy = uniform(N * C, -1, 1);
    float *y = zeros(N * C), *mean = zeros(N), *rstd = zeros(N); /* the saved statistics, given to both */
    shard__ref_layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd, N, C);
    float *dx = zeros(N * C), *dgamma = uniform(C, -1, 1), *dbeta = uniform(C, -1, 1);
    float *want_dx = zeros(N * C), *want_dgamma = copy(dgamma, C), *want_dbeta = copy(dbeta, C);
    shard_layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, N, C);
    shard__ref_layernorm_backward(x, gamma, mean, rstd, dy, want_dx, want_dgamma, want_dbeta, N, C);
    return check(c, "dx", dx, want_dx, N * C) || check(c, "dgamma", dgamma, want_dgamma, C) ||
        check(c, "dbeta", dbeta, want_dbeta, C);
}

static int run_softmax_forward(const kcase *c) {
    size_t N = c->d[0], C = c->d[1];
    const float *x = uniform(N * C, -8, 8);
    float *y = zeros(N * C), *want = zeros(N * C);
    shard_softmax_forward(x, y, N, C);
    shard__ref_softmax_forward(x, want, N, C);
    return check(c, "y", y, want, N * C);
}

/* targets in 0..V-1, every fifth row (from row 3) ignored */
enum { IGNORE = -100 };

static int32_t *targets_with_ignored(size_t N, size_t V) {
    int32_t *t = ids(N, V);
    for (size_t n = 3; n < N; n += 5) t[n] = IGNORE;
    return t;
}

static int run_cross_entropy(const kcase *c) {
    size_t N = c->d[0], V = c->d[1], count = 0, want_count = 0;
    const float *logits = uniform(N * V, -6, 6);
    const int32_t *t = targets_with_ignored(N, V);
    float loss = 0, loss_in_place = 0, *d = zeros(N * V), *in_place = copy(logits, N * V), *want_d = zeros(N * V);
    shard_status s = shard_cross_entropy(logits, t, IGNORE, N, V, &loss, &count, d);
    if (s == SHARD_OK) s = shard_cross_entropy(in_place, t, IGNORE, N, V, &loss_in_place, NULL, in_place);
    shard__ref_cross_entropy_sum(logits, t, IGNORE, N, V, 1.0, &want_count, NULL);
    double want = shard__ref_cross_entropy_sum(logits, t, IGNORE, N, V, (double)want_count, NULL, want_d);
    if (check_ok(c, "shard_cross_entropy", s)) return 1;
    if (count != want_count) {
        printf("FAIL %s: count %zu, reference %zu\n", c->name, count, want_count);
        return 1;
    }
    return check_value(c, "loss", loss, want) || check(c, "dlogits", d, want_d, N * V) ||
        check_value(c, "loss (in place)", loss_in_place, want) ||
        check(c, "dlogits (in place)", in_place, want_d, N * V);
}

static int run_cross_entropy_sum(const kcase *c) {
    size_t N = c->d[0], V = c->d[1];
    const float *logits = uniform(N * V, -6, 6);
    const int32_t *t = targets_with_ignored(N, V);
    float *d = zeros(N * V), *want_d = zeros(N * V);
    double loss = 0, want = shard__ref_cross_entropy_sum(logits, t, IGNORE, N, V, 1000.0, NULL, want_d);
    shard_status s = shard_cross_entropy_sum(logits, t, IGNORE, N, V, 1000.0, &loss, NULL, d);
    return check_ok(c, "shard_cross_entropy_sum", s) || check_value(c, "loss", loss, want) ||
        check(c, "dlogits", d, want_d, N * V);
}

/* part p's columns [first, first + count) of n over `parts`, the first n % parts parts one longer */
static void part_range(size_t n, size_t parts, size_t p, size_t *first, size_t *count) {
    *count = n / parts + (p < n % parts);
    *first = p * (n / parts) + (p < n % parts ? p : n % parts);
}

/* The vocabulary-split steps over `parts` column slices, their results combined as the ranks' all-reduces
 * would (maximum; sum in part order), against the whole reference. */
static int run_cross_entropy_split(const kcase *c) {
    size_t N = c->d[0], V = c->d[1], parts = c->d[2], used = 0;
    const float *logits = uniform(N * V, -6, 6);
    const int32_t *t = targets_with_ignored(N, V);
    float *want_d = zeros(N * V), *mx = zeros(N), *part_mx = zeros(N), *d[8];
    double *st = keep(calloc(2 * N, sizeof *st)), *part_st = keep(calloc(2 * N, sizeof *part_st));
    if (check_ok(c, "shard__cross_entropy_check_targets", shard__cross_entropy_check_targets(t, IGNORE, N, V, &used)))
        return 1;
    double want = shard__ref_cross_entropy_sum(logits, t, IGNORE, N, V, (double)used, NULL, want_d);
    for (size_t n = 0; n < N; n++) mx[n] = -INFINITY;
    for (size_t p = 0; p < parts; p++) { /* this part's logits, then (in place) its gradient */
        size_t v0, Vl;
        part_range(V, parts, p, &v0, &Vl);
        d[p] = zeros(N * Vl);
        for (size_t n = 0; n < N; n++) memcpy(d[p] + n * Vl, logits + n * V + v0, Vl * sizeof(float));
        shard__cross_entropy_split_max(d[p], N, Vl, part_mx);
        for (size_t n = 0; n < N; n++) mx[n] = part_mx[n] > mx[n] ? part_mx[n] : mx[n];
    }
    for (size_t p = 0; p < parts; p++) {
        size_t v0, Vl;
        part_range(V, parts, p, &v0, &Vl);
        shard__cross_entropy_split_exp(d[p], t, IGNORE, N, v0, Vl, mx, part_st, d[p]);
        for (size_t i = 0; i < 2 * N; i++) st[i] += part_st[i];
    }
    int failed = 0;
    for (size_t p = 0; p < parts && !failed; p++) {
        size_t v0, Vl;
        part_range(V, parts, p, &v0, &Vl);
        double scale = used ? 1.0 / (double)used : 0.0;
        double loss = shard__cross_entropy_split_finish(t, IGNORE, N, v0, Vl, mx, st, scale, d[p]) * scale;
        failed = check_value(c, "loss", loss, want);
        for (size_t n = 0; n < N && !failed; n++) failed = check(c, "dlogits", d[p] + n * Vl, want_d + n * V + v0, Vl);
    }
    return failed;
}

/* ---------------------------------------------------------------- embedding */

static int run_embedding_forward(const kcase *c) {
    size_t N = c->d[0], rows = c->d[1], C = c->d[2];
    const float *table = uniform(rows * C, -1, 1);
    const int32_t *id = ids(N, rows);
    float *y = zeros(N * C), *want = zeros(N * C);
    shard_status s = shard_embedding_forward(table, id, y, N, rows, C);
    shard__ref_embedding_forward(table, id, want, N, C);
    return check_ok(c, "shard_embedding_forward", s) || check(c, "y", y, want, N * C);
}

static int run_embedding_backward(const kcase *c) {
    size_t N = c->d[0], rows = c->d[1], C = c->d[2];
    const float *dy = uniform(N * C, -1, 1);
    const int32_t *id = ids(N, rows);
    float *dtable = uniform(rows * C, -1, 1), *want = copy(dtable, rows * C);
    shard_status s = shard_embedding_backward(id, dy, dtable, N, rows, C);
    shard__ref_embedding_backward(id, dy, want, N, C);
    return check_ok(c, "shard_embedding_backward", s) || check(c, "dtable", dtable, want, rows * C);
}

/* The table split by rows over `parts`: the parts' lookups summed, and each part's rows of the gradient. */
static int run_embedding_split(const kcase *c) {
    size_t N = c->d[0], rows = c->d[1], C = c->d[2], parts = c->d[3];
    const float *table = uniform(rows * C, -1, 1), *dy = uniform(N * C, -1, 1);
    const int32_t *id = ids(N, rows);
    float *sum = zeros(N * C), *y = zeros(N * C), *want = zeros(N * C), *dtable = uniform(rows * C, -1, 1);
    float *want_dtable = copy(dtable, rows * C);
    shard__ref_embedding_forward(table, id, want, N, C);
    shard__ref_embedding_backward(id, dy, want_dtable, N, C);
    int failed = 0;
    for (size_t p = 0; p < parts && !failed; p++) {
        size_t v0, Vl;
        part_range(rows, parts, p, &v0, &Vl);
        failed = check_ok(c, "shard__embedding_forward_split",
                          shard__embedding_forward_split(table + v0 * C, id, y, N, v0, Vl, rows, C));
        for (size_t i = 0; i < N * C; i++) sum[i] += y[i];
        shard__embedding_backward_split(id, dy, dtable + v0 * C, N, v0, Vl, C);
    }
    return failed || check(c, "y (summed over the parts)", sum, want, N * C) ||
        check(c, "dtable", dtable, want_dtable, rows * C);
}

/* ---------------------------------------------------------------- attention */

/* shape B T H D, and for dropout p (percent): the mask keyed by seed 5, rows from 3, heads 1.. of H + 2 */
static int run_attention_either(const kcase *c, int backward) {
    size_t B = c->d[0], T = c->d[1], H = c->d[2], D = c->d[3], C = H * D;
    float p = (float)c->d[4] / 100.0f;
    const float *qkv = uniform(B * T * 3 * C, -2, 2), *dy = uniform(B * T * C, -1, 1);
    float *y = zeros(B * T * C), *att = zeros(B * H * T * T), *want_y = zeros(B * T * C);
    float *want_att = zeros(B * H * T * T);
    shard_status ref = shard__ref_attention_forward(qkv, want_y, want_att, B, T, C, H, p, 5, 3, H + 2, 1);
    if (check_ok(c, "the reference forward", ref)) return 1;
    if (!backward) {
        shard_status s = shard_attention_forward_dropout(qkv, y, att, B, T, C, H, p, 5, 3, H + 2, 1);
        return check_ok(c, "shard_attention_forward_dropout", s) || check(c, "att", att, want_att, B * H * T * T) ||
            check(c, "y", y, want_y, B * T * C);
    }
    float *dqkv = zeros(B * T * 3 * C), *want = zeros(B * T * 3 * C);
    shard_status s = shard_attention_backward_dropout(qkv, want_att, dy, dqkv, B, T, C, H, p, 5, 3, H + 2, 1);
    ref = shard__ref_attention_backward(qkv, want_att, dy, want, B, T, C, H, p, 5, 3, H + 2, 1);
    return check_ok(c, "shard_attention_backward_dropout", s) || check_ok(c, "the reference backward", ref) ||
        check(c, "dqkv", dqkv, want, B * T * 3 * C);
}

static int run_attention_forward(const kcase *c) { return run_attention_either(c, 0); }
static int run_attention_backward(const kcase *c) { return run_attention_either(c, 1); }

/* ---------------------------------------------------------------- conv2d, max-pool */

static int run_conv2d_either(const kcase *c, int backward) {
    size_t N = c->d[0], Cin = c->d[1], H = c->d[2], W = c->d[3], Cout = c->d[4], K = c->d[5], pad = c->d[6];
    size_t Ho = H + 2 * pad - K + 1, Wo = W + 2 * pad - K + 1, nx = N * Cin * H * W, nw = Cout * Cin * K * K;
    size_t ny = N * Cout * Ho * Wo;
    const float *x = uniform(nx, -1, 1), *w = uniform(nw, -1, 1), *b = uniform(Cout, -1, 1);
    if (!backward) {
        float *y = zeros(ny), *want = zeros(ny);
        shard_status s = shard_conv2d_forward(x, w, b, y, N, Cin, H, W, Cout, K, pad);
        shard_status ref = shard__ref_conv2d_forward(x, w, b, want, N, Cin, H, W, Cout, K, pad);
        return check_ok(c, "shard_conv2d_forward", s) || check_ok(c, "the reference", ref) ||
            check(c, "y", y, want, ny);
    }
    const float *dy = uniform(ny, -1, 1);
    float *dx = zeros(nx), *dw = uniform(nw, -1, 1), *db = uniform(Cout, -1, 1);
    float *want_dx = zeros(nx), *want_dw = copy(dw, nw), *want_db = copy(db, Cout);
    shard_status s = shard_conv2d_backward(x, w, dy, dx, dw, db, N, Cin, H, W, Cout, K, pad);
    shard_status ref = shard__ref_conv2d_backward(x, w, dy, want_dx, want_dw, want_db, N, Cin, H, W, Cout, K, pad);
    return check_ok(c, "shard_conv2d_backward", s) || check_ok(c, "the reference", ref) ||
        check(c, "dx", dx, want_dx, nx) || check(c, "dw", dw, want_dw, nw) || check(c, "db", db, want_db, Cout);
}

static int run_conv2d_forward(const kcase *c) { return run_conv2d_either(c, 0); }
static int run_conv2d_backward(const kcase *c) { return run_conv2d_either(c, 1); }

static int run_maxpool2d(const kcase *c) {
    size_t N = c->d[0], C = c->d[1], H = c->d[2], W = c->d[3], P = c->d[4], ny = N * C * (H / P) * (W / P);
    const float *x = uniform(N * C * H * W, -1, 1), *dy = uniform(ny, -1, 1);
    float *y = zeros(ny), *want = zeros(ny), *dx = uniform(N * C * H * W, -1, 1), *want_dx = zeros(N * C * H * W);
    uint32_t *arg = keep(calloc(ny ? ny : 1, sizeof *arg)), *want_arg = keep(calloc(ny ? ny : 1, sizeof *arg));
    shard_maxpool2d_forward(x, y, arg, N, C, H, W, P);
    shard__ref_maxpool2d_forward(x, want, want_arg, N, C, H, W, P);
    for (size_t i = 0; i < ny; i++)
        if (arg[i] != want_arg[i]) {
            printf("FAIL %s: argmax[%zu] = %u, reference %u\n", c->name, i, (unsigned)arg[i], (unsigned)want_arg[i]);
            return 1;
        }
    shard_maxpool2d_backward(dy, arg, dx, N, C, H, W, P); /* dx written whole, whatever it held */
    shard__ref_maxpool2d_backward(dy, want_arg, want_dx, N, C, H, W, P);
    return check(c, "y", y, want, ny) || check(c, "dx", dx, want_dx, N * C * H * W);
}

/* ---------------------------------------------------------------- optimizers, clipping */

static int run_sgd_update(const kcase *c) {
    size_t n = c->d[0];
    shard_sgd_config cfg = {c->d[1] ? 0.9f : 0.0f, c->d[1] ? 0.01f : 0.0f};
    const float *g = uniform(n, -1, 1);
    float *p = uniform(n, -1, 1), *buf = uniform(n, -1, 1), *want_p = copy(p, n), *want_buf = copy(buf, n);
    shard_sgd_update(&cfg, c->d[2], 0.1f, p, g, buf, n);
    shard__ref_sgd_update(&cfg, c->d[2], 0.1f, want_p, g, want_buf, n);
    return check(c, "p", p, want_p, n) || check(c, "momentum buffer", buf, want_buf, n);
}

static int run_adamw_either(const kcase *c, int clipped) {
    size_t n = c->d[0];
    shard_adamw_config cfg = shard_adamw_defaults();
    float *g = uniform(n, -1, 1), *p = uniform(n, -1, 1), *m = uniform(n, -0.1f, 0.1f), *v = uniform(n, 0, 0.01f);
    float *want_p = copy(p, n), *want_m = copy(m, n), *want_v = copy(v, n), *g_in = copy(g, n);
    if (clipped)
        shard_adamw_update_clipped(&cfg, c->d[1], 1e-3f, 0.37f, p, g, m, v, n);
    else
        shard_adamw_update(&cfg, c->d[1], 1e-3f, p, g, m, v, n);
    shard__ref_adamw_update(&cfg, c->d[1], 1e-3f, clipped ? 0.37f : 1.0f, want_p, g_in, want_m, want_v, n);
    float *want_g = clipped ? zeros(n) : g_in; /* the clipped form leaves the gradient zeroed */
    return check(c, "p", p, want_p, n) || check(c, "exp_avg", m, want_m, n) || check(c, "exp_avg_sq", v, want_v, n) ||
        check(c, "g", g, want_g, n);
}

static int run_adamw_update(const kcase *c) { return run_adamw_either(c, 0); }
static int run_adamw_update_clipped(const kcase *c) { return run_adamw_either(c, 1); }

static int run_sum_squares(const kcase *c) {
    size_t n = c->d[0];
    const float *g = uniform(n, -1, 1);
    return check_value(c, "sum", shard_sum_squares(g, n), shard__ref_sum_squares(g, n));
}

/* the factor for a gradient's norm against max_norm 1 (small n: under 1, factor 1; large: clipped) */
static int run_clip_factor(const kcase *c) {
    size_t n = c->d[0];
    const float *g = uniform(n, -0.2f, 0.2f);
    double norm = sqrt(shard__ref_sum_squares(g, n));
    return check_value(c, "factor", shard_clip_factor(norm, 1.0f), shard__ref_clip_factor(norm, 1.0f));
}

static int run_scale(const kcase *c) {
    size_t n = c->d[0];
    float *g = uniform(n, -4, 4), *want = copy(g, n);
    shard_scale(g, n, 0.37f);
    shard__ref_scale(want, n, 0.37f);
    return check(c, "g", g, want, n);
}

/* ---------------------------------------------------------------- the ops and their shapes */

/* one-dimensional: the vector tails (1, 7, 37, 65, 129) and a size cut into chunks */
static const size_t SIZES[][MAX_DIMS] = {{1}, {7}, {37}, {65}, {129}, {300007}};
static const size_t GEMMS[][MAX_DIMS] = {{1, 1, 1, 0, 0},      {7, 37, 65, 0, 1},  {37, 7, 129, 1, 0},
                                         {65, 129, 37, 1, 1},  {129, 65, 7, 0, 0}, {257, 129, 129, 1, 0},
                                         {129, 257, 129, 0, 1}};
static const size_t LINEARS[][MAX_DIMS] = {{1, 1, 1},     {7, 37, 65},     {37, 65, 7},   {65, 129, 37},
                                           {129, 7, 129}, {257, 129, 129}, {1031, 37, 65}};
static const size_t DROPOUTS[][MAX_DIMS] = {{1, 50}, {37, 0}, {129, 10}, {300007, 50}};
static const size_t ROWS[][MAX_DIMS] = {{1, 1}, {7, 37}, {37, 65}, {65, 129}, {129, 7}, {1031, 129}};
static const size_t LOGITS[][MAX_DIMS] = {{1, 1}, {7, 37}, {37, 65}, {65, 129}, {129, 7}, {1031, 257}};
static const size_t SPLIT_LOGITS[][MAX_DIMS] = {{1, 1, 1}, {7, 37, 2}, {37, 65, 3}, {65, 129, 2}, {129, 7, 3}};
static const size_t TABLES[][MAX_DIMS] = {{1, 1, 1}, {7, 37, 65}, {37, 7, 129}, {129, 65, 7}};
static const size_t SPLIT_TABLES[][MAX_DIMS] = {{1, 1, 1, 1}, {7, 37, 65, 2}, {37, 7, 129, 3}, {129, 65, 7, 3}};
/* B T H D p: widths of heads 1, 3, 5, 7, 13, 16; T across one and several row blocks of 32 */
static const size_t ATTENTIONS[][MAX_DIMS] = {{1, 1, 1, 1, 0},   {1, 7, 2, 3, 0},   {2, 37, 3, 7, 0},
                                              {1, 65, 1, 13, 0}, {2, 129, 3, 5, 0}, {3, 33, 4, 16, 0},
                                              {1, 7, 2, 3, 50},  {2, 37, 3, 7, 10}, {1, 65, 2, 13, 25}};
static const size_t CONVS[][MAX_DIMS] = {{1, 1, 1, 1, 1, 1, 0},
                                         {2, 3, 7, 7, 5, 3, 1},
                                         {1, 2, 13, 9, 4, 5, 2},
                                         {3, 1, 8, 8, 2, 2, 0},
                                         {1, 4, 6, 11, 3, 3, 0}};
static const size_t POOLS[][MAX_DIMS] = {
    {1, 1, 1, 1, 1}, {2, 3, 8, 8, 2}, {1, 2, 9, 7, 3}, {1, 1, 5, 5, 5}, {2, 7, 37, 65, 2}};
static const size_t SGDS[][MAX_DIMS] = {{1, 0, 1}, {37, 1, 1}, {65, 0, 4}, {129, 1, 3}, {300007, 1, 2}};
static const size_t ADAMWS[][MAX_DIMS] = {{1, 1}, {7, 3}, {37, 1}, {65, 2}, {129, 10}, {300007, 2}};
static const size_t NORMS[][MAX_DIMS] = {{1}, {37}, {129}, {300007}};

#define SHAPES(table) table, sizeof table / sizeof table[0]

/* Tolerances (atol, rtol), about ten times the largest difference these shapes show: ops that round
 * once, copy or pick are exact; sums carry one float rounding per term (the references sum in double);
 * exp and tanh are polynomials, and GELU's slope loses digits to cancellation where tanh nears -1. */
static const op_def OPS[] = {
    {"sgemm", {"M", "N", "K", "ta", "tb"}, SHAPES(GEMMS), run_sgemm, 1e-4, 1e-5},
    {"sgemm_bias", {"M", "N", "K", "ta", "tb"}, SHAPES(GEMMS), run_sgemm_bias, 1e-4, 1e-5},
    {"linear_forward", {"N", "in", "out"}, SHAPES(LINEARS), run_linear_forward, 1e-4, 1e-5},
    {"linear_backward", {"N", "in", "out"}, SHAPES(LINEARS), run_linear_backward, 1e-4, 1e-5},
    {"relu_forward", {"n"}, SHAPES(SIZES), run_relu_forward, 0, 0},
    {"relu_backward", {"n"}, SHAPES(SIZES), run_relu_backward, 0, 0},
    {"gelu_forward", {"n"}, SHAPES(SIZES), run_gelu_forward, 5e-6, 1e-5},
    {"gelu_backward", {"n"}, SHAPES(SIZES), run_gelu_backward, 5e-5, 1e-5},
    {"gelu_forward_slope", {"n"}, SHAPES(SIZES), run_gelu_forward_slope, 2e-5, 1e-5},
    {"add", {"n"}, SHAPES(SIZES), run_add, 0, 0},
    {"mul", {"n"}, SHAPES(SIZES), run_mul, 0, 0},
    {"dropout", {"n", "p"}, SHAPES(DROPOUTS), run_dropout, 0, 1e-6},
    {"layernorm_forward", {"N", "C"}, SHAPES(ROWS), run_layernorm_forward, 1e-5, 1e-5},
    {"layernorm_backward", {"N", "C"}, SHAPES(ROWS), run_layernorm_backward, 1e-4, 1e-5},
    {"softmax_forward", {"N", "C"}, SHAPES(ROWS), run_softmax_forward, 1e-7, 1e-5},
    {"cross_entropy", {"N", "V"}, SHAPES(LOGITS), run_cross_entropy, 1e-8, 1e-5},
    {"cross_entropy_sum", {"N", "V"}, SHAPES(LOGITS), run_cross_entropy_sum, 1e-8, 1e-5},
    {"cross_entropy_split", {"N", "V", "parts"}, SHAPES(SPLIT_LOGITS), run_cross_entropy_split, 1e-8, 1e-5},
    {"embedding_forward", {"N", "rows", "C"}, SHAPES(TABLES), run_embedding_forward, 0, 0},
    {"embedding_backward", {"N", "rows", "C"}, SHAPES(TABLES), run_embedding_backward, 0, 0},
    {"embedding_split", {"N", "rows", "C", "parts"}, SHAPES(SPLIT_TABLES), run_embedding_split, 0, 0},
    {"attention_forward", {"B", "T", "H", "D", "p"}, SHAPES(ATTENTIONS), run_attention_forward, 1e-5, 1e-4},
    {"attention_backward", {"B", "T", "H", "D", "p"}, SHAPES(ATTENTIONS), run_attention_backward, 1e-5, 1e-4},
    {"conv2d_forward", {"N", "Cin", "H", "W", "Cout", "K", "pad"}, SHAPES(CONVS), run_conv2d_forward, 1e-5, 1e-5},
    {"conv2d_backward", {"N", "Cin", "H", "W", "Cout", "K", "pad"}, SHAPES(CONVS), run_conv2d_backward, 1e-5, 1e-5},
    {"maxpool2d", {"N", "C", "H", "W", "P"}, SHAPES(POOLS), run_maxpool2d, 0, 0},
    {"sgd_update", {"n", "momentum", "step"}, SHAPES(SGDS), run_sgd_update, 1e-6, 2e-6},
    {"adamw_update", {"n", "step"}, SHAPES(ADAMWS), run_adamw_update, 1e-7, 1e-6},
    {"adamw_update_clipped", {"n", "step"}, SHAPES(ADAMWS), run_adamw_update_clipped, 1e-7, 1e-6},
    {"sum_squares", {"n"}, SHAPES(NORMS), run_sum_squares, 0, 1e-11},
    {"clip_factor", {"n"}, SHAPES(NORMS), run_clip_factor, 0, 0},
    {"scale", {"n"}, SHAPES(SIZES), run_scale, 0, 0},
};

#define OP_COUNT (sizeof OPS / sizeof OPS[0])
static const int THREADS[] = {1, 2, 3};

/* the case's name; `base` gets it without the thread count (the inputs' seed) */
static void name_case(kcase *c, char *base, size_t base_bytes) {
    size_t at = (size_t)snprintf(base, base_bytes, "%s", c->op->name);
    for (int k = 0; k < MAX_DIMS && c->op->keys[k]; k++)
        at += (size_t)snprintf(base + at, at < base_bytes ? base_bytes - at : 0, " %s=%zu", c->op->keys[k], c->d[k]);
    snprintf(c->name, sizeof c->name, "%s threads=%d", base, c->threads);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

/* Runs (or lists) the cases that `op` and `only` select; 0 passed, 1 some failed. */
static int run_cases(const char *op, const char *only, int list, size_t *matched) {
    int failed = 0;
    size_t ran = 0;
    for (size_t o = 0; o < OP_COUNT; o++) {
        if (op && strcmp(op, OPS[o].name) != 0) continue;
        for (size_t s = 0; s < OPS[o].count; s++)
            for (size_t t = 0; t < sizeof THREADS / sizeof THREADS[0]; t++) {
                kcase c = {.op = &OPS[o], .threads = THREADS[t]};
                char base[192];
                memcpy(c.d, OPS[o].shapes[s], sizeof c.d);
                name_case(&c, base, sizeof base);
                if (only && strcmp(only, c.name) != 0) continue;
                (*matched)++;
                if (list) {
                    printf("%s\n", c.name);
                    continue;
                }
                if (shard_blas_set_threads(c.threads) != SHARD_OK) {
                    printf("FAIL %s: shard_blas_set_threads(%d): %s\n", c.name, c.threads, shard_last_error());
                    return 1;
                }
                rng_state = fnv1a(base);
                int bad = OPS[o].run(&c);
                free_buffers();
                if (!bad) printf("ok   %s\n", c.name);
                failed |= bad, ran++;
            }
    }
    if (!list && *matched) printf("%zu case%s, %s\n", ran, ran == 1 ? "" : "s", failed ? "some FAILED" : "all passed");
    return failed;
}

static int usage(const char *why, const char *arg) {
    fprintf(stderr,
            "test_kernels: %s '%s'; usage: test_kernels [--list] [--op NAME] [--case 'NAME K=v ... "
            "threads=n']\n",
            why, arg);
    return 2;
}

int main(int argc, char **argv) {
    const char *op = NULL, *only = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0)
            list = 1;
        else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc)
            op = argv[++i];
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--op") == 0 || strcmp(argv[i], "--case") == 0)
            return usage("a value is missing after", argv[i]);
        else
            return usage("unknown argument", argv[i]);
    }
    if (op) {
        size_t o = 0;
        while (o < OP_COUNT && strcmp(op, OPS[o].name) != 0) o++;
        if (o == OP_COUNT) {
            fprintf(stderr, "test_kernels: no op named '%s'; ops:", op);
            for (o = 0; o < OP_COUNT; o++) fprintf(stderr, " %s", OPS[o].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    size_t matched = 0;
    int failed = run_cases(op, only, list, &matched);
    if (!matched) {
        fprintf(stderr, "test_kernels: no case named '%s'%s (test_kernels --list prints them)\n", only ? only : "",
                op ? " in that op" : "");
        return 2;
    }
    return failed;
}
