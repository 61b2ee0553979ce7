#!/usr/bin/env bash
# test.sh — what `make test` (and CI) runs: every test in a -Werror release build,
# again under ASan + UBSan, the threads-backend tests under TSan, and the MPI
# tests once more built against MPICH, and the fuzz harness for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

configure_and_build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DSHARD_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
}

echo "== release build (-Wall -Wextra -Werror): all tests"
configure_and_build build -DCMAKE_BUILD_TYPE=Release
(cd build && ctest --output-on-failure -j"$jobs")

echo "== ASan + UBSan: all tests"
configure_and_build build-asan -DCMAKE_BUILD_TYPE=Debug -DSHARD_SANITIZE=address,undefined
(cd build-asan && ctest --output-on-failure -j"$jobs")

echo "== TSan: threads-backend tests"
configure_and_build build-tsan -DCMAKE_BUILD_TYPE=Debug -DSHARD_SANITIZE=thread
# GCC 12's TSan cannot map its shadow memory under the high ASLR entropy of
# newer kernels; running without address randomisation avoids that.
norandom=()
if setarch "$(uname -m)" -R true 2>/dev/null; then norandom=(setarch "$(uname -m)" -R); fi
(cd build-tsan && "${norandom[@]}" ctest --output-on-failure -j"$jobs" -L "unit|comm|mesh|parallel" -LE "mpi|heavy")

if [[ -x /usr/bin/mpicc.mpich ]]; then
  echo "== MPICH build: the MPI tests against MPICH (hydra launcher)"
  configure_and_build build-mpich -DCMAKE_BUILD_TYPE=Release -DMPI_C_COMPILER=/usr/bin/mpicc.mpich
  (cd build-mpich && ctest --output-on-failure -j"$jobs" -L mpi)
fi

echo "== fuzzing (clang, libFuzzer + ASan + UBSan): the safetensors reader, ${SHARD_FUZZ_SECONDS:-60} s"
CC=clang cmake -S . -B build-fuzz -DSHARD_WERROR=ON -DCMAKE_BUILD_TYPE=Debug -DSHARD_FUZZ=ON \
  -DSHARD_FUZZ_SECONDS="${SHARD_FUZZ_SECONDS:-60}" >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors
(cd build-fuzz && ctest --output-on-failure -L fuzz)

echo "== all test runs passed"
