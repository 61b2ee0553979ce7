/* reduce.c — element-wise reduction kernels used by the communicator.
 *
 * Sums run in a fixed rank order so a result is the same bit pattern on every
 * rank and in every run.  bf16 and f16 are combined in f32 and rounded once.
 * Integer sums and products wrap (computed unsigned) instead of overflowing. */
#include <string.h>

#include "comm_impl.h"

#define COMBINE_INT(T, UT, op, a, b)                                                                                   \
    ((op) == SHARD_OP_MAX        ? ((a) > (b) ? (a) : (b))                                                             \
         : (op) == SHARD_OP_MIN  ? ((a) < (b) ? (a) : (b))                                                             \
         : (op) == SHARD_OP_PROD ? (T)((UT)(a) * (UT)(b))                                                              \
                                 : (T)((UT)(a) + (UT)(b)))

#define COMBINE_FLOAT(op, a, b)                                                                                        \
    ((op) == SHARD_OP_MAX        ? ((a) > (b) || (a) != (a) ? (a) : (b))                                               \
         : (op) == SHARD_OP_MIN  ? ((a) < (b) || (a) != (a) ? (a) : (b))                                               \
         : (op) == SHARD_OP_PROD ? (a) * (b)                                                                           \
                                 : (a) + (b))

/* acc[i] = op(acc[i], src[i]); the op is chosen outside the loop so each loop vectorises. */
#define DEFINE_COMBINE(NAME, T, COMBINE)                                                                               \
    static void NAME(shard_reduce_op op, T *restrict acc, const T *restrict src, size_t m) {                           \
        switch (op) {                                                                                                  \
        case SHARD_OP_PROD:                                                                                            \
            for (size_t i = 0; i < m; i++) acc[i] = COMBINE(SHARD_OP_PROD, acc[i], src[i]);                            \
            break;                                                                                                     \
        case SHARD_OP_MAX:                                                                                             \
            for (size_t i = 0; i < m; i++) acc[i] = COMBINE(SHARD_OP_MAX, acc[i], src[i]);                             \
            break;                                                                                                     \
        case SHARD_OP_MIN:                                                                                             \
            for (size_t i = 0; i < m; i++) acc[i] = COMBINE(SHARD_OP_MIN, acc[i], src[i]);                             \
            break;                                                                                                     \
        default: /* SUM, and AVG before its division */                                                                \
            for (size_t i = 0; i < m; i++) acc[i] = COMBINE(SHARD_OP_SUM, acc[i], src[i]);                             \
        }                                                                                                              \
    }

#define CI32(op, a, b) COMBINE_INT(int32_t, uint32_t, op, a, b)
#define CI64(op, a, b) COMBINE_INT(int64_t, uint64_t, op, a, b)
#define CI8(op, a, b) COMBINE_INT(int8_t, uint8_t, op, a, b)
#define CU8(op, a, b) COMBINE_INT(uint8_t, uint8_t, op, a, b)

DEFINE_COMBINE(combine_f32, float, COMBINE_FLOAT)
DEFINE_COMBINE(combine_f64, double, COMBINE_FLOAT)
DEFINE_COMBINE(combine_i32, int32_t, CI32)
DEFINE_COMBINE(combine_i64, int64_t, CI64)
DEFINE_COMBINE(combine_i8, int8_t, CI8)
DEFINE_COMBINE(combine_u8, uint8_t, CU8)

static float load16(shard_dtype dtype, uint16_t bits) {
    return dtype == SHARD_BF16 ? shard_f32_from_bf16(bits) : shard_f32_from_f16(bits);
}

static uint16_t store16(shard_dtype dtype, float value) {
    return dtype == SHARD_BF16 ? shard_bf16_from_f32(value) : shard_f16_from_f32(value);
}

enum { BLOCK = 1024 }; /* elements per pass: the accumulator stays in L1 */

/* One dtype: accumulate a block of every source into a local buffer in rank
 * order, divide for AVG, then write the block (dst may alias a source). */
#define REDUCE_BLOCKS(T, COMBINE_FN)                                                                                   \
    do {                                                                                                               \
        T acc[BLOCK];                                                                                                  \
        for (size_t base = 0; base < n; base += BLOCK) {                                                               \
            size_t m = n - base < BLOCK ? n - base : BLOCK;                                                            \
            memcpy(acc, (const T *)srcs[0] + base, m * sizeof(T));                                                     \
            for (int p = 1; p < nsrc; p++) COMBINE_FN(op, acc, (const T *)srcs[p] + base, m);                          \
            if (op == SHARD_OP_AVG)                                                                                    \
                for (size_t i = 0; i < m; i++) acc[i] = (T)(acc[i] / nsrc);                                            \
            memcpy((T *)dst + base, acc, m * sizeof(T));                                                               \
        }                                                                                                              \
    } while (0)

void shard__reduce_many(shard_dtype dtype, shard_reduce_op op, const void *const *srcs, int nsrc, void *dst, size_t n) {
    if (dtype == SHARD_F32 && op == SHARD_OP_SUM && nsrc == 2) { /* the hot case: one pass */
        const float *a = srcs[0], *b = srcs[1];
        float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = a[i] + b[i];
        return;
    }
    switch (dtype) {
    case SHARD_F32: REDUCE_BLOCKS(float, combine_f32); break;
    case SHARD_F64: REDUCE_BLOCKS(double, combine_f64); break;
    case SHARD_I32: REDUCE_BLOCKS(int32_t, combine_i32); break;
    case SHARD_I64: REDUCE_BLOCKS(int64_t, combine_i64); break;
    case SHARD_I8: REDUCE_BLOCKS(int8_t, combine_i8); break;
    case SHARD_U8: REDUCE_BLOCKS(uint8_t, combine_u8); break;
    case SHARD_BF16:
    case SHARD_F16: {
        float acc[BLOCK], val[BLOCK];
        for (size_t base = 0; base < n; base += BLOCK) {
            size_t m = n - base < BLOCK ? n - base : BLOCK;
            const uint16_t *s0 = (const uint16_t *)srcs[0] + base;
            for (size_t i = 0; i < m; i++) acc[i] = load16(dtype, s0[i]);
            for (int p = 1; p < nsrc; p++) {
                const uint16_t *sp = (const uint16_t *)srcs[p] + base;
                for (size_t i = 0; i < m; i++) val[i] = load16(dtype, sp[i]);
                combine_f32(op, acc, val, m);
            }
            if (op == SHARD_OP_AVG)
                for (size_t i = 0; i < m; i++) acc[i] /= (float)nsrc;
            uint16_t *d = (uint16_t *)dst + base;
            for (size_t i = 0; i < m; i++) d[i] = store16(dtype, acc[i]);
        }
        break;
    }
    default: break;
    }
}

#define REDUCE_PAIR_NATIVE(T, COMBINE)                                                                                 \
    do {                                                                                                               \
        const T *a = in;                                                                                               \
        T *b = inout;                                                                                                  \
        for (size_t i = 0; i < n; i++) b[i] = COMBINE(op, a[i], b[i]);                                                 \
    } while (0)

void shard__reduce_pair(shard_dtype dtype, shard_reduce_op op, const void *in, void *inout, size_t n) {
    if (op == SHARD_OP_AVG) op = SHARD_OP_SUM;
    switch (dtype) {
    case SHARD_F32: REDUCE_PAIR_NATIVE(float, COMBINE_FLOAT); break;
    case SHARD_F64: REDUCE_PAIR_NATIVE(double, COMBINE_FLOAT); break;
    case SHARD_I32: REDUCE_PAIR_NATIVE(int32_t, CI32); break;
    case SHARD_I64: REDUCE_PAIR_NATIVE(int64_t, CI64); break;
    case SHARD_I8: REDUCE_PAIR_NATIVE(int8_t, CI8); break;
    case SHARD_U8: REDUCE_PAIR_NATIVE(uint8_t, CU8); break;
    case SHARD_BF16:
    case SHARD_F16: {
        const uint16_t *a = in;
        uint16_t *b = inout;
        for (size_t i = 0; i < n; i++) {
            float x = load16(dtype, a[i]), y = load16(dtype, b[i]);
            b[i] = store16(dtype, COMBINE_FLOAT(op, x, y));
        }
        break;
    }
    default: break;
    }
}

#define DIVIDE_NATIVE(T)                                                                                               \
    do {                                                                                                               \
        T *b = buf;                                                                                                    \
        for (size_t i = 0; i < n; i++) b[i] = (T)(b[i] / (T)divisor);                                                  \
    } while (0)

void shard__divide(shard_dtype dtype, void *buf, size_t n, int divisor) {
    switch (dtype) {
    case SHARD_F32: DIVIDE_NATIVE(float); break;
    case SHARD_F64: DIVIDE_NATIVE(double); break;
    case SHARD_I32: DIVIDE_NATIVE(int32_t); break;
    case SHARD_I64: DIVIDE_NATIVE(int64_t); break;
    case SHARD_I8: {
        int8_t *b = buf;
        for (size_t i = 0; i < n; i++) b[i] = (int8_t)(b[i] / divisor);
        break;
    }
    case SHARD_U8: {
        uint8_t *b = buf;
        for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(b[i] / divisor);
        break;
    }
    case SHARD_BF16:
    case SHARD_F16: {
        uint16_t *b = buf;
        for (size_t i = 0; i < n; i++) b[i] = store16(dtype, load16(dtype, b[i]) / (float)divisor);
        break;
    }
    default: break;
    }
}
