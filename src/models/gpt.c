/* gpt.c — the GPT-2-style decoder of gpt.h: config, parameters with Hugging
 * Face's names, initialisation, forward and backward.
 *
 * Shapes: N = B*T rows of width C; H heads of D = C/H; V vocabulary.  The
 * forward saves, per block, the block input, both LayerNorm outputs and
 * statistics, qkv, the attention probabilities, the heads' outputs, the
 * residual in the middle, and the MLP's GELU output and GELU's slope at its
 * input (the c_fc output, overwritten by the GELU pass: the backward needs
 * nothing else of it). */
#include "shard/gpt.h"

#include <float.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/blas.h"
#include "shard/layers.h"
#include "shard/expert.h"
#include "shard/moe.h"
#include "core/alloc_impl.h"
#include "models/model_impl.h"
#include "nn/placement.h"
#include "shard/tp.h"

/* ---------------------------------------------------------------- config */

static shard_status bad_key(const char *where, const char *key, const char *why) {
    return shard_error(SHARD_ERR_INVALID_ARG, "%s: key '%s' %s", where, key, why);
}

static shard_status size_field(const char *where, const char *key, const json_t *v, size_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) <= 0) return bad_key(where, key, "must be a positive integer");
    *out = (size_t)json_integer_value(v);
    return SHARD_OK;
}

static shard_status float_field(const char *where, const char *key, const json_t *v, float *out) {
    if (!json_is_number(v)) return bad_key(where, key, "must be a number");
    double x = json_number_value(v);
    if (!(fabs(x) <= FLT_MAX) || (x != 0 && fabs(x) < FLT_MIN)) /* the conversion would be undefined, or 0 */
        return bad_key(where, key, "is outside float's range (1.2e-38 .. 3.4e38 in magnitude, or 0)");
    *out = (float)x;
    return SHARD_OK;
}

int shard_gpt_block_is_moe(const shard_gpt_config *c, size_t l) {
    size_t f = c->moe_layer_frequency ? c->moe_layer_frequency : 1;
    return c->num_local_experts > 0 && (l + 1) % f == 0;
}

/* Block l's parameters: LayerNorms and attention, then the dense MLP or the router and E experts. */
static size_t block_params(const shard_gpt_config *c, size_t l) {
    size_t C = c->n_embd, mlp = C * 4 * C + 4 * C + 4 * C * C + C, E = c->num_local_experts;
    return 4 * C + (C * 3 * C + 3 * C) + (C * C + C) + (shard_gpt_block_is_moe(c, l) ? E * C + E * mlp : mlp);
}

/* The mixture-of-experts keys of a config with num_local_experts > 0 (one without reads none). */
static shard_status check_moe(const shard_gpt_config *c, const char *where) {
    size_t E = c->num_local_experts, k = c->num_experts_per_tok,
           f = c->moe_layer_frequency ? c->moe_layer_frequency : 1;
    char why[128];
    if (!E) return SHARD_OK;
    if (E > 4096) return bad_key(where, "num_local_experts", "must be at most 4096");
    if (!k || k > E) {
        snprintf(why, sizeof why, "= %zu: must be 1 .. num_local_experts = %zu", k, E);
        return bad_key(where, "num_experts_per_tok", why);
    }
    if (f > c->n_layer) {
        snprintf(why, sizeof why, "= %zu: must be 1 .. n_layer = %zu (every k-th block is a mixture of experts)", f,
                 c->n_layer);
        return bad_key(where, "moe_layer_frequency", why);
    }
    if (!(c->expert_capacity_factor >= 0 && c->expert_capacity_factor <= 1e6f))
        return bad_key(where, "expert_capacity_factor", "must be 0 (no token dropped) or a positive factor");
    if (!(c->router_aux_loss_coef >= 0)) return bad_key(where, "router_aux_loss_coef", "must be >= 0");
    if (!(c->router_z_loss_coef >= 0)) return bad_key(where, "router_z_loss_coef", "must be >= 0");
    if (!(c->router_jitter_noise >= 0 && c->router_jitter_noise < 1))
        return bad_key(where, "router_jitter_noise", "must be in [0, 1)");
    if (c->router_random_routing && k != 2)
        return bad_key(where, "router_random_routing", "needs num_experts_per_tok = 2 (it routes the second choice)");
    if (c->norm_topk_prob && k == 1)
        return bad_key(where, "norm_topk_prob",
                       "must be false for num_experts_per_tok = 1 (the gate is the softmax probability, so "
                       "the router gets a gradient)");
    return SHARD_OK;
}

/* The sizes a model can be built from: every size given, heads dividing the width (a parsed config and
 * one filled in by a caller of shard_gpt_create alike). */
static shard_status check_config(const shard_gpt_config *c, const char *where) {
    const char *need[] = {"n_embd", "n_layer", "n_head", "n_positions", "vocab_size"};
    size_t have[] = {c->n_embd, c->n_layer, c->n_head, c->n_positions, c->vocab_size};
    const size_t most[] = {1u << 20, 1u << 16, 1u << 20, 1u << 20, 1u << 24}; /* sizes whose products fit */
    for (int i = 0; i < 5; i++) {
        if (!have[i]) return bad_key(where, need[i], "is missing");
        if (have[i] > most[i]) {
            char why[64];
            snprintf(why, sizeof why, "= %zu is more than the %zu allowed", have[i], most[i]);
            return bad_key(where, need[i], why);
        }
    }
    double C = (double)c->n_embd, params = ((double)c->vocab_size + (double)c->n_positions) * C + 2 * C;
    for (size_t l = 0; l < c->n_layer; l++) params += (double)block_params(c, l);
    if (params > 0x1p40)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: n_embd %zu, n_layer %zu, n_positions %zu and vocab_size %zu make %.3g "
                           "parameters; at most 2^40 (1.1e12)",
                           where, c->n_embd, c->n_layer, c->n_positions, c->vocab_size, params);
    if (c->n_embd % c->n_head) {
        char why[96];
        snprintf(why, sizeof why, "= %zu does not divide n_embd = %zu into heads", c->n_head, c->n_embd);
        return bad_key(where, "n_head", why);
    }
    if (!(c->layer_norm_epsilon > 0 && c->layer_norm_epsilon <= 1))
        return bad_key(where, "layer_norm_epsilon", "must be in (0, 1]");
    if (!(c->initializer_range >= 0)) return bad_key(where, "initializer_range", "must be >= 0");
    const char *drop_keys[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
    const float drops[] = {c->resid_pdrop, c->embd_pdrop, c->attn_pdrop};
    for (int i = 0; i < 3; i++)
        if (!(drops[i] >= 0 && drops[i] < 1)) return bad_key(where, drop_keys[i], "must be in [0, 1)");
    return check_moe(c, where);
}

static const char *const moe_key_names[] = {"num_local_experts",      "num_experts_per_tok",   "moe_layer_frequency",
                                            "expert_capacity_factor", "router_aux_loss_coef",  "router_z_loss_coef",
                                            "router_jitter_noise",    "router_random_routing", "norm_topk_prob"};

static int is_moe_key(const char *key) {
    for (size_t i = 0; i < sizeof moe_key_names / sizeof moe_key_names[0]; i++)
        if (strcmp(key, moe_key_names[i]) == 0) return 1;
    return 0;
}

/* One mixture-of-experts key into c (ranges and consistency: check_moe). */
static shard_status moe_field(const char *where, const char *key, const json_t *v, shard_gpt_config *c) {
    if (strcmp(key, "num_local_experts") == 0) return size_field(where, key, v, &c->num_local_experts);
    if (strcmp(key, "num_experts_per_tok") == 0) return size_field(where, key, v, &c->num_experts_per_tok);
    if (strcmp(key, "moe_layer_frequency") == 0) return size_field(where, key, v, &c->moe_layer_frequency);
    if (strcmp(key, "router_random_routing") == 0 || strcmp(key, "norm_topk_prob") == 0) {
        if (!json_is_boolean(v)) return bad_key(where, key, "must be true or false");
        *(key[0] == 'r' ? &c->router_random_routing : &c->norm_topk_prob) = json_is_true(v);
        return SHARD_OK;
    }
    float *f = strcmp(key, "expert_capacity_factor") == 0 ? &c->expert_capacity_factor
        : strcmp(key, "router_aux_loss_coef") == 0        ? &c->router_aux_loss_coef
        : strcmp(key, "router_z_loss_coef") == 0          ? &c->router_z_loss_coef
                                                          : &c->router_jitter_noise;
    if (json_is_null(v) && f == &c->expert_capacity_factor) return *f = 0, SHARD_OK; /* null: no capacity */
    return float_field(where, key, v, f);
}

shard_status shard_gpt_config_parse(const char *text, const char *where, shard_gpt_config *out) {
    json_error_t err;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: not valid JSON: %s (line %d, column %d)", where, err.text,
                           err.line, err.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: the config must be a JSON object", where);
    }
    shard_gpt_config c = {.layer_norm_epsilon = 1e-5f, .initializer_range = 0.02f};
    int moe_given = 0, norm_given = 0; /* a mixture-of-experts key; norm_topk_prob (its default follows top-k) */
    c.num_experts_per_tok = 2, c.moe_layer_frequency = 1, c.router_aux_loss_coef = 0.01f;
    shard_status s = SHARD_OK;
    const char *key;
    json_t *v;
    /* Hugging Face GPT-2 keys that do not change the math here, accepted as they are */
    static const char *const ignored[] = {"architectures",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "n_ctx",
                                          "summary_activation",
                                          "summary_first_dropout",
                                          "summary_proj_to_labels",
                                          "summary_type",
                                          "summary_use_proj",
                                          "task_specific_params",
                                          "torch_dtype",
                                          "transformers_version",
                                          "use_cache",
                                          "output_past",
                                          "_name_or_path",
                                          "comment"};
    json_object_foreach(root, key, v) {
        if (s < 0) break;
        if (strcmp(key, "n_embd") == 0)
            s = size_field(where, key, v, &c.n_embd);
        else if (strcmp(key, "n_layer") == 0)
            s = size_field(where, key, v, &c.n_layer);
        else if (strcmp(key, "n_head") == 0)
            s = size_field(where, key, v, &c.n_head);
        else if (strcmp(key, "n_positions") == 0)
            s = size_field(where, key, v, &c.n_positions);
        else if (strcmp(key, "vocab_size") == 0)
            s = size_field(where, key, v, &c.vocab_size);
        else if (strcmp(key, "layer_norm_epsilon") == 0)
            s = float_field(where, key, v, &c.layer_norm_epsilon);
        else if (strcmp(key, "initializer_range") == 0)
            s = float_field(where, key, v, &c.initializer_range);
        else if (strcmp(key, "model_type") == 0) {
            if (!json_is_string(v) || (strcmp(json_string_value(v), "gpt2") && strcmp(json_string_value(v), "gpt")))
                s = bad_key(where, key,
                            "is not a model shard builds: give \"gpt2\" (a GPT-2 decoder), \"mlp\" or \"cnn\"");
        } else if (strcmp(key, "activation_function") == 0) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "gelu_new") != 0)
                s = bad_key(where, key, "must be \"gelu_new\" (GELU, tanh form)");
        } else if (strcmp(key, "n_inner") == 0) {
            if (!json_is_null(v) && !json_is_integer(v)) s = bad_key(where, key, "must be null or 4 * n_embd");
        } else if (strcmp(key, "resid_pdrop") == 0 || strcmp(key, "embd_pdrop") == 0 ||
                   strcmp(key, "attn_pdrop") == 0) {
            float *p = key[0] == 'r' ? &c.resid_pdrop : key[0] == 'e' ? &c.embd_pdrop : &c.attn_pdrop;
            s = float_field(where, key, v, p);      /* its range: check_config */
        } else if (strcmp(key, "n_special") == 0) { /* gpt2-medium/large/xl's configs: no extra tokens */
            if (!json_is_integer(v) || json_integer_value(v) != 0)
                s = bad_key(where, key, "must be 0 (no special tokens)");
        } else if (strcmp(key, "predict_special_tokens") == 0 || strcmp(key, "gradient_checkpointing") == 0) {
            if (!json_is_boolean(v)) s = bad_key(where, key, "must be true or false");
        } else if (strcmp(key, "scale_attn_weights") == 0) {
            if (!json_is_true(v)) s = bad_key(where, key, "must be true (attention scaled by 1/sqrt(head size))");
        } else if (strcmp(key, "scale_attn_by_inverse_layer_idx") == 0 || strcmp(key, "reorder_and_upcast_attn") == 0) {
            if (!json_is_false(v)) s = bad_key(where, key, "must be false");
        } else if (is_moe_key(key)) {
            s = moe_field(where, key, v, &c);
        } else {
            int known = 0;
            for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) known |= strcmp(key, ignored[i]) == 0;
            static const char *const keys[] = {"n_embd",
                                               "n_layer",
                                               "n_head",
                                               "n_positions",
                                               "vocab_size",
                                               "layer_norm_epsilon",
                                               "initializer_range",
                                               "model_type",
                                               "activation_function",
                                               "n_inner",
                                               "resid_pdrop",
                                               "embd_pdrop",
                                               "attn_pdrop",
                                               "n_special",
                                               "predict_special_tokens",
                                               "gradient_checkpointing",
                                               "scale_attn_weights",
                                               "scale_attn_by_inverse_layer_idx",
                                               "reorder_and_upcast_attn",
                                               "num_local_experts",
                                               "num_experts_per_tok",
                                               "moe_layer_frequency",
                                               "expert_capacity_factor",
                                               "router_aux_loss_coef",
                                               "router_z_loss_coef",
                                               "router_jitter_noise",
                                               "router_random_routing",
                                               "norm_topk_prob"};
            if (!known)
                s = shard__unknown_key(where, key, keys, sizeof keys / sizeof keys[0],
                                       "GPT keys: n_embd, n_layer, n_head, n_positions, vocab_size, "
                                       "layer_norm_epsilon, initializer_range, Hugging Face GPT-2's others, and "
                                       "the mixture of experts' num_local_experts, num_experts_per_tok, ...");
        }
    }
    /* Hugging Face takes n_inner null as 4 * n_embd and any number as the MLP's width: 0 (an MLP of no
     * columns) and every other width but 4 * n_embd are widths this GPT does not build */
    const json_t *inner = json_object_get(root, "n_inner");
    int have_inner = json_is_integer(inner);
    json_int_t n_inner = have_inner ? json_integer_value(inner) : 0;
    json_object_foreach(root, key, v) {
        moe_given |= is_moe_key(key) && strcmp(key, "num_local_experts") != 0;
        norm_given |= strcmp(key, "norm_topk_prob") == 0;
    }
    json_decref(root);
    if (s < 0) return s;
    if (!norm_given) c.norm_topk_prob = c.num_experts_per_tok >= 2;
    if (moe_given && !c.num_local_experts)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: mixture-of-experts keys (num_experts_per_tok, ...) without num_local_experts: give "
                           "the experts per MoE block, or leave the keys out for a dense GPT",
                           where);
    if (!c.num_local_experts) /* a dense GPT: the defaults above are not its */
        c.num_experts_per_tok = 0, c.router_aux_loss_coef = 0, c.norm_topk_prob = 0;
    SHARD_CHECK(check_config(&c, where));
    if (have_inner && (n_inner <= 0 || (uint64_t)n_inner != 4 * (uint64_t)c.n_embd)) {
        char why[96];
        snprintf(why, sizeof why, "= %lld: must be null or 4 * n_embd = %zu", (long long)n_inner, 4 * c.n_embd);
        return bad_key(where, "n_inner", why);
    }
    *out = c;
    return SHARD_OK;
}

shard_status shard_gpt_config_load(const char *path, shard_gpt_config *out) {
    char *text = shard__read_config(path);
    if (!text) return SHARD_ERR_IO;
    shard_status s = shard_gpt_config_parse(text, path, out);
    free(text);
    return s;
}

size_t shard_gpt_param_count(const shard_gpt_config *c) {
    size_t C = c->n_embd, n = c->vocab_size * C + c->n_positions * C + 2 * C;
    for (size_t l = 0; l < c->n_layer; l++) n += block_params(c, l);
    return n;
}

/* ---------------------------------------------------------------- the model */

/* A block's parameters by slot; a mixture-of-experts block holds its router in GATE_W and its stacked
 * experts in FC_W .. MPROJ_B (a dense block has no GATE_W: SIZE_MAX) */
enum { LN1_W, LN1_B, ATTN_W, ATTN_B, APROJ_W, APROJ_B, LN2_W, LN2_B, FC_W, FC_B, MPROJ_W, MPROJ_B, GATE_W, PER_LAYER };

typedef struct layer_acts {
    float *in, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *mid, *ln2, *ln2_mean, *ln2_rstd;
    float *fc;   /* c_fc's output, then GELU's slope there */
    float *gelu; /* GELU of it: mlp c_proj's input */
} layer_acts;

/* Per block: the heads and MLP columns this rank holds, read from the specs of c_attn and c_fc; a pair
 * whose specs split it over `tensor` (column- then row-parallel) sums its partial output, a pair
 * placed P() is computed whole by every tensor rank. */
typedef struct layer_split {
    size_t h0, Hl, Cl; /* heads h0 .. h0 + Hl - 1; Cl = Hl * D */
    size_t f0, Fl;     /* MLP columns f0 .. f0 + Fl - 1 of 4C */
    int attn_split, mlp_split;
} layer_split;

struct shard_gpt {
    shard_model model; /* units, value/grad pointers, hooks; model.impl = this */
    shard_gpt_config c;
    /* pipeline stage: chunks of blocks ch0[c] .. ch1[c]-1; the embeddings on the first virtual stage
     * (own_first), ln_f and the head on the last (own_last); whole model: one chunk of every block, both.
     * l0, l1, first, last: the range a forward or backward runs (use_range; first: it embeds, last: it
     * ends in the loss).  Unit 0: the embeddings / ln_f (has_u0 0 on a middle stage); block l's unit:
     * unit_of[l].  The last stage's copy of wte (tied_value, tied_grad) when the first is another rank:
     * the pipeline's (use_tied), kept equal to stage 0's. */
    size_t chunks, ch0[SHARD_MAX_STAGE_CHUNKS], ch1[SHARD_MAX_STAGE_CHUNKS], *unit_of;
    size_t l0, l1;
    int first, last, own_first, own_last, has_u0;
    float *tied_value, *tied_grad;
    /* tensor parallel (Megatron), as the parameters' specs place it: tp NULL or of size 1, or every
     * spec P(): everything whole, the single-device math */
    shard_comm *tp;
    int tp_rank;
    shard_mesh_layout layout; /* tensor=<tp size>: what the specs are written on */
    shard__placement *place;  /* per parameter: logical shape and spec */
    layer_split *ls;          /* per block */
    size_t D, Cmax, Fmax;     /* the widest block's Cl and Fl (buffer sizes) */
    size_t Vl, v0;            /* vocabulary rows v0 .. v0 + Vl - 1 of wte (and logit columns) */
    int vocab_split;
    unsigned char *whole; /* per parameter: not split (the model table's tensor_replicated) */
    /* sequence parallel: the residual stream, LayerNorms and dropout hold this rank's tokens n0 .. n0+Nl-1
     * of the batch's N; all_gather / reduce_scatter replace the all_reduce around each tensor-parallel pair */
    int sp;
    size_t n0, Nl; /* this forward's split of the tokens */
    float *full, *d_lnl, *ln_scratch, *wpe_scratch;
    size_t max_b, max_t, B, T;
    shard_params *params;
    size_t wte, wpe, lnf_w, lnf_b, *layer; /* parameter indices; layer[l * PER_LAYER + k] */
    layer_acts *acts;                      /* [n_layer]: the bound range's blocks (use_range) */
    size_t Nr;       /* rows of the residual stream this rank keeps at most (all N without sequence parallel) */
    float *own_acts; /* the whole model's range buffer (NULL on a pipeline stage: the pipeline's) */
    float *out, *lnf, *lnf_mean, *lnf_rstd, *logits, *dlogits; /* logits: shared scratch, or the range's dlogits */
    int keep_logits;  /* 0: the loss's gradient is written over the logits (one N x V buffer per slot, none shared) */
    int type_assumed; /* the config named no model_type: the registry's default built this, and describe says so */
    float *d_resid, *d_tmp, *d_ln, *d_qkv, *d_atty, *d_fc; /* d_resid, d_tmp: this rank's tokens (sp) */
    int32_t *inputs, *targets;
    int have_targets, dropout; /* dropout: this forward trains with it */
    float *slab;               /* every activation buffer, one allocation */
    /* mixture of experts: the layer of each MoE block (NULL: a dense MLP), their count, the load table */
    shard_moe **moe;
    size_t moe_layers;
    shard_comm *ep;              /* the expert axis (NULL: every expert here) */
    size_t e0, El;               /* the experts this rank holds: [e0, e0 + El) of num_local_experts */
    unsigned char *expert_split; /* per parameter: a stack of this rank's experts (the model's expert_split) */
    double *load;                /* [moe_layers x E] */
    const float **moe_buffers;   /* [moe_contexts]: the activation buffer each MoE context serves (pipeline) */
    size_t moe_contexts;
    int *slot_of;     /* per parameter: its slot in its block (-1: unit 0's) */
    size_t *block_of; /* per parameter: its block (SIZE_MAX: unit 0's) */
};

static float *P(const shard_gpt *g, size_t index) { return g->model.value[index]; }
static float *G(const shard_gpt *g, size_t index) { return g->model.grad[index]; }
/* wte as the LM head sees it: the parameter, or the last stage's copy */
static float *head_w(const shard_gpt *g) { return g->own_first ? P(g, g->wte) : g->tied_value; }
static float *head_g(const shard_gpt *g) { return g->own_first ? G(g, g->wte) : g->tied_grad; }
static size_t block_unit(const shard_gpt *g, size_t l) { return g->unit_of[l]; }
/* A mixture-of-experts block's experts: the unit after its block's (model units). */
static size_t experts_unit(const shard_gpt *g, size_t l) { return g->unit_of[l] + 1; }

/* Block l is this stage's (in one of its chunks). */
static int holds_block(const shard_gpt *g, size_t l) {
    for (size_t c = 0; c < g->chunks; c++)
        if (l >= g->ch0[c] && l < g->ch1[c]) return 1;
    return 0;
}

/* ---------------------------------------------------------------- placement: specs of the parameters */

static const char *split_help(size_t k, int is_wte) {
    if (is_wte) return "vocab-parallel";
    return k == ATTN_W || k == ATTN_B ? "heads, column-parallel"
        : k == APROJ_W                ? "heads, row-parallel"
        : k == MPROJ_W                ? "row-parallel"
                                      : "column-parallel";
}

/* --spec overrides, "NAME=SPEC;NAME=SPEC" (NAME a glob over parameter names), applied in order. */
static shard_status apply_specs(shard_gpt *g, const shard_param_info *t, size_t n, const char *specs) {
    if (!specs || !*specs) return SHARD_OK;
    char *copy = strdup(specs), *save = NULL;
    if (!copy) return shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
    shard_status s = SHARD_OK;
    for (char *item = strtok_r(copy, ";", &save); item && s == SHARD_OK; item = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item) {
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "--spec '%s': give NAME=SPEC, e.g. 'h.*.mlp.*=P()' or "
                            "'wte.weight=P(\'tensor\', None)'",
                            item);
            break;
        }
        *eq = '\0';
        size_t matched = 0;
        for (size_t i = 0; i < n && s == SHARD_OK; i++) {
            if (fnmatch(item, t[i].name, 0) != 0) continue;
            matched++;
            int k = g->slot_of[i];
            s = shard__placement_set(&g->place[i], &g->layout, t[i].name, eq + 1, split_help((size_t)k, i == g->wte));
        }
        if (s == SHARD_OK && !matched)
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "--spec '%s': no parameter is named so (names look like wte.weight, "
                            "h.0.attn.c_attn.weight, h.*.mlp.*)",
                            item);
    }
    free(copy);
    return s;
}

/* A pair of column- then row-parallel linears is split as a whole or not at all. */
static shard_status check_pair(const shard_gpt *g, const shard_param_info *t, const size_t *idx, int count) {
    int first = shard__placement_is_split(&g->place[idx[0]], &g->layout);
    for (int k = 1; k < count; k++)
        if (shard__placement_is_split(&g->place[idx[k]], &g->layout) != first) {
            char a[96], b[96];
            shard__placement_spec_text(&g->place[idx[0]], &g->layout, a, sizeof a);
            shard__placement_spec_text(&g->place[idx[k]], &g->layout, b, sizeof b);
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "--spec: %s is %s but %s is %s: a column-parallel linear and the "
                               "row-parallel one after it (and its bias) split together; give both split or both P()",
                               t[idx[0]].name, a, t[idx[k]].name, b);
        }
    return SHARD_OK;
}

/* The blocks' heads, MLP columns and the vocabulary rows this rank holds, from the specs. */
static shard_status read_placement(shard_gpt *g, const shard_param_info *t) {
    const shard_gpt_config *c = &g->c;
    int parts = g->layout.sizes[0];
    g->Cmax = g->Fmax = 0;
    for (size_t l = 0; l < c->n_layer; l++) {
        const size_t *w = &g->layer[l * PER_LAYER];
        /* the MLP's pair: c_fc and c_proj, or a mixture of experts' stacks of them (each expert's inner
         * units split alike) */
        const size_t attn[3] = {w[ATTN_W], w[ATTN_B], w[APROJ_W]}, mlp[3] = {w[FC_W], w[FC_B], w[MPROJ_W]};
        SHARD_CHECK(check_pair(g, t, attn, 3));
        SHARD_CHECK(check_pair(g, t, mlp, 3));
        layer_split *ls = &g->ls[l];
        ls->attn_split = shard__placement_is_split(&g->place[w[ATTN_W]], &g->layout);
        ls->mlp_split = shard__placement_is_split(&g->place[w[FC_W]], &g->layout);
        shard__placement_range(&g->place[w[ATTN_W]], &g->layout, g->tp_rank, &ls->h0, &ls->Hl);
        shard__placement_range(&g->place[w[FC_W]], &g->layout, g->tp_rank, &ls->f0, &ls->Fl);
        if (!ls->Hl)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "the mesh's tensor=%d (--mesh, or bench tensor's --ranks) is more than "
                               "the %zu heads (n_head) the GPT can "
                               "split attention over (or place h.*.attn.* as P())",
                               parts, c->n_head);
        if (!ls->Fl)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "the mesh's tensor=%d (--mesh, or bench tensor's --ranks) is more than "
                               "the %zu MLP columns",
                               parts, 4 * c->n_embd);
        ls->Cl = ls->Hl * g->D;
        g->Cmax = ls->Cl > g->Cmax ? ls->Cl : g->Cmax, g->Fmax = ls->Fl > g->Fmax ? ls->Fl : g->Fmax;
    }
    g->vocab_split = shard__placement_is_split(&g->place[g->wte], &g->layout);
    shard__placement_range(&g->place[g->wte], &g->layout, g->tp_rank, &g->v0, &g->Vl);
    if (!g->Vl)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "the mesh's tensor=%d (--mesh, or bench tensor's --ranks) is more than "
                           "the %zu vocabulary rows (vocab_size)",
                           parts, c->vocab_size);
    return SHARD_OK;
}

/* The buffers a forward of blocks [first, last) keeps for its backward, carved from base (NULL: only
 * counted): the blocks' activations, the range's output and, when it ends in the loss, ln_f and the
 * loss's gradient (the logits too unless kept apart). */
static size_t carve_range(shard_gpt *g, float *base, size_t first, size_t last) {
    size_t C = g->c.n_embd, V = g->Vl, Cl = g->Cmax, Fl = g->Fmax, att = g->max_b * (Cl / g->D) * g->max_t * g->max_t;
    size_t N = g->max_b * g->max_t, Nr = g->Nr, at = 0;
#define TAKE(ptr, n_) ((ptr) = base ? base + at : NULL, at += (n_))
    for (size_t l = first; l < last; l++) {
        layer_acts *a = &g->acts[l];
        size_t mlp = g->moe && g->moe[l] ? 0 : N * Fl; /* a mixture of experts keeps its own */
        TAKE(a->in, Nr * C), TAKE(a->ln1, N * C), TAKE(a->ln1_mean, Nr), TAKE(a->ln1_rstd, Nr),
            TAKE(a->qkv, N * 3 * Cl);
        TAKE(a->att, att), TAKE(a->atty, N * Cl), TAKE(a->mid, Nr * C), TAKE(a->ln2, N * C), TAKE(a->ln2_mean, Nr);
        TAKE(a->ln2_rstd, Nr), TAKE(a->fc, mlp), TAKE(a->gelu, mlp);
    }
    TAKE(g->out, Nr * C);
    if (g->own_last && last == g->c.n_layer)
        TAKE(g->lnf, N * C), TAKE(g->lnf_mean, Nr), TAKE(g->lnf_rstd, Nr), TAKE(g->dlogits, N * V);
    if (base && !g->keep_logits)
        g->logits = g->dlogits; /* the head writes the logits there; the loss overwrites them */
    return at;
}

/* Buffers every range shares, carved from base (NULL: only counted): the logits when kept apart from
 * the gradient, and backward's scratch. */
static size_t carve_shared(shard_gpt *g, float *base) {
    size_t C = g->c.n_embd, V = g->Vl, Cl = g->Cmax, Fl = g->Fmax, N = g->max_b * g->max_t, Nr = g->Nr, at = 0;
    if (g->own_last && g->keep_logits) TAKE(g->logits, N * V);
    TAKE(g->d_resid, Nr * C), TAKE(g->d_tmp, Nr * C), TAKE(g->d_ln, N * C), TAKE(g->d_atty, N * Cl);
    TAKE(g->d_qkv, N * 3 * Cl), TAKE(g->d_fc, N * Fl);
    if (g->sp)
        TAKE(g->full, N * C), TAKE(g->d_lnl, Nr * C), TAKE(g->ln_scratch, 2 * C),
            TAKE(g->wpe_scratch, g->c.n_positions * C);
#undef TAKE
    return at;
}

/* The next forward / backward runs blocks [first, last) over acts (carve_range's layout). */
static void use_range(shard_gpt *g, float *acts, size_t first, size_t last) {
    carve_range(g, acts, first, last);
    g->l0 = first, g->l1 = last;
    g->first = g->own_first && first == 0, g->last = g->own_last && last == g->c.n_layer;
}

/* Keep the stage's parameters of the whole model's list t[0..n-1] (placements already read), renumbered. */
static size_t keep_stage_params(shard_gpt *g, shard_param_info *t, size_t n) {
    size_t *map = malloc(n * sizeof *map), kept = 0, L = g->c.n_layer;
    if (!map) return 0;
    for (size_t i = 0; i < n; i++) {
        int keep = i < 4 ? (i < 2 ? g->own_first : g->own_last) : holds_block(g, g->block_of[i]);
        map[i] = keep ? kept : SIZE_MAX;
        if (keep)
            t[kept] = t[i], g->place[kept] = g->place[i], g->slot_of[kept] = g->slot_of[i],
            g->block_of[kept] = g->block_of[i], kept++;
    }
    g->wte = map[g->wte], g->wpe = map[g->wpe], g->lnf_w = map[g->lnf_w], g->lnf_b = map[g->lnf_b];
    for (size_t k = 0; k < L * PER_LAYER; k++) g->layer[k] = g->layer[k] == SIZE_MAX ? SIZE_MAX : map[g->layer[k]];
    free(map);
    return kept;
}

/* What a rank holding this model (its stage's blocks, 1/tp of each) would take, refused before any of it is
 * allocated when more than the memory available: its parameters, their gradients and AdamW's two moments
 * (16 bytes a parameter, f32), and the activations of one batch (the carves' count, as the wrap check
 * below over-estimates it).  Thread ranks share one process's memory: each checks its own share, so a
 * config that fails here fails for any rank count, and one just under the figure may still run short. */
static shard_status check_memory(const shard_gpt_config *c, size_t max_batch, size_t max_seq, int parts,
                                 const shard_model_stage *stage) {
    double C = (double)c->n_embd, V = (double)c->vocab_size, H = (double)c->n_head, held = 0;
    for (size_t k = 0; stage && k < stage->chunks; k++) held += (double)(stage->last[k] - stage->first[k]);
    if (!stage) held = (double)c->n_layer;
    int first = !stage || stage->index == 0, last = !stage || stage->index == stage->count - 1;
    double blocks = 0; /* the held blocks' parameters (a mixture of experts' every expert counted) */
    for (size_t k = 0; stage && k < stage->chunks; k++)
        for (size_t l = stage->first[k]; l < stage->last[k]; l++) blocks += (double)block_params(c, l);
    for (size_t l = 0; !stage && l < c->n_layer; l++) blocks += (double)block_params(c, l);
    double params = (blocks + (first ? (V + (double)c->n_positions) * C : 0) + (last ? 2 * C : 0)) / (double)parts;
    double rows = (double)max_batch * (double)max_seq;
    double acts = 4 * (held * (H * rows * (double)max_seq + rows * 16 * C) + rows * (5 * V + 16 * C));
    double need = 16 * params + acts, have = (double)shard__mem_available_bytes();
    if (have <= 0 || need <= have) return SHARD_OK;
    char need_text[32], params_text[32], acts_text[32], have_text[32];
    shard__mem_bytes_text(need, need_text, sizeof need_text);
    shard__mem_bytes_text(16 * params, params_text, sizeof params_text);
    shard__mem_bytes_text(acts, acts_text, sizeof acts_text);
    shard__mem_bytes_text(have, have_text, sizeof have_text);
    return shard_error(SHARD_ERR_NO_MEMORY,
                       "gpt: n_layer %zu x n_embd %zu with batch %zu x sequence %zu needs about %s of memory a "
                       "rank (%s of parameters, gradients and AdamW moments, %s of activations), more than the "
                       "%s available: give a smaller model, batch or sequence, or more ranks to split it",
                       c->n_layer, c->n_embd, max_batch, max_seq, need_text, params_text, acts_text, have_text);
}

/* The mixture-of-experts layers of the MoE blocks this rank holds (each keeps its routing for its
 * backward, one context per activation buffer); the load table counts every MoE block of the model. */
static shard_status create_moe(shard_gpt *g) {
    const shard_gpt_config *c = &g->c;
    for (size_t l = 0; l < c->n_layer; l++) {
        if (!shard_gpt_block_is_moe(c, l)) continue;
        g->moe_layers++;
        if (!holds_block(g, l)) continue;
        shard_moe_options o = {.struct_size = sizeof o,
                               .experts = c->num_local_experts,
                               .top_k = c->num_experts_per_tok,
                               .width = c->n_embd,
                               .hidden = g->ls[l].Fl,
                               .capacity_factor = c->expert_capacity_factor,
                               .jitter = c->router_jitter_noise,
                               .random_routing = c->router_random_routing,
                               .norm_topk_prob = c->norm_topk_prob,
                               .aux_coef = c->router_aux_loss_coef,
                               .z_coef = c->router_z_loss_coef,
                               .first_expert = g->e0,
                               .held_experts = g->El,
                               .comm = g->ep,
                               .max_tokens = g->max_b * g->max_t,
                               .tensor = g->ls[l].mlp_split ? g->tp : NULL};
        SHARD_CHECK(shard_moe_create(&o, &g->moe[l]));
    }
    if (g->moe_layers && !(g->load = calloc(g->moe_layers * c->num_local_experts, sizeof *g->load)))
        return shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
    return SHARD_OK;
}

static const shard_model_ops gpt_model_ops; /* the model table, below */

static shard_status gpt_create(const shard_gpt_config *c, size_t max_batch, size_t max_seq, shard_comm *tp,
                               shard_comm *ep, int sequence_parallel, const char *specs, const shard_model_stage *stage,
                               int keep_logits, shard_gpt **out) {
    *out = NULL;
    SHARD_CHECK(check_config(c, "gpt"));
    if (!max_batch || !max_seq || max_seq > c->n_positions)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "gpt: batch %zu x sequence %zu (the sequence can be 1..n_positions = %zu)", max_batch,
                           max_seq, c->n_positions);
    size_t L = c->n_layer, C = c->n_embd, H = c->n_head, count = 2 + L * PER_LAYER + 2, E = c->num_local_experts;
    int parts = tp ? shard_comm_size(tp) : 1;
    if (E && sequence_parallel && parts > 1)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "gpt: a mixture of experts (num_local_experts %zu) routes every token on each tensor "
                           "rank, not split over them: leave out --sequence-parallel",
                           E);
    int eranks = ep ? shard_comm_size(ep) : 1;
    if ((size_t)eranks > 1 && (size_t)eranks > E)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "gpt: an expert axis of %d ranks for %zu experts (num_local_experts): give expert=%zu or "
                           "fewer, or a model with more experts",
                           eranks, E, E ? E : 1);
    int bad_stage = stage &&
        (stage->index < 0 || stage->index >= stage->count || !stage->chunks || stage->chunks > SHARD_MAX_STAGE_CHUNKS);
    for (size_t k = 0; stage && !bad_stage && k < stage->chunks; k++)
        bad_stage =
            stage->first[k] >= stage->last[k] || stage->last[k] > L || (k && stage->first[k] < stage->last[k - 1]);
    if (bad_stage)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "gpt: pipeline stage %d of %d: %zu chunks of blocks, not ascending runs "
                           "within the %zu blocks",
                           stage->index, stage->count, stage->chunks, L);
    SHARD_CHECK(check_memory(c, max_batch, max_seq, tp ? shard_comm_size(tp) : 1, stage));
    shard_gpt *g = calloc(1, sizeof *g);
    shard_param_info *t = calloc(count, sizeof *t);
    size_t *unit_first = calloc(2 * L + 2, sizeof *unit_first);
    if (g) {
        g->layer = calloc(L * PER_LAYER, sizeof *g->layer), g->acts = calloc(L ? L : 1, sizeof *g->acts);
        g->ls = calloc(L, sizeof *g->ls), g->place = calloc(count, sizeof *g->place);
        g->slot_of = calloc(count, sizeof *g->slot_of), g->block_of = calloc(count, sizeof *g->block_of);
        g->moe = calloc(L ? L : 1, sizeof *g->moe);
    }
    if (!g || !t || !unit_first || !g->layer || !g->acts || !g->ls || !g->place || !g->slot_of || !g->block_of ||
        !g->moe) {
        if (g) free(g->layer), free(g->acts), free(g->ls), free(g->place), free(g->slot_of), free(g->block_of);
        if (g) free(g->moe);
        free(g), free(t), free(unit_first);
        return shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
    }
    g->c = *c, g->max_b = max_batch, g->max_t = max_seq, g->keep_logits = keep_logits;
    g->ep = eranks > 1 ? ep : NULL, g->e0 = 0, g->El = E;
    if (g->ep) shard_expert_range(E, eranks, shard_comm_rank(ep), &g->e0, &g->El);
    g->chunks = stage ? stage->chunks : 1;
    for (size_t k = 0; k < g->chunks; k++)
        g->ch0[k] = stage ? stage->first[k] : 0, g->ch1[k] = stage ? stage->last[k] : L;
    g->own_first = !stage || stage->index == 0, g->own_last = !stage || stage->index == stage->count - 1;
    g->has_u0 = g->own_first || g->own_last;
    g->tp = tp, g->tp_rank = tp ? shard_comm_rank(tp) : 0, g->D = C / H;
    g->sp = sequence_parallel && parts > 1;
    g->layout = shard_tp_layout(parts);
    /* logical shapes: c_attn [C, 3, H, D] (whole heads of q, k, v), attn.c_proj [H, D, C]; stored as
     * Hugging Face's [C, 3C] and [C, C].  unit 0: the embeddings (wte is also the LM head) and the final
     * LayerNorm; unit 1 + l: block l */
    const int one[1] = {1}, two[2] = {1, 1}, qkv[2] = {1, 3}, heads[2] = {2, 1}, three[1] = {3};
    size_t n = 0;
    shard__placement_make(&g->place[n], 2, (size_t[]){c->vocab_size, C}, 2, two, 0),
        snprintf(t[n].name, sizeof t[n].name, "wte.weight"), g->wte = n++;
    shard__placement_make(&g->place[n], 2, (size_t[]){c->n_positions, C}, 2, two, -1),
        snprintf(t[n].name, sizeof t[n].name, "wpe.weight"), g->wpe = n++;
    shard__placement_make(&g->place[n], 1, (size_t[]){C}, 1, one, -1),
        snprintf(t[n].name, sizeof t[n].name, "ln_f.weight"), g->lnf_w = n++;
    shard__placement_make(&g->place[n], 1, (size_t[]){C}, 1, one, -1),
        snprintf(t[n].name, sizeof t[n].name, "ln_f.bias"), g->lnf_b = n++;
    static const char *const suffix[PER_LAYER] = {
        "ln_1.weight",       "ln_1.bias",       "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias",  "ln_2.weight",     "ln_2.bias",          "mlp.c_fc.weight",  "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias", "mlp.gate.weight"};
    /* a mixture-of-experts block: its router after ln_2 (whole on every tensor rank), then the experts
     * stacked [E, ...] (this expert rank's experts), each expert's inner units split over `tensor` as a
     * dense MLP's (c_proj's bias whole) */
    static const int moe_order[] = {LN1_W, LN1_B,  ATTN_W, ATTN_B, APROJ_W, APROJ_B, LN2_W,
                                    LN2_B, GATE_W, FC_W,   FC_B,   MPROJ_W, MPROJ_B};
    const int ones[3] = {1, 1, 1};
    for (size_t i = 0; i < count; i++) g->slot_of[i] = -1, g->block_of[i] = SIZE_MAX;
    for (size_t l = 0; l < L; l++) {
        int moe = shard_gpt_block_is_moe(c, l);
        g->layer[l * PER_LAYER + GATE_W] = SIZE_MAX;
        for (int j = 0; j < PER_LAYER - !moe; j++) {
            int k = moe ? moe_order[j] : j;
            shard__placement *p = &g->place[n];
            switch (moe && k >= FC_W ? -k : k) {
            case ATTN_W: shard__placement_make(p, 4, (size_t[]){C, 3, H, g->D}, 2, qkv, 2); break;
            case ATTN_B: shard__placement_make(p, 3, (size_t[]){3, H, g->D}, 1, three, 1); break;
            case APROJ_W: shard__placement_make(p, 3, (size_t[]){H, g->D, C}, 2, heads, 0); break;
            case FC_W: shard__placement_make(p, 2, (size_t[]){C, 4 * C}, 2, two, 1); break;
            case FC_B: shard__placement_make(p, 1, (size_t[]){4 * C}, 1, one, 0); break;
            case MPROJ_W: shard__placement_make(p, 2, (size_t[]){4 * C, C}, 2, two, 0); break;
            case -GATE_W: shard__placement_make(p, 2, (size_t[]){E, C}, 2, two, -1); break;
            case -FC_W: shard__placement_make(p, 3, (size_t[]){g->El, C, 4 * C}, 3, ones, 2); break;
            case -FC_B: shard__placement_make(p, 2, (size_t[]){g->El, 4 * C}, 2, two, 1); break;
            case -MPROJ_W: shard__placement_make(p, 3, (size_t[]){g->El, 4 * C, C}, 3, ones, 1); break;
            case -MPROJ_B: shard__placement_make(p, 2, (size_t[]){g->El, C}, 2, two, -1); break;
            default: shard__placement_make(p, 1, (size_t[]){C}, 1, one, -1);
            }
            const char *name = suffix[k];
            char moe_name[48];
            if (moe && k >= FC_W && k <= MPROJ_B) /* mlp.c_fc.weight -> mlp.experts.c_fc.weight */
                snprintf(moe_name, sizeof moe_name, "mlp.experts.%s", suffix[k] + 4), name = moe_name;
            snprintf(t[n].name, sizeof t[n].name, "h.%zu.%s", l, name);
            g->slot_of[n] = k, g->block_of[n] = l;
            g->layer[l * PER_LAYER + (size_t)k] = n++;
        }
    }
    shard_status s = apply_specs(g, t, n, specs);
    if (s == SHARD_OK) s = read_placement(g, t);
    /* a pipeline stage keeps its own parameters: unit 0 (the embeddings on the first stage, ln_f on the
     * last), then one unit per block */
    if (s == SHARD_OK && !(n = keep_stage_params(g, t, n))) s = shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
    size_t units = 0;
    if (s == SHARD_OK) {
        if (g->has_u0) unit_first[units++] = 0;
        if (!(g->unit_of = calloc(L ? L : 1, sizeof *g->unit_of)))
            s = shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
        for (size_t l = 0; s == SHARD_OK && l < L; l++) {
            if (!holds_block(g, l)) continue;
            g->unit_of[l] = units, unit_first[units++] = g->layer[l * PER_LAYER];
            if (shard_gpt_block_is_moe(c, l)) /* its experts: a unit of their own (split over the expert axis) */
                unit_first[units++] = g->layer[l * PER_LAYER + FC_W];
        }
        unit_first[units] = n;
    }
    /* each parameter's stored local shape: its block of the logical shape, dims merged */
    for (size_t i = 0; s == SHARD_OK && i < n; i++) {
        size_t off[SHARD_PLACEMENT_MAX_DIMS], len[SHARD_PLACEMENT_MAX_DIMS];
        shard__placement_block(&g->place[i], &g->layout, g->tp_rank, off, len);
        t[i].ndim = g->place[i].stored_ndim;
        shard__placement_stored_shape(&g->place[i], len, t[i].shape);
    }
    if (s == SHARD_OK) s = shard_params_create(t, n, SHARD_MEM_PARAMS, &g->params);
    free(t);
    if (s < 0) {
        free(unit_first);
        shard_gpt_destroy(g);
        return s;
    }
    g->model.impl = g, g->model.ops = &gpt_model_ops; /* its stack table names the experts in weight files */
    s = shard_model_setup_units(&g->model, g->params, unit_first, units);
    if (s == SHARD_OK && !(g->whole = calloc(n, 1))) s = shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
    for (size_t i = 0; s == SHARD_OK && i < n; i++) g->whole[i] = !shard__placement_is_split(&g->place[i], &g->layout);
    if (s == SHARD_OK) g->model.tensor_replicated = g->whole;
    if (s == SHARD_OK && E && !(g->expert_split = calloc(n, 1)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
    for (size_t i = 0; s == SHARD_OK && E && i < n; i++)
        g->expert_split[i] = g->block_of[i] != SIZE_MAX && g->moe && shard_gpt_block_is_moe(c, g->block_of[i]) &&
            g->slot_of[i] >= FC_W && g->slot_of[i] <= MPROJ_B;
    if (s == SHARD_OK && E) g->model.expert_split = g->expert_split;
    free(unit_first);
    if (s == SHARD_OK) s = create_moe(g);
    /* activations: one accounted slab carved into buffers (on a pipeline stage backward's scratch only: the
     * pipeline holds each micro-batch's range buffer); Nr: rows of the residual stream this rank keeps */
    size_t N = max_batch * max_seq, first_row;
    g->Nr = N;
    if (g->sp) shard_split_even(N, (size_t)parts, 0, &first_row, &g->Nr); /* the first rank's share is the largest */
    /* the carves count in size_t: refuse sizes whose count would wrap (an over-estimate, in double) */
    double rows = (double)max_batch * (double)max_seq, V = (double)c->vocab_size;
    double per_slot = (double)L * ((double)H * rows * (double)max_seq + rows * 16 * (double)C) + rows * 2 * V;
    if (s == SHARD_OK && per_slot + rows * (3 * V + 16 * (double)C) > 0x1p50)
        s = shard_error(SHARD_ERR_NO_MEMORY,
                        "gpt: activations for batch %zu x sequence %zu would take over 2^50 floats; "
                        "give a smaller batch or sequence",
                        max_batch, max_seq);
    if (s == SHARD_OK) {
        size_t own = stage ? 0 : carve_range(g, NULL, 0, L); /* the whole model runs one range, its own */
        g->slab = shard_alloc((own + carve_shared(g, NULL)) * sizeof(float) + 1, SHARD_MEM_ACTIVATIONS);
        g->own_acts = stage || !g->slab ? NULL : g->slab;
        g->inputs = calloc(N, sizeof *g->inputs), g->targets = calloc(N, sizeof *g->targets);
        if (!g->slab || !g->inputs || !g->targets)
            s = shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory for activations");
    }
    if (s < 0) {
        shard_gpt_destroy(g);
        return s;
    }
    size_t own = g->own_acts ? carve_range(g, g->own_acts, 0, L) : 0;
    carve_shared(g, g->slab + own);
    if (g->own_acts) use_range(g, g->own_acts, 0, L);
    *out = g;
    return SHARD_OK;
}

shard_status shard_gpt_create(const shard_gpt_config *c, size_t max_batch, size_t max_seq, shard_gpt **out) {
    return gpt_create(c, max_batch, max_seq, NULL, NULL, 0, NULL, NULL, 1, out);
}

shard_status shard_gpt_create_training(const shard_gpt_config *c, size_t max_batch, size_t max_seq, shard_gpt **out) {
    return gpt_create(c, max_batch, max_seq, NULL, NULL, 0, NULL, NULL, 0, out);
}

void shard_gpt_destroy(shard_gpt *g) {
    if (!g) return;
    shard__model_free_units(&g->model);
    shard_params_destroy(g->params);
    shard_free(g->slab);
    free(g->inputs), free(g->targets), free(g->layer), free(g->acts), free(g->ls), free(g->place);
    free(g->whole), free(g->expert_split), free(g->unit_of), free(g->slot_of), free(g->block_of), free(g->load);
    for (size_t l = 0; g->moe && l < g->c.n_layer; l++) shard_moe_destroy(g->moe[l]);
    free(g->moe), free(g->moe_buffers);
    free(g);
}

shard_params *shard_gpt_params(shard_gpt *g) { return g->params; }
const shard_gpt_config *shard_gpt_config_of(const shard_gpt *g) { return &g->c; }
const float *shard_gpt_logits(const shard_gpt *g) { return g->keep_logits || !g->have_targets ? g->logits : NULL; }
shard_model *shard_gpt_model(shard_gpt *g) { return &g->model; }

/* ---------------------------------------------------------------- tensor-parallel pieces */

/* A run of an expert stack's piece: drawn at its index in the whole [E, ...] stack (`first`: where this
 * expert rank's experts start in it). */
typedef struct expert_draw {
    float *to;
    size_t first;
    float std;
    uint64_t seed;
    const char *name;
} expert_draw;

static void draw_expert_run(void *ctx, size_t whole_at, size_t piece_at, size_t n) {
    const expert_draw *d = ctx;
    shard_init_normal(d->to + piece_at, d->first + whole_at, n, d->std, d->seed, d->name);
}

/* The counter-based draw of this rank's piece: element e of the whole tensor, whatever the split. */
static void init_piece(const shard_gpt *g, size_t i, float std, uint64_t seed) {
    const shard_param_info *info = &g->params->info[i];
    const shard__placement *p = &g->place[i];
    if (g->expert_split && g->expert_split[i] && g->El) { /* experts e0.. of the whole [E, ...] stack */
        size_t per_expert = 1;
        for (int d = 1; d < p->ndim; d++) per_expert *= p->shape[d]; /* whole over the tensor axis */
        expert_draw d = {.to = P(g, i), .first = g->e0 * per_expert, .std = std, .seed = seed, .name = info->name};
        shard__placement_runs(p, &g->layout, g->tp_rank, draw_expert_run, &d);
        return;
    }
    shard__placement_init_normal(p, &g->layout, g->tp_rank, P(g, i), std, seed, info->name);
}

static void model_whole_shape(const shard_model *m, size_t i, size_t *shape) {
    const shard_gpt *g = m->impl;
    shard__placement_stored_shape(&g->place[i], g->place[i].shape, shape);
}

/* An expert stack (expert_split): every expert of the whole [E, ...] tensor, each stored as a tensor of its
 * own, "h.N.mlp.experts.J.c_fc.weight" (the index after "experts."). */
static size_t model_stack(const shard_model *m, size_t i, size_t *name_prefix_bytes) {
    const shard_gpt *g = m->impl;
    const char *name = g->params->info[i].name, *experts = strstr(name, ".experts.");
    if (!g->expert_split || !g->expert_split[i] || !experts) return 0;
    *name_prefix_bytes = (size_t)(experts - name) + strlen(".experts.");
    return g->c.num_local_experts;
}

/* "P(None, None, 'tensor', None) of [256, 3, 4, 64]": parameter i's spec and the logical shape it is written on;
 * an expert stack "P('expert', None, None) of [E, C, 4C]", its whole stack split over the expert axis. */
static void model_param_spec(const shard_model *m, size_t i, char *out, size_t bytes) {
    const shard_gpt *g = m->impl;
    const shard__placement *p = &g->place[i];
    char spec[128], shape[96] = "";
    int stack = g->expert_split && g->expert_split[i];
    if (stack)
        for (int d = 0, at = snprintf(spec, sizeof spec, "P('expert'"); d < p->ndim; d++)
            at += snprintf(spec + at, sizeof spec - (size_t)at, d + 1 < p->ndim ? ", None" : ")");
    else
        shard__placement_spec_text(p, &g->layout, spec, sizeof spec);
    for (int d = 0, at = 0; d < p->ndim && at < (int)sizeof shape; d++)
        at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%zu", d ? ", " : "",
                       stack && d == 0 ? g->c.num_local_experts : p->shape[d]);
    snprintf(out, bytes, "%s of [%s]", spec, shape);
}

/* whole = every tensor rank's piece of parameter i put in place (collective over the tensor axis). */
static shard_status model_gather_piece(shard_model *m, size_t i, const float *piece, float *whole) {
    shard_gpt *g = m->impl;
    return shard__placement_gather(g->tp, &g->place[i], &g->layout, piece, whole, g->params->info[i].name);
}

static void model_take_piece(const shard_model *m, size_t i, const float *whole, float *piece) {
    const shard_gpt *g = m->impl;
    shard__placement_take(&g->place[i], &g->layout, g->tp_rank, whole, piece);
}

void shard_gpt_init(shard_gpt *g, uint64_t seed) {
    g->model.seed = seed; /* dropout's run seed for shard_gpt_forward (the trainer sets its own per batch) */
    float std = g->c.initializer_range, proj_std = std / sqrtf(2.0f * (float)g->c.n_layer);
    for (size_t i = 0; i < g->params->count; i++) {
        const shard_param_info *info = &g->params->info[i];
        float *x = P(g, i);
        const char *name = info->name;
        size_t len = strlen(name);
        if (len > 5 && strcmp(name + len - 5, ".bias") == 0) {
            memset(x, 0, info->numel * sizeof *x);
        } else if (strstr(name, "ln_") != NULL) {
            for (size_t k = 0; k < info->numel; k++) x[k] = 1.0f;
        } else {
            init_piece(g, i, strstr(name, "c_proj.weight") ? proj_std : std, seed);
        }
    }
}

/* ---------------------------------------------------------------- forward */

/* Dropout sites: 0 the embeddings; per block l: 1 + 3l attention probabilities,
 * 2 + 3l the attention's output, 3 + 3l the MLP's output. */
static float drop_p(const shard_gpt *g, float p) { return g->dropout ? p : 0.0f; }
static uint64_t drop_seed(const shard_gpt *g, uint64_t site) { return shard_model_dropout_seed(&g->model, site); }
static uint64_t drop_offset(const shard_gpt *g) { return (uint64_t)g->model.first_row * g->T * g->c.n_embd; }

/* ---- the token split of sequence parallelism (without it: one rank's view, n0 = 0, Nl = N) ---- */

static void split_tokens(shard_gpt *g, size_t N) { shard_tp_token_range(g->tp, g->sp, N, &g->n0, &g->Nl); }

/* A layer's place on the tensor axis (split: its weight is split over it, per the specs). */
static shard_tp_place tp_place(const shard_gpt *g, int split) {
    return (shard_tp_place){.comm = g->tp, .split = split, .tokens = g->sp};
}

/* The state of the residual stream's rows: this rank's tokens under sequence parallel, else all. */
static shard_tp_state rows_state(const shard_gpt *g) { return g->sp ? SHARD_TP_TOKENS : SHARD_TP_REPLICATED; }

/* LayerNorm backward on this rank's rows; under sp the weight and bias gradients come from these rows
 * only, so they are summed over tensor ranks before being added. */
static shard_status ln_backward(shard_gpt *g, const float *x, size_t w, size_t b, const float *mean, const float *rstd,
                                const float *dy, float *dx) {
    size_t C = g->c.n_embd;
    if (!g->sp) {
        shard_layernorm_backward(x, P(g, w), mean, rstd, dy, dx, G(g, w), G(g, b), g->Nl, C);
        return SHARD_OK;
    }
    memset(g->ln_scratch, 0, 2 * C * sizeof(float));
    shard_layernorm_backward(x, P(g, w), mean, rstd, dy, dx, g->ln_scratch, g->ln_scratch + C, g->Nl, C);
    SHARD_CHECK(shard_tp_sum(g->tp, g->ln_scratch, 2 * C));
    shard_add(G(g, w), g->ln_scratch, G(g, w), C);
    shard_add(G(g, b), g->ln_scratch + C, G(g, b), C);
    return SHARD_OK;
}

/* ---- the mixture-of-experts blocks ---- */

/* Block l's noise keys: sites 1 + 3 L + 2 l (jitter) and 2 + 3 L + 2 l (random routing), after dropout's. */
static shard_moe_keys block_keys(const shard_gpt *g, size_t l) {
    uint64_t site = 1 + 3 * (uint64_t)g->c.n_layer + 2 * (uint64_t)l;
    return (shard_moe_keys){.training = g->have_targets,
                            .jitter_seed = drop_seed(g, site),
                            .routing_seed = drop_seed(g, site + 1),
                            .first_row = g->model.first_row,
                            .uncounted = g->model.recomputing};
}

static shard_moe_weights moe_weights(const shard_gpt *g, const size_t *w) {
    return (shard_moe_weights){P(g, w[GATE_W]), P(g, w[FC_W]), P(g, w[FC_B]), P(g, w[MPROJ_W]), P(g, w[MPROJ_B])};
}

/* The router losses' denominator: the global batch's rows (the trainer's), else this forward's. */
static double moe_rows(const shard_gpt *g) {
    return g->model.global_rows ? (double)g->model.global_rows : (double)g->B;
}

static void moe_reset(shard_gpt *g) {
    for (size_t l = 0; l < g->c.n_layer; l++)
        if (g->moe[l]) shard_moe_stats_reset(g->moe[l]);
}

void shard_gpt_router_stats(const shard_gpt *g, shard_model_router_stats *out) {
    size_t E = g->c.num_local_experts, k = 0;
    *out = (shard_model_router_stats){.layers = g->moe_layers, .experts = g->moe_layers ? E : 0, .load = g->load};
    for (size_t l = 0; l < g->c.n_layer; l++) {
        if (!shard_gpt_block_is_moe(&g->c, l)) continue;
        double *row = g->load + k++ * E;
        if (!g->moe[l]) { /* another pipeline stage's block */
            memset(row, 0, E * sizeof *row);
            continue;
        }
        shard_moe_stats st;
        shard_moe_stats_read(g->moe[l], &st);
        out->aux_loss += st.aux, out->z_loss += st.z, out->assigned += st.assigned, out->dropped += st.dropped;
        memcpy(row, st.load, E * sizeof *row);
    }
}

/* Forward with the loss sum divided by `denominator` (the model table's form).  Rows of the residual
 * stream (x, mid, out; their LayerNorm statistics) are this rank's tokens under sequence parallel. */
static shard_status gpt_forward(shard_gpt *g, const int32_t *inputs, const int32_t *targets, size_t B, size_t T,
                                double denominator, double *loss, const float *stage_in, float *stage_out) {
    const shard_gpt_config *c = &g->c;
    size_t C = c->n_embd, V = c->vocab_size, H = c->n_head, N = B * T;
    if (B == 0 || T == 0 || B > g->max_b || T > g->max_t)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "gpt forward: batch %zu x sequence %zu; this model was made for up to %zu x %zu", B, T,
                           g->max_b, g->max_t);
    /* checked before any unit is acquired: a failure inside would leave a strategy's unit held */
    for (size_t n = 0; n < N; n++)
        if (inputs[n] < 0 || (size_t)inputs[n] >= V)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "gpt forward: token id %d at position %zu is outside the vocabulary "
                               "[0, %zu)",
                               (int)inputs[n], n, V);
    g->B = B, g->T = T, g->have_targets = targets != NULL;
    g->dropout = targets != NULL && (c->resid_pdrop > 0 || c->embd_pdrop > 0 || c->attn_pdrop > 0);
    if (inputs != g->inputs) memcpy(g->inputs, inputs, N * sizeof *inputs);
    if (targets && targets != g->targets) memcpy(g->targets, targets, N * sizeof *targets);
    split_tokens(g, N);
    size_t r0 = g->n0, Nl = g->Nl;
    uint64_t rows_offset = drop_offset(g) + r0 * C; /* dropout keys of this rank's rows */
    /* embeddings: token (vocabulary-parallel: a partial lookup, summed) + position */
    float *x = g->l1 > g->l0 ? g->acts[g->l0].in : g->out;
    if (!g->first) { /* a later pipeline stage: the previous stage's output */
        memcpy(x, stage_in, Nl * C * sizeof *x);
    } else {
        SHARD_CHECK(shard_model_acquire(&g->model, 0, 0));
        shard_tp_place emb = tp_place(g, g->vocab_split);
        SHARD_CHECK(
            shard_tp_embedding_forward(&emb, P(g, g->wte), inputs, g->sp ? g->full : x, x, N, g->v0, g->Vl, V, C));
        for (size_t n = 0; n < Nl; n++) shard_add(x + n * C, P(g, g->wpe) + ((r0 + n) % T) * C, x + n * C, C);
        SHARD_CHECK(shard_model_release(&g->model, 0, 0));
        if (drop_p(g, c->embd_pdrop) > 0)
            shard_dropout_forward(x, x, Nl * C, c->embd_pdrop, drop_seed(g, 0), rows_offset);
    }
    for (size_t l = g->l0; l < g->l1; l++) {
        layer_acts *a = &g->acts[l];
        const size_t *w = &g->layer[l * PER_LAYER];
        float *next = l + 1 < g->l1 ? g->acts[l + 1].in : g->out;
        float pr = drop_p(g, c->resid_pdrop);
        const layer_split *ls = &g->ls[l];
        size_t Cl = ls->Cl, Fl = ls->Fl;
        shard_tp_place attn = tp_place(g, ls->attn_split), mlp = tp_place(g, ls->mlp_split);
        SHARD_CHECK(shard_model_acquire(&g->model, block_unit(g, l), 0));
        /* attention: column-parallel c_attn, this rank's heads, row-parallel c_proj */
        shard_layernorm_forward(a->in, P(g, w[LN1_W]), P(g, w[LN1_B]), c->layer_norm_epsilon, a->ln1 + r0 * C,
                                a->ln1_mean, a->ln1_rstd, Nl, C);
        SHARD_CHECK(shard_tp_column_forward(&attn, a->ln1, P(g, w[ATTN_W]), P(g, w[ATTN_B]), a->qkv, N, C, 3 * Cl));
        SHARD_CHECK(shard_attention_forward_dropout(a->qkv, a->atty, a->att, B, T, Cl, ls->Hl, drop_p(g, c->attn_pdrop),
                                                    drop_seed(g, 1 + 3 * l), g->model.first_row, H, ls->h0));
        SHARD_CHECK(shard_tp_row_forward(&attn, a->atty, P(g, w[APROJ_W]), P(g, w[APROJ_B]), g->sp ? g->full : a->mid,
                                         a->mid, N, Cl, C));
        if (pr > 0) shard_dropout_forward(a->mid, a->mid, Nl * C, pr, drop_seed(g, 2 + 3 * l), rows_offset);
        shard_add(a->in, a->mid, a->mid, Nl * C); /* mid = in + attention */
        /* MLP: column-parallel c_fc, GELU on this rank's columns, row-parallel c_proj */
        shard_layernorm_forward(a->mid, P(g, w[LN2_W]), P(g, w[LN2_B]), c->layer_norm_epsilon, a->ln2 + r0 * C,
                                a->ln2_mean, a->ln2_rstd, Nl, C);
        if (g->moe[l]) { /* or a mixture of experts (each expert's c_fc / c_proj split as the pair above) */
            SHARD_CHECK(shard_model_acquire(&g->model, experts_unit(g, l), 0)); /* its values valid from here */
            shard_moe_weights mw = moe_weights(g, w);
            shard_moe_keys keys = block_keys(g, l);
            SHARD_CHECK(shard_moe_forward(g->moe[l], &mw, a->ln2, B, T, &keys, moe_rows(g), next));
            SHARD_CHECK(shard_model_release(&g->model, experts_unit(g, l), 0));
        } else {
            SHARD_CHECK(shard_tp_column_forward(&mlp, a->ln2, P(g, w[FC_W]), P(g, w[FC_B]), a->fc, N, C, Fl));
            shard_gelu_forward_slope(a->fc, a->gelu, N * Fl); /* a->fc now holds GELU' of the pre-activation */
            SHARD_CHECK(shard_tp_row_forward(&mlp, a->gelu, P(g, w[MPROJ_W]), P(g, w[MPROJ_B]), g->sp ? g->full : next,
                                             next, N, Fl, C));
        }
        SHARD_CHECK(shard_model_release(&g->model, block_unit(g, l), 0));
        if (pr > 0) shard_dropout_forward(next, next, Nl * C, pr, drop_seed(g, 3 + 3 * l), rows_offset);
        shard_add(a->mid, next, next, Nl * C); /* next = mid + MLP */
    }
    if (!g->last) { /* the next pipeline stage takes it from here */
        memcpy(stage_out, g->out, Nl * C * sizeof *stage_out);
        return SHARD_OK;
    }
    SHARD_CHECK(shard_model_acquire(&g->model, 0, 0));
    shard_layernorm_forward(g->out, P(g, g->lnf_w), P(g, g->lnf_b), c->layer_norm_epsilon, g->lnf + r0 * C, g->lnf_mean,
                            g->lnf_rstd, Nl, C);
    SHARD_CHECK(shard_tp_redistribute(g->tp, g->lnf, g->lnf + r0 * C, N, C, rows_state(g), SHARD_TP_REPLICATED));
    /* the tied head; vocabulary-parallel: this rank's columns of the logits only */
    SHARD_CHECK(shard_sgemm(0, 1, N, g->Vl, C, 1.0f, g->lnf, C, head_w(g), C, 0.0f, g->logits, g->Vl));
    SHARD_CHECK(shard_model_release(&g->model, 0, 0));
    if (!targets) return SHARD_OK;
    return shard_tp_cross_entropy(g->vocab_split ? g->tp : NULL, g->logits, targets, -100, N, g->v0, g->Vl, V,
                                  denominator, loss, g->dlogits);
}

shard_status shard_gpt_forward(shard_gpt *g, const int32_t *inputs, const int32_t *targets, size_t B, size_t T,
                               float *loss) {
    size_t used = 0;
    for (size_t n = 0; targets && n < B * T; n++) used += targets[n] != -100;
    double l = 0;
    if (targets) g->model.step++, moe_reset(g); /* training forwards count themselves: new dropout masks each time */
    SHARD_CHECK(gpt_forward(g, inputs, targets, B, T, (double)used, &l, NULL, NULL));
    if (loss && targets) *loss = (float)l;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- backward */

static shard_status gpt_backward(shard_gpt *g, const float *stage_d_out, float *stage_d_in) {
    const shard_gpt_config *c = &g->c;
    size_t C = c->n_embd, V = c->vocab_size, H = c->n_head, B = g->B, T = g->T, N = B * T;
    /* this micro-batch's token split (a pipeline may have run another micro-batch's forward since) */
    split_tokens(g, N);
    size_t Vl = g->Vl, r0 = g->n0, Nl = g->Nl;
    uint64_t rows_offset = drop_offset(g) + r0 * C;
    float *dln = g->sp ? g->d_lnl : g->d_ln; /* an LayerNorm output's gradient, summed: this rank's rows */
    /* head (tied to wte) and the final LayerNorm; with the vocabulary split, d(lnf) is summed over tensor ranks */
    if (g->last) {
        SHARD_CHECK(shard_model_acquire(&g->model, 0, 1));
        SHARD_CHECK(shard_sgemm(0, 0, N, C, Vl, 1.0f, g->dlogits, Vl, head_w(g), C, 0.0f, g->d_ln, C));
        SHARD_CHECK(shard_tp_redistribute(g->tp, g->d_ln, dln, N, C,
                                          g->vocab_split ? SHARD_TP_PARTIAL : SHARD_TP_REPLICATED, rows_state(g)));
        SHARD_CHECK(shard_sgemm(1, 0, Vl, C, N, 1.0f, g->dlogits, Vl, g->lnf, C, 1.0f, head_g(g), C));
        memset(g->d_resid, 0, Nl * C * sizeof(float));
        SHARD_CHECK(ln_backward(g, g->out, g->lnf_w, g->lnf_b, g->lnf_mean, g->lnf_rstd, dln, g->d_resid));
        SHARD_CHECK(shard_model_release(&g->model, 0, 1));
        if (!g->own_first) SHARD_CHECK(shard_model_grads_ready(&g->model, 0)); /* the last stage's unit 0: ln_f */
    } else { /* the next pipeline stage's gradient of this stage's output */
        memcpy(g->d_resid, stage_d_out, Nl * C * sizeof(float));
    }
    float pr = drop_p(g, c->resid_pdrop);
    for (size_t l = g->l1; l-- > g->l0;) {
        layer_acts *a = &g->acts[l];
        const size_t *w = &g->layer[l * PER_LAYER];
        const layer_split *ls = &g->ls[l];
        size_t Cl = ls->Cl, Fl = ls->Fl;
        shard_tp_place attn = tp_place(g, ls->attn_split), mlp = tp_place(g, ls->mlp_split);
        SHARD_CHECK(shard_model_acquire(&g->model, block_unit(g, l), 1));
        /* MLP: next = mid + drop(c_proj(gelu(c_fc(ln_2(mid))))) */
        const float *dy = g->d_resid;
        if (pr > 0)
            shard_dropout_backward(g->d_resid, g->d_tmp, Nl * C, pr, drop_seed(g, 3 + 3 * l), rows_offset),
                dy = g->d_tmp;
        if (g->moe[l]) {
            SHARD_CHECK(shard_model_acquire(&g->model, experts_unit(g, l), 1));
            shard_moe_weights mw = moe_weights(g, w);
            shard_moe_grads mg = {G(g, w[GATE_W]), G(g, w[FC_W]), G(g, w[FC_B]), G(g, w[MPROJ_W]), G(g, w[MPROJ_B])};
            SHARD_CHECK(shard_moe_backward(g->moe[l], &mw, dy, dln, &mg));
            SHARD_CHECK(shard_model_release(&g->model, experts_unit(g, l), 1));
            SHARD_CHECK(shard_model_grads_ready(&g->model, experts_unit(g, l)));
        } else {
            SHARD_CHECK(shard_tp_row_backward(&mlp, a->gelu, P(g, w[MPROJ_W]), dy, g->full, g->d_fc, G(g, w[MPROJ_W]),
                                              G(g, w[MPROJ_B]), N, Fl, C));
            shard_mul(g->d_fc, a->fc, g->d_fc, N * Fl); /* GELU's backward: times its slope, kept by the forward */
            /* column-parallel: the input's gradient summed */
            SHARD_CHECK(shard_tp_column_backward(&mlp, a->ln2, P(g, w[FC_W]), g->d_fc, g->d_ln, dln, G(g, w[FC_W]),
                                                 G(g, w[FC_B]), N, C, Fl));
        }
        SHARD_CHECK(ln_backward(g, a->mid, w[LN2_W], w[LN2_B], a->ln2_mean, a->ln2_rstd, dln, g->d_tmp));
        shard_add(g->d_resid, g->d_tmp, g->d_resid, Nl * C);
        /* attention: mid = in + drop(c_proj(attn(c_attn(ln_1(in))))) */
        dy = g->d_resid;
        if (pr > 0)
            shard_dropout_backward(g->d_resid, g->d_tmp, Nl * C, pr, drop_seed(g, 2 + 3 * l), rows_offset),
                dy = g->d_tmp;
        SHARD_CHECK(shard_tp_row_backward(&attn, a->atty, P(g, w[APROJ_W]), dy, g->full, g->d_atty, G(g, w[APROJ_W]),
                                          G(g, w[APROJ_B]), N, Cl, C));
        SHARD_CHECK(shard_attention_backward_dropout(a->qkv, a->att, g->d_atty, g->d_qkv, B, T, Cl, ls->Hl,
                                                     drop_p(g, c->attn_pdrop), drop_seed(g, 1 + 3 * l),
                                                     g->model.first_row, H, ls->h0));
        SHARD_CHECK(shard_tp_column_backward(&attn, a->ln1, P(g, w[ATTN_W]), g->d_qkv, g->d_ln, dln, G(g, w[ATTN_W]),
                                             G(g, w[ATTN_B]), N, C, 3 * Cl));
        SHARD_CHECK(ln_backward(g, a->in, w[LN1_W], w[LN1_B], a->ln1_mean, a->ln1_rstd, dln, g->d_tmp));
        shard_add(g->d_resid, g->d_tmp, g->d_resid, Nl * C);
        SHARD_CHECK(shard_model_release(&g->model, block_unit(g, l), 1));
        SHARD_CHECK(shard_model_grads_ready(&g->model, block_unit(g, l)));
    }
    if (!g->first) { /* the previous pipeline stage goes on with the gradient of this stage's input */
        memcpy(stage_d_in, g->d_resid, Nl * C * sizeof(float));
        return SHARD_OK;
    }
    /* embeddings */
    if (drop_p(g, c->embd_pdrop) > 0)
        shard_dropout_backward(g->d_resid, g->d_resid, Nl * C, c->embd_pdrop, drop_seed(g, 0), rows_offset);
    SHARD_CHECK(shard_model_acquire(&g->model, 0, 1));
    float *dwpe = g->sp ? g->wpe_scratch : G(g, g->wpe);
    if (g->sp) memset(dwpe, 0, c->n_positions * C * sizeof(float));
    for (size_t n = 0; n < Nl; n++)
        shard_add(dwpe + ((r0 + n) % T) * C, g->d_resid + n * C, dwpe + ((r0 + n) % T) * C, C);
    if (g->sp) { /* position rows from this rank's tokens: summed over tensor ranks */
        SHARD_CHECK(shard_tp_sum(g->tp, dwpe, c->n_positions * C));
        shard_add(G(g, g->wpe), dwpe, G(g, g->wpe), c->n_positions * C);
    }
    shard_tp_place emb = tp_place(g, g->vocab_split);
    SHARD_CHECK(shard_tp_embedding_backward(&emb, g->inputs, g->d_resid, g->full, G(g, g->wte), N, g->v0, g->Vl, V, C));
    SHARD_CHECK(shard_model_release(&g->model, 0, 1));
    return shard_model_grads_ready(&g->model, 0);
}

shard_status shard_gpt_backward(shard_gpt *g, shard_params *grads) {
    if (!g->have_targets) return shard_error(SHARD_ERR_INVALID_ARG, "gpt backward: the last forward had no targets");
    if (!grads) return gpt_backward(g, NULL, NULL);
    if (grads->total != g->params->total)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "gpt backward: grads must have the parameters' layout (shard_params_like)");
    /* into grads for this call only: the gradient pointers bound before (a strategy's) are put back */
    size_t n = g->params->count;
    float **bound = malloc(n * sizeof *bound);
    if (!bound) return shard_error(SHARD_ERR_NO_MEMORY, "gpt backward: out of memory");
    memcpy(bound, g->model.grad, n * sizeof *bound);
    shard_model_bind_grad_slab(&g->model, grads->data);
    shard_status s = gpt_backward(g, NULL, NULL);
    memcpy(g->model.grad, bound, n * sizeof *bound);
    free(bound);
    return s;
}

/* ---------------------------------------------------------------- the model table */

static shard_gpt *impl(const shard_model *m) { return (shard_gpt *)m->impl; }

/* Tokens copied: a pipeline's stages read a micro-batch's tokens after the next one was set (the source's
 * buffers hold only the last). */
static shard_status model_set_batch(shard_model *m, const shard_batch *b) {
    shard_gpt *g = impl(m);
    SHARD_CHECK(shard_model_check_batch(m, b, g->max_b, SHARD_I32, g->max_t, SHARD_I32, g->max_t));
    g->B = b->rows, g->T = g->max_t;
    if (b->rows) memcpy(g->inputs, b->inputs, b->rows * g->max_t * sizeof *g->inputs);
    if (b->rows) memcpy(g->targets, b->targets, b->rows * g->max_t * sizeof *g->targets);
    return SHARD_OK;
}

static size_t model_items(const shard_model *m) {
    const shard_gpt *g = impl(m);
    size_t used = 0;
    for (size_t n = 0; n < m->rows * g->max_t; n++) used += g->targets[n] != -100;
    return used;
}

/* A pipeline stage's model runs its ranges through the pipeline table, over the pipeline's buffers. */
static shard_status whole_only(const shard_gpt *g) {
    if (g->own_acts) return SHARD_OK;
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "gpt: this model holds one pipeline stage: run it through its pipeline "
                       "table (forward_range, backward_range)");
}

static shard_status model_forward(shard_model *m, double denominator, double *loss) {
    shard_gpt *g = impl(m);
    *loss = 0;
    SHARD_CHECK(whole_only(g));
    if (!m->rows) return SHARD_OK;
    return gpt_forward(g, g->inputs, g->targets, m->rows, g->max_t, denominator, loss, NULL, NULL);
}

static shard_status model_backward(shard_model *m) {
    SHARD_CHECK(whole_only(impl(m)));
    return m->rows ? gpt_backward(impl(m), NULL, NULL) : SHARD_OK;
}

/* ---- the pipeline table (model.h): the residual stream of this rank's tokens travels between ranges ---- */

static size_t pipe_blocks(const shard_model *m) { return impl(m)->c.n_layer; }

static void pipe_stage_blocks(const shard_model *m, size_t chunk, size_t *first, size_t *last) {
    const shard_gpt *g = impl(m);
    size_t c = chunk < g->chunks ? chunk : 0;
    *first = g->ch0[c], *last = g->ch1[c];
}

static size_t pipe_io_floats(const shard_model *m) {
    const shard_gpt *g = impl(m);
    size_t first, count;
    shard_tp_token_range(g->tp, g->sp, m->rows * g->max_t, &first, &count);
    return count * g->c.n_embd;
}

static size_t pipe_acts_floats(const shard_model *m, size_t first, size_t last) {
    return carve_range(impl(m), NULL, first, last);
}

/* The range must be blocks this stage holds, run from its start (in NULL) only at block 0 on the stage
 * that embeds and to its end (out NULL) only on the stage with the head. */
static shard_status check_range(const shard_gpt *g, size_t first, size_t last, const void *in, const void *out) {
    int held = first < last && last <= g->c.n_layer;
    for (size_t l = first; held && l < last; l++) held = holds_block(g, l);
    if (!held || (!in && !(first == 0 && g->own_first)) || (!out && !(last == g->c.n_layer && g->own_last)))
        return shard_error(SHARD_ERR_INVALID_ARG, "gpt: blocks %zu..%zu%s%s are not a range this stage runs", first,
                           last, in ? "" : " from the embeddings", out ? "" : " to the loss");
    return SHARD_OK;
}

/* The MoE layers of blocks [first, last) on the context of activation buffer `acts` (one per buffer:
 * the routing of a micro-batch's forward waits there for its backward). */
static shard_status select_moe(shard_gpt *g, const float *acts, size_t first, size_t last) {
    if (!g->moe_layers) return SHARD_OK;
    size_t k = 0;
    while (k < g->moe_contexts && g->moe_buffers[k] != acts) k++;
    if (k == g->moe_contexts) {
        const float **more = realloc(g->moe_buffers, (k + 1) * sizeof *more);
        if (!more) return shard_error(SHARD_ERR_NO_MEMORY, "gpt: out of memory");
        g->moe_buffers = more, g->moe_buffers[g->moe_contexts++] = acts;
    }
    for (size_t l = first; l < last; l++)
        if (g->moe[l]) SHARD_CHECK(shard_moe_select(g->moe[l], k));
    return SHARD_OK;
}

static shard_status pipe_forward_range(shard_model *m, float *acts, size_t first, size_t last, const float *in,
                                       float *out, double denominator, double *loss) {
    shard_gpt *g = impl(m);
    *loss = 0;
    SHARD_CHECK(check_range(g, first, last, in, out));
    if (!m->rows) return SHARD_OK;
    use_range(g, acts, first, last);
    SHARD_CHECK(select_moe(g, acts, first, last));
    return gpt_forward(g, g->inputs, g->targets, m->rows, g->max_t, denominator, loss, in, out);
}

static shard_status pipe_backward_range(shard_model *m, float *acts, size_t first, size_t last, const float *d_out,
                                        float *d_in) {
    shard_gpt *g = impl(m);
    SHARD_CHECK(check_range(g, first, last, d_in, d_out));
    if (!m->rows) return SHARD_OK;
    use_range(g, acts, first, last);
    SHARD_CHECK(select_moe(g, acts, first, last));
    return gpt_backward(g, d_out, d_in);
}

static size_t pipe_tied(shard_model *m, size_t *unit, float **value, float **grad) {
    shard_gpt *g = impl(m);
    if (g->own_first == g->own_last) return 0; /* the whole model, or a middle stage */
    *unit = g->own_first ? 0 : SIZE_MAX;
    *value = g->own_first ? P(g, g->wte) : NULL, *grad = g->own_first ? G(g, g->wte) : NULL;
    return g->Vl * g->c.n_embd;
}

static void pipe_use_tied(shard_model *m, float *value, float *grad) {
    shard_gpt *g = impl(m);
    g->tied_value = value, g->tied_grad = grad;
}

static void model_init(shard_model *m, uint64_t seed) { shard_gpt_init(impl(m), seed); }
static void model_destroy(shard_model *m) { shard_gpt_destroy(impl(m)); }

static void model_describe(const shard_model *m, char *out, size_t bytes) {
    const shard_gpt_config *c = &impl(m)->c;
    char moe[160] = "";
    if (c->num_local_experts)
        snprintf(moe, sizeof moe, ", %zu experts top-%zu in %zu of the blocks (capacity factor %g)",
                 c->num_local_experts, c->num_experts_per_tok, impl(m)->moe_layers, (double)c->expert_capacity_factor);
    snprintf(out, bytes, "GPT %zu layers x %zu wide, %zu heads, vocab %zu, %zu positions%s: %.2f M parameters%s",
             c->n_layer, c->n_embd, c->n_head, c->vocab_size, c->n_positions, moe,
             (double)shard_gpt_param_count(c) / 1e6,
             impl(m)->type_assumed ? " (model_type missing: gpt2 assumed)" : "");
}

static int stats_routed(const shard_model *m) { return impl(m)->moe_layers > 0; }
static void stats_reset(shard_model *m) { moe_reset(impl(m)); }
static void stats_read(const shard_model *m, shard_model_router_stats *out) { shard_gpt_router_stats(impl(m), out); }

static const shard_model_stats_ops gpt_stats_ops = {
    .struct_size = sizeof(shard_model_stats_ops), .routed = stats_routed, .reset = stats_reset, .read = stats_read};

static const shard_model_tensor_ops gpt_tensor_ops = {.struct_size = sizeof(shard_model_tensor_ops),
                                                      .whole_shape = model_whole_shape,
                                                      .gather_piece = model_gather_piece,
                                                      .take_piece = model_take_piece,
                                                      .param_spec = model_param_spec};

static const shard_model_stack_ops gpt_stack_ops = {.struct_size = sizeof(shard_model_stack_ops), .stack = model_stack};

static const shard_model_pipe_ops gpt_pipe_ops = {.struct_size = sizeof(shard_model_pipe_ops),
                                                  .blocks = pipe_blocks,
                                                  .stage_blocks = pipe_stage_blocks,
                                                  .io_floats = pipe_io_floats,
                                                  .acts_floats = pipe_acts_floats,
                                                  .forward_range = pipe_forward_range,
                                                  .backward_range = pipe_backward_range,
                                                  .tied = pipe_tied,
                                                  .use_tied = pipe_use_tied};

static void model_batch_shape(const shard_model *m, shard_batch *shape) {
    const shard_gpt *g = impl(m);
    shape->input_dtype = shape->target_dtype = SHARD_I32, shape->input_elems = shape->target_elems = g->max_t;
}

static const shard_model_ops gpt_model_ops = {.struct_size = sizeof(shard_model_ops),
                                              .kind = "gpt2",
                                              .set_batch = model_set_batch,
                                              .batch_items = model_items,
                                              .forward = model_forward,
                                              .backward = model_backward,
                                              .init = model_init,
                                              .describe = model_describe,
                                              .destroy = model_destroy,
                                              .tensor = &gpt_tensor_ops,
                                              .pipe = &gpt_pipe_ops,
                                              .stats = &gpt_stats_ops,
                                              .stacks = &gpt_stack_ops,
                                              .batch_shape = model_batch_shape};

shard_status shard__gpt_model_create(const char *text, const char *where, size_t max_rows, size_t seq,
                                     shard_comm *tensor, shard_comm *expert, int sequence_parallel, const char *specs,
                                     const shard_model_stage *stage, shard_model **out) {
    shard_gpt_config c;
    SHARD_CHECK(shard_gpt_config_parse(text, where, &c));
    if (seq > c.n_positions)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'n_positions' = %zu is shorter than --seq %zu", where,
                           c.n_positions, seq);
    shard_gpt *g = NULL;
    /* the model table trains: nothing reads the logits after the loss, so its gradient replaces them */
    SHARD_CHECK(gpt_create(&c, max_rows ? max_rows : 1, seq, tensor, expert, sequence_parallel, specs, stage, 0, &g));
    g->model.ops = &gpt_model_ops;
    json_t *root = json_loads(text, 0, NULL); /* parsed above: only the key's presence is asked */
    g->type_assumed = !json_object_get(root, "model_type");
    json_decref(root);
    *out = &g->model;
    return SHARD_OK;
}

/* The token file of `shard data text` in data_dir, its vocabulary within the model's. */
shard_status shard__gpt_batch_source(const shard_model_create_options *o, const shard_model *m,
                                     shard_batch_source **out) {
    *out = NULL;
    if (!o->data_dir)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: a GPT trains on token files: give --data DIR (shard data text)",
                           o->config_path);
    char path[4096];
    snprintf(path, sizeof path, "%s/train.tokens", o->data_dir);
    const shard_gpt *g = impl(m);
    shard_batch_tokens_options t = {.struct_size = sizeof t,
                                    .path = path,
                                    .seq = g->max_t,
                                    .max_rows = g->max_b,
                                    .vocab_size = g->c.vocab_size,
                                    .where = o->config_path};
    return shard_batch_source_tokens(&t, out);
}
