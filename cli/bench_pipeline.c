/* bench_pipeline.c — `shard bench pipeline`: pipeline parallelism on P thread
 * ranks (mesh pipe=P), in one run:
 *
 *   1. bubble: equal-cost stages (a GPT of the config's width with a 256-token
 *      vocabulary, so the embedding and head cost next to nothing, and 4P
 *      blocks: P stages of 4, or 2P chunks of 2 for interleaved), each
 *      schedule at m = 4, 8, 16 micro-batches of one row: the measured bubble
 *      (1 - the ranks' compute time / (ranks x the step's window from the
 *      first rank's start to the last rank's end), median over steps) against (p-1)/(m+p-1) and (p-1)/(v m + p-1); then the same
 *      schedules replayed for p = 4 and 8 on the equal-cost timeline with the
 *      F and B times measured here (this machine has 2 cores: more ranks than
 *      cores would time the contention, not the schedule);
 *   2. activations: bytes each stage holds for activations (the accounted
 *      allocator: the model's buffers and the stage inputs received) with
 *      GPipe, 1F1B and 1F1B + recompute at m = 8 on the config's GPT, against
 *      a closed-form count (shard_cost_gpt_stage_activation_bytes, shard/cost.h), and the micro-batches the
 *      executor held at once against m and min(p - i, m);
 *   3. ms/step of the config's GPT on pipe=P (1F1B, m = 8) against one rank
 *      (the same global batch), both with one BLAS thread per rank.
 *
 *   shard bench pipeline --config CONFIG.json [--ranks 2] [--batch 8] [--seq 128] [--steps 10] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_train.h"
#include "cli_util.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/cost.h"
#include "shard/schedule.h"
#include "shard/shard.h"

enum { MS = 3 }; /* micro-batch counts of the bubble table */
static const int micro_counts[MS] = {4, 8, 16};
static const char *const kinds[3] = {"gpipe", "1f1b", "interleaved"};

typedef struct bubble_row {
    double measured, f_ms, b_ms; /* rank means */
} bubble_row;

typedef struct act_row {
    uint64_t bytes[16]; /* per stage: activation bytes allocated */
    uint64_t held[16];  /* per stage: micro-batches held at once */
    uint64_t slots[16];
} act_row;

typedef struct pp_args {
    const char *config;
    char dir[256], bubble_dir[256], bubble_config[300];
    long batch, seq, steps;
    int P;
    bubble_row bubble[3][MS];
    act_row act[3];               /* gpipe, 1f1b, 1f1b + recompute at m = 8 */
    uint64_t one_micro_bytes[16]; /* per stage: one slot's activation bytes (from the 1-slot recompute run) */
    double ms_pipe, ms_one;
} pp_args;

/* Steps of a trainer on `mesh_text`; fills the medians / figures asked for (any may be NULL). */
static shard_status run(shard_comm *comm, const char *config, const char *dir, const char *mesh_text,
                        const char *schedule, int v, size_t m, int recompute, size_t batch, size_t seq, long steps,
                        double *ms, double *bubble, double *f_ms, double *b_ms, uint64_t *act_bytes, uint64_t *held,
                        uint64_t *slots) {
    shard_trainer_config c = {.config_path = config,
                              .data_dir = dir,
                              .batch = batch,
                              .seq = seq,
                              .seed = 1,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f,
                              .schedule = schedule,
                              .micro_batches = m,
                              .virtual_stages = v,
                              .recompute = recompute};
    c.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, (uint64_t)steps + 2};
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    double *step_ms = calloc((size_t)steps, sizeof *step_ms), *bub = calloc((size_t)steps, sizeof *bub);
    double f_sum = 0, b_sum = 0, f_n = 0, b_n = 0;
    shard_mem_stats before, after;
    shard_status s = step_ms && bub ? shard_mesh_create(comm, mesh_text, &mesh) : SHARD_ERR_NO_MEMORY;
    shard_mem_stats_get(&before);
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &tr);
    for (long i = 0; s == SHARD_OK && i < steps + 2; i++) {
        shard_step_result r;
        s = shard_comm_barrier(comm);
        if (s == SHARD_OK) s = shard_trainer_step(tr, (uint64_t)i + 1, &r);
        if (s != SHARD_OK || i < 2) continue;
        step_ms[i - 2] = r.ms;
        shard_pipeline_stats ps;
        if (!schedule || shard_trainer_pipeline_stats(tr, &ps) != SHARD_OK) continue;
        /* idle share of the ranks' time over the step's window: first start to last end on any rank */
        double compute = ps.compute_s, all = 0, start = ps.begin_s, end = ps.begin_s + ps.wall_s, first = 0, last = 0;
        s = shard_comm_all_reduce(comm, &compute, &all, 1, SHARD_F64, SHARD_OP_SUM);
        if (s == SHARD_OK) s = shard_comm_all_reduce(comm, &start, &first, 1, SHARD_F64, SHARD_OP_MIN);
        if (s == SHARD_OK) s = shard_comm_all_reduce(comm, &end, &last, 1, SHARD_F64, SHARD_OP_MAX);
        bub[i - 2] = 1.0 - all / (shard_comm_size(comm) * (last - first));
        for (size_t k = 0; k < ps.spans; k++) {
            double d = (ps.span[k].t1 - ps.span[k].t0) * 1e3;
            if (ps.span[k].what == 'F') f_sum += d, f_n++;
            if (ps.span[k].what == 'B') b_sum += d, b_n++;
        }
        if (held) *held = ps.held_peak;
        if (slots) *slots = ps.slots;
    }
    shard_mem_stats_get(&after); /* the stage inputs' buffers are made by the first step */
    if (s == SHARD_OK) {
        if (ms) *ms = cli_median(step_ms, (int)steps);
        if (bubble) *bubble = cli_median(bub, (int)steps);
        if (f_ms) *f_ms = f_n ? f_sum / f_n : 0;
        if (b_ms) *b_ms = b_n ? b_sum / b_n : 0;
        if (act_bytes)
            *act_bytes = after.current_bytes[SHARD_MEM_ACTIVATIONS] - before.current_bytes[SHARD_MEM_ACTIVATIONS];
    }
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
    free(step_ms), free(bub);
    return s;
}

/* Per-stage figures to rank 0: out[r] = value of pipe rank r. */
static shard_status to_all(shard_comm *comm, uint64_t mine, uint64_t *out) {
    return shard_comm_all_gather(comm, &mine, out, 1, SHARD_I64); /* sizes well below 2^63 */
}

static shard_status pp_rank(shard_comm *world, void *arg) {
    pp_args *a = arg;
    int rank = shard_comm_rank(world), P = shard_comm_size(world);
    SHARD_CHECK(shard_share_cores(world));
    char mesh[32];
    snprintf(mesh, sizeof mesh, "pipe=%d", P);
    /* 1. bubble on equal-cost stages: one-row micro-batches */
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < MS; i++) {
            int m = micro_counts[i], v = k == 2 ? 2 : 1;
            if (k == 2 && m % P) continue;
            bubble_row *b = &a->bubble[k][i];
            double bub = 0, f = 0, bb = 0, fs = 0, bs = 0;
            SHARD_CHECK(run(world, a->bubble_config, a->bubble_dir, mesh, kinds[k], v, (size_t)m, 0, (size_t)m,
                            (size_t)a->seq, a->steps, NULL, &bub, &f, &bb, NULL, NULL, NULL));
            SHARD_CHECK(shard_comm_all_reduce(world, &f, &fs, 1, SHARD_F64, SHARD_OP_SUM));
            SHARD_CHECK(shard_comm_all_reduce(world, &bb, &bs, 1, SHARD_F64, SHARD_OP_SUM));
            if (rank == 0) *b = (bubble_row){bub, fs / P, bs / P};
        }
    /* 2. activation bytes per stage at m = 8 */
    static const char *const act_kind[3] = {"gpipe", "1f1b", "1f1b"};
    for (int k = 0; k < 3; k++) {
        uint64_t bytes = 0, held = 0, slots = 0;
        SHARD_CHECK(run(world, a->config, a->dir, mesh, act_kind[k], 1, 8, k == 2, (size_t)a->batch, (size_t)a->seq, 3,
                        NULL, NULL, NULL, NULL, &bytes, &held, &slots));
        SHARD_CHECK(to_all(world, bytes, a->act[k].bytes));
        SHARD_CHECK(to_all(world, held, a->act[k].held));
        SHARD_CHECK(to_all(world, slots, a->act[k].slots));
    }
    /* 3. ms/step: pipe=P against one rank, the same global batch */
    SHARD_CHECK(run(world, a->config, a->dir, mesh, "1f1b", 1, 8, 0, (size_t)a->batch, (size_t)a->seq, a->steps,
                    &a->ms_pipe, NULL, NULL, NULL, NULL, NULL, NULL));
    shard_comm *self = NULL;
    SHARD_CHECK(shard_comm_split(world, rank == 0 ? 0 : -1, 0, &self));
    shard_status s = SHARD_OK;
    if (self)
        s = run(self, a->config, a->dir, "data=1", NULL, 1, 0, 0, (size_t)a->batch, (size_t)a->seq, a->steps,
                &a->ms_one, NULL, NULL, NULL, NULL, NULL, NULL);
    shard_comm_destroy(self);
    SHARD_CHECK(s);
    return shard_comm_barrier(world);
}

/* The bubble of `kind` for p ranks and m micro-batches on the equal-cost timeline with F and B costs in
 * the measured ratio (tenths of a millisecond). */
static double replayed(int kind, int p, int m, double f_ms, double b_ms) {
    shard_pipe_schedule *s = NULL;
    int v = kind == 2 ? 2 : 1;
    if (kind == 2 && m % p) return -1;
    if (shard_pipe_schedule_create((shard_pipe_kind)kind, p, m, v, &s) != SHARD_OK) return -1;
    int f = (int)(f_ms * 10 + 0.5), b = (int)(b_ms * 10 + 0.5);
    double bubble = shard_pipe_schedule_bubble(s, f < 1 ? 1 : f, b < 1 ? 1 : b);
    shard_pipe_schedule_destroy(s);
    return bubble;
}

/* A GPT with the config's width and heads, 2 blocks per rank, 256 tokens: stages of equal cost. */
static shard_status bubble_model(pp_args *a, const shard_gpt_config *gc) {
    snprintf(a->bubble_config, sizeof a->bubble_config, "%s/bubble-gpt.json", a->dir);
    char text[256];
    int n = snprintf(text, sizeof text,
                     "{\"n_embd\": %zu, \"n_layer\": %d, \"n_head\": %zu, \"n_positions\": %ld, \"vocab_size\": 256}\n",
                     gc->n_embd, 4 * a->P, gc->n_head, a->seq);
    SHARD_CHECK(shard_atomic_write_file(a->bubble_config, text, (size_t)n)); /* every write checked */
    shard_gpt_config bc;
    return bench_random_tokens(a->bubble_config, &bc, a->bubble_dir, sizeof a->bubble_dir);
}

static void print_report(const pp_args *a, const shard_gpt_config *gc, int json) {
    int P = a->P;
    size_t rows =
        ((size_t)a->batch + 7) / 8; /* the largest micro-batch's rows (8 micro-batches; the model's buffers) */
    double predicted[3][16];
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < P; r++) {
            size_t held = k == 0 ? 8 : (P - r < 8 ? (size_t)(P - r) : 8), inputs = held + 1 > 8 ? 8 : held + 1;
            predicted[k][r] =
                shard_cost_gpt_stage_activation_bytes(gc, P, r, k == 2 ? 1 : held, inputs, rows, (size_t)a->seq);
        }
    if (json) {
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < MS; i++) {
                int m = micro_counts[i], v = k == 2 ? 2 : 1;
                if (k == 2 && m % P) continue;
                const bubble_row *b = &a->bubble[k][i];
                printf("{\"table\": \"bubble\", \"schedule\": \"%s\", \"pipe\": %d, \"micro_batches\": %d, "
                       "\"virtual_stages\": %d, "
                       "\"bubble_measured\": %.4f, \"bubble_formula\": %.4f, \"f_ms\": %.3f, \"b_ms\": %.3f, "
                       "\"bubble_replayed_p4\": %.4f, \"bubble_formula_p4\": %.4f}\n",
                       kinds[k], P, m, v, b->measured, shard_cost_pipe_bubble((shard_pipe_kind)k, P, m, v), b->f_ms,
                       b->b_ms, replayed(k, 4, m, b->f_ms, b->b_ms),
                       shard_cost_pipe_bubble((shard_pipe_kind)k, 4, m, v));
            }
        for (int k = 0; k < 3; k++)
            for (int r = 0; r < P; r++)
                printf("{\"table\": \"activations\", \"schedule\": \"%s\", \"recompute\": %d, \"stage\": %d, "
                       "\"micro_batches\": 8, "
                       "\"held_measured\": %llu, \"held_formula\": %d, \"activation_bytes\": %llu, "
                       "\"activation_bytes_predicted\": "
                       "%.0f}\n",
                       k == 0 ? "gpipe" : "1f1b", k == 2, r, (unsigned long long)a->act[k].held[r],
                       k == 0 ? 8 : (P - r < 8 ? P - r : 8), (unsigned long long)a->act[k].bytes[r], predicted[k][r]);
        char cfg_json[4200];
        printf("{\"table\": \"speed\", \"config\": %s, \"pipe\": %d, \"batch\": %ld, \"seq\": %ld, "
               "\"ms_per_step_pipe\": %.3f, "
               "\"ms_per_step_one_rank\": %.3f}\n",
               cli_json_string(a->config, cfg_json, sizeof cfg_json), P, a->batch, a->seq, a->ms_pipe, a->ms_one);
        return;
    }
    printf("# shard bench pipeline: pipe=%d thread ranks, one BLAS thread each; medians of %ld steps\n", P, a->steps);
    printf("## bubble, equal-cost stages (GPT %zu wide, %d blocks, vocab 256, micro-batches of 1 x %ld tokens)\n",
           gc->n_embd, 4 * P, a->seq);
    printf("%-12s %3s %9s %9s %7s %7s   %s\n", "schedule", "m", "measured", "formula", "F ms", "B ms",
           "p=4 replayed / formula, p=8 replayed / formula");
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < MS; i++) {
            int m = micro_counts[i], v = k == 2 ? 2 : 1;
            if (k == 2 && m % P) continue;
            const bubble_row *b = &a->bubble[k][i];
            char wide[2][48];
            for (int w = 0; w < 2; w++) {
                int p = w ? 8 : 4;
                double r = replayed(k, p, m, b->f_ms, b->b_ms);
                if (r < 0)
                    snprintf(wide[w], sizeof wide[w], "  (m %% %d != 0)", p);
                else
                    snprintf(wide[w], sizeof wide[w], "%5.1f%% / %5.1f%%", 100 * r,
                             100 * shard_cost_pipe_bubble((shard_pipe_kind)k, p, m, v));
            }
            printf("%-12s %3d %8.1f%% %8.1f%% %7.2f %7.2f   %s, %s\n", k == 2 ? "interleaved2" : kinds[k], m,
                   100 * b->measured, 100 * shard_cost_pipe_bubble((shard_pipe_kind)k, P, m, v), b->f_ms, b->b_ms,
                   wide[0], wide[1]);
        }
    printf("## activations per stage, %s, batch %ld x %ld in 8 micro-batches\n", a->config, a->batch, a->seq);
    printf("%-16s %5s %14s %14s %14s %12s\n", "schedule", "stage", "held (formula)", "MiB measured", "MiB predicted",
           "act. slots");
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < P; r++)
            printf("%-16s %5d %6llu (%4d) %14.2f %14.2f %12llu\n",
                   k == 0       ? "gpipe"
                       : k == 1 ? "1f1b"
                                : "1f1b recompute",
                   r, (unsigned long long)a->act[k].held[r], k == 0 ? 8 : (P - r < 8 ? P - r : 8),
                   (double)a->act[k].bytes[r] / 1048576.0, predicted[k][r] / 1048576.0,
                   (unsigned long long)a->act[k].slots[r]);
    printf("## speed, %s, batch %ld x %ld\n", a->config, a->batch, a->seq);
    printf("pipe=%d (1f1b, 8 micro-batches) %8.1f ms/step   one rank %8.1f ms/step   ratio %.2f\n", P, a->ms_pipe,
           a->ms_one, a->ms_one / a->ms_pipe);
}

static const char *const USAGE =
    "usage: shard bench pipeline --config CONFIG.json [options]\n"
    "\n"
    "The GPT pipelined over P ranks (mesh pipe=P), in one run: each schedule's measured bubble against its\n"
    "formula (GPipe, 1F1B and interleaved at 4, 8 and 16 micro-batches), the activation bytes each stage\n"
    "holds (GPipe, 1F1B, 1F1B with recompute) against their count, and ms/step against one rank.\n"
    "\n"
    "options:\n"
    "  --batch B                rows per step (global), 8..4096 (default 8)\n" BENCH_MODEL_OPTIONS_USAGE
    "  --ranks P                the pipe stages, 2..16 (default 2; under mpirun the launcher's)\n";

int cli_bench_pipeline(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 1);
    pp_args a = {0};
    bench_model_opts mo = {.batch = 8, .seq = 128, .steps = 10, .batch_min = 8};
    int rc = bench_model_options(argc, argv, "bench pipeline", &mo);
    if (rc) return rc;
    a.config = mo.config, a.batch = mo.batch, a.seq = mo.seq, a.steps = mo.steps;
    int json = mo.json;
    cli_common common = mo.common;
    char env[64];
    int mr, ms;
    a.P = shard_launch_detect_mpi(env, sizeof env, &mr, &ms) ? ms : common.ranks;
    if (a.P < 2 || a.P > 16) {
        cli_error("bench pipeline: %d ranks; give --ranks 2..16 (the pipe size)", a.P);
        return 2;
    }
    shard_gpt_config gc;
    shard_status s = bench_random_tokens(a.config, &gc, a.dir, sizeof a.dir);
    if (s == SHARD_OK && gc.n_layer < (size_t)a.P)
        s = shard_error(SHARD_ERR_INVALID_ARG, "bench pipeline: %s has %zu blocks, fewer than the %d stages", a.config,
                        gc.n_layer, a.P);
    if (s == SHARD_OK) s = bubble_model(&a, &gc);
    shard_launch_config launch = cli_launch_config(&common);
    if (s == SHARD_OK) s = shard_launch_with(&launch, pp_rank, &a);
    if (a.dir[0]) bench_remove_dir(a.dir);
    if (a.bubble_dir[0]) bench_remove_dir(a.bubble_dir);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    if (a.ms_one <= 0) return 0; /* an MPI rank other than 0 */
    print_report(&a, &gc, json);
    return 0;
}
