# Where a rank's CPU goes during the 200-tensor step of bench/submission_path.py: the step's
# phases (forward, backward, step: medians of rank 0) and each thread's CPU time per step from
# /proc/self/task/*/schedstat (run and run-queue wait, ns), with the main thread's involuntary
# context switches. Run as: perseusrun -np N python3 thread_cpu.py none|hvd [steps]
import os, sys, time, statistics
import torch
import perseus.torch.horovod as hvd

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
torch.set_num_threads(1)
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(100)])
opt = torch.optim.SGD(model.parameters(), lr=0.001)
if mode == "hvd":
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.randn(16, 32), torch.randn(16, 32)


def threads():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/schedstat" % tid) as f:
                run, wait, _ = map(int, f.read().split())
            with open("/proc/self/task/%s/status" % tid) as f:
                nv = [int(l.split()[1]) for l in f if l.startswith("nonvoluntary_ctxt_switches")][0]
            with open("/proc/self/task/%s/stat" % tid) as f:
                cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        except OSError:
            continue
        out[int(tid)] = (run, wait, nv, cpu)
    return out


phases = {"fwd": [], "bwd": [], "step": [], "total": []}
for i in range(20):
    opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
hvd.barrier()
before, start = threads(), time.perf_counter()
cpus = set()
for i in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    t3 = time.perf_counter()
    phases["fwd"].append(t1 - t0); phases["bwd"].append(t2 - t1); phases["step"].append(t3 - t2)
    phases["total"].append(t3 - t0)
    if i % 50 == 0:
        cpus.add(os.sched_getcpu() if hasattr(os, "sched_getcpu") else -1)
wall = time.perf_counter() - start
after = threads()
me = os.getpid()
rows = []
for tid, (run, wait, nv, cpu) in after.items():
    b = before.get(tid, (0, 0, 0, 0))
    rows.append((tid == me, (run - b[0]) / steps / 1e6, (wait - b[1]) / steps / 1e6, nv - b[2], cpu))
rows.sort(key=lambda r: (-r[0], -r[1]))
line = "rank %d %s wall/step %.3f ms | %s | threads (ms/step run, ms/step runq wait, nonvol): %s" % (
    hvd.rank(), mode, wall / steps * 1e3,
    " ".join("%s %.3f" % (k, statistics.median(v) * 1e3) for k, v in phases.items()),
    "; ".join("%s%.3f/%.3f/%d@%d" % ("main " if m else "", r, w, n, c) for m, r, w, n, c in rows[:6]))
print(line, flush=True)
hvd.shutdown()
