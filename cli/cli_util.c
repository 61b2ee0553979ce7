/* cli_util.c — option parsing helpers for the shard CLI, and the printing of
 * a verb's usage text. */
#include "cli_util.h"

#include "shard/files.h"
#include "shard/mesh.h"
#include "shard/status.h"
#include "shard/text.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char error_context[512]; /* cli_error_context's prefix; "" none */

void cli_error_context(const char *prefix) {
    snprintf(error_context, sizeof error_context, "%s", prefix ? prefix : "");
}

void cli_error(const char *fmt, ...) {
    /* one line whatever it quotes: a flag, key or path holding a character a terminal does not show is
     * printed with that character's code (shard_text_show_invisible) */
    char raw[SHARD_ERROR_TEXT_BYTES], shown[SHARD_ERROR_TEXT_BYTES];
    size_t at = (size_t)snprintf(raw, sizeof raw, "%s", error_context);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw + at, sizeof raw - at, fmt, ap);
    va_end(ap);
    shard_text_show_invisible(raw, shown, sizeof shown);
    fprintf(stderr, "shard: %s\n", shown);
}

shard_status cli_load_cluster_profile(const char *verb, const char *cluster_path, const char *device_map,
                                      const char *profile_path, shard_cluster **cluster,
                                      shard_machine_profile **profile) {
    *cluster = NULL, *profile = NULL;
    shard_status s = SHARD_OK;
    if (device_map && !cluster_path)
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "--device-map %s places ranks on a cluster's devices: give --cluster too", device_map);
    if (s == SHARD_OK && cluster_path) s = shard_cluster_load(cluster_path, cluster);
    if (s == SHARD_OK && device_map) s = shard_cluster_set_device_map(*cluster, device_map);
    if (s == SHARD_OK && profile_path && !(*profile = malloc(sizeof **profile)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "%s: out of memory", verb);
    if (s == SHARD_OK && profile_path) s = shard_machine_profile_load(profile_path, *profile);
    if (s < 0) {
        shard_cluster_destroy(*cluster), free(*profile);
        *cluster = NULL, *profile = NULL;
    }
    return s;
}

int cli_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

int cli_help_asked(int argc, char **argv, int first) {
    for (int i = first; i < argc; i++)
        if (cli_is_help(argv[i])) return 1;
    return 0;
}

/* The options cli_common_option reads, in the column layout of every verb's usage text (each verb lists
 * --ranks itself: its default differs). */
static const char *const RANK_OPTIONS =
    "  --backend B              threads, mpi or auto (default auto: mpi when started by mpirun, else threads)\n"
    "  --timeout S              deadline of every wait in seconds, > 0 (default SHARD_TIMEOUT, else 300)\n"
    "  --verbose, -v            say which backend and environment variables were used\n"
    "  --cluster FILE           run on an emulated cluster (JSON: nodes, network, intra_node, links): each\n"
    "                           rank's compute, messages and memory held to its device's and links'\n"
    "                           figures (see docs/cli.md, Emulated clusters)\n"
    "  --device-map LIST        with --cluster: rank i on device LIST[i], e.g. 3,0,1,2 (default: the\n"
    "                           ranks on the nodes' devices in order)\n";

int cli_usage(const char *usage, int rank_options) {
    fputs(usage, stdout);
    if (rank_options) fputs(RANK_OPTIONS, stdout);
    fputs("  --help, -h               this text\n", stdout);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("cannot write the usage text to standard output: %s", strerror(errno));
        return 1;
    }
    return 0;
}

void cli_unknown_option(const char *verb, const char *arg, const char *usage) {
    enum { MOST = 128, NAME_BYTES = 48 };
    char names[MOST][NAME_BYTES];
    const char *list[MOST];
    size_t n = 0;
    const char *texts[] = {usage, RANK_OPTIONS, "--help --ranks"};
    for (size_t t = 0; t < 3; t++)
        for (const char *p = texts[t] ? strstr(texts[t], "--") : NULL; p && n < MOST; p = strstr(p, "--")) {
            size_t len = 2 + strspn(p + 2, "abcdefghijklmnopqrstuvwxyz0123456789-");
            if (len > 2 && len < NAME_BYTES) {
                memcpy(names[n], p, len), names[n][len] = '\0';
                list[n] = names[n], n++;
            }
            p += len;
        }
    const char *near = shard_text_nearest(arg, list, n);
    if (near)
        cli_error("%s: unknown option '%s': did you mean '%s'? (see 'shard help %s')", verb, arg, near, verb);
    else
        cli_error("%s: unknown option '%s' (see 'shard help')", verb, arg);
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_error("option %s needs a value", argv[*i]);
        return NULL;
    }
    if (!argv[*i + 1][0]) { /* an empty path or number: said here, not as a bare ': cannot create' later */
        cli_error("%s '' is invalid: give a value (see 'shard help')", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* 1 when text is a number written plainly: an optional sign, decimal digits (with fraction: at most one
 * '.' among them, then optionally e or E, a sign and digits).  strtod and strtol take more than a flag
 * means: hexadecimal ("0x10" is 16), "inf" and "nan", leading spaces, the locale's decimal point. */
static int plain_number(const char *text, int fraction) {
    const char *p = text;
    size_t digits = 0;
    if (*p == '+' || *p == '-') p++;
    for (; *p >= '0' && *p <= '9'; p++) digits++;
    if (fraction && *p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++) digits++;
    if (!digits) return 0;
    if (fraction && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (*p < '0' || *p > '9') return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == '\0';
}

int cli_parse_int(const char *option, const char *text, long min, long max, long *out) {
    char *end = NULL;
    errno = 0;
    long v = plain_number(text, 0) ? strtol(text, &end, 10) : 0;
    if (!plain_number(text, 0) || errno || !end || *end || end == text || v < min || v > max) {
        cli_error("%s '%s' is invalid: give an integer in %ld..%ld", option, text, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_number(const char *text, double *out) {
    if (!plain_number(text, 1)) return 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || !end || *end || end == text || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

int cli_parse_seconds(const char *option, const char *text, double *out) {
    double v = 0;
    if (!cli_number(text, &v) || !(v > 0) || v > 1e9) {
        cli_error("%s '%s' is invalid: give seconds > 0, e.g. 30 or 0.5", option, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_size(const char *option, const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || text[0] < '0' || text[0] > '9') goto bad; /* no sign, space or "0x" */
    uint64_t mult = 1;
    if (*end) {
        switch (*end) {
        case 'K':
        case 'k': mult = 1ULL << 10; break;
        case 'M':
        case 'm': mult = 1ULL << 20; break;
        case 'G':
        case 'g': mult = 1ULL << 30; break;
        default: goto bad;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) goto bad;
    }
    if (v > (1ULL << 40) / mult) goto bad;
    *out = (uint64_t)v * mult;
    return 0;
bad:
    cli_error("%s '%s' is invalid: give a size in bytes such as 4096, 4K, 256M or 1G", option, text);
    return -1;
}

void cli_format_size(uint64_t bytes, char *out, size_t out_bytes) { shard_size_format(bytes, out, out_bytes); }

int cli_common_option(cli_common *common, int argc, char **argv, int *i) {
    const char *arg = argv[*i];
    if (strcmp(arg, "--verbose") == 0 || strcmp(arg, "-v") == 0) {
        common->verbose = 1;
        return 1;
    }
    if (strcmp(arg, "--ranks") == 0) {
        const char *v = cli_value(argc, argv, i);
        long n;
        if (!v || cli_parse_int("--ranks", v, 1, 4096, &n)) return -1;
        common->ranks = (int)n;
        return 1;
    }
    if (strcmp(arg, "--timeout") == 0) {
        const char *v = cli_value(argc, argv, i);
        if (!v || cli_parse_seconds("--timeout", v, &common->timeout)) return -1;
        return 1;
    }
    if (strcmp(arg, "--cluster") == 0 || strcmp(arg, "--device-map") == 0) {
        const char *v = cli_value(argc, argv, i);
        if (!v) return -1;
        *(arg[2] == 'c' ? &common->cluster : &common->device_map) = v; /* read and checked by the launch */
        return 1;
    }
    if (strcmp(arg, "--backend") == 0) {
        const char *v = cli_value(argc, argv, i);
        if (!v) return -1;
        if (strcmp(v, "threads") == 0)
            common->backend = SHARD_BACKEND_THREADS;
        else if (strcmp(v, "mpi") == 0)
            common->backend = SHARD_BACKEND_MPI;
        else if (strcmp(v, "auto") == 0)
            common->backend = SHARD_BACKEND_AUTO;
        else {
            cli_error("--backend '%s' is invalid: give threads, mpi or auto", v);
            return -1;
        }
        return 1;
    }
    return 0;
}

void cli_ranks_from_mesh(cli_common *common, const char *mesh) {
    if (!mesh || common->ranks || common->backend == SHARD_BACKEND_MPI || shard_launch_detect_mpi(NULL, 0, NULL, NULL))
        return;
    int sizes[SHARD_MESH_MAX_AXES], n = shard_mesh_parse(mesh, 0, NULL, sizes);
    if (n <= 0) {
        shard_clear_error();
        return;
    }
    long product = 1;
    for (int k = 0; k < n; k++) product *= sizes[k];
    if (product <= 4096) common->ranks = (int)product;
}

shard_launch_config cli_launch_config(const cli_common *common) {
    shard_launch_config cfg = shard_launch_config_default();
    cfg.ranks = common->ranks > 0 ? common->ranks : 1;
    cfg.backend = common->backend;
    cfg.timeout_seconds = common->timeout;
    cfg.verbose = common->verbose;
    cfg.cluster_file = common->cluster;
    cfg.device_map = common->device_map;
    return cfg;
}

const char *cli_json_string(const char *text, char *out, size_t out_bytes) {
    size_t n = 0;
    if (out_bytes < 3) return out_bytes ? (out[0] = '\0', out) : out;
    out[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)text; *p && n + 8 < out_bytes; p++) {
        if (*p == '"' || *p == '\\')
            out[n++] = '\\', out[n++] = (char)*p;
        else if (*p < 0x20)
            n += (size_t)snprintf(out + n, out_bytes - n, "\\u%04x", *p);
        else
            out[n++] = (char)*p;
    }
    out[n++] = '"';
    out[n] = '\0';
    return out;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double cli_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

shard_status cli_median_step_ms(const double *step_ms, size_t steps, double *median) {
    size_t skip = steps > 1 ? 1 : 0, n = steps - skip;
    *median = 0;
    if (!n) return SHARD_OK;
    double *v = malloc(n * sizeof *v); /* a copy: the caller's times stay in step order */
    if (!v) return shard_error(SHARD_ERR_NO_MEMORY, "out of memory for the median of %zu step times", n);
    memcpy(v, step_ms + skip, n * sizeof *v);
    *median = cli_median(v, (int)n);
    free(v);
    return SHARD_OK;
}
