/* status.h — shard's one error convention.
 *
 * Every public call returns a shard_status: 0 on success, a negative code on
 * failure.  The human-readable cause of the most recent failure on the calling
 * thread (= rank, on the threads backend) is kept in shard_last_error().
 * SHARD_CHECK propagates a failure to the caller; it never aborts. */
#ifndef SHARD_STATUS_H
#define SHARD_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shard_status {
    SHARD_OK = 0,
    SHARD_ERR_INVALID_ARG = -1, /* a caller passed something invalid */
    SHARD_ERR_NO_MEMORY = -2,   /* an allocation failed */
    SHARD_ERR_TIMEOUT = -3,     /* a wait passed its deadline */
    SHARD_ERR_MISMATCH = -4,    /* ranks disagreed about a collective */
    SHARD_ERR_ABORTED = -5,     /* another rank failed and aborted the job */
    SHARD_ERR_IO = -6,          /* a file or system call failed */
    SHARD_ERR_BACKEND = -7,     /* the communication library reported an error */
    SHARD_ERR_UNSUPPORTED = -8, /* valid request this build or backend cannot serve */
    SHARD_ERR_INTERNAL = -9     /* a broken invariant inside shard (a bug) */
} shard_status;

/* Short fixed name of a status code, e.g. "timeout". */
const char *shard_status_string(shard_status status);

/* The most bytes the last error's text holds, its NUL included: room for a message that names two
 * whole paths of PATH_MAX bytes and what would be valid, so no message is cut in the middle of a path. */
#define SHARD_ERROR_TEXT_BYTES 16384

/* Text of the last error recorded on this thread ("" when none). */
const char *shard_last_error(void);

/* Forget the last error on this thread. */
void shard_clear_error(void);

/* Record an error (printf-style text) on this thread and return `status`,
 * so that callers can write `return shard_error(SHARD_ERR_INVALID_ARG, ...)`.  A character of the text
 * a terminal would not show (a byte-order mark in a key, a no-break space in a path) is written as its
 * code and name (text.h's shard_text_show_invisible).  The arguments may include shard_last_error(). */
shard_status shard_error(shard_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Propagate a failing status to the caller.  With SHARD_DEBUG=1 in the
 * environment each propagation step is logged with file:line. */
void shard__trace_failure(shard_status status, const char *expr, const char *file, int line);

#define SHARD_CHECK(expr)                                                                                              \
    do {                                                                                                               \
        shard_status shard__s = (expr);                                                                                \
        if (shard__s < 0) {                                                                                            \
            shard__trace_failure(shard__s, #expr, __FILE__, __LINE__);                                                 \
            return shard__s;                                                                                           \
        }                                                                                                              \
    } while (0)

/* Like SHARD_CHECK but jumps to a cleanup label with the status stored. */
#define SHARD_CHECK_GOTO(expr, status_var, label)                                                                      \
    do {                                                                                                               \
        (status_var) = (expr);                                                                                         \
        if ((status_var) < 0) {                                                                                        \
            shard__trace_failure((status_var), #expr, __FILE__, __LINE__);                                             \
            goto label;                                                                                                \
        }                                                                                                              \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
