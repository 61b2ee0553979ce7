/* data_parallel.c — the `data` axis (see data_parallel.h): plain DP and
 * ZeRO-1/2/3, driven by the model's unit hooks.
 *
 *   zero 0  values, gradients, optimizer state replicated.  Gradients go in
 *           buckets (~bucket_bytes, units in backward order); a bucket's
 *           non-blocking all_reduce starts when its last unit's gradients
 *           are ready, while backward goes on.
 *   zero 1  optimizer state sharded: a bucket's units are reduce-scattered
 *           instead, the optimizer updates this rank's pieces, all_gather
 *           makes values whole.
 *   zero 2  gradients sharded too: a unit's gradient buffer exists only from
 *           its first backward use to its reduce-scatter (every micro-step,
 *           summed into the shard), so no rank holds the whole gradient.
 *   zero 3  values sharded: a unit is all-gathered into a buffer when the
 *           model acquires it (forward and again in backward) and freed on
 *           release; the next unit's gather (the order seen in the first
 *           step) starts while this one computes.
 *
 * Expert units (the model's expert_split; the experts of a mixture-of-experts
 * layer, different on each expert rank) are reduced and sharded over the
 * data axis alone, dense units over data x expert (shard_dp_comms); a bucket
 * holds units of one kind.
 *
 * Gradients may travel as bf16 (grad_dtype), halving their bytes; the
 * reduction itself adds in f32 and rounds once (comm's rule).
 *
 * The optimizer (optim.h) is whichever the trainer made: the strategy
 * allocates each state array it declares (whole at zero 0, this rank's
 * pieces at zero >= 1) and calls its update on what this rank owns.
 *
 * Mixed precision (compute_dtype bf16, src/nn/precision.c): the f32 values
 * (and the optimizer's state) stay the master copy; forward and backward
 * read bf16 compute copies — kept whole in bf16 (zero 0..2) or all-gathered
 * in bf16 (zero 3, half the bytes) — widened unit by unit into f32 buffers
 * while acquired. */
#include "parallel/data_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "core/monitor_impl.h"
#include "nn/precision.h"
#include "shard/memory.h"
#include "shard/split.h"

typedef struct unit_state {
    shard_comm *comm;                    /* what its gradients are reduced and its pieces gathered over */
    int rank, size, expert;              /* this rank's place in comm; an expert unit (expert_split) */
    size_t n, mine, my_displ, shard_off; /* unit elements; this rank's piece and where it sits */
    size_t *counts, *displs;             /* every rank's piece (of comm's ranks) */
    float *gathered;                     /* zero 3 or bf16 compute: the whole values while acquired */
    uint16_t *gathered16;                /* zero 3 with bf16 compute: what the all_gather fills */
    shard_request *gather;
    int in_use; /* zero 3: acquire count */
    int traced; /* the step's trace: acquires open, the first from traced_at */
    double traced_at;
    float *grad;             /* zero 2/3: the whole gradient during backward */
    shard_request *rs;       /* the reduce-scatter of this unit's gradient */
    void *rs_send, *rs_recv; /* what it reads (a bf16 copy or a unit buffer) and writes */
    int ready;               /* grads_ready seen in this micro-step */
} unit_state;

typedef struct bucket {
    size_t lo, hi, waiting; /* units lo..hi; units not ready yet */
    shard_request *req;
    uint16_t *wire; /* bf16 copy while in flight */
} bucket;

struct shard_dp {
    shard_comm *comm;   /* dense units' (and the norm's sum): the data axis, x expert with one */
    shard_comm *expert; /* the expert axis, more than one rank with expert units; else NULL */
    int rank, size, zero, sync;
    shard_dtype grad_dtype;
    shard_model *m;
    unit_state *u;
    size_t shard_total, n_buckets, *bucket_of;
    bucket *buckets;
    float *grads;      /* zero 0/1: the whole gradient slab */
    float *grad_shard; /* zero >= 1: this rank's pieces, summed over ranks */
    float *rs_out;     /* zero >= 1: a reduce-scatter's f32 result before it is added */
    float *value_shard;
    int count_replicated;
    shard__precision prec; /* bf16: a compute copy of the whole values (zero 0..2) or this rank's pieces (zero 3) */
    const shard_optimizer *opt;
    size_t n_states;                          /* the optimizer's state arrays */
    float *state[SHARD_OPTIMIZER_MAX_STATES]; /* each whole (zero 0) or this rank's pieces (zero >= 1) */
    size_t *order, order_len, order_cap, pos; /* zero 3: the acquire order of a step */
    int order_known;
    size_t last_rs; /* zero 2/3: the unit whose reduce-scatter started last */
    double exposed;
    uint64_t grad_bytes;
    int grads_zeroed, shard_zeroed; /* the last update left grads / grad_shard zero */
    int step_open;                  /* a step began and its update has not run (it may have failed part-way) */
    /* a live migration's copy of the last update's gradient (as the update read it, before the clip
     * factor) and its scalars, so another layout can replay the update; NULL when none is kept */
    float *kept;
    uint64_t kept_step;
    float kept_lr, kept_clip;
};

static size_t total_of(const shard_dp *dp) { return dp->m->params->total; }
static float *unit_values(const shard_dp *dp, size_t u) { return dp->m->params->data + dp->m->unit_offset[u]; }
static size_t wire_bytes(const shard_dp *dp) { return shard_dtype_size(dp->grad_dtype); }

/* ---------------------------------------------------------------- waiting */

static shard_status timed_wait(shard_dp *dp, shard_request **req) {
    if (!*req) return SHARD_OK;
    double t0 = shard__now();
    shard_status s = shard_request_wait(req);
    dp->exposed += shard__now() - t0;
    return s;
}

/* Finish unit u's reduce-scatter: add the piece into the shard; free what it used. */
static shard_status finish_rs(shard_dp *dp, size_t k) {
    unit_state *u = &dp->u[k];
    if (!u->rs && !u->rs_send) return SHARD_OK;
    shard_status s = timed_wait(dp, &u->rs);
    float *dst = dp->grad_shard + u->shard_off, *got = dp->rs_out + u->shard_off;
    if (dp->grad_dtype == SHARD_BF16) {
        const uint16_t *w = u->rs_recv;
        for (size_t i = 0; i < u->mine; i++) dst[i] += shard_f32_from_bf16(w[i]);
        shard_free(u->rs_recv);
    } else {
        for (size_t i = 0; i < u->mine; i++) dst[i] += got[i];
    }
    if (u->rs_send != u->grad && u->rs_send != dp->grads + dp->m->unit_offset[k]) shard_free(u->rs_send);
    u->rs_send = u->rs_recv = NULL;
    if (dp->zero >= 2) { /* the whole unit gradient is gone once reduce-scattered */
        shard_free(u->grad);
        u->grad = NULL;
        shard_model_bind_grads(dp->m, k, NULL);
    }
    return s;
}

static shard_status start_rs(shard_dp *dp, size_t k, const float *grad) {
    unit_state *u = &dp->u[k];
    SHARD_CHECK(finish_rs(dp, k)); /* a previous micro-step's, if still in flight */
    /* zero 2/3: one unit's reduce-scatter in flight at a time, so at most two
     * unit gradients exist (that one and the one backward is filling) */
    if (dp->zero >= 2 && dp->last_rs < dp->m->units && dp->last_rs != k) SHARD_CHECK(finish_rs(dp, dp->last_rs));
    dp->last_rs = k;
    if (dp->grad_dtype == SHARD_BF16) {
        uint16_t *w = shard_alloc(u->n * 2, SHARD_MEM_COMM), *r = shard_alloc(u->mine * 2 + 2, SHARD_MEM_COMM);
        if (!w || !r) {
            shard_free(w), shard_free(r);
            return shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory for a bf16 gradient copy");
        }
        for (size_t i = 0; i < u->n; i++) w[i] = shard_bf16_from_f32(grad[i]);
        u->rs_send = w, u->rs_recv = r;
    } else {
        u->rs_send = (void *)grad, u->rs_recv = dp->rs_out + u->shard_off;
    }
    dp->grad_bytes += u->n * wire_bytes(dp);
    const char *was = shard__mon_tag("grad_bucket");
    shard_status s =
        shard_comm_ireduce_scatterv(u->comm, u->rs_send, u->rs_recv, u->counts, dp->grad_dtype, SHARD_OP_SUM, &u->rs);
    shard__mon_tag(was);
    if (s < 0) { /* nothing in flight: finish_rs must not add a piece that never came */
        if (dp->grad_dtype == SHARD_BF16) shard_free(u->rs_send), shard_free(u->rs_recv);
        u->rs_send = u->rs_recv = NULL;
    }
    return s;
}

static shard_status start_bucket_tagged(shard_dp *dp, bucket *b) {
    if (dp->zero == 1) {
        for (size_t k = b->lo; k <= b->hi; k++) SHARD_CHECK(start_rs(dp, k, dp->grads + dp->m->unit_offset[k]));
        return SHARD_OK;
    }
    size_t off = dp->m->unit_offset[b->lo], n = dp->m->unit_offset[b->hi + 1] - off;
    float *g = dp->grads + off;
    shard_comm *comm = dp->u[b->lo].comm; /* a bucket's units share it */
    dp->grad_bytes += n * wire_bytes(dp);
    if (dp->grad_dtype == SHARD_BF16) {
        if (!(b->wire = shard_alloc(n * 2, SHARD_MEM_COMM)))
            return shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory for a bf16 bucket");
        for (size_t i = 0; i < n; i++) b->wire[i] = shard_bf16_from_f32(g[i]);
        return shard_comm_iall_reduce(comm, b->wire, b->wire, n, SHARD_BF16, SHARD_OP_SUM, &b->req);
    }
    return shard_comm_iall_reduce(comm, g, g, n, SHARD_F32, SHARD_OP_SUM, &b->req);
}

/* A bucket's collectives are named as gradient buckets in the step's trace. */
static shard_status start_bucket(shard_dp *dp, bucket *b) {
    const char *was = shard__mon_tag("grad_bucket");
    shard_status s = start_bucket_tagged(dp, b);
    shard__mon_tag(was);
    return s;
}

static shard_status finish_bucket(shard_dp *dp, bucket *b) {
    if (dp->zero == 1) {
        for (size_t k = b->lo; k <= b->hi; k++) SHARD_CHECK(finish_rs(dp, k));
        return SHARD_OK;
    }
    shard_status s = timed_wait(dp, &b->req);
    if (b->wire) {
        size_t off = dp->m->unit_offset[b->lo], n = dp->m->unit_offset[b->hi + 1] - off;
        for (size_t i = 0; i < n; i++) dp->grads[off + i] = shard_f32_from_bf16(b->wire[i]);
        shard_free(b->wire);
        b->wire = NULL;
    }
    return s;
}

/* ---------------------------------------------------------------- zero 3 gathers */

static shard_status start_gather_tagged(shard_dp *dp, size_t k) {
    unit_state *u = &dp->u[k];
    if (dp->prec.bf16) {
        if (!(u->gathered16 = shard_alloc(u->n * 2 + 2, SHARD_MEM_PARAMS)))
            return shard_error(SHARD_ERR_NO_MEMORY, "zero 3: out of memory gathering unit %zu (%zu values)", k, u->n);
        return shard_comm_iall_gatherv(u->comm, shard__precision_copy(&dp->prec, u->shard_off), u->mine, u->gathered16,
                                       u->counts, u->displs, SHARD_BF16, &u->gather);
    }
    if (!(u->gathered = shard_alloc(u->n * sizeof(float) + 1, SHARD_MEM_PARAMS)))
        return shard_error(SHARD_ERR_NO_MEMORY, "zero 3: out of memory gathering unit %zu (%zu values)", k, u->n);
    return shard_comm_iall_gatherv(u->comm, dp->value_shard + u->shard_off, u->mine, u->gathered, u->counts, u->displs,
                                   SHARD_F32, &u->gather);
}

/* ZeRO-3's gather of unit k's values, named as one in the step's trace. */
static shard_status start_gather(shard_dp *dp, size_t k) {
    unit_state *u = &dp->u[k];
    if (dp->zero != 3 || u->gathered || u->gathered16) return SHARD_OK;
    const char *was = shard__mon_tag("zero_gather");
    shard_status s = start_gather_tagged(dp, k);
    shard__mon_tag(was);
    return s;
}

/* Unit k's compute values in u->gathered (f32): gathered (zero 3), widened from bf16 (bf16 compute). */
static shard_status materialize(shard_dp *dp, size_t k) {
    unit_state *u = &dp->u[k];
    SHARD_CHECK(start_gather(dp, k));
    SHARD_CHECK(timed_wait(dp, &u->gather));
    if (!dp->prec.bf16) return SHARD_OK;
    const uint16_t *src = dp->zero == 3 ? u->gathered16 : shard__precision_copy(&dp->prec, dp->m->unit_offset[k]);
    if (!u->gathered && !(u->gathered = shard_alloc(u->n * sizeof(float) + 1, SHARD_MEM_PARAMS)))
        return shard_error(SHARD_ERR_NO_MEMORY, "bf16 compute: out of memory for unit %zu (%zu values)", k, u->n);
    if (!u->gathered16 && dp->zero == 3) return SHARD_OK; /* kept from an earlier acquire */
    shard__precision_widen(src, u->gathered, u->n);
    shard_free(u->gathered16);
    u->gathered16 = NULL;
    return SHARD_OK;
}

static void free_unit_values(shard_dp *dp, size_t k) {
    unit_state *u = &dp->u[k];
    shard_free(u->gathered), shard_free(u->gathered16);
    u->gathered = NULL, u->gathered16 = NULL;
    shard_model_bind_values(dp->m, k, NULL);
}

/* The bf16 compute copy from the f32 masters (after every update; f32 compute has none). */
static void refresh_compute_copy(shard_dp *dp) {
    if (!dp->prec.bf16) return;
    const float *src = dp->zero == 3 ? dp->value_shard : dp->m->params->data;
    shard__precision_refresh(&dp->prec, src, 0, dp->prec.n);
}

static shard_status note_order(shard_dp *dp, size_t k) {
    if (dp->order_known) return SHARD_OK;
    if (dp->order_len == dp->order_cap) {
        size_t cap = dp->order_cap ? 2 * dp->order_cap : 64;
        size_t *more = realloc(dp->order, cap * sizeof *more);
        if (!more) return shard_error(SHARD_ERR_NO_MEMORY, "zero 3: out of memory");
        dp->order = more, dp->order_cap = cap;
    }
    dp->order[dp->order_len++] = k;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- hooks */

static shard_status hook_acquire(void *ctx, shard_model *m, size_t k, int backward) {
    shard_dp *dp = ctx;
    unit_state *u = &dp->u[k];
    if (dp->zero == 3 || dp->prec.bf16) {
        SHARD_CHECK(note_order(dp, k));
        if (u->in_use++ == 0) {
            shard_status s = materialize(dp, k);
            if (s < 0) { /* not acquired: the count stays as it was */
                u->in_use--;
                return s;
            }
            shard_model_bind_values(m, k, u->gathered);
        }
        /* prefetch: the unit that came next in the first step's order */
        if (dp->order_known && dp->pos < dp->order_len && dp->order[dp->pos] == k) {
            dp->pos++;
            if (dp->pos < dp->order_len && dp->order[dp->pos] != k) SHARD_CHECK(start_gather(dp, dp->order[dp->pos]));
        }
    }
    if (backward && dp->zero >= 2 && u->rs_send) /* the previous micro-step's gradient, still being reduce-scattered */
        SHARD_CHECK(finish_rs(dp, k));
    if (backward && dp->zero >= 2 && !u->grad) {
        if (!(u->grad = shard_alloc_zeroed(u->n * sizeof(float) + 1, SHARD_MEM_GRADS)))
            return shard_error(SHARD_ERR_NO_MEMORY, "zero %d: out of memory for unit %zu's gradient", dp->zero, k);
        shard_model_bind_grads(m, k, u->grad);
    }
    if (shard__mon_tracing() && u->traced++ == 0) u->traced_at = shard__now(); /* the unit's compute starts */
    return SHARD_OK;
}

static shard_status hook_release(void *ctx, shard_model *m, size_t k, int backward) {
    shard_dp *dp = ctx;
    unit_state *u = &dp->u[k];
    (void)m;
    if (u->traced > 0 && --u->traced == 0)
        shard__mon_span("unit", 0, -1, -1, u->traced_at, shard__now(), "unit %zu %s", k,
                        backward ? "backward" : "forward");
    if ((dp->zero == 3 || dp->prec.bf16) && --u->in_use == 0) {
        SHARD_CHECK(timed_wait(dp, &u->gather)); /* never in flight here; kept for safety */
        /* the next acquire in order may be this very unit (prefetched): keep it then */
        int next_is_me = dp->order_known && dp->pos < dp->order_len && dp->order[dp->pos] == k;
        if (!next_is_me) free_unit_values(dp, k);
    }
    return SHARD_OK;
}

static shard_status hook_grads_ready(void *ctx, shard_model *m, size_t k) {
    (void)m;
    shard_dp *dp = ctx;
    if (dp->zero >= 2) { /* nothing new since the last reduce-scatter (no gradient, or that one on its way): done */
        unit_state *u = &dp->u[k];
        return u->grad && !u->rs_send ? start_rs(dp, k, u->grad) : SHARD_OK;
    }
    if (!dp->sync || dp->u[k].ready) return SHARD_OK;
    dp->u[k].ready = 1;
    bucket *b = &dp->buckets[dp->bucket_of[k]];
    if (--b->waiting == 0) SHARD_CHECK(start_bucket(dp, b));
    return SHARD_OK;
}

/* ---------------------------------------------------------------- life cycle */

/* Whether unit k holds expert parameters (all of them, or none: a mixed unit is refused). */
static shard_status unit_is_expert(const shard_model *m, size_t k, int *expert) {
    *expert = 0;
    if (!m->expert_split) return SHARD_OK;
    size_t lo = m->unit_first[k], hi = m->unit_first[k + 1], marked = 0;
    for (size_t i = lo; i < hi; i++) marked += m->expert_split[i] != 0;
    if (marked && marked != hi - lo)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "model '%s': unit %zu holds %zu expert-split and %zu dense parameters (%s is %s): a "
                           "unit is all expert-split or all dense; put its experts in a unit of their own",
                           m->ops->kind, k, marked, hi - lo - marked, m->params->info[lo].name,
                           m->expert_split[lo] ? "expert-split" : "dense");
    *expert = marked > 0;
    return SHARD_OK;
}

shard_status shard__dp_create(const shard_dp_comms *comms, shard_model *m, int zero, size_t bucket_bytes,
                              shard_dtype grad_dtype, int count_replicated, shard_dtype compute_dtype,
                              const shard_optimizer *opt, shard_dp **out) {
    *out = NULL;
    shard_comm *comm = comms->dense;
    if (zero < 0 || zero > 3)
        return shard_error(SHARD_ERR_INVALID_ARG, "--zero %d is invalid: give 0, 1, 2 or 3", zero);
    if (grad_dtype != SHARD_F32 && grad_dtype != SHARD_BF16)
        return shard_error(SHARD_ERR_INVALID_ARG, "--grad-dtype %s is invalid: gradients travel as f32 or bf16",
                           shard_dtype_name(grad_dtype));
    SHARD_CHECK(shard__precision_check(compute_dtype));
    if (!opt || shard_optimizer_state_count(opt) > SHARD_OPTIMIZER_MAX_STATES)
        return shard_error(SHARD_ERR_INVALID_ARG, "data parallel: %s",
                           opt ? "the optimizer declares too many state arrays" : "no optimizer given");
    shard_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory");
    dp->comm = comm, dp->m = m, dp->zero = zero, dp->grad_dtype = grad_dtype, dp->last_rs = (size_t)-1;
    dp->count_replicated = count_replicated, dp->opt = opt, dp->n_states = shard_optimizer_state_count(opt);
    dp->rank = shard_comm_rank(comm), dp->size = shard_comm_size(comm);
    size_t U = m->units, total = total_of(dp);
    dp->u = calloc(U, sizeof *dp->u);
    dp->buckets = calloc(U, sizeof *dp->buckets), dp->bucket_of = calloc(U, sizeof *dp->bucket_of);
    shard_status s = dp->u && dp->buckets && dp->bucket_of
        ? SHARD_OK
        : shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory");
    for (size_t k = 0; s == SHARD_OK && k < U; k++) {
        unit_state *u = &dp->u[k];
        u->n = shard_model_unit_elems(m, k);
        if ((s = unit_is_expert(m, k, &u->expert)) < 0) break;
        u->comm = u->expert && comms->expert_data ? comms->expert_data : comm;
        u->rank = shard_comm_rank(u->comm), u->size = shard_comm_size(u->comm);
        if (u->expert && comms->expert && shard_comm_size(comms->expert) > 1) dp->expert = comms->expert;
        size_t D = (size_t)u->size;
        u->counts = calloc(D, sizeof *u->counts), u->displs = calloc(D, sizeof *u->displs);
        if (!u->counts || !u->displs) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory");
            break;
        }
        for (size_t r = 0; r < D; r++) shard_split_even(u->n, D, r, &u->displs[r], &u->counts[r]);
        u->mine = u->counts[u->rank], u->my_displ = u->displs[u->rank], u->shard_off = dp->shard_total;
        dp->shard_total += u->mine;
    }
    /* buckets: units in backward order (last unit first), closed once they reach bucket_bytes or before a
     * unit reduced over another communicator (expert units' sizes differ between expert ranks, so dense
     * buckets count dense units only and cut the same on every rank) */
    for (size_t k = U, bytes = 0; s == SHARD_OK && k-- > 0;) {
        bucket *b = &dp->buckets[dp->n_buckets];
        if (bytes == 0) b->hi = k;
        b->lo = k, b->waiting++, dp->bucket_of[k] = dp->n_buckets;
        bytes += dp->u[k].n * sizeof(float);
        if (bytes >= bucket_bytes || k == 0 || dp->u[k - 1].comm != dp->u[k].comm) dp->n_buckets++, bytes = 0;
    }
    size_t S = dp->shard_total;
    if (s == SHARD_OK) {
        size_t state_n = zero == 0 ? total : S;
        int states_ok = 1;
        for (size_t k = 0; k < dp->n_states; k++)
            states_ok &= (dp->state[k] = shard_alloc_zeroed(state_n * sizeof(float) + 1, SHARD_MEM_OPTIMIZER)) != NULL;
        if (zero <= 1) dp->grads = shard_alloc_zeroed(total * sizeof(float) + 1, SHARD_MEM_GRADS);
        if (zero >= 1) {
            dp->grad_shard = shard_alloc_zeroed(S * sizeof(float) + 1, SHARD_MEM_GRADS);
            dp->rs_out = shard_alloc_zeroed(S * sizeof(float) + 1, SHARD_MEM_COMM);
        }
        if (zero == 3) dp->value_shard = shard_alloc(S * sizeof(float) + 1, SHARD_MEM_PARAMS);
        s = shard__precision_create(&dp->prec, compute_dtype, zero == 3 ? S : total);
        if (!states_ok || (zero <= 1 && !dp->grads) || (zero >= 1 && (!dp->grad_shard || !dp->rs_out)) ||
            (zero == 3 && !dp->value_shard))
            s = shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory for the model states (zero %d)", zero);
    }
    if (s < 0) {
        shard__dp_destroy(dp);
        return s;
    }
    if (zero <= 1)
        shard_model_bind_grad_slab(m, dp->grads);
    else
        shard_model_bind_grad_slab(m, NULL);
    if (zero == 3) { /* keep this rank's pieces; the whole values go */
        for (size_t k = 0; k < U; k++)
            memcpy(dp->value_shard + dp->u[k].shard_off, unit_values(dp, k) + dp->u[k].my_displ,
                   dp->u[k].mine * sizeof(float));
        shard_free(m->params->data);
        m->params->data = NULL;
        for (size_t k = 0; k < U; k++) shard_model_bind_values(m, k, NULL);
    }
    if (dp->prec.bf16) {
        refresh_compute_copy(dp);
        for (size_t k = 0; k < U; k++) shard_model_bind_values(m, k, NULL); /* read only through the copies */
    }
    m->hooks = (shard_model_hooks){dp, hook_acquire, hook_release, hook_grads_ready};
    *out = dp;
    return SHARD_OK;
}

void shard__dp_destroy(shard_dp *dp) {
    if (!dp) return;
    for (size_t k = 0; dp->u && k < dp->m->units; k++) {
        unit_state *u = &dp->u[k];
        if (u->gather) shard_request_wait(&u->gather);
        if (u->rs || u->rs_send) finish_rs(dp, k);
        shard_free(u->gathered), shard_free(u->gathered16), shard_free(u->grad);
        free(u->counts), free(u->displs);
    }
    for (size_t b = 0; dp->buckets && b < dp->n_buckets; b++) {
        if (dp->buckets[b].req) shard_request_wait(&dp->buckets[b].req);
        shard_free(dp->buckets[b].wire);
    }
    dp->m->hooks = (shard_model_hooks){0};
    free(dp->u), free(dp->buckets), free(dp->bucket_of), free(dp->order);
    shard_free(dp->grads), shard_free(dp->grad_shard), shard_free(dp->rs_out), shard_free(dp->value_shard);
    shard_free(dp->kept);
    for (size_t k = 0; k < dp->n_states; k++) shard_free(dp->state[k]);
    shard__precision_destroy(&dp->prec);
    if (dp->m->params->data) /* the model reads its values in place again */
        for (size_t k = 0; k < dp->m->units; k++) shard_model_bind_values(dp->m, k, unit_values(dp, k));
    free(dp);
}

/* ---------------------------------------------------------------- a step */

static shard_status drop_gathered(shard_dp *dp);

/* What a step that stopped part-way (an error, a non-finite norm: the trainer returns before the update)
 * left behind: collectives in flight, gathered copies of old values (zero 3 keeps the copy the next
 * acquire in order would reuse), acquire counts, unit gradients (zero 2/3: acquire adds into one that is
 * there) and a half-recorded acquire order.  A step that finished left none of these. */
static shard_status clear_unfinished(shard_dp *dp) {
    shard_status s = SHARD_OK;
    for (size_t b = 0; b < dp->n_buckets; b++) {
        shard_status t = dp->buckets[b].req || dp->buckets[b].wire ? finish_bucket(dp, &dp->buckets[b]) : SHARD_OK;
        if (s == SHARD_OK) s = t;
    }
    for (size_t k = 0; k < dp->m->units; k++) {
        unit_state *u = &dp->u[k];
        shard_status t = finish_rs(dp, k); /* what it adds is zeroed below with the rest */
        if (s == SHARD_OK) s = t;
        u->in_use = 0;
        if (dp->zero >= 2 && u->grad) {
            shard_free(u->grad);
            u->grad = NULL;
            shard_model_bind_grads(dp->m, k, NULL);
        }
    }
    if (dp->zero == 3 || dp->prec.bf16) {
        shard_status t = drop_gathered(dp);
        if (s == SHARD_OK) s = t;
    }
    if (!dp->order_known) dp->order_len = 0;
    return s;
}

shard_status shard__dp_begin_step(shard_dp *dp) {
    shard_status s = clear_unfinished(dp);
    dp->step_open = 1;
    /* the last update left the gradients zeroed (shard_optimizer_update) unless it did not run */
    if (dp->grads && !dp->grads_zeroed) memset(dp->grads, 0, total_of(dp) * sizeof(float));
    if (dp->grad_shard && !dp->shard_zeroed) memset(dp->grad_shard, 0, dp->shard_total * sizeof(float));
    dp->grads_zeroed = dp->shard_zeroed = 0;
    dp->exposed = 0, dp->grad_bytes = 0;
    return s;
}

shard_status shard__dp_begin_micro(shard_dp *dp, int sync) {
    dp->sync = sync, dp->pos = 0;
    for (size_t k = 0; k < dp->m->units; k++) dp->u[k].ready = 0;
    for (size_t b = 0; b < dp->n_buckets; b++) dp->buckets[b].waiting = dp->buckets[b].hi - dp->buckets[b].lo + 1;
    return dp->zero == 3 && dp->order_known && dp->order_len ? start_gather(dp, dp->order[0]) : SHARD_OK;
}

void shard__dp_set_sync(shard_dp *dp, int sync) { dp->sync = sync; }

/* zero 3: drop gathered copies left over (a prefetch not used), before the values change. */
static shard_status drop_gathered(shard_dp *dp) {
    shard_status s = SHARD_OK;
    for (size_t k = 0; k < dp->m->units; k++) {
        unit_state *u = &dp->u[k];
        shard_status t = u->gather ? shard_request_wait(&u->gather) : SHARD_OK;
        if (s == SHARD_OK) s = t;
        if (u->in_use == 0 && (u->gathered || u->gathered16)) free_unit_values(dp, k);
    }
    return s;
}

/* Squares of g[at .. at + n) holding slab elements [offset, offset + n), leaving out the parameters
 * the model marks tensor_replicated when this rank does not count them. */
static double counted_squares(const shard_dp *dp, size_t offset, size_t n, const float *g, size_t at) {
    const shard_model *m = dp->m;
    if (dp->count_replicated || !m->tensor_replicated) return shard_sum_squares(g + at, n);
    double sum = 0;
    for (size_t i = 0; i < m->params->count; i++) {
        const shard_param_info *p = &m->params->info[i];
        size_t lo = p->offset > offset ? p->offset : offset,
               hi = p->offset + p->numel < offset + n ? p->offset + p->numel : offset + n;
        if (lo < hi && !m->tensor_replicated[i]) sum += shard_sum_squares(g + at + (lo - offset), hi - lo);
    }
    return sum;
}

shard_status shard__dp_finish(shard_dp *dp, double *squares) {
    shard_status s = SHARD_OK;
    if (dp->zero <= 1)
        for (size_t b = 0; b < dp->n_buckets; b++) {
            shard_status t = finish_bucket(dp, &dp->buckets[b]);
            if (s == SHARD_OK) s = t;
        }
    if (dp->zero >= 1)
        for (size_t k = 0; k < dp->m->units; k++) {
            shard_status t = finish_rs(dp, k);
            if (s == SHARD_OK) s = t;
        }
    if ((dp->zero == 3 || dp->prec.bf16) && !dp->order_known && dp->order_len) dp->order_known = 1;
    if (s < 0) return s;
    if (dp->zero == 0 && dp->expert) { /* each expert rank's own experts, each expert counted once */
        double dense = 0, experts = 0, all_experts = 0;
        for (size_t k = 0; k < dp->m->units; k++) {
            size_t off = dp->m->unit_offset[k];
            double q = counted_squares(dp, off, dp->u[k].n, dp->grads, off);
            if (dp->u[k].expert)
                experts += q;
            else
                dense += q;
        }
        SHARD_CHECK(shard_comm_all_reduce(dp->expert, &experts, &all_experts, 1, SHARD_F64, SHARD_OP_SUM));
        *squares = dense + all_experts;
        return SHARD_OK;
    }
    if (dp->zero == 0) {
        *squares = counted_squares(dp, 0, total_of(dp), dp->grads, 0);
        return SHARD_OK;
    }
    double local = 0;
    for (size_t k = 0; k < dp->m->units; k++) {
        unit_state *u = &dp->u[k];
        local += counted_squares(dp, dp->m->unit_offset[k] + u->my_displ, u->mine, dp->grad_shard, u->shard_off);
    }
    return shard_comm_all_reduce(dp->comm, &local, squares, 1, SHARD_F64, SHARD_OP_SUM);
}

/* The state arrays' ranges from element at (in their layout). */
static void states_at(const shard_dp *dp, size_t at, float **out) {
    for (size_t k = 0; k < dp->n_states; k++) out[k] = dp->state[k] + at;
}

/* The gradient array the update reads: the whole slab (zero 0) or this rank's pieces. */
static float *update_grads(const shard_dp *dp) { return dp->zero == 0 ? dp->grads : dp->grad_shard; }
static size_t update_grads_n(const shard_dp *dp) { return dp->zero == 0 ? total_of(dp) : dp->shard_total; }

shard_status shard__dp_keep_grads(shard_dp *dp, int on) {
    shard_free(dp->kept);
    dp->kept = NULL;
    if (on && !(dp->kept = shard_alloc(update_grads_n(dp) * sizeof(float) + 1, SHARD_MEM_GRADS)))
        return shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory for a copy of the gradients");
    return SHARD_OK;
}

void shard__dp_kept(const shard_dp *dp, uint64_t *step, float *lr, float *clip) {
    *step = dp->kept_step, *lr = dp->kept_lr, *clip = dp->kept_clip;
}

/* Zero 1/2 after an update: every replica's values whole again, in place, for the units the slab ranges
 * [lo[r], hi[r]) touch (every unit when lo is NULL): each unit's all_gatherv over its communicator
 * started in unit order, then all awaited (the wait counted as exposed communication). */
static shard_status regather(shard_dp *dp, const size_t *lo, const size_t *hi, size_t ranges) {
    shard_request **reqs = calloc(dp->m->units + 1, sizeof *reqs);
    if (!reqs) return shard_error(SHARD_ERR_NO_MEMORY, "data parallel: out of memory");
    shard_status s = SHARD_OK;
    size_t started = 0;
    const char *was = shard__mon_tag("zero_gather");
    for (size_t k = 0; k < dp->m->units && s == SHARD_OK; k++) {
        unit_state *u = &dp->u[k];
        size_t first = dp->m->unit_offset[k];
        int touched = lo == NULL;
        for (size_t r = 0; r < ranges && !touched; r++) touched = lo[r] < first + u->n && hi[r] > first;
        if (!touched) continue;
        float *base = unit_values(dp, k);
        s = shard_comm_iall_gatherv(u->comm, base + u->my_displ, u->mine, base, u->counts, u->displs, SHARD_F32,
                                    &reqs[started++]);
    }
    shard__mon_tag(was);
    double t0 = shard__now();
    shard_status w = shard_request_wait_all(started, reqs);
    dp->exposed += shard__now() - t0;
    free(reqs);
    return s < 0 ? s : w;
}

/* The update of shard__dp_update on the parts of [lo, hi) (slab elements) this rank owns. */
static shard_status update_range(shard_dp *dp, uint64_t step, float lr, float clip, size_t lo, size_t hi) {
    float *st[SHARD_OPTIMIZER_MAX_STATES];
    if (dp->zero == 0) {
        states_at(dp, lo, st);
        return shard_optimizer_update(dp->opt, step, lr, clip, dp->m->params->data + lo, dp->grads + lo, st, hi - lo);
    }
    for (size_t k = 0; k < dp->m->units; k++) {
        unit_state *u = &dp->u[k];
        size_t first = dp->m->unit_offset[k] + u->my_displ, a = lo > first ? lo : first;
        size_t b = hi < first + u->mine ? hi : first + u->mine;
        if (a >= b) continue;
        size_t at = u->shard_off + (a - first);
        float *values = dp->zero == 3 ? dp->value_shard + at : dp->m->params->data + a;
        states_at(dp, at, st);
        SHARD_CHECK(shard_optimizer_update(dp->opt, step, lr, clip, values, dp->grad_shard + at, st, b - a));
    }
    return SHARD_OK;
}

shard_status shard__dp_replay(shard_dp *dp, uint64_t step, float lr, float clip, const size_t *lo, const size_t *hi,
                              size_t ranges) {
    for (size_t r = 0; r < ranges; r++) SHARD_CHECK(update_range(dp, step, lr, clip, lo[r], hi[r]));
    dp->grads_zeroed = dp->shard_zeroed = 0; /* the rest is zeroed at the next step's start */
    shard_status s = dp->zero == 1 || dp->zero == 2 ? regather(dp, lo, hi, ranges) : SHARD_OK;
    refresh_compute_copy(dp);
    return s;
}

int shard__dp_kept_is_bf16(const shard_dp *dp) {
    if (!dp->kept) return 0;
    const float *g = dp->kept;
    size_t n = update_grads_n(dp);
    uint32_t low = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &g[i], sizeof bits);
        low |= bits & 0xFFFFu;
    }
    return low == 0;
}

shard_status shard__dp_update(shard_dp *dp, uint64_t step, float lr, float clip) {
    if (dp->zero == 3 || dp->prec.bf16) SHARD_CHECK(drop_gathered(dp));
    dp->step_open = 0;
    if (dp->kept) { /* the update zeroes the gradient: a live migration's copy first */
        memcpy(dp->kept, update_grads(dp), update_grads_n(dp) * sizeof(float));
        dp->kept_step = step, dp->kept_lr = lr, dp->kept_clip = clip;
    }
    SHARD_CHECK(update_range(dp, step, lr, clip, 0, total_of(dp)));
    if (dp->zero == 0)
        dp->grads_zeroed = 1;
    else
        dp->shard_zeroed = 1;
    shard_status s = dp->zero == 1 || dp->zero == 2 ? regather(dp, NULL, NULL, 0) : SHARD_OK;
    refresh_compute_copy(dp);
    return s;
}

void shard__dp_stats(const shard_dp *dp, shard_dp_stats *out) {
    out->exposed_comm_s = dp->exposed, out->grad_bytes = dp->grad_bytes;
}

/* ---------------------------------------------------------------- state by slab range */

/* A walk over the units that a slab range [off, off + n) meets: for unit k, the unit-relative part
 * [lo, hi) of the range, and where it sits in the range (at). */
typedef struct range_part {
    size_t k, lo, hi, at;
} range_part;

static int next_part(const shard_dp *dp, size_t off, size_t n, range_part *p, size_t *k) {
    const size_t *uo = dp->m->unit_offset;
    for (; *k < dp->m->units; (*k)++) {
        size_t a = uo[*k] > off ? uo[*k] : off, b = uo[*k + 1] < off + n ? uo[*k + 1] : off + n;
        if (a >= b) continue;
        *p = (range_part){*k, a - uo[*k], b - uo[*k], a - off};
        (*k)++;
        return 1;
    }
    return 0;
}

static size_t clamp(size_t x, size_t lo, size_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* The part of [lo, hi) of unit k that rank r holds: [*a, *b) unit-relative, inside [lo, hi) (empty:
 * *a == *b), so a rank holding none of it gets a place within the range too. */
static void held(const unit_state *u, size_t r, size_t lo, size_t hi, size_t *a, size_t *b) {
    *a = clamp(u->displs[r], lo, hi);
    *b = clamp(u->displs[r] + u->counts[r], *a, hi);
}

/* Where this rank's part [a, b) of unit u sits in a shard-layout array (its own piece's start when empty:
 * no pointer is formed outside the piece). */
static float *in_shard(const unit_state *u, float *shard, size_t a, size_t b) {
    return shard + u->shard_off + (b > a ? a - u->my_displ : 0);
}

/* dst[0 .. n) = the slab range [off, off + n) of an array this rank holds in the shard layout (its
 * pieces of every unit), gathered from every rank of the data axis. */
static shard_status gather_range(shard_dp *dp, const float *shard, size_t off, size_t n, float *dst) {
    size_t *counts = calloc((size_t)dp->size, sizeof *counts), *displs = calloc((size_t)dp->size, sizeof *displs);
    shard_status s = counts && displs ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    range_part p;
    for (size_t k = 0; s == SHARD_OK && next_part(dp, off, n, &p, &k);) {
        const unit_state *u = &dp->u[p.k];
        size_t a, b;
        for (size_t r = 0; r < (size_t)u->size; r++)
            held(u, r, p.lo, p.hi, &a, &b), counts[r] = b - a, displs[r] = a - p.lo;
        held(u, (size_t)u->rank, p.lo, p.hi, &a, &b);
        s = shard_comm_all_gatherv(u->comm, in_shard(u, (float *)shard, a, b), b - a, dst + p.at, counts, displs,
                                   SHARD_F32);
    }
    free(counts), free(displs);
    return s;
}

/* The pieces this rank holds of the slab range [off, off + n) from src[0 .. n) (NULL: zeros). */
static void scatter_range(const shard_dp *dp, float *shard, size_t off, size_t n, const float *src) {
    range_part p;
    for (size_t k = 0; next_part(dp, off, n, &p, &k);) {
        const unit_state *u = &dp->u[p.k];
        size_t a, b;
        held(u, (size_t)u->rank, p.lo, p.hi, &a, &b);
        float *to = in_shard(u, shard, a, b);
        if (src)
            memcpy(to, src + p.at + (a - p.lo), (b - a) * sizeof(float));
        else
            memset(to, 0, (b - a) * sizeof(float));
    }
}

/* The array `which` names (0 values, 1 + k the optimizer's state array k), and whether this rank holds
 * all of it (else its pieces, in the shard layout). */
/* Array `which`: 0 the values, 1 + k state array k, 1 + n_states the gradient the update reads (the
 * kept copy where one is kept: what a live migration reads of the old layout; else the one the next
 * update reads: what it writes in the new one), laid out as the state arrays are. */
static shard_status state_array(const shard_dp *dp, int which, size_t off, size_t n, float **out, int *whole) {
    if (which < 0 || (size_t)which > dp->n_states + 1 || off > total_of(dp) || n > total_of(dp) - off)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "data parallel: array %d, range [%zu, %zu + %zu) is invalid: give 0 "
                           "(the values) to %zu (the %s optimizer's state arrays, then the gradient) and a range "
                           "inside the %zu values",
                           which, off, off, n, dp->n_states + 1, shard_optimizer_name(dp->opt), total_of(dp));
    *whole = which == 0 ? dp->zero < 3 : dp->zero == 0;
    if ((size_t)which == dp->n_states + 1)
        *out = dp->kept ? dp->kept : update_grads(dp);
    else
        *out = which == 0 ? (dp->zero < 3 ? dp->m->params->data : dp->value_shard) : dp->state[which - 1];
    return SHARD_OK;
}

shard_status shard__dp_get_range(shard_dp *dp, int which, size_t off, size_t n, float *dst) {
    int whole;
    float *a = NULL;
    SHARD_CHECK(state_array(dp, which, off, n, &a, &whole));
    if (!whole) return gather_range(dp, a, off, n, dst);
    memcpy(dst, a + off, n * sizeof(float));
    return SHARD_OK;
}

shard_status shard__dp_set_range(shard_dp *dp, int which, size_t off, size_t n, const float *src) {
    /* after a step that stopped part-way, a prefetch may still be reading the values: finish what it left
     * once (its gathered copies would go at the next step's start anyway) */
    if (dp->step_open) {
        SHARD_CHECK(clear_unfinished(dp));
        dp->step_open = 0;
    }
    int whole;
    float *a = NULL;
    SHARD_CHECK(state_array(dp, which, off, n, &a, &whole));
    if (!whole)
        scatter_range(dp, a, off, n, src);
    else if (src)
        memcpy(a + off, src, n * sizeof(float));
    else
        memset(a + off, 0, n * sizeof(float));
    if (which != 0 || !dp->prec.bf16) return SHARD_OK;
    if (whole) { /* the bf16 compute copy of what changed */
        shard__precision_refresh(&dp->prec, a, off, n);
        return SHARD_OK;
    }
    range_part p;
    for (size_t k = 0; next_part(dp, off, n, &p, &k);) {
        const unit_state *u = &dp->u[p.k];
        size_t lo, hi;
        held(u, (size_t)u->rank, p.lo, p.hi, &lo, &hi);
        if (hi == lo) continue;
        shard__precision_refresh(&dp->prec, a, u->shard_off + (lo - u->my_displ), hi - lo);
    }
    return SHARD_OK;
}

/* The parts of the slab range [off, off + n) this rank holds of array `which` without asking another
 * rank: all of it when the array is whole here, else its pieces of the units the range meets. */
shard_status shard__dp_held(const shard_dp *dp, int which, size_t off, size_t n, size_t *lo, size_t *hi, size_t cap,
                            size_t *count) {
    int whole;
    float *arr = NULL;
    SHARD_CHECK(state_array(dp, which, off, n, &arr, &whole));
    *count = 0;
    if (whole) {
        if (n && cap) lo[0] = 0, hi[0] = n;
        *count = n > 0;
        return SHARD_OK;
    }
    range_part p;
    for (size_t k = 0; next_part(dp, off, n, &p, &k);) {
        size_t a, b;
        held(&dp->u[p.k], (size_t)dp->u[p.k].rank, p.lo, p.hi, &a, &b);
        size_t from = p.at + (a - p.lo), to = from + (b - a);
        if (b == a) continue;
        if (*count && *count <= cap && hi[*count - 1] == from) { /* pieces of neighbouring units that touch */
            hi[*count - 1] = to;
            continue;
        }
        if (*count < cap) lo[*count] = from, hi[*count] = to;
        (*count)++;
    }
    return SHARD_OK;
}

shard_status shard__dp_get_held(const shard_dp *dp, int which, size_t off, size_t n, float *dst) {
    int whole;
    float *arr = NULL;
    SHARD_CHECK(state_array(dp, which, off, n, &arr, &whole));
    if (whole) {
        memcpy(dst, arr + off, n * sizeof(float));
        return SHARD_OK;
    }
    range_part p;
    for (size_t k = 0; next_part(dp, off, n, &p, &k);) {
        const unit_state *u = &dp->u[p.k];
        size_t a, b;
        held(u, (size_t)u->rank, p.lo, p.hi, &a, &b);
        memcpy(dst + p.at + (a - p.lo), in_shard(u, arr, a, b), (b - a) * sizeof(float));
    }
    return SHARD_OK;
}

/* ---------------------------------------------------------------- whole state */

/* dst (whole, total floats) from each rank's pieces in src (a shard layout). */
static shard_status gather_whole(shard_dp *dp, const float *src, float *dst) {
    for (size_t k = 0; k < dp->m->units; k++) {
        unit_state *u = &dp->u[k];
        float *base = dst + dp->m->unit_offset[k];
        memcpy(base + u->my_displ, src + u->shard_off, u->mine * sizeof(float));
        SHARD_CHECK(
            shard_comm_all_gatherv(u->comm, base + u->my_displ, u->mine, base, u->counts, u->displs, SHARD_F32));
    }
    return SHARD_OK;
}

shard_status shard__dp_get_state(shard_dp *dp, float *values, float *const *state) {
    size_t bytes = total_of(dp) * sizeof(float);
    memset(values, 0, bytes);
    if (dp->zero == 3)
        SHARD_CHECK(gather_whole(dp, dp->value_shard, values));
    else
        memcpy(values, dp->m->params->data, bytes);
    for (size_t k = 0; state && k < dp->n_states; k++) {
        memset(state[k], 0, bytes);
        if (dp->zero == 0)
            memcpy(state[k], dp->state[k], bytes);
        else
            SHARD_CHECK(gather_whole(dp, dp->state[k], state[k]));
    }
    return SHARD_OK;
}
