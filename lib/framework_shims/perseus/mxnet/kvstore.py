"""The Perseus KVStore: MXNet's KVStore interface over libperseus's all-reduce.

    kv = perseus.mxnet.create('dist_sync_perseus')    # other names: mx.kvstore.create(name)
    module.fit(train_iter, kvstore=kv, ...)            # as with 'dist_sync'

There are no servers: every rank holds the store's values itself, and push all-reduces.

- init(key, value, param_only=False): stores rank 0's value under key (every rank makes the
  call). param_only=True also writes rank 0's value into `value`: the parameter is synchronised.
- push(key, value, op=PerseusOp.Sum): the values pushed for one key (an NDArray, or a list of
  NDArrays, one per device, added up first) are reduced over every rank with op. Without an
  optimizer the result becomes the key's value; with one (set_optimizer) it is the gradient the
  optimizer applies to the key's value, the weight, as 'dist_sync' does on its servers.
- pull(key, out): out (an NDArray or a list) = the key's value.
- pushpull(key, value, out=None, op=...): push then pull into out (or value).
- broadcast(key, value, out): rank 0's value, stored and written to out (Module and
  gluon.Trainer use it to initialise the parameters).
Keys are ints or strs, single or lists (with a list of values); every rank must make the same
calls in the same order.

The object is an mx.kvstore.KVStoreBase, which Module.fit and gluon.Trainer accept as their
kvstore. Its type, 'dist_sync_perseus', contains "dist" and "_sync", so Module divides the
gradients by batch_size * num_workers (the pushed values are summed, as with dist_sync), and
is_capable('optimizer') is True, so Module keeps the weights "on the kvstore": here, one copy per
rank, updated identically on every rank.
"""
import enum

import mxnet as mx
from mxnet.kvstore import KVStoreBase

from perseus import _native
from perseus.mxnet import ops


class PerseusOp(enum.IntEnum):
    """The reductions of KVStore.push/pushpull (values are libperseus's perseus_op_t)."""
    Sum = _native.SUM
    Average = _native.AVERAGE
    Min = _native.MIN
    Max = _native.MAX
    Product = _native.PRODUCT


_TO_HOROVOD = {PerseusOp.Sum: ops.Sum, PerseusOp.Average: ops.Average, PerseusOp.Min: ops.Min,
               PerseusOp.Max: ops.Max, PerseusOp.Product: ops.Product}

PERSEUS_KVSTORE_TYPES = ("dist_sync_perseus", "perseus")


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _pairs(key, value, what):
    """[(key, [NDArray, ...])] for a key or a list of keys and their values."""
    if isinstance(key, (list, tuple)):
        keys = list(key)
        values = _as_list(value)
        if len(values) != len(keys):
            raise ValueError("%s: %d keys but %d values" % (what, len(keys), len(values)))
        pairs = [(k, _as_list(v)) for k, v in zip(keys, values)]
    else:
        pairs = [(key, _as_list(value))]
    for k, vs in pairs:
        if not isinstance(k, (int, str)):
            raise TypeError("%s: keys are ints or strs, not %s" % (what, type(k).__name__))
        for v in vs:
            if not isinstance(v, mx.nd.NDArray):
                raise TypeError("%s: the value of key %r is a %s, not an NDArray"
                                % (what, k, type(v).__name__))
    return pairs


def _key_name(operation, key):
    return "kvstore.%s.%s:%s" % (operation, type(key).__name__, key)


class PerseusKVStore(KVStoreBase):
    """See the module's documentation. Created by perseus.mxnet.create('dist_sync_perseus');
    creating it joins the job (perseus.mxnet.init) if that has not been done."""

    def __init__(self, name="dist_sync_perseus"):
        if not ops.is_initialized():
            ops.init()
        self._type = name
        self._store = {}
        self._optimizer = None
        self._updater = None
        self._compression_params = None

    # ---- where this rank is --------------------------------------------------------------
    @property
    def type(self):
        return self._type

    @property
    def rank(self):
        return ops.rank()

    @property
    def num_workers(self):
        return ops.size()

    @property
    def local_rank(self):
        return ops.local_rank()

    @property
    def local_size(self):
        return ops.local_size()

    def barrier(self):
        """Returns once every rank has called it (MXNet's KVStore._barrier)."""
        ops.barrier()

    _barrier = barrier

    @staticmethod
    def is_capable(capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise ValueError("Unknown capability: {}".format(capability))

    # ---- values --------------------------------------------------------------------------
    def init(self, key, value, param_only=False):
        pairs = _pairs(key, value, "init")
        for k, _ in pairs:
            if k in self._store:
                raise ValueError("init: key %r is already initialised" % (k,))
        self._broadcast_into_store(pairs, "init", write_back=param_only)

    def broadcast(self, key, value, out, priority=0):
        pairs = _pairs(key, value, "broadcast")
        self._broadcast_into_store(pairs, "broadcast", write_back=False)
        self.pull(key, out)

    def _broadcast_into_store(self, pairs, operation, write_back):
        copies = [vs[0].copy() for _, vs in pairs]
        ops.grouped_broadcast_(copies, 0, [_key_name(operation, k) for k, _ in pairs])
        for (k, vs), c in zip(pairs, copies):
            self._store[k] = c
            if write_back:
                for v in vs:
                    v[:] = c

    def push(self, key, value, priority=0, op=PerseusOp.Sum):
        pairs = _pairs(key, value, "push")
        op = _TO_HOROVOD[PerseusOp(op)]
        local = []
        for k, vs in pairs:
            total = vs[0].copy()
            for v in vs[1:]:
                total += v.as_in_context(total.context)
            local.append(total)
        ops.grouped_allreduce_(local, op=op, names=[_key_name("push", k) for k, _ in pairs])
        for (k, _), reduced in zip(pairs, local):
            if self._updater is not None and k in self._store:
                self._updater(k, reduced, self._store[k])
            else:
                self._store[k] = reduced

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        if out is None:
            raise ValueError("pull: out is required")
        for k, outs in _pairs(key, out, "pull"):
            if k not in self._store:
                raise KeyError("pull: key %r was neither initialised nor pushed" % (k,))
            for o in outs:
                self._store[k].copyto(o)

    def pushpull(self, key, value, out=None, priority=0, op=PerseusOp.Sum):
        self.push(key, value, priority=priority, op=op)
        self.pull(key, value if out is None else out, priority=priority)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        raise NotImplementedError("the Perseus KVStore has no sparse support (row_sparse_pull)")

    # ---- the optimizer -------------------------------------------------------------------
    def set_optimizer(self, optimizer):
        """From now on, push applies optimizer to the stored weight with the reduced gradient
        (the same on every rank), and pull returns the weight."""
        self._optimizer = optimizer
        self._updater = mx.optimizer.get_updater(optimizer)

    def set_gradient_compression(self, compression_params):
        """Accepted for compatibility and ignored: gradients travel uncompressed."""
        if compression_params is not None and not isinstance(compression_params, dict):
            raise TypeError("compression_params must be a dict")
        self._compression_params = compression_params

    def save_optimizer_states(self, fname, dump_optimizer=False):
        if self._updater is None:
            raise RuntimeError("save_optimizer_states: no optimizer was set")
        with open(fname, "wb") as f:
            f.write(self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname):
        if self._updater is None:
            raise RuntimeError("load_optimizer_states: no optimizer was set")
        with open(fname, "rb") as f:
            self._updater.set_states(f.read())

    def __repr__(self):
        return "PerseusKVStore(type=%r, rank=%d, num_workers=%d)" % (self._type, self.rank,
                                                                     self.num_workers)


PerseusKVStore.PerseusOp = PerseusOp  # kv.PerseusOp.Max, next to the store as the seed has it


def _register_with_mxnet():
    """Makes mx.kvstore.create(name) (and so Module.fit(kvstore=name), gluon.Trainer(...,
    kvstore=name) and an unpatched fit.py's --kv-store name) give a PerseusKVStore for each of
    PERSEUS_KVSTORE_TYPES: MXNet's registry maps a class's lower-cased name to the class, which
    create() calls with no arguments, so each name gets a subclass of that name."""
    for name in PERSEUS_KVSTORE_TYPES:
        if name in KVStoreBase.kv_registry:
            continue
        klass = type(name, (PerseusKVStore,), {
            "__init__": lambda self, _name=name: PerseusKVStore.__init__(self, _name),
            "__doc__": "PerseusKVStore('%s'), as mx.kvstore.create('%s') makes it." % (name,
                                                                                       name),
        })
        KVStoreBase.register(klass)


_register_with_mxnet()


def create(name="local"):
    """perseus.mxnet.create('dist_sync_perseus') -> a PerseusKVStore (joining the job); any
    other name -> mx.kvstore.create(name)."""
    if not isinstance(name, str):
        raise TypeError("name must be a string")
    if name.lower() in PERSEUS_KVSTORE_TYPES:
        return PerseusKVStore(name.lower())
    return mx.kvstore.create(name)

