"""Every call of perseus.torch's Horovod API against a reference each rank computes itself
(inputs are seeded by rank, so each rank knows what every rank contributed)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import perseus.torch.horovod as hvd  # noqa: E402
from common import Checks, run  # noqa: E402

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]


def data(r, shape, dtype, salt=0, low=-4, high=5):
    g = torch.Generator().manual_seed(1000 * r + salt)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    lo = 0 if dtype == torch.uint8 else low
    return torch.randint(lo, high, shape, generator=g, dtype=torch.int64).to(dtype)


def expected_place(env):
    """This rank's place as its launcher gave it: perseusrun's PERSEUS_* variables; srun's
    SLURM_* (the same number of tasks on every node); or torch's RANK and WORLD_SIZE, every
    process on this one machine (Kubeflow's PyTorchJob as the tests start it)."""
    keys = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
    if "PERSEUS_SIZE" in env:
        return {k: int(env["PERSEUS_" + k]) for k in keys}
    if "SLURM_PROCID" in env:
        size, nodes = int(env["SLURM_NTASKS"]), int(env["SLURM_STEP_NUM_NODES"])
        return dict(zip(keys, (int(env["SLURM_PROCID"]), size, int(env["SLURM_LOCALID"]),
                               size // nodes, int(env["SLURM_NODEID"]), nodes)))
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    return dict(zip(keys, (rank, size, rank, size, 0, 1)))


def autograd_of_the_other_ops(check, n, me):
    """Gradients of the grouped operations and of reducescatter, as Horovod defines them."""
    rows = 2 * n
    for dtype in (torch.float32, torch.float64):
        # grouped_allreduce: the same grouped all-reduce of the gradients.
        xs = [data(me, (3,), dtype, 50).requires_grad_(), data(me, (2, 2), dtype, 51)
              .requires_grad_()]
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
        (outs[0].sum() + 2 * outs[1].sum()).backward()
        check.close(xs[0].grad, torch.full((3,), float(n), dtype=dtype), "grouped_allreduce grad")
        check.close(xs[1].grad, torch.full((2, 2), 2.0 * n, dtype=dtype),
                    "grouped_allreduce grad 1")
        xs = [data(me, (3,), dtype, 52).requires_grad_()]
        hvd.grouped_allreduce(xs, op=hvd.Average)[0].sum().backward()
        check.close(xs[0].grad, torch.ones(3, dtype=dtype), "grouped_allreduce Average grad")
        # grouped_allgather: the ranks' average gradient, this rank's rows.
        xs = [data(me, (me + 1, 2), dtype, 53).requires_grad_(), data(me, (2,), dtype, 54)
              .requires_grad_()]
        outs = hvd.grouped_allgather(xs)
        w0 = torch.arange(outs[0].numel(), dtype=dtype).reshape(outs[0].shape)
        ((outs[0] * w0).sum() + (outs[1] * 3).sum()).backward()
        start = sum(r + 1 for r in range(me))
        check.close(xs[0].grad, w0[start:start + me + 1], "grouped_allgather grad")
        check.close(xs[1].grad, torch.full((2,), 3.0, dtype=dtype), "grouped_allgather grad 1")
        # reducescatter: gathered output gradients, times the size for Sum.
        for op, factor in ((hvd.Sum, n), (hvd.Average, 1)):
            x = data(me, (rows, 3), dtype, 55).requires_grad_()
            hvd.reducescatter(x, op=op).sum().backward()
            check.close(x.grad, torch.full((rows, 3), float(factor), dtype=dtype),
                        "reducescatter grad op %d" % op)
        x = data(me, (rows + 1, 2), dtype, 56).requires_grad_()
        out = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5)
        w = torch.arange(2 * (rows + 1), dtype=dtype).reshape(rows + 1, 2)
        share = [(rows + 1) // n + (1 if r < (rows + 1) % n else 0) for r in range(n)]
        s0 = sum(share[:me])
        (out * w[s0:s0 + share[me]]).sum().backward()
        check.close(x.grad, w * n * 0.5, "reducescatter grad, odd rows, prescale")
        xs = [data(me, (rows, 2), dtype, 57).requires_grad_()]
        hvd.grouped_reducescatter(xs, op=hvd.Sum)[0].sum().backward()
        check.close(xs[0].grad, torch.full((rows, 2), float(n), dtype=dtype),
                    "grouped_reducescatter grad")


def main():
    check = Checks("api")
    check(not hvd.is_initialized(), "is_initialized before init")
    hvd.init()
    check(hvd.is_initialized(), "is_initialized after init")
    n, me = hvd.size(), hvd.rank()
    want = expected_place(os.environ)
    check(n == want["SIZE"] and me == want["RANK"], "size/rank")
    check(hvd.local_rank() == want["LOCAL_RANK"], "local_rank")
    check(hvd.local_size() == want["LOCAL_SIZE"], "local_size")
    check(hvd.cross_rank() == want["CROSS_RANK"], "cross_rank")
    check(hvd.cross_size() == want["CROSS_SIZE"], "cross_size")
    check(hvd.gloo_built() and not hvd.mpi_built(), "gloo_built/mpi_built")
    # As Horovod's: NCCL's version code, or 0.
    code = hvd.nccl_built()
    check(type(code) is int and (code == 0 or code >= 21800), "nccl_built %r" % (code,))
    check(bool(code) == bool(hvd.cuda_built()), "nccl_built and cuda_built agree")
    ranks = range(n)

    # allreduce: every op on every dtype.
    for dtype in FLOATS + INTS:
        for op, name in [(hvd.Sum, "sum"), (hvd.Average, "avg"), (hvd.Min, "min"),
                         (hvd.Max, "max"), (hvd.Product, "prod")]:
            shape = (3, 5)
            low, high = (1, 3) if op == hvd.Product else (-4, 5)
            inputs = [data(r, shape, dtype, 1, low, high) for r in ranks]
            if op == hvd.Product and dtype.is_floating_point:
                inputs = [(x.double() * 0.5 + 1).to(dtype) for x in inputs]
            stack = torch.stack([x.double() if dtype.is_floating_point else x.long()
                                 for x in inputs])
            if op == hvd.Sum:
                ref = stack.sum(0)
            elif op == hvd.Average:
                ref = stack.sum(0) / n if dtype.is_floating_point else torch.div(
                    stack.sum(0), n, rounding_mode="trunc")
            elif op == hvd.Min:
                ref = stack.min(0).values
            elif op == hvd.Max:
                ref = stack.max(0).values
            else:
                ref = stack.prod(0)
            ref = ref.to(dtype)
            tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            out = hvd.allreduce(inputs[me], op=op, name="ar.%s.%s" % (dtype, name))
            check.close(out, ref, "allreduce %s %s" % (dtype, name), rtol=tol, atol=tol)
    # In place, blocking (one library call for a host tensor) and async, on an odd 3-D shape,
    # every dtype: the same sums as above.
    for dtype in FLOATS + INTS:
        shape = (17, 17, 17)
        stack = torch.stack([data(r, shape, dtype, 5).double() if dtype.is_floating_point
                             else data(r, shape, dtype, 5).long() for r in ranks])
        ref = stack.sum(0).to(dtype)
        tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        y = data(me, shape, dtype, 5)
        check(hvd.allreduce_(y, op=hvd.Sum, name="inplace.%s" % dtype) is y,
              "allreduce_ %s returns its tensor" % dtype)
        check.close(y, ref, "allreduce_ %s 17x17x17" % dtype, rtol=tol, atol=tol)
        z = data(me, shape, dtype, 5)
        got = hvd.synchronize(hvd.allreduce_async_(z, op=hvd.Sum, name="async_.%s" % dtype))
        check(got is z, "allreduce_async_ %s gives its tensor" % dtype)
        check.close(z, ref, "allreduce_async_ %s 17x17x17" % dtype, rtol=tol, atol=tol)
    x = data(me, (4,), torch.float32, 2)
    ref = torch.stack([data(r, (4,), torch.float32, 2) for r in ranks]).sum(0)
    check.close(hvd.allreduce(x), ref / n, "allreduce default is Average (unnamed)")
    check.close(hvd.allreduce(x, average=False), ref, "allreduce average=False")
    check.close(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
                ref * 1.5, "allreduce prescale/postscale")
    check.close(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16), ref,
                "allreduce fp16 compression", rtol=1e-2, atol=1e-2)
    y = x.clone()
    check(hvd.allreduce_(y, op=hvd.Sum, name="inplace") is y, "allreduce_ returns its tensor")
    check.close(y, ref, "allreduce_")
    h = hvd.allreduce_async(x, op=hvd.Sum, name="async")
    check.close(hvd.synchronize(h), ref, "allreduce_async")
    check(hvd.poll(h) in (True, False), "poll")
    y = x.clone()
    h = hvd.allreduce_async_(y, op=hvd.Max, name="async_")
    while not hvd.poll(h):
        pass
    check.close(hvd.synchronize(h), torch.stack([data(r, (4,), torch.float32, 2)
                                                 for r in ranks]).max(0).values, "async_ max")
    # bfloat16 and a non-contiguous input (allreduce copies it).
    b = data(me, (4, 6), torch.bfloat16, 3)
    ref_b = torch.stack([data(r, (4, 6), torch.bfloat16, 3).float() for r in ranks]).sum(0)
    check.close(hvd.allreduce(b.t(), op=hvd.Sum).float(), ref_b.t().contiguous().bfloat16()
                .float(), "allreduce non-contiguous bfloat16", rtol=2e-2, atol=2e-2)
    # autograd
    a = x.clone().requires_grad_()
    hvd.allreduce(a, op=hvd.Sum, name="grad").sum().backward()
    check.close(a.grad, torch.full((4,), float(n)), "allreduce backward")

    # grouped
    ts = [data(me, (i + 1, 2), torch.float32, 10 + i) for i in range(3)]
    refs = [torch.stack([data(r, (i + 1, 2), torch.float32, 10 + i) for r in ranks]).sum(0)
            for i in range(3)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grouped")
    for i in range(3):
        check.close(outs[i], refs[i], "grouped_allreduce %d" % i)
    outs = hvd.synchronize(hvd.grouped_allreduce_async(ts, op=hvd.Average))
    for i in range(3):
        check.close(outs[i], refs[i] / n, "grouped_allreduce_async %d" % i)
    copies = [t.clone() for t in ts]
    hvd.grouped_allreduce_(copies, op=hvd.Sum, name="grouped_")
    for i in range(3):
        check.close(copies[i], refs[i], "grouped_allreduce_ %d" % i)

    # allgather: a different first dimension per rank.
    for dtype in [torch.float32, torch.int64, torch.bfloat16, torch.uint8, torch.bool]:
        mk = (lambda r: data(r, (r + 1, 3), torch.int64, 4) > 0) if dtype == torch.bool else \
            (lambda r: data(r, (r + 1, 3), dtype, 4))
        ref = torch.cat([mk(r) for r in ranks])
        check.close(hvd.allgather(mk(me), name="ag.%s" % dtype), ref, "allgather %s" % dtype)
    check.close(hvd.synchronize(hvd.allgather_async(data(me, (2,), torch.float64, 5))),
                torch.cat([data(r, (2,), torch.float64, 5) for r in ranks]), "allgather_async")
    empty = torch.zeros((0, 2)) if me == 0 else data(me, (1, 2), torch.float32, 6)
    check.close(hvd.allgather(empty, name="ag.empty"),
                torch.cat([data(r, (1, 2), torch.float32, 6) for r in ranks if r]),
                "allgather with an empty rank")
    a = data(me, (me + 1, 2), torch.float32, 7).requires_grad_()
    (hvd.allgather(a, name="ag.grad") * 2).sum().backward()
    # Horovod averages the ranks' gradients of the gathered tensor (each rank's is 2 here).
    check.close(a.grad, torch.full((me + 1, 2), 2.0), "allgather backward")
    ga = hvd.grouped_allgather([data(me, (1,), torch.int32, 8), data(me, (2, 2), torch.float32, 9)])
    check.close(ga[1], torch.cat([data(r, (2, 2), torch.float32, 9) for r in ranks]),
                "grouped_allgather")

    # broadcast
    root = n - 1
    t = data(me, (5,), torch.float32, 11)
    check.close(hvd.broadcast(t, root, name="bc"), data(root, (5,), torch.float32, 11),
                "broadcast")
    check.close(t, data(me, (5,), torch.float32, 11), "broadcast leaves its input")
    u = data(me, (2, 3), torch.int64, 12)
    hvd.broadcast_(u, 0, name="bc_")
    check.close(u, data(0, (2, 3), torch.int64, 12), "broadcast_")
    check.close(hvd.synchronize(hvd.broadcast_async(t, 0)), data(0, (5,), torch.float32, 11),
                "broadcast_async")
    v = t.clone()
    hvd.synchronize(hvd.broadcast_async_(v, root))
    check.close(v, data(root, (5,), torch.float32, 11), "broadcast_async_")
    check.close(hvd.broadcast(data(me, (3,), torch.bfloat16, 13), 0),
                data(0, (3,), torch.bfloat16, 13), "broadcast bfloat16")

    # alltoall: equal shares, then splits.
    def a2a_input(r):
        return data(r, (2 * n, 3), torch.float32, 14)
    ref = torch.cat([a2a_input(r)[2 * me:2 * me + 2] for r in ranks])
    check.close(hvd.alltoall(a2a_input(me), name="a2a"), ref, "alltoall equal")

    def splits_of(r):
        return [(r + j) % 3 for j in ranks]

    def a2a_rows(r):
        return data(r, (sum(splits_of(r)), 2), torch.int64, 15)
    out, received = hvd.alltoall(a2a_rows(me), splits=torch.tensor(splits_of(me)), name="a2av")
    pieces = []
    for r in ranks:
        s = splits_of(r)
        start = sum(s[:me])
        pieces.append(a2a_rows(r)[start:start + s[me]])
    check.close(out, torch.cat(pieces), "alltoall splits")
    check.close(received, torch.tensor([splits_of(r)[me] for r in ranks], dtype=torch.int32),
                "alltoall received splits")
    out2, rec2 = hvd.synchronize(hvd.alltoall_async(a2a_rows(me), splits=splits_of(me)))
    check.close(out2, torch.cat(pieces), "alltoall_async")

    # reducescatter: rows split evenly, the first ranks get one more.
    rows = 2 * n + 1
    inputs = [data(r, (rows, 3), torch.float32, 16) for r in ranks]
    total = torch.stack(inputs).sum(0)
    mine = [rows // n + (1 if r < rows % n else 0) for r in ranks]
    start = sum(mine[:me])
    check.close(hvd.reducescatter(inputs[me], op=hvd.Sum, name="rs"),
                total[start:start + mine[me]], "reducescatter sum")
    check.close(hvd.reducescatter(inputs[me], name="rs.avg"),
                total[start:start + mine[me]] / n, "reducescatter average (default)")
    check.close(hvd.reducescatter(inputs[me], op=hvd.Sum, prescale_factor=2.0,
                                  postscale_factor=0.25),
                total[start:start + mine[me]] * 0.5, "reducescatter scaled", rtol=1e-5)

    # grouped_reducescatter: every tensor checked before any is submitted.
    outs = hvd.grouped_reducescatter([inputs[me], 2 * inputs[me]], op=hvd.Sum, name="grs")
    check.close(outs[0], total[start:start + mine[me]], "grouped_reducescatter 0")
    check.close(outs[1], 2 * total[start:start + mine[me]], "grouped_reducescatter 1")
    outs = hvd.synchronize(hvd.grouped_reducescatter_async([inputs[me].double()],
                                                           postscale_factor=3.0))
    check.close(outs[0], (3 * total[start:start + mine[me]] / n).double(),
                "grouped_reducescatter_async Average, postscale", rtol=1e-5)
    check.raises(ValueError, lambda: hvd.grouped_reducescatter(
        [torch.zeros(3, 1), torch.tensor(float(me))], name="grs.scalar"),
        "grouped_reducescatter with a scalar", ["at least one dimension"])
    check.close(hvd.reducescatter(inputs[me], op=hvd.Sum, name="grs.scalar.0"),
                total[start:start + mine[me]], "the scalar's group left no name in flight")
    autograd_of_the_other_ops(check, n, me)
    # A group's tensors share one device (a 'meta' tensor stands in for a GPU's here); nothing
    # of the group is submitted.
    mixed = [torch.ones(3), torch.ones(3, device="meta")]
    for what, call in (("grouped_allreduce", lambda: hvd.grouped_allreduce(mixed, name="mix")),
                       ("grouped_allgather", lambda: hvd.grouped_allgather(mixed, name="mix")),
                       ("grouped_reducescatter",
                        lambda: hvd.grouped_reducescatter(mixed, name="mix"))):
        check.raises(hvd.PerseusError, call, what + " over two devices", ["cpu and meta"])
    check.close(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="mix.0"), torch.full((3,), n * 1.0),
                "no name of a refused group is left in flight")

    # sparse all-reduce (Horovod's: indices and values all-gathered)
    dense = data(me, (7, 3), torch.float32, 17)
    dense[dense < 0.3] = 0
    refs = sum(torch.where(data(r, (7, 3), torch.float32, 17) < 0.3, torch.tensor(0.0),
                           data(r, (7, 3), torch.float32, 17)) for r in ranks)
    got = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp", op=hvd.Average)()
    check(got.is_sparse and tuple(got.shape) == (7, 3), "sparse_allreduce_async is sparse")
    check.close(got.to_dense(), refs / n, "sparse_allreduce_async Average")
    got = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp.sum", op=hvd.Sum)()
    check.close(got.to_dense(), refs, "sparse_allreduce_async Sum")

    # objects, barrier, join
    obj = {"rank": me, "list": list(range(me + 2))}
    check(hvd.broadcast_object(obj if me == 1 % n else None, root_rank=1 % n) ==
          {"rank": 1 % n, "list": list(range(1 % n + 2))}, "broadcast_object")
    check(hvd.allgather_object(obj, name="objs") ==
          [{"rank": r, "list": list(range(r + 2))} for r in ranks], "allgather_object")
    hvd.barrier()
    last = hvd.join()
    check(0 <= last < n, "join returns a rank (%r)" % last)

    # errors
    check.raises(NotImplementedError, lambda: hvd.allreduce(x, op=hvd.Adasum), "Adasum",
                 ["Adasum"])
    check.raises(hvd.PerseusError, lambda: hvd.allreduce(torch.zeros(2, dtype=torch.complex64),
                                                         name="complex"),
                 "complex64", ["complex", "complex64"])
    check.raises(hvd.PerseusError, lambda: hvd.allreduce_(torch.zeros(4, 4).t(), name="nc"),
                 "non-contiguous allreduce_", ["nc", "contiguous"])
    e = check.raises(hvd.PerseusError, lambda: hvd.broadcast(x, n + 3, name="badroot"),
                     "bad root", ["badroot"])
    check(e is not None and e.code == -1, "bad root's code is INVALID_ARGUMENT")
    check(hvd.remove_process_set(hvd.global_process_set) is False,
          "remove_process_set of the global set is False")
    hvd.barrier()
    hvd.shutdown()
    check(not hvd.is_initialized(), "shutdown")
    check.finish()


run(main)
