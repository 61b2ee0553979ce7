/* memory.h — the accounted allocator.
 *
 * Every large buffer shard allocates is tagged with a category, and each rank
 * keeps current and peak byte counts per category and in total.  Memory
 * benchmarks (ZeRO, activations) read these figures.  All storage is 64-byte
 * aligned. */
#ifndef SHARD_MEMORY_H
#define SHARD_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shard_mem_category {
    SHARD_MEM_PARAMS = 0,
    SHARD_MEM_GRADS,
    SHARD_MEM_OPTIMIZER,
    SHARD_MEM_ACTIVATIONS,
    SHARD_MEM_COMM,
    SHARD_MEM_OTHER,
    SHARD_MEM_CATEGORY_COUNT
} shard_mem_category;

#define SHARD_ALIGNMENT_BYTES 64

typedef struct shard_mem_stats {
    uint64_t current_bytes[SHARD_MEM_CATEGORY_COUNT];
    uint64_t peak_bytes[SHARD_MEM_CATEGORY_COUNT];
    uint64_t total_current_bytes;
    uint64_t total_peak_bytes; /* peak of the sum, not the sum of peaks */
} shard_mem_stats;

/* Name of a category: "params", "grads", "optimizer", "activations", "comm", "other". */
const char *shard_mem_category_name(shard_mem_category category);

/* Allocate `bytes` (64-byte aligned, uninitialised) charged to `category` of
 * the calling rank.  Returns NULL (with shard_last_error set) on failure.
 * A request of 0 bytes returns a valid unique pointer. */
void *shard_alloc(size_t bytes, shard_mem_category category);

/* Like shard_alloc, zero-filled. */
void *shard_alloc_zeroed(size_t bytes, shard_mem_category category);

/* Release memory from shard_alloc; NULL is ignored. The bytes are credited
 * back to the rank that allocated them, whichever thread frees. */
void shard_free(void *ptr);

/* Snapshot of the calling rank's figures. */
void shard_mem_stats_get(shard_mem_stats *out);

/* Reset the peaks of the calling rank to its current figures. */
void shard_mem_stats_reset_peak(void);

#ifdef __cplusplus
}
#endif
#endif
