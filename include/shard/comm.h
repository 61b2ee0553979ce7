/* comm.h — the communicator: point-to-point messages and collectives between
 * ranks, with deadlines, sequence numbers and cross-rank argument checks.
 *
 * One API, several backends (threads in one process, MPI processes).  Every
 * call returns a shard_status; on failure shard_last_error() says what, where
 * and why, e.g.
 *   timeout after 300 s in all_reduce #1042 on comm 'world': ranks 3,5 never entered it
 *
 * Conventions (as MPI and NCCL):
 *  - counts are element counts of `dtype`;
 *  - a collective is in place when the send pointer equals the natural place
 *    of this rank's data in the receive buffer: all_reduce / all_to_all(v):
 *    send == recv; all_gather(v): send == recv + displ[rank]; reduce_scatter(v):
 *    recv == send + displ[rank] (the input is the whole send buffer);
 *  - v-forms take one count (and displacement) per rank; displacements may be
 *    NULL, meaning the blocks are packed in rank order;
 *  - non-blocking forms (`shard_comm_i...`) return a request; the buffers and
 *    count arrays must stay untouched until shard_request_wait/test says done.
 *    Requests may be completed in any order. */
#ifndef SHARD_COMM_H
#define SHARD_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "shard/dtype.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_comm shard_comm;
typedef struct shard_request shard_request;

typedef enum shard_reduce_op {
    SHARD_OP_SUM = 0,
    SHARD_OP_PROD,
    SHARD_OP_MAX,
    SHARD_OP_MIN,
    SHARD_OP_AVG, /* sum / size; integers: the (wrapping) sum divided, truncated toward zero, as NCCL's ncclAvg */
    SHARD_OP_COUNT
} shard_reduce_op;

const char *shard_reduce_op_name(shard_reduce_op op);
shard_status shard_reduce_op_parse(const char *name, shard_reduce_op *out);

/* ---- identity and settings ---- */
int shard_comm_rank(const shard_comm *comm);
int shard_comm_size(const shard_comm *comm);
const char *shard_comm_name(const shard_comm *comm);    /* "world", or a mesh axis */
const char *shard_comm_backend(const shard_comm *comm); /* "threads" or "mpi" */
/* Settings: refused while requests made on this communicator are pending. */
shard_status shard_comm_set_name(shard_comm *comm, const char *name);
/* Deadline of every blocking wait on this communicator, in seconds (> 0). */
shard_status shard_comm_set_timeout(shard_comm *comm, double seconds);
double shard_comm_timeout(const shard_comm *comm);
/* Bytes this rank has sent to other ranks on this communicator (the
 * bandwidth-optimal algorithm's share; used to check traffic formulas). */
uint64_t shard_comm_bytes_sent(const shard_comm *comm);
/* Collectives started on this communicator so far (the next one is #n+1). */
uint64_t shard_comm_collective_count(const shard_comm *comm);
/* A benchmark's baseline: `op` ("all_reduce", "all_gather", "reduce_scatter", "all_to_all" or
 * "sendrecv" to the next rank, sums for the reductions) as one raw MPI call on this communicator, with
 * none of the engine's checks or deadlines.  count_per_rank elements of dtype per rank.  Fails with
 * SHARD_ERR_UNSUPPORTED on another backend or a build without MPI. */
shard_status shard_comm_mpi_raw(shard_comm *comm, const char *op, const void *send, void *recv, size_t count_per_rank,
                                shard_dtype dtype);

/* New communicator of the ranks that pass the same color, ordered by (key,
 * rank).  Collective over `comm`.  color < 0 means "not a member": *out = NULL. */
shard_status shard_comm_split(shard_comm *comm, int color, int key, shard_comm **out);
/* Release this rank's handle (local, not collective).  Refused, with
 * SHARD_ERR_INVALID_ARG, while requests made on it have not been waited on. */
shard_status shard_comm_destroy(shard_comm *comm);
/* Fail the whole job: every rank's pending and future calls return
 * SHARD_ERR_ABORTED naming this rank and `reason`.  On MPI this ends the job. */
void shard_comm_abort(shard_comm *comm, shard_status status, const char *reason);

/* ---- point to point (tags >= 0; messages between a pair with one tag arrive in order) ---- */
shard_status shard_comm_send(shard_comm *comm, const void *buf, size_t count, shard_dtype dtype, int dst, int tag);
shard_status shard_comm_recv(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int src, int tag);
shard_status shard_comm_isend(shard_comm *comm, const void *buf, size_t count, shard_dtype dtype, int dst, int tag,
                              shard_request **req);
shard_status shard_comm_irecv(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int src, int tag,
                              shard_request **req);

/* ---- requests ---- */
/* Block until done (or the deadline), free the request and set *req = NULL. */
shard_status shard_request_wait(shard_request **req);
/* *done = 1 when complete; the request is then freed and *req set to NULL. */
shard_status shard_request_test(shard_request **req, int *done);
/* Wait for all; returns the first failure (every request is still completed or freed). */
shard_status shard_request_wait_all(size_t n, shard_request **reqs);

/* ---- collectives ---- */
shard_status shard_comm_barrier(shard_comm *comm);
shard_status shard_comm_broadcast(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int root);
shard_status shard_comm_all_reduce(shard_comm *comm, const void *send, void *recv, size_t count, shard_dtype dtype,
                                   shard_reduce_op op);
/* send holds size * recv_count elements; rank r receives block r, reduced. */
shard_status shard_comm_reduce_scatter(shard_comm *comm, const void *send, void *recv, size_t recv_count,
                                       shard_dtype dtype, shard_reduce_op op);
/* recv holds size * send_count elements, rank r's block at r * send_count. */
shard_status shard_comm_all_gather(shard_comm *comm, const void *send, void *recv, size_t send_count,
                                   shard_dtype dtype);
/* send and recv hold size * count_per_rank elements; block q of send goes to rank q. */
shard_status shard_comm_all_to_all(shard_comm *comm, const void *send, void *recv, size_t count_per_rank,
                                   shard_dtype dtype);
shard_status shard_comm_all_gatherv(shard_comm *comm, const void *send, size_t send_count, void *recv,
                                    const size_t *recv_counts, const size_t *recv_displs, shard_dtype dtype);
/* send holds sum(recv_counts) elements, block r (packed in rank order) reduced onto rank r. */
shard_status shard_comm_reduce_scatterv(shard_comm *comm, const void *send, void *recv, const size_t *recv_counts,
                                        shard_dtype dtype, shard_reduce_op op);
shard_status shard_comm_all_to_allv(shard_comm *comm, const void *send, const size_t *send_counts,
                                    const size_t *send_displs, void *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, shard_dtype dtype);

/* A strided block of a buffer, as MPI's vector type: `rows` runs of `row_len`
 * elements, the first at element `offset`, each `stride` elements after the
 * previous one (stride >= row_len when rows > 1).  rows or row_len 0: empty. */
typedef struct shard_block {
    size_t offset, rows, row_len, stride;
} shard_block;

/* all_to_all of strided blocks (MPI_Alltoallw with vector types): block q of
 * `send` goes to rank q, into its block for this rank in `recv`.  The two
 * sides may cut a block into rows differently; only the element counts
 * (rows x row_len) must agree.  Saves packing a sub-block of a tensor.  Not
 * in place: send and recv must be different buffers. */
shard_status shard_comm_all_to_allw(shard_comm *comm, const void *send, const shard_block *send_blocks, void *recv,
                                    const shard_block *recv_blocks, shard_dtype dtype);

/* ---- non-blocking collectives: same arguments, plus the request ---- */
shard_status shard_comm_ibarrier(shard_comm *comm, shard_request **req);
shard_status shard_comm_ibroadcast(shard_comm *comm, void *buf, size_t count, shard_dtype dtype, int root,
                                   shard_request **req);
shard_status shard_comm_iall_reduce(shard_comm *comm, const void *send, void *recv, size_t count, shard_dtype dtype,
                                    shard_reduce_op op, shard_request **req);
shard_status shard_comm_ireduce_scatter(shard_comm *comm, const void *send, void *recv, size_t recv_count,
                                        shard_dtype dtype, shard_reduce_op op, shard_request **req);
shard_status shard_comm_iall_gather(shard_comm *comm, const void *send, void *recv, size_t send_count,
                                    shard_dtype dtype, shard_request **req);
shard_status shard_comm_iall_to_all(shard_comm *comm, const void *send, void *recv, size_t count_per_rank,
                                    shard_dtype dtype, shard_request **req);
shard_status shard_comm_iall_gatherv(shard_comm *comm, const void *send, size_t send_count, void *recv,
                                     const size_t *recv_counts, const size_t *recv_displs, shard_dtype dtype,
                                     shard_request **req);
shard_status shard_comm_ireduce_scatterv(shard_comm *comm, const void *send, void *recv, const size_t *recv_counts,
                                         shard_dtype dtype, shard_reduce_op op, shard_request **req);
shard_status shard_comm_iall_to_allv(shard_comm *comm, const void *send, const size_t *send_counts,
                                     const size_t *send_displs, void *recv, const size_t *recv_counts,
                                     const size_t *recv_displs, shard_dtype dtype, shard_request **req);
shard_status shard_comm_iall_to_allw(shard_comm *comm, const void *send, const shard_block *send_blocks, void *recv,
                                     const shard_block *recv_blocks, shard_dtype dtype, shard_request **req);

#ifdef __cplusplus
}
#endif
#endif
