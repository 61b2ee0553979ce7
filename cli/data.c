/* data.c — `shard data text FILE... --out DIR [--val-fraction 0.1]`: the
 * byte-level tokenizer (token = byte value) writing train.tokens,
 * val.tokens and meta.json (see include/shard/data.h). */
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/data.h"

static const char *const USAGE_DATA =
    "usage: shard data SUB-VERB [options]\n"
    "\n"
    "sub-verbs (shard help data SUB-VERB: its options):\n"
    "  text          byte-level tokens of text files, the token files `shard train --data` reads\n"
    "\n"
    "options:\n";

static const char *const USAGE_TEXT =
    "usage: shard data text FILE... --out DIR [options]\n"
    "\n"
    "The byte-level tokenizer (token = byte value, vocabulary 256) over the files, concatenated in order:\n"
    "the last --val-fraction of the stream becomes DIR/val.tokens, the rest DIR/train.tokens, and\n"
    "DIR/meta.json describes both.\n"
    "\n"
    "options:\n"
    "  --out DIR                the directory to write, made when missing (required)\n"
    "  --val-fraction F         the share of the tokens kept for validation, [0, 1) (default 0.1)\n";

int cli_data(int argc, char **argv) {
    if (argc >= 2 && cli_is_help(argv[1])) return cli_usage(USAGE_DATA, 0);
    if (argc >= 2 && strcmp(argv[1], "text") != 0) {
        cli_error("data: unknown '%s': give text (the byte-level tokenizer): 'shard data text FILE... --out DIR'",
                  argv[1]);
        return 2;
    }
    if (argc < 2) {
        cli_error("data: give what to prepare: 'shard data text FILE... --out DIR [--val-fraction 0.1]'");
        return 2;
    }
    if (cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_TEXT, 0);
    const char *out = NULL;
    double val = 0.1;
    const char **files = calloc((size_t)argc, sizeof *files);
    size_t n = 0;
    if (!files) return 1;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--out") == 0) {
            if (!(out = cli_value(argc, argv, &i))) return free(files), 2;
        } else if (strcmp(argv[i], "--val-fraction") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return free(files), 2;
            if (!cli_number(v, &val) || !(val >= 0 && val < 1)) {
                cli_error("--val-fraction '%s' is invalid: give a fraction in [0, 1), e.g. 0.1", v);
                return free(files), 2;
            }
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_unknown_option("data text", argv[i], USAGE_TEXT);
            return free(files), 2;
        } else {
            files[n++] = argv[i];
        }
    }
    if (!out || !n) {
        cli_error("data text: give at least one input file and --out DIR");
        return free(files), 2;
    }
    shard_status s = shard_data_text(files, n, out, val, stdout);
    free(files);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}
