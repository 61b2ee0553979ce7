#!/usr/bin/env python3
"""test_reliability_inputs.py — the inputs' reliability promises, through the shard command line.

usage: test_reliability_inputs.py SHARD_BINARY

No input hangs: a FIFO (or a directory, a device, a socket) given as any file the engine reads — the
config, the token file, an --init safetensors file or index, a checkpoint's index.json, its rank file,
its `latest` — is refused within seconds in one line naming the path and what stands there.  No input is
read whole before it is judged: a config over 1 MiB is refused by its size.  No quadratic surprise: a GPT
of 8192 layers starts at once, and a config within the documented bounds but past the machine's memory is
refused up front naming the memory it needs and the memory there is.  Strict where Hugging Face is: n_inner
0 is refused, a config without model_type says on the banner that gpt2 was assumed, number flags take
plain decimal only.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SHARD = sys.argv[1]
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, timeout=20):
    """The command's result; a hang past the timeout is a failure of its own, not a stuck test."""
    started = time.monotonic()
    try:
        p = subprocess.run([SHARD] + args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        expect(False, f"{args}: still running after {timeout} s (it waits on its input)")
        return None
    p.seconds = time.monotonic() - started
    return p


def refused(args, code, words, seconds=10):
    """args fail with exit code, within `seconds`, in one stderr line holding every one of words."""
    p = run(args, timeout=seconds)
    if p is None:
        return
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    expect(p.returncode == code, f"{args}: exit {p.returncode}, expected {code}: {p.stderr!r}")
    expect(len(lines) == 1, f"{args}: {len(lines)} stderr lines, expected one: {p.stderr!r}")
    for w in words:
        expect(w in p.stderr, f"{args}: stderr {p.stderr!r} lacks {w!r}")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def main():
    work = tempfile.mkdtemp(prefix="shard-reliability-inputs-")
    try:
        j = lambda *parts: os.path.join(work, *parts)
        with open(j("corpus.txt"), "w") as f:
            f.write("a line of text for a tiny model. " * 64)
        p = run(["data", "text", j("corpus.txt"), "--out", j("data")])
        expect(p is not None and p.returncode == 0, f"data text: {p and p.stderr}")
        tiny = {"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 1, "n_positions": 8, "vocab_size": 256}
        cfg = write_json(j("tiny.json"), tiny)
        train = ["train", "--data", j("data"), "--batch", "1", "--seq", "8", "--steps", "1"]

        # a checkpoint to break: steps 1 and 2 of a 2-step run
        p = run(train + ["--config", cfg, "--steps", "2", "--save-every", "1", "--save", j("ck")])
        expect(p is not None and p.returncode == 0, f"train --save: {p and p.stderr}")

        # ---- no input hangs: a FIFO anywhere the engine reads
        os.mkfifo(j("fifo"))
        refused(train + ["--config", j("fifo")], 1, [j("fifo") + ": cannot read the config", "(a FIFO)"])
        refused(train + ["--config", cfg, "--init", j("fifo")], 1, [j("fifo"), "(a FIFO)"])
        os.mkfifo(j("w.safetensors.index.json"))
        refused(train + ["--config", cfg, "--init", j("w.safetensors.index.json")], 1,
                [j("w.safetensors.index.json") + ": cannot read the index", "(a FIFO)"])
        refused(["inspect", "ckpt", j("w.safetensors.index.json")], 1, ["(a FIFO)"])
        os.mkdir(j("fifo_data"))
        os.mkfifo(j("fifo_data", "train.tokens"))
        refused(["train", "--config", cfg, "--data", j("fifo_data"), "--batch", "1", "--seq", "8", "--steps", "1"], 1,
                [j("fifo_data", "train.tokens") + ": cannot open the token file", "(a FIFO)"])
        step = j("ck", "step_1")
        for name in ("index.json", "rank_00000.safetensors"):  # a checkpoint's files, one at a time
            broken = j("broken_" + name.split(".")[0])
            shutil.copytree(step, broken)
            os.remove(os.path.join(broken, name))
            os.mkfifo(os.path.join(broken, name))
            refused(["inspect", "ckpt", broken, "--verify"], 1, [os.path.join(broken, name), "(a FIFO)"])
            refused(train + ["--config", cfg, "--steps", "2", "--resume", broken], 1,
                    [os.path.join(broken, name), "(a FIFO)"])
        root = j("fifo_root")
        os.mkdir(root)
        os.mkfifo(os.path.join(root, "latest"))
        refused(["inspect", "ckpt", root], 1, [os.path.join(root, "latest"), "(a FIFO)"])
        # a resumed run's --log is read before it is added to
        refused(train + ["--config", cfg, "--steps", "2", "--resume", step, "--log", j("fifo")], 1,
                [j("fifo") + ": cannot read the earlier --log", "(a FIFO)"])
        # a pipe whose writer never comes is the end of `data text`'s input, not a wait
        p = run(["data", "text", j("fifo"), "--out", j("never")], timeout=10)
        expect(p is not None and p.returncode != 0 and "no bytes" in p.stderr, f"data text FIFO: {p and p.stderr}")

        # ---- other things that are not files: a directory, a device, a socket
        refused(train + ["--config", work], 1, [work + ": cannot read the config", "(a directory)"])
        refused(train + ["--config", cfg, "--init", "/dev/null"], 1, ["/dev/null", "(a character device)"])
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(j("sock"))
        refused(train + ["--config", j("sock")], 1, [j("sock") + ": cannot read the config", "(a socket)"])
        sock.close()

        # ---- bounded before read: a 1 GiB config (sparse: nothing written) is refused by its size at once
        with open(j("huge.json"), "wb") as f:
            f.truncate(1 << 30)
        refused(train + ["--config", j("huge.json")], 1,
                [j("huge.json") + ": cannot read the config: 1 GiB, more than the 1 MiB allowed"], seconds=5)
        with open(j("ok.json"), "w") as f:  # within the bound, padding and all, it is read
            f.write(json.dumps(tiny) + " " * 100000)
        p = run(train + ["--config", j("ok.json")])
        expect(p is not None and p.returncode == 0, f"a 100 KB config: {p and p.stderr}")

        # ---- no quadratic surprise: 8192 layers (98,308 tensors) start and train a step at once
        deep = write_json(j("deep.json"), dict(tiny, n_layer=8192))
        p = run(train + ["--config", deep], timeout=60)
        expect(p is not None and p.returncode == 0 and "8192 layers" in p.stdout, f"8192 layers: {p and p.stderr}")
        expect(p is None or p.seconds < 30, f"8192 layers took {p and p.seconds:.1f} s")
        # within the documented bounds, past any machine's memory: refused before allocating, both figures named
        big = write_json(j("big.json"), dict(tiny, n_embd=4096, n_head=16, n_layer=4096, n_positions=1024))
        refused(train + ["--config", big], 1, ["gpt: n_layer 4096 x n_embd 4096", "needs about", "TiB of memory",
                                               "available: give a smaller model"], seconds=5)

        # ---- strict where Hugging Face is
        for inner in (0, -5, 33):
            refused(train + ["--config", write_json(j("inner.json"), dict(tiny, n_inner=inner))], 1,
                    [f"key 'n_inner' = {inner}: must be null or 4 * n_embd = 32"])
        for inner in (None, 32):
            p = run(train + ["--config", write_json(j("inner.json"), dict(tiny, n_inner=inner))])
            expect(p is not None and p.returncode == 0, f"n_inner {inner}: {p and p.stderr}")
        untyped = dict(tiny)
        del untyped["model_type"]
        p = run(train + ["--config", write_json(j("untyped.json"), untyped)])
        banner = p.stdout.splitlines()[0] if p and p.stdout else ""
        expect(p is not None and p.returncode == 0 and banner.startswith("train: GPT") and
               "(model_type missing: gpt2 assumed)" in banner, f"no model_type: banner {banner!r}")
        p = run(train + ["--config", cfg])
        expect(p is not None and "model_type missing" not in p.stdout, f"model_type given: {p and p.stdout!r}")
        for bad in ("0x10", "0x", "inf", "nan", "-inf", "1e", "1e+", "1 ", " 1", "1,5", "1.2.3", "e3", ".", "+", "3e-4x"):
            refused(train + ["--config", cfg, "--lr", bad], 2, [f"--lr '{bad}' is invalid"])
        for bad in ("0x10", " 5", "5 ", "+-5", "1e3"):
            refused(train + ["--config", cfg, "--steps", bad], 2, [f"--steps '{bad}' is invalid"])
        for good in ("3e-4", "0.001", ".5", "5.", "1E-3", "+0.25"):
            p = run(train + ["--config", cfg, "--lr", good])
            expect(p is not None and p.returncode == 0, f"--lr {good}: {p and p.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("inputs: every promise kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
