/* emulate.c — see emulate.h: an emulated cluster's compute rates, links and memory, enforced on the ranks
 * of one machine by sleeping where the real work was faster than the emulated device or link would be;
 * the rates and memory follow the nodes' changes from step to step. */
#define _POSIX_C_SOURCE 200809L /* clock_nanosleep */
#include "emulate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "core/alloc_impl.h"
#include "core/flops.h"
#include "plan/cluster_impl.h"
#include "shard/blas.h"
#include "shard/launch.h"
#include "shard/memory.h"

struct shard__emu {
    const shard_cluster *cluster;
    int world_rank, world_size;
    uint64_t step;           /* the step whose device the rate and memory limit are (1 at the start) */
    char owner[160];         /* the memory limit's owner, for its refusals */
    double flops_per_second; /* the device's */
    double span_start;       /* the compute span under way */
    uint64_t span_flops;     /* the rank's FLOP count when it started */
    int inside;              /* in a communication call: nested calls are part of it */
};

/* What a communicator keeps: its ranks' world ranks and its slowest link (found on first use). */
typedef struct shard__emu_comm {
    int *world;
    int have_link;
    double alpha, beta;
    double busy_until; /* when this rank's last collective on it completes on the emulated wire */
} shard__emu_comm;

_Thread_local shard__emu *shard__emu_current;

enum { MEASURE_N = 192 };
static const double MEASURE_SECONDS = 0.15;

static void sleep_until(double deadline) {
    struct timespec ts = {.tv_sec = (time_t)deadline, .tv_nsec = (long)((deadline - floor(deadline)) * 1e9)};
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (shard__now() < deadline && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

static uint64_t flops_total(void) {
    uint64_t by[SHARD__PHASE_COUNT], total = 0;
    shard__flops_read(by);
    for (int p = 0; p < SHARD__PHASE_COUNT; p++) total += by[p];
    return total;
}

double shard__emu_call_begin(void) {
    shard__emu *e = shard__emu_current;
    double now = shard__now();
    if (!e || e->inside++) return now;
    uint64_t total = flops_total();
    uint64_t done = total >= e->span_flops ? total - e->span_flops : total; /* a reset counts from zero */
    double until = e->span_start + (double)done / e->flops_per_second;
    if (until > now) {
        sleep_until(until);
        now = shard__now();
    }
    return now;
}

void shard__emu_call_end(double deadline) {
    shard__emu *e = shard__emu_current;
    if (!e || --e->inside) return;
    if (deadline > shard__now()) sleep_until(deadline);
    e->span_start = shard__now();
    e->span_flops = flops_total();
}

/* The latency of the slowest link among a communicator's ranks and the least bandwidth. */
static void comm_link(shard_comm *comm, double *alpha, double *beta) {
    shard__emu_comm *ec = comm->emu;
    if (!ec->have_link) {
        ec->alpha = 0, ec->beta = INFINITY;
        for (int a = 0; a < comm->size; a++)
            for (int b = a + 1; b < comm->size; b++) {
                double al, be;
                if (shard_cluster_link(shard__emu_current->cluster, ec->world[a], ec->world[b], &al, &be) < 0) continue;
                if (al > ec->alpha) ec->alpha = al;
                if (be < ec->beta) ec->beta = be;
            }
        ec->have_link = 1;
    }
    *alpha = ec->alpha, *beta = ec->beta;
}

void shard__emu_coll_terms(int n, int r, const shard__coll_args *a, double *alphas, double *bytes) {
    *alphas = *bytes = 0;
    if (n < 2) return;
    double es = (double)shard_dtype_size(a->dtype), total = 0, block = 0;
    switch (a->kind) {
    case SHARD__BARRIER: *alphas = 2.0 * (n - 1); return;
    case SHARD__BROADCAST: /* a scatter and an all_gather, as a ring */
    case SHARD__ALL_REDUCE: *alphas = 2.0 * (n - 1), *bytes = 2.0 * (n - 1) * (double)a->count * es / n; return;
    case SHARD__ALL_GATHER:
    case SHARD__REDUCE_SCATTER: total = (double)a->count * n * es; break;
    case SHARD__ALL_GATHERV:
    case SHARD__REDUCE_SCATTERV:
        for (int p = 0; p < n; p++) total += (double)a->recv_counts[p] * es;
        break;
    case SHARD__ALL_TO_ALL: *alphas = n - 1.0, *bytes = (n - 1) * (double)a->count * es; return;
    default: /* the v and w forms: this rank's largest block to or from a peer */
        for (int p = 0; p < n; p++)
            if (p != r)
                block = fmax(block,
                             (double)(a->send_counts[p] > a->recv_counts[p] ? a->send_counts[p] : a->recv_counts[p]));
        *alphas = n - 1.0, *bytes = (n - 1) * block * es;
        return;
    }
    *alphas = n - 1.0, *bytes = (n - 1) * total / n;
}

double shard__emu_coll_seconds(shard_comm *comm, const shard__coll_args *a) {
    if (!shard__emu_current || !comm->emu || comm->size < 2) return 0;
    double alpha, beta, alphas, bytes;
    comm_link(comm, &alpha, &beta);
    shard__emu_coll_terms(comm->size, comm->rank, a, &alphas, &bytes);
    return alphas * alpha + bytes / beta;
}

double shard__emu_coll_deadline(shard_comm *comm, const shard__coll_args *a, double begin) {
    double seconds = shard__emu_coll_seconds(comm, a);
    if (seconds <= 0) return begin;
    double start = comm->emu->busy_until > begin ? comm->emu->busy_until : begin;
    comm->emu->busy_until = start + seconds;
    return start + seconds;
}

double shard__emu_p2p_seconds(shard_comm *comm, int peer, uint64_t bytes) {
    if (!shard__emu_current || !comm->emu || peer == comm->rank) return 0;
    double alpha, beta;
    if (shard_cluster_link(shard__emu_current->cluster, comm->emu->world[comm->rank], comm->emu->world[peer], &alpha,
                           &beta) < 0)
        return 0;
    return alpha + (double)bytes / beta;
}

static shard__emu_comm *emu_comm_new(int size) {
    shard__emu_comm *ec = calloc(1, sizeof *ec);
    if (ec && !(ec->world = malloc(sizeof *ec->world * (size_t)size))) free(ec), ec = NULL;
    return ec;
}

void shard__emu_comm_free(shard_comm *comm) {
    if (!comm || !comm->emu) return;
    free(comm->emu->world);
    free(comm->emu);
    comm->emu = NULL;
}

shard_status shard__emu_comm_split(shard_comm *made) {
    shard__emu *e = shard__emu_current;
    if (!e || !made) return SHARD_OK;
    shard__emu_comm *ec = emu_comm_new(made->size);
    if (!ec) return shard_error(SHARD_ERR_NO_MEMORY, "split to comm '%s': out of memory", made->name);
    int32_t mine = e->world_rank, *all = malloc(sizeof *all * (size_t)made->size);
    uint64_t sent = atomic_load(&made->bytes_sent);
    e->inside++; /* the exchange is the emulation's own: not delayed */
    shard_status s = all ? shard_comm_all_gather(made, &mine, all, 1, SHARD_I32)
                         : shard_error(SHARD_ERR_NO_MEMORY, "split to comm '%s': out of memory", made->name);
    e->inside--;
    atomic_store(&made->bytes_sent, sent);
    for (int p = 0; s == SHARD_OK && p < made->size; p++) ec->world[p] = all[p];
    free(all);
    if (s < 0) {
        free(ec->world), free(ec);
        return s;
    }
    made->emu = ec;
    return SHARD_OK;
}

/* Floating-point operations per second this rank's GEMMs reach while every rank runs them. */
static shard_status measure_rate(shard_comm *world, double *rate) {
    float *m = calloc(3 * (size_t)MEASURE_N * MEASURE_N, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "cluster emulation: out of memory measuring the GEMM rate");
    for (size_t i = 0; i < 2 * (size_t)MEASURE_N * MEASURE_N; i++) m[i] = (float)(i % 7) * 0.25f;
    shard__flops *before = shard__flops_current(), scratch = {0};
    shard__flops_adopt(&scratch); /* not the rank's FLOPs */
    shard_status s = shard_comm_barrier(world);
    double t0 = shard__now(), t = t0, flops = 0;
    while (s == SHARD_OK && t - t0 < MEASURE_SECONDS) {
        s = shard_sgemm(0, 0, MEASURE_N, MEASURE_N, MEASURE_N, 1.0f, m, MEASURE_N, m + (size_t)MEASURE_N * MEASURE_N,
                        MEASURE_N, 0.0f, m + 2 * (size_t)MEASURE_N * MEASURE_N, MEASURE_N);
        flops += 2.0 * MEASURE_N * MEASURE_N * MEASURE_N;
        t = shard__now();
    }
    shard__flops_adopt(before);
    free(m);
    *rate = flops / (t - t0);
    return s;
}

shard_status shard__emu_rank_begin(shard_comm *world, const shard_cluster *cluster) {
    int rank = world->rank, n = world->size;
#ifdef __linux__
    /* the emulation sleeps to the microsecond, many times a step: the default 50 us of timer slack a
     * sleep may overrun by would add up to a visible part of the step */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
    shard_cluster_device dev;
    SHARD_CHECK(shard_cluster_rank_device(cluster, n - 1, &dev)); /* every rank alike: enough devices? */
    SHARD_CHECK(shard_cluster_rank_device(cluster, rank, &dev));
    SHARD_CHECK(shard_share_cores(world));
    double rate = 0;
    SHARD_CHECK(measure_rate(world, &rate));
    double *rates = malloc(sizeof *rates * (size_t)n);
    if (!rates) return shard_error(SHARD_ERR_NO_MEMORY, "cluster emulation: out of memory");
    shard_status s = shard_comm_all_gather(world, &rate, rates, 1, SHARD_F64);
    for (int r = 0; s == SHARD_OK && r < n; r++) { /* the first rank refused, on every rank */
        shard_cluster_device d;
        s = shard_cluster_rank_device(cluster, r, &d);
        double peak = s == SHARD_OK ? shard__cluster_node_peak_tflops(cluster, d.node_index) : 0;
        double declared = s == SHARD_OK ? shard__cluster_node_tflops(cluster, d.node_index) : 0;
        if (s == SHARD_OK && peak * 1e12 > rates[r])
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "the cluster's node '%s' declares compute_tflops %g%s, but this machine gives rank %d "
                            "%.4g TFLOP/s (its GEMMs, with %d rank%s running at once): the device would need %.1fx "
                            "the share of this machine a rank has; give compute_tflops at most %.3g%s, or fewer ranks",
                            d.node, declared, peak > declared ? " (faster still after a slowdown below 1)" : "", r,
                            rates[r] * 1e-12, n, n == 1 ? "" : "s", peak * 1e12 / rates[r], rates[r] * 1e-12,
                            peak > declared ? " at every step" : "");
    }
    free(rates);
    SHARD_CHECK(s);
    shard__emu *e = calloc(1, sizeof *e);
    shard__emu_comm *ec = emu_comm_new(n);
    if (!e || !ec) {
        free(e);
        if (ec) free(ec->world), free(ec);
        return shard_error(SHARD_ERR_NO_MEMORY, "cluster emulation: out of memory");
    }
    for (int r = 0; r < n; r++) ec->world[r] = r;
    world->emu = ec;
    *e = (shard__emu){.cluster = cluster,
                      .world_rank = rank,
                      .world_size = n,
                      .step = 1,
                      .flops_per_second = dev.compute_tflops * 1e12};
    snprintf(e->owner, sizeof e->owner, "rank %d on node '%s' (device %d)", rank, dev.node, dev.device);
    shard__mem_ledger_limit(shard__mem_ledger_current(), (uint64_t)dev.memory_bytes, e->owner);
    shard_mem_stats_reset_peak(); /* the measurement's buffers are not the run's */
    shard__mem_window_reset();
    e->span_start = shard__now();
    e->span_flops = flops_total();
    shard__emu_current = e;
    return SHARD_OK;
}

/* Rank 0's line for each node that holds a rank and changes between steps `from` and `to`. */
static void say_changes(const shard__emu *e, uint64_t from, uint64_t to) {
    const shard_cluster *c = e->cluster;
    for (int n = 0; n < shard__cluster_node_count(c); n++) {
        double was_slowdown, was_bytes, slowdown, bytes;
        shard__cluster_node_at(c, n, from, &was_slowdown, &was_bytes);
        shard__cluster_node_at(c, n, to, &slowdown, &bytes);
        int held = 0;
        for (int r = 0; r < e->world_size && !held; r++) held = shard__cluster_rank_node(c, r) == n;
        if (!held || (slowdown == was_slowdown && bytes == was_bytes)) continue;
        char rate[96] = "", memory[48] = "";
        double tflops = shard__cluster_node_tflops(c, n) / slowdown;
        if (slowdown != was_slowdown && slowdown == 1)
            snprintf(rate, sizeof rate, "computes at its declared rate (%.3g TFLOP/s)", tflops);
        else if (slowdown != was_slowdown)
            snprintf(rate, sizeof rate, "computes %gx %s (%.3g TFLOP/s)", slowdown > 1 ? slowdown : 1 / slowdown,
                     slowdown > 1 ? "slower" : "faster", tflops);
        if (bytes != was_bytes) snprintf(memory, sizeof memory, "has %.2f GiB", bytes / (double)(1u << 30));
        fprintf(stderr, "cluster: step %llu: node '%s' %s%s%s\n", (unsigned long long)to,
                shard__cluster_node_name(c, n), rate, rate[0] && memory[0] ? " and " : "", memory);
    }
}

shard_status shard__emu_step_begin(uint64_t step) {
    shard__emu *e = shard__emu_current;
    if (!e || step == e->step || !shard_cluster_has_changes(e->cluster)) return SHARD_OK;
    shard_cluster_device was, dev;
    SHARD_CHECK(shard_cluster_device_at(e->cluster, e->world_rank, e->step, &was));
    SHARD_CHECK(shard_cluster_device_at(e->cluster, e->world_rank, step, &dev));
    if (e->world_rank == 0) say_changes(e, e->step, step);
    e->step = step;
    double rate = dev.compute_tflops * 1e12;
    if (rate != e->flops_per_second) {
        /* the span under way took its FLOPs so far at the old rate: it now starts as late as a span at
         * the new rate that ends when it would */
        uint64_t total = flops_total();
        uint64_t done = total >= e->span_flops ? total - e->span_flops : total;
        e->span_start += (double)done / e->flops_per_second - (double)done / rate;
        e->flops_per_second = rate;
    }
    if (dev.memory_bytes != was.memory_bytes) /* a limit below what the rank holds refuses its next allocation */
        shard__mem_ledger_limit(shard__mem_ledger_current(), (uint64_t)dev.memory_bytes, e->owner);
    return SHARD_OK;
}

void shard__emu_rank_end(void) {
    free(shard__emu_current);
    shard__emu_current = NULL;
    shard__mem_ledger_limit(shard__mem_ledger_current(), 0, NULL);
}
