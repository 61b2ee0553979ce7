/* ckpt_index.c — read and write a checkpoint's index.json (see ckpt_index.h).
 * Reading checks everything later code relies on: known dtypes, at most 8
 * dims, chunks that name a listed file and lie inside the global shape, and
 * the index's own checksum, so that an edited index is refused like a
 * damaged data file.  Every writer of a checkpoint goes through
 * shard__ckpt_index_write, so every index carries that checksum. */
#define _GNU_SOURCE /* qsort_r, memmem */
#include "ckpt_index.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "atomic_file.h"
#include "ckpt_util.h"
#include "core/file_read.h"
#include "shard/files.h"
#include "shard/mesh.h"
#include "shard/safetensors.h"

shard_status shard__ckpt_dtype_parse(const char *text, shard_dtype *out) {
    for (int d = 0; d < SHARD_DTYPE_COUNT; d++)
        if (text && strcmp(text, shard_safetensors_dtype_name((shard_dtype)d)) == 0) {
            *out = (shard_dtype)d;
            return SHARD_OK;
        }
    return SHARD_ERR_INVALID_ARG;
}

/* The index's own checksum: its key, as the writer's dump spells it with its value's opening quote, and
 * the value the checksum is computed with. */
#define SUM_KEY "index_xxh3"
#define SUM_TEXT "\"" SUM_KEY "\": \""
#define SUM_ZEROS "0000000000000000"
enum { SUM_DIGITS = 16 };

/* The 16 digits of the last `"index_xxh3": "` in text (the writer puts the key last, after any config
 * that could hold the same words), or NULL when there is none followed by 16 characters and a quote. */
static char *sum_digits(char *text, size_t len) {
    char *last = NULL;
    size_t key = strlen(SUM_TEXT);
    for (char *at = text; (at = memmem(at, len - (size_t)(at - text), SUM_TEXT, key)); at += key) last = at;
    if (!last || (size_t)(last - text) + key + SUM_DIGITS >= len || last[key + SUM_DIGITS] != '"') return NULL;
    return last + key;
}

static json_t *size_array(const size_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

shard_status shard__ckpt_index_write(const char *path, const shard__ckpt_index *ix) {
    json_t *root = json_object(), *files = json_object(), *tensors = json_object();
    int ok = root && files && tensors;
    json_t *config = NULL, *training = NULL;
    const char *texts[2] = {ix->config, ix->training}, *what[2] = {"config", "training record"};
    json_t **values[2] = {&config, &training};
    for (int i = 0; i < 2; i++) {
        json_error_t err;
        if (!ok || !texts[i] || (*values[i] = json_loads(texts[i], JSON_DECODE_ANY, &err))) continue;
        json_decref(root), json_decref(files), json_decref(tensors), json_decref(config);
        return shard_error(SHARD_ERR_INVALID_ARG, "checkpoint %s is not JSON: %s (line %d, column %d)", what[i],
                           err.text, err.line, err.column);
    }
    for (size_t i = 0; ok && i < ix->nfiles; i++) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, ix->files[i].xxh3);
        ok &= json_object_set_new(files, ix->files[i].name,
                                  json_pack("{s:I, s:s}", "bytes", (json_int_t)ix->files[i].bytes, "xxh3", hex)) == 0;
    }
    for (size_t t = 0; ok && t < ix->ntensors; t++) {
        const shard__ckpt_tensor *x = &ix->tensors[t];
        json_t *chunks = json_array();
        for (size_t c = 0; chunks && c < x->nchunks; c++)
            ok &= json_array_append_new(chunks,
                                        json_pack("{s:s, s:o, s:o}", "file", ix->files[x->chunks[c].file].name,
                                                  "offsets", size_array(x->chunks[c].off, x->ndim), "sizes",
                                                  size_array(x->chunks[c].len, x->ndim))) == 0;
        ok &= chunks &&
            json_object_set_new(tensors, x->name,
                                json_pack("{s:s, s:o, s:s, s:o}", "dtype", shard_safetensors_dtype_name(x->dtype),
                                          "shape", size_array(x->shape, x->ndim), "spec", x->spec, "chunks", chunks)) ==
                0;
    }
    /* the top level, in this order; json_object_set_new takes each value (on failure too), and what is not
     * set is released */
    static const char *const keys[10] = {"format", "version",  "step",  "mesh",    "world",
                                         "config", "training", "files", "tensors", SUM_KEY};
    json_t *fields[10] = {json_string("shard-checkpoint"),
                          json_integer(1),
                          json_integer((json_int_t)ix->step),
                          json_string(ix->mesh),
                          json_integer(ix->world),
                          config ? config : json_null(),
                          training,
                          files,
                          tensors,
                          json_string(SUM_ZEROS)};
    for (int i = 0; i < 10; i++) {
        if (!fields[i]) {
            ok &= i == 6; /* no training record: no key */
            continue;
        }
        if (!ok)
            json_decref(fields[i]);
        else if (json_object_set_new(root, keys[i], fields[i]) < 0)
            ok = 0;
    }
    char *text =
        ok ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL; /* float-sized */
    json_decref(root);
    if (!text) return shard_error(SHARD_ERR_NO_MEMORY, "%s: cannot build the index (out of memory)", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* over the terminating NUL: the file ends with a newline */
    char *digits = sum_digits(text, len + 1);
    if (!digits) { /* the key is the dump's last, so it is there */
        free(text);
        return shard_error(SHARD_ERR_INTERNAL, "%s: the index's own checksum is missing from its text", path);
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, XXH3_64bits(text, len + 1));
    memcpy(digits, hex, SUM_DIGITS);
    shard_status s = shard__atomic_write_file(path, text, len + 1);
    free(text);
    return s;
}

/* ---------------------------------------------------------------- reading */

static shard_status fail(const char *path, const char *what) { return shard_error(SHARD_ERR_IO, "%s: %s", path, what); }

static int read_sizes(const json_t *a, int ndim, size_t *out) {
    if (!json_is_array(a) || (int)json_array_size(a) != ndim) return 0;
    for (int i = 0; i < ndim; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
        out[i] = (size_t)json_integer_value(v);
    }
    return 1;
}

/* Elements in a box of `ndim` sizes, or UINT64_MAX when the product overflows. */
static uint64_t volume(const size_t *len, int ndim) {
    uint64_t v = 1;
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(v, (uint64_t)len[d], &v)) return UINT64_MAX;
    return v;
}

/* A chunk's start along the sweep dimension, and its place in the index. */
typedef struct sweep_item {
    size_t start;
    size_t chunk;
} sweep_item;

static int by_start(const void *a, const void *b) {
    const sweep_item *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : x->chunk < y->chunk ? -1 : x->chunk > y->chunk;
}

static int boxes_meet(const shard__ckpt_chunk *a, const shard__ckpt_chunk *b, int ndim) {
    for (int d = 0; d < ndim; d++)
        if (!(a->off[d] < b->off[d] + b->len[d] && b->off[d] < a->off[d] + a->len[d])) return 0;
    return 1;
}

/* The chunks tile the tensor: no two overlap and together they hold every element (a save writes
 * each block once), so a reader never leaves part of a tensor unwritten.  Overlaps are found by a
 * sweep along the dimension the chunks' starts differ most in (a split over many ranks compares
 * each chunk with its neighbours only, not with every other chunk). */
static shard_status check_cover(const char *path, const shard__ckpt_tensor *t) {
    char why[256];
    uint64_t held = 0, want = volume(t->shape, t->ndim);
    if (want == UINT64_MAX) {
        snprintf(why, sizeof why, "tensor '%s': its shape holds more than 2^64 elements", t->name);
        return fail(path, why);
    }
    sweep_item *items = calloc(t->nchunks ? t->nchunks : 1, sizeof *items);
    if (!items) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    size_t n = 0, most = 0;
    int along = 0;
    for (int d = 0; d < t->ndim; d++) { /* the dimension with the most distinct starts */
        n = 0;
        for (size_t c = 0; c < t->nchunks; c++) items[n++] = (sweep_item){t->chunks[c].off[d], c};
        qsort(items, n, sizeof *items, by_start);
        size_t distinct = n ? 1 : 0;
        for (size_t i = 1; i < n; i++) distinct += items[i].start != items[i - 1].start;
        if (distinct > most) most = distinct, along = d;
    }
    n = 0;
    for (size_t c = 0; c < t->nchunks; c++) {
        uint64_t v = volume(t->chunks[c].len, t->ndim);
        held += v; /* each inside the shape; if they are disjoint the sum stays <= want */
        if (v) items[n++] = (sweep_item){t->ndim ? t->chunks[c].off[along] : 0, c};
    }
    qsort(items, n, sizeof *items, by_start);
    shard_status s = SHARD_OK;
    for (size_t i = 0; s == SHARD_OK && i < n; i++) {
        const shard__ckpt_chunk *a = &t->chunks[items[i].chunk];
        size_t end = t->ndim ? a->off[along] + a->len[along] : 1;
        for (size_t j = i + 1; s == SHARD_OK && j < n && items[j].start < end; j++)
            if (boxes_meet(a, &t->chunks[items[j].chunk], t->ndim)) {
                size_t lo = items[i].chunk < items[j].chunk ? items[i].chunk : items[j].chunk;
                size_t hi = items[i].chunk ^ items[j].chunk ^ lo;
                snprintf(why, sizeof why, "tensor '%s': chunks %zu and %zu overlap", t->name, lo, hi);
                s = fail(path, why);
            }
    }
    free(items);
    if (s == SHARD_OK && held != want) {
        snprintf(why, sizeof why, "tensor '%s': its chunks hold %llu of its %llu elements", t->name,
                 (unsigned long long)held, (unsigned long long)want);
        s = fail(path, why);
    }
    return s;
}

static int by_tensor_name(const void *a, const void *b, void *tensors) {
    const shard__ckpt_tensor *t = tensors;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int by_file_name(const void *a, const void *b, void *files) {
    const shard__ckpt_file *f = files;
    return strcmp(f[*(const size_t *)a].name, f[*(const size_t *)b].name);
}

/* The index of the file named `name` through `order` (the files' indices sorted by name), or -1: a
 * checkpoint of many ranks has as many files, and every chunk names one. */
static int find_file(const shard__ckpt_index *ix, const size_t *order, const char *name) {
    size_t lo = 0, hi = ix->nfiles;
    while (name && lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ix->files[order[mid]].name, name);
        if (c == 0) return (int)order[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static shard_status read_tensor(const char *path, const char *name, const json_t *v, const shard__ckpt_index *ix,
                                const size_t *order, shard__ckpt_tensor *t) {
    char why[256];
    t->name = strdup(name);
    const json_t *shape = json_object_get(v, "shape"), *chunks = json_object_get(v, "chunks");
    const char *spec = json_string_value(json_object_get(v, "spec"));
    if (!t->name) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    if (shard__ckpt_dtype_parse(json_string_value(json_object_get(v, "dtype")), &t->dtype) < 0) {
        snprintf(why, sizeof why, "tensor '%s': field 'dtype' is missing or unknown", name);
        return fail(path, why);
    }
    if (!json_is_array(shape) || json_array_size(shape) > SHARD_MAX_DIMS ||
        !read_sizes(shape, (int)json_array_size(shape), t->shape)) {
        snprintf(why, sizeof why, "tensor '%s': field 'shape' is not a list of at most %d sizes", name, SHARD_MAX_DIMS);
        return fail(path, why);
    }
    t->ndim = (int)json_array_size(shape);
    t->spec = strdup(spec ? spec : "");
    if (!json_is_array(chunks)) {
        snprintf(why, sizeof why, "tensor '%s': field 'chunks' is not a list", name);
        return fail(path, why);
    }
    t->nchunks = json_array_size(chunks);
    t->chunks = calloc(t->nchunks ? t->nchunks : 1, sizeof *t->chunks);
    if (!t->spec || !t->chunks) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    for (size_t c = 0; c < t->nchunks; c++) {
        const json_t *ch = json_array_get(chunks, c);
        shard__ckpt_chunk *k = &t->chunks[c];
        const char *file = json_string_value(json_object_get(ch, "file"));
        k->file = find_file(ix, order, file);
        int ok = k->file >= 0 && read_sizes(json_object_get(ch, "offsets"), t->ndim, k->off) &&
            read_sizes(json_object_get(ch, "sizes"), t->ndim, k->len);
        for (int d = 0; ok && d < t->ndim; d++) ok = k->off[d] <= t->shape[d] && k->len[d] <= t->shape[d] - k->off[d];
        if (!ok) {
            snprintf(why, sizeof why, "tensor '%s': chunk %zu names no listed file or lies outside the shape", name, c);
            return fail(path, why);
        }
    }
    return check_cover(path, t);
}

/* The index's own checksum, when it has one: the bytes with its 16 digits as zeros hash to them. */
static shard_status check_own_sum(const char *path, char *text, size_t len, const json_t *sum, shard__ckpt_index *ix) {
    if (!sum) return SHARD_OK; /* written before indexes had one: read as it is, the callers say so */
    const char *hex = json_string_value(sum);
    char *end = NULL, why[256];
    uint64_t want = hex && strlen(hex) == SUM_DIGITS ? strtoull(hex, &end, 16) : 0;
    if (!end || *end) return fail(path, "its index_xxh3 is not 16 hex digits");
    char *digits = sum_digits(text, len);
    if (!digits || memcmp(digits, hex, SUM_DIGITS) != 0)
        return fail(path,
                    "its index_xxh3 is not its last key, where the writer puts it: the index was edited after "
                    "it was written; restore it, or load another step");
    memcpy(digits, SUM_ZEROS, SUM_DIGITS);
    uint64_t got = XXH3_64bits(text, len);
    memcpy(digits, hex, SUM_DIGITS);
    if (got != want) {
        snprintf(why, sizeof why,
                 "checksum %016llx, its index_xxh3 says %016llx: the index was edited or damaged after it was "
                 "written; restore it, or load another step",
                 (unsigned long long)got, (unsigned long long)want);
        return fail(path, why);
    }
    ix->checksummed = 1;
    return SHARD_OK;
}

/* A step directory holds its own step's index: a step edited in the index, or a directory renamed, would
 * resume as another step than the one its state is. */
static shard_status check_step_name(const char *path, uint64_t step) {
    char dir[PATH_MAX], why[PATH_MAX + 160];
    shard__dir_of(path, dir, sizeof dir);
    const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    uint64_t named = 0;
    if (!shard__ckpt_parse_step_name(name, &named) || named == step) return SHARD_OK;
    snprintf(why, sizeof why, "its step is %llu, but it lies in %s: an index's step is its directory's",
             (unsigned long long)step, dir);
    return fail(path, why);
}

shard_status shard__ckpt_index_read(const char *path, shard__ckpt_index *ix) {
    memset(ix, 0, sizeof *ix);
    char *text = NULL;
    size_t len = 0;
    SHARD_CHECK(shard_file_read(path, "cannot read the index", SHARD__CKPT_INDEX_MAX_BYTES, &text, &len));
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        free(text);
        return shard_error(SHARD_ERR_IO, "%s: cannot read the index: %s", path, err.text);
    }
    shard_status s = SHARD_OK;
    const json_t *files = json_object_get(root, "files"), *tensors = json_object_get(root, "tensors");
    const json_t *step = json_object_get(root, "step"), *config = json_object_get(root, "config");
    const json_t *training = json_object_get(root, "training");
    const char *format = json_string_value(json_object_get(root, "format"));
    if (!format || strcmp(format, "shard-checkpoint") != 0 || !json_is_object(files) || !json_is_object(tensors) ||
        !json_is_integer(step) || json_integer_value(step) < 0)
        s = fail(path, "not a shard checkpoint index (needs format, step, files, tensors)");
    const json_t *version = json_object_get(root, "version"), *world = json_object_get(root, "world");
    const char *mesh = json_string_value(json_object_get(root, "mesh"));
    if (s == SHARD_OK && version && (!json_is_integer(version) || json_integer_value(version) != 1))
        s = fail(path, "its version is not 1, the one this shard reads");
    if (s == SHARD_OK && json_integer_value(step) >= (json_int_t)1 << 62) s = fail(path, "its step is past 2^62");
    if (s == SHARD_OK && world &&
        (!json_is_integer(world) || json_integer_value(world) < 1 || json_integer_value(world) > 1 << 20))
        s = fail(path, "its world is not a rank count in 1..2^20");
    if (s == SHARD_OK && mesh && *mesh && shard_mesh_parse(mesh, (int)json_integer_value(world), NULL, NULL) < 0)
        s = fail(path, "its mesh does not parse, or does not span its world");
    if (s == SHARD_OK) {
        ix->step = (uint64_t)json_integer_value(step);
        ix->mesh = strdup(
            json_string_value(json_object_get(root, "mesh")) ? json_string_value(json_object_get(root, "mesh")) : "");
        ix->world = (int)json_integer_value(json_object_get(root, "world"));
        ix->config = config && !json_is_null(config) ? json_dumps(config, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        ix->training = json_is_object(training) ? json_dumps(training, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        ix->nfiles = json_object_size(files);
        ix->files = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *ix->files);
        ix->tensors = calloc(json_object_size(tensors) ? json_object_size(tensors) : 1, sizeof *ix->tensors);
        if (!ix->mesh || !ix->files || !ix->tensors) s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    size_t f = 0;
    const char *key;
    json_t *v;
    if (s == SHARD_OK) json_object_foreach((json_t *)files, key, v) {
            const char *hex = json_string_value(json_object_get(v, "xxh3"));
            char *end = NULL;
            const json_t *bytes = json_object_get(v, "bytes");
            if (strlen(key) >= SHARD__CKPT_NAME_BYTES || strchr(key, '/') || !hex || strlen(hex) != 16 ||
                !json_is_integer(bytes) || json_integer_value(bytes) < 0) {
                s = fail(path, "a file entry is malformed (name, bytes or xxh3)");
                break;
            }
            snprintf(ix->files[f].name, sizeof ix->files[f].name, "%s", key);
            ix->files[f].bytes = (uint64_t)json_integer_value(bytes);
            ix->files[f].xxh3 = strtoull(hex, &end, 16);
            if (!end || *end) {
                s = fail(path, "a file's xxh3 is not 16 hex digits");
                break;
            }
            f++;
        }
    size_t *order = s == SHARD_OK ? malloc((ix->nfiles ? ix->nfiles : 1) * sizeof *order) : NULL;
    if (s == SHARD_OK && !order) s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    for (size_t i = 0; order && i < ix->nfiles; i++) order[i] = i;
    if (order) qsort_r(order, ix->nfiles, sizeof *order, by_file_name, ix->files);
    if (s == SHARD_OK) json_object_foreach((json_t *)tensors, key, v) {
            s = read_tensor(path, key, v, ix, order, &ix->tensors[ix->ntensors++]);
            if (s < 0) break;
        }
    free(order);
    if (s == SHARD_OK && !ix->ntensors) s = fail(path, "it holds no tensors: a checkpoint holds one or more");
    if (s == SHARD_OK) s = check_own_sum(path, text, len, json_object_get(root, SUM_KEY), ix);
    if (s == SHARD_OK) s = check_step_name(path, ix->step);
    json_decref(root);
    free(text);
    if (s == SHARD_OK && !(ix->by_name = malloc((ix->ntensors ? ix->ntensors : 1) * sizeof *ix->by_name)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    for (size_t t = 0; s == SHARD_OK && t < ix->ntensors; t++) ix->by_name[t] = t;
    if (s == SHARD_OK) qsort_r(ix->by_name, ix->ntensors, sizeof *ix->by_name, by_tensor_name, ix->tensors);
    if (s < 0) shard__ckpt_index_free(ix);
    return s;
}

void shard__ckpt_index_note(const char *dir, const shard__ckpt_index *ix, FILE *out) {
    if (!ix->checksummed && out)
        fprintf(out,
                "shard: note: %s/index.json carries no index checksum (it was written before indexes carried "
                "one), so an edit to it cannot be detected; checkpoints saved from now on carry one\n",
                dir);
}

void shard__ckpt_index_free(shard__ckpt_index *ix) {
    for (size_t t = 0; ix->tensors && t < ix->ntensors; t++) {
        free(ix->tensors[t].name);
        free(ix->tensors[t].spec);
        free(ix->tensors[t].chunks);
    }
    free(ix->tensors);
    free(ix->files);
    free(ix->mesh);
    free(ix->config);
    free(ix->training);
    free(ix->by_name);
    memset(ix, 0, sizeof *ix);
}

/* A binary search through by_name: a load looks up every tensor it restores. */
const shard__ckpt_tensor *shard__ckpt_index_find(const shard__ckpt_index *ix, const char *name) {
    for (size_t lo = 0, hi = ix->by_name ? ix->ntensors : 0; lo < hi;) {
        size_t mid = lo + (hi - lo) / 2;
        const shard__ckpt_tensor *t = &ix->tensors[ix->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t t = 0; !ix->by_name && t < ix->ntensors; t++)
        if (strcmp(ix->tensors[t].name, name) == 0) return &ix->tensors[t];
    return NULL;
}
