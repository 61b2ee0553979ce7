/* bench_gemm.c — `shard bench gemm`: sgemm GFLOP/s through shard_sgemm
 * (OpenBLAS with the kernels shard chose) against this machine's fp32 FMA
 * peak, measured in the same run by a loop of independent 512-bit (or
 * 256-bit without AVX-512) fused multiply-adds on one thread, times the
 * threads used.
 * Figures are medians over --iters runs (>= 5). */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "comm/comm_impl.h"
#include "shard/blas.h"

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
    double t0 = shard__now();
    j->flops = j->avx512 ? fma_loop_512(j->rounds) : fma_loop_256(j->rounds);
    j->seconds = shard__now() - t0;
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
        peaks[it] = opt->threads * bench_fma_peak(1); /* per core, times the cores: running the loops together on a
                                                   shared VM measured less than a GEMM on both reaches */
        int reps = n >= 2048 ? 1 : (int)(2048 / n) * (int)(2048 / n);
        double t0 = shard__now();
        for (int r = 0; r < reps && s == SHARD_OK; r++) s = shard_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        rates[it] = flops * reps / (shard__now() - t0) / 1e9;
    }
    if (s == SHARD_OK) {
        double ratios[1000];
        int m = opt->iters < 1000 ? opt->iters : 1000;
        for (int i = 0; i < m; i++) ratios[i] = rates[i] / peaks[i];
        double rate = cli_median(rates, opt->iters), peak = cli_median(peaks, opt->iters), ratio = cli_median(ratios, m);
        if (opt->json)
            printf("{\"size\": %zu, \"threads\": %d, \"gflops\": %.2f, \"fma_peak_gflops\": %.2f, \"fraction_of_peak\": %.4f, "
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
