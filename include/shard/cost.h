/* cost.h — closed-form costs of the engine's work, the figures the benchmarks
 * and the planner's screen set their measurements against: a GPT step's FLOPs,
 * the activation bytes a pipeline stage holds, a rank's model state by ZeRO
 * stage, the bytes data and tensor parallelism send, the pipeline's bubble,
 * and the factor that turns a collective's algorithm bandwidth into bus
 * bandwidth.  Each counts exactly what the engine does where a benchmark or a
 * test checks it for equality (bytes sent), and the textbook figure otherwise;
 * tests/test_cost.c holds each against hand counts and the dry run
 * (shard/analyze.h). */
#ifndef SHARD_COST_H
#define SHARD_COST_H

#include <stddef.h>
#include <stdint.h>

#include "shard/gpt.h"
#include "shard/status.h"
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

/* A rank's model state by category, in bytes, as the data-parallel strategy holds it between steps. */
typedef struct shard_cost_model_state {
    double params_bytes;    /* the values: whole, or (ZeRO-3) this rank's share */
    double grads_bytes;     /* the gradients: whole (ZeRO-0), whole and the reduced share (ZeRO-1), the share (2, 3) */
    double optimizer_bytes; /* the optimizer's state: whole (ZeRO-0), or the share */
    double comm_bytes;      /* ZeRO >= 1: the share the reduce-scatter writes (in gradient elements) */
} shard_cost_model_state;

/* The model state of one of `data` ranks holding `params` parameter elements at ZeRO stage `zero`
 * (0-3): values of param_elem_bytes, gradients of grad_elem_bytes (the slabs, whatever dtype they
 * travel in), optimizer_elem_bytes of state per parameter (AdamW 8: two f32 moments; SGD 4 with
 * momentum, 0 without).  A share is params / data on average.  The engine differs from it by:
 *   - its shares: it splits each unit evenly (split.h), so a rank's share is within one element per
 *     unit of the average (equal where every unit divides over the ranks);
 *   - one byte more per array it allocates (the strategy's shard arrays, each optimizer state array);
 *   - the buffers a step holds for a while, which the caller adds: ZeRO-2/3 keep whole gradients of
 *     the units backward is filling and reducing (the GPT's: its first unit, the tied embedding, from
 *     the head to the end of backward, and two others), ZeRO-3 the whole values of the units it has
 *     gathered (the one computing and the one prefetched), a bf16 compute copy;
 *   - the dry run's peak, which also counts the whole values a ZeRO-3 build makes before sharding them.
 * Fails on a stage outside 0-3 or no data ranks. */
shard_status shard_cost_model_state_bytes(size_t params, size_t data, int zero, size_t param_elem_bytes,
                                          size_t grad_elem_bytes, size_t optimizer_elem_bytes,
                                          shard_cost_model_state *out);

/* Bytes a rank sends over the data axis in one training step, by the collectives the strategy makes. */
typedef struct shard_cost_data_bytes {
    uint64_t all_reduce_bytes;     /* ZeRO-0: the gradients, all-reduced in buckets on the last micro-step */
    uint64_t reduce_scatter_bytes; /* ZeRO >= 1: the gradients reduce-scattered, unit by unit: on the last
                                    * micro-step (ZeRO-1), on every micro-step (ZeRO-2/3) */
    uint64_t all_gather_bytes;     /* ZeRO-1/2: the updated values made whole once; ZeRO-3: the values
                                    * gathered for each micro-step's forward and again for its backward */
    uint64_t norm_bytes;           /* ZeRO >= 1: the gradient norm's sum of squares over the shards (one f64) */
} shard_cost_data_bytes;

/* The data-parallel traffic of rank `rank` of `data` ranks in a step of `micro_steps` micro-steps over
 * `params` parameter elements at ZeRO stage `zero`: gradients of grad_elem_bytes on the wire (4 f32,
 * 2 bf16), gathered values of gather_elem_bytes (ZeRO-1/2 gather the f32 masters: 4; ZeRO-3 the
 * compute copies: 4, or 2 under bf16 compute).  The bandwidth-optimal counts of shard_comm_bytes_sent,
 * this rank's share split.h's part of the whole: exact where the units and buckets divide evenly over
 * the ranks, and ZeRO-0's always on 2 ranks (a rank sends each bucket once); else within one element
 * per unit (per bucket, times data - 2, for ZeRO-0).  ZeRO-3's engine may gather a unit more often than
 * twice a micro-step (the GPT's tied embedding, which the head acquires apart from the embedding, once
 * more a step): the dry run counts what it gathers, this the two passes.  Other traffic on the axis
 * (the trainer's loss and token sums) is not the strategy's.  Fails on a stage outside 0-3, no data
 * ranks, a rank outside them or no micro-steps. */
shard_status shard_cost_data_step_bytes(size_t params, size_t data, size_t rank, int zero, size_t micro_steps,
                                        size_t grad_elem_bytes, size_t gather_elem_bytes, shard_cost_data_bytes *out);

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
