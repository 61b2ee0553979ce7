/* cli_util.h — small helpers shared by the CLI verbs: option parsing with one
 * clear error line per bad value, sizes written as 4K / 256M / 1G, the usage
 * text a verb prints on --help, and the cluster and machine profile the verbs
 * that price layouts load. */
#ifndef SHARD_CLI_UTIL_H
#define SHARD_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "shard/cluster.h"
#include "shard/cost_model.h"
#include "shard/launch.h"

/* Options every verb that runs ranks understands. */
typedef struct cli_common {
    int ranks;                    /* --ranks N (0: not given) */
    shard_backend_choice backend; /* --backend threads|mpi */
    double timeout;               /* --timeout SECONDS (0: SHARD_TIMEOUT or 300) */
    int verbose;                  /* --verbose */
    const char *cluster;          /* --cluster FILE: an emulated cluster (NULL: none) */
    const char *device_map;       /* --device-map 3,0,1,2 */
} cli_common;

/* Try to consume argv[*i] (and its value) as a common option.
 * Returns 1 if consumed, 0 if not a common option, -1 on a bad value (message printed). */
int cli_common_option(cli_common *common, int argc, char **argv, int *i);

/* --mesh given without --ranks, outside an MPI launcher: the ranks the mesh spans (its sizes' product),
 * so `--mesh data=2` alone runs 2 thread ranks.  A mesh that does not parse is left to its own error. */
void cli_ranks_from_mesh(cli_common *common, const char *mesh);

/* A launch config from the common options. */
shard_launch_config cli_launch_config(const cli_common *common);

/* What a verb that prices layouts (plan, analyze, bench analyze) loads: the cluster file (NULL: none)
 * with the device map applied (a map without a cluster is refused: it places ranks on a cluster's
 * devices), then the machine profile file (NULL: none) into a malloc'd *profile; `verb` names the command
 * in an out-of-memory line.  On an error the message is set and *cluster and *profile are NULL. */
shard_status cli_load_cluster_profile(const char *verb, const char *cluster_path, const char *device_map,
                                      const char *profile_path, shard_cluster **cluster,
                                      shard_machine_profile **profile);

/* The value after option argv[*i]; prints an error and returns NULL if missing. */
const char *cli_value(int argc, char **argv, int *i);

/* "4096", "4K", "256M", "1G" (binary units) -> bytes.  0 on success, -1 with a message. */
int cli_parse_size(const char *option, const char *text, uint64_t *out);
int cli_parse_int(const char *option, const char *text, long min, long max, long *out);
int cli_parse_seconds(const char *option, const char *text, double *out);
/* 1 if all of text is one finite number written in decimal, with an optional exponent ("3", "-0.5",
 * "3e-4"; not "0x10", "inf", " 1" or "1e"), written to *out; else 0 (the caller prints its option's
 * message).  The one parser of the CLI's real-valued flags. */
int cli_number(const char *text, double *out);

/* text as a JSON string with its quotes ("a\"b"), cut short to fit out. */
const char *cli_json_string(const char *text, char *out, size_t out_bytes);

/* The median of n values (sorts v in place). */
double cli_median(double *v, int n);

/* The median of a run's step times step_ms[0..steps-1] into *median, the first step left out when there
 * are more (it warms up); 0 for no steps. */
shard_status cli_median_step_ms(const double *step_ms, size_t steps, double *median);

/* "4.0 KiB", "256 MiB" */
void cli_format_size(uint64_t bytes, char *out, size_t out_bytes);

/* --help or -h: the argument that asks a verb for its usage. */
int cli_is_help(const char *arg);
/* 1 when one of argv[first..argc-1] asks for help: --help anywhere among a verb's flags prints its usage
 * instead of running it. */
int cli_help_asked(int argc, char **argv, int first);
/* A verb's usage text on stdout; with rank_options, the lines of the options every verb that runs ranks
 * takes (--backend, --timeout, --verbose) after it; --help's line last.  The exit code of a help request:
 * 0, or 1 with a message when stdout cannot be written. */
int cli_usage(const char *usage, int rank_options);

/* "VERB: unknown option 'ARG' (see 'shard help')", with a did-you-mean when one of the options usage
 * lists (every --name in its text, and the options every verb that runs ranks takes) is near ARG. */
void cli_unknown_option(const char *verb, const char *arg, const char *usage);

/* Print "shard: <message>" to stderr; a character a terminal does not show is printed as its code. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Where the messages printed next come from, put before each ("plan.json: key 'flags': "), so that a
 * parser written for the command line names the file it reads; NULL: none again. */
void cli_error_context(const char *prefix);

#endif
