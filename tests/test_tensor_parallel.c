/* test_tensor_parallel.c — Megatron tensor parallelism (and data x tensor
 * meshes) give the single-device math.  Each rank also trains the
 * single-device reference on a one-rank communicator of its own.
 *
 *   grads   on mesh tensor=N, with and without sequence parallel (the GPT's
 *           dropouts on — embedding, attention, residual: masks keyed by global
 *           positions): every parameter piece's gradient equals the
 *           matching slice of the single-device gradient (slices computed
 *           here from the Megatron layout: heads of q, k, v; MLP columns;
 *           vocabulary rows), within 1e-5 of the tensor's largest element
 *   losses  20 steps on every mesh of the world with a tensor axis (tensor=N,
 *           data x tensor: 2x2, 1x3, 3x1), with and without sequence
 *           parallel, plain and with ZeRO-3 on the data axis: losses within
 *           1e-5 relative of one rank's
 *   checkpoint saved on tensor=N with ZeRO-1 and sequence parallel at step 10 (pieces put together
 *           into whole tensors), resumed by one rank: steps 11..20 the same
 *   specs   the layers read their placement from their parameters' specs: other choices than
 *           Megatron's (an MLP, an attention or the vocabulary placed whole, P(), per block) give
 *           the same gradients (grads, second layout) and losses (with and without sequence
 *           parallel, data x tensor too) */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "shard/shard.h"

#define STEPS 20
enum { C = 32, H = 4, D = C / H, V = 256, T = 16, L = 2 };

static _Thread_local char g_dir[256]; /* per rank: thread ranks share the process */

static void setup(test_ctx *t) {
    if (g_dir[0]) return;
    char dir[256];
    test_shared_dir(t, "shard-tp", dir, sizeof dir);
    if (t->rank == 0) {
        static const char *const words[] = {"heads ", "split ", "over ", "the ", "tensor ", "axis ", "rows ", "\n"};
        char path[512];
        snprintf(path, sizeof path, "%s/train.tokens", dir);
        test_write_words(t, path, words, 8, 20000, 9);
        snprintf(path, sizeof path, "%s/gpt.json", dir);
        FILE *f = fopen(path, "w");
        CHECK(t, f != NULL, "config");
        if (f) {
            fprintf(f,
                    "{\"n_embd\": %d, \"n_layer\": %d, \"n_head\": %d, \"n_positions\": %d, \"vocab_size\": %d, "
                    "\"resid_pdrop\": 0.1, \"attn_pdrop\": 0.1, \"embd_pdrop\": 0.1}",
                    C, L, H, T, V);
            fclose(f);
        }
    }
    CHECK_OK(t, shard_comm_barrier(t->comm), "files written");
    memcpy(g_dir, dir, sizeof dir);
}

/* Layouts of the tests: Megatron's (NULL), and one with some pairs placed whole on every tensor rank. */
#define MIXED_SPECS "h.0.mlp.*=P();h.1.attn.*=P();wte.weight=P()"
static const char *const mixed_whole[] = {"h.0.mlp.*", "h.1.attn.*", "wte.weight"};

static int whole_under(const char *specs, const char *name) {
    for (size_t k = 0; specs && k < sizeof mixed_whole / sizeof mixed_whole[0]; k++)
        if (fnmatch(mixed_whole[k], name, 0) == 0) return 1;
    return 0;
}

/* The slice of the whole tensor `name` (shape rows x cols, row-major) that tensor rank r of p holds
 * (under `specs`: NULL, or MIXED_SPECS). */
static void slice_of(const char *specs, const char *name, const float *whole, size_t rows, size_t cols, size_t r,
                     size_t p, float *out) {
    size_t h0, hl, f0, fl, v0, vl;
    shard_split_even(H, p, r, &h0, &hl);
    shard_split_even(4 * C, p, r, &f0, &fl);
    shard_split_even(V, p, r, &v0, &vl);
    size_t at = 0;
    if (whole_under(specs, name)) {
        memcpy(out, whole, rows * cols * sizeof *out);
    } else if (strstr(name, "c_attn")) { /* q, k, v: this rank's heads of each */
        for (size_t i = 0; i < rows; i++)
            for (size_t part = 0; part < 3; part++)
                for (size_t c = 0; c < hl * D; c++) out[at++] = whole[i * cols + part * C + h0 * D + c];
    } else if (strstr(name, "mlp.c_fc")) { /* columns */
        for (size_t i = 0; i < rows; i++)
            for (size_t c = 0; c < fl; c++) out[at++] = whole[i * cols + f0 + c];
    } else if (strstr(name, "mlp.c_proj.weight")) { /* rows */
        memcpy(out, whole + f0 * cols, fl * cols * sizeof *out);
    } else if (strstr(name, "attn.c_proj.weight")) {
        memcpy(out, whole + h0 * D * cols, hl * D * cols * sizeof *out);
    } else if (strcmp(name, "wte.weight") == 0) {
        memcpy(out, whole + v0 * cols, vl * cols * sizeof *out);
    } else {
        memcpy(out, whole, rows * cols * sizeof *out);
    }
}

static shard_model *make(test_ctx *t, shard_comm *tensor, size_t rows, int sp, const char *specs) {
    char path[512];
    snprintf(path, sizeof path, "%s/gpt.json", g_dir);
    shard_model *m = NULL;
    if (!CHECK_OK(t, shard_model_create_placed(path, g_dir, rows, T, tensor, sp, specs, &m), "model")) return NULL;
    m->ops->init(m, 11);
    return m;
}

static void case_grads(test_ctx *t) {
    setup(t);
    char text[32];
    snprintf(text, sizeof text, "tensor=%d", t->size);
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) return;
    shard_comm *tensor = shard_mesh_axis_comm(mesh, shard_mesh_axis_index(mesh, "tensor"));
    for (int run = 0; run < 4; run++) {
        int sp = run & 1;
        const char *specs = run >> 1 ? MIXED_SPECS : NULL;
        shard_model *tp = make(t, tensor, 3, sp, specs), *one = make(t, NULL, 3, 0, NULL);
        float *g_tp = tp ? calloc(tp->params->total, sizeof *g_tp) : NULL,
              *g_one = one ? calloc(one->params->total, sizeof *g_one) : NULL;
        /* the rows both models take: the token file, as the trainer's source draws it */
        char tokens[512];
        snprintf(tokens, sizeof tokens, "%s/train.tokens", g_dir);
        shard_batch_tokens_options to = {.struct_size = sizeof to, .path = tokens, .seq = T, .max_rows = 3};
        shard_batch_source *src = NULL;
        shard_batch b;
        if (tp && one && g_tp && g_one && CHECK_OK(t, shard_batch_source_tokens(&to, &src), "source") &&
            CHECK_OK(t, shard_batch_source_load(src, 5, 7, 0, 3, &b), "batch")) {
            shard_model *ms[2] = {tp, one};
            float *gs[2] = {g_tp, g_one};
            for (int k = 0; k < 2; k++) {
                double loss = 0;
                shard_model_bind_grad_slab(ms[k], gs[k]);
                CHECK_OK(t, ms[k]->ops->set_batch(ms[k], &b), "batch");
                CHECK_OK(t, ms[k]->ops->forward(ms[k], 3.0 * T, &loss), "forward");
                CHECK_OK(t, ms[k]->ops->backward(ms[k]), "backward");
            }
            for (size_t i = 0; i < tp->params->count; i++) {
                const shard_param_info *pi = &tp->params->info[i], *wi = shard_params_find(one->params, pi->name);
                if (!CHECK(t, wi != NULL, "%s: not in the single-device model", pi->name)) continue;
                size_t rows = wi->ndim == 2 ? wi->shape[0] : 1, cols = wi->ndim == 2 ? wi->shape[1] : wi->shape[0];
                float *want = calloc(wi->numel, sizeof *want);
                slice_of(specs, pi->name, g_one + wi->offset, rows, cols, (size_t)t->rank, (size_t)t->size, want);
                double worst = 0, big = 1e-12;
                for (size_t e = 0; e < wi->numel; e++) big = fmax(big, fabs(g_one[wi->offset + e]));
                for (size_t e = 0; e < pi->numel; e++) { /* a NaN stays the worst (fmax would drop it) */
                    double d = fabs(g_tp[pi->offset + e] - want[e]);
                    if (!isnan(worst) && !(d <= worst)) worst = d;
                }
                CHECK(t, worst <= 1e-5 * big,
                      "tensor=%d%s%s rank %d: %s's gradient differs from its slice by %.3g (largest %.3g)", t->size,
                      sp ? " sequence parallel" : "", specs ? " --spec " MIXED_SPECS : "", t->rank, pi->name, worst,
                      big);
                /* the tensor table's wrappers: the whole shape, this rank's slice, the whole again from the slices */
                size_t shape[SHARD_MAX_DIMS] = {0};
                shard_model_whole_shape(tp, i, shape);
                CHECK(t, memcmp(shape, wi->shape, (size_t)wi->ndim * sizeof *shape) == 0, "%s: whole shape", pi->name);
                float *piece = calloc(pi->numel, sizeof *piece), *whole = calloc(wi->numel, sizeof *whole);
                shard_model_take_piece(tp, i, g_one + wi->offset, piece);
                CHECK(t, memcmp(piece, want, pi->numel * sizeof *piece) == 0, "%s: take_piece is not its slice",
                      pi->name);
                CHECK_OK(t, shard_model_gather_piece(tp, i, piece, whole), "%s: gather_piece", pi->name);
                CHECK(t, memcmp(whole, g_one + wi->offset, wi->numel * sizeof *whole) == 0,
                      "%s: gather_piece is not the whole", pi->name);
                free(piece), free(whole);
                free(want);
            }
        }
        free(g_tp), free(g_one);
        shard_batch_source_destroy(src);
        shard_model_destroy(tp), shard_model_destroy(one);
    }
    shard_mesh_destroy(mesh);
}

/* Steps first..last on a mesh; a checkpoint saved at `last` (save) or resumed from (resume). */
static void train_span(test_ctx *t, shard_comm *comm, const char *mesh_text, int zero, int sp, const char *specs,
                       double *losses, uint64_t first, uint64_t last, const char *save, const char *resume) {
    char path[512];
    snprintf(path, sizeof path, "%s/gpt.json", g_dir);
    shard_trainer_config c = {.config_path = path,
                              .data_dir = g_dir,
                              .batch = 6,
                              .seq = T,
                              .seed = 3,
                              .zero = zero,
                              .bucket_mb = 0.01,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f,
                              .sequence_parallel = sp,
                              .param_specs = specs};
    c.lr = (shard_lr_schedule){3e-3f, 3e-4f, 3, STEPS};
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    if (!CHECK_OK(t, shard_mesh_create(comm, mesh_text, &mesh), "mesh %s", mesh_text)) return;
    uint64_t done = 0;
    if (CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "trainer on %s", mesh_text) &&
        (!resume || CHECK_OK(t, shard_trainer_resume(tr, resume, &done), "resume on %s", mesh_text)))
        for (uint64_t s = first; s <= last; s++) {
            shard_step_result r;
            if (!CHECK_OK(t, shard_trainer_step(tr, s, &r), "step")) break;
            losses[s - 1] = r.loss;
        }
    if (tr && save) CHECK_OK(t, shard_trainer_save(tr, save, last, NULL), "save on %s", mesh_text);
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
}

static void train(test_ctx *t, shard_comm *comm, const char *mesh_text, int zero, int sp, double *losses) {
    train_span(t, comm, mesh_text, zero, sp, NULL, losses, 1, STEPS, NULL, NULL);
}

/* Saved on tensor=N (ZeRO-1 on data=1) at step 10, resumed by one rank: steps 11..20 as uninterrupted. */
static void case_checkpoint(test_ctx *t) {
    setup(t);
    char dir[300], text[32];
    snprintf(dir, sizeof dir, "%s/ckpt", g_dir);
    snprintf(text, sizeof text, "data=1,tensor=%d", t->size);
    double whole[STEPS] = {0}, got[STEPS] = {0};
    train_span(t, t->comm, text, 1, 1, NULL, whole, 1, STEPS, NULL, NULL);
    train_span(t, t->comm, text, 1, 1, NULL, got, 1, 10, dir, NULL);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    shard_comm *self = NULL;
    CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split");
    if (self) train_span(t, self, "data=1", 0, 0, NULL, got, 11, STEPS, NULL, dir);
    shard_comm_destroy(self);
    for (int s = 10; s < STEPS; s++)
        CHECK(t, fabs(got[s] - whole[s]) <= 1e-5 * fabs(whole[s]),
              "resumed from tensor=%d: step %d loss %.9g, uninterrupted %.9g", t->size, s + 1, got[s], whole[s]);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
}

static void case_losses(test_ctx *t) {
    setup(t);
    double ref[STEPS] = {0}, got[STEPS];
    shard_comm *self = NULL;
    CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split");
    if (self) train(t, self, "data=1", 0, 0, ref);
    shard_comm_destroy(self);
    const char *meshes[5][3] = {{NULL},
                                {"tensor=1"},
                                {"tensor=2"},
                                {"tensor=3", "data=1,tensor=3", "data=3,tensor=1"},
                                {"tensor=4", "data=2,tensor=2"}};
    for (int k = 0; t->size <= 4 && k < 3 && meshes[t->size][k]; k++)
        for (int run = 0; run < 4; run++) {
            int zero = run & 1 ? 3 : 0, sp = run >> 1;
            memset(got, 0, sizeof got);
            train(t, t->comm, meshes[t->size][k], zero, sp, got);
            double worst = 0;
            int at = 0;
            for (int s = 0; s < STEPS; s++) {
                double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
                if (!isnan(worst) && !(rel <= worst)) worst = rel, at = s; /* a NaN stays the worst */
            }
            CHECK(t, worst <= 1e-5, "mesh %s, zero %d%s: loss at step %d is %.9g, one rank %.9g (relative %.3g)",
                  meshes[t->size][k], zero, sp ? ", sequence parallel" : "", at + 1, got[at], ref[at], worst);
        }
}

/* Placement choices as specs: each trains as one rank does. */
static void case_specs(test_ctx *t) {
    setup(t);
    double ref[STEPS] = {0}, got[STEPS];
    shard_comm *self = NULL;
    CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split");
    if (self) train(t, self, "data=1", 0, 0, ref);
    shard_comm_destroy(self);
    static const char *const layouts[] = {MIXED_SPECS, "h.*.mlp.*=P()", "h.*.attn.*=P()",
                                          "h.*.attn.*=P();h.*.mlp.*=P();wte.weight=P()"};
    char mesh[2][32];
    snprintf(mesh[0], sizeof mesh[0], "tensor=%d", t->size);
    snprintf(mesh[1], sizeof mesh[1], "data=2,tensor=%d", t->size / 2);
    for (int m = 0; m < (t->size == 4 ? 2 : 1); m++)
        for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++)
            for (int sp = 0; sp <= 1; sp++) {
                memset(got, 0, sizeof got);
                train_span(t, t->comm, mesh[m], m ? 1 : 0, sp, layouts[k], got, 1, STEPS, NULL, NULL);
                double worst = 0;
                int at = 0;
                for (int s = 0; s < STEPS; s++) {
                    double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
                    if (!isnan(worst) && !(rel <= worst)) worst = rel, at = s; /* a NaN stays the worst */
                }
                CHECK(t, worst <= 1e-5, "mesh %s --spec '%s'%s: loss at step %d is %.9g, one rank %.9g (relative %.3g)",
                      mesh[m], layouts[k], sp ? ", sequence parallel" : "", at + 1, got[at], ref[at], worst);
            }
}

static void case_cleanup(test_ctx *t) {
    setup(t);
    test_remove_dir(t, g_dir);
}

static const test_case cases[] = {{"grads", case_grads},
                                  {"losses", case_losses},
                                  {"checkpoint", case_checkpoint},
                                  {"specs", case_specs},
                                  {"cleanup", case_cleanup}};

int main(int argc, char **argv) {
    shard_blas_set_threads(1);
    return test_main(argc, argv, "test_tensor_parallel", cases, sizeof cases / sizeof cases[0]);
}
