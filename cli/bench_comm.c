/* bench_comm.c — `shard bench comm`: collective bandwidth, reported as nccl-tests does.
 *
 * For each size (doubling from --min to --max) every rank runs warm-up
 * iterations, then at least 5 timed ones; an iteration's time is the slowest
 * rank's, and the figure is the median.  algbw = bytes / time; busbw scales it
 * by 2(n-1)/n for all_reduce and (n-1)/n for all_gather, reduce_scatter and
 * all_to_all (1 for sendrecv), so numbers compare across rank counts.
 * `bytes` is the whole buffer: all_reduce's vector, all_gather's output,
 * reduce_scatter's input, all_to_all's per-rank send buffer, sendrecv's message.
 * Under MPI the raw MPI call is timed in the same run as a baseline, the two
 * alternating iteration by iteration. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/cost.h"
#include "shard/shard.h"

static const char *const bench_ops[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv"};

typedef struct bench_result {
    uint64_t bytes;
    double time_us, baseline_time_us;
} bench_result;

typedef struct bench_run {
    const bench_options *opt;
    bench_result *results; /* filled by rank 0 */
    int nsizes;
    int ranks;
    char backend[16];
} bench_run;

/* Elements in each buffer for `bytes` under `op`. */
static void buffer_counts(const char *op, uint64_t bytes, int n, size_t es, size_t *send_count, size_t *recv_count,
                          size_t *arg_count) {
    size_t total = (size_t)(bytes / es);
    size_t per_rank = total / (size_t)n;
    if (strcmp(op, "all_reduce") == 0 || strcmp(op, "sendrecv") == 0) {
        *send_count = *recv_count = *arg_count = total;
    } else if (strcmp(op, "all_gather") == 0) {
        *send_count = per_rank, *recv_count = per_rank * (size_t)n, *arg_count = per_rank;
    } else if (strcmp(op, "reduce_scatter") == 0) {
        *send_count = per_rank * (size_t)n, *recv_count = per_rank, *arg_count = per_rank;
    } else { /* all_to_all */
        *send_count = *recv_count = per_rank * (size_t)n, *arg_count = per_rank;
    }
}

static shard_status run_op(shard_comm *comm, const char *op, const void *send, void *recv, size_t count,
                           shard_dtype dtype) {
    int n = shard_comm_size(comm), r = shard_comm_rank(comm);
    if (strcmp(op, "all_reduce") == 0) return shard_comm_all_reduce(comm, send, recv, count, dtype, SHARD_OP_SUM);
    if (strcmp(op, "all_gather") == 0) return shard_comm_all_gather(comm, send, recv, count, dtype);
    if (strcmp(op, "reduce_scatter") == 0)
        return shard_comm_reduce_scatter(comm, send, recv, count, dtype, SHARD_OP_SUM);
    if (strcmp(op, "all_to_all") == 0) return shard_comm_all_to_all(comm, send, recv, count, dtype);
    shard_request *reqs[2] = {NULL, NULL};
    SHARD_CHECK(shard_comm_irecv(comm, recv, count, dtype, (r + n - 1) % n, 7, &reqs[0]));
    shard_status s = shard_comm_isend(comm, send, count, dtype, (r + 1) % n, 7, &reqs[1]);
    shard_status w = shard_request_wait_all(s < 0 ? 1 : 2, reqs);
    return s < 0 ? s : w;
}

static shard_status one_op(shard_comm *comm, const bench_options *opt, int raw, const void *send, void *recv,
                           size_t count) {
    return raw ? shard_comm_mpi_raw(comm, opt->op, send, recv, count, opt->dtype)
               : run_op(comm, opt->op, send, recv, count, opt->dtype);
}

/* Median over iterations of the slowest rank's time, in microseconds, for
 * shard's call and (with_raw) the raw MPI call.  The two alternate within
 * each iteration, so drifting machine load affects both alike. */
/* --cold: before each call, this rank writes twice its last-level cache's worth of other memory (the
 * step's other work) and then its send buffer afresh (data the step has just produced), so that the
 * call meets caches as a training step leaves them, not the peers' unchanged send data still cached
 * from the previous iteration and a receive buffer written a moment ago. */
typedef struct cold_caches {
    unsigned char *sweep;
    size_t sweep_bytes;
} cold_caches;

static shard_status cold_open(cold_caches *cc, int cold) {
    cc->sweep = NULL, cc->sweep_bytes = 0;
    if (!cold) return SHARD_OK;
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    cc->sweep_bytes = 2 * (size_t)(llc > 0 ? llc : 32L << 20);
    cc->sweep = malloc(cc->sweep_bytes);
    return cc->sweep
        ? SHARD_OK
        : shard_error(SHARD_ERR_NO_MEMORY, "bench: out of memory for a %zu-byte cache sweep", cc->sweep_bytes);
}

static void cold_prepare(const cold_caches *cc, void *send, size_t send_bytes, int iteration) {
    if (!cc->sweep) return;
    memset(cc->sweep, iteration, cc->sweep_bytes);
    memset(send, 1 + iteration % 7, send_bytes);
}

static shard_status time_ops(shard_comm *comm, const bench_options *opt, int with_raw, void *send, size_t send_bytes,
                             void *recv, size_t count, double *median_us, double *raw_median_us) {
    int kinds = with_raw ? 2 : 1;
    cold_caches cc;
    SHARD_CHECK(cold_open(&cc, opt->cold));
    /* warm-up; its slowest time decides how many timed iterations fit in ~0.2 s */
    double warm = 0;
    shard_status s = SHARD_OK;
    for (int i = 0; i < opt->warmup && s == SHARD_OK; i++)
        for (int k = 0; k < kinds && s == SHARD_OK; k++) {
            cold_prepare(&cc, send, send_bytes, i);
            double t0 = shard_clock_seconds();
            s = one_op(comm, opt, k, send, recv, count);
            warm = shard_clock_seconds() - t0;
        }
    if (s == SHARD_OK) s = shard_comm_all_reduce(comm, &warm, &warm, 1, SHARD_F64, SHARD_OP_MAX);
    int iters = opt->iters;
    if (iters <= 0) {
        iters = warm > 0 ? (int)(0.2 / warm) : 100;
        if (iters < 5) iters = 5;
        if (iters > (cc.sweep ? 30 : 100)) iters = cc.sweep ? 30 : 100; /* a sweep costs milliseconds */
    }
    double *times = s == SHARD_OK ? calloc(2 * (size_t)iters, sizeof *times) : NULL; /* [shard | raw] */
    if (s == SHARD_OK && !times) s = shard_error(SHARD_ERR_NO_MEMORY, "bench: out of memory");
    for (int i = 0; i < iters && s == SHARD_OK; i++)
        for (int k = 0; k < kinds && s == SHARD_OK; k++) {
            cold_prepare(&cc, send, send_bytes, i);
            s = shard_comm_barrier(comm);
            if (s < 0) break;
            double t0 = shard_clock_seconds();
            s = one_op(comm, opt, k, send, recv, count);
            times[(size_t)k * (size_t)iters + (size_t)i] = shard_clock_seconds() - t0;
        }
    if (s == SHARD_OK) s = shard_comm_all_reduce(comm, times, times, 2 * (size_t)iters, SHARD_F64, SHARD_OP_MAX);
    if (s == SHARD_OK) {
        *median_us = 1e6 * cli_median(times, iters);
        if (with_raw) *raw_median_us = 1e6 * cli_median(times + iters, iters);
    }
    free(times);
    free(cc.sweep);
    return s;
}

shard_status bench_comm_op_time(shard_comm *comm, const char *op, uint64_t bytes, shard_dtype dtype, int cold,
                                double *median_us, uint64_t *moved) {
    bench_options opt;
    bench_options_default(&opt);
    opt.op = op, opt.dtype = dtype, opt.iters = 0, opt.cold = cold;
    int n = shard_comm_size(comm);
    size_t es = shard_dtype_size(dtype), sc, rc, ac;
    buffer_counts(op, bytes, n, es, &sc, &rc, &ac);
    void *send = shard_alloc((sc ? sc : 1) * es, SHARD_MEM_COMM),
         *recv = shard_alloc((rc ? rc : 1) * es, SHARD_MEM_COMM);
    shard_status s = send && recv
        ? SHARD_OK
        : shard_error(SHARD_ERR_NO_MEMORY, "bench: out of memory for %llu bytes", (unsigned long long)bytes);
    if (s == SHARD_OK) memset(send, 1, sc * es);
    double raw_us = 0;
    if (s == SHARD_OK) s = time_ops(comm, &opt, 0, send, sc * es, recv, ac, median_us, &raw_us);
    *moved = strcmp(op, "all_reduce") == 0 || strcmp(op, "sendrecv") == 0 ? (uint64_t)ac * es
                                                                          : (uint64_t)ac * es * (uint64_t)n;
    shard_free(send), shard_free(recv);
    return s;
}

/* A buffer of `n` elements of `dtype` as a 1-D tensor view, so shard_tensor_set/get convert its elements
 * (the check's values are small integers: exact in every dtype). */
static shard_tensor view_of(shard_dtype dtype, void *buf, size_t n) {
    return (shard_tensor){.dtype = dtype, .ndim = 1, .shape = {n}, .strides = {1}, .data = buf};
}

/* What rank r sends at element i.  Reductions: only the rank with (r + i) % n == 0 adds anything, so each
 * sum is 1 + i % 5 on any number of ranks, exact in every dtype (int8 and bf16 included), and an element
 * taken from the wrong rank or place shows; the others: the sender's number and the place, under 70. */
static double sent_value(const char *op, int r, int n, size_t i) {
    if (strcmp(op, "all_reduce") == 0 || strcmp(op, "reduce_scatter") == 0)
        return ((size_t)r + i) % (size_t)n == 0 ? 1.0 + (double)(i % 5) : 0.0;
    return (double)((r + 1) % 64) + (double)(i % 7);
}

/* One correctness check per size before timing, in the benchmark's own dtype. */
static shard_status verify(shard_comm *comm, const char *op, shard_dtype dtype, void *send, void *recv,
                           size_t send_count, size_t recv_count, size_t count) {
    int n = shard_comm_size(comm), r = shard_comm_rank(comm);
    shard_tensor out = view_of(dtype, send, send_count), in = view_of(dtype, recv, recv_count);
    for (size_t i = 0; i < send_count; i++) SHARD_CHECK(shard_tensor_set(&out, i, sent_value(op, r, n, i)));
    SHARD_CHECK(run_op(comm, op, send, recv, count, dtype));
    for (size_t i = 0; i < recv_count; i++) {
        double expect;
        if (strcmp(op, "all_reduce") == 0)
            expect = 1.0 + (double)(i % 5);
        else if (strcmp(op, "reduce_scatter") == 0)
            expect = 1.0 + (double)(((size_t)r * count + i) % 5);
        else if (strcmp(op, "all_gather") == 0)
            expect = sent_value(op, (int)(i / count), n, i % count);
        else if (strcmp(op, "all_to_all") == 0)
            expect = sent_value(op, (int)(i / count), n, (size_t)r * count + i % count);
        else
            expect = sent_value(op, (r + n - 1) % n, n, i);
        double got = shard_tensor_get(&in, i);
        if (got != expect)
            return shard_error(SHARD_ERR_INTERNAL,
                               "bench %s: wrong result at element %zu on rank %d: got %g, expected %g (%s)", op, i, r,
                               got, expect, shard_dtype_name(dtype));
    }
    return SHARD_OK;
}

static shard_status bench_rank(shard_comm *comm, void *arg) {
    bench_run *run = arg;
    const bench_options *opt = run->opt;
    int n = shard_comm_size(comm), r = shard_comm_rank(comm);
    int raw = strcmp(shard_comm_backend(comm), "mpi") == 0 && opt->baseline;
    size_t es = shard_dtype_size(opt->dtype);
    size_t max_send, max_recv, max_arg;
    buffer_counts(opt->op, opt->max_bytes, n, es, &max_send, &max_recv, &max_arg);
    void *send = shard_alloc((max_send ? max_send : 1) * (es > 4 ? es : 4), SHARD_MEM_COMM);
    void *recv = shard_alloc((max_recv ? max_recv : 1) * (es > 4 ? es : 4), SHARD_MEM_COMM);
    if (!send || !recv) {
        shard_free(send);
        shard_free(recv);
        return SHARD_ERR_NO_MEMORY;
    }
    shard_status s = SHARD_OK;
    int k = 0;
    for (uint64_t bytes = opt->min_bytes; bytes <= opt->max_bytes && s == SHARD_OK && k < 64; bytes *= 2, k++) {
        size_t sc, rc, ac;
        buffer_counts(opt->op, bytes, n, es, &sc, &rc, &ac);
        if (ac == 0) { /* a row of zeros would read as a bandwidth */
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "bench comm: %llu bytes of %s give %s over %d ranks no element each; "
                            "give --min %zu or more",
                            (unsigned long long)bytes, shard_dtype_name(opt->dtype), opt->op, n,
                            strcmp(opt->op, "all_reduce") == 0 || strcmp(opt->op, "sendrecv") == 0 ? es
                                                                                                   : es * (size_t)n);
            break;
        }
        s = verify(comm, opt->op, opt->dtype, send, recv, sc, rc, ac);
        if (s < 0) break;
        memset(send, 1, sc * es);
        double t = 0, tb = 0;
        s = time_ops(comm, opt, raw, send, sc * es, recv, ac, &t, &tb);
        if (s == SHARD_OK && r == 0) {
            /* the bytes actually moved: a size not divisible by the ranks is rounded down */
            uint64_t moved = strcmp(opt->op, "all_reduce") == 0 || strcmp(opt->op, "sendrecv") == 0
                ? (uint64_t)ac * es
                : (uint64_t)ac * es * (uint64_t)n;
            run->results[k] = (bench_result){moved, t, raw ? tb : 0};
        }
        if (bytes == 0) break;
    }
    if (r == 0) {
        run->nsizes = k;
        run->ranks = n;
        snprintf(run->backend, sizeof run->backend, "%s", shard_comm_backend(comm));
    }
    shard_free(send);
    shard_free(recv);
    return s;
}

static void print_results(const bench_run *run) {
    const bench_options *opt = run->opt;
    double factor = shard_cost_busbw_factor(opt->op, run->ranks);
    if (!opt->json) {
        printf("# shard bench comm: %s, %s, %d ranks, %s, median of >= 5 timed iterations%s\n", opt->op, run->backend,
               run->ranks, shard_dtype_name(opt->dtype), opt->cold ? ", cold caches" : "");
        printf("%12s %12s %12s %12s", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s");
        if (run->results[0].baseline_time_us > 0) printf(" %14s %8s", "mpi_busbw_GB/s", "ratio");
        printf("\n");
    }
    for (int k = 0; k < run->nsizes; k++) {
        const bench_result *b = &run->results[k];
        double algbw = b->time_us > 0 ? (double)b->bytes / (b->time_us * 1e3) : 0; /* GB/s */
        double busbw = algbw * factor;
        double base_bus = b->baseline_time_us > 0 ? (double)b->bytes / (b->baseline_time_us * 1e3) * factor : 0;
        if (opt->json) {
            printf("{\"op\": \"%s\", \"backend\": \"%s\", \"ranks\": %d, \"bytes\": %llu, \"time_us\": %.3f, "
                   "\"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g", /* significant digits: a slow run's GB/s are small */
                   opt->op, run->backend, run->ranks, (unsigned long long)b->bytes, b->time_us, algbw, busbw);
            if (b->baseline_time_us > 0)
                printf(", \"baseline_busbw_gbps\": %.6g, \"ratio\": %.6g", base_bus,
                       base_bus > 0 ? busbw / base_bus : 0.0);
            printf("%s}\n", opt->cold ? ", \"cold\": true" : "");
        } else {
            printf("%12llu %12.1f %12.3f %12.3f", (unsigned long long)b->bytes, b->time_us, algbw, busbw);
            if (b->baseline_time_us > 0) printf(" %14.3f %8.3f", base_bus, base_bus > 0 ? busbw / base_bus : 0.0);
            printf("\n");
        }
    }
    fflush(stdout);
}

shard_status bench_comm_run(const bench_options *opt) {
    bench_run run = {.opt = opt};
    run.results = calloc(64, sizeof *run.results);
    if (!run.results) return shard_error(SHARD_ERR_NO_MEMORY, "bench: out of memory");
    shard_status s = shard_launch_with(&opt->launch, bench_rank, &run);
    /* under MPI only rank 0 holds the results */
    char where[256];
    int mpi_rank = 0;
    if (shard_launch_detect_mpi(where, sizeof where, &mpi_rank, NULL) && mpi_rank != 0) {
        free(run.results);
        return s;
    }
    if (s == SHARD_OK) print_results(&run);
    free(run.results);
    return s;
}

void bench_options_default(bench_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->op = "all_reduce";
    opt->dtype = SHARD_F32;
    opt->min_bytes = 4096;
    opt->max_bytes = 256ULL << 20;
    opt->warmup = 3;
    opt->baseline = 1;
    opt->launch = shard_launch_config_default();
}

int bench_op_valid(const char *op) {
    for (size_t i = 0; i < sizeof bench_ops / sizeof bench_ops[0]; i++)
        if (strcmp(op, bench_ops[i]) == 0) return 1;
    return 0;
}
