/* inspect.c — `shard inspect spec`: describe a sharding without running ranks.
 *   shard inspect spec --mesh data=4,tensor=2 --shape 128,4096 --spec "P('data','tensor')" [--dtype f32]
 *                      [--to "P(None, 'tensor')"]   also print the redistribution plan to that spec */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "inspect_schedule.h"
#include "shard/redistribute.h"
#include "shard/spec.h"

static int parse_shape(const char *text, size_t *shape, int *ndim) {
    *ndim = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        if (*p < '0' || *p > '9' || *ndim == SHARD_MAX_DIMS) goto bad;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || v > (1ULL << 40) || (*end && *end != ',')) goto bad;
        shape[(*ndim)++] = (size_t)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) goto bad;
    }
    if (*ndim == 0) goto bad;
    double elements = 1;
    for (int d = 0; d < *ndim; d++) elements *= (double)shape[d];
    if (elements > 0x1p50) goto bad; /* byte counts stay exact */
    return 0;
bad:
    cli_error("--shape '%s' is invalid: give 1 to %d sizes separated by commas, at most 2^50 elements, e.g. 128,4096",
              text, SHARD_MAX_DIMS);
    return -1;
}

static const char *const USAGE_INSPECT =
    "usage: shard inspect SUB-VERB [options]\n"
    "\n"
    "sub-verbs (shard help inspect SUB-VERB: its options):\n"
    "  spec          a tensor's sharding described without running ranks, and the plan to redistribute it\n"
    "  schedule      a pipeline schedule as an ASCII timeline per rank, its peak micro-batches and bubble\n"
    "  ckpt          a checkpoint, a .safetensors file or a sharded export's index: tensors, dtypes,\n"
    "                shapes, specs, chunks\n"
    "\n"
    "options:\n";

static const char *const USAGE_SPEC =
    "usage: shard inspect spec --mesh MESH --shape SIZES --spec SPEC [options]\n"
    "\n"
    "A tensor's sharding described without running ranks: its type, the block grid and every rank's\n"
    "shard; with --to, also the steps that redistribute it to another spec and the bytes they send.\n"
    "\n"
    "options:\n"
    "  --mesh MESH              the mesh's axes and sizes (required), e.g. data=4,tensor=2\n"
    "  --shape SIZES            the whole tensor's sizes (required): 1 to 8 separated by commas, at most\n"
    "                           2^50 elements, e.g. 128,4096\n"
    "  --spec SPEC              its placement over the mesh (required), e.g. \"P('data','tensor')\", \"P()\"\n"
    "                           (replicated) or \"P(partial='data')\" (a pending sum)\n"
    "  --dtype T                the elements: f32, f64, bf16, f16, i8, i32, i64 or u8 (default f32)\n"
    "  --to SPEC                also print the redistribution plan from --spec to SPEC (default: none)\n";

int cli_inspect(int argc, char **argv) {
    if (argc >= 2 && cli_is_help(argv[1])) return cli_usage(USAGE_INSPECT, 0);
    if (argc >= 2 && strcmp(argv[1], "ckpt") == 0) return cli_inspect_ckpt(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "schedule") == 0) return cli_inspect_schedule(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "spec") != 0) {
        cli_error("inspect: unknown '%s': give spec, ckpt or schedule (see 'shard help')", argv[1]);
        return 2;
    }
    if (argc < 2) {
        cli_error("inspect: give what to inspect: 'shard inspect spec --mesh data=4,tensor=2 --shape 128,4096 --spec "
                  "\"P('data','tensor')\"', 'shard inspect ckpt DIR|FILE [--verify]' or 'shard inspect schedule --pipe "
                  "4 --micro-batches 8'");
        return 2;
    }
    if (cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_SPEC, 0);
    const char *mesh = NULL, *spec_text = NULL, *shape_text = NULL, *to_text = NULL;
    shard_dtype dtype = SHARD_F32;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        if (strcmp(arg, "--mesh") == 0 || strcmp(arg, "--spec") == 0 || strcmp(arg, "--shape") == 0 ||
            strcmp(arg, "--dtype") == 0 || strcmp(arg, "--to") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (arg[2] == 'm')
                mesh = v;
            else if (arg[2] == 't')
                to_text = v;
            else if (arg[3] == 'p')
                spec_text = v;
            else if (arg[3] == 'h')
                shape_text = v;
            else if (shard_dtype_parse(v, &dtype) < 0) {
                cli_error("--dtype: %s", shard_last_error());
                return 2;
            }
        } else {
            cli_unknown_option("inspect spec", arg, USAGE_SPEC);
            return 2;
        }
    }
    if (!mesh || !spec_text || !shape_text) {
        cli_error("inspect spec: --mesh, --shape and --spec are all required");
        return 2;
    }
    size_t shape[SHARD_MAX_DIMS];
    int ndim = 0;
    if (parse_shape(shape_text, shape, &ndim)) return 2;
    shard_mesh_layout layout;
    shard_spec spec;
    if (shard_mesh_layout_parse(mesh, 0, &layout) < 0 || shard_spec_parse(spec_text, &layout, ndim, &spec) < 0 ||
        shard_spec_check_dtype(&spec, dtype, "--spec") < 0) {
        cli_error("%s", shard_last_error());
        return 2;
    }
    shard_spec to;
    shard_redistribute_plan plan;
    if (to_text &&
        (shard_spec_parse(to_text, &layout, ndim, &to) < 0 ||
         shard_redistribute_plan_make(&layout, dtype, ndim, shape, &spec, &to, &plan) < 0)) {
        cli_error("--to: %s", shard_last_error());
        return 2;
    }
    shard_spec_describe(&spec, &layout, dtype, shape, stdout);
    if (!to_text) return 0;
    char a[256], b[256];
    shard_spec_string(&spec, &layout, a, sizeof a);
    shard_spec_string(&to, &layout, b, sizeof b);
    printf("\nredistribute %s -> %s: %d step%s, %llu bytes sent in all\n", a, b, plan.nsteps,
           plan.nsteps == 1 ? "" : "s", (unsigned long long)shard_redistribute_plan_total_bytes(&plan, -1));
    shard_redistribute_plan_print(&plan, stdout);
    return 0;
}
