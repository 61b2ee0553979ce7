/* files.h — the file-system helpers the engine's checkpoints are built on,
 * for callers that write beside them: files that appear whole or not at all,
 * directory trees made and removed, and inputs opened as the engine opens
 * its own (regular files only, of a bounded size, never waiting). */
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
/* A text file written a line at a time (a run's log): each printf goes to the file at once, checked, and
 * one that cannot be written whole is cut off again (the file holds whole lines; later printfs fail); the
 * close fsyncs and closes, checked.  Every failure is an error naming the file and the reason (strerror),
 * so a full disk never leaves a short file unsaid.  append: add to an existing file, else replace it. */
typedef struct shard_text_file shard_text_file;
shard_status shard_text_file_open(const char *path, int append, shard_text_file **out);
shard_status shard_text_file_printf(shard_text_file *file, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Closes and frees file even when it fails (NULL: nothing to do). */
shard_status shard_text_file_close(shard_text_file *file);
/* Whether files can be written in dir, found before any work: a file created there, one byte written,
 * removed.  A dir still to be made is probed in its nearest existing ancestor (where it would be made);
 * an error names the directory and the reason. */
shard_status shard_dir_probe_writable(const char *dir);
/* The directory part of path ("." when it has none) into out. */
void shard_path_dir(const char *path, char *out, size_t out_bytes);
/* mkdir -p: dir and every missing parent. */
shard_status shard_mkdirs(const char *dir);
/* rm -rf: path and everything under it (absent is fine). */
shard_status shard_remove_tree(const char *path);
/* Open path for reading, as the engine opens every file it reads: refused at once, in one line naming the
 * path and what stands there, when it is not a regular file (a FIFO, whose open would wait for a writer
 * forever, a directory, a device, a socket); refused before a byte is read when it holds more than
 * limit_bytes (0: no bound), naming both sizes.  `doing` is the message's phrase after the path, e.g.
 * "cannot read the config".  *fd blocks as usual and closes on exec; *size_bytes (may be NULL) is its size. */
shard_status shard_file_open(const char *path, const char *doing, uint64_t limit_bytes, int *fd, uint64_t *size_bytes);
/* shard_file_open, then the whole file into *bytes (malloc'd, with a NUL after its *size_bytes bytes). */
shard_status shard_file_read(const char *path, const char *doing, uint64_t limit_bytes, char **bytes,
                             size_t *size_bytes);
/* A byte count as people read it: "3 GiB", "512 MiB", "4 KiB" when a whole number of those, else "1000 B". */
void shard_size_format(uint64_t bytes, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif

#endif
