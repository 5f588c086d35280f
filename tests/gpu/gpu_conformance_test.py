#!/usr/bin/env python3
"""Every collective of perseus.torch.horovod against torch's own computation (issue 22): every
op x every dtype Horovod accepts x odd and round sizes (1 .. 2^20+3) x 1 to 3 dimensions.

    perseusrun -np N -H localhost:N python3 tests/gpu/gpu_conformance_test.py [--cpu] [--quick]

Each rank makes every rank's input itself (seeded by rank), so it knows what the result must be
and computes it with torch on the same device: allreduce (Sum, Average, Min, Max, Product, and
Sum/Average with prescale and postscale), allgather (first dimensions differ by rank), broadcast
(from the last rank), alltoall (equal splits) and reducescatter (Sum, Average). Values are small
integers, so that sums and products are exact in every dtype; averages and scaled results are
compared with a tolerance of a few units in the last place of the dtype (a wrong element, as the
one-rank ncclAvg tail was, is far off), integers exactly. Scaling follows Horovod: in the
tensor's dtype on a GPU, in float32 for 16-bit floats on the CPU, in float64 for integers.

--cpu: host tensors (Gloo); --quick: sizes up to 4913 only (the CTest run on a machine without a
GPU). Prints one line per failure and a total; exits 1 on any failure.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "lib", "framework_shims"))

import torch  # noqa: E402

import perseus.torch.horovod as hvd  # noqa: E402

SIZES = [1, 2, 3, 17, 1000, 1001, 4096, 4913, 65536, 65537, 1 << 20, (1 << 20) + 3]
QUICK_SIZES = [1, 2, 17, 1001, 4913]
# Extra dimensions per number of dimensions: the first dimension is the size.
TRAILING = {1: (), 2: (2,), 3: (1, 3)}
REDUCED = [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
           torch.uint8, torch.int8, torch.int16]
MOVED = REDUCED
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Relative tolerance of an inexact (averaged or scaled) float result.
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-6, torch.float64: 1e-13}


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, got, want, what, exact=True):
        ok = got.shape == want.shape and got.dtype == want.dtype
        if ok:
            if exact or not want.dtype.is_floating_point:
                ok = torch.equal(got, want)
            else:
                ok = torch.allclose(got.double(), want.double(), rtol=RTOL[want.dtype], atol=0)
        if ok:
            self.passed += 1
            return
        self.failed += 1
        detail = ""
        if got.shape == want.shape:
            bad = (got.double() - want.double()).abs().flatten()
            where = int(bad.argmax())
            detail = " (worst at flat index %d of %d: got %r, want %r)" % (
                where, bad.numel(), got.flatten()[where].item(), want.flatten()[where].item())
        print("FAILED rank %d: %s: got %s %s, want %s %s%s" % (
            hvd.rank(), what, got.dtype, tuple(got.shape), want.dtype, tuple(want.shape),
            detail), flush=True)


def value(rank, shape, dtype, device, low=-3, high=4, salt=0):
    g = torch.Generator().manual_seed(7919 * rank + salt)
    lo = 0 if dtype == torch.uint8 else low
    return torch.randint(lo, high, shape, generator=g, dtype=torch.int64).to(dtype).to(device)


def scaled(tensor, factor, on_gpu):
    """tensor * factor as Horovod computes it."""
    if not tensor.dtype.is_floating_point:
        return (tensor.double() * factor).to(tensor.dtype)  # toward zero
    if on_gpu:
        return tensor * float(torch.tensor(factor, dtype=tensor.dtype))
    wide = torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.dtype
    return (tensor.to(wide) * factor).to(tensor.dtype)


def allreduce_checks(tally, shape, dtype, device, n, on_gpu):
    inputs = [value(r, shape, dtype, device) for r in range(n)]
    mine = inputs[hvd.rank()]
    wide = torch.stack([t.to(torch.float64 if dtype.is_floating_point else torch.int64)
                        for t in inputs])
    label = "%s %s" % (str(dtype).replace("torch.", ""), list(shape))
    if dtype == torch.int16 and on_gpu:
        return  # NCCL has no 16-bit integers to reduce (nor does Horovod reduce int16)
    want_sum = wide.sum(0).to(dtype)
    tally.check(hvd.allreduce(mine, op=hvd.Sum), want_sum, "allreduce sum " + label)
    if dtype.is_floating_point:
        want_avg = (wide.sum(0) / n).to(dtype)
    else:
        want_avg = torch.div(wide.sum(0), n, rounding_mode="trunc").to(dtype)
    tally.check(hvd.allreduce(mine, op=hvd.Average), want_avg, "allreduce average " + label,
                exact=False)
    tally.check(hvd.allreduce(mine, op=hvd.Min), wide.min(0).values.to(dtype),
                "allreduce min " + label)
    tally.check(hvd.allreduce(mine, op=hvd.Max), wide.max(0).values.to(dtype),
                "allreduce max " + label)
    factors = [value(r, shape, dtype, device, low=-1, high=3, salt=1) for r in range(n)]
    want_prod = factors[0].to(torch.int64 if not dtype.is_floating_point else torch.float64)
    for f in factors[1:]:
        want_prod = want_prod * f.to(want_prod.dtype)
    tally.check(hvd.allreduce(factors[hvd.rank()], op=hvd.Product), want_prod.to(dtype),
                "allreduce product " + label)
    if dtype in (torch.uint8, torch.int8, torch.int16):
        return  # Horovod scales no 8/16-bit integers; Perseus does, tested in tests/unit
    pre, post = 0.5, 3.0
    pres = [scaled(t, pre, on_gpu) for t in inputs]
    summed = torch.stack([p.to(torch.float64 if dtype.is_floating_point else torch.int64)
                          for p in pres]).sum(0).to(dtype)
    tally.check(hvd.allreduce(mine, op=hvd.Sum, prescale_factor=pre, postscale_factor=post),
                scaled(summed, post, on_gpu), "allreduce sum pre/post " + label, exact=False)
    tally.check(hvd.allreduce(mine, op=hvd.Average, prescale_factor=pre, postscale_factor=post),
                scaled(summed, post / n, on_gpu), "allreduce average pre/post " + label,
                exact=False)


def move_checks(tally, size, trailing, dtype, device, n):
    me = hvd.rank()
    label = "%s %d x %s" % (str(dtype).replace("torch.", ""), size, list(trailing))
    rows = [max(size - r, 0) for r in range(n)]  # first dimensions differ by rank
    parts = [value(r, (rows[r],) + trailing, dtype, device) for r in range(n)]
    tally.check(hvd.allgather(parts[me]), torch.cat(parts), "allgather " + label)
    inputs = [value(r, (size,) + trailing, dtype, device, salt=2) for r in range(n)]
    tally.check(hvd.broadcast(inputs[me], n - 1), inputs[n - 1], "broadcast " + label)
    blocks = [value(r, (n * size,) + trailing, dtype, device, salt=3) for r in range(n)]
    want = torch.cat([blocks[r][me * size:(me + 1) * size] for r in range(n)])
    tally.check(hvd.alltoall(blocks[me]), want, "alltoall " + label)


def reducescatter_checks(tally, size, trailing, dtype, device, n):
    if dtype not in (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64):
        return  # Horovod's reducescatter dtypes
    me = hvd.rank()
    label = "%s %d x %s" % (str(dtype).replace("torch.", ""), size, list(trailing))
    inputs = [value(r, (n * size,) + trailing, dtype, device, salt=4) for r in range(n)]
    wide = torch.stack([t.to(torch.float64 if dtype.is_floating_point else torch.int64)
                        for t in inputs]).sum(0)
    first = n * size
    counts = [first // n + (1 if r < first % n else 0) for r in range(n)]
    start = sum(counts[:me])
    block = slice(start, start + counts[me])
    tally.check(hvd.reducescatter(inputs[me], op=hvd.Sum), wide[block].to(dtype),
                "reducescatter sum " + label)
    if dtype.is_floating_point:
        avg = (wide[block] / n).to(dtype)
    else:
        avg = torch.div(wide[block], n, rounding_mode="trunc").to(dtype)
    tally.check(hvd.reducescatter(inputs[me], op=hvd.Average), avg,
                "reducescatter average " + label, exact=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="host tensors (Gloo)")
    parser.add_argument("--quick", action="store_true", help="sizes up to 4913 only")
    args = parser.parse_args()
    hvd.init()
    n = hvd.size()
    on_gpu = not args.cpu
    if on_gpu:
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")
    tally = Tally()
    sizes = QUICK_SIZES if args.quick else SIZES
    for dims, trailing in TRAILING.items():
        for size in sizes:
            if dims > 1 and size > (1 << 16) + 1:
                continue  # the largest sizes in one dimension only: time
            shape = (size,) + trailing
            for dtype in REDUCED:
                allreduce_checks(tally, shape, dtype, device, n, on_gpu)
            for dtype in MOVED:
                move_checks(tally, size, trailing, dtype, device, n)
                reducescatter_checks(tally, size, trailing, dtype, device, n)
    print("rank %d of %d on %s: %d passed, %d failed -> %s" % (
        hvd.rank(), n, device, tally.passed, tally.failed, "PASS" if not tally.failed else "FAIL"),
        flush=True)
    hvd.shutdown()
    sys.exit(1 if tally.failed else 0)


if __name__ == "__main__":
    main()
