/* bench_moe.c — `shard bench moe`: the mixture-of-experts GPT trained by the
 * trainer on an expert mesh (default expert=N over N ranks, one BLAS thread
 * per rank), and in the same run:
 *   - the time each step spends in the experts' all_to_alls (the counts,
 *     dispatch and combine exchanges of forward and backward, timed inside
 *     the exchange: shard_expert_stats, expert.h) and the bytes handed to them;
 *   - the load imbalance: max / mean assignments per expert of each MoE
 *     layer over the global batch (the step's expert load), averaged over the
 *     layers, and the worst layer's;
 *   - the same bytes through `shard bench comm --op all_to_all`'s measurement
 *     on the expert axis: the exchange's busbw in the step against the
 *     collective's alone, and the share of dispatch time hidden behind
 *     compute, 1 - exposed / alone (exposed: the least dispatch time any rank
 *     waited in the step, as the rank that arrives last waits only for the
 *     transfer; alone: as many all_to_alls of the mean dispatch size, no
 *     compute), clamped to [0, 1].  The exchange blocks the layer, so nothing
 *     can overlap it: a figure near 0 is the expected one;
 *   - the same model, batch and steps in PyTorch on one process
 *     (tools/reference/moe_bench.py, a loop over experts with index_select /
 *     index_add), and the ratio: its ms / shard's.
 * Step times are rank 0's, the median over the timed steps; random tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"
#include "shard/comm.h"
#include "shard/expert.h"
#include "shard/shard.h"

static const char *const USAGE =
    "usage: shard bench moe --config CONFIG.json [options]\n"
    "\n"
    "The mixture-of-experts GPT trained on an expert mesh (one BLAS thread per rank): median ms/step, the\n"
    "time and bytes of the experts' all_to_alls (counts, dispatch, combine; forward and backward), the load\n"
    "imbalance (max / mean assignments per expert), the exchange's busbw against `shard bench comm --op\n"
    "all_to_all` for the same bytes, the share of dispatch time hidden behind compute, and the same model\n"
    "in PyTorch on one process (tools/reference/moe_bench.py), all in the same run.  Random tokens.\n"
    "\n"
    "options:\n"
    "  --batch B                rows per step (global), 1..4096 (default 8)\n" BENCH_MODEL_OPTIONS_USAGE
    "  --mesh MESH              the mesh, e.g. expert=2 or data=2,expert=2 (default expert=N over the ranks)\n"
    "  --warmup K               untimed steps first, 0..1000 (default 2)\n"
    "  --threads N              PyTorch's threads, 1..64 (default 2)\n"
    "  --no-peer                leave out the PyTorch run (default: run it)\n"
    "  --ranks N                ranks, 1..4096 (default: the mesh's size, else 2; under mpirun the launcher's)\n";

typedef struct moe_result {
    double step_ms, a2a_ms, counts_ms, dispatch_ms, combine_ms, exposed_dispatch_ms, least_data_ms;
    double bytes, data_bytes, calls, data_calls, dispatch_calls, imbalance, worst_imbalance;
    double alone_call_us, alone_call_bytes, dropped;
    int expert_ranks;
} moe_result;

typedef struct moe_args {
    const char *config, *mesh;
    long batch, seq, steps, warmup;
    char dir[256];
    moe_result r;
} moe_args;

/* max / mean of each layer's load over its experts: (mean over layers, the largest) */
static void imbalance_of(const shard_step_result *r, double *mean, double *worst) {
    *mean = *worst = 0;
    for (size_t l = 0; l < r->moe_layers; l++) {
        double sum = 0, most = 0;
        for (size_t e = 0; e < r->experts; e++) {
            double v = r->expert_load[l * r->experts + e];
            sum += v, most = v > most ? v : most;
        }
        double x = sum > 0 ? most / (sum / (double)r->experts) : 0;
        *mean += x / (double)r->moe_layers, *worst = x > *worst ? x : *worst;
    }
}

enum { F_STEP, F_A2A, F_COUNTS, F_DISPATCH, F_COMBINE, F_EXPOSED, F_LEAST_DATA, F_IMB, F_WORST, F_DROPPED, F_N };

static shard_status moe_rank(shard_comm *comm, void *arg) {
    moe_args *a = arg;
    SHARD_CHECK(shard_blas_set_threads(1));
    shard_mesh *mesh = NULL;
    shard_trainer *t = NULL;
    shard_trainer_config c = {.config_path = a->config,
                              .data_dir = a->dir,
                              .batch = (size_t)a->batch,
                              .seq = (size_t)a->seq,
                              .seed = 1,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f};
    c.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, (uint64_t)(a->steps + a->warmup)};
    char text[160];
    snprintf(text, sizeof text, "%s", a->mesh ? a->mesh : "");
    if (!a->mesh) snprintf(text, sizeof text, "expert=%d", shard_comm_size(comm));
    size_t S = (size_t)a->steps;
    double *v = calloc(S * F_N, sizeof *v), tally[4] = {0}; /* bytes, data bytes, calls, dispatch calls */
    shard_status s = v ? shard_mesh_create(comm, text, &mesh) : SHARD_ERR_NO_MEMORY;
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &t);
    for (long i = 0; s == SHARD_OK && i < a->warmup + a->steps; i++) {
        shard_step_result r;
        shard_expert_stats x = {.struct_size = sizeof x};
        s = shard_comm_barrier(comm);
        shard_expert_stats_reset();
        if (s == SHARD_OK) s = shard_trainer_step(t, (uint64_t)i + 1, &r);
        if (s == SHARD_OK) s = shard_expert_stats_get(&x);
        if (s == SHARD_OK && r.experts == 0)
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "bench moe: %s has no mixture of experts: give a config with "
                            "num_local_experts > 0, e.g. configs/gpt-moe-bench.json",
                            a->config);
        /* the least time any rank waited in the exchanges: the last to arrive saw only the transfer */
        double mine[2] = {x.dispatch_ms, x.dispatch_ms + x.combine_ms}, least[2];
        if (s == SHARD_OK) s = shard_comm_all_reduce(comm, mine, least, 2, SHARD_F64, SHARD_OP_MIN);
        if (s < 0 || i < a->warmup) continue;
        double *f = v + (size_t)(i - a->warmup) * F_N;
        f[F_STEP] = r.ms, f[F_COUNTS] = x.counts_ms, f[F_DISPATCH] = x.dispatch_ms, f[F_COMBINE] = x.combine_ms;
        f[F_A2A] = x.counts_ms + x.dispatch_ms + x.combine_ms, f[F_EXPOSED] = least[0], f[F_LEAST_DATA] = least[1];
        f[F_DROPPED] = r.dropped_tokens;
        imbalance_of(&r, &f[F_IMB], &f[F_WORST]);
        tally[0] += (double)(x.counts_bytes + x.dispatch_bytes + x.combine_bytes) / (double)S;
        tally[1] += (double)(x.dispatch_bytes + x.combine_bytes) / (double)S;
        tally[2] += (double)(x.counts_calls + x.dispatch_calls + x.combine_calls) / (double)S;
        tally[3] += (double)x.dispatch_calls / (double)S;
    }
    moe_result m = {0};
    double med[F_N], *col = calloc(S, sizeof *col);
    if (s == SHARD_OK && !col) s = SHARD_ERR_NO_MEMORY;
    for (int k = 0; s == SHARD_OK && k < F_N; k++) {
        for (size_t i = 0; i < S; i++) col[i] = v[i * F_N + (size_t)k];
        med[k] = cli_median(col, (int)S);
    }
    int ax = mesh ? shard_mesh_axis_index(mesh, "expert") : -1;
    shard_comm *expert = ax >= 0 ? shard_mesh_axis_comm(mesh, ax) : NULL;
    m.expert_ranks = expert ? shard_comm_size(expert) : 1;
    if (s == SHARD_OK) {
        m.step_ms = med[F_STEP], m.a2a_ms = med[F_A2A], m.counts_ms = med[F_COUNTS];
        m.dispatch_ms = med[F_DISPATCH], m.combine_ms = med[F_COMBINE], m.exposed_dispatch_ms = med[F_EXPOSED];
        m.least_data_ms = med[F_LEAST_DATA], m.imbalance = med[F_IMB], m.worst_imbalance = med[F_WORST];
        m.dropped = med[F_DROPPED];
        m.bytes = tally[0], m.data_bytes = tally[1], m.calls = tally[2], m.dispatch_calls = tally[3];
        m.data_calls = 2 * tally[3]; /* every dispatch has its combine (forward's, and backward's inverse) */
    }
    /* the mean dispatch / combine message (over the ranks: one size for all) through bench comm's all_to_all,
     * on the expert axis */
    double call_bytes = m.data_calls > 0 ? m.data_bytes / m.data_calls : 0;
    if (s == SHARD_OK) s = shard_comm_all_reduce(comm, &call_bytes, &call_bytes, 1, SHARD_F64, SHARD_OP_SUM);
    if (s == SHARD_OK && m.expert_ranks > 1 && m.data_calls > 0) {
        uint64_t size = (uint64_t)(call_bytes / shard_comm_size(comm)), moved = 0;
        size -= size % (4 * (uint64_t)m.expert_ranks);
        if (size < 4 * (uint64_t)m.expert_ranks) size = 4 * (uint64_t)m.expert_ranks;
        s = bench_comm_op_time(expert, "all_to_all", size, SHARD_F32, &m.alone_call_us, &moved);
        m.alone_call_bytes = (double)moved;
    }
    if (s == SHARD_OK && shard_comm_rank(comm) == 0) a->r = m;
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    free(v), free(col);
    return s;
}

/* --mesh, --warmup, --threads and --no-peer taken out of argv into `rest` (the options bench_model_options
 * reads): 0, or the exit code after one error line. */
static int own_options(int argc, char **argv, char **rest, int *rest_n, moe_args *a, long *threads, int *peer) {
    *rest_n = 0;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = NULL;
        long n;
        if (i > 0 && strcmp(o, "--no-peer") == 0) {
            *peer = 0;
        } else if (i > 0 && strcmp(o, "--mesh") == 0) {
            if (!(a->mesh = cli_value(argc, argv, &i))) return 2;
            shard_mesh_layout layout; /* its syntax now, before any rank starts */
            if (strlen(a->mesh) >= 128 || shard_mesh_layout_parse(a->mesh, 0, &layout) < 0) {
                cli_error("--mesh '%s' is invalid: %s", a->mesh,
                          strlen(a->mesh) >= 128 ? "at most 127 characters" : shard_last_error());
                return 2;
            }
        } else if (i > 0 && (strcmp(o, "--warmup") == 0 || strcmp(o, "--threads") == 0)) {
            int w = o[2] == 'w';
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(o, v, w ? 0 : 1, w ? 1000 : 64, &n)) return 2;
            *(w ? &a->warmup : threads) = n;
        } else {
            rest[(*rest_n)++] = argv[i];
        }
    }
    return 0;
}

int cli_bench_moe(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 1);
    moe_args a = {.warmup = 2};
    long threads = 2;
    int peer = 1, rest_n = 0;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return cli_error("bench moe: out of memory"), 1;
    int rc = own_options(argc, argv, rest, &rest_n, &a, &threads, &peer);
    bench_model_opts mo = {.batch = 8, .seq = 128, .steps = 10};
    if (!rc) rc = bench_model_options(rest_n, rest, "bench moe", &mo);
    free(rest);
    if (rc) return rc;
    cli_common common = mo.common;
    int ranks_given = 0;
    for (int i = 1; i < argc; i++) ranks_given |= strcmp(argv[i], "--ranks") == 0;
    if (a.mesh && !ranks_given) { /* the mesh's size, not the default 2 */
        common.ranks = 0;
        cli_ranks_from_mesh(&common, a.mesh);
    }
    a.config = mo.config, a.batch = mo.batch, a.seq = mo.seq, a.steps = mo.steps;
    shard_gpt_config gc;
    shard_status s = bench_random_tokens(a.config, &gc, a.dir, sizeof a.dir);
    shard_launch_config launch = cli_launch_config(&common);
    if (s == SHARD_OK) s = shard_launch_with(&launch, moe_rank, &a);
    if (a.dir[0]) bench_remove_dir(a.dir);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    const moe_result *m = &a.r;
    if (m->step_ms <= 0) return 0; /* an MPI rank other than 0 */
    double n = m->expert_ranks, factor = n > 1 ? (n - 1) / n : 0;
    double call_bytes = m->data_calls > 0 ? m->data_bytes / m->data_calls : 0;
    /* the exchange in the step: its mean message over the least waiting rank's mean call time */
    double step_busbw = m->least_data_ms > 0 ? call_bytes / (m->least_data_ms / m->data_calls * 1e6) * factor : 0;
    double comm_busbw = m->alone_call_us > 0 ? m->alone_call_bytes / (m->alone_call_us * 1e3) * factor : 0;
    double busbw_fraction = comm_busbw > 0 ? step_busbw / comm_busbw : 0;
    double alone_dispatch_ms = m->alone_call_us / 1e3 * m->dispatch_calls;
    double hidden = alone_dispatch_ms > 0 ? 1 - m->exposed_dispatch_ms / alone_dispatch_ms : 0;
    hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
    char why[300] = "";
    double pms = peer
        ? bench_reference_ms("moe_bench.py", a.config, (long[5]){a.batch, a.seq, a.steps, a.warmup, threads}, NULL, 1,
                             why, sizeof why)
        : -1;
    if (peer && pms <= 0 && mo.json) cli_error("bench moe: PyTorch not measured: %s", why);
    char mesh_text[160];
    snprintf(mesh_text, sizeof mesh_text, "%s", a.mesh ? a.mesh : "");
    if (!a.mesh) snprintf(mesh_text, sizeof mesh_text, "expert=%d", launch.ranks);
    if (mo.json) {
        char cfg_json[4200], mesh_json[400], why_json[700];
        printf("{\"config\": %s, \"mesh\": %s, \"ranks\": %d, \"expert_ranks\": %d, \"batch\": %ld, \"seq\": %ld, "
               "\"steps\": %ld, \"warmup\": %ld, \"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"all_to_all_ms\": %.3f, "
               "\"all_to_all_counts_ms\": %.3f, \"all_to_all_dispatch_ms\": %.3f, \"all_to_all_combine_ms\": %.3f, "
               "\"all_to_all_fraction\": %.4f, \"all_to_all_bytes\": %.0f, \"all_to_all_calls\": %.0f, "
               "\"load_imbalance\": %.4f, \"load_imbalance_worst_layer\": %.4f, \"dropped_fraction\": %.4f, "
               "\"exposed_dispatch_ms\": %.3f, \"alone_dispatch_ms\": %.3f, \"hidden_fraction\": %.4f, "
               "\"all_to_all_busbw_gbps\": %.6g, \"comm_all_to_all_bytes\": %.0f, \"comm_all_to_all_busbw_gbps\": "
               "%.6g, \"all_to_all_busbw_fraction\": %.4f",
               cli_json_string(a.config, cfg_json, sizeof cfg_json),
               cli_json_string(mesh_text, mesh_json, sizeof mesh_json), launch.ranks, m->expert_ranks, a.batch, a.seq,
               a.steps, a.warmup, m->step_ms, (double)(a.batch * a.seq) / (m->step_ms / 1e3), m->a2a_ms, m->counts_ms,
               m->dispatch_ms, m->combine_ms, m->a2a_ms / m->step_ms, m->bytes, m->calls, m->imbalance,
               m->worst_imbalance, m->dropped, m->exposed_dispatch_ms, alone_dispatch_ms, hidden, step_busbw,
               m->alone_call_bytes, comm_busbw, busbw_fraction);
        if (pms > 0)
            printf(", \"peer_step_ms\": %.3f, \"peer_threads\": %ld, \"ratio_vs_peer\": %.4f", pms, threads,
                   pms / m->step_ms);
        else if (peer)
            printf(", \"peer_error\": %s", cli_json_string(why, why_json, sizeof why_json));
        printf("}\n");
        return 0;
    }
    printf("# shard bench moe: %s, mesh %s, batch %ld x %ld, median of %ld steps after %ld warm-up\n", a.config,
           mesh_text, a.batch, a.seq, a.steps, a.warmup);
    printf("shard:      %8.1f ms/step  %9.0f tokens/s (1 BLAS thread per rank)\n", m->step_ms,
           (double)(a.batch * a.seq) / (m->step_ms / 1e3));
    printf("all_to_all: %8.2f ms/step (%.1f%% of the step): counts %.2f, dispatch %.2f, combine %.2f; %.0f calls, "
           "%.2f MiB per rank\n",
           m->a2a_ms, 100 * m->a2a_ms / m->step_ms, m->counts_ms, m->dispatch_ms, m->combine_ms, m->calls,
           m->bytes / 1048576.0);
    printf("load:       max / mean assignments per expert %.3f (mean over layers), worst layer %.3f; %.2f%% dropped\n",
           m->imbalance, m->worst_imbalance, 100 * m->dropped);
    printf("busbw:      %.3f GB/s in the step against %.3f GB/s from bench comm's all_to_all of %.0f bytes: %.2f\n",
           step_busbw, comm_busbw, m->alone_call_bytes, busbw_fraction);
    printf("hidden:     dispatch waited %.2f ms, alone %.2f ms: %.0f%% hidden (the exchange blocks its layer)\n",
           m->exposed_dispatch_ms, alone_dispatch_ms, 100 * hidden);
    if (pms > 0)
        printf("PyTorch:    %8.1f ms/step (tools/reference/moe_bench.py, one process, %ld threads, same run)  "
               "ratio %.2fx\n",
               pms, threads, pms / m->step_ms);
    else if (peer)
        printf("PyTorch:    not measured: %s\n", why);
    return 0;
}
