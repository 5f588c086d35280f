#!/usr/bin/env python3
"""How long a job takes to end after one of its ranks fails, the way training jobs fail
(issue 15's fault table in bench/RESULTS.md): the last rank of 3 raises, calls sys.exit(3),
calls sys.exit(0) (leaves cleanly) or is SIGKILLed while the others are in collectives, or while every rank
floods a stdout that nobody reads (tests/shims/ranks/fails.py), under perseusrun, Open MPI's mpirun and torchrun.

Prints one table row per case: the median and the range, over --repeat runs, of the seconds
from the failure (the failing rank's own clock, just before it fails) to the launcher's exit,
the launcher's exit codes, and how many processes of the job were still there 3 s later.
The cases run interleaved (one round of every case, then the next), so that a slow moment of
the machine hits every case alike.

    bench/fault_times.py [--repeat 5] [--only SUBSTRING]
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERSEUSRUN = os.environ.get("PERSEUSRUN") or str(ROOT / "build/apps/perseusrun/perseusrun")
LIBPERSEUS = os.environ.get("LIBPERSEUS") or str(ROOT / "build/lib/comm/libperseus.so")
PYTHON = "/usr/bin/python3"
MXNET_PYTHON = str(ROOT / ".venv-mxnet/bin/python")
FAILS = str(ROOT / "tests/shims/ranks/fails.py")
MARKER = "FAULT_TIMES_MARKER"


def cases():
    pr = [PERSEUSRUN, "-np", "3", "-H", "localhost:3"]
    mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", "PYTHONPATH",
           "-x", "PERSEUS_LIBRARY", "-x", MARKER]
    tr = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
          "--redirects", "1", "--tee", "1"]
    found = [
        ("perseusrun, perseus.torch.horovod, raise", pr + [PYTHON, FAILS, "hvd", "raise"]),
        ("perseusrun, perseus.torch.horovod, sys.exit(3)", pr + [PYTHON, FAILS, "hvd", "exit3"]),
        ("perseusrun, perseus.torch.horovod, sys.exit(0)", pr + [PYTHON, FAILS, "hvd", "exit0"]),
        ("perseusrun, perseus.torch.horovod, SIGKILL", pr + [PYTHON, FAILS, "hvd", "kill"]),
        ("perseusrun, stdout into a pipe nobody reads, SIGKILL",
         pr + [PYTHON, FAILS, "flood", "kill"]),
        ("perseusrun -x PERSEUS_SHM=0, horovod, raise",
         pr + ["-x", "PERSEUS_SHM=0", PYTHON, FAILS, "hvd", "raise"]),
        ("perseusrun, DDP + import perseus, raise", pr + [PYTHON, FAILS, "ddp", "raise"]),
        ("perseusrun, DDP, PERSEUS_DDP=0 (torch's gloo), raise",
         pr + ["-x", "PERSEUS_DDP=0", PYTHON, FAILS, "ddp", "raise"]),
    ]
    if os.path.exists(MXNET_PYTHON):
        found.append(("perseusrun -x PERSEUS_SHM=0, perseus.mxnet, raise",
                      pr + ["-x", "PERSEUS_SHM=0", MXNET_PYTHON, FAILS, "mxnet", "raise"]))
    if shutil.which("mpirun"):
        found.append(("mpirun, perseus.torch.horovod, raise", mpi + [PYTHON, FAILS, "hvd",
                                                                      "raise"]))
    found.append(("torchrun, DDP + import perseus, raise", tr + [FAILS, "ddp", "raise"]))
    found.append(("torchrun, DDP, PERSEUS_DDP=0, raise", tr + [FAILS, "ddp", "raise"]))
    return found


def left_behind(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def run_once(name, cmd):
    with tempfile.TemporaryDirectory() as out:
        marker = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "OMPI_"))}
        env.update({MARKER: marker, "PYTHONPATH": str(ROOT / "lib/framework_shims"),
                    "PERSEUS_LIBRARY": LIBPERSEUS, "OMP_NUM_THREADS": "1"})
        if "PERSEUS_DDP=0" in name:
            env["PERSEUS_DDP"] = "0"
        # "nobody reads": a pipe this process never reads from (a stalled tee or pager).
        stdout = subprocess.PIPE if "nobody reads" in name else subprocess.DEVNULL
        p = subprocess.Popen(cmd + [out], stdin=subprocess.DEVNULL, stdout=stdout,
                             stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = "hung"
        ended = time.time()
        time.sleep(3)
        left = left_behind(marker)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        failed_at = Path(out) / "failed_at"
        took = ended - float(failed_at.read_text()) if failed_at.exists() else float("nan")
        return took, rc, len(left)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    chosen = [c for c in cases() if args.only in c[0]]
    results = {name: [] for name, _ in chosen}
    for _ in range(args.repeat):
        for name, cmd in chosen:
            results[name].append(run_once(name, cmd))
            print(".", end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    print("| case | median s | range s | exit codes | processes left |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        times = [t for t, _, _ in runs]
        codes = sorted({str(rc) for _, rc, _ in runs})
        print("| %s | %.2f | %.2f-%.2f | %s | %d |" % (
            name, statistics.median(times), min(times), max(times), ", ".join(codes),
            sum(n for _, _, n in runs)))


if __name__ == "__main__":
    main()
