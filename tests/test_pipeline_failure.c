/* test_pipeline_failure.c — a pipeline rank whose stage fails mid-step ends
 * the job at once with its own error, on the threads backend.
 *
 * Its neighbour may be waiting for a message the failed rank will never send
 * (GPipe: rank 0's last forward fails while rank 1 waits for that activation
 * and rank 0 has posted the receive for B0's gradient; 1F1B with one
 * micro-batch: rank 0's only forward).  Before the fix the failed rank waited
 * on its posted receives until the deadline and the job reported a timeout in
 * place of the cause.  Each scenario is its own job (an abort ends the job),
 * so this test launches its own worlds instead of using the multi-rank
 * harness.  The deadline is 60 s; each job must end within 15 s, naming the
 * injected failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shard/shard.h"

static char g_dir[64];
static int g_failures;

typedef struct scenario {
    const char *schedule;
    size_t micro_batches;
    int fail_rank, fail_call; /* that rank's fail_call-th forward_range fails */
} scenario;

static _Thread_local shard_model_ops g_patched;
static _Thread_local shard_model_pipe_ops g_patched_pipe;
static _Thread_local const shard_model_pipe_ops *g_original;
static _Thread_local int g_calls, g_fail_call;

static shard_status failing_forward(shard_model *m, float *acts, size_t first, size_t last, const float *in, float *out,
                                    double denominator, double *loss) {
    if (++g_calls == g_fail_call) return shard_error(SHARD_ERR_IO, "injected stage failure at forward %d", g_calls);
    return g_original->forward_range(m, acts, first, last, in, out, denominator, loss);
}

static shard_status rank_fn(shard_comm *world, void *arg) {
    const scenario *sc = arg;
    char config[128];
    snprintf(config, sizeof config, "%s/gpt.json", g_dir);
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_mesh_create(world, "pipe=2", &mesh));
    shard_trainer_config c = {.config_path = config,
                              .data_dir = g_dir,
                              .batch = 8,
                              .seq = 16,
                              .seed = 1,
                              .adamw = shard_adamw_defaults(),
                              .schedule = sc->schedule,
                              .micro_batches = sc->micro_batches};
    c.lr = (shard_lr_schedule){1e-3f, 1e-3f, 0, 10};
    shard_trainer *t = NULL;
    shard_status s = shard_trainer_create(mesh, &c, &t);
    if (s == SHARD_OK && shard_comm_rank(world) == sc->fail_rank) {
        shard_model *m = shard_trainer_model(t);
        g_original = m->ops->pipe, g_patched = *m->ops, g_patched_pipe = *m->ops->pipe;
        g_patched_pipe.forward_range = failing_forward, g_patched.pipe = &g_patched_pipe;
        g_calls = 0, g_fail_call = sc->fail_call;
        m->ops = &g_patched;
    }
    shard_step_result r;
    if (s == SHARD_OK) s = shard_trainer_step(t, 1, &r);
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    return s;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int write_inputs(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/shard-ppfail-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    char path[128];
    snprintf(path, sizeof path, "%s/gpt.json", g_dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"n_embd\": 32, \"n_layer\": 4, \"n_head\": 4, \"n_positions\": 16, \"vocab_size\": 256}");
    fclose(f);
    enum { N = 4096 };
    static uint32_t tokens[N];
    for (size_t i = 0; i < N; i++) tokens[i] = (uint32_t)("pipes fail\n"[i % 11]);
    snprintf(path, sizeof path, "%s/train.tokens", g_dir);
    return shard_tokens_write(path, tokens, N, 256) == SHARD_OK ? 0 : -1;
}

static void run(const scenario *sc) {
    shard_launch_config cfg = shard_launch_config_default();
    cfg.ranks = 2, cfg.backend = SHARD_BACKEND_THREADS, cfg.timeout_seconds = 60;
    double t0 = now();
    shard_status s = shard_launch_with(&cfg, rank_fn, (void *)sc);
    double took = now() - t0;
    const char *error = s < 0 ? shard_last_error() : "";
    int ok = s < 0 && strstr(error, "injected stage failure") != NULL && took < 15;
    printf("%s %s, %zu micro-batches, rank %d's forward %d fails: status %d after %.1f s: %s\n", ok ? "ok  " : "FAIL",
           sc->schedule, sc->micro_batches, sc->fail_rank, sc->fail_call, (int)s, took, error);
    g_failures += !ok;
}

int main(void) {
    if (write_inputs() != 0) {
        fprintf(stderr, "FAIL: cannot write the inputs under %s\n", g_dir);
        return 1;
    }
    shard_blas_set_threads(1);
    static const scenario scenarios[] = {
        {"gpipe", 4, 0, 4}, /* rank 1 waits for F3's activation; rank 0 has posted B0's gradient receive */
        {"1f1b", 1, 0, 1},  /* the only forward */
        {"1f1b", 4, 1, 3},  /* the last stage, mid-schedule */
        {"gpipe", 4, 0, 1}, /* the first forward (returned at once before the fix too) */
    };
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) run(&scenarios[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
    return g_failures ? 1 : 0;
}
