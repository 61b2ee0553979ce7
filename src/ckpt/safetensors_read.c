/* safetensors_read.c — map a safetensors file and check every rule of the
 * format before exposing it (see safetensors.h).
 *
 * Order of checks: what the first bytes look like when they cannot start a safetensors file (JSON
 * text, a token file, an empty file: named as such); the 8-byte length N (0, over the limit, past the end);
 * the header bytes (UTF-8, starting with '{'); the JSON (jansson, rejecting
 * duplicate keys at any level); each entry (name, dtype, shape, offsets,
 * byte count); then the offsets sorted: from 0, back to back, ending at the
 * end of the file.  Every message names the file, the tensor and the field. */
#define _GNU_SOURCE
#include "shard/safetensors.h"
#include "shard/files.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdarg.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct shard_safetensors {
    char name[PATH_MAX]; /* the path whole: every message names it */
    const unsigned char *bytes;
    size_t size;
    void *map; /* when opened from a file */
    const unsigned char *data;
    uint64_t data_size;
    shard_st_entry *entries; /* sorted by offset */
    size_t count;
    size_t *by_name; /* indices sorted by name */
    char **meta_keys, **meta_values;
    size_t meta_count;
};

static const char *const st_dtypes[SHARD_DTYPE_COUNT] = {"F32", "F64", "BF16", "F16", "I8", "I32", "I64", "U8"};
/* dtypes of the format that shard does not compute in */
static const char *const st_other_dtypes[] = {"BOOL",    "U16",     "I16", "U32",     "U64",     "F8_E4M3",
                                              "F8_E5M2", "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64"};

const char *shard_safetensors_dtype_name(shard_dtype dtype) {
    return (unsigned)dtype < SHARD_DTYPE_COUNT ? st_dtypes[dtype] : "?";
}

/* ---------------------------------------------------------------- checks */

/* Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and
 * code points past U+10FFFF included), or len if it is all valid. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1, cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2, cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3, cp = c & 0x07;
        } else {
            return i;
        }
        if (len - i <= n) return i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += n + 1;
    }
    return len;
}

/* A short rendering of a JSON value for messages. */
static void json_text(const json_t *v, char *out, size_t out_bytes) {
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    snprintf(out, out_bytes, "%.40s%s", s ? s : "(nothing)", s && strlen(s) > 40 ? "..." : "");
    free(s);
}

static shard_status bad(const shard_safetensors *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static shard_status bad(const shard_safetensors *f, const char *fmt, ...) {
    char text[SHARD_ERROR_TEXT_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return shard_error(SHARD_ERR_IO, "%s: %s", f->name, text);
}

static shard_status parse_dtype(shard_safetensors *f, const char *tensor, const json_t *v, shard_dtype *out) {
    if (!v) return bad(f, "tensor '%s': field 'dtype' is missing", tensor);
    if (!json_is_string(v)) {
        char t[64];
        json_text(v, t, sizeof t);
        return bad(f, "tensor '%s': field 'dtype' is %s, not a string", tensor, t);
    }
    const char *s = json_string_value(v);
    if (strlen(s) != json_string_length(v)) /* "F32\u0000junk" must not read as F32 */
        return bad(f, "tensor '%s': field 'dtype' contains a NUL byte (valid: F32, F64, BF16, F16, I8, I32, I64, U8)",
                   tensor);
    for (int d = 0; d < SHARD_DTYPE_COUNT; d++)
        if (strcmp(s, st_dtypes[d]) == 0) {
            *out = (shard_dtype)d;
            return SHARD_OK;
        }
    for (size_t i = 0; i < sizeof st_other_dtypes / sizeof st_other_dtypes[0]; i++)
        if (strcmp(s, st_other_dtypes[i]) == 0)
            return bad(f,
                       "tensor '%s': field 'dtype' is '%s', which shard does not support (it reads F32, F64, BF16, "
                       "F16, I8, I32, I64, U8)",
                       tensor, s);
    return bad(f,
               "tensor '%s': field 'dtype' is '%.40s', an unknown dtype (valid: F32, F64, BF16, F16, I8, I32, I64, U8)",
               tensor, s);
}

/* A non-negative integer field entry. */
static shard_status parse_count(shard_safetensors *f, const char *tensor, const char *field, size_t index,
                                const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        char t[64];
        json_text(v, t, sizeof t);
        return bad(f, "tensor '%s': field '%s' entry %zu is %s, expected a non-negative integer", tensor, field, index,
                   t);
    }
    *out = (uint64_t)json_integer_value(v);
    return SHARD_OK;
}

static shard_status parse_entry(shard_safetensors *f, const char *tensor, const json_t *v, shard_st_entry *e) {
    if (!json_is_object(v)) return bad(f, "tensor '%s': its entry is not an object", tensor);
    SHARD_CHECK(parse_dtype(f, tensor, json_object_get(v, "dtype"), &e->dtype));
    const json_t *shape = json_object_get(v, "shape"), *offsets = json_object_get(v, "data_offsets");
    if (!shape) return bad(f, "tensor '%s': field 'shape' is missing", tensor);
    if (!json_is_array(shape)) return bad(f, "tensor '%s': field 'shape' is not an array", tensor);
    if (json_array_size(shape) > SHARD_MAX_DIMS)
        return bad(f, "tensor '%s': field 'shape' has %zu dims, at most %d are supported", tensor,
                   json_array_size(shape), SHARD_MAX_DIMS);
    e->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = 0; d < e->ndim; d++) {
        uint64_t n;
        SHARD_CHECK(parse_count(f, tensor, "shape", (size_t)d, json_array_get(shape, (size_t)d), &n));
        e->shape[d] = (size_t)n;
        overflow |= __builtin_mul_overflow(numel, n, &numel);
    }
    if (!offsets) return bad(f, "tensor '%s': field 'data_offsets' is missing", tensor);
    if (!json_is_array(offsets) || json_array_size(offsets) != 2)
        return bad(f, "tensor '%s': field 'data_offsets' is not a [begin, end] pair", tensor);
    SHARD_CHECK(parse_count(f, tensor, "data_offsets", 0, json_array_get(offsets, 0), &e->begin));
    SHARD_CHECK(parse_count(f, tensor, "data_offsets", 1, json_array_get(offsets, 1), &e->end));
    if (e->begin > e->end)
        return bad(f, "tensor '%s': field 'data_offsets' [%llu, %llu) ends before it begins", tensor,
                   (unsigned long long)e->begin, (unsigned long long)e->end);
    uint64_t bytes;
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)shard_dtype_size(e->dtype), &bytes))
        return bad(f, "tensor '%s': field 'shape': its element count times %zu bytes overflows 64 bits", tensor,
                   shard_dtype_size(e->dtype));
    if (bytes != e->end - e->begin)
        return bad(f, "tensor '%s': field 'data_offsets' [%llu, %llu) holds %llu bytes, but its shape of %s needs %llu",
                   tensor, (unsigned long long)e->begin, (unsigned long long)e->end,
                   (unsigned long long)(e->end - e->begin), st_dtypes[e->dtype], (unsigned long long)bytes);
    return SHARD_OK;
}

static shard_status parse_metadata(shard_safetensors *f, json_t *meta) {
    if (!json_is_object(meta)) return bad(f, "field '__metadata__' is not an object");
    size_t n = json_object_size(meta), i = 0;
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", f->name);
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value) {
        if (!json_is_string(value)) {
            char t[64];
            json_text(value, t, sizeof t);
            return bad(f, "field '__metadata__': the value of '%s' is %s, not a string", key, t);
        }
        if (strlen(json_string_value(value)) != json_string_length(value)) /* it would be cut at the NUL */
            return bad(f, "field '__metadata__': the value of '%s' contains a NUL byte", key);
        f->meta_keys[i] = strdup(key);
        f->meta_values[i] = strdup(json_string_value(value));
        f->meta_count = ++i;
        if (!f->meta_keys[i - 1] || !f->meta_values[i - 1])
            return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", f->name);
    }
    return SHARD_OK;
}

static int by_offset(const void *a, const void *b) {
    const shard_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_names(const shard_st_entry *entries, size_t a, size_t b) {
    return strcmp(entries[a].name, entries[b].name);
}

typedef struct named_index {
    const char *name;
    size_t index;
} named_index;

static int by_name(const void *a, const void *b) {
    return strcmp(((const named_index *)a)->name, ((const named_index *)b)->name);
}

/* Indices sorted by name: qsort of (name, index) pairs, O(n log n) whatever order the file's author chose. */
static shard_status sort_by_name(const shard_st_entry *entries, size_t *idx, size_t n) {
    named_index *pairs = malloc((n ? n : 1) * sizeof *pairs);
    if (!pairs) return shard_error(SHARD_ERR_NO_MEMORY, "safetensors: out of memory sorting %zu names", n);
    for (size_t i = 0; i < n; i++) pairs[i] = (named_index){entries[i].name, i};
    qsort(pairs, n, sizeof *pairs, by_name);
    for (size_t i = 0; i < n; i++) idx[i] = pairs[i].index;
    free(pairs);
    return SHARD_OK;
}

static shard_status check_layout(shard_safetensors *f) {
    qsort(f->entries, f->count, sizeof *f->entries, by_offset);
    uint64_t at = 0;
    for (size_t i = 0; i < f->count; i++) {
        const shard_st_entry *e = &f->entries[i];
        if (e->begin > at) {
            if (i == 0)
                return bad(f, "tensor '%s' starts at byte %llu of the data area, not 0 (a gap)", e->name,
                           (unsigned long long)e->begin);
            return bad(f, "a gap of %llu bytes between tensors '%s' (ends at %llu) and '%s' (begins at %llu)",
                       (unsigned long long)(e->begin - at), f->entries[i - 1].name, (unsigned long long)at, e->name,
                       (unsigned long long)e->begin);
        }
        if (e->begin < at)
            return bad(f, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", f->entries[i - 1].name,
                       (unsigned long long)f->entries[i - 1].begin, (unsigned long long)f->entries[i - 1].end, e->name,
                       (unsigned long long)e->begin, (unsigned long long)e->end);
        at = e->end;
    }
    if (at > f->data_size)
        return bad(f, "truncated: tensor '%s' ends at byte %llu of the data area, which has %llu bytes",
                   f->entries[f->count - 1].name, (unsigned long long)at, (unsigned long long)f->data_size);
    if (at < f->data_size)
        return bad(f,
                   "%llu trailing bytes after the last tensor's data (the tensors end at %llu, the data area has %llu)",
                   (unsigned long long)(f->data_size - at), (unsigned long long)at, (unsigned long long)f->data_size);
    f->by_name = malloc((f->count ? f->count : 1) * sizeof *f->by_name);
    if (!f->by_name) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", f->name);
    SHARD_CHECK(sort_by_name(f->entries, f->by_name, f->count));
    for (size_t i = 1; i < f->count; i++) /* distinct in JSON, so distinct here; kept as a guard */
        if (cmp_names(f->entries, f->by_name[i - 1], f->by_name[i]) == 0)
            return bad(f, "tensor '%s' appears twice", f->entries[f->by_name[i]].name);
    return SHARD_OK;
}

/* What a file that cannot be safetensors looks like, from its first bytes, or NULL when it starts as
 * one may (a header length below 2^40, or a binary length before '{'): the checks below say what is
 * wrong then.
 * A JSON config, a token file or an index given where weights belong is named as what it is, rather
 * than as a header length of 7886488381929032315. */
static const char *looks_like(const shard_safetensors *f) {
    const unsigned char *b = f->bytes;
    size_t n = f->size, at = 0, text = 0;
    if (n == 0) return "an empty file";
    if (n >= 8 && b[5] == 0 && b[6] == 0 && b[7] == 0) return NULL;
    int length_is_text = 1; /* else a length that is merely too large, before a '{': said as such below */
    for (size_t i = 0; i < 8 && i < n; i++) length_is_text &= b[i] >= 0x20 && b[i] < 0x7f;
    if (n >= 9 && b[8] == '{' && !length_is_text) return NULL;
    if (n >= 8 && memcmp(b, "SHRDTOK1", 8) == 0) return "a shard token file (shard data text's tokens)";
    if (n >= 4 && b[0] == 0 && b[1] == 0 && b[2] == 0x08 && b[3] >= 1 && b[3] <= 4)
        return "an IDX file (images or labels of a data set)";
    if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) return "gzip-compressed data";
    if (n >= 4 && memcmp(b, "PK\x03\x04", 4) == 0) return "a zip archive (a PyTorch .bin or .pt checkpoint?)";
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return "a Python pickle (a PyTorch .bin checkpoint?)";
    if (n >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF) at = 3; /* a byte-order mark before text */
    while (at < n && (b[at] == ' ' || b[at] == '\t' || b[at] == '\n' || b[at] == '\r')) at++;
    size_t look = n - at < 512 ? n - at : 512;
    for (text = 0; text < look; text++) { /* no control character but whitespace, and UTF-8: text */
        unsigned char c = b[at + text];
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) break;
    }
    size_t utf8 = utf8_invalid_at(b + at, look); /* a character cut at the 512th byte is still text */
    if (text < look || (utf8 < look && (look < 512 || utf8 + 4 < look))) return "binary data";
    if (at < n && (b[at] == '{' || b[at] == '['))
        return memmem(b, n < 4096 ? n : 4096, "\"weight_map\"", 12) ? "JSON text (a safetensors index: give the "
                                                                      "directory or the weight files it lists)"
                                                                    : "JSON text";
    if (n - at >= 7 && memcmp(b + at, "version", 7) == 0 && memmem(b, n < 256 ? n : 256, "git-lfs", 7))
        return "a Git LFS pointer (text: the weights were never downloaded; git lfs pull)";
    return "text";
}

static shard_status parse_header(shard_safetensors *f) {
    const char *other = looks_like(f);
    if (f->size < 8)
        return bad(f, "%zu bytes, too short for the 8-byte header length: %s, not a safetensors file", f->size,
                   other ? other : "binary data");
    if (other)
        return bad(f,
                   "not a safetensors file: it looks like %s; a safetensors file starts with an 8-byte header "
                   "length and a JSON header (give the weights' .safetensors file)",
                   other);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->bytes[i];
    if (n == 0) return bad(f, "the header length is 0");
    if (n > SHARD_SAFETENSORS_MAX_HEADER)
        return bad(f, "the header length %llu is more than the %u bytes allowed", (unsigned long long)n,
                   SHARD_SAFETENSORS_MAX_HEADER);
    if (n > f->size - 8)
        return bad(f, "the header length %llu runs past the end of the file (%zu bytes: at most %zu)",
                   (unsigned long long)n, f->size, f->size - 8);
    const unsigned char *h = f->bytes + 8;
    size_t hl = (size_t)n, badat = utf8_invalid_at(h, hl);
    if (badat < hl) return bad(f, "the header is not UTF-8 (byte 0x%02x at header offset %zu)", h[badat], badat);
    if (h[0] != '{') return bad(f, "the header does not start with '{' (it starts with byte 0x%02x)", h[0]);
    f->data = h + hl;
    f->data_size = f->size - 8 - hl;
    json_error_t err;
    json_t *root = json_loadb((const char *)h, hl, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!root) {
        if (strstr(err.text, "NUL byte in object key"))
            return bad(f, "a tensor name contains a NUL byte: %s (line %d, column %d)", err.text, err.line, err.column);
        if (strstr(err.text, "duplicate"))
            return bad(f, "the header has a duplicate key: %s (line %d, column %d)", err.text, err.line, err.column);
        return bad(f, "the header is not valid JSON: %s (line %d, column %d)", err.text, err.line, err.column);
    }
    shard_status s = SHARD_OK;
    size_t tensors = json_object_size(root) - (json_object_get(root, "__metadata__") ? 1 : 0);
    f->entries = calloc(tensors ? tensors : 1, sizeof *f->entries);
    if (!f->entries) s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory for %zu tensors", f->name, tensors);
    for (void *it = json_object_iter(root); it && s == SHARD_OK; it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        size_t key_len = json_object_iter_key_len(it);
        json_t *value = json_object_iter_value(it);
        if (key_len == strlen("__metadata__") && strcmp(key, "__metadata__") == 0) {
            s = parse_metadata(f, value);
            continue;
        }
        if (key_len == 0) {
            s = bad(f, "a tensor has an empty name");
            break;
        }
        if (strlen(key) != key_len) {
            s = bad(f, "tensor '%s...': its name contains a NUL byte (at %zu)", key, strlen(key));
            break;
        }
        shard_st_entry *e = &f->entries[f->count];
        e->name = strdup(key);
        if (!e->name) {
            s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", f->name);
            break;
        }
        f->count++;
        s = parse_entry(f, key, value, e);
    }
    json_decref(root);
    if (s == SHARD_OK) s = check_layout(f);
    return s;
}

/* ---------------------------------------------------------------- open / close */

static shard_status finish_parse(shard_safetensors *f, shard_safetensors **out) {
    shard_status s = parse_header(f);
    if (s < 0) {
        shard_safetensors_close(f);
        return s;
    }
    *out = f;
    return SHARD_OK;
}

shard_status shard_safetensors_parse(const void *bytes, size_t size, const char *name, shard_safetensors **out) {
    if (!out || (!bytes && size)) return shard_error(SHARD_ERR_INVALID_ARG, "shard_safetensors_parse: NULL argument");
    *out = NULL;
    shard_safetensors *f = calloc(1, sizeof *f);
    if (!f) return shard_error(SHARD_ERR_NO_MEMORY, "shard_safetensors_parse: out of memory");
    snprintf(f->name, sizeof f->name, "%s", name ? name : "(memory)");
    f->bytes = bytes, f->size = size;
    return finish_parse(f, out);
}

shard_status shard_safetensors_open(const char *path, shard_safetensors **out) {
    if (!path || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_safetensors_open: NULL argument");
    *out = NULL;
    int fd = -1;
    uint64_t size = 0;
    SHARD_CHECK(shard_file_open(path, "cannot open", 0, &fd, &size));
    shard_safetensors *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        return shard_error(SHARD_ERR_NO_MEMORY, "shard_safetensors_open: out of memory");
    }
    snprintf(f->name, sizeof f->name, "%s", path);
    f->size = (size_t)size;
    static const unsigned char empty[1];
    f->bytes = empty;
    if (f->size > 0) {
        void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(f);
            return shard_error(SHARD_ERR_IO, "%s: cannot map %zu bytes: %s", path, (size_t)size, strerror(e));
        }
        f->map = map;
        f->bytes = map;
    }
    close(fd);
    return finish_parse(f, out);
}

void shard_safetensors_close(shard_safetensors *f) {
    if (!f) return;
    for (size_t i = 0; i < f->count; i++) free((char *)f->entries[i].name);
    for (size_t i = 0; i < f->meta_count; i++) free(f->meta_keys[i]), free(f->meta_values[i]);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->entries);
    free(f->by_name);
    if (f->map) munmap(f->map, f->size);
    free(f);
}

/* ---------------------------------------------------------------- queries */

size_t shard_safetensors_count(const shard_safetensors *f) { return f ? f->count : 0; }

const shard_st_entry *shard_safetensors_entry(const shard_safetensors *f, size_t i) {
    return f && i < f->count ? &f->entries[i] : NULL;
}

const shard_st_entry *shard_safetensors_find(const shard_safetensors *f, const char *name) {
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->entries[f->by_name[mid]].name, name);
        if (c == 0) return &f->entries[f->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const void *shard_safetensors_data(const shard_safetensors *f, const shard_st_entry *e) {
    return f && e ? f->data + e->begin : NULL;
}

size_t shard_safetensors_metadata_count(const shard_safetensors *f) { return f ? f->meta_count : 0; }

void shard_safetensors_metadata_pair(const shard_safetensors *f, size_t i, const char **key, const char **value) {
    *key = f && i < f->meta_count ? f->meta_keys[i] : NULL;
    *value = f && i < f->meta_count ? f->meta_values[i] : NULL;
}

const char *shard_safetensors_metadata(const shard_safetensors *f, const char *key) {
    for (size_t i = 0; f && key && i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

shard_status shard_safetensors_tensor(const shard_safetensors *f, const char *name, shard_mem_category category,
                                      shard_tensor **out, int *copied) {
    if (!f || !name || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_safetensors_tensor: NULL argument");
    *out = NULL;
    const shard_st_entry *e = shard_safetensors_find(f, name);
    if (!e)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: no tensor named '%s' (%zu tensors)", f->name, name, f->count);
    const unsigned char *data = f->data + e->begin;
    size_t es = shard_dtype_size(e->dtype);
    if ((uintptr_t)data % es == 0) {
        shard_tensor *v = calloc(1, sizeof *v);
        if (!v) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", f->name);
        v->dtype = e->dtype, v->ndim = e->ndim, v->data = (void *)data, v->category = category;
        size_t stride = 1;
        for (int d = e->ndim - 1; d >= 0; d--) v->shape[d] = e->shape[d], v->strides[d] = stride, stride *= e->shape[d];
        *out = v;
        if (copied) *copied = 0;
        return SHARD_OK;
    }
    SHARD_CHECK(shard_tensor_create(e->dtype, e->ndim, e->shape, category, out));
    memcpy((*out)->data, data, (size_t)(e->end - e->begin));
    if (copied) *copied = 1;
    return SHARD_OK;
}
