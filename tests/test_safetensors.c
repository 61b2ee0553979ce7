/* test_safetensors.c — unit tests (cmocka) for the safetensors reader and
 * writer: round trips of every dtype (scalars, empty and strided tensors,
 * metadata), zero-copy views, the committed reference fixture written by
 * tools/reference (numpy), and a malformed-file corpus with one case per rule
 * of the format, each refused with the message that names it.
 *
 *   test_safetensors [--write-for-python FILE] [--write-corpus DIR]
 * --write-for-python writes the file tools/reference checks from Python;
 * --write-corpus writes the malformed corpus and some valid files (the fuzz
 * seeds in tests/fuzz/safetensors_seeds were made this way). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard/shard.h"
#include "shard/safetensors.h"

#ifndef SHARD_FIXTURE_DIR
#define SHARD_FIXTURE_DIR "tests/fixtures"
#endif

/* ---------------------------------------------------------------- the reference tensors */

/* The values both sides agree on (tools/reference/safetensors_ref.py computes the same). */
typedef struct ref_tensor {
    const char *name;
    shard_dtype dtype;
    int ndim;
    size_t shape[3];
} ref_tensor;

static const ref_tensor refs[] = {
    {"f32", SHARD_F32, 2, {3, 4, 0}},  {"f64", SHARD_F64, 1, {5, 0, 0}}, {"bf16", SHARD_BF16, 2, {2, 3, 0}},
    {"f16", SHARD_F16, 1, {4, 0, 0}},  {"i8", SHARD_I8, 1, {6, 0, 0}},   {"i32", SHARD_I32, 2, {2, 2, 0}},
    {"i64", SHARD_I64, 1, {3, 0, 0}},  {"u8", SHARD_U8, 3, {2, 1, 3}},   {"scalar", SHARD_F32, 0, {0, 0, 0}},
    {"empty", SHARD_U8, 2, {0, 3, 0}},
};
enum { NREFS = sizeof refs / sizeof refs[0] };

static double ref_value(const ref_tensor *r, size_t i) {
    switch (r->dtype) {
    case SHARD_F32: return r->ndim == 0 ? 42.5 : (double)i * 0.5 - 1.0;
    case SHARD_F64: return (double)i / 3.0;
    case SHARD_BF16: return (double)i * 0.25 - 0.5;
    case SHARD_F16: return (double)i * 0.125;
    case SHARD_I8: return (double)i - 3.0;
    case SHARD_I32: return (double)i * 1000.0 - 7.0;
    case SHARD_I64: return (double)i * 1099511627776.0; /* i * 2^40 */
    default: return (double)(i * 7 % 256);
    }
}

static shard_tensor *ref_make(const ref_tensor *r) {
    shard_tensor *t = NULL;
    assert_int_equal(shard_tensor_create(r->dtype, r->ndim, r->shape, SHARD_MEM_OTHER, &t), SHARD_OK);
    for (size_t i = 0; i < shard_tensor_numel(t); i++) shard_tensor_set(t, i, ref_value(r, i));
    return t;
}

static void ref_check(const shard_safetensors *f) {
    assert_int_equal(shard_safetensors_count(f), NREFS);
    for (size_t k = 0; k < NREFS; k++) {
        const shard_st_entry *e = shard_safetensors_find(f, refs[k].name);
        if (!e) fail_msg("tensor %s missing", refs[k].name);
        assert_int_equal(e->dtype, refs[k].dtype);
        assert_int_equal(e->ndim, refs[k].ndim);
        for (int d = 0; d < e->ndim; d++) assert_int_equal(e->shape[d], refs[k].shape[d]);
        shard_tensor *t = NULL, *want = ref_make(&refs[k]);
        int copied = -1;
        assert_int_equal(shard_safetensors_tensor(f, refs[k].name, SHARD_MEM_PARAMS, &t, &copied), SHARD_OK);
        if (!shard_tensor_equal_bits(t, want)) fail_msg("tensor %s differs", refs[k].name);
        shard_tensor_destroy(t);
        shard_tensor_destroy(want);
    }
}

static void write_refs(const char *path) {
    shard_tensor *ts[NREFS];
    const char *names[NREFS];
    for (size_t k = 0; k < NREFS; k++) ts[k] = ref_make(&refs[k]), names[k] = refs[k].name;
    const char *keys[2] = {"format", "written_by"}, *values[2] = {"pt", "shard"};
    assert_int_equal(shard_safetensors_write(path, names, (const shard_tensor *const *)ts, NREFS, keys, values, 2),
                     SHARD_OK);
    for (size_t k = 0; k < NREFS; k++) shard_tensor_destroy(ts[k]);
}

/* ---------------------------------------------------------------- round trips */

static char tmp_dir[256];

static void tmp_path(char *out, size_t out_bytes, const char *name) {
    if (!tmp_dir[0]) {
        snprintf(tmp_dir, sizeof tmp_dir, "/tmp/shard-st-XXXXXX");
        assert_non_null(mkdtemp(tmp_dir));
    }
    snprintf(out, out_bytes, "%s/%s", tmp_dir, name);
}

static void round_trip(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "refs.safetensors");
    write_refs(path);
    shard_safetensors *f = NULL;
    assert_int_equal(shard_safetensors_open(path, &f), SHARD_OK);
    ref_check(f);
    assert_string_equal(shard_safetensors_metadata(f, "written_by"), "shard");
    assert_int_equal(shard_safetensors_metadata_count(f), 2);
    assert_null(shard_safetensors_metadata(f, "nope"));
    assert_null(shard_safetensors_find(f, "nope"));
    /* the data area starts 8-byte aligned: aligned tensors are views of the mapping, others copies */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    for (size_t i = 0; i < shard_safetensors_count(f); i++) {
        const shard_st_entry *e = shard_safetensors_entry(f, i);
        shard_tensor *t = NULL;
        int copied = -1;
        assert_int_equal(shard_safetensors_tensor(f, e->name, SHARD_MEM_PARAMS, &t, &copied), SHARD_OK);
        assert_int_equal(copied, e->begin % shard_dtype_size(e->dtype) != 0); /* data area starts 8-aligned */
        if (!copied) assert_null(t->storage);
        shard_tensor_destroy(t);
        if (i) assert_true(e->begin == shard_safetensors_entry(f, i - 1)->end); /* in offset order */
    }
    const shard_st_entry *first = shard_safetensors_entry(f, 0);
    assert_int_equal(((uintptr_t)shard_safetensors_data(f, first)) % 8, 0);
    shard_safetensors_close(f);
    /* a strided view is written as its logical contents */
    size_t shape[2] = {4, 6};
    shard_tensor *big = NULL, *view = NULL, *packed = NULL;
    assert_int_equal(shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &big), SHARD_OK);
    for (size_t i = 0; i < 24; i++) shard_tensor_set(big, i, (double)i);
    assert_int_equal(shard_tensor_narrow(big, 1, 2, 3, &view), SHARD_OK);
    const char *name = "cols";
    assert_int_equal(shard_safetensors_write(path, &name, (const shard_tensor *const *)&view, 1, NULL, NULL, 0),
                     SHARD_OK);
    assert_int_equal(shard_safetensors_open(path, &f), SHARD_OK);
    assert_int_equal(shard_safetensors_tensor(f, "cols", SHARD_MEM_OTHER, &packed, NULL), SHARD_OK);
    for (size_t r = 0; r < 4; r++)
        for (size_t c = 0; c < 3; c++) assert_true(shard_tensor_get(packed, r * 3 + c) == (double)(r * 6 + 2 + c));
    shard_tensor_destroy(packed);
    shard_safetensors_close(f);
    shard_tensor_destroy(view);
    shard_tensor_destroy(big);
    /* the writer refuses bad requests without leaving files behind */
    const char *dup[2] = {"a", "a"};
    shard_tensor *two[2];
    size_t one[1] = {1};
    assert_int_equal(shard_tensor_create(SHARD_F32, 1, one, SHARD_MEM_OTHER, &two[0]), SHARD_OK);
    two[1] = two[0];
    char other[512];
    tmp_path(other, sizeof other, "dup.safetensors");
    assert_int_equal(shard_safetensors_write(other, dup, (const shard_tensor *const *)two, 2, NULL, NULL, 0),
                     SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "the tensor name 'a' is used twice"));
    assert_int_equal(access(other, F_OK), -1);
    shard_st_entry e = {.name = "x", .dtype = SHARD_F32, .ndim = 1, .shape = {4}};
    shard_st_writer *w = NULL;
    assert_int_equal(shard_st_writer_open(other, &e, 1, NULL, NULL, 0, &w), SHARD_OK);
    float four[4] = {1, 2, 3, 4};
    assert_int_equal(shard_st_writer_write(w, four, 8), SHARD_OK);
    assert_int_equal(shard_st_writer_commit(w), SHARD_ERR_INVALID_ARG); /* 8 of 16 bytes */
    assert_non_null(strstr(shard_last_error(), "8 bytes of data written, the header declares 16"));
    assert_int_equal(access(other, F_OK), -1);
    /* what a reader would refuse or lose is refused before a byte is written: a size past JSON's signed 64 bits,
     * a metadata key given twice (one value would be dropped) */
    shard_st_entry huge = {.name = "h", .dtype = SHARD_U8, .ndim = 1, .shape = {(size_t)1 << 63}};
    assert_int_equal(shard_st_writer_open(other, &huge, 1, NULL, NULL, 0, &w), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "past 2^63 - 1"));
    const char *keys[2] = {"step", "step"}, *values[2] = {"1", "2"};
    assert_int_equal(shard_st_writer_open(other, &e, 1, keys, values, 2, &w), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "the metadata key 'step' is given twice"));
    assert_int_equal(access(other, F_OK), -1);
    /* a crashed run of the same pid (a container's pid 1, restarted) left temporary files under the names
     * a pid-and-counter scheme would pick again: the write still goes through */
    char stale[600];
    for (int k = 0; k < 256; k++) {
        snprintf(stale, sizeof stale, "%s.tmp-%d-%d", other, (int)getpid(), k);
        FILE *sf = fopen(stale, "w");
        if (sf) fclose(sf);
    }
    const char *xname = "x";
    assert_int_equal(shard_safetensors_write(other, &xname, (const shard_tensor *const *)two, 1, NULL, NULL, 0),
                     SHARD_OK);
    assert_int_equal(access(other, F_OK), 0);
    for (int k = 0; k < 256; k++) {
        snprintf(stale, sizeof stale, "%s.tmp-%d-%d", other, (int)getpid(), k);
        unlink(stale);
    }
    unlink(other);
    shard_tensor_destroy(two[0]);
}

/* The committed fixture, written by tools/reference/safetensors_ref.py with numpy. */
static void reference_fixture(void **state) {
    (void)state;
    shard_safetensors *f = NULL;
    if (shard_safetensors_open(SHARD_FIXTURE_DIR "/reference.safetensors", &f) < 0) fail_msg("%s", shard_last_error());
    ref_check(f);
    assert_string_equal(shard_safetensors_metadata(f, "written_by"), "numpy");
    shard_safetensors_close(f);
}

/* ---------------------------------------------------------------- the malformed corpus */

typedef struct malformed {
    const char *name;   /* file name in the corpus */
    const char *header; /* NULL: raw bytes below */
    size_t data_bytes;  /* data area after the header */
    const char *expect; /* in the error message */
} malformed;

#define T1 "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
static const malformed corpus[] = {
    {"len_zero", "", 0, "the header length is 0"},
    {"not_utf8", "{\"t\xff\":{}}", 0, "the header is not UTF-8 (byte 0xff at header offset 3)"},
    {"overlong_utf8", "{\"\xc0\xaf\":{}}", 0, "the header is not UTF-8"},
    {"not_json", "{\"t\": {\"dtype\": }", 0, "the header is not valid JSON"},
    {"not_brace", "[{\"t\":1}]", 0, "the header does not start with '{' (it starts with byte 0x5b)"},
    {"leading_space", " {}", 0, "does not start with '{'"},
    {"dup_top", "{" T1 "," T1 "}", 8, "duplicate key"},
    {"dup_nested", "{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "duplicate key"},
    {"dup_meta", "{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, "duplicate key"},
    {"unknown_dtype", "{\"t\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "tensor 't': field 'dtype' is 'F33', an unknown dtype"},
    {"unsupported_dtype", "{\"t\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
     "field 'dtype' is 'BOOL', which shard does not support"},
    {"dtype_not_string", "{\"t\":{\"dtype\":3,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "field 'dtype' is 3, not a string"},
    {"missing_dtype", "{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 't': field 'dtype' is missing"},
    {"shape_float", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2.5],\"data_offsets\":[0,8]}}", 8,
     "tensor 't': field 'shape' entry 1 is 2.5, expected a non-negative integer"},
    {"shape_negative", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
     "field 'shape' entry 0 is -2, expected a non-negative integer"},
    {"shape_string", "{\"t\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
     "field 'shape' entry 0 is \"2\""},
    {"missing_shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "field 'shape' is missing"},
    {"shape_not_array", "{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
     "field 'shape' is not an array"},
    {"nine_dims", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
     "field 'shape' has 9 dims, at most 8"},
    {"missing_offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "field 'data_offsets' is missing"},
    {"offsets_not_pair", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
     "field 'data_offsets' is not a [begin, end] pair"},
    {"offsets_float", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8,
     "field 'data_offsets' entry 1 is 8.0"},
    {"offsets_negative", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
     "field 'data_offsets' entry 0 is -8"},
    {"offsets_reversed", "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
     "ends before it begins"},
    {"size_overflow", "{\"t\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8,
     "its element count times 8 bytes overflows 64 bits"},
    {"size_mismatch", "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     "field 'data_offsets' [0, 8) holds 8 bytes, but its shape of F32 needs 12"},
    {"gap",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_"
     "offsets\":[3,5]}}",
     5, "a gap of 1 bytes between tensors 'a' (ends at 2) and 'b' (begins at 3)"},
    {"overlap",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_"
     "offsets\":[2,4]}}",
     4, "tensors 'a' [0, 3) and 'b' [2, 4) overlap"},
    {"not_from_zero", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3,
     "tensor 'a' starts at byte 1 of the data area, not 0"},
    {"trailing", "{" T1 "}", 12, "4 trailing bytes after the last tensor's data"},
    {"truncated", "{" T1 "}", 5, "truncated: tensor 't' ends at byte 8 of the data area, which has 5 bytes"},
    {"empty_name", "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "a tensor has an empty name"},
    {"nul_in_name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
     "a tensor name contains a NUL byte"},
    {"meta_not_string", "{\"__metadata__\":{\"step\":3}}", 0,
     "field '__metadata__': the value of 'step' is 3, not a string"},
    {"meta_not_object", "{\"__metadata__\":[1]}", 0, "field '__metadata__' is not an object"},
    {"entry_not_object", "{\"t\":[1]}", 0, "tensor 't': its entry is not an object"},
    {"nul_in_dtype", "{\"t\":{\"dtype\":\"F32\\u0000junk\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "tensor 't': field 'dtype' contains a NUL byte"},
    {"nul_in_meta_value", "{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0,
     "field '__metadata__': the value of 'k' contains a NUL byte"},
};
enum { NCORPUS = sizeof corpus / sizeof corpus[0] };

/* The file bytes of a case: length, header, then data bytes. */
static unsigned char *build(const malformed *m, size_t *size) {
    size_t hl = strlen(m->header);
    *size = 8 + hl + m->data_bytes;
    unsigned char *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, m->header, hl);
    return b;
}

static void expect_refusal(const void *bytes, size_t size, const char *name, const char *expect) {
    shard_safetensors *f = NULL;
    shard_status s = shard_safetensors_parse(bytes, size, name, &f);
    if (s >= 0) fail_msg("%s: accepted, expected a refusal containing: %s", name, expect);
    assert_null(f);
    const char *msg = shard_last_error();
    if (!strstr(msg, expect) || strncmp(msg, name, strlen(name)) != 0)
        fail_msg("%s: message '%s' lacks '%s' (or does not start with the file name)", name, msg, expect);
    if (strchr(msg, '\n')) fail_msg("%s: message has several lines: %s", name, msg);
}

static void malformed_corpus(void **state) {
    (void)state;
    for (size_t i = 0; i < NCORPUS; i++) {
        size_t size;
        unsigned char *b = build(&corpus[i], &size);
        expect_refusal(b, size, corpus[i].name, corpus[i].expect);
        free(b);
    }
    /* the length field itself */
    unsigned char raw[16] = {0};
    expect_refusal(raw, 5, "short", "5 bytes, too short for the 8-byte header length");
    expect_refusal(raw, 0, "empty", "0 bytes, too short");
    uint64_t lens[3] = {100000001ull, UINT64_MAX, 9};
    const char *want[3] = {"the header length 100000001 is more than the 100000000 bytes allowed",
                           "is more than the 100000000 bytes allowed",
                           "the header length 9 runs past the end of the file (16 bytes: at most 8)"};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 8; i++) raw[i] = (unsigned char)(lens[k] >> (8 * i));
        raw[8] = '{';
        expect_refusal(raw, 16, "len", want[k]);
    }
    /* through a real file as well: names the path */
    char path[512];
    tmp_path(path, sizeof path, "trailing.safetensors");
    size_t size, trailing = 0;
    while (strcmp(corpus[trailing].name, "trailing") != 0) trailing++;
    unsigned char *b = build(&corpus[trailing], &size);
    FILE *fp = fopen(path, "wb");
    fwrite(b, 1, size, fp);
    fclose(fp);
    free(b);
    shard_safetensors *f = NULL;
    assert_int_equal(shard_safetensors_open(path, &f), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), path));
    assert_non_null(strstr(shard_last_error(), "trailing bytes"));
    assert_int_equal(shard_safetensors_open("/nonexistent/x.safetensors", &f), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), "cannot open"));
}

/* A well-formed header with trailing spaces, metadata and unknown extra fields is accepted. */
static void accepted_variants(void **state) {
    (void)state;
    const malformed ok = {
        "ok", "{\"__metadata__\":{\"k\":\"v\"}," T1 ",\"z\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[8,9]}}   ",
        9, NULL};
    size_t size;
    unsigned char *b = build(&ok, &size);
    shard_safetensors *f = NULL;
    if (shard_safetensors_parse(b, size, "ok", &f) < 0) fail_msg("%s", shard_last_error());
    assert_int_equal(shard_safetensors_count(f), 2);
    assert_string_equal(shard_safetensors_metadata(f, "k"), "v");
    assert_int_equal(shard_safetensors_find(f, "z")->ndim, 0);
    shard_safetensors_close(f);
    free(b);
}

/* ---------------------------------------------------------------- helper modes */

static int write_corpus(const char *dir) {
    mkdir(dir, 0755);
    char path[1024];
    for (size_t i = 0; i < NCORPUS; i++) {
        size_t size;
        unsigned char *b = build(&corpus[i], &size);
        snprintf(path, sizeof path, "%s/%s", dir, corpus[i].name);
        FILE *fp = fopen(path, "wb");
        if (!fp || fwrite(b, 1, size, fp) != size) return 1;
        fclose(fp);
        free(b);
    }
    snprintf(path, sizeof path, "%s/valid_refs", dir);
    write_refs(path);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-for-python") == 0) {
        write_refs(argv[2]);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip),
        cmocka_unit_test(reference_fixture),
        cmocka_unit_test(malformed_corpus),
        cmocka_unit_test(accepted_variants),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (tmp_dir[0]) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    }
    return rc;
}
