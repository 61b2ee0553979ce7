/* params.c — the parameter slab, counter-based initialisation, and
 * safetensors load/save by name (see params.h). */
#include "shard/params.h"

#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ckpt/hf_index.h"
#include "nn/params_impl.h"
#include "shard/safetensors.h"

enum { ALIGN_ELEMENTS = 16 }; /* 64 bytes of f32 */

/* Name comparisons made by the index, over the process's life: what shows the table is built in linear
 * time (a test reads it through shard__params_name_compares). */
static _Atomic size_t g_name_compares;

size_t shard__params_name_compares(void) { return atomic_load_explicit(&g_name_compares, memory_order_relaxed); }

static size_t name_hash(const char *name) { return (size_t)XXH3_64bits(name, strlen(name)); }

/* The slot holding `name` (its value 0 when the name is absent: where it would go); probes linearly from
 * the name's hash, the table at most half full, so a probe meets few other names. */
static size_t name_slot(const size_t *slots, size_t mask, const shard_param_info *info, const char *name,
                        size_t *compares) {
    size_t at = name_hash(name) & mask;
    while (slots[at] && (++*compares, strcmp(info[slots[at] - 1].name, name) != 0)) at = (at + 1) & mask;
    return at;
}

/* The index of p's names, refusing a name given twice (the first repeat's position in *twice). */
static shard_status index_names(shard_params *p, size_t *twice) {
    size_t cap = 2;
    while (cap < 2 * p->count) cap *= 2;
    p->by_name = calloc(cap, sizeof *p->by_name), p->by_name_mask = cap - 1;
    if (!p->by_name)
        return shard_error(SHARD_ERR_NO_MEMORY, "shard_params_create: out of memory for %zu names", p->count);
    size_t compares = 0;
    shard_status s = SHARD_OK;
    for (size_t i = 0; s == SHARD_OK && i < p->count; i++) {
        size_t at = name_slot(p->by_name, p->by_name_mask, p->info, p->info[i].name, &compares);
        if (p->by_name[at])
            *twice = i, s = SHARD_ERR_INVALID_ARG;
        else
            p->by_name[at] = i + 1;
    }
    atomic_fetch_add_explicit(&g_name_compares, compares, memory_order_relaxed);
    return s;
}

shard_status shard_params_create(const shard_param_info *tensors, size_t count, shard_mem_category category,
                                 shard_params **out) {
    if (!out || (count && !tensors)) return shard_error(SHARD_ERR_INVALID_ARG, "shard_params_create: NULL argument");
    *out = NULL;
    shard_params *p = calloc(1, sizeof *p);
    shard_param_info *info = calloc(count ? count : 1, sizeof *info);
    if (!p || !info) {
        free(p), free(info);
        return shard_error(SHARD_ERR_NO_MEMORY, "shard_params_create: out of memory");
    }
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        info[i] = tensors[i];
        if (!info[i].name[0] || memchr(info[i].name, '\0', SHARD_PARAM_NAME_BYTES) == NULL || info[i].ndim < 0 ||
            info[i].ndim > SHARD_MAX_DIMS) {
            free(p), free(info);
            return shard_error(SHARD_ERR_INVALID_ARG, "shard_params_create: tensor %zu has no name or %d dims", i,
                               tensors[i].ndim);
        }
        size_t n = 1;
        for (int d = 0; d < info[i].ndim; d++) n *= info[i].shape[d];
        info[i].offset = total, info[i].numel = n;
        total += (n + ALIGN_ELEMENTS - 1) / ALIGN_ELEMENTS * ALIGN_ELEMENTS;
    }
    p->count = count, p->info = info, p->total = total, p->category = category;
    size_t twice = 0;
    shard_status s = index_names(p, &twice);
    if (s == SHARD_ERR_INVALID_ARG)
        s = shard_error(s, "shard_params_create: the name '%s' is given twice", tensors[twice].name);
    if (s == SHARD_OK && !(p->data = shard_alloc_zeroed((total ? total : 1) * sizeof(float), category)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "shard_params_create: out of memory for %zu parameters", total);
    if (s < 0) {
        shard_params_destroy(p);
        return s;
    }
    *out = p;
    return SHARD_OK;
}

shard_status shard_params_like(const shard_params *p, shard_mem_category category, shard_params **out) {
    return shard_params_create(p->info, p->count, category, out);
}

void shard_params_destroy(shard_params *p) {
    if (!p) return;
    shard_free(p->data);
    free(p->info);
    free(p->by_name);
    free(p);
}

const shard_param_info *shard_params_find(const shard_params *p, const char *name) {
    if (!p || !name || !p->by_name) return NULL;
    size_t compares = 0, at = name_slot(p->by_name, p->by_name_mask, p->info, name, &compares);
    return p->by_name[at] ? &p->info[p->by_name[at] - 1] : NULL;
}

float *shard_params_data(const shard_params *p, const char *name) {
    const shard_param_info *i = shard_params_find(p, name);
    return i ? p->data + i->offset : NULL;
}

shard_tensor shard_params_view(const shard_params *p, size_t index) {
    shard_tensor t;
    memset(&t, 0, sizeof t);
    const shard_param_info *i = &p->info[index];
    t.dtype = SHARD_F32, t.ndim = i->ndim, t.data = p->data + i->offset, t.category = p->category;
    size_t stride = 1;
    for (int d = i->ndim - 1; d >= 0; d--) t.shape[d] = i->shape[d], t.strides[d] = stride, stride *= i->shape[d];
    return t;
}

void shard_params_zero(shard_params *p) { memset(p->data, 0, p->total * sizeof(float)); }

/* ---------------------------------------------------------------- initialisation */

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t name_stream(const char *name) { /* FNV-1a, stable across builds */
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char *c = (const unsigned char *)(name ? name : ""); *c; c++) h = (h ^ *c) * 1099511628211ULL;
    return h;
}

static double unit(uint64_t seed, uint64_t stream, uint64_t i) { /* in (0, 1) */
    uint64_t r = mix(mix(seed ^ 0x9e3779b97f4a7c15ULL) ^ mix(stream) ^ (i * 0xd1b54a32d192ed03ULL));
    return ((double)(r >> 11) + 0.5) * 0x1.0p-53;
}

void shard_init_normal(float *x, size_t first, size_t n, float std, uint64_t seed, const char *name) {
    uint64_t stream = name_stream(name);
    const double two_pi = 6.28318530717958647692;
    for (size_t k = 0; k < n; k++) { /* Box-Muller on the pair (2i, 2i+1) of element i */
        uint64_t i = (uint64_t)(first + k);
        double u1 = unit(seed, stream, 2 * i), u2 = unit(seed, stream, 2 * i + 1);
        x[k] = (float)((double)std * sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}

void shard_init_uniform(float *x, size_t first, size_t n, float bound, uint64_t seed, const char *name) {
    uint64_t stream = name_stream(name);
    for (size_t k = 0; k < n; k++)
        x[k] = (float)((2.0 * unit(seed, stream, (uint64_t)(first + k)) - 1.0) * (double)bound);
}

/* ---------------------------------------------------------------- safetensors */

/* Parameter i from the open file f (path, for messages), when f holds it: shape and dtype checked, then
 * cast into the slab.  *found says whether f had it. */
static shard_status load_one(shard_params *p, size_t i, shard_safetensors *f, const char *path, int *found) {
    const shard_param_info *info = &p->info[i];
    const shard_st_entry *e = shard_safetensors_find(f, info->name);
    *found = e != NULL;
    if (!e) return SHARD_OK;
    int same = e->ndim == info->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == info->shape[d];
    if (!same) {
        char have[160] = "", want[160] = "";
        size_t hu = 0, wu = 0;
        for (int d = 0; d < e->ndim; d++)
            hu += (size_t)snprintf(have + hu, sizeof have - hu, "%s%zu", d ? "," : "", e->shape[d]);
        for (int d = 0; d < info->ndim; d++)
            wu += (size_t)snprintf(want + wu, sizeof want - wu, "%s%zu", d ? "," : "", info->shape[d]);
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: tensor '%s' has shape [%s], the model needs [%s]", path,
                           info->name, have, want);
    }
    if (e->dtype != SHARD_F32 && e->dtype != SHARD_BF16 && e->dtype != SHARD_F16)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: tensor '%s' is %s; parameters load from F32, BF16 or F16", path,
                           info->name, shard_safetensors_dtype_name(e->dtype));
    shard_tensor *src = NULL;
    shard_status s = shard_safetensors_tensor(f, info->name, SHARD_MEM_OTHER, &src, NULL);
    if (s == SHARD_OK) {
        shard_tensor dst = shard_params_view(p, i);
        s = shard_tensor_cast(&dst, src);
    }
    shard_tensor_destroy(src);
    return s;
}

/* Hugging Face's sharded layout (NAME.index.json, read by ckpt/hf_index.c): each file is opened once,
 * when a parameter first needs it. */
static shard_status load_sharded(shard_params *p, const char *path, int require_all, size_t *loaded) {
    shard__hf_index ix;
    SHARD_CHECK(shard__hf_index_open(path, &ix));
    shard_safetensors **files = calloc(ix.nfiles + 1, sizeof *files);
    shard_status s = files ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    size_t n = 0;
    char file[4096];
    for (size_t i = 0; s == SHARD_OK && i < p->count; i++) {
        long k = shard__hf_index_file_of(&ix, p->info[i].name);
        if (k < 0) {
            if (require_all)
                s = shard_error(SHARD_ERR_INVALID_ARG, "%s has no tensor '%s', which the model needs", path,
                                p->info[i].name);
            continue;
        }
        shard__hf_index_file_path(&ix, (size_t)k, file, sizeof file);
        if (!files[k] && (s = shard_safetensors_open(file, &files[k])) < 0) break;
        int found = 0;
        s = load_one(p, i, files[k], file, &found);
        if (s == SHARD_OK && !found)
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s: no tensor '%s', which %s says it holds", file, p->info[i].name,
                            path);
        n += s == SHARD_OK;
    }
    for (size_t k = 0; files && k < ix.nfiles; k++)
        if (files[k]) shard_safetensors_close(files[k]);
    free(files);
    shard__hf_index_close(&ix);
    if (loaded) *loaded = n;
    return s;
}

shard_status shard_params_load(shard_params *p, const char *path, int require_all, size_t *loaded) {
    if (shard__hf_index_is(path)) return load_sharded(p, path, require_all, loaded);
    shard_safetensors *f = NULL;
    SHARD_CHECK(shard_safetensors_open(path, &f));
    shard_status s = SHARD_OK;
    size_t n = 0;
    for (size_t i = 0; i < p->count && s == SHARD_OK; i++) {
        int found = 0;
        s = load_one(p, i, f, path, &found);
        if (s == SHARD_OK && !found && require_all)
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s has no tensor '%s', which the model needs", path,
                            p->info[i].name);
        n += s == SHARD_OK && found;
    }
    shard_safetensors_close(f);
    if (loaded) *loaded = n;
    return s;
}

shard_status shard_params_save(const shard_params *p, const char *path, const char *const *meta_keys,
                               const char *const *meta_values, size_t meta_count) {
    const char **names = calloc(p->count ? p->count : 1, sizeof *names);
    shard_tensor *views = calloc(p->count ? p->count : 1, sizeof *views);
    const shard_tensor **ptrs = calloc(p->count ? p->count : 1, sizeof *ptrs);
    shard_status s = names && views && ptrs ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    for (size_t i = 0; s == SHARD_OK && i < p->count; i++) {
        names[i] = p->info[i].name;
        views[i] = shard_params_view(p, i);
        ptrs[i] = &views[i];
    }
    if (s == SHARD_OK) s = shard_safetensors_write(path, names, ptrs, p->count, meta_keys, meta_values, meta_count);
    free(names), free(views), free(ptrs);
    return s;
}
