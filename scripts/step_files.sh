#!/bin/bash
# step_files.sh — which files one training step's logic passes through: a coverage build (build-cov/)
# runs a tiny GPT for 1 and for 3 steps, and every source file with lines run at least twice more in the
# 3-step run is listed with that line count.  Communicator, core utilities, kernels, data loading and
# the CLI are set aside (pass --all to list them too).  Usage: scripts/step_files.sh [--all] [TRAIN FLAGS]
# e.g. scripts/step_files.sh --ranks 2 --mesh pipe=2
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
all=0
if [ "${1:-}" = --all ]; then all=1; shift; fi
cov=$root/build-cov
cmake -S "$root" -B "$cov" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="--coverage -O0 -fprofile-update=atomic" \
    >/dev/null
cmake --build "$cov" -j2 --target shard >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cov/shard" data text /usr/share/games/fortunes/art --out "$work/data" >/dev/null
echo '{"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32, "vocab_size": 256}' \
    >"$work/tiny.json"
for steps in 1 3; do
    find "$cov" -name '*.gcda' -delete
    "$cov/shard" train --config "$work/tiny.json" --data "$work/data" --batch 4 --seq 16 --steps $steps "$@" >/dev/null
    mkdir "$work/g$steps"
    (cd "$work/g$steps" && find "$cov" -name '*.gcda' -exec sh -c 'gcov -o "$(dirname "$1")" "$1" >/dev/null 2>&1' _ {} \;)
done
python3 - "$work" "$root" "$all" <<'PY'
import glob, sys
work, root, show_all = sys.argv[1], sys.argv[2] + "/", sys.argv[3] == "1"
def counts(d):
    out = {}
    for f in glob.glob(d + "/*.gcov"):
        src, c = None, {}
        for line in open(f, errors="replace"):
            parts = line.split(":", 2)
            if len(parts) < 3: continue
            cnt, no = parts[0].strip().rstrip("*"), parts[1].strip()
            if no == "0" and parts[2].startswith("Source:"): src = parts[2][7:].strip()
            if cnt.isdigit(): c[int(no)] = int(cnt)
        if src: out.setdefault(src, {}).update(c)
    return out
one, three = counts(work + "/g1"), counts(work + "/g3")
aside = ("src/comm/", "src/core/", "src/kernels/", "src/data/", "cli/", "include/")
files = []
for src, c in sorted(three.items()):
    name = src.replace(root, "")
    grown = sum(1 for l, v in c.items() if v - one.get(src, {}).get(l, 0) >= 2)
    if grown and (show_all or not name.startswith(aside)): files.append((name, grown))
for name, grown in files: print(f"{grown:6d}  {name}")
print(f"{len(files)} files")
PY
