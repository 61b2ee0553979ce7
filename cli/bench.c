/* bench.c — the `shard bench` verb: parses options and runs a benchmark:
 * `shard bench comm` (bench_comm.c), `shard bench redistribute` (bench_redistribute.c),
 * `shard bench ckpt` (bench_ckpt.c), `shard bench gemm` (bench_gemm.c); `train`, `tensor`,
 * `pipeline` and `moe` parse their own options (bench_train.c, bench_tensor.c, bench_pipeline.c,
 * bench_moe.c).  Each usage
 * text stands above the parser it describes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"
#include "profile.h"

static const char *const USAGE_BENCH =
    "usage: shard bench BENCHMARK [options]\n"
    "\n"
    "sub-verbs (shard help bench BENCHMARK: its options):\n"
    "  comm          collective bandwidth per message size, as nccl-tests reports it\n"
    "  redistribute  the common spec transitions of a 2-D f32 tensor timed against their collective\n"
    "  ckpt          save / load throughput of a sharded model beside plain write / read\n"
    "  gemm          sgemm GFLOP/s against the FMA peak measured in the same run\n"
    "  train         the GPT's training step (ms/step, tokens/s, MFU) against PyTorch's; data parallel\n"
    "                against PyTorch DDP\n"
    "  tensor        the GPT tensor parallel (and sequence parallel) against one rank\n"
    "  pipeline      the GPT pipelined: each schedule's bubble, activations per stage, ms/step\n"
    "  moe           the mixture-of-experts GPT on an expert mesh: its all_to_alls, load imbalance, and\n"
    "                PyTorch's step\n"
    "  analyze       the cost model's predicted step time against real runs of the tiny GPT's layouts\n"
    "  plan          the planner's choice against the best measured layout on each example cluster\n"
    "  reshard       a running job moved to another layout: bytes, pause and total time per transition\n"
    "\n"
    "options:\n";

static const char *const USAGE_COMM =
    "usage: shard bench comm [options]\n"
    "\n"
    "Collective bandwidth as nccl-tests reports it: for each message size, doubling from --min to --max,\n"
    "the median time of the slowest rank, algbw = bytes / time and busbw (algbw scaled by the collective's\n"
    "factor, to compare across rank counts).  Under MPI the raw MPI call is timed beside it in the same run.\n"
    "\n"
    "options:\n"
    "  --op OP                  all_reduce, all_gather, reduce_scatter, all_to_all or sendrecv\n"
    "                           (default all_reduce)\n"
    "  --min SIZE               the smallest message: bytes, or 4K, 256M, 1G (default 4K)\n"
    "  --max SIZE               the largest message, >= --min (default 256M)\n"
    "  --dtype T                the elements: f32, f64, bf16, f16, i8, i32, i64 or u8 (default f32)\n"
    "  --warmup K               untimed iterations per size, 0..100000 (default 3)\n"
    "  --iters K                timed iterations per size, 5..100000 (default: as many as fit in about\n"
    "                           0.2 s, at least 5)\n"
    "  --no-baseline            under MPI, leave out the raw MPI call (default: timed beside shard's)\n"
    "  --cold                   before each call every rank writes twice its last-level cache of other\n"
    "                           memory, then its send buffer afresh: caches as a training step leaves\n"
    "                           them (default: the same buffers call after call, hot in cache)\n"
    "  --json                   one JSON object per size instead of the table\n"
    "  --ranks N                ranks, 1..4096 (default 1; under mpirun the launcher's)\n";

static int bench_comm_main(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE_COMM, 1);
    bench_options opt;
    bench_options_default(&opt);
    cli_common common = {0};
    for (int i = 1; i < argc; i++) {
        int c = cli_common_option(&common, argc, argv, &i);
        if (c < 0) return 2;
        if (c > 0) continue;
        const char *arg = argv[i];
        const char *v = NULL;
        if (strcmp(arg, "--json") == 0) {
            opt.json = 1;
        } else if (strcmp(arg, "--no-baseline") == 0) {
            opt.baseline = 0;
        } else if (strcmp(arg, "--cold") == 0) {
            opt.cold = 1;
        } else if (strcmp(arg, "--op") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!bench_op_valid(v)) {
                cli_error("--op '%s' is invalid: give all_reduce, all_gather, reduce_scatter, all_to_all or sendrecv",
                          v);
                return 2;
            }
            opt.op = v;
        } else if (strcmp(arg, "--min") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_size("--min", v, &opt.min_bytes)) return 2;
        } else if (strcmp(arg, "--max") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_size("--max", v, &opt.max_bytes)) return 2;
        } else if (strcmp(arg, "--dtype") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (shard_dtype_parse(v, &opt.dtype) < 0) {
                cli_error("--dtype: %s", shard_last_error());
                return 2;
            }
        } else if (strcmp(arg, "--iters") == 0 || strcmp(arg, "--warmup") == 0) {
            long n;
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(arg, v, arg[2] == 'i' ? 5 : 0, 100000, &n)) return 2;
            if (arg[2] == 'i')
                opt.iters = (int)n;
            else
                opt.warmup = (int)n;
        } else {
            cli_unknown_option("bench comm", arg, USAGE_COMM);
            return 2;
        }
    }
    if (opt.min_bytes == 0 || opt.min_bytes > opt.max_bytes) {
        cli_error("bench comm: --min %llu and --max %llu are invalid: need 0 < min <= max",
                  (unsigned long long)opt.min_bytes, (unsigned long long)opt.max_bytes);
        return 2;
    }
    opt.launch = cli_launch_config(&common);
    shard_status s = bench_comm_run(&opt);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}

static const char *const USAGE_REDISTRIBUTE =
    "usage: shard bench redistribute [options]\n"
    "\n"
    "The common spec transitions of a 2-D f32 tensor over the mesh's first axis (split -> replicated,\n"
    "replicated -> split, partial -> replicated, partial -> split, split moved), each timed against the\n"
    "collective it reduces to, called on buffers of the same sizes in the same run.\n"
    "\n"
    "options:\n"
    "  --mesh MESH              the mesh, e.g. data=4 or data=2,tensor=2; its first axis, at most 1024,\n"
    "                           splits the tensor (default data=N over the ranks)\n"
    "  --bytes SIZE             the whole tensor's size, at least 4K (default 64M)\n"
    "  --warmup K               untimed iterations, 0..100000 (default 2)\n"
    "  --iters K                timed iterations, 5..100000 (default 7)\n"
    "  --json                   one JSON object per transition instead of the table\n"
    "  --ranks N                ranks, 1..4096, at most 1024 without --mesh (default: the mesh's size,\n"
    "                           else 1; under mpirun the launcher's)\n";

static int bench_redistribute_main(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE_REDISTRIBUTE, 1);
    bench_redist_options opt = {.bytes = 64ULL << 20, .warmup = 2, .iters = 7};
    cli_common common = {0};
    for (int i = 1; i < argc; i++) {
        int c = cli_common_option(&common, argc, argv, &i);
        if (c < 0) return 2;
        if (c > 0) continue;
        const char *arg = argv[i], *v = NULL;
        if (strcmp(arg, "--json") == 0) {
            opt.json = 1;
        } else if (strcmp(arg, "--mesh") == 0) {
            if (!(opt.mesh = cli_value(argc, argv, &i))) return 2;
            shard_mesh_layout layout; /* its syntax now, before any rank starts */
            if (strlen(opt.mesh) >= 128 || shard_mesh_layout_parse(opt.mesh, 0, &layout) < 0) {
                cli_error("--mesh '%s' is invalid: %s", opt.mesh,
                          strlen(opt.mesh) >= 128 ? "at most 127 characters" : shard_last_error());
                return 2;
            }
            if (layout.sizes[0] > 1024) {
                cli_error("--mesh '%s' is invalid: the first axis splits 1,024 columns, so at most 1024 ranks",
                          opt.mesh);
                return 2;
            }
        } else if (strcmp(arg, "--bytes") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_size("--bytes", v, &opt.bytes)) return 2;
            if (opt.bytes < 4096) {
                cli_error("--bytes %s is too small: give at least 4K", v);
                return 2;
            }
        } else if (strcmp(arg, "--iters") == 0 || strcmp(arg, "--warmup") == 0) {
            long n;
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(arg, v, arg[2] == 'i' ? 5 : 0, 100000, &n)) return 2;
            if (arg[2] == 'i')
                opt.iters = (int)n;
            else
                opt.warmup = (int)n;
        } else {
            cli_unknown_option("bench redistribute", arg, USAGE_REDISTRIBUTE);
            return 2;
        }
    }
    cli_ranks_from_mesh(&common, opt.mesh);
    opt.launch = cli_launch_config(&common);
    if (!opt.mesh && opt.launch.ranks > 1024) { /* the mesh data=N splits its 1,024 columns over N */
        cli_error("bench redistribute: --ranks %d is more than the 1024 its 1,024 columns split over",
                  opt.launch.ranks);
        return 2;
    }
    shard_status s = bench_redistribute_run(&opt);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}

static const char *const USAGE_CKPT =
    "usage: shard bench ckpt [options]\n"
    "\n"
    "Save and load throughput of a sharded model (8 f32 tensors split over data=N) beside this machine's\n"
    "plain sequential write (with fsync) and read of the same bytes, in the same run; medians over --iters.\n"
    "\n"
    "options:\n"
    "  --bytes SIZE             the model's size, at least 1M (default 1G)\n"
    "  --iters K                iterations, each a new step saved and loaded back, 5..1000 (default 5)\n"
    "  --dir DIR                where the checkpoints go (default: a new directory under /tmp)\n"
    "  --keep                   leave the last checkpoint there (default: removed)\n"
    "  --json                   one JSON object instead of the table\n"
    "  --ranks N                ranks, 1..4096 (default 4; under mpirun the launcher's)\n";

static int bench_ckpt_main(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE_CKPT, 1);
    bench_ckpt_options opt = {.bytes = 1ULL << 30, .iters = 5};
    cli_common common = {0};
    for (int i = 1; i < argc; i++) {
        int c = cli_common_option(&common, argc, argv, &i);
        if (c < 0) return 2;
        if (c > 0) continue;
        const char *arg = argv[i], *v = NULL;
        if (strcmp(arg, "--json") == 0) {
            opt.json = 1;
        } else if (strcmp(arg, "--keep") == 0) {
            opt.keep = 1;
        } else if (strcmp(arg, "--dir") == 0) {
            if (!(opt.dir = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(arg, "--bytes") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_size("--bytes", v, &opt.bytes)) return 2;
            if (opt.bytes < (1u << 20)) {
                cli_error("--bytes %s is too small: give at least 1M", v);
                return 2;
            }
        } else if (strcmp(arg, "--iters") == 0) {
            long n;
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(arg, v, 5, 1000, &n)) return 2;
            opt.iters = (int)n;
        } else {
            cli_unknown_option("bench ckpt", arg, USAGE_CKPT);
            return 2;
        }
    }
    if (!common.ranks && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE")) common.ranks = 4;
    opt.launch = cli_launch_config(&common);
    shard_status s = bench_ckpt_run(&opt);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}

static const char *const USAGE_GEMM =
    "usage: shard bench gemm [options]\n"
    "\n"
    "sgemm GFLOP/s of a square product (OpenBLAS, with the kernels chosen for this CPU) against this\n"
    "machine's fp32 FMA peak on as many threads, measured in the same run; medians over --iters.\n"
    "\n"
    "options:\n"
    "  --size N                 M = N = K, 16..16384 (default 4096)\n"
    "  --threads N              BLAS threads, 1..64 (default 1)\n"
    "  --iters K                timed runs, 5..1000 (default 5)\n"
    "  --json                   one JSON object instead of the table\n";

static int bench_gemm_main(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE_GEMM, 0);
    bench_gemm_options opt = {.size = 4096, .threads = 1, .iters = 5};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        long n;
        if (strcmp(arg, "--json") == 0) {
            opt.json = 1;
        } else if (strcmp(arg, "--size") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(arg, v, 16, 16384, &n)) return 2;
            opt.size = (size_t)n;
        } else if (strcmp(arg, "--threads") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(arg, v, 1, 64, &n)) return 2;
            opt.threads = (int)n;
        } else if (strcmp(arg, "--iters") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(arg, v, 5, 1000, &n)) return 2;
            opt.iters = (int)n;
        } else {
            cli_unknown_option("bench gemm", arg, USAGE_GEMM);
            return 2;
        }
    }
    shard_status s = bench_gemm_run(&opt);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}

int cli_bench(int argc, char **argv) {
    if (argc >= 2 && cli_is_help(argv[1])) return cli_usage(USAGE_BENCH, 0);
    if (argc >= 2 && strcmp(argv[1], "comm") == 0) return bench_comm_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "redistribute") == 0) return bench_redistribute_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "ckpt") == 0) return bench_ckpt_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "gemm") == 0) return bench_gemm_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "train") == 0) return cli_bench_train(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "tensor") == 0) return cli_bench_tensor(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "pipeline") == 0) return cli_bench_pipeline(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "moe") == 0) return cli_bench_moe(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "analyze") == 0) return cli_bench_analyze(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "plan") == 0) return cli_bench_plan(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "reshard") == 0) return cli_bench_reshard(argc - 1, argv + 1);
    if (argc >= 2)
        cli_error("bench: unknown benchmark '%s': give comm, redistribute, ckpt, gemm, train, tensor, pipeline, moe, "
                  "analyze, plan or reshard "
                  "(see 'shard help')",
                  argv[1]);
    else
        cli_error("bench: give what to benchmark: comm, redistribute, ckpt, gemm, train, tensor, pipeline, moe, "
                  "analyze, plan or reshard, e.g. "
                  "'shard bench comm --op all_reduce --ranks 2' (see 'shard help')");
    return 2;
}
