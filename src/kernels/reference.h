/* reference.h — internal: a plain C reference for every CPU kernel, each defined at the end of its
 * kernel's file (blas.c, linear.c, elementwise.c, layernorm.c, softmax.c, cross_entropy.c,
 * embedding.c, attention.c, conv.c, optim_kernels.c).
 *
 * A reference is the op's definition written as straightforward scalar loops, summing in double, with
 * no threads, vectors, chunks or packing: what tests/test_kernels.c holds each fast kernel to, within a
 * tolerance per op (the fast kernels round differently, not wrongly).  Arguments are those of the fast
 * kernel they mirror (layers.h, optim.h, blas.h); they do not check their input beyond what the
 * arithmetic needs (sizes that cannot be computed are refused as the fast kernel refuses them). */
#ifndef SHARD_KERNELS_REFERENCE_H
#define SHARD_KERNELS_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "shard/optim.h"
#include "shard/status.h"

/* C = alpha op(A) op(B) + (bias ? bias added to every row : beta C): shard_sgemm, or with a bias
 * shard_sgemm_bias (beta then unused) */
void shard__ref_sgemm(int transpose_a, int transpose_b, size_t M, size_t N, size_t K, float alpha, const float *A,
                      size_t lda, const float *B, size_t ldb, const float *bias, float beta, float *C, size_t ldc);

void shard__ref_linear_forward(const float *x, const float *W, const float *b, float *y, size_t N, size_t in,
                               size_t out);
void shard__ref_linear_backward(const float *x, const float *W, const float *dy, float *dx, float *dW, float *db,
                                size_t N, size_t in, size_t out);

void shard__ref_relu_forward(const float *x, float *y, size_t n);
void shard__ref_relu_backward(const float *x, const float *dy, float *dx, size_t n);
void shard__ref_gelu_forward(const float *x, float *y, size_t n);
void shard__ref_gelu_backward(const float *x, const float *dy, float *dx, size_t n);
void shard__ref_gelu_forward_slope(float *x, float *y, size_t n);
void shard__ref_add(const float *a, const float *b, float *y, size_t n);
void shard__ref_mul(const float *a, const float *b, float *y, size_t n);
/* dropout's forward and backward alike (the same mask) */
void shard__ref_dropout(const float *x, float *y, size_t n, float p, uint64_t seed, uint64_t offset);

void shard__ref_layernorm_forward(const float *x, const float *gamma, const float *beta, float eps, float *y,
                                  float *mean, float *rstd, size_t N, size_t C);
void shard__ref_layernorm_backward(const float *x, const float *gamma, const float *mean, const float *rstd,
                                   const float *dy, float *dx, float *dgamma, float *dbeta, size_t N, size_t C);

void shard__ref_softmax_forward(const float *x, float *y, size_t N, size_t C);
/* Returns the loss summed over rows whose target is not ignore_index, divided by denominator (0 when
 * it is not positive); targets must be in 0..V-1.  dlogits (may be NULL) as shard_cross_entropy_sum. */
double shard__ref_cross_entropy_sum(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N,
                                    size_t V, double denominator, size_t *count, float *dlogits);

/* ids must be in the table's rows */
void shard__ref_embedding_forward(const float *table, const int32_t *ids, float *y, size_t N, size_t C);
void shard__ref_embedding_backward(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t C);

/* Causal attention with dropout p_drop on the probabilities (0: none), the mask keyed as
 * shard_attention_forward_dropout keys it. */
shard_status shard__ref_attention_forward(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C,
                                          size_t H, float p_drop, uint64_t seed, size_t first_row, size_t heads_total,
                                          size_t head0);
shard_status shard__ref_attention_backward(const float *qkv, const float *att, const float *dy, float *dqkv, size_t B,
                                           size_t T, size_t C, size_t H, float p_drop, uint64_t seed, size_t first_row,
                                           size_t heads_total, size_t head0);

shard_status shard__ref_conv2d_forward(const float *x, const float *w, const float *b, float *y, size_t N, size_t Cin,
                                       size_t H, size_t W, size_t Cout, size_t K, size_t pad);
shard_status shard__ref_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                                        float *db, size_t N, size_t Cin, size_t H, size_t W, size_t Cout, size_t K,
                                        size_t pad);
void shard__ref_maxpool2d_forward(const float *x, float *y, uint32_t *argmax, size_t N, size_t C, size_t H, size_t W,
                                  size_t P);
void shard__ref_maxpool2d_backward(const float *dy, const uint32_t *argmax, float *dx, size_t N, size_t C, size_t H,
                                   size_t W, size_t P);

void shard__ref_sgd_update(const shard_sgd_config *c, uint64_t step, float lr, float *p, const float *g, float *buf,
                           size_t n);
/* AdamW with the gradient multiplied by clip (1: shard_adamw_update); g is left as it is */
void shard__ref_adamw_update(const shard_adamw_config *c, uint64_t step, float lr, float clip, float *p, const float *g,
                             float *m, float *v, size_t n);
double shard__ref_sum_squares(const float *g, size_t n);
float shard__ref_clip_factor(double global_norm, float max_norm);
void shard__ref_scale(float *g, size_t n, float factor);

#endif
