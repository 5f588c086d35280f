"""Gradient buckets of DistributedOptimizer. The parameters are planned once into fixed buckets
(in reverse registration order, roughly the order in which backward makes their gradients, as
DDP's reducer plans them), each of one dtype and device and at most PERSEUS_GRADIENT_BUCKET_BYTES.
A bucket is all-reduced as one flat tensor once every gradient in it is ready, so a gradient's
hook costs a counter instead of a library call, and 200 small gradients become a few
all-reduces. The plan depends only on the parameters' order, dtypes, devices and sizes, which
are the same on every rank, so a bucket's all-reduce has the same name and size everywhere,
whatever order the gradients come in.

A bucket keeps its flat tensor across steps, with a view of each parameter's piece made once:
where torch copies a list of tensors in one call (torch._foreach_copy_, torch >= 2.1), packing a
bucket and unpacking its result are one call each, instead of a new flat tensor and a new view
per gradient every step (on the GPU machine's torch 2.11, for the 200 gradients of
bench/submission_path.py: 40 us a direction instead of 120 us packing and 400 us unpacking).
The buffer costs one copy of the bucket's gradients, as DDP's buckets do.

A host bucket is packed and its result unpacked by libperseus instead (perseus_host_pack, one
call of memcpy's each way), its gradients' addresses and sizes read anew every step: for those
200 gradients on a 2-core VM 85 us a direction against torch 1.13's cat and 200 copy_ (113 and
142 us), 56 us against torch 2.5's _foreach_copy_ on the CPU (67 us)."""
import array
import operator

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from perseus import _native
from perseus.torch.compression import NoneCompressor, _CastCompressor


_copy_many = getattr(torch, "_foreach_copy_", None)


class Bucket:
    __slots__ = ("params", "name", "ready", "pending", "buffer", "views", "last")

    def __init__(self, params, name, last=False):
        self.params = params
        self.name = name
        # Holds the first-registered parameter, whose gradient backward makes last: the
        # optimizer gives this bucket's parameters no hooks and submits it at synchronize()
        # (see optimizer.py).
        self.last = last
        self.ready = 0  # how many of params have their gradient this step
        self.pending = None  # (Handle, compressor, context, [gradient or None]) once submitted,
        # () when its parameters went one by one (in the optimizer's _handles)
        self.buffer = None  # the flat tensor, made at the first step (the gradients' dtype and
        self.views = None   # device), and a view of it shaped as each parameter, in order

    def flatten(self, pieces):
        """One contiguous tensor of the pieces' elements, in order: the bucket's buffer on the
        host (libperseus packs it) or where torch copies many tensors in one call, else a new
        tensor."""
        first = pieces[0]
        buffer = self.buffer
        if buffer is None or buffer.dtype != first.dtype or buffer.device != first.device:
            # First step, or the model moved (module.to after the optimizer was made).
            buffer = torch.empty(sum(p.numel() for p in self.params), dtype=first.dtype,
                                 device=first.device)
            self.buffer, self.views = buffer, _unflatten_dense_tensors(buffer, self.params)
        host = _host_pieces(buffer, pieces)
        if host is not None:
            _native.host_pack(buffer.data_ptr(), *host)
            return buffer
        if _copy_many is None:
            return _flatten_dense_tensors(pieces)
        _copy_many(self.views, pieces)
        return buffer

    def scatter(self, flat, grads):
        """Copies the pieces of `flat` (the reduced bucket, or its decompressed copy) back into
        `grads` (None: skipped)."""
        if flat is not self.buffer:
            self.buffer.copy_(flat)
        host = _host_pieces(self.buffer, grads)
        if host is not None:
            _native.host_unpack(self.buffer.data_ptr(), *host)
            return
        targets = [g for g in grads if g is not None]
        sources = [v for g, v in zip(grads, self.views) if g is not None]
        if _copy_many is not None:
            _copy_many(targets, sources)
        else:
            for g, v in zip(targets, sources):
                g.copy_(v)


def _host_pieces(buffer, tensors):
    """(addresses, sizes in bytes) of tensors as perseus_host_pack takes them, where buffer and
    every tensor are contiguous host tensors of one dtype whose elements add up to the
    buffer's; else None (torch copies, as for a None among them). Checked every time, through
    map() (about 0.2 us a tensor): libperseus copies what it is told."""
    if not buffer.is_cpu:
        return None
    try:
        if (set(map(_dtype, tensors)) != {buffer.dtype} or not all(map(_is_cpu, tensors))
                or not all(map(torch.Tensor.is_contiguous, tensors))):
            return None
    except AttributeError:  # None has no dtype
        return None
    counts = list(map(torch.Tensor.numel, tensors))
    if sum(counts) != buffer.numel():
        return None
    itemsize = buffer.element_size()
    return (array.array("Q", list(map(torch.Tensor.data_ptr, tensors))),
            array.array("Q", [c * itemsize for c in counts]))


_dtype, _is_cpu = operator.attrgetter("dtype"), operator.attrgetter("is_cpu")


def plan(params, cap, names):
    """Buckets of two or more parameters (a parameter alone, or one of more than `cap` bytes, is
    all-reduced on its own as before); names: {parameter: all-reduce name}. The bucket of the
    first-registered parameter, planned last, has `last` set."""
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
    first = params[0] if params else None
    return [Bucket(m, "%s+%d" % (names[m[0]], len(m) - 1), m[-1] is first)
            for m in closed if len(m) > 1]


def elementwise(compression):
    """Whether compression acts on each element alone (none, or a cast), so that compressing a
    bucket equals compressing each gradient; other compressors get one all-reduce a parameter."""
    if compression is NoneCompressor:
        return True
    return (isinstance(compression, type) and issubclass(compression, _CastCompressor)
            and getattr(compression.compress, "__func__", None)
            is _CastCompressor.compress.__func__
            and compression.decompress is _CastCompressor.decompress)
