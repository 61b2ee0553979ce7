/* pipeline.c — see pipeline.h: the executor of a pipe rank's schedule.
 *
 * Two pools per rank: holders (communication buffers of a micro-batch from
 * the moment its input's receive is posted until its backward is sent:
 * input, output, gradient in, gradient out) and activation slots (the
 * buffer a range of the model's blocks keeps from its forward to its
 * backward, model.h's pipeline table; one with recompute), both per
 * (chunk, micro-batch), both allocated here: the model keeps nothing per
 * micro-batch but what it keys by the activation buffer (model.h).  Virtual stage s = chunk * p + rank; what enters
 * virtual stage s for micro-batch j is tagged 2 + 2 (s m + j) (the
 * activation, from s - 1) or 3 + 2 (s m + j) (the gradient, from s + 1);
 * TAG_TIED* (0 and 1) the shared parameter.  Tags stay small: MPI promises
 * only up to 32767 (MPI_TAG_UB), so the largest is 2 S m + 1. */
#include "parallel/pipeline.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "core/flops.h"
#include "core/monitor_impl.h"
#include "shard/layers.h"
#include "shard/memory.h"

enum { TAG_TIED_GRAD = 0, TAG_TIED_VALUE = 1, TAG_FIRST_STAGE = 2 };

typedef struct holder {
    float *in, *out, *g_in, *g_out; /* stage input, output, gradient of the output, of the input */
    shard_request *in_req, *out_req, *g_in_req, *g_out_req;
} holder;

struct shard_pp {
    shard_comm *comm;
    int rank, p, recompute;
    shard_model *m;
    const shard_pipe_schedule *s;
    size_t io_cap; /* floats each holder buffer has room for */
    size_t *io;    /* [m]: floats of micro-batch j's activation on this rank */
    int S;         /* virtual stages: p * v */
    int n_holders, n_slots;
    holder *h;
    float **acts;             /* [n_slots]: activation slots, room for any chunk's range */
    int *holder_of, *slot_of; /* [v * m]: of (chunk, micro-batch) */
    int *holder_free, *slot_free;
    size_t held, peak_held;
    /* the tied parameter (GPT: wte) */
    size_t tied_n;
    size_t tied_unit; /* the tied parameter's unit on stage 0 (acquired around each use: ZeRO-3 gathers it) */
    float *tied_in;
    float *tied_value, *tied_grad; /* the last stage's copy of it, lent to the model (use_tied) */
    shard_request *tied_req;
    /* timing */
    double t_begin, compute, wall;
    shard_trace_span *span;
    size_t spans, span_cap;
};

int shard__pp_slots(const shard_pipe_schedule *s, int rank, int recompute) {
    int *peak = calloc((size_t)s->p, sizeof *peak), r = 1;
    if (peak && shard__pipe_schedule_timeline(s, 1, 1, NULL, NULL, peak) == SHARD_OK) r = peak[rank];
    free(peak);
    return recompute || r < 1 ? 1 : r;
}

shard_status shard__pp_create(shard_comm *pipe, shard_model *m, const shard_pipe_schedule *s, int recompute,
                              shard_pp **out) {
    *out = NULL;
    const shard_model_pipe_ops *po = m->ops->pipe;
    if (!po || !po->forward_range)
        return shard_error(SHARD_ERR_INVALID_ARG, "pipeline: model_type '%s' cannot be cut into stages", m->ops->kind);
    if ((double)s->p * s->v * s->m > (INT_MAX - TAG_FIRST_STAGE - 1) / 2.0)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "pipeline: %d stages x %d chunks x %d micro-batches: too many messages to "
                           "tag (at most %d)",
                           s->p, s->v, s->m, (INT_MAX - TAG_FIRST_STAGE - 1) / 2);
    shard_pp *pp = calloc(1, sizeof *pp);
    if (!pp) return shard_error(SHARD_ERR_NO_MEMORY, "pipeline: out of memory");
    pp->comm = pipe, pp->rank = shard_comm_rank(pipe), pp->p = shard_comm_size(pipe), pp->m = m, pp->s = s;
    pp->recompute = recompute, pp->S = pp->p * s->v;
    pp->n_slots = shard__pp_slots(s, pp->rank, recompute);
    pp->n_holders = shard__pp_slots(s, pp->rank, 0) + 1; /* one more: the next op's receive is posted early */
    if (pp->n_holders > s->m * s->v) pp->n_holders = s->m * s->v;
    size_t M = (size_t)s->m, MV = M * (size_t)s->v;
    pp->io = calloc(M, sizeof *pp->io), pp->holder_of = calloc(MV, sizeof(int)), pp->slot_of = calloc(MV, sizeof(int));
    pp->h = calloc((size_t)pp->n_holders, sizeof *pp->h);
    pp->holder_free = calloc((size_t)pp->n_holders, sizeof(int)),
    pp->slot_free = calloc((size_t)pp->n_slots, sizeof(int));
    pp->acts = calloc((size_t)pp->n_slots, sizeof *pp->acts);
    if (!pp->io || !pp->holder_of || !pp->slot_of || !pp->h || !pp->holder_free || !pp->slot_free || !pp->acts) {
        shard__pp_destroy(pp);
        return shard_error(SHARD_ERR_NO_MEMORY, "pipeline: out of memory");
    }
    size_t slot_floats = 0; /* a slot serves any of this rank's chunks */
    for (int c = 0; c < s->v; c++) {
        size_t first, last, n;
        po->stage_blocks(m, (size_t)c, &first, &last);
        n = po->acts_floats(m, first, last);
        slot_floats = n > slot_floats ? n : slot_floats;
    }
    for (int k = 0; k < pp->n_slots; k++)
        if (!(pp->acts[k] = shard_alloc(slot_floats * sizeof(float) + 1, SHARD_MEM_ACTIVATIONS))) {
            shard__pp_destroy(pp);
            return shard_error(SHARD_ERR_NO_MEMORY, "pipeline: out of memory for %d activation slots of %zu floats",
                               pp->n_slots, slot_floats);
        }
    float *value = NULL, *grad = NULL;
    pp->tied_n = pp->p > 1 && po->tied ? po->tied(m, &pp->tied_unit, &value, &grad) : 0;
    if (pp->tied_n && pp->rank == 0 && !(pp->tied_in = shard_alloc(pp->tied_n * sizeof(float), SHARD_MEM_COMM))) {
        shard__pp_destroy(pp);
        return shard_error(SHARD_ERR_NO_MEMORY, "pipeline: out of memory for the tied parameter's gradient");
    }
    if (pp->tied_n && pp->tied_unit == SIZE_MAX) { /* the end's copy, refreshed from stage 0 before each step */
        pp->tied_value = shard_alloc(pp->tied_n * sizeof(float), SHARD_MEM_PARAMS);
        pp->tied_grad = shard_alloc_zeroed(pp->tied_n * sizeof(float), SHARD_MEM_GRADS);
        if (!pp->tied_value || !pp->tied_grad) {
            shard__pp_destroy(pp);
            return shard_error(SHARD_ERR_NO_MEMORY,
                               "pipeline: out of memory for the last stage's copy of the tied parameter");
        }
        po->use_tied(m, pp->tied_value, pp->tied_grad);
    }
    *out = pp;
    return SHARD_OK;
}

static void free_holders(shard_pp *pp) {
    for (int i = 0; pp->h && i < pp->n_holders; i++) {
        holder *h = &pp->h[i];
        shard_request **reqs[4] = {&h->in_req, &h->out_req, &h->g_in_req, &h->g_out_req};
        for (int k = 0; k < 4; k++)
            if (*reqs[k]) shard_request_wait(reqs[k]);
        shard_free(h->in), shard_free(h->out), shard_free(h->g_in), shard_free(h->g_out);
        memset(h, 0, sizeof *h);
    }
}

void shard__pp_destroy(shard_pp *pp) {
    if (!pp) return;
    free_holders(pp);
    if (pp->tied_req) shard_request_wait(&pp->tied_req);
    shard_free(pp->tied_in), shard_free(pp->tied_value), shard_free(pp->tied_grad);
    for (int k = 0; pp->acts && k < pp->n_slots; k++) shard_free(pp->acts[k]);
    free(pp->acts);
    free(pp->io), free(pp->holder_of), free(pp->slot_of), free(pp->h), free(pp->holder_free), free(pp->slot_free);
    free(pp->span);
    free(pp);
}

/* ---------------------------------------------------------------- helpers */

/* The model's pipeline table, read at each use (never kept: whoever holds the model may swap its tables). */
static const shard_model_pipe_ops *pipe_ops(const shard_pp *pp) { return pp->m->ops->pipe; }

/* The tied parameter's value or gradient, with its unit acquired on stage 0 (release with tied_done). */
static shard_status tied_begin(shard_pp *pp, int backward, float **value, float **grad) {
    if (pp->tied_unit == SIZE_MAX) {
        *value = pp->tied_value, *grad = pp->tied_grad;
        return SHARD_OK;
    }
    SHARD_CHECK(shard_model_acquire(pp->m, pp->tied_unit, backward));
    size_t unit;
    pipe_ops(pp)->tied(pp->m, &unit, value, grad);
    return SHARD_OK;
}

static shard_status tied_done(shard_pp *pp, int backward) {
    return pp->tied_unit != SIZE_MAX ? shard_model_release(pp->m, pp->tied_unit, backward) : SHARD_OK;
}

static void note(shard_pp *pp, char what, const shard_pipe_op *op, double t0) {
    if (pp->spans == pp->span_cap) {
        size_t cap = pp->span_cap ? 2 * pp->span_cap : 64;
        shard_trace_span *more = realloc(pp->span, cap * sizeof *more);
        if (!more) return; /* the trace loses a span; the run goes on */
        pp->span = more, pp->span_cap = cap;
    }
    double t1 = shard__now();
    pp->span[pp->spans++] =
        (shard_trace_span){what, op ? op->micro : -1, op ? op->chunk : 0, t0 - pp->t_begin, t1 - pp->t_begin};
    if (shard__mon_tracing()) {
        int compute = what == 'F' || what == 'B' || what == 'r', micro = op ? op->micro : -1,
            chunk = op ? op->chunk : 0;
        const char *name = what == 'F' ? "F"
            : what == 'B'              ? "B"
            : what == 'r'              ? "recompute F"
            : what == 'f'              ? "wait activation "
            : what == 'b'              ? "wait gradient "
                                       : "wait tied gradient ";
        char in_chunk[24] = "";
        if (chunk > 0) snprintf(in_chunk, sizeof in_chunk, " chunk %d", chunk);
        shard__mon_span(compute ? "compute" : "wait", compute ? 0 : 1, micro, chunk, t0, t1, "%s%d%s", name,
                        micro < 0 ? 0 : micro, in_chunk);
    }
}

/* Wait for a request, noting the time as `what` when it had not finished (the step monitor counts it as
 * the pipeline's wait, not as communication). */
static shard_status wait_noted(shard_pp *pp, shard_request **req, char what, const shard_pipe_op *op) {
    if (!*req) return SHARD_OK;
    double t0 = shard__now();
    if (what) shard__mon_wait_begin();
    shard_status s = shard_request_wait(req);
    if (what) shard__mon_wait_end(t0, shard__now()), note(pp, what, op, t0);
    return s;
}

/* A transfer between stages, named as one in the step's trace. */
static shard_status transfer(shard_pp *pp, int send, float *buf, size_t n, int peer, int tag, shard_request **req) {
    const char *was = shard__mon_tag("pipe");
    shard_status s = send ? shard_comm_isend(pp->comm, buf, n, SHARD_F32, peer, tag, req)
                          : shard_comm_irecv(pp->comm, buf, n, SHARD_F32, peer, tag, req);
    shard__mon_tag(was);
    return s;
}

/* Room for io floats in every holder buffer this rank uses. */
static shard_status size_holders(shard_pp *pp, size_t io) {
    if (io <= pp->io_cap) return SHARD_OK;
    free_holders(pp);
    int first = pp->rank == 0 && pp->S == pp->p, last = pp->rank == pp->p - 1 && pp->S == pp->p;
    for (int i = 0; i < pp->n_holders; i++) {
        holder *h = &pp->h[i];
        size_t b = io * sizeof(float);
        if (!first) h->in = shard_alloc(b, SHARD_MEM_ACTIVATIONS), h->g_out = shard_alloc(b, SHARD_MEM_COMM);
        if (!last) h->out = shard_alloc(b, SHARD_MEM_COMM), h->g_in = shard_alloc(b, SHARD_MEM_COMM);
        if ((!first && (!h->in || !h->g_out)) || (!last && (!h->out || !h->g_in)))
            return shard_error(SHARD_ERR_NO_MEMORY, "pipeline: out of memory for %zu-float activation buffers", io);
    }
    pp->io_cap = io;
    return SHARD_OK;
}

static int take(int *free_list, int n) {
    for (int i = 0; i < n; i++)
        if (!free_list[i]) {
            free_list[i] = 1;
            return i;
        }
    return -1;
}

static int stage_of(const shard_pp *pp, const shard_pipe_op *op) { return op->chunk * pp->p + pp->rank; }
static int rank_of(const shard_pp *pp, int stage) { return stage % pp->p; }
static int tag_of(const shard_pp *pp, int stage, int micro, int grad) {
    return TAG_FIRST_STAGE + 2 * (stage * pp->s->m + micro) + grad;
}
static int key_of(const shard_pp *pp, const shard_pipe_op *op) { return op->chunk * pp->s->m + op->micro; }

/* Post the receive an op needs (F: the previous stage's output; B: the next stage's gradient). */
static shard_status post(shard_pp *pp, const shard_pipe_op *op) {
    int j = op->micro, st = stage_of(pp, op), k = key_of(pp, op);
    if (op->what == 'F') {
        int h = take(pp->holder_free, pp->n_holders);
        if (h < 0) return shard_error(SHARD_ERR_INTERNAL, "pipeline: no free holder for micro-batch %d", j);
        pp->holder_of[k] = h;
        if (st == 0) return SHARD_OK;
        return transfer(pp, 0, pp->h[h].in, pp->io[j], rank_of(pp, st - 1), tag_of(pp, st, j, 0), &pp->h[h].in_req);
    }
    if (st == pp->S - 1) return SHARD_OK;
    holder *h = &pp->h[pp->holder_of[k]];
    return transfer(pp, 0, h->g_in, pp->io[j], rank_of(pp, st + 1), tag_of(pp, st, j, 1), &h->g_in_req);
}

static shard_status run_forward(shard_pp *pp, const shard_pipe_op *op, shard_pp_load_fn load, void *ctx,
                                double denominator, double *loss) {
    int j = op->micro, st = stage_of(pp, op), k = key_of(pp, op), first = st == 0, last = st == pp->S - 1;
    holder *h = &pp->h[pp->holder_of[k]];
    SHARD_CHECK(load(ctx, (size_t)j));
    SHARD_CHECK(wait_noted(pp, &h->in_req, 'f', op));
    SHARD_CHECK(wait_noted(pp, &h->out_req, 0, op));
    int slot = take(pp->slot_free, pp->n_slots);
    if (slot < 0) return shard_error(SHARD_ERR_INTERNAL, "pipeline: no free activation slot for micro-batch %d", j);
    pp->slot_of[k] = slot;
    if (++pp->held > pp->peak_held) pp->peak_held = pp->held;
    if (pp->recompute) pp->slot_free[slot] = 0; /* nothing is kept but the input */
    size_t b0, b1;
    pipe_ops(pp)->stage_blocks(pp->m, (size_t)op->chunk, &b0, &b1);
    double t0 = shard__now(), l = 0;
    shard__flops_phase(SHARD__PHASE_FORWARD);
    shard_status s = pipe_ops(pp)->forward_range(pp->m, pp->acts[slot], b0, b1, first ? NULL : h->in,
                                                 last ? NULL : h->out, denominator, &l);
    shard__flops_phase(SHARD__PHASE_OTHER);
    SHARD_CHECK(s);
    pp->compute += shard__now() - t0;
    note(pp, 'F', op, t0);
    *loss += l;
    if (last) return SHARD_OK;
    return transfer(pp, 1, h->out, pp->io[j], rank_of(pp, st + 1), tag_of(pp, st + 1, j, 0), &h->out_req);
}

static shard_status run_backward(shard_pp *pp, const shard_pipe_op *op, int final, shard_dp *dp, shard_pp_load_fn load,
                                 void *ctx, double denominator) {
    int j = op->micro, st = stage_of(pp, op), k = key_of(pp, op), first = st == 0, last = st == pp->S - 1;
    int hi = pp->holder_of[k];
    holder *h = &pp->h[hi];
    if (final && pp->rank == 0 &&
        pp->tied_n) { /* the last stage's part of the tied gradient, then the usual backward */
        shard_request *tied = NULL;
        SHARD_CHECK(transfer(pp, 0, pp->tied_in, pp->tied_n, pp->p - 1, TAG_TIED_GRAD, &tied));
        SHARD_CHECK(wait_noted(pp, &tied, 't', op));
        float *value, *grad;
        SHARD_CHECK(tied_begin(pp, 1, &value, &grad));
        shard_add(grad, pp->tied_in, grad, pp->tied_n);
        SHARD_CHECK(tied_done(pp, 1));
    }
    if (final) shard__dp_set_sync(dp, 1);
    SHARD_CHECK(load(ctx, (size_t)j));
    int slot = pp->recompute ? 0 : pp->slot_of[k];
    size_t b0, b1;
    pipe_ops(pp)->stage_blocks(pp->m, (size_t)op->chunk, &b0, &b1);
    if (pp->recompute) { /* the forward again, from the kept input */
        double t0 = shard__now(), l = 0;
        SHARD_CHECK(wait_noted(pp, &h->out_req, 0, op));
        pp->m->recomputing = 1;
        shard__flops_phase(SHARD__PHASE_RECOMPUTE);
        shard_status s = pipe_ops(pp)->forward_range(pp->m, pp->acts[slot], b0, b1, first ? NULL : h->in,
                                                     last ? NULL : h->out, denominator, &l);
        pp->m->recomputing = 0;
        shard__flops_phase(SHARD__PHASE_OTHER);
        SHARD_CHECK(s);
        pp->compute += shard__now() - t0;
        note(pp, 'r', op, t0);
    }
    SHARD_CHECK(wait_noted(pp, &h->g_in_req, 'b', op));
    SHARD_CHECK(wait_noted(pp, &h->g_out_req, 0, op));
    double t0 = shard__now();
    shard__flops_phase(SHARD__PHASE_BACKWARD);
    shard_status s =
        pipe_ops(pp)->backward_range(pp->m, pp->acts[slot], b0, b1, last ? NULL : h->g_in, first ? NULL : h->g_out);
    shard__flops_phase(SHARD__PHASE_OTHER);
    SHARD_CHECK(s);
    pp->compute += shard__now() - t0;
    note(pp, 'B', op, t0);
    if (!pp->recompute) pp->slot_free[slot] = 0;
    pp->held--;
    if (!first)
        SHARD_CHECK(transfer(pp, 1, h->g_out, pp->io[j], rank_of(pp, st - 1), tag_of(pp, st - 1, j, 1), &h->g_out_req));
    if (final && pp->rank == pp->p - 1 && pp->tied_n) {
        float *value, *grad;
        SHARD_CHECK(tied_begin(pp, 1, &value, &grad));
        SHARD_CHECK(transfer(pp, 1, grad, pp->tied_n, 0, TAG_TIED_GRAD, &pp->tied_req));
    }
    /* every unit's gradient is complete after the rank's last backward (with chunks, that backward ran one
     * chunk's units only): the data axis may start on the others */
    for (size_t u = 0; final && u < pp->m->units; u++) SHARD_CHECK(shard_model_grads_ready(pp->m, u));
    /* the holder's sends may still be in flight: they are waited for before it is used again */
    pp->holder_free[hi] = 0;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- a step */

shard_status shard__pp_run(shard_pp *pp, shard_dp *dp, shard_pp_load_fn load, void *ctx, double denominator,
                           double *loss) {
    const shard_pipe_schedule *s = pp->s;
    const shard_pipe_op *ops = s->ops[pp->rank];
    int n = s->count[pp->rank], final_b = -1;
    *loss = 0;
    pp->t_begin = shard__now(), pp->compute = 0, pp->spans = 0, pp->held = 0, pp->peak_held = 0;
    for (int i = 0; i < n; i++)
        if (ops[i].what == 'B') final_b = i;
    /* every micro-batch's activation size on this rank (rows may differ between micro-batches) */
    size_t io_max = 0;
    for (int j = 0; j < s->m; j++) {
        SHARD_CHECK(load(ctx, (size_t)j));
        pp->io[j] = pipe_ops(pp)->io_floats(pp->m);
        io_max = pp->io[j] > io_max ? pp->io[j] : io_max;
    }
    SHARD_CHECK(size_holders(pp, io_max ? io_max : 1));
    memset(pp->holder_free, 0, (size_t)pp->n_holders * sizeof(int));
    memset(pp->slot_free, 0, (size_t)pp->n_slots * sizeof(int));
    SHARD_CHECK(shard__dp_begin_micro(dp, 0));
    /* the last stage's copy of the tied parameter: stage 0's values */
    if (pp->tied_n && (pp->rank == 0 || pp->rank == pp->p - 1)) {
        float *value, *grad;
        SHARD_CHECK(tied_begin(pp, 0, &value, &grad));
        if (pp->rank == 0) {
            SHARD_CHECK(shard_comm_send(pp->comm, value, pp->tied_n, SHARD_F32, pp->p - 1, TAG_TIED_VALUE));
        } else {
            SHARD_CHECK(shard_comm_recv(pp->comm, value, pp->tied_n, SHARD_F32, 0, TAG_TIED_VALUE));
            memset(grad, 0, pp->tied_n * sizeof(float));
        }
        SHARD_CHECK(tied_done(pp, 0));
    }
    shard_status st = n ? post(pp, &ops[0]) : SHARD_OK;
    for (int i = 0; i < n && st == SHARD_OK; i++) {
        if (i + 1 < n) st = post(pp, &ops[i + 1]);
        if (st == SHARD_OK)
            st = ops[i].what == 'F' ? run_forward(pp, &ops[i], load, ctx, denominator, loss)
                                    : run_backward(pp, &ops[i], i == final_b, dp, load, ctx, denominator);
    }
    /* A failed op: this rank's neighbours may wait for a message it will never send, and its posted
     * receives for ones they will never send, so it ends the job now with the cause (the waits below then
     * return at once) instead of meeting the deadline and reporting a timeout in its place. */
    char why[512] = "";
    shard_status failed = st;
    if (failed < 0) {
        snprintf(why, sizeof why, "%s", shard_last_error());
        if (st != SHARD_ERR_ABORTED) shard_comm_abort(pp->comm, st, why);
    }
    /* the sends still in flight (a failed run's receives too) */
    for (int i = 0; i < pp->n_holders; i++) {
        holder *h = &pp->h[i];
        shard_request **reqs[4] = {&h->out_req, &h->g_out_req, &h->in_req, &h->g_in_req};
        for (int k = 0; k < 4; k++) {
            shard_status w = wait_noted(pp, reqs[k], 0, NULL);
            if (st == SHARD_OK) st = w;
        }
    }
    shard_status w = wait_noted(pp, &pp->tied_req, 0, NULL);
    pp->wall = shard__now() - pp->t_begin;
    if (failed < 0) return shard_error(failed, "%s", why);
    return st == SHARD_OK ? w : st;
}

void shard__pp_stats(const shard_pp *pp, shard_pipeline_stats *out) {
    *out = (shard_pipeline_stats){.stage = pp->rank,
                                  .stages = pp->p,
                                  .chunks = pp->s->v,
                                  .begin_s = pp->t_begin,
                                  .wall_s = pp->wall,
                                  .compute_s = pp->compute,
                                  .held_peak = pp->peak_held,
                                  .slots = (size_t)pp->n_slots,
                                  .spans = pp->spans,
                                  .span = pp->span};
}
