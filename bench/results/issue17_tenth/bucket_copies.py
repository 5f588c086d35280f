# How long a DistributedOptimizer step spends packing its bucket (flatten), unpacking the
# result (scatter) and waiting for the all-reduce (ops.synchronize): medians over 250 steps of
# rank 0, the 200-tensor model of bench/submission_path.py. Run under perseusrun -np N.
import time, statistics, torch, os
import perseus.torch.horovod as hvd
from perseus.torch import _buckets, ops
torch.set_num_threads(1)
hvd.init()
acc = {"flatten": [], "scatter": [], "wait": [], "hooks": []}
def timed(name, fn):
    def w(*a, **k):
        s = time.perf_counter(); r = fn(*a, **k); acc[name].append((time.perf_counter() - s) * 1e3); return r
    return w
_buckets.Bucket.flatten = timed("flatten", _buckets.Bucket.flatten)
_buckets.Bucket.scatter = timed("scatter", _buckets.Bucket.scatter)
ops.synchronize = timed("wait", ops.synchronize)
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(100)])
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001), named_parameters=model.named_parameters())
x, y = torch.randn(16, 32), torch.randn(16, 32)
for i in range(300):
    opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
if hvd.rank() == 0:
    print(" ".join("%s %.3f" % (k, statistics.median(v[50:])) for k, v in acc.items() if v))
hvd.shutdown()
