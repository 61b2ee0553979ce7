/* box.h — internal: boxes (an offset and a length per dim) of a global
 * tensor, the blocks specs give each rank, and tensor headers over them.
 * Shared by distribute/gather (dtensor.c) and redistribution. */
#ifndef SHARD_MESH_BOX_H
#define SHARD_MESH_BOX_H

#include <string.h>

#include "shard/spec.h"
#include "shard/tensor.h"

typedef struct shard__box {
    size_t off[SHARD_MAX_DIMS], len[SHARD_MAX_DIMS];
} shard__box;

/* The block the rank at `coords` holds under `spec`. */
static inline void shard__block_of(const shard_spec *spec, const shard_mesh_layout *layout, int ndim,
                                   const size_t *shape, const int *coords, shard__box *b) {
    for (int d = 0; d < ndim; d++) shard_spec_local_range(spec, layout, shape, coords, d, &b->off[d], &b->len[d]);
}

static inline size_t shard__box_numel(const shard__box *b, int ndim) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= b->len[d];
    return n;
}

static inline void shard__box_intersect(const shard__box *a, const shard__box *b, int ndim, shard__box *out) {
    for (int d = 0; d < ndim; d++) {
        size_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        size_t ea = a->off[d] + a->len[d], eb = b->off[d] + b->len[d], hi = ea < eb ? ea : eb;
        out->off[d] = lo;
        out->len[d] = hi > lo ? hi - lo : 0;
    }
}

/* A tensor header over contiguous memory of the box's shape. */
static inline shard_tensor shard__contiguous_over(void *data, shard_dtype dtype, int ndim, const shard__box *b) {
    shard_tensor view;
    memset(&view, 0, sizeof view);
    view.dtype = dtype;
    view.ndim = ndim;
    view.data = data;
    size_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) view.shape[d] = b->len[d], view.strides[d] = stride, stride *= b->len[d];
    return view;
}

/* The part of `whole` (which holds box `at` of the global tensor) covering box `b`: a strided view. */
static inline shard_tensor shard__sub_view(const shard_tensor *whole, const shard__box *at, const shard__box *b) {
    shard_tensor view = *whole;
    view.storage = NULL;
    size_t es = shard_dtype_size(whole->dtype);
    for (int d = 0; d < whole->ndim; d++) {
        view.data = (char *)view.data + (b->off[d] - at->off[d]) * whole->strides[d] * es;
        view.shape[d] = b->len[d];
    }
    return view;
}

#endif
