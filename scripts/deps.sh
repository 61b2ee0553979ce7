#!/usr/bin/env bash
# deps.sh — install the Debian packages shard builds and tests with; idempotent
# and quick when everything is present (one dpkg-query, no apt call).
set -euo pipefail

packages=(
  build-essential cmake pkg-config   # compiler, build system
  libopenmpi-dev openmpi-bin         # MPI backend, built and tested against Open MPI
  libmpich-dev mpich                 # MPICH: the MPI backend must compile against it too
  libcmocka-dev                      # unit-test framework
  libjansson-dev                     # JSON: safetensors headers, checkpoint indexes
  libxxhash-dev                      # xxh3 checksums of checkpoint files
  libopenblas-dev                    # sgemm (loaded at run time with kernels chosen for the CPU)
  zlib1g-dev                         # gzip-compressed IDX files (Fashion-MNIST)
  fortunes dataset-fashion-mnist     # the corpora: text for the GPT, images for the CNN
  clang libclang-rt-dev              # libFuzzer for the fuzz tests
  clang-format                       # the C layout make test checks (.clang-format)
  python3 python3-numpy              # test drivers; the independent safetensors reference (tools/reference)
)

missing=()
for p in "${packages[@]}"; do
  [[ "$p" == \#* ]] && continue
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
