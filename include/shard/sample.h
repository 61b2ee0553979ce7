/* sample.h — picking the next token from a language model's logits, as text
 * generation does: greedy at temperature 0, else a draw from
 * softmax(logits / temperature) over the top_k most likely tokens, from a
 * seeded generator so that a seed gives the same text every time. */
#ifndef SHARD_SAMPLE_H
#define SHARD_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The next 64 random bits of the generator whose whole state is *state (splitmix64); any value, the
 * seed included, is a valid state. */
uint64_t shard_random_next(uint64_t *state);

/* The token drawn from logits[0..vocab-1] into *token: temperature 0 takes the arg-max (the first of
 * equal ones); otherwise softmax(logits / temperature) restricted to the top_k largest logits (0 or
 * top_k >= vocab: all; ties with the K-th largest kept), drawn with one value of *rng.  Refused, with
 * SHARD_ERR_INVALID_ARG, when a logit is NaN or infinite. */
shard_status shard_sample_token(const float *logits, size_t vocab, double temperature, size_t top_k, uint64_t *rng,
                                int *token);

#ifdef __cplusplus
}
#endif

#endif
