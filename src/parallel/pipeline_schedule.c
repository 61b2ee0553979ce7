/* pipeline_schedule.c — see pipeline_schedule.h: the three schedule
 * generators, the equal-cost timeline (dependencies, bubble, in-flight
 * micro-batches), the ASCII picture and the layer partition. */
#include "parallel/pipeline_schedule.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shard/split.h"

shard_status shard__pipe_kind_parse(const char *text, shard_pipe_kind *out) {
    static const char *const names[] = {"gpipe", "1f1b", "interleaved"};
    for (int k = 0; k < 3; k++)
        if (text && strcmp(text, names[k]) == 0) {
            *out = (shard_pipe_kind)k;
            return SHARD_OK;
        }
    return shard_error(SHARD_ERR_INVALID_ARG, "--schedule '%s': use gpipe, 1f1b or interleaved", text ? text : "");
}

const char *shard__pipe_kind_name(shard_pipe_kind kind) {
    return kind == SHARD_PIPE_GPIPE ? "gpipe" : kind == SHARD_PIPE_1F1B ? "1f1b" : "interleaved";
}

void shard__pipe_schedule_destroy(shard_pipe_schedule *s) {
    if (!s) return;
    for (int r = 0; s->ops && r < s->p; r++) free(s->ops[r]);
    free(s->ops), free(s->count), free(s);
}

/* Megatron's order of a rank's k-th forward (or backward) among its m * v: micro-batches go in groups of p
 * through chunk 0, then the same group through chunk 1, ... (backward: chunks from the last). */
static shard_pipe_op interleaved_op(char what, int k, int p, int v) {
    int group = k / (p * v), in_group = k % (p * v), chunk = in_group / p;
    return (shard_pipe_op){what, group * p + in_group % p, what == 'F' ? chunk : v - 1 - chunk};
}

static void fill_rank(const shard_pipe_schedule *s, int r, shard_pipe_op *ops) {
    int p = s->p, m = s->m, v = s->v, n = 0, total = m * v;
    if (s->kind == SHARD_PIPE_GPIPE) {
        for (int j = 0; j < m; j++) ops[n++] = (shard_pipe_op){'F', j, 0};
        for (int j = 0; j < m; j++) ops[n++] = (shard_pipe_op){'B', j, 0};
        return;
    }
    /* 1F1B: warm-up forwards, then one forward and one backward in turn, then the remaining backwards */
    int warm = s->kind == SHARD_PIPE_1F1B ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p;
    if (warm > total) warm = total;
    int f = 0, b = 0;
    for (; f < warm; f++)
        ops[n++] = s->kind == SHARD_PIPE_1F1B ? (shard_pipe_op){'F', f, 0} : interleaved_op('F', f, p, v);
    while (f < total) {
        ops[n++] = s->kind == SHARD_PIPE_1F1B ? (shard_pipe_op){'F', f, 0} : interleaved_op('F', f, p, v);
        f++;
        ops[n++] = s->kind == SHARD_PIPE_1F1B ? (shard_pipe_op){'B', b, 0} : interleaved_op('B', b, p, v);
        b++;
    }
    for (; b < total; b++)
        ops[n++] = s->kind == SHARD_PIPE_1F1B ? (shard_pipe_op){'B', b, 0} : interleaved_op('B', b, p, v);
}

shard_status shard__pipe_schedule_create(shard_pipe_kind kind, int p, int m, int v, shard_pipe_schedule **out) {
    *out = NULL;
    if (p < 1 || m < 1)
        return shard_error(SHARD_ERR_INVALID_ARG, "pipeline: %d stages x %d micro-batches (need >= 1 each)", p, m);
    if (kind != SHARD_PIPE_INTERLEAVED && v != 1)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--virtual-stages %d needs --schedule interleaved (%s runs one chunk per rank)", v,
                           shard__pipe_kind_name(kind));
    if (kind == SHARD_PIPE_INTERLEAVED && v < 1)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--schedule interleaved: --virtual-stages %d is invalid: give 1 or more", v);
    if (kind == SHARD_PIPE_INTERLEAVED && m % p)
        return m < p ? shard_error(SHARD_ERR_INVALID_ARG,
                                   "--schedule interleaved: --micro-batches %d is not a multiple of "
                                   "pipe = %d (give %d or a multiple)",
                                   m, p, p)
                     : shard_error(SHARD_ERR_INVALID_ARG,
                                   "--schedule interleaved: --micro-batches %d is not a multiple of "
                                   "pipe = %d (give %d or %d)",
                                   m, p, m / p * p, (m / p + 1) * p);
    shard_pipe_schedule *s = calloc(1, sizeof *s);
    if (!s) return shard_error(SHARD_ERR_NO_MEMORY, "pipeline schedule: out of memory");
    s->kind = kind, s->p = p, s->m = m, s->v = v;
    s->count = calloc((size_t)p, sizeof *s->count), s->ops = calloc((size_t)p, sizeof *s->ops);
    for (int r = 0; s->count && s->ops && r < p; r++) {
        s->count[r] = 2 * m * v;
        if (!(s->ops[r] = calloc((size_t)s->count[r], sizeof **s->ops))) break;
        fill_rank(s, r, s->ops[r]);
    }
    if (!s->count || !s->ops || !s->ops[p - 1]) {
        shard__pipe_schedule_destroy(s);
        return shard_error(SHARD_ERR_NO_MEMORY, "pipeline schedule: out of memory");
    }
    *out = s;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- the equal-cost timeline */

shard_status shard__pipe_schedule_timeline(const shard_pipe_schedule *s, int f_cost, int b_cost, int **start,
                                           int *total_slots, int *peak_in_flight) {
    int p = s->p, m = s->m, S = p * s->v;
    /* end time of F and B of (virtual stage, micro-batch); -1: not placed yet */
    int *f_end = malloc((size_t)(S * m) * sizeof *f_end), *b_end = malloc((size_t)(S * m) * sizeof *b_end);
    int *next = calloc((size_t)p, sizeof *next), *free_at = calloc((size_t)p, sizeof *free_at);
    if (!f_end || !b_end || !next || !free_at) {
        free(f_end), free(b_end), free(next), free(free_at);
        return shard_error(SHARD_ERR_NO_MEMORY, "pipeline timeline: out of memory");
    }
    for (int i = 0; i < S * m; i++) f_end[i] = b_end[i] = -1;
    int left = 0, total = 0;
    for (int r = 0; r < p; r++) left += s->count[r];
    for (int progress = 1; left && progress;) {
        progress = 0;
        for (int r = 0; r < p; r++) {
            while (next[r] < s->count[r]) {
                shard_pipe_op op = s->ops[r][next[r]];
                int st = op.chunk * p + r, at = free_at[r], dep;
                if (op.what == 'F') {
                    dep = st > 0 ? f_end[(st - 1) * m + op.micro] : 0;
                } else {
                    int own = f_end[st * m + op.micro], later = st + 1 < S ? b_end[(st + 1) * m + op.micro] : 0;
                    dep = own < 0 || later < 0 ? -1 : own > later ? own : later;
                }
                if (dep < 0) break;
                at = dep > at ? dep : at;
                if (start) start[r][next[r]] = at;
                free_at[r] = at + (op.what == 'F' ? f_cost : b_cost);
                (op.what == 'F' ? f_end : b_end)[st * m + op.micro] = free_at[r];
                total = free_at[r] > total ? free_at[r] : total;
                next[r]++, left--, progress = 1;
            }
        }
    }
    free(f_end), free(b_end), free(next), free(free_at);
    if (left)
        return shard_error(SHARD_ERR_INTERNAL, "pipeline schedule %s (p %d, m %d, v %d) deadlocks: %d ops never start",
                           shard__pipe_kind_name(s->kind), p, m, s->v, left);
    if (total_slots) *total_slots = total;
    for (int r = 0; peak_in_flight && r < p; r++) {
        int held = 0, peak = 0;
        for (int i = 0; i < s->count[r]; i++) {
            held += s->ops[r][i].what == 'F' ? 1 : -1;
            peak = held > peak ? held : peak;
        }
        peak_in_flight[r] = peak;
    }
    return SHARD_OK;
}

double shard__pipe_schedule_bubble(const shard_pipe_schedule *s, int f_cost, int b_cost) {
    int total = 0;
    if (shard__pipe_schedule_timeline(s, f_cost, b_cost, NULL, &total, NULL) != SHARD_OK || total == 0) return -1;
    double busy = (double)s->m * s->v * (f_cost + b_cost) * s->p;
    return 1.0 - busy / ((double)s->p * total);
}

void shard__pipe_schedule_print(const shard_pipe_schedule *s, FILE *out) {
    int p = s->p, total = 0;
    int **start = calloc((size_t)p, sizeof *start);
    int have = start != NULL;
    for (int r = 0; start && r < p; r++) have &= (start[r] = calloc((size_t)s->count[r] + 1, sizeof **start)) != NULL;
    if (!have || shard__pipe_schedule_timeline(s, 1, 1, start, &total, NULL) != SHARD_OK) {
        fprintf(out, "(no timeline: %s)\n", shard_last_error());
    } else {
        int digits = 1; /* of the largest micro-batch number: a cell is F<micro>[chunk] and a space */
        for (int k = s->m - 1; k >= 10; k /= 10) digits++;
        int width = 2 + digits + (s->v > 1);
        fprintf(out, "%s: %d stages x %d micro-batches%s; one slot per F or B, '.' idle\n",
                shard__pipe_kind_name(s->kind), p, s->m, s->v > 1 ? " (chunks a, b, ... per rank)" : "");
        char *line = malloc((size_t)(total * width + 1));
        for (int r = 0; line && r < p; r++) {
            memset(line, ' ', (size_t)(total * width));
            for (int t = 0; t < total; t++) line[t * width] = '.';
            line[total * width] = 0;
            for (int i = 0; i < s->count[r]; i++) {
                const shard_pipe_op *op = &s->ops[r][i];
                char cell[16];
                int n = s->v > 1 ? snprintf(cell, sizeof cell, "%c%d%c", op->what, op->micro, 'a' + op->chunk)
                                 : snprintf(cell, sizeof cell, "%c%d", op->what, op->micro);
                memcpy(line + start[r][i] * width, cell, (size_t)n);
            }
            fprintf(out, "rank %d |%s|\n", r, line);
        }
        free(line);
    }
    for (int r = 0; start && r < p; r++) free(start[r]);
    free(start);
}

/* ---------------------------------------------------------------- the public face (shard/schedule.h) */

shard_status shard_pipe_kind_parse(const char *text, shard_pipe_kind *out) { return shard__pipe_kind_parse(text, out); }

shard_status shard_pipe_schedule_create(shard_pipe_kind kind, int p, int m, int v, shard_pipe_schedule **out) {
    return shard__pipe_schedule_create(kind, p, m, v, out);
}

void shard_pipe_schedule_destroy(shard_pipe_schedule *s) { shard__pipe_schedule_destroy(s); }

shard_status shard_pipe_schedule_timeline(const shard_pipe_schedule *s, int f_cost, int b_cost, int **start,
                                          int *total_slots, int *peak_in_flight) {
    return shard__pipe_schedule_timeline(s, f_cost, b_cost, start, total_slots, peak_in_flight);
}

double shard_pipe_schedule_bubble(const shard_pipe_schedule *s, int f_cost, int b_cost) {
    return shard__pipe_schedule_bubble(s, f_cost, b_cost);
}

void shard_pipe_schedule_print(const shard_pipe_schedule *s, FILE *out) { shard__pipe_schedule_print(s, out); }

/* ---------------------------------------------------------------- partition */

shard_status shard__pipe_partition(size_t n, int k, const char *list, size_t *first) {
    if (k < 1) return shard_error(SHARD_ERR_INVALID_ARG, "pipeline: %d stages", k);
    first[0] = 0;
    if (!list || !*list) {
        if (n < (size_t)k)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "pipeline: %zu layers cannot fill %d stages (each needs at least one)", n, k);
        for (int i = 0; i < k; i++) {
            size_t at, count;
            shard_split_even(n, (size_t)k, (size_t)i, &at, &count);
            first[i + 1] = at + count;
        }
        return SHARD_OK;
    }
    const char *at = list;
    for (int i = 0; i < k; i++) {
        char *end;
        errno = 0;
        long c = strtol(at, &end, 10);
        if (end == at || c < 1 || errno == ERANGE || (size_t)c > n || (i + 1 < k && *end != ',') ||
            (i + 1 == k && *end))
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "--layers-per-stage '%s': give %d counts >= 1 separated by commas, "
                               "adding up to the model's %zu layers",
                               list, k, n);
        if ((size_t)c > SIZE_MAX - first[i]) /* the sum would wrap (and could wrap back to n) */
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "--layers-per-stage '%s': the counts add up to more than %zu; the "
                               "model has %zu layers",
                               list, SIZE_MAX, n);
        first[i + 1] = first[i] + (size_t)c;
        at = end + 1;
    }
    if (first[k] != n)
        return shard_error(SHARD_ERR_INVALID_ARG, "--layers-per-stage '%s' adds up to %zu layers; the model has %zu",
                           list, first[k], n);
    return SHARD_OK;
}
