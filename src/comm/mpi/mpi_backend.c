/* mpi_backend.c — ranks as MPI processes (Open MPI or MPICH).
 *
 * Collectives are the MPI library's own (MPI_Allreduce, MPI_Reduce_scatter_block,
 * MPI_Ialltoallv ...) on a duplicate of MPI_COMM_WORLD, so shard's traffic never
 * mixes with the program's.  bf16 and f16 travel as 2-byte contiguous types;
 * their max/min reduce through user-defined MPI ops, their sums, averages and
 * products are reduced here, in f32 in rank order and rounded once, as on the
 * threads backend (half_reduction); f32/f64 max/min through ops that keep NaN.
 * AVG is a SUM divided on completion.
 *
 * Deadlines: MPI cannot be interrupted, so a watchdog thread watches every
 * blocking collective and, past the deadline, prints one line saying what this
 * rank waits for, then ends the process without MPI_Finalize, which makes the
 * launcher end the job.  Non-blocking requests poll with MPI_Test; past the
 * deadline a receive is cancelled and returns SHARD_ERR_TIMEOUT, while a
 * collective or send (which MPI cannot cancel: it may still use the caller's
 * buffers) ends the process the same way.  With SHARD_DEBUG=1 every collective is first
 * compared across ranks (one small MPI_Allgather) and a mismatch fails on
 * every rank naming both sides. */
#define _GNU_SOURCE
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../comm_impl.h"
#include "core/env.h"
#include "shard/memory.h"

typedef struct mcomm {
    shard_comm base;
    MPI_Comm mpi;
    MPI_Comm gather; /* a duplicate for the point-to-point all-gather of non-blocking bf16/f16 reductions */
    void *pack[2];   /* blocking all_to_allw staging (send, recv), kept to avoid faulting in new pages */
    size_t pack_bytes[2];
} mcomm;

typedef struct mreq { /* backend state of a request */
    MPI_Request request;
    int divide_by; /* AVG: divide recv by this on completion (0: no) */
    void *divide_buf;
    size_t divide_count;
    void *staging; /* in-place staging copy, freed on completion */
    void *copy_to; /* reduce_scatter in place: copy staging here on completion */
    size_t copy_bytes;
    int *ints;            /* int count/displacement arrays MPI reads until completion */
    void *recv_staging;   /* all_to_allw: packed received blocks, unpacked on completion */
    void *gather_staging; /* all_gatherv of equal blocks into this rank's own gaps: packed, placed on completion */
    int borrowed;         /* staging and recv_staging belong to the communicator */
    int peer, tag;
    size_t bytes;
    uint64_t seq;
    /* a bf16/f16 reduction reduced here (half_reduction): 1 while the all-to-all of slices is in flight,
     * 2 once they are reduced (and, for a non-blocking all_reduce, while the point-to-point all-gather of
     * the reduced slices is: gather_n requests) */
    int half_phase, half_gather, gather_n;
    void *half_out; /* this rank's reduced slice */
    size_t half_len;
    MPI_Request *gather_reqs;
} mreq;

static const shard__comm_vtable mpi_vtable;

static struct {
    int initialized_here; /* shard called MPI_Init_thread, so it finalizes too */
    int setup_done;       /* types, ops and watchdog exist */
    int thread_level;
    MPI_Datatype half_types[2]; /* bf16, f16 */
    MPI_Op user_ops[4];         /* sum, prod, max, min through shard's arithmetic (pair_op): on the 2-byte
                                   types, and max/min on f32/f64 that keep NaN (MPI_MAX drops it) */
    double exit_timeout;        /* the at-exit barrier's deadline: the longest world timeout */
    int tag_ub;                 /* MPI_TAG_UB: the largest tag (at least 32767) */
    int debug;
    /* watchdog */
    pthread_t watchdog;
    int watchdog_started;
    pthread_mutex_t watch_mu;
    int watch_active;
    double watch_deadline;
    const struct mcomm *watch_comm; /* the watched call: communicator, kind, sequence number */
    shard__coll_kind watch_kind;
    uint64_t watch_seq;
} M = {.watch_mu = PTHREAD_MUTEX_INITIALIZER};

int shard__mpi_built(void) { return 1; }

static shard_status mpi_error(int code, const char *what, const shard_comm *comm) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, text, &len);
    return shard_error(SHARD_ERR_BACKEND, "%s on comm '%s' (MPI): %s", what, comm->name, text);
}

#define MPI_TRY(call, what, comm)                                                                                      \
    do {                                                                                                               \
        int mpi_rc__ = (call);                                                                                         \
        if (mpi_rc__ != MPI_SUCCESS) return mpi_error(mpi_rc__, (what), (comm));                                       \
    } while (0)

/* ------------------------------------------------------------------ dtypes and ops */

/* One user op for the types shard reduces itself: bf16, f16 (2-byte types), f32 and f64 (max/min with NaN). */
static void pair_op(void *in, void *inout, int *len, MPI_Datatype *type, shard_reduce_op op) {
    shard_dtype d = *type == M.half_types[0] ? SHARD_BF16
        : *type == M.half_types[1]           ? SHARD_F16
        : *type == MPI_DOUBLE                ? SHARD_F64
                                             : SHARD_F32;
    shard__reduce_pair(d, op, in, inout, (size_t)*len);
}
static void user_sum(void *in, void *inout, int *len, MPI_Datatype *t) { pair_op(in, inout, len, t, SHARD_OP_SUM); }
static void user_prod(void *in, void *inout, int *len, MPI_Datatype *t) { pair_op(in, inout, len, t, SHARD_OP_PROD); }
static void user_max(void *in, void *inout, int *len, MPI_Datatype *t) { pair_op(in, inout, len, t, SHARD_OP_MAX); }
static void user_min(void *in, void *inout, int *len, MPI_Datatype *t) { pair_op(in, inout, len, t, SHARD_OP_MIN); }

static MPI_Datatype mpi_type(shard_dtype d) {
    switch (d) {
    case SHARD_F32: return MPI_FLOAT;
    case SHARD_F64: return MPI_DOUBLE;
    case SHARD_BF16: return M.half_types[0];
    case SHARD_F16: return M.half_types[1];
    case SHARD_I8: return MPI_INT8_T;
    case SHARD_I32: return MPI_INT32_T;
    case SHARD_I64: return MPI_INT64_T;
    case SHARD_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(shard_dtype d, shard_reduce_op op) {
    int half = d == SHARD_BF16 || d == SHARD_F16, real = d == SHARD_F32 || d == SHARD_F64;
    switch (op) {
    case SHARD_OP_PROD: return half ? M.user_ops[1] : MPI_PROD;
    case SHARD_OP_MAX: return half || real ? M.user_ops[2] : MPI_MAX;
    case SHARD_OP_MIN: return half || real ? M.user_ops[3] : MPI_MIN;
    default: return half ? M.user_ops[0] : MPI_SUM; /* SUM, and AVG = SUM then divide */
    }
}

static shard_status as_int(const shard_comm *comm, const char *what, size_t value, int *out) {
    if (value > INT_MAX)
        return shard_error(SHARD_ERR_UNSUPPORTED,
                           "%s on comm '%s' (MPI): count %zu exceeds MPI's int limit %d; split the transfer", what,
                           comm->name, value, INT_MAX);
    *out = (int)value;
    return SHARD_OK;
}

/* ------------------------------------------------------------------ watchdog */

/* Print one line and end the process.  Leaving without MPI_Finalize makes the
 * launcher (Open MPI's mpirun, MPICH's hydra, srun) end the whole job.
 * MPI_Abort from the watchdog thread is not safe below MPI_THREAD_MULTIPLE,
 * and several ranks calling it at once was seen to wedge Open MPI 4.1's mpirun. */
static _Noreturn void end_process(const char *line) {
    fprintf(stderr, "shard: %s\n", line);
    fflush(stdout);
    fflush(stderr);
    _exit(1);
}

/* The line a watched call prints when its deadline passes.  Built only then:
 * the calling thread is still blocked inside MPI, so the communicator lives. */
static void format_watch_text(char *out, size_t out_bytes) {
    const mcomm *c = M.watch_comm;
    int n = c->base.size, r = c->base.rank;
    int *others = calloc((size_t)n, sizeof *others);
    char list[200] = "?";
    if (others) {
        for (int p = 0; p < n; p++) others[p] = p != r;
        shard__format_rank_list(others, n, list, sizeof list);
        free(others);
    }
    snprintf(out, out_bytes,
             "timeout after %g s in %s #%llu on comm '%s': rank %d of %d waits on ranks %s "
             "(MPI backend: peers' progress is not visible from here)",
             c->base.timeout_seconds, shard__coll_kind_name(M.watch_kind), (unsigned long long)M.watch_seq,
             c->base.name, r, n, list);
}

static void *watchdog_main(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec tick = {0, 200 * 1000 * 1000};
        nanosleep(&tick, NULL);
        pthread_mutex_lock(&M.watch_mu);
        int expired = M.watch_active && shard__now() > M.watch_deadline;
        char text[768];
        if (expired) format_watch_text(text, sizeof text); /* under the lock the call cannot return */
        pthread_mutex_unlock(&M.watch_mu);
        if (!expired) continue;
        end_process(text);
    }
    return NULL;
}

/* Arm the watchdog for one blocking call: a few stores, nothing formatted. */
static void watch_begin(const mcomm *c, const shard__coll_args *a) {
    double deadline = shard__now() + c->base.timeout_seconds;
    pthread_mutex_lock(&M.watch_mu);
    M.watch_comm = c;
    M.watch_kind = a->kind;
    M.watch_seq = a->seq;
    M.watch_deadline = deadline;
    M.watch_active = 1;
    pthread_mutex_unlock(&M.watch_mu);
}

static void watch_end(void) {
    pthread_mutex_lock(&M.watch_mu);
    M.watch_active = 0;
    pthread_mutex_unlock(&M.watch_mu);
}

/* ------------------------------------------------------------------ debug agreement check */

typedef struct fingerprint {
    int32_t kind, dtype, op, root;
    uint64_t count, counts_hash;
} fingerprint;

static uint64_t hash_counts(const size_t *counts, int n) {
    uint64_t h = 1469598103934665603ULL;
    for (int p = 0; p < n; p++) h = (h ^ (uint64_t)counts[p]) * 1099511628211ULL;
    return h;
}

static shard_status check_agreement(mcomm *c, const shard__coll_args *a) {
    int n = c->base.size;
    int v_form = a->kind == SHARD__ALL_GATHERV || a->kind == SHARD__REDUCE_SCATTERV || a->kind == SHARD__ALL_TO_ALLV ||
        a->kind == SHARD__ALL_TO_ALLW;
    fingerprint mine = {
        a->kind,
        a->dtype,
        a->op,
        a->root,
        v_form ? 0 : a->count,
        (a->kind == SHARD__ALL_GATHERV || a->kind == SHARD__REDUCE_SCATTERV) ? hash_counts(a->recv_counts, n) : 0};
    if (a->kind == SHARD__BARRIER) mine.dtype = mine.op = mine.root = 0, mine.count = 0;
    if (a->kind != SHARD__BROADCAST) mine.root = 0;
    if (a->kind != SHARD__ALL_REDUCE && a->kind != SHARD__REDUCE_SCATTER && a->kind != SHARD__REDUCE_SCATTERV)
        mine.op = 0;
    fingerprint *all = malloc(sizeof *all * (size_t)n);
    if (!all) return shard_error(SHARD_ERR_NO_MEMORY, "out of memory checking a collective");
    int rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, c->mpi);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_error(rc, "agreement check", &c->base);
    }
    shard_status s = SHARD_OK;
    for (int p = 1; p < n && s == SHARD_OK; p++) {
        if (memcmp(&all[0], &all[p], sizeof mine) == 0) continue;
        shard__coll_args a0 = {
            .kind = all[0].kind, .dtype = all[0].dtype, .op = all[0].op, .root = all[0].root, .count = all[0].count};
        shard__coll_args ap = {
            .kind = all[p].kind, .dtype = all[p].dtype, .op = all[p].op, .root = all[p].root, .count = all[p].count};
        char d0[160], dp[160];
        shard__describe_coll(&a0, &ap, d0, sizeof d0);
        shard__describe_coll(&ap, &a0, dp, sizeof dp);
        if (strcmp(d0, dp) == 0) snprintf(dp + strlen(dp), sizeof dp - strlen(dp), " with other counts");
        s = shard_error(SHARD_ERR_MISMATCH, "collective mismatch at #%llu on '%s': rank 0 %s, rank %d %s",
                        (unsigned long long)a->seq, c->base.name, d0, p, dp);
    }
    free(all);
    if (s == SHARD_OK && (a->kind == SHARD__ALL_TO_ALLV || a->kind == SHARD__ALL_TO_ALLW)) {
        uint64_t *sends = malloc(sizeof *sends * (size_t)n * (size_t)n);
        uint64_t *expects = malloc(sizeof *expects * (size_t)n * (size_t)n);
        uint64_t *row = malloc(sizeof *row * 2 * (size_t)n);
        if (!sends || !expects || !row) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "out of memory checking a collective");
        } else {
            for (int q = 0; q < n; q++) row[q] = a->send_counts[q], row[n + q] = a->recv_counts[q];
            uint64_t *both = malloc(sizeof *both * 2 * (size_t)n * (size_t)n);
            if (!both || MPI_Allgather(row, 2 * n, MPI_UINT64_T, both, 2 * n, MPI_UINT64_T, c->mpi) != MPI_SUCCESS) {
                s = shard_error(SHARD_ERR_BACKEND, "%s agreement check failed on comm '%s'",
                                shard__coll_kind_name(a->kind), c->base.name);
            } else {
                for (int p = 0; p < n && s == SHARD_OK; p++)
                    for (int q = 0; q < n && s == SHARD_OK; q++)
                        if (both[(size_t)p * 2 * n + q] != both[(size_t)q * 2 * n + n + p])
                            s = shard_error(SHARD_ERR_MISMATCH,
                                            "collective mismatch at #%llu on '%s': %s rank %d sends %llu elements to "
                                            "rank %d, which expects %llu",
                                            (unsigned long long)a->seq, c->base.name, shard__coll_kind_name(a->kind), p,
                                            (unsigned long long)both[(size_t)p * 2 * n + q], q,
                                            (unsigned long long)both[(size_t)q * 2 * n + n + p]);
            }
            free(both);
        }
        free(sends);
        free(expects);
        free(row);
    }
    return s;
}

/* ------------------------------------------------------------------ collectives */

static void plain_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

/* all_to_allw.  Open MPI's derived-type engine moves strided blocks several
 * times slower than packing them here, so blocks that are not single runs are
 * packed into staging and sent with MPI_Alltoallv; received ones land in
 * staging and are unpacked on completion. */
static int blocks_contiguous(const size_t *counts, const size_t *row_len, const size_t *stride, int n) {
    for (int p = 0; p < n; p++)
        if (counts[p] && row_len[p] != counts[p] && stride[p] != row_len[p]) return 0;
    return 1;
}

/* An all_gatherv of n equal blocks received packed: each to its displacement in recv. */
static void place_gathered(const shard__coll_args *a, const char *staging, int n) {
    size_t es = shard_dtype_size(a->dtype), block = a->recv_counts[0] * es;
    for (int p = 0; p < n; p++) memcpy((char *)a->recv + a->recv_displs[p] * es, staging + (size_t)p * block, block);
}

static void unpack_blocks(const shard__coll_args *a, const char *staging, int n, int self) {
    size_t es = shard_dtype_size(a->dtype), at = 0;
    for (int p = 0; p < n; p++) {
        size_t count = p == self ? 0 : a->recv_counts[p]; /* this rank's own block was copied directly */
        shard__copy_strided((char *)a->recv + a->recv_displs[p] * es, a->recv_row_len[p], a->recv_stride[p],
                            staging + at * es, count, count, count, es, plain_copy);
        at += count;
    }
}

/* Staging for an all_to_allw: the communicator's kept buffers for a blocking
 * call, a fresh one for a request (freed with it). */
static void *pack_buffer(mcomm *c, mreq *s, int side, size_t bytes) {
    if (!s->borrowed) return shard_alloc(bytes ? bytes : 1, SHARD_MEM_COMM);
    if (c->pack_bytes[side] < bytes || !c->pack[side]) {
        shard_free(c->pack[side]);
        c->pack[side] = shard_alloc(bytes ? bytes : 1, SHARD_MEM_COMM);
        c->pack_bytes[side] = c->pack[side] ? bytes : 0;
    }
    return c->pack[side];
}

/* Counts, displacements and staging for an all_to_allw; *send / *recv point
 * at what MPI should read and write.  This rank's own block is copied here
 * directly (MPI is given 0 elements for it); blocks to pack are packed row by
 * row across all of them, so that blocks cut from the same rows read memory
 * in order. */
static shard_status prepare_blocks(mcomm *c, const shard__coll_args *a, mreq *s, const void **send, void **recv) {
    int n = c->base.size, r = c->base.rank;
    size_t es = shard_dtype_size(a->dtype), stot = 0, rtot = 0, max_rows = 0;
    int pack_send = !blocks_contiguous(a->send_counts, a->send_row_len, a->send_stride, n);
    int pack_recv = !blocks_contiguous(a->recv_counts, a->recv_row_len, a->recv_stride, n);
    s->ints = malloc(sizeof(int) * 4 * (size_t)n);
    if (!s->ints) return shard_error(SHARD_ERR_NO_MEMORY, "all_to_allw: out of memory");
    shard__copy_strided((char *)a->recv + a->recv_displs[r] * es, a->recv_row_len[r], a->recv_stride[r],
                        (const char *)a->send + a->send_displs[r] * es, a->send_row_len[r], a->send_stride[r],
                        a->send_counts[r], es, plain_copy);
    for (int p = 0; p < n; p++) {
        size_t sc = p == r ? 0 : a->send_counts[p], rc = p == r ? 0 : a->recv_counts[p];
        SHARD_CHECK(as_int(&c->base, "all_to_allw", sc, &s->ints[p]));
        SHARD_CHECK(as_int(&c->base, "all_to_allw", pack_send ? stot : a->send_displs[p], &s->ints[n + p]));
        SHARD_CHECK(as_int(&c->base, "all_to_allw", rc, &s->ints[2 * n + p]));
        SHARD_CHECK(as_int(&c->base, "all_to_allw", pack_recv ? rtot : a->recv_displs[p], &s->ints[3 * n + p]));
        stot += sc, rtot += rc;
        if (sc && sc / a->send_row_len[p] > max_rows) max_rows = sc / a->send_row_len[p];
    }
    if (pack_send) {
        char *packed = pack_buffer(c, s, 0, stot * es);
        s->staging = packed;
        if (!packed) return shard_error(SHARD_ERR_NO_MEMORY, "all_to_allw: out of memory packing %zu elements", stot);
        for (size_t i = 0; i < max_rows; i++)
            for (int p = 0; p < n; p++) {
                size_t len = a->send_row_len[p];
                if (s->ints[p] && i < a->send_counts[p] / len)
                    memcpy(packed + ((size_t)s->ints[n + p] + i * len) * es,
                           (const char *)a->send + (a->send_displs[p] + i * a->send_stride[p]) * es, len * es);
            }
        *send = packed;
    }
    if (pack_recv) {
        s->recv_staging = pack_buffer(c, s, 1, rtot * es);
        if (!s->recv_staging)
            return shard_error(SHARD_ERR_NO_MEMORY, "all_to_allw: out of memory for %zu elements", rtot);
        *recv = s->recv_staging;
    }
    return SHARD_OK;
}

/* One rank: do the local copy the collective amounts to (some MPI builds
 * mishandle size-1 communicators with displacements, and it saves a call). */
static void single_rank_copy(const shard__coll_args *a) {
    size_t es = shard_dtype_size(a->dtype);
    const char *src = a->send;
    char *dst = a->recv;
    size_t bytes = 0;
    switch (a->kind) {
    case SHARD__ALL_REDUCE: bytes = a->count * es; break;
    case SHARD__REDUCE_SCATTER:
    case SHARD__REDUCE_SCATTERV: bytes = a->recv_counts[0] * es, src += a->recv_displs[0] * es; break;
    case SHARD__ALL_GATHER:
    case SHARD__ALL_GATHERV: bytes = a->recv_counts[0] * es, dst += a->recv_displs[0] * es; break;
    case SHARD__ALL_TO_ALL:
    case SHARD__ALL_TO_ALLV:
        bytes = a->recv_counts[0] * es, src += a->send_displs[0] * es, dst += a->recv_displs[0] * es;
        break;
    case SHARD__ALL_TO_ALLW:
        shard__copy_strided(dst + a->recv_displs[0] * es, a->recv_row_len[0], a->recv_stride[0],
                            src + a->send_displs[0] * es, a->send_row_len[0], a->send_stride[0], a->recv_counts[0], es,
                            plain_copy);
        return;
    default: return; /* barrier, broadcast: nothing moves */
    }
    if (bytes && src != dst) memmove(dst, src, bytes); /* in place may still move (all_to_allv displacements) */
}

/* bf16/f16 sums, products and averages are reduced as the threads backend reduces them: each rank
 * adds its slice of every rank's input in f32, in rank order, and rounds once (shard__reduce_many), so the
 * two backends give the same bits.  MPI's own reduction would combine two operands at a time through the
 * user op and round every partial sum.  The bytes on the wire are a reduce-scatter's and an all-gather's,
 * in bf16/f16: an all-to-all of the slices, the reduction here, then (all_reduce) an in-place all-gather. */
static int half_reduction(const shard__coll_args *a) {
    return (a->dtype == SHARD_BF16 || a->dtype == SHARD_F16) &&
        (a->op == SHARD_OP_SUM || a->op == SHARD_OP_AVG || a->op == SHARD_OP_PROD) &&
        (a->kind == SHARD__ALL_REDUCE || a->kind == SHARD__REDUCE_SCATTER || a->kind == SHARD__REDUCE_SCATTERV);
}

/* The reduction of the received slices (half_len elements from each rank, in rank order) into this rank's
 * output. */
static shard_status half_reduce_received(const shard__coll_args *a, mreq *s, int n) {
    enum { ON_STACK = 64 };
    const void *on_stack[ON_STACK], **list = n <= ON_STACK ? on_stack : malloc((size_t)n * sizeof *list);
    if (!list) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", shard__coll_kind_name(a->kind));
    size_t es = shard_dtype_size(a->dtype);
    for (int q = 0; q < n; q++) list[q] = (const char *)s->staging + (size_t)q * s->half_len * es;
    shard__reduce_many(a->dtype, a->op, list, n, s->half_out, s->half_len);
    if (list != on_stack) free(list);
    s->half_phase = 2;
    return SHARD_OK;
}

/* The reduced slices made whole on every rank (all_reduce).  Blocking: MPI_Allgatherv in place.  A
 * request: each rank sends its slice to every other one and receives theirs, point to point on the
 * communicator's `gather` duplicate, tagged by the collective's sequence number.  This phase starts
 * in whichever test or wait first sees the all-to-all done, a moment that differs between ranks, so it
 * must not be a collective: MPI needs collectives in the same order on every rank, and another
 * collective issued meanwhile would be ordered differently on different ranks. */
static shard_status half_gather(mcomm *c, const shard__coll_args *a, mreq *s, int nonblocking) {
    int n = c->base.size, r = c->base.rank, rc = MPI_SUCCESS;
    MPI_Datatype t = mpi_type(a->dtype);
    if (!nonblocking) {
        rc = MPI_Allgatherv(MPI_IN_PLACE, 0, t, a->recv, s->ints, s->ints + n, t, c->mpi);
        return rc == MPI_SUCCESS ? SHARD_OK : mpi_error(rc, shard__coll_kind_name(a->kind), &c->base);
    }
    s->gather_reqs = malloc(sizeof(MPI_Request) * 2 * (size_t)n);
    if (!s->gather_reqs) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", shard__coll_kind_name(a->kind));
    size_t es = shard_dtype_size(a->dtype);
    /* equal on every rank (collectives are numbered alike); it repeats only after MPI_TAG_UB + 1 collectives
     * (32768 at least), so a request left unwaited across that many later ones could meet its twin's tag */
    int tag = (int)(a->seq % ((uint64_t)M.tag_ub + 1));
    s->gather_n = 0;
    for (int p = 0; p < n && rc == MPI_SUCCESS; p++)
        if (p != r)
            rc = MPI_Irecv((char *)a->recv + (size_t)s->ints[n + p] * es, s->ints[p], t, p, tag, c->gather,
                           &s->gather_reqs[s->gather_n++]);
    for (int p = 0; p < n && rc == MPI_SUCCESS; p++)
        if (p != r) rc = MPI_Isend(s->half_out, s->ints[r], t, p, tag, c->gather, &s->gather_reqs[s->gather_n++]);
    s->half_phase = 3;
    return rc == MPI_SUCCESS ? SHARD_OK : mpi_error(rc, shard__coll_kind_name(a->kind), &c->base);
}

/* Start (rq) or run (rq == NULL, under the watchdog) a half_reduction collective; s holds its state. */
static shard_status half_issue(mcomm *c, const shard__coll_args *a, mreq *s, MPI_Request *rq) {
    const char *what = shard__coll_kind_name(a->kind);
    int n = c->base.size, r = c->base.rank;
    size_t es = shard_dtype_size(a->dtype), mine = 0;
    MPI_Datatype t = mpi_type(a->dtype);
    /* [send counts | send displs | recv counts | recv displs]; the all-gather reuses the send half */
    s->ints = malloc(sizeof(int) * 4 * (size_t)n);
    if (!s->ints) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", what);
    for (int p = 0; p < n; p++) {
        size_t off, len;
        if (a->kind == SHARD__ALL_REDUCE)
            shard__split_range(a->count, n, p, &off, &len);
        else
            off = a->recv_displs[p], len = a->recv_counts[p];
        if (p == r) mine = len, s->half_out = (char *)a->recv + (a->kind == SHARD__ALL_REDUCE ? off * es : 0);
        SHARD_CHECK(as_int(&c->base, what, len, &s->ints[p]));
        SHARD_CHECK(as_int(&c->base, what, off, &s->ints[n + p]));
    }
    s->half_len = mine;
    for (int q = 0; q < n; q++) {
        SHARD_CHECK(as_int(&c->base, what, mine, &s->ints[2 * n + q]));
        SHARD_CHECK(as_int(&c->base, what, (size_t)q * mine, &s->ints[3 * n + q]));
    }
    s->staging = shard_alloc((size_t)n * mine * es + 1, SHARD_MEM_COMM);
    if (!s->staging)
        return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory staging %zu bytes", what, (size_t)n * mine * es);
    s->half_gather = a->kind == SHARD__ALL_REDUCE;
    int *ic = s->ints, rc;
    if (rq) { /* the request's test moves it on (mpi_request_test) */
        s->half_phase = 1;
        rc = MPI_Ialltoallv(a->send, ic, ic + n, t, s->staging, ic + 2 * n, ic + 3 * n, t, c->mpi, rq);
        return rc == MPI_SUCCESS ? SHARD_OK : mpi_error(rc, what, &c->base);
    }
    rc = MPI_Alltoallv(a->send, ic, ic + n, t, s->staging, ic + 2 * n, ic + 3 * n, t, c->mpi);
    if (rc != MPI_SUCCESS) return mpi_error(rc, what, &c->base);
    SHARD_CHECK(half_reduce_received(a, s, n));
    return s->half_gather ? half_gather(c, a, s, 0) : SHARD_OK;
}

/* Issue one collective: blocking when req == NULL, else non-blocking with state in req. */
static shard_status issue(mcomm *c, shard__coll_args *a, shard_request *req) {
    const char *what = shard__coll_kind_name(a->kind);
    int n = c->base.size, r = c->base.rank;
    size_t es = shard_dtype_size(a->dtype);
    MPI_Datatype t = mpi_type(a->dtype);
    MPI_Op op = mpi_op(a->dtype, a->op);
    mreq *st = NULL;
    if (M.debug) {
        watch_begin(c, a);
        shard_status agreed = check_agreement(c, a);
        watch_end();
        SHARD_CHECK(agreed);
    }
    if (req) {
        st = calloc(1, sizeof *st);
        if (!st) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory for a request", what);
        st->request = MPI_REQUEST_NULL;
        req->impl = st; /* released by mpi_request_release, whatever happens below */
    }
    if (n == 1) {
        single_rank_copy(a);
        return SHARD_OK;
    }
    mreq local = {.request = MPI_REQUEST_NULL};
    mreq *s = st ? st : &local;
    shard_status status = SHARD_OK;
    if (half_reduction(a)) { /* a request's state is released with the request */
        if (!req) watch_begin(c, a);
        status = half_issue(c, a, s, st ? &st->request : NULL);
        if (!req) {
            watch_end();
            shard_free(s->staging);
            free(s->ints);
        }
        return status;
    }
    /* int copies of counts and displacements: [send_counts | send_displs | recv_counts | recv_displs] */
    int need_ints = a->kind == SHARD__ALL_GATHERV || a->kind == SHARD__REDUCE_SCATTERV || a->kind == SHARD__ALL_TO_ALLV;
    if (need_ints) {
        s->ints = malloc(sizeof(int) * 4 * (size_t)n);
        if (!s->ints) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", what);
        for (int p = 0; p < n; p++) {
            SHARD_CHECK_GOTO(as_int(&c->base, what, a->send_counts[p], &s->ints[p]), status, fail);
            SHARD_CHECK_GOTO(as_int(&c->base, what, a->send_displs[p], &s->ints[n + p]), status, fail);
            SHARD_CHECK_GOTO(as_int(&c->base, what, a->recv_counts[p], &s->ints[2 * n + p]), status, fail);
            SHARD_CHECK_GOTO(as_int(&c->base, what, a->recv_displs[p], &s->ints[3 * n + p]), status, fail);
        }
    }
    int count = 0;
    SHARD_CHECK_GOTO(as_int(&c->base, what, a->count, &count), status, fail);
    const void *send = a->send;
    void *recv = a->recv;
    if (a->op == SHARD_OP_AVG &&
        (a->kind == SHARD__ALL_REDUCE || a->kind == SHARD__REDUCE_SCATTER || a->kind == SHARD__REDUCE_SCATTERV)) {
        s->divide_by = n;
        s->divide_buf = recv;
        s->divide_count = a->kind == SHARD__ALL_REDUCE ? a->count : a->recv_counts[r];
    }
    /* in-place forms MPI spells differently: stage */
    if (a->in_place && (a->kind == SHARD__REDUCE_SCATTER || a->kind == SHARD__REDUCE_SCATTERV)) {
        s->copy_bytes = a->recv_counts[r] * es;
        s->staging = shard_alloc(s->copy_bytes, SHARD_MEM_COMM);
        if (!s->staging) {
            status = SHARD_ERR_NO_MEMORY;
            goto fail;
        }
        s->copy_to = recv;
        recv = s->staging;
    }
    if (a->in_place && (a->kind == SHARD__ALL_TO_ALL || a->kind == SHARD__ALL_TO_ALLV)) {
        size_t extent = 0;
        for (int p = 0; p < n; p++)
            if (a->send_displs[p] + a->send_counts[p] > extent) extent = a->send_displs[p] + a->send_counts[p];
        s->staging = shard_alloc(extent * es + 1, SHARD_MEM_COMM); /* + 1: a distinct buffer even for nothing */
        if (!s->staging) {
            status = SHARD_ERR_NO_MEMORY;
            goto fail;
        }
        if (extent) memcpy(s->staging, a->send, extent * es);
        send = s->staging;
    }
    if (a->kind == SHARD__ALL_TO_ALLW) {
        s->borrowed = req == NULL;
        SHARD_CHECK_GOTO(prepare_blocks(c, a, s, &send, &recv), status, fail);
    }
    if (a->in_place && a->kind == SHARD__ALL_REDUCE) send = MPI_IN_PLACE;
    if (a->in_place && (a->kind == SHARD__ALL_GATHER || a->kind == SHARD__ALL_GATHERV)) send = MPI_IN_PLACE;
    int *ic = s->ints;
    MPI_Request *rq = st ? &st->request : NULL;
    int rc;
    /* v-forms whose blocks are all equal use the fixed-size MPI call, which MPI implements with better
     * algorithms.  The choice rests on the counts alone, which every rank shares; displacements are each
     * rank's own (an all_gatherv into gaps receives packed into staging and places the blocks after). */
    shard__coll_kind kind = a->kind;
    if (kind == SHARD__ALL_GATHERV || kind == SHARD__REDUCE_SCATTERV) {
        int equal = 1, packed = 1;
        for (int p = 0; p < n; p++) {
            equal &= a->recv_counts[p] == a->recv_counts[0];
            packed &= a->recv_displs[p] == (size_t)p * a->recv_counts[0];
        }
        if (equal) kind = kind == SHARD__ALL_GATHERV ? SHARD__ALL_GATHER : SHARD__REDUCE_SCATTER;
        if (equal && !packed && a->kind == SHARD__ALL_GATHERV) {
            s->gather_staging = shard_alloc((size_t)n * a->recv_counts[0] * es + 1, SHARD_MEM_COMM);
            if (!s->gather_staging) {
                status = SHARD_ERR_NO_MEMORY;
                goto fail;
            }
            send = a->send; /* in place too: this rank's block, read where it lies */
            recv = s->gather_staging;
        }
    }
    if (!req) watch_begin(c, a);
    switch (kind) {
    case SHARD__BARRIER: rc = rq ? MPI_Ibarrier(c->mpi, rq) : MPI_Barrier(c->mpi); break;
    case SHARD__BROADCAST:
        rc = rq ? MPI_Ibcast(recv, count, t, a->root, c->mpi, rq) : MPI_Bcast(recv, count, t, a->root, c->mpi);
        break;
    case SHARD__ALL_REDUCE:
        rc =
            rq ? MPI_Iallreduce(send, recv, count, t, op, c->mpi, rq) : MPI_Allreduce(send, recv, count, t, op, c->mpi);
        break;
    case SHARD__REDUCE_SCATTER:
        rc = rq ? MPI_Ireduce_scatter_block(send, recv, count, t, op, c->mpi, rq)
                : MPI_Reduce_scatter_block(send, recv, count, t, op, c->mpi);
        break;
    case SHARD__REDUCE_SCATTERV:
        rc = rq ? MPI_Ireduce_scatter(send, recv, ic + 2 * n, t, op, c->mpi, rq)
                : MPI_Reduce_scatter(send, recv, ic + 2 * n, t, op, c->mpi);
        break;
    case SHARD__ALL_GATHER:
        rc = rq ? MPI_Iallgather(send, count, t, recv, count, t, c->mpi, rq)
                : MPI_Allgather(send, count, t, recv, count, t, c->mpi);
        break;
    case SHARD__ALL_GATHERV:
        rc = rq ? MPI_Iallgatherv(send, count, t, recv, ic + 2 * n, ic + 3 * n, t, c->mpi, rq)
                : MPI_Allgatherv(send, count, t, recv, ic + 2 * n, ic + 3 * n, t, c->mpi);
        break;
    case SHARD__ALL_TO_ALL:
        rc = rq ? MPI_Ialltoall(send, count, t, recv, count, t, c->mpi, rq)
                : MPI_Alltoall(send, count, t, recv, count, t, c->mpi);
        break;
    case SHARD__ALL_TO_ALLV:
        rc = rq ? MPI_Ialltoallv(send, ic, ic + n, t, recv, ic + 2 * n, ic + 3 * n, t, c->mpi, rq)
                : MPI_Alltoallv(send, ic, ic + n, t, recv, ic + 2 * n, ic + 3 * n, t, c->mpi);
        break;
    case SHARD__ALL_TO_ALLW:
        rc = rq ? MPI_Ialltoallv(send, ic, ic + n, t, recv, ic + 2 * n, ic + 3 * n, t, c->mpi, rq)
                : MPI_Alltoallv(send, ic, ic + n, t, recv, ic + 2 * n, ic + 3 * n, t, c->mpi);
        break;
    default: rc = MPI_ERR_OTHER;
    }
    if (!req) watch_end();
    if (rc != MPI_SUCCESS) {
        status = mpi_error(rc, what, &c->base);
        goto fail;
    }
    if (!req) { /* blocking: finish now */
        if (s->copy_to) memcpy(s->copy_to, s->staging, s->copy_bytes);
        if (s->divide_by) shard__divide(a->dtype, s->divide_buf, s->divide_count, s->divide_by);
        if (s->recv_staging) unpack_blocks(a, s->recv_staging, n, r);
        if (s->gather_staging) place_gathered(a, s->gather_staging, n);
    }
fail:
    if (!req) { /* a request's state is released with the request */
        if (!s->borrowed) shard_free(s->staging), shard_free(s->recv_staging);
        shard_free(s->gather_staging);
        free(s->ints);
    }
    return status;
}

static shard_status mpi_collective(shard_comm *comm, shard__coll_args *args) {
    return issue((mcomm *)comm, args, NULL);
}

static shard_status mpi_icollective(shard_comm *comm, shard__coll_args *args, shard_request *req) {
    return issue((mcomm *)comm, args, req);
}

/* ------------------------------------------------------------------ point to point and requests */

static shard_status post_p2p(shard_comm *comm, int is_send, void *buf, size_t bytes, int peer, int tag, uint64_t seq,
                             shard_request *req) {
    const char *what = is_send ? "send" : "recv";
    int n = 0;
    SHARD_CHECK(as_int(comm, what, bytes, &n));
    mreq *st = calloc(1, sizeof *st);
    if (!st) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", what);
    st->request = MPI_REQUEST_NULL;
    req->impl = st;
    st->peer = peer, st->tag = tag, st->bytes = bytes, st->seq = seq;
    MPI_Comm mpi = ((mcomm *)comm)->mpi;
    MPI_TRY(is_send ? MPI_Isend(buf, n, MPI_BYTE, peer, tag, mpi, &st->request)
                    : MPI_Irecv(buf, n, MPI_BYTE, peer, tag, mpi, &st->request),
            what, comm);
    return SHARD_OK;
}

static shard_status mpi_isend(shard_comm *comm, const void *buf, size_t bytes, int dst, int tag, uint64_t seq,
                              shard_request *req) {
    return post_p2p(comm, 1, (void *)(uintptr_t)buf, bytes, dst, tag, seq, req);
}

static shard_status mpi_irecv(shard_comm *comm, void *buf, size_t bytes, int src, int tag, uint64_t seq,
                              shard_request *req) {
    return post_p2p(comm, 0, buf, bytes, src, tag, seq, req);
}

static shard_status finish_request(shard_request *req, MPI_Status *status) {
    mreq *st = req->impl;
    shard_status s = SHARD_OK;
    if (req->kind == SHARD__REQ_RECV) {
        int got = 0;
        MPI_Get_count(status, MPI_BYTE, &got);
        if ((size_t)got != st->bytes)
            s = shard_error(
                SHARD_ERR_MISMATCH,
                "message size mismatch on comm '%s': recv #%llu from rank %d (tag %d) expected %zu bytes, got %d",
                req->comm->name, (unsigned long long)st->seq, st->peer, st->tag, st->bytes, got);
    }
    if (st->copy_to) memcpy(st->copy_to, st->staging, st->copy_bytes);
    if (st->divide_by) shard__divide(req->coll.dtype, st->divide_buf, st->divide_count, st->divide_by);
    if (st->recv_staging && req->kind == SHARD__REQ_COLL)
        unpack_blocks(&req->coll, st->recv_staging, req->comm->size, req->comm->rank);
    if (st->gather_staging) place_gathered(&req->coll, st->gather_staging, req->comm->size);
    req->status = s;
    if (s < 0) snprintf(req->error, sizeof req->error, "%s", shard_last_error());
    atomic_store(&req->done, 1);
    return s;
}

static shard_status mpi_request_test(shard_request *req, int *done) {
    mreq *st = req->impl;
    MPI_Status status;
    int flag = 0;
    int rc = MPI_Test(&st->request, &flag, &status);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "request test", req->comm);
    if (flag && st->half_phase == 1) { /* a bf16/f16 reduction's slices are in: reduce, then gather them */
        SHARD_CHECK(half_reduce_received(&req->coll, st, req->comm->size));
        if (st->half_gather) {
            SHARD_CHECK(half_gather((mcomm *)req->comm, &req->coll, st, 1));
            flag = 0;
        }
    }
    if (st->half_phase == 3) { /* the gather's sends and receives (each tested: a completed one is NULL) */
        flag = 1;
        for (int i = 0; i < st->gather_n; i++) {
            int one = 1;
            rc = MPI_Test(&st->gather_reqs[i], &one, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_error(rc, "request test", req->comm);
            flag &= one;
        }
    }
    *done = flag;
    if (flag) finish_request(req, &status);
    return SHARD_OK;
}

static shard_status mpi_request_wait(shard_request *req) {
    mreq *st = req->impl;
    double timeout = req->comm->timeout_seconds, deadline = shard__now() + timeout;
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        SHARD_CHECK(mpi_request_test(req, &done));
        if (done) return SHARD_OK;
        if (spins > 1000) sched_yield(); /* let oversubscribed peers run */
        if ((spins & 255) == 0 && shard__now() > deadline) break;
    }
    /* A receive can be cancelled (mpi_request_release): the caller gets the error.  A started
     * collective or send cannot, and MPI may still read or write the caller's buffers after this
     * returns, so the process ends here, as a blocking call's watchdog ends it. */
    char line[512];
    if (req->kind == SHARD__REQ_COLL) {
        snprintf(line, sizeof line,
                 "timeout after %g s in %s #%llu on comm '%s': rank %d of %d is still waiting (MPI backend: peers' "
                 "progress is not visible from here; MPI cannot cancel a started collective, so the process ends)",
                 timeout, shard__coll_kind_name(req->coll.kind), (unsigned long long)req->coll.seq, req->comm->name,
                 req->comm->rank, req->comm->size);
        end_process(line);
    }
    int is_send = req->kind == SHARD__REQ_SEND;
    snprintf(line, sizeof line,
             "timeout after %g s in %s #%llu on comm '%s': rank %d waits on rank %d (tag %d, %zu bytes)", timeout,
             is_send ? "send" : "recv", (unsigned long long)st->seq, req->comm->name, req->comm->rank, st->peer,
             st->tag, st->bytes);
    if (is_send) end_process(line);
    return shard_error(SHARD_ERR_TIMEOUT, "%s", line);
}

static void mpi_request_release(shard_request *req) {
    mreq *st = req->impl;
    if (!st) return;
    if (!atomic_load(&req->done) && st->half_phase == 3) return; /* sends in flight: as a collective's, below */
    if (!atomic_load(&req->done) && st->request != MPI_REQUEST_NULL) {
        /* Abandoned after an error (a timed-out wait of a send or collective ended the process).
         * A receive can be cancelled; a send or collective cannot, and MPI may still read or write
         * its buffers, so its state is deliberately left allocated (the job is failing anyway). */
        if (req->kind != SHARD__REQ_RECV) return;
        MPI_Cancel(&st->request);
        /* a receive already matched to a stalled large send may not cancel: past a deadline MPI could
         * still write into the caller's buffer after this returns, so the process ends */
        double deadline = shard__now() + req->comm->timeout_seconds;
        int done = 0;
        while (!done && MPI_Test(&st->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done)
            if (shard__now() > deadline) {
                char line[256];
                snprintf(line, sizeof line,
                         "a receive from rank %d (tag %d, %zu bytes) on comm '%s' could not be "
                         "cancelled within %g s; the process ends",
                         st->peer, st->tag, st->bytes, req->comm->name, req->comm->timeout_seconds);
                end_process(line);
            }
    }
    if (!st->borrowed) shard_free(st->staging), shard_free(st->recv_staging);
    shard_free(st->gather_staging);
    free(st->ints);
    free(st->gather_reqs);
    free(st);
    req->impl = NULL;
}

/* ------------------------------------------------------------------ communicators */

/* A communicator over `mpi` (taken over: freed on failure too).  Collective over its members: the
 * duplicate for the non-blocking bf16/f16 all-gathers is made first, before anything that could fail on
 * one rank alone, and under the watchdog. */
static shard_status mcomm_wrap(MPI_Comm mpi, const char *name, double timeout, mcomm **out) {
    *out = NULL;
    int rank = 0, size = 1;
    MPI_Comm_rank(mpi, &rank);
    MPI_Comm_size(mpi, &size);
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    mcomm probe = {.mpi = mpi};
    shard__comm_init_header(&probe.base, &mpi_vtable, rank, size, name, timeout);
    shard__coll_args as_barrier = {.kind = SHARD__BARRIER};
    MPI_Comm gather = MPI_COMM_NULL;
    watch_begin(&probe, &as_barrier);
    int rc = MPI_Comm_dup(mpi, &gather);
    watch_end();
    mcomm *c = rc == MPI_SUCCESS ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        shard_status s = rc != MPI_SUCCESS ? mpi_error(rc, "duplicating a communicator", &probe.base)
                                           : shard_error(SHARD_ERR_NO_MEMORY, "comm '%s': out of memory", name);
        if (gather != MPI_COMM_NULL) MPI_Comm_free(&gather);
        MPI_Comm_free(&mpi);
        return s;
    }
    shard__comm_init_header(&c->base, &mpi_vtable, rank, size, name, timeout);
    c->mpi = mpi, c->gather = gather;
    MPI_Comm_set_errhandler(c->gather, MPI_ERRORS_RETURN);
    *out = c;
    return SHARD_OK;
}

static shard_status mpi_split(shard_comm *comm, int color, int key, shard_comm **out) {
    mcomm *c = (mcomm *)comm;
    MPI_Comm sub = MPI_COMM_NULL;
    shard__coll_args as_barrier = {.kind = SHARD__BARRIER, .seq = ++comm->coll_seq};
    watch_begin(c, &as_barrier); /* reported as the collective it is: a barrier-like split */
    int rc = MPI_Comm_split(c->mpi, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    watch_end();
    if (rc != MPI_SUCCESS) return mpi_error(rc, "split", comm);
    if (sub == MPI_COMM_NULL) return SHARD_OK;
    char name[64];
    snprintf(name, sizeof name, "%.40s:%d", comm->name, color);
    mcomm *nc = NULL;
    SHARD_CHECK(mcomm_wrap(sub, name, comm->timeout_seconds, &nc));
    *out = &nc->base;
    return SHARD_OK;
}

static void mpi_destroy(shard_comm *comm) {
    mcomm *c = (mcomm *)comm;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&c->mpi), MPI_Comm_free(&c->gather);
    shard_free(c->pack[0]);
    shard_free(c->pack[1]);
    free(c);
}

static void mpi_abort(shard_comm *comm, shard_status status, const char *reason) {
    (void)status;
    char text[SHARD_ERROR_TEXT_BYTES];
    shard__abort_text(comm, reason, text, sizeof text);
    fprintf(stderr, "shard: %s\n", text);
    fflush(stdout);
    fflush(stderr);
    /* As the watchdog: exiting without MPI_Finalize makes the launcher end the
     * job at once, and unlike MPI_Abort it stays safe when every rank fails
     * together (a collective mismatch). */
    _exit(1);
}

static const shard__comm_vtable mpi_vtable = {
    .name = "mpi",
    .collective = mpi_collective,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .request_test = mpi_request_test,
    .request_wait = mpi_request_wait,
    .split = mpi_split,
    .destroy = mpi_destroy,
    .abort = mpi_abort,
    .icollective = mpi_icollective,
    .request_release = mpi_request_release,
};

/* ------------------------------------------------------------------ start and stop */

static const char *level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "unknown";
    }
}

void shard__mpi_finalize_at_exit(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized || !M.initialized_here) return;
    /* MPI_Finalize waits for every rank.  A rank parked in it while a failing
     * job was torn down was seen to wedge Open MPI 4.1's mpirun, so meet the
     * others in a barrier first.  A peer still working (saving a checkpoint,
     * or rank 0 running a benchmark's reference after the ranks' work) is
     * waited for up to SHARD_EXIT_TIMEOUT seconds, by default twice the
     * world's timeout and 5 s but at least 15 minutes (a peer blocked in a
     * collective meets its own deadline first, and its line names what it
     * waits for); past it this rank says so and ends as the watchdog does: a
     * peer that failed ends the job through the launcher only where the
     * launcher kills the rest (srun does not by default), and a rank must
     * never wait silently. */
    MPI_Request barrier;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &barrier) == MPI_SUCCESS) {
        int done = 0;
        double limit = 2 * (M.exit_timeout > 0 ? M.exit_timeout : 300) + 5;
        if (limit < 900) limit = 900;
        limit = shard__env_seconds("SHARD_EXIT_TIMEOUT", limit);
        double deadline = shard__now() + limit;
        for (unsigned spins = 0; !done; spins++) {
            if (MPI_Test(&barrier, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
            if (!done && shard__now() > deadline) {
                int rank = -1, size = 0;
                MPI_Comm_rank(MPI_COMM_WORLD, &rank);
                MPI_Comm_size(MPI_COMM_WORLD, &size);
                char line[256];
                snprintf(line, sizeof line,
                         "timeout after %g s at exit: rank %d of %d finished, but not every other rank reached the "
                         "final barrier (one failed or is still working; MPI backend: which is not visible from here)",
                         limit, rank, size);
                end_process(line);
            }
            if (!done && spins > 1000) {
                struct timespec pause = {0, 100 * 1000}; /* an idle rank at exit: do not burn a core */
                nanosleep(&pause, NULL);
            }
        }
    }
    if (M.setup_done) {
        for (int i = 0; i < 4; i++) MPI_Op_free(&M.user_ops[i]);
        for (int i = 0; i < 2; i++) MPI_Type_free(&M.half_types[i]);
    }
    MPI_Finalize();
}

shard_status shard__mpi_world(shard_comm **out, int verbose, double timeout_seconds) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        int provided = MPI_THREAD_SINGLE;
        /* MULTIPLE lets later work (communication threads) call MPI from any
         * thread; FUNNELED is the least shard needs today: every MPI call comes
         * from the rank's main thread (the watchdog never calls MPI). */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return shard_error(SHARD_ERR_BACKEND, "MPI_Init_thread failed");
        M.initialized_here = 1;
        atexit(shard__mpi_finalize_at_exit);
    }
    if (!M.setup_done) { /* once per process, whoever initialised MPI */
        int provided = MPI_THREAD_SINGLE;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_FUNNELED)
            return shard_error(SHARD_ERR_BACKEND, "MPI runs at %s; shard needs at least MPI_THREAD_FUNNELED%s",
                               level_name(provided),
                               M.initialized_here ? "" : " (initialise MPI with MPI_Init_thread)");
        M.thread_level = provided;
        int *ub = NULL, found = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
        M.tag_ub = found && ub && *ub >= 32767 ? *ub : 32767;
        /* without the watchdog no blocking call would have a deadline */
        int failed = pthread_create(&M.watchdog, NULL, watchdog_main, NULL);
        if (failed)
            return shard_error(SHARD_ERR_BACKEND, "could not start the MPI watchdog thread: %s", strerror(failed));
        pthread_detach(M.watchdog);
        M.watchdog_started = 1;
        for (int i = 0; i < 2; i++) {
            MPI_Type_contiguous(2, MPI_BYTE, &M.half_types[i]);
            MPI_Type_commit(&M.half_types[i]);
        }
        MPI_Op_create(user_sum, 1, &M.user_ops[0]);
        MPI_Op_create(user_prod, 1, &M.user_ops[1]);
        MPI_Op_create(user_max, 1, &M.user_ops[2]);
        MPI_Op_create(user_min, 1, &M.user_ops[3]);
        const char *dbg = getenv("SHARD_DEBUG");
        M.debug = dbg && dbg[0] && strcmp(dbg, "0") != 0;
        M.setup_done = 1;
    }
    MPI_Comm dup; /* MPI_COMM_WORLD's error handler stays the program's; the dup returns errors */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS)
        return shard_error(SHARD_ERR_BACKEND, "MPI_Comm_dup(MPI_COMM_WORLD) failed");
    if (timeout_seconds > M.exit_timeout) M.exit_timeout = timeout_seconds;
    mcomm *c = NULL;
    SHARD_CHECK(mcomm_wrap(dup, "world", timeout_seconds, &c));
    if (verbose) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int len = 0;
        MPI_Get_library_version(version, &len);
        char *nl = strchr(version, '\n');
        if (nl) *nl = '\0';
        fprintf(stderr, "shard: rank %d of %d: backend mpi (%s), thread level %s, desync checks %s\n", c->base.rank,
                c->base.size, version, level_name(M.thread_level), M.debug ? "on" : "off");
    }
    *out = &c->base;
    return SHARD_OK;
}

shard_status shard__mpi_raw_op(shard_comm *comm, const char *op, const void *send, void *recv, size_t count_per_rank,
                               shard_dtype dtype) {
    if (comm->vt != &mpi_vtable) return shard_error(SHARD_ERR_UNSUPPORTED, "raw MPI timing needs the MPI backend");
    mcomm *c = (mcomm *)comm;
    int n = comm->size, count = 0;
    SHARD_CHECK(as_int(comm, op, count_per_rank, &count));
    MPI_Datatype t = mpi_type(dtype);
    int rc;
    if (strcmp(op, "all_reduce") == 0)
        rc = MPI_Allreduce(send, recv, count, t, mpi_op(dtype, SHARD_OP_SUM), c->mpi);
    else if (strcmp(op, "all_gather") == 0)
        rc = MPI_Allgather(send, count, t, recv, count, t, c->mpi);
    else if (strcmp(op, "reduce_scatter") == 0)
        rc = MPI_Reduce_scatter_block(send, recv, count, t, mpi_op(dtype, SHARD_OP_SUM), c->mpi);
    else if (strcmp(op, "all_to_all") == 0)
        rc = MPI_Alltoall(send, count, t, recv, count, t, c->mpi);
    else if (strcmp(op, "sendrecv") == 0) {
        int r = comm->rank;
        rc =
            MPI_Sendrecv(send, count, t, (r + 1) % n, 7, recv, count, t, (r + n - 1) % n, 7, c->mpi, MPI_STATUS_IGNORE);
    } else
        return shard_error(SHARD_ERR_INVALID_ARG, "raw MPI timing: unknown op '%s'", op);
    if (rc != MPI_SUCCESS) return mpi_error(rc, op, comm);
    return SHARD_OK;
}
