"""PerseusSyncBatchNorm: batch normalisation whose batch statistics are those of several ranks'
batches together, without patching or recompiling MXNet.

In training each rank computes per channel (count, sum, sum of squares) of its batch; one
all-gather gives every rank everyone's, and each rank adds up those of its group: the ranks of
its host (comm_scope=0) or every rank (comm_scope=1). Mean and (biased) variance follow, and the
normalisation is made of ordinary NDArray operations recorded by autograd. The all-gather is an
autograd.Function whose backward all-reduces (sums) the gradient of the gathered statistics, so
the gradients are those of the loss summed over every rank (what one process computes on the
combined batch). Outside training, or with use_global_stats, it is gluon.nn.BatchNorm.

Hosts are told apart by perseusrun's PERSEUS_NODE_RANK (each rank's is all-gathered once), not by
host names. Not hybridizable: call it imperatively (a parent that is hybridized would hand it
Symbols; it raises then).
"""
import os

import numpy as np

import mxnet as mx
from mxnet import autograd
from mxnet.gluon import nn

from perseus.mxnet import ops

_node_ranks = None


def _node_rank_env():
    for var in ("PERSEUS_NODE_RANK", "GROUP_RANK", "OMPI_COMM_WORLD_NODE_RANK"):
        value = os.environ.get(var)
        if value not in (None, ""):
            return int(value)
    # Without the launcher's node index: ranks of one host are numbered consecutively.
    return ops.rank() - ops.local_rank()


def node_ranks():
    """Every rank's node (host) index, all-gathered once per process."""
    global _node_ranks
    if _node_ranks is None:
        mine = np.array([_node_rank_env()], dtype=np.int64)
        out, _ = ops.allgather_host(mine, "PerseusSyncBatchNorm.node_ranks")
        _node_ranks = [int(v) for v in out]
    return _node_ranks


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
    group is given by comm_scope) plus comm_scope: 0 averages the statistics over the ranks of
    this rank's host, 1 over every rank. Normalises over axis 1 (channels), like SyncBatchNorm.
    """

    def __init__(self, in_channels=0, num_devices=None, momentum=0.9, epsilon=1e-5,
                 center=True, scale=True, use_global_stats=False, beta_initializer="zeros",
                 gamma_initializer="ones", running_mean_initializer="zeros",
                 running_variance_initializer="ones", comm_scope=1, **kwargs):
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
        self._mask = None

    @property
    def comm_scope(self):
        return self._comm_scope

    def _group_mask(self):
        if self._mask is None:
            if self._comm_scope == 1:
                mask = [1.0] * ops.size()
            else:
                nodes = node_ranks()
                mine = nodes[ops.rank()]
                mask = [1.0 if n == mine else 0.0 for n in nodes]
            self._mask = mask
        return self._mask

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
        gathered = _AllgatherStats(name)(local)
        mask = mx.nd.array(self._group_mask(), ctx=ctx, dtype=x.dtype).reshape((-1, 1))
        total = (gathered * mask).sum(axis=0)
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
