/* analyze_measure.c — see analyze.h (shard_analysis_measure): a `shard train --log` file's expert bytes
 * beside the analysis's bound.
 *
 * Each line of the log is one step's JSON object whose `ranks` list holds, per rank, `all_to_all_bytes`:
 * {COMMUNICATOR: bytes} of the step's all_to_all(v) calls.  A rank's measured figure is the median over
 * the steps of its `expert` entry (0 when the step used no expert communicator): the first step of a
 * run, or one after a resume, may differ from the rest, and the median keeps such steps from moving it.
 * Event records (an `event` key: the run's summary) are not steps and are passed over.  The experts'
 * activations are not counted apart in a run, so their measured figure is derived: the balanced figure
 * plus what the rank's median activation peak (`peak_bytes`' `activations`) differs from the dry
 * run's, the rest of the activations being the same in both. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard/analyze.h"
#include "shard/files.h"

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Line `line`'s expert bytes and activation peak of every rank into got[2 rank] and got[2 rank + 1]
 * (the peak NAN where the line has none); *event set when the line is an event record (the run's
 * summary, ...), not a step. */
static shard_status take_line(const char *path, size_t line, const char *text, size_t world, double *got, int *event) {
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    json_t *ranks = json_is_object(root) ? json_object_get(root, "ranks") : NULL;
    shard_status s = SHARD_OK;
    *event = json_is_object(root) && json_object_get(root, "event");
    if (!json_is_object(root))
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "analyze --measured %s line %zu: not a JSON object (%s): give the "
                        "file `shard train --log` wrote",
                        path, line, root ? "another JSON value" : err.text);
    else if (!*event && (!json_is_array(ranks) || json_array_size(ranks) != world))
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "analyze --measured %s line %zu: %s, but the layout has %zu ranks: give the log of a "
                        "`shard train --log` run of this layout",
                        path, line, json_is_array(ranks) ? "a 'ranks' list of another size" : "no 'ranks' list", world);
    for (size_t i = 0; s == SHARD_OK && !*event && i < world; i++) {
        json_t *r = json_array_get(ranks, i), *rank = json_object_get(r, "rank");
        json_t *bytes = json_object_get(r, "all_to_all_bytes"), *expert = json_object_get(bytes, "expert");
        if (!json_is_integer(rank) || json_integer_value(rank) < 0 || (size_t)json_integer_value(rank) >= world ||
            !json_is_object(bytes) || (expert && !json_is_integer(expert)))
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "analyze --measured %s line %zu: entry %zu of 'ranks' has no rank of 0..%zu with an "
                            "'all_to_all_bytes' object of byte counts (a log of a `shard train` that records them)",
                            path, line, i, world - 1);
        else {
            json_t *act = json_object_get(json_object_get(r, "peak_bytes"), "activations");
            got[2 * json_integer_value(rank)] = expert ? (double)json_integer_value(expert) : 0;
            got[2 * json_integer_value(rank) + 1] = json_is_number(act) ? json_number_value(act) : NAN;
        }
    }
    json_decref(root);
    return s;
}

/* The median over the steps of rank r's figure k (NAN when a step lacks it); column: steps of scratch. */
static double median_of(const double *all, size_t steps, size_t world, size_t r, int k, double *column) {
    for (size_t i = 0; i < steps; i++) {
        column[i] = all[(i * world + r) * 2 + (size_t)k];
        if (isnan(column[i])) return NAN;
    }
    qsort(column, steps, sizeof *column, by_value);
    return steps % 2 ? column[steps / 2] : (column[steps / 2 - 1] + column[steps / 2]) / 2;
}

shard_status shard_analysis_measure(shard_analysis *a, const char *log_path) {
    if (!a || !log_path) return shard_error(SHARD_ERR_INVALID_ARG, "analyze --measured: no analysis or no log");
    char *text = NULL;
    SHARD_CHECK(shard_file_read(log_path, "cannot read the training log", 0, &text, NULL));
    size_t world = a->ranks, steps = 0, cap = 0, line = 0;
    double *all = NULL; /* [steps][world][2]: expert bytes, activation peak */
    shard_status s = SHARD_OK;
    for (char *at = text, *end; s == SHARD_OK && *at; at = end) {
        end = strchr(at, '\n');
        end = end ? end + 1 : at + strlen(at);
        line++;
        if (end[-1] == '\n') end[-1] = '\0';
        if (strspn(at, " \t\r") == strlen(at)) continue; /* a blank line */
        if (steps == cap) {
            double *more = realloc(all, (cap = cap ? 2 * cap : 64) * 2 * world * sizeof *more);
            if (!more) {
                s = shard_error(SHARD_ERR_NO_MEMORY, "analyze --measured %s: out of memory", log_path);
                break;
            }
            all = more;
        }
        int event = 0;
        s = take_line(log_path, line, at, world, all + 2 * steps * world, &event);
        steps += !event;
    }
    if (s == SHARD_OK && !steps)
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "analyze --measured %s: no step in it: give the log of a `shard train --log` run", log_path);
    double *column = s == SHARD_OK ? malloc(steps * sizeof *column) : NULL;
    if (s == SHARD_OK && !column)
        s = shard_error(SHARD_ERR_NO_MEMORY, "analyze --measured %s: out of memory", log_path);
    for (size_t r = 0; s == SHARD_OK && r < world; r++) {
        shard_rank_analysis *x = &a->rank[r];
        x->expert_bytes_measured = median_of(all, steps, world, r, 0, column);
        /* the experts' activations: the balanced figure moved by what the run's activation peak differs
         * from the dry run's (the rest of the activations are exact, so the difference is the routing's) */
        double peak = median_of(all, steps, world, r, 1, column);
        double act = (double)x->expert_activation_bytes + peak - (double)x->memory_bytes[SHARD_MEM_ACTIVATIONS];
        x->expert_activation_bytes_measured = isnan(peak) || !x->expert_activation_bytes ? -1 : act > 0 ? act : 0;
    }
    if (s == SHARD_OK) a->measured_steps = steps;
    free(column);
    free(all);
    free(text);
    return s;
}
