#!/usr/bin/env python3
"""GPU all-reduce latency and bus bandwidth: libperseus against raw NCCL and torch.distributed.

    bench/gpu_allreduce.py [--build-dir build] [--max-bytes 1073741824] [--quick] [--json FILE]

On the GPU machine (device tool), for the GPUs visible (nvidia-smi -L), three peers, one after
the other, in the same run; float32 SUM all-reduces of 8 B, 32 B, 128 B, ... (x4 steps) and
1 GB:
  raw      build/bench/nccl/nccl_raw_allreduce: one process drives every GPU (ncclCommInitAll),
           back-to-back calls ended by one stream synchronisation (nccl-tests' method); out of
           place and --in-place; and out of place --blocking (a synchronisation per call)
  perseus  this script with --perseus-child under `perseusrun -np N -H localhost:N`, one rank
           per GPU: libperseus's C ABI through ctypes on torch CUDA tensors, each call a
           perseus_allreduce_async (device = the tensor's, stream = torch's current) and a
           perseus_wait (blocking: the result is final when wait returns); out of place and
           in place; the same name for every call of a size (the cached negotiation path, as a
           training loop's). Pipelined: ITERS requests submitted at once (names reused from
           round to round), then waited for, with PERSEUS_FUSION_THRESHOLD=0 in the ranks so that
           each is its own NCCL call as raw's are (the like-for-like peer of raw's method)
  torch    this script with --torch-child under the same perseusrun (MASTER_ADDR, MASTER_PORT,
           RANK, WORLD_SIZE), dist.init_process_group("nccl"), in place (torch's only form):
           blocking (all_reduce then torch.cuda.synchronize per call) and pipelined (iters calls
           then one synchronisation, as raw)
Each timed size: warm-up calls, then ITERS timed calls; time/call = elapsed / ITERS, the
largest over the ranks. algbw = bytes / time; busbw = algbw * 2 (N - 1) / N (nccl-tests): 0 with
one GPU, where NCCL's all-reduce is a local copy (out of place) or nothing (in place), so what
is measured is the per-call overhead of each path.

--simulate-hosts SIZES (e.g. 2 or 2,2) runs the Perseus and torch peers with sum(SIZES) ranks on
one GPU, each rank told it is on a host of its own by NCCL_HOSTID and its place in the
simulated hosts by scripts/gpu/as_simulated_host.sh, so that NCCL carries the data between
ranks through its socket transport over loopback: a transfer-bound comparison on a machine
with one GPU (raw, a single process, cannot take part), though the socket transport's own
latency (milliseconds per call) dominates there. PERSEUS_HIERARCHICAL_ALLREDUCE in the
environment reaches the ranks.

Prints a Markdown table: time/call of each peer, and the ratios Perseus/raw (out of place,
pipelined against pipelined and blocking against blocking) and Perseus/torch (in place, the
same pairs); below 1: Perseus is faster. Writes every figure as JSON (--json). NCCL_NVLS_ENABLE=0 in every process.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 1 << 30


def sizes_for(max_bytes, quick):
    sizes, b = [], 8
    while b <= max_bytes:
        sizes.append(b)
        b *= 16 if quick else 4
    if max_bytes not in sizes and max_bytes >= 8:
        sizes.append(max_bytes)
    return sizes


def iters_for(nbytes):
    if nbytes <= 1 << 20:
        return 200
    if nbytes <= 64 << 20:
        return 50
    return 20


def size_name(n):
    for unit, name in ((GB, "GB"), (1 << 20, "MB"), (1 << 10, "KB")):
        if n >= unit:
            return f"{n // unit} {name}"
    return f"{n} B"


# ---- the Perseus peer: one rank per GPU, started by perseusrun ---------------------------------


def perseus_child(args):
    os.environ["PERSEUS_FUSION_THRESHOLD"] = "0"  # read by perseus_init: one NCCL call each
    import torch
    path = os.environ.get("PERSEUS_LIBRARY") or os.path.join(ROOT, args.build_dir,
                                                             "lib/comm/libperseus.so")
    lib = ctypes.CDLL(path)
    P, S, I, D, C = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_double, ctypes.c_char_p
    lib.perseus_allreduce_async.argtypes = [P, P, S, I, I, D, D, C, I, P,
                                            ctypes.POINTER(ctypes.c_void_p)]
    lib.perseus_allreduce.argtypes = [P, P, S, I, I, C]
    lib.perseus_wait.argtypes = [P]
    lib.perseus_release.argtypes = [P]
    lib.perseus_last_error.restype = C
    if lib.perseus_init() != 0:
        sys.exit(f"perseus child: init: {lib.perseus_last_error().decode()}")
    if lib.perseus_nccl_built() != 1:
        sys.exit("perseus child: perseus_nccl_built() is 0")
    rank, size = lib.perseus_rank(), lib.perseus_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    sizes = [int(s) for s in args.sizes.split(",")]
    top = max(sizes) // 4
    send = torch.ones(top, dtype=torch.float32, device=dev)
    recv = torch.zeros(top, dtype=torch.float32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream or None
    FLOAT32, SUM = 6, 0

    def call(src, dst, count, name):
        req = ctypes.c_void_p()
        rc = lib.perseus_allreduce_async(src, dst, count, FLOAT32, SUM, 1.0, 1.0, name,
                                         dev.index, stream, ctypes.byref(req))
        if rc != 0:
            sys.exit(f"perseus child: submit: {lib.perseus_last_error().decode()}")
        rc = lib.perseus_wait(req)
        lib.perseus_release(req)
        if rc != 0:
            sys.exit(f"perseus child: wait: {lib.perseus_last_error().decode()}")

    def pipelined(src, dst, count, names):
        reqs = []
        for name in names:
            req = ctypes.c_void_p()
            rc = lib.perseus_allreduce_async(src, dst, count, FLOAT32, SUM, 1.0, 1.0, name,
                                             dev.index, stream, ctypes.byref(req))
            if rc != 0:
                sys.exit(f"perseus child: submit: {lib.perseus_last_error().decode()}")
            reqs.append(req)
        for req in reqs:
            rc = lib.perseus_wait(req)
            lib.perseus_release(req)
            if rc != 0:
                sys.exit(f"perseus child: wait: {lib.perseus_last_error().decode()}")

    def max_over_ranks(x):
        t = (ctypes.c_double * 1)(x)
        lib.perseus_allreduce(t, t, 1, 7, 3, b"bench.max")  # float64 max on the host (Gloo)
        return t[0]

    records = []
    for nbytes in sizes:
        count = nbytes // 4
        for mode in ("out_of_place", "in_place"):
            src = ctypes.c_void_p(send.data_ptr())
            dst = ctypes.c_void_p((send if mode == "in_place" else recv).data_ptr())
            name = f"bench.{mode}.{nbytes}".encode()
            if mode == "in_place":
                send[:count].fill_(1.0)
            call(src, dst, count, name)  # first call: checked
            got = (send if mode == "in_place" else recv)[:count]
            ok = got[0].item() == size and got[-1].item() == size
            if mode == "in_place":
                send[:count].zero_()  # repeated sums stay finite
            iters = iters_for(nbytes)
            names = [f"bench.pipe.{mode}.{nbytes}.{k}".encode() for k in range(iters)]
            runs = {True: lambda: [call(src, dst, count, name) for _ in range(iters)],
                    False: lambda: pipelined(src, dst, count, names)}
            for blocking, run in runs.items():
                run()  # warm-up; negotiates the pipelined names once
                torch.cuda.synchronize(dev)
                start = time.perf_counter()
                run()
                seconds = max_over_ranks((time.perf_counter() - start) / iters)
                records.append(dict(peer="perseus", mode=mode, blocking=blocking, n=size,
                                    bytes=nbytes, iters=iters, time_us=seconds * 1e6, correct=ok))
            if mode == "in_place":
                send[:count].fill_(1.0)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(records, f)
    lib.perseus_finalize()


# ---- the torch.distributed peer -----------------------------------------------------------------


def torch_child(args):
    import torch
    import torch.distributed as dist
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, size = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in args.sizes.split(",")]
    buf = torch.ones(max(sizes) // 4, dtype=torch.float32, device=dev)

    def max_over_ranks(x):
        t = torch.tensor([x], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    records = []
    for nbytes in sizes:
        t = buf[:nbytes // 4]
        t.fill_(1.0)
        dist.all_reduce(t)
        ok = t[0].item() == size and t[-1].item() == size
        t.zero_()
        iters = iters_for(nbytes)
        for blocking in (True, False):
            for _ in range(4):
                dist.all_reduce(t)
            torch.cuda.synchronize(dev)
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
                if blocking:
                    torch.cuda.synchronize(dev)
            torch.cuda.synchronize(dev)
            seconds = max_over_ranks((time.perf_counter() - start) / iters)
            records.append(dict(peer="torch", mode="in_place", blocking=blocking, n=size,
                                bytes=nbytes, iters=iters, time_us=seconds * 1e6, correct=ok))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(records, f)
    dist.destroy_process_group()


# ---- the orchestrator ---------------------------------------------------------------------------


def gpu_count():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def run_child(kind, args, n, sizes, tmp):
    out = os.path.join(tmp, f"{kind}.json")
    cmd = [os.path.join(ROOT, args.build_dir, "apps/perseusrun/perseusrun"), "-np", str(n),
           "-H", f"localhost:{n}", "-x", "NCCL_NVLS_ENABLE=0", "--timeout", "300"]
    if args.simulate_hosts:
        cmd += ["--gpu-bind", "none", "-x", "PERSEUS_HIERARCHICAL_ALLREDUCE",
                os.path.join(ROOT, "scripts/gpu/as_simulated_host.sh"), args.simulate_hosts]
    cmd += [sys.executable, os.path.abspath(__file__), f"--{kind}-child", "--out", out,
            "--sizes", ",".join(map(str, sizes)), "--build-dir", args.build_dir]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(f"# {kind}: exit {p.returncode} in {time.time() - start:.1f} s", flush=True)
    if p.returncode != 0 or not os.path.exists(out):
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
        return []
    return json.load(open(out))


def run_raw(args, n, max_bytes, in_place, blocking=False):
    exe = os.path.join(ROOT, args.build_dir, "bench/nccl/nccl_raw_allreduce")
    if not os.path.exists(exe):
        exe = os.path.join(ROOT, ".device/bin/nccl_raw_allreduce")
    cmd = [exe, "--min-bytes", "8", "--max-bytes", str(max_bytes), "--gpus", str(n)]
    if in_place:
        cmd.append("--in-place")
    if blocking:
        cmd.append("--blocking")
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(f"# raw ({'in place' if in_place else 'out of place'}"
          f"{', blocking' if blocking else ''}): exit {p.returncode} in "
          f"{time.time() - start:.1f} s", flush=True)
    header = [line for line in p.stdout.splitlines() if line.startswith("# nccl_raw")]
    records = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            records.append(dict(peer="raw", mode="in_place" if in_place else "out_of_place",
                                blocking=blocking, n=n, bytes=r["bytes"], iters=r["iters"],
                                time_us=r["time_us"], correct=r["correct"]))
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:], sep="\n")
    return records, header


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--max-bytes", type=int, default=GB)
    parser.add_argument("--quick", action="store_true", help="x16 steps")
    parser.add_argument("--json")
    parser.add_argument("--simulate-hosts", metavar="SIZES",
                        help="ranks per simulated host on one GPU, e.g. 2,2 (see above)")
    parser.add_argument("--perseus-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    if args.perseus_child:
        return perseus_child(args)
    if args.torch_child:
        return torch_child(args)

    n = gpu_count()
    if args.simulate_hosts:
        n = sum(int(k) for k in args.simulate_hosts.split(","))
    sizes = sizes_for(args.max_bytes, args.quick)
    versions = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda, "
         "'.'.join(map(str, torch.cuda.nccl.version())))"],
        capture_output=True, text=True).stdout.split()
    where = (f"{n} ranks on one GPU as hosts of {args.simulate_hosts} rank(s) (NCCL over "
             f"sockets; PERSEUS_HIERARCHICAL_ALLREDUCE="
             f"{os.environ.get('PERSEUS_HIERARCHICAL_ALLREDUCE', '0')})"
             if args.simulate_hosts else f"{n} GPU(s)")
    print(f"# gpu_allreduce: {where}, float32 sum, sizes {size_name(sizes[0])} to "
          f"{size_name(sizes[-1])}; torch {' / CUDA '.join(versions[:2]) if versions else '?'}"
          f"{', NCCL ' + versions[2] + ' inside torch' if len(versions) > 2 else ''}", flush=True)
    records = []
    raw_out, raw_in, raw_blocking, header = [], [], [], []
    if not args.simulate_hosts:
        raw_out, header = run_raw(args, n, sizes[-1], False)
        raw_in, _ = run_raw(args, n, sizes[-1], True)
        raw_blocking, _ = run_raw(args, n, sizes[-1], False, blocking=True)
    for line in header:
        print(line)
    with tempfile.TemporaryDirectory() as tmp:
        records += run_child("perseus", args, n, sizes, tmp)
        records += run_child("torch", args, n, sizes, tmp)
    records += [r for r in raw_out + raw_in + raw_blocking if r["bytes"] in sizes]

    def t(peer, mode, blocking, nbytes):
        for r in records:
            if (r["peer"], r["mode"], r["blocking"], r["bytes"]) == (peer, mode, blocking, nbytes):
                return r
        return None

    def fmt(r):
        if not r:
            return "-"
        return f"{r['time_us']:.1f}" + ("" if r["correct"] else " WRONG")

    def ratio(a, b):
        return f"{a['time_us'] / b['time_us']:.2f}" if a and b else "-"

    print()
    print(f"Time per call in us, {where}. Pipelined: back-to-back calls, one wait at the end "
          "(raw: NCCL calls; Perseus: async requests, fusion off; torch: all_reduce calls); "
          "blocking: each call waited for (raw: stream synchronize; Perseus: perseus_wait; "
          "torch: all_reduce + synchronize). Ratios below 1: Perseus is faster.")
    print()
    print("| size | raw out pipelined | Perseus out pipelined | Perseus/raw pipelined | raw out "
          "blocking | Perseus out blocking | Perseus/raw blocking | raw in pipelined | Perseus in "
          "pipelined | Perseus in blocking | torch in blocking | torch in pipelined | "
          "Perseus/torch (in, blocking) | Perseus/torch (in, pipelined) | Perseus out pipelined "
          "busbw GB/s |")
    print("|" + "---|" * 15)
    bad = False
    for b in sizes:
        ro, rb = t("raw", "out_of_place", False, b), t("raw", "out_of_place", True, b)
        po, pb = t("perseus", "out_of_place", False, b), t("perseus", "out_of_place", True, b)
        ri, pip = t("raw", "in_place", False, b), t("perseus", "in_place", False, b)
        pi = t("perseus", "in_place", True, b)
        tb, tp = t("torch", "in_place", True, b), t("torch", "in_place", False, b)
        for r in (ro, rb, po, pb, pip, pi, tb, tp):
            bad |= bool(r) and not r["correct"]
        algbw = b / (po["time_us"] * 1e-6) / 1e9 if po else 0.0
        busbw = algbw * 2 * (n - 1) / n
        print(f"| {size_name(b)} | {fmt(ro)} | {fmt(po)} | {ratio(po, ro)} | {fmt(rb)} | "
              f"{fmt(pb)} | {ratio(pb, rb)} | {fmt(ri)} | {fmt(pip)} | {fmt(pi)} | {fmt(tb)} | "
              f"{fmt(tp)} | {ratio(pi, tb)} | {ratio(pip, tp)} | {busbw:.1f} |")
    peers = ("perseus", "torch") if args.simulate_hosts else ("raw", "perseus", "torch")
    missing = [p for p in peers if not any(r["peer"] == p for r in records)]
    if missing:
        print(f"\nmissing peers: {', '.join(missing)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpus=n, simulate_hosts=args.simulate_hosts, sizes=sizes, torch=versions, raw_header=header,
                           records=records), f, indent=1)
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
