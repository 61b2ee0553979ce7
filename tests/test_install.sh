#!/bin/sh
# test_install.sh — installs the build into a scratch prefix under the build tree, then builds
# examples/comm_basics.c from the installed files alone, as a program outside the tree would, and runs
# it on 3 thread ranks:
#   pkgconfig      cc $(pkg-config --cflags --libs shard): the program must load the prefix's
#                  libshard.so (ldd says which); once more linked to libshard.a with the libraries of
#                  pkg-config --static. Also: every installed file is there, the shared library exports
#                  the public names only, and pkg-config, `shard --version` and the build agree on the
#                  version.
#   cmake_package  a project doing find_package(shard VERSION REQUIRED) links one program to
#                  shard::shard and one to shard::shard_static.
#
# usage: test_install.sh pkgconfig|cmake_package BUILD_DIR SOURCE_DIR LIBDIR VERSION CC CMAKE PKG_CONFIG
#   LIBDIR: the install's library directory under the prefix (CMAKE_INSTALL_LIBDIR, e.g. lib)
set -eu

if [ $# -ne 8 ]; then
    echo "usage: test_install.sh pkgconfig|cmake_package BUILD_DIR SOURCE_DIR LIBDIR VERSION CC CMAKE PKG_CONFIG" >&2
    exit 2
fi
mode=$1 build=$2 src=$3 libdir=$4 version=$5 cc=$6 cmake=$7 pkg_config=$8
case $mode in
pkgconfig | cmake_package) ;;
*)
    echo "test_install.sh: unknown mode '$mode': valid modes are pkgconfig, cmake_package" >&2
    exit 2
    ;;
esac
work=$build/tests/install_$mode # one per mode: the two tests may run at once
prefix=$work/prefix
example=$src/examples/comm_basics.c

fail() {
    echo "test_install ($mode): $*" >&2
    exit 1
}

rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
    fail "cmake --install $build --prefix $prefix failed: $(cat "$work/install.log")"

# run_example PROGRAM shared|static: run it on 3 ranks with the prefix's libraries first in the search,
# after checking that it loads the prefix's libshard.so (shared) or no libshard.so at all (static).
run_example() {
    LD_LIBRARY_PATH=$prefix/$libdir ldd "$1" >"$1.ldd" 2>&1 || fail "ldd $1 failed: $(cat "$1.ldd")"
    if [ "$2" = shared ]; then
        grep -F "libshard.so.0 => $prefix/$libdir/libshard.so.0 " "$1.ldd" >/dev/null ||
            fail "$1 does not load $prefix/$libdir/libshard.so.0; ldd says: $(cat "$1.ldd")"
    elif grep -F libshard "$1.ldd" >/dev/null; then
        fail "$1 should hold libshard.a, but loads a shared libshard; ldd says: $(cat "$1.ldd")"
    fi
    LD_LIBRARY_PATH=$prefix/$libdir "$1" 3 >"$1.out" 2>&1 || fail "$1 3 failed: $(cat "$1.out")"
    cat "$1.out"
}

if [ "$mode" = pkgconfig ]; then
    for f in include/shard/shard.h include/shard/version.h include/shard/comm.h "$libdir/libshard.a" \
        "$libdir/libshard.so" "$libdir/libshard.so.0" "$libdir/libshard.so.$version" bin/shard \
        "$libdir/pkgconfig/shard.pc" "$libdir/cmake/shard/shardConfig.cmake" \
        "$libdir/cmake/shard/shardConfigVersion.cmake" "$libdir/cmake/shard/shardTargets.cmake"; do
        [ -e "$prefix/$f" ] || fail "the install lacks $prefix/$f"
    done

    # the public shard_* names, and the one internal name the SHARD_CHECK macros call
    others=$(nm -D --defined-only "$prefix/$libdir/libshard.so" | awk '{ print $NF }' |
        grep -v -e '^shard_[^_]' -e '^shard__trace_failure$' || true)
    [ -z "$others" ] || fail "libshard.so exports names outside the public API: $others"

    PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export PKG_CONFIG_PATH
    pc_version=$("$pkg_config" --modversion shard) || fail "pkg-config --modversion shard failed"
    cli_version=$("$prefix/bin/shard" --version) || fail "$prefix/bin/shard --version failed"
    [ "$pc_version" = "$version" ] || fail "pkg-config says version '$pc_version', the build is $version"
    case $cli_version in
    "shard $version "*) ;;
    *) fail "shard --version says '$cli_version', the build is $version" ;;
    esac

    flags=$("$pkg_config" --cflags --libs shard) || fail "pkg-config --cflags --libs shard failed"
    echo "pkg-config --cflags --libs shard: $flags"
    # shellcheck disable=SC2086 # the flags are words
    "$cc" -o "$work/comm_basics" "$example" $flags || fail "$cc $example $flags failed"
    run_example "$work/comm_basics" shared

    # libshard.a: the same flags with --static, -lshard naming the archive
    static_libs=""
    for word in $("$pkg_config" --static --libs shard); do
        [ "$word" = -lshard ] && word=$prefix/$libdir/libshard.a
        static_libs="$static_libs $word"
    done
    echo "linked statically with:$static_libs"
    # shellcheck disable=SC2046,SC2086
    "$cc" -o "$work/comm_basics_static" "$example" $("$pkg_config" --cflags shard) $static_libs ||
        fail "$cc $example $static_libs failed"
    run_example "$work/comm_basics_static" static
else
    project=$work/project
    mkdir -p "$project"
    cat >"$project/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.18)
project(shard_consumer C)
find_package(shard $version REQUIRED)
add_executable(comm_basics_shared "$example")
target_link_libraries(comm_basics_shared PRIVATE shard::shard)
add_executable(comm_basics_static "$example")
target_link_libraries(comm_basics_static PRIVATE shard::shard_static)
EOF
    "$cmake" -S "$project" -B "$project/build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
        >"$work/configure.log" 2>&1 || fail "configuring the find_package(shard) project failed: $(cat "$work/configure.log")"
    found=$(grep '^shard_DIR:' "$project/build/CMakeCache.txt" | sed 's/^[^=]*=//')
    [ "$found" = "$prefix/$libdir/cmake/shard" ] ||
        fail "find_package(shard) found '$found', not $prefix/$libdir/cmake/shard"
    "$cmake" --build "$project/build" >"$work/build.log" 2>&1 ||
        fail "building the find_package(shard) project failed: $(cat "$work/build.log")"
    run_example "$project/build/comm_basics_shared" shared
    run_example "$project/build/comm_basics_static" static
fi
echo "test_install ($mode): ok"
