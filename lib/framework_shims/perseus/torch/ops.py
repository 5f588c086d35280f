"""Horovod's torch collectives over libperseus: the process, the operations, handles."""
import pickle

import torch

from perseus import _native, _process, _reduction_ops
from perseus._native import DuplicateNameError, NonFiniteError, PerseusError  # noqa: F401
from perseus._process_sets import (  # noqa: F401 - the shared process-set API, re-exported
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from perseus._process_sets import members as _members, of as _of, set_id as _set_id
from perseus._reduction_ops import (  # noqa: F401 - Horovod's constants, re-exported
    Adasum, Average, Max, Min, Product, Sum)
from perseus._reduction_ops import LIBRARY_OPS as _OPS
from perseus.torch import _grad, _tensors
from perseus.torch.compression import Compression

_CODES, _nancheck = _tensors.CODES, _grad.nancheck

_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}


def _staged(tensor, set_id):
    """Whether tensor goes through host memory: a CUDA tensor in a process set other than the
    global one (libperseus's sets move host memory). The operation then runs on a CPU copy and
    its result is copied back to the tensor's device: Horovod's results, at the cost of a copy
    each way."""
    return set_id != _native.GLOBAL_PROCESS_SET and tensor.is_cuda


def _back_to(device, result):
    """result (a tensor, or a tuple whose tensors are outputs) moved to device."""
    if isinstance(result, tuple):
        return (result[0].to(device),) + tuple(result[1:])
    return result.to(device)


# ---- the process ---------------------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Joins the job (perseus_init), then adds process_sets (ProcessSets or lists of ranks; the
    same on every rank) in order. Collective; calling it again does nothing. `comm` is not
    supported. Under torchrun or Kubeflow's PyTorchJob (torch's RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT and no other launcher) the ranks meet through torch's store
    (perseus._torch_join)."""
    from perseus import _torch_join
    _process.init_job(comm, process_sets, "perseus.torch", join=_torch_join.join)


from perseus._process import (  # noqa: F401 - the shared process API, re-exported
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size)


def start_timeline(file_path, mark_cycles=False):
    raise NotImplementedError("perseus.torch.start_timeline: set PERSEUS_TIMELINE=<file> before "
                              "the job starts instead")


def stop_timeline():
    raise NotImplementedError("perseus.torch.stop_timeline: the timeline (PERSEUS_TIMELINE) "
                              "runs for the whole job")


# ---- handles -------------------------------------------------------------------------------

class Handle:
    """What an *_async call returns: poll(handle) and synchronize(handle) take it. finish()
    makes the result once every request is done; without it the result is `result` (an
    all-reduce's output), so that the common case allocates no closure."""

    __slots__ = ("_requests", "_finish", "_result", "_done")

    def __init__(self, requests, finish=None, result=None):
        self._requests = requests
        self._finish = finish
        self._result = result
        self._done = False

    def poll(self):
        return all(r.poll() for r in self._requests)

    def _complete(self):
        """The result, once the requests are done (what synchronize returns)."""
        return self._result if self._finish is None else self._finish()

    def synchronize(self):
        if not self._done:
            if self._finish is None:
                # The result needs nothing from the requests (a group's outputs): each is waited
                # for and released in one library call, the first failure raised once every
                # request is released.
                failure = None
                for r in self._requests:
                    try:
                        r.synchronize()
                    except BaseException as e:  # noqa: B036 - raised below, after the rest
                        failure = failure or e
                if failure is not None:
                    raise failure
            else:  # finish() reads the requests' outputs (allgather): released after it
                try:
                    for r in self._requests:
                        r.wait()
                    self._result = self._finish()
                finally:
                    for r in self._requests:
                        r.release()
            self._done = True
            self._finish = None
        return self._result


class _Single(_native.Request):
    """The handle of an operation that is one request whose output is known when it is submitted
    (an all-reduce of a host tensor: every async all-reduce's and DistributedOptimizer
    gradient's): the request itself, without a Handle and a list around it. poll() and
    synchronize() as Handle's (Request's own)."""

    __slots__ = ()

    @property
    def _requests(self):
        return (self,)

    def _complete(self):
        return self._output


def poll(handle):
    """True when the operation behind handle is done (synchronize() then returns at once)."""
    return handle.poll()


def synchronize(handle):
    """Waits for the operation and returns its output (raises PerseusError if it failed)."""
    return handle.synchronize()


class _What:
    """What an operation's errors call it ("allreduce of tensor 'x' (float32, shape [3], on
    cpu)"), made only when an error needs it (str()), not on every call."""

    __slots__ = ("_operation", "_name", "_tensor")

    def __init__(self, operation, name, tensor):
        self._operation, self._name, self._tensor = operation, name, tensor

    def __str__(self):
        operation, name, tensor = self._operation, self._name, self._tensor
        label = "%s of tensor '%s'" % (operation, name) if name else "%s of an unnamed tensor" % (
            operation)
        return "%s (%s, shape %s, on %s)" % (label, str(tensor.dtype).replace("torch.", ""),
                                             list(tensor.shape), tensor.device)

    def __add__(self, other):
        return str(self) + other

    def __radd__(self, other):
        return other + str(self)


_what = _What


def _resolve_op(op, average):
    """Horovod's rule: op wins; else average=False means Sum; the default is Average."""
    return _reduction_ops.resolve_op(op, average, "perseus.torch")


# ---- allreduce -----------------------------------------------------------------------------

def _scale_(tensor, factor):
    """tensor *= factor in place, with torch, as Horovod scales on a GPU: floating tensors in
    their own dtype (the factor rounded to it first, then one rounding of the product: what
    Horovod's half-precision kernel computes), integers in float64 rounded toward zero.
    (libperseus refuses scale factors on device memory.)"""
    if tensor.is_floating_point():
        tensor.mul_(float(torch.tensor(factor, dtype=tensor.dtype)))
    else:
        tensor.copy_(tensor.double() * factor)
    return tensor


def _device_average_(tensor, members):
    """tensor /= members in place, after a Sum on a GPU: torch's own mean of the ranks' values,
    rounded once in the tensor's dtype (integers toward zero). NCCL's ncclAvg divides each
    rank's value before summing them, so ranks' values that cancel give a tiny non-zero
    instead of 0 and other sums are off by a unit in the last place (seen with 3 ranks on an
    H100); Horovod, too, sums on a GPU and scales the sum after."""
    if tensor.is_floating_point():
        tensor.div_(members)
    else:
        tensor.div_(members, rounding_mode="trunc")
    return tensor


def _device_scales(send, op, pre, post, members):
    """(op for libperseus, whether torch scales, the postscale, the number of ranks torch
    divides the result by after: 0 for none). As Horovod does, an Average with scale factors is
    a Sum whose postscale is divided by the number of ranks: one rounding, not two (integers:
    one truncation). Device memory: torch scales (libperseus takes factors of 1 only there), and
    an Average without factors there is a Sum that torch divides (_device_average_).
    members(): the number of ranks, asked only when needed."""
    if pre == 1.0 and post == 1.0:
        if op == Average and send.is_cuda:
            n = members()
            if n > 1:
                return Sum, False, post, n
        return op, False, post, 0
    if op == Average:
        op, post = Sum, post / members()
    return op, send.is_cuda, post, 0


def _buffers(send, output, what):
    """(send address, output address, count, dtype code, device, stream, what the request must
    keep alive) of an all-reduce from send into output (the same tensor in place)."""
    src, count, code, device, stream = _tensors.describe(send, what)
    if output is send:
        return src, src, count, code, device, stream, send
    return src, _tensors.describe(output, what)[0], count, code, device, stream, (send, output)


def _host_args(send, output, op, prescale_factor, postscale_factor, set_id, what):
    """An all-reduce of a host tensor from send into output as libperseus's call takes it: (send
    address, output address, count, dtype code, op code, prescale, postscale, what the request
    must keep alive). libperseus scales and averages host memory itself; an Average with scale
    factors is a Sum whose postscale is divided by the ranks (_device_scales's rule, written out:
    this is on every call's path)."""
    pre, post = float(prescale_factor), float(postscale_factor)
    if (pre != 1.0 or post != 1.0) and op == Average:
        op, post = Sum, post / _members(set_id)
    code = _tensors.CODES.get(send.dtype)
    if code is None or not send.is_contiguous():
        _tensors.describe(send, what)  # raises what is wrong
    src = send.data_ptr()
    if output is send:
        return src, src, send.numel(), code, _OPS[op], pre, post, send
    dst = _tensors.describe(output, what)[0]
    return src, dst, send.numel(), code, _OPS[op], pre, post, (send, output)


def _host_allreduce_async(send, output, name, op, prescale_factor, postscale_factor, set_id,
                          what):
    """_allreduce_async of a host tensor without the NaN check (the common case, kept short)."""
    src, dst, count, code, op_code, pre, post, keep = _host_args(
        send, output, op, prescale_factor, postscale_factor, set_id, what)
    return _native.allreduce_async(src, dst, count, code, op_code, pre, post, name,
                                   _native.DEVICE_CPU, None, what, keep, set_id, send.shape,
                                   output, _Single)


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, label=None,
                     check=None, set_id=_native.GLOBAL_PROCESS_SET):
    """label: what a NaN check's error calls the tensor (default: its name); check: whether to
    check for NaN/Inf (default: PERSEUS_ALLREDUCE_NANCHECK); set_id: the libperseus process set."""
    if tensor.is_cpu and not (_grad.nancheck() if check is None else check):
        # The common case first, before the general path's closure (its cells cost every call):
        # every async all-reduce comes here.
        what = _What("allreduce", name, tensor)
        code = _tensors.CODES.get(tensor.dtype)
        if (output is tensor and prescale_factor == 1.0 and postscale_factor == 1.0
                and code is not None and tensor.is_contiguous()):
            # In place, unscaled (allreduce_async_, every DistributedOptimizer gradient):
            # _host_args's result without its tuple.
            src = tensor.data_ptr()
            return _native.allreduce_async(src, src, tensor.numel(), code, _OPS[op], 1.0, 1.0,
                                           name, _native.DEVICE_CPU, None, what, tensor, set_id,
                                           tensor.shape, tensor, _Single)
        send = tensor if output is tensor else tensor.contiguous()
        return _host_allreduce_async(send, output, name, op, prescale_factor, postscale_factor,
                                     set_id, what)
    return _allreduce_async_general(tensor, output, name, op, prescale_factor, postscale_factor,
                                    label, check, set_id)


def _allreduce_async_general(tensor, output, name, op, prescale_factor, postscale_factor, label,
                             check, set_id):
    if _staged(tensor, set_id):
        host = tensor.detach().cpu()
        inner = _allreduce_async(host, host, name, op, prescale_factor, postscale_factor, label,
                                 check, set_id)
        return Handle(inner._requests, lambda: output.copy_(inner._complete()))
    what = _What("allreduce", name, tensor)
    send = tensor if output is tensor else tensor.contiguous()
    check = (_grad.nancheck() if check is None else check) and send.is_floating_point()
    if not check and send.is_cpu:  # an integer tensor under the NaN check
        return _host_allreduce_async(send, output, name, op, prescale_factor, postscale_factor,
                                     set_id, what)
    input_nonfinite = check and not _grad.finite(send)
    pre, post = float(prescale_factor), float(postscale_factor)
    # Device memory: libperseus takes scale factors of 1 only, so torch scales (and divides).
    op, device_scale, post, divide_by = _device_scales(send, op, pre, post,
                                                       lambda: _members(set_id))
    if device_scale:
        if pre != 1.0:
            send = _scale_(send, pre) if output is tensor else _scale_(send.clone(), pre)
        pre_lib, post_lib = 1.0, 1.0
    else:
        pre_lib, post_lib = pre, post
    src, dst, count, code, device, stream, keep = _buffers(send, output, what)
    request = _native.allreduce_async(src, dst, count, code, _OPS[op], pre_lib, post_lib, name,
                                      device, stream, what=what, keep=keep,
                                      process_set=set_id, shape=send.shape)
    if not check and not (device_scale and post != 1.0) and not divide_by:
        return Handle([request], None, output)

    def finish():
        if device_scale and post != 1.0:
            _scale_(output, post)
        if divide_by:
            _device_average_(output, divide_by)
        if check and not _grad.finite(output):
            raise _grad.nonfinite_error(label or (
                "tensor '%s'" % name if name else "unnamed tensor"), output, input_nonfinite)
        return output

    return Handle([request], finish)


def _direct(tensor):
    """Whether a blocking all-reduce of tensor is one library call (_allreduce_now): host memory,
    and no NaN check (which looks at the input before and the output after)."""
    return tensor.is_cpu and not _grad.nancheck()


def _allreduce_now(tensor, output, name, op, prescale_factor, postscale_factor, set_id):
    """_allreduce_async waited for, for a tensor that _direct() takes: one library call
    (perseus_comm_allreduce), no handle. The same checks, results and errors."""
    what = _What("allreduce", name, tensor)
    send = tensor if output is tensor else tensor.contiguous()
    src, dst, count, code, op_code, pre, post, _ = _host_args(
        send, output, op, prescale_factor, postscale_factor, set_id, what)
    _native.allreduce(src, dst, count, code, op_code, pre, post, name, _native.DEVICE_CPU, None,
                      what=what, process_set=set_id, shape=send.shape)
    return output


def _set_and_op(process_set, op, average):
    """(libperseus set number, Horovod op) of a call's arguments: _set_id and _resolve_op, with
    the common case (the global set, an op given without average) decided first."""
    if process_set is global_process_set and average is None and op in _OPS:
        return _native.GLOBAL_PROCESS_SET, op
    return _set_id(process_set), _resolve_op(op, average)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    set_id, op = _set_and_op(process_set, op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, None,
                            None, set_id)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    # The common call first (a loop of them is Horovod's way to all-reduce many tensors): a
    # contiguous host tensor of a dtype libperseus takes, the global set, an op given, no
    # scaling, no NaN check: _allreduce_async's checks in one place, without its frame and
    # _set_and_op's; anything else takes the general path, which raises what is wrong.
    if (process_set is global_process_set and average is None and tensor.is_cpu
            and prescale_factor == 1.0 and postscale_factor == 1.0):
        op_code = _OPS.get(op)
        code = _CODES.get(tensor.dtype)
        if op_code is not None and code is not None and tensor.is_contiguous() and not _nancheck():
            src = tensor.data_ptr()
            return _native.allreduce_async(src, src, tensor.numel(), code, op_code, 1.0, 1.0,
                                           name, _native.DEVICE_CPU, None,
                                           _What("allreduce", name, tensor), tensor,
                                           _native.GLOBAL_PROCESS_SET, tensor.shape, tensor,
                                           _Single)
    set_id, op = _set_and_op(process_set, op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, None,
                            None, set_id)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        if _direct(tensor):
            set_id = _set_id(process_set)
            output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            return _allreduce_now(tensor, output, name, _resolve_op(op, None), prescale_factor,
                                  postscale_factor, set_id)
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad):
        return allreduce(grad, op=ctx.op, prescale_factor=ctx.pre, postscale_factor=ctx.post,
                         process_set=ctx.process_set), None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction (Average by default) of tensor over every rank (of process_set), as a new
    tensor."""
    _set_id(process_set)
    op = _resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    set_id = _set_id(process_set)
    op = _resolve_op(op, average)
    if _direct(tensor):
        return _allreduce_now(tensor, tensor, name, op, prescale_factor, postscale_factor, set_id)
    return synchronize(_allreduce_async(tensor, tensor, name, op, prescale_factor,
                                        postscale_factor, set_id=set_id))


def _group_name(name, i):
    return None if name is None else "%s.%d" % (name, i)


def _same_device(tensors, what):
    """A group's tensors must share one device, as in Horovod (checked before any is
    submitted)."""
    if all(t.is_cpu for t in tensors):  # the common case, without a torch.device a tensor
        return
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise PerseusError("%s: the group's tensors are on %s; a group's tensors must all be on "
                           "one device" % (what, " and ".join(devices)),
                           _native.ERROR_INVALID_ARGUMENT)


def _grouped(tensors, outputs, name, op, prescale_factor, postscale_factor, set_id):
    _same_device(tensors, "grouped allreduce")
    if len(tensors) > 1 and tensors[0].is_cpu and not _grad.nancheck():
        return _grouped_host(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             set_id)
    handles = [_allreduce_async(t, o, _group_name(name, i), op, prescale_factor,
                                postscale_factor, set_id=set_id)
               for i, (t, o) in enumerate(zip(tensors, outputs))]
    requests = [r for h in handles for r in h._requests]
    return Handle(requests, lambda: [h._complete() for h in handles])


def _grouped_host(tensors, outputs, name, op, prescale_factor, postscale_factor, set_id):
    """A group of host tensors in one library call (perseus_comm_allreduce_many_async): the
    requests, names and checks of a call a tensor (another rank may submit them so), without a
    library call, a shape call and a lock per tensor. (Device tensors, whose scaling and
    averaging torch does, and the NaN check, whose result each tensor checks, go a tensor at a
    time.)"""
    pre = float(prescale_factor)
    op, _, post, _ = _device_scales(tensors[0], op, pre, float(postscale_factor),
                                    lambda: _members(set_id))
    names = [_group_name(name, i) for i in range(len(tensors))]
    whats = [_What("allreduce", n, t) for n, t in zip(names, tensors)]
    sends, recvs, counts, codes, shapes, keeps = [], [], [], [], [], []
    for tensor, output, what in zip(tensors, outputs, whats):
        code = _tensors.CODES.get(tensor.dtype)
        if output is tensor and code is not None and tensor.is_contiguous():
            src = dst = tensor.data_ptr()  # in place: _buffers's result, written out
            keep = tensor
        else:
            send = tensor if output is tensor else tensor.contiguous()
            src, dst, _, code, _, _, keep = _buffers(send, output, what)
        sends.append(src)
        recvs.append(dst)
        counts.append(tensor.numel())
        codes.append(code)
        shapes.append(tensor.shape)
        keeps.append(keep)
    group = _native.allreduce_many_async(sends, recvs, counts, codes, _OPS[op], pre, post,
                                         names, shapes, whats, keeps, process_set=set_id)
    return Handle((group,), None, list(outputs))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    set_id = _set_id(process_set)
    op = _resolve_op(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped(tensors, outputs, name, op, prescale_factor, postscale_factor, set_id)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    set_id = _set_id(process_set)
    op = _resolve_op(op, average)
    return _grouped(tensors, list(tensors), name, op, prescale_factor, postscale_factor, set_id)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grads):
        # As Horovod: the same grouped all-reduce (op and scale factors) of the gradients.
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=ctx.op,
                                    prescale_factor=ctx.pre, postscale_factor=ctx.post,
                                    process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction of each tensor over every rank (of process_set), as new tensors, with
    autograd as allreduce's."""
    _set_id(process_set)
    op = _resolve_op(op, average)
    return _apply_grouped(_GroupedAllreduce, (name, op, prescale_factor, postscale_factor,
                                              process_set), tensors, compression)


def _apply_grouped(function, head, tensors, compression):
    """function.apply(*head, *compressed tensors), decompressed: a grouped op with autograd."""
    compressed = [compression.compress(t) for t in tensors]
    if not compressed:
        return []
    outputs = function.apply(*head, *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(outputs, compressed)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """A sparse tensor's all-reduce as Horovod does it: its indices and values all-gathered
    (named name.indices and name.values), the values divided by the set's size for Average.
    Returns a callable that waits and gives the sum (or average) as a sparse tensor of the
    input's size, uncoalesced (an index sent by several ranks appears once per rank)."""
    ps = _of(process_set)
    _set_id(ps)
    op = _resolve_op(op, None)
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async: op must be Average or Sum, not %s"
                         % _OP_NAMES.get(op, op))
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse tensor (torch.sparse_coo), not "
                         "a %s tensor: use allreduce_async" % tensor.layout)
    indices = allgather_async(tensor._indices().transpose(0, 1).contiguous(),
                              name=None if name is None else "%s.indices" % name,
                              process_set=ps)
    values = allgather_async(tensor._values().contiguous(),
                             name=None if name is None else "%s.values" % name, process_set=ps)

    def result():
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if op == Average:
            gathered_values = gathered_values / ps.size()
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values,
                                       tensor.size(), dtype=tensor.dtype, device=tensor.device)

    return result


# ---- allgather -----------------------------------------------------------------------------

def _allgather_async(tensor, name, with_counts=False, set_id=_native.GLOBAL_PROCESS_SET,
                     members=None):
    """members: how many ranks take part (process set's size; default: every rank)."""
    if _staged(tensor, set_id):
        inner = _allgather_async(tensor.detach().cpu(), name, with_counts, set_id, members)
        return Handle(inner._requests, lambda: _back_to(tensor.device, inner._complete()))
    what = _what("allgather", name, tensor)
    send = tensor.contiguous()
    if send.dim() == 0:
        send = send.reshape(1)
    src, count, code, device, stream = _tensors.describe(send, what, reduce=False)
    request = _native.allgatherv_async(src, count, code, name, device, stream, what=what,
                                       keep=(send,), process_set=set_id, shape=send.shape)
    rest = tuple(send.shape[1:])
    row = 1
    for d in rest:
        row *= d

    def finish():
        counts = request.counts(members or _native.size())
        total = sum(counts)
        rows = _rows_of(counts, row, what)
        output = torch.empty((sum(rows),) + rest, dtype=send.dtype, device=send.device)
        if total:
            request.copy_output(output.data_ptr())
        return (output, rows) if with_counts else output

    return Handle([request], finish)


def _rows_of(counts, row, what):
    """Rows per rank from element counts; libperseus has checked that the other ranks' rows
    match this one's, but the output is allocated here, so check again before copying."""
    if row == 0:
        if any(counts):
            raise PerseusError("%s: other ranks sent elements for rows of 0 elements (counts %s)"
                               % (what, counts), _native.ERROR_INTERNAL)
        return [0] * len(counts)
    if any(c % row for c in counts):
        raise PerseusError("%s: the element counts %s from the ranks are not whole rows of %d "
                           "elements" % (what, counts, row), _native.ERROR_INTERNAL)
    return [c // row for c in counts]


def _allgather_in(tensor, name, process_set, with_counts=False):
    ps = _of(process_set)
    return _allgather_async(tensor, name, with_counts, _set_id(ps), ps.size())


def allgather_async(tensor, name=None, process_set=global_process_set):
    return _allgather_in(tensor, name, process_set)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        output, rows = synchronize(_allgather_in(tensor, name, process_set, with_counts=True))
        ctx.rows = rows
        ctx.shape = tensor.shape
        ctx.process_set = process_set
        return output

    @staticmethod
    def backward(ctx, grad):
        # As Horovod: the average over the ranks of the gradients of the gathered tensor.
        ps = _of(ctx.process_set)
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ps)
        me = ps.rank()
        start = sum(ctx.rows[:me])
        return reduced.narrow(0, start, ctx.rows[me]).reshape(ctx.shape), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's (every member's of process_set) tensor concatenated along the first
    dimension, in rank order (first dimensions may differ between ranks)."""
    _set_id(process_set)
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    _same_device(tensors, "grouped allgather")
    handles = [_allgather_in(t, _group_name(name, i), process_set)
               for i, t in enumerate(tensors)]
    return Handle([r for h in handles for r in h._requests],
                  lambda: [h._complete() for h in handles])


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        _same_device(tensors, "grouped allgather")
        handles = [_allgather_in(t, _group_name(name, i), process_set, with_counts=True)
                   for i, t in enumerate(tensors)]
        results = Handle([r for h in handles for r in h._requests],
                         lambda: [h._complete() for h in handles]).synchronize()
        ctx.rows = [rows for _, rows in results]
        ctx.shapes = [t.shape for t in tensors]
        ctx.process_set = process_set
        return tuple(output for output, _ in results)

    @staticmethod
    def backward(ctx, *grads):
        # As Horovod: the average over the ranks of each gathered tensor's gradient, this
        # rank's rows of it.
        ps = _of(ctx.process_set)
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average, process_set=ps)
        me = ps.rank()
        out = [r.narrow(0, sum(rows[:me]), rows[me]).reshape(shape)
               for r, rows, shape in zip(reduced, ctx.rows, ctx.shapes)]
        return (None, None) + tuple(out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor, as new tensors, with autograd as allgather's."""
    _set_id(process_set)
    if not tensors:
        return []
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ---- broadcast -----------------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, set_id=_native.GLOBAL_PROCESS_SET):
    if _staged(tensor, set_id):
        host = tensor.detach().cpu()
        inner = _broadcast_async(host, host, root_rank, name, set_id)
        return Handle(inner._requests, lambda: output.copy_(inner._complete()))
    what = _what("broadcast", name, tensor)
    if output is not tensor:
        output.copy_(tensor)
    buf, count, code, device, stream = _tensors.describe(output, what, reduce=False)
    request = _native.broadcast_async(buf, count, code, int(root_rank), name, device, stream,
                                      what=what, keep=(output,), process_set=set_id,
                                      shape=output.shape)
    return Handle([request], lambda: output)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    set_id = _set_id(process_set)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _broadcast_async(tensor, output, root_rank, name, set_id)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    set_id = _set_id(process_set)
    return _broadcast_async(tensor, tensor, root_rank, name, set_id)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        # As Horovod: the root gets the average over the ranks of the gradients, the others 0.
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if _native.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor, as a new tensor on every rank (of process_set; root_rank is a rank
    of the job, a member of the set)."""
    _set_id(process_set)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall ------------------------------------------------------------------------------

def _splits_list(tensor, splits, n):
    if splits is None:
        first = tensor.shape[0] if tensor.dim() else 1
        if first % n:
            raise ValueError("alltoall without splits needs a first dimension divisible by the "
                             "number of ranks (%d rows, %d ranks)" % (first, n))
        return [first // n] * n
    values = [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
    if len(values) != n:
        raise ValueError("alltoall: splits has %d entries, the job %d ranks" % (len(values), n))
    if any(v < 0 for v in values) or sum(values) != (tensor.shape[0] if tensor.dim() else 1):
        raise ValueError("alltoall: splits %s must be >= 0 and add up to the first dimension "
                         "(%d)" % (values, tensor.shape[0] if tensor.dim() else 1))
    return values


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """synchronize() of the handle gives (output, received_splits). In a process set, splits
    has one entry per member, in rank order."""
    ps = _of(process_set)
    set_id = _set_id(ps)
    if _staged(tensor, set_id):
        inner = alltoall_async(tensor.detach().cpu(), splits, name, ps)
        return Handle(inner._requests, lambda: _back_to(tensor.device, inner._complete()))
    what = _what("alltoall", name, tensor)
    send = tensor.contiguous()
    if send.dim() == 0:
        send = send.reshape(1)
    n = ps.size()
    split_rows = _splits_list(send, splits, n)
    rest = tuple(send.shape[1:])
    row = 1
    for d in rest:
        row *= d
    src, _, code, device, stream = _tensors.describe(send, what, reduce=False)
    request = _native.alltoall_async(src, [s * row for s in split_rows], code, name, device,
                                     stream, what=what, keep=(send,), shape=send.shape,
                                     process_set=set_id)

    def finish():
        counts = request.counts(n)
        rows = _rows_of(counts, row, what)
        output = torch.empty((sum(rows),) + rest, dtype=send.dtype, device=send.device)
        if sum(counts):
            request.copy_output(output.data_ptr())
        # As Horovod's: received_splits lives where splits did (a tensor), else on the CPU.
        where = splits.device if torch.is_tensor(splits) else "cpu"
        return output, torch.tensor(rows, dtype=torch.int32, device=where)

    return Handle([request], finish)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _):
        back, _ = alltoall(grad.contiguous(), splits=ctx.received, process_set=ctx.process_set)
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] rows (default: an equal share) of tensor to rank r (to the r-th member
    of process_set) and returns the rows every rank sent here, in rank order; with splits
    given, returns (output, received_splits) as Horovod does."""
    _set_id(process_set)
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ---- reducescatter -------------------------------------------------------------------------

def _rows_per_rank(first, n):
    return [first // n + (1 if r < first % n else 0) for r in range(n)]


def _check_scatterable(tensor, what):
    if tensor.dim() == 0:
        raise ValueError(what + ": reducescatter needs a tensor of at least one dimension")


def _reducescatter_async(tensor, name, op, ps, prescale_factor, postscale_factor):
    set_id = _set_id(ps)
    if _staged(tensor, set_id):
        inner = _reducescatter_async(tensor.detach().cpu(), name, op, ps, prescale_factor,
                                     postscale_factor)
        return Handle(inner._requests, lambda: _back_to(tensor.device, inner._complete()))
    what = _what("reducescatter", name, tensor)
    send = tensor.contiguous()
    _check_scatterable(send, what)
    n, me = ps.size(), ps.rank()
    rest = tuple(send.shape[1:])
    row = 1
    for d in rest:
        row *= d
    rows = _rows_per_rank(send.shape[0], n)
    output = torch.empty((rows[me],) + rest, dtype=send.dtype, device=send.device)
    pre, post = float(prescale_factor), float(postscale_factor)
    # Device memory: libperseus takes scale factors of 1 only, so torch scales (and divides).
    op, device_scale, post, divide_by = _device_scales(send, op, pre, post, lambda: n)
    if device_scale:
        if pre != 1.0:
            send = _scale_(send.clone(), pre)
        pre, post_lib = 1.0, 1.0
    else:
        post_lib = post
    src, _, code, device, stream = _tensors.describe(send, what)
    request = _native.reducescatter_async(src, output.data_ptr(), [r * row for r in rows], code,
                                          _OPS[op], pre, post_lib, name,
                                          device, stream, what=what, keep=(send, output),
                                          shape=send.shape, process_set=set_id)

    def finish():
        if device_scale and post != 1.0:
            _scale_(output, post)
        if divide_by:
            _device_average_(output, divide_by)
        return output

    return Handle([request], finish)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    ps = _of(process_set)
    return _reducescatter_async(tensor, name, _resolve_op(op, None), ps, prescale_factor,
                                postscale_factor)


def _reducescatter_grad(grads, op, ps, pre, post):
    """As Horovod: the output gradients, times the set's size for Sum and by the scale factors,
    gathered back to the input's rows."""
    factor = (ps.size() if op == Sum else 1) * float(pre) * float(post)
    return [g * factor if factor != 1 else g for g in grads]


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(_reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                                postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        (scaled,) = _reducescatter_grad([grad.contiguous()], ctx.op, ctx.process_set, ctx.pre,
                                        ctx.post)
        return allgather(scaled, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """The reduction of tensor over every rank (of process_set), of which this rank keeps its
    share of the rows (the first dimension split evenly, the first ranks getting one more
    row). Differentiable as Horovod's: the gradient is the output gradients gathered, times the
    set's size for op=Sum."""
    ps = _of(process_set)
    _set_id(ps)
    op = _resolve_op(op, None)
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, ps, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of each tensor (named name.0, name.1, ...); synchronize() gives the list
    of outputs. Every tensor is checked before any is submitted."""
    ps = _of(process_set)
    _set_id(ps)
    op = _resolve_op(op, None)
    _same_device(tensors, "grouped reducescatter")
    for i, t in enumerate(tensors):
        _check_scatterable(t, _what("reducescatter", _group_name(name, i), t))
    handles = [_reducescatter_async(t, _group_name(name, i), op, ps, prescale_factor,
                                    postscale_factor) for i, t in enumerate(tensors)]
    return Handle([r for h in handles for r in h._requests],
                  lambda: [h._complete() for h in handles])


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        scaled = _reducescatter_grad([g.contiguous() for g in grads], ctx.op, ctx.process_set,
                                     ctx.pre, ctx.post)
        return (None, None, None, None, None) + tuple(
            grouped_allgather(scaled, process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor, as a list, with reducescatter's autograd."""
    ps = _of(process_set)
    _set_id(ps)
    op = _resolve_op(op, None)
    return _apply_grouped(_GroupedReducescatter, (name, op, ps, prescale_factor,
                                                  postscale_factor), tensors, compression)


# ---- the rest ------------------------------------------------------------------------------

def barrier(process_set=global_process_set):
    """Returns once every rank (every member of process_set) has called it."""
    _native.barrier(_set_id(process_set))


def join(device=-1):
    """This rank has no more data: takes part in the others' all-reduces with zeros until every
    rank has joined. Returns the rank that joined last."""
    if hasattr(device, "index"):
        device = -1 if device.type == "cpu" else device.index
    return _native.join(int(device))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's obj (pickled), on every rank."""
    _set_id(process_set)
    base = name or type(obj).__name__
    if _native.rank() == root_rank:
        data = pickle.dumps(obj)
        length = torch.tensor([len(data)], dtype=torch.int64)
    else:
        data = None
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name="broadcast_object.%s.size" % base if name else None,
               process_set=process_set)
    if data is not None:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
            torch.empty(0, dtype=torch.uint8)
    else:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name="broadcast_object.%s.data" % base if name else None,
               process_set=process_set)
    if data is not None:
        return obj
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's obj (pickled), as a list in rank order."""
    ps = _of(process_set)
    set_id = _set_id(ps)
    data = pickle.dumps(obj)
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    # As Horovod: named after the object's type by default, so that the ranks' calls match
    # even when their unnamed operations have not been counted alike.
    output, rows = synchronize(_allgather_async(
        tensor, "allgather_object.%s" % (name or type(obj).__name__), with_counts=True,
        set_id=set_id, members=ps.size()))
    raw = output.numpy().tobytes()
    objects, offset = [], 0
    for r in rows:
        objects.append(pickle.loads(raw[offset:offset + r]))
        offset += r
    return objects


__all__ = [
    "PerseusError", "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set", "init", "shutdown",
    "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "gloo_built", "nccl_built", "cuda_built", "mpi_built", "mpi_enabled", "gloo_enabled",
    "mpi_threads_supported", "rocm_built", "ddl_built", "ccl_built", "is_homogeneous",
    "start_timeline", "stop_timeline", "Handle", "poll", "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async",
    "barrier", "join",
    "broadcast_object", "allgather_object", "Compression", "NonFiniteError",
]
