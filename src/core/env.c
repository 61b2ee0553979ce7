/* env.c — see env.h. */
#include "core/env.h"

#include <stdio.h>
#include <stdlib.h>

/* The number in `name` when all of it parses and lies in (0, 1e9), or [0, 1e9) with `zero_ok`; the
 * line on a bad value names the unit and the lower bound that would be valid. */
static double env_number(const char *name, double fallback, int zero_ok, const char *unit) {
    const char *env = getenv(name);
    if (!env || !*env) return fallback;
    char *end = NULL;
    double v = strtod(env, &end);
    if (end && *end == '\0' && (v > 0 || (zero_ok && v == 0)) && v < 1e9) return v;
    fprintf(stderr, "shard: ignoring %s='%s': give %s %s 0 (using %g)\n", name, env, unit, zero_ok ? ">=" : ">",
            fallback);
    return fallback;
}

double shard__env_seconds(const char *name, double fallback) { return env_number(name, fallback, 0, "seconds"); }

double shard__env_microseconds(const char *name, double fallback) {
    return env_number(name, fallback, 1, "microseconds");
}
