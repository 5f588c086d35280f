"""Horovod's helpers: broadcast_parameters, broadcast_optimizer_state."""
import torch

from perseus import _native
from perseus.torch import ops


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Copies root_rank's tensors into every rank's, in place. params: a state_dict (or any
    mapping of names to tensors), model.named_parameters(), or a list of (name, tensor)."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if any(not isinstance(p, tuple) or len(p) != 2 for p in items):
            raise ValueError("broadcast_parameters takes a dict or (name, tensor) pairs")
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not torch.is_tensor(p):
            raise ValueError("broadcast_parameters: %s is a %s, not a tensor"
                             % (name, type(p).__name__))
        full = "broadcast.%s%s" % (prefix or "", name)
        target = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(ops.broadcast_async_(target, root_rank, name=full))
    for h in handles:
        ops.synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank=0, prefix="Parameter.", model=None):
    """Gives every rank root_rank's optimizer state (its state_dict: hyper-parameters and
    per-parameter state, e.g. momentum buffers), for instance after only rank 0 loaded a
    checkpoint. The state travels pickled (broadcast_object) and each rank loads it with
    load_state_dict, so it needs no step beforehand and works for any optimizer."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer, model)
    inner = getattr(optimizer, "_perseus_inner_state_dict", None)
    state = (inner() if inner else optimizer.state_dict()) if _native.rank() == root_rank \
        else None
    if state is not None:
        state = _to_cpu(state)
    state = ops.broadcast_object(state, root_rank,
                                 name="%soptimizer_state" % (prefix or ""))
    if _native.rank() != root_rank:
        optimizer.load_state_dict(state)


def _initialize_state(optimizer, model):
    """As Horovod: an optimizer that has not stepped gets its state made by one step of zero
    gradients (every rank, before root_rank's state replaces it), so that every parameter that
    requires a gradient has one afterwards (sparse for SparseAdam, and for SGD on a sparse
    Embedding of `model`). A DistributedOptimizer steps its own optimizer only: no all-reduce."""
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    if hasattr(optimizer, "_perseus_setup"):
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()


def _to_cpu(obj):
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu(v) for v in obj)
    return obj
