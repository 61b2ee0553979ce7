/* precision.c — the bf16 compute copies of f32 master values and their
 * widening (precision.h).  The conversions are shard_bf16_from_f32 /
 * shard_f32_from_bf16's (round to nearest even, NaN kept quiet), written on
 * the bits so the loops vectorise. */
#include "nn/precision.h"

#include "core/simd.h"
#include "shard/memory.h"

typedef uint32_t u32_alias __attribute__((may_alias));

SHARD_VECTOR_CLONES
static void round_to_bf16(const float *in, uint16_t *out, size_t n) {
    const u32_alias *x = (const u32_alias *)in;
    for (size_t i = 0; i < n; i++) {
        uint32_t b = x[i], nearest = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
        out[i] = (uint16_t)((b & 0x7fffffffu) > 0x7f800000u ? (b >> 16) | 0x0040u : nearest);
    }
}

SHARD_VECTOR_CLONES
void shard__precision_widen(const uint16_t *in, float *out, size_t n) {
    u32_alias *o = (u32_alias *)out;
    for (size_t i = 0; i < n; i++) o[i] = (uint32_t)in[i] << 16;
}

shard_status shard__precision_check(shard_dtype compute_dtype) {
    if (compute_dtype == SHARD_F32 || compute_dtype == SHARD_BF16) return SHARD_OK;
    return shard_error(SHARD_ERR_INVALID_ARG, "--compute-dtype %s is invalid: compute copies are f32 or bf16",
                       shard_dtype_name(compute_dtype));
}

shard_status shard__precision_create(shard__precision *p, shard_dtype compute_dtype, size_t n) {
    *p = (shard__precision){0};
    SHARD_CHECK(shard__precision_check(compute_dtype));
    p->bf16 = compute_dtype == SHARD_BF16, p->n = n;
    if (p->bf16 && !(p->copy16 = shard_alloc(n * 2 + 2, SHARD_MEM_PARAMS)))
        return shard_error(SHARD_ERR_NO_MEMORY, "bf16 compute: out of memory for the compute copy (%zu values)", n);
    return SHARD_OK;
}

void shard__precision_destroy(shard__precision *p) {
    shard_free(p->copy16);
    p->copy16 = NULL;
}

void shard__precision_refresh(shard__precision *p, const float *masters, size_t at, size_t n) {
    if (p->bf16) round_to_bf16(masters + at, p->copy16 + at, n);
}

const uint16_t *shard__precision_copy(const shard__precision *p, size_t at) { return p->copy16 + at; }
