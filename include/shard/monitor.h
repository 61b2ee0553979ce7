/* monitor.h — what each rank spent a training step on, the imbalance rule,
 * and the step's trace events.
 *
 * A trainer measures every step of every rank: the time its communicators
 * took (by communicator, so by mesh axis: the step waited on them, or they
 * ran under compute), the pipeline's waits for activations and gradients,
 * the optimizer, and the peak memory by category.  Recording costs a clock
 * read per collective; the trace (compute spans per unit, every collective,
 * the pipeline's transfers) is recorded only when asked for.
 *
 * shard_imbalance is the one definition of load imbalance the engine's
 * reports use, so that every feature that compares ranks agrees on it. */
#ifndef SHARD_MONITOR_H
#define SHARD_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "shard/memory.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* max / mean - 1 of v[0..n): 0 when every value is the same; 0 for n == 0 or a mean that is not above 0. */
double shard_imbalance(const double *v, size_t n);

#define SHARD_MONITOR_MAX_COMMS 8
#define SHARD_MONITOR_NAME_BYTES 64

/* One communicator of more than one rank, as the step used it. */
typedef struct shard_monitor_comm {
    char name[SHARD_MONITOR_NAME_BYTES]; /* its name: a mesh axis ("data"), an axis set ("data,expert") */
    double exposed_s;          /* the step waited on it: blocking calls, and the waits of non-blocking requests */
    double hidden_s;           /* non-blocking requests from their start to their wait: overlapped with compute */
    uint64_t bytes;            /* bytes this rank sent on it */
    uint64_t all_to_all_bytes; /* the part of `bytes` its all_to_all(v/w) calls sent (on `expert`: the
                                  token exchange's dispatch, combine and counts) */
} shard_monitor_comm;

/* One rank's last step.  compute_s is what remains of the wall time once exposed communication, the
 * pipeline's waits and the optimizer are taken out: a rank's thread hands its products to the cores'
 * workers, so its own CPU time would leave most of the compute out, and a blocking wait that spins
 * would count as compute. */
typedef struct shard_step_monitor {
    double wall_s, compute_s;
    double wait_s;      /* the pipeline's waits for activations and gradients (its bubble) */
    double optimizer_s; /* the update, less the communication inside it */
    size_t comms;
    shard_monitor_comm comm[SHARD_MONITOR_MAX_COMMS]; /* in the order the step first used them */
    uint64_t peak_bytes[SHARD_MEM_CATEGORY_COUNT];    /* the highest figure of each category during the step */
} shard_step_monitor;

/* One span of the trace: `tid` 0 is compute, 1 the rank's communication and waits, 2 non-blocking
 * requests in flight.  Times in seconds of the monotonic clock (shard_clock_seconds). */
typedef struct shard_trace_event {
    char name[48];   /* "unit 3 forward", "all_reduce", "F0", "wait activation 1" */
    const char *cat; /* "compute", "unit", "optimizer", "comm", "zero_gather", "grad_bucket", "tp", "pipe" */
    char axis[SHARD_MONITOR_NAME_BYTES]; /* the communicator's name; "" for compute */
    uint64_t bytes;                      /* bytes this rank sent in it */
    int micro, chunk;                    /* the pipeline's micro-batch and chunk, -1 elsewhere */
    int tid;
    double t0, t1;
} shard_trace_event;

typedef struct shard_trainer shard_trainer;

/* The calling rank's measurements of the trainer's last step (zeros before the first). */
shard_status shard_trainer_step_monitor(const shard_trainer *t, shard_step_monitor *out);
/* Record the trace of each step from now on (on != 0) or stop; each step starts a new one. */
shard_status shard_trainer_trace(shard_trainer *t, int on);
/* The last step's trace events of the calling rank (the trainer's, valid until its next step). */
shard_status shard_trainer_trace_events(const shard_trainer *t, const shard_trace_event **events, size_t *count);

#ifdef __cplusplus
}
#endif
#endif
