"""Horovod-style synthetic benchmark with perseus.torch: images/s of training on random data
(Horovod's pytorch_synthetic_benchmark.py with only the import line changed).

    perseusrun -np 2 -H localhost:2 python3 examples/pytorch_synthetic_benchmark.py

--model: 'tiny' (a small ResNet-like network, the default without torchvision) or a
torchvision model name (resnet50, the default with torchvision). On the GPU when there is one.
"""
import argparse
import os
import sys
import timeit

import torch
import torch.nn as nn
import torch.nn.functional as F

import perseus.torch.horovod as hvd

# Without torchvision (Debian's python3-torch has none): a small ResNet-like network.


class _Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + self.short(x))


class TinyResNet(nn.Module):
    """Four stages of two basic blocks (8-16-32-64 channels), for CPU runs."""

    def __init__(self, num_classes=1000, width=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        layers, cin = [], width
        for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            layers += [_Block(cin, cout, 1 if i == 0 else 2), _Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(cin, num_classes))

    def forward(self, x):
        return self.head(self.layers(self.stem(x)))


def make_model(name):
    """'tiny' (built in), any torchvision.models name, or resnet50 (built in without
    torchvision)."""
    if name == "tiny":
        return TinyResNet()
    try:
        from torchvision import models
    except ImportError:
        if name == "resnet50":  # examples/_resnet.py: the same network in plain torch
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from _resnet import resnet50
            return resnet50()
        raise SystemExit("--model %s needs torchvision, which is not installed; use --model tiny"
                         " or resnet50" % name)
    return getattr(models, name)()


def default_model():
    try:
        import torchvision  # noqa: F401
        return "resnet50"
    except ImportError:
        return "tiny"


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
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
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
