/* safetensors_write.c — write safetensors files, streaming and atomically
 * (see safetensors.h).  The header (jansson, keys in the given order,
 * "__metadata__" first as Hugging Face writes it) is padded with spaces so the
 * data area starts at a multiple of 8 bytes; data goes through a 1 MiB buffer
 * into a temporary file committed by rename. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "shard/safetensors.h"

enum { BUFFER_BYTES = 1 << 20 };

struct shard_st_writer {
    shard__atomic_file file;
    XXH3_state_t *hash; /* over every byte of the file */
    uint64_t file_bytes;
    uint64_t expected, written; /* data bytes */
    char *buffer;
    size_t buffered;
};

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static shard_status check_entries(const char *path, const shard_st_entry *entries, size_t count, uint64_t *total) {
    const char **names = malloc((count ? count : 1) * sizeof *names);
    if (!names) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    shard_status s = SHARD_OK;
    *total = 0;
    for (size_t i = 0; i < count && s == SHARD_OK; i++) {
        const shard_st_entry *e = &entries[i];
        names[i] = e->name ? e->name : "";
        if (!e->name || !*e->name || strcmp(e->name, "__metadata__") == 0)
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "%s: tensor %zu has the name '%s'; names must be non-empty and not __metadata__", path, i,
                            names[i]);
        else if ((unsigned)e->dtype >= SHARD_DTYPE_COUNT || e->ndim < 0 || e->ndim > SHARD_MAX_DIMS)
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s: tensor '%s': invalid dtype or %d dims", path, e->name, e->ndim);
        uint64_t bytes = shard_dtype_size(e->dtype);
        for (int d = 0; s == SHARD_OK && d < e->ndim; d++)
            if (__builtin_mul_overflow(bytes, (uint64_t)e->shape[d], &bytes))
                s = shard_error(SHARD_ERR_INVALID_ARG, "%s: tensor '%s': its size overflows 64 bits", path, e->name);
        for (int d = 0; s == SHARD_OK && d < e->ndim; d++) /* the header's integers are JSON's (signed 64-bit) */
            if ((uint64_t)e->shape[d] > INT64_MAX)
                s = shard_error(SHARD_ERR_INVALID_ARG, "%s: tensor '%s': dim %d of %zu is past 2^63 - 1", path, e->name,
                                d, e->shape[d]);
        if (s == SHARD_OK && (__builtin_add_overflow(*total, bytes, total) || *total > INT64_MAX))
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s: the tensors' total size is past 2^63 - 1 bytes", path);
    }
    if (s == SHARD_OK) {
        qsort(names, count, sizeof *names, cmp_str);
        for (size_t i = 1; i < count && s == SHARD_OK; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                s = shard_error(SHARD_ERR_INVALID_ARG, "%s: the tensor name '%s' is used twice", path, names[i]);
    }
    free(names);
    return s;
}

/* The header JSON, unpadded (caller frees). */
static char *header_json(const shard_st_entry *entries, size_t count, const char *const *keys,
                         const char *const *values, size_t meta_count) {
    json_t *root = json_object();
    if (!root) return NULL;
    int ok = 1;
    if (meta_count) {
        json_t *meta = json_object();
        for (size_t i = 0; meta && i < meta_count; i++)
            ok &= json_object_set_new(meta, keys[i], json_string(values[i])) == 0;
        ok &= meta && json_object_set_new(root, "__metadata__", meta) == 0;
    }
    uint64_t at = 0;
    for (size_t i = 0; ok && i < count; i++) {
        const shard_st_entry *e = &entries[i];
        uint64_t bytes = shard_dtype_size(e->dtype);
        json_t *shape = json_array(), *entry = json_object();
        for (int d = 0; shape && d < e->ndim; d++) {
            ok &= json_array_append_new(shape, json_integer((json_int_t)e->shape[d])) == 0;
            bytes *= e->shape[d];
        }
        json_t *offsets = json_pack("[II]", (json_int_t)at, (json_int_t)(at + bytes));
        ok &= shape && entry && offsets;
        ok &= ok && json_object_set_new(entry, "dtype", json_string(shard_safetensors_dtype_name(e->dtype))) == 0;
        ok &= ok && json_object_set_new(entry, "shape", shape) == 0;
        ok &= ok && json_object_set_new(entry, "data_offsets", offsets) == 0;
        ok &= ok && json_object_set_new(root, e->name, entry) == 0;
        at += bytes;
    }
    char *text = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return text;
}

shard_status shard_st_writer_open(const char *path, const shard_st_entry *entries, size_t count,
                                  const char *const *meta_keys, const char *const *meta_values, size_t meta_count,
                                  shard_st_writer **out) {
    if (!path || !out || (count && !entries) || (meta_count && (!meta_keys || !meta_values)))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_st_writer_open: NULL argument");
    *out = NULL;
    uint64_t total = 0;
    SHARD_CHECK(check_entries(path, entries, count, &total));
    for (size_t i = 0; i < meta_count; i++) {
        if (!meta_keys[i] || !meta_values[i])
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: metadata pair %zu has a NULL key or value", path, i);
        for (size_t j = 0; j < i; j++) /* a JSON object keeps one: the other value would be lost */
            if (strcmp(meta_keys[i], meta_keys[j]) == 0)
                return shard_error(SHARD_ERR_INVALID_ARG, "%s: the metadata key '%s' is given twice", path,
                                   meta_keys[i]);
    }
    char *json = header_json(entries, count, meta_keys, meta_values, meta_count);
    if (!json)
        return shard_error(SHARD_ERR_NO_MEMORY, "%s: cannot build the header (out of memory or bad UTF-8 in a name)",
                           path);
    size_t len = strlen(json), padded = len + (8 - (8 + len) % 8) % 8;
    if (padded > SHARD_SAFETENSORS_MAX_HEADER) {
        free(json);
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: the header would be %zu bytes, more than the %u a reader accepts "
                           "(fewer tensors or shorter names per file)",
                           path, padded, SHARD_SAFETENSORS_MAX_HEADER);
    }
    shard_st_writer *w = calloc(1, sizeof *w);
    char *header = malloc(8 + padded);
    shard_status s = w && header ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    if (s == SHARD_OK) {
        for (int i = 0; i < 8; i++) header[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xFF);
        memcpy(header + 8, json, len);
        memset(header + 8 + len, ' ', padded - len);
        w->buffer = malloc(BUFFER_BYTES);
        if (!w->buffer) s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    free(json);
    if (s == SHARD_OK && (!(w->hash = XXH3_createState()) || XXH3_64bits_reset(w->hash) != XXH_OK))
        s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    if (s == SHARD_OK) s = shard__atomic_open(path, &w->file);
    if (s == SHARD_OK) {
        s = shard__atomic_write(&w->file, header, 8 + padded);
        XXH3_64bits_update(w->hash, header, 8 + padded);
        w->file_bytes = 8 + padded;
        if (s < 0) shard__atomic_abort(&w->file);
    }
    free(header);
    if (s < 0) {
        if (w) free(w->buffer), XXH3_freeState(w->hash);
        free(w);
        return s;
    }
    w->expected = total;
    *out = w;
    return SHARD_OK;
}

static shard_status put(shard_st_writer *w, const void *bytes, size_t size) {
    XXH3_64bits_update(w->hash, bytes, size);
    w->file_bytes += size;
    return shard__atomic_write(&w->file, bytes, size);
}

static shard_status flush(shard_st_writer *w) {
    shard_status s = put(w, w->buffer, w->buffered);
    w->buffered = 0;
    return s;
}

shard_status shard_st_writer_write(shard_st_writer *w, const void *bytes, size_t size) {
    if (!w || (size && !bytes)) return shard_error(SHARD_ERR_INVALID_ARG, "shard_st_writer_write: NULL argument");
    if (size > w->expected - w->written)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: %zu more bytes of data than the header declares (%llu)",
                           w->file.path, size - (size_t)(w->expected - w->written), (unsigned long long)w->expected);
    w->written += size;
    if (size >= BUFFER_BYTES) { /* large: straight through */
        SHARD_CHECK(flush(w));
        return put(w, bytes, size);
    }
    if (w->buffered + size > BUFFER_BYTES) SHARD_CHECK(flush(w));
    memcpy(w->buffer + w->buffered, bytes, size);
    w->buffered += size;
    return SHARD_OK;
}

shard_status shard_st_writer_commit(shard_st_writer *w) { return shard_st_writer_commit_digest(w, NULL, NULL); }

shard_status shard_st_writer_commit_digest(shard_st_writer *w, uint64_t *xxh3, uint64_t *file_bytes) {
    if (!w) return shard_error(SHARD_ERR_INVALID_ARG, "shard_st_writer_commit: NULL writer");
    shard_status s = SHARD_OK;
    if (w->written != w->expected)
        s = shard_error(SHARD_ERR_INVALID_ARG, "%s: %llu bytes of data written, the header declares %llu", w->file.path,
                        (unsigned long long)w->written, (unsigned long long)w->expected);
    if (s == SHARD_OK) s = flush(w);
    if (s == SHARD_OK)
        s = shard__atomic_commit(&w->file); /* aborts itself on failure */
    else
        shard__atomic_abort(&w->file);
    if (xxh3) *xxh3 = XXH3_64bits_digest(w->hash);
    if (file_bytes) *file_bytes = w->file_bytes;
    XXH3_freeState(w->hash);
    free(w->buffer);
    free(w);
    return s;
}

void shard_st_writer_abort(shard_st_writer *w) {
    if (!w) return;
    shard__atomic_abort(&w->file);
    XXH3_freeState(w->hash);
    free(w->buffer);
    free(w);
}

shard_status shard_safetensors_write(const char *path, const char *const *names, const shard_tensor *const *tensors,
                                     size_t count, const char *const *meta_keys, const char *const *meta_values,
                                     size_t meta_count) {
    if (!path || (count && (!names || !tensors)))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_safetensors_write: NULL argument");
    shard_st_entry *entries = calloc(count ? count : 1, sizeof *entries);
    if (!entries) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    for (size_t i = 0; i < count; i++) {
        entries[i].name = names[i];
        entries[i].dtype = tensors[i]->dtype;
        entries[i].ndim = tensors[i]->ndim;
        for (int d = 0; d < tensors[i]->ndim; d++) entries[i].shape[d] = tensors[i]->shape[d];
    }
    shard_st_writer *w = NULL;
    shard_status s = shard_st_writer_open(path, entries, count, meta_keys, meta_values, meta_count, &w);
    free(entries);
    for (size_t i = 0; s == SHARD_OK && i < count; i++) {
        const shard_tensor *t = tensors[i];
        if (shard_tensor_is_contiguous(t)) {
            s = shard_st_writer_write(w, t->data, shard_tensor_nbytes(t));
            continue;
        }
        shard_tensor *packed = NULL;
        s = shard_tensor_create(t->dtype, t->ndim, t->shape, SHARD_MEM_OTHER, &packed);
        if (s == SHARD_OK) s = shard_tensor_copy(packed, t);
        if (s == SHARD_OK) s = shard_st_writer_write(w, packed->data, shard_tensor_nbytes(packed));
        shard_tensor_destroy(packed);
    }
    if (s < 0) {
        shard_st_writer_abort(w);
        return s;
    }
    return shard_st_writer_commit(w);
}
