/* ckpt_export.c — shard_ckpt_export (shard/checkpoint.h): a sharded checkpoint's full tensors as one
 * safetensors file, or past a size limit as Hugging Face's sharded layout (model-00001-of-0000N files and
 * model.safetensors.index.json), one tensor in memory at a time, each assembled from its chunks.  Every
 * part is written under a temporary name first, so a failed export leaves an earlier one as it was. */
#define _GNU_SOURCE /* realpath */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic_file.h"
#include "ckpt_index.h"
#include "ckpt_util.h"
#include "mesh/box.h"
#include "shard/files.h"
#include "shard/safetensors.h"

/* The full tensor x assembled from its chunks into `full` (contiguous). */
static shard_status assemble(shard_safetensors **files, const shard__ckpt_tensor *x, void *full) {
    shard__box whole = {{0}, {0}}, chunk;
    for (int d = 0; d < x->ndim; d++) whole.len[d] = x->shape[d];
    shard_tensor dst = shard__contiguous_over(full, x->dtype, x->ndim, &whole);
    for (size_t c = 0; c < x->nchunks; c++) {
        const shard_st_entry *e = shard_safetensors_find(files[x->chunks[c].file], x->name);
        memcpy(chunk.off, x->chunks[c].off, sizeof chunk.off);
        memcpy(chunk.len, x->chunks[c].len, sizeof chunk.len);
        int fits = e && e->dtype == x->dtype && e->ndim == x->ndim;
        for (int d = 0; fits && d < x->ndim; d++) fits = e->shape[d] == chunk.len[d];
        if (!fits)
            return shard_error(SHARD_ERR_IO, "chunk %zu of '%s' is not in its file as the index lists it", c, x->name);
        shard_tensor src = shard__contiguous_over((void *)shard_safetensors_data(files[x->chunks[c].file], e), x->dtype,
                                                  x->ndim, &chunk);
        shard_tensor to = shard__sub_view(&dst, &whole, &chunk);
        SHARD_CHECK(shard_tensor_copy(&to, &src));
    }
    return SHARD_OK;
}

static uint64_t tensor_bytes(const shard__ckpt_tensor *x) {
    uint64_t b = shard_dtype_size(x->dtype);
    for (int d = 0; d < x->ndim; d++) b *= x->shape[d];
    return b;
}

/* Write the n tensors of ix listed in which[] into one safetensors file. */
static shard_status write_part(const char *path, shard_safetensors **files, const shard__ckpt_index *ix,
                               const size_t *which, size_t n, const char *step_text) {
    shard_st_entry *entries = calloc(n ? n : 1, sizeof *entries);
    if (!entries) return shard_error(SHARD_ERR_NO_MEMORY, "export: out of memory");
    uint64_t biggest = 1;
    for (size_t k = 0; k < n; k++) {
        const shard__ckpt_tensor *x = &ix->tensors[which[k]];
        shard_st_entry *e = &entries[k];
        e->name = x->name, e->dtype = x->dtype, e->ndim = x->ndim;
        memcpy(e->shape, x->shape, sizeof e->shape);
        if (tensor_bytes(x) > biggest) biggest = tensor_bytes(x);
    }
    const char *keys[2] = {"format", "step"}, *values[2] = {"pt", step_text};
    shard_st_writer *w = NULL;
    shard_status s = shard_st_writer_open(path, entries, n, keys, values, 2, &w);
    free(entries);
    void *buffer = s == SHARD_OK ? malloc(biggest) : NULL; /* one tensor at a time */
    if (s == SHARD_OK && !buffer)
        s = shard_error(SHARD_ERR_NO_MEMORY, "export: out of memory for %llu bytes", (unsigned long long)biggest);
    for (size_t k = 0; s == SHARD_OK && k < n; k++) {
        s = assemble(files, &ix->tensors[which[k]], buffer);
        if (s == SHARD_OK) s = shard_st_writer_write(w, buffer, tensor_bytes(&ix->tensors[which[k]]));
    }
    free(buffer);
    if (s < 0) {
        if (w) shard_st_writer_abort(w);
        return s;
    }
    return shard_st_writer_commit(w);
}

/* Part p (0-based) of a sharded export, Hugging Face's name ("model-00001-of-00004.safetensors"), in dir
 * (NULL: the bare name), with a suffix (".partial" while it is written, or ""). */
static void part_name(char *out, size_t bytes, const char *dir, const char *base, size_t p, int parts,
                      const char *suffix) {
    snprintf(out, bytes, "%s%s%s-%05zu-of-%05d.safetensors%s", dir ? dir : "", dir ? "/" : "", base, p + 1, parts,
             suffix);
}

/* Hugging Face's index of a sharded export (jansson writes the names, escaped as JSON needs). */
static shard_status write_hf_index(const char *path, const shard__ckpt_index *ix, const size_t *which, size_t n,
                                   const size_t *part_of, int parts, const char *base, uint64_t total) {
    json_t *root = json_object(), *map = json_object();
    int ok =
        root && map && json_object_set_new(root, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total)) == 0;
    for (size_t k = 0; ok && k < n; k++) {
        char file[PATH_MAX];
        part_name(file, sizeof file, NULL, base, part_of[k], parts, "");
        ok = json_object_set_new(map, ix->tensors[which[k]].name, json_string(file)) == 0;
    }
    if (ok)
        ok = json_object_set_new(root, "weight_map", map) == 0;
    else
        json_decref(map);
    char *text = ok ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) return shard_error(SHARD_ERR_NO_MEMORY, "export: out of memory for %s", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* over the terminating NUL */
    shard_status s = shard__atomic_write_file(path, text, len + 1);
    free(text);
    return s;
}

/* What open_export_step opens, closed and freed (the index left empty). */
static void close_step(shard_safetensors **files, shard__ckpt_index *ix) {
    for (size_t i = 0; files && i < ix->nfiles; i++) shard_safetensors_close(files[i]);
    free(files);
    shard__ckpt_index_free(ix);
}

/* The step to export and its files opened, each holding exactly the tensors the index lists in it (an
 * index with an entry removed would export an incomplete model): `where` itself when it is a step
 * directory; for a root,
 * `latest`'s step, or when that one is not usable the newest older one that is (as a load goes), said on
 * stderr.  On failure the first reason is the error. */
static shard_status open_export_step(const char *where, char *dir, size_t dir_bytes, shard__ckpt_index *ix,
                                     shard_safetensors ***files_out) {
    char path[PATH_MAX + 16], why[512], first[1024] = "";
    snprintf(path, sizeof path, "%s/index.json", where);
    int root = access(path, F_OK) != 0;
    uint64_t *steps = NULL;
    size_t nsteps = 1;
    if (root && (shard__ckpt_candidates(where, &steps, &nsteps) < 0 || !nsteps)) /* the resolve says why */
        free(steps), nsteps = 1, steps = NULL;
    for (size_t c = 0; c < nsteps; c++) {
        shard_status s;
        if (steps) {
            shard__ckpt_step_dir(where, steps[c], dir, dir_bytes);
            snprintf(path, sizeof path, "%s/index.json", dir);
            s = shard__ckpt_index_read(path, ix);
        } else {
            s = shard__ckpt_open_index(where, dir, dir_bytes, ix);
        }
        if (s < 0) snprintf(why, sizeof why, "%s", shard_last_error());
        shard_safetensors **files = s == SHARD_OK ? calloc(ix->nfiles ? ix->nfiles : 1, sizeof *files) : NULL;
        if (s == SHARD_OK && !files)
            snprintf(why, sizeof why, "export: out of memory for %zu files", ix->nfiles), s = SHARD_ERR_NO_MEMORY;
        for (size_t i = 0; s == SHARD_OK && i < ix->nfiles; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, ix->files[i].name);
            if (!shard__ckpt_check_file(dir, &ix->files[i], why, sizeof why))
                s = SHARD_ERR_IO;
            else if ((s = shard_safetensors_open(path, &files[i])) < 0)
                snprintf(why, sizeof why, "%s", shard_last_error());
        }
        if (s == SHARD_OK && !shard__ckpt_check_listings(dir, ix, files, why, sizeof why)) s = SHARD_ERR_IO;
        if (s == SHARD_OK) {
            free(steps);
            *files_out = files;
            return SHARD_OK;
        }
        close_step(files, ix);
        if (!first[0]) snprintf(first, sizeof first, "%s", why);
        if (c + 1 < nsteps)
            fprintf(stderr, "shard: checkpoint %s is not usable (%s); trying the previous one\n", dir, why);
    }
    free(steps);
    return shard_error(SHARD_ERR_IO, "%s", first);
}

/* Hugging Face's sharded layout: the parts under temporary names, renamed once all are written, then the
 * index; an earlier single file at `out` removed (transformers would read it before the index). */
static shard_status write_sharded(const char *out, const char *out_dir, shard_safetensors **files,
                                  const shard__ckpt_index *ix, const size_t *which, size_t n, const size_t *part_of,
                                  int parts, uint64_t total, const char *step_text, shard_ckpt_export_result *r) {
    char base[PATH_MAX], path[PATH_MAX + 64], final[PATH_MAX + 64];
    const char *name = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
    snprintf(base, sizeof base, "%s", name);
    char *dot = strstr(base, ".safetensors");
    if (dot) *dot = '\0';
    struct stat st;
    shard_status s = SHARD_OK;
    size_t first = 0;
    int written = 0;
    for (int p = 0; s == SHARD_OK && p < parts; p++) {
        size_t last = first;
        while (last < n && part_of[last] == (size_t)p) last++;
        part_name(path, sizeof path, out_dir, base, (size_t)p, parts, ".partial");
        if ((s = write_part(path, files, ix, which + first, last - first, step_text)) == SHARD_OK) written++;
        first = last;
    }
    for (int p = 0; s == SHARD_OK && p < parts; p++) { /* each final name free for a file, before any is replaced */
        part_name(final, sizeof final, out_dir, base, (size_t)p, parts, "");
        if (stat(final, &st) == 0 && !S_ISREG(st.st_mode))
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "export: %s exists and is not a file; remove it or give another --out", final);
    }
    int renamed = 0;
    for (int p = 0; s == SHARD_OK && p < parts; p++, renamed++) {
        part_name(path, sizeof path, out_dir, base, (size_t)p, parts, ".partial");
        part_name(final, sizeof final, out_dir, base, (size_t)p, parts, "");
        if (rename(path, final) != 0) {
            s = shard_error(SHARD_ERR_IO, "export: cannot rename %s to %s: %s", path, final, strerror(errno));
            break;
        }
    }
    for (int p = 0; s != SHARD_OK && p < written; p++) { /* what a failed export wrote */
        part_name(path, sizeof path, out_dir, base, (size_t)p, parts, p < renamed ? "" : ".partial");
        unlink(path);
    }
    snprintf(r->parts_pattern, sizeof r->parts_pattern, "%s/%s-0000k-of-%05d.safetensors", out_dir, base, parts);
    snprintf(r->index_path, sizeof r->index_path, "%s/%s.safetensors.index.json", out_dir, base);
    if (s == SHARD_OK) s = write_hf_index(r->index_path, ix, which, n, part_of, parts, base, total);
    r->removed_single = s == SHARD_OK && stat(out, &st) == 0 && S_ISREG(st.st_mode) && unlink(out) == 0;
    return s;
}

shard_status shard_ckpt_export(const char *where, const char *out, uint64_t max_shard_bytes, int with_optimizer,
                               shard_ckpt_export_result *result) {
    shard_ckpt_export_result unused, *r = result ? result : &unused;
    memset(r, 0, sizeof *r);
    char out_dir[PATH_MAX];
    struct stat st;
    shard__dir_of(out, out_dir, sizeof out_dir);
    if (stat(out_dir, &st) != 0 || !S_ISDIR(st.st_mode)) /* said before any work, and not as a temporary name */
        return shard_error(SHARD_ERR_INVALID_ARG, "ckpt export: --out %s: its directory %s %s", out, out_dir,
                           stat(out_dir, &st) != 0 ? "does not exist (create it first)" : "is not a directory");
    if (stat(out, &st) == 0 && !S_ISREG(st.st_mode))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "ckpt export: --out %s exists and is not a file; remove it or give "
                           "another name",
                           out);
    if (shard_dir_probe_writable(out_dir) < 0) { /* found before the export's reading and writing */
        char why[512];
        snprintf(why, sizeof why, "%s", shard_last_error());
        return shard_error(SHARD_ERR_IO, "ckpt export: --out %s: %s: give a path where files can be written", out, why);
    }
    shard__ckpt_index ix;
    memset(&ix, 0, sizeof ix);
    shard_safetensors **files = NULL;
    SHARD_CHECK(open_export_step(where, r->step_dir, sizeof r->step_dir, &ix, &files));
    const char *dir = r->step_dir;
    shard_status s = SHARD_OK;
    char real_out[PATH_MAX], real_step[PATH_MAX]; /* writing into the step it reads would corrupt that checkpoint */
    if (realpath(out_dir, real_out) && realpath(dir, real_step) && strcmp(real_out, real_step) == 0)
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "ckpt export: --out %s is inside the checkpoint %s it exports; give a "
                        "path outside it",
                        out, dir);
    /* the model's tensors; the optimizer's state arrays (optimizer.*) only with with_optimizer */
    size_t *which = s == SHARD_OK ? calloc(ix.ntensors, sizeof *which) : NULL, n = 0;
    size_t *part_of = which ? calloc(ix.ntensors, sizeof *part_of) : NULL;
    if (s == SHARD_OK && !part_of)
        s = shard_error(SHARD_ERR_NO_MEMORY, "export: out of memory for %zu tensors", ix.ntensors);
    for (size_t t = 0; s == SHARD_OK && t < ix.ntensors; t++) {
        if (!with_optimizer && strncmp(ix.tensors[t].name, "optimizer.", 10) == 0)
            r->left_out++;
        else
            which[n++] = t;
    }
    /* parts: tensors in index order, a new part when the next would pass the limit */
    int parts = 1;
    uint64_t in_part = 0, total = 0;
    for (size_t k = 0; s == SHARD_OK && k < n; k++) {
        uint64_t b = tensor_bytes(&ix.tensors[which[k]]);
        if (in_part && in_part + b > max_shard_bytes) parts++, in_part = 0;
        part_of[k] = (size_t)(parts - 1), in_part += b, total += b;
    }
    char step_text[32];
    snprintf(step_text, sizeof step_text, "%llu", (unsigned long long)ix.step);
    r->tensors = n, r->total_bytes = total, r->parts = parts;
    if (s == SHARD_OK && parts == 1)
        s = write_part(out, files, &ix, which, n, step_text);
    else if (s == SHARD_OK)
        s = write_sharded(out, out_dir, files, &ix, which, n, part_of, parts, total, step_text, r);
    free(part_of), free(which);
    if (s == SHARD_OK) shard__ckpt_index_note(dir, &ix, stderr); /* a failure is said in its one line alone */
    close_step(files, &ix);
    return s;
}
