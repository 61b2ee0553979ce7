/* ckpt_util.c — see ckpt_util.h. */
#define _GNU_SOURCE
#include "ckpt_util.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/file_read.h"
#include "shard/files.h"

void shard__ckpt_rank_file(const char *dir, int rank, char *out, size_t out_bytes) {
    if (dir)
        snprintf(out, out_bytes, "%s/rank_%05d.safetensors", dir, rank);
    else
        snprintf(out, out_bytes, "rank_%05d.safetensors", rank);
}

void shard__ckpt_step_dir(const char *dir, uint64_t step, char *out, size_t out_bytes) {
    snprintf(out, out_bytes, "%s/step_%llu", dir, (unsigned long long)step);
}

void shard__ckpt_my_coords(const shard_mesh *mesh, int *coords) {
    for (int k = 0; k < shard_mesh_ndim(mesh); k++) coords[k] = shard_mesh_coord(mesh, k);
}

int shard__ckpt_writes_chunk(const shard_dtensor *t, const int *coords) {
    unsigned split = shard_spec_split_axes(&t->spec);
    for (int k = 0; k < t->layout.ndim; k++)
        if (!(split & (1u << k)) && coords[k] != 0) return 0;
    return 1;
}

shard_status shard__ckpt_mkdirs(const char *dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: path too long", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return shard_error(SHARD_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return shard_error(SHARD_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return shard_error(SHARD_ERR_IO, "%s exists and is not a directory: give a directory's path", path);
    return SHARD_OK;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

shard_status shard__ckpt_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return SHARD_OK;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return shard_error(SHARD_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return SHARD_OK;
}

static int by_item_name(const void *a, const void *b) {
    return strcmp((*(const shard_ckpt_item *const *)a)->name, (*(const shard_ckpt_item *const *)b)->name);
}

shard_status shard__ckpt_check_items(const char *what, const shard_ckpt_item *items, size_t count) {
    if (!items || count == 0) return shard_error(SHARD_ERR_INVALID_ARG, "%s: no tensors given", what);
    for (size_t i = 0; i < count; i++) {
        if (!items[i].tensor || !items[i].name || !*items[i].name)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: item %zu has no tensor or no name", what, i);
        if (items[i].tensor->mesh != items[0].tensor->mesh)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: '%s' is on another mesh than '%s'; save one mesh at a time",
                               what, items[i].name, items[0].name);
    }
    /* duplicate names meet as neighbours once sorted: a model may have tens of thousands of tensors */
    const shard_ckpt_item **sorted = malloc(count * sizeof *sorted);
    if (!sorted) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory for %zu names", what, count);
    for (size_t i = 0; i < count; i++) sorted[i] = &items[i];
    qsort(sorted, count, sizeof *sorted, by_item_name);
    shard_status s = SHARD_OK;
    for (size_t i = 1; s == SHARD_OK && i < count; i++)
        if (strcmp(sorted[i]->name, sorted[i - 1]->name) == 0)
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s: the name '%s' is given twice", what, sorted[i]->name);
    free(sorted);
    return s;
}

/* By bits: an exponent of all ones is NaN or infinite in every float format here (one loop per width,
 * which the compiler vectorises: a load checks every value it reads). */
#define FIRST_ALL_ONES(type, mask)                                                                                     \
    for (size_t i = 0; i < n; i++)                                                                                     \
        if ((((const type *)data)[i] & (mask)) == (mask)) return i;

size_t shard__ckpt_first_nonfinite(const void *data, shard_dtype dtype, size_t n) {
    switch (dtype) {
    case SHARD_F32: FIRST_ALL_ONES(uint32_t, 0x7f800000u) break;
    case SHARD_F64: FIRST_ALL_ONES(uint64_t, 0x7ff0000000000000ull) break;
    case SHARD_BF16: FIRST_ALL_ONES(uint16_t, 0x7f80u) break;
    case SHARD_F16: FIRST_ALL_ONES(uint16_t, 0x7c00u) break;
    default: break;
    }
    return SIZE_MAX;
}

void shard__ckpt_nonfinite_text(const char *name, const void *data, shard_dtype dtype, size_t k, int ndim,
                                const size_t *off, const size_t *len, char *out, size_t out_bytes) {
    double v = dtype == SHARD_F32 ? ((const float *)data)[k]
        : dtype == SHARD_F64      ? ((const double *)data)[k]
        : dtype == SHARD_BF16     ? shard_f32_from_bf16(((const uint16_t *)data)[k])
                                  : shard_f32_from_f16(((const uint16_t *)data)[k]);
    size_t at[SHARD_MAX_DIMS] = {0}, rest = k;
    for (int d = ndim - 1; d >= 0; d--) { /* row-major within the block, then to the tensor's coordinates */
        at[d] = off[d] + (len[d] ? rest % len[d] : 0);
        rest = len[d] ? rest / len[d] : 0;
    }
    const char *kind = isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf";
    size_t used = (size_t)snprintf(out, out_bytes, "tensor '%s' holds %s at [", name, kind);
    for (int d = 0; d < ndim && used < out_bytes; d++)
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%zu", d ? ", " : "", at[d]);
    if (used < out_bytes) snprintf(out + used, out_bytes - used, "]");
}

/* One pass over the index's chunks (each looked up in its file), then a count per file: a file holding
 * more tensors than the index lists in it holds one the index left out, found by name. */
int shard__ckpt_check_listings(const char *dir, const shard__ckpt_index *ix, shard_safetensors *const *files, char *why,
                               size_t why_bytes) {
    size_t *listed = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *listed);
    if (!listed) {
        snprintf(why, why_bytes, "%s: out of memory for %zu files", dir, ix->nfiles);
        return 0;
    }
    int ok = 1;
    for (size_t t = 0; ok && t < ix->ntensors; t++) {
        const shard__ckpt_tensor *x = &ix->tensors[t];
        for (size_t c = 0; ok && c < x->nchunks; c++) {
            shard_safetensors *f = files[x->chunks[c].file];
            if (!f) continue;
            const shard_st_entry *e = shard_safetensors_find(f, x->name);
            ok = e && e->dtype == x->dtype && e->ndim == x->ndim;
            for (int d = 0; ok && d < x->ndim; d++) ok = e->shape[d] == x->chunks[c].len[d];
            listed[x->chunks[c].file]++;
            if (!ok)
                snprintf(why, why_bytes, "%s: %s does not hold chunk %zu of '%s' as the index lists it", dir,
                         ix->files[x->chunks[c].file].name, c, x->name);
        }
    }
    for (size_t i = 0; ok && i < ix->nfiles; i++) {
        size_t held = files[i] ? shard_safetensors_count(files[i]) : 0;
        if (!files[i] || held == listed[i]) continue;
        ok = 0;
        snprintf(why, why_bytes, "%s: %s holds %zu tensors, and the index lists %zu chunks in it", dir,
                 ix->files[i].name, held, listed[i]);
        for (size_t k = 0; k < held; k++) { /* name the one the index left out */
            const char *name = shard_safetensors_entry(files[i], k)->name;
            const shard__ckpt_tensor *x = shard__ckpt_index_find(ix, name);
            int there = 0;
            for (size_t c = 0; x && !there && c < x->nchunks; c++) there = x->chunks[c].file == (int)i;
            if (there) continue;
            snprintf(why, why_bytes,
                     "%s: %s holds tensor '%s', which the index does not list %s: an index lists every tensor "
                     "its files hold (was its entry removed?)",
                     dir, ix->files[i].name, name, x ? "in that file" : "at all");
            break;
        }
    }
    free(listed);
    return ok;
}

/* Size and xxh3 of one file against the index. */
int shard__ckpt_check_file(const char *dir, const shard__ckpt_file *f, char *why, size_t why_bytes) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, f->name);
    int fd = -1;
    uint64_t size = 0;
    if (shard_file_open(path, "cannot open", 0, &fd, &size) < 0) {
        snprintf(why, why_bytes, "%s", shard_last_error());
        return 0;
    }
    int ok = size == f->bytes;
    if (!ok)
        snprintf(why, why_bytes, "%s: %llu bytes, the index says %llu", path, (unsigned long long)size,
                 (unsigned long long)f->bytes);
    if (ok && f->bytes) {
        void *map = mmap(NULL, f->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        ok = map != MAP_FAILED;
        if (ok) {
            madvise(map, f->bytes, MADV_SEQUENTIAL);
            uint64_t h = XXH3_64bits(map, f->bytes);
            munmap(map, f->bytes);
            ok = h == f->xxh3;
            if (!ok)
                snprintf(why, why_bytes, "%s: checksum %016llx, the index says %016llx", path, (unsigned long long)h,
                         (unsigned long long)f->xxh3);
        } else {
            snprintf(why, why_bytes, "%s: cannot map: %s", path, strerror(errno));
        }
    }
    close(fd);
    return ok;
}

/* root/latest's first line ("step_N") into text; the error names the file when it cannot be read. */
static shard_status read_latest_line(const char *path, char *text, size_t text_bytes) {
    char *bytes = NULL;
    text[0] = '\0';
    SHARD_CHECK(shard_file_read(path, "cannot read", SHARD__LATEST_MAX_BYTES, &bytes, NULL));
    snprintf(text, text_bytes, "%.*s", (int)strcspn(bytes, "\r\n"), bytes);
    free(bytes);
    return SHARD_OK;
}

shard_status shard__ckpt_resolve(const char *where, char *out, size_t out_bytes) {
    char path[PATH_MAX], text[64] = "";
    snprintf(path, sizeof path, "%s/index.json", where);
    if (access(path, F_OK) == 0) {
        snprintf(out, out_bytes, "%s", where);
        return SHARD_OK;
    }
    snprintf(path, sizeof path, "%s/latest", where);
    if (access(path, F_OK) != 0) {
        int missing = errno;
        uint64_t *steps = NULL;
        size_t n = 0; /* a root whose first save stopped before it wrote `latest`: its newest step, as a load goes */
        if (shard__ckpt_candidates(where, &steps, &n) == SHARD_OK && n) {
            snprintf(out, out_bytes, "%s/step_%llu", where, (unsigned long long)steps[0]);
            free(steps);
            return SHARD_OK;
        }
        free(steps);
        return shard_error(SHARD_ERR_IO, "%s: not a checkpoint (no index.json) nor a checkpoint root (no latest): %s",
                           where, strerror(missing));
    }
    SHARD_CHECK(read_latest_line(path, text, sizeof text));
    if (strncmp(text, "step_", 5) != 0 || strchr(text, '/'))
        return shard_error(SHARD_ERR_IO, "%s: does not name a step_N directory", path);
    snprintf(out, out_bytes, "%s/%s", where, text);
    return SHARD_OK;
}

shard_status shard__ckpt_open_index(const char *where, char *dir, size_t dir_bytes, shard__ckpt_index *ix) {
    char path[PATH_MAX + 16];
    SHARD_CHECK(shard__ckpt_resolve(where, dir, dir_bytes));
    snprintf(path, sizeof path, "%s/index.json", dir);
    return shard__ckpt_index_read(path, ix);
}

int shard__ckpt_parse_step_name(const char *name, uint64_t *step) {
    if (strncmp(name, "step_", 5) != 0 || name[5] < '0' || name[5] > '9') return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(name + 5, &end, 10);
    if (errno || *end) return 0;
    *step = v;
    return 1;
}

int shard__ckpt_read_latest(const char *root, uint64_t *step) {
    char path[PATH_MAX], text[64] = "";
    snprintf(path, sizeof path, "%s/latest", root);
    return access(path, F_OK) == 0 && read_latest_line(path, text, sizeof text) == SHARD_OK &&
        shard__ckpt_parse_step_name(text, step);
}

int shard__ckpt_step_committed(const char *root, uint64_t step) {
    char dir[PATH_MAX];
    shard__ckpt_step_dir(root, step, dir, sizeof dir);
    if (access(dir, F_OK) != 0) return 0;
    uint64_t latest = 0;
    return !shard__ckpt_read_latest(root, &latest) || latest >= step;
}

shard_status shard__ckpt_move_aside(const char *path, char *moved_to, size_t moved_to_bytes) {
    long long now = (long long)time(NULL);
    for (int k = 0; k < 100; k++) {
        int n = k ? snprintf(moved_to, moved_to_bytes, "%s.replaced-%lld-%d", path, now, k)
                  : snprintf(moved_to, moved_to_bytes, "%s.replaced-%lld", path, now);
        if (n < 0 || (size_t)n >= moved_to_bytes) return shard_error(SHARD_ERR_INVALID_ARG, "%s: path too long", path);
        if (access(moved_to, F_OK) == 0) continue;
        if (rename(path, moved_to) != 0)
            return shard_error(SHARD_ERR_IO, "checkpoint: cannot move %s aside to %s: %s", path, moved_to,
                               strerror(errno));
        return SHARD_OK;
    }
    return shard_error(SHARD_ERR_IO, "checkpoint: cannot move %s aside: every name %s.replaced-%lld[-k] is taken", path,
                       path, now);
}
