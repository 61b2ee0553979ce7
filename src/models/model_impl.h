/* model_impl.h — internal: the built-in model makers the registry of
 * shard_model_create holds, and helpers the model files share. */
#ifndef SHARD_MODEL_IMPL_H
#define SHARD_MODEL_IMPL_H

#include "shard/comm.h"
#include "shard/model.h"

shard_status shard__gpt_model_create(const char *config_text, const char *where, size_t max_rows, size_t seq,
                                     shard_comm *tensor, shard_comm *expert, int sequence_parallel, const char *specs,
                                     const shard_model_stage *stage, shard_model **out);
/* The CNN's and the MLP's makers are registered kinds' create functions (model.h). */
shard_status shard__cnn_model_create(const shard_model_create_options *o, shard_model **out);
shard_status shard__mlp_model_create(const shard_model_create_options *o, shard_model **out);
/* The MLP's rows outside a training step, for the engine API's MLP (nn/mlp_engine.c) on the same model:
 * x[n, model_dim] -> y[n, model_dim], keeping z = x W0 and h = ReLU(z) [n, this rank's hidden units];
 * then, from dL/dy, the parameters' gradients added to m->grad[] (dh: [n, hidden] scratch). */
shard_status shard__mlp_rows_forward(shard_model *m, const float *x, float *z, float *h, float *y, size_t n);
shard_status shard__mlp_rows_backward(shard_model *m, const float *x, const float *z, const float *h, const float *dy,
                                      float *dh, size_t n);
/* The built-in kinds' batch sources (model.h's shard_batch_source_fn): the GPT's token file, the CNN's
 * Fashion-MNIST, the MLP's generated rows. */
shard_status shard__gpt_batch_source(const shard_model_create_options *o, const shard_model *m,
                                     shard_batch_source **out);
shard_status shard__cnn_batch_source(const shard_model_create_options *o, const shard_model *m,
                                     shard_batch_source **out);
shard_status shard__mlp_batch_source(const shard_model_create_options *o, const shard_model *m,
                                     shard_batch_source **out);

/* The MLP's config check (model_dim, hidden_dim): what shard_model_config_check runs for "mlp". */
shard_status shard__mlp_config_parse(const char *text, const char *where, size_t *model_dim, size_t *hidden_dim);
/* "WHERE: key 'KEY' is unknown (LISTING); did you mean 'NEAR'?", NEAR the nearest of the kind's keys
 * (text.h), left out when none is near: every model refuses a key it does not know in these words. */
shard_status shard__unknown_key(const char *where, const char *key, const char *const *keys, size_t count,
                                const char *listing);

void shard__model_free_units(shard_model *m);
/* A config file's text (malloc'd), or NULL with the error set. */
char *shard__read_config(const char *path);

#endif
