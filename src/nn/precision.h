/* precision.h — internal: the precision policy of a strategy's values.  The
 * f32 values (and the optimizer's state) are the master copy; with a bf16
 * compute dtype, forward and backward read a bf16 compute copy of them,
 * widened into f32 buffers while a unit is acquired, since the GEMMs here are
 * f32 (Debian's OpenBLAS has no bf16 GEMM): the arithmetic of bf16 inputs
 * with f32 accumulation, the memory of bf16 copies.  The strategy decides
 * what the copy mirrors (the whole values, or this rank's pieces under
 * ZeRO-3, all-gathered in bf16) and when it is refreshed (after every
 * update, and where values are set). */
#ifndef SHARD_PRECISION_H
#define SHARD_PRECISION_H

#include <stddef.h>
#include <stdint.h>

#include "shard/dtype.h"
#include "shard/status.h"

typedef struct shard__precision {
    int bf16;         /* compute copies are bf16; else the model reads the f32 masters */
    size_t n;         /* elements the copy mirrors */
    uint16_t *copy16; /* bf16: the compute copy, n elements */
} shard__precision;

/* compute_dtype f32 or bf16; another is refused by name. */
shard_status shard__precision_check(shard_dtype compute_dtype);
/* The policy of compute_dtype (checked) over n master elements: with bf16 its copy (not yet filled). */
shard_status shard__precision_create(shard__precision *p, shard_dtype compute_dtype, size_t n);
void shard__precision_destroy(shard__precision *p);
/* The compute copy of masters[at .. at + n) (masters in the copy's layout); nothing for f32. */
void shard__precision_refresh(shard__precision *p, const float *masters, size_t at, size_t n);
/* The copy from element at: what a unit's widening or a ZeRO-3 all_gather reads. */
const uint16_t *shard__precision_copy(const shard__precision *p, size_t at);
/* f32 compute values from bf16 ones (exact). */
void shard__precision_widen(const uint16_t *in, float *out, size_t n);

#endif
