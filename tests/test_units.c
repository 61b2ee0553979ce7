/* test_units.c — unit tests (cmocka) for the pieces under the communicator:
 * status and last-error text, the accounted allocator, dtype conversions,
 * the even-split rule, rank lists and the CLI's size parser; the rule for
 * environment settings (a malformed value named in one line, the default used); the public
 * sampler, cost formulas, clock and file helpers the CLI calls; the model
 * registry (a kind registered, built, refused twice; an unknown model_type
 * naming the kinds) and the trainer's factory of a caller's model and batch source. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "comm/comm_impl.h"
#include "core/env.h"
#include "core/parallel.h"
#include "runtime/cores.h"
#include "shard/shard.h"

static void status_and_last_error(void **state) {
    (void)state;
    shard_clear_error();
    assert_string_equal(shard_last_error(), "");
    shard_status s = shard_error(SHARD_ERR_TIMEOUT, "waited %d s", 5);
    assert_int_equal(s, SHARD_ERR_TIMEOUT);
    assert_string_equal(shard_last_error(), "waited 5 s");
    assert_string_equal(shard_status_string(SHARD_ERR_MISMATCH), "collective mismatch");
    assert_string_equal(shard_status_string(SHARD_OK), "ok");
    assert_string_equal(shard_status_string((shard_status)-999), "unknown status");
}

static shard_status propagate(void) {
    SHARD_CHECK(shard_error(SHARD_ERR_IO, "inner failure"));
    return SHARD_OK; /* not reached */
}

static void check_macro_propagates(void **state) {
    (void)state;
    assert_int_equal(propagate(), SHARD_ERR_IO);
    assert_string_equal(shard_last_error(), "inner failure");
}

static void allocator_accounts_per_category(void **state) {
    (void)state;
    shard_mem_stats before, mid, after;
    shard_mem_stats_get(&before);
    void *a = shard_alloc(1000, SHARD_MEM_PARAMS);
    void *b = shard_alloc_zeroed(3000, SHARD_MEM_GRADS);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 64, 0);
    assert_int_equal((uintptr_t)b % 64, 0);
    for (int i = 0; i < 3000; i++) assert_int_equal(((unsigned char *)b)[i], 0);
    shard_mem_stats_get(&mid);
    assert_int_equal(mid.current_bytes[SHARD_MEM_PARAMS] - before.current_bytes[SHARD_MEM_PARAMS], 1000);
    assert_int_equal(mid.current_bytes[SHARD_MEM_GRADS] - before.current_bytes[SHARD_MEM_GRADS], 3000);
    assert_int_equal(mid.total_current_bytes - before.total_current_bytes, 4000);
    assert_true(mid.total_peak_bytes >= before.total_current_bytes + 4000);
    shard_free(a);
    shard_free(b);
    shard_free(NULL);
    shard_mem_stats_get(&after);
    assert_int_equal(after.total_current_bytes, before.total_current_bytes);
    assert_true(after.peak_bytes[SHARD_MEM_GRADS] >= 3000);
    shard_mem_stats_reset_peak();
    shard_mem_stats_get(&after);
    assert_int_equal(after.total_peak_bytes, after.total_current_bytes);
    assert_string_equal(shard_mem_category_name(SHARD_MEM_OPTIMIZER), "optimizer");
    assert_null(shard_alloc(8, (shard_mem_category)99));
    assert_non_null(strstr(shard_last_error(), "category 99"));
    void *z = shard_alloc(0, SHARD_MEM_OTHER);
    assert_non_null(z);
    shard_free(z);
}

static shard_status ledger_rank(shard_comm *comm, void *arg) {
    uint64_t *seen = arg;
    int r = shard_comm_rank(comm);
    void *p = shard_alloc((size_t)(r + 1) * 4096, SHARD_MEM_ACTIVATIONS);
    shard_mem_stats st;
    shard_mem_stats_get(&st);
    seen[r] = st.current_bytes[SHARD_MEM_ACTIVATIONS];
    shard_free(p);
    return p ? SHARD_OK : SHARD_ERR_NO_MEMORY;
}

static void each_rank_has_its_own_ledger(void **state) {
    (void)state;
    uint64_t seen[3] = {0};
    assert_int_equal(shard_launch(3, ledger_rank, seen), SHARD_OK);
    for (int r = 0; r < 3; r++) assert_int_equal(seen[r], (uint64_t)(r + 1) * 4096);
}

typedef struct handed_out {
    size_t bytes; /* what rank 1 allocates */
    void *block;
} handed_out;

static shard_status handing_out_rank(shard_comm *comm, void *arg) {
    handed_out *h = arg;
    if (shard_comm_rank(comm) == 1) h->block = shard_alloc(h->bytes, SHARD_MEM_ACTIVATIONS);
    return SHARD_OK;
}

/* A block a rank allocates and hands out is freed after the launch, against its rank's ledger (which
 * the launch used to free: under ASan a heap-use-after-free), a zero-byte block too (it charges no
 * bytes, but is a block all the same). */
static void block_outlives_its_launch(void **state) {
    (void)state;
    for (size_t bytes = 4096;; bytes = 0) {
        handed_out h = {bytes, NULL};
        assert_int_equal(shard_launch(2, handing_out_rank, &h), SHARD_OK);
        assert_non_null(h.block);
        memset(h.block, 1, bytes);
        shard_free(h.block);
        if (!bytes) break;
    }
}

static void bf16_rounds_to_nearest_even(void **state) {
    (void)state;
    assert_int_equal(shard_bf16_from_f32(1.0f), 0x3f80);
    assert_int_equal(shard_bf16_from_f32(-2.0f), 0xc000);
    /* 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0) */
    assert_int_equal(shard_bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 is halfway too: rounds up to the even 1 + 2^-6 */
    assert_int_equal(shard_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(shard_bf16_from_f32(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_true(isnan(shard_f32_from_bf16(shard_bf16_from_f32(NAN))));
    assert_true(isinf(shard_f32_from_bf16(shard_bf16_from_f32(INFINITY))));
    for (int i = -300; i <= 300; i++)
        assert_true(shard_f32_from_bf16(shard_bf16_from_f32((float)i)) == (float)i || abs(i) > 256);
}

static void f16_conversions(void **state) {
    (void)state;
    assert_int_equal(shard_f16_from_f32(1.0f), 0x3c00);
    assert_int_equal(shard_f16_from_f32(-2.0f), 0xc000);
    assert_int_equal(shard_f16_from_f32(65504.0f), 0x7bff);        /* largest finite */
    assert_int_equal(shard_f16_from_f32(65520.0f), 0x7c00);        /* rounds to infinity */
    assert_int_equal(shard_f16_from_f32(0x1p-24f), 0x0001);        /* smallest subnormal */
    assert_int_equal(shard_f16_from_f32(0x1p-25f), 0x0000);        /* halfway: ties to even (0) */
    assert_int_equal(shard_f16_from_f32(0x1.8p-24f), 0x0002);      /* 1.5 ulp: ties to even (2) */
    assert_int_equal(shard_f16_from_f32(1.0f + 0x1p-11f), 0x3c00); /* halfway: even */
    assert_int_equal(shard_f16_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_true(isnan(shard_f32_from_f16(shard_f16_from_f32(NAN))));
    /* every f16 bit pattern survives a round trip through f32 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = shard_f32_from_f16((uint16_t)h);
        if (isnan(f)) continue;
        assert_int_equal(shard_f16_from_f32(f), h);
    }
    assert_true(shard_f32_from_f16(0x0001) == 0x1p-24f);
    assert_true(shard_f32_from_f16(0x03ff) == 0x3ffp-24f);
}

static void dtype_names(void **state) {
    (void)state;
    shard_dtype d;
    assert_int_equal(shard_dtype_parse("bf16", &d), SHARD_OK);
    assert_int_equal(d, SHARD_BF16);
    assert_int_equal(shard_dtype_size(SHARD_I64), 8);
    assert_int_equal(shard_dtype_size((shard_dtype)77), 0);
    assert_int_equal(shard_dtype_parse("float", &d), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "valid dtypes are f32, f64, bf16, f16, i8, i32, i64, u8"));
    shard_reduce_op op;
    assert_int_equal(shard_reduce_op_parse("avg", &op), SHARD_OK);
    assert_int_equal(op, SHARD_OP_AVG);
    assert_int_equal(shard_reduce_op_parse("mean", &op), SHARD_ERR_INVALID_ARG);
}

static void even_split_rule(void **state) {
    (void)state;
    size_t off, len, expect_len[4] = {3, 3, 2, 2}, expect_off[4] = {0, 3, 6, 8};
    for (int r = 0; r < 4; r++) {
        shard__split_range(10, 4, r, &off, &len);
        assert_int_equal(len, expect_len[r]);
        assert_int_equal(off, expect_off[r]);
    }
    shard__split_range(2, 4, 3, &off, &len);
    assert_int_equal(len, 0);
    assert_int_equal(off, 2);
}

static void rank_lists(void **state) {
    (void)state;
    char out[64];
    int a[6] = {0, 0, 0, 1, 0, 1};
    shard__format_rank_list(a, 6, out, sizeof out);
    assert_string_equal(out, "3,5");
    int b[8] = {1, 1, 1, 1, 0, 1, 1, 0};
    shard__format_rank_list(b, 8, out, sizeof out);
    assert_string_equal(out, "0-3,5,6");
    int c[3] = {0, 0, 0};
    shard__format_rank_list(c, 3, out, sizeof out);
    assert_string_equal(out, "none");
    /* too long for the text: whole numbers only, then ",..." (a number cut short would name another rank) */
    int d[4096];
    for (int r = 0; r < 4096; r++) d[r] = r % 2;
    char small[40];
    shard__format_rank_list(d, 4096, small, sizeof small);
    assert_string_equal(small, "1,3,5,7,9,11,13,15,17,19,21,23,25,...");
    for (int r = 0; r < 4096; r++) d[r] = r == 1000 || r == 1002;
    char tiny[10];
    shard__format_rank_list(d, 4096, tiny, sizeof tiny);
    assert_string_equal(tiny, "1000,1002"); /* the last entry needs no room for ",..." */
    char tinier[9];
    shard__format_rank_list(d, 4096, tinier, sizeof tinier);
    assert_string_equal(tinier, "1000,...");
    char four[4];
    shard__format_rank_list(d, 4096, four, sizeof four);
    assert_string_equal(four, "...");
}

/* A rank's BLAS threads when processes share a machine (shard_share_cores). */
static void cores_width(void **state) {
    (void)state;
    assert_int_equal(shard__cores_width(16, 2, 16, 2), 8);  /* two ranks, nothing bound */
    assert_int_equal(shard__cores_width(16, 1, 16, 1), 16); /* one rank per machine */
    assert_int_equal(shard__cores_width(16, 2, 1, 1), 1);   /* a launcher bound each rank to one core */
    assert_int_equal(shard__cores_width(64, 2, 8, 2), 4);   /* a cpuset of 8 cores shared by two ranks */
    assert_int_equal(shard__cores_width(64, 4, 8, 2), 4);   /* two cpusets of 8, two ranks in each */
    assert_int_equal(shard__cores_width(2, 4, 2, 4), 1);    /* more ranks than cores */
}

static void reduce_kernels(void **state) {
    (void)state;
    float a[3] = {1, -2, 3}, b[3] = {4, 5, -6}, out[3];
    const void *srcs[2] = {a, b};
    shard__reduce_many(SHARD_F32, SHARD_OP_MAX, srcs, 2, out, 3);
    assert_true(out[0] == 4 && out[1] == 5 && out[2] == 3);
    shard__reduce_many(SHARD_F32, SHARD_OP_AVG, srcs, 2, out, 3);
    assert_true(out[0] == 2.5f && out[1] == 1.5f && out[2] == -1.5f);
    int32_t big[2] = {INT32_MAX, 5}, one[2] = {1, 5}, sum[2];
    const void *isrcs[2] = {big, one};
    shard__reduce_many(SHARD_I32, SHARD_OP_SUM, isrcs, 2, sum, 2); /* wraps, no UB */
    assert_int_equal(sum[0], INT32_MIN);
    uint16_t h[2] = {shard_bf16_from_f32(1.5f), shard_bf16_from_f32(2.0f)};
    shard__reduce_pair(SHARD_BF16, SHARD_OP_PROD, &h[0], &h[1], 1);
    assert_true(shard_f32_from_bf16(h[1]) == 3.0f);
}

static void cli_sizes(void **state) {
    (void)state;
    uint64_t v;
    assert_int_equal(cli_parse_size("--min", "4K", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(cli_parse_size("--max", "256M", &v), 0);
    assert_int_equal(v, 256ULL << 20);
    assert_int_equal(cli_parse_size("--max", "1GiB", &v), 0);
    assert_int_equal(v, 1ULL << 30);
    assert_int_equal(cli_parse_size("--max", "12", &v), 0);
    assert_int_equal(v, 12);
    assert_int_equal(cli_parse_size("--max", "12Q", &v), -1);
    assert_int_equal(cli_parse_size("--max", "-4K", &v), -1);
    assert_int_equal(cli_parse_size("--max", "", &v), -1);
}

static void timeout_from_environment(void **state) {
    (void)state;
    setenv("SHARD_TIMEOUT", "12.5", 1);
    assert_true(shard_default_timeout() == 12.5);
    setenv("SHARD_TIMEOUT", "soon", 1);
    assert_true(shard_default_timeout() == 300);
    unsetenv("SHARD_TIMEOUT");
    assert_true(shard_default_timeout() == 300);
}

/* What `get(name, fallback)` writes to stderr for `value` of variable `name` (at most size - 1 bytes) and
 * what it returns. */
static double env_read(double (*get)(const char *, double), const char *name, const char *value, double fallback,
                       char *text, size_t size) {
    setenv(name, value, 1);
    fflush(stderr);
    FILE *capture = tmpfile();
    assert_non_null(capture);
    int saved = dup(fileno(stderr));
    dup2(fileno(capture), fileno(stderr));
    double v = get(name, fallback);
    fflush(stderr);
    dup2(saved, fileno(stderr));
    close(saved);
    rewind(capture);
    size_t n = fread(text, 1, size - 1, capture);
    text[n] = '\0';
    fclose(capture);
    unsetenv(name);
    return v;
}

static void spin_from_environment(void **state) {
    (void)state;
    char text[256];
    /* microseconds >= 0 are taken as they are, 0 (never spin) included, silently */
    assert_true(env_read(shard__env_microseconds, "SHARD_SPIN_US", "2500", 10000, text, sizeof text) == 2500);
    assert_string_equal(text, "");
    assert_true(env_read(shard__env_microseconds, "SHARD_SPIN_US", "0", 10000, text, sizeof text) == 0);
    assert_string_equal(text, "");
    /* anything else is not read as a number (atof would make "soon" 0 and "5ms" 5): the default, one line */
    const char *bad[] = {"soon", "5ms", "-1", "1e12", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[128];
        snprintf(want, sizeof want, "shard: ignoring SHARD_SPIN_US='%s': give microseconds >= 0 (using 10000)\n",
                 bad[i]);
        assert_true(env_read(shard__env_microseconds, "SHARD_SPIN_US", bad[i], 10000, text, sizeof text) == 10000);
        assert_string_equal(text, want);
    }
    /* the seconds rule keeps its line */
    assert_true(env_read(shard__env_seconds, "SHARD_TIMEOUT", "0", 300, text, sizeof text) == 300);
    assert_string_equal(text, "shard: ignoring SHARD_TIMEOUT='0': give seconds > 0 (using 300)\n");
}

static void launcher_detection(void **state) {
    (void)state;
    char text[128];
    int r = -1, n = -1;
    assert_int_equal(shard_launch_detect_mpi(text, sizeof text, &r, &n), 0);
    setenv("PMI_RANK", "2", 1);
    setenv("PMI_SIZE", "4", 1);
    assert_int_equal(shard_launch_detect_mpi(text, sizeof text, &r, &n), 1);
    assert_int_equal(r, 2);
    assert_int_equal(n, 4);
    assert_string_equal(text, "PMI_RANK=2 PMI_SIZE=4");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
    setenv("SLURM_PROCID", "0", 1); /* a batch script, not a job step */
    assert_int_equal(shard_launch_detect_mpi(NULL, 0, NULL, NULL), 0);
    unsetenv("SLURM_PROCID");
}

/* The parallel-for: every chunk runs exactly once, back to back (helpers still watching) and after the
 * helpers have gone to sleep, with the width changed between regions. */
typedef struct chunk_count {
    int ran[SHARD_MAX_CHUNKS];
    size_t seen_chunks;
} chunk_count;

static void count_chunk(void *ctx, size_t chunk, size_t chunks) {
    chunk_count *c = ctx;
    c->ran[chunk]++; /* each chunk index belongs to one thread */
    if (chunk == 0) c->seen_chunks = chunks;
}

static void parallel_for_runs_every_chunk(void **state) {
    (void)state;
    for (int round = 0; round < 300; round++) {
        shard__parallel_set_threads(1 + round % 3);
        size_t chunks = 1 + (size_t)round % SHARD_MAX_CHUNKS;
        chunk_count c = {{0}, 0};
        shard__parallel_for(chunks, count_chunk, &c);
        assert_int_equal(c.seen_chunks, chunks);
        for (size_t i = 0; i < SHARD_MAX_CHUNKS; i++) assert_int_equal(c.ran[i], i < chunks ? 1 : 0);
        if (round % 100 == 99) nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL); /* helpers fall asleep */
    }
    shard__parallel_set_threads(1);
}

#ifdef __SANITIZE_THREAD__ /* GCC */
#define UNDER_TSAN 1
#elif defined(__has_feature) /* Clang */
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

/* A forked child runs parallel regions with helpers of its own (the parent's do not exist there: it
 * used to wait for them forever).  ThreadSanitizer refuses threads after a fork, so not under it. */
static void parallel_for_after_fork(void **state) {
    (void)state;
#if !UNDER_TSAN
    shard__parallel_set_threads(2);
    chunk_count c = {{0}, 0};
    shard__parallel_for(4, count_chunk, &c); /* the parent's helper starts */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang ends the child with SIGALRM */
        chunk_count d = {{0}, 0};
        shard__parallel_for(4, count_chunk, &d);
        _exit(d.ran[0] == 1 && d.ran[3] == 1 ? 0 : 3);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    shard__parallel_set_threads(1);
#endif
}

/* The public sampler: greedy is the arg-max, top-k 1 is too at any temperature, a seed gives the same
 * draws, only the top-k tokens are drawn, and a logit that is not finite is refused. */
static void public_sampling(void **state) {
    (void)state;
    const float logits[4] = {0.0f, 5.0f, 4.9f, -3.0f};
    uint64_t rng = 7;
    int token = -1;
    assert_int_equal(shard_sample_token(logits, 4, 0.0, 0, &rng, &token), SHARD_OK);
    assert_int_equal(token, 1);
    assert_int_equal(rng, 7); /* greedy draws nothing */
    assert_int_equal(shard_sample_token(logits, 4, 50.0, 1, &rng, &token), SHARD_OK);
    assert_int_equal(token, 1);
    uint64_t a = 3, b = 3;
    int seen[4] = {0};
    for (int i = 0; i < 2000; i++) {
        int x = -1, y = -2;
        assert_int_equal(shard_sample_token(logits, 4, 1.0, 2, &a, &x), SHARD_OK);
        assert_int_equal(shard_sample_token(logits, 4, 1.0, 2, &b, &y), SHARD_OK);
        assert_int_equal(x, y);
        seen[x]++;
    }
    assert_true(seen[1] > 0 && seen[2] > 0 && seen[0] == 0 && seen[3] == 0);
    const float bad[3] = {0.0f, NAN, 1.0f};
    assert_int_equal(shard_sample_token(bad, 3, 0.0, 0, &rng, &token), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "logit 1"));
}

/* The public cost formulas against hand counts. */
static void public_costs(void **state) {
    (void)state;
    assert_true(shard_cost_busbw_factor("all_reduce", 4) == 1.5);
    assert_true(shard_cost_busbw_factor("all_gather", 4) == 0.75);
    assert_true(shard_cost_busbw_factor("sendrecv", 1) == 1.0 && shard_cost_busbw_factor("all_reduce", 1) == 0.0);
    /* 10 elements over 4 ranks: rank 0 owns 3, sends the other 7 once and its 3 to each of 3 ranks */
    assert_int_equal(shard_cost_all_reduce_bytes(10, 4, 0, 4), (7 + 3 * 3) * 4);
    assert_int_equal(shard_cost_all_reduce_bytes(10, 1, 0, 4), 0);
    assert_true(fabs(shard_cost_pipe_bubble(SHARD_PIPE_GPIPE, 4, 8, 2) - 3.0 / 11) < 1e-15);
    assert_true(fabs(shard_cost_pipe_bubble(SHARD_PIPE_INTERLEAVED, 4, 8, 2) - 3.0 / 19) < 1e-15);
    shard_gpt_config c = {.n_embd = 32, .n_layer = 2, .n_head = 4, .n_positions = 32, .vocab_size = 256};
    double N = (double)shard_gpt_param_count(&c) - 32 * 32;
    assert_true(shard_cost_gpt_flops_per_token(&c, 16) == 6 * N + 12 * 2 * 16 * 32);
    assert_int_equal(shard_cost_gpt_tensor_bytes(&c, 64, 1, 0, 0), 0);
}

/* The public clock never steps back; the public file helpers make, write and remove a tree. */
static void public_clock_and_files(void **state) {
    (void)state;
    double t0 = shard_clock_seconds(), t1 = shard_clock_seconds();
    assert_true(t1 >= t0);
    char root[] = "/tmp/shard-units-XXXXXX", dir[256], path[300], parent[256];
    assert_non_null(mkdtemp(root));
    shard_ckpt_step_dir(root, 12, dir, sizeof dir);
    uint64_t step = 0;
    assert_true(shard_ckpt_parse_step_name(strrchr(dir, '/') + 1, &step) && step == 12);
    assert_false(shard_ckpt_parse_step_name("step_", &step) || shard_ckpt_parse_step_name("step_3x", &step));
    assert_int_equal(shard_mkdirs(dir), SHARD_OK);
    snprintf(path, sizeof path, "%s/a.txt", dir);
    assert_int_equal(shard_atomic_write_file(path, "hi", 2), SHARD_OK);
    shard_path_dir(path, parent, sizeof parent);
    assert_string_equal(parent, dir);
    uint64_t *steps = NULL;
    size_t n = 0;
    assert_int_equal(shard_ckpt_list_steps(root, &steps, &n), SHARD_OK);
    assert_true(n == 1 && steps[0] == 12);
    free(steps);
    assert_int_equal(shard_remove_tree(root), SHARD_OK);
    assert_int_equal(access(root, F_OK), -1);
}

/* ---- the model registry (model.h) and the trainer's factory (trainer.h) ---- */

/* A kind of the tests' own: a table with the entries every model needs, enough to be built and given
 * back (forward and backward are never called here). */
typedef struct unit_model {
    shard_model model;
    size_t max_rows;
    void *ctx;
} unit_model;

static void unit_destroy(shard_model *m) { free(m->impl); }
static shard_status unit_forward(shard_model *m, double denominator, double *loss) {
    (void)m, (void)denominator;
    *loss = 0;
    return SHARD_OK;
}
static shard_status unit_backward(shard_model *m) {
    (void)m;
    return SHARD_OK;
}

static const shard_model_ops unit_ops = {.struct_size = sizeof(shard_model_ops),
                                         .kind = "unit_kind",
                                         .forward = unit_forward,
                                         .backward = unit_backward,
                                         .destroy = unit_destroy};
/* Tables a model built against other headers, or a half-filled one, would give */
/* built against a header whose table ended before its last optional entry: accepted, that entry NULL */
static const shard_model_ops unit_ops_older = {.struct_size = sizeof(shard_model_ops) - sizeof(void *),
                                               .kind = "unit_kind",
                                               .forward = unit_forward,
                                               .backward = unit_backward,
                                               .destroy = unit_destroy};
/* a table too short to hold the entries every model gives */
static const shard_model_ops unit_ops_truncated = {.struct_size = 3 * sizeof(void *),
                                                   .kind = "unit_kind",
                                                   .forward = unit_forward,
                                                   .backward = unit_backward,
                                                   .destroy = unit_destroy};
static const shard_model_ops unit_ops_no_backward = {
    .struct_size = sizeof(shard_model_ops), .kind = "unit_kind", .forward = unit_forward, .destroy = unit_destroy};

static shard_status unit_create(const shard_model_create_options *o, shard_model **out) {
    unit_model *u = calloc(1, sizeof *u);
    if (!u) return shard_error(SHARD_ERR_NO_MEMORY, "unit_kind: out of memory");
    u->model.ops = &unit_ops, u->model.impl = u, u->max_rows = o->max_rows, u->ctx = o->ctx;
    *out = &u->model;
    return SHARD_OK;
}

static void model_registry(void **state) {
    (void)state;
    static int ctx;
    shard_model_kind kind = {.struct_size = sizeof kind, .name = "unit_kind", .create = unit_create, .ctx = &ctx};
    assert_int_equal(shard_model_register_kind(&kind), SHARD_OK);
    /* found, and built through the factory with the options and the registration's context */
    shard_model_kind found;
    assert_int_equal(shard_model_kind_find("unit_kind", &found), SHARD_OK);
    assert_string_equal(found.name, "unit_kind");
    assert_true(found.create == unit_create && found.ctx == &ctx && !found.stage_layers);
    assert_int_equal(shard_model_kind_find("mlp", &found), SHARD_OK);
    shard_model *m = NULL;
    shard_model_create_options o = {.struct_size = sizeof o,
                                    .config_text = "{\"model_type\": \"unit_kind\"}",
                                    .config_path = "unit.json",
                                    .max_rows = 7};
    assert_int_equal(shard_model_create_with(&o, &m), SHARD_OK);
    assert_true(m && m->ops == &unit_ops && ((unit_model *)m->impl)->max_rows == 7 &&
                ((unit_model *)m->impl)->ctx == &ctx);
    shard_model_destroy(m);
    /* a table too short for the required entries, or without backward, is refused naming what is wrong */
    shard_model fake = {.ops = &unit_ops_older};
    assert_int_equal(shard_model_check_tables(&fake), SHARD_OK);
    shard_batch shape;
    assert_int_equal(shard_model_batch_shape(&fake, &shape), 0); /* beyond its struct_size: not there */
    fake.ops = &unit_ops_truncated;
    assert_int_equal(shard_model_check_tables(&fake), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "struct_size"));
    fake.ops = &unit_ops_no_backward;
    assert_int_equal(shard_model_check_tables(&fake), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "model 'unit_kind': its table lacks backward"));
    fake.ops = &unit_ops;
    assert_int_equal(shard_model_check_tables(&fake), SHARD_OK);
    /* a name registered already, a built-in one among them, is refused in one line */
    assert_int_equal(shard_model_register("unit_kind", unit_create), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "model kind 'unit_kind' is registered already"));
    assert_null(strchr(shard_last_error(), '\n'));
    assert_int_equal(shard_model_register("mlp", unit_create), SHARD_ERR_INVALID_ARG);
    assert_int_equal(shard_model_register("", unit_create), SHARD_ERR_INVALID_ARG);
    assert_int_equal(shard_model_register("no_create", NULL), SHARD_ERR_INVALID_ARG);
    shard_model_kind old = kind;
    old.struct_size = sizeof old - 1, old.name = "older";
    assert_int_equal(shard_model_register_kind(&old), SHARD_ERR_INVALID_ARG);
    /* an unknown model_type names every registered kind */
    o.config_text = "{\"model_type\": \"transformer_xl\"}";
    assert_int_equal(shard_model_create_with(&o, &m), SHARD_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(
        strstr(shard_last_error(), "unit.json: model_type 'transformer_xl' is not a registered model kind"));
    assert_non_null(strstr(shard_last_error(), "gpt2, gpt, cnn, mlp, unit_kind"));
    assert_int_equal(shard_model_kind_find("transformer_xl", &found), SHARD_ERR_INVALID_ARG);
    o.config_text = NULL; /* no text, no model_type to build */
    assert_int_equal(shard_model_create_with(&o, &m), SHARD_ERR_INVALID_ARG);
    /* what the short form's kind cannot do is refused before its create, in the built-ins' words */
    o.config_text = "{\"model_type\": \"unit_kind\"}", o.specs = "layer=P()";
    assert_int_equal(shard_model_create_with(&o, &m), SHARD_ERR_INVALID_ARG);
    assert_string_equal(shard_last_error(),
                        "--spec: model_type 'unit_kind' places every parameter whole; specs are "
                        "for the GPT's parameters");
    shard_model_stage stage = {.index = 0, .count = 2, .chunks = 1, .first = {0}, .last = {1}};
    o.specs = NULL, o.stage = &stage;
    assert_int_equal(shard_model_create_with(&o, &m), SHARD_ERR_INVALID_ARG);
    assert_string_equal(shard_last_error(),
                        "unit.json: model_type 'unit_kind' is not cut into pipeline stages (the "
                        "GPT and the CNN are): give pipe=1");
}

/* The trainer's factory: a model built by the caller only where it runs whole, a create function
 * anywhere (here the MLP's, through the registry, with the factory's context). */
#define UNIT_MLP "{\"model_type\": \"mlp\", \"model_dim\": 4, \"hidden_dim\": 8}"

static shard_status factory_create(const shard_model_create_options *o, shard_model **out) {
    shard_model_create_options mine = *o;
    mine.config_text = o->ctx;
    return shard_model_create_with(&mine, out);
}

static shard_status factory_rank(shard_comm *world, void *arg) {
    (void)arg;
    shard_mesh *tensor = NULL, *data = NULL;
    shard_model *built = NULL;
    shard_trainer *t = NULL;
    shard_trainer_config c = {.batch = 4, .seed = 1, .adamw = shard_adamw_defaults(), .lr = {1e-3f, 1e-4f, 0, 2}};
    shard_model_create_options o = {.struct_size = sizeof o, .config_text = UNIT_MLP, .max_rows = 4};
    shard_model_factory given = {.struct_size = sizeof given},
                        made = {.struct_size = sizeof made, .create = factory_create, .ctx = UNIT_MLP};
    shard_status s = shard_mesh_create(world, "tensor=2", &tensor);
    if (s == SHARD_OK) s = shard_mesh_create(world, "data=2", &data);
    if (s == SHARD_OK) s = shard_model_create_with(&o, &built);
    given.model = built;
    /* no config and no model; a caller's model on a tensor axis; neither form given */
    if (s == SHARD_OK &&
        (shard_trainer_create(data, &c, &t) != SHARD_ERR_INVALID_ARG || !strstr(shard_last_error(), "no config_path")))
        s = shard_error(SHARD_ERR_INTERNAL, "a NULL config_path: %s", shard_last_error());
    if (s == SHARD_OK &&
        (shard_trainer_create_with_model(tensor, &c, &given, &t) != SHARD_ERR_INVALID_ARG ||
         !strstr(shard_last_error(),
                 "a model built by the caller runs whole on each rank, and this mesh "
                 "has tensor=2, pipe=1")))
        s = shard_error(SHARD_ERR_INTERNAL, "a caller's model on tensor=2: %s", shard_last_error());
    shard_model_factory neither = {.struct_size = sizeof neither};
    if (s == SHARD_OK && shard_trainer_create_with_model(data, &c, &neither, &t) != SHARD_ERR_INVALID_ARG)
        s = shard_error(SHARD_ERR_INTERNAL, "a factory of neither form was taken");
    /* both forms train a step under ZeRO-3, the third with the caller's batch source (the MLP's generated
     * rows, as its kind makes them); the caller's model and source outlive their trainer */
    c.zero = 3;
    shard_step_result r[3];
    shard_batch_source *rows = NULL;
    shard_batch_teacher_options to = {
        .struct_size = sizeof to, .name = "mlp", .dim = 4, .max_rows = 4, .teacher_seed = 7};
    if (s == SHARD_OK) s = shard_batch_source_teacher(&to, &rows);
    shard_model_factory sourced = made;
    sourced.batch_source = rows;
    const shard_model_factory *forms[3] = {&given, &made, &sourced};
    for (int k = 0; k < 3 && s == SHARD_OK; k++) {
        s = shard_trainer_create_with_model(data, &c, forms[k], &t);
        if (s == SHARD_OK) s = shard_trainer_step(t, 1, &r[k]);
        if (s == SHARD_OK && k == 0 && shard_trainer_model(t) != built)
            s = shard_error(SHARD_ERR_INTERNAL, "the trainer does not train the caller's model");
        shard_trainer_destroy(t);
        t = NULL;
    }
    if (s == SHARD_OK && (built->hooks.acquire || !(r[0].loss > 0) || r[0].loss != r[1].loss || r[0].loss != r[2].loss))
        s = shard_error(SHARD_ERR_INTERNAL, "losses %.9g, %.9g and %.9g", r[0].loss, r[1].loss, r[2].loss);
    shard_batch_source_destroy(rows);
    shard_model_destroy(built);
    shard_mesh_destroy(data), shard_mesh_destroy(tensor);
    return s;
}

static void trainer_factory(void **state) {
    (void)state;
    shard_status s = shard_launch(2, factory_rank, NULL);
    if (s < 0) fail_msg("%s", shard_last_error());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_and_last_error),
        cmocka_unit_test(check_macro_propagates),
        cmocka_unit_test(allocator_accounts_per_category),
        cmocka_unit_test(each_rank_has_its_own_ledger),
        cmocka_unit_test(block_outlives_its_launch),
        cmocka_unit_test(bf16_rounds_to_nearest_even),
        cmocka_unit_test(f16_conversions),
        cmocka_unit_test(dtype_names),
        cmocka_unit_test(even_split_rule),
        cmocka_unit_test(rank_lists),
        cmocka_unit_test(cores_width),
        cmocka_unit_test(reduce_kernels),
        cmocka_unit_test(parallel_for_runs_every_chunk),
        cmocka_unit_test(parallel_for_after_fork),
        cmocka_unit_test(cli_sizes),
        cmocka_unit_test(timeout_from_environment),
        cmocka_unit_test(spin_from_environment),
        cmocka_unit_test(launcher_detection),
        cmocka_unit_test(public_sampling),
        cmocka_unit_test(public_costs),
        cmocka_unit_test(public_clock_and_files),
        cmocka_unit_test(model_registry),
        cmocka_unit_test(trainer_factory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
