/* train_stop.h — how `shard train` ends before its last step without losing
 * work: SIGTERM (what batch systems send to preempt a job) and SIGINT
 * (Ctrl-C) are caught by a handler that only sets a flag; between steps the
 * ranks agree on it, so that every rank stops after the same step, save a
 * checkpoint there and exit 143 or 130.  The same agreement stops the run
 * when another run has taken the --save root's writer lock over. */
#ifndef SHARD_CLI_TRAIN_STOP_H
#define SHARD_CLI_TRAIN_STOP_H

#include <stdint.h>

#include "shard/shard.h"

/* Catch SIGTERM and SIGINT until the process exits (once per process).  A second SIGINT ends the process
 * at once (exit 130), removing lock's file (NULL: none) and leaving the checkpoints as the last finished
 * save left them. */
void train_stop_catch(const shard_ckpt_lock *lock, const char *save);
/* The run is over and its lock about to be released: a signal from now on is ignored (the process ends
 * in a moment with the run's exit code; ending it at once could leave the lock behind). */
void train_stop_end(void);

/* Collective over comm, between steps: *why is 0 to go on, else why every rank stops here (a signal, or
 * rank 0's `lock` (NULL on the other ranks) taken over by another run). */
shard_status train_stop_agree(shard_comm *comm, shard_ckpt_lock *lock, int *why);

/* Collective: end the run stopped for `why` after step `last` (the run's first step was `first`; last <
 * first: none ran): save a checkpoint of step `last` into `save` (NULL: none) unless the run's save
 * policy (`every`: shard_trainer_save every that many steps, 0: none) has just saved it, or the lock was
 * lost; rank 0 prints one line saying what happened. */
shard_status train_stop_finish(shard_comm *comm, shard_trainer *t, int why, uint64_t first, uint64_t last,
                               const char *save, uint64_t every, const char *config_text, shard_ckpt_lock *lock);

/* The exit code of a run that went through train_stop_finish (128 + the signal, 1 when the lock was lost),
 * else 0. */
int train_stop_exit_code(void);

#endif
