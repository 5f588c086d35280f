"""Every perseus.mxnet collective against a reference this rank computes from every rank's
(deterministic) input. Prints "mxnet ops: N checks passed" on success."""
import numpy as np

import mxnet as mx

import perseus.mxnet as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
checks = 0


def data(r, shape=(3, 4), dtype="float32", offset=0.0):
    n = int(np.prod(shape))
    return (np.arange(n, dtype="float64").reshape(shape) * (r + 1) + r * 10 + offset).astype(dtype)


def check(got, want, what, rtol=1e-6):
    global checks
    got = got.asnumpy() if isinstance(got, mx.nd.NDArray) else np.asarray(got)
    assert got.shape == want.shape, "%s: shape %s, want %s" % (what, got.shape, want.shape)
    assert got.dtype == want.dtype, "%s: dtype %s, want %s" % (what, got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, err_msg=what)
    checks += 1


assert 0 <= rank < size and hvd.local_rank() == rank and hvd.local_size() == size
assert hvd.cross_size() == 1 and hvd.cross_rank() == 0

for dtype in ("float32", "float64", "int32", "int64", "float16"):
    everyone = np.stack([data(r, dtype=dtype) for r in range(size)])
    mine = mx.nd.array(data(rank, dtype=dtype), dtype=dtype)
    tol = 1e-3 if dtype == "float16" else 1e-6
    check(hvd.allreduce(mine, op=hvd.Sum, name="sum." + dtype), everyone.sum(0).astype(dtype),
          "allreduce sum " + dtype, tol)
    check(hvd.allreduce(mine, average=False), everyone.sum(0).astype(dtype),
          "allreduce average=False " + dtype, tol)
    check(hvd.allreduce(mine, op=hvd.Min), everyone.min(0), "allreduce min " + dtype)
    check(hvd.allreduce(mine, op=hvd.Max), everyone.max(0), "allreduce max " + dtype)
    if dtype.startswith("float"):
        check(hvd.allreduce(mine), (everyone.astype("float64").mean(0)).astype(dtype),
              "allreduce average " + dtype, tol)
        check(hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
              (everyone.astype("float64").sum(0) * 1.5).astype(dtype), "allreduce scaled", tol)
    # the input is untouched by the out-of-place forms
    check(mine, data(rank, dtype=dtype), "allreduce input unchanged " + dtype)
    inplace = mine.copy()
    out = hvd.allreduce_(inplace, op=hvd.Max, name="inplace." + dtype)
    assert out is inplace
    check(inplace, everyone.max(0), "allreduce_ max " + dtype)
    # broadcast from every root
    for root in range(size):
        check(hvd.broadcast(mine, root_rank=root), data(root, dtype=dtype),
              "broadcast root %d %s" % (root, dtype))
        b = mine.copy()
        hvd.broadcast_(b, root, name="b_.%d.%s" % (root, dtype))
        check(b, data(root, dtype=dtype), "broadcast_ root %d %s" % (root, dtype))

# grouped allreduce
group = [mx.nd.array(data(rank, (k + 1, 2))) for k in range(4)]
outs = hvd.grouped_allreduce(group, op=hvd.Sum, name="grouped")
for k, o in enumerate(outs):
    check(o, sum(data(r, (k + 1, 2)) for r in range(size)), "grouped_allreduce %d" % k)
hvd.grouped_allreduce_(group, name="grouped_")
for k, o in enumerate(group):
    check(o, (sum(data(r, (k + 1, 2)).astype("float64") for r in range(size)) / size)
          .astype("float32"), "grouped_allreduce_ %d" % k)

# allgather with a different first dimension on each rank, and a scalar
rows = lambda r: r + 1
mine = mx.nd.array(data(rank, (rows(rank), 3)))
check(hvd.allgather(mine, name="ag"), np.concatenate([data(r, (rows(r), 3)) for r in range(size)]),
      "allgather rows r+1")
check(hvd.allgather(mx.nd.array([rank * 2.0])), np.array([r * 2.0 for r in range(size)],
                                                        dtype="float32"), "allgather 1 elem")
check(hvd.allgather(mx.nd.array(data(rank, (0, 3)) if rank == 0 else data(rank, (2, 3)))),
      np.concatenate([data(r, (0 if r == 0 else 2, 3)) for r in range(size)]),
      "allgather with an empty rank")
check(hvd.allgather(mx.nd.array(data(rank, (2, 2)), dtype="int64")),
      np.concatenate([data(r, (2, 2), "int64") for r in range(size)]), "allgather int64")

# alltoall: even split, then rank r sends (d + 1) rows to rank d
mine = mx.nd.array(data(rank, (2 * size, 2)))
want = np.concatenate([data(r, (2 * size, 2))[2 * rank:2 * rank + 2] for r in range(size)])
check(hvd.alltoall(mine, name="a2a"), want, "alltoall even")
splits = [d + 1 for d in range(size)]
n = sum(splits)
mine = mx.nd.array(data(rank, (n, 3)))
start = sum(splits[:rank])
want = np.concatenate([data(r, (n, 3))[start:start + splits[rank]] for r in range(size)])
check(hvd.alltoall(mine, splits=mx.nd.array(splits, dtype="int32")), want, "alltoall splits")

# broadcast_parameters: a Gluon ParameterDict (with a deferred one), a dict of NDArrays
mx.random.seed(rank)
net = mx.gluon.nn.HybridSequential()
net.add(mx.gluon.nn.Dense(4, in_units=3), mx.gluon.nn.Dense(2))
net.initialize(mx.init.Uniform())
hvd.broadcast_parameters(net.collect_params(), root_rank=0)
net(mx.nd.ones((1, 3)))  # runs the deferred init of the second Dense, then its broadcast
flat = np.concatenate([p.data().asnumpy().ravel() for _, p in sorted(net.collect_params().items())])
everyone = hvd.allgather(mx.nd.array(flat.reshape(1, -1))).asnumpy()
for r in range(size):
    check(everyone[r], everyone[0], "broadcast_parameters ParameterDict rank %d" % r)
params = {"a": mx.nd.array(data(rank)), "b": mx.nd.array(data(rank, (5,)), dtype="int32")}
hvd.broadcast_parameters(params, root_rank=size - 1)
check(params["a"], data(size - 1), "broadcast_parameters dict a")
check(params["b"], data(size - 1, (5,), "int32"), "broadcast_parameters dict b")
plain = {k: p for k, p in net.collect_params().items()}  # MXNet 2's dict of Parameters
for p in plain.values():
    p.set_data(p.data() + rank)
hvd.broadcast_parameters(plain, root_rank=1)
flat1 = np.concatenate([p.data().asnumpy().ravel() for _, p in sorted(plain.items())])
check(flat1, (flat + 1).astype("float32"), "broadcast_parameters dict of Parameters", 1e-6)

# errors say what failed
try:
    hvd.allreduce(mx.nd.ones((2,)), op=hvd.Adasum)
    raise AssertionError("Adasum accepted")
except NotImplementedError:
    checks += 1

hvd.barrier()
print("mxnet ops: %d checks passed" % checks, flush=True)
hvd.shutdown()
