#!/usr/bin/env python3
"""perseus.torch (Horovod's API) and `import perseus` DDP on CUDA tensors, one rank (issue 7).

    perseusrun -np 1 -H localhost:1 python3 tests/gpu/torch_gpu_test.py [--cpu]

With one rank every collective's result is known from the input alone. Groups:

  ops        allreduce (Sum/Average/Min/Max/Product x 8 dtypes; allreduce_, _async, _async_,
             poll; autograd), prescale/postscale (out of place, in place, reducescatter):
             torch scales on the device and libperseus is given factors of 1 (a spy on
             perseus._native checks what was submitted), allgather, grouped_allgather,
             broadcast(_), alltoall (equal and with splits), reducescatter, grouped_allreduce
  optimizer  DistributedOptimizer steps of a small CUDA model = plain SGD (also with
             gradient_predivide_factor=2, which scales on the device and all-reduces the
             gradients in one bucket, and groups)
  syncbn     SyncBatchNorm forward/backward on CUDA = BatchNorm (the module, and its
             all-gather/all-reduce path called directly, since one rank takes the shortcut)
  compress   Compression.fp16/bf16 round trips = torch's casts; PERSEUS_ALLREDUCE_DTYPE=fp16 in
             DistributedOptimizer submits float16 (nothing on one rank: no hooks there)
  nancheck   PERSEUS_ALLREDUCE_NANCHECK=1 names the tensor (allreduce), the parameter
             (DistributedOptimizer) and the bucket (DDP)
  procset    a process set of this rank alone: allreduce (sync, async, in place and not, Sum and
             Average, float32/float16/int64, a 3-D odd shape), grouped_allreduce, allgather,
             broadcast, alltoall, reducescatter in it = the global set's results, on the
             tensor's device (a CUDA tensor in a process set goes through host memory)
  ddp        `import perseus` + DistributedDataParallel on CUDA (nccl process group): the
             hook ran (perseus.ddp_stats()), parameters = one process; with
             PERSEUS_ALLREDUCE_DTYPE=fp16 every bucket went as float16

--cpu runs the same on CPU tensors (gloo), to check the script where there is no GPU. Prints a
line per group and "torch_gpu: N checks passed"; exits 1 on any failure.
"""
import perseus  # noqa: I001 - first: DDP goes through Perseus

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "shims", "ranks"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import perseus.torch as hvd  # noqa: E402
from perseus import _native  # noqa: E402
from perseus.torch.sync_batch_norm import _SyncBatchNormFunction, _function_for  # noqa: E402
from common import Checks  # noqa: E402

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]
# (name, dtype code, prescale, postscale, device) of every all-reduce handed to libperseus:
# _native.allreduce_async, and _native.allreduce (a blocking host all-reduce is one call).
submitted = []


def _spy(original):
    def spy(send, recv, count, dtype, op, prescale=1.0, postscale=1.0, name=None, device=-1,
            *rest, **kwargs):
        submitted.append((name, dtype, prescale, postscale, device))
        return original(send, recv, count, dtype, op, prescale, postscale, name, device, *rest,
                        **kwargs)
    return spy


_native.allreduce_async = _spy(_native.allreduce_async)
_native.allreduce = _spy(_native.allreduce)


def data(shape, dtype, dev, salt=0):
    g = torch.Generator().manual_seed(salt)
    if dtype.is_floating_point:
        t = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    else:
        t = torch.randint(0 if dtype == torch.uint8 else -4, 5, shape, generator=g)
    return t.to(dtype).to(dev)


def make_model(dev, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4)).to(dev)


def batches(dev, steps=4):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 8, generator=g).to(dev), torch.randint(0, 4, (16,), generator=g)
             .to(dev)) for _ in range(steps)]


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def same_params(check, a, b, what, tol=1e-6):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        check.close(p.detach(), q.detach(), "%s: %s" % (what, name), rtol=tol, atol=tol)


def poison(grad):
    grad = grad.clone()
    grad.view(-1)[1] = float("nan")
    return grad


def group_ops(check, dev):
    on_dev = lambda t: t.device.type == dev.type  # noqa: E731
    for dtype in FLOATS + INTS:
        x = data((3, 5), dtype, dev, 1)
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            out = hvd.allreduce(x, op=op, name="ar.%s.%d" % (dtype, op))
            check.close(out, x, "allreduce %s op %d" % (dtype, op), rtol=0, atol=0)
            check(on_dev(out), "allreduce %s result on %s" % (dtype, dev))
    x = data((1001,), torch.float32, dev, 2)
    y = x.clone()
    check(hvd.allreduce_(y, op=hvd.Sum, name="inplace") is y, "allreduce_ returns its tensor")
    check.close(y, x, "allreduce_")
    h = hvd.allreduce_async(x, name="async")
    while not hvd.poll(h):
        time.sleep(0.001)
    check.close(hvd.synchronize(h), x, "allreduce_async + poll")
    y = x.clone()
    check.close(hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Max)), x, "allreduce_async_")
    a = x.clone().requires_grad_()
    hvd.allreduce(a, op=hvd.Sum, name="grad").sum().backward()
    check.close(a.grad, torch.ones_like(x), "allreduce backward")

    # Scale factors: torch scales device tensors; libperseus must be handed 1.0 and 1.0.
    submitted.clear()
    check.close(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                              name="scaled"), x * 1.5, "allreduce prescale/postscale", rtol=1e-6)
    y = x.clone()
    hvd.allreduce_(y, op=hvd.Average, prescale_factor=4.0, postscale_factor=0.125,
                   name="scaled_")
    check.close(y, x * 0.5, "allreduce_ prescale/postscale", rtol=1e-6)
    h16 = data((64,), torch.float16, dev, 3)
    check.close(hvd.allreduce(h16, op=hvd.Sum, prescale_factor=2.0, name="scaled16"), h16 * 2,
                "float16 prescale", rtol=1e-3, atol=1e-3)
    scales = [(p, q) for name, _, p, q, _ in submitted if name and name.startswith("scaled")]
    if dev.type == "cuda":
        check(scales == [(1.0, 1.0)] * 3, "device all-reduces reach libperseus unscaled: %s"
              % scales)
    else:
        check(scales == [(0.5, 3.0), (4.0, 0.125), (2.0, 1.0)], "host scales: %s" % scales)
    rs_in = data((5, 3), torch.float32, dev, 4)
    check.close(hvd.reducescatter(rs_in, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                                  name="rs.scaled"), rs_in * 0.5, "reducescatter scaled",
                rtol=1e-6)

    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8, torch.bool):
        t = data((3, 4), torch.int64, dev, 5) > 0 if dtype == torch.bool else \
            data((3, 4), dtype, dev, 5)
        out = hvd.allgather(t, name="ag.%s" % dtype)
        check.close(out, t, "allgather %s" % dtype, rtol=0, atol=0)
        check(on_dev(out), "allgather result on %s" % dev)
    ga = hvd.grouped_allgather([data((2,), torch.int32, dev, 6), data((2, 2), torch.float64,
                                                                     dev, 7)], name="gag")
    check.close(ga[1], data((2, 2), torch.float64, dev, 7), "grouped_allgather")
    t = data((7,), torch.float32, dev, 8)
    check.close(hvd.broadcast(t, 0, name="bc"), t, "broadcast")
    u = data((2, 3), torch.int64, dev, 9)
    v = u.clone()
    hvd.broadcast_(v, 0, name="bc_")
    check.close(v, u, "broadcast_")
    check.close(hvd.synchronize(hvd.broadcast_async(t, 0)), t, "broadcast_async")
    a2a = data((4, 3), torch.float32, dev, 10)
    out = hvd.alltoall(a2a, name="a2a")
    check.close(out, a2a, "alltoall")
    check(on_dev(out), "alltoall result on %s" % dev)
    out, received = hvd.alltoall(a2a, splits=[4], name="a2av")
    check.close(out, a2a, "alltoall splits")
    check(received.tolist() == [4], "alltoall received splits")
    rs = data((5, 3), torch.float32, dev, 11)
    check.close(hvd.reducescatter(rs, op=hvd.Sum, name="rs"), rs, "reducescatter sum")
    check.close(hvd.reducescatter(rs, name="rs.avg"), rs, "reducescatter average")
    ts = [data((i + 1, 2), torch.float32, dev, 12 + i) for i in range(3)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grouped")
    for i in range(3):
        check.close(outs[i], ts[i], "grouped_allreduce %d" % i)
    copies = [t.clone() for t in ts]
    hvd.grouped_allreduce_(copies, op=hvd.Average, postscale_factor=2.0, name="grouped_")
    for i in range(3):
        check.close(copies[i], ts[i] * 2, "grouped_allreduce_ postscale %d" % i)
    hvd.barrier()


def group_procset(check, dev):
    # libperseus's process sets move host memory, so on CUDA each of these is staged through a
    # CPU copy (ops._staged): the results must equal the global set's and come back on dev.
    ps = hvd.add_process_set([0])
    on_dev = lambda t: t.device.type == dev.type  # noqa: E731
    try:
        for dtype in (torch.float32, torch.float16, torch.int64):
            x = data((3, 5, 7), dtype, dev, 20)
            for op in (hvd.Sum, hvd.Average) if dtype.is_floating_point else (hvd.Sum,):
                what = "process set %s op %d" % (dtype, op)
                ref = hvd.allreduce(x, op=op, name="ps.ref.%s.%d" % (dtype, op))
                out = hvd.allreduce(x, op=op, name="ps.ar.%s.%d" % (dtype, op), process_set=ps)
                check.close(out, ref, "allreduce " + what, rtol=0, atol=0)
                check(on_dev(out) and out.shape == x.shape, "allreduce %s on %s" % (what, dev))
                # In place, the result must differ from the input (at one rank a Sum or an
                # Average is the input itself): a postscale of 2, exact in every float dtype,
                # so that a staged result not copied back shows.
                post = 2.0 if dtype.is_floating_point else 1.0
                scaled_ref = hvd.allreduce(x, op=op, postscale_factor=post,
                                           name="ps.ref2.%s.%d" % (dtype, op))
                check(not dtype.is_floating_point or not torch.equal(scaled_ref, x),
                      "the in-place reference differs from the input: " + what)
                y = x.clone()
                check(hvd.allreduce_(y, op=op, postscale_factor=post, process_set=ps) is y,
                      "allreduce_ " + what)
                check.close(y, scaled_ref, "allreduce_ " + what, rtol=0, atol=0)
                h = hvd.allreduce_async(x, op=op, name="ps.async.%s.%d" % (dtype, op),
                                        process_set=ps)
                out = hvd.synchronize(h)
                check.close(out, ref, "allreduce_async " + what, rtol=0, atol=0)
                check(on_dev(out), "allreduce_async %s on %s" % (what, dev))
                y = x.clone()
                h = hvd.allreduce_async_(y, op=op, postscale_factor=post, process_set=ps)
                check(hvd.synchronize(h) is y, "allreduce_async_ %s returns its tensor" % what)
                check.close(y, scaled_ref, "allreduce_async_ " + what, rtol=0, atol=0)
            check.close(x, data((3, 5, 7), dtype, dev, 20), "process set %s: input unchanged"
                        % dtype, rtol=0, atol=0)
        scaled = hvd.allreduce(data((9,), torch.float32, dev, 21), op=hvd.Sum,
                               prescale_factor=2.0, postscale_factor=0.25, process_set=ps)
        check.close(scaled, data((9,), torch.float32, dev, 21) * 0.5,
                    "process set prescale/postscale", rtol=1e-6)
        ts = [data((i + 2, 3), torch.float32, dev, 22 + i) for i in range(3)]
        outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="ps.grouped", process_set=ps)
        for i in range(3):
            check.close(outs[i], ts[i], "process set grouped_allreduce %d" % i)
            check(on_dev(outs[i]), "process set grouped_allreduce %d on %s" % (i, dev))
        t = data((4, 3), torch.int32, dev, 25)
        out = hvd.allgather(t, name="ps.ag", process_set=ps)
        check.close(out, t, "process set allgather", rtol=0, atol=0)
        check(on_dev(out), "process set allgather on %s" % dev)
        v = data((2, 3, 5), torch.float64, dev, 26)
        w = torch.zeros_like(v) if ps.rank() != 0 else v.clone()
        hvd.broadcast_(w, 0, name="ps.bc_", process_set=ps)
        check.close(w, v, "process set broadcast_", rtol=0, atol=0)
        out = hvd.alltoall(v, name="ps.a2a", process_set=ps)
        check.close(out, v, "process set alltoall", rtol=0, atol=0)
        check(on_dev(out), "process set alltoall on %s" % dev)
        out = hvd.reducescatter(v, op=hvd.Sum, name="ps.rs", process_set=ps)
        check.close(out, v, "process set reducescatter", rtol=0, atol=0)
        check(on_dev(out), "process set reducescatter on %s" % dev)
    finally:
        hvd.remove_process_set(ps)


def group_optimizer(check, dev):
    data = batches(dev)
    ref = make_model(dev)
    train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), data)
    for kwargs in ({}, {"gradient_predivide_factor": 2.0}, {"groups": 2}):
        model = make_model(dev)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters(), **kwargs)
        submitted.clear()
        train(model, opt, data)
        same_params(check, model, ref, "DistributedOptimizer %s" % kwargs, 1e-5)
        # One rank, as Horovod's: no hooks, and synchronize() submits nothing, scale factors or
        # not (the gradients are already the job's).
        names = {name for name, *_ in submitted}
        check(not names, "DistributedOptimizer %s on one rank submits nothing (got %s)"
              % (kwargs, names))
        check(all(p.device.type == dev.type for p in model.parameters()), "model stays on device")


def group_syncbn(check, dev):
    for dims in (2, 4):
        g = torch.Generator().manual_seed(5)
        shape = (6, 4) + ((3, 3) if dims == 4 else ())
        x = (torch.randn(shape, generator=g) * 3 + 1).to(dev)
        w_out = torch.randn(shape, generator=g).to(dev)
        bn = (nn.BatchNorm2d(4) if dims == 4 else nn.BatchNorm1d(4)).to(dev)
        sbn = hvd.SyncBatchNorm(4).to(dev)
        xa = x.clone().requires_grad_()
        ref = bn(xa)
        (ref * w_out).sum().backward()
        xs = x.clone().requires_grad_()
        out = sbn(xs)
        (out * w_out).sum().backward()
        what = "SyncBatchNorm %dD on %s" % (dims, dev)
        check.close(out.detach(), ref.detach(), what + " output", rtol=1e-4, atol=1e-5)
        check.close(xs.grad, xa.grad, what + " input grad", rtol=1e-4, atol=1e-5)
        check.close(sbn.running_mean, bn.running_mean, what + " running_mean", rtol=1e-4)
        # The all-gather / all-reduce paths themselves (one rank takes the shortcut above):
        # the portable one, and on CUDA the one through torch's batch-norm kernels.
        functions = [_SyncBatchNormFunction]
        if _function_for(x) is not _SyncBatchNormFunction:
            functions.append(_function_for(x))
        check(len(functions) == (2 if dev.type == "cuda" else 1),
              what + ": torch's CUDA batch-norm kernels used where there are any")
        for function in functions:
            sync_path(check, x, w_out, dims, dev, function,
                      "%s (%s)" % (what, function.__name__))


def sync_path(check, x, w_out, dims, dev, function, what):
    bn2 = (nn.BatchNorm2d(4) if dims == 4 else nn.BatchNorm1d(4)).to(dev)
    with torch.no_grad():
        bn2.weight.copy_(torch.linspace(0.5, 2, 4))
        bn2.bias.copy_(torch.linspace(-1, 1, 4))
    weight = bn2.weight.detach().clone().requires_grad_()
    bias = bn2.bias.detach().clone().requires_grad_()
    rm, rv = torch.zeros(4, device=dev), torch.ones(4, device=dev)
    xa = x.clone().requires_grad_()
    ref = bn2(xa)
    (ref * w_out).sum().backward()
    xs = x.clone().requires_grad_()
    out = function.apply(xs, weight, bias, (rm, rv), 0.1, 1e-5)
    (out * w_out).sum().backward()
    check(out.device.type == dev.type, what + " on device")
    check.close(out.detach(), ref.detach(), what + " output", rtol=1e-4, atol=1e-5)
    check.close(xs.grad, xa.grad, what + " input grad", rtol=1e-4, atol=1e-4)
    check.close(weight.grad, bn2.weight.grad, what + " weight grad", rtol=1e-4, atol=1e-4)
    check.close(bias.grad, bn2.bias.grad, what + " bias grad", rtol=1e-4, atol=1e-4)
    check.close(rm, bn2.running_mean, what + " running_mean", rtol=1e-4, atol=1e-6)
    check.close(rv, bn2.running_var, what + " running_var", rtol=1e-4, atol=1e-6)


def group_compress(check, dev):
    x = data((4096,), torch.float32, dev, 20) * 100
    check.close(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16, name="c16"),
                x.half().float(), "Compression.fp16 round trip", rtol=0, atol=0)
    check.close(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16, name="cbf16"),
                x.bfloat16().float(), "Compression.bf16 round trip", rtol=0, atol=0)
    data_ = batches(dev)
    ref = make_model(dev)
    train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), data_)
    for env, code, tol in (("fp16", _native.DTYPES["float16"], 5e-3),
                           ("bf16", _native.DTYPES["bfloat16"], 3e-2)):
        os.environ["PERSEUS_ALLREDUCE_DTYPE"] = env
        submitted.clear()
        model = make_model(dev)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters())
        train(model, opt, data_)
        codes = {c for name, c, _, _, _ in submitted if name and name.startswith("allreduce.")}
        # One rank: DistributedOptimizer takes no hooks and submits nothing (as Horovod's), and
        # leaves the gradients untouched (no float16/bfloat16 round trip).
        want = {code} if hvd.size() > 1 else set()
        check(codes == want, "PERSEUS_ALLREDUCE_DTYPE=%s submits %s" % (env, codes))
        same_params(check, model, ref, "DistributedOptimizer PERSEUS_ALLREDUCE_DTYPE=" + env, tol)
    del os.environ["PERSEUS_ALLREDUCE_DTYPE"]


def group_nancheck(check, dev):
    os.environ["PERSEUS_ALLREDUCE_NANCHECK"] = "1"
    bad = data((100,), torch.float32, dev, 30)
    bad[7] = float("inf")
    check.raises(hvd.NonFiniteError, lambda: hvd.allreduce(bad, name="layer3.grad"),
                 "allreduce NaN check", ["'layer3.grad'", "Inf", "already had it", str(dev)])
    model = make_model(dev)
    model[2].bias.register_hook(poison)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    check.raises(hvd.NonFiniteError, lambda: train(model, opt, batches(dev, 1)),
                 "DistributedOptimizer NaN check", ["parameter '2.bias'", "NaN"])
    check.close(hvd.allreduce(bad.nan_to_num(), name="fine"), bad.nan_to_num(),
                "a finite tensor passes")
    del os.environ["PERSEUS_ALLREDUCE_NANCHECK"]


def group_ddp(check, dev):
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    data = batches(dev)
    ref = make_model(dev)
    train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), data)
    ids = [dev.index or 0] if dev.type == "cuda" else None
    for env, tol in ((None, 1e-6), ("fp16", 5e-3)):
        if env:
            os.environ["PERSEUS_ALLREDUCE_DTYPE"] = env
        before = perseus.ddp_stats()
        model = DDP(make_model(dev), device_ids=ids, bucket_cap_mb=0.01)
        train(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), data)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        stats = perseus.ddp_stats()
        check(stats["models"] == before["models"] + 1, "DDP uses Perseus: %s" % stats)
        if dist.get_world_size() == 1:
            # One rank: no hook, DDP as without Perseus, nothing cast.
            check(stats["alone"] == before["alone"] + 1 and stats["buckets"] == before["buckets"],
                  "DDP alone: no hook: %s" % stats)
            tol = 1e-6
        else:
            check(stats["buckets"] - before["buckets"] >= len(data),
                  "buckets went through Perseus: %s" % stats)
        if env and dist.get_world_size() > 1:
            check(stats["compressed"] - before["compressed"] == stats["buckets"]
                  - before["buckets"], "every bucket as float16: %s" % stats)
        same_params(check, model.module, ref, "DDP %s" % (env or "fp32"), tol)
        os.environ.pop("PERSEUS_ALLREDUCE_DTYPE", None)
        del model
    os.environ["PERSEUS_ALLREDUCE_NANCHECK"] = "1"
    model = DDP(make_model(dev), device_ids=ids, bucket_cap_mb=0.01)
    model.module[4].weight.register_hook(poison)
    x, y = data[0]
    check.raises(Exception, lambda: nn.functional.cross_entropy(model(x), y).backward(),
                 "DDP NaN check", ["DDP gradient bucket", "4.weight", "NaN"])
    del os.environ["PERSEUS_ALLREDUCE_NANCHECK"]
    del model
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU tensors (no GPU needed)")
    args = parser.parse_args()
    hvd.init()
    check = Checks("torch_gpu")
    if args.cpu:
        dev = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device (use --cpu)")
        torch.cuda.set_device(hvd.local_rank())
        dev = torch.device("cuda", hvd.local_rank())
        check(hvd.nccl_built(), "perseus_nccl_built() on the GPU machine")
        print("device: %s (%s), torch %s, libperseus %s" % (
            dev, torch.cuda.get_device_name(dev), torch.__version__, _native.library_path()),
            flush=True)
    check(hvd.size() == 1, "one rank (this script's references assume it)")
    for name, fn in (("ops", group_ops), ("procset", group_procset),
                     ("optimizer", group_optimizer),
                     ("syncbn", group_syncbn), ("compress", group_compress),
                     ("nancheck", group_nancheck), ("ddp", group_ddp)):
        failed, passed = len(check.failed), check.passed
        start = time.time()
        try:
            fn(check, dev)
        except Exception as e:  # noqa: BLE001 - reported as a failure of the group
            import traceback
            traceback.print_exc()
            check(False, "%s raised %s: %s" % (name, type(e).__name__, e))
        print("%-10s %3d passed, %d failed (%.1f s)" % (
            name, check.passed - passed, len(check.failed) - failed, time.time() - start),
            flush=True)
    hvd.shutdown()
    check.finish()


if __name__ == "__main__":
    main()
