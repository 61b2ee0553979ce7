/* ckpt_lock.c — a checkpoint root's writer lock (see shard/ckpt_lock.h):
 * made whole under a temporary name and link()ed into place, a heartbeat
 * thread that rewrites its time in place and checks the file is still its
 * own, and stale locks moved aside and taken over. */
#define _GNU_SOURCE
#include "shard/ckpt_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "atomic_file.h" /* shard__fsync_dir */
#include "ckpt_util.h"
#include "core/env.h"

/* The heartbeat is rewritten in place, so its field has a fixed width (JSON allows the padding spaces). */
enum { BEAT_WIDTH = 24, HOST_BYTES = 128, ATTEMPTS = 8 };
static const double DEFAULT_STALE_SECONDS = 30;

struct shard_ckpt_lock {
    char root[PATH_MAX], path[PATH_MAX + 16];
    size_t kept_bytes; /* root's leading part that existed before: what release leaves standing */
    int fd;            /* the lock file, open for the heartbeat and to tell it from a newer holder's */
    dev_t dev;
    ino_t ino;
    off_t beat_at; /* where the heartbeat's digits start */
    double period;
    pthread_t thread;
    int have_thread, stopping;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int lost;
    char holder[HOST_BYTES + 64]; /* who took it over; written before `lost` is set */
};

/* What a lock file says. */
typedef struct holder_info {
    char host[HOST_BYTES];
    long pid;
    double heartbeat; /* the file's modification time when its text is not a lock's */
    int parsed;
    dev_t dev;
    ino_t ino;
} holder_info;

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* This machine's name as it goes into the lock: printable, no quote or backslash (the file is JSON). */
static void this_host(char *out, size_t out_bytes) {
    if (gethostname(out, out_bytes) != 0) snprintf(out, out_bytes, "unknown");
    out[out_bytes - 1] = '\0';
    for (char *c = out; *c; c++)
        if (*c <= ' ' || *c == '"' || *c == '\\' || *c == 127) *c = '?';
}

static void describe(const holder_info *h, char *out, size_t out_bytes) {
    if (h->parsed)
        snprintf(out, out_bytes, "host %s, pid %ld", h->host, h->pid);
    else
        snprintf(out, out_bytes, "a lock file of unknown form");
}

/* Read the lock at path: 1 when there is one (h filled), 0 when there is none, -1 with errno set. */
static int read_holder(const char *path, holder_info *h) {
    memset(h, 0, sizeof *h);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO in its place must not block */
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    struct stat st;
    char text[1024];
    int stat_ok = fstat(fd, &st) == 0, e = stat_ok ? EISDIR : errno; /* not a file: shown as "is a directory" */
    ssize_t n = stat_ok && S_ISREG(st.st_mode) ? read(fd, text, sizeof text - 1) : -1;
    if (n < 0 && stat_ok && S_ISREG(st.st_mode)) e = errno;
    close(fd);
    if (n < 0) {
        errno = e;
        return -1;
    }
    text[n] = '\0';
    h->dev = st.st_dev, h->ino = st.st_ino;
    h->heartbeat = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
    const char *host = strstr(text, "\"host\": \""), *pid = strstr(text, "\"pid\": "),
               *beat = strstr(text, "\"heartbeat\": ");
    if (!host || !pid || !beat) return 1;
    host += 9;
    size_t len = strcspn(host, "\"\n");
    snprintf(h->host, sizeof h->host, "%.*s", (int)(len < HOST_BYTES - 1 ? len : HOST_BYTES - 1), host);
    char *end = NULL;
    h->pid = strtol(pid + 7, &end, 10);
    double t = strtod(beat + 13, &end);
    if (end == beat + 13 || h->pid <= 0) return 1;
    h->heartbeat = t, h->parsed = 1;
    return 1;
}

/* 1 when h's lock may be taken over, with the reason in why. */
static int is_stale(const holder_info *h, const char *me, double stale_seconds, char *why, size_t why_bytes) {
    double age = wall_seconds() - h->heartbeat;
    if (age > stale_seconds) {
        snprintf(why, why_bytes, "its heartbeat is %.0f s old, past %g s", age, stale_seconds);
        return 1;
    }
    /* on this host a holder that is gone (killed outright) needs no waiting; the pid of this very process
     * is another container's of the same name, alive as far as can be told */
    if (h->parsed && strcmp(h->host, me) == 0 && h->pid != (long)getpid() && kill((pid_t)h->pid, 0) != 0 &&
        errno == ESRCH) {
        snprintf(why, why_bytes, "that process is gone");
        return 1;
    }
    return 0;
}

/* 1 when path is still the file this holder opened. */
static int still_mine(const shard_ckpt_lock *l) {
    struct stat a, b;
    return l->fd >= 0 && fstat(l->fd, &b) == 0 && stat(l->path, &a) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino;
}

static void *heartbeat(void *arg) {
    shard_ckpt_lock *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long ns = until.tv_nsec + (long)((l->period - (double)(long)l->period) * 1e9);
        until.tv_sec += (time_t)l->period + ns / 1000000000L, until.tv_nsec = ns % 1000000000L;
        while (!l->stopping && pthread_cond_timedwait(&l->cv, &l->mu, &until) != ETIMEDOUT) {}
        if (l->stopping) break;
        pthread_mutex_unlock(&l->mu);
        int mine = still_mine(l);
        if (mine) {
            char beat[BEAT_WIDTH + 1];
            snprintf(beat, sizeof beat, "%-*.3f", BEAT_WIDTH, wall_seconds());
            /* a failed write only ages the heartbeat: another run takes the lock over once it is stale,
             * and this one then finds it lost */
            if (pwrite(l->fd, beat, BEAT_WIDTH, l->beat_at) != BEAT_WIDTH) {}
        }
        pthread_mutex_lock(&l->mu);
        if (!mine) {
            holder_info h;
            if (read_holder(l->path, &h) == 1)
                describe(&h, l->holder, sizeof l->holder);
            else
                snprintf(l->holder, sizeof l->holder, "a run that has since removed it");
            atomic_store(&l->lost, 1);
            break;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* A name's random part: a leftover of a killed run (a container's pid repeats) never blocks a new one. */
static unsigned random_tag(void) {
    unsigned tag = 0;
    if (getrandom(&tag, sizeof tag, GRND_NONBLOCK) != (ssize_t)sizeof tag)
        tag = (unsigned)getpid() ^ (unsigned)time(NULL);
    return tag;
}

/* Put the lock file in place whole: 0, or the errno of the failure (EEXIST: a lock is there). */
static int place(shard_ckpt_lock *l, const char *text, size_t text_bytes) {
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp-%08x", l->path, random_tag());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), e = 0;
    if (fd < 0) return errno;
    if (write(fd, text, text_bytes) != (ssize_t)text_bytes || fsync(fd) != 0)
        e = errno ? errno : EIO;
    else if (link(tmp, l->path) == 0)
        l->fd = fd;
    else
        e = errno;
    unlink(tmp);
    if (e == 0) return 0;
    close(fd);
    if (e != EPERM && e != ENOTSUP && e != ENOSYS) return e;
    /* a filesystem without hard links: created exclusively, then filled (a reader in between sees a lock of
     * unknown form, fresh by its time, and refuses as it should) */
    fd = open(l->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    if (write(fd, text, text_bytes) != (ssize_t)text_bytes) {
        e = errno ? errno : EIO;
        close(fd), unlink(l->path);
        return e;
    }
    l->fd = fd;
    return 0;
}

/* Move the stale lock h aside and remove it: 1 when done or already gone, 0 when the file there was a newer
 * holder's (put back), -1 with errno on failure. */
static int take_over(shard_ckpt_lock *l, const holder_info *h) {
    char aside[PATH_MAX + 64];
    snprintf(aside, sizeof aside, "%s.stale-%08x", l->path, random_tag());
    if (rename(l->path, aside) != 0) return errno == ENOENT ? 1 : -1;
    struct stat st;
    int same = stat(aside, &st) == 0 && st.st_dev == h->dev && st.st_ino == h->ino;
    if (!same && link(aside, l->path) != 0) {} /* a third run's lock in the meantime: that one keeps the root */
    unlink(aside);
    return same;
}

static void remove_made_dirs(const shard_ckpt_lock *l) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", l->root);
    for (size_t n = strlen(path); n > l->kept_bytes && rmdir(path) == 0;) {
        while (n > 0 && path[n - 1] != '/') n--;
        while (n > 0 && path[n - 1] == '/') n--;
        path[n] = '\0';
    }
}

/* The length of root's longest leading part that is an existing directory (what release must not remove). */
static size_t existing_prefix(const char *root) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", root);
    struct stat st;
    for (size_t n = strlen(path); n > 0; path[n] = '\0') {
        if (stat(path, &st) == 0) return n;
        while (n > 0 && path[n - 1] != '/') n--;
        while (n > 0 && path[n - 1] == '/') n--;
    }
    return 0;
}

static shard_status acquire(shard_ckpt_lock *l, const char *what, FILE *notes) {
    double stale = shard__env_seconds("SHARD_LOCK_STALE", DEFAULT_STALE_SECONDS);
    l->period = stale / 10 < 5 ? stale / 10 : 5;
    char me[HOST_BYTES], text[512];
    this_host(me, sizeof me);
    double now = wall_seconds();
    int at = snprintf(text, sizeof text, "{\"host\": \"%s\", \"pid\": %ld, \"started\": %.3f, \"heartbeat\": ", me,
                      (long)getpid(), now);
    l->beat_at = at;
    at += snprintf(text + at, sizeof text - (size_t)at, "%-*.3f}\n", BEAT_WIDTH, now);
    for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
        int e = place(l, text, (size_t)at);
        if (e == 0) return shard__fsync_dir(l->root);
        if (e != EEXIST)
            return shard_error(SHARD_ERR_IO, "%s %s: cannot create its lock %s: %s", what, l->root, l->path,
                               strerror(e));
        holder_info h;
        int r = read_holder(l->path, &h);
        if (r == 0) continue; /* released in the meantime */
        if (r < 0)
            return shard_error(SHARD_ERR_IO, "%s %s: cannot read its lock %s: %s; remove it if no run uses %s", what,
                               l->root, l->path, strerror(errno), l->root);
        char who[HOST_BYTES + 64], why[96];
        describe(&h, who, sizeof who);
        if (!is_stale(&h, me, stale, why, sizeof why))
            return shard_error(SHARD_ERR_INVALID_ARG,
                               "%s %s is in use by another run (%s, heartbeat %.0f s ago; lock %s): give another "
                               "directory, or wait for that run to end (a lock whose heartbeat is %g s old is taken "
                               "over)",
                               what, l->root, who, wall_seconds() - h.heartbeat, l->path, stale);
        r = take_over(l, &h);
        if (r < 0)
            return shard_error(SHARD_ERR_IO, "%s %s: cannot move the stale lock %s aside: %s", what, l->root, l->path,
                               strerror(errno));
        if (r == 1 && notes)
            fprintf(notes, "shard: note: %s %s: taking over the lock of %s (%s)\n", what, l->root, who, why);
    }
    return shard_error(SHARD_ERR_IO,
                       "%s %s: its lock %s changed hands %d times while taking it: give a directory no "
                       "other run is starting in",
                       what, l->root, l->path, ATTEMPTS);
}

shard_status shard_ckpt_lock_acquire(const char *root, const char *option, FILE *notes, shard_ckpt_lock **lock) {
    if (!lock) return shard_error(SHARD_ERR_INVALID_ARG, "shard_ckpt_lock_acquire: lock is NULL");
    *lock = NULL;
    const char *what = option ? option : "checkpoint root";
    if (!root || !root[0]) return shard_error(SHARD_ERR_INVALID_ARG, "%s: give a directory, not an empty path", what);
    shard_ckpt_lock *l = calloc(1, sizeof *l);
    if (!l) return shard_error(SHARD_ERR_NO_MEMORY, "%s %s: out of memory", what, root);
    l->fd = -1;
    if (snprintf(l->root, sizeof l->root, "%s", root) >= (int)sizeof l->root) {
        free(l);
        return shard_error(SHARD_ERR_INVALID_ARG, "%s %s: path too long", what, root);
    }
    snprintf(l->path, sizeof l->path, "%s/writer.lock", root);
    l->kept_bytes = existing_prefix(root);
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    shard_status s = shard__ckpt_mkdirs(root);
    if (s == SHARD_OK) s = acquire(l, what, notes);
    struct stat st;
    if (s == SHARD_OK && fstat(l->fd, &st) != 0)
        s = shard_error(SHARD_ERR_IO, "%s %s: cannot stat its lock %s: %s", what, root, l->path, strerror(errno));
    if (s == SHARD_OK) {
        l->dev = st.st_dev, l->ino = st.st_ino;
        int e = pthread_create(&l->thread, NULL, heartbeat, l);
        if (e != 0)
            s = shard_error(SHARD_ERR_IO, "%s %s: cannot start the lock's heartbeat thread: %s", what, root,
                            strerror(e));
        l->have_thread = e == 0;
    }
    if (s < 0) {
        shard_ckpt_lock_release(l);
        return s;
    }
    *lock = l;
    return SHARD_OK;
}

int shard_ckpt_lock_lost(shard_ckpt_lock *lock, char *holder, size_t holder_bytes) {
    if (!lock || !atomic_load(&lock->lost)) return 0;
    if (holder && holder_bytes) {
        pthread_mutex_lock(&lock->mu);
        snprintf(holder, holder_bytes, "%s", lock->holder);
        pthread_mutex_unlock(&lock->mu);
    }
    return 1;
}

void shard_ckpt_lock_abandon(const shard_ckpt_lock *lock) {
    if (lock && still_mine(lock)) unlink(lock->path);
}

void shard_ckpt_lock_release(shard_ckpt_lock *lock) {
    if (!lock) return;
    if (lock->have_thread) {
        pthread_mutex_lock(&lock->mu);
        lock->stopping = 1;
        pthread_cond_signal(&lock->cv);
        pthread_mutex_unlock(&lock->mu);
        pthread_join(lock->thread, NULL);
    }
    shard_ckpt_lock_abandon(lock);
    if (lock->fd >= 0) close(lock->fd);
    remove_made_dirs(lock);
    pthread_cond_destroy(&lock->cv);
    pthread_mutex_destroy(&lock->mu);
    free(lock);
}
