/* file_read.h — internal side of the engine's file reading (shard_file_open and shard_file_read in
 * shard/files.h): the bound each kind of input may not pass, and an open that never waits. */
#ifndef SHARD_FILE_READ_H
#define SHARD_FILE_READ_H

#include <stdint.h>

/* The most bytes an input of each kind may hold, past which it is refused before it is read.  Each is
 * far above what the engine writes or a model needs: a config is a few hundred bytes of JSON; a
 * checkpoint's index lists every tensor's chunks (tens of bytes each, for up to 2^16 layers of
 * tensors); a safetensors index maps every tensor's name to a file; `latest` holds "step_N".  Files
 * mapped rather than read (safetensors, tokens) take no bound: their sizes are their contents'. */
#define SHARD__CONFIG_MAX_BYTES ((uint64_t)1 << 20)
#define SHARD__CKPT_INDEX_MAX_BYTES ((uint64_t)1 << 30)
#define SHARD__HF_INDEX_MAX_BYTES ((uint64_t)256 << 20)
#define SHARD__LATEST_MAX_BYTES ((uint64_t)4096)

/* open(path) for reading without waiting (a FIFO's open waits for a writer), then made blocking again:
 * the descriptor, or -1 with errno set. */
int shard__file_open_nowait(const char *path);

#endif
