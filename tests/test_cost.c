/* test_cost.c — unit tests (cmocka) of shard/cost.h's closed forms, each held two ways:
 *   - against hand counts on a tiny configuration (the arithmetic written out beside each figure);
 *   - against the dry run (shard_analyze: the engine's own allocations and collectives, counted) where
 *     the engine's numbers are the formula's: a dense GPT's model state by ZeRO stage and its
 *     data-parallel traffic on data=2 (equal but for what cost.h says the formula leaves out: one byte
 *     per array, the unit buffers a step holds, ZeRO-3's build and its extra gather of the tied
 *     embedding), its tensor-parallel bytes (equal exactly, with and without sequence parallel), and the
 *     pipeline's bubble under GPipe and 1F1B (equal). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "shard/shard.h"

/* The tiny GPT of the dry runs: C = 64 over 2 blocks, 4 heads, 32 positions, 256 tokens.  Its units
 * (the model's, which ZeRO shards one by one): the embeddings with the final LayerNorm, and each block;
 * every one an even count, so a share on 2 ranks is exactly half. */
static const shard_gpt_config tiny = {.n_embd = 64, .n_layer = 2, .n_head = 4, .n_positions = 32, .vocab_size = 256};
enum { BATCH = 4, SEQ = 16 };
static const size_t unit0 = (256 + 32) * 64 + 2 * 64, block = 12 * 64 * 64 + 13 * 64;

static char g_dir[64], g_config[128];

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/shard-test-cost-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_config, sizeof g_config, "%s/gpt.json", g_dir);
    FILE *f = fopen(g_config, "w");
    if (!f) return -1;
    fprintf(f, "{\"n_embd\": %zu, \"n_layer\": %zu, \"n_head\": %zu, \"n_positions\": %zu, \"vocab_size\": %zu}",
            tiny.n_embd, tiny.n_layer, tiny.n_head, tiny.n_positions, tiny.vocab_size);
    return fclose(f) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    remove(g_config);
    return rmdir(g_dir);
}

/* The dry run of the tiny GPT on `mesh`. */
static shard_analysis *analyze(const char *mesh, int zero, size_t accum, int sp, const char *schedule,
                               size_t micro_batches) {
    shard_trainer_config c = {.config_path = g_config,
                              .batch = BATCH,
                              .seq = SEQ,
                              .seed = 1,
                              .zero = zero,
                              .accum = accum,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f,
                              .sequence_parallel = sp,
                              .schedule = schedule,
                              .micro_batches = micro_batches};
    c.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 2};
    shard_analyze_options o = {.struct_size = sizeof o, .train = &c, .mesh = mesh};
    shard_analysis *a = NULL;
    shard_status s = shard_analyze(&o, &a);
    if (s != SHARD_OK) fprintf(stderr, "analyze %s: %s\n", mesh, shard_last_error());
    assert_int_equal(s, SHARD_OK);
    assert_int_equal(a->ranks, 2); /* every mesh here is two ranks, each built */
    assert_int_equal(a->built, 2);
    return a;
}

/* Bytes of collective `op` rank r sent on `axis` (0: none made). */
static uint64_t op_bytes(const shard_rank_analysis *r, const char *axis, const char *op) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < r->collectives; i++)
        if (strcmp(r->collective[i].axis, axis) == 0 && strcmp(r->collective[i].op, op) == 0)
            bytes += r->collective[i].bytes;
    return bytes;
}

static void flops_activations_and_bubble_by_hand(void **state) {
    (void)state;
    /* C 8, 2 blocks, 2 heads, 8 positions, 16 tokens: 12 C^2 + 13 C = 872 a block, the embeddings
     * 16 x 8 + 8 x 8, the final LayerNorm 16; N leaves the position table out */
    shard_gpt_config c = {.n_embd = 8, .n_layer = 2, .n_head = 2, .n_positions = 8, .vocab_size = 16};
    double N = 2 * 872 + 16 * 8 + 16;
    assert_true(shard_cost_gpt_flops_per_token(&c, 4) == 6 * N + 12 * 2 * 4 * 8);
    /* one stage, one micro-batch of 1 x 4 tokens: a block 4 (16 x 8 + 4) + 2 heads x 4 x 4 = 560; a
     * slot two blocks, the output 4 x 8, and ln_f, the statistics and the logits 4 x 8 + 2 x 4 + 4 x 16;
     * backward's scratch 11 x 4 x 8; f32 */
    assert_true(shard_cost_gpt_stage_activation_bytes(&c, 1, 0, 1, 0, 1, 4) ==
                4.0 * (2 * 560 + 32 + (32 + 8 + 64) + 352));
    /* the first of two stages, 2 slots: one block each, no head */
    assert_true(shard_cost_gpt_stage_activation_bytes(&c, 2, 0, 2, 0, 1, 4) == 4.0 * (2 * (560 + 32) + 352));
    /* the second, one received input as well */
    assert_true(shard_cost_gpt_stage_activation_bytes(&c, 2, 1, 1, 1, 1, 4) ==
                4.0 * (560 + 32 + (32 + 8 + 64) + 352 + 32));
    assert_true(fabs(shard_cost_pipe_bubble(SHARD_PIPE_1F1B, 4, 4, 1) - 3.0 / 7) < 1e-15);
    assert_true(fabs(shard_cost_pipe_bubble(SHARD_PIPE_GPIPE, 2, 6, 3) - 1.0 / 7) < 1e-15); /* v: interleaved only */
    assert_true(shard_cost_busbw_factor("reduce_scatter", 2) == 0.5);
}

static void tensor_bytes_by_hand(void **state) {
    (void)state;
    shard_gpt_config c = {.n_embd = 8, .n_layer = 2, .n_head = 2, .n_positions = 8, .vocab_size = 16};
    /* 4 tokens on 2 ranks, where an all_reduce of n elements sends n: the row maximum 4 x 4, the sums 8 x
     * 8, the norm 8; 4 x 2 + 2 pairs of 4 x 8 f32 */
    assert_int_equal(shard_cost_gpt_tensor_bytes(&c, 4, 2, 0, 0), 16 + 64 + 8 + 10 * 128);
    /* sequence parallel: a pair gathers this rank's 2 tokens (2 x 8 x 4 to the other) and scatters the
     * other's 2; 2 L + 1 LayerNorm pairs of 2 x 8 and the position table 8 x 8 summed */
    assert_int_equal(shard_cost_gpt_tensor_bytes(&c, 4, 2, 1, 1), 16 + 64 + 8 + 10 * (64 + 64) + 5 * 64 + 256);
}

static void model_state_by_hand(void **state) {
    (void)state;
    /* 1000 parameters over 4 ranks, f32 values and gradients, AdamW's 8 bytes a parameter */
    static const double want[4][4] = {
        {4000, 4000, 8000, 0},           /* ZeRO-0: all whole */
        {4000, 4000 + 1000, 2000, 1000}, /* ZeRO-1: moments sharded, the reduced share beside the gradients */
        {4000, 1000, 2000, 1000},        /* ZeRO-2: gradients sharded too */
        {1000, 1000, 2000, 1000}};       /* ZeRO-3: values too */
    for (int z = 0; z < 4; z++) {
        shard_cost_model_state m;
        assert_int_equal(shard_cost_model_state_bytes(1000, 4, z, 4, 4, 8, &m), SHARD_OK);
        assert_true(m.params_bytes == want[z][0] && m.grads_bytes == want[z][1]);
        assert_true(m.optimizer_bytes == want[z][2] && m.comm_bytes == want[z][3]);
    }
    shard_cost_model_state m;
    assert_int_equal(shard_cost_model_state_bytes(1000, 3, 1, 4, 4, 0, &m), SHARD_OK); /* SGD without momentum */
    assert_true(m.optimizer_bytes == 0 && m.grads_bytes == 4000 + 4000.0 / 3);
    assert_int_equal(shard_cost_model_state_bytes(1000, 4, 4, 4, 4, 8, &m), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "ZeRO stage 4"));
    assert_int_equal(shard_cost_model_state_bytes(1000, 0, 1, 4, 4, 8, &m), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "0 data ranks"));
}

static void data_bytes_by_hand(void **state) {
    (void)state;
    shard_cost_data_bytes d;
    /* 10 parameters over 4 ranks: rank 0 owns 3 (split.h: the first ranks take the remainder) */
    assert_int_equal(shard_cost_data_step_bytes(10, 4, 0, 0, 3, 4, 4, &d), SHARD_OK);
    assert_int_equal(d.all_reduce_bytes, (7 + 3 * 3) * 4); /* the others' 7 once, its own 3 to each of 3 */
    assert_int_equal(d.reduce_scatter_bytes + d.all_gather_bytes + d.norm_bytes, 0);
    assert_int_equal(shard_cost_data_step_bytes(10, 4, 0, 1, 3, 2, 4, &d), SHARD_OK);
    assert_int_equal(d.all_reduce_bytes, 0);
    assert_int_equal(d.reduce_scatter_bytes, 7 * 2); /* once a step, bf16 on the wire */
    assert_int_equal(d.all_gather_bytes, 3 * 4 * 3); /* its f32 values to each other rank */
    assert_int_equal(d.norm_bytes, 3 * 8);           /* rank 0 owns the one f64 */
    assert_int_equal(shard_cost_data_step_bytes(10, 4, 3, 2, 3, 4, 4, &d), SHARD_OK);
    assert_int_equal(d.reduce_scatter_bytes, 3 * 8 * 4); /* rank 3 owns 2: every micro-step */
    assert_int_equal(d.all_gather_bytes, 2 * 4 * 3);
    assert_int_equal(d.norm_bytes, 8);
    assert_int_equal(shard_cost_data_step_bytes(10, 4, 3, 3, 3, 4, 2, &d), SHARD_OK);
    assert_int_equal(d.all_gather_bytes, 2 * 3 * 2 * 2 * 3); /* forward and backward each micro-step, bf16 */
    assert_int_equal(shard_cost_data_step_bytes(10, 1, 0, 3, 1, 4, 4, &d), SHARD_OK);
    assert_int_equal(d.reduce_scatter_bytes + d.all_gather_bytes + d.norm_bytes, 0); /* one rank sends nothing */
    assert_int_equal(shard_cost_data_step_bytes(10, 4, 4, 0, 1, 4, 4, &d), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "rank 4 of 4"));
    assert_int_equal(shard_cost_data_step_bytes(10, 4, 0, 0, 0, 4, 4, &d), SHARD_ERR_INVALID_ARG);
    assert_int_equal(shard_cost_data_step_bytes(10, 4, 0, -1, 1, 4, 4, &d), SHARD_ERR_INVALID_ARG);
}

/* data=2, ZeRO 0-3, two micro-steps: the dry run's peaks and traffic against the formulas. */
static void data_parallel_against_dry_run(void **state) {
    (void)state;
    const size_t K = 2, P = unit0 + 2 * block;
    for (int z = 0; z < 4; z++) {
        shard_analysis *a = analyze("data=2", z, K, 0, NULL, 0);
        for (size_t i = 0; i < a->ranks; i++) {
            const shard_rank_analysis *r = &a->rank[i];
            assert_int_equal(r->params, P);
            shard_cost_model_state m;
            assert_int_equal(shard_cost_model_state_bytes(r->params, 2, z, 4, 4, 8, &m), SHARD_OK);
            /* cost.h's differences: one byte an array (the shards, each moment); ZeRO-3's build held the
             * whole values beside the share; ZeRO-2/3's unit gradients (unit 0, the tied embedding, and
             * both blocks: one filling, one being reduced) */
            double build = z == 3 ? 4.0 * (double)P : 0, units = z >= 2 ? 4.0 * (double)(unit0 + 2 * block) + 3 : 0;
            assert_true((double)r->memory_bytes[SHARD_MEM_PARAMS] == m.params_bytes + build + (z == 3));
            assert_true((double)r->memory_bytes[SHARD_MEM_GRADS] == m.grads_bytes + (z == 1 ? 2 : 1) + units);
            assert_true((double)r->memory_bytes[SHARD_MEM_OPTIMIZER] == m.optimizer_bytes + 2);
            assert_true((double)r->memory_bytes[SHARD_MEM_COMM] == m.comm_bytes + (z >= 1));
            shard_cost_data_bytes d;
            assert_int_equal(shard_cost_data_step_bytes(r->params, 2, i, z, K, 4, 4, &d), SHARD_OK);
            /* the trainer's own two f64 sums (loss and tokens) go over the axis too */
            uint64_t trainer = 2 * shard_cost_all_reduce_bytes(1, 2, i, 8);
            assert_int_equal(op_bytes(r, "data", "all_reduce"), d.all_reduce_bytes + d.norm_bytes + trainer);
            assert_int_equal(op_bytes(r, "data", "reduce_scatterv"), d.reduce_scatter_bytes);
            uint64_t gathered = op_bytes(r, "data", "all_gatherv"), tied = z == 3 ? unit0 / 2 * 4 : 0;
            assert_int_equal(gathered, d.all_gather_bytes + tied); /* ZeRO-3: the tied embedding once more */
        }
        shard_analysis_destroy(a);
    }
}

/* tensor=2 with and without sequence parallel: the bytes on the tensor axis, exactly. */
static void tensor_against_dry_run(void **state) {
    (void)state;
    for (int sp = 0; sp < 2; sp++) {
        shard_analysis *a = analyze("tensor=2", 0, 0, sp, NULL, 0);
        for (size_t i = 0; i < a->ranks; i++)
            assert_int_equal(shard_rank_analysis_axis_bytes(&a->rank[i], "tensor"),
                             shard_cost_gpt_tensor_bytes(&tiny, BATCH * SEQ, 2, i, sp));
        shard_analysis_destroy(a);
    }
}

/* pipe=2 with 4 micro-batches: the schedule's idle fraction is the textbook's. */
static void bubble_against_dry_run(void **state) {
    (void)state;
    static const char *const names[2] = {"gpipe", "1f1b"};
    static const shard_pipe_kind kinds[2] = {SHARD_PIPE_GPIPE, SHARD_PIPE_1F1B};
    for (int k = 0; k < 2; k++) {
        shard_analysis *a = analyze("pipe=2", 0, 0, 0, names[k], 4);
        assert_true(fabs(a->bubble - shard_cost_pipe_bubble(kinds[k], 2, 4, 1)) < 1e-12);
        shard_analysis_destroy(a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flops_activations_and_bubble_by_hand),
        cmocka_unit_test(tensor_bytes_by_hand),
        cmocka_unit_test(model_state_by_hand),
        cmocka_unit_test(data_bytes_by_hand),
        cmocka_unit_test(data_parallel_against_dry_run),
        cmocka_unit_test(tensor_against_dry_run),
        cmocka_unit_test(bubble_against_dry_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
