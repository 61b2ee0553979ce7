/* test_data.c — unit tests (cmocka) for the data layer: token files (both
 * widths, corruption caught), the byte-level tokenizer, batches that depend
 * only on (seed, step, row) so any split over ranks gives the same global
 * batch, and the IDX reader (gzip and plain, refusals, and Debian's
 * Fashion-MNIST test set), and the batch sources (batch.h): the same rows
 * whatever the split over loads, too many rows refused, a batch of the wrong
 * shape refused by a model's set_batch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "shard/batch.h"
#include "shard/data.h"
#include "shard/model.h"

static char dir[64];

static void path_of(char *out, size_t n, const char *name) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/shard-data-XXXXXX");
        assert_non_null(mkdtemp(dir));
    }
    snprintf(out, n, "%s/%s", dir, name);
}

static void token_files(void **state) {
    (void)state;
    char path[128];
    path_of(path, sizeof path, "t.tokens");
    uint32_t toks[5] = {1, 255, 0, 7, 300};
    assert_int_equal(shard_tokens_write(path, toks, 5, 256), SHARD_ERR_INVALID_ARG); /* 300 >= 256 */
    for (uint32_t vocab = 512; vocab <= 100000; vocab += 99488) {                    /* 2 and 4 bytes per token */
        assert_int_equal(shard_tokens_write(path, toks, 5, vocab), SHARD_OK);
        shard_tokens *t = NULL;
        assert_int_equal(shard_tokens_open(path, &t), SHARD_OK);
        assert_int_equal(shard_tokens_count(t), 5);
        assert_int_equal(shard_tokens_vocab(t), vocab);
        for (size_t i = 0; i < 5; i++) assert_int_equal(shard_tokens_at(t, i), toks[i]);
        shard_tokens_close(t);
    }
    /* a header whose vocabulary is smaller than a token (the checksum covers the tokens only) */
    assert_int_equal(shard_tokens_write(path, toks, 5, 512), SHARD_OK);
    FILE *f = fopen(path, "r+b");
    fseek(f, 16, SEEK_SET);
    fputc(0, f), fputc(1, f), fputc(0, f), fputc(0, f); /* vocab 256, little-endian */
    fclose(f);
    shard_tokens *small = NULL;
    assert_int_equal(shard_tokens_open(path, &small), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), "token 300 at index 4 is outside the header's vocabulary (ids 0..255)"));
    assert_int_equal(shard_tokens_write(path, toks, 5, 100000), SHARD_OK);
    f = fopen(path, "r+b"); /* flip a token byte */
    fseek(f, -1, SEEK_END);
    fputc(0x77, f);
    fclose(f);
    shard_tokens *t = NULL;
    assert_int_equal(shard_tokens_open(path, &t), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), "checksum mismatch"));
    f = fopen(path, "r+b");
    fputc('X', f);
    fclose(f);
    assert_int_equal(shard_tokens_open(path, &t), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), "not a shard token file"));
}

static void tokenizer_and_batches(void **state) {
    (void)state;
    char a[128], b[128], out[128];
    path_of(a, sizeof a, "a.txt");
    path_of(b, sizeof b, "b.txt");
    path_of(out, sizeof out, "tok");
    FILE *f = fopen(a, "wb");
    for (int i = 0; i < 900; i++) fputc("The quick brown fox\n"[i % 20], f);
    fclose(f);
    f = fopen(b, "wb");
    for (int i = 0; i < 100; i++) fputc(i + 128, f);
    fclose(f);
    const char *files[2] = {a, b};
    assert_int_equal(shard_data_text(files, 2, out, 0.1, NULL), SHARD_OK);
    char tp[160], vp[160];
    snprintf(tp, sizeof tp, "%s/train.tokens", out);
    snprintf(vp, sizeof vp, "%s/val.tokens", out);
    shard_tokens *train = NULL, *val = NULL;
    assert_int_equal(shard_tokens_open(tp, &train), SHARD_OK);
    assert_int_equal(shard_tokens_open(vp, &val), SHARD_OK);
    assert_int_equal(shard_tokens_count(train), 900);
    assert_int_equal(shard_tokens_count(val), 100);
    assert_int_equal(shard_tokens_at(train, 0), 'T'); /* token id = byte value */
    assert_int_equal(shard_tokens_at(val, 5), 133);
    /* batches: a function of (seed, step, row) only */
    enum { B = 6, T = 16 };
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    assert_int_equal(shard_tokens_batch(train, 7, 3, 0, B, T, in, tg), SHARD_OK);
    assert_int_equal(shard_tokens_batch(train, 7, 3, 0, B, T, in2, tg2), SHARD_OK);
    assert_memory_equal(in, in2, sizeof in);
    for (int r = 0; r < B; r++) /* targets are the inputs shifted by one */
        for (int i = 0; i + 1 < T; i++) assert_int_equal(tg[r * T + i], in[r * T + i + 1]);
    for (int ranks = 2; ranks <= 3; ranks++) /* the same rows, split over ranks */
        for (int k = 0; k < ranks; k++) {
            size_t first = (size_t)(B * k / ranks), rows = (size_t)(B * (k + 1) / ranks) - first;
            assert_int_equal(shard_tokens_batch(train, 7, 3, first, rows, T, in2, tg2), SHARD_OK);
            assert_memory_equal(in + first * T, in2, rows * T * sizeof *in);
            assert_memory_equal(tg + first * T, tg2, rows * T * sizeof *tg);
        }
    assert_int_equal(shard_tokens_batch(train, 7, 4, 0, B, T, in2, tg2), SHARD_OK);
    assert_true(memcmp(in, in2, sizeof in) != 0); /* another step, another batch */
    assert_int_equal(shard_tokens_batch(val, 7, 3, 0, 1, 100, in2, tg2), SHARD_ERR_INVALID_ARG); /* 100 tokens < 101 */
    shard_tokens_close(train);
    shard_tokens_close(val);
    /* an output that could not be replaced (a directory): nothing is written, the old set stays whole */
    char other[128], blocker[160];
    path_of(other, sizeof other, "tok2");
    snprintf(blocker, sizeof blocker, "%s/val.tokens", other);
    assert_int_equal(mkdir(other, 0755), 0);
    assert_int_equal(mkdir(blocker, 0755), 0);
    assert_int_equal(shard_data_text(files, 2, other, 0.1, NULL), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "val.tokens exists and is not a regular file"));
    snprintf(blocker, sizeof blocker, "%s/train.tokens", other);
    assert_int_equal(access(blocker, F_OK), -1);
}

static void write_idx(const char *path, const unsigned char *head, size_t head_bytes, size_t data_bytes, int gzip) {
    if (gzip) {
        gzFile g = gzopen(path, "wb");
        gzwrite(g, head, (unsigned)head_bytes);
        for (size_t i = 0; i < data_bytes; i++) gzputc(g, (int)(i % 251));
        gzclose(g);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(head, 1, head_bytes, f);
        for (size_t i = 0; i < data_bytes; i++) fputc((int)(i % 251), f);
        fclose(f);
    }
}

static void idx(void **state) {
    (void)state;
    char path[128];
    path_of(path, sizeof path, "x.idx.gz");
    const unsigned char head[16] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4};
    for (int gzip = 0; gzip <= 1; gzip++) {
        write_idx(path, head, 16, 24, gzip);
        shard_idx x;
        assert_int_equal(shard_idx_read(path, &x), SHARD_OK);
        assert_int_equal(x.ndim, 3);
        assert_int_equal(x.dims[0], 2);
        assert_int_equal(x.dims[2], 4);
        assert_int_equal(x.count, 24);
        assert_int_equal(x.data[23], 23);
        shard_idx_free(&x);
    }
    write_idx(path, head, 16, 20, 1); /* truncated */
    shard_idx x;
    assert_int_equal(shard_idx_read(path, &x), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), "truncated: 20 of 24 data bytes"));
    for (int gzip = 0; gzip <= 1; gzip++) { /* more bytes than the dims describe */
        write_idx(path, head, 16, 25, gzip);
        assert_int_equal(shard_idx_read(path, &x), SHARD_ERR_IO);
        assert_non_null(strstr(shard_last_error(), "bytes follow the 24 the dims describe"));
    }
    write_idx(path, head, 16, 24, 1); /* a damaged gzip trailer (its CRC) */
    FILE *f = fopen(path, "r+b");
    fseek(f, -8, SEEK_END);
    int crc_byte = fgetc(f);
    fseek(f, -8, SEEK_END);
    fputc(crc_byte ^ 0xFF, f);
    fclose(f);
    assert_int_equal(shard_idx_read(path, &x), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), "x.idx.gz: unreadable"));
    const unsigned char floats[8] = {0, 0, 0x0D, 1, 0, 0, 0, 1}; /* type 0x0D: floats */
    write_idx(path, floats, 8, 4, 1);
    assert_int_equal(shard_idx_read(path, &x), SHARD_ERR_IO);
    assert_non_null(strstr(shard_last_error(), "not an IDX file of unsigned bytes"));
    /* Debian's dataset-fashion-mnist (installed by make deps) */
    assert_int_equal(shard_idx_read("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", &x), SHARD_OK);
    assert_int_equal(x.ndim, 1);
    assert_int_equal(x.dims[0], 10000);
    size_t per_class[10] = {0};
    for (size_t i = 0; i < x.count; i++) {
        assert_true(x.data[i] < 10);
        per_class[x.data[i]]++;
    }
    for (int c = 0; c < 10; c++) assert_int_equal(per_class[c], 1000);
    shard_idx_free(&x);
    assert_int_equal(shard_idx_read("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", &x), SHARD_OK);
    assert_int_equal(x.ndim, 3);
    assert_int_equal(x.dims[1], 28);
    assert_int_equal(x.dims[2], 28);
    shard_idx_free(&x);
}

/* Rows 0..7 in one load equal rows 0..3 then 4..7: the bytes of inputs and targets. */
static void same_rows_split(shard_batch_source *src, size_t in_bytes, size_t target_bytes) {
    shard_batch whole, part;
    assert_int_equal(shard_batch_source_load(src, 3, 5, 0, 8, &whole), SHARD_OK);
    assert_int_equal(whole.rows, 8);
    assert_true(whole.seed == 3 && whole.step == 5 && whole.first_row == 0);
    size_t ib = whole.input_elems * in_bytes, tb = whole.target_elems * target_bytes;
    unsigned char *in = malloc(8 * ib), *tg = malloc(8 * tb);
    assert_true(in && tg);
    memcpy(in, whole.inputs, 8 * ib), memcpy(tg, whole.targets, 8 * tb);
    for (size_t first = 0; first < 8; first += 4) {
        assert_int_equal(shard_batch_source_load(src, 3, 5, first, 4, &part), SHARD_OK);
        assert_int_equal(part.first_row, first);
        assert_memory_equal(part.inputs, in + first * ib, 4 * ib);
        assert_memory_equal(part.targets, tg + first * tb, 4 * tb);
    }
    assert_int_equal(shard_batch_source_load(src, 3, 6, 0, 8, &part), SHARD_OK); /* another step, other rows */
    assert_memory_not_equal(part.inputs, in, 8 * ib);
    /* more rows than the source was made for */
    assert_int_equal(shard_batch_source_load(src, 3, 5, 0, 9, &part), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "9 rows asked; it was made for up to 8"));
    free(in), free(tg);
}

static void batch_sources(void **state) {
    (void)state;
    char path[128];
    path_of(path, sizeof path, "b.tokens");
    uint32_t toks[400];
    for (size_t i = 0; i < 400; i++) toks[i] = (uint32_t)(i * 7 % 300);
    assert_int_equal(shard_tokens_write(path, toks, 400, 300), SHARD_OK);
    shard_batch_source *src = NULL;
    shard_batch_tokens_options to = {
        .struct_size = sizeof to, .path = path, .seq = 16, .max_rows = 8, .vocab_size = 256, .where = "g.json"};
    assert_int_equal(shard_batch_source_tokens(&to, &src), SHARD_ERR_INVALID_ARG); /* a vocabulary too small */
    assert_non_null(
        strstr(shard_last_error(), "g.json: key 'vocab_size' = 256 is smaller than the data's vocabulary (300)"));
    to.vocab_size = 300;
    assert_int_equal(shard_batch_source_tokens(&to, &src), SHARD_OK);
    shard_batch b;
    assert_int_equal(shard_batch_source_load(src, 1, 2, 0, 8, &b), SHARD_OK);
    assert_true(b.input_dtype == SHARD_I32 && b.target_dtype == SHARD_I32 && b.input_elems == 16);
    /* what shard_tokens_batch draws, the targets the next tokens */
    shard_tokens *t = NULL;
    int32_t in[8 * 16], tg[8 * 16];
    assert_int_equal(shard_tokens_open(path, &t), SHARD_OK);
    assert_int_equal(shard_tokens_batch(t, 1, 2, 0, 8, 16, in, tg), SHARD_OK);
    shard_tokens_close(t);
    assert_memory_equal(b.inputs, in, sizeof in);
    assert_memory_equal(b.targets, tg, sizeof tg);
    same_rows_split(src, sizeof(int32_t), sizeof(int32_t));
    shard_batch_source_destroy(src);

    shard_batch_images_options io = {
        .struct_size = sizeof io, .in_channels = 1, .height = 28, .width = 28, .classes = 10, .max_rows = 8};
    assert_int_equal(shard_batch_source_images(&io, &src), SHARD_OK); /* Debian's Fashion-MNIST */
    assert_int_equal(shard_batch_source_load(src, 1, 1, 0, 2, &b), SHARD_OK);
    assert_true(b.input_dtype == SHARD_F32 && b.input_elems == 784 && b.target_dtype == SHARD_I32 &&
                b.target_elems == 1);
    same_rows_split(src, sizeof(float), sizeof(int32_t));
    shard_batch_source_destroy(src);
    io.width = 27; /* images of another shape */
    assert_int_equal(shard_batch_source_images(&io, &src), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "images of shape [60000 x 28 x 28]"));

    shard_batch_teacher_options go = {
        .struct_size = sizeof go, .name = "unit", .dim = 6, .max_rows = 8, .teacher_seed = 7};
    assert_int_equal(shard_batch_source_teacher(&go, &src), SHARD_OK);
    same_rows_split(src, sizeof(float), sizeof(float));
    shard_batch_source_destroy(src);
}

/* A model's set_batch takes the rows it was made for, and refuses another dtype, another row width or
 * more rows in one line; the kind's source is the one the trainer would make. */
static void set_batch_refusals(void **state) {
    (void)state;
    shard_model *m = NULL;
    shard_model_create_options o = {.struct_size = sizeof o,
                                    .config_text = "{\"model_type\": \"mlp\", \"model_dim\": 6, \"hidden_dim\": 8}",
                                    .config_path = "mlp.json",
                                    .max_rows = 4};
    assert_int_equal(shard_model_create_with(&o, &m), SHARD_OK);
    shard_batch_source *src = NULL, *wide = NULL, *tokens = NULL;
    o.data_dir = "/tmp";
    assert_int_equal(shard_model_batch_source(&o, m, &src), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "--data /tmp: model_type 'mlp' (mlp.json) trains on rows it generates"));
    o.data_dir = NULL, o.max_rows = 8;
    assert_int_equal(shard_model_batch_source(&o, m, &src), SHARD_OK);
    shard_batch b;
    assert_int_equal(shard_batch_source_load(src, 1, 1, 0, 4, &b), SHARD_OK);
    assert_int_equal(m->ops->set_batch(m, &b), SHARD_OK);
    assert_int_equal(m->rows, 4);
    assert_int_equal(shard_batch_source_load(src, 1, 1, 0, 5, &b), SHARD_OK); /* more rows than the model's 4 */
    assert_int_equal(m->ops->set_batch(m, &b), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "model 'mlp': a batch of 5 rows; this model was made for up to 4"));
    shard_batch_teacher_options go = {
        .struct_size = sizeof go, .name = "wide", .dim = 5, .max_rows = 4, .teacher_seed = 7};
    assert_int_equal(shard_batch_source_teacher(&go, &wide), SHARD_OK);
    assert_int_equal(shard_batch_source_load(wide, 1, 1, 0, 2, &b), SHARD_OK);
    assert_int_equal(m->ops->set_batch(m, &b), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(),
                           "a batch of rows of 5 f32 inputs and 5 f32 targets; this model takes 6 "
                           "f32 inputs and 6 f32 targets per row"));
    char path[128];
    path_of(path, sizeof path, "m.tokens");
    uint32_t toks[64] = {0};
    assert_int_equal(shard_tokens_write(path, toks, 64, 256), SHARD_OK);
    shard_batch_tokens_options to = {.struct_size = sizeof to, .path = path, .seq = 6, .max_rows = 4};
    assert_int_equal(shard_batch_source_tokens(&to, &tokens), SHARD_OK);
    assert_int_equal(shard_batch_source_load(tokens, 1, 1, 0, 2, &b), SHARD_OK);
    assert_int_equal(m->ops->set_batch(m, &b), SHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(shard_last_error(), "6 i32 inputs and 6 i32 targets; this model takes 6 f32 inputs"));
    shard_batch_source_destroy(tokens), shard_batch_source_destroy(wide), shard_batch_source_destroy(src);
    shard_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(token_files),   cmocka_unit_test(tokenizer_and_batches), cmocka_unit_test(idx),
        cmocka_unit_test(batch_sources), cmocka_unit_test(set_batch_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    return rc;
}
