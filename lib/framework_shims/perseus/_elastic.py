"""The framework-neutral part of Horovod's elastic API (State, ObjectState, run,
HostsUpdatedInterrupt), over a shim's broadcast_object, rank, init and shutdown:
perseus.torch.elastic and perseus.mxnet.elastic build on it.

Under perseusrun's elastic mode (--host-discovery-script), every process has an id for the whole
job, and each init() joins the job's latest world, which perseusrun publishes
(lib/rendezvous/job_contract.h, "Elastic jobs"). `run` tells perseusrun that this process can
join a new world in place; then, when a rank fails or a host is lost, perseusrun ends the world
and makes the next of the survivors and of new processes in the free slots, and here:

- the survivors' pending and later operations fail with HorovodInternalError; `run` restores the
  state to its last commit, leaves the old world (shutdown()) and joins the new one (init()) in
  this process, calls the reset callbacks, syncs the state from the new rank 0 (always a
  survivor: perseusrun keeps the survivors' order) and calls the function again;
- when hosts are added, the world goes on until the next `state.commit()` (or
  `state.check_host_updates()`), where every rank raises HostsUpdatedInterrupt at the same step
  (rank 0's view is broadcast), and all join the larger world without a rollback.

Outside an elastic job (a plain perseusrun job) `run` just calls the function, after a sync.
"""
import copy
import functools
import time

from perseus import _native
from perseus._native import HorovodInternalError, PerseusError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() / check_host_updates() on every rank at the same step when
    perseusrun has found the discovered hosts changed. skip_sync: only hosts were removed, so
    the state need not be synced again (as Horovod's)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts changed: joining the new world")
        self.skip_sync = skip_sync


def hosts_updated():
    """How many times perseusrun has grown the job's hosts (0 outside elastic mode)."""
    return _native.elastic_hosts_updated() if _native.elastic() else 0


def declare():
    """Tells perseusrun this process joins new worlds in place (nothing outside elastic mode)."""
    if _native.elastic():
        _native.elastic_declare()


class State:
    """What a training process keeps across worlds; subclasses say how to save, restore and
    sync it. `bcast_object(obj)` sends rank 0's object to every rank."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._known_updates = hosts_updated()

    def register_reset_callbacks(self, callbacks):
        """Functions called after each change of world (e.g. to scale the learning rate by the
        new size())."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._known_updates = hosts_updated()
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
        now = hosts_updated()
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
    saved as copies, synced from rank 0 with bcast_object."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

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


# How many times a process tries to join the next world when joining fails because that world
# broke too (another failure while joining).
_JOIN_ATTEMPTS = 20


def for_shim(ops):
    """(run, ObjectState, broadcast_object) of the shim whose ops module `ops` is (its init,
    shutdown, rank and broadcast_object)."""

    def broadcast_object(obj):
        return ops.broadcast_object(obj, root_rank=0, name="perseus.elastic.state")

    class ShimObjectState(ObjectState):
        __doc__ = ObjectState.__doc__

        def __init__(self, bcast_object=None, get_rank=None, **kwargs):
            super().__init__(bcast_object or broadcast_object, get_rank or ops.rank, **kwargs)

    ShimObjectState.__name__ = ShimObjectState.__qualname__ = "ObjectState"
    return make_run(ops.init, ops.shutdown), ShimObjectState, broadcast_object


def make_run(init, shutdown):
    """Horovod's elastic `run` decorator for a shim whose init() and shutdown() these are."""

    def reset():
        for attempt in range(_JOIN_ATTEMPTS):
            shutdown()
            try:
                init()
                declare()
                return
            except PerseusError:
                if attempt + 1 == _JOIN_ATTEMPTS:
                    raise
                time.sleep(0.1)

    def run(func):
        """Decorator for the training function `func(state, ...)`: runs it until it returns,
        through changes of world. Collective operations must happen inside `func`, after the
        state's sync, never before."""

        @functools.wraps(func)
        def wrapper(state, *args, **kwargs):
            declare()
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
                reset()
                state.on_reset()

        return wrapper

    return run
