/* version.h — libshard's version: the numbers of the headers a program was compiled against (the
 * macros) and of the library it runs with (shard_version(), which may differ when a program runs with
 * a newer shared library than the headers it was built with).
 *
 * The three numbers below are the one place the version is written: CMakeLists.txt reads them for
 * project(VERSION), the shared library's SOVERSION and the installed pkg-config and CMake package
 * files, so keep each on its own `#define SHARD_VERSION_<PART> <number>` line. */
#ifndef SHARD_VERSION_H
#define SHARD_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_VERSION_MAJOR 0
#define SHARD_VERSION_MINOR 1
#define SHARD_VERSION_PATCH 0

/* Two levels so that the numbers' macros are expanded before they are turned into text. */
#define SHARD__VERSION_TEXT(x) #x
#define SHARD__VERSION_JOIN(major, minor, patch)                                                                       \
    SHARD__VERSION_TEXT(major) "." SHARD__VERSION_TEXT(minor) "." SHARD__VERSION_TEXT(patch)

/* "MAJOR.MINOR.PATCH" of these headers, e.g. "0.1.0". */
#define SHARD_VERSION_STRING SHARD__VERSION_JOIN(SHARD_VERSION_MAJOR, SHARD_VERSION_MINOR, SHARD_VERSION_PATCH)

/* "MAJOR.MINOR.PATCH" of the library this program runs with (static text; never NULL). */
const char *shard_version(void);

#ifdef __cplusplus
}
#endif

#endif
