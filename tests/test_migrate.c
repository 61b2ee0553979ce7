/* test_migrate.c — shard_trainer_migrate: a run moved to another layout between two steps trains on as
 * if it had never moved.  Each rank also trains the single-device reference on a one-rank communicator
 * of its own.  Four ranks (other world sizes run nothing):
 *
 *   moves    a GPT with dropout, 16 steps, moved after step 6: data=4 ZeRO-0 -> data=2,pipe=2 ZeRO-1,
 *            data=2,tensor=2 ZeRO-3 -> pipe=4, pipe=2,tensor=2 -> data=4 ZeRO-3 (and SGD with momentum:
 *            data=4 ZeRO-2 -> data=2,tensor=2): losses within 1e-5 relative of one rank's, the stats'
 *            time and bytes set (bytes where the old layout split the state)
 *   refused  a new layout with another optimizer, and a new mesh over other ranks: the same error on
 *            every rank, no new trainer, and the old one trains on to the reference's losses */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "shard/shard.h"

#define STEPS 16
#define MOVE_AT 6

static _Thread_local char g_dir[256]; /* per rank: thread ranks share the process */

static void setup(test_ctx *t) {
    if (g_dir[0]) return;
    char dir[256];
    test_shared_dir(t, "shard-migrate", dir, sizeof dir);
    if (t->rank == 0) {
        static const char *const words[] = {"a ", "layout ", "moves ", "between ", "steps ", "\n"};
        char path[512];
        snprintf(path, sizeof path, "%s/train.tokens", dir);
        test_write_words(t, path, words, 6, 20000, 5);
        snprintf(path, sizeof path, "%s/gpt.json", dir);
        FILE *f = fopen(path, "w");
        CHECK(t, f != NULL, "config");
        if (f) {
            fputs("{\"n_embd\": 32, \"n_layer\": 4, \"n_head\": 4, \"n_positions\": 16, \"vocab_size\": 256, "
                  "\"resid_pdrop\": 0.1, \"attn_pdrop\": 0.1, \"embd_pdrop\": 0.1}",
                  f);
            fclose(f);
        }
    }
    CHECK_OK(t, shard_comm_barrier(t->comm), "files written");
    memcpy(g_dir, dir, sizeof dir);
}

static shard_trainer_config config(char *path, size_t bytes, int zero, const char *optimizer) {
    snprintf(path, bytes, "%s/gpt.json", g_dir);
    shard_trainer_config c = {.config_path = path,
                              .data_dir = g_dir,
                              .batch = 8,
                              .seq = 16,
                              .seed = 7,
                              .zero = zero,
                              .bucket_mb = 0.01,
                              .optimizer = optimizer,
                              .adamw = shard_adamw_defaults(),
                              .sgd = {.momentum = 0.9f},
                              .clip = 1.0f,
                              .lr = {3e-3f, 3e-4f, 2, STEPS}};
    return c;
}

/* Steps from..to of tr into losses[step - 1]; 0 when one failed. */
static int train(test_ctx *t, shard_trainer *tr, uint64_t from, uint64_t to, double *losses) {
    for (uint64_t step = from; step <= to; step++) {
        shard_step_result r;
        if (!CHECK_OK(t, shard_trainer_step(tr, step, &r), "step %llu", (unsigned long long)step)) return 0;
        losses[step - 1] = r.loss;
    }
    return 1;
}

static void reference(test_ctx *t, const char *optimizer, double *losses) {
    shard_comm *self = NULL;
    shard_mesh *mesh = NULL;
    shard_trainer *tr = NULL;
    char path[512];
    shard_trainer_config c = config(path, sizeof path, 0, optimizer);
    if (CHECK_OK(t, shard_comm_split(t->comm, t->rank, 0, &self), "split") &&
        CHECK_OK(t, shard_mesh_create(self, "data=1", &mesh), "mesh") &&
        CHECK_OK(t, shard_trainer_create(mesh, &c, &tr), "reference trainer"))
        train(t, tr, 1, STEPS, losses);
    shard_trainer_destroy(tr);
    shard_mesh_destroy(mesh);
    shard_comm_destroy(self);
}

static void compare(test_ctx *t, const double *ref, const double *got, const char *what) {
    double worst = 0;
    int at = 1;
    for (int s = 1; s <= STEPS; s++) {
        double rel = fabs(got[s - 1] - ref[s - 1]) / fabs(ref[s - 1]);
        if (rel > worst || isnan(rel)) worst = rel, at = s;
    }
    CHECK(t, worst <= 1e-5, "%s: loss at step %d is %.9g, single rank %.9g (relative %.3g > 1e-5)", what, at,
          got[at - 1], ref[at - 1], worst);
}

typedef struct move {
    const char *from;
    int from_zero;
    const char *to;
    int to_zero;
    const char *optimizer;
    int moves_bytes; /* the old layout splits the state: bytes must move */
} move;

static void case_moves(test_ctx *t) {
    if (t->size != 4) return;
    setup(t);
    static const move moves[] = {{"data=4", 0, "data=2,pipe=2", 1, NULL, 0},
                                 {"data=2,tensor=2", 3, "pipe=4", 0, NULL, 1},
                                 {"pipe=2,tensor=2", 0, "data=4", 3, NULL, 1},
                                 {"data=4", 2, "data=2,tensor=2", 0, "sgd", 1}};
    double ref[2][STEPS] = {{0}};
    reference(t, NULL, ref[0]);
    reference(t, "sgd", ref[1]);
    for (size_t k = 0; k < sizeof moves / sizeof moves[0]; k++) {
        const move *m = &moves[k];
        char path[512], what[128];
        snprintf(what, sizeof what, "%s zero %d -> %s zero %d%s", m->from, m->from_zero, m->to, m->to_zero,
                 m->optimizer ? " (sgd)" : "");
        shard_trainer_config before = config(path, sizeof path, m->from_zero, m->optimizer),
                             after = config(path, sizeof path, m->to_zero, m->optimizer);
        shard_mesh *old_mesh = NULL, *new_mesh = NULL;
        shard_trainer *tr = NULL, *moved = NULL;
        double got[STEPS] = {0};
        shard_migration_stats st = {.struct_size = sizeof st};
        if (CHECK_OK(t, shard_mesh_create(t->comm, m->from, &old_mesh), "%s: mesh", what) &&
            CHECK_OK(t, shard_mesh_create(t->comm, m->to, &new_mesh), "%s: new mesh", what) &&
            CHECK_OK(t, shard_trainer_create(old_mesh, &before, &tr), "%s: trainer", what) &&
            train(t, tr, 1, MOVE_AT, got) &&
            CHECK_OK(t, shard_trainer_migrate(tr, new_mesh, &after, &moved, &st), "%s: migrate", what)) {
            tr = NULL; /* destroyed by the move */
            CHECK(t, moved != NULL && st.ms > 0 && st.bytes >= st.rank_bytes && (!m->moves_bytes || st.bytes > 0),
                  "%s: the new trainer %p, %.3f ms, %llu bytes (%llu from this rank)", what, (void *)moved, st.ms,
                  (unsigned long long)st.bytes, (unsigned long long)st.rank_bytes);
            if (moved && train(t, moved, MOVE_AT + 1, STEPS, got)) compare(t, ref[m->optimizer != NULL], got, what);
        }
        shard_trainer_destroy(moved);
        shard_trainer_destroy(tr);
        shard_mesh_destroy(new_mesh);
        shard_mesh_destroy(old_mesh);
    }
}

static void case_refused(test_ctx *t) {
    if (t->size != 4) return;
    setup(t);
    double ref[STEPS] = {0}, got[STEPS] = {0};
    reference(t, NULL, ref);
    char path[512];
    shard_trainer_config before = config(path, sizeof path, 2, NULL), sgd = config(path, sizeof path, 0, "sgd");
    shard_mesh *old_mesh = NULL, *new_mesh = NULL, *half_mesh = NULL;
    shard_comm *half = NULL;
    shard_trainer *tr = NULL, *moved = NULL;
    if (CHECK_OK(t, shard_mesh_create(t->comm, "data=4", &old_mesh), "mesh") &&
        CHECK_OK(t, shard_mesh_create(t->comm, "data=2,pipe=2", &new_mesh), "new mesh") &&
        CHECK_OK(t, shard_comm_split(t->comm, t->rank / 2, 0, &half), "split") &&
        CHECK_OK(t, shard_mesh_create(half, "data=2", &half_mesh), "mesh of two") &&
        CHECK_OK(t, shard_trainer_create(old_mesh, &before, &tr), "trainer") && train(t, tr, 1, MOVE_AT, got)) {
        shard_status s = shard_trainer_migrate(tr, new_mesh, &sgd, &moved, NULL);
        CHECK(t, s == SHARD_ERR_INVALID_ARG && !moved && strstr(shard_last_error(), "optimizer is adamw"),
              "another optimizer: status %d, new trainer %p: %s", s, (void *)moved, shard_last_error());
        s = shard_trainer_migrate(tr, half_mesh, &before, &moved, NULL);
        CHECK(t, s == SHARD_ERR_INVALID_ARG && !moved && strstr(shard_last_error(), "the same ranks"),
              "a mesh of two ranks: status %d, new trainer %p: %s", s, (void *)moved, shard_last_error());
        if (train(t, tr, MOVE_AT + 1, STEPS, got)) compare(t, ref, got, "the old trainer after refused moves");
    }
    shard_trainer_destroy(moved);
    shard_trainer_destroy(tr);
    shard_mesh_destroy(half_mesh);
    shard_comm_destroy(half);
    shard_mesh_destroy(new_mesh);
    shard_mesh_destroy(old_mesh);
}

static void case_cleanup(test_ctx *t) {
    if (!g_dir[0]) return;
    test_remove_dir(t, g_dir);
}

static const test_case cases[] = {
    {"moves", case_moves},
    {"refused", case_refused},
    {"cleanup", case_cleanup},
};

int main(int argc, char **argv) {
    shard_blas_set_threads(1); /* the single-rank references run beside the other ranks */
    return test_main(argc, argv, "test_migrate", cases, sizeof cases / sizeof cases[0]);
}
