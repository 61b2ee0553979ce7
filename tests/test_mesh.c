/* test_mesh.c — device meshes: parsing and refusal messages, row-major
 * coordinates, and the per-axis and per-axes-set sub-communicators, for every
 * factorisation of the world into 1, 2 and 3 axes.
 *   test_mesh --ranks N [--case NAME]      (or under mpiexec) */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "shard/mesh.h"

static void case_refusals(test_ctx *t) {
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES];
    static const struct {
        const char *text;
        int world;
        const char *want;
    } bad[] = {
        {"data=3,tensor=2", 4,
         "mesh data=3,tensor=2 needs 6 ranks, got 4; meshes of 4 ranks: data=4 | data=2,tensor=2 | tensor=4"},
        {"data=2,data=2", 4, "axis 'data' appears twice"},
        {"=2,tensor=2", 4, "empty axis name at column 1"},
        {"data=0", 1, "axis 'data' has size 0"},
        {"data:2", 2, "expected '=' after axis 'data'"},
        {"data=two", 2, "axis 'data' needs a size"},
        {"data=2;tensor=1", 2, "unexpected ';' at column 7"},
        {"", 1, "mesh is empty"},
        {"2d=2", 2, "axis name '2d' is invalid"},
        {"data=1,tensor=1", 3, "meshes of 3 ranks: data=3 | tensor=3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int n = shard_mesh_parse(bad[i].text, bad[i].world, names, sizes);
        CHECK(t, n == SHARD_ERR_INVALID_ARG, "mesh '%s' on %d ranks was accepted (%d)", bad[i].text, bad[i].world, n);
        CHECK(t, strstr(shard_last_error(), bad[i].want) != NULL, "mesh '%s': message '%s' lacks '%s'", bad[i].text,
              shard_last_error(), bad[i].want);
    }
    CHECK_EQ_INT(t, shard_mesh_parse("data=2,tensor=1,pipe=3", 6, names, sizes), 3, "a mesh with a size-1 axis");
    CHECK(t, strcmp(names[2], "pipe") == 0 && sizes[2] == 3, "parsed names and sizes");
    shard_mesh *m = NULL;
    CHECK(t, shard_mesh_create(t->comm, "x=1000", &m) == SHARD_ERR_INVALID_ARG && m == NULL, "bad mesh created");
}

/* Check one mesh on this rank: coordinates, and a sum over each axis's communicator. */
static void check_mesh(test_ctx *t, const char *text, int ndim, const int *sizes) {
    shard_mesh *m = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &m), "create mesh %s", text)) return;
    int coords[SHARD_MESH_MAX_AXES], rest = t->rank;
    for (int k = ndim - 1; k >= 0; k--) coords[k] = rest % sizes[k], rest /= sizes[k];
    char printed[128];
    shard_mesh_string(m, printed, sizeof printed);
    CHECK(t, strcmp(printed, text) == 0, "mesh prints as '%s', created from '%s'", printed, text);
    CHECK_EQ_INT(t, shard_mesh_rank_at(m, coords), t->rank, "%s: rank at my coordinates", text);
    for (int k = 0; k < ndim; k++) {
        CHECK_EQ_INT(t, shard_mesh_coord(m, k), coords[k], "%s: coordinate on axis %d", text, k);
        shard_comm *c = shard_mesh_axis_comm(m, k);
        CHECK_EQ_INT(t, shard_comm_size(c), sizes[k], "%s: size of axis %d's communicator", text, k);
        CHECK_EQ_INT(t, shard_comm_rank(c), coords[k], "%s: rank in axis %d's communicator", text, k);
        CHECK(t, strcmp(shard_comm_name(c), shard_mesh_axis_name(m, k)) == 0, "%s: axis communicator named '%s'", text,
              shard_comm_name(c));
        /* the peers along axis k are the ranks that differ only in coordinate k */
        int64_t mine = t->rank, sum = 0, expect = 0;
        CHECK_OK(t, shard_comm_all_reduce(c, &mine, &sum, 1, SHARD_I64, SHARD_OP_SUM), "%s: axis %d all_reduce", text,
                 k);
        int other[SHARD_MESH_MAX_AXES];
        memcpy(other, coords, sizeof other);
        for (int v = 0; v < sizes[k]; v++) other[k] = v, expect += shard_mesh_rank_at(m, other);
        CHECK_EQ_INT(t, sum, expect, "%s: sum of ranks along axis %d", text, k);
    }
    if (ndim >= 2) { /* the set of the first two axes */
        char set[80];
        snprintf(set, sizeof set, "%s,%s", shard_mesh_axis_name(m, 1), shard_mesh_axis_name(m, 0));
        shard_comm *c = NULL;
        if (CHECK_OK(t, shard_mesh_axes_comm(m, set, &c), "%s: axes %s", text, set)) {
            CHECK_EQ_INT(t, shard_comm_size(c), sizes[0] * sizes[1], "%s: size over %s", text, set);
            CHECK_EQ_INT(t, shard_comm_rank(c), coords[0] * sizes[1] + coords[1], "%s: rank over %s (row-major)", text,
                         set);
            shard_comm *again = NULL;
            CHECK_OK(t, shard_mesh_axes_comm(m, set, &again), "cached");
            CHECK(t, again == c, "%s: the set's communicator is cached", text);
        }
        CHECK(t,
              shard_mesh_axes_comm(m, "nope", &c) == SHARD_ERR_INVALID_ARG &&
                  strstr(shard_last_error(), "no axis 'nope' in mesh"),
              "unknown axis: '%s'", shard_last_error());
    }
    shard_mesh_destroy(m);
}

static void case_all_factorisations(test_ctx *t) {
    int n = t->size;
    char text[128];
    int sizes[3];
    sizes[0] = n;
    snprintf(text, sizeof text, "data=%d", n);
    check_mesh(t, text, 1, sizes);
    for (int a = 1; a <= n; a++) {
        if (n % a) continue;
        sizes[0] = a, sizes[1] = n / a;
        snprintf(text, sizeof text, "data=%d,tensor=%d", a, n / a);
        check_mesh(t, text, 2, sizes);
        for (int b = 1; b <= n / a; b++) {
            if ((n / a) % b) continue;
            sizes[0] = a, sizes[1] = b, sizes[2] = n / a / b;
            snprintf(text, sizeof text, "data=%d,pipe=%d,tensor=%d", a, b, n / a / b);
            check_mesh(t, text, 3, sizes);
        }
    }
}

static const test_case cases[] = {
    {"refusals", case_refusals},
    {"all_factorisations", case_all_factorisations},
};

int main(int argc, char **argv) { return test_main(argc, argv, "test_mesh", cases, sizeof cases / sizeof cases[0]); }
