/* test_comm_diagnostics.c — the "never hang, always say why" promises, threads backend.
 *
 * Each case launches its own small job with a short deadline and checks the
 * text every rank got back: a rank that skips a collective is named within
 * the deadline; a dtype, count or op mismatch fails on every rank naming both
 * sides; a rank that fails makes the others stop promptly with its cause;
 * point-to-point timeouts name the silent peer; bad arguments get one clear
 * line.  Run: test_comm_diagnostics [--case NAME] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "expect.h"
#include "shard/shard.h"

#define MAX_RANKS 8

typedef struct outcome {
    shard_status status[MAX_RANKS];
    char text[MAX_RANKS][600];
    double seconds[MAX_RANKS];
} outcome;

typedef struct job {
    int scenario;
    outcome *out;
} job;

#include <stdatomic.h>
static _Atomic int failures; /* ranks are threads */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum {
    SKIP_ONE,
    SKIP_TWO,
    DTYPE_MISMATCH,
    COUNT_MISMATCH,
    KIND_MISMATCH,
    ALLTOALLV_MISMATCH,
    RANK_FAILS,
    RECV_NEVER_SENT,
    SEND_NEVER_RECEIVED,
    MESSAGE_SIZE_MISMATCH,
    NONBLOCKING_SKIP,
    SUBCOMM_SKIP,
    QUEUE_AFTER_TIMEOUT,
};

static shard_status record(job *j, int r, shard_status s, double t0) {
    j->out->status[r] = s;
    j->out->seconds[r] = now() - t0;
    snprintf(j->out->text[r], sizeof j->out->text[r], "%s", s < 0 ? shard_last_error() : "");
    return s;
}

static shard_status scenario_rank(shard_comm *comm, void *arg) {
    job *j = arg;
    int r = shard_comm_rank(comm), n = shard_comm_size(comm);
    float x[1024] = {0}, y[1024 * MAX_RANKS];
    double xd[1024] = {0};
    double t0 = now();
    shard_status s = SHARD_OK;
    switch (j->scenario) {
    case SKIP_ONE: /* rank 3 never enters the all_reduce */
        if (r == 3) return record(j, r, SHARD_OK, t0);
        s = shard_comm_all_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM);
        break;
    case SKIP_TWO: /* ranks 3 and 5 do one collective, the others two */
        s = shard_comm_barrier(comm);
        if (s == SHARD_OK && r != 3 && r != 5) s = shard_comm_all_reduce(comm, x, x, 16, SHARD_F32, SHARD_OP_SUM);
        break;
    case DTYPE_MISMATCH:
        s = r == 1 ? shard_comm_all_reduce(comm, xd, xd, 1024, SHARD_F64, SHARD_OP_SUM)
                   : shard_comm_all_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM);
        break;
    case COUNT_MISMATCH: s = shard_comm_all_reduce(comm, x, x, r == 2 ? 512 : 1024, SHARD_F32, SHARD_OP_SUM); break;
    case KIND_MISMATCH:
        s = r == 2 ? shard_comm_all_gather(comm, x, y, 1024, SHARD_F32)
                   : shard_comm_all_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM);
        break;
    case ALLTOALLV_MISMATCH: {
        size_t sc[MAX_RANKS], rc[MAX_RANKS];
        for (int q = 0; q < n; q++) sc[q] = rc[q] = 2;
        if (r == 1) sc[2] = 3; /* rank 1 sends 3 to rank 2, which expects 2 */
        s = shard_comm_all_to_allv(comm, x, sc, NULL, y, rc, NULL, SHARD_F32);
        break;
    }
    case RANK_FAILS: {          /* rank 1 fails before the collective; the deadline is long */
        shard_comm *own = NULL; /* a one-rank communicator: after the abort its calls fail too */
        s = shard_comm_split(comm, r, 0, &own);
        if (s == SHARD_OK && r == 1) s = shard_error(SHARD_ERR_IO, "injected failure: disk on fire");
        if (s == SHARD_OK) s = shard_comm_all_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM);
        if (s == SHARD_ERR_ABORTED) {
            char text[512];
            snprintf(text, sizeof text, "%s", shard_last_error());
            if (shard_comm_all_reduce(own, x, x, 4, SHARD_F32, SHARD_OP_SUM) != SHARD_ERR_ABORTED)
                s = shard_error(SHARD_ERR_INTERNAL, "a one-rank communicator's all_reduce succeeded after the abort");
            else
                s = shard_error(SHARD_ERR_ABORTED, "%s", text); /* the world's text, for the checks */
        }
        shard_comm_destroy(own);
        break;
    }
    case RECV_NEVER_SENT:
        if (r == 0) s = shard_comm_recv(comm, x, 4, SHARD_F32, 1, 7);
        break;
    case SEND_NEVER_RECEIVED: /* large: small sends complete eagerly */
        if (r == 0) {
            float *big = calloc(100000, sizeof *big);
            s = big ? shard_comm_send(comm, big, 100000, SHARD_F32, 1, 3) : SHARD_ERR_NO_MEMORY;
            free(big);
        }
        break;
    case MESSAGE_SIZE_MISMATCH:
        if (r == 0) s = shard_comm_send(comm, x, 4, SHARD_F32, 1, 0);
        if (r == 1) s = shard_comm_recv(comm, x, 8, SHARD_F32, 0, 0);
        break;
    case NONBLOCKING_SKIP: {
        shard_request *req = NULL;
        if (r == 2) return record(j, r, SHARD_OK, t0);
        s = shard_comm_iall_reduce(comm, x, x, 1024, SHARD_F32, SHARD_OP_SUM, &req);
        if (s == SHARD_OK) s = shard_request_wait(&req);
        break;
    }
    case QUEUE_AFTER_TIMEOUT: { /* rank 2 leaves; the others queue four collectives */
        if (r == 2) return record(j, r, SHARD_OK, t0);
        shard_request *req[4];
        for (int k = 0; k < 4 && s == SHARD_OK; k++)
            s = shard_comm_iall_reduce(comm, x + 4 * k, x + 4 * k, 4, SHARD_F32, SHARD_OP_SUM, &req[k]);
        if (s == SHARD_OK) {
            shard_status last = shard_request_wait_all(4, req);
            j->out->seconds[r] = now() - t0;
            snprintf(j->out->text[r], sizeof j->out->text[r], "%s", shard_last_error());
            j->out->status[r] = last;
            return last;
        }
        break;
    }
    case SUBCOMM_SKIP: {
        shard_comm *sub = NULL;
        s = shard_comm_split(comm, r % 2, r, &sub);
        if (s == SHARD_OK) s = shard_comm_set_name(sub, r % 2 ? "odd" : "even");
        if (s == SHARD_OK && r != 3) s = shard_comm_barrier(sub); /* rank 3 = rank 1 of 'odd' */
        shard_comm_destroy(sub);
        break;
    }
    }
    return record(j, r, s, t0);
}

static shard_status run(int scenario, int ranks, double timeout, outcome *out, double *elapsed) {
    memset(out, 0, sizeof *out);
    job j = {scenario, out};
    shard_launch_config cfg = shard_launch_config_default();
    cfg.ranks = ranks;
    cfg.timeout_seconds = timeout;
    double t0 = now();
    shard_status s = shard_launch_with(&cfg, scenario_rank, &j);
    *elapsed = now() - t0;
    return s;
}

static void test_timeout_names_missing_rank(void) {
    outcome o;
    double elapsed;
    shard_status s = run(SKIP_ONE, 4, 1.0, &o, &elapsed);
    EXPECT(s == SHARD_ERR_TIMEOUT, "launch status %s, expected timeout (%s)", shard_status_string(s),
           shard_last_error());
    const char *want = "timeout after 1 s in all_reduce #1 on comm 'world': rank 3 never entered it";
    for (int r = 0; r < 3; r++) {
        EXPECT(o.status[r] == SHARD_ERR_TIMEOUT || o.status[r] == SHARD_ERR_ABORTED, "rank %d status %s", r,
               shard_status_string(o.status[r]));
        EXPECT(strstr(o.text[r], want) != NULL, "rank %d text '%s' lacks '%s'", r, o.text[r], want);
    }
    EXPECT(strstr(shard_last_error(), want) != NULL, "launch text '%s' lacks '%s'", shard_last_error(), want);
    EXPECT(elapsed >= 0.95 && elapsed < 4.0, "took %.2f s with a 1 s deadline", elapsed);
}

static void test_timeout_names_two_ranks(void) {
    outcome o;
    double elapsed;
    run(SKIP_TWO, 6, 0.5, &o, &elapsed);
    const char *want = "in all_reduce #2 on comm 'world': ranks 3,5 never entered it";
    EXPECT(strstr(o.text[0], want) != NULL, "rank 0 text '%s' lacks '%s'", o.text[0], want);
    EXPECT(strstr(o.text[0], "timeout after 0.5 s") != NULL, "rank 0 text '%s' lacks the deadline", o.text[0]);
    EXPECT(elapsed < 3.5, "took %.2f s with a 0.5 s deadline", elapsed);
}

static void expect_all(const outcome *o, int ranks, shard_status status, const char *want) {
    for (int r = 0; r < ranks; r++) {
        EXPECT(o->status[r] == status, "rank %d status %s, expected %s (%s)", r, shard_status_string(o->status[r]),
               shard_status_string(status), o->text[r]);
        EXPECT(strstr(o->text[r], want) != NULL, "rank %d text '%s' lacks '%s'", r, o->text[r], want);
    }
}

static void test_dtype_mismatch(void) {
    outcome o;
    double elapsed;
    run(DTYPE_MISMATCH, 3, 10, &o, &elapsed);
    expect_all(&o, 3, SHARD_ERR_MISMATCH,
               "collective mismatch at #1 on 'world': rank 0 all_reduce f32 x1024, rank 1 all_reduce f64 x1024");
    EXPECT(elapsed < 3, "mismatch took %.2f s to report", elapsed);
}

static void test_count_mismatch(void) {
    outcome o;
    double elapsed;
    run(COUNT_MISMATCH, 4, 10, &o, &elapsed);
    expect_all(&o, 4, SHARD_ERR_MISMATCH,
               "collective mismatch at #1 on 'world': rank 0 all_reduce f32 x1024, rank 2 all_reduce f32 x512");
}

static void test_kind_mismatch(void) {
    outcome o;
    double elapsed;
    run(KIND_MISMATCH, 3, 10, &o, &elapsed);
    expect_all(&o, 3, SHARD_ERR_MISMATCH,
               "collective mismatch at #1 on 'world': rank 0 all_reduce f32 x1024, rank 2 all_gather f32 x1024");
}

static void test_all_to_allv_mismatch(void) {
    outcome o;
    double elapsed;
    run(ALLTOALLV_MISMATCH, 3, 10, &o, &elapsed);
    expect_all(&o, 3, SHARD_ERR_MISMATCH, "all_to_allv rank 1 sends 3 elements to rank 2, which expects 2");
}

static void test_failing_rank_stops_others(void) {
    outcome o;
    double elapsed;
    shard_status s = run(RANK_FAILS, 4, 60, &o, &elapsed);
    EXPECT(s == SHARD_ERR_IO, "launch status %s, expected the root cause's (i/o error)", shard_status_string(s));
    EXPECT(strstr(shard_last_error(), "rank 1 failed: injected failure: disk on fire") != NULL,
           "launch text '%s' lacks the root cause", shard_last_error());
    for (int r = 0; r < 4; r++) {
        if (r == 1) continue;
        EXPECT(o.status[r] == SHARD_ERR_ABORTED, "rank %d status %s, expected aborted", r,
               shard_status_string(o.status[r]));
        EXPECT(strstr(o.text[r], "aborted in all_reduce #3 on comm 'world': rank 1 failed: injected failure") != NULL,
               "rank %d text '%s'", r, o.text[r]);
        EXPECT(o.seconds[r] < 2.0, "rank %d took %.2f s to stop (deadline 60 s)", r, o.seconds[r]);
    }
}

static void test_recv_never_sent(void) {
    outcome o;
    double elapsed;
    run(RECV_NEVER_SENT, 2, 0.5, &o, &elapsed);
    EXPECT(o.status[0] == SHARD_ERR_TIMEOUT, "status %s", shard_status_string(o.status[0]));
    const char *want =
        "timeout after 0.5 s in recv #1 on comm 'world': rank 1 never sent the message (tag 7, 16 bytes)";
    EXPECT(strstr(o.text[0], want) != NULL, "text '%s' lacks '%s'", o.text[0], want);
}

static void test_send_never_received(void) {
    outcome o;
    double elapsed;
    run(SEND_NEVER_RECEIVED, 2, 0.5, &o, &elapsed);
    const char *want = "in send #1 on comm 'world': rank 1 never posted a matching recv (tag 3, 400000 bytes)";
    EXPECT(strstr(o.text[0], want) != NULL, "text '%s' lacks '%s'", o.text[0], want);
}

static void test_message_size_mismatch(void) {
    outcome o;
    double elapsed;
    run(MESSAGE_SIZE_MISMATCH, 2, 5, &o, &elapsed);
    /* the 16-byte send completed eagerly; the receiver gets the error */
    const char *want =
        "message size mismatch on comm 'world': rank 0 sent 16 bytes with tag 0 (send #1), rank 1 expected 32";
    EXPECT(o.status[1] == SHARD_ERR_MISMATCH, "rank 1 status %s", shard_status_string(o.status[1]));
    EXPECT(strstr(o.text[1], want) != NULL, "rank 1 text '%s' lacks '%s'", o.text[1], want);
    EXPECT(o.status[0] == SHARD_OK || o.status[0] == SHARD_ERR_ABORTED, "rank 0 status %s",
           shard_status_string(o.status[0]));
}

static void test_nonblocking_skip(void) {
    outcome o;
    double elapsed;
    run(NONBLOCKING_SKIP, 3, 0.5, &o, &elapsed);
    const char *want = "in all_reduce #1 on comm 'world': rank 2 never entered it";
    EXPECT(strstr(o.text[0], want) != NULL, "text '%s' lacks '%s'", o.text[0], want);
    EXPECT(elapsed < 3.5, "took %.2f s", elapsed);
}

/* One timeout breaks the communicator: the queued collectives behind it fail
 * at once, citing it, instead of each waiting out its own deadline. */
static void test_queue_after_timeout(void) {
    outcome o;
    double elapsed;
    run(QUEUE_AFTER_TIMEOUT, 3, 0.5, &o, &elapsed);
    for (int r = 0; r < 2; r++) {
        EXPECT(o.status[r] == SHARD_ERR_TIMEOUT || o.status[r] == SHARD_ERR_ABORTED, "rank %d status %s", r,
               shard_status_string(o.status[r]));
        EXPECT(strstr(o.text[r], "timeout after 0.5 s in all_reduce #1 on comm 'world': rank 2 never entered it") !=
                   NULL,
               "rank %d text '%s'", r, o.text[r]);
        EXPECT(o.seconds[r] < 1.5, "rank %d waited %.2f s for four queued collectives (deadline 0.5 s)", r,
               o.seconds[r]);
    }
}

static void test_subcomm_named(void) {
    outcome o;
    double elapsed;
    run(SUBCOMM_SKIP, 4, 0.5, &o, &elapsed);
    const char *want = "in barrier #1 on comm 'odd': rank 1 never entered it";
    EXPECT(strstr(o.text[1], want) != NULL, "rank 1 text '%s' lacks '%s'", o.text[1], want);
    EXPECT(o.status[0] == SHARD_OK || o.status[0] == SHARD_ERR_ABORTED, "rank 0 (even) status %s",
           shard_status_string(o.status[0]));
}

static float *y_of(float *x) { return x + 4; }

static shard_status bad_args_rank(shard_comm *comm, void *arg) {
    (void)arg;
    float x[8] = {0};
    shard_status s = shard_comm_broadcast(comm, x, 4, SHARD_F32, 5);
    EXPECT(s == SHARD_ERR_INVALID_ARG, "broadcast root 5: %s", shard_status_string(s));
    EXPECT(strstr(shard_last_error(), "broadcast on comm 'world': root 5 is out of range 0..1") != NULL, "text '%s'",
           shard_last_error());
    s = shard_comm_all_reduce(comm, NULL, x, 4, SHARD_F32, SHARD_OP_SUM);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "send buffer is NULL with count 4"),
           "NULL send: '%s'", shard_last_error());
    s = shard_comm_all_reduce(comm, x, x, 4, (shard_dtype)42, SHARD_OP_SUM);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "valid dtypes are"), "bad dtype: '%s'",
           shard_last_error());
    s = shard_comm_all_reduce(comm, x, x, 4, SHARD_F32, (shard_reduce_op)9);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "valid ops are"), "bad op: '%s'",
           shard_last_error());
    s = shard_comm_send(comm, x, 4, SHARD_F32, 2, 0);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "destination rank 2 is out of range 0..1"),
           "bad destination: '%s'", shard_last_error());
    s = shard_comm_send(comm, x, 4, SHARD_F32, 0, -1);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "tag -1 is invalid"), "bad tag: '%s'",
           shard_last_error());
    s = shard_comm_set_timeout(comm, -1);
    EXPECT(s == SHARD_ERR_INVALID_ARG, "negative timeout accepted");
    size_t counts[2] = {1, 2};
    s = shard_comm_all_gatherv(comm, x, 3, x, counts, NULL, SHARD_F32);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "recv_counts["), "gatherv own count: '%s'",
           shard_last_error());
    size_t ones[2] = {1, 1}, self_two[2] = {1, 1};
    self_two[shard_comm_rank(comm)] = 2; /* every rank sends itself 2 but expects 1 */
    s = shard_comm_all_to_allv(comm, x, self_two, NULL, y_of(x), ones, NULL, SHARD_F32);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "sends 2 elements to itself but expects 1"),
           "all_to_allv self block: '%s'", shard_last_error());
    shard_request *pending = NULL;
    s = shard_comm_irecv(comm, x, 1, SHARD_F32, shard_comm_rank(comm), 1, &pending);
    EXPECT(s == SHARD_OK, "irecv from self: %s", shard_last_error());
    s = shard_comm_set_timeout(comm, 5);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "1 request is pending"),
           "set_timeout while pending: '%s'", shard_last_error());
    EXPECT(shard_comm_send(comm, x, 1, SHARD_F32, shard_comm_rank(comm), 1) == SHARD_OK, "send to self");
    EXPECT(shard_request_wait(&pending) == SHARD_OK, "wait irecv from self");
    /* nothing above counted as a collective: the ranks are still in step */
    EXPECT(shard_comm_collective_count(comm) == 0, "rejected calls advanced the sequence number");
    return shard_comm_barrier(comm);
}

static shard_status one_rank(shard_comm *comm, void *arg) {
    (void)arg;
    return shard_comm_size(comm) == 1 ? SHARD_OK
                                      : shard_error(SHARD_ERR_INTERNAL, "%d ranks, not 1", shard_comm_size(comm));
}

static void test_bad_arguments(void) {
    shard_status s = shard_launch(2, bad_args_rank, NULL);
    EXPECT(s == SHARD_OK, "launch: %s", shard_last_error());
    /* 0: one rank per process, as under a launcher */
    s = shard_launch(0, one_rank, NULL);
    EXPECT(s == SHARD_OK, "ranks 0: %s", shard_last_error());
    s = shard_launch(-1, one_rank, NULL);
    EXPECT(s == SHARD_ERR_INVALID_ARG &&
               strstr(shard_last_error(), "-1 ranks (--ranks, or shard_launch's ranks) is invalid"),
           "ranks -1: '%s'", shard_last_error());
    s = shard_launch(4097, one_rank, NULL);
    EXPECT(s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "give 1..4096"), "ranks 4097: '%s'",
           shard_last_error());
}

static const struct {
    const char *name;
    void (*fn)(void);
} tests[] = {
    {"timeout_names_missing_rank", test_timeout_names_missing_rank},
    {"timeout_names_two_ranks", test_timeout_names_two_ranks},
    {"dtype_mismatch", test_dtype_mismatch},
    {"count_mismatch", test_count_mismatch},
    {"kind_mismatch", test_kind_mismatch},
    {"all_to_allv_mismatch", test_all_to_allv_mismatch},
    {"failing_rank_stops_others", test_failing_rank_stops_others},
    {"recv_never_sent", test_recv_never_sent},
    {"send_never_received", test_send_never_received},
    {"message_size_mismatch", test_message_size_mismatch},
    {"nonblocking_skip", test_nonblocking_skip},
    {"queue_after_timeout", test_queue_after_timeout},
    {"subcomm_named", test_subcomm_named},
    {"bad_arguments", test_bad_arguments},
};

int main(int argc, char **argv) {
    const char *only = argc == 3 && strcmp(argv[1], "--case") == 0 ? argv[2] : NULL;
    int ran = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (only && strcmp(only, tests[i].name) != 0) continue;
        int before = failures;
        tests[i].fn();
        ran++;
        printf("%s %s\n", failures == before ? "ok  " : "FAIL", tests[i].name);
        if (failures != before) fprintf(stderr, "  rerun: test_comm_diagnostics --case %s\n", tests[i].name);
    }
    if (!ran) {
        fprintf(stderr, "no test named '%s'\n", only ? only : "");
        return 2;
    }
    return failures ? 1 : 0;
}
