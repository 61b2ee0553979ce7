/* bench.c — the `shard bench` verb: parses options and runs a benchmark:
 * `shard bench comm` (bench_comm.c), `shard bench redistribute` (bench_redistribute.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"

static int bench_comm_main(int argc, char **argv) {
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
        } else if (strcmp(arg, "--op") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!bench_op_valid(v)) {
                cli_error("--op '%s' is invalid: give all_reduce, all_gather, reduce_scatter, all_to_all or sendrecv", v);
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
            if (arg[2] == 'i') opt.iters = (int)n;
            else opt.warmup = (int)n;
        } else {
            cli_error("bench comm: unknown option '%s' (see 'shard help')", arg);
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

static int bench_redistribute_main(int argc, char **argv) {
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
                cli_error("--mesh '%s' is invalid: %s", opt.mesh, strlen(opt.mesh) >= 128 ? "at most 127 characters"
                                                                                     : shard_last_error());
                return 2;
            }
            if (layout.sizes[0] > 1024) {
                cli_error("--mesh '%s' is invalid: the first axis splits 1,024 columns, so at most 1024 ranks", opt.mesh);
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
            if (arg[2] == 'i') opt.iters = (int)n;
            else opt.warmup = (int)n;
        } else {
            cli_error("bench redistribute: unknown option '%s' (see 'shard help')", arg);
            return 2;
        }
    }
    cli_ranks_from_mesh(&common, opt.mesh);
    opt.launch = cli_launch_config(&common);
    if (!opt.mesh && opt.launch.ranks > 1024) { /* the mesh data=N splits its 1,024 columns over N */
        cli_error("bench redistribute: --ranks %d is more than the 1024 its 1,024 columns split over", opt.launch.ranks);
        return 2;
    }
    shard_status s = bench_redistribute_run(&opt);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}

static int bench_ckpt_main(int argc, char **argv) {
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
            cli_error("bench ckpt: unknown option '%s' (see 'shard help')", arg);
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

static int bench_gemm_main(int argc, char **argv) {
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
            cli_error("bench gemm: unknown option '%s' (see 'shard help')", arg);
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
    if (argc >= 2 && strcmp(argv[1], "comm") == 0) return bench_comm_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "redistribute") == 0) return bench_redistribute_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "ckpt") == 0) return bench_ckpt_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "gemm") == 0) return bench_gemm_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "train") == 0) return cli_bench_train(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "tensor") == 0) return cli_bench_tensor(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "pipeline") == 0) return cli_bench_pipeline(argc - 1, argv + 1);
    if (argc >= 2)
        cli_error("bench: unknown benchmark '%s': give comm, redistribute, ckpt, gemm, train, tensor or pipeline "
                  "(see 'shard help')", argv[1]);
    else
        cli_error("bench: give what to benchmark: comm, redistribute, ckpt, gemm, train, tensor or pipeline, e.g. "
                  "'shard bench comm --op all_reduce --ranks 2' (see 'shard help')");
    return 2;
}
