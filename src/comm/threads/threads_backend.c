/* threads_backend.c — ranks as threads of one process, talking through shared memory.
 *
 * Collectives.  Each rank publishes a pointer to its arguments in its slot and
 * raises its `arrived` counter to the collective's sequence number.  Once all
 * ranks have arrived, every rank checks that all agree (op, dtype, count, root,
 * counts), then moves data straight between the user buffers of its peers:
 *   all_reduce      rank r reduces slice r of every peer's send buffer (in rank
 *                   order, so the bits are the same everywhere) into a small
 *                   cache-resident chunk and writes it into every peer's recv
 *                   buffer: each rank reads M and writes M bytes, the least a
 *                   shared-memory all_reduce can move.
 *   reduce_scatter  rank r reduces block r of every peer's send into its recv.
 *   all_gather      rank r copies every peer's block into its own recv.
 *   all_to_all      rank r copies block r of every peer's send into its recv.
 *   broadcast       every rank copies the root's buffer.
 * Then each rank raises `finished` and waits for all, so no buffer is released
 * while a peer still reads it.  Counters only grow, so a fast rank cannot
 * confuse a slow one.
 *
 * Waiting spins briefly (a rank thread up to SHARD_SPIN_US, 10 ms, while every
 * rank's kernel threads and every busy helper have a core: a sleeping peer
 * would add a wake-up to each exchange), yields, then blocks on a condition
 * variable with the deadline; a timeout names the ranks that never arrived.  A rank that fails
 * aborts the job: every waiter wakes and fails naming the root cause.
 *
 * Non-blocking collectives run in order on one helper thread per rank and
 * communicator; a blocking collective first waits for that queue to drain.
 * Point-to-point messages are matched in per-destination mailboxes and copied
 * once, by whichever side arrives second (rendezvous). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "threads_impl.h"
#include "../../core/env.h"
#include "../../core/parallel.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum {
    /* about 25 ns a pause here: spin ~25 us when every rank has a core, barely
     * at all when ranks outnumber cores (the peer we wait for needs ours) */
    SPIN_ITERATIONS = 1000,
    SPIN_ITERATIONS_OVERSUBSCRIBED = 32,
    YIELD_ITERATIONS = 16,
    DEFAULT_BLOCK_US = 10000,
    CHUNK_BYTES = 16384,
    /* slices at least this large go out with non-temporal stores: the reader is
     * another core and the data would not stay in cache anyway, and streaming
     * skips the read-for-ownership of every destination line */
    STREAM_MIN_BYTES = 1 << 20,
    PREFETCH_MAX_BYTES = 4 << 20,
    /* a send this small with no receive posted yet is copied and completes at
     * once, as MPI's eager protocol does, so send-then-recv on both sides works */
    EAGER_MAX_BYTES = 64 << 10
};

/* Copy with streaming stores where the hardware has them.  Call stream_fence()
 * before publishing the data to other threads. */
static void stream_copy(void *dst, const void *src, size_t bytes) {
#if defined(__SSE2__)
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > bytes) head = bytes;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, bytes);
#else
    memcpy(dst, src, bytes);
#endif
}

static void stream_fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* ------------------------------------------------------------------ job */

struct shard__thread_job {
    int spin_iterations;
    double
        block_seconds; /* how long a rank thread keeps spinning before it sleeps (0: no longer than spin_iterations) */
    int cpus, ranks;   /* the long spin only while every rank's kernel threads have a core each */
    _Atomic int busy_helpers; /* helper threads running a non-blocking collective: they need cores too */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int sleepers;
    _Atomic int refs;
    _Atomic int aborted;
    shard_status abort_status;               /* written once, under mu, before `aborted` is set */
    char abort_text[SHARD_ERROR_TEXT_BYTES]; /* a rank's whole failure, paths and all */
};

static void job_notify(shard__thread_job *job) {
    if (atomic_load(&job->sleepers) > 0) {
        pthread_mutex_lock(&job->mu);
        pthread_cond_broadcast(&job->cv);
        pthread_mutex_unlock(&job->mu);
    }
}

static void job_abort(shard__thread_job *job, shard_status status, const char *text) {
    pthread_mutex_lock(&job->mu);
    if (!atomic_load(&job->aborted)) {
        job->abort_status = status;
        snprintf(job->abort_text, sizeof job->abort_text, "%s", text);
        atomic_store(&job->aborted, 1);
    }
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
}

shard_status shard__threads_job_abort_status(shard__thread_job *job, char *text, size_t text_bytes) {
    if (!atomic_load(&job->aborted)) return SHARD_OK;
    pthread_mutex_lock(&job->mu);
    shard_status s = job->abort_status;
    snprintf(text, text_bytes, "%s", job->abort_text);
    pthread_mutex_unlock(&job->mu);
    return s;
}

static void job_release(shard__thread_job *job) {
    if (atomic_fetch_sub(&job->refs, 1) != 1) return;
    pthread_mutex_destroy(&job->mu);
    pthread_cond_destroy(&job->cv);
    free(job);
}

void shard__threads_job_release(shard__thread_job *job) { job_release(job); }

typedef int (*ready_fn)(void *ctx);

/* Set on the helper threads of non-blocking collectives: they share their
 * rank's core with its compute, so they never spin long. */
static _Thread_local int on_helper_thread;

typedef enum { WAIT_READY = 1, WAIT_TIMEOUT = 0, WAIT_ABORTED = -1 } wait_result;

/* Whether a waiting rank may keep its core: every rank's kernel threads and
 * every busy helper thread has one of its own. */
static int cores_to_spare(shard__thread_job *job) {
    return job->ranks * shard__parallel_threads() + atomic_load_explicit(&job->busy_helpers, memory_order_relaxed) <=
        job->cpus;
}

/* Wait until ready(ctx), the deadline, or (when honor_abort) an abort.
 * Spin, yield, then block on the job's condition variable. */
static wait_result wait_until(shard__thread_job *job, ready_fn ready, void *ctx, double deadline, int honor_abort) {
    for (int i = 0; i < job->spin_iterations; i++) {
        if (ready(ctx)) return WAIT_READY;
        if (honor_abort && atomic_load_explicit(&job->aborted, memory_order_relaxed)) return WAIT_ABORTED;
        CPU_RELAX();
    }
    if (job->block_seconds > 0 && !on_helper_thread && cores_to_spare(job)) {
        /* every rank has a core: keep it, so that the peer's arrival is seen
         * within a microsecond instead of a wake-up later (OpenMP's blocktime) */
        double until = shard__now() + job->block_seconds;
        if (until > deadline) until = deadline;
        for (unsigned i = 1;; i++) {
            if (ready(ctx)) return WAIT_READY;
            if (honor_abort && atomic_load_explicit(&job->aborted, memory_order_relaxed)) return WAIT_ABORTED;
            CPU_RELAX();
            if (i % 64 == 0 && (shard__now() >= until || !cores_to_spare(job))) break;
            if (i % 256 == 0) sched_yield(); /* a thread of another process that needs this core gets it */
        }
    }
    for (int i = 0; i < YIELD_ITERATIONS; i++) {
        if (ready(ctx)) return WAIT_READY;
        sched_yield();
    }
    for (;;) {
        if (ready(ctx)) return WAIT_READY;
        if (honor_abort && atomic_load(&job->aborted)) return WAIT_ABORTED;
        double now = shard__now();
        if (now >= deadline) return ready(ctx) ? WAIT_READY : WAIT_TIMEOUT;
        double until = deadline < now + 1.0 ? deadline : now + 1.0; /* re-check the clock each second */
        struct timespec ts;
        ts.tv_sec = (time_t)until;
        ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
        atomic_fetch_add(&job->sleepers, 1);
        pthread_mutex_lock(&job->mu);
        if (!ready(ctx) && !(honor_abort && atomic_load(&job->aborted)))
            pthread_cond_timedwait(&job->cv, &job->mu, &ts);
        pthread_mutex_unlock(&job->mu);
        atomic_fetch_sub(&job->sleepers, 1);
    }
}

/* For waits that must not give up: every party is already committed to a
 * bounded amount of work (copying data), so the wait ends without a deadline. */
static void wait_bounded_work(shard__thread_job *job, ready_fn ready, void *ctx) {
    wait_until(job, ready, ctx, INFINITY, 0);
}

/* ------------------------------------------------------------------ groups and handles */

typedef struct p2p_entry {
    struct p2p_entry *next;
    shard_request *req; /* NULL for an eager send: the entry owns a copy of the data */
    int src, dst, tag;
    void *buf;
    size_t bytes;
    uint64_t seq;
} p2p_entry;

typedef struct mailbox { /* messages to one rank */
    pthread_mutex_t mu;
    p2p_entry *sends, *recvs; /* unmatched, oldest first */
} mailbox;

typedef struct slot {
    _Atomic uint64_t arrived;  /* sequence number of the last collective entered */
    _Atomic uint64_t finished; /* ... and finished */
    const shard__coll_args *args;
    const void *send; /* effective send buffer (a staged copy for in-place all_to_all) */
    char pad[64 - 2 * sizeof(uint64_t) - 2 * sizeof(void *)];
} __attribute__((aligned(64))) slot;

/* The arrival gate packs (sequence number << GATE_SEQ_SHIFT) | ranks arrived.
 * Ranks enter collective s only once collective s-1 has all n arrivals, and a
 * rank that gives up (deadline, abort) may withdraw only while the count is
 * below n: once every rank has arrived, all of them move data and finish, so
 * nobody ever reads the buffers of a rank that has left. */
#define GATE_SEQ_SHIFT 20
#define GATE_COUNT_MASK ((UINT64_C(1) << GATE_SEQ_SHIFT) - 1)

typedef struct group { /* shared by the ranks of one communicator */
    shard__thread_job *job;
    int size;
    _Atomic int refs;
    _Atomic uint64_t gate;
    _Atomic uint64_t broken; /* collective at which a rank gave up; 0 if none */
    pthread_mutex_t broken_mu;
    char broken_text[512]; /* that failure, for later collectives' messages */
    slot *slots;
    mailbox *boxes;
} group;

typedef struct tcomm {
    shard_comm base;
    group *g;
    shard__mem_ledger *ledger;
    /* helper thread for non-blocking collectives */
    int helper_started;
    pthread_t helper;
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    shard_request **queue;
    size_t qhead, qtail, qcap;
    int stop;
    _Atomic uint64_t issued, completed;
} tcomm;

static const shard__comm_vtable threads_vtable;
static void threads_abort(shard_comm *comm, shard_status status, const char *reason);

static group *group_create(shard__thread_job *job, int size) {
    group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->slots = aligned_alloc(64, sizeof(slot) * (size_t)size);
    g->boxes = calloc((size_t)size, sizeof *g->boxes);
    if (!g->slots || !g->boxes) {
        free(g->slots);
        free(g->boxes);
        free(g);
        return NULL;
    }
    memset(g->slots, 0, sizeof(slot) * (size_t)size);
    for (int r = 0; r < size; r++) {
        atomic_init(&g->slots[r].arrived, 0);
        atomic_init(&g->slots[r].finished, 0);
        pthread_mutex_init(&g->boxes[r].mu, NULL);
    }
    g->job = job;
    g->size = size;
    atomic_init(&g->refs, size);
    atomic_init(&g->gate, (uint64_t)size); /* collective 0 complete: #1 may start */
    atomic_init(&g->broken, 0);
    pthread_mutex_init(&g->broken_mu, NULL);
    atomic_fetch_add(&job->refs, 1);
    return g;
}

static void group_release(group *g) {
    if (atomic_fetch_sub(&g->refs, 1) != 1) return;
    for (int r = 0; r < g->size; r++) {
        for (p2p_entry *e = g->boxes[r].sends, *next; e; e = next) { /* eager sends never received */
            next = e->next;
            if (!e->req) free(e);
        }
        pthread_mutex_destroy(&g->boxes[r].mu);
    }
    pthread_mutex_destroy(&g->broken_mu);
    job_release(g->job);
    free(g->slots);
    free(g->boxes);
    free(g);
}

static tcomm *tcomm_create(group *g, int rank, const char *name, double timeout, shard__mem_ledger *ledger) {
    tcomm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    shard__comm_init_header(&c->base, &threads_vtable, rank, g->size, name, timeout);
    c->g = g;
    c->ledger = ledger;
    pthread_mutex_init(&c->qmu, NULL);
    pthread_cond_init(&c->qcv, NULL);
    atomic_init(&c->issued, 0);
    atomic_init(&c->completed, 0);
    return c;
}

shard_status shard__threads_world_create(int n, double timeout_seconds, shard__mem_ledger *ledgers, shard_comm **comms,
                                         shard__thread_job **job_out) {
    shard__thread_job *job = calloc(1, sizeof *job);
    if (!job) return shard_error(SHARD_ERR_NO_MEMORY, "out of memory creating a job of %d ranks", n);
    pthread_mutex_init(&job->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&job->cv, &attr);
    pthread_condattr_destroy(&attr);
    atomic_init(&job->sleepers, 0);
    atomic_init(&job->refs, 1); /* the launcher's reference */
    atomic_init(&job->aborted, 0);
    atomic_init(&job->busy_helpers, 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int oversubscribed = cpus > 0 && n > cpus;
    job->spin_iterations = oversubscribed ? SPIN_ITERATIONS_OVERSUBSCRIBED : SPIN_ITERATIONS;
    double spin_us = shard__env_microseconds("SHARD_SPIN_US", DEFAULT_BLOCK_US); /* read, so a bad value is named */
    job->block_seconds = oversubscribed ? 0 : spin_us * 1e-6;
    job->cpus = cpus > 0 ? (int)cpus : 1;
    job->ranks = n;
    group *g = group_create(job, n);
    if (!g) {
        job_release(job);
        return shard_error(SHARD_ERR_NO_MEMORY, "out of memory creating a world of %d ranks", n);
    }
    for (int r = 0; r < n; r++) {
        tcomm *c = tcomm_create(g, r, "world", timeout_seconds, ledgers ? &ledgers[r] : NULL);
        if (!c) {
            for (int q = 0; q < r; q++) shard_comm_destroy(comms[q]);
            for (int q = r; q < n; q++) group_release(g);
            job_release(job);
            return shard_error(SHARD_ERR_NO_MEMORY, "out of memory creating rank handles");
        }
        comms[r] = &c->base;
    }
    *job_out = job;
    return SHARD_OK;
}

/* ------------------------------------------------------------------ failure text */

static shard_status aborted_error(tcomm *c, const char *what, uint64_t seq) {
    char text[SHARD_ERROR_TEXT_BYTES];
    shard__threads_job_abort_status(c->g->job, text, sizeof text);
    return shard_error(SHARD_ERR_ABORTED, "aborted in %s #%llu on comm '%s': %s", what, (unsigned long long)seq,
                       c->base.name, text);
}

/* ------------------------------------------------------------------ collectives */

typedef struct gate_wait {
    group *g;
    uint64_t seq;
    int entered; /* this rank is counted in: the predicate must not count it twice */
} gate_wait;

static int gate_broken(const group *g) { return atomic_load(&g->broken) != 0; }

/* Count this rank in for collective `seq` (once).  Not ready while the
 * previous collective is still collecting arrivals (ranks out of step);
 * "ready" too when the communicator broke, which the caller then reports. */
static int gate_enter_or_broken(void *ctx) {
    gate_wait *w = ctx;
    if (w->entered || gate_broken(w->g)) return 1;
    uint64_t n = (uint64_t)w->g->size, v = atomic_load(&w->g->gate);
    for (;;) {
        uint64_t vseq = v >> GATE_SEQ_SHIFT, vcount = v & GATE_COUNT_MASK, next;
        if (vseq == w->seq)
            next = v + 1;
        else if (vseq + 1 == w->seq && vcount == n)
            next = (w->seq << GATE_SEQ_SHIFT) | 1;
        else
            return 0;
        if (atomic_compare_exchange_weak(&w->g->gate, &v, next)) {
            w->entered = 1;
            return 1;
        }
    }
}

static int gate_all_arrived(const gate_wait *w) {
    return atomic_load(&w->g->gate) == ((w->seq << GATE_SEQ_SHIFT) | (uint64_t)w->g->size);
}

static int gate_all_arrived_or_broken(void *ctx) {
    gate_wait *w = ctx;
    return gate_all_arrived(w) || gate_broken(w->g);
}

/* Take this rank's arrival back; 0 if everyone had arrived (then it must take part). */
static int gate_withdraw(group *g, uint64_t seq) {
    uint64_t v = atomic_load(&g->gate);
    for (;;) {
        if ((v >> GATE_SEQ_SHIFT) != seq || (v & GATE_COUNT_MASK) >= (uint64_t)g->size) return 0;
        if (atomic_compare_exchange_weak(&g->gate, &v, v - 1)) return 1;
    }
}

/* After a withdrawal collective `seq` can never gather all ranks, nor can any
 * later one: mark the communicator broken so that they fail at once, citing
 * the first failure, instead of each waiting out a deadline. */
static void gate_break(group *g, uint64_t seq, const char *why) {
    pthread_mutex_lock(&g->broken_mu);
    if (!atomic_load(&g->broken)) {
        snprintf(g->broken_text, sizeof g->broken_text, "%s", why);
        atomic_store(&g->broken, seq);
    }
    pthread_mutex_unlock(&g->broken_mu);
    job_notify(g->job);
}

static shard_status broken_error(tcomm *c, const shard__coll_args *a) {
    char why[512];
    pthread_mutex_lock(&c->g->broken_mu);
    snprintf(why, sizeof why, "%s", c->g->broken_text);
    pthread_mutex_unlock(&c->g->broken_mu);
    if (atomic_load(&c->g->broken) == a->seq) return shard_error(SHARD_ERR_TIMEOUT, "%s", why);
    return shard_error(SHARD_ERR_TIMEOUT, "%s #%llu on comm '%s' cannot run: the communicator broke earlier: %s",
                       shard__coll_kind_name(a->kind), (unsigned long long)a->seq, c->base.name, why);
}

typedef struct finish_wait {
    group *g;
    uint64_t seq;
} finish_wait;

static int all_finished(void *ctx) {
    finish_wait *w = ctx;
    for (int p = 0; p < w->g->size; p++)
        if (atomic_load(&w->g->slots[p].finished) < w->seq) return 0;
    return 1;
}

static shard_status timeout_error(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    int *missing = calloc((size_t)g->size, sizeof *missing);
    int count = 0;
    for (int p = 0; p < g->size; p++)
        if (missing && atomic_load(&g->slots[p].arrived) < a->seq) missing[p] = 1, count++;
    char list[256] = "?";
    if (missing) shard__format_rank_list(missing, g->size, list, sizeof list);
    free(missing);
    return shard_error(SHARD_ERR_TIMEOUT, "timeout after %g s in %s #%llu on comm '%s': %s %s never entered it",
                       c->base.timeout_seconds, shard__coll_kind_name(a->kind), (unsigned long long)a->seq,
                       c->base.name, count == 1 ? "rank" : "ranks", list);
}

/* Enter collective a->seq and wait for every rank.  On failure this rank has
 * withdrawn (or never entered) and no peer will touch its buffers. */
static shard_status arrive(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    gate_wait w = {g, a->seq, 0};
    double deadline = shard__now() + c->base.timeout_seconds;
    atomic_store(&g->slots[c->base.rank].arrived, a->seq); /* for messages only */
    wait_result res = wait_until(g->job, gate_enter_or_broken, &w, deadline, 1);
    if (res == WAIT_READY && w.entered) {
        job_notify(g->job);
        res = wait_until(g->job, gate_all_arrived_or_broken, &w, deadline, 1);
        if (res == WAIT_READY && gate_all_arrived(&w)) return SHARD_OK;
        if (!gate_withdraw(g, a->seq)) return SHARD_OK; /* all came after all: take part */
        w.entered = 0;
    }
    if (res == WAIT_ABORTED) return aborted_error(c, shard__coll_kind_name(a->kind), a->seq);
    if (gate_broken(g)) return broken_error(c, a);
    shard_status s = timeout_error(c, a);
    gate_break(g, a->seq, shard_last_error());
    return s;
}

/* Every rank runs this on the same published data, so all report the same mismatch. */
static shard_status check_agreement(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    const shard__coll_args *first = g->slots[0].args;
    for (int p = 1; p < g->size; p++) {
        const shard__coll_args *other = g->slots[p].args;
        if (shard__coll_args_differ(first, other, g->size)) {
            char d0[160], dp[160];
            shard__describe_coll(first, other, d0, sizeof d0);
            shard__describe_coll(other, first, dp, sizeof dp);
            if (strcmp(d0, dp) == 0) snprintf(dp + strlen(dp), sizeof dp - strlen(dp), " with other counts");
            return shard_error(SHARD_ERR_MISMATCH, "collective mismatch at #%llu on '%s': rank 0 %s, rank %d %s",
                               (unsigned long long)a->seq, c->base.name, d0, p, dp);
        }
    }
    if (a->kind == SHARD__ALL_TO_ALLV || a->kind == SHARD__ALL_TO_ALLW)
        for (int p = 0; p < g->size; p++)
            for (int q = 0; q < g->size; q++) {
                size_t sends = g->slots[p].args->send_counts[q];
                size_t expects = g->slots[q].args->recv_counts[p];
                if (sends != expects)
                    return shard_error(SHARD_ERR_MISMATCH,
                                       "collective mismatch at #%llu on '%s': %s rank %d sends %zu elements to rank "
                                       "%d, which expects %zu",
                                       (unsigned long long)a->seq, c->base.name, shard__coll_kind_name(a->kind), p,
                                       sends, q, expects);
            }
    return SHARD_OK;
}

static void do_all_reduce(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    int n = g->size, r = c->base.rank;
    size_t es = shard_dtype_size(a->dtype);
    size_t off, len;
    shard__split_range(a->count, n, r, &off, &len);
    if (n == 1) {
        if (!a->in_place && len) memcpy(a->recv, a->send, len * es);
        if (a->op == SHARD_OP_AVG) return; /* x / 1 == x */
        return;
    }
    const void *srcs[n > 0 ? n : 1];
    _Alignas(64) unsigned char chunk[CHUNK_BYTES];
    size_t per_chunk = CHUNK_BYTES / es;
    int stream = len * es >= STREAM_MIN_BYTES;
    for (size_t done = 0; done < len; done += per_chunk) {
        size_t m = len - done < per_chunk ? len - done : per_chunk;
        size_t byte_off = (off + done) * es;
        for (int p = 0; p < n; p++) srcs[p] = (const char *)g->slots[p].send + byte_off;
        shard__reduce_many(a->dtype, a->op, srcs, n, chunk, m);
        for (int p = 0; p < n; p++) {
            char *dst = (char *)g->slots[p].args->recv + byte_off;
            if (stream)
                stream_copy(dst, chunk, m * es);
            else
                memcpy(dst, chunk, m * es);
        }
    }
    if (stream) stream_fence();
}

static void do_reduce_scatter(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    int n = g->size, r = c->base.rank;
    size_t es = shard_dtype_size(a->dtype);
    size_t len = a->recv_counts[r], byte_off = a->recv_displs[r] * es;
    if (!len) return;
    const void *srcs[n > 0 ? n : 1];
    size_t per_chunk = CHUNK_BYTES / es;
    for (size_t done = 0; done < len; done += per_chunk) {
        size_t m = len - done < per_chunk ? len - done : per_chunk;
        for (int p = 0; p < n; p++) srcs[p] = (const char *)g->slots[p].send + byte_off + done * es;
        shard__reduce_many(a->dtype, a->op, srcs, n, (char *)a->recv + done * es, m);
    }
}

/* A large copy into this rank's own buffer: streaming stores skip reading the
 * destination lines first (the copy is write-only there). */
static void copy_block(void *dst, const void *src, size_t bytes, int *streamed) {
    if (bytes >= STREAM_MIN_BYTES) {
        stream_copy(dst, src, bytes);
        *streamed = 1;
    } else if (bytes) {
        memcpy(dst, src, bytes);
    }
}

static void do_all_gather(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    size_t es = shard_dtype_size(a->dtype);
    int streamed = 0;
    for (int p = 0; p < g->size; p++) {
        if (p == c->base.rank && a->in_place) continue;
        copy_block((char *)a->recv + a->recv_displs[p] * es, g->slots[p].send, a->recv_counts[p] * es, &streamed);
    }
    if (streamed) stream_fence();
}

static void do_all_to_all(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    int r = c->base.rank;
    size_t es = shard_dtype_size(a->dtype);
    int streamed = 0;
    for (int p = 0; p < g->size; p++) {
        const char *src = (const char *)g->slots[p].send + g->slots[p].args->send_displs[r] * es;
        copy_block((char *)a->recv + a->recv_displs[p] * es, src, a->recv_counts[p] * es, &streamed);
    }
    if (streamed) stream_fence();
}

/* Before arriving: ask for this rank's receive blocks in its own cache, ready
 * to be written.  A rank that waits for its peers does it in time it would
 * spend spinning; the copy then writes into cache instead of fetching every
 * line from memory first (the compute between exchanges evicts them). */
static void prefetch_receive(const shard__coll_args *a, int n, size_t es) {
    size_t extent = 0;
    for (int p = 0; p < n; p++)
        if (a->recv_displs[p] + a->recv_counts[p] > extent) extent = a->recv_displs[p] + a->recv_counts[p];
    if (extent * es > PREFETCH_MAX_BYTES) return; /* larger than a core's cache: the copy streams it anyway */
    const char *line = a->recv;
    for (size_t at = 0; at < extent * es; at += 64) __builtin_prefetch(line + at, 1, 3);
}

static void plain_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

/* Where the next element goes in a strided destination block. */
typedef struct write_cursor {
    char *base;
    size_t row_len, stride, row, pos, es;
} write_cursor;

static void cursor_write(write_cursor *w, const char *src, size_t n, void (*copy)(void *, const void *, size_t)) {
    while (n) {
        size_t m = w->row_len - w->pos < n ? w->row_len - w->pos : n;
        copy(w->base + (w->row * w->stride + w->pos) * w->es, src, m * w->es);
        src += m * w->es, n -= m, w->pos += m;
        if (w->pos == w->row_len) w->row++, w->pos = 0;
    }
}

/* all_to_allw: this rank writes its strided blocks straight into the peers'
 * receive blocks (every rank has arrived, and each receive block has one
 * writer), row by row across all blocks at once, so that blocks cut from the
 * same rows (a transpose) read this rank's memory in order. */
static void do_all_to_allw(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    int n = g->size, r = c->base.rank;
    size_t es = shard_dtype_size(a->dtype), max_rows = 0;
    write_cursor cursors[n];
    void (*copies[n])(void *, const void *, size_t);
    int streamed = 0;
    for (int q = 0; q < n; q++) {
        const shard__coll_args *qa = g->slots[q].args;
        cursors[q] = (write_cursor){
            (char *)qa->recv + qa->recv_displs[r] * es, qa->recv_row_len[r], qa->recv_stride[r], 0, 0, es};
        int stream = a->send_counts[q] * es >= STREAM_MIN_BYTES;
        streamed |= stream;
        copies[q] = stream ? stream_copy : plain_copy;
        size_t rows = a->send_counts[q] / a->send_row_len[q];
        if (rows > max_rows) max_rows = rows;
    }
    for (size_t i = 0; i < max_rows; i++)
        for (int q = 0; q < n; q++)
            if (i < a->send_counts[q] / a->send_row_len[q])
                cursor_write(&cursors[q], (const char *)a->send + (a->send_displs[q] + i * a->send_stride[q]) * es,
                             a->send_row_len[q], copies[q]);
    if (streamed) stream_fence();
}

/* Run one collective on this rank (from the rank thread or its helper). */
static shard_status run_collective(tcomm *c, const shard__coll_args *a) {
    group *g = c->g;
    /* after an abort every call fails (comm.h), a one-rank communicator's too, which waits on no one */
    if (atomic_load(&g->job->aborted)) return aborted_error(c, shard__coll_kind_name(a->kind), a->seq);
    slot *me = &g->slots[c->base.rank];
    size_t es = shard_dtype_size(a->dtype);
    void *staged = NULL;
    me->args = a;
    me->send = a->send;
    if ((a->kind == SHARD__ALL_TO_ALL || a->kind == SHARD__ALL_TO_ALLV) && a->in_place) {
        /* peers read our send blocks while we overwrite them: stage a copy */
        size_t extent = 0;
        for (int p = 0; p < g->size; p++)
            if (a->send_displs[p] + a->send_counts[p] > extent) extent = a->send_displs[p] + a->send_counts[p];
        staged = extent ? shard_alloc(extent * es, SHARD_MEM_COMM) : NULL; /* nothing to send: nothing to stage */
        if (extent && !staged) { /* fail the job so that peers stop now instead of at the deadline */
            shard_status s =
                shard_error(SHARD_ERR_NO_MEMORY, "%s #%llu on comm '%s': out of memory staging %zu bytes",
                            shard__coll_kind_name(a->kind), (unsigned long long)a->seq, c->base.name, extent * es);
            threads_abort(&c->base, s, shard_last_error());
            return s;
        }
        if (extent) memcpy(staged, a->send, extent * es), me->send = staged;
    }
    if (a->kind == SHARD__ALL_TO_ALL || a->kind == SHARD__ALL_TO_ALLV) prefetch_receive(a, g->size, es);
    shard_status s = arrive(c, a);
    if (s < 0) {
        shard_free(staged);
        return s;
    }
    s = check_agreement(c, a);
    if (s == SHARD_OK) {
        switch (a->kind) {
        case SHARD__BARRIER: break;
        case SHARD__BROADCAST:
            if (c->base.rank != a->root) {
                int streamed = 0;
                copy_block(a->recv, g->slots[a->root].args->recv, a->count * es, &streamed);
                if (streamed) stream_fence();
            }
            break;
        case SHARD__ALL_REDUCE: do_all_reduce(c, a); break;
        case SHARD__REDUCE_SCATTER:
        case SHARD__REDUCE_SCATTERV: do_reduce_scatter(c, a); break;
        case SHARD__ALL_GATHER:
        case SHARD__ALL_GATHERV: do_all_gather(c, a); break;
        case SHARD__ALL_TO_ALL:
        case SHARD__ALL_TO_ALLV: do_all_to_all(c, a); break;
        case SHARD__ALL_TO_ALLW: do_all_to_allw(c, a); break;
        default: s = shard_error(SHARD_ERR_INTERNAL, "threads backend: unknown collective %d", (int)a->kind);
        }
    }
    /* Even after a mismatch, wait for everyone: peers may still read our
     * arguments or buffers.  Every rank is past the gate and only copies now. */
    atomic_store(&me->finished, a->seq);
    job_notify(g->job);
    finish_wait fw = {g, a->seq};
    char error_text[SHARD_ERROR_TEXT_BYTES];
    snprintf(error_text, sizeof error_text, "%s", shard_last_error());
    wait_bounded_work(g->job, all_finished, &fw);
    shard_free(staged);
    if (s < 0) return shard_error(s, "%s", error_text);
    return SHARD_OK;
}

typedef struct drain_wait {
    tcomm *c;
} drain_wait;

static int queue_drained(void *ctx) {
    tcomm *c = ((drain_wait *)ctx)->c;
    return atomic_load(&c->completed) == atomic_load(&c->issued);
}

/* Wait for this rank's earlier non-blocking collectives, which run first.
 * No deadline of its own: each queued collective ends by its own deadline
 * (arrival) or by finishing its bounded copy. */
static void drain_queue(tcomm *c) {
    drain_wait w = {c};
    wait_bounded_work(c->g->job, queue_drained, &w);
}

static shard_status threads_collective(shard_comm *comm, shard__coll_args *args) {
    tcomm *c = (tcomm *)comm;
    if (atomic_load(&c->issued) != atomic_load(&c->completed)) drain_queue(c);
    return run_collective(c, args);
}

static void *helper_main(void *arg) {
    tcomm *c = arg;
    on_helper_thread = 1;
    shard__mem_ledger_adopt(c->ledger);
    pthread_mutex_lock(&c->qmu);
    for (;;) {
        while (c->qhead == c->qtail && !c->stop) pthread_cond_wait(&c->qcv, &c->qmu);
        if (c->qhead == c->qtail) break; /* stop requested and nothing left */
        shard_request *req = c->queue[c->qhead % c->qcap];
        c->qhead++;
        pthread_mutex_unlock(&c->qmu);
        shard_clear_error();
        atomic_fetch_add(&c->g->job->busy_helpers, 1);
        req->status = run_collective(c, &req->coll);
        atomic_fetch_sub(&c->g->job->busy_helpers, 1);
        if (req->status < 0) snprintf(req->error, sizeof req->error, "%s", shard_last_error());
        atomic_store(&req->done, 1);
        atomic_fetch_add(&c->completed, 1);
        job_notify(c->g->job);
        pthread_mutex_lock(&c->qmu);
    }
    pthread_mutex_unlock(&c->qmu);
    return NULL;
}

static shard_status threads_icollective(shard_comm *comm, shard__coll_args *args, shard_request *req) {
    tcomm *c = (tcomm *)comm;
    (void)args; /* == &req->coll */
    pthread_mutex_lock(&c->qmu);
    if (!c->helper_started) {
        if (pthread_create(&c->helper, NULL, helper_main, c) != 0) {
            pthread_mutex_unlock(&c->qmu);
            return shard_error(SHARD_ERR_IO, "comm '%s': cannot start the helper thread for non-blocking collectives",
                               comm->name);
        }
        c->helper_started = 1;
    }
    if (c->qtail - c->qhead == c->qcap) { /* grow the ring */
        size_t cap = c->qcap ? 2 * c->qcap : 16;
        shard_request **q = malloc(cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&c->qmu);
            return shard_error(SHARD_ERR_NO_MEMORY, "comm '%s': out of memory queueing a collective", comm->name);
        }
        for (size_t i = c->qhead; i < c->qtail; i++) q[i - c->qhead] = c->queue[i % c->qcap];
        c->qtail -= c->qhead;
        c->qhead = 0;
        free(c->queue);
        c->queue = q;
        c->qcap = cap;
    }
    c->queue[c->qtail % c->qcap] = req;
    c->qtail++;
    atomic_fetch_add(&c->issued, 1);
    pthread_cond_signal(&c->qcv);
    pthread_mutex_unlock(&c->qmu);
    return SHARD_OK;
}

/* ------------------------------------------------------------------ point to point */

static void complete(shard__thread_job *job, shard_request *req, shard_status s, const char *text) {
    req->status = s;
    if (s < 0) snprintf(req->error, sizeof req->error, "%s", text);
    atomic_store(&req->done, 1);
    job_notify(job);
}

/* Copy a matched pair and complete both requests. */
/* Copy a matched pair and complete both requests.  Once a request is complete
 * its owner may free it and its entry, so read everything needed first. */
static void deliver(tcomm *c, p2p_entry *send, p2p_entry *recv) {
    shard__thread_job *job = c->g->job;
    shard_request *send_req = send->req, *recv_req = recv->req; /* send_req NULL: eager copy */
    if (send->bytes != recv->bytes) {
        char text[512];
        snprintf(text, sizeof text,
                 "message size mismatch on comm '%s': rank %d sent %zu bytes with tag %d (send #%llu), rank %d "
                 "expected %zu (recv #%llu)",
                 c->base.name, send->src, send->bytes, send->tag, (unsigned long long)send->seq, recv->dst, recv->bytes,
                 (unsigned long long)recv->seq);
        /* as in MPI the receiver reports it; the sender's result must not depend
         * on whether its send went out eagerly */
        if (send_req) complete(job, send_req, SHARD_OK, NULL);
        complete(job, recv_req, SHARD_ERR_MISMATCH, text);
    } else {
        if (send->bytes) memcpy(recv->buf, send->buf, send->bytes);
        if (send_req) complete(job, send_req, SHARD_OK, NULL);
        complete(job, recv_req, SHARD_OK, NULL);
    }
    if (!send_req) free(send); /* eager: entry and data in one block, owned by nobody else */
}

static p2p_entry *take_match(p2p_entry **list, int src, int tag) {
    for (p2p_entry **pp = list; *pp; pp = &(*pp)->next)
        if ((*pp)->src == src && (*pp)->tag == tag) {
            p2p_entry *e = *pp;
            *pp = e->next;
            e->next = NULL;
            return e;
        }
    return NULL;
}

static void append(p2p_entry **list, p2p_entry *e) {
    while (*list) list = &(*list)->next;
    *list = e;
}

static shard_status p2p_post(shard_comm *comm, int is_send, void *buf, size_t bytes, int peer, int tag, uint64_t seq,
                             shard_request *req) {
    tcomm *c = (tcomm *)comm;
    p2p_entry *e = calloc(1, sizeof *e);
    if (!e) return shard_error(SHARD_ERR_NO_MEMORY, "comm '%s': out of memory posting a message", comm->name);
    e->req = req;
    e->src = is_send ? comm->rank : peer;
    e->dst = is_send ? peer : comm->rank;
    e->tag = tag;
    e->buf = buf;
    e->bytes = bytes;
    e->seq = seq;
    req->impl = e;
    if (atomic_load(&c->g->job->aborted)) /* a failed peer's buffers may be gone: match nothing */
        return aborted_error(c, is_send ? "send" : "recv", seq);
    mailbox *box = &c->g->boxes[e->dst];
    pthread_mutex_lock(&box->mu);
    p2p_entry *match = is_send ? take_match(&box->recvs, e->src, tag) : take_match(&box->sends, e->src, tag);
    if (!match && is_send && bytes <= EAGER_MAX_BYTES) {
        /* eager: queue a copy and complete the send now */
        p2p_entry *copy = malloc(sizeof *copy + bytes);
        if (copy) {
            *copy = *e;
            copy->req = NULL;
            copy->buf = copy + 1;
            if (bytes) memcpy(copy->buf, buf, bytes);
            append(&box->sends, copy);
            pthread_mutex_unlock(&box->mu);
            complete(c->g->job, req, SHARD_OK, NULL);
            return SHARD_OK;
        }
    }
    if (!match) append(is_send ? &box->sends : &box->recvs, e);
    pthread_mutex_unlock(&box->mu);
    if (match) {
        if (is_send)
            deliver(c, e, match);
        else
            deliver(c, match, e);
    }
    return SHARD_OK;
}

static shard_status threads_isend(shard_comm *comm, const void *buf, size_t bytes, int dst, int tag, uint64_t seq,
                                  shard_request *req) {
    return p2p_post(comm, 1, (void *)(uintptr_t)buf, bytes, dst, tag, seq, req);
}

static shard_status threads_irecv(shard_comm *comm, void *buf, size_t bytes, int src, int tag, uint64_t seq,
                                  shard_request *req) {
    return p2p_post(comm, 0, buf, bytes, src, tag, seq, req);
}

/* Remove an unmatched entry on timeout or abort; 0 if it was already matched. */
static int p2p_cancel(tcomm *c, p2p_entry *e, int is_send) {
    mailbox *box = &c->g->boxes[e->dst];
    pthread_mutex_lock(&box->mu);
    int removed = 0;
    for (p2p_entry **pp = is_send ? &box->sends : &box->recvs; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            removed = 1;
            break;
        }
    pthread_mutex_unlock(&box->mu);
    return removed;
}

static int request_done(void *ctx) { return atomic_load(&((shard_request *)ctx)->done); }

static shard_status threads_request_wait(shard_request *req) {
    tcomm *c = (tcomm *)req->comm;
    shard__thread_job *job = c->g->job;
    if (req->kind == SHARD__REQ_COLL) {
        /* The helper owns the request until done; it ends every collective by
         * its deadline or its bounded copy, so this wait needs none of its own. */
        wait_bounded_work(job, request_done, req);
        return SHARD_OK;
    }
    p2p_entry *e = req->impl;
    int is_send = req->kind == SHARD__REQ_SEND;
    wait_result res = wait_until(job, request_done, req, shard__now() + c->base.timeout_seconds, 1);
    if (res == WAIT_READY) return SHARD_OK;
    if (!p2p_cancel(c, e, is_send)) { /* matched meanwhile: the copy is under way */
        wait_bounded_work(job, request_done, req);
        return SHARD_OK;
    }
    int peer = is_send ? e->dst : e->src;
    if (res == WAIT_ABORTED) return aborted_error(c, is_send ? "send" : "recv", e->seq);
    return shard_error(
        SHARD_ERR_TIMEOUT,
        is_send
            ? "timeout after %g s in send #%llu on comm '%s': rank %d never posted a matching recv (tag %d, %zu bytes)"
            : "timeout after %g s in recv #%llu on comm '%s': rank %d never sent the message (tag %d, %zu bytes)",
        c->base.timeout_seconds, (unsigned long long)e->seq, c->base.name, peer, e->tag, e->bytes);
}

static shard_status threads_request_test(shard_request *req, int *done) {
    *done = atomic_load(&req->done);
    if (!*done && atomic_load(&((tcomm *)req->comm)->g->job->aborted) && req->kind != SHARD__REQ_COLL) {
        tcomm *c = (tcomm *)req->comm;
        p2p_entry *e = req->impl;
        if (p2p_cancel(c, e, req->kind == SHARD__REQ_SEND)) {
            *done = 1;
            return aborted_error(c, req->kind == SHARD__REQ_SEND ? "send" : "recv", e->seq);
        }
    }
    return SHARD_OK;
}

static void threads_request_release(shard_request *req) {
    if (req->kind != SHARD__REQ_COLL) free(req->impl);
    req->impl = NULL;
}

/* ------------------------------------------------------------------ split, destroy, abort */

typedef struct split_member {
    int color, key, rank;
} split_member;

static int by_key_then_rank(const void *x, const void *y) {
    const split_member *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

static shard_status threads_split(shard_comm *comm, int color, int key, shard_comm **out) {
    tcomm *c = (tcomm *)comm;
    int n = comm->size, me = comm->rank;
    int32_t mine[2] = {color < 0 ? -1 : color, key};
    int32_t *all = malloc(sizeof(int32_t) * 2 * (size_t)n);
    int64_t *groups = malloc(sizeof(int64_t) * (size_t)n);
    split_member *members = malloc(sizeof *members * (size_t)n);
    shard_status s = SHARD_OK;
    if (!all || !groups || !members) {
        s = shard_error(SHARD_ERR_NO_MEMORY, "split of comm '%s': out of memory", comm->name);
        goto done;
    }
    SHARD_CHECK_GOTO(shard_comm_all_gather(comm, mine, all, 2, SHARD_I32), s, done);
    int m = 0, my_index = -1;
    if (mine[0] >= 0)
        for (int p = 0; p < n; p++)
            if (all[2 * p] == mine[0]) members[m++] = (split_member){all[2 * p], all[2 * p + 1], p};
    qsort(members, (size_t)m, sizeof *members, by_key_then_rank);
    for (int i = 0; i < m; i++)
        if (members[i].rank == me) my_index = i;
    /* the member with new rank 0 creates the shared group and passes it round */
    group *created = NULL;
    if (my_index == 0) {
        created = group_create(c->g->job, m);
        if (!created) s = shard_error(SHARD_ERR_NO_MEMORY, "split of comm '%s': out of memory", comm->name);
    }
    int64_t handle = (int64_t)(intptr_t)created;
    shard_status gs = shard_comm_all_gather(comm, &handle, groups, 1, SHARD_I64);
    if (s < 0 || gs < 0) {
        if (created) /* drop all the member references we took */
            for (int i = 0; i < m; i++) group_release(created);
        if (s == SHARD_OK) s = gs;
        goto done;
    }
    if (mine[0] >= 0) {
        group *g = (group *)(intptr_t)groups[members[0].rank];
        if (!g) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "split of comm '%s': rank %d could not create the group", comm->name,
                            members[0].rank);
            goto done;
        }
        char name[64];
        snprintf(name, sizeof name, "%.40s:%d", comm->name, mine[0]);
        tcomm *nc = tcomm_create(g, my_index, name, comm->timeout_seconds, c->ledger);
        if (!nc) {
            group_release(g);
            s = shard_error(SHARD_ERR_NO_MEMORY, "split of comm '%s': out of memory", comm->name);
            goto done;
        }
        *out = &nc->base;
    }
done:
    free(all);
    free(groups);
    free(members);
    return s;
}

/* Unlink the entries posted through `comm` (their requests are abandoned). */
static void drop_entries_of(p2p_entry **list, const shard_comm *comm) {
    while (*list) {
        if ((*list)->req && (*list)->req->comm == comm)
            *list = (*list)->next;
        else
            list = &(*list)->next;
    }
}

static void threads_destroy(shard_comm *comm) {
    tcomm *c = (tcomm *)comm;
    if (c->helper_started) {
        if (atomic_load(&c->issued) != atomic_load(&c->completed)) drain_queue(c);
        pthread_mutex_lock(&c->qmu);
        c->stop = 1;
        pthread_cond_signal(&c->qcv);
        pthread_mutex_unlock(&c->qmu);
        pthread_join(c->helper, NULL);
    }
    /* messages this handle posted and nobody matched must not be matched later */
    for (int r = 0; r < c->g->size; r++) {
        mailbox *box = &c->g->boxes[r];
        pthread_mutex_lock(&box->mu);
        drop_entries_of(&box->sends, comm);
        drop_entries_of(&box->recvs, comm);
        pthread_mutex_unlock(&box->mu);
    }
    pthread_mutex_destroy(&c->qmu);
    pthread_cond_destroy(&c->qcv);
    free(c->queue);
    group_release(c->g);
    free(c);
}

static void threads_abort(shard_comm *comm, shard_status status, const char *reason) {
    tcomm *c = (tcomm *)comm;
    char text[SHARD_ERROR_TEXT_BYTES];
    shard__abort_text(comm, reason, text, sizeof text);
    job_abort(c->g->job, status, text);
}

static const shard__comm_vtable threads_vtable = {
    .name = "threads",
    .collective = threads_collective,
    .isend = threads_isend,
    .irecv = threads_irecv,
    .request_test = threads_request_test,
    .request_wait = threads_request_wait,
    .split = threads_split,
    .destroy = threads_destroy,
    .abort = threads_abort,
    .icollective = threads_icollective,
    .request_release = threads_request_release,
};
