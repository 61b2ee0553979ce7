/* dtensor.h — distributed tensors: a global shape and dtype, a mesh, a spec,
 * and this rank's local shard (a contiguous tensor of the local shape).
 * Uneven splits are normal: see spec.h for the rule. */
#ifndef SHARD_DTENSOR_H
#define SHARD_DTENSOR_H

#include "shard/mesh.h"
#include "shard/spec.h"
#include "shard/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_dtensor {
    shard_mesh *mesh; /* not owned */
    shard_mesh_layout layout;
    shard_spec spec;
    shard_dtype dtype;
    int ndim;
    size_t global_shape[SHARD_MAX_DIMS];
    size_t local_offset[SHARD_MAX_DIMS]; /* where the local shard starts in the global tensor */
    shard_tensor *local;                 /* owned: the local shard */
} shard_dtensor;

/* A zero-filled distributed tensor (local shard allocated on every rank). */
shard_status shard_dtensor_create(shard_mesh *mesh, shard_dtype dtype, int ndim, const size_t *global_shape,
                                  const shard_spec *spec, shard_mem_category category, shard_dtensor **out);
void shard_dtensor_destroy(shard_dtensor *t);

/* Fill dst's shards from a full tensor.  root < 0: `full` is replicated on
 * every rank and each takes its block (no traffic); root >= 0: only rank
 * `root` of the mesh holds it (others pass NULL) and sends each rank its
 * block (scattered when a dim is split, else broadcast).
 * For a partial spec the value is placed so that the pending reduction gives
 * it back: sum puts it on the ranks at coordinate 0 of the partial axes and
 * zeros elsewhere; max, min and avg put it everywhere. */
shard_status shard_dtensor_distribute(shard_dtensor *dst, const shard_tensor *full, int root);

/* The full global tensor, with pending reductions applied: into `full` on
 * every rank (root < 0), or on rank `root` only (others may pass NULL). */
shard_status shard_dtensor_gather(const shard_dtensor *src, shard_tensor *full, int root);

/* Move the data of `src` into `dst` (same mesh, global shape and dtype; any
 * two specs) with the least traffic: the steps of a redistribution plan
 * (redistribute.h) — a slice, all_gather, all_reduce, reduce_scatter,
 * all_to_all, or one exchange — each over the mesh axes it changes. */
shard_status shard_dtensor_redistribute(const shard_dtensor *src, shard_dtensor *dst);

#ifdef __cplusplus
}
#endif
#endif
