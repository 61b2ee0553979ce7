/* plan_screen.c — see plan_screen.h: a GPT layout's per-rank figures from closed forms.
 *
 * Sizes: C = n_embd, L blocks, H heads, V vocabulary, P positions; a block holds 12 C^2 + 13 C
 * parameters, of which the four matrices and the column-parallel biases (12 C^2 + 7 C) split over
 * `tensor` and the rest (the row-parallel biases and the LayerNorms, 6 C) are replicated; the first
 * stage holds the token table (split over `tensor` by vocabulary) and the position table, the last the
 * final LayerNorm and, when it is not the first, the tied head's copy of the token table.
 * Model state in f32 (AdamW's two moments), by stage as cost.h counts it: ZeRO-1 keeps the moments'
 * 1/data share and a gradient shard beside the full gradients, ZeRO-2 the gradients' share and a bucket,
 * ZeRO-3 the values' share too, with two blocks gathered at a time.  Activations: cost.h's per-stage
 * bytes for the micro-batches a stage holds at its peak (1F1B and interleaved: min(m, p - stage); GPipe:
 * m), the block's tensor-split parts divided by `tensor` (the residual stream too under sequence
 * parallel); with recomputation only each block's input per micro-batch plus one block's whole.  FLOPs:
 * per token and block 24 C^2 + 4 S C forward over `tensor`, the head's 2 V C on the last stage, backward
 * twice forward, recomputation once more.  bf16 gradients halve the data axis's reduction and add the
 * bf16 copies reduced; the interleaved schedule sends each micro-batch once per chunk and has the
 * interleaved bubble. */
#include "plan_screen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parallel/pipeline_schedule.h"
#include "shard/cost.h"
#include "shard/mesh.h"
#include "shard/split.h"

enum { SCREEN_MAX_COLLECTIVES = 6, SCREEN_MAX_SPLIT = 1024 };

/* A collective of `calls` calls moving `bytes` in all (the rank's buffer sizes summed) over n ranks, its
 * bytes sent and alpha-beta terms as the emulated cluster counts them (ring algorithms). */
static void add_collective(shard_rank_analysis *r, const char *axis, const char *op, int n, double bytes,
                           double calls) {
    if (n < 2 || calls <= 0 || bytes <= 0) return;
    shard_analyze_collective *c = &r->collective[r->collectives++];
    memset(c, 0, sizeof *c);
    snprintf(c->axis, sizeof c->axis, "%s", axis);
    snprintf(c->op, sizeof c->op, "%s", op);
    double share = (double)(n - 1) / n;
    c->count = (uint64_t)calls;
    /* the calls are alike: the largest is one of them */
    if (strcmp(op, "all_reduce") == 0) {
        c->alphas = 2.0 * (n - 1) * calls, c->wire_bytes = 2 * share * bytes, c->bytes = (uint64_t)(2 * share * bytes);
    } else if (strcmp(op, "send") == 0) {
        c->alphas = calls, c->wire_bytes = bytes, c->bytes = (uint64_t)bytes;
    } else { /* reduce_scatterv, all_gatherv */
        c->alphas = (double)(n - 1) * calls, c->wire_bytes = share * bytes, c->bytes = (uint64_t)(share * bytes);
    }
    c->largest_alphas = c->alphas / calls, c->largest_wire_bytes = c->wire_bytes / calls;
}

/* Comma-separated counts into out[n]; 0 when the text has another count. */
static int parse_counts(const char *text, size_t n, size_t *out) {
    size_t k = 0;
    for (const char *p = text; p && *p && k <= n; k++) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) return 0;
        if (k < n) out[k] = (size_t)v;
        p = *end == ',' ? end + 1 : end;
        if (!*end) {
            k++;
            break;
        }
    }
    return k == n;
}

shard_status shard__plan_screen(const shard_gpt_config *g, const shard_trainer_config *tc, const char *mesh,
                                shard_analysis **out) {
    *out = NULL;
    char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES];
    int sizes[SHARD_MESH_MAX_AXES];
    int axes = shard_mesh_parse(mesh, 0, names, sizes);
    if (axes < 0) return SHARD_ERR_INVALID_ARG;
    int D = 1, T = 1, Pp = 1, dk = -1, tk = -1, pk = -1, world = 1;
    for (int k = 0; k < axes; k++) {
        world *= sizes[k];
        if (strcmp(names[k], "data") == 0)
            D = sizes[k], dk = k;
        else if (strcmp(names[k], "tensor") == 0)
            T = sizes[k], tk = k;
        else if (strcmp(names[k], "pipe") == 0)
            Pp = sizes[k], pk = k;
        else
            return shard_error(SHARD_ERR_INVALID_ARG, "plan screen: mesh %s: only data, tensor and pipe are screened",
                               mesh);
    }
    /* the trainer's refusals the screen can see (a dry run finds the rest) */
    if (D > SCREEN_MAX_SPLIT || Pp > SCREEN_MAX_SPLIT || (size_t)Pp > g->n_layer)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan screen: mesh %s: more stages than blocks", mesh);
    if (g->n_head % (size_t)T || g->vocab_size < (size_t)T)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan screen: mesh %s: %zu heads do not split over tensor=%d", mesh,
                           g->n_head, T);
    size_t steps = Pp > 1 ? (tc->micro_batches ? tc->micro_batches : (size_t)Pp) : 1;
    if (!tc->batch_shares && tc->batch < (size_t)D * steps)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan screen: batch %zu gives %d data ranks under %zu rows each",
                           tc->batch, D, steps);
    if (tc->sequence_parallel && tc->seq % (size_t)T)
        return shard_error(SHARD_ERR_INVALID_ARG, "plan screen: seq %zu does not split over tensor=%d", tc->seq, T);
    size_t *rows = calloc((size_t)D, sizeof *rows), *blocks = calloc((size_t)Pp + 1, sizeof *blocks);
    shard_analysis *a = calloc(1, sizeof *a);
    if (a) a->rank = calloc((size_t)world, sizeof *a->rank);
    if (!rows || !blocks || !a || !a->rank) {
        free(rows), free(blocks);
        if (a) free(a->rank);
        free(a);
        return shard_error(SHARD_ERR_NO_MEMORY, "plan screen: out of memory for %d ranks", world);
    }
    a->world = world, a->ranks = (size_t)world, a->axes = axes;
    memcpy(a->axis_name, names, sizeof names);
    memcpy(a->axis_size, sizes, sizeof sizes);
    snprintf(a->mesh, sizeof a->mesh, "%s", mesh);
    snprintf(a->layout, sizeof a->layout, "%s zero=%d (screened)", mesh, tc->zero);
    a->zero = tc->zero;
    snprintf(a->optimizer, sizeof a->optimizer, "%s", tc->optimizer ? tc->optimizer : "adamw");
    a->tokens = (uint64_t)(tc->batch * tc->seq);
    shard_status s = SHARD_OK;
    /* rows per data rank, micro-steps, blocks per stage */
    size_t K = Pp > 1 ? (tc->micro_batches ? tc->micro_batches : (size_t)Pp) : (tc->accum ? tc->accum : 1);
    if (tc->batch_shares) {
        if (!parse_counts(tc->batch_shares, (size_t)D, rows))
            s = shard_error(SHARD_ERR_INVALID_ARG, "plan screen: batch shares %s for %d data ranks", tc->batch_shares,
                            D);
    } else {
        for (int i = 0; i < D; i++) {
            size_t first;
            shard_split_even(tc->batch, (size_t)D, (size_t)i, &first, &rows[i]);
        }
    }
    if (s == SHARD_OK) s = shard__pipe_partition(g->n_layer, Pp, tc->layers_per_stage, blocks);
    const int gpipe = tc->schedule && strcmp(tc->schedule, "gpipe") == 0;
    const int chunks =
        tc->schedule && strcmp(tc->schedule, "interleaved") == 0 && tc->virtual_stages > 1 ? tc->virtual_stages : 1;
    const double grad_scale = tc->grad_dtype == SHARD_BF16 ? 0.5 : 1; /* bf16 gradients halve the reduction */
    double C = (double)g->n_embd, V = (double)g->vocab_size, S = (double)tc->seq, H = (double)g->n_head;
    double block_split = 12 * C * C + 7 * C, block_whole = 6 * C;
    /* of a block's activation bytes per token (16 C + 4, and H S for the probabilities), what `tensor`
     * splits: q k v, the attention output, the MLP's two 4C, the probabilities; the residual stream and
     * LayerNorm outputs (4 C) only under sequence parallel */
    double act_whole = 4 * C + 4, act_split = 12 * C + H * S;
    double act_scale = ((tc->sequence_parallel ? act_whole / T : act_whole) + act_split / T) / (act_whole + act_split);
    for (int r = 0; r < world && s == SHARD_OK; r++) {
        shard_rank_analysis *x = &a->rank[r];
        x->rank = r;
        size_t used = 0;
        for (int k = axes - 1, rest = r; k >= 0; k--) x->coord[k] = rest % sizes[k], rest /= sizes[k];
        for (int k = 0; k < axes; k++)
            used += (size_t)snprintf(x->coords + used, sizeof x->coords - used, "%s%s=%d", k ? "," : "", names[k],
                                     x->coord[k]);
        int di = dk >= 0 ? x->coord[dk] : 0, stage = pk >= 0 ? x->coord[pk] : 0;
        (void)tk;
        double n_blocks = (double)(blocks[stage + 1] - blocks[stage]);
        double params = n_blocks * (block_split / T + block_whole);
        if (stage == 0) params += V * C / T + (double)g->n_positions * C;
        if (stage == Pp - 1) params += 2 * C + (Pp > 1 ? V * C / T : 0);
        x->params = (uint64_t)params;
        /* model state: cost.h's by stage (SGD priced at 2 bytes a parameter), and the buffers a step
         * holds: ZeRO-3's two gathered blocks, ZeRO-2/3's gradient bucket */
        double pb = 4 * params;
        shard_cost_model_state state;
        s = shard_cost_model_state_bytes((size_t)params, (size_t)D, tc->zero, 4, 4,
                                         strcmp(a->optimizer, "sgd") == 0 ? 2 : 8, &state);
        if (s < 0) break;
        double values = state.params_bytes + (tc->zero >= 3 ? 2 * 4 * (block_split / T + block_whole) : 0);
        double grads = state.grads_bytes + (tc->zero >= 2 ? fmin(pb, tc->bucket_mb * 1048576.0) : 0);
        double moments = state.optimizer_bytes;
        double comm = D > 1 ? fmin(pb, (tc->bucket_mb > 0 ? tc->bucket_mb : 25) * 1048576.0) : 0;
        if (D > 1 && grad_scale < 1) comm += tc->zero >= 2 ? pb / 4 : pb / 2; /* the bf16 copies reduced */
        /* activations */
        size_t row_count = rows[di], micro_rows = (row_count + K - 1) / K;
        size_t slots = Pp > 1 ? (gpipe ? K : (K < (size_t)(Pp - stage) ? K : (size_t)(Pp - stage))) : 1;
        /* cost.h cuts the blocks evenly: this stage's blocks priced as the one stage of a model of as many
         * blocks (the last, with the head and logits), or as the first of two stages of a model of twice
         * as many (any other, without them) */
        size_t mine = blocks[stage + 1] - blocks[stage];
        shard_gpt_config cut = *g;
        int last = stage == Pp - 1;
        cut.n_layer = last ? mine : 2 * mine;
        double acts = 0;
        if (mine > 0) {
            double whole = shard_cost_gpt_stage_activation_bytes(&cut, last ? 1 : 2, 0, slots, 0, micro_rows, tc->seq);
            if (tc->recompute && mine > 1) { /* each block's input kept, one block's whole */
                double one = whole / (double)mine;
                whole = one + (double)slots * (double)(mine - 1) * (double)micro_rows * S * C * 4;
            }
            acts = whole * act_scale + (stage > 0 ? (double)slots * (double)micro_rows * S * C * 4 : 0);
        }
        x->memory_bytes[SHARD_MEM_PARAMS] = (uint64_t)values;
        x->memory_bytes[SHARD_MEM_GRADS] = (uint64_t)grads;
        x->memory_bytes[SHARD_MEM_OPTIMIZER] = (uint64_t)moments;
        x->memory_bytes[SHARD_MEM_ACTIVATIONS] = (uint64_t)acts;
        x->memory_bytes[SHARD_MEM_COMM] = (uint64_t)comm;
        x->memory_total_bytes = (uint64_t)(values + grads + moments + acts + comm);
        /* FLOPs over the rank's tokens of the step */
        double tokens = (double)row_count * S;
        double fwd = tokens * (n_blocks * (24 * C * C + 4 * S * C) / T + (stage == Pp - 1 ? 2 * V * C / T : 0));
        x->flops_forward = fwd, x->flops_backward = 2 * fwd, x->flops_recompute = tc->recompute ? fwd : 0;
        x->backward_ops = (int)K, x->pipelined = Pp > 1;
        /* collectives */
        x->collective = calloc(SCREEN_MAX_COLLECTIVES, sizeof *x->collective);
        x->gemm_shape = calloc(1, sizeof *x->gemm_shape);
        if (!x->collective || !x->gemm_shape) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "plan screen: out of memory");
            break;
        }
        double buckets = ceil(pb / ((tc->bucket_mb > 0 ? tc->bucket_mb : 25) * 1048576.0));
        if (tc->zero == 0) {
            add_collective(x, "data", "all_reduce", D, pb * grad_scale, buckets);
        } else {
            add_collective(x, "data", "reduce_scatterv", D, pb * grad_scale, buckets);
            add_collective(x, "data", "all_gatherv", D, pb * (tc->zero >= 3 ? 2 : 1), buckets);
        }
        double micro_bytes = (double)micro_rows * S * C * 4;
        double pairs = (double)K * (4 * n_blocks + 2 + (tc->recompute ? 2 * n_blocks : 0));
        add_collective(x, "tensor", tc->sequence_parallel ? "all_gatherv" : "all_reduce", T,
                       micro_bytes * pairs / (tc->sequence_parallel ? 2 : 1), pairs / (tc->sequence_parallel ? 2 : 1));
        if (tc->sequence_parallel)
            add_collective(x, "tensor", "reduce_scatterv", T, micro_bytes * pairs / 2, pairs / 2);
        double hops = (stage > 0) + (stage < Pp - 1);
        /* interleaved: each micro-batch crosses every stage once per chunk */
        add_collective(x, "pipe", "send", Pp,
                       hops * (double)(K * (size_t)chunks) * micro_bytes / (tc->sequence_parallel ? T : 1),
                       hops * (double)(K * (size_t)chunks));
    }
    if (s == SHARD_OK) {
        shard_pipe_kind kind = chunks > 1 ? SHARD_PIPE_INTERLEAVED : gpipe ? SHARD_PIPE_GPIPE : SHARD_PIPE_1F1B;
        a->bubble = Pp > 1 ? shard_cost_pipe_bubble(kind, Pp, (int)K, chunks) : 0;
        double most = -1;
        for (int r = 0; r < world; r++) {
            double f = a->rank[r].flops_forward + a->rank[r].flops_backward + a->rank[r].flops_recompute;
            if (f > most) most = f, a->critical_rank = r;
        }
        snprintf(a->critical_phase, sizeof a->critical_phase, "backward");
    }
    free(rows), free(blocks);
    if (s < 0) {
        shard_analysis_destroy(a);
        return s;
    }
    *out = a;
    return SHARD_OK;
}
