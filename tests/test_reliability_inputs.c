/* test_reliability_inputs.c — unit tests (cmocka) of the inputs' reliability promises that a count shows
 * better than a clock: the parameter table's names are checked for repeats and found through a hash
 * index, so building a table of n tensors costs about n name comparisons (a GPT of 2^16 layers has
 * 786,436 tensors: n^2 / 2 would be hours), and a repeat is still refused naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "nn/params_impl.h"
#include "shard/shard.h"

enum { MANY = 200000 };

/* MANY one-element tensors named as a deep GPT names its own. */
static shard_param_info *many_names(void) {
    shard_param_info *t = calloc(MANY, sizeof *t);
    assert_non_null(t);
    for (size_t i = 0; i < MANY; i++) {
        snprintf(t[i].name, sizeof t[i].name, "h.%zu.mlp.c_fc.weight", i);
        t[i].ndim = 1, t[i].shape[0] = 1;
    }
    return t;
}

static void linear_comparisons(void **state) {
    (void)state;
    shard_param_info *t = many_names();
    size_t before = shard__params_name_compares();
    shard_params *p = NULL;
    assert_int_equal(shard_params_create(t, MANY, SHARD_MEM_PARAMS, &p), SHARD_OK);
    size_t made = shard__params_name_compares() - before;
    /* distinct names meet only on a shared hash slot: a handful per name at most, never i per name */
    printf("%d tensors: %zu name comparisons (all pairs would be %.3g)\n", MANY, made, (double)MANY * (MANY - 1) / 2);
    assert_true(made <= 2 * (size_t)MANY);
    for (size_t i = 0; i < MANY; i += 997) assert_ptr_equal(shard_params_find(p, t[i].name), &p->info[i]);
    assert_null(shard_params_find(p, "h.200000.mlp.c_fc.weight"));
    shard_params *like = NULL; /* a table of the same layout (gradients, optimizer state) costs the same */
    before = shard__params_name_compares();
    assert_int_equal(shard_params_like(p, SHARD_MEM_GRADS, &like), SHARD_OK);
    assert_true(shard__params_name_compares() - before <= 2 * (size_t)MANY);
    shard_params_destroy(like);
    shard_params_destroy(p);
    free(t);
}

static void repeat_refused(void **state) {
    (void)state;
    shard_param_info *t = many_names();
    snprintf(t[MANY - 1].name, sizeof t[MANY - 1].name, "h.12345.mlp.c_fc.weight");
    shard_params *p = NULL;
    size_t before = shard__params_name_compares();
    assert_int_equal(shard_params_create(t, MANY, SHARD_MEM_PARAMS, &p), SHARD_ERR_INVALID_ARG);
    assert_null(p);
    assert_true(shard__params_name_compares() - before <= 2 * (size_t)MANY);
    assert_non_null(strstr(shard_last_error(), "the name 'h.12345.mlp.c_fc.weight' is given twice"));
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(linear_comparisons),
        cmocka_unit_test(repeat_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
