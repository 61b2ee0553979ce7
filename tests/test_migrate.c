/* test_migrate.c — shard_trainer_migrate: a run moved to another layout between two steps trains on as
 * if it had never moved.  Each rank also trains the single-device reference on a one-rank communicator
 * of its own.  Four ranks (other world sizes run nothing):
 *
 *   moves    a GPT with dropout, 16 steps, moved after step 6: data=4 ZeRO-0 -> data=2,pipe=2 ZeRO-1,
 *            data=4 ZeRO-3 -> data=2,pipe=2 ZeRO-1, data=2,tensor=2 ZeRO-3 -> pipe=4, pipe=2,tensor=2 ->
 *            data=4 ZeRO-3 (and SGD with momentum: data=4 ZeRO-2 -> data=2,tensor=2): losses within 1e-5
 *            relative of one rank's, the stats' time and bytes set (bytes where the old layout split the
 *            state); the first two moves' bytes are exactly what each rank lacked of its new pieces (none
 *            from data=4 ZeRO-0, where every rank held everything; at most the state once from ZeRO-3) and
 *            the values arrive bit for bit
 *   refused  a new layout with another optimizer, and a new mesh over other ranks: the same error on
 *            every rank, no new trainer, and the old one trains on to the reference's losses
 *   live     the same moves live (the plan and the pieces over steps), bit for bit a stop-and-copy's
 *   live_bf16  with gradients reduced in bf16: the replayed gradients travel as bf16 exactly (half the
 *            bytes), the losses bit for bit a stop-and-copy's */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard/shard.h"
#include "shard/split.h"

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
    int exact;       /* no tensor axis: the bytes are exactly what each rank lacked, and the values bit-equal */
} move;

/* The old layout's holdings of this rank, kept past the move (the old trainer goes with it): each
 * parameter's name and slab range, and which slab elements this rank holds of the values (which 0) or
 * of an optimizer state array (which 1), ZeRO's even cut of each unit over the data ranks. */
typedef struct holding {
    size_t count, total;
    shard_param_info *info;
    unsigned char *held[2];
    float *values;
} holding;

static void holding_free(holding *h) {
    free(h->info), free(h->held[0]), free(h->held[1]), free(h->values);
    memset(h, 0, sizeof *h);
}

/* What rank `coord` of D data ranks holds of trainer tr's slab under ZeRO stage zero. */
static int holding_of(shard_trainer *tr, int zero, int coord, int D, holding *h) {
    const shard_model *m = shard_trainer_model(tr);
    h->count = m->params->count, h->total = m->params->total;
    h->info = malloc((h->count + 1) * sizeof *h->info);
    h->values = malloc((h->total + 1) * sizeof *h->values);
    for (int a = 0; a < 2; a++) h->held[a] = calloc(h->total + 1, 1);
    if (!h->info || !h->values || !h->held[0] || !h->held[1]) return 0;
    memcpy(h->info, m->params->info, h->count * sizeof *h->info);
    for (size_t u = 0; u < m->units; u++) {
        size_t first, count, n = m->unit_offset[u + 1] - m->unit_offset[u];
        shard_split_even(n, (size_t)D, (size_t)coord, &first, &count);
        for (int a = 0; a < 2; a++) {
            int whole = a == 0 ? zero < 3 : zero == 0;
            size_t lo = m->unit_offset[u] + (whole ? 0 : first), hi = whole ? m->unit_offset[u + 1] : lo + count;
            memset(h->held[a] + lo, 1, hi - lo);
        }
    }
    return 1;
}

/* Bytes this rank needs under `now` that it did not hold under `was` (the values and AdamW's two moments,
 * f32), and whether its values are bit for bit the old ones. */
static uint64_t lacked(const holding *was, const holding *now, int *same) {
    uint64_t elems = 0;
    *same = 1;
    for (size_t i = 0; i < now->count; i++) {
        const shard_param_info *n = &now->info[i], *o = NULL;
        for (size_t k = 0; k < was->count && !o; k++)
            if (strcmp(was->info[k].name, n->name) == 0) o = &was->info[k];
        if (!o) continue; /* another stage's before: every element of it was lacked (not in these moves) */
        for (size_t e = 0; e < n->numel; e++) {
            elems += now->held[0][n->offset + e] && !was->held[0][o->offset + e];
            elems += 2 * (size_t)(now->held[1][n->offset + e] && !was->held[1][o->offset + e]);
        }
        *same &= memcmp(now->values + n->offset, was->values + o->offset, n->numel * sizeof(float)) == 0;
    }
    return elems * sizeof(float);
}

/* The moves both ways of migrating are checked on. */
static const move MOVES[] = {{"data=4", 0, "data=2,pipe=2", 1, NULL, 0, 1},
                             {"data=4", 3, "data=2,pipe=2", 1, NULL, 1, 1},
                             {"data=2,tensor=2", 3, "pipe=4", 0, NULL, 1, 0},
                             {"pipe=2,tensor=2", 0, "data=4", 3, NULL, 1, 0},
                             {"data=4", 2, "data=2,tensor=2", 0, "sgd", 1, 0}};
#define N_MOVES (sizeof MOVES / sizeof MOVES[0])

/* Move k's name and both sides' trainer configs; ref[0] AdamW's and ref[1] SGD's single-rank losses
 * when asked (ref non-NULL, k 0). */
static void move_setup(test_ctx *t, size_t k, const char *how, char *what, size_t what_bytes, char *path,
                       size_t path_bytes, shard_trainer_config *before, shard_trainer_config *after,
                       double ref[2][STEPS]) {
    const move *m = &MOVES[k];
    if (k == 0) reference(t, NULL, ref[0]), reference(t, "sgd", ref[1]);
    snprintf(what, what_bytes, "%s%s zero %d -> %s zero %d%s", how, m->from, m->from_zero, m->to, m->to_zero,
             m->optimizer ? " (sgd)" : "");
    *before = config(path, path_bytes, m->from_zero, m->optimizer);
    *after = config(path, path_bytes, m->to_zero, m->optimizer);
}

static void case_moves(test_ctx *t) {
    if (t->size != 4) return;
    setup(t);
    double ref[2][STEPS] = {{0}};
    for (size_t k = 0; k < N_MOVES; k++) {
        const move *m = &MOVES[k];
        char path[512], what[128];
        shard_trainer_config before, after;
        move_setup(t, k, "", what, sizeof what, path, sizeof path, &before, &after, ref);
        shard_mesh *old_mesh = NULL, *new_mesh = NULL;
        shard_trainer *tr = NULL, *moved = NULL;
        double got[STEPS] = {0};
        shard_migration_stats st = {.struct_size = sizeof st};
        holding was = {0}, now = {0};
        if (CHECK_OK(t, shard_mesh_create(t->comm, m->from, &old_mesh), "%s: mesh", what) &&
            CHECK_OK(t, shard_mesh_create(t->comm, m->to, &new_mesh), "%s: new mesh", what) &&
            CHECK_OK(t, shard_trainer_create(old_mesh, &before, &tr), "%s: trainer", what) &&
            train(t, tr, 1, MOVE_AT, got) &&
            (!m->exact ||
             CHECK(t,
                   holding_of(tr, m->from_zero, t->rank, 4, &was) && shard_trainer_values(tr, was.values) == SHARD_OK,
                   "%s: the old layout", what)) &&
            CHECK_OK(t, shard_trainer_migrate(tr, new_mesh, &after, &moved, &st), "%s: migrate", what)) {
            tr = NULL; /* destroyed by the move */
            CHECK(t, moved != NULL && st.ms > 0 && st.bytes >= st.rank_bytes && (!m->moves_bytes || st.bytes > 0),
                  "%s: the new trainer %p, %.3f ms, %llu bytes (%llu from this rank)", what, (void *)moved, st.ms,
                  (unsigned long long)st.bytes, (unsigned long long)st.rank_bytes);
            /* the least traffic: every rank receives what it lacked, once; the values arrive bit for bit */
            int data = shard_mesh_axis_index(new_mesh, "data"), same = 1;
            int64_t mine = 0, want = 0, state = 3 * (int64_t)was.total * (int64_t)sizeof(float);
            int ready = m->exact && moved &&
                CHECK(t,
                      holding_of(moved, m->to_zero, shard_mesh_coord(new_mesh, data),
                                 shard_mesh_axis_size(new_mesh, data), &now) &&
                          shard_trainer_values(moved, now.values) == SHARD_OK,
                      "%s: the new layout", what);
            if (ready) mine = (int64_t)lacked(&was, &now, &same);
            if (ready &&
                CHECK_OK(t, shard_comm_all_reduce(t->comm, &mine, &want, 1, SHARD_I64, SHARD_OP_SUM), "%s: sum", what))
                CHECK(t, same && (int64_t)st.bytes == want && (m->moves_bytes ? want > 0 && want <= state : want == 0),
                      "%s: %llu bytes moved, the ranks lacked %lld (at most the state once: %lld); this rank's "
                      "values %s",
                      what, (unsigned long long)st.bytes, (long long)want, (long long)state,
                      same ? "the same" : "changed");
            if (moved && train(t, moved, MOVE_AT + 1, STEPS, got)) compare(t, ref[m->optimizer != NULL], got, what);
        }
        holding_free(&was), holding_free(&now);
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

/* A trainer on `from` trained to step `upto` (NULL on failure, said). */
static shard_trainer *trained(test_ctx *t, shard_mesh *mesh, const shard_trainer_config *c, uint64_t upto,
                              double *losses, const char *what) {
    shard_trainer *tr = NULL;
    if (!CHECK_OK(t, shard_trainer_create(mesh, c, &tr), "%s: trainer", what)) return NULL;
    if (train(t, tr, 1, upto, losses)) return tr;
    shard_trainer_destroy(tr);
    return NULL;
}

/* Live: begun after MOVE_AT, advanced after each of the next LIVE steps (the plan, then LIVE - 1
 * pieces), switched after the last; the losses are a stop-and-copy move's after that step, bit for bit
 * (the replayed updates are the old layout's arithmetic), and the single rank's within 1e-5.  Refusals
 * leave the old trainer training. */
enum { LIVE = 5 };
static void case_live(test_ctx *t) {
    if (t->size != 4) return;
    setup(t);
    double ref[2][STEPS] = {{0}};
    for (size_t k = 0; k < N_MOVES; k++) {
        const move *m = &MOVES[k];
        char path[512], what[128];
        shard_trainer_config before, after;
        move_setup(t, k, "live ", what, sizeof what, path, sizeof path, &before, &after, ref);
        shard_mesh *old_mesh = NULL, *new_mesh = NULL;
        shard_trainer *tr = NULL, *moved = NULL;
        shard_migration *mig = NULL;
        double live[STEPS] = {0}, stop[STEPS] = {0};
        shard_migration_stats st = {.struct_size = sizeof st};
        int ok = CHECK_OK(t, shard_mesh_create(t->comm, m->from, &old_mesh), "%s: mesh", what) &&
            CHECK_OK(t, shard_mesh_create(t->comm, m->to, &new_mesh), "%s: new mesh", what) &&
            (tr = trained(t, old_mesh, &before, MOVE_AT, live, what)) &&
            CHECK_OK(t, shard_trainer_migrate_begin(tr, new_mesh, &after, LIVE, &mig), "%s: begin", what);
        for (uint64_t step = MOVE_AT + 1; ok && step <= MOVE_AT + LIVE; step++) {
            /* all of them before the first; then no more than the advances left (the last pieces may be
             * empty when the larger early ones took every parameter) */
            size_t left = shard_migration_steps_left(mig);
            CHECK(t, left <= MOVE_AT + LIVE + 1 - step && (step > MOVE_AT + 1 || left == LIVE),
                  "%s: %zu steps left before step %llu", what, left, (unsigned long long)step);
            ok = train(t, tr, step, step, live) &&
                CHECK_OK(t, shard_migration_advance(mig, tr), "%s: advance after step %llu", what,
                         (unsigned long long)step);
            if (!ok) mig = NULL; /* gone with the failure, or cancelled below */
        }
        if (ok) CHECK(t, shard_migration_steps_left(mig) == 0, "%s: steps left at the switch", what);
        if (ok && CHECK_OK(t, shard_migration_finish(mig, tr, &moved, &st), "%s: finish", what)) {
            tr = NULL, mig = NULL;
            CHECK(t,
                  st.ms >= st.added_ms && st.added_ms >= st.longest_ms && st.longest_ms >= st.pause_ms &&
                      st.bytes >= st.delta_bytes && (!m->moves_bytes || st.delta_bytes > 0),
                  "%s: %.3f ms in all, %.3f added, %.3f at the switch; %llu bytes, %llu of gradients", what, st.ms,
                  st.added_ms, st.pause_ms, (unsigned long long)st.bytes, (unsigned long long)st.delta_bytes);
            train(t, moved, MOVE_AT + LIVE + 1, STEPS, live);
        }
        shard_migration_cancel(mig, tr);
        shard_trainer_destroy(moved);
        shard_trainer_destroy(tr);
        moved = NULL;
        if (ok && (tr = trained(t, old_mesh, &before, MOVE_AT + LIVE, stop, what)) &&
            CHECK_OK(t, shard_trainer_migrate(tr, new_mesh, &after, &moved, NULL), "%s: stop-and-copy", what)) {
            tr = NULL;
            if (train(t, moved, MOVE_AT + LIVE + 1, STEPS, stop)) {
                CHECK(t, memcmp(live, stop, sizeof live) == 0, "%s: the losses differ from stop-and-copy's", what);
                compare(t, ref[m->optimizer != NULL], live, what);
            }
        }
        shard_trainer_destroy(moved);
        shard_trainer_destroy(tr);
        shard_mesh_destroy(new_mesh);
        shard_mesh_destroy(old_mesh);
    }
    /* refused: another optimizer at the start; an advance without a step between; the run goes on */
    char path[512];
    shard_trainer_config before = config(path, sizeof path, 1, NULL), sgd = config(path, sizeof path, 0, "sgd");
    shard_mesh *old_mesh = NULL, *new_mesh = NULL;
    shard_trainer *tr = NULL;
    shard_migration *mig = NULL;
    double got[STEPS] = {0};
    if (CHECK_OK(t, shard_mesh_create(t->comm, "data=4", &old_mesh), "mesh") &&
        CHECK_OK(t, shard_mesh_create(t->comm, "data=2,pipe=2", &new_mesh), "new mesh") &&
        (tr = trained(t, old_mesh, &before, MOVE_AT, got, "refused"))) {
        shard_status s = shard_trainer_migrate_begin(tr, new_mesh, &sgd, LIVE, &mig);
        CHECK(t, s == SHARD_ERR_INVALID_ARG && !mig && strstr(shard_last_error(), "optimizer is adamw"),
              "live, another optimizer: status %d: %s", s, shard_last_error());
        if (CHECK_OK(t, shard_trainer_migrate_begin(tr, new_mesh, &before, LIVE, &mig), "begin") &&
            train(t, tr, MOVE_AT + 1, MOVE_AT + 1, got) && CHECK_OK(t, shard_migration_advance(mig, tr), "advance")) {
            s = shard_migration_advance(mig, tr); /* no step since the last one */
            CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "advance after each step"),
                  "an advance without a step: status %d: %s", s, shard_last_error());
        }
        if (train(t, tr, MOVE_AT + 2, STEPS, got)) compare(t, ref[0], got, "the old trainer after refused live moves");
    }
    shard_trainer_destroy(tr);
    shard_mesh_destroy(new_mesh);
    shard_mesh_destroy(old_mesh);
}

/* Live with gradients reduced in bf16 (data=2,tensor=2 -> pipe=4): each step's gradients travel as bf16,
 * exactly (at most half the f32 run's gradient bytes), and the losses are a stop-and-copy move's bit for
 * bit. */
static void live_run(test_ctx *t, shard_dtype grad_dtype, int live, double *losses, uint64_t *delta_bytes) {
    char path[512];
    shard_trainer_config c = config(path, sizeof path, 0, NULL);
    c.grad_dtype = grad_dtype;
    shard_trainer_config after = c;
    after.schedule = "1f1b", after.micro_batches = 4;
    shard_mesh *old_mesh = NULL, *new_mesh = NULL;
    shard_trainer *tr = NULL, *moved = NULL;
    shard_migration *mig = NULL;
    shard_migration_stats st = {.struct_size = sizeof st};
    int ok = CHECK_OK(t, shard_mesh_create(t->comm, "data=2,tensor=2", &old_mesh), "bf16: mesh") &&
        CHECK_OK(t, shard_mesh_create(t->comm, "pipe=4", &new_mesh), "bf16: new mesh") &&
        (tr = trained(t, old_mesh, &c, live ? MOVE_AT : MOVE_AT + LIVE, losses, "bf16"));
    if (ok && live) {
        ok = CHECK_OK(t, shard_trainer_migrate_begin(tr, new_mesh, &after, LIVE, &mig), "bf16: begin");
        for (uint64_t step = MOVE_AT + 1; ok && step <= MOVE_AT + LIVE; step++)
            if (!(ok = train(t, tr, step, step, losses) &&
                      CHECK_OK(t, shard_migration_advance(mig, tr), "bf16: advance")))
                mig = NULL;
        ok = ok && CHECK_OK(t, shard_migration_finish(mig, tr, &moved, &st), "bf16: finish");
    } else if (ok)
        ok = CHECK_OK(t, shard_trainer_migrate(tr, new_mesh, &after, &moved, &st), "bf16: stop-and-copy");
    if (ok) {
        tr = NULL, mig = NULL;
        *delta_bytes = st.delta_bytes;
        train(t, moved, MOVE_AT + LIVE + 1, STEPS, losses);
    }
    shard_migration_cancel(mig, tr);
    shard_trainer_destroy(moved);
    shard_trainer_destroy(tr);
    shard_mesh_destroy(new_mesh);
    shard_mesh_destroy(old_mesh);
}

static void case_live_bf16(test_ctx *t) {
    if (t->size != 4) return;
    setup(t);
    double f32[STEPS] = {0}, bf16[STEPS] = {0}, stop[STEPS] = {0};
    uint64_t f32_bytes = 0, bf16_bytes = 0, none = 0;
    live_run(t, SHARD_F32, 1, f32, &f32_bytes);
    live_run(t, SHARD_BF16, 1, bf16, &bf16_bytes);
    live_run(t, SHARD_BF16, 0, stop, &none);
    /* 2 bytes an element instead of 4, over no more elements (the pieces, sized for cheaper gradients,
     * are no larger early on) */
    CHECK(t, f32_bytes > 0 && bf16_bytes > 0 && bf16_bytes * 2 <= f32_bytes,
          "bf16 gradients: %llu gradient bytes, f32 gradients %llu (want at most half)", (unsigned long long)bf16_bytes,
          (unsigned long long)f32_bytes);
    CHECK(t, memcmp(bf16, stop, sizeof stop) == 0,
          "bf16 gradients: the live move's losses differ from stop-and-copy's");
}

static void case_cleanup(test_ctx *t) {
    if (!g_dir[0]) return;
    test_remove_dir(t, g_dir);
}

static const test_case cases[] = {
    {"moves", case_moves},         {"refused", case_refused}, {"live", case_live},
    {"live_bf16", case_live_bf16}, {"cleanup", case_cleanup},
};

int main(int argc, char **argv) {
    shard_blas_set_threads(1); /* the single-rank references run beside the other ranks */
    return test_main(argc, argv, "test_migrate", cases, sizeof cases / sizeof cases[0]);
}
