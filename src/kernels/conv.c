/* conv.c — 2-D convolution (stride 1, zero padding) and max-pooling over NCHW images, forward and
 * backward, and their plain reference.
 *
 * Convolution is im2col plus one product per image (shard_sgemm); max-pooling keeps each window's
 * winner for the backward.  The reference at the end is the direct sum over the kernel window in
 * double (see reference.h). */
#include "shard/layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reference.h"
#include "shard/blas.h"

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
        return shard_error(SHARD_ERR_INVALID_ARG, "conv2d: a %zux%zu kernel does not fit a %zux%zu image padded by %zu",
                           K, K, H, W, pad);
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
                        if (plane[at] > plane[best] || isnan(plane[at]))
                            best = at; /* NaN wins, the last one (PyTorch) */
                    }
                y[(nc * Ho + i) * Wo + j] = plane[best];
                argmax[(nc * Ho + i) * Wo + j] = (uint32_t)best;
            }
}

void shard_maxpool2d_backward(const float *dy, const uint32_t *argmax, float *dx, size_t N, size_t C, size_t H,
                              size_t W, size_t P) {
    size_t per_plane = (H / P) * (W / P);
    memset(dx, 0, N * C * H * W * sizeof *dx);
    for (size_t nc = 0; nc < N * C; nc++)
        for (size_t i = nc * per_plane; i < (nc + 1) * per_plane; i++) dx[nc * H * W + argmax[i]] += dy[i];
}

/* ---------------------------------------------------------------- reference */

/* Pixel (yi, xj) of plane c of image x[Cin, H, W] at a kernel offset, or 0 in the padding */
static double ref_pixel(const float *x, size_t c, long yi, long xj, size_t H, size_t W) {
    if (yi < 0 || xj < 0 || yi >= (long)H || xj >= (long)W) return 0.0;
    return x[(c * H + (size_t)yi) * W + (size_t)xj];
}

shard_status shard__ref_conv2d_forward(const float *x, const float *w, const float *b, float *y, size_t N, size_t Cin,
                                       size_t H, size_t W, size_t Cout, size_t K, size_t pad) {
    size_t Ho = 0, Wo = 0;
    SHARD_CHECK(conv_sizes(H, W, K, pad, &Ho, &Wo));
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < Cout; o++)
            for (size_t i = 0; i < Ho; i++)
                for (size_t j = 0; j < Wo; j++) {
                    double s = b ? b[o] : 0.0;
                    for (size_t c = 0; c < Cin; c++)
                        for (size_t ki = 0; ki < K; ki++)
                            for (size_t kj = 0; kj < K; kj++)
                                s += (double)w[((o * Cin + c) * K + ki) * K + kj] *
                                    ref_pixel(x + n * Cin * H * W, c, (long)(i + ki) - (long)pad,
                                              (long)(j + kj) - (long)pad, H, W);
                    y[((n * Cout + o) * Ho + i) * Wo + j] = (float)s;
                }
    return SHARD_OK;
}

shard_status shard__ref_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                                        float *db, size_t N, size_t Cin, size_t H, size_t W, size_t Cout, size_t K,
                                        size_t pad) {
    size_t Ho = 0, Wo = 0;
    SHARD_CHECK(conv_sizes(H, W, K, pad, &Ho, &Wo));
    for (size_t o = 0; db && o < Cout; o++) { /* db += sums of dy over images and pixels */
        double s = db[o];
        for (size_t n = 0; n < N; n++)
            for (size_t i = 0; i < Ho * Wo; i++) s += dy[(n * Cout + o) * Ho * Wo + i];
        db[o] = (float)s;
    }
    for (size_t o = 0; dw && o < Cout; o++) /* dw += sums of dy times the pixel each weight met */
        for (size_t c = 0; c < Cin; c++)
            for (size_t ki = 0; ki < K; ki++)
                for (size_t kj = 0; kj < K; kj++) {
                    double s = dw[((o * Cin + c) * K + ki) * K + kj];
                    for (size_t n = 0; n < N; n++)
                        for (size_t i = 0; i < Ho; i++)
                            for (size_t j = 0; j < Wo; j++)
                                s += (double)dy[((n * Cout + o) * Ho + i) * Wo + j] *
                                    ref_pixel(x + n * Cin * H * W, c, (long)(i + ki) - (long)pad,
                                              (long)(j + kj) - (long)pad, H, W);
                    dw[((o * Cin + c) * K + ki) * K + kj] = (float)s;
                }
    for (size_t n = 0; dx && n < N; n++) /* dx = sums of dy times the weight each output met the pixel with */
        for (size_t c = 0; c < Cin; c++)
            for (size_t yi = 0; yi < H; yi++)
                for (size_t xj = 0; xj < W; xj++) {
                    double s = 0;
                    for (size_t o = 0; o < Cout; o++)
                        for (size_t ki = 0; ki < K; ki++)
                            for (size_t kj = 0; kj < K; kj++) {
                                long i = (long)(yi + pad) - (long)ki, j = (long)(xj + pad) - (long)kj;
                                if (i < 0 || j < 0 || i >= (long)Ho || j >= (long)Wo) continue;
                                s += (double)w[((o * Cin + c) * K + ki) * K + kj] *
                                    dy[((n * Cout + o) * Ho + (size_t)i) * Wo + (size_t)j];
                            }
                    dx[((n * Cin + c) * H + yi) * W + xj] = (float)s;
                }
    return SHARD_OK;
}

void shard__ref_maxpool2d_forward(const float *x, float *y, uint32_t *argmax, size_t N, size_t C, size_t H, size_t W,
                                  size_t P) {
    size_t Ho = H / P, Wo = W / P;
    for (size_t o = 0; o < N * C * Ho * Wo; o++) { /* output o: window (i, j) of plane nc */
        size_t i = o / Wo % Ho, j = o % Wo;
        const float *plane = x + o / (Ho * Wo) * H * W;
        size_t best = i * P * W + j * P;
        for (size_t k = 0; k < P * P; k++) { /* the window's largest, the first of equals */
            size_t at = (i * P + k / P) * W + j * P + k % P;
            if (plane[at] > plane[best]) best = at;
        }
        y[o] = plane[best];
        argmax[o] = (uint32_t)best;
    }
}

void shard__ref_maxpool2d_backward(const float *dy, const uint32_t *argmax, float *dx, size_t N, size_t C, size_t H,
                                   size_t W, size_t P) {
    size_t Ho = H / P, Wo = W / P;
    for (size_t i = 0; i < N * C * H * W; i++) dx[i] = 0;
    for (size_t nc = 0; nc < N * C; nc++)
        for (size_t k = 0; k < Ho * Wo; k++) dx[nc * H * W + argmax[nc * Ho * Wo + k]] += dy[nc * Ho * Wo + k];
}
