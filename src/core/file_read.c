/* file_read.c — the one way the engine opens a file it reads (see shard/files.h): every input is
 * checked to be a regular file before anything waits on it, and its size against the bound its kind
 * allows before a byte is read.  Opening a FIFO for reading waits for a writer, forever when none
 * comes; a directory or a device is no input either; a config of a gigabyte would be read whole before
 * its JSON is refused.  So the path is looked at first (stat: nothing opened), then opened without
 * waiting (O_NONBLOCK, cleared at once) and looked at again (the name may have changed in between). */
#include "core/file_read.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard/files.h"

/* What stands at a path, for the refusal of what is not a regular file. */
static const char *file_kind(unsigned mode) {
    mode_t m = (mode_t)mode;
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    return "not a file";
}

/* The size as people read it, with the exact byte count when the rounded figure hides it. */
static void size_text(uint64_t bytes, char *out, size_t out_bytes) {
    char unit[32];
    shard_size_format(bytes, unit, sizeof unit);
    if (strstr(unit, " B") || bytes < 1024)
        snprintf(out, out_bytes, "%llu bytes", (unsigned long long)bytes);
    else
        snprintf(out, out_bytes, "%s", unit);
}

int shard__file_open_nowait(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    int flags = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
    if (fd >= 0 && (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static shard_status refuse_kind(const char *path, const char *doing, unsigned mode) {
    return shard_error(SHARD_ERR_IO, "%s: %s: not a regular file (%s): give a regular file", path, doing,
                       file_kind(mode));
}

shard_status shard_file_open(const char *path, const char *doing, uint64_t limit_bytes, int *fd, uint64_t *size_bytes) {
    if (fd) *fd = -1;
    if (size_bytes) *size_bytes = 0;
    if (!path || !doing || !fd) return shard_error(SHARD_ERR_INVALID_ARG, "shard_file_open: NULL argument");
    struct stat st;
    if (stat(path, &st) != 0) return shard_error(SHARD_ERR_IO, "%s: %s: %s", path, doing, strerror(errno));
    if (!S_ISREG(st.st_mode)) return refuse_kind(path, doing, (unsigned)st.st_mode);
    int f = shard__file_open_nowait(path);
    if (f < 0) return shard_error(SHARD_ERR_IO, "%s: %s: %s", path, doing, strerror(errno));
    shard_status s = SHARD_OK;
    if (fstat(f, &st) != 0)
        s = shard_error(SHARD_ERR_IO, "%s: %s: %s", path, doing, strerror(errno));
    else if (!S_ISREG(st.st_mode)) /* replaced between the two looks */
        s = refuse_kind(path, doing, (unsigned)st.st_mode);
    else if (limit_bytes && (uint64_t)st.st_size > limit_bytes) {
        char have[48], most[48];
        size_text((uint64_t)st.st_size, have, sizeof have), size_text(limit_bytes, most, sizeof most);
        s = shard_error(SHARD_ERR_IO, "%s: %s: %s, more than the %s allowed: give a smaller file", path, doing, have,
                        most);
    }
    if (s < 0) {
        close(f);
        return s;
    }
    *fd = f;
    if (size_bytes) *size_bytes = (uint64_t)st.st_size;
    return SHARD_OK;
}

shard_status shard_file_read(const char *path, const char *doing, uint64_t limit_bytes, char **bytes,
                             size_t *size_bytes) {
    if (bytes) *bytes = NULL;
    if (size_bytes) *size_bytes = 0;
    if (!bytes) return shard_error(SHARD_ERR_INVALID_ARG, "shard_file_read: NULL argument");
    int fd = -1;
    uint64_t size = 0;
    SHARD_CHECK(shard_file_open(path, doing, limit_bytes, &fd, &size));
    if (size >= SIZE_MAX) {
        close(fd);
        return shard_error(SHARD_ERR_NO_MEMORY, "%s: %s: out of memory", path, doing);
    }
    /* the size stat gave, plus one byte to see whether the file grew since (it is read to its end) */
    size_t cap = (size_t)size + 1, len = 0;
    char *buf = malloc(cap + 1);
    shard_status s = buf ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "%s: %s: out of memory", path, doing);
    while (s == SHARD_OK) {
        if (len == cap) {
            if (limit_bytes && len > limit_bytes) {
                s = shard_error(SHARD_ERR_IO, "%s: %s: it grew past the %llu bytes allowed while read", path, doing,
                                (unsigned long long)limit_bytes);
                break;
            }
            char *more = realloc(buf, 2 * cap + 1);
            if (!more) {
                s = shard_error(SHARD_ERR_NO_MEMORY, "%s: %s: out of memory", path, doing);
                break;
            }
            buf = more, cap *= 2;
        }
        ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            s = shard_error(SHARD_ERR_IO, "%s: %s: %s", path, doing, strerror(errno));
        else if (got == 0)
            break;
        else
            len += (size_t)got;
    }
    close(fd);
    if (s < 0) {
        free(buf);
        return s;
    }
    buf[len] = '\0';
    *bytes = buf;
    if (size_bytes) *size_bytes = len;
    return SHARD_OK;
}
