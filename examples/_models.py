"""The benchmarks' models (examples/pytorch_ddp_benchmark.py, pytorch_synthetic_benchmark.py):
torchvision's when it is installed, else ResNet-50 (He et al., torchvision's layout: Bottleneck
blocks 3-4-6-3, stride on the 3x3) in plain torch, and a tiny ResNet-like network for CPU runs."""
import torch.nn as nn


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.short(x))


def resnet50(num_classes=1000):
    layers, cin = [], 64
    for i, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, 2 if b == 0 and i > 0 else 1))
            cin = width * 4
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(cin, num_classes))


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
        if name == "resnet50":  # the same network in plain torch, below
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
