/* bench_reshard.c — `shard bench reshard`: what moving a running job to another layout costs.  For each
 * transition of a fixed list (the moves the resharding tests prove equal to never moving), 4 thread
 * ranks train one step on the old layout (so the optimizer's state exists), then move to the new one by
 * shard_trainer_migrate and train one more step there; repeated, the median of the migration's time (the
 * slowest rank's, the new trainer's creation included) and the bytes it sent.  Stop-and-copy pauses
 * training for the whole migration, so its pause and its total are the same time.  Then the same move
 * live (shard_trainer_migrate_begin, an advance after each of --live-steps more old-layout steps, the switch):
 * its pause is the longest wait at one step boundary (the begin, an advance, the switch), its added
 * time what all of them added to steps, its total the time from the begin to the switch (the steps
 * between included), its bytes the snapshot's and the gradients'.
 *
 *   shard bench reshard [--config FILE] [--batch B] [--seq S] [--grad-dtype f32|bf16] [--cluster FILE]
 *                       [--live-steps N] [--repeats R] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_train.h"
#include "cli_util.h"
#include "profile.h"

static const char *const USAGE =
    "usage: shard bench reshard [--config FILE] [--batch B] [--seq S] [--grad-dtype f32|bf16] [--cluster FILE]\n"
    "                           [--live-steps N] [--repeats R] [--json]\n"
    "\n"
    "What moving a running job to another layout costs: for each transition (data=4 -> data=2,pipe=2;\n"
    "data=2,tensor=2 -> pipe=4; ZeRO-3 on data=4 -> ZeRO-1 on data=2,pipe=2), 4 thread ranks train a\n"
    "step on the old layout, move to the new one (shard train --reshard-at's migration: stop-and-copy\n"
    "over the communicator, each new owner sent only what it lacked) and train a step there. Reports\n"
    "the bytes moved and the median over --repeats of the pause training sees and the migration's\n"
    "total time (the same for stop-and-copy), beside the median step time for scale; then the same\n"
    "move live (train --migration live: the new trainer built, then over --live-steps steps while\n"
    "training goes on the copy planned and the state sent in pieces, each step's gradients replayed\n"
    "on the copy): pause the longest wait at one step boundary, added what all of them\n"
    "added to steps, total from its start to the switch, bytes the state's and the gradients'.\n"
    "\n"
    "options:\n"
    "  --config FILE            the GPT (default configs/gpt-bench.json)\n"
    "  --batch B                global batch rows, 4..4096 (default 8)\n"
    "  --seq S                  tokens per row, 1..4096 (default 64)\n"
    "  --grad-dtype f32|bf16    the gradients' dtype on the data axis (default f32); with bf16 a live\n"
    "                           move sends the replayed gradients as bf16 too, exactly\n"
    "  --cluster FILE           the ranks on this emulated cluster's devices (its links delay the bytes\n"
    "                           moved, its rates pad the steps: a move over a slow network)\n"
    "  --live-steps N           the steps a live move spans, 1..64 (default 5, as train's)\n"
    "  --repeats R              moves per transition, 1..100 (default 5)\n"
    "  --json                   one JSON object per transition and migration: from, to, migration,\n"
    "                           bytes, pause_ms, total_ms, step_ms, added_ms (every step boundary's\n"
    "                           wait, summed), switch_ms (the switch's own wait), longest_ms (=\n"
    "                           pause_ms), delta_bytes (the gradients' part of bytes), pause_ratio\n"
    "                           (live: its pause over the same move's stop-and-copy pause)\n";

typedef struct transition {
    const char *from, *to;
    int zero_from, zero_to;
} transition;

static const transition transitions[] = {
    {"data=4", "data=2,pipe=2", 0, 0},
    {"data=2,tensor=2", "pipe=4", 0, 0},
    {"data=4", "data=2,pipe=2", 3, 1},
};
#define TRANSITIONS ((int)(sizeof transitions / sizeof transitions[0]))

typedef struct reshard_run {
    const shard_trainer_config *tc;
    const transition *x;
    int repeats, live, live_steps;
    const shard_cluster *cluster;                                 /* NULL: none */
    double *pause_ms, *step_ms, *total_ms, *switch_ms, *added_ms; /* per repeat, rank 0's */
    uint64_t bytes, delta_bytes;
} reshard_run;

/* Collective: t (after step 1) moved live to new_mesh over `steps` more steps; *moved the new trainer
 * (t destroyed) or, on failure, NULL and t left as it was. */
static shard_status move_live(shard_trainer *t, shard_mesh *new_mesh, const shard_trainer_config *to, int steps,
                              shard_trainer **moved, shard_migration_stats *st) {
    shard_migration *m = NULL;
    shard_step_result res;
    SHARD_CHECK(shard_trainer_migrate_begin(t, new_mesh, to, (size_t)steps, &m));
    for (uint64_t step = 2; step < 2 + (uint64_t)steps; step++) {
        shard_status s = shard_trainer_step(t, step, &res);
        if (s < 0) {
            shard_migration_cancel(m, t);
            return s;
        }
        SHARD_CHECK(shard_migration_advance(m, t)); /* on failure the migration is gone */
    }
    return shard_migration_finish(m, t, moved, st);
}

/* The trainer config of one side of a transition: the run's, with its ZeRO stage (and a pipeline's
 * schedule: 1F1B over as many micro-batches as stages). */
static shard_trainer_config side_config(const shard_trainer_config *tc, const char *mesh, int zero) {
    shard_trainer_config c = *tc;
    c.zero = zero;
    const char *pipe = strstr(mesh, "pipe=");
    if (pipe) c.schedule = "1f1b", c.micro_batches = (size_t)atoi(pipe + 5);
    return c;
}

static shard_status reshard_rank(shard_comm *world, void *arg) {
    reshard_run *r = arg;
    SHARD_CHECK(shard_share_cores(world));
    shard_trainer_config from = side_config(r->tc, r->x->from, r->x->zero_from);
    shard_trainer_config to = side_config(r->tc, r->x->to, r->x->zero_to);
    shard_status s = SHARD_OK;
    for (int k = 0; k < r->repeats && s == SHARD_OK; k++) {
        shard_mesh *old_mesh = NULL, *new_mesh = NULL;
        shard_trainer *t = NULL, *moved = NULL;
        shard_step_result res;
        shard_migration_stats st = {.struct_size = sizeof st};
        s = shard_mesh_create(world, r->x->from, &old_mesh);
        if (s == SHARD_OK) s = shard_mesh_create(world, r->x->to, &new_mesh);
        if (s == SHARD_OK) s = shard_trainer_create(old_mesh, &from, &t);
        if (s == SHARD_OK) s = shard_trainer_step(t, 1, &res);
        if (s == SHARD_OK) s = shard_comm_barrier(world);
        if (s == SHARD_OK)
            s = r->live ? move_live(t, new_mesh, &to, r->live_steps, &moved, &st)
                        : shard_trainer_migrate(t, new_mesh, &to, &moved, &st);
        if (s == SHARD_OK) t = NULL; /* the migration destroyed it */
        double step = 0;
        if (s == SHARD_OK) s = shard_trainer_step(moved, r->live ? 2 + (uint64_t)r->live_steps : 2, &res);
        if (s == SHARD_OK) step = res.ms;
        if (s == SHARD_OK) s = shard_comm_all_reduce(world, &step, &step, 1, SHARD_F64, SHARD_OP_MAX);
        if (s == SHARD_OK && shard_comm_rank(world) == 0) {
            r->pause_ms[k] = st.longest_ms, r->total_ms[k] = st.ms, r->switch_ms[k] = st.pause_ms, r->step_ms[k] = step;
            r->added_ms[k] = st.added_ms;
            r->bytes = st.bytes, r->delta_bytes = st.delta_bytes;
        }
        shard_trainer_destroy(moved);
        shard_trainer_destroy(t);
        shard_mesh_destroy(new_mesh);
        shard_mesh_destroy(old_mesh);
    }
    return s;
}

int cli_bench_reshard(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 0);
    const char *config_arg = NULL;
    long batch = 8, seq = 64, repeats = 5;
    long live_steps = 5;
    int json = 0;
    shard_dtype grad_dtype = SHARD_F32;
    const char *cluster_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--config") == 0) {
            if (!(config_arg = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--cluster") == 0) {
            if (!(cluster_file = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--live-steps") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 64, &live_steps)) return 2;
        } else if (strcmp(a, "--grad-dtype") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0) {
                cli_error("--grad-dtype '%s' is invalid: give f32 or bf16", v);
                return 2;
            }
            grad_dtype = v[0] == 'b' ? SHARD_BF16 : SHARD_F32;
        } else if (strcmp(a, "--batch") == 0 || strcmp(a, "--seq") == 0 || strcmp(a, "--repeats") == 0) {
            long *into = a[2] == 'b' ? &batch : a[2] == 's' ? &seq : &repeats;
            long lo = a[2] == 'b' ? 4 : 1, hi = a[2] == 'r' ? 100 : 4096;
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, lo, hi, into)) return 2;
        } else {
            cli_unknown_option("bench reshard", a, USAGE);
            return 2;
        }
    }
    char config[512], dir[256] = "";
    if (config_arg)
        snprintf(config, sizeof config, "%s", config_arg);
    else
        snprintf(config, sizeof config, "%s/configs/gpt-bench.json", SHARD_SOURCE_DIR);
    shard_gpt_config gc;
    shard_cluster *cluster = NULL;
    double *ms = calloc(5 * (size_t)repeats, sizeof *ms);
    shard_status s = ms ? bench_random_tokens(config, &gc, dir, sizeof dir)
                        : shard_error(SHARD_ERR_NO_MEMORY, "bench reshard: out of memory");
    if (s == SHARD_OK && cluster_file) s = shard_cluster_load(cluster_file, &cluster);
    shard_trainer_config tc = {.config_path = config,
                               .data_dir = dir,
                               .batch = (size_t)batch,
                               .seq = (size_t)seq,
                               .seed = 1,
                               .bucket_mb = 25,
                               .grad_dtype = grad_dtype,
                               .adamw = shard_adamw_defaults(),
                               .clip = 1.0f};
    tc.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 100000};
    if (s == SHARD_OK && !json)
        printf("%-28s %-28s %-14s %12s %10s %10s %10s %10s\n", "from", "to", "migration", "bytes", "pause_ms",
               "added_ms", "total_ms", "step_ms");
    double stop_pause = 0; /* the transition's stop-and-copy pause, for the live row's ratio */
    for (int i = 0; i < 2 * TRANSITIONS && s == SHARD_OK; i++) {
        const transition *x = &transitions[i / 2];
        reshard_run run = {.tc = &tc,
                           .x = x,
                           .repeats = (int)repeats,
                           .live = i % 2,
                           .live_steps = (int)live_steps,
                           .cluster = cluster,
                           .pause_ms = ms,
                           .step_ms = ms + repeats,
                           .total_ms = ms + 2 * repeats,
                           .switch_ms = ms + 3 * repeats,
                           .added_ms = ms + 4 * repeats};
        shard_launch_config lc = shard_launch_config_default();
        lc.ranks = 4, lc.backend = SHARD_BACKEND_THREADS, lc.cluster = cluster;
        s = shard_launch_with(&lc, reshard_rank, &run);
        if (s < 0) break;
        double pause = cli_median(run.pause_ms, (int)repeats), step = cli_median(run.step_ms, (int)repeats);
        double total = cli_median(run.total_ms, (int)repeats), wait = cli_median(run.switch_ms, (int)repeats);
        double added = cli_median(run.added_ms, (int)repeats);
        if (!run.live) stop_pause = pause;
        char ratio[48] = "";
        if (run.live && stop_pause > 0) snprintf(ratio, sizeof ratio, ", \"pause_ratio\": %.4f", pause / stop_pause);
        const char *how = run.live ? "live" : "stop-and-copy";
        char from[64], to[64];
        snprintf(from, sizeof from, "%s zero=%d", x->from, x->zero_from);
        snprintf(to, sizeof to, "%s zero=%d", x->to, x->zero_to);
        if (json)
            printf("{\"from\": \"%s\", \"to\": \"%s\", \"migration\": \"%s\", \"bytes\": %llu, "
                   "\"pause_ms\": %.4f, \"total_ms\": %.4f, \"step_ms\": %.4f, \"added_ms\": %.4f, "
                   "\"switch_ms\": %.4f, \"longest_ms\": %.4f, \"delta_bytes\": %llu%s}\n",
                   from, to, how, (unsigned long long)run.bytes, pause, total, step, added, wait, pause,
                   (unsigned long long)run.delta_bytes, ratio);
        else
            printf("%-28s %-28s %-14s %12llu %10.2f %10.2f %10.2f %10.2f\n", from, to, how,
                   (unsigned long long)run.bytes, pause, added, total, step);
        fflush(stdout);
    }
    if (dir[0]) bench_remove_dir(dir);
    shard_cluster_destroy(cluster);
    free(ms);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}
