/* cost_model.h — a step's time predicted from an analysis (analyze.h) and a measured machine profile.
 *
 * The machine profile (`shard profile` writes it as JSON; every key in docs/cli.md) holds what this
 * machine did when measured: GEMM throughput over a grid of (M, N, K) at one thread and at all cores,
 * elementwise memory bandwidth, the fraction of a step's compute that is not GEMM (the rest of a
 * one-rank tiny GPT step beyond its GEMMs and optimizer), and per backend, collective kind and rank
 * count a least-squares fit t = alpha + bytes / beta, bytes being those one rank sends (the
 * bandwidth-optimal count the analyzer reports), so beta is a bus bandwidth.
 *
 * The model, per rank (what it models, and what it does not):
 *   compute    each GEMM shape the dry run recorded at the profile's throughput for the nearest
 *              measured shape on the rank's threads, times (1 + the non-GEMM fraction); ranks past the
 *              cores share them (compute scaled by ranks / cores);
 *   comm       each collective's calls x alpha + bytes / beta for its axis size and backend; the data
 *              axis's gradient reductions overlap backward and ZeRO-3's gathers overlap forward and
 *              backward (prefetched), so only what exceeds that compute is exposed, and never less than
 *              one call's share, and only where a core is free for their progress (thread ranks fewer
 *              than the cores, or processes); every other collective (tensor, pipe, world) is exposed
 *              whole;
 *   bubble     the pipeline schedule's idle fraction (the analyzer's, ops costed by the stages' FLOPs)
 *              applied to the rank's compute and exposed communication;
 *   optimizer  the elements the rank updates x the bytes the update reads and writes, at the profile's
 *              copy bandwidth.
 * Not modelled: cache effects across shapes, contention between a rank's compute and its peers'
 * copies, load imbalance of a mixture of experts' real routing. */
#ifndef SHARD_COST_MODEL_H
#define SHARD_COST_MODEL_H

#include <stddef.h>

#include "shard/analyze.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_PROFILE_MAX_GEMMS 512
#define SHARD_PROFILE_MAX_COMMS 128

typedef struct shard_profile_gemm {
    size_t m, n, k;
    int threads;
    double gflops;        /* the median of the timed repetitions */
    double gflops_spread; /* (max - min) / median over them; 0 when unknown (an older file) */
} shard_profile_gemm;

typedef struct shard_profile_comm {
    char backend[16], op[16]; /* op: all_reduce, all_gather, reduce_scatter, all_to_all, send */
    int ranks;
    double alpha_us, beta_gbps;
} shard_profile_comm;

typedef struct shard_machine_profile {
    size_t struct_size; /* sizeof(shard_machine_profile) */
    char machine[128], date[32], blas[128];
    int cores;
    double copy_gbps, add_gbps; /* elementwise bandwidth: bytes read + written per second / 1e9 */
    double nongemm_fraction;    /* non-GEMM compute time per GEMM time: a world of one on every core */
    /* the same for thread ranks, one per core, all computing at once: the rest of their step (what the
     * cores' contention takes from the GEMMs included) per GEMM time at one thread alone */
    double nongemm_fraction_loaded;
    /* how steady the host was while they were measured: (max - min) / median of the steps' own fractions
     * (each fraction the median of them); 0 when unknown (an older file) */
    double nongemm_fraction_spread, nongemm_fraction_loaded_spread;
    size_t gemms;
    shard_profile_gemm gemm[SHARD_PROFILE_MAX_GEMMS];
    size_t comms;
    shard_profile_comm comm[SHARD_PROFILE_MAX_COMMS];
} shard_machine_profile;

/* Read a profile written by shard_machine_profile_save (or by hand: every key checked, one clear error). */
shard_status shard_machine_profile_load(const char *path, shard_machine_profile *out);
/* Write it as readable JSON, atomically (the whole new file or the old one). */
shard_status shard_machine_profile_save(const shard_machine_profile *p, const char *path);

/* GFLOP/s of an M x N x K product on `threads` threads: the measured shape nearest in log space
 * (threads between 1 and the profile's cores interpolated linearly); 0 when the profile has none. */
double shard_profile_gemm_gflops(const shard_machine_profile *p, size_t m, size_t n, size_t k, int threads);

/* The fit for (backend, op, ranks): the exact rank count, else the nearest measured one of that backend
 * and op (the all_reduce fit for a kind the profile lacks).  SHARD_ERR_UNSUPPORTED when the backend has
 * no fit at all. */
shard_status shard_profile_comm_find(const shard_machine_profile *p, const char *backend, const char *op, int ranks,
                                     double *alpha_us, double *beta_gbps);

/* Least squares t = alpha + bytes / beta over n points (us against bytes sent per rank); alpha clamped
 * to >= 0 (then beta refitted through the origin). */
shard_status shard_cost_fit_alpha_beta(const double *bytes, const double *us, size_t n, double *alpha_us,
                                       double *beta_gbps);

/* `calls` collectives sending `bytes` in all: calls x alpha + bytes / beta, in microseconds. */
double shard_cost_collective_us(double alpha_us, double beta_gbps, double bytes, double calls);

/* The exposed part of `comm_ms` of communication that `overlap_ms` of compute can hide, issued in
 * `calls` pieces: the excess over the compute, and at least one piece (the last waits whole). */
double shard_cost_exposed_ms(double comm_ms, double overlap_ms, double calls);

/* A pipeline's bubble time: busy_ms of work at idle fraction `bubble` idles busy x bubble / (1 - bubble). */
double shard_cost_bubble_ms(double busy_ms, double bubble);

typedef struct shard_rank_time {
    double compute_ms, comm_ms, bubble_ms, optimizer_ms, total_ms; /* total = the sum of the four */
    double gemm_ms, nongemm_ms, comm_whole_ms;                     /* compute's parts; comm before overlap */
} shard_rank_time;

typedef struct shard_cost_options {
    size_t struct_size;  /* sizeof(shard_cost_options) */
    const char *backend; /* the ranks' communicator backend: "threads" (NULL) or "mpi" */
    /* the cluster the ranks run on (shard/cluster.h; NULL: this machine, as profiled).  With one, a
     * rank's compute is at least its GEMM FLOPs at its device's rate (the emulation pads each span to
     * that), each collective costs its alpha-beta terms (the analysis's, the emulation's formulas) over
     * the slowest link among its group's ranks, and overlapped communication hides behind compute (an
     * emulated wire needs no core); the profile, when given too, prices what runs on the host (the
     * non-GEMM work, the optimizer), else those are 0. */
    const struct shard_cluster *cluster;
} shard_cost_options;

typedef struct shard_step_prediction {
    size_t ranks;
    shard_rank_time *rank;
    double step_ms;      /* the slowest rank's total */
    double tokens_per_s; /* the analysis's tokens per step / step_ms */
    int slowest_rank;
    int oversubscribed; /* more ranks than the profile's cores */
} shard_step_prediction;

/* p may be NULL when o names a cluster. */
shard_status shard_cost_predict(const shard_analysis *a, const shard_machine_profile *p, const shard_cost_options *o,
                                shard_step_prediction **out);
void shard_step_prediction_destroy(shard_step_prediction *p);

#ifdef __cplusplus
}
#endif
#endif
