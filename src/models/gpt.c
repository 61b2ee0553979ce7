/* gpt.c — the GPT-2-style decoder of gpt.h: config, parameters with Hugging
 * Face's names, initialisation, forward and backward.
 *
 * Shapes: N = B*T rows of width C; H heads of D = C/H; V vocabulary.  The
 * forward saves, per block, the block input, both LayerNorm outputs and
 * statistics, qkv, the attention probabilities, the heads' outputs, the
 * residual in the middle, and the MLP's pre- and post-GELU activations. */
#include "shard/gpt.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/blas.h"
#include "shard/layers.h"

/* ---------------------------------------------------------------- config */

static shard_status bad_key(const char *where, const char *key, const char *why) {
    return shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' %s", where, key, why);
}

static shard_status size_field(const char *where, const char *key, const json_t *v, size_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) <= 0)
        return bad_key(where, key, "must be a positive integer");
    *out = (size_t)json_integer_value(v);
    return SHARD_OK;
}

static shard_status float_field(const char *where, const char *key, const json_t *v, float *out) {
    if (!json_is_number(v)) return bad_key(where, key, "must be a number");
    *out = (float)json_number_value(v);
    return SHARD_OK;
}

shard_status shard_gpt_config_parse(const char *text, const char *where, shard_gpt_config *out) {
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: not valid JSON: %s (line %d, column %d)", where, err.text, err.line,
                           err.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: the config must be a JSON object", where);
    }
    shard_gpt_config c = {0, 0, 0, 0, 0, 1e-5f, 0.02f};
    shard_status s = SHARD_OK;
    const char *key;
    json_t *v;
    /* Hugging Face GPT-2 keys that do not change the math here, accepted as they are */
    static const char *const ignored[] = {"architectures", "bos_token_id", "eos_token_id", "n_ctx", "summary_activation",
                                          "summary_first_dropout", "summary_proj_to_labels", "summary_type",
                                          "summary_use_proj", "task_specific_params", "torch_dtype", "transformers_version",
                                          "use_cache", "_name_or_path", "comment"};
    json_object_foreach(root, key, v) {
        if (s < 0) break;
        if (strcmp(key, "n_embd") == 0) s = size_field(where, key, v, &c.n_embd);
        else if (strcmp(key, "n_layer") == 0) s = size_field(where, key, v, &c.n_layer);
        else if (strcmp(key, "n_head") == 0) s = size_field(where, key, v, &c.n_head);
        else if (strcmp(key, "n_positions") == 0) s = size_field(where, key, v, &c.n_positions);
        else if (strcmp(key, "vocab_size") == 0) s = size_field(where, key, v, &c.vocab_size);
        else if (strcmp(key, "layer_norm_epsilon") == 0) s = float_field(where, key, v, &c.layer_norm_epsilon);
        else if (strcmp(key, "initializer_range") == 0) s = float_field(where, key, v, &c.initializer_range);
        else if (strcmp(key, "model_type") == 0) {
            if (!json_is_string(v) || (strcmp(json_string_value(v), "gpt2") && strcmp(json_string_value(v), "gpt")))
                s = bad_key(where, key, "must be \"gpt2\"");
        } else if (strcmp(key, "activation_function") == 0) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "gelu_new") != 0)
                s = bad_key(where, key, "must be \"gelu_new\" (GELU, tanh form)");
        } else if (strcmp(key, "n_inner") == 0) {
            if (!json_is_null(v) && !json_is_integer(v)) s = bad_key(where, key, "must be null or 4 * n_embd");
        } else if (strcmp(key, "resid_pdrop") == 0 || strcmp(key, "embd_pdrop") == 0 || strcmp(key, "attn_pdrop") == 0) {
            float p = 0;
            s = float_field(where, key, v, &p);
            if (s == SHARD_OK && !(p >= 0 && p < 1)) s = bad_key(where, key, "must be in [0, 1)");
            /* dropout is off in this model's training (deterministic math across strategies); the keys are accepted */
        } else if (strcmp(key, "scale_attn_weights") == 0) {
            if (!json_is_true(v)) s = bad_key(where, key, "must be true (attention scaled by 1/sqrt(head size))");
        } else if (strcmp(key, "scale_attn_by_inverse_layer_idx") == 0 || strcmp(key, "reorder_and_upcast_attn") == 0) {
            if (!json_is_false(v)) s = bad_key(where, key, "must be false");
        } else {
            int known = 0;
            for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) known |= strcmp(key, ignored[i]) == 0;
            if (!known)
                s = bad_key(where, key, "is unknown (GPT keys: n_embd, n_layer, n_head, n_positions, vocab_size, "
                                        "layer_norm_epsilon, initializer_range, and Hugging Face GPT-2's others)");
        }
    }
    const json_t *inner = json_object_get(root, "n_inner");
    size_t n_inner = json_is_integer(inner) ? (size_t)json_integer_value(inner) : 0;
    json_decref(root);
    if (s < 0) return s;
    const char *need[] = {"n_embd", "n_layer", "n_head", "n_positions", "vocab_size"};
    size_t have[] = {c.n_embd, c.n_layer, c.n_head, c.n_positions, c.vocab_size};
    for (int i = 0; i < 5; i++)
        if (!have[i]) return bad_key(where, need[i], "is missing");
    if (c.n_embd % c.n_head) {
        char why[96];
        snprintf(why, sizeof why, "= %zu does not divide n_embd = %zu into heads", c.n_head, c.n_embd);
        return bad_key(where, "n_head", why);
    }
    if (n_inner && n_inner != 4 * c.n_embd) return bad_key(where, "n_inner", "must be null or 4 * n_embd");
    if (!(c.layer_norm_epsilon > 0)) return bad_key(where, "layer_norm_epsilon", "must be > 0");
    if (!(c.initializer_range >= 0)) return bad_key(where, "initializer_range", "must be >= 0");
    *out = c;
    return SHARD_OK;
}

shard_status shard_gpt_config_load(const char *path, shard_gpt_config *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return shard_error(SHARD_ERR_IO, "%s: cannot open the config", path);
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (int ch; (ch = fgetc(f)) != EOF;) {
        if (len + 1 >= cap) {
            char *more = realloc(text, cap ? 2 * cap : 4096);
            if (!more) {
                free(text), fclose(f);
                return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
            }
            text = more, cap = cap ? 2 * cap : 4096;
        }
        text[len++] = (char)ch;
    }
    fclose(f);
    if (!text) return shard_error(SHARD_ERR_INVALID_ARG, "%s: the config is empty", path);
    text[len] = '\0';
    shard_status s = shard_gpt_config_parse(text, path, out);
    free(text);
    return s;
}

size_t shard_gpt_param_count(const shard_gpt_config *c) {
    size_t C = c->n_embd, per_layer = 4 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return c->vocab_size * C + c->n_positions * C + c->n_layer * per_layer + 2 * C;
}

/* ---------------------------------------------------------------- the model */

enum { LN1_W, LN1_B, ATTN_W, ATTN_B, APROJ_W, APROJ_B, LN2_W, LN2_B, FC_W, FC_B, MPROJ_W, MPROJ_B, PER_LAYER };

typedef struct layer_acts {
    float *in, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *mid, *ln2, *ln2_mean, *ln2_rstd, *fc, *gelu;
} layer_acts;

struct shard_gpt {
    shard_gpt_config c;
    size_t max_b, max_t, B, T;
    shard_params *params;
    size_t wte, wpe, lnf_w, lnf_b, *layer; /* parameter indices; layer[l * PER_LAYER + k] */
    layer_acts *acts;
    float *out, *lnf, *lnf_mean, *lnf_rstd, *logits, *dlogits;
    float *d_resid, *d_tmp, *d_ln, *d_qkv, *d_atty, *d_fc;
    int32_t *inputs, *targets;
    int have_targets;
    float *slab; /* every activation buffer, one allocation */
};

static float *P(const shard_gpt *g, size_t index) { return g->params->data + g->params->info[index].offset; }
static float *G(shard_params *grads, const shard_gpt *g, size_t index) { return grads->data + g->params->info[index].offset; }

static void name_param(shard_param_info *t, const char *name, int ndim, size_t d0, size_t d1) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim, t->shape[0] = d0, t->shape[1] = d1;
}

shard_status shard_gpt_create(const shard_gpt_config *c, size_t max_batch, size_t max_seq, shard_gpt **out) {
    *out = NULL;
    if (!max_batch || !max_seq || max_seq > c->n_positions)
        return shard_error(SHARD_ERR_INVALID_ARG, "gpt: batch %zu x sequence %zu (the sequence can be 1..n_positions = %zu)",
                           max_batch, max_seq, c->n_positions);
    shard_gpt *g = calloc(1, sizeof *g);
    size_t L = c->n_layer, C = c->n_embd, count = 2 + L * PER_LAYER + 2;
    shard_param_info *t = calloc(count, sizeof *t);
    if (g) g->layer = calloc(L * PER_LAYER, sizeof *g->layer), g->acts = calloc(L, sizeof *g->acts);
    if (!g || !t || !g->layer || !g->acts) {
        if (g) free(g->layer), free(g->acts);
        free(g), free(t);
        return shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
    }
    g->c = *c, g->max_b = max_batch, g->max_t = max_seq;
    size_t n = 0;
    name_param(&t[n], "wte.weight", 2, c->vocab_size, C), g->wte = n++;
    name_param(&t[n], "wpe.weight", 2, c->n_positions, C), g->wpe = n++;
    static const char *const suffix[PER_LAYER] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    const size_t rows[PER_LAYER] = {C, C, C, 3 * C, C, C, C, C, C, 4 * C, 4 * C, C};
    const size_t cols[PER_LAYER] = {0, 0, 3 * C, 0, C, 0, 0, 0, 4 * C, 0, C, 0};
    for (size_t l = 0; l < L; l++)
        for (int k = 0; k < PER_LAYER; k++) {
            char name[SHARD_PARAM_NAME_BYTES];
            snprintf(name, sizeof name, "h.%zu.%s", l, suffix[k]);
            name_param(&t[n], name, cols[k] ? 2 : 1, rows[k], cols[k]);
            g->layer[l * PER_LAYER + (size_t)k] = n++;
        }
    name_param(&t[n], "ln_f.weight", 1, C, 0), g->lnf_w = n++;
    name_param(&t[n], "ln_f.bias", 1, C, 0), g->lnf_b = n++;
    shard_status s = shard_params_create(t, n, SHARD_MEM_PARAMS, &g->params);
    free(t);
    /* activations: one accounted slab carved into buffers */
    size_t N = max_batch * max_seq, H = c->n_head, V = c->vocab_size, att = max_batch * H * max_seq * max_seq;
    size_t per_layer = N * C * 5 + N * 3 * C + att + N * 4 * C * 2 + N * 4;
    size_t total = L * per_layer + N * C * 2 + N * 2 + N * V * 2 + N * C * 4 + N * 3 * C + N * 4 * C;
    if (s == SHARD_OK) {
        g->slab = shard_alloc(total * sizeof(float), SHARD_MEM_ACTIVATIONS);
        g->inputs = calloc(N, sizeof *g->inputs), g->targets = calloc(N, sizeof *g->targets);
        if (!g->slab || !g->inputs || !g->targets) s = shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory for activations");
    }
    if (s < 0) {
        shard_gpt_destroy(g);
        return s;
    }
    float *p = g->slab;
#define TAKE(ptr, n_) (ptr = p, p += (n_))
    for (size_t l = 0; l < L; l++) {
        layer_acts *a = &g->acts[l];
        TAKE(a->in, N * C), TAKE(a->ln1, N * C), TAKE(a->ln1_mean, N), TAKE(a->ln1_rstd, N), TAKE(a->qkv, N * 3 * C);
        TAKE(a->att, att), TAKE(a->atty, N * C), TAKE(a->mid, N * C), TAKE(a->ln2, N * C), TAKE(a->ln2_mean, N);
        TAKE(a->ln2_rstd, N), TAKE(a->fc, N * 4 * C), TAKE(a->gelu, N * 4 * C);
    }
    TAKE(g->out, N * C), TAKE(g->lnf, N * C), TAKE(g->lnf_mean, N), TAKE(g->lnf_rstd, N), TAKE(g->logits, N * V);
    TAKE(g->dlogits, N * V), TAKE(g->d_resid, N * C), TAKE(g->d_tmp, N * C), TAKE(g->d_ln, N * C), TAKE(g->d_atty, N * C);
    TAKE(g->d_qkv, N * 3 * C), TAKE(g->d_fc, N * 4 * C);
#undef TAKE
    *out = g;
    return SHARD_OK;
}

void shard_gpt_destroy(shard_gpt *g) {
    if (!g) return;
    shard_params_destroy(g->params);
    shard_free(g->slab);
    free(g->inputs), free(g->targets), free(g->layer), free(g->acts);
    free(g);
}

shard_params *shard_gpt_params(shard_gpt *g) { return g->params; }
const shard_gpt_config *shard_gpt_config_of(const shard_gpt *g) { return &g->c; }
const float *shard_gpt_logits(const shard_gpt *g) { return g->logits; }

void shard_gpt_init(shard_gpt *g, uint64_t seed) {
    float std = g->c.initializer_range, proj_std = std / sqrtf(2.0f * (float)g->c.n_layer);
    for (size_t i = 0; i < g->params->count; i++) {
        const shard_param_info *info = &g->params->info[i];
        float *x = g->params->data + info->offset;
        const char *name = info->name;
        size_t len = strlen(name);
        if (len > 5 && strcmp(name + len - 5, ".bias") == 0) {
            memset(x, 0, info->numel * sizeof *x);
        } else if (strstr(name, "ln_") != NULL) {
            for (size_t k = 0; k < info->numel; k++) x[k] = 1.0f;
        } else {
            shard_init_normal(x, 0, info->numel, strstr(name, "c_proj.weight") ? proj_std : std, seed, name);
        }
    }
}

/* ---------------------------------------------------------------- forward */

shard_status shard_gpt_forward(shard_gpt *g, const int32_t *inputs, const int32_t *targets, size_t B, size_t T,
                               float *loss) {
    const shard_gpt_config *c = &g->c;
    size_t C = c->n_embd, V = c->vocab_size, H = c->n_head, N = B * T, L = c->n_layer;
    if (B == 0 || T == 0 || B > g->max_b || T > g->max_t)
        return shard_error(SHARD_ERR_INVALID_ARG, "gpt forward: batch %zu x sequence %zu; this model was made for up to %zu x %zu",
                           B, T, g->max_b, g->max_t);
    g->B = B, g->T = T, g->have_targets = targets != NULL;
    memcpy(g->inputs, inputs, N * sizeof *inputs);
    if (targets) memcpy(g->targets, targets, N * sizeof *targets);
    /* embeddings: token + position */
    float *x = L ? g->acts[0].in : g->out;
    SHARD_CHECK(shard_embedding_forward(P(g, g->wte), inputs, x, N, V, C));
    for (size_t n = 0; n < N; n++) {
        const float *pos = P(g, g->wpe) + (n % T) * C;
        for (size_t k = 0; k < C; k++) x[n * C + k] += pos[k];
    }
    for (size_t l = 0; l < L; l++) {
        layer_acts *a = &g->acts[l];
        const size_t *w = &g->layer[l * PER_LAYER];
        float *next = l + 1 < L ? g->acts[l + 1].in : g->out;
        shard_layernorm_forward(a->in, P(g, w[LN1_W]), P(g, w[LN1_B]), c->layer_norm_epsilon, a->ln1, a->ln1_mean,
                                a->ln1_rstd, N, C);
        SHARD_CHECK(shard_linear_forward(a->ln1, P(g, w[ATTN_W]), P(g, w[ATTN_B]), a->qkv, N, C, 3 * C));
        SHARD_CHECK(shard_attention_forward(a->qkv, a->atty, a->att, B, T, C, H));
        SHARD_CHECK(shard_linear_forward(a->atty, P(g, w[APROJ_W]), P(g, w[APROJ_B]), a->mid, N, C, C));
        shard_add(a->in, a->mid, a->mid, N * C); /* mid = in + attention */
        shard_layernorm_forward(a->mid, P(g, w[LN2_W]), P(g, w[LN2_B]), c->layer_norm_epsilon, a->ln2, a->ln2_mean,
                                a->ln2_rstd, N, C);
        SHARD_CHECK(shard_linear_forward(a->ln2, P(g, w[FC_W]), P(g, w[FC_B]), a->fc, N, C, 4 * C));
        shard_gelu_forward(a->fc, a->gelu, N * 4 * C);
        SHARD_CHECK(shard_linear_forward(a->gelu, P(g, w[MPROJ_W]), P(g, w[MPROJ_B]), next, N, 4 * C, C));
        shard_add(a->mid, next, next, N * C); /* next = mid + MLP */
    }
    shard_layernorm_forward(g->out, P(g, g->lnf_w), P(g, g->lnf_b), c->layer_norm_epsilon, g->lnf, g->lnf_mean,
                            g->lnf_rstd, N, C);
    SHARD_CHECK(shard_sgemm(0, 1, N, V, C, 1.0f, g->lnf, C, P(g, g->wte), C, 0.0f, g->logits, V)); /* tied head */
    if (!targets) return SHARD_OK;
    float l = 0;
    SHARD_CHECK(shard_cross_entropy(g->logits, targets, -100, N, V, &l, NULL, g->dlogits));
    if (loss) *loss = l;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- backward */

shard_status shard_gpt_backward(shard_gpt *g, shard_params *grads) {
    const shard_gpt_config *c = &g->c;
    if (!g->have_targets) return shard_error(SHARD_ERR_INVALID_ARG, "gpt backward: the last forward had no targets");
    if (!grads || grads->total != g->params->total)
        return shard_error(SHARD_ERR_INVALID_ARG, "gpt backward: grads must have the parameters' layout (shard_params_like)");
    size_t C = c->n_embd, V = c->vocab_size, H = c->n_head, B = g->B, T = g->T, N = B * T, L = c->n_layer;
    /* head (tied to wte) and the final LayerNorm */
    SHARD_CHECK(shard_sgemm(0, 0, N, C, V, 1.0f, g->dlogits, V, P(g, g->wte), C, 0.0f, g->d_ln, C));
    SHARD_CHECK(shard_sgemm(1, 0, V, C, N, 1.0f, g->dlogits, V, g->lnf, C, 1.0f, G(grads, g, g->wte), C));
    shard_layernorm_backward(g->out, P(g, g->lnf_w), g->lnf_mean, g->lnf_rstd, g->d_ln, g->d_resid,
                             G(grads, g, g->lnf_w), G(grads, g, g->lnf_b), N, C);
    for (size_t l = L; l-- > 0;) {
        layer_acts *a = &g->acts[l];
        const size_t *w = &g->layer[l * PER_LAYER];
        /* MLP: next = mid + c_proj(gelu(c_fc(ln_2(mid)))) */
        SHARD_CHECK(shard_linear_backward(a->gelu, P(g, w[MPROJ_W]), g->d_resid, g->d_fc, G(grads, g, w[MPROJ_W]),
                                          G(grads, g, w[MPROJ_B]), N, 4 * C, C));
        shard_gelu_backward(a->fc, g->d_fc, g->d_fc, N * 4 * C);
        SHARD_CHECK(shard_linear_backward(a->ln2, P(g, w[FC_W]), g->d_fc, g->d_ln, G(grads, g, w[FC_W]),
                                          G(grads, g, w[FC_B]), N, C, 4 * C));
        shard_layernorm_backward(a->mid, P(g, w[LN2_W]), a->ln2_mean, a->ln2_rstd, g->d_ln, g->d_tmp,
                                 G(grads, g, w[LN2_W]), G(grads, g, w[LN2_B]), N, C);
        shard_add(g->d_resid, g->d_tmp, g->d_resid, N * C);
        /* attention: mid = in + c_proj(attn(c_attn(ln_1(in)))) */
        SHARD_CHECK(shard_linear_backward(a->atty, P(g, w[APROJ_W]), g->d_resid, g->d_atty, G(grads, g, w[APROJ_W]),
                                          G(grads, g, w[APROJ_B]), N, C, C));
        SHARD_CHECK(shard_attention_backward(a->qkv, a->att, g->d_atty, g->d_qkv, B, T, C, H));
        SHARD_CHECK(shard_linear_backward(a->ln1, P(g, w[ATTN_W]), g->d_qkv, g->d_ln, G(grads, g, w[ATTN_W]),
                                          G(grads, g, w[ATTN_B]), N, C, 3 * C));
        shard_layernorm_backward(a->in, P(g, w[LN1_W]), a->ln1_mean, a->ln1_rstd, g->d_ln, g->d_tmp,
                                 G(grads, g, w[LN1_W]), G(grads, g, w[LN1_B]), N, C);
        shard_add(g->d_resid, g->d_tmp, g->d_resid, N * C);
    }
    /* embeddings */
    SHARD_CHECK(shard_embedding_backward(g->inputs, g->d_resid, G(grads, g, g->wte), N, V, C));
    float *dwpe = G(grads, g, g->wpe);
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < C; k++) dwpe[(n % T) * C + k] += g->d_resid[n * C + k];
    return SHARD_OK;
}
