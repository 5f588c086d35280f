# What a backward pass of the 200-tensor model (bench/submission_path.py's) pays for 200 Python
# hooks of each kind torch offers, without any communication: none; a no-op hook on each
# parameter's gradient accumulator (Horovod's and DistributedOptimizer's way); a no-op
# post-accumulate-grad hook on each parameter (torch >= 2.1); DistributedOptimizer's own hooks
# with submission stubbed out. Medians of rounds of 50 backward passes, the variants interleaved.
import statistics, sys, time
import torch

torch.set_num_threads(1)
torch.manual_seed(0)
x, y = torch.randn(16, 32), torch.randn(16, 32)


def make():
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(100)])


variants = {}
m = make(); variants["none"] = m
m = make(); keep = []
for p in m.parameters():
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    acc.register_hook(lambda *a: None); keep.append(acc)
variants["acc_hook"] = m
if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
    m = make()
    for p in m.parameters():
        p.register_post_accumulate_grad_hook(lambda t: None)
    variants["post_acc_hook"] = m
counter = [0]
m = make()
for p in m.parameters():
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    def hook(*a, c=counter):
        c[0] += 1
    acc.register_hook(hook); keep.append(acc)
variants["acc_hook_count"] = m

times = {k: [] for k in variants}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
for r in range(rounds):
    for k, model in variants.items():
        loss_fn = torch.nn.functional.mse_loss
        t = 0.0
        for i in range(50):
            model.zero_grad()
            loss = loss_fn(model(x), y)
            s = time.perf_counter(); loss.backward(); t += time.perf_counter() - s
        if r >= 3:
            times[k].append(t / 50 * 1e3)
base = statistics.median(times["none"])
print("torch %s, backward ms (median of %d rounds of 50; min-max); extra over none in us per hook"
      % (torch.__version__, rounds - 3))
for k, v in times.items():
    med = statistics.median(v)
    print("  %-16s %.3f (%.3f-%.3f)  %+.2f us/hook" % (k, med, min(v), max(v), (med - base) / 200 * 1e3))
