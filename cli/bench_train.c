/* bench_train.c — `shard bench train`: the GPT's training step (forward,
 * backward, clipping, AdamW) on random tokens, median ms/step over >= 20
 * steps after warm-up, tokens/s and MFU ((6 N + 12 L s h) x tokens per step,
 * the usual count, against the FMA peak measured in the same run), then — in the same run —
 * tools/reference/bench_gpt_torch.py (PyTorch, Debian's python3-torch) on
 * the same config and batch, and the ratio.  Also the step's matrix products
 * timed one by one (bench_gpt_products): the floor OpenBLAS sets for the step.
 *
 *   shard bench train --config CONFIG.json [--batch 8] [--seq 128] [--steps 20] [--warmup 3]
 *                     [--threads 2] [--no-torch] [--json]
 *                     [--ranks N --mesh data=N --zero K --bucket-mb M --grad-dtype bf16 --compute-dtype bf16]
 *                     (those: bench_train_dp.c) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/cost.h"
#include "shard/shard.h"

static const char *const USAGE =
    "usage: shard bench train --config CONFIG.json [options]\n"
    "\n"
    "The GPT's training step (forward, backward, clipping, AdamW) on random tokens: the median ms/step,\n"
    "tokens/s and MFU against the FMA peak measured in the same run, the step's matrix products timed\n"
    "alone, and PyTorch's step on the same config in the same run.  With --ranks N > 1 (or --mesh data=N),\n"
    "--zero, --bucket-mb, --grad-dtype, --compute-dtype or under mpirun: the trainer data parallel on N\n"
    "ranks (one BLAS thread each) against one rank and PyTorch DDP.\n"
    "\n"
    "options:\n"
    "  --config FILE            the GPT's config JSON (required), e.g. configs/gpt-bench.json\n"
    "  --batch B                rows per step (global), 1..4096 (default 8)\n"
    "  --seq T                  tokens per row, 1..65536 (default 128)\n"
    "  --steps S                timed steps, 20..100000 (default 20)\n"
    "  --warmup W               untimed steps first, 0..1000 (default 3)\n"
    "  --threads N              BLAS threads of the one-rank benchmark, 1..64 (default 2)\n"
    "  --no-torch               leave out PyTorch (default: measured)\n"
    "  --json                   one JSON object instead of the report\n"
    "data parallel (--backend and --timeout act on it alone):\n"
    "  --ranks N                ranks, 1..4096 (default 1: the one-rank benchmark)\n"
    "  --mesh data=N            the same as --ranks N\n"
    "  --zero K                 the ZeRO stage, 0..3 (default 0)\n"
    "  --bucket-mb M            the gradient bucket size in MiB, (0, 1e6] (default 25)\n"
    "  --grad-dtype D           gradients sent as f32 or bf16 (default f32)\n"
    "  --compute-dtype D        f32, or bf16 compute copies of f32 master values (default f32)\n";

int cli_bench_train(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 1);
    bench_train_opts o = {
        .batch = 8, .seq = 128, .steps = 20, .warmup = 3, .threads = 2, .zero = -1, .bucket_mb = 25, .torch = 1};
    cli_common common = {0};
    int mesh_ranks = 0, threads_given = 0; /* --mesh data=N; --threads */
    for (int i = 1; i < argc; i++) {
        int cc = cli_common_option(&common, argc, argv, &i);
        if (cc < 0) return 2;
        if (cc > 0) continue;
        const char *a = argv[i], *v = NULL;
        long *ints[] = {&o.batch, &o.seq, &o.steps, &o.warmup, &o.threads, &o.zero};
        const char *names[] = {"--batch", "--seq", "--steps", "--warmup", "--threads", "--zero"};
        const long lo[] = {1, 1, 20, 0, 1, 0}, hi[] = {4096, 65536, 100000, 1000, 64, 3};
        int done = 0;
        for (int k = 0; k < 6 && !done; k++)
            if (strcmp(a, names[k]) == 0) {
                if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, lo[k], hi[k], ints[k])) return 2;
                done = 1, threads_given |= ints[k] == &o.threads;
            }
        if (done) continue;
        if (strcmp(a, "--config") == 0) {
            if (!(o.config = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--mesh") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            double n = 0;
            if (strncmp(v, "data=", 5) != 0 || !cli_number(v + 5, &n) || n != (long)n || n < 1 || n > 4096) {
                cli_error("bench train: --mesh '%s' is invalid here: give data=N (the ranks)", v);
                return 2;
            }
            mesh_ranks = (int)n;
        } else if (strcmp(a, "--bucket-mb") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_number(v, &o.bucket_mb) || !(o.bucket_mb > 0) || o.bucket_mb > 1e6) {
                cli_error("--bucket-mb '%s' is invalid: give a number in (0, 1e6] (MiB), e.g. 25", v);
                return 2;
            }
            if (o.zero < 0) o.zero = 0;
        } else if (strcmp(a, "--grad-dtype") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "f32") && strcmp(v, "bf16")) {
                cli_error("--grad-dtype '%s' is invalid: give f32 or bf16", v);
                return 2;
            }
            o.bf16 = strcmp(v, "bf16") == 0;
            if (o.zero < 0) o.zero = 0; /* a data-parallel option: the trainer's benchmark */
        } else if (strcmp(a, "--compute-dtype") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "f32") && strcmp(v, "bf16")) {
                cli_error("--compute-dtype '%s' is invalid: give f32 or bf16", v);
                return 2;
            }
            o.bf16_compute = strcmp(v, "bf16") == 0;
            if (o.zero < 0) o.zero = 0;
        } else if (strcmp(a, "--json") == 0) {
            o.json = 1;
        } else if (strcmp(a, "--no-torch") == 0) {
            o.torch = 0;
        } else {
            cli_unknown_option("bench train", a, USAGE);
            return 2;
        }
    }
    if (!o.config) {
        cli_error("bench train: --config CONFIG.json is required (e.g. configs/gpt-bench.json)");
        return 2;
    }
    if (mesh_ranks && common.ranks && mesh_ranks != common.ranks) {
        cli_error("bench train: --mesh data=%d and --ranks %d disagree: the data axis spans every rank", mesh_ranks,
                  common.ranks);
        return 2;
    }
    if (mesh_ranks && !common.ranks) common.ranks = mesh_ranks;
    char env[64];
    int mrank, msize;
    if (common.ranks > 1 || o.zero >= 0 || shard_launch_detect_mpi(env, sizeof env, &mrank, &msize)) {
        if (threads_given) { /* not silently: the data-parallel benchmark counts a rank as a core */
            cli_error("bench train: --threads is for the one-rank benchmark; with --ranks, --zero, --bucket-mb, "
                      "--grad-dtype, --compute-dtype or under mpirun every rank runs one BLAS thread");
            return 2;
        }
        if (o.zero < 0) o.zero = 0;
        return cli_bench_train_dp(&o, &common);
    }
    if (common.backend == SHARD_BACKEND_MPI || common.timeout > 0) {
        cli_error("bench train: --backend and --timeout are for ranks; the one-rank benchmark has none (give --ranks N "
                  "with N > 1, or --zero K)");
        return 2;
    }
    const char *config = o.config;
    long batch = o.batch, seq = o.seq, steps = o.steps, warmup = o.warmup, threads = o.threads;
    int json = o.json, torch = o.torch;
    shard_gpt_config c;
    shard_gpt *g = NULL;
    shard_params *grads = NULL, *m = NULL, *v = NULL;
    size_t B = (size_t)batch, T = (size_t)seq, N = B * T;
    int32_t *in = malloc(N * sizeof *in), *tg = malloc(N * sizeof *tg);
    double *ms = calloc((size_t)steps, sizeof *ms);
    shard_status s = in && tg && ms ? shard_gpt_config_load(config, &c) : SHARD_ERR_NO_MEMORY;
    if (s == SHARD_OK) s = shard_blas_set_threads((int)threads);
    if (s == SHARD_OK)
        s = shard_gpt_create_training(&c, B, T, &g); /* as the trainer: the loss gradient over the logits */
    if (s == SHARD_OK) s = shard_params_like(shard_gpt_params(g), SHARD_MEM_GRADS, &grads);
    if (s == SHARD_OK) s = shard_params_like(shard_gpt_params(g), SHARD_MEM_OPTIMIZER, &m);
    if (s == SHARD_OK) s = shard_params_like(shard_gpt_params(g), SHARD_MEM_OPTIMIZER, &v);
    if (s == SHARD_OK) shard_gpt_init(g, 1);
    shard_adamw_config ac = shard_adamw_defaults();
    if (s == SHARD_OK) shard_params_zero(grads); /* from then on the update leaves them zeroed, as in training */
    uint64_t r = 1;
    for (long step = 0; s == SHARD_OK && step < warmup + steps; step++) {
        for (size_t i = 0; i < N; i++) { /* random tokens */
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            in[i] = (int32_t)((r >> 33) % c.vocab_size), tg[i] = (int32_t)((r >> 13) % c.vocab_size);
        }
        double t0 = shard_clock_seconds();
        float loss;
        s = shard_gpt_forward(g, in, tg, B, T, &loss);
        if (s == SHARD_OK) s = shard_gpt_backward(g, grads);
        if (s == SHARD_OK) {
            shard_params *p = shard_gpt_params(g);
            float clip = shard_clip_factor(sqrt(shard_sum_squares(grads->data, grads->total)), 1.0f);
            shard_adamw_update_clipped(&ac, (uint64_t)step + 1, 1e-3f, clip, p->data, grads->data, m->data, v->data,
                                       p->total);
        }
        if (step >= warmup) ms[step - warmup] = (shard_clock_seconds() - t0) * 1e3;
    }
    if (s < 0) {
        cli_error("%s", shard_last_error());
        free(in), free(tg), free(ms);
        shard_params_destroy(grads), shard_params_destroy(m), shard_params_destroy(v);
        shard_gpt_destroy(g);
        return 1;
    }
    double med = cli_median(ms, (int)steps), peak = bench_peak_of_threads((int)threads, 5);
    double flops = shard_cost_gpt_flops_per_token(&c, T) * (double)N, mfu = flops / (med / 1e3) / (peak * 1e9);
    double prod_ms = 0, prod_gflop = 0; /* the products' least time: how much of the step is left to the rest */
    s = bench_gpt_products(&c, N, 9, &prod_ms, &prod_gflop);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        free(in), free(tg), free(ms);
        shard_params_destroy(grads), shard_params_destroy(m), shard_params_destroy(v);
        shard_gpt_destroy(g);
        return 1;
    }
    /* the floor any kernel meets on this machine: the products' FLOPs at the measured FMA peak */
    double at_peak_ms = prod_gflop / peak * 1e3;
    double tms = -1;
    char why[300] = "";
    if (torch)
        tms = bench_reference_ms("bench_gpt_torch.py", config, (long[5]){batch, seq, steps, warmup, threads}, NULL, 1,
                                 why, sizeof why);
    if (torch && tms <= 0 && json) /* said on stderr too: a loop over --json runs must not lose the ratio unseen */
        cli_error("bench train: PyTorch not measured: %s", why);
    if (json) {
        char cfg_json[4200];
        printf("{\"config\": %s, \"batch\": %ld, \"seq\": %ld, \"threads\": %ld, \"ms_per_step\": %.3f, "
               "\"tokens_per_s\": %.1f, "
               "\"mfu\": %.4f, \"fma_peak_gflops\": %.1f",
               cli_json_string(config, cfg_json, sizeof cfg_json), batch, seq, threads, med, (double)N / (med / 1e3),
               mfu, peak);
        printf(", \"products_alone_ms\": %.3f, \"products_gflop\": %.9g, \"products_at_peak_ms\": %.6g", prod_ms,
               prod_gflop, at_peak_ms);
        char why_json[700];
        if (tms > 0)
            printf(", \"torch_ms_per_step\": %.3f, \"speedup_vs_torch\": %.4f", tms, tms / med);
        else if (torch)
            printf(", \"torch_error\": %s", cli_json_string(why, why_json, sizeof why_json));
        printf("}\n");
    } else {
        printf("# shard bench train: %s, batch %ld x %ld, %ld threads, median of %ld steps after %ld warm-up\n", config,
               batch, seq, threads, steps, warmup);
        printf(
            "shard:   %8.1f ms/step  %9.0f tokens/s  MFU %.1f%% of %.0f GFLOP/s (%.2f M parameters, 6 N + 12 L s h = "
            "%.1f MFLOP/token)\n",
            med, (double)N / (med / 1e3), 100 * mfu, peak, (double)shard_gpt_param_count(&c) / 1e6,
            shard_cost_gpt_flops_per_token(&c, T) / 1e6);
        printf("products alone: %.1f ms/step (%.2f GFLOP at %.0f GFLOP/s: the linear layers' and LM head's products, "
               "each\n"
               "         timed on its own with warm operands); the rest of the step: %.1f ms\n",
               prod_ms, prod_gflop, prod_gflop / (prod_ms / 1e3), med - prod_ms);
        printf("at the FMA peak the products would take %.1f ms/step: no step on this machine is faster\n", at_peak_ms);
        if (tms > 0)
            printf("PyTorch: %8.1f ms/step  (tools/reference/bench_gpt_torch.py, same run)  speedup %.2fx\n", tms,
                   tms / med);
        else if (torch)
            printf("PyTorch: not measured: %s\n", why);
    }
    free(in), free(tg), free(ms);
    shard_params_destroy(grads), shard_params_destroy(m), shard_params_destroy(v);
    shard_gpt_destroy(g);
    return 0;
}
