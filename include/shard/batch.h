/* batch.h — where a model's rows come from: a batch source the trainer owns, so a model holds no data
 * path and reads no files.
 *
 * A source draws rows [first_row, first_row + rows) of step `step`'s global batch into buffers it owns
 * (sized at creation for max_rows rows).  Rows are a pure function of (seed, step, global row): rows
 * 0..7 loaded at once equal rows 0..3 then 4..7, so every rank count and every micro-batch split sees
 * the same global batch.  The model takes a loaded batch through its table's set_batch (model.h).
 *
 * The library's sources: token files (`train.tokens` of `shard data text`: rows of seq + 1 tokens,
 * inputs the first seq and next-token targets the last seq, int32 each), Fashion-MNIST's IDX files
 * (images scaled to [0, 1] as f32, labels as int32) and generated rows (x ~ N(0, 1), targets
 * tanh(x A) for a fixed teacher A, f32 each).  A program brings its own through the same table. */
#ifndef SHARD_BATCH_H
#define SHARD_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "shard/dtype.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded batch: `rows` rows of inputs and targets, each a dtype and a count of elements per row
 * (row r's inputs at inputs + r * input_elems).  The buffers belong to the source and hold until its
 * next load. */
typedef struct shard_batch {
    size_t rows;
    uint64_t seed, step; /* what it was drawn for */
    size_t first_row;
    shard_dtype input_dtype, target_dtype;
    size_t input_elems, target_elems; /* per row */
    void *inputs, *targets;
} shard_batch;

typedef struct shard_batch_source shard_batch_source;

typedef struct shard_batch_source_ops {
    size_t struct_size; /* sizeof(shard_batch_source_ops): lets the table grow */
    const char *kind;   /* "tokens", "fashion-mnist", "teacher", ... for messages */
    /* Rows [first_row, first_row + rows) of step's global batch into the source's buffers, described by
     * *into; rows is at most the source's max_rows (shard_batch_source_load checks). */
    shard_status (*load)(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                         shard_batch *into);
    void (*destroy)(shard_batch_source *src);
} shard_batch_source_ops;

struct shard_batch_source {
    const shard_batch_source_ops *ops;
    size_t max_rows; /* the most rows one load holds */
    void *impl;
};

/* The source's load after checking rows against max_rows (one line naming both otherwise). */
shard_status shard_batch_source_load(shard_batch_source *src, uint64_t seed, uint64_t step, size_t first_row,
                                     size_t rows, shard_batch *into);
/* Through its table (NULL: nothing). */
void shard_batch_source_destroy(shard_batch_source *src);

/* Token rows from a token file: inputs and targets int32, seq per row. */
typedef struct shard_batch_tokens_options {
    size_t struct_size;
    const char *path; /* a token file (train.tokens) */
    size_t seq, max_rows;
    size_t vocab_size; /* the model's vocabulary: a file with a larger one is refused; 0: not checked */
    const char *where; /* what asked for vocab_size, for that refusal (the config's path) */
} shard_batch_tokens_options;
shard_status shard_batch_source_tokens(const shard_batch_tokens_options *o, shard_batch_source **out);

/* Fashion-MNIST's training set (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz in data_dir;
 * NULL: Debian's /usr/share/datasets/fashion-mnist): inputs f32 in_channels x height x width per row,
 * scaled to [0, 1], targets one int32 label each.  Images of another shape, or labels of `classes` or
 * more, are refused. */
typedef struct shard_batch_images_options {
    size_t struct_size;
    const char *data_dir;
    size_t in_channels, height, width, classes;
    size_t max_rows;
} shard_batch_images_options;
shard_status shard_batch_source_images(const shard_batch_images_options *o, shard_batch_source **out);

/* Generated regression rows: x ~ N(0, 1) keyed by (seed, step, global row) under the stream name
 * "<name>.data.<step>", targets tanh(x A) with A [dim, dim] drawn once (teacher_seed, std
 * 1/sqrt(dim), stream "<name>.teacher"); inputs and targets f32, dim per row. */
typedef struct shard_batch_teacher_options {
    size_t struct_size;
    const char *name; /* at most 47 bytes */
    size_t dim, max_rows;
    uint64_t teacher_seed;
} shard_batch_teacher_options;
shard_status shard_batch_source_teacher(const shard_batch_teacher_options *o, shard_batch_source **out);

#ifdef __cplusplus
}
#endif
#endif
