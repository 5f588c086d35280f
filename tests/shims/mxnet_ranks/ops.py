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
out, received = hvd.alltoall(mine, splits=mx.nd.array(splits, dtype="int32"))
check(out, want, "alltoall splits")
check(received, np.array([splits[rank]] * size, dtype="int32"), "alltoall received_splits")
out, received = hvd.alltoall(mine, splits=splits)  # a list, as Horovod takes too
check(received, np.array([splits[rank]] * size, dtype="int32"), "alltoall list splits")
try:
    hvd.alltoall(mine, splits=mx.nd.array(splits, dtype="float32"))
    raise AssertionError("float splits accepted")
except ValueError as e:  # as Horovod's (a PerseusError too)
    assert "integers" in str(e) and isinstance(e, hvd.PerseusError), e
    checks += 1
try:
    hvd.reducescatter(mx.nd.array(rank, dtype="float32"))
    raise AssertionError("a scalar reducescatter accepted")
except ValueError:
    checks += 1

# reducescatter: 2 * size + 1 rows, the first ranks one more; Sum, Average, prescale
rows = 2 * size + 1
share = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
start = sum(share[:rank])
for dtype in ("float32", "float64", "int32"):
    everyone = np.stack([data(r, (rows, 3), dtype) for r in range(size)])
    mine = mx.nd.array(data(rank, (rows, 3), dtype), dtype=dtype)
    total = everyone.sum(0).astype(dtype)
    check(hvd.reducescatter(mine, op=hvd.Sum, name="rs." + dtype),
          total[start:start + share[rank]], "reducescatter Sum " + dtype)
    outs = hvd.grouped_reducescatter([mine, mine], op=hvd.Sum, name="grs." + dtype)
    check(outs[1], total[start:start + share[rank]], "grouped_reducescatter " + dtype)
mine = mx.nd.array(data(rank, (rows, 2), "float64"), dtype="float64")
total = np.stack([data(r, (rows, 2), "float64") for r in range(size)]).sum(0)
check(hvd.reducescatter(mine, prescale_factor=2.0), (2 * total / size)[start:start + share[rank]],
      "reducescatter Average (default), prescale 2")
try:
    hvd.grouped_reducescatter([mine, mx.nd.array(np.float32(rank))])
    raise AssertionError("a scalar reducescatter accepted")
except ValueError:
    checks += 1

# grouped_allgather, the object collectives
outs = hvd.grouped_allgather([mx.nd.array(data(rank, (rank + 1, 2))),
                              mx.nd.array(data(rank, (1,), "int32"), dtype="int32")], name="gag")
check(outs[0], np.concatenate([data(r, (r + 1, 2)) for r in range(size)]), "grouped_allgather 0")
check(outs[1], np.concatenate([data(r, (1,), "int32") for r in range(size)]),
      "grouped_allgather 1")
got = hvd.broadcast_object({"from": size - 1, "list": [1, 2]} if rank == size - 1 else None,
                           root_rank=size - 1)
assert got == {"from": size - 1, "list": [1, 2]}, got
got = hvd.allgather_object(("rank", rank))
assert got == [("rank", r) for r in range(size)], got
checks += 2

# a shape mismatch with equal element counts raises on every rank, and the job goes on
try:
    hvd.allreduce(mx.nd.ones((2, 3) if rank == 0 else (3, 2)), name="shapes")
    raise AssertionError("a [2, 3] against a [3, 2] was accepted")
except hvd.PerseusError as e:
    assert "shape" in str(e), e
    checks += 1
check(hvd.allreduce(mx.nd.ones((2,)), op=hvd.Sum, name="after"), np.full((2,), size, "float32"),
      "the job goes on")
assert not hvd.ccl_built() and not hvd.rocm_built() and not hvd.ddl_built()
assert bool(hvd.cuda_built()) == bool(hvd.nccl_built())

# process sets: the even and the odd ranks
even = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
odd = hvd.add_process_set([r for r in range(size) if r % 2])
mine_set = even if rank % 2 == 0 else odd
members = mine_set.ranks
pos = members.index(rank)
m = len(members)
x = mx.nd.array(data(rank))
check(hvd.allreduce(x, op=hvd.Sum, name="x", process_set=mine_set),
      sum(data(r) for r in members).astype("float32"), "set allreduce")
y = x.copy()
hvd.allreduce_(y, name="x.", process_set=mine_set)
check(y, (sum(data(r) for r in members) / m).astype("float32"), "set allreduce_ Average")
outs = hvd.grouped_allreduce([x, x], op=hvd.Sum, process_set=mine_set)
check(outs[1], sum(data(r) for r in members).astype("float32"), "set grouped_allreduce")
check(hvd.allgather(mx.nd.array(data(rank, (rank + 1, 2))), process_set=mine_set),
      np.concatenate([data(r, (r + 1, 2)) for r in members]), "set allgather")
check(hvd.grouped_allgather([x], process_set=mine_set)[0],
      np.concatenate([data(r) for r in members]), "set grouped_allgather")
check(hvd.broadcast(x, members[-1], process_set=mine_set), data(members[-1]), "set broadcast")
a2a = mx.nd.array(data(rank, (2 * m, 2)))
out, received = hvd.alltoall(a2a, splits=[2] * m, process_set=mine_set)
check(out, np.concatenate([data(r, (2 * m, 2))[2 * pos:2 * pos + 2] for r in members]),
      "set alltoall")
check(received, np.array([2] * m, dtype="int32"), "set alltoall received_splits")
rs = mx.nd.array(data(rank, (2 * m + 1, 2)))
share = [(2 * m + 1) // m + (1 if i < (2 * m + 1) % m else 0) for i in range(m)]
s0 = sum(share[:pos])
check(hvd.reducescatter(rs, op=hvd.Sum, process_set=mine_set),
      sum(data(r, (2 * m + 1, 2)) for r in members).astype("float32")[s0:s0 + share[pos]],
      "set reducescatter")
hvd.barrier(process_set=mine_set)
assert hvd.allgather_object(rank, process_set=mine_set) == members
assert hvd.broadcast_object(rank, root_rank=members[0], process_set=mine_set) == members[0]
checks += 2
other = odd if mine_set is even else even
if other.ranks:
    try:
        hvd.allreduce(x, process_set=other)
        raise AssertionError("an outsider's allreduce accepted")
    except hvd.PerseusError as e:
        assert "not a member" in str(e), e
        checks += 1
# DistributedOptimizer of the even set, on every rank (as Horovod's test): the members step
# with the members' average gradient; the others with their own, divided by the set's size.
opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0, wd=0.0), process_set=even)
w = mx.nd.zeros((3, 4))
g = mx.nd.array(data(rank))
opt.update(0, w, g, opt.create_state(0, w))
evens = even.ranks
if rank in evens:
    check(w, (-sum(data(r) for r in evens) / len(evens)).astype("float32"),
          "DistributedOptimizer in the even set", 1e-5)
else:
    check(w, (-data(rank) / len(evens)).astype("float32"),
          "DistributedOptimizer outside its set", 1e-5)
empty = hvd.add_process_set([])
assert empty.size() == 0 and not empty.included()
assert hvd.remove_process_set(odd) and hvd.remove_process_set(even)
assert not hvd.remove_process_set(hvd.global_process_set)
checks += 1

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
