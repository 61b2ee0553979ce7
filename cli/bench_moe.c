/* bench_moe.c — `shard bench moe`: the mixture-of-experts GPT trained by the
 * trainer on an expert mesh (default expert=N over N ranks, one BLAS thread
 * per rank), and in the same run:
 *   - the time each step spends in the experts' all_to_alls (the counts,
 *     dispatch and combine exchanges of forward and backward, timed inside
 *     the exchange: shard_expert_stats, expert.h) and the bytes handed to them;
 *   - the load imbalance: max / mean assignments per expert of each MoE
 *     layer over the global batch (the step's expert load), averaged over the
 *     layers, and the worst layer's;
 *   - each exchange split in two from every expert rank's log of its calls
 *     (shard_expert_call, expert.h): waiting (from a rank's entry until the
 *     last rank enters) and moving bytes (from the last rank's entry until
 *     the last rank leaves: what bench comm times of one call, whose ranks
 *     start together out of a barrier);
 *   - the same bytes through `shard bench comm --op all_to_all`'s measurement
 *     on the expert axis: the exchange's busbw in the step (its dispatch and
 *     combine calls' moving time alone) against the collective's alone, and
 *     the share of dispatch time hidden behind compute, 1 - exposed / alone
 *     (exposed: the dispatch calls' moving time; alone: as many all_to_alls
 *     of the mean dispatch size, no compute), clamped to [0, 1].  The
 *     exchange blocks the layer, so nothing can overlap it: a figure near 0
 *     is the expected one;
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
    "Each exchange is split call by call from every expert rank's entry and exit times: all_to_all_wait_ms\n"
    "is the time before the last rank entered (waiting for peers; summed over the step's calls, mean over\n"
    "the ranks), all_to_all_transfer_ms the time from the last rank's entry to the last rank's exit\n"
    "(moving bytes, summed over the calls).  all_to_all_busbw_gbps is the median over the dispatch and\n"
    "combine calls of one call's busbw: its mean per-rank send buffer over its moving time, times (n-1)/n;\n"
    "all_to_all_busbw_fraction divides it by `bench comm --op all_to_all`'s busbw (the median of calls\n"
    "started together out of a barrier) for the mean call's bytes, measured on the expert axis after the\n"
    "steps.  The _mean_ variants take all the calls' bytes over all their moving time instead.  Each figure\n"
    "is the median over the timed steps.\n"
    "\n"
    "options:\n"
    "  --batch B                rows per step (global), 1..4096 (default 8)\n" BENCH_MODEL_OPTIONS_USAGE
    "  --mesh MESH              the mesh, e.g. expert=2 or data=2,expert=2 (default expert=N over the ranks)\n"
    "  --warmup K               untimed steps first, 0..1000 (default 2)\n"
    "  --threads N              PyTorch's threads, 1..64 (default 2)\n"
    "  --no-peer                leave out the PyTorch run (default: run it)\n"
    "  --ranks N                ranks, 1..4096 (default: the mesh's size, else 2; under mpirun the launcher's)\n";

typedef struct moe_result {
    double step_ms, a2a_ms, counts_ms, dispatch_ms, combine_ms, exposed_dispatch_ms, wait_ms, transfer_ms;
    double data_transfer_ms, recv_imbalance, call_busbw;
    double bytes, data_bytes, calls, data_calls, dispatch_calls, imbalance, worst_imbalance;
    double alone_call_us, alone_call_bytes, cold_call_us, dropped;
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

enum {
    F_STEP,
    F_A2A,
    F_COUNTS,
    F_DISPATCH,
    F_COMBINE,
    F_EXPOSED,
    F_WAIT,
    F_TRANSFER,
    F_DATA_TRANSFER,
    F_RECV_IMB,
    F_CALL_BUSBW,
    F_IMB,
    F_WORST,
    F_DROPPED,
    F_N
};

enum { LOG_CAPACITY = 4096, LOG_FIELDS = 5 }; /* exchanges logged per step and rank; kind, bytes, recv, enter, leave */

/* The step's exchanges split call by call (shard_expert_call, expert.h) from every expert rank's log: each
 * call waits until the last rank enters it, then moves bytes until the last rank leaves.  f[F_WAIT]: the
 * time before the last arrival, summed over the calls, mean over the ranks; f[F_TRANSFER]: last arrival to
 * last leave, summed over the calls (what bench comm times of one call: the slowest rank's, all starting
 * together), f[F_DATA_TRANSFER] the same over dispatch and combine alone, f[F_EXPOSED] over dispatch alone;
 * f[F_RECV_IMB]: the dispatch and combine calls' largest receive over their mean receive, bytes summed over
 * the calls; f[F_CALL_BUSBW]: the median over the dispatch and combine calls of each one's busbw, GB/s (its
 * mean send buffer over its transfer, times all_to_all's busbw factor (cost.h), as bench comm counts a
 * call).  mine: LOG_FIELDS x LOG_CAPACITY doubles, all: that for every rank of the axis. */
static shard_status split_calls(shard_comm *expert, size_t logged, const shard_expert_call *log, double *mine,
                                double *all, double *f) {
    int n = expert ? shard_comm_size(expert) : 1;
    double range[2] = {(double)logged, -(double)logged};
    if (logged > LOG_CAPACITY)
        return shard_error(SHARD_ERR_INVALID_ARG, "bench moe: %zu exchanges in a step, more than the %d it can log",
                           logged, (int)LOG_CAPACITY);
    if (expert) SHARD_CHECK(shard_comm_all_reduce(expert, range, range, 2, SHARD_F64, SHARD_OP_MIN));
    if (range[0] != -range[1])
        return shard_error(SHARD_ERR_INTERNAL, "bench moe: the expert ranks logged %.0f to %.0f exchanges in a step",
                           range[0], -range[1]);
    for (size_t i = 0; i < logged; i++) {
        double *m = mine + i * LOG_FIELDS;
        m[0] = log[i].kind, m[1] = (double)log[i].bytes, m[2] = (double)log[i].recv_bytes;
        m[3] = log[i].enter_s, m[4] = log[i].leave_s;
    }
    if (expert && logged)
        SHARD_CHECK(shard_comm_all_gather(expert, mine, all, logged * LOG_FIELDS, SHARD_F64));
    else if (logged)
        memcpy(all, mine, logged * LOG_FIELDS * sizeof *all);
    double most_recv = 0, mean_recv = 0, *busbw = mine; /* mine is read: its room holds the calls' busbw */
    size_t data_calls = 0;
    f[F_WAIT] = f[F_TRANSFER] = f[F_DATA_TRANSFER] = f[F_EXPOSED] = f[F_CALL_BUSBW] = 0;
    for (size_t i = 0; i < logged; i++) {
        double last = 0, done = 0, waited = 0, recv_max = 0, recv_sum = 0, sent = 0;
        for (int p = 0; p < n; p++) {
            const double *c = all + ((size_t)p * logged + i) * LOG_FIELDS;
            last = p == 0 || c[3] > last ? c[3] : last, done = p == 0 || c[4] > done ? c[4] : done;
            recv_max = c[2] > recv_max ? c[2] : recv_max, recv_sum += c[2], sent += c[1] / n;
        }
        for (int p = 0; p < n; p++) waited += last - all[((size_t)p * logged + i) * LOG_FIELDS + 3];
        int kind = (int)all[i * LOG_FIELDS];
        double moving = (done - last) * 1e3;
        f[F_WAIT] += waited / n * 1e3, f[F_TRANSFER] += moving;
        if (kind != SHARD_EXPERT_COUNTS) {
            f[F_DATA_TRANSFER] += moving, most_recv += recv_max, mean_recv += recv_sum / n;
            busbw[data_calls++] =
                done > last ? sent / ((done - last) * 1e9) * shard_cost_busbw_factor("all_to_all", n) : 0;
            if (kind == SHARD_EXPERT_DISPATCH) f[F_EXPOSED] += moving;
        }
    }
    f[F_RECV_IMB] = mean_recv > 0 ? most_recv / mean_recv : 0;
    if (data_calls) f[F_CALL_BUSBW] = cli_median(busbw, (int)data_calls);
    return SHARD_OK;
}

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
    shard_expert_call *log = calloc(LOG_CAPACITY, sizeof *log);
    double *all = calloc((size_t)LOG_FIELDS * LOG_CAPACITY * ((size_t)shard_comm_size(comm) + 1), sizeof *all);
    double *mine = all ? all + (size_t)LOG_FIELDS * LOG_CAPACITY * (size_t)shard_comm_size(comm) : NULL;
    shard_status s = v && log && all ? shard_mesh_create(comm, text, &mesh) : SHARD_ERR_NO_MEMORY;
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &t);
    int ax = mesh ? shard_mesh_axis_index(mesh, "expert") : -1;
    shard_comm *expert = ax >= 0 ? shard_mesh_axis_comm(mesh, ax) : NULL;
    shard_expert_log_set(log, LOG_CAPACITY);
    for (long i = 0; s == SHARD_OK && i < a->warmup + a->steps; i++) {
        shard_step_result r;
        shard_expert_stats x = {.struct_size = sizeof x};
        s = shard_comm_barrier(comm);
        shard_expert_stats_reset();
        if (s == SHARD_OK) s = shard_trainer_step(t, (uint64_t)i + 1, &r);
        if (s == SHARD_OK) s = shard_expert_stats_get(&x);
        double split[F_N];
        if (s == SHARD_OK) s = split_calls(expert, shard_expert_log_count(), log, mine, all, split);
        if (s == SHARD_OK && r.experts == 0)
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "bench moe: %s has no mixture of experts: give a config with "
                            "num_local_experts > 0, e.g. configs/gpt-moe-bench.json",
                            a->config);
        if (s < 0 || i < a->warmup) continue;
        double *f = v + (size_t)(i - a->warmup) * F_N;
        memcpy(f, split, sizeof split);
        f[F_STEP] = r.ms, f[F_COUNTS] = x.counts_ms, f[F_DISPATCH] = x.dispatch_ms, f[F_COMBINE] = x.combine_ms;
        f[F_A2A] = x.counts_ms + x.dispatch_ms + x.combine_ms;
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
    shard_expert_log_set(NULL, 0);
    m.expert_ranks = expert ? shard_comm_size(expert) : 1;
    if (s == SHARD_OK) {
        m.step_ms = med[F_STEP], m.a2a_ms = med[F_A2A], m.counts_ms = med[F_COUNTS];
        m.dispatch_ms = med[F_DISPATCH], m.combine_ms = med[F_COMBINE], m.exposed_dispatch_ms = med[F_EXPOSED];
        m.wait_ms = med[F_WAIT], m.transfer_ms = med[F_TRANSFER], m.data_transfer_ms = med[F_DATA_TRANSFER];
        m.recv_imbalance = med[F_RECV_IMB], m.call_busbw = med[F_CALL_BUSBW], m.imbalance = med[F_IMB],
        m.worst_imbalance = med[F_WORST];
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
        s = bench_comm_op_time(expert, "all_to_all", size, SHARD_F32, 0, &m.alone_call_us, &moved);
        m.alone_call_bytes = (double)moved;
        /* and with caches as the step leaves them (bench comm --cold) */
        if (s == SHARD_OK) s = bench_comm_op_time(expert, "all_to_all", size, SHARD_F32, 1, &m.cold_call_us, &moved);
    }
    if (s == SHARD_OK && shard_comm_rank(comm) == 0) a->r = m;
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    free(v), free(col), free(log), free(all);
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
    if (a.mesh) { /* the benchmark measures the expert exchange: a mesh without one has nothing to measure */
        char names[SHARD_MESH_MAX_AXES][SHARD_MESH_AXIS_NAME_BYTES] = {{0}};
        int sizes[SHARD_MESH_MAX_AXES] = {0}, axes = shard_mesh_parse(a.mesh, 0, names, sizes), experts = 1;
        if (axes < 0) return cli_error("%s", shard_last_error()), 2;
        for (int k = 0; k < axes && k < SHARD_MESH_MAX_AXES; k++)
            if (strcmp(names[k], "expert") == 0) experts = sizes[k];
        if (experts < 2) {
            cli_error("bench moe: --mesh %s has no expert axis of 2 or more ranks, so no token crosses a rank: give "
                      "one, e.g. --mesh expert=2 or data=2,expert=2",
                      a.mesh);
            return 2;
        }
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
    double factor = shard_cost_busbw_factor("all_to_all", m->expert_ranks);
    double call_bytes = m->data_calls > 0 ? m->data_bytes / m->data_calls : 0;
    /* the exchange in the step: the median call's busbw, as bench comm's figure is its median call's; and the
     * mean message over the mean call's transfer (last arrival to last leave), slow calls weighing in */
    double step_busbw = m->call_busbw;
    double mean_busbw = m->data_transfer_ms > 0 ? call_bytes / (m->data_transfer_ms / m->data_calls * 1e6) * factor : 0;
    double comm_busbw = m->alone_call_us > 0 ? m->alone_call_bytes / (m->alone_call_us * 1e3) * factor : 0;
    double busbw_fraction = comm_busbw > 0 ? step_busbw / comm_busbw : 0;
    double cold_busbw = m->cold_call_us > 0 ? m->alone_call_bytes / (m->cold_call_us * 1e3) * factor : 0;
    double cold_fraction = cold_busbw > 0 ? step_busbw / cold_busbw : 0;
    double mean_fraction = comm_busbw > 0 ? mean_busbw / comm_busbw : 0;
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
               "%.6g, \"all_to_all_busbw_fraction\": %.4f, \"all_to_all_wait_ms\": %.3f, \"all_to_all_transfer_ms\": "
               "%.3f, "
               "\"all_to_all_data_transfer_ms\": %.3f, \"all_to_all_busbw_mean_gbps\": %.6g, "
               "\"all_to_all_busbw_mean_fraction\": %.4f, \"all_to_all_recv_imbalance\": %.4f, "
               "\"comm_all_to_all_cold_busbw_gbps\": %.6g, \"all_to_all_busbw_fraction_cold\": %.4f",
               cli_json_string(a.config, cfg_json, sizeof cfg_json),
               cli_json_string(mesh_text, mesh_json, sizeof mesh_json), launch.ranks, m->expert_ranks, a.batch, a.seq,
               a.steps, a.warmup, m->step_ms, (double)(a.batch * a.seq) / (m->step_ms / 1e3), m->a2a_ms, m->counts_ms,
               m->dispatch_ms, m->combine_ms, m->a2a_ms / m->step_ms, m->bytes, m->calls, m->imbalance,
               m->worst_imbalance, m->dropped, m->exposed_dispatch_ms, alone_dispatch_ms, hidden, step_busbw,
               m->alone_call_bytes, comm_busbw, busbw_fraction, m->wait_ms, m->transfer_ms, m->data_transfer_ms,
               mean_busbw, mean_fraction, m->recv_imbalance, cold_busbw, cold_fraction);
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
    printf("split:      waiting for peers %.2f ms/step (mean over ranks), moving bytes %.2f ms/step (last arrival to "
           "last leave, summed over the calls); largest receive %.2fx the mean\n",
           m->wait_ms, m->transfer_ms, m->recv_imbalance);
    printf("busbw:      %.3f GB/s in the step (median call; %.3f over all calls) against %.3f GB/s from bench comm's "
           "all_to_all of %.0f bytes: %.2f (%.2f)\n",
           step_busbw, mean_busbw, comm_busbw, m->alone_call_bytes, busbw_fraction, mean_fraction);
    printf("            against %.3f GB/s from bench comm --cold (caches as a step leaves them): %.2f\n", cold_busbw,
           cold_fraction);
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
