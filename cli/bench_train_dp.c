/* bench_train_dp.c — `shard bench train --ranks N --zero K`: the GPT trained
 * by the trainer (data parallel / ZeRO) on N ranks, against, in the same run:
 *   - one rank at the same per-rank batch (scaling efficiency; every rank,
 *     that one included, runs BLAS on one thread: a rank is a core here);
 *   - PyTorch DDP (tools/reference/bench_gpt_ddp_torch.py, gloo, N processes, the same bucket size);
 *   - the gradient collectives alone (blocking, no compute), which gives the
 *     share of communication hidden behind compute: 1 - exposed / alone, where
 *     exposed is the least any rank waited in the step (the last to arrive
 *     waits only for the communication, not for its peers);
 *   - peak bytes per rank by category next to cost.h's model state
 *     (fp32 weights, gradients and AdamW's two moments: 4 + 4 + 8 bytes
 *     per parameter, divided by N as the stage shards them).
 * Data: random tokens (a temporary token file).  Under mpirun, N = the
 * launcher's size.  The global batch divides over the ranks: every side then trains the same rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_comm.h"
#include "bench_train.h"
#include "cli_util.h"
#include "shard/checkpoint.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/cost.h"
#include "shard/files.h"
#include "shard/shard.h"

typedef struct dp_result {
    double ms, single_ms, exposed_ms, alone_ms;
    shard_mem_stats mem;
    size_t params, largest_unit, unit0, largest_other; /* elements: the slab, the largest unit, unit 0, the largest
                                                         * of the others */
} dp_result;

typedef struct dp_args {
    const bench_train_opts *o;
    char dir[256], config_copy[300];
    dp_result r;
} dp_args;

static shard_trainer_config make_config(const dp_args *a, size_t batch) {
    shard_trainer_config c = {.config_path = a->o->config,
                              .data_dir = a->dir,
                              .batch = batch,
                              .seq = (size_t)a->o->seq,
                              .seed = 1,
                              .zero = a->o->zero,
                              .bucket_mb = a->o->bucket_mb,
                              .grad_dtype = a->o->bf16 ? SHARD_BF16 : SHARD_F32,
                              .compute_dtype = a->o->bf16_compute ? SHARD_BF16 : SHARD_F32,
                              .adamw = shard_adamw_defaults(),
                              .clip = 1.0f};
    c.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, (uint64_t)(a->o->steps + a->o->warmup)};
    return c;
}

/* Steps on a mesh over comm; median ms, exposed comm ms, and the blocking collectives alone. */
static shard_status timed_run(shard_comm *comm, const dp_args *a, size_t batch, double *ms, double *exposed,
                              double *alone, shard_mem_stats *mem, size_t *params, size_t units[3]) {
    char text[32];
    snprintf(text, sizeof text, "data=%d", shard_comm_size(comm));
    shard_mesh *mesh = NULL;
    shard_trainer *t = NULL;
    shard_trainer_config c = make_config(a, batch);
    long steps = a->o->steps, warm = a->o->warmup;
    double *v = calloc((size_t)steps, sizeof *v), *e = calloc((size_t)steps, sizeof *e), al[5];
    shard_status s = v && e ? shard_mesh_create(comm, text, &mesh) : SHARD_ERR_NO_MEMORY;
    if (s == SHARD_OK) s = shard_trainer_create(mesh, &c, &t);
    shard_mem_stats_reset_peak(); /* the model was made whole, then sharded: count the training */
    for (long i = 0; s == SHARD_OK && i < warm + steps; i++) {
        shard_step_result r;
        s = shard_comm_barrier(comm);
        if (s == SHARD_OK) s = shard_trainer_step(t, (uint64_t)i + 1, &r);
        /* the rank that arrived last at each wait saw only communication, not its peers' lateness: the
         * least waiting over ranks is the communication left exposed */
        double least = r.exposed_comm_ms;
        if (s == SHARD_OK) s = shard_comm_all_reduce(comm, &r.exposed_comm_ms, &least, 1, SHARD_F64, SHARD_OP_MIN);
        if (i >= warm) v[i - warm] = r.ms, e[i - warm] = least;
    }
    if (s == SHARD_OK && mem) shard_mem_stats_get(mem);
    if (s == SHARD_OK) {
        shard_model *m = shard_trainer_model(t);
        size_t n = m->params->total, D = (size_t)shard_comm_size(comm);
        *params = n, units[0] = units[2] = 0, units[1] = m->units ? shard_model_unit_elems(m, 0) : 0;
        for (size_t u = 0; u < m->units; u++) {
            size_t elems = shard_model_unit_elems(m, u);
            if (elems > units[0]) units[0] = elems;
            if (u > 0 && elems > units[2]) units[2] = elems;
        }
        size_t per = (n + D - 1) / D;
        float *buf = shard_alloc(per * D * sizeof(float) + 4, SHARD_MEM_COMM);
        shard_dtype dt = a->o->bf16 ? SHARD_BF16 : SHARD_F32;
        if (!buf)
            s = SHARD_ERR_NO_MEMORY;
        else
            memset(buf, 0, per * D * sizeof(float));
        for (int i = -1; s == SHARD_OK && i < 5; i++) { /* what a step's gradients cost without compute */
            s = shard_comm_barrier(comm);
            double t0 = shard_clock_seconds();
            if (s == SHARD_OK && a->o->zero == 0) s = shard_comm_all_reduce(comm, buf, buf, n, dt, SHARD_OP_SUM);
            /* in place, as the strategy's: this rank's block of the whole buffer */
            size_t r = (size_t)shard_comm_rank(comm);
            if (s == SHARD_OK && a->o->zero > 0)
                s = shard_comm_reduce_scatter(comm, buf, (char *)buf + r * per * shard_dtype_size(dt), per, dt,
                                              SHARD_OP_SUM);
            if (s == SHARD_OK && a->o->zero > 0 && a->o->zero < 3) /* the values made whole */
                s = shard_comm_all_gather(comm, buf + r * per, buf, per, SHARD_F32);
            shard_dtype gd = a->o->bf16_compute ? SHARD_BF16 : SHARD_F32;
            for (int g = 0; s == SHARD_OK && a->o->zero == 3 && g < 2;
                 g++) /* each unit gathered for forward and backward */
                s = shard_comm_all_gather(comm, (char *)buf + r * per * shard_dtype_size(gd), buf, per, gd);
            if (i >= 0) al[i] = (shard_clock_seconds() - t0) * 1e3; /* round -1 warms the buffers and the transport */
        }
        shard_free(buf);
        if (s == SHARD_OK) *alone = cli_median(al, 5);
    }
    if (s == SHARD_OK) *ms = cli_median(v, (int)steps), *exposed = cli_median(e, (int)steps);
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    free(v), free(e);
    return s;
}

static shard_status dp_rank(shard_comm *comm, void *arg) {
    dp_args *a = arg;
    int rank = shard_comm_rank(comm), world = shard_comm_size(comm);
    if (rank == 0) SHARD_CHECK(shard_blas_set_threads(1));
    SHARD_CHECK(shard_comm_barrier(comm));
    /* one rank at the per-rank batch, the others waiting */
    shard_comm *self = NULL;
    SHARD_CHECK(shard_comm_split(comm, rank == 0 ? 0 : -1, 0, &self));
    size_t per_rank = (size_t)a->o->batch / (size_t)world;
    double x, y;
    size_t p, units[3];
    shard_status alone = self ? timed_run(self, a, per_rank, &a->r.single_ms, &x, &y, NULL, &p, units) : SHARD_OK;
    shard_comm_destroy(self); /* before a failure returns too */
    SHARD_CHECK(alone);
    /* the others wait out rank 0's baseline, however long its steps take: the collective deadline is for
     * peers that stop, and rank 0 is working alone (restored after) */
    double timeout = shard_comm_timeout(comm);
    if (rank != 0) SHARD_CHECK(shard_comm_set_timeout(comm, 1e9));
    SHARD_CHECK(shard_comm_barrier(comm));
    if (rank != 0) SHARD_CHECK(shard_comm_set_timeout(comm, timeout));
    shard_mem_stats mem;
    dp_result r = {0};
    SHARD_CHECK(timed_run(comm, a, (size_t)a->o->batch, &r.ms, &r.exposed_ms, &r.alone_ms, &mem, &r.params, units));
    r.largest_unit = units[0], r.unit0 = units[1], r.largest_other = units[2];
    /* the largest per-rank peak of each category */
    int64_t mine[SHARD_MEM_CATEGORY_COUNT], most[SHARD_MEM_CATEGORY_COUNT];
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++) mine[c] = (int64_t)mem.peak_bytes[c];
    SHARD_CHECK(shard_comm_all_reduce(comm, mine, most, SHARD_MEM_CATEGORY_COUNT, SHARD_I64, SHARD_OP_MAX));
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++) r.mem.peak_bytes[c] = (uint64_t)most[c];
    if (rank == 0) r.single_ms = a->r.single_ms, a->r = r;
    return SHARD_OK;
}

shard_status bench_random_tokens(const char *config, shard_gpt_config *gc, char *dir, size_t dir_bytes) {
    SHARD_CHECK(shard_gpt_config_load(config, gc));
    snprintf(dir, dir_bytes, "/tmp/shard-bench-train-XXXXXX");
    if (!mkdtemp(dir)) return shard_error(SHARD_ERR_IO, "bench train: cannot make a temporary directory");
    size_t n = 1 << 20;
    uint32_t *tok = malloc(n * sizeof *tok);
    uint64_t r = 7;
    for (size_t i = 0; tok && i < n; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        tok[i] = (uint32_t)((r >> 33) % gc->vocab_size);
    }
    char path[300];
    snprintf(path, sizeof path, "%s/train.tokens", dir);
    shard_status s = tok ? shard_tokens_write(path, tok, n, (uint32_t)gc->vocab_size) : SHARD_ERR_NO_MEMORY;
    free(tok);
    return s;
}

void bench_remove_dir(const char *dir) {
    if (shard_remove_tree(dir) != SHARD_OK) cli_error("%s", shard_last_error());
}

int cli_bench_train_dp(const bench_train_opts *o, const cli_common *common) {
    dp_args a = {.o = o};
    int world = common->ranks > 0 ? common->ranks : 1;
    char env[64] = "";
    int mrank = 0, msize = 0;
    if (shard_launch_detect_mpi(env, sizeof env, &mrank, &msize)) world = msize;
    if (o->batch % world) { /* uneven rows: DDP's reference and the one-rank baseline would train fewer */
        cli_error("bench train: --batch %ld does not divide over %d ranks; give a multiple of %d", o->batch, world,
                  world);
        return 2;
    }
    shard_gpt_config gc; /* random tokens over the config's vocabulary */
    shard_status s = bench_random_tokens(o->config, &gc, a.dir, sizeof a.dir);
    shard_launch_config launch = cli_launch_config(common);
    if (s == SHARD_OK) s = shard_launch_with(&launch, dp_rank, &a);
    bench_remove_dir(a.dir);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    if (a.r.ms <= 0) return 0; /* an MPI rank other than 0 */
    double N = (double)(o->batch * o->seq), peak = bench_peak_of_threads(world, 5);
    double flops = shard_cost_gpt_flops_per_token(&gc, (size_t)o->seq) * N, mfu = flops / (a.r.ms / 1e3) / (peak * 1e9);
    double eff = a.r.single_ms / a.r.ms; /* equal per-rank batch: N x the work in the time of ... */
    double hidden = a.r.alone_ms > 0 ? 1.0 - a.r.exposed_ms / a.r.alone_ms : 0;
    hidden = hidden < 0 ? 0 : hidden;
    char why[300] = "";
    long numbers[5] = {o->batch, o->seq, o->steps, o->warmup, world};
    char bucket[32];
    snprintf(bucket, sizeof bucket, "%.17g", o->bucket_mb);
    double tms =
        o->torch ? bench_reference_ms("bench_gpt_ddp_torch.py", o->config, numbers, bucket, 0, why, sizeof why) : -1;
    if (o->torch && tms <= 0 && o->json) cli_error("bench train: PyTorch DDP not measured: %s", why);
    /* the model state by stage (cost.h: 4 bytes a value, 4 a gradient, 8 AdamW's, sharded by stage) and
     * the unit buffers a step holds: ZeRO-3 a gathered unit and the prefetched one; ZeRO-2/3 unit 0's
     * gradient (the tied embedding's: from the LM head to the end of backward) and two others' (one
     * filling, one in flight).  The target: every state sharded (ZeRO-3's 16 bytes / N) with 5 % slack,
     * and three of the largest unit's buffers. */
    double U = (double)a.r.largest_unit * 4, U0 = (double)a.r.unit0 * 4, Uo = (double)a.r.largest_other * 4;
    double unit_grads = a.r.largest_other > 0 ? U0 + 2 * Uo : U0;
    shard_cost_model_state state, sharded;
    s = shard_cost_model_state_bytes(a.r.params, (size_t)world, (int)o->zero, 4, 4, 8, &state);
    if (s == SHARD_OK) s = shard_cost_model_state_bytes(a.r.params, (size_t)world, 3, 4, 4, 8, &sharded);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    double pred[3] = {state.params_bytes + (o->zero >= 3 ? 2 * U : 0),
                      state.grads_bytes + (o->zero >= 2 ? unit_grads : 0), state.optimizer_bytes};
    double target = 1.05 * (sharded.params_bytes + sharded.grads_bytes + sharded.optimizer_bytes) + 3 * U;
    const char *cat[3] = {"params", "grads", "optimizer"};
    shard_mem_category ids[3] = {SHARD_MEM_PARAMS, SHARD_MEM_GRADS, SHARD_MEM_OPTIMIZER};
    double states = 0;
    for (int i = 0; i < 3; i++) states += (double)a.r.mem.peak_bytes[ids[i]];
    if (o->json) {
        char cfg_json[4200];
        printf("{\"config\": %s, \"ranks\": %d, \"zero\": %ld, \"batch\": %ld, \"seq\": %ld, \"grad_dtype\": \"%s\", "
               "\"compute_dtype\": \"%s\", "
               "\"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, \"mfu\": %.4f, \"single_rank_ms_per_step\": %.3f, "
               "\"scaling_efficiency\": %.4f, \"exposed_comm_ms\": %.3f, \"comm_alone_ms\": %.3f, "
               "\"hidden_comm_fraction\": %.4f, "
               "\"model_state_bytes\": %.0f, \"model_state_target_bytes\": %.0f",
               cli_json_string(o->config, cfg_json, sizeof cfg_json), world, o->zero, o->batch, o->seq,
               o->bf16 ? "bf16" : "f32", o->bf16_compute ? "bf16" : "f32", a.r.ms, N / (a.r.ms / 1e3), mfu,
               a.r.single_ms, eff, a.r.exposed_ms, a.r.alone_ms, hidden, states, target);
        for (int i = 0; i < 3; i++)
            printf(", \"peak_%s_bytes\": %llu, \"predicted_%s_bytes\": %.0f", cat[i],
                   (unsigned long long)a.r.mem.peak_bytes[ids[i]], cat[i], pred[i]);
        char why_json[700];
        if (tms > 0)
            printf(", \"torch_ddp_ms_per_step\": %.3f, \"speedup_vs_torch_ddp\": %.4f", tms, tms / a.r.ms);
        else if (o->torch)
            printf(", \"torch_error\": %s", cli_json_string(why, why_json, sizeof why_json));
        printf("}\n");
        return 0;
    }
    printf(
        "# shard bench train: %s, global batch %ld x %ld over %d ranks, zero %ld, gradients %s; median of %ld steps\n",
        o->config, o->batch, o->seq, world, o->zero, o->bf16 ? "bf16" : "f32", o->steps);
    printf("shard:   %8.1f ms/step  %9.0f tokens/s  MFU %.1f%% of %.0f GFLOP/s\n", a.r.ms, N / (a.r.ms / 1e3),
           100 * mfu, peak);
    printf("scaling: 1 rank at the same per-rank batch %.1f ms/step -> efficiency %.2f\n", a.r.single_ms, eff);
    printf("comm:    %.2f ms/step waited on, %.2f ms for the collectives alone: %.0f%% hidden behind compute\n",
           a.r.exposed_ms, a.r.alone_ms, 100 * hidden);
    for (int i = 0; i < 3; i++)
        printf("memory:  %-9s peak %8.2f MiB per rank, predicted %8.2f MiB\n", cat[i],
               (double)a.r.mem.peak_bytes[ids[i]] / 1048576.0, pred[i] / 1048576.0);
    printf("memory:  model states %.2f MiB per rank; target 1.05 x 16 bytes x params / N + one unit's buffers = %.2f "
           "MiB\n",
           states / 1048576.0, target / 1048576.0);
    if (tms > 0)
        printf("PyTorch DDP: %8.1f ms/step (gloo, %d processes x 1 thread, same run)  speedup %.2fx\n", tms, world,
               tms / a.r.ms);
    else if (o->torch)
        printf("PyTorch DDP: not measured: %s\n", why);
    return 0;
}
