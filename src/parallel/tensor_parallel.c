/* tensor_parallel.c — see tensor_parallel.h: the communication of
 * Megatron-style tensor parallelism, around the vocabulary-split kernels
 * (src/kernels/kernels.h). */
#include "parallel/tensor_parallel.h"

#include <stdlib.h>

#include "kernels/kernels.h"
#include "shard/layers.h"

static int active(shard_comm *tp) { return tp && shard_comm_size(tp) > 1; }

void shard__tp_split(size_t n, int parts, int part, size_t *first, size_t *count) {
    size_t p = (size_t)parts, r = (size_t)part;
    *count = n / p + (r < n % p);
    *first = r * (n / p) + (r < n % p ? r : n % p);
}

shard_status shard__tp_sum(shard_comm *tp, float *x, size_t n) {
    return active(tp) ? shard_comm_all_reduce(tp, x, x, n, SHARD_F32, SHARD_OP_SUM) : SHARD_OK;
}

shard_status shard__tp_cross_entropy(shard_comm *tp, const float *logits, const int32_t *targets, int32_t ignore_index,
                                     size_t N, size_t v0, size_t Vl, size_t V, double denominator, double *loss,
                                     float *dlogits) {
    if (!active(tp)) return shard_cross_entropy_sum(logits, targets, ignore_index, N, V, denominator, loss, NULL, dlogits);
    size_t used = 0;
    SHARD_CHECK(shard__cross_entropy_check_targets(targets, ignore_index, N, V, &used));
    float *mx = malloc(N * sizeof *mx + 1);
    double *st = malloc(2 * N * sizeof *st + 1); /* per row: sum of exp, the target's logit */
    if (!mx || !st) {
        free(mx), free(st);
        return shard_error(SHARD_ERR_NO_MEMORY, "cross_entropy: out of memory");
    }
    shard__cross_entropy_split_max(logits, N, Vl, mx);
    shard_status s = shard_comm_all_reduce(tp, mx, mx, N, SHARD_F32, SHARD_OP_MAX); /* the global row maximum */
    if (s == SHARD_OK) shard__cross_entropy_split_exp(logits, targets, ignore_index, N, v0, Vl, mx, st, dlogits);
    if (s == SHARD_OK) s = shard_comm_all_reduce(tp, st, st, 2 * N, SHARD_F64, SHARD_OP_SUM);
    double total = 0, scale = denominator > 0 ? 1.0 / denominator : 0.0;
    if (s == SHARD_OK)
        total = shard__cross_entropy_split_finish(targets, ignore_index, N, v0, Vl, mx, st, scale, dlogits);
    *loss = total * scale;
    free(mx), free(st);
    return s;
}
