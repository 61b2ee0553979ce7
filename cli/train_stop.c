/* train_stop.c — see train_stop.h.  The handler touches only lock-free
 * atomics, and on a second SIGINT stat/unlink/write/_exit, all of them
 * async-signal-safe. */
#define _GNU_SOURCE
#include "train_stop.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { STOP_LOCK_LOST = 1000 }; /* above every signal number: the reason that wins the max */

static atomic_int caught;  /* the first signal caught, 0 while none */
static atomic_int sigints; /* SIGINTs caught */
static atomic_int exit_code;
static atomic_int ended; /* the run is over and its lock about to go */
static _Atomic(const shard_ckpt_lock *) held;
static char at_once[4352]; /* the second SIGINT's line, made before any signal can come */

static void on_signal(int sig) {
    if (atomic_load(&ended)) return; /* the process ends in a moment, with the run's exit code */
    if (sig == SIGINT && atomic_fetch_add(&sigints, 1) > 0) {
        shard_ckpt_lock_abandon(atomic_load(&held));
        if (write(STDERR_FILENO, at_once, strlen(at_once)) < 0) {}
        _exit(130);
    }
    int none = 0;
    atomic_compare_exchange_strong(&caught, &none, sig);
}

void train_stop_catch(const shard_ckpt_lock *lock, const char *save) {
    atomic_store(&held, lock);
    if (save)
        snprintf(at_once, sizeof at_once,
                 "shard: stopped at once by a second SIGINT; the checkpoints in %s are as the last finished save "
                 "left them\n",
                 save);
    else
        snprintf(at_once, sizeof at_once, "shard: stopped at once by a second SIGINT\n");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* reads and writes under way go on rather than fail with EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

void train_stop_end(void) {
    atomic_store(&ended, 1);
    atomic_store(&held, NULL);
}

shard_status train_stop_agree(shard_comm *comm, shard_ckpt_lock *lock, int *why) {
    int32_t mine = atomic_load(&caught), all = 0;
    if (shard_ckpt_lock_lost(lock, NULL, 0)) mine = STOP_LOCK_LOST;
    if (shard_comm_size(comm) == 1) {
        *why = mine;
        return SHARD_OK;
    }
    /* threads ranks read the flag at different moments too: only the reduction makes them stop together */
    SHARD_CHECK(shard_comm_all_reduce(comm, &mine, &all, 1, SHARD_I32, SHARD_OP_MAX));
    *why = all;
    return SHARD_OK;
}

shard_status train_stop_finish(shard_comm *comm, shard_trainer *t, int why, uint64_t first, uint64_t last,
                               const char *save, uint64_t every, const char *config_text, shard_ckpt_lock *lock) {
    int rank0 = shard_comm_rank(comm) == 0;
    unsigned long long step = (unsigned long long)last;
    atomic_store(&exit_code, why == STOP_LOCK_LOST ? 1 : 128 + why);
    if (why == STOP_LOCK_LOST) {
        char holder[256] = "another run";
        shard_ckpt_lock_lost(lock, holder, sizeof holder);
        if (rank0)
            fprintf(stderr,
                    "shard: the lock of --save %s was taken over by %s (this run's heartbeat had stopped for longer "
                    "than the stale age): stopped after step %llu without saving; that run writes there now\n",
                    save, holder, step);
        return SHARD_OK;
    }
    const char *name = why == SIGTERM ? "SIGTERM" : why == SIGINT ? "SIGINT" : "a signal";
    if (last < first) {
        if (rank0)
            fprintf(stderr, "shard: stopped by %s before step %llu: no step ran, nothing saved\n", name, step + 1);
        return SHARD_OK;
    }
    if (save && !(every > 0 && last % every == 0)) SHARD_CHECK(shard_trainer_save(t, save, last, config_text));
    if (rank0 && save)
        fprintf(stderr, "shard: stopped by %s after step %llu; saved checkpoint step %llu in %s\n", name, step, step,
                save);
    else if (rank0)
        fprintf(stderr, "shard: stopped by %s after step %llu; nothing saved (no --save)\n", name, step);
    return SHARD_OK;
}

int train_stop_exit_code(void) { return atomic_load(&exit_code); }
