/* flops.c — see flops.h: per-rank GEMM FLOP counts by phase. */
#include "core/flops.h"

static _Thread_local shard__flops own;
static _Thread_local shard__flops *adopted;

shard__flops *shard__flops_current(void) { return adopted ? adopted : &own; }

void shard__flops_adopt(shard__flops *sink) { adopted = sink; }

void shard__flops_add(double flops) {
    shard__flops *f = shard__flops_current();
    int p = atomic_load_explicit(&f->phase, memory_order_relaxed);
    atomic_fetch_add_explicit(&f->by_phase[p], (uint64_t)flops, memory_order_relaxed);
}

int shard__flops_phase(int phase) {
    if (phase < 0 || phase >= SHARD__PHASE_COUNT) phase = SHARD__PHASE_OTHER;
    return atomic_exchange(&shard__flops_current()->phase, phase);
}

void shard__flops_read(uint64_t out[SHARD__PHASE_COUNT]) {
    shard__flops *f = shard__flops_current();
    for (int p = 0; p < SHARD__PHASE_COUNT; p++) out[p] = atomic_load(&f->by_phase[p]);
}

void shard__flops_reset(void) {
    shard__flops *f = shard__flops_current();
    for (int p = 0; p < SHARD__PHASE_COUNT; p++) atomic_store(&f->by_phase[p], 0);
}
