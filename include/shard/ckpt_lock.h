/* ckpt_lock.h — one writer per checkpoint root.  Two runs saving into one
 * root would race over its step directories and `latest`, and both could
 * end with no checkpoint left whole; the writer lock lets the second refuse
 * at once.
 *
 * The lock is a file, root/writer.lock, holding the holder's host, pid, start
 * and heartbeat times (wall-clock seconds) as one JSON line.  It is made
 * whole under a temporary name and link()ed into place, which fails when a
 * lock is there already, also on network filesystems (NFS) where several
 * hosts see the root.  A thread of the holder rewrites the heartbeat every
 * few seconds.  A lock is stale, and taken over with a note, when its
 * heartbeat is older than SHARD_LOCK_STALE seconds (default 30), or when it
 * names this host and a process that is gone (a run killed outright).
 * The holder checks at each heartbeat that the file is still its own: a run
 * stopped for longer than the stale age (a suspended job) may find it taken
 * over, and shard_ckpt_lock_lost says so, so that it stops instead of
 * writing beside the new holder. */
#ifndef SHARD_CKPT_LOCK_H
#define SHARD_CKPT_LOCK_H

#include <stddef.h>
#include <stdio.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_ckpt_lock shard_ckpt_lock;

/* Take root's writer lock, making root when missing (and removing it again at release when it is still
 * empty then).  Refused (SHARD_ERR_INVALID_ARG) when a live lock is there, naming its host and pid; a
 * stale one is taken over with a line on `notes` (NULL: not said).  `option` names the
 * root in messages ("--save"; NULL: "checkpoint root"). */
shard_status shard_ckpt_lock_acquire(const char *root, const char *option, FILE *notes, shard_ckpt_lock **lock);

/* 1 when another writer has taken the lock over since (this holder's heartbeat looked stale to it), with
 * that writer described ("host H, pid P") in holder; else 0.  Safe from any thread. */
int shard_ckpt_lock_lost(shard_ckpt_lock *lock, char *holder, size_t holder_bytes);

/* Stop the heartbeat, remove the lock file when it is still this holder's, free.  NULL is fine. */
void shard_ckpt_lock_release(shard_ckpt_lock *lock);

/* Only remove the lock file when it is still this holder's: async-signal-safe (stat, fstat and unlink), for
 * a signal handler that ends the process at once.  NULL is fine. */
void shard_ckpt_lock_abandon(const shard_ckpt_lock *lock);

#ifdef __cplusplus
}
#endif
#endif
