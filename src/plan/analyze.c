/* analyze.c — see analyze.h: a layout's per-rank figures from a dry run of the engine.
 *
 * One rank at a time, on the calling thread: a plan communicator stands for the world (its splits told
 * their groups by the mesh), the thread's allocator is switched to plan mode and charges a ledger of
 * this rank's own, and the trainer is built (without initialising the weights) and runs two steps on
 * rows of zeros.  What the ledger holds then is the rank's memory; what the FLOP counter and the plan
 * tally saw in the second step, a steady step's work and traffic. */
#include "shard/analyze.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/plan/plan_backend.h"
#include "core/alloc_impl.h"
#include "core/flops.h"
#include "parallel/pipeline_schedule.h"
#include "plan/expert_bound.h"
#include "plan/gemm_shapes.h"
#include "shard/blas.h"
#include "train/trainer_impl.h"

void shard_analysis_destroy(shard_analysis *a) {
    if (!a) return;
    for (size_t i = 0; a->rank && i < a->ranks; i++) free(a->rank[i].collective), free(a->rank[i].gemm_shape);
    free(a->rank);
    free(a);
}

uint64_t shard_rank_analysis_axis_bytes(const shard_rank_analysis *r, const char *axis) {
    uint64_t sum = 0;
    for (size_t i = 0; i < r->collectives; i++)
        if (!axis || strcmp(r->collective[i].axis, axis) == 0) sum += r->collective[i].bytes;
    return sum;
}

/* The tally as the rank's collectives: the calls that moved bytes or happened on an axis of the mesh. */
static shard_status take_tally(const shard__plan_tally *t, shard_rank_analysis *r) {
    r->collective = calloc(t->n ? t->n : 1, sizeof *r->collective);
    if (!r->collective) return shard_error(SHARD_ERR_NO_MEMORY, "analyze: out of memory");
    for (size_t i = 0; i < t->n; i++) {
        shard_analyze_collective *c = &r->collective[r->collectives++];
        snprintf(c->axis, sizeof c->axis, "%s", t->at[i].comm);
        snprintf(c->op, sizeof c->op, "%s", t->at[i].op);
        c->bytes = t->at[i].bytes, c->count = t->at[i].calls;
        c->alphas = t->at[i].alphas, c->wire_bytes = t->at[i].wire_bytes;
        c->largest_alphas = t->at[i].largest_alphas, c->largest_wire_bytes = t->at[i].largest_wire_bytes;
        c->small_alphas = t->at[i].small_alphas, c->small_wire_bytes = t->at[i].small_wire_bytes;
    }
    return SHARD_OK;
}

static void describe_coords(const shard_mesh *mesh, char *out, size_t bytes) {
    size_t used = 0;
    out[0] = '\0';
    for (int a = 0; a < shard_mesh_ndim(mesh) && used < bytes; a++)
        used += (size_t)snprintf(out + used, bytes - used, "%s%s=%d", a ? "," : "", shard_mesh_axis_name(mesh, a),
                                 shard_mesh_coord(mesh, a));
}

/* The pipeline's idle fraction from the schedule, ops costed by the stage's forward and backward FLOPs. */
static double schedule_bubble(const shard_trainer *t, const shard_rank_analysis *r) {
    const shard_pipe_schedule *s = shard__trainer_schedule(t);
    if (!s) return 0;
    double f = r->flops_forward, b = r->flops_backward + r->flops_recompute;
    int fc = 100, bc = f > 0 ? (int)(100.0 * b / f + 0.5) : 200;
    return shard__pipe_schedule_bubble(s, fc, bc < 1 ? 1 : bc);
}

/* The recorded GEMM shapes as the rank's (the FLOPs they miss against the counter's total kept apart). */
static shard_status take_shapes(const shard__gemm_shapes *g, shard_rank_analysis *r) {
    r->gemm_shape = calloc(g->n ? g->n : 1, sizeof *r->gemm_shape);
    if (!r->gemm_shape) return shard_error(SHARD_ERR_NO_MEMORY, "analyze: out of memory");
    memcpy(r->gemm_shape, g->at, g->n * sizeof *g->at);
    r->gemm_shapes = g->n;
    double seen = 0;
    for (size_t i = 0; i < g->n; i++)
        seen += 2.0 * (double)g->at[i].m * (double)g->at[i].n * (double)g->at[i].k * (double)g->at[i].count;
    double all = r->flops_forward + r->flops_backward + r->flops_recompute + r->flops_other;
    r->gemm_unshaped_flops = all > seen ? all - seen : 0;
    return SHARD_OK;
}

/* The most rows a rank routes in one forward when the batch shares are uneven: the largest share over the
 * micro-steps, rounded up (0: even shares, every rank's micro-batch alike). */
static size_t largest_micro_rows(const shard_trainer_config *c, size_t accum) {
    if (!c->batch_shares || !accum) return 0;
    size_t most = 0;
    for (const char *p = c->batch_shares; *p;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p) break; /* checked when the trainer was made */
        most = v > most ? (size_t)v : most;
        p = *end == ',' ? end + 1 : end;
    }
    return (most + accum - 1) / accum;
}

/* The step's all_to_all(v) bytes on `expert`: the token exchange of a mixture of experts. */
static uint64_t exchange_bytes(const shard_rank_analysis *r) {
    uint64_t sum = 0;
    for (size_t i = 0; i < r->collectives; i++)
        if (strcmp(r->collective[i].axis, "expert") == 0 && strncmp(r->collective[i].op, "all_to_all", 10) == 0)
            sum += r->collective[i].bytes;
    return sum;
}

/* Rank `rank`'s dry build and step (*tokens: the step's tokens over the mesh). */
static shard_status build_rank(const shard_analyze_options *o, const char *mesh_text, int rank, shard_rank_analysis *r,
                               double *bubble, uint64_t *tokens) {
    static _Thread_local shard__gemm_shapes shapes; /* ~8 KiB: off the stack */
    shapes.n = 0, shapes.dropped_flops = 0;
    shard__plan_tally tally = {0};
    shard__expert_plan experts = {0};
    shard__expert_plan_current = &experts;
    shard__mem_ledger ledger, *before = shard__mem_ledger_current();
    shard__mem_ledger_init(&ledger);
    shard__mem_ledger_adopt(&ledger);
    shard__mem_plan_mode(1);
    shard__flops_reset();
    int phase = shard__flops_phase(SHARD__PHASE_OTHER);
    shard_comm *world = NULL;
    shard_mesh *mesh = NULL;
    shard_trainer *t = NULL;
    shard_status s = shard__comm_plan_world(o->world, rank, &tally, &world);
    if (s == SHARD_OK) s = shard_mesh_create(world, mesh_text, &mesh);
    if (s == SHARD_OK) s = shard__trainer_create_planned(mesh, o->train, &t);
    if (s == SHARD_OK) {
        size_t global, micro, accum, data;
        shard_trainer_batch(t, &global, &micro, &accum, &data);
        experts.peer_rows = largest_micro_rows(o->train, accum);
    }
    /* two steps: the first may differ from the rest (ZeRO-3 finds every unit still to gather); the
     * second's traffic and work are a steady step's, the peaks those of the build and both steps */
    shard_step_result step;
    if (s == SHARD_OK) s = shard_trainer_step(t, 1, &step);
    tally.n = 0;
    experts.bound_bytes = 0;
    shard__flops_reset();
    shard__gemm_shapes *outer = shard__gemm_shapes_record(&shapes);
    if (s == SHARD_OK) s = shard_trainer_step(t, 2, &step);
    shard__gemm_shapes_record(outer);
    if (s == SHARD_OK) {
        r->rank = rank;
        describe_coords(mesh, r->coords, sizeof r->coords);
        const shard_params *p = shard_trainer_model(t)->params;
        for (size_t i = 0; i < p->count; i++) r->params += p->info[i].numel;
        shard_mem_stats st;
        shard_mem_stats_get(&st);
        memcpy(r->memory_bytes, st.peak_bytes, sizeof r->memory_bytes);
        r->memory_total_bytes = st.total_peak_bytes;
        uint64_t fl[SHARD__PHASE_COUNT];
        shard__flops_read(fl);
        r->flops_forward = (double)fl[SHARD__PHASE_FORWARD], r->flops_backward = (double)fl[SHARD__PHASE_BACKWARD];
        r->flops_recompute = (double)fl[SHARD__PHASE_RECOMPUTE], r->flops_other = (double)fl[SHARD__PHASE_OTHER];
        if (bubble) *bubble = schedule_bubble(t, r);
        size_t global, micro, accum, data;
        shard_trainer_batch(t, &global, &micro, &accum, &data);
        if (tokens) *tokens = (uint64_t)global * (uint64_t)o->train->seq;
        const shard_pipe_schedule *sched = shard__trainer_schedule(t);
        r->backward_ops = sched ? sched->m * sched->v : (int)accum, r->pipelined = sched != NULL;
    }
    if (s < 0) {
        char why[600];
        snprintf(why, sizeof why, "%s", shard_last_error());
        s = shard_error(s, "analyze %s, rank %d of %d: %s", mesh_text, rank, o->world, why);
    }
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    shard_comm_destroy(world);
    shard__expert_plan_current = NULL;
    shard__flops_phase(phase);
    shard__mem_plan_mode(0);
    shard__mem_ledger_adopt(before);
    if (s == SHARD_OK) s = take_tally(&tally, r);
    if (s == SHARD_OK) s = take_shapes(&shapes, r);
    r->expert_bytes = exchange_bytes(r), r->expert_bytes_bound = experts.bound_bytes;
    r->expert_activation_bytes = experts.activation_bytes;
    r->expert_activation_bytes_bound = experts.activation_bound_bytes;
    r->expert_bytes_measured = -1, r->expert_activation_bytes_measured = -1;
    shard__plan_tally_free(&tally);
    return s;
}

/* Whether rank `rank` must be built: all of them up to exact_ranks, else the first and last data
 * coordinate of every other coordinate (*like: the rank whose figures it copies). */
static int must_build(const char names[][SHARD_MESH_AXIS_NAME_BYTES], const int *sizes, int axes, int world, int exact,
                      int rank, int *like) {
    *like = rank;
    if (world <= exact) return 1;
    int stride = 1, data = -1;
    for (int a = axes - 1; a >= 0; a--) { /* row-major: the last axis varies fastest */
        if (strcmp(names[a], "data") == 0) {
            data = a;
            break;
        }
        stride *= sizes[a];
    }
    if (data < 0) return 1;
    int coord = (rank / stride) % sizes[data];
    if (coord == 0 || coord == sizes[data] - 1) return 1;
    *like = rank - coord * stride;
    return 0;
}

shard_status shard_analyze(const shard_analyze_options *o, shard_analysis **out) {
    *out = NULL;
    if (!o || o->struct_size < sizeof *o || !o->train)
        return shard_error(SHARD_ERR_INVALID_ARG, "analyze: options of another layout, or no trainer config");
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES], mesh_text[256];
    int sizes[SHARD_MESH_MAX_AXES];
    if (o->mesh)
        snprintf(mesh_text, sizeof mesh_text, "%s", o->mesh);
    else
        snprintf(mesh_text, sizeof mesh_text, "data=%d", o->world > 0 ? o->world : 1);
    int axes = shard_mesh_parse(mesh_text, 0, names, sizes);
    if (axes < 0) return SHARD_ERR_INVALID_ARG;
    int world = 1;
    for (int a = 0; a < axes; a++) world *= sizes[a];
    if (o->world > 0 && o->world != world)
        return shard_error(SHARD_ERR_INVALID_ARG, "analyze: --mesh %s has %d ranks, not %d", mesh_text, world,
                           o->world);
    shard_analyze_options opt = *o;
    opt.world = world;
    shard_analysis *a = calloc(1, sizeof *a);
    if (!a || !(a->rank = calloc((size_t)world, sizeof *a->rank))) {
        free(a);
        return shard_error(SHARD_ERR_NO_MEMORY, "analyze: out of memory for %d ranks", world);
    }
    a->world = world, a->ranks = (size_t)world, a->critical_rank = 0, a->axes = axes;
    memcpy(a->axis_name, names, sizeof names);
    memcpy(a->axis_size, sizes, sizeof sizes);
    for (int r = 0; r < world; r++) /* row-major: the last axis varies fastest */
        for (int k = axes - 1, rest = r; k >= 0; k--) a->rank[r].coord[k] = rest % sizes[k], rest /= sizes[k];
    const shard_trainer_config *c = o->train;
    snprintf(a->layout, sizeof a->layout, "%s zero=%d%s%s%s%s", mesh_text, c->zero, c->schedule ? " schedule=" : "",
             c->schedule ? c->schedule : "", c->recompute ? " recompute" : "",
             c->sequence_parallel ? " sequence-parallel" : "");
    snprintf(a->mesh, sizeof a->mesh, "%s", mesh_text);
    a->zero = c->zero;
    snprintf(a->optimizer, sizeof a->optimizer, "%s", c->optimizer ? c->optimizer : "adamw");
    int exact = o->exact_ranks > 0 ? o->exact_ranks : 64;
    int threads = shard_blas_threads(); /* a built rank shares the cores as a thread rank (one thread) */
    shard_status s = SHARD_OK;
    for (int r = 0; r < world && s == SHARD_OK; r++) {
        int like;
        if (!must_build(names, sizes, axes, world, exact, r, &like)) continue;
        s = build_rank(&opt, mesh_text, r, &a->rank[r], r == 0 ? &a->bubble : NULL, r == 0 ? &a->tokens : NULL);
        a->built++;
    }
    for (int r = 0; r < world && s == SHARD_OK; r++) { /* the copies: rank and coordinates their own */
        int like;
        if (must_build(names, sizes, axes, world, exact, r, &like)) continue;
        shard_rank_analysis *d = &a->rank[r];
        int coord[SHARD_MESH_MAX_AXES];
        memcpy(coord, d->coord, sizeof coord);
        *d = a->rank[like];
        d->rank = r;
        memcpy(d->coord, coord, sizeof coord);
        d->collective = malloc((d->collectives ? d->collectives : 1) * sizeof *d->collective);
        d->gemm_shape = malloc((d->gemm_shapes ? d->gemm_shapes : 1) * sizeof *d->gemm_shape);
        if (!d->collective || !d->gemm_shape) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "analyze: out of memory");
        } else {
            memcpy(d->collective, a->rank[like].collective, d->collectives * sizeof *d->collective);
            memcpy(d->gemm_shape, a->rank[like].gemm_shape, d->gemm_shapes * sizeof *d->gemm_shape);
        }
        size_t used = 0; /* its own coordinates (row-major: the last axis varies fastest) */
        for (int k = 0; k < axes; k++) {
            int inner = 1;
            for (int j = k + 1; j < axes; j++) inner *= sizes[j];
            used += (size_t)snprintf(d->coords + used, sizeof d->coords - used, "%s%s=%d", k ? "," : "", names[k],
                                     (r / inner) % sizes[k]);
        }
    }
    shard_blas_set_threads(threads);
    double most = -1;
    for (int r = 0; r < world && s == SHARD_OK; r++) {
        const shard_rank_analysis *x = &a->rank[r];
        double total = x->flops_forward + x->flops_backward + x->flops_recompute + x->flops_other;
        if (total > most) {
            most = total, a->critical_rank = r;
            double f[4] = {x->flops_forward, x->flops_backward, x->flops_recompute, x->flops_other};
            static const char *const phase[4] = {"forward", "backward", "recompute", "other"};
            int k = 0;
            for (int j = 1; j < 4; j++)
                if (f[j] > f[k]) k = j;
            snprintf(a->critical_phase, sizeof a->critical_phase, "%s", phase[k]);
        }
    }
    if (s < 0) {
        shard_analysis_destroy(a);
        return s;
    }
    *out = a;
    return SHARD_OK;
}
