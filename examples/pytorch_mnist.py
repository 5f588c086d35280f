"""Horovod-style MNIST training with perseus.torch (the script of Horovod's pytorch_mnist.py,
with only its import line changed), on a synthetic MNIST-like data set made here (nothing is
downloaded): 28x28 images of ten classes, each class a fixed random pattern plus noise.

    perseusrun -np 2 -H localhost:2 python3 examples/pytorch_mnist.py
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import perseus.torch.horovod as hvd


def synthetic_mnist(samples, seed):
    patterns = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(2026))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = patterns[labels] + 0.8 * torch.randn(samples, 1, 28, 28, generator=g)
    return (images - 0.5) / 0.5, labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device("cuda" if use_cuda else "cpu")

    images, labels = synthetic_mnist(args.samples, args.seed)
    test_images, test_labels = synthetic_mnist(1000, args.seed + 1)
    # Each rank its shard, as DistributedSampler would.
    images, labels = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]

    model = Net().to(device)
    # Horovod's advice: scale the learning rate by the number of ranks.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    for epoch in range(args.epochs):
        model.train()
        total, batches = 0.0, 0
        for start in range(0, len(labels), args.batch_size):
            x = images[start:start + args.batch_size].to(device)
            y = labels[start:start + args.batch_size].to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        train_loss = hvd.allreduce(torch.tensor(total / batches), name="train_loss").item()

        model.eval()
        with torch.no_grad():
            shard = slice(hvd.rank(), None, hvd.size())
            out = model(test_images[shard].to(device))
            test_loss = F.cross_entropy(out, test_labels[shard].to(device), reduction="sum")
            correct = (out.argmax(1) == test_labels[shard].to(device)).sum()
        sums = hvd.allreduce(torch.stack([test_loss.cpu(), correct.cpu().float()]), op=hvd.Sum,
                             name="test_metrics")
        if hvd.rank() == 0:
            print("epoch %d: train loss %.4f, test loss %.4f, accuracy %.1f%% (%d ranks)"
                  % (epoch, train_loss, sums[0] / len(test_labels),
                     100.0 * sums[1] / len(test_labels), hvd.size()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
