"""Issue 19: MXNet's own example/image-classification/common/fit.py (not part of the mxnet
wheel; a checkout of apache/mxnet's example folder, named by the first argument), called as its
train_*.py scripts call it, with the seed's one change (import perseus.mxnet) and
--kv-store dist_sync_perseus, on a small synthetic data set split by rank. The network holds
mx.sym.contrib.PerseusSyncBatchNorm. Prints each epoch's validation accuracy, which must agree
on every rank (one set of weights), and "mxnet fit_example: done"."""
import argparse
import logging
import os
import sys

import numpy as np

import mxnet as mx

import perseus.mxnet  # noqa: F401  (the seed's addition)

sys.path.insert(0, os.path.abspath(sys.argv.pop(1)))
from common import fit  # noqa: E402  (MXNet's example/image-classification/common/fit.py)


class Accuracies(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if "Validation-accuracy" in message:
            print("mxnet fit_example: " + message, flush=True)


def loader(args, kv):
    rng = np.random.RandomState(0)
    x = rng.randn(args.num_examples, 1, 8, 8).astype("float32")
    y = (x.reshape(len(x), -1) @ rng.randn(64, 10)).argmax(1).astype("float32")
    n = len(x) // kv.num_workers
    mine = slice(kv.rank * n, (kv.rank + 1) * n)
    train = mx.io.NDArrayIter(x[mine], y[mine], args.batch_size, shuffle=True)
    return train, mx.io.NDArrayIter(x[:256], y[:256], args.batch_size)


parser = argparse.ArgumentParser()
fit.add_fit_args(parser)
parser.set_defaults(num_epochs=4, batch_size=32, lr=0.1, lr_step_epochs="10", num_examples=2048,
                    disp_batches=1000)
args = parser.parse_args()
net = mx.sym.Flatten(mx.sym.Variable("data"))
net = mx.sym.FullyConnected(net, num_hidden=32, name="fc1")
net = mx.sym.contrib.PerseusSyncBatchNorm(net, name="bn1", comm_scope=1)
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.FullyConnected(net, num_hidden=10, name="fc2")
net = mx.sym.SoftmaxOutput(net, name="softmax")
# fit.py's logging.basicConfig finds this handler there and adds none: the level is set here.
logging.getLogger().addHandler(Accuracies())
logging.getLogger().setLevel(logging.INFO)
fit.fit(args, net, loader)
print("mxnet fit_example: done", flush=True)
