/* expert_parallel.c — the `expert` axis's token exchange (expert.h): the
 * route (per-expert counts, exchanged once per layer and step), dispatch and
 * combine on the communicator's all_to_allv.  No model-specific code: a model
 * hands in the experts its router picked and the rows to move.
 *
 * On the wire, rank p's rows for rank q are sorted by expert (the experts of q
 * in order), each expert's rows in p's assignment order; what q receives is
 * thus ordered by sender, then expert.  Dispatch regroups it by expert, then
 * sender (the layout expert.h promises); combine undoes both steps.
 *
 * Each all_to_allv is timed into the calling thread's shard_expert_stats
 * (expert.h): the exchange is blocking, so that time is what the step waits;
 * with a log set (shard_expert_log_set) each call's entry and exit times too,
 * from which a benchmark splits waiting for peers from moving bytes.
 *
 * Below the exchange: the trainer's layout of expert parameters' whole
 * tensors over the axis (expert_parallel.h). */
#include "shard/expert.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc_impl.h"
#include "parallel/expert_parallel.h"
#include "shard/clock.h"
#include "shard/memory.h"
#include "shard/split.h"

struct shard_expert_route {
    shard_comm *comm; /* NULL when every expert is here */
    int ranks, me;
    size_t experts, first, local;  /* this rank's experts [first, first + local) */
    size_t n, total;               /* assignments here; rows this rank's experts receive */
    size_t *perm;                  /* [n]: wire position j holds assignment perm[j] */
    size_t *send_rows, *recv_rows; /* [ranks]: rows to each rank, from each rank */
    size_t *from;                  /* [ranks * local]: rows from rank p for local expert e at p * local + e */
    size_t *rows;                  /* [local]: rows per local expert, summed over senders */
    size_t *sc, *sd, *rc, *rd;     /* [ranks] each: one exchange's element counts and displacements */
    float *wire_out, *wire_in;     /* staging in wire order, reused by every exchange of the route */
    size_t out_cap, in_cap;        /* their capacities in floats */
};

enum {
    STAT_COUNTS = SHARD_EXPERT_COUNTS,
    STAT_DISPATCH = SHARD_EXPERT_DISPATCH,
    STAT_COMBINE = SHARD_EXPERT_COMBINE,
    STAT_KINDS
};

/* This thread's exchanges by kind since the last reset (shard_expert_stats, expert.h). */
static _Thread_local struct {
    double ms[STAT_KINDS];
    uint64_t calls[STAT_KINDS], bytes[STAT_KINDS];
    size_t logged; /* calls since the reset while `log` was set */
} tally;

/* The caller's log of single calls (shard_expert_log_set), per thread as the tally is. */
static _Thread_local struct {
    shard_expert_call *at;
    size_t capacity;
} log_of;

/* One timed all_to_allv on behalf of `kind`, counting the send buffer's bytes. */
static shard_status timed_exchange(int kind, shard_comm *comm, const void *send, const size_t *sc, const size_t *sd,
                                   void *recv, const size_t *rc, const size_t *rd, shard_dtype dtype, int ranks) {
    size_t sent = 0, received = 0;
    for (int q = 0; q < ranks; q++) sent += sc[q], received += rc[q];
    double t0 = shard_clock_seconds();
    shard_status s = shard_comm_all_to_allv(comm, send, sc, sd, recv, rc, rd, dtype);
    double t1 = shard_clock_seconds();
    uint64_t bytes = (uint64_t)(sent * shard_dtype_size(dtype));
    tally.ms[kind] += (t1 - t0) * 1e3;
    tally.calls[kind]++, tally.bytes[kind] += bytes;
    if (log_of.at) {
        if (tally.logged < log_of.capacity)
            log_of.at[tally.logged] = (shard_expert_call){.kind = kind,
                                                          .bytes = bytes,
                                                          .recv_bytes = (uint64_t)(received * shard_dtype_size(dtype)),
                                                          .enter_s = t0,
                                                          .leave_s = t1};
        tally.logged++;
    }
    return s;
}

void shard_expert_log_set(shard_expert_call *log, size_t capacity) {
    log_of.at = capacity ? log : NULL, log_of.capacity = log ? capacity : 0;
}

size_t shard_expert_log_count(void) { return tally.logged; }

shard_status shard_expert_stats_get(shard_expert_stats *out) {
    if (!out || out->struct_size < sizeof(size_t))
        return shard_error(SHARD_ERR_INVALID_ARG, "expert stats: give a struct with struct_size set (%zu bytes)",
                           sizeof(shard_expert_stats));
    shard_expert_stats x = {.struct_size = out->struct_size,
                            .counts_ms = tally.ms[STAT_COUNTS],
                            .dispatch_ms = tally.ms[STAT_DISPATCH],
                            .combine_ms = tally.ms[STAT_COMBINE],
                            .counts_calls = tally.calls[STAT_COUNTS],
                            .dispatch_calls = tally.calls[STAT_DISPATCH],
                            .combine_calls = tally.calls[STAT_COMBINE],
                            .counts_bytes = tally.bytes[STAT_COUNTS],
                            .dispatch_bytes = tally.bytes[STAT_DISPATCH],
                            .combine_bytes = tally.bytes[STAT_COMBINE]};
    memcpy(out, &x, out->struct_size < sizeof x ? out->struct_size : sizeof x);
    return SHARD_OK;
}

void shard_expert_stats_reset(void) { memset(&tally, 0, sizeof tally); }

void shard_expert_range(size_t experts, int ranks, int rank, size_t *first, size_t *count) {
    if (ranks < 1 || rank < 0 || rank >= ranks) {
        *first = 0, *count = experts;
        return;
    }
    shard_split_even(experts, (size_t)ranks, (size_t)rank, first, count);
}

static int ranks_of(shard_comm *comm) { return comm ? shard_comm_size(comm) : 1; }

void shard_expert_route_destroy(shard_expert_route *r) {
    if (!r) return;
    free(r->perm), free(r->send_rows), free(r->recv_rows), free(r->from), free(r->rows);
    free(r->sc), free(r->sd), free(r->rc), free(r->rd);
    shard_free(r->wire_out), shard_free(r->wire_in);
    free(r);
}

/* The route's arrays, sized by its ranks, experts and assignments. */
static shard_status route_alloc(shard_expert_route *r) {
    size_t R = (size_t)r->ranks;
    r->perm = calloc(r->n + 1, sizeof *r->perm);
    r->send_rows = calloc(R, sizeof *r->send_rows), r->recv_rows = calloc(R, sizeof *r->recv_rows);
    r->from = calloc(R * r->local + 1, sizeof *r->from), r->rows = calloc(r->local + 1, sizeof *r->rows);
    r->sc = calloc(R, sizeof *r->sc), r->sd = calloc(R, sizeof *r->sd);
    r->rc = calloc(R, sizeof *r->rc), r->rd = calloc(R, sizeof *r->rd);
    return r->perm && r->send_rows && r->recv_rows && r->from && r->rows && r->sc && r->sd && r->rc && r->rd
        ? SHARD_OK
        : shard_error(SHARD_ERR_NO_MEMORY, "expert route: out of memory for %zu assignments", r->n);
}

/* The counts exchange: rank q is sent [bad assignment + 1 (0: none), its expert, rows for each of q's
 * experts], so a rank that names an invalid expert fails every rank at the same call. */
static shard_status exchange_counts(shard_expert_route *r, const size_t *per_expert, size_t bad, int32_t bad_expert) {
    size_t R = (size_t)r->ranks, out_n = 0, in_n = R * (2 + r->local);
    for (size_t q = 0; q < R; q++) {
        size_t f, c;
        shard_expert_range(r->experts, r->ranks, (int)q, &f, &c);
        r->sd[q] = out_n, r->sc[q] = 2 + c, out_n += 2 + c;
        r->rd[q] = q * (2 + r->local), r->rc[q] = 2 + r->local;
    }
    int64_t *out = calloc(out_n + in_n, sizeof *out), *in = out ? out + out_n : NULL;
    if (!out) return shard_error(SHARD_ERR_NO_MEMORY, "expert route: out of memory for the counts");
    for (size_t q = 0, e = 0; q < R; q++) {
        out[r->sd[q]] = bad == SIZE_MAX ? 0 : (int64_t)bad + 1, out[r->sd[q] + 1] = bad_expert;
        for (size_t k = 0; k < r->sc[q] - 2; k++, e++) out[r->sd[q] + 2 + k] = (int64_t)per_expert[e];
    }
    shard_status s = SHARD_OK;
    if (r->comm)
        s = timed_exchange(STAT_COUNTS, r->comm, out, r->sc, r->sd, in, r->rc, r->rd, SHARD_I64, r->ranks);
    else
        memcpy(in, out, in_n * sizeof *in);
    /* the analyzer's dry run hears from no other rank: each is taken to send this rank's experts what
     * this rank sends them (a balanced router's load), so the combine and the experts' rows are counted */
    for (size_t p = 0; s == SHARD_OK && r->comm && shard__mem_planning() && p < R; p++)
        if (p != (size_t)r->me)
            memcpy(in + p * (2 + r->local) + 2, in + (size_t)r->me * (2 + r->local) + 2, r->local * sizeof *in);
    for (size_t p = 0; s == SHARD_OK && p < R; p++) {
        const int64_t *h = in + p * (2 + r->local);
        if (h[0])
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "expert route: rank %zu's assignment %lld names expert %lld: give experts in 0..%zu", p,
                            (long long)h[0] - 1, (long long)h[1], r->experts - 1);
        for (size_t e = 0; s == SHARD_OK && e < r->local; e++) {
            r->from[p * r->local + e] = (size_t)h[2 + e];
            r->rows[e] += (size_t)h[2 + e], r->recv_rows[p] += (size_t)h[2 + e];
        }
    }
    for (size_t e = 0; s == SHARD_OK && e < r->local; e++) r->total += r->rows[e];
    free(out);
    return s;
}

shard_status shard_expert_route_create(shard_comm *comm, size_t experts, const int32_t *expert, size_t n,
                                       shard_expert_route **out) {
    *out = NULL;
    if (experts < 1 || experts > INT32_MAX || (n && !expert))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "expert route: %zu experts and %zu assignments%s: give 1..%d experts and, with "
                           "assignments, their experts",
                           experts, n, n && !expert ? " without their experts" : "", INT32_MAX);
    shard_expert_route *r = calloc(1, sizeof *r);
    if (!r) return shard_error(SHARD_ERR_NO_MEMORY, "expert route: out of memory");
    r->ranks = ranks_of(comm), r->comm = r->ranks > 1 ? comm : NULL, r->me = r->comm ? shard_comm_rank(comm) : 0;
    r->experts = experts, r->n = n;
    shard_expert_range(experts, r->ranks, r->me, &r->first, &r->local);
    size_t *per_expert = calloc(experts + 1, sizeof *per_expert), bad = SIZE_MAX;
    int32_t bad_expert = 0;
    shard_status s = per_expert ? route_alloc(r) : shard_error(SHARD_ERR_NO_MEMORY, "expert route: out of memory");
    for (size_t i = 0; s == SHARD_OK && i < n; i++) {
        if (expert[i] < 0 || (size_t)expert[i] >= experts) {
            if (bad == SIZE_MAX) bad = i, bad_expert = expert[i];
            continue;
        }
        per_expert[expert[i]]++;
    }
    if (s == SHARD_OK) s = exchange_counts(r, per_expert, bad, bad_expert); /* every rank, even a failing one */
    if (s == SHARD_OK) { /* wire order: a counting sort by expert, stable in assignment order */
        size_t at = 0;
        for (size_t e = 0; e < experts; e++) {
            size_t c = per_expert[e];
            per_expert[e] = at, at += c;
        }
        for (size_t i = 0; i < n; i++) r->perm[per_expert[expert[i]]++] = i;
        for (int q = 0; q < r->ranks; q++) {
            size_t f, c;
            shard_expert_range(experts, r->ranks, q, &f, &c);
            r->send_rows[q] = c ? per_expert[f + c - 1] - (f ? per_expert[f - 1] : 0) : 0; /* ends, after the sort */
        }
    }
    free(per_expert);
    if (s < 0) {
        shard_expert_route_destroy(r);
        return s;
    }
    *out = r;
    return SHARD_OK;
}

shard_status shard_expert_route_renew(shard_expert_route **route, shard_comm *comm, size_t experts,
                                      const int32_t *expert, size_t n) {
    shard_expert_route *fresh = NULL, *old = *route;
    SHARD_CHECK(shard_expert_route_create(comm, experts, expert, n, &fresh));
    if (old) { /* its staging moves over (a new route stages nothing before its first exchange) */
        fresh->wire_out = old->wire_out, fresh->out_cap = old->out_cap;
        fresh->wire_in = old->wire_in, fresh->in_cap = old->in_cap;
        old->wire_out = old->wire_in = NULL;
        shard_expert_route_destroy(old);
    }
    *route = fresh;
    return SHARD_OK;
}

size_t shard_expert_route_rows(const shard_expert_route *r, size_t local_expert) {
    return r && local_expert < r->local ? r->rows[local_expert] : 0;
}

size_t shard_expert_route_total(const shard_expert_route *r) { return r ? r->total : 0; }

/* The staging buffers for width-wide rows (kept for the route's later exchanges). */
static shard_status staging(shard_expert_route *r, size_t width) {
    size_t out_n = r->n * width + 1, in_n = r->total * width + 1;
    if (r->out_cap < out_n) {
        shard_free(r->wire_out);
        r->wire_out = shard_alloc(out_n * sizeof(float), SHARD_MEM_COMM), r->out_cap = r->wire_out ? out_n : 0;
    }
    if (r->in_cap < in_n) {
        shard_free(r->wire_in);
        r->wire_in = shard_alloc(in_n * sizeof(float), SHARD_MEM_COMM), r->in_cap = r->wire_in ? in_n : 0;
    }
    return r->wire_out && r->wire_in
        ? SHARD_OK
        : shard_error(SHARD_ERR_NO_MEMORY, "expert exchange: out of memory for %zu + %zu rows of %zu", r->n, r->total,
                      width);
}

/* Element counts of the exchange that sends `out_rows[q]` rows to each rank q and receives in_rows[p]. */
static void exchange_counts_of(shard_expert_route *r, const size_t *out_rows, const size_t *in_rows, size_t width) {
    size_t so = 0, ro = 0;
    for (int q = 0; q < r->ranks; q++) {
        r->sc[q] = out_rows[q] * width, r->sd[q] = so, so += r->sc[q];
        r->rc[q] = in_rows[q] * width, r->rd[q] = ro, ro += r->rc[q];
    }
}

/* Between the wire's order (sender, then expert) and the experts' (expert, then sender): to_experts 1
 * copies wire -> grouped, 0 grouped -> wire. */
static void regroup(const shard_expert_route *r, float *wire, float *grouped, size_t width, int to_experts) {
    size_t at = 0; /* rows into the wire */
    for (int p = 0; p < r->ranks; p++) {
        size_t start = 0; /* where local expert e's rows start in the grouped layout */
        for (size_t e = 0; e < r->local; e++) {
            size_t before = 0; /* rows of expert e from ranks before p */
            for (int q = 0; q < p; q++) before += r->from[(size_t)q * r->local + e];
            size_t k = r->from[(size_t)p * r->local + e], bytes = k * width * sizeof(float);
            float *g = grouped + (start + before) * width, *w = wire + at * width;
            if (bytes) memcpy(to_experts ? g : w, to_experts ? w : g, bytes);
            at += k, start += r->rows[e];
        }
    }
}

shard_status shard_expert_dispatch(shard_expert_route *r, const float *x, float *x_experts, size_t width) {
    if (!r || (r->n && width && !x) || (r->total && width && !x_experts))
        return shard_error(SHARD_ERR_INVALID_ARG, "expert dispatch: no route, or no rows for its %zu -> %zu rows",
                           r ? r->n : 0, r ? r->total : 0);
    if (!r->comm) { /* one rank: the wire order is the experts' order */
        for (size_t j = 0; j < r->n; j++) memcpy(x_experts + j * width, x + r->perm[j] * width, width * sizeof *x);
        return SHARD_OK;
    }
    SHARD_CHECK(staging(r, width));
    for (size_t j = 0; j < r->n; j++) memcpy(r->wire_out + j * width, x + r->perm[j] * width, width * sizeof *x);
    exchange_counts_of(r, r->send_rows, r->recv_rows, width);
    SHARD_CHECK(timed_exchange(STAT_DISPATCH, r->comm, r->wire_out, r->sc, r->sd, r->wire_in, r->rc, r->rd, SHARD_F32,
                               r->ranks));
    regroup(r, r->wire_in, x_experts, width, 1);
    return SHARD_OK;
}

shard_status shard_expert_combine(shard_expert_route *r, const float *y_experts, float *y, size_t width) {
    if (!r || (r->n && width && !y) || (r->total && width && !y_experts))
        return shard_error(SHARD_ERR_INVALID_ARG, "expert combine: no route, or no rows for its %zu -> %zu rows",
                           r ? r->total : 0, r ? r->n : 0);
    if (!r->comm) {
        for (size_t j = 0; j < r->n; j++) memcpy(y + r->perm[j] * width, y_experts + j * width, width * sizeof *y);
        return SHARD_OK;
    }
    SHARD_CHECK(staging(r, width));
    regroup(r, r->wire_in, (float *)y_experts, width, 0);
    exchange_counts_of(r, r->recv_rows, r->send_rows, width);
    SHARD_CHECK(timed_exchange(STAT_COMBINE, r->comm, r->wire_in, r->sc, r->sd, r->wire_out, r->rc, r->rd, SHARD_F32,
                               r->ranks));
    for (size_t j = 0; j < r->n; j++) memcpy(y + r->perm[j] * width, r->wire_out + j * width, width * sizeof *y);
    return SHARD_OK;
}

/* ---------------------------------------------------------------- the whole tensors (expert_parallel.h) */

void shard__expert_layout_destroy(shard__expert_layout *x) {
    if (!x) return;
    free(x->rows);
    free(x);
}

shard_status shard__expert_layout_create(shard_comm *expert, const shard_model *m, shard__expert_layout **out) {
    *out = NULL;
    if (!expert || shard_comm_size(expert) < 2 || !m->expert_split) return SHARD_OK; /* every tensor whole here */
    shard__expert_layout *x = calloc(1, sizeof *x);
    size_t count = m->params->count, R = (size_t)shard_comm_size(expert);
    int64_t *mine = calloc(count + 1, sizeof *mine), *all = calloc(count * R + 1, sizeof *all);
    if (x) x->rows = calloc(count * R + 1, sizeof *x->rows);
    shard_status s = x && mine && all && x->rows
        ? SHARD_OK
        : shard_error(SHARD_ERR_NO_MEMORY, "expert axis: out of memory for %zu parameters", count);
    for (size_t i = 0; s == SHARD_OK && i < count; i++) {
        size_t shape[SHARD_MAX_DIMS];
        memcpy(shape, m->params->info[i].shape, sizeof shape);
        shard_model_whole_shape(m, i, shape);
        /* dense: -1 (the same on every expert rank, or the ranks hold different models) */
        mine[i] = m->expert_split[i] && m->params->info[i].ndim > 0 ? (int64_t)shape[0] : -1;
    }
    if (s == SHARD_OK) s = shard_comm_all_gather(expert, mine, all, count, SHARD_I64);
    for (size_t i = 0; s == SHARD_OK && i < count; i++)
        for (size_t r = 0; r < R; r++) {
            int64_t v = all[r * count + i];
            if ((v < 0) != (mine[i] < 0)) {
                s = shard_error(SHARD_ERR_INVALID_ARG,
                                "expert axis: parameter %s is expert-split on rank %zu of the expert axis and not on "
                                "rank %d: every expert rank marks the same parameters",
                                m->params->info[i].name, mine[i] < 0 ? r : (size_t)shard_comm_rank(expert),
                                mine[i] < 0 ? shard_comm_rank(expert) : (int)r);
                break;
            }
            x->rows[i * R + r] = v < 0 ? 0 : (size_t)v;
        }
    free(mine), free(all);
    if (s < 0) {
        shard__expert_layout_destroy(x);
        return s;
    }
    x->comm = expert, x->ranks = (int)R, x->rank = shard_comm_rank(expert), x->count = count;
    x->split = m->expert_split;
    *out = x;
    return SHARD_OK;
}

static int split_here(const shard__expert_layout *x, size_t i) { return x && i < x->count && x->split[i]; }

void shard__expert_whole_shape(const shard__expert_layout *x, size_t i, size_t *shape) {
    if (!split_here(x, i)) return;
    shape[0] = 0;
    for (int r = 0; r < x->ranks; r++) shape[0] += x->rows[i * (size_t)x->ranks + (size_t)r];
}

size_t shard__expert_offset(const shard__expert_layout *x, size_t i, size_t row_elems) {
    size_t rows = 0;
    for (int r = 0; split_here(x, i) && r < x->rank; r++) rows += x->rows[i * (size_t)x->ranks + (size_t)r];
    return rows * row_elems;
}

shard_status shard__expert_gather(const shard__expert_layout *x, size_t i, float *whole, size_t row_elems) {
    if (!split_here(x, i)) return SHARD_OK;
    size_t R = (size_t)x->ranks, *counts = calloc(R, sizeof *counts), *displs = calloc(R, sizeof *displs), at = 0;
    if (!counts || !displs) {
        free(counts), free(displs);
        return shard_error(SHARD_ERR_NO_MEMORY, "expert axis: out of memory");
    }
    for (size_t r = 0; r < R; r++) counts[r] = x->rows[i * R + r] * row_elems, displs[r] = at, at += counts[r];
    /* in place: this rank's experts already sit at their place in the whole tensor */
    shard_status s =
        shard_comm_all_gatherv(x->comm, whole + displs[x->rank], counts[x->rank], whole, counts, displs, SHARD_F32);
    free(counts), free(displs);
    return s;
}
