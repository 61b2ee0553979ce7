/* flops.h — the FLOPs a rank's GEMMs perform, by the phase of the step it is in (the analyzer's count of
 * a step's work, and a basis for utilisation figures).  A rank's sink is its thread's own; the kernel
 * threads of a parallel region add to the sink of the thread that opened it (parallel.c hands it over). */
#ifndef SHARD_FLOPS_H
#define SHARD_FLOPS_H

#include <stdatomic.h>
#include <stdint.h>

typedef enum shard__phase {
    SHARD__PHASE_OTHER = 0, /* the optimizer, a loss outside a model's forward, anything unmarked */
    SHARD__PHASE_FORWARD,
    SHARD__PHASE_BACKWARD,
    SHARD__PHASE_RECOMPUTE, /* a forward run again for its backward (a pipeline's recompute) */
    SHARD__PHASE_COUNT
} shard__phase;

typedef struct shard__flops {
    _Atomic uint64_t by_phase[SHARD__PHASE_COUNT];
    _Atomic int phase;
} shard__flops;

/* The sink the calling thread adds to; adopt another (NULL: the thread's own) for a region's work. */
shard__flops *shard__flops_current(void);
void shard__flops_adopt(shard__flops *sink);

/* Add a GEMM's 2 x M x N x K to the current sink's phase. */
void shard__flops_add(double flops);

/* Set the current sink's phase; returns the one it replaces (to put back). */
int shard__flops_phase(int phase);

/* The current sink's counts since its last reset, and their reset. */
void shard__flops_read(uint64_t out[SHARD__PHASE_COUNT]);
void shard__flops_reset(void);

#endif
