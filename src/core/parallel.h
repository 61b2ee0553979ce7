/* parallel.h — internal: a parallel-for over the process's cores for the
 * element-wise kernels (LayerNorm, GELU, cross-entropy, AdamW ...).
 *
 * One rank alone in a process owns every core: OpenBLAS spreads each GEMM
 * over them, and between GEMMs these loops would otherwise run on one core
 * while the others wait.  shard_blas_set_threads(n) sets the width here too.
 * Several ranks sharing the process (thread ranks) set it to 1, and a caller
 * that finds the helpers busy runs its chunks itself, so nothing is shared by
 * accident.
 *
 * Work is cut into chunks by its size alone, never by the number of threads,
 * and reductions combine per-chunk partials in chunk order: a result is the
 * same bits on 1 thread or 8.  Matrix products (blas.c) are the exception:
 * they are cut into one block per thread, as cutting by size alone cost
 * 3-5 % of the training step (smaller blocks run OpenBLAS's kernels less
 * well), and OpenBLAS may round a block's elements differently from the
 * whole product's; a product's bits can therefore change with the thread
 * count (ranks that must agree bitwise run the same count: every thread rank
 * runs 1). */
#ifndef SHARD_PARALLEL_H
#define SHARD_PARALLEL_H

#include <stddef.h>

#include "shard/split.h"
#include "shard/status.h"

#define SHARD_MAX_CHUNKS 8

typedef void (*shard__chunk_fn)(void *ctx, size_t chunk, size_t chunks);

/* Threads running chunks (1: the caller alone). */
void shard__parallel_set_threads(int threads);
int shard__parallel_threads(void);

/* Chunks for `work` elements: 1 below `grain`, up to SHARD_MAX_CHUNKS. */
size_t shard__chunks_for(size_t work, size_t grain);

/* fn(ctx, c, chunks) for every c in 0..chunks-1, spread over the threads; returns when all are done.
 * Called from inside a region's chunk it runs the chunks there, one after another. */
void shard__parallel_for(size_t chunks, shard__chunk_fn fn, void *ctx);

/* Whether this thread is running a region's chunk (work it starts would run on it alone). */
int shard__parallel_inside(void);

/* A chunk's outcome for the caller.  Errors are per thread: a failed chunk keeps the message of the
 * thread that ran it, and the caller raises it again on its own. */
typedef struct shard__chunk_result {
    shard_status status;
    char error[256];
} shard__chunk_result;

/* Record s in r, with this thread's last error when s failed. */
void shard__chunk_result_set(shard__chunk_result *r, shard_status s);
/* The first failure among results[0..n-1] raised on the calling thread (its status), or SHARD_OK. */
shard_status shard__chunk_results_raise(const shard__chunk_result *results, size_t n);

/* [first, first + count) of n items cut in `chunks` (the first n % chunks one larger). */
static inline void shard__chunk_range(size_t n, size_t chunks, size_t chunk, size_t *first, size_t *count) {
    shard_split_even(n, chunks, chunk, first, count);
}

#endif
