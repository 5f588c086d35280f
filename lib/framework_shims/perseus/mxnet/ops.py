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
import pickle

import numpy as np

import mxnet as mx

from perseus import _native, _process, _reduction_ops
from perseus._native import PerseusError
from perseus._process_sets import (  # noqa: F401 - the shared process-set API, re-exported
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from perseus._process_sets import of as _of, set_id as _set_id
from perseus._reduction_ops import (  # noqa: F401 - Horovod's constants, re-exported
    Adasum, Average, Max, Min, Product, Sum)
from perseus._reduction_ops import LIBRARY_OPS as _OPS


# ---- the process ---------------------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Joins the job (perseus_init), then adds process_sets (ProcessSets or lists of ranks; the
    same on every rank) in order. Collective; calling it again does nothing. `comm` is not
    supported."""
    _process.init_job(comm, process_sets, "perseus.mxnet")


from perseus._process import (  # noqa: F401 - the shared process API, re-exported
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size)


def barrier(process_set=global_process_set):
    """Returns once every rank (every member of process_set) has called it."""
    _native.barrier(_set_id(process_set))


# ---- NDArrays <-> host buffers -------------------------------------------------------------

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
    return _reduction_ops.resolve_op(op, average, "perseus.mxnet")


# ---- allreduce -----------------------------------------------------------------------------

def _allreduce_submit(tensor, name, op, prescale_factor, postscale_factor,
                      set_id=_native.GLOBAL_PROCESS_SET):
    """Submits the all-reduce of tensor; returns (host buffer, request)."""
    what = _what("allreduce", name, tensor)
    host = _to_host(tensor, what)
    request = _native.allreduce_async(host.ctypes.data, host.ctypes.data, host.size,
                                      _code(host, what), _OPS[op], prescale_factor,
                                      postscale_factor, name, what=what, keep=(host,),
                                      shape=host.shape, process_set=set_id)
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
    tensor over every rank (of process_set), as a new NDArray on tensor's context."""
    set_id = _set_id(process_set)
    op = resolve_op(op, average)
    host, request = _allreduce_submit(tensor, name, op, prescale_factor, postscale_factor,
                                      set_id)
    _finish([request])
    return _like(host, tensor)


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, op=None):
    """allreduce in place: tensor becomes the result, and is returned."""
    set_id = _set_id(process_set)
    op = resolve_op(op, average)
    host, request = _allreduce_submit(tensor, name, op, prescale_factor, postscale_factor,
                                      set_id)
    _finish([request])
    return _write(tensor, host)


def _group_name(name, i):
    return None if name is None else "%s.%d" % (name, i)


def _same_context(tensors, what):
    """A group's NDArrays must share one context, as in Horovod (checked before any is
    submitted)."""
    contexts = sorted({str(getattr(t, "context", "host")) for t in tensors})
    if len(contexts) > 1:
        raise PerseusError("%s: the group's NDArrays are on %s; a group's NDArrays must all be "
                           "on one context" % (what, " and ".join(contexts)),
                           _native.ERROR_INVALID_ARGUMENT)


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None, op=None, names=None):
    """allreduce_ of each tensor, all submitted before any is waited for (so libperseus can
    fuse them). names: one name per tensor (else name.<i>, or unnamed)."""
    set_id = _set_id(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    _same_context(tensors, "grouped allreduce")
    if names is None:
        names = [_group_name(name, i) for i in range(len(tensors))]
    submitted = [_allreduce_submit(t, n, op, prescale_factor, postscale_factor, set_id)
                 for t, n in zip(tensors, names)]
    _finish([r for _, r in submitted])
    for t, (host, _) in zip(tensors, submitted):
        _write(t, host)
    return tensors


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, op=None):
    """allreduce of each tensor, as new NDArrays, submitted together."""
    set_id = _set_id(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    _same_context(tensors, "grouped allreduce")
    submitted = [_allreduce_submit(t, _group_name(name, i), op, prescale_factor,
                                   postscale_factor, set_id) for i, t in enumerate(tensors)]
    _finish([r for _, r in submitted])
    return [_like(host, t) for t, (host, _) in zip(tensors, submitted)]


# ---- allgather -----------------------------------------------------------------------------

def _first_dims(rows, name, ps):
    """Every member's first dimension (for tensors whose rows hold no elements)."""
    mine = np.array([rows], dtype=np.int64)
    out, _ = allgather_host(mine, None if name is None else name + ".rows", "allgather of "
                            "first dimensions", ps)
    return [int(v) for v in out]


def allgather_host(host, name=None, what="allgather", process_set=global_process_set):
    """Concatenation along the first dimension of every rank's (every member's of
    process_set) numpy array host (first dimensions may differ); returns (numpy result, rows
    per rank)."""
    request, host = _allgather_submit(host, name, what, process_set)
    return _allgather_result(request, host, name, what, process_set)


def _allgather_submit(host, name, what, process_set):
    if host.ndim == 0:
        host = host.reshape(1)
    request = _native.allgatherv_async(host.ctypes.data, host.size, _code(host, what), name,
                                       what=what, keep=(host,), shape=host.shape,
                                       process_set=_set_id(process_set))
    return request, host


def _allgather_result(request, host, name, what, process_set):
    ps = _of(process_set)
    rest = tuple(host.shape[1:])
    row = int(np.prod(rest)) if rest else 1
    try:
        request.wait()
        counts = request.counts(ps.size())
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
        rows = _first_dims(host.shape[0], name, ps)
        out = np.empty((sum(rows),) + rest, dtype=host.dtype)
    return out, rows


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """Every rank's (every member's of process_set) tensor concatenated along the first
    dimension, in rank order (first dimensions may differ between ranks; the others must
    agree)."""
    _set_id(process_set)
    what = _what("allgather", name, tensor)
    out, _ = allgather_host(_to_host(tensor, what), name, what, process_set)
    return _like(out, tensor)


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of each tensor (named name.0, name.1, ...), submitted together."""
    _set_id(process_set)
    tensors = list(tensors)
    _same_context(tensors, "grouped allgather")
    submitted = []
    for i, t in enumerate(tensors):
        what = _what("allgather", _group_name(name, i), t)
        submitted.append((t, what) + _allgather_submit(_to_host(t, what), _group_name(name, i),
                                                       what, process_set))
    return [_like(_allgather_result(request, host, _group_name(name, i), what,
                                    process_set)[0], t)
            for i, (t, what, request, host) in enumerate(submitted)]


# ---- broadcast -----------------------------------------------------------------------------

def _broadcast_host(tensor, root_rank, name, process_set=global_process_set):
    what = _what("broadcast from rank %s" % root_rank, name, tensor)
    host = _to_host(tensor, what)
    request = _native.broadcast_async(host.ctypes.data, host.size, _code(host, what),
                                      int(root_rank), name, what=what, keep=(host,),
                                      shape=host.shape, process_set=_set_id(process_set))
    _finish([request])
    return host


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """root_rank's tensor, as a new NDArray on every rank (of process_set; root_rank is a rank
    of the job, a member of the set)."""
    return _like(_broadcast_host(tensor, root_rank, name, process_set), tensor)


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """broadcast in place: every rank's tensor becomes root_rank's."""
    return _write(tensor, _broadcast_host(tensor, root_rank, name, process_set))


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

def _splits_of(splits, what):
    """splits as a list of ints; float splits are refused (Horovod takes integers only)."""
    values = splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else np.asarray(splits)
    if values.dtype.kind not in "iu" and values.size:
        raise _native.InvalidArgumentError("%s: splits must be integers, not %s (%s)" % (
            what, values.dtype.name, values.reshape(-1).tolist()))
    return [int(v) for v in values.reshape(-1)]


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Scatters tensor's rows: splits[r] rows (in order) go to rank r (the r-th member of
    process_set; splits None: the first dimension split evenly); returns the rows every rank
    sent to this one, in rank order, and with splits given, as Horovod, also the rows received
    from each (an int32 NDArray): (output, received_splits)."""
    ps = _of(process_set)
    set_id = _set_id(ps)
    what = _what("alltoall", name, tensor)
    if len(tensor.shape) == 0:  # (numpy's ascontiguousarray would make it 1-D)
        raise PerseusError("%s: alltoall needs at least one dimension" % what,
                           _native.ERROR_INVALID_ARGUMENT)
    host = _to_host(tensor, what)
    n = ps.size()
    return_splits = splits is not None
    if splits is None:
        if host.shape[0] % n:
            raise PerseusError("%s: the first dimension (%d) is not divisible by the number of "
                               "ranks (%d); give splits" % (what, host.shape[0], n),
                               _native.ERROR_INVALID_ARGUMENT)
        splits = [host.shape[0] // n] * n
    else:
        splits = _splits_of(splits, what)
    if len(splits) != n or sum(splits) != host.shape[0] or min(splits) < 0:
        raise PerseusError("%s: splits %s must have %d non-negative entries summing to the "
                           "first dimension %d" % (what, splits, n, host.shape[0]),
                           _native.ERROR_INVALID_ARGUMENT)
    rest = tuple(host.shape[1:])
    row = int(np.prod(rest)) if rest else 1
    request = _native.alltoall_async(host.ctypes.data, [s * row for s in splits],
                                     _code(host, what), name, what=what, keep=(host,),
                                     shape=host.shape, process_set=set_id)
    try:
        request.wait()
        counts = request.counts(n)
        if row and any(c % row for c in counts):  # libperseus compared the shapes
            raise PerseusError("%s: the element counts %s from the ranks are not whole rows of "
                               "%d elements" % (what, counts, row), _native.ERROR_INTERNAL)
        if row == 0:
            out = np.empty((0,) + rest, dtype=host.dtype)
            received = [0] * n
        else:
            out = np.empty((sum(counts) // row,) + rest, dtype=host.dtype)
            received = [c // row for c in counts]
            if sum(counts):
                request.copy_output(out.ctypes.data)
    finally:
        request.release()
    if return_splits:
        return _like(out, tensor), mx.nd.array(received, dtype="int32")
    return _like(out, tensor)


# ---- reducescatter -------------------------------------------------------------------------

def _reducescatter_submit(tensor, name, op, ps, prescale_factor, postscale_factor):
    """Submits tensor's reducescatter in ps: rows split evenly, the first members getting one
    more; returns (output numpy array, request)."""
    what = _what("reducescatter", name, tensor)
    if len(tensor.shape) == 0:  # (numpy's ascontiguousarray would make it 1-D)
        raise ValueError("%s: reducescatter needs a tensor of at least one dimension" % what)
    host = _to_host(tensor, what)
    n, me = ps.size(), ps.rank()
    rest = tuple(host.shape[1:])
    row = int(np.prod(rest)) if rest else 1
    rows = [host.shape[0] // n + (1 if r < host.shape[0] % n else 0) for r in range(n)]
    out = np.empty((rows[me],) + rest, dtype=host.dtype)
    request = _native.reducescatter_async(host.ctypes.data, out.ctypes.data,
                                          [r * row for r in rows], _code(host, what), _OPS[op],
                                          prescale_factor, postscale_factor, name, what=what,
                                          keep=(host, out), shape=host.shape,
                                          process_set=_set_id(ps))
    return out, request


def _scatter_op(op):
    if op not in (Average, Sum):
        raise ValueError("reducescatter: op must be Average or Sum, as in Horovod")
    return op


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The reduction (Average or Sum) of tensor over every rank (of process_set), of which
    this rank keeps its share of the rows (the first dimension split evenly, the first ranks
    getting one more row), as a new NDArray."""
    ps = _of(process_set)
    _set_id(ps)
    out, request = _reducescatter_submit(tensor, name, _scatter_op(op), ps, prescale_factor,
                                         postscale_factor)
    _finish([request])
    return _like(out, tensor)


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor (named name.0, name.1, ...), submitted together; every
    tensor is checked before any is submitted."""
    ps = _of(process_set)
    _set_id(ps)
    op = _scatter_op(op)
    tensors = list(tensors)
    _same_context(tensors, "grouped reducescatter")
    for i, t in enumerate(tensors):
        if len(t.shape) == 0:
            raise ValueError("%s: reducescatter needs a tensor of at least one dimension"
                             % _what("reducescatter", _group_name(name, i), t))
    submitted = [_reducescatter_submit(t, _group_name(name, i), op, ps, prescale_factor,
                                       postscale_factor) for i, t in enumerate(tensors)]
    _finish([r for _, r in submitted])
    return [_like(out, t) for t, (out, _) in zip(tensors, submitted)]


# ---- objects -------------------------------------------------------------------------------

def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's obj (pickled), on every rank (of process_set)."""
    base = name or type(obj).__name__
    if rank() == root_rank:
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
        length = np.array([data.size], dtype=np.int64)
    else:
        data, length = None, np.zeros(1, dtype=np.int64)
    length = _broadcast_host(length, root_rank, "broadcast_object.%s.size" % base if name
                             else None, process_set)
    payload = data if data is not None else np.empty(int(length[0]), dtype=np.uint8)
    payload = _broadcast_host(payload, root_rank, "broadcast_object.%s.data" % base if name
                              else None, process_set)
    return obj if data is not None else pickle.loads(payload.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's (every member's of process_set) obj (pickled), as a list in rank order."""
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    # As Horovod: named after the object's type by default.
    out, rows = allgather_host(data, "allgather_object.%s" % (name or type(obj).__name__),
                               "allgather_object", process_set)
    raw = out.tobytes()
    objects, offset = [], 0
    for r in rows:
        objects.append(pickle.loads(raw[offset:offset + r]))
        offset += r
    return objects
