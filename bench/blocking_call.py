#!/usr/bin/env python3
"""The cost of one blocking 4 KB all-reduce, split: libperseus's C API against the Python shim
(perseus.torch allreduce_), at N ranks on one host, with and without each rank pinned to a core.

    bench/blocking_call.py [--ranks 2] [--pairs 5] [--calls 20000] [--no-pin]

Each pair runs, one after the other and each as its own perseusrun job:
  c       build/bench/cpu_allreduce_perseus 4096:CALLS (float32 SUM, out of place, blocking
          perseus_allreduce calls; its us_per_call)
  python  bench/submission_path.py's one-call case: 1000 blocking hvd.allreduce_ of one
          1024-float tensor, median of 5 rounds (us per call)
and, unless --no-pin, the same two with every rank pinned by `taskset -c (local rank % CPUs)`
(the rank's submitting thread and its engine thread then share one core; unpinned, the
scheduler moves them). The difference between python and c is what the shim adds to a call;
c itself is the engine's cycle (the submission's hand-off, the ranks' exchange, the all-reduce,
the result's hand-off). Prints every run, then a Markdown table of medians (min-max).
Build first (ninja -C build); times on the 2-core development machine are comparable only
within one run of this script.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace",
                          timeout=300, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit("failed: %s\n%s\n%s" % (" ".join(cmd), proc.stdout[-2000:],
                                                  proc.stderr[-2000:]))
    return proc.stdout


def one(kind, pinned, args, pin_script, env):
    launcher = [os.path.join(ROOT, "build/apps/perseusrun/perseusrun"), "-np", str(args.ranks),
                "-H", "localhost:%d" % args.ranks] + ([pin_script] if pinned else [])
    if kind == "c":
        out = run(launcher + [os.path.join(ROOT, "build/bench/cpu_allreduce_perseus"),
                              "4096:%d" % args.calls], env)
        line = next(l for l in out.splitlines() if '"us_per_call"' in l)
        return json.loads(line[line.index("{"):])["us_per_call"]
    out = run(launcher + [sys.executable, os.path.join(ROOT, "bench/submission_path.py"),
                          "--worker", "small", "perseus"], env)
    return float(re.search(r"RESULT call_us ([\d.]+)", out).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "lib/framework_shims")] + [
                   p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cpus = os.cpu_count() or 1
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write('#!/bin/sh\nexec taskset -c $((OMPI_COMM_WORLD_LOCAL_RANK %% %d)) "$@"\n' % cpus)
        pin_script = f.name
    os.chmod(pin_script, 0o755)
    cases = [(kind, pinned) for pinned in ([False] if args.no_pin else [False, True])
             for kind in ("c", "python")]
    found = {case: [] for case in cases}
    try:
        for pair in range(args.pairs):
            for case in cases:
                value = one(case[0], case[1], args, pin_script, env)
                found[case].append(value)
                print("pair %d %-6s %-8s %.2f us" % (pair, case[0],
                                                     "pinned" if case[1] else "unpinned", value),
                      flush=True)
    finally:
        os.unlink(pin_script)
    print("\n| ranks | placement | C API blocking call (us) | Python allreduce_ (us) | "
          "Python - C (us) |")
    print("|---|---|---|---|---|")
    for pinned in sorted({p for _, p in cases}):
        c, py = found[("c", pinned)], found[("python", pinned)]
        cell = lambda v: "%.2f (%.2f-%.2f)" % (statistics.median(v), min(v), max(v))
        print("| %d | %s | %s | %s | %.2f |" % (args.ranks, "pinned" if pinned else "unpinned",
                                                cell(c), cell(py),
                                                statistics.median(py) - statistics.median(c)))


if __name__ == "__main__":
    main()
