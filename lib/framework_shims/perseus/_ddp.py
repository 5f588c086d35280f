"""`import perseus` for plain DistributedDataParallel: DDP's gradient buckets are averaged by
libperseus (a communication hook) instead of torch.distributed's process group.

Nothing here imports torch until torch.nn.parallel.distributed is imported: install() puts a
finder on sys.meta_path that patches DistributedDataParallel right after its module runs (or
patches at once when torch is already loaded). The patch is on the class's methods, so every
path to the class (torch.nn.parallel.DistributedDataParallel, the module's name, ...) sees it:

- __init__ marks the instance; its first forward() attaches the hook, so that a hook the
  script registers itself (register_comm_hook, before training as DDP requires) wins and
  Perseus stays out of that model;
- attaching initialises libperseus once: perseus_init under perseusrun or mpirun, else (torchrun,
  torch.distributed.launch) through torch.distributed's own store (perseus_init_with); when that
  fails (no library, say) a one-line warning says so and DDP stays as it was; likewise when the
  model's process group is not the whole job, or the model is on CUDA and libperseus has no NCCL.
"""
import importlib.abc
import os
import queue
import socket
import sys
import threading
import time

from perseus import _contract, _native

_TARGET = "torch.nn.parallel.distributed"
STATS = {"models": 0, "buckets": 0, "compressed": 0, "alone": 0, "skipped": ""}
_lock = threading.Lock()
_init_state = {"tried": False, "ok": False}
_model_ids = iter(range(1 << 62))


def _warn(message):
    print("perseus: " + message, file=sys.stderr, flush=True)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


_finder = _Finder()


def install():
    module = sys.modules.get(_TARGET)
    if module is not None:
        _patch(module)
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _patch(module):
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    cls = module.DistributedDataParallel
    if getattr(cls, "_perseus_patched", False):
        return
    original_init = cls.__init__
    original_forward = cls.forward
    original_register = cls.register_comm_hook
    original_builtin = getattr(cls, "_register_builtin_comm_hook", None)

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._perseus_pending = True

    def forward(self, *args, **kwargs):
        if self.__dict__.get("_perseus_pending"):
            self._perseus_pending = False
            _attach(self, original_register)
        return original_forward(self, *args, **kwargs)

    def register_comm_hook(self, state, hook):
        self._perseus_pending = False
        return original_register(self, state, hook)

    cls.__init__ = __init__
    cls.forward = forward
    cls.register_comm_hook = register_comm_hook
    if original_builtin is not None:
        def _register_builtin_comm_hook(self, comm_hook_type):
            self._perseus_pending = False
            return original_builtin(self, comm_hook_type)
        cls._register_builtin_comm_hook = _register_builtin_comm_hook
    cls._perseus_patched = True
    _patch_env_rendezvous()


# ---- torch.distributed's env:// rendezvous --------------------------------------------------
# Under a launcher whose rank 0 serves torch's store (perseusrun, mpirun), a rank that reaches
# init_process_group before rank 0 has bound MASTER_PORT is refused, and torch's TCPStore client
# tries again only a second later: measured under perseusrun on 2 ranks, init_process_group took
# 1.01 s in 4 jobs of 6, 0.01 s in the others (bench/RESULTS.md). So the other ranks first wait
# here, looking every few milliseconds, until MASTER_PORT takes a connection; then torch's own
# connection succeeds at its first try. (torchrun's agent serves the store before its workers
# start, so they never wait.)

_POLL_SECONDS = 0.005
_WAIT_AT_MOST = 60.0  # then torch's own retries and timeout take over


def _rank_of(url):
    from urllib.parse import parse_qs, urlparse
    query = parse_qs(urlparse(url).query)
    value = (query.get("rank") or [os.environ.get("RANK", "")])[0]
    return int(value) if str(value).lstrip("-").isdigit() else None


def _wait_for_master(url, timeout):
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or _rank_of(url) in (None, 0):
        return
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not address or not port.isdigit():
        return  # torch's handler names what is missing
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else _WAIT_AT_MOST
    deadline = time.monotonic() + min(seconds, _WAIT_AT_MOST)
    while True:
        try:
            socket.create_connection((address, int(port)), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(_POLL_SECONDS)


def _patch_env_rendezvous():
    module = sys.modules.get("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    original = handlers.get("env") if isinstance(handlers, dict) else None
    if original is None or getattr(original, "_perseus_patched", False):
        return

    def env_handler(url, *args, **kwargs):
        timeout = kwargs.get("timeout", args[0] if args else None)
        _wait_for_master(url, timeout)
        return original(url, *args, **kwargs)

    env_handler._perseus_patched = True
    handlers["env"] = env_handler


def _init_here():
    """perseus_init as perseus._torch_join says: by itself under perseusrun, mpirun or srun,
    else through torch.distributed's own store (torchrun, PyTorchJob)."""
    from perseus import _torch_join
    _torch_join.join()


def _initialised():
    with _lock:
        if not _init_state["tried"]:
            _init_state["tried"] = True
            try:
                if not _native.is_initialized():
                    _init_here()
                _init_state["ok"] = True
            except _native.PerseusError as e:
                reason = str(e).splitlines()[0] if str(e) else repr(e)
                STATS["skipped"] = reason
                _warn("DDP keeps torch.distributed's all-reduce: libperseus could not "
                      "initialise (%s)" % reason)
        return _init_state["ok"]


def _attach(ddp, register):
    if not _initialised():
        return
    import torch
    group_size = ddp.process_group.size()
    if group_size != _native.size():
        _warn("a DDP model on a process group of %d ranks keeps torch.distributed's all-reduce "
              "(Perseus's job has %d)" % (group_size, _native.size()))
        return
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    if any(p.is_cuda for p in params) and not _native.nccl_built():
        _warn("a DDP model on CUDA keeps torch.distributed's all-reduce: this libperseus has no "
              "NCCL (perseus_nccl_built() = 0)")
        return
    if any(p.device.type not in ("cpu", "cuda") for p in params):
        _warn("a DDP model on %s keeps torch.distributed's all-reduce"
              % sorted({p.device.type for p in params}))
        return
    if group_size == 1:
        from perseus.torch import _grad
        if not _grad.nancheck():
            # A job of one rank: the average over one rank is the bucket itself, so no hook is
            # registered (as Horovod registers none at one rank) and DDP runs exactly as
            # without Perseus; nothing travels, so PERSEUS_ALLREDUCE_DTYPE casts nothing (as in
            # DistributedOptimizer). Only the NaN check, read here, keeps the hook.
            with _lock:
                STATS["models"] += 1
                STATS["alone"] += 1
            return
    state = _HookState(next(_model_ids), group_size,
                       {id(p): name for name, p in ddp.module.named_parameters()})
    register(ddp, state, _allreduce_hook)
    with _lock:
        STATS["models"] += 1


class _HookState:
    def __init__(self, model_id, size, names):
        self.model_id = model_id
        self.size = size
        self.names = names  # id(parameter) -> its name in the module, for NaN-check errors


class _Completer:
    """One thread that waits for the submitted requests in order and completes their futures."""

    def __init__(self):
        self._queue = queue.Queue()
        self._thread = None

    def add(self, request, future, tensor, stream, sent, check):
        """sent: the tensor all-reduced (tensor itself, or its float16/bfloat16 copy, copied
        back into tensor when done); check: None, or (input_nonfinite, label) for the NaN
        check of the result."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="perseus-ddp", daemon=True)
            self._thread.start()
        self._queue.put((request, future, tensor, stream, sent, check))

    @staticmethod
    def _finish(request, tensor, sent, check):
        if request is not None:
            request.wait()
        if check is not None:
            from perseus.torch import _grad
            if not _grad.finite(sent):
                input_nonfinite, label = check
                raise _grad.nonfinite_error(
                    label, sent, input_nonfinite,
                    None if sent is tensor else str(sent.dtype).replace("torch.", ""))
        if sent is not tensor:
            tensor.copy_(sent)

    def _run(self):
        import torch
        while True:
            request, future, tensor, stream, sent, check = self._queue.get()
            try:
                if stream is not None:
                    with torch.cuda.stream(stream):
                        self._finish(request, tensor, sent, check)
                        future.set_result(tensor)
                else:
                    self._finish(request, tensor, sent, check)
                    future.set_result(tensor)
            except Exception as e:  # noqa: BLE001 - handed to DDP through the future
                future.set_exception(e)
            finally:
                request.release()


_completer = _Completer()


def _bucket_label(state, bucket, index):
    params = bucket.parameters() if hasattr(bucket, "parameters") else []
    names = [state.names.get(id(p), "?") for p in params]
    return "DDP gradient bucket %d (parameters %s)" % (index, ", ".join(names) or "unknown")


def _allreduce_hook(state, bucket):
    import torch
    from perseus.torch import _grad, _tensors
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    index = bucket.index() if hasattr(bucket, "index") else 0
    if state.size == 1:
        check = None
        if _grad.nancheck():
            check = (not _grad.finite(tensor), _bucket_label(state, bucket, index))
        return _alone(tensor, check)
    # PERSEUS_ALLREDUCE_DTYPE: a float32 bucket travels as float16/bfloat16, divided by the
    # number of ranks before the cast (so that the sum cannot overflow where the average would
    # not) and summed; copied back into the bucket when done.
    wire = _grad.allreduce_dtype() if tensor.dtype == torch.float32 else None
    if wire is not None:
        sent = (tensor / state.size if state.size > 1 else tensor).to(wire)
        op = _native.SUM
    else:
        sent, op = tensor, _native.AVERAGE
    name = "perseus.ddp.%d.bucket.%d.%d" % (state.model_id, index, tensor.numel())
    if wire is not None:
        name += "." + str(wire).replace("torch.", "")
    check = None
    if _grad.nancheck():
        check = (not _grad.finite(sent), _bucket_label(state, bucket, index))
    ptr, count, dtype, device, stream = _tensors.describe(sent, "DDP gradient bucket " + name)
    request = _native.allreduce_async(ptr, ptr, count, dtype, op, 1.0, 1.0, name,
                                      device, stream, what="allreduce of DDP bucket " + name,
                                      keep=(sent,))
    with _lock:
        STATS["buckets"] += 1
        if wire is not None:
            STATS["compressed"] += 1
    if tensor.is_cuda:
        future = torch.futures.Future(devices=[tensor.device])
        _completer.add(request, future, tensor, torch.cuda.current_stream(tensor.device), sent,
                       check)
    else:
        future = torch.futures.Future()
        _completer.add(request, future, tensor, None, sent, check)
    return future


def _alone(tensor, check):
    """A job of one rank under the NaN check (the only case with a hook there, see _attach):
    the all-reduce's result is the bucket itself, uncast, so the hook checks it and completes
    at once, with no library call."""
    import torch
    with _lock:
        STATS["buckets"] += 1
    future = torch.futures.Future(devices=[tensor.device]) if tensor.is_cuda else \
        torch.futures.Future()
    try:
        _Completer._finish(None, tensor, tensor, check)
        future.set_result(tensor)
    except Exception as e:  # noqa: BLE001 - handed to DDP through the future
        future.set_exception(e)
    return future
