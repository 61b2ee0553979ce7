/* split.h — the one rule by which the engine cuts n items into parts: part p
 * of n over k parts starts at p * (n / k) + min(p, n % k) and holds n / k
 * items, one more for the first n % k parts (10 over 4: 3, 3, 2, 2).
 *
 * Everything that cuts a range evenly uses it — a sharded dim of a spec,
 * the heads / columns / vocabulary rows a tensor rank holds, the tokens of
 * sequence parallelism, pipeline stages' layers, a kernel's chunks, a
 * collective's blocks — so pieces cut in different places of the engine
 * always line up. */
#ifndef SHARD_SPLIT_H
#define SHARD_SPLIT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Items [*first, *first + *count) of n are part `part` of `parts` (parts >= 1, part < parts). */
static inline void shard_split_even(size_t n, size_t parts, size_t part, size_t *first, size_t *count) {
    size_t base = n / parts, extra = n % parts;
    *first = part * base + (part < extra ? part : extra);
    *count = base + (part < extra);
}

#ifdef __cplusplus
}
#endif
#endif
