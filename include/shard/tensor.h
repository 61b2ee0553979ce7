/* tensor.h — n-d tensors: the local pieces every layer and strategy works on.
 *
 * A tensor owns contiguous, 64-byte aligned storage from the accounted
 * allocator (tagged with a memory category), row-major.  A view narrows one
 * dim of another tensor without copying; it keeps the parent's strides, so it
 * may not be contiguous, and it must not outlive the tensor it looks into.
 * Shapes and strides are element counts. */
#ifndef SHARD_TENSOR_H
#define SHARD_TENSOR_H

#include <stddef.h>

#include "shard/dtype.h"
#include "shard/memory.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_MAX_DIMS 8

typedef struct shard_tensor {
    shard_dtype dtype;
    int ndim; /* 0..SHARD_MAX_DIMS (0: a scalar) */
    size_t shape[SHARD_MAX_DIMS];
    size_t strides[SHARD_MAX_DIMS]; /* elements between neighbours along each dim */
    void *data;                     /* element [0,...,0] */
    void *storage;                  /* owned allocation; NULL for a view */
    shard_mem_category category;
} shard_tensor;

/* A new zero-filled tensor. */
shard_status shard_tensor_create(shard_dtype dtype, int ndim, const size_t *shape, shard_mem_category category,
                                 shard_tensor **out);
/* Releases storage it owns; NULL is ignored. */
void shard_tensor_destroy(shard_tensor *t);

/* A view of t with dim `dim` narrowed to [start, start + length). */
shard_status shard_tensor_narrow(const shard_tensor *t, int dim, size_t start, size_t length, shard_tensor **out);

size_t shard_tensor_numel(const shard_tensor *t);
size_t shard_tensor_nbytes(const shard_tensor *t); /* numel x element size */
int shard_tensor_is_contiguous(const shard_tensor *t);

/* Element-wise copy between tensors of one shape and dtype (views allowed; views of the same storage
 * must not overlap). */
shard_status shard_tensor_copy(shard_tensor *dst, const shard_tensor *src);
/* Set every element to value (converted to the dtype; floats round to nearest even, once; integers
 * saturate, NaN becomes 0). */
shard_status shard_tensor_fill(shard_tensor *t, double value);
/* Copy with conversion between float dtypes (f32, f64, bf16, f16); same shape. */
shard_status shard_tensor_cast(shard_tensor *dst, const shard_tensor *src);

/* Element at a flat row-major index of the logical shape, as a double. */
double shard_tensor_get(const shard_tensor *t, size_t flat_index);
shard_status shard_tensor_set(shard_tensor *t, size_t flat_index, double value);

/* Comparison for tests. */
typedef struct shard_tensor_diff {
    double max_abs;          /* max |a - b| */
    double max_rel;          /* max |a - b| / max(|b|, tiny) */
    size_t worst_index;      /* flat index of max_abs */
    double worst_a, worst_b; /* the two values there */
    size_t mismatched_bits;  /* elements whose bit patterns differ */
} shard_tensor_diff;

/* 1 when shapes, dtypes and every element's bits are equal. */
int shard_tensor_equal_bits(const shard_tensor *a, const shard_tensor *b);
/* Differences of two tensors of one shape (dtypes may differ). */
shard_status shard_tensor_compare(const shard_tensor *a, const shard_tensor *b, shard_tensor_diff *out);

/* "f32[8,4]" */
void shard_tensor_type_string(const shard_tensor *t, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif
#endif
