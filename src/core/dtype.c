/* dtype.c — dtype names and sizes, and bf16 / f16 <-> f32 conversion.
 *
 * Conversions to 16 bits round to nearest, ties to even, keep NaN a NaN and
 * handle f16 subnormals, so the same value converts the same way on every rank. */
#include "shard/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int is_float;
} dtype_info[SHARD_DTYPE_COUNT] = {
    [SHARD_F32] = {"f32", 4, 1}, [SHARD_F64] = {"f64", 8, 1}, [SHARD_BF16] = {"bf16", 2, 1},
    [SHARD_F16] = {"f16", 2, 1}, [SHARD_I8] = {"i8", 1, 0},   [SHARD_I32] = {"i32", 4, 0},
    [SHARD_I64] = {"i64", 8, 0}, [SHARD_U8] = {"u8", 1, 0},
};

static int valid(shard_dtype d) { return (int)d >= 0 && d < SHARD_DTYPE_COUNT; }

size_t shard_dtype_size(shard_dtype dtype) { return valid(dtype) ? dtype_info[dtype].size : 0; }

const char *shard_dtype_name(shard_dtype dtype) { return valid(dtype) ? dtype_info[dtype].name : "invalid"; }

int shard_dtype_is_float(shard_dtype dtype) { return valid(dtype) && dtype_info[dtype].is_float; }

shard_status shard_dtype_parse(const char *name, shard_dtype *out) {
    for (int d = 0; d < SHARD_DTYPE_COUNT; d++) {
        if (name && strcmp(name, dtype_info[d].name) == 0) {
            *out = (shard_dtype)d;
            return SHARD_OK;
        }
    }
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "unknown dtype '%s': valid dtypes are f32, f64, bf16, f16, i8, i32, i64, u8",
                       name ? name : "(null)");
}

uint16_t shard_bf16_from_f32(float value) {
    uint32_t x;
    memcpy(&x, &value, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float shard_f32_from_bf16(uint16_t bits) {
    uint32_t x = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t shard_f16_from_f32(float value) {
    uint32_t x;
    memcpy(&x, &value, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exponent = (x >> 23) & 0xffu;
    uint32_t mantissa = x & 0x7fffffu;
    if (exponent == 0xffu) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x0200u | (mantissa >> 13) : 0u));
    int e = (int)exponent - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow: infinity */
    if (e <= 0) {                                   /* f16 subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        mantissa |= 0x800000u;
        int shift = 14 - e;
        uint32_t half = mantissa >> shift;
        uint32_t rest = mantissa & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (mantissa >> 13);
    uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) half++; /* may carry into inf: right */
    return (uint16_t)half;
}

float shard_f32_from_f16(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    uint32_t x;
    if (exponent == 0) {
        if (mantissa == 0) {
            x = sign;
        } else { /* subnormal: normalise */
            int shifts = 0;
            while (!(mantissa & 0x400u)) {
                mantissa <<= 1;
                shifts++;
            }
            mantissa &= 0x3ffu;
            x = sign | ((uint32_t)(113 - shifts) << 23) | (mantissa << 13);
        }
    } else if (exponent == 31) {
        x = sign | 0x7f800000u | (mantissa << 13);
    } else {
        x = sign | ((exponent + 112) << 23) | (mantissa << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
