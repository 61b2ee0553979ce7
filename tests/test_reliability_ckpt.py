#!/usr/bin/env python3
"""test_reliability_ckpt.py — a checkpoint's loaded state is checked like computed state, and its index
is protected like its data files.

usage: test_reliability_ckpt.py SHARD_BINARY

nonfinite: a NaN in a weight, or an infinity in an optimizer moment, written into a checkpoint whose
           file and index checksums are rewritten as the writer computes them: resume refuses, one line
           naming the tensor and the element, and moves nothing.
diverging: a run whose state turns non-finite (a huge --lr, no clipping) never moves `latest` to it:
           the save is refused in one line, `latest` names a step whose every value is finite, and no
           step directory or temporary one is left past it.
index:     the index's own checksum is the writer's (xxh3 of its bytes with its 16 digits as zeros); an
           edited step or a removed tensor entry is refused by --verify, resume and export; without the
           checksum (an older index) the step is checked against its directory and the entries against
           the files; a run with other state arrays than the checkpoint's is refused naming them.
old:       an index written before indexes carried a checksum still loads, verifies and exports, with a
           one-line note.
"""
import ctypes
import ctypes.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SHARD = sys.argv[1]
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "mlp-teacher.json")
TRAIN = ["train", "--config", CONFIG, "--batch", "8", "--seed", "3"]
failures = []


def run(args, timeout=60):
    return subprocess.run([SHARD] + args, capture_output=True, text=True, timeout=timeout)


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def one_line(p):
    return len([l for l in p.stderr.splitlines() if l.strip()]) == 1


# ---- the writer's checksums, computed here: the system's xxhash library, the one shard links

_lib = ctypes.util.find_library("xxhash")
XXH = ctypes.CDLL(_lib or "libxxhash.so.0")
XXH.XXH3_64bits.restype = ctypes.c_uint64
XXH.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(data):
    return XXH.XXH3_64bits(data, len(data))


KEY = b'"index_xxh3": "'


def seal(text):
    """The index's text with its own checksum as the writer computes it (its digits as zeros, hashed)."""
    at = text.rindex(KEY) + len(KEY)
    zeroed = text[:at] + b"0" * 16 + text[at + 16:]
    return zeroed[:at] + b"%016x" % xxh3(zeroed) + zeroed[at + 16:]


def write_index(step_dir, ix, sealed=True):
    """The index as JSON (its index_xxh3 key last, as the writer puts it), resealed unless told not to."""
    text = (json.dumps(ix, indent=1) + "\n").encode()
    with open(os.path.join(step_dir, "index.json"), "wb") as f:
        f.write(seal(text) if sealed and "index_xxh3" in ix else text)


def read_index(step_dir):
    with open(os.path.join(step_dir, "index.json")) as f:
        return json.load(f)


def tensors_of(path):
    """{name: (dtype, shape, begin, end)} of a safetensors file, begin and end absolute."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return {k: (v["dtype"], v["shape"], 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
            for k, v in header.items() if k != "__metadata__"}


def set_value(step_dir, name, element, value):
    """Write one f32 value into the file holding element `element` (row-major over the whole tensor) of
    `name`, then rewrite that file's size and xxh3 in the index and reseal it: only the value is wrong."""
    ix = read_index(step_dir)
    for chunk in ix["tensors"][name]["chunks"]:
        shape = ix["tensors"][name]["shape"]
        at, rest = [], element
        for d in reversed(shape):
            at.insert(0, rest % d)
            rest //= d
        if all(o <= a < o + s for a, o, s in zip(at, chunk["offsets"], chunk["sizes"])):
            break
    local = 0
    for a, o, s in zip(at, chunk["offsets"], chunk["sizes"]):
        local = local * s + (a - o)
    path = os.path.join(step_dir, chunk["file"])
    begin = tensors_of(path)[name][2]
    with open(path, "r+b") as f:
        f.seek(begin + 4 * local)
        f.write(struct.pack("<f", value))
    with open(path, "rb") as f:
        data = f.read()
    ix["files"][chunk["file"]] = {"bytes": len(data), "xxh3": "%016x" % xxh3(data)}
    write_index(step_dir, ix)
    return at


def all_finite(step_dir):
    for fname in os.listdir(step_dir):
        if not fname.endswith(".safetensors"):
            continue
        path = os.path.join(step_dir, fname)
        with open(path, "rb") as f:
            blob = f.read()
        for dtype, _, begin, end in tensors_of(path).values():
            if dtype == "F32" and not all(math.isfinite(v) for (v,) in struct.iter_unpack("<f", blob[begin:end])):
                return False
    return True


def latest(root):
    with open(os.path.join(root, "latest")) as f:
        return f.read().strip()


def make_checkpoint(work, name, extra=()):
    root = os.path.join(work, name)
    p = run(TRAIN + ["--steps", "2", "--save", root, "--save-every", "1"] + list(extra))
    expect(p.returncode == 0 and latest(root) == "step_2", f"the tiny run {extra}: {p.returncode} {p.stderr!r}")
    return root


def nonfinite(work):
    base = make_checkpoint(work, "ck")
    for ranks in ("1", "2"):
        for name, element, value, words in (("layer_0/weights", 5, float("nan"), "holds NaN at [0, 5]"),
                                            ("optimizer.exp_avg_sq.layer_1/weights", 64 * 200 + 7, float("inf"),
                                             "holds +Inf at [200, 7]"),
                                            ("optimizer.exp_avg.layer_0/weights", 64 * 256 - 1, float("-inf"),
                                             "holds -Inf at [63, 255]")):
            root = os.path.join(work, "nf-%s-%d" % (ranks, element))
            shutil.copytree(base, root)
            set_value(os.path.join(root, "step_2"), name, element, value)
            v = run(["inspect", "ckpt", root, "--verify"])
            expect(v.returncode == 0, f"the checksums rewritten as the writer does: {v.stderr!r}")
            p = run(TRAIN + ["--steps", "4", "--ranks", ranks, "--resume", root, "--save", root])
            expect(p.returncode == 1 and one_line(p) and f"tensor '{name}' {words}" in p.stderr
                   and "finite" in p.stderr,
                   f"resume of {name} = {value} on {ranks} ranks: {p.returncode} {p.stderr!r}")
            expect(latest(root) == "step_2" and not os.path.exists(os.path.join(root, "step_3")),
                   f"a refused resume moved nothing: {sorted(os.listdir(root))}")

    # weights given with --init are checked the same way (an exported model is a safetensors file)
    out = os.path.join(work, "exported.safetensors")
    p = run(["ckpt", "export", base, "--out", out])
    expect(p.returncode == 0, f"export: {p.stderr!r}")
    with open(out, "r+b") as f:  # the first weight's element 5 (the file's tensors are sorted by name)
        head = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(head))
        begin = meta["layer_0/weights"]["data_offsets"][0]
        f.seek(8 + head + begin + 5 * 4)
        f.write(struct.pack("<f", float("nan")))
    p = run(TRAIN + ["--steps", "1", "--init", out])
    expect(p.returncode == 1 and one_line(p) and "tensor 'layer_0/weights' holds NaN at [0, 5]" in p.stderr,
           f"--init with a NaN: {p.returncode} {p.stderr!r}")


def diverging(work):
    refused = 0
    for steps, ranks in (("3", "1"), ("4", "1"), ("8", "1"), ("3", "2")):  # 2 ranks: each checks its rows
        root = os.path.join(work, "div-%s-%s" % (steps, ranks))
        p = run(TRAIN + ["--steps", steps, "--ranks", ranks, "--lr", "1e6", "--clip", "0", "--save", root,
                         "--save-every", "1"])
        said = p.stderr.strip()
        if "not saved" in said:
            refused += 1
            expect(p.returncode == 1 and one_line(p) and "holds" in said and "latest is left as it was" in said,
                   f"a save of a state not finite: {p.returncode} {said!r}")
        expect(p.returncode == 1, f"a diverging run exits 1: {p.returncode} {said!r}")
        if not os.path.exists(os.path.join(root, "latest")):
            continue  # refused before its first save: nothing to move
        now = latest(root)
        steps_there = sorted(int(d[5:]) for d in os.listdir(root) if d.startswith("step_") and d[5:].isdigit())
        left = [d for d in os.listdir(root) if d.endswith(".tmp")]
        expect(all_finite(os.path.join(root, now)) and steps_there and max(steps_there) == int(now[5:]) and not left,
               f"latest {now} of a diverging run: finite state, nothing past it: {sorted(os.listdir(root))}")
    expect(refused > 0, "no diverging run reached a save whose state is not finite")


def index(work):
    base = make_checkpoint(work, "ix")
    text = open(os.path.join(base, "step_2", "index.json"), "rb").read()
    expect(text.rstrip().endswith(b"}") and seal(text) == text,
           "the index's own checksum is xxh3 of its bytes with its 16 digits as zeros, its last key")
    out = os.path.join(work, "out.safetensors")

    def refused(root, words, what):
        for args in (["inspect", "ckpt", os.path.join(root, "step_2"), "--verify"],
                     TRAIN + ["--steps", "4", "--resume", os.path.join(root, "step_2")],
                     ["ckpt", "export", os.path.join(root, "step_2"), "--out", out]):
            p = run(args)
            expect(p.returncode == 1 and one_line(p) and words in p.stderr and not os.path.exists(out),
                   f"{args[0]} {args[1]} of {what}: {p.returncode} {p.stderr!r}")

    def edited(name, change, sealed, words, what):
        root = os.path.join(work, name)
        shutil.copytree(base, root)
        step_dir = os.path.join(root, "step_2")
        ix = read_index(step_dir)
        if sealed is None:
            del ix["index_xxh3"]
        change(ix)
        write_index(step_dir, ix, sealed=bool(sealed))
        refused(root, words, what)

    def step_7(ix):
        ix["step"] = 7

    def no_layer_1(ix):
        del ix["tensors"]["layer_1/weights"]

    # an edit the checksum finds
    edited("step", step_7, False, "the index was edited", "an index whose step was edited")
    edited("entry", no_layer_1, False, "the index was edited", "an index with a tensor entry removed")
    # an edit resealed (or an index without a checksum): the step against its directory, the entries
    # against the files
    for sealed in (True, None):
        kind = "sealed" if sealed else "old"
        edited("step-" + kind, step_7, sealed, "its step is 7, but it lies in", f"a {kind} index's step edited")
        edited("entry-" + kind, no_layer_1, sealed, "holds tensor 'layer_1/weights', which the index does not list",
               f"a {kind} index with an entry removed")
    # state arrays other than the run's: named, both ways
    sgd = make_checkpoint(work, "sgd", ["--optimizer", "sgd", "--momentum", "0.9"])
    p = run(TRAIN + ["--steps", "4", "--optimizer", "sgd", "--resume", sgd])
    expect(p.returncode == 1 and one_line(p) and "it holds tensors this run has not" in p.stderr
           and "'optimizer.momentum_buffer.layer_0/weights'" in p.stderr,
           f"resume without the checkpoint's momentum: {p.returncode} {p.stderr!r}")
    plain = make_checkpoint(work, "plain", ["--optimizer", "sgd"])
    p = run(TRAIN + ["--steps", "4", "--optimizer", "sgd", "--momentum", "0.9", "--resume", plain])
    expect(p.returncode == 1 and one_line(p) and "it lacks 'optimizer.momentum_buffer.layer_0/weights'" in p.stderr,
           f"resume with momentum from a checkpoint without it: {p.returncode} {p.stderr!r}")


def old(work):
    root = make_checkpoint(work, "old")
    step_dir = os.path.join(root, "step_2")
    ix = read_index(step_dir)
    del ix["index_xxh3"]
    write_index(step_dir, ix)
    note = "carries no index checksum"
    for args in (["inspect", "ckpt", root, "--verify"],
                 ["ckpt", "export", root, "--out", os.path.join(work, "old.safetensors")],
                 TRAIN + ["--steps", "3", "--resume", root, "--save", root]):
        p = run(args)
        said = [l for l in p.stderr.splitlines() if l.startswith("shard:")]  # (resume warns of its --steps too)
        expect(p.returncode == 0 and len(said) == 1 and note in said[0] and "step_2/index.json" in said[0],
               f"{args[0]} {args[1]} of an index without a checksum: {p.returncode} {p.stderr!r}")
    text = open(os.path.join(root, "step_3", "index.json"), "rb").read()
    expect(latest(root) == "step_3" and KEY in text and seal(text) == text,
           "the step saved after resuming an older index carries a checksum")


def main():
    with tempfile.TemporaryDirectory(prefix="shard-rel-ckpt-") as work:
        for part in (nonfinite, diverging, index, old):
            part(work)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
