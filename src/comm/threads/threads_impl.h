/* threads_impl.h — what the launcher needs from the threads backend. */
#ifndef SHARD_THREADS_IMPL_H
#define SHARD_THREADS_IMPL_H

#include "../../core/alloc_impl.h"
#include "../comm_impl.h"

typedef struct shard__thread_job shard__thread_job;

/* A job of n ranks and its world communicator: comms[r] is rank r's handle,
 * charging ledgers[r].  The job lives until shard__threads_job_release. */
shard_status shard__threads_world_create(int n, double timeout_seconds, shard__mem_ledger *ledgers, shard_comm **comms,
                                         shard__thread_job **job);
void shard__threads_job_release(shard__thread_job *job);

/* The first abort's status and text (SHARD_OK if the job never aborted). */
shard_status shard__threads_job_abort_status(shard__thread_job *job, char *text, size_t text_bytes);

#endif
