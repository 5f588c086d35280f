"""DistributedTrainer (and gluon.Trainer with DistributedOptimizer) on N ranks, each with 1/N of
every batch, against one process on the whole batches, computed here. Prints
"mxnet trainer: ok <max abs difference>"."""
import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

import perseus.mxnet as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
GLOBAL_BATCH, STEPS = 12, 6
rng = np.random.RandomState(7)
X = rng.randn(GLOBAL_BATCH * STEPS, 5).astype("float32")
Y = (X @ rng.randn(5, 3)).argmax(1).astype("float32")


def make_net(seed):
    mx.random.seed(seed)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(8, activation="tanh", in_units=5), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    return net


def train(net, trainer, lo, hi):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for s in range(STEPS):
        xb = X[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH][lo:hi]
        yb = Y[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH][lo:hi]
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(xb)), mx.nd.array(yb))
        loss.backward()
        trainer.step(hi - lo)


def flat(net):
    return np.concatenate([p.data().asnumpy().ravel()
                           for _, p in sorted(net.collect_params().items())])


opt = {"learning_rate": 0.5, "momentum": 0.9, "wd": 1e-3}
reference = make_net(1)
train(reference, gluon.Trainer(reference.collect_params(), "sgd", opt, kvstore=None),
      0, GLOBAL_BATCH)

part = GLOBAL_BATCH // size
lo, hi = rank * part, (rank + 1) * part

# DistributedTrainer; the ranks start from different weights, broadcast_parameters fixes that.
net = make_net(100 + rank)
hvd.broadcast_parameters(net.collect_params(), root_rank=0)
assert np.array_equal(flat(net), flat(make_net(100)))  # rank 0's
start = make_net(1)
for (_, p), (_, q) in zip(sorted(net.collect_params().items()),
                          sorted(start.collect_params().items())):
    p.set_data(q.data())  # every rank starts from the reference's weights
train(net, hvd.DistributedTrainer(net.collect_params(), "sgd", opt), lo, hi)
diff = np.abs(flat(net) - flat(reference)).max()
assert np.allclose(flat(net), flat(reference), rtol=1e-4, atol=1e-5), diff
assert abs(flat(reference) - flat(make_net(1))).max() > 1e-2  # it did train

# gluon.Trainer with a DistributedOptimizer
net2 = make_net(1)
dopt = hvd.DistributedOptimizer(mx.optimizer.create("sgd", **opt))
train(net2, gluon.Trainer(net2.collect_params(), dopt, kvstore=None), lo, hi)
diff2 = np.abs(flat(net2) - flat(reference)).max()
assert np.allclose(flat(net2), flat(reference), rtol=1e-4, atol=1e-5), diff2

# DistributedTrainer with fp16 compression: close, not equal
net3 = make_net(1)
train(net3, hvd.DistributedTrainer(net3.collect_params(), "sgd", opt,
                                   compression=hvd.Compression.fp16), lo, hi)
diff3 = np.abs(flat(net3) - flat(reference)).max()
assert diff3 < 1e-2, diff3

# every rank holds the same weights
everyone = hvd.allgather(mx.nd.array(flat(net)[None, :])).asnumpy()
assert np.abs(everyone - everyone[0]).max() == 0.0
print("mxnet trainer: ok %.3g %.3g fp16 %.3g" % (diff, diff2, diff3), flush=True)
hvd.shutdown()
