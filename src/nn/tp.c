/* tp.c — see tp.h: the tensor-parallel building blocks.  Each block is the
 * single-device layer of layers.h plus the changes of state its placement
 * asks for, all through shard_tp_redistribute, so the communication of
 * tensor and sequence parallelism is written in one place. */
#include "shard/tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/monitor_impl.h"
#include "kernels/kernels.h"
#include "shard/layers.h"

/* Up to this many ranks the per-rank counts live on the stack. */
enum { TP_STACK_RANKS = 64 };

int shard_tp_rank(shard_comm *comm) { return comm ? shard_comm_rank(comm) : 0; }
int shard_tp_size(shard_comm *comm) { return comm ? shard_comm_size(comm) : 1; }

static int active(shard_comm *comm) { return shard_tp_size(comm) > 1; }

void shard_tp_token_range(shard_comm *comm, int tokens, size_t rows, size_t *first, size_t *count) {
    if (!tokens || !active(comm)) {
        *first = 0, *count = rows;
        return;
    }
    shard_split_even(rows, (size_t)shard_comm_size(comm), (size_t)shard_comm_rank(comm), first, count);
}

shard_status shard_tp_sum(shard_comm *comm, float *x, size_t n) {
    if (!active(comm)) return SHARD_OK;
    const char *was = shard__mon_tag("tp"); /* named as the tensor axis's in the step's trace */
    shard_status s = shard_comm_all_reduce(comm, x, x, n, SHARD_F32, SHARD_OP_SUM);
    shard__mon_tag(was);
    return s;
}

static const char *state_name(shard_tp_state s) {
    return s == SHARD_TP_REPLICATED ? "replicated P()"
        : s == SHARD_TP_PARTIAL     ? "partial P(partial='tensor')"
        : s == SHARD_TP_TOKENS      ? "split over tokens P('tensor', None)"
                                    : "unknown";
}

/* The collectives of the token split: every rank's rows, in elements of `width`. */
static shard_status token_collective(shard_comm *comm, float *whole, float *local, size_t rows, size_t width,
                                     int gather) {
    size_t n = (size_t)shard_comm_size(comm), me = (size_t)shard_comm_rank(comm);
    size_t stack[2 * TP_STACK_RANKS], *counts = n <= TP_STACK_RANKS ? stack : malloc(2 * n * sizeof *counts);
    if (!counts) return shard_error(SHARD_ERR_NO_MEMORY, "tensor parallel: out of memory for %zu ranks' counts", n);
    size_t *displs = counts + n;
    for (size_t r = 0; r < n; r++) {
        size_t first, count;
        shard_split_even(rows, n, r, &first, &count);
        counts[r] = count * width, displs[r] = first * width;
    }
    shard_status s;
    const char *was = shard__mon_tag("tp");
    if (gather) {
        float *mine = whole + displs[me];
        if (local != mine) memcpy(mine, local, counts[me] * sizeof *mine);
        s = shard_comm_all_gatherv(comm, mine, counts[me], whole, counts, displs, SHARD_F32);
    } else {
        s = shard_comm_reduce_scatterv(comm, whole, local, counts, SHARD_F32, SHARD_OP_SUM);
    }
    shard__mon_tag(was);
    if (counts != stack) free(counts);
    return s;
}

shard_status shard_tp_redistribute(shard_comm *comm, float *whole, float *local, size_t rows, size_t width,
                                   shard_tp_state from, shard_tp_state to) {
    if (from == to && from <= SHARD_TP_TOKENS) return SHARD_OK;
    size_t first, count;
    shard_tp_token_range(comm, 1, rows, &first, &count);
    if (from == SHARD_TP_PARTIAL && to == SHARD_TP_REPLICATED) return shard_tp_sum(comm, whole, rows * width);
    if (from == SHARD_TP_REPLICATED && to == SHARD_TP_TOKENS) {
        if (local != whole + first * width) memcpy(local, whole + first * width, count * width * sizeof *local);
        return SHARD_OK;
    }
    if (!active(comm) && (from == SHARD_TP_PARTIAL || from == SHARD_TP_TOKENS)) { /* one rank: all rows, summed */
        float *src = from == SHARD_TP_TOKENS ? local : whole, *dst = to == SHARD_TP_TOKENS ? local : whole;
        if (src != dst) memcpy(dst, src, rows * width * sizeof *dst);
        return SHARD_OK;
    }
    if (from == SHARD_TP_PARTIAL && to == SHARD_TP_TOKENS) return token_collective(comm, whole, local, rows, width, 0);
    if (from == SHARD_TP_TOKENS && to == SHARD_TP_REPLICATED)
        return token_collective(comm, whole, local, rows, width, 1);
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "tensor parallel: no redistribution from %s to %s; valid: partial to "
                       "replicated or to split over tokens, split over tokens to replicated, replicated to split over "
                       "tokens",
                       state_name(from), state_name(to));
}

/* The state a layer's output leaves it in, and the one its consumer wants. */
static shard_tp_state made(const shard_tp_place *p) {
    return p->split && active(p->comm) ? SHARD_TP_PARTIAL : SHARD_TP_REPLICATED;
}
static shard_tp_state wanted(const shard_tp_place *p) {
    return p->tokens ? SHARD_TP_TOKENS : SHARD_TP_REPLICATED; /* one rank's tokens are all of them */
}

/* Tokens-split rows made whole: `rows` itself without the split, else gathered into `whole`. */
static shard_status whole_rows(const shard_tp_place *p, const float *rows, float *whole, size_t N, size_t width,
                               const float **out) {
    if (wanted(p) != SHARD_TP_TOKENS) {
        *out = rows;
        return SHARD_OK;
    }
    *out = whole; /* tokens -> replicated only reads `local`: the cast writes nothing through it */
    return shard_tp_redistribute(p->comm, whole, (float *)rows, N, width, SHARD_TP_TOKENS, SHARD_TP_REPLICATED);
}

shard_status shard_tp_column_forward(const shard_tp_place *p, float *x, const float *w, const float *b, float *y,
                                     size_t N, size_t in, size_t out) {
    if (wanted(p) == SHARD_TP_TOKENS) {
        size_t first, count;
        shard_tp_token_range(p->comm, 1, N, &first, &count);
        SHARD_CHECK(shard_tp_redistribute(p->comm, x, x + first * in, N, in, SHARD_TP_TOKENS, SHARD_TP_REPLICATED));
    }
    return shard_linear_forward(x, w, b, y, N, in, out);
}

shard_status shard_tp_column_backward(const shard_tp_place *p, const float *x, const float *w, const float *dy,
                                      float *dx, float *dx_local, float *dw, float *db, size_t N, size_t in,
                                      size_t out) {
    SHARD_CHECK(shard_linear_backward(x, w, dy, dx, dw, db, N, in, out));
    return dx ? shard_tp_redistribute(p->comm, dx, dx_local, N, in, made(p), wanted(p)) : SHARD_OK;
}

shard_status shard_tp_row_forward(const shard_tp_place *p, const float *x, const float *w, const float *b,
                                  float *y_whole, float *y, size_t N, size_t in, size_t out) {
    shard_tp_state from = made(p), to = wanted(p);
    /* once over the ranks: in the product of a layer computed whole or of rank 0's summand, else (tokens)
     * by every rank to its own rows of the sum */
    int bias_after = from == SHARD_TP_PARTIAL && to == SHARD_TP_TOKENS;
    int bias_now = from == SHARD_TP_REPLICATED || (!bias_after && shard_tp_rank(p->comm) == 0);
    SHARD_CHECK(shard_linear_forward(x, w, bias_now ? b : NULL, y_whole, N, in, out));
    SHARD_CHECK(shard_tp_redistribute(p->comm, y_whole, y, N, out, from, to));
    if (b && bias_after) {
        size_t first, count;
        shard_tp_token_range(p->comm, 1, N, &first, &count);
        for (size_t n = 0; n < count; n++) shard_add(y + n * out, b, y + n * out, out);
    }
    return SHARD_OK;
}

shard_status shard_tp_row_backward(const shard_tp_place *p, const float *x, const float *w, const float *dy,
                                   float *dy_whole, float *dx, float *dw, float *db, size_t N, size_t in, size_t out) {
    const float *dyw;
    SHARD_CHECK(whole_rows(p, dy, dy_whole, N, out, &dyw));
    return shard_linear_backward(x, w, dyw, dx, dw, db, N, in, out);
}

shard_status shard_tp_embedding_forward(const shard_tp_place *p, const float *table, const int32_t *ids, float *y_whole,
                                        float *y, size_t N, size_t v0, size_t Vl, size_t V, size_t C) {
    if (made(p) == SHARD_TP_PARTIAL) {
        SHARD_CHECK(shard__embedding_forward_split(table, ids, y_whole, N, v0, Vl, V, C));
        return shard_tp_redistribute(p->comm, y_whole, y, N, C, SHARD_TP_PARTIAL, wanted(p));
    }
    size_t first, count; /* the whole table: each rank looks up its own tokens */
    shard_tp_token_range(p->comm, p->tokens, N, &first, &count);
    return shard_embedding_forward(table, ids + first, y, count, V, C);
}

shard_status shard_tp_embedding_backward(const shard_tp_place *p, const int32_t *ids, const float *dy, float *dy_whole,
                                         float *dtable, size_t N, size_t v0, size_t Vl, size_t V, size_t C) {
    const float *dyw;
    SHARD_CHECK(whole_rows(p, dy, dy_whole, N, C, &dyw));
    if (made(p) != SHARD_TP_PARTIAL) return shard_embedding_backward(ids, dyw, dtable, N, V, C);
    shard__embedding_backward_split(ids, dyw, dtable, N, v0, Vl, C);
    return SHARD_OK;
}

shard_status shard_tp_cross_entropy(shard_comm *comm, const float *logits, const int32_t *targets, int32_t ignore_index,
                                    size_t N, size_t v0, size_t Vl, size_t V, double denominator, double *loss,
                                    float *dlogits) {
    if (!active(comm))
        return shard_cross_entropy_sum(logits, targets, ignore_index, N, V, denominator, loss, NULL, dlogits);
    size_t used = 0;
    SHARD_CHECK(shard__cross_entropy_check_targets(targets, ignore_index, N, V, &used));
    float *mx = malloc(N * sizeof *mx + 1);
    double *st = malloc(2 * N * sizeof *st + 1); /* per row: sum of exp, the target's logit */
    if (!mx || !st) {
        free(mx), free(st);
        return shard_error(SHARD_ERR_NO_MEMORY, "cross_entropy: out of memory");
    }
    shard__cross_entropy_split_max(logits, N, Vl, mx);
    shard_status s = shard_comm_all_reduce(comm, mx, mx, N, SHARD_F32, SHARD_OP_MAX); /* the global row maximum */
    if (s == SHARD_OK) shard__cross_entropy_split_exp(logits, targets, ignore_index, N, v0, Vl, mx, st, dlogits);
    if (s == SHARD_OK) s = shard_comm_all_reduce(comm, st, st, 2 * N, SHARD_F64, SHARD_OP_SUM);
    double total = 0, scale = denominator > 0 ? 1.0 / denominator : 0.0;
    if (s == SHARD_OK)
        total = shard__cross_entropy_split_finish(targets, ignore_index, N, v0, Vl, mx, st, scale, dlogits);
    *loss = total * scale;
    free(mx), free(st);
    return s;
}

shard_mesh_layout shard_tp_layout(int parts) {
    shard_mesh_layout l;
    memset(&l, 0, sizeof l);
    l.ndim = 1, l.sizes[0] = parts > 0 ? parts : 1;
    snprintf(l.names[0], sizeof l.names[0], "tensor");
    return l;
}

void shard_tp_piece(const shard_spec *spec, int ndim, const size_t *shape, int parts, int part, size_t *off,
                    size_t *len) {
    shard_mesh_layout layout = shard_tp_layout(parts);
    int coords[SHARD_MESH_MAX_AXES] = {part};
    for (int d = 0; d < ndim; d++) shard_spec_local_range(spec, &layout, shape, coords, d, &off[d], &len[d]);
}
