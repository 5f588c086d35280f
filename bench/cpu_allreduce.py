#!/usr/bin/env python3
"""CPU all-reduce bus bandwidth: libperseus against torch.distributed (gloo) and Open MPI, same run.

    bench/cpu_allreduce.py [--build-dir build] [--ranks 2,4] [--rounds 2] [--quick] [--no-256mb]
                           [--json FILE]

For each N in --ranks it runs three peers, one after the other, each on its own job, and does
so --rounds times (peers alternate; each cell of the tables is the best of the rounds, so that
a burst of other load on the machine hurts no peer more than another):
  perseus  build/bench/cpu_allreduce_perseus under `perseusrun -np N -H localhost:N`
  torch    this script with --torch-child, under the same perseusrun (which sets MASTER_ADDR,
           MASTER_PORT, RANK and WORLD_SIZE), dist.init_process_group("gloo")
  mpi      build/bench/cpu_allreduce_mpi under `mpirun --oversubscribe -np N`
All three do the same thing: float32 SUM all-reduces of 4 KB, 64 KB, 1 MB, 16 MB and 256 MB
(a warm-up, a barrier, ITERS timed calls, the largest elapsed time over the ranks), then
1000 tensors of 4 KB, each its own all-reduce call, per iteration (no fusion in any peer), and
for perseus the same 1000 submitted at once with perseus_allreduce_async (fused).
busbw = algbw * 2 (N - 1) / N, as nccl-tests; GB/s are 1e9 bytes per second.

It builds nothing: build first (ninja -C build). Prints a Markdown table per N: busbw of each
peer and the ratios perseus/torch and perseus/MPI (above 1: perseus has more bandwidth), then
the 1000 x 4 KB line in ms per iteration (ratios of times: below 1, perseus is faster).
Times on the CPU development machine are only meaningful as ratios between peers of one run.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KB, MB = 1 << 10, 1 << 20
# (bytes, timed iterations): fewer for the big sizes, so that the whole run (3 peers x 2 N)
# stays within a few minutes on a 2-core machine.
SIZES = [(4 * KB, 1000), (64 * KB, 300), (1 * MB, 100), (16 * MB, 10), (256 * MB, 3)]
QUICK_SIZES = [(4 * KB, 100), (64 * KB, 30), (1 * MB, 10), (16 * MB, 3), (256 * MB, 1)]
MANY = (1000, 4 * KB, 5)  # tensors, bytes each, timed iterations
QUICK_MANY = (1000, 4 * KB, 1)
PEERS = ("perseus", "torch", "mpi")
PEER_TIMEOUT = 600
# The torch child runs under Debian's python3, where python3-torch is installed.
TORCH_PYTHON = "/usr/bin/python3"


def size_name(nbytes):
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


# ---- the torch.distributed peer: one rank, started by perseusrun --------------------------


def torch_child(spec, many):
    import torch
    import torch.distributed as dist

    # As torchrun does when it starts several ranks on one host: one intra-op thread each.
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    expected = size * (size + 1) / 2

    def max_over_ranks(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])

    def emit(record):
        if rank == 0:
            print(json.dumps(dict(peer="torch", n=size, **record)), flush=True)

    def verify(t):
        if t[0].item() != expected or t[-1].item() != expected:
            sys.exit(f"torch child: rank {rank}: wrong sum {t[0].item()} (expected {expected})")

    for item in spec.split(","):
        nbytes, iters = (int(x) for x in item.split(":"))
        # dist.all_reduce works in place: the first warm-up call is checked, then the tensor
        # holds zeros so that repeated sums cannot overflow (same speed for any finite value).
        t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        for i in range(max(1, iters // 10)):
            dist.all_reduce(t)
            if i == 0:
                verify(t)
                t.zero_()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        elapsed = max_over_ranks(time.perf_counter() - start)
        algbw = nbytes * iters / elapsed / 1e9
        emit(dict(case="size", bytes=nbytes, iters=iters, seconds=elapsed,
                  us_per_call=elapsed / iters * 1e6, algbw_gbs=algbw,
                  busbw_gbs=algbw * 2 * (size - 1) / size))
        del t
    if many:
        tensors, nbytes, iters = (int(x) for x in many.split(":"))
        ts = [torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
              for _ in range(tensors)]
        for t in ts:  # one warm-up iteration, checked
            dist.all_reduce(t)
        for t in ts:
            verify(t)
            t.zero_()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            for t in ts:
                dist.all_reduce(t)
        elapsed = max_over_ranks(time.perf_counter() - start)
        algbw = nbytes * tensors * iters / elapsed / 1e9
        emit(dict(case="many", tensors=tensors, bytes=nbytes, iters=iters, seconds=elapsed,
                  ms_per_iter=elapsed / iters * 1e3, algbw_gbs=algbw,
                  busbw_gbs=algbw * 2 * (size - 1) / size))
    dist.destroy_process_group()


# ---- the orchestrator -----------------------------------------------------------------------


def run_peer(command, env):
    """The JSON records rank 0 printed (perseusrun tags lines "[1,0]<stdout>:"), or an error."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=PEER_TIMEOUT)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {PEER_TIMEOUT} s"
    records = []
    for line in proc.stdout.splitlines():
        brace = line.find("{")
        if brace >= 0:
            try:
                records.append(json.loads(line[brace:]))
            except json.JSONDecodeError:
                pass
    error = None
    if proc.returncode != 0:
        error = f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"
    print(f"  {os.path.basename(command[0])} ... {os.path.basename(command[-3])}: "
          f"{len(records)} records, {time.perf_counter() - start:.1f} s"
          + (f", {error}" if error else ""), file=sys.stderr, flush=True)
    return records, error


def fmt(value, digits=3):
    return "n/a" if value is None else f"{value:.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--ranks", default="2,4", help="comma-separated N (default 2,4)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every peer (best kept)")
    parser.add_argument("--quick", action="store_true", help="one tenth of the iterations")
    parser.add_argument("--no-256mb", action="store_true", help="leave out 256 MB")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--json", help="also write every record to this file")
    parser.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("spec", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_child:
        return torch_child(args.spec[0], args.spec[1] if len(args.spec) > 1 else "")

    sizes = QUICK_SIZES if args.quick else SIZES
    if args.no_256mb:
        sizes = [s for s in sizes if s[0] < 256 * MB]
    many = QUICK_MANY if args.quick else MANY
    spec = ",".join(f"{b}:{i}" for b, i in sizes)
    many_spec = ":".join(str(x) for x in many)
    build = os.path.abspath(args.build_dir)
    perseusrun = os.path.join(build, "apps/perseusrun/perseusrun")
    perseus_bench = os.path.join(build, "bench/cpu_allreduce_perseus")
    mpi_bench = os.path.join(build, "bench/cpu_allreduce_mpi")
    mpirun = shutil.which("mpirun")
    peers = args.peers.split(",")
    for path in (perseusrun, perseus_bench):
        if not os.access(path, os.X_OK):
            sys.exit(f"cpu_allreduce: {path} not found: build first (ninja -C {args.build_dir})")
    if "mpi" in peers and not (mpirun and os.access(mpi_bench, os.X_OK)):
        print("cpu_allreduce: no mpirun or no cpu_allreduce_mpi (MPI not found at configure "
              "time): MPI left out", file=sys.stderr)
        peers.remove("mpi")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    records, errors = [], []
    ranks = [int(n) for n in args.ranks.split(",")]
    for n in [n for _ in range(args.rounds) for n in ranks]:
        launch = [perseusrun, "-np", str(n), "-H", f"localhost:{n}"]
        commands = {
            "perseus": launch + [perseus_bench, spec, many_spec],
            "torch": launch + [TORCH_PYTHON, os.path.abspath(__file__), "--torch-child", spec,
                               many_spec],
            "mpi": [mpirun, "--oversubscribe", "-np", str(n), mpi_bench, spec, many_spec],
        }
        for peer in peers:
            got, error = run_peer(commands[peer], env)
            records += got
            if error:
                errors.append(f"N={n} {peer}: {error}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)

    def field(peer, n, case, nbytes, key):
        """The best of the rounds: the highest busbw, the lowest time."""
        values = [r[key] for r in records
                  if (r["peer"], r["n"], r["case"], r["bytes"]) == (peer, n, case, nbytes)]
        if not values:
            return None
        return max(values) if key.endswith("_gbs") else min(values)

    print(f"Best of {args.rounds} rounds; busbw in GB/s (1e9 B/s); ratios above 1: perseus has "
          "more bandwidth", flush=True)
    for n in ranks:
        note = f", {n} ranks on {os.cpu_count()} cores: oversubscribed" \
            if n > (os.cpu_count() or 1) else ""
        print(f"\nN = {n}{note}\n")
        print("| size | iters | perseus busbw GB/s | torch gloo busbw GB/s | MPI busbw GB/s "
              "| perseus/torch | perseus/MPI |")
        print("|---|---|---|---|---|---|---|")
        for nbytes, iters in sizes:
            p, t, m = (field(peer, n, "size", nbytes, "busbw_gbs") for peer in PEERS)
            print(f"| {size_name(nbytes)} | {iters} | {fmt(p)} | {fmt(t)} | {fmt(m)} "
                  f"| {fmt(ratio(p, t), 2)} | {fmt(ratio(p, m), 2)} |")
        p, t, m = (field(peer, n, "many", many[1], "ms_per_iter") for peer in PEERS)
        print(f"\n{many[0]} x {size_name(many[1])} ({many[0]} calls per iteration, "
              f"{many[2]} iterations), ms per iteration: perseus {fmt(p, 1)}, torch gloo "
              f"{fmt(t, 1)}, MPI {fmt(m, 1)}; perseus/torch {fmt(ratio(p, t), 2)}, "
              f"perseus/MPI {fmt(ratio(p, m), 2)} (time ratios: below 1, perseus is faster)")
        f = field("perseus", n, "many_fused", many[1], "ms_per_iter")
        print(f"the same {many[0]} submitted at once (perseus_allreduce_async, fused): perseus "
              f"{fmt(f, 1)} ms per iteration; against per-tensor torch gloo "
              f"{fmt(ratio(f, t), 3)}, against per-tensor MPI {fmt(ratio(f, m), 3)}")
    if errors:
        print("\nErrors:\n" + "\n".join(f"- {e}" for e in errors))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
