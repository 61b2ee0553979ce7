/* optim.c — AdamW's default settings and the warm-up + cosine learning-rate schedule (see optim.h).
 * The updates themselves, clipping's sum of squares and scaling are kernels: src/kernels/optim_kernels.c. */
#include "shard/optim.h"

#include <math.h>

shard_adamw_config shard_adamw_defaults(void) { return (shard_adamw_config){0.9f, 0.999f, 1e-8f, 0.01f}; }

float shard_lr_at(const shard_lr_schedule *s, uint64_t step) {
    if (s->warmup && step <= s->warmup) return s->lr_max * (float)step / (float)s->warmup;
    if (step >= s->total || s->total <= s->warmup) return s->total > s->warmup ? s->lr_min : s->lr_max;
    double progress = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    const double pi = 3.14159265358979323846;
    return (float)(s->lr_min + 0.5 * (1.0 + cos(pi * progress)) * (s->lr_max - s->lr_min));
}
