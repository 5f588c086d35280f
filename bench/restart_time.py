#!/usr/bin/env python3
"""How long a restartable job stands still after a rank dies (issue 20): perseusrun
--max-restarts against torchrun --max-restarts, on the same DDP script (with `import perseus`),
alternating, on this machine.

    python3 bench/restart_time.py [--ranks 2] [--pairs 5] [--json FILE]

Each run starts tests/blackbox/ddp_resume.py (a plain DDP script that checkpoints every epoch
and resumes from the checkpoint), waits for its first checkpoint, SIGKILLs rank 1, and measures
the wall-clock time from the kill to the first training step of the restarted round (rank 0
writes it). torchrun runs with its defaults (its agent looks at its workers every
--monitor-interval, 5 s by default in torch 1.13, 0.1 s in torch >= 2.4); a second torchrun row
with --monitor-interval 0.1 shows what that setting costs. The row perseusrun-in-place runs
tests/blackbox/elastic_train.py (Horovod's elastic API: hvd.elastic.run, TorchState, a commit
every step) in elastic mode (--host-discovery-script listing localhost with the ranks' slots):
rank 1 is SIGKILLed at step 4, the survivors join world 1 in their own processes with a new
process in the freed slot, and the time runs to the end of the first step of world 1. Prints the
medians and the spread.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "blackbox", "ddp_resume.py")
ELASTIC_SCRIPT = os.path.join(ROOT, "tests", "blackbox", "elastic_train.py")
PERSEUSRUN = os.path.join(ROOT, "build", "apps", "perseusrun", "perseusrun")


def command(kind, ranks, work):
    if kind == "perseusrun-in-place":
        discover = os.path.join(work, "discover.sh")
        with open(discover, "w") as f:
            f.write("#!/bin/sh\necho localhost:%d\n" % ranks)
        os.chmod(discover, 0o755)
        return [PERSEUSRUN, "-np", str(ranks), "--host-discovery-script", discover,
                sys.executable, ELASTIC_SCRIPT, "--steps", "20", "--step-seconds", "0.1",
                "--report", work]
    script = [SCRIPT, "--epochs", "4", "--epoch-seconds", "0.5",
              "--checkpoint", os.path.join(work, "ckpt.pt"), "--report", work]
    if kind == "perseusrun":
        return [PERSEUSRUN, "-np", str(ranks), "-H", "localhost:%d" % ranks,
                "--max-restarts", "1", sys.executable] + script
    extra = ["--monitor_interval", "0.1"] if kind == "torchrun-0.1" else []
    # --redirects/--tee 1: Debian's torch 1.13 launcher fails on Python 3.11 with its defaults.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(ranks), "--max_restarts", "1", "--redirects", "1", "--tee", "1"] + extra + script


def one_run(kind, ranks):
    work = tempfile.mkdtemp(prefix="restart-time-")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "lib", "framework_shims")] +
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PERSEUS_LIBRARY"] = os.path.join(ROOT, "build", "lib", "comm", "libperseus.so")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = "1"
    try:
        proc = subprocess.Popen(command(kind, ranks, work), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 120
        if kind == "perseusrun-in-place":
            return in_place(proc, work, deadline)
        while not os.path.exists(os.path.join(work, "epoch.1")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("%s ended or stalled before its first checkpoint: %s"
                                   % (kind, proc.stderr.read().decode()[-2000:]))
            time.sleep(0.01)
        with open(os.path.join(work, "pid.0.1")) as f:
            victim = int(f.read())
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        rc = proc.wait(timeout=180)
        if rc != 0:
            raise RuntimeError("%s exited %d: %s" % (kind, rc, proc.stderr.read().decode()[-2000:]))
        with open(os.path.join(work, "trained.1")) as f:
            return float(f.read()) - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def in_place(proc, work, deadline):
    """SIGKILLs rank 1 of elastic_train.py at step 4; seconds to world 1's first step."""
    while not os.path.exists(os.path.join(work, "step.0.4")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("ended or stalled before step 4: %s"
                               % proc.stderr.read().decode()[-2000:])
        time.sleep(0.01)
    victim = None
    for name in os.listdir(work):
        if name.startswith("events."):
            with open(os.path.join(work, name)) as f:
                if json.loads(f.readline())["rank"] == 1:
                    victim = int(name.split(".")[1])
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    rc = proc.wait(timeout=180)
    if rc != 0:
        raise RuntimeError("exited %d: %s" % (rc, proc.stderr.read().decode()[-2000:]))
    steps = [os.path.getmtime(os.path.join(work, n)) for n in os.listdir(work)
             if n.startswith("step.1.")]
    if not steps:
        raise RuntimeError("no step in world 1: %s" % proc.stderr.read().decode()[-2000:])
    return min(steps) - killed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--kinds", default="perseusrun,perseusrun-in-place,torchrun,torchrun-0.1")
    parser.add_argument("--json")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    times = {k: [] for k in kinds}
    for i in range(args.pairs):
        for kind in (kinds if i % 2 == 0 else list(reversed(kinds))):
            seconds = one_run(kind, args.ranks)
            times[kind].append(seconds)
            print("pair %d %-13s %.2f s from the kill to training again" % (i + 1, kind, seconds),
                  flush=True)
    print("\n| launcher | median (s) | min-max (s) | runs |\n|---|---|---|---|")
    for kind in kinds:
        t = times[kind]
        print("| %s | %.2f | %.2f-%.2f | %d |" % (kind, statistics.median(t), min(t), max(t),
                                                 len(t)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(times, f, indent=1)


if __name__ == "__main__":
    main()
