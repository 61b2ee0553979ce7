/* cost.h — closed-form costs of the engine's work, the figures the benchmarks
 * set their measurements against: a GPT step's FLOPs, the activation bytes a
 * pipeline stage holds, the bytes tensor parallelism sends, the pipeline's
 * bubble, and the factor that turns a collective's algorithm bandwidth into
 * bus bandwidth.  Each counts exactly what the engine does where a benchmark
 * checks it for equality (bytes sent), and the textbook figure otherwise. */
#ifndef SHARD_COST_H
#define SHARD_COST_H

#include <stddef.h>
#include <stdint.h>

#include "shard/gpt.h"
#include "shard/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FLOPs of one training step (forward and backward) per token of a GPT at sequence length seq:
 * 6 N + 12 L T C, N the parameters less the position table (a lookup, no products); the attention term
 * counts the whole T x T scores, as is usual, though the engine skips the masked half. */
double shard_cost_gpt_flops_per_token(const shard_gpt_config *c, size_t seq);

/* Activation bytes (f32, no tensor axis) of pipeline stage `stage` of `stages` (the GPT's blocks cut
 * evenly, the remainder on the first stages) holding `slots` micro-batches of rows x seq tokens and
 * `inputs` received stage inputs: per block and micro-batch the residual stream in and mid, both
 * LayerNorm outputs, q k v, the attention output, the MLP's two 4C activations, the LayerNorm
 * statistics and the attention probabilities; per micro-batch the stage output and, on the last stage,
 * ln_f and the logits (the loss's gradient is written over them); once, backward's scratch (11 N C). */
double shard_cost_gpt_stage_activation_bytes(const shard_gpt_config *c, int stages, int stage, size_t slots,
                                             size_t inputs, size_t rows, size_t seq);

/* Bytes rank `rank` of `ranks` sends in an all_reduce of count elements of elem_bytes each, by the
 * communicator's bandwidth-optimal algorithm (shard_comm_bytes_sent counts the same). */
uint64_t shard_cost_all_reduce_bytes(size_t count, size_t ranks, size_t rank, size_t elem_bytes);

/* Bytes tensor rank `rank` of `ranks` sends in one GPT training step over `tokens` tokens (Megatron's
 * split): per block two tensor-parallel pairs in forward and two in backward, plus the embedding, the
 * final LayerNorm / head, the vocabulary-parallel cross-entropy's row maximum (f32) and per-row sums
 * (2 f64), and the gradient norm (f64).  Without sequence parallel a pair costs one all_reduce of
 * tokens x C; with it, an all_gather of this rank's tokens plus a reduce_scatter of the others', and the
 * LayerNorm weight / bias gradients (2C) and the position table are summed over tensor ranks. */
uint64_t shard_cost_gpt_tensor_bytes(const shard_gpt_config *c, size_t tokens, size_t ranks, size_t rank,
                                     int sequence_parallel);

/* The textbook pipeline bubble as a fraction of the whole run: (p-1)/(m+p-1) for GPipe and 1F1B,
 * (p-1)/(v*m + p-1) interleaved (v model chunks per rank). */
double shard_cost_pipe_bubble(shard_pipe_kind kind, int p, int m, int v);

/* busbw / algbw of collective `op` over n ranks (the convention of NCCL's tests): all_reduce
 * 2(n-1)/n, all_gather, reduce_scatter and all_to_all (n-1)/n, sendrecv 1; 0 for a collective on one
 * rank (nothing crosses a link). */
double shard_cost_busbw_factor(const char *op, int n);

#ifdef __cplusplus
}
#endif

#endif
