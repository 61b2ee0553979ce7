/* test_comm_stress.c — many collectives of random kinds and sizes, blocking and
 * non-blocking, on the world and on sub-communicators, each result checked.
 * The sequence comes from one seed, so every rank draws the same ops; the aim
 * is races and ordering bugs that a handful of calls would not show.
 *   test_comm_stress --ranks N [--case NAME]      (or under mpiexec) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static uint64_t next(uint64_t *s) { /* splitmix64: the same stream on every rank */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct pending {
    shard_request *req;
    int kind; /* 0 all_reduce, 1 all_gather, 2 reduce_scatter, 3 all_to_all */
    size_t count;
    int32_t *send, *recv;
} pending;

static void check_result(test_ctx *t, shard_comm *c, const pending *p, int iter) {
    int n = shard_comm_size(c), r = shard_comm_rank(c);
    for (size_t i = 0; i < p->count; i += 1 + p->count / 50) {
        switch (p->kind) {
        case 0: /* sum of (rank + i) */
            CHECK_EQ_INT(t, p->recv[i], (int64_t)n * (int64_t)(i % 1000) + (int64_t)n * (n - 1) / 2,
                         "iteration %d all_reduce element %zu", iter, i);
            break;
        case 1:
            for (int q = 0; q < n; q++)
                CHECK_EQ_INT(t, p->recv[(size_t)q * p->count + i], q * 1000 + (int64_t)(i % 1000),
                             "iteration %d all_gather block %d element %zu", iter, q, i);
            break;
        case 2:
            CHECK_EQ_INT(t, p->recv[i], (int64_t)n * (int64_t)((r * p->count + i) % 1000) + (int64_t)n * (n - 1) / 2,
                         "iteration %d reduce_scatter element %zu", iter, i);
            break;
        default:
            for (int q = 0; q < n; q++)
                CHECK_EQ_INT(t, p->recv[(size_t)q * p->count + i], q * 1000 + r,
                             "iteration %d all_to_all from %d element %zu", iter, q, i);
        }
    }
}

static void start(test_ctx *t, shard_comm *c, pending *p, int kind, size_t count, int blocking, int iter) {
    int n = shard_comm_size(c), r = shard_comm_rank(c);
    size_t total = count * (size_t)n;
    p->kind = kind, p->count = count, p->req = NULL;
    p->send = shard_alloc((total + 1) * 4, SHARD_MEM_OTHER);
    p->recv = shard_alloc((total + 1) * 4, SHARD_MEM_OTHER);
    shard_status s = SHARD_OK;
    switch (kind) {
    case 0:
        for (size_t i = 0; i < count; i++) p->send[i] = r + (int32_t)(i % 1000);
        s = blocking ? shard_comm_all_reduce(c, p->send, p->recv, count, SHARD_I32, SHARD_OP_SUM)
                     : shard_comm_iall_reduce(c, p->send, p->recv, count, SHARD_I32, SHARD_OP_SUM, &p->req);
        break;
    case 1:
        for (size_t i = 0; i < count; i++) p->send[i] = r * 1000 + (int32_t)(i % 1000);
        s = blocking ? shard_comm_all_gather(c, p->send, p->recv, count, SHARD_I32)
                     : shard_comm_iall_gather(c, p->send, p->recv, count, SHARD_I32, &p->req);
        break;
    case 2:
        for (size_t i = 0; i < total; i++) p->send[i] = r + (int32_t)(i % 1000);
        s = blocking ? shard_comm_reduce_scatter(c, p->send, p->recv, count, SHARD_I32, SHARD_OP_SUM)
                     : shard_comm_ireduce_scatter(c, p->send, p->recv, count, SHARD_I32, SHARD_OP_SUM, &p->req);
        break;
    default:
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++) p->send[(size_t)q * count + i] = r * 1000 + q;
        s = blocking ? shard_comm_all_to_all(c, p->send, p->recv, count, SHARD_I32)
                     : shard_comm_iall_to_all(c, p->send, p->recv, count, SHARD_I32, &p->req);
    }
    CHECK_OK(t, s, "iteration %d start op %d count %zu", iter, kind, count);
}

static void finish(test_ctx *t, shard_comm *c, pending *p, int iter) {
    if (p->req) CHECK_OK(t, shard_request_wait(&p->req), "iteration %d wait op %d", iter, p->kind);
    check_result(t, c, p, iter);
    shard_free(p->send);
    shard_free(p->recv);
}

static void stress(test_ctx *t, shard_comm *c, uint64_t seed, int iterations) {
    enum { MAX_PENDING = 6 };
    for (int iter = 0; iter < iterations; iter++) {
        int batch = 1 + (int)(next(&seed) % MAX_PENDING);
        int blocking = next(&seed) % 3 == 0;
        pending p[MAX_PENDING];
        for (int k = 0; k < batch; k++) {
            int kind = (int)(next(&seed) % 4);
            size_t count = next(&seed) % 4 == 0 ? (size_t)(next(&seed) % 200000) : (size_t)(next(&seed) % 300);
            start(t, c, &p[k], kind, count, blocking, iter);
            if (blocking) finish(t, c, &p[k], iter);
        }
        if (!blocking) /* complete in a shuffled order */
            for (int left = batch; left > 0; left--) {
                int k = (int)(next(&seed) % (uint64_t)left);
                finish(t, c, &p[k], iter);
                p[k] = p[left - 1];
            }
    }
}

static void case_random_world(test_ctx *t) { stress(t, t->comm, 42, 400); }

static void case_random_subcomms(test_ctx *t) {
    shard_comm *half = NULL;
    CHECK_OK(t, shard_comm_split(t->comm, t->rank % 2, t->rank, &half), "split");
    if (!half) return;
    /* both halves run different streams at once, then the world runs one */
    stress(t, half, 1000 + (uint64_t)(t->rank % 2), 200);
    shard_comm_destroy(half);
    stress(t, t->comm, 7, 60);
}

static const test_case cases[] = {
    {"random_world", case_random_world},
    {"random_subcomms", case_random_subcomms},
};

int main(int argc, char **argv) {
    return test_main(argc, argv, "test_comm_stress", cases, sizeof cases / sizeof cases[0]);
}
