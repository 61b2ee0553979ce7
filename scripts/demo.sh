#!/usr/bin/env bash
# demo.sh — what `make demo` runs: byte-level tokens of Debian's fortunes,
# about two minutes of training of the tiny GPT (configs/gpt-tiny.json) on 4
# thread ranks, a 2-D mesh tensor=2 x pipe=2 (Megatron layers in 1F1B
# pipeline stages), printing the mesh, the parameters' specs, the schedule and
# each rank's memory; a checkpoint, and a generated sample.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/demo
rm -rf "$out/ckpt"
mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
build/shard data text "${texts[@]}" --out "$out/data"
build/shard train --config configs/gpt-tiny.json --data "$out/data" --batch 8 --seq 128 --steps 3000 \
  --lr 2e-3 --seed 1 --log "$out/run.jsonl" --save "$out/ckpt" --save-every 1500 \
  --ranks 4 --mesh tensor=2,pipe=2 --schedule 1f1b --micro-batches 4 --print-specs
echo
echo "== a sample (build/shard generate --ckpt $out/ckpt --prompt ... --temperature 0.7)"
build/shard generate --ckpt "$out/ckpt" --prompt "Q: What is the meaning of life?" --tokens 240 \
  --temperature 0.7 --top-k 40 --seed 7
