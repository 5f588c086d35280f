"""Issue 19, item 3: an unpatched fit.py (MXNet's example/image-classification/common/fit.py)
with --kv-store dist_sync_perseus, once perseus.mxnet is imported: mx.kvstore.create gives the
Perseus store, Module.fit takes it (as the object fit.py makes, and as the name), and so does
gluon.Trainer. Checks the ranks' parameters agree and the loss falls. Prints
"mxnet fit_registry: N checks passed"."""
import logging

import numpy as np

import mxnet as mx

import perseus.mxnet  # noqa: F401  (registers dist_sync_perseus with MXNet)

kv = mx.kvstore.create("dist_sync_perseus")  # fit.py: kv = mx.kvstore.create(args.kv_store)
assert isinstance(kv, perseus.mxnet.PerseusKVStore), type(kv)
assert kv.type == "dist_sync_perseus"
assert kv.PerseusOp is perseus.mxnet.PerseusOp
assert isinstance(mx.kv.create("perseus"), perseus.mxnet.PerseusKVStore)
rank, size = kv.rank, kv.num_workers
assert size == perseus.mxnet.size() > 1
checks = 0

logging.basicConfig(level=logging.WARNING)
rng = np.random.RandomState(3)
N, B = 64 * size, 8
X = rng.randn(N, 6).astype("float32")
Y = (X @ rng.randn(6, 4)).argmax(1).astype("float32")
data = mx.sym.Variable("data")
net = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.FullyConnected(net, num_hidden=4, name="fc2")
net = mx.sym.SoftmaxOutput(net, name="softmax")


def agree(flat, what):
    global checks
    everyone = perseus.mxnet.allgather(mx.nd.array(flat[None, :])).asnumpy()
    assert np.abs(everyone - everyone[0]).max() == 0.0, "ranks differ: " + what
    checks += 1


# The seed's symbol form of the synchronised BatchNorm inside Module code (scope 1: every rank,
# so the moving statistics agree between ranks too).
bn_net = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
bn_net = mx.sym.contrib.PerseusSyncBatchNorm(bn_net, comm_scope=1, fix_gamma=False, name="bn1")
bn_net = mx.sym.Activation(bn_net, act_type="relu")
bn_net = mx.sym.FullyConnected(bn_net, num_hidden=4, name="fc2")
bn_net = mx.sym.SoftmaxOutput(bn_net, name="softmax")


def module_fit(kvstore, seed, net=net):
    # fit.py: each worker reads its part (num_parts=kv.num_workers, part_index=kv.rank)
    mx.random.seed(seed)
    part = slice(rank * N // size, (rank + 1) * N // size)
    train = mx.io.NDArrayIter(X[part], Y[part], batch_size=B, shuffle=False,
                              label_name="softmax_label")
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.bind(train.provide_data, train.provide_label)
    mod.init_params(mx.init.Xavier())
    before = dict(mod.score(train, "ce"))["cross-entropy"]
    train.reset()
    mod.fit(train, num_epoch=4, kvstore=kvstore, optimizer="sgd",
            optimizer_params={"learning_rate": 0.2, "momentum": 0.9})
    after = dict(mod.score(train, "ce"))["cross-entropy"]
    assert isinstance(mod._kvstore, perseus.mxnet.PerseusKVStore), type(mod._kvstore)
    arg, aux = mod.get_params()
    return before, after, np.concatenate([arg[k].asnumpy().ravel() for k in sorted(arg)] +
                                         [aux[k].asnumpy().ravel() for k in sorted(aux)])


for how, store, model in (("the store fit.py creates", kv, net),
                          ("the name", "dist_sync_perseus", net),
                          ("mx.sym.contrib.PerseusSyncBatchNorm", "dist_sync_perseus", bn_net)):
    before, after, flat = module_fit(store, seed=10 + rank, net=model)  # rank 0's weights win
    agree(flat, "Module.fit with " + how)
    assert after < 0.7 * before, "Module.fit with %s: loss %.4f -> %.4f" % (how, before, after)
    checks += 1
    print("Module.fit with %s: loss %.4f -> %.4f" % (how, before, after), flush=True)

# gluon.Trainer(..., kvstore='dist_sync_perseus')
mx.random.seed(20 + rank)
gnet = mx.gluon.nn.Dense(4, in_units=6)
gnet.initialize(mx.init.Xavier())
trainer = mx.gluon.Trainer(gnet.collect_params(), "sgd", {"learning_rate": 0.2},
                           kvstore="dist_sync_perseus")
lossf = mx.gluon.loss.SoftmaxCrossEntropyLoss()
mine = slice(rank * N // size, (rank + 1) * N // size)
x, y = mx.nd.array(X[mine]), mx.nd.array(Y[mine])
first = None
for step in range(30):
    with mx.autograd.record():
        loss = lossf(gnet(x), y)
    loss.backward()
    trainer.step(x.shape[0] * size)
    first = loss.mean().asscalar() if first is None else first
last = lossf(gnet(x), y).mean().asscalar()
assert isinstance(trainer._kvstore, perseus.mxnet.PerseusKVStore), type(trainer._kvstore)
agree(np.concatenate([p.data().asnumpy().ravel() for _, p in
                      sorted(gnet.collect_params().items())]), "gluon.Trainer")
assert last < 0.7 * first, "gluon.Trainer: loss %.4f -> %.4f" % (first, last)
checks += 1
print("mxnet fit_registry: %d checks passed" % checks, flush=True)
perseus.mxnet.shutdown()
