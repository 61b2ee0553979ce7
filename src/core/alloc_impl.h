/* alloc_impl.h — internal side of the accounted allocator: which ledger the
 * calling thread charges.  The launcher gives each rank its own ledger and
 * helper threads (non-blocking collectives) adopt their rank's ledger. */
#ifndef SHARD_ALLOC_IMPL_H
#define SHARD_ALLOC_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "shard/memory.h"

typedef struct shard__mem_ledger {
    _Atomic uint64_t current_bytes[SHARD_MEM_CATEGORY_COUNT];
    _Atomic uint64_t peak_bytes[SHARD_MEM_CATEGORY_COUNT];
    _Atomic uint64_t total_current_bytes;
    _Atomic uint64_t total_peak_bytes;
    _Atomic uint64_t blocks; /* outstanding, zero-byte ones included: a ledger in use has some */
} shard__mem_ledger;

/* The ledger the calling thread charges (a process-wide one by default). */
shard__mem_ledger *shard__mem_ledger_current(void);

/* Make `ledger` (NULL = the process-wide one) the calling thread's ledger. */
void shard__mem_ledger_adopt(shard__mem_ledger *ledger);

void shard__mem_ledger_init(shard__mem_ledger *ledger);

#endif
