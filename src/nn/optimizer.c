/* optimizer.c — the optimizer interface (optim.h): AdamW and SGD behind one
 * object that names its state arrays, so a strategy allocates, shards and
 * checkpoints whichever runs without knowing it; AdamW's defaults; and the
 * warm-up + cosine learning-rate schedule.  The updates call the kernels of
 * src/kernels/optim_kernels.c unchanged, so training through the interface
 * gives the kernels' bits. */
#include "shard/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

shard_adamw_config shard_adamw_defaults(void) { return (shard_adamw_config){0.9f, 0.999f, 1e-8f, 0.01f}; }

float shard_lr_at(const shard_lr_schedule *s, uint64_t step) {
    if (s->warmup && step <= s->warmup) return s->lr_max * (float)step / (float)s->warmup;
    if (step >= s->total || s->total <= s->warmup) return s->total > s->warmup ? s->lr_min : s->lr_max;
    double progress = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    const double pi = 3.14159265358979323846;
    return (float)(s->lr_min + 0.5 * (1.0 + cos(pi * progress)) * (s->lr_max - s->lr_min));
}

struct shard_optimizer {
    shard_optimizer_options o;
    size_t states;
};

typedef struct kind_def {
    const char *name;
    const char *const *state_names;
    size_t (*state_count)(const shard_optimizer_options *o);
    shard_status (*check)(const shard_optimizer_options *o);
    void (*update)(const shard_optimizer_options *o, uint64_t step, float lr, float clip, float *p, float *g,
                   float *const *state, size_t n);
} kind_def;

/* a hyperparameter PyTorch refuses: below lo, at or above hi (hi_open) or past it, NaN or infinite */
static shard_status check_range(const char *optimizer, const char *what, float x, float lo, float hi, int hi_open) {
    if (isfinite(x) && x >= lo && (hi_open ? x < hi : x <= hi)) return SHARD_OK;
    return shard_error(SHARD_ERR_INVALID_ARG, "%s: %s %g is invalid: give a number in [%g, %g%s", optimizer, what,
                       (double)x, (double)lo, (double)hi, hi_open ? ")" : "]");
}

static const char *const adamw_states[] = {"exp_avg", "exp_avg_sq"};

static size_t adamw_state_count(const shard_optimizer_options *o) {
    (void)o;
    return 2;
}

static shard_status adamw_check(const shard_optimizer_options *o) {
    SHARD_CHECK(check_range("adamw", "beta1", o->adamw.beta1, 0, 1, 1));
    SHARD_CHECK(check_range("adamw", "beta2", o->adamw.beta2, 0, 1, 1));
    SHARD_CHECK(check_range("adamw", "eps", o->adamw.eps, 0, INFINITY, 1));
    return check_range("adamw", "weight decay", o->adamw.weight_decay, 0, INFINITY, 1);
}

static void adamw_update(const shard_optimizer_options *o, uint64_t step, float lr, float clip, float *p, float *g,
                         float *const *state, size_t n) {
    shard_adamw_update_clipped(&o->adamw, step, lr, clip, p, g, state[0], state[1], n);
}

static const char *const sgd_states[] = {"momentum_buffer"};

static size_t sgd_state_count(const shard_optimizer_options *o) { return o->sgd.momentum != 0 ? 1 : 0; }

static shard_status sgd_check(const shard_optimizer_options *o) {
    SHARD_CHECK(check_range("sgd", "momentum", o->sgd.momentum, 0, INFINITY, 1));
    return check_range("sgd", "weight decay", o->sgd.weight_decay, 0, INFINITY, 1);
}

/* The clipping factor applied as AdamW applies it (g * clip, skipped at 1), then the kernel, then g zeroed. */
static void sgd_update(const shard_optimizer_options *o, uint64_t step, float lr, float clip, float *p, float *g,
                       float *const *state, size_t n) {
    if (clip != 1.0f) shard_scale(g, n, clip);
    shard_sgd_update(&o->sgd, step, lr, p, g, o->sgd.momentum != 0 ? state[0] : NULL, n);
    memset(g, 0, n * sizeof *g);
}

static const kind_def kinds[] = {
    [SHARD_OPTIMIZER_ADAMW] = {.name = "adamw",
                               .state_names = adamw_states,
                               .state_count = adamw_state_count,
                               .check = adamw_check,
                               .update = adamw_update},
    [SHARD_OPTIMIZER_SGD] = {.name = "sgd",
                             .state_names = sgd_states,
                             .state_count = sgd_state_count,
                             .check = sgd_check,
                             .update = sgd_update},
};
enum { KINDS = sizeof kinds / sizeof kinds[0] };

shard_optimizer_options shard_optimizer_defaults(shard_optimizer_kind kind) {
    return (shard_optimizer_options){.struct_size = sizeof(shard_optimizer_options),
                                     .kind = kind,
                                     .adamw = shard_adamw_defaults(),
                                     .sgd = {.momentum = 0, .weight_decay = 0}};
}

shard_status shard_optimizer_find(const char *name, shard_optimizer_kind *out) {
    for (size_t k = 0; name && k < KINDS; k++)
        if (strcmp(name, kinds[k].name) == 0) {
            *out = (shard_optimizer_kind)k;
            return SHARD_OK;
        }
    return shard_error(SHARD_ERR_INVALID_ARG, "optimizer '%s' is unknown: give adamw or sgd", name ? name : "(null)");
}

shard_status shard_optimizer_create(const shard_optimizer_options *options, shard_optimizer **out) {
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_optimizer_create: no place for the optimizer");
    *out = NULL;
    if (!options || options->struct_size < sizeof(shard_optimizer_options))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_optimizer_create: options missing or from an older header "
                           "(struct_size)");
    if ((unsigned)options->kind >= KINDS)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_optimizer_create: kind %d is unknown: give "
                           "SHARD_OPTIMIZER_ADAMW or SHARD_OPTIMIZER_SGD",
                           (int)options->kind);
    const kind_def *def = &kinds[options->kind];
    SHARD_CHECK(def->check(options));
    shard_optimizer *opt = calloc(1, sizeof *opt);
    if (!opt) return shard_error(SHARD_ERR_NO_MEMORY, "optimizer: out of memory");
    opt->o = *options;
    opt->o.struct_size = sizeof opt->o;
    opt->states = def->state_count(options);
    *out = opt;
    return SHARD_OK;
}

void shard_optimizer_destroy(shard_optimizer *opt) { free(opt); }

const char *shard_optimizer_name(const shard_optimizer *opt) { return kinds[opt->o.kind].name; }

const shard_optimizer_options *shard_optimizer_options_of(const shard_optimizer *opt) { return &opt->o; }

size_t shard_optimizer_state_count(const shard_optimizer *opt) { return opt->states; }

const char *shard_optimizer_state_name(const shard_optimizer *opt, size_t k) {
    return k < opt->states ? kinds[opt->o.kind].state_names[k] : NULL;
}

shard_status shard_optimizer_update(const shard_optimizer *opt, uint64_t step, float lr, float clip, float *p, float *g,
                                    float *const *state, size_t n) {
    if (!opt || (n && (!p || !g)))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_optimizer_update: %s missing",
                           !opt ? "the optimizer" : "p or g");
    for (size_t k = 0; k < opt->states; k++)
        if (n && (!state || !state[k]))
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: state array '%s' missing (it declares %zu)",
                               shard_optimizer_name(opt), kinds[opt->o.kind].state_names[k], opt->states);
    kinds[opt->o.kind].update(&opt->o, step, lr, clip, p, g, state, n);
    return SHARD_OK;
}
