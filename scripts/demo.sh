#!/usr/bin/env bash
# demo.sh — what `make demo` runs: byte-level tokens of Debian's fortunes,
# about two minutes of training of the tiny GPT (configs/gpt-tiny.json) on
# one rank, a checkpoint, and a generated sample.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/demo
rm -rf "$out/ckpt"
mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
build/shard data text "${texts[@]}" --out "$out/data"
build/shard train --config configs/gpt-tiny.json --data "$out/data" --batch 8 --seq 128 --steps 1600 \
  --lr 2e-3 --seed 1 --log "$out/run.jsonl" --save "$out/ckpt" --save-every 800
echo
echo "== a sample (build/shard generate --ckpt $out/ckpt --prompt ... --temperature 0.7)"
build/shard generate --ckpt "$out/ckpt" --prompt "Q: What is the meaning of life?" --tokens 240 \
  --temperature 0.7 --top-k 40 --seed 7
