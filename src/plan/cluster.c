/* cluster.c — see cluster.h: a cluster description read from JSON (jansson), the device of each rank (at
 * any step, its node's changes applied) and the link between two ranks.  The emulation that uses it
 * lives in src/comm/emulate.c. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard/files.h"
#include "shard/cluster.h"
#include "cluster_impl.h"

typedef struct cluster_link {
    double alpha_seconds, beta_bytes_per_second;
} cluster_link;

/* One entry of a node's "changes": from step at_step on, slowdown or memory_bytes (the other is 0). */
typedef struct cluster_change {
    uint64_t at_step;
    double slowdown, memory_bytes;
} cluster_change;

typedef struct cluster_node {
    char *name;
    int devices, first; /* its devices are first .. first + devices - 1 */
    double tflops, memory_bytes;
    cluster_change *changes; /* by at_step */
    int change_count;
} cluster_node;

typedef struct link_override {
    int from, to; /* node indices */
    cluster_link link;
} link_override;

struct shard_cluster {
    char where[256];
    cluster_node *nodes;
    int node_count, devices;
    cluster_link network, intra;
    link_override *links;
    int link_count;
    int *map; /* rank -> device; NULL: in order */
    int map_length;
    double *device_tflops; /* per device, measured rates in place of the nodes' (NULL: the nodes') */
};

enum { MOST_NODES = 4096, MOST_DEVICES = 1 << 16, MOST_CHANGES = 4096 };
static const double LAST_STEP = 1e15; /* at_step's bound: whole numbers a double holds exactly */

void shard_cluster_destroy(shard_cluster *c) {
    if (!c) return;
    for (int i = 0; i < c->node_count; i++) free(c->nodes[i].name), free(c->nodes[i].changes);
    free(c->nodes);
    free(c->links);
    free(c->map);
    free(c->device_tflops);
    free(c);
}

/* A number under `key` of `obj` in (lo, hi] (lo itself allowed when lo_ok). */
static shard_status get_number(const shard_cluster *c, json_t *obj, const char *at, const char *key, double lo,
                               int lo_ok, double hi, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v)
        return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %s has no \"%s\" (give a number in %s%g, %g])", c->where,
                           at, key, lo_ok ? "[" : "(", lo, hi);
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!isfinite(x) || x < lo || (!lo_ok && x == lo) || x > hi)
        return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %s \"%s\" is %s: give a number in %s%g, %g]", c->where,
                           at, key, json_is_number(v) ? "out of range" : "not a number", lo_ok ? "[" : "(", lo, hi);
    *out = x;
    return SHARD_OK;
}

static shard_status check_keys(const shard_cluster *c, json_t *obj, const char *at, const char *const *keys, size_t n) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        size_t k = 0;
        while (k < n && strcmp(key, keys[k]) != 0) k++;
        if (k == n) {
            char valid[256] = "";
            for (size_t j = 0; j < n; j++)
                snprintf(valid + strlen(valid), sizeof valid - strlen(valid), "%s%s", j ? ", " : "", keys[j]);
            return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %s has an unknown key \"%s\": valid keys are %s",
                               c->where, at, key, valid);
        }
    }
    return SHARD_OK;
}

/* {bandwidth_gbps, latency_us} (and from/to in a links entry) */
static shard_status get_link(const shard_cluster *c, json_t *obj, const char *at, int with_ends, cluster_link *out) {
    static const char *const keys[] = {"bandwidth_gbps", "latency_us", "from", "to"};
    if (!json_is_object(obj))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "cluster %s: %s is %s: give an object {\"bandwidth_gbps\": G, \"latency_us\": U}", c->where,
                           at, obj ? "not an object" : "missing");
    SHARD_CHECK(check_keys(c, obj, at, keys, with_ends ? 4 : 2));
    double gbps, us;
    SHARD_CHECK(get_number(c, obj, at, "bandwidth_gbps", 0, 0, 1e9, &gbps));
    SHARD_CHECK(get_number(c, obj, at, "latency_us", 0, 1, 1e9, &us));
    out->alpha_seconds = us * 1e-6;
    out->beta_bytes_per_second = gbps * 1e9 / 8;
    return SHARD_OK;
}

static int find_node(const shard_cluster *c, const char *name) {
    for (int i = 0; i < c->node_count; i++)
        if (strcmp(c->nodes[i].name, name) == 0) return i;
    return -1;
}

static int change_order(const void *a, const void *b) {
    const cluster_change *x = a, *y = b;
    if (x->at_step != y->at_step) return x->at_step < y->at_step ? -1 : 1;
    return (x->slowdown > 0) - (y->slowdown > 0); /* a memory change first, then a slowdown */
}

/* A node's optional "changes": [{"at_step", "slowdown"} or {"at_step", "available_memory_gb"}, ...]. */
static shard_status parse_changes(const shard_cluster *c, json_t *list, const char *node_at, cluster_node *node) {
    static const char *const keys[] = {"at_step", "slowdown", "available_memory_gb"};
    static const char *const valid = "give a list of {\"at_step\": N, \"slowdown\": X} or {\"at_step\": N, "
                                     "\"available_memory_gb\": G} entries";
    if (!list) return SHARD_OK;
    if (!json_is_array(list) || json_array_size(list) > MOST_CHANGES)
        return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %s \"changes\" is %s: %s (at most %d)", c->where,
                           node_at, json_is_array(list) ? "too long" : "not a list", valid, MOST_CHANGES);
    if (json_array_size(list) == 0) return SHARD_OK;
    node->changes = calloc(json_array_size(list), sizeof *node->changes);
    if (!node->changes) return shard_error(SHARD_ERR_NO_MEMORY, "cluster %s: out of memory", c->where);
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        char at[128];
        snprintf(at, sizeof at, "%s changes[%zu]", node_at, i);
        if (!json_is_object(e))
            return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %s is not an object: %s", c->where, at, valid);
        SHARD_CHECK(check_keys(c, e, at, keys, 3));
        int slows = json_object_get(e, "slowdown") != NULL, sizes = json_object_get(e, "available_memory_gb") != NULL;
        if (slows == sizes)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "cluster %s: %s gives %s of \"slowdown\" and \"available_memory_gb\": give exactly "
                               "one per entry (two changes at one step: two entries)",
                               c->where, at, slows ? "both" : "neither");
        cluster_change *ch = &node->changes[node->change_count];
        double step, value;
        SHARD_CHECK(get_number(c, e, at, "at_step", 1, 1, LAST_STEP, &step));
        if (step != floor(step))
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "cluster %s: %s \"at_step\" %g is not a whole number: give a step >= 1 (steps count "
                               "from 1)",
                               c->where, at, step);
        SHARD_CHECK(get_number(c, e, at, slows ? "slowdown" : "available_memory_gb", 0, 0, slows ? 1e6 : 1e9, &value));
        ch->at_step = (uint64_t)step;
        if (slows)
            ch->slowdown = value;
        else
            ch->memory_bytes = value * (double)(1u << 30);
        for (int k = 0; k < node->change_count; k++)
            if (node->changes[k].at_step == ch->at_step && (node->changes[k].slowdown > 0) == slows)
                return shard_error(SHARD_ERR_INVALID_ARG,
                                   "cluster %s: %s sets \"%s\" at step %llu, as an earlier entry does: give one "
                                   "value per step",
                                   c->where, at, slows ? "slowdown" : "available_memory_gb",
                                   (unsigned long long)ch->at_step);
        node->change_count++;
    }
    qsort(node->changes, (size_t)node->change_count, sizeof *node->changes, change_order);
    return SHARD_OK;
}

static shard_status parse_nodes(shard_cluster *c, json_t *nodes) {
    if (!json_is_array(nodes) || json_array_size(nodes) == 0 || json_array_size(nodes) > MOST_NODES)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "cluster %s: \"nodes\" is %s: give a list of 1..%d nodes {\"name\", \"devices\", "
                           "\"compute_tflops\", \"available_memory_gb\"}",
                           c->where,
                           !nodes                     ? "missing"
                               : json_is_array(nodes) ? "empty or too long"
                                                      : "not a list",
                           MOST_NODES);
    static const char *const keys[] = {"name", "devices", "compute_tflops", "available_memory_gb", "changes"};
    c->nodes = calloc(json_array_size(nodes), sizeof *c->nodes);
    if (!c->nodes) return shard_error(SHARD_ERR_NO_MEMORY, "cluster %s: out of memory", c->where);
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        char at[64];
        snprintf(at, sizeof at, "nodes[%zu]", i);
        if (!json_is_object(n))
            return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %s is not an object", c->where, at);
        SHARD_CHECK(check_keys(c, n, at, keys, 5));
        const char *name = json_string_value(json_object_get(n, "name"));
        if (!name || !name[0] || strlen(name) > 63)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "cluster %s: %s \"name\" is missing or not a string of 1..63 characters", c->where, at);
        if (find_node(c, name) >= 0)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "cluster %s: %s \"name\" \"%s\" names an earlier node too: give each "
                               "node its own name",
                               c->where, at, name);
        cluster_node *node = &c->nodes[c->node_count];
        double devices;
        SHARD_CHECK(get_number(c, n, at, "devices", 1, 1, 4096, &devices));
        if (devices != floor(devices))
            return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %s \"devices\" %g is not a whole number", c->where,
                               at, devices);
        SHARD_CHECK(get_number(c, n, at, "compute_tflops", 0, 0, 1e9, &node->tflops));
        double gb;
        SHARD_CHECK(get_number(c, n, at, "available_memory_gb", 0, 0, 1e9, &gb));
        node->memory_bytes = gb * (double)(1u << 30);
        char node_at[128];
        snprintf(node_at, sizeof node_at, "%s ('%s')", at, name);
        shard_status s = parse_changes(c, json_object_get(n, "changes"), node_at, node);
        if (s < 0) { /* the node is not counted yet: its changes are freed here */
            free(node->changes), node->changes = NULL;
            return s;
        }
        node->devices = (int)devices;
        node->first = c->devices;
        if (c->devices + node->devices > MOST_DEVICES)
            return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: more than %d devices", c->where, MOST_DEVICES);
        c->devices += node->devices;
        if (!(node->name = strdup(name)))
            return shard_error(SHARD_ERR_NO_MEMORY, "cluster %s: out of memory", c->where);
        c->node_count++;
    }
    return SHARD_OK;
}

static shard_status parse_links(shard_cluster *c, json_t *links) {
    if (!links) return SHARD_OK;
    if (!json_is_array(links))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "cluster %s: \"links\" is not a list: give [{\"from\", \"to\", \"bandwidth_gbps\", "
                           "\"latency_us\"}, ...]",
                           c->where);
    c->links = calloc(json_array_size(links) + 1, sizeof *c->links);
    if (!c->links) return shard_error(SHARD_ERR_NO_MEMORY, "cluster %s: out of memory", c->where);
    size_t i;
    json_t *l;
    json_array_foreach(links, i, l) {
        char at[64];
        snprintf(at, sizeof at, "links[%zu]", i);
        link_override *o = &c->links[c->link_count];
        SHARD_CHECK(get_link(c, l, at, 1, &o->link));
        const char *ends[2] = {json_string_value(json_object_get(l, "from")),
                               json_string_value(json_object_get(l, "to"))};
        int *idx[2] = {&o->from, &o->to};
        for (int e = 0; e < 2; e++) {
            *idx[e] = ends[e] ? find_node(c, ends[e]) : -1;
            if (*idx[e] < 0) {
                char names[512] = "";
                for (int k = 0; k < c->node_count && strlen(names) < 400; k++)
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                             c->nodes[k].name);
                return shard_error(SHARD_ERR_INVALID_ARG,
                                   "cluster %s: %s \"%s\" %s%s%s: give one of the nodes' names (%s)", c->where, at,
                                   e ? "to" : "from", ends[e] ? "\"" : "is missing or not a string",
                                   ends[e] ? ends[e] : "", ends[e] ? "\" is no node's name" : "", names);
            }
        }
        c->link_count++;
    }
    return SHARD_OK;
}

shard_status shard_cluster_parse(const char *json_text, const char *where, shard_cluster **out) {
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_cluster_parse: out is NULL");
    *out = NULL;
    shard_cluster *c = calloc(1, sizeof *c);
    if (!c) return shard_error(SHARD_ERR_NO_MEMORY, "cluster: out of memory");
    snprintf(c->where, sizeof c->where, "%s", where ? where : "description");
    json_error_t jerr;
    json_t *root = json_text ? json_loads(json_text, 0, &jerr) : NULL;
    shard_status s = SHARD_OK;
    if (!root) {
        s = shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: not JSON: %s at line %d, column %d", c->where,
                        json_text ? jerr.text : "no text", json_text ? jerr.line : 0, json_text ? jerr.column : 0);
        goto done;
    }
    static const char *const keys[] = {"nodes", "network", "intra_node", "links"};
    if (!json_is_object(root)) {
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "cluster %s: the top level is not an object {\"nodes\", \"network\", ...}", c->where);
        goto done;
    }
    SHARD_CHECK_GOTO(check_keys(c, root, "the top level", keys, 4), s, done);
    SHARD_CHECK_GOTO(parse_nodes(c, json_object_get(root, "nodes")), s, done);
    SHARD_CHECK_GOTO(get_link(c, json_object_get(root, "network"), "\"network\"", 0, &c->network), s, done);
    SHARD_CHECK_GOTO(get_link(c, json_object_get(root, "intra_node"), "\"intra_node\"", 0, &c->intra), s, done);
    SHARD_CHECK_GOTO(parse_links(c, json_object_get(root, "links")), s, done);
done:
    json_decref(root);
    if (s < 0)
        shard_cluster_destroy(c);
    else
        *out = c;
    return s;
}

shard_status shard_cluster_load(const char *path, shard_cluster **out) {
    if (!path || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_cluster_load: path and out must not be NULL");
    char *text = NULL;
    SHARD_CHECK(shard_file_read(path, "cannot read the cluster description", 16u << 20, &text, NULL));
    shard_status s = shard_cluster_parse(text, path, out);
    free(text);
    return s;
}

shard_status shard_cluster_set_device_map(shard_cluster *c, const char *map) {
    if (!c) return shard_error(SHARD_ERR_INVALID_ARG, "shard_cluster_set_device_map: cluster is NULL");
    free(c->map);
    c->map = NULL, c->map_length = 0;
    if (!map || !map[0]) return SHARD_OK;
    int *m = malloc(sizeof *m * (size_t)c->devices), n = 0;
    char *seen = calloc((size_t)c->devices, 1);
    shard_status s = SHARD_OK;
    if (!m || !seen) {
        s = shard_error(SHARD_ERR_NO_MEMORY, "--device-map: out of memory");
        goto done;
    }
    for (const char *p = map;;) {
        char *end = NULL;
        long d = (*p >= '0' && *p <= '9') ? strtol(p, &end, 10) : -1;
        if (d < 0 || !end || (*end && *end != ',') || d >= c->devices || n >= c->devices || seen[d]) {
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "--device-map '%s': entry %d %s: give distinct device numbers 0..%d separated by commas "
                            "(the cluster %s has %d devices), e.g. 1,0",
                            map, n + 1,
                            d < 0 || !end || (*end && *end != ',') ? "is not a device number"
                                : d >= c->devices                  ? "is past the last device"
                                : n >= c->devices                  ? "is one more than there are devices"
                                                                   : "names a device given before",
                            c->devices - 1, c->where, c->devices);
            goto done;
        }
        seen[d] = 1, m[n++] = (int)d;
        if (!*end) break;
        p = end + 1;
    }
    c->map = m, c->map_length = n, m = NULL;
done:
    free(m);
    free(seen);
    return s;
}

shard_status shard_cluster_set_device_map_array(shard_cluster *c, const size_t *map, size_t n) {
    if (!c || (n && !map))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_cluster_set_device_map_array: cluster or map is NULL");
    if (n > (size_t)c->devices)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "device map of %zu entries: the cluster %s has %d devices; give at most that many", n,
                           c->where, c->devices);
    int *m = n ? malloc(sizeof *m * n) : NULL;
    char *seen = n ? calloc((size_t)c->devices, 1) : NULL;
    if (n && (!m || !seen)) {
        free(m), free(seen);
        return shard_error(SHARD_ERR_NO_MEMORY, "device map: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (map[i] >= (size_t)c->devices || seen[map[i]]) {
            shard_status s = shard_error(
                SHARD_ERR_INVALID_ARG,
                "device map entry %zu (device %zu) %s: give distinct device numbers "
                "0..%d (the cluster %s has %d devices)",
                i, map[i], map[i] >= (size_t)c->devices ? "is past the last device" : "names a device given before",
                c->devices - 1, c->where, c->devices);
            free(m), free(seen);
            return s;
        }
        seen[map[i]] = 1, m[i] = (int)map[i];
    }
    free(seen);
    free(c->map);
    c->map = m, c->map_length = (int)n;
    return SHARD_OK;
}

shard_status shard_cluster_copy(const shard_cluster *c, shard_cluster **out) {
    if (!c || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_cluster_copy: cluster or out is NULL");
    *out = NULL;
    shard_cluster *d = calloc(1, sizeof *d);
    if (!d) return shard_error(SHARD_ERR_NO_MEMORY, "cluster: out of memory");
    *d = *c;
    d->nodes = calloc((size_t)c->node_count, sizeof *d->nodes);
    d->links = c->links ? calloc((size_t)c->link_count + 1, sizeof *d->links) : NULL;
    d->map = c->map ? malloc(sizeof *d->map * (size_t)c->map_length + 1) : NULL;
    d->device_tflops = c->device_tflops ? malloc(sizeof *d->device_tflops * (size_t)c->devices) : NULL;
    d->node_count = 0;
    int ok = d->nodes && (!c->links || d->links) && (!c->map || d->map) && (!c->device_tflops || d->device_tflops);
    for (int i = 0; ok && i < c->node_count; i++, d->node_count++) {
        const cluster_node *from = &c->nodes[i];
        cluster_node *to = &d->nodes[i];
        *to = *from;
        to->changes = NULL;
        ok = (to->name = strdup(from->name)) != NULL;
        if (ok && from->change_count) {
            to->changes = malloc(sizeof *to->changes * (size_t)from->change_count);
            ok = to->changes != NULL;
            if (ok) memcpy(to->changes, from->changes, sizeof *to->changes * (size_t)from->change_count);
        }
    }
    if (!ok) {
        shard_cluster_destroy(d);
        return shard_error(SHARD_ERR_NO_MEMORY, "cluster %s: out of memory for a copy", c->where);
    }
    if (c->links) memcpy(d->links, c->links, sizeof *d->links * (size_t)c->link_count);
    if (c->map) memcpy(d->map, c->map, sizeof *d->map * (size_t)c->map_length);
    if (c->device_tflops) memcpy(d->device_tflops, c->device_tflops, sizeof *d->device_tflops * (size_t)c->devices);
    *out = d;
    return SHARD_OK;
}

shard_status shard_cluster_set_device_tflops(shard_cluster *c, const double *tflops, size_t n) {
    if (!c || (n && !tflops))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_cluster_set_device_tflops: cluster or tflops is NULL");
    if (n && n != (size_t)c->devices)
        return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: %zu device rates for its %d devices: give one each",
                           c->where, n, c->devices);
    for (size_t i = 0; i < n; i++)
        if (!(tflops[i] > 0) || !isfinite(tflops[i]))
            return shard_error(SHARD_ERR_INVALID_ARG, "cluster %s: device %zu's rate %g TFLOP/s: give a rate above 0",
                               c->where, i, tflops[i]);
    double *rates = n ? malloc(sizeof *rates * n) : NULL;
    if (n && !rates) return shard_error(SHARD_ERR_NO_MEMORY, "cluster %s: out of memory", c->where);
    if (n) memcpy(rates, tflops, sizeof *rates * n);
    free(c->device_tflops);
    c->device_tflops = rates;
    return SHARD_OK;
}

int shard_cluster_devices(const shard_cluster *c) { return c ? c->devices : 0; }

int shard_cluster_ranks(const shard_cluster *c) { return !c ? 0 : c->map ? c->map_length : c->devices; }

static shard_status device_of(const shard_cluster *c, int rank, int *device, int *node) {
    if (!c) return shard_error(SHARD_ERR_INVALID_ARG, "cluster: NULL");
    if (rank < 0 || rank >= shard_cluster_ranks(c))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "rank %d has no device: the cluster %s holds %d rank%s (%d devices%s); give fewer ranks, "
                           "more devices, or a longer --device-map",
                           rank, c->where, shard_cluster_ranks(c), shard_cluster_ranks(c) == 1 ? "" : "s", c->devices,
                           c->map ? ", the device map fewer" : "");
    *device = c->map ? c->map[rank] : rank;
    for (*node = 0; *node + 1 < c->node_count && *device >= c->nodes[*node + 1].first;) ++*node;
    return SHARD_OK;
}

void shard__cluster_node_at(const shard_cluster *c, int n, uint64_t step, double *slowdown, double *memory_bytes) {
    const cluster_node *node = &c->nodes[n];
    *slowdown = 1, *memory_bytes = node->memory_bytes;
    for (int k = 0; k < node->change_count && node->changes[k].at_step <= step; k++) {
        if (node->changes[k].slowdown > 0) *slowdown = node->changes[k].slowdown;
        if (node->changes[k].memory_bytes > 0) *memory_bytes = node->changes[k].memory_bytes;
    }
}

double shard__cluster_node_peak_tflops(const shard_cluster *c, int n) {
    const cluster_node *node = &c->nodes[n];
    double least = node->change_count && node->changes[0].at_step == 1 ? INFINITY : 1; /* step 1's, then each */
    for (int k = 0; k < node->change_count; k++) {
        double slowdown, memory_bytes;
        shard__cluster_node_at(c, n, node->changes[k].at_step, &slowdown, &memory_bytes);
        least = fmin(least, slowdown);
    }
    return node->tflops / least;
}

int shard__cluster_node_count(const shard_cluster *c) { return c ? c->node_count : 0; }

const char *shard__cluster_node_name(const shard_cluster *c, int n) { return c->nodes[n].name; }

double shard__cluster_node_tflops(const shard_cluster *c, int n) { return c->nodes[n].tflops; }

shard_status shard_cluster_device_at(const shard_cluster *c, int rank, uint64_t step, shard_cluster_device *out) {
    int d = 0, n = 0;
    SHARD_CHECK(device_of(c, rank, &d, &n));
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_cluster_device_at: out is NULL");
    const cluster_node *node = &c->nodes[n];
    double slowdown, memory_bytes;
    shard__cluster_node_at(c, n, step, &slowdown, &memory_bytes);
    *out = (shard_cluster_device){.node = node->name,
                                  .node_index = n,
                                  .device = d,
                                  .local = d - node->first,
                                  .compute_tflops = c->device_tflops ? c->device_tflops[d] : node->tflops / slowdown,
                                  .memory_bytes = memory_bytes,
                                  .slowdown = slowdown};
    return SHARD_OK;
}

shard_status shard_cluster_rank_device(const shard_cluster *c, int rank, shard_cluster_device *out) {
    return shard_cluster_device_at(c, rank, 1, out);
}

int shard_cluster_has_changes(const shard_cluster *c) {
    for (int i = 0; c && i < c->node_count; i++)
        if (c->nodes[i].change_count) return 1;
    return 0;
}

void shard__cluster_node_link(const shard_cluster *c, int na, int nb, double *alpha, double *beta) {
    cluster_link l = na == nb ? c->intra : c->network;
    for (int i = 0; i < c->link_count; i++) /* the last entry that joins the two nodes wins */
        if ((c->links[i].from == na && c->links[i].to == nb) || (c->links[i].from == nb && c->links[i].to == na))
            l = c->links[i].link;
    *alpha = l.alpha_seconds;
    *beta = l.beta_bytes_per_second;
}

int shard__cluster_rank_node(const shard_cluster *c, int rank) {
    int d = 0, n = 0;
    if (device_of(c, rank, &d, &n) < 0) {
        shard_clear_error();
        return -1;
    }
    return n;
}

shard_status shard_cluster_link(const shard_cluster *c, int rank_a, int rank_b, double *alpha, double *beta) {
    int da = 0, na = 0, db = 0, nb = 0;
    SHARD_CHECK(device_of(c, rank_a, &da, &na));
    SHARD_CHECK(device_of(c, rank_b, &db, &nb));
    if (da == db) {
        *alpha = 0, *beta = INFINITY;
        return SHARD_OK;
    }
    shard__cluster_node_link(c, na, nb, alpha, beta);
    return SHARD_OK;
}
