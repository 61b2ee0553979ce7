/* test_analyze.c — shard_analyze's figures are the engine's: for a matrix of layouts (data with ZeRO
 * 0-3, tensor with and without sequence parallel, pipe with GPipe, 1F1B + recompute and interleaved,
 * data x tensor, data x pipe with ZeRO-3, data x tensor x pipe with sequence parallel, the MLP on tensor
 * and ZeRO-3, a mixture of experts on data x expert) each rank's predicted peak bytes per category
 * (and in total) are within 1 % of the peaks a real 5-step run of the same layout reaches, and (the
 * dense layouts) the bytes it sends on each axis in a step equal what the real run's communicators
 * count in its 5th step.  The analysis also agrees with the closed forms where they are exact: a
 * rank's forward FLOPs with the GPT's 6N-style count is not checked (the engine skips the masked half of
 * attention); parameters held are the model's.  A mixture of experts' expert bytes and activation rows
 * at capacity equal the hand count and are at least the balanced routing's; a train log's are read as
 * each rank's median step, a file that is not such a log refused.  Run on 8 thread ranks; each layout on
 * the first W. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard/shard.h"

enum { CATS = SHARD_MEM_CATEGORY_COUNT, MAX_AXES = 6, STEPS = 5 };

static _Thread_local char g_dir[256];

static void setup(test_ctx *t) {
    if (g_dir[0]) return;
    char dir[256];
    test_shared_dir(t, "shard-analyze", dir, sizeof dir);
    if (t->rank == 0) {
        static const char *const words[] = {"plans ", "cost ", "what ", "runs ", "the ", "\n"};
        char path[512];
        snprintf(path, sizeof path, "%s/train.tokens", dir);
        test_write_words(t, path, words, 6, 20000, 7);
        static const char *const configs[][2] = {
            {"gpt.json", "{\"n_embd\": 64, \"n_layer\": 4, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 256}"},
            {"moe.json",
             "{\"n_embd\": 32, \"n_layer\": 2, \"n_head\": 2, \"n_positions\": 32, \"vocab_size\": 256, "
             "\"num_local_experts\": 4, \"num_experts_per_tok\": 2}"},
            {"mlp.json", "{\"model_type\": \"mlp\", \"model_dim\": 64, \"hidden_dim\": 256}"}};
        for (size_t k = 0; k < 3; k++) {
            snprintf(path, sizeof path, "%s/%s", dir, configs[k][0]);
            FILE *f = fopen(path, "w");
            CHECK(t, f != NULL, "config %s", configs[k][0]);
            if (f) fputs(configs[k][1], f), fclose(f);
        }
    }
    CHECK_OK(t, shard_comm_barrier(t->comm), "files written");
    memcpy(g_dir, dir, sizeof dir);
}

typedef struct layout {
    const char *config, *mesh, *schedule;
    int zero, sp, recompute, virtual_stages;
    size_t micro_batches;
    int dense; /* the traffic is the data's alone to decide only for a mixture of experts */
} layout;

static int world_of(const char *mesh) {
    int n = 1;
    for (const char *p = strchr(mesh, '='); p; p = strchr(p + 1, '=')) n *= atoi(p + 1);
    return n;
}

static shard_trainer_config config_of(const layout *l, char *path, size_t bytes) {
    snprintf(path, bytes, "%s/%s", g_dir, l->config);
    shard_trainer_config c = {.config_path = path,
                              .data_dir = strcmp(l->config, "mlp.json") == 0 ? NULL : g_dir, /* its own rows */
                              .batch = 8,
                              .seq = 32,
                              .seed = 3,
                              .zero = l->zero,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f,
                              .sequence_parallel = l->sp,
                              .schedule = l->schedule,
                              .micro_batches = l->micro_batches,
                              .recompute = l->recompute,
                              .virtual_stages = l->virtual_stages};
    c.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, STEPS};
    return c;
}

/* The names the analysis keys traffic by, and this rank's communicator of each in the real run. */
static int axis_comms(shard_mesh *mesh, const char *names[MAX_AXES], shard_comm *comms[MAX_AXES]) {
    int n = 0;
    names[n] = "world", comms[n++] = shard_mesh_comm(mesh);
    for (int a = 0; a < shard_mesh_ndim(mesh) && n < MAX_AXES - 1; a++)
        names[n] = shard_mesh_axis_name(mesh, a), comms[n++] = shard_mesh_axis_comm(mesh, a);
    shard_comm *rows = NULL;
    if (shard_mesh_axis_index(mesh, "expert") >= 0 && shard_mesh_axis_index(mesh, "data") >= 0 &&
        shard_mesh_axes_comm(mesh, "data,expert", &rows) == SHARD_OK)
        names[n] = "data,expert", comms[n++] = rows;
    return n;
}

/* A real STEPS-step run on comm: peaks by category and in total (over the baseline before it), and the
 * bytes of the last step on each axis (out: CATS + 1 + MAX_AXES values). */
static shard_status measure(test_ctx *t, shard_comm *comm, const layout *l, double *out) {
    char path[512];
    shard_trainer_config c = config_of(l, path, sizeof path);
    shard_mem_stats base, st;
    shard_mem_stats_reset_peak();
    shard_mem_stats_get(&base);
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    shard_status s = shard_mesh_create(comm, l->mesh, &mesh);
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &tr);
    const char *names[MAX_AXES];
    shard_comm *comms[MAX_AXES];
    int n = s == SHARD_OK ? axis_comms(mesh, names, comms) : 0;
    uint64_t before[MAX_AXES] = {0};
    for (int step = 1; s == SHARD_OK && step <= STEPS; step++) {
        for (int k = 0; k < n && step == STEPS; k++) before[k] = shard_comm_bytes_sent(comms[k]);
        shard_step_result r;
        s = shard_trainer_step(tr, (uint64_t)step, &r);
    }
    shard_mem_stats_get(&st);
    for (int k = 0; k < CATS; k++) out[k] = (double)(st.peak_bytes[k] - base.current_bytes[k]);
    out[CATS] = (double)(st.total_peak_bytes - base.total_current_bytes);
    for (int k = 0; k < MAX_AXES; k++)
        out[CATS + 1 + k] = k < n ? (double)(shard_comm_bytes_sent(comms[k]) - before[k]) : 0;
    (void)t;
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
    return s;
}

static void check_layout(test_ctx *t, const layout *l) {
    int W = world_of(l->mesh);
    shard_comm *sub = NULL;
    if (!CHECK_OK(t, shard_comm_split(t->comm, t->rank < W ? 0 : 1, t->rank, &sub), "split")) return;
    enum { PER = CATS + 1 + MAX_AXES };
    double mine[PER] = {0}, *all = calloc((size_t)t->size * PER, sizeof *all);
    if (t->rank < W) CHECK_OK(t, measure(t, sub, l, mine), "%s: the real run", l->mesh);
    CHECK_OK(t, shard_comm_all_gather(t->comm, mine, all, PER, SHARD_F64), "gather");
    shard_comm_destroy(sub);
    if (t->rank != 0) {
        free(all);
        return;
    }
    char path[512];
    shard_trainer_config c = config_of(l, path, sizeof path);
    shard_analyze_options o = {.struct_size = sizeof o, .train = &c, .mesh = l->mesh};
    shard_analysis *a = NULL;
    if (!CHECK_OK(t, shard_analyze(&o, &a), "%s: analyze", l->mesh)) {
        free(all);
        return;
    }
    CHECK_EQ_INT(t, a->world, W, "%s: world", l->mesh);
    /* the axis names in the order measure() lists them: world, the mesh's axes, data,expert */
    char axis_names[MAX_AXES][64] = {"world"};
    int n = 1;
    char copy[128];
    snprintf(copy, sizeof copy, "%s", l->mesh);
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item && n < MAX_AXES; item = strtok_r(NULL, ",", &save))
        *strchr(item, '=') = '\0', snprintf(axis_names[n++], sizeof axis_names[0], "%s", item);
    if (strstr(l->mesh, "expert") && strstr(l->mesh, "data")) snprintf(axis_names[n++], 64, "data,expert");
    for (int r = 0; r < W; r++) {
        const double *got = all + (size_t)r * PER;
        const shard_rank_analysis *x = &a->rank[r];
        for (int k = 0; k <= CATS; k++) {
            double want = k < CATS ? (double)x->memory_bytes[k] : (double)x->memory_total_bytes;
            const char *cat = k < CATS ? shard_mem_category_name((shard_mem_category)k) : "total";
            /* a mixture of experts' activations and exchange buffers follow its routing */
            int routed = !l->dense && (k == SHARD_MEM_ACTIVATIONS || k == SHARD_MEM_COMM || k == CATS);
            if (routed) continue;
            CHECK(t, want <= got[k] * 1.01 + 64 && want >= got[k] * 0.99 - 64,
                  "%s zero %d: rank %d %s predicted %.0f bytes, the run's peak %.0f", l->mesh, l->zero, r, cat, want,
                  got[k]);
        }
        for (int k = 0; k < n && l->dense; k++)
            CHECK_EQ_INT(t, (int64_t)shard_rank_analysis_axis_bytes(x, axis_names[k]), (int64_t)got[CATS + 1 + k],
                         "%s zero %d: rank %d's bytes on '%s'", l->mesh, l->zero, r, axis_names[k]);
        CHECK(t, x->flops_forward > 0 && x->flops_backward > x->flops_forward, "%s: rank %d's FLOPs %g / %g", l->mesh,
              r, x->flops_forward, x->flops_backward);
    }
    CHECK(t, l->schedule || a->bubble == 0, "%s: a bubble without a pipe axis", l->mesh);
    CHECK(t, !strstr(l->mesh, "pipe") || a->bubble > 0, "%s: no bubble on a pipe axis", l->mesh);
    shard_analysis_destroy(a);
    free(all);
}

static void matrix(test_ctx *t) {
    setup(t);
    static const layout layouts[] = {
        {.config = "gpt.json", .mesh = "data=2", .dense = 1},
        {.config = "gpt.json", .mesh = "data=2", .zero = 1, .dense = 1},
        {.config = "gpt.json", .mesh = "data=2", .zero = 2, .dense = 1},
        {.config = "gpt.json", .mesh = "data=2", .zero = 3, .dense = 1},
        {.config = "gpt.json", .mesh = "tensor=2", .dense = 1},
        {.config = "gpt.json", .mesh = "tensor=2", .sp = 1, .dense = 1},
        {.config = "gpt.json", .mesh = "pipe=2", .schedule = "gpipe", .micro_batches = 4, .dense = 1},
        {.config = "gpt.json", .mesh = "pipe=2", .schedule = "1f1b", .micro_batches = 4, .recompute = 1, .dense = 1},
        {.config = "gpt.json",
         .mesh = "pipe=2",
         .schedule = "interleaved",
         .micro_batches = 4,
         .virtual_stages = 2,
         .dense = 1},
        {.config = "gpt.json", .mesh = "data=2,tensor=2", .zero = 1, .dense = 1},
        {.config = "gpt.json", .mesh = "data=2,pipe=2", .zero = 3, .schedule = "1f1b", .dense = 1},
        {.config = "gpt.json", .mesh = "data=2,tensor=2,pipe=2", .sp = 1, .schedule = "1f1b", .dense = 1},
        {.config = "mlp.json", .mesh = "tensor=2", .dense = 1},
        {.config = "mlp.json", .mesh = "data=4", .zero = 3, .dense = 1},
        {.config = "moe.json", .mesh = "data=2,expert=2", .zero = 1, .dense = 0},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (world_of(layouts[i].mesh) <= t->size) check_layout(t, &layouts[i]);
}

/* A mixture of experts' bound against the hand count of expert_bound.h: 2 blocks of E = 4 experts, top-2,
 * C = 32 (F = 128), on expert=2 with batch 8 x 32: each rank routes 4 rows of T = 32 tokens and holds 2
 * experts.  Capacity factor 1.25: cap = ceil(1.25 x 32 x 2 / 4) = 20, so a row sends 2 experts at most
 * min(2 x 20, 32 x 2) = 40 rows: 4 x 40 = 160 rows out and 160 back from the other rank per forward, of
 * 32 floats (40960 bytes), the counts 2 + 2 int64 (32 bytes); a step is one forward and one backward of
 * each block: 2 x (40960 + 32 + 40960) = 163904 bytes.  The experts hold 320 rows of 3 x (32 + 128)
 * floats: 2 x 320 x 1920 = 1228800 bytes.  The balanced routing sends each of the 4 experts 16 rows of a
 * row (none dropped): 128 rows out and back, 2 x (32768 + 32 + 32768) = 131136 bytes, 256 rows held,
 * 983040 bytes.  With no capacity (factor 0) a row sends 2 experts all its 64 choices: 2 x (65536 + 32 +
 * 65536) = 262208 bytes, 512 rows held, 1966080 bytes.  Uneven shares (6,2): every rank's bound at least
 * its balanced figure. */
static void expert_bound(test_ctx *t) {
    setup(t);
    if (t->rank != 0) return;
    static const struct {
        const char *factor, *shares;
        uint64_t bytes, bound, activations, activations_bound;
    } cases[] = {{"1.25", NULL, 131136, 163904, 983040, 1228800},
                 {"0", NULL, 131136, 262208, 983040, 1966080},
                 {"1.25", "6,2", 0, 0, 0, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/moe_cap.json", g_dir);
        FILE *f = fopen(path, "w");
        if (!CHECK(t, f != NULL, "config %s", path)) return;
        fprintf(f,
                "{\"n_embd\": 32, \"n_layer\": 2, \"n_head\": 2, \"n_positions\": 32, \"vocab_size\": 256, "
                "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"expert_capacity_factor\": %s}",
                cases[k].factor);
        fclose(f);
        layout l = {.config = "moe_cap.json", .mesh = "expert=2"};
        shard_trainer_config c = config_of(&l, path, sizeof path);
        c.batch_shares = cases[k].shares;
        shard_analyze_options o = {.struct_size = sizeof o, .train = &c, .mesh = l.mesh};
        shard_analysis *a = NULL;
        if (!CHECK_OK(t, shard_analyze(&o, &a), "analyze expert=2, capacity factor %s", cases[k].factor)) continue;
        for (size_t r = 0; r < a->ranks; r++) {
            const shard_rank_analysis *x = &a->rank[r];
            CHECK(t,
                  x->expert_bytes > 0 && x->expert_bytes <= x->expert_bytes_bound && x->expert_activation_bytes > 0 &&
                      x->expert_activation_bytes <= x->expert_activation_bytes_bound,
                  "factor %s shares %s rank %zu: balanced %llu / %llu bytes, bound %llu / %llu", cases[k].factor,
                  cases[k].shares ? cases[k].shares : "even", r, (unsigned long long)x->expert_bytes,
                  (unsigned long long)x->expert_activation_bytes, (unsigned long long)x->expert_bytes_bound,
                  (unsigned long long)x->expert_activation_bytes_bound);
            CHECK(t, x->expert_bytes_measured == -1, "rank %zu: measured before a log was read", r);
            if (!cases[k].bytes) continue;
            CHECK_EQ_INT(t, (int64_t)x->expert_bytes, (int64_t)cases[k].bytes, "factor %s rank %zu: balanced bytes",
                         cases[k].factor, r);
            CHECK_EQ_INT(t, (int64_t)x->expert_bytes_bound, (int64_t)cases[k].bound, "factor %s rank %zu: bound",
                         cases[k].factor, r);
            CHECK_EQ_INT(t, (int64_t)x->expert_activation_bytes, (int64_t)cases[k].activations,
                         "factor %s rank %zu: balanced activation bytes", cases[k].factor, r);
            CHECK_EQ_INT(t, (int64_t)x->expert_activation_bytes_bound, (int64_t)cases[k].activations_bound,
                         "factor %s rank %zu: activation bound", cases[k].factor, r);
        }
        shard_analysis_destroy(a);
    }
}

/* A log that is not one is refused in one line naming the file and the line. */
static void measured_refusals(test_ctx *t) {
    setup(t);
    if (t->rank != 0) return;
    char path[512], log[512];
    layout l = {.config = "moe.json", .mesh = "expert=2"};
    shard_trainer_config c = config_of(&l, path, sizeof path);
    shard_analyze_options o = {.struct_size = sizeof o, .train = &c, .mesh = l.mesh};
    shard_analysis *a = NULL;
    if (!CHECK_OK(t, shard_analyze(&o, &a), "analyze expert=2")) return;
    snprintf(log, sizeof log, "%s/run.jsonl", g_dir);
    static const struct {
        const char *text, *says;
    } bad[] = {{"{\"step\": 1, \"ranks\": [{\"rank\": 0, \"all_to_all_bytes\": {\"expert\": 5}}, "
                "{\"rank\": 1, \"all_to_all_bytes\": {\"expert\": 7}}]}\nnot json\n",
                "line 2: not a JSON object"},
               {"{\"step\": 1}\n", "line 1: no 'ranks' list, but the layout has 2 ranks"},
               {"{\"ranks\": [{\"rank\": 0}, {\"rank\": 1}]}\n", "line 1: entry 0 of 'ranks'"},
               {"\n", "no step in it"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        FILE *f = fopen(log, "w");
        if (!CHECK(t, f != NULL, "%s", log)) break;
        fputs(bad[k].text, f), fclose(f);
        CHECK(t,
              shard_analysis_measure(a, log) == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), log) &&
                  strstr(shard_last_error(), bad[k].says),
              "log %zu: %s", k, shard_last_error());
    }
    FILE *f = fopen(log, "w"); /* three steps: each rank's median */
    if (CHECK(t, f != NULL, "%s", log)) {
        for (int k = 0; k < 3; k++)
            fprintf(f,
                    "{\"ranks\": [{\"rank\": 1, \"all_to_all_bytes\": {\"expert\": %d}}, "
                    "{\"rank\": 0, \"all_to_all_bytes\": {\"data\": 0}}]}\n",
                    (int[]){30, 10, 20}[k]);
        fclose(f);
        CHECK_OK(t, shard_analysis_measure(a, log), "a log of 3 steps");
        CHECK(t,
              a->measured_steps == 3 && a->rank[0].expert_bytes_measured == 0 && a->rank[1].expert_bytes_measured == 20,
              "measured: %zu steps, %g and %g bytes", a->measured_steps, a->rank[0].expert_bytes_measured,
              a->rank[1].expert_bytes_measured);
    }
    shard_analysis_destroy(a);
}

/* Bad input: one clear line, nothing built. */
static void refusals(test_ctx *t) {
    setup(t);
    if (t->rank != 0) return;
    char path[512];
    layout l = {.config = "gpt.json", .mesh = "data=2"};
    shard_trainer_config c = config_of(&l, path, sizeof path);
    shard_analysis *a = NULL;
    shard_analyze_options o = {.struct_size = sizeof o, .train = &c, .mesh = "data=2", .world = 3};
    CHECK(t, shard_analyze(&o, &a) == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "has 2 ranks, not 3"),
          "a world the mesh does not span: %s", shard_last_error());
    o.world = 0, o.mesh = "data=2,seq=2";
    CHECK(t, shard_analyze(&o, &a) < 0 && strstr(shard_last_error(), "training splits over 'data'"),
          "an axis training does not split over: %s", shard_last_error());
    shard_analysis_destroy(a);
}

static void cleanup(test_ctx *t) {
    setup(t);
    test_remove_dir(t, g_dir);
    g_dir[0] = '\0';
}

int main(int argc, char **argv) {
    static const test_case cases[] = {{"matrix", matrix},
                                      {"expert_bound", expert_bound},
                                      {"measured_refusals", measured_refusals},
                                      {"refusals", refusals},
                                      {"cleanup", cleanup}};
    return test_main(argc, argv, "test_analyze", cases, sizeof cases / sizeof cases[0]);
}
