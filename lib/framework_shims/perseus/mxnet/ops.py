"""Horovod's MXNet collectives over libperseus: the process and the operations on NDArrays.

Every operation is blocking (Horovod's MXNet API queues its operations on MXNet's engine; here
the call returns with the result). NDArrays travel through host memory: the input is read with
asnumpy() (which waits for MXNet's pending writes to it) and the result written back with
NDArray assignment (which goes through MXNet's engine), so the shim never touches an NDArray's
memory behind the engine's back. That is one copy each way; libperseus itself works in place on
the numpy buffers. GPU NDArrays (an MXNet CUDA build) take the same path through host memory:
correct, untested here (no MXNet GPU build can be installed), and slower than NCCL would be.

Names: operations given a name are matched across ranks by it (and may then be submitted in
different orders); unnamed ones must be made in the same order on every rank.
"""
import numpy as np

import mxnet as mx

from perseus import _native
from perseus._native import PerseusError

# Horovod's values for its reduction constants (horovod.common.basics).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OPS = {Average: _native.AVERAGE, Sum: _native.SUM, Min: _native.MIN, Max: _native.MAX,
        Product: _native.PRODUCT}


# ---- the process ---------------------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Joins the job (perseus_init). Collective; calling it again does nothing."""
    if comm is not None:
        raise NotImplementedError("perseus.mxnet.init(comm=...): MPI communicators are not "
                                  "supported; the job is every rank perseusrun started")
    if process_sets not in (None, [], "dynamic"):
        raise NotImplementedError("perseus.mxnet.init(process_sets=...): only the global "
                                  "process set exists")
    _native.init()


from perseus._process import (  # noqa: F401 - the shared process API, re-exported
    cross_rank, cross_size, cuda_built, gloo_built, gloo_enabled, is_initialized, local_rank,
    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, shutdown, size)


def barrier():
    _native.barrier()


# ---- NDArrays <-> host buffers -------------------------------------------------------------

def _check_process_set(process_set):
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise NotImplementedError("perseus.mxnet has only the global process set")


def _to_host(tensor, what):
    """A C-contiguous numpy copy of tensor (an NDArray, a numpy array or a number)."""
    if isinstance(tensor, mx.nd.NDArray):
        if tensor.stype != "default":
            raise PerseusError("%s: only dense NDArrays are supported (got stype %s)"
                               % (what, tensor.stype), _native.ERROR_INVALID_ARGUMENT)
        host = tensor.asnumpy()
    else:
        host = np.array(tensor)
    host = np.ascontiguousarray(host)
    if host.dtype == np.bool_:
        host = host.astype(np.uint8)
    return host


def _what(operation, name, tensor):
    label = ("%s of '%s'" % (operation, name)) if name else ("%s of an unnamed NDArray"
                                                             % operation)
    ctx = getattr(tensor, "context", "host")
    return "%s (%s, shape %s, on %s)" % (label, np.dtype(tensor.dtype).name,
                                         list(tensor.shape), ctx)


def _code(host, what):
    try:
        return _native.dtype_code(host.dtype.name)
    except PerseusError as e:
        raise PerseusError("%s: %s" % (what, e), e.code) from None


def _like(host, tensor):
    """host as an NDArray on tensor's context, with tensor's dtype."""
    if isinstance(tensor, mx.nd.NDArray):
        return mx.nd.array(host, ctx=tensor.context, dtype=tensor.dtype)
    return mx.nd.array(host, dtype=host.dtype)


def _write(tensor, host):
    """tensor[:] = host, through MXNet's engine (copyto: tensor may hold MKL-DNN data, which
    NDArray assignment from numpy refuses)."""
    if tensor.shape != host.shape:
        host = host.reshape(tensor.shape)
    mx.nd.array(host, ctx=tensor.context, dtype=tensor.dtype).copyto(tensor)
    return tensor


def resolve_op(op, average):
    """Horovod's rule: op wins; else average=False means Sum; the default is Average."""
    if op is not None and average is not None:
        raise ValueError("op and average cannot both be given (average is deprecated: use op)")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError("op=Adasum is not supported by perseus.mxnet "
                                  "(Average, Sum, Min, Max, Product are)")
    if op not in _OPS:
        raise ValueError("unknown reduction op %r" % (op,))
    return op


# ---- allreduce -----------------------------------------------------------------------------

def _allreduce_submit(tensor, name, op, prescale_factor, postscale_factor):
    """Submits the all-reduce of tensor; returns (host buffer, request)."""
    what = _what("allreduce", name, tensor)
    host = _to_host(tensor, what)
    request = _native.allreduce_async(host.ctypes.data, host.ctypes.data, host.size,
                                      _code(host, what), _OPS[op], prescale_factor,
                                      postscale_factor, name, what=what, keep=(host,),
                                      shape=host.shape)
    return host, request


def _finish(requests):
    try:
        for r in requests:
            r.wait()
    finally:
        for r in requests:
            r.release()


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None, op=None):
    """The reduction (Average by default; op=Sum/Min/Max/Product, or average=False for Sum) of
    tensor over every rank, as a new NDArray on tensor's context."""
    _check_process_set(process_set)
    op = resolve_op(op, average)
    host, request = _allreduce_submit(tensor, name, op, prescale_factor, postscale_factor)
    _finish([request])
    return _like(host, tensor)


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, op=None):
    """allreduce in place: tensor becomes the result, and is returned."""
    _check_process_set(process_set)
    op = resolve_op(op, average)
    host, request = _allreduce_submit(tensor, name, op, prescale_factor, postscale_factor)
    _finish([request])
    return _write(tensor, host)


def _group_name(name, i):
    return None if name is None else "%s.%d" % (name, i)


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None, op=None, names=None):
    """allreduce_ of each tensor, all submitted before any is waited for (so libperseus can
    fuse them). names: one name per tensor (else name.<i>, or unnamed)."""
    _check_process_set(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    if names is None:
        names = [_group_name(name, i) for i in range(len(tensors))]
    submitted = [_allreduce_submit(t, n, op, prescale_factor, postscale_factor)
                 for t, n in zip(tensors, names)]
    _finish([r for _, r in submitted])
    for t, (host, _) in zip(tensors, submitted):
        _write(t, host)
    return tensors


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, op=None):
    """allreduce of each tensor, as new NDArrays, submitted together."""
    _check_process_set(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    submitted = [_allreduce_submit(t, _group_name(name, i), op, prescale_factor,
                                   postscale_factor) for i, t in enumerate(tensors)]
    _finish([r for _, r in submitted])
    return [_like(host, t) for t, (host, _) in zip(tensors, submitted)]


# ---- allgather -----------------------------------------------------------------------------

def _first_dims(rows, name):
    """Every rank's first dimension (for tensors whose rows hold no elements)."""
    mine = np.array([rows], dtype=np.int64)
    out = np.zeros(size(), dtype=np.int64)
    _native.check(_native.lib().perseus_allgather(
        mine.ctypes.data, out.ctypes.data, 1, _native.DTYPES["int64"],
        _native._name(None if name is None else name + ".rows")), "allgather of first dims")
    return [int(v) for v in out]


def allgather_host(host, name=None, what="allgather"):
    """Concatenation along the first dimension of every rank's numpy array host (first
    dimensions may differ); returns (numpy result, rows per rank)."""
    if host.ndim == 0:
        host = host.reshape(1)
    rest = tuple(host.shape[1:])
    row = int(np.prod(rest)) if rest else 1
    request = _native.allgatherv_async(host.ctypes.data, host.size, _code(host, what), name,
                                       what=what, keep=(host,), shape=host.shape)
    try:
        request.wait()
        counts = request.counts(size())
        if row:
            if any(c % row for c in counts):  # libperseus compared the shapes: never expected
                raise PerseusError("%s: the element counts %s from the ranks are not whole rows "
                                   "of %d elements" % (what, counts, row), _native.ERROR_INTERNAL)
            rows = [c // row for c in counts]
        else:
            rows = None
        out = np.empty((sum(counts) // row if row else 0,) + rest, dtype=host.dtype)
        if sum(counts):
            request.copy_output(out.ctypes.data)
    finally:
        request.release()
    if rows is None:
        rows = _first_dims(host.shape[0], name)
        out = np.empty((sum(rows),) + rest, dtype=host.dtype)
    return out, rows


def allgather(tensor, name=None, priority=0, process_set=None):
    """Every rank's tensor concatenated along the first dimension, in rank order (first
    dimensions may differ between ranks; the others must agree)."""
    _check_process_set(process_set)
    what = _what("allgather", name, tensor)
    out, _ = allgather_host(_to_host(tensor, what), name, what)
    return _like(out, tensor)


# ---- broadcast -----------------------------------------------------------------------------

def _broadcast_host(tensor, root_rank, name):
    what = _what("broadcast from rank %s" % root_rank, name, tensor)
    host = _to_host(tensor, what)
    request = _native.broadcast_async(host.ctypes.data, host.size, _code(host, what),
                                      int(root_rank), name, what=what, keep=(host,),
                                      shape=host.shape)
    _finish([request])
    return host


def broadcast(tensor, root_rank, name=None, priority=0, process_set=None):
    """root_rank's tensor, as a new NDArray on every rank."""
    _check_process_set(process_set)
    return _like(_broadcast_host(tensor, root_rank, name), tensor)


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=None):
    """broadcast in place: every rank's tensor becomes root_rank's."""
    _check_process_set(process_set)
    return _write(tensor, _broadcast_host(tensor, root_rank, name))


def grouped_broadcast_(tensors, root_rank, names):
    """broadcast_ of each tensor, all submitted before any is waited for."""
    submitted = []
    for t, n in zip(tensors, names):
        what = _what("broadcast from rank %s" % root_rank, n, t)
        host = _to_host(t, what)
        submitted.append((t, host, _native.broadcast_async(
            host.ctypes.data, host.size, _code(host, what), int(root_rank), n, what=what,
            keep=(host,), shape=host.shape)))
    _finish([r for _, _, r in submitted])
    for t, host, _ in submitted:
        _write(t, host)


# ---- alltoall ------------------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, priority=0, process_set=None):
    """Scatters tensor's rows: splits[r] rows (in order) go to rank r (splits None: the first
    dimension split evenly); returns the rows every rank sent to this one, in rank order."""
    _check_process_set(process_set)
    what = _what("alltoall", name, tensor)
    host = _to_host(tensor, what)
    if host.ndim == 0:
        raise PerseusError("%s: alltoall needs at least one dimension" % what,
                           _native.ERROR_INVALID_ARGUMENT)
    n = size()
    if splits is None:
        if host.shape[0] % n:
            raise PerseusError("%s: the first dimension (%d) is not divisible by the number of "
                               "ranks (%d); give splits" % (what, host.shape[0], n),
                               _native.ERROR_INVALID_ARGUMENT)
        splits = [host.shape[0] // n] * n
    else:
        splits = [int(s) for s in (splits.asnumpy() if isinstance(splits, mx.nd.NDArray)
                                   else np.asarray(splits)).reshape(-1)]
    if len(splits) != n or sum(splits) != host.shape[0] or min(splits) < 0:
        raise PerseusError("%s: splits %s must have %d non-negative entries summing to the "
                           "first dimension %d" % (what, splits, n, host.shape[0]),
                           _native.ERROR_INVALID_ARGUMENT)
    rest = tuple(host.shape[1:])
    row = int(np.prod(rest)) if rest else 1
    request = _native.alltoall_async(host.ctypes.data, [s * row for s in splits],
                                     _code(host, what), name, what=what, keep=(host,),
                                     shape=host.shape)
    try:
        request.wait()
        counts = request.counts(n)
        if row and any(c % row for c in counts):  # libperseus compared the shapes
            raise PerseusError("%s: the element counts %s from the ranks are not whole rows of "
                               "%d elements" % (what, counts, row), _native.ERROR_INTERNAL)
        if row == 0:
            out = np.empty((0,) + rest, dtype=host.dtype)
        else:
            out = np.empty((sum(counts) // row,) + rest, dtype=host.dtype)
            if sum(counts):
                request.copy_output(out.ctypes.data)
    finally:
        request.release()
    return _like(out, tensor)
