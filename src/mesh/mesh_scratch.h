/* mesh_scratch.h — internal: state a mesh (one rank's) keeps for the
 * modules above it: reusable staging buffers, so that redistributions do not
 * map and fault in fresh memory on every call (a buffer stays valid until the
 * next request for the same slot or shard_mesh_destroy), and attachments
 * such as the cache of redistribution plans. */
#ifndef SHARD_MESH_SCRATCH_H
#define SHARD_MESH_SCRATCH_H

#include <stddef.h>

#include "shard/mesh.h"

enum { SHARD__SCRATCH_SEND = 0, SHARD__SCRATCH_RECV = 1, SHARD__SCRATCH_SLOTS = 2 };

/* At least `bytes` of 64-byte aligned memory (accounted as comm), or NULL. */
void *shard__mesh_scratch(shard_mesh *mesh, int slot, size_t bytes);

/* State other modules keep per mesh (freed with the mesh by `destroy`). */
enum { SHARD__ATTACH_PLAN_CACHE = 0, SHARD__ATTACH_SLOTS = 1 };
void *shard__mesh_attachment(const shard_mesh *mesh, int slot);
void shard__mesh_attach(shard_mesh *mesh, int slot, void *state, void (*destroy)(void *));

#endif
