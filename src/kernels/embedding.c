/* embedding.c — embedding lookups and their backward, whole or for a table split by rows (the
 * vocabulary-parallel embedding), and their plain reference.
 *
 * With the whole table, ids are checked before any row is read or written (the split forward checks
 * each as it goes); a backward adds dy's rows in position order, so repeated ids sum in that order.
 * The reference at the end is the definition written as loops (see reference.h). */
#include "shard/layers.h"

#include <string.h>

#include "kernels/kernels.h"
#include "kernels/reference.h"

static shard_status check_ids(const int32_t *ids, size_t N, size_t rows, const char *what) {
    for (size_t n = 0; n < N; n++)
        if (ids[n] < 0 || (size_t)ids[n] >= rows)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: id %d at position %zu is outside the table's rows 0..%zu",
                               what, ids[n], n, rows - 1);
    return SHARD_OK;
}

shard_status shard_embedding_forward(const float *table, const int32_t *ids, float *y, size_t N, size_t rows,
                                     size_t C) {
    SHARD_CHECK(check_ids(ids, N, rows, "embedding"));
    for (size_t n = 0; n < N; n++) memcpy(y + n * C, table + (size_t)ids[n] * C, C * sizeof *y);
    return SHARD_OK;
}

shard_status shard_embedding_backward(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t rows,
                                      size_t C) {
    SHARD_CHECK(check_ids(ids, N, rows, "embedding backward"));
    for (size_t n = 0; n < N; n++) {
        float *row = dtable + (size_t)ids[n] * C;
        for (size_t c = 0; c < C; c++) row[c] += dy[n * C + c];
    }
    return SHARD_OK;
}

/* ---------------------------------------------------------------- split by table rows */

shard_status shard__embedding_forward_split(const float *table, const int32_t *ids, float *y, size_t N, size_t v0,
                                            size_t Vl, size_t V, size_t C) {
    for (size_t n = 0; n < N; n++) {
        if (ids[n] < 0 || (size_t)ids[n] >= V)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "embedding: id %d at position %zu is outside the table's rows 0..%zu", ids[n], n, V - 1);
        size_t id = (size_t)ids[n];
        if (id >= v0 && id < v0 + Vl)
            memcpy(y + n * C, table + (id - v0) * C, C * sizeof *y);
        else
            memset(y + n * C, 0, C * sizeof *y);
    }
    return SHARD_OK;
}

void shard__embedding_backward_split(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t v0, size_t Vl,
                                     size_t C) {
    for (size_t n = 0; n < N; n++) {
        size_t id = (size_t)ids[n];
        if (ids[n] < 0 || id < v0 || id >= v0 + Vl) continue;
        float *row = dtable + (id - v0) * C;
        for (size_t c = 0; c < C; c++) row[c] += dy[n * C + c];
    }
}

/* ---------------------------------------------------------------- reference */

void shard__ref_embedding_forward(const float *table, const int32_t *ids, float *y, size_t N, size_t C) {
    for (size_t n = 0; n < N; n++)
        for (size_t c = 0; c < C; c++) y[n * C + c] = table[(size_t)ids[n] * C + c];
}

void shard__ref_embedding_backward(const int32_t *ids, const float *dy, float *dtable, size_t N, size_t C) {
    for (size_t n = 0; n < N; n++)
        for (size_t c = 0; c < C; c++) dtable[(size_t)ids[n] * C + c] += dy[n * C + c];
}
