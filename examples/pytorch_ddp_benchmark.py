"""DistributedDataParallel benchmark: images/s of a plain DDP script whose first line is
`import perseus`, so that its gradient all-reduce goes through libperseus (PERSEUS_DDP=0, or
--no-perseus, runs the same script on torch.distributed's own all-reduce, for comparison).

    perseusrun -np 2 -H localhost:2 python3 examples/pytorch_ddp_benchmark.py
    perseusrun -np 2 -H localhost:2 -x PERSEUS_DDP=0 python3 examples/pytorch_ddp_benchmark.py

Synthetic ImageNet-like data; --model resnet50 (the default with torchvision) or 'tiny' (a
small ResNet-like network, the default without). GPUs with NCCL when there are any, else CPUs
with Gloo. Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT as under torchrun; also takes
--local_rank/--local-rank as torch.distributed.launch passes it without --use_env.
"""
import perseus  # noqa: F401,I001 - first: DDP's gradient all-reduce goes through Perseus

import argparse
import os
import timeit

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from _models import default_model, make_model  # noqa: E402 - beside this script


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=default_model())
    parser.add_argument("--batch-size", type=int, default=None, help="per rank")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=3)
    parser.add_argument("--num-iters", type=int, default=5)
    # torch.distributed.launch without --use_env passes --local_rank=N (newer torch
    # --local-rank=N); torchrun and --use_env set LOCAL_RANK instead.
    parser.add_argument("--local_rank", "--local-rank", type=int, dest="local_rank",
                        default=int(os.environ.get("LOCAL_RANK", "0")))
    args = parser.parse_args()

    local_rank = args.local_rank
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("PERSEUS_LOCAL_SIZE",
                                                                       "1")))
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    small = args.model == "tiny" or not cuda
    batch = args.batch_size or (8 if small else 32)
    size = args.image_size or (64 if small else 224)

    model = DDP(make_model(args.model).to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(batch, 3, size, size, device=device)
    target = torch.randint(0, 1000, (batch,), device=device)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    def log(text):
        if rank == 0:
            print(text, flush=True)

    timeit.timeit(step, number=args.num_warmup_batches)
    stats = perseus.ddp_stats()
    through = ("Perseus" if stats["models"] > stats.get("alone", 0) else
               "none (one rank: Perseus adds no hook)" if stats["models"] else "torch.distributed")
    log("Model: %s, batch size %d, %dx%d images, %d ranks on %s, all-reduce through %s"
        % (args.model, batch, size, size, world, device.type, through))
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(step, number=args.num_batches_per_iter)
        rates.append(batch * args.num_batches_per_iter / t)
        log("Iter #%d: %.1f img/sec per rank" % (i, rates[-1]))
    mean = sum(rates) / len(rates)
    conf = 1.96 * (sum((r - mean) ** 2 for r in rates) / len(rates)) ** 0.5
    log("Img/sec per rank: %.1f +-%.1f" % (mean, conf))
    log("Total img/sec on %d rank(s): %.1f +-%.1f" % (world, world * mean, world * conf))
    del model  # before the process group: torch 1.13 can hang at exit otherwise
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
