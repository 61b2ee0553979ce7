/* atomic_file.c — write to a temporary file, fsync, rename, fsync the
 * directory (see atomic_file.h). */
#define _GNU_SOURCE
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void shard__dir_of(const char *path, char *out, size_t out_bytes) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, out_bytes, ".");
    else if (slash == path)
        snprintf(out, out_bytes, "/");
    else
        snprintf(out, out_bytes, "%.*s", (int)(slash - path), path);
}

shard_status shard__fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return shard_error(SHARD_ERR_IO, "%s: cannot open the directory to sync it: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL)
        return shard_error(SHARD_ERR_IO, "%s: fsync of the directory failed: %s", dir, strerror(e));
    return SHARD_OK;
}

shard_status shard__atomic_open(const char *path, shard__atomic_file *f) {
    static _Atomic unsigned counter;
    f->fd = -1;
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: path too long", path);
    /* A random name (8 hex digits, as short as the pid-and-counter one it replaced, so that long names still
     * fit NAME_MAX), and another while one exists: pid and counter repeat across restarts (a container's
     * process is often pid 1 every time, and a run saves in the same order), so a crashed run's leftover
     * could hold such a name.  The counter keeps names within a process apart if getrandom fails. */
    for (int attempt = 0; attempt < 16; attempt++) {
        unsigned nonce = 0;
        if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != (ssize_t)sizeof nonce)
            nonce = (unsigned)time(NULL) ^ (unsigned)getpid() * 2654435761u;
        nonce += atomic_fetch_add(&counter, 1) * 0x9E3779B9u;
        if (snprintf(f->tmp, sizeof f->tmp, "%s.tmp-%08x", path, nonce) >= (int)sizeof f->tmp)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: path too long", path);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (f->fd >= 0) return SHARD_OK;
        if (errno != EEXIST) break;
    }
    return shard_error(SHARD_ERR_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
}

shard_status shard__atomic_write(shard__atomic_file *f, const void *bytes, size_t size) {
    const char *p = bytes;
    while (size) {
        ssize_t n = write(f->fd, p, size > (1u << 30) ? (1u << 30) : size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return shard_error(SHARD_ERR_IO, "%s: write failed: %s", f->tmp, n < 0 ? strerror(errno) : "no progress");
        p += n, size -= (size_t)n;
    }
    return SHARD_OK;
}

shard_status shard__atomic_commit(shard__atomic_file *f) {
    if (fsync(f->fd) != 0) {
        shard_status s = shard_error(SHARD_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
        shard__atomic_abort(f);
        return s;
    }
    if (close(f->fd) != 0) {
        f->fd = -1;
        shard_status s = shard_error(SHARD_ERR_IO, "%s: close failed: %s", f->tmp, strerror(errno));
        shard__atomic_abort(f);
        return s;
    }
    f->fd = -1;
    if (rename(f->tmp, f->path) != 0) {
        shard_status s = shard_error(SHARD_ERR_IO, "%s: cannot rename to %s: %s", f->tmp, f->path, strerror(errno));
        shard__atomic_abort(f);
        return s;
    }
    char dir[PATH_MAX];
    shard__dir_of(f->path, dir, sizeof dir);
    return shard__fsync_dir(dir);
}

void shard__atomic_abort(shard__atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
}

shard_status shard__atomic_write_file(const char *path, const void *bytes, size_t size) {
    shard__atomic_file f;
    SHARD_CHECK(shard__atomic_open(path, &f));
    shard_status s = shard__atomic_write(&f, bytes, size);
    if (s < 0) {
        shard__atomic_abort(&f);
        return s;
    }
    return shard__atomic_commit(&f);
}

/* ---- the public face (shard/files.h) ---- */

shard_status shard_atomic_write_file(const char *path, const void *bytes, size_t size_bytes) {
    return shard__atomic_write_file(path, bytes, size_bytes);
}

void shard_path_dir(const char *path, char *out, size_t out_bytes) { shard__dir_of(path, out, out_bytes); }
