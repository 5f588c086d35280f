"""PerseusSyncBatchNorm: batch normalisation whose batch statistics are those of several ranks'
batches together, without patching or recompiling MXNet.

In training each rank computes per channel (count, sum, sum of squares) of its batch and these
are added up over its group: every rank (comm_scope=1: one all-gather over the job, each rank
adding up every row) or the ranks of its host (comm_scope=0: one all-reduce, a sum, within a
libperseus process set of that host's ranks; the other ranks take no part). Mean and (biased)
variance follow, and the normalisation is made of ordinary NDArray operations recorded by
autograd. The collective is an autograd.Function whose backward all-reduces (sums) the gradient
of the statistics over the same group, so the gradients are those of the loss summed over the
group's ranks (what one process computes on their combined batch). Outside training, or with
use_global_stats, it is gluon.nn.BatchNorm.

Hosts are told apart by the places libperseus gave the ranks (local rank, local size and cross
rank, all-gathered once; perseus._native.hosts_of_ranks), so the grouping is the launcher's:
perseusrun's node numbers, or under mpirun/srun the host names libperseus compared. The
environment is not read: under Open MPI, OMPI_COMM_WORLD_NODE_RANK is the rank within the node. The hosts' process sets are made once per process, at the first training forward of
a comm_scope=0 layer: that is collective over every rank (every rank makes every host's set, in
increasing host order), so every rank must run its first comm_scope=0 training step (all ranks
use the same model, as in data-parallel training). Not hybridizable: call it imperatively (a
parent that is hybridized would hand it Symbols; it raises then).
"""
import numpy as np

import mxnet as mx
from mxnet import autograd
from mxnet.gluon import nn

from perseus import _native
from perseus.mxnet import ops

_node_ranks = None
_host_set = None


def node_ranks():
    """Every rank's host number, from every rank's (local_rank, local_size, cross_rank) as
    libperseus computed them; all-gathered once per process (collective over every rank)."""
    global _node_ranks
    if _node_ranks is None:
        mine = np.array([[ops.local_rank(), ops.local_size(), ops.cross_rank()]], dtype=np.int64)
        out, _ = ops.allgather_host(mine, "PerseusSyncBatchNorm.places")
        _node_ranks = _native.hosts_of_ranks([tuple(int(v) for v in row) for row in out])
    return _node_ranks


def host_process_set():
    """(process set number, ranks) of this rank's host. The first call makes every host's set:
    collective over every rank (see the module's docstring)."""
    global _host_set
    if _host_set is None:
        nodes = node_ranks()
        sets = _native.host_process_sets(nodes)
        _host_set = sets[nodes[ops.rank()]]
    return _host_set


def _sum_in_set(array, process_set, name):
    """The sum over process_set's members of a float NDArray, through host memory."""
    host = np.ascontiguousarray(array.asnumpy())
    what = "allreduce of '%s' in process set %d" % (name, process_set)
    request = _native.allreduce_async(host.ctypes.data, host.ctypes.data, host.size,
                                      _native.dtype_code(host.dtype.name), _native.SUM,
                                      name=name, what=what, keep=(host,),
                                      process_set=process_set)
    try:
        request.wait()
    finally:
        request.release()
    return mx.nd.array(host, ctx=array.context, dtype=array.dtype)


class _SumStatsInSet(autograd.Function):
    """(k,) -> (k,): the sum over the process set's members. Backward: the same sum of the
    gradients (each member's statistics feed every member's total)."""

    def __init__(self, process_set, name):
        super().__init__()
        self._set = process_set
        self._name = name

    def forward(self, stats):
        return _sum_in_set(stats, self._set, self._name + ".fwd")

    def backward(self, dy):
        return _sum_in_set(dy, self._set, self._name + ".bwd")


class _AllgatherStats(autograd.Function):
    """(k,) -> (size, k): every rank's row. Backward: the gradient of this rank's row is the sum
    over ranks of their gradients with respect to it."""

    def __init__(self, name):
        super().__init__()
        self._name = name

    def forward(self, stats):
        host = stats.asnumpy().reshape(1, -1)
        out, _ = ops.allgather_host(np.ascontiguousarray(host), self._name + ".fwd")
        return mx.nd.array(out, ctx=stats.context, dtype=stats.dtype)

    def backward(self, dy):
        summed = ops.allreduce(dy, op=ops.Sum, name=self._name + ".bwd")
        return summed[ops.rank()]


class PerseusSyncBatchNorm(nn.BatchNorm):
    """gluon.contrib.nn.SyncBatchNorm's arguments (num_devices is accepted and ignored: the
    group is given by comm_scope) plus comm_scope: 0 (the default, as in the seed) averages the
    statistics over the ranks of this rank's host, 1 over every rank. Also reachable as
    mx.gluon.contrib.nn.PerseusSyncBatchNorm once perseus.mxnet is imported. Normalises over axis 1 (channels), like SyncBatchNorm.
    """

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
        self._eps = epsilon
        self._mom = momentum
        self._use_global = use_global_stats
        self._calls = 0

    @property
    def comm_scope(self):
        return self._comm_scope

    def _finish_shapes(self, channels):
        for p in (self.gamma, self.beta, self.running_mean, self.running_var):
            if p._deferred_init:
                p.shape = (channels,)
                p._finish_deferred_init()

    def forward(self, x, *args):
        if not isinstance(x, mx.nd.NDArray):
            raise TypeError("PerseusSyncBatchNorm is not hybridizable: call it with NDArrays "
                            "(do not hybridize the block that holds it)")
        if self._use_global or not autograd.is_training():
            return super().forward(x, *args)
        channels = x.shape[1]
        self._finish_shapes(channels)
        ctx = x.context
        gamma = self.gamma.data(ctx)
        beta = self.beta.data(ctx)
        axes = tuple(a for a in range(x.ndim) if a != 1)
        count = float(np.prod([x.shape[a] for a in axes]))
        local = mx.nd.concat(mx.nd.full((1,), count, ctx=ctx, dtype=x.dtype),
                             x.sum(axis=axes), (x * x).sum(axis=axes), dim=0)
        self._calls += 1
        name = "PerseusSyncBatchNorm.%s.%d" % (self.name, self._calls)
        if self._comm_scope == 1:
            total = _AllgatherStats(name)(local).sum(axis=0)
        else:
            total = _SumStatsInSet(host_process_set()[0], name)(local)
        n = total[0:1]
        mean = total[1:1 + channels] / n
        var = total[1 + channels:1 + 2 * channels] / n - mean * mean
        shape = [1] * x.ndim
        shape[1] = channels
        inv = 1.0 / mx.nd.sqrt(var + self._eps)
        if not self._kwargs.get("fix_gamma", False):
            y = (x - mean.reshape(shape)) * (inv * gamma).reshape(shape) + beta.reshape(shape)
        else:
            y = (x - mean.reshape(shape)) * inv.reshape(shape) + beta.reshape(shape)
        with autograd.pause():
            rm = self.running_mean.data(ctx)
            rv = self.running_var.data(ctx)
            rm[:] = rm * self._mom + mean.detach() * (1 - self._mom)
            rv[:] = rv * self._mom + var.detach() * (1 - self._mom)
        return y


# Where the seed's scripts look for it: mx.gluon.contrib.nn.PerseusSyncBatchNorm(comm_scope=0).
mx.gluon.contrib.nn.PerseusSyncBatchNorm = PerseusSyncBatchNorm
