/* test_pipeline.c — pipeline parallelism gives the single-device math, and its
 * schedules are what they claim.
 *
 *   schedules  for p 1..4 and m 1..16 (interleaved: v 2, 3 and m a multiple
 *              of p): every rank runs F and B of each micro-batch exactly once,
 *              F before B; the equal-cost timeline never deadlocks; its bubble
 *              is (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m+p-1) interleaved;
 *              1F1B's rank i holds at most min(p-i, m) micro-batches, GPipe's m;
 *              layer partitions (even with the remainder first, explicit, bad)
 *   losses     20 steps of the GPT (dropout on, so recomputation must redraw the
 *              same masks) on every pipelined mesh of the world — pipe=N; data x
 *              pipe 2x2, 3x2; data x tensor x pipe 2x2x2 with and without
 *              sequence parallel — with GPipe and 1F1B (and interleaved 1F1B,
 *              two chunks per rank, on pipe=2), with and without --recompute,
 *              ZeRO-0/1/2/3 in turn where there is a data axis: losses within
 *              1e-5 relative of one rank's with the same global batch (1e-4
 *              with gradients sent as bf16, ZeRO-2/3)
 *   interleaved  interleaved 1F1B on pipe 3 and 4 (two chunks of an 8-block
 *              GPT per rank), m = p and 2p, with and without recompute
 *   checkpoint saved at step 10 by pipe=N (1F1B, ZeRO-1 on data x pipe for 4
 *              ranks), resumed by one rank, and saved by one rank, resumed
 *              pipelined: steps 11..20 as uninterrupted; a bad layer list is
 *              refused with one clear error, uneven explicit stages train */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parallel/pipeline_schedule.h"
#include "shard/shard.h"

#define STEPS 20
enum { C = 32, H = 4, V = 256, T = 16, L = 4, BATCH = 12 };

static _Thread_local char g_dir[256];

static void setup(test_ctx *t) {
    if (g_dir[0]) return;
    char dir[256];
    test_shared_dir(t, "shard-pp", dir, sizeof dir);
    if (t->rank == 0) {
        static const char *const words[] = {"stages ", "pass ", "micro ", "batches ", "down ", "the ", "pipe ", "\n"};
        char path[512];
        snprintf(path, sizeof path, "%s/train.tokens", dir);
        test_write_words(t, path, words, 8, 20000, 5);
        for (int k = 0; k < 2; k++) { /* gpt.json, and gpt8.json with 8 blocks (interleaved on pipe 3 and 4) */
            snprintf(path, sizeof path, "%s/%s", dir, k ? "gpt8.json" : "gpt.json");
            FILE *f = fopen(path, "w");
            CHECK(t, f != NULL, "config");
            if (f) {
                fprintf(f,
                        "{\"n_embd\": %d, \"n_layer\": %d, \"n_head\": %d, \"n_positions\": %d, \"vocab_size\": %d, "
                        "\"resid_pdrop\": 0.1, \"attn_pdrop\": 0.1, \"embd_pdrop\": 0.1}",
                        C, k ? 8 : L, H, T, V);
                fclose(f);
            }
        }
    }
    CHECK_OK(t, shard_comm_barrier(t->comm), "files written");
    memcpy(g_dir, dir, sizeof dir);
}

/* ---------------------------------------------------------------- schedules (rank 0) */

static void check_schedule(test_ctx *t, shard_pipe_kind kind, int p, int m, int v) {
    shard_pipe_schedule *s = NULL;
    const char *name = shard__pipe_kind_name(kind);
    if (!CHECK_OK(t, shard__pipe_schedule_create(kind, p, m, v, &s), "%s p %d m %d v %d", name, p, m, v)) return;
    int *seen = calloc((size_t)(m * v), sizeof *seen), *peak = calloc((size_t)p, sizeof *peak), total = 0;
    for (int r = 0; seen && r < p; r++) {
        memset(seen, 0, (size_t)(m * v) * sizeof *seen);
        CHECK_EQ_INT(t, s->count[r], 2 * m * v, "%s p %d m %d: rank %d's ops", name, p, m, r);
        for (int i = 0; i < s->count[r]; i++) {
            const shard_pipe_op *op = &s->ops[r][i];
            int *state = &seen[op->chunk * m + op->micro];
            CHECK(t, op->what == 'F' ? *state == 0 : *state == 1,
                  "%s p %d m %d v %d: rank %d op %d (%c%d chunk %d) out of "
                  "order",
                  name, p, m, v, r, i, op->what, op->micro, op->chunk);
            (*state)++;
        }
        for (int k = 0; k < m * v; k++)
            CHECK_EQ_INT(t, seen[k], 2, "%s p %d m %d: rank %d, F and B of %d", name, p, m, r, k);
    }
    CHECK_OK(t, shard__pipe_schedule_timeline(s, 1, 1, NULL, &total, peak), "%s p %d m %d v %d: timeline", name, p, m,
             v);
    double bubble = shard__pipe_schedule_bubble(s, 1, 1), want = shard_cost_pipe_bubble(kind, p, m, v);
    if (kind != SHARD_PIPE_INTERLEAVED || p == 1)
        CHECK_NEAR(t, bubble, want, 1e-12, "%s p %d m %d: bubble of the equal-cost timeline", name, p, m);
    else /* interleaved: the formula, or less when a rank's warm-up fills the gaps */
        CHECK(t, bubble <= want + 1e-12, "interleaved p %d m %d v %d: bubble %.4f above (p-1)/(vm+p-1) = %.4f", p, m, v,
              bubble, want);
    for (int r = 0; r < p; r++) {
        int limit = kind == SHARD_PIPE_GPIPE ? m : kind == SHARD_PIPE_1F1B ? (p - r < m ? p - r : m) : m * v;
        CHECK(t, peak[r] <= limit, "%s p %d m %d: rank %d holds %d micro-batches (at most %d)", name, p, m, r, peak[r],
              limit);
        if (kind == SHARD_PIPE_GPIPE)
            CHECK_EQ_INT(t, peak[r], m, "gpipe p %d m %d: rank %d holds every micro-batch", p, m, r);
    }
    free(seen), free(peak);
    shard__pipe_schedule_destroy(s);
}

static void case_schedules(test_ctx *t) {
    if (t->rank != 0) return;
    for (int p = 1; p <= 4; p++)
        for (int m = 1; m <= 16; m++) {
            check_schedule(t, SHARD_PIPE_GPIPE, p, m, 1);
            check_schedule(t, SHARD_PIPE_1F1B, p, m, 1);
            for (int v = 2; v <= 3 && m % p == 0; v++) check_schedule(t, SHARD_PIPE_INTERLEAVED, p, m, v);
        }
    /* 1F1B with enough micro-batches: rank i holds exactly p - i */
    shard_pipe_schedule *s = NULL;
    int peak[4];
    if (CHECK_OK(t, shard__pipe_schedule_create(SHARD_PIPE_1F1B, 4, 8, 1, &s), "1f1b") &&
        CHECK_OK(t, shard__pipe_schedule_timeline(s, 1, 2, NULL, NULL, peak), "timeline"))
        for (int r = 0; r < 4; r++)
            CHECK_EQ_INT(t, peak[r], 4 - r, "1f1b p 4 m 8: rank %d's micro-batches in flight", r);
    shard__pipe_schedule_destroy(s);
    CHECK(t, shard__pipe_schedule_create(SHARD_PIPE_INTERLEAVED, 4, 6, 2, &s) == SHARD_ERR_INVALID_ARG,
          "interleaved needs m a multiple of p");
    CHECK(t, shard__pipe_schedule_create(SHARD_PIPE_1F1B, 2, 4, 2, &s) == SHARD_ERR_INVALID_ARG,
          "v > 1 needs interleaved");
    shard_pipe_kind kind;
    CHECK(t,
          shard__pipe_kind_parse("zigzag", &kind) == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "gpipe, 1f1b"),
          "unknown schedule: %s", shard_last_error());
    /* partitions */
    size_t first[5];
    CHECK_OK(t, shard__pipe_partition(10, 4, NULL, first), "even");
    CHECK(t, first[1] == 3 && first[2] == 6 && first[3] == 8 && first[4] == 10,
          "10 layers over 4: 3,3,2,2 (%zu %zu %zu %zu)", first[1], first[2], first[3], first[4]);
    CHECK_OK(t, shard__pipe_partition(8, 3, "3,3,2", first), "explicit");
    CHECK(t, first[1] == 3 && first[2] == 6 && first[3] == 8, "3,3,2");
    CHECK(t,
          shard__pipe_partition(8, 3, "3,3,3", first) == SHARD_ERR_INVALID_ARG &&
              strstr(shard_last_error(), "adds up to 9"),
          "bad sum: %s", shard_last_error());
    CHECK(t, shard__pipe_partition(8, 3, "4,4", first) == SHARD_ERR_INVALID_ARG, "too few counts");
    CHECK(t, shard__pipe_partition(8, 3, "4,0,4", first) == SHARD_ERR_INVALID_ARG, "an empty stage");
    CHECK(t, shard__pipe_partition(2, 3, NULL, first) == SHARD_ERR_INVALID_ARG, "more stages than layers");
    /* counts whose sum wraps around to the model's layers: 2 (2^63 - 1) + 6 = 2^64 + 4; each count past the
     * model's layers is refused on its own, and one past the long range too */
    CHECK(t,
          shard__pipe_partition(4, 3, "9223372036854775807,9223372036854775807,6", first) == SHARD_ERR_INVALID_ARG &&
              strstr(shard_last_error(), "give 3 counts >= 1"),
          "counts that wrap: %s", shard_last_error());
    CHECK(t,
          shard__pipe_partition(4, 2, "99999999999999999999,1", first) == SHARD_ERR_INVALID_ARG &&
              strstr(shard_last_error(), "give 2 counts >= 1"),
          "a count past the long range: %s", shard_last_error());
}

/* ---------------------------------------------------------------- losses */

typedef struct run_opts {
    const char *mesh, *schedule, *config; /* config: NULL for gpt.json */
    int recompute, zero, sp, virtual_stages, grad_bf16;
    size_t micro_batches;
} run_opts;

/* Steps first..last (of a 20-step schedule), resumed from `resume` and saved at `last` to `save` if given. */
static shard_status train_span(test_ctx *t, shard_comm *comm, const run_opts *o, double *losses, uint64_t first,
                               uint64_t last, const char *save, const char *resume) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, o->config ? o->config : "gpt.json");
    shard_trainer_config c = {.config_path = path,
                              .data_dir = g_dir,
                              .batch = BATCH,
                              .seq = T,
                              .seed = 3,
                              .zero = o->zero,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f,
                              .sequence_parallel = o->sp,
                              .schedule = o->schedule,
                              .micro_batches = o->micro_batches,
                              .recompute = o->recompute,
                              .virtual_stages = o->virtual_stages,
                              .grad_dtype = o->grad_bf16 ? SHARD_BF16 : SHARD_F32};
    c.lr = (shard_lr_schedule){3e-3f, 3e-4f, 3, STEPS};
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    shard_status s = shard_mesh_create(comm, o->mesh, &mesh);
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &tr);
    uint64_t done = 0;
    if (s == SHARD_OK && resume) s = shard_trainer_resume(tr, resume, &done);
    for (uint64_t step = first; s == SHARD_OK && step <= last; step++) {
        shard_step_result r;
        s = shard_trainer_step(tr, step, &r);
        losses[step - 1] = r.loss;
    }
    if (s == SHARD_OK && save) s = shard_trainer_save(tr, save, last, NULL);
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
    return s;
}

static shard_status train(test_ctx *t, shard_comm *comm, const run_opts *o, double *losses) {
    return train_span(t, comm, o, losses, 1, STEPS, NULL, NULL);
}

static void case_losses(test_ctx *t) {
    setup(t);
    static const char *const meshes[9][3] = {{NULL},
                                             {NULL},
                                             {"pipe=2"},
                                             {"pipe=3"},
                                             {"pipe=4", "data=2,pipe=2"},
                                             {NULL},
                                             {"data=3,pipe=2", "data=1,tensor=3,pipe=2"},
                                             {NULL},
                                             {"data=2,tensor=2,pipe=2"}};
    static const size_t micro_batches[4] = {4, 6, 2,
                                            5}; /* the reference accumulates the same micro-batches; 5: uneven */
    for (int mb = 0; mb < 4; mb++) {
        double ref[STEPS] = {0}, got[STEPS];
        shard_comm *self = NULL;
        CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split");
        run_opts one = {.mesh = "data=1", .micro_batches = micro_batches[mb]};
        if (self) CHECK_OK(t, train(t, self, &one, ref), "one rank, %zu micro-batches", micro_batches[mb]);
        shard_comm_destroy(self);
        for (int k = 0; t->size <= 8 && k < 3 && meshes[t->size][k]; k++) {
            const char *mesh = meshes[t->size][k];
            int data = strstr(mesh, "data=2") || strstr(mesh, "data=3"), tensor = strstr(mesh, "tensor") != NULL;
            if ((size_t)BATCH / micro_batches[mb] < (size_t)(data ? (strstr(mesh, "data=3") ? 3 : 2) : 1)) continue;
            /* interleaved: two chunks of the 4 blocks per rank on pipe=2, micro-batches a multiple of 2 */
            int interleaved = strstr(mesh, "pipe=2") && micro_batches[mb] % 2 == 0;
            for (int run = 0; run < 10; run++) {
                if ((run >= 4 && run < 6 && !tensor) || (run >= 6 && run < 8 && !interleaved) || (run >= 8 && !data))
                    continue;
                /* runs 8, 9: gradients sent as bf16 with ZeRO-2 / ZeRO-3 (each unit reduce-scattered once per
                 * micro-batch: a second send would count it twice, a 1e-2 error) */
                run_opts o = {.mesh = mesh,
                              .schedule = run >= 6 && run < 8 ? "interleaved"
                                  : run & 1                   ? "1f1b"
                                                              : "gpipe",
                              .recompute = (run >> 1) & 1,
                              .zero = data ? (run >= 8 ? run - 6 : run % 4) : 0,
                              .sp = run == 4 || run == 5,
                              .virtual_stages = run >= 6 && run < 8 ? 2 : 1,
                              .micro_batches = micro_batches[mb],
                              .grad_bf16 = run >= 8};
                /* bf16 gradients: their rounding moves the losses by ~1e-5 relative over 20 steps */
                double tolerance = o.grad_bf16 ? 1e-4 : 1e-5;
                memset(got, 0, sizeof got);
                if (!CHECK_OK(t, train(t, t->comm, &o, got), "mesh %s %s", mesh, o.schedule)) continue;
                double worst = 0;
                int at = 0;
                for (int s = 0; s < STEPS; s++) {
                    double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
                    if (!isnan(worst) && !(rel <= worst)) worst = rel, at = s; /* a NaN stays the worst */
                }
                CHECK(t, worst <= tolerance,
                      "mesh %s, %s, %zu micro-batches%s%s%s, zero %d: loss at step %d is %.9g, one rank "
                      "%.9g (relative %.3g)",
                      mesh, o.schedule, o.micro_batches, o.recompute ? ", recompute" : "",
                      o.sp ? ", sequence parallel" : "", o.grad_bf16 ? ", bf16 gradients" : "", o.zero, at + 1, got[at],
                      ref[at], worst);
            }
        }
    }
}

/* Interleaved 1F1B on pipe = 3 and 4 (two chunks of the 8-block GPT per rank), m = p and 2p, with and
 * without recompute, against one rank. */
static void case_interleaved(test_ctx *t) {
    setup(t);
    if (t->size < 3 || t->size > 4) return;
    char mesh[16];
    snprintf(mesh, sizeof mesh, "pipe=%d", t->size);
    for (size_t m = (size_t)t->size; m <= 2 * (size_t)t->size && m <= BATCH; m += (size_t)t->size) {
        double ref[STEPS] = {0}, got[STEPS];
        shard_comm *self = NULL;
        CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split");
        run_opts one = {.mesh = "data=1", .config = "gpt8.json", .micro_batches = m};
        if (self) CHECK_OK(t, train(t, self, &one, ref), "one rank, %zu micro-batches", m);
        shard_comm_destroy(self);
        for (int rc = 0; rc < 2; rc++) {
            run_opts o = {.mesh = mesh,
                          .schedule = "interleaved",
                          .config = "gpt8.json",
                          .virtual_stages = 2,
                          .recompute = rc,
                          .micro_batches = m};
            memset(got, 0, sizeof got);
            if (!CHECK_OK(t, train(t, t->comm, &o, got), "%s interleaved m %zu", mesh, m)) continue;
            double worst = 0;
            int at = 0;
            for (int s = 0; s < STEPS; s++) {
                double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
                if (!isnan(worst) && !(rel <= worst)) worst = rel, at = s; /* a NaN stays the worst */
            }
            CHECK(t, worst <= 1e-5,
                  "%s interleaved (2 chunks per rank), %zu micro-batches%s: loss at step %d is %.9g, one "
                  "rank %.9g (relative %.3g)",
                  mesh, m, rc ? ", recompute" : "", at + 1, got[at], ref[at], worst);
        }
    }
}

/* ---------------------------------------------------------------- checkpoints, refusals */

static void expect_error(test_ctx *t, shard_status s, const char *needle, const char *what) {
    CHECK(t, s < 0 && strstr(shard_last_error(), needle) != NULL, "%s: status %d, error '%s' (want '%s')", what, (int)s,
          shard_last_error(), needle);
}

static void compare_tail(test_ctx *t, const double *got, const double *want, const char *what) {
    for (int s = 10; s < STEPS; s++)
        CHECK(t, fabs(got[s] - want[s]) <= 1e-5 * fabs(want[s]), "%s: step %d loss %.9g, uninterrupted %.9g", what,
              s + 1, got[s], want[s]);
}

static void case_checkpoint(test_ctx *t) {
    setup(t);
    char dir[2][300], mesh[32];
    snprintf(dir[0], sizeof dir[0], "%s/ckpt-pipe", g_dir);
    snprintf(dir[1], sizeof dir[1], "%s/ckpt-one", g_dir);
    snprintf(mesh, sizeof mesh, t->size == 4 ? "data=2,pipe=2" : "pipe=%d", t->size);
    if (t->size > 4) return;
    run_opts piped = {.mesh = mesh, .schedule = "1f1b", .zero = t->size == 4 ? 1 : 0, .micro_batches = 4};
    run_opts one = {.mesh = "data=1", .micro_batches = 4};
    double whole[STEPS] = {0}, got[STEPS] = {0};
    shard_comm *self = NULL;
    CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split");
    if (self) CHECK_OK(t, train(t, self, &one, whole), "uninterrupted");
    /* pipelined, saved at 10, resumed by one rank */
    CHECK_OK(t, train_span(t, t->comm, &piped, got, 1, 10, dir[0], NULL), "pipelined to step 10, saved");
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    if (self) CHECK_OK(t, train_span(t, self, &one, got, 11, STEPS, NULL, dir[0]), "one rank resumes");
    compare_tail(t, got, whole, "saved pipelined, resumed by one rank");
    /* one rank saves, the pipeline resumes */
    if (t->rank == 0 && self) CHECK_OK(t, train_span(t, self, &one, got, 1, 10, dir[1], NULL), "one rank to step 10");
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    memset(got, 0, sizeof got);
    CHECK_OK(t, train_span(t, t->comm, &piped, got, 11, STEPS, NULL, dir[1]), "the pipeline resumes");
    compare_tail(t, got, whole, "saved by one rank, resumed pipelined");
    shard_comm_destroy(self);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
}

static void case_refusals(test_ctx *t) {
    setup(t);
    if (t->size != 2) return;
    char path[512];
    snprintf(path, sizeof path, "%s/gpt.json", g_dir);
    shard_trainer_config c = {.config_path = path,
                              .data_dir = g_dir,
                              .batch = BATCH,
                              .seq = T,
                              .seed = 3,
                              .adamw = shard_adamw_defaults(),
                              .micro_batches = 4,
                              .layers_per_stage = "3,3"};
    c.lr = (shard_lr_schedule){1e-3f, 1e-3f, 0, STEPS};
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, "pipe=2", &mesh), "mesh")) return;
    expect_error(t, shard_trainer_create(mesh, &c, &tr), "adds up to 6 layers; the model has 4", "a bad layer list");
    for (int k = 0; k < 2; k++) { /* uneven, and balanced by measured time */
        c.layers_per_stage = k ? "balanced" : "1,3";
        if (CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "layers %s", c.layers_per_stage)) {
            shard_step_result r;
            CHECK_OK(t, shard_trainer_step(tr, 1, &r), "a step with layers %s", c.layers_per_stage);
            char text[2048] = "";
            FILE *f = fmemopen(text, sizeof text - 1, "w");
            if (f) shard_trainer_print_schedule(tr, f), fclose(f);
            CHECK(t,
                  strstr(text,
                         !k            ? "layers per stage 1,3; given"
                             : t->rank ? "; balanced on the world's rank 0's"
                                       : "; balanced on measured ms per stage") != NULL,
                  "the partition's line: %s", text);
        }
        shard_trainer_destroy(tr);
        tr = NULL;
    }
    shard_mesh_destroy(mesh);
}

static void case_cleanup(test_ctx *t) {
    setup(t);
    test_remove_dir(t, g_dir);
}

static const test_case cases[] = {{"schedules", case_schedules},     {"losses", case_losses},
                                  {"interleaved", case_interleaved}, {"checkpoint", case_checkpoint},
                                  {"refusals", case_refusals},       {"cleanup", case_cleanup}};

int main(int argc, char **argv) {
    shard_blas_set_threads(1);
    return test_main(argc, argv, "test_pipeline", cases, sizeof cases / sizeof cases[0]);
}
