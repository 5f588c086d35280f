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
with --monitor-interval 0.1 shows what that setting costs. Prints the medians and the spread.
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
PERSEUSRUN = os.path.join(ROOT, "build", "apps", "perseusrun", "perseusrun")


def command(kind, ranks, work):
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--kinds", default="perseusrun,torchrun,torchrun-0.1")
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
