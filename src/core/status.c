/* status.c — last-error text per thread and status names.
 *
 * The text lives in thread-local storage: on the threads backend every rank
 * is a thread, so each rank keeps its own root cause. */
#include "shard/status.h"
#include "shard/text.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error_text[SHARD_ERROR_TEXT_BYTES];

const char *shard_status_string(shard_status status) {
    switch (status) {
    case SHARD_OK: return "ok";
    case SHARD_ERR_INVALID_ARG: return "invalid argument";
    case SHARD_ERR_NO_MEMORY: return "out of memory";
    case SHARD_ERR_TIMEOUT: return "timeout";
    case SHARD_ERR_MISMATCH: return "collective mismatch";
    case SHARD_ERR_ABORTED: return "aborted";
    case SHARD_ERR_IO: return "i/o error";
    case SHARD_ERR_BACKEND: return "backend error";
    case SHARD_ERR_UNSUPPORTED: return "unsupported";
    case SHARD_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *shard_last_error(void) { return last_error_text; }

/* The cause of an allocation refused for an emulated device's memory (alloc_impl.h): the next
 * out-of-memory error the calling thread reports ends with it, so that a caller's own message (what it
 * was allocating) still says which rank, node and category ran out. */
static _Thread_local char memory_cause[SHARD_ERROR_TEXT_BYTES];

void shard__error_memory_cause(const char *text) { snprintf(memory_cause, sizeof memory_cause, "%s", text); }

void shard_clear_error(void) { last_error_text[0] = memory_cause[0] = '\0'; }

shard_status shard_error(shard_status status, const char *fmt, ...) {
    /* formatted apart first: an argument may be the last error itself ("rank 1 failed: %s") */
    char raw[SHARD_ERROR_TEXT_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    if (memory_cause[0] && status == SHARD_ERR_NO_MEMORY && !strstr(raw, memory_cause)) {
        size_t used = strlen(raw);
        snprintf(raw + used, sizeof raw - used, ": %s", memory_cause);
    }
    if (status != SHARD_ERR_NO_MEMORY) memory_cause[0] = '\0';
    shard_text_show_invisible(raw, last_error_text, sizeof last_error_text);
    return status;
}

void shard__trace_failure(shard_status status, const char *expr, const char *file, int line) {
    static _Atomic int debug = -1; /* read once; ranks may race to set it, all to the same value */
    int on = atomic_load(&debug);
    if (on < 0) {
        const char *env = getenv("SHARD_DEBUG");
        on = env && env[0] != '\0' && strcmp(env, "0") != 0;
        atomic_store(&debug, on);
    }
    if (on)
        fprintf(stderr, "shard: %s:%d: %s -> %s (%s)\n", file, line, expr, shard_status_string(status),
                last_error_text);
}
