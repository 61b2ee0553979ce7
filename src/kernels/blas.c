/* blas.c — OpenBLAS loaded at run time with the right kernels (see blas.h).
 *
 * The core is chosen from CPUID (with the OS's XSAVE support for AVX-512
 * state checked through XGETBV): AVX-512 bf16 -> COOPERLAKE, AVX-512
 * F/BW/DQ/VL -> SKYLAKEX.  OPENBLAS_CORETYPE is set to it before dlopen, so
 * OpenBLAS's constructor picks those kernels.  The reference at the end is
 * a product as the triple loop that defines it (see reference.h). */
#define _GNU_SOURCE
#include "shard/blas.h"

#include "core/alloc_impl.h"
#include "core/flops.h"
#include "core/parallel.h"
#include "kernels/reference.h"
#include "plan/gemm_shapes.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);

static struct {
    pthread_once_t once;
    shard_status status;
    char error[512], description[512];
    void *lib;
    sgemm_fn sgemm;
    void (*set_threads)(int);
    int (*get_threads)(void);
    char *(*corename)(void);
    char *(*config)(void);
} B = {.once = PTHREAD_ONCE_INIT};

/* The best OpenBLAS core for this CPU, or NULL to let OpenBLAS choose. */
static const char *best_core(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return NULL;
    unsigned ebx7 = b;
    int avx512 = (ebx7 >> 16 & 1) && (ebx7 >> 17 & 1) && (ebx7 >> 30 & 1) && (ebx7 >> 31 & 1); /* F, DQ, BW, VL */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return NULL;                        /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    int os_avx512 = (lo & 0xE6) == 0xE6; /* XMM, YMM, opmask, ZMM state enabled */
    if (!avx512 || !os_avx512) return NULL;
    int bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
    return bf16 ? "COOPERLAKE" : "SKYLAKEX";
}

static void load(void) {
    const char *env = getenv("OPENBLAS_CORETYPE"), *force = getenv("SHARD_BLAS_CORETYPE");
    char was[64] = "";
    if (env) snprintf(was, sizeof was, "%s", env);
    const char *chosen = NULL, *how = "";
    if (force && strcasecmp(force, "env") == 0) {
        how = "kept from the environment (SHARD_BLAS_CORETYPE=env)";
    } else if (force && *force) {
        chosen = force, how = "forced by SHARD_BLAS_CORETYPE";
    } else if ((chosen = best_core())) {
        how = "chosen by shard from CPUID";
    } else {
        how = env ? "kept from the environment" : "chosen by OpenBLAS";
    }
    if (chosen) setenv("OPENBLAS_CORETYPE", chosen, 1);
    /* OpenBLAS starts no threads of its own (it reads OPENBLAS_NUM_THREADS as it loads): shard spreads the
     * work over the cores itself; the environment is put back for child processes (the PyTorch reference) */
    const char *user_threads = getenv("OPENBLAS_NUM_THREADS");
    char saved[32] = "";
    if (user_threads) snprintf(saved, sizeof saved, "%s", user_threads);
    cpu_set_t allowed; /* the cores this process may run on (taskset, a cpuset, a batch system's binding) */
    long cores =
        sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : sysconf(_SC_NPROCESSORS_ONLN);
    long width = user_threads && atoi(user_threads) > 0 ? atoi(user_threads) : cores;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    const char *names[] = {"libopenblas.so.0", "libopenblas.so"};
    for (size_t i = 0; i < 2 && !B.lib; i++) B.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (user_threads)
        setenv("OPENBLAS_NUM_THREADS", saved, 1);
    else
        unsetenv("OPENBLAS_NUM_THREADS");
    shard__parallel_set_threads(width > 0 ? (int)width : 1);
    if (!B.lib) {
        snprintf(B.error, sizeof B.error, "OpenBLAS could not be loaded (%s); install libopenblas0 (make deps does)",
                 dlerror());
        B.status = SHARD_ERR_UNSUPPORTED;
        return;
    }
    B.sgemm = (sgemm_fn)dlsym(B.lib, "cblas_sgemm");
    B.set_threads = (void (*)(int))dlsym(B.lib, "openblas_set_num_threads");
    B.get_threads = (int (*)(void))dlsym(B.lib, "openblas_get_num_threads");
    B.corename = (char *(*)(void))dlsym(B.lib, "openblas_get_corename");
    B.config = (char *(*)(void))dlsym(B.lib, "openblas_get_config");
    if (!B.sgemm) {
        snprintf(B.error, sizeof B.error, "the loaded OpenBLAS has no cblas_sgemm");
        B.status = SHARD_ERR_UNSUPPORTED;
        return;
    }
    int n = snprintf(B.description, sizeof B.description, "%s, core %s (%s", B.config ? B.config() : "OpenBLAS",
                     B.corename ? B.corename() : "?", how);
    if (chosen && was[0] && strcasecmp(was, chosen) != 0)
        n += snprintf(B.description + n, sizeof B.description - (size_t)n, "; OPENBLAS_CORETYPE was %s", was);
    snprintf(B.description + n, sizeof B.description - (size_t)n, ")");
    B.status = SHARD_OK;
}

shard_status shard_blas_init(void) {
    pthread_once(&B.once, load);
    if (B.status < 0) return shard_error(B.status, "%s", B.error);
    return SHARD_OK;
}

shard_status shard_blas_set_threads(int threads) {
    SHARD_CHECK(shard_blas_init());
    if (threads < 1)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_blas_set_threads: %d threads (need >= 1)", threads);
    /* OpenBLAS runs each call on one thread; shard spreads products and element-wise kernels over
     * `threads` itself (parallel.h), so no BLAS thread spins on a core the next loop needs */
    if (B.set_threads) B.set_threads(1);
    shard__parallel_set_threads(threads);
    return SHARD_OK;
}

int shard_blas_threads(void) { return shard_blas_init() == SHARD_OK ? shard__parallel_threads() : 1; }

const char *shard_blas_description(void) { return shard_blas_init() == SHARD_OK ? B.description : B.error; }

/* A product cut into blocks of C's rows (or columns, when there are more), one single-threaded BLAS call
 * per block on the process's threads (parallel.h).  With a bias, each block first fills its part of C
 * with the bias rows (on the thread that then accumulates into them) and the call adds with beta 1. */
typedef struct gemm_job {
    int ta, tb, by_rows;
    size_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *Bm, *bias;
    float *C;
} gemm_job;

static void fill_bias(float *C, size_t ldc, const float *bias, size_t M, size_t N) {
    for (size_t m = 0; m < M; m++) memcpy(C + m * ldc, bias, N * sizeof *C);
}

static void gemm_chunk(void *ctx, size_t chunk, size_t chunks) {
    const gemm_job *j = ctx;
    size_t at, n;
    shard__chunk_range(j->by_rows ? j->M : j->N, chunks, chunk, &at, &n);
    if (!n) return;
    const float *A = j->A, *Bm = j->Bm;
    float *C = j->C;
    size_t M = j->M, N = j->N;
    const float *bias = j->bias;
    if (j->by_rows)
        A += j->ta ? at : at * j->lda, C += at * j->ldc, M = n;
    else
        Bm += j->tb ? at * j->ldb : at, C += at, N = n, bias = bias ? bias + at : NULL;
    if (bias) fill_bias(C, j->ldc, bias, M, N);
    B.sgemm(CBLAS_ROW_MAJOR, j->ta ? CBLAS_TRANS : CBLAS_NO_TRANS, j->tb ? CBLAS_TRANS : CBLAS_NO_TRANS, (int)M, (int)N,
            (int)j->K, j->alpha, A, (int)(j->lda ? j->lda : 1), Bm, (int)(j->ldb ? j->ldb : 1), bias ? 1.0f : j->beta,
            C, (int)j->ldc);
}

static shard_status gemm(const char *name, int transpose_a, int transpose_b, size_t M, size_t N, size_t K, float alpha,
                         const float *A, size_t lda, const float *Bm, size_t ldb, float beta, const float *bias,
                         float *C, size_t ldc) {
    SHARD_CHECK(shard_blas_init());
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: sizes %zu x %zu x %zu exceed the BLAS int range", name, M, N, K);
    size_t a_cols = transpose_a ? M : K, b_cols = transpose_b ? K : N;
    if ((M && N && !C) || ldc < N || lda < a_cols || ldb < b_cols)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: %zu x %zu x %zu with lda %zu, ldb %zu, ldc %zu: a stride is "
                           "shorter than its row",
                           name, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return SHARD_OK;
    shard__flops_add(2.0 * (double)M * (double)N * (double)K);
    shard__gemm_shapes_add(M, N, K);
    if (shard__mem_planning()) return SHARD_OK; /* the analyzer's dry run: counted, not computed */
    int threads = shard__parallel_threads();
    gemm_job j = {transpose_a, transpose_b, M >= N, M, N, K, lda, ldb, ldc, alpha, beta, A, Bm, bias, C};
    if (threads > 1 && !shard__parallel_inside() && (double)M * (double)N * (double)K >= 4.0e6) {
        size_t along = M >= N ? M : N, chunks = (size_t)threads < along / 16 ? (size_t)threads : along / 16;
        shard__parallel_for(chunks ? chunks : 1, gemm_chunk, &j);
    } else {
        gemm_chunk(&j, 0, 1); /* the whole product as one block, on this thread */
    }
    return SHARD_OK;
}

shard_status shard_sgemm(int transpose_a, int transpose_b, size_t M, size_t N, size_t K, float alpha, const float *A,
                         size_t lda, const float *Bm, size_t ldb, float beta, float *C, size_t ldc) {
    return gemm("shard_sgemm", transpose_a, transpose_b, M, N, K, alpha, A, lda, Bm, ldb, beta, NULL, C, ldc);
}

shard_status shard_sgemm_bias(int transpose_a, int transpose_b, size_t M, size_t N, size_t K, float alpha,
                              const float *A, size_t lda, const float *Bm, size_t ldb, const float *bias, float *C,
                              size_t ldc) {
    return gemm("shard_sgemm_bias", transpose_a, transpose_b, M, N, K, alpha, A, lda, Bm, ldb, 0.0f, bias, C, ldc);
}

static shard_status gemm_args(const shard_gemm *g) {
    return gemm("shard_sgemm_pair", g->transpose_a, g->transpose_b, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B,
                g->ldb, g->beta, NULL, g->C, g->ldc);
}

typedef struct gemm_pair_job {
    const shard_gemm *g[2];
    shard__chunk_result result[2];
} gemm_pair_job;

static void gemm_pair_chunk(void *ctx, size_t chunk, size_t chunks) {
    (void)chunks;
    gemm_pair_job *j = ctx;
    shard__chunk_result_set(&j->result[chunk], gemm_args(j->g[chunk])); /* inside the region: whole on this thread */
}

/* Below this many multiply-adds in either product, waking the helper costs more than running both here
 * (a review measured 8 x 16 x 16: 0.22 us in turn, 1.18 us at once; 64^3: 7.0 against 5.7 us). */
#define PAIR_FROM 262144.0

static double madds(const shard_gemm *g) { return (double)g->M * (double)g->N * (double)g->K; }

shard_status shard_sgemm_pair(const shard_gemm *first, const shard_gemm *second) {
    SHARD_CHECK(shard_blas_init());
    if (!first || !second || shard__parallel_threads() != 2 || shard__parallel_inside() || madds(first) < PAIR_FROM ||
        madds(second) < PAIR_FROM) {
        if (first) SHARD_CHECK(gemm_args(first));
        return second ? gemm_args(second) : SHARD_OK;
    }
    gemm_pair_job j = {{first, second}, {{SHARD_OK, ""}, {SHARD_OK, ""}}};
    shard__parallel_for(2, gemm_pair_chunk, &j);
    return shard__chunk_results_raise(j.result, 2);
}

/* ---------------------------------------------------------------- reference */

/* element (r, c) of op(X), X row-major with row stride ld */
static double ref_at(const float *X, size_t ld, int transposed, size_t r, size_t c) {
    return transposed ? X[c * ld + r] : X[r * ld + c];
}

void shard__ref_sgemm(int transpose_a, int transpose_b, size_t M, size_t N, size_t K, float alpha, const float *A,
                      size_t lda, const float *Bm, size_t ldb, const float *bias, float beta, float *C, size_t ldc) {
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            double s = 0;
            for (size_t k = 0; k < K; k++) s += ref_at(A, lda, transpose_a, m, k) * ref_at(Bm, ldb, transpose_b, k, n);
            s *= alpha;
            if (bias)
                s += bias[n];
            else if (beta != 0)
                s += (double)beta * C[m * ldc + n];
            C[m * ldc + n] = (float)s;
        }
}
