/* atomic_file.h — internal: files that appear whole or not at all.  Written
 * to a temporary name in the same directory, fsynced, renamed into place,
 * then the directory is fsynced, so a crash at any point leaves either the
 * old file or the new one (POSIX rename is atomic within a filesystem). */
#ifndef SHARD_CKPT_ATOMIC_FILE_H
#define SHARD_CKPT_ATOMIC_FILE_H

#include <limits.h>
#include <stddef.h>

#include "shard/status.h"

typedef struct shard__atomic_file {
    int fd;
    char path[PATH_MAX], tmp[PATH_MAX];
} shard__atomic_file;

shard_status shard__atomic_open(const char *path, shard__atomic_file *f);
shard_status shard__atomic_write(shard__atomic_file *f, const void *bytes, size_t size);
/* fsync, close, rename into place, fsync the directory. */
shard_status shard__atomic_commit(shard__atomic_file *f);
/* Close and remove the temporary file. */
void shard__atomic_abort(shard__atomic_file *f);

/* fsync a directory (so that a rename or a new entry in it is durable). */
shard_status shard__fsync_dir(const char *dir);
/* The directory part of a path ("." when it has none). */
void shard__dir_of(const char *path, char *out, size_t out_bytes);
/* Write a whole small file atomically. */
shard_status shard__atomic_write_file(const char *path, const void *bytes, size_t size);

#endif
