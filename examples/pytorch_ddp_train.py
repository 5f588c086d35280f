"""A small real training job with torch.distributed and DistributedDataParallel.

Written as for torchrun or mpirun: it reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT from the environment, which perseusrun sets for every rank:

    perseusrun -np 2 -H localhost:2 python3 examples/pytorch_ddp_train.py

Each rank trains on its own shard of a synthetic classification data set (made here: nothing
is downloaded), on its GPU when there is one (NCCL) and on the CPU otherwise (Gloo). At the end
the ranks check that their parameters are identical and that the loss went down, and exit
non-zero otherwise.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def make_data(samples, features, classes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=generator) * 0.4
    labels = torch.randint(0, classes, (samples,), generator=generator)
    inputs = centers[labels] + torch.randn(samples, features, generator=generator)
    return inputs, labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--samples", type=int, default=8192)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # Kubeflow's PyTorchJob starts one process a pod and sets no LOCAL_RANK.
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_gpu = torch.cuda.is_available()
    if use_gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if use_gpu else "gloo")
    torch.manual_seed(1234)

    inputs, labels = make_data(args.samples, 32, 10)
    shard = slice(rank, None, world)
    inputs, labels = inputs[shard].to(device), labels[shard].to(device)

    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if use_gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    losses = []
    for epoch in range(args.epochs):
        total, batches = torch.zeros((), device=device), 0
        for start in range(0, len(labels), args.batch_size):
            x = inputs[start:start + args.batch_size]
            y = labels[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            batches += 1
        dist.all_reduce(total)
        losses.append(total.item() / batches / world)
        if rank == 0:
            print(f"epoch {epoch}: loss {losses[-1]:.4f} ({world} ranks on {device.type})",
                  flush=True)

    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    sums = [torch.zeros_like(checksum) for _ in range(world)]
    dist.all_gather(sums, checksum)
    dist.destroy_process_group()
    if any(abs(s.item() - sums[0].item()) > 1e-6 for s in sums):
        print(f"rank {rank}: parameters differ across ranks: {[s.item() for s in sums]}")
        return 1
    if not losses[-1] < losses[0] * 0.5:
        print(f"rank {rank}: the loss did not go down enough: {losses}")
        return 1
    if rank == 0:
        print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f}, parameters equal on all ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
