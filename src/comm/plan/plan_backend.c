/* plan_backend.c — the plan communicator: rank r of a world of n ranks that
 * are not there.  The analyzer builds one rank of a layout and runs its step
 * over it (a dry run of the engine), so every collective and message the
 * engine issues completes at once without a peer: what arrives from others is
 * left as the buffer held it, what this rank contributes to itself is copied
 * (an all_reduce returns its own input, an all_gather gives every rank's
 * block as this rank's, so checks that the ranks agree find them agreeing),
 * and each call is tallied by communicator name and kind with the bytes the
 * wrapper counts (comm.c's bandwidth-optimal figure) — the traffic the real
 * run would send, without the data it would carry.
 *
 * A plan communicator cannot learn the other ranks' colours, so it splits only
 * when told the group (shard__comm_split_sized: the mesh knows its axes'
 * sizes); a plain shard_comm_split of one is refused. */
#include "comm/plan/plan_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "comm/emulate.h"
#include "core/flops.h"

typedef struct plan_comm {
    shard_comm base;
    shard__plan_tally *tally;
} plan_comm;

static shard__plan_tally *tally_of(shard_comm *comm) { return ((plan_comm *)comm)->tally; }

/* The tally's entry for (this communicator's name, what), made on first use. */
static shard__plan_count *entry(shard_comm *comm, const char *what) {
    shard__plan_tally *t = tally_of(comm);
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->at[i].comm, comm->name) == 0 && strcmp(t->at[i].op, what) == 0) return &t->at[i];
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        shard__plan_count *more = realloc(t->at, cap * sizeof *more);
        if (!more) return NULL;
        t->at = more, t->cap = cap;
    }
    shard__plan_count *e = &t->at[t->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->comm, sizeof e->comm, "%s", comm->name);
    snprintf(e->op, sizeof e->op, "%s", what);
    return e;
}

static void count(shard_comm *comm, const char *what, uint64_t bytes, double alphas, double wire_bytes) {
    shard__plan_count *e = entry(comm, what);
    if (!e) return;
    uint64_t by[SHARD__PHASE_COUNT], flops = 0;
    shard__flops_read(by);
    for (int k = 0; k < SHARD__PHASE_COUNT; k++) flops += by[k];
    if (e->calls && flops == e->burst_flops) /* no compute since its last call: the same burst */
        e->burst_alphas += alphas, e->burst_wire_bytes += wire_bytes;
    else
        e->burst_alphas = alphas, e->burst_wire_bytes = wire_bytes;
    e->burst_flops = flops;
    e->calls++, e->bytes += bytes, e->alphas += alphas, e->wire_bytes += wire_bytes;
    if (e->burst_wire_bytes >= e->largest_wire_bytes)
        e->largest_alphas = e->burst_alphas, e->largest_wire_bytes = e->burst_wire_bytes;
    if (bytes <= SHARD__PLAN_SMALL_BYTES) e->small_alphas += alphas, e->small_wire_bytes += wire_bytes;
}

static void copy_bytes(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static shard_status plan_collective(shard_comm *comm, shard__coll_args *a) {
    size_t es = shard_dtype_size(a->dtype);
    int r = comm->rank;
    double alphas, wire;
    shard__emu_coll_terms(comm->size, r, a, &alphas, &wire);
    count(comm, shard__coll_kind_name(a->kind), shard__coll_bytes_sent(comm, a), alphas, wire);
    char *recv = a->recv;
    const char *send = a->send;
    switch (a->kind) {
    case SHARD__BARRIER:
    case SHARD__BROADCAST: break;
    case SHARD__ALL_REDUCE:
        if (!a->in_place) memcpy(recv, send, a->count * es);
        break;
    case SHARD__ALL_GATHER:
    case SHARD__ALL_GATHERV: /* every rank's block as this rank's (as far as it reaches): what agreement
                              * checks over the ranks (same flags, same sizes) see on a symmetric layout */
        for (int p = 0; p < comm->size; p++) {
            size_t n = a->recv_counts[p] < a->recv_counts[r] ? a->recv_counts[p] : a->recv_counts[r];
            const char *from = a->in_place ? recv + a->recv_displs[r] * es : send;
            if (p != r || !a->in_place) memmove(recv + a->recv_displs[p] * es, from, n * es);
        }
        break;
    case SHARD__REDUCE_SCATTER:
    case SHARD__REDUCE_SCATTERV:
        if (!a->in_place) memcpy(recv, send + a->recv_displs[r] * es, a->recv_counts[r] * es);
        break;
    case SHARD__ALL_TO_ALLW:
        shard__copy_strided(recv + a->recv_displs[r] * es, a->recv_row_len[r], a->recv_stride[r],
                            send + a->send_displs[r] * es, a->send_row_len[r], a->send_stride[r], a->send_counts[r], es,
                            copy_bytes);
        break;
    default: /* all_to_all(v): this rank's block to itself */
        if (!a->in_place)
            memcpy(recv + a->recv_displs[r] * es, send + a->send_displs[r] * es,
                   (a->send_counts[r] < a->recv_counts[r] ? a->send_counts[r] : a->recv_counts[r]) * es);
        break;
    }
    return SHARD_OK;
}

static shard_status plan_isend(shard_comm *comm, const void *buf, size_t bytes, int dst, int tag, uint64_t seq,
                               shard_request *req) {
    (void)buf, (void)tag, (void)seq;
    if (dst != comm->rank) count(comm, "send", bytes, 1, (double)bytes);
    req->status = SHARD_OK;
    atomic_store(&req->done, 1);
    return SHARD_OK;
}

static shard_status plan_irecv(shard_comm *comm, void *buf, size_t bytes, int src, int tag, uint64_t seq,
                               shard_request *req) {
    (void)comm, (void)buf, (void)bytes, (void)src, (void)tag, (void)seq;
    req->status = SHARD_OK;
    atomic_store(&req->done, 1);
    return SHARD_OK;
}

static shard_status plan_request_test(shard_request *req, int *done) {
    (void)req;
    *done = 1;
    return SHARD_OK;
}

static shard_status plan_request_wait(shard_request *req) {
    (void)req;
    return SHARD_OK;
}

static shard_status plan_split(shard_comm *comm, int color, int key, shard_comm **out) {
    (void)color, (void)key, (void)out;
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "a plan communicator ('%s') cannot see the other ranks' colours: split it with the "
                       "group's size and this rank's place in it (shard__comm_split_sized)",
                       comm->name);
}

static void plan_destroy(shard_comm *comm) { free(comm); }

static void plan_abort(shard_comm *comm, shard_status status, const char *reason) {
    (void)comm, (void)status, (void)reason; /* no peer waits on a plan rank */
}

static shard_status plan_split_sized(shard_comm *comm, int color, int key, int size, int rank, shard_comm **out);

static const shard__comm_vtable plan_vtable = {
    .name = "plan",
    .collective = plan_collective,
    .isend = plan_isend,
    .irecv = plan_irecv,
    .request_test = plan_request_test,
    .request_wait = plan_request_wait,
    .split = plan_split,
    .destroy = plan_destroy,
    .abort = plan_abort,
    .split_sized = plan_split_sized,
};

static shard_status make(int size, int rank, const char *name, shard__plan_tally *tally, shard_comm **out) {
    plan_comm *c = calloc(1, sizeof *c);
    if (!c) return shard_error(SHARD_ERR_NO_MEMORY, "plan communicator: out of memory");
    shard__comm_init_header(&c->base, &plan_vtable, rank, size, name, 1e9);
    c->tally = tally;
    *out = &c->base;
    return SHARD_OK;
}

static shard_status plan_split_sized(shard_comm *comm, int color, int key, int size, int rank, shard_comm **out) {
    (void)color, (void)key;
    char name[64];
    snprintf(name, sizeof name, "%s/split", comm->name);
    return make(size, rank, name, tally_of(comm), out);
}

shard_status shard__comm_plan_world(int size, int rank, shard__plan_tally *tally, shard_comm **out) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size || !tally)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan communicator: rank %d of %d (need 0 <= rank < size)", rank,
                           size);
    return make(size, rank, "world", tally, out);
}

int shard__comm_is_plan(const shard_comm *comm) { return comm && comm->vt == &plan_vtable; }

void shard__plan_tally_free(shard__plan_tally *tally) {
    free(tally->at);
    memset(tally, 0, sizeof *tally);
}
