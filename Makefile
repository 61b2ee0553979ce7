# shard — top-level entry points.  CMake + CTest underneath.
#   make demo    install missing packages, build, train the tiny GPT on fortunes on 4 ranks (~2 min), sample it
#   make test    install, build with -Werror, run every test (each label within its time budget); then
#                the named subsets under ASan+UBSan, TSan and MPICH, and the fuzzer (scripts/test.sh)
#   make test-full  the same passes, each running every test
#   make bench   the benchmark tables of docs/performance.md
#   make format  lay out every C file as .clang-format says (make test fails on a file that differs)
#   make install PREFIX=/some/where   build, then install headers, libshard.a / libshard.so, the shard
#                CLI, shard.pc and the CMake package under PREFIX (default /usr/local)
#   make deps | build | clean

BUILD ?= build
JOBS  ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all deps build demo test test-full bench format install clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSHARD_WERROR=ON >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	@scripts/demo.sh

test: deps
	@scripts/test.sh

test-full: deps
	@scripts/test.sh --full

format:
	@scripts/format.sh

bench: build
	@scripts/bench.sh

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-mpich
