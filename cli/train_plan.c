/* train_plan.c — see train_plan.h.  A plan file is
 *
 *   {"mesh": "data=2,pipe=2", "flags": ["--mesh", "data=2,pipe=2", "--zero", "1", ...],
 *    "layers_per_stage": null | "3,1" | [3, 1], "batch_shares": null | "6,2" | [6, 2],
 *    "device_map": null | "3,0,1,2" | [3, 0, 1, 2],
 *    "predicted": {"step_ms": 12.5, "tokens_per_s": 40960, "peak_bytes": 5.2e6 | [5.2e6, ...]},
 *    "explanation": "..."}
 *
 * Its flags are train's arguments: they go through train's own layout parser (train_util.h), so a plan
 * means what the same flags on the command line mean and is refused in the same words, with the file
 * and key put first. */
#include "train_plan.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monitor.h"

static const char *const KEYS[] = {"mesh",       "flags",     "layers_per_stage", "batch_shares",
                                   "device_map", "predicted", "explanation"};
enum { KEY_COUNT = sizeof KEYS / sizeof KEYS[0] };

static const char *kind_of(const json_t *v) {
    return json_is_string(v) ? "a string"
        : json_is_integer(v) ? "an integer"
        : json_is_number(v)  ? "a number"
        : json_is_array(v)   ? "a list"
        : json_is_object(v)  ? "an object"
        : json_is_boolean(v) ? "true or false"
                             : "null";
}

static int bad(const train_plan *p, const char *key, const char *want, const json_t *got) {
    cli_error("%s: key '%s' must be %s, not %s", p->path, key, want, kind_of(got));
    return -1;
}

/* key's value, null, a string or a list of integers of at least 0, as text ("3,1") in out ("" for null
 * or an absent key). */
static int list_text(const train_plan *p, const json_t *root, const char *key, const char *want, char *out,
                     size_t bytes) {
    const json_t *v = json_object_get(root, key);
    size_t at = 0;
    out[0] = '\0';
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (!json_string_value(v)[0]) return bad(p, key, want, json_null());
        at = (size_t)snprintf(out, bytes, "%s", json_string_value(v));
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        size_t i;
        const json_t *item;
        json_array_foreach(v, i, item) {
            if (!json_is_integer(item) || json_integer_value(item) < 0) {
                cli_error("%s: key '%s': item %zu is %s: give whole numbers of 0 or more, e.g. [3, 1]", p->path, key, i,
                          json_is_integer(item) ? "negative" : kind_of(item));
                return -1;
            }
            at += (size_t)snprintf(out + (at < bytes ? at : bytes), at < bytes ? bytes - at : 0, "%s%lld", i ? "," : "",
                                   (long long)json_integer_value(item));
        }
    } else {
        return bad(p, key, want, v);
    }
    if (at >= bytes) {
        cli_error("%s: key '%s' is longer than %zu characters: give a shorter list", p->path, key, bytes - 1);
        return -1;
    }
    return 0;
}

/* Every argument of args (argv's form) taken by train's layout parser into l, its messages put after
 * context; one that is not a layout flag refused naming them. */
static int parse_flags(const char *context, int count, char **args, cli_layout *l) {
    cli_error_context(context);
    int rc = 0;
    for (int i = 0; i < count && rc == 0; i++) {
        int taken = cli_layout_option(l, count, args, &i);
        if (taken < 0) rc = -1;
        if (taken == 0) {
            char names[512];
            cli_layout_flag_names(names, sizeof names);
            cli_error("'%s' is not one of shard train's layout flags: give %s", args[i], names);
            rc = -1;
        }
    }
    cli_error_context(NULL);
    return rc;
}

/* A key that is also a flag (mesh: --mesh), taken into the plan's layout: refused when its flags say
 * otherwise. */
static int key_flag(train_plan *p, const char *key, const char *flag, const char *value) {
    if (!value || !value[0]) return 0;
    char context[1200], mine[4200], theirs[4200];
    char *args[2] = {(char *)flag, (char *)value};
    cli_layout one = CLI_LAYOUT_DEFAULTS;
    snprintf(context, sizeof context, "%s: key '%s': ", p->path, key);
    if (parse_flags(context, 2, args, &one)) return -1;
    if (!cli_layout_merge(&p->layout, &one, 0, mine, theirs, sizeof mine)) {
        cli_error("%s: key '%s' gives %s and key 'flags' %s: give one of them, or the same in both", p->path, key,
                  theirs, mine);
        return -1;
    }
    return 0;
}

static int load_predicted(train_plan *p, const json_t *pred) {
    if (!pred || json_is_null(pred)) return 0;
    if (!json_is_object(pred)) return bad(p, "predicted", "an object {\"step_ms\", \"peak_bytes\", ...}", pred);
    const json_t *step = json_object_get(pred, "step_ms"), *peak = json_object_get(pred, "peak_bytes");
    if (step && !json_is_null(step)) {
        if (!json_is_number(step) || !(json_number_value(step) > 0))
            return bad(p, "predicted.step_ms", "a number of milliseconds above 0", step);
        p->step_ms = json_number_value(step);
    }
    if (!peak || json_is_null(peak)) return 0;
    size_t n = json_is_array(peak) ? json_array_size(peak) : 1;
    if ((!json_is_number(peak) && !json_is_array(peak)) || n == 0)
        return bad(p, "predicted.peak_bytes", "a number (the fullest rank's) or a list of one per rank", peak);
    if (json_is_array(peak) && n != (size_t)p->ranks) {
        cli_error("%s: key 'predicted.peak_bytes' lists %zu ranks' bytes for the %d ranks of mesh %s: give one "
                  "number (the fullest rank's) or one per rank",
                  p->path, n, p->ranks, p->layout.mesh);
        return -1;
    }
    if (!(p->peak_bytes = calloc(n, sizeof *p->peak_bytes))) {
        cli_error("%s: out of memory", p->path);
        return -1;
    }
    p->peaks = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_is_array(peak) ? json_array_get(peak, i) : peak;
        if (!json_is_number(v) || json_number_value(v) < 0) {
            cli_error("%s: key 'predicted.peak_bytes': %s%zu is %s: give bytes, a number of 0 or more", p->path,
                      json_is_array(peak) ? "item " : "the value ", i, json_is_number(v) ? "negative" : kind_of(v));
            return -1;
        }
        p->peak_bytes[i] = json_number_value(v);
    }
    return 0;
}

static int load(train_plan *p, json_t *root) {
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int known = 0;
        for (int k = 0; k < KEY_COUNT; k++) known |= strcmp(key, KEYS[k]) == 0;
        if (!known) {
            const char *near = shard_text_nearest(key, KEYS, KEY_COUNT);
            cli_error("%s: key '%s' is not a plan's%s%s%s: give mesh, flags, layers_per_stage, batch_shares, "
                      "device_map, predicted, explanation",
                      p->path, key, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
            return -1;
        }
    }
    const json_t *mesh = json_object_get(root, "mesh"), *flags = json_object_get(root, "flags");
    if (!mesh) {
        cli_error("%s: key 'mesh' is missing: give the mesh as a string, e.g. \"data=2,pipe=2\"", p->path);
        return -1;
    }
    if (!json_is_string(mesh) || !json_string_value(mesh)[0])
        return bad(p, "mesh", "the mesh as a string, e.g. \"data=2,pipe=2\"", mesh);
    if (flags && !json_is_null(flags) && !json_is_array(flags))
        return bad(p, "flags", "a list of shard train's layout flags, e.g. [\"--zero\", \"1\"]", flags);
    size_t n = json_array_size(flags), i;
    char **args = calloc(n + 1, sizeof *args), context[1200];
    if (!args) return cli_error("%s: out of memory", p->path), -1;
    const json_t *item;
    json_array_foreach(flags, i, item) {
        if (!json_is_string(item)) {
            cli_error("%s: key 'flags': item %zu is %s: give shard train's layout flags and their values as "
                      "strings, e.g. [\"--zero\", \"1\"]",
                      p->path, i, kind_of(item));
            free(args);
            return -1;
        }
        args[i] = (char *)json_string_value(item);
    }
    snprintf(context, sizeof context, "%s: key 'flags': ", p->path);
    int rc = parse_flags(context, (int)n, args, &p->layout);
    free(args);
    if (rc == 0 && cli_layout_check_names(&p->layout) < 0) {
        cli_error("%s%s", context, shard_last_error());
        return -1;
    }
    static const char *const want = "null, a string such as \"3,1\" or a list such as [3, 1]";
    if (rc || list_text(p, root, "layers_per_stage", want, p->layers, sizeof p->layers) ||
        list_text(p, root, "batch_shares", want, p->shares, sizeof p->shares) ||
        list_text(p, root, "device_map", want, p->device_map, sizeof p->device_map) ||
        key_flag(p, "mesh", "--mesh", json_string_value(mesh)) ||
        key_flag(p, "layers_per_stage", "--layers-per-stage", p->layers) ||
        key_flag(p, "batch_shares", "--batch-shares", p->shares))
        return -1;
    int sizes[SHARD_MESH_MAX_AXES], axes = shard_mesh_parse(p->layout.mesh, 0, NULL, sizes);
    if (axes < 0) {
        cli_error("%s: key 'mesh': %s", p->path, shard_last_error());
        return -1;
    }
    long ranks = 1;
    for (int a = 0; a < axes; a++) ranks *= sizes[a];
    if (ranks > 4096) {
        cli_error("%s: key 'mesh': %s spans %ld ranks, more than the 4096 train runs", p->path, p->layout.mesh, ranks);
        return -1;
    }
    p->ranks = (int)ranks;
    return load_predicted(p, json_object_get(root, "predicted"));
}

int train_plan_load(const char *path, train_plan *p) {
    *p = (train_plan){.path = path, .layout = CLI_LAYOUT_DEFAULTS};
    char *text = NULL;
    if (shard_file_read(path, "cannot read the plan", 16u << 20, &text, NULL) < 0) {
        cli_error("--plan %s", shard_last_error());
        return -1;
    }
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    free(text);
    if (!root) {
        cli_error("%s: not JSON: %s at line %d, column %d: give a file `shard plan --out` wrote", path, err.text,
                  err.line, err.column);
        return -1;
    }
    p->root = root;
    if (!json_is_object(root)) {
        cli_error("%s: the top level must be an object {\"mesh\", \"flags\", ...}, not %s", path, kind_of(root));
        return -1;
    }
    return load(p, root);
}

/* a and b the same but for blanks ("3, 0,1" and "3,0,1"). */
static int same_list(const char *a, const char *b) {
    for (;; a++, b++) {
        while (isspace((unsigned char)*a)) a++;
        while (isspace((unsigned char)*b)) b++;
        if (*a != *b) return 0;
        if (!*a) return 1;
    }
}

int train_plan_apply(train_plan *p, cli_layout *l, cli_common *common) {
    char mine[4200], theirs[4200];
    if (!cli_layout_merge(l, &p->layout, 1, mine, theirs, sizeof mine)) {
        if (strncmp(theirs, "no ", 3) == 0)
            cli_error("train: %s disagrees with the plan, which gives %s (%s)", mine, theirs, p->path);
        else
            cli_error("train: %s disagrees with the plan's %s (%s)", mine, theirs, p->path);
        return -1;
    }
    if (common->ranks > 0 && common->ranks != p->ranks) {
        cli_error("train: --ranks %d disagrees with the plan's mesh %s of %d ranks (%s): leave --ranks out",
                  common->ranks, p->layout.mesh, p->ranks, p->path);
        return -1;
    }
    if (common->device_map && p->device_map[0] && !same_list(common->device_map, p->device_map)) {
        cli_error("train: --device-map %s disagrees with the plan's device_map %s (%s)", common->device_map,
                  p->device_map, p->path);
        return -1;
    }
    if (!common->device_map && p->device_map[0] && common->cluster) common->device_map = p->device_map;
    return 0;
}

/* One row of the comparison: what, the two figures (predicted 0: not given), and a note. */
static void row(const char *what, double predicted, double measured, const char *note) {
    char p[32] = "-", ratio[32] = "-";
    if (predicted > 0) {
        snprintf(p, sizeof p, "%.2f", predicted);
        snprintf(ratio, sizeof ratio, "%.2f", measured / predicted);
    }
    printf("  %-36s %10s %10.2f %21s%s%s\n", what, p, measured, ratio, note[0] ? "   " : "", note);
}

void train_plan_report(const train_plan *p, const shard_mesh *mesh, const double *step_ms, size_t steps,
                       const double *peak_bytes, int world) {
    const double M = 1048576.0;
    char note[128], what[96], where[64];
    printf("train: the plan %s against this run:\n  %-36s %10s %10s %21s\n", p->path, "", "predicted", "measured",
           "measured / predicted");
    size_t skip = steps > 1 ? 1 : 0, n = steps - skip; /* the first step warms up: left out */
    double median = 0;
    if (n && cli_median_step_ms(step_ms, steps, &median) == SHARD_OK) {
        snprintf(note, sizeof note, "the median of steps %zu-%zu", skip + 1, steps);
        row("step ms", p->step_ms, median, n > 1 ? note : "one step");
    }
    if (p->peaks == 1) { /* the fullest rank's prediction, against the fullest rank measured */
        int full = 0;
        for (int r = 1; r < world; r++)
            if (peak_bytes[r] > peak_bytes[full]) full = r;
        cli_mesh_where(mesh, full, where, sizeof where);
        snprintf(note, sizeof note, "measured on rank %d (%s)", full, where);
        row("peak MiB of the fullest rank", p->peak_bytes[0] / M, peak_bytes[full] / M, note);
    }
    for (int r = 0; p->peaks > 1 && r < world; r++) {
        cli_mesh_where(mesh, r, where, sizeof where);
        snprintf(what, sizeof what, "peak MiB of rank %d (%s)", r, where);
        row(what, p->peak_bytes[r] / M, peak_bytes[r] / M, "");
    }
}

void train_plan_free(train_plan *p) {
    json_decref(p->root);
    free(p->peak_bytes);
    p->root = NULL, p->peak_bytes = NULL, p->peaks = 0;
}
