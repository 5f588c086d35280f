"""Horovod's elastic API for perseus.torch (`hvd.elastic`): `run`, `State`, `ObjectState`,
`TorchState`, `ElasticSampler`, `HostsUpdatedInterrupt`, as `horovod.torch.elastic` defines them.
How a change of world goes: perseus/_elastic.py and docs/USAGE.md, "Elastic jobs".
"""
import copy
import math
import random

import torch

from perseus import _elastic
from perseus._elastic import HostsUpdatedInterrupt, State  # noqa: F401 - Horovod's names
from perseus._native import HorovodInternalError  # noqa: F401
from perseus.torch import ops
from perseus.torch.functions import broadcast_optimizer_state, broadcast_parameters


run, ObjectState, _broadcast_object = _elastic.for_shim(ops)


class _Handler:
    """Save, restore and sync of one kind of value of a TorchState."""

    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value):
        self.value = value
        self.save()


class _StateDictHandler(_Handler):
    """A value kept through its state_dict(): a copy at each commit, loaded back on restore."""

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class _ModelHandler(_StateDictHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_StateDictHandler):
    def restore(self):
        forget = getattr(self.value, "_forget_pending", None)
        if forget:  # a DistributedOptimizer: the cut-short step's all-reduces are gone
            forget()
        super().restore()

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_StateDictHandler):
    def sync(self):
        self.value.load_state_dict(_broadcast_object(self.value.state_dict()))


def _handler_for(value):
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training process: models, optimizers and ElasticSamplers (given as
    keyword arguments; `model` and `optimizer` by name) through their state_dict, saved in host
    memory at each commit and broadcast from rank 0 at each sync; any other keyword argument as
    an ObjectState attribute."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value) if value is not None else None
            if handler is not None:
                handlers[name] = handler
            else:
                plain[name] = value
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=_broadcast_object, get_rank=ops.rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset among the ranks as DistributedSampler does, and after a change of world
    splits what the epoch has not processed yet among the new ranks. Call record_batch(i, n)
    after each batch and set_epoch(e) at the end of each epoch; keep it in the TorchState."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts a batch of batch_size samples on every rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        self.num_replicas = ops.size()
        self.rank = ops.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        indices += indices[:self.total_size - len(indices)]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError"]
