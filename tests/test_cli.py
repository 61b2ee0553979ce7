#!/usr/bin/env python3
"""test_cli.py — the shard command line as users and scripts see it.

usage: test_cli.py SHARD_BINARY errors|help|bench_json|bench_mpi|bench_redistribute|ckpt|train|demo|inspect

errors:     every bad input gets exactly one 'shard: ...' line on stderr and exit 2
            (exit 1 for a well-formed request that cannot run), naming what would be valid.
help:       every verb and sub-verb named by `shard help` prints its usage on `--help` (anywhere among its
            flags) and as `shard help VERB [SUB]`, exit 0, on stdout; every flag its text lists is one its
            parser takes, and every flag its parser takes is in the text; an unknown verb is refused.
bench_json: `bench comm --json` prints one object per size with the documented keys and
            busbw = algbw x the nccl-tests factor.
bench_mpi:  under mpirun the same, plus the raw MPI baseline and the ratio (and bench redistribute).
bench_redistribute: `bench redistribute --json` prints the five transitions with their steps,
            the bytes a rank sends as the formula says, and busbw = sent / time beside the collective's.
ckpt:       `bench ckpt --keep` leaves a checkpoint; `inspect ckpt --verify` checks it and names a
            corrupted file; `ckpt export` writes one file or Hugging Face's sharded layout, which
            the independent Python reader (tools/reference) accepts.
train:      `data text`, `train` (log keys, loss falling, checkpoint, bitwise-identical losses on a
            rerun, config errors naming the key), `generate` (greedy output reproducible).
demo:       `shard demo` runs and checks its own answers.
inspect:    `shard inspect spec` prints the type, the block grid and every rank's shard.
train_plan: `train --plan plan.json` runs the plan's layout to one rank's losses, prints its predictions
            against the run, and refuses flags that disagree with it and malformed plans in one line.
bench_moe:  `bench moe --json` on the tiny mixture-of-experts GPT over expert=2: its keys and their ranges,
            the PyTorch peer where torch imports.
"""
import json
import os
import re
import subprocess
import sys

SHARD = sys.argv[1]
# the launcher of the MPI the binary was built against (CTest passes it)
MPIEXEC = os.environ.get("SHARD_TEST_MPIEXEC", "mpiexec --oversubscribe").split()
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
failures = []


def run(args, timeout=120, mpi=0):
    cmd = (MPIEXEC + ["-np", str(mpi)] if mpi else []) + [SHARD] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "gpt-tiny.json")


def log_rows(path):
    """The step records of a `train --log` (its final summary record left out)."""
    with open(path) as f:
        return [r for r in map(json.loads, f) if "event" not in r]


def log_summary(path):
    """The summary record that ends a `train --log` ({} when its last line is not one)."""
    with open(path) as f:
        lines = f.read().splitlines()
    last = json.loads(lines[-1]) if lines else {}
    return last if last.get("event") == "summary" else {}


def cluster_file(path, nodes, gbps, latency_us):
    """An emulated cluster written to `path` (returned): `nodes` as given, every link gbps and latency_us."""
    link = {"bandwidth_gbps": gbps, "latency_us": latency_us}
    with open(path, "w") as f:
        json.dump({"nodes": nodes, "network": link, "intra_node": link}, f)
    return path


def tiny_corpus(work, sentence, repeat):
    """`sentence` written `repeat` times to work/corpus.txt and made token files by `shard data text`; their
    directory, work/data."""
    text = os.path.join(work, "corpus.txt")
    with open(text, "w") as f:
        f.write(sentence * repeat)
    data = os.path.join(work, "data")
    p = run(["data", "text", text, "--out", data])
    expect(p.returncode == 0 and "train.tokens" in p.stdout, f"data text: {p.stdout} {p.stderr}")
    return data


def errors():
    import tempfile
    empty = tempfile.NamedTemporaryFile(prefix="shard-cli-empty-")  # an empty input file, removed on exit
    cases = [
        ([], 2, "usage: shard"),
        (["frobnicate"], 2, "shard: unknown verb 'frobnicate': valid verbs are analyze, bench, ckpt, data, demo, generate, inspect, plan, profile, train, version, help"),
        (["bench"], 2, "shard: bench: give what to benchmark: comm, redistribute, ckpt, gemm, train, tensor, pipeline, moe, analyze, plan or reshard"),
        (["bench", "comm", "--op", "allreduce"], 2,
         "shard: --op 'allreduce' is invalid: give all_reduce, all_gather, reduce_scatter, all_to_all or sendrecv"),
        (["bench", "comm", "--ranks", "0"], 2, "shard: --ranks '0' is invalid: give an integer in 1..4096"),
        (["bench", "comm", "--ranks"], 2, "shard: option --ranks needs a value"),
        (["bench", "comm", "--max", "12Q"], 2, "shard: --max '12Q' is invalid: give a size in bytes such as 4096, 4K, 256M or 1G"),
        (["bench", "comm", "--min", "8K", "--max", "4K"], 2, "shard: bench comm: --min 8192 and --max 4096 are invalid"),
        (["bench", "comm", "--dtype", "float"], 2, "valid dtypes are f32, f64, bf16, f16, i8, i32, i64, u8"),
        (["bench", "comm", "--timeout", "-3"], 2, "shard: --timeout '-3' is invalid: give seconds > 0"),
        (["bench", "comm", "--backend", "nccl"], 2, "shard: --backend 'nccl' is invalid: give threads, mpi or auto"),
        (["bench", "comm", "--frob"], 2, "shard: bench comm: unknown option '--frob'"),
        (["bench", "comm", "--backend", "mpi", "--max", "4K"], 1, "shard: --backend mpi needs an MPI launcher"),
        (["demo", "--ranks", "x"], 2, "shard: --ranks 'x' is invalid"),
        (["inspect"], 2, "shard: inspect: give what to inspect"),
        (["inspect", "spec", "--mesh", "data=2"], 2, "--mesh, --shape and --spec are all required"),
        (["inspect", "spec", "--mesh", "data=2", "--shape", "4,x", "--spec", "P()"], 2, "--shape '4,x' is invalid"),
        (["inspect", "spec", "--mesh", "data=2", "--shape", "4", "--spec", "P('model')"], 2,
         "unknown axis 'model'; the mesh's axes are data"),
        (["inspect", "spec", "--mesh", "data=2,data=2", "--shape", "4", "--spec", "P()"], 2, "axis 'data' appears twice"),
        (["inspect", "spec", "--mesh", "data=2", "--shape", "4", "--spec", "P()", "--to", "P('x')"], 2,
         "--to: spec P('x'): unknown axis 'x'"),
        (["bench", "redistribute", "--bytes", "100"], 2, "shard: --bytes 100 is too small: give at least 4K"),
        (["bench", "redistribute", "--mesh", "data=3", "--ranks", "2", "--bytes", "64K"], 1,
         "mesh data=3 needs 3 ranks, got 2"),
        (["bench", "redistribute", "--frob"], 2, "shard: bench redistribute: unknown option '--frob'"),
        (["bench", "ckpt", "--bytes", "10K"], 2, "shard: --bytes 10K is too small: give at least 1M"),
        (["ckpt"], 2, "shard: ckpt: give what to do"),
        (["ckpt", "bogus"], 2, "ckpt: unknown 'bogus': give export"),
        (["generate", "--ckpt", "d", "--config", "c", "--prompt", "a"], 2, "--ckpt DIR carries its config and weights"),
        (["inspect", "schedule", "--pipe", "4", "--micro-batches", "3", "--schedule", "interleaved", "--virtual-stages", "2"],
         2, "--micro-batches 3 is not a multiple of pipe = 4 (give 4 or a multiple)"),
        (["train", "--config", "c", "--data", "d", "--log", "x.jsonl", "--trace", "x.jsonl"], 2,
         "--log and --trace are both x.jsonl"),
        (["generate", "--ckpt", "", "--prompt", "a"], 2, "--ckpt '' is invalid: give a value"),
        (["inspect", "bogus"], 2, "inspect: unknown 'bogus': give spec, ckpt or schedule"),
        (["data", "bogus"], 2, "data: unknown 'bogus': give text"),
        (["ckpt", "export", "x", "--out", "x.bin"], 2, "--out 'x.bin' is invalid: give a file name ending in .safetensors"),
        (["ckpt", "export", "x"], 2, "ckpt export: give a checkpoint directory and --out NAME.safetensors"),
        (["inspect", "ckpt"], 2, "inspect ckpt: give a checkpoint directory or a .safetensors file"),
        (["data"], 2, "shard: data: give what to prepare"),
        (["data", "text", "--out", "/tmp/x"], 2, "data text: give at least one input file and --out DIR"),
        (["data", "text", "f", "--out", "/tmp/x", "--val-fraction", "1.5"], 2, "--val-fraction '1.5' is invalid"),
        (["data", "text", "/nonexistent/f", "--out", "/tmp/shard-cli-never"], 1, "/nonexistent/f: cannot open"),
        (["bench", "gemm", "--size", "3"], 2, "--size '3' is invalid: give an integer in 16..16384"),
        (["train", "--data", "x"], 2, "train: --config CONFIG.json is required"),
        (["bench", "train"], 2, "bench train: --config CONFIG.json is required"),
        (["bench", "train", "--config", "c", "--steps", "5"], 2, "--steps '5' is invalid: give an integer in 20..100000"),
        (["train", "--config", "c", "--data", "d", "--lr", "0"], 2, "--lr '0' is invalid: give a number in (0, 1e6]"),
        (["train", "--config", "c", "--data", "d", "--zero", "4"], 2, "--zero '4' is invalid: give an integer in 0..3"),
        (["train", "--config", "c", "--data", "d", "--reshard-at", "10"], 2,
         "--reshard-at '10' is invalid: give STEP:MESH, the step after which the run moves (1 or more) and the new "
         "mesh, e.g. 10:data=2,pipe=2"),
        (["train", "--config", "c", "--data", "d", "--reshard-at", "0:data=2"], 2, "--reshard-at '0:data=2' is invalid"),
        (["train", "--config", "c", "--data", "d", "--mesh", "data=4", "--steps", "30", "--reshard-at", "10:data=2"], 1,
         "--reshard-at 10:data=2: mesh data=2 needs 2 ranks, got 4; meshes of 4 ranks: "),
        (["train", "--config", "c", "--data", "d", "--steps", "30", "--reshard-at", "30:data=1"], 1,
         "--reshard-at 30:data=1: the run's last step is 30, and the move happens after step 30: give a step in 1..29"),
        (["train", "--config", "c", "--data", "d", "--mesh", "pipe=4", "--reshard-at", "2:data=4", "--batch", "2",
          "--micro-batches", "2"], 1, "--reshard-at 2:data=4: the new layout is refused: batch: "),
        (["train", "--config", "c", "--data", "d", "--reshard-at", "1:data=1", "--migration", "warm"], 2,
         "--migration 'warm' is invalid: give stop-and-copy or live"),
        (["train", "--config", "c", "--data", "d", "--reshard-at", "1:data=1", "--live-steps", "3"], 2,
         "--live-steps 3 spreads a live move: give it with --migration live"),
        (["train", "--config", "c", "--data", "d", "--reshard-at", "1:data=1", "--migration", "live", "--live-steps",
          "0"], 2, "--live-steps '0' is invalid: give an integer in 1..64"),
        (["bench", "reshard", "--grad-dtype", "f16"], 2, "--grad-dtype 'f16' is invalid: give f32 or bf16"),
        (["bench", "reshard", "--live-steps", "65"], 2, "--live-steps '65' is invalid: give an integer in 1..64"),
        (["bench", "reshard", "--cluster", "/nonexistent/cluster.json"], 1,
         "/nonexistent/cluster.json: cannot read the cluster description"),
        (["train", "--config", "c", "--data", "d", "--reshard-zero", "1"], 2,
         "--reshard-zero needs --reshard-at STEP:MESH (the step and the mesh the run moves to)"),
        (["train", "--config", "c", "--data", "d", "--reshard-on", "imbalance=0.3"], 2,
         "--reshard-on imbalance=0.3 sets --adaptive's thresholds: give --adaptive too"),
        (["train", "--config", "c", "--data", "d", "--adaptive", "--reshard-on", "imbalanse=0.3"], 2,
         "--reshard-on: unknown trigger 'imbalanse' (did you mean 'imbalance'?): give imbalance, memory or comm"),
        (["train", "--config", "c", "--data", "d", "--adaptive", "--reshard-on", "memory=1.5"], 2,
         "--reshard-on: memory=1.5 is invalid: give a threshold in (0, 1], e.g. memory=0.9"),
        (["train", "--config", "c", "--data", "d", "--adaptive", "--reshard-on", "comm"], 2,
         "--reshard-on: comm= is invalid: give a threshold in (0, 1], e.g. comm=0.4"),
        (["train", "--config", "c", "--data", "d", "--adaptive"], 2,
         "--adaptive re-plans on a cluster's devices: give --cluster FILE"),
        (["train", "--config", "c", "--data", "d", "--adaptive", "--reshard-at", "3:data=1"], 2,
         "--adaptive and --reshard-at 3:data=1 both move the run: give one of them"),
        (["train", "--config", "c", "--data", "d", "--adaptive", "--migration", "copy"], 2,
         "--migration 'copy' is invalid: give stop-and-copy or live"),
        (["train", "--config", "c", "--data", "d", "--grad-dtype", "f16"], 2, "--grad-dtype 'f16' is invalid: give f32 or bf16"),
        (["train", "--config", "c", "--data", "d", "--compute-dtype", "f16"], 2,
         "--compute-dtype 'f16' is invalid: give f32 or bf16"),
        (["train", "--config", "c", "--data", "d", "--sequence-parallel"], 1,
         "--sequence-parallel splits the tokens over the tensor axis, and this mesh has none: give e.g. --mesh data=1,tensor=2"),
        (["train", "--config", "c", "--data", "d", "--ranks", "4", "--mesh", "data=2,context=2"], 1,
         "--mesh: axis 'context' = 2: training splits over 'data', 'expert', 'tensor' and 'pipe'; give context=1 or leave it out"),
        (["train", "--config", "c", "--data", "d", "--ranks", "4", "--mesh", "data=2,experts=2"], 1,
         "--mesh: axis 'experts' = 2: training splits over 'data', 'expert', 'tensor' and 'pipe' (did you mean 'expert'?)"),
        (["train", "--config", "c", "--data", "d", "--schedule", "zigzag"], 2, "--schedule 'zigzag': use gpipe, 1f1b or interleaved"),
        (["train", "--config", "c", "--data", "d", "--optimizer", "adam2"], 2, "--optimizer 'adam2' is invalid: give adamw or sgd"),
        (["train", "--config", "c", "--data", "d", "--momentum", "0.9"], 2,
         "--momentum is for --optimizer sgd; AdamW's momentum is its beta1 (0.9)"),
        (["train", "--config", "c", "--data", "d", "--optimizer", "adamw", "--momentum", "0"], 2, "--momentum is for --optimizer sgd"),
        (["train", "--config", "c", "--data", "d", "--optimizer", "sgd", "--momentum", "-0.5"], 2,
         "--momentum '-0.5' is invalid: give a number in [0, 1e6]"),
        (["train", "--config", "c", "--data", "d", "--ranks", "2", "--mesh", "pipe=2", "--micro-batches", "4", "--accum", "2"], 1,
         "--micro-batches 4 and --accum 2 disagree"),
        (["train", "--config", "c", "--data", "d", "--ranks", "2", "--mesh", "pipe=2", "--schedule", "interleaved",
          "--virtual-stages", "17", "--micro-batches", "4"], 1, "--virtual-stages 17: at most 16 chunks per rank"),
        (["train", "--config", "c", "--data", "d", "--micro-batches", "0"], 2, "--micro-batches '0' is invalid"),
        (["train", "--config", "c", "--data", "d", "--ranks", "2", "--mesh", "data=2", "--recompute"], 1,
         "--recompute acts on a pipe axis of 2 or more ranks, and this mesh has none: give e.g. --mesh pipe=2, or leave"),
        (["train", "--config", "c", "--data", "d", "--mesh", "data=1,pipe=1", "--schedule", "1f1b"], 1,
         "--schedule acts on a pipe axis of 2 or more ranks, and this mesh has pipe=1"),
        (["train", "--config", "c", "--data", "d", "--ranks", "2", "--mesh", "pipe=2", "--virtual-stages", "2"], 1,
         "--virtual-stages 2 needs --schedule interleaved (gpipe runs one chunk per rank)"),
        (["train", "--config", "c", "--data", "d", "--ranks", "2", "--mesh", "pipe=2", "--schedule", "interleaved",
          "--virtual-stages", "2", "--micro-batches", "3"], 1,
         "--schedule interleaved: --micro-batches 3 is not a multiple of pipe = 2 (give 2 or 4)"),
        (["bench", "tensor", "--ranks", "2"], 2, "bench tensor: --config CONFIG.json is required"),
        (["bench", "pipeline", "--ranks", "2"], 2, "bench pipeline: --config CONFIG.json is required"),
        (["bench", "pipeline", "--config", "c", "--batch", "4"], 2, "--batch '4' is invalid: give an integer in 8..4096"),
        (["inspect", "schedule", "--pipe", "2"], 2, "inspect schedule: give --pipe P and --micro-batches M"),
        (["train", "--config", "c", "--data", "d", "--spec", "wte.weight"], 2,
         "--spec 'wte.weight' is invalid: give NAME=SPEC, one per --spec"),
        (["bench", "train", "--config", "c", "--zero", "4"], 2, "--zero '4' is invalid: give an integer in 0..3"),
        (["bench", "train", "--config", TINY, "--ranks", "3", "--batch", "8", "--no-torch"], 2,
         "bench train: --batch 8 does not divide over 3 ranks; give a multiple of 3"),
        (["bench", "train", "--config", TINY, "--ranks", "2", "--threads", "2"], 2,
         "bench train: --threads is for the one-rank benchmark"),
        (["bench", "train", "--config", TINY, "--backend", "mpi"], 2,
         "bench train: --backend and --timeout are for ranks"),
        (["bench", "tensor", "--config", TINY, "--steps", "3"], 2, "--steps '3' is invalid: give an integer in 5..100000"),
        (["bench", "comm", "--op", "all_gather", "--ranks", "2", "--min", "1", "--max", "8"], 1,
         "bench comm: 1 bytes of f32 give all_gather over 2 ranks no element each; give --min 8 or more"),
        (["bench", "train", "--config", "c", "--compute-dtype", "f8"], 2, "--compute-dtype 'f8' is invalid: give f32 or bf16"),
        (["train", "--config", "c", "--data", "d", "--ranks", "2", "--batch", "8", "--micro-batch", "3", "--accum", "1"], 1,
         "batch: --batch 8 != --micro-batch 3 x --accum 1 x data 2 = 6"),
        (["train", "--config", "c", "--data", "d", "--ranks", "2", "--mesh", "data=3"], 1, "data=3"),
        (["generate", "--prompt", "x"], 2, "generate: give --prompt and either --ckpt DIR"),
        (["inspect", "spec", "--mesh", "data=2", "--shape", "99999999999999999999", "--spec", "P('data')"], 2,
         "--shape '99999999999999999999' is invalid"),
        (["inspect", "spec", "--mesh", "data=2", "--shape", " -1", "--spec", "P('data')"], 2, "--shape ' -1' is invalid"),
        (["inspect", "spec", "--mesh", "a=2", "--shape", "8", "--dtype", "u8", "--spec",
          "P(None, partial='a', partial_op='avg')"], 2, "a pending avg of u8 would wrap its sum"),
        (["bench", "redistribute", "--mesh", "data="], 2, "--mesh 'data=' is invalid"),
        (["bench", "redistribute", "--ranks", "1025", "--bytes", "4K"], 2, "--ranks 1025 is more than the 1024"),
        (["bench", "train", "--config", "c", "--bucket-mb", "1e300"], 2, "--bucket-mb '1e300' is invalid"),
        (["ckpt", "export", "x", "--out", "y", "--max-shard-size", "0"], 2, "--max-shard-size '0' is invalid"),
        (["generate", "--ckpt", "/nonexistent", "--prompt", "x"], 1, "/nonexistent: not a checkpoint"),
        (["inspect", "ckpt", "/nonexistent/x.safetensors"], 1, "/nonexistent/x.safetensors: cannot open"),
        (["bench", "train", "--config", "c", "--mesh", "data=x"], 2, "bench train: --mesh 'data=x' is invalid here"),
        (["bench", "train", "--config", "c", "--mesh", "data=3", "--ranks", "2"], 2,
         "bench train: --mesh data=3 and --ranks 2 disagree"),
        (["bench", "frob"], 2, "bench: unknown benchmark 'frob': give comm, redistribute, ckpt, gemm, train, tensor, pipeline, moe, analyze, plan or reshard"),
        (["data", "text", empty.name, "--out", "/tmp/shard-cli-never"], 1, "the 1 input file holds no bytes"),
        (["data", "text", os.path.abspath(__file__), "--out", "/dev/null"], 1, "/dev/null exists and is not a directory"),
        (["data", "text", "f", "--out", "/tmp/x", "--val-fraction", ""], 2, "--val-fraction '' is invalid"),
        (["train", "--config", "c", "--data", "d", "--clip", ""], 2, "--clip '' is invalid: give a value"),
        (["data", "text", "f", "--out", ""], 2, "--out '' is invalid: give a value"),
        (["data", "text", "/dev/zero", "--out", "/tmp/shard-never"], 1, "/dev/zero: a device, not a text file"),
        (["train", "--config", TINY, "--data", "d", "--mesh", "pipe=2", "--layers-per-stage", "99999999999999999999,1"], 1,
         "give 2 counts >= 1 separated by commas"),
        (["train", "--config", "c", "--data", "d", "--clip", "2e6"], 2, "--clip '2e6' is invalid: give a number in [0, 1e6]"),
        (["train", "--config", "c", "--data", "d", "--lr", "1e-3", "--min-lr", "2e-3"], 2,
         "--min-lr 0.002 is above --lr 0.001: the schedule decays from --lr down to --min-lr"),
        (["train", "--config", "c", "--data", "d", "--save-every", "5"], 2, "--save-every 5 needs --save DIR"),
        (["version", "--foo"], 2, "version takes no arguments, not '--foo'"),
        (["train", "--config", "c", "--data", "d", "--lr", "nan"], 2, "--lr 'nan' is invalid"),
        (["train", "--config", "/tmp", "--data", "d"], 1, "/tmp: cannot read the config: not a regular file"),
        (["train", "--config", "/nonexistent/c.json", "--data", "d"], 1,
         "/nonexistent/c.json: cannot read the config: No such file or directory"),
        (["generate", "--config", TINY, "--init", "/nonexistent/w.safetensors", "--prompt", "x", "--temperature", ""], 2,
         "--temperature '' is invalid"),
        # the prompt is not echoed before the weights are known to load (stdout stays empty)
        (["generate", "--config", TINY, "--init", "/nonexistent/w.safetensors", "--prompt", "hello"], 1,
         "/nonexistent/w.safetensors: cannot open"),
    ]
    for args, code, text in cases:
        p = run(args)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode == code, f"{args}: exit {p.returncode}, expected {code}")
        expect(text in p.stderr, f"{args}: stderr {p.stderr!r} lacks {text!r}")
        if args:  # the usage text is several lines; every error is one
            expect(len(lines) == 1, f"{args}: {len(lines)} stderr lines, expected one: {p.stderr!r}")
        expect(p.stdout == "", f"{args}: wrote to stdout: {p.stdout!r}")
    p = run(["version"])
    expect(p.returncode == 0 and "shard" in p.stdout and "threads" in p.stdout, f"version: {p.stdout!r}")
    expect(re.match(r"shard \d+\.\d+\.\d+ \(backends: threads", p.stdout) is not None, f"version: {p.stdout!r}")
    q = run(["--version"])
    expect(q.returncode == 0 and q.stdout == p.stdout, f"--version: {q.stdout!r}, version: {p.stdout!r}")


# The flags each verb's parser takes (cli/*.c): its usage text must list every one.
RANK_FLAGS = {"--ranks", "--backend", "--timeout", "--verbose", "-v", "--cluster", "--device-map"}
PARSED_FLAGS = {
    ("bench", "comm"): RANK_FLAGS | {"--op", "--min", "--max", "--dtype", "--warmup", "--iters", "--no-baseline", "--cold",
                                     "--json"},
    ("bench", "redistribute"): RANK_FLAGS | {"--mesh", "--bytes", "--warmup", "--iters", "--json"},
    ("bench", "ckpt"): RANK_FLAGS | {"--bytes", "--iters", "--dir", "--keep", "--json"},
    ("bench", "gemm"): {"--size", "--threads", "--iters", "--json"},
    ("bench", "train"): RANK_FLAGS | {"--config", "--batch", "--seq", "--steps", "--warmup", "--threads", "--zero",
                                      "--mesh", "--bucket-mb", "--grad-dtype", "--compute-dtype", "--json", "--no-torch"},
    ("bench", "tensor"): RANK_FLAGS | {"--config", "--batch", "--seq", "--steps", "--json"},
    ("bench", "pipeline"): RANK_FLAGS | {"--config", "--batch", "--seq", "--steps", "--json"},
    ("bench", "plan"): {"--config", "--cluster", "--goal", "--batch", "--seq", "--top", "--steps", "--warmup", "--json"},
    ("bench", "reshard"): {"--config", "--batch", "--seq", "--repeats", "--json", "--grad-dtype", "--cluster",
                           "--live-steps"},
    ("bench", "moe"): RANK_FLAGS | {"--config", "--batch", "--seq", "--steps", "--json", "--mesh", "--warmup",
                                    "--threads", "--no-peer"},
    ("analyze",): {"--config", "--mesh", "--ranks", "--batch", "--seq", "--micro-batch", "--accum", "--zero",
                   "--bucket-mb", "--grad-dtype", "--compute-dtype", "--optimizer", "--sequence-parallel", "--spec",
                   "--schedule", "--micro-batches", "--virtual-stages", "--recompute", "--layers-per-stage",
                   "--exact-ranks", "--json", "--profile", "--cluster", "--device-map", "--batch-shares",
                   "--measured"},
    ("profile",): {"--out", "--quick"},
    ("plan",): {"--config", "--cluster", "--device-map", "--profile", "--batch", "--seq", "--goal",
                "--max-memory-fraction", "--placement", "--top", "--out", "--json", "--search", "--verify",
                "--latency-budget-ms", "--grow-batch", "--grad-dtype", "--max-comm-fraction",
                "--max-compute-imbalance", "--refine", "--place-top"},
    ("bench", "analyze"): {"--profile", "--cluster", "--device-map", "--limit", "--steps", "--warmup", "--json",
                           "--rounds"},
    ("ckpt", "export"): {"--out", "--max-shard-size", "--optimizer"},
    ("data", "text"): {"--out", "--val-fraction"},
    ("demo",): RANK_FLAGS,
    ("generate",): {"--ckpt", "--config", "--init", "--prompt", "--tokens", "--temperature", "--top-k", "--seed"},
    ("inspect", "spec"): {"--mesh", "--shape", "--spec", "--dtype", "--to"},
    ("inspect", "schedule"): {"--pipe", "--micro-batches", "--schedule", "--virtual-stages", "--backward-cost"},
    ("inspect", "ckpt"): {"--verify"},
    ("train",): RANK_FLAGS | {"--config", "--data", "--init", "--log", "--save", "--mesh", "--resume", "--grad-dtype",
                              "--compute-dtype", "--schedule", "--layers-per-stage", "--trace", "--batch", "--seq",
                              "--steps", "--save-every", "--warmup", "--zero", "--accum", "--micro-batch",
                              "--micro-batches", "--virtual-stages", "--lr", "--min-lr", "--weight-decay", "--clip",
                              "--bucket-mb", "--sequence-parallel", "--recompute", "--print-specs", "--spec", "--seed",
                              "--batch-shares", "--plan", "--reshard-at", "--reshard-zero", "--migration", "--live-steps",
                              "--adaptive", "--reshard-on"},
}


def listed(text, heading):
    """The names in the two-space-indented list under the first line starting with heading (up to a blank line)."""
    import re
    names, inside = [], False
    for line in text.splitlines():
        if inside and not line.strip():
            break
        if inside and re.match(r"^  \S", line):
            names.append(line.split()[0])
        inside = inside or line.startswith(heading)
    return names


def text_flags(text):
    """The flags an option line of a usage text names: '  --flag VALUE   meaning' or '  --flag, -f   meaning'."""
    import re
    flags = set()
    for line in text.splitlines():
        m = re.match(r"^  (-[-\w]+)(?: [^ ,]+)?(?:, (-[-\w]+))?(?: {2,}|$)", line)
        if m:
            flags.update(f for f in m.groups() if f)
    return flags


def help_texts():
    top = run(["help"])
    expect(top.returncode == 0 and top.stdout.startswith("usage: shard") and top.stderr == "",
           f"help: exit {top.returncode}, stdout {top.stdout[:80]!r}, stderr {top.stderr!r}")
    for args in (["--help"], ["-h"], ["help", "help"], ["help", "--help"]):
        p = run(args)
        expect(p.returncode == 0 and p.stdout == top.stdout and p.stderr == "", f"{args}: not `shard help`'s text: {p}")
    verbs = listed(top.stdout, "verbs")
    # the list and the dispatch agree: the verbs an unknown one is told of are the verbs listed
    p = run(["help", "nosuch"])
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    expect(p.returncode == 2 and p.stdout == "" and len(lines) == 1 and "help: unknown verb 'nosuch': valid verbs are" in
           p.stderr, f"help nosuch: exit {p.returncode}, stderr {p.stderr!r}, stdout {p.stdout!r}")
    named = lines[0].split("valid verbs are ", 1)[1].split(", ") if len(lines) == 1 and "valid verbs are " in lines[0] else []
    expect(sorted(verbs) == sorted(named), f"verbs listed {verbs} are not those valid {named}")
    leaves = []
    for verb in verbs:
        if verb == "help":
            continue
        p = run(["help", verb])
        expect(p.returncode == 0 and p.stdout.startswith(f"usage: shard {verb}") and p.stderr == "",
               f"help {verb}: exit {p.returncode}, stdout {p.stdout[:80]!r}, stderr {p.stderr!r}")
        subs = listed(p.stdout, "sub-verbs")
        leaves += [(verb, sub) for sub in subs] or [(verb,)]
        if subs:
            leaves.append((verb,))  # the verb's own text: its sub-verbs and --help
    expect(len(leaves) >= len(PARSED_FLAGS), f"fewer verbs and sub-verbs than known: {leaves}")
    for leaf in leaves:
        name = " ".join(leaf)
        p = run(["help"] + list(leaf))
        expect(p.returncode == 0 and p.stdout.startswith(f"usage: shard {name}") and p.stderr == "",
               f"help {name}: exit {p.returncode}, stdout {p.stdout[:80]!r}, stderr {p.stderr!r}")
        for args in (list(leaf) + ["--help"], list(leaf) + ["-h"]):
            q = run(args)
            expect(q.returncode == 0 and q.stdout == p.stdout and q.stderr == "",
                   f"{args}: exit {q.returncode}, not the text of `shard help {name}`: {q.stderr!r}")
        flags = text_flags(p.stdout)
        expect({"--help", "-h"} <= flags, f"help {name}: --help is not listed: {sorted(flags)}")
        missing = PARSED_FLAGS.get(leaf, set()) - flags
        expect(not missing, f"help {name}: the parser takes {sorted(missing)}, which the text does not list")
        # every flag listed is the parser's: given an empty value (or followed by an empty argument) it is
        # refused for that value, never as an unknown option, and nothing runs
        for flag in sorted(flags - {"--help", "-h", "--version"}):
            q = run(list(leaf) + [flag, ""], timeout=60)
            expect(q.returncode != 0 and f"unknown option '{flag}'" not in q.stderr,
                   f"{name} {flag}: listed by the text, refused by the parser: {q.stderr!r}")
    # --help anywhere among a verb's flags, even after a bad value
    for args, verb in ((["train", "--config", "c", "--zero", "9", "--help"], "train"),
                       (["bench", "comm", "--op", "bogus", "-h"], "bench comm"),
                       (["inspect", "ckpt", "/nonexistent", "--help", "--verify"], "inspect ckpt"),
                       (["data", "text", "f", "--help", "--out"], "data text")):
        p = run(args)
        expect(p.returncode == 0 and p.stdout.startswith(f"usage: shard {verb}") and p.stderr == "",
               f"{args}: exit {p.returncode}, stdout {p.stdout[:80]!r}, stderr {p.stderr!r}")
    p = run(["version", "--help"])
    expect(p.returncode == 0 and p.stdout.startswith("usage: shard version"), f"version --help: {p}")
    # refused in one line: more than a verb and its sub-verb, a sub-verb of a verb without, an unknown sub-verb
    for args, text in ((["help", "train", "extra"], "help: train has no sub-verbs, not 'extra'"),
                       (["help", "bench", "comm", "extra"], "help: one verb and one sub-verb, not 'extra' too"),
                       (["help", "bench", "nosuch"], "bench: unknown benchmark 'nosuch'"),
                       (["help", "inspect", "nosuch"], "inspect: unknown 'nosuch'")):
        p = run(args)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode == 2 and p.stdout == "" and len(lines) == 1 and text in p.stderr,
               f"{args}: exit {p.returncode}, stderr {p.stderr!r}, stdout {p.stdout!r}")


FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "sendrecv": lambda n: 1.0}
KEYS = {"op", "backend", "ranks", "bytes", "time_us", "algbw_gbps", "busbw_gbps"}


def check_json(stdout, op, ranks, backend, sizes, baseline, cold=False):
    rows = [json.loads(l) for l in stdout.splitlines() if l.strip()]
    expect(len(rows) == sizes, f"{op}: {len(rows)} rows, expected {sizes}")
    for row in rows:
        want = KEYS | ({"baseline_busbw_gbps", "ratio"} if baseline else set()) | ({"cold"} if cold else set())
        expect(not cold or row.get("cold") is True, f"{op}: --cold row {row}")
        expect(set(row) == want, f"{op}: keys {sorted(row)}, expected {sorted(want)}")
        expect(row["op"] == op and row["ranks"] == ranks and row["backend"] == backend, f"{op}: row {row}")
        expect(row["time_us"] > 0, f"{op}: time {row['time_us']}")
        algbw = row["bytes"] / (row["time_us"] * 1e3)
        expect(abs(row["algbw_gbps"] - algbw) <= 1e-3 * algbw + 1e-4, f"{op}: algbw {row['algbw_gbps']} vs {algbw}")
        bus = row["algbw_gbps"] * FACTORS[op](ranks)
        expect(abs(row["busbw_gbps"] - bus) <= 1e-3 * bus + 1e-4, f"{op}: busbw {row['busbw_gbps']} vs {bus}")
        if baseline:
            expect(row["baseline_busbw_gbps"] > 0, f"{op}: baseline {row}")
            expect(abs(row["ratio"] - row["busbw_gbps"] / row["baseline_busbw_gbps"]) < 1e-2 * row["ratio"] + 1e-3,
                   f"{op}: ratio {row}")


def bench_json():
    for op, ranks in [("all_reduce", 2), ("all_gather", 4), ("reduce_scatter", 3), ("all_to_all", 4), ("sendrecv", 2)]:
        p = run(["bench", "comm", "--op", op, "--ranks", str(ranks), "--min", "16K", "--max", "256K", "--json"])
        expect(p.returncode == 0, f"{op}: exit {p.returncode}: {p.stderr}")
        check_json(p.stdout, op, ranks, "threads", 5, False)
    # --cold: caches swept and the send buffer written afresh before each call; the same figures, marked
    p = run(["bench", "comm", "--op", "all_to_all", "--ranks", "2", "--min", "64K", "--max", "128K", "--cold",
             "--json"])
    expect(p.returncode == 0, f"--cold: exit {p.returncode}: {p.stderr}")
    check_json(p.stdout, "all_to_all", 2, "threads", 2, False, cold=True)
    for dtype in ("bf16", "f16", "i8", "u8", "f64", "i64"):  # each size checked in the benchmark's own dtype
        for op in ("all_reduce", "reduce_scatter", "all_to_all"):
            p = run(["bench", "comm", "--op", op, "--ranks", "3", "--dtype", dtype, "--min", "1K", "--max", "4K", "--json"])
            expect(p.returncode == 0, f"{op} in {dtype}: exit {p.returncode}: {p.stderr}")
    p = run(["bench", "comm", "--op", "all_reduce", "--ranks", "2", "--max", "8K", "--verbose"])
    expect(p.returncode == 0 and "backend threads" in p.stderr, f"--verbose: {p.stderr!r}")
    expect("bytes" in p.stdout and "busbw" in p.stdout, f"table: {p.stdout!r}")
    # a shell inside an interactive one-task Slurm step (srun --pty bash): its children inherit SLURM_PROCID,
    # SLURM_STEP_ID and SLURM_NTASKS=1, and thread ranks still run
    slurm = dict(ENV, SLURM_PROCID="0", SLURM_STEP_ID="0", SLURM_NTASKS="1")
    p = subprocess.run([SHARD, "bench", "comm", "--ranks", "2", "--max", "4K", "--verbose"], capture_output=True,
                       text=True, timeout=120, env=slurm)
    expect(p.returncode == 0 and "backend threads" in p.stderr, f"inside a one-task srun step: {p.returncode} {p.stderr!r}")


def bench_moe():
    """`bench moe --json` on configs/gpt-moe-tiny.json over expert=2 (few steps) prints one object with the
    documented keys: the exchange's time, bytes and calls per step, the load imbalance, the busbw against
    bench comm's and the hidden fraction in their ranges; the PyTorch peer's step and ratio where torch
    imports (its error named where it does not), none with --no-peer; a dense config, and a mesh without an
    expert axis, refused in one line."""
    cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "gpt-moe-tiny.json")
    base = ["bench", "moe", "--config", cfg, "--batch", "4", "--seq", "32", "--steps", "5", "--warmup", "1",
            "--json"]
    keys = {"config", "mesh", "ranks", "expert_ranks", "step_ms", "tokens_per_s", "all_to_all_ms",
            "all_to_all_counts_ms", "all_to_all_dispatch_ms", "all_to_all_combine_ms", "all_to_all_fraction",
            "all_to_all_bytes", "all_to_all_calls", "load_imbalance", "load_imbalance_worst_layer",
            "dropped_fraction", "exposed_dispatch_ms", "alone_dispatch_ms", "hidden_fraction",
            "all_to_all_busbw_gbps", "comm_all_to_all_bytes", "comm_all_to_all_busbw_gbps",
            "all_to_all_busbw_fraction", "all_to_all_wait_ms", "all_to_all_transfer_ms",
            "all_to_all_data_transfer_ms", "all_to_all_busbw_mean_gbps", "all_to_all_busbw_mean_fraction",
            "all_to_all_recv_imbalance", "comm_all_to_all_cold_busbw_gbps", "all_to_all_busbw_fraction_cold"}
    # the peer runs under /usr/bin/python3 (bench_reference.c starts it), whatever runs this test
    has_torch = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0
    for extra, peer in ((["--ranks", "2", "--no-peer"], False), (["--mesh", "expert=2", "--threads", "1"], has_torch)):
        p = run(base + extra, timeout=120)
        expect(p.returncode == 0, f"bench moe {extra}: exit {p.returncode}: {p.stderr}")
        lines = [l for l in p.stdout.splitlines() if l.strip()]
        r = json.loads(lines[0]) if len(lines) == 1 else {}
        expect(keys <= set(r), f"bench moe {extra}: keys {sorted(keys - set(r))} missing from {r}")
        if not keys <= set(r):
            continue
        expect(r["mesh"] == "expert=2" and r["ranks"] == 2 and r["expert_ranks"] == 2, f"bench moe mesh: {r}")
        # 2 MoE layers: a counts exchange each, dispatch and combine each forward and backward
        expect(r["all_to_all_calls"] == 10 and r["all_to_all_bytes"] > 0, f"bench moe calls and bytes: {r}")
        expect(0 < r["all_to_all_ms"] < r["step_ms"] and r["load_imbalance"] >= 1 and
               r["load_imbalance_worst_layer"] >= r["load_imbalance"], f"bench moe times and load: {r}")
        expect(0 <= r["hidden_fraction"] <= 1 and r["all_to_all_busbw_fraction"] > 0 and
               r["comm_all_to_all_busbw_gbps"] > 0 and r["comm_all_to_all_cold_busbw_gbps"] > 0 and
               abs(r["all_to_all_busbw_fraction_cold"] * r["comm_all_to_all_cold_busbw_gbps"] -
                   r["all_to_all_busbw_gbps"]) <= 1e-3 * r["all_to_all_busbw_gbps"] + 1e-4,
               f"bench moe busbw and hidden: {r}")
        # the split: waiting and moving are both there, the data calls' moving within all the calls'
        expect(r["all_to_all_wait_ms"] >= 0 and 0 < r["all_to_all_data_transfer_ms"] <= r["all_to_all_transfer_ms"]
               and r["all_to_all_busbw_mean_fraction"] > 0 and r["all_to_all_recv_imbalance"] >= 1,
               f"bench moe wait and transfer: {r}")
        if peer:
            expect(r.get("peer_step_ms", 0) > 0 and r.get("ratio_vs_peer", 0) > 0, f"bench moe peer: {r}")
        elif "--no-peer" in extra:
            expect("peer_step_ms" not in r and "peer_error" not in r, f"bench moe --no-peer ran the peer: {r}")
        else:
            expect("peer_error" in r, f"bench moe without torch names no error: {r}")
    dense = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "gpt-tiny.json")
    p = run(base[:4] + ["--mesh", "data=2", "--no-peer"])
    expect(p.returncode == 2 and "no expert axis" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
           f"bench moe without an expert axis: {p.returncode} {p.stderr!r}")
    p = run(["bench", "moe", "--config", dense, "--batch", "4", "--seq", "32", "--steps", "5", "--no-peer"])
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    expect(p.returncode != 0 and len(lines) == 1 and "num_local_experts" in p.stderr,
           f"bench moe on a dense config: {p.returncode} {p.stderr!r}")


def bench_mpi():
    for op in ["all_reduce", "all_to_all"]:
        p = run(["bench", "comm", "--op", op, "--min", "16K", "--max", "64K", "--json"], mpi=2)
        expect(p.returncode == 0, f"mpi {op}: exit {p.returncode}: {p.stderr}")
        check_json(p.stdout, op, 2, "mpi", 3, True)
    p = run(["bench", "comm", "--op", "all_reduce", "--max", "4K", "--verbose"], mpi=2)
    expect(p.returncode == 0 and ("OMPI_COMM_WORLD_RANK=" in p.stderr or "PMI_RANK=" in p.stderr)
           and "backend mpi" in p.stderr,
           f"--verbose under mpirun: {p.stderr!r}")
    p = run(["bench", "redistribute", "--bytes", "1M", "--iters", "5", "--json"], mpi=2)
    expect(p.returncode == 0, f"mpi redistribute: exit {p.returncode}: {p.stderr}")
    check_redistribute(p.stdout, 2, "mpi", 1 << 20)
    p = run(["bench", "comm", "--ranks", "3", "--max", "4K"], mpi=2)
    expect(p.returncode != 0 and "3 ranks asked for (--ranks, or shard_launch's ranks) but the MPI launcher started 2 processes" in p.stderr,
           f"--ranks disagreeing with mpirun: {p.returncode} {p.stderr!r}")
    # the other MPI's launcher: each process would see a world of its own and run the whole job alone
    other = (["/usr/bin/mpiexec.openmpi", "--oversubscribe"] if "mpich" in MPIEXEC[0] else ["/usr/bin/mpiexec.mpich"])
    expect(os.path.exists(other[0]), f"{other[0]} is missing (make deps installs Open MPI and MPICH)")
    if os.path.exists(other[0]):
        p = subprocess.run(other + ["-np", "2", SHARD, "bench", "comm", "--max", "4K"], capture_output=True, text=True,
                           timeout=120, env=ENV)
        expect(p.returncode != 0 and "the launcher started 2 processes" in p.stderr
               and "this build's MPI sees a world of 1" in p.stderr,
               f"{other[0]} with a binary of the other MPI: {p.returncode} {p.stderr!r}")


TRANSITIONS = [("split -> replicated", "all_gather", "all_gather"), ("replicated -> split", "slice", None),
               ("partial -> replicated", "all_reduce", "all_reduce"),
               ("partial -> split", "reduce_scatter", "reduce_scatter"), ("split moved", "all_to_all", "all_to_all")]


def check_redistribute(stdout, ranks, backend, nbytes):
    rows = [json.loads(l) for l in stdout.splitlines() if l.strip()]
    expect([r["transition"] for r in rows] == [t[0] for t in TRANSITIONS], f"transitions: {rows}")
    for row, (name, steps, collective) in zip(rows, TRANSITIONS):
        expect(row["steps"] == steps and row["collective"] == collective, f"{name}: {row}")
        expect(row["ranks"] == ranks and row["backend"] == backend and row["bytes"] <= nbytes, f"{name}: {row}")
        n, size = ranks, row["bytes"]  # every rank's block is size / n: the dims divide
        sent = {"all_gather": (n - 1) * size // n, "slice": 0, "all_reduce": 2 * (n - 1) * size // n,
                "reduce_scatter": (n - 1) * size // n, "all_to_all": (n - 1) * size // (n * n)}[steps]
        expect(row["bytes_sent_per_rank"] == sent, f"{name}: sent {row['bytes_sent_per_rank']}, formula {sent}")
        expect(row["time_us"] > 0, f"{name}: time {row}")
        if collective:
            bus = sent / (row["time_us"] * 1e3)
            expect(abs(row["busbw_gbps"] - bus) <= 1e-3 * bus + 1e-4, f"{name}: busbw {row}")
            expect(row["collective_busbw_gbps"] > 0 and row["ratio"] > 0, f"{name}: {row}")
        else:
            expect(row["busbw_gbps"] is None and row["ratio"] is None, f"{name}: {row}")


def bench_redistribute():
    for ranks in [2, 3]:
        p = run(["bench", "redistribute", "--ranks", str(ranks), "--bytes", "1M", "--iters", "5", "--json"])
        expect(p.returncode == 0, f"redistribute {ranks}: exit {p.returncode}: {p.stderr}")
        check_redistribute(p.stdout, ranks, "threads", 1 << 20)
    for ranks in (["--ranks", "4"], []):  # without --ranks, the mesh gives the count
        p = run(["bench", "redistribute"] + ranks + ["--mesh", "data=2,tensor=2", "--bytes", "256K"])
        expect(p.returncode == 0 and "mesh data=2,tensor=2" in p.stdout and "all_to_all" in p.stdout,
               f"redistribute table {ranks}: {p.stdout!r} {p.stderr!r}")
    p = run(["inspect", "spec", "--mesh", "a=2,b=3", "--shape", "30,17", "--spec", "P('a', 'b')", "--to",
             "P('b', 'a')"])
    expect(p.returncode == 0 and "redistribute P('a', 'b') -> P('b', 'a'): 1 step" in p.stdout
           and "1. exchange over a,b" in p.stdout, f"inspect --to: {p.stdout!r}")


def ckpt():
    import shutil
    import tempfile
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "reference"))
    import safetensors_ref  # needs numpy (Debian's python3-numpy, which scripts/deps.sh installs)
    work = tempfile.mkdtemp(prefix="shard-cli-ckpt-")
    try:
        d = os.path.join(work, "ck")
        p = run(["bench", "ckpt", "--ranks", "2", "--bytes", "4M", "--iters", "5", "--dir", d, "--keep", "--json"])
        expect(p.returncode == 0, f"bench ckpt: exit {p.returncode}: {p.stderr}")
        row = json.loads(p.stdout) if p.returncode == 0 else {}
        keys = {"backend", "dir", "kept", "ranks", "bytes", "save_s", "load_s", "write_s", "read_s", "save_gbps",
                "load_gbps", "write_gbps", "read_gbps", "save_ratio", "load_ratio"}
        expect(set(row) == keys and row.get("bytes") == 4 << 20 and row.get("save_ratio", 0) > 0
               and row.get("dir") == d and row.get("kept") is True, f"bench ckpt: {row}")
        # a --dir whose parents are missing: the run makes them and removes all it made
        top = os.path.join(work, "made")
        p = run(["bench", "ckpt", "--ranks", "2", "--bytes", "1M", "--iters", "5", "--dir", os.path.join(top, "a", "b"),
                 "--json"])
        expect(p.returncode == 0 and not os.path.exists(top), f"bench ckpt left {top}: {p.stderr}")
        p = run(["inspect", "ckpt", d, "--verify"])
        expect(p.returncode == 0 and "step 5, saved on mesh data=2 (2 ranks), 8 tensors in 2 files" in p.stdout
               and "P('data', None)" in p.stdout and "verified: 2 files" in p.stdout, f"inspect ckpt: {p.stdout} {p.stderr}")
        f0 = os.path.join(d, "step_5", "rank_00000.safetensors")
        p = run(["inspect", "ckpt", f0])
        expect(p.returncode == 0 and "8 tensors" in p.stdout and "layer_0" in p.stdout, f"inspect file: {p.stdout}")
        out = os.path.join(work, "model.safetensors")
        p = run(["ckpt", "export", d, "--out", out])
        expect(p.returncode == 0 and os.path.getsize(out) > 4 << 20, f"export: {p.stdout} {p.stderr}")
        # 8 tensors of 512 KiB: two per 1 MiB part
        p = run(["ckpt", "export", d, "--out", os.path.join(work, "sharded.safetensors"), "--max-shard-size", "1M"])
        index = os.path.join(work, "sharded.safetensors.index.json")
        expect(p.returncode == 0 and os.path.exists(index), f"sharded export: {p.stdout} {p.stderr}")
        if os.path.exists(index):
            _, whole = safetensors_ref.read(out)
            weight_map = json.load(open(index))["weight_map"]
            parts = {}
            for name, fname in weight_map.items():
                parts.setdefault(fname, safetensors_ref.read(os.path.join(work, fname))[1])
            expect(sorted(whole) == [f"layer_{k}" for k in range(8)] and sorted(weight_map) == sorted(whole),
                   f"exported names {sorted(whole)} {sorted(weight_map)}")
            expect(len(parts) == 4 and all(parts[weight_map[n]][n] == whole[n] for n in whole),
                   f"sharded export differs from the single file ({len(parts)} parts)")
        # an export that fails at its second part (a directory stands where it goes) leaves no first part behind
        os.mkdir(os.path.join(work, "again-00002-of-00004.safetensors"))
        p = run(["ckpt", "export", d, "--out", os.path.join(work, "again.safetensors"), "--max-shard-size", "1M"])
        left = sorted(f for f in os.listdir(work) if f.startswith("again"))
        expect(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
               and left == ["again-00002-of-00004.safetensors"], f"failed sharded export: {p.stderr!r} left {left}")
        # a long name (the index's text grows with it), over an earlier single-file export of that name
        long_out = os.path.join(work, "m" * 200 + ".safetensors")
        shutil.copyfile(out, long_out)
        p = run(["ckpt", "export", d, "--out", long_out, "--max-shard-size", "1M"])
        long_index = os.path.join(work, "m" * 200 + ".safetensors.index.json")
        try:
            names = json.load(open(long_index))["weight_map"] if p.returncode == 0 else {}
        except ValueError:
            names = {}
        expect(p.returncode == 0 and len(names) == 8 and not os.path.exists(long_out)
               and "removed the earlier single file" in p.stdout, f"sharded export, long name: {p.stdout} {p.stderr}")
        # an index whose chunks leave part of a tensor out, or overlap, is refused by every reader
        for kind, words in (("gap", "chunks hold 0 of"), ("overlap", "overlap")):
            bad = os.path.join(work, kind)
            shutil.copytree(d, bad, symlinks=True)
            with open(os.path.join(bad, "step_5", "index.json")) as f:
                ix = json.load(f)
            chunks = ix["tensors"]["layer_0"]["chunks"]
            ix["tensors"]["layer_0"]["chunks"] = [] if kind == "gap" else chunks + chunks[:1]
            with open(os.path.join(bad, "step_5", "index.json"), "w") as f:
                json.dump(ix, f)
            for args in (["inspect", "ckpt", bad, "--verify"], ["ckpt", "export", bad, "--out", bad + ".safetensors"]):
                p = run(args)
                expect(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr
                       and not os.path.exists(bad + ".safetensors"), f"{args[:2]} of a {kind}: {p.returncode} {p.stderr!r}")
        # index fields out of range or of the wrong kind: refused by every reader, one line
        for kind, change, words in (("version", {"version": 2}, "its version is not 1"),
                                    ("world", {"world": 0}, "its world is not a rank count"),
                                    ("mesh", {"mesh": "data="}, "its mesh does not parse"),
                                    ("empty", {"tensors": {}}, "holds no tensors")):
            bad = os.path.join(work, "field-" + kind)
            shutil.copytree(d, bad, symlinks=True)
            with open(os.path.join(bad, "step_5", "index.json")) as f:
                ix = json.load(f)
            ix.update(change)
            with open(os.path.join(bad, "step_5", "index.json"), "w") as f:
                json.dump(ix, f)
            p = run(["ckpt", "export", bad, "--out", bad + ".safetensors"])
            expect(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr
                   and not os.path.exists(bad + ".safetensors"), f"export of an index with {change}: {p.stderr!r}")
        # a flipped byte: --verify names the file, one line, exit 1
        with open(os.path.join(d, "step_5", "rank_00001.safetensors"), "r+b") as f:
            f.seek(-1, 2)
            b = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([b[0] ^ 0x5A]))
        p = run(["inspect", "ckpt", d, "--verify"])
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode == 1 and len(lines) == 1 and "rank_00001.safetensors: checksum" in p.stderr,
               f"verify of a corrupt checkpoint: {p.returncode} {p.stderr!r}")
        p = run(["ckpt", "export", d, "--out", os.path.join(work, "bad.safetensors")])
        expect(p.returncode == 1 and "checksum" in p.stderr, f"export of a corrupt checkpoint: {p.stderr!r}")
        # --dir holding anything (here a checkpoint) is refused, one line, and left as it was
        before = sorted(os.listdir(d))
        p = run(["bench", "ckpt", "--ranks", "2", "--bytes", "1M", "--dir", d])
        expect(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "is not empty" in p.stderr
               and sorted(os.listdir(d)) == before, f"bench ckpt into a checkpoint: {p.returncode} {p.stderr!r}")
        # a new --dir is removed at the end without --keep; an empty one is left empty
        fresh, empty = os.path.join(work, "fresh"), os.path.join(work, "empty")
        os.mkdir(empty)
        p = run(["bench", "ckpt", "--ranks", "2", "--bytes", "1M", "--dir", fresh, "--json"])
        q = run(["bench", "ckpt", "--ranks", "2", "--bytes", "1M", "--dir", empty, "--json"])
        expect(p.returncode == 0 and not os.path.exists(fresh) and q.returncode == 0 and os.listdir(empty) == [],
               f"bench ckpt --dir without --keep: {p.stderr!r} {q.stderr!r}")
        p = run(["inspect", "ckpt", os.path.join(work, "nothing")])
        expect(p.returncode == 1 and "not a checkpoint" in p.stderr, f"inspect of nothing: {p.stderr!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def train():
    import shutil
    import tempfile
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "reference"))
    import safetensors_ref  # needs numpy (Debian's python3-numpy, which scripts/deps.sh installs)
    work = tempfile.mkdtemp(prefix="shard-cli-train-")
    try:
        tiny_corpus(work, "the cat sat on the mat. the dog sat on the log.\n", 400)
        cfg = os.path.join(work, "gpt.json")
        with open(cfg, "w") as f:
            json.dump({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 256}, f)
        args = ["train", "--config", cfg, "--data", os.path.join(work, "data"), "--batch", "4", "--seq", "32",
                "--steps", "20", "--lr", "3e-3", "--seed", "5"]
        logs, summaries = [], []
        for k in range(2):
            log = os.path.join(work, f"run{k}.jsonl")
            extra = ["--save", os.path.join(work, "ck"), "--save-every", "10"] if k == 0 else []
            p = run(args + ["--log", log] + extra)
            expect(p.returncode == 0 and "train: 20 steps" in p.stdout, f"train run {k}: {p.stdout} {p.stderr}")
            logs.append(log_rows(log) if os.path.exists(log) else [])
            summaries.append(log_summary(log) if os.path.exists(log) else {})
        rows = logs[0]
        expect(len(rows) == 20 and {"step", "loss", "lr", "tokens_per_s", "ms"} <= set(rows[0]), f"log rows: {rows[:1]}")
        # the log's last line sums the run up: its steps, the median step (the first left out), tokens/s at
        # that median, the last loss and the one rank's peak bytes (at least any category's peak of a step)
        sm = summaries[0]
        median = sorted(r["ms"] for r in rows[1:])[9] if len(rows) == 20 else -1
        expect(sm.get("steps") == 20 and sm.get("last_step") == 20 and rows and sm.get("final_loss") == rows[-1]["loss"]
               and abs(sm.get("median_step_ms", 0) - median) <= 1e-3
               and abs(sm.get("tokens_per_s", 0) - 4 * 32 / (median / 1e3)) <= 1e-3 * sm.get("tokens_per_s", 0) + 0.1
               and len(sm.get("peak_bytes", [])) == 1
               and sm["peak_bytes"][0] >= max(max(r["ranks"][0]["peak_bytes"].values()) for r in rows)
               and "predicted" not in sm, f"the log's summary: {sm}")
        expect(rows and rows[-1]["loss"] < rows[0]["loss"] - 1.0, f"loss did not fall: {rows[0]} -> {rows[-1]}")
        expect([r["loss"] for r in logs[0]] == [r["loss"] for r in logs[1]], "two runs with one seed differ")
        # what would fail after the training fails before it, one line: a --save step that exists, a --resume
        # at or past --steps, an --init file without the model's tensors
        ck = os.path.join(work, "ck")
        junk = os.path.join(work, "junk.safetensors")
        with open(junk, "wb") as f:  # a valid safetensors file holding one tensor 'x'
            head = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
            f.write(len(head).to_bytes(8, "little") + head + bytes(4))
        for extra, words in ((["--save", ck], "step_20 exists already"),
                             (["--save", ck, "--steps", "15"], "holds a run up to step_20 (its latest), past this run's first save at step 15"),
                             (["--resume", ck], "at step 20 already"),
                             (["--init", junk], "has no tensor 'wte.weight'")):
            p = run(args + extra)
            expect(p.returncode == 1 and "step 1/" not in p.stdout and len(p.stderr.strip().splitlines()) == 1
                   and words in p.stderr, f"train {extra}: {p.returncode} {p.stdout[-200:]} {p.stderr!r}")
        # --init loads every parameter by name: the trained weights, exported, start lower than a fresh init
        p = run(["ckpt", "export", ck, "--out", os.path.join(work, "w.safetensors")])
        log = os.path.join(work, "init.jsonl")
        q = run(args + ["--steps", "1", "--init", os.path.join(work, "w.safetensors"), "--log", log])
        got = log_rows(log) if q.returncode == 0 else []
        expect(p.returncode == 0 and len(got) == 1 and got[0]["loss"] < rows[0]["loss"] - 1.0,
               f"train --init from exported weights: {got} {q.stderr}")
        # the export holds the model's tensors only; --optimizer adds AdamW's two moments of each
        names = sorted(safetensors_ref.read(os.path.join(work, "w.safetensors"))[1])
        expect("the optimizer's" in p.stdout and names and not any(n.startswith("optimizer.") for n in names),
               f"export without --optimizer: {p.stdout} {names[:3]}")
        p = run(["ckpt", "export", ck, "--out", os.path.join(work, "full.safetensors"), "--optimizer"])
        full = sorted(safetensors_ref.read(os.path.join(work, "full.safetensors"))[1]) if p.returncode == 0 else []
        expect(p.returncode == 0 and len(full) == 3 * len(names) and "left out" not in p.stdout,
               f"export --optimizer: {len(full)} tensors against {len(names)}: {p.stdout} {p.stderr}")
        # a sharded export: --init and inspect read its index, with the single file's loss
        p = run(["ckpt", "export", ck, "--out", os.path.join(work, "sh.safetensors"), "--max-shard-size", "64K"])
        index = os.path.join(work, "sh.safetensors.index.json")
        q = run(args + ["--steps", "1", "--init", index, "--log", log + ".sh"])
        sh = log_rows(log + ".sh") if q.returncode == 0 else []
        expect(p.returncode == 0 and got and [(r["loss"], r["grad_norm"]) for r in sh] == [(got[0]["loss"], got[0]["grad_norm"])],
               f"train --init from a sharded export: {sh} against {got}: {p.stderr} {q.stderr}")
        q = run(["inspect", "ckpt", index, "--verify"])
        expect(q.returncode == 0 and "verified: every tensor of the index is in the file it names" in q.stdout,
               f"inspect of a sharded export's index: {q.stdout[-300:]} {q.stderr}")
        # an index naming a file outside its directory, a .bin file, or none at all: refused, one line, by
        # --init and by inspect alike (one reader)
        for bad_map, words in (({"wte.weight": "../sh-00001-of-00002.safetensors"}, "is not a file name beside the index"),
                               ({"wte.weight": "pytorch_model-00001-of-00002.bin"}, "not a .safetensors file"),
                               ([], "not a safetensors index")):
            with open(os.path.join(work, "bad.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": bad_map}, f)
            q = run(args + ["--steps", "1", "--init", os.path.join(work, "bad.safetensors.index.json")])
            expect(q.returncode == 1 and len(q.stderr.strip().splitlines()) == 1 and words in q.stderr,
                   f"--init from a bad index {bad_map}: {q.returncode} {q.stderr!r}")
            q = run(["inspect", "ckpt", os.path.join(work, "bad.safetensors.index.json")])
            expect(q.returncode == 1 and len(q.stderr.strip().splitlines()) == 1 and words in q.stderr,
                   f"inspect of a bad index {bad_map}: {q.returncode} {q.stderr!r}")
        # an index that puts a tensor in a file that lacks it: --init and inspect --verify both say so, one line
        with open(index) as f:
            wrong = json.load(f)
        first = sorted(wrong["weight_map"])[0]
        other = [n for n in sorted(set(wrong["weight_map"].values())) if n != wrong["weight_map"][first]]
        expect(len(other) > 0, f"the sharded export has one file only: {wrong['weight_map']}")
        if other:
            wrong["weight_map"][first] = other[0]
            with open(os.path.join(work, "wrong.safetensors.index.json"), "w") as f:
                json.dump(wrong, f)
            for cmd in (["inspect", "ckpt", os.path.join(work, "wrong.safetensors.index.json"), "--verify"],
                        args + ["--steps", "1", "--init", os.path.join(work, "wrong.safetensors.index.json")]):
                q = run(cmd)
                expect(q.returncode == 1 and f"no tensor '{first}', which" in q.stderr
                       and len(q.stderr.strip().splitlines()) == 1, f"{cmd[0]} with '{first}' misplaced: {q.stderr!r}")
        # an --out in a directory that does not exist: one line naming it, nothing written
        p = run(["ckpt", "export", ck, "--out", os.path.join(work, "no", "m.safetensors")])
        expect(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "does not exist" in p.stderr
               and ".tmp-" not in p.stderr, f"export into a missing directory: {p.stderr!r}")
        # an empty directory, and an --out that is a directory: one line each, before any work
        os.mkdir(os.path.join(work, "empty"))
        os.mkdir(os.path.join(work, "d.safetensors"))
        for where, out, words in ((os.path.join(work, "empty"), os.path.join(work, "e.safetensors"), "not a checkpoint"),
                                  (ck, os.path.join(work, "d.safetensors"), "exists and is not a file")):
            p = run(["ckpt", "export", where, "--out", out])
            expect(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr,
                   f"export {where} --out {out}: {p.stderr!r}")
        # an --out inside the step it exports would overwrite that checkpoint's files: refused
        p = run(["ckpt", "export", ck, "--out", os.path.join(ck, "step_20", "rank_00000.safetensors")])
        q = run(["inspect", "ckpt", ck, "--verify"])
        expect(p.returncode == 1 and "is inside the checkpoint" in p.stderr and q.returncode == 0,
               f"export into its own checkpoint: {p.stderr!r} {q.stderr!r}")
        # a root whose latest step is broken: the export takes the previous step, as a load does
        broken = os.path.join(work, "broken")
        shutil.copytree(ck, broken, symlinks=True)
        last = os.path.join(broken, open(os.path.join(broken, "latest")).read().strip())
        with open(os.path.join(last, sorted(f for f in os.listdir(last) if f.endswith(".safetensors"))[0]), "r+b") as f:
            f.seek(-1, 2)
            b = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([b[0] ^ 0x5A]))
        p = run(["ckpt", "export", broken, "--out", os.path.join(work, "prev.safetensors")])
        expect(p.returncode == 0 and "trying the previous one" in p.stderr and "step_10" in p.stdout,
               f"export past a broken latest: {p.stdout} {p.stderr}")
        # under any strategy: ZeRO-3 with bf16 compute copies, and tensor parallel (each rank's piece)
        for extra, tol in ((["--ranks", "2", "--zero", "3", "--compute-dtype", "bf16"], 2e-2),
                           (["--ranks", "2", "--mesh", "tensor=2"], 1e-5), (["--ranks", "2", "--mesh", "pipe=2"], 1e-5)):
            if os.path.exists(log):
                os.remove(log)
            q = run(args + ["--steps", "1", "--init", os.path.join(work, "w.safetensors"), "--log", log] + extra)
            par = log_rows(log) if q.returncode == 0 else []
            expect(got and len(par) == 1 and abs(par[0]["loss"] - got[0]["loss"]) <= tol * got[0]["loss"],
                   f"train --init {extra}: {par} against {got}: {q.stderr}")
        # a resumed run adds to its --log, after dropping the lines of steps past the checkpoint (the
        # interrupted run logged 15 steps, its checkpoint is step 10)
        resumed = os.path.join(work, "resumed.jsonl")
        with open(resumed, "w") as f:  # with the summary of the run that logged them, to be dropped too
            f.writelines(json.dumps(r) + "\n" for r in rows[:15] + [summaries[0]])
        # a resumed run goes on into its own root (--save the --resume root), saving past its latest
        again = os.path.join(work, "again")
        shutil.copytree(ck, again, symlinks=True)
        q = run(args + ["--resume", again, "--save", again, "--steps", "22"])
        expect(q.returncode == 0 and open(os.path.join(again, "latest")).read().strip() == "step_22",
               f"train --resume R --save R: {q.returncode} {q.stderr!r}")
        # a fresh run whose first save comes before the root's latest would move latest back: refused
        q = run(args + ["--save", again, "--save-every", "3", "--steps", "30"])
        expect(q.returncode == 1 and "past this run's first save at step 3" in q.stderr, f"fresh run below latest: {q.stderr!r}")
        # a resume refused before training leaves its --log as it was
        q = run(args + ["--resume", os.path.join(ck, "step_10"), "--log", resumed, "--save", ck])
        expect(q.returncode == 1 and "step_20" in q.stderr and len(open(resumed).readlines()) == 16,
               f"refused resume cut its log: {q.stderr}")
        q = run(args + ["--resume", os.path.join(ck, "step_10"), "--log", resumed])
        par = log_rows(resumed) if q.returncode == 0 else []
        expect([r["step"] for r in par] == list(range(1, 21))
               and all(abs(a["loss"] - b["loss"]) <= 1e-5 * a["loss"] for a, b in zip(rows, par)),
               f"train --resume --log: steps {[r['step'] for r in par]}: {q.stderr}")
        summary_lines = [l for l in open(resumed) if '"event"' in l]
        expect(len(summary_lines) == 1 and json.loads(summary_lines[0]).get("steps") == 10
               and json.loads(summary_lines[0]).get("last_step") == 20 and log_summary(resumed),
               f"train --resume --log: one summary, the resumed run's 10 steps, last: {summary_lines}")
        expect("warning" not in q.stderr, f"train --resume with the same settings warned: {q.stderr!r}")
        # settings other than the checkpoint's: a warning naming them, and the run goes on
        other = [a if a != "3e-3" else "1e-3" for a in args] + ["--steps", "12", "--seed", "6"]
        q = run(other + ["--resume", os.path.join(ck, "step_10")])
        expect(q.returncode == 0 and "lr 0.001 (the checkpoint's: 0.003)" in q.stderr
               and "steps 12 (the checkpoint's: 20)" in q.stderr and "seed 6 (the checkpoint's: 5)" in q.stderr
               and "batch" not in q.stderr, f"train --resume with other settings: {q.returncode} {q.stderr!r}")
        # SGD with momentum trains; its checkpoint holds each parameter's momentum buffer (and none of AdamW's
        # moments) and records the optimizer; an AdamW run's resume of it is refused in one line
        sgd = [a if a != "3e-3" else "0.1" for a in args] + ["--optimizer", "sgd", "--momentum", "0.9"]
        ck_sgd, log = os.path.join(work, "ck_sgd"), os.path.join(work, "sgd.jsonl")
        p = run(sgd + ["--save", ck_sgd, "--log", log])
        got = [r["loss"] for r in log_rows(log)] if p.returncode == 0 else []
        expect(len(got) == 20 and got[-1] < got[0] - 1.0, f"train --optimizer sgd --momentum 0.9: {got[:2]}..{got[-2:]} {p.stderr}")
        index = json.load(open(os.path.join(ck_sgd, "step_20", "index.json"))) if p.returncode == 0 else {}
        names = set(index.get("tensors", {}))
        expect("optimizer.momentum_buffer.wte.weight" in names and not any("exp_avg" in n for n in names)
               and index["training"]["optimizer"] == "sgd" and index["training"]["momentum"] == 0.9,
               f"the SGD checkpoint's state names or record: {sorted(names)[:4]} {index.get('training')}")
        q = run(args + ["--steps", "25", "--resume", ck_sgd])
        expect(q.returncode == 1 and len(q.stderr.strip().splitlines()) == 1 and "step 21/" not in q.stdout
               and "was trained with sgd, and this run's optimizer is adamw" in q.stderr,
               f"adamw resuming an sgd checkpoint: {q.returncode} {q.stderr!r}")
        # the same global batch on 2 thread ranks (ZeRO-2), and a resume of step 10 under ZeRO-3
        for extra, first in ((["--ranks", "2", "--zero", "2"], 1), (["--ranks", "4", "--mesh", "data=2,tensor=2"], 1), (["--ranks", "2", "--mesh", "tensor=2", "--sequence-parallel", "--zero", "1"], 1),
                             (["--ranks", "2", "--mesh", "tensor=2", "--sequence-parallel", "--spec", "h.*.mlp.*=P()",
                               "--spec", "wte.weight=P()"], 1),
                             (["--ranks", "2", "--mesh", "pipe=2", "--schedule", "1f1b", "--micro-batches", "2",
                               "--recompute"], 1),
                             (["--ranks", "4", "--mesh", "data=2,pipe=2", "--schedule", "gpipe", "--micro-batches", "2",
                               "--zero", "3"], 1),
                             (["--ranks", "2", "--zero", "3", "--resume", os.path.join(work, "ck", "step_10")], 11)):
            log = os.path.join(work, "par.jsonl")
            if os.path.exists(log):  # a --resume adds to its log
                os.remove(log)
            p = run(args + ["--log", log] + extra)
            par = log_rows(log) if p.returncode == 0 else []
            worst = max((abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(rows[first - 1:], par)), default=1)
            expect(p.returncode == 0 and len(par) == 21 - first and worst <= 1e-5,
                   f"train {extra}: {len(par)} steps, worst relative loss difference {worst}: {p.stderr}")
        # outputs that are inputs, or of the wrong kind, refused before any work, the inputs left whole
        tokens = os.path.join(work, "data", "train.tokens")
        size = os.path.getsize(tokens)
        for extra, words in ((["--log", tokens], "is the run's data file"), (["--log", cfg], "is also the run's input"),
                             (["--save", cfg], "exists and is not a directory"), (["--save", ""], "--save '' is invalid"),
                             (["--trace", os.path.join(work, "no", "t.json")], "does not exist; create it first"),
                             (["--trace", work], "it exists and is a directory")):
            p = run(args + extra)
            expect(p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr
                   and "step 1/" not in p.stdout and os.path.getsize(tokens) == size and json.load(open(cfg)),
                   f"train {extra}: {p.returncode} {p.stderr!r}")
        # the banner's batch arithmetic: an even split as the product, an uneven one as slices
        # (the first without --ranks: a --mesh alone gives the rank count)
        for batch, extra, want in (("8", ["--mesh", "data=4"], "global batch 8 = micro-batch 2 x accum 1 x data 4;"),
                                   ("6", ["--ranks", "4", "--mesh", "data=4"],
                                    "global batch 6 = accum 1 x data 4 slices of 1-2 rows (split unevenly);"),
                                   ("8", ["--ranks", "2", "--mesh", "pipe=2", "--micro-batches", "5"],
                                    "global batch 8 = accum 5 x data 1 slices of 1-2 rows (split unevenly);")):
            short = args[:6] + [batch] + args[7:9] + ["--steps", "1"] + extra
            p = run(short)
            expect(p.returncode == 0 and want in p.stdout, f"train banner {extra}: {p.stdout!r} {p.stderr}")
        # the CNN (Fashion-MNIST) and the teacher MLP through the same command
        configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")
        for name, extra in (("cnn-fashion-mnist.json", ["--ranks", "2", "--zero", "1", "--batch", "32"]),
                            ("mlp-teacher.json", ["--batch", "16"])):
            log = os.path.join(work, name + ".jsonl")
            p = run(["train", "--config", os.path.join(configs, name), "--steps", "40", "--lr", "3e-3", "--log", log]
                    + extra)
            got = [r["loss"] for r in log_rows(log)] if p.returncode == 0 else []
            expect(len(got) == 40 and sum(got[-5:]) < 0.8 * sum(got[:5]), f"train {name}: {got[:3]}..{got[-3:]} {p.stderr}")
        # the MLP split over a tensor axis (Megatron's column- then row-parallel pair) trains to the one-device
        # losses, and a checkpoint saved under tensor=2 resumes on one device
        mlp = os.path.join(configs, "mlp-teacher.json")
        losses = {}
        for extra in ([], ["--mesh", "tensor=2"], ["--mesh", "data=2,tensor=2", "--zero", "3"]):
            log = os.path.join(work, "mlp-tp.jsonl")
            p = run(["train", "--config", mlp, "--steps", "6", "--batch", "8", "--log", log] + extra)
            losses[" ".join(extra)] = [r["loss"] for r in log_rows(log)] if p.returncode == 0 else p.stderr
        base = losses[""]
        for k, got in losses.items():
            expect(isinstance(got, list) and len(got) == 6 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, base)),
                   f"mlp {k}: {got} against {base}")
        save = os.path.join(work, "mlp-tp-ckpt")
        p = run(["train", "--config", mlp, "--steps", "6", "--batch", "8", "--mesh", "tensor=2", "--save", save,
                 "--save-every", "3"])
        log = os.path.join(work, "mlp-tp-resumed.jsonl")
        p = run(["train", "--config", mlp, "--steps", "6", "--batch", "8", "--resume", os.path.join(save, "step_3"),
                 "--log", log])
        got = [r["loss"] for r in log_rows(log)] if p.returncode == 0 else p.stderr
        expect(isinstance(got, list) and len(got) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, base[3:])),
               f"mlp saved under tensor=2, resumed on one device: {got} against {base[3:]}")
        # bad input to the new entry points: one line each, non-zero exit
        bad = os.path.join(work, "bad.json")
        cases = [({"model_type": "mlp", "model_dim": 8, "hidden": 16}, [], "key 'hidden' is unknown (MLP keys"),
                 ({"model_type": "cnn", "height": 14, "width": 56}, ["--data", "/usr/share/datasets/fashion-mnist"],
                  "images of shape [60000 x 28 x 28] with 60000 labels; the config wants 1 x 14 x 56 images"),
                 ({"model_type": "cnn", "in_channels": 2 ** 60 + 1}, [],
                  "key 'in_channels' = 1152921504606846977; valid: 1..1048576"),
                 ({"model_type": "cnn", "channels": 4}, ["--ranks", "2", "--mesh", "tensor=2"],
                  "model_type 'cnn' has no tensor-parallel layout here (the GPT and the MLP have): give tensor=1"),
                 ({"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32, "vocab_size": 256},
                  ["--ranks", "3", "--mesh", "tensor=3"], "tensor=3 (--mesh, or bench tensor's --ranks) is more than the 2 heads"),
                 ({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 256},
                  ["--resume", os.path.join(work, "nothing")], "nothing"),
                 (json.load(open(cfg)), ["--ranks", "2", "--mesh", "tensor=2", "--spec", "h.0.mlp.c_fc.weight=P()"],
                  "a column-parallel linear and the row-parallel one after it (and its bias) split together"),
                 (json.load(open(cfg)), ["--ranks", "2", "--mesh", "tensor=2", "--spec", "wte.weight=P(None, 'tensor')"],
                  "wte.weight [256, 32] can be P('tensor', None) (vocab-parallel) or P() (replicated)"),
                 (json.load(open(cfg)), ["--ranks", "2", "--mesh", "tensor=2", "--spec", "h.0.ln_1.weight=P('tensor')"],
                  "h.0.ln_1.weight [32] can be only P() (replicated)"),
                 (json.load(open(cfg)), ["--spec", "h.9.*=P()"], "--spec 'h.9.*': no parameter is named so"),
                 ({"model_type": "mlp", "model_dim": 8, "hidden_dim": 16}, ["--spec", "layer_0/weights=P()"],
                  "--spec: model_type 'mlp' places every parameter whole"),
                 ({"model_type": "mlp", "model_dim": 8, "hidden_dim": 16}, [],
                  "trains on rows it generates from a seeded teacher and reads no files; drop --data")]
        for conf, extra, want in cases:
            with open(bad, "w") as f:
                json.dump(conf, f)
            p = run(["train", "--config", bad, "--data", os.path.join(work, "data"), "--batch", "4", "--seq", "32",
                     "--steps", "2"] + extra)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            expect(p.returncode == 1 and len(lines) == 1 and want in p.stderr, f"bad input {conf} {extra}: {p.stderr!r}")
        # a pipelined run's last step as a Chrome trace: a process row per rank, F and B of each micro-batch
        trace = os.path.join(work, "trace.json")
        p = run(args[:-6] + ["--steps", "2", "--ranks", "2", "--mesh", "pipe=2", "--micro-batches", "2", "--schedule",
                             "1f1b", "--trace", trace])
        events = json.load(open(trace))["traceEvents"] if p.returncode == 0 and os.path.exists(trace) else []
        names = {(e["pid"], e["name"]) for e in events if e.get("ph") == "X" and e.get("cat") == "compute"}
        procs = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        expect(names == {(r, n) for r in (0, 1) for n in ("F0", "F1", "B0", "B1")}
               and procs == {"rank 0 (pipe=0)", "rank 1 (pipe=1)"}
               and "rank 0 |F0 F1 .  B0 .  B1 |" in p.stdout, f"--trace: {sorted(names)} {procs} {p.stdout} {p.stderr}")
        for extra, want in ((["--ranks", "3", "--mesh", "pipe=3"], "pipeline: 2 layers cannot fill 3 stages"),
                            (["--ranks", "2", "--mesh", "pipe=2", "--layers-per-stage", "1,2"],
                             "--layers-per-stage '1,2' adds up to 3 layers; the model has 2")):
            p = run(args[:-6] + ["--steps", "2"] + extra)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            expect(p.returncode == 1 and len(lines) == 1 and want in p.stderr, f"pipeline bad input {extra}: {p.stderr!r}")
        # the pipeline benchmark: every table present, measured bubbles are fractions (how near the formula
        # they come is a benchmark's figure, not a test's: a loaded machine stretches the waits), the replay
        # and the activation bytes as counted (batch 12: micro-batches of 2 and 1 rows, sized for the larger)
        p = run(["bench", "pipeline", "--config", cfg, "--ranks", "2", "--seq", "32", "--steps", "5", "--batch", "12",
                 "--json"], timeout=300)
        rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()] if p.returncode == 0 else []
        bub = [r for r in rows if r["table"] == "bubble"]
        act = [r for r in rows if r["table"] == "activations"]
        expect(len(bub) == 9 and all(0 < r["bubble_measured"] < 1 and r["bubble_replayed_p4"] == r["bubble_formula_p4"]
                                     for r in bub)
               and len(act) == 6 and all(r["held_measured"] == r["held_formula"] for r in act if not r["recompute"])
               and all(abs(r["activation_bytes"] - r["activation_bytes_predicted"]) <= 64 for r in act)
               and any(r["table"] == "speed" and r["ms_per_step_pipe"] > 0 for r in rows),
               f"bench pipeline: {p.stdout} {p.stderr}")
        # placement as specs: --print-specs lists them; attention placed whole trains on more ranks than heads
        p = run(args[:-6] + ["--steps", "2", "--ranks", "2", "--mesh", "tensor=2", "--print-specs"])
        line = next((l for l in p.stdout.splitlines() if "h.0.attn.c_attn.weight" in l), "")
        expect(p.returncode == 0 and "P(None, None, 'tensor', None) of [32, 3, 4, 8]" in line and line.endswith("[32, 48]"),
               f"--print-specs: {line!r} {p.stderr}")
        with open(bad, "w") as f:
            json.dump({"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32, "vocab_size": 256}, f)
        p = run(["train", "--config", bad, "--data", os.path.join(work, "data"), "--batch", "4", "--seq", "32", "--steps",
                 "2", "--ranks", "3", "--mesh", "tensor=3", "--spec", "h.*.attn.*=P()"])
        expect(p.returncode == 0 and "train: 2 steps" in p.stdout, f"tensor=3 with 2 heads placed whole: {p.stderr}")
        # tensor parallel: bytes on the tensor axis equal the formula exactly (uneven split over 3 ranks)
        p = run(["bench", "tensor", "--config", cfg, "--ranks", "3", "--batch", "5", "--seq", "32", "--steps", "5", "--json"])
        rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()] if p.returncode == 0 else []
        expect(len(rows) == 3 and all(r["tensor_bytes_sent"] == r["tensor_bytes_formula"] for r in rows)
               and rows[1]["tensor_bytes_sent"] > 0 and rows[2]["activation_bytes"] < rows[1]["activation_bytes"],
               f"bench tensor: {p.stdout} {p.stderr}")
        p = run(["inspect", "ckpt", os.path.join(work, "ck"), "--verify"])
        expect(p.returncode == 0 and "step 20" in p.stdout and "wte.weight" in p.stdout, f"train checkpoint: {p.stdout}")
        p = run(["bench", "train", "--config", cfg, "--batch", "2", "--seq", "16", "--no-torch", "--json"])
        row = json.loads(p.stdout) if p.returncode == 0 else {}
        expect({"ms_per_step", "tokens_per_s", "mfu", "fma_peak_gflops"} <= set(row) and row["ms_per_step"] > 0,
               f"bench train: {p.stdout} {p.stderr}")
        # data parallel with ZeRO on 2 ranks: its collectives timed alone too (in place on every rank)
        for zero in ("1", "3"):
            p = run(["bench", "train", "--config", cfg, "--batch", "4", "--seq", "16", "--no-torch", "--json", "--ranks",
                     "2", "--zero", zero])
            row2 = json.loads(p.stdout) if p.returncode == 0 else {}
            expect(row2.get("zero") == int(zero) and row2.get("comm_alone_ms", 0) > 0,
                   f"bench train --ranks 2 --zero {zero}: {p.stdout} {p.stderr}")
            # the predicted peaks per category hold to the bytes (the accounted allocator's +1s aside)
            for cat in ("params", "grads", "optimizer"):
                expect(abs(row2.get(f"peak_{cat}_bytes", -1) - row2.get(f"predicted_{cat}_bytes", 0)) <= 16,
                       f"bench train --zero {zero}: {cat} peak against prediction: {p.stdout}")
        # the other ranks wait out rank 0's one-rank baseline (300 steps, over a second) past a 1 s deadline
        p = subprocess.run([SHARD, "bench", "train", "--config", cfg, "--batch", "4", "--seq", "16", "--no-torch", "--json",
                            "--ranks", "2", "--steps", "300", "--warmup", "0"], capture_output=True, text=True,
                           timeout=300, env=dict(ENV, SHARD_TIMEOUT="1"))
        expect(p.returncode == 0 and '"single_rank_ms_per_step"' in p.stdout, f"bench train, long baseline: {p.stderr}")
        # the PyTorch script gets the config's path as an argument, never through a shell
        odd = os.path.join(work, "x';touch INJECTED;'\"\\.json")
        shutil.copy(cfg, odd)
        q = run(["bench", "train", "--config", odd, "--batch", "2", "--seq", "16", "--json"], timeout=300)
        expect(q.returncode == 0 and not os.path.exists(os.path.join(work, "INJECTED"))
               and not os.path.exists("INJECTED"), f"bench train with a quote in the path: {q.stdout} {q.stderr}")
        try:  # and the JSON line holds the path as it is
            expect(json.loads(q.stdout)["config"] == odd, f"bench train's config in JSON: {q.stdout}")
        except ValueError:
            expect(False, f"bench train's JSON with a quote in the path: {q.stdout}")
        # a reference that cannot run is said, on stderr and in the JSON, not dropped
        broken = dict(ENV, PYTHONHOME="/nonexistent")
        q = subprocess.run([SHARD, "bench", "train", "--config", cfg, "--batch", "2", "--seq", "16", "--json"],
                           capture_output=True, text=True, timeout=300, env=broken)
        try:
            qrow = json.loads(q.stdout)
        except ValueError:
            qrow = {}
        expect(q.returncode == 0 and qrow.get("torch_error") and "speedup_vs_torch" not in qrow
               and "PyTorch not measured" in q.stderr, f"bench train, PyTorch failing: {q.stdout} {q.stderr}")
        # the step's products timed alone: the linear layers' and the tied head's, 6 flops per weight and token
        N, C, L, V = 2 * 16, 32, 2, 256
        expect(row.get("products_alone_ms", 0) > 0
               and abs(row.get("products_gflop", 0) - 6 * N * (12 * C * C * L + V * C) / 1e9) < 1e-12,
               f"bench train, products alone: {p.stdout}")
        # and the floor they set: their FLOPs at the FMA peak measured in the same run (printed to 0.1 GFLOP/s)
        expect(abs(row.get("products_at_peak_ms", 0) - row.get("products_gflop", 0) / row["fma_peak_gflops"] * 1e3)
               <= (0.051 / row["fma_peak_gflops"] + 1e-5) * row.get("products_at_peak_ms", 0)
               and row.get("products_at_peak_ms", 0) > 0,
               f"bench train, products at the peak: {p.stdout}")
        outs = [run(["generate", "--ckpt", os.path.join(work, "ck"), "--prompt", "the ", "--tokens", "20",
                     "--temperature", "0"]) for _ in range(2)]
        expect(all(o.returncode == 0 and o.stdout.startswith("the ") and len(o.stdout) >= 24 for o in outs)
               and outs[0].stdout == outs[1].stdout, f"generate: {[o.stdout for o in outs]} {outs[0].stderr}")
        # latest's index broken: the config comes from the step the load falls back to, as the weights do
        broken = os.path.join(work, "ck_broken")
        shutil.copytree(os.path.join(work, "ck"), broken)
        latest = open(os.path.join(broken, "latest")).read().strip()
        with open(os.path.join(broken, latest, "index.json"), "w") as f:
            f.write("{broken")
        o = run(["generate", "--ckpt", broken, "--prompt", "the ", "--tokens", "5", "--temperature", "0"])
        expect(o.returncode == 0 and o.stdout.startswith("the ") and "trying the previous one" in o.stderr,
               f"generate past a broken latest: {o.returncode} {o.stdout!r} {o.stderr!r}")
        # weights with a NaN: one error line, not NUL bytes
        with open(os.path.join(work, "w.safetensors"), "rb") as f:
            blob = bytearray(f.read())
        n = int.from_bytes(blob[:8], "little")
        at = 8 + n + json.loads(blob[8:8 + n])["wte.weight"]["data_offsets"][0]
        blob[at:at + 4] = bytes([0, 0, 0xC0, 0x7F])  # a quiet NaN, little-endian f32
        nan_w = os.path.join(work, "nan.safetensors")
        with open(nan_w, "wb") as f:
            f.write(blob)
        q = run(["generate", "--config", cfg, "--init", nan_w, "--prompt", "the ", "--tokens", "5", "--temperature", "0"])
        expect(q.returncode == 1 and "logits at token 1 are NaN or infinite" in q.stderr
               and len(q.stderr.strip().splitlines()) == 1, f"generate from NaN weights: {q.returncode} {q.stderr!r}")
        with open(cfg, "w") as f:
            json.dump({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 256, "n_heads": 4}, f)
        p = run(args)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode == 1 and len(lines) == 1 and "key 'n_heads' is unknown" in p.stderr, f"bad config: {p.stderr!r}")
        # sizes whose products would wrap, numbers outside float's range
        for extra, words in (({"n_positions": 1 << 62}, "key 'n_positions' = 4611686018427387904 is more than the 1048576"),
                             ({"layer_norm_epsilon": 1e39}, "key 'layer_norm_epsilon' is outside float's range"),
                             ({"n_embd": 1 << 20, "n_layer": 1 << 16}, "parameters; at most 2^40")):
            with open(cfg, "w") as f:
                json.dump({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 256, **extra}, f)
            p = run(args)
            expect(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr,
                   f"config {extra}: {p.returncode} {p.stderr!r}")
        with open(cfg, "w") as f:
            json.dump({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16, "vocab_size": 256}, f)
        p = run(args)
        expect(p.returncode == 1 and "key 'n_positions' = 16 is shorter than --seq 32" in p.stderr, f"seq: {p.stderr!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def inspect():
    p = run(["inspect", "spec", "--mesh", "data=4,tensor=2", "--shape", "128,4096", "--spec", "P('data','tensor')"])
    expect(p.returncode == 0, f"inspect: exit {p.returncode}: {p.stderr}")
    for text in ["type  f32[128@data,4096@tensor]", "spec  P('data', 'tensor')",
                 "rank 5   (data=2,tensor=1)  [64:96, 2048:4096]  local f32[32,2048]"]:
        expect(text in p.stdout, f"inspect output lacks {text!r}: {p.stdout}")
    grid = [l.split() for l in p.stdout.splitlines() if l.startswith("32:64")]
    expect(grid == [["32:64", "2", "3"]], f"inspect grid row 32:64: {grid}")
    p = run(["inspect", "spec", "--mesh", "data=4", "--shape", "10", "--spec", "P('data')", "--dtype", "bf16"])
    for text in ["[0:3]  local bf16[3]", "[3:6]  local bf16[3]", "[6:8]  local bf16[2]", "[8:10]  local bf16[2]"]:
        expect(text in p.stdout, f"uneven split lacks {text!r}: {p.stdout}")
    # nested over two axes: 10 -> 5,5 -> 3,2,3,2, in the grid and in the shards alike
    p = run(["inspect", "spec", "--mesh", "a=2,b=2", "--shape", "10", "--spec", "P(('a','b'))"])
    expect(p.stdout.split("\n")[5].split() == ["0:3", "3:5", "5:8", "8:10"] and "[3:5]  local f32[2]" in p.stdout,
           f"nested grid: {p.stdout}")


def inspect_schedule():
    p = run(["inspect", "schedule", "--pipe", "3", "--micro-batches", "5"])
    for text in ["rank 0 |F0 F1 F2 .  .  B0 F3 B1 F4 B2 .  B3 .  B4 |", "rank 2 |.  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 .  .  |",
                 "micro-batches held at the peak: rank 0: 3, rank 1: 2, rank 2: 1", "formula 28.6%"]:
        expect(p.returncode == 0 and text in p.stdout, f"inspect schedule lacks {text!r}: {p.stdout} {p.stderr}")
    # 1,024 micro-batches: every cell as wide as 'B1023 ', every rank's line as long as the others
    p = run(["inspect", "schedule", "--pipe", "2", "--micro-batches", "1024", "--schedule", "1f1b"])
    lines = [l for l in p.stdout.splitlines() if l.startswith("rank ")]
    expect(p.returncode == 0 and len(lines) == 2 and len({len(l) for l in lines}) == 1 and " B1023 " in lines[0],
           f"inspect schedule with 1024 micro-batches: {p.returncode} {[len(l) for l in lines]} {p.stderr}")
    p = run(["inspect", "schedule", "--pipe", "4", "--micro-batches", "6", "--schedule", "interleaved", "--virtual-stages", "2"])
    expect(p.returncode == 2 and "--micro-batches 6 is not a multiple of pipe = 4 (give 4 or 8)" in p.stderr, f"interleaved: {p.stderr}")


def demo():
    p = run(["demo", "--ranks", "3"], timeout=300)
    expect(p.returncode == 0, f"demo: exit {p.returncode}: {p.stderr}")
    expect("received 102 from rank 2" in p.stdout and "all_reduce (sum)" in p.stdout and "busbw" in p.stdout,
           f"demo output: {p.stdout!r}")


def train_mpi():
    """shard train under mpiexec: 2 processes (ZeRO-1), 3 (ZeRO-3, uneven slices), a 2-stage 1F1B pipeline, and
    the mixture-of-experts GPT on expert=2 and expert=3 match one rank."""
    import shutil
    import tempfile
    work = tempfile.mkdtemp(prefix="shard-cli-train-mpi-")
    try:
        tiny_corpus(work, "a rank holds a shard of the mesh. the mesh splits the batch.\n", 300)
        cfg = os.path.join(work, "gpt.json")
        with open(cfg, "w") as f:
            json.dump({"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 16, "vocab_size": 256}, f)
        args = ["train", "--config", cfg, "--data", os.path.join(work, "data"), "--batch", "5", "--seq", "16",
                "--steps", "12", "--lr", "3e-3"]
        logs = {}
        for name, extra, mpi in (("one", [], 0), ("zero1", ["--zero", "1"], 2), ("zero3", ["--zero", "3"], 3),
                                 ("pipe", ["--mesh", "pipe=2", "--schedule", "1f1b", "--micro-batches", "5"], 2)):
            log = os.path.join(work, name + ".jsonl")
            p = run(args + ["--log", log] + extra, mpi=mpi, timeout=240)
            logs[name] = [r["loss"] for r in log_rows(log)] if p.returncode == 0 else []
            expect(p.returncode == 0 and len(logs[name]) == 12, f"train {name}: exit {p.returncode}: {p.stderr}")
            if mpi:
                worst = max((abs(a - b) / a for a, b in zip(logs["one"], logs[name])), default=1)
                expect(worst <= 1e-5, f"train {name} under mpiexec -np {mpi}: worst relative loss difference {worst}")
        # the mixture-of-experts GPT with its experts over processes: expert=2, data=1,expert=3 (4 experts
        # split 2, 1, 1), data=2,expert=2 with ZeRO-1 and pipe=2,expert=2 (1F1B), tokens exchanged by
        # all_to_allv between processes
        moe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "gpt-moe-tiny.json")
        margs = ["train", "--config", moe, "--data", os.path.join(work, "data"), "--batch", "6", "--seq", "16",
                 "--steps", "6"]
        ref = None
        for extra, mpi in (([], 0), (["--mesh", "expert=2"], 2), (["--mesh", "data=1,expert=3"], 3),
                           (["--mesh", "data=2,expert=2", "--zero", "1"], 4),
                           (["--mesh", "pipe=2,expert=2", "--micro-batch", "1"], 4)):
            log = os.path.join(work, "moe%d.jsonl" % mpi)
            p = run(margs + ["--log", log] + extra, mpi=mpi, timeout=240)
            got = [r["loss"] for r in log_rows(log)] if p.returncode == 0 else []
            expect(len(got) == 6, f"moe {extra}: exit {p.returncode}: {p.stderr}")
            if ref is None:
                ref = got
            else:
                worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1)
                expect(worst <= 1e-5, f"moe {extra} under mpiexec -np {mpi}: worst relative loss difference {worst}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def analyze():
    """`shard analyze --json` on the tiny GPT over data=2,tensor=2 (ZeRO-1) and data=2,pipe=2 (1F1B): one
    object with the layout, each rank's coordinates, parameters, memory by category (the peaks `shard train`
    reaches, in its end-of-run table's MiB), FLOPs and bytes per axis and collective, the bubble and the
    critical path; step_ms null without a profile; the table form; bad layouts refused in one line."""
    import tempfile
    base = ["analyze", "--config", TINY, "--batch", "8", "--seq", "64"]
    p = run(base + ["--mesh", "data=2,tensor=2", "--zero", "1", "--json"])
    expect(p.returncode == 0, f"analyze --json: exit {p.returncode}: {p.stderr}")
    r = json.loads(p.stdout) if p.returncode == 0 else {}
    expect({"layout", "world", "ranks", "bubble", "critical_path", "step_ms", "tokens_per_s"} <= set(r),
           f"analyze keys: {sorted(r)}")
    ranks = r.get("ranks", [])
    expect(r.get("world") == 4 and len(ranks) == 4 and r.get("step_ms") is None, f"analyze world: {r.get('world')}")
    for x in ranks:
        expect({"rank", "coords", "params", "memory", "flops", "comm_bytes", "collectives"} <= set(x), f"rank keys: {x}")
        expect(set(x["memory"]) == {"params", "grads", "optimizer", "activations", "comm", "other", "total"},
               f"memory keys: {x['memory']}")
        expect(x["flops"]["forward"] > 0 and x["flops"]["backward"] > x["flops"]["forward"], f"flops: {x['flops']}")
        expect(x["comm_bytes"].get("data", 0) > 0 and x["comm_bytes"].get("tensor", 0) > 0, f"comm: {x['comm_bytes']}")
        expect(all({"op", "axis", "bytes", "count"} <= set(c) for c in x["collectives"]), f"collectives: {x}")
    expect(ranks and ranks[3]["coords"] == {"data": 1, "tensor": 1}, f"coords: {ranks[3:]}")
    # the memory a real run's table shows, rank by rank (MiB to 2 decimals)
    with tempfile.TemporaryDirectory(prefix="shard-cli-analyze-") as work:
        data = tiny_corpus(work, "what a layout costs before it runs. ", 400)
        t = run(["train", "--config", TINY, "--data", data, "--batch", "8", "--seq", "64", "--steps", "3", "--ranks",
                 "4", "--mesh", "data=2,tensor=2", "--zero", "1"])
        rows = [l.split() for l in t.stdout.splitlines() if l.strip().startswith("rank ") and "data=" in l]
        expect(t.returncode == 0 and len(rows) == 4, f"train's memory table: {t.stdout} {t.stderr}")
        for row, x in zip(rows, ranks):
            got = [float(v) for v in row[3:10]]
            want = [x["memory"][k] / 1048576 for k in ("params", "grads", "optimizer", "activations", "comm", "other",
                                                        "total")]
            expect(all(abs(a - b) <= 0.01 + 0.01 * b for a, b in zip(want, got)),
                   f"analyze's memory {want} against train's table {got} for {row[:3]}")
    p = run(base + ["--mesh", "data=2,pipe=2", "--schedule", "1f1b", "--micro-batches", "4"])
    expect(p.returncode == 0 and "bubble 0.2" in p.stdout and "critical path: rank" in p.stdout,
           f"analyze table: {p.stdout} {p.stderr}")
    # on an emulated cluster: each rank's device, whether its memory fits, the step predicted for it
    clusters = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "clusters")
    p = run(base + ["--mesh", "data=2,pipe=2", "--schedule", "1f1b", "--micro-batches", "4", "--cluster",
                    os.path.join(clusters, "two-nodes-slow-link.json"), "--json"])
    r = json.loads(p.stdout) if p.returncode == 0 else {}
    ranks = r.get("ranks", [])
    expect(len(ranks) == 4 and all(x.get("device", {}).get("fits") is True for x in ranks) and
           [x["device"]["node"] for x in ranks] == ["left", "left", "right", "right"] and r.get("step_ms", 0) > 0 and
           all(abs(sum(x["time_ms"][k] for k in ("compute", "comm", "bubble", "optimizer")) - x["time_ms"]["total"])
               < 1e-6 * x["time_ms"]["total"] for x in ranks),
           f"analyze --cluster: {p.returncode} {p.stderr} {ranks[:1]}")
    # the slow link between the nodes carries the data axis (ranks 0 and 2): its all_reduce is exposed whole
    # on a pipeline stage, so more comm than on the homogeneous cluster's fast links
    p = run(base + ["--mesh", "data=2,pipe=2", "--schedule", "1f1b", "--micro-batches", "4", "--cluster",
                    os.path.join(clusters, "homogeneous-8.json"), "--json"])
    fast = json.loads(p.stdout)["ranks"] if p.returncode == 0 else []
    expect(fast and ranks and ranks[0]["time_ms"]["comm"] > 2 * fast[0]["time_ms"]["comm"],
           f"analyze: the slow link's comm {ranks[:1]} against the fast one's {fast[:1]}")
    for args, text in ((["--mesh", "data=2,seq=2"], "training splits over"),
                       (["--mesh", "data=2", "--device-map", "1,0"], "give --cluster too"),
                       (["--mesh", "data=8,tensor=2", "--cluster", os.path.join(clusters, "heterogeneous.json")],
                        "4 devices for the 16 ranks"),
                       (["--mesh", "data=2", "--ranks", "3"], "--ranks 3"),
                       (["--mesh", "data=2", "--zero", "4"], "--zero"),
                       (["--mesh", "data=2", "--frob"], "unknown option '--frob'")):
        p = run(base + args)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode != 0 and text in p.stderr and len(lines) == 1, f"analyze {args}: {p.returncode} {p.stderr!r}")


def cost():
    """The cost model: `shard profile --quick` writes the documented keys; `analyze --profile` fills each
    rank's time_ms (total = the sum of its parts), step_ms (the slowest rank's total) and tokens_per_s
    (tokens / step); `bench analyze --json` on the first layouts has its keys; bad profiles refused in
    one line."""
    import shutil
    import tempfile
    work = tempfile.mkdtemp(prefix="shard-cost-")
    try:
        prof = os.path.join(work, "machine.json")
        p = run(["profile", "--quick", "--out", prof], timeout=120)
        expect(p.returncode == 0 and os.path.exists(prof), f"profile --quick: exit {p.returncode}: {p.stderr}")
        d = json.load(open(prof)) if os.path.exists(prof) else {}
        expect({"format", "machine", "date", "blas", "cores", "memory", "compute", "gemm", "comm"} <= set(d),
               f"profile keys: {sorted(d)}")
        expect(d.get("memory", {}).get("copy_gbps", 0) > 0 and d.get("memory", {}).get("add_gbps", 0) > 0
               and d.get("compute", {}).get("nongemm_fraction", -1) >= 0
               and d.get("compute", {}).get("nongemm_fraction_loaded", -1) >= 0, f"profile memory / compute: {d}")
        expect(all({"m", "n", "k", "threads", "gflops"} <= set(g) and g["gflops"] > 0 for g in d.get("gemm", [])),
               "profile gemm entries")
        # each rate and fraction a median with its spread beside it (how steady the host was)
        expect(all(g.get("gflops_spread", -1) >= 0 for g in d.get("gemm", []))
               and d.get("compute", {}).get("nongemm_fraction_spread", -1) >= 0
               and d.get("compute", {}).get("nongemm_fraction_loaded_spread", -1) >= 0, f"profile spreads: {d}")
        fits = {(c["op"], c["ranks"]) for c in d.get("comm", []) if c["backend"] == "threads"}
        expect({(op, n) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")
                for n in (2, 4)} <= fits, f"profile comm fits: {sorted(fits)}")
        expect(all(c["alpha_us"] >= 0 and c["beta_gbps"] > 0 for c in d.get("comm", [])), "profile alpha / beta")
        base = ["analyze", "--config", TINY, "--batch", "8", "--seq", "64", "--profile", prof, "--json"]
        for extra in (["--mesh", "data=2", "--zero", "3"], ["--mesh", "pipe=2", "--schedule", "1f1b"],
                      ["--mesh", "tensor=2", "--sequence-parallel"]):
            p = run(base + extra)
            expect(p.returncode == 0, f"analyze --profile {extra}: exit {p.returncode}: {p.stderr}")
            r = json.loads(p.stdout) if p.returncode == 0 else {"ranks": []}
            totals = []
            for rank in r["ranks"]:
                t = rank.get("time_ms", {})
                expect({"compute", "comm", "bubble", "optimizer", "total"} <= set(t), f"time_ms keys: {t}")
                parts = sum(t.get(k, 0) for k in ("compute", "comm", "bubble", "optimizer"))
                expect(abs(parts - t.get("total", -1)) <= 1e-6 * max(1, parts), f"{extra}: total != parts: {t}")
                totals.append(t.get("total", 0))
            if r["ranks"]:
                expect(abs(r["step_ms"] - max(totals)) <= 1e-6 * r["step_ms"], f"{extra}: step_ms {r['step_ms']}")
                expect(abs(r["tokens_per_s"] - 8 * 64 / (r["step_ms"] / 1e3)) <= 1e-6 * r["tokens_per_s"],
                       f"{extra}: tokens_per_s {r['tokens_per_s']} for step {r['step_ms']} ms")
        expect("bubble" in run(base[:-1] + ["--mesh", "pipe=2"]).stdout, "analyze --profile table")
        # an older file, without the spreads, is read as before; a negative spread is refused
        older = os.path.join(work, "older.json")
        with open(older, "w") as f:
            json.dump(dict(d, compute={k: v for k, v in d.get("compute", {}).items() if "spread" not in k},
                           gemm=[{k: v for k, v in g.items() if k != "gflops_spread"} for g in d.get("gemm", [])]), f)
        p = run(base[:-2] + [older, "--json"])
        expect(p.returncode == 0 and json.loads(p.stdout).get("step_ms", 0) > 0,
               f"analyze --profile (no spreads): {p.returncode} {p.stderr}")
        bad = os.path.join(work, "bad.json")
        spread = os.path.join(work, "spread.json")
        with open(bad, "w") as f:
            json.dump(dict(d, memory={"copy_gbps": -1, "add_gbps": 1}), f)
        with open(spread, "w") as f:
            json.dump(dict(d, compute=dict(d.get("compute", {}), nongemm_fraction_spread=-0.5)), f)
        for path, what in ((bad, "copy_gbps"), (spread, "nongemm_fraction_spread"),
                           (os.path.join(work, "none.json"), "none.json")):
            p = run(base[:-2] + [path])
            expect(p.returncode == 1 and what in p.stderr and len(p.stderr.strip().splitlines()) == 1,
                   f"analyze --profile {path}: {p.returncode} {p.stderr!r}")
        p = run(["bench", "analyze", "--profile", prof, "--limit", "2", "--steps", "5", "--warmup", "1", "--json"],
                timeout=120)
        expect(p.returncode == 0, f"bench analyze: exit {p.returncode}: {p.stderr}")
        b = json.loads(p.stdout) if p.returncode == 0 else {}
        expect({"profile", "layouts", "ranking_matches", "discordant_pairs"} <= set(b), f"bench analyze keys: {sorted(b)}")
        rows = b.get("layouts", [])
        expect(len(rows) == 2 and all({"layout", "ranks", "predicted_ms", "measured_ms", "error", "oversubscribed"}
                                      <= set(x) and x["predicted_ms"] > 0 and x["measured_ms"] > 0 for x in rows),
               f"bench analyze rows: {rows}")
        p = run(["bench", "analyze", "--limit", "99"])
        expect(p.returncode == 2 and "--limit" in p.stderr, f"bench analyze --limit 99: {p.stderr!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def plan():
    """`shard plan` on the example clusters: every layout of the tiny GPT over the cluster's devices tried,
    the fitting ones ranked by the goal (the chosen one first, its predicted step the least for throughput,
    its peak the least for memory), --out writes the plan's documented keys whose flags `shard analyze`
    takes back with the same prediction (with its device map); the winner's placement solved by hungarian,
    anneal and genetic, each a device map of the cluster's devices, and where in order the winner's tensor
    pairs cross the slow link the chosen method's map is the plan's, priced again and explained, and a
    map given with --device-map kept; a cluster too small for any layout is refused in one line naming
    the least memory a device would need; a bad goal and an unknown placement method in one line."""
    import tempfile
    clusters = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "clusters")
    # the broad search alone, its winner alone placed (plan_space checks the variants and --place-top)
    base = ["plan", "--config", TINY, "--batch", "8", "--seq", "64", "--refine", "0", "--place-top", "1"]
    with tempfile.TemporaryDirectory(prefix="shard-cli-plan-") as work:
        out = os.path.join(work, "plan.json")
        p = run(base + ["--cluster", os.path.join(clusters, "two-nodes-slow-link.json"), "--json", "--top", "50",
                        "--out", out])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        plans = r.get("plans", [])
        expect(p.returncode == 0 and r.get("world") == 4 and r.get("fitting", 0) >= 2 and plans and
               all(x["fits"] for x in plans) and [x["step_ms"] for x in plans] == sorted(x["step_ms"] for x in plans)
               and r.get("explanation", "").startswith("Chosen for throughput"), f"plan --json: {p.stderr} {r}")
        placed = r.get("placement", [])
        expect([x.get("method") for x in placed] == ["hungarian", "anneal", "genetic"] and
               all(sorted(x["device_map"]) == [0, 1, 2, 3] and x["step_ms"] > 0 and x["seconds"] >= 0 for x in placed)
               and r.get("placed_by") in ("", "anneal"), f"plan --json placement: {placed} {r.get('placed_by')}")
        written = json.load(open(out)) if os.path.exists(out) else {}
        expect({"mesh", "flags", "layers_per_stage", "batch_shares", "device_map", "predicted", "explanation"}
               <= set(written) and {"step_ms", "tokens_per_s", "peak_bytes"} <= set(written.get("predicted", {}))
               and sorted(written.get("device_map") or []) == [0, 1, 2, 3], f"plan.json: {written}")

        def reanalyzed(cluster, written):
            """the plan's flags and device map, analyzed on the same cluster, predict the same step"""
            q = run(["analyze", "--config", TINY, "--batch", "8", "--seq", "64", "--cluster", cluster, "--json",
                     "--device-map", ",".join(str(d) for d in written["device_map"])] + written["flags"])
            a = json.loads(q.stdout) if q.returncode == 0 else {}
            expect(abs(a.get("step_ms", 0) - written["predicted"]["step_ms"]) <= 1e-6 * written["predicted"]["step_ms"],
                   f"plan's flags re-analyzed on {cluster}: {a.get('step_ms')} against {written['predicted']} {q.stderr}")
        if written:
            reanalyzed(os.path.join(clusters, "two-nodes-slow-link.json"), written)
        # in order, the smallest layout of the broad search (data=1,tensor=2,pipe=2; the variants find a
        # deeper pipeline smaller still) has tensor pairs across the slow link between the nodes: the
        # genetic map puts each pair on one node
        crossed = os.path.join(clusters, "two-nodes-slow-link.json")
        p = run(base + ["--cluster", crossed, "--goal", "memory", "--placement", "genetic", "--json", "--out", out])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        written = json.load(open(out)) if p.returncode == 0 else {}
        genetic = ([x for x in r.get("placement", []) if x["method"] == "genetic"] or [{}])[0]
        expect(r.get("placed_by") == "genetic" and written.get("device_map") == genetic.get("device_map") and
               written["device_map"] != [0, 1, 2, 3] and written["predicted"]["step_ms"] == genetic.get("step_ms") and
               "Placement (genetic) puts tensor neighbours on links of 20 Gb/s" in r.get("explanation", ""),
               f"plan --placement genetic, goal memory: {p.stderr} {r} {written}")
        if written:
            reanalyzed(crossed, written)
        # a device map given is kept (in order the least-memory layout's tensor pairs join a fast and a slow
        # device: the solvers' maps would predict less, and the explanation says so)
        p = run(base + ["--cluster", os.path.join(clusters, "heterogeneous.json"), "--goal", "memory", "--json",
                        "--top", "50", "--device-map", "0,1,2,3", "--out", out])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        written = json.load(open(out)) if p.returncode == 0 else {}
        peaks = [x["peak_bytes"] for x in r.get("plans", [])]
        expect(p.returncode == 0 and peaks and peaks == sorted(peaks), f"plan --goal memory: {p.stderr} {peaks}")
        expect(r.get("placed_by") == "given" and written.get("device_map") == [0, 1, 2, 3] and
               "The device map is kept as given" in r.get("explanation", ""),
               f"plan --device-map kept: {p.stderr} {r.get('placed_by')} {written.get('device_map')}")
        # devices of unequal speed: the chosen plan gives the fast devices' data ranks more rows, and predicts
        # a step well under the best even split's (the fast pair runs at 3x the slow one)
        out = os.path.join(work, "hetero.json")
        p = run(base + ["--cluster", os.path.join(clusters, "heterogeneous.json"), "--json", "--top", "60",
                        "--out", out])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        plans = r.get("plans", [])
        even = [x["step_ms"] for x in plans if "--batch-shares" not in x["flags"] and
                "--layers-per-stage" not in x["flags"]]
        written = json.load(open(out)) if os.path.exists(out) else {}
        expect(p.returncode == 0 and plans and "--batch-shares" in plans[0]["flags"] and even and
               plans[0]["step_ms"] * 1.3 < min(even) and written.get("batch_shares") and
               "batch-shares" in r.get("explanation", ""), f"plan on heterogeneous devices: {p.stderr} {r} {written}")
        if written.get("batch_shares"):
            shares = [int(x) for x in written["batch_shares"].split(",")]
            expect(sum(shares) == 8 and shares[0] > shares[-1], f"plan's batch shares: {written}")
        # the closed-form screen: every layout priced by it, the best two checked by dry run and listed
        # first; its choice within 5 % of the exhaustive search's
        slow = os.path.join(clusters, "two-nodes-slow-link.json")
        runs = {}
        for mode in ("exhaustive", "screen"):
            p = run(base + ["--cluster", slow, "--json", "--top", "60", "--search", mode, "--verify", "2"])
            runs[mode] = json.loads(p.stdout) if p.returncode == 0 else {}
            expect(p.returncode == 0, f"plan --search {mode}: {p.stderr}")
        screened = runs["screen"].get("plans", [])
        expect(len(screened) > 2 and [x["screened"] for x in screened[:3]] == [False, False, True] and
               runs["screen"].get("tried") == runs["exhaustive"].get("tried") and
               all(not x["screened"] for x in runs["exhaustive"].get("plans", [])) and
               screened[0]["step_ms"] <= 1.05 * runs["exhaustive"]["plans"][0]["step_ms"],
               f"plan --search screen: {screened[:3]} against {runs['exhaustive'].get('plans', [])[:1]}")
        # a latency budget cuts the layouts predicting a longer step, and says so; one below every layout's
        # step is refused in one line naming the fastest
        p = run(base + ["--cluster", slow, "--json", "--top", "60", "--latency-budget-ms", "300"])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        expect(p.returncode == 0 and r.get("plans") and all(x["step_ms"] <= 300 for x in r["plans"]) and
               "The latency budget cut" in r.get("explanation", ""), f"plan --latency-budget-ms 300: {p.stderr} {r}")
        p = run(base + ["--cluster", slow, "--latency-budget-ms", "1"])
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode != 0 and "meets the latency budget of 1.0 ms: the fastest predicts" in p.stderr and
               len(lines) == 1, f"plan --latency-budget-ms 1: {p.stderr!r}")
        # throughput on the slow link: a larger global batch predicts more tokens/s; named, then chosen
        p = run(base + ["--cluster", slow, "--json"])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        larger = r.get("larger_batch") or {}
        expect(p.returncode == 0 and r.get("batch") == 8 and larger.get("batch", 0) in (16, 32, 64) and
               larger.get("tokens_per_s", 0) >= 1.05 * r["plans"][0]["tokens_per_s"] and
               "--grow-batch chooses it" in r.get("explanation", ""), f"plan's larger batch: {p.stderr} {r}")
        p = run(base + ["--cluster", slow, "--json", "--grow-batch", "--out", out])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        written = json.load(open(out)) if p.returncode == 0 else {}
        flags = written.get("flags", [])
        expect(p.returncode == 0 and r.get("batch") == larger.get("batch") and "--batch" in flags and
               flags[flags.index("--batch") + 1] == str(larger.get("batch")) and
               "The global batch grows to" in r.get("explanation", ""), f"plan --grow-batch: {p.stderr} {r} {written}")
        p = run(base + ["--cluster", slow, "--search", "sideways"])
        expect(p.returncode != 0 and "give exhaustive or screen" in p.stderr, f"plan --search sideways: {p.stderr!r}")
        small = os.path.join(work, "small.json")
        with open(small, "w") as f:
            json.dump({"nodes": [{"name": "tiny", "devices": 2, "compute_tflops": 0.001,
                                  "available_memory_gb": 0.001}],
                       "network": {"bandwidth_gbps": 10, "latency_us": 10},
                       "intra_node": {"bandwidth_gbps": 10, "latency_us": 10}}, f)
        for args, text in ((["--cluster", small], "the least a device would need is"),
                           (["--cluster", small, "--goal", "speed"], "goal 'speed'"),
                           (["--cluster", small, "--placement", "simplex"],
                            "--placement 'simplex' is invalid: give hungarian, anneal or genetic"),
                           ([], "give --config (the model) and --cluster")):
            p = run(base + args)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            expect(p.returncode != 0 and text in p.stderr and len(lines) == 1, f"plan {args}: {p.returncode} {p.stderr!r}")


def plan_space():
    """`shard plan`'s wider search and budgets: with --grad-dtype f32,bf16 both gradient dtypes are
    searched (bf16 halving a data=4 layout's reduction, so predicting a shorter step than its f32 twin);
    the variants of the leading meshes (GPipe, interleaved with two chunks, accumulation) are tried and
    their flags re-analyze to the same prediction; --place-top 3 places three layouts; the communication
    and compute budgets cut layouts and say so, and one no layout meets is refused in one line naming
    the least figure; bad values of the new options in one line each."""
    clusters = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "clusters")
    slow, hetero = (os.path.join(clusters, n + ".json") for n in ("two-nodes-slow-link", "heterogeneous"))
    base = ["plan", "--config", TINY, "--batch", "8", "--seq", "64"]
    p = run(base + ["--cluster", slow, "--json", "--top", "500", "--grad-dtype", "f32,bf16", "--place-top", "3"])
    r = json.loads(p.stdout) if p.returncode == 0 else {}
    plans = r.get("plans", [])
    flags = {" ".join(x["flags"]): x for x in plans}
    expect(p.returncode == 0 and r.get("layouts_placed") == 3 and 1 <= r.get("placed_rank", 0) <= 3,
           f"plan --place-top 3: {p.stderr} {r.get('layouts_placed')} {r.get('placed_rank')}")
    for words in ("--grad-dtype bf16", "--schedule interleaved --virtual-stages 2", "--schedule gpipe", "--accum 2"):
        expect(any(words in f for f in flags), f"plan's search has no layout with {words}: {list(flags)}")
    f32, bf16 = flags.get("--mesh data=4 --zero 0"), flags.get("--mesh data=4 --zero 0 --grad-dtype bf16")
    expect(f32 and bf16 and bf16["step_ms"] < f32["step_ms"], f"bf16 gradients on data=4: {f32} {bf16}")
    interleaved = [x for f, x in flags.items() if "interleaved" in f]
    if interleaved:
        x = interleaved[0]
        q = run(["analyze", "--config", TINY, "--batch", "8", "--seq", "64", "--cluster", slow, "--json"] + x["flags"])
        a = json.loads(q.stdout) if q.returncode == 0 else {}
        expect(abs(a.get("step_ms", 0) - x["step_ms"]) <= 1e-6 * x["step_ms"],
               f"an interleaved layout's flags re-analyzed: {a.get('step_ms')} against {x} {q.stderr}")
    # the communication budget
    screen = ["--search", "screen", "--verify", "0"]  # the budgets cut the same way on the screen's figures
    p = run(base + ["--cluster", slow, "--json", "--top", "500", "--max-comm-fraction", "0.3"] + screen)
    r = json.loads(p.stdout) if p.returncode == 0 else {}
    expect(p.returncode == 0 and r.get("plans") and all(x["comm_fraction"] <= 0.3 for x in r["plans"]) and
           "The communication budget cut" in r.get("explanation", ""), f"plan --max-comm-fraction 0.3: {p.stderr} {r}")
    # the compute budget: on unequal devices the even splits' compute is imbalanced
    p = run(base + ["--cluster", hetero, "--json", "--top", "500", "--max-compute-imbalance", "0.2"] + screen)
    r = json.loads(p.stdout) if p.returncode == 0 else {}
    expect(p.returncode == 0 and r.get("plans") and all(x["compute_imbalance"] <= 0.2 for x in r["plans"]) and
           "The compute budget cut" in r.get("explanation", ""), f"plan --max-compute-imbalance 0.2: {p.stderr} {r}")
    # fallbacks said: four devices of 9.5 MB, where every data-only layout is cut by memory and the
    # winner needs a tensor split and gradient accumulation
    import tempfile
    with tempfile.TemporaryDirectory(prefix="shard-cli-plan-space-") as work:
        tight = os.path.join(work, "tight.json")
        with open(tight, "w") as f:
            json.dump({"nodes": [{"name": "a", "devices": 4, "compute_tflops": 0.003, "available_memory_gb": 0.0095}],
                       "network": {"bandwidth_gbps": 10, "latency_us": 50},
                       "intra_node": {"bandwidth_gbps": 20, "latency_us": 50}}, f)
        p = run(base + ["--cluster", tight, "--json"])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        winner = " ".join((r.get("plans") or [{}])[0].get("flags", []))
        explanation = r.get("explanation", "")
        expect(p.returncode == 0 and "--accum" in winner and "It needs gradient accumulation to fit" in explanation
               and "because every layout without such a split" in explanation,
               f"plan on 9.5 MB devices: {p.stderr} {winner} {explanation}")
    for args, text in ((["--cluster", slow, "--max-comm-fraction", "0.001"] + screen,
                        "meets the communication budget of 0 %: the least exposed communication predicted is"),
                       (["--cluster", slow, "--grad-dtype", "fp8"], "gradient dtypes 'fp8': give f32, bf16 or f32,bf16"),
                       (["--cluster", slow, "--max-comm-fraction", "2"], "--max-comm-fraction '2' is invalid"),
                       (["--cluster", slow, "--max-compute-imbalance", "-1"], "--max-compute-imbalance '-1' is invalid"),
                       (["--cluster", slow, "--place-top", "0"], "--place-top")):
        p = run(base + args)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode != 0 and text in p.stderr and len(lines) == 1, f"plan {args}: {p.returncode} {p.stderr!r}")


def bench_plan():
    """`bench plan --json` on a 2-device cluster of unequal devices: one object with the documented keys,
    the planner's top layouts and the hand-picked ones measured under emulation, the chosen plan uneven and
    faster than the best even split (the fast device runs at 3x the slow one); bad options in one line."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="shard-cli-bench-plan-") as work:
        cluster = os.path.join(work, "pair.json")
        with open(cluster, "w") as f:
            json.dump({"nodes": [{"name": "fast", "devices": 1, "compute_tflops": 0.006, "available_memory_gb": 1},
                                 {"name": "slow", "devices": 1, "compute_tflops": 0.002, "available_memory_gb": 1}],
                       "network": {"bandwidth_gbps": 10, "latency_us": 50},
                       "intra_node": {"bandwidth_gbps": 10, "latency_us": 50}}, f)
        p = run(["bench", "plan", "--config", TINY, "--cluster", cluster, "--batch", "8", "--seq", "32", "--top", "2",
                 "--steps", "5", "--json"], timeout=240)
        lines = [l for l in p.stdout.splitlines() if l.strip()]
        r = json.loads(lines[0]) if p.returncode == 0 and len(lines) == 1 else {}
        keys = {"cluster", "config", "goal", "chosen", "chosen_ms", "chosen_predicted_ms", "best", "best_ms", "ratio",
                "even_best", "even_best_ms", "gain_vs_even", "layouts"}
        expect(keys <= set(r), f"bench plan: {p.returncode} {p.stderr} {r}")
        if keys <= set(r):
            rows = r["layouts"]
            expect(len(rows) >= 4 and rows[0]["planner_rank"] == 1 and any(x["hand_picked"] for x in rows) and
                   all(x["measured_ms"] > 0 and x["predicted_ms"] > 0 for x in rows), f"bench plan rows: {rows}")
            expect(0 < r["ratio"] <= 1 and r["best_ms"] == min(x["measured_ms"] for x in rows) and
                   "batch-shares" in r["chosen"] and r["gain_vs_even"] > 1.2, f"bench plan figures: {r}")
            # the planner's memory is the dry run's: every measured layout's fullest rank within 1 %
            expect(all(abs(x["predicted_peak_bytes"] / x["peak_bytes"] - 1) <= 0.01 for x in rows) and
                   abs(r["chosen_predicted_peak_bytes"] / r["chosen_peak_bytes"] - 1) <= 0.01,
                   f"bench plan peaks: {[(x['layout'], x['predicted_peak_bytes'], x['peak_bytes']) for x in rows]}")
        for args, text in ((["--top", "0"], "--top"), (["--frob"], "unknown option '--frob'")):
            p = run(["bench", "plan"] + args)
            expect(p.returncode == 2 and text in p.stderr and len(p.stderr.strip().splitlines()) == 1,
                   f"bench plan {args}: {p.returncode} {p.stderr!r}")
def bench_reshard():
    """`bench reshard --json` on the tiny GPT: one stop-and-copy and one live object per transition with the
    documented keys, the stop-and-copy move from data=4 (ZeRO-0: every rank holds everything) to
    data=2,pipe=2 sending no byte, the ZeRO-3 one sending some, every pause and step time positive; a bad
    option in one line."""
    p = run(["bench", "reshard", "--config", TINY, "--repeats", "1", "--json"], timeout=120)
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()] if p.returncode == 0 else []
    keys = {"from", "to", "migration", "bytes", "pause_ms", "total_ms", "step_ms"}
    stop = [r for r in rows if r.get("migration") == "stop-and-copy"]
    live = [r for r in rows if r.get("migration") == "live"]
    expect(len(rows) == 6 and len(stop) == 3 and len(live) == 3 and
           all(keys <= set(r) and r["pause_ms"] > 0 and r["step_ms"] > 0 for r in rows) and
           [(r["from"], r["to"]) for r in stop] == [(r["from"], r["to"]) for r in live] and
           stop[0]["bytes"] == 0 and stop[2]["bytes"] > 0 and live[2]["bytes"] > 0 and
           all(r["total_ms"] >= r["pause_ms"] for r in live), f"bench reshard: {p.returncode} {p.stderr} {rows}")
    p = run(["bench", "reshard", "--repeats", "0"])
    expect(p.returncode == 2 and "--repeats" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
           f"bench reshard --repeats 0: {p.returncode} {p.stderr!r}")


def train_plan():
    """`train --plan`: a hand-written plan (data=2,pipe=2, ZeRO-1, 1F1B, layers 3,1, batch shares [6, 2]) trains
    to one rank's losses at each of 20 steps (1e-5 relative), an agreeing layout flag beside it accepted, and
    prints its predictions against the run; `plan --out` on a two-device cluster, then `train --plan` on that
    cluster, runs its layout and its device map; a disagreeing flag, a key of the wrong type, a plan's own
    keys at odds and --ranks other than the mesh's are refused in one line each, exit 2."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="shard-cli-train-plan-") as work:
        data = tiny_corpus(work, "a plan is a layout with its predictions. ", 400)
        args = ["train", "--config", TINY, "--data", data, "--batch", "8", "--seq", "32", "--seed", "3"]
        plan = {"mesh": "data=2,pipe=2",
                "flags": ["--mesh", "data=2,pipe=2", "--zero", "1", "--schedule", "1f1b", "--micro-batches", "2"],
                "layers_per_stage": "3,1", "batch_shares": [6, 2], "device_map": None,
                "predicted": {"step_ms": 50.0, "tokens_per_s": 5120.0, "peak_bytes": [8e6, 3e6, 8e6, 3e6]},
                "explanation": "written by hand"}
        path = os.path.join(work, "plan.json")
        with open(path, "w") as f:
            json.dump(plan, f)
        losses, summaries = [], []
        for extra in ([], ["--plan", path, "--zero", "1"]):
            log = os.path.join(work, "run.jsonl")
            if os.path.exists(log):
                os.remove(log)
            p = run(args + ["--steps", "20", "--log", log] + extra)
            losses.append([r["loss"] for r in log_rows(log)] if p.returncode == 0 else [])
            summaries.append(log_summary(log) if p.returncode == 0 else {})
        ref, got = losses
        worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1) if len(ref) == len(got) == 20 else 1
        expect(worst <= 1e-5, f"train --plan: worst relative loss difference {worst} {p.stderr}")
        rows = [l.split() for l in p.stdout.splitlines() if l.startswith("  peak MiB of rank ")]
        expect(f"train: the plan {path} against this run:" in p.stdout and
               re.search(r"\n  step ms +50\.00 +[0-9.]+ +[0-9.]+   the median of steps 2-20\n", p.stdout) and
               len(rows) == 4 and "layers per stage 3,1" in p.stdout and "split unevenly" in p.stdout,
               f"train --plan's comparison: {p.stdout[-900:]}")
        # the log's summary holds the same comparison: the plan's predictions beside the measured figures
        step_row = re.search(r"\n  step ms +50\.00 +([0-9.]+) ", p.stdout)
        sm = summaries[1]
        expect("predicted" not in summaries[0] and len(summaries[0].get("peak_bytes", [])) == 1 and
               sm.get("predicted") == {"step_ms": 50.0, "peak_bytes": [8e6, 3e6, 8e6, 3e6]} and
               step_row and abs(sm.get("median_step_ms", 0) - float(step_row.group(1))) <= 0.006 and
               len(rows) == 4 and len(sm.get("peak_bytes", [])) == 4 and
               all(abs(b / 1048576 - float(r[7])) <= 0.006 for b, r in zip(sm["peak_bytes"], rows)),
               f"train --plan --log's summary: {summaries} {rows}")
        # a plan `shard plan` wrote for a two-device cluster, run on that cluster with its device map
        cluster = os.path.join(work, "two.json")
        with open(cluster, "w") as f:
            json.dump({"nodes": [{"name": "box", "devices": 2, "compute_tflops": 0.004, "available_memory_gb": 2}],
                       "network": {"bandwidth_gbps": 10, "latency_us": 10},
                       "intra_node": {"bandwidth_gbps": 100, "latency_us": 2}}, f)
        written = os.path.join(work, "written.json")
        p = run(["plan", "--config", TINY, "--cluster", cluster, "--device-map", "1,0", "--batch", "8", "--seq", "32",
                 "--out", written])
        expect(p.returncode == 0 and os.path.exists(written), f"plan --out: {p.stderr}")
        p = run(args + ["--steps", "3", "--plan", written, "--cluster", cluster])
        mesh = json.load(open(written))["mesh"] if os.path.exists(written) else "?"
        expect(p.returncode == 0 and f"mesh {mesh} (threads" in p.stdout and
               re.search(r"\n  step ms +[0-9.]+ +[0-9.]+ +[0-9.]+   the median of steps 2-3\n", p.stdout) and
               re.search(r"\n  peak MiB of the fullest rank +[0-9.]+ +[0-9.]+ +[0-9.]+   measured on rank", p.stdout),
               f"train --plan {mesh} --cluster: {p.returncode} {p.stdout[-600:]} {p.stderr}")
        p = run(args + ["--steps", "1", "--plan", written, "--cluster", cluster, "--device-map", "0,1"])
        expect(p.returncode == 2 and p.stderr == f"shard: train: --device-map 0,1 disagrees with the plan's device_map "
                                                 f"1,0 ({written})\n", f"--device-map beside the plan: {p.stderr!r}")
        bad = os.path.join(work, "bad.json")
        for change, extra, line in (
                ({}, ["--zero", "2"], f"shard: train: --zero 2 disagrees with the plan's --zero 1 ({path})"),
                ({}, ["--recompute"], f"shard: train: --recompute disagrees with the plan, which gives no --recompute "
                                      f"({path})"),
                ({}, ["--ranks", "2"], f"shard: train: --ranks 2 disagrees with the plan's mesh data=2,pipe=2 of 4 "
                                       f"ranks ({path}): leave --ranks out"),
                ({"flags": "--zero 1"}, [], f"shard: {bad}: key 'flags' must be a list of shard train's layout flags, "
                                            "e.g. [\"--zero\", \"1\"], not a string"),
                ({"batch_shares": {"a": 6}}, [], f"shard: {bad}: key 'batch_shares' must be null, a string such as "
                                                 "\"3,1\" or a list such as [3, 1], not an object"),
                ({"flags": ["--zero", "7"]}, [], f"shard: {bad}: key 'flags': --zero '7' is invalid: give an integer "
                                                 "in 0..3"),
                ({"mesh": "data=4"}, [], f"shard: {bad}: key 'mesh' gives --mesh data=4 and key 'flags' --mesh "
                                         "data=2,pipe=2: give one of them, or the same in both")):
            target = path
            if change:
                with open(bad, "w") as f:
                    json.dump(dict(plan, **change), f)
                target = bad
            p = run(args + ["--steps", "1", "--plan", target] + extra)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            expect(p.returncode == 2 and lines == [line], f"train --plan {change} {extra}: {p.returncode} {p.stderr!r}")


def batch_shares():
    """--batch-shares: uneven rows per data rank (6,2; 5,3 with accumulation; 5,3 on data=2,pipe=2 1F1B; 7,1
    on data=2,tensor=2 with ZeRO-3) train to one rank's losses at each of 20 steps (1e-5 relative); shares of
    the wrong count, sum or size are refused in one line before any rank starts."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="shard-cli-shares-") as work:
        data = tiny_corpus(work, "faster devices take more rows of the batch. ", 400)
        args = ["train", "--config", TINY, "--data", data, "--batch", "8", "--seq", "32", "--steps", "20", "--seed",
                "3"]
        ref = None
        for extra in ([], ["--ranks", "2", "--mesh", "data=2", "--batch-shares", "6,2"],
                      ["--ranks", "2", "--mesh", "data=2", "--batch-shares", "5,3", "--accum", "2"],
                      ["--ranks", "4", "--mesh", "data=2,pipe=2", "--batch-shares", "5,3", "--micro-batches", "2",
                       "--schedule", "1f1b"],
                      ["--ranks", "4", "--mesh", "data=2,tensor=2", "--zero", "3", "--batch-shares", "7,1"]):
            log = os.path.join(work, "run.jsonl")
            if os.path.exists(log):
                os.remove(log)
            p = run(args + extra + ["--log", log])
            got = [r["loss"] for r in log_rows(log)] if p.returncode == 0 else []
            if ref is None:
                ref = got
                expect(len(got) == 20, f"one rank: {p.stderr}")
                continue
            worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1) if len(got) == 20 else 1
            expect(worst <= 1e-5, f"--batch-shares {extra}: worst relative loss difference {worst} {p.stderr}")
        for extra, text in ((["--batch-shares", "6,1,1"], "3 counts for 2 data ranks"),
                            (["--batch-shares", "6,3"], "add up to 9 rows, not --batch 8"),
                            (["--batch-shares", "8,0"], "positive row counts"),
                            (["--batch-shares", "7,1", "--accum", "2"], "data rank 1 1 rows for 2 micro-steps"),
                            (["--batch-shares", "6,2", "--micro-batch", "2"], "give one of them")):
            p = run(args + ["--ranks", "2", "--mesh", "data=2"] + extra)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            expect(p.returncode != 0 and text in p.stderr and len(lines) == 1 and "rank " not in p.stderr[:12],
                   f"--batch-shares {extra}: {p.returncode} {p.stderr!r}")


def cluster_changes():
    """An emulated cluster that changes during a run: on data=2 over two devices, node b 3x slower from step 4
    of 8 makes the steps after it at least twice as long as those before (the slow device sets the pace), says
    so in one stderr line, and leaves the losses those of the run without the change (1e-6 relative); its
    memory cut below what a rank holds at step 3 refuses that step's allocation; a bad entry is one line."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="shard-cli-cluster-changes-") as work:
        data = tiny_corpus(work, "a node that slows down sets the pace of the step. ", 400)

        def cluster(name, changes):
            path = os.path.join(work, name + ".json")
            b = {"name": "b", "devices": 1, "compute_tflops": 0.002, "available_memory_gb": 1}
            if changes is not None:
                b["changes"] = changes
            with open(path, "w") as f:
                json.dump({"nodes": [{"name": "a", "devices": 1, "compute_tflops": 0.002, "available_memory_gb": 1},
                                     b],
                           "network": {"bandwidth_gbps": 10, "latency_us": 50},
                           "intra_node": {"bandwidth_gbps": 10, "latency_us": 50}}, f)
            return path

        args = ["train", "--config", TINY, "--data", data, "--batch", "8", "--seq", "32", "--steps", "8", "--seed",
                "3", "--ranks", "2", "--mesh", "data=2"]
        runs = {}
        for name, changes in (("steady", None), ("slowed", [{"at_step": 4, "slowdown": 3}])):
            log = os.path.join(work, name + ".jsonl")
            p = run(args + ["--cluster", cluster(name, changes), "--log", log])
            rows = log_rows(log) if p.returncode == 0 else []
            expect(len(rows) == 8, f"{name}: {p.returncode} {p.stderr}")
            said = [l for l in p.stderr.splitlines() if l.startswith("cluster:")]
            expect(said == ([] if changes is None else ["cluster: step 4: node 'b' computes 3x slower (0.000667 TFLOP/s)"]),
                   f"{name}: the change's line: {said}")
            runs[name] = rows
        if len(runs["steady"]) == 8 and len(runs["slowed"]) == 8:
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(runs["steady"], runs["slowed"]))
            expect(worst <= 1e-6, f"a slowdown changed the losses: worst relative difference {worst}")
            ms = [r["ms"] for r in runs["slowed"]]
            before, after = sorted(ms[1:3])[0], sorted(ms[3:])[2]
            expect(after >= 2 * before, f"step times before and after node b's slowdown at step 4: {ms}")

        log = os.path.join(work, "squeezed.jsonl")
        p = run(args + ["--cluster", cluster("squeezed", [{"at_step": 3, "available_memory_gb": 0.01}]), "--log", log])
        expect(p.returncode != 0 and "cluster: step 3: node 'b' has 0.01 GiB" in p.stderr and
               "rank 1 on node 'b' (device 1) is out of device memory" in p.stderr and
               len(log_rows(log)) == 2, f"memory cut below what rank 1 holds: {p.returncode} {p.stderr}")

        p = run(args + ["--cluster", cluster("bad", [{"at_step": 4, "slowdown": 2}, {"at_step": 0, "slowdown": 1}])])
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        expect(p.returncode != 0 and len(lines) == 1 and
               "nodes[1] ('b') changes[1] \"at_step\" is out of range: give a number in [1, 1e+15]" in p.stderr,
               f"a change at step 0: {p.returncode} {p.stderr!r}")


def routed_alike(got, ref, aux=False):
    """A mixture of experts' run routes as the reference one: 10 logged steps, losses (and with aux the router's
    aux loss) within 1e-5 relative, the same drops and the same expert load at every step."""
    return len(got) == 10 and all(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) and
                                  (not aux or abs(a["aux_loss"] - b["aux_loss"]) <= 1e-5 * abs(b["aux_loss"])) and
                                  a["dropped_tokens"] == b["dropped_tokens"] and a["expert_load"] == b["expert_load"]
                                  for a, b in zip(got, ref))


def moe_corpus(work):
    """Token files of a small repetitive corpus in work/data, and `shard train`'s arguments for the tiny MoE GPT
    on them (10 steps of batch 8 x 64)."""
    data = tiny_corpus(work, "the cat sat on the mat. the dog sat on the log. a bird flew over the tree.\n", 300)
    cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "gpt-moe-tiny.json")
    return data, cfg, ["train", "--config", cfg, "--data", data, "--batch", "8", "--seq", "64", "--steps", "10",
                       "--seed", "3"]


def moe_pipe():
    """The tiny MoE GPT over pipeline stages: each micro-batch's routing kept from its forward to its backward,
    router statistics summed over the stages; pipe=2 (1F1B, recompute), pipe=2,expert=2 and
    data=2,pipe=2,expert=2 with ZeRO-3, and a 4-block model (every other block a mixture, 6 experts with
    random routing and jitter) interleaved, on pipe=3,expert=2 and tensor=2,pipe=2,expert=2, give one
    rank's losses, drops and expert load at each of 10 steps (1e-5 relative); a checkpoint saved on
    pipe=2,expert=2 resumes on one rank with the same losses."""
    import shutil
    import tempfile
    work = tempfile.mkdtemp(prefix="shard-cli-moe-pipe-")
    try:
        data, cfg, args = moe_corpus(work)
        log = os.path.join(work, "one.jsonl")
        p = run(args + ["--log", log])
        one = log_rows(log) if p.returncode == 0 else []
        expect(len(one) == 10, f"moe one rank: {p.stderr}")
        with open(cfg) as f:
            conf = json.load(f)
        conf.update(num_local_experts=6, router_random_routing=True, router_jitter_noise=0.01)
        # pipeline stages: each micro-batch's routing kept from its forward to its backward (1F1B holds
        # several), the router statistics summed over the stages; with expert, data x ZeRO-3, tensor,
        # recompute, and interleaved chunks of a 4-block model whose every other block is a mixture
        pipes = (["--ranks", "2", "--mesh", "pipe=2", "--micro-batch", "2"],
                 ["--ranks", "2", "--mesh", "pipe=2", "--micro-batch", "2", "--recompute"],
                 ["--ranks", "4", "--mesh", "pipe=2,expert=2", "--micro-batch", "1"],
                 ["--ranks", "8", "--mesh", "data=2,pipe=2,expert=2", "--zero", "3", "--micro-batch", "2"])
        for extra in pipes:
            log = os.path.join(work, "pipe.jsonl")
            p = run(args + extra + ["--log", log])
            got = log_rows(log) if p.returncode == 0 else []
            same = routed_alike(got, one, aux=True)
            expect(same, f"moe {extra} differs from one rank: {[r['loss'] for r in got]} vs "
                         f"{[r['loss'] for r in one]} {p.stderr}")
        four = os.path.join(work, "moe4.json")
        conf.update(n_layer=4, moe_layer_frequency=2)
        with open(four, "w") as f:
            json.dump(conf, f)
        base = None
        for extra in ([], ["--ranks", "2", "--mesh", "pipe=2", "--micro-batch", "2", "--schedule", "interleaved",
                           "--virtual-stages", "2"],
                      ["--ranks", "6", "--mesh", "pipe=3,expert=2", "--micro-batch", "2"],
                      ["--ranks", "8", "--mesh", "tensor=2,pipe=2,expert=2", "--micro-batch", "2"]):
            log = os.path.join(work, "pipe4.jsonl")
            p = run(args[:2] + [four] + args[3:] + extra + ["--log", log])
            got = log_rows(log) if p.returncode == 0 else []
            if base is None:
                base = got
                expect(got and max(r["dropped_tokens"] for r in got) > 0, f"moe 4 blocks: nothing dropped {p.stderr}")
                continue
            same = routed_alike(got, base)
            expect(same, f"moe 4 blocks {extra} differs from one rank: {[r['loss'] for r in got]} vs "
                         f"{[r['loss'] for r in base]} {p.stderr}")
        # a checkpoint saved on pipe=2,expert=2 (each stage's experts gathered whole) resumes on one rank
        ck = os.path.join(work, "ck_pipe")
        p = run(args[:2] + [four] + args[3:] + ["--ranks", "4", "--mesh", "pipe=2,expert=2", "--micro-batch", "2",
                                                "--save", ck, "--save-every", "5"])
        log = os.path.join(work, "resumed_pipe.jsonl")
        p = run(args[:2] + [four] + args[3:] + ["--resume", os.path.join(ck, "step_5"), "--log", log])
        got = log_rows(log) if p.returncode == 0 else []
        expect(len(got) == 5 and all(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) for a, b in zip(got, base[5:])),
               f"moe saved on pipe=2,expert=2, resumed on one rank: {[r['loss'] for r in got]} vs "
               f"{[r['loss'] for r in base[5:]]} {p.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def moe():
    """configs/gpt-moe-tiny.json trains on one rank, on data=2 (plain, ZeRO-1, ZeRO-3) and with its experts
    split over `expert` (expert=2, expert=4, data=2,expert=2 with ZeRO 0/1/3; 6 experts with random
    routing on expert=4) with the same losses at each of 10 steps (1e-5 relative), tokens dropped for
    capacity; a checkpoint saved on expert=4 holds each expert as a tensor of its own (h.N.mlp.experts.J....),
    resumes on expert=2 and one rank, exports per-expert tensors that --init and generate read, and
    --print-specs shows the stacks as P('expert', ...) of [E, ...]; its --log lines carry the router
    losses and expert load, a dense GPT's do not; each expert split over `tensor` (tensor=2,
    tensor=2,expert=2) gives the same losses, and a checkpoint saved on tensor=2,expert=2 resumes on one
    rank; sequence parallel is refused in one line (pipeline stages: moe_pipe)."""
    import shutil
    import tempfile
    work = tempfile.mkdtemp(prefix="shard-cli-moe-")
    try:
        data, cfg, args = moe_corpus(work)
        runs = {}
        for name, extra in (("one", []), ("data2", ["--ranks", "2", "--mesh", "data=2"]),
                            ("zero1", ["--ranks", "2", "--mesh", "data=2", "--zero", "1"]),
                            ("zero3", ["--ranks", "2", "--mesh", "data=2", "--zero", "3"])):
            log = os.path.join(work, name + ".jsonl")
            p = run(args + extra + ["--log", log])
            expect(p.returncode == 0 and "expert load over the run" in p.stdout, f"moe {name}: {p.stdout} {p.stderr}")
            runs[name] = log_rows(log) if os.path.exists(log) else []
        one = runs["one"]
        expect(len(one) == 10 and {"aux_loss", "z_loss", "dropped_tokens", "expert_load"} <= set(one[0]),
               f"moe log rows: {one[:1]}")
        expect(one and max(r["dropped_tokens"] for r in one) > 0, "moe: no token was dropped")
        expect(one and len(one[0]["expert_load"]) == 2 and len(one[0]["expert_load"][0]) == 4,
               f"moe expert_load: {one[:1]}")
        for name in ("data2", "zero1", "zero3"):
            got = runs[name]
            same = routed_alike(got, one, aux=True)
            expect(same, f"moe {name} differs from one rank: {[r['loss'] for r in got]} vs {[r['loss'] for r in one]}")
        # expert parallel: the experts split over `expert` (uneven: 6 experts on 4 ranks, with random routing),
        # composed with data and ZeRO, route, drop and score as one rank does
        six = os.path.join(work, "moe6.json")
        with open(cfg) as f:
            conf = json.load(f)
        conf.update(num_local_experts=6, router_random_routing=True, router_jitter_noise=0.01)
        with open(six, "w") as f:
            json.dump(conf, f)
        for config, meshes in ((cfg, (["--ranks", "2", "--mesh", "expert=2"], ["--ranks", "4", "--mesh", "expert=4"],
                                      ["--ranks", "4", "--mesh", "data=2,expert=2"],
                                      ["--ranks", "4", "--mesh", "data=2,expert=2", "--zero", "1"],
                                      ["--ranks", "4", "--mesh", "data=2,expert=2", "--zero", "3"],
                                      ["--ranks", "8", "--mesh", "data=2,expert=4", "--zero", "3"])),
                               (six, ([], ["--ranks", "4", "--mesh", "expert=4"],
                                      ["--ranks", "4", "--mesh", "data=2,expert=2", "--zero", "3"]))):
            base = None
            for extra in meshes:
                log = os.path.join(work, "ep.jsonl")
                p = run(args[:2] + [config] + args[3:] + extra + ["--log", log])
                got = log_rows(log) if p.returncode == 0 else []
                ref = one if config == cfg else base
                if ref is None:
                    base = got
                    expect(got and max(r["dropped_tokens"] for r in got) > 0, f"moe 6 experts: nothing dropped {p.stderr}")
                    continue
                same = routed_alike(got, ref)
                expect(same, f"moe {os.path.basename(config)} {extra} differs from one rank: "
                             f"{[r['loss'] for r in got]} vs {[r['loss'] for r in ref]} {p.stderr}")
        # a checkpoint saved on expert=4 (the stacks gathered whole, [E, ...]) resumes on expert=2 and on one rank
        ck = os.path.join(work, "ck")
        p = run(args + ["--ranks", "4", "--mesh", "expert=4", "--save", ck, "--save-every", "5", "--print-specs"])
        # --print-specs: an expert stack is split over `expert`, shown at its whole [E, ...] shape
        specs = [l.split() for l in p.stdout.splitlines() if l.strip().startswith("h.0.mlp.experts.c_fc.weight")]
        expect(specs and " ".join(specs[0][1:4]) == "[4, 64, 256]" and "P('expert', None, None) of [4, 64, 256]"
               in " ".join(specs[0]), f"moe --print-specs: {specs} {p.stderr}")
        # the checkpoint holds each expert as a tensor of its own, by its global index, the optimizer's state too
        p = run(["inspect", "ckpt", os.path.join(ck, "step_5")])
        names = {l.split()[1] for l in p.stdout.splitlines() if l.strip().startswith("tensor ")}
        want = {"h.0.mlp.experts.3.c_fc.weight", "h.1.mlp.experts.0.c_proj.bias", "h.0.mlp.gate.weight",
                "optimizer.exp_avg.h.0.mlp.experts.3.c_fc.weight"}
        expect(p.returncode == 0 and want <= names and not any(".experts.c_" in n for n in names),
               f"moe checkpoint tensors: {sorted(n for n in names if 'mlp' in n)} {p.stderr}")
        # exported weights: per-expert tensors, which --init reads onto expert=2 as onto one rank, and generate
        exported = os.path.join(work, "moe.safetensors")
        p = run(["ckpt", "export", os.path.join(ck, "step_5"), "--out", exported])
        header = {}
        if p.returncode == 0:
            with open(exported, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        expect(header.get("h.0.mlp.experts.3.c_fc.weight", {}).get("shape") == [64, 256] and
               "h.0.mlp.experts.c_fc.weight" not in header, f"moe export: {sorted(header)[:8]} {p.stderr}")
        firsts = []
        for extra in (["--ranks", "2", "--mesh", "expert=2"], []):
            p = run(args[:-4] + ["--steps", "1", "--init", exported] + extra)
            firsts.append(p.stdout.split("loss ")[-1].split()[0] if p.returncode == 0 else p.stderr)
        expect(len(set(firsts)) == 1 and "->" not in firsts[0], f"moe --init from the export: {firsts}")
        for source in (["--ckpt", os.path.join(ck, "step_5")], ["--init", exported, "--config", cfg]):
            p = subprocess.run([SHARD, "generate"] + source + ["--prompt", "the", "--tokens", "4"], capture_output=True,
                               timeout=60, env=ENV)  # sampled bytes: not always text
            expect(p.returncode == 0 and p.stdout.startswith(b"the"), f"moe generate {source[0]}: {p.stderr}")
        for extra in (["--ranks", "2", "--mesh", "expert=2"], []):
            log = os.path.join(work, "resumed.jsonl")
            if os.path.exists(log):
                os.remove(log)
            p = run(args + extra + ["--resume", os.path.join(ck, "step_5"), "--log", log])
            got = log_rows(log) if p.returncode == 0 else []
            expect(len(got) == 5 and all(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) for a, b in zip(got, one[5:])),
                   f"moe saved on expert=4, resumed {extra}: {[r['loss'] for r in got]} vs {[r['loss'] for r in one[5:]]} "
                   f"{p.stderr}")
        dense = os.path.join(work, "dense.json")
        with open(dense, "w") as f:
            json.dump({"n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64, "vocab_size": 256}, f)
        log = os.path.join(work, "dense.jsonl")
        p = run(["train", "--config", dense, "--data", data, "--batch", "2", "--seq", "16", "--steps", "2",
                 "--log", log])
        rows = log_rows(log) if os.path.exists(log) else []
        expect(p.returncode == 0 and rows and "aux_loss" not in rows[0] and "expert load" not in p.stdout,
               f"dense log: {rows[:1]} {p.stdout}")
        # expert tensor parallel: each expert's c_fc / c_proj split over `tensor`, alone and with `expert`
        for extra in (["--ranks", "2", "--mesh", "tensor=2"], ["--ranks", "4", "--mesh", "tensor=2,expert=2"]):
            log = os.path.join(work, "etp.jsonl")
            p = run(args + extra + ["--log", log])
            got = log_rows(log) if p.returncode == 0 else []
            same = routed_alike(got, one)
            expect(same, f"moe {extra} differs from one rank: {[r['loss'] for r in got]} vs "
                         f"{[r['loss'] for r in one]} {p.stderr}")
        # a checkpoint saved on tensor=2,expert=2 (the stacks gathered whole over both axes) resumes on one rank
        ck = os.path.join(work, "ck_etp")
        p = run(args + ["--ranks", "4", "--mesh", "tensor=2,expert=2", "--save", ck, "--save-every", "5"])
        log = os.path.join(work, "resumed_etp.jsonl")
        p = run(args + ["--resume", os.path.join(ck, "step_5"), "--log", log])
        got = log_rows(log) if p.returncode == 0 else []
        expect(len(got) == 5 and all(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) for a, b in zip(got, one[5:])),
               f"moe saved on tensor=2,expert=2, resumed on one rank: {[r['loss'] for r in got]} vs "
               f"{[r['loss'] for r in one[5:]]} {p.stderr}")
        p = run(args + ["--ranks", "2", "--mesh", "tensor=2", "--sequence-parallel"])
        expect(p.returncode != 0 and "leave out --sequence-parallel" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
               f"moe tensor=2 --sequence-parallel: {p.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def monitor():
    """Every step of every rank is measured: --log's `ranks` list (compute_ms > 0, comm_ms over the mesh's
    axes of more than one rank, comm_bytes sent on each and all_to_all_bytes (within them: the expert axis's
    exchange, none elsewhere), wait_ms, optimizer_ms, peak_bytes by category of the end-of-run table's
    order of magnitude), the --monitor-every line (imbalance and bottleneck), and --trace on data=2 ZeRO-3,
    tensor=2, pipe=2 and an MoE on expert=2: valid Chrome trace JSON, one process per rank named by its
    coordinates, complete events of each kind (units, collectives with axis and bytes, ZeRO gathers,
    gradient buckets, tensor-parallel reductions, pipeline transfers)."""
    import re
    import shutil
    import tempfile
    work = tempfile.mkdtemp(prefix="shard-cli-monitor-")
    try:
        data = tiny_corpus(work, "the cat sat on the mat. the dog sat on the log.\n", 400)
        cfg = os.path.join(work, "gpt.json")
        with open(cfg, "w") as f:
            json.dump({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 256}, f)
        moe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "gpt-moe-tiny.json")
        cats = {"compute", "unit", "optimizer", "comm", "zero_gather", "grad_bucket", "tp", "pipe", "wait"}
        layouts = (("data=2", ["--zero", "3"], cfg, {"data"}, {"unit", "zero_gather", "grad_bucket", "optimizer"}),
                   ("tensor=2", [], cfg, {"tensor"}, {"unit", "tp"}),
                   ("pipe=2", ["--micro-batches", "2", "--schedule", "1f1b"], cfg, {"pipe"}, {"unit", "pipe", "wait"}),
                   ("expert=2", [], moe, {"expert"}, {"unit", "comm"}))
        for mesh, extra, conf, axes, kinds in layouts:
            log, trace = os.path.join(work, "log.jsonl"), os.path.join(work, "trace.json")
            p = run(["train", "--config", conf, "--data", data, "--batch", "8", "--seq", "32", "--steps", "4",
                     "--ranks", "2", "--mesh", mesh, "--log", log, "--trace", trace, "--monitor-every", "2"] + extra)
            expect(p.returncode == 0, f"monitor {mesh}: {p.stdout} {p.stderr}")
            if p.returncode != 0:
                continue
            rows = log_rows(log)
            ranks = rows[-1].get("ranks", [])
            keys = {"rank", "compute_ms", "comm_ms", "comm_bytes", "all_to_all_bytes", "wait_ms", "optimizer_ms",
                    "peak_bytes"}
            expect(len(rows) == 4 and all(len(r["ranks"]) == 2 for r in rows) and [r["rank"] for r in ranks] == [0, 1]
                   and all(set(r) == keys and r["compute_ms"] > 0 and r["wait_ms"] >= 0 and r["optimizer_ms"] >= 0
                           and axes <= {a for k in r["comm_ms"] for a in k.split(",")}
                           and all(v >= 0 for v in r["comm_ms"].values())
                           and set(r["comm_bytes"]) == set(r["comm_ms"]) == set(r["all_to_all_bytes"])
                           and sum(r["comm_bytes"].values()) > 0
                           and all(0 <= r["all_to_all_bytes"][k] <= v for k, v in r["comm_bytes"].items())
                           and (r["all_to_all_bytes"].get("expert", 0) > 0) == (axes == {"expert"})
                           and set(r["peak_bytes"]) == {"params", "grads", "optimizer", "activations", "comm", "other"}
                           for r in ranks), f"monitor {mesh}: ranks {ranks}")
            # the step's peaks against the end-of-run table (MiB per category, the run's peaks): same magnitude
            table = {}
            for line in p.stdout.splitlines():
                m = re.match(r"\s+rank (\d+)\s+\S+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
                if m:
                    table[int(m.group(1))] = [float(x) * 1048576 for x in m.groups()[1:]]
            for r in ranks:
                got = [r["peak_bytes"][c] for c in ("params", "grads", "optimizer", "activations")]
                want = table.get(r["rank"], [])
                expect(len(want) == 4 and all(w / 10 <= g <= w * 1.01 + 4096 for g, w in zip(got, want) if w > 0),
                       f"monitor {mesh}: rank {r['rank']} peaks {got} vs the table's {want}")
            lines = [l for l in p.stdout.splitlines() if "bottleneck" in l]
            expect(len(lines) == 2 and all(re.fullmatch(r"  imbalance \d+\.\d\d; bottleneck: rank [01] \(%s=[01]\), "
                                                        r"compute \d+\.\d ms; others wait \d+\.\d ms on it"
                                                        % mesh.split("=")[0], l) for l in lines),
                   f"monitor {mesh}: --monitor-every 2 lines {lines}")
            events = json.load(open(trace))["traceEvents"]
            spans = [e for e in events if e.get("ph") == "X"]
            procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
            axis = mesh.split("=")[0]
            expect(procs == {0: f"rank 0 ({axis}=0)", 1: f"rank 1 ({axis}=1)"}
                   and all({"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(e) and e["dur"] >= 0
                           and e["cat"] in cats for e in spans)
                   and all(kinds <= {e["cat"] for e in spans if e["pid"] == r} for r in (0, 1))
                   and any(e["cat"] not in ("compute", "unit", "optimizer", "wait") and e["args"].get("axis") == axis
                           and e["args"].get("bytes", 0) > 0 for e in spans),
                   f"monitor {mesh}: trace {procs} {sorted({(e['pid'], e['cat']) for e in spans})}")
        # a run without --log or --trace: no ranks gathered, the monitor line every ~5 % with the progress line
        p = run(["train", "--config", cfg, "--data", data, "--batch", "4", "--seq", "32", "--steps", "3",
                 "--ranks", "2"])
        expect(p.returncode == 0 and len([l for l in p.stdout.splitlines() if "bottleneck: rank" in l]) == 3,
               f"monitor default: {p.stdout} {p.stderr}")
        p = run(["train", "--config", cfg, "--data", data, "--steps", "3", "--monitor-every", "0"])
        expect(p.returncode == 2 and "--monitor-every" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
               f"--monitor-every 0: {p.stderr!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def analyze_moe():
    """`analyze` on the tiny MoE GPT reports per rank the expert bytes (the all_to_allv bytes on `expert`)
    and expert activation rows of the balanced routing and their bound (every expert filled to capacity);
    after `train --log` of the same layout (expert=2 and data=2,expert=2 with capacity factor 1.25,
    expert=2 with none), `analyze --measured LOG` puts each rank's median measured expert bytes beside the
    bound: measured > 0, measured <= bound, ratio = measured / bound, in --json and in the table.  A file
    that is not a train log, or one of another layout, is refused in one line naming the file and line."""
    import shutil
    import tempfile
    work = tempfile.mkdtemp(prefix="shard-cli-analyze-moe-")
    try:
        data, cfg, _ = moe_corpus(work)
        uncapped = os.path.join(work, "uncapped.json")
        with open(cfg) as f:
            conf = json.load(f)
        conf.update(expert_capacity_factor=0)
        with open(uncapped, "w") as f:
            json.dump(conf, f)
        shape = ["--batch", "8", "--seq", "64"]
        for config, mesh, ranks in ((cfg, "expert=2", 2), (cfg, "data=2,expert=2", 4), (uncapped, "expert=2", 2)):
            log = os.path.join(work, "run.jsonl")
            p = run(["train", "--config", config, "--data", data, "--steps", "4", "--seed", "3", "--ranks", str(ranks),
                     "--mesh", mesh, "--log", log] + shape)
            expect(p.returncode == 0, f"analyze moe: train {mesh}: {p.stderr}")
            if p.returncode != 0:
                continue
            base = ["analyze", "--config", config, "--mesh", mesh] + shape
            p = run(base + ["--measured", log, "--json"])
            got = json.loads(p.stdout) if p.returncode == 0 else {}
            experts = [r.get("expert", {}) for r in got.get("ranks", [])]
            keys = {"balanced_bytes", "bound_bytes", "activation_bytes", "activation_bound_bytes", "measured_bytes",
                    "measured_ratio", "activation_measured_bytes"}
            expect(len(experts) == ranks and all(
                set(e) == keys and 0 < e["balanced_bytes"] <= e["bound_bytes"]
                and 0 < e["activation_bytes"] <= e["activation_bound_bytes"]
                and 0 < e["measured_bytes"] <= e["bound_bytes"]
                and abs(e["measured_ratio"] - e["measured_bytes"] / e["bound_bytes"]) <= 1e-9
                and 0 < e["activation_measured_bytes"] <= e["activation_bound_bytes"] for e in experts),
                f"analyze moe {os.path.basename(config)} {mesh} --measured: {p.returncode} {p.stderr} {experts}")
            p = run(base)
            plain = json.loads(run(base + ["--json"]).stdout or "{}")
            expect(p.returncode == 0 and "sent bound" in p.stdout and "measured" not in p.stdout
                   and all(r["expert"]["measured_bytes"] is None for r in plain.get("ranks", [])),
                   f"analyze moe {mesh} without --measured: {p.stdout} {p.stderr}")
            p = run(base + ["--measured", log])
            rows = [l.split() for l in p.stdout.splitlines() if l.strip().split()[:1] == ["0"]]
            expect(p.returncode == 0 and "measured/bound" in p.stdout and rows and 0 < float(rows[-1][-1]) <= 1,
                   f"analyze moe {mesh} --measured table: {p.stdout} {p.stderr}")
        # a file that is not a train log, and a log of another world: one line naming the file and line
        bad = os.path.join(work, "bad.jsonl")
        with open(bad, "w") as f:
            f.write("step 1 loss 2.5\n")
        p = run(["analyze", "--config", cfg, "--mesh", "expert=2", "--measured", bad] + shape)
        expect(p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1
               and f"{bad} line 1: not a JSON object" in p.stderr, f"analyze --measured not a log: {p.stderr!r}")
        p = run(["analyze", "--config", cfg, "--mesh", "expert=4", "--measured", os.path.join(work, "run.jsonl")] +
                shape)
        expect(p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and "line 1" in p.stderr
               and "4 ranks" in p.stderr, f"analyze --measured of another world: {p.stderr!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def reshard():
    """`train --reshard-at 10:MESH`: a run that moves to another layout after step 10 (stop-and-copy, over the
    communicator; or live: the state sent over steps 11-15 while training goes on, each step's gradients
    replayed on the copy, the switch after step 13) gives one rank's losses at each of 30 steps (1e-5
    relative), for data=4 -> data=2,pipe=2, data=2,tensor=2 -> pipe=4 and ZeRO-3 on data=4 -> ZeRO-1 on
    data=2,pipe=2, with one console line and one --log record of the move; resumed from a checkpoint past the
    move, the run starts on the new layout (one line says so) to the same losses; a move the new layout's
    memory does not allow (--reshard-at, or --adaptive's) leaves the run training on the old layout to the
    same losses, with one line saying why and a --log record with failed and that line; a cluster change
    taking effect is a cluster_change record."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="shard-cli-reshard-") as work:
        data = tiny_corpus(work, "a layout can change while the run goes on. ", 400)
        args = ["train", "--config", TINY, "--data", data, "--batch", "8", "--seq", "32", "--seed", "3", "--steps", "30"]
        log = os.path.join(work, "run.jsonl")

        def losses(extra):
            if os.path.exists(log):
                os.remove(log)
            p = run(args + ["--log", log] + extra, timeout=120)
            return p, ([r["loss"] for r in log_rows(log)] if p.returncode == 0 else [])

        _, ref = losses(["--ranks", "1"])
        expect(len(ref) == 30, "train on one rank: no losses")
        moves = ((["--mesh", "data=4"], "data=2,pipe=2", ("0", "0")),
                 (["--mesh", "data=2,tensor=2"], "pipe=4", ("0", "0")),
                 (["--mesh", "data=4", "--zero", "3"], "data=2,pipe=2", ("3", "1")))
        for (before, after, zeros), how in [(m, h) for h in ("stop-and-copy", "live") for m in moves]:
            extra = before + ["--reshard-at", f"10:{after}", "--migration", how]
            if zeros[1] != zeros[0]:
                extra += ["--reshard-zero", zeros[1]]
            ckpt = os.path.join(work, "ckpt")
            saving = how == "stop-and-copy" and zeros[1] != zeros[0]
            p, got = losses(extra + (["--save", ckpt, "--save-every", "20"] if saving else []))
            worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1) if len(got) == 30 else 1
            expect(worst <= 1e-5, f"train {' '.join(extra)}: worst relative loss difference {worst} {p.stderr}")
            switch = 10 if how == "stop-and-copy" else 15
            said = (r"stop-and-copy: [0-9.]+ ms" if how == "stop-and-copy" else
                    r"live over steps 10-15: pause [0-9.]+ ms at most \([0-9.]+ ms added to steps in all\), [0-9.]+ ms")
            line = re.search(rf"\nreshard: step {switch}, {before[1]} -> {after} zero={zeros[0]} -> {zeros[1]}, "
                             rf"{said}, [0-9.]+ MiB moved\n", p.stdout)
            events = [json.loads(l) for l in open(log)] if p.returncode == 0 else []
            events = [r for r in events if r.get("event") == "reshard"]
            expect(line and len(events) == 1 and events[0]["step"] == switch and events[0]["from"] == before[1] and
                   events[0]["to"] == after and events[0]["migration"] == how and
                   events[0]["trigger"] == "reshard-at" and events[0]["migration_ms"] > 0 and
                   events[0]["pause_ms"] > 0 and isinstance(events[0]["bytes"], int),
                   f"train {' '.join(extra)}: {p.stdout[-800:]} {events}")
            # the memory table after the move is the new mesh's
            expect(f"  rank 3  {after.replace('=2', '=1').replace('pipe=4', 'pipe=3')}" in p.stdout,
                   f"train {' '.join(extra)}: the memory table: {p.stdout[-600:]}")
            if saving:  # resumed past the move: on the new layout from its first step, the same losses
                p, got = losses(extra + ["--resume", os.path.join(ckpt, "step_20")])
                worst = max((abs(a - b) / a for a, b in zip(ref[20:], got)), default=1) if len(got) == 10 else 1
                said = (f"\ntrain: --reshard-at 10:{after}: the checkpoint is at step 20, past the move: the run "
                        f"resumes on {after} zero={zeros[1]}\n")
                events = [json.loads(l) for l in open(log)] if p.returncode == 0 else []
                expect(worst <= 1e-5 and said in p.stdout and f"  mesh {after} " in p.stdout and
                       "  rank 3  data=1,pipe=1 " in p.stdout and "\nreshard: " not in p.stdout and
                       not p.stderr.strip() and not [e for e in events if e.get("event") == "reshard"],
                       f"train {' '.join(extra)} --resume past the move: {worst} {p.stdout[-900:]} {p.stderr}")
        # --live-steps spreads the live move over more steps: the switch later, the losses the same
        p, got = losses(["--mesh", "data=2,tensor=2", "--reshard-at", "10:pipe=4", "--migration", "live",
                         "--live-steps", "8"])
        worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1) if len(got) == 30 else 1
        expect(worst <= 1e-5 and "\nreshard: step 18, data=2,tensor=2 -> pipe=4 zero=0 -> 0, live over steps 10-18: "
               in p.stdout, f"train --live-steps 8: {worst} {p.stdout[-600:]} {p.stderr}")
        # the new trainer does not fit beside the old one in the emulated device's memory: refused, the run
        # goes on as it was, one line saying why and a --log record of it; the node slowing a little at step
        # 28 is a cluster_change record
        cluster = cluster_file(os.path.join(work, "small.json"),
                               [{"name": "box", "devices": 4, "compute_tflops": 0.0015, "available_memory_gb": 0.018,
                                 "changes": [{"at_step": 28, "slowdown": 1.25}]}], 1000, 1)
        for how in ("stop-and-copy", "live"):
            p, got = losses(["--mesh", "data=4", "--cluster", cluster, "--reshard-at", "10:data=2,pipe=2",
                             "--migration", how])
            worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1) if len(got) == 30 else 1
            lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("cluster: ")]
            expect(p.returncode == 0 and worst <= 1e-5 and len(lines) == 1 and
                   lines[0].startswith("shard: reshard: step 10: ") and "out of device memory" in lines[0] and
                   lines[0].endswith("; the run goes on as data=4 zero=0") and "\nreshard: " not in p.stdout and
                   "  rank 3  data=3 " in p.stdout,
                   f"a move refused for memory ({how}): {worst} {p.stderr!r} {p.stdout[-500:]}")
            events = [json.loads(l) for l in open(log)] if p.returncode == 0 else []
            failed = [e for e in events if e.get("event") == "reshard"]
            expect(len(failed) == 1 and lines and failed[0] == {
                "event": "reshard", "step": 10, "failed": True, "reason": lines[0][len("shard: "):], "from": "data=4",
                "to": "data=2,pipe=2", "zero_from": 0, "zero_to": 0, "migration": how, "trigger": "reshard-at"},
                f"a move refused for memory ({how}): its --log record {failed}")
            changes = [e for e in events if e.get("event") == "cluster_change"]
            expect(changes == [{"event": "cluster_change", "step": 28, "node": "box", "slowdown": 1.25}] and
                   "cluster: step 28: node 'box' computes 1.25x slower" in p.stderr,
                   f"the cluster's change at step 28 ({how}): {changes} {p.stderr!r}")
        # --adaptive's move refused for memory alike: one line, one record with failed and the line
        two = cluster_file(os.path.join(work, "two.json"),
                           [{"name": "box", "devices": 3, "compute_tflops": 0.0015, "available_memory_gb": 0.018},
                            {"name": "odd", "devices": 1, "compute_tflops": 0.0015, "available_memory_gb": 0.018,
                             "changes": [{"at_step": 2, "slowdown": 3}]}], 1000, 1)
        p, got = losses(["--mesh", "data=4", "--cluster", two, "--adaptive", "--monitor-every", "2", "--steps", "5"])
        lines = [l for l in p.stderr.splitlines() if l.startswith("shard: ")]
        events = [json.loads(l) for l in open(log)] if p.returncode == 0 else []
        failed = [e for e in events if e.get("event") == "reshard"]
        expect(p.returncode == 0 and len(got) == 5 and len(lines) == 1 and
               lines[0].startswith("shard: reshard: step 4: ") and "out of device memory" in lines[0] and
               lines[0].endswith("; the run goes on as data=4 zero=0") and len(failed) == 1 and
               failed[0].get("failed") is True and failed[0].get("reason") == lines[0][len("shard: "):] and
               failed[0].get("step") == 4 and failed[0].get("from") == "data=4 zero=0" and
               isinstance(failed[0].get("to"), str) and failed[0].get("trigger") == "imbalance" and
               failed[0].get("migration") == "stop-and-copy" and "\nreshard: " not in p.stdout and
               [e for e in events if e.get("event") == "cluster_change"] ==
               [{"event": "cluster_change", "step": 2, "node": "odd", "slowdown": 3}],
               f"an --adaptive move refused for memory: {p.stderr!r} {failed} {p.stdout[-500:]}")


def adaptive():
    """`train --adaptive`: on 4 emulated devices of which one becomes 3x slower at step 6, the monitor's
    imbalance crosses its threshold at two checks in a row, the planner re-plans on the measured speeds and
    the run moves to the plan (uneven batch shares, or what the planner prefers): one console line and one
    --log record with trigger imbalance, and the same losses (1e-5 relative) as the run without --adaptive."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="shard-cli-adaptive-") as work:
        data = tiny_corpus(work, "the slow device takes fewer rows. ", 400)
        cluster = cluster_file(os.path.join(work, "slowing.json"),
                               [{"name": "steady", "devices": 3, "compute_tflops": 0.004, "available_memory_gb": 2},
                                {"name": "flaky", "devices": 1, "compute_tflops": 0.004, "available_memory_gb": 2,
                                 "changes": [{"at_step": 6, "slowdown": 3}]}], 20, 50)
        args = ["train", "--config", TINY, "--data", data, "--batch", "8", "--seq", "64", "--seed", "3", "--steps",
                "20", "--mesh", "data=4", "--cluster", cluster]
        log = os.path.join(work, "run.jsonl")

        def losses(extra):
            if os.path.exists(log):
                os.remove(log)
            p = run(args + ["--log", log] + extra, timeout=120)
            records = [json.loads(l) for l in open(log)] if p.returncode == 0 else []
            changes.append([r for r in records if r.get("event") == "cluster_change"])
            return (p, [r["loss"] for r in records if "event" not in r],
                    [r for r in records if r.get("event") == "reshard"])

        changes = []  # each run's cluster_change records

        _, ref, _ = losses([])
        expect(len(ref) == 20, "train on the slowing cluster: no losses")
        p, got, events = losses(["--adaptive", "--monitor-every", "3"])
        worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1) if len(got) == 20 else 1
        expect(worst <= 1e-5, f"train --adaptive: worst relative loss difference {worst} {p.stderr}")
        moves = [e for e in events if e["to"] is not None]
        expect(moves and moves[0]["trigger"] == "imbalance" and moves[0]["step"] > 6 and
               moves[0]["value"] > moves[0]["threshold"] == 0.25 and moves[0]["predicted_gain"] >= 0.1 and
               moves[0]["from"] == "data=4 zero=0" and moves[0]["to"] != moves[0]["from"] and
               moves[0]["migration"] == "stop-and-copy" and moves[0]["migration_ms"] > 0 and
               isinstance(moves[0]["bytes"], int) and
               all(e["trigger"] in ("imbalance", "memory", "comm") for e in events),
               f"train --adaptive: the reshard records {events} {p.stdout[-800:]}")
        # every run saw the slowdown take effect: one cluster_change record each
        expect(changes == [[{"event": "cluster_change", "step": 6, "node": "flaky", "slowdown": 3}]] * 2,
               f"train on the slowing cluster: the cluster_change records {changes}")
        # plans within 2 % of the fastest are a tie, and the closest to the current layout is taken: the same
        # ZeRO stage (the fastest is often ZeRO-3, which only moves the optimizer's partition for nothing)
        tie = moves[0].get("tie_break") if moves else None
        expect(tie in (True, False) and (moves[0]["fastest"] is None) == (not tie) and
               (not tie or (" zero=0" in moves[0]["to"] and moves[0]["fastest"] != moves[0]["to"])),
               f"train --adaptive: the tie-break: {moves}")
        line = re.search(r"\nreshard: step [0-9]+, data=4 zero=0 -> .* \(imbalance [0-9.]+ over 0.25 at two checks; "
                         r"predicted [0-9]+ % faster(; the closest to the current layout of [0-9]+ plans within 2 % of "
                         r"the fastest, [^)]*)?\), stop-and-copy: [0-9.]+ ms, [0-9.]+ MiB moved\n", p.stdout)
        expect(line and bool(line.group(1)) == bool(tie), f"train --adaptive: the console line: {p.stdout[-800:]}")
        # the step time by phase: before the slowdown, after it, after the move (slower, then faster again)
        phases = re.search(r"\ntrain: step time by phase \(median ms\): steps 1-5 ([0-9.]+) \| steps 6-[0-9]+ ([0-9.]+) "
                           r"\(node '[a-z]+' 3x slower\) \| steps [0-9]+-20 ([0-9.]+) \(after a move\)\n", p.stdout)
        expect(phases and float(phases.group(2)) > float(phases.group(1)) and
               float(phases.group(3)) < float(phases.group(2)), f"train --adaptive: the phases line: {p.stdout[-600:]}")
        # the same move, live: the state sent over three steps while training goes on, the same losses
        p, got, events = losses(["--adaptive", "--monitor-every", "3", "--migration", "live"])
        worst = max((abs(a - b) / a for a, b in zip(ref, got)), default=1) if len(got) == 20 else 1
        moves = [e for e in events if e["to"] is not None]
        line = re.search(r"\nreshard: step [0-9]+, data=4 zero=0 -> .* \(imbalance [0-9.]+ over 0.25 at two checks; "
                         r"predicted [0-9]+ % faster(; [^)]*)?\), live over steps [0-9]+-[0-9]+: pause [0-9.]+ ms at most \([0-9.]+ ms "
                         r"added to steps in all\), [0-9.]+ ms, [0-9.]+ MiB moved\n", p.stdout)
        expect(worst <= 1e-5 and line and moves and moves[0]["migration"] == "live" and moves[0]["pause_ms"] > 0,
               f"train --adaptive --migration live: {worst} {events} {p.stdout[-800:]} {p.stderr}")


if __name__ == "__main__":
    {"errors": errors, "help": help_texts, "bench_json": bench_json, "bench_mpi": bench_mpi, "bench_redistribute": bench_redistribute,
     "ckpt": ckpt, "train": train, "train_mpi": train_mpi, "demo": demo, "inspect": inspect,
     "inspect_schedule": inspect_schedule, "moe": moe, "bench_moe": bench_moe, "analyze": analyze, "moe_pipe": moe_pipe, "batch_shares": batch_shares, "plan": plan, "plan_space": plan_space, "bench_plan": bench_plan, "bench_reshard": bench_reshard,
     "train_plan": train_plan, "reshard": reshard, "adaptive": adaptive,
     "cost": cost,
     "monitor": monitor, "analyze_moe": analyze_moe, "cluster_changes": cluster_changes}[sys.argv[2]]()
    sys.exit(1 if failures else 0)
