#!/usr/bin/env python3
"""test_reliability_messages.py — messages that say what is wrong, as a user of the shard CLI meets them.

usage: test_reliability_messages.py SHARD_BINARY sniff|long|invisible|ranks|once

sniff:     a file given as --init (where safetensors belong) that is not one says what it looks like:
           JSON text, a shard token file, an empty file, text, binary data; never a header length.
long:      a message naming a path of thousands of characters holds it whole, through the ranks too.
invisible: a byte-order mark, a no-break space or a control character in a flag, a config key or a path
           is printed as its code and name (U+FEFF (a byte-order mark)), never raw.
ranks:     thread ranks that cannot start name errno and the limits (under a small RLIMIT_NPROC); under
           an MPI launch, --ranks other than the launcher's says that mpirun's -np sets the ranks.
once:      a config or flag mistake is found before any rank starts: one line, no rank number, the same
           on every run; with the nearest valid word for a mistyped verb, option, mesh axis or config key.

Each check runs tiny configs for a step or none; every error is one 'shard: ...' line and a non-zero exit.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SHARD = os.path.abspath(sys.argv[1])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MLP = os.path.join(ROOT, "configs", "mlp-teacher.json")
SKIP = 77
failures = []
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))}  # a plain run, whatever launched ctest


def run(args, env=None, prefix=()):
    return subprocess.run(list(prefix) + [SHARD] + args, capture_output=True, text=True, timeout=60,
                          env=dict(ENV, **(env or {})), cwd=tempfile.gettempdir())


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def one_error(p, wants, what, absent=()):
    """p failed with exactly one stderr line holding every text of wants and none of absent."""
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    expect(p.returncode != 0, f"{what}: exit 0")
    expect(len(lines) == 1 and lines[0].startswith("shard: "), f"{what}: not one 'shard:' line: {p.stderr!r}")
    for w in wants:
        expect(w in p.stderr, f"{what}: stderr lacks {w!r}: {p.stderr!r}")
    for a in absent:
        expect(a not in p.stderr, f"{what}: stderr holds {a!r}: {p.stderr!r}")


def gpt_config(work, **extra):
    conf = {"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 16, "vocab_size": 256}
    conf.update(extra)
    path = os.path.join(work, "gpt.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(conf, f, ensure_ascii=False)
    return path


def sniff(work):
    tokens = os.path.join(work, "tok")
    text = os.path.join(work, "notes.txt")
    with open(text, "w") as f:
        f.write("weights are elsewhere\n")
    p = run(["data", "text", text, "--out", tokens])
    expect(p.returncode == 0, f"data text: {p.stderr!r}")
    empty, binary = os.path.join(work, "empty.safetensors"), os.path.join(work, "random.safetensors")
    open(empty, "wb").close()
    with open(binary, "wb") as f:
        f.write(bytes(range(200, 256)) * 4)
    cases = [(MLP, "it looks like JSON text"), (os.path.join(tokens, "train.tokens"), "it looks like a shard token file"),
             (empty, "an empty file"), (text, "it looks like text"), (binary, "it looks like binary data")]
    for path, want in cases:
        p = run(["train", "--config", MLP, "--init", path, "--steps", "1", "--ranks", "2"])
        one_error(p, [path + ": ", want, "not a safetensors file"], f"--init {os.path.basename(path)}",
                  absent=["header length 7", "rank "])
    p = run(["inspect", "ckpt", MLP])  # wherever a safetensors file is read
    one_error(p, ["not a safetensors file: it looks like JSON text"], "inspect ckpt of a JSON file")


def long(work):
    deep = os.path.join(work, *["d" * 200] * 15)  # about 3,000 characters, under PATH_MAX
    os.makedirs(deep)
    weights = os.path.join(deep, "w.safetensors")
    with open(weights, "w") as f:
        f.write("{}\n")
    p = run(["train", "--config", MLP, "--init", weights, "--steps", "1"])
    one_error(p, [weights + ": "], "a long --init path")
    # through the ranks: a failure on a thread rank, carried through the job's abort to the CLI
    missing = os.path.join(deep, "never", "checkpoint")
    p = run(["train", "--config", MLP, "--resume", missing, "--steps", "2", "--ranks", "2"])
    one_error(p, [missing], "a long --resume path from the ranks")


def invisible(work):
    p = run(["train", "--config", MLP, "--st\ufeffeps", "1"])
    one_error(p, ["'--st[U+FEFF (a byte-order mark)]eps'"], "a flag holding a byte-order mark", absent=["\ufeff"])
    conf = gpt_config(work, **{"n_embd\u00a0": 16})
    p = run(["train", "--config", conf, "--steps", "1"])
    one_error(p, ["key 'n_embd[U+00A0 (a no-break space)]' is unknown"], "a config key holding a no-break space",
              absent=["\u00a0"])
    conf = gpt_config(work, model_type="gpt2\t")
    p = run(["train", "--config", conf, "--steps", "1"])
    one_error(p, ["'gpt2[U+0009 (a tab)]'"], "a config value holding a tab", absent=["\t"])
    path = os.path.join(work, "config\u00a0.json")
    p = run(["train", "--config", path, "--steps", "1", "--ranks", "2"])
    one_error(p, ["config[U+00A0 (a no-break space)].json"], "a path holding a no-break space", absent=["\u00a0"])
    p = run(["train", "--config", MLP, "--log", os.path.join(work, "no\x01dir", "log.jsonl")])
    one_error(p, ["no[U+0001 (a control character)]dir"], "a path holding a control character", absent=["\x01"])


def ranks(work):
    # an MPI launch as its environment shows it; the check comes before any MPI call
    for rank, says in (("0", True), ("1", False)):
        p = run(["train", "--config", MLP, "--ranks", "3", "--steps", "1"],
                env={"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": rank})
        if says:
            one_error(p, ["--ranks 3", "mpirun's -np sets the ranks", "it started 2"], "--ranks 3 under mpirun -np 2")
        else:
            expect(p.returncode != 0 and not p.stderr.strip(), f"rank 1 of an MPI launch printed {p.stderr!r}")
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    if os.geteuid() != 0 or not prlimit or not setpriv:
        print("SKIP: thread limits: needs root, prlimit and setpriv (to run as nobody under RLIMIT_NPROC)")
        return SKIP
    # root is exempt from RLIMIT_NPROC: the run drops to nobody, who may run 24 threads and processes
    os.chmod(work, 0o755)
    p = run(["train", "--config", MLP, "--ranks", "64", "--batch", "64", "--steps", "1"],
            prefix=[prlimit, "--nproc=24", setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"])
    if "Operation not permitted" in p.stderr and "setpriv" in p.stderr:
        print("SKIP: thread limits: this kernel refuses to change the user")
        return SKIP
    one_error(p, ["cannot start the thread of rank", "of 64", "EAGAIN", "RLIMIT_NPROC) 24", "threads-max",
                  "give fewer --ranks"], "64 thread ranks under ulimit -u 24")
    return 0


def once(work):
    conf = gpt_config(work, n_embed=16)
    seen = set()
    for _ in range(3):  # a rank number would change from run to run
        p = run(["train", "--config", conf, "--ranks", "4", "--steps", "1"])
        one_error(p, ["key 'n_embed' is unknown", "did you mean 'n_embd'?"], "a mistyped config key on 4 ranks",
                  absent=["rank "])
        seen.add(p.stderr)
    expect(len(seen) == 1, f"the config mistake read differently from run to run: {seen}")
    p = run(["train", "--config", MLP, "--mesh", "dp=2", "--steps", "1"])
    one_error(p, ["axis 'dp' = 2", "did you mean 'data'?"], "--mesh dp=2", absent=["rank "])
    p = run(["train", "--config", MLP, "--mesh", "data=1,pipe=1", "--recompute", "--ranks", "1"])
    one_error(p, ["--recompute acts on a pipe axis"], "a pipeline flag without a pipe axis", absent=["rank "])
    p = run(["train", "--config", os.path.join(work, "absent.json"), "--ranks", "2", "--steps", "1"])
    one_error(p, ["absent.json: cannot read the config"], "a config that is not there", absent=["rank "])
    short = gpt_config(work, n_positions=16)
    p = run(["train", "--config", short, "--ranks", "2", "--seq", "32", "--steps", "1"])
    one_error(p, ["key 'n_positions' = 16 is shorter than --seq 32"], "a sequence past the positions", absent=["rank "])
    p = run(["train", "--config", MLP, "--ranks", "2", "--batch", "8", "--micro-batch", "3", "--accum", "1"])
    one_error(p, ["--batch 8 != --micro-batch 3 x --accum 1 x data 2 = 6"], "the batch arithmetic", absent=["rank "])
    p = run(["train", "--config", MLP, "--ranks", "2", "--mesh", "pipe=2", "--schedule", "interleaved",
             "--virtual-stages", "2", "--micro-batches", "3"])
    one_error(p, ["--micro-batches 3 is not a multiple of pipe = 2"], "the pipeline's schedule", absent=["rank "])
    p = run(["train", "--config", MLP, "--step", "1"])
    one_error(p, ["unknown option '--step'", "did you mean '--steps'?"], "--step")
    p = run(["trian"])
    one_error(p, ["unknown verb 'trian'", "did you mean 'train'?"], "shard trian")
    conf = gpt_config(work, model_type="mpl")
    p = run(["train", "--config", conf, "--ranks", "2"])
    one_error(p, ["model_type 'mpl'", "did you mean 'mlp'?"], "a mistyped model_type", absent=["rank "])


def main():
    part = sys.argv[2] if len(sys.argv) > 2 else ""
    parts = {"sniff": sniff, "long": long, "invisible": invisible, "ranks": ranks, "once": once}
    if part not in parts:
        print(f"usage: {sys.argv[0]} SHARD_BINARY {'|'.join(parts)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="shard-messages-") as work:
        code = parts[part](work)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    if code == SKIP:
        return SKIP
    print(f"messages {part}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
