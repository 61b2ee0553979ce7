/* train_adaptive.c — see train_adaptive.h.
 *
 * The figures are the trainer's step monitor's, summed on each rank over the steps since the last check
 * and gathered to every rank at a check: imbalance is shard_imbalance of the ranks' compute time (the
 * monitor's definition), memory pressure the highest step peak over the device's available memory at
 * that step (only on a cluster: without one no capacity is known), communication the largest share of
 * a rank's wall time its exposed communication took.
 *
 * Why two checks in a row: one window can hold a passing hiccup (a first step's warm-up, the host busy
 * elsewhere); a re-plan and a move cost far more than a check.
 *
 * The re-plan prices the layouts on a copy of the cluster whose devices run at the ranks' measured
 * speeds (rows per compute second), relative to the fastest rank, taken to run at its declared rate:
 * what the monitor saw, not what the description promised.  The current layout is priced on the same
 * copy by the engine's dry run, so that the gain compares two predictions of one model.  Plans within
 * ADAPTIVE_TIE of the fastest are a tie, broken for the one closest to the current layout (the same ZeRO
 * stage, then the same mesh): the model's small differences are not worth moving more state.  The re-plan
 * runs on a thread of its own: a rank's thread computes at its emulated device's rate and counts its
 * allocations against the device's memory, and the planner's dry runs are the host's work, not the
 * rank's. */
#include "train_adaptive.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

static const char *const TRIGGER_NAMES[ADAPTIVE_TRIGGERS] = {"imbalance", "memory", "comm"};
static const double DEFAULT_THRESHOLDS[ADAPTIVE_TRIGGERS] = {0.25, 0.9, 0.4};
static const double MOST_THRESHOLDS[ADAPTIVE_TRIGGERS] = {100, 1, 1}; /* each in (0, most] */

void train_adaptive_defaults(double threshold[ADAPTIVE_TRIGGERS]) {
    memcpy(threshold, DEFAULT_THRESHOLDS, sizeof DEFAULT_THRESHOLDS);
}

int train_adaptive_parse(const char *text, double threshold[ADAPTIVE_TRIGGERS]) {
    memset(threshold, 0, sizeof(double) * ADAPTIVE_TRIGGERS);
    char copy[256];
    if (!text[0] || strlen(text) >= sizeof copy) {
        cli_error("--reshard-on '%s' is invalid: give NAME=THRESHOLD,... with names imbalance, memory and comm, e.g. "
                  "imbalance=0.25,memory=0.9,comm=0.4",
                  text);
        return -1;
    }
    snprintf(copy, sizeof copy, "%s", text);
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (eq) *eq = '\0';
        int k = 0;
        while (k < ADAPTIVE_TRIGGERS && strcmp(item, TRIGGER_NAMES[k]) != 0) k++;
        if (k == ADAPTIVE_TRIGGERS) {
            const char *near = shard_text_nearest(item, TRIGGER_NAMES, ADAPTIVE_TRIGGERS);
            cli_error("--reshard-on: unknown trigger '%s'%s%s%s: give imbalance, memory or comm", item,
                      near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
            return -1;
        }
        double v = 0;
        if (!eq || !cli_number(eq + 1, &v) || !(v > 0) || v > MOST_THRESHOLDS[k]) {
            cli_error("--reshard-on: %s=%s is invalid: give a threshold in (0, %g], e.g. %s=%g", item, eq ? eq + 1 : "",
                      MOST_THRESHOLDS[k], item, DEFAULT_THRESHOLDS[k]);
            return -1;
        }
        if (threshold[k] > 0) {
            cli_error("--reshard-on: %s is given twice: give each trigger once", item);
            return -1;
        }
        threshold[k] = v;
    }
    return 0;
}

void train_adaptive_start(train_adaptive *a, const double threshold[ADAPTIVE_TRIGGERS], long every,
                          const shard_cluster *cluster, const shard_trainer_config *config, const char *mesh) {
    memset(a, 0, sizeof *a);
    memcpy(a->threshold, threshold, sizeof a->threshold);
    a->every = every > 0 ? (uint64_t)every : 10;
    a->cluster = cluster;
    a->config = *config;
    a->current_plan = -1;
    snprintf(a->mesh, sizeof a->mesh, "%s", mesh);
}

shard_status train_adaptive_record(train_adaptive *a, const shard_trainer *t) {
    shard_step_monitor m;
    SHARD_CHECK(shard_trainer_step_monitor(t, &m));
    double exposed = 0, peak = 0;
    for (size_t i = 0; i < m.comms; i++) exposed += m.comm[i].exposed_s;
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++) peak += (double)m.peak_bytes[c];
    a->window[0] += m.compute_s, a->window[1] += exposed, a->window[2] += m.wall_s;
    if (peak > a->window[3]) a->window[3] = peak;
    return SHARD_OK;
}

/* The current layout as a candidate's fields, for its text. */
static void current_text(const train_adaptive *a, char *out, size_t bytes) {
    if (a->current_plan >= 0) {
        shard_plan_candidate_text(&a->plan[a->current_plan], out, bytes);
        return;
    }
    const shard_trainer_config *tc = &a->config;
    shard_plan_candidate c = {.zero = tc->zero,
                              .recompute = tc->recompute,
                              .sequence_parallel = tc->sequence_parallel,
                              .micro_batches = tc->micro_batches,
                              .virtual_stages = tc->virtual_stages};
    snprintf(c.mesh, sizeof c.mesh, "%s", a->mesh);
    snprintf(c.schedule, sizeof c.schedule, "%s", tc->schedule ? tc->schedule : "");
    snprintf(c.layers_per_stage, sizeof c.layers_per_stage, "%s", tc->layers_per_stage ? tc->layers_per_stage : "");
    snprintf(c.batch_shares, sizeof c.batch_shares, "%s", tc->batch_shares ? tc->batch_shares : "");
    if (tc->grad_dtype == SHARD_BF16) snprintf(c.grad_dtype, sizeof c.grad_dtype, "bf16");
    shard_plan_candidate_text(&c, out, bytes);
}

/* This rank's rows of the global batch, relative (1 with even shares): what its compute time is for. */
static double rank_rows(const train_adaptive *a, const shard_mesh *mesh) {
    int axis = shard_mesh_axis_index(mesh, "data");
    if (!a->config.batch_shares || axis < 0) return 1;
    int at = shard_mesh_coord(mesh, axis);
    const char *p = a->config.batch_shares;
    for (int i = 0; i < at && p; i++) p = strchr(p, ','), p = p ? p + 1 : NULL;
    double rows = p ? strtod(p, NULL) : 1;
    return rows > 0 ? rows : 1;
}

enum { FIELDS = 5 }; /* gathered per rank: compute, comm, wall, peak bytes, rows */

/* Rank 0: the cluster re-priced with the measured speeds (all: FIELDS per rank), its first `world` ranks
 * on the run's devices. */
static shard_status measured_cluster(const train_adaptive *a, int world, const double *all, shard_cluster **out) {
    *out = NULL;
    shard_cluster *c = NULL;
    SHARD_CHECK(shard_cluster_copy(a->cluster, &c));
    int devices = shard_cluster_devices(c);
    double *rate = calloc((size_t)devices, sizeof *rate);
    size_t *map = calloc((size_t)world, sizeof *map);
    shard_status s = rate && map ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "--adaptive: out of memory");
    for (int r = 0; s == SHARD_OK && r < world; r++) { /* the run's device map, before it is undone below */
        shard_cluster_device d;
        s = shard_cluster_rank_device(c, r, &d);
        map[r] = (size_t)d.device;
    }
    if (s == SHARD_OK) s = shard_cluster_set_device_map(c, NULL);
    for (int i = 0; s == SHARD_OK && i < devices; i++) { /* in order: rank i is device i, at its declared rate */
        shard_cluster_device d;
        s = shard_cluster_rank_device(c, i, &d);
        rate[i] = d.compute_tflops;
    }
    int fastest = -1;
    double speed_of_fastest = 0;
    for (int r = 0; r < world; r++) {
        const double *v = all + r * FIELDS;
        if (v[0] > 0 && v[4] / v[0] > speed_of_fastest) fastest = r, speed_of_fastest = v[4] / v[0];
    }
    if (s == SHARD_OK && fastest >= 0) {
        double declared = rate[map[fastest]];
        for (int r = 0; r < world; r++) {
            const double *v = all + r * FIELDS;
            if (v[0] > 0) rate[map[r]] = declared * (v[4] / v[0]) / speed_of_fastest;
        }
    }
    if (s == SHARD_OK) s = shard_cluster_set_device_tflops(c, rate, (size_t)devices);
    if (s == SHARD_OK) s = shard_cluster_set_device_map_array(c, map, (size_t)world);
    free(rate);
    free(map);
    if (s < 0) {
        shard_cluster_destroy(c);
        return s;
    }
    *out = c;
    return SHARD_OK;
}

/* The plan taken of a search's fitting ones: of those predicted within ADAPTIVE_TIE of the fastest (the
 * first), the closest to the current layout: the same ZeRO stage first, then the same mesh, then the
 * faster; *ties the plans within it. */
static size_t closest_of_ties(const train_adaptive *a, const shard_plan_result *r, int *ties) {
    size_t pick = 0;
    int closest = -1;
    *ties = 0;
    for (size_t i = 0; i < r->fitting; i++) {
        const shard_plan_candidate *c = &r->candidate[i];
        if (c->step_ms > r->candidate[0].step_ms * (1 + ADAPTIVE_TIE)) continue;
        int near = 2 * (c->zero == a->config.zero) + (strcmp(c->mesh, a->mesh) == 0);
        ++*ties;
        if (near > closest) closest = near, pick = i;
    }
    return pick;
}

/* Rank 0: the plan on the measured cluster (*best: closest_of_ties's; *fastest the fastest, *ties as
 * there), and the current layout's predicted step on it. */
static shard_status replan(const train_adaptive *a, int world, const double *all, shard_plan_candidate *best,
                           shard_plan_candidate *fastest, int *ties, double *current_ms) {
    shard_cluster *c = NULL;
    SHARD_CHECK(measured_cluster(a, world, all, &c));
    shard_trainer_config search = a->config; /* the model, batch and seq; the layout is the search's */
    shard_plan_options po = {.struct_size = sizeof po,
                             .train = &search,
                             .cluster = c,
                             .goal = "throughput",
                             .search = world <= 16 ? "exhaustive" : NULL};
    shard_plan_result *r = NULL;
    shard_status s = shard_plan_search(&po, &r);
    if (s == SHARD_OK && !r->fitting) s = shard_error(SHARD_ERR_INVALID_ARG, "no layout fits the cluster's devices");
    if (s == SHARD_OK) *best = r->candidate[closest_of_ties(a, r, ties)], *fastest = r->candidate[0];
    shard_plan_result_destroy(r);
    shard_analysis *an = NULL;
    shard_step_prediction *pred = NULL;
    shard_analyze_options ao = {.struct_size = sizeof ao, .train = &a->config, .mesh = a->mesh};
    shard_cost_options co = {.struct_size = sizeof co, .backend = "threads", .cluster = c};
    if (s == SHARD_OK) s = shard_analyze(&ao, &an);
    if (s == SHARD_OK) s = shard_cost_predict(an, NULL, &co, &pred);
    if (s == SHARD_OK) *current_ms = pred->step_ms;
    shard_step_prediction_destroy(pred);
    shard_analysis_destroy(an);
    shard_cluster_destroy(c);
    return s;
}

/* The re-plan on a thread of its own (see the top of the file). */
typedef struct replan_job {
    const train_adaptive *a;
    int world;
    const double *all;
    shard_plan_candidate best, fastest;
    int ties;
    double current_ms;
    shard_status s;
    char why[1024];
} replan_job;

static void *replan_thread(void *arg) {
    replan_job *job = arg;
    job->s = replan(job->a, job->world, job->all, &job->best, &job->fastest, &job->ties, &job->current_ms);
    if (job->s < 0) snprintf(job->why, sizeof job->why, "%s", shard_last_error());
    return NULL;
}

static shard_status replan_apart(const train_adaptive *a, int world, const double *all, shard_plan_candidate *best,
                                 shard_plan_candidate *fastest, int *ties, double *current_ms) {
    replan_job job = {.a = a, .world = world, .all = all};
    pthread_t thread;
    if (pthread_create(&thread, NULL, replan_thread, &job) != 0)
        replan_thread(&job); /* no thread to be had: on this one, at the emulated rate */
    else
        pthread_join(thread, NULL);
    if (job.s < 0) return shard_error(job.s, "%s", job.why);
    *best = job.best, *fastest = job.fastest, *ties = job.ties, *current_ms = job.current_ms;
    return SHARD_OK;
}

/* Rank 0: each trigger's figure over the window (all: FIELDS per rank); memory is -1 without a cluster. */
static void figures(const train_adaptive *a, int world, uint64_t step, const double *all,
                    double value[ADAPTIVE_TRIGGERS]) {
    double compute[4096];
    int n = world < 4096 ? world : 4096;
    value[ADAPTIVE_MEMORY] = a->cluster ? 0 : -1, value[ADAPTIVE_COMM] = 0;
    for (int r = 0; r < n; r++) {
        const double *v = all + r * FIELDS;
        compute[r] = v[0];
        if (v[2] > 0 && v[1] / v[2] > value[ADAPTIVE_COMM]) value[ADAPTIVE_COMM] = v[1] / v[2];
        shard_cluster_device d;
        if (a->cluster && shard_cluster_device_at(a->cluster, r, step, &d) == SHARD_OK && d.memory_bytes > 0 &&
            v[3] / d.memory_bytes > value[ADAPTIVE_MEMORY])
            value[ADAPTIVE_MEMORY] = v[3] / d.memory_bytes;
    }
    value[ADAPTIVE_IMBALANCE] = shard_imbalance(compute, (size_t)n);
}

/* What rank 0 decided, sent to every rank. */
typedef struct decision {
    int32_t trigger; /* -1: nothing crossed twice */
    int32_t move;
    int32_t ties; /* plans within ADAPTIVE_TIE of the fastest */
    shard_plan_candidate to, fastest;
} decision;

/* Rank 0: the thresholds checked, the streaks kept, and a crossed one re-planned; *gain the prediction. */
static void decide(train_adaptive *a, int world, uint64_t step, const double *all, decision *d,
                   double value[ADAPTIVE_TRIGGERS], double *gain) {
    figures(a, world, step, all, value);
    for (int k = 0; k < ADAPTIVE_TRIGGERS; k++) {
        a->streak[k] = a->threshold[k] > 0 && value[k] > a->threshold[k] ? a->streak[k] + 1 : 0;
        if (d->trigger < 0 && a->streak[k] >= 2) d->trigger = k;
    }
    if (d->trigger < 0) return;
    a->streak[d->trigger] = 0; /* decided: two more checks before this trigger asks again */
    double current_ms = 0;
    char from[400];
    current_text(a, from, sizeof from);
    int ties = 0;
    if (replan_apart(a, world, all, &d->to, &d->fastest, &ties, &current_ms) < 0) {
        snprintf(a->said.failed, sizeof a->said.failed,
                 "reshard: step %llu: %s crossed its threshold, and re-planning failed: %s; the run goes on as %s",
                 (unsigned long long)step, TRIGGER_NAMES[d->trigger], shard_last_error(), from);
        fprintf(stderr, "shard: %s\n", a->said.failed);
        a->said.trigger = d->trigger, a->said.value = value[d->trigger], a->said.gain = 0;
        d->trigger = -1;
        return;
    }
    d->ties = ties;
    char to[400];
    shard_plan_candidate_text(&d->to, to, sizeof to);
    *gain = current_ms > 0 ? 1 - d->to.step_ms / current_ms : 0;
    d->move = *gain >= ADAPTIVE_LEAST_GAIN && strcmp(from, to) != 0;
}

/* Collective: the run is on next (mesh and trainer) with the config and plan move() set aside. */
static void moved_to(train_adaptive *a, shard_mesh **mesh, shard_trainer **t, shard_mesh *next, shard_trainer *moved) {
    shard_mesh_destroy(*mesh);
    *mesh = next, *t = moved;
    a->config = a->next_config, a->current_plan = a->next_plan;
    snprintf(a->mesh, sizeof a->mesh, "%s", a->plan[a->next_plan].mesh);
    memset(a->streak, 0, sizeof a->streak); /* the figures so far were the old layout's */
}

/* Collective: every rank moves to d->to, by stop-and-copy (*moved 1 once done) or, live, begun (a->moving:
 * train_adaptive_advance goes on with it); a failure leaves the run as it was. */
static shard_status move(train_adaptive *a, shard_comm *comm, const decision *d, uint64_t step, int live,
                         shard_mesh **mesh, shard_trainer **t, shard_migration_stats *st, int *moved) {
    *moved = 0;
    shard_mesh *next = NULL;
    SHARD_CHECK(shard_mesh_create(comm, d->to.mesh, &next));
    int slot = a->current_plan == 0 ? 1 : 0; /* the old config's strings stay valid while the old trainer is read */
    a->plan[slot] = d->to;
    a->next_config = a->config, a->next_plan = slot;
    shard_plan_candidate_apply(&a->plan[slot], &a->next_config);
    if (live) {
        if (shard_trainer_migrate_begin(*t, next, &a->next_config, (size_t)a->live_steps, &a->moving) < 0) {
            shard_mesh_destroy(next);
            return SHARD_OK;
        }
        a->next = next, a->begun = step;
        a->switch_at = step + (uint64_t)a->live_steps < a->last ? step + (uint64_t)a->live_steps : a->last - 1;
        return SHARD_OK;
    }
    shard_trainer *moved_trainer = NULL;
    if (shard_trainer_migrate(*t, next, &a->next_config, &moved_trainer, st) < 0) {
        shard_mesh_destroy(next);
        return SHARD_OK;
    }
    moved_to(a, mesh, t, next, moved_trainer);
    *moved = 1;
    return SHARD_OK;
}

/* Rank 0: the console line and the --log record (malloc'd into *record) of the decision a->said holds,
 * at `step`: a move made (st its figures; live: how it went) or none (to NULL). */
static shard_status say(const train_adaptive *a, uint64_t step, const char *to, int live,
                        const shard_migration_stats *st, char **record) {
    int k = a->said.trigger;
    double value = a->said.value, gain = a->said.gain;
    char how[200] = "", tie[600] = "";
    if (to && live)
        snprintf(how, sizeof how,
                 "live over steps %llu-%llu: pause %.1f ms at most (%.1f ms added to steps in all), %.1f ms",
                 (unsigned long long)a->begun, (unsigned long long)step, st->longest_ms, st->added_ms, st->ms);
    else if (to)
        snprintf(how, sizeof how, "stop-and-copy%s: %.1f ms",
                 a->live && k == ADAPTIVE_MEMORY ? " (memory pressure: a live move needs a second copy of the state)"
                                                 : "",
                 st->ms);
    if (a->said.fastest[0])
        snprintf(tie, sizeof tie, "the closest to the current layout of %d plans within %.0f %% of the fastest, %s",
                 a->said.ties, ADAPTIVE_TIE * 100, a->said.fastest);
    if (to)
        printf("reshard: step %llu, %s -> %s (%s %.2f over %g at two checks; predicted %.0f %% faster%s%s), %s, %.1f "
               "MiB moved\n",
               (unsigned long long)step, a->said.from, to, TRIGGER_NAMES[k], value, a->threshold[k], gain * 100,
               tie[0] ? "; " : "", tie, how, (double)st->bytes / 1048576.0);
    else
        printf("reshard: step %llu, %s %.2f over %g at two checks; the best plan, %s%s%s%s, predicts %.0f %% faster (a "
               "move needs %.0f %%): the run stays %s\n",
               (unsigned long long)step, TRIGGER_NAMES[k], value, a->threshold[k], a->said.best, tie[0] ? " (" : "",
               tie, tie[0] ? ")" : "", gain * 100, ADAPTIVE_LEAST_GAIN * 100, a->said.from);
    fflush(stdout);
    char quoted[420], fastest[420] = "null";
    if (a->said.fastest[0]) cli_json_string(a->said.fastest, fastest, sizeof fastest);
    size_t bytes = 2048;
    if (!(*record = malloc(bytes))) return shard_error(SHARD_ERR_NO_MEMORY, "--adaptive: out of memory");
    snprintf(
        *record, bytes,
        "{\"event\": \"reshard\", \"step\": %llu, \"from\": \"%s\", \"to\": %s, \"trigger\": \"%s\", "
        "\"value\": %.6g, \"threshold\": %.6g, \"predicted_gain\": %.6g, \"tie_break\": %s, \"fastest\": %s, "
        "\"migration\": \"%s\", \"migration_ms\": %.3f, \"bytes\": %llu, \"pause_ms\": %.3f, \"added_ms\": %.3f}\n",
        (unsigned long long)step, a->said.from, to ? cli_json_string(to, quoted, sizeof quoted) : "null",
        TRIGGER_NAMES[k], value, a->threshold[k], gain, a->said.fastest[0] ? "true" : "false", fastest,
        live ? "live" : "stop-and-copy", to ? st->ms : 0.0, (unsigned long long)(to ? st->bytes : 0),
        to ? st->longest_ms : 0.0, to ? st->added_ms : 0.0);
    return SHARD_OK;
}

/* Rank 0: a decision that failed (line: why, as printed after "shard: "; to: the layout it was to move
 * to, NULL when re-planning failed) as its --log record, malloc'd into *record. */
static shard_status say_failed(const train_adaptive *a, uint64_t step, const char *line, const char *to, int live,
                               char **record) {
    int k = a->said.trigger;
    char reason[1400], quoted[420];
    size_t bytes = 3072;
    if (!(*record = malloc(bytes))) return shard_error(SHARD_ERR_NO_MEMORY, "--adaptive: out of memory");
    snprintf(*record, bytes,
             "{\"event\": \"reshard\", \"step\": %llu, \"failed\": true, \"reason\": %s, \"from\": \"%s\", "
             "\"to\": %s, \"trigger\": \"%s\", \"value\": %.6g, \"threshold\": %.6g, \"predicted_gain\": %.6g, "
             "\"migration\": \"%s\"}\n",
             (unsigned long long)step, cli_json_string(line, reason, sizeof reason), a->said.from,
             to ? cli_json_string(to, quoted, sizeof quoted) : "null", TRIGGER_NAMES[k], a->said.value, a->threshold[k],
             a->said.gain, live ? "live" : "stop-and-copy");
    return SHARD_OK;
}

/* Rank 0: a move that failed (the run goes on as it was): its line on stderr and its record. */
static shard_status move_failed(const train_adaptive *a, uint64_t step, int live, char **record) {
    char line[1200];
    snprintf(line, sizeof line, "reshard: step %llu: %s; the run goes on as %s", (unsigned long long)step,
             shard_last_error(), a->said.from);
    fprintf(stderr, "shard: %s\n", line);
    return say_failed(a, step, line, a->said.best, live, record);
}

shard_status train_adaptive_check(train_adaptive *a, shard_comm *comm, uint64_t step, shard_mesh **mesh,
                                  shard_trainer **t, char **record) {
    *record = NULL;
    int rank = shard_comm_rank(comm), world = shard_comm_size(comm);
    double mine[FIELDS] = {a->window[0], a->window[1], a->window[2], a->window[3], rank_rows(a, *mesh)};
    memset(a->window, 0, sizeof a->window);
    if (a->moving) return SHARD_OK; /* a live move under way: its steps are not the layout's own figures */
    double *all = malloc((size_t)world * sizeof mine);
    if (!all) return shard_error(SHARD_ERR_NO_MEMORY, "--adaptive: out of memory");
    shard_status s = shard_comm_all_gather(comm, mine, all, FIELDS, SHARD_F64);
    decision d = {.trigger = -1};
    double value[ADAPTIVE_TRIGGERS] = {0}, gain = 0;
    current_text(a, a->said.from, sizeof a->said.from);
    a->said.failed[0] = '\0';
    if (s == SHARD_OK && rank == 0) decide(a, world, step, all, &d, value, &gain);
    free(all);
    if (s == SHARD_OK) s = shard_comm_broadcast(comm, &d, sizeof d, SHARD_U8, 0);
    if (s == SHARD_OK && rank == 0 && a->said.failed[0]) /* re-planning failed: said, and recorded */
        return say_failed(a, step, a->said.failed, NULL, a->live && a->said.trigger != ADAPTIVE_MEMORY, record);
    if (s < 0 || d.trigger < 0) return s;
    a->said.trigger = d.trigger, a->said.value = value[d.trigger], a->said.gain = gain;
    shard_plan_candidate_text(&d.to, a->said.best, sizeof a->said.best);
    shard_plan_candidate_text(&d.fastest, a->said.fastest, sizeof a->said.fastest);
    a->said.ties = d.ties;
    if (strcmp(a->said.fastest, a->said.best) == 0) a->said.fastest[0] = '\0'; /* the tie-break changed nothing */
    shard_migration_stats st = {.struct_size = sizeof st};
    int moved = 0, live = a->live && d.trigger != ADAPTIVE_MEMORY; /* live needs room for a second copy */
    if (d.move) SHARD_CHECK(move(a, comm, &d, step, live, mesh, t, &st, &moved));
    if (d.move && a->moving) return SHARD_OK; /* said at the switch */
    if (rank != 0) return SHARD_OK;
    if (d.move && !moved) return move_failed(a, step, live, record); /* the run goes on as it was */
    return say(a, step, moved ? a->said.best : NULL, 0, &st, record);
}

shard_status train_adaptive_advance(train_adaptive *a, shard_comm *comm, uint64_t step, shard_mesh **mesh,
                                    shard_trainer **t, char **record) {
    *record = NULL;
    if (!a->moving || step <= a->begun) return SHARD_OK;
    int rank = shard_comm_rank(comm);
    shard_migration_stats st = {.struct_size = sizeof st};
    shard_trainer *moved = NULL;
    shard_status s = shard_migration_advance(a->moving, *t);
    if (s == SHARD_OK && step < a->switch_at) return SHARD_OK;
    if (s == SHARD_OK) s = shard_migration_finish(a->moving, *t, &moved, &st);
    a->moving = NULL;
    if (s < 0) { /* the migration is gone, the run goes on as it was */
        s = rank == 0 ? move_failed(a, step, 1, record) : SHARD_OK;
        shard_mesh_destroy(a->next);
        a->next = NULL;
        return s;
    }
    moved_to(a, mesh, t, a->next, moved);
    a->next = NULL;
    return rank == 0 ? say(a, step, a->said.best, 1, &st, record) : SHARD_OK;
}

void train_adaptive_end(train_adaptive *a, shard_trainer *t) {
    shard_migration_cancel(a->moving, t);
    shard_mesh_destroy(a->next);
    a->moving = NULL, a->next = NULL;
}
