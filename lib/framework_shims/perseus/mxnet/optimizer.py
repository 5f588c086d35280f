"""Horovod's MXNet optimizer wrappers over perseus.mxnet's collectives: DistributedOptimizer
(for Module or a gluon.Trainer) and DistributedTrainer (a gluon.Trainer)."""
import warnings

import mxnet as mx

from perseus.mxnet import ops
from perseus.mxnet.compression import Compression


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an MXNet optimizer: update()/update_multi_precision() first sum the gradient over
    every rank; the wrapped optimizer's rescale_grad is divided by the number of ranks, so the
    step uses the average (Horovod's arithmetic). For Module.fit with kvstore=None or for a
    gluon.Trainer(..., kvstore=None); DistributedTrainer is the Gluon way."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=ops.global_process_set):
        # As Horovod: the gradients are summed within process_set (every rank by default) and
        # rescale_grad divided by its size; on a rank outside the set, update() is the wrapped
        # optimizer's own (with the same rescale_grad).
        self._process_set = ops._of(process_set)
        ops._set_id(self._process_set)
        self._optimizer = optimizer
        self._optimizer.rescale_grad *= (gradient_predivide_factor / self._process_set.size())
        self._gradient_predivide_factor = gradient_predivide_factor

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    # gluon.Trainer sets rescale_grad on the optimizer it holds: pass it to the wrapped one.
    @property
    def rescale_grad(self):
        return self._optimizer.rescale_grad

    @rescale_grad.setter
    def rescale_grad(self, value):
        self._optimizer.rescale_grad = value

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def _do_allreduce(self, index, grad):
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        pre = 1.0 / self._gradient_predivide_factor
        if isinstance(index, (tuple, list)):
            ops.grouped_allreduce_(grad, average=False, prescale_factor=pre,
                                   names=["DistributedOptimizer.%s" % i for i in index],
                                   process_set=self._process_set)
        else:
            ops.allreduce_(grad, average=False, name="DistributedOptimizer.%s" % index,
                           prescale_factor=pre, process_set=self._process_set)

    def update(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon.Trainer whose gradients are averaged over every rank (of process_set) before
    each update (summed by libperseus, and the trainer's scale divided by the number of ranks,
    as Horovod does).
    The learning rate is the user's: scale it by hvd.size() if the global batch grows.
    compression: Compression.none (default) or Compression.fp16.
    Parameters are taken in sorted-name order, so every rank must build the same model."""

    def __init__(self, params, optimizer, optimizer_params=None, compression=None,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0,
                 process_set=ops.global_process_set, **kwargs):
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer; the wrapped optimizer is used instead")
        if isinstance(params, (dict, mx.gluon.ParameterDict)):
            params = [params[key] for key in sorted(params.keys(), key=str)]
        kwargs.pop("kvstore", None)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None,
                         **kwargs)
        # As Horovod: averaged within process_set; outside it, the rank's own gradients.
        self._process_set = ops._of(process_set)
        ops._set_id(self._process_set)
        self._gradient_predivide_factor = gradient_predivide_factor
        self._prefix = prefix if prefix else ""
        self._compression = compression if compression is not None else Compression.none

    # gluon.Trainer's scale of the gradients, divided by the set's size as it is now (an elastic
    # job's world changes size) and times gradient_predivide_factor. Trainer.__init__ sets it.
    @property
    def _scale(self):
        base = self.__dict__.get("_base_scale", 1.0)
        process_set = self.__dict__.get("_process_set")
        if process_set is None:
            return base
        return base * self._gradient_predivide_factor / process_set.size()

    @_scale.setter
    def _scale(self, value):
        self.__dict__["_base_scale"] = value

    def _allreduce_grads(self):
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        grads, names = [], []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                for j, g in enumerate(param.list_grad()):
                    grads.append(g)
                    names.append("DistributedTrainer.%s%d.%d" % (self._prefix, i, j))
        pre = 1.0 / self._gradient_predivide_factor
        if self._compression is Compression.none:
            ops.grouped_allreduce_(grads, average=False, names=names, prescale_factor=pre,
                                   process_set=self._process_set)
            return
        compressed = [self._compression.compress(g) for g in grads]
        ops.grouped_allreduce_([c for c, _ in compressed], average=False, names=names,
                               prescale_factor=pre, process_set=self._process_set)
        for g, (c, ctx) in zip(grads, compressed):
            self._compression.decompress(c, ctx).copyto(g)
