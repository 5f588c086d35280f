"""Plain DistributedDataParallel after `import perseus`: the same parameters as one process on
the whole batches, and the gradient buckets went through libperseus (or, with PERSEUS_DDP=0,
did not). argv[1]: "on" or "off", what the test expects."""
import perseus  # noqa: I001 - first, before torch, as users write it

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from common import Checks, run  # noqa: E402


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 3))


def main():
    expect = sys.argv[1]
    check = Checks("ddp")
    dist.init_process_group("gloo")
    n, me = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(12, 8, generator=g), torch.randint(0, 3, (12,), generator=g))
            for _ in range(6)]

    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    model = DDP(make_model(), bucket_cap_mb=0.001)  # small buckets: several per step
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    per = 12 // n
    for x, y in data:
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        loss_fn(model(x[me * per:(me + 1) * per]), y[me * per:(me + 1) * per]).backward()
        opt.step()
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        check.close(p.detach(), q.detach(), "DDP parameter %s" % name, rtol=1e-5, atol=1e-6)

    stats = perseus.ddp_stats()
    if expect == "on":
        check(stats["models"] == 1, "one DDP model uses Perseus: %s" % stats)
        check(stats["buckets"] >= len(data), "buckets went through Perseus: %s" % stats)
    else:
        check(stats["models"] == 0 and stats["buckets"] == 0, "PERSEUS_DDP=0: %s" % stats)

    # A model whose script registers its own hook keeps it.
    own = DDP(make_model())
    calls = []

    def hook(state, bucket):
        calls.append(1)
        fut = torch.futures.Future()
        t = bucket.buffer()
        dist.all_reduce(t)
        fut.set_result(t / n)
        return fut
    own.register_comm_hook(None, hook)
    loss_fn(own(data[0][0]), data[0][1]).backward()
    check(calls, "the script's own comm hook ran")
    check(perseus.ddp_stats()["models"] == stats["models"], "Perseus stayed out of that model")
    del own, model  # torch 1.13 hangs at exit when DDP models outlive their process group
    dist.destroy_process_group()
    check.finish()


run(main)
