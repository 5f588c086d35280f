"""DistributedOptimizer, broadcast_parameters/broadcast_optimizer_state and SyncBatchNorm against
one process doing the same on the whole batches (each rank computes that reference itself)."""
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import perseus.torch as hvd  # noqa: E402
from common import Checks, run  # noqa: E402

STEPS = 6
BATCH = 12  # per step, over all ranks: divisible by 2 and 3


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3))


def batches(steps=STEPS, micro=1):
    g = torch.Generator().manual_seed(42)
    return [[(torch.randn(BATCH, 8, generator=g), torch.randint(0, 3, (BATCH,), generator=g))
             for _ in range(micro)] for _ in range(steps)]


def shard(t, n, me):
    per = t.shape[0] // n
    return t[me * per:(me + 1) * per]


def reference(data, sgd_args):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), **sgd_args)
    loss_fn = nn.CrossEntropyLoss()
    for step in data:
        opt.zero_grad()
        for x, y in step:
            loss_fn(model(x), y).backward()
        opt.step()
    return model


def distributed(data, sgd_args, n, me, **kwargs):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), **sgd_args)
    if kwargs.get("groups") == "first two":
        kwargs["groups"] = [list(model.parameters())[:2]]
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)
    loss_fn = nn.CrossEntropyLoss()
    for step in data:
        opt.zero_grad()
        for x, y in step:
            loss_fn(model(shard(x, n, me)), shard(y, n, me)).backward()
        opt.step()
    return model, opt


def same_params(check, a, b, what, tol=1e-5):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        check.close(p.detach(), q.detach(), "%s: %s" % (what, name), rtol=tol, atol=tol)


class Irregular(nn.Module):
    """Registered in another order than used (gradients arrive in neither order), one layer
    never used (no gradient), one frozen from the third step on."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.out = nn.Linear(16, 3)
        self.unused = nn.Linear(8, 8)
        self.first = nn.Linear(8, 16)
        self.mid = nn.Linear(16, 16)

    def forward(self, x):
        return self.out(torch.tanh(self.mid(torch.tanh(self.first(x)))))


def irregular_training(check, n, me, data):
    """DistributedOptimizer where the submission path has no single fixed pattern: gradients
    in an order of their own, a parameter without a gradient (Horovod all-reduces zeros for
    it), gradients made anew each step (zero_grad(set_to_none=True)), a parameter frozen
    between steps, 3-D inputs: equal to one process on the whole batches."""
    ref, mine = Irregular(), Irregular()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(mine.parameters(), lr=0.1),
                                   named_parameters=mine.named_parameters())
    loss_fn = nn.CrossEntropyLoss()
    for i, step in enumerate(data):
        if i == 2:
            ref.mid.bias.requires_grad_(False)
            mine.mid.bias.requires_grad_(False)
        for model, o, part in ((ref, ref_opt, lambda t: t), (mine, opt, lambda t: shard(t, n, me))):
            o.zero_grad(set_to_none=True)
            for x, y in step:
                x3 = part(x).unsqueeze(1).expand(-1, 2, -1)  # (rows, 2, 8): the mean of 2
                loss_fn(model(x3).mean(1), part(y)).backward()
            o.step()
        unused = mine.unused.weight.grad
        check(unused is not None and not unused.any(), "the unused layer's gradient is zeros "
              "after step %d (got %s)" % (i, None if unused is None else unused.abs().max()))
    same_params(check, mine, ref, "irregular model")


class Mixed(nn.Module):
    """Gradients of two dtypes (float32 and float64 layers), odd and 3-D shapes (Conv1d), a
    sparse Embedding among dense parameters, a channels_last Conv2d (its weight's gradient not
    contiguous in the default order): what gradient buckets must keep apart or lay out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.embed = nn.Embedding(11, 7, sparse=True)
        self.conv = nn.Conv1d(7, 5, 3)
        self.wide = nn.Linear(5, 13).double()
        self.image = nn.Conv2d(1, 2, 3).to(memory_format=torch.channels_last)
        self.out = nn.Linear(13 + 8, 3)

    def forward(self, ids, pic):
        h = self.conv(self.embed(ids).transpose(1, 2)).mean(2)  # (rows, 5)
        h = torch.tanh(self.wide(h.double())).float()
        p = self.image(pic.contiguous(memory_format=torch.channels_last)).flatten(1)[:, :8]
        return self.out(torch.cat([h, p], 1))


def mixed_training(check, n, me):
    """DistributedOptimizer on Mixed against one process on the whole batches; with more than
    one rank (and buckets not turned off) the gradients go in buckets, one dtype each."""
    g = torch.Generator().manual_seed(9)
    data = [(torch.randint(0, 11, (6, 4), generator=g), torch.randn(6, 1, 4, 4, generator=g),
             torch.randint(0, 3, (6,), generator=g)) for _ in range(3)]
    ref, mine = Mixed(), Mixed()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(mine.parameters(), lr=0.2),
                                   named_parameters=mine.named_parameters())
    if n > 1 and os.environ.get("PERSEUS_GRADIENT_BUCKET_BYTES", "").strip() != "0":
        kinds = [{p.dtype for p in b.params} for b in opt._buckets]
        check(len(kinds) >= 2 and all(len(k) == 1 for k in kinds),
              "buckets of one dtype each, float32 and float64 apart (got %s)" % kinds)
    loss_fn = nn.CrossEntropyLoss()
    for ids, pic, y in data:
        ref_opt.zero_grad()
        loss_fn(ref(ids, pic), y).backward()
        ref_opt.step()
        opt.zero_grad()
        loss_fn(mine(shard(ids, n, me), shard(pic, n, me)), shard(y, n, me)).backward()
        opt.step()
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        check.close(p.detach(), q.detach(), "mixed model: %s" % name, rtol=1e-5, atol=1e-6)
    check(mine.image.weight.grad.is_contiguous(memory_format=torch.channels_last),
          "the channels_last gradient keeps its layout")


def moved_training(check, n, me, data):
    """A model converted to float64 after its DistributedOptimizer made its first step
    (module.double() keeps the Parameter objects): the buckets' flat buffers, made in float32,
    must follow, or the float64 gradients would go through float32 (rounded to 1e-7)."""
    model, ref = make_model(), make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    loss_fn = nn.CrossEntropyLoss()
    (x, y), (x2, y2) = data[0][0], data[1][0]
    opt.zero_grad()
    loss_fn(model(shard(x, n, me)), shard(y, n, me)).backward()
    opt.step()  # lr 0: the parameters stay those of ref
    model.double()
    ref.double()
    opt.zero_grad()
    loss_fn(model(shard(x2.double(), n, me)), shard(y2, n, me)).backward()
    opt.synchronize()
    loss_fn(ref(x2.double()), y2).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        check(p.grad.dtype == torch.float64, "float64 gradient of %s" % name)
        check.close(p.grad, q.grad, "gradient of %s after model.double()" % name, rtol=1e-10,
                    atol=1e-13)
    with opt.skip_synchronize():
        opt.step()


def horovod_optimizer_state(check, n, me):
    """_parameter_names as Horovod's (default names the same on every rank), and
    broadcast_optimizer_state of an optimizer that never stepped, with a parameter that needs
    no gradient: Horovod makes the state with one step of zero gradients."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1))
    names = opt._parameter_names
    check(sorted(names.values()) == ["allreduce.noname.%d.%d" % (i, j) for i in range(2)
                                     for j in range(2)], "default _parameter_names %s"
          % sorted(names.values()))
    everyone = hvd.allgather_object(sorted(names.values()))
    check(len(everyone) == n and all(v == everyone[0] for v in everyone),
          "the ranks' default names agree")
    named = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    check(sorted(named._parameter_names.values()) == sorted(k for k, _ in
                                                             model.named_parameters()),
          "named _parameter_names")

    class NoGrad(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.tensor([1, 3]).int(), requires_grad=False)
            self.b = nn.Parameter(torch.rand(4, generator=torch.Generator().manual_seed(me)))

        def forward(self, x):
            return torch.index_select(self.b, 0, self.a.long()) * x

    model = NoGrad()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                   weight_decay=1e-3, momentum=0.9,
                                                   nesterov=True),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check(model.a.grad is None, "a parameter that needs no gradient still has none")
    check(model.b.grad is not None and bool((model.b.grad == 0).all()),
          "broadcast_optimizer_state made zero gradients")
    buf = opt.state_dict()["state"][1]["momentum_buffer"]
    check.close(hvd.broadcast(buf, 0, name="momentum.check"), buf,
                "every rank has root's momentum buffer", rtol=0, atol=0)
    check.close(hvd.broadcast(model.b.detach(), 0, name="b.check"), model.b.detach(),
                "every rank has root's parameters after its step", rtol=0, atol=0)


def sparse_gradients(check, n, me):
    """DistributedOptimizer on a sparse Embedding with SparseAdam: sparse gradients (indices and
    values all-gathered) and sparse_as_dense, each against one process that sees every rank's
    rows, the loss averaged over the ranks."""
    inputs = [torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]) if r % 2 == 0 else
              torch.tensor([[1, 3, 4], [4, 7, 9]]) for r in range(n)]
    for as_dense in (False, True):
        torch.manual_seed(11)
        model = nn.Embedding(10, 3, sparse=True)
        ref = nn.Embedding(10, 3, sparse=True)
        ref.load_state_dict(model.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                       sparse_as_dense=as_dense)
        ref_opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.1)
        for step in range(2):
            opt.zero_grad()
            (model(inputs[me]) * (step + 1)).sum().backward()
            opt.step()
            ref_opt.zero_grad()
            (sum((ref(x) * (step + 1)).sum() for x in inputs) / n).backward()
            ref_opt.step()
        check.close(model.weight.detach(), ref.weight.detach(),
                    "sparse Embedding, sparse_as_dense=%s" % as_dense, rtol=1e-5, atol=1e-6)


def main():
    check = Checks("train")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    sgd = {"lr": 0.1, "momentum": 0.9}

    data = batches()
    ref = reference(data, sgd)
    # The host bucket's gradients packed and their results unpacked by libperseus, once a step
    # each (one bucket holds this model's gradients).
    from perseus.torch import _buckets
    calls = {"host_pack": 0, "host_unpack": 0}
    real = {name: getattr(_buckets._native, name) for name in calls}

    def spy(name):
        def counted(*args):
            calls[name] += 1
            return real[name](*args)
        return counted
    for name in calls:
        setattr(_buckets._native, name, spy(name))
    try:
        model, opt = distributed(data, sgd, n, me)
    finally:
        for name, fn in real.items():
            setattr(_buckets._native, name, fn)
    same_params(check, model, ref, "DistributedOptimizer")
    buckets = len(opt._buckets)
    # Hooks only outside the bucket of the first-registered parameters, which synchronize()
    # submits: none for this model at the default size (one bucket).
    last = [p for b in opt._buckets if b.last for p in b.params]
    check(len(opt._grad_accs) == len(opt._requires_update) - len(last),
          "a hook for each of the %d parameters outside the last bucket, got %d"
          % (len(opt._requires_update) - len(last), len(opt._grad_accs)))
    if "PERSEUS_GRADIENT_BUCKET_BYTES" not in os.environ:
        check(opt._grad_accs == [], "no hooks for a model of one bucket")
        check(buckets == 1, "one bucket at the default size, got %d" % buckets)
    check(calls == {"host_pack": STEPS * buckets, "host_unpack": STEPS * buckets},
          "each of %d host buckets packed and unpacked by libperseus each step: %s"
          % (buckets, calls))
    check(type(opt).__name__ == "SGD" and isinstance(opt, torch.optim.SGD),
          "the wrapped optimizer is still an SGD")

    model, _ = distributed(data, sgd, n, me, groups=2, gradient_predivide_factor=2.0)
    same_params(check, model, ref, "groups=2, gradient_predivide_factor=2")
    model, _ = distributed(data, sgd, n, me, groups="first two")
    same_params(check, model, ref, "explicit groups")

    micro = batches(steps=3, micro=2)
    ref2 = reference(micro, sgd)
    model, _ = distributed(micro, sgd, n, me, backward_passes_per_step=2)
    same_params(check, model, ref2, "backward_passes_per_step=2")
    if not opt._grad_accs:
        # No hooks (one bucket, submitted by step()): two backward passes before a step with
        # backward_passes_per_step=1 accumulate, as in one process. (Horovod's hooks raise
        # there; a parameter that has a hook still does, as the next check shows.)
        model, _ = distributed(micro, sgd, n, me)
        same_params(check, model, ref2, "two backward passes, backward_passes_per_step=1")
    else:
        model = make_model()
        opt2 = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), **sgd),
                                        named_parameters=model.named_parameters())
        loss_fn = nn.CrossEntropyLoss()
        try:
            for x, y in micro[0]:
                loss_fn(model(shard(x, n, me)), shard(y, n, me)).backward()
        except AssertionError as e:
            check("backward_passes_per_step" in str(e), "the hook's error: %s" % e)
        else:
            check(False, "a second backward pass through hooked parameters was accepted")
        opt2.synchronize()  # the first pass's all-reduces, in flight on every rank

    model, _ = distributed(data, sgd, n, me, compression=hvd.Compression.fp16)
    same_params(check, model, ref, "Compression.fp16", tol=5e-3)

    # Sum: each rank's loss is the whole batch's mean over n, so the sum is the mean.
    ref_sum = reference(data, sgd)
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), **sgd), op=hvd.Sum)
    for step in data:
        opt.zero_grad()
        for x, y in step:
            (nn.CrossEntropyLoss()(model(shard(x, n, me)), shard(y, n, me)) / n).backward()
        opt.step()
    same_params(check, model, ref_sum, "op=Sum, unnamed parameters")

    # A checkpoint that only rank 0 loads, then broadcast_parameters/optimizer_state.
    ckpt_model = make_model(7)
    ckpt_opt = torch.optim.Adam(ckpt_model.parameters(), lr=0.01)
    for x, y in (s[0] for s in data[:3]):
        ckpt_opt.zero_grad()
        nn.CrossEntropyLoss()(ckpt_model(x), y).backward()
        ckpt_opt.step()
    model = make_model(100 + me)
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    if me == 0:
        # A copy, as torch.load of a checkpoint file gives: torch 2.5's load_state_dict keeps
        # the given state tensors (step, exp_avg, ...) where dtype and device match, so loading
        # ckpt_opt's own would make this optimizer's steps advance the reference's too.
        model.load_state_dict(copy.deepcopy(ckpt_model.state_dict()))
        opt.load_state_dict(copy.deepcopy(ckpt_opt.state_dict()))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    same_params(check, model, ckpt_model, "broadcast_parameters", tol=0)
    mine, theirs = opt.state_dict(), ckpt_opt.state_dict()
    check(mine["param_groups"][0]["lr"] == 0.01, "broadcast_optimizer_state: lr")
    for key, state in theirs["state"].items():
        for field in ("exp_avg", "exp_avg_sq"):
            check.close(mine["state"][key][field], state[field],
                        "broadcast_optimizer_state: %s %s" % (key, field), rtol=0, atol=0)
        check(float(mine["state"][key]["step"]) == float(state["step"]), "step %s" % key)
    # Go on training, distributed, from the restored state: same as the reference going on.
    dist_opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    dist_opt.load_state_dict(opt.state_dict())
    x, y = data[3][0]
    dist_opt.zero_grad()
    nn.CrossEntropyLoss()(model(shard(x, n, me)), shard(y, n, me)).backward()
    dist_opt.step()
    ckpt_opt.zero_grad()
    nn.CrossEntropyLoss()(ckpt_model(x), y).backward()
    ckpt_opt.step()
    same_params(check, model, ckpt_model, "training on from the broadcast checkpoint")
    obj = hvd.broadcast_object({"epoch": 3} if me == 0 else None, 0)
    check(obj == {"epoch": 3}, "broadcast_object")
    horovod_optimizer_state(check, n, me)
    sparse_gradients(check, n, me)
    irregular_training(check, n, me, data)
    mixed_training(check, n, me)
    moved_training(check, n, me, data)

    # SyncBatchNorm over uneven batches (rank r has r + 2 rows) vs BatchNorm on all of them.
    for dims in (2, 4):
        rows = [r + 2 for r in range(n)]
        g = torch.Generator().manual_seed(5)
        shape = (sum(rows), 4) + ((3, 3) if dims == 4 else ())
        x_all = torch.randn(shape, generator=g) * 3 + 1
        w_out = torch.randn(shape, generator=g)
        start = sum(rows[:me])
        bn = nn.BatchNorm2d(4) if dims == 4 else nn.BatchNorm1d(4)
        sbn = hvd.SyncBatchNorm(4)
        with torch.no_grad():
            bn.weight.copy_(torch.linspace(0.5, 2, 4))
            bn.bias.copy_(torch.linspace(-1, 1, 4))
            sbn.weight.copy_(bn.weight)
            sbn.bias.copy_(bn.bias)
        for _ in range(2):  # twice: running statistics accumulate
            xa = x_all.clone().requires_grad_()
            out_all = bn(xa)
            (out_all * w_out).sum().backward()
            xs = x_all[start:start + rows[me]].clone().requires_grad_()
            sbn.zero_grad()
            out = sbn(xs)
            (out * w_out[start:start + rows[me]]).sum().backward()
            what = "SyncBatchNorm %dD" % dims
            check.close(out.detach(), out_all.detach()[start:start + rows[me]], what + " output",
                        rtol=1e-4, atol=1e-5)
            check.close(xs.grad, xa.grad[start:start + rows[me]], what + " input grad",
                        rtol=1e-4, atol=1e-5)
            check.close(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), bn.weight.grad,
                        what + " weight grad (summed)", rtol=1e-4, atol=1e-4)
            check.close(hvd.allreduce(sbn.bias.grad, op=hvd.Sum), bn.bias.grad,
                        what + " bias grad (summed)", rtol=1e-4, atol=1e-4)
            bn.weight.grad = None
            bn.bias.grad = None
        check.close(sbn.running_mean, bn.running_mean, what + " running_mean", rtol=1e-4)
        check.close(sbn.running_var, bn.running_var, what + " running_var", rtol=1e-4)
        sbn.eval()
        bn.eval()
        check.close(sbn(x_all[:2]).detach(), bn(x_all[:2]).detach(), what + " eval", rtol=1e-4,
                    atol=1e-5)
    hvd.shutdown()
    check.finish()


run(main)
