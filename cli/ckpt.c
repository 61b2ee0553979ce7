/* ckpt.c — checkpoints on the command line, without starting ranks:
 *   shard inspect ckpt DIR|FILE|NAME.index.json [--verify]
 *   shard ckpt export DIR --out model.safetensors [--max-shard-size 5G] [--optimizer]
 * inspect prints a safetensors file's tensors and metadata, or a checkpoint's
 * step, mesh, files and tensors (dtype, global shape, spec, chunks);
 * --verify also checks every file's size and xxh3 and that each file holds
 * exactly the chunks the index lists in it (the index's own checksum is
 * checked on every read).  export writes the full tensors as one safetensors file, or past
 * --max-shard-size as Hugging Face's sharded layout (model-00001-of-0000N
 * files and model.safetensors.index.json), one tensor in memory at a time.
 * The listings and the export are the engine's (shard/checkpoint.h,
 * shard/safetensors.h); this file parses the command line and says what
 * was written. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/checkpoint.h"
#include "shard/safetensors.h"

static const char *const USAGE_INSPECT =
    "usage: shard inspect ckpt DIR|FILE|NAME.index.json [options]\n"
    "\n"
    "A checkpoint (DIR: a root or a step_N directory): its step, mesh, files and every tensor's dtype,\n"
    "shape, spec and chunks; a .safetensors FILE: its tensors and metadata; a sharded export's\n"
    "NAME.index.json: its tensor count and each file it names.\n"
    "\n"
    "options:\n"
    "  --verify                 also check every file's size and xxh3 checksum and that each chunk (or\n"
    "                           tensor) is where the index says, and no file holds one it does not list\n"
    "                           (default: not checked; the index's own checksum is checked always)\n";

int cli_inspect_ckpt(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_INSPECT, 0);
    const char *target = NULL;
    int verify = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--verify") == 0)
            verify = 1;
        else if (argv[i][0] == '-') {
            cli_error("inspect ckpt: unknown option '%s' (give DIR|FILE [--verify])", argv[i]);
            return 2;
        } else if (!target)
            target = argv[i];
        else {
            cli_error("inspect ckpt: one checkpoint directory or safetensors file, not '%s' too", argv[i]);
            return 2;
        }
    }
    if (!target) {
        cli_error("inspect ckpt: give a checkpoint directory or a .safetensors file");
        return 2;
    }
    size_t n = strlen(target);
    int index = shard_safetensors_is_index(target);
    struct stat st; /* a file by another name: read as safetensors (the format's own checks say if it is not) */
    int file = (n > 12 && strcmp(target + n - 12, ".safetensors") == 0) ||
        (!index && stat(target, &st) == 0 && S_ISREG(st.st_mode));
    shard_status s = file ? shard_safetensors_describe(target, verify, stdout)
        : index           ? shard_safetensors_index_describe(target, verify, stdout)
                          : shard_ckpt_describe(target, verify, stdout);
    if (s < 0) cli_error("%s", shard_last_error());
    return s < 0 ? 1 : 0;
}

/* ---------------------------------------------------------------- export */

static int export_checkpoint(const char *where, const char *out, uint64_t max_shard, int with_optimizer) {
    shard_ckpt_export_result r;
    if (shard_ckpt_export(where, out, max_shard, with_optimizer, &r) < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    char note[160] = "";
    if (r.left_out)
        snprintf(note, sizeof note, "; the optimizer's %zu tensors left out (--optimizer keeps them)", r.left_out);
    if (r.parts == 1)
        printf("exported %zu tensors (%llu bytes) of %s to %s%s\n", r.tensors, (unsigned long long)r.total_bytes,
               r.step_dir, out, note);
    else
        printf("exported %zu tensors (%llu bytes) of %s as %d files %s and %s%s%s%s\n", r.tensors,
               (unsigned long long)r.total_bytes, r.step_dir, r.parts, r.parts_pattern, r.index_path,
               r.removed_single ? "; removed the earlier single file " : "", r.removed_single ? out : "", note);
    return 0;
}

static const char *const USAGE_CKPT =
    "usage: shard ckpt SUB-VERB [options]\n"
    "\n"
    "sub-verbs (shard help ckpt SUB-VERB: its options):\n"
    "  export        a checkpoint's model tensors, full, as one safetensors file or Hugging Face's\n"
    "                sharded layout\n"
    "\n"
    "options:\n";

static const char *const USAGE_EXPORT =
    "usage: shard ckpt export DIR --out NAME.safetensors [options]\n"
    "\n"
    "A checkpoint's model tensors, assembled whole from their chunks, one tensor in memory at a time:\n"
    "one safetensors file, or past --max-shard-size Hugging Face's sharded layout\n"
    "(NAME-0000k-of-0000N.safetensors and NAME.safetensors.index.json beside --out).  DIR: a step_N\n"
    "directory, or a root (its latest usable step).\n"
    "\n"
    "options:\n"
    "  --out FILE               the file to write, a name ending in .safetensors (required)\n"
    "  --max-shard-size SIZE    the most bytes in one file before the export is split, > 0 (default 5G)\n"
    "  --optimizer              the optimizer's state arrays (optimizer.*) too (default: the model's\n"
    "                           tensors alone)\n";

int cli_ckpt(int argc, char **argv) {
    if (argc >= 2 && cli_is_help(argv[1])) return cli_usage(USAGE_CKPT, 0);
    if (argc >= 2 && strcmp(argv[1], "export") != 0) {
        cli_error("ckpt: unknown '%s': give export: 'shard ckpt export DIR --out model.safetensors'", argv[1]);
        return 2;
    }
    if (argc < 2) {
        cli_error("ckpt: give what to do: 'shard ckpt export DIR --out model.safetensors [--max-shard-size 5G]'");
        return 2;
    }
    if (cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_EXPORT, 0);
    const char *dir = NULL, *out = NULL;
    uint64_t max_shard = 5ULL << 30;
    int with_optimizer = 0;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--optimizer") == 0) {
            with_optimizer = 1;
        } else if (strcmp(argv[i], "--out") == 0) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(argv[i], "--max-shard-size") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_size("--max-shard-size", v, &max_shard)) return 2;
            if (max_shard == 0) {
                cli_error("--max-shard-size '%s' is invalid: give a size > 0, e.g. 5G", v);
                return 2;
            }
        } else if (argv[i][0] == '-') {
            cli_unknown_option("ckpt export", argv[i], USAGE_EXPORT);
            return 2;
        } else if (!dir) {
            dir = argv[i];
        } else {
            cli_error("ckpt export: one checkpoint directory, not '%s' too", argv[i]);
            return 2;
        }
    }
    size_t n = out ? strlen(out) : 0;
    if (dir && out && (n <= 12 || strcmp(out + n - 12, ".safetensors") != 0)) {
        cli_error("ckpt export: --out '%s' is invalid: give a file name ending in .safetensors, e.g. model.safetensors",
                  out);
        return 2;
    }
    if (!dir || !out) {
        cli_error("ckpt export: give a checkpoint directory and --out NAME.safetensors");
        return 2;
    }
    return export_checkpoint(dir, out, max_shard, with_optimizer);
}
