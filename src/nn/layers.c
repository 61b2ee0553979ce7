/* layers.c — forward and backward of the layers in layers.h.
 *
 * Matrix products go through shard_sgemm (OpenBLAS); convolution is im2col
 * plus GEMM; the rest are loops written for clarity first, in the order the
 * formulas read.  Reductions over a row run in a fixed order, so results are
 * bitwise reproducible run to run. */
#include "shard/layers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/parallel.h"
#include "core/simd.h"
#include "shard/blas.h"
#include "shard/memory.h"

/* Element-wise loops over more than this many elements are cut into chunks for the process's threads. */
enum { GRAIN = 32768 };

/* ---------------------------------------------------------------- linear */

shard_status shard_linear_forward(const float *x, const float *W, const float *b, float *y, size_t N, size_t in,
                                  size_t out) {
    return shard_sgemm_bias(0, 0, N, out, in, 1.0f, x, in, W, out, b, y, out);
}

/* db[o] += sum over rows of dy[n, o]: chunks of columns on the process's threads, each column summed
 * row by row, so the bits do not depend on the chunks.  Columns go in groups of 16 (one 64-byte line of
 * db: no two chunks write the same line); the last chunk also takes the columns past the last group. */
enum { BIAS_GROUP = 16 };

typedef struct bias_grad_job {
    const float *dy;
    float *db;
    size_t N, out;
} bias_grad_job;

SHARD_VECTOR_CLONES
static void bias_grad_columns(const float *dy, float *db, size_t N, size_t stride, size_t cols) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < cols; o++) db[o] += dy[n * stride + o];
}

static void bias_grad_chunk(void *ctx, size_t chunk, size_t chunks) {
    const bias_grad_job *j = ctx;
    size_t at, n;
    shard__chunk_range(j->out / BIAS_GROUP, chunks, chunk, &at, &n);
    size_t first = at * BIAS_GROUP, cols = chunk + 1 == chunks ? j->out - first : n * BIAS_GROUP;
    bias_grad_columns(j->dy + first, j->db + first, j->N, j->out, cols);
}

static void bias_grad(const float *dy, float *db, size_t N, size_t out) {
    size_t groups = out / BIAS_GROUP, chunks = shard__chunks_for(N * out, GRAIN);
    if (!groups) { /* narrower than one group: one pass here */
        bias_grad_columns(dy, db, N, out, out);
        return;
    }
    bias_grad_job j = {dy, db, N, out};
    shard__parallel_for(chunks < groups ? chunks : groups, bias_grad_chunk, &j);
}

shard_status shard_linear_backward(const float *x, const float *W, const float *dy, float *dx, float *dW, float *db,
                                   size_t N, size_t in, size_t out) {
    shard_gemm gx = {0, 1, N, in, out, 1.0f, dy, out, W, out, 0.0f, dx, in};   /* dx = dy W^T */
    shard_gemm gw = {1, 0, in, out, N, 1.0f, x, in, dy, out, 1.0f, dW, out}; /* dW += x^T dy */
    SHARD_CHECK(shard_sgemm_pair(dx ? &gx : NULL, dW ? &gw : NULL));
    if (db) bias_grad(dy, db, N, out);
    return SHARD_OK;
}

/* ---------------------------------------------------------------- element-wise */

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
    if (j->kind == 0) gelu_forward_range(j->a + at, j->y + at, n);
    else if (j->kind == 1) gelu_backward_range(j->a + at, j->b + at, j->y + at, n);
    else if (j->kind == 2) add_range(j->a + at, j->b + at, j->y + at, n);
    else if (j->kind == 3) gelu_forward_slope_range(j->slope + at, j->y + at, n);
    else mul_range(j->a + at, j->b + at, j->y + at, n);
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

/* ---------------------------------------------------------------- layer norm */

/* Row sums in 16 running lanes (GCC/Clang vector types), added in a fixed order at the end: a single
 * running float sum would not vectorise (addition is not associative), and the result is the same bits
 * every run.  The 16 lanes are two 8-lane (32-byte) vectors, lanes 0-7 and 8-15: GCC compiles 64-byte
 * generic vectors for AVX2 into stack spills and scalar moves (a LayerNorm of 1,024 x 256 took 548 us on
 * a Zen 3 core that way). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
enum { LANES = 16, HALF = 8 };

/* (pointers, not vector values, cross these calls: the baseline ABI has no 32-byte vectors) */
static inline void load8(v8f *v, const float *p) { memcpy(v, p, sizeof *v); }

static inline float lanes_total(const v8f lane[2]) {
    float s = 0;
    for (int k = 0; k < LANES; k++) s += lane[k / HALF][k % HALF];
    return s;
}

SHARD_VECTOR_CLONES
static void layernorm_forward_rows(const float *x, const float *gamma, const float *beta, float eps, float *y,
                                   float *mean, float *rstd, size_t N, size_t C) {
    size_t whole = C / LANES * LANES;
    for (size_t n = 0; n < N; n++) {
        const float *r = x + n * C;
        v8f lane[2] = {{0}, {0}}, v8;
        for (size_t c = 0; c < whole; c += LANES)
            for (int h = 0; h < 2; h++) load8(&v8, r + c + HALF * h), lane[h] += v8;
        float m = lanes_total(lane);
        for (size_t c = whole; c < C; c++) m += r[c];
        m /= (float)C;
        lane[0] = lane[1] = (v8f){0};
        for (size_t c = 0; c < whole; c += LANES)
            for (int h = 0; h < 2; h++) {
                load8(&v8, r + c + HALF * h);
                v8 -= m;
                lane[h] += v8 * v8;
            }
        float v = lanes_total(lane);
        for (size_t c = whole; c < C; c++) v += (r[c] - m) * (r[c] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + eps);
        for (size_t c = 0; c < C; c++) y[n * C + c] = (r[c] - m) * s * gamma[c] + beta[c];
        mean[n] = m, rstd[n] = s;
    }
}

SHARD_VECTOR_CLONES
static void layernorm_backward_rows(const float *x, const float *gamma, const float *mean, const float *rstd,
                                    const float *dy, float *dx, float *dgamma, float *dbeta, size_t N, size_t C) {
    size_t whole = C / LANES * LANES;
    for (size_t n = 0; n < N; n++) {
        const float *r = x + n * C, *g = dy + n * C;
        float m = mean[n], s = rstd[n];
        for (size_t c = 0; c < C; c++) {
            float xhat = (r[c] - m) * s;
            dgamma[c] += g[c] * xhat;
            dbeta[c] += g[c];
        }
        if (!dx) continue;
        v8f lane_dxhat[2] = {{0}, {0}}, lane_dxhat_xhat[2] = {{0}, {0}}, xh, dxh, gam;
        for (size_t c = 0; c < whole; c += LANES)
            for (int h = 0; h < 2; h++) {
                size_t at = c + HALF * (size_t)h;
                load8(&xh, r + at), load8(&dxh, g + at), load8(&gam, gamma + at);
                xh = (xh - m) * s, dxh *= gam;
                lane_dxhat[h] += dxh;
                lane_dxhat_xhat[h] += dxh * xh;
            }
        float sum_dxhat = lanes_total(lane_dxhat), sum_dxhat_xhat = lanes_total(lane_dxhat_xhat);
        for (size_t c = whole; c < C; c++) {
            float xhat = (r[c] - m) * s, dxhat = g[c] * gamma[c];
            sum_dxhat += dxhat;
            sum_dxhat_xhat += dxhat * xhat;
        }
        sum_dxhat /= (float)C, sum_dxhat_xhat /= (float)C;
        for (size_t c = 0; c < C; c++) {
            float xhat = (r[c] - m) * s;
            dx[n * C + c] = s * (g[c] * gamma[c] - sum_dxhat - xhat * sum_dxhat_xhat);
        }
    }
}

/* LayerNorm over rows, the rows' chunks on the process's threads.  Backward: each chunk sums its rows'
 * dgamma and dbeta into a partial of its own; the partials are added in chunk order. */
typedef struct ln_job {
    const float *x, *gamma, *beta, *mean_in, *rstd_in, *dy;
    float eps, *y, *mean, *rstd, *dx, *partial;
    size_t N, C;
} ln_job;

static void ln_forward_chunk(void *ctx, size_t chunk, size_t chunks) {
    const ln_job *j = ctx;
    size_t r, n;
    shard__chunk_range(j->N, chunks, chunk, &r, &n);
    layernorm_forward_rows(j->x + r * j->C, j->gamma, j->beta, j->eps, j->y + r * j->C, j->mean + r, j->rstd + r, n, j->C);
}

void shard_layernorm_forward(const float *x, const float *gamma, const float *beta, float eps, float *y, float *mean,
                             float *rstd, size_t N, size_t C) {
    ln_job j = {.x = x, .gamma = gamma, .beta = beta, .eps = eps, .y = y, .mean = mean, .rstd = rstd, .N = N, .C = C};
    shard__parallel_for(shard__chunks_for(N * C, GRAIN), ln_forward_chunk, &j);
}

static void ln_backward_chunk(void *ctx, size_t chunk, size_t chunks) {
    const ln_job *j = ctx;
    size_t r, n, C = j->C;
    shard__chunk_range(j->N, chunks, chunk, &r, &n);
    float *dg = j->partial + chunk * 2 * C;
    layernorm_backward_rows(j->x + r * C, j->gamma, j->mean_in + r, j->rstd_in + r, j->dy + r * C, j->dx ? j->dx + r * C : NULL,
                            dg, dg + C, n, C);
}

SHARD_VECTOR_CLONES
static void add_partials(float *to, const float *partial, size_t C) {
    for (size_t c = 0; c < C; c++) to[c] += partial[c];
}

void shard_layernorm_backward(const float *x, const float *gamma, const float *mean, const float *rstd, const float *dy,
                              float *dx, float *dgamma, float *dbeta, size_t N, size_t C) {
    size_t chunks = shard__chunks_for(N * C, GRAIN);
    float *partial = chunks > 1 ? calloc(chunks * 2 * C, sizeof *partial) : NULL;
    if (!partial) { /* one chunk (or no memory for partials): straight into dgamma and dbeta */
        layernorm_backward_rows(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, N, C);
        return;
    }
    ln_job j = {.x = x, .gamma = gamma, .mean_in = mean, .rstd_in = rstd, .dy = dy, .dx = dx, .partial = partial,
                .N = N, .C = C};
    shard__parallel_for(chunks, ln_backward_chunk, &j);
    for (size_t k = 0; k < chunks; k++) {
        add_partials(dgamma, partial + k * 2 * C, C);
        add_partials(dbeta, partial + k * 2 * C + C, C);
    }
    free(partial);
}

/* ---------------------------------------------------------------- softmax, cross-entropy */

/* exp(x) for x <= 0 (softmax after subtracting the row maximum): 2^k e^r with
 * |r| <= ln2/2 and Cephes' polynomial, within 2 ulp of expf.  Written with
 * GCC/Clang vector types (the rounding and the 2^k come from bit tricks a
 * plain loop would not vectorise), 8 lanes wide: 64-byte generic vectors with
 * a comparison were split into scalar code on AVX2 cores (a cross-entropy over
 * 1,024 x 8,192 took 28 ms on a Zen 3 core that way, 13 ms now).
 * Below -87 it returns ~1e-38, not 0. */
#define DEFINE_EXP_NONPOSITIVE(name, vf, vi)                                                                           \
    static inline void name(vf *xp) {                                                                                  \
        vf x = *xp;                                                                                                    \
        const vf lo = (vf){0} - 87.0f;                                                                                 \
        vi below = x < lo; /* all ones where x < -87 */                                                                \
        x = (vf)(((vi)x & ~below) | ((vi)lo & below));                                                                 \
        const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */                              \
        vf kf = x * 1.44269504088896341f + magic;                                                                      \
        vi ki = (vi)kf - (vi)((vf){0} + magic);                                                                        \
        vf k = kf - magic;                                                                                             \
        vf r = x - k * 0.693359375f + k * 2.12194440e-4f;                                                              \
        vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;                                                                \
        p = p * r + 8.3334519073e-3f;                                                                                  \
        p = p * r + 4.1665795894e-2f;                                                                                  \
        p = p * r + 1.6666665459e-1f;                                                                                  \
        p = p * r + 5.0000001201e-1f;                                                                                  \
        p = p * r * r + r + 1.0f;                                                                                      \
        *xp = p * (vf)((ki + 127) << 23);                                                                              \
    }
DEFINE_EXP_NONPOSITIVE(exp8_nonpositive, v8f, v8i)

/* out[0..15] = exp(in[0..15] - m); sum[0] += lanes 0..7, sum[1] += lanes 8..15 (pointers, not vector
 * values, cross the call) */
static inline void exp16_nonpositive(const float *in, float m, float *out, v8f sum[2]) {
    for (int h = 0; h < 2; h++) {
        v8f x;
        load8(&x, in + HALF * h);
        x -= m;
        exp8_nonpositive(&x);
        memcpy(out + HALF * h, &x, sizeof x);
        sum[h] += x;
    }
}

/* lane by lane: *out = keep ? yes : no (keep's lanes all ones or all zeros) */
static inline void select8(v8f *out, const v8i *keep, const v8f *yes, const v8f *no) {
    *out = (v8f)((*keep & (v8i)*yes) | (~*keep & (v8i)*no));
}

/* The row's largest element (NaNs passed over), in 16 lanes of two 8-lane vectors: a loop over a float
 * array of 16 partial maxima compiled to scalar code (its AVX-512 clone used vmaxss), the max being
 * written as a comparison.  Exact, so the lanes' order does not matter. */
SHARD_VECTOR_CLONES
static float row_max(const float *x, size_t C) {
    v8f part[2] = {(v8f){0} - INFINITY, (v8f){0} - INFINITY}, v;
    size_t c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int h = 0; h < 2; h++) {
            load8(&v, x + c + HALF * h);
            v8i more = v > part[h];
            select8(&part[h], &more, &v, &part[h]);
        }
    float m = -INFINITY, lane[LANES];
    memcpy(lane, &part[0], sizeof part[0]);
    memcpy(lane + HALF, &part[1], sizeof part[1]);
    for (int k = 0; k < LANES; k++) m = lane[k] > m ? lane[k] : m;
    for (; c < C; c++) m = x[c] > m ? x[c] : m;
    return m;
}

/* The same exp on 16 lanes as one 64-byte vector: the same operations lane by lane, so the same bits.
 * Only where the CPU has AVX-512 (wide_vectors): there exp_row's AVX-512 clone runs it in zmm registers,
 * and the cross-entropy over 1,024 x 8,192 logits took 2.6 ms on two threads instead of 3.6 (Emerald
 * Rapids); GCC would turn the comparison into scalar code for AVX2. */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline int wide_vectors(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

DEFINE_EXP_NONPOSITIVE(exp16_one_vector, v16f, v16i)

static inline void exp16_wide(const float *in, float m, float *out, v16f *sum) {
    v16f x;
    memcpy(&x, in, sizeof x);
    x -= m;
    exp16_one_vector(&x);
    memcpy(out, &x, sizeof x);
    *sum += x;
}

/* y[c] = exp(x[c] - m) (y may be x); returns the sum, added in a fixed order (lane 0 to 15). */
SHARD_VECTOR_CLONES
static double exp_row(const float *x, float *y, size_t C, float m) {
    v8f acc[2] = {{0}, {0}};
    float tail[LANES] = {0};
    size_t c = 0;
    if (wide_vectors()) { /* the same lanes, 0-7 and 8-15, as the halves below */
        v16f wide = {0};
        for (; c + LANES <= C; c += LANES) exp16_wide(x + c, m, y + c, &wide);
        memcpy(&acc[0], &wide, sizeof acc[0]);
        memcpy(&acc[1], (float *)&wide + HALF, sizeof acc[1]);
    }
    for (; c + LANES <= C; c += LANES) exp16_nonpositive(x + c, m, y + c, acc);
    size_t rest = C - c;
    if (rest) {
        float in[LANES] = {0}, out[LANES];
        v8f unused[2] = {{0}, {0}};
        memcpy(in, x + c, rest * sizeof(float));
        for (size_t k = rest; k < LANES; k++) in[k] = m - 100.0f; /* lanes past the end: exp ~ 1e-38, dropped below */
        exp16_nonpositive(in, m, out, unused);
        memcpy(y + c, out, rest * sizeof(float));
        for (size_t k = 0; k < rest; k++) tail[k] = out[k];
    }
    double sum = 0;
    for (int k = 0; k < LANES; k++) sum += (double)acc[k / HALF][k % HALF] + (double)tail[k];
    return sum;
}

SHARD_VECTOR_CLONES
static void scale_row(float *y, size_t C, float k) {
    for (size_t c = 0; c < C; c++) y[c] *= k;
}

/* ---- the causal softmax's backward in attention: row t covers positions 0..t of a T-wide row.
 * Rows are short (1..T) and nearly all end inside a block of 16 lanes: that last block is computed whole
 * with the lanes past the row masked out, which the row's T floats of room allow; only when a row's
 * last vector would pass T does it take a plain loop. */
static const v8i LANE_INDEX = {0, 1, 2, 3, 4, 5, 6, 7};

/* the sum of 16 lanes (two halves) as a tree (halves, quarters, ...): 4 dependent steps, not 15 */
static inline float lanes_tree_sum(const v8f lane[2]) {
    float l[LANES];
    memcpy(l, &lane[0], sizeof lane[0]);
    memcpy(l + HALF, &lane[1], sizeof lane[1]);
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    return l[0];
}

/* dS = P (dP - rowsum(P dP)) * scale on the causal rows, the rest of each row zeroed. */
SHARD_VECTOR_CLONES
static void causal_softmax_backward_rows(const float *p, float *ds, size_t T, float scale) {
    for (size_t t = 0; t < T; t++) {
        const float *a = p + t * T;
        float *d = ds + t * T;
        size_t n = t + 1, whole = n / LANES * LANES, end = (n + LANES - 1) / LANES * LANES;
        if (end > T) {
            float dot = 0;
            for (size_t i = 0; i < n; i++) dot += a[i] * d[i];
            for (size_t i = 0; i < n; i++) d[i] = a[i] * (d[i] - dot) * scale;
            for (size_t i = n; i < T; i++) d[i] = 0;
            continue;
        }
        int rem = (int)(n - whole);
        v8i keep[2] = {LANE_INDEX < rem, LANE_INDEX + HALF < rem};
        v8f acc[2] = {{0}, {0}}, av, dv, zero = {0};
        for (size_t c = 0; c < whole; c += LANES)
            for (int h = 0; h < 2; h++) load8(&av, a + c + HALF * h), load8(&dv, d + c + HALF * h), acc[h] += av * dv;
        for (int h = 0; end > whole && h < 2; h++) {
            load8(&av, a + whole + HALF * h), load8(&dv, d + whole + HALF * h);
            v8f prod = av * dv;
            select8(&prod, &keep[h], &prod, &zero);
            acc[h] += prod;
        }
        float dot = lanes_tree_sum(acc);
        for (size_t c = 0; c < whole; c += LANES)
            for (int h = 0; h < 2; h++) {
                load8(&av, a + c + HALF * h), load8(&dv, d + c + HALF * h);
                dv = av * (dv - dot) * scale;
                memcpy(d + c + HALF * h, &dv, sizeof dv);
            }
        for (int h = 0; end > whole && h < 2; h++) {
            load8(&av, a + whole + HALF * h), load8(&dv, d + whole + HALF * h);
            dv = av * (dv - dot) * scale;
            select8(&dv, &keep[h], &dv, &zero);
            memcpy(d + whole + HALF * h, &dv, sizeof dv);
        }
        for (size_t i = end; i < T; i++) d[i] = 0;
    }
}

void shard_softmax_forward(const float *x, float *y, size_t N, size_t C) {
    for (size_t n = 0; n < N; n++) {
        const float *r = x + n * C;
        float *o = y + n * C;
        double sum = exp_row(r, o, C, row_max(r, C));
        scale_row(o, C, (float)(1.0 / sum));
    }
}

static shard_status check_targets(const int32_t *targets, int32_t ignore_index, size_t N, size_t V, size_t *used) {
    *used = 0;
    for (size_t n = 0; n < N; n++) {
        if (targets[n] == ignore_index) continue;
        if (targets[n] < 0 || (size_t)targets[n] >= V)
            return shard_error(SHARD_ERR_INVALID_ARG, "cross_entropy: target %d at row %zu is outside 0..%zu (ignore index %d)",
                               targets[n], n, V - 1, ignore_index);
        (*used)++;
    }
    return SHARD_OK;
}

/* Rows of one chunk: their loss terms summed into *total; dlogits of those rows (or a scratch row). */
typedef struct ce_job {
    const float *logits;
    const int32_t *targets;
    int32_t ignore_index;
    size_t N, V;
    float scale, *dlogits;
    double total[SHARD_MAX_CHUNKS];
    int failed[SHARD_MAX_CHUNKS]; /* per chunk: chunks run on several threads */
} ce_job;

static void ce_chunk(void *ctx, size_t chunk, size_t chunks) {
    ce_job *j = ctx;
    size_t r0, rows, V = j->V;
    shard__chunk_range(j->N, chunks, chunk, &r0, &rows);
    float *row = j->dlogits ? NULL : malloc(V * sizeof *row);
    if (!j->dlogits && !row) {
        j->failed[chunk] = 1;
        return;
    }
    double total = 0;
    for (size_t n = r0; n < r0 + rows; n++) {
        const float *r = j->logits + n * V;
        float *d = j->dlogits ? j->dlogits + n * V : row;
        if (j->targets[n] == j->ignore_index) {
            if (j->dlogits) memset(d, 0, V * sizeof *d);
            continue;
        }
        float m = row_max(r, V), at_target = r[j->targets[n]]; /* read before d, which may be r, is written */
        double sum = exp_row(r, d, V, m); /* one pass of exp, kept in d for the gradient */
        total += (double)m + log(sum) - (double)at_target;
        if (j->dlogits) {
            scale_row(d, V, (float)(1.0 / sum) * j->scale);
            d[j->targets[n]] -= j->scale;
        }
    }
    free(row);
    j->total[chunk] = total;
}

shard_status shard_cross_entropy_sum(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N,
                                     size_t V, double denominator, double *loss, size_t *count, float *dlogits) {
    size_t used = 0;
    SHARD_CHECK(check_targets(targets, ignore_index, N, V, &used));
    ce_job j = {.logits = logits, .targets = targets, .ignore_index = ignore_index, .N = N, .V = V,
                .scale = denominator > 0 ? (float)(1.0 / denominator) : 0.0f, .dlogits = dlogits};
    size_t chunks = shard__chunks_for(N * V, 4 * GRAIN);
    shard__parallel_for(chunks, ce_chunk, &j);
    for (size_t k = 0; k < chunks; k++)
        if (j.failed[k]) return shard_error(SHARD_ERR_NO_MEMORY, "cross_entropy: out of memory");
    double total = 0;
    for (size_t k = 0; k < chunks; k++) total += j.total[k];
    *loss = denominator > 0 ? total / denominator : 0.0;
    if (count) *count = used;
    return SHARD_OK;
}

shard_status shard_cross_entropy(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N, size_t V,
                                 float *loss, size_t *count, float *dlogits) {
    size_t used = 0;
    double l = 0;
    SHARD_CHECK(check_targets(targets, ignore_index, N, V, &used));
    SHARD_CHECK(shard_cross_entropy_sum(logits, targets, ignore_index, N, V, (double)used, &l, count, dlogits));
    *loss = (float)l;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- embedding */

static shard_status check_ids(const int32_t *ids, size_t N, size_t rows, const char *what) {
    for (size_t n = 0; n < N; n++)
        if (ids[n] < 0 || (size_t)ids[n] >= rows)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: id %d at position %zu is outside the table's rows 0..%zu", what,
                               ids[n], n, rows - 1);
    return SHARD_OK;
}

shard_status shard_embedding_forward(const float *table, const int32_t *ids, float *y, size_t N, size_t rows, size_t C) {
    SHARD_CHECK(check_ids(ids, N, rows, "embedding"));
    for (size_t n = 0; n < N; n++) memcpy(y + n * C, table + (size_t)ids[n] * C, C * sizeof *y);
    return SHARD_OK;
}

shard_status shard_embedding_backward(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t rows,
                                      size_t C) {
    SHARD_CHECK(check_ids(ids, N, rows, "embedding backward"));
    for (size_t n = 0; n < N; n++) {
        float *row = dtable + (size_t)ids[n] * C;
        for (size_t c = 0; c < C; c++) row[c] += dy[n * C + c];
    }
    return SHARD_OK;
}

/* ---------------------------------------------------------------- attention */

static shard_status check_heads(size_t C, size_t H, const char *what) {
    if (H == 0 || C % H)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: width %zu does not divide into %zu heads", what, C, H);
    return SHARD_OK;
}

/* Per (batch, head): S = Q K^T / sqrt(D) and Y = P V are GEMMs over the
 * strided q, k, v columns of qkv; the causal softmax runs on the rows. */
shard_status shard_attention_forward(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C, size_t H) {
    return shard_attention_forward_dropout(qkv, y, att, B, T, C, H, 0.0f, 0, 0, H, 0);
}

/* The probabilities of (global row b, head h) use dropout offsets from ((b * H + h) * T * T). */
static uint64_t att_offset(size_t first_row, size_t b, size_t H, size_t h, size_t T) {
    return ((uint64_t)(first_row + b) * H + h) * T * T;
}

/* Causal attention skips what the mask zeroes: rows go in blocks of ATT_BLOCK, and a block of rows [r0, r1)
 * multiplies only keys 0..r1 - 1 (the probabilities beyond are exact zeros, so the sums are the same). */
#define ATT_BLOCK 32

/* A pair's q, k, v (and dY) are copied out of their strided columns into contiguous T x D (or, transposed,
 * D x T) scratch first, so that every product is a plain "nn" or "tn" one on packed rows: the strided
 * columns (3C floats apart) fall into a few cache sets, and BLAS's transposed-B path is slow on such
 * small shapes.  On BRIEF's GPT (T 128, D 64, Emerald Rapids) the forward's products went from 60-130
 * to 130-160 GFLOP/s on one core, and one layer's attention (forward + backward, 2 threads, operands in
 * cache) from 2.3 to 1.6 ms; inside the training step, colder, it saves about 0.5 ms.
 * ATT_PACKS is the most T x D buffers a pair uses (backward: q, k, v^T, dY). */
#define ATT_PACKS 4

static void pack_rows(const float *src, size_t lds, size_t rows, size_t cols, float *dst) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * cols, src + r * lds, cols * sizeof *dst);
}

/* dst[c][r] = src[r][c]: cols x rows */
static void pack_transposed(const float *src, size_t lds, size_t rows, size_t cols, float *dst) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * lds + c];
}

/* One attention call cut over its (batch, head) pairs: each pair is independent, so any cut gives the same bits. */
typedef struct att_job {
    const float *qkv, *att, *dy;
    float *y, *att_out, *dqkv;
    size_t B, T, C, H;
    float p_drop;
    uint64_t seed;
    size_t first_row, heads_total, head0;
    float *scratch;        /* per chunk: scratch_floats, allocated by the caller (its rank's ledger) */
    size_t scratch_floats; /* the packed operands; backward's dS (zeroed); dropout's kept probabilities */
    shard__chunk_result result[SHARD_MAX_CHUNKS];
} att_job;

/* packs: 3 T x D buffers (q, k^T, v) */
static shard_status att_forward_pair(const att_job *j, size_t b, size_t h, float *packs, float *dropped) {
    size_t T = j->T, C = j->C, D = C / j->H, td = T * D;
    float scale = 1.0f / sqrtf((float)D);
    const float *q = j->qkv + b * T * 3 * C + h * D, *k = q + C, *v = q + 2 * C;
    float *p = j->att_out + (b * j->H + h) * T * T, *qc = packs, *kt = packs + td, *vc = packs + 2 * td;
    pack_rows(q, 3 * C, T, D, qc), pack_transposed(k, 3 * C, T, D, kt), pack_rows(v, 3 * C, T, D, vc);
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, r1, D, scale, qc + r0 * D, D, kt, T, 0.0f, p + r0 * T, T));
    }
    for (size_t t = 0; t < T; t++) { /* causal softmax of row t over 0..t */
        float *a = p + t * T;
        double sum = exp_row(a, a, t + 1, row_max(a, t + 1));
        scale_row(a, t + 1, (float)(1.0 / sum));
        for (size_t i = t + 1; i < T; i++) a[i] = 0;
    }
    const float *probs = p;
    if (dropped) {
        shard_dropout_forward(p, dropped, T * T, j->p_drop, j->seed,
                              att_offset(j->first_row, b, j->heads_total, j->head0 + h, T));
        probs = dropped;
    }
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, D, r1, 1.0f, probs + r0 * T, T, vc, D, 0.0f,
                                j->y + (b * T + r0) * C + h * D, C));
    }
    return SHARD_OK;
}

static void att_forward_chunk(void *ctx, size_t chunk, size_t chunks) {
    att_job *j = ctx;
    size_t first, count;
    shard__chunk_range(j->B * j->H, chunks, chunk, &first, &count);
    float *packs = j->scratch + chunk * j->scratch_floats;
    float *dropped = j->p_drop > 0 ? packs + 3 * j->T * (j->C / j->H) : NULL;
    shard_status s = SHARD_OK;
    for (size_t i = first; i < first + count && s == SHARD_OK; i++)
        s = att_forward_pair(j, i / j->H, i % j->H, packs, dropped);
    shard__chunk_result_set(&j->result[chunk], s);
}

/* The (batch, head) pairs in one chunk per thread (pairs cost the same), each chunk with its scratch
 * from the accounted allocator, charged to the calling rank: `scratch_floats` per chunk. */
static shard_status att_run(att_job *j, shard__chunk_fn fn, size_t scratch_floats) {
    size_t pairs = j->B * j->H, threads = (size_t)shard__parallel_threads();
    size_t chunks = pairs < threads ? pairs : threads;
    if (!chunks) return SHARD_OK;
    if (!scratch_floats) scratch_floats = 1; /* heads of width 0: nothing to pack, but no NULL buffers */
    size_t bytes = chunks * scratch_floats * sizeof(float);
    j->scratch = shard_alloc(bytes, SHARD_MEM_ACTIVATIONS);
    if (!j->scratch) return shard_error(SHARD_ERR_NO_MEMORY, "attention: out of memory for %zu bytes of scratch", bytes);
    j->scratch_floats = scratch_floats;
    shard__parallel_for(chunks, fn, j);
    shard_free(j->scratch);
    return shard__chunk_results_raise(j->result, chunks);
}

shard_status shard_attention_forward_dropout(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C,
                                             size_t H, float p_drop, uint64_t seed, size_t first_row, size_t heads_total,
                                             size_t head0) {
    SHARD_CHECK(check_heads(C, H, "attention"));
    att_job j = {.qkv = qkv, .y = y, .att_out = att, .B = B, .T = T, .C = C, .H = H, .p_drop = p_drop, .seed = seed,
                 .first_row = first_row, .heads_total = heads_total, .head0 = head0};
    return att_run(&j, att_forward_chunk, 3 * T * (C / H) + (p_drop > 0 ? T * T : 0));
}

/* dV = P^T dY; dP = dY V^T; dS = P (dP - rowsum(P dP)) / sqrt(D); dQ = dS K; dK = dS^T Q. */
shard_status shard_attention_backward(const float *qkv, const float *att, const float *dy, float *dqkv, size_t B,
                                      size_t T, size_t C, size_t H) {
    return shard_attention_backward_dropout(qkv, att, dy, dqkv, B, T, C, H, 0.0f, 0, 0, H, 0);
}

/* With dropout on the probabilities: dV = drop(P)^T dY and dP = drop'(dY V^T), the mask drawn again. */
/* dV and dK sum over the rows t >= j of their column j: a block of columns [j0, j1) reads rows j0..T - 1. */
/* packs: ATT_PACKS T x D buffers (q, k, v^T, dY) */
static shard_status att_backward_pair(const att_job *j, size_t b, size_t h, float *ds, float *packs, float *dropped) {
    size_t T = j->T, C = j->C, D = C / j->H, tt = T * T, td = T * D;
    float scale = 1.0f / sqrtf((float)D);
    const float *q = j->qkv + b * T * 3 * C + h * D, *k = q + C, *v = q + 2 * C;
    const float *p = j->att + (b * j->H + h) * tt, *g = j->dy + b * T * C + h * D;
    float *dq = j->dqkv + b * T * 3 * C + h * D, *dk = dq + C, *dv = dq + 2 * C;
    float *qc = packs, *kc = packs + td, *vt = packs + 2 * td, *gc = packs + 3 * td;
    pack_rows(q, 3 * C, T, D, qc), pack_rows(k, 3 * C, T, D, kc), pack_transposed(v, 3 * C, T, D, vt);
    pack_rows(g, C, T, D, gc);
    uint64_t offset = att_offset(j->first_row, b, j->heads_total, j->head0 + h, T);
    if (dropped) shard_dropout_forward(p, dropped, tt, j->p_drop, j->seed, offset);
    const float *probs = dropped ? dropped : p;
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(1, 0, r1 - r0, D, T - r0, 1.0f, probs + r0 * T + r0, T, gc + r0 * D, D, 0.0f,
                                dv + r0 * 3 * C, 3 * C));
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, r1, D, 1.0f, gc + r0 * D, D, vt, T, 0.0f, ds + r0 * T, T));
    }
    if (dropped) shard_dropout_backward(ds, ds, tt, j->p_drop, j->seed, offset);
    causal_softmax_backward_rows(p, ds, T, scale);
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, D, r1, 1.0f, ds + r0 * T, T, kc, D, 0.0f, dq + r0 * 3 * C, 3 * C));
        SHARD_CHECK(shard_sgemm(1, 0, r1 - r0, D, T - r0, 1.0f, ds + r0 * T + r0, T, qc + r0 * D, D, 0.0f,
                                dk + r0 * 3 * C, 3 * C));
    }
    return SHARD_OK;
}

static void att_backward_chunk(void *ctx, size_t chunk, size_t chunks) {
    att_job *j = ctx;
    size_t first, count, tt = j->T * j->T;
    shard__chunk_range(j->B * j->H, chunks, chunk, &first, &count);
    float *ds = j->scratch + chunk * j->scratch_floats, *packs = ds + tt;
    /* dS zeroed once: the products leave its masked corner unwritten, and dropout's backward reads all of it */
    memset(ds, 0, tt * sizeof *ds);
    float *dropped = j->p_drop > 0 ? packs + ATT_PACKS * j->T * (j->C / j->H) : NULL;
    shard_status s = SHARD_OK;
    for (size_t i = first; i < first + count && s == SHARD_OK; i++)
        s = att_backward_pair(j, i / j->H, i % j->H, ds, packs, dropped);
    shard__chunk_result_set(&j->result[chunk], s);
}

shard_status shard_attention_backward_dropout(const float *qkv, const float *att, const float *dy, float *dqkv,
                                              size_t B, size_t T, size_t C, size_t H, float p_drop, uint64_t seed,
                                              size_t first_row, size_t heads_total, size_t head0) {
    SHARD_CHECK(check_heads(C, H, "attention backward"));
    att_job j = {.qkv = qkv, .att = att, .dy = dy, .dqkv = dqkv, .B = B, .T = T, .C = C, .H = H, .p_drop = p_drop,
                 .seed = seed, .first_row = first_row, .heads_total = heads_total, .head0 = head0};
    size_t tt = T ? T * T : 1;
    return att_run(&j, att_backward_chunk, tt + ATT_PACKS * T * (C / H) + (p_drop > 0 ? tt : 0));
}

/* ---------------------------------------------------------------- dropout */

static uint64_t mix(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int keeps(uint64_t seed, uint64_t index, float p) {
    uint64_t r = mix(seed * 0x9e3779b97f4a7c15ULL + index + 1);
    return (float)((double)(r >> 11) * 0x1.0p-53) >= p;
}

void shard_dropout_forward(const float *x, float *y, size_t n, float p, uint64_t seed, uint64_t offset) {
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < n; i++) y[i] = p > 0 ? (keeps(seed, offset + i, p) ? x[i] * scale : 0.0f) : x[i];
}

void shard_dropout_backward(const float *dy, float *dx, size_t n, float p, uint64_t seed, uint64_t offset) {
    shard_dropout_forward(dy, dx, n, p, seed, offset);
}

/* ---------------------------------------------------------------- conv2d, max-pool */

/* col[Cin*K*K, Ho*Wo] of image x[Cin,H,W] (zero padding). */
static void im2col(const float *x, float *col, size_t Cin, size_t H, size_t W, size_t K, size_t pad, size_t Ho,
                   size_t Wo) {
    for (size_t c = 0; c < Cin; c++)
        for (size_t ki = 0; ki < K; ki++)
            for (size_t kj = 0; kj < K; kj++) {
                float *row = col + ((c * K + ki) * K + kj) * Ho * Wo;
                for (size_t i = 0; i < Ho; i++)
                    for (size_t j = 0; j < Wo; j++) {
                        long yi = (long)(i + ki) - (long)pad, xj = (long)(j + kj) - (long)pad;
                        row[i * Wo + j] = yi < 0 || xj < 0 || yi >= (long)H || xj >= (long)W
                                              ? 0.0f
                                              : x[(c * H + (size_t)yi) * W + (size_t)xj];
                    }
            }
}

static void col2im(const float *col, float *x, size_t Cin, size_t H, size_t W, size_t K, size_t pad, size_t Ho,
                   size_t Wo) {
    memset(x, 0, Cin * H * W * sizeof *x);
    for (size_t c = 0; c < Cin; c++)
        for (size_t ki = 0; ki < K; ki++)
            for (size_t kj = 0; kj < K; kj++) {
                const float *row = col + ((c * K + ki) * K + kj) * Ho * Wo;
                for (size_t i = 0; i < Ho; i++)
                    for (size_t j = 0; j < Wo; j++) {
                        long yi = (long)(i + ki) - (long)pad, xj = (long)(j + kj) - (long)pad;
                        if (yi >= 0 && xj >= 0 && yi < (long)H && xj < (long)W)
                            x[(c * H + (size_t)yi) * W + (size_t)xj] += row[i * Wo + j];
                    }
            }
}

static shard_status conv_sizes(size_t H, size_t W, size_t K, size_t pad, size_t *Ho, size_t *Wo) {
    if (K == 0 || H + 2 * pad < K || W + 2 * pad < K)
        return shard_error(SHARD_ERR_INVALID_ARG, "conv2d: a %zux%zu kernel does not fit a %zux%zu image padded by %zu", K,
                           K, H, W, pad);
    *Ho = H + 2 * pad - K + 1, *Wo = W + 2 * pad - K + 1;
    return SHARD_OK;
}

shard_status shard_conv2d_forward(const float *x, const float *w, const float *b, float *y, size_t N, size_t Cin,
                                  size_t H, size_t W, size_t Cout, size_t K, size_t pad) {
    size_t Ho = 0, Wo = 0;
    SHARD_CHECK(conv_sizes(H, W, K, pad, &Ho, &Wo));
    size_t rows = Cin * K * K, cols = Ho * Wo, need = rows * cols;
    float *col = malloc((need ? need : 1) * sizeof *col);
    if (!col) return shard_error(SHARD_ERR_NO_MEMORY, "conv2d: out of memory");
    shard_status s = SHARD_OK;
    for (size_t n = 0; n < N && s == SHARD_OK; n++) {
        im2col(x + n * Cin * H * W, col, Cin, H, W, K, pad, Ho, Wo);
        float *out = y + n * Cout * cols;
        for (size_t o = 0; b && o < Cout; o++)
            for (size_t i = 0; i < cols; i++) out[o * cols + i] = b[o];
        s = shard_sgemm(0, 0, Cout, cols, rows, 1.0f, w, rows, col, cols, b ? 1.0f : 0.0f, out, cols);
    }
    free(col);
    return s;
}

shard_status shard_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db,
                                   size_t N, size_t Cin, size_t H, size_t W, size_t Cout, size_t K, size_t pad) {
    size_t Ho = 0, Wo = 0;
    SHARD_CHECK(conv_sizes(H, W, K, pad, &Ho, &Wo));
    size_t rows = Cin * K * K, cols = Ho * Wo, need = rows * cols;
    float *col = malloc((need ? need : 1) * sizeof *col);
    if (!col) return shard_error(SHARD_ERR_NO_MEMORY, "conv2d backward: out of memory");
    shard_status s = SHARD_OK;
    for (size_t n = 0; n < N && s == SHARD_OK; n++) {
        const float *g = dy + n * Cout * cols;
        for (size_t o = 0; db && o < Cout; o++)
            for (size_t i = 0; i < cols; i++) db[o] += g[o * cols + i];
        if (dw) {
            im2col(x + n * Cin * H * W, col, Cin, H, W, K, pad, Ho, Wo);
            s = shard_sgemm(0, 1, Cout, rows, cols, 1.0f, g, cols, col, cols, 1.0f, dw, rows);
        }
        if (s == SHARD_OK && dx) {
            s = shard_sgemm(1, 0, rows, cols, Cout, 1.0f, w, rows, g, cols, 0.0f, col, cols);
            if (s == SHARD_OK) col2im(col, dx + n * Cin * H * W, Cin, H, W, K, pad, Ho, Wo);
        }
    }
    free(col);
    return s;
}

void shard_maxpool2d_forward(const float *x, float *y, uint32_t *argmax, size_t N, size_t C, size_t H, size_t W,
                             size_t P) {
    size_t Ho = H / P, Wo = W / P;
    for (size_t nc = 0; nc < N * C; nc++)
        for (size_t i = 0; i < Ho; i++)
            for (size_t j = 0; j < Wo; j++) {
                const float *plane = x + nc * H * W;
                size_t best = i * P * W + j * P; /* within the plane: any N x C fits the 32-bit index */
                for (size_t a = 0; a < P; a++)
                    for (size_t b = 0; b < P; b++) {
                        size_t at = (i * P + a) * W + j * P + b;
                        if (plane[at] > plane[best] || isnan(plane[at])) best = at; /* NaN wins, the last one (PyTorch) */
                    }
                y[(nc * Ho + i) * Wo + j] = plane[best];
                argmax[(nc * Ho + i) * Wo + j] = (uint32_t)best;
            }
}

void shard_maxpool2d_backward(const float *dy, const uint32_t *argmax, float *dx, size_t N, size_t C, size_t H, size_t W,
                              size_t P) {
    size_t per_plane = (H / P) * (W / P);
    memset(dx, 0, N * C * H * W * sizeof *dx);
    for (size_t nc = 0; nc < N * C; nc++)
        for (size_t i = nc * per_plane; i < (nc + 1) * per_plane; i++) dx[nc * H * W + argmax[i]] += dy[i];
}
