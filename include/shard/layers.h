/* layers.h — the layers models are built from, forward and backward, fp32.
 *
 * Plain functions on contiguous row-major arrays with their sizes spelled
 * out: every model and every parallel strategy calls the same math, and a
 * reader can follow a training step without an autograd engine.  Backward
 * functions ADD into parameter gradients (so micro-batches accumulate) and
 * WRITE input gradients; an input gradient pointer may be NULL when the
 * caller does not need it.  Activations a backward needs are passed back in
 * (the forward's input, or what it saved). */
#ifndef SHARD_LAYERS_H
#define SHARD_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- linear: y[N,out] = x[N,in] W[in,out] + b[out] (GPT-2's Conv1D layout; b may be NULL) ---- */
shard_status shard_linear_forward(const float *x, const float *W, const float *b, float *y, size_t N, size_t in,
                                  size_t out);
/* dx[N,in] = dy W^T; dW += x^T dy; db += column sums of dy (dx, db may be NULL; dx must not alias x) */
shard_status shard_linear_backward(const float *x, const float *W, const float *dy, float *dx, float *dW, float *db,
                                   size_t N, size_t in, size_t out);

/* ---- element-wise ---- */
void shard_relu_forward(const float *x, float *y, size_t n);
void shard_relu_backward(const float *x, const float *dy, float *dx, size_t n); /* dx may alias dy */
/* GELU, tanh form (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
void shard_gelu_forward(const float *x, float *y, size_t n);
void shard_gelu_backward(const float *x, const float *dy, float *dx, size_t n); /* dx may alias dy */
/* y = GELU(x) (y must not be x), and x is replaced by GELU'(x): all the backward needs, which is then
 * shard_mul(dy, x, dx) with the same bits as shard_gelu_backward on the original x */
void shard_gelu_forward_slope(float *x, float *y, size_t n);
/* y = a + b (residual); its backward passes dy to both */
void shard_add(const float *a, const float *b, float *y, size_t n);
/* y = a * b, element by element (y may alias a or b) */
void shard_mul(const float *a, const float *b, float *y, size_t n);

/* ---- layer norm over the last dim C of x[N,C]; saves mean[N] and rstd[N] ---- */
void shard_layernorm_forward(const float *x, const float *gamma, const float *beta, float eps, float *y, float *mean,
                             float *rstd, size_t N, size_t C);
void shard_layernorm_backward(const float *x, const float *gamma, const float *mean, const float *rstd, const float *dy,
                              float *dx, float *dgamma, float *dbeta, size_t N, size_t C);

/* ---- softmax over the last dim, and cross-entropy ---- */
void shard_softmax_forward(const float *x, float *y, size_t N, size_t C);
/* Mean over the rows whose target is not ignore_index of -log softmax(logits)[target].
 * *count gets those rows.  If dlogits is not NULL it gets d(mean loss)/d(logits)
 * (rows of ignored targets are zero); dlogits may be logits itself (the
 * gradient written over them).  Targets outside 0..V-1 other than
 * ignore_index are refused. */
shard_status shard_cross_entropy(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N, size_t V,
                                 float *loss, size_t *count, float *dlogits);
/* The same with the mean taken over `denominator` items instead of this call's
 * rows (a data-parallel rank's slice of a global batch): *loss = sum / denominator
 * and dlogits = d(*loss)/d(logits). */
shard_status shard_cross_entropy_sum(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N,
                                     size_t V, double denominator, double *loss, size_t *count, float *dlogits);

/* ---- embedding: y[N,C] = table[ids[n]]; backward adds dy rows into dtable ---- */
shard_status shard_embedding_forward(const float *table, const int32_t *ids, float *y, size_t N, size_t rows, size_t C);
shard_status shard_embedding_backward(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t rows,
                                      size_t C);

/* ---- causal multi-head self-attention ----
 * qkv[B,T,3C] holds q | k | v (C = H * D each, GPT-2's c_attn output);
 * y[B,T,C] is the heads' outputs side by side (before the output projection);
 * att[B,H,T,T] saves the softmax probabilities (row t uses columns 0..t). */
shard_status shard_attention_forward(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C, size_t H);
/* dqkv[B,T,3C] written from dy[B,T,C], qkv and the saved att. */
shard_status shard_attention_backward(const float *qkv, const float *att, const float *dy, float *dqkv, size_t B,
                                      size_t T, size_t C, size_t H);
/* The same with dropout (probability p_drop) on the attention probabilities,
 * the mask keyed by (seed, global row first_row + b, global head head0 + h of
 * heads_total, t, s) — so a rank holding some heads (tensor parallel) draws
 * their part of the whole mask; att keeps the probabilities before dropout. */
shard_status shard_attention_forward_dropout(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C,
                                             size_t H, float p_drop, uint64_t seed, size_t first_row,
                                             size_t heads_total, size_t head0);
shard_status shard_attention_backward_dropout(const float *qkv, const float *att, const float *dy, float *dqkv,
                                              size_t B, size_t T, size_t C, size_t H, float p_drop, uint64_t seed,
                                              size_t first_row, size_t heads_total, size_t head0);

/* ---- dropout: a seeded, counter-based mask (the same (seed, offset) gives the same mask) ----
 * keeps each element with probability 1 - p and scales it by 1 / (1 - p); p = 0 copies. */
void shard_dropout_forward(const float *x, float *y, size_t n, float p, uint64_t seed, uint64_t offset);
void shard_dropout_backward(const float *dy, float *dx, size_t n, float p, uint64_t seed, uint64_t offset);

/* ---- images, NCHW ----
 * conv2d: x[N,Cin,H,W], w[Cout,Cin,K,K], b[Cout] (may be NULL), stride 1, zero padding `pad`:
 * y[N,Cout,H+2pad-K+1,W+2pad-K+1].  Backward: dx written (may be NULL), dw and db added. */
shard_status shard_conv2d_forward(const float *x, const float *w, const float *b, float *y, size_t N, size_t Cin,
                                  size_t H, size_t W, size_t Cout, size_t K, size_t pad);
shard_status shard_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db,
                                   size_t N, size_t Cin, size_t H, size_t W, size_t Cout, size_t K, size_t pad);
/* max-pool, window and stride P: y[N,C,H/P,W/P]; argmax[] saves the winners (each an index within
 * its H x W plane of x, so H W < 2^32 is the only limit). */
void shard_maxpool2d_forward(const float *x, float *y, uint32_t *argmax, size_t N, size_t C, size_t H, size_t W,
                             size_t P);
/* dx (all N*C*H*W of it) written: dy routed to the winners. */
void shard_maxpool2d_backward(const float *dy, const uint32_t *argmax, float *dx, size_t N, size_t C, size_t H,
                              size_t W, size_t P);

#ifdef __cplusplus
}
#endif
#endif
