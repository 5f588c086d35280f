"""A Horovod elastic training script (hvd.elastic.run, TorchState, DistributedOptimizer) written
as Horovod's elastic examples are, with only the import line changed: what test_elastic_in_place.py
runs under perseusrun's elastic mode.

    elastic_train.py --steps N --report DIR [--commit-every K] [--step-seconds S]

Every step trains on the same 24 samples (split evenly over the ranks, so the averaged gradient is
the whole batch's whatever the world size), and state.commit() runs every K steps. Each process
appends to DIR/events.<pid> one JSON line per event: "joined" (world, rank, size, step) after each
sync, "reset" (why), and at the end "final" (rank, size, the steps done, a checksum of its
parameters). Rank 0 of each world also writes DIR/step.<world>.<step> as it goes, so that a test
knows when to strike. With --die-at S --die-rank R, the process that is rank R when it reaches
step S exits with code 3 (in worlds below --die-until-world, default 2). Exits 0 after the last
step.
"""
import perseus.torch as hvd  # noqa: I001 - Horovod's `import horovod.torch as hvd`

import argparse
import faulthandler
import hashlib
import json
import os
import time

import torch
import torch.nn as nn

from perseus import _native

BATCH = 24  # divisible by 1, 2, 3, 4, 6 and 8 ranks


def event(report, **fields):
    with open(os.path.join(report, "events.%d" % os.getpid()), "a") as f:
        f.write(json.dumps(fields) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--commit-every", type=int, default=1)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--die-at", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--die-until-world", type=int, default=2)
    parser.add_argument("--cuda", action="store_true",
                        help="the model and data on the GPU (NCCL): the GPU machine's check")
    parser.add_argument("marker", nargs="?")  # the tests' mark on their processes
    args = parser.parse_args()
    faulthandler.enable()  # a crash says where, in the rank's stderr
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    device = torch.device("cuda" if args.cuda else "cpu")
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(1)
    inputs = torch.randn(BATCH, 6, generator=g).to(device)
    targets = torch.randn(BATCH, 3, generator=g).to(device)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, resets=0)

    def on_reset():
        state.resets += 1
        event(args.report, what="reset", world=_native.elastic_world(), rank=hvd.rank(),
              size=hvd.size())

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        event(args.report, what="joined", world=_native.elastic_world(), rank=hvd.rank(),
              size=hvd.size(), step=state.step)
        while state.step < args.steps:
            n, me = hvd.size(), hvd.rank()
            share = BATCH // n
            x = inputs[me * share:(me + 1) * share]
            y = targets[me * share:(me + 1) * share]
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).sum() / BATCH * n  # averaged over ranks: the batch's
            loss.backward()
            optimizer.step()
            state.step += 1
            if (state.step == args.die_at and me == args.die_rank and
                    _native.elastic_world() < args.die_until_world):
                event(args.report, what="dies", world=_native.elastic_world(), rank=me)
                os._exit(3)
            if me == 0:
                open(os.path.join(args.report, "step.%d.%d" % (_native.elastic_world(),
                                                                state.step)), "w").close()
            if args.step_seconds:
                time.sleep(args.step_seconds)
            if state.step % args.commit_every == 0:
                state.commit()

    train(state)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    checksum = hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()[:16]
    everyone = hvd.allgather_object(checksum, name="checksums")
    event(args.report, what="final", world=_native.elastic_world(), rank=hvd.rank(),
          size=hvd.size(), step=state.step, checksum=checksum,
          equal=len(set(everyone)) == 1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
