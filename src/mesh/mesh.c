/* mesh.c — named axes over a communicator's ranks, their coordinates and
 * sub-communicators.
 *
 * Rank layout is row-major with the last axis fastest:
 *   rank = sum_k coord[k] * prod_{j>k} size[j].
 * The communicator over a set of axes S holds the ranks that agree on every
 * axis outside S; it is a split with color = the coordinates outside S and key
 * = the linear index of the coordinates inside S, so its rank order is again
 * row-major over S. */
#include "shard/mesh.h"

#include "comm/comm_impl.h"
#include "mesh_scratch.h"
#include "shard/memory.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_AXIS_SETS = 1 << SHARD_MESH_MAX_AXES, MAX_MESH_RANKS = 1 << 20 };

struct shard_mesh {
    shard_comm *comm;
    int ndim;
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES];
    int coords[SHARD_MESH_MAX_AXES];
    shard_comm *axis_sets[MAX_AXIS_SETS]; /* indexed by the bit mask of axes; [0] unused */
    void *scratch[SHARD__SCRATCH_SLOTS];  /* staging buffers (mesh_scratch.h) */
    size_t scratch_bytes[SHARD__SCRATCH_SLOTS];
    void *attached[SHARD__ATTACH_SLOTS];
    void (*attached_destroy[SHARD__ATTACH_SLOTS])(void *);
};

/* ---------------------------------------------------------------- parsing */

/* Append the meshes of `world` ranks over the given axis names ("data=4 |
 * data=2,tensor=2 | tensor=4"): first axes largest first, size-1 axes left out. */
static void list_meshes(char names[][SHARD_MESH_AXIS_NAME_BYTES], int naxes, int world, int axis, int *sizes, char *out,
                        size_t out_bytes, int *count) {
    if (axis == naxes) {
        if (world != 1) return;
        size_t used = strlen(out);
        int any = 0;
        if (*count) used += (size_t)snprintf(out + used, out_bytes > used ? out_bytes - used : 0, " | ");
        for (int k = 0; k < naxes && used < out_bytes; k++) {
            if (sizes[k] == 1 && !(k == naxes - 1 && !any)) continue;
            used += (size_t)snprintf(out + used, out_bytes - used, "%s%s=%d", any ? "," : "", names[k], sizes[k]);
            any = 1;
        }
        (*count)++;
        return;
    }
    for (int s = world; s >= 1; s--)
        if (world % s == 0) {
            sizes[axis] = s;
            list_meshes(names, naxes, world / s, axis + 1, sizes, out, out_bytes, count);
        }
}

int shard_mesh_parse(const char *text, int world_size, char names_out[][SHARD_MESH_AXIS_NAME_BYTES], int *sizes_out) {
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES];
    const char *syntax = "give axes as name=size separated by commas, e.g. data=2,tensor=2";
    if (!text || !*text) return shard_error(SHARD_ERR_INVALID_ARG, "mesh is empty: %s", syntax);
    int n = 0;
    const char *p = text;
    for (;;) {
        if (n == SHARD_MESH_MAX_AXES)
            return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s has more than %d axes", text, SHARD_MESH_MAX_AXES);
        size_t len = 0;
        while (isalnum((unsigned char)p[len]) || p[len] == '_') len++;
        if (len == 0)
            return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s: empty axis name at column %d: %s", text,
                               (int)(p - text) + 1, syntax);
        if (isdigit((unsigned char)p[0]) || len >= SHARD_MESH_AXIS_NAME_BYTES)
            return shard_error(
                SHARD_ERR_INVALID_ARG,
                "mesh %s: axis name '%.*s' is invalid: names start with a letter or _ and have at most %d characters",
                text, (int)len, p, SHARD_MESH_AXIS_NAME_BYTES - 1);
        memcpy(names[n], p, len);
        names[n][len] = '\0';
        p += len;
        if (*p != '=')
            return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s: expected '=' after axis '%s': %s", text, names[n],
                               syntax);
        p++;
        char *end = NULL;
        long size = strtol(p, &end, 10);
        if (end == p || size < 0 || size > 1 << 20)
            return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s: axis '%s' needs a size (a positive integer): %s", text,
                               names[n], syntax);
        if (size == 0)
            return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s: axis '%s' has size 0; sizes are 1 or more", text,
                               names[n]);
        sizes[n] = (int)size;
        for (int k = 0; k < n; k++)
            if (strcmp(names[k], names[n]) == 0)
                return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s: axis '%s' appears twice; axis names are unique",
                                   text, names[n]);
        n++;
        p = end;
        if (*p == '\0') break;
        if (*p != ',')
            return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s: unexpected '%c' at column %d: %s", text, *p,
                               (int)(p - text) + 1, syntax);
        p++;
    }
    long product = 1;
    for (int k = 0; k < n; k++) product *= sizes[k], product = product > 1L << 30 ? 1L << 30 : product;
    if (product > MAX_MESH_RANKS) /* offline layouts (world_size 0) too: rank arithmetic is int */
        return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s has %s%ld ranks; at most %d are possible", text,
                           product == 1L << 30 ? "over " : "", product, MAX_MESH_RANKS);
    if (world_size > 0 && product != world_size) {
        char valid[512] = "";
        int count = 0, trial[SHARD_MESH_MAX_AXES];
        list_meshes(names, n, world_size, 0, trial, valid, sizeof valid, &count);
        return shard_error(SHARD_ERR_INVALID_ARG, "mesh %s needs %ld ranks, got %d; meshes of %d ranks: %s", text,
                           product, world_size, world_size, valid);
    }
    for (int k = 0; k < n; k++) {
        if (names_out) memcpy(names_out[k], names[k], SHARD_MESH_AXIS_NAME_BYTES);
        if (sizes_out) sizes_out[k] = sizes[k];
    }
    return n;
}

/* ---------------------------------------------------------------- creation */

static shard_status split_for_axes(shard_mesh *m, unsigned mask, shard_comm **out) {
    int color = 0, key = 0, group = 1;
    for (int k = 0; k < m->ndim; k++) {
        if (mask & (1u << k))
            key = key * m->sizes[k] + m->coords[k], group *= m->sizes[k];
        else
            color = color * m->sizes[k] + m->coords[k];
    }
    SHARD_CHECK(shard__comm_split_sized(m->comm, color, key, group, key, out));
    char name[64] = "";
    size_t used = 0;
    for (int k = 0; k < m->ndim && used < sizeof name; k++)
        if (mask & (1u << k))
            used += (size_t)snprintf(name + used, sizeof name - used, "%s%s", used ? "," : "", m->names[k]);
    return shard_comm_set_name(*out, name);
}

shard_status shard_mesh_create(shard_comm *comm, const char *text, shard_mesh **out) {
    if (!comm || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_mesh_create: comm and out must not be NULL");
    *out = NULL;
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES];
    int n = shard_mesh_parse(text, shard_comm_size(comm), names, sizes);
    if (n < 0) return (shard_status)n; /* refused before anything is allocated */
    shard_mesh *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "shard_mesh_create: out of memory");
    m->comm = comm;
    m->ndim = n;
    memcpy(m->names, names, sizeof names);
    memcpy(m->sizes, sizes, sizeof sizes);
    int rest = shard_comm_rank(comm);
    for (int k = n - 1; k >= 0; k--) {
        m->coords[k] = rest % sizes[k];
        rest /= sizes[k];
    }
    shard_status s = SHARD_OK;
    for (int k = 0; k < n && s == SHARD_OK; k++) s = split_for_axes(m, 1u << k, &m->axis_sets[1u << k]);
    if (s < 0) {
        shard_mesh_destroy(m);
        return s;
    }
    *out = m;
    return SHARD_OK;
}

void shard_mesh_destroy(shard_mesh *mesh) {
    if (!mesh) return;
    for (int i = 1; i < MAX_AXIS_SETS; i++) shard_comm_destroy(mesh->axis_sets[i]);
    for (int i = 0; i < SHARD__SCRATCH_SLOTS; i++) shard_free(mesh->scratch[i]);
    for (int i = 0; i < SHARD__ATTACH_SLOTS; i++)
        if (mesh->attached[i] && mesh->attached_destroy[i]) mesh->attached_destroy[i](mesh->attached[i]);
    free(mesh);
}

/* ---------------------------------------------------------------- queries */

int shard_mesh_ndim(const shard_mesh *mesh) { return mesh ? mesh->ndim : 0; }

static int valid_axis(const shard_mesh *mesh, int axis) { return mesh && axis >= 0 && axis < mesh->ndim; }

const char *shard_mesh_axis_name(const shard_mesh *mesh, int axis) {
    return valid_axis(mesh, axis) ? mesh->names[axis] : "(none)";
}
int shard_mesh_axis_size(const shard_mesh *mesh, int axis) { return valid_axis(mesh, axis) ? mesh->sizes[axis] : 0; }
int shard_mesh_coord(const shard_mesh *mesh, int axis) { return valid_axis(mesh, axis) ? mesh->coords[axis] : -1; }
shard_comm *shard_mesh_comm(const shard_mesh *mesh) { return mesh ? mesh->comm : NULL; }
shard_comm *shard_mesh_axis_comm(const shard_mesh *mesh, int axis) {
    return valid_axis(mesh, axis) ? mesh->axis_sets[1u << axis] : NULL;
}

int shard_mesh_axis_index(const shard_mesh *mesh, const char *name) {
    for (int k = 0; mesh && name && k < mesh->ndim; k++)
        if (strcmp(mesh->names[k], name) == 0) return k;
    return -1;
}

int shard_mesh_rank_at(const shard_mesh *mesh, const int *coords) {
    int rank = 0;
    for (int k = 0; k < mesh->ndim; k++) {
        if (coords[k] < 0 || coords[k] >= mesh->sizes[k]) return -1;
        rank = rank * mesh->sizes[k] + coords[k];
    }
    return rank;
}

void shard_mesh_string(const shard_mesh *mesh, char *out, size_t out_bytes) {
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < mesh->ndim && used < out_bytes; k++)
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%s=%d", k ? "," : "", mesh->names[k], mesh->sizes[k]);
}

shard_status shard_mesh_axes_comm(shard_mesh *mesh, const char *axes, shard_comm **out) {
    if (!mesh || !axes || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_mesh_axes_comm: NULL argument");
    *out = NULL;
    unsigned mask = 0;
    const char *p = axes;
    while (*p) {
        size_t len = strcspn(p, ",");
        char name[SHARD_MESH_AXIS_NAME_BYTES] = "";
        if (len == 0 || len >= sizeof name)
            return shard_error(SHARD_ERR_INVALID_ARG, "axes '%s': give axis names separated by commas", axes);
        memcpy(name, p, len);
        int k = shard_mesh_axis_index(mesh, name);
        if (k < 0) {
            char mesh_text[256];
            shard_mesh_string(mesh, mesh_text, sizeof mesh_text);
            return shard_error(SHARD_ERR_INVALID_ARG, "axes '%s': no axis '%s' in mesh %s", axes, name, mesh_text);
        }
        if (mask & (1u << k)) return shard_error(SHARD_ERR_INVALID_ARG, "axes '%s': axis '%s' named twice", axes, name);
        mask |= 1u << k;
        p += len;
        if (*p == ',') p++;
    }
    if (!mask) return shard_error(SHARD_ERR_INVALID_ARG, "axes '%s': no axis named", axes);
    return shard_mesh_axes_comm_mask(mesh, mask, out);
}

shard_status shard_mesh_axes_comm_mask(shard_mesh *mesh, unsigned axes_mask, shard_comm **out) {
    if (!mesh || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_mesh_axes_comm_mask: NULL argument");
    *out = NULL;
    if (axes_mask == 0 || (axes_mask >> mesh->ndim))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_mesh_axes_comm_mask: mask 0x%x names no axis or one outside the %d of the mesh",
                           axes_mask, mesh->ndim);
    if (!mesh->axis_sets[axes_mask]) SHARD_CHECK(split_for_axes(mesh, axes_mask, &mesh->axis_sets[axes_mask]));
    *out = mesh->axis_sets[axes_mask];
    return SHARD_OK;
}

uint64_t shard_mesh_bytes_sent(const shard_mesh *mesh) {
    if (!mesh) return 0;
    uint64_t total = shard_comm_bytes_sent(mesh->comm);
    for (int i = 1; i < MAX_AXIS_SETS; i++) total += shard_comm_bytes_sent(mesh->axis_sets[i]);
    return total;
}

void *shard__mesh_scratch(shard_mesh *mesh, int slot, size_t bytes) {
    if (!mesh || slot < 0 || slot >= SHARD__SCRATCH_SLOTS) return NULL;
    if (bytes == 0) bytes = 1;
    if (mesh->scratch_bytes[slot] < bytes) {
        shard_free(mesh->scratch[slot]);
        mesh->scratch[slot] = shard_alloc(bytes, SHARD_MEM_COMM);
        mesh->scratch_bytes[slot] = mesh->scratch[slot] ? bytes : 0;
    }
    return mesh->scratch[slot];
}

void *shard__mesh_attachment(const shard_mesh *mesh, int slot) {
    return mesh && slot >= 0 && slot < SHARD__ATTACH_SLOTS ? mesh->attached[slot] : NULL;
}

void shard__mesh_attach(shard_mesh *mesh, int slot, void *state, void (*destroy)(void *)) {
    if (!mesh || slot < 0 || slot >= SHARD__ATTACH_SLOTS) return;
    if (mesh->attached[slot] && mesh->attached_destroy[slot]) mesh->attached_destroy[slot](mesh->attached[slot]);
    mesh->attached[slot] = state;
    mesh->attached_destroy[slot] = destroy;
}
