#!/usr/bin/env python3
"""test_reliability_writes.py — writes that fail are never silent, and an output that cannot be written
is found before the work.

usage: test_reliability_writes.py SHARD_BINARY full|unwritable

full:       on a nearly full tmpfs (room for the probe's byte, not for the output) the --log lines of
            `train`, a checkpoint, the token files of `data text` and a `ckpt export` each fail with exit
            1 and one 'shard: ...' line naming the file and the reason.  The log keeps whole lines only
            and the run saves the step it stopped at; a failed checkpoint leaves the previous one and
            `latest` as they were (verified); a failed token set or export leaves the earlier files
            whole and no temporary behind.  Standard output onto a full device fails the command.
unwritable: a --save, --log or --trace in a read-only directory or under a regular file, a --log in a
            directory with no free block, and a `ckpt export`, `data text` or `bench ckpt` into a
            read-only directory are refused in one line before any step ran (nothing on standard output, no log
            line, no checkpoint).

Each part runs in its own mount namespace (unshare -m, as root) where it mounts what it needs; it
exits 77 (skipped) when the kernel refuses the namespace.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SHARD = os.path.abspath(sys.argv[1])
PART = sys.argv[2] if len(sys.argv) > 2 else ""
MLP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "mlp-teacher.json")
NOSPACE = "No space left on device"
READONLY = "Read-only file system"
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, **kw):
    return subprocess.run([SHARD] + args, capture_output=True, text=True, timeout=120, **kw)


def sh(*args):
    subprocess.run(list(args), check=True, capture_output=True)


def one_line(p, *needles, rc=None):
    """p failed with one 'shard: ' line on stderr holding every needle."""
    lines = p.stderr.strip().splitlines()
    ok = (p.returncode != 0 if rc is None else p.returncode == rc) and len(lines) == 1 \
        and lines[0].startswith("shard: ") and all(n in lines[0] for n in needles)
    return ok, f"rc {p.returncode}, stderr {p.stderr!r}, wanted one line with {needles}"


def expect_line(p, what, *needles, rc=None):
    ok, why = one_line(p, *needles, rc=rc)
    expect(ok, f"{what}: {why}")


MOUNTS = []  # unmounted at the end, newest first, so the temporary directory can be removed


def mount_tmpfs(where, size):
    os.makedirs(where, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where)
    MOUNTS.append(where)


def fill(where, leave_pages):
    """Fill the tmpfs at `where` until leave_pages free 4 KiB pages remain: room for the probe's one byte
    (leave_pages >= 1) but not for an output of more than that; 0 leaves no free block at all."""
    filler = os.path.join(where, "filler")
    with open(filler, "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096) == 4096:
                pass
        except OSError:
            pass
    if leave_pages:
        os.truncate(filler, os.path.getsize(filler) - leave_pages * 4096)


def read_only(where):
    os.makedirs(where, exist_ok=True)
    sh("mount", "--bind", where, where)
    MOUNTS.append(where)
    sh("mount", "-o", "remount,ro,bind", where)


def verify(root):
    p = run(["inspect", "ckpt", root, "--verify"])
    return p.returncode == 0 and "verified" in p.stdout, p.stderr.strip()


def latest(root):
    try:
        with open(os.path.join(root, "latest")) as f:
            return f.read().strip()
    except OSError:
        return None


def train(*extra):
    return run(["train", "--config", MLP, "--seed", "3"] + list(extra))


def full(tmp):
    # --log on a disk that fills: the run stops at the line that did not fit, saves that step, and says so
    disk = os.path.join(tmp, "full")
    mount_tmpfs(disk, "64k")
    fill(disk, 1)
    log, ckpt = os.path.join(disk, "run.jsonl"), os.path.join(tmp, "ckpt")
    p = train("--steps", "200", "--ranks", "2", "--log", log, "--save", ckpt, "--save-every", "50")
    expect_line(p, "a --log that fills its disk", "--log " + log, NOSPACE, "stopped after step", rc=1)
    m = re.search(r"stopped after step (\d+)", p.stderr)
    stopped = int(m.group(1)) if m else -1
    with open(log) as f:
        text = f.read()
    expect(text.endswith("\n"), f"the log ends in a whole line: {text[-80:]!r}")
    try:
        steps = [json.loads(line)["step"] for line in text.splitlines()]  # every line parses
    except ValueError as e:
        steps = []
        expect(False, f"every line of the log parses: {e}")
    expect(steps == list(range(1, stopped)), f"the log holds steps 1..{stopped - 1}, each once: {steps[-3:]}")
    expect(stopped > 1 and "step " + str(stopped + 1) not in p.stdout, f"no step ran past {stopped}")
    expect(latest(ckpt) == f"step_{stopped}" and f"step_{stopped}" in p.stderr,
           f"the step it stopped at is saved, and the line says where: latest {latest(ckpt)!r}")
    ok, why = verify(ckpt)
    expect(ok, f"the checkpoint saved after the failed log line verifies: {why}")

    # a checkpoint that does not fit: the previous one and latest stay, no step_N.tmp is left
    probe = os.path.join(tmp, "probe-ckpt")
    p = train("--steps", "1", "--save", probe)
    one_ckpt = sum(os.path.getsize(os.path.join(probe, "step_1", n)) for n in os.listdir(os.path.join(probe, "step_1")))
    disk2 = os.path.join(tmp, "full2")
    mount_tmpfs(disk2, f"{(one_ckpt * 3 // 2) // 4096 * 4096 + 16384}")  # one checkpoint fits, a second does not
    root = os.path.join(disk2, "ckpt")
    p = train("--steps", "40", "--ranks", "2", "--save", root, "--save-every", "20")
    expect_line(p, "a checkpoint that fills its disk", os.path.join(root, "step_40.tmp", "rank_0000"), NOSPACE, rc=1)
    expect(latest(root) == "step_20", f"latest still names step_20: {latest(root)!r}")
    expect(sorted(os.listdir(root)) == ["latest", "step_20"], f"nothing of step 40 is left: {os.listdir(root)}")
    ok, why = verify(root)
    expect(ok, f"the previous checkpoint verifies after the failed save: {why}")

    # token files: the earlier set stays whole, no new file and no temporary appears
    disk3 = os.path.join(tmp, "full3")
    mount_tmpfs(disk3, "64k")
    small, big = os.path.join(tmp, "small.txt"), os.path.join(tmp, "big.txt")
    with open(small, "w") as f:
        f.write("a small corpus\n" * 20)
    with open(big, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog\n" * 400)
    data = os.path.join(disk3, "data")
    p = run(["data", "text", small, "--out", data])
    expect(p.returncode == 0, f"data text of a small corpus: {p.stderr!r}")
    before = {n: open(os.path.join(data, n), "rb").read() for n in os.listdir(data)}
    fill(disk3, 1)
    p = run(["data", "text", big, "--out", data])
    expect_line(p, "token files that fill their disk", os.path.join(data, "train.tokens"), NOSPACE, rc=1)
    after = {n: open(os.path.join(data, n), "rb").read() for n in os.listdir(data)}
    expect(after == before, f"the earlier token files stay as they were: {sorted(after)} vs {sorted(before)}")

    # export: one file, and Hugging Face's sharded layout; nothing but the filler is left
    disk4 = os.path.join(tmp, "full4")
    mount_tmpfs(disk4, "256k")
    fill(disk4, 1)
    for extra in ([], ["--max-shard-size", "64K"]):
        out = os.path.join(disk4, "model.safetensors")
        p = run(["ckpt", "export", ckpt, "--out", out] + extra)
        expect_line(p, f"an export {extra} that fills its disk", "model", ".safetensors", NOSPACE, rc=1)
        expect(os.listdir(disk4) == ["filler"], f"a failed export {extra} leaves nothing: {os.listdir(disk4)}")

    # standard output onto a full device: the printed report is not a success
    with open("/dev/full", "w") as devfull:
        p = subprocess.run([SHARD, "inspect", "ckpt", ckpt, "--verify"], stdout=devfull, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    expect_line(p, "inspect onto /dev/full", "standard output", NOSPACE, rc=1)


def unwritable(tmp):
    ro = os.path.join(tmp, "ro")
    read_only(ro)
    plain = os.path.join(tmp, "a-file")
    with open(plain, "w") as f:
        f.write("x")
    nofree = os.path.join(tmp, "nofree")
    mount_tmpfs(nofree, "64k")
    fill(nofree, 0)
    log, ckpt = os.path.join(tmp, "run.jsonl"), os.path.join(tmp, "ckpt")
    cases = [
        (["--save", os.path.join(ro, "ckpt"), "--log", log], "--save " + os.path.join(ro, "ckpt"), READONLY),
        (["--save", ckpt, "--log", os.path.join(ro, "run.jsonl")], "--log " + os.path.join(ro, "run.jsonl"), READONLY),
        (["--save", ckpt, "--log", log, "--trace", os.path.join(ro, "t.json")], "--trace", READONLY),
        (["--save", os.path.join(plain, "ckpt"), "--log", log], plain + " exists and is not a directory", ""),
        (["--save", ckpt, "--log", os.path.join(nofree, "run.jsonl")], "--log", NOSPACE),
    ]
    def clear():
        shutil.rmtree(ckpt, ignore_errors=True)
        if os.path.exists(log):
            os.remove(log)

    for extra, needle, reason in cases:
        clear()
        p = train("--steps", "5", *extra)
        expect_line(p, f"train {extra}", needle, reason)
        expect(p.stdout == "", f"refused before the run started (nothing printed): {p.stdout[:200]!r}")
        expect(not os.path.exists(log) and not os.path.exists(ckpt), f"no step logged or saved for {extra}")

    # a checkpoint to export, and a corpus to tokenize, each refused into the read-only directory
    clear()
    p = train("--steps", "2", "--save", ckpt)
    expect(p.returncode == 0, f"a checkpoint to export: {p.stderr!r}")
    p = run(["ckpt", "export", ckpt, "--out", os.path.join(ro, "model.safetensors")])
    expect_line(p, "export into a read-only directory", "--out " + os.path.join(ro, "model.safetensors"), READONLY)
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("some text\n" * 10)
    p = run(["data", "text", corpus, "--out", os.path.join(ro, "data")])
    expect_line(p, "data text into a read-only directory", "--out " + os.path.join(ro, "data"), READONLY)
    p = run(["bench", "ckpt", "--dir", os.path.join(ro, "bench")])
    expect_line(p, "bench ckpt into a read-only directory", "--dir " + os.path.join(ro, "bench"), READONLY)
    expect(os.listdir(ro) == [], f"nothing appeared in the read-only directory: {os.listdir(ro)}")


def main():
    if PART not in ("full", "unwritable"):
        print(__doc__)
        return 2
    if os.environ.get("SHARD_TEST_IN_NAMESPACE") != "1":  # start again inside a mount namespace of its own
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"SKIP: the kernel refuses a mount namespace (unshare -m: {probe.stderr.strip()})")
            return 77
        env = dict(os.environ, SHARD_TEST_IN_NAMESPACE="1")
        return subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable] + sys.argv,
                              env=env).returncode
    tmp = tempfile.mkdtemp(prefix=f"shard-writes-{PART}-")
    try:
        (full if PART == "full" else unwritable)(tmp)
    finally:
        for where in reversed(MOUNTS):
            subprocess.run(["umount", where], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
