/* trace.c — `shard train --trace run.json`: the last step of any layout as a
 * Chrome trace / Perfetto JSON file.  One process per rank (pid = rank, named
 * by its mesh coordinates); thread 0 holds compute (the pipeline's F and B,
 * forward and backward, each unit's span, the optimizer), thread 1 the rank's
 * communication and waits (blocking collectives, the waits on requests, the
 * pipeline's waits), thread 2 non-blocking requests from start to end.  Times
 * are microseconds from the earliest rank's first event.  Each rank writes its
 * own events; rank 0 gathers the texts and writes the file atomically. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monitor.h"
#include "shard/files.h"
#include "trace.h"

/* A growing text buffer: appends never write past it (a failed growth leaves ok = 0). */
typedef struct text_buf {
    char *p;
    size_t len, cap;
    int ok;
} text_buf;

static void append(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(text_buf *t, const char *fmt, ...) {
    if (!t->ok) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->ok = 0;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = 2 * t->cap + (size_t)n;
        char *more = realloc(t->p, cap);
        if (!more) {
            t->ok = 0;
            return;
        }
        t->p = more, t->cap = cap;
    }
}

/* One rank's events as JSON objects, each preceded by ",\n"; *out malloc'd. */
static shard_status render(const shard_trace_event *ev, size_t n, int rank, const char *where, double origin,
                           text_buf *out) {
    append(out,
           ",\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d (%s)\"}},\n"
           "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"sort_index\": %d}}",
           rank, rank, where, rank, rank);
    static const char *const threads[3] = {"compute", "communication and waits", "requests in flight"};
    for (int k = 0; k < 3; k++)
        append(out,
               ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
               rank, k, threads[k]);
    for (size_t i = 0; i < n; i++) {
        const shard_trace_event *e = &ev[i];
        append(out,
               ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
               "\"dur\": %.3f, \"args\": {",
               e->name, e->cat, rank, e->tid, (e->t0 - origin) * 1e6, (e->t1 - e->t0) * 1e6);
        if (e->axis[0])
            append(out, "\"axis\": \"%s\", \"bytes\": %llu", e->axis, (unsigned long long)e->bytes);
        else if (e->micro >= 0)
            append(out, "\"micro_batch\": %d, \"chunk\": %d", e->micro, e->chunk < 0 ? 0 : e->chunk);
        append(out, "}}");
    }
    return out->ok ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory");
}

shard_status cli_write_trace(shard_comm *world, const shard_mesh *mesh, const shard_trainer *t, const char *path) {
    int ranks = shard_comm_size(world), rank = shard_comm_rank(world);
    const shard_trace_event *ev = NULL;
    size_t n = 0;
    SHARD_CHECK(shard_trainer_trace_events(t, &ev, &n));
    double first = n ? ev[0].t0 : 1e300, origin = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].t0 < first) first = ev[i].t0;
    SHARD_CHECK(shard_comm_all_reduce(world, &first, &origin, 1, SHARD_F64, SHARD_OP_MIN));
    char where[128];
    cli_mesh_where(mesh, rank, where, sizeof where);
    text_buf mine = {malloc(4096), 0, 4096, 1};
    if (!mine.p) return shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory");
    shard_status s = render(ev, n, rank, where, origin, &mine);
    int64_t len = (int64_t)mine.len, *lens = calloc((size_t)ranks, sizeof *lens);
    size_t *counts = calloc((size_t)ranks, sizeof *counts), *displs = calloc((size_t)ranks, sizeof *displs);
    char *all = NULL;
    if (s == SHARD_OK && !(lens && counts && displs)) s = shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory");
    if (s == SHARD_OK) s = shard_comm_all_gather(world, &len, lens, 1, SHARD_I64);
    size_t total = 0;
    for (int r = 0; s == SHARD_OK && r < ranks; r++) counts[r] = (size_t)lens[r], displs[r] = total, total += counts[r];
    if (s == SHARD_OK && !(all = malloc(total + 64)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory for %zu bytes", total);
    if (s == SHARD_OK) s = shard_comm_all_gatherv(world, mine.p, mine.len, all, counts, displs, SHARD_U8);
    if (s == SHARD_OK && rank == 0) {
        /* the first event's leading ",\n" gives way to the array's opening */
        text_buf out = {malloc(total + 128), 0, total + 128, 1};
        if (out.p)
            append(&out, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n%.*s\n]}\n", (int)(total - 2), all + 2);
        s = out.p && out.ok ? shard_atomic_write_file(path, out.p, out.len)
                            : shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory");
        free(out.p);
    }
    free(mine.p), free(lens), free(counts), free(displs), free(all);
    return s;
}
