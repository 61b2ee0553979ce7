/* main.c — the `shard` command line: dispatch to one verb per file.
 *
 *   shard bench comm --op all_reduce --ranks 2 [--json] ...
 *   shard bench redistribute --ranks 2 [--mesh data=2] [--bytes 64M] [--json]
 *   shard demo [--ranks 4]
 *   shard inspect spec --mesh data=4,tensor=2 --shape 128,4096 --spec "P('data','tensor')"
 *   shard inspect ckpt DIR|FILE|NAME.index.json [--verify]
 *   shard ckpt export DIR --out model.safetensors [--max-shard-size 5G] [--optimizer]
 *   shard data text FILE... --out DIR [--val-fraction 0.1]
 *   shard train --config CONFIG.json --data DIR --batch 8 --seq 128 --steps N --lr X --seed S ...
 *   shard generate (--ckpt DIR | --config CONFIG.json --init W.safetensors) --prompt "..." --tokens N
 *   shard version | --version
 *   shard help [VERB [SUB-VERB]]   (the same as shard VERB [SUB-VERB] --help: each usage text) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/shard.h"

 *   shard version | --version
 *   shard help [VERB [SUB-VERB]]   (the same as shard VERB [SUB-VERB] --help: each usage text) */
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    const char *verb = argv[1];
    const cli_verb *v = find_verb(verb);
    if (v) return v->run(argc - 1, argv + 1);
    if (strcmp(verb, "help") == 0 || cli_is_help(verb)) return help(argc - 2, argv + 2);
    if (strcmp(verb, "version") == 0 || strcmp(verb, "--version") == 0) {
        if (argc > 2 && cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_VERSION, 0);
        if (argc > 2) {
            cli_error("%s takes no arguments, not '%s'", verb, argv[2]);
            return 2;
        }
        printf("shard %s (backends: threads%s)\n", shard_version(), shard_have_mpi() ? ", mpi" : "");
        return 0;
    }
    cli_error("unknown verb '%s': valid verbs are %s", verb, VALID_VERBS);
    return 2;
}
