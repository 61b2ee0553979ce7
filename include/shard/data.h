/* data.h — training data: token files, the batch loader, IDX images.
 *
 * Token file (`train.tokens`, `val.tokens`): a 64-byte little-endian header —
 * magic "SHRDTOK1", u32 version 1, u32 bytes per token (2 or 4), u32 vocab
 * size, u32 0, u64 token count, u64 xxh3 of the token bytes, 24 zero bytes —
 * then the tokens.  The byte-level tokenizer maps each byte of the text to
 * the token of its value (vocab 256), so any tool can reproduce a prompt.
 *
 * Batches are a pure function of (seed, step, row): row b of step s is the T
 * + 1 tokens starting at a position drawn from hash(seed, s, b), inputs the
 * first T and targets the last T.  A rank that holds rows [first, first +
 * rows) of the global batch gets exactly those rows, so a restart or another
 * number of ranks sees the same global batch. */
#ifndef SHARD_DATA_H
#define SHARD_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_tokens shard_tokens;

/* Write tokens (each < vocab) as a token file, atomically. */
shard_status shard_tokens_write(const char *path, const uint32_t *tokens, size_t count, uint32_t vocab);
/* Map a token file; the header, size and checksum are checked. */
shard_status shard_tokens_open(const char *path, shard_tokens **out);
void shard_tokens_close(shard_tokens *t);
size_t shard_tokens_count(const shard_tokens *t);
uint32_t shard_tokens_vocab(const shard_tokens *t);
uint32_t shard_tokens_at(const shard_tokens *t, size_t i);

/* Rows [first_row, first_row + rows) of the global batch of step `step`:
 * inputs and targets are [rows, T].  Needs at least T + 1 tokens. */
shard_status shard_tokens_batch(const shard_tokens *t, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                                size_t T, int32_t *inputs, int32_t *targets);

/* `shard data text`: the byte-level tokenizer over the files, concatenated in
 * order; the last val_fraction of the stream becomes val.tokens, the rest
 * train.tokens; meta.json describes both.  A summary goes to `report`.  An
 * out_dir where no file can be written is refused before the files are read;
 * the three files are written whole before any replaces an earlier one, so a
 * failed write (a full disk) leaves the earlier set as it was. */
shard_status shard_data_text(const char *const *files, size_t count, const char *out_dir, double val_fraction,
                             FILE *report);

/* An IDX file (as MNIST's; gzip-compressed or not) of unsigned bytes. */
typedef struct shard_idx {
    int ndim;
    size_t dims[4];
    size_t count; /* product of dims */
    uint8_t *data;
} shard_idx;

shard_status shard_idx_read(const char *path, shard_idx *out);
void shard_idx_free(shard_idx *idx);

#ifdef __cplusplus
}
#endif
#endif
