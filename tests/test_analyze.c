/* test_analyze.c — shard_analyze's figures are the engine's: for a matrix of layouts (data with ZeRO
 * 0-3, tensor with and without sequence parallel, pipe with GPipe, 1F1B + recompute and interleaved,
 * data x tensor, data x pipe with ZeRO-3, data x tensor x pipe with sequence parallel, the MLP on tensor
 * and ZeRO-3, a mixture of experts on data x expert) each rank's predicted peak bytes per category
 * (and in total) are within 1 % of the peaks a real 5-step run of the same layout reaches, and (the
 * dense layouts) the bytes it sends on each axis in a step equal what the real run's communicators
 * count in its 5th step.  The analysis also agrees with the closed forms where they are exact: a
 * rank's forward FLOPs with the GPT's 6N-style count is not checked (the engine skips the masked half of
 * attention); parameters held are the model's.  Run on 8 thread ranks; each layout on the first W. */
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
    static const test_case cases[] = {{"matrix", matrix}, {"refusals", refusals}, {"cleanup", cleanup}};
    return test_main(argc, argv, "test_analyze", cases, sizeof cases / sizeof cases[0]);
}
