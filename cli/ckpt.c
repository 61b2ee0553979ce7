/* ckpt.c — checkpoints on the command line, without starting ranks:
 *   shard inspect ckpt DIR|FILE|NAME.index.json [--verify]
 *   shard ckpt export DIR --out model.safetensors [--max-shard-size 5G] [--optimizer]
 * inspect prints a safetensors file's tensors and metadata, or a checkpoint's
 * step, mesh, files and tensors (dtype, global shape, spec, chunks);
 * --verify also checks every file's size and xxh3 and that each chunk is in
 * its file.  export writes the full tensors as one safetensors file, or past
 * --max-shard-size as Hugging Face's sharded layout (model-00001-of-0000N
 * files and model.safetensors.index.json), one tensor in memory at a time. */
#define _GNU_SOURCE /* realpath */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_comm.h"
#include "ckpt/atomic_file.h"
#include "ckpt/ckpt_index.h"
#include "ckpt/ckpt_util.h"
#include "ckpt/hf_index.h"
#include "cli_util.h"
#include "mesh/box.h"
#include "shard/safetensors.h"

static void shape_text(const size_t *shape, int ndim, char *out, size_t out_bytes) {
    size_t used = (size_t)snprintf(out, out_bytes, "[");
    for (int d = 0; d < ndim && used < out_bytes; d++)
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%zu", d ? "," : "", shape[d]);
    if (used < out_bytes) snprintf(out + used, out_bytes - used, "]");
}

static int inspect_file(const char *path, int verify) {
    shard_safetensors *f = NULL;
    if (shard_safetensors_open(path, &f) < 0) { /* opening checks every rule of the format */
        cli_error("%s", shard_last_error());
        return 1;
    }
    printf("safetensors %s: %zu tensors\n", path, shard_safetensors_count(f));
    for (size_t i = 0; i < shard_safetensors_metadata_count(f); i++) {
        const char *k, *v;
        shard_safetensors_metadata_pair(f, i, &k, &v);
        printf("  metadata %s = %s\n", k, v);
    }
    for (size_t i = 0; i < shard_safetensors_count(f); i++) {
        const shard_st_entry *e = shard_safetensors_entry(f, i);
        char shape[160];
        shape_text(e->shape, e->ndim, shape, sizeof shape);
        printf("  %-40s %-4s %-20s bytes [%llu, %llu)\n", e->name, shard_safetensors_dtype_name(e->dtype), shape,
               (unsigned long long)e->begin, (unsigned long long)e->end);
    }
    if (verify) printf("verified: the header and every tensor's extent follow the format\n");
    shard_safetensors_close(f);
    return 0;
}

/* For --verify of an index: each tensor the index puts in file `file` is in the open file f. */
typedef struct index_check {
    const shard__hf_index *ix;
    size_t file;
    shard_safetensors *f;
    const char *path;
} index_check;

static int holds_its_tensor(void *ctx, const char *name, size_t file) {
    const index_check *c = ctx;
    if (file != c->file || shard_safetensors_find(c->f, name)) return 0;
    cli_error("%s: no tensor '%s', which %s says it holds", c->path, name, c->ix->path);
    return 1;
}

/* Hugging Face's sharded layout (NAME.index.json, read by ckpt/hf_index.c): the index's tensor count and
 * total size, then each file it names as inspect_file prints it; every tensor must be in the file the
 * index gives. */
static int inspect_hf_index(const char *path, int verify) {
    shard__hf_index ix;
    if (shard__hf_index_open(path, &ix) < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    printf("safetensors index %s: %zu tensors in %zu files", path, ix.ntensors, ix.nfiles);
    if (ix.total_size >= 0) printf(", total_size %lld bytes", ix.total_size);
    printf("\n");
    int rc = 0;
    char file[PATH_MAX];
    for (size_t k = 0; !rc && k < ix.nfiles; k++) rc = inspect_file(shard__hf_index_file_path(&ix, k, file, sizeof file), verify);
    for (size_t k = 0; !rc && verify && k < ix.nfiles; k++) { /* each file opened once, for the tensors it should hold */
        index_check c = {&ix, k, NULL, shard__hf_index_file_path(&ix, k, file, sizeof file)};
        if (shard_safetensors_open(file, &c.f) < 0) {
            cli_error("%s", shard_last_error());
            rc = 1;
            break;
        }
        rc = shard__hf_index_each(&ix, holds_its_tensor, &c);
        shard_safetensors_close(c.f);
    }
    if (!rc && verify) printf("verified: every tensor of the index is in the file it names\n");
    shard__hf_index_close(&ix);
    return rc;
}

/* Every chunk is in its file with the listed dtype and sizes. */
static int verify_chunks(const char *dir, const shard__ckpt_index *ix) {
    shard_safetensors **files = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *files);
    int ok = files != NULL;
    for (size_t i = 0; ok && i < ix->nfiles; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, ix->files[i].name);
        if (shard_safetensors_open(path, &files[i]) < 0) {
            cli_error("%s", shard_last_error());
            ok = 0;
        }
    }
    for (size_t t = 0; ok && t < ix->ntensors; t++) {
        const shard__ckpt_tensor *x = &ix->tensors[t];
        for (size_t c = 0; ok && c < x->nchunks; c++) {
            const shard_st_entry *e = shard_safetensors_find(files[x->chunks[c].file], x->name);
            int fits = e && e->dtype == x->dtype && e->ndim == x->ndim;
            for (int d = 0; fits && d < x->ndim; d++) fits = e->shape[d] == x->chunks[c].len[d];
            if (!fits) {
                cli_error("%s: %s does not hold chunk %zu of '%s' as the index lists it", dir,
                          ix->files[x->chunks[c].file].name, c, x->name);
                ok = 0;
            }
        }
    }
    for (size_t i = 0; files && i < ix->nfiles; i++) shard_safetensors_close(files[i]);
    free(files);
    return ok;
}

static int inspect_checkpoint(const char *where, int verify) {
    char dir[PATH_MAX];
    shard__ckpt_index ix;
    if (shard__ckpt_open_index(where, dir, sizeof dir, &ix) < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < ix.nfiles; i++) total += ix.files[i].bytes;
    char size[32];
    cli_format_size(total, size, sizeof size);
    printf("checkpoint %s: step %llu, saved on mesh %s (%d ranks), %zu tensors in %zu files (%s)\n", dir,
           (unsigned long long)ix.step, ix.mesh, ix.world, ix.ntensors, ix.nfiles, size);
    if (ix.config) printf("  config %s\n", ix.config);
    for (size_t i = 0; i < ix.nfiles; i++)
        printf("  file %-28s %12llu bytes  xxh3 %016llx\n", ix.files[i].name, (unsigned long long)ix.files[i].bytes,
               (unsigned long long)ix.files[i].xxh3);
    for (size_t t = 0; t < ix.ntensors; t++) {
        const shard__ckpt_tensor *x = &ix.tensors[t];
        char shape[160];
        shape_text(x->shape, x->ndim, shape, sizeof shape);
        printf("  tensor %-32s %-4s %-16s %-28s %zu chunk%s\n", x->name, shard_safetensors_dtype_name(x->dtype), shape,
               x->spec, x->nchunks, x->nchunks == 1 ? "" : "s");
        for (size_t c = 0; c < x->nchunks; c++) {
            char off[160], len[160];
            shape_text(x->chunks[c].off, x->ndim, off, sizeof off);
            shape_text(x->chunks[c].len, x->ndim, len, sizeof len);
            printf("    chunk %-4zu %-26s offsets %-16s sizes %s\n", c, ix.files[x->chunks[c].file].name, off, len);
        }
    }
    int rc = 0;
    if (verify) {
        char why[512];
        for (size_t i = 0; i < ix.nfiles && rc == 0; i++)
            if (!shard__ckpt_check_file(dir, &ix.files[i], why, sizeof why)) {
                cli_error("%s", why);
                rc = 1;
            }
        if (rc == 0 && !verify_chunks(dir, &ix)) rc = 1;
        if (rc == 0) printf("verified: %zu files match their sizes and xxh3 checksums; every chunk is where the index says\n",
                            ix.nfiles);
    }
    shard__ckpt_index_free(&ix);
    return rc;
}

static const char *const USAGE_INSPECT =
    "usage: shard inspect ckpt DIR|FILE|NAME.index.json [options]\n"
    "\n"
    "A checkpoint (DIR: a root or a step_N directory): its step, mesh, files and every tensor's dtype,\n"
    "shape, spec and chunks; a .safetensors FILE: its tensors and metadata; a sharded export's\n"
    "NAME.index.json: its tensor count and each file it names.\n"
    "\n"
    "options:\n"
    "  --verify                 also check every file's size and xxh3 checksum and that each chunk (or\n"
    "                           tensor) is where the index says (default: not checked)\n";

int cli_inspect_ckpt(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_INSPECT, 0);
    const char *target = NULL;
    int verify = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--verify") == 0) verify = 1;
        else if (argv[i][0] == '-') {
            cli_error("inspect ckpt: unknown option '%s' (give DIR|FILE [--verify])", argv[i]);
            return 2;
        } else if (!target) target = argv[i];
        else {
            cli_error("inspect ckpt: one checkpoint directory or safetensors file, not '%s' too", argv[i]);
            return 2;
        }
    }
    if (!target) {
        cli_error("inspect ckpt: give a checkpoint directory or a .safetensors file");
        return 2;
    }
    size_t n = strlen(target);
    if (n > 12 && strcmp(target + n - 12, ".safetensors") == 0) return inspect_file(target, verify);
    if (shard__hf_index_is(target)) return inspect_hf_index(target, verify);
    struct stat st; /* a file by another name: read as safetensors (the format's own checks say if it is not) */
    if (stat(target, &st) == 0 && S_ISREG(st.st_mode)) return inspect_file(target, verify);
    return inspect_checkpoint(target, verify);
}

/* ---------------------------------------------------------------- export */

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
        if (!fits) return shard_error(SHARD_ERR_IO, "chunk %zu of '%s' is not in its file as the index lists it", c, x->name);
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
static shard_status write_part(const char *path, shard_safetensors **files, const shard__ckpt_index *ix, const size_t *which,
                               size_t n, const char *step_text) {
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
    if (s == SHARD_OK && !buffer) s = shard_error(SHARD_ERR_NO_MEMORY, "export: out of memory for %llu bytes",
                                                  (unsigned long long)biggest);
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
static void part_name(char *out, size_t bytes, const char *dir, const char *base, size_t p, int parts, const char *suffix) {
    snprintf(out, bytes, "%s%s%s-%05zu-of-%05d.safetensors%s", dir ? dir : "", dir ? "/" : "", base, p + 1, parts, suffix);
}

/* Hugging Face's index of a sharded export (jansson writes the names, escaped as JSON needs). */
static shard_status write_hf_index(const char *path, const shard__ckpt_index *ix, const size_t *which, size_t n,
                                   const size_t *part_of, int parts, const char *base, uint64_t total) {
    json_t *root = json_object(), *map = json_object();
    int ok = root && map && json_object_set_new(root, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total)) == 0;
    for (size_t k = 0; ok && k < n; k++) {
        char file[PATH_MAX];
        part_name(file, sizeof file, NULL, base, part_of[k], parts, "");
        ok = json_object_set_new(map, ix->tensors[which[k]].name, json_string(file)) == 0;
    }
    if (ok) ok = json_object_set_new(root, "weight_map", map) == 0;
    else json_decref(map);
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

/* The step to export and its files opened: `where` itself when it is a step directory; for a root,
 * `latest`'s step, or when that one is not usable the newest older one that is (as a load goes), said on
 * stderr.  0 on success, else the first reason printed. */
static int open_export_step(const char *where, char *dir, size_t dir_bytes, shard__ckpt_index *ix,
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
        if (s == SHARD_OK && !files) snprintf(why, sizeof why, "export: out of memory for %zu files", ix->nfiles), s = SHARD_ERR_NO_MEMORY;
        for (size_t i = 0; s == SHARD_OK && i < ix->nfiles; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, ix->files[i].name);
            if (!shard__ckpt_check_file(dir, &ix->files[i], why, sizeof why)) s = SHARD_ERR_IO;
            else if ((s = shard_safetensors_open(path, &files[i])) < 0) snprintf(why, sizeof why, "%s", shard_last_error());
        }
        if (s == SHARD_OK) {
            free(steps);
            *files_out = files;
            return 0;
        }
        close_step(files, ix);
        if (!first[0]) snprintf(first, sizeof first, "%s", why);
        if (c + 1 < nsteps) fprintf(stderr, "shard: checkpoint %s is not usable (%s); trying the previous one\n", dir, why);
    }
    free(steps);
    cli_error("%s", first);
    return 1;
}

static int export_checkpoint(const char *where, const char *out, uint64_t max_shard, int with_optimizer) {
    char dir[PATH_MAX], path[PATH_MAX + 16], out_dir[PATH_MAX];
    struct stat st;
    shard__dir_of(out, out_dir, sizeof out_dir);
    if (stat(out_dir, &st) != 0 || !S_ISDIR(st.st_mode)) { /* said before any work, and not as a temporary name */
        cli_error("ckpt export: --out %s: its directory %s %s", out, out_dir,
                  stat(out_dir, &st) != 0 ? "does not exist (create it first)" : "is not a directory");
        return 1;
    }
    if (stat(out, &st) == 0 && !S_ISREG(st.st_mode)) {
        cli_error("ckpt export: --out %s exists and is not a file; remove it or give another name", out);
        return 1;
    }
    shard__ckpt_index ix;
    memset(&ix, 0, sizeof ix);
    shard_safetensors **files = NULL;
    if (open_export_step(where, dir, sizeof dir, &ix, &files)) return 1;
    if (!ix.ntensors) {
        cli_error("ckpt export: %s holds no tensors: nothing to export", dir);
        close_step(files, &ix);
        return 1;
    }
    char real_out[PATH_MAX], real_step[PATH_MAX]; /* writing into the step it reads would corrupt that checkpoint */
    if (realpath(out_dir, real_out) && realpath(dir, real_step) && strcmp(real_out, real_step) == 0) {
        cli_error("ckpt export: --out %s is inside the checkpoint %s it exports; give a path outside it", out, dir);
        close_step(files, &ix);
        return 1;
    }
    /* the model's tensors; AdamW's moments (optimizer.*) only with --optimizer */
    size_t *which = calloc(ix.ntensors ? ix.ntensors : 1, sizeof *which), n = 0, left_out = 0;
    size_t *part_of = calloc(ix.ntensors ? ix.ntensors : 1, sizeof *part_of);
    int rc = which && part_of ? 0 : 1;
    if (rc) cli_error("export: out of memory for %zu tensors", ix.ntensors);
    for (size_t t = 0; rc == 0 && t < ix.ntensors; t++) {
        if (!with_optimizer && strncmp(ix.tensors[t].name, "optimizer.", 10) == 0) left_out++;
        else which[n++] = t;
    }
    /* parts: tensors in index order, a new part when the next would pass the limit */
    int parts = 1;
    uint64_t in_part = 0, total = 0;
    for (size_t k = 0; rc == 0 && k < n; k++) {
        uint64_t b = tensor_bytes(&ix.tensors[which[k]]);
        if (in_part && in_part + b > max_shard) parts++, in_part = 0;
        part_of[k] = (size_t)(parts - 1), in_part += b, total += b;
    }
    char step_text[32], note[160] = "";
    snprintf(step_text, sizeof step_text, "%llu", (unsigned long long)ix.step);
    if (left_out)
        snprintf(note, sizeof note, "; the optimizer's %zu tensors left out (--optimizer keeps them)", left_out);
    if (rc == 0 && parts == 1) {
        if (write_part(out, files, &ix, which, n, step_text) < 0) cli_error("%s", shard_last_error()), rc = 1;
        else printf("exported %zu tensors (%llu bytes) of %s to %s%s\n", n, (unsigned long long)total, dir, out, note);
    } else if (rc == 0) {
        char base[PATH_MAX];
        const char *name = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
        snprintf(base, sizeof base, "%s", name);
        char *dot = strstr(base, ".safetensors");
        if (dot) *dot = '\0';
        /* every part under a temporary name first: a failure leaves an earlier export as it was */
        size_t first = 0;
        int written = 0;
        char final[PATH_MAX + 64];
        for (int p = 0; rc == 0 && p < parts; p++) {
            size_t last = first;
            while (last < n && part_of[last] == (size_t)p) last++;
            part_name(path, sizeof path, out_dir, base, (size_t)p, parts, ".partial");
            if (write_part(path, files, &ix, which + first, last - first, step_text) < 0)
                cli_error("%s", shard_last_error()), rc = 1;
            else written++;
            first = last;
        }
        for (int p = 0; rc == 0 && p < parts; p++) { /* each final name free for a file, before any is replaced */
            part_name(final, sizeof final, out_dir, base, (size_t)p, parts, "");
            if (stat(final, &st) == 0 && !S_ISREG(st.st_mode)) {
                cli_error("export: %s exists and is not a file; remove it or give another --out", final);
                rc = 1;
            }
        }
        int renamed = 0;
        for (int p = 0; rc == 0 && p < parts; p++, renamed++) {
            part_name(path, sizeof path, out_dir, base, (size_t)p, parts, ".partial");
            part_name(final, sizeof final, out_dir, base, (size_t)p, parts, "");
            if (rename(path, final) != 0) {
                cli_error("export: cannot rename %s to %s: %s", path, final, strerror(errno));
                rc = 1;
                break;
            }
        }
        for (int p = 0; rc != 0 && p < written; p++) { /* what a failed export wrote */
            part_name(path, sizeof path, out_dir, base, (size_t)p, parts, p < renamed ? "" : ".partial");
            unlink(path);
        }
        snprintf(path, sizeof path, "%s/%s.safetensors.index.json", out_dir, base);
        if (rc == 0 && write_hf_index(path, &ix, which, n, part_of, parts, base, total) < 0)
            cli_error("%s", shard_last_error()), rc = 1;
        /* a single file of an earlier export would shadow the index (transformers reads it first) */
        int stale = rc == 0 && stat(out, &st) == 0 && S_ISREG(st.st_mode) && unlink(out) == 0;
        if (rc == 0)
            printf("exported %zu tensors (%llu bytes) of %s as %d files %s/%s-0000k-of-%05d.safetensors and %s%s%s%s\n",
                   n, (unsigned long long)total, dir, parts, out_dir, base, parts, path,
                   stale ? "; removed the earlier single file " : "", stale ? out : "", note);
    }
    free(part_of), free(which);
    close_step(files, &ix);
    return rc;
}

static const char *const USAGE_CKPT =
    "usage: shard ckpt SUB-VERB [options]\n"
    "\n"
    "sub-verbs (shard help ckpt SUB-VERB: its options):\n"
    "  export        a checkpoint's model tensors, full, as one safetensors file or Hugging Face's\n"
    "                sharded layout\n"
    "\n"
    "options:\n";

static const char *const USAGE_EXPORT =
    "usage: shard ckpt export DIR --out NAME.safetensors [options]\n"
    "\n"
    "A checkpoint's model tensors, assembled whole from their chunks, one tensor in memory at a time:\n"
    "one safetensors file, or past --max-shard-size Hugging Face's sharded layout\n"
    "(NAME-0000k-of-0000N.safetensors and NAME.safetensors.index.json beside --out).  DIR: a step_N\n"
    "directory, or a root (its latest usable step).\n"
    "\n"
    "options:\n"
    "  --out FILE               the file to write, a name ending in .safetensors (required)\n"
    "  --max-shard-size SIZE    the most bytes in one file before the export is split, > 0 (default 5G)\n"
    "  --optimizer              AdamW's moments (optimizer.*) too (default: the model's tensors alone)\n";

int cli_ckpt(int argc, char **argv) {
    if (argc >= 2 && cli_is_help(argv[1])) return cli_usage(USAGE_CKPT, 0);
    if (argc >= 2 && strcmp(argv[1], "export") != 0) {
        cli_error("ckpt: unknown '%s': give export: 'shard ckpt export DIR --out model.safetensors'", argv[1]);
        return 2;
    }
    if (argc < 2) {
        cli_error("ckpt: give what to do: 'shard ckpt export DIR --out model.safetensors [--max-shard-size 5G]'");
        return 2;
    }
    if (cli_help_asked(argc, argv, 2)) return cli_usage(USAGE_EXPORT, 0);
    const char *dir = NULL, *out = NULL;
    uint64_t max_shard = 5ULL << 30;
    int with_optimizer = 0;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--optimizer") == 0) {
            with_optimizer = 1;
        } else if (strcmp(argv[i], "--out") == 0) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(argv[i], "--max-shard-size") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_size("--max-shard-size", v, &max_shard)) return 2;
            if (max_shard == 0) {
                cli_error("--max-shard-size '%s' is invalid: give a size > 0, e.g. 5G", v);
                return 2;
            }
        } else if (argv[i][0] == '-') {
            cli_error("ckpt export: unknown option '%s' (see 'shard help')", argv[i]);
            return 2;
        } else if (!dir) {
            dir = argv[i];
        } else {
            cli_error("ckpt export: one checkpoint directory, not '%s' too", argv[i]);
            return 2;
        }
    }
    size_t n = out ? strlen(out) : 0;
    if (dir && out && (n <= 12 || strcmp(out + n - 12, ".safetensors") != 0)) {
        cli_error("ckpt export: --out '%s' is invalid: give a file name ending in .safetensors, e.g. model.safetensors", out);
        return 2;
    }
    if (!dir || !out) {
        cli_error("ckpt export: give a checkpoint directory and --out NAME.safetensors");
        return 2;
    }
    return export_checkpoint(dir, out, max_shard, with_optimizer);
}
