/* inspect_schedule.c — `shard inspect schedule`: a pipeline schedule as data,
 * without running ranks: the ASCII timeline per rank (one slot per F or B),
 * the micro-batches each rank holds at its peak, and the bubble of the
 * equal-cost timeline against its formula.
 *
 *   shard inspect schedule --pipe 4 --micro-batches 8 [--schedule gpipe|1f1b|interleaved] [--virtual-stages 2]
 *                          [--backward-cost 2] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "inspect_schedule.h"
#include "shard/cost.h"
#include "shard/schedule.h"

static const char *const USAGE =
    "usage: shard inspect schedule --pipe P --micro-batches M [options]\n"
    "\n"
    "A pipeline schedule without running ranks: the ASCII timeline per rank (one slot per forward F or\n"
    "backward B), the micro-batches each rank holds at its peak, and the bubble of the equal-cost\n"
    "timeline against its formula.\n"
    "\n"
    "options:\n"
    "  --pipe P                 the pipeline's stages (ranks), 1..64 (required)\n"
    "  --micro-batches M        micro-batches per step, 1..1024 (required; a multiple of P with\n"
    "                           interleaved)\n"
    "  --schedule S             gpipe, 1f1b or interleaved (default 1f1b)\n"
    "  --virtual-stages V       chunks per rank, 1..16; more than 1 with interleaved only (default 1)\n"
    "  --backward-cost C        a backward's time in forwards, for the bubble, 1..16 (default 2)\n";

int cli_inspect_schedule(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 2)) return cli_usage(USAGE, 0);
    long p = 0, m = 0, v = 1, b_cost = 2;
    const char *kind_text = "1f1b";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        long *ints[] = {&p, &m, &v, &b_cost};
        const char *names[] = {"--pipe", "--micro-batches", "--virtual-stages", "--backward-cost"};
        const long hi[] = {64, 1024, 16, 16};
        int done = 0;
        for (int k = 0; k < 4 && !done; k++)
            if (strcmp(a, names[k]) == 0) {
                if (!(val = cli_value(argc, argv, &i)) || cli_parse_int(a, val, 1, hi[k], ints[k])) return 2;
                done = 1;
            }
        if (done) continue;
        if (strcmp(a, "--schedule") == 0) {
            if (!(kind_text = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        cli_unknown_option("inspect schedule", a, USAGE);
        return 2;
    }
    if (!p || !m) {
        cli_error(
            "inspect schedule: give --pipe P and --micro-batches M, e.g. --pipe 4 --micro-batches 8 --schedule 1f1b");
        return 2;
    }
    shard_pipe_kind kind;
    shard_pipe_schedule *s = NULL;
    if (shard_pipe_kind_parse(kind_text, &kind) != SHARD_OK ||
        shard_pipe_schedule_create(kind, (int)p, (int)m, (int)v, &s) != SHARD_OK) {
        cli_error("%s", shard_last_error());
        return 2;
    }
    shard_pipe_schedule_print(s, stdout);
    int *peak = calloc((size_t)p, sizeof *peak);
    if (peak && shard_pipe_schedule_timeline(s, 1, (int)b_cost, NULL, NULL, peak) == SHARD_OK) {
        printf("micro-batches held at the peak:");
        for (int r = 0; r < p; r++) printf(" rank %d: %d%s", r, peak[r], r + 1 < p ? "," : "\n");
    }
    free(peak);
    double f1 = shard_pipe_schedule_bubble(s, 1, 1), f2 = shard_pipe_schedule_bubble(s, 1, (int)b_cost);
    printf("bubble of the equal-cost timeline: %.1f%% (B = F), %.1f%% (B = %ld F); formula %.1f%%\n", 100 * f1,
           100 * f2, b_cost, 100 * shard_cost_pipe_bubble(kind, (int)p, (int)m, (int)v));
    shard_pipe_schedule_destroy(s);
    return 0;
}
