#!/usr/bin/env python3
"""libperseus on CUDA memory with several ranks: every operation, and the hierarchical all-reduce.

    perseusrun -np 4 -H localhost:4 --gpu-bind none -x NCCL_NVLS_ENABLE=0 \\
        -x PERSEUS_HIERARCHICAL_ALLREDUCE=1 \\
        scripts/gpu/as_simulated_host.sh 2,2 python3 tests/gpu/gpu_multirank_test.py \\
        --expect scatter-gather

Each rank calls libperseus.so through ctypes on torch CUDA tensors (tests/gpu/gpu_ops_test.py's
table). Every rank fills its tensors with values that depend on its rank and the element, and
checks each result against what torch computes from every rank's values:
  allreduce      sum, avg, min, max, product x uint8, int32, int64, float16, bfloat16, float32,
                 float64 x 0, 1, 3, 1001 elements (and 1M + 3 float32), in and out of place,
                 each submitted and waited alone; then 64 tensors of mixed sizes submitted
                 together (fused into one buffer)
  broadcast      from the first and the last rank, 0, 1, 1001 elements and 1M + 3 float32
  allgatherv     rank r gives n + r elements: output counts and contents in rank order
  alltoall       uneven blocks (rank r sends n + (r + q) % 3 elements to rank q)
  reducescatter  sum and max, equal blocks and blocks of n + q elements for rank q
Rank 0 then reads the timeline (PERSEUS_TIMELINE) and checks which kind of NCCL all-reduce
carried the all-reduces: NCCL_HIERARCHICAL_ALLREDUCE (--expect scatter-gather or
reduce-broadcast) or NCCL_ALLREDUCE (--expect flat). (scripts/gpu/run_multirank_checks.sh also
checks the scheme libperseus announces on rank 0's stderr.)

On the one-GPU machine the hosts are simulated (scripts/gpu/as_simulated_host.sh): every rank
shares GPU 0 and NCCL's socket transport carries the data. Exit 0 when every check passed.
"""
import argparse
import ctypes
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_ops_test import DTYPE_CODE, OPS, load_library  # noqa: E402

DTYPES = ["uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
COUNTS = [0, 1, 3, 1001]
TIMELINE_KIND = {"flat": "NCCL_ALLREDUCE", "scatter-gather": "NCCL_HIERARCHICAL_ALLREDUCE",
                 "reduce-broadcast": "NCCL_HIERARCHICAL_ALLREDUCE"}


def values(torch, rank, count, dtype, dev):
    i = torch.arange(count, dtype=torch.int64, device=dev)
    v = (rank * 7 + i * 3) % 5
    if dtype != "uint8":
        v = v - 2
    return v.to(getattr(torch, dtype))


def expected(torch, size, count, dtype, op, dev):
    wide = torch.float64 if dtype.startswith(("float", "bfloat")) else torch.int64
    every = torch.stack([values(torch, r, count, dtype, dev).to(wide) for r in range(size)])
    if op == "sum":
        out = every.sum(0)
    elif op == "avg":
        out = every.sum(0) / size if wide == torch.float64 else \
            torch.div(every.sum(0), size, rounding_mode="trunc")
    elif op == "min":
        out = every.min(0).values
    elif op == "max":
        out = every.max(0).values
    else:
        out = every.prod(0)
    if dtype == "uint8":
        out = out % 256  # NCCL's uint8 arithmetic wraps, as torch's does
    return out.to(getattr(torch, dtype))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expect", choices=sorted(TIMELINE_KIND), required=True)
    parser.add_argument("--cpu", action="store_true",
                        help="host tensors (Gloo) instead, to check this script without a GPU; "
                             "the timeline is not checked")
    args = parser.parse_args()
    import torch
    scratch = tempfile.mkdtemp(prefix="perseus-hier-")
    timeline = os.path.join(scratch, "timeline.json")
    os.environ["PERSEUS_TIMELINE"] = timeline  # rank 0 writes it
    lib, _ = load_library()
    if lib.perseus_init() != 0:
        sys.exit(f"init: {lib.perseus_last_error().decode()}")
    if not args.cpu and lib.perseus_nccl_built() != 1:
        sys.exit("perseus_nccl_built() is 0: no GPU or NCCL here")
    rank, size = lib.perseus_rank(), lib.perseus_size()
    if args.cpu:
        dev, ordinal, stream = torch.device("cpu"), -1, None
    else:
        dev = torch.device("cuda", torch.cuda.current_device())
        ordinal, stream = dev.index, torch.cuda.current_stream(dev).cuda_stream or None
    failures, checks, counter = [], 0, [0]

    def submit(send, recv, dtype, op):
        counter[0] += 1
        req = ctypes.c_void_p()
        rc = lib.perseus_allreduce_async(
            ctypes.c_void_p(send.data_ptr()) if send.numel() else None,
            ctypes.c_void_p(recv.data_ptr()) if recv.numel() else None, send.numel(),
            DTYPE_CODE[dtype], OPS[op], 1.0, 1.0, f"hier.{counter[0]}".encode(), ordinal,
            stream, ctypes.byref(req))
        if rc != 0:
            raise RuntimeError(f"submit {op} {dtype} x{send.numel()}: "
                               f"{lib.perseus_last_error().decode()}")
        return req

    def wait(req, what):
        rc = lib.perseus_wait(req)
        lib.perseus_release(req)
        if rc != 0:
            raise RuntimeError(f"{what}: {lib.perseus_last_error().decode()}")

    def compare_counts(got, want, what):
        nonlocal checks
        checks += 1
        if list(got) != list(want):
            failures.append(f"rank {rank}: {what}: output counts {list(got)}, expected {want}")

    def compare(got, want, what):
        nonlocal checks
        checks += 1
        tolerance = {"float16": 1e-2, "bfloat16": 2e-2}.get(str(want.dtype).split(".")[-1], 1e-6)
        if want.dtype.is_floating_point:
            ok = torch.allclose(got.double(), want.double(), rtol=tolerance, atol=tolerance)
        else:
            ok = torch.equal(got, want)
        if not ok:
            bad = (got.double() - want.double()).abs().argmax().item() if got.numel() else 0
            failures.append(f"rank {rank}: {what}: element {bad} is {got[bad].item()}, expected "
                            f"{want[bad].item()}")

    cases = [(d, op, n) for d in DTYPES for op in OPS for n in COUNTS]
    cases += [("float32", op, (1 << 20) + 3) for op in ("sum", "avg")]
    for dtype, op, count in cases:
        for in_place in (False, True):
            what = f"{op} {dtype} x{count} {'in place' if in_place else 'out of place'}"
            send = values(torch, rank, count, dtype, dev)
            recv = send if in_place else torch.full_like(send, 7)
            try:
                wait(submit(send, recv, dtype, op), what)
            except RuntimeError as error:
                failures.append(f"rank {rank}: {error}")
                continue
            compare(recv, expected(torch, size, count, dtype, op, dev), what)

    # 64 tensors at once: fused into one buffer per cycle (or a few), then split back.
    sizes = [1 + (k * 37) % 300 for k in range(64)]
    sends = [values(torch, rank, n, "float32", dev) + k for k, n in enumerate(sizes)]
    recvs = [torch.zeros_like(s) for s in sends]
    try:
        requests = [submit(s, r, "float32", "sum") for s, r in zip(sends, recvs)]
        for k, req in enumerate(requests):
            wait(req, f"fused tensor {k}")
        for k, (n, r) in enumerate(zip(sizes, recvs)):
            compare(r, expected(torch, size, n, "float32", "sum", dev) + k * size,
                    f"fused tensor {k} ({n} float32)")
    except RuntimeError as error:
        failures.append(f"rank {rank}: fused: {error}")

    # ---- the other operations (flat NCCL calls whatever the all-reduce scheme) ----

    def held_output(req, what):
        """Waits for an op whose result libperseus holds; returns (counts, output tensor)."""
        try:
            if lib.perseus_wait(req) != 0:
                raise RuntimeError(f"{what}: {lib.perseus_last_error().decode()}")
            counts = (ctypes.c_size_t * size)()
            if lib.perseus_output_counts(req, counts) != 0:
                raise RuntimeError(f"{what}: output_counts: {lib.perseus_last_error().decode()}")
            return list(counts), req
        except Exception:
            lib.perseus_release(req)
            raise

    def copy_out(req, total, dtype, what):
        out = torch.full((total,), 7, dtype=getattr(torch, dtype), device=dev)
        try:
            if lib.perseus_output_copy(req, ctypes.c_void_p(out.data_ptr()) if total else None):
                raise RuntimeError(f"{what}: output_copy: {lib.perseus_last_error().decode()}")
        finally:
            lib.perseus_release(req)
        return out

    def ptr(t):
        return ctypes.c_void_p(t.data_ptr()) if t.numel() else None

    def name(what):
        counter[0] += 1
        return f"{what}.{counter[0]}".encode()

    def attempt(what, fn):
        try:
            fn()
        except RuntimeError as error:
            failures.append(f"rank {rank}: {what}: {error}")

    other_dtypes = ["uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
    for dtype in other_dtypes:
        code = DTYPE_CODE[dtype]
        for count in [0, 1, 1001] + ([(1 << 20) + 3] if dtype == "float32" else []):
            for root in sorted({0, size - 1}):
                def broadcast(count=count, root=root):
                    what = f"broadcast {dtype} x{count} from {root}"
                    x = values(torch, rank, count, dtype, dev)
                    req = ctypes.c_void_p()
                    if lib.perseus_broadcast_async(ptr(x), count, code, root, name("bcast"),
                                                   ordinal, stream, ctypes.byref(req)):
                        raise RuntimeError(lib.perseus_last_error().decode())
                    wait(req, what)
                    compare(x, values(torch, root, count, dtype, dev), what)
                attempt(f"broadcast {dtype} x{count}", broadcast)

        for base in (0, 5, 1001):
            def allgatherv(base=base):
                what = f"allgatherv {dtype} {base}+r"
                x = values(torch, rank, base + rank, dtype, dev)
                req = ctypes.c_void_p()
                if lib.perseus_allgatherv_async(ptr(x), base + rank, code, name("allgatherv"),
                                                ordinal, stream, ctypes.byref(req)):
                    raise RuntimeError(lib.perseus_last_error().decode())
                counts, req = held_output(req, what)
                compare_counts(counts, [base + q for q in range(size)], what)
                out = copy_out(req, sum(counts), dtype, what)
                want = torch.cat([values(torch, q, base + q, dtype, dev) for q in range(size)])
                compare(out, want, what)
            attempt(f"allgatherv {dtype}", allgatherv)

            def alltoall(base=base):
                what = f"alltoall {dtype} {base}+(r+q)%3"
                sizes_to = [base + (rank + q) % 3 for q in range(size)]
                x = torch.cat([values(torch, rank * 16 + q, n, dtype, dev)
                               for q, n in enumerate(sizes_to)])
                splits = (ctypes.c_size_t * size)(*sizes_to)
                req = ctypes.c_void_p()
                if lib.perseus_alltoall_async(ptr(x), splits, code, name("alltoall"), ordinal,
                                              stream, ctypes.byref(req)):
                    raise RuntimeError(lib.perseus_last_error().decode())
                counts, req = held_output(req, what)
                from_each = [base + (q + rank) % 3 for q in range(size)]
                compare_counts(counts, from_each, what)
                out = copy_out(req, sum(counts), dtype, what)
                want = torch.cat([values(torch, q * 16 + rank, n, dtype, dev)
                                  for q, n in enumerate(from_each)])
                compare(out, want, what)
            attempt(f"alltoall {dtype}", alltoall)

            for op in ("sum", "max"):
                for even in (True, False):
                    def reducescatter(base=base, op=op, even=even):
                        blocks = [base if even else base + q for q in range(size)]
                        what = f"reducescatter {op} {dtype} blocks {blocks}"
                        total = sum(blocks)
                        x = values(torch, rank, total, dtype, dev)
                        y = torch.full((blocks[rank],), 7, dtype=x.dtype, device=dev)
                        recv_counts = (ctypes.c_size_t * size)(*blocks)
                        req = ctypes.c_void_p()
                        if lib.perseus_reducescatter_async(ptr(x), ptr(y), recv_counts, code,
                                                           OPS[op], 1.0, 1.0, name("rs"),
                                                           ordinal, stream, ctypes.byref(req)):
                            raise RuntimeError(lib.perseus_last_error().decode())
                        wait(req, what)
                        start = sum(blocks[:rank])
                        want = expected(torch, size, total, dtype, op, dev)
                        compare(y, want[start:start + blocks[rank]], what)
                    attempt(f"reducescatter {dtype}", reducescatter)

    lib.perseus_finalize()  # rank 0 closes the timeline
    if rank == 0 and not args.cpu:
        text = open(timeline).read() if os.path.exists(timeline) else ""
        kind = TIMELINE_KIND[args.expect]
        other = "NCCL_ALLREDUCE" if kind != "NCCL_ALLREDUCE" else "NCCL_HIERARCHICAL_ALLREDUCE"
        checks += 1
        if f'"{kind}"' not in text or f'"{other}"' in text:
            failures.append(f"rank 0: the timeline should show {kind} and no {other} "
                            f"(--expect {args.expect}); it has {text.count(kind)} {kind}")
    shutil.rmtree(scratch, ignore_errors=True)
    for line in failures[:40]:
        print("FAIL", line)
    print(f"rank {rank} of {size}: {checks - len(failures)} of {checks} checks passed "
          f"(expect {args.expect}, PERSEUS_ALLREDUCE_STREAMS="
          f"{os.environ.get('PERSEUS_ALLREDUCE_STREAMS', '1')})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
