/* gpt.h — a GPT-2-style decoder: Hugging Face GPT-2's config fields and
 * tensor names (wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight
 * ... with GPT-2's Conv1D in x out layout), the LM head tied to wte, so a
 * GPT-2 checkpoint in safetensors loads by name.
 *
 * One block: x += c_proj(attn(c_attn(ln_1(x)))); x += c_proj(gelu(c_fc(ln_2(x)))).
 * With num_local_experts E > 0 the MLP of every moe_layer_frequency-th block (blocks l with
 * (l + 1) % moe_layer_frequency == 0: the last of each run of that many) is a mixture of E experts
 * (moe.h): h.l.mlp.gate.weight [E, C] and the experts stacked, h.l.mlp.experts.c_fc.weight [E, C, 4C],
 * .c_fc.bias [E, 4C], .c_proj.weight [E, 4C, C], .c_proj.bias [E, C].
 * Forward keeps the activations backward needs (sized for max_batch x
 * max_seq at creation); backward adds into a gradient slab of the
 * parameters' layout. */
#ifndef SHARD_GPT_H
#define SHARD_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "shard/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_gpt_config {
    size_t n_embd, n_layer, n_head, n_positions, vocab_size;
    float layer_norm_epsilon; /* default 1e-5 */
    float initializer_range;  /* default 0.02 */
    /* dropout probabilities (default 0: off), in training forwards only (with targets) */
    float resid_pdrop, embd_pdrop, attn_pdrop;
    /* mixture of experts (Hugging Face's keys; num_local_experts 0: every MLP dense) */
    size_t num_local_experts, num_experts_per_tok;                       /* E and top-k */
    size_t moe_layer_frequency;                                          /* default 1 (0 reads as 1) */
    float expert_capacity_factor;                                        /* 0: no token dropped */
    float router_aux_loss_coef, router_z_loss_coef, router_jitter_noise; /* parsed defaults 0.01, 0, 0 */
    int router_random_routing;                                           /* default false */
    int norm_topk_prob;                                                  /* parsed default: true for top-k >= 2 */
} shard_gpt_config;

/* Parse a JSON config (`where` names it in messages).  Hugging Face's GPT-2
 * config.json is accepted; an unknown key, a wrong type, or inconsistent
 * sizes (n_embd not divisible by n_head, ...) is refused naming the key. */
shard_status shard_gpt_config_parse(const char *json_text, const char *where, shard_gpt_config *out);
shard_status shard_gpt_config_load(const char *path, shard_gpt_config *out);
size_t shard_gpt_param_count(const shard_gpt_config *c);
/* Whether block l's MLP is a mixture of experts. */
int shard_gpt_block_is_moe(const shard_gpt_config *c, size_t l);

typedef struct shard_gpt shard_gpt;
struct shard_model_router_stats;

shard_status shard_gpt_create(const shard_gpt_config *c, size_t max_batch, size_t max_seq, shard_gpt **out);
/* The same for training: a forward with targets writes the loss's gradient
 * over the logits, so the model holds one [B*T, vocab] buffer instead of two
 * (for GPT-2 small at 8 x 1024 tokens, 1.6 GB less); shard_gpt_logits then
 * returns NULL until a forward without targets.  The same numbers. */
shard_status shard_gpt_create_training(const shard_gpt_config *c, size_t max_batch, size_t max_seq, shard_gpt **out);
void shard_gpt_destroy(shard_gpt *g);
shard_params *shard_gpt_params(shard_gpt *g);
const shard_gpt_config *shard_gpt_config_of(const shard_gpt *g);

/* GPT-2's initialisation: weights normal(0, initializer_range), the two
 * c_proj weights of each block scaled by 1/sqrt(2 n_layer), biases 0,
 * LayerNorm weights 1 (counter-based: see params.h). */
void shard_gpt_init(shard_gpt *g, uint64_t seed);

/* inputs[B,T] token ids; with targets (ignore index -100) *loss gets the
 * mean cross-entropy.  Logits [B*T, vocab] stay readable until the next call
 * (a model from shard_gpt_create_training: only after a forward without
 * targets).
 * Forwards with targets are numbered 1, 2, ...: with dropout on, each draws
 * new masks, a function of that number and shard_gpt_init's seed. */
shard_status shard_gpt_forward(shard_gpt *g, const int32_t *inputs, const int32_t *targets, size_t B, size_t T,
                               float *loss);
const float *shard_gpt_logits(const shard_gpt *g);
/* After a forward with targets: adds d(loss)/d(parameter) into grads
 * (NULL: through the gradient pointers bound on shard_gpt_model(g), which a
 * call with grads leaves as they were). */
shard_status shard_gpt_backward(shard_gpt *g, shard_params *grads);
/* The router losses and counts of the training forwards since the last forward with targets began
 * (shard_gpt_forward) or the stats table's reset (model.h): zeros for a dense GPT. */
void shard_gpt_router_stats(const shard_gpt *g, struct shard_model_router_stats *out);
/* The GPT behind the generic model table (model.h): units 0 = wte, wpe,
 * ln_f; 1 + l = block l.  Owned by g. */
struct shard_model *shard_gpt_model(shard_gpt *g);

#ifdef __cplusplus
}
#endif
#endif
