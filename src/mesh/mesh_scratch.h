/* mesh_scratch.h — internal: reusable staging buffers owned by a mesh (one
 * rank's), so that redistributions do not map and fault in fresh memory on
 * every call.  A buffer stays valid until the next request for the same slot
 * or shard_mesh_destroy. */
#ifndef SHARD_MESH_SCRATCH_H
#define SHARD_MESH_SCRATCH_H

#include <stddef.h>

#include "shard/mesh.h"

enum { SHARD__SCRATCH_SEND = 0, SHARD__SCRATCH_RECV = 1, SHARD__SCRATCH_SLOTS = 2 };

/* At least `bytes` of 64-byte aligned memory (accounted as comm), or NULL. */
void *shard__mesh_scratch(shard_mesh *mesh, int slot, size_t bytes);

#endif
