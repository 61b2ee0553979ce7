/* gemm_shapes.h — internal: a histogram of the GEMM shapes a thread runs, kept only while a recorder is
 * installed (the analyzer's dry run), so the cost model can price each product at the throughput the
 * machine profile measured for its shape.  Without a recorder the hook is one thread-local load. */
#ifndef SHARD_PLAN_GEMM_SHAPES_H
#define SHARD_PLAN_GEMM_SHAPES_H

#include <stddef.h>

#include "shard/analyze.h"

#define SHARD__GEMM_SHAPES_MAX 256

typedef struct shard__gemm_shapes {
    size_t n;
    shard_gemm_shape at[SHARD__GEMM_SHAPES_MAX];
    double dropped_flops; /* products of shapes past the table's room (priced as the cost model's default) */
} shard__gemm_shapes;

/* Install `rec` on the calling thread (NULL: none); returns the one it replaces. */
shard__gemm_shapes *shard__gemm_shapes_record(shard__gemm_shapes *rec);

/* Count one M x N x K product on the calling thread's recorder, if any. */
void shard__gemm_shapes_add(size_t M, size_t N, size_t K);

#endif
