/* optim.h — optimizers, gradient clipping and learning-rate schedules, with
 * PyTorch's semantics (torch.optim.SGD, torch.optim.AdamW,
 * torch.nn.utils.clip_grad_norm_).
 *
 * Updates are functions over flat arrays (parameters, gradients and the
 * optimizer's state arrays, all of one length), so a strategy that shards
 * the optimizer state (ZeRO) calls them on its slice unchanged.  The
 * optimizer interface below puts either optimizer behind one object that
 * names its state arrays, so the strategies and checkpoints need not know
 * which one runs. */
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

/* ---------------------------------------------------------------- the optimizer interface
 *
 * What a training strategy drives: an optimizer made from options, which
 * declares its state arrays by name (each as long as the parameters it
 * updates, zero at the start) and updates a range of them.  A strategy that
 * shards the state (ZeRO) allocates its share of every array and calls
 * update on that share; checkpoints name the arrays
 * "optimizer.<array name>.<parameter name>".
 *
 *   adamw  state "exp_avg", "exp_avg_sq" (torch.optim.AdamW's names)
 *   sgd    state "momentum_buffer" when momentum != 0 (torch.optim.SGD's
 *          name), none for plain SGD */
typedef enum shard_optimizer_kind { SHARD_OPTIMIZER_ADAMW = 0, SHARD_OPTIMIZER_SGD = 1 } shard_optimizer_kind;

enum { SHARD_OPTIMIZER_MAX_STATES = 4 }; /* state arrays any optimizer declares, at most */

typedef struct shard_optimizer_options {
    size_t struct_size; /* sizeof(shard_optimizer_options): lets the struct grow */
    shard_optimizer_kind kind;
    shard_adamw_config adamw; /* kind adamw: betas, eps, decoupled weight decay */
    shard_sgd_config sgd;     /* kind sgd: momentum (0: none), L2 weight decay */
} shard_optimizer_options;

typedef struct shard_optimizer shard_optimizer;

/* The options of `kind` with PyTorch's defaults (AdamW: shard_adamw_defaults(); SGD: no momentum, no
 * weight decay), struct_size set. */
shard_optimizer_options shard_optimizer_defaults(shard_optimizer_kind kind);
/* The kind named "adamw" or "sgd"; another name is refused, listing the valid ones. */
shard_status shard_optimizer_find(const char *name, shard_optimizer_kind *out);
/* Refuses options from an older header (struct_size), an unknown kind, and hyperparameters PyTorch refuses
 * (a beta outside [0, 1), a negative eps, weight decay or momentum, any of them not finite). */
shard_status shard_optimizer_create(const shard_optimizer_options *options, shard_optimizer **out);
void shard_optimizer_destroy(shard_optimizer *opt);
/* "adamw" or "sgd" */
const char *shard_optimizer_name(const shard_optimizer *opt);
const shard_optimizer_options *shard_optimizer_options_of(const shard_optimizer *opt);
size_t shard_optimizer_state_count(const shard_optimizer *opt);
/* State array k's name ("exp_avg", ...); NULL when k >= the count. */
const char *shard_optimizer_state_name(const shard_optimizer *opt, size_t k);
/* One step (1-based `step`) over a range of n parameters: p updated from g multiplied by `clip` (the
 * clipping factor, 1: none) on the way in, g left zeroed for the next step's accumulation, state[k] the
 * same range of state array k (state may be NULL when the optimizer has none).  AdamW is
 * shard_adamw_update_clipped's arithmetic, SGD shard_sgd_update's on the clipped gradient. */
shard_status shard_optimizer_update(const shard_optimizer *opt, uint64_t step, float lr, float clip, float *p, float *g,
                                    float *const *state, size_t n);

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
