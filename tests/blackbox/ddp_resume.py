"""A plain DistributedDataParallel script with `import perseus` that checkpoints every epoch and,
when started again (perseusrun --max-restarts, torchrun), resumes from its checkpoint: what
test_restarts.py runs across the SSH test hosts.

    ddp_resume.py --epochs N --checkpoint FILE --report DIR [--epoch-seconds S] [marker]

Every epoch trains on the same 24 samples a step (split evenly over the ranks, so the average
gradient is the whole batch's whatever the world size), then rank 0 writes the checkpoint
(model and optimizer, atomically) and DIR/epoch.E. At the end every rank writes DIR/final.R:
its world size, restart count, the epoch it resumed from, the epochs done, a checksum of its
parameters and whether the gradients went through libperseus. Each round's ranks also write
DIR/pid.<restart>.<rank>, and rank 0 DIR/trained.<restart> (the wall-clock time of its first
step), for bench/restart_time.py.
"""
import perseus  # noqa: I001 - first, before torch, as users write it

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4
BATCH = 24  # divisible by 1, 2, 3, 4, 6 and 8 ranks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    parser.add_argument("marker", nargs="?")
    args = parser.parse_args()
    # The test hosts are network namespaces of one machine with one host name: torch's Gloo
    # would resolve that name to another namespace's address, so it is told the interface.
    def up(name):
        with open("/sys/class/net/%s/operstate" % name) as f:
            return f.read().strip() == "up"

    nets = sorted(i for i in os.listdir("/sys/class/net") if i != "lo" and up(i))
    if nets and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = nets[0]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, me = dist.get_world_size(), dist.get_rank()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"]
    ddp = DDP(model)
    loss_fn = nn.CrossEntropyLoss()
    per = BATCH // n
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    with open(os.path.join(args.report, "pid.%d.%d" % (restart, me)), "w") as f:
        f.write(str(os.getpid()))
    for epoch in range(start, args.epochs):
        g = torch.Generator().manual_seed(1000 + epoch)
        for step in range(STEPS):
            x = torch.randn(BATCH, 8, generator=g)
            y = torch.randint(0, 3, (BATCH,), generator=g)
            opt.zero_grad()
            loss_fn(ddp(x[me * per:(me + 1) * per]), y[me * per:(me + 1) * per]).backward()
            opt.step()
            if epoch == start and step == 0 and me == 0:  # training (re)started: when
                with open(os.path.join(args.report, "trained.%d" % restart), "w") as f:
                    f.write(repr(time.time()))
        time.sleep(args.epoch_seconds)
        dist.barrier()
        if me == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "epoch": epoch + 1}, tmp)
            os.replace(tmp, args.checkpoint)
            open(os.path.join(args.report, "epoch.%d" % (epoch + 1)), "w").close()
        dist.barrier()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().double().numpy().tobytes())
    stats = perseus.ddp_stats()
    with open(os.path.join(args.report, "final.%d" % me), "w") as f:
        json.dump({"world_size": n, "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                   "resumed_from": start, "epochs_done": args.epochs,
                   "checksum": digest.hexdigest(), "through_perseus": stats["buckets"] > 0}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
