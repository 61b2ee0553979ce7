/* cross_entropy.c — softmax cross-entropy over logits, whole or split by vocabulary columns, and its
 * plain reference.
 *
 * Whole rows: chunks of rows on the process's threads, one pass of exp per row (kept for the gradient),
 * partial losses added in chunk order.  Split by columns (the vocabulary-parallel head): three steps
 * whose results the caller combines over the ranks in between (kernels.h; the communication is in
 * nn/tp.c).  The reference at the end is the definition in double (see reference.h). */
#include "shard/layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/parallel.h"
#include "kernels/kernels.h"
#include "kernels/reference.h"
#include "kernels/vec.h"

shard_status shard__cross_entropy_check_targets(const int32_t *targets, int32_t ignore_index, size_t N, size_t V,
                                                size_t *used) {
    *used = 0;
    for (size_t n = 0; n < N; n++) {
        if (targets[n] == ignore_index) continue;
        if (targets[n] < 0 || (size_t)targets[n] >= V)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "cross_entropy: target %d at row %zu is outside 0..%zu (ignore index %d)", targets[n], n,
                               V - 1, ignore_index);
        (*used)++;
    }
    return SHARD_OK;
}

/* Rows of one chunk: their loss terms summed into *total; dlogits of those rows (or a scratch row). */
typedef struct ce_job {
    const float *logits;
    const int32_t *targets;
    int32_t ignore_index;
    size_t N, V;
    float scale, *dlogits;
    double total[SHARD_MAX_CHUNKS];
    int failed[SHARD_MAX_CHUNKS]; /* per chunk: chunks run on several threads */
} ce_job;

static void ce_chunk(void *ctx, size_t chunk, size_t chunks) {
    ce_job *j = ctx;
    size_t r0, rows, V = j->V;
    shard__chunk_range(j->N, chunks, chunk, &r0, &rows);
    float *row = j->dlogits ? NULL : malloc(V * sizeof *row);
    if (!j->dlogits && !row) {
        j->failed[chunk] = 1;
        return;
    }
    double total = 0;
    for (size_t n = r0; n < r0 + rows; n++) {
        const float *r = j->logits + n * V;
        float *d = j->dlogits ? j->dlogits + n * V : row;
        if (j->targets[n] == j->ignore_index) {
            if (j->dlogits) memset(d, 0, V * sizeof *d);
            continue;
        }
        float m = shard__row_max(r, V), at_target = r[j->targets[n]]; /* read before d, which may be r, is written */
        double sum = shard__exp_row(r, d, V, m);                      /* one pass of exp, kept in d for the gradient */
        total += (double)m + log(sum) - (double)at_target;
        if (j->dlogits) {
            shard__scale_row(d, V, (float)(1.0 / sum) * j->scale);
            d[j->targets[n]] -= j->scale;
        }
    }
    free(row);
    j->total[chunk] = total;
}

shard_status shard_cross_entropy_sum(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N,
                                     size_t V, double denominator, double *loss, size_t *count, float *dlogits) {
    size_t used = 0;
    SHARD_CHECK(shard__cross_entropy_check_targets(targets, ignore_index, N, V, &used));
    ce_job j = {.logits = logits,
                .targets = targets,
                .ignore_index = ignore_index,
                .N = N,
                .V = V,
                .scale = denominator > 0 ? (float)(1.0 / denominator) : 0.0f,
                .dlogits = dlogits};
    size_t chunks = shard__chunks_for(N * V, 4 * GRAIN);
    shard__parallel_for(chunks, ce_chunk, &j);
    for (size_t k = 0; k < chunks; k++)
        if (j.failed[k]) return shard_error(SHARD_ERR_NO_MEMORY, "cross_entropy: out of memory");
    double total = 0;
    for (size_t k = 0; k < chunks; k++) total += j.total[k];
    *loss = denominator > 0 ? total / denominator : 0.0;
    if (count) *count = used;
    return SHARD_OK;
}

shard_status shard_cross_entropy(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N, size_t V,
                                 float *loss, size_t *count, float *dlogits) {
    size_t used = 0;
    double l = 0;
    SHARD_CHECK(shard__cross_entropy_check_targets(targets, ignore_index, N, V, &used));
    SHARD_CHECK(shard_cross_entropy_sum(logits, targets, ignore_index, N, V, (double)used, &l, count, dlogits));
    *loss = (float)l;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- split by vocabulary columns */

void shard__cross_entropy_split_max(const float *logits, size_t N, size_t Vl, float *mx) {
    for (size_t n = 0; n < N; n++) {
        const float *r = logits + n * Vl;
        float m = -INFINITY;
        for (size_t v = 0; v < Vl; v++) m = r[v] > m ? r[v] : m;
        mx[n] = m;
    }
}

void shard__cross_entropy_split_exp(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N,
                                    size_t v0, size_t Vl, const float *mx, double *st, float *dlogits) {
    for (size_t n = 0; n < N; n++) {
        const float *r = logits + n * Vl;
        float *d = dlogits + n * Vl; /* may be r: the target's logit is read first */
        size_t t = (size_t)targets[n];
        st[2 * n + 1] = targets[n] != ignore_index && t >= v0 && t < v0 + Vl ? (double)r[t - v0] : 0.0;
        double sum = 0;
        for (size_t v = 0; v < Vl; v++) d[v] = expf(r[v] - mx[n]), sum += d[v];
        st[2 * n] = sum;
    }
}

double shard__cross_entropy_split_finish(const int32_t *targets, int32_t ignore_index, size_t N, size_t v0, size_t Vl,
                                         const float *mx, const double *st, double scale, float *dlogits) {
    double total = 0;
    for (size_t n = 0; n < N; n++) {
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
    return total;
}

/* ---------------------------------------------------------------- reference */

double shard__ref_cross_entropy_sum(const float *logits, const int32_t *targets, int32_t ignore_index, size_t N,
                                    size_t V, double denominator, size_t *count, float *dlogits) {
    double total = 0, scale = denominator > 0 ? 1.0 / denominator : 0.0;
    size_t used = 0;
    for (size_t n = 0; n < N; n++) {
        const float *r = logits + n * V;
        float *d = dlogits ? dlogits + n * V : NULL;
        if (targets[n] == ignore_index) {
            for (size_t v = 0; d && v < V; v++) d[v] = 0;
            continue;
        }
        size_t t = (size_t)targets[n];
        double m = -INFINITY, sum = 0, at_target = r[t];
        for (size_t v = 0; v < V; v++) m = r[v] > m ? r[v] : m;
        for (size_t v = 0; v < V; v++) sum += exp(r[v] - m);
        total += m + log(sum) - at_target; /* -log softmax(r)[t] */
        for (size_t v = 0; d && v < V; v++) d[v] = (float)((exp(r[v] - m) / sum - (v == t)) * scale);
        used++;
    }
    if (count) *count = used;
    return total * scale;
}
