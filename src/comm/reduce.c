/* reduce.c — element-wise reduction kernels used by the communicator.
 *
 * Sums run in a fixed rank order so a result is the same bit pattern on every
 * rank and in every run.  bf16 and f16 are combined in f32 and rounded once.
 * Integer sums and products wrap (computed unsigned) instead of overflowing. */
#include <string.h>

#include "comm_impl.h"

#define COMBINE_INT(T, UT, op, a, b)                                                  \
    ((op) == SHARD_OP_MAX   ? ((a) > (b) ? (a) : (b))                                \
     : (op) == SHARD_OP_MIN ? ((a) < (b) ? (a) : (b))                                \
     : (op) == SHARD_OP_PROD ? (T)((UT)(a) * (UT)(b))                                 \
                             : (T)((UT)(a) + (UT)(b)))

#define COMBINE_FLOAT(op, a, b)                                                       \
    ((op) == SHARD_OP_MAX ? ((a) > (b) || (a) != (a) ? (a) : (b))                     \
     : (op) == SHARD_OP_MIN ? ((a) < (b) || (a) != (a) ? (a) : (b))                   \
     : (op) == SHARD_OP_PROD ? (a) * (b)                                              \
                             : (a) + (b))

/* Loops specialised per op so the compiler vectorises the common sum. */
#define REDUCE_MANY_NATIVE(T, COMBINE, DIVIDE)                                        \
    do {                                                                              \
        T *d = dst;                                                                   \
        const T *s0 = srcs[0];                                                        \
        if (nsrc == 2 && op == SHARD_OP_SUM) {                                        \
            const T *s1 = srcs[1];                                                    \
            for (size_t i = 0; i < n; i++) d[i] = COMBINE(SHARD_OP_SUM, s0[i], s1[i]); \
            break;                                                                    \
        }                                                                             \
        for (size_t i = 0; i < n; i++) {                                              \
            T acc = s0[i];                                                            \
            for (int p = 1; p < nsrc; p++) {                                          \
                T v = ((const T *)srcs[p])[i];                                        \
                acc = COMBINE(op, acc, v);                                            \
            }                                                                         \
            d[i] = op == SHARD_OP_AVG ? DIVIDE(acc, nsrc) : acc;                      \
        }                                                                             \
    } while (0)

#define FDIV(x, k) ((x) / (k))
#define IDIV(x, k) ((x) / (k))

static float load16(shard_dtype dtype, uint16_t bits) {
    return dtype == SHARD_BF16 ? shard_f32_from_bf16(bits) : shard_f32_from_f16(bits);
}

static uint16_t store16(shard_dtype dtype, float value) {
    return dtype == SHARD_BF16 ? shard_bf16_from_f32(value) : shard_f16_from_f32(value);
}

#define CI32(op, a, b) COMBINE_INT(int32_t, uint32_t, op, a, b)
#define CI64(op, a, b) COMBINE_INT(int64_t, uint64_t, op, a, b)
#define CI8(op, a, b) COMBINE_INT(int8_t, uint8_t, op, a, b)
#define CU8(op, a, b) COMBINE_INT(uint8_t, uint8_t, op, a, b)

void shard__reduce_many(shard_dtype dtype, shard_reduce_op op, const void *const *srcs, int nsrc,
                        void *dst, size_t n) {
    switch (dtype) {
    case SHARD_F32: REDUCE_MANY_NATIVE(float, COMBINE_FLOAT, FDIV); break;
    case SHARD_F64: REDUCE_MANY_NATIVE(double, COMBINE_FLOAT, FDIV); break;
    case SHARD_I32: REDUCE_MANY_NATIVE(int32_t, CI32, IDIV); break;
    case SHARD_I64: REDUCE_MANY_NATIVE(int64_t, CI64, IDIV); break;
    case SHARD_I8: REDUCE_MANY_NATIVE(int8_t, CI8, IDIV); break;
    case SHARD_U8: REDUCE_MANY_NATIVE(uint8_t, CU8, IDIV); break;
    case SHARD_BF16:
    case SHARD_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            float acc = load16(dtype, ((const uint16_t *)srcs[0])[i]);
            for (int p = 1; p < nsrc; p++) {
                float v = load16(dtype, ((const uint16_t *)srcs[p])[i]);
                acc = COMBINE_FLOAT(op, acc, v);
            }
            if (op == SHARD_OP_AVG) acc /= (float)nsrc;
            d[i] = store16(dtype, acc);
        }
        break;
    }
    default: break;
    }
}

#define REDUCE_PAIR_NATIVE(T, COMBINE)                                                \
    do {                                                                              \
        const T *a = in;                                                              \
        T *b = inout;                                                                 \
        for (size_t i = 0; i < n; i++) b[i] = COMBINE(op, a[i], b[i]);                \
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

#define DIVIDE_NATIVE(T)                                                              \
    do {                                                                              \
        T *b = buf;                                                                   \
        for (size_t i = 0; i < n; i++) b[i] = (T)(b[i] / (T)divisor);                 \
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
