/* bench_ckpt.c — `shard bench ckpt`: save and load throughput of a sharded
 * model (8 f32 tensors of --bytes in all, split over data=N) next to the
 * machine's plain sequential write (write + fsync) and read of the same bytes,
 * each rank its share, measured in the same run and alternating iteration by
 * iteration.  Throughput = total bytes / the slowest rank's time; the figure
 * is the median over --iters (>= 5) iterations.  Every iteration saves a new
 * step (index, checksums, rename and all) and loads it back, checked. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/checkpoint.h"
#include "shard/clock.h"
#include "shard/comm.h"
#include "shard/files.h"
#include "shard/shard.h"

enum { NTENSORS = 8, COLS = 1024 };

typedef struct ckpt_run {
    const bench_ckpt_options *opt;
    char dir[PATH_MAX];             /* set by rank 0 */
    int made;                       /* rank 0 made dir (else it was empty): removed, not emptied, at the end */
    char made_root[PATH_MAX];       /* the highest directory rank 0 made for it (dir, or a parent --dir lacked) */
    double save, load, write, read; /* medians, seconds (rank 0) */
    uint64_t bytes;
    int ranks;
    char backend[16];
} ckpt_run;

/* Plain sequential I/O of this rank's share: write + fsync, or read back. */
static shard_status plain_io(const char *path, void *buf, size_t bytes, int writing) {
    int fd = writing ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return shard_error(SHARD_ERR_IO, "%s: %s", path, strerror(errno));
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = writing ? write(fd, (char *)buf + done, bytes - done) : read(fd, (char *)buf + done, bytes - done);
        if (n <= 0 && !(n < 0 && errno == EINTR)) {
            close(fd);
            return shard_error(SHARD_ERR_IO, "%s: %s", path, n < 0 ? strerror(errno) : "short transfer");
        }
        if (n > 0) done += (size_t)n;
    }
    int rc = writing ? fsync(fd) : 0;
    if (rc != 0) {
        shard_status s = shard_error(SHARD_ERR_IO, "%s: fsync: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    return close(fd) == 0 ? SHARD_OK : shard_error(SHARD_ERR_IO, "%s: close: %s", path, strerror(errno));
}

/* The slowest rank's time of expr into out; on a failure `s` holds it (cleanup follows, no return). */
#define TIMED(comm, out, expr)                                                                                         \
    do {                                                                                                               \
        if (s == SHARD_OK) s = shard_comm_barrier(comm);                                                               \
        if (s != SHARD_OK) break;                                                                                      \
        double t0_ = shard_clock_seconds();                                                                            \
        s = (expr);                                                                                                    \
        double dt_ = shard_clock_seconds() - t0_;                                                                      \
        if (s == SHARD_OK) s = shard_comm_all_reduce(comm, &dt_, &(out), 1, SHARD_F64, SHARD_OP_MAX);                  \
    } while (0)

/* Every iteration's save, load, write and read in `dir`; rank 0's medians into run. */
static shard_status measure(shard_comm *comm, ckpt_run *run, const char *dir) {
    const bench_ckpt_options *opt = run->opt;
    int rank = shard_comm_rank(comm), n = shard_comm_size(comm);
    shard_status s = SHARD_OK;
    char mesh_text[32];
    snprintf(mesh_text, sizeof mesh_text, "data=%d", n);
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_mesh_create(comm, mesh_text, &mesh));
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    size_t rows = (size_t)(opt->bytes / (NTENSORS * COLS * 4));
    if (rows < (size_t)n) rows = (size_t)n;
    size_t shape[2] = {rows, COLS};
    shard_spec spec;
    s = shard_spec_parse("P('data', None)", &layout, 2, &spec);
    shard_ckpt_item saved[NTENSORS], loaded[NTENSORS];
    char names[NTENSORS][16];
    size_t mine = 0;
    memset(saved, 0, sizeof saved), memset(loaded, 0, sizeof loaded);
    for (int k = 0; k < NTENSORS && s == SHARD_OK; k++) {
        snprintf(names[k], sizeof names[k], "layer_%d", k);
        saved[k].name = loaded[k].name = names[k];
        s = shard_dtensor_create(mesh, SHARD_F32, 2, shape, &spec, SHARD_MEM_PARAMS, &saved[k].tensor);
        if (s == SHARD_OK)
            s = shard_dtensor_create(mesh, SHARD_F32, 2, shape, &spec, SHARD_MEM_PARAMS, &loaded[k].tensor);
        if (s < 0) break;
        float *v = saved[k].tensor->local->data;
        for (size_t i = 0; i < shard_tensor_numel(saved[k].tensor->local); i++) v[i] = (float)(i % 977) + (float)k;
        mine += shard_tensor_nbytes(saved[k].tensor->local);
    }
    char plain[PATH_MAX];
    snprintf(plain, sizeof plain, "%s/plain_rank_%05d.bin", dir, rank);
    void *buf = s == SHARD_OK ? malloc(mine ? mine : 1) : NULL;
    if (s == SHARD_OK && !buf) s = shard_error(SHARD_ERR_NO_MEMORY, "bench ckpt: out of memory");
    if (buf) memset(buf, 7, mine);
    int iters = opt->iters;
    double *t = calloc(4 * (size_t)iters, sizeof *t); /* save | load | write | read */
    if (s == SHARD_OK && !t) s = shard_error(SHARD_ERR_NO_MEMORY, "bench ckpt: out of memory");
    for (int it = 0; it < iters && s == SHARD_OK; it++) {
        uint64_t step = (uint64_t)it + 1, got = 0;
        unlink(plain); /* a fresh file, untimed, as each save writes a new step directory: truncating the last
                        * one inside the timer charged its freeing to the plain side */
        TIMED(comm, t[2 * iters + it], plain_io(plain, buf, mine, 1));
        TIMED(comm, t[it], shard_ckpt_save(dir, step, saved, NTENSORS, "{\"bench\": \"ckpt\"}"));
        TIMED(comm, t[3 * iters + it], plain_io(plain, buf, mine, 0));
        TIMED(comm, t[iters + it], shard_ckpt_load(dir, loaded, NTENSORS, &got));
        int32_t wrong = 0, any = 0; /* every rank learns whether one read back wrong data (and stops with it) */
        for (int k = 0; k < NTENSORS && s == SHARD_OK; k++)
            wrong |= got != step || !shard_tensor_equal_bits(loaded[k].tensor->local, saved[k].tensor->local);
        if (s == SHARD_OK) s = shard_comm_all_reduce(comm, &wrong, &any, 1, SHARD_I32, SHARD_OP_MAX);
        if (s == SHARD_OK && any)
            s = shard_error(SHARD_ERR_INTERNAL, "bench ckpt: step %llu loaded wrong data%s", (unsigned long long)step,
                            wrong ? "" : " on another rank");
        if (s == SHARD_OK && rank == 0 && it > 0) { /* keep the disk use to two checkpoints */
            char old[PATH_MAX];
            shard_ckpt_step_dir(dir, step - 1, old, sizeof old);
            shard_remove_tree(old);
        }
    }
    unlink(plain);
    if (s == SHARD_OK) s = shard_comm_barrier(comm); /* every rank's file gone before rank 0 cleans up */
    if (s == SHARD_OK && rank == 0) {
        run->save = cli_median(t, iters), run->load = cli_median(t + iters, iters);
        run->write = cli_median(t + 2 * iters, iters), run->read = cli_median(t + 3 * iters, iters);
        run->bytes = (uint64_t)rows * COLS * 4 * NTENSORS;
        run->ranks = n;
        snprintf(run->backend, sizeof run->backend, "%s", shard_comm_backend(comm));
    }
    free(t);
    free(buf);
    for (int k = 0; k < NTENSORS; k++) shard_dtensor_destroy(saved[k].tensor), shard_dtensor_destroy(loaded[k].tensor);
    shard_mesh_destroy(mesh);
    return s;
}

/* 1 if `path` is a directory holding anything, 0 if it is empty or absent, -1 if it is not a directory */
static int dir_in_use(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    int used = 0;
    for (struct dirent *e; !used && (e = readdir(d));)
        used = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return used;
}

/* Everything inside `path` (not path itself). */
static shard_status empty_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return shard_error(SHARD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    shard_status s = SHARD_OK;
    char inner[PATH_MAX];
    for (struct dirent *e; s == SHARD_OK && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(inner, sizeof inner, "%s/%s", path, e->d_name);
        s = shard_remove_tree(inner);
    }
    closedir(d);
    return s;
}

/* The highest missing directory on the way to `path` (path itself when its parent exists): what making
 * `path` creates, and what the end of the run removes. */
static void highest_missing(const char *path, char *out, size_t out_bytes) {
    snprintf(out, out_bytes, "%s", path);
    char parent[PATH_MAX];
    for (;;) {
        snprintf(parent, sizeof parent, "%s", out);
        char *slash = strrchr(parent, '/');
        while (slash && slash > parent && slash[1] == '\0') *slash = '\0', slash = strrchr(parent, '/'); /* "a/b/" */
        if (!slash || slash == parent) return; /* "name" or "/name": nothing above to make */
        *slash = '\0';
        if (access(parent, F_OK) == 0) return;
        snprintf(out, out_bytes, "%s", parent);
    }
}

/* --dir must be new or empty: the run saves steps 1.. and moves `latest`, so it stays out of a real
 * checkpoint's directory.  What it wrote is removed at the end, whatever happened, unless --keep. */
static shard_status bench_rank(shard_comm *comm, void *arg) {
    ckpt_run *run = arg;
    const bench_ckpt_options *opt = run->opt;
    int rank = shard_comm_rank(comm);
    char dir[PATH_MAX] = "";
    int made = 0;
    shard_status s = SHARD_OK;
    if (rank == 0) { /* one directory for all ranks (under MPI they are other processes) */
        if (opt->dir) {
            int used = dir_in_use(opt->dir);
            if (used)
                s = shard_error(SHARD_ERR_INVALID_ARG, "bench ckpt: --dir %s %s: give a new or empty directory",
                                opt->dir,
                                used > 0               ? "is not empty"
                                    : errno == ENOTDIR ? "is not a directory"
                                                       : strerror(errno));
            made = used == 0 && access(opt->dir, F_OK) != 0;
            if (made) highest_missing(opt->dir, run->made_root, sizeof run->made_root);
            char why[512];
            if (s == SHARD_OK && shard_dir_probe_writable(opt->dir) < 0) { /* found before any directory is made */
                snprintf(why, sizeof why, "%s", shard_last_error());
                s = shard_error(SHARD_ERR_IO, "bench ckpt: --dir %s: %s: give a directory that can be written",
                                opt->dir, why);
            }
            if (s == SHARD_OK) s = shard_mkdirs(opt->dir);
            snprintf(dir, sizeof dir, "%s", opt->dir);
        } else {
            snprintf(dir, sizeof dir, "/tmp/shard-bench-ckpt-XXXXXX");
            made = mkdtemp(dir) != NULL;
            snprintf(run->made_root, sizeof run->made_root, "%s", dir);
            if (!made)
                s = shard_error(SHARD_ERR_IO, "bench ckpt: cannot make a directory under /tmp: %s", strerror(errno));
        }
        if (s < 0) dir[0] = '\0';
        snprintf(run->dir, sizeof run->dir, "%s", dir);
    }
    SHARD_CHECK(shard_comm_broadcast(comm, dir, sizeof dir, SHARD_U8, 0));
    if (!dir[0])
        return rank == 0 ? s : shard_error(SHARD_ERR_ABORTED, "bench ckpt: rank 0 could not make the directory");
    if (rank == 0) run->made = made;
    return measure(comm, run, dir); /* the directory is cleaned once every rank has returned */
}

shard_status bench_ckpt_run(const bench_ckpt_options *opt) {
    ckpt_run *run = calloc(1, sizeof *run);
    if (!run) return shard_error(SHARD_ERR_NO_MEMORY, "bench: out of memory");
    run->opt = opt;
    shard_status s = shard_launch_with(&opt->launch, bench_rank, run);
    int mpi_rank = 0;
    int printer = !(shard_launch_detect_mpi(NULL, 0, &mpi_rank, NULL) && mpi_rank != 0);
    /* every thread rank has returned (under MPI, a failed job's processes are gone): rank 0's process
     * removes what the run wrote, whatever happened, unless --keep */
    if (run->dir[0] && !opt->keep) {
        shard_status r = run->made ? shard_remove_tree(run->made_root) : empty_dir(run->dir);
        if (s == SHARD_OK) s = r;
    }
    if (s == SHARD_OK && printer) {
        double gb = (double)run->bytes / 1e9;
        double save = gb / run->save, load = gb / run->load, wr = gb / run->write, rd = gb / run->read;
        if (opt->json) {
            char dir_json[2 * PATH_MAX];
            printf(
                "{\"backend\": \"%s\", \"dir\": %s, \"kept\": %s, \"ranks\": %d, \"bytes\": %llu, \"save_s\": %.4f, "
                "\"load_s\": %.4f, "
                "\"write_s\": %.4f, \"read_s\": %.4f, \"save_gbps\": %.4f, \"load_gbps\": %.4f, \"write_gbps\": %.4f, "
                "\"read_gbps\": %.4f, \"save_ratio\": %.4f, \"load_ratio\": %.4f}\n",
                run->backend, cli_json_string(run->dir, dir_json, sizeof dir_json), opt->keep ? "true" : "false",
                run->ranks, (unsigned long long)run->bytes, run->save, run->load, run->write, run->read, save, load, wr,
                rd, save / wr, load / rd);
        } else {
            char size[32];
            cli_format_size(run->bytes, size, sizeof size);
            printf("# shard bench ckpt: %s, %d ranks, %s in %d f32 tensors split over data=%d, in %s, median of %d\n",
                   run->backend, run->ranks, size, NTENSORS, run->ranks, run->dir, opt->iters);
            printf("%-6s %10s %10s   %-24s %10s %10s %7s\n", "", "time_s", "GB/s", "plain sequential", "time_s", "GB/s",
                   "ratio");
            printf("%-6s %10.3f %10.3f   %-24s %10.3f %10.3f %7.3f\n", "save", run->save, save, "write + fsync",
                   run->write, wr, save / wr);
            printf("%-6s %10.3f %10.3f   %-24s %10.3f %10.3f %7.3f\n", "load", run->load, load, "read", run->read, rd,
                   load / rd);
        }
        fflush(stdout);
    }
    free(run);
    return s;
}
