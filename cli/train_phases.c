/* train_phases.c — see train_phases.h: a run's step time cut where it changed. */
#include "train_phases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

void train_phases_moved(train_phases *p, uint64_t step) {
    if (p->moves < TRAIN_PHASES_MAX) p->moved_after[p->moves++] = step;
}

/* Whether a device of the cluster differs at `step` from the step before; what changed, in words. */
static int cluster_changes_at(const shard_cluster *cluster, uint64_t step, char *what, size_t bytes) {
    int n = shard_cluster_ranks(cluster), changed = 0;
    size_t used = 0;
    what[0] = '\0';
    for (int r = 0; r < n; r++) {
        shard_cluster_device was, now;
        if (shard_cluster_device_at(cluster, r, step - 1, &was) < 0 ||
            shard_cluster_device_at(cluster, r, step, &now) < 0) {
            shard_clear_error();
            return 0;
        }
        if (was.slowdown == now.slowdown && was.memory_bytes == now.memory_bytes) continue;
        if (strstr(what, now.node)) continue; /* its node named already */
        changed = 1;
        if (used < bytes && was.slowdown != now.slowdown && now.slowdown != 1)
            used += (size_t)snprintf(what + used, bytes - used, "%snode '%s' %gx slower", used ? ", " : "", now.node,
                                     now.slowdown);
        else if (used < bytes && was.slowdown != now.slowdown)
            used += (size_t)snprintf(what + used, bytes - used, "%snode '%s' at its declared speed", used ? ", " : "",
                                     now.node);
        if (used < bytes && was.memory_bytes != now.memory_bytes)
            used += (size_t)snprintf(what + used, bytes - used, "%snode '%s' with %.2f GiB", used ? ", " : "", now.node,
                                     now.memory_bytes / 1073741824.0);
    }
    return changed;
}

void train_phases_print(const train_phases *p, const double *step_ms, uint64_t first, size_t count,
                        const char *cluster_path) {
    shard_cluster *cluster = NULL;
    if (cluster_path && shard_cluster_load(cluster_path, &cluster) < 0) shard_clear_error(), cluster = NULL;
    int changes = cluster && shard_cluster_has_changes(cluster);
    if ((p->moves || changes) && count >= 2) {
        printf("train: step time by phase (median ms):");
        uint64_t last = first + count - 1, from = first;
        char why[300] = "";
        for (uint64_t step = first + 1; step <= last + 1; step++) {
            char what[200] = "", next[300] = "";
            int moved = 0, changed = step <= last && changes && cluster_changes_at(cluster, step, what, sizeof what);
            for (size_t k = 0; k < p->moves; k++) moved |= p->moved_after[k] + 1 == step && step <= last;
            if (step <= last && !moved && !changed) continue;
            /* the phase [from, step - 1]; its first step, which pays for the change, left out when it has more */
            double median = 0;
            if (cli_median_step_ms(step_ms + (from - first), (size_t)(step - from), &median) < 0) shard_clear_error();
            printf("%s steps %llu-%llu %.1f%s", from == first ? "" : " |", (unsigned long long)from,
                   (unsigned long long)(step - 1), median, why);
            snprintf(next, sizeof next, " (%s%s%s)", what, changed && moved ? "; " : "", moved ? "after a move" : "");
            snprintf(why, sizeof why, "%s", next);
            from = step;
        }
        printf("\n");
    }
    shard_cluster_destroy(cluster);
}
