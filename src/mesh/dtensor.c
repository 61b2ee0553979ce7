/* dtensor.c — distributed tensors: create, distribute from a full tensor,
 * gather to a full tensor.
 *
 * Gather: apply the pending reduction over the partial axes (all_reduce on
 * that axis set), then all_gatherv the local shards over the axes that split
 * some dim (ranks that differ only along replicated axes hold the same block,
 * so they need not send it), then place each block at its global offsets. */
#include "shard/dtensor.h"

#include <stdlib.h>
#include <string.h>

#include <stdio.h>

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
    if (spec->ndim != ndim)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_create: the spec has %d dims, the shape %d", spec->ndim,
                           ndim);
    shard_dtensor *t = calloc(1, sizeof *t);
    if (!t) return shard_error(SHARD_ERR_NO_MEMORY, "shard_dtensor_create: out of memory");
    t->mesh = mesh;
    shard_mesh_layout_of(mesh, &t->layout);
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

/* A view of `full` narrowed to the block at offset/length (the caller frees it). */
static shard_status block_view(const shard_tensor *full, int ndim, const size_t *offset, const size_t *length,
                               shard_tensor **out) {
    shard_tensor *view = malloc(sizeof *view);
    if (!view) return shard_error(SHARD_ERR_NO_MEMORY, "out of memory for a view");
    *view = *full;
    view->storage = NULL;
    size_t es = shard_dtype_size(full->dtype);
    for (int d = 0; d < ndim; d++) {
        view->data = (char *)view->data + offset[d] * full->strides[d] * es;
        view->shape[d] = length[d];
    }
    *out = view;
    return SHARD_OK;
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

shard_status shard_dtensor_distribute(shard_dtensor *dst, const shard_tensor *full, int root) {
    if (!dst) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_distribute: tensor is NULL");
    shard_comm *world = shard_mesh_comm(dst->mesh);
    int me = shard_comm_rank(world);
    shard_tensor *staged = NULL;
    if (root >= 0) { /* only root holds it: broadcast a contiguous copy */
        if (root >= shard_comm_size(world))
            return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_distribute: root %d is out of range 0..%d", root,
                               shard_comm_size(world) - 1);
        if (me == root) SHARD_CHECK(check_full(dst, full, "shard_dtensor_distribute"));
        SHARD_CHECK(shard_tensor_create(dst->dtype, dst->ndim, dst->global_shape, SHARD_MEM_COMM, &staged));
        shard_status s = me == root ? shard_tensor_copy(staged, full) : SHARD_OK;
        if (s == SHARD_OK)
            s = shard_comm_broadcast(world, staged->data, shard_tensor_numel(staged), dst->dtype, root);
        if (s < 0) {
            shard_tensor_destroy(staged);
            return s;
        }
        full = staged;
    } else {
        if (!full) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_distribute: full tensor is NULL");
        SHARD_CHECK(check_full(dst, full, "shard_dtensor_distribute"));
    }
    int coords[SHARD_MESH_MAX_AXES];
    my_coords(dst->mesh, coords);
    int holds_value = 1; /* a pending sum: only coordinate 0 of the partial axes keeps the value */
    if (dst->spec.partial_mask && dst->spec.partial_op == SHARD_OP_SUM)
        for (int k = 0; k < dst->layout.ndim; k++)
            if ((dst->spec.partial_mask & (1u << k)) && coords[k] != 0) holds_value = 0;
    shard_status s = SHARD_OK;
    if (holds_value) {
        shard_tensor *view = NULL;
        s = block_view(full, dst->ndim, dst->local_offset, dst->local->shape, &view);
        if (s == SHARD_OK) s = shard_tensor_copy(dst->local, view);
        free(view);
    } else {
        s = shard_tensor_fill(dst->local, 0);
    }
    shard_tensor_destroy(staged);
    return s;
}

/* The communicator over the axes in `mask` ("data,tensor"); NULL mask: none. */
static shard_status axes_comm(shard_mesh *mesh, unsigned mask, shard_comm **out) {
    char names[256] = "";
    size_t used = 0;
    for (int k = 0; k < shard_mesh_ndim(mesh) && used < sizeof names; k++)
        if (mask & (1u << k))
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? "," : "", shard_mesh_axis_name(mesh, k));
    return shard_mesh_axes_comm(mesh, names, out);
}

shard_status shard_dtensor_gather(const shard_dtensor *src, shard_tensor *full, int root) {
    if (!src) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_gather: tensor is NULL");
    shard_comm *world = shard_mesh_comm(src->mesh);
    int me = shard_comm_rank(world);
    int keeps = root < 0 || root == me;
    if (keeps) {
        if (!full) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dtensor_gather: full tensor is NULL on rank %d", me);
        SHARD_CHECK(check_full(src, full, "shard_dtensor_gather"));
    }
    size_t es = shard_dtype_size(src->dtype), local_n = shard_tensor_numel(src->local);
    /* 1. pending reduction */
    shard_tensor *reduced = NULL;
    SHARD_CHECK(shard_tensor_create(src->dtype, src->ndim, src->local->shape, SHARD_MEM_COMM, &reduced));
    shard_status s = shard_tensor_copy(reduced, src->local);
    if (s == SHARD_OK && src->spec.partial_mask) {
        shard_comm *pc = NULL;
        s = axes_comm(src->mesh, src->spec.partial_mask, &pc);
        if (s == SHARD_OK) s = shard_comm_all_reduce(pc, reduced->data, reduced->data, local_n, src->dtype, src->spec.partial_op);
    }
    /* 2. the blocks of every rank that differs along the splitting axes */
    unsigned split = 0;
    for (int d = 0; d < src->ndim; d++)
        for (int i = 0; i < src->spec.naxes[d]; i++) split |= 1u << src->spec.axes[d][i];
    shard_comm *gc = NULL;
    size_t *counts = NULL, *displs = NULL;
    void *blocks = NULL;
    int members = 1;
    if (s == SHARD_OK && split) {
        s = axes_comm(src->mesh, split, &gc);
        if (s == SHARD_OK) members = shard_comm_size(gc);
    }
    int coords[SHARD_MESH_MAX_AXES];
    my_coords(src->mesh, coords);
    if (s == SHARD_OK) {
        counts = calloc((size_t)members, sizeof *counts);
        displs = calloc((size_t)members, sizeof *displs);
        if (!counts || !displs) s = shard_error(SHARD_ERR_NO_MEMORY, "shard_dtensor_gather: out of memory");
    }
    size_t total = 0;
    for (int q = 0; s == SHARD_OK && q < members; q++) {
        int c[SHARD_MESH_MAX_AXES]; /* member q: row-major over the splitting axes, mine elsewhere */
        memcpy(c, coords, sizeof c);
        shard_mesh_layout_unravel(&src->layout, split, q, c);
        size_t off[SHARD_MAX_DIMS], len[SHARD_MAX_DIMS], n = 1;
        local_block(src, c, off, len);
        for (int d = 0; d < src->ndim; d++) n *= len[d];
        counts[q] = n, displs[q] = total, total += n;
    }
    if (s == SHARD_OK) {
        blocks = shard_alloc((total ? total : 1) * es, SHARD_MEM_COMM);
        if (!blocks) s = SHARD_ERR_NO_MEMORY;
    }
    if (s == SHARD_OK) {
        if (gc)
            s = shard_comm_all_gatherv(gc, reduced->data, local_n, blocks, counts, displs, src->dtype);
        else
            memcpy(blocks, reduced->data, local_n * es);
    }
    /* 3. place every block */
    for (int q = 0; s == SHARD_OK && keeps && q < members; q++) {
        int c[SHARD_MESH_MAX_AXES]; /* member q: row-major over the splitting axes, mine elsewhere */
        memcpy(c, coords, sizeof c);
        shard_mesh_layout_unravel(&src->layout, split, q, c);
        size_t off[SHARD_MAX_DIMS], len[SHARD_MAX_DIMS];
        local_block(src, c, off, len);
        shard_tensor block = *reduced; /* contiguous, of the block's shape */
        block.storage = NULL;
        block.data = (char *)blocks + displs[q] * es;
        size_t stride = 1;
        for (int d = src->ndim - 1; d >= 0; d--) block.shape[d] = len[d], block.strides[d] = stride, stride *= len[d];
        shard_tensor *view = NULL;
        s = block_view(full, src->ndim, off, len, &view);
        if (s == SHARD_OK) s = shard_tensor_copy(view, &block);
        free(view);
    }
    shard_free(blocks);
    free(counts);
    free(displs);
    shard_tensor_destroy(reduced);
    return s;
}
