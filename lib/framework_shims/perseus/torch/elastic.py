"""Horovod's elastic API for perseus.torch: `hvd.elastic.run`, `TorchState`, `ObjectState`,
`ElasticSampler`, as `horovod.torch.elastic` defines them.

Under perseusrun's elastic mode (--host-discovery-script), every process has an id for the whole
job, and each hvd.init() joins the job's latest world, which perseusrun publishes
(lib/rendezvous/job_contract.h, "Elastic jobs"). `run` tells perseusrun that this process can
join a new world in place; then, when a rank fails or a host is lost, perseusrun ends the world
and makes the next of the survivors and of new processes in the free slots, and here:

- the survivors' pending and later operations fail with HorovodInternalError; `run` restores the
  state to its last commit, leaves the old world (hvd.shutdown()) and joins the new one
  (hvd.init()) in this process, calls the reset callbacks, syncs the state from the new rank 0
  (always a survivor: perseusrun keeps the survivors' order) and calls the function again;
- when hosts are added, the world goes on until the next `state.commit()` (or
  `state.check_host_updates()`), where every rank raises HostsUpdatedInterrupt at the same step
  (rank 0's view is broadcast), and all join the larger world without a rollback.

Outside an elastic job (a plain perseusrun job) `run` just calls the function, after a sync.
"""
import copy
import functools
import math
import random
import time

import torch

from perseus import _native
from perseus._native import HorovodInternalError, PerseusError
from perseus.torch import ops
from perseus.torch.functions import broadcast_optimizer_state, broadcast_parameters


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() / check_host_updates() on every rank at the same step when
    perseusrun has found the discovered hosts changed. skip_sync: only hosts were removed, so
    the state need not be synced again (as Horovod's)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts changed: joining the new world")
        self.skip_sync = skip_sync


class State:
    """What a training process keeps across worlds; subclasses say how to save, restore and
    sync it. `bcast_object(obj)` sends rank 0's object to every rank."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._known_updates = _hosts_updated()

    def register_reset_callbacks(self, callbacks):
        """Functions called after each change of world (e.g. to scale the learning rate by the
        new hvd.size())."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._known_updates = _hosts_updated()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (what a failure rolls back to), then check_host_updates()."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank at once when perseusrun has made a new world
        with more hosts since this process joined its own (rank 0's view decides)."""
        now = _hosts_updated()
        known, now = self._bcast_object((self._known_updates, now))
        if now > known:
            self._known_updates = now
            raise HostsUpdatedInterrupt(False)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Called after each change of world, before the sync."""


class ObjectState(State):
    """State of plain Python objects given as keyword arguments (attributes of the state):
    saved as copies, synced from rank 0 with broadcast_object."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        bcast_object = bcast_object or _broadcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank or ops.rank)

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            object.__setattr__(self, name, copy.deepcopy(value))


class _Handler:
    """Save, restore and sync of one kind of value of a TorchState."""

    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value):
        self.value = value
        self.save()


class _ModelHandler(_Handler):
    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        forget = getattr(self.value, "_forget_pending", None)
        if forget:  # a DistributedOptimizer: the cut-short step's all-reduces are gone
            forget()
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

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


def _broadcast_object(obj):
    return ops.broadcast_object(obj, root_rank=0, name="perseus.elastic.state")


def _hosts_updated():
    return _native.elastic_hosts_updated() if _native.elastic() else 0


def _declare():
    if _native.elastic():
        _native.elastic_declare()


# How long a process keeps trying to join the next world when a join fails because that world
# broke too (another failure while joining).
_JOIN_ATTEMPTS = 20


def _reset():
    """Leaves the world and joins the next one, in this process."""
    for attempt in range(_JOIN_ATTEMPTS):
        ops.shutdown()
        try:
            ops.init()
            _declare()
            return
        except PerseusError:
            if attempt + 1 == _JOIN_ATTEMPTS:
                raise
            time.sleep(0.1)


def run(func):
    """Decorator for the training function `func(state, ...)`: runs it until it returns, through
    changes of world (see the module's doc). Collective operations must happen inside `func`,
    after the state's sync, never before."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        _declare()
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            _reset()
            state.on_reset()

    return wrapper


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError"]
