/* params_impl.h — internal side of shard/params.h: the count that shows the parameter table's names are
 * indexed in linear time. */
#ifndef SHARD_PARAMS_IMPL_H
#define SHARD_PARAMS_IMPL_H

#include <stddef.h>

/* Name comparisons the parameter tables' hash index has made in this process while creating tables: a
 * table of n distinct names costs about n of them, not n^2 / 2. */
size_t shard__params_name_compares(void);

#endif
