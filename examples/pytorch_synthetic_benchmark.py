"""Horovod-style synthetic benchmark with perseus.torch: images/s of training on random data
(Horovod's pytorch_synthetic_benchmark.py with only the import line changed).

    perseusrun -np 2 -H localhost:2 python3 examples/pytorch_synthetic_benchmark.py

--model: 'tiny' (a small ResNet-like network, the default without torchvision) or a
torchvision model name (resnet50, the default with torchvision). On the GPU when there is one.
"""
import argparse
import os
import timeit

import torch
import torch.nn.functional as F

import perseus.torch.horovod as hvd

from _models import default_model, make_model  # noqa: E402 - beside this script


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=default_model())
    parser.add_argument("--batch-size", type=int, default=None, help="per rank")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=3)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--no-communication", action="store_true",
                        help="the baseline: the same steps with the plain optimizer and no "
                             "broadcasts (Horovod's calls as no-ops)")
    args = parser.parse_args()

    hvd.init()
    cuda = torch.cuda.is_available() and not args.no_cuda
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    device = torch.device("cuda" if cuda else "cpu")
    small = args.model == "tiny" or not cuda
    batch = args.batch_size or (8 if small else 32)
    size = args.image_size or (64 if small else 224)

    model = make_model(args.model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    if not args.no_communication:
        optimizer = hvd.DistributedOptimizer(optimizer,
                                             named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(batch, 3, size, size, device=device)
    target = torch.randint(0, 1000, (batch,), device=device)

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log("Model: %s, batch size %d, %dx%d images, %d ranks on %s"
        % (args.model, batch, size, size, hvd.size(), device.type))
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = batch * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per rank" % (i, rate))
        rates.append(rate)
    mean = sum(rates) / len(rates)
    conf = 1.96 * (sum((r - mean) ** 2 for r in rates) / len(rates)) ** 0.5
    log("Img/sec per rank: %.1f +-%.1f" % (mean, conf))
    log("Total img/sec on %d rank(s): %.1f +-%.1f"
        % (hvd.size(), hvd.size() * mean, hvd.size() * conf))
    hvd.shutdown()


if __name__ == "__main__":
    main()
