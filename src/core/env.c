/* env.c — see env.h. */
#include "core/env.h"

#include <stdio.h>
#include <stdlib.h>

double shard__env_seconds(const char *name, double fallback) {
    const char *env = getenv(name);
    if (!env || !*env) return fallback;
    char *end = NULL;
    double v = strtod(env, &end);
    if (end && *end == '\0' && v > 0 && v < 1e9) return v;
    fprintf(stderr, "shard: ignoring %s='%s': give seconds > 0 (using %g)\n", name, env, fallback);
    return fallback;
}
