/* test_dp_ranges.c — white-box test of the data-parallel state by slab range (shard__dp_get_range /
 * set_range), which checkpoints go through one parameter at a time: every zero stage, units whose pieces
 * split a parameter between ranks, and ranks holding none of a parameter.  It includes data_parallel.c
 * itself, to place a caller's buffer right before this rank's moments: a rank holding nothing of a
 * parameter once got a displacement past the range, and the communicator took the receive buffer for
 * one reaching into its send buffer (a false "overlaps" error, depending on where malloc put them).
 *   test_dp_ranges --ranks N */
#include "../src/parallel/data_parallel.c"

#include <stdio.h>

#include "check.h"
#include "models/model_impl.h"

/* Two units: {a: 8, b: 4000} and {c: 5, d: 3 x 7}; the model's parameters only, no layers. */
typedef struct fake_model {
    shard_params *p;
    shard_model m;
} fake_model;

static int make_model(test_ctx *t, fake_model *f) {
    shard_param_info info[4] = {{.name = "a", .ndim = 1, .shape = {8}},
                                {.name = "b", .ndim = 1, .shape = {4000}},
                                {.name = "c", .ndim = 1, .shape = {5}},
                                {.name = "d", .ndim = 2, .shape = {3, 7}}};
    size_t first[3] = {0, 2, 4};
    memset(f, 0, sizeof *f);
    return CHECK_OK(t, shard_params_create(info, 4, SHARD_MEM_PARAMS, &f->p), "params") &&
           CHECK_OK(t, shard_model_setup_units(&f->m, f->p, first, 2), "units");
}

static float pattern(int which, size_t i) { return (float)(which * 100000 + (int)i) * 0.5f; }

static void case_roundtrip(test_ctx *t) {
    for (int zero = 0; zero <= 3; zero++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            fake_model f;
            if (!make_model(t, &f)) return;
            shard_dp *dp = NULL;
            if (!CHECK_OK(t, shard__dp_create(t->comm, &f.m, zero, 1 << 20, SHARD_F32, 1, bf16 ? SHARD_BF16 : SHARD_F32, &dp),
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
                          bad == SIZE_MAX ? 0.0 : (double)got[bad], bad == SIZE_MAX ? 0.0 : (double)pattern(w, pi->offset + bad));
                }
            }
            /* NULL: zeros */
            const shard_param_info *d = &f.p->info[3];
            CHECK_OK(t, shard__dp_set_range(dp, 2, d->offset, d->numel, NULL), "zeros");
            CHECK_OK(t, shard__dp_get_range(dp, 2, d->offset, d->numel, got), "get zeros");
            for (size_t i = 0; i < d->numel; i++) CHECK(t, got[i] == 0, "zero %d: d's exp_avg_sq %zu = %g", zero, i, (double)got[i]);
            if (bf16 && zero < 3) /* the compute copy follows the values */
                CHECK(t, dp->compute16[d->offset + 2] == shard_bf16_from_f32(pattern(0, d->offset + 2)), "zero %d: bf16 copy",
                      zero);
            shard__dp_destroy(dp);
            shard_params_destroy(f.p);
            shard__model_free_units(&f.m);
        }
}

/* A's 8 floats gathered into a buffer that this rank's exp_avg pieces follow directly in memory. */
static void case_adjacent_buffers(test_ctx *t) {
    fake_model f;
    if (!make_model(t, &f)) return;
    shard_dp *dp = NULL;
    if (!CHECK_OK(t, shard__dp_create(t->comm, &f.m, 1, 1 << 20, SHARD_F32, 1, SHARD_F32, &dp), "dp")) return;
    const shard_param_info *a = &f.p->info[0];
    float *block = calloc(a->numel + dp->shard_total + 16, sizeof(float)), *saved = dp->exp_avg;
    if (CHECK(t, block != NULL, "memory")) {
        memcpy(block + a->numel, dp->exp_avg, dp->shard_total * sizeof(float));
        dp->exp_avg = block + a->numel;
        CHECK_OK(t, shard__dp_get_range(dp, 1, a->offset, a->numel, block), "get a's exp_avg next to the pieces");
        dp->exp_avg = saved;
    }
    free(block);
    shard__dp_destroy(dp);
    shard_params_destroy(f.p);
    shard__model_free_units(&f.m);
}

static const test_case cases[] = {{"roundtrip", case_roundtrip}, {"adjacent_buffers", case_adjacent_buffers}};

int main(int argc, char **argv) { return test_main(argc, argv, "test_dp_ranges", cases, sizeof cases / sizeof cases[0]); }
