/* layernorm.c — LayerNorm over the last dim, forward and backward, and its plain reference.
 *
 * Rows run in chunks on the process's threads; a row's sums run in 16 lanes (vec.h) added in a fixed
 * order, so a result is the same bits on any thread count.  The reference at the end is the definition
 * in double (see reference.h). */
#include "shard/layers.h"

#include <math.h>
#include <stdlib.h>

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/reference.h"
#include "kernels/vec.h"

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
    layernorm_forward_rows(j->x + r * j->C, j->gamma, j->beta, j->eps, j->y + r * j->C, j->mean + r, j->rstd + r, n,
                           j->C);
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
    layernorm_backward_rows(j->x + r * C, j->gamma, j->mean_in + r, j->rstd_in + r, j->dy + r * C,
                            j->dx ? j->dx + r * C : NULL, dg, dg + C, n, C);
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
    ln_job j = {.x = x,
                .gamma = gamma,
                .mean_in = mean,
                .rstd_in = rstd,
                .dy = dy,
                .dx = dx,
                .partial = partial,
                .N = N,
                .C = C};
    shard__parallel_for(chunks, ln_backward_chunk, &j);
    for (size_t k = 0; k < chunks; k++) {
        add_partials(dgamma, partial + k * 2 * C, C);
        add_partials(dbeta, partial + k * 2 * C + C, C);
    }
    free(partial);
}

/* ---------------------------------------------------------------- reference */

void shard__ref_layernorm_forward(const float *x, const float *gamma, const float *beta, float eps, float *y,
                                  float *mean, float *rstd, size_t N, size_t C) {
    for (size_t n = 0; n < N; n++) {
        const float *r = x + n * C;
        double m = 0, v = 0;
        for (size_t c = 0; c < C; c++) m += r[c];
        m /= (double)C;
        for (size_t c = 0; c < C; c++) v += (r[c] - m) * (r[c] - m);
        v /= (double)C;
        double s = 1.0 / sqrt(v + (double)eps);
        for (size_t c = 0; c < C; c++) y[n * C + c] = (float)((r[c] - m) * s * gamma[c] + beta[c]);
        mean[n] = (float)m, rstd[n] = (float)s;
    }
}

void shard__ref_layernorm_backward(const float *x, const float *gamma, const float *mean, const float *rstd,
                                   const float *dy, float *dx, float *dgamma, float *dbeta, size_t N, size_t C) {
    for (size_t c = 0; c < C; c++) { /* sums over rows, added once into what the gradients held */
        double dg = dgamma[c], db = dbeta[c];
        for (size_t n = 0; n < N; n++) {
            dg += (double)dy[n * C + c] * ((x[n * C + c] - (double)mean[n]) * rstd[n]);
            db += dy[n * C + c];
        }
        dgamma[c] = (float)dg, dbeta[c] = (float)db;
    }
    for (size_t n = 0; dx && n < N; n++) {
        /* dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma */
        const float *r = x + n * C, *g = dy + n * C;
        double m = mean[n], s = rstd[n], sum_dxhat = 0, sum_dxhat_xhat = 0;
        for (size_t c = 0; c < C; c++) {
            double xhat = (r[c] - m) * s, dxhat = (double)g[c] * gamma[c];
            sum_dxhat += dxhat, sum_dxhat_xhat += dxhat * xhat;
        }
        for (size_t c = 0; c < C; c++) {
            double xhat = (r[c] - m) * s;
            double dxhat = (double)g[c] * gamma[c];
            dx[n * C + c] = (float)(s * (dxhat - sum_dxhat / (double)C - xhat * sum_dxhat_xhat / (double)C));
        }
    }
}
