/* test_dtensor.c — distributed tensors: gather(distribute(x)) == x bitwise for
 * every spec of a 2-D tensor whose dims do not divide by the axis sizes, on
 * every 1-D and 2-D mesh of the world (1 to 8 ranks, 3, 5, 6, 7 included),
 * from a replicated tensor and from one rank, partial specs included; and
 * redistribute between every pair of those specs keeps the tensor bitwise.
 *   test_dtensor --ranks N [--case NAME]     (or under mpiexec) */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "shard/dtensor.h"

static const char *const specs[] = {
    "P()", "P('a')", "P(None, 'a')", "P('a', 'b')", "P('b', 'a')", "P(('a','b'))", "P(None, ('b','a'))",
    "P(None, partial='a')", "P('b', partial='a')", "P('a', partial='b', partial_op='max')",
    "P(partial=('a','b'), partial_op='min')",
};

static void round_trips(test_ctx *t, const char *mesh_text) {
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, mesh_text, &mesh), "mesh %s", mesh_text)) return;
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    size_t shape[2] = {7, 5 + (size_t)t->size};
    shard_tensor *x = NULL, *back = NULL;
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &x), "create x");
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &back), "create back");
    for (size_t i = 0; i < shard_tensor_numel(x); i++) shard_tensor_set(x, i, 0.25 * (double)i - 3.0);
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        shard_spec spec;
        shard_status ps = shard_spec_parse(specs[si], &layout, 2, &spec);
        if (layout.ndim < 2 && strstr(specs[si], "'b'")) continue; /* needs two axes */
        if (!CHECK_OK(t, ps, "parse %s on %s", specs[si], mesh_text)) continue;
        for (int root = -1; root <= 0; root++) {
            shard_dtensor *d = NULL;
            if (!CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &spec, SHARD_MEM_ACTIVATIONS, &d),
                          "create %s", specs[si]))
                continue;
            shard_tensor_fill(back, 99);
            CHECK_OK(t, shard_dtensor_distribute(d, root < 0 || t->rank == root ? x : NULL, root), "distribute %s root %d",
                     specs[si], root);
            CHECK_OK(t, shard_dtensor_gather(d, back, -1), "gather %s", specs[si]);
            shard_tensor_diff diff;
            shard_tensor_compare(back, x, &diff);
            CHECK(t, diff.mismatched_bits == 0,
                  "mesh %s spec %s root %d: %zu elements differ, worst at %zu: %g vs %g", mesh_text, specs[si], root,
                  diff.mismatched_bits, diff.worst_index, diff.worst_a, diff.worst_b);
            shard_dtensor_destroy(d);
        }
    }
    shard_tensor_destroy(x);
    shard_tensor_destroy(back);
    shard_mesh_destroy(mesh);
}

static void case_round_trips(test_ctx *t) {
    char text[64];
    snprintf(text, sizeof text, "a=%d", t->size);
    round_trips(t, text);
    for (int a = 1; a <= t->size; a++)
        if (t->size % a == 0) {
            snprintf(text, sizeof text, "a=%d,b=%d", a, t->size / a);
            round_trips(t, text);
        }
}

/* Every pair of specs: redistribute keeps the global tensor bitwise. */
static void all_pairs(test_ctx *t, const char *mesh_text) {
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, mesh_text, &mesh), "mesh %s", mesh_text)) return;
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    size_t shape[2] = {5 + (size_t)t->size, 3};
    shard_tensor *x = NULL, *back = NULL;
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &x), "create x");
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &back), "create back");
    for (size_t i = 0; i < shard_tensor_numel(x); i++) shard_tensor_set(x, i, 1.5 * (double)i + 0.125);
    size_t nspecs = sizeof specs / sizeof specs[0];
    for (size_t i = 0; i < nspecs; i++)
        for (size_t j = 0; j < nspecs; j++) {
            shard_spec si, sj;
            if (shard_spec_parse(specs[i], &layout, 2, &si) < 0 || shard_spec_parse(specs[j], &layout, 2, &sj) < 0)
                continue; /* needs an axis this mesh lacks */
            shard_dtensor *a = NULL, *b = NULL;
            CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &si, SHARD_MEM_ACTIVATIONS, &a), "create a");
            CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &sj, SHARD_MEM_ACTIVATIONS, &b), "create b");
            if (a && b) {
                CHECK_OK(t, shard_dtensor_distribute(a, x, -1), "distribute %s", specs[i]);
                CHECK_OK(t, shard_dtensor_redistribute(a, b), "%s -> %s", specs[i], specs[j]);
                shard_tensor_fill(back, -7);
                CHECK_OK(t, shard_dtensor_gather(b, back, -1), "gather %s", specs[j]);
                CHECK(t, shard_tensor_equal_bits(back, x), "mesh %s: %s -> %s changed the tensor", mesh_text, specs[i],
                      specs[j]);
            }
            shard_dtensor_destroy(a);
            shard_dtensor_destroy(b);
        }
    shard_tensor_destroy(x);
    shard_tensor_destroy(back);
    shard_mesh_destroy(mesh);
}

static void case_redistribute_all_pairs(test_ctx *t) {
    char text[64];
    snprintf(text, sizeof text, "a=%d", t->size);
    all_pairs(t, text);
    for (int a = 2; a < t->size; a++)
        if (t->size % a == 0) {
            snprintf(text, sizeof text, "a=%d,b=%d", a, t->size / a);
            all_pairs(t, text);
        }
}

static void case_local_shapes(test_ctx *t) {
    shard_mesh *mesh = NULL;
    char text[32];
    snprintf(text, sizeof text, "a=%d", t->size);
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) return;
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    shard_spec spec;
    CHECK_OK(t, shard_spec_parse("P('a')", &layout, 1, &spec), "spec");
    size_t shape[1] = {10};
    shard_dtensor *d = NULL;
    if (CHECK_OK(t, shard_dtensor_create(mesh, SHARD_BF16, 1, shape, &spec, SHARD_MEM_PARAMS, &d), "create")) {
        size_t off, len;
        shard_split_range(10, t->size, t->rank, &off, &len);
        CHECK_EQ_INT(t, d->local->shape[0], len, "local length of 10 over %d ranks", t->size);
        CHECK_EQ_INT(t, d->local_offset[0], off, "local offset");
        shard_dtensor_destroy(d);
    }
    shard_mesh_destroy(mesh);
}

static const test_case cases[] = {
    {"round_trips", case_round_trips},
    {"local_shapes", case_local_shapes},
    {"redistribute_all_pairs", case_redistribute_all_pairs},
};

int main(int argc, char **argv) { return test_main(argc, argv, "test_dtensor", cases, sizeof cases / sizeof cases[0]); }
