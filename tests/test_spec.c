/* test_spec.c — unit tests (cmocka) for sharding specs: the text form (JAX's
 * P(...) plus partial=), round trips, every refusal, the type string, and the
 * 3,3,2,2 split rule with nested splits over several axes, and the
 * redistribution planner (which collective each transition uses, and that
 * a swap of axes costs one exchange). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "shard/shard.h"

static shard_mesh_layout layout(const char *text) {
    shard_mesh_layout l;
    assert_int_equal(shard_mesh_layout_parse(text, 0, &l), SHARD_OK);
    return l;
}

static void round_trip(const shard_mesh_layout *l, const char *text, int ndim, const char *canonical) {
    shard_spec s;
    assert_int_equal(shard_spec_parse(text, l, ndim, &s), SHARD_OK);
    char out[160];
    shard_spec_string(&s, l, out, sizeof out);
    assert_string_equal(out, canonical);
    shard_spec again;
    assert_int_equal(shard_spec_parse(out, l, ndim, &again), SHARD_OK);
    assert_memory_equal(&s, &again, sizeof s);
}

static void parse_and_print(void **state) {
    (void)state;
    shard_mesh_layout l = layout("data=4,tensor=2");
    assert_int_equal(shard_mesh_layout_world(&l), 8);
    round_trip(&l, "P('data', None)", 2, "P('data', None)");
    round_trip(&l, "P(\"data\",'tensor')", 2, "P('data', 'tensor')");
    round_trip(&l, " P ( ( 'data' , 'tensor' ) , None ) ", 2, "P(('data','tensor'), None)");
    round_trip(&l, "P(('tensor',), None)", 2, "P('tensor', None)");
    round_trip(&l, "P()", 2, "P(None, None)");
    round_trip(&l, "P(None, 'tensor', partial='data')", 2, "P(None, 'tensor', partial='data')");
    round_trip(&l, "P(partial=('data','tensor'), partial_op='max')", 1,
               "P(None, partial=('data','tensor'), partial_op='max')");
    shard_spec s;
    assert_int_equal(shard_spec_parse("P(('data','tensor'), None)", &l, 2, &s), SHARD_OK);
    assert_int_equal(s.naxes[0], 2);
    assert_int_equal(s.axes[0][0], 0);
    assert_int_equal(s.axes[0][1], 1);
    assert_int_equal(s.naxes[1], 0);
    assert_int_equal(s.partial_mask, 0);
}

static void refusals(void **state) {
    (void)state;
    shard_mesh_layout l = layout("data=4,tensor=2");
    static const struct {
        const char *text;
        int ndim;
        const char *want;
    } bad[] = {
        {"P('model', None)", 2, "unknown axis 'model'; the mesh's axes are data, tensor"},
        {"P('data', 'data')", 2, "axis 'data' is used twice"},
        {"P(('data','data'), None)", 2, "axis 'data' is used twice"},
        {"P('data', None, None)", 2, "more entries than the tensor's 2 dims"},
        {"P('data', None, partial='data')", 2, "axis 'data' both splits a dim and is partial"},
        {"P(None, partial='tensor', partial_op='prod')", 2, "partial_op 'prod' is invalid: give sum, max, min or avg"},
        {"Q('data')", 1, "a spec starts with P("},
        {"P('data)", 1, "unterminated string"},
        {"P(data)", 1, "expected a quoted axis name, None or ("},
        {"P('data') extra", 1, "unexpected text after the closing ')'"},
        {"P(partial='data', 'tensor')", 2, "dim entries come before partial="},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shard_spec s;
        shard_status st = shard_spec_parse(bad[i].text, &l, bad[i].ndim, &s);
        if (st != SHARD_ERR_INVALID_ARG || !strstr(shard_last_error(), bad[i].want))
            fail_msg("spec %s: status %d, message '%s', wanted '%s'", bad[i].text, st, shard_last_error(), bad[i].want);
        assert_non_null(strstr(shard_last_error(), bad[i].text)); /* the message quotes the spec */
    }
    /* a layout whose rank count overflows int, offline too (world 0) */
    shard_mesh_layout big;
    assert_int_equal(shard_mesh_layout_parse("a=65536,b=65536", 0, &big), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "ranks; at most 1048576 are possible"));
    /* a pending avg of an integer dtype would wrap its sum */
    shard_spec avg, repl;
    size_t shape[2] = {8, 4};
    shard_redistribute_plan p;
    assert_int_equal(shard_spec_parse("P(None, None, partial='data', partial_op='avg')", &l, 2, &avg), SHARD_OK);
    assert_int_equal(shard_spec_parse("P()", &l, 2, &repl), SHARD_OK);
    assert_int_equal(shard_redistribute_plan_make(&l, SHARD_U8, 2, shape, &repl, &avg, &p), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "a pending avg of u8 would wrap its sum"));
    assert_int_equal(shard_redistribute_plan_make(&l, SHARD_F32, 2, shape, &repl, &avg, &p), SHARD_OK);
    /* a hand-made layout with an axis of size 0 */
    shard_mesh_layout zero = l;
    zero.sizes[1] = 0;
    assert_int_equal(shard_redistribute_plan_make(&zero, SHARD_F32, 2, shape, &repl, &repl, &p), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "mesh axis 'tensor' has size 0"));
}

static void type_strings(void **state) {
    (void)state;
    shard_mesh_layout l = layout("data=4,tensor=2");
    shard_spec s;
    size_t shape[2] = {128, 4096};
    char out[160];
    assert_int_equal(shard_spec_parse("P('data','tensor')", &l, 2, &s), SHARD_OK);
    shard_spec_type_string(&s, &l, SHARD_F32, shape, out, sizeof out);
    assert_string_equal(out, "f32[128@data,4096@tensor]");
    assert_int_equal(shard_spec_parse("P(('data','tensor'))", &l, 2, &s), SHARD_OK);
    shard_spec_type_string(&s, &l, SHARD_BF16, shape, out, sizeof out);
    assert_string_equal(out, "bf16[128@(data,tensor),4096]");
    assert_int_equal(shard_spec_parse("P(None, 'tensor', partial='data')", &l, 2, &s), SHARD_OK);
    shard_spec_type_string(&s, &l, SHARD_F32, shape, out, sizeof out);
    assert_string_equal(out, "f32[128,4096@tensor] partial sum over data");
}

static void split_rule_and_pieces(void **state) {
    (void)state;
    size_t off, len;
    size_t want_len[4] = {3, 3, 2, 2}, want_off[4] = {0, 3, 6, 8};
    for (int i = 0; i < 4; i++) {
        shard_split_range(10, 4, i, &off, &len);
        assert_int_equal(len, want_len[i]);
        assert_int_equal(off, want_off[i]);
    }
    shard_mesh_layout l = layout("data=2,tensor=3");
    shard_spec s;
    assert_int_equal(shard_spec_parse("P(('data','tensor'), None)", &l, 2, &s), SHARD_OK);
    assert_int_equal(shard_spec_pieces(&s, &l, 0), 6);
    assert_int_equal(shard_spec_pieces(&s, &l, 1), 1);
    size_t shape[2] = {13, 5}, covered = 0;
    for (int d0 = 0; d0 < 2; d0++)
        for (int t = 0; t < 3; t++) {
            int coords[2] = {d0, t};
            assert_int_equal(shard_spec_piece_index(&s, &l, 0, coords), d0 * 3 + t); /* data major */
            shard_spec_local_range(&s, &l, shape, coords, 0, &off, &len);
            assert_int_equal(off, covered); /* pieces tile the dim in rank order */
            covered += len;
            shard_spec_local_range(&s, &l, shape, coords, 1, &off, &len);
            assert_int_equal(off, 0);
            assert_int_equal(len, 5);
        }
    assert_int_equal(covered, 13);
    /* nested: 10 over (a=2, b=2) splits 5,5 then each 3,2 */
    shard_mesh_layout l2 = layout("a=2,b=2");
    assert_int_equal(shard_spec_parse("P(('a','b'))", &l2, 1, &s), SHARD_OK);
    size_t ten[1] = {10}, nested_len[4] = {3, 2, 3, 2};
    for (int i = 0; i < 4; i++) {
        int coords[2] = {i / 2, i % 2};
        shard_spec_local_range(&s, &l2, ten, coords, 0, &off, &len);
        assert_int_equal(len, nested_len[i]);
    }
}

static shard_redistribute_plan plan_of(const char *mesh, const char *from, const char *to) {
    shard_mesh_layout l = layout(mesh);
    shard_spec a, b;
    size_t shape[2] = {30, 17};
    assert_int_equal(shard_spec_parse(from, &l, 2, &a), SHARD_OK);
    assert_int_equal(shard_spec_parse(to, &l, 2, &b), SHARD_OK);
    shard_redistribute_plan p;
    assert_int_equal(shard_redistribute_plan_make(&l, SHARD_F32, 2, shape, &a, &b, &p), SHARD_OK);
    return p;
}

static void expect_steps(const char *mesh, const char *from, const char *to, int n,
                         const shard_redistribute_kind *kinds) {
    shard_redistribute_plan p = plan_of(mesh, from, to);
    if (p.nsteps != n) fail_msg("%s -> %s on %s: %d steps, want %d", from, to, mesh, p.nsteps, n);
    for (int i = 0; i < n; i++)
        if (p.steps[i].kind != kinds[i])
            fail_msg("%s -> %s on %s: step %d is %s, want %s", from, to, mesh, i + 1,
                     shard_redistribute_kind_name(p.steps[i].kind), shard_redistribute_kind_name(kinds[i]));
}

static void redistribute_plans(void **state) {
    (void)state;
    const shard_redistribute_kind ag = SHARD_REDIST_ALL_GATHER, sl = SHARD_REDIST_SLICE, ar = SHARD_REDIST_ALL_REDUCE,
                                  rs = SHARD_REDIST_REDUCE_SCATTER, a2a = SHARD_REDIST_ALL_TO_ALL,
                                  ex = SHARD_REDIST_EXCHANGE, mp = SHARD_REDIST_MAKE_PARTIAL;
    expect_steps("a=4", "P('a')", "P()", 1, &ag);
    expect_steps("a=4", "P()", "P(None, 'a')", 1, &sl);
    expect_steps("a=4", "P(partial='a')", "P()", 1, &ar);
    expect_steps("a=4", "P(partial='a')", "P(None, 'a')", 1, &rs);
    expect_steps("a=4", "P('a')", "P(None, 'a')", 1, &a2a);
    expect_steps("a=4", "P('a')", "P('a')", 0, NULL);
    expect_steps("a=2,b=3", "P(('a','b'))", "P()", 1, &ag); /* one all_gather over both axes */
    expect_steps("a=2,b=3", "P('a', 'b')", "P('b', 'a')", 1, &ex);
    expect_steps("a=2,b=3", "P('a')", "P('b')", 1, &ex);
    shard_redistribute_kind slice_then_reduce[2] = {sl, ar}; /* reduce the smaller block */
    expect_steps("a=2,b=3", "P(partial='a')", "P('b')", 2, slice_then_reduce);
    shard_redistribute_kind nested_rs[1] = {rs};
    expect_steps("a=2,b=3", "P('b', partial='a')", "P(('b','a'))", 1, nested_rs);
    shard_redistribute_kind to_partial[2] = {ag, mp};
    expect_steps("a=2,b=3", "P('a')", "P(partial=('a','b'))", 2, to_partial);
    /* the swap: one exchange sends less than all_gather + all_to_all + slice */
    shard_redistribute_plan p = plan_of("a=2,b=3", "P('a', 'b')", "P('b', 'a')");
    assert_true(shard_redistribute_plan_total_bytes(&p, -1) < 30 * 17 * 4);
    char line[600];
    shard_redistribute_step_string(&p, 0, line, sizeof line);
    assert_string_equal(line, "exchange over a,b: P('a', 'b') -> P('b', 'a')");
    p = plan_of("a=4", "P('a')", "P()");
    shard_redistribute_step_string(&p, 0, line, sizeof line);
    assert_string_equal(line, "all_gather over a, dim 0: P('a', None) -> P(None, None)");
    /* all_gather of 30 rows x 17 f32 over 4: every rank sends its rows to 3 others */
    assert_int_equal(shard_redistribute_plan_total_bytes(&p, -1), 3 * 30 * 17 * 4);
    /* hand-built specs are checked too */
    shard_mesh_layout l = layout("a=2,b=3");
    shard_spec ok = shard_spec_replicated(2), bad = ok;
    size_t shape[2] = {4, 4};
    bad.partial_mask = 1, bad.partial_op = SHARD_OP_PROD;
    assert_int_equal(shard_redistribute_plan_make(&l, SHARD_F32, 2, shape, &ok, &bad, &p), SHARD_ERR_INVALID_ARG);
    assert_non_null(
        strstr(shard_last_error(), "the target spec's pending reduction is 'prod'; valid: sum, max, min, avg"));
    bad = ok;
    bad.naxes[0] = 1, bad.axes[0][0] = 1, bad.naxes[1] = 1, bad.axes[1][0] = 1;
    assert_int_equal(shard_redistribute_plan_make(&l, SHARD_F32, 2, shape, &bad, &ok, &p), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "the source spec uses axis 'b' twice"));
    bad = ok;
    bad.naxes[0] = 1, bad.axes[0][0] = 0, bad.partial_mask = 1;
    assert_int_equal(shard_redistribute_plan_make(&l, SHARD_F32, 2, shape, &bad, &ok, &p), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "partial over axis 'a', which also splits a dim"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_and_print),       cmocka_unit_test(refusals),           cmocka_unit_test(type_strings),
        cmocka_unit_test(split_rule_and_pieces), cmocka_unit_test(redistribute_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
