/* clock.h — the engine's time source: a monotonic clock for timing steps
 * and collectives (never steps back when the wall clock is adjusted). */
#ifndef SHARD_CLOCK_H
#define SHARD_CLOCK_H

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on a monotonic clock with an arbitrary origin: only differences mean anything. */
double shard_clock_seconds(void);

#ifdef __cplusplus
}
#endif

#endif
