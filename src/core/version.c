/* version.c — the version compiled into the library, so that a program can tell the library it runs
 * with (a shared libshard may be newer than the headers it was built against) from SHARD_VERSION_STRING,
 * which is the headers'. */
#include "shard/version.h"

const char *shard_version(void) { return SHARD_VERSION_STRING; }
