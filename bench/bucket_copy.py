#!/usr/bin/env python3
"""What packing a gradient bucket and unpacking its result cost in torch (issue 17): the 200
gradients of bench/submission_path.py's model (100 x Linear(32, 32)), each way of copying them
into one flat tensor and back, median us of 300 calls, torch on one thread, CPU.

    python3 bench/bucket_copy.py

perseus.torch's buckets (lib/framework_shims/perseus/torch/_buckets.py) keep a flat buffer and
its views across steps, so that where torch has _foreach_copy_ a step pays the last line twice
instead of "flatten" plus "unflatten + _foreach_copy_".
"""
import statistics
import time

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def median_us(f, n=300):
    for _ in range(20):
        f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main():
    torch.set_num_threads(1)
    params = list(torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(100)]).parameters())
    grads = [torch.randn_like(p) for p in params]
    flat = _flatten_dense_tensors(grads)
    views = _unflatten_dense_tensors(flat, params)
    copy_many = getattr(torch, "_foreach_copy_", None)
    cases = [
        ("flatten: a new flat tensor (torch.cat)", lambda: _flatten_dense_tensors(grads)),
        ("unflatten: new views of a flat tensor", lambda: _unflatten_dense_tensors(flat, params)),
        ("unpack: new views, then a copy_ each", lambda: [
            g.copy_(v) for g, v in zip(grads, _unflatten_dense_tensors(flat, params))]),
        ("unpack: kept views, a copy_ each", lambda: [g.copy_(v) for g, v in zip(grads, views)]),
    ]
    if copy_many is not None:
        cases += [
            ("unpack: new views, one _foreach_copy_",
             lambda: copy_many(grads, _unflatten_dense_tensors(flat, params))),
            ("pack or unpack: kept views, one _foreach_copy_", lambda: copy_many(views, grads)),
        ]
    print("# torch %s, %d gradients, %d elements" % (torch.__version__, len(grads), flat.numel()))
    for name, f in cases:
        print("%-48s %8.1f us" % (name, median_us(f)))


if __name__ == "__main__":
    main()
