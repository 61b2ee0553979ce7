/* optim.h — optimizers, gradient clipping and learning-rate schedules, with
 * PyTorch's semantics (torch.optim.SGD, torch.optim.AdamW,
 * torch.nn.utils.clip_grad_norm_).
 *
 * Updates are functions over flat arrays (parameters, gradients and the
 * optimizer's state arrays, all of one length), so a strategy that shards
 * the optimizer state (ZeRO) calls them on its slice unchanged. */
#ifndef SHARD_OPTIM_H
#define SHARD_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "shard/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_sgd_config {
    float momentum;     /* 0: plain SGD */
    float weight_decay; /* L2, added to the gradient (as torch.optim.SGD) */
} shard_sgd_config;

/* p -= lr * buf, buf = momentum * buf + (g + wd * p); step is 1-based (the first
 * step sets buf = g, as PyTorch does).  momentum_buf may be NULL when momentum is 0. */
void shard_sgd_update(const shard_sgd_config *c, uint64_t step, float lr, float *p, const float *g, float *momentum_buf,
                      size_t n);

typedef struct shard_adamw_config {
    float beta1, beta2, eps, weight_decay; /* PyTorch defaults: 0.9, 0.999, 1e-8, 0.01 */
} shard_adamw_config;

shard_adamw_config shard_adamw_defaults(void);

/* One AdamW step (1-based `step`), decoupled weight decay and bias correction:
 *   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps) */
void shard_adamw_update(const shard_adamw_config *c, uint64_t step, float lr, float *p, const float *g, float *m,
                        float *v, size_t n);

/* Sum of squares of a gradient array (double, fixed order): pieces of the global norm. */
/* The same update with the gradient multiplied by `clip` (a clipping factor) on the way in, leaving g
 * zeroed for the next step's accumulation: one pass over memory instead of three. */
void shard_adamw_update_clipped(const shard_adamw_config *c, uint64_t step, float lr, float clip, float *p, float *g,
                                float *m, float *v, size_t n);
double shard_sum_squares(const float *g, size_t n);
/* The factor clip_grad_norm_ scales gradients by: min(1, max_norm / (norm + 1e-6)). */
float shard_clip_factor(double global_norm, float max_norm);
void shard_scale(float *g, size_t n, float factor);

/* Warm-up then cosine decay: lr rises linearly over `warmup` steps to lr_max
 * (step 1 gets lr_max / warmup), then falls along a half cosine to lr_min at
 * `total` steps and stays there.  step is 1-based. */
typedef struct shard_lr_schedule {
    float lr_max, lr_min;
    uint64_t warmup, total;
} shard_lr_schedule;

float shard_lr_at(const shard_lr_schedule *s, uint64_t step);

#ifdef __cplusplus
}
#endif
#endif
