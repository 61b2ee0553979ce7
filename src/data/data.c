/* data.c — token files, the batch loader, the byte-level tokenizer and the
 * IDX reader (see data.h). */
#define _GNU_SOURCE
#include "shard/data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include "ckpt/atomic_file.h"
#include "core/file_read.h"
#include "shard/files.h"
#include "ckpt/ckpt_util.h"
#include "shard/files.h"

enum { HEADER_BYTES = 64 };
static const char MAGIC[8] = {'S', 'H', 'R', 'D', 'T', 'O', 'K', '1'};

static uint32_t largest_token(const shard_tokens *t);

struct shard_tokens {
    char path[PATH_MAX];
    void *map;
    size_t map_bytes, count;
    uint32_t vocab, token_bytes;
    const unsigned char *tokens;
};

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void fill_header(unsigned char *h, uint32_t width, uint32_t vocab, uint64_t count, uint64_t xxh3) {
    memset(h, 0, HEADER_BYTES);
    memcpy(h, MAGIC, 8);
    put32(h + 8, 1), put32(h + 12, width), put32(h + 16, vocab);
    put64(h + 24, count), put64(h + 32, xxh3);
}

shard_status shard_tokens_write(const char *path, const uint32_t *tokens, size_t count, uint32_t vocab) {
    if (vocab == 0 || vocab > INT32_MAX) /* what shard_tokens_open accepts: ids that fit the model's int32 */
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: vocabulary %u; valid: 1..2147483647", path, vocab);
    uint32_t width = vocab <= 65536 ? 2 : 4;
    unsigned char *buf = malloc(HEADER_BYTES + (count ? count : 1) * width);
    if (!buf) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory for %zu tokens", path, count);
    unsigned char *body = buf + HEADER_BYTES;
    for (size_t i = 0; i < count; i++) {
        if (tokens[i] >= vocab) {
            free(buf);
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: token %u at %zu is outside the vocabulary of %u", path,
                               tokens[i], i, vocab);
        }
        if (width == 2)
            body[2 * i] = (unsigned char)tokens[i], body[2 * i + 1] = (unsigned char)(tokens[i] >> 8);
        else
            put32(body + 4 * i, tokens[i]);
    }
    fill_header(buf, width, vocab, count, XXH3_64bits(body, count * width));
    shard_status s = shard__atomic_write_file(path, buf, HEADER_BYTES + count * width);
    free(buf);
    return s;
}

shard_status shard_tokens_open(const char *path, shard_tokens **out) {
    *out = NULL;
    int fd = -1;
    uint64_t size = 0;
    SHARD_CHECK(shard_file_open(path, "cannot open the token file", 0, &fd, &size));
    if (size < HEADER_BYTES) {
        close(fd);
        return shard_error(SHARD_ERR_IO, "%s: not a token file (shorter than its %d-byte header)", path, HEADER_BYTES);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return shard_error(SHARD_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    const unsigned char *h = map;
    shard_tokens *t = calloc(1, sizeof *t);
    shard_status s = t ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    if (s == SHARD_OK) {
        snprintf(t->path, sizeof t->path, "%s", path);
        t->map = map, t->map_bytes = (size_t)size, t->tokens = h + HEADER_BYTES;
        t->token_bytes = get32(h + 12), t->vocab = get32(h + 16), t->count = (size_t)get64(h + 24);
        if (memcmp(h, MAGIC, 8) != 0 || get32(h + 8) != 1)
            s = shard_error(SHARD_ERR_IO,
                            "%s: not a shard token file (it should begin with \"SHRDTOK1\" and version 1, "
                            "as `shard data text` writes)",
                            path);
        else if ((t->token_bytes != 2 && t->token_bytes != 4) || t->vocab == 0 || t->vocab > INT32_MAX)
            s = shard_error(SHARD_ERR_IO,
                            "%s: header says %u bytes per token and vocab %u; valid: 2 or 4 bytes, vocab 1.."
                            "2147483647",
                            path, t->token_bytes, t->vocab);
        else if (t->count > (t->map_bytes - HEADER_BYTES) / t->token_bytes ||
                 HEADER_BYTES + t->count * t->token_bytes != t->map_bytes)
            s = shard_error(SHARD_ERR_IO, "%s: header says %zu tokens (%zu bytes), the file holds %zu bytes of them",
                            path, t->count, t->count > SIZE_MAX / 4 ? (size_t)0 : t->count * t->token_bytes,
                            t->map_bytes - HEADER_BYTES);
        else if (XXH3_64bits(t->tokens, t->count * t->token_bytes) != get64(h + 32))
            s = shard_error(SHARD_ERR_IO, "%s: checksum mismatch: the tokens are corrupt", path);
        /* a file any tool wrote: ids the model can index (the largest found in one pass, then where) */
        int outside = s == SHARD_OK && largest_token(t) >= t->vocab;
        for (size_t i = 0; s == SHARD_OK && outside && i < t->count; i++)
            if (shard_tokens_at(t, i) >= t->vocab)
                s = shard_error(SHARD_ERR_IO,
                                "%s: token %u at index %zu is outside the header's vocabulary (ids 0..%u)", path,
                                shard_tokens_at(t, i), i, t->vocab - 1);
    }
    if (s < 0) {
        munmap(map, (size_t)size);
        free(t);
        return s;
    }
    *out = t;
    return SHARD_OK;
}

void shard_tokens_close(shard_tokens *t) {
    if (!t) return;
    munmap(t->map, t->map_bytes);
    free(t);
}

size_t shard_tokens_count(const shard_tokens *t) { return t ? t->count : 0; }
uint32_t shard_tokens_vocab(const shard_tokens *t) { return t ? t->vocab : 0; }

/* The largest id in the file: its little-endian ids read byte by byte, in a loop the compiler
 * vectorises. */
static uint32_t largest_token(const shard_tokens *t) {
    const unsigned char *p = t->tokens;
    uint32_t most = 0;
    if (t->token_bytes == 2)
        for (size_t i = 0; i < t->count; i++) {
            uint32_t v = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
            most = v > most ? v : most;
        }
    else
        for (size_t i = 0; i < t->count; i++) {
            uint32_t v = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                (uint32_t)p[4 * i + 3] << 24;
            most = v > most ? v : most;
        }
    return most;
}

uint32_t shard_tokens_at(const shard_tokens *t, size_t i) {
    const unsigned char *p = t->tokens + i * t->token_bytes;
    return t->token_bytes == 2 ? (uint32_t)(p[0] | p[1] << 8) : get32(p);
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

shard_status shard_tokens_batch(const shard_tokens *t, uint64_t seed, uint64_t step, size_t first_row, size_t rows,
                                size_t T, int32_t *inputs, int32_t *targets) {
    if (t->count < T + 1)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: %zu tokens, too few for sequences of %zu (+1 target)", t->path,
                           t->count, T);
    uint64_t starts = t->count - T; /* positions 0 .. count - T - 1 */
    for (size_t r = 0; r < rows; r++) {
        uint64_t row = first_row + r;
        uint64_t pos =
            mix(mix(seed * 0x9e3779b97f4a7c15ULL + step) ^ (row * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL)) %
            starts;
        for (size_t i = 0; i < T; i++) {
            inputs[r * T + i] = (int32_t)shard_tokens_at(t, pos + i);
            targets[r * T + i] = (int32_t)shard_tokens_at(t, pos + i + 1);
        }
    }
    return SHARD_OK;
}

/* ---------------------------------------------------------------- shard data text */

/* A token file of the byte-level tokenizer's tokens (token id = byte value, stored as uint16) written
 * from the bytes in pieces into f, opened by the caller and committed by it: the corpus is held once, as
 * bytes, and never as a whole token array. */
static shard_status write_byte_tokens(shard__atomic_file *f, const uint8_t *bytes, size_t count) {
    enum { PIECE = 1 << 16 };
    unsigned char *buf = malloc(2 * PIECE), header[HEADER_BYTES];
    XXH3_state_t *hash = XXH3_createState();
    shard_status s =
        buf && hash ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory for %zu tokens", f->path, count);
    for (int pass = 0; pass < 2 && s == SHARD_OK; pass++) { /* the checksum (it goes first), then the file */
        if (pass == 0)
            XXH3_64bits_reset(hash);
        else {
            fill_header(header, 2, 256, count, XXH3_64bits_digest(hash));
            s = shard__atomic_write(f, header, HEADER_BYTES);
        }
        for (size_t at = 0; s == SHARD_OK && at < count; at += PIECE) {
            size_t n = count - at < PIECE ? count - at : PIECE;
            for (size_t i = 0; i < n; i++) buf[2 * i] = bytes[at + i], buf[2 * i + 1] = 0; /* little-endian uint16 */
            if (pass == 0)
                XXH3_64bits_update(hash, buf, 2 * n);
            else
                s = shard__atomic_write(f, buf, 2 * n);
        }
    }
    XXH3_freeState(hash);
    free(buf);
    return s;
}

/* train.tokens, val.tokens and meta.json of out_dir, each written whole under its temporary name before
 * any is renamed into place: a write that fails (a full disk) leaves the directory's earlier files as
 * they were, not a new train.tokens beside an old val.tokens. */
static shard_status write_token_set(const char *out_dir, const uint8_t *bytes, size_t train, size_t val, size_t files) {
    static const char *const names[] = {"train.tokens", "val.tokens", "meta.json"};
    shard__atomic_file f[3];
    int opened = 0;
    char path[PATH_MAX], meta[512];
    int meta_bytes = snprintf(meta, sizeof meta,
                              "{\n  \"tokenizer\": \"bytes\",\n  \"vocab_size\": 256,\n  \"train_tokens\": %zu,\n"
                              "  \"val_tokens\": %zu,\n  \"files\": %zu\n}\n",
                              train, val, files);
    shard_status s = SHARD_OK;
    for (; s == SHARD_OK && opened < 3; opened++) {
        snprintf(path, sizeof path, "%s/%s", out_dir, names[opened]);
        if ((s = shard__atomic_open(path, &f[opened])) < 0) break;
        s = opened == 2 ? shard__atomic_write(&f[2], meta, (size_t)meta_bytes)
                        : write_byte_tokens(&f[opened], bytes + (opened ? train : 0), opened ? val : train);
    }
    int committed = 0;
    for (; s == SHARD_OK && committed < 3; committed++) s = shard__atomic_commit(&f[committed]); /* aborts itself */
    for (int i = committed; i < opened; i++) shard__atomic_abort(&f[i]); /* the failed commit aborted its own */
    return s;
}

shard_status shard_data_text(const char *const *files, size_t count, const char *out_dir, double val_fraction,
                             FILE *report) {
    if (!count) return shard_error(SHARD_ERR_INVALID_ARG, "data text: no input files");
    if (!(val_fraction >= 0 && val_fraction < 1))
        return shard_error(SHARD_ERR_INVALID_ARG, "data text: --val-fraction %g is outside [0, 1)", val_fraction);
    if (shard_dir_probe_writable(out_dir) < 0) { /* before reading a corpus that could take long */
        char why[512];
        snprintf(why, sizeof why, "%s", shard_last_error());
        return shard_error(SHARD_ERR_IO, "data text: --out %s: %s: give a directory where files can be written",
                           out_dir, why);
    }
    size_t total = 0, cap = 1 << 20;
    uint8_t *bytes = malloc(cap); /* the corpus once, as bytes: each token is one */
    if (!bytes) return shard_error(SHARD_ERR_NO_MEMORY, "data text: out of memory");
    shard_status s = SHARD_OK;
    for (size_t f = 0; f < count && s == SHARD_OK; f++) {
        /* a pipe is text too (its writer already there: one that never comes reads as the end, not a wait) */
        int fd = shard__file_open_nowait(files[f]);
        FILE *in = fd >= 0 ? fdopen(fd, "rb") : NULL;
        if (!in) {
            if (fd >= 0) close(fd);
            s = shard_error(SHARD_ERR_IO, "%s: cannot open: %s", files[f], strerror(errno));
            break;
        }
        struct stat st; /* a file or a pipe; a device such as /dev/zero would never end, a directory has no text */
        if (fstat(fileno(in), &st) == 0 &&
            ((S_ISCHR(st.st_mode) && !isatty(fileno(in))) || S_ISBLK(st.st_mode) || S_ISDIR(st.st_mode))) {
            s = shard_error(SHARD_ERR_INVALID_ARG, "%s: a %s, not a text file (give files, or a pipe)", files[f],
                            S_ISDIR(st.st_mode) ? "directory" : "device");
            fclose(in);
            break;
        }
        for (size_t got = 1; got > 0 && s == SHARD_OK;) {
            if (total == cap) {
                uint8_t *more = realloc(bytes, 2 * cap);
                if (!more) {
                    s = shard_error(SHARD_ERR_NO_MEMORY, "data text: out of memory after %zu tokens", total);
                    break;
                }
                bytes = more, cap *= 2;
            }
            got = fread(bytes + total, 1, cap - total, in);
            total += got;
        }
        if (ferror(in) && s == SHARD_OK)
            s = shard_error(SHARD_ERR_IO, "%s: cannot read: %s", files[f], strerror(errno));
        fclose(in);
    }
    if (s == SHARD_OK && total == 0)
        s = shard_error(SHARD_ERR_INVALID_ARG, "data text: the %zu input file%s hold%s no bytes: give text to tokenize",
                        count, count == 1 ? "" : "s", count == 1 ? "s" : "");
    size_t val = (size_t)((double)total * val_fraction), train = total - val;
    char path[PATH_MAX];
    if (s == SHARD_OK) s = shard__ckpt_mkdirs(out_dir);
    /* the three files are replaced together: refuse before writing any when one could not be replaced */
    static const char *const outputs[] = {"train.tokens", "val.tokens", "meta.json"};
    for (int i = 0; i < 3 && s == SHARD_OK; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", out_dir, outputs[i]);
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "data text: %s exists and is not a regular file; remove it or give "
                            "another --out",
                            path);
    }
    if (s == SHARD_OK) s = write_token_set(out_dir, bytes, train, val, count);
    if (s == SHARD_OK && report)
        fprintf(report, "data: %zu bytes from %zu file%s -> %s/train.tokens (%zu tokens), %s/val.tokens (%zu tokens)\n",
                total, count, count == 1 ? "" : "s", out_dir, train, out_dir, val);
    free(bytes);
    return s;
}

/* ---------------------------------------------------------------- IDX */

/* zlib's message for a failed read, without the "path: " it puts first */
static const char *gz_why(gzFile gz, const char *path) {
    int err = Z_OK;
    const char *why = gzerror(gz, &err);
    size_t n = strlen(path);
    return strncmp(why, path, n) == 0 && strncmp(why + n, ": ", 2) == 0 ? why + n + 2 : why;
}

shard_status shard_idx_read(const char *path, shard_idx *out) {
    memset(out, 0, sizeof *out);
    int fd = -1;
    SHARD_CHECK(shard_file_open(path, "cannot open", 0, &fd, NULL));
    gzFile gz = gzdopen(fd, "rb"); /* reads plain files too; closes fd */
    if (!gz) {
        close(fd);
        return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    unsigned char head[4 + 4 * 4];
    shard_status s = SHARD_OK;
    int got = gzread(gz, head, 4); /* zlib checks a small file's gzip trailer on this first read */
    if (got < 0)
        s = shard_error(SHARD_ERR_IO, "%s: unreadable: %s", path, gz_why(gz, path));
    else if (got != 4 || head[0] || head[1] || head[2] != 0x08 || head[3] < 1 || head[3] > 4)
        s = shard_error(SHARD_ERR_IO,
                        "%s: not an IDX file of unsigned bytes with 1 to 4 dims (magic 0x00000801.."
                        "0x00000804)",
                        path);
    if (s == SHARD_OK) {
        out->ndim = head[3];
        if (gzread(gz, head + 4, (unsigned)(4 * out->ndim)) != 4 * out->ndim)
            s = shard_error(SHARD_ERR_IO, "%s: truncated IDX header", path);
        out->count = 1;
        for (int d = 0; s == SHARD_OK && d < out->ndim; d++) {
            const unsigned char *p = head + 4 + 4 * d;
            out->dims[d] = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
            if (out->dims[d] && out->count > ((size_t)1 << 40) / out->dims[d])
                s = shard_error(SHARD_ERR_IO, "%s: IDX dims too large", path);
            out->count *= out->dims[d];
        }
    }
    if (s == SHARD_OK) {
        out->data = malloc(out->count ? out->count : 1);
        if (!out->data) s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory for %zu bytes", path, out->count);
    }
    for (size_t done = 0; s == SHARD_OK && done < out->count;) {
        unsigned chunk = out->count - done > (1u << 30) ? (1u << 30) : (unsigned)(out->count - done);
        int n = gzread(gz, out->data + done, chunk);
        const char *why = n < 0 ? gz_why(gz, path) : NULL;
        if (n < 0)
            s = shard_error(SHARD_ERR_IO, "%s: unreadable after %zu of %zu data bytes: %s", path, done, out->count,
                            why);
        else if (n == 0)
            s = shard_error(SHARD_ERR_IO, "%s: truncated: %zu of %zu data bytes", path, done, out->count);
        else
            done += (size_t)n;
    }
    unsigned char extra;
    int more = s == SHARD_OK ? gzread(gz, &extra, 1) : 0; /* the end, and gzip's own check of it */
    if (more > 0)
        s = shard_error(SHARD_ERR_IO, "%s: bytes follow the %zu the dims describe (not an IDX file, or two joined)",
                        path, out->count);
    else if (more < 0)
        s = shard_error(SHARD_ERR_IO, "%s: unreadable after its %zu data bytes: %s", path, out->count,
                        gz_why(gz, path));
    gzclose(gz);
    if (s < 0) shard_idx_free(out);
    return s;
}

void shard_idx_free(shard_idx *idx) {
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
