"""perseus.mxnet's elastic API (hvd.elastic.run, MXNetState with a Gluon model and
DistributedTrainer): what test_mxnet.py runs under perseusrun's elastic mode, and without it.

    elastic_train.py --steps N --report DIR [--step-seconds S] [--die-at S --die-rank R]

Every step trains on the same 24 samples, split evenly over the ranks (the averaged gradient is
the whole batch's whatever the world size), with a commit every step. Each process appends JSON
lines to DIR/events.<pid>: "joined" (world, rank, size, step) after each sync and "final" (size,
steps done, a checksum of the parameters, whether every rank has the same). Rank 0 writes
DIR/step.<world>.<step>. With --die-at, the process that is rank R at step S of world 0 exits
with code 3. The state objects' own semantics are checked first (restore, sync): a failed check
exits 1.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import perseus.mxnet as hvd
from perseus import _native

BATCH = 24


def event(report, **fields):
    with open(os.path.join(report, "events.%d" % os.getpid()), "a") as f:
        f.write(json.dumps(fields) + "\n")


def checksum(net):
    data = b"".join(p.data().asnumpy().tobytes()
                    for _, p in sorted(net.collect_params().items()))
    return hashlib.sha256(data).hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--die-at", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, default=-1)
    args = parser.parse_args()
    hvd.init()
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="tanh", in_units=6), gluon.nn.Dense(3, in_units=16))
    net.initialize(mx.init.Constant(0.0))
    init = np.random.RandomState(0)
    for _, p in sorted(net.collect_params().items()):
        p.set_data(mx.nd.array(init.standard_normal(p.shape) * 0.3))
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": 0.05, "momentum": 0.9})
    data = np.random.RandomState(1)  # the same on every rank and in every run
    inputs = mx.nd.array(data.standard_normal((BATCH, 6)))
    targets = mx.nd.array(data.standard_normal((BATCH, 3)))
    state = hvd.elastic.MXNetState(params=net.collect_params(), trainer=trainer, step=0)

    # The state's own semantics: restore undoes what was not committed, the parameters too (no
    # collective here: a new process of a later world runs this while the others sync).
    before = checksum(net)
    for p in net.collect_params().values():
        p.set_data(p.data() * 0 + 7)
    state.step = 99
    state.restore()
    if checksum(net) != before or state.step != 0:
        print("FAILED: MXNetState.restore did not undo the step", file=sys.stderr)
        sys.exit(1)

    @hvd.elastic.run
    def train(state):
        event(args.report, what="joined", world=_native.elastic_world(), rank=hvd.rank(),
              size=hvd.size(), step=state.step)
        while state.step < args.steps:
            n, me = hvd.size(), hvd.rank()
            share = BATCH // n
            x = inputs[me * share:(me + 1) * share]
            y = targets[me * share:(me + 1) * share]
            with autograd.record():
                loss = ((net(x) - y) ** 2).sum()
            loss.backward()
            trainer.step(BATCH // n)  # DistributedTrainer divides by the world's size too
            state.step += 1
            if (state.step == args.die_at and me == args.die_rank and
                    _native.elastic_world() < 1):
                os._exit(3)
            if me == 0:
                open(os.path.join(args.report, "step.%d.%d" % (_native.elastic_world(),
                                                                state.step)), "w").close()
            if args.step_seconds:
                time.sleep(args.step_seconds)
            state.commit()

    train(state)
    mine = checksum(net)
    everyone = hvd.allgather_object(mine, name="checksums")
    event(args.report, what="final", world=_native.elastic_world(), rank=hvd.rank(),
          size=hvd.size(), step=state.step, checksum=mine, equal=len(set(everyone)) == 1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
