/* params.h — a model's parameters: one accounted slab with a named view per
 * tensor, so checkpoints, gradient buckets and ZeRO shards can treat them as
 * one flat array.  Each tensor starts 64-byte aligned (padding is zero and
 * stays zero).  Gradients and optimizer state use slabs of the same layout
 * (shard_params_like), so element i of each belongs to the same parameter.
 *
 * Initialisation is counter-based: element i of a tensor depends only on the
 * seed, the tensor's name and i — not on the order tensors are made in, nor
 * on which rank makes which part — so any sharding initialises the same
 * model. */
#ifndef SHARD_PARAMS_H
#define SHARD_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "shard/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_PARAM_NAME_BYTES 128

typedef struct shard_param_info {
    char name[SHARD_PARAM_NAME_BYTES];
    int ndim;
    size_t shape[SHARD_MAX_DIMS];
    size_t offset, numel; /* in elements, within the slab */
} shard_param_info;

typedef struct shard_params {
    size_t count;
    shard_param_info *info;
    size_t total; /* elements in the slab, padding included */
    float *data;
    shard_mem_category category;
    /* internal: the names' hash index (slots of info index + 1, 0 empty; by_name_mask + 1 of them), so that
     * creating the table and finding a name take time linear in the tensors, not their square */
    size_t *by_name, by_name_mask;
} shard_params;

/* A zeroed slab for these tensors (name, ndim, shape read; offsets filled); names unique, checked in time
 * linear in count. */
shard_status shard_params_create(const shard_param_info *tensors, size_t count, shard_mem_category category,
                                 shard_params **out);
/* A zeroed slab of the same layout. */
shard_status shard_params_like(const shard_params *p, shard_mem_category category, shard_params **out);
void shard_params_destroy(shard_params *p);

const shard_param_info *shard_params_find(const shard_params *p, const char *name);
/* The tensor's first element, or NULL when there is no such name. */
float *shard_params_data(const shard_params *p, const char *name);
/* A tensor header over tensor `index` (storage NULL: valid while p lives). */
shard_tensor shard_params_view(const shard_params *p, size_t index);
void shard_params_zero(shard_params *p);

/* Counter-based initialisation (see above): x receives elements first ..
 * first + n - 1 (row-major) of the tensor `name`, so a rank holding a slice
 * initialises exactly its part of the whole. */
void shard_init_normal(float *x, size_t first, size_t n, float std, uint64_t seed, const char *name);
void shard_init_uniform(float *x, size_t first, size_t n, float bound, uint64_t seed, const char *name);

/* Fill tensors from a safetensors file by name (f32, or bf16/f16 widened), or
 * from Hugging Face's sharded layout when path ends in .index.json (its
 * weight_map names each tensor's file, beside the index).
 * A shape that differs is an error naming the tensor; with require_all, so is
 * a tensor of p the file lacks.  *loaded (may be NULL) counts what was set. */
shard_status shard_params_load(shard_params *p, const char *path, int require_all, size_t *loaded);
/* Write every tensor as f32 into a safetensors file (atomically), with metadata pairs. */
shard_status shard_params_save(const shard_params *p, const char *path, const char *const *meta_keys,
                               const char *const *meta_values, size_t meta_count);

#ifdef __cplusplus
}
#endif
#endif
