#!/usr/bin/env python3
"""test_reliability_signals.py — one writer per checkpoint root, preemption and Ctrl-C, and runs killed at
random moments, through `shard train` as a batch system or a user drives it.

usage: test_reliability_signals.py SHARD_BINARY kill|lock|signals|signals_mpi

kill:        a tiny training (2 thread ranks, --save every 3 steps, --log) killed 10 times at random moments
             with SIGKILL, SIGTERM, SIGINT, two SIGINTs or SIGTERM then SIGKILL, each time resumed with the
             same command until it finishes: after every kill the root's `latest` verifies and the log is
             whole JSON lines holding each step once; the finished run's losses and checkpoint files equal
             an uninterrupted run's bit for bit.
lock:        a second run saving into a root in use is refused at once naming the holder's host and pid; a
             lock of a gone process or with an old heartbeat is taken over with a note; the holder's
             heartbeat advances; a holder whose lock was taken over stops without saving.
signals:     SIGTERM and SIGINT stop 2 thread ranks after one step, save a checkpoint there (said in one
             line), exit 143 / 130, leave no lock, and the run resumes from it; without --save nothing is
             saved; a second SIGINT ends the run at once, leaving `latest` as it was.
signals_mpi: SIGTERM sent to both processes of an `mpiexec -np 2` run: they stop after the same step and
             save it.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SHARD = os.path.abspath(sys.argv[1])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONFIG = os.path.join(ROOT, "configs", "mlp-teacher.json")
MPIEXEC = os.environ.get("SHARD_TEST_MPIEXEC", "mpiexec --oversubscribe").split()
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def train_args(save, log, steps, extra=()):
    args = [SHARD, "train", "--config", CONFIG, "--steps", str(steps), "--batch", "8", "--seed", "5"]
    if save:
        args += ["--save", save]
    if log:
        args += ["--log", log]
    return args + list(extra)


def start(args, env=None, mpi=0):
    cmd = (MPIEXEC + ["-np", str(mpi)] if mpi else []) + args
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or ENV)


def finish(p, timeout=60):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        expect(False, "the run did not end within %d s" % timeout)
    return p.returncode, out, err


def log_steps(path):
    """The steps of a --log (its final summary record left out), or a description of what is wrong with it."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text and not text.endswith("\n"):
        return "its last line has no newline"
    steps = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
            if "event" in record:
                continue
            steps.append(record["step"])
        except (ValueError, KeyError) as e:
            return "line %d is not a JSON record with a step (%s): %r" % (n, e, line[:80])
    return steps


def wait_for_steps(log, n, p, timeout=20):
    """Wait until the log holds n steps (the run is training), while p runs."""
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None:
        steps = log_steps(log)
        if isinstance(steps, list) and len(steps) >= n:
            return True
        time.sleep(0.02)
    return expect(False, "%s did not reach %d steps" % (log, n))


def latest_step(root):
    try:
        with open(os.path.join(root, "latest")) as f:
            return int(f.read().strip().split("_")[1])
    except (OSError, ValueError, IndexError):
        return None


def newest_step(root):
    """The step a resume through root loads: `latest`'s, or when a save was killed between moving its step
    directory into place and writing `latest`, the newest step directory's."""
    latest = latest_step(root)
    if latest is not None or not os.path.isdir(root):
        return latest
    steps = [int(n[5:]) for n in os.listdir(root) if re.fullmatch(r"step_\d+", n)]
    return max(steps) if steps else None


def verified(root):
    r = subprocess.run([SHARD, "inspect", "ckpt", root, "--verify"], capture_output=True, text=True, timeout=60)
    return r.returncode == 0, (r.stdout + r.stderr).strip().splitlines()[-1:]


def file_sums(root, step):
    with open(os.path.join(root, "step_%d" % step, "index.json")) as f:
        return {k: v["xxh3"] for k, v in json.load(f)["files"].items()}


def records(log):
    with open(log) as f:
        return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, f) if "event" not in r]


def check_after_stop(root, log, what):
    """After any end of a run: latest (when there is one) verifies, the log holds steps 1..k once each with k at
    least latest, and no lock is left unless the run was killed outright."""
    steps = log_steps(log)
    if not expect(isinstance(steps, list), "%s: the log: %s" % (what, steps)):
        return
    expect(steps == list(range(1, len(steps) + 1)), "%s: the log's steps are not 1..k once each: %s" % (what, steps))
    latest = newest_step(root)
    if latest is not None:
        ok, last = verified(root)  # through the root, as a resume reads it
        expect(ok, "%s: latest (step %s) does not verify: %s" % (what, latest, last))
        expect(len(steps) >= latest, "%s: latest is step %d but the log ends at %d" % (what, latest, len(steps)))


# ---------------------------------------------------------------- kill

STEPS = 48


def kill_test():
    seed = int(os.environ.get("SHARD_TEST_SEED", "0")) or random.randrange(1, 1 << 30)
    rng = random.Random(seed)
    print("kill: random moments from SHARD_TEST_SEED=%d" % seed, flush=True)
    extra = ["--ranks", "2", "--save-every", "3"]
    with tempfile.TemporaryDirectory(prefix="shard-kill-") as tmp:
        ref, ref_log = os.path.join(tmp, "ref"), os.path.join(tmp, "ref.jsonl")
        rc, _, err = finish(start(train_args(ref, ref_log, STEPS, extra)))
        if not expect(rc == 0, "the uninterrupted run failed: %s" % err.strip()):
            return
        ref_records, ref_sums = records(ref_log), file_sums(ref, STEPS)
        kinds = ["KILL", "TERM", "INT", "INT+INT", "TERM+KILL"]
        kills, runs, done_runs = 0, 0, 0
        root = log = None
        while kills < 10 or root:
            if root is None:
                root, log = os.path.join(tmp, "run%d" % runs), os.path.join(tmp, "run%d.jsonl" % runs)
                runs += 1
            # the same command each time: it resumes once the root has a checkpoint
            resume = ["--resume", root] if newest_step(root) is not None else []
            p, began = start(train_args(root, log, STEPS, extra + resume)), time.time()
            kind = None
            if kills < 10:
                # a random moment: at start-up, or just after a random step's log line (its save, when it has one,
                # under way)
                begin = newest_step(root) or 0
                target = rng.randrange(begin, STEPS)
                if target == begin:
                    time.sleep(rng.uniform(0, 0.1))
                else:
                    while p.poll() is None and len(log_steps(log) or []) < target:
                        time.sleep(0.001)
                    time.sleep(rng.uniform(0, 0.004))
                if p.poll() is None:
                    kind = kinds[rng.randrange(len(kinds))]
                    for k, sig in enumerate(kind.split("+")):
                        if k:
                            time.sleep(rng.uniform(0, 0.01))
                        try:
                            p.send_signal(getattr(signal, "SIG" + sig))
                        except ProcessLookupError:
                            pass
                    kills += 1
            rc, _, err = finish(p)
            what = "run %d after %s" % (runs - 1, kind or "no signal")
            print("  %s%s: exit %d after %.2f s, latest %s, %s logged" % (
                what, " (resumed)" if resume else "", rc, time.time() - began, latest_step(root), len(log_steps(log))),
                flush=True)
            check_after_stop(root, log, what)
            m = re.search(r"stopped by SIG\w+ after step (\d+); saved checkpoint step (\d+)", err)
            if m:
                expect(latest_step(root) == int(m.group(1)),
                       "%s: said '%s' but latest is %s" % (what, m.group(0), latest_step(root)))
            if rc == 0 or latest_step(root) == STEPS:  # finished, perhaps killed on its way out
                got = records(log)
                expect(got == ref_records, "%s: the losses differ from the uninterrupted run's" % what)
                expect(file_sums(root, STEPS) == ref_sums,
                       "%s: the final checkpoint's files differ from the uninterrupted run's" % what)
                expect(rc != 0 or not os.path.exists(os.path.join(root, "writer.lock")), "%s: the lock was left" % what)
                done_runs += 1
                root = None
            elif not expect(kind is not None and (rc < 0 or rc in (130, 143)),
                            "%s: exit %d: %s" % (what, rc, err.strip()[-1500:])):
                root = None
        print("kill: %d kills over %d runs, each finished bit for bit" % (kills, done_runs), flush=True)


# ---------------------------------------------------------------- lock

def write_lock(root, host, pid, heartbeat):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "writer.lock"), "w") as f:
        f.write('{"host": "%s", "pid": %d, "started": %.3f, "heartbeat": %.3f}\n' % (host, pid, heartbeat, heartbeat))


def gone_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def lock_test():
    host = socket.gethostname()
    with tempfile.TemporaryDirectory(prefix="shard-lock-") as tmp:
        root, log = os.path.join(tmp, "ck"), os.path.join(tmp, "a.jsonl")
        a = start(train_args(root, log, 10 ** 7, ["--save-every", str(10 ** 6)]))
        if wait_for_steps(log, 1, a):
            with open(os.path.join(root, "writer.lock")) as f:
                held = json.load(f)
            expect(held["host"] == host and held["pid"] == a.pid, "the lock names %s, not this host and pid %d"
                   % (held, a.pid))
            t0 = time.time()
            b_log = os.path.join(tmp, "b.jsonl")
            rc, _, err = finish(start(train_args(root, b_log, 3)))
            lines = err.strip().splitlines()
            expect(rc == 1 and len(lines) == 1 and "is in use by another run (host %s, pid %d" % (host, a.pid)
                   in lines[0], "a second run into the root: exit %d, %s" % (rc, lines))
            expect(time.time() - t0 < 10, "the second run took %.1f s to be refused" % (time.time() - t0))
            expect(not os.path.exists(b_log), "the refused run started its log")
        a.send_signal(signal.SIGTERM)
        rc, _, err = finish(a)
        expect(rc == 143, "SIGTERM to the lock's holder: exit %d: %s" % (rc, err.strip()))
        expect(not os.path.exists(os.path.join(root, "writer.lock")), "the holder left its lock")

        # stale locks: another host's with an old heartbeat, this host's of a process that is gone
        for holder, pid, age, reason in (("elsewhere", 4242, 3600, "its heartbeat is 3600 s old"),
                                         (host, gone_pid(), 0, "that process is gone")):
            root = os.path.join(tmp, "stale-%s" % reason.split()[0])
            write_lock(root, holder, pid, time.time() - age)
            rc, _, err = finish(start(train_args(root, None, 3)))
            note = "shard: note: --save %s: taking over the lock of host %s, pid %d (%s" % (root, holder, pid, reason)
            expect(rc == 0 and note in err, "a stale lock (%s): exit %d, %s" % (reason, rc, err.strip()))
            expect(latest_step(root) == 3, "after taking a stale lock over, no checkpoint of step 3")
            expect(not os.path.exists(os.path.join(root, "writer.lock")), "the lock taken over was left")

        # a fresh lock of another host is live
        root = os.path.join(tmp, "live")
        write_lock(root, "elsewhere", 4242, time.time())
        rc, _, err = finish(start(train_args(root, None, 3)))
        expect(rc == 1 and "is in use by another run (host elsewhere, pid 4242" in err,
               "another host's fresh lock: exit %d, %s" % (rc, err.strip()))
        expect(latest_step(root) is None, "a refused run saved")

        # the heartbeat advances; a holder stopped past the stale age loses the lock and stops without saving
        env = dict(ENV, SHARD_LOCK_STALE="1")
        root, log = os.path.join(tmp, "beat"), os.path.join(tmp, "beat.jsonl")
        a = start(train_args(root, log, 10 ** 7, ["--save-every", str(10 ** 7)]), env)
        if wait_for_steps(log, 1, a):
            time.sleep(0.6)
            with open(os.path.join(root, "writer.lock")) as f:
                held = json.load(f)
            expect(held["heartbeat"] - held["started"] >= 0.3, "the heartbeat did not advance: %s" % held)
            rc, _, err = finish(start(train_args(root, None, 3), env))
            expect(rc == 1 and "in use by another run" in err, "a live holder's root (stale age 1 s): exit %d, %s"
                   % (rc, err.strip()))
            a.send_signal(signal.SIGSTOP)
            time.sleep(1.5)
            b = start(train_args(root, os.path.join(tmp, "beat-b.jsonl"), 10 ** 7, ["--save-every", str(10 ** 7)]),
                      env)
            wait_for_steps(os.path.join(tmp, "beat-b.jsonl"), 1, b)
            a.send_signal(signal.SIGCONT)
            rc, _, err = finish(a, 30)
            expect(rc == 1 and re.search(r"the lock of --save \S+ was taken over by host %s, pid %d .*stopped after "
                                         r"step \d+ without saving" % (re.escape(host), b.pid), err),
                   "the holder whose lock was taken over: exit %d, %s" % (rc, err.strip()))
            expect(latest_step(root) is None, "the holder that lost its lock saved")
            b.send_signal(signal.SIGTERM)
            rc, _, err = finish(b)
            expect(rc == 143 and latest_step(root) is not None, "the new holder: exit %d, %s" % (rc, err.strip()))
            expect(not os.path.exists(os.path.join(root, "writer.lock")), "a lock was left")
        else:
            a.kill()
            finish(a)


# ---------------------------------------------------------------- signals

def stop_and_check(tmp, name, sig, code, ranks=2, save=True, mpi=0, while_running=None):
    root = os.path.join(tmp, name) if save else None
    log = os.path.join(tmp, name + ".jsonl")
    extra = (["--save-every", str(10 ** 6)] if save else []) + ([] if mpi else ["--ranks", str(ranks)])
    p = start(train_args(root, log, 10 ** 7, extra), mpi=mpi)
    if not wait_for_steps(log, 5, p):
        p.kill()
        finish(p)
        return None
    if while_running:
        while_running(p, root)
    if mpi:  # as a batch system does: every process of the job gets the signal
        for pid in rank_pids(p.pid):
            os.kill(pid, sig)
    else:
        p.send_signal(sig)
    rc, _, err = finish(p)
    what = "%s (%s)" % (name, signal.Signals(sig).name)
    lines = err.strip().splitlines()
    pattern = (r"shard: stopped by %s after step (\d+); saved checkpoint step \1 in %s$" % (signal.Signals(sig).name,
                                                                                           re.escape(root))
               if save else r"shard: stopped by %s after step (\d+); nothing saved \(no --save\)$"
               % signal.Signals(sig).name)
    said = [m for m in (re.match(pattern, line) for line in lines) if m]
    m = said[0] if len(said) == 1 else None
    expect((rc == code or (mpi and rc != 0)) and m, "%s: exit %d (want %d), stderr %s" % (what, rc, code, lines))
    if not m:
        return None
    step = int(m.group(1))
    steps = log_steps(log)
    expect(steps == list(range(1, step + 1)), "%s: the log holds steps %s, not 1..%d" % (what, steps, step))
    if save:
        expect(latest_step(root) == step, "%s: latest is %s, not step %d" % (what, latest_step(root), step))
        ok, last = verified(root)
        expect(ok, "%s: the checkpoint does not verify: %s" % (what, last))
        expect(not os.path.exists(os.path.join(root, "writer.lock")), "%s: the lock was left" % what)
    return root, log, step


def rank_pids(launcher):
    """The shard processes started under the launcher's pid (children, or grandchildren through a proxy)."""
    found, frontier = [], [launcher]
    for _ in range(4):
        nxt = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    exe = f.read().split(b"\0")[0].decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if ppid in frontier:
                (found if os.path.basename(exe) == "shard" else nxt).append(int(pid))
        frontier = nxt
    return found


def wait_stopped(pid, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return True
        time.sleep(0.005)
    return False


def signals_test():
    with tempfile.TemporaryDirectory(prefix="shard-signals-") as tmp:
        for name, sig, code in (("term", signal.SIGTERM, 143), ("int", signal.SIGINT, 130)):
            got = stop_and_check(tmp, name, sig, code)
            if got:  # the same command goes on from the checkpoint to the end
                root, log, step = got
                rc, _, err = finish(start(train_args(root, log, step + 4, ["--ranks", "2", "--resume", root])))
                expect(rc == 0 and log_steps(log) == list(range(1, step + 5)) and latest_step(root) == step + 4,
                       "%s: resuming from step %d: exit %d, log %s, %s" % (name, step, rc, log_steps(log), err))
        stop_and_check(tmp, "nosave", signal.SIGINT, 130, save=False)
        stop_and_check(tmp, "one-rank", signal.SIGTERM, 143, ranks=1)

        second_sigint(tmp)


def second_sigint(tmp):
    """A second SIGINT while the first one's checkpoint is being written ends the run at once: the process is
    held stopped once that save has begun (a larger model makes it last), so that the second signal cannot
    come before it or merge with the first."""
    config = os.path.join(tmp, "wide.json")
    with open(config, "w") as f:
        json.dump({"model_type": "mlp", "model_dim": 256, "hidden_dim": 4096}, f)
    root, log = os.path.join(tmp, "twice"), os.path.join(tmp, "twice.jsonl")
    args = [SHARD, "train", "--config", config, "--ranks", "2", "--save", root, "--log", log]
    rc, _, err = finish(start(args + ["--steps", "2"]))
    expect(rc == 0 and latest_step(root) == 2, "the first checkpoint: exit %d, %s" % (rc, err.strip()))
    for attempt in range(3):
        p = start(args + ["--steps", str(10 ** 7), "--resume", root])
        if not wait_for_steps(log, 4, p):
            p.kill()
            finish(p)
            return
        p.send_signal(signal.SIGINT)
        saving = False
        while p.poll() is None and not saving:
            saving = any(n.startswith("step_") and n.endswith(".tmp") for n in os.listdir(root))
        if saving:
            p.send_signal(signal.SIGSTOP)
            expect(wait_stopped(p.pid), "the run did not stop on SIGSTOP")
            p.send_signal(signal.SIGINT)
            p.send_signal(signal.SIGCONT)
        rc, _, err = finish(p)
        if not saving:  # the save ended before it was seen: try again
            print("second SIGINT: attempt %d missed the save (exit %d, %s)" % (attempt, rc, err.strip()[-200:]), flush=True)
            continue
        lines = err.strip().splitlines()
        expect(rc == 130 and lines[-1:] == ["shard: stopped at once by a second SIGINT; the checkpoints in %s are "
                                            "as the last finished save left them" % root],
               "two SIGINTs: exit %d, %s" % (rc, lines))
        expect(latest_step(root) == 2, "two SIGINTs: latest went from step 2 to %s" % latest_step(root))
        ok, last = verified(root)
        expect(ok, "two SIGINTs: the checkpoint does not verify: %s" % last)
        expect(not os.path.exists(os.path.join(root, "writer.lock")), "two SIGINTs: the lock was left")
        return
    expect(False, "two SIGINTs: the stop's save was never seen under way")


def signals_mpi_test():
    with tempfile.TemporaryDirectory(prefix="shard-signals-mpi-") as tmp:
        def second_run(p, root):  # rank 0's process holds the lock; a second job into the root is refused
            with open(os.path.join(root, "writer.lock")) as f:
                pid = json.load(f)["pid"]
            expect(pid in rank_pids(p.pid), "the lock names pid %d, not a rank of the job (%s)" % (pid, rank_pids(p.pid)))
            rc, _, err = finish(start(train_args(root, None, 3), mpi=2))
            expect(rc != 0 and "is in use by another run (host %s, pid %d" % (socket.gethostname(), pid) in err,
                   "a second job into the root: exit %d, %s" % (rc, err.strip()[-400:]))

        # Open MPI's launcher passes the ranks' exit code on; any other must at least fail
        stop_and_check(tmp, "mpi", signal.SIGTERM, 143, mpi=2, while_running=second_run)


def main():
    tests = {"kill": kill_test, "lock": lock_test, "signals": signals_test, "signals_mpi": signals_mpi_test}
    if len(sys.argv) != 3 or sys.argv[2] not in tests:
        print(__doc__)
        return 2
    t0 = time.time()
    tests[sys.argv[2]]()
    print("%s: %s in %.1f s" % (sys.argv[2], "FAILED" if failures else "ok", time.time() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
