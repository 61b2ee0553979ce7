/* test_comm_conformance.c — one conformance suite for every communicator backend.
 *
 *   test_comm_conformance --ranks N [--case NAME]       threads backend, N ranks
 *   mpiexec -np N test_comm_conformance [--case NAME]   MPI backend
 *
 * Inputs depend on the rank and index, so every expected value has a closed
 * form.  Cases cover every dtype and op, in place and out of place, count 0,
 * counts not divisible by the world size, the v-forms with uneven counts,
 * sub-communicators of a 2-D split, point-to-point ordering and non-blocking
 * operations completed out of order.  A failed check never skips a collective
 * (that would desynchronise the ranks): it is recorded and the case goes on.
 * Each failure prints the case name to pass back with --case. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "shard/shard.h"

static const shard_dtype all_dtypes[] = {SHARD_F32, SHARD_F64, SHARD_BF16, SHARD_F16,
                                         SHARD_I8,  SHARD_I32, SHARD_I64,  SHARD_U8};
#define NDTYPES (int)(sizeof all_dtypes / sizeof all_dtypes[0])

/* ---------------------------------------------------------------- values */

static void put(shard_dtype d, void *buf, size_t i, double v) {
    switch (d) {
    case SHARD_F32: ((float *)buf)[i] = (float)v; break;
    case SHARD_F64: ((double *)buf)[i] = v; break;
    case SHARD_BF16: ((uint16_t *)buf)[i] = shard_bf16_from_f32((float)v); break;
    case SHARD_F16: ((uint16_t *)buf)[i] = shard_f16_from_f32((float)v); break;
    case SHARD_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case SHARD_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case SHARD_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case SHARD_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double get(shard_dtype d, const void *buf, size_t i) {
    switch (d) {
    case SHARD_F32: return ((const float *)buf)[i];
    case SHARD_F64: return ((const double *)buf)[i];
    case SHARD_BF16: return shard_f32_from_bf16(((const uint16_t *)buf)[i]);
    case SHARD_F16: return shard_f32_from_f16(((const uint16_t *)buf)[i]);
    case SHARD_I8: return ((const int8_t *)buf)[i];
    case SHARD_I32: return ((const int32_t *)buf)[i];
    case SHARD_I64: return (double)((const int64_t *)buf)[i];
    case SHARD_U8: return ((const uint8_t *)buf)[i];
    default: return NAN;
    }
}

/* The input of rank r at index i for a reduction `op`: small integers, exact in every dtype. */
static double input(shard_reduce_op op, shard_dtype d, int r, size_t i) {
    switch (op) {
    case SHARD_OP_PROD: return ((size_t)r + i) % 3 == 0 ? 2 : 1;
    case SHARD_OP_MAX:
    case SHARD_OP_MIN:
        return d == SHARD_U8 ? (double)(((size_t)r * 7 + i) % 11) : (double)(((size_t)r * 7 + i) % 11) - 5;
    default: return (double)(r % 5) + (double)(i % 4);
    }
}

static double expected_reduce(shard_reduce_op op, shard_dtype d, int n, size_t i) {
    double acc = input(op, d, 0, i);
    for (int p = 1; p < n; p++) {
        double v = input(op, d, p, i);
        switch (op) {
        case SHARD_OP_PROD: acc *= v; break;
        case SHARD_OP_MAX: acc = v > acc ? v : acc; break;
        case SHARD_OP_MIN: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (op == SHARD_OP_AVG) acc = shard_dtype_is_float(d) ? acc / n : trunc(acc / n);
    return acc;
}

static double tolerance(shard_dtype d, double expect) {
    switch (d) {
    case SHARD_BF16: return fabs(expect) / 128 + 1e-6;
    case SHARD_F16: return fabs(expect) / 1024 + 1e-6;
    case SHARD_F32: return fabs(expect) * 1e-6 + 1e-7;
    case SHARD_F64: return fabs(expect) * 1e-12 + 1e-12;
    default: return 0;
    }
}

static void *alloc_buf(size_t count, shard_dtype d) {
    return shard_alloc_zeroed((count ? count : 1) * shard_dtype_size(d), SHARD_MEM_OTHER);
}

static const size_t counts_to_try[] = {0, 1, 7, 61, 1000};
#define NCOUNTS (int)(sizeof counts_to_try / sizeof counts_to_try[0])

/* ---------------------------------------------------------------- cases */

static void case_all_reduce(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    for (int di = 0; di < NDTYPES; di++)
        for (int op = 0; op < SHARD_OP_COUNT; op++)
            for (int inplace = 0; inplace < 2; inplace++)
                for (int ci = 0; ci < NCOUNTS; ci++) {
                    shard_dtype d = all_dtypes[di];
                    size_t count = counts_to_try[ci] + (size_t)n; /* also not divisible by n */
                    if (ci == 0) count = 0;
                    void *send = alloc_buf(count, d), *recv = inplace ? send : alloc_buf(count, d);
                    for (size_t i = 0; i < count; i++) put(d, send, i, input(op, d, r, i));
                    shard_status s = shard_comm_all_reduce(c, send, recv, count, d, op);
                    CHECK_OK(t, s, "all_reduce %s %s %s count %zu", shard_dtype_name(d), shard_reduce_op_name(op),
                             inplace ? "in-place" : "out-of-place", count);
                    for (size_t i = 0; i < count; i++) {
                        double e = expected_reduce(op, d, n, i), g = get(d, recv, i);
                        if (!CHECK_NEAR(t, g, e, tolerance(d, e), "all_reduce %s %s %s count %zu element %zu",
                                        shard_dtype_name(d), shard_reduce_op_name(op),
                                        inplace ? "in-place" : "out-of-place", count, i))
                            break;
                    }
                    if (!inplace) shard_free(recv);
                    shard_free(send);
                }
}

/* MAX and MIN keep a NaN whichever rank holds it, on every backend (as PyTorch's max does; MPI's own
 * MPI_MAX is `a > b ? a : b` and drops a NaN that arrives first).  Element i has its NaN on rank i % n. */
static void case_max_min_nan(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    const shard_dtype dtypes[] = {SHARD_F32, SHARD_F64, SHARD_BF16, SHARD_F16};
    const shard_reduce_op ops[] = {SHARD_OP_MAX, SHARD_OP_MIN};
    size_t count = 4 * (size_t)n + 3;
    for (int di = 0; di < 4; di++)
        for (int oi = 0; oi < 2; oi++)
            for (int nonblocking = 0; nonblocking < 2; nonblocking++) {
                shard_dtype d = dtypes[di];
                void *x = alloc_buf(count, d);
                for (size_t i = 0; i < count; i++) put(d, x, i, (int)(i % (size_t)n) == r ? NAN : (double)(r + 1));
                shard_status s;
                if (nonblocking) {
                    shard_request *req = NULL;
                    s = shard_comm_iall_reduce(c, x, x, count, d, ops[oi], &req);
                    if (s == SHARD_OK) s = shard_request_wait(&req);
                } else {
                    s = shard_comm_all_reduce(c, x, x, count, d, ops[oi]);
                }
                CHECK_OK(t, s, "all_reduce %s %s with NaN", shard_dtype_name(d), shard_reduce_op_name(ops[oi]));
                for (size_t i = 0; i < count; i++)
                    if (!CHECK(t, isnan(get(d, x, i)),
                               "%sall_reduce %s %s: element %zu is %g, but rank %zu holds a "
                               "NaN there",
                               nonblocking ? "i" : "", shard_dtype_name(d), shard_reduce_op_name(ops[oi]), i,
                               get(d, x, i), i % (size_t)n))
                        break;
                shard_free(x);
            }
}

/* send and recv overlapping outside the in-place layout are refused on every rank (here recv is send
 * shifted by one element, never an in-place layout for blocks of 4): a rank would overwrite what a peer
 * still reads.  In-place all_to_allv with nothing to move (NULL buffers, zero counts) is fine, and a
 * refused isend leaves its request NULL. */
static void case_overlap_refused(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size;
    size_t count = 4, total = (size_t)n * count;
    float *b = alloc_buf(total + 1, SHARD_F32);
    for (int k = 0; k < 4; k++) {
        shard_status s = k == 0 ? shard_comm_all_reduce(c, b, b + 1, count, SHARD_F32, SHARD_OP_SUM)
            : k == 1            ? shard_comm_all_gather(c, b + 1, b, count, SHARD_F32)
            : k == 2            ? shard_comm_reduce_scatter(c, b, b + 1, count, SHARD_F32, SHARD_OP_SUM)
                                : shard_comm_all_to_all(c, b, b + 1, count, SHARD_F32);
        CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "overlaps the recv buffer"),
              "collective %d with overlapping buffers: status %d, '%s'", k, (int)s, shard_last_error());
    }
    shard_free(b);
    size_t *zeros = calloc((size_t)n, sizeof *zeros);
    if (zeros)
        CHECK_OK(t, shard_comm_all_to_allv(c, NULL, zeros, zeros, NULL, zeros, zeros, SHARD_F32),
                 "all_to_allv in place with zero counts and NULL buffers");
    free(zeros);
    float x = 0;
    shard_request *req = (shard_request *)&x; /* garbage the refusal must clear */
    CHECK(t, shard_comm_isend(c, &x, 1, SHARD_F32, n + 5, 0, &req) == SHARD_ERR_INVALID_ARG && req == NULL,
          "a refused isend leaves its request NULL");
}

/* bf16/f16 sums, averages and products are added in f32 in rank order and rounded once, on every backend
 * (MPI's own reduction would round each partial sum): the results' bits are the reference's, computed
 * here from every rank's inputs.  all_reduce blocking and not, reduce_scatter and reduce_scatterv. */
static void case_half_rounds_once(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    const shard_dtype dtypes[2] = {SHARD_BF16, SHARD_F16};
    const shard_reduce_op ops[3] = {SHARD_OP_SUM, SHARD_OP_AVG, SHARD_OP_PROD};
    size_t count = 61 * (size_t)n + 5, block = 61;
    uint16_t *x = alloc_buf(count, SHARD_BF16), *y = alloc_buf(count, SHARD_BF16);
    uint16_t *all = alloc_buf(count * (size_t)n, SHARD_BF16);
    for (int di = 0; di < 2; di++)
        for (int oi = 0; oi < 3; oi++)
            for (int form = 0; form < 4; form++) { /* all_reduce, iall_reduce, reduce_scatter, reduce_scatterv */
                shard_dtype d = dtypes[di];
                shard_reduce_op op = ops[oi];
                for (size_t i = 0; i < count; i++) /* near 1 for products, spread over binades for sums */
                    put(d, x, i,
                        op == SHARD_OP_PROD ? 1.0 + 0.0078125 * (double)((i * 7 + (size_t)r * 13) % 9)
                                            : sin((double)(i * 31 + (size_t)r * 977)) * (1 + (double)(i % 5)));
                CHECK_OK(t, shard_comm_all_gather(c, x, all, count, d), "all_gather of the inputs");
                shard_status s = SHARD_OK;
                size_t first = 0, len = count;
                if (form == 0) s = shard_comm_all_reduce(c, x, y, count, d, op);
                if (form == 1) {
                    shard_request *req = NULL;
                    s = shard_comm_iall_reduce(c, x, y, count, d, op, &req);
                    if (s == SHARD_OK) s = shard_request_wait(&req);
                }
                if (form == 2)
                    first = (size_t)r * block, len = block, s = shard_comm_reduce_scatter(c, x, y, block, d, op);
                if (form == 3) { /* uneven blocks: rank p gets p + 1 elements, packed from 0 */
                    size_t counts[64];
                    first = 0, len = (size_t)r + 1;
                    for (int p = 0; p < n && p < 64; p++) {
                        counts[p] = (size_t)p + 1;
                        if (p < r) first += counts[p];
                    }
                    s = n <= 64 ? shard_comm_reduce_scatterv(c, x, y, counts, d, op) : SHARD_OK;
                    if (n > 64) len = 0;
                }
                CHECK_OK(t, s, "%s %s form %d", shard_dtype_name(d), shard_reduce_op_name(op), form);
                for (size_t i = 0; s == SHARD_OK && i < len; i++) {
                    float acc = (float)get(d, all, first + i);
                    for (int p = 1; p < n; p++) {
                        float v = (float)get(d, all, (size_t)p * count + first + i);
                        acc = op == SHARD_OP_PROD ? acc * v : acc + v;
                    }
                    if (op == SHARD_OP_AVG) acc /= (float)n;
                    uint16_t want = d == SHARD_BF16 ? shard_bf16_from_f32(acc) : shard_f16_from_f32(acc), got = y[i];
                    if (!CHECK(t, got == want,
                               "%s %s form %d element %zu: 0x%04x, the rank-order f32 sum rounded once "
                               "is 0x%04x",
                               shard_dtype_name(d), shard_reduce_op_name(op), form, first + i, got, want))
                        break;
                }
            }
    shard_free(x);
    shard_free(y);
    shard_free(all);
}

/* A non-blocking bf16 all_reduce whose request rank 0 tests (so that its later phase may start there
 * first) while the other ranks go straight on to another collective: each rank's collectives must still
 * pair up (on MPI the later phase is point to point, never a collective started at a moment that
 * differs between ranks), and both results are right. */
static void case_half_nonblocking_order(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t count = 1000 + (size_t)n;
    uint16_t *x = alloc_buf(count, SHARD_BF16);
    for (size_t i = 0; i < count; i++) x[i] = shard_bf16_from_f32((float)(r + 1));
    for (int round = 0; round < 3; round++) {
        shard_request *req = NULL;
        CHECK_OK(t, shard_comm_iall_reduce(c, x, x, count, SHARD_BF16, SHARD_OP_SUM, &req), "iall_reduce bf16");
        if (r == 0)
            for (int k = 0; req && k < 2000; k++) {
                int done = 0;
                CHECK_OK(t, shard_request_test(&req, &done), "test");
                if (done) break;
                struct timespec pause = {0, 50000};
                nanosleep(&pause, NULL);
            }
        double y = (double)(r + 1), sum = 0;
        shard_request *other = NULL; /* blocking (round 0) or not: MPI libraries order the two kinds apart */
        if (round == 0)
            CHECK_OK(t, shard_comm_all_reduce(c, &y, &sum, 1, SHARD_F64, SHARD_OP_SUM), "all_reduce meanwhile");
        else
            CHECK_OK(t, shard_comm_iall_reduce(c, &y, &sum, 1, SHARD_F64, SHARD_OP_SUM, &other),
                     "iall_reduce meanwhile");
        CHECK_OK(t, shard_request_wait(&other), "wait (f64)");
        CHECK_OK(t, shard_request_wait(&req), "wait");
        CHECK_NEAR(t, sum, n * (n + 1) / 2.0, 0, "the f64 all_reduce issued while the bf16 one was in flight");
        double want = (double)n * (n + 1) / 2.0 * (round == 0 ? 1 : round == 1 ? n : (double)n * n);
        CHECK_NEAR(t, shard_f32_from_bf16(x[count - 1]), want, want * 1e-2, "round %d: the bf16 all_reduce", round);
    }
    shard_free(x);
}

/* Results are bit-identical on every rank; on threads they equal the sum in rank order. */
static void case_all_reduce_bitwise(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t count = 4099;
    float *x = alloc_buf(count, SHARD_F32);
    float *all = alloc_buf(count * (size_t)n, SHARD_F32);
    for (size_t i = 0; i < count; i++) x[i] = sinf((float)(i * 31 + (size_t)r * 977)) * 1e3f + 0.1f * (float)r;
    CHECK_OK(t, shard_comm_all_reduce(c, x, x, count, SHARD_F32, SHARD_OP_SUM), "all_reduce f32");
    CHECK_OK(t, shard_comm_all_gather(c, x, all, count, SHARD_F32), "all_gather of results");
    for (int p = 0; p < n; p++)
        if (!CHECK(t, memcmp(all + (size_t)p * count, x, count * sizeof(float)) == 0,
                   "rank %d's all_reduce result differs bitwise from rank %d's", p, r))
            break;
    if (strcmp(shard_comm_backend(c), "threads") == 0)
        for (size_t i = 0; i < count; i++) {
            float ref = 0;
            for (int p = 0; p < n; p++) ref += sinf((float)(i * 31 + (size_t)p * 977)) * 1e3f + 0.1f * (float)p;
            if (!CHECK(t, memcmp(&ref, &x[i], sizeof ref) == 0, "element %zu: %.9g, rank-order sum %.9g", i,
                       (double)x[i], (double)ref))
                break;
        }
    shard_free(x);
    shard_free(all);
}

/* Large vectors take the streaming-store paths (slices and blocks of 1 MiB and more). */
static void case_all_reduce_large(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t count = (size_t)n * 300000 + 7; /* 1.2 MB f32 slices, not divisible by n */
    for (int inplace = 0; inplace < 2; inplace++) {
        float *send = alloc_buf(count, SHARD_F32), *recv = inplace ? send : alloc_buf(count, SHARD_F32);
        for (size_t i = 0; i < count; i++) send[i] = (float)(r + 1) * (float)(i % 1013);
        CHECK_OK(t, shard_comm_all_reduce(c, send, recv, count, SHARD_F32, SHARD_OP_SUM), "large all_reduce");
        double factor = n * (n + 1) / 2.0;
        for (size_t i = 0; i < count; i += 1 + i / 64)
            if (!CHECK_NEAR(t, recv[i], factor * (double)(i % 1013), 0, "large all_reduce %s element %zu",
                            inplace ? "in-place" : "out-of-place", i))
                break;
        CHECK_NEAR(t, recv[count - 1], factor * (double)((count - 1) % 1013), 0, "large all_reduce last element");
        if (!inplace) shard_free(recv);
        shard_free(send);
    }
    /* all_gather, all_to_all and broadcast of blocks >= 1 MiB stream too */
    size_t block = 300001;
    float *mine = alloc_buf(block * (size_t)n, SHARD_F32), *all = alloc_buf(block * (size_t)n, SHARD_F32);
    for (size_t i = 0; i < block * (size_t)n; i++) mine[i] = (float)(r * 7) + (float)(i % 977);
    CHECK_OK(t, shard_comm_all_gather(c, mine, all, block, SHARD_F32), "large all_gather");
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < block; i += 997)
            if (!CHECK_NEAR(t, all[(size_t)p * block + i], (double)(p * 7) + (double)(i % 977), 0,
                            "large all_gather block %d element %zu", p, i))
                break;
    CHECK_OK(t, shard_comm_all_to_all(c, mine, all, block, SHARD_F32), "large all_to_all");
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < block; i += 997)
            if (!CHECK_NEAR(t, all[(size_t)p * block + i], (double)(p * 7) + (double)(((size_t)r * block + i) % 977), 0,
                            "large all_to_all block %d element %zu", p, i))
                break;
    CHECK_NEAR(t, all[(size_t)n * block - 1], (double)((n - 1) * 7) + (double)(((size_t)r * block + block - 1) % 977),
               0, "large all_to_all last element");
    CHECK_OK(t, shard_comm_broadcast(c, mine, block, SHARD_F32, n - 1), "large broadcast");
    for (size_t i = 0; i < block; i += 991)
        if (!CHECK_NEAR(t, mine[i], (double)((n - 1) * 7) + (double)(i % 977), 0, "large broadcast element %zu", i))
            break;
    CHECK_NEAR(t, mine[block - 1], (double)((n - 1) * 7) + (double)((block - 1) % 977), 0,
               "large broadcast last element");
    shard_free(mine);
    shard_free(all);
    /* bf16 and max through the same path */
    uint16_t *h = alloc_buf(count, SHARD_BF16);
    for (size_t i = 0; i < count; i++) h[i] = shard_bf16_from_f32((float)((i + (size_t)r) % 64));
    CHECK_OK(t, shard_comm_all_reduce(c, h, h, count, SHARD_BF16, SHARD_OP_MAX), "large bf16 max");
    for (size_t i = 0; i < count; i += 4099) {
        double best = 0;
        for (int p = 0; p < n; p++) best = fmax(best, (double)((i + (size_t)p) % 64));
        CHECK_NEAR(t, shard_f32_from_bf16(h[i]), best, 0, "large bf16 max element %zu", i);
    }
    shard_free(h);
}

static void case_reduce_scatter(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    static const size_t per_rank[] = {0, 1, 5, 33};
    for (int di = 0; di < NDTYPES; di++)
        for (int op = 0; op < SHARD_OP_COUNT; op++)
            for (int inplace = 0; inplace < 2; inplace++)
                for (int ci = 0; ci < 4; ci++) {
                    shard_dtype d = all_dtypes[di];
                    size_t count = per_rank[ci], total = count * (size_t)n;
                    void *send = alloc_buf(total, d);
                    void *recv = inplace ? (char *)send + (size_t)r * count * shard_dtype_size(d) : alloc_buf(count, d);
                    for (size_t i = 0; i < total; i++) put(d, send, i, input(op, d, r, i));
                    CHECK_OK(t, shard_comm_reduce_scatter(c, send, recv, count, d, op),
                             "reduce_scatter %s %s count %zu", shard_dtype_name(d), shard_reduce_op_name(op), count);
                    for (size_t i = 0; i < count; i++) {
                        double e = expected_reduce(op, d, n, (size_t)r * count + i), g = get(d, recv, i);
                        if (!CHECK_NEAR(t, g, e, tolerance(d, e), "reduce_scatter %s %s %s count %zu element %zu",
                                        shard_dtype_name(d), shard_reduce_op_name(op),
                                        inplace ? "in-place" : "out-of-place", count, i))
                            break;
                    }
                    if (!inplace) shard_free(recv);
                    shard_free(send);
                }
}

static double gather_value(int r, size_t i) { return (double)((r * 13 + (int)i) % 100); }

static void case_all_gather(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    static const size_t per_rank[] = {0, 1, 5, 17};
    for (int di = 0; di < NDTYPES; di++)
        for (int inplace = 0; inplace < 2; inplace++)
            for (int ci = 0; ci < 4; ci++) {
                shard_dtype d = all_dtypes[di];
                size_t count = per_rank[ci], es = shard_dtype_size(d);
                void *recv = alloc_buf(count * (size_t)n, d);
                void *send = inplace ? (char *)recv + (size_t)r * count * es : alloc_buf(count, d);
                for (size_t i = 0; i < count; i++) put(d, send, i, gather_value(r, i));
                CHECK_OK(t, shard_comm_all_gather(c, send, recv, count, d), "all_gather %s count %zu",
                         shard_dtype_name(d), count);
                for (int p = 0; p < n; p++)
                    for (size_t i = 0; i < count; i++)
                        CHECK_NEAR(t, get(d, recv, (size_t)p * count + i), gather_value(p, i), 0,
                                   "all_gather %s %s count %zu block %d element %zu", shard_dtype_name(d),
                                   inplace ? "in-place" : "out-of-place", count, p, i);
                if (!inplace) shard_free(send);
                shard_free(recv);
            }
}

/* Element i of the block rank p sends to rank q. */
static double a2a_value(int p, int q, size_t i) { return (double)((p * 17 + q * 5 + (int)i) % 120); }

static void case_all_to_all(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    static const size_t per_rank[] = {0, 1, 3, 10};
    for (int di = 0; di < NDTYPES; di++)
        for (int inplace = 0; inplace < 2; inplace++)
            for (int ci = 0; ci < 4; ci++) {
                shard_dtype d = all_dtypes[di];
                size_t count = per_rank[ci], total = count * (size_t)n;
                void *send = alloc_buf(total, d), *recv = inplace ? send : alloc_buf(total, d);
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < count; i++) put(d, send, (size_t)q * count + i, a2a_value(r, q, i));
                CHECK_OK(t, shard_comm_all_to_all(c, send, recv, count, d), "all_to_all %s count %zu",
                         shard_dtype_name(d), count);
                for (int p = 0; p < n; p++)
                    for (size_t i = 0; i < count; i++)
                        CHECK_NEAR(t, get(d, recv, (size_t)p * count + i), a2a_value(p, r, i), 0,
                                   "all_to_all %s %s count %zu block from rank %d element %zu", shard_dtype_name(d),
                                   inplace ? "in-place" : "out-of-place", count, p, i);
                if (!inplace) shard_free(recv);
                shard_free(send);
            }
}

static void case_broadcast(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    static const size_t counts[] = {0, 1, 100, 5000};
    for (int di = 0; di < NDTYPES; di++)
        for (int root = 0; root < n; root++)
            for (int ci = 0; ci < 4; ci++) {
                shard_dtype d = all_dtypes[di];
                size_t count = counts[ci];
                void *buf = alloc_buf(count, d);
                for (size_t i = 0; i < count; i++) put(d, buf, i, r == root ? gather_value(root, i) : 7);
                CHECK_OK(t, shard_comm_broadcast(c, buf, count, d, root), "broadcast %s root %d", shard_dtype_name(d),
                         root);
                for (size_t i = 0; i < count; i++)
                    if (!CHECK_NEAR(t, get(d, buf, i), gather_value(root, i), 0,
                                    "broadcast %s root %d count %zu element %zu", shard_dtype_name(d), root, count, i))
                        break;
                shard_free(buf);
            }
}

static void case_all_gatherv(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t counts[64], displs[64], total = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = (size_t)((p * 2 + 1) % 4); /* 1,3,1,3... with zeros when p%4 == ... */
        if (p == n - 1 && n > 1) counts[p] = 0;
        displs[p] = total + 2; /* a gap of 2 before each block */
        total = displs[p] + counts[p];
    }
    for (int inplace = 0; inplace < 2; inplace++) {
        float *recv = alloc_buf(total, SHARD_F32);
        for (size_t i = 0; i < total; i++) recv[i] = -1;
        float *send = inplace ? recv + displs[r] : alloc_buf(counts[r], SHARD_F32);
        for (size_t i = 0; i < counts[r]; i++) send[i] = (float)gather_value(r, i);
        CHECK_OK(t, shard_comm_all_gatherv(c, send, counts[r], recv, counts, displs, SHARD_F32), "all_gatherv");
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < counts[p]; i++)
                CHECK_NEAR(t, recv[displs[p] + i], gather_value(p, i), 0, "all_gatherv %s block %d element %zu",
                           inplace ? "in-place" : "out-of-place", p, i);
            CHECK_NEAR(t, recv[displs[p] - 1], -1, 0, "all_gatherv wrote into the gap before block %d", p);
        }
        if (!inplace) shard_free(send);
        shard_free(recv);
    }
    /* equal counts, displacements each rank's own (odd ranks leave gaps, even ranks pack): the ranks must
     * still call the same collective underneath */
    for (int inplace = 0; inplace < 2; inplace++) {
        size_t mine_displs[64], room = 0;
        for (int p = 0; p < n; p++) mine_displs[p] = (size_t)p * (r % 2 ? 5 : 3);
        room = (size_t)n * 5; /* the odd ranks' last gap included */
        size_t three[64];
        for (int p = 0; p < n; p++) three[p] = 3;
        float *recv = alloc_buf(room, SHARD_F32);
        for (size_t i = 0; i < room; i++) recv[i] = -1;
        float *send = inplace ? recv + mine_displs[r] : alloc_buf(3, SHARD_F32);
        for (size_t i = 0; i < 3; i++) send[i] = (float)gather_value(r, i);
        CHECK_OK(t, shard_comm_all_gatherv(c, send, 3, recv, three, mine_displs, SHARD_F32), "all_gatherv, own gaps");
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < 3; i++)
                CHECK_NEAR(t, recv[mine_displs[p] + i], gather_value(p, i), 0,
                           "all_gatherv, own gaps, %s: block %d element %zu", inplace ? "in place" : "out of place", p,
                           i);
        for (int p = 0; r % 2 && p < n; p++)
            CHECK_NEAR(t, recv[mine_displs[p] + 3], -1, 0, "all_gatherv, own gaps: wrote into the gap after block %d",
                       p);
        if (!inplace) shard_free(send);
        shard_free(recv);
    }
    /* packed displacements (NULL) */
    size_t packed = 0;
    for (int p = 0; p < n; p++) packed += counts[p];
    int32_t *recv = alloc_buf(packed, SHARD_I32), mine[4];
    for (size_t i = 0; i < counts[r]; i++) mine[i] = r * 100 + (int32_t)i;
    CHECK_OK(t, shard_comm_all_gatherv(c, mine, counts[r], recv, counts, NULL, SHARD_I32), "all_gatherv packed");
    size_t at = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < counts[p]; i++, at++)
            CHECK_EQ_INT(t, recv[at], p * 100 + (int64_t)i, "all_gatherv packed block %d element %zu", p, i);
    shard_free(recv);
}

static void case_reduce_scatterv(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t counts[64] = {0}, total = 10 + (size_t)n;
    for (int p = 0; p < n; p++) { /* the 3,3,2,2 rule, as the mesh will use */
        size_t base = total / (size_t)n, extra = total % (size_t)n;
        counts[p] = base + ((size_t)p < extra ? 1 : 0);
    }
    counts[0] += counts[n - 1], counts[n - 1] = 0; /* and one empty block */
    if (n == 1) counts[0] = total;
    size_t offset = 0;
    for (int p = 0; p < r; p++) offset += counts[p];
    for (int di = 0; di < NDTYPES; di++)
        for (int op = 0; op < SHARD_OP_COUNT; op++)
            for (int inplace = 0; inplace < 2; inplace++) {
                shard_dtype d = all_dtypes[di];
                void *send = alloc_buf(total, d);
                void *recv = inplace ? (char *)send + offset * shard_dtype_size(d) : alloc_buf(counts[r], d);
                for (size_t i = 0; i < total; i++) put(d, send, i, input(op, d, r, i));
                CHECK_OK(t, shard_comm_reduce_scatterv(c, send, recv, counts, d, op), "reduce_scatterv %s %s",
                         shard_dtype_name(d), shard_reduce_op_name(op));
                for (size_t i = 0; i < counts[r]; i++) {
                    double e = expected_reduce(op, d, n, offset + i);
                    if (!CHECK_NEAR(t, get(d, recv, i), e, tolerance(d, e), "reduce_scatterv %s %s %s element %zu",
                                    shard_dtype_name(d), shard_reduce_op_name(op),
                                    inplace ? "in-place" : "out-of-place", i))
                        break;
                }
                if (!inplace) shard_free(recv);
                shard_free(send);
            }
}

static size_t a2av_count(int p, int q) { return (size_t)((p + 2 * q) % 3); }

static void case_all_to_allv(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t sc[64], sd[64], rc[64], rd[64], stotal = 0, rtotal = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = a2av_count(r, q), sd[q] = stotal + 1, stotal = sd[q] + sc[q]; /* gaps of 1 */
        rc[q] = a2av_count(q, r), rd[q] = rtotal, rtotal += rc[q];
    }
    double *send = alloc_buf(stotal, SHARD_F64), *recv = alloc_buf(rtotal, SHARD_F64);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < sc[q]; i++) send[sd[q] + i] = a2a_value(r, q, i);
    CHECK_OK(t, shard_comm_all_to_allv(c, send, sc, sd, recv, rc, rd, SHARD_F64), "all_to_allv");
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < rc[p]; i++)
            CHECK_NEAR(t, recv[rd[p] + i], a2a_value(p, r, i), 0, "all_to_allv from rank %d element %zu", p, i);
    shard_free(send);
    shard_free(recv);
    /* in place with packed (NULL) displacements: the same layout on both sides */
    size_t ic[64], itotal = 0;
    for (int q = 0; q < n; q++) ic[q] = 2, itotal += 2;
    int64_t *buf = alloc_buf(itotal, SHARD_I64);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < 2; i++) buf[2 * q + i] = (int64_t)a2a_value(r, q, i);
    CHECK_OK(t, shard_comm_all_to_allv(c, buf, ic, NULL, buf, ic, NULL, SHARD_I64), "all_to_allv in place");
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < 2; i++)
            CHECK_EQ_INT(t, buf[2 * p + i], (int64_t)a2a_value(p, r, i), "all_to_allv in place from rank %d", p);
    shard_free(buf);
    /* in place with other displacements on each side: blocks move from the first
     * half of the buffer to the second, even on one rank */
    size_t ones[64], first[64], second[64];
    for (int q = 0; q < n; q++) ones[q] = 1, first[q] = (size_t)q, second[q] = (size_t)(n + q);
    int32_t *moved = alloc_buf(2 * (size_t)n, SHARD_I32);
    for (int q = 0; q < n; q++) moved[q] = r * 100 + q, moved[n + q] = -1;
    CHECK_OK(t, shard_comm_all_to_allv(c, moved, ones, first, moved, ones, second, SHARD_I32),
             "all_to_allv in place, displacements differ");
    for (int p = 0; p < n; p++)
        CHECK_EQ_INT(t, moved[n + p], p * 100 + r, "all_to_allv in place (moved) from rank %d", p);
    shard_free(moved);
}

/* all_to_allw: the transpose of a matrix split by rows into one split by
 * columns (uneven sizes), strided blocks on both sides, some received as one
 * contiguous row and some as several rows; f32 and bf16, blocking and not. */
static void split(size_t count, int n, int r, size_t *off, size_t *len) {
    size_t base = count / (size_t)n, extra = count % (size_t)n, ur = (size_t)r;
    *off = ur * base + (ur < extra ? ur : extra);
    *len = base + (ur < extra ? 1 : 0);
}

static void all_to_allw_transpose(test_ctx *t, shard_dtype dtype, int nonblocking) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t rows = 2 * (size_t)n + 3, cols = (size_t)n + 4, my_r0, my_rows, my_c0, my_cols;
    split(rows, n, r, &my_r0, &my_rows);
    split(cols, n, r, &my_c0, &my_cols);
    shard_tensor *src = NULL, *dst = NULL;
    size_t src_shape[2] = {my_rows, cols}, dst_shape[2] = {rows, my_cols};
    CHECK_OK(t, shard_tensor_create(dtype, 2, src_shape, SHARD_MEM_COMM, &src), "src");
    CHECK_OK(t, shard_tensor_create(dtype, 2, dst_shape, SHARD_MEM_COMM, &dst), "dst");
    if (!src || !dst) return;
    for (size_t i = 0; i < my_rows; i++)
        for (size_t j = 0; j < cols; j++) shard_tensor_set(src, i * cols + j, (double)((my_r0 + i) * 8 + j % 8));
    shard_block sb[64], rb[64];
    uint64_t expect_sent = 0;
    for (int q = 0; q < n; q++) {
        size_t c0, cn, r0, rn;
        split(cols, n, q, &c0, &cn);
        split(rows, n, q, &r0, &rn);
        sb[q] = (shard_block){c0, my_rows, cn, cols}; /* my rows of q's columns */
        if (q % 2)
            rb[q] = (shard_block){r0 * my_cols, 1, rn * my_cols, 0}; /* one contiguous run */
        else
            rb[q] = (shard_block){r0 * my_cols, rn, my_cols, my_cols};
        if (q != r) expect_sent += my_rows * cn * shard_dtype_size(dtype);
    }
    uint64_t before = shard_comm_bytes_sent(c);
    if (nonblocking) {
        shard_request *req = NULL;
        CHECK_OK(t, shard_comm_iall_to_allw(c, src->data, sb, dst->data, rb, dtype, &req), "iall_to_allw");
        CHECK_OK(t, shard_request_wait(&req), "wait iall_to_allw");
    } else {
        CHECK_OK(t, shard_comm_all_to_allw(c, src->data, sb, dst->data, rb, dtype), "all_to_allw");
    }
    CHECK_EQ_INT(t, (int64_t)(shard_comm_bytes_sent(c) - before), (int64_t)expect_sent, "all_to_allw bytes");
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < my_cols; j++)
            CHECK_NEAR(t, shard_tensor_get(dst, i * my_cols + j), (double)(i * 8 + (my_c0 + j) % 8), 0,
                       "all_to_allw %s: element (%zu, %zu)", shard_dtype_name(dtype), i, my_c0 + j);
    shard_tensor_destroy(src);
    shard_tensor_destroy(dst);
}

static void case_all_to_allw(test_ctx *t) {
    all_to_allw_transpose(t, SHARD_F32, 0);
    all_to_allw_transpose(t, SHARD_BF16, 0);
    all_to_allw_transpose(t, SHARD_F32, 1);
    /* refusals, on every rank alike (no rank enters the collective) */
    int n = t->size;
    float buf[4];
    shard_block bad[64], empty[64];
    for (int q = 0; q < n; q++) bad[q] = (shard_block){0, 2, 2, 1}, empty[q] = (shard_block){0, 0, 0, 0};
    shard_status s = shard_comm_all_to_allw(t->comm, buf, bad, buf + 2, empty, SHARD_F32);
    CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "need stride >= row length"),
          "stride < row length: %s", shard_last_error());
    s = shard_comm_all_to_allw(t->comm, buf, empty, buf, empty, SHARD_F32);
    CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "not in place"), "in place: %s",
          shard_last_error());
}

static void case_barrier(test_ctx *t) {
    for (int i = 0; i < 50; i++) CHECK_OK(t, shard_comm_barrier(t->comm), "barrier %d", i);
    shard_request *req = NULL;
    CHECK_OK(t, shard_comm_ibarrier(t->comm, &req), "ibarrier");
    CHECK_OK(t, shard_request_wait(&req), "ibarrier wait");
}

static void case_point_to_point(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    /* ring: non-blocking send, blocking recv */
    int64_t out[3] = {r, r * 10, -r}, in[3] = {-1, -1, -1};
    shard_request *sreq = NULL;
    CHECK_OK(t, shard_comm_isend(c, out, 3, SHARD_I64, next, 5, &sreq), "isend");
    CHECK_OK(t, shard_comm_recv(c, in, 3, SHARD_I64, prev, 5), "recv");
    CHECK_OK(t, shard_request_wait(&sreq), "isend wait");
    CHECK_EQ_INT(t, in[0], prev, "ring value from rank %d", prev);
    CHECK_EQ_INT(t, in[1], prev * 10, "ring value from rank %d", prev);
    /* small blocking sends before the receives on every rank: eager on the threads
     * backend and in both MPI libraries; to oneself only the threads backend and
     * Open MPI buffer (MPI does not promise it), so skip that on MPI */
    if (n > 1 || strcmp(shard_comm_backend(c), "threads") == 0) {
        int32_t small_out[16], small_in[16];
        for (int i = 0; i < 16; i++) small_out[i] = r * 16 + i;
        CHECK_OK(t, shard_comm_send(c, small_out, 16, SHARD_I32, next, 6), "blocking small send before recv");
        CHECK_OK(t, shard_comm_recv(c, small_in, 16, SHARD_I32, prev, 6), "recv after blocking send");
        CHECK_EQ_INT(t, small_in[15], prev * 16 + 15, "small message from rank %d", prev);
    }
    /* two tags, received in the opposite order to sending; same tag keeps order */
    float a = 1.5f + (float)r, b = 2.5f + (float)r, b2 = 3.5f + (float)r, ra = 0, rb = 0, rb2 = 0;
    shard_request *reqs[3];
    CHECK_OK(t, shard_comm_isend(c, &a, 1, SHARD_F32, next, 1, &reqs[0]), "isend tag 1");
    CHECK_OK(t, shard_comm_isend(c, &b, 1, SHARD_F32, next, 2, &reqs[1]), "isend tag 2");
    CHECK_OK(t, shard_comm_isend(c, &b2, 1, SHARD_F32, next, 2, &reqs[2]), "isend tag 2 again");
    CHECK_OK(t, shard_comm_recv(c, &rb, 1, SHARD_F32, prev, 2), "recv tag 2");
    CHECK_OK(t, shard_comm_recv(c, &rb2, 1, SHARD_F32, prev, 2), "recv tag 2 again");
    CHECK_OK(t, shard_comm_recv(c, &ra, 1, SHARD_F32, prev, 1), "recv tag 1");
    CHECK_OK(t, shard_request_wait_all(3, reqs), "sends");
    CHECK_NEAR(t, ra, 1.5 + prev, 0, "tag 1 message");
    CHECK_NEAR(t, rb, 2.5 + prev, 0, "first tag 2 message");
    CHECK_NEAR(t, rb2, 3.5 + prev, 0, "second tag 2 message (order kept)");
    /* to self, and count 0 */
    uint8_t self_out[5] = {1, 2, 3, 4, 5}, self_in[5] = {0};
    shard_request *self_req = NULL;
    CHECK_OK(t, shard_comm_irecv(c, self_in, 5, SHARD_U8, r, 9, &self_req), "irecv self");
    CHECK_OK(t, shard_comm_send(c, self_out, 5, SHARD_U8, r, 9), "send self");
    CHECK_OK(t, shard_request_wait(&self_req), "irecv self wait");
    CHECK(t, memcmp(self_in, self_out, 5) == 0, "message to self");
    shard_request *z[2];
    CHECK_OK(t, shard_comm_irecv(c, NULL, 0, SHARD_F32, prev, 3, &z[0]), "irecv count 0");
    CHECK_OK(t, shard_comm_isend(c, NULL, 0, SHARD_F32, next, 3, &z[1]), "isend count 0");
    CHECK_OK(t, shard_request_wait_all(2, z), "count 0 messages");
    /* a large message */
    size_t big = 1 << 18;
    float *bo = alloc_buf(big, SHARD_F32), *bi = alloc_buf(big, SHARD_F32);
    for (size_t i = 0; i < big; i++) bo[i] = (float)(i % 1000) + (float)r;
    shard_request *br[2];
    CHECK_OK(t, shard_comm_irecv(c, bi, big, SHARD_F32, prev, 4, &br[0]), "irecv big");
    CHECK_OK(t, shard_comm_isend(c, bo, big, SHARD_F32, next, 4, &br[1]), "isend big");
    int done = 0;
    while (!done) CHECK_OK(t, shard_request_test(&br[0], &done), "test big");
    CHECK_OK(t, shard_request_wait(&br[1]), "wait big send");
    for (size_t i = 0; i < big; i += 997)
        CHECK_NEAR(t, bi[i], (float)(i % 1000) + (float)prev, 0, "big message element %zu", i);
    shard_free(bo);
    shard_free(bi);
}

static void case_nonblocking_out_of_order(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t count = 1000;
    float *a = alloc_buf(count, SHARD_F32);
    int32_t *g = alloc_buf((size_t)n * 3, SHARD_I32), mine[3] = {r, r + 1, r + 2};
    double *rs_in = alloc_buf(5 * (size_t)n, SHARD_F64), rs_out[5];
    for (size_t i = 0; i < count; i++) a[i] = (float)(r + 1);
    for (size_t i = 0; i < 5 * (size_t)n; i++) rs_in[i] = (double)i;
    shard_request *ra = NULL, *rg = NULL, *rr = NULL, *rb = NULL;
    CHECK_OK(t, shard_comm_iall_reduce(c, a, a, count, SHARD_F32, SHARD_OP_SUM, &ra), "iall_reduce");
    CHECK_OK(t, shard_comm_iall_gather(c, mine, g, 3, SHARD_I32, &rg), "iall_gather");
    CHECK_OK(t, shard_comm_ireduce_scatter(c, rs_in, rs_out, 5, SHARD_F64, SHARD_OP_MAX, &rr), "ireduce_scatter");
    int64_t bval = r == 0 ? 4242 : 0;
    CHECK_OK(t, shard_comm_ibroadcast(c, &bval, 1, SHARD_I64, 0, &rb), "ibroadcast");
    /* a blocking collective in between runs after the queued ones */
    int32_t one = 1, total = 0;
    CHECK_OK(t, shard_comm_all_reduce(c, &one, &total, 1, SHARD_I32, SHARD_OP_SUM),
             "blocking all_reduce among requests");
    CHECK_EQ_INT(t, total, n, "blocking all_reduce among requests");
    /* complete in reverse order, one by polling */
    CHECK_OK(t, shard_request_wait(&rb), "wait ibroadcast");
    int done = 0;
    while (!done) CHECK_OK(t, shard_request_test(&rr, &done), "test ireduce_scatter");
    CHECK(t, rr == NULL, "a completed request is released and set to NULL");
    CHECK_OK(t, shard_request_wait(&rg), "wait iall_gather");
    CHECK_OK(t, shard_request_wait(&ra), "wait iall_reduce");
    CHECK_EQ_INT(t, bval, 4242, "ibroadcast value");
    for (size_t i = 0; i < 5; i++)
        CHECK_NEAR(t, rs_out[i], (double)((size_t)r * 5 + i), 0, "ireduce_scatter max element %zu", i);
    for (int p = 0; p < n; p++) CHECK_EQ_INT(t, g[3 * p + 1], p + 1, "iall_gather block %d", p);
    for (size_t i = 0; i < count; i += 111) CHECK_NEAR(t, a[i], n * (n + 1) / 2.0, 0, "iall_reduce element %zu", i);
    /* the v-forms and all_to_all as non-blocking too */
    size_t cnt[64], tot = 0;
    for (int p = 0; p < n; p++) cnt[p] = (size_t)(p % 2 + 1), tot += cnt[p];
    int32_t *gv = alloc_buf(tot, SHARD_I32), src[2] = {r * 3, r * 3 + 1};
    int32_t *a2 = alloc_buf((size_t)n, SHARD_I32), a2o[64];
    for (int q = 0; q < n; q++) a2[q] = r * 100 + q;
    float *rsv = alloc_buf(tot, SHARD_F32), rsv_out[2] = {0, 0};
    for (size_t i = 0; i < tot; i++) rsv[i] = 1;
    size_t ones[64];
    for (int q = 0; q < n; q++) ones[q] = 1;
    shard_request *rv[4];
    CHECK_OK(t, shard_comm_iall_gatherv(c, src, cnt[r], gv, cnt, NULL, SHARD_I32, &rv[0]), "iall_gatherv");
    CHECK_OK(t, shard_comm_iall_to_all(c, a2, a2o, 1, SHARD_I32, &rv[1]), "iall_to_all");
    CHECK_OK(t, shard_comm_ireduce_scatterv(c, rsv, rsv_out, cnt, SHARD_F32, SHARD_OP_SUM, &rv[2]), "ireduce_scatterv");
    CHECK_OK(t, shard_comm_iall_to_allv(c, a2, ones, NULL, a2, ones, NULL, SHARD_I32, &rv[3]), "iall_to_allv in place");
    CHECK_OK(t, shard_request_wait(&rv[3]), "wait iall_to_allv");
    CHECK_OK(t, shard_request_wait_all(3, rv), "wait the rest");
    size_t at = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < cnt[p]; i++, at++) CHECK_EQ_INT(t, gv[at], p * 3 + (int)i, "iall_gatherv block %d", p);
    for (int p = 0; p < n; p++) CHECK_EQ_INT(t, a2o[p], p * 100 + r, "iall_to_all from %d", p);
    for (int p = 0; p < n; p++) CHECK_EQ_INT(t, a2[p], p * 100 + r, "iall_to_allv in place from %d", p);
    for (size_t i = 0; i < cnt[r]; i++) CHECK_NEAR(t, rsv_out[i], n, 0, "ireduce_scatterv element %zu", i);
    shard_free(gv);
    shard_free(a2);
    shard_free(rsv);
    shard_free(a);
    shard_free(g);
    shard_free(rs_in);
}

static void case_split_2d(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    int cols = n % 2 == 0 ? 2 : 1, rows = n / cols;
    shard_comm *row = NULL, *col = NULL;
    CHECK_OK(t, shard_comm_split(c, r / cols, r, &row), "split rows");
    CHECK_OK(t, shard_comm_split(c, r % cols, r, &col), "split columns");
    if (!CHECK(t, row && col, "split returned communicators")) return;
    CHECK_EQ_INT(t, shard_comm_size(row), cols, "row size");
    CHECK_EQ_INT(t, shard_comm_size(col), rows, "column size");
    CHECK_EQ_INT(t, shard_comm_rank(row), r % cols, "rank in row");
    CHECK_EQ_INT(t, shard_comm_rank(col), r / cols, "rank in column");
    int64_t v = r, sum = 0;
    CHECK_OK(t, shard_comm_all_reduce(row, &v, &sum, 1, SHARD_I64, SHARD_OP_SUM), "row all_reduce");
    int64_t base = (r / cols) * cols, expect = 0;
    for (int q = 0; q < cols; q++) expect += base + q;
    CHECK_EQ_INT(t, sum, expect, "row sum");
    int64_t csum = 0, cexpect = 0;
    CHECK_OK(t, shard_comm_all_reduce(col, &v, &csum, 1, SHARD_I64, SHARD_OP_SUM), "column all_reduce");
    for (int q = 0; q < rows; q++) cexpect += q * cols + r % cols;
    CHECK_EQ_INT(t, csum, cexpect, "column sum");
    /* a collective on a sub-communicator interleaved with one on the parent */
    shard_request *req = NULL;
    int32_t g[64];
    int32_t me = r;
    CHECK_OK(t, shard_comm_iall_gather(col, &me, g, 1, SHARD_I32, &req), "column iall_gather");
    CHECK_OK(t, shard_comm_barrier(c), "world barrier");
    CHECK_OK(t, shard_request_wait(&req), "column iall_gather wait");
    for (int q = 0; q < rows; q++) CHECK_EQ_INT(t, g[q], q * cols + r % cols, "column gather %d", q);
    /* reversed keys reverse the order; negative color leaves a rank out */
    shard_comm *rev = NULL, *some = NULL;
    CHECK_OK(t, shard_comm_split(c, 0, -r, &rev), "split reversed");
    if (CHECK(t, rev != NULL, "reversed split")) CHECK_EQ_INT(t, shard_comm_rank(rev), n - 1 - r, "reversed rank");
    CHECK_OK(t, shard_comm_split(c, r == 0 && n > 1 ? -1 : 1, r, &some), "split leaving rank 0 out");
    if (r == 0 && n > 1)
        CHECK(t, some == NULL, "rank 0 left out");
    else if (CHECK(t, some != NULL, "member")) {
        CHECK_EQ_INT(t, shard_comm_size(some), n > 1 ? n - 1 : 1, "size without rank 0");
        CHECK_OK(t, shard_comm_barrier(some), "barrier without rank 0");
    }
    shard_comm_destroy(row);
    shard_comm_destroy(col);
    shard_comm_destroy(rev);
    shard_comm_destroy(some);
}

/* The communication layer counts what the bandwidth-optimal algorithm sends. */
static void case_traffic_counters(test_ctx *t) {
    shard_comm *c = t->comm;
    int n = t->size, r = t->rank;
    size_t count = 1003;
    float *x = alloc_buf(count * (size_t)n, SHARD_F32), *y = alloc_buf(count * (size_t)n, SHARD_F32);
    uint64_t before = shard_comm_bytes_sent(c);
    CHECK_OK(t, shard_comm_all_reduce(c, x, y, count, SHARD_F32, SHARD_OP_SUM), "all_reduce");
    uint64_t ar = shard_comm_bytes_sent(c) - before;
    /* cost.h's count, which test_cost holds to hand counts */
    CHECK_EQ_INT(t, (int64_t)ar, (int64_t)shard_cost_all_reduce_bytes(count, (size_t)n, (size_t)r, 4),
                 "all_reduce bytes");
    before = shard_comm_bytes_sent(c);
    CHECK_OK(t, shard_comm_all_gather(c, x, y, count, SHARD_F32), "all_gather");
    CHECK_EQ_INT(t, (int64_t)(shard_comm_bytes_sent(c) - before), (int64_t)(4 * count * (size_t)(n - 1)),
                 "all_gather bytes");
    before = shard_comm_bytes_sent(c);
    CHECK_OK(t, shard_comm_reduce_scatter(c, x, y, count, SHARD_F32, SHARD_OP_SUM), "reduce_scatter");
    CHECK_EQ_INT(t, (int64_t)(shard_comm_bytes_sent(c) - before), (int64_t)(4 * count * (size_t)(n - 1)),
                 "reduce_scatter bytes");
    shard_free(x);
    shard_free(y);
}

static const test_case cases[] = {
    {"all_reduce", case_all_reduce},
    {"all_reduce_bitwise", case_all_reduce_bitwise},
    {"max_min_nan", case_max_min_nan},
    {"half_rounds_once", case_half_rounds_once},
    {"half_nonblocking_order", case_half_nonblocking_order},
    {"overlap_refused", case_overlap_refused},
    {"all_reduce_large", case_all_reduce_large},
    {"reduce_scatter", case_reduce_scatter},
    {"all_gather", case_all_gather},
    {"all_to_all", case_all_to_all},
    {"broadcast", case_broadcast},
    {"all_gatherv", case_all_gatherv},
    {"reduce_scatterv", case_reduce_scatterv},
    {"all_to_allv", case_all_to_allv},
    {"all_to_allw", case_all_to_allw},
    {"barrier", case_barrier},
    {"point_to_point", case_point_to_point},
    {"nonblocking_out_of_order", case_nonblocking_out_of_order},
    {"split_2d", case_split_2d},
    {"traffic_counters", case_traffic_counters},
};

int main(int argc, char **argv) {
    return test_main(argc, argv, "test_comm_conformance", cases, sizeof cases / sizeof cases[0]);
}
