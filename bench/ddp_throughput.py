#!/usr/bin/env python3
"""Images/s of plain DDP with and without `import perseus`, and of the Horovod-style benchmark
through perseus.torch against the same script without communication, one rank under perseusrun
(issues 7 and 17: Perseus's cost on one GPU; goals >= 0.99x plain DDP, >= 0.98x no
communication).

    python3 bench/ddp_throughput.py [--fp16] [--json FILE]   # on the GPU machine: resnet50
    python3 bench/ddp_throughput.py --smoke                  # CPU, tiny model, a few steps

Runs, alternating, `perseusrun -np 1 python3 examples/pytorch_ddp_benchmark.py` with
PERSEUS_DDP=0 (torch.distributed's all-reduce: plain DDP) and PERSEUS_DDP=1 (the gradient
buckets through libperseus; with --fp16 also PERSEUS_ALLREDUCE_DTYPE=fp16), then
examples/pytorch_synthetic_benchmark.py with --no-communication (the plain optimizer: Horovod's
calls as no-ops) and with DistributedOptimizer (with --fp16 also Compression.fp16), --repeats
times each. Each run prints its mean images/s; the table gives the median over the repeats and
the ratio to its baseline (plain DDP for the DDP runs, no communication for the others), and
the ratio within each repeat ("pairs"; every other repeat runs in reverse order). Every
DDP run is checked to have used the path it was meant to (the example's "all-reduce through"
line).
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
RATE = re.compile(r"Img/sec per rank: ([\d.]+) \+-([\d.]+)")
THROUGH = re.compile(r"all-reduce through (Perseus|torch\.distributed|none)")
# What each expected path may print: a job of one rank under Perseus has no hook, and says "none".
ACCEPTED = {"Perseus": ("Perseus", "none"), "torch.distributed": ("torch.distributed",)}


def run(cmd, env, timeout):
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return proc, time.time() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perseusrun", default=os.path.join(ROOT, "build/apps/perseusrun/"
                                                                   "perseusrun"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--model", default=None, help="default: resnet50 on GPU, tiny on CPU")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--no-synthetic", action="store_true",
                        help="the DDP runs only")
    parser.add_argument("--no-ddp", action="store_true",
                        help="the DistributedOptimizer runs only")
    parser.add_argument("--fp16", action="store_true",
                        help="also PERSEUS_ALLREDUCE_DTYPE=fp16 DDP and Compression.fp16")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, tiny model, 32x32 images, few steps: checks the script")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json")
    args = parser.parse_args()

    if args.smoke:
        args.model = args.model or "tiny"
        args.batch_size = args.batch_size or 4
        args.image_size = args.image_size or 32
        args.repeats = min(args.repeats, 2)
        args.num_warmup_batches, args.num_batches_per_iter, args.num_iters = 1, 2, 2
    if args.model is None:
        probe = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True)
        args.model = "resnet50" if probe.stdout.strip() == "True" and not args.smoke else "tiny"

    common = ["--model", args.model, "--num-warmup-batches", str(args.num_warmup_batches),
              "--num-batches-per-iter", str(args.num_batches_per_iter),
              "--num-iters", str(args.num_iters)]
    if args.batch_size:
        common += ["--batch-size", str(args.batch_size)]
    if args.image_size:
        common += ["--image-size", str(args.image_size)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "lib/framework_shims")]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                           if p])
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""
    launcher = [args.perseusrun, "-np", "1", "-H", "localhost:1", "-x", "NCCL_NVLS_ENABLE"]

    # key, label, environment, the path the run must report (None: not checked), script and
    # its extra arguments, the key of the run it is compared with.
    ddp_script = "examples/pytorch_ddp_benchmark.py"
    synthetic = "examples/pytorch_synthetic_benchmark.py"
    configs = [] if args.no_ddp else [
        ("ddp", "plain DDP (PERSEUS_DDP=0)", {"PERSEUS_DDP": "0"}, "torch.distributed",
         ddp_script, [], None),
        ("perseus", "DDP + import perseus", {"PERSEUS_DDP": "1"}, "Perseus", ddp_script, [],
         "ddp")]
    if args.fp16 and not args.no_ddp:
        configs.append(("perseus_fp16", "DDP + import perseus, PERSEUS_ALLREDUCE_DTYPE=fp16",
                        {"PERSEUS_DDP": "1", "PERSEUS_ALLREDUCE_DTYPE": "fp16"}, "Perseus",
                        ddp_script, [], "ddp"))
    if not args.no_synthetic:
        configs.append(("nocomm", "no communication (hvd calls as no-ops)", {}, None, synthetic,
                        ["--no-communication"], None))
        configs.append(("horovod", "perseus.torch DistributedOptimizer", {}, None, synthetic, [],
                        "nocomm"))
        if args.fp16:
            configs.append(("horovod_fp16", "DistributedOptimizer, Compression.fp16", {}, None,
                            synthetic, ["--fp16-allreduce"], "nocomm"))
    results = {key: [] for key, *_ in configs}
    by_repeat = {key: {} for key, *_ in configs}  # key -> {repeat: img/s}, for the pairs
    failures = []
    print("# model %s, batch %s, image %s, %d warm-up, %d x %d timed batches, %d repeats"
          % (args.model, args.batch_size or "default", args.image_size or "default",
             args.num_warmup_batches, args.num_iters, args.num_batches_per_iter, args.repeats),
          flush=True)
    for repeat in range(args.repeats):
        # ABBA: every other repeat runs the configurations in reverse order, so that neither a
        # run nor its baseline always goes first (a GPU's clocks, the page cache).
        for key, label, extra_env, through, script, extra, _ in (
                configs if repeat % 2 == 0 else configs[::-1]):
            run_env = dict(env, **extra_env)
            run_env.setdefault("PERSEUS_DDP", "1")
            forward = []
            for name in sorted(set(extra_env) | {"PERSEUS_DDP"}):
                forward += ["-x", name]
            cmd = launcher + forward + [args.python, os.path.join(ROOT, script)] + common + extra
            proc, took = run(cmd, run_env, args.timeout)
            m = RATE.search(proc.stdout)
            t = THROUGH.search(proc.stdout)
            if proc.returncode != 0 or not m or (
                    through and (not t or t.group(1) not in ACCEPTED[through])):
                failures.append("%s (repeat %d): exit %d, through %s\n%s\n%s" % (
                    label, repeat, proc.returncode, t.group(1) if t else "?",
                    proc.stdout[-3000:], proc.stderr[-3000:]))
                print("FAILED: %s repeat %d (exit %d)" % (label, repeat, proc.returncode),
                      flush=True)
                continue
            results[key].append(float(m.group(1)))
            by_repeat[key][repeat] = float(m.group(1))
            header = [line for line in proc.stdout.splitlines() if "Model:" in line]
            if repeat == 0 and header:
                print("# %s: %s" % (key, header[0].split(">:", 1)[-1]), flush=True)
            print("%-36s repeat %d: %8.1f img/s (+-%.1f), %.1f s" % (
                label, repeat, float(m.group(1)), float(m.group(2)), took), flush=True)

    summary = {}
    print()
    # "pairs": the ratio within each repeat (the run and its baseline run one after the other),
    # median (min-max): what drifts between repeats (clocks, the machine's load) cancels there.
    print("| run | median img/s | runs (img/s) | against | pairs: median (min-max) |")
    print("|---|---|---|---|---|")
    labels = {key: label for key, label, *_ in configs}
    for key, label, _, _, _, _, base in configs:
        values = results[key]
        if not values:
            print("| %s | failed | | |" % label)
            continue
        med = statistics.median(values)
        against = statistics.median(results[base]) if base and results.get(base) else None
        ratio = med / against if against else None
        pairs = [v / by_repeat[base][r] for r, v in by_repeat[key].items()
                 if base and r in by_repeat.get(base, {})]
        summary[key] = {"label": label, "median": med, "runs": values, "against": base,
                        "ratio": ratio, "pairs": pairs,
                        "overhead_pct": (1 - ratio) * 100 if ratio is not None else None}
        print("| %s | %.1f | %s | %s | %s |" % (
            label, med, ", ".join("%.1f" % v for v in values),
            "-" if ratio is None else "%.3fx %s" % (ratio, labels[base]),
            "%.3f (%.3f-%.3f)" % (statistics.median(pairs), min(pairs), max(pairs))
            if pairs else "-"))
    if "perseus" in summary and summary["perseus"]["ratio"] is not None:
        o = summary["perseus"]["overhead_pct"]
        print("\nOverhead of `import perseus` against plain DDP: %.2f%% (goal < 1%%: %s)"
              % (o, "met" if o < 1.0 else "NOT met"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": summary, "failures": failures}, f,
                      indent=1)
    for f in failures:
        print("\n--- failure ---\n" + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
