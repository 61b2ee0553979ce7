#!/usr/bin/env python3
"""expect_failure.py — run a command that must fail: non-zero exit, within a time
limit, printing a line that matches a regular expression.

usage: expect_failure.py --expect REGEX [--forbid REGEX] [--max-seconds S] [--exit-code N] -- COMMAND...
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect", action="append", required=True, help="regex the output must match (repeatable)")
    ap.add_argument("--forbid", action="append", default=[], help="regex the output must not match (repeatable)")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--exit-code", type=int, default=None, help="exact exit code wanted (default: any non-zero)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command and args.command[0] == "--" else args.command
    if not cmd:
        ap.error("no command given")
    start = time.monotonic()
    # Output goes to a file, not a pipe: a launcher's helper that lingers after
    # the job ended must not keep us waiting for end-of-file.
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=args.max_seconds + 30)
        except subprocess.TimeoutExpired:
            code = None
        try:  # whatever the command left behind goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if code is None:
            proc.wait()
        out.seek(0)
        output = out.read()
    if code is None:
        print(output)
        print(f"FAIL: still running after {args.max_seconds + 30:.0f} s: {' '.join(cmd)}")
        return 1
    elapsed = time.monotonic() - start
    problems = []
    if code == 0:
        problems.append("exited 0, expected a failure")
    if args.exit_code is not None and code != args.exit_code:
        problems.append(f"exit code {code}, expected {args.exit_code}")
    for pattern in args.expect:
        if not re.search(pattern, output):
            problems.append(f"output lacks /{pattern}/")
    for pattern in args.forbid:
        if re.search(pattern, output):
            problems.append(f"output has /{pattern}/")
    if elapsed > args.max_seconds:
        problems.append(f"took {elapsed:.1f} s, limit {args.max_seconds:.1f} s")
    if problems:
        print(output)
        for p in problems:
            print("FAIL:", p)
        return 1
    print(f"ok: exit {code} in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
