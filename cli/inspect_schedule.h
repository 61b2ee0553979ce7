/* inspect_schedule.h — `shard inspect schedule` (inspect_schedule.c). */
#ifndef SHARD_CLI_INSPECT_SCHEDULE_H
#define SHARD_CLI_INSPECT_SCHEDULE_H

int cli_inspect_schedule(int argc, char **argv);

#endif
