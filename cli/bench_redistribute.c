/* bench_redistribute.c — `shard bench redistribute`: the common spec
 * transitions of a 2-D f32 tensor (64 MiB by default) on a mesh, each timed
 * against the collective it reduces to, called directly on buffers of the
 * same sizes in the same run (the two alternate iteration by iteration).
 *
 *   split -> replicated    P('x', None)         -> P()             all_gather
 *   replicated -> split    P()                  -> P('x', None)    slice (no traffic)
 *   partial -> replicated  P(partial='x')       -> P()             all_reduce
 *   partial -> split       P(partial='x')       -> P('x', None)    reduce_scatter
 *   split moved            P('x', None)         -> P(None, 'x')    all_to_all
 * with x the mesh's first axis.  busbw is the bytes one rank sends divided by
 * the time, which is nccl-tests' busbw for each of these collectives; the
 * ratio is the redistribute's busbw over the collective's.  Times are medians
 * over >= 5 iterations of the slowest rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/shard.h"

typedef struct transition {
    const char *name, *from, *to, *collective; /* collective NULL: no traffic */
} transition;

static const transition transitions[] = {
    {"split -> replicated", "P('%s', None)", "P()", "all_gather"},
    {"replicated -> split", "P()", "P('%s', None)", NULL},
    {"partial -> replicated", "P(partial='%s')", "P()", "all_reduce"},
    {"partial -> split", "P(partial='%s')", "P('%s', None)", "reduce_scatter"},
    {"split moved", "P('%s', None)", "P(None, '%s')", "all_to_all"},
};
enum { NTRANSITIONS = sizeof transitions / sizeof transitions[0] };

typedef struct result {
    char from[96], to[96], steps[96];
    uint64_t sent; /* bytes the busiest rank sends */
    double time_us, coll_time_us;
} result;

typedef struct bench_redist {
    const bench_redist_options *opt;
    result results[NTRANSITIONS];
    size_t shape[2]; /* set by rank 0 */
    int ranks;
    char backend[16], mesh[128];
} bench_redist;

/* The collective alone, on the two dtensors' local buffers (equal sizes). */
static shard_status run_collective(shard_comm *comm, const char *op, shard_dtensor *a, shard_dtensor *b) {
    int n = shard_comm_size(comm);
    size_t in = shard_tensor_numel(a->local), out = shard_tensor_numel(b->local);
    if (strcmp(op, "all_gather") == 0)
        return shard_comm_all_gather(comm, a->local->data, b->local->data, in, SHARD_F32);
    if (strcmp(op, "all_reduce") == 0)
        return shard_comm_all_reduce(comm, a->local->data, b->local->data, in, SHARD_F32, SHARD_OP_SUM);
    if (strcmp(op, "reduce_scatter") == 0)
        return shard_comm_reduce_scatter(comm, a->local->data, b->local->data, out, SHARD_F32, SHARD_OP_SUM);
    return shard_comm_all_to_all(comm, a->local->data, b->local->data, in / (size_t)n, SHARD_F32);
}

/* Check once that the transition gives back the tensor. */
static shard_status verify(shard_dtensor *a, shard_dtensor *b, const shard_tensor *x, shard_tensor *back) {
    SHARD_CHECK(shard_dtensor_distribute(a, x, -1));
    SHARD_CHECK(shard_dtensor_redistribute(a, b));
    SHARD_CHECK(shard_dtensor_gather(b, back, -1));
    if (!shard_tensor_equal_bits(back, x)) return shard_error(SHARD_ERR_INTERNAL, "bench redistribute: wrong result");
    return SHARD_OK;
}

static shard_status time_transition(shard_mesh *mesh, shard_comm *axis, const transition *tr, const size_t *shape,
                                    const shard_tensor *x, shard_tensor *back, const bench_redist *run, result *res) {
    const bench_redist_options *opt = run->opt;
    shard_comm *world = shard_mesh_comm(mesh);
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    const char *axis_name = layout.names[0];
    shard_spec from, to;
    snprintf(res->from, sizeof res->from, tr->from, axis_name, axis_name);
    snprintf(res->to, sizeof res->to, tr->to, axis_name, axis_name);
    SHARD_CHECK(shard_spec_parse(res->from, &layout, 2, &from));
    SHARD_CHECK(shard_spec_parse(res->to, &layout, 2, &to));
    shard_redistribute_plan plan;
    SHARD_CHECK(shard_redistribute_plan_make(&layout, SHARD_F32, 2, shape, &from, &to, &plan));
    res->steps[0] = '\0';
    for (int i = 0; i < plan.nsteps; i++) {
        size_t used = strlen(res->steps);
        snprintf(res->steps + used, sizeof res->steps - used, "%s%s", i ? "+" : "",
                 shard_redistribute_kind_name(plan.steps[i].kind));
    }
    int coords[SHARD_MESH_MAX_AXES];
    for (int k = 0; k < layout.ndim; k++) coords[k] = shard_mesh_coord(mesh, k);
    double sent = (double)shard_redistribute_plan_bytes(&plan, -1, coords);
    SHARD_CHECK(shard_comm_all_reduce(world, &sent, &sent, 1, SHARD_F64, SHARD_OP_MAX));
    res->sent = (uint64_t)sent;
    shard_dtensor *a = NULL, *b = NULL;
    SHARD_CHECK(shard_dtensor_create(mesh, SHARD_F32, 2, shape, &from, SHARD_MEM_ACTIVATIONS, &a));
    shard_status s = shard_dtensor_create(mesh, SHARD_F32, 2, shape, &to, SHARD_MEM_ACTIVATIONS, &b);
    if (s == SHARD_OK) s = verify(a, b, x, back);
    int kinds = tr->collective ? 2 : 1, iters = opt->iters;
    double *times = calloc(2 * (size_t)iters, sizeof *times);
    if (s == SHARD_OK && !times) s = shard_error(SHARD_ERR_NO_MEMORY, "bench redistribute: out of memory");
    for (int i = -opt->warmup; i < iters && s == SHARD_OK; i++)
        for (int k = 0; k < kinds && s == SHARD_OK; k++) {
            s = shard_comm_barrier(world);
            double t0 = shard_clock_seconds();
            if (s == SHARD_OK)
                s = k == 0 ? shard_dtensor_redistribute(a, b) : run_collective(axis, tr->collective, a, b);
            if (i >= 0) times[(size_t)k * (size_t)iters + (size_t)i] = shard_clock_seconds() - t0;
        }
    if (s == SHARD_OK) s = shard_comm_all_reduce(world, times, times, 2 * (size_t)iters, SHARD_F64, SHARD_OP_MAX);
    if (s == SHARD_OK) {
        res->time_us = 1e6 * cli_median(times, iters);
        res->coll_time_us = tr->collective ? 1e6 * cli_median(times + iters, iters) : 0;
    }
    free(times);
    shard_dtensor_destroy(a);
    shard_dtensor_destroy(b);
    return s;
}

static shard_status bench_rank(shard_comm *comm, void *arg) {
    bench_redist *run = arg;
    char mesh_text[128];
    if (run->opt->mesh)
        snprintf(mesh_text, sizeof mesh_text, "%s", run->opt->mesh);
    else
        snprintf(mesh_text, sizeof mesh_text, "data=%d", shard_comm_size(comm));
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_mesh_create(comm, mesh_text, &mesh));
    shard_comm *axis = shard_mesh_axis_comm(mesh, 0);
    /* rows x cols f32 of about --bytes, both divisible by the first axis (cols split over it for all_to_all) */
    size_t n = (size_t)shard_mesh_axis_size(mesh, 0), cols = n * (1024 / n),
           rows = (size_t)(run->opt->bytes / (4 * cols));
    rows -= rows % n;
    if (rows == 0) rows = n;
    size_t shape[2] = {rows, cols};
    shard_tensor *x = NULL, *back = NULL;
    shard_status s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &x);
    if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &back);
    if (s == SHARD_OK) {
        float *v = x->data;
        for (size_t i = 0; i < shard_tensor_numel(x); i++) v[i] = (float)(i % 1009) * 0.5f - 7.0f;
    }
    for (int t = 0; t < NTRANSITIONS && s == SHARD_OK; t++) {
        result res;
        memset(&res, 0, sizeof res);
        s = time_transition(mesh, axis, &transitions[t], shape, x, back, run, &res);
        if (shard_comm_rank(comm) == 0) run->results[t] = res;
    }
    if (shard_comm_rank(comm) == 0) {
        run->ranks = shard_comm_size(comm);
        snprintf(run->backend, sizeof run->backend, "%s", shard_comm_backend(comm));
        shard_mesh_string(mesh, run->mesh, sizeof run->mesh);
        run->shape[0] = rows, run->shape[1] = cols;
    }
    shard_tensor_destroy(x);
    shard_tensor_destroy(back);
    shard_mesh_destroy(mesh);
    return s;
}

static void print_results(const bench_redist *run) {
    uint64_t bytes = (uint64_t)run->shape[0] * run->shape[1] * 4;
    char size[32];
    cli_format_size(bytes, size, sizeof size);
    if (!run->opt->json)
        printf("# shard bench redistribute: %s, %d ranks, mesh %s, f32[%zu,%zu] (%s), median of %d iterations\n"
               "%-22s %-34s %-34s %-15s %10s %11s %15s %7s\n",
               run->backend, run->ranks, run->mesh, run->shape[0], run->shape[1], size, run->opt->iters, "transition",
               "from", "to", "steps", "time_ms", "busbw_GB/s", "coll_busbw_GB/s", "ratio");
    for (int t = 0; t < NTRANSITIONS; t++) {
        const result *r = &run->results[t];
        double busbw = r->time_us > 0 ? (double)r->sent / (r->time_us * 1e3) : 0;
        double coll = r->coll_time_us > 0 ? (double)r->sent / (r->coll_time_us * 1e3) : 0;
        const char *collective = transitions[t].collective;
        if (run->opt->json) {
            printf(
                "{\"transition\": \"%s\", \"from\": \"%s\", \"to\": \"%s\", \"steps\": \"%s\", \"backend\": \"%s\", "
                "\"ranks\": %d, \"mesh\": \"%s\", \"bytes\": %llu, \"bytes_sent_per_rank\": %llu, \"time_us\": %.3f, ",
                transitions[t].name, r->from, r->to, r->steps, run->backend, run->ranks, run->mesh,
                (unsigned long long)bytes, (unsigned long long)r->sent, r->time_us);
            if (collective)
                printf("\"busbw_gbps\": %.4f, \"collective\": \"%s\", \"collective_time_us\": %.3f, "
                       "\"collective_busbw_gbps\": %.4f, \"ratio\": %.4f}\n",
                       busbw, collective, r->coll_time_us, coll, coll > 0 ? busbw / coll : 0.0);
            else
                printf("\"busbw_gbps\": null, \"collective\": null, \"collective_time_us\": null, "
                       "\"collective_busbw_gbps\": null, \"ratio\": null}\n");
        } else if (collective) {
            printf("%-22s %-34s %-34s %-15s %10.2f %11.3f %15.3f %7.3f\n", transitions[t].name, r->from, r->to,
                   r->steps, r->time_us / 1e3, busbw, coll, coll > 0 ? busbw / coll : 0.0);
        } else {
            printf("%-22s %-34s %-34s %-15s %10.2f %11s %15s %7s\n", transitions[t].name, r->from, r->to, r->steps,
                   r->time_us / 1e3, "no traffic", "-", "-");
        }
    }
    fflush(stdout);
}

shard_status bench_redistribute_run(const bench_redist_options *opt) {
    bench_redist *run = calloc(1, sizeof *run);
    if (!run) return shard_error(SHARD_ERR_NO_MEMORY, "bench: out of memory");
    run->opt = opt;
    shard_status s = shard_launch_with(&opt->launch, bench_rank, run);
    int mpi_rank = 0;
    if (s == SHARD_OK && !(shard_launch_detect_mpi(NULL, 0, &mpi_rank, NULL) && mpi_rank != 0)) print_results(run);
    free(run);
    return s;
}
