/* comm.c — the public communicator calls, the same for every backend.
 *
 * Here, once for all backends: argument checks with messages that say what
 * would be valid, sequence numbers, the per-rank count/displacement arrays of
 * each collective, traffic accounting, and requests.  Backends (threads/, mpi/)
 * receive a normalised shard__coll_args and only move data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "core/monitor_impl.h"
#include "emulate.h"
#include "shard/clock.h"

static const char *const coll_names[SHARD__COLL_KIND_COUNT] = {
    "barrier",    "broadcast",   "all_reduce",      "reduce_scatter", "all_gather",
    "all_to_all", "all_gatherv", "reduce_scatterv", "all_to_allv",    "all_to_allw"};

const char *shard__coll_kind_name(shard__coll_kind kind) {
    return (int)kind >= 0 && kind < SHARD__COLL_KIND_COUNT ? coll_names[kind] : "invalid";
}

static const char *const op_names[SHARD_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

const char *shard_reduce_op_name(shard_reduce_op op) {
    return (int)op >= 0 && op < SHARD_OP_COUNT ? op_names[op] : "invalid";
}

shard_status shard_reduce_op_parse(const char *name, shard_reduce_op *out) {
    for (int i = 0; i < SHARD_OP_COUNT; i++)
        if (name && strcmp(name, op_names[i]) == 0) {
            *out = (shard_reduce_op)i;
            return SHARD_OK;
        }
    return shard_error(SHARD_ERR_INVALID_ARG, "unknown reduce op '%s': valid ops are sum, prod, max, min, avg",
                       name ? name : "(null)");
}

double shard__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double shard_clock_seconds(void) { return shard__now(); }

shard_status shard_comm_mpi_raw(shard_comm *comm, const char *op, const void *send, void *recv, size_t count_per_rank,
                                shard_dtype dtype) {
    return shard__mpi_raw_op(comm, op, send, recv, count_per_rank, dtype);
}

void shard__comm_init_header(shard_comm *comm, const shard__comm_vtable *vt, int rank, int size, const char *name,
                             double timeout_seconds) {
    comm->vt = vt;
    comm->rank = rank;
    comm->size = size;
    snprintf(comm->name, sizeof comm->name, "%s", name);
    comm->timeout_seconds = timeout_seconds;
    comm->coll_seq = 0;
    comm->p2p_seq = 0;
    atomic_init(&comm->bytes_sent, 0);
    atomic_init(&comm->outstanding, 0);
    comm->emu = NULL;
}

void shard__format_rank_list(const int *flag, int n, char *out, size_t out_bytes) {
    if (!out_bytes) return;
    size_t used = 0;
    out[0] = '\0';
    int final = -1; /* the last flagged rank */
    for (int r = 0; r < n; r++)
        if (flag[r]) final = r;
    /* whole entries only: a list that does not fit ends in ",..." (room for it is kept after every entry
     * but the last), never in a number cut short, which would name another rank */
    static const char more[] = ",...";
    for (int r = 0; r < n; r++) {
        if (!flag[r]) continue;
        int end = r;
        while (end + 1 < n && flag[end + 1]) end++;
        int range = end >= r + 2;
        char entry[32];
        int w = range ? snprintf(entry, sizeof entry, "%s%d-%d", used ? "," : "", r, end)
                      : snprintf(entry, sizeof entry, "%s%d", used ? "," : "", r);
        size_t need = (size_t)w + ((range ? end : r) == final ? 0 : sizeof more - 1);
        if (w < 0 || need >= out_bytes - used) {
            snprintf(out + used, out_bytes - used, "%s", used ? more : more + 1);
            return;
        }
        memcpy(out + used, entry, (size_t)w + 1);
        used += (size_t)w;
        if (range) r = end;
    }
    if (!used) snprintf(out, out_bytes, "none");
}

void shard__abort_text(const shard_comm *comm, const char *reason, char *out, size_t out_bytes) {
    if (strcmp(comm->name, "world") == 0)
        snprintf(out, out_bytes, "rank %d failed: %s", comm->rank, reason);
    else
        snprintf(out, out_bytes, "rank %d of comm '%s' failed: %s", comm->rank, comm->name, reason);
}

void shard__describe_coll(const shard__coll_args *a, const shard__coll_args *other, char *out, size_t out_bytes) {
    int w = snprintf(out, out_bytes, "%s", shard__coll_kind_name(a->kind));
    if (a->kind == SHARD__BARRIER || w < 0 || (size_t)w >= out_bytes) return;
    size_t used = (size_t)w;
    used += (size_t)snprintf(out + used, out_bytes - used, " %s x%zu", shard_dtype_name(a->dtype), a->count);
    int reduces = a->kind == SHARD__ALL_REDUCE || a->kind == SHARD__REDUCE_SCATTER || a->kind == SHARD__REDUCE_SCATTERV;
    /* op and root only when they are what differs */
    if (used < out_bytes && reduces && (!other || (other->kind == a->kind && other->op != a->op)))
        used += (size_t)snprintf(out + used, out_bytes - used, " op %s", shard_reduce_op_name(a->op));
    if (used < out_bytes && a->kind == SHARD__BROADCAST && (!other || other->root != a->root))
        snprintf(out + used, out_bytes - used, " root %d", a->root);
}

int shard__coll_args_differ(const shard__coll_args *a, const shard__coll_args *b, int size) {
    int v_form = a->kind == SHARD__ALL_GATHERV || a->kind == SHARD__REDUCE_SCATTERV || a->kind == SHARD__ALL_TO_ALLV ||
        a->kind == SHARD__ALL_TO_ALLW; /* counts differ per rank */
    if (a->kind != b->kind || a->dtype != b->dtype || (!v_form && a->count != b->count)) return 1;
    if (a->kind == SHARD__BARRIER) return 0;
    if ((a->kind == SHARD__ALL_REDUCE || a->kind == SHARD__REDUCE_SCATTER || a->kind == SHARD__REDUCE_SCATTERV) &&
        a->op != b->op)
        return 1;
    if (a->kind == SHARD__BROADCAST && a->root != b->root) return 1;
    if (a->kind == SHARD__ALL_GATHERV || a->kind == SHARD__REDUCE_SCATTERV)
        for (int p = 0; p < size; p++)
            if (a->recv_counts[p] != b->recv_counts[p]) return 1;
    return 0;
}

/* ---------------- identity and settings ---------------- */

int shard_comm_rank(const shard_comm *comm) { return comm ? comm->rank : -1; }
int shard_comm_size(const shard_comm *comm) { return comm ? comm->size : 0; }
const char *shard_comm_name(const shard_comm *comm) { return comm ? comm->name : "(null)"; }
const char *shard_comm_backend(const shard_comm *comm) { return comm ? comm->vt->name : "(null)"; }
uint64_t shard_comm_bytes_sent(const shard_comm *comm) { return comm ? atomic_load(&comm->bytes_sent) : 0; }
uint64_t shard_comm_collective_count(const shard_comm *comm) { return comm ? comm->coll_seq : 0; }
double shard_comm_timeout(const shard_comm *comm) { return comm ? comm->timeout_seconds : 0.0; }

/* Settings are read by helper threads running queued requests: change them
 * only while none are pending. */
static shard_status check_no_pending(const shard_comm *comm, const char *what) {
    int64_t pending = atomic_load(&comm->outstanding);
    if (pending > 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': %lld request%s pending; wait for them first", what,
                           comm->name, (long long)pending, pending == 1 ? " is" : "s are");
    return SHARD_OK;
}

shard_status shard_comm_set_name(shard_comm *comm, const char *name) {
    if (comm) SHARD_CHECK(check_no_pending(comm, "shard_comm_set_name"));
    if (!comm || !name || !name[0] || strlen(name) >= sizeof comm->name)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_comm_set_name: name must be 1..%zu characters, got %s",
                           sizeof comm->name - 1, name ? "a longer or empty one" : "NULL");
    snprintf(comm->name, sizeof comm->name, "%s", name);
    return SHARD_OK;
}

shard_status shard_comm_set_timeout(shard_comm *comm, double seconds) {
    if (!comm) return shard_error(SHARD_ERR_INVALID_ARG, "shard_comm_set_timeout: comm is NULL");
    SHARD_CHECK(check_no_pending(comm, "shard_comm_set_timeout"));
    if (!(seconds > 0.0) || seconds > 1e9)
        return shard_error(SHARD_ERR_INVALID_ARG, "timeout %g s on comm '%s' is invalid: give seconds > 0", seconds,
                           comm->name);
    comm->timeout_seconds = seconds;
    return SHARD_OK;
}

/* A split under an emulated cluster: the new communicator learns its ranks' places (failing that, it is
 * destroyed, as a split that failed leaves none). */
static shard_status split_emulated(shard_comm **out) {
    shard_status s = shard__emu_comm_split(*out);
    if (s < 0 && *out) {
        shard__comm_destroy_force(*out);
        *out = NULL;
    }
    return s;
}

shard_status shard_comm_split(shard_comm *comm, int color, int key, shard_comm **out) {
    if (!comm || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_comm_split: comm and out must not be NULL");
    *out = NULL;
    /* a split is collective on the parent; the backend numbers the steps it takes */
    shard_status s = comm->vt->split(comm, color, key, out);
    if (s == SHARD_OK && shard__emu_current) s = split_emulated(out);
    return s;
}

shard_status shard__comm_split_sized(shard_comm *comm, int color, int key, int size, int rank, shard_comm **out) {
    if (!comm || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_comm_split: comm and out must not be NULL");
    *out = NULL;
    shard_status s = comm->vt->split_sized ? comm->vt->split_sized(comm, color, key, size, rank, out)
                                           : comm->vt->split(comm, color, key, out);
    if (s == SHARD_OK && shard__emu_current) s = split_emulated(out);
    return s;
}

shard_status shard_comm_destroy(shard_comm *comm) {
    if (!comm) return SHARD_OK;
    int64_t pending = atomic_load(&comm->outstanding);
    if (pending > 0) /* their completion would touch this communicator */
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "comm '%s' destroyed with %lld request%s never waited on: wait for them first", comm->name,
                           (long long)pending, pending == 1 ? "" : "s");
    shard__emu_comm_free(comm);
    comm->vt->destroy(comm);
    return SHARD_OK;
}

void shard__comm_destroy_force(shard_comm *comm) {
    if (!comm) return;
    shard__emu_comm_free(comm);
    comm->vt->destroy(comm); /* outstanding requests are abandoned, never freed */
}

void shard_comm_abort(shard_comm *comm, shard_status status, const char *reason) {
    if (comm) comm->vt->abort(comm, status, reason ? reason : "aborted by the program");
}

/* ---------------- argument checks ---------------- */

static shard_status check_comm(const shard_comm *comm, const char *what) {
    if (!comm) return shard_error(SHARD_ERR_INVALID_ARG, "%s: comm is NULL", what);
    return SHARD_OK;
}

static shard_status check_dtype(const shard_comm *comm, const char *what, shard_dtype dtype) {
    if ((int)dtype < 0 || dtype >= SHARD_DTYPE_COUNT)
        return shard_error(
            SHARD_ERR_INVALID_ARG,
            "%s on comm '%s': dtype %d is invalid: valid dtypes are f32, f64, bf16, f16, i8, i32, i64, u8", what,
            comm->name, (int)dtype);
    return SHARD_OK;
}

static shard_status check_op(const shard_comm *comm, const char *what, shard_reduce_op op) {
    if ((int)op < 0 || op >= SHARD_OP_COUNT)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s on comm '%s': reduce op %d is invalid: valid ops are sum, prod, max, min, avg", what,
                           comm->name, (int)op);
    return SHARD_OK;
}

static shard_status check_buffer(const shard_comm *comm, const char *what, const char *which, const void *buf,
                                 size_t count, shard_dtype dtype) {
    if (count > SIZE_MAX / 8 / (size_t)(comm->size ? comm->size : 1))
        return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': count %zu of %s is too large", what, comm->name,
                           count, shard_dtype_name(dtype));
    if (count > 0 && !buf)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': %s buffer is NULL with count %zu", what, comm->name,
                           which, count);
    return SHARD_OK;
}

/* send and recv may be one buffer only in the collective's in-place layout: any other overlap lets a rank
 * overwrite what a peer is still reading (results that depend on timing, never an error) */
static shard_status check_overlap(const shard_comm *comm, const char *what, const shard__coll_args *a,
                                  size_t send_bytes, size_t recv_bytes, const char *in_place_layout) {
    if (a->in_place || !send_bytes || !recv_bytes || !a->send || !a->recv) return SHARD_OK;
    uintptr_t s0 = (uintptr_t)a->send, r0 = (uintptr_t)a->recv;
    if (s0 < r0 + recv_bytes && r0 < s0 + send_bytes)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s on comm '%s': the send buffer (%zu bytes) overlaps the recv buffer "
                           "(%zu bytes) outside the in-place layout; give separate buffers, or the in-place layout "
                           "(%s)",
                           what, comm->name, send_bytes, recv_bytes, in_place_layout);
    return SHARD_OK;
}

static shard_status check_peer(const shard_comm *comm, const char *what, const char *role, int peer) {
    if (peer < 0 || peer >= comm->size)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': %s %d is out of range 0..%d", what, comm->name,
                           role, peer, comm->size - 1);
    return SHARD_OK;
}

/* ---------------- requests ---------------- */

static shard_request *request_new(shard_comm *comm, shard__request_kind kind) {
    shard_request *req = calloc(1, sizeof *req);
    if (!req) {
        shard_error(SHARD_ERR_NO_MEMORY, "out of memory allocating a request on comm '%s'", comm->name);
        return NULL;
    }
    req->comm = comm;
    req->kind = kind;
    atomic_init(&req->done, 0);
    atomic_fetch_add(&comm->outstanding, 1);
    if (shard__mon_current) req->mon_t0 = shard__now(), req->mon_cat = shard__mon_current->tag;
    return req;
}

static void args_free_arrays(shard__coll_args *a) {
    free(a->send_counts); /* one block holds all the arrays */
    a->send_counts = a->send_displs = a->recv_counts = a->recv_displs = NULL;
    a->send_row_len = a->send_stride = a->recv_row_len = a->recv_stride = NULL;
}

static void request_free(shard_request *req) {
    if (req->comm->vt->request_release) req->comm->vt->request_release(req);
    atomic_fetch_sub(&req->comm->outstanding, 1);
    args_free_arrays(&req->coll);
    free(req);
}

static shard_status request_finish(shard_request *req) {
    shard_status s = req->status;
    if (s < 0) shard_error(s, "%s", req->error);
    request_free(req);
    return s;
}

static const char *request_what(const shard_request *req) {
    return req->kind == SHARD__REQ_SEND ? "send"
        : req->kind == SHARD__REQ_RECV  ? "recv"
                                        : shard__coll_kind_name(req->coll.kind);
}

/* A measured request, done: the monitor of the rank that waits for it (the rank that started it). */
static void monitor_request(const shard_request *req, double wait0, double end) {
    if (shard__mon_current)
        shard__mon_comm(shard__mon_current, req->comm, request_what(req), req->mon_cat, req->mon_t0, wait0, end,
                        req->mon_bytes);
}

shard_status shard_request_wait(shard_request **reqp) {
    if (!reqp) return shard_error(SHARD_ERR_INVALID_ARG, "shard_request_wait: request pointer is NULL");
    shard_request *req = *reqp;
    if (!req) return SHARD_OK; /* waiting on a finished (NULL) request is a no-op, as MPI_REQUEST_NULL */
    *reqp = NULL;
    if (shard__emu_current) shard__emu_call_begin();
    double wait0 = req->mon_t0 > 0 ? shard__now() : 0;
    if (!atomic_load(&req->done)) {
        shard_status s = req->comm->vt->request_wait(req);
        if (s < 0 && !atomic_load(&req->done)) {
            req->status = s;
            snprintf(req->error, sizeof req->error, "%s", shard_last_error());
        }
    }
    if (shard__emu_current) shard__emu_call_end(req->emu_deadline);
    if (req->mon_t0 > 0) monitor_request(req, wait0, shard__now());
    return request_finish(req);
}

shard_status shard_request_test(shard_request **reqp, int *done) {
    if (!reqp || !done) return shard_error(SHARD_ERR_INVALID_ARG, "shard_request_test: NULL argument");
    *done = 0;
    shard_request *req = *reqp;
    if (!req) {
        *done = 1;
        return SHARD_OK;
    }
    if (!atomic_load(&req->done)) {
        int d = 0;
        shard_status s = req->comm->vt->request_test(req, &d);
        if (s < 0 && !atomic_load(&req->done)) {
            /* failed while the backend may still own its buffers: finished as a failed wait is, not marked
             * done, so the backend's release knows (MPI keeps a started collective's state) */
            req->status = s;
            snprintf(req->error, sizeof req->error, "%s", shard_last_error());
            *done = 1;
            *reqp = NULL;
            return request_finish(req);
        }
        if (!atomic_load(&req->done)) return SHARD_OK;
    }
    if (req->emu_deadline > 0 && shard__now() < req->emu_deadline) return SHARD_OK; /* still on the emulated link */
    *done = 1;
    *reqp = NULL;
    if (req->mon_t0 > 0) {
        double now = shard__now();
        monitor_request(req, now, now);
    }
    return request_finish(req);
}

shard_status shard_request_wait_all(size_t n, shard_request **reqs) {
    if (n && !reqs) return shard_error(SHARD_ERR_INVALID_ARG, "shard_request_wait_all: requests is NULL");
    shard_status first = SHARD_OK;
    char first_error[SHARD_ERROR_TEXT_BYTES] = "";
    for (size_t i = 0; i < n; i++) {
        shard_status s = shard_request_wait(&reqs[i]);
        if (s < 0 && first == SHARD_OK) {
            first = s;
            snprintf(first_error, sizeof first_error, "%s", shard_last_error());
        }
    }
    if (first < 0) shard_error(first, "%s", first_error);
    return first;
}

/* ---------------- point to point ---------------- */

static shard_status p2p_start(shard_comm *comm, int is_send, void *buf, size_t count, shard_dtype dtype, int peer,
                              int tag, shard_request **out) {
    const char *what = is_send ? "send" : "recv";
    if (out) *out = NULL; /* a refused request is NULL, as a refused collective's, so wait_all may take it */
    SHARD_CHECK(check_comm(comm, what));
    SHARD_CHECK(check_dtype(comm, what, dtype));
    SHARD_CHECK(check_buffer(comm, what, "message", buf, count, dtype));
    SHARD_CHECK(check_peer(comm, what, is_send ? "destination rank" : "source rank", peer));
    if (tag < 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': tag %d is invalid: tags are >= 0", what, comm->name,
                           tag);
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': request pointer is NULL", what, comm->name);
    shard_request *req = request_new(comm, is_send ? SHARD__REQ_SEND : SHARD__REQ_RECV);
    if (!req) return SHARD_ERR_NO_MEMORY;
    uint64_t seq = ++comm->p2p_seq;
    size_t bytes = count * shard_dtype_size(dtype);
    if (shard__emu_current) req->emu_deadline = shard__emu_call_begin() + shard__emu_p2p_seconds(comm, peer, bytes);
    shard_status s = is_send ? comm->vt->isend(comm, buf, bytes, peer, tag, seq, req)
                             : comm->vt->irecv(comm, buf, bytes, peer, tag, seq, req);
    if (shard__emu_current) shard__emu_call_end(0);
    if (s < 0) {
        request_free(req);
        return s;
    }
    if (is_send && peer != comm->rank) atomic_fetch_add(&comm->bytes_sent, bytes), req->mon_bytes = bytes;
    *out = req;
    return SHARD_OK;
}

shard_status shard_comm_isend(shard_comm *comm, const void *buf, size_t count, shard_dtype dtype, int dst, int tag,
                              shard_request **req) {
    return p2p_start(comm, 1, (void *)(uintptr_t)buf, count, dtype, dst, tag, req);
}

shard_status shard_comm_irecv(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int src, int tag,
                              shard_request **req) {
    return p2p_start(comm, 0, buf, count, dtype, src, tag, req);
}

shard_status shard_comm_send(shard_comm *comm, const void *buf, size_t count, shard_dtype dtype, int dst, int tag) {
    shard_request *req = NULL;
    SHARD_CHECK(shard_comm_isend(comm, buf, count, dtype, dst, tag, &req));
    return shard_request_wait(&req);
}

shard_status shard_comm_recv(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int src, int tag) {
    shard_request *req = NULL;
    SHARD_CHECK(shard_comm_irecv(comm, buf, count, dtype, src, tag, &req));
    return shard_request_wait(&req);
}

/* ---------------- collectives ---------------- */

static shard_status alloc_arrays(shard_comm *comm, shard__coll_args *a) {
    size_t n = (size_t)comm->size, arrays = a->kind == SHARD__ALL_TO_ALLW ? 8 : 4;
    size_t *block = calloc(arrays * n, sizeof *block);
    if (!block)
        return shard_error(SHARD_ERR_NO_MEMORY, "%s on comm '%s': out of memory for counts",
                           shard__coll_kind_name(a->kind), comm->name);
    a->send_counts = block;
    a->send_displs = block + n;
    a->recv_counts = block + 2 * n;
    a->recv_displs = block + 3 * n;
    if (arrays == 8) {
        a->send_row_len = block + 4 * n;
        a->send_stride = block + 5 * n;
        a->recv_row_len = block + 6 * n;
        a->recv_stride = block + 7 * n;
    }
    return SHARD_OK;
}

/* Strided blocks into counts (elements), displacements (offsets), row lengths and strides. */
static shard_status copy_blocks(shard_comm *comm, const char *which, const shard_block *blocks, size_t *counts,
                                size_t *displs, size_t *row_len, size_t *stride) {
    if (!blocks)
        return shard_error(SHARD_ERR_INVALID_ARG, "all_to_allw on comm '%s': %s blocks are NULL (need %d entries)",
                           comm->name, which, comm->size);
    for (int p = 0; p < comm->size; p++) {
        const shard_block *b = &blocks[p];
        size_t rows = b->row_len ? b->rows : 0, len = rows ? b->row_len : 0;
        int bad = len > SIZE_MAX / 16 || rows > SIZE_MAX / 16 || b->offset > SIZE_MAX / 16 ||
            (rows > 1 && (b->stride < len || b->stride > SIZE_MAX / 16 / rows));
        if (!bad && rows) bad = rows * len > SIZE_MAX / 16;
        if (bad)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "all_to_allw on comm '%s': %s block %d (offset %zu, %zu rows of %zu, stride %zu) is "
                               "invalid: need stride >= row length and sizes below 2^60",
                               comm->name, which, p, b->offset, b->rows, b->row_len, b->stride);
        counts[p] = rows * len;
        displs[p] = b->offset;
        row_len[p] = len ? len : 1;
        stride[p] = rows > 1 ? b->stride : row_len[p];
    }
    return SHARD_OK;
}

/* The element just past a strided block. */
static size_t block_end(size_t displ, size_t count, size_t row_len, size_t stride) {
    if (!count) return displ;
    size_t rows = count / row_len;
    return displ + (rows - 1) * stride + row_len;
}

void shard__copy_strided(void *dst, size_t dst_row_len, size_t dst_stride, const void *src, size_t src_row_len,
                         size_t src_stride, size_t count, size_t elem_size,
                         void (*copy)(void *dst, const void *src, size_t bytes)) {
    if (dst_stride == dst_row_len) dst_row_len = dst_stride = count; /* contiguous: one row */
    if (src_stride == src_row_len) src_row_len = src_stride = count;
    size_t di = 0, dpos = 0, si = 0, spos = 0; /* row index and position in the row, each side */
    while (count) {
        size_t n = dst_row_len - dpos < src_row_len - spos ? dst_row_len - dpos : src_row_len - spos;
        if (n > count) n = count;
        copy((char *)dst + (di * dst_stride + dpos) * elem_size,
             (const char *)src + (si * src_stride + spos) * elem_size, n * elem_size);
        count -= n, dpos += n, spos += n;
        if (dpos == dst_row_len) di++, dpos = 0;
        if (spos == src_row_len) si++, spos = 0;
    }
}

static void fill_uniform(size_t *counts, size_t *displs, int n, size_t count) {
    for (int p = 0; p < n; p++) {
        counts[p] = count;
        displs[p] = (size_t)p * count;
    }
}

static shard_status copy_counts(shard_comm *comm, const shard__coll_args *a, const char *which,
                                const size_t *src_counts, const size_t *src_displs, size_t *counts, size_t *displs) {
    if (!src_counts)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': %s counts are NULL (need %d entries)",
                           shard__coll_kind_name(a->kind), comm->name, which, comm->size);
    size_t next = 0;
    for (int p = 0; p < comm->size; p++) {
        if (src_counts[p] > SIZE_MAX / 16)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': %s count[%d] = %zu is too large",
                               shard__coll_kind_name(a->kind), comm->name, which, p, src_counts[p]);
        counts[p] = src_counts[p];
        displs[p] = src_displs ? src_displs[p] : next;
        if (displs[p] > SIZE_MAX / 16 - counts[p])
            return shard_error(SHARD_ERR_INVALID_ARG, "%s on comm '%s': %s displacement[%d] = %zu is too large",
                               shard__coll_kind_name(a->kind), comm->name, which, p, displs[p]);
        next = displs[p] + counts[p];
    }
    return SHARD_OK;
}

/* Check and normalise; on success `a` owns its arrays (free with args_free_arrays). */
static shard_status prepare(shard_comm *comm, shard__coll_args *a, const size_t *send_counts, const size_t *send_displs,
                            const size_t *recv_counts, const size_t *recv_displs) {
    const char *what = shard__coll_kind_name(a->kind);
    SHARD_CHECK(check_comm(comm, what));
    SHARD_CHECK(check_dtype(comm, what, a->dtype));
    if (a->kind == SHARD__ALL_REDUCE || a->kind == SHARD__REDUCE_SCATTER || a->kind == SHARD__REDUCE_SCATTERV)
        SHARD_CHECK(check_op(comm, what, a->op));
    if (a->kind == SHARD__BROADCAST) SHARD_CHECK(check_peer(comm, what, "root", a->root));
    int n = comm->size, r = comm->rank;
    size_t es = shard_dtype_size(a->dtype);
    shard_status s = SHARD_OK;
    switch (a->kind) {
    case SHARD__BARRIER: return SHARD_OK;
    case SHARD__BROADCAST: return check_buffer(comm, what, "data", a->recv, a->count, a->dtype);
    case SHARD__ALL_REDUCE:
        SHARD_CHECK(check_buffer(comm, what, "send", a->send, a->count, a->dtype));
        SHARD_CHECK(check_buffer(comm, what, "recv", a->recv, a->count, a->dtype));
        a->in_place = a->send == a->recv;
        return check_overlap(comm, what, a, a->count * es, a->count * es, "send = recv");
    default: break;
    }
    SHARD_CHECK(alloc_arrays(comm, a));
    switch (a->kind) {
    case SHARD__ALL_GATHER: fill_uniform(a->recv_counts, a->recv_displs, n, a->count); break;
    case SHARD__ALL_GATHERV:
        SHARD_CHECK_GOTO(copy_counts(comm, a, "recv", recv_counts, recv_displs, a->recv_counts, a->recv_displs), s,
                         fail);
        if (a->recv_counts[r] != a->count) {
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "all_gatherv on comm '%s': rank %d sends %zu elements but recv_counts[%d] = %zu",
                            comm->name, r, a->count, r, a->recv_counts[r]);
            goto fail;
        }
        break;
    case SHARD__REDUCE_SCATTER: fill_uniform(a->recv_counts, a->recv_displs, n, a->count); break;
    case SHARD__REDUCE_SCATTERV:
        SHARD_CHECK_GOTO(copy_counts(comm, a, "recv", recv_counts, NULL, a->recv_counts, a->recv_displs), s, fail);
        break;
    case SHARD__ALL_TO_ALL:
        fill_uniform(a->recv_counts, a->recv_displs, n, a->count);
        fill_uniform(a->send_counts, a->send_displs, n, a->count);
        break;
    case SHARD__ALL_TO_ALLV:
        SHARD_CHECK_GOTO(copy_counts(comm, a, "send", send_counts, send_displs, a->send_counts, a->send_displs), s,
                         fail);
        SHARD_CHECK_GOTO(copy_counts(comm, a, "recv", recv_counts, recv_displs, a->recv_counts, a->recv_displs), s,
                         fail);
        if (a->send_counts[r] != a->recv_counts[r]) { /* the block to oneself: both sides are here */
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "all_to_allv on comm '%s': rank %d sends %zu elements to itself but expects %zu",
                            comm->name, r, a->send_counts[r], a->recv_counts[r]);
            goto fail;
        }
        break;
    case SHARD__ALL_TO_ALLW:
        SHARD_CHECK_GOTO(
            copy_blocks(comm, "send", a->send_blocks, a->send_counts, a->send_displs, a->send_row_len, a->send_stride),
            s, fail);
        SHARD_CHECK_GOTO(
            copy_blocks(comm, "recv", a->recv_blocks, a->recv_counts, a->recv_displs, a->recv_row_len, a->recv_stride),
            s, fail);
        if (a->send_counts[r] != a->recv_counts[r]) {
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "all_to_allw on comm '%s': rank %d sends %zu elements to itself but expects %zu",
                            comm->name, r, a->send_counts[r], a->recv_counts[r]);
            goto fail;
        }
        if (a->send && a->send == a->recv) {
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "all_to_allw on comm '%s': send and recv are one buffer; "
                            "all_to_allw is not in place (use all_to_allv, or another buffer)",
                            comm->name);
            goto fail;
        }
        break;
    default: s = shard_error(SHARD_ERR_INTERNAL, "unknown collective kind %d", (int)a->kind); goto fail;
    }
    a->send_blocks = a->recv_blocks = NULL; /* the caller's: not kept */
    /* the total extent of each buffer, for NULL checks */
    size_t send_extent = 0, recv_extent = 0;
    for (int p = 0; p < n; p++) {
        size_t re = a->recv_displs[p] + a->recv_counts[p];
        size_t se = a->send_displs[p] + a->send_counts[p];
        if (a->kind == SHARD__ALL_TO_ALLW) {
            re = block_end(a->recv_displs[p], a->recv_counts[p], a->recv_row_len[p], a->recv_stride[p]);
            se = block_end(a->send_displs[p], a->send_counts[p], a->send_row_len[p], a->send_stride[p]);
        }
        if (re > recv_extent) recv_extent = re;
        if (se > send_extent) send_extent = se;
    }
    switch (a->kind) {
    case SHARD__ALL_GATHER:
    case SHARD__ALL_GATHERV:
        SHARD_CHECK_GOTO(check_buffer(comm, what, "send", a->send, a->count, a->dtype), s, fail);
        SHARD_CHECK_GOTO(check_buffer(comm, what, "recv", a->recv, recv_extent, a->dtype), s, fail);
        a->in_place = a->recv && a->send == (const char *)a->recv + a->recv_displs[r] * es;
        SHARD_CHECK_GOTO(
            check_overlap(comm, what, a, a->count * es, recv_extent * es, "send = recv + this rank's displacement"), s,
            fail);
        break;
    case SHARD__REDUCE_SCATTER:
    case SHARD__REDUCE_SCATTERV:
        SHARD_CHECK_GOTO(check_buffer(comm, what, "send", a->send, recv_extent, a->dtype), s, fail);
        SHARD_CHECK_GOTO(check_buffer(comm, what, "recv", a->recv, a->recv_counts[r], a->dtype), s, fail);
        a->in_place = a->send && (const char *)a->recv == (const char *)a->send + a->recv_displs[r] * es;
        SHARD_CHECK_GOTO(check_overlap(comm, what, a, recv_extent * es, a->recv_counts[r] * es,
                                       "recv = send + this rank's displacement"),
                         s, fail);
        break;
    default: /* all_to_all(v) */
        SHARD_CHECK_GOTO(check_buffer(comm, what, "send", a->send, send_extent, a->dtype), s, fail);
        SHARD_CHECK_GOTO(check_buffer(comm, what, "recv", a->recv, recv_extent, a->dtype), s, fail);
        a->in_place = a->send == a->recv;
        SHARD_CHECK_GOTO(
            check_overlap(comm, what, a, send_extent * es, recv_extent * es,
                          a->kind == SHARD__ALL_TO_ALLW ? "none: all_to_allw is not in place" : "send = recv"),
            s, fail);
        break;
    }
    return SHARD_OK;
fail:
    args_free_arrays(a);
    return s;
}

/* The bytes this rank sends to others under the bandwidth-optimal algorithm. */
uint64_t shard__coll_bytes_sent(const shard_comm *comm, const shard__coll_args *a) {
    int n = comm->size, r = comm->rank;
    uint64_t es = shard_dtype_size(a->dtype), total = 0;
    if (n == 1) return 0;
    switch (a->kind) {
    case SHARD__BARRIER: return 0;
    case SHARD__BROADCAST: return r == a->root ? (uint64_t)a->count * es * (uint64_t)(n - 1) : 0;
    case SHARD__ALL_REDUCE: {
        size_t off, len;
        shard__split_range(a->count, n, r, &off, &len);
        return ((uint64_t)(a->count - len) + (uint64_t)len * (uint64_t)(n - 1)) * es;
    }
    case SHARD__ALL_GATHER:
    case SHARD__ALL_GATHERV: return (uint64_t)a->count * es * (uint64_t)(n - 1);
    case SHARD__REDUCE_SCATTER:
    case SHARD__REDUCE_SCATTERV:
        for (int p = 0; p < n; p++)
            if (p != r) total += a->recv_counts[p];
        return total * es;
    default:
        for (int p = 0; p < n; p++)
            if (p != r) total += a->send_counts[p];
        return total * es;
    }
}

static shard_status run_blocking(shard_comm *comm, shard__coll_args *a, const size_t *sc, const size_t *sd,
                                 const size_t *rc, const size_t *rd) {
    SHARD_CHECK(prepare(comm, a, sc, sd, rc, rd));
    a->seq = ++comm->coll_seq;
    uint64_t bytes = shard__coll_bytes_sent(comm, a);
    atomic_fetch_add(&comm->bytes_sent, bytes);
    shard__mon *mon = shard__mon_current;
    double t0 = mon ? shard__now() : 0, emu_end = 0;
    if (shard__emu_current) emu_end = shard__emu_coll_deadline(comm, a, shard__emu_call_begin());
    shard_status s = comm->vt->collective(comm, a);
    if (shard__emu_current) shard__emu_call_end(emu_end);
    if (mon) shard__mon_comm(mon, comm, shard__coll_kind_name(a->kind), mon->tag, t0, t0, shard__now(), bytes);
    args_free_arrays(a);
    return s;
}

static shard_status run_nonblocking(shard_comm *comm, shard__coll_args *a, const size_t *sc, const size_t *sd,
                                    const size_t *rc, const size_t *rd, shard_request **out) {
    if (!out)
        return shard_error(SHARD_ERR_INVALID_ARG, "non-blocking %s: request pointer is NULL",
                           shard__coll_kind_name(a->kind));
    *out = NULL;
    SHARD_CHECK(prepare(comm, a, sc, sd, rc, rd));
    shard_request *req = request_new(comm, SHARD__REQ_COLL);
    if (!req) {
        args_free_arrays(a);
        return SHARD_ERR_NO_MEMORY;
    }
    a->seq = ++comm->coll_seq;
    req->mon_bytes = shard__coll_bytes_sent(comm, a);
    atomic_fetch_add(&comm->bytes_sent, req->mon_bytes);
    req->coll = *a; /* the request now owns the arrays */
    if (shard__emu_current) req->emu_deadline = shard__emu_coll_deadline(comm, &req->coll, shard__emu_call_begin());
    shard_status s;
    if (comm->vt->icollective) {
        s = comm->vt->icollective(comm, &req->coll, req);
    } else { /* fallback: complete it now */
        s = comm->vt->collective(comm, &req->coll);
        if (s >= 0) {
            req->status = SHARD_OK;
            atomic_store(&req->done, 1);
        }
    }
    if (shard__emu_current) shard__emu_call_end(0);
    if (s < 0) {
        /* refused before it was issued: give the sequence number and bytes back
         * so that this rank stays in step with its peers */
        comm->coll_seq--;
        atomic_fetch_sub(&comm->bytes_sent, shard__coll_bytes_sent(comm, &req->coll));
        request_free(req);
        return s;
    }
    *out = req;
    return SHARD_OK;
}

#define ARGS(kind_, send_, recv_, count_, dtype_, op_, root_)                                                          \
    (shard__coll_args) {                                                                                               \
        .kind = (kind_), .send = (send_), .recv = (recv_), .count = (count_), .dtype = (dtype_), .op = (op_),          \
        .root = (root_)                                                                                                \
    }

shard_status shard_comm_barrier(shard_comm *comm) {
    shard__coll_args a = ARGS(SHARD__BARRIER, NULL, NULL, 0, SHARD_U8, SHARD_OP_SUM, 0);
    return run_blocking(comm, &a, NULL, NULL, NULL, NULL);
}
shard_status shard_comm_ibarrier(shard_comm *comm, shard_request **req) {
    shard__coll_args a = ARGS(SHARD__BARRIER, NULL, NULL, 0, SHARD_U8, SHARD_OP_SUM, 0);
    return run_nonblocking(comm, &a, NULL, NULL, NULL, NULL, req);
}

shard_status shard_comm_broadcast(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int root) {
    shard__coll_args a = ARGS(SHARD__BROADCAST, buf, buf, count, dtype, SHARD_OP_SUM, root);
    return run_blocking(comm, &a, NULL, NULL, NULL, NULL);
}
shard_status shard_comm_ibroadcast(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int root,
                                   shard_request **req) {
    shard__coll_args a = ARGS(SHARD__BROADCAST, buf, buf, count, dtype, SHARD_OP_SUM, root);
    return run_nonblocking(comm, &a, NULL, NULL, NULL, NULL, req);
}

shard_status shard_comm_all_reduce(shard_comm *comm, const void *send, void *recv, size_t count, shard_dtype dtype,
                                   shard_reduce_op op) {
    shard__coll_args a = ARGS(SHARD__ALL_REDUCE, send, recv, count, dtype, op, 0);
    return run_blocking(comm, &a, NULL, NULL, NULL, NULL);
}
shard_status shard_comm_iall_reduce(shard_comm *comm, const void *send, void *recv, size_t count, shard_dtype dtype,
                                    shard_reduce_op op, shard_request **req) {
    shard__coll_args a = ARGS(SHARD__ALL_REDUCE, send, recv, count, dtype, op, 0);
    return run_nonblocking(comm, &a, NULL, NULL, NULL, NULL, req);
}

shard_status shard_comm_reduce_scatter(shard_comm *comm, const void *send, void *recv, size_t recv_count,
                                       shard_dtype dtype, shard_reduce_op op) {
    shard__coll_args a = ARGS(SHARD__REDUCE_SCATTER, send, recv, recv_count, dtype, op, 0);
    return run_blocking(comm, &a, NULL, NULL, NULL, NULL);
}
shard_status shard_comm_ireduce_scatter(shard_comm *comm, const void *send, void *recv, size_t recv_count,
                                        shard_dtype dtype, shard_reduce_op op, shard_request **req) {
    shard__coll_args a = ARGS(SHARD__REDUCE_SCATTER, send, recv, recv_count, dtype, op, 0);
    return run_nonblocking(comm, &a, NULL, NULL, NULL, NULL, req);
}

shard_status shard_comm_all_gather(shard_comm *comm, const void *send, void *recv, size_t send_count,
                                   shard_dtype dtype) {
    shard__coll_args a = ARGS(SHARD__ALL_GATHER, send, recv, send_count, dtype, SHARD_OP_SUM, 0);
    return run_blocking(comm, &a, NULL, NULL, NULL, NULL);
}
shard_status shard_comm_iall_gather(shard_comm *comm, const void *send, void *recv, size_t send_count,
                                    shard_dtype dtype, shard_request **req) {
    shard__coll_args a = ARGS(SHARD__ALL_GATHER, send, recv, send_count, dtype, SHARD_OP_SUM, 0);
    return run_nonblocking(comm, &a, NULL, NULL, NULL, NULL, req);
}

shard_status shard_comm_all_to_all(shard_comm *comm, const void *send, void *recv, size_t count_per_rank,
                                   shard_dtype dtype) {
    shard__coll_args a = ARGS(SHARD__ALL_TO_ALL, send, recv, count_per_rank, dtype, SHARD_OP_SUM, 0);
    return run_blocking(comm, &a, NULL, NULL, NULL, NULL);
}
shard_status shard_comm_iall_to_all(shard_comm *comm, const void *send, void *recv, size_t count_per_rank,
                                    shard_dtype dtype, shard_request **req) {
    shard__coll_args a = ARGS(SHARD__ALL_TO_ALL, send, recv, count_per_rank, dtype, SHARD_OP_SUM, 0);
    return run_nonblocking(comm, &a, NULL, NULL, NULL, NULL, req);
}

shard_status shard_comm_all_gatherv(shard_comm *comm, const void *send, size_t send_count, void *recv,
                                    const size_t *recv_counts, const size_t *recv_displs, shard_dtype dtype) {
    shard__coll_args a = ARGS(SHARD__ALL_GATHERV, send, recv, send_count, dtype, SHARD_OP_SUM, 0);
    return run_blocking(comm, &a, NULL, NULL, recv_counts, recv_displs);
}
shard_status shard_comm_iall_gatherv(shard_comm *comm, const void *send, size_t send_count, void *recv,
                                     const size_t *recv_counts, const size_t *recv_displs, shard_dtype dtype,
                                     shard_request **req) {
    shard__coll_args a = ARGS(SHARD__ALL_GATHERV, send, recv, send_count, dtype, SHARD_OP_SUM, 0);
    return run_nonblocking(comm, &a, NULL, NULL, recv_counts, recv_displs, req);
}

shard_status shard_comm_reduce_scatterv(shard_comm *comm, const void *send, void *recv, const size_t *recv_counts,
                                        shard_dtype dtype, shard_reduce_op op) {
    size_t own = comm && recv_counts ? recv_counts[comm->rank] : 0;
    shard__coll_args a = ARGS(SHARD__REDUCE_SCATTERV, send, recv, own, dtype, op, 0);
    return run_blocking(comm, &a, NULL, NULL, recv_counts, NULL);
}
shard_status shard_comm_ireduce_scatterv(shard_comm *comm, const void *send, void *recv, const size_t *recv_counts,
                                         shard_dtype dtype, shard_reduce_op op, shard_request **req) {
    size_t own = comm && recv_counts ? recv_counts[comm->rank] : 0;
    shard__coll_args a = ARGS(SHARD__REDUCE_SCATTERV, send, recv, own, dtype, op, 0);
    return run_nonblocking(comm, &a, NULL, NULL, recv_counts, NULL, req);
}

shard_status shard_comm_all_to_allv(shard_comm *comm, const void *send, const size_t *send_counts,
                                    const size_t *send_displs, void *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, shard_dtype dtype) {
    shard__coll_args a = ARGS(SHARD__ALL_TO_ALLV, send, recv, 0, dtype, SHARD_OP_SUM, 0);
    return run_blocking(comm, &a, send_counts, send_displs, recv_counts, recv_displs);
}
shard_status shard_comm_iall_to_allv(shard_comm *comm, const void *send, const size_t *send_counts,
                                     const size_t *send_displs, void *recv, const size_t *recv_counts,
                                     const size_t *recv_displs, shard_dtype dtype, shard_request **req) {
    shard__coll_args a = ARGS(SHARD__ALL_TO_ALLV, send, recv, 0, dtype, SHARD_OP_SUM, 0);
    return run_nonblocking(comm, &a, send_counts, send_displs, recv_counts, recv_displs, req);
}

shard_status shard_comm_all_to_allw(shard_comm *comm, const void *send, const shard_block *send_blocks, void *recv,
                                    const shard_block *recv_blocks, shard_dtype dtype) {
    shard__coll_args a = ARGS(SHARD__ALL_TO_ALLW, send, recv, 0, dtype, SHARD_OP_SUM, 0);
    a.send_blocks = send_blocks, a.recv_blocks = recv_blocks;
    return run_blocking(comm, &a, NULL, NULL, NULL, NULL);
}
shard_status shard_comm_iall_to_allw(shard_comm *comm, const void *send, const shard_block *send_blocks, void *recv,
                                     const shard_block *recv_blocks, shard_dtype dtype, shard_request **req) {
    shard__coll_args a = ARGS(SHARD__ALL_TO_ALLW, send, recv, 0, dtype, SHARD_OP_SUM, 0);
    a.send_blocks = send_blocks, a.recv_blocks = recv_blocks;
    return run_nonblocking(comm, &a, NULL, NULL, NULL, NULL, req);
}
