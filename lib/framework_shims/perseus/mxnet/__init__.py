"""Horovod's MXNet API and the Perseus KVStore over libperseus.

    import perseus.mxnet as hvd
    hvd.init()
    trainer = hvd.DistributedTrainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)

    kv = perseus.mxnet.create('dist_sync_perseus')     # MXNet's KVStore interface
    module.fit(train, kvstore=kv, ...)

CPU NDArrays (MXNet from PyPI is a CPU build); see ops.py for how NDArrays reach libperseus and
lib/framework_shims/README.md for the whole surface.
"""
from perseus._native import HorovodInternalError, PerseusError  # noqa: F401
from perseus.mxnet.ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, allgather,
    allgather_object, allreduce, allreduce_, alltoall, barrier, broadcast, broadcast_,
    broadcast_object, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
    global_process_set, gloo_built, gloo_enabled, grouped_allgather, grouped_allreduce,
    grouped_allreduce_, grouped_reducescatter, init, is_homogeneous, is_initialized, local_rank,
    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, reducescatter,
    remove_process_set, rocm_built, shutdown, size,
)
from perseus.mxnet.functions import broadcast_parameters  # noqa: F401
from perseus.mxnet.optimizer import DistributedOptimizer, DistributedTrainer  # noqa: F401
from perseus.mxnet.compression import Compression  # noqa: F401
from perseus.mxnet.kvstore import PerseusKVStore, PerseusOp, create  # noqa: F401
from perseus.mxnet.sync_batch_norm import PerseusSyncBatchNorm  # noqa: F401
from perseus.mxnet import elastic  # noqa: F401,I001 - last: it uses the modules above

__all__ = [
    "PerseusError", "HorovodInternalError", "elastic", "Average", "Sum", "Adasum", "Min", "Max",
    "Product",
    "init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
    "cross_rank", "cross_size", "barrier", "gloo_built", "gloo_enabled", "nccl_built",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "ccl_built", "cuda_built",
    "ddl_built", "rocm_built", "is_homogeneous",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
    "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter",
    "grouped_reducescatter", "broadcast_object", "allgather_object",
    "broadcast_parameters", "DistributedOptimizer", "DistributedTrainer",
    "Compression", "create", "PerseusKVStore", "PerseusOp", "PerseusSyncBatchNorm",
]
