#!/usr/bin/env python3
"""The Python submission path of perseus.torch on CPU (issue 17): what a training step and many
small all-reduces cost through the shim, against the same work without communication.

    python3 bench/submission_path.py [--ranks 1,2] [--repeats 5] [--json FILE]
                                     [--horovod PYTHON] [--fp16] [--device cuda] [--no-small]
    python3 bench/submission_path.py --interleave BLOCKS [--steps 20] [--ranks 4] [--repeats 5]

Two measurements, each run as its own `perseusrun -np N` job, runs alternating:
- step: ms per training step of a model of 100 Linear(32, 32) layers (200 parameter tensors),
  batch 16, torch on one thread, SGD; "none" is the plain optimizer (Horovod's calls as
  no-ops), "hvd" the same script with hvd.DistributedOptimizer. 20 warm-up steps, 100 timed.
- small: 1000 tensors of 4 KB (1024 float32) all-reduced through perseus.torch.horovod as
  1000 allreduce_async_ then synchronize, 1000 blocking allreduce_, one grouped_allreduce_,
  and 1000 blocking calls on one tensor (the per-call latency); 5 timed rounds each, the
  median kept. The names are made once, before the rounds, as the C benchmark makes its own.
  Alternating with them, the same through libperseus's C API
  (build/bench/cpu_allreduce_perseus): 1000 blocking perseus_allreduce calls of 4 KB, and the
  1000 tensors submitted with perseus_allreduce_async then waited for ("C fused", the figure
  the Python async path is held to, within 2x).
--fp16 adds "hvd16", DistributedOptimizer with Compression.fp16, to the step. --device cuda
runs the step on the GPU (one per local rank; the small case stays on CPU tensors).
--horovod PYTHON (an interpreter with horovod[pytorch] built with Gloo, its horovodrun beside
it) adds real Horovod in the same runs: the step with horovod.torch's DistributedOptimizer and
the small case through horovod.torch, each started by `horovodrun --gloo`, alternating with the
others. The table gives medians over the repeats, the spread (min-max), and the step's ratio
against none.
--interleave BLOCKS runs only the step, both kinds inside each job: BLOCKS blocks of --steps
steps with the plain optimizer and with DistributedOptimizer alternating (two models of the same
shape), for hosts whose speed changes between runs more than the step does (on the GPU
machine's host one thread's forward pass took 0.79 ms in one 1.5-second window and 1.16-1.22
ms in the windows before and after it). It gives rank
0's figures and the slowest rank's (the time of a job without communication is its slowest
rank's), ratios taken block by block.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hvd(kind):
    if kind == "horovod":
        import horovod.torch as hvd
    else:
        import perseus.torch.horovod as hvd
    return hvd


def _model(torch, device):
    """The step's model: 100 Linear(32, 32) layers, 200 parameter tensors."""
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(100)]).to(device)


def _train(torch, model, optimizer, x, y, count):
    """`count` training steps of `model` on the batch (x, y)."""
    for _ in range(count):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def worker_step(comm, steps, warmup, device="cpu"):
    import torch
    hvd = _hvd(comm)
    torch.set_num_threads(1)
    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    torch.manual_seed(0)
    model = _model(torch, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    if comm in ("hvd", "hvd16", "horovod"):
        compression = hvd.Compression.fp16 if comm == "hvd16" else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(16, 32, device=device), torch.randn(16, 32, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    _train(torch, model, optimizer, x, y, warmup)
    sync()
    hvd.barrier()
    start = time.perf_counter()
    _train(torch, model, optimizer, x, y, steps)
    sync()
    took = (time.perf_counter() - start) / steps * 1000
    if hvd.rank() == 0:
        print("RESULT step %.3f" % took, flush=True)
    hvd.shutdown()


def worker_interleave(blocks, steps, device="cpu"):
    """The step with and without communication in one job, in alternating blocks of `steps`
    steps (which goes first alternates too), so that both see the same machine: on a host whose
    speed changes from one second to the next, separate runs compare different machines. Two
    models of the same shape, one with the plain optimizer, one with DistributedOptimizer; a
    barrier before each block. Rank 0 prints, as medians over the blocks: its own ms per step
    of each (none0, hvd0), the slowest rank's (nonemax, hvdmax: a job without communication
    ends when its slowest rank does), and the ratios block by block."""
    import torch
    hvd = _hvd("perseus")
    torch.set_num_threads(1)
    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    torch.manual_seed(0)
    plain_model, dist_model = _model(torch, device), _model(torch, device)
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.001)
    dist = hvd.DistributedOptimizer(torch.optim.SGD(dist_model.parameters(), lr=0.001),
                                    named_parameters=dist_model.named_parameters())
    hvd.broadcast_parameters(dist_model.state_dict(), root_rank=0)
    x, y = torch.randn(16, 32, device=device), torch.randn(16, 32, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    _train(torch, plain_model, plain, x, y, 20)
    _train(torch, dist_model, dist, x, y, 20)
    times = {"none": [], "hvd": []}
    for block in range(blocks):
        order = [("none", plain_model, plain), ("hvd", dist_model, dist)]
        for kind, model, optimizer in (order if block % 2 == 0 else order[::-1]):
            sync()
            hvd.barrier()
            start = time.perf_counter()
            _train(torch, model, optimizer, x, y, steps)
            sync()
            times[kind].append((time.perf_counter() - start) / steps * 1000)
    every = hvd.allgather(torch.tensor([times["none"] + times["hvd"]], dtype=torch.float64))
    if hvd.rank() == 0:
        none0, hvd0 = every[0, :blocks], every[0, blocks:]
        nonemax, hvdmax = every[:, :blocks].max(0).values, every[:, blocks:].max(0).values
        median = lambda t: statistics.median(t.tolist())
        for name, value in [("none0", median(none0)), ("hvd0", median(hvd0)),
                            ("nonemax", median(nonemax)), ("hvdmax", median(hvdmax)),
                            ("ratio0", median(hvd0 / none0)),
                            ("ratiomax", median(hvdmax / nonemax))]:
            print("RESULT %s %.4f" % (name, value), flush=True)
    hvd.shutdown()


def worker_small(kind):
    import torch
    hvd = _hvd(kind)
    torch.set_num_threads(1)
    hvd.init()
    tensors = [torch.ones(1024) for _ in range(1000)]
    one = torch.ones(1024)
    # Named once, as the C benchmark names its tensors once and as DistributedOptimizer names
    # its parameters once: the loops time the submissions, not the formatting of names.
    async_names = ["async.%d" % i for i in range(len(tensors))]
    blocking_names = ["blocking.%d" % i for i in range(len(tensors))]

    def many_async():
        handles = [hvd.allreduce_async_(t, name=name, op=hvd.Sum)
                   for t, name in zip(tensors, async_names)]
        for h in handles:
            hvd.synchronize(h)

    def many_blocking():
        for t, name in zip(tensors, blocking_names):
            hvd.allreduce_(t, name=name, op=hvd.Sum)

    def grouped():
        hvd.grouped_allreduce_(tensors, name="grouped", op=hvd.Sum)

    def one_call():
        for _ in range(1000):
            hvd.allreduce_(one, name="one", op=hvd.Sum)

    for name, fn in [("async", many_async), ("blocking", many_blocking), ("grouped", grouped),
                     ("call_us", one_call)]:
        fn()
        times = []
        for _ in range(5):
            hvd.barrier()
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
        if hvd.rank() == 0:
            # call_us: 1000 calls, so ms per 1000 calls = us per call
            print("RESULT %s %.3f" % (name, statistics.median(times)), flush=True)
    hvd.shutdown()


def launch(args, ranks, worker_args, horovod=False):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "lib/framework_shims")] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["OMP_NUM_THREADS"] = "1"
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if horovod:
        runner = os.path.join(os.path.dirname(args.horovod), "horovodrun")
        cmd = [runner, "--gloo", "-np", str(ranks), "-H", "localhost:%d" % ranks, args.horovod]
    else:
        cmd = [args.perseusrun, "-np", str(ranks), "-H", "localhost:%d" % ranks, args.python]
    cmd += [os.path.abspath(__file__), "--worker"] + worker_args
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace",
                          timeout=args.timeout, stdin=subprocess.DEVNULL)
    found = dict((m.group(1), float(m.group(2))) for m in
                 re.finditer(r"RESULT (\w+) ([\d.]+)", proc.stdout))
    if proc.returncode != 0 or not found:
        raise SystemExit("failed: %s\n%s\n%s" % (" ".join(cmd), proc.stdout[-3000:],
                                                  proc.stderr[-3000:]))
    return found


def launch_c(args, ranks):
    """The small case through the C API: {"c_call_us", "c_blocking", "c_fused"}."""
    cmd = [args.perseusrun, "-np", str(ranks), "-H", "localhost:%d" % ranks, args.c_bench,
           "4096:1000", "1000:4096:5"]
    # Host buffers only: on a GPU machine perseusrun would otherwise bind a GPU to each rank
    # and refuse more ranks than GPUs.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace",
                          timeout=args.timeout, stdin=subprocess.DEVNULL)
    found = {}
    for line in proc.stdout.splitlines():
        if "{" not in line:
            continue
        record = json.loads(line[line.index("{"):])
        if record["case"] == "size":
            found["c_call_us"] = record["us_per_call"]
        elif record["case"] == "many":
            found["c_blocking"] = record["ms_per_iter"]
        elif record["case"] == "many_fused":
            found["c_fused"] = record["ms_per_iter"]
    if proc.returncode != 0 or len(found) != 3:
        raise SystemExit("failed: %s\n%s\n%s" % (" ".join(cmd), proc.stdout[-3000:],
                                                  proc.stderr[-3000:]))
    return found


def interleaved(args):
    """--interleave: each job alternates the two steps block by block (worker_interleave)."""
    print("# %s, %d CPUs, python %s, interleaved: %d blocks of %d steps a job" % (
        time.strftime("%Y-%m-%d %H:%M:%S"), os.cpu_count(), sys.version.split()[0],
        args.interleave, args.steps), flush=True)
    keys = ("none0", "hvd0", "ratio0", "nonemax", "hvdmax", "ratiomax")
    results = {}
    for ranks in [int(r) for r in args.ranks.split(",")]:
        found = {key: [] for key in keys}
        for repeat in range(args.repeats):
            got = launch(args, ranks, ["interleave", str(args.interleave), str(args.steps),
                                       args.device])
            for key in keys:
                found[key].append(got[key])
            print("np %d job %d: " % (ranks, repeat) +
                  " ".join("%s %.3f" % (key, got[key]) for key in keys), flush=True)
        results[ranks] = found
    print()
    print("Step (%s), ms, both in each job (medians over its blocks), then medians over the "
          "jobs (min-max):" % args.device)
    print()
    print("| ranks | rank 0: none | rank 0: DistributedOptimizer | ratio | slowest rank: none | "
          "slowest rank: DistributedOptimizer | ratio |")
    print("|---|---|---|---|---|---|---|")
    for ranks, r in results.items():
        print("| %d | %s |" % (ranks, " | ".join(
            spread(r[key]) + ("x" if key.startswith("ratio") else "") for key in keys)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(k): v for k, v in results.items()}, f, indent=1)
    return 0


def spread(values):
    return "%.2f (%.2f-%.2f)" % (statistics.median(values), min(values), max(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs="*")
    parser.add_argument("--perseusrun", default=os.path.join(ROOT, "build/apps/perseusrun/"
                                                                   "perseusrun"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json")
    parser.add_argument("--horovod", help="a Python with horovod.torch (Gloo): also run Horovod")
    parser.add_argument("--c-bench", default=os.path.join(ROOT, "build/bench/"
                                                                "cpu_allreduce_perseus"))
    parser.add_argument("--fp16", action="store_true",
                        help="also DistributedOptimizer with Compression.fp16 (hvd16)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the step's model lives")
    parser.add_argument("--no-small", action="store_true", help="the step only")
    parser.add_argument("--interleave", type=int, metavar="BLOCKS",
                        help="instead: the step with and without communication alternating in "
                             "BLOCKS blocks of --steps steps inside each job (--repeats jobs)")
    args = parser.parse_args()
    if args.worker is not None:
        if args.worker[0] == "step":
            return worker_step(args.worker[1], int(args.worker[2]), 20, args.worker[3])
        if args.worker[0] == "interleave":
            return worker_interleave(int(args.worker[1]), int(args.worker[2]), args.worker[3])
        return worker_small(args.worker[1] if len(args.worker) > 1 else "perseus")
    kinds = ["none", "hvd"] + (["hvd16"] if args.fp16 else []) + (
        ["horovod"] if args.horovod else [])
    small_kinds = ["hvd", "c"] + (["horovod"] if args.horovod else [])

    if args.interleave:
        return interleaved(args)
    results = {}
    print("# %s, %d CPUs, python %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), os.cpu_count(),
                                        sys.version.split()[0]), flush=True)
    for ranks in [int(r) for r in args.ranks.split(",")]:
        step = {kind: [] for kind in kinds}
        for repeat in range(args.repeats):
            for comm in kinds:
                value = launch(args, ranks, ["step", comm, str(args.steps), args.device],
                               horovod=comm == "horovod")["step"]
                step[comm].append(value)
                print("np %d step %-7s repeat %d: %.3f ms" % (ranks, comm, repeat, value),
                      flush=True)
        small = {kind: {} for kind in small_kinds}
        for repeat in range(0 if args.no_small else args.repeats):
            for kind in small_kinds:
                if kind == "c":
                    found = launch_c(args, ranks)
                else:
                    found = launch(args, ranks, ["small", "perseus" if kind == "hvd" else kind],
                                   horovod=kind == "horovod")
                for key, value in found.items():
                    small[kind].setdefault(key, []).append(value)
        if not args.no_small:
            small["hvd"].update(small["c"])
        results[ranks] = {"step": step, "small": small["hvd"]}
        if args.horovod:
            results[ranks]["horovod"] = {"step": step.pop("horovod"), "small": small["horovod"]}

    print()
    print("Step (%s), ms:" % args.device)
    print()
    print("| ranks | no communication | DistributedOptimizer | ratio |%s" % (
        " Compression.fp16 | ratio |" if args.fp16 else ""))
    print("|---|---|---|---|%s" % ("---|---|" if args.fp16 else ""))
    for ranks, r in results.items():
        none = statistics.median(r["step"]["none"])
        line = "| %d | %s | %s | %.2fx |" % (ranks, spread(r["step"]["none"]),
                                              spread(r["step"]["hvd"]),
                                              statistics.median(r["step"]["hvd"]) / none)
        if args.fp16:
            line += " %s | %.2fx |" % (spread(r["step"]["hvd16"]),
                                       statistics.median(r["step"]["hvd16"]) / none)
        print(line)
    if not args.no_small:
        print()
        print("1000 x 4 KB float32 all-reduces (ms), and one blocking 4 KB call (us):")
        print()
        print("| ranks | Python async | Python blocking | Python grouped | C API fused | "
              "async / C fused | C API blocking | Python one call (us) | C one call (us) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for ranks, r in results.items():
            s = r["small"]
            print("| %d | %s | %s | %s | %s | %.2fx | %s | %s | %s |" % (
                ranks, spread(s["async"]), spread(s["blocking"]), spread(s["grouped"]),
                spread(s["c_fused"]),
                statistics.median(s["async"]) / statistics.median(s["c_fused"]),
                spread(s["c_blocking"]), spread(s["call_us"]), spread(s["c_call_us"])))
    if args.horovod:
        print()
        print("Real Horovod (%s), the same runs:" % args.horovod)
        print()
        print("| ranks | step, Horovod DistributedOptimizer (ms) | ratio to no communication | "
              "1000 x 4 KB async (ms) | blocking (ms) | grouped (ms) | one blocking call (us) |")
        print("|---|---|---|---|---|---|---|")
        for ranks, r in results.items():
            h = r["horovod"]
            ratio = statistics.median(h["step"]) / statistics.median(r["step"]["none"])
            small = [spread(h["small"][k]) if h["small"] else "-"
                     for k in ("async", "blocking", "grouped", "call_us")]
            print("| %d | %s | %.2fx | %s | %s | %s | %s |" % (
                (ranks, spread(h["step"]), ratio) + tuple(small)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(k): v for k, v in results.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
