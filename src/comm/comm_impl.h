/* comm_impl.h — the private side of the communicator: the backend vtable, the
 * normalised description of a collective that the public wrapper hands to a
 * backend, and helpers shared by backends (deadlines, reductions, messages).
 *
 * The wrapper (comm.c) checks arguments, assigns sequence numbers, counts
 * bytes and fills counts/displacements once; backends only move data. */
#ifndef SHARD_COMM_IMPL_H
#define SHARD_COMM_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "shard/comm.h"
#include "shard/split.h"

typedef enum shard__coll_kind {
    SHARD__BARRIER = 0,
    SHARD__BROADCAST,
    SHARD__ALL_REDUCE,
    SHARD__REDUCE_SCATTER,
    SHARD__ALL_GATHER,
    SHARD__ALL_TO_ALL,
    SHARD__ALL_GATHERV,
    SHARD__REDUCE_SCATTERV,
    SHARD__ALL_TO_ALLV,
    SHARD__ALL_TO_ALLW,
    SHARD__COLL_KIND_COUNT
} shard__coll_kind;

const char *shard__coll_kind_name(shard__coll_kind kind);

/* One collective as every backend sees it.  For every kind except barrier,
 * broadcast and all_reduce the wrapper fills the four per-rank arrays
 * (element counts and displacements; `size` entries each, owned by the args):
 *   all_gather(v):     recv_counts/recv_displs = blocks of recv; send_counts[0] = own count
 *   reduce_scatter(v): recv_counts/recv_displs = blocks of send (block r lands in recv)
 *   all_to_all(v):     all four, as MPI_Alltoallv;
 *   all_to_allw:       all four (counts = rows x row_len, displacements = the
 *                      blocks' offsets) plus the row lengths and strides. */
typedef struct shard__coll_args {
    shard__coll_kind kind;
    const void *send;
    void *recv;
    size_t count; /* broadcast / all_reduce: elements; fixed-size forms: per-rank block */
    shard_dtype dtype;
    shard_reduce_op op;
    int root;
    int in_place;
    uint64_t seq; /* 1-based sequence number of this collective on its communicator */
    size_t *send_counts, *send_displs, *recv_counts, *recv_displs;
    size_t *send_row_len, *send_stride, *recv_row_len, *recv_stride; /* all_to_allw only */
    const shard_block *send_blocks, *recv_blocks;                    /* the caller's, read while preparing only */
} shard__coll_args;

typedef struct shard__comm_vtable {
    const char *name;
    /* required */
    shard_status (*collective)(shard_comm *comm, shard__coll_args *args);
    shard_status (*isend)(shard_comm *comm, const void *buf, size_t bytes, int dst, int tag, uint64_t seq,
                          shard_request *req);
    shard_status (*irecv)(shard_comm *comm, void *buf, size_t bytes, int src, int tag, uint64_t seq,
                          shard_request *req);
    shard_status (*request_test)(shard_request *req, int *done);
    shard_status (*request_wait)(shard_request *req);
    shard_status (*split)(shard_comm *comm, int color, int key, shard_comm **out);
    void (*destroy)(shard_comm *comm);
    void (*abort)(shard_comm *comm, shard_status status, const char *reason);
    /* optional: without it the wrapper runs the blocking collective at once
     * and hands back a completed request */
    shard_status (*icollective)(shard_comm *comm, shard__coll_args *args, shard_request *req);
    /* optional: release backend state of a request */
    void (*request_release)(shard_request *req);
    /* optional: a split whose group the caller knows (its size and this rank's place); without it
     * shard__comm_split_sized runs `split` */
    shard_status (*split_sized)(shard_comm *comm, int color, int key, int size, int rank, shard_comm **out);
} shard__comm_vtable;

/* Every backend's communicator starts with this header. */
struct shard_comm {
    const shard__comm_vtable *vt;
    int rank;
    int size;
    char name[64];
    double timeout_seconds;
    uint64_t coll_seq; /* collectives started on this handle */
    uint64_t p2p_seq;  /* point-to-point operations started */
    _Atomic uint64_t bytes_sent;
    _Atomic int64_t outstanding; /* requests created and not yet waited on */
    struct shard__emu_comm *emu; /* an emulated cluster's view of it (emulate.c); NULL without one */
};

typedef enum shard__request_kind { SHARD__REQ_SEND, SHARD__REQ_RECV, SHARD__REQ_COLL } shard__request_kind;

/* Requests are allocated by the wrapper; backends keep their state in `impl`
 * (or embed it by allocating more: backend_bytes trailing bytes). */
struct shard_request {
    shard_comm *comm;
    shard__request_kind kind;
    shard__coll_args coll; /* for collectives: the args (owning the count arrays) */
    void *impl;            /* backend state */
    _Atomic int done;      /* set by the backend when complete */
    shard_status status;   /* result, valid once done */
    char error[512];       /* error text when status < 0 (the thread that failed may differ) */
    /* the step monitor's (monitor_impl.h), set at the start when a step is being measured: mon_t0 > 0 */
    double mon_t0;
    uint64_t mon_bytes;
    const char *mon_cat;
    double emu_deadline; /* an emulated cluster's: the wait ends no earlier (0: none) */
};

/* The block of rank r when `count` elements are split over n ranks: the first
 * count % n ranks get one more (10 over 4 -> 3,3,2,2). */
static inline void shard__split_range(size_t count, int n, int r, size_t *offset, size_t *length) {
    shard_split_even(count, (size_t)n, (size_t)r, offset, length);
}

/* Copy `count` elements from a strided source to a strided destination
 * (row lengths and strides in elements; the two sides may cut rows
 * differently), one contiguous piece at a time through `copy`. */
void shard__copy_strided(void *dst, size_t dst_row_len, size_t dst_stride, const void *src, size_t src_row_len,
                         size_t src_stride, size_t count, size_t elem_size,
                         void (*copy)(void *dst, const void *src, size_t bytes));

/* The bytes this rank sends in collective `a` under the bandwidth-optimal algorithm (what
 * shard_comm_bytes_sent adds up). */
uint64_t shard__coll_bytes_sent(const shard_comm *comm, const shard__coll_args *a);

/* shard_comm_split for a caller that knows the new group: `size` ranks share `color`, and this rank is
 * `rank` among them (the order of `key`).  A real backend splits as usual; a plan communicator, which
 * cannot see the others' colours, takes the caller's word. */
shard_status shard__comm_split_sized(shard_comm *comm, int color, int key, int size, int rank, shard_comm **out);

/* Initialise the common header of a backend communicator. */
void shard__comm_init_header(shard_comm *comm, const shard__comm_vtable *vt, int rank, int size, const char *name,
                             double timeout_seconds);

/* Destroy even with requests outstanding (a failed rank's cleanup): the
 * backend stops using them; their memory is abandoned. */
void shard__comm_destroy_force(shard_comm *comm);

/* Monotonic clock in seconds. */
double shard__now(void);

/* "3", "3,5", "0-6" style list of the ranks with flag[r] != 0 ("none" if empty). */
void shard__format_rank_list(const int *flag, int n, char *out, size_t out_bytes);

/* Text of a collective for messages: "all_reduce f32 x1024", plus " op max" / " root 2"
 * when `other` (the collective it is compared with; NULL: always) differs there. */
/* "rank R failed: REASON", naming the communicator when it is not the world (a sub-communicator's rank
 * is not the world's): the line an abort leaves on every backend. */
void shard__abort_text(const shard_comm *comm, const char *reason, char *out, size_t out_bytes);
void shard__describe_coll(const shard__coll_args *a, const shard__coll_args *other, char *out, size_t out_bytes);

/* Compare two ranks' descriptions; 0 if they agree.  Fills `why` on mismatch. */
int shard__coll_args_differ(const shard__coll_args *a, const shard__coll_args *b, int size);

/* ---- reduction kernels (reduce.c) ---- */
/* dst[i] = op over p of srcs[p][i] for i < n, in rank order p = 0..nsrc-1 (deterministic);
 * AVG divides by nsrc.  dst may alias any source. */
void shard__reduce_many(shard_dtype dtype, shard_reduce_op op, const void *const *srcs, int nsrc, void *dst, size_t n);
/* inout[i] = op(in[i], inout[i]); AVG combines as SUM (divide afterwards). */
void shard__reduce_pair(shard_dtype dtype, shard_reduce_op op, const void *in, void *inout, size_t n);
/* buf[i] /= divisor (AVG after a SUM). */
void shard__divide(shard_dtype dtype, void *buf, size_t n, int divisor);

/* ---- backends ---- */
/* MPI: 1 if started by a launcher. */
shard_status shard__mpi_world(shard_comm **out, int verbose, double timeout_seconds);
int shard__mpi_built(void);
/* Time the raw MPI call for a benchmark baseline (MPI backend only). */
shard_status shard__mpi_raw_op(shard_comm *comm, const char *op, const void *send, void *recv, size_t count_per_rank,
                               shard_dtype dtype);
void shard__mpi_finalize_at_exit(void);

#endif
