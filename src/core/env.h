/* env.h — internal: settings read from the environment, one rule for all of
 * them (SHARD_TIMEOUT, SHARD_EXIT_TIMEOUT, SHARD_SPIN_US, ...): a malformed or
 * out-of-range value is never read as some other number, it is named in one
 * stderr line with what is valid and the default is used instead. */
#ifndef SHARD_CORE_ENV_H
#define SHARD_CORE_ENV_H

/* The seconds in environment variable `name` when set to a number in (0, 1e9); else `fallback`, and
 * when it is set to something else, one stderr line saying it is ignored and what is used instead. */
double shard__env_seconds(const char *name, double fallback);

/* The same rule for a duration in microseconds where 0 is meaningful ("not at all"): a number in
 * [0, 1e9), else `fallback` with the same one line. */
double shard__env_microseconds(const char *name, double fallback);

#endif
