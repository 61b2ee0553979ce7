/* tensor_parallel.c — see tensor_parallel.h: the communication and the
 * vocabulary-split layers of Megatron-style tensor parallelism. */
#include "parallel/tensor_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

shard_status shard__tp_embedding_partial(const float *table, const int32_t *ids, float *y, size_t N, size_t v0, size_t Vl,
                                         size_t V, size_t C) {
    for (size_t n = 0; n < N; n++) {
        if (ids[n] < 0 || (size_t)ids[n] >= V)
            return shard_error(SHARD_ERR_INVALID_ARG, "embedding: id %d at position %zu is outside the table's rows 0..%zu",
                               ids[n], n, V - 1);
        size_t id = (size_t)ids[n];
        if (id >= v0 && id < v0 + Vl) memcpy(y + n * C, table + (id - v0) * C, C * sizeof *y);
        else memset(y + n * C, 0, C * sizeof *y);
    }
    return SHARD_OK;
}

void shard__tp_embedding_backward(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t v0, size_t Vl,
                                  size_t C) {
    for (size_t n = 0; n < N; n++) {
        size_t id = (size_t)ids[n];
        if (ids[n] < 0 || id < v0 || id >= v0 + Vl) continue;
        float *row = dtable + (id - v0) * C;
        for (size_t c = 0; c < C; c++) row[c] += dy[n * C + c];
    }
}

shard_status shard__tp_cross_entropy(shard_comm *tp, const float *logits, const int32_t *targets, int32_t ignore_index,
                                     size_t N, size_t v0, size_t Vl, size_t V, double denominator, double *loss,
                                     float *dlogits) {
    if (!active(tp)) return shard_cross_entropy_sum(logits, targets, ignore_index, N, V, denominator, loss, NULL, dlogits);
    for (size_t n = 0; n < N; n++)
        if (targets[n] != ignore_index && (targets[n] < 0 || (size_t)targets[n] >= V))
            return shard_error(SHARD_ERR_INVALID_ARG, "cross_entropy: target %d at row %zu is outside 0..%zu (ignore index %d)",
                               targets[n], n, V - 1, ignore_index);
    float *mx = malloc(N * sizeof *mx + 1);
    double *st = malloc(2 * N * sizeof *st + 1); /* per row: sum of exp, the target's logit */
    if (!mx || !st) {
        free(mx), free(st);
        return shard_error(SHARD_ERR_NO_MEMORY, "cross_entropy: out of memory");
    }
    for (size_t n = 0; n < N; n++) { /* the global row maximum */
        const float *r = logits + n * Vl;
        float m = -INFINITY;
        for (size_t v = 0; v < Vl; v++) m = r[v] > m ? r[v] : m;
        mx[n] = m;
    }
    shard_status s = shard_comm_all_reduce(tp, mx, mx, N, SHARD_F32, SHARD_OP_MAX);
    for (size_t n = 0; s == SHARD_OK && n < N; n++) {
        const float *r = logits + n * Vl;
        float *d = dlogits + n * Vl; /* may be r: the target's logit is read first */
        size_t t = (size_t)targets[n];
        st[2 * n + 1] = targets[n] != ignore_index && t >= v0 && t < v0 + Vl ? (double)r[t - v0] : 0.0;
        double sum = 0;
        for (size_t v = 0; v < Vl; v++) d[v] = expf(r[v] - mx[n]), sum += d[v];
        st[2 * n] = sum;
    }
    if (s == SHARD_OK) s = shard_comm_all_reduce(tp, st, st, 2 * N, SHARD_F64, SHARD_OP_SUM);
    double total = 0, scale = denominator > 0 ? 1.0 / denominator : 0.0;
    for (size_t n = 0; s == SHARD_OK && n < N; n++) {
        float *d = dlogits + n * Vl;
        if (targets[n] == ignore_index) {
            memset(d, 0, Vl * sizeof *d);
            continue;
        }
        total += (double)mx[n] + log(st[2 * n]) - st[2 * n + 1];
        float k = (float)(scale / st[2 * n]);
        for (size_t v = 0; v < Vl; v++) d[v] *= k;
        size_t t = (size_t)targets[n];
        if (t >= v0 && t < v0 + Vl) d[t - v0] -= (float)scale;
    }
    *loss = total * scale;
    free(mx), free(st);
    return s;
}
