"""The Perseus KVStore: init (param_only), push with each op, pull, pushpull, int and str keys,
single and lists, set_optimizer, and the fit.py pattern (Module.fit with kvstore=kv) against one
process on whole batches. Prints "mxnet kvstore: N checks passed"."""
import logging

import numpy as np

import mxnet as mx

import perseus.mxnet as perseus_mx
from perseus.mxnet import PerseusOp

kv = perseus_mx.create("dist_sync_perseus")
rank, size = kv.rank, kv.num_workers
assert kv.type == "dist_sync_perseus" and kv.local_rank == rank
assert isinstance(kv, mx.kvstore.KVStoreBase)
assert isinstance(perseus_mx.create("local"), mx.kvstore.KVStore)  # other names: MXNet's
checks = 0


def check(got, want, what, rtol=1e-6):
    global checks
    got = got.asnumpy() if isinstance(got, mx.nd.NDArray) else np.asarray(got)
    np.testing.assert_allclose(got, np.asarray(want, dtype=got.dtype), rtol=rtol, err_msg=what)
    checks += 1


def val(r, shape=(2, 3)):
    return np.arange(np.prod(shape), dtype="float32").reshape(shape) * (r + 1) - r


# init: the store holds rank 0's value; param_only also writes it into value
w = mx.nd.array(val(rank))
kv.init(3, w)
check(w, val(rank), "init leaves value")
out = mx.nd.zeros((2, 3))
kv.pull(3, out=out)
check(out, val(0), "pull after init")
p = mx.nd.array(val(rank))
kv.init("weight", p, param_only=True)
check(p, val(0), "init param_only")
# lists of keys
ws = [mx.nd.array(val(rank, (k + 1,))) for k in range(3)]
kv.init(["a", "b", "c"], ws, param_only=True)
for k in range(3):
    check(ws[k], val(0, (k + 1,)), "init list %d" % k)

# push with each op, then pull
everyone = np.stack([val(r) for r in range(size)])
for op, want in ((PerseusOp.Sum, everyone.sum(0)), (PerseusOp.Max, everyone.max(0)),
                 (PerseusOp.Min, everyone.min(0))):
    kv.push(3, mx.nd.array(val(rank)), op=op)
    out = mx.nd.zeros((2, 3))
    kv.pull(3, out=out)
    check(out, want, "push %s" % op.name)
# default op is Sum; a list of values for one key (devices) is added up first
kv.push("weight", [mx.nd.array(val(rank)), mx.nd.ones((2, 3))])
outs = [mx.nd.zeros((2, 3)), mx.nd.zeros((2, 3))]
kv.pull("weight", out=outs)
for o in outs:
    check(o, everyone.sum(0) + size, "push of a device list, pull into a list")
# lists of keys with pushpull, in place and into out
vs = [mx.nd.array(val(rank, (k + 1,))) for k in range(3)]
kv.pushpull(["a", "b", "c"], vs, op=PerseusOp.Max)
for k in range(3):
    check(vs[k], np.stack([val(r, (k + 1,)) for r in range(size)]).max(0), "pushpull list %d" % k)
o = mx.nd.zeros((2, 3))
kv.pushpull(3, mx.nd.array(val(rank)), out=o)
check(o, everyone.sum(0), "pushpull out")
kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})  # accepted, ignored
kv._barrier()
try:
    kv.pull("never", out=mx.nd.zeros((1,)))
    raise AssertionError("pull of an unknown key")
except KeyError:
    checks += 1

# with an optimizer, push applies the reduced gradient to the stored weight (as dist_sync)
kv2 = perseus_mx.create("dist_sync_perseus")
kv2.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, rescale_grad=1.0 / size))
w = mx.nd.array(val(rank))
kv2.init(0, w, param_only=True)
kv2.push(0, mx.nd.array(val(rank)))
kv2.pull(0, out=w)
check(w, val(0) - 0.1 * everyone.mean(0), "set_optimizer update", 1e-5)

# ---- the fit.py pattern ------------------------------------------------------------------
logging.basicConfig(level=logging.WARNING)
rng = np.random.RandomState(3)
N, B = 48, 8
X = rng.randn(N, 6).astype("float32")
Y = (X @ rng.randn(6, 4)).argmax(1).astype("float32")
data = mx.sym.Variable("data")
net = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.FullyConnected(net, num_hidden=4, name="fc2")
net = mx.sym.SoftmaxOutput(net, name="softmax")
opt_params = {"learning_rate": 0.2, "momentum": 0.9, "wd": 1e-4}


def fit(kvstore, x, y, batch, seed):
    mx.random.seed(seed)
    it = mx.io.NDArrayIter(x, y, batch_size=batch, shuffle=False, label_name="softmax_label")
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.fit(it, num_epoch=1, kvstore=kvstore, optimizer="sgd", optimizer_params=opt_params,
            initializer=mx.init.Xavier())
    arg, aux = mod.get_params()
    return np.concatenate([arg[k].asnumpy().ravel() for k in sorted(arg)])


# fit.py with the seed's diff: kv = perseus_mx.create(args.kv_store); each worker reads its
# part of the data (num_parts=kv.num_workers, part_index=kv.rank); model.fit(kvstore=kv).
kv3 = perseus_mx.create("dist_sync_perseus")
part = N // kv3.num_workers
# interleave so that each global batch of B * size rows is split among the ranks
order = np.arange(N).reshape(-1, size, B)  # (steps, rank, row)
mine = order[:, kv3.rank, :].ravel()
got = fit(kv3, X[mine], Y[mine], B, seed=10 + kv3.rank)  # different init: kv broadcasts rank 0's
allw = perseus_mx.allgather(mx.nd.array(got[None, :])).asnumpy()
assert np.abs(allw - allw[0]).max() == 0.0, "ranks differ after Module.fit"
checks += 1
# one process, whole batches of B * size rows, starting from rank 0's initial weights
want = fit(None, X[order.reshape(-1, size * B).ravel()], Y[order.reshape(-1, size * B).ravel()],
           B * size, seed=10)
check(got, want, "Module.fit with the Perseus KVStore == one process", 1e-4)
print("mxnet kvstore: %d checks passed" % checks, flush=True)
perseus_mx.shutdown()
