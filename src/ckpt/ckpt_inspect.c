/* ckpt_inspect.c — the public face of checkpoints read without starting ranks (shard/checkpoint.h,
 * shard/safetensors.h, shard/files.h): a root's steps and stored config, and the listings `shard inspect
 * ckpt` prints of a safetensors file, Hugging Face's sharded index and a sharded checkpoint, with their
 * --verify checks.  Thin over the internals the save and the load use, so the CLI and the engine apply
 * one set of rules. */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_index.h"
#include "ckpt_util.h"
#include "hf_index.h"
#include "shard/files.h"
#include "shard/safetensors.h"

void shard_ckpt_step_dir(const char *root, uint64_t step, char *out, size_t out_bytes) {
    shard__ckpt_step_dir(root, step, out, out_bytes);
}

int shard_ckpt_parse_step_name(const char *name, uint64_t *step) { return shard__ckpt_parse_step_name(name, step); }

int shard_ckpt_latest_step(const char *root, uint64_t *step) { return shard__ckpt_read_latest(root, step); }

int shard_ckpt_step_committed(const char *root, uint64_t step) { return shard__ckpt_step_committed(root, step); }

shard_status shard_mkdirs(const char *dir) { return shard__ckpt_mkdirs(dir); }

shard_status shard_remove_tree(const char *path) { return shard__ckpt_remove_tree(path); }

void shard_size_format(uint64_t bytes, char *out, size_t out_bytes) {
    if (bytes >= (1ULL << 30) && bytes % (1ULL << 30) == 0)
        snprintf(out, out_bytes, "%llu GiB", (unsigned long long)(bytes >> 30));
    else if (bytes >= (1ULL << 20) && bytes % (1ULL << 20) == 0)
        snprintf(out, out_bytes, "%llu MiB", (unsigned long long)(bytes >> 20));
    else if (bytes >= (1ULL << 10) && bytes % (1ULL << 10) == 0)
        snprintf(out, out_bytes, "%llu KiB", (unsigned long long)(bytes >> 10));
    else
        snprintf(out, out_bytes, "%llu B", (unsigned long long)bytes);
}

shard_status shard_ckpt_list_steps(const char *root, uint64_t **steps, size_t *n) {
    *steps = NULL, *n = 0;
    DIR *d = opendir(root);
    if (!d) return SHARD_OK;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t step;
        if (!shard__ckpt_parse_step_name(e->d_name, &step)) continue;
        if (*n == cap) {
            uint64_t *more = realloc(*steps, (cap = cap ? 2 * cap : 16) * sizeof *more);
            if (!more) {
                closedir(d);
                return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory listing its steps", root);
            }
            *steps = more;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    return SHARD_OK;
}

shard_status shard_ckpt_save_check(const char *root, uint64_t first, uint64_t last, uint64_t every, int resumed,
                                   FILE *notes) {
    uint64_t *existing = NULL;
    size_t n_existing = 0;
    shard_status s = shard_ckpt_list_steps(root, &existing, &n_existing); /* the steps a run could overwrite */
    for (size_t k = 0; s == SHARD_OK && k < n_existing; k++) {
        uint64_t step = existing[k];
        if (step < first || step > last || (step != last && (!every || step % every)))
            continue; /* not saved by this run */
        char dir[PATH_MAX];
        shard__ckpt_step_dir(root, step, dir, sizeof dir);
        uint64_t latest = 0;
        if (shard__ckpt_step_committed(root, step))
            s = shard_error(SHARD_ERR_INVALID_ARG, "--save %s: %s exists already; give another directory or remove it",
                            root, dir);
        else if (notes && access(dir, F_OK) == 0 && shard__ckpt_read_latest(root, &latest))
            fprintf(notes,
                    "shard: note: %s is past %s/latest (step_%llu), so no load through the root picks it; "
                    "saving step %llu will move it aside to %s.replaced-<time>\n",
                    dir, root, (unsigned long long)latest, (unsigned long long)step, dir);
    }
    free(existing);
    uint64_t root_latest = 0; /* a fresh run saving below a root's latest would move it back onto its own older step */
    uint64_t first_save = every && every < last ? every : last; /* a fresh run starts at step 1 */
    if (s == SHARD_OK && !resumed && shard__ckpt_read_latest(root, &root_latest) && root_latest > first_save)
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "--save %s holds a run up to step_%llu (its latest), past this run's first "
                        "save at step %llu: saving would move latest back among the other run's steps; give another "
                        "directory, --resume it, or remove it",
                        root, (unsigned long long)root_latest, (unsigned long long)first_save);
    return s;
}

shard_status shard_ckpt_read_config(const char *where, char **json_text) {
    char dir[PATH_MAX], path[PATH_MAX + 16];
    shard__ckpt_index ix;
    *json_text = NULL;
    shard_status s = shard__ckpt_open_index(where, dir, sizeof dir, &ix);
    snprintf(path, sizeof path, "%s/index.json", where);
    if (s < 0 && access(path, F_OK) != 0) { /* a root: past a step whose index is broken, as the load goes */
        char first[512];
        snprintf(first, sizeof first, "%s", shard_last_error());
        uint64_t *steps = NULL;
        size_t n = 0;
        if (shard__ckpt_candidates(where, &steps, &n) == SHARD_OK)
            for (size_t i = 0; s < 0 && i < n; i++) {
                shard__ckpt_step_dir(where, steps[i], dir, sizeof dir);
                snprintf(path, sizeof path, "%s/index.json", dir);
                s = shard__ckpt_index_read(path, &ix);
            }
        free(steps);
        if (s < 0) return shard_error(s, "%s", first);
    }
    if (s < 0) return s;
    s = ix.config ? SHARD_OK : shard_error(SHARD_ERR_INVALID_ARG, "%s: the checkpoint carries no model config", dir);
    *json_text = s == SHARD_OK ? strdup(ix.config) : NULL;
    shard__ckpt_index_free(&ix);
    return s;
}

/* ---------------------------------------------------------------- listings */

static void shape_text(const size_t *shape, int ndim, char *out, size_t out_bytes) {
    size_t used = (size_t)snprintf(out, out_bytes, "[");
    for (int d = 0; d < ndim && used < out_bytes; d++)
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%zu", d ? "," : "", shape[d]);
    if (used < out_bytes) snprintf(out + used, out_bytes - used, "]");
}

shard_status shard_safetensors_describe(const char *path, int verify, FILE *out) {
    shard_safetensors *f = NULL;
    SHARD_CHECK(shard_safetensors_open(path, &f)); /* opening checks every rule of the format */
    fprintf(out, "safetensors %s: %zu tensors\n", path, shard_safetensors_count(f));
    for (size_t i = 0; i < shard_safetensors_metadata_count(f); i++) {
        const char *k, *v;
        shard_safetensors_metadata_pair(f, i, &k, &v);
        fprintf(out, "  metadata %s = %s\n", k, v);
    }
    for (size_t i = 0; i < shard_safetensors_count(f); i++) {
        const shard_st_entry *e = shard_safetensors_entry(f, i);
        char shape[160];
        shape_text(e->shape, e->ndim, shape, sizeof shape);
        fprintf(out, "  %-40s %-4s %-20s bytes [%llu, %llu)\n", e->name, shard_safetensors_dtype_name(e->dtype), shape,
                (unsigned long long)e->begin, (unsigned long long)e->end);
    }
    if (verify) fprintf(out, "verified: the header and every tensor's extent follow the format\n");
    shard_safetensors_close(f);
    return SHARD_OK;
}

int shard_safetensors_is_index(const char *path) { return shard__hf_index_is(path); }

/* For verify of an index: each tensor the index puts in file `file` is in the open file f. */
typedef struct index_check {
    const shard__hf_index *ix;
    size_t file;
    shard_safetensors *f;
    const char *path;
} index_check;

static int holds_its_tensor(void *ctx, const char *name, size_t file) {
    const index_check *c = ctx;
    if (file != c->file || shard_safetensors_find(c->f, name)) return 0;
    shard_error(SHARD_ERR_IO, "%s: no tensor '%s', which %s says it holds", c->path, name, c->ix->path);
    return 1;
}

shard_status shard_safetensors_index_describe(const char *path, int verify, FILE *out) {
    shard__hf_index ix;
    SHARD_CHECK(shard__hf_index_open(path, &ix));
    fprintf(out, "safetensors index %s: %zu tensors in %zu files", path, ix.ntensors, ix.nfiles);
    if (ix.total_size >= 0) fprintf(out, ", total_size %lld bytes", ix.total_size);
    fprintf(out, "\n");
    shard_status s = SHARD_OK;
    char file[PATH_MAX];
    for (size_t k = 0; s == SHARD_OK && k < ix.nfiles; k++)
        s = shard_safetensors_describe(shard__hf_index_file_path(&ix, k, file, sizeof file), verify, out);
    for (size_t k = 0; s == SHARD_OK && verify && k < ix.nfiles; k++) { /* each file opened once, for its tensors */
        index_check c = {&ix, k, NULL, shard__hf_index_file_path(&ix, k, file, sizeof file)};
        if ((s = shard_safetensors_open(file, &c.f)) < 0) break;
        if (shard__hf_index_each(&ix, holds_its_tensor, &c)) s = SHARD_ERR_IO;
        shard_safetensors_close(c.f);
    }
    if (s == SHARD_OK && verify) fprintf(out, "verified: every tensor of the index is in the file it names\n");
    shard__hf_index_close(&ix);
    return s;
}

/* Every file holds exactly the tensors the index lists in it, with the listed dtype and sizes. */
static shard_status verify_chunks(const char *dir, const shard__ckpt_index *ix) {
    shard_safetensors **files = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *files);
    shard_status s = files ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", dir);
    for (size_t i = 0; s == SHARD_OK && i < ix->nfiles; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, ix->files[i].name);
        s = shard_safetensors_open(path, &files[i]);
    }
    char why[512];
    if (s == SHARD_OK && !shard__ckpt_check_listings(dir, ix, files, why, sizeof why))
        s = shard_error(SHARD_ERR_IO, "%s", why);
    for (size_t i = 0; files && i < ix->nfiles; i++) shard_safetensors_close(files[i]);
    free(files);
    return s;
}

shard_status shard_ckpt_describe(const char *where, int verify, FILE *out) {
    char dir[PATH_MAX];
    shard__ckpt_index ix;
    SHARD_CHECK(shard__ckpt_open_index(where, dir, sizeof dir, &ix));
    uint64_t total = 0;
    for (size_t i = 0; i < ix.nfiles; i++) total += ix.files[i].bytes;
    char size[32];
    shard_size_format(total, size, sizeof size);
    fprintf(out, "checkpoint %s: step %llu, saved on mesh %s (%d ranks), %zu tensors in %zu files (%s)\n", dir,
            (unsigned long long)ix.step, ix.mesh, ix.world, ix.ntensors, ix.nfiles, size);
    if (ix.config) fprintf(out, "  config %s\n", ix.config);
    for (size_t i = 0; i < ix.nfiles; i++)
        fprintf(out, "  file %-28s %12llu bytes  xxh3 %016llx\n", ix.files[i].name,
                (unsigned long long)ix.files[i].bytes, (unsigned long long)ix.files[i].xxh3);
    for (size_t t = 0; t < ix.ntensors; t++) {
        const shard__ckpt_tensor *x = &ix.tensors[t];
        char shape[160];
        shape_text(x->shape, x->ndim, shape, sizeof shape);
        fprintf(out, "  tensor %-32s %-4s %-16s %-28s %zu chunk%s\n", x->name, shard_safetensors_dtype_name(x->dtype),
                shape, x->spec, x->nchunks, x->nchunks == 1 ? "" : "s");
        for (size_t c = 0; c < x->nchunks; c++) {
            char off[160], len[160];
            shape_text(x->chunks[c].off, x->ndim, off, sizeof off);
            shape_text(x->chunks[c].len, x->ndim, len, sizeof len);
            fprintf(out, "    chunk %-4zu %-26s offsets %-16s sizes %s\n", c, ix.files[x->chunks[c].file].name, off,
                    len);
        }
    }
    shard_status s = SHARD_OK;
    if (verify) {
        char why[512];
        for (size_t i = 0; i < ix.nfiles && s == SHARD_OK; i++)
            if (!shard__ckpt_check_file(dir, &ix.files[i], why, sizeof why)) s = shard_error(SHARD_ERR_IO, "%s", why);
        if (s == SHARD_OK) s = verify_chunks(dir, &ix);
        if (s == SHARD_OK)
            fprintf(out,
                    "verified: %zu files match their sizes and xxh3 checksums; every chunk is where the index "
                    "says%s\n",
                    ix.nfiles, ix.checksummed ? ", and the index matches its own checksum" : "");
    }
    if (s == SHARD_OK) shard__ckpt_index_note(dir, &ix, stderr); /* a failure is said in its one line alone */
    shard__ckpt_index_free(&ix);
    return s;
}
