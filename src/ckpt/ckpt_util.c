/* ckpt_util.c — see ckpt_util.h. */
#define _GNU_SOURCE
#include "ckpt_util.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
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
    if (access(path, F_OK) != 0)
        return shard_error(SHARD_ERR_IO, "%s: not a checkpoint (no index.json) nor a checkpoint root (no latest): %s",
                           where, strerror(errno));
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
