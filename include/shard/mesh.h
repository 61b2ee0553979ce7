/* mesh.h — the device mesh: named axes over the ranks of a communicator.
 *
 * `shard_mesh_create(world, "data=2,tensor=2", &mesh)` lays the ranks out in
 * row-major order, the last axis varying fastest (so `tensor` neighbours are
 * adjacent ranks, as in Megatron).  Each rank knows its coordinates and holds
 * one sub-communicator per axis (named after the axis, as timeouts show).
 * Axes of size 1 are allowed.  Bad meshes are refused before anything is
 * allocated, listing the valid choices. */
#ifndef SHARD_MESH_H
#define SHARD_MESH_H

#include <stddef.h>
#include <stdint.h>

#include "shard/comm.h"
#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_MESH_MAX_AXES 8
#define SHARD_MESH_AXIS_NAME_BYTES 32

typedef struct shard_mesh shard_mesh;

/* Parse a mesh text against a world size without creating anything: fills
 * names/sizes (when not NULL) and returns the axis count, or a negative status
 * with the reason and the valid meshes of that many ranks. */
int shard_mesh_parse(const char *text, int world_size, char names[][SHARD_MESH_AXIS_NAME_BYTES], int *sizes);

/* Collective over `comm`: every rank passes the same text. */
shard_status shard_mesh_create(shard_comm *comm, const char *text, shard_mesh **out);
void shard_mesh_destroy(shard_mesh *mesh);

int shard_mesh_ndim(const shard_mesh *mesh);
const char *shard_mesh_axis_name(const shard_mesh *mesh, int axis);
int shard_mesh_axis_size(const shard_mesh *mesh, int axis);
/* Index of a named axis, or -1. */
int shard_mesh_axis_index(const shard_mesh *mesh, const char *name);
/* This rank's coordinate along an axis. */
int shard_mesh_coord(const shard_mesh *mesh, int axis);
/* The rank (in the mesh's communicator) at the given coordinates. */
int shard_mesh_rank_at(const shard_mesh *mesh, const int *coords);
shard_comm *shard_mesh_comm(const shard_mesh *mesh); /* all ranks */
shard_comm *shard_mesh_axis_comm(const shard_mesh *mesh, int axis);

/* The communicator over a set of axes, e.g. "data,tensor" (ranks that differ
 * only along those axes).  Collective on first use of a set: every rank must
 * ask for the same sets in the same order; later calls return the cached one. */
shard_status shard_mesh_axes_comm(shard_mesh *mesh, const char *axes, shard_comm **out);

/* The same by bit mask (bit k: axis k), as plans and specs name axes. */
shard_status shard_mesh_axes_comm_mask(shard_mesh *mesh, unsigned axes_mask, shard_comm **out);
/* Bytes this rank has sent on the mesh's communicators: all ranks, and every
 * axis set created so far (for checking traffic formulas). */
uint64_t shard_mesh_bytes_sent(const shard_mesh *mesh);

/* "data=2,tensor=2" */
void shard_mesh_string(const shard_mesh *mesh, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif
#endif
