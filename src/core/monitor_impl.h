/* monitor_impl.h — the recorder behind monitor.h: one per trainer, made the
 * calling rank's current recorder for the length of a step.
 *
 * The communicator, the data strategy, the pipeline and the tensor-parallel
 * blocks report to the current recorder; with none (outside a step, or a
 * program that trains without a trainer) each report is one thread-local
 * load and a branch.  Trace events are kept only while tracing, in an array
 * reused step after step, so a step allocates nothing once it has grown. */
#ifndef SHARD_MONITOR_IMPL_H
#define SHARD_MONITOR_IMPL_H

#include "shard/comm.h"
#include "shard/monitor.h"

typedef struct shard__mon {
    double t_step;    /* the step's start */
    double exposed_s; /* exposed communication so far in the step, all communicators */
    double wait_s;    /* the pipeline's waits so far */
    int waiting;      /* inside a pipeline wait: its communication is counted as the wait */
    const char *tag;  /* the category of the collectives started now (NULL: "comm") */
    const shard_comm *comm_of[SHARD_MONITOR_MAX_COMMS];
    shard_step_monitor now, last;
    int tracing;
    shard_trace_event *ev;
    size_t events, cap;
} shard__mon;

/* The calling rank's recorder during a step, else NULL. */
extern _Thread_local shard__mon *shard__mon_current;

shard_status shard__mon_create(shard__mon **out);
void shard__mon_destroy(shard__mon *m);
/* Make m the calling thread's recorder and start a step's figures (and trace). */
void shard__mon_begin(shard__mon *m);
/* Close the step: its figures become m->last; the thread has no recorder after it. */
void shard__mon_end(shard__mon *m);

/* Set the category of the collectives started from now on; returns the one it replaces. */
static inline const char *shard__mon_tag(const char *tag) {
    shard__mon *m = shard__mon_current;
    if (!m) return NULL;
    const char *was = m->tag;
    m->tag = tag;
    return was;
}

/* Time on a communicator: started at `start`, waited on from `wait0` to `end` (a blocking call:
 * start == wait0), `bytes` sent.  `what` names it in the trace, `cat` is its category. */
void shard__mon_comm(shard__mon *m, const shard_comm *comm, const char *what, const char *cat, double start,
                     double wait0, double end, uint64_t bytes);
/* A pipeline wait from t0 to t1 (its communication is not counted again). */
static inline void shard__mon_wait_begin(void) {
    if (shard__mon_current) shard__mon_current->waiting++;
}
void shard__mon_wait_end(double t0, double t1);

static inline int shard__mon_tracing(void) { return shard__mon_current && shard__mon_current->tracing; }
/* A trace span on thread `tid` (no-op unless tracing); the name is printf-formatted. */
void shard__mon_span(const char *cat, int tid, int micro, int chunk, double t0, double t1, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

#endif
