/* checkpoint_load.c — load a sharded checkpoint onto any mesh and specs.
 *
 * Rank 0 picks the candidate directories (`latest`, then older complete
 * steps, newest first) and broadcasts each; every rank reads the index (and
 * its own checksum), and the files' sizes and xxh3 checksums are checked
 * with each file hashed by one rank (file i by rank i mod world), which also
 * checks that the file holds exactly the tensors the index lists in it.  The
 * first candidate that passes everywhere is loaded; skipping one is said on
 * stderr.  Each rank then maps the chunk files it needs and copies exactly
 * the intersections of the chunks with its own blocks — no rank reads a
 * block it does not hold — and refuses a value that is not finite, as a
 * training step refuses a gradient that is not. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../mesh/box.h"
#include "ckpt_index.h"
#include "ckpt_util.h"
#include "shard/checkpoint.h"
#include "shard/safetensors.h"

enum { REASON_BYTES = SHARD_ERROR_TEXT_BYTES }; /* a file's whole problem, its path included */

/* ---------------------------------------------------------------- candidates */

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

shard_status shard__ckpt_candidates(const char *root, uint64_t **out, size_t *n) {
    *out = NULL, *n = 0;
    uint64_t latest = 0;
    int has_latest = shard__ckpt_read_latest(root, &latest);
    DIR *d = opendir(root);
    if (!d) return shard_error(SHARD_ERR_IO, "%s: cannot open the checkpoint directory: %s", root, strerror(errno));
    size_t cap = 16;
    uint64_t *steps = malloc(cap * sizeof *steps);
    if (steps && has_latest) steps[(*n)++] = latest;
    for (struct dirent *e; steps && (e = readdir(d));) {
        uint64_t s;
        if (!shard__ckpt_parse_step_name(e->d_name, &s) || (has_latest && s >= latest)) continue;
        if (*n == cap) {
            uint64_t *more = realloc(steps, 2 * cap * sizeof *steps);
            if (!more) {
                free(steps), steps = NULL;
                break;
            }
            steps = more, cap *= 2;
        }
        steps[(*n)++] = s;
    }
    closedir(d);
    if (!steps) return shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    qsort(steps + has_latest, *n - (size_t)has_latest, sizeof *steps, cmp_desc);
    if (!has_latest && *n) /* a save stopped before it wrote `latest`, or the file was damaged: said, not silent */
        fprintf(stderr,
                "shard: note: %s/latest is missing or names no step_N; trying the newest step directory, step_%llu\n",
                root, (unsigned long long)steps[0]);
    *out = steps;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- checking */

/* Collective: every rank reads the index; files are checked in turns.  On
 * failure every rank returns the same reason (the first failing rank's). */
static shard_status check_step(shard_comm *world, const char *dir, shard__ckpt_index *ix, char *why) {
    int rank = shard_comm_rank(world), size = shard_comm_size(world);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/index.json", dir);
    int have_index = shard__ckpt_index_read(path, ix) == SHARD_OK, ok = have_index;
    if (!ok) snprintf(why, REASON_BYTES, "%s", shard_last_error());
    shard_safetensors **files = ok ? calloc(ix->nfiles ? ix->nfiles : 1, sizeof *files) : NULL;
    if (ok && !files) ok = 0, snprintf(why, REASON_BYTES, "%s: out of memory for %zu files", dir, ix->nfiles);
    for (size_t i = (size_t)rank; ok && i < ix->nfiles; i += (size_t)size) {
        ok = shard__ckpt_check_file(dir, &ix->files[i], why, REASON_BYTES);
        snprintf(path, sizeof path, "%s/%s", dir, ix->files[i].name);
        if (ok && shard_safetensors_open(path, &files[i]) < 0)
            ok = 0, snprintf(why, REASON_BYTES, "%s", shard_last_error());
    }
    if (ok) ok = shard__ckpt_check_listings(dir, ix, files, why, REASON_BYTES); /* the files this rank checked */
    for (size_t i = 0; files && i < ix->nfiles; i++) shard_safetensors_close(files[i]);
    free(files);
    int32_t first_bad = ok ? INT32_MAX : rank;
    shard_status s = shard_comm_all_reduce(world, &first_bad, &first_bad, 1, SHARD_I32, SHARD_OP_MIN);
    if (s == SHARD_OK && first_bad == INT32_MAX) return SHARD_OK;
    if (s == SHARD_OK) s = shard_comm_broadcast(world, why, REASON_BYTES, SHARD_U8, first_bad);
    why[REASON_BYTES - 1] = '\0';
    if (have_index) shard__ckpt_index_free(ix);
    return s < 0 ? s : SHARD_ERR_IO;
}

/* ---------------------------------------------------------------- loading */

typedef struct open_files {
    const char *dir;
    const shard__ckpt_index *ix;
    shard_safetensors **files;
} open_files;

static shard_status file_of(open_files *of, int i, shard_safetensors **out) {
    if (!of->files[i]) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", of->dir, of->ix->files[i].name);
        SHARD_CHECK(shard_safetensors_open(path, &of->files[i]));
    }
    *out = of->files[i];
    return SHARD_OK;
}

static shard_status load_item(open_files *of, const shard_ckpt_item *item) {
    shard_dtensor *t = item->tensor;
    const shard__ckpt_tensor *x = shard__ckpt_index_find(of->ix, item->name);
    if (!x) return shard_error(SHARD_ERR_INVALID_ARG, "checkpoint %s has no tensor '%s'", of->dir, item->name);
    int same = x->dtype == t->dtype && x->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = x->shape[d] == t->global_shape[d];
    if (!same) {
        char want[160], have[160] = "";
        size_t used = 0;
        shard_spec_type_string(&t->spec, &t->layout, t->dtype, t->global_shape, want, sizeof want);
        for (int d = 0; d < x->ndim && used < sizeof have; d++)
            used += (size_t)snprintf(have + used, sizeof have - used, "%s%llu", d ? "," : "",
                                     (unsigned long long)x->shape[d]);
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "checkpoint %s: tensor '%s' is %s[%s] there, but %s here (a config "
                           "other than the checkpoint's?)",
                           of->dir, item->name, shard_safetensors_dtype_name(x->dtype), have, want);
    }
    int coords[SHARD_MESH_MAX_AXES];
    shard__ckpt_my_coords(t->mesh, coords);
    for (int k = 0; k < t->layout.ndim; k++) /* a pending sum keeps the value at coordinate 0 only */
        if (t->spec.partial_op == SHARD_OP_SUM && (t->spec.partial_mask & (1u << k)) && coords[k] != 0)
            return shard_tensor_fill(t->local, 0);
    shard__box mine, chunk, both;
    shard__block_of(&t->spec, &t->layout, t->ndim, t->global_shape, coords, &mine);
    size_t covered = 0;
    for (size_t c = 0; c < x->nchunks; c++) {
        memcpy(chunk.off, x->chunks[c].off, sizeof chunk.off);
        memcpy(chunk.len, x->chunks[c].len, sizeof chunk.len);
        shard__box_intersect(&chunk, &mine, t->ndim, &both);
        if (shard__box_numel(&both, t->ndim) == 0) continue;
        shard_safetensors *f = NULL;
        SHARD_CHECK(file_of(of, x->chunks[c].file, &f));
        const shard_st_entry *e = shard_safetensors_find(f, item->name);
        int fits = e && e->dtype == t->dtype && e->ndim == t->ndim;
        for (int d = 0; fits && d < t->ndim; d++) fits = e->shape[d] == chunk.len[d];
        if (!fits)
            return shard_error(SHARD_ERR_IO, "checkpoint %s: %s does not hold the chunk of '%s' the index lists",
                               of->dir, of->ix->files[x->chunks[c].file].name, item->name);
        shard_tensor src = shard__contiguous_over((void *)shard_safetensors_data(f, e), t->dtype, t->ndim, &chunk);
        shard_tensor from = shard__sub_view(&src, &chunk, &both), to = shard__sub_view(t->local, &mine, &both);
        SHARD_CHECK(shard_tensor_copy(&to, &from));
        covered += shard__box_numel(&both, t->ndim);
    }
    if (covered != shard__box_numel(&mine, t->ndim))
        return shard_error(SHARD_ERR_IO,
                           "checkpoint %s: the chunks of '%s' cover %zu of the %zu elements of this rank's block",
                           of->dir, item->name, covered, shard__box_numel(&mine, t->ndim));
    /* checked like a step's computed state: a NaN or an infinity resumed would spread to every weight */
    size_t bad = shard__ckpt_first_nonfinite(t->local->data, t->dtype, shard_tensor_numel(t->local));
    if (bad != SIZE_MAX) {
        char what[256];
        shard__ckpt_nonfinite_text(item->name, t->local->data, t->dtype, bad, t->ndim, mine.off, mine.len, what,
                                   sizeof what);
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "checkpoint %s: %s: a checkpoint holds finite values only; resume from an earlier step",
                           of->dir, what);
    }
    return SHARD_OK;
}

static shard_status load_all(const char *dir, const shard__ckpt_index *ix, const shard_ckpt_item *items, size_t count) {
    open_files of = {dir, ix, calloc(ix->nfiles ? ix->nfiles : 1, sizeof(shard_safetensors *))};
    if (!of.files) return shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    shard_status s = SHARD_OK;
    for (size_t i = 0; i < count && s == SHARD_OK; i++) s = load_item(&of, &items[i]);
    for (size_t i = 0; i < ix->nfiles; i++) shard_safetensors_close(of.files[i]);
    free(of.files);
    return s;
}

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* ", 'name'" into a list of at most 3 names, then a count of the rest. */
static void add_name(char *out, size_t bytes, size_t *listed, const char *name) {
    size_t used = strlen(out);
    if (*listed < 3) snprintf(out + used, bytes - used, "%s'%s'", *listed ? ", " : "", name);
    (*listed)++;
}

static void close_names(char *out, size_t bytes, size_t listed) {
    size_t used = strlen(out);
    if (listed > 3) snprintf(out + used, bytes - used, " and %zu more", listed - 3);
}

/* The index lists exactly the run's tensors (the model's and its optimizer's): one the run needs and the
 * index lacks, or one the index holds and the run has not (a config other than the checkpoint's, or an
 * edited index), is named.
 * Every rank decides alike: the same index, the same names. */
static shard_status match_model(const char *dir, const shard__ckpt_index *ix, const shard_ckpt_item *items,
                                size_t count) {
    const char **names = malloc((count ? count : 1) * sizeof *names);
    if (!names) return shard_error(SHARD_ERR_NO_MEMORY, "checkpoint %s: out of memory for %zu names", dir, count);
    for (size_t i = 0; i < count; i++) names[i] = items[i].name;
    qsort(names, count, sizeof *names, by_name);
    char lacks[320] = "", extra[320] = "";
    size_t n_lacks = 0, n_extra = 0;
    for (size_t i = 0; i < count; i++)
        if (!shard__ckpt_index_find(ix, names[i])) add_name(lacks, sizeof lacks, &n_lacks, names[i]);
    for (size_t t = 0; t < ix->ntensors; t++) {
        const char *name = ix->tensors[ix->by_name ? ix->by_name[t] : t].name;
        if (!bsearch(&name, names, count, sizeof *names, by_name)) add_name(extra, sizeof extra, &n_extra, name);
    }
    free(names);
    if (!n_lacks && !n_extra) return SHARD_OK;
    close_names(lacks, sizeof lacks, n_lacks), close_names(extra, sizeof extra, n_extra);
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "checkpoint %s does not match this run's tensors:%s%s%s%s%s: resume it with the config and "
                       "optimizer it was saved with",
                       dir, n_lacks ? " it lacks " : "", lacks, n_lacks && n_extra ? ";" : "",
                       n_extra ? " it holds tensors this run has not, " : "", extra);
}

static shard_status load(const char *where, const shard_ckpt_item *items, size_t count, uint64_t *step_out,
                         int whole_model) {
    SHARD_CHECK(shard__ckpt_check_items("shard_ckpt_load", items, count));
    if (!where || !*where) return shard_error(SHARD_ERR_INVALID_ARG, "shard_ckpt_load: no checkpoint given");
    shard_comm *world = shard_mesh_comm(items[0].tensor->mesh);
    int rank = shard_comm_rank(world);
    char index_path[PATH_MAX];
    snprintf(index_path, sizeof index_path, "%s/index.json", where);
    /* one step directory, or a root: rank 0's view decides for all (a node may see another file system) */
    int32_t one_step = rank == 0 && access(index_path, F_OK) == 0;
    SHARD_CHECK(shard_comm_broadcast(world, &one_step, 1, SHARD_I32, 0));
    uint64_t *steps = NULL;
    size_t nsteps = 0;
    shard_status s = SHARD_OK;
    if (!one_step && rank == 0) s = shard__ckpt_candidates(where, &steps, &nsteps);
    int32_t ok = s == SHARD_OK;
    SHARD_CHECK(shard_comm_all_reduce(world, &ok, &ok, 1, SHARD_I32, SHARD_OP_MIN));
    if (!ok) {
        free(steps);
        return rank == 0 ? s : shard_error(SHARD_ERR_ABORTED, "checkpoint %s: rank 0 could not list it", where);
    }
    char dir[PATH_MAX], why[REASON_BYTES] = "", tried[1024] = "";
    shard__ckpt_index ix;
    for (size_t i = 0;; i++) {
        memset(dir, 0, sizeof dir);
        if (one_step) {
            if (i == 0) snprintf(dir, sizeof dir, "%s", where);
        } else if (rank == 0 && i < nsteps) {
            shard__ckpt_step_dir(where, steps[i], dir, sizeof dir);
        }
        if (!one_step && (s = shard_comm_broadcast(world, dir, sizeof dir, SHARD_U8, 0)) < 0) {
            free(steps);
            return s;
        }
        dir[sizeof dir - 1] = '\0';
        if (!dir[0]) {
            free(steps);
            if (one_step) return shard_error(SHARD_ERR_IO, "%s", why);
            return shard_error(SHARD_ERR_IO, "no complete checkpoint under %s%s%s", where, tried[0] ? ": " : "", tried);
        }
        s = check_step(world, dir, &ix, why);
        if (s == SHARD_OK) break;
        if (s != SHARD_ERR_IO) {
            free(steps);
            return s;
        }
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "%s%s (%s)", used ? "; " : "", dir, why);
        if (rank == 0 && !one_step)
            fprintf(stderr, "shard: checkpoint %s is not usable (%s); trying the previous one\n", dir, why);
    }
    free(steps);
    s = whole_model ? match_model(dir, &ix, items, count) : SHARD_OK;
    if (s == SHARD_OK) s = load_all(dir, &ix, items, count);
    /* every rank returns the first failing rank's error (a value not finite is found by the rank holding it) */
    int32_t first_bad = s == SHARD_OK ? INT32_MAX : rank, verdict = s;
    char message[REASON_BYTES] = "";
    if (s < 0) snprintf(message, sizeof message, "%s", shard_last_error());
    shard_status cs = shard_comm_all_reduce(world, &first_bad, &first_bad, 1, SHARD_I32, SHARD_OP_MIN);
    if (cs == SHARD_OK && first_bad != INT32_MAX) cs = shard_comm_broadcast(world, &verdict, 1, SHARD_I32, first_bad);
    if (cs == SHARD_OK && first_bad != INT32_MAX)
        cs = shard_comm_broadcast(world, message, sizeof message, SHARD_U8, first_bad);
    message[sizeof message - 1] = '\0';
    if (s == SHARD_OK && cs < 0) s = cs;
    if (s == SHARD_OK && first_bad != INT32_MAX) s = shard_error((shard_status)verdict, "%s", message);
    if (s == SHARD_OK && step_out) *step_out = ix.step;
    if (s == SHARD_OK && rank == 0) shard__ckpt_index_note(dir, &ix, stderr); /* a failure is its one line alone */
    shard__ckpt_index_free(&ix);
    return s;
}

shard_status shard_ckpt_load(const char *where, const shard_ckpt_item *items, size_t count, uint64_t *step_out) {
    return load(where, items, count, step_out, 0);
}

shard_status shard__ckpt_load_model(const char *where, const shard_ckpt_item *items, size_t count, uint64_t *step_out) {
    return load(where, items, count, step_out, 1);
}
