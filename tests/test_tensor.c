/* test_tensor.c — unit tests (cmocka) for n-d tensors: creation and
 * accounting, narrow views, strided copy, fill, float casts (bf16 rounding to
 * nearest even) and the comparison helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>

#include "shard/shard.h"

static shard_tensor *make(shard_dtype d, int ndim, const size_t *shape) {
    shard_tensor *t = NULL;
    assert_int_equal(shard_tensor_create(d, ndim, shape, SHARD_MEM_ACTIVATIONS, &t), SHARD_OK);
    return t;
}

static void create_and_account(void **state) {
    (void)state;
    shard_mem_stats before, after;
    shard_mem_stats_get(&before);
    size_t shape[3] = {2, 3, 5};
    shard_tensor *t = make(SHARD_BF16, 3, shape);
    assert_int_equal(shard_tensor_numel(t), 30);
    assert_int_equal(shard_tensor_nbytes(t), 60);
    assert_int_equal((uintptr_t)t->data % 64, 0);
    assert_true(shard_tensor_is_contiguous(t));
    assert_int_equal(t->strides[0], 15);
    assert_int_equal(t->strides[2], 1);
    shard_mem_stats_get(&after);
    assert_int_equal(after.current_bytes[SHARD_MEM_ACTIVATIONS] - before.current_bytes[SHARD_MEM_ACTIVATIONS], 60);
    char text[64];
    shard_tensor_type_string(t, text, sizeof text);
    assert_string_equal(text, "bf16[2,3,5]");
    for (size_t i = 0; i < 30; i++) assert_true(shard_tensor_get(t, i) == 0.0);
    shard_tensor_destroy(t);
    shard_mem_stats_get(&after);
    assert_int_equal(after.current_bytes[SHARD_MEM_ACTIVATIONS], before.current_bytes[SHARD_MEM_ACTIVATIONS]);
}

static void bad_creation(void **state) {
    (void)state;
    shard_tensor *t = NULL;
    size_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(shard_tensor_create(SHARD_F32, 9, shape, SHARD_MEM_OTHER, &t), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "a tensor has 0..8"));
    assert_int_equal(shard_tensor_create((shard_dtype)42, 1, shape, SHARD_MEM_OTHER, &t), SHARD_ERR_INVALID_ARG);
    size_t huge[2] = {SIZE_MAX / 2, 4};
    assert_int_equal(shard_tensor_create(SHARD_F32, 2, huge, SHARD_MEM_OTHER, &t), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "overflows"));
    assert_null(t);
}

static void narrow_views_and_copy(void **state) {
    (void)state;
    size_t shape[2] = {4, 6};
    shard_tensor *t = make(SHARD_F32, 2, shape);
    for (size_t i = 0; i < 24; i++) assert_int_equal(shard_tensor_set(t, i, (double)i), SHARD_OK);
    shard_tensor *cols = NULL, *rows = NULL;
    assert_int_equal(shard_tensor_narrow(t, 1, 2, 3, &cols), SHARD_OK); /* columns 2..4 */
    assert_false(shard_tensor_is_contiguous(cols));
    assert_int_equal(shard_tensor_numel(cols), 12);
    assert_true(shard_tensor_get(cols, 0) == 2.0);
    assert_true(shard_tensor_get(cols, 4) == 9.0); /* row 1, column 3 */
    assert_int_equal(shard_tensor_narrow(t, 0, 1, 2, &rows), SHARD_OK);
    assert_true(shard_tensor_is_contiguous(rows));
    assert_true(shard_tensor_get(rows, 0) == 6.0);
    size_t small_shape[2] = {4, 3};
    shard_tensor *packed = make(SHARD_F32, 2, small_shape);
    assert_int_equal(shard_tensor_copy(packed, cols), SHARD_OK);
    for (size_t i = 0; i < 12; i++) assert_true(shard_tensor_get(packed, i) == (double)((i / 3) * 6 + 2 + i % 3));
    /* writing through a view changes the parent, and only the narrowed part */
    assert_int_equal(shard_tensor_fill(cols, -1), SHARD_OK);
    assert_true(shard_tensor_get(t, 2) == -1.0 && shard_tensor_get(t, 1) == 1.0 && shard_tensor_get(t, 5) == 5.0);
    shard_tensor_destroy(cols);
    shard_tensor *bad = NULL;
    assert_int_equal(shard_tensor_narrow(t, 1, 5, 2, &bad), SHARD_ERR_INVALID_ARG);
    assert_null(bad);
    assert_non_null(strstr(shard_last_error(), "outside dim 1 of size 6"));
    assert_int_equal(shard_tensor_copy(t, packed), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "shapes differ: f32[4,6] and f32[4,3]"));
    shard_tensor_destroy(rows);
    shard_tensor_destroy(packed);
    shard_tensor_destroy(t);
}

static void casts_round_to_nearest_even(void **state) {
    (void)state;
    size_t shape[1] = {4};
    shard_tensor *f = make(SHARD_F32, 1, shape), *b = make(SHARD_BF16, 1, shape), *back = make(SHARD_F32, 1, shape);
    float values[4] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f};
    for (int i = 0; i < 4; i++) shard_tensor_set(f, (size_t)i, values[i]);
    assert_int_equal(shard_tensor_cast(b, f), SHARD_OK);
    assert_int_equal(((uint16_t *)b->data)[1], 0x3f80); /* tie to even: 1.0 */
    assert_int_equal(((uint16_t *)b->data)[2], 0x3f82); /* tie to even: up */
    assert_int_equal(shard_tensor_cast(back, b), SHARD_OK);
    assert_true(shard_tensor_get(back, 3) == -2.5);
    /* from f64, rounded once: 1 + 2^-8 + 2^-30 is above the tie, so bf16 rounds up (via f32 it was 1.0) */
    assert_int_equal(shard_tensor_set(b, 0, 1.0 + 0x1p-8 + 0x1p-30), SHARD_OK);
    assert_int_equal(((uint16_t *)b->data)[0], 0x3f81);
    shard_tensor *h = make(SHARD_F16, 1, shape);
    assert_int_equal(shard_tensor_set(h, 0, 1.0 + 0x1p-11 + 0x1p-40), SHARD_OK);
    assert_int_equal(((uint16_t *)h->data)[0], 0x3c01);
    assert_int_equal(shard_tensor_set(h, 1, 1.0 + 0x1p-11), SHARD_OK); /* a tie: to even */
    assert_int_equal(((uint16_t *)h->data)[1], 0x3c00);
    shard_tensor_destroy(h);
    shard_tensor *i32 = make(SHARD_I32, 1, shape), *i64 = make(SHARD_I64, 1, shape);
    assert_int_equal(shard_tensor_fill(i32, NAN), SHARD_OK); /* integers have no NaN: 0 */
    assert_true(((int32_t *)i32->data)[3] == 0);
    assert_int_equal(shard_tensor_set(i64, 0, 9.21e18), SHARD_OK); /* fits: not clamped at 9.2e18 */
    assert_true(((int64_t *)i64->data)[0] == (int64_t)9.21e18);
    assert_int_equal(shard_tensor_set(i64, 1, 1e30), SHARD_OK);
    assert_true(((int64_t *)i64->data)[1] == INT64_MAX);
    shard_tensor_destroy(i64);
    assert_int_equal(shard_tensor_cast(i32, f), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "casts are between f32, f64, bf16 and f16"));
    shard_tensor_destroy(f);
    shard_tensor_destroy(b);
    shard_tensor_destroy(back);
    shard_tensor_destroy(i32);
}

static void comparisons(void **state) {
    (void)state;
    size_t shape[2] = {3, 3};
    shard_tensor *a = make(SHARD_F32, 2, shape), *b = make(SHARD_F32, 2, shape);
    for (size_t i = 0; i < 9; i++) shard_tensor_set(a, i, (double)i), shard_tensor_set(b, i, (double)i);
    assert_true(shard_tensor_equal_bits(a, b));
    shard_tensor_set(b, 7, 7.5);
    shard_tensor_set(b, 2, 2.25);
    assert_false(shard_tensor_equal_bits(a, b));
    shard_tensor_diff d;
    assert_int_equal(shard_tensor_compare(a, b, &d), SHARD_OK);
    assert_int_equal(d.mismatched_bits, 2);
    assert_true(d.max_abs == 0.5);
    assert_int_equal(d.worst_index, 7);
    assert_true(d.worst_a == 7.0 && d.worst_b == 7.5);
    assert_true(fabs(d.max_rel - 0.25 / 2.25) < 1e-12);
    /* -0 and +0: equal values, different bits */
    shard_tensor_set(b, 7, 7.0), shard_tensor_set(b, 2, 2.0);
    shard_tensor_set(a, 0, -0.0);
    assert_false(shard_tensor_equal_bits(a, b));
    assert_int_equal(shard_tensor_compare(a, b, &d), SHARD_OK);
    assert_true(d.max_abs == 0.0);
    shard_tensor_destroy(a);
    shard_tensor_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_and_account),    cmocka_unit_test(bad_creation),
        cmocka_unit_test(narrow_views_and_copy), cmocka_unit_test(casts_round_to_nearest_even),
        cmocka_unit_test(comparisons),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
