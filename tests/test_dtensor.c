/* test_dtensor.c — distributed tensors: gather(distribute(x)) == x bitwise for
 * every spec of a 2-D tensor whose dims do not divide by the axis sizes, on
 * every 1-D and 2-D mesh of the world (1 to 8 ranks, 3, 5, 6, 7 included),
 * from a replicated tensor and from one rank, partial specs included (sum,
 * max, min, avg: the values are exact in a few bits, so an average of equal
 * copies gives them back bitwise), with
 * the bytes of distribute-from-one-rank (broadcast or scatter) and
 * gather-to-one-rank checked against their formulas; and
 * redistribute between every pair of those specs (3-D meshes too) keeps the
 * tensor bitwise and sends exactly the bytes its plan counts; the named
 * transitions (all_gather, slice, all_reduce, reduce_scatter, all_to_all)
 * send what their formulas say; 3-D tensors whose boxes are strided blocks on
 * some ranks only.
 *   test_dtensor --ranks N [--case NAME]     (or under mpiexec) */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "shard/dtensor.h"

static const char *const specs[] = {
    "P()",
    "P('a')",
    "P(None, 'a')",
    "P('a', 'b')",
    "P('b', 'a')",
    "P(('a','b'))",
    "P(None, ('b','a'))",
    "P(None, partial='a')",
    "P('b', partial='a')",
    "P('a', partial='b', partial_op='max')",
    "P(partial=('a','b'), partial_op='min')",
    "P(None, 'b', partial='a', partial_op='avg')",
};

/* Create every axis-set communicator now, so that splits do not count as traffic later. */
static void warm_axis_comms(test_ctx *t, shard_mesh *mesh) {
    for (unsigned mask = 1; mask < (1u << shard_mesh_ndim(mesh)); mask++) {
        shard_comm *c = NULL;
        CHECK_OK(t, shard_mesh_axes_comm_mask(mesh, mask, &c), "axes comm 0x%x", mask);
    }
}

static void my_coords(shard_mesh *mesh, int *coords) {
    for (int k = 0; k < shard_mesh_ndim(mesh); k++) coords[k] = shard_mesh_coord(mesh, k);
}

static size_t block_numel(const shard_spec *spec, const shard_mesh_layout *layout, const size_t *shape, const int *c) {
    size_t n = 1, off, len;
    for (int d = 0; d < spec->ndim; d++) {
        shard_spec_local_range(spec, layout, shape, c, d, &off, &len);
        n *= len;
    }
    return n;
}

/* Bytes this rank should send to distribute from `root`: a broadcast when no
 * dim is split, else the root sends each other rank that keeps the value its
 * block (a pending sum keeps it at coordinate 0 of the partial axes only). */
static uint64_t distribute_bytes(const shard_spec *spec, const shard_mesh_layout *layout, const size_t *shape, int me,
                                 int root, int n) {
    if (root < 0 || me != root) return 0;
    unsigned all = (1u << layout->ndim) - 1, split = shard_spec_split_axes(spec);
    if (!split) return (uint64_t)shape[0] * shape[1] * 4 * (uint64_t)(n - 1);
    uint64_t total = 0;
    for (int q = 0; q < n; q++) {
        int c[SHARD_MESH_MAX_AXES] = {0}, keeps = 1;
        shard_mesh_layout_unravel(layout, all, q, c);
        for (int k = 0; k < layout->ndim; k++)
            if (spec->partial_op == SHARD_OP_SUM && (spec->partial_mask & (1u << k)) && c[k]) keeps = 0;
        if (q != root && keeps) total += block_numel(spec, layout, shape, c) * 4;
    }
    return total;
}

/* Bytes this rank should send to gather on `root`: the pending reduction's
 * all_reduce, then, from the rank at coordinate 0 of every non-splitting
 * axis, its block when the root's block is another one. */
static uint64_t gather_bytes(const shard_spec *spec, const shard_mesh_layout *layout, const size_t *shape, int me,
                             int root) {
    unsigned all = (1u << layout->ndim) - 1, split = shard_spec_split_axes(spec);
    int c[SHARD_MESH_MAX_AXES] = {0}, rc[SHARD_MESH_MAX_AXES] = {0};
    shard_mesh_layout_unravel(layout, all, me, c);
    shard_mesh_layout_unravel(layout, all, root, rc);
    uint64_t local = block_numel(spec, layout, shape, c), total = 0;
    if (spec->partial_mask) { /* ring all_reduce over the partial axes */
        int m = 1, idx = 0;
        for (int k = 0; k < layout->ndim; k++)
            if (spec->partial_mask & (1u << k)) m *= layout->sizes[k], idx = idx * layout->sizes[k] + c[k];
        size_t off, len;
        shard_split_range((size_t)local, m, idx, &off, &len);
        if (m > 1) total += (local - len + (uint64_t)len * (uint64_t)(m - 1)) * 4;
    }
    int sender = me != root, same = 1;
    for (int k = 0; k < layout->ndim; k++) {
        if (!(split & (1u << k)) && c[k]) sender = 0;
        if ((split & (1u << k)) && c[k] != rc[k]) same = 0;
    }
    return total + (sender && !same ? local * 4 : 0);
}

static void round_trips(test_ctx *t, const char *mesh_text) {
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, mesh_text, &mesh), "mesh %s", mesh_text)) return;
    warm_axis_comms(t, mesh);
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    size_t shape[2] = {7, 5 + (size_t)t->size};
    shard_tensor *x = NULL, *back = NULL;
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &x), "create x");
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &back), "create back");
    for (size_t i = 0; i < shard_tensor_numel(x); i++) shard_tensor_set(x, i, 0.25 * (double)i - 3.0);
    int roots[3] = {-1, 0, t->size - 1};
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        shard_spec spec;
        shard_status ps = shard_spec_parse(specs[si], &layout, 2, &spec);
        if (layout.ndim < 2 && strstr(specs[si], "'b'")) continue; /* needs two axes */
        if (!CHECK_OK(t, ps, "parse %s on %s", specs[si], mesh_text)) continue;
        for (int ri = 0; ri < 3; ri++) {
            int root = roots[ri];
            shard_dtensor *d = NULL;
            if (!CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &spec, SHARD_MEM_ACTIVATIONS, &d),
                          "create %s", specs[si]))
                continue;
            uint64_t sent = shard_mesh_bytes_sent(mesh);
            CHECK_OK(t, shard_dtensor_distribute(d, root < 0 || t->rank == root ? x : NULL, root),
                     "distribute %s root %d", specs[si], root);
            sent = shard_mesh_bytes_sent(mesh) - sent;
            uint64_t want = distribute_bytes(&spec, &layout, shape, t->rank, root, t->size);
            CHECK(t, sent == want, "mesh %s spec %s: distribute from %d sent %llu bytes, want %llu", mesh_text,
                  specs[si], root, (unsigned long long)sent, (unsigned long long)want);
            /* gather to everyone, and to the root */
            shard_tensor_fill(back, 99);
            CHECK_OK(t, shard_dtensor_gather(d, back, -1), "gather %s", specs[si]);
            shard_tensor_diff diff;
            shard_tensor_compare(back, x, &diff);
            CHECK(t, diff.mismatched_bits == 0, "mesh %s spec %s root %d: %zu elements differ, worst at %zu: %g vs %g",
                  mesh_text, specs[si], root, diff.mismatched_bits, diff.worst_index, diff.worst_a, diff.worst_b);
            int to = root < 0 ? t->size / 2 : root;
            shard_tensor_fill(back, 99);
            sent = shard_mesh_bytes_sent(mesh);
            CHECK_OK(t, shard_dtensor_gather(d, t->rank == to ? back : NULL, to), "gather %s to %d", specs[si], to);
            sent = shard_mesh_bytes_sent(mesh) - sent;
            want = gather_bytes(&spec, &layout, shape, t->rank, to);
            CHECK(t, sent == want, "mesh %s spec %s: gather to %d sent %llu bytes, want %llu", mesh_text, specs[si], to,
                  (unsigned long long)sent, (unsigned long long)want);
            if (t->rank == to)
                CHECK(t, shard_tensor_equal_bits(back, x), "mesh %s spec %s: gather to %d differs", mesh_text,
                      specs[si], to);
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

/* Every pair of specs: redistribute keeps the global tensor bitwise, and
 * each rank sends exactly the bytes its plan says. */
static void all_pairs(test_ctx *t, const char *mesh_text) {
    static const char *const more_specs[] = {
        "P(('a','c'), 'b')", "P('c', partial=('a','b'))", "P(None, ('c','a'), partial='b', partial_op='max')",
        "P(('c','b','a'))",  "P('b', 'c', partial='a')",
    };
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, mesh_text, &mesh), "mesh %s", mesh_text)) return;
    warm_axis_comms(t, mesh);
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    int coords[SHARD_MESH_MAX_AXES];
    my_coords(mesh, coords);
    size_t shape[2] = {5 + (size_t)t->size, 3 + (size_t)t->size / 2};
    shard_tensor *x = NULL, *back = NULL;
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &x), "create x");
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &back), "create back");
    for (size_t i = 0; i < shard_tensor_numel(x); i++) shard_tensor_set(x, i, 1.5 * (double)i + 0.125);
    const char *list[32];
    size_t nspecs = 0;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) list[nspecs++] = specs[i];
    for (size_t i = 0; layout.ndim == 3 && i < sizeof more_specs / sizeof more_specs[0]; i++)
        list[nspecs++] = more_specs[i];
    for (size_t i = 0; i < nspecs; i++)
        for (size_t j = 0; j < nspecs; j++) {
            shard_spec si, sj;
            if (shard_spec_parse(list[i], &layout, 2, &si) < 0 || shard_spec_parse(list[j], &layout, 2, &sj) < 0)
                continue; /* needs an axis this mesh lacks */
            shard_dtensor *a = NULL, *b = NULL;
            CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &si, SHARD_MEM_ACTIVATIONS, &a), "create a");
            CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &sj, SHARD_MEM_ACTIVATIONS, &b), "create b");
            shard_redistribute_plan plan;
            CHECK_OK(t, shard_redistribute_plan_make(&layout, SHARD_F32, 2, shape, &si, &sj, &plan), "plan");
            if (a && b) {
                CHECK_OK(t, shard_dtensor_distribute(a, x, -1), "distribute %s", list[i]);
                uint64_t sent = shard_mesh_bytes_sent(mesh);
                CHECK_OK(t, shard_dtensor_redistribute(a, b), "%s -> %s", list[i], list[j]);
                sent = shard_mesh_bytes_sent(mesh) - sent;
                uint64_t planned = shard_redistribute_plan_bytes(&plan, -1, coords);
                CHECK(t, sent == planned, "mesh %s: %s -> %s sent %llu bytes, the plan says %llu", mesh_text, list[i],
                      list[j], (unsigned long long)sent, (unsigned long long)planned);
                shard_tensor_fill(back, -7);
                CHECK_OK(t, shard_dtensor_gather(b, back, -1), "gather %s", list[j]);
                CHECK(t, shard_tensor_equal_bits(back, x), "mesh %s: %s -> %s changed the tensor", mesh_text, list[i],
                      list[j]);
            }
            shard_dtensor_destroy(a);
            shard_dtensor_destroy(b);
        }
    shard_tensor_destroy(x);
    shard_tensor_destroy(back);
    shard_mesh_destroy(mesh);
}

/* 3-D tensors: boxes that are strided blocks for some ranks and not for others
 * (every member of an exchange must still choose the same collective). */
static void case_three_dims(test_ctx *t) {
    static const char *const specs3[] = {
        "P(None, 'a', 'b')",
        "P(None, None, 'a')",
        "P(('a','b'))",
        "P('b', None, 'a')",
        "P(None, ('b','a'))",
        "P('a', 'b')",
        "P(None, 'b', None, partial='a')",
        "P()",
    };
    for (int a = 1; a <= t->size; a++) {
        if (t->size % a) continue;
        char text[64];
        snprintf(text, sizeof text, "a=%d,b=%d", a, t->size / a);
        shard_mesh *mesh = NULL;
        if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh %s", text)) return;
        warm_axis_comms(t, mesh);
        shard_mesh_layout layout;
        shard_mesh_layout_of(mesh, &layout);
        int coords[SHARD_MESH_MAX_AXES];
        my_coords(mesh, coords);
        size_t shape[3] = {5, 9, 3};
        shard_tensor *x = NULL, *back = NULL;
        CHECK_OK(t, shard_tensor_create(SHARD_F32, 3, shape, SHARD_MEM_OTHER, &x), "x");
        CHECK_OK(t, shard_tensor_create(SHARD_F32, 3, shape, SHARD_MEM_OTHER, &back), "back");
        for (size_t i = 0; i < shard_tensor_numel(x); i++) shard_tensor_set(x, i, (double)i * 0.5 - 11.0);
        size_t n = sizeof specs3 / sizeof specs3[0];
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                shard_spec si, sj;
                if (shard_spec_parse(specs3[i], &layout, 3, &si) < 0 ||
                    shard_spec_parse(specs3[j], &layout, 3, &sj) < 0) {
                    CHECK(t, 0, "parse %s / %s: %s", specs3[i], specs3[j], shard_last_error());
                    continue;
                }
                shard_dtensor *da = NULL, *db = NULL;
                shard_redistribute_plan plan;
                CHECK_OK(t, shard_redistribute_plan_make(&layout, SHARD_F32, 3, shape, &si, &sj, &plan), "plan");
                CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 3, shape, &si, SHARD_MEM_ACTIVATIONS, &da), "a");
                CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 3, shape, &sj, SHARD_MEM_ACTIVATIONS, &db), "b");
                if (da && db) {
                    CHECK_OK(t, shard_dtensor_distribute(da, x, -1), "distribute");
                    uint64_t sent = shard_mesh_bytes_sent(mesh);
                    CHECK_OK(t, shard_dtensor_redistribute(da, db), "%s: %s -> %s", text, specs3[i], specs3[j]);
                    sent = shard_mesh_bytes_sent(mesh) - sent;
                    CHECK(t, sent == shard_redistribute_plan_bytes(&plan, -1, coords), "%s: %s -> %s bytes", text,
                          specs3[i], specs3[j]);
                    CHECK_OK(t, shard_dtensor_gather(db, back, -1), "gather");
                    CHECK(t, shard_tensor_equal_bits(back, x), "mesh %s: %s -> %s changed the tensor", text, specs3[i],
                          specs3[j]);
                }
                shard_dtensor_destroy(da);
                shard_dtensor_destroy(db);
            }
        shard_tensor_destroy(x);
        shard_tensor_destroy(back);
        shard_mesh_destroy(mesh);
    }
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
    /* a 3-D mesh: c the smallest factor > 1, b the next, a the rest (size-1 axes included) */
    int c = 1, b = 1, n = t->size;
    for (int f = 2; f <= n && c == 1; f++)
        if (n % f == 0) c = f;
    n /= c;
    for (int f = 2; f <= n && b == 1; f++)
        if (n % f == 0) b = f;
    snprintf(text, sizeof text, "a=%d,b=%d,c=%d", n / b, b, c);
    all_pairs(t, text);
}

/* The named transitions send what their collective's formula says, on 1-D
 * meshes of the world with rows and columns that do not divide. */
typedef struct transition {
    const char *from, *to;
    shard_redistribute_kind kind;
} transition;

static void case_transition_bytes(test_ctx *t) {
    static const transition cases[] = {
        {"P('a')", "P()", SHARD_REDIST_ALL_GATHER},
        {"P()", "P('a')", SHARD_REDIST_SLICE},
        {"P(partial='a')", "P()", SHARD_REDIST_ALL_REDUCE},
        {"P(partial='a')", "P('a')", SHARD_REDIST_REDUCE_SCATTER},
        {"P('a', None)", "P(None, 'a')", SHARD_REDIST_ALL_TO_ALL},
    };
    char text[32];
    snprintf(text, sizeof text, "a=%d", t->size);
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) return;
    warm_axis_comms(t, mesh);
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    int n = t->size, r = t->rank;
    size_t rows = 2 * (size_t)n + 3, cols = (size_t)n + 2, total = rows * cols, es = 4;
    size_t shape[2] = {rows, cols}, my_rows, my_cols, off;
    shard_split_range(rows, n, r, &off, &my_rows);
    shard_split_range(cols, n, r, &off, &my_cols);
    uint64_t expect[] = {
        (uint64_t)(n - 1) * my_rows * cols * es,                      /* all_gather: my block to each other rank */
        0,                                                            /* slice: nothing */
        shard_cost_all_reduce_bytes(total, (size_t)n, (size_t)r, es), /* all_reduce: ring (cost.h) */
        (uint64_t)(total - my_rows * cols) * es,                      /* reduce_scatter: every other rank's rows */
        (uint64_t)my_rows * (cols - my_cols) * es,                    /* all_to_all: my rows of their columns */
    };
    if (n == 1) memset(expect, 0, sizeof expect);
    shard_tensor *x = NULL, *back = NULL;
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &x), "create x");
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &back), "create back");
    for (size_t i = 0; i < total; i++) shard_tensor_set(x, i, (double)(i % 97) - 40.0);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        shard_spec from, to;
        CHECK_OK(t, shard_spec_parse(cases[c].from, &layout, 2, &from), "parse");
        CHECK_OK(t, shard_spec_parse(cases[c].to, &layout, 2, &to), "parse");
        shard_redistribute_plan plan;
        CHECK_OK(t, shard_redistribute_plan_make(&layout, SHARD_F32, 2, shape, &from, &to, &plan), "plan");
        CHECK(t, plan.nsteps == 1 && plan.steps[0].kind == cases[c].kind,
              "%s -> %s: %d steps, the first %s, want one %s", cases[c].from, cases[c].to, plan.nsteps,
              shard_redistribute_kind_name(plan.steps[0].kind), shard_redistribute_kind_name(cases[c].kind));
        shard_dtensor *a = NULL, *b = NULL;
        CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &from, SHARD_MEM_ACTIVATIONS, &a), "create");
        CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &to, SHARD_MEM_ACTIVATIONS, &b), "create");
        if (!a || !b) continue;
        CHECK_OK(t, shard_dtensor_distribute(a, x, -1), "distribute");
        uint64_t sent = shard_mesh_bytes_sent(mesh);
        CHECK_OK(t, shard_dtensor_redistribute(a, b), "%s -> %s", cases[c].from, cases[c].to);
        sent = shard_mesh_bytes_sent(mesh) - sent;
        CHECK(t, sent == expect[c], "%s -> %s on %d ranks: rank %d sent %llu bytes, the formula says %llu",
              cases[c].from, cases[c].to, n, r, (unsigned long long)sent, (unsigned long long)expect[c]);
        CHECK_OK(t, shard_dtensor_gather(b, back, -1), "gather");
        CHECK(t, shard_tensor_equal_bits(back, x), "%s -> %s changed the tensor", cases[c].from, cases[c].to);
        shard_dtensor_destroy(a);
        shard_dtensor_destroy(b);
    }
    shard_tensor_destroy(x);
    shard_tensor_destroy(back);
    shard_mesh_destroy(mesh);
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
    /* a spec this mesh cannot hold is refused before anything is sized from it */
    shard_spec bad = spec;
    bad.axes[0][0] = layout.ndim; /* an axis the mesh lacks */
    shard_status s = shard_dtensor_create(mesh, SHARD_F32, 1, shape, &bad, SHARD_MEM_PARAMS, &d);
    CHECK(t,
          s == SHARD_ERR_INVALID_ARG &&
              strstr(shard_last_error(), "shard_dtensor_create: the spec splits dim 0 over axis index 1"),
          "a spec over a missing axis: %s", shard_last_error());
    size_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    s = shard_dtensor_create(mesh, SHARD_F32, 9, nine, &spec, SHARD_MEM_PARAMS, &d);
    CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "a tensor of 9 dims"), "9 dims: %s",
          shard_last_error());
    shard_mesh_destroy(mesh);
}

static const test_case cases[] = {
    {"round_trips", case_round_trips},
    {"local_shapes", case_local_shapes},
    {"redistribute_all_pairs", case_redistribute_all_pairs},
    {"transition_bytes", case_transition_bytes},
    {"three_dims", case_three_dims},
};

int main(int argc, char **argv) { return test_main(argc, argv, "test_dtensor", cases, sizeof cases / sizeof cases[0]); }
