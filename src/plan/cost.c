/* cost.c — the closed-form costs of shard/cost.h.  The tensor-parallel bytes mirror the layers'
 * collectives one for one, and the data-parallel bytes the strategy's (src/parallel/data_parallel.c),
 * so a benchmark or a test can hold a measured count to them exactly. */
#include "shard/cost.h"

#include <string.h>

#include "shard/split.h"

double shard_cost_gpt_flops_per_token(const shard_gpt_config *c, size_t seq) {
    double N = (double)shard_gpt_param_count(c) - (double)c->n_positions * (double)c->n_embd;
    return 6.0 * N + 12.0 * (double)c->n_layer * (double)seq * (double)c->n_embd;
}

double shard_cost_gpt_stage_activation_bytes(const shard_gpt_config *c, int stages, int stage, size_t slots,
                                             size_t inputs, size_t rows, size_t seq) {
    double N = (double)(rows * seq), C = (double)c->n_embd, V = (double)c->vocab_size, H = (double)c->n_head;
    size_t first, blocks;
    shard_split_even(c->n_layer, (size_t)stages, (size_t)stage, &first, &blocks);
    double per_block = N * (16 * C + 4) + (double)rows * H * (double)(seq * seq);
    double per_slot = (double)blocks * per_block + N * C + (stage == stages - 1 ? N * C + 2 * N + N * V : 0);
    double shared = 11 * N * C;
    return 4 * ((double)slots * per_slot + shared + (stage > 0 ? (double)inputs * N * C : 0));
}

/* The length of part r of n over p (split.h's rule). */
static size_t part_of(size_t n, size_t p, size_t r) {
    size_t first, count;
    shard_split_even(n, p, r, &first, &count);
    return count;
}

uint64_t shard_cost_all_reduce_bytes(size_t count, size_t ranks, size_t rank, size_t elem_bytes) {
    size_t len = part_of(count, ranks, rank);
    return ranks > 1 ? ((uint64_t)(count - len) + (uint64_t)len * (ranks - 1)) * elem_bytes : 0;
}

/* Refuses what the strategy would: a ZeRO stage outside 0-3, no data ranks. */
static shard_status check_data(const char *what, size_t data, int zero) {
    if (zero < 0 || zero > 3)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: ZeRO stage %d: give 0, 1, 2 or 3", what, zero);
    if (data == 0) return shard_error(SHARD_ERR_INVALID_ARG, "%s: 0 data ranks: give at least 1", what);
    return SHARD_OK;
}

shard_status shard_cost_model_state_bytes(size_t params, size_t data, int zero, size_t param_elem_bytes,
                                          size_t grad_elem_bytes, size_t optimizer_elem_bytes,
                                          shard_cost_model_state *out) {
    memset(out, 0, sizeof *out);
    SHARD_CHECK(check_data("model state", data, zero));
    /* the whole and the share of each, the product taken before the division as the planner's screen
     * prices them (its figures, to the bit) */
    double n = (double)params, D = (double)data;
    double values = (double)param_elem_bytes * n, grads = (double)grad_elem_bytes * n;
    double states = (double)optimizer_elem_bytes * n;
    out->params_bytes = zero >= 3 ? values / D : values;
    out->grads_bytes = zero >= 2 ? grads / D : zero == 1 ? grads + grads / D : grads;
    out->optimizer_bytes = zero >= 1 ? states / D : states;
    out->comm_bytes = zero >= 1 ? grads / D : 0;
    return SHARD_OK;
}

shard_status shard_cost_data_step_bytes(size_t params, size_t data, size_t rank, int zero, size_t micro_steps,
                                        size_t grad_elem_bytes, size_t gather_elem_bytes, shard_cost_data_bytes *out) {
    memset(out, 0, sizeof *out);
    SHARD_CHECK(check_data("data-parallel bytes", data, zero));
    if (rank >= data)
        return shard_error(SHARD_ERR_INVALID_ARG, "data-parallel bytes: rank %zu of %zu data ranks: give 0 to %zu",
                           rank, data, data - 1);
    if (micro_steps == 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "data-parallel bytes: 0 micro-steps: give at least 1");
    if (zero == 0) {
        out->all_reduce_bytes = shard_cost_all_reduce_bytes(params, data, rank, grad_elem_bytes);
        return SHARD_OK;
    }
    uint64_t mine = part_of(params, data, rank), others = (uint64_t)params - mine;
    uint64_t scatters = zero == 1 ? 1 : (uint64_t)micro_steps, gathers = zero == 3 ? 2 * (uint64_t)micro_steps : 1;
    out->reduce_scatter_bytes = scatters * others * grad_elem_bytes;
    out->all_gather_bytes = gathers * mine * gather_elem_bytes * (uint64_t)(data - 1);
    out->norm_bytes = shard_cost_all_reduce_bytes(1, data, rank, sizeof(double));
    return SHARD_OK;
}

uint64_t shard_cost_gpt_tensor_bytes(const shard_gpt_config *c, size_t tokens, size_t ranks, size_t rank,
                                     int sequence_parallel) {
    size_t N = tokens, p = ranks, r = rank, C = c->n_embd, L = c->n_layer, pairs = 4 * L + 2;
    uint64_t fixed = shard_cost_all_reduce_bytes(N, p, r, 4) + shard_cost_all_reduce_bytes(2 * N, p, r, 8) +
        shard_cost_all_reduce_bytes(1, p, r, 8);
    if (!sequence_parallel) return fixed + pairs * shard_cost_all_reduce_bytes(N * C, p, r, 4);
    size_t mine = part_of(N, p, r);
    uint64_t gather = (uint64_t)mine * C * 4 * (p - 1), scatter = (uint64_t)(N - mine) * C * 4;
    return fixed + pairs * (gather + scatter) + (2 * L + 1) * shard_cost_all_reduce_bytes(2 * C, p, r, 4) +
        shard_cost_all_reduce_bytes(c->n_positions * C, p, r, 4);
}

/* The interleaved schedule's bubble is often written (p-1)/(v m), a fraction of the ideal time; here, like
 * the others, it is a fraction of the whole run. */
double shard_cost_pipe_bubble(shard_pipe_kind kind, int p, int m, int v) {
    if (kind != SHARD_PIPE_INTERLEAVED) v = 1;
    return (double)(p - 1) / ((double)v * m + p - 1);
}

double shard_cost_busbw_factor(const char *op, int n) {
    if (n <= 1) return strcmp(op, "sendrecv") == 0 ? 1.0 : 0.0;
    if (strcmp(op, "all_reduce") == 0) return 2.0 * (n - 1) / n;
    if (strcmp(op, "sendrecv") == 0) return 1.0;
    return (double)(n - 1) / n;
}
