/* profile.c — `shard profile`: this machine measured for the cost model (cost_model.h), written as a
 * JSON file a person can read and edit (docs/cli.md names every key).
 *
 *   shard profile [--out machine.json] [--quick]
 *
 * GEMM throughput over a grid of shapes covering the tiny and benchmark GPTs' products, at one thread
 * and at every core; copy and add bandwidth over large vectors; each collective's alpha and beta on
 * thread ranks (2 and 4), fitted by least squares to `bench comm`'s own timing of a sweep of sizes
 * (bench_comm_op_time); and the non-GEMM fraction of a step, from a one-rank tiny GPT step on one
 * thread set against the model's GEMM and optimizer time. */
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
    "GFLOP/s over a grid of shapes at 1 thread and at all cores, copy and add bandwidth, each\n"
    "collective's alpha (us) and beta (GB/s of bytes sent per rank) on 2 and 4 thread ranks, fitted to\n"
    "a sweep of sizes, and the non-GEMM fraction of a one-rank tiny GPT step. The file is JSON (keys in\n"
    "docs/cli.md), written whole or not at all.\n"
    "\n"
    "options:\n"
    "  --out FILE               where the profile goes (default machine.json)\n"
    "  --quick                  a few seconds: fewer shapes and sizes, shorter timings (for tests)\n";

/* GFLOP/s of an M x N x K product on the current threads: the best of runs filling `seconds`. */
static shard_status gemm_rate(size_t m, size_t n, size_t k, double seconds, double *gflops) {
    float *a = calloc(m * k, sizeof *a), *b = calloc(k * n, sizeof *b), *c = calloc(m * n, sizeof *c);
    shard_status s = a && b && c ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "profile: out of memory");
    for (size_t i = 0; s == SHARD_OK && i < m * k; i++) a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; s == SHARD_OK && i < k * n; i++) b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30, start = shard_clock_seconds();
    if (s == SHARD_OK) s = shard_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n); /* warm */
    for (int runs = 0; s == SHARD_OK && (runs < 3 || shard_clock_seconds() - start < seconds); runs++) {
        double t0 = shard_clock_seconds();
        s = shard_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
        double t = shard_clock_seconds() - t0;
        if (t < best) best = t;
    }
    *gflops = 2.0 * (double)m * (double)n * (double)k / (best > 0 ? best : 1e-9) / 1e9;
    free(a), free(b), free(c);
    return s;
}

static shard_status profile_gemms(int quick, shard_machine_profile *p) {
    static const size_t full_m[] = {64, 256, 1024, 4096}, full_nk[] = {64, 256, 1024, 4096};
    static const size_t quick_m[] = {256, 1024}, quick_nk[] = {128, 512};
    const size_t *ms = quick ? quick_m : full_m, *nks = quick ? quick_nk : full_nk;
    size_t nm = quick ? 2 : 4, nnk = quick ? 2 : 4;
    int threads[2] = {1, p->cores};
    for (int t = 0; t < (p->cores > 1 ? 2 : 1); t++) {
        SHARD_CHECK(shard_blas_set_threads(threads[t]));
        for (size_t i = 0; i < nm; i++)
            for (size_t j = 0; j < nnk; j++)
                for (size_t l = 0; l < nnk; l++) {
                    size_t m = ms[i], n = nks[j], k = nks[l];
                    if (!quick && (double)m * (double)n * (double)k > 4.3e9) continue; /* seconds, and no GPT's */
                    double g = 0;
                    SHARD_CHECK(gemm_rate(m, n, k, quick ? 0.002 : 0.02, &g));
                    if (p->gemms < SHARD_PROFILE_MAX_GEMMS)
                        p->gemm[p->gemms++] = (shard_profile_gemm){m, n, k, threads[t], g};
                }
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

/* One calibration run of the tiny GPT on `mesh`: the rest of the measured step beyond the prediction
 * without a non-GEMM part, per predicted GEMM time. */
static shard_status rest_fraction(const shard_trainer_config *tc, const char *mesh, int quick,
                                  const shard_machine_profile *p, double *fraction) {
    double measured = 0;
    SHARD_CHECK(layout_measure(tc, mesh, NULL, quick ? 1 : 3, quick ? 3 : 7, &measured, NULL));
    shard_machine_profile bare = *p;
    bare.nongemm_fraction = bare.nongemm_fraction_loaded = 0;
    shard_analysis *a = NULL;
    shard_step_prediction *x = NULL;
    shard_status s = layout_predict(tc, mesh, &bare, NULL, &a, &x);
    if (s == SHARD_OK) {
        double gemm = x->rank[x->slowest_rank].gemm_ms, rest = measured - x->step_ms;
        *fraction = gemm > 0 && rest > 0 ? rest / gemm : 0;
    }
    shard_step_prediction_destroy(x);
    shard_analysis_destroy(a);
    return s;
}

/* The non-GEMM fractions: a one-rank tiny GPT step on every core, and the same model on one thread rank
 * per core (data parallel) with all of them computing at once, each less its predicted GEMM,
 * communication and optimizer time, over its GEMM time. */
static shard_status profile_nongemm(int quick, shard_machine_profile *p) {
    shard_gpt_config gc;
    char dir[256] = "", config[512];
    snprintf(config, sizeof config, "%s/configs/gpt-tiny.json", SHARD_SOURCE_DIR);
    SHARD_CHECK(bench_random_tokens(config, &gc, dir, sizeof dir));
    shard_trainer_config tc = {.config_path = config,
                               .data_dir = dir,
                               .batch = 8,
                               .seq = 128,
                               .seed = 1,
                               .adamw = shard_adamw_defaults(),
                               .clip = 1.0f};
    tc.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 1000};
    shard_status s = rest_fraction(&tc, "data=1", quick, p, &p->nongemm_fraction);
    char loaded[32];
    snprintf(loaded, sizeof loaded, "data=%d", p->cores > 1 ? p->cores : 2);
    if (s == SHARD_OK) s = rest_fraction(&tc, loaded, quick, p, &p->nongemm_fraction_loaded);
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
    SHARD_CHECK(profile_gemms(quick, p));
    SHARD_CHECK(profile_bandwidth(quick, p));
    SHARD_CHECK(profile_comm(quick, p));
    return profile_nongemm(quick, p);
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
    printf("profile: %s written in %.1f s (%zu GEMM shapes, copy %.1f GB/s, %zu collective fits, non-GEMM %.2f)\n", out,
           shard_clock_seconds() - t0, p->gemms, p->copy_gbps, p->comms, p->nongemm_fraction);
    free(p);
    return 0;
}
