/* launch.c — start the same rank function on every rank (SPMD).
 *
 * Chooses the backend: MPI when an MPI launcher started this process (its
 * environment variables say so), else `ranks` threads of this process.  On
 * the threads backend every rank gets its own world handle and memory ledger;
 * a rank whose function fails aborts the job, so its peers stop at once with
 * the root cause instead of waiting for a deadline. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../comm/emulate.h"
#include "../comm/threads/threads_impl.h"
#include "core/env.h"
#include "shard/blas.h"
#include "shard/cluster.h"
#include "shard/launch.h"

enum { DEFAULT_TIMEOUT_SECONDS = 300 };

shard_launch_config shard_launch_config_default(void) {
    shard_launch_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.ranks = 1;
    c.backend = SHARD_BACKEND_AUTO;
    return c;
}

double shard_default_timeout(void) { return shard__env_seconds("SHARD_TIMEOUT", DEFAULT_TIMEOUT_SECONDS); }

int shard_have_mpi(void) { return shard__mpi_built(); }

static int env_int(const char *name, int *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (!end || *end || x < 0 || x > 1 << 30) return 0;
    *out = (int)x;
    return 1;
}

int shard_launch_detect_mpi(char *description, size_t description_bytes, int *rank, int *size) {
    /* Open MPI, then MPICH/Hydra (PMI), PMIx launchers, and a Slurm job step (srun). */
    static const char *const pairs[][2] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"},
        {"PMIX_RANK", "PMIX_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int r = -1, n = -1;
        if (!env_int(pairs[i][0], &r)) continue;
        /* SLURM_PROCID is also set in a batch script; only srun sets SLURM_STEP_ID.  A one-task step
         * (an interactive `srun --pty bash`, whose children all inherit it) is one process: threads serve it */
        if (i == 3 && (!getenv("SLURM_STEP_ID") || (env_int(pairs[i][1], &n) && n <= 1))) continue;
        int have_size = env_int(pairs[i][1], &n);
        if (description)
            snprintf(description, description_bytes, "%s=%d%s%s%s", pairs[i][0], r, have_size ? " " : "",
                     have_size ? pairs[i][1] : "", have_size ? "" : "");
        if (description && have_size) {
            size_t used = strlen(description);
            snprintf(description + used, description_bytes - used, "=%d", n);
        }
        if (rank) *rank = r;
        if (size) *size = have_size ? n : -1;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ threads */

typedef struct rank_ctx {
    shard_comm *comm;
    shard__mem_ledger *ledger;
    shard_rank_fn fn;
    void *arg;
    const shard_cluster *cluster; /* emulated (NULL: none) */
    shard_status status;
    char *error; /* the failure's text (malloc'd: a whole message of up to SHARD_ERROR_TEXT_BYTES) */
} rank_ctx;

/* A copy of text into *out, or of "out of memory" when none can be made (a static text, never freed). */
static const char NO_MEMORY_TEXT[] = "out of memory copying a rank's failure";
static void keep_text(char **out, const char *text) {
    size_t n = strlen(text) + 1;
    char *copy = malloc(n);
    *out = copy ? memcpy(copy, text, n) : (char *)NO_MEMORY_TEXT;
}
static void free_text(char *text) {
    if (text != NO_MEMORY_TEXT) free(text);
}

/* The rank function, on its emulated device when there is a cluster. */
static shard_status run_rank(shard_comm *comm, const shard_cluster *cluster, shard_rank_fn fn, void *arg) {
    if (!cluster) return fn(comm, arg);
    SHARD_CHECK(shard__emu_rank_begin(comm, cluster));
    shard_status s = fn(comm, arg);
    shard__emu_rank_end();
    return s;
}

/* The cluster a launch emulates: the config's, or one read from its file (then *owned, to destroy). */
static shard_status launch_cluster(const shard_launch_config *cfg, const shard_cluster **use, shard_cluster **owned) {
    *use = cfg->cluster, *owned = NULL;
    if (cfg->cluster || (!cfg->cluster_file && !cfg->device_map)) return SHARD_OK;
    if (!cfg->cluster_file)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "--device-map '%s' places ranks on the devices of a cluster: give --cluster FILE too",
                           cfg->device_map);
    SHARD_CHECK(shard_cluster_load(cfg->cluster_file, owned));
    shard_status s = shard_cluster_set_device_map(*owned, cfg->device_map);
    if (s < 0) {
        shard_cluster_destroy(*owned);
        *owned = NULL;
        return s;
    }
    *use = *owned;
    return SHARD_OK;
}

static void *rank_main(void *p) {
    rank_ctx *ctx = p;
    shard__mem_ledger_adopt(ctx->ledger);
    shard_clear_error();
    ctx->status = run_rank(ctx->comm, ctx->cluster, ctx->fn, ctx->arg);
    if (ctx->status < 0) {
        keep_text(&ctx->error, shard_last_error());
        /* an abort that was itself caused by another rank must not hide the root cause */
        if (ctx->status != SHARD_ERR_ABORTED)
            shard_comm_abort(ctx->comm, ctx->status, ctx->error[0] ? ctx->error : shard_status_string(ctx->status));
    }
    if (shard_comm_destroy(ctx->comm) < 0) {
        if (ctx->status == SHARD_OK) {
            /* returned with requests in flight: a bug in the program, reported as its failure */
            ctx->status = SHARD_ERR_INVALID_ARG;
            shard_error(ctx->status, "rank %d returned but %s", shard_comm_rank(ctx->comm), shard_last_error());
            keep_text(&ctx->error, shard_last_error());
            shard_comm_abort(ctx->comm, ctx->status, ctx->error);
        }
        shard__comm_destroy_force(ctx->comm);
    }
    shard__mem_ledger_adopt(NULL);
    return NULL;
}

/* A block a rank allocated and handed out (through `arg`) points at its rank's ledger and is credited there
 * when freed later: a launch's ledgers stay (listed here, so still reachable) while any such block is
 * outstanding, and go at a later launch's end once none is. */
typedef struct retired_ledgers {
    shard__mem_ledger *ledgers;
    int n;
    struct retired_ledgers *next;
} retired_ledgers;

static retired_ledgers *retired;
static pthread_mutex_t retired_lock = PTHREAD_MUTEX_INITIALIZER;

static int ledgers_in_use(shard__mem_ledger *ledgers, int n) {
    for (int r = 0; r < n; r++)
        if (atomic_load(&ledgers[r].blocks) != 0) return 1;
    return 0;
}

static void retire_ledgers(shard__mem_ledger *ledgers, int n) {
    pthread_mutex_lock(&retired_lock);
    for (retired_ledgers **p = &retired; *p;) {
        retired_ledgers *x = *p;
        if (ledgers_in_use(x->ledgers, x->n)) {
            p = &x->next;
            continue;
        }
        *p = x->next;
        free(x->ledgers), free(x);
    }
    if (ledgers && ledgers_in_use(ledgers, n)) {
        retired_ledgers *x = malloc(sizeof *x);
        if (x) *x = (retired_ledgers){ledgers, n, retired}, retired = x; /* else kept unlisted: never freed */
    } else {
        free(ledgers);
    }
    pthread_mutex_unlock(&retired_lock);
}

/* A limit as people set it: "unlimited" or the number. */
static void limit_text(rlim_t v, char *out, size_t out_bytes) {
    if (v == RLIM_INFINITY)
        snprintf(out, out_bytes, "unlimited");
    else
        snprintf(out, out_bytes, "%llu", (unsigned long long)v);
}

/* The first line of a small file (a /proc or /sys figure) into out; "" when it cannot be read. */
static void read_line(const char *path, char *out, size_t out_bytes) {
    FILE *f = fopen(path, "r");
    out[0] = '\0';
    if (f && fgets(out, (int)out_bytes, f)) out[strcspn(out, "\n")] = '\0';
    if (f) fclose(f);
}

/* Why thread rank r of n could not start, with the limits that bound threads (the user's, the kernel's,
 * a container's, the address space their stacks take), each as the command that raises it names it. */
static shard_status thread_failure(int err, int r, int n) {
    char nproc[32] = "?", stack[32] = "?", as[48] = "", max[32], pids[64] = "", cgroup[512], path[600];
    struct rlimit l;
    if (getrlimit(RLIMIT_NPROC, &l) == 0) limit_text(l.rlim_cur, nproc, sizeof nproc);
    if (getrlimit(RLIMIT_STACK, &l) == 0) {
        if (l.rlim_cur == RLIM_INFINITY)
            snprintf(stack, sizeof stack, "unlimited");
        else
            snprintf(stack, sizeof stack, "%llu KiB", (unsigned long long)l.rlim_cur / 1024);
    }
    if (getrlimit(RLIMIT_AS, &l) == 0 && l.rlim_cur != RLIM_INFINITY)
        snprintf(as, sizeof as, ", ulimit -v %llu KiB", (unsigned long long)l.rlim_cur / 1024);
    read_line("/proc/sys/kernel/threads-max", max, sizeof max);
    read_line("/proc/self/cgroup", cgroup, sizeof cgroup); /* cgroup v2: "0::/the/group" */
    if (strncmp(cgroup, "0::", 3) == 0) {
        char value[32];
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/pids.max", cgroup + 3);
        read_line(path, value, sizeof value);
        if (value[0] && strcmp(value, "max") != 0) snprintf(pids, sizeof pids, ", this cgroup's pids.max %s", value);
    }
    const char *name = err == EAGAIN ? "EAGAIN" : err == ENOMEM ? "ENOMEM" : err == EPERM ? "EPERM" : "errno";
    return shard_error(SHARD_ERR_IO,
                       "cannot start the thread of rank %d of %d (%d of them started): %s (%s %d); the limits: "
                       "ulimit -u (RLIMIT_NPROC) %s processes and threads for this user, the kernel's threads-max "
                       "%s%s, ulimit -s %s of stack per thread%s: give fewer --ranks, or raise the limit reached",
                       r, n, r, strerror(err), name, err, nproc, max[0] ? max : "?", pids, stack, as);
}

static shard_status launch_threads(const shard_launch_config *cfg, const shard_cluster *cluster, double timeout,
                                   shard_rank_fn fn, void *arg) {
    int n = cfg->ranks ? cfg->ranks : 1; /* 0: one rank per process, as under a launcher */
    if (n < 1 || n > 4096)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%d ranks (--ranks, or shard_launch's ranks) is invalid: give 1..4096, "
                           "or 0 for one rank per process",
                           n);
    if (cfg->verbose)
        fprintf(stderr,
                "shard: backend threads, %d ranks in this process (no MPI launcher variables found), timeout %g s\n", n,
                timeout);
    /* OpenBLAS is loaded (it sets and restores environment variables) before any rank thread can read the
     * environment; a failure to load is reported when a product needs it */
    (void)shard_blas_init();
    shard_cluster_device last;
    if (cluster) SHARD_CHECK(shard_cluster_rank_device(cluster, n - 1, &last)); /* devices for every rank */
    shard__mem_ledger *ledgers = calloc((size_t)n, sizeof *ledgers);
    shard_comm **comms = calloc((size_t)n, sizeof *comms);
    rank_ctx *ctx = calloc((size_t)n, sizeof *ctx);
    pthread_t *threads = calloc((size_t)n, sizeof *threads);
    shard__thread_job *job = NULL;
    shard_status s = SHARD_OK;
    if (!ledgers || !comms || !ctx || !threads) {
        s = shard_error(SHARD_ERR_NO_MEMORY, "out of memory launching %d ranks", n);
        goto done;
    }
    for (int r = 0; r < n; r++) shard__mem_ledger_init(&ledgers[r]);
    SHARD_CHECK_GOTO(shard__threads_world_create(n, timeout, ledgers, comms, &job), s, done);
    int started = 0, failed_at = 0, failed_errno = 0;
    for (int r = 0; r < n; r++) {
        ctx[r] = (rank_ctx){.comm = comms[r], .ledger = &ledgers[r], .fn = fn, .arg = arg, .cluster = cluster};
        if (r == 0) continue; /* rank 0 runs on the calling thread */
        int err = pthread_create(&threads[r], NULL, rank_main, &ctx[r]);
        if (err != 0) {
            failed_at = r, failed_errno = err;
            shard_comm_abort(comms[r], SHARD_ERR_IO, "could not start its thread");
            for (int q = r; q < n; q++) shard_comm_destroy(comms[q]);
            break;
        }
        started = r;
    }
    rank_main(&ctx[0]);
    for (int r = 1; r <= started; r++) pthread_join(threads[r], NULL);
    /* the root cause: the abort text if the job aborted, else the first failing rank */
    char text[SHARD_ERROR_TEXT_BYTES];
    s = shard__threads_job_abort_status(job, text, sizeof text);
    if (failed_at) { /* the root cause is the launch's, not the ranks' it stopped */
        s = thread_failure(failed_errno, failed_at, n);
    } else if (s < 0) {
        shard_error(s, "%s", text);
    } else {
        for (int r = 0; r < n; r++)
            if (ctx[r].status < 0) {
                s = shard_error(ctx[r].status, "rank %d failed: %s", r, ctx[r].error);
                break;
            }
    }
    shard__threads_job_release(job);
done:
    retire_ledgers(ledgers, n);
    free(comms);
    for (int r = 0; ctx && r < n; r++) free_text(ctx[r].error);
    free(ctx);
    free(threads);
    return s;
}

/* ------------------------------------------------------------------ MPI */

static shard_status launch_mpi(const shard_launch_config *cfg, const shard_cluster *cluster, double timeout,
                               shard_rank_fn fn, void *arg) {
    char described[256] = "no launcher variables";
    int env_rank = -1, env_size = -1;
    shard_launch_detect_mpi(described, sizeof described, &env_rank, &env_size);
    if (!shard__mpi_built())
        return shard_error(
            SHARD_ERR_UNSUPPORTED,
            "started by an MPI launcher (%s) but this build has no MPI backend: install libopenmpi-dev and rebuild",
            described);
    if (cfg->verbose) fprintf(stderr, "shard: rank %d: MPI launcher detected from %s\n", env_rank, described);
    shard_comm *world = NULL;
    SHARD_CHECK(shard__mpi_world(&world, cfg->verbose, timeout));
    int size = shard_comm_size(world);
    if (env_size > 0 && env_size != size) {
        /* a launcher of another MPI than this build's (mpiexec.mpich for an Open MPI build, say): every
         * process would initialise a world of its own and run the whole job alone */
        shard_status s = shard_error(SHARD_ERR_INVALID_ARG,
                                     "the launcher started %d processes (%s) but this build's MPI sees a world of %d: "
                                     "the launcher belongs to another MPI; start it with the mpiexec of the MPI shard "
                                     "was built with",
                                     env_size, described, size);
        shard_comm_destroy(world);
        return s;
    }
    if (cfg->ranks > 1 && cfg->ranks != size) {
        shard_status s =
            shard_error(SHARD_ERR_INVALID_ARG,
                        "%d ranks asked for (--ranks, or shard_launch's ranks) but the MPI launcher started %d "
                        "processes, and under mpirun its -np sets the ranks: drop --ranks (ranks 0) or make "
                        "them agree",
                        cfg->ranks, size);
        shard_comm_destroy(world);
        return s;
    }
    shard_clear_error();
    shard_status s = run_rank(world, cluster, fn, arg);
    char text[SHARD_ERROR_TEXT_BYTES];
    snprintf(text, sizeof text, "%s", s < 0 ? shard_last_error() : "");
    if (s < 0 && size > 1) shard_comm_abort(world, s, text[0] ? text : shard_status_string(s)); /* ends the job */
    if (shard_comm_destroy(world) < 0) {
        if (s == SHARD_OK) { /* returned with requests in flight: the program's bug, reported as a failure */
            s = SHARD_ERR_INVALID_ARG;
            snprintf(text, sizeof text, "rank %d returned but %s", shard_comm_rank(world), shard_last_error());
            if (size > 1) shard_comm_abort(world, s, text); /* ends the job */
        }
        shard__comm_destroy_force(world);
    }
    if (s < 0) shard_error(s, "%s", text);
    return s;
}

static shard_status launch_on(const shard_launch_config *config, const shard_cluster *cluster, shard_rank_fn fn,
                              void *arg) {
    double timeout = config->timeout_seconds > 0 ? config->timeout_seconds : shard_default_timeout();
    int under_mpi = shard_launch_detect_mpi(NULL, 0, NULL, NULL);
    switch (config->backend) {
    case SHARD_BACKEND_MPI:
        if (!under_mpi)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "--backend mpi needs an MPI launcher: run it as 'mpirun -np N build/shard ...'");
        return launch_mpi(config, cluster, timeout, fn, arg);
    case SHARD_BACKEND_THREADS:
        if (under_mpi)
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "--backend threads was asked for, but this process was started by an MPI launcher; "
                               "use --backend mpi or run without mpirun");
        return launch_threads(config, cluster, timeout, fn, arg);
    case SHARD_BACKEND_AUTO:
        return under_mpi ? launch_mpi(config, cluster, timeout, fn, arg)
                         : launch_threads(config, cluster, timeout, fn, arg);
    }
    return shard_error(SHARD_ERR_INVALID_ARG, "unknown backend choice %d: use auto, threads or mpi",
                       (int)config->backend);
}

shard_status shard_launch_with(const shard_launch_config *config, shard_rank_fn fn, void *arg) {
    if (!config || config->struct_size < sizeof(shard_launch_config))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_launch_with: config missing or from an older header (struct_size)");
    if (!fn) return shard_error(SHARD_ERR_INVALID_ARG, "shard_launch: rank function is NULL");
    const shard_cluster *cluster = NULL;
    shard_cluster *owned = NULL;
    SHARD_CHECK(launch_cluster(config, &cluster, &owned));
    shard_status s = launch_on(config, cluster, fn, arg);
    shard_cluster_destroy(owned);
    return s;
}

shard_status shard_launch(int ranks, shard_rank_fn fn, void *arg) {
    shard_launch_config cfg = shard_launch_config_default();
    cfg.ranks = ranks;
    return shard_launch_with(&cfg, fn, arg);
}
