/* attention.c — causal multi-head self-attention, forward and backward (with dropout on the
 * probabilities or without), and its plain reference.
 *
 * Per (batch, head) pair: S = Q K^T / sqrt(D) and Y = P V as products on packed operands, the causal
 * softmax on the rows between them; pairs are independent and run in one chunk per thread.  The
 * reference at the end is the textbook softmax(Q K^T / sqrt(D)) V per head in double, with its
 * backward, drawing the dropout mask the same way (vec.h). */
#include "shard/layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/reference.h"
#include "kernels/vec.h"
#include "shard/blas.h"
#include "shard/memory.h"

/* ---- the causal softmax's backward in attention: row t covers positions 0..t of a T-wide row.
 * Rows are short (1..T) and nearly all end inside a block of 16 lanes: that last block is computed whole
 * with the lanes past the row masked out, which the row's T floats of room allow; only when a row's
 * last vector would pass T does it take a plain loop. */
static const v8i LANE_INDEX = {0, 1, 2, 3, 4, 5, 6, 7};

/* the sum of 16 lanes (two halves) as a tree (halves, quarters, ...): 4 dependent steps, not 15 */
static inline float lanes_tree_sum(const v8f lane[2]) {
    float l[LANES];
    memcpy(l, &lane[0], sizeof lane[0]);
    memcpy(l + HALF, &lane[1], sizeof lane[1]);
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    return l[0];
}

/* dS = P (dP - rowsum(P dP)) * scale on the causal rows, the rest of each row zeroed. */
SHARD_VECTOR_CLONES
static void causal_softmax_backward_rows(const float *p, float *ds, size_t T, float scale) {
    for (size_t t = 0; t < T; t++) {
        const float *a = p + t * T;
        float *d = ds + t * T;
        size_t n = t + 1, whole = n / LANES * LANES, end = (n + LANES - 1) / LANES * LANES;
        if (end > T) {
            float dot = 0;
            for (size_t i = 0; i < n; i++) dot += a[i] * d[i];
            for (size_t i = 0; i < n; i++) d[i] = a[i] * (d[i] - dot) * scale;
            for (size_t i = n; i < T; i++) d[i] = 0;
            continue;
        }
        int rem = (int)(n - whole);
        v8i keep[2] = {LANE_INDEX < rem, LANE_INDEX + HALF < rem};
        v8f acc[2] = {{0}, {0}}, av, dv, zero = {0};
        for (size_t c = 0; c < whole; c += LANES)
            for (int h = 0; h < 2; h++) load8(&av, a + c + HALF * h), load8(&dv, d + c + HALF * h), acc[h] += av * dv;
        for (int h = 0; end > whole && h < 2; h++) {
            load8(&av, a + whole + HALF * h), load8(&dv, d + whole + HALF * h);
            v8f prod = av * dv;
            select8(&prod, &keep[h], &prod, &zero);
            acc[h] += prod;
        }
        float dot = lanes_tree_sum(acc);
        for (size_t c = 0; c < whole; c += LANES)
            for (int h = 0; h < 2; h++) {
                load8(&av, a + c + HALF * h), load8(&dv, d + c + HALF * h);
                dv = av * (dv - dot) * scale;
                memcpy(d + c + HALF * h, &dv, sizeof dv);
            }
        for (int h = 0; end > whole && h < 2; h++) {
            load8(&av, a + whole + HALF * h), load8(&dv, d + whole + HALF * h);
            dv = av * (dv - dot) * scale;
            select8(&dv, &keep[h], &dv, &zero);
            memcpy(d + whole + HALF * h, &dv, sizeof dv);
        }
        for (size_t i = end; i < T; i++) d[i] = 0;
    }
}

static shard_status check_heads(size_t C, size_t H, const char *what) {
    if (H == 0 || C % H)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: width %zu does not divide into %zu heads", what, C, H);
    return SHARD_OK;
}

/* Per (batch, head): S = Q K^T / sqrt(D) and Y = P V are GEMMs over the
 * strided q, k, v columns of qkv; the causal softmax runs on the rows. */
shard_status shard_attention_forward(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C, size_t H) {
    return shard_attention_forward_dropout(qkv, y, att, B, T, C, H, 0.0f, 0, 0, H, 0);
}

/* The probabilities of (global row b, head h) use dropout offsets from ((b * H + h) * T * T). */
static uint64_t att_offset(size_t first_row, size_t b, size_t H, size_t h, size_t T) {
    return ((uint64_t)(first_row + b) * H + h) * T * T;
}

/* Causal attention skips what the mask zeroes: rows go in blocks of ATT_BLOCK, and a block of rows [r0, r1)
 * multiplies only keys 0..r1 - 1 (the probabilities beyond are exact zeros, so the sums are the same). */
#define ATT_BLOCK 32

/* A pair's q, k, v (and dY) are copied out of their strided columns into contiguous T x D (or, transposed,
 * D x T) scratch first, so that every product is a plain "nn" or "tn" one on packed rows: the strided
 * columns (3C floats apart) fall into a few cache sets, and BLAS's transposed-B path is slow on such
 * small shapes.  On the GPT of configs/gpt-bench.json (T 128, D 64, Emerald Rapids) the forward's
 * products went from 60-130 to 130-160 GFLOP/s on one core, and one layer's attention (forward +
 * backward, 2 threads, operands in cache) from 2.3 to 1.6 ms; inside the training step, colder, it
 * saves about 0.5 ms.
 * ATT_PACKS is the most T x D buffers a pair uses (backward: q, k, v^T, dY). */
#define ATT_PACKS 4

static void pack_rows(const float *src, size_t lds, size_t rows, size_t cols, float *dst) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * cols, src + r * lds, cols * sizeof *dst);
}

/* dst[c][r] = src[r][c]: cols x rows */
static void pack_transposed(const float *src, size_t lds, size_t rows, size_t cols, float *dst) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * lds + c];
}

/* One attention call cut over its (batch, head) pairs: each pair is independent, so any cut gives the same bits. */
typedef struct att_job {
    const float *qkv, *att, *dy;
    float *y, *att_out, *dqkv;
    size_t B, T, C, H;
    float p_drop;
    uint64_t seed;
    size_t first_row, heads_total, head0;
    float *scratch;        /* per chunk: scratch_floats, allocated by the caller (its rank's ledger) */
    size_t scratch_floats; /* the packed operands; backward's dS (zeroed); dropout's kept probabilities */
    shard__chunk_result result[SHARD_MAX_CHUNKS];
} att_job;

/* packs: 3 T x D buffers (q, k^T, v) */
static shard_status att_forward_pair(const att_job *j, size_t b, size_t h, float *packs, float *dropped) {
    size_t T = j->T, C = j->C, D = C / j->H, td = T * D;
    float scale = 1.0f / sqrtf((float)D);
    const float *q = j->qkv + b * T * 3 * C + h * D, *k = q + C, *v = q + 2 * C;
    float *p = j->att_out + (b * j->H + h) * T * T, *qc = packs, *kt = packs + td, *vc = packs + 2 * td;
    pack_rows(q, 3 * C, T, D, qc), pack_transposed(k, 3 * C, T, D, kt), pack_rows(v, 3 * C, T, D, vc);
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, r1, D, scale, qc + r0 * D, D, kt, T, 0.0f, p + r0 * T, T));
    }
    for (size_t t = 0; t < T; t++) { /* causal softmax of row t over 0..t */
        float *a = p + t * T;
        double sum = shard__exp_row(a, a, t + 1, shard__row_max(a, t + 1));
        shard__scale_row(a, t + 1, (float)(1.0 / sum));
        for (size_t i = t + 1; i < T; i++) a[i] = 0;
    }
    const float *probs = p;
    if (dropped) {
        shard_dropout_forward(p, dropped, T * T, j->p_drop, j->seed,
                              att_offset(j->first_row, b, j->heads_total, j->head0 + h, T));
        probs = dropped;
    }
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, D, r1, 1.0f, probs + r0 * T, T, vc, D, 0.0f,
                                j->y + (b * T + r0) * C + h * D, C));
    }
    return SHARD_OK;
}

static void att_forward_chunk(void *ctx, size_t chunk, size_t chunks) {
    att_job *j = ctx;
    size_t first, count;
    shard__chunk_range(j->B * j->H, chunks, chunk, &first, &count);
    float *packs = j->scratch + chunk * j->scratch_floats;
    float *dropped = j->p_drop > 0 ? packs + 3 * j->T * (j->C / j->H) : NULL;
    shard_status s = SHARD_OK;
    for (size_t i = first; i < first + count && s == SHARD_OK; i++)
        s = att_forward_pair(j, i / j->H, i % j->H, packs, dropped);
    shard__chunk_result_set(&j->result[chunk], s);
}

/* The (batch, head) pairs in one chunk per thread (pairs cost the same), each chunk with its scratch
 * from the accounted allocator, charged to the calling rank: `scratch_floats` per chunk. */
static shard_status att_run(att_job *j, shard__chunk_fn fn, size_t scratch_floats) {
    size_t pairs = j->B * j->H, threads = (size_t)shard__parallel_threads();
    size_t chunks = pairs < threads ? pairs : threads;
    if (!chunks) return SHARD_OK;
    if (!scratch_floats) scratch_floats = 1; /* heads of width 0: nothing to pack, but no NULL buffers */
    size_t bytes = chunks * scratch_floats * sizeof(float);
    j->scratch = shard_alloc(bytes, SHARD_MEM_ACTIVATIONS);
    if (!j->scratch)
        return shard_error(SHARD_ERR_NO_MEMORY, "attention: out of memory for %zu bytes of scratch", bytes);
    j->scratch_floats = scratch_floats;
    shard__parallel_for(chunks, fn, j);
    shard_free(j->scratch);
    return shard__chunk_results_raise(j->result, chunks);
}

shard_status shard_attention_forward_dropout(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C,
                                             size_t H, float p_drop, uint64_t seed, size_t first_row,
                                             size_t heads_total, size_t head0) {
    SHARD_CHECK(check_heads(C, H, "attention"));
    att_job j = {.qkv = qkv,
                 .y = y,
                 .att_out = att,
                 .B = B,
                 .T = T,
                 .C = C,
                 .H = H,
                 .p_drop = p_drop,
                 .seed = seed,
                 .first_row = first_row,
                 .heads_total = heads_total,
                 .head0 = head0};
    return att_run(&j, att_forward_chunk, 3 * T * (C / H) + (p_drop > 0 ? T * T : 0));
}

/* dV = P^T dY; dP = dY V^T; dS = P (dP - rowsum(P dP)) / sqrt(D); dQ = dS K; dK = dS^T Q. */
shard_status shard_attention_backward(const float *qkv, const float *att, const float *dy, float *dqkv, size_t B,
                                      size_t T, size_t C, size_t H) {
    return shard_attention_backward_dropout(qkv, att, dy, dqkv, B, T, C, H, 0.0f, 0, 0, H, 0);
}

/* With dropout on the probabilities: dV = drop(P)^T dY and dP = drop'(dY V^T), the mask drawn again. */
/* dV and dK sum over the rows t >= j of their column j: a block of columns [j0, j1) reads rows j0..T - 1. */
/* packs: ATT_PACKS T x D buffers (q, k, v^T, dY) */
static shard_status att_backward_pair(const att_job *j, size_t b, size_t h, float *ds, float *packs, float *dropped) {
    size_t T = j->T, C = j->C, D = C / j->H, tt = T * T, td = T * D;
    float scale = 1.0f / sqrtf((float)D);
    const float *q = j->qkv + b * T * 3 * C + h * D, *k = q + C, *v = q + 2 * C;
    const float *p = j->att + (b * j->H + h) * tt, *g = j->dy + b * T * C + h * D;
    float *dq = j->dqkv + b * T * 3 * C + h * D, *dk = dq + C, *dv = dq + 2 * C;
    float *qc = packs, *kc = packs + td, *vt = packs + 2 * td, *gc = packs + 3 * td;
    pack_rows(q, 3 * C, T, D, qc), pack_rows(k, 3 * C, T, D, kc), pack_transposed(v, 3 * C, T, D, vt);
    pack_rows(g, C, T, D, gc);
    uint64_t offset = att_offset(j->first_row, b, j->heads_total, j->head0 + h, T);
    if (dropped) shard_dropout_forward(p, dropped, tt, j->p_drop, j->seed, offset);
    const float *probs = dropped ? dropped : p;
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(1, 0, r1 - r0, D, T - r0, 1.0f, probs + r0 * T + r0, T, gc + r0 * D, D, 0.0f,
                                dv + r0 * 3 * C, 3 * C));
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, r1, D, 1.0f, gc + r0 * D, D, vt, T, 0.0f, ds + r0 * T, T));
    }
    if (dropped) shard_dropout_backward(ds, ds, tt, j->p_drop, j->seed, offset);
    causal_softmax_backward_rows(p, ds, T, scale);
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        SHARD_CHECK(shard_sgemm(0, 0, r1 - r0, D, r1, 1.0f, ds + r0 * T, T, kc, D, 0.0f, dq + r0 * 3 * C, 3 * C));
        SHARD_CHECK(shard_sgemm(1, 0, r1 - r0, D, T - r0, 1.0f, ds + r0 * T + r0, T, qc + r0 * D, D, 0.0f,
                                dk + r0 * 3 * C, 3 * C));
    }
    return SHARD_OK;
}

static void att_backward_chunk(void *ctx, size_t chunk, size_t chunks) {
    att_job *j = ctx;
    size_t first, count, tt = j->T * j->T;
    shard__chunk_range(j->B * j->H, chunks, chunk, &first, &count);
    float *ds = j->scratch + chunk * j->scratch_floats, *packs = ds + tt;
    /* dS zeroed once: the products leave its masked corner unwritten, and dropout's backward reads all of it */
    memset(ds, 0, tt * sizeof *ds);
    float *dropped = j->p_drop > 0 ? packs + ATT_PACKS * j->T * (j->C / j->H) : NULL;
    shard_status s = SHARD_OK;
    for (size_t i = first; i < first + count && s == SHARD_OK; i++)
        s = att_backward_pair(j, i / j->H, i % j->H, ds, packs, dropped);
    shard__chunk_result_set(&j->result[chunk], s);
}

shard_status shard_attention_backward_dropout(const float *qkv, const float *att, const float *dy, float *dqkv,
                                              size_t B, size_t T, size_t C, size_t H, float p_drop, uint64_t seed,
                                              size_t first_row, size_t heads_total, size_t head0) {
    SHARD_CHECK(check_heads(C, H, "attention backward"));
    att_job j = {.qkv = qkv,
                 .att = att,
                 .dy = dy,
                 .dqkv = dqkv,
                 .B = B,
                 .T = T,
                 .C = C,
                 .H = H,
                 .p_drop = p_drop,
                 .seed = seed,
                 .first_row = first_row,
                 .heads_total = heads_total,
                 .head0 = head0};
    size_t tt = T ? T * T : 1;
    return att_run(&j, att_backward_chunk, tt + ATT_PACKS * T * (C / H) + (p_drop > 0 ? tt : 0));
}

/* ---------------------------------------------------------------- reference */

/* Row t of q, k or v (which: 0, 1, 2) of head h in qkv[B, T, 3C] */
static const float *ref_row(const float *qkv, size_t which, size_t b, size_t t, size_t h, size_t T, size_t C,
                            size_t D) {
    return qkv + (b * T + t) * 3 * C + which * C + h * D;
}

static double ref_dot(const float *a, const float *b, size_t D) {
    double s = 0;
    for (size_t d = 0; d < D; d++) s += (double)a[d] * (double)b[d];
    return s;
}

/* What dropout multiplies element `index` of the probabilities by: 0, or 1 / (1 - p) where kept */
static double ref_keep_factor(float p_drop, uint64_t seed, uint64_t index) {
    if (p_drop <= 0) return 1.0;
    return shard__dropout_keeps(seed, index, p_drop) ? 1.0 / (1.0 - (double)p_drop) : 0.0;
}

shard_status shard__ref_attention_forward(const float *qkv, float *y, float *att, size_t B, size_t T, size_t C,
                                          size_t H, float p_drop, uint64_t seed, size_t first_row, size_t heads_total,
                                          size_t head0) {
    SHARD_CHECK(check_heads(C, H, "attention reference"));
    size_t D = C / H;
    double *prob = malloc((T ? T : 1) * sizeof *prob), scale = 1.0 / sqrt((double)D);
    if (!prob) return shard_error(SHARD_ERR_NO_MEMORY, "attention reference: out of memory");
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++) {
            float *P = att + (b * H + h) * T * T;
            uint64_t offset = att_offset(first_row, b, heads_total, head0 + h, T);
            for (size_t t = 0; t < T; t++) { /* P[t] = softmax over j <= t of q_t . k_j / sqrt(D) */
                const float *q = ref_row(qkv, 0, b, t, h, T, C, D);
                double m = -INFINITY, sum = 0;
                for (size_t j = 0; j <= t; j++) {
                    prob[j] = ref_dot(q, ref_row(qkv, 1, b, j, h, T, C, D), D) * scale;
                    m = prob[j] > m ? prob[j] : m;
                }
                for (size_t j = 0; j <= t; j++) prob[j] = exp(prob[j] - m), sum += prob[j];
                for (size_t j = 0; j < T; j++) P[t * T + j] = j <= t ? (float)(prob[j] / sum) : 0.0f;
                for (size_t d = 0; d < D; d++) { /* y_t = sum over j of drop(P[t, j]) v_j */
                    double acc = 0;
                    for (size_t j = 0; j <= t; j++)
                        acc += prob[j] / sum * ref_keep_factor(p_drop, seed, offset + t * T + j) *
                            ref_row(qkv, 2, b, j, h, T, C, D)[d];
                    y[(b * T + t) * C + h * D + d] = (float)acc;
                }
            }
        }
    free(prob);
    return SHARD_OK;
}

shard_status shard__ref_attention_backward(const float *qkv, const float *att, const float *dy, float *dqkv, size_t B,
                                           size_t T, size_t C, size_t H, float p_drop, uint64_t seed, size_t first_row,
                                           size_t heads_total, size_t head0) {
    SHARD_CHECK(check_heads(C, H, "attention backward reference"));
    size_t D = C / H;
    double *ds = malloc((T ? T * T : 1) * sizeof *ds), scale = 1.0 / sqrt((double)D);
    if (!ds) return shard_error(SHARD_ERR_NO_MEMORY, "attention backward reference: out of memory");
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++) {
            const float *P = att + (b * H + h) * T * T;
            uint64_t offset = att_offset(first_row, b, heads_total, head0 + h, T);
            for (size_t t = 0; t < T; t++) { /* dP = drop'(dY V^T); dS = P (dP - rowsum(P dP)) / sqrt(D) */
                const float *g = dy + (b * T + t) * C + h * D;
                double dot = 0;
                for (size_t j = 0; j <= t; j++) {
                    ds[t * T + j] = ref_dot(g, ref_row(qkv, 2, b, j, h, T, C, D), D) *
                        ref_keep_factor(p_drop, seed, offset + t * T + j);
                    dot += P[t * T + j] * ds[t * T + j];
                }
                for (size_t j = 0; j <= t; j++) ds[t * T + j] = P[t * T + j] * (ds[t * T + j] - dot) * scale;
            }
            for (size_t t = 0; t < T; t++)
                for (size_t d = 0; d < D; d++) {
                    double dq = 0, dk = 0, dv = 0; /* dQ = dS K (row t); dK = dS^T Q, dV = drop(P)^T dY (row t) */
                    for (size_t j = 0; j <= t; j++) dq += ds[t * T + j] * ref_row(qkv, 1, b, j, h, T, C, D)[d];
                    for (size_t i = t; i < T; i++) {
                        dk += ds[i * T + t] * ref_row(qkv, 0, b, i, h, T, C, D)[d];
                        dv += P[i * T + t] * ref_keep_factor(p_drop, seed, offset + i * T + t) *
                            dy[(b * T + i) * C + h * D + d];
                    }
                    float *out = dqkv + (b * T + t) * 3 * C + h * D + d;
                    out[0] = (float)dq, out[C] = (float)dk, out[2 * C] = (float)dv;
                }
        }
    free(ds);
    return SHARD_OK;
}
