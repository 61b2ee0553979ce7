/* test_dp_ranges.c — white-box test of the data-parallel state by slab range (shard__dp_get_range /
 * set_range), which checkpoints go through one parameter at a time: every zero stage, units whose pieces
 * split a parameter between ranks, and ranks holding none of a parameter; the state arrays are the
 * optimizer's (AdamW's two, SGD with momentum's one, plain SGD's none), an array past them refused.  It includes data_parallel.c
 * itself, to place a caller's buffer right before this rank's moments: a rank holding nothing of a
 * parameter once got a displacement past the range, and the communicator took the receive buffer for
 * one reaching into its send buffer (a false "overlaps" error, depending on where malloc put them).
 *   test_dp_ranges --ranks N */
#include "../src/parallel/data_parallel.c"

#include <stdio.h>

#include "check.h"
#include "models/model_impl.h"

/* Two units: {a: 8, b: 4000} and {c: 5, d: 3 x 7}; the model's parameters only, no layers; and an
 * optimizer (AdamW unless make_model_with says otherwise). */
typedef struct fake_model {
    shard_params *p;
    shard_model m;
    shard_optimizer *opt;
} fake_model;

static int make_model_with(test_ctx *t, fake_model *f, shard_optimizer_kind kind, float momentum) {
    shard_param_info info[4] = {{.name = "a", .ndim = 1, .shape = {8}},
                                {.name = "b", .ndim = 1, .shape = {4000}},
                                {.name = "c", .ndim = 1, .shape = {5}},
                                {.name = "d", .ndim = 2, .shape = {3, 7}}};
    size_t first[3] = {0, 2, 4};
    memset(f, 0, sizeof *f);
    shard_optimizer_options o = shard_optimizer_defaults(kind);
    o.sgd.momentum = momentum;
    return CHECK_OK(t, shard_params_create(info, 4, SHARD_MEM_PARAMS, &f->p), "params") &&
        CHECK_OK(t, shard_model_setup_units(&f->m, f->p, first, 2), "units") &&
        CHECK_OK(t, shard_optimizer_create(&o, &f->opt), "optimizer");
}

static int make_model(test_ctx *t, fake_model *f) { return make_model_with(t, f, SHARD_OPTIMIZER_ADAMW, 0); }

static void free_model(fake_model *f) {
    shard_params_destroy(f->p);
    shard__model_free_units(&f->m);
    shard_optimizer_destroy(f->opt);
}

static float pattern(int which, size_t i) { return (float)(which * 100000 + (int)i) * 0.5f; }

static void case_roundtrip(test_ctx *t) {
    for (int zero = 0; zero <= 3; zero++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            fake_model f;
            if (!make_model(t, &f)) return;
            shard_dp *dp = NULL;
            if (!CHECK_OK(t,
                          shard__dp_create(&(shard_dp_comms){.dense = t->comm}, &f.m, zero, 1 << 20, SHARD_F32, 1,
                                           bf16 ? SHARD_BF16 : SHARD_F32, f.opt, &dp),
                          "dp zero %d", zero))
                return;
            float buf[4000], got[4000];
            for (size_t k = 0; k < f.p->count; k++) { /* every rank passes the same values */
                const shard_param_info *pi = &f.p->info[k];
                for (int w = 0; w < 3; w++) {
                    for (size_t i = 0; i < pi->numel; i++) buf[i] = pattern(w, pi->offset + i);
                    CHECK_OK(t, shard__dp_set_range(dp, w, pi->offset, pi->numel, buf), "set %s", pi->name);
                }
            }
            for (size_t k = 0; k < f.p->count; k++) {
                const shard_param_info *pi = &f.p->info[k];
                for (int w = 0; w < 3; w++) {
                    memset(got, 0xff, sizeof got);
                    CHECK_OK(t, shard__dp_get_range(dp, w, pi->offset, pi->numel, got), "get %s", pi->name);
                    size_t bad = SIZE_MAX;
                    for (size_t i = 0; i < pi->numel && bad == SIZE_MAX; i++)
                        if (got[i] != pattern(w, pi->offset + i)) bad = i;
                    CHECK(t, bad == SIZE_MAX, "zero %d: %s array %d element %zu: %g, want %g", zero, pi->name, w, bad,
                          bad == SIZE_MAX ? 0.0 : (double)got[bad],
                          bad == SIZE_MAX ? 0.0 : (double)pattern(w, pi->offset + bad));
                }
            }
            /* NULL: zeros */
            const shard_param_info *d = &f.p->info[3];
            CHECK_OK(t, shard__dp_set_range(dp, 2, d->offset, d->numel, NULL), "zeros");
            CHECK_OK(t, shard__dp_get_range(dp, 2, d->offset, d->numel, got), "get zeros");
            for (size_t i = 0; i < d->numel; i++)
                CHECK(t, got[i] == 0, "zero %d: d's exp_avg_sq %zu = %g", zero, i, (double)got[i]);
            if (bf16 && zero < 3) /* the compute copy follows the values */
                CHECK(t,
                      shard__precision_copy(&dp->prec, d->offset + 2)[0] ==
                          shard_bf16_from_f32(pattern(0, d->offset + 2)),
                      "zero %d: bf16 copy", zero);
            shard__dp_destroy(dp);
            free_model(&f);
        }
}

/* A's 8 floats gathered into a buffer that this rank's exp_avg pieces follow directly in memory. */
static void case_adjacent_buffers(test_ctx *t) {
    fake_model f;
    if (!make_model(t, &f)) return;
    shard_dp *dp = NULL;
    if (!CHECK_OK(t,
                  shard__dp_create(&(shard_dp_comms){.dense = t->comm}, &f.m, 1, 1 << 20, SHARD_F32, 1, SHARD_F32,
                                   f.opt, &dp),
                  "dp"))
        return;
    const shard_param_info *a = &f.p->info[0];
    float *block = calloc(a->numel + dp->shard_total + 16, sizeof(float)), *saved = dp->state[0];
    if (CHECK(t, block != NULL, "memory")) {
        memcpy(block + a->numel, dp->state[0], dp->shard_total * sizeof(float));
        dp->state[0] = block + a->numel;
        CHECK_OK(t, shard__dp_get_range(dp, 1, a->offset, a->numel, block), "get a's exp_avg next to the pieces");
        dp->state[0] = saved;
    }
    free(block);
    shard__dp_destroy(dp);
    free_model(&f);
}

/* SGD: with momentum one state array (its buffer round-trips on every stage), plain none; an array past
 * the optimizer's is refused by number, with no rank left in a collective. */
static void case_sgd_arrays(test_ctx *t) {
    for (int plain = 0; plain < 2; plain++)
        for (int zero = 0; zero <= 3; zero += 3) {
            fake_model f;
            if (!make_model_with(t, &f, SHARD_OPTIMIZER_SGD, plain ? 0.0f : 0.9f)) return;
            shard_dp *dp = NULL;
            if (!CHECK_OK(t,
                          shard__dp_create(&(shard_dp_comms){.dense = t->comm}, &f.m, zero, 1 << 20, SHARD_F32, 1,
                                           SHARD_F32, f.opt, &dp),
                          "dp"))
                return;
            CHECK_EQ_INT(t, (int64_t)dp->n_states, plain ? 0 : 1, "sgd state arrays");
            const shard_param_info *b = &f.p->info[1];
            float buf[4000], got[4000];
            for (size_t i = 0; i < b->numel; i++) buf[i] = pattern(1, i);
            if (!plain) {
                CHECK_OK(t, shard__dp_set_range(dp, 1, b->offset, b->numel, buf), "set b's momentum_buffer");
                CHECK_OK(t, shard__dp_get_range(dp, 1, b->offset, b->numel, got), "get b's momentum_buffer");
                CHECK(t, memcmp(buf, got, b->numel * sizeof(float)) == 0, "zero %d: b's momentum_buffer differs", zero);
            }
            /* the array after the state arrays is the gradient the update reads (a live migration's) */
            int grad = plain ? 1 : 2, past = grad + 1;
            CHECK_OK(t, shard__dp_set_range(dp, grad, b->offset, b->numel, buf), "set b's gradient");
            CHECK_OK(t, shard__dp_get_range(dp, grad, b->offset, b->numel, got), "get b's gradient");
            CHECK(t, memcmp(buf, got, b->numel * sizeof(float)) == 0, "zero %d: b's gradient differs", zero);
            shard_status s = shard__dp_get_range(dp, past, b->offset, b->numel, got);
            CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "sgd optimizer's state arrays"),
                  "array %d of %s SGD: %d (%s)", past, plain ? "plain" : "momentum", (int)s, shard_last_error());
            CHECK(t, shard__dp_set_range(dp, -1, b->offset, b->numel, buf) == SHARD_ERR_INVALID_ARG, "array -1 set");
            shard__dp_destroy(dp);
            free_model(&f);
        }
}

static const test_case cases[] = {
    {"roundtrip", case_roundtrip}, {"adjacent_buffers", case_adjacent_buffers}, {"sgd_arrays", case_sgd_arrays}};

int main(int argc, char **argv) {
    return test_main(argc, argv, "test_dp_ranges", cases, sizeof cases / sizeof cases[0]);
}
