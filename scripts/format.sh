#!/usr/bin/env bash
# format.sh — the project's C layout (.clang-format) over every C source and header in git.
#   scripts/format.sh          rewrite the files that differ (make format)
#   scripts/format.sh --check  change nothing; list each file that differs and exit 1 (make test's first step)
# The layout is clang-format 14's (Debian bookworm); another major version formats some lines differently,
# so the check insists on 14.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in "" | --check) ;; *) echo "format.sh: unknown argument '$mode': give nothing or --check" >&2; exit 2 ;; esac
tool=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z "$tool" ]]; then
  echo "format.sh: clang-format is not installed: run scripts/deps.sh (Debian package clang-format)" >&2
  exit 1
fi
if ! "$tool" --version | grep -q 'version 14\.'; then
  echo "format.sh: $tool is $("$tool" --version | head -1); the layout is clang-format 14's (Debian bookworm)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cpp')
if [[ "$mode" == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    "$tool" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [[ ${#bad[@]} -gt 0 ]]; then
    echo "format: ${#bad[@]} file(s) differ from .clang-format's layout: ${bad[*]}; run 'make format'" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files in .clang-format's layout"
else
  "$tool" -i "${files[@]}"
fi
