/* engine.h — the engine API: a model behind load_checkpoint,
 * forward, backward and inference_loop, the same whether it runs on one
 * device or sharded (strategies implement the same table).
 *
 *   load_checkpoint(params by name)   copy weights in (shapes checked)
 *   forward(x) -> y                   keeps what backward needs (a tape)
 *   backward(dL/dy) -> grads by name  pops the tape; gradients are written
 *   inference_loop(stream in, out)    forward on each input, without the tape
 *
 * The first engine is a 2-layer MLP, ReLU(x W0) W1, on one device,
 * with parameters `layer_0/weights` [model, hidden] and `layer_1/weights`
 * [hidden, model] (examples/mlp_single_device.c).  It is the model of kind
 * "mlp" (model.h) with a tape: the model `shard train` trains, run through
 * the engine API. */
#ifndef SHARD_ENGINE_H
#define SHARD_ENGINE_H

#include <stddef.h>

#include "shard/comm.h"
#include "shard/params.h"
#include "shard/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_engine shard_engine;

/* A named array: one entry of a name -> array map. */
typedef struct shard_named {
    const char *name;
    const shard_tensor *tensor;
} shard_named;

typedef struct shard_engine_ops {
    const char *name;
    shard_status (*load_checkpoint)(shard_engine *e, const shard_named *params, size_t count);
    /* y must have the output's shape (it may be x); x is copied, so it can be reused at once */
    shard_status (*forward)(shard_engine *e, const shard_tensor *x, shard_tensor *y);
    /* grads (a slab like the engine's parameters) receive dL/dparam */
    shard_status (*backward)(shard_engine *e, const shard_tensor *dy, shard_params *grads);
    /* forward without keeping anything for backward */
    shard_status (*infer)(shard_engine *e, const shard_tensor *x, shard_tensor *y);
    void (*destroy)(shard_engine *e);
} shard_engine_ops;

struct shard_engine {
    const shard_engine_ops *ops;
    shard_params *params; /* owned */
};

static inline shard_status shard_engine_load_checkpoint(shard_engine *e, const shard_named *p, size_t n) {
    return e->ops->load_checkpoint(e, p, n);
}
static inline shard_status shard_engine_forward(shard_engine *e, const shard_tensor *x, shard_tensor *y) {
    return e->ops->forward(e, x, y);
}
static inline shard_status shard_engine_backward(shard_engine *e, const shard_tensor *dy, shard_params *grads) {
    return e->ops->backward(e, dy, grads);
}
void shard_engine_destroy(shard_engine *e);

/* Reads inputs from `next` until it returns 0 (or fails) and hands each
 * output to `emit`, an inference loop over two streams. */
typedef int (*shard_stream_read)(void *ctx, shard_tensor **x);                /* 1: an input, 0: end, < 0: error */
typedef shard_status (*shard_stream_write)(void *ctx, const shard_tensor *y); /* y is valid during the call */
shard_status shard_engine_inference_loop(shard_engine *e, shard_stream_read next, void *in_ctx, shard_stream_write emit,
                                         void *out_ctx, size_t out_features);

/* The MLP on one device. */
shard_status shard_mlp_engine_create(size_t model_dim, size_t hidden_dim, shard_engine **out);
/* The same MLP tensor parallel over `tensor` (Megatron): layer_0/weights split
 * by columns and layer_1/weights by rows over the ranks (the even rule over
 * hidden units), one all_reduce of the output in forward.  load_checkpoint
 * takes the whole tensors and keeps this rank's block; backward's gradients
 * are this rank's blocks.  tensor NULL or of one rank: the single device. */
shard_status shard_mlp_engine_create_tp(shard_comm *tensor, size_t model_dim, size_t hidden_dim, shard_engine **out);

#ifdef __cplusplus
}
#endif
#endif
