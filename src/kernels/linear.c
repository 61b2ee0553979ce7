/* linear.c — the linear layer, forward and backward, and its plain reference.
 *
 * Both products go through shard_sgemm (blas.c); the bias gradient is a column sum over rows, cut into
 * chunks of columns for the process's threads.  The reference at the end is the definition written as
 * loops (see reference.h). */
#include "shard/layers.h"

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/reference.h"
#include "kernels/vec.h"
#include "shard/blas.h"

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
    shard_gemm gx = {0, 1, N, in, out, 1.0f, dy, out, W, out, 0.0f, dx, in}; /* dx = dy W^T */
    shard_gemm gw = {1, 0, in, out, N, 1.0f, x, in, dy, out, 1.0f, dW, out}; /* dW += x^T dy */
    SHARD_CHECK(shard_sgemm_pair(dx ? &gx : NULL, dW ? &gw : NULL));
    if (db) bias_grad(dy, db, N, out);
    return SHARD_OK;
}

/* ---------------------------------------------------------------- reference */

void shard__ref_linear_forward(const float *x, const float *W, const float *b, float *y, size_t N, size_t in,
                               size_t out) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < out; o++) {
            double s = b ? (double)b[o] : 0.0;
            for (size_t i = 0; i < in; i++) s += (double)x[n * in + i] * (double)W[i * out + o];
            y[n * out + o] = (float)s;
        }
}

void shard__ref_linear_backward(const float *x, const float *W, const float *dy, float *dx, float *dW, float *db,
                                size_t N, size_t in, size_t out) {
    for (size_t n = 0; dx && n < N; n++) /* dx = dy W^T */
        for (size_t i = 0; i < in; i++) {
            double s = 0;
            for (size_t o = 0; o < out; o++) s += (double)dy[n * out + o] * (double)W[i * out + o];
            dx[n * in + i] = (float)s;
        }
    for (size_t i = 0; dW && i < in; i++) /* dW += x^T dy */
        for (size_t o = 0; o < out; o++) {
            double s = dW[i * out + o];
            for (size_t n = 0; n < N; n++) s += (double)x[n * in + i] * (double)dy[n * out + o];
            dW[i * out + o] = (float)s;
        }
    for (size_t o = 0; db && o < out; o++) { /* db += column sums of dy */
        double s = db[o];
        for (size_t n = 0; n < N; n++) s += dy[n * out + o];
        db[o] = (float)s;
    }
}
