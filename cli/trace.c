/* trace.c — `shard train --trace run.json`: the last step of a pipelined run
 * as a Chrome trace / Perfetto JSON file.  One process row per rank (named
 * with its pipe stage), compute spans (F, B, recompute) on thread 0 and the
 * waits for activations, gradients and the tied parameter on thread 1, in
 * microseconds from the earliest rank's start.  Every rank's spans are
 * gathered to rank 0, which writes the file atomically. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/files.h"
#include "trace.h"

enum { FIELDS = 5 }; /* what, micro, chunk, start, end */

static const char *span_name(char what) {
    switch (what) {
    case 'F': return "F";
    case 'B': return "B";
    case 'r': return "recompute F";
    case 'f': return "wait activation";
    case 'b': return "wait gradient";
    default: return "wait tied gradient";
    }
}

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

/* Rank 0: the JSON text of every rank's spans (all[r * ...]); malloc'd, NULL when out of memory. */
static char *render(const double *all, const size_t *counts, const size_t *displs, const int64_t *stage, int ranks,
                    size_t *len) {
    double origin = 0;
    int have = 0;
    for (int r = 0; r < ranks; r++)
        for (size_t i = 0; i < counts[r]; i += FIELDS) {
            double t = all[displs[r] + i + 3];
            if (!have || t < origin) origin = t, have = 1;
        }
    text_buf out = {malloc(4096), 0, 4096, 1};
    if (!out.p) return NULL;
    append(&out, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    const char *sep = "";
    for (int r = 0; r < ranks; r++) {
        append(&out,
               "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d "
               "(pipe stage %lld)\"}},\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"name\": \"compute\"}},\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, "
               "\"tid\": 1, \"args\": {\"name\": \"communication wait\"}}",
               sep, r, r, (long long)stage[r], r, r);
        sep = ",\n";
        for (size_t i = 0; i < counts[r]; i += FIELDS) {
            const double *f = all + displs[r] + i;
            char what = (char)f[0];
            int compute = what == 'F' || what == 'B' || what == 'r';
            char chunk[24] = "";
            if (f[2] > 0) snprintf(chunk, sizeof chunk, " chunk %.0f", f[2]);
            append(&out,
                   ",\n{\"name\": \"%s%s%.0f%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, "
                   "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"micro_batch\": %.0f, \"chunk\": %.0f}}",
                   span_name(what), compute ? "" : " ", f[1] < 0 ? 0 : f[1], chunk,
                   compute ? "compute" : "communication", r, compute ? 0 : 1, (f[3] - origin) * 1e6,
                   (f[4] - f[3]) * 1e6, f[1], f[2]);
        }
    }
    append(&out, "\n]}\n");
    if (!out.ok) {
        free(out.p);
        return NULL;
    }
    *len = out.len;
    return out.p;
}

shard_status cli_write_trace(shard_comm *world, const shard_pipeline_stats *st, const char *path) {
    int ranks = shard_comm_size(world), rank = shard_comm_rank(world);
    size_t mine = st->spans * FIELDS;
    double *pack = malloc((mine ? mine : 1) * sizeof *pack);
    size_t *counts = calloc((size_t)ranks, sizeof *counts), *displs = calloc((size_t)ranks, sizeof *displs);
    int64_t *all_counts = calloc((size_t)ranks, sizeof *all_counts), *stages = calloc((size_t)ranks, sizeof *stages);
    int64_t my[2] = {(int64_t)mine, st->stage};
    int64_t *pairs = calloc((size_t)ranks * 2, sizeof *pairs);
    double *all = NULL;
    shard_status s = pack && counts && displs && all_counts && stages && pairs
        ? SHARD_OK
        : shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory");
    for (size_t i = 0; s == SHARD_OK && i < st->spans; i++) {
        const shard_trace_span *sp = &st->span[i];
        double *f = pack + i * FIELDS;
        f[0] = sp->what, f[1] = sp->micro, f[2] = sp->chunk, f[3] = st->begin_s + sp->t0, f[4] = st->begin_s + sp->t1;
    }
    if (s == SHARD_OK) s = shard_comm_all_gather(world, my, pairs, 2, SHARD_I64);
    size_t total = 0;
    for (int r = 0; s == SHARD_OK && r < ranks; r++)
        counts[r] = (size_t)pairs[2 * r], displs[r] = total, stages[r] = pairs[2 * r + 1], total += counts[r];
    if (s == SHARD_OK && !(all = malloc((total ? total : 1) * sizeof *all)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory for %zu spans", total / FIELDS);
    if (s == SHARD_OK) s = shard_comm_all_gatherv(world, pack, mine, all, counts, displs, SHARD_F64);
    if (s == SHARD_OK && rank == 0) {
        size_t len = 0;
        char *text = render(all, counts, displs, stages, ranks, &len);
        s = text ? shard_atomic_write_file(path, text, len)
                 : shard_error(SHARD_ERR_NO_MEMORY, "--trace: out of memory");
        free(text);
    }
    free(pack), free(counts), free(displs), free(all_counts), free(stages), free(pairs), free(all);
    return s;
}
