/* gemm_shapes.c — see gemm_shapes.h: the dry run's per-(M, N, K) count of GEMMs. */
#include "plan/gemm_shapes.h"

static _Thread_local shard__gemm_shapes *recorder;

shard__gemm_shapes *shard__gemm_shapes_record(shard__gemm_shapes *rec) {
    shard__gemm_shapes *old = recorder;
    recorder = rec;
    return old;
}

void shard__gemm_shapes_add(size_t M, size_t N, size_t K) {
    shard__gemm_shapes *r = recorder;
    if (!r) return;
    for (size_t i = 0; i < r->n; i++)
        if (r->at[i].m == M && r->at[i].n == N && r->at[i].k == K) {
            r->at[i].count++;
            return;
        }
    if (r->n < SHARD__GEMM_SHAPES_MAX)
        r->at[r->n++] = (shard_gemm_shape){.m = M, .n = N, .k = K, .count = 1};
    else
        r->dropped_flops += 2.0 * (double)M * (double)N * (double)K;
}
