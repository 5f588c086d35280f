#!/usr/bin/env python3
"""Wall time of starting and ending a job of `true`, perseusrun against mpirun, same run.

    bench/launch_time.py [--perseusrun build/apps/perseusrun/perseusrun] [--repeat 15]
    bench/launch_time.py --against OTHER/perseusrun     # another perseusrun instead of mpirun

For each N in 1, 8, 32 it runs `perseusrun -np N -H localhost:N true` and
`mpirun --oversubscribe -np N true` alternately, --repeat times each, and prints the medians
and their ratio as a Markdown table (ratio < 1: perseusrun is faster). --against runs another
perseusrun build (an older commit's, say) in mpirun's place, the same way: a regression check.
Times on this machine are CPU-machine times: compare ratios, not absolute values.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

# mpirun 4.1 sometimes hangs at exit with many ranks on a small machine (seen here at N=32):
# such a run is ended and counted instead of stopping the benchmark.
HANG_SECONDS = 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(command, env, hangs):
    """Seconds one run took, or None when it hung past HANG_SECONDS (counted in `hangs`)."""
    start = time.perf_counter()
    try:
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL,
                       timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        hangs[command[0]] = hangs.get(command[0], 0) + 1
        return None
    return time.perf_counter() - start


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perseusrun",
                        default=os.path.join(ROOT, "build/apps/perseusrun/perseusrun"))
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--against", help="another perseusrun to compare with, not mpirun")
    args = parser.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun and not args.against:
        sys.exit("launch_time: mpirun not found (apt-get install openmpi-bin)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    hangs = {}
    other = "other perseusrun" if args.against else "mpirun"
    print(f"| N | perseusrun median (s) | {other} median (s) | perseusrun / {other} | hung runs |")
    print("|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        ours = [args.perseusrun, "-np", str(n), "-H", f"localhost:{n}", "true"]
        theirs = ([args.against, "-np", str(n), "-H", f"localhost:{n}", "true"] if args.against
                  else [mpirun, "--oversubscribe", "-np", str(n), "true"])
        hangs.clear()
        timed(ours, env, {}), timed(theirs, env, {})  # warm the page cache
        times = {"ours": [], "theirs": []}
        for _ in range(args.repeat):
            times["ours"].append(timed(ours, env, hangs))
            times["theirs"].append(timed(theirs, env, hangs))
        a, b = median(times["ours"]), median(times["theirs"])
        hung = ", ".join(f"{os.path.basename(k)}: {v}" for k, v in hangs.items()) or "none"
        print(f"| {n} | {a:.3f} | {b:.3f} | {a / b:.2f} | {hung} |", flush=True)


if __name__ == "__main__":
    main()
