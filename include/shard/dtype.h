/* dtype.h — element types shared by tensors and the communicator, and the
 * conversions between the 16-bit float formats and f32 (round to nearest even). */
#ifndef SHARD_DTYPE_H
#define SHARD_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shard_dtype {
    SHARD_F32 = 0,
    SHARD_F64,
    SHARD_BF16,
    SHARD_F16,
    SHARD_I8,
    SHARD_I32,
    SHARD_I64,
    SHARD_U8,
    SHARD_DTYPE_COUNT
} shard_dtype;

/* Bytes per element; 0 for an invalid dtype. */
size_t shard_dtype_size(shard_dtype dtype);

/* Lower-case name: "f32", "f64", "bf16", "f16", "i8", "i32", "i64", "u8". */
const char *shard_dtype_name(shard_dtype dtype);

/* Parse a name as printed by shard_dtype_name. */
shard_status shard_dtype_parse(const char *name, shard_dtype *out);

int shard_dtype_is_float(shard_dtype dtype);

uint16_t shard_bf16_from_f32(float value);
float shard_f32_from_bf16(uint16_t bits);
uint16_t shard_f16_from_f32(float value);
float shard_f32_from_f16(uint16_t bits);

#ifdef __cplusplus
}
#endif
#endif
