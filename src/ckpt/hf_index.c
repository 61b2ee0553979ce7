/* hf_index.c — see hf_index.h: Hugging Face's NAME.index.json, read and checked once for every reader. */
#include "hf_index.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_read.h"
#include "shard/files.h"

static int ends_with(const char *text, const char *end) {
    size_t n = strlen(text), m = strlen(end);
    return n >= m && strcmp(text + n - m, end) == 0;
}

int shard__hf_index_is(const char *path) { return path && ends_with(path, ".index.json"); }

static size_t find_file(const shard__hf_index *ix, const char *file) {
    size_t k = 0;
    while (k < ix->nfiles && strcmp(ix->files[k], file) != 0) k++;
    return k;
}

shard_status shard__hf_index_open(const char *path, shard__hf_index *ix) {
    memset(ix, 0, sizeof *ix);
    ix->path = path, ix->total_size = -1;
    char *text = NULL;
    size_t len = 0;
    SHARD_CHECK(shard_file_read(path, "cannot read the index", SHARD__HF_INDEX_MAX_BYTES, &text, &len));
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root) return shard_error(SHARD_ERR_IO, "%s: cannot read the index: %s (line %d)", path, err.text, err.line);
    ix->root = root;
    const json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        shard__hf_index_close(ix);
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: not a safetensors index (it needs a \"weight_map\" object of tensor "
                           "name -> file name)",
                           path);
    }
    const json_t *total = json_object_get(json_object_get(root, "metadata"), "total_size");
    if (json_is_integer(total)) ix->total_size = (long long)json_integer_value(total);
    const char *slash = strrchr(path, '/');
    ix->dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    ix->files = calloc(json_object_size(map) + 1, sizeof *ix->files);
    if (!ix->files) {
        shard__hf_index_close(ix);
        return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    const char *name;
    const json_t *v;
    json_object_foreach((json_t *)map, name, v) {
        const char *file = json_string_value(v);
        shard_status s = SHARD_OK;
        if (!file || !*file || strchr(file, '/'))
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "%s: weight_map[\"%s\"] is not a file name beside the index (give e.g. "
                            "\"model-00001-of-00002.safetensors\")",
                            path, name);
        else if (!ends_with(file, ".safetensors"))
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "%s: weight_map[\"%s\"] is %s, not a .safetensors file (shard reads "
                            "safetensors only)",
                            path, name, file);
        if (s < 0) {
            shard__hf_index_close(ix);
            return s;
        }
        if (find_file(ix, file) == ix->nfiles) ix->files[ix->nfiles++] = file;
        ix->ntensors++;
    }
    return SHARD_OK;
}

long shard__hf_index_file_of(const shard__hf_index *ix, const char *name) {
    const char *file = json_string_value(json_object_get(json_object_get(ix->root, "weight_map"), name));
    return file ? (long)find_file(ix, file) : -1;
}

int shard__hf_index_each(const shard__hf_index *ix, int (*fn)(void *ctx, const char *name, size_t file), void *ctx) {
    const char *name;
    const json_t *v;
    json_object_foreach(json_object_get(ix->root, "weight_map"), name, v) {
        int rc = fn(ctx, name, find_file(ix, json_string_value(v)));
        if (rc) return rc;
    }
    return 0;
}

char *shard__hf_index_file_path(const shard__hf_index *ix, size_t file, char *out, size_t out_bytes) {
    snprintf(out, out_bytes, "%.*s%s", (int)ix->dir_len, ix->path, ix->files[file]);
    return out;
}

void shard__hf_index_close(shard__hf_index *ix) {
    if (ix->root) json_decref(ix->root);
    free(ix->files);
    memset(ix, 0, sizeof *ix);
}
