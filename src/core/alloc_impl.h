/* alloc_impl.h — internal side of the accounted allocator: which ledger the
 * calling thread charges.  The launcher gives each rank its own ledger and
 * helper threads (non-blocking collectives) adopt their rank's ledger. */
#ifndef SHARD_ALLOC_IMPL_H
#define SHARD_ALLOC_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "shard/memory.h"

typedef struct shard__mem_ledger {
    _Atomic uint64_t current_bytes[SHARD_MEM_CATEGORY_COUNT];
    _Atomic uint64_t peak_bytes[SHARD_MEM_CATEGORY_COUNT];
    _Atomic uint64_t total_current_bytes;
    _Atomic uint64_t total_peak_bytes;
    _Atomic uint64_t blocks; /* outstanding, zero-byte ones included: a ledger in use has some */
    _Atomic uint64_t window_peak_bytes[SHARD_MEM_CATEGORY_COUNT]; /* since shard__mem_window_reset */
    uint64_t limit_bytes; /* an emulated device's memory: more is refused (0: no limit) */
    char limit_owner[96]; /* who is refused, for the message: "rank 1 on node 'b' (device 3)" */
} shard__mem_ledger;

/* The ledger the calling thread charges (a process-wide one by default). */
shard__mem_ledger *shard__mem_ledger_current(void);

/* Make `ledger` (NULL = the process-wide one) the calling thread's ledger. */
void shard__mem_ledger_adopt(shard__mem_ledger *ledger);

void shard__mem_ledger_init(shard__mem_ledger *ledger);

/* Refuse allocations that would take `ledger` past `limit_bytes` (0: none), naming `owner` (an emulated
 * cluster's device: cluster.h).  Set while the ledger's rank allocates nothing else. */
void shard__mem_ledger_limit(shard__mem_ledger *ledger, uint64_t limit_bytes, const char *owner);

/* Remember why an allocation was refused for an emulated device's memory: the calling thread's next
 * out-of-memory error ends with this text (status.c). */
void shard__error_memory_cause(const char *text);

/* The calling thread's plan mode (the analyzer's dry run of the engine): while on, shard_alloc charges the
 * ledger as usual but maps pages the kernel provides only when written (the untouched ones cost nothing),
 * shard_alloc_zeroed writes nothing (mapped pages are zero), and no allocation is refused for want of
 * memory.  Blocks made in plan mode may be freed after it ends. */
void shard__mem_plan_mode(int on);
int shard__mem_planning(void);

/* A second set of peaks per category that a step restarts (the monitor's per-step figures), leaving
 * the run's peaks (shard_mem_stats) alone: reset to the calling rank's current figures, and read. */
void shard__mem_window_reset(void);
void shard__mem_window_get(uint64_t peak_bytes[SHARD_MEM_CATEGORY_COUNT]);

/* The memory a new allocation can take without swapping: the kernel's MemAvailable, else the physical
 * memory; 0 when neither is known (then nothing is refused for want of it). */
uint64_t shard__mem_available_bytes(void);

/* "12.5 TiB", "512.0 MiB", "100 bytes": a figure to compare by eye with another. */
void shard__mem_bytes_text(double bytes, char *out, size_t out_bytes);

#endif
