/* test_moe.c — the mixture-of-experts GPT against PyTorch autograd golden vectors
 * (tests/fixtures/moe_golden_top1.safetensors and moe_golden_top2.safetensors, from
 * tools/reference/moe_golden.py, a reference written as a loop over experts): top-1 with a capacity
 * that drops tokens, and top-2 without.  Logits, loss, aux and z losses within 1e-5 relative, the
 * dropped assignments exactly, every gradient of the objective within 1e-4 relative to its largest
 * element (the GPT golden test's tolerances).  Also: jitter and random routing draw the same numbers
 * for the same step and differ at another, and config refusals naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "shard/shard.h"

#ifndef SHARD_FIXTURE_DIR
#define SHARD_FIXTURE_DIR "tests/fixtures"
#endif

static const float *data_of(shard_safetensors *st, const char *name, size_t *numel) {
    const shard_st_entry *e = shard_safetensors_find(st, name);
    if (!e) fail_msg("fixture lacks %s", name);
    if (numel) *numel = (size_t)(e->end - e->begin) / shard_dtype_size(e->dtype);
    return shard_safetensors_data(st, e);
}

static void compare(const float *got, const float *want, size_t n, double rel, const char *what) {
    double scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d, at = i;
    }
    if (!(worst <= rel * scale))
        fail_msg("%s: worst element %zu: %.9g vs %.9g (|diff| %.3g; allowed %.3g)", what, at, got[at], want[at], worst,
                 rel * scale);
}

static void scalar(double got, double want, const char *what) {
    if (!(fabs(got - want) <= 1e-5 * fabs(want))) fail_msg("%s %.9g vs %.9g", what, got, want);
}

static void golden(const char *file) {
    shard_safetensors *st = NULL;
    assert_int_equal(shard_safetensors_open(file, &st), SHARD_OK);
    shard_gpt_config c;
    if (shard_gpt_config_parse(shard_safetensors_metadata(st, "config"), file, &c) < 0)
        fail_msg("%s", shard_last_error());
    shard_gpt *g = NULL;
    assert_int_equal(shard_gpt_create(&c, 2, 8, &g), SHARD_OK);
    shard_params *p = shard_gpt_params(g), *grads = NULL;
    size_t loaded = 0;
    if (shard_params_load(p, file, 1, &loaded) < 0) fail_msg("%s", shard_last_error());
    assert_int_equal(loaded, p->count);
    assert_int_equal(p->total, shard_gpt_param_count(&c));
    assert_int_equal(shard_params_like(p, SHARD_MEM_GRADS, &grads), SHARD_OK);
    const int32_t *inputs = (const int32_t *)data_of(st, "inputs", NULL),
                  *targets = (const int32_t *)data_of(st, "targets", NULL);
    float loss = 0;
    assert_int_equal(shard_gpt_forward(g, inputs, targets, 2, 8, &loss), SHARD_OK);
    size_t n;
    const float *want = data_of(st, "logits", &n);
    compare(shard_gpt_logits(g), want, n, 1e-5, "logits");
    scalar(loss, data_of(st, "loss", NULL)[0], "loss");
    shard_model_router_stats rs;
    shard_gpt_router_stats(g, &rs);
    scalar(rs.aux_loss, data_of(st, "aux", NULL)[0], "aux loss");
    scalar(rs.z_loss, data_of(st, "z", NULL)[0], "z loss");
    assert_true(rs.dropped == (double)data_of(st, "dropped", NULL)[0]);
    assert_true(rs.assigned == (double)(rs.layers * 2 * 8 * c.num_experts_per_tok));
    assert_int_equal(shard_gpt_backward(g, grads), SHARD_OK);
    for (size_t i = 0; i < p->count; i++) {
        char key[SHARD_PARAM_NAME_BYTES + 8];
        snprintf(key, sizeof key, "grad/%s", p->info[i].name);
        const float *w = data_of(st, key, &n);
        assert_int_equal(n, p->info[i].numel);
        compare(grads->data + p->info[i].offset, w, n, 1e-4, key);
    }
    shard_params_destroy(grads);
    shard_gpt_destroy(g);
    shard_safetensors_close(st);
}

static void golden_top1_capacity(void **state) {
    (void)state;
    golden(SHARD_FIXTURE_DIR "/moe_golden_top1.safetensors");
}

static void golden_top2(void **state) {
    (void)state;
    golden(SHARD_FIXTURE_DIR "/moe_golden_top2.safetensors");
}

/* Jitter and random routing are functions of (seed, step, global row, position): the same forward
 * number gives the same loss and gradients bit for bit, the next one other noise. */
static void noise_is_keyed(void **state) {
    (void)state;
    const char *text = "{\"n_embd\": 16, \"n_layer\": 2, \"n_head\": 2, \"n_positions\": 8, \"vocab_size\": 32, "
                       "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"router_jitter_noise\": 0.2, "
                       "\"router_random_routing\": true, \"expert_capacity_factor\": 1.0}";
    shard_gpt_config c;
    assert_int_equal(shard_gpt_config_parse(text, "noise", &c), SHARD_OK);
    int32_t in[16], tg[16];
    for (int i = 0; i < 16; i++) in[i] = (i * 7) % 32, tg[i] = (i * 5 + 1) % 32;
    float loss[3];
    shard_model_router_stats rs[3];
    for (int run = 0; run < 3; run++) {
        shard_gpt *g = NULL;
        assert_int_equal(shard_gpt_create(&c, 2, 8, &g), SHARD_OK);
        shard_gpt_init(g, 11);
        if (run == 2) assert_int_equal(shard_gpt_forward(g, in, tg, 2, 8, &loss[run]), SHARD_OK); /* step 1 */
        assert_int_equal(shard_gpt_forward(g, in, tg, 2, 8, &loss[run]), SHARD_OK);
        shard_gpt_router_stats(g, &rs[run]);
        assert_true(rs[run].assigned <= 2 * 2 * 16); /* random routing may leave second choices out */
        shard_gpt_destroy(g);
    }
    assert_true(loss[0] == loss[1] && rs[0].aux_loss == rs[1].aux_loss);
    assert_true(loss[0] != loss[2] || rs[0].assigned != rs[2].assigned);
    assert_int_equal(shard_moe_capacity(1.25f, 64, 2, 4), 40);
    assert_int_equal(shard_moe_capacity(0, 64, 2, 4), SIZE_MAX);
}

static void config_refusals(void **state) {
    (void)state;
    const char *base = "{\"n_embd\": 16, \"n_layer\": 2, \"n_head\": 2, \"n_positions\": 8, \"vocab_size\": 32, ";
    const char *cases[][2] = {
        {"\"num_local_experts\": 4, \"num_experts_per_tok\": 5}", "'num_experts_per_tok' = 5: must be 1 .. num_local"},
        {"\"num_experts_per_tok\": 2}", "without num_local_experts"},
        {"\"num_local_experts\": 4, \"moe_layer_frequency\": 3}", "'moe_layer_frequency' = 3: must be 1 .. n_layer"},
        {"\"num_local_experts\": 4, \"expert_capacity_factor\": -1}", "'expert_capacity_factor'"},
        {"\"num_local_experts\": 4, \"router_jitter_noise\": 1.5}", "'router_jitter_noise' must be in [0, 1)"},
        {"\"num_local_experts\": 4, \"num_experts_per_tok\": 1, \"norm_topk_prob\": true}", "'norm_topk_prob'"},
        {"\"num_local_experts\": 4, \"num_experts_per_tok\": 1, \"router_random_routing\": true}",
         "'router_random_routing' needs num_experts_per_tok = 2"},
        {"\"num_local_experts\": 4, \"router_random_routing\": 1}", "must be true or false"},
        {"\"num_local_experts\": 0}", "'num_local_experts' must be a positive integer"},
        {"\"num_local_expert\": 4}", "did you mean 'num_local_experts'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "%s%s", base, cases[i][0]);
        shard_gpt_config c;
        assert_int_not_equal(shard_gpt_config_parse(text, "moe.json", &c), SHARD_OK);
        if (!strstr(shard_last_error(), cases[i][1])) fail_msg("%s: got '%s'", cases[i][0], shard_last_error());
    }
    /* defaults: top-2 renormalised, every block, aux 0.01; a dense config reads none of it */
    shard_gpt_config c;
    char text[512];
    snprintf(text, sizeof text, "%s\"num_local_experts\": 8}", base);
    assert_int_equal(shard_gpt_config_parse(text, "moe.json", &c), SHARD_OK);
    assert_int_equal(c.num_experts_per_tok, 2);
    assert_true(c.norm_topk_prob && c.moe_layer_frequency == 1 && c.router_aux_loss_coef == 0.01f);
    assert_true(shard_gpt_block_is_moe(&c, 0) && shard_gpt_block_is_moe(&c, 1));
    c.moe_layer_frequency = 2;
    assert_true(!shard_gpt_block_is_moe(&c, 0) && shard_gpt_block_is_moe(&c, 1));
}

/* Weight files hold each expert as a tensor of its own: the stacks' members by their global index (dim 0
 * dropped), the router and dense parameters as they are; read back, the stacks are joined as they were. */
static void experts_stored_by_index(void **state) {
    (void)state;
    const char *text = "{\"n_embd\": 16, \"n_layer\": 2, \"n_head\": 2, \"n_positions\": 8, \"vocab_size\": 32, "
                       "\"num_local_experts\": 4, \"moe_layer_frequency\": 2}";
    shard_gpt_config c;
    assert_int_equal(shard_gpt_config_parse(text, "stored", &c), SHARD_OK);
    shard_gpt *g = NULL;
    assert_int_equal(shard_gpt_create(&c, 1, 8, &g), SHARD_OK);
    shard_gpt_init(g, 5);
    shard_model *m = shard_gpt_model(g);
    shard_params *p = shard_gpt_params(g), *stored = NULL;
    size_t prefix = 0, fc = (size_t)(shard_params_find(p, "h.1.mlp.experts.c_fc.weight") - p->info);
    assert_int_equal(shard_model_stack(m, fc, &prefix), 4);
    assert_int_equal(prefix, strlen("h.1.mlp.experts."));
    assert_int_equal(shard_model_stack(m, (size_t)(shard_params_find(p, "h.1.mlp.gate.weight") - p->info), NULL), 0);
    assert_int_equal(shard_model_stored_params(m, &stored), SHARD_OK);
    assert_int_equal(stored->count, p->count + 4 * 3); /* 4 stacks of 4 members each in the MoE block */
    assert_null(shard_params_find(stored, "h.1.mlp.experts.c_fc.weight"));
    const shard_param_info *e3 = shard_params_find(stored, "h.1.mlp.experts.3.c_fc.weight");
    assert_non_null(e3);
    assert_true(e3->ndim == 2 && e3->shape[0] == 16 && e3->shape[1] == 64);
    assert_non_null(shard_params_find(stored, "h.0.mlp.c_fc.weight")); /* the dense block's MLP */
    const shard_param_info *w = &p->info[fc];
    for (size_t i = 0; i < e3->numel; i++) stored->data[e3->offset + i] = (float)i; /* expert 3 only */
    for (size_t i = 0; i < stored->count; i++) {
        const shard_param_info *own = shard_params_find(p, stored->info[i].name);
        if (own) memcpy(stored->data + stored->info[i].offset, p->data + own->offset, own->numel * sizeof(float));
    }
    float before = p->data[w->offset];
    shard_model_take_stored(m, stored);
    assert_true(p->data[w->offset + 3 * e3->numel + 5] == 5.0f && p->data[w->offset] == 0.0f && before != 0.0f);
    shard_params_destroy(stored);
    shard_gpt_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_top1_capacity),    cmocka_unit_test(golden_top2),
        cmocka_unit_test(noise_is_keyed),          cmocka_unit_test(config_refusals),
        cmocka_unit_test(experts_stored_by_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
