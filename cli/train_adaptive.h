/* train_adaptive.h — `shard train --adaptive`: every K steps the monitor's figures of the last K steps
 * (load imbalance, memory pressure, exposed communication) against thresholds; a threshold crossed at two
 * checks in a row makes rank 0 re-plan on the cluster re-priced with the ranks' measured speeds, and a
 * plan predicted at least 10 % faster than the layout the run has is moved to by stop-and-copy
 * (shard_trainer_migrate).  Each decision is one console line and one --log record. */
#ifndef SHARD_CLI_TRAIN_ADAPTIVE_H
#define SHARD_CLI_TRAIN_ADAPTIVE_H

#include <stdint.h>

#include "shard/shard.h"

enum { ADAPTIVE_IMBALANCE, ADAPTIVE_MEMORY, ADAPTIVE_COMM, ADAPTIVE_TRIGGERS };

/* The least predicted gain (1 - new step / current step) that is worth a move. */
#define ADAPTIVE_LEAST_GAIN 0.10

/* Plans predicted within this fraction of the fastest one count as a tie: of those the re-plan takes the
 * closest to the current layout (the same ZeRO stage first, then the same mesh), so that a move changes
 * no more than it must. */
#define ADAPTIVE_TIE 0.02

/* --reshard-on's value, "imbalance=0.25,memory=0.9,comm=0.4": the triggers watched and their thresholds
 * (a trigger left out is not watched; 0 in threshold[]).  0, or -1 with one line printed. */
int train_adaptive_parse(const char *text, double threshold[ADAPTIVE_TRIGGERS]);

/* The thresholds without --reshard-on. */
void train_adaptive_defaults(double threshold[ADAPTIVE_TRIGGERS]);

/* One rank's adaptive state over the run. */
typedef struct train_adaptive {
    double threshold[ADAPTIVE_TRIGGERS]; /* 0: the trigger is off */
    uint64_t every;                      /* a check every `every` steps */
    const shard_cluster *cluster;        /* the run's (the memory trigger's capacity; the re-plan's devices) */
    shard_trainer_config config;         /* the current layout's config (the run's, the plan's fields applied) */
    char mesh[96];                       /* the current mesh */
    shard_plan_candidate plan[2];        /* the plans moved to, alternately: config's strings point into one */
    int current_plan;                    /* plan[] index config points into (-1: the run's own layout) */
    int streak[ADAPTIVE_TRIGGERS];       /* checks in a row the trigger was crossed */
    double window[4];        /* this rank since the last check: compute, exposed comm and wall seconds; the highest
                         step peak (its categories' peaks summed) in bytes */
    int live;                /* --migration live: moves are live, save for the memory trigger's */
    int live_steps;          /* --live-steps: the steps a live move spans */
    uint64_t last;           /* the run's last step (a live move switches before it) */
    shard_migration *moving; /* a live move under way (NULL: none), to next */
    shard_mesh *next;
    uint64_t begun, switch_at;        /* its first step and the step after which it switches */
    shard_trainer_config next_config; /* the config of the layout moved to */
    int next_plan;                    /* its plan[] index */
    struct {                          /* the last decision, as its line and record say it */
        int trigger;
        double value, gain;
        char from[400], best[400];
        int ties;          /* plans within ADAPTIVE_TIE of the fastest; the closest taken when it is not it */
        char fastest[400]; /* the fastest plan, when the tie-break took another ("" otherwise) */
        char failed[1200]; /* rank 0: a re-planning that failed, the line that said so ("" otherwise) */
    } said;
} train_adaptive;

/* --migration live: the state moves over this many steps while training goes on (train.c explains;
 * --live-steps sets another). */
enum { TRAIN_LIVE_STEPS = 5, TRAIN_LIVE_STEPS_MOST = 64 };

/* Ready for the run: config is the run's trainer config with its global batch resolved (batch), mesh its
 * mesh text. */
void train_adaptive_start(train_adaptive *a, const double threshold[ADAPTIVE_TRIGGERS], long every,
                          const shard_cluster *cluster, const shard_trainer_config *config, const char *mesh);

/* After each step, on every rank: the step's figures added to the window. */
shard_status train_adaptive_record(train_adaptive *a, const shard_trainer *t);

/* Collective, after a step that is a check (step % every == 0): the window's figures gathered, the
 * thresholds checked on rank 0, and when one was crossed at two checks in a row the re-plan and maybe
 * the move (*mesh and *t the new ones then).  Rank 0 prints the decision and gets its --log record in
 * record (malloc'd, NULL when nothing was decided); a move that fails leaves the run as it was, one line
 * on stderr saying why. */
shard_status train_adaptive_check(train_adaptive *a, shard_comm *comm, uint64_t step, shard_mesh **mesh,
                                  shard_trainer **t, char **record);

/* Collective, after each step: a live move under way advanced, and switched to at its step (*mesh and *t
 * the new ones then; rank 0 prints the decision's line and gets its record as train_adaptive_check's).
 * A failure leaves the run as it was, one line on stderr saying why. */
shard_status train_adaptive_advance(train_adaptive *a, shard_comm *comm, uint64_t step, shard_mesh **mesh,
                                    shard_trainer **t, char **record);

/* A live move the run ended before (t the run's trainer) dropped. */
void train_adaptive_end(train_adaptive *a, shard_trainer *t);

#endif
