"""PerseusSyncBatchNorm: batch normalisation whose batch statistics are those of several ranks'
batches together, without patching or recompiling MXNet.

One MXNet custom operator ('perseus_sync_batch_norm', registered on import) does the work, so
the layer is hybridizable and has a symbol form, both where the seed's scripts look for them:

    mx.gluon.contrib.nn.PerseusSyncBatchNorm(comm_scope=0)      # a Gluon HybridBlock
    mx.sym.contrib.PerseusSyncBatchNorm(data, name='bn1', ...)  # Module / symbol code

In training each rank computes per channel (count, sum, sum of squares) of its batch, and these
are summed (one all-reduce) over its group: every rank (comm_scope=1) or the ranks of its host
(comm_scope=0, the seed's default: a libperseus process set of that host's ranks; the other
ranks take no part). Mean and (biased) variance follow; the running statistics move towards them
with `momentum`, as BatchNorm's do. The backward all-reduces (count, sum of dy, sum of dy * x^)
over the same group, so the input gradients are those of the loss summed over the group's ranks
(what one process computes on their combined batch); gamma's and beta's gradients are this
rank's share (the trainer's all-reduce adds them up, as for any parameter). Outside training, or
with use_global_stats, it is BatchNorm with the running statistics, with no collective.

Every rank must run the same layers in the same order: each layer's collectives are named by its
key (the Gluon block's name, or the symbol's) and a count of its training passes.

Hosts are told apart by the places libperseus gave the ranks (local rank, local size and cross
rank, all-gathered once; perseus._native.hosts_of_ranks), so the grouping is the launcher's:
perseusrun's node numbers, or under mpirun the host names and machines libperseus compared. The
environment is not read: under Open MPI, OMPI_COMM_WORLD_NODE_RANK is the rank within the node.
The hosts' process sets are made once per process, at the first training pass of a comm_scope=0
layer: that is collective over every rank (every rank makes every host's set, in increasing host
order), so every rank must run its first comm_scope=0 training step (all ranks use the same
model, as in data-parallel training).
"""
import threading

import numpy as np

import mxnet as mx
from mxnet.gluon import nn

from perseus import _native
from perseus.mxnet import ops

_node_ranks = None
_host_set = None
_lock = threading.Lock()  # MXNet may run two layers' operators on two of its threads


def node_ranks():
    """Every rank's host number, from every rank's (local_rank, local_size, cross_rank) as
    libperseus computed them; all-gathered once per process (collective over every rank)."""
    global _node_ranks
    with _lock:
        if _node_ranks is None:
            mine = np.array([[ops.local_rank(), ops.local_size(), ops.cross_rank()]],
                            dtype=np.int64)
            out, _ = ops.allgather_host(mine, "PerseusSyncBatchNorm.places")
            _node_ranks = _native.hosts_of_ranks([tuple(int(v) for v in row) for row in out])
        return _node_ranks


def host_process_set():
    """(process set number, ranks) of this rank's host. The first call makes every host's set:
    collective over every rank (see the module's docstring)."""
    global _host_set
    nodes = node_ranks()
    with _lock:
        if _host_set is None:
            sets = _native.host_process_sets(nodes)
            _host_set = sets[nodes[ops.rank()]]
        return _host_set


def _group_sum(values, comm_scope, name):
    """The sum of a float64 vector over this rank's group (see the module's docstring)."""
    host = np.ascontiguousarray(values, dtype=np.float64)
    process_set = host_process_set()[0] if comm_scope == 0 else _native.GLOBAL_PROCESS_SET
    what = "PerseusSyncBatchNorm all-reduce '%s'" % name
    request = _native.allreduce_async(host.ctypes.data, host.ctypes.data, host.size,
                                      _native.dtype_code("float64"), _native.SUM, name=name,
                                      what=what, keep=(host,), process_set=process_set)
    ops._finish([request])
    return host


_passes = {}  # (key, "fwd" or "bwd") -> training passes so far: the collectives' names


def _next_name(key, direction):
    with _lock:
        n = _passes.get((key, direction), 0) + 1
        _passes[(key, direction)] = n
    return "PerseusSyncBatchNorm.%s.%d.%s" % (key, n, direction)


def _flag(value):
    return value if isinstance(value, bool) else str(value).lower() in ("true", "1")


OP_TYPE = "perseus_sync_batch_norm"


class _SyncBatchNorm(mx.operator.CustomOp):
    """Inputs data, gamma, beta; auxiliary states moving_mean, moving_var; outputs the
    normalised data, the batch mean and 1/sqrt(var + eps) (kept for the backward)."""

    def __init__(self, eps, momentum, fix_gamma, use_global_stats, comm_scope, key):
        super().__init__()
        self._eps, self._momentum = eps, momentum
        self._fix_gamma, self._global = fix_gamma, use_global_stats
        self._scope, self._key = comm_scope, key

    @staticmethod
    def _axes(x):
        return tuple(a for a in range(x.ndim) if a != 1)

    @staticmethod
    def _channels(v, x):
        shape = [1] * x.ndim
        shape[1] = x.shape[1]
        return v.reshape(shape)

    def _gamma(self, in_data, c):
        return np.ones(c) if self._fix_gamma else in_data[1].asnumpy().astype(np.float64)

    def forward(self, is_train, req, in_data, out_data, aux):
        x = in_data[0].asnumpy().astype(np.float64)
        c = x.shape[1]
        axes = self._axes(x)
        if is_train and not self._global:
            local = np.concatenate([[float(x.size // c)], x.sum(axis=axes),
                                    (x * x).sum(axis=axes)])
            total = _group_sum(local, self._scope, _next_name(self._key, "fwd"))
            mean = total[1:1 + c] / total[0]
            var = np.maximum(total[1 + c:] / total[0] - mean * mean, 0.0)
            for state, batch in ((aux[0], mean), (aux[1], var)):
                moved = state.asnumpy() * self._momentum + batch * (1 - self._momentum)
                self.assign(state, "write", mx.nd.array(moved, ctx=state.context,
                                                         dtype=state.dtype))
        else:
            mean = aux[0].asnumpy().astype(np.float64)
            var = aux[1].asnumpy().astype(np.float64)
        inv = 1.0 / np.sqrt(var + self._eps)
        beta = in_data[2].asnumpy().astype(np.float64)
        y = (x - self._channels(mean, x)) * self._channels(inv * self._gamma(in_data, c), x) + \
            self._channels(beta, x)
        for i, value in enumerate((y, mean, inv)):
            out = out_data[i]
            self.assign(out, req[i], mx.nd.array(value, ctx=out.context, dtype=out.dtype))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        x = in_data[0].asnumpy().astype(np.float64)
        dy = out_grad[0].asnumpy().astype(np.float64)
        c = x.shape[1]
        axes = self._axes(x)
        mean = out_data[1].asnumpy().astype(np.float64)
        inv = out_data[2].asnumpy().astype(np.float64)
        xhat = (x - self._channels(mean, x)) * self._channels(inv, x)
        sum_dy, sum_dy_xhat = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
        gamma = self._gamma(in_data, c)
        if self._global:
            dx = dy * self._channels(gamma * inv, x)
        else:
            local = np.concatenate([[float(x.size // c)], sum_dy, sum_dy_xhat])
            total = _group_sum(local, self._scope, _next_name(self._key, "bwd"))
            m, group_dy, group_dy_xhat = total[0], total[1:1 + c], total[1 + c:]
            dx = self._channels(gamma * inv, x) * (
                dy - self._channels(group_dy / m, x) - xhat * self._channels(group_dy_xhat / m, x))
        grads = (dx, np.zeros(c) if self._fix_gamma else sum_dy_xhat, sum_dy)
        for i, value in enumerate(grads):
            g = in_grad[i]
            self.assign(g, req[i], mx.nd.array(value, ctx=g.context, dtype=g.dtype))


@mx.operator.register(OP_TYPE)
class _SyncBatchNormProp(mx.operator.CustomOpProp):
    # MXNet hands a custom operator's arguments over as strings.
    def __init__(self, eps="0.001", momentum="0.9", fix_gamma="True", use_global_stats="False",
                 comm_scope="0", key=""):
        super().__init__(need_top_grad=True)
        self._args = (float(eps), float(momentum), _flag(fix_gamma), _flag(use_global_stats),
                      int(comm_scope), str(key))
        if self._args[4] not in (0, 1):
            raise ValueError("PerseusSyncBatchNorm: comm_scope must be 0 (the ranks of one "
                             "host) or 1 (every rank), not %r" % (comm_scope,))
        if not self._args[5]:
            raise ValueError("PerseusSyncBatchNorm: key is empty; give every layer its own "
                             "key (or name), the same on every rank")

    def list_arguments(self):
        return ["data", "gamma", "beta"]

    def list_outputs(self):
        return ["output", "mean", "inv_std"]

    def list_auxiliary_states(self):
        return ["moving_mean", "moving_var"]

    def infer_shape(self, in_shape):
        data = in_shape[0]
        if len(data) < 2:
            raise ValueError("PerseusSyncBatchNorm normalises axis 1 (channels): the input "
                             "needs at least 2 dimensions, not shape %s" % (tuple(data),))
        channel = (data[1],)
        return [data, channel, channel], [data, channel, channel], [channel, channel]

    def infer_type(self, in_type):
        t = in_type[0]
        return [t, t, t], [t, t, t], [t, t]

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return [out_grad[0], in_data[0], in_data[1], out_data[1], out_data[2]]

    def create_operator(self, ctx, shapes, dtypes):
        return _SyncBatchNorm(*self._args)


class PerseusSyncBatchNorm(nn.BatchNorm):
    """gluon.contrib.nn.SyncBatchNorm's arguments (num_devices is accepted and ignored: the
    group is given by comm_scope) plus comm_scope: 0 (the default, as in the seed) averages the
    statistics over the ranks of this rank's host, 1 over every rank. Also reachable as
    mx.gluon.contrib.nn.PerseusSyncBatchNorm once perseus.mxnet is imported. Normalises over
    axis 1 (channels), like SyncBatchNorm. Hybridizable."""

    def __init__(self, in_channels=0, num_devices=None, momentum=0.9, epsilon=1e-5,
                 center=True, scale=True, use_global_stats=False, beta_initializer="zeros",
                 gamma_initializer="ones", running_mean_initializer="zeros",
                 running_variance_initializer="ones", comm_scope=0, **kwargs):
        if comm_scope not in (0, 1):
            raise ValueError("comm_scope must be 0 (the ranks of one host) or 1 (every rank), "
                             "not %r" % (comm_scope,))
        super().__init__(axis=1, momentum=momentum, epsilon=epsilon, center=center,
                         scale=scale, use_global_stats=use_global_stats,
                         beta_initializer=beta_initializer, gamma_initializer=gamma_initializer,
                         running_mean_initializer=running_mean_initializer,
                         running_variance_initializer=running_variance_initializer,
                         in_channels=in_channels, **kwargs)
        self._comm_scope = comm_scope

    @property
    def comm_scope(self):
        return self._comm_scope

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        k = self._kwargs
        out = F.Custom(x, gamma, beta, running_mean, running_var, op_type=OP_TYPE,
                       eps=k["eps"], momentum=k["momentum"], fix_gamma=k["fix_gamma"],
                       use_global_stats=k["use_global_stats"], comm_scope=self._comm_scope,
                       key=self.name, name="fwd")
        return out[0]


_symbols = [0]


def symbol(data=None, gamma=None, beta=None, moving_mean=None, moving_var=None, eps=1e-3,
           momentum=0.9, fix_gamma=True, use_global_stats=False, output_mean_var=False, ndev=1,
           key=None, comm_scope=0, name=None, **kwargs):
    """mx.sym.contrib.PerseusSyncBatchNorm: mx.sym.contrib.SyncBatchNorm's arguments (ndev is
    accepted and ignored: the group is given by comm_scope) plus comm_scope (0, the default:
    the ranks of this rank's host; 1: every rank). Inputs left out become variables named
    NAME_gamma, NAME_beta, NAME_moving_mean, NAME_moving_var (auxiliary), which MXNet's
    initializers know. key names the layer's collectives (default: its name, else a count of
    the layers made in this process, the same on every rank that builds the same network).
    Returns the output, or with output_mean_var the output, the batch mean and 1/sqrt(var +
    eps) as a group."""
    if name is None:
        name = "perseussyncbatchnorm%d" % _symbols[0]
        _symbols[0] += 1
    # What MXNet's BatchNorm declares for its auxiliary states (initializers know gamma and
    # beta by their names' ends, but not the moving statistics).
    if moving_mean is None:
        moving_mean = mx.sym.Variable(name + "_moving_mean", init=mx.init.Zero())
    if moving_var is None:
        moving_var = mx.sym.Variable(name + "_moving_var", init=mx.init.One())
    given = {n: v for n, v in zip(("data", "gamma", "beta", "moving_mean", "moving_var"),
                                  (data, gamma, beta, moving_mean, moving_var)) if v is not None}
    out = mx.sym.Custom(op_type=OP_TYPE, eps=eps, momentum=momentum, fix_gamma=fix_gamma,
                        use_global_stats=use_global_stats, comm_scope=comm_scope,
                        key=key or name, name=name, **given, **kwargs)
    return out if output_mean_var else out[0]


# Where the seed's scripts look for them.
mx.gluon.contrib.nn.PerseusSyncBatchNorm = PerseusSyncBatchNorm
mx.sym.contrib.PerseusSyncBatchNorm = symbol
mx.symbol.contrib.PerseusSyncBatchNorm = symbol
