/* test_data_parallel.c — data parallel and ZeRO-1/2/3 give the single-device
 * math.  Each rank also trains the single-device reference on a one-rank
 * communicator of its own, so the comparison needs no second program:
 *
 *   gpt        zero 0..3, 20 steps, global batch 6 (uneven over 4 ranks):
 *              losses within 1e-5 relative of the reference (fp32: only the
 *              order of the gradient sums differs); replicas' values bitwise
 *              equal after every step (zero 0..2: the slab's hash on all ranks)
 *   accum      --accum 2 over the same global batch: the same losses
 *   dropout    GPT dropout on (masks keyed by global row): the same losses
 *   models     the MLP (zero 0, 3) and the CNN on Fashion-MNIST (zero 2)
 *   bf16       gradients sent as bf16: half the bytes, losses within 1e-2
 *   mixed      bf16 compute copies of f32 masters, zero 0..3: the single-rank
 *              bf16 run's losses within 1e-4, f32 training's within 2e-2
 *   checkpoint saved under ZeRO-3 on all ranks at step 10, resumed by a
 *              single rank (zero 0) and by ZeRO-1 on min(3, N) ranks: steps
 *              11..20 match the uninterrupted run's within 1e-5
 *   init       weights trained 10 steps, saved by name, loaded (--init) by
 *              zero 0..3 with f32 and bf16 compute copies: the losses of the
 *              single rank started from them (1e-5; bf16 1e-4), not those of
 *              a fresh initialisation
 *   nonfinite  a NaN weight: the step fails naming the global norm, and no
 *              rank's values change
 *   sgd        SGD with momentum instead of AdamW, zero 0..3: the single
 *              rank's losses within 1e-5 (ZeRO shards its momentum buffers)
 *   sgd_checkpoint  SGD with momentum saved under ZeRO-3 at step 10 and
 *              resumed on the same ranks: steps 11..20 bit for bit the
 *              uninterrupted run's, by a single rank within 1e-5; the state
 *              is named optimizer.momentum_buffer.<name>, and an AdamW
 *              trainer's resume of it is refused */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "shard/shard.h"

#define STEPS 20

static _Thread_local char g_dir[256]; /* per rank: thread ranks share the process */

static void shared_setup(test_ctx *t) {
    if (g_dir[0]) return;
    char dir[256];
    test_shared_dir(t, "shard-dp", dir, sizeof dir);
    if (t->rank == 0) {
        /* a byte corpus with structure to learn: words from a small list, LCG-chosen */
        static const char *const words[] = {"the ", "shard ", "of ", "a ", "mesh ", "rank ", "splits ", "data ", "\n"};
        char path[512];
        snprintf(path, sizeof path, "%s/train.tokens", dir);
        test_write_words(t, path, words, 9, 20000, 42);
        const char *configs[][2] = {
            {"gpt.json", "{\"n_embd\": 32, \"n_layer\": 2, \"n_head\": 2, \"n_positions\": 16, \"vocab_size\": 256}"},
            {"gpt_drop.json",
             "{\"n_embd\": 32, \"n_layer\": 2, \"n_head\": 2, \"n_positions\": 16, \"vocab_size\": 256, "
             "\"resid_pdrop\": 0.1, \"embd_pdrop\": 0.1, \"attn_pdrop\": 0.1}"},
            {"mlp.json", "{\"model_type\": \"mlp\", \"model_dim\": 16, \"hidden_dim\": 48}"},
            {"cnn.json", "{\"model_type\": \"cnn\", \"channels\": 4}"},
        };
        for (size_t i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, configs[i][0]);
            FILE *f = fopen(path, "w");
            CHECK(t, f != NULL, "write %s", path);
            if (f) fputs(configs[i][1], f), fclose(f);
        }
    }
    CHECK_OK(t, shard_comm_barrier(t->comm), "files written");
    memcpy(g_dir, dir, sizeof dir);
}

typedef struct run_opts {
    const char *config, *data; /* config file name in g_dir; data dir (NULL: g_dir) */
    size_t batch, accum;
    int zero;
    shard_dtype grad_dtype, compute_dtype;
    uint64_t first, last;      /* steps */
    const char *save, *resume; /* checkpoint dir (save at `last`) */
    const char *init;          /* weights to start from (shard_trainer_load_weights) */
    int check_replicas;
    const char *optimizer; /* NULL: AdamW */
    float momentum, lr;    /* SGD's momentum; the peak learning rate (0: 3e-3) */
} run_opts;

static shard_trainer_config trainer_config(const run_opts *o, char *config_path, size_t bytes) {
    snprintf(config_path, bytes, "%s/%s", g_dir, o->config);
    /* the MLP generates its rows and refuses a data directory; the GPT's token files and the CNN's images are here */
    const char *data = o->data ? o->data : strncmp(o->config, "mlp", 3) == 0 ? NULL : g_dir;
    shard_trainer_config c = {.config_path = config_path,
                              .data_dir = data,
                              .batch = o->batch,
                              .accum = o->accum,
                              .seq = 16,
                              .seed = 3,
                              .zero = o->zero,
                              .bucket_mb = 0.01 /* several buckets */,
                              .grad_dtype = o->grad_dtype,
                              .compute_dtype = o->compute_dtype,
                              .optimizer = o->optimizer,
                              .adamw = shard_adamw_defaults(),
                              .sgd = {.momentum = o->momentum},
                              .clip = 1.0f};
    float lr = o->lr > 0 ? o->lr : 3e-3f;
    c.lr = (shard_lr_schedule){lr, lr / 10, 3, STEPS};
    return c;
}

/* Train steps o->first..o->last on comm (every member calls); losses[step - 1]. */
static void run(test_ctx *t, shard_comm *comm, const run_opts *o, double *losses, uint64_t *grad_bytes) {
    char path[512], text[32];
    snprintf(text, sizeof text, "data=%d", shard_comm_size(comm));
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    shard_trainer_config c = trainer_config(o, path, sizeof path);
    if (!CHECK_OK(t, shard_mesh_create(comm, text, &mesh), "mesh")) return;
    if (CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "trainer zero %d on %d", o->zero, shard_comm_size(comm))) {
        uint64_t done = 0;
        if (o->init) CHECK_OK(t, shard_trainer_load_weights(tr, o->init), "load %s", o->init);
        if (o->resume && CHECK_OK(t, shard_trainer_resume(tr, o->resume, &done), "resume"))
            CHECK_EQ_INT(t, (int64_t)done, (int64_t)o->first - 1, "resumed step");
        shard_model *m = shard_trainer_model(tr);
        for (uint64_t step = o->first; step <= o->last; step++) {
            shard_step_result r;
            if (!CHECK_OK(t, shard_trainer_step(tr, step, &r), "step %llu", (unsigned long long)step)) break;
            losses[step - 1] = r.loss;
            if (grad_bytes) *grad_bytes = r.grad_bytes;
            if (o->check_replicas && o->zero < 3) { /* every replica's values, bitwise */
                int64_t h = (int64_t)XXH3_64bits(m->params->data, m->params->total * sizeof(float)), all[16] = {0};
                CHECK_OK(t, shard_comm_all_gather(comm, &h, all, 1, SHARD_I64), "hashes");
                for (int r2 = 1; r2 < shard_comm_size(comm) && r2 < 16; r2++)
                    CHECK(t, all[r2] == all[0], "zero %d step %llu: rank %d's values differ from rank 0's", o->zero,
                          (unsigned long long)step, r2);
            }
        }
        if (o->save) CHECK_OK(t, shard_trainer_save(tr, o->save, o->last, NULL), "save");
    }
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
}

static shard_comm *self_comm(test_ctx *t) {
    shard_comm *self = NULL;
    CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split");
    return self;
}

static void reference(test_ctx *t, run_opts o, double *losses) {
    shard_comm *self = self_comm(t);
    o.zero = 0, o.accum = 0, o.grad_dtype = SHARD_F32, o.check_replicas = 0; /* compute_dtype kept */
    if (self) run(t, self, &o, losses, NULL);
    shard_comm_destroy(self);
}

static void compare(test_ctx *t, const double *ref, const double *got, uint64_t first, uint64_t last, double tol,
                    const char *what) {
    double worst = 0;
    uint64_t at = first;
    for (uint64_t s = first; s <= last; s++) {
        double rel = fabs(got[s - 1] - ref[s - 1]) / fabs(ref[s - 1]);
        if (rel > worst || isnan(rel)) worst = rel, at = s;
    }
    CHECK(t, worst <= tol, "%s on %d ranks: loss at step %llu is %.9g, single rank %.9g (relative %.3g > %.1g)", what,
          t->size, (unsigned long long)at, got[at - 1], ref[at - 1], worst, tol);
}

/* o on every zero stage over all ranks, each against ref's steps first..last within tol. */
static void every_stage(test_ctx *t, run_opts o, const double *ref, double tol, const char *label) {
    for (int z = 0; z <= 3; z++) {
        double got[STEPS] = {0};
        char what[64];
        snprintf(what, sizeof what, "%s, zero %d", label, z);
        o.zero = z;
        run(t, t->comm, &o, got, NULL);
        compare(t, ref, got, o.first, o.last, tol, what);
    }
}

static void case_gpt(test_ctx *t) {
    shared_setup(t);
    run_opts o = {.config = "gpt.json", .batch = 6, .first = 1, .last = STEPS, .check_replicas = 1};
    double ref[STEPS];
    reference(t, o, ref);
    CHECK(t, ref[STEPS - 1] < ref[0] - 0.5, "the reference learns: %.4f -> %.4f", ref[0], ref[STEPS - 1]);
    every_stage(t, o, ref, 1e-5, "gpt");
}

static void case_accum(test_ctx *t) {
    shared_setup(t);
    run_opts o = {.config = "gpt.json", .batch = (size_t)(2 * t->size + 3), .first = 1, .last = 8};
    double ref[STEPS], got[STEPS];
    reference(t, o, ref);
    int stages[] = {0, 1, 2, 3};
    for (int i = 0; i < 4; i++) {
        o.zero = stages[i], o.accum = 2;
        run(t, t->comm, &o, got, NULL);
        char what[48];
        snprintf(what, sizeof what, "accum 2, zero %d, batch %zu", o.zero, o.batch);
        compare(t, ref, got, 1, 8, 1e-5, what);
    }
}

static void case_dropout(test_ctx *t) {
    shared_setup(t);
    run_opts o = {.config = "gpt_drop.json", .batch = 6, .first = 1, .last = 8};
    run_opts plain = o;
    plain.config = "gpt.json";
    double ref[STEPS], got[STEPS], nodrop[STEPS];
    reference(t, o, ref);
    reference(t, plain, nodrop);
    CHECK(t, fabs(ref[0] - nodrop[0]) > 1e-4, "dropout changes the loss: %.6f vs %.6f", ref[0], nodrop[0]);
    o.zero = 1;
    run(t, t->comm, &o, got, NULL);
    compare(t, ref, got, 1, 8, 1e-5, "gpt with dropout, zero 1");
}

static void case_models(test_ctx *t) {
    shared_setup(t);
    double ref[STEPS], got[STEPS];
    run_opts o = {.config = "mlp.json", .batch = 10, .first = 1, .last = 10};
    reference(t, o, ref);
    CHECK(t, ref[9] < ref[0], "the MLP learns: %.4f -> %.4f", ref[0], ref[9]);
    int z_mlp[] = {0, 3};
    for (int i = 0; i < 2; i++) {
        o.zero = z_mlp[i];
        run(t, t->comm, &o, got, NULL);
        compare(t, ref, got, 1, 10, 1e-5, z_mlp[i] ? "mlp zero 3" : "mlp zero 0");
    }
    run_opts c = {.config = "cnn.json", .data = "/usr/share/datasets/fashion-mnist", .batch = 8, .first = 1, .last = 5};
    reference(t, c, ref);
    c.zero = 2;
    run(t, t->comm, &c, got, NULL);
    compare(t, ref, got, 1, 5, 1e-5, "cnn zero 2");
}

static void case_bf16(test_ctx *t) {
    shared_setup(t);
    run_opts o = {.config = "gpt.json", .batch = 6, .first = 1, .last = 10};
    double ref[STEPS], got[STEPS];
    uint64_t f32_bytes = 0, bf16_bytes = 0;
    reference(t, o, ref);
    run(t, t->comm, &o, got, &f32_bytes);
    o.grad_dtype = SHARD_BF16;
    for (int z = 0; z <= 3; z += 3) {
        o.zero = z;
        run(t, t->comm, &o, got, &bf16_bytes);
        compare(t, ref, got, 1, 10, 1e-2, z ? "bf16 gradients, zero 3" : "bf16 gradients, zero 0");
    }
    o.zero = 0;
    run(t, t->comm, &o, got, &bf16_bytes);
    CHECK(t, t->size == 1 || 2 * bf16_bytes == f32_bytes, "bf16 gradients: %llu bytes, f32 %llu",
          (unsigned long long)bf16_bytes, (unsigned long long)f32_bytes);
}

/* Mixed precision: bf16 compute copies of f32 masters.  Against the single-rank
 * bf16 run, 1e-4 (a master differing in its last bits may round to another
 * bf16); against f32 training, 2e-2 (bf16 keeps 8 significant bits). */
static void case_mixed(test_ctx *t) {
    shared_setup(t);
    run_opts o = {
        .config = "gpt.json", .batch = 6, .first = 1, .last = 10, .compute_dtype = SHARD_BF16, .check_replicas = 1};
    double ref16[STEPS], ref32[STEPS];
    reference(t, o, ref16);
    run_opts f32 = o;
    f32.compute_dtype = SHARD_F32;
    reference(t, f32, ref32);
    compare(t, ref32, ref16, 1, 10, 2e-2, "bf16 compute (one rank) against f32");
    CHECK(t, ref16[9] != ref32[9], "bf16 compute changes the numbers: %.9g vs %.9g", ref16[9], ref32[9]);
    every_stage(t, o, ref16, 1e-4, "bf16 compute");
}

static void case_checkpoint(test_ctx *t) {
    shared_setup(t);
    char ckpt[300];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", g_dir);
    run_opts o = {.config = "gpt.json", .batch = 6, .first = 1, .last = STEPS, .zero = 3};
    double whole[STEPS], part[STEPS], single[STEPS], z1[STEPS];
    run(t, t->comm, &o, whole, NULL); /* uninterrupted */
    o.last = 10, o.save = ckpt;
    run(t, t->comm, &o, part, NULL);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    /* a single rank resumes with plain training */
    run_opts r = {.config = "gpt.json", .batch = 6, .first = 11, .last = STEPS, .resume = ckpt};
    shard_comm *self = self_comm(t);
    if (self) run(t, self, &r, single, NULL);
    shard_comm_destroy(self);
    compare(t, whole, single, 11, STEPS, 1e-5, "zero-3 checkpoint resumed on 1 rank, zero 0");
    /* ZeRO-1 on min(3, N) ranks */
    int n = t->size < 3 ? t->size : 3;
    shard_comm *sub = NULL;
    CHECK_OK(t, shard_comm_split(t->comm, t->rank < n ? 0 : -1, t->rank, &sub), "split");
    r.zero = 1;
    if (sub) run(t, sub, &r, z1, NULL);
    if (sub) compare(t, whole, z1, 11, STEPS, 1e-5, "zero-3 checkpoint resumed by zero 1");
    shard_comm_destroy(sub);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
}

/* Rank 0 trains 10 steps on its own and writes the weights by name to `trained`, and a copy with
 * every ln_f.weight 3e38, whose forward overflows into a NaN loss, to `poisoned`. */
static void write_weights(test_ctx *t, const char *trained, const char *poisoned) {
    shard_comm *self = self_comm(t);
    if (t->rank == 0 && self) {
        char path[512];
        run_opts o = {.config = "gpt.json", .batch = 6, .first = 1, .last = 10};
        shard_trainer_config c = trainer_config(&o, path, sizeof path);
        shard_mesh *mesh = NULL;
        shard_trainer *tr = NULL;
        if (CHECK_OK(t, shard_mesh_create(self, "data=1", &mesh), "mesh") &&
            CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "trainer")) {
            shard_step_result r;
            for (uint64_t step = 1; step <= 10; step++) CHECK_OK(t, shard_trainer_step(tr, step, &r), "step");
            shard_params *p = shard_trainer_model(tr)->params;
            CHECK_OK(t, shard_params_save(p, trained, NULL, NULL, 0), "save %s", trained);
            /* finite weights (NaN would be refused at load) whose forward overflows: ln_f scaled to the
             * largest float makes the head's logits infinite of both signs, so the loss is NaN */
            float *ln_f = shard_params_data(p, "ln_f.weight");
            for (size_t i = 0; i < shard_params_find(p, "ln_f.weight")->numel; i++) ln_f[i] = 3e38f;
            CHECK_OK(t, shard_params_save(p, poisoned, NULL, NULL, 0), "save %s", poisoned);
        }
        shard_trainer_destroy(tr);
        shard_mesh_destroy(mesh);
    }
    shard_comm_destroy(self);
    CHECK_OK(t, shard_comm_barrier(t->comm), "weights written");
}

static void case_init(test_ctx *t) {
    shared_setup(t);
    char trained[300], poisoned[300];
    snprintf(trained, sizeof trained, "%s/trained.safetensors", g_dir);
    snprintf(poisoned, sizeof poisoned, "%s/poisoned.safetensors", g_dir);
    write_weights(t, trained, poisoned);
    run_opts o = {.config = "gpt.json", .batch = 6, .first = 1, .last = 3};
    double fresh[STEPS], ref32[STEPS], ref16[STEPS], got[STEPS];
    reference(t, o, fresh);
    o.init = trained;
    reference(t, o, ref32);
    CHECK(t, ref32[0] < fresh[0] - 0.3, "the trained weights start lower: %.4f, fresh %.4f", ref32[0], fresh[0]);
    run_opts o16 = o;
    o16.compute_dtype = SHARD_BF16;
    reference(t, o16, ref16);
    compare(t, ref32, ref16, 1, 3, 2e-2, "--init, bf16 compute (one rank) against f32");
    for (int z = 0; z <= 3; z++) {
        char what[48];
        o.zero = o16.zero = z;
        snprintf(what, sizeof what, "--init, zero %d", z);
        run(t, t->comm, &o, got, NULL);
        compare(t, ref32, got, 1, 3, 1e-5, what);
        snprintf(what, sizeof what, "--init, bf16 compute, zero %d", z);
        run(t, t->comm, &o16, got, NULL);
        compare(t, ref16, got, 1, 3, 1e-4, what);
    }
}

/* A gradient that is NaN: every rank's step fails before the update, and the values stay as loaded. */
static void case_nonfinite(test_ctx *t) {
    shared_setup(t);
    char trained[300], poisoned[300], path[512];
    snprintf(trained, sizeof trained, "%s/trained.safetensors", g_dir);
    snprintf(poisoned, sizeof poisoned, "%s/poisoned.safetensors", g_dir);
    write_weights(t, trained, poisoned);
    for (int z = 0; z <= 3; z += 3) {
        run_opts o = {.config = "gpt.json", .batch = 6, .zero = z};
        shard_trainer_config c = trainer_config(&o, path, sizeof path);
        char text[32];
        snprintf(text, sizeof text, "data=%d", t->size);
        shard_mesh *mesh = NULL;
        shard_trainer *tr = NULL;
        if (CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh") &&
            CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "trainer") &&
            CHECK_OK(t, shard_trainer_load_weights(tr, poisoned), "load")) {
            size_t n = shard_trainer_model(tr)->params->total;
            float *before = calloc(n + 1, sizeof *before), *after = calloc(n + 1, sizeof *after);
            shard_step_result r;
            CHECK_OK(t, shard_trainer_values(tr, before), "values");
            shard_status s = shard_trainer_step(tr, 1, &r);
            CHECK(t, s == SHARD_ERR_INVALID_ARG, "zero %d: a NaN gradient's step returned %d, want %d", z, (int)s,
                  (int)SHARD_ERR_INVALID_ARG);
            CHECK(t, strstr(shard_last_error(), "global norm is NaN") != NULL, "the message: %s", shard_last_error());
            CHECK_OK(t, shard_trainer_values(tr, after), "values");
            CHECK(t, before && after && memcmp(before, after, n * sizeof *before) == 0,
                  "zero %d: the failed step changed the values", z);
            free(before), free(after);
        }
        shard_trainer_destroy(tr);
        shard_mesh_destroy(mesh);
    }
    /* after a failed step, good weights loaded again train as a fresh trainer does: nothing the failed step
     * left is reused (zero 3 kept a gathered copy of the old embedding with accumulation).  Accum 2 with
     * f32 and bf16 compute. */
    for (int z = 0; z <= 3; z++)
        for (int bf = 0; bf < 2; bf++) {
            run_opts o = {
                .config = "gpt.json", .batch = 24, .accum = 2, .zero = z, .compute_dtype = bf ? SHARD_BF16 : SHARD_F32};
            shard_trainer_config c = trainer_config(&o, path, sizeof path);
            char text[32];
            snprintf(text, sizeof text, "data=%d", t->size);
            double loss[2] = {0, -1};
            char good[300];
            snprintf(good, sizeof good, "%s/ck_before_nan_%d_%d", g_dir, z, bf);
            for (int failed_first = 0; failed_first < 2; failed_first++) {
                shard_mesh *mesh = NULL;
                shard_trainer *tr = NULL;
                shard_step_result r = {0};
                /* step 1 (the acquire order is known from then on), [saved; a failed step 2; resumed], step 2 */
                if (CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh") &&
                    CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "trainer") &&
                    CHECK_OK(t, shard_trainer_load_weights(tr, trained), "load") &&
                    CHECK_OK(t, shard_trainer_step(tr, 1, &r), "zero %d: step 1", z)) {
                    uint64_t done = 0;
                    if (failed_first && CHECK_OK(t, shard_trainer_save(tr, good, 1, NULL), "save") &&
                        CHECK_OK(t, shard_trainer_load_weights(tr, poisoned), "load poisoned")) {
                        CHECK(t, shard_trainer_step(tr, 2, &r) == SHARD_ERR_INVALID_ARG, "zero %d: a NaN step went on",
                              z);
                        CHECK_OK(t, shard_trainer_resume(tr, good, &done), "resume");
                    }
                    if (CHECK_OK(t, shard_trainer_step(tr, 2, &r), "zero %d: step 2", z)) loss[failed_first] = r.loss;
                }
                shard_trainer_destroy(tr);
                shard_mesh_destroy(mesh);
            }
            CHECK(t, loss[1] == loss[0], "zero %d, %s compute: after a failed step, loss %.9g; a fresh trainer's %.9g",
                  z, bf ? "bf16" : "f32", loss[1], loss[0]);
        }
}

/* Saving and resuming under ZeRO-3 go one parameter at a time and keep each rank's rows only: no rank
 * holds the whole state (the old way gathered values and both moments whole on every rank, twice:
 * 24 bytes per parameter on each rank, against ZeRO-3's 16 / N while training). */
static void case_save_memory(test_ctx *t) {
    shared_setup(t);
    char path[512], text[32], ck[300];
    snprintf(text, sizeof text, "data=%d", t->size);
    snprintf(ck, sizeof ck, "%s/ck_memory", g_dir);
    run_opts o = {.config = "gpt.json", .batch = 8, .zero = 3};
    shard_trainer_config c = trainer_config(&o, path, sizeof path);
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    shard_step_result r;
    if (CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh") &&
        CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "trainer") &&
        CHECK_OK(t, shard_trainer_step(tr, 1, &r), "step")) {
        size_t params = shard_trainer_model(tr)->params->total;
        for (int resume = 0; resume < 2; resume++) {
            shard_mem_stats before, after;
            CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
            shard_mem_stats_get(&before);
            shard_mem_stats_reset_peak();
            uint64_t done = 0;
            CHECK_OK(t, resume ? shard_trainer_resume(tr, ck, &done) : shard_trainer_save(tr, ck, 1, NULL), "%s",
                     resume ? "resume" : "save");
            shard_mem_stats_get(&after);
            uint64_t now = 0, peak = 0;
            for (int k = 0; k < SHARD_MEM_CATEGORY_COUNT; k++)
                now += before.current_bytes[k], peak += after.peak_bytes[k];
            double extra = (double)(peak - now) / (double)params; /* bytes per parameter of the whole model */
            if (t->rank == 0)
                printf("zero 3 on %d ranks: %s takes %.2f bytes per parameter more\n", t->size,
                       resume ? "resume" : "save", extra);
            /* this rank's rows of the three arrays (12 / N) and one parameter's scratch (this model's largest,
             * wte, is a quarter of it: 2 bytes) and the loader's buffers; the whole state alone would be 12 */
            CHECK(t, extra <= 12.0 / t->size + 4.5,
                  "zero 3 on %d ranks: %s took %.2f bytes per parameter on top of "
                  "training's; want at most 12 / N + 4.5",
                  t->size, resume ? "resume" : "save", extra);
        }
    }
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
}

/* A compute dtype other than f32 or bf16 is refused by name (f16 used to train in f32 silently). */
static void case_refusals(test_ctx *t) {
    shared_setup(t);
    char path[512], text[32];
    snprintf(text, sizeof text, "data=%d", t->size);
    const shard_dtype wrong[] = {SHARD_F16, SHARD_F64};
    for (int i = 0; i < 2; i++) {
        run_opts o = {.config = "gpt.json", .batch = 8, .zero = 3, .compute_dtype = wrong[i]};
        shard_trainer_config c = trainer_config(&o, path, sizeof path);
        shard_mesh *mesh = NULL;
        shard_trainer *tr = NULL;
        if (CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) {
            shard_status s = shard_trainer_create(mesh, &c, &tr);
            CHECK(t, s == SHARD_ERR_INVALID_ARG && !tr, "compute dtype %s: create returned %d",
                  shard_dtype_name(wrong[i]), (int)s);
            CHECK(t, strstr(shard_last_error(), shard_dtype_name(wrong[i])) != NULL, "the message: %s",
                  shard_last_error());
        }
        shard_trainer_destroy(tr);
        shard_mesh_destroy(mesh);
    }
}

/* SGD with momentum: ZeRO shards its one state array as it does AdamW's two. */
static const run_opts sgd_opts = {
    .config = "gpt.json", .batch = 6, .first = 1, .last = 10, .optimizer = "sgd", .momentum = 0.9f, .lr = 0.05f};

static void case_sgd(test_ctx *t) {
    shared_setup(t);
    run_opts o = sgd_opts, adamw = sgd_opts;
    o.check_replicas = 1;
    adamw.optimizer = NULL, adamw.lr = 0;
    double ref[STEPS], ref_adamw[STEPS];
    reference(t, o, ref);
    reference(t, adamw, ref_adamw);
    CHECK(t, ref[9] < ref[0] - 0.5, "SGD learns: %.4f -> %.4f", ref[0], ref[9]);
    CHECK(t, ref[1] != ref_adamw[1], "SGD's losses are AdamW's: %.9g", ref[1]);
    every_stage(t, o, ref, 1e-5, "sgd with momentum");
}

static void case_sgd_checkpoint(test_ctx *t) {
    shared_setup(t);
    char ckpt[300], path[512], text[32];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt_sgd", g_dir);
    run_opts o = sgd_opts;
    o.last = STEPS, o.zero = 3;
    double whole[STEPS], part[STEPS], again[STEPS] = {0}, single[STEPS];
    run(t, t->comm, &o, whole, NULL); /* uninterrupted */
    o.last = 10, o.save = ckpt;
    run(t, t->comm, &o, part, NULL);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    run_opts r = o;
    r.first = 11, r.last = STEPS, r.save = NULL, r.resume = ckpt;
    run(t, t->comm, &r, again, NULL);
    for (uint64_t s = 11; s <= STEPS; s++)
        CHECK(t, again[s - 1] == whole[s - 1],
              "sgd resumed under zero 3: loss at step %llu is %.17g, uninterrupted %.17g", (unsigned long long)s,
              again[s - 1], whole[s - 1]);
    shard_comm *self = self_comm(t);
    r.zero = 0;
    if (self) run(t, self, &r, single, NULL);
    shard_comm_destroy(self);
    compare(t, whole, single, 11, STEPS, 1e-5, "sgd zero-3 checkpoint resumed on 1 rank, zero 0");
    /* the state arrays by their names: momentum_buffer, and none of AdamW's */
    snprintf(path, sizeof path, "%s/step_10/index.json", ckpt);
    FILE *f = t->rank == 0 ? fopen(path, "r") : NULL;
    if (t->rank == 0 && CHECK(t, f != NULL, "open %s", path)) {
        static char index[1 << 20];
        size_t got = fread(index, 1, sizeof index - 1, f);
        index[got] = '\0';
        fclose(f);
        CHECK(t,
              strstr(index, "\"optimizer.momentum_buffer.wte.weight\"") && strstr(index, "\"optimizer\": \"sgd\"") &&
                  !strstr(index, "optimizer.exp_avg"),
              "%s: the SGD state's names or the recorded optimizer are missing", path);
    }
    /* an AdamW trainer refuses it, naming both optimizers, on every rank */
    run_opts a = r;
    a.optimizer = NULL;
    shard_trainer_config c = trainer_config(&a, path, sizeof path);
    snprintf(text, sizeof text, "data=%d", t->size);
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    uint64_t done = 0;
    if (CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh") &&
        CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "trainer")) {
        shard_status s = shard_trainer_resume(tr, ckpt, &done);
        CHECK(t,
              s == SHARD_ERR_INVALID_ARG &&
                  strstr(shard_last_error(), "was trained with sgd, and this run's optimizer is adamw"),
              "adamw resuming an sgd checkpoint: %d (%s)", (int)s, shard_last_error());
    }
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
}

static void case_cleanup(test_ctx *t) {
    shared_setup(t);
    test_remove_dir(t, g_dir);
}

static const test_case cases[] = {
    {"gpt", case_gpt},
    {"accum", case_accum},
    {"dropout", case_dropout},
    {"models", case_models},
    {"bf16", case_bf16},
    {"mixed", case_mixed},
    {"checkpoint", case_checkpoint},
    {"init", case_init},
    {"nonfinite", case_nonfinite},
    {"refusals", case_refusals},
    {"save_memory", case_save_memory},
    {"sgd", case_sgd},
    {"sgd_checkpoint", case_sgd_checkpoint},
    {"cleanup", case_cleanup},
};

int main(int argc, char **argv) {
    shard_blas_set_threads(1); /* the single-rank references run beside the other ranks */
    return test_main(argc, argv, "test_data_parallel", cases, sizeof cases / sizeof cases[0]);
}
