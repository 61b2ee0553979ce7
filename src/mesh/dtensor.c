/* dtensor.c — distributed tensors: create, distribute from a full tensor,
 * gather to a full tensor, each with the least traffic.
 *
 * Distribute from every rank: each takes its block (no traffic).  From one
 * rank: a broadcast when no dim is split (everyone needs all of it), else a
 * scatter (all_to_allv in which only the root sends): each rank that must
 * hold the value gets exactly its block.
 *
 * Gather: apply the pending reduction over the partial axes (all_reduce on
 * that axis set), then, to every rank, all_gatherv the blocks over the axes
 * that split some dim (ranks that differ only along other axes hold the same
 * block and need not send it); to one rank, one holder of each block the root
 * lacks sends it there (all_to_allv). */
#include "shard/dtensor.h"

#include <stdlib.h>
#include <string.h>

#include "box.h"
#include "mesh_scratch.h"

/* This rank's coordinates on every mesh axis. */
static void my_coords(const shard_mesh *mesh, int *coords) {
    for (int k = 0; k < shard_mesh_ndim(mesh); k++) coords[k] = shard_mesh_coord(mesh, k);
}

static void local_block(const shard_dtensor *t, const int *coords, size_t *offset, size_t *length) {
    for (int d = 0; d < t->ndim; d++)
        shard_spec_local_range(&t->spec, &t->layout, t->global_shape, coords, d, &offset[d], &length[d]);
}

shard_status shard_dtensor_create(shard_mesh *mesh, shard_dtype dtype, int ndim, const size_t *global_shape,
                                  const shard_spec *spec, shard_mem_category category, shard_dtensor **out) {
    if (!mesh || !spec || !out || (ndim > 0 && !global_shape))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_create: NULL argument");
    *out = NULL;
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    SHARD_CHECK(shard_spec_validate(spec, &layout, ndim, "shard_dtensor_create: the spec"));
    SHARD_CHECK(shard_spec_check_dtype(spec, dtype, "shard_dtensor_create: the spec"));
    shard_dtensor *t = calloc(1, sizeof *t);
    if (!t) return shard_error(SHARD_ERR_NO_MEMORY, "shard_dtensor_create: out of memory");
    t->mesh = mesh;
    t->layout = layout;
    t->spec = *spec;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->global_shape[d] = global_shape[d];
    int coords[SHARD_MESH_MAX_AXES];
    size_t length[SHARD_MAX_DIMS];
    my_coords(mesh, coords);
    local_block(t, coords, t->local_offset, length);
    shard_status s = shard_tensor_create(dtype, ndim, length, category, &t->local);
    if (s < 0) {
        free(t);
        return s;
    }
    *out = t;
    return SHARD_OK;
}

void shard_dtensor_destroy(shard_dtensor *t) {
    if (!t) return;
    shard_tensor_destroy(t->local);
    free(t);
}

static shard_status check_full(const shard_dtensor *t, const shard_tensor *full, const char *what) {
    int same = full->ndim == t->ndim && full->dtype == t->dtype;
    for (int d = 0; same && d < t->ndim; d++) same = full->shape[d] == t->global_shape[d];
    if (same) return SHARD_OK;
    char have[160], want[160];
    shard_tensor_type_string(full, have, sizeof have);
    shard_spec_type_string(&t->spec, &t->layout, t->dtype, t->global_shape, want, sizeof want);
    return shard_error(SHARD_ERR_INVALID_ARG, "%s: the full tensor is %s, the distributed one %s", what, have, want);
}

static void block_at(const shard_dtensor *t, const int *coords, shard__box *b) {
    shard__block_of(&t->spec, &t->layout, t->ndim, t->global_shape, coords, b);
}

static void rank_coords(const shard_dtensor *t, int rank, int *coords) {
    shard_mesh_layout_unravel(&t->layout, (1u << t->layout.ndim) - 1, rank, coords);
}

/* A pending sum keeps the value only at coordinate 0 of the partial axes (zeros elsewhere). */
static int holds_value(const shard_dtensor *t, const int *coords) {
    if (!t->spec.partial_mask || t->spec.partial_op != SHARD_OP_SUM) return 1;
    for (int k = 0; k < t->layout.ndim; k++)
        if ((t->spec.partial_mask & (1u << k)) && coords[k] != 0) return 0;
    return 1;
}

/* A buffer of nothing, for the side of an all_to_allv that moves no data
 * (passing the other side's pointer would read as "in place"). */
static char nothing[64];

static shard_status alloc_counts(int n, size_t **a, size_t **b, size_t **c, size_t **d) {
    *a = calloc((size_t)n, sizeof **a), *b = calloc((size_t)n, sizeof **b);
    *c = calloc((size_t)n, sizeof **c), *d = calloc((size_t)n, sizeof **d);
    if (*a && *b && *c && *d) return SHARD_OK;
    return shard_error(SHARD_ERR_NO_MEMORY, "out of memory for %d ranks' counts", n);
}

static void free_counts(size_t *a, size_t *b, size_t *c, size_t *d) { free(a), free(b), free(c), free(d); }

/* Root sends every rank that holds the value its block; the others get zeros. */
static shard_status scatter_from(shard_dtensor *dst, const shard_tensor *full, int root) {
    shard_comm *world = shard_mesh_comm(dst->mesh);
    int n = shard_comm_size(world), me = shard_comm_rank(world);
    shard__box whole = {{0}, {0}}, mine;
    for (int d = 0; d < dst->ndim; d++) whole.len[d] = dst->global_shape[d];
    size_t es = shard_dtype_size(dst->dtype), *sc = NULL, *sd = NULL, *rc = NULL, *rd = NULL, total = 0;
    shard_status s = alloc_counts(n, &sc, &sd, &rc, &rd);
    int coords[SHARD_MESH_MAX_AXES] = {0};
    rank_coords(dst, me, coords);
    block_at(dst, coords, &mine);
    int i_hold = holds_value(dst, coords);
    if (s == SHARD_OK && me != root && i_hold) rc[root] = shard_tensor_numel(dst->local);
    char *packed = NULL;
    for (int q = 0; s == SHARD_OK && me == root && q < n; q++) { /* the root's counts */
        rank_coords(dst, q, coords);
        shard__box b;
        block_at(dst, coords, &b);
        if (q != root && holds_value(dst, coords))
            sc[q] = shard__box_numel(&b, dst->ndim), sd[q] = total, total += sc[q];
    }
    if (s == SHARD_OK && me == root) {
        packed = shard__mesh_scratch(dst->mesh, SHARD__SCRATCH_SEND, total * es);
        if (!packed)
            s = shard_error(SHARD_ERR_NO_MEMORY, "shard_dtensor_distribute: out of memory for %zu elements", total);
        for (int q = 0; s == SHARD_OK && q < n; q++) {
            if (!sc[q]) continue;
            shard__box b;
            rank_coords(dst, q, coords);
            block_at(dst, coords, &b);
            shard_tensor from = shard__sub_view(full, &whole, &b),
                         to = shard__contiguous_over(packed + sd[q] * es, dst->dtype, dst->ndim, &b);
            s = shard_tensor_copy(&to, &from);
        }
    }
    if (s == SHARD_OK)
        s = shard_comm_all_to_allv(world, packed ? packed : nothing, sc, sd, dst->local->data, rc, rd, dst->dtype);
    if (s == SHARD_OK && me == root) {
        shard_tensor from = shard__sub_view(full, &whole, &mine);
        s = i_hold ? shard_tensor_copy(dst->local, &from) : shard_tensor_fill(dst->local, 0);
    } else if (s == SHARD_OK && !i_hold) {
        s = shard_tensor_fill(dst->local, 0);
    }
    free_counts(sc, sd, rc, rd);
    return s;
}

shard_status shard_dtensor_distribute(shard_dtensor *dst, const shard_tensor *full, int root) {
    if (!dst) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_distribute: tensor is NULL");
    shard_comm *world = shard_mesh_comm(dst->mesh);
    int me = shard_comm_rank(world);
    if (root >= shard_comm_size(world))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_distribute: root %d is out of range 0..%d", root,
                           shard_comm_size(world) - 1);
    if (root < 0 || me == root) {
        if (!full)
            return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_distribute: full tensor is NULL on rank %d", me);
        SHARD_CHECK(check_full(dst, full, "shard_dtensor_distribute"));
    }
    int coords[SHARD_MESH_MAX_AXES] = {0};
    rank_coords(dst, me, coords);
    if (root >= 0 && shard_spec_split_axes(&dst->spec)) return scatter_from(dst, full, root);
    if (root >= 0) { /* nothing split: every rank needs the whole tensor */
        if (me == root) SHARD_CHECK(shard_tensor_copy(dst->local, full));
        SHARD_CHECK(shard_comm_broadcast(world, dst->local->data, shard_tensor_numel(dst->local), dst->dtype, root));
        return holds_value(dst, coords) ? SHARD_OK : shard_tensor_fill(dst->local, 0);
    }
    if (!holds_value(dst, coords)) return shard_tensor_fill(dst->local, 0);
    shard__box whole = {{0}, {0}}, mine;
    for (int d = 0; d < dst->ndim; d++) whole.len[d] = dst->global_shape[d];
    block_at(dst, coords, &mine);
    shard_tensor from = shard__sub_view(full, &whole, &mine);
    return shard_tensor_copy(dst->local, &from);
}

/* The local shard with the pending reduction applied, in a new tensor. */
static shard_status reduced_copy(const shard_dtensor *src, shard_tensor **out) {
    SHARD_CHECK(shard_tensor_create(src->dtype, src->ndim, src->local->shape, SHARD_MEM_COMM, out));
    shard_status s = shard_tensor_copy(*out, src->local);
    if (s == SHARD_OK && src->spec.partial_mask) {
        shard_comm *pc = NULL;
        s = shard_mesh_axes_comm_mask(src->mesh, src->spec.partial_mask, &pc);
        if (s == SHARD_OK)
            s = shard_comm_all_reduce(pc, (*out)->data, (*out)->data, shard_tensor_numel(*out), src->dtype,
                                      src->spec.partial_op);
    }
    if (s < 0) {
        shard_tensor_destroy(*out);
        *out = NULL;
    }
    return s;
}

/* To every rank: all_gatherv over the splitting axes, then place the blocks. */
static shard_status gather_everywhere(const shard_dtensor *src, const shard_tensor *reduced, shard_tensor *full) {
    unsigned split = shard_spec_split_axes(&src->spec);
    shard__box whole = {{0}, {0}};
    for (int d = 0; d < src->ndim; d++) whole.len[d] = src->global_shape[d];
    if (!split) return shard_tensor_copy(full, reduced);
    shard_comm *gc = NULL;
    SHARD_CHECK(shard_mesh_axes_comm_mask(src->mesh, split, &gc));
    int members = shard_comm_size(gc), coords[SHARD_MESH_MAX_AXES] = {0};
    rank_coords(src, shard_comm_rank(shard_mesh_comm(src->mesh)), coords);
    size_t es = shard_dtype_size(src->dtype), *counts = NULL, *displs = NULL, *unused1 = NULL, *unused2 = NULL,
           total = 0;
    shard__box *boxes = calloc((size_t)members, sizeof *boxes);
    shard_status s = alloc_counts(members, &counts, &displs, &unused1, &unused2);
    if (s == SHARD_OK && !boxes) s = shard_error(SHARD_ERR_NO_MEMORY, "shard_dtensor_gather: out of memory");
    for (int q = 0; s == SHARD_OK && q < members;
         q++) { /* member q: row-major over the splitting axes, mine elsewhere */
        int c[SHARD_MESH_MAX_AXES];
        memcpy(c, coords, sizeof c);
        shard_mesh_layout_unravel(&src->layout, split, q, c);
        block_at(src, c, &boxes[q]);
        counts[q] = shard__box_numel(&boxes[q], src->ndim), displs[q] = total, total += counts[q];
    }
    char *blocks = s == SHARD_OK ? shard__mesh_scratch(src->mesh, SHARD__SCRATCH_RECV, total * es) : NULL;
    if (s == SHARD_OK && !blocks) s = shard_error(SHARD_ERR_NO_MEMORY, "shard_dtensor_gather: out of memory");
    if (s == SHARD_OK)
        s = shard_comm_all_gatherv(gc, reduced->data, shard_tensor_numel(reduced), blocks, counts, displs, src->dtype);
    for (int q = 0; s == SHARD_OK && q < members; q++) {
        shard_tensor from = shard__contiguous_over(blocks + displs[q] * es, src->dtype, src->ndim, &boxes[q]);
        shard_tensor to = shard__sub_view(full, &whole, &boxes[q]);
        s = shard_tensor_copy(&to, &from);
    }
    free(boxes);
    free_counts(counts, displs, unused1, unused2);
    return s;
}

/* The rank that sends block of `coords` to a root: coordinate 0 on every axis that splits no dim. */
static int is_sender(const shard_dtensor *t, const int *coords) {
    unsigned split = shard_spec_split_axes(&t->spec);
    for (int k = 0; k < t->layout.ndim; k++)
        if (!(split & (1u << k)) && coords[k] != 0) return 0;
    return 1;
}

static int same_block(const shard_dtensor *t, const int *a, const int *b) {
    unsigned split = shard_spec_split_axes(&t->spec);
    for (int k = 0; k < t->layout.ndim; k++)
        if ((split & (1u << k)) && a[k] != b[k]) return 0;
    return 1;
}

/* To one rank: one holder of each block the root lacks sends it (all_to_allv). */
static shard_status gather_to(const shard_dtensor *src, const shard_tensor *reduced, shard_tensor *full, int root) {
    shard_comm *world = shard_mesh_comm(src->mesh);
    int n = shard_comm_size(world), me = shard_comm_rank(world);
    int mine[SHARD_MESH_MAX_AXES] = {0}, at_root[SHARD_MESH_MAX_AXES] = {0};
    rank_coords(src, me, mine);
    rank_coords(src, root, at_root);
    size_t es = shard_dtype_size(src->dtype), *sc = NULL, *sd = NULL, *rc = NULL, *rd = NULL, total = 0;
    shard_status s = alloc_counts(n, &sc, &sd, &rc, &rd);
    if (s == SHARD_OK && me != root && is_sender(src, mine) && !same_block(src, mine, at_root))
        sc[root] = shard_tensor_numel(reduced);
    shard__box whole = {{0}, {0}};
    for (int d = 0; d < src->ndim; d++) whole.len[d] = src->global_shape[d];
    for (int q = 0; s == SHARD_OK && me == root && q < n; q++) {
        int c[SHARD_MESH_MAX_AXES] = {0};
        rank_coords(src, q, c);
        if (q == root || !is_sender(src, c) || same_block(src, c, at_root)) continue;
        shard__box b;
        block_at(src, c, &b);
        rc[q] = shard__box_numel(&b, src->ndim), rd[q] = total, total += rc[q];
    }
    char *blocks = NULL;
    if (s == SHARD_OK && me == root) {
        blocks = shard__mesh_scratch(src->mesh, SHARD__SCRATCH_RECV, total * es);
        if (!blocks) s = shard_error(SHARD_ERR_NO_MEMORY, "shard_dtensor_gather: out of memory");
    }
    if (s == SHARD_OK)
        s = shard_comm_all_to_allv(world, reduced->data, sc, sd, blocks ? blocks : nothing, rc, rd, src->dtype);
    if (s == SHARD_OK && me == root) {
        shard__box b;
        block_at(src, mine, &b);
        shard_tensor to = shard__sub_view(full, &whole, &b);
        s = shard_tensor_copy(&to, reduced);
    }
    for (int q = 0; s == SHARD_OK && me == root && q < n; q++) {
        if (!rc[q]) continue;
        int c[SHARD_MESH_MAX_AXES] = {0};
        shard__box b;
        rank_coords(src, q, c);
        block_at(src, c, &b);
        shard_tensor from = shard__contiguous_over(blocks + rd[q] * es, src->dtype, src->ndim, &b);
        shard_tensor to = shard__sub_view(full, &whole, &b);
        s = shard_tensor_copy(&to, &from);
    }
    free_counts(sc, sd, rc, rd);
    return s;
}

shard_status shard_dtensor_gather(const shard_dtensor *src, shard_tensor *full, int root) {
    if (!src) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_gather: tensor is NULL");
    shard_comm *world = shard_mesh_comm(src->mesh);
    int me = shard_comm_rank(world);
    if (root >= shard_comm_size(world))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_gather: root %d is out of range 0..%d", root,
                           shard_comm_size(world) - 1);
    if (root < 0 || root == me) {
        if (!full)
            return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_gather: full tensor is NULL on rank %d", me);
        SHARD_CHECK(check_full(src, full, "shard_dtensor_gather"));
    }
    shard_tensor *reduced = NULL;
    SHARD_CHECK(reduced_copy(src, &reduced));
    shard_status s = root < 0 ? gather_everywhere(src, reduced, full) : gather_to(src, reduced, full, root);
    shard_tensor_destroy(reduced);
    return s;
}
