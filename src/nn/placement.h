/* placement.h — internal to the layers: where a model's parameter lives on the tensor axis,
 * written as a sharding spec (spec.h) of the parameter's *logical* shape.
 *
 * The logical shape exposes the structure a split must respect, while the
 * stored tensor keeps its checkpoint (Hugging Face) shape: the GPT's c_attn
 * weight is stored [C, 3C] but placed as [C, 3, H, D], so P(None, None,
 * 'tensor', None) gives each tensor rank whole heads of q, k and v — three
 * sections each split, which no spec of the stored [C, 3C] could say.  The
 * stored shape merges consecutive logical dims (`groups`: how many logical
 * dims make each stored dim).
 *
 * A model reads its layers' placement from these specs (which heads, which
 * MLP columns, which vocabulary rows this rank holds; whether a layer's output
 * is a partial sum), so one layer code serves tensor=1, tensor=N and any
 * per-parameter choice (split or replicated) a user makes with --spec. */
#ifndef SHARD_PLACEMENT_H
#define SHARD_PLACEMENT_H

#include <stddef.h>

#include <stdint.h>

#include "shard/comm.h"
#include "shard/spec.h"

#define SHARD_PLACEMENT_MAX_DIMS 4

typedef struct shard__placement {
    int ndim;                               /* logical dims */
    size_t shape[SHARD_PLACEMENT_MAX_DIMS]; /* the whole tensor's logical shape */
    int stored_ndim;
    int groups[SHARD_PLACEMENT_MAX_DIMS]; /* logical dims merged into stored dim k */
    int split_dim;                        /* the dim the model can split over `tensor` (-1: none) */
    shard_spec spec;                      /* on the layout tensor=<size> */
} shard__placement;

/* The logical block tensor rank `part` holds: offsets and lengths per logical dim (tp.h's shard_tp_piece;
 * `layout` is shard_tp_layout's "tensor=parts"). */
void shard__placement_block(const shard__placement *p, const shard_mesh_layout *layout, int part, size_t *off,
                            size_t *len);
/* The range of the split dim tensor rank `part` holds (the whole dim when nothing is split). */
void shard__placement_range(const shard__placement *p, const shard_mesh_layout *layout, int part, size_t *first,
                            size_t *count);
/* 1 when the spec splits some dim over more than one rank. */
int shard__placement_is_split(const shard__placement *p, const shard_mesh_layout *layout);
/* Stored shape of a logical shape (merging each group's dims). */
void shard__placement_stored_shape(const shard__placement *p, const size_t *logical, size_t *stored);

/* fn(ctx, whole_at, piece_at, n) for each contiguous run of rank `part`'s block: where it sits in the
 * whole tensor (row-major) and in the piece (row-major); returns the piece's element count (fn may be NULL). */
typedef void (*shard__run_fn)(void *ctx, size_t whole_at, size_t piece_at, size_t n);
size_t shard__placement_runs(const shard__placement *p, const shard_mesh_layout *layout, int part, shard__run_fn fn,
                             void *ctx);

/* Set p->spec from text, or fail naming `name`, what was given and what is valid: P() (replicated)
 * or the split dim over 'tensor' (`split_help` names that choice, e.g. "column-parallel"). */
shard_status shard__placement_set(shard__placement *p, const shard_mesh_layout *layout, const char *name,
                                  const char *text, const char *split_help);
/* The spec as text, e.g. "P(None, 'tensor')". */
void shard__placement_spec_text(const shard__placement *p, const shard_mesh_layout *layout, char *out, size_t bytes);
/* The default split spec: split_dim over 'tensor' (replicated when split_dim < 0). */
shard_spec shard__placement_split_spec(const shard__placement *p);
/* p for a parameter of logical shape dims[ndim], stored as stored_ndim dims (groups[k] logical dims
 * merged into stored dim k; NULL: one each), that can split over `tensor` at split_dim (-1: none), with
 * the default spec (the split). */
void shard__placement_make(shard__placement *p, int ndim, const size_t *dims, int stored_ndim, const int *groups,
                           int split_dim);

/* ---- a parameter's pieces: what a model's tensor table (model.h) does with them ---- */

/* The whole tensor from every tensor rank's piece (comm's ranks are the layout's parts; a collective
 * over comm when the spec splits, a copy otherwise); `what` names the parameter in messages. */
shard_status shard__placement_gather(shard_comm *comm, const shard__placement *p, const shard_mesh_layout *layout,
                                     const float *piece, float *whole, const char *what);
/* Rank `part`'s piece of the whole tensor. */
void shard__placement_take(const shard__placement *p, const shard_mesh_layout *layout, int part, const float *whole,
                           float *piece);
/* Rank `part`'s piece of shard_init_normal(std, seed, name) over the whole tensor: each element the
 * draw its index in the whole tensor keys, so every split initialises the same model. */
void shard__placement_init_normal(const shard__placement *p, const shard_mesh_layout *layout, int part, float *piece,
                                  float std, uint64_t seed, const char *name);

#endif
