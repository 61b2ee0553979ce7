# shard — top-level entry points.  CMake + CTest underneath.
#   make demo    install missing packages, build, train the tiny GPT on fortunes on 4 ranks (~2 min), sample it
#   make test    install, build with -Werror, run every test; again under ASan+UBSan; threads tests
#                under TSan; MPI tests built against MPICH
#   make bench   the benchmark tables of docs/performance.md
#   make deps | build | clean

BUILD ?= build
JOBS  ?= $(shell nproc)

.PHONY: all deps build demo test bench clean

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

clean:
	rm -rf $(BUILD) build-asan build-tsan build-mpich
