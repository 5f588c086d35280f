#!/usr/bin/env python3
"""Wall time of starting and ending a job of `true`, perseusrun against mpirun, same run.

    bench/launch_time.py [--perseusrun build/apps/perseusrun/perseusrun] [--repeat 15]

For each N in 1, 8, 32 it runs `perseusrun -np N -H localhost:N true` and
`mpirun --oversubscribe -np N true` alternately, --repeat times each, and prints the medians
and their ratio as a Markdown table (ratio < 1: perseusrun is faster). Times on this machine
are CPU-machine times: compare ratios, not absolute values.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(command, env):
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perseusrun",
                        default=os.path.join(ROOT, "build/apps/perseusrun/perseusrun"))
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--sizes", default="1,8,32")
    args = parser.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("launch_time: mpirun not found (apt-get install openmpi-bin)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print("| N | perseusrun median (s) | mpirun median (s) | perseusrun / mpirun |")
    print("|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        ours = [args.perseusrun, "-np", str(n), "-H", f"localhost:{n}", "true"]
        theirs = [mpirun, "--oversubscribe", "-np", str(n), "true"]
        timed(ours, env), timed(theirs, env)  # warm the page cache
        times = {"ours": [], "theirs": []}
        for _ in range(args.repeat):
            times["ours"].append(timed(ours, env))
            times["theirs"].append(timed(theirs, env))
        a, b = statistics.median(times["ours"]), statistics.median(times["theirs"])
        print(f"| {n} | {a:.3f} | {b:.3f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
