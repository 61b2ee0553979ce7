/* monitor.c — see monitor.h.  The figures are each rank's own (the trainer's
 * step monitor); these functions only bring them to rank 0 and word them.
 * "Others wait" is the mean, over the other ranks, of what they spent
 * waiting: exposed communication and the pipeline's waits. */
#include "monitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RANK_JSON_BYTES = 4096 }; /* one rank's object: 8 communicators (3 maps) and 6 categories fit with room */

void cli_mesh_where(const shard_mesh *mesh, int rank, char *out, size_t out_bytes) {
    int coords[SHARD_MESH_MAX_AXES], rest = rank, n = shard_mesh_ndim(mesh);
    size_t at = 0;
    out[0] = '\0';
    for (int a = n - 1; a >= 0; a--)
        coords[a] = rest % shard_mesh_axis_size(mesh, a), rest /= shard_mesh_axis_size(mesh, a);
    for (int a = 0; a < n && at < out_bytes; a++)
        at += (size_t)snprintf(out + at, out_bytes - at, "%s%s=%d", a ? "," : "", shard_mesh_axis_name(mesh, a),
                               coords[a]);
}

/* Exposed communication of a step, every communicator. */
static double exposed_s(const shard_step_monitor *m) {
    double e = 0;
    for (size_t i = 0; i < m->comms; i++) e += m->comm[i].exposed_s;
    return e;
}

/* `"KEY": {NAME: bytes, ...}` of every communicator, all its bytes or its all_to_all(v/w)s' (at: where in out). */
static size_t bytes_json(const shard_step_monitor *m, const char *key, int all_to_all, char *out, size_t bytes,
                         size_t at) {
    if (at < bytes) at += (size_t)snprintf(out + at, bytes - at, ", \"%s\": {", key);
    for (size_t i = 0; i < m->comms && at < bytes; i++)
        at += (size_t)snprintf(out + at, bytes - at, "%s\"%s\": %llu", i ? ", " : "", m->comm[i].name,
                               (unsigned long long)(all_to_all ? m->comm[i].all_to_all_bytes : m->comm[i].bytes));
    if (at < bytes) at += (size_t)snprintf(out + at, bytes - at, "}");
    return at;
}

static void rank_json(const shard_step_monitor *m, int rank, char *out, size_t bytes) {
    size_t at =
        (size_t)snprintf(out, bytes, "{\"rank\": %d, \"compute_ms\": %.3f, \"comm_ms\": {", rank, m->compute_s * 1e3);
    for (size_t i = 0; i < m->comms && at < bytes; i++)
        at += (size_t)snprintf(out + at, bytes - at, "%s\"%s\": %.3f", i ? ", " : "", m->comm[i].name,
                               m->comm[i].exposed_s * 1e3);
    if (at < bytes) at += (size_t)snprintf(out + at, bytes - at, "}");
    at = bytes_json(m, "comm_bytes", 0, out, bytes, at);
    at = bytes_json(m, "all_to_all_bytes", 1, out, bytes, at);
    if (at < bytes)
        at += (size_t)snprintf(out + at, bytes - at, ", \"wait_ms\": %.3f, \"optimizer_ms\": %.3f, \"peak_bytes\": {",
                               m->wait_s * 1e3, m->optimizer_s * 1e3);
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT && at < bytes; c++)
        at += (size_t)snprintf(out + at, bytes - at, "%s\"%s\": %llu", c ? ", " : "",
                               shard_mem_category_name((shard_mem_category)c), (unsigned long long)m->peak_bytes[c]);
    if (at < bytes) snprintf(out + at, bytes - at, "}}");
}

shard_status cli_monitor_ranks_json(shard_comm *comm, const shard_trainer *t, char **out) {
    *out = NULL;
    int ranks = shard_comm_size(comm), rank = shard_comm_rank(comm);
    shard_step_monitor m;
    SHARD_CHECK(shard_trainer_step_monitor(t, &m));
    char mine[RANK_JSON_BYTES] = "";
    rank_json(&m, rank, mine, sizeof mine);
    char *all = malloc((size_t)ranks * RANK_JSON_BYTES);
    if (!all) return shard_error(SHARD_ERR_NO_MEMORY, "--log: out of memory");
    shard_status s = shard_comm_all_gather(comm, mine, all, RANK_JSON_BYTES, SHARD_U8);
    if (s == SHARD_OK && rank == 0) {
        size_t cap = (size_t)ranks * RANK_JSON_BYTES + 16, at = 0;
        char *text = malloc(cap);
        if (!text) s = shard_error(SHARD_ERR_NO_MEMORY, "--log: out of memory");
        if (text) {
            at += (size_t)snprintf(text, cap, "\"ranks\": [");
            for (int r = 0; r < ranks; r++) {
                const char *one = all + (size_t)r * RANK_JSON_BYTES;
                at += (size_t)snprintf(text + at, cap - at, "%s%.*s", r ? ", " : "", RANK_JSON_BYTES, one);
            }
            snprintf(text + at, cap - at, "]");
            *out = text;
        }
    }
    free(all);
    return s;
}

shard_status cli_monitor_line(shard_comm *comm, const shard_mesh *mesh, const shard_trainer *t) {
    int ranks = shard_comm_size(comm);
    shard_step_monitor m;
    SHARD_CHECK(shard_trainer_step_monitor(t, &m));
    double mine[2] = {m.compute_s, m.wait_s + exposed_s(&m)}, *all = malloc((size_t)ranks * sizeof mine);
    if (!all) return shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory");
    shard_status s = shard_comm_all_gather(comm, mine, all, 2, SHARD_F64);
    double *compute = malloc((size_t)ranks * sizeof *compute);
    if (s == SHARD_OK && !compute) s = shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory");
    if (s == SHARD_OK && shard_comm_rank(comm) == 0) {
        int slow = 0;
        double waited = 0;
        for (int r = 0; r < ranks; r++) {
            compute[r] = all[2 * r];
            if (compute[r] > compute[slow]) slow = r;
        }
        for (int r = 0; r < ranks; r++)
            if (r != slow) waited += all[2 * r + 1] / (ranks - 1);
        char where[128];
        cli_mesh_where(mesh, slow, where, sizeof where);
        printf("  imbalance %.2f; bottleneck: rank %d (%s), compute %.1f ms; others wait %.1f ms on it\n",
               shard_imbalance(compute, (size_t)ranks), slow, where, compute[slow] * 1e3, waited * 1e3);
        fflush(stdout);
    }
    free(compute);
    free(all);
    return s;
}
