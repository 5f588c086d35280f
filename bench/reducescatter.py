#!/usr/bin/env python3
"""Host reduce-scatter against the all-reduce of the same input, in the same job.

    bench/reducescatter.py [--build-dir build] [--ranks 2,4] [--pairs 5] [--shm 0,1] [--rounds 1]
                           [--json F]

Until the true reduce-scatter, libperseus reduced a host reduce-scatter as an all-reduce of the
whole input and kept one block: the all-reduce column is what a reduce-scatter cost then. For
each N in --ranks and each PERSEUS_SHM in --shm (0: Gloo over TCP loopback; 1: shared memory,
every rank on this host), one perseusrun job runs build/bench/reducescatter_perseus, which for
each size alternates --pairs rounds of timed reduce-scatters and all-reduces (float32 SUM,
blocks within one element of each other). Prints per size the median microseconds per call of
each, the spread (min-max over the pairs), and the ratio reduce-scatter / all-reduce (below 1:
the reduce-scatter is faster).

The real alternative runs in the same sitting: Open MPI's MPI_Reduce_scatter and
MPI_Allreduce (build/bench/reducescatter_mpi under `mpirun --oversubscribe -np N`, when MPI was
found at configure time), its jobs alternating with perseus's (--rounds times each), and the
last column compares perseus's reduce-scatter with MPI's (below 1: perseus is faster).
Builds nothing: build first (ninja -C build).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KB, MB = 1 << 10, 1 << 20
SIZES = [(64 * KB, 200), (1 * MB, 40), (16 * MB, 6), (64 * MB, 2)]


def size_name(nbytes):
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def run(command, env, what):
    """The JSON lines rank 0 printed (perseusrun tags them "[1,0]<stdout>:")."""
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"reducescatter.py: {what} failed ({proc.returncode}):\n" + proc.stderr[-3000:])
    records = []
    for line in proc.stdout.splitlines():
        m = re.match(r"^(?:\[1,0\]<stdout>:)?(\{.*\})$", line)
        if m:
            records.append(json.loads(m.group(1)))
    return records


def run_perseus(build, n, shm, pairs, spec):
    program = os.path.join(build, "bench", "reducescatter_perseus")
    perseusrun = os.path.join(build, "apps", "perseusrun", "perseusrun")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "OMPI_"))}
    env["PERSEUS_SHM"] = str(shm)
    return run([perseusrun, "-np", str(n), "-H", f"localhost:{n}", program, spec, str(pairs)],
               env, f"perseus N={n} PERSEUS_SHM={shm}")


def run_mpi(build, n, pairs, spec):
    program = os.path.join(build, "bench", "reducescatter_mpi")
    mpirun = shutil.which("mpirun")
    if not (mpirun and os.access(program, os.X_OK)):
        return None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return run([mpirun, "--oversubscribe", "-np", str(n), program, spec, str(pairs)], env,
               f"mpi N={n}")


def merge(rounds):
    """One record per size, the pairs of every round together."""
    merged = {}
    for records in rounds:
        for r in records:
            m = merged.setdefault(r["bytes"], dict(r, reducescatter_us=[], allreduce_us=[]))
            m["reducescatter_us"] += r["reducescatter_us"]
            m["allreduce_us"] += r["allreduce_us"]
    return [merged[b] for b in sorted(merged)]


def cell(values):
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--shm", default="0,1")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    spec = ",".join(f"{b}:{i}" for b, i in SIZES)
    shms = [int(x) for x in args.shm.split(",")]
    everything = []
    for n in [int(x) for x in args.ranks.split(",")]:
        perseus = {shm: [] for shm in shms}
        mpi = []
        for _ in range(args.rounds):  # the peers' jobs alternate
            for shm in shms:
                perseus[shm].append(run_perseus(args.build_dir, n, shm, args.pairs, spec))
            records = run_mpi(args.build_dir, n, args.pairs, spec)
            if records is not None:
                mpi.append(records)
        mpi = {r["bytes"]: r for r in merge(mpi)}
        if mpi:
            print(f"\n### {n} ranks, Open MPI\n")
            print("| size | MPI_Reduce_scatter us (min-max) | MPI_Allreduce us (min-max) |")
            print("|---|---|---|")
            for b in sorted(mpi):
                print(f"| {size_name(b)} | {cell(mpi[b]['reducescatter_us'])} | "
                      f"{cell(mpi[b]['allreduce_us'])} |")
                everything.append(dict(mpi[b], peer="mpi"))
        for shm in shms:
            print(f"\n### {n} ranks, perseus, PERSEUS_SHM={shm} "
                  f"({'shared memory' if shm else 'Gloo over TCP loopback'}), "
                  f"{args.pairs * args.rounds} pairs\n")
            print("| size | reduce-scatter us (min-max) | all-reduce us (min-max) | "
                  "reduce-scatter / all-reduce | reduce-scatter / MPI's |")
            print("|---|---|---|---|---|")
            for r in merge(perseus[shm]):
                rs, ar = r["reducescatter_us"], r["allreduce_us"]
                ratio = statistics.median(a / b for a, b in zip(rs, ar))
                theirs = mpi.get(r["bytes"])
                against = (f"{statistics.median(rs) / statistics.median(theirs['reducescatter_us']):.2f}"
                           if theirs else "-")
                print(f"| {size_name(r['bytes'])} | {cell(rs)} | {cell(ar)} | {ratio:.2f} | "
                      f"{against} |")
                everything.append(dict(r, peer="perseus", shm=shm))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
