#!/usr/bin/env bash
# test.sh — what `make test` (and CI) runs, in passes, each printing its time at its end:
#   format      every C file in .clang-format's layout (scripts/format.sh --check)
#   release     every test, -Wall -Wextra -Werror; then each CTest label's time against its budget
#               (tests/CMakeLists.txt), which fails the run when a label grew past it
#   ASan+UBSan  the tests labelled `asan`: every test program, on the rank counts that reach distinct paths
#   TSan        the tests labelled `tsan`: the threads backend and every strategy on thread ranks
#   MPICH       the tests labelled `mpich`: the MPI backend built against MPICH and run by its launcher
#   fuzz        the safetensors reader under libFuzzer for a bounded time
# `scripts/test.sh --full` (make test-full) runs every test in every pass instead of the named subsets.
# Sanitizer builds are -O1: the tests run 2-4 times faster than at -O0, and the sanitizers see the same
# accesses (ASan's and TSan's own advice).
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
case "${1:-}" in
  --full) full=1 ;;
  "") ;;
  *) echo "test.sh: unknown argument '$1': give nothing (the CI set) or --full (every test in every pass)" >&2; exit 2 ;;
esac
jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

summary=()
stage_start=0
stage_name=""
begin() { stage_name=$1; stage_start=$SECONDS; echo "== $stage_name"; }
end() {
  local took=$((SECONDS - stage_start))
  local line; line=$(printf '%-44s %3d min %02d s' "$stage_name" $((took / 60)) $((took % 60)))
  summary+=("$line")
  echo "== $stage_name: done in $((took / 60)) min $((took % 60)) s"
}

configure_and_build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DSHARD_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
}

sanitizer_flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-O1 -g")

begin "format: every C file in .clang-format's layout"
scripts/format.sh --check
end

begin "release build (-Wall -Wextra -Werror): all tests"
configure_and_build build -DCMAKE_BUILD_TYPE=Release
(cd build && ctest --output-on-failure -j"$jobs" | tee release-pass.log)
python3 scripts/check_budgets.py build/tests/label_budgets.txt build/release-pass.log
end

begin "ASan + UBSan: $([[ $full == 1 ]] && echo 'all tests' || echo "the 'asan' subset")"
configure_and_build build-asan "${sanitizer_flags[@]}" -DSHARD_SANITIZE=address,undefined
asan_select=(-L asan); [[ $full == 1 ]] && asan_select=()
(cd build-asan && ctest --output-on-failure -j"$jobs" "${asan_select[@]}")
end

begin "TSan: $([[ $full == 1 ]] && echo 'every threads-backend test' || echo "the 'tsan' subset")"
configure_and_build build-tsan "${sanitizer_flags[@]}" -DSHARD_SANITIZE=thread
# GCC 12's TSan cannot map its shadow memory under the high ASLR entropy of
# newer kernels; running without address randomisation avoids that.
norandom=()
if setarch "$(uname -m)" -R true 2>/dev/null; then norandom=(setarch "$(uname -m)" -R); fi
tsan_select=(-L tsan); [[ $full == 1 ]] && tsan_select=(-LE "mpi|install")
(cd build-tsan && "${norandom[@]}" ctest --output-on-failure -j"$jobs" "${tsan_select[@]}")
end

if [[ -x /usr/bin/mpicc.mpich ]]; then
  begin "MPICH build: $([[ $full == 1 ]] && echo 'every MPI test' || echo "the 'mpich' subset") (hydra launcher)"
  configure_and_build build-mpich -DCMAKE_BUILD_TYPE=Release -DMPI_C_COMPILER=/usr/bin/mpicc.mpich
  mpich_select=(-L mpich); [[ $full == 1 ]] && mpich_select=(-L mpi)
  (cd build-mpich && ctest --output-on-failure -j"$jobs" "${mpich_select[@]}")
  end
fi

begin "fuzzing (clang, libFuzzer + ASan + UBSan): the safetensors reader, ${SHARD_FUZZ_SECONDS:-60} s"
CC=clang cmake -S . -B build-fuzz -DSHARD_WERROR=ON -DCMAKE_BUILD_TYPE=Debug -DSHARD_FUZZ=ON \
  -DSHARD_FUZZ_SECONDS="${SHARD_FUZZ_SECONDS:-60}" >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors
(cd build-fuzz && ctest --output-on-failure -L fuzz)
end

echo "== all test runs passed"
printf '   %s\n' "${summary[@]}"
