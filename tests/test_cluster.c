/* test_cluster.c — the emulated cluster matches its own model: a description's errors are one clear
 * line each, the link and device of a rank are the description's (at each step, its node's changes
 * applied), and on two thread ranks an
 * all_reduce, an all_to_all and a pipeline send across emulated links take their alpha-beta time, a
 * rank on a device half as fast takes twice the compute time, and memory past a device's is refused.
 * The emulated times are tens of milliseconds, so that a loaded machine still measures them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "shard/shard.h"

static int failures;

/* Two nodes of two devices; the link between them 0.5 Gb/s (62.5 MB/s) and 2 ms. */
static const char *const CLUSTER =
    "{\"nodes\": [{\"name\": \"a\", \"devices\": 2, \"compute_tflops\": 0.004, \"available_memory_gb\": 1},"
    "             {\"name\": \"b\", \"devices\": 2, \"compute_tflops\": 0.002, \"available_memory_gb\": 0.001}],"
    " \"network\": {\"bandwidth_gbps\": 10, \"latency_us\": 100},"
    " \"intra_node\": {\"bandwidth_gbps\": 40, \"latency_us\": 10},"
    " \"links\": [{\"from\": \"a\", \"to\": \"b\", \"bandwidth_gbps\": 0.5, \"latency_us\": 2000}]}";

enum { ELEMS = 1 << 19 }; /* 2 MiB of f32 */
static const double ALPHA = 2e-3, BETA = 0.5e9 / 8;

static void expect_refused(const char *json, const char *map, const char *text) {
    shard_cluster *c = NULL;
    shard_status s = shard_cluster_parse(json, "test.json", &c);
    if (s == SHARD_OK && map) s = shard_cluster_set_device_map(c, map);
    EXPECT(s < 0 && strstr(shard_last_error(), text) && !strchr(shard_last_error(), '\n'),
           "'%s' (map %s): status %d, message '%s', wanted '%s'", json, map ? map : "none", s, shard_last_error(),
           text);
    shard_cluster_destroy(c);
}

static void test_description(void) {
    expect_refused("{", NULL, "not JSON");
    expect_refused("{\"nodes\": []}", NULL, "\"nodes\" is empty");
    expect_refused("{\"nodes\": [{\"name\": \"a\", \"devices\": 2, \"compute_tflops\": 1}]}", NULL,
                   "nodes[0] has no \"available_memory_gb\"");
    expect_refused(
        "{\"nodes\": [{\"name\": \"a\", \"devices\": 0, \"compute_tflops\": 1, \"available_memory_gb\": 1}]}", NULL,
        "nodes[0] \"devices\" is out of range");
    expect_refused("{\"nodes\": [{\"name\": \"a\", \"devices\": 1, \"compute_tflops\": 1, \"available_memory_gb\": 1, "
                   "\"gpus\": 1}]}",
                   NULL, "unknown key \"gpus\"");
    expect_refused(
        "{\"nodes\": [{\"name\": \"a\", \"devices\": 1, \"compute_tflops\": 1, \"available_memory_gb\": 1}]}", NULL,
        "\"network\" is missing");
    char bad_link[1024];
    snprintf(bad_link, sizeof bad_link, "%.*s\"c\"%s", (int)(strstr(CLUSTER, "\"to\": \"b\"") + 6 - CLUSTER), CLUSTER,
             strstr(CLUSTER, "\"to\": \"b\"") + 9);
    expect_refused(bad_link, NULL, "links[0] \"to\" \"c\" is no node's name");
    expect_refused(CLUSTER, "0,4", "entry 2 is past the last device");
    expect_refused(CLUSTER, "1,1", "entry 2 names a device given before");
    expect_refused(CLUSTER, "1,x", "entry 2 is not a device number");

    shard_cluster *c = NULL;
    EXPECT(shard_cluster_parse(CLUSTER, "test.json", &c) == SHARD_OK, "parse: %s", shard_last_error());
    if (!c) return;
    double alpha = 0, beta = 0;
    EXPECT(shard_cluster_link(c, 0, 1, &alpha, &beta) == SHARD_OK && fabs(alpha - 10e-6) < 1e-12 &&
               fabs(beta - 40e9 / 8) < 1,
           "intra-node link: %g s, %g B/s", alpha, beta);
    EXPECT(shard_cluster_link(c, 1, 2, &alpha, &beta) == SHARD_OK && alpha == ALPHA && beta == BETA,
           "overridden link: %g s, %g B/s", alpha, beta);
    shard_cluster_device d;
    EXPECT(shard_cluster_set_device_map(c, "3,0") == SHARD_OK && shard_cluster_ranks(c) == 2 &&
               shard_cluster_rank_device(c, 0, &d) == SHARD_OK && strcmp(d.node, "b") == 0 && d.local == 1 &&
               d.device == 3,
           "device map 3,0: rank 0 on %s/%d", d.node, d.local);
    EXPECT(shard_cluster_rank_device(c, 2, &d) < 0 && strstr(shard_last_error(), "rank 2 has no device"),
           "a rank past the map: %s", shard_last_error());
    shard_cluster_destroy(c);
}

/* One node "b" of 2 devices with `changes` (JSON text), after a node "a" of 1 device. */
static shard_status parse_changes(const char *changes, shard_cluster **out) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"nodes\": [{\"name\": \"a\", \"devices\": 1, \"compute_tflops\": 0.004, \"available_memory_gb\": 1},"
             " {\"name\": \"b\", \"devices\": 2, \"compute_tflops\": 0.003, \"available_memory_gb\": 2, "
             "\"changes\": %s}], \"network\": {\"bandwidth_gbps\": 10, \"latency_us\": 100},"
             " \"intra_node\": {\"bandwidth_gbps\": 40, \"latency_us\": 10}}",
             changes);
    return shard_cluster_parse(json, "test.json", out);
}

static void expect_changes_refused(const char *changes, const char *text) {
    shard_cluster *c = NULL;
    shard_status s = parse_changes(changes, &c);
    EXPECT(s < 0 && strstr(shard_last_error(), "cluster test.json: nodes[1] ('b') ") &&
               strstr(shard_last_error(), text) && !strchr(shard_last_error(), '\n'),
           "changes %s: status %d, message '%s', wanted '%s'", changes, s, shard_last_error(), text);
    shard_cluster_destroy(c);
}

static void test_changes(void) {
    expect_changes_refused("{}", "\"changes\" is not a list: give a list of {\"at_step\": N, \"slowdown\": X}");
    expect_changes_refused("[3]", "changes[0] is not an object");
    expect_changes_refused("[{\"at_step\": 4, \"slowdown\": 2, \"speed\": 1}]",
                           "changes[0] has an unknown key \"speed\": valid keys are at_step, slowdown, "
                           "available_memory_gb");
    expect_changes_refused("[{\"at_step\": 4}]",
                           "changes[0] gives neither of \"slowdown\" and \"available_memory_gb\"");
    expect_changes_refused("[{\"at_step\": 4, \"slowdown\": 2}, {\"at_step\": 5, \"slowdown\": 2, "
                           "\"available_memory_gb\": 1}]",
                           "changes[1] gives both of \"slowdown\" and \"available_memory_gb\": give exactly one");
    expect_changes_refused("[{\"slowdown\": 2}]", "changes[0] has no \"at_step\" (give a number in [1, 1e+15])");
    expect_changes_refused("[{\"at_step\": 0, \"slowdown\": 2}]", "changes[0] \"at_step\" is out of range");
    expect_changes_refused("[{\"at_step\": 2.5, \"slowdown\": 2}]", "changes[0] \"at_step\" 2.5 is not a whole number");
    expect_changes_refused("[{\"at_step\": \"4\", \"slowdown\": 2}]", "changes[0] \"at_step\" is not a number");
    expect_changes_refused("[{\"at_step\": 4, \"slowdown\": 0}]",
                           "changes[0] \"slowdown\" is out of range: give a number in (0, 1e+06]");
    expect_changes_refused("[{\"at_step\": 4, \"available_memory_gb\": -1}]",
                           "changes[0] \"available_memory_gb\" is out of range");
    expect_changes_refused("[{\"at_step\": 4, \"slowdown\": 2}, {\"at_step\": 4, \"slowdown\": 3}]",
                           "changes[1] sets \"slowdown\" at step 4, as an earlier entry does");

    shard_cluster *c = NULL;
    EXPECT(parse_changes("[]", &c) == SHARD_OK && !shard_cluster_has_changes(c), "an empty list: %s",
           shard_last_error());
    shard_cluster_destroy(c);
    c = NULL;
    /* out of order, a slowdown and a memory change at one step, a slowdown undone */
    EXPECT(parse_changes("[{\"at_step\": 60, \"available_memory_gb\": 1.5}, {\"at_step\": 80, \"slowdown\": 1},"
                         " {\"at_step\": 40, \"slowdown\": 3}, {\"at_step\": 60, \"slowdown\": 4}]",
                         &c) == SHARD_OK,
           "changes: %s", shard_last_error());
    if (!c) return;
    shard_cluster *copy = NULL;
    EXPECT(shard_cluster_has_changes(c) && shard_cluster_copy(c, &copy) == SHARD_OK, "copy: %s", shard_last_error());
    static const struct {
        int rank;
        uint64_t step;
        double tflops, slowdown, gib;
    } at[] = {{2, 0, 0.003, 1, 2},         {2, 1, 0.003, 1, 2},      {2, 39, 0.003, 1, 2},     {2, 40, 0.001, 3, 2},
              {1, 59, 0.001, 3, 2},        {1, 60, 0.00075, 4, 1.5}, {1, 79, 0.00075, 4, 1.5}, {1, 80, 0.003, 1, 1.5},
              {1, 1000000, 0.003, 1, 1.5}, {0, 60, 0.004, 1, 1}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        for (int which = 0; which < 2 && copy; which++) {
            shard_cluster_device d;
            shard_status s = shard_cluster_device_at(which ? copy : c, at[i].rank, at[i].step, &d);
            EXPECT(s == SHARD_OK && fabs(d.compute_tflops / at[i].tflops - 1) < 1e-12 && d.slowdown == at[i].slowdown &&
                       d.memory_bytes == at[i].gib * (1u << 30) && strcmp(d.node, at[i].rank ? "b" : "a") == 0,
                   "%s rank %d at step %llu: %g TFLOP/s, slowdown %g, %g bytes (%s)", which ? "copy" : "cluster",
                   at[i].rank, (unsigned long long)at[i].step, d.compute_tflops, d.slowdown, d.memory_bytes,
                   shard_last_error());
        }
    shard_cluster_device d;
    EXPECT(shard_cluster_rank_device(c, 1, &d) == SHARD_OK && d.compute_tflops == 0.003 && d.slowdown == 1,
           "the device at step 1: %g TFLOP/s", d.compute_tflops);
    EXPECT(shard_cluster_device_at(c, 3, 1, &d) < 0 && strstr(shard_last_error(), "rank 3 has no device"),
           "a rank past the devices: %s", shard_last_error());
    /* measured rates in place of the nodes' (and their changes), kept by a copy; n == 0 undoes them */
    double rates[3] = {0.002, 0.0025, 0.0005}, bad[3] = {0.002, 0, 0.001};
    EXPECT(copy && shard_cluster_set_device_tflops(copy, rates, 2) < 0 &&
               strstr(shard_last_error(), "2 device rates for its 3 devices"),
           "a rate list of another length: %s", shard_last_error());
    EXPECT(copy && shard_cluster_set_device_tflops(copy, bad, 3) < 0 &&
               strstr(shard_last_error(), "device 1's rate 0 TFLOP/s: give a rate above 0"),
           "a rate of 0: %s", shard_last_error());
    shard_cluster *measured = NULL;
    EXPECT(copy && shard_cluster_set_device_tflops(copy, rates, 3) == SHARD_OK &&
               shard_cluster_copy(copy, &measured) == SHARD_OK,
           "measured rates: %s", shard_last_error());
    for (int r = 0; r < 3 && measured; r++) {
        shard_cluster_device m;
        EXPECT(shard_cluster_device_at(measured, r, 60, &m) == SHARD_OK && m.compute_tflops == rates[r],
               "rank %d's measured rate: %g", r, m.compute_tflops);
    }
    shard_cluster_device back;
    EXPECT(measured && shard_cluster_set_device_tflops(measured, NULL, 0) == SHARD_OK &&
               shard_cluster_device_at(measured, 1, 60, &back) == SHARD_OK &&
               fabs(back.compute_tflops - 0.00075) < 1e-12,
           "the nodes' rates again: %g", back.compute_tflops);
    shard_cluster_destroy(measured);
    shard_cluster_destroy(copy);
    shard_cluster_destroy(c);
    c = NULL;
    /* a change at step 1 is the device from the start */
    EXPECT(parse_changes("[{\"at_step\": 1, \"available_memory_gb\": 0.5}]", &c) == SHARD_OK &&
               shard_cluster_rank_device(c, 1, &d) == SHARD_OK && d.memory_bytes == 0.5 * (1u << 30),
           "a change at step 1: %s", shard_last_error());
    shard_cluster_destroy(c);
}

typedef struct timing {
    double all_reduce, all_to_all, send, recv, compute[2];
} timing;

static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

static shard_status rank_fn(shard_comm *world, void *arg) {
    timing *t = arg;
    int rank = shard_comm_rank(world);
    float *x = shard_alloc(sizeof(float) * 2 * ELEMS, SHARD_MEM_OTHER), *y = x ? x + ELEMS : NULL;
    if (!x) return SHARD_ERR_NO_MEMORY;
    memset(x, 0, sizeof(float) * 2 * ELEMS);
    double took[3][4];
    shard_status s = SHARD_OK;
    for (int rep = 0; rep < 3 && s == SHARD_OK; rep++) {
        SHARD_CHECK_GOTO(shard_comm_barrier(world), s, done);
        double t0 = shard_clock_seconds();
        SHARD_CHECK_GOTO(shard_comm_all_reduce(world, x, y, ELEMS, SHARD_F32, SHARD_OP_SUM), s, done);
        double t1 = shard_clock_seconds();
        SHARD_CHECK_GOTO(shard_comm_all_to_all(world, x, y, ELEMS / 2, SHARD_F32), s, done);
        double t2 = shard_clock_seconds();
        /* a pipeline's send: rank 0 to rank 1, both pay */
        if (rank == 0)
            SHARD_CHECK_GOTO(shard_comm_send(world, x, ELEMS, SHARD_F32, 1, 7), s, done);
        else
            SHARD_CHECK_GOTO(shard_comm_recv(world, y, ELEMS, SHARD_F32, 0, 7), s, done);
        double t3 = shard_clock_seconds();
        /* compute: 6 GEMMs of 256^3 (201 MFLOP), padded to the device's rate at the next call */
        SHARD_CHECK_GOTO(shard_comm_barrier(world), s, done);
        double c0 = shard_clock_seconds();
        for (int k = 0; k < 6 && s == SHARD_OK; k++)
            s = shard_sgemm(0, 0, 256, 256, 256, 1.0f, x, 256, x + 65536, 256, 0.0f, y, 256);
        shard_request *req = NULL;
        SHARD_CHECK_GOTO(shard_comm_ibarrier(world, &req), s, done);
        double c1 = shard_clock_seconds();
        SHARD_CHECK_GOTO(shard_request_wait(&req), s, done);
        took[rep][0] = t1 - t0, took[rep][1] = t2 - t1, took[rep][2] = t3 - t2, took[rep][3] = c1 - c0;
    }
    if (rank == 0) t->all_reduce = median3(took[0][0], took[1][0], took[2][0]);
    if (rank == 0) t->all_to_all = median3(took[0][1], took[1][1], took[2][1]);
    *(rank == 0 ? &t->send : &t->recv) = median3(took[0][2], took[1][2], took[2][2]);
    t->compute[rank] = median3(took[0][3], took[1][3], took[2][3]);
done:
    shard_free(x);
    return s;
}

static void test_emulation(void) {
    shard_cluster *c = NULL;
    if (shard_cluster_parse(CLUSTER, "test.json", &c) < 0 || shard_cluster_set_device_map(c, "0,2") < 0) {
        EXPECT(0, "cluster: %s", shard_last_error());
        shard_cluster_destroy(c);
        return;
    }
    shard_launch_config cfg = shard_launch_config_default();
    cfg.ranks = 2;
    cfg.backend = SHARD_BACKEND_THREADS;
    cfg.timeout_seconds = 60;
    cfg.cluster = c;
    timing t;
    memset(&t, 0, sizeof t);
    shard_status s = shard_launch_with(&cfg, rank_fn, &t);
    shard_cluster_destroy(c);
    /* node b's device holds 0.001 GiB: rank 1's first 4 MiB are refused, rank 0's pass */
    if (s < 0) {
        EXPECT(strstr(shard_last_error(), "rank 1 on node 'b' (device 2) is out of device memory") &&
                   strstr(shard_last_error(), "of other"),
               "launch: %s", shard_last_error());
        return;
    }
    EXPECT(0, "rank 1 allocated 4 MiB on a device of 1 MiB");
}

/* The timings, on a cluster whose devices hold enough. */
static void test_timings(void) {
    char json[2048];
    snprintf(json, sizeof json, "%s", CLUSTER);
    char *m = strstr(json, "0.001}");
    memcpy(m, "1    }", 6);
    shard_cluster *c = NULL;
    if (shard_cluster_parse(json, "test.json", &c) < 0 || shard_cluster_set_device_map(c, "0,2") < 0) {
        EXPECT(0, "cluster: %s", shard_last_error());
        shard_cluster_destroy(c);
        return;
    }
    shard_launch_config cfg = shard_launch_config_default();
    cfg.ranks = 2;
    cfg.backend = SHARD_BACKEND_THREADS;
    cfg.timeout_seconds = 60;
    cfg.cluster = c;
    timing t;
    memset(&t, 0, sizeof t);
    shard_status s = shard_launch_with(&cfg, rank_fn, &t);
    shard_cluster_destroy(c);
    EXPECT(s == SHARD_OK, "launch: %s", shard_last_error());
    if (s < 0) return;
    double bytes = 4.0 * ELEMS, n = 2;
    double ar = 2 * (n - 1) * (ALPHA + bytes / (n * BETA)), a2a = (n - 1) * (ALPHA + bytes / 2 / BETA),
           p2p = ALPHA + bytes / BETA;
    printf("all_reduce %.1f ms (model %.1f), all_to_all %.1f ms (%.1f), send %.1f / recv %.1f ms (%.1f), "
           "compute %.1f / %.1f ms (model %.1f / %.1f)\n",
           t.all_reduce * 1e3, ar * 1e3, t.all_to_all * 1e3, a2a * 1e3, t.send * 1e3, t.recv * 1e3, p2p * 1e3,
           t.compute[0] * 1e3, t.compute[1] * 1e3, 6 * 2.0 * 256 * 256 * 256 / 0.004e12 * 1e3,
           6 * 2.0 * 256 * 256 * 256 / 0.002e12 * 1e3);
    EXPECT(fabs(t.all_reduce / ar - 1) < 0.10, "all_reduce %.2f ms, model %.2f ms", t.all_reduce * 1e3, ar * 1e3);
    EXPECT(fabs(t.all_to_all / a2a - 1) < 0.10, "all_to_all %.2f ms, model %.2f ms", t.all_to_all * 1e3, a2a * 1e3);
    EXPECT(fabs(t.send / p2p - 1) < 0.10, "send %.2f ms, model %.2f ms", t.send * 1e3, p2p * 1e3);
    EXPECT(fabs(t.recv / p2p - 1) < 0.10, "recv %.2f ms, model %.2f ms", t.recv * 1e3, p2p * 1e3);
    EXPECT(fabs(t.compute[1] / t.compute[0] / 2 - 1) < 0.10, "compute on a device half as fast: %.2f ms vs %.2f ms",
           t.compute[1] * 1e3, t.compute[0] * 1e3);
}

int main(void) {
    test_description();
    test_changes();
    test_emulation();
    test_timings();
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
