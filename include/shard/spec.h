/* spec.h — sharding specs: how each dim of a tensor is placed on a mesh.
 *
 * Text form as JAX's PartitionSpec, plus a keyword for pending reductions:
 *   P('data', None)               dim 0 split over `data`, dim 1 replicated
 *   P(('data','tensor'), None)    dim 0 split over data then tensor (data major)
 *   P(None, 'tensor', partial='data')             each data-rank holds a summand
 *   P(partial=('data','tensor'), partial_op='max') pending max over both axes
 *   P()                           replicated (missing trailing entries are None)
 * A dim of size n split into k pieces gives the first n % k pieces one extra
 * element: 10 over 4 ranks is 3,3,2,2 (shard_split_range).  A dim split over
 * several axes is split over the first (major) axis by that rule, then each
 * piece over the next axis, and so on (as PyTorch DTensor does for several
 * Shard placements of one dim): 10 over ('a','b') with a=2, b=2 is 3,2,3,2.
 * So removing the last axis of a dim gives back the blocks of the shorter
 * list, which makes an all_gather over that axis exact.  Piece i along a dim
 * belongs to the ranks whose coordinates on that dim's axes, read row-major
 * (first axis major), equal i; pieces tile the dim in that order.
 *
 * Specs are checked against a mesh *layout* (axis names and sizes), which
 * needs no communicator, so `shard inspect` can describe a layout offline. */
#ifndef SHARD_SPEC_H
#define SHARD_SPEC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shard/comm.h"
#include "shard/mesh.h"
#include "shard/split.h"
#include "shard/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_mesh_layout {
    int ndim;
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES];
} shard_mesh_layout;

/* Parse "data=2,tensor=2"; world_size 0 accepts any product. */
shard_status shard_mesh_layout_parse(const char *text, int world_size, shard_mesh_layout *out);
void shard_mesh_layout_of(const shard_mesh *mesh, shard_mesh_layout *out);
int shard_mesh_layout_world(const shard_mesh_layout *layout);
/* Write into coords[k], for the axes k in `axes_mask`, the coordinates of
 * `index` read row-major over those axes (mesh order); other entries are left
 * as they are.  With every axis in the mask, index is a rank. */
void shard_mesh_layout_unravel(const shard_mesh_layout *layout, unsigned axes_mask, int index, int *coords);

typedef struct shard_spec {
    int ndim;                                         /* tensor dims */
    int naxes[SHARD_MAX_DIMS];                        /* mesh axes splitting each dim */
    int8_t axes[SHARD_MAX_DIMS][SHARD_MESH_MAX_AXES]; /* their indices, major first */
    unsigned partial_mask;                            /* bit k: partial over mesh axis k */
    shard_reduce_op partial_op;                       /* sum, max, min or avg */
} shard_spec;

/* 1 when a and b place a tensor the same way (the op is ignored when nothing is partial). */
int shard_spec_equal(const shard_spec *a, const shard_spec *b);
/* Mesh axes that split some dim (bit k: axis k). */
unsigned shard_spec_split_axes(const shard_spec *spec);

/* Fully replicated spec of a tensor with `ndim` dims. */
shard_spec shard_spec_replicated(int ndim);
/* Parse the text form for a tensor of `tensor_ndim` dims on `layout`. */
shard_status shard_spec_parse(const char *text, const shard_mesh_layout *layout, int tensor_ndim, shard_spec *out);

/* SHARD_OK if spec can place a tensor of ndim dims on the layout: its dims match, every axis it names
 * exists and is used once, partial axes split no dim, the pending reduction is sum, max, min or avg.
 * Else an error whose text starts with `what` ("the source spec"). */
shard_status shard_spec_validate(const shard_spec *spec, const shard_mesh_layout *layout, int ndim, const char *what);
/* SHARD_OK unless a pending avg would hold an integer dtype: its sum wraps before the division (u8 4 x 100
 * averages to 36), so integer tensors take sum, max or min.  The error's text starts with `what`. */
shard_status shard_spec_check_dtype(const shard_spec *spec, shard_dtype dtype, const char *what);
/* Canonical text: "P('data', None)" (+ ", partial='tensor'" ...). */
void shard_spec_string(const shard_spec *spec, const shard_mesh_layout *layout, char *out, size_t out_bytes);
/* "f32[8@data,4]", "f32[8@(data,tensor),4] partial sum over tensor" */
void shard_spec_type_string(const shard_spec *spec, const shard_mesh_layout *layout, shard_dtype dtype,
                            const size_t *global_shape, char *out, size_t out_bytes);

/* Pieces along dim d: the product of the sizes of the axes splitting it. */
int shard_spec_pieces(const shard_spec *spec, const shard_mesh_layout *layout, int dim);
/* Which piece along dim d the rank at `coords` holds. */
int shard_spec_piece_index(const shard_spec *spec, const shard_mesh_layout *layout, int dim, const int *coords);
/* Piece `index` of `count` elements split in `pieces`: split.h's rule (first count % pieces get one more). */
void shard_split_range(size_t count, int pieces, int index, size_t *offset, size_t *length);
/* The global index range of dim d held by the rank at `coords`. */
void shard_spec_local_range(const shard_spec *spec, const shard_mesh_layout *layout, const size_t *global_shape,
                            const int *coords, int dim, size_t *offset, size_t *length);

/* Print the mesh, spec, type, a block grid for 1-D and 2-D tensors, and every
 * rank's shard (coordinates, global ranges, local shape). */
void shard_spec_describe(const shard_spec *spec, const shard_mesh_layout *layout, shard_dtype dtype,
                         const size_t *global_shape, FILE *to);

#ifdef __cplusplus
}
#endif
#endif
