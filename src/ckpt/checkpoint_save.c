/* checkpoint_save.c — write a sharded checkpoint with the commit protocol of
 * checkpoint.h: each rank writes the chunks it owns into step_N.tmp/, one
 * collective carries every rank's status, size and checksum, and rank 0
 * writes the index, renames the directory and moves `latest`.  A value
 * that is not finite in any rank's chunks refuses the save before any file
 * is written, as a training step refuses a gradient that is not finite.
 *
 * A simulated crash (shard_ckpt_set_crash_point) stops a rank's file-system
 * work at that point and leaves everything as it is, while the rank still
 * takes part in the collectives (reporting the crash), so tests can look at
 * exactly what a crash there would leave on disk. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic_file.h"
#include "ckpt_index.h"
#include "ckpt_util.h"
#include "shard/checkpoint.h"
#include "shard/safetensors.h"

enum { CRASHED = 1, FAILED = 2, NOT_FINITE = 3, MESSAGE_BYTES = 240 };

/* ---------------------------------------------------------------- crash points */

static char crash_point[32];
static int crash_rank = -1, crash_set;

void shard_ckpt_set_crash_point(const char *point, int rank) {
    snprintf(crash_point, sizeof crash_point, "%s", point ? point : "");
    crash_rank = rank;
    crash_set = 1;
}

static int crashes_here(const char *point, int rank) {
    char env_point[32] = "";
    int env_rank = -1;
    const char *point_now = crash_point;
    int rank_now = crash_rank;
    if (!crash_set) {
        const char *env = getenv("SHARD_CKPT_CRASH_AT");
        if (!env || !*env) return 0;
        snprintf(env_point, sizeof env_point, "%s", env);
        char *at = strchr(env_point, '@');
        if (at) *at = '\0', env_rank = atoi(at + 1);
        point_now = env_point, rank_now = env_rank;
    }
    return point_now[0] && strcmp(point_now, point) == 0 && (rank_now < 0 || rank_now == rank);
}

/* ---------------------------------------------------------------- chunks */

/* The items to write: each reduced to a spec without pending reductions. */
typedef struct prepared {
    const shard_dtensor *t;
    shard_dtensor *owned; /* the reduced copy, if one was needed */
} prepared;

static shard_status prepare_items(const shard_ckpt_item *items, size_t count, prepared *p) {
    for (size_t i = 0; i < count; i++) {
        p[i].t = items[i].tensor;
        if (!items[i].tensor->spec.partial_mask) continue;
        shard_spec plain = items[i].tensor->spec;
        plain.partial_mask = 0, plain.partial_op = SHARD_OP_SUM;
        const shard_dtensor *src = items[i].tensor;
        SHARD_CHECK(shard_dtensor_create(src->mesh, src->dtype, src->ndim, src->global_shape, &plain, SHARD_MEM_COMM,
                                         &p[i].owned));
        SHARD_CHECK(shard_dtensor_redistribute(src, p[i].owned));
        p[i].t = p[i].owned;
    }
    return SHARD_OK;
}

/* A chunk is written when this rank writes its block (shard__ckpt_writes_chunk) and the block holds
 * something, or the whole tensor is empty (its one, empty chunk): a tensor with fewer rows than ranks
 * leaves the ranks without rows out of the index. */
static int chunk_written(const shard_dtensor *t, const int *coords, const size_t *len) {
    if (!shard__ckpt_writes_chunk(t, coords)) return 0;
    size_t whole = 1, mine = 1;
    for (int d = 0; d < t->ndim; d++) whole *= t->global_shape[d], mine *= len[d];
    return mine > 0 || whole == 0;
}

/* Write this rank's file (when it owns chunks); returns its size and checksum. */
static shard_status write_rank_file(const char *tmp_dir, int rank, const shard_ckpt_item *items, const prepared *p,
                                    size_t count, uint64_t *bytes, uint64_t *hash, int *wrote) {
    int coords[SHARD_MESH_MAX_AXES];
    shard__ckpt_my_coords(p[0].t->mesh, coords);
    shard_st_entry *entries = calloc(count ? count : 1, sizeof *entries);
    if (!entries) return shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        if (!chunk_written(p[i].t, coords, p[i].t->local->shape)) continue;
        shard_st_entry *e = &entries[n++];
        e->name = items[i].name, e->dtype = p[i].t->dtype, e->ndim = p[i].t->ndim;
        for (int d = 0; d < e->ndim; d++) e->shape[d] = p[i].t->local->shape[d];
    }
    *wrote = n > 0, *bytes = 0, *hash = 0;
    if (!n) {
        free(entries);
        return SHARD_OK;
    }
    char path[PATH_MAX];
    shard__ckpt_rank_file(tmp_dir, rank, path, sizeof path);
    shard_st_writer *w = NULL;
    shard_status s = shard_st_writer_open(path, entries, n, NULL, NULL, 0, &w);
    free(entries);
    for (size_t i = 0; s == SHARD_OK && i < count; i++)
        if (chunk_written(p[i].t, coords, p[i].t->local->shape))
            s = shard_st_writer_write(w, p[i].t->local->data, shard_tensor_nbytes(p[i].t->local));
    if (s < 0) {
        shard_st_writer_abort(w);
        return s;
    }
    return shard_st_writer_commit_digest(w, hash, bytes);
}

/* 1 and the first value that is not finite among this rank's chunks, said in `what`; checked before any
 * file is written, so `latest` never moves to a step whose state is not finite. */
static int nonfinite_chunk(const shard_ckpt_item *items, const prepared *p, size_t count, char *what,
                           size_t what_bytes) {
    int coords[SHARD_MESH_MAX_AXES];
    shard__ckpt_my_coords(p[0].t->mesh, coords);
    for (size_t i = 0; i < count; i++) {
        const shard_dtensor *t = p[i].t;
        if (!chunk_written(t, coords, t->local->shape)) continue;
        size_t bad = shard__ckpt_first_nonfinite(t->local->data, t->dtype, shard_tensor_numel(t->local));
        if (bad == SIZE_MAX) continue;
        size_t off[SHARD_MAX_DIMS], len[SHARD_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++)
            shard_spec_local_range(&t->spec, &t->layout, t->global_shape, coords, d, &off[d], &len[d]);
        shard__ckpt_nonfinite_text(items[i].name, t->local->data, t->dtype, bad, t->ndim, off, len, what, what_bytes);
        return 1;
    }
    return 0;
}

/* The index: every tensor's chunks (computable from the specs alone) and every file. */
static shard_status build_index(const shard_ckpt_item *items, const prepared *p, size_t count, uint64_t step,
                                const char *config, const char *training, const uint64_t *per_rank, int world,
                                shard__ckpt_index *ix) {
    const shard_dtensor *t0 = p[0].t;
    memset(ix, 0, sizeof *ix);
    ix->step = step, ix->world = world, ix->config = (char *)config, ix->training = (char *)training;
    char mesh[256];
    shard_mesh_string(t0->mesh, mesh, sizeof mesh);
    ix->mesh = strdup(mesh);
    int *file_of_rank = calloc((size_t)world, sizeof *file_of_rank);
    ix->files = calloc((size_t)world, sizeof *ix->files);
    ix->tensors = calloc(count ? count : 1, sizeof *ix->tensors);
    if (!file_of_rank || !ix->files || !ix->tensors || !ix->mesh) {
        free(file_of_rank), free(ix->files), free(ix->tensors), free(ix->mesh);
        return shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    }
    for (int r = 0; r < world; r++) {
        file_of_rank[r] = -1;
        if (!per_rank[4 * r + 3]) continue; /* wrote no file */
        shard__ckpt_file *f = &ix->files[ix->nfiles];
        shard__ckpt_rank_file(NULL, r, f->name, sizeof f->name);
        f->bytes = per_rank[4 * r + 1], f->xxh3 = per_rank[4 * r + 2];
        file_of_rank[r] = (int)ix->nfiles++;
    }
    shard_status s = SHARD_OK;
    for (size_t i = 0; i < count && s == SHARD_OK; i++) {
        const shard_dtensor *t = p[i].t;
        shard__ckpt_tensor *x = &ix->tensors[ix->ntensors++];
        char spec[256];
        shard_spec_string(&t->spec, &t->layout, spec, sizeof spec);
        x->name = (char *)items[i].name, x->dtype = t->dtype, x->ndim = t->ndim, x->spec = strdup(spec);
        for (int d = 0; d < t->ndim; d++) x->shape[d] = t->global_shape[d];
        x->chunks = calloc((size_t)world, sizeof *x->chunks);
        if (!x->spec || !x->chunks) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
            break;
        }
        for (int r = 0; r < world; r++) {
            int c[SHARD_MESH_MAX_AXES] = {0};
            shard_mesh_layout_unravel(&t->layout, (1u << t->layout.ndim) - 1, r, c);
            shard__ckpt_chunk *k = &x->chunks[x->nchunks];
            for (int d = 0; d < t->ndim; d++)
                shard_spec_local_range(&t->spec, &t->layout, t->global_shape, c, d, &k->off[d], &k->len[d]);
            if (!chunk_written(t, c, k->len)) continue;
            k->file = file_of_rank[r];
            x->nchunks++;
        }
    }
    free(file_of_rank);
    return s;
}

static void free_built_index(shard__ckpt_index *ix) {
    for (size_t t = 0; t < ix->ntensors; t++) free(ix->tensors[t].spec), free(ix->tensors[t].chunks);
    free(ix->tensors);
    free(ix->files);
    free(ix->mesh);
}

/* Rank 0's part after every file is in: index, rename, latest. */
static shard_status commit(const char *dir, uint64_t step, const char *tmp_dir, const shard__ckpt_index *ix,
                           int *crashed) {
    char path[PATH_MAX], final[PATH_MAX], latest[64];
    if (crashes_here("before_index", 0)) return *crashed = 1, shard_error(SHARD_ERR_IO, "simulated crash before_index");
    snprintf(path, sizeof path, "%s/index.json", tmp_dir);
    SHARD_CHECK(shard__ckpt_index_write(path, ix));
    if (crashes_here("before_rename", 0))
        return *crashed = 1, shard_error(SHARD_ERR_IO, "simulated crash before_rename");
    shard__ckpt_step_dir(dir, step, final, sizeof final);
    if (rename(tmp_dir, final) != 0)
        return shard_error(SHARD_ERR_IO, "checkpoint: cannot rename %s to %s: %s", tmp_dir, final, strerror(errno));
    SHARD_CHECK(shard__fsync_dir(dir));
    if (crashes_here("before_latest", 0))
        return *crashed = 1, shard_error(SHARD_ERR_IO, "simulated crash before_latest");
    snprintf(path, sizeof path, "%s/latest", dir);
    int n = snprintf(latest, sizeof latest, "step_%llu\n", (unsigned long long)step);
    return shard__atomic_write_file(path, latest, (size_t)n);
}

/* Rank 0, first: a fresh step_N.tmp/ (removing a crashed attempt's), and no committed step_N yet.  One past
 * `latest` (a save that crashed before writing `latest`, or an earlier run's when this one resumed from an
 * older step) is moved aside, whole, to step_N.replaced-<time>: no load through the root picks it. */
static shard_status make_tmp_dir(const char *dir, uint64_t step, const char *tmp_dir) {
    char final[PATH_MAX], aside[PATH_MAX + 64];
    SHARD_CHECK(shard__ckpt_mkdirs(dir));
    shard__ckpt_step_dir(dir, step, final, sizeof final);
    if (shard__ckpt_step_committed(dir, step))
        return shard_error(SHARD_ERR_INVALID_ARG, "checkpoint %s already exists; save under another step or remove it",
                           final);
    if (access(final, F_OK) == 0) SHARD_CHECK(shard__ckpt_move_aside(final, aside, sizeof aside));
    SHARD_CHECK(shard__ckpt_remove_tree(tmp_dir));
    if (mkdir(tmp_dir, 0755) != 0)
        return shard_error(SHARD_ERR_IO, "checkpoint: cannot create %s: %s", tmp_dir, strerror(errno));
    return shard__fsync_dir(dir);
}

shard_status shard_ckpt_save(const char *dir, uint64_t step, const shard_ckpt_item *items, size_t count,
                             const char *config_json) {
    return shard_ckpt_save_run(dir, step, items, count, config_json, NULL);
}

shard_status shard_ckpt_save_run(const char *dir, uint64_t step, const shard_ckpt_item *items, size_t count,
                                 const char *config_json, const char *training_json) {
    SHARD_CHECK(shard__ckpt_check_items("shard_ckpt_save", items, count));
    shard_mesh *mesh = items[0].tensor->mesh;
    shard_comm *world = shard_mesh_comm(mesh);
    int rank = shard_comm_rank(world), size = shard_comm_size(world);
    if (!dir || !*dir) return shard_error(SHARD_ERR_INVALID_ARG, "shard_ckpt_save: no directory given");
    if (strlen(dir) > PATH_MAX - 96) /* room for /step_N.tmp/rank_NNNNN.safetensors: no name is cut short */
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_ckpt_save: the directory name is %zu bytes; at most %d",
                           strlen(dir), PATH_MAX - 96);
    char tmp_dir[PATH_MAX];
    shard__ckpt_step_dir(dir, step, tmp_dir, sizeof tmp_dir);
    strncat(tmp_dir, ".tmp", sizeof tmp_dir - strlen(tmp_dir) - 1);
    prepared *p = calloc(count, sizeof *p);
    uint64_t *per_rank = calloc(4 * (size_t)size, sizeof *per_rank); /* status, bytes, xxh3, wrote */
    char *messages = calloc((size_t)size, MESSAGE_BYTES);
    if (!p || !per_rank || !messages) {
        free(p), free(per_rank), free(messages);
        return shard_error(SHARD_ERR_NO_MEMORY, "shard_ckpt_save: out of memory");
    }
    /* 1. the directory, and the chunks' values (pending reductions applied) */
    int crashed = 0;
    shard_status s = rank == 0 ? make_tmp_dir(dir, step, tmp_dir) : SHARD_OK;
    int32_t ok0 = s == SHARD_OK;
    shard_status cs = shard_comm_broadcast(world, &ok0, 1, SHARD_I32, 0);
    if (cs < 0)
        s = cs;
    else if (!ok0 && rank != 0) /* rank 0's own error is the cause */
        s = shard_error(SHARD_ERR_ABORTED, "checkpoint: rank 0 could not prepare %s", tmp_dir);
    if (s == SHARD_OK) s = prepare_items(items, count, p); /* collective: every rank, same order */
    /* 2. every rank's file */
    uint64_t mine[4] = {0};
    if (s == SHARD_OK && crashes_here("before_write", rank)) crashed = 1;
    int wrote = 0, nonfinite = 0;
    char message[MESSAGE_BYTES] = "";
    if (s == SHARD_OK && !crashed) nonfinite = nonfinite_chunk(items, p, count, message, sizeof message);
    if (s == SHARD_OK && !crashed && !nonfinite)
        s = write_rank_file(tmp_dir, rank, items, p, count, &mine[1], &mine[2], &wrote);
    if (s == SHARD_OK && !crashed && crashes_here("after_write", rank)) crashed = 1;
    mine[0] = crashed ? CRASHED : nonfinite ? NOT_FINITE : s < 0 ? FAILED : 0;
    mine[3] = (uint64_t)wrote;
    if (mine[0] == FAILED) snprintf(message, sizeof message, "%s", shard_last_error());
    if (ok0) { /* 3. everyone's status, sizes and checksums */
        cs = shard_comm_all_gather(world, mine, per_rank, 4, SHARD_I64);
        if (cs == SHARD_OK) cs = shard_comm_all_gather(world, message, messages, MESSAGE_BYTES, SHARD_U8);
        if (cs < 0) s = cs;
    }
    int first_bad = -1, any_crash = 0;
    for (int r = 0; ok0 && cs == SHARD_OK && r < size; r++) {
        if (per_rank[4 * r] && first_bad < 0) first_bad = r;
        any_crash |= per_rank[4 * r] == CRASHED;
    }
    /* 4. rank 0 commits, or cleans up after a real failure (a crash leaves its debris) */
    shard__ckpt_index ix;
    memset(&ix, 0, sizeof ix);
    if (ok0 && cs == SHARD_OK && first_bad < 0 && rank == 0) {
        s = build_index(items, p, count, step, config_json, training_json, per_rank, size, &ix);
        if (s == SHARD_OK) s = commit(dir, step, tmp_dir, &ix, &crashed);
        /* an index that could not be written (a full disk): its files go too (none left once renamed) */
        if (s < 0 && !crashed) shard__ckpt_remove_tree(tmp_dir);
        free_built_index(&ix);
    } else if (ok0 && first_bad >= 0 && rank == 0 && !any_crash) {
        shard__ckpt_remove_tree(tmp_dir);
    }
    /* 5. everyone returns rank 0's verdict */
    int32_t verdict[2] = {s == SHARD_OK && first_bad < 0 && !crashed, crashed};
    if (ok0 && cs == SHARD_OK) cs = shard_comm_broadcast(world, verdict, 2, SHARD_I32, 0);
    for (size_t i = 0; i < count; i++) shard_dtensor_destroy(p[i].owned);
    free(p);
    if (s == SHARD_OK && cs < 0) s = cs;
    if (s == SHARD_OK && first_bad >= 0 && per_rank[4 * first_bad] == NOT_FINITE)
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "checkpoint step %llu in %s not saved: %s: a checkpoint holds finite values only; latest "
                        "is left as it was",
                        (unsigned long long)step, dir, messages + (size_t)first_bad * MESSAGE_BYTES);
    else if (s == SHARD_OK && first_bad >= 0)
        s = shard_error(SHARD_ERR_IO, "checkpoint %s: rank %d %s%s", tmp_dir, first_bad,
                        per_rank[4 * first_bad] == CRASHED ? "crashed (simulated)" : "failed: ",
                        per_rank[4 * first_bad] == CRASHED ? "" : messages + (size_t)first_bad * MESSAGE_BYTES);
    if (s == SHARD_OK && crashed) s = shard_error(SHARD_ERR_IO, "checkpoint %s: simulated crash", tmp_dir);
    if (s == SHARD_OK && !verdict[0])
        s = shard_error(SHARD_ERR_IO, "checkpoint step %llu in %s: rank 0 could not commit it%s",
                        (unsigned long long)step, dir, verdict[1] ? " (simulated crash during the commit)" : "");
    free(per_rank);
    free(messages);
    return s;
}
