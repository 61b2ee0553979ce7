/* bench_gemm.c — `shard bench gemm`: sgemm GFLOP/s through shard_sgemm
 * (OpenBLAS with the kernels shard chose) against this machine's fp32 FMA
 * peak, measured in the same run by a loop of independent 512-bit (or
 * 256-bit without AVX-512) fused multiply-adds on one thread, times the
 * threads used.
 * Figures are medians over --iters runs (>= 5). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/blas.h"
#include "shard/clock.h"
#include "shard/comm.h"

enum { CHAINS = 12 };

/* FLOPs done by `rounds` rounds of CHAINS independent vector FMAs. */
__attribute__((target("avx512f"))) static double fma_loop_512(long rounds) {
    __m512 acc[CHAINS];
    __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long r = 0; r < rounds; r++)
        for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    float sink = 0;
    for (int i = 0; i < CHAINS; i++) sink += _mm512_reduce_add_ps(acc[i]);
    volatile float keep = sink;
    (void)keep;
    return (double)rounds * CHAINS * 16 * 2;
}

__attribute__((target("avx2,fma"))) static double fma_loop_256(long rounds) {
    __m256 acc[CHAINS];
    __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long r = 0; r < rounds; r++)
        for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    float out[8], sink = 0;
    for (int i = 0; i < CHAINS; i++) {
        _mm256_storeu_ps(out, acc[i]);
        for (int k = 0; k < 8; k++) sink += out[k];
    }
    volatile float keep = sink;
    (void)keep;
    return (double)rounds * CHAINS * 8 * 2;
}

typedef struct peak_job {
    int avx512;
    long rounds;
    double flops, seconds;
} peak_job;

static void *peak_thread(void *arg) {
    peak_job *j = arg;
    double t0 = shard_clock_seconds();
    j->flops = j->avx512 ? fma_loop_512(j->rounds) : fma_loop_256(j->rounds);
    j->seconds = shard_clock_seconds() - t0;
    return NULL;
}

/* GFLOP/s of `threads` threads running FMA loops together (~0.2 s). */
double bench_fma_peak(int threads) {
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f");
    peak_job jobs[64];
    pthread_t tid[64];
    if (threads > 64) threads = 64;
    double total = 0;
    for (int i = 0; i < threads; i++) jobs[i] = (peak_job){avx512, 40000000L / (avx512 ? 1 : 2), 0, 0};
    for (int i = 1; i < threads; i++) pthread_create(&tid[i], NULL, peak_thread, &jobs[i]);
    peak_thread(&jobs[0]);
    for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
    for (int i = 0; i < threads; i++) total += jobs[i].flops / jobs[i].seconds / 1e9;
    return total;
}

int bench_cores(void) {
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    return n > 0 ? n : online > 0 ? (int)online : 1;
}

double bench_peak_of_threads(int threads, int samples) {
    double peaks[16];
    samples = samples < 1 ? 1 : samples > 16 ? 16 : samples;
    for (int i = 0; i < samples; i++) peaks[i] = bench_fma_peak(1);
    int cores = bench_cores();
    return cli_median(peaks, samples) * (threads < cores ? threads : cores);
}

shard_status bench_gemm_run(const bench_gemm_options *opt) {
    SHARD_CHECK(shard_blas_init());
    SHARD_CHECK(shard_blas_set_threads(opt->threads));
    size_t n = opt->size;
    float *a = malloc(n * n * sizeof *a), *b = malloc(n * n * sizeof *b), *c = malloc(n * n * sizeof *c);
    double *peaks = calloc((size_t)opt->iters, sizeof *peaks), *rates = calloc((size_t)opt->iters, sizeof *rates);
    if (!a || !b || !c || !peaks || !rates) {
        free(a), free(b), free(c), free(peaks), free(rates);
        return shard_error(SHARD_ERR_NO_MEMORY, "bench gemm: out of memory for %zu x %zu", n, n);
    }
    for (size_t i = 0; i < n * n; i++) a[i] = (float)(i % 13) * 0.01f, b[i] = (float)(i % 7) * 0.02f, c[i] = 0;
    shard_status s = shard_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    double flops = 2.0 * (double)n * (double)n * (double)n;
    for (int it = 0; it < opt->iters && s == SHARD_OK; it++) { /* alternate: the peak and the GEMM see the same load */
        /* per core, times the cores the threads can use: running the loops together on a shared VM measured
         * less than a GEMM on both reaches */
        peaks[it] = bench_peak_of_threads(opt->threads, 1);
        int reps = n >= 2048 ? 1 : (int)(2048 / n) * (int)(2048 / n);
        double t0 = shard_clock_seconds();
        for (int r = 0; r < reps && s == SHARD_OK; r++) s = shard_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        rates[it] = flops * reps / (shard_clock_seconds() - t0) / 1e9;
    }
    if (s == SHARD_OK) {
        double ratios[1000];
        int m = opt->iters < 1000 ? opt->iters : 1000;
        for (int i = 0; i < m; i++) ratios[i] = rates[i] / peaks[i];
        double rate = cli_median(rates, opt->iters), peak = cli_median(peaks, opt->iters),
               ratio = cli_median(ratios, m);
        if (opt->json)
            printf("{\"size\": %zu, \"threads\": %d, \"gflops\": %.2f, \"fma_peak_gflops\": %.2f, "
                   "\"fraction_of_peak\": %.4f, "
                   "\"blas\": \"%s\"}\n",
                   n, opt->threads, rate, peak, ratio, shard_blas_description());
        else
            printf("sgemm %zux%zux%zu, %d thread%s: %.1f GFLOP/s; FMA peak measured now %.1f GFLOP/s; %.1f%% of peak "
                   "(median of %d)\n  %s\n",
                   n, n, n, opt->threads, opt->threads == 1 ? "" : "s", rate, peak, 100 * ratio, opt->iters,
                   shard_blas_description());
    }
    free(a), free(b), free(c), free(peaks), free(rates);
    return s;
}

/* One of the step's products: C[M x N] (+)= op(A) op(B) over K, `count` times a step. */
typedef struct step_product {
    int ta, tb, bias;
    size_t M, N, K;
    float beta;
    size_t count;
} step_product;

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

shard_status bench_gpt_products(const shard_gpt_config *c, size_t rows, int iters, double *ms, double *gflop) {
    size_t C = c->n_embd, F = 4 * c->n_embd, V = c->vocab_size, L = c->n_layer, N = rows;
    const size_t in[4] = {C, C, C, F}, out[4] = {3 * C, C, F, C}; /* c_attn, attn c_proj, c_fc, mlp c_proj */
    step_product p[15];
    size_t n = 0;
    for (int k = 0; k < 4; k++) {
        p[n++] = (step_product){0, 0, 1, N, out[k], in[k], 0.0f, L}; /* y = x W + b */
        p[n++] = (step_product){0, 1, 0, N, in[k], out[k], 0.0f, L}; /* dx = dy W^T */
        p[n++] = (step_product){1, 0, 0, in[k], out[k], N, 1.0f, L}; /* dW += x^T dy */
    }
    p[n++] = (step_product){0, 1, 0, N, V, C, 0.0f, 1}; /* logits = h wte^T */
    p[n++] = (step_product){0, 0, 0, N, C, V, 0.0f, 1}; /* dh = dlogits wte */
    p[n++] = (step_product){1, 0, 0, V, C, N, 1.0f, 1}; /* dwte += dlogits^T h */
    size_t most = 0;
    for (size_t i = 0; i < n; i++)
        most = max_size(most, max_size(p[i].M * p[i].N, max_size(p[i].M * p[i].K, p[i].K * p[i].N)));
    /* from the allocator the model's tensors come from (2 MiB pages for big blocks), as in the step */
    float *a = shard_alloc(most * sizeof *a, SHARD_MEM_OTHER), *b = shard_alloc(most * sizeof *b, SHARD_MEM_OTHER);
    float *out_c = shard_alloc(most * sizeof *out_c, SHARD_MEM_OTHER);
    float *bias = calloc(max_size(V, F), sizeof *bias);
    double *t = calloc((size_t)iters * n, sizeof *t); /* t[i * iters + round] */
    shard_status s = a && b && out_c && bias && t ? SHARD_OK : SHARD_ERR_NO_MEMORY;
    if (s < 0) s = shard_error(s, "bench train: out of memory for the step's products (%zu floats each)", most);
    for (size_t i = 0; s == SHARD_OK && i < most; i++)
        a[i] = (float)(i % 13) * 0.01f - 0.06f, b[i] = (float)(i % 7) * 0.02f - 0.06f, out_c[i] = 0;
    /* rounds over all the shapes (the first one a warm-up): a slow moment of a shared machine then
     * touches one round of each shape, not all the runs of one */
    for (int round = -1; round < iters && s == SHARD_OK; round++)
        for (size_t i = 0; s == SHARD_OK && i < n; i++) {
            const step_product *q = &p[i];
            size_t lda = q->ta ? q->M : q->K, ldb = q->tb ? q->K : q->N;
            double t0 = shard_clock_seconds();
            s = q->bias ? shard_sgemm_bias(q->ta, q->tb, q->M, q->N, q->K, 1.0f, a, lda, b, ldb, bias, out_c, q->N)
                        : shard_sgemm(q->ta, q->tb, q->M, q->N, q->K, 1.0f, a, lda, b, ldb, q->beta, out_c, q->N);
            if (round >= 0) t[i * (size_t)iters + (size_t)round] = (shard_clock_seconds() - t0) * 1e3;
        }
    *ms = 0, *gflop = 0;
    for (size_t i = 0; s == SHARD_OK && i < n; i++) {
        *ms += (double)p[i].count * cli_median(t + i * (size_t)iters, iters);
        *gflop += (double)p[i].count * 2.0 * (double)p[i].M * (double)p[i].N * (double)p[i].K / 1e9;
    }
    shard_free(a), shard_free(b), shard_free(out_c), free(bias), free(t);
    return s;
}
