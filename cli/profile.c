/* profile.c — `shard profile`: this machine measured for the cost model (cost_model.h), written as a
 * JSON file a person can read and edit (docs/cli.md names every key).
 *
 *   shard profile [--out machine.json] [--quick]
 *
 * GEMM throughput over a grid of shapes covering the tiny and benchmark GPTs' products, at one thread
 * and at every core; copy and add bandwidth over large vectors; each collective's alpha and beta on
 * thread ranks (2 and 4), fitted by least squares to `bench comm`'s own timing of a sweep of sizes
 * (bench_comm_op_time); and the non-GEMM fractions of a step, from tiny GPT steps (one rank on every
 * core, and one thread rank per core) set against the model's GEMM, communication and optimizer time.
 * Each rate and fraction is a median over repetitions, with its spread written beside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"
#include "profile.h"
#include "shard/clock.h"

static const char *const USAGE =
    "usage: shard profile [--out FILE] [--quick]\n"
    "\n"
    "Measure this machine for the cost model of `shard analyze --profile` (under 2 minutes): GEMM\n"
    "GFLOP/s over a grid of shapes at 1 thread and at all cores in 5 passes, each pass followed by tiny\n"
    "GPT steps on one rank and on one thread rank per core for the non-GEMM fractions (each rate and\n"
    "fraction the median of its repetitions, with its spread), copy and add bandwidth, and each\n"
    "collective's alpha (us) and beta (GB/s of bytes sent per rank) on 2 and 4 thread ranks, fitted to\n"
    "a sweep of sizes. The file is JSON (keys in docs/cli.md), written whole or not at all.\n"
    "\n"
    "options:\n"
    "  --out FILE               where the profile goes (default machine.json)\n"
    "  --quick                  a few seconds: fewer shapes and sizes, shorter timings (for tests)\n";

/* The median of n > 0 values and their spread, (max - min) / median (0 when the median is not > 0);
 * sorts v. */
static double median_spread(double *v, int n, double *spread) {
    double median = cli_median(v, n);
    *spread = median > 0 ? (v[n - 1] - v[0]) / median : 0;
    return median;
}

enum { GEMM_PASSES = 5, GEMM_MAX_CALLS = 4096 };

/* GFLOP/s of one timed repetition of an M x N x K product on the current threads, after a warm-up
 * call: as many calls as fill `rep_seconds` (one at least). */
static shard_status gemm_repetition(size_t m, size_t n, size_t k, double rep_seconds, double *gflops) {
    float *a = calloc(m * k, sizeof *a), *b = calloc(k * n, sizeof *b), *c = calloc(m * n, sizeof *c);
    shard_status s = a && b && c ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "profile: out of memory");
    for (size_t i = 0; s == SHARD_OK && i < m * k; i++) a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; s == SHARD_OK && i < k * n; i++) b[i] = (float)(i % 5) * 0.1f;
    if (s == SHARD_OK) s = shard_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n); /* warm: pages, caches */
    double flops = 2.0 * (double)m * (double)n * (double)k, t0 = shard_clock_seconds();
    if (s == SHARD_OK) s = shard_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
    double t = shard_clock_seconds() - t0;
    if (t < rep_seconds) { /* short: as many calls as fill the repetition, timed together */
        int calls = t > 0 ? (int)(rep_seconds / t) + 1 : GEMM_MAX_CALLS;
        if (calls > GEMM_MAX_CALLS) calls = GEMM_MAX_CALLS;
        t0 = shard_clock_seconds();
        for (int i = 0; s == SHARD_OK && i < calls; i++) s = shard_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
        t = shard_clock_seconds() - t0, flops *= (double)calls;
    }
    *gflops = flops / (t > 0 ? t : 1e-9) / 1e9;
    free(a), free(b), free(c);
    return s;
}

/* The grid of shapes at 1 thread and at every core, their rates not yet measured. */
static void gemm_grid(int quick, shard_machine_profile *p) {
    /* powers of two up to 1024, then 4096: a GPT's products (rows = batch x seq, its width and its
     * multiples) fall on the grid, not between two shapes equally near */
    static const size_t full_m[] = {64, 128, 256, 512, 1024, 4096}, full_nk[] = {64, 128, 256, 512, 1024, 4096};
    static const size_t quick_m[] = {256, 1024}, quick_nk[] = {128, 512};
    const size_t *ms = quick ? quick_m : full_m, *nks = quick ? quick_nk : full_nk;
    size_t nm = quick ? 2 : 6, nnk = quick ? 2 : 6;
    int threads[2] = {1, p->cores};
    for (int t = 0; t < (p->cores > 1 ? 2 : 1); t++)
        for (size_t i = 0; i < nm; i++)
            for (size_t j = 0; j < nnk; j++)
                for (size_t l = 0; l < nnk && p->gemms < SHARD_PROFILE_MAX_GEMMS; l++) {
                    size_t m = ms[i], n = nks[j], k = nks[l];
                    if (!quick && (double)m * (double)n * (double)k > 4.3e9) continue; /* seconds, and no GPT's */
                    p->gemm[p->gemms++] = (shard_profile_gemm){m, n, k, threads[t], 0, 0};
                }
}

/* One pass over the grid: each shape timed once, its rate into rate[g]. */
static shard_status gemm_pass(int quick, const shard_machine_profile *p, double *rate) {
    for (size_t g = 0; g < p->gemms; g++) {
        const shard_profile_gemm *e = &p->gemm[g];
        if (g == 0 || e->threads != p->gemm[g - 1].threads) SHARD_CHECK(shard_blas_set_threads(e->threads));
        SHARD_CHECK(gemm_repetition(e->m, e->n, e->k, quick ? 0.0005 : 0.003, &rate[g]));
    }
    return shard_blas_set_threads(1);
}

/* Copy and add bandwidth (bytes read and written per second) over vectors past the caches. */
static shard_status profile_bandwidth(int quick, shard_machine_profile *p) {
    size_t n = quick ? (size_t)4 << 20 : (size_t)32 << 20;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return shard_error(SHARD_ERR_NO_MEMORY, "profile: out of memory for %zu-element vectors", n);
    }
    for (size_t i = 0; i < n; i++) a[i] = (float)i, b[i] = 1.0f, c[i] = 0;
    double copy = 1e30, add = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = shard_clock_seconds();
        memcpy(c, a, n * sizeof *a);
        double t1 = shard_clock_seconds();
        for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
        double t2 = shard_clock_seconds();
        if (t1 - t0 < copy) copy = t1 - t0;
        if (t2 - t1 < add) add = t2 - t1;
    }
    volatile float keep = c[n / 2]; /* the sums are read: the loops stay */
    (void)keep;
    p->copy_gbps = 2.0 * (double)(n * sizeof *a) / copy / 1e9;
    p->add_gbps = 3.0 * (double)(n * sizeof *a) / add / 1e9;
    free(a), free(b), free(c);
    return SHARD_OK;
}

typedef struct comm_sweep {
    int quick;
    double bytes[5][16], us[5][16]; /* per op: bytes sent per rank per call, time */
    int points;
} comm_sweep;

static const char *const sweep_ops[5] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv"};

static shard_status sweep_rank(shard_comm *comm, void *arg) {
    comm_sweep *w = arg;
    int n = shard_comm_size(comm), k = 0;
    uint64_t top = w->quick ? (uint64_t)1 << 20 : (uint64_t)16 << 20, step = w->quick ? 8 : 4;
    for (uint64_t size = 16384; size <= top && k < 16; size *= step, k++)
        for (int op = 0; op < 5; op++) {
            double us = 0;
            uint64_t moved = 0;
            SHARD_CHECK(bench_comm_op_time(comm, sweep_ops[op], size, SHARD_F32, 0, &us, &moved));
            w->bytes[op][k] = (double)moved * shard_cost_busbw_factor(sweep_ops[op], n);
            w->us[op][k] = us;
        }
    if (shard_comm_rank(comm) == 0) w->points = k;
    return SHARD_OK;
}

static shard_status profile_comm(int quick, shard_machine_profile *p) {
    static const int ranks[] = {2, 4};
    for (size_t r = 0; r < sizeof ranks / sizeof ranks[0]; r++) {
        comm_sweep w = {.quick = quick};
        shard_launch_config lc = shard_launch_config_default();
        lc.ranks = ranks[r], lc.backend = SHARD_BACKEND_THREADS;
        SHARD_CHECK(shard_launch_with(&lc, sweep_rank, &w));
        for (int op = 0; op < 5; op++) {
            shard_profile_comm *c = &p->comm[p->comms];
            snprintf(c->backend, sizeof c->backend, "threads");
            snprintf(c->op, sizeof c->op, "%s", op == 4 ? "send" : sweep_ops[op]);
            c->ranks = ranks[r];
            SHARD_CHECK(
                shard_cost_fit_alpha_beta(w.bytes[op], w.us[op], (size_t)w.points, &c->alpha_us, &c->beta_gbps));
            p->comms++;
        }
    }
    return SHARD_OK;
}

/* One calibration layout of the tiny GPT: its timed steps, then its predicted GEMM time (the slowest
 * rank's) and its step as predicted without a non-GEMM part, from the profile's median GEMM rates,
 * communication and bandwidth. */
typedef struct nongemm_layout {
    char mesh[32];
    double gemm_ms, bare_ms;
    double *step_ms; /* every timed step, over all passes */
    int steps;
} nongemm_layout;

static shard_status nongemm_predict(const shard_trainer_config *tc, const shard_machine_profile *p, nongemm_layout *l) {
    shard_machine_profile *bare = malloc(sizeof *bare);
    if (!bare) return shard_error(SHARD_ERR_NO_MEMORY, "profile: out of memory");
    *bare = *p;
    bare->nongemm_fraction = bare->nongemm_fraction_loaded = 0;
    shard_analysis *a = NULL;
    shard_step_prediction *x = NULL;
    shard_status s = layout_predict(tc, l->mesh, bare, NULL, &a, &x);
    if (s == SHARD_OK) l->gemm_ms = x->rank[x->slowest_rank].gemm_ms, l->bare_ms = x->step_ms;
    shard_step_prediction_destroy(x);
    shard_analysis_destroy(a);
    free(bare);
    return s;
}

/* The layout's fraction: each timed step's own, (step - bare) / gemm (0 where the step is shorter than
 * the bare prediction), their median and spread. */
static double nongemm_fraction(nongemm_layout *l, double *spread) {
    for (int i = 0; i < l->steps; i++) {
        double rest = l->step_ms[i] - l->bare_ms;
        l->step_ms[i] = l->gemm_ms > 0 && rest > 0 ? rest / l->gemm_ms : 0;
    }
    return median_spread(l->step_ms, l->steps, spread);
}

/* The GEMM rates and the non-GEMM fractions, measured in turn, pass after pass, so that both see the
 * same drift of the host's load: each pass times every shape of the grid once (a shape's repetitions
 * lie seconds apart: a burst of other work moves one of them, not the rate), then runs the two
 * calibration layouts of the tiny GPT in turn (their order swapped each pass): a one-rank step on every
 * core, and one thread rank per core (data parallel) all computing at once.  Each rate is the median of
 * its passes; each fraction the median of the timed steps' own, each step's time less the layout's
 * prediction without a non-GEMM part (from the median rates: a pass's sum over shapes would carry every
 * slow shape of that pass), over its predicted GEMM time.  The tiny GPT runs at batch 8, seq 64, the
 * shape `bench analyze` measures, so that the calibration looks up the GEMM rates its predictions do.
 * Each spread is (max - min) / median over the repetitions. */
static shard_status profile_compute(int quick, shard_machine_profile *p) {
    const int passes = quick ? 2 : GEMM_PASSES, warmup = quick ? 1 : 2, steps = quick ? 2 : 3;
    gemm_grid(quick, p);
    shard_gpt_config gc;
    char dir[256] = "", config[512];
    snprintf(config, sizeof config, "%s/configs/gpt-tiny.json", SHARD_SOURCE_DIR);
    SHARD_CHECK(bench_random_tokens(config, &gc, dir, sizeof dir));
    shard_trainer_config tc = {.config_path = config,
                               .data_dir = dir,
                               .batch = 8,
                               .seq = 64,
                               .seed = 1,
                               .bucket_mb = 25,
                               .adamw = shard_adamw_defaults(),
                               .clip = 1.0f};
    tc.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 100000};
    nongemm_layout l[2] = {{.mesh = "data=1"}, {.mesh = ""}};
    snprintf(l[1].mesh, sizeof l[1].mesh, "data=%d", p->cores > 1 ? p->cores : 2);
    double *rate = malloc(p->gemms * (size_t)passes * sizeof *rate), *pass_rate = malloc(p->gemms * sizeof *rate);
    shard_status s = rate && pass_rate ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "profile: out of memory");
    for (int i = 0; i < 2 && s == SHARD_OK; i++)
        if (!(l[i].step_ms = calloc((size_t)(passes * steps), sizeof *l[i].step_ms)))
            s = shard_error(SHARD_ERR_NO_MEMORY, "profile: out of memory");
    for (int r = 0; r < passes && s == SHARD_OK; r++) {
        s = gemm_pass(quick, p, pass_rate);
        for (size_t g = 0; g < p->gemms; g++) rate[g * (size_t)passes + (size_t)r] = pass_rate[g];
        for (int i = 0; i < 2 && s == SHARD_OK; i++) {
            nongemm_layout *x = &l[(i + r) % 2];
            s = layout_measure_each(&tc, x->mesh, warmup, steps, &x->step_ms[x->steps]);
            x->steps += steps;
        }
    }
    for (size_t g = 0; s == SHARD_OK && g < p->gemms; g++)
        p->gemm[g].gflops = median_spread(&rate[g * (size_t)passes], passes, &p->gemm[g].gflops_spread);
    /* the bandwidth and the collectives, which the predictions without a non-GEMM part price too */
    if (s == SHARD_OK) s = profile_bandwidth(quick, p);
    if (s == SHARD_OK) s = profile_comm(quick, p);
    for (int i = 0; i < 2 && s == SHARD_OK; i++) s = nongemm_predict(&tc, p, &l[i]);
    if (s == SHARD_OK) {
        p->nongemm_fraction = nongemm_fraction(&l[0], &p->nongemm_fraction_spread);
        p->nongemm_fraction_loaded = nongemm_fraction(&l[1], &p->nongemm_fraction_loaded_spread);
    }
    free(rate), free(pass_rate), free(l[0].step_ms), free(l[1].step_ms);
    bench_remove_dir(dir);
    return s;
}

shard_status profile_machine(int quick, shard_machine_profile *p) {
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(p->machine, sizeof p->machine, "%s %s", u.nodename, u.machine);
    else
        snprintf(p->machine, sizeof p->machine, "unknown");
    time_t now = time(NULL);
    struct tm tm;
    strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    p->cores = bench_cores();
    SHARD_CHECK(shard_blas_init());
    snprintf(p->blas, sizeof p->blas, "%s", shard_blas_description());
    return profile_compute(quick, p);
}

int cli_profile(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 0);
    const char *out = "machine.json";
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--out") == 0) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else {
            cli_unknown_option("profile", argv[i], USAGE);
            return 2;
        }
    }
    shard_machine_profile *p = malloc(sizeof *p);
    double t0 = shard_clock_seconds();
    shard_status s = p ? profile_machine(quick, p) : shard_error(SHARD_ERR_NO_MEMORY, "profile: out of memory");
    if (s == SHARD_OK) s = shard_machine_profile_save(p, out);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        free(p);
        return 1;
    }
    printf("profile: %s written in %.1f s (%zu GEMM shapes, copy %.1f GB/s, %zu collective fits, non-GEMM %.2f "
           "(spread %.2f), loaded %.2f (spread %.2f))\n",
           out, shard_clock_seconds() - t0, p->gemms, p->copy_gbps, p->comms, p->nongemm_fraction,
           p->nongemm_fraction_spread, p->nongemm_fraction_loaded, p->nongemm_fraction_loaded_spread);
    free(p);
    return 0;
}
