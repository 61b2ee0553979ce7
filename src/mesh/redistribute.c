/* redistribute.c — carrying out a redistribution plan on a distributed
 * tensor (the plan itself: redistribute_plan.c).
 *
 * Each step turns the local block of the spec before it into the local block
 * of the spec after it, with one collective over the step's axes.  Blocks
 * that are contiguous in the local tensor go to the collective in place
 * (displacements into the tensor); others are packed into a staging buffer
 * and unpacked after.  The last step writes straight into the target's
 * local shard. */
#include <stdlib.h>
#include <string.h>

#include "box.h"
#include "mesh_scratch.h"
#include "shard/dtensor.h"
#include "shard/redistribute.h"

typedef shard__box box;

static void block_of(const shard_dtensor *t, const shard_spec *spec, const int *coords, box *b) {
    shard__block_of(spec, &t->layout, t->ndim, t->global_shape, coords, b);
}

typedef struct step_ctx {
    const shard_dtensor *t; /* for mesh, layout, shape, dtype */
    const shard_spec *before, *after;
    int coords[SHARD_MESH_MAX_AXES];
    box in, out; /* this rank's block before and after */
    const shard_tensor *src;
    shard_tensor *dst;
    shard_comm *comm;
    int members, me;
} step_ctx;

/* The coordinates of member q of the step's communicator (mine off its axes). */
static void member_coords(const step_ctx *c, unsigned axes, int q, int *coords) {
    memcpy(coords, c->coords, sizeof c->coords);
    shard_mesh_layout_unravel(&c->t->layout, axes, q, coords);
}

/* If box b (inside block `at`) is one contiguous run of a contiguous tensor
 * holding `at`, its element offset there; else (size_t)-1. */
static size_t contiguous_offset(const box *at, const box *b, int ndim) {
    size_t offset = 0, stride = 1;
    int outer_only = 0; /* once a dim is narrowed, every dim outside it must have length 1 */
    if (shard__box_numel(b, ndim) == 0) return 0;
    for (int d = ndim - 1; d >= 0; d--) {
        if (outer_only && b->len[d] != 1) return (size_t)-1;
        if (b->len[d] != at->len[d]) outer_only = 1;
        offset += (b->off[d] - at->off[d]) * stride;
        stride *= at->len[d];
    }
    return offset;
}

/* Box b (inside block `at`) of a contiguous tensor holding `at` as one strided
 * block (rows of a contiguous run, evenly spaced), if it is one. */
static int box_as_block(const box *at, const box *b, int ndim, shard_block *out) {
    memset(out, 0, sizeof *out);
    if (shard__box_numel(b, ndim) == 0) return 1;
    size_t inner = 1, offset = 0, run = 1, rows = 1, stride = 0;
    int d = ndim - 1;
    for (; d >= 0; d--) { /* the contiguous run: full inner dims, then the first narrowed one */
        offset += (b->off[d] - at->off[d]) * inner;
        run *= b->len[d];
        inner *= at->len[d];
        if (b->len[d] != at->len[d]) {
            d--;
            break;
        }
    }
    for (; d >= 0; d--) { /* outer dims: their rows must continue one arithmetic progression */
        offset += (b->off[d] - at->off[d]) * inner;
        if (b->len[d] > 1) {
            if (stride == 0)
                stride = inner;
            else if (rows * stride != inner)
                return 0; /* a second level of spacing */
            rows *= b->len[d];
        }
        inner *= at->len[d];
    }
    *out = (shard_block){offset, rows, run, stride ? stride : run};
    return 1;
}

/* ---------------------------------------------------------------- steps */

static shard_status run_slice(step_ctx *c) {
    shard_tensor v = shard__sub_view(c->src, &c->in, &c->out);
    return shard_tensor_copy(c->dst, &v);
}

static shard_status run_make_partial(step_ctx *c) {
    unsigned added = c->after->partial_mask & ~c->before->partial_mask;
    int zero = 0;
    if (c->after->partial_op == SHARD_OP_SUM)
        for (int k = 0; k < c->t->layout.ndim; k++)
            if ((added & (1u << k)) && c->coords[k] != 0) zero = 1;
    return zero ? shard_tensor_fill(c->dst, 0) : shard_tensor_copy(c->dst, c->src);
}

static shard_status run_all_reduce(step_ctx *c) {
    return shard_comm_all_reduce(c->comm, c->src->data, c->dst->data, shard_tensor_numel(c->src), c->t->dtype,
                                 c->before->partial_op);
}

/* Per-member boxes and counts, and whether they can be used in place. */
typedef struct layout_of_members {
    size_t *counts, *displs;
    box *boxes;
    int direct; /* every box is a contiguous run of its tensor */
} layout_of_members;

static shard_status members_alloc(layout_of_members *m, int n) {
    m->counts = calloc((size_t)n, sizeof *m->counts);
    m->displs = calloc((size_t)n, sizeof *m->displs);
    m->boxes = calloc((size_t)n, sizeof *m->boxes);
    m->direct = 1;
    if (m->counts && m->displs && m->boxes) return SHARD_OK;
    return shard_error(SHARD_ERR_NO_MEMORY, "redistribute: out of memory for %d members", n);
}

static void members_free(layout_of_members *m) { free(m->counts), free(m->displs), free(m->boxes); }

/* Set counts and displacements for boxes inside `at`: in place where every
 * box is contiguous (and, if `packed_in_order`, they follow one another in
 * member order), else packed in member order into a staging buffer. */
static void members_place(layout_of_members *m, int n, const box *at, int ndim, int packed_in_order) {
    size_t next = 0;
    for (int q = 0; q < n; q++) {
        m->counts[q] = shard__box_numel(&m->boxes[q], ndim);
        size_t off = contiguous_offset(at, &m->boxes[q], ndim);
        if (off == (size_t)-1 || (packed_in_order && m->counts[q] && off != next)) m->direct = 0;
        m->displs[q] = off;
        if (m->counts[q]) next = off + m->counts[q];
    }
    if (m->direct) return;
    next = 0;
    for (int q = 0; q < n; q++) m->displs[q] = next, next += m->counts[q];
}

static size_t members_total(const layout_of_members *m, int n) {
    size_t total = 0;
    for (int q = 0; q < n; q++) total += m->counts[q];
    return total;
}

/* Copy between the staging buffer (packed boxes) and the tensor holding `at`. */
static shard_status members_copy(const step_ctx *c, layout_of_members *m, void *staging, shard_tensor *whole,
                                 const box *at, int into_staging) {
    size_t es = shard_dtype_size(c->t->dtype);
    for (int q = 0; q < c->members; q++) {
        if (!m->counts[q]) continue;
        shard_tensor packed =
            shard__contiguous_over((char *)staging + m->displs[q] * es, c->t->dtype, c->t->ndim, &m->boxes[q]);
        shard_tensor part = shard__sub_view(whole, at, &m->boxes[q]);
        shard_status s = into_staging ? shard_tensor_copy(&packed, &part) : shard_tensor_copy(&part, &packed);
        if (s < 0) return s;
    }
    return SHARD_OK;
}

/* The mesh's reusable staging buffer for a slot (send or receive side). */
static void *scratch(const step_ctx *c, int slot, size_t elements) {
    return shard__mesh_scratch(c->t->mesh, slot, elements * shard_dtype_size(c->t->dtype));
}

static shard_status run_reduce_scatter(step_ctx *c, unsigned axes) {
    layout_of_members m = {0};
    shard_status s = members_alloc(&m, c->members);
    for (int q = 0; s == SHARD_OK && q < c->members; q++) {
        int mc[SHARD_MESH_MAX_AXES];
        member_coords(c, axes, q, mc);
        block_of(c->t, c->after, mc, &m.boxes[q]); /* nested inside my block */
    }
    void *staging = NULL;
    if (s == SHARD_OK) {
        members_place(&m, c->members, &c->in, c->t->ndim, 1);
        if (!m.direct) {
            staging = scratch(c, SHARD__SCRATCH_SEND, members_total(&m, c->members));
            s = staging ? members_copy(c, &m, staging, (shard_tensor *)c->src, &c->in, 1) : SHARD_ERR_NO_MEMORY;
        }
    }
    if (s == SHARD_OK)
        s = shard_comm_reduce_scatterv(c->comm, m.direct ? c->src->data : staging, c->dst->data, m.counts, c->t->dtype,
                                       c->before->partial_op);
    members_free(&m);
    return s;
}

static shard_status run_all_gather(step_ctx *c, unsigned axes) {
    layout_of_members m = {0};
    shard_status s = members_alloc(&m, c->members);
    for (int q = 0; s == SHARD_OK && q < c->members; q++) {
        int mc[SHARD_MESH_MAX_AXES];
        member_coords(c, axes, q, mc);
        block_of(c->t, c->before, mc, &m.boxes[q]); /* nested inside my new block */
    }
    void *staging = NULL;
    if (s == SHARD_OK) {
        members_place(&m, c->members, &c->out, c->t->ndim, 0);
        if (!m.direct) {
            staging = scratch(c, SHARD__SCRATCH_RECV, members_total(&m, c->members));
            if (!staging) s = SHARD_ERR_NO_MEMORY;
        }
    }
    if (s == SHARD_OK)
        s = shard_comm_all_gatherv(c->comm, c->src->data, shard_tensor_numel(c->src), m.direct ? c->dst->data : staging,
                                   m.counts, m.displs, c->t->dtype);
    if (s == SHARD_OK && !m.direct) s = members_copy(c, &m, staging, c->dst, &c->out, 0);
    members_free(&m);
    return s;
}

/* all_to_all and exchange: member q gets the overlap of my old block with its
 * new one.  Strided blocks go to all_to_allw as they lie (no packing); boxes
 * that are not one strided block are packed for all_to_allv. */
static shard_status run_exchange(step_ctx *c, unsigned axes) {
    if (!c->comm) return run_slice(c); /* no axes: a local slice */
    layout_of_members send = {0}, recv = {0};
    shard_status s = members_alloc(&send, c->members);
    if (s == SHARD_OK) s = members_alloc(&recv, c->members);
    shard_block *sb = calloc((size_t)c->members, sizeof *sb), *rb = calloc((size_t)c->members, sizeof *rb);
    if (s == SHARD_OK && (!sb || !rb)) s = shard_error(SHARD_ERR_NO_MEMORY, "redistribute: out of memory");
    int strided = 1;
    for (int q = 0; s == SHARD_OK && q < c->members; q++) {
        int mc[SHARD_MESH_MAX_AXES];
        box theirs_before, theirs_after;
        member_coords(c, axes, q, mc);
        block_of(c->t, c->before, mc, &theirs_before);
        block_of(c->t, c->after, mc, &theirs_after);
        shard__box_intersect(&c->in, &theirs_after, c->t->ndim, &send.boxes[q]);
        shard__box_intersect(&theirs_before, &c->out, c->t->ndim, &recv.boxes[q]);
        strided = strided && box_as_block(&c->in, &send.boxes[q], c->t->ndim, &sb[q]) &&
            box_as_block(&c->out, &recv.boxes[q], c->t->ndim, &rb[q]);
    }
    for (int p = 0; s == SHARD_OK && strided && p < c->members;
         p++) { /* every member must choose the same collective: check all pairs */
        int pc[SHARD_MESH_MAX_AXES];
        box pin, pout;
        member_coords(c, axes, p, pc);
        block_of(c->t, c->before, pc, &pin);
        block_of(c->t, c->after, pc, &pout);
        for (int q = 0; strided && q < c->members; q++) {
            int mc[SHARD_MESH_MAX_AXES];
            box tb, ta, x;
            shard_block dummy;
            member_coords(c, axes, q, mc);
            block_of(c->t, c->before, mc, &tb);
            block_of(c->t, c->after, mc, &ta);
            shard__box_intersect(&pin, &ta, c->t->ndim, &x);
            strided = box_as_block(&pin, &x, c->t->ndim, &dummy);
            shard__box_intersect(&tb, &pout, c->t->ndim, &x);
            strided = strided && box_as_block(&pout, &x, c->t->ndim, &dummy);
        }
    }
    if (s == SHARD_OK && strided) {
        s = shard_comm_all_to_allw(c->comm, c->src->data, sb, c->dst->data, rb, c->t->dtype);
    } else if (s == SHARD_OK) {
        void *send_staging = NULL, *recv_staging = NULL;
        /* my own part: one copy, straight from my old block to my new one */
        box *mine = &send.boxes[c->me];
        shard_tensor from = shard__sub_view(c->src, &c->in, mine), to = shard__sub_view(c->dst, &c->out, mine);
        s = shard_tensor_copy(&to, &from);
        memset(mine, 0, sizeof *mine), memset(&recv.boxes[c->me], 0, sizeof *mine);
        members_place(&send, c->members, &c->in, c->t->ndim, 0);
        members_place(&recv, c->members, &c->out, c->t->ndim, 0);
        if (s == SHARD_OK && !send.direct) {
            send_staging = scratch(c, SHARD__SCRATCH_SEND, members_total(&send, c->members));
            s = send_staging ? members_copy(c, &send, send_staging, (shard_tensor *)c->src, &c->in, 1)
                             : SHARD_ERR_NO_MEMORY;
        }
        if (s == SHARD_OK && !recv.direct) {
            recv_staging = scratch(c, SHARD__SCRATCH_RECV, members_total(&recv, c->members));
            if (!recv_staging) s = SHARD_ERR_NO_MEMORY;
        }
        if (s == SHARD_OK)
            s = shard_comm_all_to_allv(c->comm, send.direct ? c->src->data : send_staging, send.counts, send.displs,
                                       recv.direct ? c->dst->data : recv_staging, recv.counts, recv.displs,
                                       c->t->dtype);
        if (s == SHARD_OK && !recv.direct) s = members_copy(c, &recv, recv_staging, c->dst, &c->out, 0);
    }
    free(sb);
    free(rb);
    members_free(&send);
    members_free(&recv);
    return s;
}

static shard_status run_step(const shard_dtensor *t, const shard_redistribute_plan *plan, int i,
                             const shard_tensor *src, shard_tensor *dst) {
    const shard_redistribute_step *st = &plan->steps[i];
    step_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t, c.before = shard_redistribute_plan_spec_before(plan, i), c.after = &st->after, c.src = src, c.dst = dst;
    for (int k = 0; k < t->layout.ndim; k++) c.coords[k] = shard_mesh_coord(t->mesh, k);
    block_of(t, c.before, c.coords, &c.in);
    block_of(t, c.after, c.coords, &c.out);
    c.members = 1;
    if (st->axes) {
        SHARD_CHECK(shard_mesh_axes_comm_mask(t->mesh, st->axes, &c.comm));
        c.members = shard_comm_size(c.comm);
        c.me = shard_comm_rank(c.comm);
    }
    switch (st->kind) {
    case SHARD_REDIST_SLICE: return run_slice(&c);
    case SHARD_REDIST_MAKE_PARTIAL: return run_make_partial(&c);
    case SHARD_REDIST_ALL_REDUCE: return run_all_reduce(&c);
    case SHARD_REDIST_REDUCE_SCATTER: return run_reduce_scatter(&c, st->axes);
    case SHARD_REDIST_ALL_GATHER: return run_all_gather(&c, st->axes);
    case SHARD_REDIST_ALL_TO_ALL:
    case SHARD_REDIST_EXCHANGE: return run_exchange(&c, st->axes);
    }
    return shard_error(SHARD_ERR_INTERNAL, "redistribute: unknown step kind %d", (int)st->kind);
}

/* Plans are computed once per (spec pair, shape, dtype) and mesh: making one
 * prices the alternatives over every rank, which grows with the world. */
enum { PLAN_CACHE_SIZE = 16 };
typedef struct plan_cache {
    int count, next;
    shard_redistribute_plan plans[PLAN_CACHE_SIZE];
} plan_cache;

static int plan_matches(const shard_redistribute_plan *p, const shard_dtensor *src, const shard_spec *to) {
    if (p->dtype != src->dtype || p->ndim != src->ndim || !shard_spec_equal(&p->from, &src->spec) ||
        !shard_spec_equal(&p->to, to))
        return 0;
    for (int d = 0; d < src->ndim; d++)
        if (p->shape[d] != src->global_shape[d]) return 0;
    return 1;
}

static shard_status cached_plan(const shard_dtensor *src, const shard_spec *to, const shard_redistribute_plan **out) {
    plan_cache *cache = shard__mesh_attachment(src->mesh, SHARD__ATTACH_PLAN_CACHE);
    if (!cache) {
        cache = calloc(1, sizeof *cache);
        if (!cache) return shard_error(SHARD_ERR_NO_MEMORY, "redistribute: out of memory for the plan cache");
        shard__mesh_attach(src->mesh, SHARD__ATTACH_PLAN_CACHE, cache, free);
    }
    for (int i = 0; i < cache->count; i++)
        if (plan_matches(&cache->plans[i], src, to)) {
            *out = &cache->plans[i];
            return SHARD_OK;
        }
    shard_redistribute_plan made;
    SHARD_CHECK(
        shard_redistribute_plan_make(&src->layout, src->dtype, src->ndim, src->global_shape, &src->spec, to, &made));
    shard_redistribute_plan *slot = &cache->plans[cache->next];
    *slot = made;
    cache->next = (cache->next + 1) % PLAN_CACHE_SIZE;
    if (cache->count < PLAN_CACHE_SIZE) cache->count++;
    *out = slot;
    return SHARD_OK;
}

shard_status shard_dtensor_redistribute(const shard_dtensor *src, shard_dtensor *dst) {
    if (!src || !dst) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_redistribute: NULL tensor");
    int same = src->mesh == dst->mesh && src->dtype == dst->dtype && src->ndim == dst->ndim;
    for (int d = 0; same && d < src->ndim; d++) same = src->global_shape[d] == dst->global_shape[d];
    if (!same) {
        char a[160], b[160];
        shard_spec_type_string(&src->spec, &src->layout, src->dtype, src->global_shape, a, sizeof a);
        shard_spec_type_string(&dst->spec, &dst->layout, dst->dtype, dst->global_shape, b, sizeof b);
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_dtensor_redistribute: %s and %s differ in mesh, dtype or global shape", a, b);
    }
    const shard_redistribute_plan *found = NULL;
    SHARD_CHECK(cached_plan(src, &dst->spec, &found));
    const shard_redistribute_plan *plan = found; /* the cache's; nothing replaces it while this call runs */
    if (plan->nsteps == 0) return shard_tensor_copy(dst->local, src->local);
    const shard_tensor *cur = src->local;
    shard_tensor *owned = NULL; /* the intermediate block, when cur is one */
    shard_status s = SHARD_OK;
    for (int i = 0; i < plan->nsteps && s == SHARD_OK; i++) {
        shard_tensor *next = dst->local;
        if (i + 1 < plan->nsteps) {
            int coords[SHARD_MESH_MAX_AXES];
            box b;
            size_t shape[SHARD_MAX_DIMS];
            for (int k = 0; k < src->layout.ndim; k++) coords[k] = shard_mesh_coord(src->mesh, k);
            block_of(src, &plan->steps[i].after, coords, &b);
            for (int d = 0; d < src->ndim; d++) shape[d] = b.len[d];
            s = shard_tensor_create(src->dtype, src->ndim, shape, SHARD_MEM_COMM, &next);
            if (s < 0) break;
        }
        s = run_step(src, plan, i, cur, next);
        shard_tensor_destroy(owned);
        owned = next == dst->local ? NULL : next;
        cur = next;
    }
    shard_tensor_destroy(owned);
    return s;
}
