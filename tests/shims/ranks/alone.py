"""perseus.torch in a process that no launcher started (run as `python alone.py`): a job of one
rank, as in Horovod. Every operation on CPU tensors (and CUDA tensors when there is a GPU and
NCCL) of every dtype and odd shapes gives back its input; a process set of rank 0; join;
shutdown and init again."""
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
