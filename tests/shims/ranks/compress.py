"""PERSEUS_ALLREDUCE_DTYPE (fp16/bf16 gradient all-reduces) and PERSEUS_ALLREDUCE_NANCHECK=1 in
DistributedOptimizer, the DDP hook and allreduce. The variables are read at each use, so this
script sets them itself, the same on every rank. A spy on perseus._native.allreduce_async
records the element type each all-reduce was submitted with."""
import perseus  # noqa: I001 - first, as users write it

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import perseus.torch as hvd  # noqa: E402
from perseus import _native  # noqa: E402
from common import Checks, run  # noqa: E402

BATCH = 12
FLOAT32, FLOAT16, BFLOAT16 = (_native.DTYPES[k] for k in ("float32", "float16", "bfloat16"))

submitted = []  # (name, dtype code) of every allreduce_async
_original_allreduce_async = _native.allreduce_async


def _spy(send, recv, count, dtype, *args, **kwargs):
    name = args[3] if len(args) > 3 else kwargs.get("name")
    submitted.append((name, dtype))
    return _original_allreduce_async(send, recv, count, dtype, *args, **kwargs)


_native.allreduce_async = _spy


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3))


def batches(steps=4):
    g = torch.Generator().manual_seed(42)
    return [(torch.randn(BATCH, 8, generator=g), torch.randint(0, 3, (BATCH,), generator=g))
            for _ in range(steps)]


def reference(data):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        opt.zero_grad()
        nn.CrossEntropyLoss()(model(x), y).backward()
        opt.step()
    return model


def shard(t, n, me):
    per = t.shape[0] // n
    return t[me * per:(me + 1) * per]


def set_env(dtype=None, nancheck=False):
    for key, value in (("PERSEUS_ALLREDUCE_DTYPE", dtype),
                       ("PERSEUS_ALLREDUCE_NANCHECK", "1" if nancheck else None)):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def optimizer_run(data, n, me, nan_rank=None, **kwargs):
    model = make_model()
    if nan_rank == me:
        model[2].weight.register_hook(_poison)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kwargs)
    for x, y in data:
        opt.zero_grad()
        nn.CrossEntropyLoss()(model(shard(x, n, me)), shard(y, n, me)).backward()
        opt.step()
    return model


def _poison(grad):
    grad = grad.clone()
    grad.view(-1)[3] = float("nan")
    return grad


def same_params(check, a, b, what, tol):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        check.close(p.detach(), q.detach(), "%s: %s" % (what, name), rtol=tol, atol=tol)


def dtypes_of(prefix):
    return {d for name, d in submitted if name and name.startswith(prefix)}


def main():
    check = Checks("compress")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    data = batches()
    ref = reference(data)

    # DistributedOptimizer: the variable, the argument, the argument winning.
    for env, code, tol in (("fp16", FLOAT16, 5e-3), ("bf16", BFLOAT16, 3e-2)):
        set_env(env)
        submitted.clear()
        model = optimizer_run(data, n, me)
        same_params(check, model, ref, "DistributedOptimizer PERSEUS_ALLREDUCE_DTYPE=" + env, tol)
        check(dtypes_of("allreduce.") == {code}, "PERSEUS_ALLREDUCE_DTYPE=%s: submitted as %s"
              % (env, dtypes_of("allreduce.")))
    submitted.clear()
    model = optimizer_run(data, n, me, compression=hvd.Compression.none)
    check(dtypes_of("allreduce.") == {FLOAT32}, "Compression.none wins over the variable")
    same_params(check, model, ref, "Compression.none", 1e-5)
    set_env(None)
    submitted.clear()
    model = optimizer_run(data, n, me, compression=hvd.Compression.bf16)
    check(dtypes_of("allreduce.") == {BFLOAT16}, "Compression.bf16: %s" % dtypes_of("allreduce."))
    same_params(check, model, ref, "Compression.bf16", 3e-2)
    submitted.clear()
    model = optimizer_run(data, n, me)
    check(dtypes_of("allreduce.") == {FLOAT32}, "no variable, no compression")
    same_params(check, model, ref, "uncompressed", 1e-5)
    # float64 gradients are left alone by the variable (Compression.fp16 casts every float).
    set_env("fp16")
    g64 = torch.full((3,), 0.1 * (me + 1), dtype=torch.float64)
    check(hvd.compression.from_env().compress(g64)[0].dtype == torch.float64,
          "PERSEUS_ALLREDUCE_DTYPE leaves float64 alone")
    set_env("fp8")
    check.raises(hvd.PerseusError, lambda: optimizer_run(data[:1], n, me),
                 "PERSEUS_ALLREDUCE_DTYPE=fp8", ["PERSEUS_ALLREDUCE_DTYPE=fp8", "fp16", "bf16"])
    set_env(None)

    # allreduce's NaN check: off by default; on, it names the tensor and whose input had it.
    bad = torch.ones(5)
    if me == 0:
        bad[2] = float("inf")
    out = hvd.allreduce(bad, op=hvd.Sum, name="unchecked")
    check(not torch.isfinite(out).all(), "no check without PERSEUS_ALLREDUCE_NANCHECK")
    set_env(nancheck=True)
    check.close(hvd.allreduce(torch.ones(5), op=hvd.Sum, name="fine"), torch.full((5,), float(n)),
                "a finite allreduce passes the check")
    e = check.raises(hvd.NonFiniteError, lambda: hvd.allreduce(bad, op=hvd.Sum, name="weights.x"),
                     "allreduce NaN check", ["'weights.x'", "Inf", "rank %d" % me])
    if e is not None:
        check(isinstance(e, perseus.PerseusError) and e.input_nonfinite == (me == 0),
              "input_nonfinite is this rank's own input's state")
        check(("already had it" in str(e)) == (me == 0), "the message says whose input: %s" % e)
    e = check.raises(hvd.PerseusError,
                     lambda: hvd.grouped_allreduce([torch.ones(2), bad], name="grp"),
                     "grouped_allreduce NaN check", ["'grp.1'"])
    bad_copy = bad.clone()
    check.raises(hvd.NonFiniteError, lambda: hvd.allreduce_(bad_copy, name="inplace.t"),
                 "allreduce_ NaN check", ["'inplace.t'"])
    check.close(hvd.allreduce(torch.arange(4), op=hvd.Sum, name="ints"), torch.arange(4) * n,
                "integer tensors are not checked")

    # DistributedOptimizer's NaN check names the parameter (and only it).
    nan_rank = n - 1
    for env in (None, "fp16"):
        set_env(env, nancheck=True)
        e = check.raises(hvd.NonFiniteError,
                         lambda: optimizer_run(data[:1], n, me, nan_rank=nan_rank),
                         "DistributedOptimizer NaN check (%s)" % env,
                         ["parameter '2.weight'", "NaN"]
                         + (["sent as float16"] if env else []))
        if e is not None:
            check("'0.weight'" not in str(e) and "'4.weight'" not in str(e),
                  "only the poisoned parameter is named: %s" % e)
            check(e.input_nonfinite == (me == nan_rank), "whose input: %s" % e)
    set_env(None)
    model = optimizer_run(data, n, me)
    same_params(check, model, ref, "DistributedOptimizer after the NaN errors", 1e-5)

    # DDP: compressed buckets, then the NaN check naming bucket and parameters.
    dist.init_process_group("gloo")
    for env, tol in (("fp16", 5e-3), ("bf16", 3e-2)):
        set_env(env)
        before = perseus.ddp_stats()
        submitted.clear()
        model = DDP(make_model(), bucket_cap_mb=0.001)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in data:
            opt.zero_grad()
            nn.CrossEntropyLoss()(model(shard(x, n, me)), shard(y, n, me)).backward()
            opt.step()
        same_params(check, model.module, ref, "DDP PERSEUS_ALLREDUCE_DTYPE=" + env, tol)
        stats = perseus.ddp_stats()
        code = FLOAT16 if env == "fp16" else BFLOAT16
        check(dtypes_of("perseus.ddp.") == {code}, "DDP buckets as %s: %s" % (env, submitted))
        check(stats["compressed"] - before["compressed"] == stats["buckets"] - before["buckets"]
              >= len(data), "every DDP bucket compressed: %s" % stats)
        del model, opt
    set_env(None, nancheck=True)
    model = DDP(make_model(), bucket_cap_mb=0.001)
    if me == nan_rank:
        model.module[2].weight.register_hook(_poison)
    x, y = data[0]
    e = check.raises(Exception, lambda: nn.CrossEntropyLoss()(
        model(shard(x, n, me)), shard(y, n, me)).backward(), "DDP NaN check",
        ["PERSEUS_ALLREDUCE_NANCHECK", "DDP gradient bucket", "2.weight", "NaN"])
    if e is not None:
        check("rank %d" % me in str(e), "DDP NaN error names this rank")
    set_env(None)
    del model
    dist.destroy_process_group()
    hvd.shutdown()
    check.finish()


run(main)
