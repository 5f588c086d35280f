"""PerseusSyncBatchNorm against gluon.nn.BatchNorm over the combined batch of the ranks it
averages over: outputs, input gradients, gamma/beta gradients (summed over those ranks) and the
running statistics, for 2-D and 4-D inputs; the Gluon block imperative and hybridized, and the
symbol form (mx.sym.contrib.PerseusSyncBatchNorm) bound as Module code binds it.

    sync_bn.py SCOPE

SCOPE: comm_scope (0 or 1). The group (scope 0: the ranks of this rank's host, as libperseus
placed them) is printed, and the caller checks it against the layout it launched.
Prints "mxnet sync_bn: N checks passed (scope S, group [...])"."""
import sys

import numpy as np

import mxnet as mx
from mxnet import autograd

import perseus.mxnet as hvd

scope = int(sys.argv[1])
hvd.init()
rank, size = hvd.rank(), hvd.size()
from perseus.mxnet import sync_batch_norm  # noqa: E402

assert mx.gluon.contrib.nn.PerseusSyncBatchNorm is hvd.PerseusSyncBatchNorm
assert hvd.PerseusSyncBatchNorm().comm_scope == 0  # the seed's default: the host's ranks
nodes = sync_batch_norm.node_ranks()
group = list(range(size)) if scope == 1 else [r for r in range(size) if nodes[r] == nodes[rank]]
checks = 0


def check(got, want, what, rtol=1e-4, atol=1e-5):
    global checks
    got = got.asnumpy() if isinstance(got, mx.nd.NDArray) else np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    checks += 1


def symbolic_layer(shape, per_rank, gamma, beta, scale=True, center=True):
    """The same layer as mx.sym.contrib.PerseusSyncBatchNorm, bound as Module code binds it."""
    data = mx.sym.var("data")
    sym = mx.sym.contrib.PerseusSyncBatchNorm(data, eps=1e-5, momentum=0.8, fix_gamma=not scale,
                                              comm_scope=scope, name="sym_bn_%d" % len(shape))
    assert sym.list_auxiliary_states() == ["sym_bn_%d_moving_mean" % len(shape),
                                           "sym_bn_%d_moving_var" % len(shape)]
    exe = sym.simple_bind(mx.cpu(), data=(per_rank,) + shape, grad_req="write")
    prefix = "sym_bn_%d_" % len(shape)
    exe.arg_dict[prefix + "gamma"][:] = gamma
    exe.arg_dict[prefix + "beta"][:] = beta
    exe.aux_dict[prefix + "moving_mean"][:] = 0
    exe.aux_dict[prefix + "moving_var"][:] = 1
    return exe, prefix


def run_case(shape, per_rank, steps=2, hybridize=False, **kwargs):
    rng = np.random.RandomState(11)
    C = shape[0]
    xs = [rng.randn(steps, per_rank, *shape).astype("float32") * (r + 1) + r for r in range(size)]
    weights = [rng.randn(per_rank, *shape).astype("float32") for r in range(size)]
    gamma = rng.rand(C).astype("float32") + 0.5
    beta = rng.randn(C).astype("float32")

    def init(layer):
        layer.initialize()
        layer(mx.nd.zeros((1,) + shape))  # finish shapes (inference: no collective)
        layer.gamma.set_data(mx.nd.array(gamma))
        layer.beta.set_data(mx.nd.array(beta))

    sync = mx.gluon.contrib.nn.PerseusSyncBatchNorm(comm_scope=scope, momentum=0.8, **kwargs)
    ref = mx.gluon.nn.BatchNorm(momentum=0.8, in_channels=C, **kwargs)
    init(sync)
    init(ref)
    if hybridize:
        sync.hybridize()
    exe, prefix = symbolic_layer(shape, per_rank, gamma, beta, **kwargs)
    gpos = group.index(rank)
    for s in range(steps):
        x = mx.nd.array(xs[rank][s])
        x.attach_grad()
        with autograd.record():
            y = sync(x)
            loss = (y * mx.nd.array(weights[rank])).sum()
        loss.backward()
        xr = mx.nd.array(np.concatenate([xs[r][s] for r in group]))
        xr.attach_grad()
        with autograd.record():
            yr = ref(xr)
            lr = (yr * mx.nd.array(np.concatenate([weights[r] for r in group]))).sum()
        lr.backward()
        mine = slice(gpos * per_rank, (gpos + 1) * per_rank)
        what = "shape %s step %d %s" % (shape, s, kwargs)
        check(y, yr.asnumpy()[mine], "output " + what)
        check(x.grad, xr.grad.asnumpy()[mine], "input gradient " + what)
        # the parameters' gradients: this rank's share, summed over the group
        for name in ("gamma", "beta"):
            p = getattr(sync, name)
            if p.grad_req == "null":
                continue
            g = p.grad().asnumpy()
            total = sum(hvd.allgather(mx.nd.array(g[None, :])).asnumpy()[r] for r in group)
            check(total, getattr(ref, name).grad().asnumpy(), name + " gradient " + what)
        check(sync.running_mean.data(), ref.running_mean.data().asnumpy(), "running_mean " + what)
        check(sync.running_var.data(), ref.running_var.data().asnumpy(), "running_var " + what)
        # the symbol form, bound like Module code: forward (training) and backward by hand
        exe.arg_dict["data"][:] = xs[rank][s]
        exe.forward(is_train=True)
        exe.backward([mx.nd.array(weights[rank])])
        check(exe.outputs[0], yr.asnumpy()[mine], "symbol output " + what)
        check(exe.grad_dict["data"], xr.grad.asnumpy()[mine], "symbol input gradient " + what)
        for name in ("gamma", "beta"):
            if getattr(sync, name).grad_req == "null":
                continue
            g = exe.grad_dict[prefix + name].asnumpy()
            total = sum(hvd.allgather(mx.nd.array(g[None, :])).asnumpy()[r] for r in group)
            check(total, getattr(ref, name).grad().asnumpy(), "symbol %s gradient %s" % (name, what))
        check(exe.aux_dict[prefix + "moving_mean"], ref.running_mean.data().asnumpy(),
              "symbol moving_mean " + what)
        check(exe.aux_dict[prefix + "moving_var"], ref.running_var.data().asnumpy(),
              "symbol moving_var " + what)
    # inference uses the running statistics, like BatchNorm
    xt = mx.nd.array(xs[rank][0])
    check(sync(xt), ref(xt).asnumpy(), "inference " + str(shape))


run_case((3,), per_rank=4)
run_case((2, 3, 3), per_rank=2)
run_case((2, 3, 3), per_rank=3, hybridize=True)
run_case((4,), per_rank=3, scale=False, center=False)
# in a network trained with DistributedTrainer: the backward's all-reduces (run by MXNet's
# engine) and the trainer's (this thread) are named, so their order between ranks does not matter
mx.random.seed(5)
net = mx.gluon.nn.HybridSequential()
net.add(mx.gluon.nn.Dense(6, in_units=4), hvd.PerseusSyncBatchNorm(comm_scope=scope),
        mx.gluon.nn.Activation("relu"), mx.gluon.nn.Dense(2, in_units=6),
        hvd.PerseusSyncBatchNorm(in_channels=2, comm_scope=scope))
net.initialize()
if rank % 2:
    net.hybridize()  # hybridized or not, the ranks' layers meet (named by the blocks' names)
trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
rng = np.random.RandomState(rank)
for step in range(3):
    x = mx.nd.array(rng.randn(4, 4))
    with autograd.record():
        loss = (net(x) ** 2).sum()
    loss.backward()
    trainer.step(4)
flat = np.concatenate([p.data().asnumpy().ravel() for _, p in sorted(net.collect_params().items())
                       if p.grad_req != "null"])
everyone = hvd.allgather(mx.nd.array(flat[None, :])).asnumpy()
check(everyone - everyone[0], np.zeros_like(everyone), "trained parameters equal on all ranks")

print("mxnet sync_bn: %d checks passed (scope %d, group %s)" % (checks, scope, group), flush=True)
hvd.shutdown()
