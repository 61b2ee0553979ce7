#!/usr/bin/env python3
"""check_docs.py — the documentation rules a reviewer would otherwise have to remember.

    check_docs.py SOURCE_DIR

- README.md holds at most 400 lines (each subject's details live on a page under docs/).
- No tracked text file refers to documents outside the repository (the planning notes the project
  grew from, numbered issues): the code, messages and docs speak of the project itself.
Prints each violation as FILE:LINE: what, and exits 1 when there is one."""
import os
import re
import subprocess
import sys

README_MOST_LINES = 400
# how planning notes kept outside the repository, and numbered issues, are cited (the patterns below)
OUTSIDE = re.compile(r"(?-i:\bBRIEF\b)|\bbrief §|\bseed 0\d\d\b|\bseeds?/|\bissue #?\d+\b|\.\./shared\b|PEERS\.md", re.I)
TEXT = re.compile(r"\.(c|h|cu|cpp|py|sh|md|txt|json|cmake|in|map|js|html)$|^(Makefile|CMakeLists\.txt)$")


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True).stdout
        return [f for f in out.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(("build", "."))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files


def main():
    if len(sys.argv) != 2:
        print("usage: check_docs.py SOURCE_DIR", file=sys.stderr)
        return 2
    root = sys.argv[1]
    bad = []
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        n = sum(1 for _ in f)
    if n > README_MOST_LINES:
        bad.append(f"README.md: {n} lines, more than {README_MOST_LINES}: move a subject's details to a page under docs/")
    me = os.path.relpath(os.path.abspath(__file__), os.path.abspath(root))
    for rel in tracked_files(root):
        if rel == me or not TEXT.search(os.path.basename(rel)):
            continue
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                for k, line in enumerate(f, 1):
                    m = OUTSIDE.search(line)
                    if m:
                        bad.append(f"{rel}:{k}: '{m.group(0)}' refers outside the repository: name the concept instead")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
    for b in bad:
        print(b, file=sys.stderr)
    if not bad:
        print("docs: README within its length; no reference outside the repository")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
