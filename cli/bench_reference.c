/* bench_reference.c — runs one of tools/reference's PyTorch timing scripts
 * for the benchmarks that compare with it in the same run, and reads back
 * its median ms/step.  Both scripts take CONFIG BATCH SEQ STEPS WARMUP
 * THREADS|WORLD, and the DDP one optionally BUCKET_MB.  The script is started with posix_spawn and an argument
 * vector (no shell: a config path is passed as it is, whatever it holds). */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_train.h"

#ifndef SHARD_SOURCE_DIR
#define SHARD_SOURCE_DIR "."
#endif

extern char **environ;

/* environ plus OMP_WAIT_POLICY=PASSIVE (replacing one already there), or NULL when out of memory */
static char **passive_environment(void) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "OMP_WAIT_POLICY=", 16) != 0) env[k++] = environ[i];
    env[k] = "OMP_WAIT_POLICY=PASSIVE";
    return env;
}

double bench_reference_ms(const char *script, const char *config, const long numbers[5], const char *extra,
                          int passive_omp, char *why, size_t why_bytes) {
    char path[4096], n[5][24];
    snprintf(path, sizeof path, "%s/tools/reference/%s", SHARD_SOURCE_DIR, script);
    for (int i = 0; i < 5; i++) snprintf(n[i], sizeof n[i], "%ld", numbers[i]);
    const char *argv[] = {"/usr/bin/python3", path, config, n[0], n[1], n[2], n[3], n[4], extra, NULL};
    int fd[2];
    if (pipe2(fd, O_CLOEXEC) != 0) return snprintf(why, why_bytes, "cannot make a pipe: %s", strerror(errno)), -1;
    posix_spawn_file_actions_t acts; /* the child's stdout and stderr: the pipe (dup2 clears close-on-exec) */
    posix_spawn_file_actions_init(&acts);
    posix_spawn_file_actions_adddup2(&acts, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&acts, fd[1], STDERR_FILENO);
    char **env = passive_omp ? passive_environment() : environ;
    pid_t pid = -1;
    int rc = env ? posix_spawn(&pid, argv[0], &acts, NULL, (char *const *)argv, env) : ENOMEM;
    posix_spawn_file_actions_destroy(&acts);
    if (env != environ) free(env);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        return snprintf(why, why_bytes, "could not start %s: %s", argv[0], strerror(rc)), -1;
    }
    FILE *out = fdopen(fd[0], "r");
    char line[512];
    double ms = -1;
    while (out && fgets(line, sizeof line, out)) {
        const char *k = strstr(line, "\"ms_per_step\": ");
        if (k)
            ms = atof(k + 15);
        else if (line[0] != '\n')
            snprintf(why, why_bytes, "%.*s", (int)strcspn(line, "\n"), line); /* its last word */
    }
    if (out)
        fclose(out);
    else
        close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (exit_code != 0 || ms <= 0) {
        if (!why[0]) snprintf(why, why_bytes, "%s exited with %d%s", script, exit_code, ms > 0 ? "" : " and no timing");
        return -1;
    }
    return ms;
}
