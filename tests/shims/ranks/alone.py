"""perseus.torch in a process that no launcher started (run as `python alone.py`): a job of one
rank, as in Horovod. Every operation on CPU tensors (and CUDA tensors when there is a GPU and
NCCL) of every dtype and odd shapes gives back its input; a process set of rank 0; join;
shutdown and init again. DistributedOptimizer and DDP (with `import perseus`) on one rank take
their shortcut (no hooks, no library call) and give what the plain optimizer gives: for
DistributedOptimizer, as Horovod's at one rank, the gradients untouched (no compression's round
trip, no scaling, an unused parameter's gradient left None); for DDP, after
PERSEUS_ALLREDUCE_DTYPE's float16/bfloat16 round trip."""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import perseus.torch.horovod as hvd  # noqa: E402
from common import Checks, run  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64]
SHAPES = [(1,), (7,), (3, 5), (13, 1, 3), (0, 4)]
OPS = [("sum", hvd.Sum), ("avg", hvd.Average), ("min", hvd.Min), ("max", hvd.Max),
       ("prod", hvd.Product)]


def data(shape, dtype, salt):
    g = torch.Generator().manual_seed(salt)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    low = 0 if dtype == torch.uint8 else -9
    return torch.randint(low, 10, shape, generator=g, dtype=torch.int64).to(dtype)


def same(check, got, want, what):
    ok = got.dtype == want.dtype and got.shape == want.shape and got.device == want.device and \
        torch.equal(got.cpu(), want.cpu())
    check(ok, "%s: got %s %s %s, expected %s %s" % (what, got.dtype, tuple(got.shape), got.device,
                                                   want.dtype, tuple(want.shape)))


def every_op(check, device, dtypes):
    for dtype in dtypes:
        for shape in SHAPES:
            x = data(shape, dtype, hash((str(dtype), shape)) % 1000).to(device)
            tag = "%s %s %s" % (device, dtype, shape)
            for label, op in OPS:
                same(check, hvd.allreduce(x, op=op, name="ar.%s.%s" % (tag, label)), x,
                     "allreduce %s %s" % (label, tag))
            y = x.clone()
            hvd.allreduce_(y, op=hvd.Average, name="ar_.%s" % tag)
            same(check, y, x, "allreduce_ average " + tag)
            outs = hvd.grouped_allreduce([x, x.clone()], op=hvd.Sum, name="gar.%s" % tag)
            same(check, outs[1], x, "grouped_allreduce " + tag)
            same(check, hvd.allgather(x, name="ag.%s" % tag), x, "allgather " + tag)
            b = hvd.broadcast(x, 0, name="bc.%s" % tag)
            same(check, b, x, "broadcast " + tag)
            check(b.data_ptr() != x.data_ptr() or x.numel() == 0, "broadcast copies " + tag)
            z = x.clone()
            hvd.broadcast_(z, 0, name="bc_.%s" % tag)
            same(check, z, x, "broadcast_ " + tag)
            if device == "cpu" or dtype != torch.int16:  # NCCL has no 16-bit integers
                same(check, hvd.alltoall(x, name="a2a.%s" % tag), x, "alltoall " + tag)
                out, received = hvd.alltoall(x, splits=[x.shape[0]], name="a2as.%s" % tag)
                same(check, out, x, "alltoall with splits " + tag)
                check(received.tolist() == [x.shape[0]], "alltoall received splits " + tag)
                _, received = hvd.alltoall(x, splits=torch.tensor([x.shape[0]], dtype=torch.int32,
                                                                  device=x.device))
                check(received.device == x.device and received.tolist() == [x.shape[0]],
                      "received splits where the splits tensor is, " + tag)
                for label, op in [("sum", hvd.Sum), ("avg", hvd.Average)]:
                    same(check, hvd.reducescatter(x, op=op, name="rs.%s.%s" % (tag, label)), x,
                         "reducescatter %s %s" % (label, tag))
    x = data((11,), torch.float64, 5).to(device)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=6.0)
    check(torch.allclose(got, x * 3.0), "allreduce prescale 0.5, postscale 6 on %s" % device)


def process_set_of_zero(check):
    ps = hvd.add_process_set([0])
    check(ps.size() == 1 and ps.rank() == 0 and ps.included(), "process set [0]: its place")
    x = data((5, 3), torch.float32, 9)
    same(check, hvd.allreduce(x, op=hvd.Average, process_set=ps), x, "allreduce in set [0]")
    same(check, hvd.allgather(x, process_set=ps), x, "allgather in set [0]")
    same(check, hvd.broadcast(x, 0, process_set=ps), x, "broadcast in set [0]")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and hvd.nccl_built() else [])
    for device in devices:  # CUDA tensors in a set go through host memory, and come back
        y = x.to(device)
        same(check, hvd.alltoall(y, process_set=ps), y, "alltoall in set [0] on " + device)
        same(check, hvd.reducescatter(y, op=hvd.Sum, process_set=ps), y,
             "reducescatter in set [0] on " + device)
        same(check, hvd.allreduce(y, op=hvd.Sum, process_set=ps), y,
             "allreduce in set [0] on " + device)
        same(check, hvd.allgather(y, process_set=ps), y, "allgather in set [0] on " + device)
        z = y.clone()
        hvd.broadcast_(z, 0, process_set=ps)
        same(check, z, y, "broadcast_ in set [0] on " + device)
        z = y.clone()
        hvd.allreduce_(z, op=hvd.Average, process_set=ps)
        same(check, z, y, "allreduce_ in set [0] on " + device)
        g = y.clone().requires_grad_()
        hvd.allreduce(g, op=hvd.Sum, process_set=ps).sum().backward()
        same(check, g.grad, torch.ones_like(y), "allreduce grad in set [0] on " + device)
        hvd.barrier(process_set=ps)


class Net(torch.nn.Module):
    def __init__(self, unused):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(),
                                       torch.nn.Linear(7, 3))
        if unused:  # no gradient (on more ranks the optimizer all-reduces zeros for it)
            self.unused = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.net(x)


def model(seed, unused=True):
    torch.manual_seed(seed)
    return Net(unused)


def batches(steps, passes):
    g = torch.Generator().manual_seed(11)
    return [[(torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g))
             for _ in range(passes)] for _ in range(steps)]


def reference(data, round_to, zero_unused, unused=None):
    """The plain SGD, each gradient rounded through `round_to` (None: kept) before the step; a
    model with an unused layer where `unused` (default: zero_unused), whose gradient is zeros
    where zero_unused, else None."""
    m = model(3, unused=zero_unused if unused is None else unused)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for step in data:
        opt.zero_grad()
        for x, y in step:
            torch.nn.functional.mse_loss(m(x), y).backward()
        for p in m.parameters():
            if p.grad is None and zero_unused:
                p.grad = torch.zeros_like(p)
            if p.grad is not None and round_to is not None:
                p.grad.copy_(p.grad.to(round_to).float())
        opt.step()
    return m


def optimizer_alone(check):
    # As Horovod's at one rank: the gradients untouched whatever the compression (no float16
    # round trip), and the unused layer's gradient left None (the plain SGD skips it).
    compressions = [("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16)]
    if hasattr(hvd.Compression, "bf16"):
        compressions.append(("bf16", hvd.Compression.bf16))
    for label, compression in compressions:
        for passes, groups in [(1, None), (2, None), (1, 2)]:
            what = "DistributedOptimizer alone, %s, %d passes, groups %s" % (label, passes, groups)
            data = batches(3, passes)
            m = model(3)
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01),
                named_parameters=m.named_parameters(), compression=compression,
                backward_passes_per_step=passes, groups=groups)
            check(opt._grad_accs == [], what + ": hooks registered")
            for step in data:
                opt.zero_grad()
                for x, y in step:
                    torch.nn.functional.mse_loss(m(x), y).backward()
                opt.step()
            check(all(p.grad is None for p in m.unused.parameters()),
                  what + ": the unused layer got a gradient")
            want = reference(data, None, zero_unused=False, unused=True)
            for (name, got), expected in zip(m.named_parameters(), want.parameters()):
                check(torch.equal(got, expected), "%s: %s differs from the plain SGD's by %g"
                      % (what, name, (got - expected).abs().max()))
    # Scaling factors change nothing on one rank (Horovod's submits nothing there either).
    data = batches(2, 1)
    m = model(3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters(),
                                   gradient_predivide_factor=2.0)
    for step in data:
        opt.zero_grad()
        for x, y in step:
            torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    want = model(3)
    plain = torch.optim.SGD(want.parameters(), lr=0.1)
    for step in data:
        plain.zero_grad()
        for x, y in step:
            torch.nn.functional.mse_loss(want(x), y).backward()
        plain.step()
    for got, expected in zip(m.parameters(), want.parameters()):
        check(torch.equal(got, expected),
              "DistributedOptimizer alone, predivide 2: differs by %g"
              % (got - expected).abs().max())


def ddp_alone(check):
    # A job of one rank: no hook (as Horovod registers none), so DDP runs as without Perseus and
    # the parameters are bit-equal to the plain SGD's, PERSEUS_ALLREDUCE_DTYPE or not (nothing
    # travels, nothing is cast). Under the NaN check the hook stays and checks each bucket.
    import perseus
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for dtype in ["", "bf16", "fp16"]:
            os.environ["PERSEUS_ALLREDUCE_DTYPE"] = dtype
            data = batches(3, 1)
            m = model(3, unused=False)  # DDP wants every parameter used
            ddp = torch.nn.parallel.DistributedDataParallel(m)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
            before = perseus.ddp_stats()
            for step in data:
                opt.zero_grad()
                for x, y in step:
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            after = perseus.ddp_stats()
            check(after["models"] == before["models"] + 1 and
                  after["alone"] == before["alone"] + 1 and after["buckets"] == before["buckets"],
                  "DDP alone %r: counted as alone, no bucket hooked: %s" % (dtype, after))
            want = reference(data, None, zero_unused=False)
            for got, expected in zip(m.parameters(), want.parameters()):
                check(torch.equal(got, expected), "DDP alone %r: differs from the plain SGD's by %g"
                      % (dtype, (got - expected).abs().max()))
            del ddp
        os.environ["PERSEUS_ALLREDUCE_DTYPE"] = ""
        os.environ["PERSEUS_ALLREDUCE_NANCHECK"] = "1"
        m = model(3, unused=False)
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        (x, y), = batches(1, 1)[0]
        before = perseus.ddp_stats()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        check(perseus.ddp_stats()["buckets"] > before["buckets"],
              "DDP alone under the NaN check: the hook checks the buckets")
        bad = x.clone()
        bad[0, 0] = float("nan")
        check.raises(Exception, lambda: torch.nn.functional.mse_loss(ddp(bad), y).backward(),
                     "DDP alone: a NaN gradient", ["DDP gradient bucket", "NaN"])
        del ddp
    finally:
        os.environ.pop("PERSEUS_ALLREDUCE_DTYPE", None)
        os.environ.pop("PERSEUS_ALLREDUCE_NANCHECK", None)
        dist.destroy_process_group()


def main():
    check = Checks("alone")
    for round_ in range(2):
        hvd.init()
        check((hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
               hvd.cross_size()) == (0, 1, 0, 1, 0, 1), "a job of one rank, round %d" % round_)
        every_op(check, "cpu", DTYPES)
        if torch.cuda.is_available() and hvd.nccl_built():
            every_op(check, "cuda", [d for d in DTYPES if d != torch.int16])
            print("alone: ran on cuda too", flush=True)
        if round_ == 0:
            process_set_of_zero(check)
            optimizer_alone(check)
            ddp_alone(check)
        check(hvd.broadcast_object({"a": [1, 2]}, 0) == {"a": [1, 2]}, "broadcast_object")
        check(hvd.allgather_object(7) == [7], "allgather_object")
        hvd.barrier()
        check(hvd.join() == 0, "join: rank 0 is the last to join")
        hvd.shutdown()
        check(not hvd.is_initialized(), "shut down, round %d" % round_)
        check(threading.active_count() == 1, "no thread left, round %d" % round_)
    check.finish()


if __name__ == "__main__":
    run(main)
