/* main.c — the `shard` command line: dispatch to one verb per file.
 *
 *   shard bench comm --op all_reduce --ranks 2 [--json] ...
 *   shard bench redistribute --ranks 2 [--mesh data=2] [--bytes 64M] [--json]
 *   shard demo [--ranks 4]
 *   shard inspect spec --mesh data=4,tensor=2 --shape 128,4096 --spec "P('data','tensor')"
 *   shard inspect ckpt DIR|FILE|NAME.index.json [--verify]
 *   shard ckpt export DIR --out model.safetensors [--max-shard-size 5G] [--optimizer]
 *   shard data text FILE... --out DIR [--val-fraction 0.1]
 *   shard analyze --config CONFIG.json --mesh data=2,tensor=2 [--json] ...
 *   shard train --config CONFIG.json --data DIR --batch 8 --seq 128 --steps N --lr X --seed S ...
 *   shard generate (--ckpt DIR | --config CONFIG.json --init W.safetensors) --prompt "..." --tokens N
 *   shard version | --version
 *   shard help [VERB [SUB-VERB]]   (the same as shard VERB [SUB-VERB] --help: each usage text) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "profile.h"
#include "shard/shard.h"

/* The verb list (`shard help`, `shard --help`; on stderr when no verb is given).  Each verb's own usage
 * text stands next to its parser, in its file. */
static const char *const USAGE =
    "usage: shard VERB [SUB-VERB] [options]\n"
    "       shard help VERB [SUB-VERB]   (or shard VERB [SUB-VERB] --help): its options, their defaults\n"
    "                                    and meanings\n"
    "\n"
    "verbs (shard help VERB: its sub-verbs or options):\n"
    "  analyze       what a layout costs per rank (memory, FLOPs, traffic, bubble) without training\n"
    "  bench         benchmarks against their reference measured in the same run: comm, redistribute,\n"
    "                ckpt, gemm, train, tensor, pipeline\n"
    "  ckpt          checkpoints: export (to safetensors)\n"
    "  data          training data: text (byte-level token files)\n"
    "  demo          ranks exchanging data, then the all_reduce benchmark at a few sizes\n"
    "  generate      text from a trained GPT\n"
    "  plan          the layout to run a model with on a cluster: searched, analyzed, priced, explained\n"
    "  profile       measure this machine for the cost model (GEMM, bandwidth, collectives' alpha, beta)\n"
    "  inspect       without running ranks: spec (a sharding), schedule (a pipeline's), ckpt (a checkpoint\n"
    "                or safetensors file)\n"
    "  train         train a model (gpt2, cnn, mlp) on a mesh of data, tensor and pipe axes\n"
    "  version       the version and the backends in this build\n"
    "  help          this list, or a verb's usage\n"
    "\n"
    "options:\n"
    "  --version                the same as shard version\n";

static const char *const USAGE_VERSION =
    "usage: shard version\n"
    "\n"
    "The version and the backends in this build (threads, and mpi when built with MPI); also --version.\n"
    "\n"
    "options:\n";

typedef struct cli_verb {
    const char *name;
    int (*run)(int argc, char **argv);
    int has_sub_verbs; /* `shard help VERB SUB` is refused for a verb without */
} cli_verb;

static const cli_verb VERBS[] = {
    {.name = "analyze", .run = cli_analyze, .has_sub_verbs = 0},
    {.name = "plan", .run = cli_plan, .has_sub_verbs = 0},
    {.name = "bench", .run = cli_bench, .has_sub_verbs = 1},
    {.name = "demo", .run = cli_demo, .has_sub_verbs = 0},
    {.name = "inspect", .run = cli_inspect, .has_sub_verbs = 1},
    {.name = "ckpt", .run = cli_ckpt, .has_sub_verbs = 1},
    {.name = "data", .run = cli_data, .has_sub_verbs = 1},
    {.name = "train", .run = cli_train, .has_sub_verbs = 0},
    {.name = "profile", .run = cli_profile, .has_sub_verbs = 0},
    {.name = "generate", .run = cli_generate, .has_sub_verbs = 0},
};

static const char *const VALID_VERBS =
    "analyze, bench, ckpt, data, demo, generate, inspect, plan, profile, train, version, help";

/* "unknown verb 'X'" (opened by `where`, e.g. "help: "), with the nearest verb when one is near. */
static void unknown_verb(const char *where, const char *name) {
    const char *names[sizeof VERBS / sizeof VERBS[0] + 2] = {"version", "help"};
    for (size_t k = 0; k < sizeof VERBS / sizeof VERBS[0]; k++) names[2 + k] = VERBS[k].name;
    const char *near = shard_text_nearest(name, names, sizeof names / sizeof names[0]);
    if (near)
        cli_error("%sunknown verb '%s': did you mean '%s'? (valid verbs are %s)", where, name, near, VALID_VERBS);
    else
        cli_error("%sunknown verb '%s': valid verbs are %s", where, name, VALID_VERBS);
}

static const cli_verb *find_verb(const char *name) {
    for (size_t k = 0; k < sizeof VERBS / sizeof VERBS[0]; k++)
        if (strcmp(name, VERBS[k].name) == 0) return &VERBS[k];
    return NULL;
}

/* `shard help [VERB [SUB-VERB]]`: the verb asked as `shard VERB [SUB-VERB] --help`, so that each usage
 * text is printed one way. */
static int help(int argc, char **argv) {
    const char *name = argc ? argv[0] : "help";
    int is_list = strcmp(name, "help") == 0 || cli_is_help(name);
    int is_version = strcmp(name, "version") == 0 || strcmp(name, "--version") == 0;
    const cli_verb *verb = find_verb(name);
    if (!is_list && !is_version && !verb) {
        unknown_verb("help: ", name);
        return 2;
    }
    int subs = verb && verb->has_sub_verbs;
    if (argc > 1 + subs) {
        if (subs)
            cli_error("help: one verb and one sub-verb, not '%s' too: give 'shard help %s %s'", argv[2], name, argv[1]);
        else
            cli_error("help: %s has no sub-verbs, not '%s': give 'shard help %s'", name, argv[1], name);
        return 2;
    }
    if (is_list) return cli_usage(USAGE, 0);
    if (is_version) return cli_usage(USAGE_VERSION, 0);
    char *args[3] = {argv[0], argc == 2 ? argv[1] : NULL, NULL};
    args[argc] = "--help";
    return verb->run(argc + 1, args);
}

/* What a verb printed (a report, bench --json objects) reached standard output whole, or the run fails
 * saying so: output redirected onto a full disk is not a success.  A verb that failed said why already. */
static int finish_stdout(int rc) {
    errno = 0;
    if (rc != 0 || (fflush(stdout) == 0 && !ferror(stdout))) return rc;
    cli_error("standard output: cannot write: %s", errno ? strerror(errno) : "an earlier write to it failed");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    const char *verb = argv[1];
    const cli_verb *v = find_verb(verb);
    if (v) return finish_stdout(v->run(argc - 1, argv + 1));
    if (strcmp(verb, "help") == 0 || cli_is_help(verb)) return finish_stdout(help(argc - 2, argv + 2));
    if (strcmp(verb, "version") == 0 || strcmp(verb, "--version") == 0) {
        if (argc > 2 && cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_VERSION, 0);
        if (argc > 2) {
            cli_error("%s takes no arguments, not '%s'", verb, argv[2]);
            return 2;
        }
        printf("shard %s (backends: threads%s)\n", shard_version(), shard_have_mpi() ? ", mpi" : "");
        return finish_stdout(0);
    }
    unknown_verb("", verb);
    return 2;
}
