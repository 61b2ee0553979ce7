# shard — top-level entry points.  CMake + CTest underneath.
#   make demo    install missing packages, build, train the tiny GPT on fortunes on 4 ranks (~2 min), sample it
#   make test    install, build with -Werror, run every test; again under ASan+UBSan; threads tests
#                under TSan; MPI tests built against MPICH
#   make bench   the benchmark tables of the README
#   make install PREFIX=/some/where   build, then install headers, libshard.a / libshard.so, the shard
#                CLI, shard.pc and the CMake package under PREFIX (default /usr/local)
#   make deps | build | clean

BUILD ?= build
JOBS  ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all deps build demo test bench install clean

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

bench: build
	@scripts/bench.sh

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-mpich
