/* atomic_file.c — the engine's checked writing: files written whole to a
 * temporary name, fsynced, renamed and the directory fsynced (see
 * atomic_file.h); text files that grow a line at a time (a run's log), each
 * line flushed and checked; and the probe that finds an unwritable directory
 * before any work.  Every failure names the file and the reason. */
#define _GNU_SOURCE
#include "atomic_file.h"
#include "shard/files.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
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
        if (n <= 0) /* named as the file being written: the temporary name is the engine's own */
            return shard_error(SHARD_ERR_IO, "%s: cannot write: %s", f->path, n < 0 ? strerror(errno) : "no progress");
        p += n, size -= (size_t)n;
    }
    return SHARD_OK;
}

shard_status shard__atomic_commit(shard__atomic_file *f) {
    if (fsync(f->fd) != 0) {
        shard_status s = shard_error(SHARD_ERR_IO, "%s: cannot write (fsync): %s", f->path, strerror(errno));
        shard__atomic_abort(f);
        return s;
    }
    if (close(f->fd) != 0) {
        f->fd = -1;
        shard_status s = shard_error(SHARD_ERR_IO, "%s: cannot write (close): %s", f->path, strerror(errno));
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

/* ---- text files written a line at a time ---- */

struct shard_text_file {
    int fd;
    int failed;  /* a write failed: later ones are refused (the file ends at its last whole line) */
    off_t whole; /* the file's size after its last whole line */
    char path[PATH_MAX];
};

shard_status shard_text_file_open(const char *path, int append, shard_text_file **out) {
    if (!path || !*path || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_text_file_open: no path given");
    *out = NULL;
    shard_text_file *t = calloc(1, sizeof *t);
    if (!t) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", path);
    if (snprintf(t->path, sizeof t->path, "%s", path) >= (int)sizeof t->path) {
        free(t);
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: path too long", path);
    }
    t->fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    struct stat st;
    if (t->fd < 0 || fstat(t->fd, &st) != 0) {
        shard_status s = shard_error(SHARD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        if (t->fd >= 0) close(t->fd);
        free(t);
        return s;
    }
    t->whole = S_ISREG(st.st_mode) ? st.st_size : 0;
    *out = t;
    return SHARD_OK;
}

shard_status shard_text_file_printf(shard_text_file *t, const char *fmt, ...) {
    if (!t || !fmt) return shard_error(SHARD_ERR_INVALID_ARG, "shard_text_file_printf: NULL argument");
    if (t->failed) return shard_error(SHARD_ERR_IO, "%s: cannot write: an earlier write to it failed", t->path);
    char small[1024], *text = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return shard_error(SHARD_ERR_INVALID_ARG, "%s: the line cannot be formatted", t->path);
    if ((size_t)n >= sizeof small) {
        if (!(text = malloc((size_t)n + 1))) return shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", t->path);
        va_start(ap, fmt);
        vsnprintf(text, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    /* straight to the file, no buffer between: a run stopped later keeps its lines, and a full disk is
     * found at this line, not at the close */
    shard_status s = SHARD_OK;
    for (size_t done = 0; done < (size_t)n;) {
        ssize_t w = write(t->fd, text + done, (size_t)n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            s = shard_error(SHARD_ERR_IO, "%s: cannot write: %s", t->path, w < 0 ? strerror(errno) : "no progress");
            break;
        }
        done += (size_t)w;
    }
    if (text != small) free(text);
    if (s < 0) { /* a piece of the line is cut off again: readers of the file meet whole lines only */
        t->failed = 1;
        int cut = ftruncate(t->fd, t->whole); /* fails on a pipe or terminal: those keep what they got */
        (void)cut;
        return s;
    }
    t->whole += n;
    return SHARD_OK;
}

shard_status shard_text_file_close(shard_text_file *t) {
    if (!t) return SHARD_OK;
    shard_status s = SHARD_OK;
    /* a file system that reports a lost write only at fsync or close (NFS, a quota) is found here; a pipe or
     * terminal has no fsync (EINVAL) */
    if (!t->failed && fsync(t->fd) != 0 && errno != EINVAL)
        s = shard_error(SHARD_ERR_IO, "%s: cannot write (fsync): %s", t->path, strerror(errno));
    if (close(t->fd) != 0 && s == SHARD_OK && !t->failed)
        s = shard_error(SHARD_ERR_IO, "%s: cannot write (close): %s", t->path, strerror(errno));
    free(t);
    return s;
}

/* ---- the probe ---- */

shard_status shard_dir_probe_writable(const char *dir) {
    if (!dir || !*dir) return shard_error(SHARD_ERR_INVALID_ARG, "shard_dir_probe_writable: no directory given");
    char at[PATH_MAX], probe[PATH_MAX + 32];
    if (snprintf(at, sizeof at, "%s", dir) >= (int)sizeof at)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: path too long", dir);
    /* a directory still to be made is made in its nearest existing ancestor: that one must take a new entry */
    struct stat st;
    while (stat(at, &st) != 0) {
        char up[PATH_MAX];
        shard__dir_of(at, up, sizeof up);
        if ((errno != ENOENT && errno != ENOTDIR) || strcmp(up, at) == 0)
            return shard_error(SHARD_ERR_IO, "the directory %s cannot be written (%s)", at, strerror(errno));
        snprintf(at, sizeof at, "%s", up);
    }
    if (!S_ISDIR(st.st_mode))
        return shard_error(SHARD_ERR_IO, "%s exists and is not a directory, so nothing can be written in it", at);
    snprintf(probe, sizeof probe, "%s/.shard-probe-XXXXXX", at);
    int fd = mkostemp(probe, O_CLOEXEC);
    if (fd < 0) return shard_error(SHARD_ERR_IO, "the directory %s cannot be written (%s)", at, strerror(errno));
    /* one byte, not only the name: a file system with no free block still makes an empty file */
    ssize_t n = write(fd, "\n", 1);
    int e = errno;
    close(fd);
    unlink(probe);
    if (n != 1)
        return shard_error(SHARD_ERR_IO, "the directory %s cannot be written (%s)", at,
                           n < 0 ? strerror(e) : "no byte written");
    return SHARD_OK;
}
