/* files.h — the file-system helpers the engine's checkpoints are built on,
 * for callers that write beside them: files that appear whole or not at all,
 * directory trees made and removed. */
#ifndef SHARD_FILES_H
#define SHARD_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Write a whole file atomically: a temporary name in the same directory, fsync, rename into place, fsync
 * the directory, so a crash leaves either the old file or the new one.  size_bytes may be 0. */
shard_status shard_atomic_write_file(const char *path, const void *bytes, size_t size_bytes);
/* The directory part of path ("." when it has none) into out. */
void shard_path_dir(const char *path, char *out, size_t out_bytes);
/* mkdir -p: dir and every missing parent. */
shard_status shard_mkdirs(const char *dir);
/* rm -rf: path and everything under it (absent is fine). */
shard_status shard_remove_tree(const char *path);
/* A byte count as people read it: "3 GiB", "512 MiB", "4 KiB" when a whole number of those, else "1000 B". */
void shard_size_format(uint64_t bytes, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif

#endif
