/* blas.h — matrix multiply through OpenBLAS, at the speed this CPU allows.
 *
 * Debian's OpenBLAS is built for many CPUs and picks its kernels when the
 * library is loaded, unless OPENBLAS_CORETYPE names a core; an environment
 * that sets it to an older core (Haswell: AVX2) halves the speed on an
 * AVX-512 machine.  So shard does not link OpenBLAS: shard_blas_init() first
 * chooses the core from what this CPU supports (Cooperlake with AVX-512 bf16,
 * SkylakeX with AVX-512, else OpenBLAS's own choice), overriding a weaker
 * OPENBLAS_CORETYPE, and only then loads the library (dlopen), whose
 * constructor reads the variable.  SHARD_BLAS_CORETYPE=NAME forces a core;
 * SHARD_BLAS_CORETYPE=env keeps the environment's.
 *
 * With several thread ranks on the cores, each rank's GEMMs should run on
 * one thread (shard_blas_set_threads(1)); with one rank, on all cores. */
#ifndef SHARD_BLAS_H
#define SHARD_BLAS_H

#include <stddef.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Load OpenBLAS once (every other call here does it on first use). */
shard_status shard_blas_init(void);

/* Threads OpenBLAS may use per call (process-wide). */
shard_status shard_blas_set_threads(int threads);
int shard_blas_threads(void);

/* "OpenBLAS 0.3.21 ..., core Cooperlake (chosen by shard; OPENBLAS_CORETYPE was Haswell)" */
const char *shard_blas_description(void);

/* Row-major C = alpha op(A) op(B) + beta C, with op(X) = X or X^T;
 * op(A) is M x K, op(B) is K x N, C is M x N; lda/ldb/ldc are row strides. */
shard_status shard_sgemm(int transpose_a, int transpose_b, size_t M, size_t N, size_t K, float alpha, const float *A,
                         size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc);

/* Row-major C = alpha op(A) op(B) + bias, the bias (N values; NULL: none) added to every row of C;
 * C's old values are not read (beta 0), and the bias must not overlap C.  Large products fill each
 * block's bias on the thread that then multiplies into it. */
shard_status shard_sgemm_bias(int transpose_a, int transpose_b, size_t M, size_t N, size_t K, float alpha,
                              const float *A, size_t lda, const float *B, size_t ldb, const float *bias, float *C,
                              size_t ldc);

/* One product's arguments, as shard_sgemm takes them. */
typedef struct shard_gemm {
    int transpose_a, transpose_b;
    size_t M, N, K;
    float alpha;
    const float *A;
    size_t lda;
    const float *B;
    size_t ldb;
    float beta;
    float *C;
    size_t ldc;
} shard_gemm;

/* Two independent products (a backward's dX and dW: neither writes what the other reads).  On two
 * threads each runs whole on one of them, at once: the operand both read is packed once per product
 * instead of once per block, which on the benchmark GPT saved 1.5 ms of a 130 ms step; otherwise one after
 * the other (also when either is small: under 64^3 multiply-adds), each cut over the threads as shard_sgemm
 * does.  Either may be NULL: the other runs alone.  The first error is returned. */
shard_status shard_sgemm_pair(const shard_gemm *first, const shard_gemm *second);

#ifdef __cplusplus
}
#endif
#endif
