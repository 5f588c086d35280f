"""Gradient buckets of DistributedOptimizer. The parameters are planned once into fixed buckets
(in reverse registration order, roughly the order in which backward makes their gradients, as
DDP's reducer plans them), each of one dtype and device and at most PERSEUS_GRADIENT_BUCKET_BYTES.
A bucket is all-reduced as one flat tensor once every gradient in it is ready, so a gradient's
hook costs a counter instead of a library call, and 200 small gradients become a few
all-reduces. The plan depends only on the parameters' order, dtypes, devices and sizes, which
are the same on every rank, so a bucket's all-reduce has the same name and size everywhere,
whatever order the gradients come in."""
import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from perseus.torch.compression import NoneCompressor, _CastCompressor


class Bucket:
    __slots__ = ("params", "name", "ready", "pending")

    def __init__(self, params, name):
        self.params = params
        self.name = name
        self.ready = 0  # how many of params have their gradient this step
        self.pending = None  # (Handle, compressor, context, [gradient or None]) once submitted,
        # () when its parameters went one by one (in the optimizer's _handles)


def plan(params, cap, names):
    """Buckets of two or more parameters (a parameter alone, or one of more than `cap` bytes, is
    all-reduced on its own as before); names: {parameter: all-reduce name}."""
    closed, open_ = [], {}
    for p in reversed(params):
        key = (p.dtype, p.device)
        size = p.numel() * p.element_size()
        members, used = open_.get(key, ([], 0))
        if members and used + size > cap:
            closed.append(members)
            members, used = [], 0
        members.append(p)
        open_[key] = (members, used + size)
    closed.extend(members for members, _ in open_.values())
    return [Bucket(m, "%s+%d" % (names[m[0]], len(m) - 1)) for m in closed if len(m) > 1]


def elementwise(compression):
    """Whether compression acts on each element alone (none, or a cast), so that compressing a
    bucket equals compressing each gradient; other compressors get one all-reduce a parameter."""
    if compression is NoneCompressor:
        return True
    return (isinstance(compression, type) and issubclass(compression, _CastCompressor)
            and getattr(compression.compress, "__func__", None)
            is _CastCompressor.compress.__func__
            and compression.decompress is _CastCompressor.decompress)


flatten = _flatten_dense_tensors  # one contiguous tensor of the tensors' elements, in order


def scatter(flat, grads, shapes_of):
    """Copies the pieces of the reduced `flat` back into `grads` (None: skipped); `shapes_of`
    (the gradients' parameters, say) gives each piece's shape, in order."""
    views = _unflatten_dense_tensors(flat, shapes_of)
    targets = [g for g in grads if g is not None]
    sources = [v for g, v in zip(grads, views) if g is not None]
    copy = getattr(torch, "_foreach_copy_", None)
    if copy is not None:
        copy(targets, sources)
    else:
        for g, v in zip(targets, sources):
            g.copy_(v)
