/* batch_impl.h — batch sources the library makes for itself. */
#ifndef SHARD_BATCH_IMPL_H
#define SHARD_BATCH_IMPL_H

#include "shard/batch.h"

/* Rows of zeros laid out as `shape` says (its input and target dtypes and elements per row): what the
 * analyzer's dry run of a step feeds a model, which needs no data. */
shard_status shard__batch_source_zeros(const shard_batch *shape, size_t max_rows, shard_batch_source **out);

#endif
