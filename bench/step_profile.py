#!/usr/bin/env python3
"""Where a DistributedOptimizer step goes (issue 17's profile): the 200-tensor step of
bench/submission_path.py split into forward, backward (the hooks run inside it), synchronize()
and the optimizer's own step, per rank count and gradient-bucket size, with libperseus's
timeline (PERSEUS_TIMELINE) summarised: negotiation and all-reduce times per step, and rank 0's
synchronize() split in two: waiting for the last rank to end its backward pass ("wait for the
last", the ranks' skew, which a job without communication never pays) and what follows it.

    python3 bench/step_profile.py [--ranks 1,2] [--buckets 4194304,262144,0] [--steps 100]
                                  [--baseline]

Each cell is the median over the timed steps of rank 0 (20 warm-up steps first). --baseline adds,
for each rank count, a row of the same step without communication (the plain optimizer, as
bench/submission_path.py's "none"), whose forward, backward and step the others compare with.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ("forward", "backward", "synchronize", "step")


def worker(steps, baseline=False):
    import torch
    import perseus.torch.horovod as hvd
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(100)])
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    if not baseline:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    x, y = torch.randn(16, 32), torch.randn(16, 32)
    times = {k: [] for k in PHASES}
    ends = []  # (backward's end, synchronize's end) of each timed step, time.monotonic()
    for i in range(20 + steps):
        t0 = time.monotonic()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        t1 = time.monotonic()
        loss.backward()
        t2 = time.monotonic()
        if baseline:
            t3 = time.monotonic()
            opt.step()
        else:
            opt.synchronize()
            t3 = time.monotonic()
            with opt.skip_synchronize():
                opt.step()
        t4 = time.monotonic()
        if i >= 20:
            for k, a, b in zip(PHASES, (t0, t1, t2, t3), (t1, t2, t3, t4)):
                times[k].append((b - a) * 1000)
            ends.append((t2, t3))
    # CLOCK_MONOTONIC is one clock for every process of the host: the ranks' times compare.
    everyone = hvd.allgather_object(ends, name="step_profile.ends")
    if hvd.rank() == 0:
        last = [max(rank[i][0] for rank in everyone) for i in range(len(ends))]
        wait = [(t - e[0]) * 1000 for t, e in zip(last, ends)]
        after = [(e[1] - t) * 1000 for t, e in zip(last, ends)]
        print("RESULT " + json.dumps({k: statistics.median(v) for k, v in times.items()}
                                     | {"buckets": len(getattr(opt, "_buckets", ())),
                                        "wait": statistics.median(wait),
                                        "after": statistics.median(after)}), flush=True)
    hvd.shutdown()


def timeline_summary(path):
    """Median us per all-reduce of negotiation and of the all-reduce itself (rank 0's view)."""
    with open(path) as f:
        text = f.read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    open_at, spans = {}, {}
    for e in events:
        if e.get("ph") == "B":
            open_at[e["pid"]] = (e["name"], e["ts"])
        elif e.get("ph") == "E" and e["pid"] in open_at:
            name, ts = open_at.pop(e["pid"])
            spans.setdefault(name, []).append(e["ts"] - ts)
        elif e.get("ph") == "X":
            spans.setdefault(e["name"], []).append(e["dur"])
    return {k: (statistics.median(v), len(v)) for k, v in spans.items() if "BARRIER" not in k}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", type=int)
    parser.add_argument("--worker-baseline", action="store_true")
    parser.add_argument("--perseusrun", default=os.path.join(ROOT, "build/apps/perseusrun/"
                                                                   "perseusrun"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--buckets", default="4194304,262144,0")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--baseline", action="store_true",
                        help="also the step without communication, once per rank count")
    args = parser.parse_args()
    if args.worker is not None:
        return worker(args.worker, args.worker_baseline)
    print("| ranks | bucket bytes | buckets | forward | backward | synchronize | step | "
          "sync: wait for the last | sync: after the last | "
          "per step: negotiations (median us) | all-reduces (median us) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for ranks in [int(r) for r in args.ranks.split(",")]:
        for bucket in (["none"] if args.baseline else []) + args.buckets.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                trace = os.path.join(tmp, "timeline.json")
                env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
                           PERSEUS_TIMELINE=trace)
                if bucket != "none":
                    env["PERSEUS_GRADIENT_BUCKET_BYTES"] = bucket
                env["PYTHONPATH"] = os.pathsep.join(
                    [os.path.join(ROOT, "lib/framework_shims")] +
                    [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
                cmd = [args.perseusrun, "-np", str(ranks), "-H", "localhost:%d" % ranks,
                       args.python, os.path.abspath(__file__), "--worker", str(args.steps)]
                if bucket == "none":
                    cmd.append("--worker-baseline")
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      errors="replace", timeout=300, stdin=subprocess.DEVNULL)
                line = [x for x in proc.stdout.splitlines() if "RESULT " in x]
                if proc.returncode != 0 or not line:
                    raise SystemExit("failed: %s\n%s\n%s" % (" ".join(cmd), proc.stdout[-3000:],
                                                              proc.stderr[-3000:]))
                r = json.loads(line[0].split("RESULT ", 1)[1])
                spans = timeline_summary(trace) if os.path.exists(trace) else {}
            steps = 20 + args.steps
            neg = spans.get("NEGOTIATE_ALLREDUCE", (0, 0))
            red = [v for k, v in spans.items() if k.endswith("ALLREDUCE") and
                   not k.startswith("NEGOTIATE") and k != "ALLREDUCE"]
            # Without communication the ranks never wait for each other: no skew to split.
            split = "- | -" if bucket == "none" else "%.3f | %.3f" % (r["wait"], r["after"])
            print("| %d | %s | %d | %s | %s | %s | %s |" % (
                ranks, bucket, r["buckets"], " | ".join("%.3f" % r[k] for k in PHASES), split,
                "%.1f x %.0f" % (neg[1] / steps, neg[0]) if neg[1] else "-",
                ", ".join("%.1f x %.0f" % (v[1] / steps, v[0]) for v in red) or "-"),
                flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
