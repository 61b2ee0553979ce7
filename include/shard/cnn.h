/* cnn.h — the two-shard image classifier: a feature part (conv K x K with
 * "same" zero padding -> ReLU -> max-pool P x P) and a classifier part (a
 * dense layer to the classes), for NCHW float images.
 *
 * Config (JSON): {"model_type": "cnn", "in_channels": 1, "height": 28,
 * "width": 28, "channels": 8, "kernel": 3, "pool": 2, "classes": 10}.
 * Parameters: features.conv.weight [channels, in_channels, K, K],
 * features.conv.bias [channels], classifier.weight [features, classes]
 * (in x out, as the GPT's linears), classifier.bias [classes]. */
#ifndef SHARD_CNN_H
#define SHARD_CNN_H

#include <stddef.h>
#include <stdint.h>

#include "shard/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_cnn_config {
    size_t in_channels, height, width, channels, kernel, pool, classes;
} shard_cnn_config;

shard_status shard_cnn_config_parse(const char *json_text, const char *where, shard_cnn_config *out);
/* Features entering the classifier: channels * (height / pool) * (width / pool). */
size_t shard_cnn_features(const shard_cnn_config *c);

typedef struct shard_cnn shard_cnn;

shard_status shard_cnn_create(const shard_cnn_config *c, size_t max_batch, shard_cnn **out);
void shard_cnn_destroy(shard_cnn *m);
shard_params *shard_cnn_params(shard_cnn *m);
/* PyTorch's default initialisation bounds (uniform +-1/sqrt(fan_in)), counter-based. */
void shard_cnn_init(shard_cnn *m, uint64_t seed);
/* images [B, in_channels, height, width]; with labels, *loss = mean cross-entropy. */
shard_status shard_cnn_forward(shard_cnn *m, const float *images, const int32_t *labels, size_t B, float *loss);
const float *shard_cnn_logits(const shard_cnn *m); /* [B, classes] */
/* grads NULL: through the gradient pointers bound on shard_cnn_model(m). */
shard_status shard_cnn_backward(shard_cnn *m, shard_params *grads);
/* The CNN behind the generic model table (model.h): unit 0 = features, 1 = classifier.  Owned by m. */
struct shard_model *shard_cnn_model(shard_cnn *m);

#ifdef __cplusplus
}
#endif
#endif
