"""Horovod-style MXNet Gluon training of an MNIST-like classifier under perseusrun:

    perseusrun -np 2 -H localhost:2 python examples/mxnet_mnist.py

The data set is made here, small and deterministic: 28x28 images of 10 classes, each class a
fixed random pattern plus noise, so it needs no download. Each rank trains on its shard with
perseus.mxnet's DistributedTrainer (gradients averaged over the ranks) after
broadcast_parameters; the learning rate is scaled by the number of ranks, as Horovod's examples
do. Rank 0 prints the loss of each epoch; every rank checks that the loss fell well below its
start and that all ranks hold the same parameters, and exits 1 otherwise.

Needs MXNet 1.9.1 (scripts/setup_mxnet.sh makes .venv-mxnet with it) and perseus on PYTHONPATH
(lib/framework_shims); libperseus is found in build/ (or PERSEUS_LIBRARY).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib",
                                "framework_shims"))

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import perseus.mxnet as hvd  # noqa: E402


def make_data(n, seed=0):
    """n MNIST-like (1, 28, 28) float32 images and their labels 0..9."""
    rng = np.random.RandomState(seed)
    templates = (rng.rand(10, 28, 28) > 0.7).astype("float32")
    labels = rng.randint(0, 10, size=n)
    images = templates[labels] * 0.25 + rng.randn(n, 28, 28).astype("float32") * 0.5
    return images.reshape(n, 1, 28, 28).astype("float32"), labels.astype("float32")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="before scaling by hvd.size()")
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    mx.random.seed(42 + rank)  # different initial weights: broadcast_parameters unifies them

    images, labels = make_data(args.samples)
    shard = slice(rank, None, size)  # this rank's part of the data set
    train = gluon.data.DataLoader(gluon.data.ArrayDataset(images[shard], labels[shard]),
                                  batch_size=args.batch_size, shuffle=False, last_batch="discard")

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, kernel_size=5, strides=2, activation="relu"),
            gluon.nn.Flatten(),
            gluon.nn.Dense(64, activation="relu"),
            gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 1, 28, 28)))  # finish the deferred initialisation
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)

    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": args.lr * size, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    losses = []
    first = None
    for epoch in range(args.epochs):
        total, batches = 0.0, 0
        for data, label in train:
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(data.shape[0])
            value = loss.mean().asscalar()
            if first is None:
                first = value
            total += value
            batches += 1
        # the epoch's loss averaged over every rank
        mean = hvd.allreduce(mx.nd.array([total / batches]), name="epoch_loss").asscalar()
        losses.append(mean)
        if rank == 0:
            print("epoch %d: loss %.4f (%d ranks)" % (epoch, mean, size), flush=True)

    first = hvd.allreduce(mx.nd.array([first]), name="first_loss").asscalar()
    flat = np.concatenate([p.data().asnumpy().ravel()
                           for _, p in sorted(net.collect_params().items())])
    everyone = hvd.allgather(mx.nd.array(flat[None, :]), name="params").asnumpy()
    ok = True
    if np.abs(everyone - everyone[0]).max() != 0.0:
        print("rank %d: parameters differ across ranks" % rank, flush=True)
        ok = False
    if not losses[-1] < 0.25 * first:
        print("rank %d: the loss did not go down enough: first batch %.4f, epochs %s"
              % (rank, first, losses), flush=True)
        ok = False
    if ok and rank == 0:
        print("done: loss %.4f -> %.4f, parameters equal on all ranks" % (first, losses[-1]),
              flush=True)
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
