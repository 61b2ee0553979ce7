/* parallel.c — see parallel.h: helper threads started on first use, each
 * running a fixed contiguous range of a region's chunks.  After a region a
 * helper watches for the next one a few tens of microseconds (a training step
 * runs about a hundred back to back: waking a sleeping helper cost ~20 us a
 * region), then sleeps on a condition variable.  Processes that share the
 * cores with other ranks run at width 1 and never wake their helpers.  A
 * forked child has none of the parent's helpers: it starts its own. */
#include "core/parallel.h"

#include "core/flops.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

enum { MAX_THREADS = SHARD_MAX_CHUNKS };

#ifndef SPIN_ROUNDS
#define SPIN_ROUNDS 2000 /* pause instructions: some tens of microseconds */
#endif

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static struct {
    pthread_mutex_t owner; /* held by the caller running a region */
    pthread_mutex_t lock;  /* guards sleeping helpers */
    pthread_cond_t wake;
    atomic_int threads;     /* configured width */
    int started;            /* helpers running (under `owner`) */
    atomic_uint generation; /* bumped per region */
    atomic_int pending;     /* helpers not done with this region */
    shard__chunk_fn fn;
    void *ctx;
    size_t chunks;
    int width;          /* threads taking part in this region */
    unsigned start_gen; /* the generation before the region a new helper was started for */
    shard__flops *sink; /* the opening thread's FLOP count, which the helpers add to */
} P = {PTHREAD_MUTEX_INITIALIZER,
       PTHREAD_MUTEX_INITIALIZER,
       PTHREAD_COND_INITIALIZER,
       1,
       0,
       0,
       0,
       NULL,
       NULL,
       0,
       1,
       0,
       NULL};

void shard__parallel_set_threads(int threads) {
    atomic_store(&P.threads, threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads);
}

int shard__parallel_threads(void) { return atomic_load(&P.threads); }

size_t shard__chunks_for(size_t work, size_t grain) {
    size_t c = grain ? work / grain : 1;
    return c < 1 ? 1 : c > SHARD_MAX_CHUNKS ? SHARD_MAX_CHUNKS : c;
}

static _Thread_local int in_region; /* this thread is running a region's chunks */

int shard__parallel_inside(void) { return in_region; }

/* Thread `who` of `width` runs chunks [lo, hi). */
static void run_share(shard__chunk_fn fn, void *ctx, size_t chunks, int width, int who) {
    size_t lo, count;
    shard__chunk_range(chunks, (size_t)width, (size_t)who, &lo, &count);
    in_region = 1;
    if (who) shard__flops_adopt(P.sink);
    for (size_t c = lo; c < lo + count; c++) fn(ctx, c, chunks);
    if (who) shard__flops_adopt(NULL);
    in_region = 0;
}

static void *helper(void *arg) {
    int who = (int)(size_t)arg;
    unsigned seen = P.start_gen; /* written before pthread_create; the region may already have begun */
    for (;;) {
        unsigned now = seen;
        /* a step runs regions back to back: watch for the next one a short while before sleeping */
        for (int spin = 0; spin < SPIN_ROUNDS && (now = atomic_load(&P.generation)) == seen; spin++) relax();
        if (now == seen) {
            pthread_mutex_lock(&P.lock);
            while ((now = atomic_load(&P.generation)) == seen) pthread_cond_wait(&P.wake, &P.lock);
            pthread_mutex_unlock(&P.lock);
        }
        seen = now;
        if (who < P.width) run_share(P.fn, P.ctx, P.chunks, P.width, who);
        atomic_fetch_sub(&P.pending, 1);
    }
    return NULL;
}

/* In a forked child only the forking thread exists: no helper runs and no region is under way (a helper of
 * the parent's may have held a lock at the fork). */
static void after_fork_in_child(void) {
    pthread_mutex_init(&P.owner, NULL);
    pthread_mutex_init(&P.lock, NULL);
    pthread_cond_init(&P.wake, NULL);
    P.started = 0;
    atomic_store(&P.pending, 0);
}

static pthread_once_t fork_handler_once = PTHREAD_ONCE_INIT;
static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

void shard__parallel_for(size_t chunks, shard__chunk_fn fn, void *ctx) {
    int width = atomic_load(&P.threads);
    if (width > (int)chunks) width = (int)chunks;
    if (width <= 1 || pthread_mutex_trylock(&P.owner) != 0) { /* alone, or another rank has the helpers */
        for (size_t c = 0; c < chunks; c++) fn(ctx, c, chunks);
        return;
    }
    P.start_gen = atomic_load(&P.generation);
    if (P.started < width - 1) pthread_once(&fork_handler_once, register_fork_handler);
    while (P.started < width - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int ok = pthread_create(&t, &attr, helper, (void *)(size_t)(P.started + 1)) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        P.started++;
    }
    if (width > P.started + 1) width = P.started + 1;
    P.fn = fn, P.ctx = ctx, P.chunks = chunks, P.width = width, P.sink = shard__flops_current();
    /* every helper wakes and reports back; those beyond `width` have no share this time */
    atomic_store(&P.pending, P.started);
    pthread_mutex_lock(&P.lock);
    atomic_fetch_add(&P.generation, 1);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.lock);
    run_share(fn, ctx, chunks, width, 0);
    for (int spin = 0; atomic_load(&P.pending) > 0; spin++)
        if (spin % 64 == 63) sched_yield();
    pthread_mutex_unlock(&P.owner);
}

void shard__chunk_result_set(shard__chunk_result *r, shard_status s) {
    r->status = s;
    if (s < 0) snprintf(r->error, sizeof r->error, "%s", shard_last_error());
}

shard_status shard__chunk_results_raise(const shard__chunk_result *results, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (results[k].status < 0) return shard_error(results[k].status, "%s", results[k].error);
    return SHARD_OK;
}
