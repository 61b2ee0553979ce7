/* monitor.c — the step recorder (monitor_impl.h) and the imbalance rule.
 *
 * Figures are kept per communicator, found by handle first and by name
 * after, so two handles of one axis (a strategy's and a model's) add up under
 * the axis's name.  Communicators of one rank move nothing and are left out. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_impl.h"
#include "comm/comm_impl.h"
#include "monitor_impl.h"

_Thread_local shard__mon *shard__mon_current;

double shard_imbalance(const double *v, size_t n) {
    if (!v || n == 0) return 0.0;
    double max = v[0], sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        sum += v[i];
        if (v[i] > max) max = v[i];
    }
    double mean = sum / (double)n;
    return mean > 0.0 ? max / mean - 1.0 : 0.0;
}

shard_status shard__mon_create(shard__mon **out) {
    *out = calloc(1, sizeof **out);
    return *out ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "monitor: out of memory");
}

void shard__mon_destroy(shard__mon *m) {
    if (!m) return;
    if (shard__mon_current == m) shard__mon_current = NULL;
    free(m->ev);
    free(m);
}

void shard__mon_begin(shard__mon *m) {
    memset(&m->now, 0, sizeof m->now);
    memset(m->comm_of, 0, sizeof m->comm_of);
    m->exposed_s = m->wait_s = 0;
    m->waiting = 0;
    m->tag = NULL;
    m->events = 0;
    shard__mem_window_reset();
    m->t_step = shard__now();
    shard__mon_current = m;
}

void shard__mon_end(shard__mon *m) {
    shard_step_monitor *s = &m->now;
    s->wall_s = shard__now() - m->t_step;
    s->wait_s = m->wait_s;
    s->compute_s = s->wall_s - m->exposed_s - m->wait_s - s->optimizer_s;
    if (s->compute_s < 0) s->compute_s = 0;
    shard__mem_window_get(s->peak_bytes);
    m->last = *s;
    if (shard__mon_current == m) shard__mon_current = NULL;
}

static shard_monitor_comm *comm_slot(shard__mon *m, const shard_comm *comm) {
    shard_step_monitor *s = &m->now;
    for (size_t i = 0; i < s->comms; i++)
        if (m->comm_of[i] == comm) return &s->comm[i];
    for (size_t i = 0; i < s->comms; i++)
        if (strcmp(s->comm[i].name, comm->name) == 0) return &s->comm[i];
    if (s->comms == SHARD_MONITOR_MAX_COMMS) return NULL; /* more than a mesh has: left out of the figures */
    m->comm_of[s->comms] = comm;
    shard_monitor_comm *c = &s->comm[s->comms++];
    snprintf(c->name, sizeof c->name, "%s", comm->name);
    return c;
}

static shard_trace_event *new_event(shard__mon *m) {
    if (m->events == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 256;
        shard_trace_event *more = realloc(m->ev, cap * sizeof *more);
        if (!more) return NULL; /* the trace loses a span; the run goes on */
        m->ev = more, m->cap = cap;
    }
    shard_trace_event *e = &m->ev[m->events++];
    memset(e, 0, sizeof *e);
    e->micro = e->chunk = -1;
    return e;
}

void shard__mon_comm(shard__mon *m, const shard_comm *comm, const char *what, const char *cat, double start,
                     double wait0, double end, uint64_t bytes) {
    if (comm->size < 2) return;
    shard_monitor_comm *c = comm_slot(m, comm);
    double exposed = end - wait0;
    if (!m->waiting) m->exposed_s += exposed;
    if (c) {
        if (!m->waiting) c->exposed_s += exposed;
        c->hidden_s += wait0 - start;
        c->bytes += bytes;
        if (strncmp(what, "all_to_all", 10) == 0) c->all_to_all_bytes += bytes;
    }
    if (!m->tracing) return;
    for (int part = 0; part < 2; part++) {
        /* a request: its flight on thread 2 and, when it was not done at its wait, the wait on thread 1 */
        int request = wait0 > start;
        if (part == 0 && !request) continue;
        if (part == 1 && request && !(end > wait0)) continue;
        shard_trace_event *e = new_event(m);
        if (!e) return;
        snprintf(e->name, sizeof e->name, "%s%s", part == 1 && request ? "wait " : "", what);
        e->cat = cat ? cat : "comm";
        snprintf(e->axis, sizeof e->axis, "%s", comm->name);
        e->bytes = bytes;
        e->tid = part == 0 ? 2 : 1;
        e->t0 = part == 0 ? start : wait0, e->t1 = end;
    }
}

void shard__mon_wait_end(double t0, double t1) {
    shard__mon *m = shard__mon_current;
    if (!m) return;
    m->waiting--;
    m->wait_s += t1 - t0;
}

void shard__mon_span(const char *cat, int tid, int micro, int chunk, double t0, double t1, const char *fmt, ...) {
    shard__mon *m = shard__mon_current;
    if (!m || !m->tracing) return;
    shard_trace_event *e = new_event(m);
    if (!e) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    e->cat = cat, e->tid = tid, e->micro = micro, e->chunk = chunk, e->t0 = t0, e->t1 = t1;
}
