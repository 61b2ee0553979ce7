/* placement.c — see placement.h: a parameter's block on the tensor axis from
 * its spec, the contiguous runs of that block inside the whole tensor (for
 * initialisation, checkpoints and tests), and checked spec choices. */
#include "nn/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/params.h"
#include "shard/status.h"
#include "shard/tp.h"

void shard__placement_block(const shard__placement *p, const shard_mesh_layout *layout, int part, size_t *off,
                            size_t *len) {
    shard_tp_piece(&p->spec, p->ndim, p->shape, layout->sizes[0], part, off, len);
}

void shard__placement_range(const shard__placement *p, const shard_mesh_layout *layout, int part, size_t *first,
                            size_t *count) {
    size_t off[SHARD_PLACEMENT_MAX_DIMS], len[SHARD_PLACEMENT_MAX_DIMS];
    shard__placement_block(p, layout, part, off, len);
    int d = p->split_dim >= 0 ? p->split_dim : 0;
    *first = off[d], *count = len[d];
}

int shard__placement_is_split(const shard__placement *p, const shard_mesh_layout *layout) {
    for (int d = 0; d < p->ndim; d++)
        if (shard_spec_pieces(&p->spec, layout, d) > 1) return 1;
    return 0;
}

void shard__placement_stored_shape(const shard__placement *p, const size_t *logical, size_t *stored) {
    int d = 0;
    for (int k = 0; k < p->stored_ndim; k++) {
        stored[k] = 1;
        for (int g = 0; g < p->groups[k]; g++) stored[k] *= logical[d++];
    }
}

size_t shard__placement_runs(const shard__placement *p, const shard_mesh_layout *layout, int part, shard__run_fn fn,
                             void *ctx) {
    size_t off[SHARD_PLACEMENT_MAX_DIMS], len[SHARD_PLACEMENT_MAX_DIMS], stride[SHARD_PLACEMENT_MAX_DIMS];
    shard__placement_block(p, layout, part, off, len);
    size_t total = 1;
    for (int d = p->ndim; d-- > 0;) stride[d] = total, total *= p->shape[d];
    size_t count = 1;
    for (int d = 0; d < p->ndim; d++) count *= len[d];
    if (!fn || count == 0) return count;
    /* the innermost dims held whole join the run; `cut` is the innermost dim held in part */
    int cut = p->ndim - 1;
    size_t run = 1;
    while (cut >= 0 && len[cut] == p->shape[cut]) run *= len[cut--];
    if (cut < 0) {
        fn(ctx, 0, 0, count);
        return count;
    }
    run *= len[cut];
    size_t idx[SHARD_PLACEMENT_MAX_DIMS] = {0}, piece_at = 0;
    for (;;) { /* every index of the dims before `cut`, row-major */
        size_t whole_at = off[cut] * stride[cut];
        for (int d = 0; d < cut; d++) whole_at += (off[d] + idx[d]) * stride[d];
        fn(ctx, whole_at, piece_at, run);
        piece_at += run;
        int d = cut - 1;
        while (d >= 0 && ++idx[d] == len[d]) idx[d--] = 0;
        if (d < 0) break;
    }
    return count;
}

void shard__placement_make(shard__placement *p, int ndim, const size_t *dims, int stored_ndim, const int *groups,
                           int split_dim) {
    memset(p, 0, sizeof *p);
    p->ndim = ndim, p->stored_ndim = stored_ndim, p->split_dim = split_dim;
    memcpy(p->shape, dims, (size_t)ndim * sizeof *dims);
    for (int k = 0; k < stored_ndim; k++) p->groups[k] = groups ? groups[k] : 1;
    p->spec = shard__placement_split_spec(p);
}

typedef struct copy_ctx {
    const float *from;
    float *to;
    int to_whole;
    float std;
    uint64_t seed;
    const char *name;
} copy_ctx;

static void copy_run(void *ctx, size_t whole_at, size_t piece_at, size_t n) {
    copy_ctx *c = ctx;
    if (c->to_whole)
        memcpy(c->to + whole_at, c->from + piece_at, n * sizeof(float));
    else
        memcpy(c->to + piece_at, c->from + whole_at, n * sizeof(float));
}

static void init_run(void *ctx, size_t whole_at, size_t piece_at, size_t n) {
    copy_ctx *c = ctx;
    shard_init_normal(c->to + piece_at, whole_at, n, c->std, c->seed, c->name);
}

shard_status shard__placement_gather(shard_comm *comm, const shard__placement *p, const shard_mesh_layout *layout,
                                     const float *piece, float *whole, const char *what) {
    int parts = layout->sizes[0];
    if (parts <= 1 || !shard__placement_is_split(p, layout)) {
        memcpy(whole, piece, shard__placement_runs(p, layout, 0, NULL, NULL) * sizeof *whole);
        return SHARD_OK;
    }
    int rank = shard_comm_rank(comm);
    size_t *counts = calloc((size_t)parts, sizeof *counts), *displs = calloc((size_t)parts, sizeof *displs), sum = 0;
    for (int r = 0; counts && displs && r < parts; r++)
        displs[r] = sum, counts[r] = shard__placement_runs(p, layout, r, NULL, NULL), sum += counts[r];
    float *all = counts && displs ? malloc(sum * sizeof *all + 1) : NULL;
    shard_status s = all ? shard_comm_all_gatherv(comm, piece, counts[rank], all, counts, displs, SHARD_F32)
                         : shard_error(SHARD_ERR_NO_MEMORY, "out of memory gathering %s", what);
    for (int r = 0; s == SHARD_OK && r < parts; r++) {
        copy_ctx c = {.from = all + displs[r], .to = whole, .to_whole = 1};
        shard__placement_runs(p, layout, r, copy_run, &c);
    }
    free(all), free(counts), free(displs);
    return s;
}

void shard__placement_take(const shard__placement *p, const shard_mesh_layout *layout, int part, const float *whole,
                           float *piece) {
    copy_ctx c = {.from = whole, .to = piece};
    shard__placement_runs(p, layout, part, copy_run, &c);
}

void shard__placement_init_normal(const shard__placement *p, const shard_mesh_layout *layout, int part, float *piece,
                                  float std, uint64_t seed, const char *name) {
    copy_ctx c = {.to = piece, .std = std, .seed = seed, .name = name};
    shard__placement_runs(p, layout, part, init_run, &c);
}

shard_spec shard__placement_split_spec(const shard__placement *p) {
    shard_spec s = shard_spec_replicated(p->ndim);
    if (p->split_dim >= 0) s.naxes[p->split_dim] = 1, s.axes[p->split_dim][0] = 0;
    return s;
}

void shard__placement_spec_text(const shard__placement *p, const shard_mesh_layout *layout, char *out, size_t bytes) {
    shard_spec_string(&p->spec, layout, out, bytes);
}

shard_status shard__placement_set(shard__placement *p, const shard_mesh_layout *layout, const char *name,
                                  const char *text, const char *split_help) {
    char shape[96] = "", split_text[96] = "";
    for (int d = 0, at = 0; d < p->ndim && at < (int)sizeof shape; d++)
        at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%zu", d ? ", " : "", p->shape[d]);
    shard_spec split = shard__placement_split_spec(p), want;
    shard_spec_string(&split, layout, split_text, sizeof split_text);
    char valid[256];
    if (p->split_dim >= 0)
        snprintf(valid, sizeof valid, "%s (%s) or P() (replicated)", split_text, split_help);
    else
        snprintf(valid, sizeof valid, "only P() (replicated)");
    if (shard_spec_parse(text, layout, p->ndim, &want) < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", shard_last_error());
        return shard_error(SHARD_ERR_INVALID_ARG, "--spec \"%s=%s\": %s; %s [%s] can be %s", name, text, why, name,
                           shape, valid);
    }
    shard_spec replicated = shard_spec_replicated(p->ndim);
    if (!shard_spec_equal(&want, &replicated) && !(p->split_dim >= 0 && shard_spec_equal(&want, &split)))
        return shard_error(SHARD_ERR_INVALID_ARG, "--spec \"%s=%s\": %s [%s] can be %s", name, text, name, shape,
                           valid);
    p->spec = want;
    return SHARD_OK;
}
