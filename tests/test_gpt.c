/* test_gpt.c — the GPT-2-style decoder against PyTorch autograd golden
 * vectors (tests/fixtures/gpt_golden.safetensors, from
 * tools/reference/gpt_golden.py): logits and loss within 1e-5 relative,
 * every parameter gradient within 1e-4 relative to its largest element,
 * and the weights after 3 AdamW steps within 1e-5 absolute (the steps are
 * 1e-3 in size; a gradient that differs in its last bits moves a weight by
 * far less).  Tolerances: fp32 GEMMs and reductions in another order than
 * PyTorch's round differently, by about 1e-7 relative per operation.
 * Also: bitwise determinism of two runs, and config refusals naming keys. */
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

static shard_safetensors *golden;

static const float *data_of(const char *name, size_t *numel) {
    const shard_st_entry *e = shard_safetensors_find(golden, name);
    if (!e) fail_msg("fixture lacks %s", name);
    if (numel) *numel = (size_t)(e->end - e->begin) / shard_dtype_size(e->dtype);
    return shard_safetensors_data(golden, e);
}

static void compare(const float *got, const float *want, size_t n, double rel, double abs_tol, const char *what) {
    double scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) { /* a NaN is the worst element (d > worst is false for it) */
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d, at = i;
    }
    if (!(worst <= rel * scale + abs_tol))
        fail_msg("%s: worst element %zu: %.9g vs %.9g (|diff| %.3g; allowed %.3g)", what, at, got[at], want[at], worst,
                 rel * scale + abs_tol);
}

static shard_gpt *load_model_for(int training) {
    shard_gpt_config c;
    const char *text = shard_safetensors_metadata(golden, "config");
    if (shard_gpt_config_parse(text, "fixture config", &c) < 0) fail_msg("%s", shard_last_error());
    shard_gpt *g = NULL;
    assert_int_equal((training ? shard_gpt_create_training : shard_gpt_create)(&c, 2, 8, &g), SHARD_OK);
    size_t loaded = 0;
    if (shard_params_load(shard_gpt_params(g), SHARD_FIXTURE_DIR "/gpt_golden.safetensors", 1, &loaded) < 0)
        fail_msg("%s", shard_last_error());
    assert_int_equal(loaded, 2 + 2 * 12 + 2);
    return g;
}

static shard_gpt *load_model(void) { return load_model_for(0); }

static void forward_backward_adamw(void **state) {
    (void)state;
    shard_gpt *g = load_model();
    shard_params *p = shard_gpt_params(g), *grads = NULL, *m = NULL, *v = NULL;
    assert_int_equal(shard_params_like(p, SHARD_MEM_GRADS, &grads), SHARD_OK);
    const int32_t *inputs = (const int32_t *)data_of("inputs", NULL),
                  *targets = (const int32_t *)data_of("targets", NULL);
    float loss = 0;
    assert_int_equal(shard_gpt_forward(g, inputs, targets, 2, 8, &loss), SHARD_OK);
    size_t n;
    const float *want_logits = data_of("logits", &n);
    compare(shard_gpt_logits(g), want_logits, n, 1e-5, 0, "logits");
    const float *want_loss = data_of("loss", NULL);
    if (!(fabs(loss - want_loss[0]) <= 1e-5 * fabs(want_loss[0]))) fail_msg("loss %.9g vs %.9g", loss, want_loss[0]);
    assert_int_equal(shard_gpt_backward(g, grads), SHARD_OK);
    for (size_t i = 0; i < p->count; i++) {
        char key[SHARD_PARAM_NAME_BYTES + 8];
        snprintf(key, sizeof key, "grad/%s", p->info[i].name);
        const float *want = data_of(key, &n);
        assert_int_equal(n, p->info[i].numel);
        compare(grads->data + p->info[i].offset, want, n, 1e-4, 0, key);
    }
    /* three AdamW steps on the same batch, as the fixture's */
    assert_int_equal(shard_params_like(p, SHARD_MEM_OPTIMIZER, &m), SHARD_OK);
    assert_int_equal(shard_params_like(p, SHARD_MEM_OPTIMIZER, &v), SHARD_OK);
    shard_adamw_config ac = {0.9f, 0.999f, 1e-8f, 0.1f};
    for (uint64_t step = 1; step <= 3; step++) {
        if (step > 1) {
            shard_params_zero(grads);
            assert_int_equal(shard_gpt_forward(g, inputs, targets, 2, 8, &loss), SHARD_OK);
            assert_int_equal(shard_gpt_backward(g, grads), SHARD_OK);
        }
        shard_adamw_update(&ac, step, 1e-3f, p->data, grads->data, m->data, v->data, p->total);
    }
    for (size_t i = 0; i < p->count; i++) {
        char key[SHARD_PARAM_NAME_BYTES + 8];
        snprintf(key, sizeof key, "adamw3/%s", p->info[i].name);
        const float *want = data_of(key, &n);
        compare(p->data + p->info[i].offset, want, n, 0, 1e-5, key);
    }
    shard_params_destroy(grads), shard_params_destroy(m), shard_params_destroy(v);
    shard_gpt_destroy(g);
}

static void determinism(void **state) {
    (void)state;
    float losses[2];
    shard_params *grads[2];
    for (int run = 0; run < 2; run++) {
        shard_gpt *g = load_model();
        assert_int_equal(shard_params_like(shard_gpt_params(g), SHARD_MEM_GRADS, &grads[run]), SHARD_OK);
        const int32_t *inputs = (const int32_t *)data_of("inputs", NULL),
                      *targets = (const int32_t *)data_of("targets", NULL);
        assert_int_equal(shard_gpt_forward(g, inputs, targets, 2, 8, &losses[run]), SHARD_OK);
        assert_int_equal(shard_gpt_backward(g, grads[run]), SHARD_OK);
        shard_gpt_destroy(g);
    }
    assert_memory_equal(&losses[0], &losses[1], sizeof losses[0]);
    assert_memory_equal(grads[0]->data, grads[1]->data, grads[0]->total * sizeof(float));
    /* a backward into given grads leaves the model's own gradient pointers as they were bound */
    shard_gpt *g = load_model();
    shard_params *own = NULL, *given = NULL;
    assert_int_equal(shard_params_like(shard_gpt_params(g), SHARD_MEM_GRADS, &own), SHARD_OK);
    assert_int_equal(shard_params_like(shard_gpt_params(g), SHARD_MEM_GRADS, &given), SHARD_OK);
    shard_model_bind_grad_slab(shard_gpt_model(g), own->data);
    const int32_t *inputs = (const int32_t *)data_of("inputs", NULL),
                  *targets = (const int32_t *)data_of("targets", NULL);
    assert_int_equal(shard_gpt_forward(g, inputs, targets, 2, 8, &losses[0]), SHARD_OK);
    assert_int_equal(shard_gpt_backward(g, given), SHARD_OK);
    for (size_t i = 0; i < own->total; i++)
        if (own->data[i] != 0.0f) fail_msg("the bound gradients changed at %zu: %g", i, (double)own->data[i]);
    assert_int_equal(shard_gpt_forward(g, inputs, targets, 2, 8, &losses[0]), SHARD_OK);
    assert_int_equal(shard_gpt_backward(g, NULL), SHARD_OK); /* into the bound slab */
    assert_memory_equal(own->data, grads[0]->data, own->total * sizeof(float));
    shard_params_destroy(own), shard_params_destroy(given);
    shard_gpt_destroy(g);
    shard_params_destroy(grads[0]), shard_params_destroy(grads[1]);
}

/* A model made for training writes the loss's gradient over the logits: one [N, vocab] buffer less, the
 * same loss and gradients to the bit, and the logits again after a forward without targets. */
static void training_model_shares_logits(void **state) {
    (void)state;
    shard_mem_stats at[3]; /* activations charged by making each model */
    shard_mem_stats_get(&at[0]);
    shard_gpt *kept = load_model();
    shard_mem_stats_get(&at[1]);
    shard_gpt *g = load_model_for(1);
    shard_mem_stats_get(&at[2]);
    shard_params *grads[2];
    float loss[2];
    const int32_t *inputs = (const int32_t *)data_of("inputs", NULL),
                  *targets = (const int32_t *)data_of("targets", NULL);
    size_t n_logits;
    data_of("logits", &n_logits);
    shard_gpt *both[2] = {kept, g};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(shard_params_like(shard_gpt_params(both[k]), SHARD_MEM_GRADS, &grads[k]), SHARD_OK);
        assert_int_equal(shard_gpt_forward(both[k], inputs, targets, 2, 8, &loss[k]), SHARD_OK);
        assert_int_equal(shard_gpt_backward(both[k], grads[k]), SHARD_OK);
    }
    assert_memory_equal(&loss[0], &loss[1], sizeof loss[0]);
    assert_memory_equal(grads[0]->data, grads[1]->data, grads[0]->total * sizeof(float));
    assert_non_null(shard_gpt_logits(kept));
    assert_null(shard_gpt_logits(g)); /* they hold the gradient now */
    uint64_t kept_bytes = at[1].current_bytes[SHARD_MEM_ACTIVATIONS] - at[0].current_bytes[SHARD_MEM_ACTIVATIONS];
    uint64_t training_bytes = at[2].current_bytes[SHARD_MEM_ACTIVATIONS] - at[1].current_bytes[SHARD_MEM_ACTIVATIONS];
    assert_int_equal(kept_bytes - training_bytes, n_logits * sizeof(float));
    assert_int_equal(shard_gpt_forward(kept, inputs, NULL, 2, 8, NULL), SHARD_OK);
    assert_int_equal(shard_gpt_forward(g, inputs, NULL, 2, 8, NULL), SHARD_OK);
    assert_non_null(shard_gpt_logits(g));
    assert_memory_equal(shard_gpt_logits(g), shard_gpt_logits(kept), n_logits * sizeof(float));
    shard_params_destroy(grads[0]), shard_params_destroy(grads[1]);
    shard_gpt_destroy(kept), shard_gpt_destroy(g);
}

/* Dropout through the public forward: each training forward draws new masks; the same seed, the same ones. */
static void dropout_masks(void **state) {
    (void)state;
    shard_gpt_config c;
    const char *text = shard_safetensors_metadata(golden, "config");
    if (shard_gpt_config_parse(text, "fixture config", &c) < 0) fail_msg("%s", shard_last_error());
    c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.2f;
    const int32_t *inputs = (const int32_t *)data_of("inputs", NULL),
                  *targets = (const int32_t *)data_of("targets", NULL);
    float loss[2][3];
    for (int run = 0; run < 2; run++) {
        shard_gpt *g = NULL;
        assert_int_equal(shard_gpt_create(&c, 2, 8, &g), SHARD_OK);
        shard_gpt_init(g, 7);
        for (int k = 0; k < 3; k++)
            assert_int_equal(shard_gpt_forward(g, inputs, targets, 2, 8, &loss[run][k]), SHARD_OK);
        shard_gpt_destroy(g);
    }
    /* a token id outside the vocabulary is refused before any work, naming where it is */
    shard_gpt *g = NULL;
    assert_int_equal(shard_gpt_create(&c, 2, 8, &g), SHARD_OK);
    int32_t bad[16];
    memcpy(bad, inputs, sizeof bad);
    bad[11] = (int32_t)c.vocab_size;
    assert_int_equal(shard_gpt_forward(g, bad, targets, 2, 8, &loss[0][0]), SHARD_ERR_INVALID_ARG);
    if (!strstr(shard_last_error(), "token id") || !strstr(shard_last_error(), "at position 11"))
        fail_msg("bad token: %s", shard_last_error());
    shard_gpt_destroy(g);
    assert_memory_equal(loss[0], loss[1], sizeof loss[0]);
    if (loss[0][0] == loss[0][1] || loss[0][1] == loss[0][2])
        fail_msg("the same dropout masks twice: losses %.9g %.9g %.9g", (double)loss[0][0], (double)loss[0][1],
                 (double)loss[0][2]);
}

static void config_refusals(void **state) {
    (void)state;
    shard_gpt_config c;
    struct {
        const char *json, *expect;
    } cases[] = {
        {"{\"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 8, \"vocab_size\": 16, \"n_emdb\": 3}",
         "key 'n_emdb' is unknown"},
        {"{\"n_embd\": 30, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 8, \"vocab_size\": 16}",
         "key 'n_head' = 4 does not divide n_embd = 30 into heads"},
        {"{\"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 8}", "key 'vocab_size' is missing"},
        {"{\"n_embd\": \"32\", \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 8, \"vocab_size\": 16}",
         "key 'n_embd' must be a positive integer"},
        {"{\"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 8, \"vocab_size\": 16, "
         "\"activation_function\": \"relu\"}",
         "key 'activation_function' must be \"gelu_new\""},
        {"[1]", "must be a JSON object"},
        {"{\"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 8, \"vocab_size\": 16, \"n_special\": 2}",
         "key 'n_special' must be 0 (no special tokens)"},
        {"{\"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4, \"n_positions\": 8, \"vocab_size\": 16, \"attn_pdrop\": 1.5}",
         "key 'attn_pdrop' must be in [0, 1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(shard_gpt_config_parse(cases[i].json, "cfg.json", &c), SHARD_ERR_INVALID_ARG);
        if (!strstr(shard_last_error(), cases[i].expect) || strncmp(shard_last_error(), "cfg.json: ", 10) != 0)
            fail_msg("case %zu: '%s' lacks '%s'", i, shard_last_error(), cases[i].expect);
    }
    /* a config filled in by the caller gets the same checks (n_head 0 divided by zero) */
    shard_gpt_config by_hand = {.n_embd = 32,
                                .n_layer = 1,
                                .n_head = 0,
                                .n_positions = 8,
                                .vocab_size = 16,
                                .layer_norm_epsilon = 1e-5f,
                                .initializer_range = 0.02f};
    shard_gpt *g = NULL;
    assert_int_equal(shard_gpt_create(&by_hand, 1, 8, &g), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "gpt: key 'n_head' is missing"));
    by_hand.n_head = 3;
    assert_int_equal(shard_gpt_create(&by_hand, 1, 8, &g), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "key 'n_head' = 3 does not divide n_embd = 32"));
    by_hand.n_head = 4, by_hand.attn_pdrop = 1.5f; /* dropout kept every value's range too (1.5 dropped all) */
    assert_int_equal(shard_gpt_create(&by_hand, 1, 8, &g), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "key 'attn_pdrop' must be in [0, 1)"));
    by_hand.attn_pdrop = 0, by_hand.resid_pdrop = -3;
    assert_int_equal(shard_gpt_create(&by_hand, 1, 8, &g), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "key 'resid_pdrop' must be in [0, 1)"));
    assert_null(g);
    /* Hugging Face's GPT-2 config.json is accepted as it is */
    const char *hf =
        "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], \"attn_pdrop\": 0.1,"
        "\"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": 50256, \"initializer_range\": 0.02,"
        "\"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768,"
        "\"n_head\": 12, \"n_inner\": null, \"n_layer\": 12, \"n_positions\": 1024, \"resid_pdrop\": 0.1,"
        "\"scale_attn_weights\": true, \"summary_activation\": null, \"summary_first_dropout\": 0.1,"
        "\"summary_proj_to_labels\": true, \"summary_type\": \"cls_index\", \"summary_use_proj\": true,"
        "\"task_specific_params\": {\"text-generation\": {\"do_sample\": true, \"max_length\": 50}},"
        "\"transformers_version\": \"4.26.0\", \"use_cache\": true, \"vocab_size\": 50257}";
    assert_int_equal(shard_gpt_config_parse(hf, "config.json", &c), SHARD_OK);
    assert_int_equal(shard_gpt_param_count(&c), 124439808); /* GPT-2 small: 124M */
    /* gpt2-medium's (large and xl's the same keys): n_special, predict_special_tokens */
    const char *medium = "{\"activation_function\": \"gelu_new\", \"attn_pdrop\": 0.1, \"embd_pdrop\": 0.1,"
                         "\"initializer_range\": 0.02, \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\","
                         "\"n_ctx\": 1024, \"n_embd\": 1024, \"n_head\": 16, \"n_layer\": 24, \"n_positions\": 1024,"
                         "\"n_special\": 0, \"predict_special_tokens\": true, \"resid_pdrop\": 0.1,"
                         "\"gradient_checkpointing\": false, \"vocab_size\": 50257}";
    assert_int_equal(shard_gpt_config_parse(medium, "config.json", &c), SHARD_OK);
    assert_int_equal(shard_gpt_param_count(&c), 354823168); /* GPT-2 medium: 355M */
    const char *xl = "{\"activation_function\": \"gelu_new\", \"attn_pdrop\": 0.1, \"embd_pdrop\": 0.1,"
                     "\"initializer_range\": 0.02, \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\","
                     "\"n_ctx\": 1024, \"n_embd\": 1600, \"n_head\": 25, \"n_layer\": 48, \"n_positions\": 1024,"
                     "\"output_past\": true, \"resid_pdrop\": 0.1, \"vocab_size\": 50257}";
    assert_int_equal(shard_gpt_config_parse(xl, "config.json", &c), SHARD_OK);
    assert_int_equal(shard_gpt_param_count(&c), 1557611200); /* GPT-2 xl: 1.5B */
}

static int setup(void **state) {
    (void)state;
    return shard_safetensors_open(SHARD_FIXTURE_DIR "/gpt_golden.safetensors", &golden) == SHARD_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    shard_safetensors_close(golden);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_backward_adamw),
        cmocka_unit_test(determinism),
        cmocka_unit_test(training_model_shares_logits),
        cmocka_unit_test(dropout_masks),
        cmocka_unit_test(config_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
