/* redistribute_plan.c — choosing the steps that move a tensor between two
 * specs, and counting the bytes each rank sends in each (see redistribute.h).
 *
 * The planner keeps a current spec and, until it equals the target, takes
 * the first step that applies, in this order of preference:
 *   1. a dim whose current axes are a prefix of its target axes acquires the
 *      next target axis k: a slice when k is free (no traffic), a
 *      reduce_scatter when the tensor is partial over k, an all_to_all when k
 *      is the last axis of another dim;
 *   2. an all_reduce over the partial axes that must go and that the target
 *      does not split (on the smallest block, after the slices);
 *   3. an all_gather of the axes at the end of a dim that are not in the
 *      target's place there (the run the target does not split, at once);
 *   4. make_partial over target partial axes that are free.
 * Every step moves the spec closer to the target, so the loop ends.  Then the
 * data-moving tail after the last reduction is priced against one exchange. */
#include "shard/redistribute.h"

#include <string.h>

#include "box.h"

typedef shard__box box;

static void block_of(const shard_redistribute_plan *p, const shard_spec *spec, const int *coords, box *b) {
    shard__block_of(spec, &p->layout, p->ndim, p->shape, coords, b);
}

static uint64_t overlap_numel(const box *a, const box *b, int ndim) {
    box both;
    shard__box_intersect(a, b, ndim, &both);
    return shard__box_numel(&both, ndim);
}

static int members_of(const shard_mesh_layout *layout, unsigned mask) {
    int n = 1;
    for (int k = 0; k < layout->ndim; k++)
        if (mask & (1u << k)) n *= layout->sizes[k];
    return n;
}

/* This rank's index in the communicator over `mask` (row-major over those axes). */
static int index_in(const shard_mesh_layout *layout, unsigned mask, const int *coords) {
    int index = 0;
    for (int k = 0; k < layout->ndim; k++)
        if (mask & (1u << k)) index = index * layout->sizes[k] + coords[k];
    return index;
}

const char *shard_redistribute_kind_name(shard_redistribute_kind kind) {
    static const char *const names[] = {"slice",      "make_partial", "all_reduce", "reduce_scatter",
                                        "all_gather", "all_to_all",   "exchange"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

/* ---------------------------------------------------------------- planning */

static int dim_of_axis(const shard_spec *s, int k, int *pos) {
    for (int d = 0; d < s->ndim; d++)
        for (int i = 0; i < s->naxes[d]; i++)
            if (s->axes[d][i] == k) {
                *pos = i;
                return d;
            }
    return -1;
}

static int common_prefix(const shard_spec *a, const shard_spec *b, int d) {
    int n = 0;
    while (n < a->naxes[d] && n < b->naxes[d] && a->axes[d][n] == b->axes[d][n]) n++;
    return n;
}

static void push(shard_redistribute_plan *p, shard_redistribute_kind kind, unsigned axes, int from_dim, int to_dim,
                 const shard_spec *after) {
    shard_redistribute_step *st = &p->steps[p->nsteps++];
    st->kind = kind, st->axes = axes, st->from_dim = from_dim, st->to_dim = to_dim, st->after = *after;
}

/* Step 1: acquire the next target axis of some dim.  Returns 1 if it pushed. */
static int acquire(shard_redistribute_plan *p, shard_spec *cur, unsigned clear) {
    const shard_spec *to = &p->to;
    for (int pref = 0; pref < 3; pref++)
        for (int e = 0; e < p->ndim; e++) {
            int n = common_prefix(cur, to, e);
            if (n != cur->naxes[e] || n == to->naxes[e]) continue;
            int k = to->axes[e][n], pos = -1, d = dim_of_axis(cur, k, &pos);
            unsigned bit = 1u << k;
            shard_redistribute_kind kind;
            if (pref == 0 && d < 0 && !(cur->partial_mask & bit))
                kind = SHARD_REDIST_SLICE;
            else if (pref == 1 && d < 0 && (clear & bit))
                kind = SHARD_REDIST_REDUCE_SCATTER;
            else if (pref == 2 && d >= 0 && d != e && pos == cur->naxes[d] - 1)
                kind = SHARD_REDIST_ALL_TO_ALL;
            else
                continue;
            if (kind == SHARD_REDIST_REDUCE_SCATTER) cur->partial_mask &= ~bit;
            if (kind == SHARD_REDIST_ALL_TO_ALL) cur->axes[d][--cur->naxes[d]] = 0;
            cur->axes[e][cur->naxes[e]++] = (int8_t)k;
            push(p, kind, bit, kind == SHARD_REDIST_ALL_TO_ALL ? d : -1, e, cur);
            return 1;
        }
    return 0;
}

/* Step 3: release the axes at the end of a dim that are out of place. */
static int release(shard_redistribute_plan *p, shard_spec *cur) {
    unsigned target_split = shard_spec_split_axes(&p->to);
    for (int d = 0; d < p->ndim; d++) {
        int n = common_prefix(cur, &p->to, d);
        if (cur->naxes[d] <= n) continue;
        unsigned axes = 0;
        int keep = cur->naxes[d];
        while (keep > n && !(target_split & (1u << cur->axes[d][keep - 1]))) axes |= 1u << cur->axes[d][--keep];
        if (!axes) axes = 1u << cur->axes[d][--keep]; /* wanted elsewhere: release it alone */
        cur->naxes[d] = keep;
        for (int i = keep; i < SHARD_MESH_MAX_AXES; i++) cur->axes[d][i] = 0;
        push(p, SHARD_REDIST_ALL_GATHER, axes, d, -1, cur);
        return 1;
    }
    return 0;
}

static int has_moves(const shard_redistribute_plan *p, int first) {
    for (int i = first; i < p->nsteps; i++)
        if (p->steps[i].kind == SHARD_REDIST_ALL_GATHER || p->steps[i].kind == SHARD_REDIST_ALL_TO_ALL) return 1;
    return 0;
}

static uint64_t tail_bytes(const shard_redistribute_plan *p, int first) {
    uint64_t total = 0;
    for (int i = first; i < p->nsteps; i++) total += shard_redistribute_plan_total_bytes(p, i);
    return total;
}

/* Replace the data-moving tail after the last reduction by one exchange when that sends less. */
static void price_exchange(shard_redistribute_plan *p) {
    int last_reduction = -1;
    for (int i = 0; i < p->nsteps; i++)
        if (p->steps[i].kind == SHARD_REDIST_ALL_REDUCE || p->steps[i].kind == SHARD_REDIST_REDUCE_SCATTER)
            last_reduction = i;
    int first = last_reduction + 1;
    if (!has_moves(p, first)) return;
    shard_redistribute_plan alt = *p;
    alt.nsteps = first;
    shard_spec mid = *shard_redistribute_plan_spec_before(p, first), target = p->to;
    target.partial_mask = mid.partial_mask; /* partial axes still pending stay; new ones are added after */
    target.partial_op = mid.partial_op;
    push(&alt, SHARD_REDIST_EXCHANGE, shard_spec_split_axes(&mid), -1, -1, &target);
    if (!shard_spec_equal(&target, &p->to)) push(&alt, SHARD_REDIST_MAKE_PARTIAL, 0, -1, -1, &p->to);
    if (tail_bytes(&alt, first) < tail_bytes(p, first)) *p = alt;
}

shard_status shard_redistribute_plan_make(const shard_mesh_layout *layout, shard_dtype dtype, int ndim,
                                          const size_t *shape, const shard_spec *from, const shard_spec *to,
                                          shard_redistribute_plan *out) {
    if (!layout || !from || !to || !out || (ndim > 0 && !shape))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_redistribute_plan_make: NULL argument");
    if (ndim < 0 || ndim > SHARD_MAX_DIMS)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_redistribute_plan_make: %d dims (0..%d)", ndim,
                           SHARD_MAX_DIMS);
    SHARD_CHECK(shard_spec_validate(from, layout, ndim, "redistribute: the source spec"));
    SHARD_CHECK(shard_spec_validate(to, layout, ndim, "redistribute: the target spec"));
    SHARD_CHECK(shard_spec_check_dtype(from, dtype, "redistribute: the source spec"));
    SHARD_CHECK(shard_spec_check_dtype(to, dtype, "redistribute: the target spec"));
    memset(out, 0, sizeof *out);
    out->layout = *layout, out->dtype = dtype, out->ndim = ndim, out->from = *from, out->to = *to;
    for (int d = 0; d < ndim; d++) out->shape[d] = shape[d];
    shard_spec cur = *from;
    while (!shard_spec_equal(&cur, to)) {
        if (out->nsteps == SHARD_REDISTRIBUTE_MAX_STEPS)
            return shard_error(SHARD_ERR_INTERNAL, "redistribute: no plan within %d steps",
                               SHARD_REDISTRIBUTE_MAX_STEPS);
        unsigned clear = cur.partial_mask & ~to->partial_mask;
        if (cur.partial_mask && to->partial_mask && cur.partial_op != to->partial_op) clear = cur.partial_mask;
        if (acquire(out, &cur, clear)) continue;
        unsigned reduce = clear & ~shard_spec_split_axes(to);
        if (reduce) {
            cur.partial_mask &= ~reduce;
            if (!cur.partial_mask) cur.partial_op = SHARD_OP_SUM;
            push(out, SHARD_REDIST_ALL_REDUCE, reduce, -1, -1, &cur);
            continue;
        }
        if (release(out, &cur)) continue;
        unsigned add = to->partial_mask & ~cur.partial_mask & ~shard_spec_split_axes(&cur);
        if (add && (!cur.partial_mask || cur.partial_op == to->partial_op)) {
            cur.partial_mask |= add;
            cur.partial_op = to->partial_op;
            push(out, SHARD_REDIST_MAKE_PARTIAL, 0, -1, -1, &cur);
            continue;
        }
        return shard_error(SHARD_ERR_INTERNAL, "redistribute: the planner is stuck after %d steps", out->nsteps);
    }
    price_exchange(out);
    return SHARD_OK;
}

const shard_spec *shard_redistribute_plan_spec_before(const shard_redistribute_plan *plan, int step) {
    return step <= 0 ? &plan->from : &plan->steps[step - 1].after;
}

/* ---------------------------------------------------------------- bytes */

static uint64_t step_bytes(const shard_redistribute_plan *p, int i, const int *coords) {
    const shard_redistribute_step *st = &p->steps[i];
    const shard_spec *before = shard_redistribute_plan_spec_before(p, i);
    int n = members_of(&p->layout, st->axes), me = index_in(&p->layout, st->axes, coords);
    uint64_t es = shard_dtype_size(p->dtype), total = 0;
    if (n <= 1) return 0;
    box mine_before, mine_after;
    block_of(p, before, coords, &mine_before);
    block_of(p, &st->after, coords, &mine_after);
    switch (st->kind) {
    case SHARD_REDIST_SLICE:
    case SHARD_REDIST_MAKE_PARTIAL: return 0;
    case SHARD_REDIST_ALL_REDUCE: { /* ring: reduce-scatter then all-gather of this rank's slice */
        uint64_t count = shard__box_numel(&mine_before, p->ndim);
        size_t off, len;
        shard_split_range((size_t)count, n, me, &off, &len);
        return (count - len + (uint64_t)len * (uint64_t)(n - 1)) * es;
    }
    case SHARD_REDIST_ALL_GATHER: return shard__box_numel(&mine_before, p->ndim) * (uint64_t)(n - 1) * es;
    default: /* reduce_scatter, all_to_all, exchange: what each other member's new block needs of mine */
        for (int q = 0; q < n; q++) {
            if (q == me) continue;
            int c[SHARD_MESH_MAX_AXES];
            memcpy(c, coords, (size_t)p->layout.ndim * sizeof *c); /* one per axis, as the caller gives */
            shard_mesh_layout_unravel(&p->layout, st->axes, q, c);
            box theirs;
            block_of(p, &st->after, c, &theirs);
            total += overlap_numel(&mine_before, &theirs, p->ndim);
        }
        return total * es;
    }
}

uint64_t shard_redistribute_plan_bytes(const shard_redistribute_plan *plan, int step, const int *coords) {
    if (step >= 0) return step < plan->nsteps ? step_bytes(plan, step, coords) : 0;
    uint64_t total = 0;
    for (int i = 0; i < plan->nsteps; i++) total += step_bytes(plan, i, coords);
    return total;
}

uint64_t shard_redistribute_plan_total_bytes(const shard_redistribute_plan *plan, int step) {
    uint64_t total = 0;
    int world = shard_mesh_layout_world(&plan->layout);
    unsigned all = (1u << plan->layout.ndim) - 1;
    for (int r = 0; r < world; r++) {
        int coords[SHARD_MESH_MAX_AXES] = {0};
        shard_mesh_layout_unravel(&plan->layout, all, r, coords);
        total += shard_redistribute_plan_bytes(plan, step, coords);
    }
    return total;
}

/* ---------------------------------------------------------------- printing */

static void axes_string(const shard_mesh_layout *layout, unsigned mask, char *out, size_t out_bytes) {
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < layout->ndim && used < out_bytes; k++)
        if (mask & (1u << k))
            used += (size_t)snprintf(out + used, out_bytes - used, "%s%s", used ? "," : "", layout->names[k]);
    if (!mask) snprintf(out, out_bytes, "(local)");
}

void shard_redistribute_step_string(const shard_redistribute_plan *plan, int step, char *out, size_t out_bytes) {
    const shard_redistribute_step *st = &plan->steps[step];
    char axes[160], a[256], b[256], dims[48] = "";
    axes_string(&plan->layout, st->axes, axes, sizeof axes);
    shard_spec_string(shard_redistribute_plan_spec_before(plan, step), &plan->layout, a, sizeof a);
    shard_spec_string(&st->after, &plan->layout, b, sizeof b);
    if (st->from_dim >= 0 && st->to_dim >= 0)
        snprintf(dims, sizeof dims, ", dim %d -> dim %d", st->from_dim, st->to_dim);
    else if (st->from_dim >= 0 || st->to_dim >= 0)
        snprintf(dims, sizeof dims, ", dim %d", st->from_dim >= 0 ? st->from_dim : st->to_dim);
    snprintf(out, out_bytes, "%s over %s%s: %s -> %s", shard_redistribute_kind_name(st->kind), axes, dims, a, b);
}

void shard_redistribute_plan_print(const shard_redistribute_plan *plan, FILE *to) {
    if (plan->nsteps == 0) {
        fprintf(to, "  no steps: same placement (a local copy)\n");
        return;
    }
    for (int i = 0; i < plan->nsteps; i++) {
        char line[700];
        shard_redistribute_step_string(plan, i, line, sizeof line);
        fprintf(to, "  %d. %s  (%llu bytes sent in all)\n", i + 1, line,
                (unsigned long long)shard_redistribute_plan_total_bytes(plan, i));
    }
}
