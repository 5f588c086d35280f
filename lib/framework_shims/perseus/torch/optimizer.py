"""DistributedOptimizer: averages gradients over the ranks, overlapping the all-reduce with the
backward pass (Horovod's design: a hook on each parameter's gradient accumulator submits that
gradient's all-reduce as soon as it is ready; step() waits for them)."""
import contextlib
import warnings

import torch

from perseus import _native
from perseus.torch import _buckets, _grad, ops
from perseus.torch.compression import from_env as compression_from_env


def _check_unique(names, shown=5):
    """Refuses duplicate parameter names (they name the all-reduces, which must differ), naming
    the first few, as merging two models' named_parameters gives."""
    counts = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    repeated = [name for name, count in counts.items() if count > 1]  # in order of appearance
    if repeated:
        listed = ", ".join(repr(n) for n in repeated[:shown])
        more = " and %d more" % (len(repeated) - shown) if len(repeated) > shown else ""
        raise ValueError(
            "named_parameters has %d duplicate name(s): %s%s. Each parameter needs its own name "
            "(it names the parameter's all-reduce): when merging several models' "
            "named_parameters, prefix each model's names, e.g. [('a.' + n, p) for n, p in "
            "model_a.named_parameters()] + [('b.' + n, p) for n, p in "
            "model_b.named_parameters()]" % (len(repeated), listed, more))

class _DistributedOptimizer(torch.optim.Optimizer):
    # Mixed into the wrapped optimizer's own class (see DistributedOptimizer).

    def _perseus_setup(self, named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._compression = compression
        self._sparse_as_dense = bool(sparse_as_dense)
        self._process_set = process_set if process_set is not None else ops.global_process_set
        self._set_id = ops._set_id(self._process_set)
        if op == ops.Adasum:
            raise NotImplementedError("DistributedOptimizer(op=Adasum) is not supported by "
                                      "perseus.torch (Average and Sum are)")
        if op not in (ops.Average, ops.Sum):
            raise ValueError("DistributedOptimizer: op must be Average or Sum")
        if gradient_predivide_factor != 1.0 and op != ops.Average:
            raise ValueError("gradient_predivide_factor needs op == Average")
        self._op = op
        self._prescale = 1.0 / gradient_predivide_factor if op == ops.Average else 1.0
        self._postscale = gradient_predivide_factor if op == ops.Average else 1.0

        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(n, tuple) for n in named):
                raise ValueError("named_parameters must be (name, parameter) pairs, such as "
                                 "model.named_parameters()")
            _check_unique([n for n, _ in named])
            self._names = {p: n for n, p in named}
            unnamed = [p for p in all_params if p not in self._names]
            if unnamed:
                raise ValueError("named_parameters lacks %d of the optimizer's parameters"
                                 % len(unnamed))
        else:  # Horovod's names, the same on every rank
            self._names = {p: "allreduce.noname.%d.%d" % (i, j)
                           for i, g in enumerate(self.param_groups)
                           for j, p in enumerate(g["params"])}

        # The name of each parameter's all-reduce, made once.
        self._allreduce_names = {p: "allreduce." + n for p, n in self._names.items()}
        self.backward_passes_per_step = backward_passes_per_step
        self._requires_update = [p for p in all_params if p.requires_grad]
        # Backward passes left before a parameter's gradient is submitted, by id(parameter): a
        # tensor's own __hash__ is Python code, and the hooks look this up 200 times a step of
        # a 200-parameter model (0.3 ms of a 4 ms step on the development VM).
        self._delay = {id(p): backward_passes_per_step for p in self._requires_update}
        self._handles = {}  # parameter -> (Handle, compression context) or None (in a group)
        self._synchronized = False
        self._should_synchronize = True
        self._groups = self._make_groups(groups)
        self._group_of = {p: i for i, g in enumerate(self._groups) for p in g}
        self._group_ready = [set() for _ in self._groups]
        self._grad_accs = []
        # As Horovod: on a rank outside process_set this is the plain optimizer (no hooks, no
        # all-reduce); in a job of one rank there are no hooks either, and synchronize() leaves
        # the gradients as they are (see _synchronize_alone).
        self._member = self._process_set.included()
        # (An elastic job keeps its hooks: its world may grow.)
        self._alone = self._member and ops.size() == 1 and not _native.elastic()
        # Gradient buckets (see _buckets.py), where no explicit groups are given (one rank
        # uses them too where synchronize() all-reduces after all: the NaN check).
        self._buckets = []
        if self._member and not self._groups:
            cap = _grad.bucket_bytes()
            if cap > 0:
                self._buckets = _buckets.plan(self._requires_update, cap,
                                              self._allreduce_names)
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        # The parameters outside every bucket, which synchronize() submits one by one.
        self._unbucketed = [p for p in self._requires_update if p not in self._bucket_of]
        if self._member and not self._alone:
            self._register_hooks()

    @property
    def _parameter_names(self):
        """{parameter: name}, as Horovod's DistributedOptimizer keeps it."""
        return self._names

    def _make_groups(self, groups):
        if groups is None:
            return []
        if isinstance(groups, int):
            if groups <= 0:
                return []
            params = self._requires_update
            per = -(-len(params) // groups)
            return [params[i:i + per] for i in range(0, len(params), per)]
        result = []
        for g in groups:
            members = [p for p in g if p.requires_grad]
            if any(id(p) not in self._delay for p in members):
                raise ValueError("groups names a parameter the optimizer does not have")
            result.append(members)
        return result

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        self._delay.update(dict.fromkeys(self._delay, passes))

    def _register_hooks(self):
        # The bucket of the first-registered parameters is all-reduced from synchronize(): its
        # gradients come last in the backward pass, so a hook would submit it only at the end
        # of backward anyway, and each hook costs a call from the autograd engine into Python
        # (about 1.1-1.4 us, 0.3 ms for 200 parameters on the GPU machine's host). Its
        # parameters get no hook; for a model whose gradients fit one bucket, none does.
        for p in self._requires_update:
            bucket = self._bucket_of.get(p)
            if bucket is not None and bucket.last:
                continue
            tmp = p.expand_as(p)
            acc = tmp.grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._grad_accs.append(acc)

    def _make_hook(self, p):
        key, bucket, delay = id(p), self._bucket_of.get(p), self._delay

        def hook(*ignore):
            left = delay[key]
            if left <= 0 and (bucket is not None or self._handles.get(p) is not None):
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "step(): call optimizer.step() or optimizer.synchronize() between backward "
                    "passes, or raise backward_passes_per_step")
            delay[key] = left - 1
            if left == 1:
                if bucket is None:
                    self._submit(p)
                else:
                    self._bucket_ready(bucket)
        return hook

    def _bucket_ready(self, bucket):
        """One more of the bucket's gradients is ready: the last submits the bucket."""
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._submit_bucket(bucket)

    def _submit(self, p):
        """A gradient outside every bucket is ready (alone, or with its group)."""
        group = self._group_of.get(p)
        if group is None:
            self._handles[p] = self._allreduce_async(p)
            return
        self._handles[p] = None
        ready = self._group_ready[group]
        ready.add(p)
        if len(ready) == len(self._groups[group]):
            for q in self._groups[group]:
                self._handles[q] = self._allreduce_async(q)
            ready.clear()

    def _allreduce_async(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        # The argument, else PERSEUS_ALLREDUCE_DTYPE (float32 gradients as float16/bfloat16).
        compression = self._compression or compression_from_env()
        grad = p.grad
        if grad.is_sparse:
            if not self._sparse_as_dense:
                # As Horovod: the indices and values all-gathered; the handle is a callable.
                return ops.sparse_allreduce_async(grad, self._allreduce_names[p],
                                                  self._op, self._process_set), None, None, None
            grad = grad.to_dense()
        tensor, ctx = compression.compress(grad)
        if tensor is not p.grad:
            tensor = tensor.contiguous()
        check = _grad.nancheck()
        label = None
        if check:  # what the NaN check's error calls it
            label = "parameter '%s'" % self._names[p]
            if tensor.dtype != p.grad.dtype:
                label += " (sent as %s)" % str(tensor.dtype).replace("torch.", "")
        handle = ops._allreduce_async(tensor, tensor, self._allreduce_names[p], self._op,
                                      self._prescale, self._postscale, label=label, check=check,
                                      set_id=self._set_id)
        return handle, compression, ctx, tensor

    def _submit_bucket(self, bucket):
        """One all-reduce of the bucket's gradients as one flat tensor (zeros for a parameter
        without a gradient, as Horovod all-reduces them). Where that would differ from one
        all-reduce per parameter (a compressor that is not a cast, the NaN check, whose error
        names the parameter), the bucket's parameters are all-reduced one by one instead;
        sparse gradients always are."""
        bucket.ready = 0
        compression = self._compression or compression_from_env()
        if not _buckets.elementwise(compression) or _grad.nancheck():
            for p in bucket.params:
                self._handles[p] = self._allreduce_async(p)
            bucket.pending = ()  # submitted, one all-reduce a parameter (in self._handles)
            return
        grads, pieces = [], []
        for p in bucket.params:
            grad = p.grad
            if grad is None:
                grad = p.grad = torch.zeros_like(p)
            if grad.is_sparse:
                self._handles[p] = self._allreduce_async(p)
                grads.append(None)
                pieces.append(torch.zeros_like(p))
            else:
                grads.append(grad)
                pieces.append(grad)
        tensor, ctx = compression.compress(bucket.flatten(pieces))
        handle = ops._allreduce_async(tensor, tensor, bucket.name, self._op, self._prescale,
                                      self._postscale, check=False, set_id=self._set_id)
        bucket.pending = (handle, compression, ctx, grads)

    def _wait_bucket(self, bucket):
        handle, compression, ctx, grads = bucket.pending
        bucket.pending = None
        self._delay.update(dict.fromkeys(map(id, bucket.params), self.backward_passes_per_step))
        output = ops.synchronize(handle)
        bucket.scatter(compression.decompress(output, ctx), grads)

    def _forget_pending(self):
        """Drops the all-reduces in flight and the counts of a step that a failed world cut
        short (hvd.elastic: the step is done again from the last commit)."""
        self._handles.clear()
        for bucket in self._buckets:
            bucket.pending, bucket.ready = None, 0
        for g in self._group_ready:
            g.clear()
        self._delay.update(dict.fromkeys(self._delay, self.backward_passes_per_step))
        self._synchronized = False

    def synchronize(self):
        """Waits for every gradient's all-reduce (submitting those whose hook did not run, e.g.
        of parameters that took no part in the loss) and writes the results into .grad."""
        if not self._member or (self._alone and self._synchronize_alone()):
            self._synchronized = True
            return
        for bucket in self._buckets:
            if bucket.pending is None:
                self._submit_bucket(bucket)
        missing = [p for p in self._unbucketed if self._handles.get(p) is None]
        for p in missing:
            self._handles[p] = self._allreduce_async(p)
        for g in self._group_ready:
            g.clear()
        nonfinite = []
        try:
            for bucket in self._buckets:
                if bucket.pending:
                    self._wait_bucket(bucket)
            for p, (handle, compression, ctx, tensor) in self._handles.items():
                self._delay[id(p)] = self.backward_passes_per_step
                try:
                    output = handle() if callable(handle) else ops.synchronize(handle)
                except ops.NonFiniteError as e:  # every all-reduce is waited for first
                    nonfinite.append(e)
                    continue
                result = output if compression is None else compression.decompress(output, ctx)
                if p.grad.is_sparse:
                    # Sparse tensors have no copy_: as Horovod, zero and add (sparse again
                    # after a dense all-reduce, sparse_as_dense).
                    p.grad.zero_().add_(result if result.is_sparse else result.to_sparse())
                elif result is not p.grad:
                    p.grad.copy_(result)
        finally:
            self._handles.clear()
            for bucket in self._buckets:
                bucket.pending, bucket.ready = None, 0
        if nonfinite:
            first = nonfinite[0]
            names = [e.tensor for e in nonfinite]
            message = str(first)
            if len(nonfinite) > 1:
                message += "; also in %s" % ", ".join(names[1:])
            raise ops.NonFiniteError(message, ", ".join(names),
                                     any(e.input_nonfinite for e in nonfinite))
        self._synchronized = True

    def _synchronize_alone(self):
        """One rank, as Horovod's: its gradients are already the job's, so there is nothing to
        do. Horovod registers no hooks in a job of one rank, and its synchronize() then submits
        nothing: no compression's round trip, no scaling factors, and a parameter that got no
        gradient keeps None (the optimizer skips it). False (the caller all-reduces as usual)
        only where Perseus's NaN check (PERSEUS_ALLREDUCE_NANCHECK) was asked for, which the
        all-reduce does."""
        return not _grad.nancheck()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For a step() right after an explicit synchronize() (gradient clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are all-reduced "
                              "twice")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles or any(b.ready or b.pending for b in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=ops.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=ops.global_process_set):
    """Wraps a torch optimizer so that step() uses the gradients averaged (op=Average) or summed
    over every rank. Like Horovod's, it rebuilds the optimizer from its param_groups (its
    state, if any, is not carried over: wrap before loading a checkpoint).

    compression: Compression.none, .fp16 or .bf16; when not given, PERSEUS_ALLREDUCE_DTYPE
    (fp16 or bf16) casts float32 gradients, else none. With PERSEUS_ALLREDUCE_NANCHECK=1, step()
    and synchronize() raise perseus.NonFiniteError naming the parameters whose averaged gradient
    holds a NaN or Inf."""
    ops._set_id(process_set)
    if num_groups and groups is None:
        groups = num_groups
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    # The optimizer's own __init__, given its param_groups (each group carries every
    # hyper-parameter, so the constructor's defaults do not matter).
    wrapped = cls(optimizer.param_groups)
    wrapped._perseus_setup(named_parameters, compression, backward_passes_per_step, op,
                           gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
